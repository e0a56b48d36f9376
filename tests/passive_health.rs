//! Passive health end to end, with the demo's configuration as it is (no
//! check configured): while a client opens new connections to the VIP at
//! 20 per second, the listener of one backend stops (its process ends: the
//! port is closed, its kernel answers SYNs with RSTs). The appliance sees
//! those RSTs on the return path and takes the backend out of new flows
//! within 15 s; after that, 30 new connections in a row all succeed, and
//! connections held to the other backends all the while are unaffected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::topology::{held_outcome, held_why, root, stop_cleanly, tempdir, Topology};
use sluice_tests::{privileged, sluice_bin, wait_until};

/// Passive health's record of endpoint `id` of service `service`.
fn endpoint_health(status: &Value, service: &str, id: u64) -> Option<Value> {
    status["health"]["endpoints"].as_array()?.iter().find(|e| e["service"] == service && e["id"] == id).cloned()
}

/// Connections the `stream` client recorded: (start time, backend or
/// "failed").
fn streamed(out: &std::path::Path) -> Vec<(f64, String)> {
    std::fs::read_to_string(out)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.to_owned()))
        })
        .collect()
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_backend_whose_listener_stops_is_drained_by_passive_health() {
    privileged();
    let prefix = format!("ph{}", std::process::id());
    let topo = Topology::up(&prefix);
    let mut backends = topo.backends(&["20.0.0.1"]);
    let dir = tempdir(&prefix);
    let cfg = dir.join("appliance.yaml");
    let demo = std::fs::read_to_string(root().join("configs/demo.yaml")).unwrap().replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"));
    std::fs::write(&cfg, demo).unwrap();
    let bin = sluice_bin();
    let mut lb = topo.spawn("lb", &[bin.to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    let ready = wait_until(Duration::from_secs(30), || {
        topo.status()["endpoints"].as_array().is_some_and(|e| e.len() == 6 && e.iter().all(|e| e["state"] == "ready"))
    });
    if !ready {
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("the appliance did not become ready (exit {code:?}):\n{out}\n{err}");
    }

    // Connections held to every backend, and new ones at 20 per second.
    let held = dir.join("held.json");
    let _held = topo.hold_for("20.0.0.1", 30, 40, &held);
    assert!(wait_until(Duration::from_secs(20), || dir.join("held.json.ready").exists()), "held connections open");
    let stream = dir.join("stream.txt");
    let script = root().join("scripts/client.py");
    let _stream = topo.spawn("client", &["python3", script.to_str().unwrap(), "stream", "20.0.0.1", "20", "60", stream.to_str().unwrap()]);
    assert!(
        wait_until(Duration::from_secs(20), || streamed(&stream).iter().filter(|(_, b)| b == "be2").count() >= 5),
        "new connections reach be2: {:?}",
        streamed(&stream)
    );
    let before = endpoint_health(&topo.status(), "web", 1).expect("be2's handshakes are seen");
    assert_eq!(before["state"], "healthy", "{before}");
    assert!(before["succeeded"].as_u64().unwrap() >= 5, "{before}");
    assert!(before["handshake_median_us"].as_u64().is_some(), "{before}");

    // be2's listener stops.
    let stopped_at = Instant::now();
    let stopped_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    backends[1].stop("KILL", Duration::from_secs(5));
    let ejected = wait_until(Duration::from_secs(20), || endpoint_health(&topo.status(), "web", 1).is_some_and(|e| e["state"] == "ejected"));
    let took = stopped_at.elapsed();
    let st = topo.status();
    assert!(ejected, "be2 was not taken out: {}", st["health"]);
    println!("be2 out of new flows {:.1} s after its listener stopped: {}", took.as_secs_f64(), endpoint_health(&st, "web", 1).unwrap());
    assert!(took <= Duration::from_secs(15), "be2 out after {took:?}, more than 15 s");
    // It drains: the reconciler published it so, the others stay.
    let eps = st["endpoints"].as_array().unwrap();
    let state = |svc: &str, id: u64| eps.iter().find(|e| e["service"] == svc && e["id"] == id).map(|e| e["state"].clone()).unwrap();
    assert_eq!(state("web", 1), "draining");
    assert_eq!((state("web", 0), state("web", 2)), (Value::from("ready"), Value::from("ready")));
    assert!(eps.iter().filter(|e| e["service"] == "dns").all(|e| e["state"] == "ready"), "dns saw no TCP handshake: untouched");

    // 30 new connections in a row, all served.
    let c = topo.client(&["short", "20.0.0.1", "30", "1"]);
    assert_eq!(c.get("failed"), None, "30 connections in a row after the drain: {c:?}");
    assert_eq!(c.values().sum::<u64>(), 30, "{c:?}");
    assert!(!c.contains_key("be2"), "{c:?}");

    let _ = std::fs::write(dir.join("stream.txt.stop"), "");
    let _ = std::fs::write(dir.join("held.json.stop"), "");
    assert!(wait_until(Duration::from_secs(30), || held.exists()), "held connections' outcome");
    let out = held_outcome(&held);
    println!("held connections by backend [ok, broken]: {out:?}");
    for (b, [ok, broken]) in &out {
        if b != "be2" {
            assert_eq!(*broken, 0, "{b}: held connections broken: {out:?}; {}", held_why(&held));
            assert!(*ok > 0);
        }
    }
    let s = streamed(&stream);
    let failed_after = s.iter().filter(|(t, b)| *t > stopped_epoch && b == "failed").count();
    println!("stream: {} connections, {failed_after} failed after be2 stopped", s.len());
    stop_cleanly(&mut lb);
}

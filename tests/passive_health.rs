//! Passive health end to end, with the demo's configuration as it is (no
//! check configured): while a client opens new connections to the VIP at
//! 20 per second, the listener of one backend stops (its process ends: the
//! port is closed, its kernel answers SYNs with RSTs). The appliance sees
//! those RSTs on the return path and takes the backend out of new flows
//! within 15 s; after that, 30 new connections in a row all succeed, and
//! connections held to the other backends all the while are unaffected.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::topology::{held_outcome, held_why, root, stop_cleanly, tempdir, Topology};
use sluice_tests::{privileged, sluice_bin, wait_until, Proc};

/// The demo topology (`prefix` and the process id) with its backends, the
/// appliance on the demo's configuration (its `health:` section replaced
/// by `health`, when given), ready; `before` runs on the topology before
/// the appliance starts.
fn start(prefix: &str, health: Option<&str>, before: impl FnOnce(&Topology)) -> (Topology, Vec<Proc>, Proc, PathBuf) {
    privileged();
    let prefix = format!("{prefix}{}", std::process::id());
    let topo = Topology::up(&prefix);
    let backends = topo.backends(&["20.0.0.1"]);
    before(&topo);
    let dir = tempdir(&prefix);
    let cfg = dir.join("appliance.yaml");
    let mut demo = std::fs::read_to_string(root().join("configs/demo.yaml")).unwrap().replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"));
    if let Some(h) = health {
        let at = demo.find("\nhealth:").expect("the demo has a health section") + 1;
        let end = at + demo[at..].find("\n\n").unwrap();
        demo.replace_range(at..end, h);
    }
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
    (topo, backends, lb, dir)
}

/// Starts `client.py stream` at `rate` connections per second into `out`.
fn stream(topo: &Topology, rate: u32, out: &Path) -> Proc {
    let script = root().join("scripts/client.py");
    topo.spawn("client", &["python3", script.to_str().unwrap(), "stream", "20.0.0.1", &rate.to_string(), "120", out.to_str().unwrap()])
}

/// Runs `cmd` in namespace `n`, which must succeed.
fn must(topo: &Topology, n: &str, cmd: &[&str]) {
    let o = topo.output(n, cmd);
    assert!(o.status.success(), "{cmd:?} in {n}: {}", String::from_utf8_lossy(&o.stderr));
}

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
    let (topo, mut backends, mut lb, dir) = start("ph", None, |_| {});
    // Connections held to every backend, and new ones at 20 per second.
    let held = dir.join("held.json");
    let _held = topo.hold_for("20.0.0.1", 30, 40, &held);
    assert!(wait_until(Duration::from_secs(20), || dir.join("held.json.ready").exists()), "held connections open");
    let stream_out = dir.join("stream.txt");
    let _stream = stream(&topo, 20, &stream_out);
    assert!(
        wait_until(Duration::from_secs(20), || streamed(&stream_out).iter().filter(|(_, b)| b == "be2").count() >= 5),
        "new connections reach be2: {:?}",
        streamed(&stream_out)
    );
    let before = endpoint_health(&topo.status(), "web", 1).expect("be2's handshakes are seen");
    assert_eq!(before["state"], "healthy", "{before}");
    assert!(before["succeeded"].as_u64().unwrap() >= 5, "{before}");
    assert!(before["handshake_median_us"].as_u64().is_some(), "{before}");

    // be2's listener stops.
    let stopped_at = Instant::now();
    let stopped_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    backends[1].stop("KILL", Duration::from_secs(5));
    // Ejected by passive health, and published so by the reconciler.
    let ejected = wait_until(Duration::from_secs(20), || {
        let st = topo.status();
        let published = st["endpoints"].as_array().is_some_and(|e| e.iter().any(|e| e["service"] == "web" && e["id"] == 1 && e["state"] == "draining"));
        published && endpoint_health(&st, "web", 1).is_some_and(|e| e["state"] == "ejected")
    });
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
    let s = streamed(&stream_out);
    let failed_after = s.iter().filter(|(t, b)| *t > stopped_epoch && b == "failed").count();
    println!("stream: {} connections, {failed_after} failed after be2 stopped", s.len());
    stop_cleanly(&mut lb);
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_backend_whose_syns_are_dropped_is_drained_and_a_slow_one_shows_in_its_handshake_time() {
    let relay = root().join("scripts/delay_relay.py");
    let mut relay_proc = None;
    // Out for 5 s (not the default 30), to see be3 come back.
    let (topo, _backends, mut lb, dir) = start("pd", Some("health: {passive: true, ejectionSeconds: 5}"), |topo| {
        // be2's link goes through a relay that holds its SYN-ACKs 20 ms.
        must(topo, "net", &["ip", "link", "set", "nb2", "nomaster"]);
        must(topo, "net", &["ip", "link", "add", "nb2r", "type", "veth", "peer", "name", "nb2y"]);
        for l in ["nb2r", "nb2y", "nb2"] {
            must(topo, "net", &["ip", "link", "set", l, "up", "promisc", "on"]);
            let _ = topo.output("net", &["ethtool", "-K", l, "tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off"]);
        }
        must(topo, "net", &["ip", "link", "set", "nb2r", "master", "br0"]);
        let mut p = topo.spawn("net", &["python3", relay.to_str().unwrap(), "nb2", "nb2y", "20", "120"]);
        assert!(p.running());
        relay_proc = Some(p);
        // be3 drops every SYN to port 80.
        must(topo, "be3", &["nft", "add", "table", "inet", "ph"]);
        must(topo, "be3", &["nft", "add chain inet ph in { type filter hook input priority 0 ; }"]);
        must(topo, "be3", &["nft", "add rule inet ph in tcp dport 80 tcp flags & (syn | ack) == syn drop"]);
    });
    let out = dir.join("stream.txt");
    let _stream = stream(&topo, 20, &out);
    let t0 = Instant::now();
    let ejected = wait_until(Duration::from_secs(40), || endpoint_health(&topo.status(), "web", 2).is_some_and(|e| e["state"] == "ejected"));
    let st = topo.status();
    assert!(ejected, "be3 (SYNs dropped) was not taken out: {}", st["health"]);
    println!("be3 out {:.1} s after the first connections: {}", t0.elapsed().as_secs_f64(), endpoint_health(&st, "web", 2).unwrap());
    let be3 = endpoint_health(&st, "web", 2).unwrap();
    assert_eq!(be3["succeeded"], 0, "{be3}");
    assert_eq!(be3["reset"], 0, "{be3}");
    assert!(be3["retransmitted"].as_u64().unwrap() + be3["unanswered"].as_u64().unwrap() >= 5, "{be3}");
    // be1 and be2 answer, be2 20 ms later.
    let enough = wait_until(Duration::from_secs(30), || {
        let st = topo.status();
        [0, 1].iter().all(|&id| endpoint_health(&st, "web", id).is_some_and(|e| e["succeeded"].as_u64().unwrap_or(0) >= 30))
    });
    let st = topo.status();
    assert!(enough, "be1 and be2 answered 30 handshakes each: {}", st["health"]);
    let median = |id: u64| endpoint_health(&st, "web", id).unwrap()["handshake_median_us"].as_i64().unwrap();
    let (m1, m2) = (median(0), median(1));
    println!("handshake medians: be1 {m1} us, be2 (SYN-ACKs held 20 ms) {m2} us: moved by {} us", m2 - m1);
    assert!((15_000..=25_000).contains(&(m2 - m1)), "be2's median moved by {} us, not 20 ± 5 ms: {}", m2 - m1, st["health"]);
    for id in [0, 1] {
        assert_eq!(endpoint_health(&st, "web", id).unwrap()["state"], "healthy");
    }
    // be3 takes SYNs again: once its time out is over it is back in new
    // flows, and answers.
    must(&topo, "be3", &["nft", "delete", "table", "inet", "ph"]);
    let t1 = Instant::now();
    let back = wait_until(Duration::from_secs(30), || {
        endpoint_health(&topo.status(), "web", 2).is_some_and(|e| e["state"] == "healthy" && e["succeeded"].as_u64().unwrap_or(0) >= 3)
    });
    let st = topo.status();
    assert!(back, "be3 did not come back: {}", st["health"]);
    println!("be3 back in new flows and answering {:.1} s after its SYNs were let through: {}", t1.elapsed().as_secs_f64(), endpoint_health(&st, "web", 2).unwrap());
    let eps = st["endpoints"].as_array().unwrap();
    assert!(eps.iter().filter(|e| e["service"] == "web").all(|e| e["state"] == "ready"), "{eps:?}");
    let _ = std::fs::write(dir.join("stream.txt.stop"), "");
    if let Some(mut p) = relay_proc {
        let _ = p.stop("INT", Duration::from_secs(2));
    }
    stop_cleanly(&mut lb);
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_flood_that_overruns_the_appliance_drains_no_endpoint_whose_listener_is_up() {
    let (topo, _backends, mut lb, dir) = start("pf", None, |_| {});
    let out = dir.join("stream.txt");
    let _stream = stream(&topo, 20, &out);
    assert!(
        wait_until(Duration::from_secs(20), || {
            let st = topo.status();
            (0..3).all(|id| endpoint_health(&st, "web", id).is_some_and(|e| e["succeeded"].as_u64().unwrap_or(0) >= 3))
        }),
        "every backend answers: {}",
        topo.status()["health"]
    );
    let lost = |st: &Value| st["ports"].as_array().unwrap().iter().map(|p| p["lost_below_dpdk"]["below_dpdk"].as_u64().unwrap_or(0) + p["rx_missed"].as_u64().unwrap_or(0)).sum::<u64>();
    let lost0 = lost(&topo.status());
    // Two senders of UDP frames to the VIP, as fast as they go, while
    // connections go on opening.
    let mac = topo.status()["ports"][0]["mac"].as_str().unwrap().to_owned();
    let blast = root().join("scripts/udp_blast.py");
    let mut senders: Vec<Proc> = (0..2)
        .map(|_| topo.spawn("client", &["python3", blast.to_str().unwrap(), "c0", &mac, "10.100.0.2", "20.0.0.1", "53", "300000"]))
        .collect();
    let mut worst = Value::Null;
    let mut ejected = Vec::new();
    while senders.iter_mut().any(Proc::running) {
        let st = topo.status();
        for e in st["health"]["endpoints"].as_array().into_iter().flatten() {
            if e["state"] != "healthy" {
                ejected.push(e.clone());
            }
        }
        worst = st["health"].clone();
        std::thread::sleep(Duration::from_millis(200));
    }
    for s in &mut senders {
        let (_, o, _) = s.stop("0", Duration::from_secs(60));
        println!("sender: {}", o.trim());
    }
    std::thread::sleep(Duration::from_secs(3));
    let st = topo.status();
    let lost = lost(&st) - lost0;
    println!("frames lost on the way in during the flood: {lost}; passive health discounted {} handshakes", st["health"]["discounted"]);
    assert!(lost > 0, "the flood overran the appliance: frames counted lost (else this test shows nothing)");
    for e in st["health"]["endpoints"].as_array().into_iter().flatten() {
        if e["state"] != "healthy" {
            ejected.push(e.clone());
        }
    }
    assert!(ejected.is_empty(), "endpoints taken out by a flood: {ejected:?}\n{worst}");
    let _ = std::fs::write(dir.join("stream.txt.stop"), "");
    stop_cleanly(&mut lb);
}

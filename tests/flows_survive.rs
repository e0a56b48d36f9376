//! Established flows survive endpoint changes on one appliance, with the
//! default configuration (flow state on for every service): long-lived TCP
//! connections and UDP flows, each sending every 0.2 s, through an endpoint
//! added, weights changed, an endpoint set draining and another removed,
//! all through the configuration file. Every flow whose endpoint is still
//! in the service stays on it (the backends' answers carry their names);
//! the flows of the removed endpoint move.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use sluice_tests::topology::{held_outcome, held_why, root, stop_cleanly, tempdir, Topology};
use sluice_tests::{privileged, sluice_bin, wait_until, Proc};

/// Held TCP connections and UDP flows.
const TCP_FLOWS: u32 = 48;
const UDP_FLOWS: u32 = 24;

/// The demo configuration with one maglev service `web` for TCP port 80
/// and UDP port 53, of endpoints `eps` (YAML flow mappings). Whatever the
/// demo says of flow state (`defaults.flowTable`, the `flowTable` section)
/// is left out: the defaults apply.
fn config(base: &str, eps: &[&str]) -> String {
    let head = without_flow_settings(&base[..base.find("\nservices:\n").expect("demo.yaml has services") + 1]);
    assert!(!head.lines().any(|l| l.trim_start().starts_with("flowTable:")), "flow settings left in:\n{head}");
    let eps: String = eps.iter().map(|e| format!("      - {e}\n")).collect();
    format!(
        "{head}services:\n  - name: web\n    endpoints:\n{eps}routes:\n  - name: web-tcp\n    service: web\n    vips: [20.0.0.1]\n    protocols: [TCP]\n    destinationPorts: [\"80\"]\n  - name: web-udp\n    service: web\n    vips: [20.0.0.1]\n    protocols: [UDP]\n    destinationPorts: [\"53\"]\n"
    )
}

/// `text` without its `flowTable` lines: the key in `defaults` with the
/// comment lines that continue it, and the top-level section up to the
/// next blank line.
fn without_flow_settings(text: &str) -> String {
    let mut out = String::new();
    let mut skip = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        if let Some(at) = skip {
            let continues = if at == 0 { !line.trim().is_empty() } else { indent > at && line.trim_start().starts_with('#') };
            if continues {
                continue;
            }
            skip = None;
        }
        if line.trim_start().starts_with("flowTable:") {
            skip = Some(indent);
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// What a client wrote to `out`: `{backend: [survived, broken]}`.
/// Rounds of sends the client of `out` has done.
fn rounds(out: &Path) -> u64 {
    std::fs::read_to_string(out.with_extension("json.rounds")).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn established_flows_survive_endpoint_changes_by_default() {
    privileged();
    let prefix = format!("fs{}", std::process::id());
    let topo = Topology::up(&prefix);
    let _backends: Vec<Proc> = topo.backends(&["20.0.0.1"]);
    let dir = tempdir(&prefix);
    let cfg = dir.join("appliance.yaml");
    let base = std::fs::read_to_string(root().join("configs/demo.yaml"))
        .unwrap()
        .replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"));
    let be = |i: u32, extra: &str| format!("{{id: {}, address: 10.200.0.1{i}{extra}}}", i - 1);
    std::fs::write(&cfg, config(&base, &[&be(1, ""), &be(2, "")])).unwrap();
    let bin = sluice_bin();
    let mut lb = topo.spawn("lb", &[bin.to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    let ready = wait_until(Duration::from_secs(30), || {
        topo.output("lb", &[bin.to_str().unwrap(), "status", "--json"]).status.success()
            && topo.status()["endpoints"].as_array().is_some_and(|e| e.len() == 2 && e.iter().all(|e| e["state"] == "ready"))
    });
    if !ready {
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("the appliance did not become ready (exit {code:?}):\n{out}\n{err}");
    }

    let (tcp_out, udp_out) = (dir.join("tcp.json"), dir.join("udp.json"));
    let _ = std::fs::remove_file(dir.join("tcp.json.stop"));
    let _tcp = topo.hold_for("20.0.0.1", TCP_FLOWS, 300, &tcp_out);
    let script = root().join("scripts/client.py");
    let (n, path) = (UDP_FLOWS.to_string(), udp_out.to_str().unwrap().to_owned());
    let _udp = topo.spawn("client", &["python3", script.to_str().unwrap(), "udphold", "20.0.0.1", &n, "300", &path]);
    assert!(
        wait_until(Duration::from_secs(30), || rounds(&tcp_out) >= 2 && rounds(&udp_out) >= 2),
        "the flows are open and sending"
    );

    // Each change: written to the file, taken (a new generation), then
    // a few rounds of every flow sending through it.
    let changes: [(&str, Vec<String>); 4] = [
        ("add be3", vec![be(1, ""), be(2, ""), be(3, "")]),
        ("weights 3/1/2", vec![be(1, ", weight: 3"), be(2, ", weight: 1"), be(3, ", weight: 2")]),
        ("be1 draining", vec![be(1, ", weight: 3, draining: true"), be(2, ", weight: 1"), be(3, ", weight: 2")]),
        ("be2 removed", vec![be(1, ", weight: 3, draining: true"), be(3, ", weight: 2")]),
    ];
    for (what, eps) in &changes {
        let generation = topo.status()["generation"].as_u64().unwrap();
        let eps: Vec<&str> = eps.iter().map(String::as_str).collect();
        std::fs::write(&cfg, config(&base, &eps)).unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || topo.status()["generation"].as_u64().unwrap_or(0) > generation),
            "{what}: the file change was taken"
        );
        assert_eq!(topo.status()["sources"]["file"]["accepted"], true, "{what}");
        let (t, u) = (rounds(&tcp_out), rounds(&udp_out));
        assert!(
            wait_until(Duration::from_secs(30), || rounds(&tcp_out) >= t + 3 && rounds(&udp_out) >= u + 3),
            "{what}: the flows went on sending"
        );
    }
    std::fs::write(dir.join("tcp.json.stop"), "").unwrap();
    std::fs::write(dir.join("udp.json.stop"), "").unwrap();
    let done = wait_until(Duration::from_secs(30), || tcp_out.exists() && udp_out.exists());
    assert!(done, "the clients finished");
    let (tcp, udp) = (held_outcome(&tcp_out), held_outcome(&udp_out));
    println!("TCP connections by first backend [survived, broken]: {tcp:?}");
    println!("UDP flows by first backend [survived, broken]: {udp:?}");

    // be1 (draining) and be3 are still in the service: every flow to them
    // survived. be2 was removed: its flows moved (none can survive).
    let mut survived = 0;
    let mut broken = 0;
    for (kind, res, total) in [("TCP", &tcp, TCP_FLOWS), ("UDP", &udp, UDP_FLOWS)] {
        assert_eq!(res.values().map(|[o, b]| o + b).sum::<u64>(), u64::from(total), "{kind}: {res:?}");
        assert!(res.get("be1").is_some_and(|[o, b]| o + b > 0), "{kind}: flows landed on be1: {res:?}");
        assert!(res.get("be2").is_some_and(|[o, b]| o + b > 0), "{kind}: flows landed on be2: {res:?}");
        for (b, [o, x]) in res {
            if b != "be2" {
                survived += o;
                broken += x;
            }
        }
        assert_eq!(res.get("be2").map_or(0, |[o, _]| *o), 0, "{kind}: flows of the removed endpoint moved: {res:?}");
    }
    println!("flows whose endpoint is still in the service: {survived} survived, {broken} broken");
    assert_eq!(
        broken,
        0,
        "every flow whose endpoint is still in the service survives: TCP {tcp:?}, UDP {udp:?}; when and why: TCP {}, UDP {}",
        held_why(&tcp_out),
        held_why(&udp_out)
    );

    stop_cleanly(&mut lb);
    topo.remove();
    let _ = std::fs::remove_dir_all(&dir);
}

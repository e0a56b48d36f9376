//! The appliance end to end, in network namespaces (scripts/topology.sh):
//! a client, `sluice run` on af_packet ports, three NAT-less backends.
//!
//! - hundreds of real TCP connections to the VIP complete, each backend
//!   taking a share; UDP works;
//! - removing one endpoint from the configuration (file change) moves only
//!   its flows: long-lived connections to the others survive;
//! - a broken configuration is rejected and the last good one keeps
//!   serving;
//! - SIGINT stops it with exit status 0 and every mbuf back in the pool;
//! - no namespace is left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use sluice_tests::topology::{root, stop_cleanly, Topology};
use sluice_tests::{privileged, sluice_bin, wait_until, Proc};

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn load_balances_real_traffic_and_reloads_without_disturbing_other_flows() {
    privileged();
    let prefix = format!("sa{}", std::process::id());
    let topo = Topology::up(&prefix);
    let backend = root().join("scripts/backend.py");
    let _backends: Vec<Proc> = (1..=3)
        .map(|i| topo.spawn(&format!("be{i}"), &["python3", backend.to_str().unwrap(), &format!("be{i}"), "20.0.0.1", "20.0.0.2"]))
        .collect();

    let dir = tempdir(&prefix);
    let cfg = dir.join("appliance.yaml");
    let base = std::fs::read_to_string(root().join("configs/demo.yaml"))
        .unwrap()
        .replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"));
    std::fs::write(&cfg, &base).unwrap();
    let bin = sluice_bin();
    let mut lb = topo.spawn("lb", &[bin.to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);

    let ready = wait_until(Duration::from_secs(30), || {
        topo.output("lb", &[bin.to_str().unwrap(), "status", "--json"]).status.success()
            && topo.status()["endpoints"].as_array().is_some_and(|e| e.len() == 6 && e.iter().all(|e| e["state"] == "ready"))
    });
    if !ready {
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("the appliance did not become ready (exit {code:?}):\n{out}\n{err}");
    }

    // Hundreds of real TCP connections, all complete, spread over the backends.
    let counts = topo.client(&["short", "20.0.0.1", "450", "16"]);
    assert_eq!(counts.get("failed"), None, "{counts:?}");
    for b in ["be1", "be2", "be3"] {
        let n = counts.get(b).copied().unwrap_or(0);
        assert!(n >= 90, "{b} got {n} of 450 connections: {counts:?}");
    }
    // UDP too (each query from the same socket: one flow, one backend).
    let udp = topo.client(&["udp", "20.0.0.1", "100"]);
    assert_eq!(udp.values().sum::<u64>(), 100);
    assert_eq!(udp.get("failed"), None, "{udp:?}");

    // Long-lived connections; then endpoint 2 (be3) leaves the web service.
    let held = topo.hold("20.0.0.1", &dir.join("hold.json"));
    let generation = topo.status()["generation"].as_u64().unwrap();
    let without_be3 = base.replacen("      - {id: 2, address: 10.200.0.13}\n  - name: dns", "  - name: dns", 1);
    assert_ne!(without_be3, base);
    std::fs::write(&cfg, &without_be3).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || topo.status()["generation"].as_u64().unwrap() > generation),
        "the file change was picked up"
    );
    let st = topo.status();
    assert_eq!(st["sources"]["file"]["accepted"], true);
    assert_eq!(st["sources"]["file"]["rebuilt"], serde_json::json!(["web"]), "only the changed service was rebuilt");
    assert_eq!(st["sources"]["file"]["rebuilt_count"], 1);

    held.only_moved("be3");
    let after = topo.client(&["short", "20.0.0.1", "120", "16"]);
    assert_eq!(after.get("failed"), None, "{after:?}");
    assert_eq!(after.get("be3"), None, "no new connection to the removed endpoint: {after:?}");

    // A broken configuration is rejected; traffic goes on.
    std::fs::write(&cfg, without_be3.replace("vips: [20.0.0.1]", "vips: [20.0.0.0/24]")).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || topo.status()["sources"]["file"]["accepted"] == false),
        "the broken file was noticed"
    );
    let problems = topo.status()["sources"]["file"]["problems"].to_string();
    assert!(problems.contains("is not a /32 or /128"), "{problems}");
    let still = topo.client(&["short", "20.0.0.1", "30", "8"]);
    assert_eq!(still.values().sum::<u64>(), 30);
    assert_eq!(still.get("failed"), None);

    // Metrics carry the traffic.
    let metrics = String::from_utf8(topo.output("lb", &["curl", "-sf", "127.0.0.1:9091/metrics"]).stdout).unwrap();
    assert!(metrics.contains("sluice_config_reloads_total{result=\"rejected\"} 1"), "{metrics}");
    let web: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_service_packets_total{service=\"web\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(web > 3000, "web packets counted: {web}");

    stop_cleanly(&mut lb);
    topo.remove();
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir(prefix: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-{prefix}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

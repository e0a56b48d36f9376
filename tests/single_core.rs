//! `dpdk.lcores: "0"`: one lcore runs the worker and the control runtime
//! runs beside it on a thread of its own. The appliance forwards frames
//! replayed from a pcap (net_pcap -> net_null, no exception taps) to an
//! endpoint, answers its admin endpoint meanwhile, stops on SIGINT and
//! gives every mbuf back (exit status 0). Runs in a namespace of its own so
//! that the admin endpoint's port is private.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::Value;
use sluice_dataplane::craft;
use sluice_dataplane::parse::{ethertype, proto};
use sluice_tests::{pcap, privileged, sluice_bin, wait_until, Netns};

/// net_pcap's MAC for port 0: 02 'p' 'c' 'a' 'p' 00.
const PCAP_MAC: [u8; 6] = [0x02, 0x70, 0x63, 0x61, 0x70, 0x00];

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn one_lcore_runs_the_worker_and_the_control_runtime() {
    privileged();
    let ns = Netns::new("1core");
    let dir = std::env::temp_dir().join(format!("sluice-1core-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let frames: Vec<Vec<u8>> = (0..64u16)
        .map(|i| {
            let l4 = craft::tcp(1000 + i, 80, 2, b"");
            let ip = craft::with_l4_checksum(craft::ipv4([198, 51, 100, 7], [20, 0, 0, 1], proto::TCP, &l4), 20);
            craft::ether_with(PCAP_MAC, [0x02, 0xcc, 0, 0, 0, 1], &[], ethertype::IPV4, &ip)
        })
        .collect();
    let pcap_path = dir.join("in.pcap");
    std::fs::write(&pcap_path, pcap(&frames, 0)).unwrap();
    let cfg = dir.join("appliance.yaml");
    std::fs::write(
        &cfg,
        format!(
            r#"dpdk: {{lcores: "0", memoryMB: 256, hugepages: false, filePrefix: sl1core{pid}, mbufs: 4095, descriptors: 512}}
ports:
  - {{name: front, device: "net_pcap0,rx_pcap={pcap},infinite_rx=1", addresses: [10.100.0.1/24], kernelInterface: ""}}
  - {{name: back, device: "net_null1,no-rx=1", addresses: [10.200.0.1/24], kernelInterface: ""}}
services:
  - name: web
    endpoints:
      - {{id: 0, address: 10.200.0.11, mac: "02:00:00:00:c8:0b"}}
      - {{id: 1, address: 10.200.0.12, mac: "02:00:00:00:c8:0c"}}
routes:
  - {{name: web, service: web, vips: [20.0.0.1], protocols: [TCP], destinationPorts: ["80"]}}
"#,
            pid = std::process::id(),
            pcap = pcap_path.display()
        ),
    )
    .unwrap();
    let bin = sluice_bin();
    let mut lb = ns.spawn(&[bin.to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    let status = || -> Value {
        let o = ns.output(&[bin.to_str().unwrap(), "status", "--json"]);
        serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
    };
    let mut last = Value::Null;
    let forwarding = wait_until(Duration::from_secs(30), || {
        last = status();
        last["workers"][0]["balanced"].as_u64().is_some_and(|b| b > 100_000)
    });
    let (code, out, err) = lb.stop("INT", Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(forwarding, "no forwarding seen; status {last}\n{out}\n{err}");
    let workers = last["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1, "one worker");
    assert_eq!(workers[0]["drops"], 0, "{last}");
    assert_eq!(code, Some(0), "clean stop, every mbuf back:\n{err}");
    assert!(err.contains("on_main_lcore=true"), "the worker ran on the main lcore:\n{err}");
}

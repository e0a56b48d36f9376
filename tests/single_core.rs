//! `dpdk.lcores: "0"`: one lcore runs the worker and the control runtime
//! runs beside it on a thread of its own. The appliance forwards frames
//! replayed from a pcap (net_pcap -> net_pcap, no exception taps) to the
//! endpoints (the back port's pcap file shows each frame sent to an
//! endpoint's MAC), answers its admin endpoint meanwhile, stops on SIGINT and
//! gives every mbuf back (exit status 0). Runs in a namespace of its own so
//! that the admin endpoint's port is private.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::Value;
use sluice_dataplane::craft;
use sluice_dataplane::parse::{ethertype, proto};
use sluice_tests::{pcap, privileged, read_pcap, sluice_bin, wait_until, Netns};

/// net_pcap's MAC for port 0: 02 'p' 'c' 'a' 'p' 00.
const PCAP_MAC: [u8; 6] = [0x02, 0x70, 0x63, 0x61, 0x70, 0x00];

/// The endpoints' MACs (in the configuration).
const ENDPOINT_MACS: [[u8; 6]; 2] = [[0x02, 0, 0, 0, 0xc8, 0x0b], [0x02, 0, 0, 0, 0xc8, 0x0c]];

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
    // The back port receives nothing and writes what it sends to a file.
    let empty_path = dir.join("empty.pcap");
    std::fs::write(&empty_path, pcap(&[], 0)).unwrap();
    let out_path = dir.join("out.pcap");
    let cfg = dir.join("appliance.yaml");
    std::fs::write(
        &cfg,
        format!(
            r#"dpdk: {{lcores: "0", memoryMB: 256, hugepages: false, filePrefix: sl1core{pid}, mbufs: 4095, descriptors: 512}}
ports:
  - {{name: front, device: "net_pcap0,rx_pcap={pcap},infinite_rx=1", addresses: [10.100.0.1/24], kernelInterface: ""}}
  - {{name: back, device: "net_pcap1,rx_pcap={empty},tx_pcap={out}", addresses: [10.200.0.1/24], kernelInterface: ""}}
services:
  - name: web
    endpoints:
      - {{id: 0, address: 10.200.0.11, mac: "02:00:00:00:c8:0b"}}
      - {{id: 1, address: 10.200.0.12, mac: "02:00:00:00:c8:0c"}}
routes:
  - {{name: web, service: web, vips: [20.0.0.1], protocols: [TCP], destinationPorts: ["80"]}}
"#,
            pid = std::process::id(),
            pcap = pcap_path.display(),
            empty = empty_path.display(),
            out = out_path.display(),
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
    // What the back port sent, from its pcap file (closed at the stop).
    let sent = if out_path.exists() { read_pcap(&out_path) } else { Vec::new() };
    let _ = std::fs::remove_dir_all(&dir);
    assert!(forwarding, "no forwarding seen; status {last}\n{out}\n{err}");
    let balanced = last["workers"][0]["balanced"].as_u64().unwrap();
    assert!(
        sent.len() as u64 >= balanced,
        "the back port sent {} frames, fewer than the {balanced} the worker counted as balanced",
        sent.len()
    );
    // Each frame went to an endpoint's MAC, unchanged above Ethernet, and
    // each flow (source port) to one endpoint; both endpoints took flows.
    let mut endpoint_of = std::collections::HashMap::new();
    for f in &sent {
        assert!(f.len() >= 54 && f[12..14] == [0x08, 0x00] && f[30..34] == [20, 0, 0, 1], "not a forwarded frame: {f:02x?}");
        let mac: [u8; 6] = f[0..6].try_into().unwrap();
        assert!(ENDPOINT_MACS.contains(&mac), "a frame to {mac:02x?}, not to an endpoint");
        let sport = u16::from_be_bytes([f[34], f[35]]);
        assert_eq!(*endpoint_of.entry(sport).or_insert(mac), mac, "the flow from port {sport} went to two endpoints");
    }
    assert_eq!(endpoint_of.len(), 64, "every flow was forwarded");
    for mac in ENDPOINT_MACS {
        assert!(endpoint_of.values().any(|m| *m == mac), "no flow went to {mac:02x?}");
    }
    let workers = last["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1, "one worker");
    assert_eq!(workers[0]["drops"], 0, "{last}");
    assert_eq!(code, Some(0), "clean stop, every mbuf back:\n{err}");
    assert!(err.contains("on_main_lcore=true"), "the worker ran on the main lcore:\n{err}");
}

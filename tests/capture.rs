//! `sluice capture` on a net_pcap port that replays a file once: the pcap
//! it writes holds exactly the frames to or from the VIP (IPIP-wrapped ones
//! too), in order and byte for byte, cut at the count; tshark reads it when
//! installed, pcap-file always does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use serde_json::Value;
use sluice_dataplane::craft;
use sluice_dataplane::parse::{ethertype, proto};
use sluice_tests::{pcap, privileged, sluice_bin};

/// The frames of a pcap file, read with pcap-file.
fn read(path: &std::path::Path) -> Vec<Vec<u8>> {
    let mut r = pcap_file::pcap::PcapReader::new(std::fs::File::open(path).unwrap()).unwrap();
    let mut v = Vec::new();
    while let Some(p) = r.next_packet() {
        v.push(p.unwrap().data.into_owned());
    }
    v
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn captures_the_vips_frames_up_to_the_count() {
    privileged();
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("sluice-capture-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut frames = Vec::new();
    let mut wanted = Vec::new();
    for i in 0..40u16 {
        let f = match i % 4 {
            0 => craft::frame_v4(&[], [198, 51, 100, 7], [20, 0, 0, 1], proto::UDP, &craft::udp(1000 + i, 53, b"to the vip")),
            1 => craft::frame_v4(&[], [198, 51, 100, 7], [20, 0, 0, 2], proto::UDP, &craft::udp(1000 + i, 53, b"elsewhere")),
            2 => {
                let inner = craft::frame_v4(&[], [198, 51, 100, 7], [20, 0, 0, 1], proto::TCP, &craft::tcp(1000 + i, 80, 2, b""));
                craft::ether(&[], ethertype::IPV4, &craft::ipv4([10, 0, 0, 1], [10, 200, 0, 11], proto::IPIP, &inner[14..]))
            }
            _ => craft::ether(&[], ethertype::ARP, &[0u8; 28]),
        };
        if i % 4 == 0 || i % 4 == 2 {
            wanted.push(f.clone());
        }
        frames.push(f);
    }
    let input = dir.join("in.pcap");
    std::fs::write(&input, pcap(&frames, 0)).unwrap();
    let out = dir.join("out.pcap");
    let o = Command::new(sluice_bin())
        .args(["capture", "--json", "--port"])
        .arg(format!("net_pcap0,rx_pcap={}", input.display()))
        .args(["-w", out.to_str().unwrap(), "--vip", "20.0.0.1", "-c", "15", "--duration", "5"])
        .args(["--lcores", "0", "--memory-mb", "256", "--mbufs", "2047", "--file-prefix", &format!("slcap{pid}")])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "capture failed:\n{err}");
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}\n{err}", String::from_utf8_lossy(&o.stdout)));
    assert_eq!(summary["written"], 15, "{summary}");
    assert_eq!(summary["mbufs_in_use_after"], 0);
    let got = read(&out);
    assert_eq!(got.len(), 15);
    assert_eq!(got, wanted[..15].to_vec(), "the VIP's frames, in order, byte for byte");
    // Filtered out before the count was reached: the frames between.
    assert_eq!(summary["filtered_out"].as_u64().unwrap(), 14, "{summary}");
    if Command::new("tshark").arg("--version").output().is_ok_and(|o| o.status.success()) {
        let t = Command::new("tshark").args(["-r", out.to_str().unwrap(), "-T", "fields", "-e", "ip.dst"]).output().unwrap();
        assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
        let lines = String::from_utf8_lossy(&t.stdout).lines().count();
        assert_eq!(lines, 15, "tshark reads every frame");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

//! The memif loopback lab end to end: `sluice gen` (memif server) sends a
//! mixed flow set (TCP SYN, TCP data, UDP, IPv4 and IPv6, fragments) to
//! `sluice run` (memif client ports), which balances it over endpoints on
//! its back port, back to the generator. Asserts accounting only: every
//! frame the generator sent came back or is one the appliance counted as
//! dropped, every endpoint got a share, and both processes returned every
//! mbuf. Runs in a namespace of its own so that the admin endpoint's port
//! is private.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::Value;
use sluice_tests::{pcap, privileged, sluice_bin, wait_until, Netns};

const ENDPOINTS: usize = 3;

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn every_frame_through_the_appliance_is_accounted_for() {
    privileged();
    let pid = std::process::id();
    let ns = Netns::new("lab");
    let dir = std::env::temp_dir().join(format!("sluice-lab-e2e-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = |n: &str| dir.join(format!("{n}.sock")).display().to_string();
    let mut eps4 = String::new();
    let mut eps6 = String::new();
    for e in 0..ENDPOINTS {
        eps4.push_str(&format!("      - {{id: {e}, address: 10.200.0.{}, mac: \"02:ee:00:00:04:{e:02x}\"}}\n", 10 + e));
        eps6.push_str(&format!("      - {{id: {e}, address: \"fd00:200::{}\", mac: \"02:ee:00:00:06:{e:02x}\"}}\n", 10 + e));
    }
    let cfg = dir.join("appliance.yaml");
    std::fs::write(
        &cfg,
        format!(
            r#"dpdk: {{lcores: "0,1", memoryMB: 512, hugepages: false, filePrefix: sllab{pid}run, mbufs: 8191, descriptors: 512, extraArgs: ["--main-lcore=1"]}}
ports:
  - {{name: front, device: "net_memif0,role=client,socket={front},socket-abstract=no,mac=02:51:00:00:00:01", addresses: [10.100.0.1/24, "fd00:100::1/64"], kernelInterface: ""}}
  - {{name: back, device: "net_memif1,role=client,socket={back},socket-abstract=no,mac=02:51:00:00:00:02", addresses: [10.200.0.1/24, "fd00:200::1/64"], kernelInterface: ""}}
services:
  - name: lab4
    endpoints:
{eps4}  - name: lab6
    endpoints:
{eps6}routes:
  - {{name: lab4, service: lab4, vips: [20.0.0.1], protocols: [TCP, UDP], destinationPorts: ["80"]}}
  - {{name: lab6, service: lab6, vips: ["fd00:20::1"], protocols: [TCP, UDP], destinationPorts: ["80"]}}
"#,
            front = sock("front"),
            back = sock("back"),
        ),
    )
    .unwrap();
    let bin = sluice_bin();
    let bin = bin.to_str().unwrap();
    let report = dir.join("gen.json");
    let mut gen = ns.spawn(&[
        bin,
        "gen",
        "--quiet",
        "--json",
        report.to_str().unwrap(),
        "--port",
        &format!("net_memif0,role=server,socket={},socket-abstract=no", sock("front")),
        "--port",
        &format!("net_memif1,role=server,socket={},socket-abstract=no", sock("back")),
        "--dst-mac",
        "02:51:00:00:00:01",
        "--vips",
        "20.0.0.1,fd00:20::1",
        "--proto",
        "tcp-syn,tcp-data,udp",
        "--sizes",
        "64,200,1518",
        "--fragments",
        "50",
        "--flows",
        "600",
        "--rate",
        "100k",
        "--duration",
        "3",
        "--wait-link",
        "60",
        "--wait-ready",
        "127.0.0.1:9091",
        "--file-prefix",
        &format!("sllab{pid}gen"),
        "--mbufs",
        "8191",
        "--memory-mb",
        "512",
    ]);
    if !wait_until(Duration::from_secs(10), || dir.join("back.sock").exists()) {
        let (_, out, err) = gen.stop("INT", Duration::from_secs(5));
        panic!("the generator made no memif socket:\n{out}\n{err}");
    }
    let mut lb = ns.spawn(&[bin, "run", "--config", cfg.to_str().unwrap()]);
    let done = wait_until(Duration::from_secs(90), || !gen.running());
    let (gen_code, _, gen_err) = gen.stop("INT", Duration::from_secs(10));
    let o = ns.output(&[bin, "status", "--json"]);
    let status: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    let (lb_code, _, lb_err) = lb.stop("INT", Duration::from_secs(15));
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(done, "the generator did not finish:\n{gen_err}\n{lb_err}");
    assert_eq!(gen_code, Some(0), "generator failed:\n{gen_err}\n{lb_err}");
    let g: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("report {text:?}: {e}\n{gen_err}"));

    let sent = g["sent"].as_u64().unwrap();
    let received = g["received"].as_u64().unwrap();
    assert!(sent > 10_000, "too little was sent: {g}");
    let workers = status["workers"].as_array().unwrap_or_else(|| panic!("no status: {status}"));
    let sum = |k: &str| workers.iter().map(|w| w[k].as_u64().unwrap()).sum::<u64>();
    let (rx, tx, drops) = (sum("rx_packets"), sum("tx_packets"), sum("drops"));
    // Each memif hop is lossless (a full ring refuses frames at the sender,
    // which the generator counts as tx_full, not as sent).
    assert_eq!(rx, sent, "appliance received what the generator sent; status {status}\nreport {g}");
    assert_eq!(tx, received + g["unstamped_received"].as_u64().unwrap(), "generator received what the appliance sent");
    // A frame the appliance answers (an ICMP error back to its source)
    // comes back unstamped: it is neither received through an endpoint nor
    // a drop. Every frame here fits the ports' MTU (1500, the default; the
    // largest size asked is 1518 with the FCS, fragments included), so
    // none may be answered as too big.
    let answered = g["unstamped_received"].as_u64().unwrap();
    eprintln!("sent {sent}, received through endpoints {received}, answered {answered}, dropped {drops}");
    assert_eq!(answered, 0, "frames within the MTU were answered (ICMP errors back to the generator); status {status}\nreport {g}");
    assert_eq!(sent, received + answered + drops, "every frame is back, answered or a counted drop; status {status}\nreport {g}");
    assert_eq!(g["lost"].as_u64().unwrap(), drops + answered, "the generator counts answered frames as lost");
    assert_eq!(g["duplicates"], 0);
    assert_eq!(g["unknown_flow"], 0);
    // Every endpoint of both families got traffic.
    let eps = g["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 2 * ENDPOINTS, "{eps:?}");
    assert!(eps.iter().all(|e| e["packets"].as_u64().unwrap() > 0));
    assert!(g["latency_us"]["p99"].as_f64().is_some());
    assert_eq!(g["mbufs_in_use_after"], 0);
    assert_eq!(lb_code, Some(0), "the appliance stopped cleanly with every mbuf back:\n{lb_err}");
}

/// `sluice gen --pcap` on a net_ring port (what it sends, it receives):
/// the file is replayed unchanged and looped, at its own timing and at a
/// rate, and every frame sent comes back.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn pcap_replay_loops_and_every_frame_comes_back() {
    use sluice_dataplane::craft;
    use sluice_dataplane::parse::proto;
    privileged();
    let pid = std::process::id();
    let dir = std::env::temp_dir().join(format!("sluice-gen-pcap-{pid}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let frames: Vec<Vec<u8>> =
        (0..10u16).map(|i| craft::frame_v4(&[], [198, 51, 100, 7], [20, 0, 0, 1], proto::UDP, &craft::udp(1000 + i, 53, b"replayed"))).collect();
    let file = dir.join("in.pcap");
    std::fs::write(&file, pcap(&frames, 10_000)).unwrap();
    let bin = sluice_bin();
    for (k, timing) in [["--pcap-timing", "--quiet"], ["--rate", "20k"]].iter().enumerate() {
        let report = dir.join(format!("r{k}.json"));
        let mut args = vec![
            bin.to_str().unwrap(),
            "gen",
            "--port",
            "net_ring0",
            "--pcap",
            file.to_str().unwrap(),
            "--duration",
            "1",
            "--drain-ms",
            "200",
            "--json",
            report.to_str().unwrap(),
            "--mbufs",
            "4095",
            "--memory-mb",
            "256",
        ];
        let prefix = format!("slgenpcap{pid}{k}");
        args.extend_from_slice(timing);
        args.extend_from_slice(&["--file-prefix", &prefix]);
        let o = std::process::Command::new(args[0]).args(&args[1..]).output().unwrap();
        let text = std::fs::read_to_string(&report).unwrap_or_default();
        assert!(o.status.success(), "{timing:?}: {}\n{text}", String::from_utf8_lossy(&o.stderr));
        let g: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(g["mode"], "pcap");
        let sent = g["sent"].as_u64().unwrap();
        assert!(sent > 10, "{timing:?}: the 10-frame file was looped: {g}");
        assert_eq!(g["received"].as_u64().unwrap(), sent, "{timing:?}: {g}");
        assert_eq!(g["unstamped_received"].as_u64().unwrap(), sent, "replayed frames carry no stamp");
        assert_eq!(g["lost"], 0);
        assert_eq!(g["mbufs_in_use_after"], 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

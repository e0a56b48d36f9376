//! Packets too big for their tunnel: the ICMP error path-MTU discovery
//! needs goes back to the client (IPv4 "fragmentation needed" when DF is
//! set, IPv6 "packet too big" always), byte for byte, with checksums that
//! verify here and in tcpdump; errors are never answered with errors, and
//! a worker sends them at a bounded rate.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

mod common;

use std::process::Command;

use common::*;
use sluice_dataplane::checksum;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::craft;
use sluice_dataplane::io::PacketBuf;
use sluice_dataplane::memio::MemBuf;
use sluice_dataplane::parse::{ethertype, parse, proto, v4, Frame};
use sluice_dataplane::pipeline::{Pipeline, PipelineConfig};
use sluice_dataplane::snapshot::Snapshot;
use sluice_dataplane::verdict::{DropReason, Verdict};

const ROUTER_MAC: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 1];

/// A TCP segment of `total` bytes of IPv4 packet from `src` to VIP:8443.
fn big4(src: [u8; 4], total: usize, frag: u16) -> Vec<u8> {
    let tcp = craft::tcp(40000, 8443, 0x18, &vec![0x5a; total - 40]);
    craft::with_l4_checksum(craft::ipv4_full(src, VIP, proto::TCP, 64, 0x1234, frag, &[], &tcp), 20)
}

/// A TCP segment of `total` bytes of IPv6 packet from the client to VIP6:443.
fn big6(total: usize) -> Vec<u8> {
    let tcp = craft::tcp(5000, 443, 0x18, &vec![0xa5; total - 60]);
    craft::with_l4_checksum(craft::ipv6(CLIENT6, VIP6, proto::TCP, &tcp), 40)
}

fn frame(vlans: &[u16], ip: &[u8]) -> Vec<u8> {
    let et = if ip[0] >> 4 == 6 { ethertype::IPV6 } else { ethertype::IPV4 };
    craft::ether_with(FRONT_MAC, ROUTER_MAC, vlans, et, ip)
}

/// The expected "fragmentation needed" for `orig`, built independently.
fn expected4(orig: &[u8], mtu: u16) -> Vec<u8> {
    let mut icmp = vec![3, 4, 0, 0, 0, 0];
    icmp.extend_from_slice(&mtu.to_be_bytes());
    icmp.extend_from_slice(&orig[..orig.len().min(576 - 28)]);
    let c = checksum::checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    craft::ether_with(ROUTER_MAC, FRONT_MAC, &[], ethertype::IPV4, &craft::ipv4_full(VIP, CLIENT, proto::ICMP, 64, 0, v4::DF, &[], &icmp))
}

/// The expected "packet too big" for `orig`.
fn expected6(orig: &[u8], mtu: u32) -> Vec<u8> {
    let mut icmp = vec![2, 0, 0, 0];
    icmp.extend_from_slice(&mtu.to_be_bytes());
    icmp.extend_from_slice(&orig[..orig.len().min(1280 - 48)]);
    let ip = craft::with_l4_checksum(craft::ipv6(VIP6, CLIENT6, proto::ICMPV6, &icmp), 40);
    craft::ether_with(ROUTER_MAC, FRONT_MAC, &[], ethertype::IPV6, &ip)
}

fn run(pl: &mut Pipeline, snap: &Snapshot, ctr: &WorkerCounters, f: &[u8], now: u64) -> (Verdict, MemBuf) {
    let mut b = MemBuf::new(f);
    let v = pl.process(snap, 0, &mut b, now, ctr);
    (v, b)
}

/// Writes `frames` as a classic pcap and returns what `tcpdump -vv` says.
fn tcpdump(frames: &[&[u8]]) -> String {
    let mut pcap = Vec::new();
    for w in [0xa1b2_c3d4u32, 0x0002_0004, 0, 0, 65535, 1] {
        pcap.extend_from_slice(&w.to_le_bytes());
    }
    // The version is two 16-bit fields: 2, 4.
    pcap[4..8].copy_from_slice(&[2, 0, 4, 0]);
    for (i, f) in frames.iter().enumerate() {
        for w in [i as u32, 0, f.len() as u32, f.len() as u32] {
            pcap.extend_from_slice(&w.to_le_bytes());
        }
        pcap.extend_from_slice(f);
    }
    let path = std::env::temp_dir().join(format!("sluice-icmp-too-big-{}.pcap", std::process::id()));
    std::fs::write(&path, &pcap).unwrap();
    let out = Command::new("tcpdump").args(["-nn", "-vv", "-r"]).arg(&path).output();
    let _ = std::fs::remove_file(&path);
    let out = out.expect("tcpdump is needed for this test (scripts/setup.sh installs it)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn too_big_for_the_tunnel_answers_the_client() {
    let snap = appliance(1);
    let ctr = WorkerCounters::new(8, 1000);
    let mut pl = Pipeline::new(&PipelineConfig::default(), 1);

    // IPv4 with DF, tunnelled IPv4-in-IPv4 on a 1500-byte port: 1490 + 20 > 1500.
    let orig4 = big4(CLIENT, 1490, v4::DF);
    let (v, b4) = run(&mut pl, &snap, &ctr, &frame(&[], &orig4), 1);
    assert_eq!(v, Verdict::Forward(0), "out of the port it came in on");
    let want4 = expected4(&orig4, 1480);
    assert_eq!(b4.data(), &want4[..], "fragmentation needed, next-hop MTU 1500 - 20, 548 bytes quoted");
    assert_eq!(b4.data().len(), 14 + 576);

    // A small one quotes the whole original packet.
    let small = big4(CLIENT, 1481, v4::DF);
    let (v, b) = run(&mut pl, &snap, &ctr, &frame(&[], &small), 1);
    assert_eq!(v, Verdict::Forward(0));
    assert_eq!(b.data(), &expected4(&small, 1480)[..]);

    // IPv6 tunnelled IPv6-in-IPv6: 1480 + 40 > 1500.
    let orig6 = big6(1480);
    let (v, b6) = run(&mut pl, &snap, &ctr, &frame(&[], &orig6), 1);
    assert_eq!(v, Verdict::Forward(0));
    assert_eq!(b6.data(), &expected6(&orig6, 1460)[..], "packet too big, MTU 1500 - 40, 1232 bytes quoted");
    assert_eq!(b6.data().len(), 14 + 1280);
    assert_eq!(ctr.icmp_too_big.get(), 3);
    assert_eq!(ctr.balanced.get(), 0, "an answer is not a balanced packet");

    // The answers parse as ICMP errors about the client's flows.
    for (b, sport) in [(&b4, 40000), (&b6, 5000)] {
        let Ok(Frame::Ip(p)) = parse(b.data()) else { panic!("the answer parses") };
        assert!(p.icmp_error && p.inner_ports);
        assert_eq!((p.inner.sport, p.inner.dst, p.flow.src), (sport, p.flow.src, p.inner.dst));
    }

    // tcpdump agrees on the fields and the checksums.
    let seen = tcpdump(&[b4.data(), b6.data()]);
    assert!(seen.contains("20.0.0.1 > 198.51.100.7: ICMP 20.0.0.1 unreachable - need to frag (mtu 1480)"), "{seen}");
    assert!(seen.contains("2001:db8::100 > 2001:db8:9::7: [icmp6 sum ok] ICMP6, packet too big, mtu 1460"), "{seen}");
    assert!(!seen.contains("bad") && !seen.contains("wrong"), "{seen}");
}

#[test]
fn no_answer_without_df_to_errors_or_to_odd_sources() {
    let snap = appliance(1);
    let ctr = WorkerCounters::new(8, 1000);
    let mut pl = Pipeline::new(&PipelineConfig::default(), 1);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("IPv4 without DF: we do not fragment, and the sender did not ask", big4(CLIENT, 1490, 0)),
        ("a loopback source", big4([127, 0, 0, 1], 1490, v4::DF)),
        ("a multicast source", big4([224, 0, 0, 5], 1490, v4::DF)),
        ("an unspecified source", big4([0, 0, 0, 0], 1490, v4::DF)),
        ("the broadcast source", big4([255, 255, 255, 255], 1490, v4::DF)),
        ("a later fragment (RFC 1812 4.3.2.7)", big4(CLIENT, 1490, 185)),
        (
            "an ICMP error about a flow of the tunnelled service",
            {
                let reply = craft::ipv4(VIP, CLIENT, proto::TCP, &craft::tcp(8443, 40000, 0x10, &[0; 1430]));
                craft::ipv4_full([203, 0, 113, 1], VIP, proto::ICMP, 64, 0, v4::DF, &[], &craft::icmp4_error(3, 4, &reply))
            },
        ),
    ];
    let (v, _) = run(&mut pl, &snap, &ctr, &frame(&[], &big4(CLIENT, 100, v4::MF)), 1);
    assert_eq!(v, Verdict::Forward(1), "the first fragment of the datagram is tunnelled");
    for (what, ip) in &cases {
        let (v, _) = run(&mut pl, &snap, &ctr, &frame(&[], ip), 1);
        // Without DF (a later fragment has none) the packet could have been
        // fragmented: its own reason.
        let df = ip[6] & 0x40 != 0;
        let want = if df { DropReason::EncapTooBig } else { DropReason::EncapTooBigNoDf };
        assert_eq!(v, Verdict::Drop(want), "{what}");
    }
    // An ICMPv6 error about a flow of the IPv6 tunnel.
    let reply6 = craft::ipv6(VIP6, CLIENT6, proto::TCP, &craft::tcp(443, 5000, 0x10, &[0; 1400]));
    let err6 = craft::with_l4_checksum(craft::ipv6(CLIENT6, VIP6, proto::ICMPV6, &craft::icmp6_error(1, 4, &reply6)), 40);
    let (v, _) = run(&mut pl, &snap, &ctr, &frame(&[], &err6), 1);
    assert_eq!(v, Verdict::Drop(DropReason::EncapTooBig), "ICMPv6 error");
    assert_eq!(ctr.icmp_too_big.get(), 0);
}

#[test]
fn answers_are_rate_limited_per_worker() {
    let snap = appliance(1);
    let ctr = WorkerCounters::new(8, 1000);
    let cfg = PipelineConfig { icmp_rate: 10, icmp_burst: 3, ..PipelineConfig::default() };
    let mut pl = Pipeline::new(&cfg, 1);
    let f = frame(&[], &big4(CLIENT, 1490, v4::DF));
    let verdicts: Vec<Verdict> = (0..5).map(|_| run(&mut pl, &snap, &ctr, &f, 1000).0).collect();
    let limited = Verdict::Drop(DropReason::IcmpRateLimited);
    assert_eq!(verdicts, [Verdict::Forward(0), Verdict::Forward(0), Verdict::Forward(0), limited, limited], "a burst of 3");
    // 10 per second: one more after 100 ms, not before.
    assert_eq!(run(&mut pl, &snap, &ctr, &f, 1090).0, limited);
    assert_eq!(run(&mut pl, &snap, &ctr, &f, 1100).0, Verdict::Forward(0));
    assert_eq!(run(&mut pl, &snap, &ctr, &f, 1100).0, limited);
    // A long pause refills the bucket to its burst, not beyond.
    let later: Vec<Verdict> = (0..4).map(|_| run(&mut pl, &snap, &ctr, &f, 60_000).0).collect();
    assert_eq!(later, [Verdict::Forward(0), Verdict::Forward(0), Verdict::Forward(0), limited]);
    assert_eq!(ctr.icmp_too_big.get(), 7);
}

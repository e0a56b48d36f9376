//! The parser against real captures from tcpdump's regression suite
//! (`../shared/fixtures/pcap/tcpdump`), many of them malformed on purpose.
//!
//! Every packet must parse or be dropped with a reason (never panic), and
//! for every packet the parser accepts as IP, the 5-tuple must be the one
//! `tcpdump -nn` prints for it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_dataplane::addr::Addr;
use sluice_dataplane::parse::{self, ethertype, proto, Frame};

fn corpus_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/pcap/tcpdump");
    assert!(d.is_dir(), "pcap fixtures not found at {} (../shared must sit beside the checkout)", d.display());
    d
}

/// (link type, packets) of a classic pcap file.
fn read_pcap(path: &Path) -> (u32, Vec<Vec<u8>>) {
    let d = std::fs::read(path).unwrap();
    let le = match &d[..4] {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
        m => panic!("{}: not a pcap file (magic {m:02x?})", path.display()),
    };
    let u32at = |o: usize| {
        let b = [d[o], d[o + 1], d[o + 2], d[o + 3]];
        if le { u32::from_le_bytes(b) } else { u32::from_be_bytes(b) }
    };
    let linktype = u32at(20);
    let mut pkts = Vec::new();
    let mut off = 24;
    while off + 16 <= d.len() {
        let incl = u32at(off + 8) as usize;
        let end = (off + 16 + incl).min(d.len());
        pkts.push(d[off + 16..end].to_vec());
        off += 16 + incl;
    }
    (linktype, pkts)
}

/// The frame as the parser sees it: raw-IP link types get an Ethernet header.
fn as_ethernet(linktype: u32, pkt: &[u8]) -> Option<Vec<u8>> {
    let et = match linktype {
        1 => return Some(pkt.to_vec()),
        228 => ethertype::IPV4,
        229 => ethertype::IPV6,
        101 => match pkt.first().map(|b| b >> 4) {
            Some(6) => ethertype::IPV6,
            _ => ethertype::IPV4,
        },
        _ => return None,
    };
    let mut f = vec![0u8; 12];
    f.extend_from_slice(&et.to_be_bytes());
    f.extend_from_slice(pkt);
    Some(f)
}

/// What tcpdump printed for one packet: addresses and ports, when it
/// decoded an IP header.
#[derive(Debug, PartialEq)]
struct Seen {
    src: Addr,
    dst: Addr,
    ports: Option<(u16, u16)>,
}

fn split_endpoint(s: &str, v6: bool) -> Option<(Addr, Option<u16>)> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some((Addr::from(ip), None));
    }
    let (a, p) = s.rsplit_once('.')?;
    let ip: IpAddr = a.parse().ok()?;
    if ip.is_ipv6() != v6 {
        return None;
    }
    Some((Addr::from(ip), Some(p.parse().ok()?)))
}

fn tcpdump_line(line: &str) -> Option<Seen> {
    let mut t = line.split_whitespace();
    let v6 = match t.next()? {
        "IP" => false,
        "IP6" => true,
        _ => return None,
    };
    let (src, sp) = split_endpoint(t.next()?, v6)?;
    if t.next()? != ">" {
        return None;
    }
    let d = t.next()?;
    let (dst, dp) = split_endpoint(d.strip_suffix(':').unwrap_or(d), v6)?;
    let mut ports = sp.zip(dp);
    if ports.is_none() {
        // After IPv6 extension headers tcpdump prints the ports on their
        // own: "RT6 (...) 5645 > 5642: UDP".
        let rest: Vec<&str> = t.collect();
        ports = rest.windows(3).find_map(|w| {
            let s: u16 = w[0].parse().ok()?;
            let d: u16 = w[2].strip_suffix(':')?.parse().ok()?;
            (w[1] == ">").then_some((s, d))
        });
    }
    Some(Seen { src, dst, ports })
}

fn tcpdump(path: &Path) -> Vec<String> {
    let out = Command::new("tcpdump")
        .args(["-nn", "-q", "-t", "-r"])
        .arg(path)
        .output()
        .expect("tcpdump is needed for this test (scripts/setup.sh installs it)");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect()
}

/// Drops per reason over the corpus.
const WANT_DROPS: [(&str, usize); 11] = [
    ("eth_truncated", 42),
    ("ipv4_bad_checksum", 2),
    ("ipv4_bad_header_length", 1),
    ("ipv4_bad_total_length", 146),
    ("ipv4_bad_version", 1),
    ("ipv4_truncated", 1),
    ("ipv6_bad_extension_header", 1),
    ("ipv6_bad_payload_length", 13),
    ("ipv6_bad_version", 3),
    ("ipv6_jumbo", 2),
    ("ipv6_truncated", 2),
];
/// (packets, IP parsed, compared with tcpdump, not IP, other link types).
const WANT_COUNTS: (usize, usize, usize, usize, usize) = (944, 559, 523, 171, 0);
/// Files not compared with tcpdump: it prints some of their packets on
/// more than one line (6 packets in 18 lines; 100 in 130).
const WANT_MISALIGNED: [&str; 2] = ["icmp6-rfc8335.pcap", "various_gre.pcap"];

#[test]
fn every_capture_parses_or_drops_and_tuples_match_tcpdump() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    files.sort();
    assert!(files.len() > 100, "the corpus is there");

    let mut drops: BTreeMap<&'static str, usize> = BTreeMap::new();
    let (mut total, mut ip_ok, mut compared, mut non_ip, mut other_link) = (0, 0, 0, 0, 0);
    // Files where tcpdump printed another number of lines than there are
    // packets (it stops at a truncated record, or prints a packet on two
    // lines): their packets are parsed but not compared.
    let mut misaligned = Vec::new();
    let mut mismatches = Vec::new();
    for f in &files {
        let (lt, pkts) = read_pcap(f);
        let lines = tcpdump(f);
        let aligned = lines.len() == pkts.len();
        if !aligned {
            misaligned.push(f.file_name().unwrap().to_string_lossy().into_owned());
        }
        for (i, pkt) in pkts.iter().enumerate() {
            total += 1;
            let Some(frame) = as_ethernet(lt, pkt) else {
                other_link += 1;
                continue;
            };
            match parse::parse(&frame) {
                Err(r) => *drops.entry(r.name()).or_default() += 1,
                Ok(Frame::Other { .. }) => non_ip += 1,
                Ok(Frame::Ip(p)) => {
                    ip_ok += 1;
                    if !aligned {
                        continue;
                    }
                    let name = f.file_name().unwrap().to_string_lossy();
                    let Some(seen) = tcpdump_line(&lines[i]) else {
                        mismatches.push(format!("{name}#{i}: we parsed IP {:?}, tcpdump: {}", p.flow, lines[i]));
                        continue;
                    };
                    compared += 1;
                    let ours_ports = p.has_ports.then_some((p.flow.sport, p.flow.dport));
                    let ports_ok = match (ours_ports, seen.ports) {
                        (a, b) if a == b => true,
                        // tcpdump decodes ports of transports Sluice does not balance on (DCCP, ...).
                        (None, Some(_)) => !matches!(p.flow.proto, proto::TCP | proto::UDP | proto::SCTP),
                        _ => false,
                    };
                    if p.flow.src != seen.src || p.flow.dst != seen.dst || !ports_ok {
                        mismatches.push(format!("{name}#{i}: ours {:?} has_ports={} vs tcpdump {}", p.flow, p.has_ports, lines[i]));
                    }
                }
            }
        }
    }
    println!(
        "{total} packets: {ip_ok} IP parsed ({compared} compared with tcpdump), {non_ip} not IP, {other_link} of other link types, drops {drops:?}, misaligned {misaligned:?}"
    );
    assert!(mismatches.is_empty(), "{} mismatches:\n{}", mismatches.len(), mismatches.join("\n"));
    // Pinned: a parser change that drops (or accepts) packets it did not,
    // or a file that stops being compared, shows here with its reason.
    let want_drops: BTreeMap<&str, usize> = BTreeMap::from(WANT_DROPS);
    assert_eq!(drops, want_drops, "drops per reason");
    assert_eq!((total, ip_ok, compared, non_ip, other_link), WANT_COUNTS, "(packets, IP parsed, compared with tcpdump, not IP, other link types)");
    assert_eq!(misaligned, WANT_MISALIGNED, "files whose packets tcpdump does not print one per line");
}

//! Edges of the packet path at the frame level: frames are written to a
//! pcap file, read back from it into a worker, and what the worker sends is
//! written to pcap files that tshark decodes. IPv6 Hop-by-Hop options after
//! another extension header, 802.1Q tags on ports with and without a VLAN,
//! IPv4 without DF too big for its tunnel, and IPv4 datagrams larger than
//! the output's MTU (fragmented, or refused with DF).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use common::*;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::craft;
use sluice_dataplane::io::PacketBuf;
use sluice_dataplane::memio::{MemBuf, MemIo};
use sluice_dataplane::parse::{ethertype, proto, v4};
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::snapshot::{PortInfo, Snapshot};
use sluice_dataplane::verdict::DropReason;
use sluice_dataplane::worker::{Input, Worker, WorkerConfig};

const CLIENT_MAC: [u8; 6] = [0x02, 0xcc, 0, 0, 0, 1];

/// A directory of this test's own, emptied.
fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-edges-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes a classic pcap file (Ethernet, microseconds).
fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut d = Vec::new();
    d.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    d.extend_from_slice(&2u16.to_le_bytes());
    d.extend_from_slice(&4u16.to_le_bytes());
    d.extend_from_slice(&[0; 8]);
    d.extend_from_slice(&65535u32.to_le_bytes());
    d.extend_from_slice(&1u32.to_le_bytes());
    for (i, f) in frames.iter().enumerate() {
        d.extend_from_slice(&(i as u32).to_le_bytes());
        d.extend_from_slice(&0u32.to_le_bytes());
        d.extend_from_slice(&(f.len() as u32).to_le_bytes());
        d.extend_from_slice(&(f.len() as u32).to_le_bytes());
        d.extend_from_slice(f);
    }
    std::fs::write(path, d).unwrap();
}

/// The frames of a pcap file written by [`write_pcap`].
fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let d = std::fs::read(path).unwrap();
    assert_eq!(d[..4], 0xa1b2_c3d4u32.to_le_bytes());
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= d.len() {
        let n = u32::from_le_bytes(d[off + 8..off + 12].try_into().unwrap()) as usize;
        out.push(d[off + 16..off + 16 + n].to_vec());
        off += 16 + n;
    }
    out
}

/// tshark's fields of every frame of `path`, one line per frame, fields
/// separated by `|` (empty when the frame has none), the occurrences of a
/// field separated by `,`.
fn tshark(path: &Path, fields: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("tshark");
    cmd.args(["-n", "-r"]).arg(path).args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=a", "-E", "aggregator=,"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("tshark is needed for this test (scripts/setup.sh installs it)");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect()
}

fn config() -> WorkerConfig {
    WorkerConfig {
        id: 0,
        // p0 (front, exception path to output 2), p1 (back), and the
        // kernel's side of p0's exception path (out on p0).
        inputs: vec![Input::Port { port: 0, exception: Some(2) }, Input::Port { port: 1, exception: None }, Input::Passthrough { output: 0 }],
        outputs: 3,
        pipeline: Default::default(),
        stash_capacity: 16,
        stash_ttl_ms: 1000,
    }
}

/// What a worker sent out of each output, and its counters.
struct Run {
    outputs: Vec<Vec<Vec<u8>>>,
    ctr: Arc<WorkerCounters>,
}

impl Run {
    fn drops(&self, r: DropReason) -> u64 {
        self.ctr.drops[r.index()].get()
    }
}

/// Writes `inputs` (frames per input) to pcap files in `d`, reads them back
/// into a worker over `snap`, polls until every frame is taken, and writes
/// each output to `out<N>.pcap`.
fn run(d: &Path, snap: Snapshot, inputs: &[Vec<Vec<u8>>]) -> Run {
    run_with(d, snap, inputs, usize::MAX)
}

/// [`run`] with an I/O backend that gives at most `buffers` new buffers.
fn run_with(d: &Path, snap: Snapshot, inputs: &[Vec<Vec<u8>>], buffers: usize) -> Run {
    let p = Publisher::new(snap);
    let ctr = Arc::new(WorkerCounters::new(8, 1000));
    let mut io = MemIo::new(3, 3);
    io.buffers = buffers;
    let mut w = Worker::new(io, p.reader(), ctr.clone(), &config());
    let mut total = 0;
    for (i, frames) in inputs.iter().enumerate() {
        let path = d.join(format!("in{i}.pcap"));
        write_pcap(&path, frames);
        let back = read_pcap(&path);
        assert_eq!(&back, frames);
        total += back.len();
        w.io_mut().inputs[i].extend(back.iter().map(|f| MemBuf::new(f)));
    }
    let mut taken = 0;
    for _ in 0..100 {
        if taken >= total {
            break;
        }
        taken += w.poll(1);
    }
    assert_eq!(taken, total, "every frame was taken");
    let outputs: Vec<Vec<Vec<u8>>> =
        w.io_mut().outputs.iter_mut().map(|o| std::mem::take(o).iter().map(|b| b.data().to_vec()).collect()).collect();
    for (i, o) in outputs.iter().enumerate() {
        write_pcap(&d.join(format!("out{i}.pcap")), o);
    }
    let l = w.ledger();
    l.check().unwrap();
    Run { outputs, ctr }
}

fn tcp6(ext: &[u8], first_next: u8, dport: u16) -> Vec<u8> {
    // The TCP checksum as if the segment followed the IPv6 header directly:
    // extension headers are not in the pseudo-header.
    let plain = craft::with_l4_checksum(craft::ipv6(CLIENT6, VIP6, proto::TCP, &craft::tcp(5000, dport, 2, b"")), 40);
    let mut payload = ext.to_vec();
    payload.extend_from_slice(&plain[40..]);
    craft::ether_with(FRONT_MAC, CLIENT_MAC, &[], ethertype::IPV6, &craft::ipv6(CLIENT6, VIP6, first_next, &payload))
}

/// An 8-byte options header (Hop-by-Hop or Destination Options) with one
/// PadN option, followed by `next`.
fn options(next: u8) -> [u8; 8] {
    [next, 0, 1, 4, 0, 0, 0, 0]
}

#[test]
fn ipv6_hop_by_hop_options_after_another_header_are_dropped_and_counted() {
    let d = dir("hbh");
    let hbh_first = tcp6(&[options(proto::DSTOPTS), options(proto::TCP)].concat(), proto::HOPOPT, 443);
    let hbh_second = tcp6(&[options(proto::HOPOPT), options(proto::TCP)].concat(), proto::DSTOPTS, 443);
    let hbh_after_fragment = tcp6(
        &[craft::ipv6_fragment_header(proto::HOPOPT, 0, false, 9), options(proto::TCP)].concat(),
        proto::FRAGMENT,
        443,
    );
    let r = run(&d, appliance(1), &[vec![hbh_first, hbh_second, hbh_after_fragment], vec![], vec![]]);

    // tshark sees the input as built: Hop-by-Hop first, then second, then after a fragment header.
    let seen = tshark(&d.join("in0.pcap"), &["ipv6.nxt", "ipv6.hopopts.nxt", "ipv6.dstopts.nxt", "ipv6.fraghdr.nxt", "tcp.dstport"]);
    assert_eq!(seen, ["0|60|6||443", "60|6|0||443", "44|6||0|443"], "{seen:?}");

    assert_eq!(r.drops(DropReason::Ipv6HopByHopNotFirst), 2);
    let out = tshark(&d.join("out1.pcap"), &["ipv6.nxt", "ipv6.hopopts.nxt", "ipv6.dstopts.nxt", "ipv6.hlim", "tcp.dstport"]);
    assert_eq!(out, ["41,0|60|6|64,63|443"], "only the packet with Hop-by-Hop first goes to an endpoint (IPv6-in-IPv6)");
    assert!(r.outputs[0].is_empty() && r.outputs[2].is_empty());
}

/// The SYN to VIP:80 (service "web", L2) from the client, tagged with `vlans`.
fn syn(vlans: &[u16]) -> Vec<u8> {
    let ip = craft::with_l4_checksum(craft::ipv4_full(CLIENT, VIP, proto::TCP, 64, 0, v4::DF, &[], &craft::tcp(40000, 80, 2, b"")), 20);
    craft::ether_with(FRONT_MAC, CLIENT_MAC, vlans, ethertype::IPV4, &ip)
}

/// An ARP request for the appliance, broadcast, tagged with `vlans`.
fn arp(vlans: &[u16]) -> Vec<u8> {
    let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1];
    a.extend_from_slice(&CLIENT_MAC);
    a.extend_from_slice(&CLIENT);
    a.extend_from_slice(&[0; 6]);
    a.extend_from_slice(&[10, 100, 0, 1]);
    craft::ether_with([0xff; 6], CLIENT_MAC, vlans, ethertype::ARP, &a)
}

/// IPv4 of 1490 bytes to the IPv4-in-IPv4 service (VIP:8443), with `frag`
/// as its flags.
fn big4(frag: u16) -> Vec<u8> {
    let seg = craft::tcp(40001, 8443, 0x18, &[0x5a; 1450]);
    craft::with_l4_checksum(craft::ipv4_full(CLIENT, VIP, proto::TCP, 64, 7, frag, &[], &seg), 20)
}

#[test]
fn a_port_without_a_vlan_drops_tagged_frames_under_their_own_reason() {
    let d = dir("untagged");
    let r = run(&d, appliance(1), &[vec![syn(&[]), syn(&[100]), syn(&[0]), arp(&[100]), arp(&[])], vec![], vec![]]);
    let seen = tshark(&d.join("in0.pcap"), &["vlan.id", "eth.type", "vlan.etype"]);
    assert_eq!(seen, ["|0x0800|", "100|0x8100|0x0800", "0|0x8100|0x0800", "100|0x8100|0x0806", "|0x0806|"], "{seen:?}");

    assert_eq!(r.drops(DropReason::VlanNotServed), 2, "the SYN and the ARP request of VLAN 100");
    // The untagged and the priority-tagged SYN reach the endpoint, untagged.
    let out = tshark(&d.join("out1.pcap"), &["vlan.id", "ip.dst", "tcp.dstport"]);
    assert_eq!(out, ["|20.0.0.1|80", "|20.0.0.1|80"], "{out:?}");
    // Only the untagged ARP request goes to the kernel.
    let kernel = tshark(&d.join("out2.pcap"), &["vlan.id", "arp.dst.proto_ipv4"]);
    assert_eq!(kernel, ["|10.100.0.1"], "{kernel:?}");
}

#[test]
fn a_port_with_a_vlan_serves_it_and_tags_what_it_sends() {
    let d = dir("tagged");
    let mut snap = appliance(1);
    snap.ports = vec![PortInfo { mac: FRONT_MAC, mtu: 1500, vlan: 100 }, PortInfo { mac: BACK_MAC, mtu: 1500, vlan: 200 }];
    // The endpoint of web that the SYN goes to, and its reply, on VLAN 200.
    let reply = craft::with_l4_checksum(craft::ipv4_full(VIP, CLIENT, proto::TCP, 64, 0, v4::DF, &[], &craft::tcp(80, 40000, 0x12, b"")), 20);
    let ep = ep_mac(0, 0, 1);
    let from_ep = craft::ether_with(BACK_MAC, ep, &[200], ethertype::IPV4, &reply);
    // What the kernel sends out of the front port: an ARP reply, untagged.
    let mut arp_reply = arp(&[]);
    arp_reply[..6].copy_from_slice(&CLIENT_MAC);
    arp_reply[6..12].copy_from_slice(&FRONT_MAC);
    arp_reply[14 + 7] = 2;
    let front = vec![
        syn(&[100]),
        syn(&[]),
        syn(&[200]),
        syn(&[7, 100]),
        arp(&[100]),
        arp(&[]),
        craft::ether_with(FRONT_MAC, CLIENT_MAC, &[100], ethertype::IPV4, &big4(v4::DF)),
        craft::ether_with(FRONT_MAC, CLIENT_MAC, &[100], ethertype::IPV4, &big4(0)),
    ];
    let r = run(&d, snap, &[front, vec![from_ep], vec![arp_reply]]);

    // Untagged, another VLAN, stacked tags on the front; nothing else.
    assert_eq!(r.drops(DropReason::VlanNotServed), 4, "{:?}", r.ctr.drops.iter().map(|c| c.get()).collect::<Vec<_>>());
    // Forwarded to the endpoint on the back port's VLAN.
    let out = tshark(&d.join("out1.pcap"), &["vlan.id", "eth.dst", "ip.dst", "ip.ttl"]);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(out[0].starts_with("200|") && out[0].ends_with("|20.0.0.1|63"), "{out:?}");
    // On the front port's VLAN: the ICMP error for the packet too big with
    // DF (quoting it), the reply to the gateway, and the kernel's ARP reply.
    let out = tshark(&d.join("out0.pcap"), &["vlan.id", "eth.dst", "ip.src", "ip.dst", "icmp.type", "icmp.code", "arp.opcode"]);
    assert_eq!(
        out,
        [
            "100|02:cc:00:00:00:01|20.0.0.1,198.51.100.7|198.51.100.7,20.0.0.1|3|4|",
            "100|02:00:00:00:0f:0f|20.0.0.1|198.51.100.7|||",
            "100|02:cc:00:00:00:01|||||2",
        ],
        "{out:?}"
    );
    // The kernel gets the ARP request of VLAN 100, untagged.
    let kernel = tshark(&d.join("out2.pcap"), &["vlan.id", "eth.type", "arp.dst.proto_ipv4"]);
    assert_eq!(kernel, ["|0x0806|10.100.0.1"], "{kernel:?}");
    assert_eq!(r.drops(DropReason::EncapTooBigNoDf), 1);
}

#[test]
fn ipv4_without_df_too_big_for_its_tunnel_is_dropped_under_its_own_reason() {
    let d = dir("nodf");
    let frame = |ip: Vec<u8>| craft::ether_with(FRONT_MAC, CLIENT_MAC, &[], ethertype::IPV4, &ip);
    let small = craft::with_l4_checksum(craft::ipv4_full(CLIENT, VIP, proto::TCP, 64, 8, 0, &[], &craft::tcp(40002, 8443, 0x18, &[1; 100])), 20);
    let r = run(&d, appliance(1), &[vec![frame(big4(v4::DF)), frame(big4(0)), frame(small)], vec![], vec![]]);
    let seen = tshark(&d.join("in0.pcap"), &["ip.flags.df", "ip.len"]);
    assert_eq!(seen, ["1|1490", "0|1490", "0|140"], "{seen:?}");

    assert_eq!(r.drops(DropReason::EncapTooBigNoDf), 1, "the one without DF");
    assert_eq!(r.drops(DropReason::EncapTooBig), 0);
    // The one with DF gets "fragmentation needed"; the small one goes through the tunnel.
    let back = tshark(&d.join("out0.pcap"), &["icmp.type", "icmp.code", "icmp.mtu"]);
    assert_eq!(back, ["3|4|1480"], "{back:?}");
    let tunnelled = tshark(&d.join("out1.pcap"), &["ip.proto", "ip.len"]);
    assert_eq!(tunnelled, ["4,6|160,140"], "{tunnelled:?}");
}

/// The UDP datagram to the `dns` service (VIP:53, layer 2) with a
/// 3,000-byte payload: 3,028 bytes of IPv4, identification `id`.
fn udp3000(id: u16, frag: u16) -> (Vec<u8>, Vec<u8>) {
    let payload: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let udp = craft::udp(5353, 53, &payload);
    let ip = craft::with_l4_checksum(craft::ipv4_full(CLIENT, VIP, proto::UDP, 64, id, frag, &[], &udp), 20);
    (ip, udp)
}

/// The fragments a sender at MTU 1500 makes of `ip` (no options): 1,480
/// bytes of data each, the last what is left.
fn fragments_at_1500(ip: &[u8]) -> Vec<Vec<u8>> {
    let data = &ip[20..];
    let id = u16::from_be_bytes([ip[4], ip[5]]);
    data.chunks(1480)
        .enumerate()
        .map(|(i, chunk)| {
            let more = if (i + 1) * 1480 < data.len() { v4::MF } else { 0 };
            let frag = more | (i * 1480 / 8) as u16;
            craft::ipv4_full(CLIENT, VIP, proto::UDP, 64, id, frag, &[], chunk)
        })
        .collect()
}

/// tshark's view of `path` with IPv4 reassembly on: per frame, the fields.
fn tshark_reassembling(path: &Path, fields: &[&str]) -> Vec<String> {
    let mut cmd = Command::new("tshark");
    cmd.args(["-n", "-o", "ip.defragment:TRUE", "-r"]).arg(path);
    cmd.args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=a", "-E", "aggregator=,"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().expect("tshark is needed for this test (scripts/setup.sh installs it)");
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(str::to_owned).collect()
}

#[test]
fn fragments_pass_as_they_are_and_a_datagram_over_the_mtu_leaves_as_fragments_of_it() {
    let d = dir("fragments");
    let frame = |ip: &[u8]| craft::ether_with(FRONT_MAC, CLIENT_MAC, &[], ethertype::IPV4, ip);
    // As the client sent it (fragments), as a kernel reassembled it (af_packet), and with DF.
    let (sent, _) = udp3000(41, 0);
    let udp = sent[20..].to_vec();
    let (whole, _) = udp3000(42, 0);
    let (df, _) = udp3000(43, v4::DF);
    let mut front: Vec<Vec<u8>> = fragments_at_1500(&sent).iter().map(|f| frame(f)).collect();
    front.push(frame(&whole));
    front.push(frame(&df));
    let r = run(&d, appliance(1), &[front, vec![], vec![]]);
    // tshark gives the fragment offset in 8-byte units.
    let seen = tshark(&d.join("in0.pcap"), &["ip.id", "ip.len", "ip.flags.mf", "ip.frag_offset"]);
    assert_eq!(seen, ["0x0029|1500|1|0", "0x0029|1500|1|185", "0x0029|68|0|370", "0x002a|3028|0|0", "0x002b|3028|0|0"], "{seen:?}");

    // Out of the back port: the client's fragments as they were, then the
    // reassembled datagram as three fragments of at most 1500 bytes; each
    // datagram to one endpoint, and whole again once reassembled.
    let out = tshark(&d.join("out1.pcap"), &["eth.dst", "ip.id", "ip.len", "ip.flags.mf", "ip.frag_offset", "ip.ttl"]);
    assert_eq!(out.len(), 6, "{out:?}");
    let cols: Vec<Vec<&str>> = out.iter().map(|l| l.split('|').collect()).collect();
    let shape: Vec<String> = cols.iter().map(|c| c[1..].join("|")).collect();
    assert_eq!(
        shape,
        [
            "0x0029|1500|1|0|63",
            "0x0029|1500|1|185|63",
            "0x0029|68|0|370|63",
            "0x002a|1500|1|0|63",
            "0x002a|1500|1|185|63",
            "0x002a|68|0|370|63",
        ]
    );
    assert!(cols[..3].iter().all(|c| c[0] == cols[0][0]) && cols[3..].iter().all(|c| c[0] == cols[3][0]), "one endpoint each: {out:?}");
    let whole_again = tshark_reassembling(&d.join("out1.pcap"), &["ip.id", "udp.length", "ip.checksum.status", "udp.checksum.status"]);
    let reassembled: Vec<&String> = whole_again.iter().filter(|l| l.contains("|3008|")).collect();
    assert_eq!(reassembled.len(), 2, "both datagrams reassemble whole: {whole_again:?}");
    for (frames, id) in [(&r.outputs[1][..3], 41u16), (&r.outputs[1][3..], 42)] {
        let mut data = Vec::new();
        for f in frames {
            assert_eq!(u16::from_be_bytes([f[18], f[19]]), id);
            data.extend_from_slice(&f[34..]);
        }
        assert!(data == udp, "datagram {id}: the UDP datagram, byte for byte");
    }
    // The one with DF: "fragmentation needed" with the port's MTU, back to the client.
    let back = tshark(&d.join("out0.pcap"), &["ip.dst", "icmp.type", "icmp.code", "icmp.mtu"]);
    assert_eq!(back, ["198.51.100.7,20.0.0.1|3|4|1500"], "{back:?}");
    assert_eq!(r.ctr.fragmented.get(), 1);
    assert_eq!(r.ctr.fragments.get(), 3);
    assert_eq!(r.ctr.icmp_too_big.get(), 1);
    assert_eq!(r.ctr.total_drops(), 0);
}

#[test]
fn a_datagram_whose_fragments_find_no_buffer_is_dropped_whole_under_its_own_reason() {
    let d = dir("fragbufs");
    let (whole, _) = udp3000(44, 0);
    let r = run_with(&d, appliance(1), &[vec![craft::ether_with(FRONT_MAC, CLIENT_MAC, &[], ethertype::IPV4, &whole)], vec![], vec![]], 1);
    assert!(r.outputs[1].is_empty(), "no fragment of it left");
    assert_eq!(r.drops(DropReason::FragmentNoBuffer), 1);
    assert_eq!(r.ctr.fragmented.get(), 0);
}

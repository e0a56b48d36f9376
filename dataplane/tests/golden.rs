//! The pipeline's golden table: frame in, what it is, expected verdict,
//! expected frame out.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

mod common;

use common::*;
use sluice_dataplane::addr::Addr;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::craft;
use sluice_dataplane::hash::flow_hash;
use sluice_dataplane::io::PacketBuf;
use sluice_dataplane::memio::MemBuf;
use sluice_dataplane::parse::{ethertype, proto, v4, Flow};
use sluice_dataplane::pipeline::{Pipeline, PipelineConfig};
use sluice_dataplane::snapshot::Snapshot;
use sluice_dataplane::verdict::{DropReason, Verdict};

/// A frame to `dst_mac` carrying `ip` (an IP packet).
fn eth(dst_mac: [u8; 6], src_mac: [u8; 6], vlans: &[u16], v6: bool, ip: &[u8]) -> Vec<u8> {
    craft::ether_with(dst_mac, src_mac, vlans, if v6 { ethertype::IPV6 } else { ethertype::IPV4 }, ip)
}

fn tcp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, ttl: u8) -> Vec<u8> {
    craft::with_l4_checksum(craft::ipv4_full(src, dst, proto::TCP, ttl, 0, v4::DF, &[], &craft::tcp(sport, dport, 0x02, b"GET")), 20)
}

struct Case {
    what: &'static str,
    frame: Vec<u8>,
    port: u8,
    verdict: Verdict,
    out: Option<Vec<u8>>,
}

fn cases(snap: &Snapshot) -> Vec<Case> {
    let client_mac = [0x02, 0xcc, 0, 0, 0, 1];
    let syn = tcp4(CLIENT, VIP, 40000, 80, 64);
    let syn_out = tcp4(CLIENT, VIP, 40000, 80, 63);
    let reply = tcp4(VIP, CLIENT, 80, 40000, 64);
    let reply_out = tcp4(VIP, CLIENT, 80, 40000, 63);
    // The endpoints the tables give these flows, recorded: the frames out
    // are checked against them, not against what the table says today.
    // CLIENT:40000 -> VIP:80/TCP goes to web's endpoint 0.
    let web_ep = ep_mac(0, 0, 1);

    // A router on the return path says the reply was too big.
    let router = [203, 0, 113, 1];
    let too_big = craft::icmp4_error(3, 4, &reply[..28]);
    let icmp = craft::ipv4_full(router, VIP, proto::ICMP, 64, 0, 0, &[], &too_big);
    let icmp_out = craft::ipv4_full(router, VIP, proto::ICMP, 63, 0, 0, &[], &too_big);

    let syn6 = craft::with_l4_checksum(craft::ipv6(CLIENT6, VIP6, proto::TCP, &craft::tcp(5000, 443, 2, b"")), 40);
    let mut syn6_inner = syn6.clone();
    syn6_inner[7] = 63;
    let f6 = Flow { src: Addr::v6(CLIENT6), dst: Addr::v6(VIP6), sport: 5000, dport: 443, proto: proto::TCP };
    // CLIENT6:5000 -> VIP6:443/TCP goes to web6's endpoint 1.
    let ep6 = *snap.services[2].endpoint(1).unwrap();
    assert_eq!((ep6.mac, ep6.addr.to_string().as_str()), (ep_mac(2, 1, 1), "fd00::11"), "web6's endpoint 1");
    let label = (flow_hash(&f6) as u32) & 0xfffff;
    let mut outer6 = craft::ipv6(APPLIANCE6, ep6.addr.v6_bytes(), proto::IPV6, &syn6_inner);
    outer6[1] = (label >> 16) as u8;
    outer6[2..4].copy_from_slice(&((label & 0xffff) as u16).to_be_bytes());

    let mut bad_csum = eth(FRONT_MAC, client_mac, &[], false, &syn);
    bad_csum[14 + 10] ^= 0xff;

    let arp = craft::ether_with([0xff; 6], client_mac, &[], ethertype::ARP, &[0u8; 28]);

    // 1490 bytes of IPv4 do not fit a 1500-byte port with 20 more in front.
    let router_mac = [0x02, 0xaa, 0, 0, 0, 1];
    let seg = craft::tcp(40001, 8443, 0x18, &[0x5a; 1450]);
    let big4 = craft::with_l4_checksum(craft::ipv4_full(CLIENT, VIP, proto::TCP, 64, 7, v4::DF, &[], &seg), 20);
    let big4_no_df = craft::with_l4_checksum(craft::ipv4_full(CLIENT, VIP, proto::TCP, 64, 7, 0, &[], &seg), 20);
    let mut icmp4 = vec![3, 4, 0, 0, 0, 0, 0x05, 0xc8]; // next-hop MTU 1480
    icmp4.extend_from_slice(&big4[..576 - 28]);
    let c = sluice_dataplane::checksum::checksum(&icmp4);
    icmp4[2..4].copy_from_slice(&c.to_be_bytes());
    let frag_needed = craft::ipv4_full(VIP, CLIENT, proto::ICMP, 64, 0, v4::DF, &[], &icmp4);
    let big6 = craft::with_l4_checksum(craft::ipv6(CLIENT6, VIP6, proto::TCP, &craft::tcp(5000, 443, 0x18, &[0xa5; 1420])), 40);
    let mut icmp6 = vec![2, 0, 0, 0, 0, 0, 0x05, 0xb4]; // MTU 1460
    icmp6.extend_from_slice(&big6[..1280 - 48]);
    let too_big6 = craft::with_l4_checksum(craft::ipv6(VIP6, CLIENT6, proto::ICMPV6, &icmp6), 40);

    vec![
        Case {
            what: "TCP SYN to VIP:80 goes NAT-less to the endpoint the table picks",
            frame: eth(FRONT_MAC, client_mac, &[], false, &syn),
            port: 0,
            verdict: Verdict::Forward(1),
            out: Some(eth(web_ep, BACK_MAC, &[], false, &syn_out)),
        },
        Case {
            what: "VLAN-tagged VIP traffic on a port that serves no VLAN",
            frame: eth(FRONT_MAC, client_mac, &[100], false, &syn),
            port: 0,
            verdict: Verdict::Drop(DropReason::VlanNotServed),
            out: None,
        },
        Case {
            what: "priority-tagged (VLAN 0) VIP traffic leaves untagged",
            frame: eth(FRONT_MAC, client_mac, &[0], false, &syn),
            port: 0,
            verdict: Verdict::Forward(1),
            out: Some(eth(web_ep, BACK_MAC, &[], false, &syn_out)),
        },
        Case {
            what: "VIP port without a route",
            frame: eth(FRONT_MAC, client_mac, &[], false, &tcp4(CLIENT, VIP, 40000, 81, 64)),
            port: 0,
            verdict: Verdict::Drop(DropReason::NoRoute),
            out: None,
        },
        Case {
            what: "route to a service without endpoints",
            frame: eth(FRONT_MAC, client_mac, &[], false, &tcp4(CLIENT, VIP, 40000, 9, 64)),
            port: 0,
            verdict: Verdict::Drop(DropReason::NoEndpoint),
            out: None,
        },
        Case {
            what: "TTL 1 cannot be forwarded",
            frame: eth(FRONT_MAC, client_mac, &[], false, &tcp4(CLIENT, VIP, 40000, 80, 1)),
            port: 0,
            verdict: Verdict::Drop(DropReason::TtlExpired),
            out: None,
        },
        Case {
            what: "bad IPv4 header checksum",
            frame: bad_csum,
            port: 0,
            verdict: Verdict::Drop(DropReason::Ipv4BadChecksum),
            out: None,
        },
        Case {
            what: "ARP broadcast goes to the kernel",
            frame: arp,
            port: 0,
            verdict: Verdict::Exception,
            out: None,
        },
        Case {
            what: "traffic for the appliance's own address goes to the kernel",
            frame: eth(FRONT_MAC, client_mac, &[], false, &tcp4(CLIENT, [198, 51, 100, 1], 40000, 179, 64)),
            port: 0,
            verdict: Verdict::Exception,
            out: None,
        },
        Case {
            what: "unicast to another MAC (promiscuous port)",
            frame: eth([0x02, 9, 9, 9, 9, 9], client_mac, &[], false, &syn),
            port: 0,
            verdict: Verdict::Drop(DropReason::NotOurMac),
            out: None,
        },
        Case {
            what: "return traffic from a VIP goes to the gateway",
            frame: eth(BACK_MAC, web_ep, &[], false, &reply),
            port: 1,
            verdict: Verdict::Forward(0),
            out: Some(eth(GW_MAC, FRONT_MAC, &[], false, &reply_out)),
        },
        Case {
            what: "an endpoint's answer from the VIP to the appliance's own address (a check of the VIP) goes to the kernel",
            frame: eth(BACK_MAC, web_ep, &[], false, &tcp4(VIP, APPLIANCE4, 80, 40000, 64)),
            port: 1,
            verdict: Verdict::Exception,
            out: Some(eth(BACK_MAC, web_ep, &[], false, &tcp4(VIP, APPLIANCE4, 80, 40000, 64))),
        },
        Case {
            what: "and from a MAC that is no endpoint's, it is dropped",
            frame: eth(BACK_MAC, [0x02, 0x66, 0, 0, 0, 6], &[], false, &tcp4(VIP, APPLIANCE4, 80, 40000, 64)),
            port: 1,
            verdict: Verdict::Drop(DropReason::ReturnNotFromEndpoint),
            out: None,
        },
        Case {
            what: "an IPv6 one goes to the kernel without an IPv6 gateway",
            frame: eth(BACK_MAC, ep6.mac, &[], true, &craft::ipv6(VIP6, APPLIANCE6, proto::TCP, &craft::tcp(443, 5000, 0x12, b""))),
            port: 1,
            verdict: Verdict::Exception,
            out: None,
        },
        Case {
            what: "IPv6 return traffic without an IPv6 gateway",
            frame: eth(BACK_MAC, ep6.mac, &[], true, &craft::ipv6(VIP6, CLIENT6, proto::TCP, &craft::tcp(443, 5000, 0x12, b""))),
            port: 1,
            verdict: Verdict::Drop(DropReason::NoGateway),
            out: None,
        },
        Case {
            what: "fragmentation-needed about a reply reaches the endpoint that owns the flow",
            frame: eth(FRONT_MAC, [0x02, 0xaa, 0, 0, 0, 1], &[], false, &icmp),
            port: 0,
            verdict: Verdict::Forward(1),
            out: Some(eth(web_ep, BACK_MAC, &[], false, &icmp_out)),
        },
        Case {
            what: "IPv6 VIP traffic is tunnelled IPv6-in-IPv6 to its endpoint",
            frame: eth(FRONT_MAC, client_mac, &[], true, &syn6),
            port: 0,
            verdict: Verdict::Forward(1),
            out: Some(eth(ep6.mac, BACK_MAC, &[], true, &outer6)),
        },
        Case {
            what: "return traffic from a MAC that is no endpoint's",
            frame: eth(BACK_MAC, [0x02, 0x66, 0, 0, 0, 6], &[], false, &reply),
            port: 1,
            verdict: Verdict::Drop(DropReason::ReturnNotFromEndpoint),
            out: None,
        },
        Case {
            what: "return traffic from an endpoint's MAC on another port than the endpoint's",
            frame: eth(FRONT_MAC, web_ep, &[], false, &reply),
            port: 0,
            verdict: Verdict::Drop(DropReason::ReturnNotFromEndpoint),
            out: None,
        },
        Case {
            what: "return traffic from an endpoint of a service its source VIP does not route to",
            frame: eth(BACK_MAC, ep_mac(2, 0, 1), &[], false, &reply),
            port: 1,
            verdict: Verdict::Drop(DropReason::ReturnNotFromEndpoint),
            out: None,
        },
        Case {
            what: "return traffic from an endpoint of another service of the same VIP",
            frame: eth(BACK_MAC, ep_mac(1, 3, 1), &[], false, &reply),
            port: 1,
            verdict: Verdict::Forward(0),
            out: Some(eth(GW_MAC, FRONT_MAC, &[], false, &reply_out)),
        },
        Case {
            what: "IPv6 to the IPv4-mapped form of a VIP is dropped, not balanced as IPv4",
            frame: eth(FRONT_MAC, client_mac, &[], true, &craft::with_l4_checksum(craft::ipv6(CLIENT6, mapped(VIP), proto::TCP, &craft::tcp(5000, 80, 2, b"")), 40)),
            port: 0,
            verdict: Verdict::Drop(DropReason::Ipv6MappedAddress),
            out: None,
        },
        Case {
            what: "IPv6 from an IPv4-mapped source is dropped",
            frame: eth(FRONT_MAC, client_mac, &[], true, &craft::with_l4_checksum(craft::ipv6(mapped(CLIENT), VIP6, proto::TCP, &craft::tcp(5000, 443, 2, b"")), 40)),
            port: 0,
            verdict: Verdict::Drop(DropReason::Ipv6MappedAddress),
            out: None,
        },
        Case {
            what: "IPv4 with DF too big for its IPv4-in-IPv4 tunnel: fragmentation needed back to the client",
            frame: eth(FRONT_MAC, router_mac, &[], false, &big4),
            port: 0,
            verdict: Verdict::Forward(0),
            out: Some(eth(router_mac, FRONT_MAC, &[], false, &frag_needed)),
        },
        Case {
            what: "IPv4 without DF too big for its tunnel (we do not fragment)",
            frame: eth(FRONT_MAC, router_mac, &[], false, &big4_no_df),
            port: 0,
            verdict: Verdict::Drop(DropReason::EncapTooBigNoDf),
            out: None,
        },
        Case {
            what: "IPv6 too big for its IPv6-in-IPv6 tunnel: packet too big back to the client",
            frame: eth(FRONT_MAC, router_mac, &[], true, &big6),
            port: 0,
            verdict: Verdict::Forward(0),
            out: Some(eth(router_mac, FRONT_MAC, &[], true, &too_big6)),
        },
    ]
}

/// `::ffff:a.b.c.d`.
fn mapped(a: [u8; 4]) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[10] = 0xff;
    m[11] = 0xff;
    m[12..].copy_from_slice(&a);
    m
}

#[test]
fn golden_table() {
    let snap = appliance(1);
    let ctr = WorkerCounters::new(8, 1000);
    let mut pl = Pipeline::new(&PipelineConfig::default(), 1);
    for c in cases(&snap) {
        let mut buf = MemBuf::new(&c.frame);
        let v = pl.process(&snap, c.port, &mut buf, 1, &ctr);
        assert_eq!(v, c.verdict, "{}", c.what);
        if let Some(out) = &c.out {
            assert_eq!(buf.data(), &out[..], "{}: frame out", c.what);
        }
    }
    assert_eq!(ctr.services[0].packets.get(), 3, "web counted the SYNs and the ICMP error");
}

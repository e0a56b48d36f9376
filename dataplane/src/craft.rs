//! Builds frames byte by byte, with correct lengths and checksums: for
//! tests, benchmarks, fuzz seeds and traffic generators. Not used on the
//! fast path.

use crate::checksum;
use crate::parse::{ethertype, proto, v4};

/// Source MAC of crafted frames.
pub const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// Destination MAC of crafted frames.
pub const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// An Ethernet frame with VLAN tags (outer first; with two tags the outer
/// is an 802.1ad service tag) around `payload`.
pub fn ether(vlans: &[u16], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    ether_with(DST_MAC, SRC_MAC, vlans, ethertype, payload)
}

/// An Ethernet frame with explicit addresses.
pub fn ether_with(dst: [u8; 6], src: [u8; 6], vlans: &[u16], et: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + 4 * vlans.len() + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    for (i, v) in vlans.iter().enumerate() {
        let tpid = if vlans.len() > 1 && i == 0 { ethertype::QINQ } else { ethertype::VLAN };
        f.extend_from_slice(&tpid.to_be_bytes());
        f.extend_from_slice(&v.to_be_bytes());
    }
    f.extend_from_slice(&et.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An IPv4 packet (TTL 64, id 0, no fragmentation) with a valid checksum.
pub fn ipv4(src: [u8; 4], dst: [u8; 4], protocol: u8, payload: &[u8]) -> Vec<u8> {
    ipv4_full(src, dst, protocol, 64, 0, 0, &[], payload)
}

/// An IPv4 packet with every header field chosen. `frag` holds the flags
/// and the offset in 8-byte units; `options` is padded to 4 bytes.
#[allow(clippy::too_many_arguments, clippy::cast_possible_truncation)]
pub fn ipv4_full(
    src: [u8; 4],
    dst: [u8; 4],
    protocol: u8,
    ttl: u8,
    id: u16,
    frag: u16,
    options: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let mut opts = options.to_vec();
    while opts.len() % 4 != 0 {
        opts.push(0);
    }
    let ihl = 20 + opts.len();
    let total = ihl + payload.len();
    let mut h = vec![0u8; ihl];
    h[0] = 0x40 | (ihl / 4) as u8;
    h[v4::TOTAL_LEN..v4::TOTAL_LEN + 2].copy_from_slice(&(total as u16).to_be_bytes());
    h[v4::ID..v4::ID + 2].copy_from_slice(&id.to_be_bytes());
    h[v4::FRAG..v4::FRAG + 2].copy_from_slice(&frag.to_be_bytes());
    h[v4::TTL] = ttl;
    h[v4::PROTO] = protocol;
    h[v4::SRC..v4::SRC + 4].copy_from_slice(&src);
    h[v4::DST..v4::DST + 4].copy_from_slice(&dst);
    h[20..].copy_from_slice(&opts);
    let c = checksum::checksum(&h);
    h[v4::CHECK..v4::CHECK + 2].copy_from_slice(&c.to_be_bytes());
    h.extend_from_slice(payload);
    h
}

/// An IPv6 packet (hop limit 64) with `next` as the first next-header.
#[allow(clippy::cast_possible_truncation)]
pub fn ipv6(src: [u8; 16], dst: [u8; 16], next: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 40];
    h[0] = 0x60;
    h[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
    h[6] = next;
    h[7] = 64;
    h[8..24].copy_from_slice(&src);
    h[24..40].copy_from_slice(&dst);
    h.extend_from_slice(payload);
    h
}

/// An IPv6 fragment header: `offset` in 8-byte units.
pub fn ipv6_fragment_header(next: u8, offset: u16, more: bool, id: u32) -> [u8; 8] {
    let f = (offset << 3) | u16::from(more);
    let mut h = [0u8; 8];
    h[0] = next;
    h[2..4].copy_from_slice(&f.to_be_bytes());
    h[4..8].copy_from_slice(&id.to_be_bytes());
    h
}

/// A TCP segment (20-byte header, checksum left zero: see [`with_l4_checksum`]).
pub fn tcp(sport: u16, dport: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&1u32.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&65535u16.to_be_bytes());
    t.extend_from_slice(payload);
    t
}

/// A UDP datagram (checksum left zero).
#[allow(clippy::cast_possible_truncation)]
pub fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0u8; 8];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(payload);
    u
}

/// An SCTP packet: common header with verification tag 1, then `chunks`.
pub fn sctp(sport: u16, dport: u16, chunks: &[u8]) -> Vec<u8> {
    let mut s = vec![0u8; 12];
    s[0..2].copy_from_slice(&sport.to_be_bytes());
    s[2..4].copy_from_slice(&dport.to_be_bytes());
    s[4..8].copy_from_slice(&1u32.to_be_bytes());
    s.extend_from_slice(chunks);
    s
}

/// An ICMPv4 error of `typ`/`code` quoting `original` (an IP packet,
/// usually cut after 8 bytes of transport header), with its checksum.
pub fn icmp4_error(typ: u8, code: u8, original: &[u8]) -> Vec<u8> {
    let mut m = vec![typ, code, 0, 0, 0, 0, 0, 0];
    if typ == 3 && code == 4 {
        m[6..8].copy_from_slice(&1400u16.to_be_bytes()); // next-hop MTU
    }
    m.extend_from_slice(original);
    let c = checksum::checksum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

/// An ICMPv6 error quoting `original` (checksum left zero: it covers a
/// pseudo-header).
pub fn icmp6_error(typ: u8, code: u8, original: &[u8]) -> Vec<u8> {
    let mut m = vec![typ, code, 0, 0, 0, 0, 0, 0];
    if typ == 2 {
        m[4..8].copy_from_slice(&1280u32.to_be_bytes());
    }
    m.extend_from_slice(original);
    m
}

/// Fills in the TCP/UDP/ICMPv6 checksum of the transport header that
/// starts `l4` bytes into the IP packet `ip`.
#[allow(clippy::cast_possible_truncation)]
pub fn with_l4_checksum(mut ip: Vec<u8>, l4: usize) -> Vec<u8> {
    let v6 = ip[0] >> 4 == 6;
    let (protocol, mut pseudo) = if v6 {
        let mut p = ip[8..40].to_vec();
        p.extend_from_slice(&((ip.len() - l4) as u32).to_be_bytes());
        p.extend_from_slice(&[0, 0, 0, ip[6]]);
        (ip[6], p)
    } else {
        let mut p = ip[12..20].to_vec();
        p.extend_from_slice(&[0, ip[9]]);
        p.extend_from_slice(&((ip.len() - l4) as u16).to_be_bytes());
        (ip[9], p)
    };
    let off = match protocol {
        proto::TCP => 16,
        proto::UDP => 6,
        proto::ICMPV6 => 2,
        _ => return ip,
    };
    if ip.len() < l4 + off + 2 {
        return ip; // too short to carry a checksum: a deliberately broken packet
    }
    ip[l4 + off..l4 + off + 2].copy_from_slice(&[0, 0]);
    pseudo.extend_from_slice(&ip[l4..]);
    let mut c = checksum::checksum(&pseudo);
    if c == 0 && protocol == proto::UDP {
        c = 0xffff;
    }
    ip[l4 + off..l4 + off + 2].copy_from_slice(&c.to_be_bytes());
    ip
}

/// Ethernet + IPv4 + `l4` (transport header and payload), checksums filled.
pub fn frame_v4(vlans: &[u16], src: [u8; 4], dst: [u8; 4], protocol: u8, l4: &[u8]) -> Vec<u8> {
    ether(vlans, ethertype::IPV4, &with_l4_checksum(ipv4(src, dst, protocol, l4), 20))
}

/// Ethernet + IPv6 + `payload` (extension headers and transport).
pub fn frame_v6(vlans: &[u16], src: [u8; 16], dst: [u8; 16], next: u8, payload: &[u8]) -> Vec<u8> {
    let ip = ipv6(src, dst, next, payload);
    let ip = if matches!(next, proto::TCP | proto::UDP | proto::ICMPV6) { with_l4_checksum(ip, 40) } else { ip };
    ether(vlans, ethertype::IPV6, &ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crafted_checksums_verify() {
        let ip = with_l4_checksum(ipv4([1, 2, 3, 4], [5, 6, 7, 8], proto::UDP, &udp(1, 2, b"hello")), 20);
        assert_eq!(checksum::sum(&ip[..20]), 0xffff);
        let mut pseudo = ip[12..20].to_vec();
        pseudo.extend_from_slice(&[0, proto::UDP, 0, 13]);
        pseudo.extend_from_slice(&ip[20..]);
        assert_eq!(checksum::sum(&pseudo), 0xffff);
    }
}

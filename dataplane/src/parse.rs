//! Packet parsing: Ethernet, 802.1Q/802.1ad VLAN tags, IPv4 (options,
//! fragments), IPv6 (extension headers, fragment header), TCP, UDP, SCTP,
//! and ICMP/ICMPv6 errors with the packet they embed.
//!
//! One pass over the headers yields a [`Parsed`]: offsets and the fields the
//! pipeline needs. Untrusted input goes through bounds checks here once;
//! malformed frames return a [`DropReason`], never panic.

use crate::addr::Addr;
use crate::checksum;
use crate::verdict::DropReason;

/// Ethertypes.
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
    /// ARP.
    pub const ARP: u16 = 0x0806;
    /// 802.1Q VLAN tag.
    pub const VLAN: u16 = 0x8100;
    /// 802.1ad service tag (QinQ).
    pub const QINQ: u16 = 0x88a8;
    /// Pre-standard QinQ tag.
    pub const QINQ_OLD: u16 = 0x9100;
}

/// IP protocol numbers.
pub mod proto {
    /// IPv6 hop-by-hop options.
    pub const HOPOPT: u8 = 0;
    /// ICMP.
    pub const ICMP: u8 = 1;
    /// IPv4 in IP.
    pub const IPIP: u8 = 4;
    /// TCP.
    pub const TCP: u8 = 6;
    /// UDP.
    pub const UDP: u8 = 17;
    /// IPv6 in IP.
    pub const IPV6: u8 = 41;
    /// IPv6 routing header.
    pub const ROUTING: u8 = 43;
    /// IPv6 fragment header.
    pub const FRAGMENT: u8 = 44;
    /// IPsec ESP.
    pub const ESP: u8 = 50;
    /// IPsec AH.
    pub const AH: u8 = 51;
    /// ICMPv6.
    pub const ICMPV6: u8 = 58;
    /// IPv6 no next header.
    pub const NONE: u8 = 59;
    /// IPv6 destination options.
    pub const DSTOPTS: u8 = 60;
    /// SCTP.
    pub const SCTP: u8 = 132;
    /// IPv6 mobility header.
    pub const MOBILITY: u8 = 135;
    /// Host identity protocol.
    pub const HIP: u8 = 139;
    /// Shim6.
    pub const SHIM6: u8 = 140;
}

/// Ethernet header length.
pub const ETH_LEN: usize = 14;
const ETH_TYPE: usize = 12;
const VLAN_LEN: usize = 4;
/// Most VLAN tags accepted.
pub const MAX_VLANS: usize = 2;

/// IPv4 header field offsets.
pub mod v4 {
    /// Minimum header length.
    pub const MIN_LEN: usize = 20;
    /// Total length.
    pub const TOTAL_LEN: usize = 2;
    /// Identification.
    pub const ID: usize = 4;
    /// Flags and fragment offset.
    pub const FRAG: usize = 6;
    /// Time to live.
    pub const TTL: usize = 8;
    /// Protocol.
    pub const PROTO: usize = 9;
    /// Header checksum.
    pub const CHECK: usize = 10;
    /// Source address.
    pub const SRC: usize = 12;
    /// Destination address.
    pub const DST: usize = 16;
    /// More-fragments flag.
    pub const MF: u16 = 0x2000;
    /// Don't-fragment flag.
    pub const DF: u16 = 0x4000;
    /// Fragment offset mask.
    pub const OFFSET_MASK: u16 = 0x1fff;
}

/// IPv6 header field offsets.
pub mod v6 {
    /// Fixed header length.
    pub const LEN: usize = 40;
    /// Payload length.
    pub const PAYLOAD_LEN: usize = 4;
    /// Next header.
    pub const NEXT: usize = 6;
    /// Hop limit.
    pub const HOP_LIMIT: usize = 7;
    /// Source address.
    pub const SRC: usize = 8;
    /// Destination address.
    pub const DST: usize = 24;
    /// Most extension headers walked.
    pub const MAX_EXT: usize = 8;
}

/// Minimum L4 header lengths.
const TCP_MIN: usize = 20;
const UDP_LEN: usize = 8;
const SCTP_MIN: usize = 12;
const ICMP_MIN: usize = 8;

/// Whether and which IP fragment a packet is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Fragment {
    /// A whole datagram.
    #[default]
    No,
    /// The first fragment (offset 0, more to come): carries the L4 header.
    First,
    /// A later fragment: no L4 header.
    Later,
}

/// The 5-tuple that identifies a flow. Ports are zero when the protocol
/// has none or the packet does not carry them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, bytemuck::Zeroable)]
pub struct Flow {
    /// Source address.
    pub src: Addr,
    /// Destination address.
    pub dst: Addr,
    /// Source port.
    pub sport: u16,
    /// Destination port.
    pub dport: u16,
    /// IP protocol of the transport header.
    pub proto: u8,
}

impl Flow {
    /// The reverse direction.
    pub fn reversed(&self) -> Flow {
        Flow { src: self.dst, dst: self.src, sport: self.dport, dport: self.sport, proto: self.proto }
    }
}

/// Everything the pipeline needs from an IP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Parsed {
    /// Bytes of Ethernet header and VLAN tags (= offset of the IP header).
    pub l3: u16,
    /// Offset of the transport header (after IPv4 options or IPv6 extension
    /// headers); for a later fragment, of the fragment's payload.
    pub l4: u16,
    /// End of the IP datagram in the frame (Ethernet padding follows).
    pub ip_end: u16,
    /// VLAN tags seen.
    pub vlans: u8,
    /// Their VLAN ids, outer first.
    pub vlan_ids: [u16; MAX_VLANS],
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// TTL or hop limit.
    pub ttl: u8,
    /// Fragment kind.
    pub frag: Fragment,
    /// Fragment identification (IPv4 16 bits, IPv6 32 bits).
    pub frag_id: u32,
    /// The outer 5-tuple.
    pub flow: Flow,
    /// The transport header carried ports (TCP, UDP, SCTP; not a later fragment).
    pub has_ports: bool,
    /// An ICMP or ICMPv6 error about another packet.
    pub icmp_error: bool,
    /// For an ICMP error: the 5-tuple of the packet it is about, as it
    /// travelled (ports zero if it had none).
    pub inner: Flow,
    /// The embedded packet's ports were there (TCP, UDP, SCTP, not a later fragment).
    pub inner_ports: bool,
}

/// A parsed frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// IPv4 or IPv6.
    Ip(Parsed),
    /// Anything else (ARP, LLDP, ...): its ethertype, after VLAN tags.
    Other {
        /// The ethertype.
        ethertype: u16,
        /// Bytes of Ethernet header and VLAN tags.
        l3: u16,
    },
}

#[inline(always)]
fn be16(b: &[u8], off: usize) -> u16 {
    u16::from_be_bytes([b[off], b[off + 1]])
}

#[inline(always)]
fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline(always)]
fn addr4(b: &[u8], off: usize) -> Addr {
    Addr::v4([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline(always)]
fn addr6(b: &[u8], off: usize) -> Addr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + 16]);
    Addr::v6(a)
}

/// Offsets in a frame fit in 16 bits: frames are at most 64 KiB.
#[inline(always)]
#[allow(clippy::cast_possible_truncation)]
fn off16(off: usize) -> u16 {
    off as u16
}

/// What [`parse_into`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// IPv4 or IPv6: the [`Parsed`] is filled in.
    Ip,
    /// Anything else: its ethertype (after VLAN tags) and header length.
    Other {
        /// The ethertype.
        ethertype: u16,
        /// Bytes of Ethernet header and VLAN tags.
        l3: u16,
    },
}

/// Parses an Ethernet frame (a convenience over [`parse_into`]).
pub fn parse(frame: &[u8]) -> Result<Frame, DropReason> {
    let mut p = Parsed::default();
    Ok(match parse_into(frame, &mut p)? {
        Kind::Ip => Frame::Ip(p),
        Kind::Other { ethertype, l3 } => Frame::Other { ethertype, l3 },
    })
}

/// The common frame, checked at constant offsets: untagged IPv4 without
/// options, not a fragment, TCP or UDP with a well-formed header. Returns
/// false (leaving the general parser to decide, and to name any error)
/// for everything else.
#[inline(always)]
fn parse_common_v4(frame: &[u8], p: &mut Parsed) -> bool {
    const L3: usize = ETH_LEN;
    const L4: usize = ETH_LEN + v4::MIN_LEN;
    let Some(f) = frame.first_chunk::<{ L4 + UDP_LEN }>() else { return false };
    if f[12] != 0x08 || f[13] != 0x00 || f[L3] != 0x45 {
        return false;
    }
    let total = usize::from(u16::from_be_bytes([f[L3 + 2], f[L3 + 3]]));
    if L3 + total > frame.len() || f[L3 + v4::FRAG] & 0x3f != 0 || f[L3 + v4::FRAG + 1] != 0 {
        return false;
    }
    let Some(h) = f[L3..].first_chunk::<{ v4::MIN_LEN }>() else { return false };
    if !checksum::ipv4_header_ok(h) {
        return false;
    }
    let seg = total.wrapping_sub(v4::MIN_LEN);
    match f[L3 + v4::PROTO] {
        proto::TCP => {
            let doff = match frame.get(L4 + 12) {
                Some(b) => usize::from(b >> 4) * 4,
                None => return false,
            };
            if total < v4::MIN_LEN + TCP_MIN || doff < TCP_MIN || doff > seg {
                return false;
            }
        }
        proto::UDP => {
            let ulen = usize::from(u16::from_be_bytes([f[L4 + 4], f[L4 + 5]]));
            if total < v4::MIN_LEN + UDP_LEN || ulen < UDP_LEN || ulen > seg {
                return false;
            }
        }
        _ => return false,
    }
    p.l3 = off16(L3);
    p.l4 = off16(L4);
    p.ip_end = off16(L3 + total);
    p.vlans = 0;
    p.v6 = false;
    p.ttl = h[v4::TTL];
    p.frag = Fragment::No;
    p.frag_id = 0;
    p.flow = Flow {
        src: Addr::v4([h[12], h[13], h[14], h[15]]),
        dst: Addr::v4([h[16], h[17], h[18], h[19]]),
        sport: u16::from_be_bytes([f[L4], f[L4 + 1]]),
        dport: u16::from_be_bytes([f[L4 + 2], f[L4 + 3]]),
        proto: h[v4::PROTO],
    };
    p.has_ports = true;
    p.icmp_error = false;
    p.inner_ports = false;
    true
}

/// Parses an Ethernet frame into `p`, in place (the fast path's entry:
/// no copy of the parsed headers). `p` is meaningful only for [`Kind::Ip`].
#[inline]
pub fn parse_into(frame: &[u8], p: &mut Parsed) -> Result<Kind, DropReason> {
    if parse_common_v4(frame, p) {
        return Ok(Kind::Ip);
    }
    let Some(eth) = frame.first_chunk::<ETH_LEN>() else {
        return Err(DropReason::EthTruncated);
    };
    if frame.len() > usize::from(u16::MAX) {
        return Err(DropReason::FrameTooLong);
    }
    let mut type_off = ETH_TYPE;
    let mut et = u16::from_be_bytes([eth[ETH_TYPE], eth[ETH_TYPE + 1]]);
    let mut vlans = 0u8;
    let mut vlan_ids = [0u16; MAX_VLANS];
    while matches!(et, ethertype::VLAN | ethertype::QINQ | ethertype::QINQ_OLD) {
        if usize::from(vlans) == MAX_VLANS {
            return Err(DropReason::VlanTooDeep);
        }
        if frame.len() < type_off + 2 + VLAN_LEN {
            return Err(DropReason::EthTruncated);
        }
        vlan_ids[usize::from(vlans)] = be16(frame, type_off + 2) & 0x0fff;
        type_off += VLAN_LEN;
        et = be16(frame, type_off);
        vlans += 1;
    }
    let l3 = type_off + 2;
    p.vlans = vlans;
    p.vlan_ids = vlan_ids;
    match et {
        ethertype::IPV4 => parse_ipv4(frame, l3, p)?,
        ethertype::IPV6 => parse_ipv6(frame, l3, p)?,
        _ => return Ok(Kind::Other { ethertype: et, l3: off16(l3) }),
    }
    Ok(Kind::Ip)
}

/// Parses an IP packet that starts at `l3` in `buf` (a raw-IP capture, or
/// the frame after its Ethernet header). The version nibble decides.
pub fn parse_ip(buf: &[u8], l3: usize) -> Result<Parsed, DropReason> {
    let mut p = Parsed::default();
    match buf.get(l3).map(|b| b >> 4) {
        Some(6) => parse_ipv6(buf, l3, &mut p)?,
        Some(4) => parse_ipv4(buf, l3, &mut p)?,
        Some(_) => return Err(DropReason::Ipv4BadVersion),
        None => return Err(DropReason::Ipv4Truncated),
    }
    Ok(p)
}

#[inline]
fn parse_ipv4(frame: &[u8], l3: usize, p: &mut Parsed) -> Result<(), DropReason> {
    let rest = frame.get(l3..).unwrap_or_default();
    let Some(h) = rest.first_chunk::<{ v4::MIN_LEN }>() else {
        return Err(DropReason::Ipv4Truncated);
    };
    let vihl = h[0];
    if vihl >> 4 != 4 {
        return Err(DropReason::Ipv4BadVersion);
    }
    let ihl = usize::from(vihl & 0x0f) * 4;
    if ihl < v4::MIN_LEN {
        return Err(DropReason::Ipv4BadHeaderLength);
    }
    if ihl > rest.len() {
        return Err(DropReason::Ipv4Truncated);
    }
    let total = usize::from(u16::from_be_bytes([h[v4::TOTAL_LEN], h[v4::TOTAL_LEN + 1]]));
    if total < ihl || total > rest.len() {
        return Err(DropReason::Ipv4BadTotalLength);
    }
    let ok = if ihl == v4::MIN_LEN { checksum::ipv4_header_ok(h) } else { checksum::sum(&rest[..ihl]) == 0xffff };
    if !ok {
        return Err(DropReason::Ipv4BadChecksum);
    }
    let fragf = u16::from_be_bytes([h[v4::FRAG], h[v4::FRAG + 1]]);
    p.frag = if fragf & v4::OFFSET_MASK != 0 {
        Fragment::Later
    } else if fragf & v4::MF != 0 {
        Fragment::First
    } else {
        Fragment::No
    };
    p.l3 = off16(l3);
    p.l4 = off16(l3 + ihl);
    p.ip_end = off16(l3 + total);
    p.v6 = false;
    p.ttl = h[v4::TTL];
    p.frag_id = u32::from(u16::from_be_bytes([h[v4::ID], h[v4::ID + 1]]));
    p.flow.src = Addr::v4([h[12], h[13], h[14], h[15]]);
    p.flow.dst = Addr::v4([h[16], h[17], h[18], h[19]]);
    p.flow.proto = h[v4::PROTO];
    parse_l4(&frame[..l3 + total], p)
}

/// Walks IPv6 extension headers from `off` with first next-header `next`,
/// within `buf`. Returns (transport protocol, its offset, fragment kind, id).
/// A Hop-by-Hop Options header anywhere but first is an error (RFC 8200
/// 4.1: it may only follow the IPv6 header).
#[inline]
fn walk_ipv6_ext(buf: &[u8], mut off: usize, mut next: u8) -> Result<(u8, usize, Fragment, u32), DropReason> {
    let mut frag = Fragment::No;
    let mut frag_id = 0u32;
    for i in 0..=v6::MAX_EXT {
        let len = match next {
            proto::HOPOPT if i > 0 => return Err(DropReason::Ipv6HopByHopNotFirst),
            proto::HOPOPT | proto::ROUTING | proto::DSTOPTS | proto::MOBILITY | proto::HIP | proto::SHIM6 => {
                if off + 8 > buf.len() {
                    return Err(DropReason::Ipv6BadExtensionHeader);
                }
                (usize::from(buf[off + 1]) + 1) * 8
            }
            proto::AH => {
                if off + 8 > buf.len() {
                    return Err(DropReason::Ipv6BadExtensionHeader);
                }
                (usize::from(buf[off + 1]) + 2) * 4
            }
            proto::FRAGMENT => {
                if off + 8 > buf.len() {
                    return Err(DropReason::Ipv6BadExtensionHeader);
                }
                let f = be16(buf, off + 2);
                frag_id = be32(buf, off + 4);
                frag = if f >> 3 != 0 {
                    Fragment::Later
                } else if f & 1 != 0 {
                    Fragment::First
                } else {
                    Fragment::No
                };
                next = buf[off];
                off += 8;
                if frag == Fragment::Later {
                    // What follows is the middle of the datagram: no headers.
                    return Ok((next, off, frag, frag_id));
                }
                continue;
            }
            _ => return Ok((next, off, frag, frag_id)),
        };
        if off + len > buf.len() {
            return Err(DropReason::Ipv6BadExtensionHeader);
        }
        next = buf[off];
        off += len;
    }
    Err(DropReason::Ipv6BadExtensionHeader)
}

#[inline]
fn parse_ipv6(frame: &[u8], l3: usize, p: &mut Parsed) -> Result<(), DropReason> {
    let avail = frame.len().saturating_sub(l3);
    if avail < v6::LEN {
        return Err(DropReason::Ipv6Truncated);
    }
    if frame[l3] >> 4 != 6 {
        return Err(DropReason::Ipv6BadVersion);
    }
    let plen = usize::from(be16(frame, l3 + v6::PAYLOAD_LEN));
    let first_next = frame[l3 + v6::NEXT];
    // Payload length 0 with a hop-by-hop header is a jumbogram (RFC 2675),
    // which Sluice does not carry; otherwise it is an empty payload.
    if plen == 0 && first_next == proto::HOPOPT {
        return Err(DropReason::Ipv6Jumbo);
    }
    if v6::LEN + plen > avail {
        return Err(DropReason::Ipv6BadPayloadLength);
    }
    let ip_end = l3 + v6::LEN + plen;
    let dgram = &frame[..ip_end];
    let (l4proto, l4, frag, frag_id) = walk_ipv6_ext(dgram, l3 + v6::LEN, first_next)?;
    p.l3 = off16(l3);
    p.l4 = off16(l4);
    p.ip_end = off16(ip_end);
    p.v6 = true;
    p.ttl = frame[l3 + v6::HOP_LIMIT];
    p.frag = frag;
    p.frag_id = frag_id;
    p.flow.src = addr6(frame, l3 + v6::SRC);
    p.flow.dst = addr6(frame, l3 + v6::DST);
    // Addresses are family-less 128-bit integers with IPv4 stored mapped:
    // an IPv6 packet carrying ::ffff:a.b.c.d would pass for IPv4.
    if p.flow.src.is_v4() || p.flow.dst.is_v4() {
        return Err(DropReason::Ipv6MappedAddress);
    }
    p.flow.proto = l4proto;
    parse_l4(dgram, p)
}

#[inline(always)]
fn is_icmp_error(v6: bool, typ: u8) -> bool {
    if v6 {
        // Destination unreachable, packet too big, time exceeded, parameter problem.
        (1..=4).contains(&typ)
    } else {
        // Destination unreachable, source quench, redirect, time exceeded, parameter problem.
        matches!(typ, 3 | 4 | 5 | 11 | 12)
    }
}

/// Parses the transport header of `p` inside `dgram` (the frame cut at the
/// end of the IP datagram).
#[inline]
fn parse_l4(dgram: &[u8], p: &mut Parsed) -> Result<(), DropReason> {
    p.flow.sport = 0;
    p.flow.dport = 0;
    p.has_ports = false;
    p.icmp_error = false;
    p.inner_ports = false;
    if p.frag == Fragment::Later {
        return Ok(());
    }
    let l4 = usize::from(p.l4);
    let seg = dgram.get(l4..).unwrap_or_default();
    let avail = seg.len();
    match p.flow.proto {
        proto::TCP => {
            let Some(t) = seg.first_chunk::<TCP_MIN>() else {
                return Err(DropReason::L4Truncated);
            };
            let doff = usize::from(t[12] >> 4) * 4;
            if doff < TCP_MIN || doff > avail {
                return Err(DropReason::TcpBadDataOffset);
            }
            p.flow.sport = u16::from_be_bytes([t[0], t[1]]);
            p.flow.dport = u16::from_be_bytes([t[2], t[3]]);
            p.has_ports = true;
        }
        proto::UDP => {
            let Some(u) = seg.first_chunk::<UDP_LEN>() else {
                return Err(DropReason::L4Truncated);
            };
            let ulen = usize::from(u16::from_be_bytes([u[4], u[5]]));
            if p.frag == Fragment::No && (ulen < UDP_LEN || ulen > avail) {
                return Err(DropReason::UdpBadLength);
            }
            p.flow.sport = u16::from_be_bytes([u[0], u[1]]);
            p.flow.dport = u16::from_be_bytes([u[2], u[3]]);
            p.has_ports = true;
        }
        proto::SCTP => {
            if avail < SCTP_MIN {
                return Err(DropReason::L4Truncated);
            }
            p.flow.sport = be16(dgram, l4);
            p.flow.dport = be16(dgram, l4 + 2);
            p.has_ports = true;
        }
        proto::ICMP if !p.v6 => parse_icmp(dgram, l4, avail, p)?,
        proto::ICMPV6 if p.v6 => parse_icmp(dgram, l4, avail, p)?,
        _ => {}
    }
    Ok(())
}

#[inline]
fn parse_icmp(dgram: &[u8], l4: usize, avail: usize, p: &mut Parsed) -> Result<(), DropReason> {
    if avail < ICMP_MIN {
        return Err(DropReason::L4Truncated);
    }
    if !is_icmp_error(p.v6, dgram[l4]) || p.frag != Fragment::No {
        return Ok(());
    }
    p.icmp_error = true;
    (p.inner, p.inner_ports) = parse_embedded(dgram, l4 + ICMP_MIN, p.v6)?;
    Ok(())
}

/// The 5-tuple of the packet embedded in an ICMP error, which may be cut
/// short after its transport ports, and whether it had ports.
#[inline]
fn parse_embedded(buf: &[u8], off: usize, v6: bool) -> Result<(Flow, bool), DropReason> {
    let avail = buf.len().saturating_sub(off);
    let (mut flow, l4, later) = if v6 {
        if avail < v6::LEN || buf[off] >> 4 != 6 {
            return Err(DropReason::IcmpErrorTruncated);
        }
        let (next, l4, frag, _) = walk_ipv6_ext(buf, off + v6::LEN, buf[off + v6::NEXT])
            .map_err(|_| DropReason::IcmpErrorTruncated)?;
        let f = Flow { src: addr6(buf, off + v6::SRC), dst: addr6(buf, off + v6::DST), proto: next, ..Flow::default() };
        if f.src.is_v4() || f.dst.is_v4() {
            return Err(DropReason::Ipv6MappedAddress);
        }
        (f, l4, frag == Fragment::Later)
    } else {
        if avail < v4::MIN_LEN || buf[off] >> 4 != 4 {
            return Err(DropReason::IcmpErrorTruncated);
        }
        let ihl = usize::from(buf[off] & 0x0f) * 4;
        if ihl < v4::MIN_LEN || ihl > avail {
            return Err(DropReason::IcmpErrorTruncated);
        }
        let f = Flow {
            src: addr4(buf, off + v4::SRC),
            dst: addr4(buf, off + v4::DST),
            proto: buf[off + v4::PROTO],
            ..Flow::default()
        };
        (f, off + ihl, be16(buf, off + v4::FRAG) & v4::OFFSET_MASK != 0)
    };
    let ports = !later && matches!(flow.proto, proto::TCP | proto::UDP | proto::SCTP);
    if ports {
        if l4 + 4 > buf.len() {
            return Err(DropReason::IcmpErrorTruncated);
        }
        flow.sport = be16(buf, l4);
        flow.dport = be16(buf, l4 + 2);
    }
    Ok((flow, ports))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::craft;

    fn ip(frame: &[u8]) -> Parsed {
        match parse(frame) {
            Ok(Frame::Ip(p)) => p,
            other => panic!("not IP: {other:?}"),
        }
    }

    const A4: [u8; 4] = [10, 0, 0, 1];
    const B4: [u8; 4] = [20, 0, 0, 1];
    const A6: [u8; 16] = [0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const B6: [u8; 16] = [0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

    #[test]
    fn ipv4_tcp() {
        let f = craft::frame_v4(&[], A4, B4, proto::TCP, &craft::tcp(40000, 80, 0x02, b"hi"));
        let p = ip(&f);
        assert_eq!(p.l3, 14);
        assert_eq!(p.l4, 34);
        assert_eq!(p.flow.src, Addr::v4(A4));
        assert_eq!(p.flow.dst, Addr::v4(B4));
        assert_eq!((p.flow.sport, p.flow.dport, p.flow.proto), (40000, 80, proto::TCP));
        assert!(p.has_ports && !p.v6 && !p.icmp_error);
        assert_eq!(p.ttl, 64);
        assert_eq!(usize::from(p.ip_end), f.len());
    }

    #[test]
    fn vlan_and_qinq() {
        let payload = craft::udp(1, 2, b"x");
        let f = craft::frame_v4(&[100], A4, B4, proto::UDP, &payload);
        let p = ip(&f);
        assert_eq!((p.vlans, p.vlan_ids[0], p.l3), (1, 100, 18));
        let f = craft::frame_v4(&[7, 100], A4, B4, proto::UDP, &payload);
        assert_eq!(u16::from_be_bytes([f[12], f[13]]), ethertype::QINQ, "outer tag is 802.1ad");
        let p = ip(&f);
        assert_eq!((p.vlans, p.vlan_ids, p.l3), (2, [7, 100], 22));
        let f = craft::frame_v4(&[1, 2, 3], A4, B4, proto::UDP, &payload);
        assert_eq!(parse(&f), Err(DropReason::VlanTooDeep));
    }

    #[test]
    fn non_ip_is_other() {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&[2, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&ethertype::ARP.to_be_bytes());
        f.extend_from_slice(&[0; 28]);
        assert_eq!(parse(&f), Ok(Frame::Other { ethertype: ethertype::ARP, l3: 14 }));
        assert_eq!(parse(&f[..13]), Err(DropReason::EthTruncated));
    }

    #[test]
    fn ipv4_malformed_headers() {
        let good = craft::frame_v4(&[], A4, B4, proto::UDP, &craft::udp(1, 2, b"abc"));
        let cases: &[(usize, u8, DropReason)] = &[
            (14, 0x65, DropReason::Ipv4BadVersion),
            (14, 0x44, DropReason::Ipv4BadHeaderLength),
            (14, 0x4f, DropReason::Ipv4Truncated),
            (16, 0xff, DropReason::Ipv4BadTotalLength),
            (22, 0x01, DropReason::Ipv4BadChecksum),
        ];
        for &(off, val, why) in cases {
            let mut f = good.clone();
            f[off] = val;
            assert_eq!(parse(&f), Err(why), "byte {off} = {val:#x}");
        }
        assert_eq!(parse(&good[..14 + 19]), Err(DropReason::Ipv4Truncated));
        // Ethernet padding after the datagram is fine.
        let mut padded = good.clone();
        padded.extend_from_slice(&[0; 20]);
        assert_eq!(usize::from(ip(&padded).ip_end), good.len());
    }

    #[test]
    fn ipv4_options_and_fragments() {
        let seg = craft::tcp(1000, 22, 0x10, &[]);
        let f = craft::ipv4_full(A4, B4, proto::TCP, 64, 7, 0, &[1, 1, 1, 1], &seg);
        let p = ip(&craft::ether(&[], ethertype::IPV4, &f));
        assert_eq!(p.l4, 14 + 24);
        assert_eq!(p.flow.dport, 22);
        let first = craft::ipv4_full(A4, B4, proto::UDP, 64, 99, v4::MF, &[], &craft::udp(5, 6, &[0; 40])[..24]);
        let p = ip(&craft::ether(&[], ethertype::IPV4, &first));
        assert_eq!((p.frag, p.frag_id, p.has_ports, p.flow.sport), (Fragment::First, 99, true, 5));
        let later = craft::ipv4_full(A4, B4, proto::UDP, 64, 99, 3, &[], &[0; 24]);
        let p = ip(&craft::ether(&[], ethertype::IPV4, &later));
        assert_eq!((p.frag, p.frag_id, p.has_ports, p.flow.sport), (Fragment::Later, 99, false, 0));
    }

    #[test]
    fn l4_malformed() {
        let mut t = craft::tcp(1, 2, 0, &[]);
        t[12] = 0x40; // data offset 4 words
        assert_eq!(parse(&craft::frame_v4(&[], A4, B4, proto::TCP, &t)), Err(DropReason::TcpBadDataOffset));
        assert_eq!(
            parse(&craft::frame_v4(&[], A4, B4, proto::TCP, &[0; 10])),
            Err(DropReason::L4Truncated)
        );
        let mut u = craft::udp(1, 2, b"abcd");
        u[5] = 200;
        assert_eq!(parse(&craft::frame_v4(&[], A4, B4, proto::UDP, &u)), Err(DropReason::UdpBadLength));
        assert_eq!(parse(&craft::frame_v4(&[], A4, B4, proto::SCTP, &[0; 8])), Err(DropReason::L4Truncated));
        let p = ip(&craft::frame_v4(&[], A4, B4, proto::SCTP, &craft::sctp(3868, 3869, &[])));
        assert_eq!((p.flow.sport, p.flow.dport), (3868, 3869));
    }

    #[test]
    fn ipv6_extension_headers_and_fragments() {
        let udp = craft::udp(53, 5353, b"q");
        let f = craft::frame_v6(&[], A6, B6, proto::UDP, &udp);
        let p = ip(&f);
        assert!(p.v6);
        assert_eq!((p.flow.src, p.flow.dst), (Addr::v6(A6), Addr::v6(B6)));
        assert_eq!((p.l4, p.flow.sport, p.flow.dport), (54, 53, 5353));

        // hop-by-hop (8) + destination options (16) + fragment header (first) + UDP
        let mut chain = vec![proto::DSTOPTS, 0, 1, 4, 0, 0, 0, 0];
        chain.extend_from_slice(&[proto::FRAGMENT, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        chain.extend_from_slice(&craft::ipv6_fragment_header(proto::UDP, 0, true, 0xdeadbeef));
        chain.extend_from_slice(&udp);
        let f = craft::frame_v6(&[], A6, B6, proto::HOPOPT, &chain);
        let p = ip(&f);
        assert_eq!((p.frag, p.frag_id, p.flow.proto, p.flow.dport), (Fragment::First, 0xdeadbeef, proto::UDP, 5353));
        assert_eq!(usize::from(p.l4), 54 + 8 + 16 + 8);

        let mut later = craft::ipv6_fragment_header(proto::UDP, 185, false, 7).to_vec();
        later.extend_from_slice(&[0; 16]);
        let p = ip(&craft::frame_v6(&[], A6, B6, proto::FRAGMENT, &later));
        assert_eq!((p.frag, p.frag_id, p.has_ports), (Fragment::Later, 7, false));

        // An extension header running past the payload.
        let bad = [proto::UDP, 9, 0, 0, 0, 0, 0, 0];
        assert_eq!(parse(&craft::frame_v6(&[], A6, B6, proto::DSTOPTS, &bad)), Err(DropReason::Ipv6BadExtensionHeader));
        // Hop-by-Hop options anywhere but first (RFC 8200 4.1).
        let mut late = vec![proto::HOPOPT, 0, 1, 4, 0, 0, 0, 0, proto::UDP, 0, 1, 4, 0, 0, 0, 0];
        late.extend_from_slice(&udp);
        assert_eq!(parse(&craft::frame_v6(&[], A6, B6, proto::DSTOPTS, &late)), Err(DropReason::Ipv6HopByHopNotFirst));
        let mut after_frag = craft::ipv6_fragment_header(proto::HOPOPT, 0, true, 1).to_vec();
        after_frag.extend_from_slice(&late[8..]);
        assert_eq!(parse(&craft::frame_v6(&[], A6, B6, proto::FRAGMENT, &after_frag)), Err(DropReason::Ipv6HopByHopNotFirst));
        // Nine chained destination-option headers.
        let mut long = Vec::new();
        for _ in 0..9 {
            long.extend_from_slice(&[proto::DSTOPTS, 0, 1, 4, 0, 0, 0, 0]);
        }
        assert_eq!(parse(&craft::frame_v6(&[], A6, B6, proto::DSTOPTS, &long)), Err(DropReason::Ipv6BadExtensionHeader));
    }

    #[test]
    fn ipv6_malformed_lengths() {
        let f = craft::frame_v6(&[], A6, B6, proto::UDP, &craft::udp(1, 2, b""));
        let mut g = f.clone();
        g[14 + 4] = 0x10;
        assert_eq!(parse(&g), Err(DropReason::Ipv6BadPayloadLength));
        let mut j = f.clone();
        j[14 + 4] = 0;
        j[14 + 5] = 0;
        j[14 + 6] = proto::HOPOPT;
        assert_eq!(parse(&j), Err(DropReason::Ipv6Jumbo));
        j[14 + 6] = proto::UDP;
        assert_eq!(parse(&j), Err(DropReason::L4Truncated), "an empty payload is fine at IPv6, not for UDP");
        let mut v = f.clone();
        v[14] = 0x40;
        assert_eq!(parse(&v), Err(DropReason::Ipv6BadVersion));
        assert_eq!(parse(&f[..14 + 39]), Err(DropReason::Ipv6Truncated));
    }

    #[test]
    fn icmp_errors_carry_the_embedded_flow() {
        // The reply VIP:80 -> client:40000 bounced with "fragmentation needed".
        let reply = craft::ipv4(B4, A4, proto::TCP, &craft::tcp(80, 40000, 0x10, &[0; 100]));
        let err = craft::icmp4_error(3, 4, &reply[..28]);
        let p = ip(&craft::frame_v4(&[], [192, 0, 2, 1], B4, proto::ICMP, &err));
        assert!(p.icmp_error && p.inner_ports);
        assert_eq!(p.inner, Flow { src: Addr::v4(B4), dst: Addr::v4(A4), sport: 80, dport: 40000, proto: proto::TCP });
        assert_eq!(
            parse(&craft::frame_v4(&[], [192, 0, 2, 1], B4, proto::ICMP, &craft::icmp4_error(3, 4, &reply[..22]))),
            Err(DropReason::IcmpErrorTruncated)
        );
        // Echo requests are not errors.
        let echo = [8, 0, 0, 0, 0, 1, 0, 1];
        assert!(!ip(&craft::frame_v4(&[], A4, B4, proto::ICMP, &echo)).icmp_error);

        let reply6 = craft::ipv6(B6, A6, proto::UDP, &craft::udp(53, 4000, &[0; 10]));
        let err6 = craft::icmp6_error(2, 0, &reply6);
        let p = ip(&craft::frame_v6(&[], [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9], B6, proto::ICMPV6, &err6));
        assert!(p.icmp_error);
        assert_eq!((p.inner.src, p.inner.sport, p.inner.dport), (Addr::v6(B6), 53, 4000));
    }

    #[test]
    fn ipv4_mapped_ipv6_addresses_are_dropped() {
        let mapped = |a: [u8; 4]| {
            let mut m = [0u8; 16];
            m[10..12].copy_from_slice(&[0xff, 0xff]);
            m[12..].copy_from_slice(&a);
            m
        };
        let udp = craft::udp(1, 2, b"x");
        assert_eq!(parse(&craft::frame_v6(&[], A6, mapped(B4), proto::UDP, &udp)), Err(DropReason::Ipv6MappedAddress));
        assert_eq!(parse(&craft::frame_v6(&[], mapped(A4), B6, proto::UDP, &udp)), Err(DropReason::Ipv6MappedAddress));
        // In the packet an ICMPv6 error quotes.
        let quoted = craft::ipv6(B6, mapped(A4), proto::UDP, &craft::udp(53, 4000, &[0; 10]));
        let err = craft::icmp6_error(1, 0, &quoted);
        assert_eq!(parse(&craft::frame_v6(&[], A6, B6, proto::ICMPV6, &err)), Err(DropReason::Ipv6MappedAddress));
        // Other IPv6 addresses with the low 32 bits of an IPv4 one are fine
        // (IPv4-compatible ::a.b.c.d, NAT64 64:ff9b::/96).
        let mut nat64 = mapped(B4);
        nat64[..4].copy_from_slice(&[0, 0x64, 0xff, 0x9b]);
        nat64[10..12].copy_from_slice(&[0, 0]);
        assert!(parse(&craft::frame_v6(&[], A6, nat64, proto::UDP, &udp)).is_ok());
    }

    #[test]
    fn raw_ip_entry_point() {
        let pkt = craft::ipv4(A4, B4, proto::UDP, &craft::udp(7, 8, b""));
        let p = parse_ip(&pkt, 0).unwrap();
        assert_eq!((p.l3, p.flow.dport), (0, 8));
        assert_eq!(parse_ip(&[0x10], 0), Err(DropReason::Ipv4BadVersion));
        assert_eq!(parse_ip(&[], 0), Err(DropReason::Ipv4Truncated));
    }
}

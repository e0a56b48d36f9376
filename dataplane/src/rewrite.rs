//! Header rewrites for forwarding: TTL/hop-limit decrement with an
//! incremental checksum, the NAT-less layer-2 rewrite, and IP-in-IP
//! encapsulation (IPv4 or IPv6 outer, around IPv4 or IPv6 inner).
//!
//! VLAN tags of the received frame are removed; a frame leaving a port that
//! serves a VLAN carries that VLAN's 802.1Q tag, others leave untagged.

use crate::addr::Addr;
use crate::checksum;
use crate::io::PacketBuf;
use crate::parse::{ethertype, proto, v4, v6, Parsed, ETH_LEN};
use crate::verdict::DropReason;

/// Decrements the TTL (IPv4, with the header checksum updated) or hop
/// limit (IPv6) of the packet at `l3`.
#[inline]
pub fn decrement_ttl(frame: &mut [u8], l3: usize, is_v6: bool) -> Result<(), DropReason> {
    if is_v6 {
        let h = &mut frame[l3 + v6::HOP_LIMIT];
        if *h <= 1 {
            return Err(DropReason::TtlExpired);
        }
        *h -= 1;
    } else {
        let h = &mut frame[l3..l3 + v4::MIN_LEN];
        let ttl = h[v4::TTL];
        if ttl <= 1 {
            return Err(DropReason::TtlExpired);
        }
        h[v4::TTL] = ttl - 1;
        // The TTL is the high byte of its 16-bit word: the word drops by
        // 0x0100, so the checksum rises by 0x0100 with end-around carry
        // (RFC 1624; the same update as Linux's ip_decrease_ttl).
        let c = u32::from(u16::from_be_bytes([h[v4::CHECK], h[v4::CHECK + 1]])) + 0x0100;
        let c = u16::try_from((c + (c >> 16)) & 0xffff).unwrap_or(0);
        h[v4::CHECK..v4::CHECK + 2].copy_from_slice(&c.to_be_bytes());
    }
    Ok(())
}

/// Bytes of the Ethernet header written for `vlan` (0: untagged).
#[inline(always)]
pub(crate) fn l2_len(vlan: u16) -> usize {
    if vlan == 0 {
        ETH_LEN
    } else {
        ETH_LEN + VLAN_TAG_LEN
    }
}

/// An 802.1Q tag's length.
const VLAN_TAG_LEN: usize = 4;

/// Writes an Ethernet header at the start of `frame`: untagged, or with
/// the 802.1Q tag of `vlan` when it is not 0 ([`l2_len`] bytes).
#[inline(always)]
pub(crate) fn write_eth(frame: &mut [u8], dst: [u8; 6], src: [u8; 6], vlan: u16, et: u16) {
    let mut h = [0u8; ETH_LEN + VLAN_TAG_LEN];
    h[0..6].copy_from_slice(&dst);
    h[6..12].copy_from_slice(&src);
    if vlan == 0 {
        h[12..14].copy_from_slice(&et.to_be_bytes());
        frame[..ETH_LEN].copy_from_slice(&h[..ETH_LEN]);
    } else {
        h[12..14].copy_from_slice(&ethertype::VLAN.to_be_bytes());
        h[14..16].copy_from_slice(&(vlan & 0x0fff).to_be_bytes());
        h[16..18].copy_from_slice(&et.to_be_bytes());
        frame[..ETH_LEN + VLAN_TAG_LEN].copy_from_slice(&h);
    }
}

/// Adds the 802.1Q tag of `vlan` to an untagged frame (one the kernel sent
/// out of a port that serves a VLAN). False, leaving it as it is, when the
/// frame is shorter than an Ethernet header or the headroom is short.
pub fn add_vlan_tag<P: PacketBuf>(pkt: &mut P, vlan: u16) -> bool {
    if pkt.data().len() < ETH_LEN || !pkt.prepend(VLAN_TAG_LEN) {
        return false;
    }
    let f = pkt.data_mut();
    f.copy_within(VLAN_TAG_LEN..VLAN_TAG_LEN + 12, 0);
    f[12..14].copy_from_slice(&ethertype::VLAN.to_be_bytes());
    f[14..16].copy_from_slice(&(vlan & 0x0fff).to_be_bytes());
    true
}

/// Removes the one VLAN tag after the MAC addresses (a frame handed to the
/// kernel, whose interface is untagged).
pub fn remove_vlan_tag<P: PacketBuf>(pkt: &mut P) -> bool {
    let f = pkt.data_mut();
    if f.len() < ETH_LEN + VLAN_TAG_LEN {
        return false;
    }
    f.copy_within(0..12, VLAN_TAG_LEN);
    pkt.adj(VLAN_TAG_LEN)
}

/// Makes exactly `before` bytes precede the IP header that is now at `l3`.
#[inline]
pub(crate) fn make_room<P: PacketBuf>(pkt: &mut P, l3: usize, before: usize) -> Result<(), DropReason> {
    if before > l3 {
        if !pkt.prepend(before - l3) {
            return Err(DropReason::EncapNoHeadroom);
        }
    } else if before < l3 && !pkt.adj(l3 - before) {
        return Err(DropReason::EthTruncated);
    }
    Ok(())
}

/// NAT-less forwarding: TTL decremented, frame re-addressed from `src` to
/// `dst` at layer 2 (tagged with `vlan` unless 0); the IP packet is
/// otherwise unchanged.
#[inline]
pub fn forward_l2<P: PacketBuf>(pkt: &mut P, p: &Parsed, src: [u8; 6], dst: [u8; 6], vlan: u16) -> Result<(), DropReason> {
    let l3 = usize::from(p.l3);
    let et = if p.v6 { ethertype::IPV6 } else { ethertype::IPV4 };
    if l3 == ETH_LEN && vlan == 0 {
        let f = pkt.data_mut();
        decrement_ttl(f, l3, p.v6)?;
        write_eth(f, dst, src, 0, et);
        return Ok(());
    }
    decrement_ttl(pkt.data_mut(), l3, p.v6)?;
    make_room(pkt, l3, l2_len(vlan))?;
    write_eth(pkt.data_mut(), dst, src, vlan, et);
    Ok(())
}

/// Outer headers for [`encapsulate`].
#[derive(Clone, Copy, Debug)]
pub struct Tunnel {
    /// Outer source (the appliance).
    pub src: Addr,
    /// Outer destination (the endpoint).
    pub dst: Addr,
    /// Source MAC (the output port's).
    pub src_mac: [u8; 6],
    /// Next-hop MAC.
    pub dst_mac: [u8; 6],
    /// IP MTU of the output.
    pub mtu: u16,
    /// VLAN of the output (0: untagged).
    pub vlan: u16,
}

/// IP-in-IP: TTL of the inner packet decremented, an outer IPv4 (protocol
/// 4 or 41) or IPv6 (next header 4 or 41) header added. `entropy` (the flow
/// hash) fills the IPv6 flow label so that routers spread tunnelled flows.
#[inline]
#[allow(clippy::cast_possible_truncation)] // lengths are bounded by the 16-bit IP lengths checked here
pub fn encapsulate<P: PacketBuf>(pkt: &mut P, p: &Parsed, t: &Tunnel, entropy: u64) -> Result<(), DropReason> {
    let l3 = usize::from(p.l3);
    let inner_len = usize::from(p.ip_end) - l3;
    let outer_v6 = !t.src.is_v4();
    let outer_len = if outer_v6 { v6::LEN } else { v4::MIN_LEN };
    if inner_len + outer_len > usize::from(t.mtu) || inner_len + outer_len > usize::from(u16::MAX) {
        return Err(DropReason::EncapTooBig);
    }
    decrement_ttl(pkt.data_mut(), l3, p.v6)?;
    let inner = pkt.data();
    let (tos, df) = if p.v6 {
        (((inner[l3] & 0x0f) << 4) | (inner[l3 + 1] >> 4), true)
    } else {
        (inner[l3 + 1], u16::from_be_bytes([inner[l3 + v4::FRAG], inner[l3 + v4::FRAG + 1]]) & v4::DF != 0)
    };
    let inner_proto = if p.v6 { proto::IPV6 } else { proto::IPIP };
    let o = l2_len(t.vlan);
    make_room(pkt, l3, o + outer_len)?;
    let f = pkt.data_mut();
    if outer_v6 {
        write_eth(f, t.dst_mac, t.src_mac, t.vlan, ethertype::IPV6);
        let label = (entropy as u32) & 0x000f_ffff;
        let word = (6u32 << 28) | (u32::from(tos) << 20) | label;
        f[o..o + 4].copy_from_slice(&word.to_be_bytes());
        f[o + v6::PAYLOAD_LEN..o + v6::PAYLOAD_LEN + 2].copy_from_slice(&(inner_len as u16).to_be_bytes());
        f[o + v6::NEXT] = inner_proto;
        f[o + v6::HOP_LIMIT] = 64;
        f[o + v6::SRC..o + v6::SRC + 16].copy_from_slice(&t.src.v6_bytes());
        f[o + v6::DST..o + v6::DST + 16].copy_from_slice(&t.dst.v6_bytes());
    } else {
        write_eth(f, t.dst_mac, t.src_mac, t.vlan, ethertype::IPV4);
        let h = &mut f[o..o + v4::MIN_LEN];
        h[0] = 0x45;
        h[1] = tos;
        h[v4::TOTAL_LEN..v4::TOTAL_LEN + 2].copy_from_slice(&((inner_len + outer_len) as u16).to_be_bytes());
        // Atomic datagrams (DF) carry id 0 (RFC 6864); others a flow-derived id.
        let (id, frag) = if df { (0u16, v4::DF) } else { (entropy as u16, 0) };
        h[v4::ID..v4::ID + 2].copy_from_slice(&id.to_be_bytes());
        h[v4::FRAG..v4::FRAG + 2].copy_from_slice(&frag.to_be_bytes());
        h[v4::TTL] = 64;
        h[v4::PROTO] = inner_proto;
        h[v4::CHECK..v4::CHECK + 2].copy_from_slice(&[0, 0]);
        h[v4::SRC..v4::SRC + 4].copy_from_slice(&t.src.v4_bytes());
        h[v4::DST..v4::DST + 4].copy_from_slice(&t.dst.v4_bytes());
        let c = checksum::checksum(h);
        h[v4::CHECK..v4::CHECK + 2].copy_from_slice(&c.to_be_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::craft;
    use crate::memio::MemBuf as Buf;
    use crate::parse::{parse, parse_ip, Frame};

    fn parsed(f: &[u8]) -> Parsed {
        match parse(f).unwrap() {
            Frame::Ip(p) => p,
            Frame::Other { .. } => panic!("not IP"),
        }
    }

    const A: [u8; 4] = [10, 0, 0, 1];
    const VIP: [u8; 4] = [20, 0, 0, 1];

    #[test]
    fn ttl_decrement_keeps_the_checksum_valid() {
        let f = craft::frame_v4(&[], A, VIP, proto::UDP, &craft::udp(1, 2, b"x"));
        let mut g = f.clone();
        decrement_ttl(&mut g, 14, false).unwrap();
        assert_eq!(g[14 + 8], 63);
        assert_eq!(checksum::sum(&g[14..34]), 0xffff);
        let mut one = craft::ether(&[], ethertype::IPV4, &craft::ipv4_full(A, VIP, 17, 1, 0, 0, &[], &[0; 8]));
        assert_eq!(decrement_ttl(&mut one, 14, false), Err(DropReason::TtlExpired));
        let mut six = craft::frame_v6(&[], [1; 16], [2; 16], proto::UDP, &craft::udp(1, 2, b""));
        decrement_ttl(&mut six, 14, true).unwrap();
        assert_eq!(six[14 + 7], 63);
    }

    #[test]
    fn l2_rewrite_strips_vlan_tags() {
        let f = craft::frame_v4(&[7, 100], A, VIP, proto::TCP, &craft::tcp(1, 80, 2, b"hello"));
        let p = parsed(&f);
        let mut b = Buf::new(&f);
        forward_l2(&mut b, &p, [2, 0, 0, 0, 0, 0xaa], [2, 0, 0, 0, 0, 0xbb], 0).unwrap();
        let out = b.data();
        assert_eq!(out.len(), f.len() - 8);
        assert_eq!(&out[0..6], &[2, 0, 0, 0, 0, 0xbb]);
        assert_eq!(&out[6..12], &[2, 0, 0, 0, 0, 0xaa]);
        assert_eq!(&out[12..14], &ethertype::IPV4.to_be_bytes());
        assert_eq!(&out[14 + 12..], &f[22 + 12..], "IP packet unchanged after the TTL and checksum");
        let q = parsed(out);
        assert_eq!((q.ttl, q.flow), (63, p.flow));
    }

    #[test]
    fn encapsulation_in_all_four_family_combinations() {
        let inner4 = craft::frame_v4(&[], A, VIP, proto::TCP, &craft::tcp(1, 80, 2, b"data"));
        let inner6 = craft::frame_v6(&[], [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2], proto::UDP, &craft::udp(5, 53, b"q"));
        let out4 = (Addr::v4([192, 168, 0, 1]), Addr::v4([192, 168, 0, 9]));
        let out6: (Addr, Addr) = ("fd00::1".parse().unwrap(), "fd00::9".parse().unwrap());
        for inner in [&inner4, &inner6] {
            for (src, dst) in [out4, out6] {
                let p = parsed(inner);
                let mut b = Buf::new(inner);
                let t = Tunnel { src, dst, src_mac: [2, 0, 0, 0, 0, 1], dst_mac: [2, 0, 0, 0, 0, 2], mtu: 1500, vlan: 0 };
                encapsulate(&mut b, &p, &t, 0x12345).unwrap();
                let outer = parsed(b.data());
                assert_eq!((outer.flow.src, outer.flow.dst), (src, dst));
                assert_eq!(outer.flow.proto, if p.v6 { proto::IPV6 } else { proto::IPIP });
                assert_eq!(usize::from(outer.ip_end), b.data().len());
                let inner_again = parse_ip(b.data(), usize::from(outer.l4)).unwrap();
                assert_eq!(inner_again.flow, p.flow);
                assert_eq!(inner_again.ttl, p.ttl - 1);
            }
        }
        let p = parsed(&inner4);
        let mut b = Buf::new(&inner4);
        let t = Tunnel { src: out4.0, dst: out4.1, src_mac: [0; 6], dst_mac: [0; 6], mtu: 60, vlan: 0 };
        assert_eq!(encapsulate(&mut b, &p, &t, 0), Err(DropReason::EncapTooBig));
        let mut tight = Buf::with_headroom(&inner4, 0);
        let t = Tunnel { mtu: 1500, ..t };
        assert_eq!(encapsulate(&mut tight, &p, &t, 0), Err(DropReason::EncapNoHeadroom));
    }
}

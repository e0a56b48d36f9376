//! ICMP errors the appliance originates: when a packet no longer fits its
//! output once encapsulated, path-MTU discovery needs the client told so —
//! IPv4 "destination unreachable, fragmentation needed" (RFC 1191) for a
//! packet with DF set, IPv6 "packet too big" (RFC 8201) for any packet.
//!
//! The error is built in place, in the buffer of the packet it is about:
//! the original IP packet moves back to make room for the new headers and
//! is cut to what the error may quote (576 bytes of IPv4 packet in all,
//! 1280 of IPv6). No allocation; checksums computed once. Errors are never
//! sent about ICMP errors, non-initial IPv4 fragments or packets from
//! addresses that are not one host's (RFC 1812 4.3.2.7, RFC 4443 2.4), and
//! at most at the rate of a [`RateLimit`] per worker.

use crate::addr::Addr;
use crate::checksum;
use crate::io::PacketBuf;
use crate::parse::{ethertype, proto, v4, v6, Fragment, Parsed};
use crate::rewrite::{l2_len, make_room, write_eth};
use crate::verdict::DropReason;

/// Largest IPv4 ICMP error sent (RFC 1812 4.3.2.3).
pub const V4_ERROR_MAX: usize = 576;
/// Largest IPv6 ICMP error sent (RFC 4443 2.4 (c)): the minimum MTU.
pub const V6_ERROR_MAX: usize = 1280;
/// ICMP and ICMPv6 header length.
const ICMP_LEN: usize = 8;

/// A token bucket: `rate` tokens a second, at most `burst` saved up.
#[derive(Clone, Copy, Debug)]
pub struct RateLimit {
    /// In thousandths of a token.
    tokens: u64,
    cap: u64,
    /// Thousandths of a token per millisecond (= tokens per second).
    rate: u64,
    last_ms: u64,
}

impl RateLimit {
    /// A full bucket.
    pub fn new(rate: u32, burst: u32) -> RateLimit {
        let cap = u64::from(burst) * 1000;
        RateLimit { tokens: cap, cap, rate: u64::from(rate), last_ms: 0 }
    }

    /// Takes a token at `now_ms` (a monotonic clock), if there is one.
    #[inline]
    pub fn take(&mut self, now_ms: u64) -> bool {
        let elapsed = now_ms.saturating_sub(self.last_ms);
        self.last_ms = self.last_ms.max(now_ms);
        self.tokens = self.tokens.saturating_add(elapsed.saturating_mul(self.rate)).min(self.cap);
        if self.tokens >= 1000 {
            self.tokens -= 1000;
            true
        } else {
            false
        }
    }
}

/// True when `a` names one host, so that an error may be sent to it.
#[inline]
fn unicast_host(a: Addr) -> bool {
    if a.is_v4() {
        let b = a.v4_bytes();
        // Not 0/8 ("this network"), 127/8 (loopback), 224/4 (multicast) or
        // 240/4 (reserved, with the limited broadcast).
        !matches!(b[0], 0 | 127 | 224..=255)
    } else {
        let b = a.v6_bytes();
        // Not ::, ::1 or ff00::/8.
        a.0 > 1 && b[0] != 0xff
    }
}

/// True when an ICMP error may be sent about `p` (the packet in `frame`)
/// because it does not fit the path: IPv4 only with DF set, never about a
/// non-initial IPv4 fragment, an ICMP error, or a packet from an address
/// that is not one host's.
#[inline]
pub fn may_answer(frame: &[u8], p: &Parsed) -> bool {
    if p.icmp_error || !unicast_host(p.flow.src) {
        return false;
    }
    let l3 = usize::from(p.l3);
    let l4 = usize::from(p.l4);
    if p.v6 {
        // ICMPv6 error messages are types 0-127; a later fragment's type is unknown.
        p.flow.proto != proto::ICMPV6 || (p.frag != Fragment::Later && frame.get(l4).is_some_and(|&t| t >= 128))
    } else {
        let df = frame.get(l3 + v4::FRAG).is_some_and(|&b| (u16::from(b) << 8) & v4::DF != 0);
        df && p.frag != Fragment::Later
            && (p.flow.proto != proto::ICMP || frame.get(l4).is_some_and(|&t| !matches!(t, 3 | 4 | 5 | 11 | 12)))
    }
}

/// Turns `pkt` (the packet of `p`, too big to send on) into the ICMP error
/// that says so, addressed back to where it came from: from the VIP it was
/// sent to, to its source, at layer 2 from `src_mac` to the frame's own
/// source MAC (tagged with `vlan` unless 0). `mtu` is the largest packet
/// that fits (the output's MTU less the encapsulation). Checks with
/// [`may_answer`] come first.
#[allow(clippy::cast_possible_truncation)] // lengths are at most 1280 here
pub fn too_big<P: PacketBuf>(pkt: &mut P, p: &Parsed, mtu: u16, src_mac: [u8; 6], vlan: u16) -> Result<(), DropReason> {
    let frame = pkt.data();
    let Some(dst_mac) = frame.get(6..12).and_then(|m| <[u8; 6]>::try_from(m).ok()) else {
        return Err(DropReason::EthTruncated);
    };
    let l3 = usize::from(p.l3);
    let orig = usize::from(p.ip_end).saturating_sub(l3);
    let (ip_len, max) = if p.v6 { (v6::LEN, V6_ERROR_MAX) } else { (v4::MIN_LEN, V4_ERROR_MAX) };
    let quote = orig.min(max - ip_len - ICMP_LEN);
    let l2 = l2_len(vlan);
    let start = l2 + ip_len + ICMP_LEN;
    make_room(pkt, l3, start)?;
    if !pkt.truncate(start + quote) {
        return Err(DropReason::EncapTooBig);
    }
    let (vip, client) = (p.flow.dst, p.flow.src);
    let f = pkt.data_mut();
    let et = if p.v6 { ethertype::IPV6 } else { ethertype::IPV4 };
    write_eth(f, dst_mac, src_mac, vlan, et);
    let (ip, msg) = f[l2..].split_at_mut(ip_len);
    let msg_len = ICMP_LEN + quote;
    if p.v6 {
        ip[..4].copy_from_slice(&[0x60, 0, 0, 0]);
        ip[v6::PAYLOAD_LEN..v6::PAYLOAD_LEN + 2].copy_from_slice(&(msg_len as u16).to_be_bytes());
        ip[v6::NEXT] = proto::ICMPV6;
        ip[v6::HOP_LIMIT] = 64;
        ip[v6::SRC..v6::SRC + 16].copy_from_slice(&vip.v6_bytes());
        ip[v6::DST..v6::DST + 16].copy_from_slice(&client.v6_bytes());
        // Packet too big: type 2, code 0, the MTU in 32 bits.
        msg[..4].copy_from_slice(&[2, 0, 0, 0]);
        msg[4..8].copy_from_slice(&u32::from(mtu).to_be_bytes());
        // The checksum covers a pseudo-header: addresses, length, next header.
        let pseudo = u64::from(checksum::sum(&ip[v6::SRC..v6::SRC + 32]))
            + u64::from(checksum::sum(&(msg_len as u32).to_be_bytes()))
            + u64::from(proto::ICMPV6);
        let c = !checksum::fold(pseudo + u64::from(checksum::sum(&msg[..msg_len])));
        msg[2..4].copy_from_slice(&c.to_be_bytes());
    } else {
        ip[0] = 0x45;
        ip[1] = 0;
        ip[v4::TOTAL_LEN..v4::TOTAL_LEN + 2].copy_from_slice(&((ip_len + msg_len) as u16).to_be_bytes());
        // Atomic (DF, id 0: RFC 6864): 576 bytes are never fragmented.
        ip[v4::ID..v4::ID + 2].copy_from_slice(&[0, 0]);
        ip[v4::FRAG..v4::FRAG + 2].copy_from_slice(&v4::DF.to_be_bytes());
        ip[v4::TTL] = 64;
        ip[v4::PROTO] = proto::ICMP;
        ip[v4::CHECK..v4::CHECK + 2].copy_from_slice(&[0, 0]);
        ip[v4::SRC..v4::SRC + 4].copy_from_slice(&vip.v4_bytes());
        ip[v4::DST..v4::DST + 4].copy_from_slice(&client.v4_bytes());
        let c = checksum::checksum(ip);
        ip[v4::CHECK..v4::CHECK + 2].copy_from_slice(&c.to_be_bytes());
        // Destination unreachable, fragmentation needed: the next-hop MTU
        // in the low 16 bits of the second word.
        msg[..6].copy_from_slice(&[3, 4, 0, 0, 0, 0]);
        msg[6..8].copy_from_slice(&mtu.to_be_bytes());
        let c = checksum::checksum(&msg[..msg_len]);
        msg[2..4].copy_from_slice(&c.to_be_bytes());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_bucket() {
        let mut r = RateLimit::new(1000, 2);
        assert!(r.take(5) && r.take(5) && !r.take(5), "a burst of 2");
        assert!(r.take(6) && !r.take(6), "one a millisecond");
        assert!(!r.take(3), "a clock going back gives nothing");
        assert!(r.take(7));
        let mut none = RateLimit::new(0, 0);
        assert!(!none.take(1_000_000));
    }

    #[test]
    fn hosts_that_may_get_errors() {
        for a in ["10.0.0.1", "198.51.100.7", "2001:db8::1", "::2"] {
            assert!(unicast_host(a.parse().unwrap_or_default()), "{a}");
        }
        for a in ["0.0.0.0", "0.1.2.3", "127.0.0.1", "224.0.0.1", "239.1.1.1", "240.0.0.1", "255.255.255.255", "::", "::1", "ff02::1"] {
            assert!(!unicast_host(a.parse().unwrap_or_default()), "{a}");
        }
    }
}

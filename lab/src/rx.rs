//! The receive side of the generator: finds the stamp of each frame that
//! comes back, and counts received, reordered and duplicate frames per
//! flow, frames per endpoint and the latency from the stamp's timestamp.
//!
//! Everything is sized when the receiver is made: one sequence slot per
//! flow, a fixed open-addressed endpoint table ([`MAX_ENDPOINTS`]) and a
//! histogram with fixed bounds. [`Receiver::on_frame`] never allocates.
//!
//! Sequence accounting per flow: the highest sequence number seen so far
//! is remembered; a frame below it arrived after a later one (reordered),
//! a frame equal to it is a duplicate. Frames lost are what was sent and
//! never came back (the sender's count minus [`Receiver::received`]).

use std::net::IpAddr;

use hdrhistogram::Histogram;

use crate::stamp::{self, STAMP_LEN};
use sluice_dataplane::parse::{ethertype, proto, ETH_LEN};

/// Endpoints told apart; more are counted together as overflow.
pub(crate) const MAX_ENDPOINTS: usize = 4096;
const TABLE: usize = MAX_ENDPOINTS * 2;
/// Highest latency the histogram holds (ns); above it, recorded as this.
pub(crate) const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// How the endpoint a frame went to is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointBy {
    /// Destination MAC, or the outer destination address when the frame is
    /// IP-in-IP (IPIP or IPv6 in IP).
    Auto,
    /// Destination MAC.
    Mac,
    /// Outermost destination IP address (IPIP, GUE, ...).
    OuterIp,
}

/// An endpoint, as told from a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// By destination MAC.
    Mac([u8; 6]),
    /// By outer destination address.
    Ip(IpAddr),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Mac(m) => {
                write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
            }
            Endpoint::Ip(a) => write!(f, "{a}"),
        }
    }
}

/// Where the stamp of a frame is and which endpoint it went to.
#[inline]
pub(crate) fn locate(frame: &[u8], by: EndpointBy) -> Option<(usize, Endpoint)> {
    if frame.len() < ETH_LEN {
        return None;
    }
    let mut l3 = ETH_LEN;
    let mut et = u16::from_be_bytes([frame[12], frame[13]]);
    for _ in 0..2 {
        if et != ethertype::VLAN && et != ethertype::QINQ && et != ethertype::QINQ_OLD {
            break;
        }
        let b = frame.get(l3 + 2..l3 + 4)?;
        et = u16::from_be_bytes([b[0], b[1]]);
        l3 += 4;
    }
    let mac = || {
        let mut m = [0u8; 6];
        m.copy_from_slice(&frame[..6]);
        Endpoint::Mac(m)
    };
    let (end, next, dst) = match et {
        ethertype::IPV4 => {
            let h = frame.get(l3..l3 + 20)?;
            let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
            let dst = IpAddr::from([h[16], h[17], h[18], h[19]]);
            (l3 + total, h[9], dst)
        }
        ethertype::IPV6 => {
            let h = frame.get(l3..l3 + 40)?;
            let plen = usize::from(u16::from_be_bytes([h[4], h[5]]));
            let mut d = [0u8; 16];
            d.copy_from_slice(&h[24..40]);
            (l3 + 40 + plen, h[6], IpAddr::from(d))
        }
        _ => return None,
    };
    if end > frame.len() || end < l3 + 20 + STAMP_LEN {
        return None;
    }
    let ep = match by {
        EndpointBy::Mac => mac(),
        EndpointBy::OuterIp => Endpoint::Ip(dst),
        EndpointBy::Auto if next == proto::IPIP || next == proto::IPV6 => Endpoint::Ip(dst),
        EndpointBy::Auto => mac(),
    };
    Some((end - STAMP_LEN, ep))
}

/// Frames per endpoint, in a fixed table.
#[derive(Clone, Debug)]
struct Endpoints {
    slots: Vec<Option<(Endpoint, u64)>>,
    used: usize,
    overflow: u64,
}

impl Endpoints {
    fn new() -> Endpoints {
        Endpoints { slots: vec![None; TABLE], used: 0, overflow: 0 }
    }

    fn slot_of(e: &Endpoint) -> usize {
        // FNV-1a over the key's bytes.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |b: u8| {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        };
        match e {
            Endpoint::Mac(m) => m.iter().copied().for_each(&mut eat),
            Endpoint::Ip(IpAddr::V4(a)) => a.octets().iter().copied().for_each(&mut eat),
            Endpoint::Ip(IpAddr::V6(a)) => a.octets().iter().copied().for_each(&mut eat),
        }
        usize::try_from(h % TABLE as u64).unwrap_or(0)
    }

    #[inline]
    fn count(&mut self, e: Endpoint) {
        let mut i = Self::slot_of(&e);
        loop {
            match &mut self.slots[i] {
                Some((k, n)) if *k == e => {
                    *n += 1;
                    return;
                }
                Some(_) => i = (i + 1) % TABLE,
                slot @ None => {
                    if self.used >= MAX_ENDPOINTS {
                        self.overflow += 1;
                    } else {
                        *slot = Some((e, 1));
                        self.used += 1;
                    }
                    return;
                }
            }
        }
    }
}

/// What came back.
#[derive(Clone, Debug)]
pub struct Receiver {
    by: EndpointBy,
    /// Highest sequence number seen plus one, per flow (0: none yet).
    next: Vec<u64>,
    /// Nanoseconds per clock tick, times 2^32.
    ns_per_tick_q32: u128,
    endpoints: Endpoints,
    /// Latency in ns of every stamped frame.
    pub latency: Histogram<u64>,
    /// Stamped frames received (of known flows).
    pub received: u64,
    /// Bytes of those frames.
    pub received_bytes: u64,
    /// Frames without a stamp (not the generator's, or replayed unchanged).
    pub unstamped: u64,
    /// Stamped frames naming a flow this run does not have.
    pub unknown_flow: u64,
    /// Frames that arrived after a later frame of their flow.
    pub reordered: u64,
    /// Frames whose sequence number had already arrived.
    pub duplicates: u64,
    /// Frames whose timestamp lies in the future (another clock).
    pub clock_skew: u64,
}

impl Receiver {
    /// A receiver for `flows` flows on a clock of `hz` ticks per second.
    pub fn new(flows: u32, hz: u64, by: EndpointBy) -> Result<Receiver, hdrhistogram::CreationError> {
        let latency = Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)?;
        Ok(Receiver {
            by,
            next: vec![0; usize::try_from(flows).unwrap_or(0)],
            ns_per_tick_q32: (1_000_000_000u128 << 32) / u128::from(hz.max(1)),
            endpoints: Endpoints::new(),
            latency,
            received: 0,
            received_bytes: 0,
            unstamped: 0,
            unknown_flow: 0,
            reordered: 0,
            duplicates: 0,
            clock_skew: 0,
        })
    }

    /// Accounts for one received frame at clock tick `now`.
    #[inline]
    pub(crate) fn on_frame(&mut self, frame: &[u8], now: u64) {
        let Some((at, ep)) = locate(frame, self.by) else {
            self.unstamped += 1;
            return;
        };
        let Some(s) = stamp::read(&frame[at..]) else {
            self.unstamped += 1;
            return;
        };
        let Some(slot) = usize::try_from(s.flow).ok().and_then(|f| self.next.get_mut(f)) else {
            self.unknown_flow += 1;
            return;
        };
        let seq = u64::from(s.seq) + 1;
        if seq > *slot {
            *slot = seq;
        } else if seq == *slot {
            self.duplicates += 1;
        } else {
            self.reordered += 1;
        }
        self.received += 1;
        self.received_bytes += frame.len() as u64;
        self.endpoints.count(ep);
        if s.tsc > now {
            self.clock_skew += 1;
        } else {
            let ns = (u128::from(now - s.tsc) * self.ns_per_tick_q32) >> 32;
            self.latency.saturating_record(u64::try_from(ns).unwrap_or(u64::MAX).max(1));
        }
    }

    /// Frames per endpoint, most first.
    pub fn endpoints(&self) -> Vec<(Endpoint, u64)> {
        let mut v: Vec<(Endpoint, u64)> = self.endpoints.slots.iter().flatten().copied().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.to_string().cmp(&b.0.to_string())));
        v
    }

    /// Stamped frames of endpoints beyond [`MAX_ENDPOINTS`].
    pub fn endpoint_overflow(&self) -> u64 {
        self.endpoints.overflow
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // small test numbers
mod tests {
    use super::*;
    use sluice_dataplane::craft;

    fn framed(flow: u32, seq: u32, tsc: u64, dst_mac: u8) -> Vec<u8> {
        let mut payload = [0u8; 8 + STAMP_LEN];
        stamp::write_template(&mut payload[8..], flow);
        stamp::write_varying(&mut payload[8..], seq, tsc);
        let udp = craft::udp(1, 2, &payload[8..]);
        craft::ether_with([2, 0, 0, 0, 0, dst_mac], [2, 0, 0, 0, 0, 1], &[], ethertype::IPV4, &craft::ipv4([1, 1, 1, 1], [2, 2, 2, 2], proto::UDP, &udp))
    }

    #[test]
    fn sequence_accounting() {
        let mut r = Receiver::new(2, 1_000_000_000, EndpointBy::Auto).unwrap();
        for (flow, seq) in [(0, 0), (0, 1), (0, 3), (0, 2), (1, 0), (0, 3), (1, 5), (1, 4), (0, 4)] {
            r.on_frame(&framed(flow, seq, 10, 7), 1000);
        }
        assert_eq!(r.received, 9);
        assert_eq!(r.reordered, 2, "0/2 after 0/3, 1/4 after 1/5");
        assert_eq!(r.duplicates, 1, "0/3 twice");
        r.on_frame(&framed(2, 0, 10, 7), 1000);
        assert_eq!(r.unknown_flow, 1);
        let mut junk = framed(0, 9, 10, 7);
        let n = junk.len();
        junk[n - STAMP_LEN] ^= 0xff;
        r.on_frame(&junk, 1000);
        r.on_frame(&[0u8; 10], 1000);
        assert_eq!(r.unstamped, 2);
        assert_eq!(r.received, 9);
    }

    #[test]
    fn latency_in_nanoseconds_and_padding_ignored() {
        // 2 GHz clock: 2000 ticks = 1 us.
        let mut r = Receiver::new(1, 2_000_000_000, EndpointBy::Auto).unwrap();
        let mut f = framed(0, 0, 1_000, 7);
        f.extend_from_slice(&[0xaa; 6]); // Ethernet padding after the IP packet
        r.on_frame(&f, 3_000);
        assert_eq!(r.received, 1);
        let v = r.latency.value_at_quantile(0.5);
        assert!((999..=1001).contains(&v), "{v}");
        r.on_frame(&framed(0, 1, 5_000, 7), 3_000);
        assert_eq!(r.clock_skew, 1);
    }

    #[test]
    fn endpoints_by_mac_and_by_outer_address() {
        let mut r = Receiver::new(1, 1000, EndpointBy::Auto).unwrap();
        for (i, mac) in [7u8, 8, 7, 7].into_iter().enumerate() {
            r.on_frame(&framed(0, i as u32, 0, mac), 0);
        }
        // IPIP to 10.0.0.9 around the same frame.
        let inner = framed(0, 9, 0, 7);
        let ipip = craft::ether(&[], ethertype::IPV4, &craft::ipv4([9, 9, 9, 9], [10, 0, 0, 9], proto::IPIP, &inner[ETH_LEN..]));
        r.on_frame(&ipip, 0);
        let eps = r.endpoints();
        assert_eq!(eps[0], (Endpoint::Mac([2, 0, 0, 0, 0, 7]), 3));
        assert!(eps.contains(&(Endpoint::Mac([2, 0, 0, 0, 0, 8]), 1)));
        assert!(eps.contains(&(Endpoint::Ip("10.0.0.9".parse().unwrap()), 1)));
        assert_eq!(r.received, 5);
    }

    #[test]
    fn endpoint_table_overflows_into_a_count() {
        let mut e = Endpoints::new();
        for i in 0..(MAX_ENDPOINTS as u32 + 10) {
            e.count(Endpoint::Ip(IpAddr::from(i.to_be_bytes())));
        }
        assert_eq!(e.used, MAX_ENDPOINTS);
        assert_eq!(e.overflow, 10);
    }
}

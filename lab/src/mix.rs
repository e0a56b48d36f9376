//! The flow mix: which frames the generator sends, built once before it
//! starts as templates (complete frames with valid checksums and a stamp
//! whose varying part is zero).
//!
//! Flow `i` goes to VIP `vips[i % V]`, destination port
//! `ports[(i / V) % P]`, with transport `kinds[i % K]` and frame size
//! `sizes[i % S]`; its source address is the client base plus `i + 1` and
//! its source port `1024 + i % 64000`, so every flow has its own 5-tuple.
//! A UDP flow is sent as two IP fragments when `i % 100 <
//! fragment_percent`; each fragment ends with its own stamp.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use sluice_dataplane::craft;
use crate::stamp::{self, STAMP_LEN};
use sluice_dataplane::parse::{ethertype, proto, v4, ETH_LEN};

/// Bytes of the Ethernet frame check sequence, which frame sizes include
/// and DPDK adds.
pub(crate) const FCS_LEN: usize = 4;
/// Smallest frame size (with FCS).
pub(crate) const MIN_FRAME: u16 = 64;
/// Largest frame size (with FCS): an untagged 1500-byte IP packet.
pub const MAX_FRAME: u16 = 1518;

/// Transport of a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// TCP segments with only SYN set.
    TcpSyn,
    /// TCP segments with ACK and PSH set.
    TcpData,
    /// UDP datagrams.
    Udp,
}


/// What to generate.
#[derive(Clone, Debug)]
pub struct MixSpec {
    /// Number of flows (distinct 5-tuples).
    pub flows: u32,
    /// Destination addresses (VIPs); IPv4 and IPv6 may be mixed.
    pub vips: Vec<IpAddr>,
    /// Destination ports.
    pub ports: Vec<u16>,
    /// Transports.
    pub kinds: Vec<Kind>,
    /// Frame sizes in bytes, FCS included.
    pub sizes: Vec<u16>,
    /// Percent (0..=100) of UDP flows sent as two fragments.
    pub fragment_percent: u8,
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Destination MAC (the appliance's port).
    pub dst_mac: [u8; 6],
    /// IPv4 clients are this address plus 1, 2, ...
    pub client_v4: Ipv4Addr,
    /// IPv6 clients are this address plus 1, 2, ...
    pub client_v6: Ipv6Addr,
}

/// Why a flow mix cannot be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MixError {
    /// A list the mix needs is empty.
    #[error("the flow mix needs at least one {0}")]
    Empty(&'static str),
    /// A frame size out of range.
    #[error("frame size {0} is outside {MIN_FRAME}..={MAX_FRAME} bytes (FCS included)")]
    Size(u16),
    /// Too many flows.
    #[error("{0} flows asked, at most {MAX_FLOWS}")]
    TooManyFlows(u32),
    /// A bad fragment share.
    #[error("fragment share {0}% is above 100%")]
    Fragments(u8),
}

/// Most flows a mix may have (templates are built for each).
pub(crate) const MAX_FLOWS: u32 = 4_000_000;

/// Where the per-packet IP identification goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IpId {
    /// IPv4 identification at this offset; the header checksum at the other.
    V4 {
        /// Offset of the 16-bit identification.
        id: usize,
        /// Offset of the header checksum.
        check: usize,
    },
    /// IPv6 fragment header identification (32 bits) at this offset.
    V6(usize),
}

/// One frame of a datagram.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct FrameTemplate {
    /// The frame, without FCS, stamp zeroed.
    pub(crate) bytes: Vec<u8>,
    /// Offset of its stamp (none: a frame replayed unchanged).
    pub(crate) stamp: Option<usize>,
    /// Whether the stamp sits at an odd offset from the start of what the
    /// transport checksum covers.
    pub(crate) stamp_odd: bool,
    /// Where the datagram's identification goes (fragments only).
    pub(crate) ip_id: Option<IpId>,
}

impl fmt::Debug for FrameTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameTemplate").field("len", &self.bytes.len()).field("stamp", &self.stamp).finish()
    }
}

/// The transport checksum a datagram's stamps update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct L4Check {
    /// Offset of the checksum field in the first frame.
    pub(crate) offset: usize,
    /// UDP: a zero result is sent as 0xffff.
    pub(crate) udp: bool,
}

/// What one send of a flow puts on the wire: one frame, or the fragments
/// of one datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Datagram {
    /// The flow id carried in the stamps.
    pub(crate) flow: u32,
    /// Its frames, in order.
    pub(crate) frames: Vec<FrameTemplate>,
    /// The transport checksum to keep right, if any.
    pub(crate) l4_check: Option<L4Check>,
}

/// A [`Slot`] has a stamp.
pub(crate) const STAMPED: u8 = 1;
/// Its stamp sits at an odd offset from the start of what the transport
/// checksum covers.
pub(crate) const ODD: u8 = 2;
/// It carries the datagram's IPv4 identification (`id`, header checksum
/// at `id_check`).
pub(crate) const V4_ID: u8 = 4;
/// It carries the datagram's IPv6 fragment identification (`id`).
pub(crate) const V6_ID: u8 = 8;
/// It holds the transport checksum (at `l4`) that its datagram's stamps
/// update.
pub(crate) const L4: u8 = 16;
/// That checksum is UDP's (a zero result is sent as 0xffff).
pub(crate) const UDP: u8 = 32;

/// One frame as the sender reads it: where its bytes lie in
/// [`Plan::bytes`], and what it writes into each copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Offset of its bytes in the arena.
    pub(crate) off: usize,
    /// Its length.
    pub(crate) len: u16,
    /// Offset of the stamp ([`STAMPED`]).
    pub(crate) stamp: u16,
    /// Offset of the identification ([`V4_ID`], [`V6_ID`]).
    pub(crate) id: u16,
    /// Offset of the IPv4 header checksum ([`V4_ID`]).
    pub(crate) id_check: u16,
    /// Offset of the transport checksum ([`L4`]).
    pub(crate) l4: u16,
    /// The template's transport checksum, inverted ([`L4`]).
    pub(crate) l4_inverted: u16,
    /// [`STAMPED`], [`ODD`], [`V4_ID`], [`V6_ID`], [`L4`], [`UDP`].
    pub(crate) flags: u8,
    /// Frames of the datagram this frame starts; 0 for a later fragment.
    pub(crate) frames: u8,
    /// The flow id its stamp carries.
    pub(crate) flow: u32,
}

/// Every frame of a mix in send order, their bytes back to back in one
/// arena: a frame is one slot read and one copy, with no pointer to
/// follow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The frames' bytes.
    pub(crate) bytes: Vec<u8>,
    /// One per frame.
    pub(crate) slots: Vec<Slot>,
    /// Where each datagram's first frame is in `slots`.
    pub(crate) starts: Vec<u32>,
    /// Every datagram is one frame (slot `i` is datagram `i`).
    pub(crate) single: bool,
}

/// Why a mix cannot be laid out for sending.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// A frame longer than 65,535 bytes, a datagram of more than 255
    /// frames, more than 2^32 frames, or a transport checksum outside its
    /// frame.
    #[error(
        "datagram {0} cannot be laid out for sending (frames of at most 65535 bytes, at most 255 per datagram, \
         2^32 in all, a transport checksum inside its frame)"
    )]
    Layout(usize),
}

impl Plan {
    /// Lays `datagrams` out in one arena, in order.
    pub fn new(datagrams: &[Datagram]) -> Result<Plan, PlanError> {
        let total: usize = datagrams.iter().flat_map(|d| &d.frames).map(|f| f.bytes.len()).sum();
        let frames: usize = datagrams.iter().map(|d| d.frames.len()).sum();
        let mut plan = Plan {
            bytes: Vec::with_capacity(total),
            slots: Vec::with_capacity(frames),
            starts: Vec::with_capacity(datagrams.len()),
            single: frames == datagrams.len(),
        };
        let u16_of = |v: usize, i: usize| u16::try_from(v).map_err(|_| PlanError::Layout(i));
        for (i, d) in datagrams.iter().enumerate() {
            plan.starts.push(u32::try_from(plan.slots.len()).map_err(|_| PlanError::Layout(i))?);
            let n = u8::try_from(d.frames.len()).map_err(|_| PlanError::Layout(i))?;
            for (k, t) in d.frames.iter().enumerate() {
                let mut s = Slot {
                    off: plan.bytes.len(),
                    len: u16_of(t.bytes.len(), i)?,
                    stamp: 0,
                    id: 0,
                    id_check: 0,
                    l4: 0,
                    l4_inverted: 0,
                    flags: 0,
                    frames: if k == 0 { n } else { 0 },
                    flow: d.flow,
                };
                if let Some(at) = t.stamp {
                    s.stamp = u16_of(at, i)?;
                    s.flags |= STAMPED | if t.stamp_odd { ODD } else { 0 };
                }
                match t.ip_id {
                    Some(IpId::V4 { id, check }) => {
                        s.id = u16_of(id, i)?;
                        s.id_check = u16_of(check, i)?;
                        s.flags |= V4_ID;
                    }
                    Some(IpId::V6(id)) => {
                        s.id = u16_of(id, i)?;
                        s.flags |= V6_ID;
                    }
                    None => {}
                }
                if let (0, Some(c)) = (k, d.l4_check) {
                    let Some(&[hi, lo]) = t.bytes.get(c.offset..c.offset + 2) else {
                        return Err(PlanError::Layout(i));
                    };
                    s.l4 = u16_of(c.offset, i)?;
                    s.l4_inverted = !u16::from_be_bytes([hi, lo]);
                    s.flags |= L4 | if c.udp { UDP } else { 0 };
                }
                plan.bytes.extend_from_slice(&t.bytes);
                plan.slots.push(s);
            }
        }
        Ok(plan)
    }

    /// How many datagrams it sends in a round.
    pub fn datagrams(&self) -> usize {
        self.starts.len()
    }

    /// The bytes of `slot`.
    #[inline(always)]
    pub(crate) fn frame(&self, slot: &Slot) -> &[u8] {
        &self.bytes[slot.off..slot.off + usize::from(slot.len)]
    }
}

fn nth_v4(base: Ipv4Addr, i: u32) -> [u8; 4] {
    u32::from(base).wrapping_add(i).to_be_bytes()
}

fn nth_v6(base: Ipv6Addr, i: u32) -> [u8; 16] {
    u128::from(base).wrapping_add(u128::from(i)).to_be_bytes()
}

/// Builds the datagram of every flow of `spec`, in flow order.
pub fn build(spec: &MixSpec) -> Result<Vec<Datagram>, MixError> {
    if spec.flows == 0 {
        return Err(MixError::Empty("flow"));
    }
    if spec.flows > MAX_FLOWS {
        return Err(MixError::TooManyFlows(spec.flows));
    }
    for (list, what) in [
        (spec.vips.is_empty(), "VIP"),
        (spec.ports.is_empty(), "destination port"),
        (spec.kinds.is_empty(), "transport"),
        (spec.sizes.is_empty(), "frame size"),
    ] {
        if list {
            return Err(MixError::Empty(what));
        }
    }
    if let Some(s) = spec.sizes.iter().find(|s| !(MIN_FRAME..=MAX_FRAME).contains(*s)) {
        return Err(MixError::Size(*s));
    }
    if spec.fragment_percent > 100 {
        return Err(MixError::Fragments(spec.fragment_percent));
    }
    let n = |len: usize, i: u32| usize::try_from(i).unwrap_or(0) % len;
    let mut out = Vec::with_capacity(usize::try_from(spec.flows).unwrap_or(0));
    for i in 0..spec.flows {
        let vip = spec.vips[n(spec.vips.len(), i)];
        let dport = spec.ports[n(spec.ports.len(), i / u32::try_from(spec.vips.len()).unwrap_or(1).max(1))];
        let kind = spec.kinds[n(spec.kinds.len(), i)];
        let size = usize::from(spec.sizes[n(spec.sizes.len(), i)]);
        let sport = u16::try_from(1024 + i % 64000).unwrap_or(1024);
        let fragmented = kind == Kind::Udp && i % 100 < u32::from(spec.fragment_percent);
        let d = match vip {
            IpAddr::V4(dst) => {
                let src = nth_v4(spec.client_v4, i + 1);
                flow_v4(spec, i, src, dst.octets(), sport, dport, kind, size, fragmented)
            }
            IpAddr::V6(dst) => {
                let src = nth_v6(spec.client_v6, i + 1);
                flow_v6(spec, i, src, dst.octets(), sport, dport, kind, size, fragmented)
            }
        };
        out.push(d);
    }
    Ok(out)
}

/// Transport header length and protocol number of `kind`.
fn l4_header(kind: Kind) -> (usize, u8) {
    match kind {
        Kind::TcpSyn | Kind::TcpData => (20, proto::TCP),
        Kind::Udp => (8, proto::UDP),
    }
}

/// The transport segment (header with a zero checksum, payload with the
/// stamps in place at `stamps`, offsets from the segment's start).
fn segment(kind: Kind, sport: u16, dport: u16, len: usize, flow: u32, stamps: &[usize]) -> Vec<u8> {
    let (hdr, _) = l4_header(kind);
    let mut payload = vec![0u8; len - hdr];
    for &s in stamps {
        stamp::write_template(&mut payload[s - hdr..], flow);
    }
    match kind {
        Kind::TcpSyn => craft::tcp(sport, dport, 0x02, &payload),
        Kind::TcpData => craft::tcp(sport, dport, 0x18, &payload),
        Kind::Udp => craft::udp(sport, dport, &payload),
    }
}

/// Checksum field offset within the transport header.
fn check_offset(kind: Kind) -> usize {
    match kind {
        Kind::TcpSyn | Kind::TcpData => 16,
        Kind::Udp => 6,
    }
}

/// IP payload bytes of the first fragment: a multiple of 8 (fragment
/// offsets count 8-byte units) that fits in `room`, so the frame is never
/// larger than the size asked; at least the transport header and a stamp
/// (rounded up), which only sizes far below any MTU cannot hold.
fn first_fragment_len(room: usize, hdr: usize) -> usize {
    (room / 8 * 8).max((hdr + STAMP_LEN).div_ceil(8) * 8)
}

#[allow(clippy::too_many_arguments)]
fn flow_v4(
    spec: &MixSpec,
    flow: u32,
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    kind: Kind,
    size: usize,
    fragmented: bool,
) -> Datagram {
    let (hdr, protocol) = l4_header(kind);
    let l3 = ETH_LEN;
    let room = (size - FCS_LEN).saturating_sub(l3 + 20);
    let eth = |ip: &[u8]| craft::ether_with(spec.dst_mac, spec.src_mac, &[], ethertype::IPV4, ip);
    let l4_check = Some(L4Check { offset: l3 + 20 + check_offset(kind), udp: kind == Kind::Udp });
    if !fragmented {
        let len = room.max(hdr + STAMP_LEN);
        let seg = segment(kind, sport, dport, len, flow, &[len - STAMP_LEN]);
        let ip = craft::with_l4_checksum(craft::ipv4(src, dst, protocol, &seg), 20);
        let bytes = eth(&ip);
        let stamp = Some(bytes.len() - STAMP_LEN);
        let stamp_odd = (len - STAMP_LEN) % 2 == 1;
        return Datagram { flow, frames: vec![FrameTemplate { bytes, stamp, stamp_odd, ip_id: None }], l4_check };
    }
    let first = first_fragment_len(room, hdr);
    let second = room.max(STAMP_LEN);
    let total = first + second;
    let seg = segment(kind, sport, dport, total, flow, &[first - STAMP_LEN, total - STAMP_LEN]);
    let whole = craft::with_l4_checksum(craft::ipv4(src, dst, protocol, &seg), 20);
    let seg = &whole[20..];
    let off8 = u16::try_from(first / 8).unwrap_or(0);
    let f0 = eth(&craft::ipv4_full(src, dst, protocol, 64, 0, v4::MF, &[], &seg[..first]));
    let f1 = eth(&craft::ipv4_full(src, dst, protocol, 64, 0, off8, &[], &seg[first..]));
    let id = Some(IpId::V4 { id: l3 + v4::ID, check: l3 + v4::CHECK });
    let frames = vec![
        FrameTemplate { stamp: Some(f0.len() - STAMP_LEN), bytes: f0, stamp_odd: (first - STAMP_LEN) % 2 == 1, ip_id: id },
        FrameTemplate { stamp: Some(f1.len() - STAMP_LEN), bytes: f1, stamp_odd: (total - STAMP_LEN) % 2 == 1, ip_id: id },
    ];
    Datagram { flow, frames, l4_check }
}

#[allow(clippy::too_many_arguments)]
fn flow_v6(
    spec: &MixSpec,
    flow: u32,
    src: [u8; 16],
    dst: [u8; 16],
    sport: u16,
    dport: u16,
    kind: Kind,
    size: usize,
    fragmented: bool,
) -> Datagram {
    let (hdr, protocol) = l4_header(kind);
    let l3 = ETH_LEN;
    let eth = |ip: &[u8]| craft::ether_with(spec.dst_mac, spec.src_mac, &[], ethertype::IPV6, ip);
    if !fragmented {
        let len = (size - FCS_LEN).saturating_sub(l3 + 40).max(hdr + STAMP_LEN);
        let seg = segment(kind, sport, dport, len, flow, &[len - STAMP_LEN]);
        let ip = craft::with_l4_checksum(craft::ipv6(src, dst, protocol, &seg), 40);
        let bytes = eth(&ip);
        let l4_check = Some(L4Check { offset: l3 + 40 + check_offset(kind), udp: kind == Kind::Udp });
        let stamp = Some(bytes.len() - STAMP_LEN);
        let stamp_odd = (len - STAMP_LEN) % 2 == 1;
        return Datagram { flow, frames: vec![FrameTemplate { bytes, stamp, stamp_odd, ip_id: None }], l4_check };
    }
    let room = (size - FCS_LEN).saturating_sub(l3 + 40 + 8);
    let first = first_fragment_len(room, hdr);
    let second = room.max(STAMP_LEN);
    let total = first + second;
    let seg = segment(kind, sport, dport, total, flow, &[first - STAMP_LEN, total - STAMP_LEN]);
    let whole = craft::with_l4_checksum(craft::ipv6(src, dst, protocol, &seg), 40);
    let seg = &whole[40..];
    let off8 = u16::try_from(first / 8).unwrap_or(0);
    let frag = |fh: [u8; 8], data: &[u8]| {
        let mut p = fh.to_vec();
        p.extend_from_slice(data);
        eth(&craft::ipv6(src, dst, proto::FRAGMENT, &p))
    };
    let f0 = frag(craft::ipv6_fragment_header(protocol, 0, true, 0), &seg[..first]);
    let f1 = frag(craft::ipv6_fragment_header(protocol, off8, false, 0), &seg[first..]);
    let id = Some(IpId::V6(l3 + 40 + 4));
    let l4_check = Some(L4Check { offset: l3 + 40 + 8 + check_offset(kind), udp: kind == Kind::Udp });
    let frames = vec![
        FrameTemplate { stamp: Some(f0.len() - STAMP_LEN), bytes: f0, stamp_odd: (first - STAMP_LEN) % 2 == 1, ip_id: id },
        FrameTemplate { stamp: Some(f1.len() - STAMP_LEN), bytes: f1, stamp_odd: (total - STAMP_LEN) % 2 == 1, ip_id: id },
    ];
    Datagram { flow, frames, l4_check }
}

/// A frame replayed as it is (from a pcap): no stamp, nothing rewritten.
pub fn raw(flow: u32, bytes: Vec<u8>) -> Datagram {
    Datagram { flow, frames: vec![FrameTemplate { bytes, stamp: None, stamp_odd: false, ip_id: None }], l4_check: None }
}

/// The mean size on the wire (FCS included) of one frame of `datagrams`,
/// for line-rate arithmetic.
pub fn mean_frame_size(datagrams: &[Datagram]) -> f64 {
    let (mut bytes, mut frames) = (0usize, 0usize);
    for d in datagrams {
        for f in &d.frames {
            bytes += f.bytes.len() + FCS_LEN;
            frames += 1;
        }
    }
    if frames == 0 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss)] // frame counts far below 2^52
    let mean = bytes as f64 / frames as f64;
    mean
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // small test numbers
mod tests {
    use super::*;
    use sluice_dataplane::parse::{parse, Fragment, Frame, Parsed};

    fn ip(b: &[u8]) -> Parsed {
        match parse(b) {
            Ok(Frame::Ip(p)) => p,
            other => panic!("not IP: {other:?}"),
        }
    }

    fn spec() -> MixSpec {
        MixSpec {
            flows: 12,
            vips: vec!["20.0.0.1".parse().unwrap(), "fd00::20".parse().unwrap()],
            ports: vec![80, 443, 53],
            kinds: vec![Kind::TcpSyn, Kind::TcpData, Kind::Udp],
            sizes: vec![64, 128, 1518],
            fragment_percent: 0,
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            client_v4: Ipv4Addr::new(30, 0, 0, 0),
            client_v6: "fd00:30::".parse().unwrap(),
        }
    }

    #[test]
    fn every_frame_parses_as_the_appliance_sees_it() {
        let ds = build(&spec()).unwrap();
        assert_eq!(ds.len(), 12);
        for d in &ds {
            assert_eq!(d.frames.len(), 1);
            let f = &d.frames[0];
            let flow = ip(&f.bytes).flow;
            let i = d.flow as usize;
            assert_eq!(flow.dst.to_string(), ["20.0.0.1", "fd00::20"][i % 2], "flow {i}");
            assert_eq!(flow.dport, [80, 443, 53][(i / 2) % 3]);
            assert_eq!(flow.sport, 1024 + i as u16);
            assert_eq!(flow.proto, [proto::TCP, proto::TCP, proto::UDP][i % 3]);
            assert_eq!(&f.bytes[..6], &[2, 0, 0, 0, 0, 2]);
            // The stamp ends the frame and carries the flow id.
            let at = f.stamp.unwrap();
            assert_eq!(at + STAMP_LEN, f.bytes.len());
            assert_eq!(stamp::read(&f.bytes[at..]).unwrap().flow, d.flow);
            // Sizes: as asked unless the headers and stamp need more.
            let asked = [64usize, 128, 1518][i % 3] - FCS_LEN;
            assert!(f.bytes.len() >= asked && (f.bytes.len() == asked || asked == 60), "flow {i}: {}", f.bytes.len());
        }
    }

    #[test]
    fn transport_checksums_verify() {
        for d in build(&spec()).unwrap() {
            let b = &d.frames[0].bytes;
            let ip = &b[ETH_LEN..];
            let v6 = ip[0] >> 4 == 6;
            let l4 = if v6 { 40 } else { 20 };
            let redone = craft::with_l4_checksum(ip.to_vec(), l4);
            assert_eq!(&redone[..], ip, "flow {}", d.flow);
            let off = d.l4_check.unwrap().offset;
            assert_ne!(u16::from_be_bytes([b[off], b[off + 1]]), 0);
        }
    }

    #[test]
    fn fragments_split_one_datagram_with_a_stamp_each() {
        let mut s = spec();
        // Six flows: each size over IPv4 and over IPv6, 1518 the largest
        // frame an MTU of 1500 carries.
        s.flows = 6;
        s.kinds = vec![Kind::Udp];
        s.fragment_percent = 100;
        s.sizes = vec![200, 1518, 203];
        for d in build(&s).unwrap() {
            assert_eq!(d.frames.len(), 2, "flow {}", d.flow);
            let asked = usize::from(s.sizes[d.flow as usize % 3]) - FCS_LEN;
            for f in &d.frames {
                assert_eq!(stamp::read(&f.bytes[f.stamp.unwrap()..]).unwrap().flow, d.flow);
                assert!(f.bytes.len() <= asked, "flow {}: a {}-byte frame for {asked} asked", d.flow, f.bytes.len());
            }
            // The first fragment is as large as a multiple of 8 allows, the
            // second exactly the size asked.
            assert!(d.frames[0].bytes.len() + 8 > asked, "flow {}: {}", d.flow, d.frames[0].bytes.len());
            assert_eq!(d.frames[1].bytes.len(), asked, "flow {}", d.flow);
            let first = ip(&d.frames[0].bytes);
            assert_eq!(first.flow.dport, [80, 443, 53][(d.flow as usize / 2) % 3]);
            assert_eq!(first.frag, Fragment::First);
            let second = ip(&d.frames[1].bytes);
            assert_eq!(second.frag, Fragment::Later);
            assert_eq!(usize::from(second.ip_end), d.frames[1].bytes.len());
        }
    }

    /// The plan holds every template's bytes, in send order, and what each
    /// frame writes per send.
    #[test]
    fn the_plan_lays_every_frame_out_in_order() {
        let mut s = spec();
        s.fragment_percent = 100;
        let ds = build(&s).unwrap();
        let plan = Plan::new(&ds).unwrap();
        assert!(!plan.single, "UDP flows are fragmented");
        assert_eq!(plan.datagrams(), ds.len());
        let mut k = 0;
        for (i, d) in ds.iter().enumerate() {
            assert_eq!(plan.starts[i] as usize, k);
            for (j, f) in d.frames.iter().enumerate() {
                let slot = plan.slots[k];
                assert_eq!(plan.frame(&slot), &f.bytes[..], "datagram {i} frame {j}");
                assert_eq!(usize::from(slot.frames), if j == 0 { d.frames.len() } else { 0 });
                assert_eq!(slot.flow, d.flow);
                assert_eq!(f.stamp.map(|_| usize::from(slot.stamp)), f.stamp);
                assert_eq!(slot.flags & STAMPED != 0, f.stamp.is_some());
                assert_eq!(slot.flags & ODD != 0, f.stamp_odd);
                match (f.ip_id, j, d.l4_check) {
                    (Some(IpId::V4 { id, check }), ..) => {
                        assert_eq!((usize::from(slot.id), usize::from(slot.id_check)), (id, check));
                        assert_eq!(slot.flags & (V4_ID | V6_ID), V4_ID);
                    }
                    (Some(IpId::V6(id)), ..) => {
                        assert_eq!(usize::from(slot.id), id);
                        assert_eq!(slot.flags & (V4_ID | V6_ID), V6_ID);
                    }
                    (None, ..) => assert_eq!(slot.flags & (V4_ID | V6_ID), 0),
                }
                if let (0, Some(c)) = (j, d.l4_check) {
                    assert_eq!(usize::from(slot.l4), c.offset);
                    assert_eq!(!slot.l4_inverted, u16::from_be_bytes([f.bytes[c.offset], f.bytes[c.offset + 1]]));
                    assert_eq!(slot.flags & UDP != 0, c.udp);
                } else {
                    assert_eq!(slot.flags & L4, 0);
                }
                k += 1;
            }
        }
        assert_eq!(k, plan.slots.len());
        let unfragmented = Plan::new(&build(&spec()).unwrap()).unwrap();
        assert!(unfragmented.single);
        assert_eq!(Plan::new(&[raw(0, vec![0; 70_000])]), Err(PlanError::Layout(0)));
    }

    #[test]
    fn bad_specs_are_refused() {
        let mut s = spec();
        s.sizes = vec![63];
        assert_eq!(build(&s), Err(MixError::Size(63)));
        let mut s = spec();
        s.vips.clear();
        assert_eq!(build(&s), Err(MixError::Empty("VIP")));
        let mut s = spec();
        s.flows = 0;
        assert_eq!(build(&s), Err(MixError::Empty("flow")));
        let mut s = spec();
        s.fragment_percent = 101;
        assert_eq!(build(&s), Err(MixError::Fragments(101)));
    }
}

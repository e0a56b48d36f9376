//! IPv4 fragmentation on output (RFC 791 3.2, as a router does it): a
//! frame whose IPv4 packet (without DF) is larger than its output's MTU
//! is sent as fragments of at most the MTU.
//!
//! The frames this happens to are whole datagrams that a kernel
//! reassembled before the appliance saw them (DPDK's af_packet driver has
//! the kernel defragment what its socket receives) or packets from a port
//! with a larger MTU than their output's. Every fragment carries the
//! frame's layer-2 header and the packet's identification; the first keeps
//! every IP option, later ones only those whose "copied" flag is set. A
//! packet that is itself a fragment keeps its offset and its MF flag on
//! the last of its pieces. The data of each fragment but the last is a
//! multiple of 8 bytes.
//!
//! Copying into new single-segment buffers, rather than chaining segments
//! that point into the original (as DPDK's `rte_ipv4_fragment_packet`
//! does), keeps every frame one contiguous buffer, which is what the
//! worker, the pipeline and the af_packet transmit path (which copies each
//! frame into its ring anyway) expect.

use crate::checksum;
use crate::parse::{ethertype, v4, ETH_LEN};

/// The most IP header bytes (header length 15 words).
const MAX_HEADER: usize = 60;

/// How a frame is cut into fragments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Offset of the IPv4 header in the frame (its layer-2 header's length).
    pub l3: usize,
    /// The IPv4 header's length, options included.
    pub header: usize,
    /// Bytes of IP data in the packet.
    pub data: usize,
    /// Bytes of IP data per fragment (a multiple of 8), the last excepted.
    pub per: usize,
    /// Number of fragments.
    pub count: usize,
}

/// Why a frame cannot be fragmented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not an IPv4 packet whose header and length agree with the frame.
    NotIpv4,
    /// DF is set.
    DontFragment,
    /// The MTU leaves no room for 8 bytes of data after the header.
    MtuTooSmall,
}

/// The plan for sending `frame` (Ethernet, untagged or with one 802.1Q
/// tag) out of an output of IP MTU `mtu`; `None` when it fits as it is.
pub fn plan(frame: &[u8], mtu: u16) -> Result<Option<Plan>, Refused> {
    let et = |at: usize| frame.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    let l3 = match et(12) {
        Some(ethertype::VLAN) => ETH_LEN + 4,
        _ => ETH_LEN,
    };
    if et(l3 - 2) != Some(ethertype::IPV4) {
        return Err(Refused::NotIpv4);
    }
    let ip = frame.get(l3..).ok_or(Refused::NotIpv4)?;
    let (Some(&vihl), Some(total)) = (ip.first(), ip.get(v4::TOTAL_LEN..v4::TOTAL_LEN + 2)) else {
        return Err(Refused::NotIpv4);
    };
    let header = usize::from(vihl & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([total[0], total[1]]));
    if vihl >> 4 != 4 || header < v4::MIN_LEN || total < header || total > ip.len() {
        return Err(Refused::NotIpv4);
    }
    if total <= usize::from(mtu) {
        return Ok(None);
    }
    let flags = u16::from_be_bytes([ip[v4::FRAG], ip[v4::FRAG + 1]]);
    if flags & v4::DF != 0 {
        return Err(Refused::DontFragment);
    }
    let per = usize::from(mtu).saturating_sub(header) & !7;
    if per == 0 {
        return Err(Refused::MtuTooSmall);
    }
    let data = total - header;
    Ok(Some(Plan { l3, header, data, per, count: data.div_ceil(per) }))
}

impl Plan {
    /// Length of fragment `i`'s frame.
    pub fn frame_len(&self, i: usize, later_header: usize) -> usize {
        let header = if i == 0 { self.header } else { later_header };
        self.l3 + header + self.data_len(i)
    }

    /// Bytes of IP data in fragment `i`.
    fn data_len(&self, i: usize) -> usize {
        if i + 1 < self.count {
            self.per
        } else {
            self.data - self.per * (self.count - 1)
        }
    }
}

/// The IP header of the fragments after the first, from `header` (the
/// packet's): the options whose copied flag is set, padded to a multiple
/// of 4 bytes with end-of-options. Returns the header and its length.
pub fn later_header(header: &[u8]) -> ([u8; MAX_HEADER], usize) {
    let mut h = [0u8; MAX_HEADER];
    h[..v4::MIN_LEN].copy_from_slice(&header[..v4::MIN_LEN]);
    let mut len = v4::MIN_LEN;
    let opts = &header[v4::MIN_LEN..];
    let mut at = 0;
    while at < opts.len() {
        let kind = opts[at];
        match kind {
            0 => break, // end of options
            1 => at += 1, // no-operation: not copied
            _ => {
                let Some(&n) = opts.get(at + 1) else { break };
                let n = usize::from(n);
                if n < 2 || at + n > opts.len() {
                    break;
                }
                if kind & 0x80 != 0 {
                    h[len..len + n].copy_from_slice(&opts[at..at + n]);
                    len += n;
                }
                at += n;
            }
        }
    }
    let len = len.next_multiple_of(4);
    h[0] = 0x40 | u8::try_from(len / 4).unwrap_or(15);
    (h, len)
}

/// Writes fragment `i` (not the first) of the frame `src`, cut as `p`
/// says, into `dst`, which is exactly [`Plan::frame_len`] bytes long;
/// `later` is the result of [`later_header`] for `src`'s IP header.
pub fn write(src: &[u8], p: &Plan, later: &([u8; MAX_HEADER], usize), i: usize, dst: &mut [u8]) {
    let ip = &src[p.l3..];
    let (header, hlen) = (&later.0[..later.1], later.1);
    let n = p.data_len(i);
    let from = p.header + p.per * i;
    dst[..p.l3].copy_from_slice(&src[..p.l3]);
    dst[p.l3..p.l3 + hlen].copy_from_slice(header);
    dst[p.l3 + hlen..p.l3 + hlen + n].copy_from_slice(&ip[from..from + n]);
    let flags = u16::from_be_bytes([ip[v4::FRAG], ip[v4::FRAG + 1]]);
    set_header(&mut dst[p.l3..p.l3 + hlen], p, flags, i, hlen + n);
}

/// Makes the frame that was cut as `p` says its first fragment, in place:
/// the caller then shortens it to `p.frame_len(0, _)` bytes.
pub fn first_in_place(frame: &mut [u8], p: &Plan) {
    let h = &mut frame[p.l3..p.l3 + p.header];
    let flags = u16::from_be_bytes([h[v4::FRAG], h[v4::FRAG + 1]]);
    set_header(h, p, flags, 0, p.header + p.data_len(0));
}

/// Sets the total length, the flags and offset of fragment `i` of a packet
/// whose own flags and offset were `flags`, and the header checksum.
fn set_header(h: &mut [u8], p: &Plan, flags: u16, i: usize, total: usize) {
    h[v4::TOTAL_LEN..v4::TOTAL_LEN + 2].copy_from_slice(&u16::try_from(total).unwrap_or(u16::MAX).to_be_bytes());
    let offset = (flags & v4::OFFSET_MASK) + u16::try_from(p.per * i / 8).unwrap_or(0);
    let more = i + 1 < p.count || flags & v4::MF != 0;
    let field = (offset & v4::OFFSET_MASK) | if more { v4::MF } else { 0 };
    h[v4::FRAG..v4::FRAG + 2].copy_from_slice(&field.to_be_bytes());
    h[v4::CHECK..v4::CHECK + 2].copy_from_slice(&[0, 0]);
    let c = checksum::checksum(h);
    h[v4::CHECK..v4::CHECK + 2].copy_from_slice(&c.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::craft;
    use crate::parse::proto;

    fn frame(ip: &[u8]) -> Vec<u8> {
        craft::ether(&[], ethertype::IPV4, ip)
    }

    fn fragments(f: &[u8], mtu: u16) -> Vec<Vec<u8>> {
        let p = plan(f, mtu).unwrap().unwrap();
        let later = later_header(&f[p.l3..p.l3 + p.header]);
        let mut out: Vec<Vec<u8>> = (1..p.count)
            .map(|i| {
                let mut d = vec![0u8; p.frame_len(i, later.1)];
                write(f, &p, &later, i, &mut d);
                d
            })
            .collect();
        let mut first = f.to_vec();
        first_in_place(&mut first, &p);
        first.truncate(p.frame_len(0, later.1));
        out.insert(0, first);
        out
    }

    /// Reassembles `frags` (frames) into the IP data, checking offsets.
    fn reassemble(frags: &[Vec<u8>]) -> Vec<u8> {
        let mut data = Vec::new();
        for (i, f) in frags.iter().enumerate() {
            let ip = &f[ETH_LEN..];
            let hl = usize::from(ip[0] & 0xf) * 4;
            assert_eq!(checksum::sum(&ip[..hl]), 0xffff, "fragment {i}: header checksum");
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            assert_eq!(total, ip.len(), "fragment {i}: total length");
            let fl = u16::from_be_bytes([ip[6], ip[7]]);
            assert_eq!(usize::from(fl & v4::OFFSET_MASK) * 8, data.len(), "fragment {i}: offset");
            assert!(data.len() % 8 == 0, "fragment {i}: the data before it is a multiple of 8");
            assert_eq!(fl & v4::MF != 0, i + 1 < frags.len(), "fragment {i}: MF");
            data.extend_from_slice(&ip[hl..]);
        }
        data
    }

    #[test]
    fn a_3028_byte_datagram_is_cut_into_three_fragments_of_at_most_the_mtu() {
        let payload: Vec<u8> = (0..3000u32).map(|i| u8::try_from(i % 251).unwrap()).collect();
        let udp = craft::udp(5000, 7000, &payload);
        let ip = craft::ipv4([10, 100, 0, 2], [20, 0, 0, 1], proto::UDP, &udp);
        assert_eq!(ip.len(), 3028);
        let f = frame(&ip);
        let frags = fragments(&f, 1500);
        let lens: Vec<usize> = frags.iter().map(|f| f.len() - ETH_LEN).collect();
        assert_eq!(lens, [1500, 1500, 68]);
        assert_eq!(reassemble(&frags), udp);
        for g in &frags {
            assert_eq!(g[..ETH_LEN], f[..ETH_LEN], "layer-2 header copied");
            assert_eq!(g[ETH_LEN + 4..ETH_LEN + 6], f[ETH_LEN + 4..ETH_LEN + 6], "same identification");
        }
        assert_eq!(plan(&f, 3028), Ok(None), "fits");
    }

    #[test]
    fn df_and_what_is_not_ipv4_are_refused() {
        let udp = craft::udp(1, 2, &[0u8; 2000]);
        let ip = craft::ipv4_full([1, 1, 1, 1], [2, 2, 2, 2], proto::UDP, 64, 9, v4::DF, &[], &udp);
        assert_eq!(plan(&frame(&ip), 1500), Err(Refused::DontFragment));
        let mut v6 = frame(&ip);
        v6[12..14].copy_from_slice(&ethertype::IPV6.to_be_bytes());
        assert_eq!(plan(&v6, 1500), Err(Refused::NotIpv4));
        let mut short = frame(&ip);
        short.truncate(1000);
        assert_eq!(plan(&short, 576), Err(Refused::NotIpv4), "total length beyond the frame");
    }

    #[test]
    fn a_fragment_keeps_its_offset_and_more_fragments_flag() {
        let data = vec![7u8; 2400];
        // A middle fragment: offset 185 (1480 bytes), MF.
        let ip = craft::ipv4_full([1, 1, 1, 1], [2, 2, 2, 2], proto::UDP, 64, 9, v4::MF | 185, &[], &data);
        let frags = fragments(&frame(&ip), 1000);
        let offsets: Vec<(u16, bool)> = frags
            .iter()
            .map(|f| {
                let fl = u16::from_be_bytes([f[ETH_LEN + 6], f[ETH_LEN + 7]]);
                (fl & v4::OFFSET_MASK, fl & v4::MF != 0)
            })
            .collect();
        assert_eq!(offsets, [(185, true), (185 + 122, true), (185 + 244, true)]);
    }

    #[test]
    fn later_fragments_carry_only_copied_options() {
        // Record route (7, not copied), NOP, security-like option 0x82 (copied), EOL.
        let opts = [7u8, 7, 4, 0, 0, 0, 0, 1, 0x82, 4, 0xaa, 0xbb];
        let ip = craft::ipv4_full([1, 1, 1, 1], [2, 2, 2, 2], proto::UDP, 64, 9, 0, &opts, &[1u8; 1200]);
        let frags = fragments(&frame(&ip), 576);
        assert_eq!(frags[0][ETH_LEN] & 0xf, 8, "the first keeps every option");
        assert_eq!(frags[1][ETH_LEN] & 0xf, 6, "later ones only the copied one");
        assert_eq!(frags[1][ETH_LEN + 20..ETH_LEN + 24], [0x82, 4, 0xaa, 0xbb]);
        assert_eq!(reassemble(&frags), vec![1u8; 1200]);
    }
}

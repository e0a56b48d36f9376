//! The stamp every generated frame carries: the last [`STAMP_LEN`] bytes of
//! its IP packet (of each fragment, for fragmented datagrams).
//!
//! Layout (big endian): magic `u32` ([`MAGIC`]), flow id `u32`, sequence
//! number `u32` (per flow, from 0), transmit timestamp `u64` (TSC ticks of
//! the generator). Encapsulation by the appliance (IPIP, GUE) only prepends
//! headers, so the stamp stays the last bytes of the outermost IP packet.
//!
//! Frames are built with the magic and flow id in place and zeros for the
//! sequence number and timestamp, checksums computed over that; at send
//! time the varying part is written and checksums are updated
//! incrementally ([`varying_sum`], [`add_to_checksum`]).

/// Bytes of the stamp.
pub(crate) const STAMP_LEN: usize = 20;
/// First four bytes of every stamp ("SLG1").
pub(crate) const MAGIC: u32 = 0x534c_4731;
/// Offset of the part written per packet (sequence number, timestamp).
pub(crate) const VARYING: usize = 8;

/// What a stamp says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// The flow the frame belongs to.
    pub(crate) flow: u32,
    /// Its number within the flow.
    pub(crate) seq: u32,
    /// When it was sent, in the generator's TSC ticks.
    pub(crate) tsc: u64,
}

/// Writes the constant part (magic, flow id) and zeroes the rest.
/// `buf` must hold at least [`STAMP_LEN`] bytes.
pub(crate) fn write_template(buf: &mut [u8], flow: u32) {
    buf[..4].copy_from_slice(&MAGIC.to_be_bytes());
    buf[4..8].copy_from_slice(&flow.to_be_bytes());
    buf[VARYING..STAMP_LEN].fill(0);
}

/// Writes the sequence number and timestamp.
#[inline(always)]
pub(crate) fn write_varying(buf: &mut [u8], seq: u32, tsc: u64) {
    buf[VARYING..VARYING + 4].copy_from_slice(&seq.to_be_bytes());
    buf[VARYING + 4..STAMP_LEN].copy_from_slice(&tsc.to_be_bytes());
}

/// Reads a stamp; `None` when the magic does not match.
#[inline]
pub(crate) fn read(buf: &[u8]) -> Option<Stamp> {
    let b: &[u8; STAMP_LEN] = buf.get(..STAMP_LEN)?.try_into().ok()?;
    if u32::from_be_bytes([b[0], b[1], b[2], b[3]]) != MAGIC {
        return None;
    }
    Some(Stamp {
        flow: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        seq: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
        tsc: u64::from_be_bytes([b[12], b[13], b[14], b[15], b[16], b[17], b[18], b[19]]),
    })
}

/// The one's-complement sum of the timestamp's four 16-bit words, once per
/// burst (every frame of a burst carries the same timestamp).
#[inline(always)]
pub(crate) fn tsc_words(tsc: u64) -> u64 {
    (tsc >> 48) + ((tsc >> 32) & 0xffff) + ((tsc >> 16) & 0xffff) + (tsc & 0xffff)
}

/// The one's-complement sum the varying part adds to a checksum when it
/// goes from zeros to (`seq`, a timestamp whose [`tsc_words`] are
/// `tsc_words`). `odd`: the stamp starts at an odd offset from the start
/// of what the checksum covers (RFC 1071: the sum of byte-swapped data is
/// the byte-swapped sum).
#[inline(always)]
pub(crate) fn varying_sum(seq: u32, tsc_words: u64, odd: bool) -> u64 {
    let s = fold_small(u64::from(seq >> 16) + u64::from(seq & 0xffff) + tsc_words);
    u64::from(if odd { s.swap_bytes() } else { s })
}

/// Checksum field value after `added` (a one's-complement sum of words
/// that went from zero to their new value, below 2^31) joined what it
/// covers; `inverted` is the field's value before, inverted.
#[inline(always)]
pub(crate) fn add_to_checksum(inverted: u16, added: u64) -> u16 {
    !fold_small(u64::from(inverted) + added)
}

/// Folds a one's-complement sum below 2^32 to 16 bits: two folds always
/// suffice (the first leaves at most 0x1fffe), so there is no loop to
/// mispredict.
#[inline(always)]
#[allow(clippy::cast_possible_truncation)] // two folds leave at most 16 bits
fn fold_small(acc: u64) -> u16 {
    debug_assert!(acc < 1 << 32);
    let a = (acc & 0xffff) + (acc >> 16);
    ((a & 0xffff) + (a >> 16)) as u16
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // small test numbers
mod tests {
    use super::*;
    use sluice_dataplane::checksum::checksum;

    #[test]
    fn round_trip_and_magic() {
        let mut b = [0xffu8; STAMP_LEN];
        write_template(&mut b, 7);
        assert_eq!(read(&b), Some(Stamp { flow: 7, seq: 0, tsc: 0 }));
        write_varying(&mut b, 0xdead_beef, 0x0102_0304_0506_0708);
        assert_eq!(read(&b), Some(Stamp { flow: 7, seq: 0xdead_beef, tsc: 0x0102_0304_0506_0708 }));
        b[0] ^= 1;
        assert_eq!(read(&b), None);
        assert_eq!(read(&b[..STAMP_LEN - 1]), None);
    }

    /// The incremental update equals a full recomputation, at even and odd
    /// offsets.
    #[test]
    fn incremental_checksum_matches_recomputation() {
        for lead in [0usize, 1, 2, 3, 7] {
            let mut data = vec![0u8; lead + STAMP_LEN + 3];
            for (i, b) in data.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(37);
            }
            write_template(&mut data[lead..], 99);
            let c0 = checksum(&data);
            for (seq, tsc) in [(1u32, 2u64), (u32::MAX, u64::MAX), (0x1234_5678, 0x9abc_def0_1122_3344)] {
                write_varying(&mut data[lead..], seq, tsc);
                let c1 = add_to_checksum(!c0, varying_sum(seq, tsc_words(tsc), lead % 2 == 1));
                let full = checksum(&data);
                // 0x0000 and 0xffff are the same one's-complement value.
                assert!(c1 == full || (c1 ^ full) == 0xffff && (c1 == 0 || full == 0), "lead {lead}: {c1:04x} vs {full:04x}");
                write_varying(&mut data[lead..], 0, 0);
            }
        }
    }

    /// Two folds give what the folding loop gives, for every sum the
    /// sender makes (below 2^32).
    #[test]
    fn two_folds_are_the_folding_loop() {
        use sluice_dataplane::checksum::fold;
        let edges = [0u64, 1, 0xffff, 0x1_0000, 0x1_fffe, 0x1_ffff, 0xfffe_ffff, 0xffff_0000, 0xffff_ffff];
        for acc in edges.into_iter().chain((0..1u64 << 32).step_by(65_521)) {
            assert_eq!(fold_small(acc), fold(acc), "{acc:#x}");
        }
    }
}

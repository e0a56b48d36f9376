//! Internet checksum (RFC 1071) and its incremental update (RFC 1624).

/// The one's-complement sum of `data` folded to 16 bits, not inverted.
#[inline]
pub fn sum(data: &[u8]) -> u16 {
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        acc += u64::from(u16::from_be_bytes([*last, 0]));
    }
    fold(acc)
}

/// True when a 20-byte IPv4 header (no options) carries a valid checksum:
/// the common case, summed as five 32-bit words.
#[inline(always)]
pub fn ipv4_header_ok(h: &[u8; 20]) -> bool {
    let mut acc = 0u64;
    for w in h.chunks_exact(4) {
        acc += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let acc = (acc & 0xffff_ffff) + (acc >> 32);
    let acc = (acc & 0xffff) + (acc >> 16);
    fold(acc) == 0xffff
}

/// Folds a wide one's-complement accumulator to 16 bits.
#[inline(always)]
#[allow(clippy::cast_possible_truncation)] // the loop leaves at most 16 bits
pub fn fold(mut acc: u64) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The checksum field value for `data` (whose own checksum field is zero).
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    !sum(data)
}

/// Updates checksum field `check` for a 16-bit word changing from `old`
/// to `new` (RFC 1624, eqn. 3: HC' = ~(~HC + ~m + m')).
#[inline(always)]
pub fn update16(check: u16, old: u16, new: u16) -> u16 {
    let acc = u64::from(!check) + u64::from(!old) + u64::from(new);
    !fold(acc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example_and_verification() {
        // The example words of RFC 1071 section 3.
        let d = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(sum(&d), 0xddf2);
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0,
            0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&hdr), 0xb861);
        let mut full = hdr;
        full[10..12].copy_from_slice(&0xb861u16.to_be_bytes());
        assert_eq!(sum(&full), 0xffff, "a correct header sums to all ones");
        assert_eq!(sum(&[0xab]), 0xab00, "odd length pads with zero");
    }

    #[test]
    fn fast_header_check_agrees() {
        let mut hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00, 0x01, 0xc0,
            0xa8, 0x00, 0xc7,
        ];
        assert!(ipv4_header_ok(&hdr));
        for i in 0..20 {
            hdr[i] ^= 0x10;
            assert_eq!(ipv4_header_ok(&hdr), sum(&hdr) == 0xffff);
            hdr[i] ^= 0x10;
        }
    }

    #[test]
    fn incremental_update_matches_recompute() {
        let mut hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8, 0x00, 0x01, 0xc0,
            0xa8, 0x00, 0xc7,
        ];
        let c0 = checksum(&hdr);
        for ttl in [0x40u8, 0x01, 0xff, 0x00] {
            let old = u16::from_be_bytes([hdr[8], hdr[9]]);
            hdr[8] = ttl.wrapping_sub(1);
            let new = u16::from_be_bytes([hdr[8], hdr[9]]);
            let inc = update16(if ttl == 0x40 { c0 } else { u16::from_be_bytes([hdr[10], hdr[11]]) }, old, new);
            hdr[10..12].copy_from_slice(&[0, 0]);
            assert_eq!(inc, checksum(&hdr));
            hdr[10..12].copy_from_slice(&inc.to_be_bytes());
        }
    }
}

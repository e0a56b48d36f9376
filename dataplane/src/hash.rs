//! The flow hash: a fixed, seedless function of the 5-tuple, identical in
//! every process and on every appliance, so that a flow maps to the same
//! table entry wherever ECMP sends it.

use crate::parse::Flow;

const K: [u64; 7] = [
    0xa076_1d64_78bd_642f,
    0xe703_7ed1_a0b4_28db,
    0x8ebc_6af0_9c88_c6e3,
    0x5899_65cc_7537_4cc3,
    0x1d8e_4e27_c47d_124f,
    0x9e37_79b9_7f4a_7c15,
    0xbf58_476d_1ce4_e5b9,
];

/// Folded 64x64->128 multiply: a fast mixing step with good avalanche.
#[inline(always)]
#[allow(clippy::cast_possible_truncation)] // keeps both halves of the product
fn mix(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

/// Splits an address into its two 64-bit halves.
#[inline(always)]
#[allow(clippy::cast_possible_truncation)]
fn halves(x: u128) -> (u64, u64) {
    (x as u64, (x >> 64) as u64)
}

/// Hash of a flow's 5-tuple: the four address halves and the ports are
/// folded into two words without losing bits of an IPv4 tuple (the
/// rotations keep source and destination apart), then mixed twice.
#[inline(always)]
pub fn flow_hash(f: &Flow) -> u64 {
    let (s0, s1) = halves(f.src.0);
    let (d0, d1) = halves(f.dst.0);
    let l4 = (u64::from(f.sport) << 48) | (u64::from(f.dport) << 32) | (u64::from(f.proto) << 24);
    let a = s0 ^ d0.rotate_left(32) ^ K[0];
    let b = s1 ^ d1.rotate_left(17) ^ l4 ^ K[1];
    mix(mix(a, b ^ K[2]) ^ K[3], b ^ K[4])
}

/// A 64-bit hash of one integer with a seed (for table permutations).
#[inline(always)]
pub fn hash_u64(x: u64, seed: u64) -> u64 {
    mix(x ^ seed ^ K[0], K[1] ^ seed.rotate_left(29))
}

/// Maps a hash uniformly onto `0..n` without a division (Lemire's range
/// reduction over the hash's 32 high bits).
#[inline(always)]
#[allow(clippy::cast_possible_truncation)] // the product shifted right by 32 is below n
pub fn reduce(hash: u64, n: u32) -> u32 {
    (((hash >> 32) * u64::from(n)) >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::Addr;

    fn flow(i: u32) -> Flow {
        Flow {
            src: Addr::v4((0x0a00_0000 + i).to_be_bytes()),
            dst: Addr::v4([20, 0, 0, 1]),
            sport: 10000 + (i % 50000) as u16,
            dport: 80,
            proto: 6,
        }
    }

    #[test]
    fn fixed_values_do_not_drift() {
        // The same tuple must hash the same in every build and process: a
        // change here breaks flow consistency across appliances.
        // The values were computed apart from this code (a transcription
        // of these functions into Python's unbounded integers), so a change
        // to a constant, a rotation or the fold shows here.
        assert_eq!(flow_hash(&flow(1)), GOLDEN_FLOW_1);
        let v6 = |last: u8| {
            let mut a = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            a[15] = last;
            Addr::v6(a)
        };
        let f6 = Flow { src: v6(1), dst: v6(0x80), sport: 5000, dport: 53, proto: 17 };
        assert_eq!(flow_hash(&f6), 2_140_191_635_510_604_687);
        assert_eq!(hash_u64(7, 1), 486_573_399_239_207_540);
        assert_eq!(hash_u64(7, 2), 13_446_098_737_775_327_104);
        assert_eq!(hash_u64(0, 0), 2_302_960_717_771_869_484);
        assert_eq!(reduce(GOLDEN_FLOW_1, 65537), 26745);
        assert_eq!(reduce(hash_u64(7, 1), 1009), 26);
        assert_eq!(reduce(u64::MAX, 65537), 65536);
    }

    // Recorded; a change breaks flow consistency between versions.
    const GOLDEN_FLOW_1: u64 = 7_528_077_628_651_140_630;

    #[test]
    fn distinct_tuples_differ() {
        let mut seen = std::collections::HashSet::new();
        for s in 0..64u32 {
            for d in 0..64u32 {
                for p in [1u16, 2, 80, 443] {
                    let f = Flow { src: Addr::v4(s.to_be_bytes()), dst: Addr::v4(d.to_be_bytes()), sport: p, dport: 80, proto: 6 };
                    assert!(seen.insert(flow_hash(&f)), "collision at {s} {d} {p}");
                }
            }
        }
        let f = flow(5);
        assert_ne!(flow_hash(&f), flow_hash(&f.reversed()), "direction matters");
    }

    #[test]
    fn spreads_evenly() {
        let n = 17u32;
        let mut buckets = vec![0u32; n as usize];
        for i in 0..170_000 {
            buckets[reduce(flow_hash(&flow(i)), n) as usize] += 1;
        }
        let (min, max) = (*buckets.iter().min().unwrap(), *buckets.iter().max().unwrap());
        assert!(max - min < 600, "{buckets:?}");
        assert!(reduce(u64::MAX, 7) < 7 && reduce(0, 7) == 0);
    }
}

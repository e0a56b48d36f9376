//! Endpoint identifiers from the endpoints themselves, so that every
//! appliance subscribed to the same server builds the same Maglev table
//! whatever order updates reached it in (ECMP across appliances sends a
//! flow to any of them).
//!
//! The rule, a pure function of the *set* of endpoints and the limit:
//!
//! 1. An endpoint whose metadata names its identifier
//!    (`filter_metadata["io.cilium.l4lb"].id`) gets exactly that one; two
//!    endpoints naming the same identifier, or one beyond the limit, are
//!    refused.
//! 2. Every other endpoint is keyed by its address. Its *rank* is
//!    `(h(address, 0), address)`, and its candidate slot in round `r` is
//!    `h(address, r) mod limit`, with `h` a fixed 64-bit hash (FNV-1a then
//!    the SplitMix64 finaliser; nothing per process or per build).
//! 3. Rounds: in round `r` every endpoint still without an identifier
//!    claims its round-`r` candidate if that slot is free; of several
//!    claimants of one slot, the lowest rank wins; the others go to the
//!    next round. After [`ROUNDS`] rounds, those left take the lowest free
//!    slots in rank order.
//!
//! So an endpoint placed in round 0 (its first choice, the usual case when
//! the limit is well above the number of endpoints) keeps its identifier
//! while others come and go, unless a newcomer claims the same first choice
//! with a lower rank: adding or removing one endpoint changes no other
//! endpoint's identifier except those that collided with it (directly, or
//! through a slot freed or taken in a later round).

use sluice_dataplane::addr::Addr;

/// How an endpoint is identified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Key {
    /// An identifier given in the endpoint's metadata.
    Explicit(u32),
    /// Its address.
    Address(Addr),
}

/// Rounds of claims before the remaining endpoints take free slots in order.
pub(super) const ROUNDS: u32 = 32;

/// The fixed hash of `addr` for round `round`.
pub(super) fn hash(addr: Addr, round: u32) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for b in addr.0.to_be_bytes().iter().chain(round.to_le_bytes().iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    // SplitMix64 finaliser: spreads FNV's weak low bits.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn slot(addr: Addr, round: u32, limit: u32) -> u32 {
    // The remainder is below `limit`, a u32.
    u32::try_from(hash(addr, round) % u64::from(limit)).unwrap_or(0)
}

/// Why endpoints cannot be given identifiers within a service's limit.
#[derive(Debug, thiserror::Error)]
pub(super) enum IdentityError {
    /// A limit of 0 leaves no identifier to give.
    #[error("the endpoint limit is 0")]
    ZeroLimit,
    /// More endpoints than identifiers.
    #[error("{endpoints} endpoints are more than the service's endpoint limit of {limit} (identifiers are 0..{last}): raise endpointLimit in the {key} metadata or defaults.endpointLimit", last = .limit - 1, key = super::mapping::METADATA_KEY)]
    TooMany {
        /// How many endpoints.
        endpoints: usize,
        /// The service's endpoint limit.
        limit: u32,
    },
    /// An identifier from an endpoint's metadata that is not below the limit.
    #[error("endpoint identifier {id} is beyond the limit {limit} (identifiers are 0..{last})", last = .limit - 1)]
    BeyondLimit {
        /// The identifier given.
        id: u32,
        /// The service's endpoint limit.
        limit: u32,
    },
    /// One identifier given in the metadata of two endpoints.
    #[error("endpoint identifier {id} is given to two endpoints (#{first} and #{second})")]
    GivenTwice {
        /// The identifier.
        id: u32,
        /// The index of the first endpoint that names it.
        first: usize,
        /// The index of the second.
        second: usize,
    },
    /// Two endpoints keyed by the same address.
    #[error("endpoint {0} appears twice")]
    Duplicate(Addr),
    /// No slot left for an endpoint.
    #[error("no free endpoint identifier")]
    NoFreeId,
}

/// Identifiers for `keys` (same order), each below `limit`, or why not.
pub(super) fn assign(keys: &[Key], limit: u32) -> Result<Vec<u32>, IdentityError> {
    if limit == 0 {
        return Err(IdentityError::ZeroLimit);
    }
    if keys.len() > limit as usize {
        return Err(IdentityError::TooMany { endpoints: keys.len(), limit });
    }
    let mut ids: Vec<Option<u32>> = vec![None; keys.len()];
    let mut taken = vec![false; limit as usize];
    for (i, k) in keys.iter().enumerate() {
        if let Key::Explicit(id) = *k {
            if id >= limit {
                return Err(IdentityError::BeyondLimit { id, limit });
            }
            if taken[id as usize] {
                let j = ids.iter().position(|x| *x == Some(id)).unwrap_or(i);
                return Err(IdentityError::GivenTwice { id, first: j, second: i });
            }
            taken[id as usize] = true;
            ids[i] = Some(id);
        }
    }
    let mut pending: Vec<(u64, Addr, usize)> = keys
        .iter()
        .enumerate()
        .filter_map(|(i, k)| match *k {
            Key::Address(a) => Some((hash(a, 0), a, i)),
            Key::Explicit(_) => None,
        })
        .collect();
    pending.sort_unstable();
    if let Some(dup) = pending.windows(2).find(|w| w[0].1 == w[1].1).map(|w| w[0].1) {
        return Err(IdentityError::Duplicate(dup));
    }
    for round in 0..ROUNDS {
        if pending.is_empty() {
            break;
        }
        let mut next = Vec::new();
        // In rank order: the first claimant of a free slot wins it (and
        // takes it at once, so later claimants of it wait a round).
        for &(rank, a, i) in &pending {
            let s = slot(a, round, limit);
            if taken[s as usize] {
                next.push((rank, a, i));
            } else {
                taken[s as usize] = true;
                ids[i] = Some(s);
            }
        }
        pending = next;
    }
    let mut free = (0..limit).filter(|s| !taken[*s as usize]);
    for &(_, _, i) in &pending {
        ids[i] = free.next();
    }
    ids.into_iter().map(|id| id.ok_or(IdentityError::NoFreeId)).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn addrs(n: usize, seed: u32) -> Vec<Addr> {
        (0..n)
            .map(|i| {
                let x = u32::try_from(i).unwrap().wrapping_mul(2_654_435_761).wrapping_add(seed);
                if i % 3 == 0 {
                    format!("2001:db8::{:x}:{:x}", x >> 16, x & 0xffff).parse().unwrap()
                } else {
                    format!("10.{}.{}.{}", (x >> 16) & 0xff, (x >> 8) & 0xff, x & 0xff).parse().unwrap()
                }
            })
            .collect()
    }

    fn map(keys: &[Key], limit: u32) -> HashMap<Key, u32> {
        keys.iter().copied().zip(assign(keys, limit).unwrap()).collect()
    }

    /// Deterministic shuffles (no RNG crate, no per-run seed).
    fn shuffled<T: Clone>(v: &[T], seed: u64) -> Vec<T> {
        let mut v = v.to_vec();
        let mut s = seed;
        for i in (1..v.len()).rev() {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let j = usize::try_from((s >> 33) % (i as u64 + 1)).unwrap();
            v.swap(i, j);
        }
        v
    }

    #[test]
    fn the_hash_is_fixed() {
        // Golden values: every appliance, whatever its build, must compute
        // these; a change here changes every service's identifiers.
        let a: Addr = "10.0.0.1".parse().unwrap();
        assert_ne!(hash(a, 0), hash(a, 1));
        let golden: Vec<u32> = ["10.0.0.1", "10.0.0.2", "2001:db8::1"].iter().map(|s| slot(s.parse().unwrap(), 0, 65536)).collect();
        assert_eq!(golden, [1297, 1724, 26741]);
    }

    #[test]
    fn permutations_of_one_set_give_the_same_identifiers() {
        for (n, limit) in [(1, 1), (5, 8), (32, 32), (20, 32), (100, 128), (256, 256)] {
            let keys: Vec<Key> = addrs(n, 7).into_iter().map(Key::Address).collect();
            let want = map(&keys, limit);
            assert_eq!(want.len(), n);
            let mut ids: Vec<u32> = want.values().copied().collect();
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), n, "unique");
            assert!(ids.iter().all(|i| *i < limit));
            for seed in 0..20 {
                assert_eq!(map(&shuffled(&keys, seed), limit), want, "n={n} limit={limit} seed={seed}");
            }
        }
    }

    #[test]
    fn explicit_identifiers_are_kept_and_checked() {
        let a = addrs(4, 1);
        let keys = [Key::Explicit(3), Key::Address(a[0]), Key::Address(a[1]), Key::Explicit(0)];
        let ids = assign(&keys, 4).unwrap();
        assert_eq!((ids[0], ids[3]), (3, 0));
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2, 3]);
        assert!(assign(&[Key::Explicit(4)], 4).unwrap_err().to_string().contains("beyond the limit 4"));
        assert!(assign(&[Key::Explicit(1), Key::Explicit(1)], 4).unwrap_err().to_string().contains("given to two endpoints"));
        assert!(assign(&[Key::Address(a[0]), Key::Address(a[0])], 4).unwrap_err().to_string().contains("appears twice"));
    }

    #[test]
    fn more_endpoints_than_the_limit_are_refused() {
        let keys: Vec<Key> = addrs(33, 3).into_iter().map(Key::Address).collect();
        let e = assign(&keys, 32).unwrap_err().to_string();
        assert!(e.starts_with("33 endpoints are more than the service's endpoint limit of 32"), "{e}");
        assert!(assign(&keys[..32], 32).is_ok(), "exactly the limit fits");
    }

    /// An endpoint that holds its first choice (before or after the
    /// change) keeps its identifier unless the endpoint that came or went
    /// wanted the same first choice; others (already displaced once) may
    /// move, and overall few do.
    #[test]
    fn adding_or_removing_one_endpoint_moves_only_collision_victims() {
        let mut moved_total = 0usize;
        let mut changes = 0usize;
        for seed in 0..40u32 {
            for (n, limit) in [(10usize, 32u32), (30, 64), (60, 256), (200, 1024)] {
                let all = addrs(n + 1, seed * 7919);
                let (base, extra) = (&all[..n], all[n]);
                let small: Vec<Key> = base.iter().copied().map(Key::Address).collect();
                let mut big = small.clone();
                big.push(Key::Address(extra));
                let (before, after) = (map(&small, limit), map(&big, limit));
                let extra_first = slot(extra, 0, limit);
                let mut moved = 0;
                for a in base {
                    let k = Key::Address(*a);
                    let first = slot(*a, 0, limit);
                    if first != extra_first && (before[&k] == first || after[&k] == first) {
                        assert_eq!(before[&k], after[&k], "seed {seed}: {a} held its first choice {first}, which the newcomer did not want");
                    }
                    if before[&k] != after[&k] {
                        moved += 1;
                    }
                }
                moved_total += moved;
                changes += 1;
                // Removing is the same change read backwards.
                assert_eq!(map(&small, limit), before);
            }
        }
        // A loose bound, not a timing: collisions are rare at these loads.
        assert!(moved_total <= changes, "{moved_total} identifiers moved over {changes} single-endpoint changes");
    }

    #[test]
    fn a_full_service_still_gets_every_identifier_once() {
        let keys: Vec<Key> = addrs(1000, 11).into_iter().map(Key::Address).collect();
        let mut ids = assign(&keys, 1000).unwrap();
        ids.sort_unstable();
        assert_eq!(ids, (0..1000).collect::<Vec<u32>>());
    }

    /// The rule as the module states it, round by round: every claim of a
    /// round is made against the slots taken before the round; of the
    /// claimants of one slot the lowest rank wins.
    fn by_the_rule(keys: &[Key], limit: u32) -> Vec<u32> {
        let mut ids: Vec<Option<u32>> = keys.iter().map(|k| if let Key::Explicit(id) = k { Some(*id) } else { None }).collect();
        let mut taken: Vec<bool> = (0..limit).map(|s| ids.contains(&Some(s))).collect();
        let mut pending: Vec<(u64, Addr, usize)> = keys
            .iter()
            .enumerate()
            .filter_map(|(i, k)| if let Key::Address(a) = k { Some((hash(*a, 0), *a, i)) } else { None })
            .collect();
        pending.sort_unstable();
        for round in 0..ROUNDS {
            let mut winners: HashMap<u32, usize> = HashMap::new();
            let mut next = Vec::new();
            for &(rank, a, i) in &pending {
                let s = slot(a, round, limit);
                if taken[s as usize] || winners.contains_key(&s) {
                    next.push((rank, a, i));
                } else {
                    winners.insert(s, i);
                }
            }
            for (s, i) in winners {
                taken[s as usize] = true;
                ids[i] = Some(s);
            }
            pending = next;
        }
        let mut free = (0..limit).filter(|s| !taken[*s as usize]);
        for &(_, _, i) in &pending {
            ids[i] = free.next();
        }
        ids.into_iter().map(Option::unwrap).collect()
    }

    #[test]
    fn identifiers_follow_the_rule() {
        for seed in 0..200u32 {
            let n = 1 + (seed as usize * 7) % 60;
            let limit = u32::try_from(n).unwrap() + seed % 40;
            let mut keys: Vec<Key> = addrs(n, seed).into_iter().map(Key::Address).collect();
            if seed % 3 == 0 {
                keys[0] = Key::Explicit(limit - 1);
            }
            assert_eq!(assign(&keys, limit).unwrap(), by_the_rule(&keys, limit), "seed {seed}: {n} endpoints, limit {limit}");
        }
    }
}

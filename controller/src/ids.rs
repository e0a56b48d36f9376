//! Endpoint identifiers of one Service (the design's "Service Endpoint
//! Identifier"): each endpoint address gets an identifier in `0..limit`
//! that never changes while the address stays in the Service.
//!
//! The allocator is a pure function of what the Service's EndpointSlices
//! already say ([`Previous`], read back from their `sluice.io/endpoint-ids`
//! annotations, so a restarted controller finds the same answer), the
//! limit and the candidates in a fixed order:
//! - a candidate that already has an identifier below the limit keeps it
//!   (if two addresses claim one, the first in order keeps it and the
//!   other is given a new one);
//! - the others, in order, take the lowest identifier nobody holds, so an
//!   identifier is reused only once the address holding it has left;
//! - when none is free the Service is full: the candidate is left out and
//!   listed in [`Allocation::full`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The identifiers a Service's slices hold: address → identifier.
pub(crate) type Previous = BTreeMap<IpAddr, u32>;

/// The outcome for one Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Allocation {
    /// Address → identifier, for every candidate admitted.
    pub(crate) ids: BTreeMap<IpAddr, u32>,
    /// Candidates left out because every identifier below the limit is held.
    pub(crate) full: Vec<IpAddr>,
}

/// Allocates identifiers in `0..limit` to `candidates` (in the order they
/// are to be admitted), keeping those of `previous`.
pub(crate) fn allocate(previous: &Previous, limit: u32, candidates: &[IpAddr]) -> Allocation {
    let mut out = Allocation::default();
    let mut held: BTreeSet<u32> = BTreeSet::new();
    let mut fresh: Vec<IpAddr> = Vec::new();
    let mut seen: BTreeSet<IpAddr> = BTreeSet::new();
    for &addr in candidates {
        if !seen.insert(addr) {
            continue; // listed twice: one endpoint
        }
        match previous.get(&addr) {
            Some(&id) if id < limit && held.insert(id) => {
                out.ids.insert(addr, id);
            }
            _ => fresh.push(addr),
        }
    }
    let mut next = 0u32;
    for addr in fresh {
        while next < limit && held.contains(&next) {
            next += 1;
        }
        if next >= limit {
            out.full.push(addr);
            continue;
        }
        held.insert(next);
        out.ids.insert(addr, next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn ips(v: &[&str]) -> Vec<IpAddr> {
        v.iter().map(|s| ip(s)).collect()
    }

    fn ids(a: &Allocation) -> Vec<(String, u32)> {
        a.ids.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn new_endpoints_take_the_lowest_free_identifiers_in_order() {
        let a = allocate(&Previous::new(), 4, &ips(&["10.0.0.3", "10.0.0.1", "10.0.0.2"]));
        assert_eq!(a.ids[&ip("10.0.0.3")], 0);
        assert_eq!(a.ids[&ip("10.0.0.1")], 1);
        assert_eq!(a.ids[&ip("10.0.0.2")], 2);
        assert!(a.full.is_empty());
    }

    #[test]
    fn identifiers_stay_across_updates_whatever_the_order() {
        let first = allocate(&Previous::new(), 8, &ips(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]));
        // A new endpoint arrives first in order, the others are listed in
        // another order: nobody's identifier changes.
        let second = allocate(&first.ids, 8, &ips(&["10.0.0.9", "10.0.0.3", "10.0.0.2", "10.0.0.1"]));
        for (addr, id) in &first.ids {
            assert_eq!(second.ids[addr], *id, "{addr}");
        }
        assert_eq!(second.ids[&ip("10.0.0.9")], 3);
    }

    #[test]
    fn a_restart_reads_back_the_same_identifiers() {
        // What the slices held before the restart, including gaps.
        let previous: Previous = [(ip("10.0.0.1"), 5), (ip("10.0.0.2"), 0), (ip("fd00::2"), 2)].into();
        let a = allocate(&previous, 8, &ips(&["10.0.0.2", "10.0.0.1", "fd00::2", "10.0.0.7"]));
        assert_eq!(ids(&a), vec![("10.0.0.1".into(), 5), ("10.0.0.2".into(), 0), ("10.0.0.7".into(), 1), ("fd00::2".into(), 2)]);
    }

    #[test]
    fn an_identifier_is_reused_only_after_its_endpoint_left() {
        let a = allocate(&Previous::new(), 3, &ips(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]));
        // Full: a fourth waits, and does not take anyone's identifier.
        let b = allocate(&a.ids, 3, &ips(&["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]));
        assert_eq!(b.ids, a.ids);
        assert_eq!(b.full, ips(&["10.0.0.4"]));
        // 10.0.0.2 leaves: its identifier, and only it, goes to the newcomer.
        let c = allocate(&b.ids, 3, &ips(&["10.0.0.1", "10.0.0.3", "10.0.0.4"]));
        assert_eq!(ids(&c), vec![("10.0.0.1".into(), 0), ("10.0.0.3".into(), 2), ("10.0.0.4".into(), 1)]);
        assert!(c.full.is_empty());
    }

    #[test]
    fn the_limit_bounds_the_identifiers_and_a_lower_limit_moves_only_those_above_it() {
        let a = allocate(&Previous::new(), 1, &ips(&["10.0.0.1", "10.0.0.2"]));
        assert_eq!(ids(&a), vec![("10.0.0.1".into(), 0)]);
        assert_eq!(a.full, ips(&["10.0.0.2"]));
        let previous: Previous = [(ip("10.0.0.1"), 0), (ip("10.0.0.2"), 6), (ip("10.0.0.3"), 1)].into();
        let b = allocate(&previous, 4, &ips(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]));
        assert_eq!(ids(&b), vec![("10.0.0.1".into(), 0), ("10.0.0.2".into(), 2), ("10.0.0.3".into(), 1)]);
        assert_eq!(allocate(&previous, 0, &ips(&["10.0.0.1"])).full, ips(&["10.0.0.1"]));
    }

    #[test]
    fn two_addresses_claiming_one_identifier_do_not_share_it() {
        let previous: Previous = [(ip("10.0.0.1"), 0), (ip("10.0.0.2"), 0)].into();
        let a = allocate(&previous, 4, &ips(&["10.0.0.2", "10.0.0.1", "10.0.0.2"]));
        assert_eq!(ids(&a), vec![("10.0.0.1".into(), 1), ("10.0.0.2".into(), 0)]);
    }

    #[test]
    fn identifiers_are_unique_across_families() {
        let a = allocate(&Previous::new(), 4, &ips(&["10.0.0.1", "fd00::1", "10.0.0.2", "fd00::2"]));
        let set: BTreeSet<u32> = a.ids.values().copied().collect();
        assert_eq!(set.len(), 4);
        assert_eq!(a.ids[&ip("fd00::1")], 1);
    }
}

//! The fleet's agreement: each appliance sends its siblings the digest of
//! every service's table (the value `sluice tables` shows: SHA-256 of the
//! endpoint address of every slot, in order), and compares theirs with its
//! own.
//!
//! - **What a digest covers:** what the workers forward with, so it
//!   follows from the configuration (endpoints, weights, table size and
//!   algorithm) and from the endpoints health keeps out of new flows. Two
//!   appliances with the same digest send every new flow of the service
//!   to the same endpoint address.
//! - **When:** a service the compiler built again is hashed again when it
//!   is published (one the compiler reused keeps its digest); each
//!   sibling connected gets the whole set again at most every
//!   [`SEND_EVERY`] after a change, and the comparison is made again
//!   whenever a set changes. A mismatch shows in the status and metrics
//!   within `SEND_EVERY` plus the status period of the sync task.
//! - **The majority ([`compare`]):** for each service, the reachable
//!   siblings that have it (those that do not serve it do not vote) and
//!   this appliance are grouped by digest. This appliance is in the
//!   minority when another group is larger, or as large and newer (its
//!   newest member changed its digest later; equal times: the group with
//!   the lowest sibling address). So of two groups of the same size the
//!   one that changed last keeps its VIPs, and whatever the split exactly
//!   one group is not in the minority, as long as the appliances see the
//!   same sets. With `siblings.gate`, a service that stays in the
//!   minority for [`GATE_AFTER`] has its VIPs withdrawn until it agrees;
//!   one that never agreed with a sibling since the appliance started, at
//!   once (a new appliance with another configuration never announces it).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use sluice_dataplane::service::Service;
use sluice_dataplane::snapshot::Snapshot;
use sluice_dataplane::sync::RECORD_LEN;

use super::service_tag;

/// A table's digest.
pub(crate) type Digest = [u8; 32];

/// A digest set is sent to a sibling again at most this often.
pub(crate) const SEND_EVERY: Duration = Duration::from_millis(100);
/// A service in the minority this long has its VIPs withdrawn (with
/// `siblings.gate`): appliances that take one change a few hundred
/// milliseconds apart do not withdraw anything.
pub(crate) const GATE_AFTER: Duration = Duration::from_secs(1);
/// Most services a sibling's set may hold; a larger set ends its connection.
pub(crate) const MAX_SERVICES: usize = 1 << 20;
/// Most mismatched services listed in the status (all are counted).
pub(crate) const MAX_LISTED: usize = 100;

/// The endpoint address of every slot of `s`'s table, in order (`None`
/// for an empty slot, which a built table does not have).
pub(crate) fn slots(s: &Service) -> impl Iterator<Item = Option<sluice_dataplane::addr::Addr>> + '_ {
    s.table.iter().flat_map(move |t| (0..t.size() as usize).map(move |i| s.endpoint_at(t.entries().get(i)).map(|e| e.addr)))
}

/// SHA-256 of the endpoint address of every slot of `s`'s table, in order.
pub(crate) fn table_digest(s: &Service) -> Digest {
    let mut h = Sha256::new();
    for a in slots(s) {
        // An empty slot hashes as ::.
        h.update(a.unwrap_or_default().v6_bytes());
    }
    h.finalize().into()
}

/// A digest in hex.
pub(crate) fn hex(d: &Digest) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// One service's digest as an appliance has it, and since when
/// (milliseconds since the epoch on that appliance's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) digest: Digest,
    pub(crate) since_ms: u64,
}

/// An appliance's digests, by service tag.
pub(crate) type Digests = HashMap<u32, Entry>;

/// A digest on the wire, in a record's 48 bytes: the service's tag (4),
/// zero (4), since when (8), the digest (32).
pub(crate) fn encode(tag: u32, e: &Entry) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[..4].copy_from_slice(&tag.to_be_bytes());
    b[8..16].copy_from_slice(&e.since_ms.to_be_bytes());
    b[16..].copy_from_slice(&e.digest);
    b
}

/// The inverse of [`encode`]; `None` unless `b` is one record.
pub(crate) fn decode(b: &[u8]) -> Option<(u32, Entry)> {
    if b.len() != RECORD_LEN {
        return None;
    }
    let tag = u32::from_be_bytes(b[..4].try_into().ok()?);
    let since_ms = u64::from_be_bytes(b[8..16].try_into().ok()?);
    Some((tag, Entry { since_ms, digest: b[16..].try_into().ok()? }))
}

/// This appliance's digests, following its publications.
#[derive(Debug, Default)]
pub(crate) struct Own {
    /// By service name: the service hashed (held weakly: a service the
    /// compiler reused is the same allocation), its tag and entry.
    by_name: HashMap<String, (Weak<Service>, u32, Entry)>,
    /// The set as sent, and the names of its tags.
    pub(crate) set: Arc<Digests>,
    pub(crate) names: Arc<HashMap<u32, String>>,
}

impl Own {
    /// Takes `snap`'s services (hashing those built again); true when the
    /// set changed. `now_ms` dates a digest that changed.
    pub(crate) fn follow(&mut self, snap: &Snapshot, now_ms: u64) -> bool {
        let mut next: HashMap<String, (Weak<Service>, u32, Entry)> = HashMap::with_capacity(snap.services.len());
        let mut changed = snap.services.len() != self.by_name.len();
        for s in snap.services.iter() {
            let kept = self.by_name.remove(&s.name);
            let entry = match kept {
                Some((w, tag, e)) if std::ptr::eq(w.as_ptr(), Arc::as_ptr(s)) => (w, tag, e),
                old => {
                    let digest = table_digest(s);
                    let since_ms = match old {
                        Some((_, _, e)) if e.digest == digest => e.since_ms,
                        _ => {
                            changed = true;
                            now_ms
                        }
                    };
                    (Arc::downgrade(s), service_tag(&s.name), Entry { digest, since_ms })
                }
            };
            next.insert(s.name.clone(), entry);
        }
        changed |= !self.by_name.is_empty();
        self.by_name = next;
        if changed {
            let mut set = Digests::with_capacity(self.by_name.len());
            let mut names = HashMap::with_capacity(self.by_name.len());
            let mut clash = Vec::new();
            for (name, (_, tag, e)) in &self.by_name {
                if set.insert(*tag, *e).is_some() {
                    clash.push(*tag);
                }
                names.insert(*tag, name.clone());
            }
            // Two services under one tag cannot be told apart on the wire:
            // neither is compared.
            for t in clash {
                set.remove(&t);
                names.remove(&t);
            }
            self.set = Arc::new(set);
            self.names = Arc::new(names);
        }
        changed
    }
}

/// One service on which this appliance and a reachable sibling differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mismatch {
    pub(crate) service: String,
    /// This appliance's digest.
    pub(crate) digest: Digest,
    /// Siblings with another digest.
    pub(crate) differ: Vec<String>,
    /// Siblings that do not have the service.
    pub(crate) absent: Vec<String>,
    /// Appliances with this appliance's digest, itself included.
    pub(crate) agree: usize,
    /// This appliance is in the minority ([`compare`]).
    pub(crate) minority: bool,
    /// The largest other group's size and digest.
    pub(crate) largest: Option<(usize, Digest)>,
}

/// A sibling's set, as compared: its address and digests.
pub(crate) type PeerSet<'a> = (&'a str, &'a Digests);

/// Every service of `own` on which a sibling of `peers` differs, in
/// service name order; `me` is this appliance's address (the tie's last
/// resort). See the module's description for the minority.
pub(crate) fn compare(own: &Digests, names: &HashMap<u32, String>, me: &str, peers: &[PeerSet<'_>]) -> Vec<Mismatch> {
    let mut out = Vec::new();
    for (tag, mine) in own {
        let Some(name) = names.get(tag) else { continue };
        let (mut differ, mut absent) = (Vec::new(), Vec::new());
        // Other digests: (members, newest since, lowest address).
        let mut groups: HashMap<Digest, (usize, u64, &str)> = HashMap::new();
        let mut agree = 1usize;
        for (addr, set) in peers {
            match set.get(tag) {
                None => absent.push((*addr).to_owned()),
                Some(e) if e.digest == mine.digest => agree += 1,
                Some(e) => {
                    differ.push((*addr).to_owned());
                    let g = groups.entry(e.digest).or_insert((0, 0, addr));
                    g.0 += 1;
                    g.1 = g.1.max(e.since_ms);
                    if *addr < g.2 {
                        g.2 = addr;
                    }
                }
            }
        }
        if differ.is_empty() && absent.is_empty() {
            continue;
        }
        // This group's newest change is this appliance's own or a sibling's
        // that agrees; the own one stands for it (agreeing siblings took
        // the same table, the time that counts is when it was reached here).
        let minority = groups.values().any(|&(n, since, lowest)| {
            n > agree || (n == agree && (since > mine.since_ms || (since == mine.since_ms && lowest < me)))
        });
        let largest = groups.iter().max_by_key(|(d, (n, since, _))| (*n, *since, **d)).map(|(d, (n, ..))| (*n, *d));
        differ.sort();
        absent.sort();
        out.push(Mismatch { service: name.clone(), digest: mine.digest, differ, absent, agree, minority, largest });
    }
    out.sort_by(|a, b| a.service.cmp(&b.service));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(d: u8, since_ms: u64) -> Entry {
        Entry { digest: [d; 32], since_ms }
    }

    fn set(items: &[(u32, Entry)]) -> Digests {
        items.iter().copied().collect()
    }

    fn names() -> HashMap<u32, String> {
        [(1, "web".to_owned()), (2, "dns".to_owned())].into_iter().collect()
    }

    #[test]
    fn records_round_trip() {
        let x = e(7, 1_795_000_000_123);
        assert_eq!(decode(&encode(0xdead_beef, &x)), Some((0xdead_beef, x)));
        assert_eq!(decode(&[0u8; 47]), None);
    }

    #[test]
    fn agreeing_siblings_show_nothing() {
        let own = set(&[(1, e(1, 10)), (2, e(2, 10))]);
        let p = set(&[(1, e(1, 20)), (2, e(2, 5))]);
        assert!(compare(&own, &names(), "a", &[("b", &p), ("c", &p)]).is_empty());
    }

    #[test]
    fn the_odd_one_out_is_the_minority_and_the_others_are_not() {
        // Three appliances; c has another digest for web.
        let (a, b, c) = (set(&[(1, e(1, 10))]), set(&[(1, e(1, 10))]), set(&[(1, e(9, 50))]));
        let on_c = compare(&c, &names(), "c", &[("a", &a), ("b", &b)]);
        assert_eq!(on_c.len(), 1);
        assert_eq!((on_c[0].service.as_str(), on_c[0].minority, on_c[0].agree), ("web", true, 1));
        assert_eq!(on_c[0].differ, ["a", "b"]);
        assert_eq!(on_c[0].largest, Some((2, [1; 32])));
        for (me, own, other) in [("a", &a, &b), ("b", &b, &a)] {
            let m = compare(own, &names(), me, &[("other", other), ("c", &c)]);
            assert_eq!(m.len(), 1, "{me} sees the mismatch too");
            assert!(!m[0].minority, "{me} is in the majority");
            assert_eq!((m[0].agree, m[0].differ.clone()), (2, vec!["c".to_owned()]));
        }
    }

    #[test]
    fn a_tie_withdraws_the_older_and_never_both() {
        let (old, new) = (set(&[(1, e(1, 10))]), set(&[(1, e(2, 20))]));
        assert!(compare(&old, &names(), "a", &[("b", &new)])[0].minority, "the older configuration withdraws");
        assert!(!compare(&new, &names(), "b", &[("a", &old)])[0].minority, "the newer one keeps");
        // Same time: the lower address keeps.
        let (x, y) = (set(&[(1, e(1, 10))]), set(&[(1, e(2, 10))]));
        let on_a = compare(&x, &names(), "a", &[("b", &y)])[0].minority;
        let on_b = compare(&y, &names(), "b", &[("a", &x)])[0].minority;
        assert!(!on_a && on_b, "exactly one withdraws: {on_a} {on_b}");
        // Three ways apart: only the newest keeps.
        let sets = [("a", set(&[(1, e(1, 10))])), ("b", set(&[(1, e(2, 30))])), ("c", set(&[(1, e(3, 20))]))];
        let kept: Vec<&str> = sets
            .iter()
            .filter(|(me, own)| {
                let others: Vec<PeerSet<'_>> = sets.iter().filter(|(o, _)| o != me).map(|(o, s)| (*o, s)).collect();
                !compare(own, &names(), me, &others)[0].minority
            })
            .map(|(me, _)| *me)
            .collect();
        assert_eq!(kept, ["b"]);
    }

    #[test]
    fn a_sibling_without_the_service_is_listed_but_does_not_vote() {
        let own = set(&[(1, e(1, 10)), (2, e(2, 10))]);
        let p = set(&[(1, e(1, 10))]);
        let m = compare(&own, &names(), "a", &[("b", &p), ("c", &p)]);
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].service.as_str(), m[0].absent.len(), m[0].minority), ("dns", 2, false));
    }

    #[test]
    fn own_digests_follow_publications_and_keep_their_time() {
        use crate::fixture::{endpoint, one_service, web};
        use sluice_dataplane::addr::Addr;
        use sluice_dataplane::service::Algorithm;
        let snap = |eps: &[(u16, u8)]| {
            let endpoints = eps.iter().map(|&(id, last)| endpoint(id, u32::from(id) + 1, Addr::v4([10, 0, 0, last]))).collect();
            one_service(&web(1, Algorithm::Maglev, true, endpoints))
        };
        let mut own = Own::default();
        let a = snap(&[(0, 1), (1, 2)]);
        assert!(own.follow(&a, 100));
        let first = own.set[&service_tag("web")];
        assert_eq!(first.since_ms, 100);
        assert_eq!(hex(&first.digest), hex(&table_digest(&a.services[0])));
        assert!(!own.follow(&a, 200), "the same service: nothing new");
        // Built again alike: hashed again, same digest, same time.
        assert!(!own.follow(&snap(&[(0, 1), (1, 2)]), 300));
        assert_eq!(own.set[&service_tag("web")], first);
        // Another endpoint: another digest, dated now.
        assert!(own.follow(&snap(&[(0, 1), (1, 3)]), 400));
        let next = own.set[&service_tag("web")];
        assert_ne!(next.digest, first.digest);
        assert_eq!(next.since_ms, 400);
        // Gone.
        assert!(own.follow(&Snapshot::default(), 500));
        assert!(own.set.is_empty());
    }
}

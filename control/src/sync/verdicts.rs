//! Health verdicts shared with the siblings: each appliance sends the
//! endpoints its own health (passive and active checks) wants out of new
//! flows, and takes every reachable sibling's as if its own, so that one
//! appliance's drain is every appliance's and their tables stay alike.
//!
//! - **Only its own:** an appliance sends what its own health decided,
//!   never what it took from a sibling, so a verdict ends when the
//!   appliance that made it sees the endpoint answer again (or leaves).
//! - **Identity:** an endpoint is named on the wire as a pin is: its
//!   service's tag ([`super::service_tag`]), its identifier and a tag of
//!   its address ([`super::address_tag`]); a verdict on an identifier this
//!   appliance gives another address, or on a service it does not have, is
//!   not taken.
//! - **Applied:** the health task lays the siblings' verdicts over its own
//!   and sends the union to the reconciler, whose limit (at most half of a
//!   service's endpoints out, in identifier order, never its last ready
//!   one) is the same on every appliance: the same union gives the same
//!   table.
//! - **Bound:** a verdict made on one appliance is out of new flows on its
//!   siblings within the health task's tick (100 ms) on each side, the
//!   sets' send period ([`super::agree::SEND_EVERY`], 100 ms), the sync
//!   task's round (5 ms) and one publication. A sibling that becomes
//!   unreachable stops counting: its verdicts are dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sluice_dataplane::snapshot::Snapshot;
use sluice_dataplane::sync::RECORD_LEN;

use super::{address_tag, service_tag};

/// Endpoints wanted out of new flows, by service name and identifier.
pub(crate) type Ejected = BTreeMap<String, BTreeSet<u32>>;

/// The wire names of a snapshot's services and endpoints.
#[derive(Debug, Default)]
pub(crate) struct Names {
    /// Service name -> (tag, identifier -> address tag).
    by_name: HashMap<String, (u32, HashMap<u16, u16>)>,
    /// Tag -> service name (tags two services share are left out).
    by_tag: HashMap<u32, String>,
}

impl Names {
    pub(crate) fn of(snap: &Snapshot) -> Names {
        let mut n = Names::default();
        let mut clash = Vec::new();
        for s in snap.services.iter() {
            let tag = service_tag(&s.name);
            let eps = s.endpoints().map(|e| (e.id, address_tag(e.addr))).collect();
            n.by_name.insert(s.name.clone(), (tag, eps));
            if n.by_tag.insert(tag, s.name.clone()).is_some() {
                clash.push(tag);
            }
        }
        for t in clash {
            n.by_tag.remove(&t);
        }
        n
    }

    /// This appliance's verdicts on the wire (those on endpoints its
    /// snapshot has).
    pub(crate) fn encode(&self, own: &Ejected) -> Vec<[u8; RECORD_LEN]> {
        let mut out = Vec::new();
        for (service, ids) in own {
            let Some((tag, eps)) = self.by_name.get(service) else { continue };
            for &id in ids {
                let Ok(id) = u16::try_from(id) else { continue };
                if let Some(addr) = eps.get(&id) {
                    out.push(encode(*tag, id, *addr));
                }
            }
        }
        out
    }

    /// Adds a sibling's verdicts that name an endpoint of this snapshot to
    /// `into`; returns how many did not.
    pub(crate) fn take(&self, records: &[[u8; RECORD_LEN]], into: &mut Ejected) -> usize {
        let mut unknown = 0;
        for r in records {
            let (tag, id, addr) = decode(r);
            let known = self.by_tag.get(&tag).and_then(|name| {
                let (_, eps) = self.by_name.get(name)?;
                (eps.get(&id) == Some(&addr)).then_some(name)
            });
            match known {
                Some(name) => {
                    into.entry(name.clone()).or_default().insert(u32::from(id));
                }
                None => unknown += 1,
            }
        }
        unknown
    }
}

/// A verdict in a record's 48 bytes: the service's tag (4), the
/// endpoint's identifier (2) and address tag (2), zeros.
fn encode(tag: u32, id: u16, addr: u16) -> [u8; RECORD_LEN] {
    let mut b = [0u8; RECORD_LEN];
    b[..4].copy_from_slice(&tag.to_be_bytes());
    b[4..6].copy_from_slice(&id.to_be_bytes());
    b[6..8].copy_from_slice(&addr.to_be_bytes());
    b
}

fn decode(b: &[u8; RECORD_LEN]) -> (u32, u16, u16) {
    (u32::from_be_bytes([b[0], b[1], b[2], b[3]]), u16::from_be_bytes([b[4], b[5]]), u16::from_be_bytes([b[6], b[7]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_dataplane::addr::Addr;
    use crate::fixture::{endpoint, one_service, web};
    use sluice_dataplane::service::Algorithm;

    fn snap(eps: &[(u16, u8)]) -> Snapshot {
        let endpoints = eps.iter().map(|&(id, last)| endpoint(id, u32::from(id) + 7, Addr::v4([10, 0, 0, last]))).collect();
        one_service(&web(3, Algorithm::Random, false, endpoints))
    }

    #[test]
    fn verdicts_cross_by_identifier_and_address_only() {
        let here = Names::of(&snap(&[(0, 1), (1, 2), (2, 3)]));
        let own: Ejected = BTreeMap::from([("web".to_owned(), BTreeSet::from([1, 2, 9])), ("gone".to_owned(), BTreeSet::from([0]))]);
        let wire = here.encode(&own);
        assert_eq!(wire.len(), 2, "identifier 9 and service gone are not here");
        // A sibling with the same endpoints takes both.
        let mut got = Ejected::new();
        assert_eq!(Names::of(&snap(&[(0, 1), (1, 2), (2, 3)])).take(&wire, &mut got), 0);
        assert_eq!(got, BTreeMap::from([("web".to_owned(), BTreeSet::from([1, 2]))]));
        // One that gives identifier 2 another address takes only 1.
        let mut got = Ejected::new();
        assert_eq!(Names::of(&snap(&[(0, 1), (1, 2), (2, 4)])).take(&wire, &mut got), 1);
        assert_eq!(got, BTreeMap::from([("web".to_owned(), BTreeSet::from([1]))]));
        // One without the service takes none.
        let mut got = Ejected::new();
        assert_eq!(Names::default().take(&wire, &mut got), 2);
        assert!(got.is_empty());
    }
}

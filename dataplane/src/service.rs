//! A service as workers see it: its algorithm, its lookup table, and its
//! endpoints (with how to reach each one), in one dense array ordered by
//! identifier, which the table's entries index by position.
//!
//! Built from a [`ServiceSpec`] by the control plane and shared, immutable,
//! between snapshots while the spec does not change (the control plane
//! keeps the specs and compares them): only changed services' tables are
//! rebuilt.
//!
//! A service built after an earlier build of itself
//! ([`Service::build_after`]) knows which slots of its table now choose
//! another endpoint ([`SlotChanges`], worked out once per build): the flows
//! in those slots are the ones a sibling appliance, having no pin for them,
//! would send elsewhere.

use std::fmt;
use std::str::FromStr;

use crate::addr::Addr;
use crate::flow::{sync_mark, FlowPin, Pin};
use crate::maglev::{default_size, EndpointId, Table, TableError};

/// How a service picks an endpoint for a new flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// Consistent hashing of the 5-tuple through the Maglev table: the same
    /// flow gets the same endpoint on every worker and every appliance.
    #[default]
    Maglev,
    /// A random endpoint (in proportion to weights), remembered per flow in
    /// the worker's flow table.
    Random,
}

impl FromStr for Algorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Algorithm, String> {
        match s {
            "maglev" => Ok(Algorithm::Maglev),
            "random" => Ok(Algorithm::Random),
            other => Err(format!("unknown load-balancing algorithm {other:?} (expected maglev or random)")),
        }
    }
}

impl Algorithm {
    /// Its name in configuration and status.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Maglev => "maglev",
            Algorithm::Random => "random",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How packets reach an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// NAT-less layer 2: the frame goes to the endpoint's MAC unchanged but
    /// for the Ethernet header and the TTL; the endpoint owns the VIP.
    L2,
    /// IP-in-IP (or IPv6-in-IPv6, and the mixed cases): an outer header from
    /// `src` to the endpoint's address, sent to the next hop's MAC.
    IpIp {
        /// Outer source address (the appliance's own).
        src: Addr,
    },
}

/// One endpoint: as the control plane describes it, and as the service
/// keeps it (by identifier).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EndpointSpec {
    /// Identifier within the service (stable while the endpoint is in it).
    pub id: EndpointId,
    /// Changes whenever the identifier is given to a different endpoint.
    pub incarnation: u32,
    /// Relative weight; 0 takes no new flows.
    pub weight: u32,
    /// Draining: no new flows; established flows stay where a flow table is on.
    pub draining: bool,
    /// The endpoint's address (outer destination when encapsulating).
    pub addr: Addr,
    /// Output port index.
    pub port: u8,
    /// MAC of the next hop (the endpoint itself on a shared segment).
    pub mac: [u8; 6],
    /// How to deliver.
    pub delivery: Delivery,
    /// Slot of its counters in each worker.
    pub counter: u32,
}

/// A service as the control plane describes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ServiceSpec {
    /// Name, for status and logs.
    pub name: String,
    /// Stable key (also its counter slot).
    pub key: u32,
    /// Algorithm for new flows.
    pub algorithm: Algorithm,
    /// Remember each flow's endpoint in the worker's flow table (always on
    /// for `random`).
    pub flow_table: bool,
    /// Identifiers are below this limit.
    pub limit: u32,
    /// Lookup-table size (a prime); 0 for the default of the limit.
    pub table_size: u32,
    /// Endpoints.
    pub endpoints: Vec<EndpointSpec>,
}

/// An endpoint as the fast path reads it: its spec in 48 bytes (the spec
/// is 80), the outer source of IP-in-IP being kept once per service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The endpoint's address (outer destination when encapsulating).
    pub addr: Addr,
    /// Identifier within the service.
    pub id: EndpointId,
    /// Changes whenever the identifier is given to a different endpoint.
    pub incarnation: u32,
    /// Relative weight; 0 takes no new flows.
    pub weight: u32,
    /// Slot of its counters in each worker.
    pub counter: u32,
    /// 0: layer-2 delivery; k: IP-in-IP from the service's tunnel source
    /// k - 1.
    tunnel: u32,
    /// Output port index.
    pub port: u8,
    /// MAC of the next hop.
    pub mac: [u8; 6],
    /// Draining: no new flows.
    pub draining: bool,
}

/// A service, compiled.
#[derive(Clone, Debug)]
pub struct Service {
    /// Name.
    pub name: String,
    /// Stable key.
    pub key: u32,
    /// Algorithm.
    pub algorithm: Algorithm,
    /// Flow table on.
    pub flow_table: bool,
    /// Identifier limit.
    pub limit: u32,
    /// Table of endpoints taking new flows, naming each by its position
    /// in `endpoints` ([`Service::endpoint_at`]); `None` when there is none.
    pub table: Option<Table>,
    /// Endpoints, draining ones included, ordered by identifier, each
    /// once: as many records as endpoints (not as the limit allows).
    endpoints: Box<[Endpoint]>,
    /// The outer sources of the endpoints delivered by IP-in-IP (each
    /// once), which their records name.
    tunnel_src: Box<[Addr]>,
    /// The spec's `flow_table` and `table_size` (the fields above hold
    /// what they resolved to), so that [`Service::is_built_from`] needs no
    /// copy of the spec.
    asked: (bool, u32),
    /// The slots whose endpoint changed against the previous build.
    changes: SlotChanges,
    /// [`sync_mark`] of `changes.epoch()`, read on every pin hit.
    sync_mark: u8,
}

/// The slots of a service's table that choose another endpoint (another
/// identifier or incarnation, or none) than the previous table of the same
/// service, one bit per slot; and how many builds of the service so far
/// changed any slot (its change epoch). A service built without a previous
/// one has no bit set and epoch 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlotChanges {
    /// Bit `i % 64` of word `i / 64` for slot `i`; empty when no slot
    /// changed (or the table has none).
    bits: Box<[u64]>,
    /// Bits set.
    count: u32,
    /// Builds that changed any slot, this one included.
    epoch: u32,
}

impl SlotChanges {
    /// The changes from `prev` (a service's previous table and endpoints)
    /// to `next`. A table that goes away changes every flow's choice (to
    /// none) and so moves the epoch, with no slot to set.
    fn between(prev: Option<(&Option<Table>, &[Endpoint], u32)>, next: (&Option<Table>, &[Endpoint])) -> SlotChanges {
        let Some((prev_table, prev_eps, prev_epoch)) = prev else { return SlotChanges::default() };
        let (next_table, next_eps) = next;
        let Some(t) = next_table else {
            let epoch = prev_epoch + u32::from(prev_table.is_some());
            return SlotChanges { bits: Box::default(), count: 0, epoch };
        };
        let m = t.size() as usize;
        let mut bits = vec![0u64; m.div_ceil(64)];
        let mut count = 0u32;
        match prev_table.as_ref().filter(|p| p.size() == t.size()) {
            Some(p) => {
                // Position in the previous records -> position of the same
                // endpoint (identifier and incarnation) in the new ones.
                let moved: Vec<Option<u16>> = prev_eps
                    .iter()
                    .map(|e| {
                        let i = next_eps.binary_search_by_key(&e.id, |n| n.id).ok()?;
                        (next_eps[i].incarnation == e.incarnation).then(|| u16::try_from(i).unwrap_or(u16::MAX))
                    })
                    .collect();
                let (pe, ne) = (p.entries(), t.entries());
                for i in 0..m {
                    let was = moved.get(usize::from(pe.get(i))).copied().flatten();
                    if was != Some(ne.get(i)) {
                        bits[i / 64] |= 1 << (i % 64);
                        count += 1;
                    }
                }
            }
            // No table before, or one of another size: every slot changed.
            None => {
                for i in 0..m {
                    bits[i / 64] |= 1 << (i % 64);
                }
                count = u32::try_from(m).unwrap_or(u32::MAX);
            }
        }
        let epoch = prev_epoch + u32::from(count > 0);
        if count == 0 {
            bits = Vec::new();
        }
        SlotChanges { bits: bits.into_boxed_slice(), count, epoch }
    }

    /// True when slot `slot` chooses another endpoint than before.
    #[inline]
    pub fn contains(&self, slot: usize) -> bool {
        self.bits.get(slot / 64).is_some_and(|w| w >> (slot % 64) & 1 != 0)
    }

    /// Slots that changed.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Builds of the service that changed any slot (0: the table has been
    /// the same since the service was first built).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The bitmap, bit `i % 64` of word `i / 64` for slot `i` (empty when
    /// no slot changed).
    pub fn bits(&self) -> &[u64] {
        &self.bits
    }
}

impl Service {
    /// Compiles `spec`, as a new service: no slot counts as changed.
    pub fn build(spec: &ServiceSpec) -> Result<Service, TableError> {
        Service::build_after(spec, None)
    }

    /// Compiles `spec`, the next version of `prev` (the service of the
    /// same key in the snapshot being replaced, if any): the result knows
    /// which slots of its table changed against `prev`'s
    /// ([`Service::changes`]), one pass over the slots.
    pub fn build_after(spec: &ServiceSpec, prev: Option<&Service>) -> Result<Service, TableError> {
        let m = if spec.table_size == 0 { default_size(spec.limit) } else { spec.table_size };
        let takers: Vec<(EndpointId, u32)> =
            spec.endpoints.iter().filter(|e| !e.draining).map(|e| (e.id, e.weight)).collect();
        // Draining endpoints are checked too (limit, duplicates).
        let all: Vec<(EndpointId, u32)> = spec.endpoints.iter().map(|e| (e.id, 0)).collect();
        Table::build(m, spec.limit, &all)?;
        let mut specs: Vec<&EndpointSpec> = spec.endpoints.iter().collect();
        specs.sort_unstable_by_key(|e| e.id);
        let order: Vec<EndpointId> = specs.iter().map(|e| e.id).collect();
        let table = Table::build_positions(m, spec.limit, &takers, &order)?;
        let mut endpoints = Vec::with_capacity(specs.len());
        let mut tunnel_src: Vec<Addr> = Vec::new();
        for e in specs {
            let tunnel = match e.delivery {
                Delivery::L2 => 0,
                Delivery::IpIp { src } => {
                    let i = tunnel_src.iter().position(|&a| a == src).unwrap_or_else(|| {
                        tunnel_src.push(src);
                        tunnel_src.len() - 1
                    });
                    // At most one source per endpoint, and endpoints are
                    // fewer than 65537.
                    u32::try_from(i + 1).unwrap_or(u32::MAX)
                }
            };
            endpoints.push(Endpoint {
                addr: e.addr,
                id: e.id,
                incarnation: e.incarnation,
                weight: e.weight,
                counter: e.counter,
                tunnel,
                port: e.port,
                mac: e.mac,
                draining: e.draining,
            });
        }
        let prev = prev.filter(|p| p.key == spec.key).map(|p| (&p.table, &*p.endpoints, p.changes.epoch));
        let changes = SlotChanges::between(prev, (&table, &endpoints[..]));
        let sync_mark = sync_mark(changes.epoch);
        Ok(Service {
            name: spec.name.clone(),
            key: spec.key,
            algorithm: spec.algorithm,
            flow_table: spec.flow_table || spec.algorithm == Algorithm::Random,
            limit: spec.limit,
            table,
            endpoints: endpoints.into_boxed_slice(),
            tunnel_src: tunnel_src.into_boxed_slice(),
            asked: (spec.flow_table, spec.table_size),
            changes,
            sync_mark,
        })
    }

    /// The slots whose endpoint changed against the previous build.
    pub fn changes(&self) -> &SlotChanges {
        &self.changes
    }

    /// The mark a flow pin of this service carries once it has been
    /// checked for export in the current change epoch ([`sync_mark`]).
    #[inline(always)]
    pub fn sync_mark(&self) -> u8 {
        self.sync_mark
    }

    /// True when building `spec` would give this service: the same
    /// fields and the same endpoints (the control plane keeps built
    /// services instead of their specs, and compares with them).
    pub fn is_built_from(&self, spec: &ServiceSpec) -> bool {
        self.key == spec.key
            && self.algorithm == spec.algorithm
            && self.limit == spec.limit
            && self.asked == (spec.flow_table, spec.table_size)
            && self.endpoints().count() == spec.endpoints.len()
            && spec.endpoints.iter().all(|e| self.endpoint(e.id).is_some_and(|x| self.spec_of(x) == *e))
            && self.name == spec.name
    }

    /// The endpoint a table entry names (its position).
    #[inline(always)]
    pub fn endpoint_at(&self, at: u16) -> Option<&Endpoint> {
        self.endpoints.get(usize::from(at))
    }

    /// Where the record of the endpoint at `at` lives (for a prefetch; not
    /// read).
    #[inline(always)]
    pub fn endpoint_addr(&self, at: u16) -> *const u8 {
        self.endpoints.as_ptr().wrapping_add(usize::from(at)).cast()
    }

    /// The endpoint with identifier `id`.
    pub fn endpoint(&self, id: EndpointId) -> Option<&Endpoint> {
        self.endpoints.binary_search_by_key(&id, |e| e.id).ok().and_then(|i| self.endpoints.get(i))
    }

    /// The endpoint a flow was pinned to, if it is still the one that had
    /// the identifier then: first where it was when pinned, then by
    /// identifier (positions move when endpoints come or go).
    #[inline(always)]
    pub fn pinned(&self, pin: &Pin) -> Option<&Endpoint> {
        match self.endpoint_at(pin.at) {
            Some(e) if e.id == pin.endpoint => Some(e),
            _ => self.endpoint(pin.endpoint),
        }
        .filter(|e| e.incarnation == pin.incarnation)
    }

    /// The endpoint a flow-table pin names, if it is still the one that had
    /// the identifier then (as far as the pin's incarnation bits tell):
    /// first at the position of that number (identifiers are often dense),
    /// then by identifier.
    #[inline(always)]
    pub fn pinned_flow(&self, pin: FlowPin) -> Option<&Endpoint> {
        let id = pin.endpoint();
        match self.endpoint_at(id) {
            Some(e) if e.id == id => Some(e),
            _ => self.endpoint(id),
        }
        .filter(|e| pin.is_incarnation(e.incarnation))
    }

    /// The position of `ep`, one of this service's endpoints (0 for
    /// another).
    #[inline(always)]
    pub fn position(&self, ep: &Endpoint) -> u16 {
        let offset = (std::ptr::from_ref(ep) as usize).wrapping_sub(self.endpoints.as_ptr() as usize);
        u16::try_from(offset / std::mem::size_of::<Endpoint>()).ok().filter(|&i| usize::from(i) < self.endpoints.len()).unwrap_or(0)
    }

    /// Every endpoint, by identifier.
    pub fn endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints.iter()
    }

    /// Entries of the table each endpoint owns, in the order of
    /// [`Service::endpoints`] (all 0 without a table).
    pub fn entry_counts(&self) -> Vec<u32> {
        let n = u32::try_from(self.endpoints.len()).unwrap_or(u32::MAX);
        self.table.as_ref().map_or_else(|| vec![0; self.endpoints.len()], |t| t.counts(n))
    }

    /// How endpoint `ep` (one of this service's) is delivered.
    #[inline(always)]
    pub fn delivery(&self, ep: &Endpoint) -> Delivery {
        match (ep.tunnel as usize).checked_sub(1) {
            None => Delivery::L2,
            Some(i) => Delivery::IpIp { src: self.tunnel_src.get(i).copied().unwrap_or(Addr(0)) },
        }
    }

    /// The spec of endpoint `ep` (one of this service's).
    pub fn spec_of(&self, ep: &Endpoint) -> EndpointSpec {
        EndpointSpec {
            id: ep.id,
            incarnation: ep.incarnation,
            weight: ep.weight,
            draining: ep.draining,
            addr: ep.addr,
            port: ep.port,
            mac: ep.mac,
            delivery: self.delivery(ep),
            counter: ep.counter,
        }
    }

    /// True when at least one endpoint takes new flows.
    pub fn has_ready_endpoint(&self) -> bool {
        self.table.is_some()
    }

    /// Bytes of heap memory used: table, endpoint records and name.
    pub fn heap_bytes(&self) -> usize {
        self.table.as_ref().map_or(0, Table::heap_bytes)
            + self.endpoints.len() * std::mem::size_of::<Endpoint>()
            + self.tunnel_src.len() * std::mem::size_of::<Addr>()
            + self.changes.bits.len() * 8
            + self.name.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(id: u16, draining: bool) -> EndpointSpec {
        EndpointSpec {
            id,
            incarnation: 1,
            weight: 1,
            draining,
            addr: Addr::v4([10, 0, 0, u8::try_from(id).unwrap()]),
            port: 1,
            mac: [2, 0, 0, 0, 0, u8::try_from(id).unwrap()],
            delivery: Delivery::L2,
            counter: u32::from(id),
        }
    }

    fn spec(eps: Vec<EndpointSpec>) -> ServiceSpec {
        ServiceSpec {
            name: "s".into(),
            key: 1,
            algorithm: Algorithm::Maglev,
            flow_table: false,
            limit: 8,
            table_size: 0,
            endpoints: eps,
        }
    }

    #[test]
    fn draining_endpoints_get_no_new_flows_but_stay_known() {
        let s = Service::build(&spec(vec![ep(0, false), ep(3, true)])).unwrap();
        let t = s.table.as_ref().unwrap();
        assert_eq!(t.size(), default_size(8));
        assert!((0..t.size() as usize).all(|i| t.entries().get(i) == 0));
        assert!(s.endpoint(3).unwrap().draining);
        assert!(s.endpoint(1).is_none() && s.endpoint(99).is_none());
        assert_eq!(s.endpoints().count(), 2);
        let only_draining = Service::build(&spec(vec![ep(3, true)])).unwrap();
        assert!(!only_draining.has_ready_endpoint());
    }

    #[test]
    fn a_service_tells_the_spec_it_was_built_from() {
        let base = spec(vec![ep(0, false), ep(3, true)]);
        let s = Service::build(&base).unwrap();
        assert!(s.is_built_from(&base));
        assert!(s.is_built_from(&spec(vec![ep(3, true), ep(0, false)])), "the order of endpoints does not matter");
        let mut changes: Vec<ServiceSpec> = Vec::new();
        let mut c = base.clone();
        c.name = "t".into();
        changes.push(c);
        let mut c = base.clone();
        c.key = 2;
        changes.push(c);
        let mut c = base.clone();
        c.algorithm = Algorithm::Random;
        changes.push(c);
        let mut c = base.clone();
        c.flow_table = true;
        changes.push(c);
        let mut c = base.clone();
        c.limit = 16;
        changes.push(c);
        let mut c = base.clone();
        c.table_size = default_size(8);
        changes.push(c);
        changes.push(spec(vec![ep(0, false)]));
        changes.push(spec(vec![ep(0, false), ep(3, true), ep(5, false)]));
        changes.push(spec(vec![ep(0, false), ep(3, false)]));
        changes.push(spec(vec![ep(0, false), ep(0, false), ep(3, true)]));
        let mut c = base.clone();
        c.endpoints[0].weight = 2;
        changes.push(c);
        let mut c = base.clone();
        c.endpoints[1].incarnation = 9;
        changes.push(c);
        let mut c = base.clone();
        c.endpoints[1].mac[0] = 6;
        changes.push(c);
        for (i, c) in changes.iter().enumerate() {
            assert!(!s.is_built_from(c), "change {i} is seen: {c:?}");
        }
        // A random service always has a flow table: asking for one is
        // still a different spec.
        let mut r = base.clone();
        r.algorithm = Algorithm::Random;
        let built = Service::build(&r).unwrap();
        assert!(built.is_built_from(&r));
        r.flow_table = true;
        assert!(!built.is_built_from(&r));
    }

    #[test]
    fn endpoint_records_are_small_and_keep_their_delivery() {
        assert_eq!(std::mem::size_of::<Endpoint>(), 48);
        let a = Addr::v4([192, 0, 2, 1]);
        let b = Addr::v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        let mut eps = vec![ep(0, false), ep(1, false), ep(2, false), ep(5, true)];
        eps[1].delivery = Delivery::IpIp { src: a };
        eps[2].delivery = Delivery::IpIp { src: b };
        eps[3].delivery = Delivery::IpIp { src: a };
        let sp = spec(eps.clone());
        let s = Service::build(&sp).unwrap();
        for e in &eps {
            let got = s.endpoint(e.id).unwrap();
            assert_eq!(s.spec_of(got), *e);
            assert_eq!(s.delivery(got), e.delivery);
        }
        assert_eq!(s.tunnel_src.len(), 2, "each source once");
        assert!(s.is_built_from(&sp));
        let mut other = sp.clone();
        other.endpoints[3].delivery = Delivery::IpIp { src: b };
        assert!(!s.is_built_from(&other), "another tunnel source is another spec");
        other.endpoints[3].delivery = Delivery::L2;
        assert!(!s.is_built_from(&other));
    }

    #[test]
    fn endpoints_are_dense_and_pins_find_theirs_after_a_move() {
        let ids = [3u16, 5, 7];
        let mut sp = spec(ids.iter().map(|&i| ep(i, false)).collect());
        sp.endpoints.reverse();
        let s = Service::build(&sp).unwrap();
        assert_eq!(s.endpoints().map(|e| e.id).collect::<Vec<_>>(), ids, "by identifier, whatever the spec's order");
        let t = s.table.as_ref().unwrap();
        assert!((0..t.size() as usize).all(|i| t.entries().get(i) < 3), "entries are positions");
        assert_eq!(s.heap_bytes() - t.heap_bytes() - s.name.capacity(), 3 * 48, "a record per endpoint, not per identifier below 8");
        assert_eq!(s.entry_counts().iter().sum::<u32>(), t.size());
        for (at, e) in (0u16..).zip(s.endpoints()) {
            assert_eq!(s.endpoint_at(at), Some(e));
            assert_eq!(s.position(e), at);
            assert_eq!(s.endpoint(e.id), Some(e));
        }
        assert!(s.endpoint(4).is_none() && s.endpoint_at(3).is_none());
        // Identifier 5 pinned at position 1; then 4 arrives before it.
        let pin = Pin { service: 1, endpoint: 5, incarnation: 1, at: 1 };
        assert_eq!(s.pinned(&pin).map(|e| e.id), Some(5));
        let grown = Service::build(&spec([3u16, 4, 5, 7].iter().map(|&i| ep(i, false)).collect())).unwrap();
        assert_eq!(grown.endpoint_at(1).map(|e| e.id), Some(4));
        assert_eq!(grown.pinned(&pin).map(|e| e.id), Some(5), "found by identifier where it moved");
        assert!(grown.pinned(&Pin { incarnation: 2, ..pin }).is_none(), "another incarnation is another endpoint");
        assert!(grown.pinned(&Pin { endpoint: 6, ..pin }).is_none());
        assert!(grown.pinned(&Pin { at: 99, ..pin }).is_some(), "a hint past the end is only a hint");
    }

    /// (identifier, incarnation) each slot of `s`'s table chooses.
    fn choices(s: &Service) -> Vec<Option<(EndpointId, u32)>> {
        let t = s.table.as_ref().unwrap();
        (0..t.size() as usize).map(|i| s.endpoint_at(t.entries().get(i)).map(|e| (e.id, e.incarnation))).collect()
    }

    /// The slots a slot-by-slot comparison finds changed.
    fn diff(a: &Service, b: &Service) -> Vec<usize> {
        choices(a).iter().zip(choices(b)).enumerate().filter(|(_, (x, y))| **x != *y).map(|(i, _)| i).collect()
    }

    fn set(c: &SlotChanges, m: u32) -> Vec<usize> {
        (0..m as usize).filter(|&i| c.contains(i)).collect()
    }

    fn many(n: u16) -> ServiceSpec {
        let addr = |i: u16| {
            let [hi, lo] = i.to_be_bytes();
            Addr::v4([10, 0, hi, lo])
        };
        let mut sp = spec((0..n).map(|i| EndpointSpec { addr: addr(i), ..ep(0, false) }).collect());
        for (i, e) in (0u16..).zip(sp.endpoints.iter_mut()) {
            e.id = i;
            e.counter = u32::from(i);
        }
        sp.limit = 256;
        sp
    }

    #[test]
    fn a_rebuild_knows_which_slots_chose_another_endpoint() {
        for n in [10u16, 100] {
            let before = Service::build(&many(n)).unwrap();
            assert_eq!((before.changes().count(), before.changes().epoch(), before.sync_mark()), (0, 0, 0), "a new service: nothing changed");
            assert!(before.changes().bits().is_empty());
            let m = before.table.as_ref().unwrap().size();
            let after = Service::build_after(&many(n + 1), Some(&before)).unwrap();
            let want = diff(&before, &after);
            assert_eq!(set(after.changes(), m), want, "N = {n}: the bitmap is the slot-by-slot difference");
            assert_eq!(after.changes().count() as usize, want.len());
            // About 1/(N+1) of the slots go to the new endpoint; Maglev moves
            // few others.
            let share = f64::from(after.changes().count()) / f64::from(m);
            let ideal = 1.0 / f64::from(n + 1);
            assert!(share > ideal * 0.8 && share < ideal * 1.5, "N = {n}: {share} of the slots changed (ideal {ideal})");
            let to_new = want.iter().filter(|&&i| after.endpoint_at(after.table.as_ref().unwrap().entries().get(i)).unwrap().id == n).count();
            assert!(to_new * 10 >= want.len() * 9, "mostly to the new endpoint: {to_new} of {}", want.len());
            assert_eq!((after.changes().epoch(), after.sync_mark()), (1, 2));
            assert_eq!(after.changes().bits().len(), (m as usize).div_ceil(64));
            assert!(after.heap_bytes() >= before.heap_bytes() + (m as usize).div_ceil(64) * 8 - 8);

            // The same endpoints again: no slot changed, the epoch stays.
            let same = Service::build_after(&many(n + 1), Some(&after)).unwrap();
            assert_eq!((same.changes().count(), same.changes().epoch()), (0, 1));
            assert!(same.changes().bits().is_empty());
            // An endpoint of the same identifier but another incarnation is
            // another endpoint: every slot of it changed.
            let mut sp = many(n + 1);
            sp.endpoints[3].incarnation = 2;
            let reborn = Service::build_after(&sp, Some(&same)).unwrap();
            let owned: Vec<usize> = choices(&same).iter().enumerate().filter(|(_, c)| c.is_some_and(|c| c.0 == 3)).map(|(i, _)| i).collect();
            assert_eq!(set(reborn.changes(), m), owned);
            assert_eq!(reborn.changes().epoch(), 2);
            // An endpoint leaves (its slots and a few others change), one drains.
            let mut sp = many(n + 1);
            sp.endpoints.remove(5);
            sp.endpoints[0].draining = true;
            let fewer = Service::build_after(&sp, Some(&reborn)).unwrap();
            assert_eq!(set(fewer.changes(), m), diff(&reborn, &fewer));
            assert_eq!((fewer.changes().epoch(), fewer.sync_mark()), (3, 1));
            // Another service's key is not a previous version.
            let mut other = many(n + 1);
            other.key = 9;
            assert_eq!(Service::build_after(&other, Some(&fewer)).unwrap().changes(), &SlotChanges::default());
        }
    }

    #[test]
    fn a_table_that_comes_goes_or_resizes_changes_every_slot() {
        let all_draining = Service::build(&spec(vec![ep(0, true), ep(1, true)])).unwrap();
        let ready = Service::build_after(&spec(vec![ep(0, false), ep(1, true)]), Some(&all_draining)).unwrap();
        let m = ready.table.as_ref().unwrap().size();
        assert_eq!(ready.changes().count(), m, "a table where there was none");
        assert_eq!(ready.changes().epoch(), 1);
        let gone = Service::build_after(&spec(vec![ep(0, true), ep(1, true)]), Some(&ready)).unwrap();
        assert!(gone.table.is_none());
        assert_eq!((gone.changes().count(), gone.changes().epoch()), (0, 2), "no slots left, but every flow's choice changed");
        let mut bigger = spec(vec![ep(0, false), ep(1, true)]);
        bigger.table_size = 1031;
        let resized = Service::build_after(&bigger, Some(&ready)).unwrap();
        assert_eq!(resized.changes().count(), 1031);
        assert!(set(resized.changes(), 1031).len() == 1031);
    }

    #[test]
    fn limits_and_algorithms() {
        let e = Service::build(&spec(vec![ep(8, true)])).unwrap_err();
        assert_eq!(e, TableError::IdBeyondLimit { id: 8, limit: 8 });
        let mut r = spec(vec![ep(0, false)]);
        r.algorithm = Algorithm::Random;
        assert!(Service::build(&r).unwrap().flow_table, "random always remembers flows");
        assert_eq!("random".parse::<Algorithm>(), Ok(Algorithm::Random));
        assert!("rr".parse::<Algorithm>().is_err());
    }
}

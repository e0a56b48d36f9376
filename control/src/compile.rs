//! From the resolved model to a dataplane snapshot.
//!
//! The compiler places each endpoint (which port, which next hop, which
//! MAC), keeps stable counter slots and incarnations across compilations,
//! and caches each service's compiled form (which tells the spec it was
//! built from, so no copy of the spec is kept): a service whose spec did
//! not change is reused as it is, so only changed services' tables are
//! rebuilt. The route classifier is kept with the
//! routes it was built from and reused while they stay the same (a change
//! to endpoints does not touch them).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use sluice_dataplane::addr::Addr;
use sluice_dataplane::chunked::Chunked;
use sluice_dataplane::classify::{Classifier, RouteSpec};
use sluice_dataplane::maglev::TableError;
use sluice_dataplane::service::{Delivery, EndpointSpec, Service, ServiceSpec};
use sluice_dataplane::snapshot::{NextHop, PortInfo, Snapshot};
use tokio_util::sync::CancellationToken;

use crate::config::{GatewayConfig, IfAddr};
use crate::model::{DeliveryMode, EndpointDef, Resolved, ResolvedService};

/// A port as the compiler needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopoPort {
    /// Name.
    pub name: String,
    /// Its MAC.
    pub mac: [u8; 6],
    /// IP MTU.
    pub mtu: u16,
    /// The 802.1Q VLAN it serves (0: none).
    pub vlan: u16,
    /// The appliance's addresses on it.
    pub addresses: Vec<IfAddr>,
}

/// Ports and gateways.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// Ports, by index.
    pub ports: Vec<TopoPort>,
    /// Gateways.
    pub gateways: Vec<GatewayConfig>,
}

impl Topology {
    fn port_index(&self, name: &str) -> Option<u8> {
        self.ports.iter().position(|p| p.name == name).and_then(|i| u8::try_from(i).ok())
    }

    /// The port whose subnet holds `a`, and the appliance's address there.
    pub(crate) fn on_link(&self, a: Addr) -> Option<(u8, Addr)> {
        self.ports.iter().enumerate().find_map(|(i, p)| {
            let ifa = p.addresses.iter().find(|x| x.addr.is_v4() == a.is_v4() && x.network().contains(a))?;
            Some((u8::try_from(i).ok()?, ifa.addr))
        })
    }

    fn gateway(&self, v4: bool) -> Option<&GatewayConfig> {
        self.gateways.iter().find(|g| g.address.is_v4() == v4)
    }
}

/// Resolved next hops: `(port index, address)` to MAC, as the neighbour
/// follower reports them.
pub type NeighMap = HashMap<(u8, Addr), [u8; 6]>;

/// MACs the kernel resolved (ARP/ND on the exception interfaces).
pub trait Neighbors {
    /// The MAC of `addr` on port `port`, when resolved.
    fn mac(&self, port: u8, addr: Addr) -> Option<[u8; 6]>;

    /// A number that changes whenever any MAC does, when the table keeps
    /// one: with it, a compilation under the same epoch and topology as the
    /// last one knows no MAC changed without looking each one up again.
    fn epoch(&self) -> Option<u64> {
        None
    }
}

impl Neighbors for HashMap<(u8, Addr), [u8; 6]> {
    fn mac(&self, port: u8, addr: Addr) -> Option<[u8; 6]> {
        self.get(&(port, addr)).copied()
    }
}

/// Why an endpoint does or does not take traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum EndpointState {
    /// In the table.
    Ready,
    /// Established flows only.
    Draining,
    /// Waiting for the next hop's MAC.
    Unresolved,
    /// Cannot be reached as configured (the reason, behind a thin pointer:
    /// the state is 16 bytes, not 24).
    Unreachable(Arc<String>),
}

impl EndpointState {
    /// Short name for status and metrics.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            EndpointState::Ready => "ready",
            EndpointState::Draining => "draining",
            EndpointState::Unresolved => "unresolved",
            EndpointState::Unreachable(_) => "unreachable",
        }
    }
}

/// One endpoint after compilation: 80 bytes (the compiler keeps one per
/// endpoint of every service, the admin endpoint shows them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointStatus {
    /// Service (its definition's name, shared by all its endpoints).
    pub service: Arc<String>,
    /// Identifier.
    pub id: u32,
    /// Address.
    pub address: Addr,
    /// Weight.
    pub(crate) weight: u32,
    /// Next-hop MAC, when known.
    pub(crate) mac: Option<[u8; 6]>,
    /// Output port, by index (as the topology lists them).
    pub(crate) port: Option<u8>,
    /// State.
    pub(crate) state: EndpointState,
    /// Counter slot.
    pub(crate) counter: u32,
    /// The next hop whose MAC the kernel resolves for it; none when the
    /// configuration gives the MAC or it cannot be reached.
    pub(crate) hop: Option<LookedUp>,
}

/// A next hop looked up in the neighbour table, (port, address), in 18
/// bytes with byte alignment: an `Option<(u8, Addr)>` takes 48, a third of
/// every endpoint's status (100,000 endpoints: 3 MiB more).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LookedUp {
    port: u8,
    address: [u8; 16],
}

impl LookedUp {
    /// The next hop `address` on port `port`.
    pub(crate) fn new((port, address): (u8, Addr)) -> LookedUp {
        LookedUp { port, address: address.0.to_ne_bytes() }
    }

    /// (port, address).
    pub(crate) fn get(self) -> (u8, Addr) {
        (self.port, Addr(u128::from_ne_bytes(self.address)))
    }
}

/// A compilation's result.
#[derive(Debug)]
pub struct Compiled {
    /// The snapshot to publish, shared with the compiler (which builds the
    /// next one after a change to a few services on it): handing it over
    /// copies nothing.
    pub snapshot: Arc<Snapshot>,
    /// Services whose tables were (re)built.
    pub rebuilt: Vec<String>,
    /// Every endpoint, service by service (in name order), each service's
    /// by identifier; shared with the compiler's cache, so a compilation
    /// that changes one service copies no other service's statuses.
    pub endpoints: Statuses,
    /// Services by counter slot: (slot, name), in name order (shared with
    /// the compiler, which finds changed services in it).
    pub(crate) service_slots: Arc<Vec<(u32, String)>>,
    /// Counter slots handed out by this compilation (their counters start over).
    pub(crate) new_slots: NewSlots,
    /// Next hops whose MAC is missing: (port, address).
    pub(crate) unresolved: Vec<(u8, Addr)>,
    /// Every next hop in use (resolved or not): (port, address). The same
    /// list (shared) as the last compilation's while it did not change.
    pub(crate) next_hops: Arc<Vec<(u8, Addr)>>,
}

impl Compiled {
    /// Every endpoint's status, service by service.
    pub(crate) fn endpoint_statuses(&self) -> impl Iterator<Item = &EndpointStatus> {
        self.endpoints.iter().flat_map(|s| s.iter())
    }
}

/// The endpoints' statuses of every service, in name order, in chunks
/// that the compiler's copy shares: keeping the last compilation's and
/// replacing a few services' copies their chunks only (as a plain `Vec`,
/// each compilation would take and later drop a reference to every
/// service's statuses, 10,000 scattered reference counts twice).
pub(crate) type Statuses = Chunked<Arc<[EndpointStatus]>>;

/// Counter slots given out for the first time (or again) by a compilation.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct NewSlots {
    /// Service slots.
    pub(crate) services: Vec<u32>,
    /// Endpoint slots.
    pub(crate) endpoints: Vec<u32>,
}

/// Small integers (counter slots), reused first-freed-first.
#[derive(Debug)]
struct Slots {
    free: VecDeque<u32>,
    next: u32,
    cap: u32,
}

impl Slots {
    fn new(cap: u32) -> Self {
        Slots { free: VecDeque::new(), next: 0, cap }
    }

    /// A slot, noted in `new` and in `journal` (so [`Slots::undo`] can give
    /// it back); none when all are taken.
    fn take(&mut self, new: &mut Vec<u32>, journal: &mut Vec<(u32, bool)>) -> Option<u32> {
        let (s, recycled) = match self.free.pop_front() {
            Some(s) => (s, true),
            None if self.next < self.cap => {
                self.next += 1;
                (self.next - 1, false)
            }
            None => return None,
        };
        journal.push((s, recycled));
        new.push(s);
        Some(s)
    }

    /// Gives back, newest first, the slots handed out as `journal` records.
    fn undo(&mut self, journal: Vec<(u32, bool)>) {
        for (s, recycled) in journal.into_iter().rev() {
            if recycled {
                self.free.push_front(s);
            } else {
                self.next -= 1;
            }
        }
    }

    /// Frees `s` (reused after the slots freed before it).
    fn give(&mut self, s: u32) {
        self.free.push_back(s);
    }
}

/// What of an endpoint the compilation depends on: (identifier, address,
/// weight, draining, static MAC).
fn endpoint_input(e: &EndpointDef) -> (u32, Addr, u32, bool, Option<[u8; 6]>) {
    (e.id, e.address, e.weight, e.draining, e.mac)
}

/// What of a resolved service the compilation depends on (not where its
/// definitions came from): compared field by field, without a string but
/// the name, on every compilation for every service.
#[derive(Debug)]
struct Input {
    name: String,
    algorithm: sluice_dataplane::service::Algorithm,
    limit: u32,
    table_size: u32,
    flow_table: bool,
    delivery: DeliveryMode,
    /// The resolved endpoints, shared with the resolved model (only
    /// [`endpoint_input`] of each counts).
    endpoints: Arc<[EndpointDef]>,
}

impl Input {
    fn of(s: &ResolvedService) -> Input {
        Input {
            name: s.name.clone(),
            algorithm: s.algorithm,
            limit: s.limit,
            table_size: s.table_size,
            flow_table: s.flow_table,
            delivery: s.delivery,
            endpoints: Arc::clone(&s.endpoints),
        }
    }

    fn is(&self, s: &ResolvedService) -> bool {
        self.algorithm == s.algorithm
            && self.limit == s.limit
            && self.table_size == s.table_size
            && self.flow_table == s.flow_table
            && self.delivery == s.delivery
            && (Arc::ptr_eq(&self.endpoints, &s.endpoints)
                || self.endpoints.len() == s.endpoints.len()
                    && self.endpoints.iter().zip(s.endpoints.iter()).all(|(a, e)| endpoint_input(a) == endpoint_input(e)))
            && self.name == s.name
    }
}

/// What one service compiled to, kept while its inputs stay the same.
#[derive(Debug)]
struct Entry {
    /// The resolved service it was compiled from.
    input: Input,
    /// Its counter slot.
    key: u32,
    /// The built service (tables), which also tells the spec it was built
    /// from.
    svc: Arc<Service>,
    /// Its endpoints' statuses (with the next hop each looked up, and the
    /// MAC found), which also hold what each endpoint keeps while its
    /// address stays in the service: its counter slot and identifier.
    statuses: Arc<[EndpointStatus]>,
    /// Each status's endpoint's incarnation under its identifier (a new
    /// identifier for the same address is a new incarnation).
    incarnations: Box<[u32]>,
    /// Indices into `statuses`, by address (with `incarnations`, 8 bytes
    /// an endpoint, where a map from address to what it keeps takes 32).
    by_address: Box<[u32]>,
}

impl Entry {
    fn new(input: Input, key: u32, svc: Arc<Service>, statuses: Arc<[EndpointStatus]>, incarnations: Vec<u32>) -> Entry {
        // A service has fewer than 2^32 endpoints (identifiers are u16).
        let mut by_address: Vec<u32> = (0..u32::try_from(statuses.len()).unwrap_or(u32::MAX)).collect();
        by_address.sort_unstable_by_key(|&i| statuses[i as usize].address);
        Entry { input, key, svc, statuses, incarnations: incarnations.into_boxed_slice(), by_address: by_address.into_boxed_slice() }
    }

    /// The status of its endpoint at address `a`, with its incarnation.
    fn kept(&self, a: Addr) -> Option<(&EndpointStatus, u32)> {
        let i = self.by_address.binary_search_by_key(&a, |&i| self.statuses[i as usize].address).ok()?;
        let i = self.by_address[i] as usize;
        Some((self.statuses.get(i)?, *self.incarnations.get(i)?))
    }

    /// The next hops it looks up, and those not resolved yet (each
    /// endpoint's; a hop may appear more than once).
    fn hops(&self) -> impl Iterator<Item = ((u8, Addr), bool)> + '_ {
        self.statuses.iter().filter_map(|e| Some((e.hop?.get(), e.state == EndpointState::Unresolved)))
    }

    /// True when every MAC it looked up is still what `neigh` says.
    fn macs_hold(&self, neigh: &dyn Neighbors) -> bool {
        self.statuses.iter().all(|e| e.hop.is_none_or(|h| {
            let (port, a) = h.get();
            neigh.mac(port, a) == e.mac
        }))
    }
}

/// What one compilation did, to commit or undo it.
#[derive(Default)]
struct Journal {
    services: Vec<(u32, bool)>,
    endpoints: Vec<(u32, bool)>,
    next_incarnation: u32,
    /// Entries compiled anew, to replace the cached ones.
    fresh: Vec<(String, Entry)>,
}

/// Keeps what compilations share: one cache entry per service, so a
/// compilation costs the services that changed (plus a pass over the
/// others to see that they did not), not the whole model.
#[derive(Debug)]
pub struct Compiler {
    entries: HashMap<String, Entry>,
    service_slots: Slots,
    endpoint_slots: Slots,
    next_incarnation: u32,
    generation: u64,
    /// The topology and neighbour epoch of the last compilation (when the
    /// neighbour table has epochs), under which every entry is current.
    env: Option<(Topology, u64)>,
    /// Next hops the entries look up, with how many endpoints use each.
    hops: BTreeMap<HopKey, u32>,
    /// Next hops not resolved yet, with how many endpoints wait for each.
    waiting: BTreeMap<HopKey, u32>,
    /// Every next hop in use, made from `hops` and the gateways' next hops
    /// (kept with it), until the keys of `hops` change: one endpoint's
    /// change does not walk 100,000 next hops.
    hop_list: Option<(Vec<Hop>, Arc<Vec<Hop>>)>,
    /// The last classifier built, with the routes it was built from.
    classified: Option<(Vec<RouteSpec>, Arc<Classifier>)>,
    /// What the last compilation published, when it succeeded (its routes
    /// are those of `classified`: a failed compilation clears this).
    last: Option<Last>,
    /// Cancelled when the appliance stops: a compilation in flight is
    /// abandoned ([`CompileError::Abandoned`]) between two services.
    stop: Option<CancellationToken>,
}

/// Why a compilation failed: nothing of it is kept.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    /// Abandoned between two services because the appliance stops.
    #[error("abandoned: the appliance is stopping")]
    Abandoned,
    /// A service named as changed is not in the resolved model.
    #[error("service {0:?} is not in the model")]
    NotInModel(String),
    /// A change compiled on top of a compilation that has no routes.
    #[error("no routes compiled yet")]
    NoRoutes,
    /// Every service key is taken.
    #[error("more than {0} services: raise capacity.services")]
    Services(u32),
    /// Every endpoint counter slot is taken.
    #[error("more than {0} endpoints: raise capacity.endpoints")]
    Endpoints(u32),
    /// An endpoint identifier beyond the data plane's 16 bits.
    #[error("endpoint identifier {0} too large")]
    EndpointId(u32),
    /// A service's table cannot be built.
    #[error("service {service:?}: {error}")]
    Table {
        /// The service.
        service: String,
        /// Why.
        #[source]
        error: TableError,
    },
}

impl CompileError {
    /// The configuration key that raises the capacity this error ran out of.
    pub(crate) fn capacity_key(&self) -> Option<&'static str> {
        match self {
            CompileError::Services(_) => Some("capacity.services"),
            CompileError::Endpoints(_) => Some("capacity.endpoints"),
            _ => None,
        }
    }
}

/// The parts of the last compilation that a compilation of a few changed
/// services builds on.
#[derive(Debug)]
struct Last {
    snapshot: Arc<Snapshot>,
    statuses: Statuses,
    service_slots: Arc<Vec<(u32, String)>>,
}

/// A next hop: (port, address).
type Hop = (u8, Addr);

/// A next hop as a key of the compiler's counts: the port, then the
/// address's bytes, most significant first, so that keys sort as
/// [`Hop`]s do. 17 bytes with byte alignment where a `Hop` takes 32 (its
/// `u128` is 16-aligned): with every endpoint on a shared segment its own
/// next hop, 100,000 of them, 3.4 MiB less.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct HopKey([u8; 17]);

impl HopKey {
    fn of((port, a): Hop) -> HopKey {
        let mut k = [0u8; 17];
        k[0] = port;
        k[1..].copy_from_slice(&a.0.to_be_bytes());
        HopKey(k)
    }

    fn hop(self) -> Hop {
        let [port, rest @ ..] = self.0;
        (port, Addr(u128::from_be_bytes(rest)))
    }
}

/// Counts `entry`'s next hops in (`add`) or out of the compiler's totals.
/// Returns true when a next hop came into `hops` or left it.
fn count_hops(hops: &mut BTreeMap<HopKey, u32>, waiting: &mut BTreeMap<HopKey, u32>, entry: &Entry, add: bool) -> bool {
    let in_use = hops.len();
    for (h, unresolved) in entry.hops() {
        let h = HopKey::of(h);
        let maps: &mut [&mut BTreeMap<HopKey, u32>] = if unresolved { &mut [&mut *hops, &mut *waiting] } else { &mut [&mut *hops] };
        for m in maps.iter_mut() {
            if add {
                *m.entry(h).or_insert(0) += 1;
            } else if let std::collections::btree_map::Entry::Occupied(mut o) = m.entry(h) {
                *o.get_mut() -= 1;
                if *o.get() == 0 {
                    o.remove();
                }
            }
        }
    }
    // Only adds or only removes: the set changed when its size did.
    hops.len() != in_use
}

/// `extra` merged into the sorted keys of `counted`, sorted and without
/// duplicates.
fn merged(counted: &BTreeMap<HopKey, u32>, extra: &[(u8, Addr)]) -> Vec<(u8, Addr)> {
    let mut v: Vec<(u8, Addr)> = counted.keys().map(|k| k.hop()).collect();
    for h in extra {
        if let Err(i) = v.binary_search(h) {
            v.insert(i, *h);
        }
    }
    v
}

impl Compiler {
    /// A compiler with `max_services` service and `max_endpoints` endpoint
    /// counter slots.
    pub fn new(max_services: u32, max_endpoints: u32) -> Compiler {
        Compiler {
            entries: HashMap::new(),
            service_slots: Slots::new(max_services),
            endpoint_slots: Slots::new(max_endpoints),
            next_incarnation: 1,
            generation: 0,
            env: None,
            hops: BTreeMap::new(),
            waiting: BTreeMap::new(),
            hop_list: None,
            classified: None,
            last: None,
            stop: None,
        }
    }

    /// Abandons any compilation once `stop` is cancelled (checked between
    /// two services, and before a finished one is committed).
    pub(crate) fn abandon_when(&mut self, stop: CancellationToken) {
        self.stop = Some(stop);
    }

    /// True once the token given to [`Compiler::abandon_when`] is cancelled.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.as_ref().is_some_and(CancellationToken::is_cancelled)
    }

    /// Numbers the next snapshot compiled `generation` (and those after it
    /// from there), for a caller whose publisher numbers what it publishes.
    pub(crate) fn number_next(&mut self, generation: u64) {
        self.generation = generation.saturating_sub(1);
    }

    /// Compiles `r` for `topo`, with MACs from `neigh`. All or nothing: a
    /// compilation that fails leaves the compiler as it was (no counter
    /// slot, incarnation, cached table or generation is kept from it).
    pub fn compile(&mut self, r: &Resolved, topo: &Topology, neigh: &dyn Neighbors) -> Result<Compiled, CompileError> {
        self.compile_with(r, None, topo, neigh)
    }

    /// [`Compiler::compile`] after a change to the endpoints of the
    /// services `changed` only (the same services, routes and settings as
    /// the last compilation): compiles those and takes every other service,
    /// and the routes, from the last compilation without comparing them.
    /// Compiles everything instead when there is nothing to build on (no
    /// last compilation, or it failed; other services; the topology or the
    /// neighbour table changed since).
    pub fn compile_changed(&mut self, r: &Resolved, changed: &[String], topo: &Topology, neigh: &dyn Neighbors) -> Result<Compiled, CompileError> {
        self.compile_with(r, Some(changed), topo, neigh)
    }

    fn compile_with(&mut self, r: &Resolved, changed: Option<&[String]>, topo: &Topology, neigh: &dyn Neighbors) -> Result<Compiled, CompileError> {
        let mut j = Journal { next_incarnation: self.next_incarnation, ..Journal::default() };
        let at = changed.and_then(|c| Some((c, self.positions(r, c, topo, neigh)?)));
        let whole = at.is_none();
        let outcome = match (at, self.last.take()) {
            (Some((names, at)), Some(last)) => self.try_compile_changed(r, names, &at, last, topo, neigh, &mut j),
            _ => self.try_compile(r, topo, neigh, &mut j),
        };
        let outcome = match outcome {
            Ok(_) if self.stopping() => Err(CompileError::Abandoned),
            o => o,
        };
        match outcome {
            Ok(mut c) => {
                self.commit(r, j);
                if whole {
                    // A service kept as it was holds the endpoints it was
                    // compiled from: it takes these equal ones instead, so
                    // that the resolution they came from can be freed.
                    for (name, s) in &r.services {
                        if let Some(e) = self.entries.get_mut(name) {
                            if !Arc::ptr_eq(&e.input.endpoints, &s.endpoints) {
                                e.input.endpoints = Arc::clone(&s.endpoints);
                            }
                        }
                    }
                }
                self.env = neigh.epoch().map(|e| (topo.clone(), e));
                // try_compile left the gateways' next hops there.
                c.next_hops = self.hop_list(&c.next_hops);
                c.unresolved = merged(&self.waiting, &c.unresolved);
                self.last = Some(Last {
                    snapshot: Arc::clone(&c.snapshot),
                    statuses: c.endpoints.clone(),
                    service_slots: Arc::clone(&c.service_slots),
                });
                Ok(c)
            }
            Err(e) => {
                self.service_slots.undo(j.services);
                self.endpoint_slots.undo(j.endpoints);
                self.next_incarnation = j.next_incarnation;
                Err(e)
            }
        }
    }

    /// True when every cached entry is current for `topo` and `neigh`:
    /// nothing changed since the last compilation but the model.
    fn env_same(&self, topo: &Topology, neigh: &dyn Neighbors) -> bool {
        match (&self.env, neigh.epoch()) {
            (Some((t, e)), Some(now)) => *e == now && t == topo,
            _ => false,
        }
    }

    /// Where the services `changed` are in the last compilation, when a
    /// compilation of them alone can build on it.
    fn positions(&self, r: &Resolved, changed: &[String], topo: &Topology, neigh: &dyn Neighbors) -> Option<Vec<usize>> {
        let last = self.last.as_ref()?;
        if !self.env_same(topo, neigh) || last.service_slots.len() != r.services.len() {
            return None;
        }
        changed
            .iter()
            .map(|n| {
                let i = last.service_slots.binary_search_by(|(_, s)| s.as_str().cmp(n)).ok()?;
                r.services.contains_key(n).then_some(i)
            })
            .collect()
    }

    /// Compiles the services `changed` (at `at` in `last`) and takes the
    /// others from `last`.
    #[allow(clippy::too_many_arguments)]
    fn try_compile_changed(
        &mut self,
        r: &Resolved,
        changed: &[String],
        at: &[usize],
        last: Last,
        topo: &Topology,
        neigh: &dyn Neighbors,
        j: &mut Journal,
    ) -> Result<Compiled, CompileError> {
        let mut new = NewSlots::default();
        let mut statuses = last.statuses;
        let mut replaced: Vec<(usize, Arc<Service>)> = Vec::with_capacity(at.len());
        let mut rebuilt = Vec::new();
        // In name order, as a whole compilation numbers them.
        let mut order: Vec<(usize, &String)> = at.iter().copied().zip(changed).collect();
        order.sort_unstable();
        order.dedup();
        for (i, name) in order {
            if self.stopping() {
                return Err(CompileError::Abandoned);
            }
            let s = r.services.get(name).ok_or_else(|| CompileError::NotInModel(name.clone()))?;
            let old = self.entries.get(name);
            let mut ids = Ids {
                services: &mut self.service_slots,
                endpoints: &mut self.endpoint_slots,
                next_incarnation: &mut self.next_incarnation,
            };
            let e = compile_service(s, old, topo, neigh, &mut ids, &mut new, j)?;
            if old.is_none_or(|o| !Arc::ptr_eq(&o.svc, &e.svc)) {
                rebuilt.push(name.clone());
            }
            replaced.push((i, Arc::clone(&e.svc)));
            if let Some(st) = statuses.get_mut(i) {
                *st = Arc::clone(&e.statuses);
            }
            j.fresh.push((name.clone(), e));
        }
        let (mut hops, mut unresolved) = (Vec::new(), Vec::new());
        let (gateway_v4, gateway_v6) = gateways(topo, neigh, &mut hops, &mut unresolved);
        let Some((routes, classifier)) = &self.classified else {
            return Err(CompileError::NoRoutes);
        };
        self.generation += 1;
        debug_assert!(Arc::ptr_eq(classifier, &last.snapshot.classifier));
        let snapshot = Arc::new(last.snapshot.with_changed(self.generation, routes, &replaced, ports(topo), gateway_v4, gateway_v6).with_own(own(topo)));
        Ok(Compiled { snapshot, rebuilt, endpoints: statuses, service_slots: last.service_slots, new_slots: new, unresolved, next_hops: Arc::new(hops) })
    }

    /// Every next hop in use: the entries' and `gateways`.
    fn hop_list(&mut self, gateways: &[Hop]) -> Arc<Vec<Hop>> {
        match &self.hop_list {
            Some((g, all)) if g.as_slice() == gateways => Arc::clone(all),
            _ => {
                let all = Arc::new(merged(&self.hops, gateways));
                self.hop_list = Some((gateways.to_vec(), Arc::clone(&all)));
                all
            }
        }
    }

    /// Keeps the entries compiled anew and frees the slots of services and
    /// endpoints that left.
    fn commit(&mut self, r: &Resolved, j: Journal) {
        for (name, entry) in j.fresh {
            let mut moved = count_hops(&mut self.hops, &mut self.waiting, &entry, true);
            if let Some(old) = self.entries.insert(name, entry) {
                moved |= count_hops(&mut self.hops, &mut self.waiting, &old, false);
                let now = &self.entries[old.input.name.as_str()];
                for e in old.statuses.iter() {
                    if now.kept(e.address).is_none() {
                        self.endpoint_slots.give(e.counter);
                    }
                }
            }
            if moved {
                self.hop_list = None;
            }
        }
        if self.entries.len() != r.services.len() {
            let gone: Vec<String> = self.entries.keys().filter(|k| !r.services.contains_key(*k)).cloned().collect();
            for name in gone {
                if let Some(old) = self.entries.remove(&name) {
                    if count_hops(&mut self.hops, &mut self.waiting, &old, false) {
                        self.hop_list = None;
                    }
                    self.service_slots.give(old.key);
                    for e in old.statuses.iter() {
                        self.endpoint_slots.give(e.counter);
                    }
                }
            }
        }
    }

    fn try_compile(&mut self, r: &Resolved, topo: &Topology, neigh: &dyn Neighbors, j: &mut Journal) -> Result<Compiled, CompileError> {
        let mut new = NewSlots::default();
        let env_same = self.env_same(topo, neigh);
        let mut services = Vec::with_capacity(r.services.len());
        let mut statuses = Vec::with_capacity(r.services.len());
        let mut index: HashMap<&str, u32> = HashMap::with_capacity(r.services.len());
        let mut rebuilt = Vec::new();
        let mut service_slots = Vec::with_capacity(r.services.len());
        let mut unresolved = Vec::new();
        let mut hops = Vec::new();
        for (name, s) in &r.services {
            if self.stopping() {
                return Err(CompileError::Abandoned);
            }
            let old = self.entries.get(name);
            let (key, svc, st) = match old {
                Some(e) if e.input.is(s) && (env_same || e.macs_hold(neigh)) => {
                    (e.key, Arc::clone(&e.svc), Arc::clone(&e.statuses))
                }
                _ => {
                    let mut ids = Ids {
                        services: &mut self.service_slots,
                        endpoints: &mut self.endpoint_slots,
                        next_incarnation: &mut self.next_incarnation,
                    };
                    let e = compile_service(s, old, topo, neigh, &mut ids, &mut new, j)?;
                    let out = (e.key, Arc::clone(&e.svc), Arc::clone(&e.statuses));
                    if old.is_none_or(|o| !Arc::ptr_eq(&o.svc, &e.svc)) {
                        rebuilt.push(name.clone());
                    }
                    j.fresh.push((name.clone(), e));
                    out
                }
            };
            service_slots.push((key, name.clone()));
            index.insert(name, u32::try_from(services.len()).unwrap_or(u32::MAX));
            services.push(svc);
            statuses.push(st);
        }

        let routes: Vec<RouteSpec> = r
            .routes
            .iter()
            .filter_map(|rt| {
                Some(RouteSpec {
                    name: rt.name.clone(),
                    priority: rt.priority,
                    service: *index.get(rt.service.as_str())?,
                    matches: rt.matches.clone(),
                })
            })
            .collect();

        let (gateway_v4, gateway_v6) = gateways(topo, neigh, &mut hops, &mut unresolved);
        self.generation += 1;
        // A cache by content: kept even if this compilation is not
        // committed, as it stays true of those routes.
        let classifier = match &self.classified {
            Some((built_from, c)) if *built_from == routes => Arc::clone(c),
            _ => {
                let c = Arc::new(Classifier::build(&routes));
                self.classified = Some((routes.clone(), Arc::clone(&c)));
                c
            }
        };
        let snapshot = Arc::new(Snapshot::with_classifier(self.generation, &routes, classifier, services, ports(topo), gateway_v4, gateway_v6).with_own(own(topo)));
        Ok(Compiled { snapshot, rebuilt, endpoints: statuses.into(), service_slots: Arc::new(service_slots), new_slots: new, unresolved, next_hops: Arc::new(hops) })
    }
}

/// The gateways' next hops (IPv4, IPv6); those whose MAC the kernel
/// resolves go to `hops`, those not resolved yet to `unresolved` too.
fn gateways(topo: &Topology, neigh: &dyn Neighbors, hops: &mut Vec<(u8, Addr)>, unresolved: &mut Vec<(u8, Addr)>) -> (Option<NextHop>, Option<NextHop>) {
    let mut gw = |v4: bool| -> Option<NextHop> {
        let g = topo.gateway(v4)?;
        let port = topo.port_index(&g.port)?;
        if g.mac.is_none() {
            hops.push((port, g.address));
        }
        let mac = g.mac.or_else(|| neigh.mac(port, g.address));
        if mac.is_none() {
            unresolved.push((port, g.address));
        }
        Some(NextHop { port, mac: mac? })
    };
    (gw(true), gw(false))
}

/// The ports as the snapshot has them.
fn ports(topo: &Topology) -> Vec<PortInfo> {
    topo.ports.iter().map(|p| PortInfo { mac: p.mac, mtu: p.mtu, vlan: p.vlan }).collect()
}

/// The appliance's own addresses, every port's.
fn own(topo: &Topology) -> Arc<[Addr]> {
    topo.ports.iter().flat_map(|p| p.addresses.iter().map(|a| a.addr)).collect()
}

/// The compiler's numbering, lent to [`compile_service`].
struct Ids<'a> {
    services: &'a mut Slots,
    endpoints: &'a mut Slots,
    next_incarnation: &'a mut u32,
}

/// Compiles one service whose inputs changed (or that is new), reusing
/// from its previous entry the counter slots, incarnations and, when the
/// result is the same, the built tables.
fn compile_service(
    s: &ResolvedService,
    old: Option<&Entry>,
    topo: &Topology,
    neigh: &dyn Neighbors,
    ids: &mut Ids<'_>,
    new: &mut NewSlots,
    j: &mut Journal,
) -> Result<Entry, CompileError> {
    let name = &s.name;
    let key = match old {
        Some(e) => e.key,
        None => ids
            .services
            .take(&mut new.services, &mut j.services)
            .ok_or(CompileError::Services(ids.services.cap))?,
    };
    let mut statuses = Vec::with_capacity(s.endpoints.len());
    let mut incarnations = Vec::with_capacity(s.endpoints.len());
    let mut specs = Vec::with_capacity(s.endpoints.len());
    for e in s.endpoints.iter() {
        let kept = old.and_then(|o| o.kept(e.address));
        let counter = match kept {
            Some((k, _)) => k.counter,
            None => ids.endpoints.take(&mut new.endpoints, &mut j.endpoints).ok_or(CompileError::Endpoints(ids.endpoints.cap))?,
        };
        let incarnation = match kept {
            Some((k, incarnation)) if k.id == e.id => incarnation,
            _ => {
                *ids.next_incarnation = ids.next_incarnation.wrapping_add(1).max(1);
                *ids.next_incarnation
            }
        };
        let p = place(e, s.delivery, topo, neigh);
        statuses.push(EndpointStatus {
            service: Arc::clone(&e.service),
            id: e.id,
            address: e.address,
            weight: e.weight,
            mac: p.placed.map(|x| x.mac),
            port: p.placed.map(|x| x.port),
            state: if p.state == EndpointState::Ready && e.draining { EndpointState::Draining } else { p.state },
            counter,
            hop: p.hop.map(LookedUp::new),
        });
        incarnations.push(incarnation);
        if let Some(pl) = p.placed {
            specs.push(EndpointSpec {
                id: u16::try_from(e.id).map_err(|_| CompileError::EndpointId(e.id))?,
                incarnation,
                weight: e.weight,
                draining: e.draining,
                addr: e.address,
                port: pl.port,
                mac: pl.mac,
                delivery: pl.delivery,
                counter,
            });
        }
    }
    let spec = ServiceSpec {
        name: name.clone(),
        key,
        algorithm: s.algorithm,
        flow_table: s.flow_table,
        limit: s.limit,
        table_size: s.table_size,
        endpoints: specs,
    };
    // Built after the previous version, the service knows which slots of
    // its table changed: the pins sibling sync exports.
    let svc = match old {
        Some(o) if o.svc.is_built_from(&spec) => Arc::clone(&o.svc),
        _ => Arc::new(Service::build_after(&spec, old.map(|o| &*o.svc)).map_err(|error| CompileError::Table { service: name.clone(), error })?),
    };
    Ok(Entry::new(Input::of(s), key, svc, statuses.into(), incarnations))
}

#[derive(Clone, Copy)]
struct Placed {
    port: u8,
    mac: [u8; 6],
    delivery: Delivery,
}

/// Where and how an endpoint is reached, or why not.
struct Place {
    placed: Option<Placed>,
    state: EndpointState,
    /// The next hop looked up in the neighbour table.
    hop: Option<(u8, Addr)>,
}

/// Where and how an endpoint is reached.
fn place(e: &EndpointDef, mode: DeliveryMode, topo: &Topology, neigh: &dyn Neighbors) -> Place {
    let unreachable = |why: String| Place { placed: None, state: EndpointState::Unreachable(Arc::new(why)), hop: None };
    let link = topo.on_link(e.address);
    // The next hop, and its MAC when the configuration gives it (the
    // endpoint's own `mac`, or the gateway's).
    let (port, hop, delivery, static_mac) = match (mode, link) {
        (DeliveryMode::L2, Some((port, _))) => (port, e.address, Delivery::L2, e.mac),
        (DeliveryMode::L2, None) => {
            return unreachable(format!(
                "{} is on no port's subnet (l2 delivery needs the endpoint on a shared segment; use delivery: ipip for routed endpoints)",
                e.address
            ));
        }
        (DeliveryMode::IpIp, Some((port, src))) => (port, e.address, Delivery::IpIp { src }, e.mac),
        (DeliveryMode::IpIp, None) => {
            let Some(g) = topo.gateway(e.address.is_v4()) else {
                return unreachable(format!("{} is off-link and there is no gateway for its family", e.address));
            };
            let Some(port) = topo.port_index(&g.port) else {
                return unreachable(format!("gateway port {:?} is unknown", g.port));
            };
            let Some(src) = topo.ports[usize::from(port)].addresses.iter().find(|a| a.addr.is_v4() == e.address.is_v4()) else {
                return unreachable(format!("port {:?} has no address to tunnel from", g.port));
            };
            (port, g.address, Delivery::IpIp { src: src.addr }, g.mac)
        }
    };
    let looked_up = static_mac.is_none().then_some((port, hop));
    match static_mac.or_else(|| neigh.mac(port, hop)) {
        Some(mac) => Place { placed: Some(Placed { port, mac, delivery }), state: EndpointState::Ready, hop: looked_up },
        None => Place { placed: None, state: EndpointState::Unresolved, hop: looked_up },
    }
}

/// Panics unless `a` and `b` send every slot of every service's table to
/// the same endpoint (the whole record: address, MAC, port, incarnation).
/// A table's `Debug` shows only its size, so a stale table of the right
/// size compares equal there.
#[cfg(test)]
pub(crate) fn assert_same_tables(a: &Snapshot, b: &Snapshot) {
    let names = |s: &Snapshot| s.services.iter().map(|x| x.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(a), names(b), "the services");
    let slots = |s: &Service| {
        s.table.as_ref().map(|t| (0..t.size() as usize).map(|i| s.endpoint_at(t.entries().get(i)).copied()).collect::<Vec<_>>())
    };
    for (x, y) in a.services.iter().zip(b.services.iter()) {
        let (sx, sy) = (slots(x), slots(y));
        assert_eq!(sx.as_ref().map(Vec::len), sy.as_ref().map(Vec::len), "{}: the table's size", x.name);
        if let Some(i) = sx.iter().flatten().zip(sy.iter().flatten()).position(|(p, q)| p != q) {
            let (sx, sy) = (sx.unwrap_or_default(), sy.unwrap_or_default());
            panic!("{}: slot {i} sends to {:?} in one and to {:?} in the other", x.name, sx[i], sy[i]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Defaults, Desired, Model, Origin, RouteDef, ServiceDef};
    use sluice_dataplane::classify::RouteMatch;

    #[test]
    fn an_endpoint_status_is_80_bytes_and_keeps_its_next_hop() {
        // 100,000 endpoints: 10.7 MiB at 112 bytes (a fat name and port
        // name each, a 24-byte state), 7.6 MiB at 80.
        assert_eq!(std::mem::size_of::<EndpointStatus>(), 80);
        for a in ["10.200.0.11", "fd00::1:2"] {
            let h = (3, a.parse().unwrap());
            assert_eq!(LookedUp::new(h).get(), h);
        }
    }

    /// A status names its service with the resolved endpoint's own name
    /// (one allocation per service, not one more per compilation) and its
    /// port by index.
    #[test]
    fn a_status_shares_its_endpoints_service_name_and_names_its_port_by_index() {
        let neigh: HashMap<(u8, Addr), [u8; 6]> =
            [((1, "10.200.0.11".parse().unwrap()), [2, 0xee, 0, 0, 0, 11]), ((0, "10.100.0.7".parse().unwrap()), [2, 0xee, 0, 0, 0, 7])].into();
        let r = resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.100.0.7"), ep("web", 2, "10.9.9.9")]);
        let out = Compiler::new(16, 64).compile(&r, &topo(), &neigh).unwrap();
        let st: Vec<&EndpointStatus> = out.endpoint_statuses().collect();
        assert_eq!(st.len(), 3);
        for (s, e) in st.iter().zip(r.services["web"].endpoints.iter()) {
            assert!(Arc::ptr_eq(&s.service, &e.service), "{}", e.address);
        }
        assert_eq!((st[0].port, &st[0].state), (Some(1), &EndpointState::Ready), "out of \"back\", the second port");
        assert_eq!((st[1].port, &st[1].state), (Some(0), &EndpointState::Ready), "out of \"front\"");
        assert!(matches!(&st[2].state, EndpointState::Unreachable(why) if why.contains("on no port's subnet")), "{:?}", st[2].state);
        assert_eq!(st[2].port, None);
    }

    fn topo() -> Topology {
        let ifa = |s: &str| {
            let (a, l) = s.split_once('/').unwrap();
            IfAddr { addr: a.parse().unwrap(), prefix: l.parse().unwrap() }
        };
        Topology {
            ports: vec![
                TopoPort { name: "front".into(), mac: [2, 0, 0, 0, 0, 1], mtu: 1500, vlan: 0, addresses: vec![ifa("10.100.0.1/24")] },
                TopoPort { name: "back".into(), mac: [2, 0, 0, 0, 0, 2], mtu: 1500, vlan: 0, addresses: vec![ifa("10.200.0.1/24")] },
            ],
            gateways: vec![GatewayConfig { address: "10.100.0.2".parse().unwrap(), port: "front".into(), mac: None }],
        }
    }

    fn ep(svc: &str, id: u32, a: &str) -> EndpointDef {
        EndpointDef { service: Arc::new(svc.to_owned()), id, address: a.parse().unwrap(), weight: 1, draining: false, mac: None, origin: Arc::default() }
    }

    fn resolved(eps: Vec<EndpointDef>) -> Resolved {
        let mut m = Model::default();
        m.set(
            "t",
            Desired {
                services: vec![
                    ServiceDef { name: "web".into(), ..Default::default() },
                    ServiceDef { name: "dns".into(), ..Default::default() },
                ],
                endpoints: eps.into(),
                routes: vec![RouteDef {
                    name: "r".into(),
                    service: "web".into(),
                    priority: 0,
                    matches: RouteMatch { vips: vec!["20.0.0.1".parse().unwrap()], ..RouteMatch::default() }.into(),
                    origin: Origin::default(),
                }],
            },
        );
        m.resolve(&Defaults::default()).unwrap()
    }

    #[test]
    fn next_hop_keys_sort_as_next_hops_and_give_them_back() {
        let hops: Vec<Hop> = [(0, "10.0.0.2"), (0, "10.0.0.10"), (0, "::1"), (1, "0.0.0.1"), (1, "2001:db8::1"), (0, "255.255.255.255")]
            .iter()
            .map(|&(p, a)| (p, a.parse().unwrap()))
            .collect();
        let mut by_hop = hops.clone();
        by_hop.sort();
        let mut by_key: Vec<HopKey> = hops.iter().map(|&h| HopKey::of(h)).collect();
        by_key.sort();
        assert_eq!(by_key.iter().map(|k| k.hop()).collect::<Vec<_>>(), by_hop);
        assert_eq!(std::mem::size_of::<HopKey>(), 17);
    }

    #[test]
    fn a_kept_service_holds_the_latest_resolution_of_its_endpoints_not_a_copy() {
        let neigh: HashMap<(u8, Addr), [u8; 6]> =
            [((1, "10.200.0.11".parse().unwrap()), [2, 0xee, 0, 0, 0, 11]), ((1, "10.200.0.12".parse().unwrap()), [2, 0xee, 0, 0, 0, 12])].into();
        let eps = || vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.12"), ep("dns", 0, "10.200.0.11")];
        let mut c = Compiler::new(16, 64);
        let r1 = resolved(eps());
        c.compile(&r1, &topo(), &neigh).unwrap();
        let held = |c: &Compiler, n: &str| Arc::clone(&c.entries[n].input.endpoints);
        assert!(Arc::ptr_eq(&held(&c, "web"), &r1.services["web"].endpoints), "shared, not copied");
        // Resolved again, equal: nothing is rebuilt, and the compiler lets
        // go of the first resolution.
        let r2 = resolved(eps());
        assert!(!Arc::ptr_eq(&r1.services["web"].endpoints, &r2.services["web"].endpoints));
        let again = c.compile(&r2, &topo(), &neigh).unwrap();
        assert!(again.rebuilt.is_empty());
        for n in ["web", "dns"] {
            assert!(Arc::ptr_eq(&held(&c, n), &r2.services[n].endpoints), "{n}");
            assert_eq!(Arc::strong_count(&r1.services[n].endpoints), 1, "{n}: only the first resolution holds its endpoints");
        }
        // A change of weight is a change.
        let mut heavier = eps();
        heavier[1].weight = 3;
        let r3 = resolved(heavier);
        assert_eq!(c.compile(&r3, &topo(), &neigh).unwrap().rebuilt, vec!["web".to_string()]);
    }

    #[test]
    fn only_changed_services_are_rebuilt_and_slots_are_stable() {
        let mut neigh: HashMap<(u8, Addr), [u8; 6]> = HashMap::new();
        neigh.insert((1, "10.200.0.11".parse().unwrap()), [2, 0xee, 0, 0, 0, 11]);
        neigh.insert((0, "10.100.0.2".parse().unwrap()), [2, 0xcc, 0, 0, 0, 2]);
        let mut c = Compiler::new(16, 64);
        let r1 = resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.12"), ep("dns", 0, "10.200.0.11")]);
        let a = c.compile(&r1, &topo(), &neigh).unwrap();
        assert_eq!(a.rebuilt, vec!["dns".to_string(), "web".to_string()]);
        assert_eq!(a.unresolved, vec![(1, "10.200.0.12".parse().unwrap())]);
        let states: Vec<&str> = a.endpoint_statuses().map(|e| e.state.name()).collect();
        assert_eq!(states, vec!["ready", "ready", "unresolved"]);
        assert!(a.snapshot.gateway_v4.is_some());
        let own: Vec<Addr> = vec!["10.100.0.1".parse().unwrap(), "10.200.0.1".parse().unwrap()];
        assert_eq!(&*a.snapshot.own, &own[..], "the ports' addresses: answers to them are the kernel's");

        // The missing MAC arrives: only "web" changes.
        neigh.insert((1, "10.200.0.12".parse().unwrap()), [2, 0xee, 0, 0, 0, 12]);
        let b = c.compile(&r1, &topo(), &neigh).unwrap();
        assert_eq!(&*b.snapshot.own, &own[..], "and in a snapshot that changes a service only");
        assert_eq!(b.rebuilt, vec!["web".to_string()]);
        assert!(Arc::ptr_eq(&a.snapshot.services[0], &b.snapshot.services[0]), "dns reused");
        assert_eq!(b.snapshot.generation, a.snapshot.generation + 1);
        assert_eq!(a.service_slots, b.service_slots);
        assert!(b.new_slots.services.is_empty() && b.new_slots.endpoints.is_empty());

        // Identifier 1 goes to another address: a new incarnation.
        let r2 = resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.13"), ep("dns", 0, "10.200.0.11")]);
        neigh.insert((1, "10.200.0.13".parse().unwrap()), [2, 0xee, 0, 0, 0, 13]);
        let c2 = c.compile(&r2, &topo(), &neigh).unwrap();
        let web = &c2.snapshot.services[1];
        let old = &b.snapshot.services[1];
        assert_ne!(web.endpoint(1).unwrap().incarnation, old.endpoint(1).unwrap().incarnation);
        assert_eq!(web.endpoint(0).unwrap().incarnation, old.endpoint(0).unwrap().incarnation);
        assert_eq!(c2.new_slots.endpoints.len(), 1);

        // An address that takes another identifier keeps its counter slot
        // and is a new incarnation; the others keep theirs.
        let r3 = resolved(vec![ep("web", 2, "10.200.0.11"), ep("web", 1, "10.200.0.13"), ep("dns", 0, "10.200.0.11")]);
        let c3 = c.compile(&r3, &topo(), &neigh).unwrap();
        let (now, before) = (&c3.snapshot.services[1], &c2.snapshot.services[1]);
        assert_eq!(now.endpoint(2).unwrap().counter, before.endpoint(0).unwrap().counter);
        assert_ne!(now.endpoint(2).unwrap().incarnation, before.endpoint(0).unwrap().incarnation);
        assert_eq!(now.endpoint(1).unwrap().incarnation, before.endpoint(1).unwrap().incarnation);
        assert!(now.endpoint(0).is_none());
        assert!(c3.new_slots.endpoints.is_empty());
        assert_eq!(c3.rebuilt, vec!["web".to_string()]);
    }

    #[test]
    fn the_classifier_is_kept_while_the_routes_stay_and_rebuilt_when_they_change() {
        let neigh: HashMap<(u8, Addr), [u8; 6]> = HashMap::new();
        let mut c = Compiler::new(16, 64);
        let vip = |s: &str| s.parse::<Addr>().unwrap();
        let a = c.compile(&resolved(vec![ep("web", 0, "10.200.0.11")]), &topo(), &neigh).unwrap();
        // An endpoint change: the same routes, the same classification.
        let b = c.compile(&resolved(vec![ep("web", 0, "10.200.0.12")]), &topo(), &neigh).unwrap();
        assert!(Arc::ptr_eq(&b.snapshot.classifier, &a.snapshot.classifier), "kept");
        // A route to a new VIP: built again, the new VIP is there.
        let mut r = resolved(vec![ep("web", 0, "10.200.0.12")]);
        Arc::make_mut(&mut r.routes[0].matches).vips.push("20.0.0.2".parse().unwrap());
        let d = c.compile(&r, &topo(), &neigh).unwrap();
        assert!(d.snapshot.classifier.is_vip(vip("20.0.0.2")));
        assert!(!b.snapshot.classifier.is_vip(vip("20.0.0.2")));
        // And back: the cache follows the routes, not the order of calls.
        let e = c.compile(&resolved(vec![ep("web", 0, "10.200.0.12")]), &topo(), &neigh).unwrap();
        assert!(!e.snapshot.classifier.is_vip(vip("20.0.0.2")));
        assert!(e.snapshot.classifier.is_vip(vip("20.0.0.1")));
    }

    #[test]
    fn compiling_the_changed_services_alone_gives_what_compiling_everything_gives() {
        // Neighbours with epochs (`Epoch`, as the reconciler's): what lets a
        // compilation trust that unchanged services are still current.
        let mut neigh: HashMap<(u8, Addr), [u8; 6]> = HashMap::new();
        for i in 11..16 {
            neigh.insert((1, format!("10.200.0.{i}").parse().unwrap()), [2, 0xee, 0, 0, 0, i]);
        }
        let mut neigh2 = neigh.clone();
        neigh2.insert((1, "10.200.0.19".parse().unwrap()), [2, 0xee, 0, 0, 0, 19]);
        let (n1, n2) = (Epoch(neigh, 1), Epoch(neigh2, 2));
        let states = [
            resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.12"), ep("dns", 0, "10.200.0.11")]),
            // web: identifier 1 moves, 2 arrives (unresolved).
            resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.13"), ep("web", 2, "10.200.0.19"), ep("dns", 0, "10.200.0.11")]),
            // dns loses its endpoint, web one of its own.
            resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 2, "10.200.0.19")]),
        ];
        let changed = [vec![], vec!["web".to_owned()], vec!["web".to_owned(), "dns".to_owned()]];
        let (mut whole, mut part) = (Compiler::new(16, 64), Compiler::new(16, 64));
        for (k, (r, names)) in states.iter().zip(&changed).enumerate() {
            assert_eq!(part.positions(r, names, &topo(), &n1).is_some(), k > 0, "built on the last compilation after the first");
            let a = whole.compile(r, &topo(), &n1).unwrap();
            let b = part.compile_changed(r, names, &topo(), &n1).unwrap();
            assert_eq!(format!("{:?}", a.snapshot), format!("{:?}", b.snapshot));
            assert_same_tables(&a.snapshot, &b.snapshot);
            assert_eq!((&a.rebuilt, &a.endpoints, &a.service_slots), (&b.rebuilt, &b.endpoints, &b.service_slots));
            assert_eq!((&a.new_slots, &a.unresolved, &a.next_hops), (&b.new_slots, &b.unresolved, &b.next_hops));
        }
        // The neighbour table changed: the changed services alone would
        // miss the new MAC of an unchanged one, so everything is compiled.
        let r = &states[2];
        assert!(part.positions(r, &[], &topo(), &n2).is_none());
        let a = whole.compile(r, &topo(), &n2).unwrap();
        let b = part.compile_changed(r, &[], &topo(), &n2).unwrap();
        assert_eq!(a.rebuilt, vec!["web".to_string()], "the new MAC is in");
        assert_eq!(format!("{:?}", a.snapshot), format!("{:?}", b.snapshot));
        assert_same_tables(&a.snapshot, &b.snapshot);
        assert_eq!(a.rebuilt, b.rebuilt);
        // A failed compilation leaves nothing to build on.
        let mut tiny = Compiler::new(1, 64);
        assert!(tiny.compile(&states[0], &topo(), &n1).is_err());
        assert!(tiny.positions(&states[0], &[], &topo(), &n1).is_none());
    }

    #[test]
    fn a_compile_that_fails_leaves_no_slot_behind() {
        // Found: a compile failing on capacity kept the counter slots it had
        // handed out; the slot (recycled from a removed service) was then
        // not reported as new, so the service showed its previous owner's
        // counts.
        let one = |names: &[&str]| {
            let mut m = Model::default();
            m.set(
                "t",
                Desired { services: names.iter().map(|n| ServiceDef { name: (*n).into(), ..Default::default() }).collect(), ..Default::default() },
            );
            m.resolve(&Defaults::default()).unwrap()
        };
        let none = HashMap::new();
        let mut c = Compiler::new(2, 64);
        let a = c.compile(&one(&["a"]), &topo(), &none).unwrap();
        assert_eq!(a.new_slots.services, vec![0]);
        let b = c.compile(&one(&["b"]), &topo(), &none).unwrap();
        assert_eq!(b.new_slots.services, vec![1], "a's slot is freed only after this compile");
        let generation = b.snapshot.generation;
        // "c" takes a's old slot, then "d" and "e" overflow: the compile fails.
        assert!(c.compile(&one(&["c", "d", "e"]), &topo(), &none).unwrap_err().capacity_key() == Some("capacity.services"));
        let c2 = c.compile(&one(&["c"]), &topo(), &none).unwrap();
        assert_eq!(c2.new_slots.services, vec![0], "c's slot is new to it, so its counters start over");
        assert_eq!(c2.rebuilt, vec!["c".to_string()]);
        assert_eq!(c2.snapshot.generation, generation + 1, "a failed compile publishes no generation");
    }

    #[test]
    fn routed_endpoints_use_the_gateways_static_mac() {
        // Found by tests/xds_tables.rs: with a gateway whose MAC is given in
        // the configuration (no kernel interface to resolve it), every
        // IP-in-IP endpoint behind it stayed "unresolved".
        let mut t = topo();
        t.gateways[0].mac = Some([2, 0, 0, 0, 1, 0xfe]);
        let mut m = Model::default();
        m.set(
            "t",
            Desired {
                services: vec![ServiceDef { name: "web".into(), delivery: Some(DeliveryMode::IpIp), ..Default::default() }],
                endpoints: vec![ep("web", 0, "10.50.0.1"), ep("web", 1, "10.50.0.2")].into(),
                ..Default::default()
            },
        );
        let r = m.resolve(&Defaults::default()).unwrap();
        let out = Compiler::new(16, 64).compile(&r, &t, &HashMap::new()).unwrap();
        let states: Vec<&str> = out.endpoint_statuses().map(|e| e.state.name()).collect();
        assert_eq!(states, vec!["ready", "ready"]);
        assert!(out.unresolved.is_empty(), "{:?}", out.unresolved);
        let web = &out.snapshot.services[0];
        assert_eq!(web.endpoint(0).unwrap().mac, [2, 0, 0, 0, 1, 0xfe]);
    }

    #[test]
    fn unreachable_endpoints_say_why() {
        let mut c = Compiler::new(16, 64);
        let r = resolved(vec![ep("web", 0, "192.168.9.9")]);
        let out = c.compile(&r, &topo(), &HashMap::new()).unwrap();
        match &out.endpoint_statuses().next().unwrap().state {
            EndpointState::Unreachable(why) => assert!(why.contains("on no port's subnet"), "{why}"),
            s => panic!("{s:?}"),
        }
        let mut tiny = Compiler::new(1, 64);
        assert!(tiny.compile(&r, &topo(), &HashMap::new()).unwrap_err().capacity_key() == Some("capacity.services"));
    }

    /// A neighbour table with an epoch, as the reconciler keeps it.
    struct Epoch(HashMap<(u8, Addr), [u8; 6]>, u64);
    impl Neighbors for Epoch {
        fn mac(&self, port: u8, addr: Addr) -> Option<[u8; 6]> {
            self.0.get(&(port, addr)).copied()
        }
        fn epoch(&self) -> Option<u64> {
            Some(self.1)
        }
    }

    #[test]
    fn a_change_to_one_service_leaves_the_others_untouched() {
        let mut n = Epoch(HashMap::new(), 1);
        for i in 11..15 {
            n.0.insert((1, format!("10.200.0.{i}").parse().unwrap()), [2, 0xee, 0, 0, 0, i]);
        }
        let mut c = Compiler::new(16, 64);
        let r1 = resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.12"), ep("dns", 0, "10.200.0.11")]);
        let a = c.compile(&r1, &topo(), &n).unwrap();
        // web's endpoint 1 moves to another address: dns is not looked at
        // again (its statuses are the same allocation), web is rebuilt.
        let r2 = resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.13"), ep("dns", 0, "10.200.0.11")]);
        let b = c.compile(&r2, &topo(), &n).unwrap();
        assert_eq!(b.rebuilt, vec!["web".to_string()]);
        assert!(Arc::ptr_eq(&a.endpoints[0], &b.endpoints[0]), "dns's statuses reused");
        assert!(Arc::ptr_eq(&a.snapshot.services[0], &b.snapshot.services[0]));
        // Its counter slot: .12's slot was freed after the compilation that
        // dropped it, so .13 got a new one, and .11 kept its own.
        let slot = |c: &Compiled, svc: &str, a: &str| {
            c.endpoint_statuses().find(|e| *e.service == svc && e.address.to_string() == a).unwrap().counter
        };
        assert_eq!(slot(&a, "web", "10.200.0.11"), slot(&b, "web", "10.200.0.11"));
        assert_eq!(b.new_slots.endpoints, vec![slot(&b, "web", "10.200.0.13")]);
        let freed = slot(&a, "web", "10.200.0.12");
        // The freed slot goes to the next endpoint that needs one.
        let r3 = resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.13"), ep("web", 2, "10.200.0.14"), ep("dns", 0, "10.200.0.11")]);
        let d = c.compile(&r3, &topo(), &n).unwrap();
        assert_eq!(d.new_slots.endpoints, vec![freed]);
        assert_eq!(slot(&d, "web", "10.200.0.14"), freed);
        // A MAC that changes under a new epoch rebuilds exactly the services
        // that use it; under the same epoch nothing is looked up again.
        n.0.insert((1, "10.200.0.14".parse().unwrap()), [2, 0xee, 0, 0, 1, 14]);
        let same = c.compile(&r3, &topo(), &n).unwrap();
        assert!(same.rebuilt.is_empty(), "same epoch: the compiler trusts its entries");
        n.1 += 1;
        let moved = c.compile(&r3, &topo(), &n).unwrap();
        assert_eq!(moved.rebuilt, vec!["web".to_string()]);
        assert_eq!(moved.snapshot.services[1].endpoint(2).unwrap().mac, [2, 0xee, 0, 0, 1, 14]);
        // A service that leaves gives its slots back.
        let r4 = resolved(vec![ep("web", 0, "10.200.0.11")]);
        let e = c.compile(&r4, &topo(), &n).unwrap();
        assert!(e.endpoints[0].is_empty(), "dns has no endpoint left");
        let back = c.compile(&r3, &topo(), &n).unwrap();
        let mut again = back.new_slots.endpoints.clone();
        again.sort_unstable();
        let mut expect = vec![slot(&d, "dns", "10.200.0.11"), slot(&d, "web", "10.200.0.13"), freed];
        expect.sort_unstable();
        assert_eq!(again, expect, "the three endpoints that left and came back reuse the freed slots");
    }

    /// The list of next hops in use is the one from before (shared, not
    /// walked again) while no next hop comes or goes, and follows every
    /// one that does: a new endpoint address, one no endpoint uses any
    /// more, a service leaving.
    #[test]
    fn the_next_hop_list_is_made_again_only_when_a_next_hop_comes_or_goes() {
        let mut n = Epoch(HashMap::new(), 1);
        for i in 11..15 {
            n.0.insert((1, format!("10.200.0.{i}").parse().unwrap()), [2, 0xee, 0, 0, 0, i]);
        }
        let hops = |c: &Compiled| c.next_hops.iter().map(|(_, a)| a.to_string()).collect::<Vec<_>>();
        let mut c = Compiler::new(16, 64);
        let r1 = resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.12"), ep("dns", 0, "10.200.0.11")]);
        let a = c.compile(&r1, &topo(), &n).unwrap();
        // The gateway's and the endpoints'.
        assert_eq!(hops(&a), ["10.100.0.2", "10.200.0.11", "10.200.0.12"]);
        // web's weight changes: the same next hops, the same list.
        let mut heavier = ep("web", 1, "10.200.0.12");
        heavier.weight = 5;
        let r2 = resolved(vec![ep("web", 0, "10.200.0.11"), heavier, ep("dns", 0, "10.200.0.11")]);
        let b = c.compile_changed(&r2, &["web".to_string()], &topo(), &n).unwrap();
        assert_eq!(b.rebuilt, vec!["web".to_string()]);
        assert!(Arc::ptr_eq(&a.next_hops, &b.next_hops), "not made again");
        // .12 leaves web for .13: one next hop goes, one comes.
        let r3 = resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.13"), ep("dns", 0, "10.200.0.11")]);
        let d = c.compile_changed(&r3, &["web".to_string()], &topo(), &n).unwrap();
        assert_eq!(hops(&d), ["10.100.0.2", "10.200.0.11", "10.200.0.13"]);
        // web leaves .11, which dns still uses: no next hop goes.
        let r4 = resolved(vec![ep("web", 1, "10.200.0.13"), ep("dns", 0, "10.200.0.11")]);
        let e = c.compile_changed(&r4, &["web".to_string()], &topo(), &n).unwrap();
        assert!(Arc::ptr_eq(&d.next_hops, &e.next_hops));
        // dns leaves: .11 goes.
        let r5 = resolved(vec![ep("web", 1, "10.200.0.13")]);
        let f = c.compile(&r5, &topo(), &n).unwrap();
        assert_eq!(hops(&f), ["10.100.0.2", "10.200.0.13"]);
        // A fresh compiler agrees with each list.
        for (r, out) in [(&r3, &d), (&r4, &e), (&r5, &f)] {
            assert_eq!(Compiler::new(16, 64).compile(r, &topo(), &n).unwrap().next_hops, out.next_hops);
        }
    }
}

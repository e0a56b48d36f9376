//! The reconciler: the one owner of the model, the compiler and the
//! snapshot publisher. Sources send it whole desired states; for each it
//! applies the state tentatively, resolves the merged model, compiles and
//! publishes, and records the outcome. Anything that fails on the way (a
//! bad object, a conflict with another source, a table that does not fit)
//! puts everything back as it was: the data plane keeps serving the last
//! good snapshot and the source's status says why.
//!
//! It also follows the kernel's neighbour table (a MAC that appears or
//! changes republishes; only services whose endpoints it concerns get new
//! tables).
//!
//! Publication is an event: each snapshot goes out with its model summary
//! on one channel ([`Reconciler::publications`]); the admin endpoint, the
//! BGP announcer and the neighbour follower subscribe to it and derive what
//! they need. What became of each source's state goes out on the
//! reconciler's own status channel ([`Reconciler::status`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_dataplane::addr::Addr;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::snapshot::Snapshot;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::ground::{lock, micros, now_epoch};
use crate::compile::{CompileError, Compiled, Compiler, EndpointState, Neighbors, Statuses, Topology};
use crate::config::{ApplianceConfig, GatewayConfig};
use crate::model::{Defaults, Desired, EndpointDef, Model, Resolved};
use crate::problem::Problem;
use crate::sources::{FileState, Loaded, SourceMsg, FILE_SOURCE, MANIFESTS_SOURCE};

pub use crate::compile::NeighMap;

/// A service of the published model, as the admin endpoint lists it
/// (whether it is ready is the snapshot's to say: [`Published::ready`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServiceSummary {
    /// Name.
    pub(crate) name: String,
    /// Counter slot.
    pub(crate) slot: u32,
    /// Algorithm.
    pub(crate) algorithm: &'static str,
    /// Flow table.
    pub(crate) flow_table: bool,
    /// Endpoint limit.
    pub(crate) limit: u32,
    /// Table size.
    pub(crate) table_size: u32,
}

/// A route as status shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RouteMeta {
    /// Name.
    pub name: String,
    /// Service.
    pub(crate) service: String,
    /// Priority.
    pub(crate) priority: i32,
    /// VIPs (one allocation per route, not one more per VIP as text).
    pub vips: Vec<std::net::IpAddr>,
}

/// The model a snapshot was compiled from, as its readers need it: made
/// again by a publication of the whole model, shared unchanged by one after
/// a change to some services' endpoints (which changes none of it).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Every service, in name order (the snapshot's order).
    pub(crate) services: Vec<ServiceSummary>,
    /// Every route.
    pub(crate) routes: Arc<Vec<RouteMeta>>,
    /// The active checks, by service name.
    pub(crate) checks: Arc<BTreeMap<String, Arc<crate::model::CheckDef>>>,
}

/// Counter values of the slots a publication (re)assigned, at the time it
/// did: (packets, bytes). A slot that had counted nothing has no entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Baselines {
    /// Service slots.
    pub(crate) services: HashMap<u32, (u64, u64)>,
    /// Endpoint slots.
    pub(crate) endpoints: HashMap<u32, (u64, u64)>,
}

/// One publication: the snapshot and its model summary. The reconciler
/// sends one on [`Reconciler::publications`] for every snapshot; a reader
/// that looks only now and then sees the last one (each is whole, except
/// for [`Published::changed`], which says what moved since the one before).
#[derive(Debug, Default)]
pub struct Published {
    /// The publisher's generation (0: nothing published yet).
    pub(crate) generation: u64,
    /// The snapshot the workers were given.
    pub(crate) snapshot: Arc<Snapshot>,
    /// When it was published.
    pub(crate) at: Option<Instant>,
    /// Seconds its compilation and publication took.
    pub(crate) seconds: f64,
    /// Publications so far.
    pub(crate) count: u64,
    /// The model it was compiled from.
    pub(crate) summary: Arc<Summary>,
    /// Services by counter slot, in name order (the snapshot's order).
    pub(crate) service_slots: Arc<Vec<(u32, String)>>,
    /// After a change to the endpoints of these services only (and nothing
    /// else since generation - 1); `None` after a publication of the whole
    /// model.
    pub(crate) changed: Option<Arc<[String]>>,
    /// Every endpoint's status, service by service.
    pub(crate) endpoints: Statuses,
    /// Next hops whose MAC is missing.
    pub(crate) unresolved: usize,
    /// Every next hop the snapshot forwards to: the neighbour follower keeps
    /// these resolved. The same list (shared) while none came or went.
    pub(crate) next_hops: Arc<Vec<(u8, Addr)>>,
    /// Starting values of the counter slots in use.
    pub(crate) baselines: Arc<Baselines>,
}

impl Published {
    /// Whether service `name` has an endpoint that takes new flows in this
    /// snapshot.
    pub(crate) fn ready(&self, name: &str) -> bool {
        self.service_slots
            .binary_search_by(|(_, s)| s.as_str().cmp(name))
            .ok()
            .and_then(|i| self.snapshot.services.get(i))
            .is_some_and(|s| s.has_ready_endpoint())
    }
}

/// Rebuilt services named in a source's status: a change that rebuilt
/// 10,000 services shows the first 64 and the count.
pub const REBUILT_SHOWN: usize = 64;

/// What the reconciler last did with a source's state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    /// The source's last state is the one being served.
    pub(crate) accepted: bool,
    /// When it was last heard from (seconds since the epoch).
    pub(crate) at: u64,
    /// What made it send (file change, SIGHUP, start, ...).
    pub(crate) trigger: String,
    /// Why its last state was refused (empty when accepted).
    pub(crate) problems: Vec<String>,
    /// Services whose tables its last accepted change rebuilt (the first
    /// [`REBUILT_SHOWN`] of them, in name order).
    pub(crate) rebuilt: Vec<String>,
    /// How many services that change rebuilt.
    pub(crate) rebuilt_count: usize,
    /// States accepted.
    pub accepted_total: u64,
    /// States refused.
    pub(crate) rejected_total: u64,
}

/// The reconciler's status: what became of each source's last state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcilerStatus {
    /// Each source, by name.
    pub(crate) sources: BTreeMap<String, SourceStatus>,
    /// Snapshots replaced but not yet freed.
    pub(crate) snapshots_pending: usize,
    /// Health's overlay, as applied.
    pub(crate) health: HealthApplied,
}

/// The endpoints health checking wanted out of new flows, and what the
/// reconciler did: each service keeps at least half of its endpoints and
/// one ready endpoint, so some may be held in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HealthApplied {
    /// Draining by health's word, by service name and identifier.
    pub(crate) ejected: BTreeMap<String, BTreeSet<u32>>,
    /// Wanted out, kept in by the limit.
    pub(crate) held: BTreeMap<String, BTreeSet<u32>>,
}

impl HealthApplied {
    /// [`with_health`] for service `name`, recording what it applied and held.
    fn lay(&mut self, name: &str, eps: &Arc<[EndpointDef]>, wanted: &BTreeSet<u32>) -> Arc<[EndpointDef]> {
        let (out, applied, held) = with_health(eps, wanted);
        self.ejected.remove(name);
        self.held.remove(name);
        if !applied.is_empty() {
            self.ejected.insert(name.to_owned(), applied);
        }
        if !held.is_empty() {
            self.held.insert(name.to_owned(), held);
        }
        out
    }
}

/// `eps` (a service's endpoints as its sources give them) with those of
/// `wanted` draining, as far as the limit lets, in order of identifier:
/// health takes out at most half of the service's endpoints (those the
/// sources drain do not count), and never the last one the sources leave
/// ready. Returns them and the identifiers applied and held.
fn with_health(eps: &Arc<[EndpointDef]>, wanted: &BTreeSet<u32>) -> (Arc<[EndpointDef]>, BTreeSet<u32>, BTreeSet<u32>) {
    let ready = eps.iter().filter(|e| !e.draining).count();
    let mut room = (eps.len() / 2).min(ready.saturating_sub(1));
    let (mut applied, mut held) = (BTreeSet::new(), BTreeSet::new());
    for &id in wanted {
        // A service's endpoints are ordered by identifier.
        match eps.binary_search_by_key(&id, |e| e.id).ok().map(|i| &eps[i]) {
            Some(e) if e.draining => {}
            Some(_) if room > 0 => {
                room -= 1;
                applied.insert(id);
            }
            Some(_) => {
                held.insert(id);
            }
            None => {}
        }
    }
    if applied.is_empty() {
        return (Arc::clone(eps), applied, held);
    }
    let out = eps.iter().map(|e| EndpointDef { draining: e.draining || applied.contains(&e.id), ..e.clone() }).collect();
    (out, applied, held)
}

/// Held by a publication from its last check of the stop to its send, and
/// by the stop while it cancels: nothing is published once the appliance
/// said it stops.
pub(crate) type StopGate = Arc<Mutex<()>>;

/// How often replaced snapshots are looked at for freeing.
const RECLAIM_EVERY: Duration = Duration::from_millis(50);

/// Free heap (bytes inside the allocator's arenas) from which a release
/// hands pages back to the kernel.
const RELEASE_FROM: usize = 4 << 20;

/// Least time between two heap releases.
const RELEASE_EVERY: Duration = Duration::from_secs(1);

/// Time without a publication before a heap release: a release takes the
/// control core for milliseconds (tens with hundreds of MB free) and the
/// allocator's locks, so it waits for a lull instead of delaying the next
/// change (a release right after a bulk xDS load would hold up the single
/// changes that follow it: their p99 rises to about 11 ms).
const RELEASE_QUIET: Duration = Duration::from_millis(500);

/// Services compiled by a change to endpoints only from which the
/// publication counts as bulk for [`HeapRelease`], as a whole one does (the
/// first xDS load of 10,000 clusters arrives as such a change and leaves
/// 8-15 MiB free in the arenas).
const RELEASE_BULK: usize = 1000;

/// Whether a publication that compiled everything (`changed` none) or the
/// services `changed` is bulk, for [`HeapRelease`].
fn bulk(changed: Option<&[String]>) -> bool {
    changed.is_none_or(|c| c.len() >= RELEASE_BULK)
}

/// When to give the heap's free pages back to the kernel: after a
/// publication that compiled the whole model or [`RELEASE_BULK`] services
/// (a configuration reload, a bulk xDS load; not a change to a few
/// services' endpoints), once the
/// snapshot it replaced is freed and nothing was published for
/// [`RELEASE_QUIET`], at most once per [`RELEASE_EVERY`]. Without it each
/// reload of a large configuration that runs on another thread leaves
/// that thread's arena at its peak: a 10,000-service file reloaded twelve
/// times would grow the appliance to about 3.5 times its resident memory
/// after the first load (`bench/reload_memory.py`).
#[derive(Debug, Default)]
struct HeapRelease {
    /// A whole-model publication happened since the last release.
    wanted: bool,
    last_release: Option<Instant>,
    last_publication: Option<Instant>,
}

impl HeapRelease {
    /// A publication at `now`, of the whole model or not.
    fn published(&mut self, whole: bool, now: Instant) {
        self.wanted |= whole;
        self.last_publication = Some(now);
    }

    /// Whether to release now, with `pending` replaced snapshots not freed
    /// yet (counts it as done when it says yes).
    fn due(&mut self, pending: usize, now: Instant) -> bool {
        let since = |t: Option<Instant>, d: Duration| t.is_none_or(|t| now.saturating_duration_since(t) >= d);
        if !self.wanted || pending != 0 || !since(self.last_publication, RELEASE_QUIET) || !since(self.last_release, RELEASE_EVERY) {
            return false;
        }
        self.wanted = false;
        self.last_release = Some(now);
        true
    }
}

/// Gives free heap pages back to the kernel (on a blocking thread: it
/// takes milliseconds with hundreds of MB free).
fn release_heap() {
    let t0 = Instant::now();
    let r = sluice_ffi::heap::release(RELEASE_FROM);
    tracing::debug!(free_mib = r.free >> 20, used_mib = r.used >> 20, trimmed = r.trimmed, took_us = micros(t0.elapsed()), "heap release");
}

/// The reconciler's state.
pub struct Reconciler {
    model: Model,
    resolved: Resolved,
    defaults: Defaults,
    /// The configuration the appliance was started with (restart-only settings).
    started_with: ApplianceConfig,
    /// The file's state being served (to skip re-applying it unchanged).
    file: FileState,
    topo: Topology,
    compiler: Compiler,
    publisher: Publisher<Snapshot>,
    macs: Macs,
    /// The workers' counters (their slots' starting values are taken at
    /// assignment, before the snapshot that assigns them is published).
    counters: Vec<Arc<WorkerCounters>>,
    settings: watch::Sender<Settings>,
    /// Each publication, with its model summary.
    published: watch::Sender<Published>,
    /// What became of each source's state.
    status: watch::Sender<ReconcilerStatus>,
    gate: StopGate,
    /// Gateways learned over BGP, and where they come from.
    learned: Vec<GatewayConfig>,
    learned_rx: Option<watch::Receiver<Vec<GatewayConfig>>>,
    /// Microseconds the resolution before the next publication took (for
    /// its log line; 0 when it republishes an unchanged model).
    resolve_us: u64,
    /// What the last change replaced (the previous desired state and
    /// resolved model), freed once the source has its answer: freeing
    /// 100,000 endpoints takes milliseconds the source need not wait for.
    garbage: Vec<Box<dyn Send>>,
    heap: HeapRelease,
    /// The endpoints health checking wants out of new flows, laid over the
    /// resolved model at every resolution ([`with_health`]).
    health: BTreeMap<String, BTreeSet<u32>>,
}

/// The settings of the accepted configuration file that other control
/// tasks follow (the xDS and Kubernetes sources restart when theirs change).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Service defaults.
    pub(crate) defaults: Defaults,
    /// The xDS management server, when enabled.
    pub(crate) xds: Option<crate::sources::xds::XdsConfig>,
    /// BIRD and the gateway routers (the BIRD driver follows them).
    pub routing: crate::config::router::RoutingConfig,
    /// The Kubernetes API, when enabled (`kubernetes:`).
    pub(crate) kube: Option<crate::sources::kube::KubeConfig>,
}

impl Settings {
    /// The settings of `config`.
    pub fn of(config: &ApplianceConfig) -> Settings {
        Settings { defaults: config.defaults, xds: config.xds.clone(), routing: config.routing.clone(), kube: config.kubernetes.clone() }
    }
}

impl std::fmt::Debug for Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconciler").field("generation", &self.publisher.generation()).finish_non_exhaustive()
    }
}

/// Where a compilation failure is reported before it is placed.
const COMPILER: &str = "(compiler)";

/// A compilation failure (capacity, a table that cannot be built) as a
/// problem of the whole state.
/// A compilation's failure, not yet placed in a file: its path is the
/// capacity key that would have avoided it, if any ([`placed`]).
fn compile_problem(e: &CompileError) -> Problem {
    Problem::new(COMPILER, e.capacity_key().unwrap_or(""), e.to_string())
}

/// `problems` with each compilation failure placed in `cfg`'s file (one
/// about capacity at the key to raise).
fn placed(problems: Refusal, cfg: &ApplianceConfig) -> Refusal {
    problems
        .into_iter()
        .map(|p| if p.file == COMPILER && p.pos.is_none() { cfg.compile_problem(p.message, Some(p.path.as_str()).filter(|k| !k.is_empty())) } else { p })
        .collect()
}

/// Why a state was not applied.
type Refusal = Vec<Problem>;

impl Reconciler {
    /// A reconciler for the appliance started with `initial` (read and
    /// resolved by [`crate::sources::load`]), publishing through
    /// `publisher` to workers counting into `counters`. Nothing is
    /// published until [`Reconciler::start`].
    pub fn new(
        initial: Loaded,
        topo: Topology,
        publisher: Publisher<Snapshot>,
        counters: Vec<Arc<WorkerCounters>>,
        settings: watch::Sender<Settings>,
    ) -> Reconciler {
        let Loaded { file, model, resolved } = initial;
        let cfg = file.config.clone();
        Reconciler {
            model,
            resolved,
            defaults: cfg.defaults,
            compiler: Compiler::new(cfg.max_services, cfg.max_endpoints),
            topo,
            publisher,
            macs: Macs::default(),
            counters,
            settings,
            published: watch::channel(Published::default()).0,
            status: watch::channel(ReconcilerStatus::default()).0,
            gate: StopGate::default(),
            learned: Vec::new(),
            learned_rx: None,
            resolve_us: 0,
            garbage: Vec::new(),
            heap: HeapRelease::default(),
            health: BTreeMap::new(),
            started_with: cfg,
            file,
        }
    }

    /// Publishes the initial state, resolved when it was loaded; an error
    /// here stops the start.
    pub fn start(&mut self) -> Result<(), Refusal> {
        let rebuilt = self.publish("start").map_err(|e| vec![compile_problem(&e)])?;
        self.record(FILE_SOURCE, "start", Ok(rebuilt));
        Ok(())
    }

    /// Every publication, as it happens.
    pub fn publications(&self) -> watch::Receiver<Published> {
        self.published.subscribe()
    }

    /// The reconciler's status, as it changes.
    pub fn status(&self) -> watch::Receiver<ReconcilerStatus> {
        self.status.subscribe()
    }

    /// What the stop holds while it cancels the reconciler (see [`StopGate`]).
    pub(crate) fn stop_gate(&self) -> StopGate {
        Arc::clone(&self.gate)
    }

    /// Follows the gateways BIRD learns (default routes over BGP): each is
    /// used for return traffic of a family the file names no gateway for.
    pub(crate) fn follow_learned_gateways(&mut self, rx: watch::Receiver<Vec<GatewayConfig>>) {
        self.learned_rx = Some(rx);
    }

    /// New gateways learned over BGP: republish if the effective ones change.
    pub(crate) fn learned_gateways(&mut self, learned: Vec<GatewayConfig>) {
        self.learned = learned;
        let next = with_learned(&self.file.config.gateways, &self.learned);
        if next == self.topo.gateways {
            return;
        }
        info!(gateways = ?next.iter().map(|g| format!("{} on {}", g.address, g.port)).collect::<Vec<_>>(), "return-path gateways changed");
        let saved = std::mem::replace(&mut self.topo.gateways, next);
        if let Err(e) = self.publish("gateway learned over BGP") {
            if !self.compiler.stopping() {
                error!(error = %e, "publishing with the learned gateways failed; keeping the previous ones");
            }
            self.topo.gateways = saved;
        }
    }

    /// The publisher.
    #[cfg(test)]
    pub(crate) fn publisher(&self) -> &Publisher<Snapshot> {
        &self.publisher
    }

    /// Applies one message from a source.
    pub(crate) fn apply(&mut self, msg: SourceMsg) {
        match msg {
            SourceMsg::File { state, trigger } => {
                let accepted = self.status.borrow().sources.get(FILE_SOURCE).is_some_and(|s| s.accepted);
                if accepted && *state == self.file {
                    tracing::debug!(trigger, "configuration unchanged");
                    return;
                }
                let outcome = self.apply_file(*state, &trigger);
                self.record(FILE_SOURCE, &trigger, outcome);
            }
            SourceMsg::Desired { source, desired, trigger, reply } => {
                let outcome = self.apply_desired(&source, desired, &trigger).map_err(|e| placed(e, &self.file.config));
                self.answer(&source, &trigger, outcome, reply);
            }
            SourceMsg::Endpoints { source, changes, trigger, reply } => {
                let outcome = self.apply_endpoints(&source, changes, &trigger).map_err(|e| placed(e, &self.file.config));
                self.answer(&source, &trigger, outcome, reply);
            }
            SourceMsg::Rejected { source, problems, trigger } => {
                self.record(&source, &trigger, Err(problems));
            }
            SourceMsg::Health { ejected, trigger } => {
                if let Err(e) = self.apply_health(ejected, &trigger) {
                    error!(trigger, problems = ?e, "health's change not applied; the endpoints stay as they were");
                }
            }
        }
        // After the answer (a source waiting for it is told first).
        self.garbage.clear();
    }

    fn apply_file(&mut self, state: FileState, trigger: &str) -> Result<Vec<String>, Refusal> {
        // What `sluice check --started-with` reports too.
        let restart = state.config.start_only_changes(&self.started_with);
        if !restart.is_empty() {
            return Err(restart);
        }
        let saved = (
            self.model.get(FILE_SOURCE).cloned(),
            self.model.get(MANIFESTS_SOURCE).cloned(),
            self.defaults,
            self.topo.gateways.clone(),
        );
        state.set_into(&mut self.model);
        self.defaults = state.config.defaults;
        self.topo.gateways = with_learned(&state.config.gateways, &self.learned);
        let outcome = self.resolve_and_publish(trigger).map_err(|e| placed(e, &state.config));
        if outcome.is_ok() {
            self.settings.send_if_modified(|s| {
                let next = Settings::of(&state.config);
                let changed = *s != next;
                *s = next;
                changed
            });
            self.file = state;
        } else {
            let (file, manifests, defaults, gateways) = saved;
            self.model.put(FILE_SOURCE, file);
            self.model.put(MANIFESTS_SOURCE, manifests);
            self.defaults = defaults;
            self.topo.gateways = gateways;
        }
        outcome
    }

    fn apply_desired(&mut self, source: &str, desired: Desired, trigger: &str) -> Result<Vec<String>, Refusal> {
        let saved = self.model.set(source, desired);
        let outcome = self.resolve_and_publish(trigger);
        if outcome.is_err() {
            self.model.put(source, saved);
        } else if let Some(d) = saved {
            self.garbage.push(Box::new(d));
        }
        outcome
    }

    /// A change to the endpoints of some services of `source` only. When
    /// every one of them is a service being served, only they are resolved
    /// and compiled again (their endpoints cannot change any other service,
    /// route or budget); otherwise, the whole model is.
    fn apply_endpoints(&mut self, source: &str, changes: Vec<(String, Arc<[EndpointDef]>)>, trigger: &str) -> Result<Vec<String>, Refusal> {
        if self.model.get(source).is_none() {
            return Err(vec![Problem::new(COMPILER, "", format!("{source} sent a change to endpoints before any state"))]);
        }
        let names: Vec<String> = changes.iter().map(|(n, _)| n.clone()).collect();
        let mut saved = Vec::with_capacity(changes.len());
        for (name, eps) in changes {
            let old = self.model.set_endpoints(source, &name, eps).unwrap_or_default();
            saved.push((name, old));
        }
        let undo = |model: &mut Model, saved: Vec<(String, Arc<[EndpointDef]>)>| {
            for (name, old) in saved.into_iter().rev() {
                model.set_endpoints(source, &name, old);
            }
        };
        if !names.iter().all(|n| self.resolved.services.contains_key(n)) {
            let outcome = self.resolve_and_publish(trigger);
            if outcome.is_err() {
                undo(&mut self.model, saved);
            }
            return outcome;
        }
        let t0 = Instant::now();
        let mut resolved = Vec::with_capacity(names.len());
        let mut problems = Vec::new();
        let mut applied = self.status.borrow().health.clone();
        for n in &names {
            match self.model.resolve_endpoints(&self.resolved.services[n]) {
                Ok(eps) => resolved.push(match self.health.get(n) {
                    Some(wanted) => applied.lay(n, &eps, wanted),
                    None => eps,
                }),
                Err(p) => problems.extend(p),
            }
        }
        if !problems.is_empty() {
            undo(&mut self.model, saved);
            return Err(problems);
        }
        let mut previous = Vec::with_capacity(names.len());
        for (n, eps) in names.iter().zip(resolved) {
            if let Some(s) = self.resolved.services.get_mut(n) {
                previous.push(std::mem::replace(&mut s.endpoints, eps));
            }
        }
        self.resolve_us = micros(t0.elapsed());
        match self.publish_with(trigger, Some(&names)) {
            Ok(rebuilt) => {
                self.garbage.push(Box::new((previous, saved)));
                self.status.send_if_modified(|st| std::mem::replace(&mut st.health, applied.clone()) != applied);
                Ok(rebuilt)
            }
            Err(e) => {
                for (n, eps) in names.iter().zip(previous) {
                    if let Some(s) = self.resolved.services.get_mut(n) {
                        s.endpoints = eps;
                    }
                }
                undo(&mut self.model, saved);
                Err(vec![compile_problem(&e)])
            }
        }
    }

    /// Health's overlay, replaced by `ejected`: the services whose
    /// endpoints it changes are resolved from their sources again, laid
    /// over, and published as a change to their endpoints. `ejected` is
    /// kept as what health wants even when this publication fails: the next
    /// resolution lays it over (health sends only what changes).
    fn apply_health(&mut self, ejected: BTreeMap<String, BTreeSet<u32>>, trigger: &str) -> Result<Vec<String>, Refusal> {
        let touched: BTreeSet<String> = self.health.keys().chain(ejected.keys()).filter(|n| self.health.get(*n) != ejected.get(*n)).cloned().collect();
        self.health = ejected;
        let mut applied = self.status.borrow().health.clone();
        let (mut names, mut previous) = (Vec::new(), Vec::new());
        let none = BTreeSet::new();
        let mut outcome = Ok(());
        for n in touched {
            let Some(s) = self.resolved.services.get(&n) else { continue };
            let eps = match self.model.resolve_endpoints(s) {
                Ok(eps) => eps,
                Err(p) => {
                    outcome = Err(p);
                    break;
                }
            };
            let eps = applied.lay(&n, &eps, self.health.get(&n).unwrap_or(&none));
            if *eps != *s.endpoints {
                if let Some(s) = self.resolved.services.get_mut(&n) {
                    previous.push((n.clone(), std::mem::replace(&mut s.endpoints, eps)));
                    names.push(n);
                }
            }
        }
        let outcome = match outcome {
            Ok(()) if names.is_empty() => Ok(Vec::new()),
            Ok(()) => self.publish_with(trigger, Some(&names)).map_err(|e| vec![compile_problem(&e)]),
            Err(p) => Err(p),
        };
        match outcome {
            Ok(rebuilt) => {
                self.garbage.push(Box::new(previous));
                if self.status.send_if_modified(|st| std::mem::replace(&mut st.health, applied.clone()) != applied) {
                    info!(trigger, ejected = ?applied.ejected, held = ?applied.held, "health's overlay applied");
                }
                Ok(rebuilt)
            }
            Err(e) => {
                for (n, eps) in previous {
                    if let Some(s) = self.resolved.services.get_mut(&n) {
                        s.endpoints = eps;
                    }
                }
                Err(e)
            }
        }
    }

    /// Resolves the model and publishes it; on failure nothing changed in
    /// the compiler or the data plane.
    fn resolve_and_publish(&mut self, why: &str) -> Result<Vec<String>, Refusal> {
        let t0 = Instant::now();
        let mut resolved = self.model.resolve(&self.defaults)?;
        let mut applied = HealthApplied::default();
        for (name, wanted) in &self.health {
            if let Some(s) = resolved.services.get_mut(name) {
                s.endpoints = applied.lay(name, &s.endpoints, wanted);
            }
        }
        let previous = std::mem::replace(&mut self.resolved, resolved);
        self.resolve_us = micros(t0.elapsed());
        match self.publish(why) {
            Ok(rebuilt) => {
                self.garbage.push(Box::new(previous));
                self.status.send_if_modified(|st| std::mem::replace(&mut st.health, applied.clone()) != applied);
                Ok(rebuilt)
            }
            Err(e) => {
                self.resolved = previous;
                Err(vec![compile_problem(&e)])
            }
        }
    }

    /// Records what became of a source's state, then tells the source (so
    /// that whoever sees the source act on the answer, an xDS ACK, also sees
    /// it in the status).
    fn answer(&mut self, source: &str, trigger: &str, outcome: Result<Vec<String>, Refusal>, reply: Option<tokio::sync::oneshot::Sender<crate::sources::Applied>>) {
        let told = outcome.as_ref().map(|_| ()).map_err(Clone::clone);
        self.record(source, trigger, outcome);
        if let Some(r) = reply {
            // A source that stopped waiting has nothing to learn.
            let _ = r.send(told);
        }
    }

    /// Records what became of a source's state.
    fn record(&mut self, source: &str, trigger: &str, outcome: Result<Vec<String>, Refusal>) {
        if outcome.is_err() && self.compiler.stopping() {
            info!(source, trigger, "stopping: the change in flight is abandoned, nothing of it published");
            return;
        }
        self.status.send_modify(|st| Self::record_into(st.sources.entry(source.to_owned()).or_default(), source, trigger, outcome));
    }

    /// `outcome` of a state of `source`, recorded into its status `s`.
    fn record_into(s: &mut SourceStatus, source: &str, trigger: &str, outcome: Result<Vec<String>, Refusal>) {
        s.at = now_epoch();
        s.trigger = trigger.to_owned();
        match outcome {
            Ok(rebuilt) => {
                s.accepted = true;
                s.accepted_total += 1;
                s.problems.clear();
                s.rebuilt_count = rebuilt.len();
                s.rebuilt = rebuilt;
                s.rebuilt.truncate(REBUILT_SHOWN);
                info!(source, trigger, "configuration applied");
            }
            Err(problems) => {
                s.accepted = false;
                s.rejected_total += 1;
                for p in &problems {
                    error!(problem = %p, source, trigger, "rejected; still serving the last good configuration");
                }
                s.problems = problems.iter().map(ToString::to_string).collect();
                s.rebuilt.clear();
                s.rebuilt_count = 0;
            }
        }
    }

    /// Compiles the current resolved model and publishes it; returns the
    /// services rebuilt.
    fn publish(&mut self, why: &str) -> Result<Vec<String>, CompileError> {
        self.publish_with(why, None)
    }

    /// [`Reconciler::publish`]; with `changed`, after a change to the
    /// endpoints of those services only.
    fn publish_with(&mut self, why: &str, changed: Option<&[String]>) -> Result<Vec<String>, CompileError> {
        let t0 = Instant::now();
        // Workers report the generation they use: the publisher's numbering.
        self.compiler.number_next(self.publisher.generation() + 1);
        let c: Compiled = match changed {
            Some(names) => self.compiler.compile_changed(&self.resolved, names, &self.topo, &self.macs)?,
            None => self.compiler.compile(&self.resolved, &self.topo, &self.macs)?,
        };
        self.heap.published(bulk(changed), Instant::now());
        let compile_us = micros(t0.elapsed());
        // Said once, when the service is compiled, not at every publication.
        // (Found by name: a pass over every service's statuses would touch
        // one allocation per service, a millisecond with 10,000 of them.)
        for name in &c.rebuilt {
            let Ok(i) = c.service_slots.binary_search_by(|(_, s)| s.as_str().cmp(name)) else { continue };
            for e in c.endpoints.get(i).into_iter().flat_map(|s| s.iter()) {
                if let EndpointState::Unreachable(why) = &e.state {
                    warn!(service = %e.service, id = e.id, address = %e.address, reason = %why, "endpoint unreachable");
                }
            }
        }
        // The model summary: made again after a publication of the whole
        // model; a change to endpoints only changes none of it.
        let summary = match changed {
            None => Arc::new(self.summary(&c.service_slots)),
            Some(_) => Arc::clone(&self.published.borrow().summary),
        };
        let baselines = self.baselines(&c.new_slots.services, &c.new_slots.endpoints);
        let gate = Arc::clone(&self.gate);
        let held = lock(&gate);
        // Checked under the gate the stop takes to cancel: nothing is
        // published once the appliance said it stops.
        if self.compiler.stopping() {
            return Err(CompileError::Abandoned);
        }
        let numbered = c.snapshot.generation;
        let generation = self.publisher.publish_shared(Arc::clone(&c.snapshot));
        debug_assert_eq!(generation, numbered, "the snapshot carries the publisher's numbering");
        let count = self.published.borrow().count + 1;
        let next = Published {
            generation,
            snapshot: c.snapshot,
            at: Some(Instant::now()),
            seconds: t0.elapsed().as_secs_f64(),
            count,
            summary,
            service_slots: c.service_slots,
            changed: changed.map(Arc::from),
            endpoints: c.endpoints,
            unresolved: c.unresolved.len(),
            next_hops: c.next_hops,
            baselines,
        };
        let previous = self.published.send_replace(next);
        drop(held);
        self.garbage.push(Box::new(previous));
        let pending = self.publisher.pending();
        self.status.send_if_modified(|s| std::mem::replace(&mut s.snapshots_pending, pending) != pending);
        info!(
            generation,
            why,
            rebuilt = %Names::log(&c.rebuilt),
            rebuilt_count = c.rebuilt.len(),
            unresolved = c.unresolved.len(),
            resolve_us = std::mem::take(&mut self.resolve_us),
            compile_us,
            publish_us = micros(t0.elapsed()),
            "snapshot published"
        );
        Ok(c.rebuilt)
    }

    /// The summary of every service (in `service_slots`' order) and route
    /// of the resolved model.
    fn summary(&self, service_slots: &[(u32, String)]) -> Summary {
        // Room for every service (collected from a filter, it would grow
        // by doubling: 0.9 MB held for 10,000 services' 0.56).
        let mut services = Vec::with_capacity(service_slots.len());
        services.extend(service_slots.iter().filter_map(|(slot, name)| {
            let s = self.resolved.services.get(name)?;
            Some(ServiceSummary {
                name: name.clone(),
                slot: *slot,
                algorithm: s.algorithm.name(),
                flow_table: s.flow_table,
                limit: s.limit,
                table_size: s.table_size,
            })
        }));
        let routes = self
            .resolved
            .routes
            .iter()
            .map(|r| RouteMeta {
                name: r.name.clone(),
                service: r.service.clone(),
                priority: r.priority,
                vips: r.matches.vips.iter().map(|v| v.to_ip()).collect(),
            })
            .collect();
        let checks = self.resolved.services.iter().filter_map(|(name, s)| Some((name.clone(), Arc::clone(s.check.as_ref()?)))).collect();
        Summary { services, routes: Arc::new(routes), checks: Arc::new(checks) }
    }

    /// The starting values of the counter slots in use, with those of the
    /// newly assigned `services` and `endpoints` slots taken now (shared
    /// with the last publication's when none changes). A slot that never
    /// counted anything has nothing to subtract and no entry (counters
    /// only grow, so an entry it had is gone too): 100,000 fresh endpoint
    /// slots would otherwise keep 3.5 MiB of zeros.
    fn baselines(&self, services: &[u32], endpoints: &[u32]) -> Arc<Baselines> {
        let mut base = Arc::clone(&self.published.borrow().baselines);
        // Read in place; copied (once, when still shared) only to change.
        let mut record = |services: bool, slot: u32, totals: (u64, u64)| {
            let of = |b: &Baselines| if services { b.services.get(&slot).copied() } else { b.endpoints.get(&slot).copied() };
            let now = of(&base);
            if (totals == (0, 0) && now.is_none()) || (totals != (0, 0) && now == Some(totals)) {
                return;
            }
            let b = Arc::make_mut(&mut base);
            let map = if services { &mut b.services } else { &mut b.endpoints };
            if totals == (0, 0) {
                map.remove(&slot);
            } else {
                map.insert(slot, totals);
            }
        };
        for &slot in services {
            record(true, slot, totals(&self.counters, slot, |c| &c.services));
        }
        for &slot in endpoints {
            record(false, slot, totals(&self.counters, slot, |c| &c.endpoints));
        }
        base
    }

    /// The kernel resolved new MACs: republish if they differ.
    pub(crate) fn neighbours(&mut self, macs: NeighMap) {
        if macs == self.macs.map {
            return;
        }
        self.macs.map = macs;
        self.macs.epoch += 1;
        if let Err(e) = self.publish("neighbours changed") {
            // The model did not change, so this is a capacity problem that
            // the last accepted state did not have: say so loudly.
            if !self.compiler.stopping() {
                error!(error = %e, "publishing after a neighbour change failed");
            }
        }
    }

    /// Frees replaced snapshots no worker can hold any more.
    pub(crate) fn reclaim(&mut self) {
        self.publisher.reclaim();
        let pending = self.publisher.pending();
        self.status.send_if_modified(|s| std::mem::replace(&mut s.snapshots_pending, pending) != pending);
    }

    /// Runs until `cancel` fires or every source is gone. Once `cancel`
    /// fires, a compilation in flight is abandoned and nothing more is
    /// published (the caller cancels under the admin state's lock, which a
    /// publication holds).
    pub async fn run(mut self, mut rx: mpsc::Receiver<SourceMsg>, mut neigh: watch::Receiver<NeighMap>, cancel: CancellationToken) {
        self.compiler.abandon_when(cancel.clone());
        let mut tick = tokio::time::interval(RECLAIM_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut neigh_open = true;
        let mut learned = self.learned_rx.take();
        loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                Some(g) = next_value(&mut learned) => tokio::task::block_in_place(|| self.learned_gateways(g)),
                msg = rx.recv() => match msg {
                    Some(m) => {
                        tracing::debug!("applying");
                        tokio::task::block_in_place(|| self.apply(m));
                        tracing::debug!("applied");
                    }
                    None => break,
                },
                changed = neigh.changed(), if neigh_open => match changed {
                    Ok(()) => {
                        let m = neigh.borrow_and_update().clone();
                        tokio::task::block_in_place(|| self.neighbours(m));
                    }
                    Err(_) => neigh_open = false,
                },
                _ = tick.tick() => {
                    self.reclaim();
                    if self.heap.due(self.publisher.pending(), Instant::now()) {
                        drop(tokio::task::spawn_blocking(release_heap));
                    }
                }
            }
        }
    }
}

/// The MACs the kernel resolved, numbered: the compiler re-checks the
/// MACs a service used only when the number moved.
#[derive(Debug, Default)]
struct Macs {
    map: NeighMap,
    epoch: u64,
}

impl Neighbors for Macs {
    fn mac(&self, port: u8, addr: Addr) -> Option<[u8; 6]> {
        self.map.get(&(port, addr)).copied()
    }

    fn epoch(&self) -> Option<u64> {
        Some(self.epoch)
    }
}

/// Sum over the workers' `counters` of (packets, bytes) of `slot` in the
/// table `of` picks.
fn totals(counters: &[Arc<WorkerCounters>], slot: u32, of: fn(&WorkerCounters) -> &[sluice_dataplane::counters::PacketBytes]) -> (u64, u64) {
    counters.iter().fold((0, 0), |(p, b), c| match of(c).get(slot as usize) {
        Some(c) => (p + c.packets.get(), b + c.bytes.get()),
        None => (p, b),
    })
}

/// The file's gateways, and a learned one for each family the file has none for.
fn with_learned(file: &[GatewayConfig], learned: &[GatewayConfig]) -> Vec<GatewayConfig> {
    let mut v = file.to_vec();
    v.extend(learned.iter().filter(|l| !file.iter().any(|f| f.address.is_v4() == l.address.is_v4())).cloned());
    v
}

/// The next value of a watched channel; never, without one or once its
/// sender is gone.
async fn next_value<T: Clone>(rx: &mut Option<watch::Receiver<T>>) -> Option<T> {
    if let Some(r) = rx {
        if r.changed().await.is_ok() {
            return Some(r.borrow_and_update().clone());
        }
    }
    std::future::pending().await
}

/// Names for a log line: the first [`LOG_NAMES`], then how many more. A
/// publication that rebuilt 10,000 services logs 16 names, not a 130 KB
/// line.
struct Names<'a>(&'a [String]);

/// Names shown in a log line.
const LOG_NAMES: usize = 16;

impl<'a> Names<'a> {
    fn log(names: &'a [String]) -> Self {
        Names(names)
    }
}

impl std::fmt::Display for Names<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = &self.0[..self.0.len().min(LOG_NAMES)];
        write!(f, "{shown:?}")?;
        match self.0.len() - shown.len() {
            0 => Ok(()),
            more => write!(f, " and {more} more"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use sluice_dataplane::classify::RouteMatch;

    use super::*;
    use crate::compile::TopoPort;
    use crate::config::IfAddr;
    use crate::model::{EndpointDef, Origin, RouteDef, ServiceDef};

    fn svc(name: &str, eps: &[(u32, &str)]) -> Desired {
        Desired {
            services: vec![ServiceDef { name: name.into(), ..Default::default() }],
            endpoints: eps
                .iter()
                .map(|(id, a)| EndpointDef {
                    service: Arc::new(name.to_owned()),
                    id: *id,
                    address: a.parse().unwrap(),
                    weight: 1,
                    draining: false,
                    mac: Some([2, 0, 0, 0, 0, 1]),
                    origin: Arc::default(),
                })
                .collect(),
            routes: vec![RouteDef {
                name: format!("{name}-route"),
                service: name.into(),
                priority: 0,
                matches: RouteMatch { vips: vec!["20.0.0.1".parse().unwrap()], ..RouteMatch::default() }.into(),
                origin: Origin::default(),
            }],
        }
    }

    type Status = watch::Receiver<ReconcilerStatus>;

    fn reconciler() -> (Reconciler, Status, watch::Receiver<Published>) {
        let text = "ports: [{name: p, device: net_null0, addresses: [10.0.0.1/24]}]\n";
        let dir = std::env::temp_dir().join(format!("sluice-rec-{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path: PathBuf = dir.join("c.yaml");
        std::fs::write(&path, text).unwrap();
        let state = crate::sources::read(&path).unwrap();
        let topo = Topology {
            ports: vec![TopoPort {
                name: "p".into(),
                mac: [2, 0, 0, 0, 0, 9],
                mtu: 1500,
                vlan: 0,
                addresses: vec![IfAddr { addr: "10.0.0.1".parse().unwrap(), prefix: 24 }],
            }],
            gateways: vec![],
        };
        let (settings, _) = watch::channel(Settings::of(&state.config));
        let mut r = Reconciler::new(Loaded::of(state).unwrap(), topo, Publisher::new(Snapshot::default()), Vec::new(), settings);
        r.start().unwrap();
        let (status, published) = (r.status(), r.publications());
        (r, status, published)
    }

    fn desired(source: &str, d: Desired) -> SourceMsg {
        SourceMsg::Desired { source: source.into(), desired: d, trigger: "test".into(), reply: None }
    }

    #[test]
    fn a_change_to_the_endpoints_of_many_services_is_bulk() {
        let names = |n: usize| (0..n).map(|i| format!("s{i}")).collect::<Vec<_>>();
        assert!(bulk(None));
        assert!(!bulk(Some(&names(1))));
        assert!(!bulk(Some(&names(RELEASE_BULK - 1))));
        assert!(bulk(Some(&names(RELEASE_BULK))));
    }

    #[test]
    fn the_heap_is_released_once_after_a_whole_publication_in_a_lull() {
        let t0 = Instant::now();
        let mut h = HeapRelease::default();
        assert!(!h.due(0, t0), "nothing published yet");
        h.published(false, t0);
        assert!(!h.due(0, t0 + RELEASE_QUIET), "a change to a few services' endpoints releases nothing");
        h.published(true, t0);
        assert!(!h.due(0, t0 + RELEASE_QUIET / 2), "not while publications go on");
        let t1 = t0 + RELEASE_QUIET;
        assert!(!h.due(1, t1), "the replaced snapshot is still held");
        assert!(h.due(0, t1));
        assert!(!h.due(0, t1 + RELEASE_EVERY), "once per whole publication");
        // Another reload soon after: waits for its lull and for RELEASE_EVERY.
        h.published(true, t1);
        h.published(false, t1 + RELEASE_EVERY / 2);
        assert!(!h.due(0, t1 + RELEASE_EVERY / 2 + RELEASE_QUIET / 2), "a change came since");
        let t2 = t1 + RELEASE_EVERY / 2 + RELEASE_QUIET;
        assert!(h.due(0, t2.max(t1 + RELEASE_EVERY)));
    }

    #[test]
    fn a_refused_state_leaves_the_last_good_one_serving() {
        let (mut r, shared, _rx) = reconciler();
        r.apply(desired("xds", svc("web", &[(0, "10.0.0.5"), (1, "10.0.0.6")])));
        let g = r.publisher().generation();
        assert!(shared.borrow().sources["xds"].accepted);
        assert_eq!(r.publisher().current().services.len(), 1);

        // The same source sends a state with a duplicate identifier: refused,
        // nothing published, the previous state still resolves.
        r.apply(desired("xds", svc("web", &[(0, "10.0.0.5"), (0, "10.0.0.7")])));
        let st = shared.borrow().sources["xds"].clone();
        assert!(!st.accepted);
        assert!(st.problems.iter().any(|p| p.contains("duplicate endpoint identifier 0")), "{:?}", st.problems);
        assert_eq!(r.publisher().generation(), g, "nothing published");
        assert_eq!(r.model.get("xds").unwrap().endpoints.len(), 2, "the previous state is back");
        assert_eq!(r.model.get("xds").unwrap().endpoints.iter().nth(1).unwrap().address.to_string(), "10.0.0.6");

        // Another source claiming the same service is refused; the first keeps it.
        r.apply(desired("k8s", svc("web", &[(0, "10.0.0.8")])));
        assert!(!shared.borrow().sources["k8s"].accepted);
        assert!(r.model.get("k8s").is_none(), "a refused source owns nothing");
        assert_eq!(r.publisher().generation(), g);

        // A good state is accepted again, and the next hop wanted follows it.
        r.apply(desired("xds", svc("web", &[(0, "10.0.0.5")])));
        assert!(shared.borrow().sources["xds"].accepted);
        assert_eq!(r.publisher().generation(), g + 1);
    }

    #[test]
    fn a_source_status_names_some_rebuilt_services_and_counts_all() {
        let (mut r, shared, _rx) = reconciler();
        let mut d = Desired::default();
        for i in 0..100u32 {
            let mut one = svc(&format!("s{i:03}"), &[(0, "10.0.0.5")]);
            std::sync::Arc::make_mut(&mut one.routes[0].matches).vips = vec![Addr::v4([20, 0, 1, u8::try_from(i).unwrap()])];
            d.services.append(&mut one.services);
            d.routes.append(&mut one.routes);
            d.endpoints.append(&one.endpoints);
        }
        r.apply(desired("xds", d));
        let st = shared.borrow().sources["xds"].clone();
        assert!(st.accepted, "{:?}", st.problems);
        assert_eq!(st.rebuilt_count, 100);
        assert_eq!(st.rebuilt.len(), REBUILT_SHOWN);
        assert_eq!(st.rebuilt[0], "s000");
    }

    #[test]
    fn only_slots_that_counted_keep_a_baseline() {
        let (mut r, _status, published) = reconciler();
        r.counters = (0..2).map(|_| Arc::new(WorkerCounters::new(2, 4))).collect();
        r.counters[0].endpoints[1].count(100);
        r.counters[1].endpoints[1].count(60);
        let base = r.baselines(&[0, 1], &[0, 1, 2, 3]);
        assert!(base.services.is_empty(), "no service counted anything");
        assert_eq!(base.endpoints, HashMap::from([(1, (2, 160))]), "only slot 1 counted");
        r.published.send_modify(|p| p.baselines = Arc::clone(&base));
        assert!(Arc::ptr_eq(&base, &r.baselines(&[0], &[1])), "nothing changed, nothing copied");
        // Slot 1 given again after counting more: it starts from its new
        // totals; slot 2 from its first ones.
        r.counters[0].endpoints[1].count(40);
        r.counters[1].endpoints[2].count(10);
        let next = r.baselines(&[], &[1, 2]);
        assert_eq!(next.endpoints, HashMap::from([(1, (3, 200)), (2, (1, 10))]));
        assert_eq!(base.endpoints.len(), 1, "the published baselines are not changed in place");
        drop(published);
    }

    #[test]
    fn long_lists_of_names_are_cut() {
        let few: Vec<String> = vec!["web".into(), "dns".into()];
        assert_eq!(Names::log(&few).to_string(), r#"["web", "dns"]"#);
        assert_eq!(Names::log(&[]).to_string(), "[]");
        let many: Vec<String> = (0..10_000).map(|i| format!("svc{i}")).collect();
        let line = Names::log(&many).to_string();
        assert!(line.starts_with(r#"["svc0", "svc1", "#) && line.ends_with(r#""svc15"] and 9984 more"#), "{line}");
        assert!(line.len() < 200);
    }

    /// web on 20.0.0.1 and dns on 20.0.0.2, with these endpoints.
    fn two(web: &[(u32, &str)], dns: &[(u32, &str)]) -> Desired {
        let (mut d, mut other) = (svc("web", web), svc("dns", dns));
        std::sync::Arc::make_mut(&mut other.routes[0].matches).vips = vec!["20.0.0.2".parse().unwrap()];
        d.services.append(&mut other.services);
        d.routes.append(&mut other.routes);
        d.endpoints.append(&other.endpoints);
        d
    }

    fn endpoints(source: &str, changes: &[(&str, &[(u32, &str)])]) -> SourceMsg {
        let changes = changes.iter().map(|(name, eps)| ((*name).to_owned(), svc(name, eps).endpoints.to_vec().into())).collect();
        SourceMsg::Endpoints { source: source.into(), changes, trigger: "test".into(), reply: None }
    }

    fn health(ejected: &[(&str, &[u32])]) -> SourceMsg {
        let ejected = ejected.iter().map(|(n, ids)| ((*n).to_owned(), ids.iter().copied().collect())).collect();
        SourceMsg::Health { ejected, trigger: "test".into() }
    }

    /// The identifiers of `service`'s draining endpoints in the data plane.
    fn draining(r: &Reconciler, service: &str) -> Vec<u16> {
        let snap = r.publisher().current();
        let s = snap.services.iter().find(|s| s.name == service).unwrap();
        s.endpoints().filter(|e| e.draining).map(|e| e.id).collect()
    }

    #[test]
    fn health_drains_what_it_names_within_the_limit_and_any_change_keeps_it() {
        let (mut r, status, _) = reconciler();
        let eps: [(u32, &str); 5] = [(0, "10.0.0.10"), (1, "10.0.0.11"), (2, "10.0.0.12"), (3, "10.0.0.13"), (4, "10.0.0.14")];
        r.apply(desired("xds", two(&eps, &eps[..1])));
        let g = r.publisher().generation();
        // At most half of a service's endpoints (2 of 5), in identifier
        // order; never dns's only one.
        r.apply(health(&[("web", &[4, 1, 3]), ("dns", &[0])]));
        assert_eq!(r.publisher().generation(), g + 1, "one publication");
        assert_eq!(draining(&r, "web"), [1, 3]);
        assert_eq!(draining(&r, "dns"), Vec::<u16>::new());
        let h = status.borrow().health.clone();
        assert_eq!(h.ejected, BTreeMap::from([("web".to_owned(), BTreeSet::from([1, 3]))]));
        assert_eq!(h.held, BTreeMap::from([("web".to_owned(), BTreeSet::from([4])), ("dns".to_owned(), BTreeSet::from([0]))]));
        // A source's change to the endpoints, and a whole new state, keep it.
        r.apply(endpoints("xds", &[("web", &eps[..4])]));
        assert_eq!(draining(&r, "web"), [1, 3]);
        r.apply(desired("xds", two(&eps, &eps[..1])));
        assert_eq!(draining(&r, "web"), [1, 3]);
        // The sources drain 0, 1 and 2: health's 1 is theirs already, one
        // ready endpoint must stay (3 or 4): 3 drains, 4 is held.
        let mut d = two(&eps, &eps[..1]);
        d.endpoints = d.endpoints.iter().map(|e| EndpointDef { draining: e.id <= 2 && *e.service == "web", ..e.clone() }).collect();
        r.apply(desired("xds", d));
        assert_eq!(draining(&r, "web"), [0, 1, 2, 3]);
        assert_eq!(status.borrow().health.ejected.get("web"), Some(&BTreeSet::from([3])));
        assert_eq!(status.borrow().health.held.get("web"), Some(&BTreeSet::from([4])));
        // Health lets go: the source's word stands alone.
        r.apply(health(&[]));
        assert_eq!(draining(&r, "web"), [0, 1, 2]);
        assert_eq!(status.borrow().health, HealthApplied::default());
        let g = r.publisher().generation();
        r.apply(health(&[]));
        assert_eq!(r.publisher().generation(), g, "nothing to change, nothing published");
    }

    /// What the data plane and the publication's readers are given.
    fn served(r: &Reconciler) -> String {
        let p = r.published.borrow();
        let ready: Vec<bool> = p.summary.services.iter().map(|s| p.ready(&s.name)).collect();
        format!("{:?}\n{:?}\n{:?}\n{:?}\n{:?}", *r.publisher().current(), p.summary, ready, p.endpoints, p.next_hops)
    }

    #[test]
    fn a_change_to_endpoints_publishes_what_the_whole_state_would() {
        let (mut whole, _ws, _w) = reconciler();
        let (mut part, ps, _p) = reconciler();
        let start = two(&[(0, "10.0.0.5"), (1, "10.0.0.6")], &[(0, "10.0.0.7")]);
        whole.apply(desired("xds", start.clone()));
        part.apply(desired("xds", start));
        type Eps<'a> = &'a [(u32, &'a str)];
        let steps: [(Eps, Eps); 5] = [
            (&[(0, "10.0.0.5"), (1, "10.0.0.8")], &[(0, "10.0.0.7")]),
            // As many endpoints, another identifier: a table of the same
            // size, other entries.
            (&[(0, "10.0.0.5"), (5, "10.0.0.8")], &[(0, "10.0.0.7")]),
            (&[(0, "10.0.0.5"), (1, "10.0.0.8")], &[]),
            (&[(2, "10.0.0.9")], &[(3, "10.0.0.7"), (4, "10.0.0.6")]),
            (&[], &[]),
        ];
        for (web, dns) in steps {
            whole.apply(desired("xds", two(web, dns)));
            part.apply(endpoints("xds", &[("web", web), ("dns", dns)]));
            assert!(ps.borrow().sources["xds"].accepted);
            assert_eq!(served(&whole), served(&part));
            crate::compile::assert_same_tables(&whole.publisher().current(), &part.publisher().current());
            assert_eq!(whole.model.get("xds"), part.model.get("xds"));
        }
        let ready = |p: &watch::Receiver<Published>| {
            let p = p.borrow();
            p.summary.services.iter().map(|s| p.ready(&s.name)).collect::<Vec<_>>()
        };
        assert_eq!(ready(&part.publications()), vec![false, false], "no endpoints: not ready");

        // Refused: the model, the data plane and the views stay as they were.
        let (g, before) = (part.publisher().generation(), served(&part));
        part.apply(endpoints("xds", &[("web", &[(0, "10.0.0.5"), (0, "10.0.0.6")])]));
        let st = ps.borrow().sources["xds"].clone();
        assert!(!st.accepted && st.problems.iter().any(|p| p.contains("duplicate endpoint identifier 0")), "{:?}", st.problems);
        assert_eq!((part.publisher().generation(), served(&part)), (g, before.clone()));
        assert_eq!(whole.model.get("xds"), part.model.get("xds"));
        // Endpoints of a service nobody defines: the whole model says no.
        part.apply(endpoints("xds", &[("ghost", &[(0, "10.0.0.5")])]));
        let st = ps.borrow().sources["xds"].clone();
        assert!(st.problems.iter().any(|p| p.contains("unknown service \"ghost\"")), "{:?}", st.problems);
        assert_eq!((part.publisher().generation(), served(&part)), (g, before));
        assert_eq!(whole.model.get("xds"), part.model.get("xds"));
        // A source that never sent a state.
        part.apply(endpoints("k8s", &[("web", &[(0, "10.0.0.5")])]));
        assert!(!ps.borrow().sources["k8s"].accepted);
        assert!(part.model.get("k8s").is_none());
    }

    #[test]
    fn a_file_state_is_skipped_when_unchanged_and_refused_again_when_still_bad() {
        let (mut r, shared, _rx) = reconciler();
        let g = r.publisher().generation();
        let same = r.file.clone();
        r.apply(SourceMsg::File { state: Box::new(same.clone()), trigger: "touch".into() });
        assert_eq!(r.publisher().generation(), g, "an unchanged accepted file is not published again");
        let mut bad = same;
        bad.config.inline = svc("web", &[(0, "10.0.0.5"), (0, "10.0.0.6")]);
        for _ in 0..2 {
            r.apply(SourceMsg::File { state: Box::new(bad.clone()), trigger: "file change".into() });
        }
        let st = shared.borrow().sources[FILE_SOURCE].clone();
        assert!(!st.accepted);
        assert_eq!(st.rejected_total, 2, "each save of a broken file is refused, with its reason");
        assert_eq!(r.publisher().generation(), g);
    }

    #[test]
    fn a_source_waiting_for_the_outcome_is_told() {
        let (mut r, _shared, _rx) = reconciler();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let bad = svc("web", &[(0, "10.0.0.5"), (0, "10.0.0.6")]);
        r.apply(SourceMsg::Desired { source: "xds".into(), desired: bad, trigger: "t".into(), reply: Some(tx) });
        let why = rx.try_recv().unwrap().unwrap_err();
        assert!(why[0].message.contains("duplicate endpoint identifier"), "{why:?}");
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        r.apply(SourceMsg::Desired { source: "xds".into(), desired: svc("web", &[(0, "10.0.0.5")]), trigger: "t".into(), reply: Some(tx) });
        assert_eq!(rx.try_recv().unwrap(), Ok(()));
    }

    #[test]
    fn a_gateway_learned_over_bgp_is_used_when_the_file_names_none() {
        let (mut r, _shared, hops) = reconciler();
        let gw = |a: &str| GatewayConfig { address: a.parse().unwrap(), port: "p".into(), mac: None };
        let g = r.publisher().generation();
        r.learned_gateways(vec![gw("10.0.0.254"), gw("fd00::254")]);
        assert_eq!(r.topo.gateways, [gw("10.0.0.254"), gw("fd00::254")]);
        assert_eq!(r.publisher().generation(), g + 1, "republished");
        assert!(hops.borrow().next_hops.contains(&(0, "10.0.0.254".parse().unwrap())), "the learned next hop is resolved: {:?}", hops.borrow().next_hops);
        r.learned_gateways(vec![gw("10.0.0.254"), gw("fd00::254")]);
        assert_eq!(r.publisher().generation(), g + 1, "nothing changed, nothing published");

        // A gateway the file names wins over a learned one of its family.
        let mut st = r.file.clone();
        st.config.gateways = vec![gw("10.0.0.9")];
        r.apply(SourceMsg::File { state: Box::new(st), trigger: "edit".into() });
        assert_eq!(r.topo.gateways, [gw("10.0.0.9"), gw("fd00::254")]);
        r.learned_gateways(Vec::new());
        assert_eq!(r.topo.gateways, [gw("10.0.0.9")]);
    }

    /// A reconciler started with the file `text` (written as `c.yaml` in
    /// a directory of its own), and a way to read that file again after
    /// writing `text` into it.
    fn from_file(text: &str) -> (Reconciler, Status, impl Fn(&str) -> FileState) {
        let dir = std::env::temp_dir().join(format!("sluice-rec-file-{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path: PathBuf = dir.join("c.yaml");
        let reread = move |text: &str| {
            std::fs::write(&path, text).unwrap();
            crate::sources::read(&path).unwrap()
        };
        let state = reread(text);
        let topo = Topology {
            ports: vec![TopoPort {
                name: "p".into(),
                mac: [2, 0, 0, 0, 0, 9],
                mtu: 1500,
                vlan: 0,
                addresses: vec![IfAddr { addr: "10.0.0.1".parse().unwrap(), prefix: 24 }],
            }],
            gateways: vec![],
        };
        let (settings, _) = watch::channel(Settings::of(&state.config));
        let mut r = Reconciler::new(Loaded::of(state).unwrap(), topo, Publisher::new(Snapshot::default()), Vec::new(), settings);
        r.start().unwrap();
        let status = r.status();
        (r, status, reread)
    }

    const PORT: &str = "ports: [{name: p, device: net_null0, addresses: [10.0.0.1/24]}]\n";
    const WEB: &str = "routes: [{name: r, service: web, vips: [20.0.0.1]}]\nservices:\n  - name: web\n    endpoints:\n";

    fn endpoint_lines(n: u32) -> String {
        (0..n).map(|i| format!("      - {{id: {i}, address: 10.0.0.{}, mac: \"02:00:00:00:00:01\"}}\n", i + 10)).collect()
    }

    #[test]
    fn a_reload_that_changes_a_start_only_key_is_refused_where_the_key_is() {
        let (mut r, shared, reread) = from_file(&format!("{PORT}capacity: {{endpoints: 2}}\n{WEB}{}", endpoint_lines(2)));
        let g = r.publisher().generation();
        // Capacity raised and used at once: the running appliance has 2 slots.
        let raised = reread(&format!("{PORT}capacity: {{endpoints: 4}}\n{WEB}{}", endpoint_lines(3)));
        let file = raised.config.path.display().to_string();
        r.apply(SourceMsg::File { state: Box::new(raised), trigger: "edit".into() });
        let st = shared.borrow().sources[FILE_SOURCE].clone();
        assert!(!st.accepted);
        assert_eq!(st.problems, [format!(
            "{file}:2:23: capacity.endpoints: 2 -> 4 takes effect at restart: the running appliance keeps 2 (restart it, or put back 2 to reload the rest)"
        )]);
        assert_eq!(r.publisher().generation(), g, "the last good state still serves");
        // Alone, too: nothing of the file is applied while it asks for a restart.
        let only = reread(&format!("{PORT}capacity: {{endpoints: 4}}\n{WEB}{}", endpoint_lines(2)));
        r.apply(SourceMsg::File { state: Box::new(only), trigger: "edit".into() });
        assert!(!shared.borrow().sources[FILE_SOURCE].accepted);
        // A key taken out goes back to its default: a change, at the section.
        let gone = reread(&format!("{PORT}{WEB}{}admin: {{maxConnections: 8}}\n", endpoint_lines(2)));
        r.apply(SourceMsg::File { state: Box::new(gone), trigger: "edit".into() });
        let st = shared.borrow().sources[FILE_SOURCE].clone();
        assert_eq!(st.problems, [
            format!("{file}:8:25: admin.maxConnections: 16 -> 8 takes effect at restart: the running appliance keeps 16 (restart it, or put back 16 to reload the rest)"),
            format!("{file}:1:1: capacity.endpoints: 2 -> 65536 takes effect at restart: the running appliance keeps 2 (restart it, or put back 2 to reload the rest)"),
        ]);
        // Put back, the other changes apply.
        let back = reread(&format!("{PORT}capacity: {{endpoints: 2}}\n{WEB}{}", endpoint_lines(1)));
        r.apply(SourceMsg::File { state: Box::new(back), trigger: "edit".into() });
        assert!(shared.borrow().sources[FILE_SOURCE].accepted);
        assert_eq!(r.publisher().generation(), g + 1);
    }

    #[test]
    fn a_file_over_capacity_is_refused_at_the_capacity_key() {
        let (mut r, shared, reread) = from_file(&format!("{PORT}capacity: {{endpoints: 2}}\n{WEB}{}", endpoint_lines(2)));
        let over = reread(&format!("{PORT}capacity: {{endpoints: 2}}\n{WEB}{}", endpoint_lines(3)));
        let file = over.config.path.display().to_string();
        r.apply(SourceMsg::File { state: Box::new(over), trigger: "edit".into() });
        let st = shared.borrow().sources[FILE_SOURCE].clone();
        assert_eq!(st.problems, [format!("{file}:2:23: capacity.endpoints: more than 2 endpoints: raise capacity.endpoints (it takes effect at restart)")]);
    }

    #[test]
    fn a_compile_failure_is_refused_like_a_bad_object() {
        let (mut r, shared, _rx) = reconciler();
        // More endpoints than counter slots: the model resolves, the
        // compilation fails.
        r.compiler = Compiler::new(4, 2);
        r.apply(desired("xds", svc("web", &[(0, "10.0.0.5"), (1, "10.0.0.6"), (2, "10.0.0.7")])));
        let st = shared.borrow().sources["xds"].clone();
        assert!(!st.accepted);
        assert!(st.problems[0].contains("capacity.endpoints"), "{:?}", st.problems);
        assert!(r.model.get("xds").is_none());
        r.apply(desired("xds", svc("web", &[(0, "10.0.0.5")])));
        assert!(shared.borrow().sources["xds"].accepted);
    }
}

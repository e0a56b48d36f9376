//! What the admin endpoint reads: the workers' counters (written by the
//! workers, read with relaxed loads), probes of the ports and of the packet
//! pool, and the channels the control tasks publish on (the reconciler's
//! publications and status, the BIRD driver's status).
//!
//! Nothing here touches the fast path: probes are traits so that the
//! endpoint can be tested without DPDK. The admin endpoint's view of the
//! published state ([`ControlState`]) is its own, behind one short-held
//! lock: [`Shared::control`] brings it up to the channels' last values
//! when it is read, so what it shows is never older than what a source
//! was told.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use serde::Serialize;
use sluice_dataplane::counters::WorkerCounters;
use tokio::sync::watch;

use crate::compile::EndpointStatus;
use crate::ground::lock;
use crate::reconcile::{Baselines, Published, ReconcilerStatus, Summary};

pub use crate::reconcile::{RouteMeta, SourceStatus, REBUILT_SHOWN};

/// Basic counters of a port, as DPDK gives them.
pub use sluice_ffi::PortStats;

/// A port's counters and link, read at scrape time.
pub(crate) trait PortProbe: Send + Sync + fmt::Debug {
    /// DPDK's basic counters.
    fn stats(&self) -> Option<PortStats>;
    /// Link up or down.
    fn link_up(&self) -> Option<bool>;
}

/// The packet pool's occupancy.
pub trait PoolProbe: Send + Sync + fmt::Debug {
    /// Mbufs taken from the pool.
    fn in_use(&self) -> u32;
    /// Mbufs in the pool.
    fn capacity(&self) -> u32;
}

/// A pool that is never used, for tests of what reads the shared state.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct IdlePool;

#[cfg(test)]
impl PoolProbe for IdlePool {
    fn in_use(&self) -> u32 {
        0
    }
    fn capacity(&self) -> u32 {
        1
    }
}

/// A port as status shows it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PortMeta {
    /// Config name.
    pub(crate) name: String,
    /// DPDK device.
    pub(crate) device: String,
    /// Driver.
    pub(crate) driver: String,
    /// Kernel interface of its exception path ("" for none).
    pub(crate) kernel_interface: String,
    /// MAC.
    pub(crate) mac: String,
    /// IP MTU applied to the device.
    pub(crate) mtu: u16,
}

/// What a port lost before DPDK saw it (frames the kernel or the NIC
/// received and dropped for want of room), and where that figure comes from.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct PortLoss {
    /// Frames lost below DPDK since start.
    pub(crate) below_dpdk: u64,
    /// Where the figure comes from: `imissed` (DPDK), a driver xstat name,
    /// `kernel:<iface>` (the kernel interface's receive counter minus what
    /// DPDK received), or `none` when nothing can tell.
    pub(crate) source: String,
    /// True when `below_dpdk` counts every frame lost up to the last
    /// sample; false before the first sample and while frames arrive at a
    /// kernel interface, when it is a lower bound (frames counted by the
    /// kernel may still be on their way to DPDK). See `appliance::loss`.
    pub(crate) exact: bool,
}

/// A port and its exception tap.
#[derive(Debug)]
pub struct PortEntry {
    /// What it is.
    pub(crate) meta: PortMeta,
    /// The port.
    pub(crate) port: Arc<dyn PortProbe>,
    /// Its exception tap.
    pub(crate) tap: Option<Arc<dyn PortProbe>>,
    /// Loss below DPDK, refreshed by the loss sampler.
    pub(crate) loss: Mutex<PortLoss>,
    /// Times the kernel interface under the port (`net_af_packet`,
    /// `net_af_xdp`) was found forwarding IPv4 or filtering loosely again,
    /// and set back.
    pub(crate) kernel_settings_restored: AtomicU64,
    /// Frames the kernel dropped on their way to the appliance through the
    /// port's exception interface (its transmit queue full: the workers
    /// read them too slowly), refreshed by the loss sampler.
    pub(crate) exception_dropped: AtomicU64,
}

/// A worker and its counters.
#[derive(Debug)]
pub struct WorkerEntry {
    /// Its lcore.
    pub(crate) lcore: u32,
    /// Its counters.
    pub(crate) counters: Arc<WorkerCounters>,
    /// Its latency histogram, when it records one (`dpdk.latencyHistogram`).
    pub(crate) latency: Option<Arc<sluice_dataplane::latency::SharedLatency>>,
}

/// A service as status shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceMeta {
    /// Name.
    pub name: String,
    /// Counter slot.
    #[serde(skip)]
    pub(crate) slot: u32,
    /// Algorithm.
    pub algorithm: &'static str,
    /// Flow table.
    pub(crate) flow_table: bool,
    /// Endpoint limit.
    pub(crate) limit: u32,
    /// Table size.
    pub(crate) table_size: u32,
    /// At least one endpoint takes new flows.
    pub(crate) ready: bool,
    /// Its active check, described.
    pub check: Option<String>,
}

/// The admin endpoint's view of what the reconciler published and decided
/// (see [`Shared::control`]).
#[derive(Debug, Default)]
pub struct ControlState {
    /// Generation published last.
    pub(crate) generation: u64,
    /// When it was published.
    pub(crate) published_at: Option<Instant>,
    /// Seconds the last compile-and-publish took.
    pub(crate) publish_seconds: f64,
    /// Publications.
    pub publishes: u64,
    /// Each source, by name.
    pub sources: BTreeMap<String, SourceStatus>,
    /// Services.
    pub services: Vec<ServiceMeta>,
    /// Routes.
    pub routes: Arc<Vec<RouteMeta>>,
    /// Endpoints, service by service (see [`ControlState::all_endpoints`]).
    pub(crate) endpoints: crate::compile::Statuses,
    /// Counter values at the time a slot was (re)assigned: (packets, bytes).
    pub(crate) base: Arc<Baselines>,
    /// Snapshots replaced but not yet freed.
    pub(crate) snapshots_pending: usize,
    /// Next hops the kernel has not resolved yet.
    pub(crate) unresolved: usize,
    /// Control tasks that ended before shutdown (a panic, a lost channel).
    pub(crate) faults: Vec<String>,
    /// The publication the view was last brought up to: its generation and
    /// model summary.
    seen: Option<(u64, Arc<Summary>)>,
}

impl ControlState {
    /// Every endpoint's status, service by service.
    pub fn all_endpoints(&self) -> impl Iterator<Item = &EndpointStatus> {
        self.endpoints.iter().flat_map(|s| s.iter())
    }

    /// Reloads accepted and rejected, over all sources.
    pub(crate) fn reload_totals(&self) -> (u64, u64) {
        self.sources.values().fold((0, 0), |(a, r), s| (a + s.accepted_total, r + s.rejected_total))
    }

    /// Brings the view up to the publication `p`: the services' list is
    /// made again after a new model summary, and otherwise only whether
    /// services are ready changes (of the services `p` names when it
    /// follows the publication seen last, of all when some were missed).
    fn catch_up(&mut self, p: &Published) {
        let next = (p.generation, &p.summary);
        match self.seen.as_ref() {
            Some((g, summary)) if *g == p.generation && Arc::ptr_eq(summary, &p.summary) => return,
            Some((g, summary)) if Arc::ptr_eq(summary, &p.summary) => match p.changed.as_deref().filter(|_| *g + 1 == p.generation) {
                Some(names) => {
                    for name in names {
                        if let Ok(i) = self.services.binary_search_by(|m| m.name.as_str().cmp(name)) {
                            self.services[i].ready = p.ready(name);
                        }
                    }
                }
                None => self.services.iter_mut().for_each(|m| m.ready = p.ready(&m.name)),
            },
            _ => {
                // Room for every service (collected from a filter, it grew
                // by doubling).
                let mut services = Vec::with_capacity(p.summary.services.len());
                services.extend(p.summary.services.iter().map(|s| ServiceMeta {
                    name: s.name.clone(),
                    slot: s.slot,
                    algorithm: s.algorithm,
                    flow_table: s.flow_table,
                    limit: s.limit,
                    table_size: s.table_size,
                    ready: p.ready(&s.name),
                    check: p.summary.checks.get(&s.name).map(ToString::to_string),
                }));
                self.services = services;
                self.routes = Arc::clone(&p.summary.routes);
            }
        }
        self.seen = Some((next.0, Arc::clone(next.1)));
        self.generation = p.generation;
        self.published_at = p.at;
        self.publish_seconds = p.seconds;
        self.publishes = p.count;
        self.endpoints = p.endpoints.clone();
        self.unresolved = p.unresolved;
        self.base = Arc::clone(&p.baselines);
    }
}

/// The reconciler's channels the admin endpoint reads.
#[derive(Debug)]
pub struct Reconciled {
    /// Its publications.
    pub published: watch::Receiver<Published>,
    /// Its status.
    pub status: watch::Receiver<ReconcilerStatus>,
}

/// Liveness of one worker, as the health sampler saw it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WorkerLiveness {
    /// Poll rounds counted at the last sample.
    pub(crate) polls: u64,
    /// When the poll count last moved.
    pub(crate) progressed: Instant,
    /// Generation the worker used at the last sample.
    pub(crate) generation: u64,
    /// Since when it has lagged behind the published generation (None: it has not).
    pub(crate) lagging_since: Option<Instant>,
    /// Busy and idle cycles at the last sample.
    pub(crate) cycles: (u64, u64),
    /// Share of time spent on packets, recently (moving average over about a second).
    pub(crate) busy_share: f64,
}

/// Where the admin endpoint finds the status channel of a source that
/// comes and goes with its section of the configuration (None while the
/// section is absent).
pub(crate) type StatusSlot<S> = Mutex<Option<watch::Receiver<S>>>;

/// Everything the admin endpoint and the samplers read.
#[derive(Debug)]
pub struct Shared {
    /// Start time.
    pub(crate) started: Instant,
    /// The configuration file.
    pub(crate) config_path: String,
    /// Ports.
    pub(crate) ports: Vec<PortEntry>,
    /// The packet pool.
    pub(crate) pool: Arc<dyn PoolProbe>,
    /// Workers.
    pub(crate) workers: Vec<WorkerEntry>,
    /// Ticks per second of the workers' cycle counter.
    pub(crate) cycles_hz: u64,
    /// The admin endpoint's view of the reconciler's publications and
    /// status: read it through [`Shared::control`].
    pub(crate) state: Mutex<ControlState>,
    /// The reconciler's channels (set once, before the admin endpoint serves).
    pub reconciled: std::sync::OnceLock<Reconciled>,
    /// Per worker, what the health sampler saw last.
    pub(crate) liveness: Mutex<Vec<WorkerLiveness>>,
    /// The last minute's samples of the totals (the health sampler keeps them).
    pub(crate) window: Mutex<super::window::Window>,
    /// The xDS source's status channel, while it runs.
    pub(crate) xds: StatusSlot<crate::sources::xds::XdsStatus>,
    /// The BIRD driver's status channel (set once, when the driver starts).
    pub(crate) bird: std::sync::OnceLock<crate::routing::bird::StatusRx>,
    /// The Kubernetes source's status channel, while it runs.
    pub(crate) kube: StatusSlot<crate::sources::kube::KubeStatus>,
    /// The sibling sync task's status channel (set once, with a `siblings:` section).
    pub(crate) sync: std::sync::OnceLock<watch::Receiver<crate::sync::SyncStatus>>,
    /// Passive health's status channel (set once, when it starts).
    pub(crate) health: std::sync::OnceLock<watch::Receiver<Option<sluice_admin_api::health::Health>>>,
}

impl Shared {
    /// Shared state for these ports, pool and workers.
    pub fn new(
        config_path: String,
        ports: Vec<PortEntry>,
        pool: Arc<dyn PoolProbe>,
        workers: Vec<WorkerEntry>,
        cycles_hz: u64,
    ) -> Shared {
        let now = Instant::now();
        let liveness = workers
            .iter()
            .map(|_| WorkerLiveness { polls: 0, progressed: now, generation: 0, lagging_since: None, cycles: (0, 0), busy_share: 0.0 })
            .collect();
        Shared {
            started: now,
            config_path,
            ports,
            pool,
            workers,
            cycles_hz,
            state: Mutex::new(ControlState::default()),
            reconciled: std::sync::OnceLock::new(),
            liveness: Mutex::new(liveness),
            window: Mutex::new(super::window::Window::default()),
            xds: Mutex::new(None),
            bird: std::sync::OnceLock::new(),
            kube: Mutex::new(None),
            sync: std::sync::OnceLock::new(),
            health: std::sync::OnceLock::new(),
        }
    }

    /// The view of what the reconciler published and decided, brought up to
    /// its channels' last values (it stays as it is without them).
    pub fn control(&self) -> MutexGuard<'_, ControlState> {
        let mut st = lock(&self.state);
        if let Some(r) = self.reconciled.get() {
            st.catch_up(&r.published.borrow());
            let status = r.status.borrow();
            if st.sources != status.sources {
                st.sources.clone_from(&status.sources);
            }
            st.snapshots_pending = status.snapshots_pending;
        }
        st
    }

    /// The snapshot published last (for table dumps and explanations).
    pub(crate) fn snapshot(&self) -> Option<Arc<sluice_dataplane::snapshot::Snapshot>> {
        let p = self.reconciled.get()?.published.borrow();
        p.at.map(|_| Arc::clone(&p.snapshot))
    }

    /// The xDS source's last status, while it runs.
    pub(crate) fn xds(&self) -> Option<crate::sources::xds::XdsStatus> {
        lock(&self.xds).as_ref().map(|rx| rx.borrow().clone())
    }

    /// The Kubernetes source's last status, while it runs.
    pub(crate) fn kube(&self) -> Option<crate::sources::kube::KubeStatus> {
        lock(&self.kube).as_ref().map(|rx| rx.borrow().clone())
    }

    /// The sibling sync task's last status, with a `siblings:` section.
    pub(crate) fn sync(&self) -> Option<crate::sync::SyncStatus> {
        self.sync.get().map(|rx| rx.borrow().clone())
    }

    /// Passive health's last status, while it runs.
    pub(crate) fn health(&self) -> Option<sluice_admin_api::health::Health> {
        self.health.get().and_then(|rx| rx.borrow().clone())
    }

    /// Frames lost on their way in so far: below DPDK (the device's misses,
    /// or the kernel interface's drops under af_packet, as the loss sampler
    /// last counted them), and for want of a buffer.
    pub(crate) fn received_and_dropped(&self) -> u64 {
        self.ports
            .iter()
            .map(|p| {
                let s = p.port.stats().unwrap_or_default();
                s.imissed.max(lock(&p.loss).below_dpdk) + s.rx_nombuf
            })
            .sum()
    }

    /// The BIRD driver's last status, while gateway routers are configured.
    pub(crate) fn bird(&self) -> Option<crate::routing::bird::BirdStatus> {
        self.bird.get().and_then(|rx| rx.borrow().clone())
    }

    /// Sum over workers of (packets, bytes) of a service slot.
    pub(crate) fn service_totals(&self, slot: u32) -> (u64, u64) {
        self.workers.iter().fold((0, 0), |(p, b), w| match w.counters.services.get(slot as usize) {
            Some(c) => (p + c.packets.get(), b + c.bytes.get()),
            None => (p, b),
        })
    }

    /// Sum over workers of (packets, bytes) of an endpoint slot.
    pub(crate) fn endpoint_totals(&self, slot: u32) -> (u64, u64) {
        self.workers.iter().fold((0, 0), |(p, b), w| match w.counters.endpoints.get(slot as usize) {
            Some(c) => (p + c.packets.get(), b + c.bytes.get()),
            None => (p, b),
        })
    }

    /// Packets and bytes of a service since its slot was assigned.
    pub(crate) fn service_count(&self, st: &ControlState, slot: u32) -> (u64, u64) {
        let (p, b) = self.service_totals(slot);
        let (bp, bb) = st.base.services.get(&slot).copied().unwrap_or((0, 0));
        (p.saturating_sub(bp), b.saturating_sub(bb))
    }

    /// Packets and bytes of an endpoint since its slot was assigned.
    pub(crate) fn endpoint_count(&self, st: &ControlState, slot: u32) -> (u64, u64) {
        let (p, b) = self.endpoint_totals(slot);
        let (bp, bb) = st.base.endpoints.get(&slot).copied().unwrap_or((0, 0));
        (p.saturating_sub(bp), b.saturating_sub(bb))
    }
}

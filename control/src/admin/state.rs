//! What the admin endpoint reads: the workers' counters (written by the
//! workers, read with relaxed loads), probes of the ports and of the packet
//! pool, and the state the reconciler records after each decision.
//!
//! Nothing here touches the fast path: probes are traits so that the
//! endpoint can be tested without DPDK, and the control state sits behind
//! one short-held lock that only the reconciler writes.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use sluice_dataplane::counters::WorkerCounters;

use crate::compile::EndpointStatus;

/// Basic counters of a port, as DPDK gives them.
pub use sluice_ffi::PortStats;

/// A port's counters and link, read at scrape time.
pub trait PortProbe: Send + Sync + fmt::Debug {
    /// DPDK's basic counters.
    fn stats(&self) -> Option<PortStats>;
    /// Link up or down.
    fn link_up(&self) -> Option<bool>;
    /// The driver's extended counters.
    fn xstats(&self) -> Vec<(String, u64)>;
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
pub struct IdlePool;

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
pub struct PortMeta {
    /// Config name.
    pub name: String,
    /// DPDK device.
    pub device: String,
    /// Driver.
    pub driver: String,
    /// Kernel interface of its exception path ("" for none).
    pub kernel_interface: String,
    /// MAC.
    pub mac: String,
    /// IP MTU applied to the device.
    pub mtu: u16,
}

/// What a port lost before DPDK saw it (frames the kernel or the NIC
/// received and dropped for want of room), and where that figure comes from.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PortLoss {
    /// Frames lost below DPDK since start.
    pub below_dpdk: u64,
    /// Where the figure comes from: `imissed` (DPDK), a driver xstat name,
    /// `kernel:<iface>` (the kernel interface's receive counter minus what
    /// DPDK received), or `none` when nothing can tell.
    pub source: String,
    /// True when `below_dpdk` counts every frame lost up to the last
    /// sample; false before the first sample and while frames arrive at a
    /// kernel interface, when it is a lower bound (frames counted by the
    /// kernel may still be on their way to DPDK). See `appliance::loss`.
    pub exact: bool,
}

/// A port and its exception tap.
#[derive(Debug)]
pub struct PortEntry {
    /// What it is.
    pub meta: PortMeta,
    /// The port.
    pub port: Arc<dyn PortProbe>,
    /// Its exception tap.
    pub tap: Option<Arc<dyn PortProbe>>,
    /// Loss below DPDK, refreshed by the loss sampler.
    pub loss: Mutex<PortLoss>,
}

/// A worker and its counters.
#[derive(Debug)]
pub struct WorkerEntry {
    /// Its lcore.
    pub lcore: u32,
    /// Its counters.
    pub counters: Arc<WorkerCounters>,
    /// Its latency histogram, when it records one (`dpdk.latencyHistogram`).
    pub latency: Option<Arc<sluice_dataplane::latency::SharedLatency>>,
}

/// A service as status shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceMeta {
    /// Name.
    pub name: String,
    /// Counter slot.
    #[serde(skip)]
    pub slot: u32,
    /// Algorithm.
    pub algorithm: &'static str,
    /// Flow table.
    pub flow_table: bool,
    /// Endpoint limit.
    pub limit: u32,
    /// Table size.
    pub table_size: u32,
    /// At least one endpoint takes new flows.
    pub ready: bool,
}

/// A route as status shows it.
#[derive(Clone, Debug, Serialize)]
pub struct RouteMeta {
    /// Name.
    pub name: String,
    /// Service.
    pub service: String,
    /// Priority.
    pub priority: i32,
    /// VIPs (one allocation per route, not one more per VIP as text).
    pub vips: Vec<std::net::IpAddr>,
}

/// Rebuilt services named in a source's status: a change that rebuilt
/// 10,000 services shows the first 64 and the count.
pub const REBUILT_SHOWN: usize = 64;

/// What the reconciler last did with a source's state.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SourceStatus {
    /// The source's last state is the one being served.
    pub accepted: bool,
    /// When it was last heard from (seconds since the epoch).
    pub at: u64,
    /// What made it send (file change, SIGHUP, start, ...).
    pub trigger: String,
    /// Why its last state was refused (empty when accepted).
    pub problems: Vec<String>,
    /// Services whose tables its last accepted change rebuilt (the first
    /// [`REBUILT_SHOWN`] of them, in name order).
    pub rebuilt: Vec<String>,
    /// How many services that change rebuilt.
    pub rebuilt_count: usize,
    /// States accepted.
    pub accepted_total: u64,
    /// States refused.
    pub rejected_total: u64,
}

/// What the reconciler records for the admin endpoint.
#[derive(Debug, Default)]
pub struct ControlState {
    /// Generation published last.
    pub generation: u64,
    /// When it was published.
    pub published_at: Option<Instant>,
    /// Seconds the last compile-and-publish took.
    pub publish_seconds: f64,
    /// Publications.
    pub publishes: u64,
    /// Each source, by name.
    pub sources: BTreeMap<String, SourceStatus>,
    /// Services.
    pub services: Vec<ServiceMeta>,
    /// Routes.
    pub routes: Vec<RouteMeta>,
    /// Endpoints, service by service (see [`ControlState::all_endpoints`]).
    pub endpoints: crate::compile::Statuses,
    /// Counter values at the time a slot was (re)assigned: (packets, bytes).
    pub service_base: HashMap<u32, (u64, u64)>,
    /// Same, for endpoint slots.
    pub endpoint_base: HashMap<u32, (u64, u64)>,
    /// Snapshots replaced but not yet freed.
    pub snapshots_pending: usize,
    /// Next hops the kernel has not resolved yet.
    pub unresolved: usize,
    /// Control tasks that ended before shutdown (a panic, a lost channel).
    pub faults: Vec<String>,
    /// The snapshot published last (for table dumps and explanations).
    pub snapshot: Option<std::sync::Arc<sluice_dataplane::snapshot::Snapshot>>,
}

impl ControlState {
    /// Every endpoint's status, service by service.
    pub fn all_endpoints(&self) -> impl Iterator<Item = &EndpointStatus> {
        self.endpoints.iter().flat_map(|s| s.iter())
    }

    /// Reloads accepted and rejected, over all sources.
    pub fn reload_totals(&self) -> (u64, u64) {
        self.sources.values().fold((0, 0), |(a, r), s| (a + s.accepted_total, r + s.rejected_total))
    }
}

/// Liveness of one worker, as the health sampler saw it.
#[derive(Clone, Copy, Debug)]
pub struct WorkerLiveness {
    /// Poll rounds counted at the last sample.
    pub polls: u64,
    /// When the poll count last moved.
    pub progressed: Instant,
    /// Generation the worker used at the last sample.
    pub generation: u64,
    /// Since when it has lagged behind the published generation (None: it has not).
    pub lagging_since: Option<Instant>,
    /// Busy and idle cycles at the last sample.
    pub cycles: (u64, u64),
    /// Share of time spent on packets, recently (moving average over about a second).
    pub busy_share: f64,
}

/// Everything the admin endpoint and the samplers read.
#[derive(Debug)]
pub struct Shared {
    /// Start time.
    pub started: Instant,
    /// The configuration file.
    pub config_path: String,
    /// Ports.
    pub ports: Vec<PortEntry>,
    /// The packet pool.
    pub pool: Arc<dyn PoolProbe>,
    /// Workers.
    pub workers: Vec<WorkerEntry>,
    /// Ticks per second of the workers' cycle counter.
    pub cycles_hz: u64,
    /// The reconciler's record.
    pub state: Mutex<ControlState>,
    /// Per worker, what the health sampler saw last.
    pub liveness: Mutex<Vec<WorkerLiveness>>,
    /// The xDS source's status, while it runs.
    pub xds: Mutex<Option<Arc<Mutex<crate::sources::xds::XdsStatus>>>>,
    /// The BIRD driver's status channel (set once, when the driver starts).
    pub bird: std::sync::OnceLock<crate::routing::bird::StatusRx>,
    /// The Kubernetes source's status, while it runs.
    pub kube: Mutex<Option<Arc<Mutex<crate::sources::kube::KubeStatus>>>>,
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
            liveness: Mutex::new(liveness),
            xds: Mutex::new(None),
            bird: std::sync::OnceLock::new(),
            kube: Mutex::new(None),
        }
    }

    /// The BIRD driver's last status, while gateway routers are configured.
    pub fn bird(&self) -> Option<crate::routing::bird::BirdStatus> {
        self.bird.get().and_then(|rx| rx.borrow().clone())
    }

    /// Sum over workers of (packets, bytes) of a service slot.
    pub fn service_totals(&self, slot: u32) -> (u64, u64) {
        self.workers.iter().fold((0, 0), |(p, b), w| match w.counters.services.get(slot as usize) {
            Some(c) => (p + c.packets.get(), b + c.bytes.get()),
            None => (p, b),
        })
    }

    /// Sum over workers of (packets, bytes) of an endpoint slot.
    pub fn endpoint_totals(&self, slot: u32) -> (u64, u64) {
        self.workers.iter().fold((0, 0), |(p, b), w| match w.counters.endpoints.get(slot as usize) {
            Some(c) => (p + c.packets.get(), b + c.bytes.get()),
            None => (p, b),
        })
    }

    /// Records current totals of newly assigned slots as their starting
    /// point. A slot that never counted anything has nothing to subtract
    /// and no entry (counters only grow, so an entry it had is gone too):
    /// 100,000 fresh endpoint slots would otherwise keep 3.5 MiB of zeros.
    pub fn baseline(&self, st: &mut ControlState, services: &[u32], endpoints: &[u32]) {
        fn record(base: &mut HashMap<u32, (u64, u64)>, slot: u32, totals: (u64, u64)) {
            if totals == (0, 0) {
                base.remove(&slot);
            } else {
                base.insert(slot, totals);
            }
        }
        for &s in services {
            record(&mut st.service_base, s, self.service_totals(s));
        }
        for &s in endpoints {
            record(&mut st.endpoint_base, s, self.endpoint_totals(s));
        }
    }

    /// Packets and bytes of a service since its slot was assigned.
    pub fn service_count(&self, st: &ControlState, slot: u32) -> (u64, u64) {
        let (p, b) = self.service_totals(slot);
        let (bp, bb) = st.service_base.get(&slot).copied().unwrap_or((0, 0));
        (p.saturating_sub(bp), b.saturating_sub(bb))
    }

    /// Packets and bytes of an endpoint since its slot was assigned.
    pub fn endpoint_count(&self, st: &ControlState, slot: u32) -> (u64, u64) {
        let (p, b) = self.endpoint_totals(slot);
        let (bp, bb) = st.endpoint_base.get(&slot).copied().unwrap_or((0, 0));
        (p.saturating_sub(bp), b.saturating_sub(bb))
    }
}


#[cfg(test)]
mod tests {
    use sluice_dataplane::counters::WorkerCounters;

    use super::*;

    #[test]
    fn only_slots_that_counted_keep_a_baseline() {
        let w = (0..2).map(|i| WorkerEntry { lcore: i + 1, counters: Arc::new(WorkerCounters::new(2, 4)), latency: None }).collect();
        let sh = Shared::new("t.yaml".into(), Vec::new(), Arc::new(IdlePool), w, 1);
        let mut st = ControlState::default();
        sh.workers[0].counters.endpoints[1].count(100);
        sh.workers[1].counters.endpoints[1].count(60);
        sh.baseline(&mut st, &[0, 1], &[0, 1, 2, 3]);
        assert!(st.service_base.is_empty(), "no service counted anything");
        assert_eq!(st.endpoint_base.len(), 1, "only slot 1 counted: {:?}", st.endpoint_base);
        assert_eq!(sh.endpoint_count(&st, 1), (0, 0), "slot 1 starts from what it had");
        sh.workers[0].counters.endpoints[1].count(40);
        sh.workers[1].counters.endpoints[2].count(10);
        assert_eq!((sh.endpoint_count(&st, 1), sh.endpoint_count(&st, 2)), ((1, 40), (1, 10)));
        // Slot 2 given again: it starts from its totals; slot 1 too.
        sh.baseline(&mut st, &[], &[1, 2]);
        assert_eq!((sh.endpoint_count(&st, 1), sh.endpoint_count(&st, 2)), ((0, 0), (0, 0)));
    }
}

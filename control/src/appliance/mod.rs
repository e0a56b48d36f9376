//! `sluice run`: the appliance.
//!
//! The configuration is read and checked, then the appliance comes up in
//! the steps of [`STEPS`], each with its undo beside it ([`steps`]): DPDK on
//! the configured cores; the control runtime (its threads share the main
//! lcore's core, never a worker's; with a single core, the worker polls on
//! the main lcore and the control runtime runs beside it on a thread of its
//! own, both backing off when idle); the packet pool, ports and exception
//! taps ([`bringup`]) and the kernel side of each tap; each worker's queues
//! as the port and queue plan ([`plan`]) gives them; the admin state and
//! the first snapshot; the workers ([`workers`]). The control side
//! ([`control`]) runs until SIGINT or SIGTERM and stops the admin endpoint
//! and its tasks; then the steps are undone, last first: the workers
//! (stopped before they are waited for), the ports, the check that every
//! mbuf is back in the pool, DPDK.

mod bringup;
mod control;
pub mod eal;
mod loss;
mod notify;
mod plan;
mod stall;
mod steps;
mod workers;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use sluice_dataplane::handshake::Handshakes;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::latency::SharedLatency;
use sluice_dataplane::pipeline::PipelineConfig;
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::snapshot::Snapshot;
use sluice_dataplane::steer::Steering;
use sluice_dataplane::sync::{SyncRing, SyncedPins, SYNC_RING_CAPACITY};
use sluice_dataplane::worker::{IdlePolicy, Worker, WorkerConfig};
use sluice_ffi::{Eal, LcoreId, Mempool, PortStats, PortStatsReader, QueueIo};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::admin::state::{PoolProbe, PortEntry, PortLoss, PortMeta, PortProbe, Reconciled, Shared, WorkerEntry};
use crate::admin::Limits;
use crate::compile::{TopoPort, Topology};
use crate::problem::Problem;
use crate::model::{Model, Resolved};
use crate::reconcile::{Reconciler, Settings};
use crate::sources::{self, FileState, Loaded};
pub use eal::{count_lcores, eal_args};
use bringup::Machine;
use plan::{Plan, Queue};
use steps::Step;

/// The test hook that stalls a worker: built with the `test-hooks` feature
/// and armed only when `SLUICE_TEST_HOOKS=1` is in the environment, SIGUSR2
/// then sets the flag, and the first worker stops polling for good (it
/// sleeps in place of reading its clock, forever, as a frozen worker
/// would). `None` otherwise.
#[cfg(feature = "test-hooks")]
fn stall_hook() -> Option<Arc<AtomicBool>> {
    if std::env::var_os("SLUICE_TEST_HOOKS").is_none_or(|v| v != "1") {
        return None;
    }
    let flag = Arc::new(AtomicBool::new(false));
    match signal_hook::flag::register(signal_hook::consts::SIGUSR2, Arc::clone(&flag)) {
        Ok(_) => {
            tracing::warn!("test hook armed: SIGUSR2 stalls the first worker");
            Some(flag)
        }
        Err(e) => {
            error!(error = %e, "test hook: cannot handle SIGUSR2");
            None
        }
    }
}

#[cfg(not(feature = "test-hooks"))]
fn stall_hook() -> Option<Arc<AtomicBool>> {
    None
}

/// Run the load balancer.
///
/// Starts DPDK on the configured cores and ports, forwards until SIGINT or
/// SIGTERM, reloads the configuration on SIGHUP or when a file changes
/// (keeping the last good one if the new one has problems), and serves
/// /metrics, /status, /healthz and /readyz on the admin address.
///
/// Example: sluice run --config configs/demo.yaml
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// The appliance configuration (YAML; see configs/).
    #[arg(long, short, value_name = "FILE")]
    pub(crate) config: PathBuf,
}

fn problems_error(ps: &[Problem], path: &std::path::Path) -> anyhow::Error {
    for p in ps {
        error!(problem = %p, "configuration rejected");
    }
    anyhow!("{} problem(s) in the configuration (run `sluice check --config {}`)", ps.len(), path.display())
}

/// DPDK's counters of one port, read at scrape time. The reader keeps the
/// device open, so the port is closed only once the admin side is gone.
#[derive(Debug)]
struct DpdkPort(PortStatsReader);

impl PortProbe for DpdkPort {
    fn stats(&self) -> Option<PortStats> {
        self.0.stats().ok()
    }
    fn link_up(&self) -> Option<bool> {
        self.0.link().ok().map(|l| l.up)
    }
}

#[derive(Debug)]
struct Pool(Arc<Mempool>);

impl PoolProbe for Pool {
    fn in_use(&self) -> u32 {
        self.0.in_use()
    }
    fn capacity(&self) -> u32 {
        self.0.capacity()
    }
}

/// Raises a stop flag when dropped (also when unwinding).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Empty poll rounds a worker spins through before its first pause: about
/// as long as a few bursts take, so gaps within traffic cost no sleep.
const IDLE_SPIN_ROUNDS: u32 = 256;

/// How the workers wait when they find nothing: busy polling, or bounded
/// exponential pauses.
fn idle_policy(d: &crate::config::DpdkConfig) -> IdlePolicy {
    if d.busy_poll {
        IdlePolicy::BUSY_POLL
    } else {
        IdlePolicy { spin_rounds: IDLE_SPIN_ROUNDS, max_pause_us: d.idle_pause_max_us, rx_interrupts: d.rx_interrupts }
    }
}

/// How long the control runtime's threads get to end once the control
/// side returned (within the stop's bound, [`control::STOP_BOUND`]).
const RUNTIME_STOP: Duration = Duration::from_millis(1000);

/// Packets each worker's steering queue holds.
const STEER_QUEUE: usize = 1024;

/// A worker built, not yet launched: its lcore and its loop.
type Built = (LcoreId, Worker<QueueIo>);

/// A worker's loop, run on its lcore until the stop flag rises.
type WorkerTask = Box<dyn FnOnce(&AtomicBool) -> i32 + Send>;

/// The appliance while it comes up, runs and stops: what each step of
/// [`STEPS`] brings up, and what its undo takes down. A step stores what it
/// brought up only once it succeeded, so a failed step leaves nothing for
/// the undo of the steps before it to trip over. (The fields are in the
/// reverse order of the steps: dropped while unwinding, they go last step
/// first as well.)
struct Appliance {
    /// With one core, the worker that polls on the main lcore.
    on_main: Option<WorkerTask>,
    workers: Option<workers::Workers>,
    /// The workers' stop flag.
    stop: Arc<AtomicBool>,
    reconciler: Option<Reconciler>,
    settings: Option<watch::Receiver<Settings>>,
    learned: Option<watch::Sender<Vec<crate::config::GatewayConfig>>>,
    shared: Option<Arc<Shared>>,
    built: Vec<Built>,
    entries: Vec<WorkerEntry>,
    publisher: Option<Publisher<Snapshot>>,
    /// Sibling sync (with a `siblings:` section only): a ring per worker
    /// and the publisher of the pins received.
    sync: Option<(Vec<Arc<SyncRing>>, Publisher<SyncedPins>)>,
    /// The workers' shared table of TCP handshakes (passive health).
    handshakes: Option<Arc<Handshakes>>,
    netlink: Option<rtnetlink::Handle>,
    machine: Option<Machine>,
    rt: Option<tokio::runtime::Runtime>,
    /// The lcores the workers poll on.
    lcores: Vec<LcoreId>,
    eal: Option<Eal>,
    config_path: PathBuf,
    /// The configuration as read at start.
    initial: FileState,
    /// Its model and what it resolved to, until the reconciler takes them.
    first: Option<(Model, Resolved)>,
    nworkers: usize,
    /// When every worker's clock reads 0 (the sync task's deadlines are
    /// in that clock).
    epoch: Instant,
    /// Packets forwarded and dropped, counted when the workers stopped.
    totals: (u64, u64),
    /// An undo found a fault (a worker failed, mbufs not returned, DPDK
    /// not cleaned up): the exit status says so.
    failed: bool,
}

/// The appliance's bring-up, in order, each step with its undo: a step
/// that fails has the ones before it undone, last first (an error at start
/// leaves nothing behind that would stop the next start), and stopping
/// undoes them all the same way.
const STEPS: &[Step<Appliance>] = &[
    // Interfaces that DPDK reads through the kernel are DPDK's alone.
    Step { name: "handing the kernel interfaces to DPDK", up: Appliance::leave_to_dpdk, down: steps::nothing },
    // A child left running by an earlier run that was killed may hold
    // DPDK's files of this prefix: it goes before DPDK starts.
    Step { name: "stopping a BIRD left by an earlier run", up: Appliance::stop_leftover_bird, down: steps::nothing },
    Step { name: "DPDK", up: Appliance::start_eal, down: Appliance::stop_eal },
    Step { name: "the control runtime", up: Appliance::start_runtime, down: Appliance::stop_runtime },
    Step { name: "the packet pool and the ports", up: Appliance::start_ports, down: Appliance::stop_ports },
    // The taps' kernel side goes with the taps.
    Step { name: "the exception interfaces", up: Appliance::configure_taps, down: steps::nothing },
    // Without a `siblings:` section no ring is made and the workers export
    // nothing: nothing would drain the rings.
    Step { name: "the sibling sync's rings", up: Appliance::make_sync, down: Appliance::drop_sync },
    Step { name: "the workers' queues", up: Appliance::build_workers, down: Appliance::drop_workers },
    Step { name: "the admin state and the first snapshot", up: Appliance::start_reconciler, down: Appliance::drop_shared },
    Step { name: "the workers", up: Appliance::launch_workers, down: Appliance::stop_workers },
];

/// Runs the appliance.
pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let Loaded { file: initial, model, resolved } = sources::load(&args.config).map_err(|ps| problems_error(&ps, &args.config))?;
    let lcores = count_lcores(&initial.config.dpdk.lcores);
    if lcores == 0 {
        bail!("dpdk.lcores lists no core");
    }
    let mut a = Appliance {
        on_main: None,
        workers: None,
        stop: Arc::new(AtomicBool::new(false)),
        reconciler: None,
        settings: None,
        learned: None,
        shared: None,
        built: Vec::new(),
        entries: Vec::new(),
        publisher: None,
        sync: None,
        handshakes: None,
        netlink: None,
        machine: None,
        rt: None,
        lcores: Vec::new(),
        eal: None,
        config_path: args.config.clone(),
        initial,
        first: Some((model, resolved)),
        // One core: it runs the worker, the control runtime shares it.
        nworkers: lcores.saturating_sub(1).max(1),
        epoch: Instant::now(),
        totals: (0, 0),
        failed: false,
    };
    steps::up(STEPS, &mut a)?;
    if let Err(e) = a.serve() {
        error!(error = format!("{e:#}"), "control runtime failed");
        a.failed = true;
    }
    steps::undo(STEPS, &mut a);
    Ok(if a.failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

impl Appliance {
    fn cfg(&self) -> &crate::config::ApplianceConfig {
        &self.initial.config
    }

    fn leave_to_dpdk(&mut self) -> Result<()> {
        for p in &self.cfg().ports {
            if let Some(iface) = loss::kernel_iface(p) {
                crate::routing::leave_to_dpdk(&iface).with_context(|| format!("port {:?}", p.name))?;
            }
        }
        Ok(())
    }

    fn stop_leftover_bird(&mut self) -> Result<()> {
        if self.cfg().routing.bird.mode == crate::config::router::BirdMode::Supervised {
            crate::routing::bird::supervisor::stop_leftover(&self.cfg().routing.bird);
        }
        Ok(())
    }

    fn start_eal(&mut self) -> Result<()> {
        let eal_args = eal_args(self.cfg(), self.nworkers);
        info!(args = %eal_args.join(" "), "starting DPDK");
        let eal = Eal::init(&eal_args)?;
        for line in eal.startup_log().lines().filter(|l| !l.trim().is_empty()) {
            tracing::debug!(target: "dpdk", "{line}");
        }
        // With one lcore the worker polls on the main lcore itself.
        self.lcores = match eal.worker_lcores() {
            w if w.is_empty() => vec![eal.main_lcore()],
            w => w,
        };
        self.eal = Some(eal);
        Ok(())
    }

    fn stop_eal(&mut self) {
        if let Some(eal) = self.eal.take() {
            if let Err(e) = eal.shutdown() {
                error!(error = %e, "DPDK could not be cleaned up");
                self.failed = true;
            }
        }
    }

    /// Created after the EAL: its threads inherit the main lcore's affinity
    /// and so never compete with a worker for its core.
    fn start_runtime(&mut self) -> Result<()> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("sluice-control")
            .enable_all()
            .build()
            .context("starting the control runtime")?;
        self.rt = Some(rt);
        Ok(())
    }

    /// (The control side takes the runtime to run on, and stops it.)
    fn stop_runtime(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(RUNTIME_STOP);
        }
    }

    fn start_ports(&mut self) -> Result<()> {
        let (Some(eal), w16) = (&self.eal, u16::try_from(self.lcores.len()).context("too many workers")?) else {
            bail!("DPDK is not running");
        };
        self.machine = Some(bringup::start(eal, self.cfg(), w16)?);
        Ok(())
    }

    /// The ports stop and close (their readers went with the admin state),
    /// then every mbuf must be back in the pool.
    fn stop_ports(&mut self) {
        let Some(Machine { pool, ports }) = self.machine.take() else { return };
        drop(ports);
        let in_use = pool.in_use();
        let (forwarded, dropped) = self.totals;
        info!(forwarded, dropped, mbufs_in_use = in_use, "stopped");
        if in_use != 0 {
            error!(mbufs_in_use = in_use, "mbufs not returned to the pool");
            self.failed = true;
        }
    }

    fn configure_taps(&mut self) -> Result<()> {
        let (Some(rt), Some(machine)) = (&self.rt, &self.machine) else { bail!("the ports are not up") };
        let netlink = rt.block_on(async { crate::routing::connect() }).context("opening a netlink socket")?;
        // Every next hop may sit behind one port: its probes all fit the
        // exception interface's queue.
        let queue = crate::routing::exception_queue_len(self.initial.config.max_endpoints);
        for p in &machine.ports {
            if !p.cfg.kernel_interface.is_empty() {
                let addrs: Vec<_> = p.cfg.addresses.iter().map(|a| (a.addr.to_ip(), a.prefix)).collect();
                rt.block_on(crate::routing::configure_interface(&netlink, &p.cfg.kernel_interface, p.mac, p.cfg.mtu, queue, &addrs))
                    .with_context(|| format!("configuring kernel interface {:?}", p.cfg.kernel_interface))?;
                info!(port = %p.cfg.name, interface = %p.cfg.kernel_interface, addresses = ?p.cfg.addresses.iter().map(ToString::to_string).collect::<Vec<_>>(), "exception path ready");
            }
        }
        self.netlink = Some(netlink);
        Ok(())
    }

    fn make_sync(&mut self) -> Result<()> {
        if self.initial.config.siblings.is_some() {
            let rings = self.lcores.iter().map(|_| Arc::new(SyncRing::new(SYNC_RING_CAPACITY))).collect();
            self.sync = Some((rings, Publisher::new(SyncedPins::default())));
        }
        Ok(())
    }

    fn drop_sync(&mut self) {
        self.sync = None;
    }

    /// Each worker takes its queues of every port and tap (the plan says
    /// which), its counters and its reader of the published snapshot.
    fn build_workers(&mut self) -> Result<()> {
        let cfg = &self.initial.config;
        let Some(machine) = self.machine.as_mut() else { bail!("the ports are not up") };
        let plan = Plan::new(&machine.ports.iter().map(|p| p.tap.is_some()).collect::<Vec<_>>());
        // Fragments, ICMP errors and flow-table flows go to the worker that owns
        // them; the queues between workers hold this many packets each.
        let steering = Steering::new(self.lcores.len(), STEER_QUEUE);
        let publisher = Publisher::new(Snapshot::default());
        let Some(tsc_hz) = self.eal.as_ref().map(Eal::tsc_hz) else { bail!("the EAL is not up") };
        let handshakes = cfg.passive_health.enabled.then(|| Arc::new(Handshakes::with_clock(crate::health::TABLE_SLOTS, sluice_ffi::tsc, tsc_hz)));
        let (mut built, mut entries) = (Vec::new(), Vec::new());
        for (k, &lcore) in self.lcores.iter().enumerate() {
            let q = u16::try_from(k)?;
            let mut io = QueueIo::with_pool(machine.pool.clone());
            for r in &plan.rx {
                let queue = match *r {
                    Queue::Port(i) => machine.ports[i].port.take_rx_queue(q),
                    Queue::Tap(i) => machine.ports[i].tap.as_mut().and_then(|t| t.take_rx_queue(q)),
                };
                io.rx.push(queue.with_context(|| format!("receive queue {q} of {r:?}"))?);
            }
            for t in &plan.tx {
                let queue = match *t {
                    Queue::Port(i) => machine.ports[i].port.take_tx_queue(q),
                    Queue::Tap(i) => machine.ports[i].tap.as_mut().and_then(|t| t.take_tx_queue(q)),
                };
                io.tx.push(queue.with_context(|| format!("transmit queue {q} of {t:?}"))?);
            }
            let ctr = Arc::new(WorkerCounters::new(cfg.max_services as usize, cfg.max_endpoints as usize));
            let wc = WorkerConfig {
                id: u32::from(q),
                inputs: plan.inputs.clone(),
                outputs: plan.outputs(),
                pipeline: PipelineConfig { flow_entries: cfg.flow_entries, flow_timeouts: cfg.flow_timeouts, ..PipelineConfig::default() },
                stash_capacity: 256,
                stash_ttl_ms: 1000,
            };
            let mut worker = Worker::new(io, publisher.reader(), Arc::clone(&ctr), &wc).with_steering(Arc::clone(&steering), k);
            if let Some(h) = &handshakes {
                worker = worker.with_handshakes(Arc::clone(h));
            }
            if let Some((rings, synced)) = &self.sync {
                worker = worker.with_sync(Arc::clone(&rings[k]), synced.reader());
            }
            let latency = cfg.dpdk.latency_histogram.then(|| Arc::new(SharedLatency::default()));
            if let Some(l) = &latency {
                worker = worker.with_latency(sluice_ffi::tsc, Arc::clone(l));
            }
            built.push((lcore, worker));
            entries.push(WorkerEntry { lcore: lcore.0, counters: ctr, latency });
        }
        (self.built, self.entries, self.publisher, self.handshakes) = (built, entries, Some(publisher), handshakes);
        Ok(())
    }

    /// Their queues go back to the ports before the ports stop.
    fn drop_workers(&mut self) {
        self.built.clear();
        self.entries.clear();
        self.publisher = None;
        self.handshakes = None;
    }

    /// The admin state over the ports, pool and workers; the reconciler,
    /// which publishes the first snapshot. (It takes the publisher and the
    /// workers' counters: if it fails, they go with it.)
    fn start_reconciler(&mut self) -> Result<()> {
        let (Some(eal), Some(machine), Some(publisher)) = (&self.eal, &self.machine, self.publisher.take()) else {
            bail!("the workers' queues are not built")
        };
        let ports: Vec<PortEntry> = machine
            .ports
            .iter()
            .map(|p| PortEntry {
                meta: PortMeta {
                    name: p.cfg.name.clone(),
                    device: p.cfg.device.clone(),
                    driver: p.port.info().driver.clone(),
                    kernel_interface: p.cfg.kernel_interface.clone(),
                    mac: sluice_ffi::MacAddr(p.mac).to_string(),
                    mtu: p.cfg.mtu,
                },
                port: Arc::new(DpdkPort(p.port.stats_reader())),
                tap: p.tap.as_ref().map(|t| Arc::new(DpdkPort(t.stats_reader())) as Arc<dyn PortProbe>),
                loss: Mutex::new(PortLoss::default()),
                kernel_settings_restored: AtomicU64::new(0),
                exception_dropped: AtomicU64::new(0),
            })
            .collect();
        let shared = Arc::new(Shared::new(
            self.config_path.display().to_string(),
            ports,
            Arc::new(Pool(Arc::clone(&machine.pool))),
            std::mem::take(&mut self.entries),
            eal.tsc_hz(),
        ));
        let topo = Topology {
            ports: machine
                .ports
                .iter()
                .map(|p| TopoPort { name: p.cfg.name.clone(), mac: p.mac, mtu: p.cfg.mtu, vlan: p.cfg.vlan, addresses: p.cfg.addresses.clone() })
                .collect(),
            gateways: self.initial.config.gateways.clone(),
        };
        let (settings_tx, settings_rx) = watch::channel(Settings::of(&self.initial.config));
        let counters = shared.workers.iter().map(|w| Arc::clone(&w.counters)).collect();
        let (model, resolved) = self.first.take().ok_or_else(|| anyhow!("the configuration read at start was handed on already"))?;
        let loaded = Loaded { file: self.initial.clone(), model, resolved };
        let mut reconciler = Reconciler::new(loaded, topo, publisher, counters, settings_tx);
        let reconciled = Reconciled { published: reconciler.publications(), status: reconciler.status() };
        // Set once: the shared state was made just above.
        let _ = shared.reconciled.set(reconciled);
        let (learned_tx, learned_rx) = watch::channel(Vec::new());
        reconciler.follow_learned_gateways(learned_rx);
        reconciler
            .start()
            .map_err(|ps| anyhow!("the first snapshot could not be built: {}", ps.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")))?;
        self.shared = Some(shared);
        self.reconciler = Some(reconciler);
        self.settings = Some(settings_rx);
        self.learned = Some(learned_tx);
        Ok(())
    }

    /// The admin state goes once the control runtime is gone (its port
    /// readers keep the devices open); the workers' totals are read first.
    fn drop_shared(&mut self) {
        self.reconciler = None;
        self.settings = None;
        self.learned = None;
        let Some(shared) = self.shared.take() else { return };
        let forwarded: u64 = shared.workers.iter().map(|w| w.counters.balanced.get() + w.counters.returned.get()).sum();
        let dropped: u64 = shared.workers.iter().map(|w| w.counters.total_drops()).sum();
        self.totals = (forwarded, dropped);
        if Arc::strong_count(&shared) != 1 {
            error!("the admin state is still referenced after the control runtime stopped");
        }
    }

    fn launch_workers(&mut self) -> Result<()> {
        let (Some(eal), Some(shared)) = (&self.eal, &self.shared) else { bail!("the admin state is not up") };
        let idle = idle_policy(&self.initial.config.dpdk);
        info!(busy_poll = self.initial.config.dpdk.busy_poll, idle_pause_max_us = idle.max_pause_us, rx_interrupts = idle.rx_interrupts, "worker idle policy");
        let mut workers = workers::Workers::new(Arc::clone(&self.stop));
        let mut freeze = stall_hook();
        let mut on_main: Option<WorkerTask> = None;
        let start = self.epoch;
        for (lcore, mut worker) in std::mem::take(&mut self.built) {
            // The first worker only: the others go on polling.
            let frozen = freeze.take();
            let task = move |stop: &AtomicBool| {
                worker.run_with(
                    stop,
                    || {
                        if let Some(f) = frozen.as_ref() {
                            while f.load(std::sync::atomic::Ordering::Relaxed) {
                                std::thread::sleep(Duration::from_millis(10));
                            }
                        }
                        u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
                    },
                    sluice_ffi::tsc,
                    idle,
                    |us| std::thread::sleep(Duration::from_micros(u64::from(us))),
                );
                0
            };
            if lcore == eal.main_lcore() {
                on_main = Some(Box::new(task));
            } else {
                // On an error, those launched stop with their guard.
                workers.launch(eal, lcore, task)?;
            }
        }
        crate::admin::health::workers_launched(shared, Instant::now());
        info!(workers = workers.len() + usize::from(on_main.is_some()), on_main_lcore = on_main.is_some(), "workers started");
        (self.workers, self.on_main) = (Some(workers), on_main);
        Ok(())
    }

    /// Stopped before they are waited for.
    fn stop_workers(&mut self) {
        self.on_main = None;
        if let Some(w) = self.workers.take() {
            if !w.stop() {
                self.failed = true;
            }
        }
    }

    /// Runs the control side until it stops, on the control runtime (which
    /// it takes and stops); with one core, the worker polls here meanwhile.
    fn serve(&mut self) -> Result<()> {
        let (Some(rt), Some(shared), Some(reconciler), Some(settings), Some(learned), Some(netlink)) =
            (self.rt.take(), &self.shared, self.reconciler.take(), self.settings.take(), self.learned.take(), self.netlink.take())
        else {
            bail!("the appliance is not up");
        };
        let cfg = &self.initial.config;
        let w16 = u16::try_from(self.lcores.len()).context("too many workers")?;
        let loss = loss::LossSampler::new(Arc::clone(shared), &cfg.ports, w16, cfg.dpdk.descriptors, netlink);
        let parts = control::Parts {
            shared: Arc::clone(shared),
            reconciler,
            settings,
            config_path: self.config_path.clone(),
            initial: self.initial.clone(),
            admin: (
                cfg.admin,
                Limits {
                    max_connections: cfg.admin_max_connections as usize,
                    request_timeout: std::time::Duration::from_secs(u64::from(cfg.admin_request_timeout_secs)),
                    ..Limits::default()
                },
            ),
            ifaces: cfg.ports.iter().map(|p| p.kernel_interface.clone()).collect(),
            loss,
            learned,
            stall_exit: Duration::from_secs(u64::from(cfg.dpdk.stall_exit_secs)),
            health: self.handshakes.take().map(|h| (h, crate::health::Rule::of(&cfg.passive_health))),
            sync: match (cfg.siblings.clone(), self.sync.take()) {
                (Some(sib), Some((rings, publisher))) => Some(control::SyncParts {
                    pods: if sib.kubernetes_pods { cfg.kubernetes.clone() } else { None },
                    cfg: sib,
                    rings,
                    publisher,
                    epoch: self.epoch,
                }),
                _ => None,
            },
        };
        let Some(task) = self.on_main.take() else {
            let r = rt.block_on(control::run(parts, CancellationToken::new()));
            rt.shutdown_timeout(RUNTIME_STOP);
            return r;
        };
        // One core: the worker polls here, on the main lcore, and the
        // control runtime runs on a thread of its own (not an EAL thread)
        // on the same core; when it ends, for whatever reason, the worker
        // is told to stop.
        let guard = StopOnDrop(Arc::clone(&self.stop));
        let control = std::thread::Builder::new()
            .name("sluice-control".into())
            .spawn(move || {
                let _guard = guard;
                let r = rt.block_on(control::run(parts, CancellationToken::new()));
                rt.shutdown_timeout(RUNTIME_STOP);
                r
            })
            .context("starting the control thread")?;
        task(&self.stop);
        control.join().unwrap_or_else(|_| Err(anyhow!("the control thread panicked")))
    }
}

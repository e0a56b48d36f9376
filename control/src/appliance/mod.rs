//! `sluice run`: the appliance.
//!
//! In order: the configuration is read and checked; DPDK starts on the
//! configured cores; the control runtime is created (its threads share the
//! main lcore's core, never a worker's; with a single core, the worker
//! polls on the main lcore and the control runtime runs beside it on a
//! thread of its own, both backing off when idle); the packet pool, ports and
//! exception taps come up ([`bringup`]) and the kernel side of each tap is
//! configured; the port and queue plan ([`plan`]) gives each worker its
//! queues; the first snapshot is published; the workers are launched
//! ([`workers`]); the control runtime ([`control`]) runs until SIGINT or
//! SIGTERM. Shutdown goes the other way: admin endpoint and control tasks,
//! workers (stopped before they are waited for), ports, then the check that
//! every mbuf is back in the pool.

pub mod bringup;
pub mod control;
pub mod eal;
pub mod loss;
pub mod plan;
pub mod stall;
pub mod workers;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::latency::SharedLatency;
use sluice_dataplane::pipeline::PipelineConfig;
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::snapshot::Snapshot;
use sluice_dataplane::steer::Steering;
use sluice_dataplane::worker::{IdlePolicy, Worker, WorkerConfig};
use sluice_ffi::{Eal, Mempool, PortStats, PortStatsReader, QueueIo};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use crate::admin::state::{PoolProbe, PortEntry, PortLoss, PortMeta, PortProbe, Reconciled, Shared, WorkerEntry};
use crate::admin::Limits;
use crate::compile::{TopoPort, Topology};
use crate::problem::Problem;
use crate::model::Model;
use crate::reconcile::{Reconciler, Settings};
use crate::sources;
pub use eal::{count_lcores, eal_args};
use bringup::Machine;
use plan::{Plan, Queue};

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
    pub config: PathBuf,
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
    fn xstats(&self) -> Vec<(String, u64)> {
        self.0.xstats().unwrap_or_default()
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

/// Runs the appliance.
pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let initial = sources::read(&args.config).map_err(|ps| problems_error(&ps, &args.config))?;
    {
        let mut m = Model::default();
        initial.set_into(&mut m);
        m.resolve(&initial.config.defaults).map_err(|ps| problems_error(&ps, &args.config))?;
    }
    let cfg = initial.config.clone();
    // One core: it runs the worker, the control runtime shares it.
    let nworkers = count_lcores(&cfg.dpdk.lcores).saturating_sub(1).max(1);
    if count_lcores(&cfg.dpdk.lcores) == 0 {
        bail!("dpdk.lcores lists no core");
    }
    // Interfaces that DPDK reads through the kernel are DPDK's alone.
    for p in &cfg.ports {
        if let Some(iface) = loss::kernel_iface(p) {
            crate::routing::leave_to_dpdk(&iface).with_context(|| format!("port {:?}", p.name))?;
        }
    }
    // A child left running by an earlier run that was killed may hold
    // DPDK's files of this prefix: it goes before DPDK starts.
    if cfg.routing.bird.mode == crate::config::router::BirdMode::Supervised {
        crate::routing::bird::supervisor::stop_leftover(&cfg.routing.bird);
    }
    let eal_args = eal_args(&cfg, nworkers);
    info!(args = %eal_args.join(" "), "starting DPDK");
    let eal = Eal::init(&eal_args)?;
    for line in eal.startup_log().lines().filter(|l| !l.trim().is_empty()) {
        tracing::debug!(target: "dpdk", "{line}");
    }
    // Created after the EAL: its threads inherit the main lcore's affinity
    // and so never compete with a worker for its core.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sluice-control")
        .enable_all()
        .build()
        .context("starting the control runtime")?;
    // With one lcore the worker polls on the main lcore itself.
    let lcores = match eal.worker_lcores() {
        w if w.is_empty() => vec![eal.main_lcore()],
        w => w,
    };
    let w16 = u16::try_from(lcores.len()).context("too many workers")?;
    let mut machine = bringup::start(&eal, &cfg, w16)?;
    let netlink = rt.block_on(async { crate::routing::connect() }).context("opening a netlink socket")?;
    // Every next hop may sit behind one port: its probes all fit the
    // exception interface's queue.
    let queue = crate::routing::exception_queue_len(cfg.max_endpoints);
    for p in &machine.ports {
        if !p.cfg.kernel_interface.is_empty() {
            let addrs: Vec<_> = p.cfg.addresses.iter().map(|a| (a.addr.to_ip(), a.prefix)).collect();
            rt.block_on(crate::routing::configure_interface(&netlink, &p.cfg.kernel_interface, p.mac, p.cfg.mtu, queue, &addrs))
                .with_context(|| format!("configuring kernel interface {:?}", p.cfg.kernel_interface))?;
            info!(port = %p.cfg.name, interface = %p.cfg.kernel_interface, addresses = ?p.cfg.addresses.iter().map(ToString::to_string).collect::<Vec<_>>(), "exception path ready");
        }
    }

    let plan = Plan::new(&machine.ports.iter().map(|p| p.tap.is_some()).collect::<Vec<_>>());
    // Fragments, ICMP errors and flow-table flows go to the worker that owns
    // them; the queues between workers hold this many packets each.
    let steering = Steering::new(lcores.len(), STEER_QUEUE);
    let publisher = Publisher::new(Snapshot::default());
    let mut built = Vec::new();
    let mut entries = Vec::new();
    for (k, &lcore) in lcores.iter().enumerate() {
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
            pipeline: PipelineConfig {
                flow_entries: cfg.flow_entries,
                flow_timeouts: cfg.flow_timeouts,
                ..PipelineConfig::default()
            },
            stash_capacity: 256,
            stash_ttl_ms: 1000,
        };
        let mut worker = Worker::new(io, publisher.reader(), Arc::clone(&ctr), &wc).with_steering(Arc::clone(&steering), k);
        let latency = cfg.dpdk.latency_histogram.then(|| Arc::new(SharedLatency::default()));
        if let Some(l) = &latency {
            worker = worker.with_latency(sluice_ffi::tsc, Arc::clone(l));
        }
        built.push((lcore, worker));
        entries.push(WorkerEntry { lcore: lcore.0, counters: ctr, latency });
    }

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
        })
        .collect();
    let shared = Arc::new(Shared::new(
        args.config.display().to_string(),
        ports,
        Arc::new(Pool(Arc::clone(&machine.pool))),
        entries,
        eal.tsc_hz(),
    ));
    let topo = Topology {
        ports: machine
            .ports
            .iter()
            .map(|p| TopoPort { name: p.cfg.name.clone(), mac: p.mac, mtu: p.cfg.mtu, vlan: p.cfg.vlan, addresses: p.cfg.addresses.clone() })
            .collect(),
        gateways: cfg.gateways.clone(),
    };
    let (settings_tx, settings_rx) = watch::channel(Settings::of(&initial.config));
    let counters = shared.workers.iter().map(|w| Arc::clone(&w.counters)).collect();
    let mut reconciler = Reconciler::new(initial.clone(), topo, publisher, counters, settings_tx);
    let reconciled = Reconciled { published: reconciler.publications(), status: reconciler.status() };
    // Set once: the shared state was made just above.
    let _ = shared.reconciled.set(reconciled);
    let (learned_tx, learned_rx) = watch::channel(Vec::new());
    reconciler.follow_learned_gateways(learned_rx);
    reconciler
        .start()
        .map_err(|ps| anyhow!("the first snapshot could not be built: {}", ps.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")))?;

    let idle = idle_policy(&cfg.dpdk);
    info!(busy_poll = cfg.dpdk.busy_poll, idle_pause_max_us = idle.max_pause_us, rx_interrupts = idle.rx_interrupts, "worker idle policy");
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = workers::Workers::new(Arc::clone(&stop));
    let mut on_main = None;
    let mut freeze = stall_hook();
    for (lcore, mut worker) in built {
        // The first worker only: the others go on polling.
        let frozen = freeze.take();
        let task = move |stop: &AtomicBool| {
            let start = Instant::now();
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
            on_main = Some(task);
        } else {
            workers.launch(&eal, lcore, task)?;
        }
    }
    crate::admin::health::workers_launched(&shared, Instant::now());
    info!(workers = workers.len() + usize::from(on_main.is_some()), on_main_lcore = on_main.is_some(), "workers started");

    let loss = loss::LossSampler::new(Arc::clone(&shared), &cfg.ports, w16, cfg.dpdk.descriptors, netlink);
    let parts = control::Parts {
        shared: Arc::clone(&shared),
        reconciler,
        settings: settings_rx,
        config_path: args.config.clone(),
        initial,
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
        learned: learned_tx,
        stall_exit: Duration::from_secs(u64::from(cfg.dpdk.stall_exit_secs)),
    };
    let control_result = match on_main {
        None => {
            let r = rt.block_on(control::run(parts, CancellationToken::new()));
            rt.shutdown_timeout(RUNTIME_STOP);
            r
        }
        Some(mut task) => {
            // One core: the worker polls here, on the main lcore, and the
            // control runtime runs on a thread of its own (not an EAL
            // thread) on the same core; when it ends, for whatever reason,
            // the worker is told to stop.
            let guard = StopOnDrop(Arc::clone(&stop));
            let control = std::thread::Builder::new()
                .name("sluice-control".into())
                .spawn(move || {
                    let _guard = guard;
                    let r = rt.block_on(control::run(parts, CancellationToken::new()));
                    rt.shutdown_timeout(RUNTIME_STOP);
                    r
                })
                .context("starting the control thread")?;
            task(&stop);
            control.join().unwrap_or_else(|_| Err(anyhow!("the control thread panicked")))
        }
    };

    let mut failed = !workers.stop();
    let forwarded: u64 = shared.workers.iter().map(|w| w.counters.balanced.get() + w.counters.returned.get()).sum();
    let dropped: u64 = shared.workers.iter().map(|w| w.counters.total_drops()).sum();
    // The admin side is gone with the runtime; its port readers go with
    // `shared`, so dropping the ports now stops and closes them.
    if Arc::strong_count(&shared) != 1 {
        error!("the admin state is still referenced after the control runtime stopped");
    }
    drop(shared);
    let Machine { pool, ports } = machine;
    drop(ports);
    let in_use = pool.in_use();
    info!(forwarded, dropped, mbufs_in_use = in_use, "stopped");
    if in_use != 0 {
        error!(mbufs_in_use = in_use, "mbufs not returned to the pool");
        failed = true;
    }
    drop(pool);
    if let Err(e) = control_result {
        error!(error = format!("{e:#}"), "control runtime failed");
        failed = true;
    }
    if let Err(e) = eal.shutdown() {
        error!(error = %e, "DPDK could not be cleaned up");
        failed = true;
    }
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

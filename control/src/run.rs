//! `sluice run`: the appliance.
//!
//! The main lcore runs the control thread: configuration, model, compiler
//! and snapshot publisher, the kernel side of the exception path, reloads.
//! Every other lcore runs a poll-mode worker over its own receive and
//! transmit queue of every port and of every port's exception tap. An
//! admin thread serves `/metrics` and `/status` on localhost.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use sluice_dataplane::addr::Addr;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::pipeline::PipelineConfig;
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::snapshot::Snapshot;
use sluice_dataplane::worker::{Input, Worker, WorkerConfig};
use sluice_ffi::{Eal, Mempool, Port, PortConfig as FfiPortConfig, QueueIo, DEFAULT_DATA_ROOM};
use tracing::{error, info, warn};

use crate::admin::{self, ControlState, PortMeta, ReloadStatus, RouteMeta, ServiceMeta, Shared};
use crate::compile::{Compiled, Compiler, EndpointState, TopoPort, Topology};
use crate::config::ApplianceConfig;
use crate::kernel::{self, NeighborTable};
use crate::sources::{self, Fingerprint, Loaded};

/// Run the load balancer.
///
/// Starts DPDK on the configured cores and ports, forwards until SIGINT or
/// SIGTERM, reloads the configuration on SIGHUP or when a file changes
/// (keeping the last good one if the new one has problems), and serves
/// /metrics and /status on the admin address.
///
/// Example: sluice run --config configs/demo.yaml
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// The appliance configuration (YAML; see configs/).
    #[arg(long, short, value_name = "FILE")]
    pub config: PathBuf,
}

/// Number of cores in an EAL core list like `0,1` or `0-3,6`.
pub fn count_lcores(list: &str) -> usize {
    list.split(',')
        .map(|part| match part.split_once('-') {
            Some((a, b)) => match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                (Ok(a), Ok(b)) if b >= a => b - a + 1,
                _ => 0,
            },
            None => usize::from(part.trim().parse::<usize>().is_ok()),
        })
        .sum()
}

/// Name of the tap device of port `i`'s exception path.
fn tap_device(i: usize) -> String {
    format!("net_tap{i}")
}

/// The EAL arguments for `cfg` with `workers` workers.
pub fn eal_args(cfg: &ApplianceConfig, workers: usize) -> Vec<String> {
    let d = &cfg.dpdk;
    let mut a = vec!["-l".to_owned(), d.lcores.clone(), "-m".to_owned(), d.memory_mb.to_string()];
    if !d.hugepages {
        a.push("--no-huge".into());
    }
    a.push(format!("--file-prefix={}", d.file_prefix));
    a.push("--no-telemetry".into());
    let pci: Vec<&str> = cfg.ports.iter().filter(|p| p.is_pci()).map(|p| p.device.as_str()).collect();
    if pci.is_empty() {
        a.push("--no-pci".into());
    }
    for p in pci {
        a.push("-a".into());
        a.push(p.into());
    }
    for p in cfg.ports.iter().filter(|p| !p.is_pci()) {
        let mut dev = p.device.clone();
        if p.device_name().starts_with("net_af_packet") && !dev.contains("qpairs=") {
            dev.push_str(&format!(",qpairs={workers}"));
        }
        a.push(format!("--vdev={dev}"));
    }
    for (i, p) in cfg.ports.iter().enumerate() {
        if !p.kernel_interface.is_empty() {
            a.push(format!("--vdev={},iface={}", tap_device(i), p.kernel_interface));
        }
    }
    a.extend(d.extra_args.iter().cloned());
    a
}

fn print_problems(ps: &[crate::config::node::Problem]) {
    for p in ps {
        error!(problem = %p, "configuration rejected");
    }
}

/// The control thread's state.
struct Control {
    loaded: Loaded,
    topo: Topology,
    compiler: Compiler,
    publisher: Publisher<Snapshot>,
    neigh: NeighborTable,
    macs: HashMap<(u8, Addr), [u8; 6]>,
    next_hops: Vec<(u8, Addr)>,
    shared: Arc<Shared>,
}

impl Control {
    /// Compiles and publishes; returns the services rebuilt.
    fn publish(&mut self, why: &str) -> Result<Vec<String>, String> {
        let t0 = Instant::now();
        let c: Compiled = self.compiler.compile(&self.loaded.resolved, &self.topo, &self.macs)?;
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.baseline(&mut st, &c.new_slots.services, &c.new_slots.endpoints);
        let ready: HashMap<u32, bool> =
            c.snapshot.services.iter().map(|s| (s.key, s.has_ready_endpoint())).collect();
        st.services = c
            .service_slots
            .iter()
            .filter_map(|(slot, name)| {
                let s = self.loaded.resolved.services.get(name)?;
                Some(ServiceMeta {
                    name: name.clone(),
                    slot: *slot,
                    algorithm: s.algorithm.to_string(),
                    flow_table: s.flow_table,
                    limit: s.limit,
                    table_size: s.table_size,
                    ready: ready.get(slot).copied().unwrap_or(false),
                })
            })
            .collect();
        st.routes = self
            .loaded
            .resolved
            .routes
            .iter()
            .map(|r| RouteMeta {
                name: r.name.clone(),
                service: r.service.clone(),
                priority: r.priority,
                vips: r.matches.vips.iter().map(ToString::to_string).collect(),
            })
            .collect();
        for e in &c.endpoints {
            if let EndpointState::Unreachable(why) = &e.state {
                warn!(service = %e.service, id = e.id, address = %e.address, reason = %why, "endpoint unreachable");
            }
        }
        st.endpoints = c.endpoints.clone();
        self.next_hops = c.next_hops.clone();
        let mut snapshot = c.snapshot;
        // Workers report the generation they use: the publisher's numbering.
        snapshot.generation = self.publisher.generation() + 1;
        let generation = self.publisher.publish(snapshot);
        st.generation = generation;
        st.publishes += 1;
        st.publish_seconds = t0.elapsed().as_secs_f64();
        info!(
            generation,
            why,
            rebuilt = ?c.rebuilt,
            unresolved = c.unresolved.len(),
            publish_us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX),
            "snapshot published"
        );
        Ok(c.rebuilt)
    }

    /// Reads the configuration again; on any problem keeps the last good one.
    fn reload(&mut self, trigger: &str) {
        let path = self.loaded.config.path.clone();
        let outcome = match sources::load(&path) {
            Err(ps) => Err(ps.iter().map(ToString::to_string).collect::<Vec<_>>()),
            Ok(new) => {
                let old = &self.loaded.config;
                if new.config.dpdk != old.dpdk || new.config.ports != old.ports || new.config.admin != old.admin {
                    warn!("dpdk, ports and admin settings changed: they take effect at the next start; services, routes and gateways are applied now");
                }
                let previous = std::mem::replace(&mut self.loaded, new);
                let previous_gateways = std::mem::replace(&mut self.topo.gateways, self.loaded.config.gateways.clone());
                match self.publish(trigger) {
                    Ok(rebuilt) => Ok(rebuilt),
                    Err(e) => {
                        self.loaded = previous;
                        self.topo.gateways = previous_gateways;
                        Err(vec![e])
                    }
                }
            }
        };
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Ok(rebuilt) => {
                st.reloads_ok += 1;
                st.last_reload = ReloadStatus { ok: true, at: admin::now_epoch(), problems: vec![], rebuilt };
                info!(trigger, "configuration reloaded");
            }
            Err(problems) => {
                st.reloads_failed += 1;
                for p in &problems {
                    error!(problem = %p, trigger, "reload rejected; still serving the last good configuration");
                }
                st.last_reload = ReloadStatus { ok: false, at: admin::now_epoch(), problems, rebuilt: vec![] };
            }
        }
    }

    /// Keeps the kernel resolving our next hops; republishes when a MAC changed.
    fn refresh_neighbors(&mut self) {
        for e in self.neigh.sync(&self.next_hops) {
            warn!(error = %e, "cannot ask the kernel to resolve a next hop");
        }
        match self.neigh.read() {
            Ok(m) if m != self.macs => {
                self.macs = m;
                if let Err(e) = self.publish("neighbors changed") {
                    error!(error = %e, "compile failed");
                }
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "cannot read the kernel's neighbour table"),
        }
    }
}

/// Runs the appliance.
pub fn run(args: &RunArgs) -> Result<ExitCode> {
    let loaded = sources::load(&args.config).map_err(|ps| {
        print_problems(&ps);
        anyhow!("{} problem(s) in the configuration (run `sluice check --config {}`)", ps.len(), args.config.display())
    })?;
    let cfg = loaded.config.clone();
    let nworkers = count_lcores(&cfg.dpdk.lcores).saturating_sub(1);
    if nworkers == 0 {
        bail!("dpdk.lcores lists one core: list at least two (the first runs the control thread, the others workers)");
    }
    let eal_args = eal_args(&cfg, nworkers);
    info!(args = %eal_args.join(" "), "starting DPDK");
    let eal = Eal::init(&eal_args)?;
    for line in eal.startup_log().lines().filter(|l| !l.trim().is_empty()) {
        tracing::debug!(target: "dpdk", "{line}");
    }
    let lcores = eal.worker_lcores();
    let cache = if cfg.dpdk.mbufs >= 4096 { 256 } else { 0 };
    let pool = Mempool::new(&eal, "sluice_pool", cfg.dpdk.mbufs, cache, DEFAULT_DATA_ROOM)
        .context("creating the packet pool (lower dpdk.mbufs or raise dpdk.memoryMB)")?;
    let w16 = u16::try_from(lcores.len()).context("too many workers")?;

    // Ports, then their exception taps.
    let mut ports = Vec::new();
    let mut taps = Vec::new();
    let mut metas = Vec::new();
    let mut topo = Topology { ports: Vec::new(), gateways: cfg.gateways.clone() };
    let mut ifaces = Vec::new();
    for (i, pc) in cfg.ports.iter().enumerate() {
        let id = sluice_ffi::port_by_name(&eal, pc.device_name())?;
        let q = FfiPortConfig {
            rx_queues: w16,
            tx_queues: w16,
            rx_desc: cfg.dpdk.descriptors,
            tx_desc: cfg.dpdk.descriptors,
            ..FfiPortConfig::default()
        };
        let port = Port::start(&eal, id, &q, &pool).with_context(|| format!("starting port {:?} ({})", pc.name, pc.device))?;
        let mac = port.mac()?;
        info!(port = %pc.name, device = %pc.device, driver = %port.info().driver, %mac, rss = port.rss_enabled(), "port started");
        let tap = if pc.kernel_interface.is_empty() {
            None
        } else {
            let tid = sluice_ffi::port_by_name(&eal, &tap_device(i))?;
            let tq = FfiPortConfig { rx_desc: 256, tx_desc: 256, promiscuous: false, ..q.clone() };
            let t = Port::start(&eal, tid, &tq, &pool).with_context(|| format!("starting the exception tap of port {:?}", pc.name))?;
            kernel::configure_interface(&pc.kernel_interface, &mac.0, pc.mtu, &pc.addresses)
                .with_context(|| format!("configuring kernel interface {:?}", pc.kernel_interface))?;
            info!(port = %pc.name, interface = %pc.kernel_interface, addresses = ?pc.addresses.iter().map(ToString::to_string).collect::<Vec<_>>(), "exception path ready");
            Some(t)
        };
        metas.push(PortMeta {
            name: pc.name.clone(),
            device: pc.device.clone(),
            kernel_interface: pc.kernel_interface.clone(),
            mac: mac.to_string(),
            id,
            tap: tap.as_ref().map(Port::id),
        });
        topo.ports.push(TopoPort { name: pc.name.clone(), mac: mac.0, mtu: pc.mtu, addresses: pc.addresses.clone() });
        ifaces.push(pc.kernel_interface.clone());
        ports.push(port);
        taps.push(tap);
    }

    // Outputs: every port, then every tap. Inputs: every port, then every tap.
    let nports = ports.len();
    let mut tap_output = Vec::new();
    let mut next = nports;
    for t in &taps {
        tap_output.push(t.as_ref().map(|_| {
            next += 1;
            next - 1
        }));
    }
    let mut inputs = Vec::new();
    for (i, out) in tap_output.iter().enumerate() {
        inputs.push(Input::Port { port: u8::try_from(i)?, exception: *out });
    }
    for (i, t) in taps.iter().enumerate() {
        if t.is_some() {
            inputs.push(Input::Passthrough { output: i });
        }
    }

    let compiler = Compiler::new(cfg.max_services, cfg.max_endpoints);
    // Workers start on the first real snapshot: it is published below,
    // before they are launched.
    let publisher = Publisher::new(Snapshot::default());

    let stop = Arc::new(AtomicBool::new(false));
    let hup = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&hup)).context("installing signal handlers")?;

    let mut counters = Vec::new();
    let mut workers = Vec::new();
    for (k, &lcore) in lcores.iter().enumerate() {
        let k16 = u16::try_from(k)?;
        let mut io = QueueIo::default();
        for p in &mut ports {
            io.rx.push(p.take_rx_queue(k16).context("receive queue")?);
            io.tx.push(p.take_tx_queue(k16).context("transmit queue")?);
        }
        for t in taps.iter_mut().flatten() {
            io.tx.push(t.take_tx_queue(k16).context("tap transmit queue")?);
        }
        for t in taps.iter_mut().flatten() {
            io.rx.push(t.take_rx_queue(k16).context("tap receive queue")?);
        }
        let ctr = Arc::new(WorkerCounters::new(cfg.max_services as usize, cfg.max_endpoints as usize));
        let wc = WorkerConfig {
            id: u32::from(k16),
            inputs: inputs.clone(),
            outputs: next,
            pipeline: PipelineConfig {
                flow_entries: cfg.flow_entries,
                flow_idle_secs: cfg.flow_idle_secs,
                ..PipelineConfig::default()
            },
            stash_capacity: 256,
            stash_ttl_ms: 1000,
        };
        workers.push((lcore, Worker::new(io, publisher.reader(), Arc::clone(&ctr), &wc)));
        counters.push((lcore, ctr));
    }

    let shared = Arc::new(Shared {
        started: Instant::now(),
        eal: eal.clone(),
        ports: metas,
        pool: Arc::clone(&pool),
        workers: counters,
        state: Mutex::new(ControlState::default()),
        config_path: args.config.display().to_string(),
    });
    let server = Arc::new(tiny_http::Server::http(cfg.admin).map_err(|e| {
        stop.store(true, Ordering::Relaxed);
        anyhow!("cannot listen on {} for the admin endpoint (admin.listen): {e}", cfg.admin)
    })?);
    let admin_thread = {
        let (server, shared) = (Arc::clone(&server), Arc::clone(&shared));
        std::thread::Builder::new().name("admin".into()).spawn(move || admin_serve(&server, shared))?
    };
    info!(listen = %cfg.admin, "admin endpoint: /metrics /status /healthz");

    let manifests_dir = cfg.manifests.as_ref().map(|m| m.directory.clone());
    let mut fp: Fingerprint = sources::fingerprint(&args.config, manifests_dir.as_deref());
    let mut ctl = Control {
        loaded,
        topo,
        compiler,
        publisher,
        neigh: NeighborTable::new(ifaces),
        macs: HashMap::new(),
        next_hops: Vec::new(),
        shared: Arc::clone(&shared),
    };
    ctl.publish("start").map_err(|e| anyhow!(e))?;

    let mut tasks = Vec::new();
    for (lcore, mut worker) in workers {
        let stop = Arc::clone(&stop);
        tasks.push(eal.launch(lcore, move || {
            let start = Instant::now();
            worker.run(
                &stop,
                || u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
                || u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX),
            );
            0
        })?);
    }
    info!(workers = tasks.len(), "workers started");
    ctl.refresh_neighbors();
    info!(config = %args.config.display(), "running; SIGHUP or editing the configuration reloads it, SIGINT or SIGTERM stops");

    let mut last_slow = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        let mut trigger = hup.swap(false, Ordering::Relaxed).then_some("SIGHUP");
        if last_slow.elapsed() >= Duration::from_millis(500) {
            last_slow = Instant::now();
            let now = sources::fingerprint(&args.config, manifests_dir.as_deref());
            if now != fp {
                fp = now;
                trigger = trigger.or(Some("file change"));
            }
            ctl.refresh_neighbors();
        }
        if let Some(t) = trigger {
            ctl.reload(t);
        }
        ctl.publisher.reclaim();
        let pending = ctl.publisher.pending();
        shared.state.lock().unwrap_or_else(|e| e.into_inner()).snapshots_pending = pending;
    }

    info!("stopping");
    let mut failed = false;
    for t in tasks {
        if let Err(e) = t.wait() {
            error!(error = %e, "worker failed");
            failed = true;
        }
    }
    ctl.neigh.clear();
    let forwarded: u64 = shared.workers.iter().map(|(_, w)| w.balanced.get() + w.returned.get()).sum();
    let dropped: u64 = shared.workers.iter().map(|(_, w)| w.total_drops()).sum();
    drop(ctl);
    drop(ports);
    drop(taps);
    server.unblock();
    let _ = admin_thread.join();
    let in_use = pool.in_use();
    info!(forwarded, dropped, mbufs_in_use = in_use, "stopped");
    if in_use != 0 {
        error!(mbufs_in_use = in_use, "mbufs not returned to the pool");
        failed = true;
    }
    drop(shared);
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn admin_serve(server: &tiny_http::Server, shared: Arc<Shared>) {
    for req in server.incoming_requests() {
        admin::respond(req, &shared);
    }
}

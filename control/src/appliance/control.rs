//! The control runtime: one tokio runtime, off the workers' cores, running
//! the admin endpoint, the sources, the reconciler, the neighbour task and
//! the samplers, until SIGINT or SIGTERM.
//!
//! Shutdown is ordered: the admin endpoint stops first (nobody reads ports
//! being closed), then the sources and the reconciler; the neighbour
//! entries Sluice asked the kernel for are removed; then the caller stops
//! the workers, closes the ports and checks the packet pool.
//!
//! A task that panics is reported (log, `/readyz`, `sluice status`) and the
//! workers keep forwarding with the last published snapshot.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::future::BoxFuture;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::loss::LossSampler;
use crate::admin::state::{Shared, StatusSlot};
use crate::ground::lock;
use crate::admin::{self, health, AdminCounters, Limits};
use crate::model::{Defaults, Desired};
use crate::reconcile::{Reconciler, Settings};
use crate::routing::bird::announce::Forwarding;
use crate::routing::bird::{Driver, DriverHandle};
use crate::routing::{NeighMap, Neighbours};
use crate::sources::kube::{self, KubeStatus};
use crate::sources::xds::{self, XdsStatus};
use crate::sources::{self, FileState, SourceMsg};
use crate::health::HealthTask;
use crate::sync::SyncTask;
use super::stall::{StallWatch, EXIT_STALLED};
use super::notify::{self, Notifier};

/// What the control runtime needs.
#[derive(Debug)]
pub(super) struct Parts {
    /// Shared with the admin endpoint.
    pub(crate) shared: Arc<Shared>,
    /// Owner of the model and the publisher (already started; the admin
    /// endpoint already follows its channels).
    pub(crate) reconciler: Reconciler,
    /// The accepted file's settings (the xDS and Kubernetes sources follow them).
    pub(crate) settings: watch::Receiver<Settings>,
    /// The configuration file.
    pub(crate) config_path: PathBuf,
    /// Its state at start.
    pub(crate) initial: FileState,
    /// Admin address and limits.
    pub(crate) admin: (SocketAddr, Limits),
    /// Kernel interface of each port ("" for none).
    pub(crate) ifaces: Vec<String>,
    /// Loss accounting below DPDK.
    pub(crate) loss: LossSampler,
    /// How long a worker may go without polling before the process exits
    /// (`dpdk.stallExitSeconds`).
    pub(crate) stall_exit: Duration,
    /// Where the BIRD driver tells the reconciler the gateways it learned.
    pub learned: watch::Sender<Vec<crate::config::GatewayConfig>>,
    /// Sibling sync, with a `siblings:` section.
    pub(crate) sync: Option<SyncParts>,
    /// The workers' handshake table and the rule, for passive health.
    pub(crate) health: Option<(Arc<sluice_dataplane::handshake::Handshakes>, crate::health::Rule)>,
}

/// What the sibling sync task needs.
#[derive(Debug)]
pub(super) struct SyncParts {
    /// The `siblings:` section.
    pub cfg: crate::config::siblings::SiblingsConfig,
    /// Each worker's ring of exported pins.
    pub(crate) rings: Vec<Arc<sluice_dataplane::sync::SyncRing>>,
    /// The publisher of the pins received, which the workers read.
    pub(crate) publisher: sluice_dataplane::rcu::Publisher<sluice_dataplane::sync::SyncedPins>,
    /// When the workers' clock reads 0.
    pub(crate) epoch: Instant,
    /// The Gateway whose Deployment's other pods are siblings too
    /// (`siblings.kubernetesPods`).
    pub pods: Option<crate::config::kubernetes::KubeConfig>,
}

/// Runs until SIGINT or SIGTERM (or `stop` is cancelled), then shuts the
/// control side down in order ([`Group`]).
pub(super) async fn run(p: Parts, stop: CancellationToken) -> Result<()> {
    let Parts { shared, reconciler, settings, config_path, initial, admin: (admin_addr, limits), ifaces, loss, learned, stall_exit, sync, health } = p;
    let listener = admin::bind(admin_addr)
        .await
        .with_context(|| format!("cannot listen on {admin_addr} for the admin endpoint (admin.listen)"))?;
    let mut signals = Signals::install()?;
    let sync = match sync {
        Some(parts) => Some(bind_sync(parts, &reconciler, &shared).await?),
        None => None,
    };

    let mut tasks = Tasks::new();
    let forwarding = spawn_admin(&mut tasks, &shared, listener, limits, loss, stall_exit);
    let exception_ifaces: Vec<String> = ifaces.iter().filter(|i| !i.is_empty()).cloned().collect();
    let (neighbours, neigh_rx) = spawn_next_hops(&mut tasks, ifaces, &reconciler)?;
    let gated = sync.as_ref().map(|(s, ..)| s.gated());
    let fleet = sync.map(|(s, pods, fleet)| {
        spawn_sync(&mut tasks, s, pods);
        fleet
    });
    let bird = spawn_bird(&mut tasks, &shared, settings.clone(), &reconciler, (forwarding, gated), learned);
    let gate = reconciler.stop_gate();
    let hup = spawn_sources(&mut tasks, &shared, settings.clone(), (config_path, initial), (reconciler, health, fleet), neigh_rx);
    info!("running; SIGHUP or editing the configuration reloads it, SIGINT or SIGTERM stops");

    let (why, faults) = wait_for_stop(&mut tasks, &mut signals, &stop, &hup, &shared).await;
    // Under the gate a publication holds: one in progress finishes before
    // this line, and none starts after it.
    {
        let _published = lock(&gate);
        tasks.work.cancel();
    }
    info!("{why}: stopping");
    notify::stopping();
    let wait = Duration::from_millis(settings.borrow().routing.bird.withdraw_wait_ms);
    stop_in_order(tasks, &bird, wait, &neighbours, &exception_ifaces).await;
    if faults > 0 {
        error!(faults, "control tasks ended early during this run");
    }
    Ok(())
}

/// The groups the control side's tasks stop in, in this order:
/// 1. [`Group::Work`] (the sources and the reconciler) as soon as a stop
///    is asked for, under the publication gate: work in flight is
///    abandoned and nothing is published after "stopping";
/// 2. then every VIP is withdrawn, and the withdrawal given time to reach
///    the routers, while the workers still forward;
/// 3. [`Group::Admin`] (the admin endpoint and the samplers): nobody reads
///    ports being closed;
/// 4. [`Group::Rest`] (the BIRD driver, the next-hop follower, sibling
///    sync), whose token is the parent of `Work`'s; then the neighbour
///    task and the exception interfaces.
#[derive(Clone, Copy, Debug)]
enum Group {
    Work,
    Admin,
    Rest,
}

/// The control side's tasks by [`Group`]: each group's token, and the
/// tasks joined when it stops (`Work`'s with `Rest`'s).
struct Tasks {
    admin: (CancellationToken, JoinSet<&'static str>),
    rest: (CancellationToken, JoinSet<&'static str>),
    work: CancellationToken,
}

impl Tasks {
    fn new() -> Tasks {
        let rest = CancellationToken::new();
        let work = rest.child_token();
        Tasks { admin: (CancellationToken::new(), JoinSet::new()), rest: (rest, JoinSet::new()), work }
    }

    /// Spawns task `name` of `group`; it runs until its group's token is
    /// cancelled (given to `task`).
    fn spawn<F>(&mut self, group: Group, name: &'static str, task: impl FnOnce(CancellationToken) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let (token, set) = match group {
            Group::Admin => (self.admin.0.clone(), &mut self.admin.1),
            Group::Rest => (self.rest.0.clone(), &mut self.rest.1),
            Group::Work => (self.work.clone(), &mut self.rest.1),
        };
        let run = task(token);
        set.spawn(async move {
            run.await;
            name
        });
    }

    /// The next task to end, of any group.
    async fn ended(&mut self) -> Result<&'static str, tokio::task::JoinError> {
        tokio::select! {
            Some(done) = self.rest.1.join_next() => done,
            Some(done) = self.admin.1.join_next() => done,
            else => std::future::pending().await,
        }
    }
}

/// The signals that stop (SIGINT, SIGTERM) and reload (SIGHUP).
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        let one = |k| signal(k).context("installing signal handlers");
        Ok(Signals { int: one(SignalKind::interrupt())?, term: one(SignalKind::terminate())?, hup: one(SignalKind::hangup())? })
    }
}

/// What the follower of the Gateway's pods needs: the Gateway, the
/// siblings' listen address (its port is theirs), and where it publishes.
type PodsFollower = (crate::config::kubernetes::KubeConfig, SocketAddr, watch::Sender<Option<Vec<SocketAddr>>>);

/// The workers' handshake table and the rule, for passive health (when on).
type PassiveParts = Option<(Arc<sluice_dataplane::handshake::Handshakes>, crate::health::Rule)>;

/// The sibling sync task, listening, with the follower of the Gateway's
/// pods when they are siblings, and the health task's side of the
/// verdicts it shares.
type SyncBound = (SyncTask, Option<PodsFollower>, crate::health::Fleet);

async fn bind_sync(parts: SyncParts, reconciler: &Reconciler, shared: &Shared) -> Result<SyncBound> {
    let SyncParts { cfg, rings, publisher, epoch, pods } = parts;
    let listen = cfg.listen;
    let mut s = SyncTask::bind(cfg, rings, publisher, reconciler.publications(), epoch)
        .await
        .with_context(|| format!("cannot listen on {listen} for the siblings (siblings.listen)"))?;
    let _ = shared.sync.set(s.status());
    let (own, own_rx) = watch::channel(crate::sync::verdicts::Ejected::new());
    let (siblings_tx, siblings) = watch::channel(crate::sync::verdicts::Ejected::new());
    s = s.share_health(own_rx, siblings_tx);
    let pods = match pods {
        Some(kube) => {
            let (tx, rx) = watch::channel(None);
            s = s.follow(rx);
            Some((kube, listen, tx))
        }
        None => None,
    };
    Ok((s, pods, crate::health::Fleet { own, siblings }))
}

/// The admin endpoint, the health sampler (which also watches for stalled
/// workers) and the loss sampler; returns why the workers do not forward,
/// as the health sampler sees it (the BIRD driver announces nothing
/// meanwhile).
fn spawn_admin(tasks: &mut Tasks, shared: &Arc<Shared>, listener: tokio::net::TcpListener, limits: Limits, mut loss: LossSampler, stall_exit: Duration) -> Forwarding {
    let sh = Arc::clone(shared);
    tasks.spawn(Group::Admin, "admin endpoint", move |c| admin::serve(listener, sh, limits, Arc::new(AdminCounters::default()), c));
    // An appliance with siblings announces nothing until it took their
    // pins (or `siblings.startupWaitMs` passed).
    let sync_status = shared.sync.get().cloned();
    let not_forwarding = move |sh: &Shared, now| {
        let mut why = if sh.workers.is_empty() { vec!["no workers".to_owned()] } else { health::unhealthy(sh, now) };
        if sync_status.as_ref().is_some_and(|s| !s.borrow().settled) {
            why.push("waiting for the siblings' pins (siblings.startupWaitMs)".to_owned());
        }
        why
    };
    let (forwarding_tx, forwarding) = watch::channel(not_forwarding(shared, Instant::now()));
    let sh = Arc::clone(shared);
    let mut stalls = StallWatch::new(shared.workers.len(), stall_exit);
    let mut notifier = Notifier::from_env();
    tasks.spawn(Group::Admin, "health sampler", move |c| async move {
        let mut t = tokio::time::interval(health::SAMPLE_EVERY);
        loop {
            tokio::select! {
                () = c.cancelled() => return,
                _ = t.tick() => {
                    let now = Instant::now();
                    health::sample(&sh, now);
                    let why = not_forwarding(&sh, now);
                    forwarding_tx.send_if_modified(|w| std::mem::replace(w, why.clone()) != why);
                    if let Some(n) = notifier.as_mut() {
                        n.sample(now, &health::unhealthy(&sh, now), &health::unready(&sh, now));
                    }
                    if let Some(why) = stalls.check(&sh, now) {
                        error!(reason = %why, status = EXIT_STALLED, "a worker is stalled: exiting for the supervisor to start Sluice again");
                        sluice_ffi::process::exit_now(EXIT_STALLED);
                    }
                }
            }
        }
    });
    let mut kernel = KernelWatch::new(Arc::clone(shared), loss.kernel_interfaces());
    if !kernel.ifaces.is_empty() {
        tasks.spawn(Group::Admin, "kernel interfaces' settings", move |c| async move {
            let mut t = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    () = c.cancelled() => return,
                    _ = t.tick() => kernel.check(),
                }
            }
        });
    }
    tasks.spawn(Group::Admin, "loss sampler", move |c| async move {
        let mut t = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                () = c.cancelled() => return,
                _ = t.tick() => loss.sample().await,
            }
        }
    });
    forwarding
}

/// The kernel interfaces under the ports, kept left to DPDK: set back
/// where something turned IPv4 forwarding on again (counted per port,
/// warned about), checked once a second.
struct KernelWatch {
    shared: Arc<Shared>,
    /// The port's index and its kernel interface.
    ifaces: Vec<(usize, String)>,
    /// Per interface, whether the last check failed (warned about once a
    /// streak).
    failing: Vec<bool>,
}

impl KernelWatch {
    fn new(shared: Arc<Shared>, ifaces: Vec<(usize, String)>) -> KernelWatch {
        let failing = vec![false; ifaces.len()];
        KernelWatch { shared, ifaces, failing }
    }

    fn check(&mut self) {
        for ((i, iface), failing) in self.ifaces.iter().zip(&mut self.failing) {
            match crate::routing::keep_left_to_dpdk(iface) {
                Ok(restored) => {
                    *failing = false;
                    if restored {
                        if let Some(p) = self.shared.ports.get(*i) {
                            p.kernel_settings_restored.fetch_add(1, Ordering::Relaxed);
                        }
                        warn!(
                            interface = %iface,
                            "the kernel interface under a port forwarded IPv4 or filtered reverse paths loosely again (was net.ipv4.ip_forward written?), so the kernel answered the traffic DPDK reads there: set back"
                        );
                    }
                }
                Err(e) if !*failing => {
                    *failing = true;
                    warn!(interface = %iface, error = %e, "cannot keep the kernel interface under a port left to DPDK");
                }
                Err(_) => {}
            }
        }
    }
}

/// The neighbour task, and the follower that asks it for the next hops of
/// each publication; returns the neighbour task and its table's channel.
fn spawn_next_hops(tasks: &mut Tasks, ifaces: Vec<String>, reconciler: &Reconciler) -> Result<(Arc<Neighbours>, watch::Receiver<NeighMap>)> {
    let (neighbours, neigh_rx) = Neighbours::spawn(ifaces).context("starting the neighbour task")?;
    let neighbours = Arc::new(neighbours);
    let nb = Arc::clone(&neighbours);
    let mut published = reconciler.publications();
    // The list is taken (shared) out of the publication, and the
    // channel's lock let go, before the set is made from it: the
    // reconciler's next publication does not wait for that. A list
    // alike the last one (made again by a compilation) is kept without
    // asking again, so that the next one is found shared.
    let mut wanted = Arc::clone(&published.borrow_and_update().next_hops);
    nb.want(&wanted);
    tasks.spawn(Group::Rest, "next-hop follower", move |c| async move {
        loop {
            tokio::select! {
                () = c.cancelled() => return,
                r = published.changed() => {
                    if r.is_err() {
                        return;
                    }
                    let next = Arc::clone(&published.borrow_and_update().next_hops);
                    if Arc::ptr_eq(&next, &wanted) {
                        continue;
                    }
                    let alike = next == wanted;
                    wanted = next;
                    if !alike {
                        nb.want(&wanted);
                    }
                }
            }
        }
    });
    Ok((neighbours, neigh_rx))
}

/// Sibling sync, and the follower of the Gateway's pods when they are
/// siblings.
fn spawn_sync(tasks: &mut Tasks, sync: SyncTask, pods: Option<PodsFollower>) {
    tasks.spawn(Group::Rest, "sibling sync", move |c| sync.run(c));
    if let Some((cfg, listen, tx)) = pods {
        tasks.spawn(Group::Rest, "sibling pods follower", move |c| kube::pods::follow(cfg, listen, kube::pods::Own::from_env(listen), tx, c));
    }
}

/// The BIRD driver; returns the handle that withdraws every VIP.
fn spawn_bird(
    tasks: &mut Tasks,
    shared: &Shared,
    settings: watch::Receiver<Settings>,
    reconciler: &Reconciler,
    (forwarding, gated): (Forwarding, Option<watch::Receiver<crate::sync::Gated>>),
    learned: watch::Sender<Vec<crate::config::GatewayConfig>>,
) -> DriverHandle {
    let (mut driver, handle) = Driver::new(settings, reconciler.publications(), forwarding);
    if let Some(g) = gated {
        driver.gate_with(g);
    }
    let _ = shared.bird.set(driver.status());
    driver.learn_gateways_to(learned);
    tasks.spawn(Group::Rest, "BIRD driver", move |c| async move { driver.run(c).await });
    handle
}

/// The sources (xDS and Kubernetes, each while its section is set, and the
/// file) and the reconciler; returns where SIGHUP asks the file source to
/// read the file again.
fn spawn_sources(
    tasks: &mut Tasks,
    shared: &Arc<Shared>,
    settings: watch::Receiver<Settings>,
    (config_path, initial): (PathBuf, FileState),
    (reconciler, health, fleet): (Reconciler, PassiveParts, Option<crate::health::Fleet>),
    neigh_rx: watch::Receiver<NeighMap>,
) -> mpsc::Sender<()> {
    let (src_tx, src_rx) = mpsc::channel(16);
    // Health: passive (when on) and the active checks (of the services
    // that have one), laid over each other by the health task.
    let (verdicts_tx, verdicts_rx) = watch::channel(crate::health::active::Verdicts::default());
    let (checks_tx, checks_rx) = watch::channel(sluice_admin_api::health::Checks::default());
    let active = crate::health::active::ActiveTask {
        published: reconciler.publications(),
        verdicts: verdicts_tx,
        status: checks_tx,
        max_in_flight: crate::health::active::max_in_flight(),
    };
    tasks.spawn(Group::Work, "active health checks", move |c| active.run(c));
    let (status, rx) = watch::channel(None);
    let _ = shared.health.set(rx);
    let sh = Arc::clone(shared);
    let task = HealthTask {
        passive: health.map(|(table, rule)| crate::health::PassiveInput { table, drops: Box::new(move || sh.received_and_dropped()), rule }),
        active: verdicts_rx,
        checks: checks_rx,
        published: reconciler.publications(),
        reconciled: reconciler.status(),
        to_reconciler: src_tx.clone(),
        status,
        fleet,
    };
    tasks.spawn(Group::Work, "health", move |c| task.run(c));
    let (hup_tx, hup_rx) = mpsc::channel(1);
    let (tx, sh, st) = (src_tx.clone(), Arc::clone(shared), settings.clone());
    tasks.spawn(Group::Work, "xDS supervisor", move |c| follow(XDS, st, tx, sh, c));
    let (tx, sh) = (src_tx.clone(), Arc::clone(shared));
    tasks.spawn(Group::Work, "Kubernetes supervisor", move |c| follow(KUBE, settings, tx, sh, c));
    tasks.spawn(Group::Work, "file source", move |c| sources::file::run(config_path, initial, src_tx, hup_rx, c));
    tasks.spawn(Group::Work, "reconciler", move |c| reconciler.run(src_rx, neigh_rx, c));
    hup_tx
}

/// Runs until a stop is asked for (SIGINT, SIGTERM, `stop`), passing
/// SIGHUP on and reporting each task that ends meanwhile; returns why it
/// stops and how many tasks ended early.
async fn wait_for_stop(tasks: &mut Tasks, sig: &mut Signals, stop: &CancellationToken, hup: &mpsc::Sender<()>, shared: &Shared) -> (&'static str, usize) {
    let mut faults = 0usize;
    let why = loop {
        tokio::select! {
            _ = sig.int.recv() => break "SIGINT",
            _ = sig.term.recv() => break "SIGTERM",
            () = stop.cancelled() => break "asked",
            _ = sig.hup.recv() => { let _ = hup.try_send(()); }
            done = tasks.ended() => {
                faults += 1;
                report(shared, done);
            }
        }
    };
    (why, faults)
}

/// Steps 2 to 4 of [`Group`]'s order (`Work` is cancelled already), all by
/// one deadline; what has not stopped by then is abandoned.
async fn stop_in_order(tasks: Tasks, bird: &DriverHandle, wait: Duration, neighbours: &Neighbours, exception_ifaces: &[String]) {
    let stopping_at = tokio::time::Instant::now();
    watchdog(wait + STOP_BOUND);
    match tokio::time::timeout(WITHDRAW_TIMEOUT, bird.withdraw_all()).await {
        Ok(Ok(true)) => {
            info!(wait_ms = millis(wait), "every VIP withdrawn; waiting for the routers to take it");
            tokio::time::sleep(wait).await;
        }
        Ok(Ok(false)) => info!("nothing was announced: no VIP to withdraw"),
        Ok(Err(e)) => error!(error = %e, "could not withdraw the VIPs before stopping"),
        Err(_) => error!(timeout_ms = millis(WITHDRAW_TIMEOUT), "withdrawing the VIPs took too long; stopping anyway"),
    }
    let deadline = stopping_at + wait + STOP_CONTROL;
    let Tasks { admin: (admin_cancel, mut admin_tasks), rest: (rest_cancel, mut rest_tasks), .. } = tasks;
    admin_cancel.cancel();
    drain(&mut admin_tasks, deadline).await;
    rest_cancel.cancel();
    drain(&mut rest_tasks, deadline).await;
    // Next hops: the neighbour task stops where it is, and each exception
    // interface is taken down, one request each whatever the number of
    // entries: the kernel drops their neighbour entries and stops probing.
    // Deleting the entries one by one costs a request and an answer each,
    // while the kernel keeps probing the rest, so its time grows with the
    // number of next hops; taking the interface down does not. The
    // interfaces go with DPDK's ports right after.
    neighbours.stop();
    let take_down = async {
        let h = crate::routing::connect()?;
        for name in exception_ifaces {
            crate::routing::take_down(&h, name).await?;
        }
        Ok::<(), crate::routing::RoutingError>(())
    };
    match tokio::time::timeout_at(deadline.max(tokio::time::Instant::now() + CLEAR_AT_LEAST), take_down).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => error!(error = %e, "could not take the exception interfaces down; their neighbour entries go with them when DPDK closes them"),
        Err(_) => error!("taking the exception interfaces down did not finish in time; their neighbour entries go with them when DPDK closes them"),
    }
}

/// Longest time the withdrawal of every VIP may take when stopping.
const WITHDRAW_TIMEOUT: Duration = Duration::from_secs(2);
/// The control side has stopped this long after `bird.withdrawWaitMs`
/// (from the stop signal), whatever its tasks are doing.
const STOP_CONTROL: Duration = Duration::from_millis(3500);
/// Time taking the exception interfaces down gets even past the deadline.
const CLEAR_AT_LEAST: Duration = Duration::from_millis(250);
/// The process has ended this long after `bird.withdrawWaitMs` (from the
/// stop signal), however it gets there.
pub(super) const STOP_BOUND: Duration = Duration::from_secs(5);

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Waits for every task of `set` until `deadline`; aborts those left then.
async fn drain(set: &mut JoinSet<&'static str>, deadline: tokio::time::Instant) {
    loop {
        match tokio::time::timeout_at(deadline, set.join_next()).await {
            Ok(None) => return,
            Ok(Some(Err(e))) if !e.is_cancelled() => error!(error = %e, "control task failed while stopping"),
            Ok(Some(_)) => {}
            Err(_) => {
                error!(left = set.len(), "control tasks did not stop in time: abandoned");
                set.abort_all();
                return;
            }
        }
    }
}

/// The last resort of the stop's bound: if the process still runs `bound`
/// from now, it exits at once with status 1 (no cleanup: a stop that got
/// this far is stuck somewhere it cannot be got out of).
fn watchdog(bound: Duration) {
    let spawned = std::thread::Builder::new().name("sluice-stop-bound".into()).spawn(move || {
        std::thread::sleep(bound);
        error!(bound_ms = millis(bound), "stopping did not complete within bird.withdrawWaitMs + 5 s: exiting now");
        sluice_ffi::process::exit_now(1);
    });
    if let Err(e) = spawned {
        error!(error = %e, "cannot start the stop's watchdog");
    }
}

/// A source that follows one section of the accepted configuration: it
/// runs while the section is set, restarts when the section (or the
/// service defaults it maps with) changes, and its objects leave the
/// model when the section is removed. Nothing else withdraws them: a
/// source that loses its server keeps what it last sent.
struct Follower<C, S> {
    /// Its source name in the model.
    source: &'static str,
    /// The section of the configuration file.
    section: &'static str,
    /// The section in the accepted settings.
    settings: fn(&Settings) -> Option<C>,
    /// Where the admin endpoint finds its status channel.
    slot: fn(&Shared) -> &StatusSlot<S>,
    /// What it follows, for the log.
    describe: fn(&C) -> String,
    /// Runs it until its token is cancelled.
    run: RunSource<C, S>,
}

/// Runs a source: its settings, the service defaults, the channel to the
/// reconciler, the sending end of its status channel, and the token that
/// stops it.
type RunSource<C, S> = fn(C, Defaults, mpsc::Sender<SourceMsg>, watch::Sender<S>, CancellationToken) -> BoxFuture<'static, ()>;

/// The xDS source (`xds-control-plane`).
const XDS: Follower<xds::XdsConfig, XdsStatus> = Follower {
    source: xds::SOURCE,
    section: "xds-control-plane",
    settings: |s| s.xds.clone(),
    slot: |sh| &sh.xds,
    describe: |c| format!("the xDS management server {} ({:?})", c.server, c.mode),
    run: |c, d, tx, st, cancel| Box::pin(xds::run(c, d, tx, st, cancel)),
};

/// The Kubernetes source (`kubernetes`).
const KUBE: Follower<kube::KubeConfig, KubeStatus> = Follower {
    source: kube::SOURCE,
    section: "kubernetes",
    settings: |s| s.kube.clone(),
    slot: |sh| &sh.kube,
    describe: |c| format!("the Kubernetes Gateway {}/{}", c.namespace, c.gateway),
    run: |c, d, tx, st, cancel| Box::pin(kube::run(c, d, tx, st, cancel)),
};

/// Runs `f`'s source as the accepted configuration says, until `cancel`.
async fn follow<C, S>(f: Follower<C, S>, mut settings: watch::Receiver<Settings>, tx: mpsc::Sender<SourceMsg>, shared: Arc<Shared>, cancel: CancellationToken)
where
    C: Clone + PartialEq,
    S: Default,
{
    loop {
        let now = settings.borrow_and_update().clone();
        let current = (f.settings)(&now).map(|c| (c, now.defaults));
        let child = cancel.child_token();
        let running = current.clone().map(|(cfg, defaults)| {
            let (status, seen) = watch::channel(S::default());
            *lock((f.slot)(&shared)) = Some(seen);
            info!("following {}", (f.describe)(&cfg));
            tokio::spawn((f.run)(cfg, defaults, tx.clone(), status, child.clone()))
        });
        // Until this source's settings change (another section's do not restart it).
        let next = loop {
            tokio::select! {
                () = cancel.cancelled() => break None,
                r = settings.changed() => {
                    if r.is_err() {
                        break None;
                    }
                    let s = settings.borrow_and_update().clone();
                    let next = (f.settings)(&s).map(|c| (c, s.defaults));
                    if next != current {
                        break Some(next);
                    }
                }
            }
        };
        child.cancel();
        if let Some(t) = running {
            let _ = t.await;
        }
        let Some(next) = next else { return };
        if next.is_none() && current.is_some() {
            info!("{} removed from the configuration: its services leave the model", f.section);
            *lock((f.slot)(&shared)) = None;
            let msg = SourceMsg::Desired {
                source: f.source.to_owned(),
                desired: Desired::default(),
                trigger: format!("{} disabled", f.section),
                reply: None,
            };
            if tx.send(msg).await.is_err() {
                return;
            }
        }
    }
}

/// A control task ended before shutdown: say which and why.
fn report(shared: &Shared, done: Result<&'static str, tokio::task::JoinError>) {
    let why = match done {
        Ok(name) => format!("control task {name} ended unexpectedly"),
        Err(e) if e.is_panic() => format!("a control task panicked: {e}"),
        Err(e) => format!("a control task failed: {e}"),
    };
    error!(%why, "the workers keep forwarding with the last published snapshot");
    lock(&shared.state).faults.push(why);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::state::IdlePool;
    use crate::config::kubernetes::{AlgorithmConfiguration, DEFAULT_GATEWAY_CLASS};

    fn kube(gateway: &str) -> kube::KubeConfig {
        kube::KubeConfig {
            gateway: gateway.into(),
            namespace: "tenant-a".into(),
            kubeconfig: None,
            gateway_class: DEFAULT_GATEWAY_CLASS.into(),
            algorithm_configuration: AlgorithmConfiguration::Annotation,
            allow_algorithm_change: false,
        }
    }

    /// The Kubernetes follower, running a stand-in that says when it starts.
    const STAND_IN: Follower<kube::KubeConfig, KubeStatus> = Follower {
        run: |c, d, tx, _st, cancel| {
            Box::pin(async move {
                let trigger = format!("started {} limit {}", c.gateway, d.limit);
                let _ = tx.send(SourceMsg::Rejected { source: "stand-in".into(), problems: Vec::new(), trigger }).await;
                cancel.cancelled().await;
            })
        },
        ..KUBE
    };

    async fn next(rx: &mut mpsc::Receiver<SourceMsg>) -> String {
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
            Ok(Some(SourceMsg::Rejected { trigger, .. })) => trigger,
            Ok(Some(SourceMsg::Desired { source, desired, trigger, .. })) => {
                format!("{source}: {} services, {} routes ({trigger})", desired.services.len(), desired.routes.len())
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    async fn quiet(rx: &mut mpsc::Receiver<SourceMsg>) {
        if let Ok(m) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
            panic!("nothing expected, got {m:?}");
        }
    }

    #[tokio::test]
    async fn a_source_follows_its_own_section_only_and_leaves_when_it_is_removed() {
        let shared = Arc::new(Shared::new("t.yaml".into(), Vec::new(), Arc::new(IdlePool), Vec::new(), 1));
        let machine = "dpdk: {lcores: \"0,1\"}\nports:\n  - {name: front, device: net_null0, addresses: [10.0.0.1/24]}\n";
        let config = crate::config::parse_str(machine, std::path::Path::new("t.yaml")).unwrap();
        let (set, settings) = watch::channel(Settings::of(&config));
        let (tx, mut rx) = mpsc::channel(8);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(follow(STAND_IN, settings, tx, Arc::clone(&shared), cancel.clone()));
        quiet(&mut rx).await;
        assert!(lock(&shared.kube).is_none());

        let limit = Defaults::default().limit;
        set.send_modify(|s| s.kube = Some(kube("a")));
        assert_eq!(next(&mut rx).await, format!("started a limit {limit}"));
        assert!(lock(&shared.kube).is_some(), "its status is shown while it runs");

        // Another source's section changing does not restart it.
        let xds = xds::XdsConfig {
            server: "127.0.0.1:18000".parse().unwrap(),
            tls: None,
            node_id: "n".into(),
            node_cluster: "c".into(),
            mode: xds::Mode::Sotw,
        };
        set.send_modify(|s| s.xds = Some(xds));
        quiet(&mut rx).await;

        // Its section or the defaults it maps with changing restarts it.
        set.send_modify(|s| s.kube = Some(kube("b")));
        assert_eq!(next(&mut rx).await, format!("started b limit {limit}"));
        set.send_modify(|s| s.defaults.limit = 64);
        assert_eq!(next(&mut rx).await, "started b limit 64");

        // Removed: its objects leave the model, its status goes.
        set.send_modify(|s| s.kube = None);
        assert_eq!(next(&mut rx).await, "kubernetes: 0 services, 0 routes (kubernetes disabled)");
        assert!(lock(&shared.kube).is_none());
        quiet(&mut rx).await;

        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
    }
}

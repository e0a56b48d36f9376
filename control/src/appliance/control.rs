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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sluice_dataplane::addr::Addr;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

use super::loss::LossSampler;
use crate::admin::state::{lock, Shared};
use crate::admin::{self, health, AdminCounters, Limits};
use crate::model::Desired;
use crate::reconcile::{Reconciler, Settings};
use crate::routing::Neighbours;
use crate::sources::xds::{self, XdsStatus};
use crate::sources::{self, FileState, SourceMsg};

/// What the control runtime needs.
#[derive(Debug)]
pub struct Parts {
    /// Shared with the admin endpoint.
    pub shared: Arc<Shared>,
    /// Owner of the model and the publisher (already started).
    pub reconciler: Reconciler,
    /// The next hops the reconciler wants resolved.
    pub hops: watch::Receiver<Vec<(u8, Addr)>>,
    /// The accepted file's settings (the xDS source follows them).
    pub settings: watch::Receiver<Settings>,
    /// The configuration file.
    pub config_path: PathBuf,
    /// Its state at start.
    pub initial: FileState,
    /// Admin address and limits.
    pub admin: (SocketAddr, Limits),
    /// Kernel interface of each port ("" for none).
    pub ifaces: Vec<String>,
    /// Loss accounting below DPDK.
    pub loss: LossSampler,
}

/// Runs until SIGINT or SIGTERM (or `stop` is cancelled), then shuts the
/// control side down in order.
pub async fn run(p: Parts, stop: CancellationToken) -> Result<()> {
    let Parts { shared, reconciler, mut hops, settings, config_path, initial, admin: (admin_addr, limits), ifaces, mut loss } = p;
    let listener = admin::bind(admin_addr)
        .await
        .with_context(|| format!("cannot listen on {admin_addr} for the admin endpoint (admin.listen)"))?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing signal handlers")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing signal handlers")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing signal handlers")?;

    let admin_cancel = CancellationToken::new();
    let rest_cancel = CancellationToken::new();
    let mut tasks: JoinSet<&'static str> = JoinSet::new();
    let mut admin_tasks: JoinSet<&'static str> = JoinSet::new();

    let counters = Arc::new(AdminCounters::default());
    {
        let (sh, c) = (Arc::clone(&shared), admin_cancel.clone());
        admin_tasks.spawn(async move {
            admin::serve(listener, sh, limits, counters, c).await;
            "admin endpoint"
        });
    }
    {
        let (sh, c) = (Arc::clone(&shared), admin_cancel.clone());
        admin_tasks.spawn(async move {
            let mut t = tokio::time::interval(health::SAMPLE_EVERY);
            loop {
                tokio::select! {
                    () = c.cancelled() => return "health sampler",
                    _ = t.tick() => health::sample(&sh, Instant::now()),
                }
            }
        });
    }
    {
        let c = admin_cancel.clone();
        admin_tasks.spawn(async move {
            let mut t = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    () = c.cancelled() => return "loss sampler",
                    _ = t.tick() => loss.sample().await,
                }
            }
        });
    }

    let (neighbours, neigh_rx) = Neighbours::spawn(ifaces).context("starting the neighbour task")?;
    let neighbours = Arc::new(neighbours);
    {
        let (nb, c) = (Arc::clone(&neighbours), rest_cancel.clone());
        nb.want(hops.borrow_and_update().clone());
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    () = c.cancelled() => return "next-hop follower",
                    r = hops.changed() => match r {
                        Ok(()) => nb.want(hops.borrow_and_update().clone()),
                        Err(_) => return "next-hop follower",
                    },
                }
            }
        });
    }

    let (src_tx, src_rx) = mpsc::channel(16);
    let (hup_tx, hup_rx) = mpsc::channel(1);
    {
        let (c, tx, sh) = (rest_cancel.clone(), src_tx.clone(), Arc::clone(&shared));
        tasks.spawn(async move {
            follow_xds(settings, tx, sh, c).await;
            "xDS supervisor"
        });
    }
    {
        let c = rest_cancel.clone();
        tasks.spawn(async move {
            sources::file::run(config_path, initial, src_tx, hup_rx, c).await;
            "file source"
        });
    }
    {
        let c = rest_cancel.clone();
        tasks.spawn(async move {
            reconciler.run(src_rx, neigh_rx, c).await;
            "reconciler"
        });
    }
    info!("running; SIGHUP or editing the configuration reloads it, SIGINT or SIGTERM stops");

    let mut faults = 0usize;
    loop {
        tokio::select! {
            _ = sigint.recv() => { info!("SIGINT: stopping"); break; }
            _ = sigterm.recv() => { info!("SIGTERM: stopping"); break; }
            () = stop.cancelled() => break,
            _ = sighup.recv() => { let _ = hup_tx.try_send(()); }
            Some(done) = tasks.join_next() => {
                faults += 1;
                report(&shared, done);
            }
            Some(done) = admin_tasks.join_next() => {
                faults += 1;
                report(&shared, done);
            }
        }
    }

    // Ordered shutdown of the control side: admin first, then the rest.
    admin_cancel.cancel();
    while let Some(done) = admin_tasks.join_next().await {
        if let Err(e) = done {
            error!(error = %e, "control task failed while stopping");
        }
    }
    rest_cancel.cancel();
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done {
            error!(error = %e, "control task failed while stopping");
        }
    }
    if let Err(e) = neighbours.clear().await {
        error!(error = %e, "could not remove the neighbour entries Sluice asked the kernel for");
    }
    if faults > 0 {
        error!(faults, "control tasks ended early during this run");
    }
    Ok(())
}

/// Runs the xDS source while the accepted configuration enables it, and
/// restarts it when its settings (server, TLS, node, mode, or the service
/// defaults it maps with) change. When xDS is turned off, its objects are
/// withdrawn from the model.
async fn follow_xds(mut settings: watch::Receiver<Settings>, tx: mpsc::Sender<SourceMsg>, shared: Arc<Shared>, cancel: CancellationToken) {
    loop {
        let now = settings.borrow_and_update().clone();
        let child = cancel.child_token();
        let running = match now.xds.clone() {
            Some(cfg) => {
                let status = Arc::new(Mutex::new(XdsStatus::default()));
                *lock(&shared.xds) = Some(Arc::clone(&status));
                info!(server = %cfg.server, mode = ?cfg.mode, "following the xDS management server");
                Some(tokio::spawn(xds::run(cfg, now.defaults, tx.clone(), status, child.clone())))
            }
            None => None,
        };
        tokio::select! {
            () = cancel.cancelled() => {
                if let Some(t) = running { let _ = t.await; }
                return;
            }
            r = settings.changed() => {
                child.cancel();
                if let Some(t) = running { let _ = t.await; }
                if r.is_err() {
                    return;
                }
                let next = settings.borrow().clone();
                if next.xds.is_none() && now.xds.is_some() {
                    info!("xDS turned off: its services leave the model");
                    *lock(&shared.xds) = None;
                    let msg = SourceMsg::Desired {
                        source: xds::SOURCE.to_owned(),
                        desired: Desired::default(),
                        trigger: "xds-control-plane disabled".into(),
                        reply: None,
                    };
                    if tx.send(msg).await.is_err() {
                        return;
                    }
                }
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

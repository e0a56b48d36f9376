//! Leader election over a `coordination.k8s.io/v1` Lease, so that of
//! several controller replicas one writes (kube 4.2 has no leader
//! election of its own).
//!
//! Every `retry` the candidate reads the Lease: it creates it when there
//! is none; renews it when it holds it; takes it over when the holder has
//! not renewed it for `duration` as this candidate observed it (its own
//! clock, never the holder's timestamps: clocks need not agree). Every
//! write carries the resourceVersion read, so of two candidates racing
//! for one Lease the API server lets one through and refuses the other
//! (409). A leader that could not renew for `renew_deadline` (less than
//! `duration`) stops being leader before anyone may take over; on stop it
//! releases the Lease (an empty holder) so a successor need not wait.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// How a candidate takes part.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// The Lease's namespace.
    pub(crate) namespace: String,
    /// Its name.
    pub(crate) name: String,
    /// This candidate (unique among the replicas: pod name and pid).
    pub(crate) identity: String,
    /// How long a Lease not renewed stays its holder's.
    pub duration: Duration,
    /// How long a leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// How often the Lease is read and renewed.
    pub retry: Duration,
}

impl LeaseConfig {
    /// client-go's defaults: 15 s, 10 s, 2 s.
    pub fn new(namespace: String, name: String, identity: String) -> LeaseConfig {
        LeaseConfig { namespace, name, identity, duration: Duration::from_secs(15), renew_deadline: Duration::from_secs(10), retry: Duration::from_secs(2) }
    }
}

/// What was last seen of another holder, and when this candidate saw it change.
#[derive(Debug)]
struct Observed {
    record: (Option<String>, Option<String>, Option<String>),
    since: Instant,
}

fn record(l: &Lease) -> (Option<String>, Option<String>, Option<String>) {
    let s = l.spec.as_ref();
    (
        s.and_then(|s| s.holder_identity.clone()),
        s.and_then(|s| s.renew_time.as_ref()).map(|t| t.0.to_string()),
        l.metadata.resource_version.clone(),
    )
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// Takes part in the election until `cancel`; `leader` says whether this
/// candidate leads. Releases the Lease on the way out if it held it.
pub(crate) async fn run(client: Client, cfg: LeaseConfig, leader: watch::Sender<bool>, cancel: CancellationToken) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut observed: Option<Observed> = None;
    let mut renewed: Option<Instant> = None;
    let mut tick = tokio::time::interval(cfg.retry);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        let ok = try_once(&api, &cfg, &mut observed).await;
        if ok {
            renewed = Some(Instant::now());
        }
        let leads = renewed.is_some_and(|t| t.elapsed() < cfg.renew_deadline);
        if leads != *leader.borrow() {
            if leads {
                info!(lease = %cfg.name, identity = %cfg.identity, "leading: this controller writes");
            } else {
                warn!(lease = %cfg.name, identity = %cfg.identity, "not leading any more: writes stop");
            }
            leader.send_replace(leads);
        }
        if !ok && renewed.is_some_and(|t| t.elapsed() >= cfg.renew_deadline) {
            renewed = None;
        }
    }
    if *leader.borrow() {
        leader.send_replace(false);
        release(&api, &cfg).await;
    }
}

/// One read and, when it may, one write: true when this candidate holds
/// the Lease afterwards.
async fn try_once(api: &Api<Lease>, cfg: &LeaseConfig, observed: &mut Option<Observed>) -> bool {
    let current = match api.get_opt(&cfg.name).await {
        Ok(c) => c,
        Err(e) => {
            warn!(lease = %cfg.name, error = %e, "reading the Lease failed");
            return false;
        }
    };
    let Some(mut lease) = current else {
        let lease = Lease {
            metadata: ObjectMeta { name: Some(cfg.name.clone()), namespace: Some(cfg.namespace.clone()), ..ObjectMeta::default() },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(secs(cfg.duration)),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..LeaseSpec::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => true,
            Err(e) => {
                info!(lease = %cfg.name, error = %e, "creating the Lease failed (another candidate was first?)");
                false
            }
        };
    };
    let rec = record(&lease);
    let mine = rec.0.as_deref() == Some(cfg.identity.as_str());
    let free = rec.0.as_deref().is_none_or(str::is_empty);
    if !mine && !free {
        match observed {
            Some(o) if o.record == rec => {
                if o.since.elapsed() < cfg.duration {
                    return false; // its holder renews it, or may still
                }
            }
            _ => {
                *observed = Some(Observed { record: rec, since: Instant::now() });
                return false;
            }
        }
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if !mine {
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        spec.acquire_time = Some(now());
        spec.holder_identity = Some(cfg.identity.clone());
    }
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(secs(cfg.duration));
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => {
            *observed = None;
            true
        }
        Err(e) => {
            info!(lease = %cfg.name, error = %e, "writing the Lease failed");
            false
        }
    }
}

/// Gives the Lease up (an empty holder), when this candidate still holds it.
async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
    let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await else { return };
    let Some(spec) = lease.spec.as_mut() else { return };
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.renew_time = Some(now());
    spec.lease_duration_seconds = Some(1);
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => info!(lease = %cfg.name, "Lease released"),
        Err(e) => warn!(lease = %cfg.name, error = %e, "releasing the Lease failed"),
    }
}

//! Health: the endpoints' TCP handshakes, as the workers see them (passive
//! health, here), and the active checks ([`active`]) take an endpoint that
//! stops answering out of new flows, and put it back (its pinned flows stay
//! on it throughout: it drains). An endpoint is out when either says so;
//! one a control plane marks unhealthy is out whatever they say.
//!
//! - **What is measured.** Every SYN a worker sends to an endpoint and the
//!   answer that comes back on the return path meet in the workers' shared
//!   [`Handshakes`] table. This task sweeps it every [`TICK`]: a SYN-ACK is
//!   a success (its time from the SYN is kept); an RST (nothing listens on
//!   the port), a SYN the client sent again before any answer, and a SYN
//!   unanswered for [`UNANSWERED_AFTER`] are failures.
//! - **Coverage.** Only the answers that come back through this appliance
//!   are seen: a service whose endpoints answered nothing through it in the
//!   last [`COVERAGE`] (its return path goes elsewhere) is not judged, nor
//!   is a SYN unanswered or sent again while this appliance dropped
//!   received frames, then or within [`UNANSWERED_AFTER`] before (a
//!   saturated port or worker loses answers too). Both are counted
//!   (`discounted`).
//! - **Decision, with hysteresis.** [`FALL`] failures in a row (no success
//!   between) take an endpoint out for [`EJECTION`] (`health.fall` and
//!   `health.ejectionSeconds` set them); each time again before
//!   [`FORGIVE`] without a failure doubles that, up to [`MAX_EJECTION`] or
//!   ten times the first, whichever is longer. When its time is up it is
//!   back in new flows, and judged again from what follows (a dead
//!   endpoint is out again after [`FALL`] more failures). This is Envoy's outlier detection
//!   (`consecutive_gateway_failure`, `base_ejection_time`) on handshakes.
//! - **Limits.** The task says which endpoints it wants out; the
//!   reconciler applies it like any other change (a new table per change)
//!   and never takes out more than half of a service's endpoints, nor its
//!   last ready one: an endpoint it keeps is reported `held`.
//! - **Status** on its own channel ([`admin_api::health::Health`]), from the
//!   handshakes seen and what the reconciler applied.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_admin_api::health::{EndpointHealth, Health};
use sluice_dataplane::handshake::{Answer, Handshakes, Outcome};
use sluice_dataplane::snapshot::Snapshot;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::reconcile::{Published, ReconcilerStatus};
use crate::sources::SourceMsg;

pub(crate) mod active;
mod probe;
mod syn;

/// How often the table is swept and decisions made.
pub(crate) const TICK: Duration = Duration::from_millis(100);
/// A SYN with no answer for this long is unanswered (Linux clients send it
/// again after 1 s, which counts as a failure before).
pub(crate) const UNANSWERED_AFTER: Duration = Duration::from_secs(2);
/// Failures in a row that take an endpoint out (the default of `health.fall`).
pub(crate) const FALL: u32 = 5;
/// The first time out (the default of `health.ejectionSeconds`).
pub(crate) const EJECTION: Duration = Duration::from_secs(30);
/// The longest.
pub(crate) const MAX_EJECTION: Duration = Duration::from_secs(300);
/// Without a failure for this long, past time outs are forgotten.
pub(crate) const FORGIVE: Duration = Duration::from_secs(600);
/// A service is judged while its endpoints' answers came back through this
/// appliance this recently.
pub(crate) const COVERAGE: Duration = Duration::from_secs(60);
/// Handshake times kept per endpoint for its median.
const RECENT: usize = 64;
/// Slots of the workers' handshake table (32 bytes each): far more than
/// the handshakes in flight at once (connections per second times the
/// handshake's time).
pub(crate) const TABLE_SLOTS: usize = 1 << 16;

/// One endpoint's record, by service key, identifier and incarnation.
#[derive(Debug, Default)]
struct Record {
    succeeded: u64,
    reset: u64,
    retransmitted: u64,
    unanswered: u64,
    in_a_row: u32,
    ejections: u32,
    out_until: Option<Instant>,
    last_failure: Option<Instant>,
    recent: VecDeque<u32>,
}

type Key = (u32, u16, u16);

/// When an endpoint goes out, and for how long.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rule {
    fall: u32,
    ejection: Duration,
    max_ejection: Duration,
}

impl Rule {
    /// The rule of the `health:` section.
    pub(crate) fn of(cfg: &crate::config::PassiveHealthConfig) -> Rule {
        let ejection = Duration::from_secs(u64::from(cfg.ejection_secs));
        Rule { fall: cfg.fall.max(1), ejection, max_ejection: MAX_EJECTION.max(ejection * 10) }
    }
}

impl Default for Rule {
    fn default() -> Self {
        Rule { fall: FALL, ejection: EJECTION, max_ejection: MAX_EJECTION }
    }
}

/// What the handshakes say (the decisions, without the task around them).
#[derive(Debug, Default)]
pub(crate) struct Passive {
    rule: Rule,
    records: HashMap<Key, Record>,
    /// Per service key, when an answer last came back through here.
    answered: HashMap<u32, Instant>,
    outcomes: u64,
    sweeps: u64,
    discounted: u64,
}

impl Passive {
    /// Takes the outcomes of one sweep; `dropped`: when this appliance last
    /// saw received frames dropped.
    pub(crate) fn take(&mut self, outcomes: &[Outcome], dropped: Option<Instant>, now: Instant) {
        let dropping = dropped.is_some_and(|t| now.duration_since(t) <= UNANSWERED_AFTER + TICK);
        self.sweeps += 1;
        self.outcomes += outcomes.len() as u64;
        for o in outcomes.iter().filter(|o| matches!(o.answer, Answer::SynAck | Answer::Reset)) {
            self.answered.insert(o.service, now);
        }
        for o in outcomes {
            let covered = self.answered.get(&o.service).is_some_and(|&t| now.duration_since(t) <= COVERAGE);
            let lost_here = dropping && matches!(o.answer, Answer::Unanswered | Answer::Retransmitted);
            if !covered || lost_here {
                self.discounted += 1;
                continue;
            }
            let r = self.records.entry((o.service, o.endpoint, o.incarnation)).or_default();
            match o.answer {
                Answer::SynAck => {
                    r.succeeded += 1;
                    r.in_a_row = 0;
                    if r.recent.len() == RECENT {
                        r.recent.pop_front();
                    }
                    r.recent.push_back(o.micros);
                    continue;
                }
                Answer::Reset => r.reset += 1,
                Answer::Retransmitted => r.retransmitted += 1,
                Answer::Unanswered => r.unanswered += 1,
            }
            r.last_failure = Some(now);
            if r.out_until.is_some() {
                // Handshakes begun before it went out: already judged.
                continue;
            }
            r.in_a_row += 1;
            if r.in_a_row >= self.rule.fall {
                let time = self.rule.ejection.saturating_mul(1 << r.ejections.min(8)).min(self.rule.max_ejection);
                r.ejections += 1;
                r.out_until = Some(now + time);
                r.in_a_row = 0;
                warn!(service = o.service, endpoint = o.endpoint, seconds = time.as_secs(), fall = self.rule.fall, "passive health: endpoint failed `fall` handshakes in a row, out of new flows");
            }
        }
    }

    /// Ends the time outs that are up, forgets what `snap` no longer has
    /// (an endpoint that left, or came back as another incarnation) and
    /// returns the endpoints wanted out, by service name and identifier.
    pub(crate) fn wanted(&mut self, snap: &Snapshot, now: Instant) -> BTreeMap<String, BTreeSet<u32>> {
        self.records.retain(|&(service, id, inc), _| {
            snap.service_by_key(service).and_then(|s| s.endpoint(id)).is_some_and(|e| e.incarnation & 0xffff == u32::from(inc))
        });
        self.answered.retain(|_, t| now.duration_since(*t) <= COVERAGE);
        let mut out: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        for (&(service, id, _), r) in &mut self.records {
            if r.out_until.is_some_and(|t| now >= t) {
                r.out_until = None;
                r.in_a_row = 0;
                info!(service, endpoint = id, "passive health: endpoint back in new flows");
            }
            if r.last_failure.is_some_and(|t| now.duration_since(t) >= FORGIVE) {
                r.ejections = 0;
            }
            if r.out_until.is_some() {
                if let Some(s) = snap.service_by_key(service) {
                    out.entry(s.name.clone()).or_default().insert(u32::from(id));
                }
            }
        }
        out
    }

    /// The status: every endpoint seen, `held` being what the reconciler
    /// took out.
    pub(crate) fn status(&self, snap: &Snapshot, held: &BTreeMap<String, BTreeSet<u32>>, now: Instant) -> Health {
        let mut endpoints: Vec<EndpointHealth> = self
            .records
            .iter()
            .filter_map(|(&(service, id, _), r)| {
                let s = snap.service_by_key(service)?;
                let e = s.endpoint(id)?;
                let state = match r.out_until {
                    None => "healthy",
                    Some(_) if held.get(&s.name).is_some_and(|a| a.contains(&u32::from(id))) => "held",
                    Some(_) => "ejected",
                };
                let (median, p90) = quantiles(&r.recent);
                Some(EndpointHealth {
                    service: s.name.clone(),
                    id: u32::from(id),
                    address: e.addr.to_string(),
                    state: state.to_owned(),
                    succeeded: r.succeeded,
                    reset: r.reset,
                    retransmitted: r.retransmitted,
                    unanswered: r.unanswered,
                    failures_in_a_row: r.in_a_row,
                    ejections: r.ejections,
                    back_in_seconds: r.out_until.map(|t| t.saturating_duration_since(now).as_secs_f64()),
                    handshake_median_us: median,
                    handshake_p90_us: p90,
                })
            })
            .collect();
        endpoints.sort_by(|a, b| (&a.service, a.id).cmp(&(&b.service, b.id)));
        let mut covered: Vec<String> = self.answered.keys().filter_map(|&k| snap.service_by_key(k).map(|s| s.name.clone())).collect();
        covered.sort();
        Health {
            passive: true,
            checks: sluice_admin_api::health::Checks::default(),
            fall: self.rule.fall,
            ejection_seconds: self.rule.ejection.as_secs_f64(),
            max_ejection_seconds: self.rule.max_ejection.as_secs_f64(),
            forgive_seconds: FORGIVE.as_secs_f64(),
            unanswered_after_ms: u64::try_from(UNANSWERED_AFTER.as_millis()).unwrap_or(u64::MAX),
            outcomes: self.outcomes,
            sweeps: self.sweeps,
            discounted: self.discounted,
            covered_services: covered,
            endpoints,
        }
    }
}

/// The median and 90th percentile of `recent` (none when empty).
fn quantiles(recent: &VecDeque<u32>) -> (Option<u32>, Option<u32>) {
    if recent.is_empty() {
        return (None, None);
    }
    let mut v: Vec<u32> = recent.iter().copied().collect();
    v.sort_unstable();
    let at = |q: usize| v[(v.len() - 1) * q / 100];
    (Some(at(50)), Some(at(90)))
}

/// Passive health's inputs: the workers' table, the received packets
/// dropped so far (ports' misses and empty pools: a rise means answers may
/// have been lost here), and the rule.
pub(crate) struct PassiveInput {
    pub(crate) table: Arc<Handshakes>,
    pub(crate) drops: Box<dyn Fn() -> u64 + Send>,
    pub(crate) rule: Rule,
}

/// The health task, built; [`HealthTask::run`] runs it.
pub(crate) struct HealthTask {
    /// Passive health, when on.
    pub(crate) passive: Option<PassiveInput>,
    /// What the active checks say, and their status.
    pub(crate) active: watch::Receiver<active::Verdicts>,
    pub(crate) checks: watch::Receiver<sluice_admin_api::health::Checks>,
    pub(crate) published: watch::Receiver<Published>,
    pub(crate) reconciled: watch::Receiver<ReconcilerStatus>,
    pub(crate) to_reconciler: mpsc::Sender<SourceMsg>,
    pub(crate) status: watch::Sender<Option<Health>>,
    /// With siblings: where this appliance's verdicts go, and the
    /// siblings' verdicts, laid over its own.
    pub(crate) fleet: Option<Fleet>,
}

/// The health verdicts shared with the siblings (the sync task's side:
/// [`crate::sync::verdicts`]).
#[derive(Debug)]
pub(crate) struct Fleet {
    /// The endpoints this appliance's own health wants out.
    pub(crate) own: watch::Sender<crate::sync::verdicts::Ejected>,
    /// The endpoints the siblings' health wants out (those this appliance has).
    pub(crate) siblings: watch::Receiver<crate::sync::verdicts::Ejected>,
}

impl HealthTask {
    /// Every [`TICK`] until `cancel`: sweeps the handshakes (passive
    /// health on), lays the active checks' verdicts over passive health's,
    /// sends the endpoints wanted out to the reconciler when they change,
    /// and reports.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let HealthTask { passive: input, active, mut checks, published, reconciled, to_reconciler, status, fleet } = self;
        let on = input.is_some();
        let (table, drops, rule) = match input {
            Some(i) => (Some(i.table), Some(i.drops), i.rule),
            None => (None, None, Rule::default()),
        };
        let mut passive = Passive { rule, ..Passive::default() };
        let mut sent: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        let (mut last_drops, mut dropped_at) = (drops.as_ref().map_or(0, |d| d()), None);
        let mut outcomes = Vec::new();
        let bound = u32::try_from(UNANSWERED_AFTER.as_micros()).unwrap_or(u32::MAX);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            if let (Some(table), Some(drops)) = (&table, &drops) {
                outcomes.clear();
                table.sweep(bound, &mut outcomes);
                let d = drops();
                if d != last_drops {
                    dropped_at = Some(now);
                    last_drops = d;
                }
                passive.take(&outcomes, dropped_at, now);
            }
            let snap = Arc::clone(&published.borrow().snapshot);
            let mut wanted = passive.wanted(&snap, now);
            for (service, ids) in &active.borrow().down {
                wanted.entry(service.clone()).or_default().extend(ids);
            }
            // This appliance's verdicts go to the siblings; theirs are
            // applied here as well (the limit then gives every appliance
            // the same table).
            if let Some(f) = &fleet {
                f.own.send_if_modified(|old| if *old == wanted { false } else { old.clone_from(&wanted); true });
                for (service, ids) in f.siblings.borrow().iter() {
                    wanted.entry(service.clone()).or_default().extend(ids);
                }
            }
            if wanted != sent {
                let msg = SourceMsg::Health { ejected: wanted.clone(), trigger: "health".to_owned() };
                if to_reconciler.send(msg).await.is_err() {
                    return;
                }
                sent = wanted;
            }
            // Kept in by the limit (an endpoint its source drains already,
            // or one not applied yet, is not).
            let held = reconciled.borrow().health.held.clone();
            let mut next = passive.status(&snap, &held, now);
            next.passive = on;
            // The checks' status is made by their task every so often
            // (`active::status_due`):
            // copied when it changed, else moved from the last status.
            let fresh = checks.has_changed().unwrap_or(false);
            status.send_modify(|h| {
                next.checks = match (fresh, h.take()) {
                    (false, Some(old)) => old.checks,
                    _ => checks.borrow_and_update().clone(),
                };
                // Of the endpoints the checks say are down, those the
                // limit keeps in are held.
                let eps = &mut next.checks.endpoints;
                for (service, ids) in &active.borrow().down {
                    for &id in ids {
                        if let Ok(i) = eps.binary_search_by(|e| (e.service.as_str(), e.id).cmp(&(service.as_str(), id))) {
                            let kept = held.get(service).is_some_and(|a| a.contains(&id));
                            eps[i].state = if kept { "held" } else { "down" }.to_owned();
                        }
                    }
                }
                *h = Some(next);
            });
        }
    }
}

#[cfg(test)]
mod tests;

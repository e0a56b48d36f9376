//! Active checks: each endpoint of a service with a check is checked every
//! interval ([`super::probe`]); `fall` failures in a row take it out of
//! new flows (it drains: its pinned flows stay), `rise` successes in a row
//! bring it back. An endpoint starts up: a new check, a restart or a new
//! endpoint drains nothing until it has failed `fall` times.
//!
//! - **Bounded.** One task runs every check (no thread or task per
//!   endpoint); at most [`Active::max_in_flight`] run at once, the others
//!   wait (counted `late` when they start more than a tenth of their
//!   interval after they were due).
//! - **Spread and jittered.** An endpoint's first check comes at a point of
//!   the interval given by its service, identifier and address, so that a
//!   service's endpoints (and thousands of services) are not checked all at
//!   once; each next one an interval later, ±10 %. Checks due within
//!   [`BATCH`] of each other start together.
//! - **Followed.** The endpoints checked are those of the published
//!   snapshot, by (service, identifier): another address, incarnation or
//!   check starts the record afresh; an endpoint that leaves is forgotten.
//!
//! The verdicts (which endpoints are down) go to the health task, which
//! lays them over passive health's and sends both to the reconciler.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_admin_api::health::{CheckedEndpoint, Checks};
use sluice_core::model::{CheckDef, CheckTarget, Probe};
use sluice_dataplane::snapshot::Snapshot;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::syn::{Inline, Prober};
use crate::reconcile::Published;

/// What the active checks say, for the health task.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Verdicts {
    /// Endpoints down, by service name and identifier.
    pub(crate) down: BTreeMap<String, BTreeSet<u32>>,
}

type Key = (Arc<str>, u32);

/// One checked endpoint.
#[derive(Debug)]
struct Target {
    addr: IpAddr,
    /// For a check of the VIP: the lowest VIP routed to the service of the
    /// endpoint's family (`None`: there is none, and the check fails saying so).
    vip: Option<IpAddr>,
    incarnation: u32,
    check: Arc<CheckDef>,
    /// Changes whenever the record starts afresh: a result or a due time
    /// of another epoch is stale.
    epoch: u64,
    due: Instant,
    running: bool,
    /// The running check's task, aborted when the record is replaced or
    /// forgotten (so that checks left behind hold no socket beyond the
    /// limit).
    task: Option<tokio::task::AbortHandle>,
    up: bool,
    checks: u64,
    failures: u64,
    ok_in_a_row: u32,
    failed_in_a_row: u32,
    last: Option<Duration>,
    last_error: Option<String>,
    /// Checks of this record so far, and its own number: its jitter.
    round: u64,
    seed: u64,
}

/// A check to start.
#[derive(Debug)]
pub(crate) struct Due {
    key: Key,
    epoch: u64,
    check: Arc<CheckDef>,
    /// The endpoint's address.
    addr: IpAddr,
    /// The VIP checked through it, for a check of the VIP.
    vip: Option<IpAddr>,
}

/// The checks' state, without the task around it.
#[derive(Debug)]
pub(crate) struct Active {
    targets: HashMap<Key, Target>,
    queue: Calendar,
    epochs: u64,
    /// The most checks running at once.
    pub(crate) max_in_flight: usize,
    in_flight: usize,
    run: u64,
    failed: u64,
    late: u64,
}

/// The checks to start, by slot of [`BATCH`] since `origin`, rounded up
/// (a check never starts before it is due): the checks of a slot start
/// together, after one wake-up, and its list is read in one go where a heap
/// of thousands of checks would cost a cache miss a level.
#[derive(Debug)]
struct Calendar {
    origin: Instant,
    slots: BTreeMap<u64, Vec<(u64, Key)>>,
    len: usize,
}

impl Calendar {
    fn new(origin: Instant) -> Calendar {
        Calendar { origin, slots: BTreeMap::new(), len: 0 }
    }

    fn slot(&self, t: Instant) -> u64 {
        let nanos = t.saturating_duration_since(self.origin).as_nanos().div_ceil(BATCH.as_nanos());
        u64::try_from(nanos).unwrap_or(u64::MAX)
    }

    fn at(&self, slot: u64) -> Instant {
        let nanos = u64::try_from(BATCH.as_nanos()).unwrap_or(u64::MAX);
        self.origin + Duration::from_nanos(slot.saturating_mul(nanos))
    }

    fn push(&mut self, due: Instant, epoch: u64, key: Key) {
        self.slots.entry(self.slot(due)).or_default().push((epoch, key));
        self.len += 1;
    }

    /// The first point of the grid after `now`.
    fn tick_after(&self, now: Instant) -> Instant {
        let n = now.saturating_duration_since(self.origin).as_nanos() / BATCH.as_nanos() + 1;
        self.at(u64::try_from(n).unwrap_or(u64::MAX))
    }

    /// When the first slot's checks are due.
    fn next(&self) -> Option<Instant> {
        self.slots.keys().next().map(|s| self.at(*s))
    }

    /// A check of the first slot, if it is due at `now`.
    fn pop(&mut self, now: Instant) -> Option<(u64, Key)> {
        let at = self.at(*self.slots.keys().next()?);
        if at > now {
            return None;
        }
        let mut first = self.slots.first_entry()?;
        let item = first.get_mut().pop();
        if first.get().is_empty() {
            first.remove();
        }
        self.len -= usize::from(item.is_some());
        item
    }

    fn retain(&mut self, mut keep: impl FnMut(u64, &Key) -> bool) {
        for list in self.slots.values_mut() {
            list.retain(|(epoch, k)| keep(*epoch, k));
        }
        self.slots.retain(|_, l| !l.is_empty());
        self.len = self.slots.values().map(Vec::len).sum();
    }

    fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A number from `what`, the same for the same input.
fn hash<T: Hash>(what: T) -> u64 {
    let mut h = DefaultHasher::new();
    what.hash(&mut h);
    h.finish()
}

/// A number in 0..1 from `x`, spread (SplitMix64's finalizer).
fn unit(x: u64) -> f64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

impl Active {
    /// No endpoint yet; at most `max_in_flight` checks at once.
    pub(crate) fn new(max_in_flight: usize) -> Active {
        Active { targets: HashMap::new(), queue: Calendar::new(Instant::now()), epochs: 0, max_in_flight: max_in_flight.max(1), in_flight: 0, run: 0, failed: 0, late: 0 }
    }

    /// Follows `snap`: every endpoint of a service `checks` names is
    /// checked; the others are forgotten.
    pub(crate) fn follow(&mut self, snap: &Snapshot, checks: &BTreeMap<String, Arc<CheckDef>>, now: Instant) {
        let mut seen: HashMap<Key, ()> = HashMap::with_capacity(self.targets.len());
        for (name, check) in checks {
            let Ok(i) = snap.services.binary_search_by(|s| s.name.as_str().cmp(name)) else { continue };
            let service = &snap.services[i];
            let shared: Arc<str> = Arc::from(name.as_str());
            let vips: Vec<IpAddr> = if check.target == CheckTarget::Vip { snap.vips_of(i).map(|v| v.to_ip()).collect() } else { Vec::new() };
            for e in service.endpoints() {
                let key: Key = (Arc::clone(&shared), u32::from(e.id));
                let addr = e.addr.to_ip();
                let vip = vips.iter().filter(|v| v.is_ipv4() == addr.is_ipv4()).min().copied();
                seen.insert(key.clone(), ());
                let same = self.targets.get(&key).is_some_and(|t| t.addr == addr && t.vip == vip && t.incarnation == e.incarnation && *t.check == **check);
                if same {
                    continue;
                }
                self.epochs += 1;
                let interval = Duration::from_millis(u64::from(check.interval_ms));
                let seed = hash((name, e.id, addr));
                let due = now + interval.mul_f64(unit(seed));
                self.queue.push(due, self.epochs, key.clone());
                let t = Target {
                    addr,
                    vip,
                    incarnation: e.incarnation,
                    check: Arc::clone(check),
                    epoch: self.epochs,
                    due,
                    running: false,
                    task: None,
                    up: true,
                    checks: 0,
                    failures: 0,
                    ok_in_a_row: 0,
                    failed_in_a_row: 0,
                    last: None,
                    last_error: None,
                    round: 0,
                    seed,
                };
                if let Some(old) = self.targets.insert(key, t) {
                    self.in_flight -= usize::from(old.running);
                    if let Some(task) = old.task {
                        task.abort();
                    }
                }
            }
        }
        let before = self.targets.len();
        let in_flight = &mut self.in_flight;
        self.targets.retain(|k, t| {
            let keep = seen.contains_key(k);
            if !keep && t.running {
                *in_flight -= 1;
                if let Some(task) = t.task.take() {
                    task.abort();
                }
            }
            keep
        });
        if self.targets.len() != before || self.queue.len() > 2 * self.targets.len() + 64 {
            let targets = &self.targets;
            self.queue.retain(|epoch, k| targets.get(k).is_some_and(|t| t.epoch == epoch));
        }
    }

    /// When the next check is due, if any.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.queue.next()
    }

    /// The checks due at `now` that may start (room allowing), marked
    /// running.
    pub(crate) fn start_due(&mut self, now: Instant) -> Vec<Due> {
        let mut out = Vec::new();
        while self.in_flight < self.max_in_flight {
            let Some((epoch, key)) = self.queue.pop(now) else { break };
            let Some(t) = self.targets.get_mut(&key).filter(|t| t.epoch == epoch && !t.running) else { continue };
            let due = t.due;
            let interval = Duration::from_millis(u64::from(t.check.interval_ms));
            if now.duration_since(due) > interval / 10 {
                self.late += 1;
            }
            t.running = true;
            t.round += 1;
            // The next one an interval after this was due, ±10 %; never
            // before this one ends (a result schedules it again if so).
            t.due = now.checked_sub(interval).map_or(due, |floor| due.max(floor)) + interval.mul_f64(0.9 + 0.2 * unit(t.seed ^ t.round));
            self.in_flight += 1;
            out.push(Due { key, epoch, check: Arc::clone(&t.check), addr: t.addr, vip: t.vip });
        }
        out
    }

    /// Takes the result of a check of `key` begun in `epoch`; true when the
    /// endpoint went down or came back.
    pub(crate) fn result(&mut self, key: Key, epoch: u64, result: Result<Duration, String>, now: Instant) -> bool {
        let Some(t) = self.targets.get_mut(&key).filter(|t| t.epoch == epoch && t.running) else { return false };
        t.running = false;
        t.task = None;
        self.in_flight -= 1;
        self.run += 1;
        t.checks += 1;
        let was = t.up;
        match result {
            Ok(d) => {
                t.last = Some(d);
                t.ok_in_a_row += 1;
                t.failed_in_a_row = 0;
                if !t.up && t.ok_in_a_row >= t.check.rise {
                    t.up = true;
                    info!(service = %key.0, endpoint = key.1, address = %t.addr, rise = t.check.rise, "active check: endpoint passed `rise` checks in a row, back in new flows");
                }
            }
            Err(e) => {
                self.failed += 1;
                t.failures += 1;
                t.failed_in_a_row += 1;
                t.ok_in_a_row = 0;
                if t.up && t.failed_in_a_row >= t.check.fall {
                    t.up = false;
                    warn!(service = %key.0, endpoint = key.1, address = %t.addr, fall = t.check.fall, error = %e, "active check: endpoint failed `fall` checks in a row, out of new flows");
                }
                t.last_error = Some(e);
            }
        }
        let due = t.due.max(now);
        self.queue.push(due, epoch, key);
        was != t.up
    }

    /// Records the task running the check of `key` begun in `epoch`.
    pub(crate) fn started(&mut self, key: &Key, epoch: u64, task: tokio::task::AbortHandle) {
        match self.targets.get_mut(key).filter(|t| t.epoch == epoch && t.running) {
            Some(t) => t.task = Some(task),
            None => task.abort(),
        }
    }

    /// The endpoints down.
    pub(crate) fn verdicts(&self) -> Verdicts {
        let mut down: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
        for ((service, id), _) in self.targets.iter().filter(|(_, t)| !t.up) {
            down.entry(service.to_string()).or_default().insert(*id);
        }
        Verdicts { down }
    }

    /// The status (an endpoint down is `down`: the health task, which
    /// knows what the reconciler applied, says which are `held`).
    pub(crate) fn status(&self) -> Checks {
        let mut endpoints: Vec<CheckedEndpoint> = self
            .targets
            .iter()
            .map(|((service, id), t)| CheckedEndpoint {
                service: service.to_string(),
                id: *id,
                address: t.addr.to_string(),
                check: match (t.check.target, t.vip) {
                    (CheckTarget::Vip, Some(vip)) => format!("{}/{}", t.check.probe.name(), SocketAddr::new(vip, t.check.port)),
                    (CheckTarget::Vip, None) => format!("{}/vip:{}", t.check.probe.name(), t.check.port),
                    (CheckTarget::Endpoint, _) => format!("{}/{}", t.check.probe.name(), t.check.port),
                },
                state: if t.up { "up" } else { "down" }.to_owned(),
                checks: t.checks,
                failures: t.failures,
                successes_in_a_row: t.ok_in_a_row,
                failures_in_a_row: t.failed_in_a_row,
                last_ms: t.last.map(|d| d.as_secs_f64() * 1e3),
                last_error: t.last_error.clone(),
            })
            .collect();
        endpoints.sort_by(|a, b| (&a.service, a.id).cmp(&(&b.service, b.id)));
        Checks { run: self.run, failed: self.failed, late: self.late, in_flight: self.in_flight, max_in_flight: self.max_in_flight, endpoints }
    }
}

/// The most checks to run at once: a quarter of the descriptors this
/// process may open, between 64 and 4096.
pub(crate) fn max_in_flight() -> usize {
    let fds = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX);
    usize::try_from(fds / 4).unwrap_or(usize::MAX).clamp(64, 4096)
}

/// Checks due within this of each other start together: at most this late
/// (a tenth of the shortest interval), and the task wakes at most 100
/// times a second to start checks, and to read the answers of TCP checks.
pub(crate) const BATCH: Duration = Duration::from_millis(10);

/// How often the status is made again: every half second, or every 0.2 ms
/// per endpoint checked where that is longer (2 s for 10,000: making it
/// costs each endpoint's strings, here and in the health task that copies
/// it). An endpoint that goes down or comes back has it made again within
/// [`STATUS_AFTER_CHANGE`] (its verdict goes out at once).
const STATUS_EVERY: Duration = Duration::from_millis(500);
const STATUS_PER_ENDPOINT: Duration = Duration::from_micros(200);
/// The status after a change of state, at most this late (changes within
/// it make it once).
const STATUS_AFTER_CHANGE: Duration = Duration::from_millis(100);

/// When the status is next made, after it was at `last`: never while
/// nothing is checked and nothing changed.
fn status_due(last: Instant, endpoints: usize, stale: bool) -> Option<Instant> {
    let every = STATUS_PER_ENDPOINT.saturating_mul(u32::try_from(endpoints).unwrap_or(u32::MAX)).max(STATUS_EVERY);
    match (stale, endpoints) {
        (true, _) => Some(last + STATUS_AFTER_CHANGE),
        (false, 0) => None,
        (false, _) => Some(last + every),
    }
}

/// The active checks' task, built; [`ActiveTask::run`] runs it.
pub(crate) struct ActiveTask {
    pub(crate) published: watch::Receiver<Published>,
    pub(crate) verdicts: watch::Sender<Verdicts>,
    pub(crate) status: watch::Sender<Checks>,
    pub(crate) max_in_flight: usize,
}

/// What runs the checks: TCP checks inline where a raw socket sends their
/// SYNs, every other check in a task of its own.
struct Runner {
    inline: Option<Inline<(Key, u64)>>,
    running: JoinSet<Result<Duration, String>>,
    /// Which check each task runs: a task that panics or is aborted says
    /// nothing of itself.
    tasks: HashMap<tokio::task::Id, (Key, u64)>,
    query_id: u16,
}

/// Results of checks: (endpoint, epoch of its record, result).
type Results = Vec<(Key, u64, Result<Duration, String>)>;

impl Runner {
    fn new() -> Runner {
        // TCP checks send a SYN each from raw sockets where they open.
        Runner { inline: Prober::start().map(Inline::new), running: JoinSet::new(), tasks: HashMap::new(), query_id: 0 }
    }

    /// The inline checks answered, then those unanswered at their
    /// deadline, then those that failed as they started.
    fn step(&mut self, active: &mut Active, now: Instant) -> Results {
        let mut out: Results = Vec::new();
        if let Some(inline) = self.inline.as_mut() {
            out.extend(inline.drain(now).into_iter().map(|((key, epoch), r)| (key, epoch, r)));
            out.extend(inline.expired(now).into_iter().map(|((key, epoch), e)| (key, epoch, Err(e))));
        }
        for Due { key, epoch, check, addr, vip } in active.start_due(now) {
            let timeout = Duration::from_millis(u64::from(check.timeout_ms));
            // A check of the VIP goes to the VIP through the endpoint.
            let (to, via) = match (check.target, vip) {
                (CheckTarget::Endpoint, _) => (addr, None),
                (CheckTarget::Vip, Some(vip)) => (vip, Some(addr)),
                (CheckTarget::Vip, None) => {
                    out.push((key, epoch, Err(format!("no {} VIP is routed to the service", if addr.is_ipv4() { "IPv4" } else { "IPv6" }))));
                    continue;
                }
            };
            if matches!(check.probe, Probe::Tcp) {
                let to = SocketAddr::new(to, check.port);
                let sent = match self.inline.as_mut() {
                    Some(inline) if via.is_some() || inline.covers(to) => Some(inline.send(to, via, timeout, (key.clone(), epoch), now)),
                    None if via.is_some() => Some(Err("a check of the VIP needs raw sockets (CAP_NET_RAW)".to_owned())),
                    _ => None,
                };
                if let Some(sent) = sent {
                    if let Err(e) = sent {
                        out.push((key, epoch, Err(e)));
                    }
                    continue;
                }
            }
            self.query_id = self.query_id.wrapping_add(1);
            let id = self.query_id;
            let task = self.running.spawn(async move { super::probe::check(&check, to, via, id).await });
            self.tasks.insert(task.id(), (key.clone(), epoch));
            active.started(&key, epoch, task);
        }
        out
    }

    /// When to wake for the inline checks: at `tick` while any waits for
    /// its answer, and at the next deadline.
    fn next_wake(&self, tick: Instant) -> Option<Instant> {
        let inline = self.inline.as_ref()?;
        let tick = inline.waiting().then_some(tick);
        [tick, inline.next_deadline()].into_iter().flatten().min()
    }
}

impl ActiveTask {
    /// Checks until `cancel`.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        let ActiveTask { mut published, verdicts, status, max_in_flight } = self;
        let mut active = Active::new(max_in_flight);
        let mut runner = Runner::new();
        // Made as [`status_due`] says: after a change of what is checked
        // or of an endpoint's state, and every so often.
        let (mut last_status, mut stale) = (Instant::now(), false);
        let mut follow = true;
        // Results of the checks' tasks, taken with the others.
        let mut finished: Results = Vec::new();
        loop {
            if follow {
                let p = published.borrow_and_update();
                let checks = Arc::clone(&p.summary.checks);
                let snap = Arc::clone(&p.snapshot);
                drop(p);
                active.follow(&snap, &checks, Instant::now());
                stale = true;
                verdicts.send_if_modified(|v| {
                    let next = active.verdicts();
                    std::mem::replace(v, next.clone()) != next
                });
                follow = false;
            }
            let now = Instant::now();
            let mut results = runner.step(&mut active, now);
            results.append(&mut finished);
            // True when an endpoint went down or came back.
            if results.into_iter().fold(false, |changed, (key, epoch, r)| active.result(key, epoch, r, now) | changed) {
                verdicts.send_replace(active.verdicts());
                stale = true;
            }
            if status_due(last_status, active.targets.len(), stale).is_some_and(|at| now >= at) {
                status.send_replace(active.status());
                (last_status, stale) = (now, false);
            }
            // Woken on the calendar's grid of [`BATCH`] (the checks due
            // meanwhile start together: a wake-up per check would cost
            // more than the check), every tick while an inline check waits
            // for its answer, and at the next deadline.
            let room = active.in_flight < active.max_in_flight;
            let status_at = status_due(last_status, active.targets.len(), stale);
            let next = [active.next_due().filter(|_| room), runner.next_wake(active.queue.tick_after(now)), status_at].into_iter().flatten().min();
            tokio::select! {
                () = cancel.cancelled() => {
                    // The counts as they end.
                    status.send_replace(active.status());
                    return;
                }
                r = published.changed() => {
                    if r.is_err() {
                        return;
                    }
                    follow = true;
                }
                Some(done) = runner.running.join_next_with_id(), if !runner.running.is_empty() => {
                    // A panic is a failed check; an aborted check's record
                    // is gone or new (its epoch refuses the result).
                    let (id, result) = match done {
                        Ok((id, r)) => (id, r),
                        Err(e) => (e.id(), Err(format!("the check's task ended: {e}"))),
                    };
                    if let Some((key, epoch)) = runner.tasks.remove(&id) {
                        finished.push((key, epoch, result));
                    }
                }
                () = sleep_until(next), if next.is_some() => {}
            }
        }
    }
}

/// The cost of the checks, for the benchmark: `endpoints` endpoints of one
/// service, at `addrs` in turn, checked by `check` for `run`, in a runtime
/// of one thread on this thread (as the appliance's control side runs
/// them, with the status made as there). Returns the checks' counts and
/// the CPU time this thread took.
#[doc(hidden)]
pub fn cost(endpoints: u16, addrs: &[IpAddr], check: CheckDef, run: Duration) -> std::io::Result<(Checks, Duration)> {
    use sluice_dataplane::addr::Addr;
    use sluice_dataplane::service::{Algorithm, Delivery, EndpointSpec, Service, ServiceSpec};
    if addrs.is_empty() {
        return Err(std::io::Error::other("no address to check"));
    }
    let eps = (0..endpoints)
        .map(|id| EndpointSpec {
            id,
            incarnation: 1,
            weight: 1,
            draining: false,
            addr: Addr::from(addrs[usize::from(id) % addrs.len()]),
            port: 0,
            mac: [2, 0, 0, 0, 0, 1],
            delivery: Delivery::L2,
            counter: u32::from(id),
        })
        .collect();
    let spec = ServiceSpec { name: "bench".into(), key: 1, algorithm: Algorithm::Maglev, flow_table: true, limit: u32::from(endpoints).max(1), table_size: 0, endpoints: eps };
    let svc = Arc::new(Service::build(&spec).map_err(|e| std::io::Error::other(format!("{e:?}")))?);
    let snapshot = Arc::new(Snapshot::new(1, &[], vec![svc], vec![], None, None));
    let summary = crate::reconcile::Summary { checks: Arc::new([("bench".to_owned(), Arc::new(check))].into()), ..Default::default() };
    let (_published_tx, published) = watch::channel(Published { snapshot, summary: Arc::new(summary), ..Default::default() });
    let (verdicts, _v) = watch::channel(Verdicts::default());
    let (status, status_rx) = watch::channel(Checks::default());
    let task = ActiveTask { published, verdicts, status, max_in_flight: max_in_flight() };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let cancel = CancellationToken::new();
    let cpu0 = thread_cpu()?;
    rt.block_on(async {
        let c = cancel.clone();
        let stop = async move {
            tokio::time::sleep(run).await;
            c.cancel();
        };
        tokio::join!(task.run(cancel.clone()), stop);
    });
    let cpu = thread_cpu()?.saturating_sub(cpu0);
    let out = status_rx.borrow().clone();
    Ok((out, cpu))
}

/// CPU time this thread ran so far (`/proc/thread-self/schedstat`, ns).
#[doc(hidden)]
pub fn thread_cpu() -> std::io::Result<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    let ns: u64 = s.split_whitespace().next().and_then(|v| v.parse().ok()).ok_or_else(|| std::io::Error::other("schedstat"))?;
    Ok(Duration::from_nanos(ns))
}

async fn sleep_until(t: Option<Instant>) {
    if let Some(t) = t {
        tokio::time::sleep_until(t.into()).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Drives every check of `a` due by `now` to `ok`, returning how many ran.
    fn answer_all(a: &mut Active, now: Instant, ok: impl Fn(&Key) -> bool) -> usize {
        let due = a.start_due(now);
        let n = due.len();
        for Due { key, epoch, .. } in due {
            let r = if ok(&key) { Ok(Duration::from_millis(1)) } else { Err("refused".to_owned()) };
            a.result(key, epoch, r, now);
        }
        n
    }

    #[test]
    fn fall_takes_out_rise_brings_back_and_checks_are_spread() {
        let snap = crate::health::tests::snapshot_with(1, "web", 29);
        let mut check = CheckDef::new(sluice_core::model::Probe::Tcp, 80);
        (check.interval_ms, check.rise, check.fall) = (1000, 2, 3);
        let checks: BTreeMap<String, Arc<CheckDef>> = [("web".to_owned(), Arc::new(check))].into();
        let t0 = Instant::now();
        let mut a = Active::new(1000);
        a.follow(&snap, &checks, t0);
        // The first checks are spread over the first interval.
        let first_half = answer_all(&mut a, t0 + Duration::from_millis(500), |_| true);
        assert!((6..=24).contains(&first_half), "{first_half} of 30 in the first half of the interval");
        answer_all(&mut a, t0 + Duration::from_millis(1000), |_| true);
        assert!(a.targets.values().all(|t| (1..=2).contains(&t.checks)), "each checked once in its first interval (twice if early in it)");
        // Endpoint 7 fails from now on: down after its third check, and
        // only then.
        let dead = |k: &Key| k.1 == 7;
        let mut at = t0 + Duration::from_millis(1000);
        let mut rounds = 0;
        while a.verdicts().down.is_empty() {
            at += Duration::from_millis(100);
            answer_all(&mut a, at, |k| !dead(k));
            rounds += 1;
            assert!(rounds < 100, "never down");
        }
        assert_eq!(a.verdicts().down, [("web".to_owned(), [7].into())].into());
        let t = &a.targets[&(Arc::from("web"), 7)];
        assert_eq!((t.failed_in_a_row, t.checks), (3, 4));
        // Between 2 and 3.3 intervals after its last success (each ±10 %).
        let s = a.status();
        assert_eq!(s.endpoints[7].state, "down");
        assert_eq!(s.endpoints[7].last_error.as_deref(), Some("refused"));
        // Back after two successes.
        for _ in 0..40 {
            at += Duration::from_millis(100);
            answer_all(&mut a, at, |_| true);
        }
        assert!(a.verdicts().down.is_empty());
        let t = &a.targets[&(Arc::from("web"), 7)];
        assert!(t.up && t.ok_in_a_row >= 2);
    }

    #[test]
    fn a_check_of_the_vip_goes_through_each_endpoint_to_the_vip_of_its_family() {
        use sluice_dataplane::addr::Addr;
        use sluice_dataplane::classify::{RouteMatch, RouteSpec};
        let one = crate::health::tests::snapshot_with(1, "web", 1);
        let route = |vips: Vec<Addr>| RouteSpec { name: "r".into(), priority: 1, service: 0, matches: Arc::new(RouteMatch { vips, ..RouteMatch::default() }) };
        let with = |vips: Vec<&str>| Snapshot::new(2, &[route(vips.iter().map(|v| v.parse().unwrap()).collect())], vec![Arc::clone(&one.services[0])], vec![], None, None);
        let mut check = CheckDef::new(sluice_core::model::Probe::Tcp, 7070);
        check.target = CheckTarget::Vip;
        let checks: BTreeMap<String, Arc<CheckDef>> = [("web".to_owned(), Arc::new(check))].into();
        let t0 = Instant::now();
        let mut a = Active::new(100);
        a.follow(&with(vec!["2001:db8::1", "20.0.0.7", "20.0.0.1"]), &checks, t0);
        let mut due = a.start_due(t0 + Duration::from_secs(3));
        due.sort_by_key(|d| d.key.1);
        let got: Vec<(IpAddr, Option<IpAddr>)> = due.iter().map(|d| (d.addr, d.vip)).collect();
        let v4 = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(got, vec![(v4("10.0.0.10"), Some(v4("20.0.0.1"))), (v4("10.0.0.11"), Some(v4("20.0.0.1")))], "the lowest IPv4 VIP, through each endpoint");
        assert_eq!(a.status().endpoints[0].check, "tcp/20.0.0.1:7070");
        for d in due {
            a.result(d.key, d.epoch, Ok(Duration::ZERO), t0);
        }
        // The routes change the VIP: the records start afresh.
        let epochs: Vec<u64> = a.targets.values().map(|t| t.epoch).collect();
        a.follow(&with(vec!["20.0.0.9"]), &checks, t0);
        assert!(a.targets.values().all(|t| t.vip == Some(v4("20.0.0.9")) && !epochs.contains(&t.epoch)));
        // No VIP of the endpoints' family: said in the status.
        a.follow(&with(vec!["2001:db8::1"]), &checks, t0);
        assert!(a.targets.values().all(|t| t.vip.is_none()));
        assert_eq!(a.status().endpoints[0].check, "tcp/vip:7070");
    }

    #[test]
    fn at_most_max_in_flight_and_the_rest_waits() {
        let snap = crate::health::tests::snapshot_with(1, "web", 29);
        let checks: BTreeMap<String, Arc<CheckDef>> = [("web".to_owned(), Arc::new(CheckDef::new(sluice_core::model::Probe::Tcp, 80)))].into();
        let t0 = Instant::now();
        let mut a = Active::new(5);
        a.follow(&snap, &checks, t0);
        let late = t0 + Duration::from_secs(3);
        let started = a.start_due(late);
        assert_eq!(started.len(), 5);
        assert!(a.start_due(late).is_empty(), "no room");
        assert_eq!(a.late, 5);
        for Due { key, epoch, .. } in started {
            a.result(key, epoch, Ok(Duration::ZERO), late);
        }
        assert_eq!(a.start_due(late).len(), 5);
    }

    #[test]
    fn another_address_or_check_starts_afresh_and_a_leaving_endpoint_is_forgotten() {
        let snap = crate::health::tests::snapshot_with(1, "web", 2);
        let mut check = CheckDef::new(sluice_core::model::Probe::Tcp, 80);
        check.fall = 1;
        let checks: BTreeMap<String, Arc<CheckDef>> = [("web".to_owned(), Arc::new(check.clone()))].into();
        let t0 = Instant::now();
        let mut a = Active::new(100);
        a.follow(&snap, &checks, t0);
        let at = t0 + Duration::from_secs(3);
        answer_all(&mut a, at, |_| false);
        assert_eq!(a.verdicts().down["web"].len(), 3);
        // The same check again: nothing changes.
        a.follow(&snap, &[("web".to_owned(), Arc::new(check.clone()))].into(), at);
        assert_eq!(a.verdicts().down["web"].len(), 3);
        // Another port: every endpoint starts up again; a check still
        // running on the old record no longer counts against the limit.
        let running = a.start_due(at + Duration::from_secs(3));
        assert_eq!((running.len(), a.in_flight), (3, 3));
        check.port = 81;
        a.follow(&snap, &[("web".to_owned(), Arc::new(check))].into(), at);
        assert!(a.verdicts().down.is_empty());
        assert_eq!(a.in_flight, 0);
        for Due { key, epoch, .. } in running {
            assert!(!a.result(key, epoch, Err("late".into()), at), "a result of the old record is refused");
        }
        assert_eq!((a.in_flight, a.run), (0, 3));
        // No check: nothing is followed.
        a.follow(&snap, &BTreeMap::new(), at);
        assert!(a.targets.is_empty() && a.queue.is_empty());
    }

    #[test]
    fn the_calendar_never_starts_a_check_early_and_keeps_slot_order() {
        let t0 = Instant::now();
        let mut c = Calendar::new(t0);
        let key = |id: u32| -> Key { (Arc::from("web"), id) };
        c.push(t0 + Duration::from_millis(25), 1, key(1));
        c.push(t0 + Duration::from_millis(3), 2, key(2));
        c.push(t0 + Duration::from_millis(21), 3, key(3));
        assert_eq!((c.len(), c.next()), (3, Some(t0 + BATCH)), "due at 3 ms: its slot ends at 10 ms");
        assert_eq!(c.pop(t0 + Duration::from_millis(9)), None);
        assert_eq!(c.pop(t0 + BATCH).map(|e| e.0), Some(2));
        assert_eq!(c.next(), Some(t0 + 3 * BATCH), "21 and 25 ms share the slot that ends at 30 ms");
        assert_eq!(c.pop(t0 + Duration::from_millis(29)), None);
        let mut both: Vec<u64> = std::iter::from_fn(|| c.pop(t0 + Duration::from_millis(30)).map(|e| e.0)).collect();
        both.sort_unstable();
        assert_eq!(both, [1, 3]);
        assert!(c.is_empty() && c.next().is_none());
        assert_eq!(c.tick_after(t0 + Duration::from_millis(30)), t0 + 4 * BATCH, "the next point of the grid, not this one");
        assert_eq!(c.tick_after(t0 + Duration::from_millis(31)), t0 + 4 * BATCH);
        c.push(t0, 4, key(4));
        c.push(t0 + Duration::from_secs(1), 5, key(5));
        c.retain(|epoch, _| epoch == 5);
        assert_eq!((c.len(), c.next()), (1, Some(t0 + Duration::from_secs(1))));
    }

    #[test]
    fn the_status_is_made_after_a_change_and_less_often_for_many_endpoints() {
        let t = Instant::now();
        assert_eq!(status_due(t, 0, false), None, "nothing checked, nothing changed: never");
        assert_eq!(status_due(t, 0, true), Some(t + STATUS_AFTER_CHANGE));
        assert_eq!(status_due(t, 10_000, true), Some(t + STATUS_AFTER_CHANGE), "a change shows soon whatever the size");
        assert_eq!(status_due(t, 30, false), Some(t + STATUS_EVERY));
        assert_eq!(status_due(t, 10_000, false), Some(t + Duration::from_secs(2)));
    }
}

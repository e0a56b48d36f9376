//! Sibling sync, the control side: shares with the sibling appliances (the
//! `siblings:` section) the flow pins a table change makes necessary, and
//! gives the workers the pins the siblings share.
//!
//! - **Out:** the workers push the pins their table no longer agrees with
//!   into their rings ([`SyncRing`]); this task drains them every
//!   [`ROUND`] (at most [`DRAIN_PER_ROUND`] records per ring and round),
//!   keeps each pin until its lifetime ends, and sends it to every sibling
//!   connected. A sibling that connects gets the full set held, then an
//!   "in sync" marker, then each new pin.
//! - **Peers:** the configured ones, and those a discovery gives
//!   ([`SyncTask::follow`]: the pods of the Kubernetes Gateway's
//!   Deployment), followed as they come and go: a peer that appears is
//!   dialled, one that goes is let go (the pins it gave stay until their
//!   lifetime ends: its flows may still come here).
//! - **In:** this appliance dials every peer and takes its pins; each is
//!   translated to this appliance's numbering and the workers' table of
//!   synced pins ([`SyncedPins`]) is rebuilt and published, at most every
//!   [`REBUILD_EVERY`].
//! - **Wire identity:** service keys and incarnations are numbered by each
//!   appliance's compiler, so a record on the wire names its service by a
//!   hash of the service's name ([`service_tag`]), its endpoint by the
//!   identifier the configuration gives it, and carries a hash of the
//!   endpoint's address ([`address_tag`]) where the record holds the
//!   incarnation: the receiver maps them to its own service key and to the
//!   full incarnation of the endpoint of that identifier and address in
//!   its last published snapshot. A record is kept as it came until its
//!   lifetime ends and translated at each rebuild: one it cannot map when
//!   it arrives is counted (`unknown`), and used once a snapshot maps it
//!   (a sibling that applied a change first, an appliance that starts).
//! - **Bounds:** every connection proves the shared key both ways and each
//!   frame carries a MAC ([`wire`]); records beyond
//!   `maxRecordsPerSecond` from one sibling are dropped and counted
//!   (`rate_dropped`), and the sender paces itself to the same rate; a
//!   sibling's queue holds at most [`MAX_QUEUED`] records, past which its
//!   connection is closed (it connects again and takes the full set).
//!   Nothing here waits for a worker nor makes one wait: the rings and the
//!   RCU publication are the only things they share.
//! - **Agreement:** each listener also sends its dialers the digest of
//!   every service's table, and each appliance compares its siblings'
//!   with its own ([`agree`]): the services that differ are in the status
//!   and, with `siblings.gate`, a service in the minority has its VIPs
//!   withdrawn ([`SyncTask::gated`]) until it agrees. The endpoints each
//!   appliance's health wants out travel the same way and are applied by
//!   all ([`verdicts`], [`SyncTask::share_health`]), so that a drain does
//!   not make the tables differ.
//! - **Status:** on its own channel ([`SyncStatus`]); `settled` turns true
//!   once the discovery (if any) listed its peers and every reachable peer
//!   sent its "in sync" marker, or `startupWaitMs` passed.

pub(crate) mod agree;
pub(crate) mod verdicts;
mod wire;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use sluice_dataplane::addr::Addr;
use sluice_dataplane::flow::FlowKey;
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::service::Algorithm;
use sluice_dataplane::snapshot::Snapshot;
use sluice_dataplane::sync::{PinRecord, SyncRing, SyncedPin, SyncedPins, RECORD_LEN};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::siblings::SiblingsConfig;
use crate::ground::lock;
use crate::reconcile::Published;
use agree::{Digests, Mismatch, Own};
use verdicts::{Ejected, Names};
use wire::{Kind, WireError, MAX_RECORDS_PER_FRAME};

/// How often the rings are drained.
pub(crate) const ROUND: Duration = Duration::from_millis(5);
/// Records taken from one ring per round at most.
pub(crate) const DRAIN_PER_ROUND: usize = 4096;
/// The synced pins are rebuilt at most this often.
pub(crate) const REBUILD_EVERY: Duration = Duration::from_millis(10);
/// Records queued for one sibling at most.
pub(crate) const MAX_QUEUED: usize = 1 << 20;
/// A sender with nothing to send says so this often; a dialer that hears
/// nothing for [`SILENCE`] connects again.
const KEEPALIVE: Duration = Duration::from_secs(1);
const SILENCE: Duration = Duration::from_secs(5);
/// Pause between attempts to reach a sibling, doubling up to the maximum.
const REDIAL: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));
/// The status is published this often (and when startup settles).
const STATUS_EVERY: Duration = Duration::from_millis(250);
/// Expired pins are dropped this often.
const EXPIRE_EVERY: Duration = Duration::from_secs(1);

/// The wire's name of a service: 32 bits of SHA-256 of its name.
pub(crate) fn service_tag(name: &str) -> u32 {
    let d = Sha256::new().chain_update(b"sluice-service\0").chain_update(name.as_bytes()).finalize();
    u32::from_be_bytes([d[0], d[1], d[2], d[3]])
}

/// What a record on the wire holds in place of the incarnation: 16 bits of
/// SHA-256 of the endpoint's address (an identifier given to another
/// address on one sibling does not match).
pub(crate) fn address_tag(a: Addr) -> u16 {
    let d = Sha256::new().chain_update(b"sluice-endpoint\0").chain_update(a.0.to_be_bytes()).finalize();
    u16::from_be_bytes([d[0], d[1]])
}

/// A flow key as a map's key (the data plane's has no `Hash`): addresses,
/// ports, protocol and service.
type MapKey = (u128, u128, u16, u16, u8, u32);

fn map_key(k: &FlowKey) -> MapKey {
    let f = &k.flow;
    (f.src.0, f.dst.0, f.sport, f.dport, f.proto, k.service)
}

/// One sibling, as the status shows it.
pub(crate) type PeerStatus = sluice_admin_api::sync::Peer;

/// What the sync task did, published on its own channel: the `/status`
/// document's `sync`, filled here.
pub(crate) type SyncStatus = sluice_admin_api::sync::Sync;

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
    refused: AtomicU64,
    rate_dropped: AtomicU64,
    unknown: AtomicU64,
    stale: AtomicU64,
    overflows: AtomicU64,
    /// Siblings' verdicts on endpoints this appliance does not have (now).
    health_unknown: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// A token bucket of `rate` records per second holding one second's worth.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: u32) -> Bucket {
        Bucket { rate: f64::from(rate), tokens: f64::from(rate), last: Instant::now() }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.rate);
        self.last = now;
    }

    /// How many of `n` records may pass now (taken from the bucket).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)] // bounded by n
    fn take(&mut self, n: usize) -> usize {
        self.refill();
        let k = (self.tokens.floor().max(0.0) as usize).min(n);
        self.tokens -= k as f64;
        k
    }

    /// Time until one record may pass.
    fn wait(&mut self) -> Duration {
        self.refill();
        if self.tokens >= 1.0 { Duration::ZERO } else { Duration::from_secs_f64((1.0 - self.tokens) / self.rate) }
    }
}

/// An item queued for one sibling.
#[derive(Clone, Copy, Debug)]
enum Item {
    /// A pin (wire numbering) and when its lifetime ends.
    Pin(PinRecord, Instant),
    /// Everything held when it connected has been queued before this.
    InSync,
}

/// The queue of one sibling connected to us.
#[derive(Debug)]
struct Outbox {
    name: String,
    /// The protocol version it speaks: digests go only to version 2.
    version: u8,
    queue: Mutex<VecDeque<Item>>,
    notify: Notify,
    /// Set when the queue overflowed: the connection closes.
    overflow: AtomicBool,
}

/// What the sync task holds, shared with its connections.
#[derive(Debug, Default)]
struct Hub {
    /// Pins exported here, by flow (wire numbering), until their lifetime ends.
    held: HashMap<MapKey, (PinRecord, Instant)>,
    outboxes: Vec<Arc<Outbox>>,
    /// The sets sent whole to siblings of version 2 ([`SETS`]): this
    /// appliance's table digests and its health verdicts.
    sets: [OutSet; 2],
}

/// A set sent whole, encoded, and how many times it changed (a connection
/// sends it again when this moves).
#[derive(Debug, Default)]
struct OutSet {
    records: Arc<Vec<[u8; RECORD_LEN]>>,
    version: u64,
}

/// The sets' frame kinds (part, end), in [`Hub::sets`]' order.
const SETS: [(Kind, Kind); 2] = [(Kind::Digests, Kind::DigestsEnd), (Kind::Health, Kind::HealthEnd)];
const DIGESTS: usize = 0;
const HEALTH: usize = 1;

/// The pins received, as they came (in the wire's numbering), by flow,
/// each with its deadline on the workers' clock. They are translated to
/// this appliance's numbering each time the workers' table is rebuilt, so
/// that a pin received before this appliance's snapshot knew its service
/// or endpoint (at start, or when a sibling applied a change first) is
/// used once a snapshot does.
#[derive(Debug, Default)]
struct Inbox {
    pins: HashMap<MapKey, (PinRecord, u64)>,
    /// Pins the last rebuild could translate: what the workers have.
    usable: usize,
    dirty: bool,
}

/// The peers a discovery gives, as it changes: `None` until it first
/// listed them.
pub(crate) type Discovered = watch::Receiver<Option<Vec<SocketAddr>>>;

/// What `not_heard` says of a discovery that never listed its peers.
pub(crate) const NOT_LISTED: &str = "the discovered siblings (never listed)";

/// One peer's state.
#[derive(Debug)]
struct Peer {
    connected: AtomicBool,
    in_sync: AtomicBool,
    last_heard: Mutex<Option<Instant>>,
    /// The version dialled with: [`wire::VERSION`], or [`wire::OLDEST`]
    /// after a listener closed a handshake of the newer one.
    version: AtomicU8,
    /// Its table digests, the last whole set on the current connection.
    digests: Mutex<Option<Arc<Digests>>>,
    /// Its health verdicts, likewise (as they came: translated when used).
    health: Mutex<Option<Arc<Vec<[u8; RECORD_LEN]>>>>,
}

impl Default for Peer {
    fn default() -> Peer {
        Peer {
            connected: AtomicBool::new(false),
            in_sync: AtomicBool::new(false),
            last_heard: Mutex::new(None),
            version: AtomicU8::new(wire::VERSION),
            digests: Mutex::new(None),
            health: Mutex::new(None),
        }
    }
}

/// A service's endpoints by identifier: (incarnation, address tag).
type Endpoints = HashMap<u16, (u32, u16)>;

/// Maps between this appliance's numbering and the wire's, from one
/// published snapshot: services of the Maglev algorithm with a flow table
/// (the only ones whose pins are exported).
#[derive(Debug, Default)]
struct Numbering {
    /// Local service key -> (wire tag, its endpoints).
    by_key: HashMap<u32, (u32, Endpoints)>,
    /// Wire tag -> local service key (tags two local services share are left out).
    by_tag: HashMap<u32, u32>,
}

impl Numbering {
    fn of(s: &Snapshot) -> Numbering {
        let mut n = Numbering::default();
        let mut clash = Vec::new();
        for svc in s.services.iter().filter(|s| s.algorithm == Algorithm::Maglev && s.flow_table) {
            let tag = service_tag(&svc.name);
            let eps = svc.endpoints().map(|e| (e.id, (e.incarnation, address_tag(e.addr)))).collect();
            n.by_key.insert(svc.key, (tag, eps));
            if n.by_tag.insert(tag, svc.key).is_some() {
                clash.push(tag);
            }
        }
        for t in clash {
            n.by_tag.remove(&t);
        }
        n
    }

    /// A record a worker exported, in the wire's numbering; `None` when its
    /// endpoint is no longer the one it was pinned to.
    fn outbound(&self, r: &PinRecord) -> Option<PinRecord> {
        let (tag, eps) = self.by_key.get(&r.service)?;
        let &(incarnation, addr) = eps.get(&r.endpoint)?;
        r.is_incarnation(incarnation).then_some(PinRecord { service: *tag, incarnation: addr, ..*r })
    }

    /// A record received, in this appliance's numbering: its flow key and
    /// endpoint with the full incarnation.
    fn inbound(&self, r: &PinRecord) -> Option<(FlowKey, u16, u32)> {
        let key = *self.by_tag.get(&r.service)?;
        let (_, eps) = self.by_key.get(&key)?;
        let &(incarnation, addr) = eps.get(&r.endpoint)?;
        (addr == r.incarnation).then(|| (FlowKey { service: key, ..r.key() }, r.endpoint, incarnation))
    }
}

/// Everything the task's parts share.
#[derive(Debug)]
struct State {
    cfg: SiblingsConfig,
    /// The workers' clock starts here (their `now_ms` is milliseconds since).
    epoch: Instant,
    hub: Mutex<Hub>,
    inbox: Mutex<Inbox>,
    numbering: Mutex<Arc<Numbering>>,
    /// The peers followed now, in the order they came.
    peers: Mutex<Vec<(SocketAddr, Arc<Peer>)>>,
    counters: Counters,
    /// A digest set (ours or a peer's) changed since the last comparison.
    agree_dirty: AtomicBool,
    /// A peer's verdicts changed since they were last taken.
    health_dirty: AtomicBool,
    /// The siblings' verdicts last taken.
    health_taken: Mutex<Ejected>,
}

impl State {
    #[allow(clippy::cast_possible_truncation)] // milliseconds since start fit
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn numbering(&self) -> Arc<Numbering> {
        Arc::clone(&lock(&self.numbering))
    }
}

/// The sync task, built; [`SyncTask::run`] runs it.
#[derive(Debug)]
pub(crate) struct SyncTask {
    state: Arc<State>,
    listener: TcpListener,
    rings: Vec<Arc<SyncRing>>,
    publisher: Publisher<SyncedPins>,
    published: watch::Receiver<Published>,
    status: watch::Sender<SyncStatus>,
    gated: watch::Sender<Gated>,
    discovered: Option<Discovered>,
    /// This appliance's health verdicts (to send), and the siblings' (taken).
    health: Option<(watch::Receiver<Ejected>, watch::Sender<Ejected>)>,
}

/// The services whose VIPs are withdrawn because their table differs from
/// the majority of the reachable siblings (with `siblings.gate`), each
/// with why.
pub(crate) type Gated = Arc<BTreeMap<String, String>>;

impl SyncTask {
    /// Listens on `cfg.listen`; will drain `rings`, publish through
    /// `publisher` and translate with the snapshots `published` gives.
    /// `epoch` is when the workers' clock reads 0.
    pub(crate) async fn bind(
        cfg: SiblingsConfig,
        rings: Vec<Arc<SyncRing>>,
        publisher: Publisher<SyncedPins>,
        published: watch::Receiver<Published>,
        epoch: Instant,
    ) -> std::io::Result<SyncTask> {
        let listener = TcpListener::bind(cfg.listen).await?;
        let state = Arc::new(State {
            cfg,
            epoch,
            hub: Mutex::new(Hub::default()),
            inbox: Mutex::new(Inbox::default()),
            numbering: Mutex::new(Arc::new(Numbering::default())),
            peers: Mutex::new(Vec::new()),
            counters: Counters::default(),
            agree_dirty: AtomicBool::new(false),
            health_dirty: AtomicBool::new(false),
            health_taken: Mutex::new(Ejected::new()),
        });
        let (status, _) = watch::channel(SyncStatus::default());
        let (gated, _) = watch::channel(Gated::default());
        Ok(SyncTask { state, listener, rings, publisher, published, status, gated, discovered: None, health: None })
    }

    /// Takes peers from `discovered` too, beside the configured ones.
    #[must_use]
    pub(crate) fn follow(mut self, discovered: Discovered) -> SyncTask {
        self.discovered = Some(discovered);
        self
    }

    /// The address it listens on.
    #[cfg(test)]
    pub(crate) fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Its status, as it changes.
    pub(crate) fn status(&self) -> watch::Receiver<SyncStatus> {
        self.status.subscribe()
    }

    /// Sends the endpoints `own` wants out (this appliance's health) to the
    /// siblings, and gives `siblings` the endpoints theirs want out.
    #[must_use]
    pub(crate) fn share_health(mut self, own: watch::Receiver<Ejected>, siblings: watch::Sender<Ejected>) -> SyncTask {
        self.health = Some((own, siblings));
        self
    }

    /// The services whose VIPs are withdrawn for disagreeing, as they
    /// change (always empty without `siblings.gate`).
    pub(crate) fn gated(&self) -> watch::Receiver<Gated> {
        self.gated.subscribe()
    }

    /// Runs until `stop` is cancelled.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let SyncTask { state, listener, rings, mut publisher, mut published, status, gated, mut discovered, health } = self;
        let (own_health, siblings_health) = health.unzip();
        let mut fleet = Fleet { own: Own::default(), agreement: Agreement::default(), names: Names::default(), own_health, siblings_health };
        let mut tasks = JoinSet::new();
        {
            let (st, c) = (Arc::clone(&state), stop.clone());
            tasks.spawn(accept_loop(st, listener, c));
        }
        let mut dialers = Dialers::default();
        let first = discovered.as_mut().and_then(|d| d.borrow_and_update().clone());
        let listed = discovered.is_none() || first.is_some();
        dialers.want(&state, &wanted(&state.cfg, first.as_deref()), &stop);
        let mut start = Start::new(Duration::from_millis(u64::from(state.cfg.startup_wait_ms)), listed);
        let mut last_build = Instant::now() - REBUILD_EVERY;
        let (mut last_expire, mut last_status) = (Instant::now(), Instant::now() - STATUS_EVERY);
        let mut drained = Vec::with_capacity(DRAIN_PER_ROUND);
        fleet.follow(&state, &Arc::clone(&published.borrow_and_update().snapshot));
        let mut round = tokio::time::interval(ROUND);
        round.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                r = published.changed() => {
                    if r.is_err() {
                        break;
                    }
                    fleet.follow(&state, &Arc::clone(&published.borrow_and_update().snapshot));
                    lock(&state.inbox).dirty = true;
                    continue;
                }
                r = changed_ejected(fleet.own_health.as_mut()) => {
                    fleet.own_verdicts(&state, r.is_ok());
                    continue;
                }
                r = changed(discovered.as_mut()) => {
                    if r.is_err() {
                        // The discovery ended: the peers it gave are kept.
                        warn!("siblings: the discovery of siblings ended; keeping the ones it gave");
                        discovered = None;
                        continue;
                    }
                    let list = discovered.as_mut().and_then(|d| d.borrow_and_update().clone());
                    start.listed |= list.is_some();
                    if dialers.want(&state, &wanted(&state.cfg, list.as_deref()), &stop) {
                        start.peers_changed = Instant::now();
                    }
                    continue;
                }
                _ = round.tick() => {}
            }
            let now = Instant::now();
            drain(&state, &rings, &mut drained, now);
            if now.duration_since(last_expire) >= EXPIRE_EVERY {
                last_expire = now;
                expire(&state, now);
            }
            if now.duration_since(last_build) >= REBUILD_EVERY {
                if rebuild(&state, &mut publisher) {
                    last_build = now;
                } else {
                    publisher.reclaim();
                }
            }
            if !start.settled && start.check(&state, now) {
                last_status = now - STATUS_EVERY;
            }
            if fleet.round(&state) {
                last_status = now - STATUS_EVERY;
            }
            if now.duration_since(last_status) >= STATUS_EVERY {
                last_status = now;
                publish_status(&state, &start, &fleet.agreement, (&status, &gated), now);
            }
        }
        // The dialers stop first (aborted on drop, without the log line of
        // a sibling that left), then the connections.
        drop(dialers);
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

/// Publishes the status, and the services withdrawn (with `siblings.gate`).
fn publish_status(state: &State, start: &Start, agreement: &Agreement, (status, gated): (&watch::Sender<SyncStatus>, &watch::Sender<Gated>), now: Instant) {
    if state.cfg.gate {
        let g = agreement.gated(now);
        gated.send_if_modified(|old| {
            if **old == g {
                false
            } else {
                *old = Arc::new(g);
                true
            }
        });
    }
    let s = snapshot_status(state, start.settled, &start.not_heard, agreement, now);
    status.send_if_modified(|old| std::mem::replace(old, s.clone()) != s);
}

/// Publishes the workers' table of synced pins again when pins came or
/// went since the last time (each translated with the last snapshot's
/// numbering); true when it did.
fn rebuild(state: &State, publisher: &mut Publisher<SyncedPins>) -> bool {
    let pins = {
        let mut inbox = lock(&state.inbox);
        if !inbox.dirty {
            return false;
        }
        inbox.dirty = false;
        let numbering = state.numbering();
        let pins: Vec<(FlowKey, SyncedPin)> = inbox
            .pins
            .values()
            .filter_map(|(r, deadline_ms)| {
                let (key, endpoint, incarnation) = numbering.inbound(r)?;
                Some((key, SyncedPin { endpoint, incarnation, deadline_ms: *deadline_ms }))
            })
            .collect();
        inbox.usable = pins.len();
        pins
    };
    publisher.publish(SyncedPins::build(pins));
    true
}

/// The start: whether it settled (every reachable sibling's pins taken,
/// or the wait over), and whom it did not hear from.
#[derive(Debug)]
struct Start {
    at: Instant,
    wait: Duration,
    /// The discovery listed its peers (or there is none).
    listed: bool,
    /// When the peers last changed: a new one gets a first chance to
    /// connect before it counts as unreachable.
    peers_changed: Instant,
    settled: bool,
    not_heard: Vec<String>,
}

impl Start {
    fn new(wait: Duration, listed: bool) -> Start {
        let at = Instant::now();
        Start { at, wait, listed, peers_changed: at, settled: false, not_heard: Vec::new() }
    }

    /// Settles when it can; true when it just did.
    fn check(&mut self, state: &State, now: Instant) -> bool {
        let (mut waiting, unreachable) = {
            let peers = lock(&state.peers);
            let waiting: Vec<String> = peers
                .iter()
                .filter(|(_, p)| p.connected.load(Ordering::Relaxed) && !p.in_sync.load(Ordering::Relaxed))
                .map(|(a, _)| a.to_string())
                .collect();
            let unreachable: Vec<String> =
                peers.iter().filter(|(_, p)| !p.connected.load(Ordering::Relaxed)).map(|(a, _)| a.to_string()).collect();
            (waiting, unreachable)
        };
        if !self.listed {
            waiting.push(NOT_LISTED.to_owned());
        }
        let tried = now.duration_since(self.peers_changed) >= REDIAL.1.min(self.wait);
        if waiting.is_empty() && (unreachable.is_empty() || tried) {
            info!(unreachable = ?unreachable, "siblings: every reachable sibling's pins taken; announcing");
        } else if now.duration_since(self.at) >= self.wait {
            self.not_heard = waiting.into_iter().chain(unreachable).collect();
            warn!(not_heard = ?self.not_heard, wait_ms = u64::try_from(self.wait.as_millis()).unwrap_or(u64::MAX), "siblings: start-up wait over without these siblings' pins; announcing anyway");
        } else {
            return false;
        }
        self.settled = true;
        true
    }
}

/// Waits for the discovery's next change; never, without one.
async fn changed(d: Option<&mut Discovered>) -> Result<(), watch::error::RecvError> {
    match d {
        Some(d) => d.changed().await,
        None => std::future::pending().await,
    }
}

/// The peers to follow: the configured ones, then the discovered ones not
/// among them, never this appliance's own listen address.
fn wanted(cfg: &SiblingsConfig, discovered: Option<&[SocketAddr]>) -> Vec<SocketAddr> {
    let mut all = cfg.peers.clone();
    for a in discovered.unwrap_or_default() {
        if !all.contains(a) && *a != cfg.listen {
            all.push(*a);
        }
    }
    all
}

/// The dialling task of each peer followed.
#[derive(Debug, Default)]
struct Dialers(HashMap<SocketAddr, tokio::task::JoinHandle<()>>);

impl Dialers {
    /// Dials the peers of `want` not dialled yet and lets go of those not
    /// in it; true when the set changed.
    fn want(&mut self, state: &Arc<State>, want: &[SocketAddr], stop: &CancellationToken) -> bool {
        let mut changed = false;
        self.0.retain(|a, task| {
            let keep = want.contains(a);
            if !keep {
                task.abort();
                info!(sibling = %a, "siblings: no longer a sibling; letting it go");
                changed = true;
            }
            keep
        });
        lock(&state.peers).retain(|(a, _)| want.contains(a));
        for a in want {
            if self.0.contains_key(a) {
                continue;
            }
            let peer = Arc::new(Peer::default());
            lock(&state.peers).push((*a, Arc::clone(&peer)));
            self.0.insert(*a, tokio::spawn(dial_loop(Arc::clone(state), *a, peer, stop.clone())));
            changed = true;
        }
        changed
    }
}

impl Drop for Dialers {
    fn drop(&mut self) {
        for t in self.0.values() {
            t.abort();
        }
    }
}

/// Takes what the workers exported: translated, held, and queued for every
/// sibling connected.
fn drain(state: &State, rings: &[Arc<SyncRing>], buf: &mut Vec<PinRecord>, now: Instant) {
    buf.clear();
    for r in rings {
        r.drain_into(buf, DRAIN_PER_ROUND);
    }
    if buf.is_empty() {
        return;
    }
    let numbering = state.numbering();
    let mut hub = lock(&state.hub);
    for r in buf.drain(..) {
        let Some(w) = numbering.outbound(&r) else {
            add(&state.counters.stale, 1);
            continue;
        };
        let until = now + Duration::from_secs(u64::from(w.lifetime));
        hub.held.insert(map_key(&w.key()), (w, until));
        for o in &hub.outboxes {
            push(state, o, Item::Pin(w, until));
        }
    }
}

fn push(state: &State, o: &Outbox, item: Item) {
    let mut q = lock(&o.queue);
    if q.len() >= MAX_QUEUED {
        if !o.overflow.swap(true, Ordering::Relaxed) {
            add(&state.counters.overflows, 1);
        }
        q.clear();
    } else {
        q.push_back(item);
    }
    drop(q);
    o.notify.notify_one();
}

fn expire(state: &State, now: Instant) {
    lock(&state.hub).held.retain(|_, (_, until)| *until > now);
    let now_ms = state.now_ms();
    let mut inbox = lock(&state.inbox);
    let before = inbox.pins.len();
    inbox.pins.retain(|_, (_, deadline_ms)| *deadline_ms > now_ms);
    if inbox.pins.len() != before {
        inbox.dirty = true;
    }
}

fn snapshot_status(state: &State, settled: bool, not_heard: &[String], agreement: &Agreement, now: Instant) -> SyncStatus {
    let c = &state.counters;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let (pins_held, outboxes) = {
        let hub = lock(&state.hub);
        (hub.held.len() as u64, hub.outboxes.clone())
    };
    let mut peers: Vec<PeerStatus> = lock(&state.peers)
        .iter()
        .map(|(a, p)| (a.to_string(), p))
        .map(|(address, p)| PeerStatus {
            mismatched: agreement.mismatched.iter().filter(|m| m.differ.iter().chain(&m.absent).any(|x| *x == address)).count() as u64,
            address,
            connected: p.connected.load(Ordering::Relaxed),
            in_sync: p.in_sync.load(Ordering::Relaxed),
            last_heard_seconds: { *lock(&p.last_heard) }.map(|t| (now.duration_since(t).as_secs_f64() * 1000.0).round() / 1000.0),
            digests: lock(&p.digests).as_ref().map(|d| d.len() as u64),
            health: lock(&p.health).as_ref().map(|h| h.len() as u64),
            ..PeerStatus::default()
        })
        .collect();
    for o in outboxes {
        let lag = lock(&o.queue).iter().filter(|i| matches!(i, Item::Pin(..))).count() as u64;
        match peers.iter_mut().find(|p| p.address == o.name) {
            Some(p) => {
                p.subscribed = true;
                p.lag += lag;
            }
            None => peers.push(PeerStatus { address: o.name.clone(), subscribed: true, lag, ..PeerStatus::default() }),
        }
    }
    SyncStatus {
        pins_held,
        pins_synced: lock(&state.inbox).usable as u64,
        sent: get(&c.sent),
        received: get(&c.received),
        refused: get(&c.refused),
        rate_dropped: get(&c.rate_dropped),
        unknown: get(&c.unknown),
        stale: get(&c.stale),
        overflows: get(&c.overflows),
        settled,
        not_heard: not_heard.to_vec(),
        peers,
        agreement: agreement.status(state.cfg.gate, now),
        health_from_siblings: lock(&state.health_taken)
            .iter()
            .flat_map(|(s, ids)| ids.iter().map(move |id| format!("{s}/{id}")))
            .take(agree::MAX_LISTED)
            .collect(),
        health_unknown: get(&c.health_unknown),
    }
}

async fn accept_loop(state: Arc<State>, listener: TcpListener, stop: CancellationToken) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Some(_) = conns.join_next() => {}
            r = listener.accept() => match r {
                Ok((s, from)) => {
                    let (st, c) = (Arc::clone(&state), stop.clone());
                    conns.spawn(async move {
                        if let Err(e) = serve(&st, s, c).await {
                            if matches!(e, WireError::BadKey | WireError::Protocol) {
                                add(&st.counters.refused, 1);
                            }
                            warn!(sibling = %from, error = %e, "siblings: connection from a sibling ended");
                        }
                    });
                }
                Err(e) => {
                    warn!(error = %e, "siblings: accept failed");
                    tokio::time::sleep(REDIAL.0).await;
                }
            },
        }
    }
    conns.abort_all();
}

/// Sends our pins to a sibling that connected: the full set, the marker,
/// then each new pin, paced to the rate bound.
async fn serve(state: &Arc<State>, mut s: TcpStream, stop: CancellationToken) -> Result<(), WireError> {
    let _ = s.set_nodelay(true);
    let (mut session, name, version) = tokio::time::timeout(SILENCE, wire::accept(&mut s, &state.cfg.key.0))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake"))??;
    let outbox = Arc::new(Outbox { name, version, queue: Mutex::new(VecDeque::new()), notify: Notify::new(), overflow: AtomicBool::new(false) });
    {
        let mut hub = lock(&state.hub);
        let mut q = lock(&outbox.queue);
        q.extend(hub.held.values().map(|(r, until)| Item::Pin(*r, *until)));
        q.push_back(Item::InSync);
        drop(q);
        hub.outboxes.push(Arc::clone(&outbox));
    }
    info!(sibling = %outbox.name, "siblings: a sibling connected; sending it our pins");
    let r = send_loop(state, &mut s, &mut session, &outbox, stop).await;
    lock(&state.hub).outboxes.retain(|o| !Arc::ptr_eq(o, &outbox));
    r
}

/// Sends each of this appliance's sets ([`SETS`]) to a sibling of
/// version 2 when it changed since `sent` (version, when), at most every
/// [`agree::SEND_EVERY`]: the whole set, then its end. Returns how long
/// until a change held back may be sent.
async fn send_sets(state: &State, s: &mut TcpStream, session: &mut wire::Session, outbox: &Outbox, sent: &mut [(u64, Instant); 2]) -> Result<Option<Duration>, WireError> {
    if outbox.version < 2 {
        return Ok(None);
    }
    let mut wait: Option<Duration> = None;
    let mut buf = Vec::new();
    for (k, (part, end)) in SETS.into_iter().enumerate() {
        let (set, version) = {
            let hub = lock(&state.hub);
            (Arc::clone(&hub.sets[k].records), hub.sets[k].version)
        };
        if version == sent[k].0 {
            continue;
        }
        let since = sent[k].1.elapsed();
        if since < agree::SEND_EVERY {
            let w = agree::SEND_EVERY - since;
            wait = Some(wait.map_or(w, |x| x.min(w)));
            continue;
        }
        for chunk in set.chunks(MAX_RECORDS_PER_FRAME) {
            buf.clear();
            chunk.iter().for_each(|r| buf.extend_from_slice(r));
            wire::write_frame(s, session, part, &buf).await?;
        }
        wire::write_frame(s, session, end, &[]).await?;
        s.flush().await?;
        sent[k] = (version, Instant::now());
    }
    Ok(wait)
}

async fn send_loop(state: &State, s: &mut TcpStream, session: &mut wire::Session, outbox: &Outbox, stop: CancellationToken) -> Result<(), WireError> {
    let mut bucket = Bucket::new(state.cfg.max_records_per_second);
    let mut buf = Vec::with_capacity(MAX_RECORDS_PER_FRAME * RECORD_LEN);
    let mut last_sent = Instant::now();
    // Each set's version sent last, and when.
    let mut sets_sent = [(0u64, Instant::now() - agree::SEND_EVERY); 2];
    loop {
        if outbox.overflow.load(Ordering::Relaxed) {
            return Err(std::io::Error::other("its queue overflowed: it will connect again for the full set").into());
        }
        let sets_wait = send_sets(state, s, session, outbox, &mut sets_sent).await?;
        last_sent = sets_sent.iter().map(|x| x.1).fold(last_sent, Instant::max);
        let wait = bucket.wait();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let allowed = bucket.take(MAX_RECORDS_PER_FRAME);
        let (mut n, mut marker) = (0usize, false);
        buf.clear();
        let now = Instant::now();
        {
            let mut q = lock(&outbox.queue);
            while n < allowed {
                match q.front() {
                    Some(Item::Pin(r, until)) => {
                        let (r, until) = (*r, *until);
                        q.pop_front();
                        let left = until.saturating_duration_since(now).as_secs();
                        if left == 0 {
                            continue;
                        }
                        let lifetime = u16::try_from(left).unwrap_or(u16::MAX).min(r.lifetime);
                        buf.extend_from_slice(&PinRecord { lifetime, ..r }.encode());
                        n += 1;
                    }
                    Some(Item::InSync) if n == 0 => {
                        q.pop_front();
                        marker = true;
                        break;
                    }
                    _ => break,
                }
            }
        }
        // Tokens not used go back.
        bucket.tokens += (allowed - n) as f64;
        if n > 0 {
            wire::write_frame(s, session, Kind::Records, &buf).await?;
            add(&state.counters.sent, n as u64);
            last_sent = now;
            continue;
        }
        if marker {
            wire::write_frame(s, session, Kind::InSync, &[]).await?;
            s.flush().await?;
            last_sent = now;
            continue;
        }
        s.flush().await?;
        let idle = KEEPALIVE.saturating_sub(now.duration_since(last_sent)).min(sets_wait.unwrap_or(Duration::MAX));
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = outbox.notify.notified() => {}
            () = tokio::time::sleep(idle) => {
                if sets_wait.is_none() && Instant::now().duration_since(last_sent) >= KEEPALIVE {
                    wire::write_frame(s, session, Kind::Keepalive, &[]).await?;
                    s.flush().await?;
                    last_sent = Instant::now();
                }
            }
        }
    }
}

/// Keeps a connection to the peer at `addr`, taking its pins.
async fn dial_loop(state: Arc<State>, addr: SocketAddr, peer: Arc<Peer>, stop: CancellationToken) {
    let mut pause = REDIAL.0;
    loop {
        let r = tokio::select! {
            () = stop.cancelled() => return,
            r = take_pins(&state, addr, &peer) => r,
        };
        let was = peer.connected.swap(false, Ordering::Relaxed);
        peer.in_sync.store(false, Ordering::Relaxed);
        if lock(&peer.digests).take().is_some() {
            state.agree_dirty.store(true, Ordering::Relaxed);
        }
        if lock(&peer.health).take().is_some() {
            state.health_dirty.store(true, Ordering::Relaxed);
        }
        let version = peer.version.load(Ordering::Relaxed);
        if was && version < wire::VERSION {
            // It may have been upgraded meanwhile: the newer version first again.
            peer.version.store(wire::VERSION, Ordering::Relaxed);
        } else if !was && version == wire::VERSION && matches!(&r, Err(WireError::Io(e)) if closed_in_handshake(e)) {
            info!(sibling = %addr, "siblings: it closed a handshake of protocol version {version}; dialling it with version {} (pins only, no table digests)", wire::OLDEST);
            peer.version.store(wire::OLDEST, Ordering::Relaxed);
        }
        if let Err(e) = r {
            if matches!(e, WireError::BadKey | WireError::BadMac | WireError::BadFrame { .. } | WireError::Protocol) {
                add(&state.counters.refused, 1);
                warn!(sibling = %addr, error = %e, "siblings: refused");
            } else if was {
                warn!(sibling = %addr, error = %e, "siblings: connection lost");
            }
        }
        if was {
            pause = REDIAL.0;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(REDIAL.1);
    }
}

async fn take_pins(state: &State, addr: SocketAddr, peer: &Peer) -> Result<(), WireError> {
    let mut s = tokio::time::timeout(SILENCE, TcpStream::connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect"))??;
    let _ = s.set_nodelay(true);
    let version = peer.version.load(Ordering::Relaxed);
    let mut session = tokio::time::timeout(SILENCE, wire::dial(&mut s, &state.cfg.key.0, &state.cfg.listen.to_string(), version))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake"))??;
    peer.connected.store(true, Ordering::Relaxed);
    *lock(&peer.last_heard) = Some(Instant::now());
    info!(sibling = %addr, "siblings: connected; taking its pins");
    let mut s = tokio::io::BufReader::with_capacity(1 << 16, s);
    let mut bucket = Bucket::new(state.cfg.max_records_per_second);
    let mut buf = Vec::new();
    // A digest set and a verdict set as they come, until their end.
    let (mut pending, mut pending_health) = (Digests::new(), Vec::new());
    loop {
        let kind = tokio::time::timeout(SILENCE, wire::read_frame(&mut s, &mut session, &mut buf))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "nothing heard"))??;
        *lock(&peer.last_heard) = Some(Instant::now());
        match kind {
            Kind::Keepalive => {}
            Kind::InSync => {
                if !peer.in_sync.swap(true, Ordering::Relaxed) {
                    info!(sibling = %addr, "siblings: in sync");
                }
            }
            Kind::Records => take(state, &buf, &mut bucket),
            Kind::Digests => {
                for r in buf.chunks_exact(RECORD_LEN) {
                    if let Some((tag, e)) = agree::decode(r) {
                        pending.insert(tag, e);
                    }
                }
                if pending.len() > agree::MAX_SERVICES {
                    return Err(std::io::Error::other(format!("a digest set of more than {} services", agree::MAX_SERVICES)).into());
                }
            }
            Kind::DigestsEnd => {
                *lock(&peer.digests) = Some(Arc::new(std::mem::take(&mut pending)));
                state.agree_dirty.store(true, Ordering::Relaxed);
            }
            Kind::Health => {
                pending_health.extend(buf.chunks_exact(RECORD_LEN).filter_map(|r| <[u8; RECORD_LEN]>::try_from(r).ok()));
                if pending_health.len() > agree::MAX_SERVICES {
                    return Err(std::io::Error::other(format!("more than {} health verdicts", agree::MAX_SERVICES)).into());
                }
            }
            Kind::HealthEnd => {
                *lock(&peer.health) = Some(Arc::new(std::mem::take(&mut pending_health)));
                state.health_dirty.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// Whether a handshake's failure is the listener closing it (what one of
/// an older version does with a newer dialer).
fn closed_in_handshake(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset)
}

/// What the run loop keeps for the fleet: this appliance's digests, the
/// last comparison, the names verdicts go by, and the verdicts' channels.
struct Fleet {
    own: Own,
    agreement: Agreement,
    names: Names,
    own_health: Option<watch::Receiver<Ejected>>,
    siblings_health: Option<watch::Sender<Ejected>>,
}

impl Fleet {
    /// Takes a publication's snapshot: its numbering, its digests, and the
    /// names the health verdicts go by (this appliance's are encoded
    /// again, the siblings' taken again).
    fn follow(&mut self, state: &State, snap: &Snapshot) {
        *lock(&state.numbering) = Arc::new(Numbering::of(snap));
        follow_digests(state, &mut self.own, snap);
        self.names = Names::of(snap);
        self.own_verdicts(state, true);
        state.health_dirty.store(true, Ordering::Relaxed);
    }

    /// This appliance's verdicts changed (`open`: their channel is still open).
    fn own_verdicts(&mut self, state: &State, open: bool) {
        if !open {
            self.own_health = None;
        }
        if let Some(h) = self.own_health.as_mut() {
            put_set(state, HEALTH, self.names.encode(&h.borrow_and_update()));
        }
    }

    /// Takes the siblings' verdicts and compares the digests again when
    /// they changed; true when it did either.
    fn round(&mut self, state: &State) -> bool {
        let health = state.health_dirty.swap(false, Ordering::Relaxed);
        if health {
            if let Some(tx) = &self.siblings_health {
                let (taken, unknown) = siblings_verdicts(state, &self.names);
                state.counters.health_unknown.store(unknown, Ordering::Relaxed);
                lock(&state.health_taken).clone_from(&taken);
                tx.send_if_modified(|old| {
                    if *old == taken {
                        false
                    } else {
                        *old = taken;
                        true
                    }
                });
            }
        }
        let agree = state.agree_dirty.swap(false, Ordering::Relaxed);
        if agree {
            self.agreement.compare(state, &self.own);
        }
        health || agree
    }
}

/// Waits for this appliance's next health verdicts; never, without them.
async fn changed_ejected(h: Option<&mut watch::Receiver<Ejected>>) -> Result<(), watch::error::RecvError> {
    match h {
        Some(h) => h.changed().await,
        None => std::future::pending().await,
    }
}

/// Replaces set `k` to send when it differs, waking every connection.
fn put_set(state: &State, k: usize, records: Vec<[u8; RECORD_LEN]>) {
    let mut hub = lock(&state.hub);
    if *hub.sets[k].records == records {
        return;
    }
    hub.sets[k].records = Arc::new(records);
    hub.sets[k].version += 1;
    for o in &hub.outboxes {
        o.notify.notify_one();
    }
}

/// The connected siblings' verdicts that name endpoints of this snapshot,
/// and how many do not.
fn siblings_verdicts(state: &State, names: &Names) -> (Ejected, u64) {
    let sets: Vec<Arc<Vec<[u8; RECORD_LEN]>>> =
        lock(&state.peers).iter().filter(|(_, p)| p.connected.load(Ordering::Relaxed)).filter_map(|(_, p)| lock(&p.health).clone()).collect();
    let mut taken = Ejected::new();
    let unknown: usize = sets.iter().map(|s| names.take(s, &mut taken)).sum();
    (taken, unknown as u64)
}

/// Hashes the tables of `snap` built again; when a digest changed, the
/// set to send is replaced, every connection is woken, and the
/// comparison is made again.
fn follow_digests(state: &State, own: &mut Own, snap: &Snapshot) {
    if !own.follow(snap, now_unix_ms()) {
        return;
    }
    put_set(state, DIGESTS, own.set.iter().map(|(tag, e)| agree::encode(*tag, e)).collect());
    state.agree_dirty.store(true, Ordering::Relaxed);
}

/// Milliseconds since the epoch (a digest's date, compared between
/// appliances: their clocks are assumed synchronised, as BGP's and the
/// logs' are).
#[allow(clippy::cast_possible_truncation)] // until the year 584 million
fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The last comparison with the siblings, since when each service has been
/// in the minority, and which services were ever compared outside it.
#[derive(Debug, Default)]
struct Agreement {
    /// Own services compared, and siblings with a set.
    services: usize,
    compared: usize,
    mismatched: Vec<Mismatch>,
    minority_since: HashMap<String, Instant>,
    /// Own services that agreed with a sibling at least once since this
    /// appliance started ([`Agreement::note_agreed`]; while they are its
    /// own).
    agreed: HashSet<String>,
}

impl Agreement {
    /// Compares `own` with every connected peer's last set.
    fn compare(&mut self, state: &State, own: &Own) {
        let sets: Vec<(String, Arc<Digests>)> = lock(&state.peers)
            .iter()
            .filter(|(_, p)| p.connected.load(Ordering::Relaxed))
            .filter_map(|(a, p)| lock(&p.digests).clone().map(|d| (a.to_string(), d)))
            .collect();
        let peers: Vec<agree::PeerSet<'_>> = sets.iter().map(|(a, d)| (a.as_str(), &**d)).collect();
        self.mismatched = agree::compare(&own.set, &own.names, &state.cfg.listen.to_string(), &peers);
        self.services = own.set.len();
        self.compared = peers.len();
        let now = Instant::now();
        let before = std::mem::take(&mut self.minority_since);
        for m in self.mismatched.iter().filter(|m| m.minority) {
            let since = before.get(&m.service).copied().unwrap_or(now);
            self.minority_since.insert(m.service.clone(), since);
        }
        self.note_agreed(&own.names);
    }

    /// Notes the services of `names` that agree with a sibling: the same
    /// digest as every sibling compared that has the service, or as one at
    /// least and not in the minority (the larger group, not the newer of two
    /// alike); forgets those no longer here.
    fn note_agreed(&mut self, names: &HashMap<u32, String>) {
        let here: HashSet<&String> = names.values().collect();
        self.agreed.retain(|s| here.contains(s));
        if self.compared == 0 {
            return;
        }
        let mismatched: HashMap<&String, &Mismatch> = self.mismatched.iter().map(|m| (&m.service, m)).collect();
        for name in here {
            let agrees = mismatched.get(name).is_none_or(|m| !m.minority && m.agree >= 2);
            if agrees && !self.agreed.contains(name) {
                self.agreed.insert(name.clone());
            }
        }
    }

    /// The services whose VIPs are withdrawn at `now`: in the minority for
    /// [`agree::GATE_AFTER`] at least, or at once for a service that never
    /// agreed with a sibling since this appliance started (it starts with
    /// another configuration than its siblings': it never announces that
    /// service; the wait is for a rollout, where the siblings take the same
    /// change a moment apart).
    fn gated(&self, now: Instant) -> BTreeMap<String, String> {
        self.mismatched
            .iter()
            .filter(|m| self.minority_since.get(&m.service).is_some_and(|t| !self.agreed.contains(&m.service) || now.duration_since(*t) >= agree::GATE_AFTER))
            .map(|m| (m.service.clone(), why_minority(m)))
            .collect()
    }

    fn status(&self, gate: bool, now: Instant) -> sluice_admin_api::sync::Agreement {
        let gated = if gate { self.gated(now) } else { BTreeMap::new() };
        sluice_admin_api::sync::Agreement {
            services: self.services as u64,
            siblings_compared: self.compared as u64,
            mismatched: self.mismatched.len() as u64,
            minority: self.mismatched.iter().filter(|m| m.minority).count() as u64,
            gate,
            withdrawn: gated.len() as u64,
            services_mismatched: self
                .mismatched
                .iter()
                .take(agree::MAX_LISTED)
                .map(|m| sluice_admin_api::sync::Mismatch {
                    service: m.service.clone(),
                    digest: agree::hex(&m.digest),
                    differ: m.differ.clone(),
                    absent: m.absent.clone(),
                    agree: m.agree as u64,
                    minority: m.minority,
                    withdrawn: gated.contains_key(&m.service),
                    why: why_minority(m),
                })
                .collect(),
        }
    }
}

/// A mismatch in words.
fn why_minority(m: &Mismatch) -> String {
    let short = |d: &agree::Digest| agree::hex(d)[..12].to_owned();
    let others = match m.largest {
        Some((n, d)) => format!("; the largest other group: {n} with {}", short(&d)),
        None => String::new(),
    };
    let absent = if m.absent.is_empty() { String::new() } else { format!("; not served by {}", m.absent.join(", ")) };
    let side = if m.minority { "in the minority" } else { "not in the minority" };
    format!(
        "service {}'s table ({}) differs from {} ({} appliance(s) with this table, itself included{others}{absent}): {side}",
        m.service,
        short(&m.digest),
        if m.differ.is_empty() { "no sibling".to_owned() } else { m.differ.join(", ") },
        m.agree
    )
}

/// Takes a frame's records: the rate bound, then translation.
fn take(state: &State, records: &[u8], bucket: &mut Bucket) {
    let n = records.len() / RECORD_LEN;
    add(&state.counters.received, n as u64);
    let ok = bucket.take(n);
    add(&state.counters.rate_dropped, (n - ok) as u64);
    let numbering = state.numbering();
    let now_ms = state.now_ms();
    let (mut unknown, mut pins) = (0u64, Vec::with_capacity(ok));
    for chunk in records.chunks_exact(RECORD_LEN).take(ok) {
        let Ok(r) = PinRecord::decode(chunk) else {
            unknown += 1;
            continue;
        };
        if numbering.inbound(&r).is_none() {
            unknown += 1;
        }
        pins.push((map_key(&r.key()), (r, now_ms + 1000 * u64::from(r.lifetime))));
    }
    add(&state.counters.unknown, unknown);
    if !pins.is_empty() {
        let mut inbox = lock(&state.inbox);
        inbox.pins.extend(pins);
        inbox.dirty = true;
    }
}

#[cfg(test)]
mod tests;

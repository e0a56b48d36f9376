//! Event-driven next-hop resolution: a reconciler that keeps exactly the
//! wanted next hops as "managed" neighbour entries in the kernel and
//! publishes their MACs as soon as the kernel learns or loses them.
//!
//! Desired state is the set of `(port index, address)` pairs given to
//! [`Neighbours::want`]. The task makes every wanted pair a managed entry
//! (`NTF_EXT_MANAGED`, Linux >= 5.16: the kernel resolves it on its own,
//! keeps re-probing it and never lets it age out) on the port's kernel
//! interface, and deletes managed entries on those interfaces that are no
//! longer wanted (also leftovers of an earlier run). A static (permanent)
//! entry for a wanted pair is left alone: it is resolved already.
//!
//! The entries are also marked externally learned (`NTF_EXT_LEARNED`):
//! the kernel then keeps them out of its garbage collection and out of
//! the count that `gc_thresh3` limits. That limit is one for the whole
//! host (every network namespace shares it, and only the initial one can
//! change it; 1024 by default), so entries counted against it would cap
//! the next hops at about a thousand and, near the cap, starve the host's
//! own neighbours. Sluice's entries are bounded by its configuration
//! (`capacity.endpoints`) instead; the host's limit keeps guarding what
//! traffic makes the kernel learn. The kernel still resolves and
//! re-probes these entries, and takes a new MAC from ARP/ND as usual.
//!
//! Observed state comes from a netlink socket subscribed to the kernel's
//! neighbour and link groups: a dump when the socket is opened, then
//! notifications. A notification only names the entry that changed; the
//! task reads that entry back (one `RTM_GETNEIGH`, or one dump when a
//! batch names more than [`DUMP_ABOVE`] entries), so what it holds is
//! never older than the notification, whatever the order of dump and
//! notifications. Requests, dumps included, go over a second socket that
//! nothing is broadcast to (see [`Conn`]). A lost notification (socket
//! buffer overrun) or a change of the ports' interfaces (created, deleted,
//! renamed) makes it dump everything again; a socket error makes it open
//! new sockets and start over.
//!
//! Invariants: adds and deletes are idempotent (add is a replace, delete
//! of a missing entry succeeds); failed ones are retried with a growing
//! delay (100 ms to 5 s); the published map holds exactly the
//! wanted pairs whose entry has a MAC and is not INCOMPLETE/FAILED, and is
//! sent only when it changes.
//!
//! Failures are reported once per condition, not once per entry nor per
//! retry: a pass logs one line with the first failure and the count, and
//! only when that differs from what was last said. A full neighbour table
//! (ENOBUFS: the kernel's `gc_thresh3` reached, a limit of the whole host)
//! is said once, with the limit and its remedy, until every entry fits
//! again.
//!
//! Requests are pipelined ([`IN_FLIGHT`] at a time on the one socket), and
//! reading many entries back is one dump: 100,000 next hops are added and
//! read in seconds.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::time::Duration;

use futures_channel::mpsc::UnboundedReceiver;
use futures_util::{StreamExt, TryStreamExt};
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourExtFlags, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::sys::AsyncSocket;
use rtnetlink::{Handle, MulticastGroup};
use sluice_dataplane::addr::Addr;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{errno, RoutingError};

pub use crate::compile::NeighMap;

/// A neighbour entry: interface index and address.
type Key = (u32, Addr);

/// Delay before the first retry of a failed add or delete, or reconnect.
const RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest delay between retries.
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Requests (adds, deletes, reads) the task keeps in flight on its socket,
/// so that a pass over 100,000 next hops costs seconds, not a round trip
/// after another.
const IN_FLIGHT: usize = 64;
/// More entries to read back than this: one dump of the table instead.
const DUMP_ABOVE: usize = 1024;
/// Receive buffer asked for the notifications' socket, in bytes (the kernel
/// doubles it for its bookkeeping): room for tens of thousands of
/// notifications, as many next hops resolving at once send, while the task
/// is busy. It only holds memory while notifications wait in it.
const NOTIFY_BUFFER: usize = 32 << 20;

/// The host's limit on neighbour entries of `v4`'s family
/// (`net.ipv{4,6}.neigh.default.gc_thresh3`), when this network namespace
/// can read it (the kernel shows it in the initial namespace only).
pub(super) fn table_limit(v4: bool) -> Option<u64> {
    std::fs::read_to_string(limit_sysctl(v4).1).ok()?.trim().parse().ok()
}

/// The sysctl that limits the neighbour table of `v4`'s family, by name and path.
pub(super) fn limit_sysctl(v4: bool) -> (&'static str, &'static str) {
    if v4 {
        ("net.ipv4.neigh.default.gc_thresh3", "/proc/sys/net/ipv4/neigh/default/gc_thresh3")
    } else {
        ("net.ipv6.neigh.default.gc_thresh3", "/proc/sys/net/ipv6/neigh/default/gc_thresh3")
    }
}

/// What the kernel says about one neighbour entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Link-layer address, if the entry has a 6-byte one.
    pub(crate) mac: Option<[u8; 6]>,
    /// NUD state.
    pub(crate) state: NeighbourState,
    /// `NTF_EXT_MANAGED` is set.
    pub(crate) managed: bool,
    /// `NTF_EXT_LEARNED` is set (the entry is outside the kernel's
    /// garbage collection and its `gc_thresh3` count).
    pub(crate) learned: bool,
}

impl Entry {
    /// The MAC, if the kernel considers it usable and it is a unicast one
    /// (a static entry may say `ff:ff:ff:ff:ff:ff` or a multicast MAC:
    /// sending a backend's flows there would reach every host).
    fn resolved(&self) -> Option<[u8; 6]> {
        match self.state {
            NeighbourState::Reachable
            | NeighbourState::Stale
            | NeighbourState::Delay
            | NeighbourState::Probe
            | NeighbourState::Permanent
            | NeighbourState::Noarp => self.mac.filter(|&m| crate::config::fields::not_unicast(m).is_none()),
            _ => None,
        }
    }
}

fn ip_of(a: &NeighbourAddress) -> Option<Addr> {
    match a {
        NeighbourAddress::Inet(v4) => Some(Addr::from(*v4)),
        NeighbourAddress::Inet6(v6) => Some(Addr::from(*v6)),
        _ => None,
    }
}

/// The entry an IPv4/IPv6 neighbour message describes (`None` for other
/// families, proxy entries and messages without a destination).
pub(crate) fn decode(m: &NeighbourMessage) -> Option<(Key, Entry)> {
    if !matches!(m.header.family, AddressFamily::Inet | AddressFamily::Inet6)
        || m.header.flags.contains(NeighbourFlags::Proxy)
    {
        return None;
    }
    let mut dst = None;
    let mut mac = None;
    let mut managed = false;
    for a in &m.attributes {
        match a {
            NeighbourAttribute::Destination(d) => dst = ip_of(d),
            NeighbourAttribute::LinkLayerAddress(l) => mac = <[u8; 6]>::try_from(l.as_slice()).ok(),
            NeighbourAttribute::ExtFlags(f) => managed = f.contains(NeighbourExtFlags::Managed),
            _ => {}
        }
    }
    let learned = m.header.flags.contains(NeighbourFlags::ExtLearned);
    Some(((m.header.ifindex, dst?), Entry { mac, state: m.header.state, managed, learned }))
}

/// The interface index of each wanted pair (pairs of ports without a
/// present interface are left out).
fn wanted_keys(wanted: &HashSet<(u8, Addr)>, index: &[Option<u32>]) -> HashSet<Key> {
    wanted.iter().filter_map(|&(port, addr)| Some((index.get(usize::from(port)).copied().flatten()?, addr))).collect()
}

/// What a reconcile pass has to do.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Entries to make managed and externally learned.
    pub(crate) add: Vec<Key>,
    /// Managed entries to delete.
    pub(crate) del: Vec<Key>,
}

/// The difference between the wanted pairs and the kernel's entries on the
/// ports' interfaces (`observed` holds only those), in a stable order. A
/// managed entry that is not externally learned (made by an older Sluice)
/// is added again, so that it leaves the `gc_thresh3` count.
pub(crate) fn plan(wanted: &HashSet<(u8, Addr)>, index: &[Option<u32>], observed: &HashMap<Key, Entry>) -> Plan {
    let want = wanted_keys(wanted, index);
    let mut add: Vec<Key> = want
        .iter()
        .filter(|k| observed.get(k).is_none_or(|e| !(e.managed && e.learned) && e.state != NeighbourState::Permanent))
        .copied()
        .collect();
    let mut del: Vec<Key> = observed.iter().filter(|(k, e)| e.managed && !want.contains(k)).map(|(k, _)| *k).collect();
    add.sort_unstable();
    del.sort_unstable();
    Plan { add, del }
}

/// The MACs of the wanted pairs the kernel has resolved.
pub(crate) fn resolve(wanted: &HashSet<(u8, Addr)>, index: &[Option<u32>], observed: &HashMap<Key, Entry>) -> NeighMap {
    wanted
        .iter()
        .filter_map(|&(port, addr)| {
            let ifindex = index.get(usize::from(port)).copied().flatten()?;
            Some(((port, addr), observed.get(&(ifindex, addr))?.resolved()?))
        })
        .collect()
}

/// Interface index of each port whose interface `links` contains.
fn index_ports(names: &[String], links: &[LinkMessage]) -> Vec<Option<u32>> {
    names
        .iter()
        .map(|name| {
            if name.is_empty() {
                return None;
            }
            links.iter().find(|l| link_name(l) == Some(name.as_str())).map(|l| l.header.index)
        })
        .collect()
}

fn link_name(l: &LinkMessage) -> Option<&str> {
    l.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.as_str()),
        _ => None,
    })
}

/// True if a link notification changes which index a port's interface has.
fn link_moves_ports(names: &[String], index: &[Option<u32>], link: &LinkMessage, deleted: bool) -> bool {
    let name = link_name(link);
    names.iter().zip(index).any(|(n, &i)| {
        let ours_now = !deleted && !n.is_empty() && name == Some(n.as_str());
        let ours_before = i == Some(link.header.index);
        ours_now != ours_before
    })
}

fn family_of(addr: Addr) -> AddressFamily {
    if addr.is_v4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

/// A neighbour message naming entry `key` (for delete and get).
fn key_message((ifindex, addr): Key) -> NeighbourMessage {
    let mut m = NeighbourMessage::default();
    m.header.family = family_of(addr);
    m.header.ifindex = ifindex;
    let dst = match addr.to_ip() {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    };
    m.attributes.push(NeighbourAttribute::Destination(dst));
    m
}

/// The task's own netlink connections: one socket for its requests, one
/// subscribed to notifications. Dropping it stops both connection tasks.
///
/// Requests never share the notifications' socket: when notifications
/// overrun a socket's receive buffer (100,000 entries resolving at once
/// send far more than it holds) the kernel also drops the answers it
/// sends to that socket, and a request whose acknowledgement was dropped
/// waits for ever. The request socket receives only answers, at most
/// [`IN_FLIGHT`] requests' worth (a dump's parts the kernel sends as
/// room frees up), so it never overruns; an overrun of the other one
/// loses notifications only, and costs a dump.
struct Conn {
    handle: Handle,
    events: UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, rtnetlink::sys::SocketAddr)>,
    drivers: [JoinHandle<()>; 2],
}

impl Drop for Conn {
    fn drop(&mut self) {
        for d in &self.drivers {
            d.abort();
        }
    }
}

impl Conn {
    /// Opens the request socket and one subscribed to neighbour and link
    /// notifications, in the calling thread's network namespace; must run
    /// inside a runtime.
    fn open() -> Result<Conn, RoutingError> {
        let (mut listener, _unused, events) =
            rtnetlink::new_multicast_connection(&[MulticastGroup::Neigh, MulticastGroup::Link])
                .map_err(RoutingError::Socket)?;
        let socket = listener.socket_mut().socket_ref();
        // Beyond `net.core.rmem_max` when privileged (as `sluice run` is);
        // else as far as that limit allows.
        if let Err(e) = rustix::net::sockopt::set_socket_recv_buffer_size_force(socket, NOTIFY_BUFFER) {
            debug!(error = %e, "SO_RCVBUFFORCE refused; the notifications' buffer stays within net.core.rmem_max");
            socket.set_rx_buf_sz(NOTIFY_BUFFER).map_err(RoutingError::Socket)?;
        }
        let (requester, handle, _unsolicited) = rtnetlink::new_connection().map_err(RoutingError::Socket)?;
        Ok(Conn { handle, events, drivers: [tokio::spawn(listener), tokio::spawn(requester)] })
    }
}

/// The kernel's view, as far as the ports' interfaces go.
struct View {
    /// Interface index of each port (by port index).
    index: Vec<Option<u32>>,
    /// Entries on those interfaces.
    observed: HashMap<Key, Entry>,
    /// When to retry failed adds and deletes.
    retry: Option<Instant>,
    backoff: Duration,
    /// Ports already reported as lacking their interface.
    missing_reported: HashSet<u8>,
    /// Times the table was read again after lost notifications or a
    /// change of the ports' interfaces (the first is logged).
    resyncs: u64,
}

/// Per family (v4, v6) whose neighbour table is full in a pass: how many
/// entries it took in that pass, and how many it did not.
type TableFull = [Option<(usize, usize)>; 2];

/// Why a session ended.
enum Exit {
    /// The handle was dropped.
    Stopped,
    /// The connection failed; start a new one.
    Lost(String),
}

type Barrier = oneshot::Sender<Result<(), RoutingError>>;

struct Task {
    names: Vec<String>,
    wanted: watch::Receiver<HashSet<(u8, Addr)>>,
    barriers: mpsc::UnboundedReceiver<Barrier>,
    out: watch::Sender<NeighMap>,
    /// What was last said about failures (so that it is said once).
    said: Said,
}

/// The failures last reported.
#[derive(Debug, Default, PartialEq, Eq)]
struct Said {
    /// The neighbour table was full, for these families (v4, v6).
    full: (bool, bool),
    /// Other failures: their count and the first one's text.
    other: Option<(usize, String)>,
}

impl Task {
    async fn run(mut self, first: Conn) {
        let mut conn = Some(first);
        let mut backoff = RETRY_MIN;
        loop {
            let c = match conn.take() {
                Some(c) => c,
                None => match Conn::open() {
                    Ok(c) => c,
                    Err(e) => {
                        warn!(error = %e, "neighbour resolution: cannot reopen the netlink socket");
                        if !self.pause(backoff).await {
                            return;
                        }
                        backoff = (backoff * 2).min(RETRY_MAX);
                        continue;
                    }
                },
            };
            match self.session(c, &mut backoff).await {
                Exit::Stopped => return,
                Exit::Lost(why) => warn!(reason = %why, "neighbour resolution lost its netlink socket; reconnecting"),
            }
            if !self.pause(backoff).await {
                return;
            }
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }

    /// Waits `d` while disconnected, failing barriers; false if stopped.
    async fn pause(&mut self, d: Duration) -> bool {
        let sleep = tokio::time::sleep(d);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => return true,
                b = self.barriers.recv() => match b {
                    Some(tx) => {
                        let _ = tx.send(Err(RoutingError::Disconnected));
                    }
                    None => return false,
                },
            }
        }
    }

    async fn session(&mut self, mut c: Conn, backoff: &mut Duration) -> Exit {
        let mut v = View {
            index: vec![None; self.names.len()],
            observed: HashMap::new(),
            retry: None,
            backoff: RETRY_MIN,
            missing_reported: HashSet::new(),
            resyncs: 0,
        };
        if let Err(e) = self.resync(&c.handle, &mut v).await {
            return Exit::Lost(e.to_string());
        }
        *backoff = RETRY_MIN;
        if let Err(lost) = self.reconcile(&c.handle, &mut v, true).await {
            return lost;
        }
        loop {
            let retry_at = v.retry;
            let retry = async move {
                match retry_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = c.events.next() => {
                    let Some((first, _)) = ev else { return Exit::Lost("the netlink socket closed".into()) };
                    let mut batch = vec![first];
                    while let Ok((m, _)) = c.events.try_recv() {
                        batch.push(m);
                    }
                    if let Err(lost) = self.absorb(&c.handle, &mut v, batch).await {
                        return lost;
                    }
                    // Failed work waits for its retry time, so that the
                    // notifications it causes do not make a busy loop.
                    let full = v.retry.is_none();
                    if let Err(lost) = self.reconcile(&c.handle, &mut v, full).await {
                        return lost;
                    }
                }
                changed = self.wanted.changed() => {
                    if changed.is_err() {
                        return Exit::Stopped;
                    }
                    if let Err(lost) = self.reconcile(&c.handle, &mut v, true).await {
                        return lost;
                    }
                }
                b = self.barriers.recv() => {
                    let Some(tx) = b else { return Exit::Stopped };
                    match self.reconcile(&c.handle, &mut v, true).await {
                        Ok(result) => {
                            let _ = tx.send(result);
                        }
                        Err(lost) => {
                            let _ = tx.send(Err(RoutingError::Disconnected));
                            return lost;
                        }
                    }
                }
                () = retry => {
                    if let Err(lost) = self.reconcile(&c.handle, &mut v, true).await {
                        return lost;
                    }
                }
            }
        }
    }

    /// Reads the ports' interface indices and every neighbour entry on
    /// those interfaces.
    async fn resync(&self, h: &Handle, v: &mut View) -> Result<(), rtnetlink::Error> {
        let links: Vec<LinkMessage> = h.link().get().execute().try_collect().await?;
        v.index = index_ports(&self.names, &links);
        self.resync_neighbours(h, v).await
    }

    /// Reads every neighbour entry on the ports' interfaces.
    async fn resync_neighbours(&self, h: &Handle, v: &mut View) -> Result<(), rtnetlink::Error> {
        v.observed.clear();
        let ours: HashSet<u32> = v.index.iter().flatten().copied().collect();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let entries: Vec<NeighbourMessage> =
                h.neighbours().get().set_address_family(family).execute().try_collect().await?;
            for (key, entry) in entries.iter().filter_map(decode) {
                if ours.contains(&key.0) {
                    v.observed.insert(key, entry);
                }
            }
        }
        debug!(entries = v.observed.len(), index = ?v.index, "neighbour table read");
        Ok(())
    }

    /// Makes `key` a managed, externally learned entry (a replace).
    async fn add(h: &Handle, key: Key) -> Result<(), rtnetlink::Error> {
        let mut req = h
            .neighbours()
            .add(key.0, key.1.to_ip())
            .state(NeighbourState::None)
            .flags(NeighbourFlags::ExtLearned)
            .replace();
        req.message_mut().attributes.push(NeighbourAttribute::ExtFlags(NeighbourExtFlags::Managed));
        req.execute().await
    }

    /// Reads entry `key` back from the kernel (`None`: it has none).
    async fn read_back(mut h: Handle, key: Key) -> Result<Option<Entry>, rtnetlink::Error> {
        let mut req = NetlinkMessage::from(RouteNetlinkMessage::GetNeighbour(key_message(key)));
        req.header.flags = NLM_F_REQUEST;
        let mut answers = h.request(req)?;
        let mut found = None;
        while let Some(m) = answers.next().await {
            match m.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNeighbour(n)) => {
                    found = decode(&n).filter(|(k, _)| *k == key).map(|(_, e)| e);
                }
                NetlinkPayload::Error(e) if e.code.is_some() => {
                    let e = rtnetlink::Error::NetlinkError(e);
                    if errno(&e) != Some(libc::ENOENT) {
                        return Err(e);
                    }
                }
                _ => {}
            }
        }
        Ok(found)
    }

    /// Reads entries `keys` back from the kernel, [`IN_FLIGHT`] requests
    /// at a time; past [`DUMP_ABOVE`] entries one dump of the table costs
    /// less than a request each. Either answer is newer than the
    /// notifications that named the keys.
    async fn refresh(&self, h: &Handle, v: &mut View, keys: Vec<Key>) -> Result<(), Exit> {
        if keys.len() > DUMP_ABOVE {
            return self.resync_neighbours(h, v).await.map_err(|e| Exit::Lost(format!("reading the neighbour table back: {e}")));
        }
        let mut answers = futures_util::stream::iter(keys)
            .map(|key| {
                let h = h.clone();
                async move { (key, Self::read_back(h, key).await) }
            })
            .buffer_unordered(IN_FLIGHT);
        while let Some((key, answer)) = answers.next().await {
            match answer.map_err(|e| Exit::Lost(format!("reading neighbour {} back: {e}", key.1)))? {
                Some(e) => v.observed.insert(key, e),
                None => v.observed.remove(&key),
            };
        }
        Ok(())
    }

    /// Takes in a batch of notifications.
    async fn absorb(
        &self,
        h: &Handle,
        v: &mut View,
        batch: Vec<NetlinkMessage<RouteNetlinkMessage>>,
    ) -> Result<(), Exit> {
        let mut resync = false;
        let mut keys = HashSet::new();
        for m in batch {
            match m.payload {
                NetlinkPayload::Overrun(_) => {
                    resync = true;
                }
                NetlinkPayload::InnerMessage(
                    RouteNetlinkMessage::NewNeighbour(n) | RouteNetlinkMessage::DelNeighbour(n),
                ) => {
                    if let Some((key, _)) = decode(&n) {
                        if v.index.contains(&Some(key.0)) {
                            keys.insert(key);
                        }
                    }
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => {
                    resync |= link_moves_ports(&self.names, &v.index, &l, false);
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(l)) => {
                    resync |= link_moves_ports(&self.names, &v.index, &l, true);
                }
                _ => {}
            }
        }
        if resync {
            v.resyncs += 1;
            if v.resyncs == 1 {
                info!("neighbour notifications were lost (socket buffer full) or a port's interface changed; reading the table again");
            } else {
                debug!(times = v.resyncs, "reading the neighbour table again");
            }
            return self.resync(h, v).await.map_err(|e| Exit::Lost(e.to_string()));
        }
        self.refresh(h, v, keys.into_iter().collect()).await
    }

    /// Says what failed in a pass, once per condition: a full table with
    /// its limit and remedy, the other failures as one line.
    fn report(&mut self, wanted: &HashSet<(u8, Addr)>, v: &View, table_full: &[Option<(usize, usize)>; 2], errors: &[RoutingError]) {
        for (fam, full) in table_full.iter().enumerate() {
            let v4 = fam == 0;
            let was = if v4 { &mut self.said.full.0 } else { &mut self.said.full.1 };
            match full {
                Some((_, left)) if !*was => {
                    *was = true;
                    let want = wanted.iter().filter(|(_, a)| a.is_v4() == v4).count();
                    let in_table = v.observed.iter().filter(|((_, a), _)| a.is_v4() == v4).count();
                    let (name, _) = limit_sysctl(v4);
                    let limit = table_limit(v4).map_or_else(|| "not readable from this network namespace".to_owned(), |l| l.to_string());
                    warn!(
                        next_hops = want,
                        in_table,
                        not_added = left,
                        %limit,
                        "the kernel's neighbour table is full (ENOBUFS): next hops beyond it stay unresolved and their endpoints unused; \
                         the limit is {name}, for the whole host: raise it (and gc_thresh1/gc_thresh2 below it) above {want} plus the host's \
                         other neighbours, e.g. sysctl -w {name}={}",
                        (want * 2).next_power_of_two().max(1024)
                    );
                }
                None if *was => {
                    *was = false;
                    info!(ipv4 = v4, "the neighbour table has room again: every next hop of this family has its entry");
                }
                _ => {}
            }
        }
        let other: Vec<&RoutingError> = errors.iter().filter(|e| e.errno() != Some(libc::ENOBUFS)).collect();
        let now = other.first().map(|e| (other.len(), e.to_string()));
        if now != self.said.other {
            if let Some((n, first)) = &now {
                warn!(failed = n, first = %first, retry_in = ?v.backoff, "neighbour resolution: adds or deletes failed; retrying");
            } else {
                info!("neighbour resolution: the failed adds and deletes went through");
            }
            self.said.other = now;
        }
    }

    fn iface(&self, v: &View, ifindex: u32) -> &str {
        v.index.iter().position(|&i| i == Some(ifindex)).and_then(|p| self.names.get(p)).map_or("?", String::as_str)
    }

    /// Warns, once per port, that the wanted next hops of a port whose
    /// kernel interface does not exist cannot be resolved.
    fn report_missing_interfaces(&self, wanted: &HashSet<(u8, Addr)>, v: &mut View) {
        for &(port, addr) in wanted {
            let known = self.names.get(usize::from(port)).filter(|n| !n.is_empty());
            if let Some(name) = known {
                if v.index[usize::from(port)].is_none() && v.missing_reported.insert(port) {
                    warn!(port, interface = %name, next_hop = %addr, "next hop cannot be resolved: the port's kernel interface does not exist");
                }
            }
        }
    }

    /// Adds the entries `add`, [`IN_FLIGHT`] requests at a time, and pushes
    /// each failure on `errors`. Returns the entries added and, per family
    /// whose table is full, how many entries it took and how many it did not.
    async fn add_entries(&self, h: &Handle, v: &View, add: Vec<Key>, errors: &mut Vec<RoutingError>) -> (TableFull, Vec<Key>) {
        let mut table_full: TableFull = [None, None];
        let mut added = [0usize; 2];
        let mut adds = futures_util::stream::iter(add)
            .map(|key| {
                let h = h.clone();
                async move { (key, Self::add(&h, key).await) }
            })
            .buffer_unordered(IN_FLIGHT);
        let mut done = Vec::new();
        while let Some((key, result)) = adds.next().await {
            let fam = usize::from(!key.1.is_v4());
            let op = format!("adding managed neighbour {}", key.1);
            match result {
                Ok(()) => {
                    added[fam] += 1;
                    done.push(key);
                }
                Err(e) => {
                    if errno(&e) == Some(libc::ENOBUFS) {
                        table_full[fam].get_or_insert((0, 0)).1 += 1;
                    }
                    errors.push(RoutingError::netlink(self.iface(v, key.0), op, e));
                }
            }
        }
        drop(adds);
        for (fam, full) in table_full.iter_mut().enumerate() {
            if let Some(f) = full {
                f.0 = added[fam];
            }
        }
        (table_full, done)
    }

    /// Deletes the entries `del`, [`IN_FLIGHT`] requests at a time: an
    /// entry deleted or already gone is forgotten, any other failure is
    /// pushed on `errors`.
    async fn delete_entries(&self, h: &Handle, v: &mut View, del: Vec<Key>, errors: &mut Vec<RoutingError>) {
        let mut dels = futures_util::stream::iter(del)
            .map(|key| {
                let h = h.clone();
                async move { (key, h.neighbours().del(key_message(key)).execute().await) }
            })
            .buffer_unordered(IN_FLIGHT);
        while let Some((key, result)) = dels.next().await {
            match result {
                Err(e) if errno(&e) != Some(libc::ENOENT) => {
                    errors.push(RoutingError::netlink(self.iface(v, key.0), format!("deleting managed neighbour {}", key.1), e));
                }
                _ => {
                    v.observed.remove(&key);
                }
            }
        }
        drop(dels);
    }

    /// One pass: adds and deletes what differs (unless `full` is false),
    /// then publishes. `Ok` carries the pass's outcome; `Err` means the
    /// connection is unusable.
    async fn reconcile(&mut self, h: &Handle, v: &mut View, full: bool) -> Result<Result<(), RoutingError>, Exit> {
        let wanted = self.wanted.borrow_and_update().clone();
        self.report_missing_interfaces(&wanted, v);
        let mut errors = Vec::new();
        if full {
            let p = plan(&wanted, &v.index, &v.observed);
            let (table_full, done) = self.add_entries(h, v, p.add, &mut errors).await;
            self.refresh(h, v, done.clone()).await?;
            for key in done {
                if !v.observed.get(&key).is_some_and(|e| e.managed && e.learned) {
                    errors.push(RoutingError::Unexpected {
                        iface: self.iface(v, key.0).to_owned(),
                        op: format!("adding managed neighbour {}", key.1),
                        what: "the entry is not managed and externally learned (NTF_EXT_MANAGED needs Linux 5.16 or later)".into(),
                    });
                }
            }
            self.delete_entries(h, v, p.del, &mut errors).await;
            self.report(&wanted, v, &table_full, &errors);
            if errors.is_empty() {
                v.retry = None;
                v.backoff = RETRY_MIN;
            } else {
                v.retry = Some(Instant::now() + v.backoff);
                v.backoff = (v.backoff * 2).min(RETRY_MAX);
            }
        }
        let map = resolve(&wanted, &v.index, &v.observed);
        if *self.out.borrow() != map {
            debug!(resolved = map.len(), wanted = wanted.len(), "next-hop MACs changed");
            self.out.send_replace(map);
        }
        Ok(if errors.is_empty() { Ok(()) } else { Err(errors.swap_remove(0)) })
    }
}

/// The neighbour reconciler's handle. Dropping it stops the task (entries
/// stay in the kernel: call [`Neighbours::clear`] first to remove them, or
/// take the interface down).
#[derive(Debug)]
pub struct Neighbours {
    wanted: watch::Sender<HashSet<(u8, Addr)>>,
    barriers: mpsc::UnboundedSender<Barrier>,
    task: JoinHandle<()>,
}

impl Neighbours {
    /// Starts the reconciler on the current tokio runtime for ports whose
    /// kernel interfaces are `ifaces` (by port index; an empty name: the
    /// port has none, and its next hops are not resolved). The netlink
    /// socket is opened here, in the calling thread's network namespace.
    /// The receiver sees the resolved map, starting empty.
    pub fn spawn(ifaces: Vec<String>) -> Result<(Neighbours, watch::Receiver<NeighMap>), RoutingError> {
        if ifaces.len() > 256 {
            return Err(RoutingError::TooManyPorts(ifaces.len()));
        }
        let rt = tokio::runtime::Handle::try_current().map_err(|_| RoutingError::NoRuntime)?;
        let conn = Conn::open()?;
        let (wanted_tx, wanted_rx) = watch::channel(HashSet::new());
        let (out_tx, out_rx) = watch::channel(NeighMap::new());
        let (barrier_tx, barrier_rx) = mpsc::unbounded_channel();
        let task = Task { names: ifaces, wanted: wanted_rx, barriers: barrier_rx, out: out_tx, said: Said::default() };
        let task = rt.spawn(task.run(conn));
        Ok((Neighbours { wanted: wanted_tx, barriers: barrier_tx, task }, out_rx))
    }

    /// Sets the next hops to keep resolved (replacing the previous set).
    /// Returns at once; the task reconciles.
    pub fn want(&self, hops: &[(u8, Addr)]) {
        let set: HashSet<(u8, Addr)> = hops.iter().copied().collect();
        self.wanted.send_if_modified(|cur| {
            if *cur == set {
                return false;
            }
            *cur = set;
            true
        });
    }

    /// Wants nothing and waits until every managed entry on the ports'
    /// interfaces has been deleted (at shutdown). Fails if a delete failed
    /// or the task has no netlink connection at the moment.
    pub async fn clear(&self) -> Result<(), RoutingError> {
        self.want(&[]);
        self.settle().await
    }

    /// Stops the task where it is, leaving its entries in the kernel (at
    /// shutdown, before the exception interfaces are taken down with them:
    /// a pass over 100,000 entries would hold the stop for seconds).
    pub fn stop(&self) {
        self.task.abort();
    }

    /// Waits for a reconcile pass of the current wanted set and returns its
    /// outcome (the first failure, if any).
    pub async fn settle(&self) -> Result<(), RoutingError> {
        let (tx, rx) = oneshot::channel();
        self.barriers.send(tx).map_err(|_| RoutingError::Stopped)?;
        rx.await.map_err(|_| RoutingError::Stopped)?
    }
}

impl Drop for Neighbours {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_core::Parseable;
    use std::net::Ipv4Addr;

    fn a(s: &str) -> Addr {
        s.parse::<IpAddr>().unwrap().into()
    }

    /// An `RTM_NEWNEIGH` body as the kernel sends it for a managed,
    /// externally learned, reachable IPv4 entry: ndmsg, then NDA_DST,
    /// NDA_LLADDR, NDA_FLAGS_EXT.
    const MANAGED_REACHABLE_V4: [u8; 40] = [
        2, 0, 0, 0, // family AF_INET, padding
        7, 0, 0, 0, // ifindex 7
        0x02, 0x00, 0x10, 1, // state NUD_REACHABLE (u16), flags NTF_EXT_LEARNED, type RTN_UNICAST
        8, 0, 1, 0, 10, 9, 0, 2, // NDA_DST 10.9.0.2
        10, 0, 2, 0, 0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0, 0, // NDA_LLADDR, padded
        8, 0, 15, 0, 1, 0, 0, 0, // NDA_FLAGS_EXT NTF_EXT_MANAGED
    ];

    fn parse(bytes: &[u8]) -> NeighbourMessage {
        NeighbourMessage::parse(bytes).unwrap()
    }

    /// An entry; `managed` ones are also externally learned, as Sluice makes them.
    fn entry(mac: Option<[u8; 6]>, state: NeighbourState, managed: bool) -> Entry {
        Entry { mac, state, managed, learned: managed }
    }

    const MAC: [u8; 6] = [2, 0xaa, 0xbb, 0xcc, 0xdd, 0xee];

    #[test]
    fn decodes_a_kernel_message() {
        let (key, e) = decode(&parse(&MANAGED_REACHABLE_V4)).unwrap();
        assert_eq!(key, (7, a("10.9.0.2")));
        assert_eq!(e, entry(Some(MAC), NeighbourState::Reachable, true));
        assert_eq!(e.resolved(), Some(MAC));
    }

    #[test]
    fn failed_and_incomplete_are_unresolved() {
        for (state, resolved) in [
            (0x01, false), // INCOMPLETE
            (0x20, false), // FAILED
            (0x00, false), // NONE
            (0x04, true),  // STALE
            (0x08, true),  // DELAY
            (0x10, true),  // PROBE
            (0x80, true),  // PERMANENT
        ] {
            let mut b = MANAGED_REACHABLE_V4;
            b[8] = state;
            let (_, e) = decode(&parse(&b)).unwrap();
            assert_eq!(e.resolved().is_some(), resolved, "state {state:#x}");
        }
    }

    #[test]
    fn a_broadcast_multicast_or_zero_lladdr_is_unresolved() {
        for mac in [[0xff; 6], [1, 0, 0x5e, 0, 0, 1], [0x33, 0x33, 0, 0, 0, 1], [0; 6]] {
            let e = entry(Some(mac), NeighbourState::Permanent, false);
            assert_eq!(e.resolved(), None, "{mac:02x?}");
        }
        assert_eq!(entry(Some(MAC), NeighbourState::Permanent, false).resolved(), Some(MAC));
    }

    #[test]
    fn unmanaged_without_lladdr_and_v6() {
        // NDA_DST only: FAILED entries carry no NDA_LLADDR.
        let mut b = MANAGED_REACHABLE_V4[..20].to_vec();
        b[8] = 0x20;
        b[10] = 0;
        let (key, e) = decode(&parse(&b)).unwrap();
        assert_eq!(key, (7, a("10.9.0.2")));
        assert_eq!(e, entry(None, NeighbourState::Failed, false));

        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Inet6;
        m.header.ifindex = 3;
        m.header.state = NeighbourState::Stale;
        m.attributes.push(NeighbourAttribute::Destination(NeighbourAddress::Inet6("2001:db8::1".parse().unwrap())));
        m.attributes.push(NeighbourAttribute::LinkLayerAddress(MAC.to_vec()));
        let (key, e) = decode(&m).unwrap();
        assert_eq!(key, (3, a("2001:db8::1")));
        assert_eq!(e.resolved(), Some(MAC));
    }

    #[test]
    fn ignores_bridge_proxy_and_odd_lladdr() {
        let mut bridge = parse(&MANAGED_REACHABLE_V4);
        bridge.header.family = AddressFamily::Bridge;
        assert!(decode(&bridge).is_none());
        let mut proxy = parse(&MANAGED_REACHABLE_V4);
        proxy.header.flags = NeighbourFlags::Proxy;
        assert!(decode(&proxy).is_none());
        let mut odd = parse(&MANAGED_REACHABLE_V4);
        for at in &mut odd.attributes {
            if let NeighbourAttribute::LinkLayerAddress(l) = at {
                l.truncate(4);
            }
        }
        assert_eq!(decode(&odd).unwrap().1.resolved(), None);
    }

    #[test]
    fn key_message_round_trips_through_decode() {
        let m = key_message((9, Addr::from(Ipv4Addr::new(192, 0, 2, 1))));
        let (key, e) = decode(&m).unwrap();
        assert_eq!(key, (9, a("192.0.2.1")));
        assert!(!e.managed);
        assert_eq!(key_message((9, a("2001:db8::7"))).header.family, AddressFamily::Inet6);
    }

    fn wanted(pairs: &[(u8, &str)]) -> HashSet<(u8, Addr)> {
        pairs.iter().map(|&(p, s)| (p, a(s))).collect()
    }

    #[test]
    fn plan_adds_missing_and_unmanaged_and_deletes_unwanted_managed() {
        let index = [Some(10), None, Some(12)];
        let mut observed = HashMap::new();
        observed.insert((10, a("10.0.0.1")), entry(Some(MAC), NeighbourState::Reachable, true)); // kept
        observed.insert((10, a("10.0.0.2")), entry(Some(MAC), NeighbourState::Stale, false)); // to manage
        observed.insert((10, a("10.0.0.3")), entry(None, NeighbourState::Failed, true)); // unwanted managed
        observed.insert((12, a("10.0.0.4")), entry(Some(MAC), NeighbourState::Reachable, false)); // not ours
        observed.insert((12, a("10.0.0.5")), entry(Some(MAC), NeighbourState::Permanent, false)); // static
        let counted = Entry { learned: false, ..entry(Some(MAC), NeighbourState::Reachable, true) };
        observed.insert((12, a("10.0.0.6")), counted); // managed, but within gc_thresh3's count
        let w = wanted(&[
            (0, "10.0.0.1"),
            (0, "10.0.0.2"),
            (2, "2001:db8::1"),
            (2, "10.0.0.5"),
            (2, "10.0.0.6"),
            (1, "10.0.0.9"),
            (7, "10.0.0.8"),
        ]);
        let p = plan(&w, &index, &observed);
        assert_eq!(p.add, vec![(10, a("10.0.0.2")), (12, a("10.0.0.6")), (12, a("2001:db8::1"))]);
        assert_eq!(p.del, vec![(10, a("10.0.0.3"))]);
    }

    #[test]
    fn plan_is_empty_once_reconciled_and_clears_everything_for_nothing() {
        let index = [Some(4)];
        let mut observed = HashMap::new();
        observed.insert((4, a("10.0.0.1")), entry(None, NeighbourState::Incomplete, true));
        observed.insert((4, a("10.0.0.2")), entry(Some(MAC), NeighbourState::Reachable, true));
        let w = wanted(&[(0, "10.0.0.1"), (0, "10.0.0.2")]);
        assert_eq!(plan(&w, &index, &observed), Plan::default());
        let p = plan(&HashSet::new(), &index, &observed);
        assert_eq!(p.del, vec![(4, a("10.0.0.1")), (4, a("10.0.0.2"))]);
        assert!(p.add.is_empty());
    }

    #[test]
    fn resolve_maps_wanted_resolved_entries_to_ports() {
        // Two ports on the same interface index see the same entry.
        let index = [Some(4), Some(5), Some(4)];
        let mut observed = HashMap::new();
        observed.insert((4, a("10.0.0.1")), entry(Some(MAC), NeighbourState::Reachable, true));
        observed.insert((4, a("10.0.0.2")), entry(None, NeighbourState::Incomplete, true));
        observed.insert((5, a("10.0.0.3")), entry(Some([9; 6]), NeighbourState::Failed, true));
        observed.insert((5, a("10.0.0.4")), entry(Some([8; 6]), NeighbourState::Stale, false)); // not wanted
        let w = wanted(&[(0, "10.0.0.1"), (2, "10.0.0.1"), (0, "10.0.0.2"), (1, "10.0.0.3"), (1, "10.0.0.1")]);
        let m = resolve(&w, &index, &observed);
        let expect: NeighMap = [((0, a("10.0.0.1")), MAC), ((2, a("10.0.0.1")), MAC)].into_iter().collect();
        assert_eq!(m, expect);
    }

    fn link(index: u32, name: &str) -> LinkMessage {
        let mut l = LinkMessage::default();
        l.header.index = index;
        l.attributes.push(LinkAttribute::IfName(name.into()));
        l
    }

    #[test]
    fn ports_find_their_interfaces_and_notice_moves() {
        let names = vec!["tap0".to_owned(), String::new(), "tap2".to_owned()];
        let index = index_ports(&names, &[link(1, "lo"), link(5, "tap2"), link(6, "tap0")]);
        assert_eq!(index, vec![Some(6), None, Some(5)]);
        // Unrelated links, and ours unchanged, do not matter.
        assert!(!link_moves_ports(&names, &index, &link(9, "eth0"), false));
        assert!(!link_moves_ports(&names, &index, &link(6, "tap0"), false));
        assert!(!link_moves_ports(&names, &index, &link(9, "eth0"), true));
        // Deleted, recreated under another index, renamed away.
        assert!(link_moves_ports(&names, &index, &link(6, "tap0"), true));
        assert!(link_moves_ports(&names, &index, &link(11, "tap0"), false));
        assert!(link_moves_ports(&names, &index, &link(5, "other"), false));
        // A missing interface appears.
        assert!(link_moves_ports(&names[..1], &[None], &link(3, "tap0"), false));
    }
}

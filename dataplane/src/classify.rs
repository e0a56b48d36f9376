//! Route classification with L34Route semantics (Meridio 2.x): destination
//! VIPs, source CIDRs, source and destination port ranges, protocols and
//! byte matches on the transport header; the route with the highest
//! priority wins, ties broken by name, then by input order.
//!
//! Compiled layout, built once per snapshot and read-only after:
//! 1. an open-addressing hash of VIPs (128-bit keys);
//! 2. per VIP and transport slot (TCP, UDP, SCTP, other), the destination
//!    port space cut into elementary intervals (binary search), each with
//!    the candidate routes covering it, in precedence order;
//! 3. candidates are checked in order for source CIDR, source port and byte
//!    matches; the first that matches wins.
//!
//! Identical candidate lists are shared. A lookup costs one hash probe, one
//! binary search and, typically, one candidate check.
//!
//! The common case takes a shorter way: a destination port that has
//! candidates of its own (an elementary interval of at most
//! [`PORT_SPAN_MAX`] ports, as routes to single ports make) is also a key
//! of a second open-addressing hash, on (VIP, protocol slot, port), whose
//! slot holds the VIP's index and the candidates. A packet with ports
//! probes it first: one probe instead of a probe and a binary search, and
//! the VIP's index comes with it. Where ranges make wide intervals, the
//! probe misses and the interval search answers.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use crate::addr::{Addr, Cidr};
use crate::parse::{proto, Flow};

/// An inclusive port range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortRange {
    /// First port.
    pub lo: u16,
    /// Last port.
    pub hi: u16,
}

impl PortRange {
    /// Every port.
    pub const ANY: PortRange = PortRange { lo: 0, hi: u16::MAX };

    /// One port.
    pub fn single(p: u16) -> PortRange {
        PortRange { lo: p, hi: p }
    }

    #[inline(always)]
    fn contains(&self, p: u16) -> bool {
        self.lo <= p && p <= self.hi
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}

/// A match on transport-header bytes: `proto[offset:len] & mask == value`,
/// `len` 1, 2 or 4, big-endian. It applies to packets of `proto` only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ByteMatch {
    /// Transport protocol the statement is about.
    pub proto: u8,
    /// Offset from the start of the transport header.
    pub offset: u16,
    /// Bytes read: 1, 2 or 4.
    pub len: u8,
    /// Mask applied before comparing.
    pub mask: u32,
    /// Expected value.
    pub value: u32,
}

impl ByteMatch {
    /// True when `l4` (the transport header onward) satisfies the statement.
    #[inline]
    pub fn matches(&self, l4: &[u8]) -> bool {
        let o = usize::from(self.offset);
        let v = match self.len {
            1 => l4.get(o).map(|&b| u32::from(b)),
            2 => l4.get(o..o + 2).map(|b| u32::from(u16::from_be_bytes([b[0], b[1]]))),
            4 => l4.get(o..o + 4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
            _ => None,
        };
        v.is_some_and(|v| v & self.mask == self.value)
    }
}

/// A route as the control plane hands it over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    /// Unique name (tie-breaker between equal priorities).
    pub name: String,
    /// Higher wins.
    pub priority: i32,
    /// Index of the service in the snapshot.
    pub service: u32,
    /// What it matches (shared with the model it came from: every layer
    /// that keeps a route keeps the same match, 144 bytes and its lists).
    pub matches: std::sync::Arc<RouteMatch>,
}

/// What a route matches (L34Route), besides its name, priority and service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteMatch {
    /// Destination addresses (VIPs).
    pub vips: Vec<Addr>,
    /// Source prefixes; empty means any.
    pub src_cidrs: Vec<Cidr>,
    /// Source ports; empty means any.
    pub src_ports: Vec<PortRange>,
    /// Destination ports; empty means any.
    pub dst_ports: Vec<PortRange>,
    /// Transport protocols (TCP, UDP, SCTP); empty means any protocol.
    pub protocols: Vec<u8>,
    /// Byte matches; all statements about the packet's protocol must hold.
    pub byte_matches: Vec<ByteMatch>,
}

/// The outcome of a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The destination is not a VIP.
    NotVip,
    /// A VIP, but no route matches.
    NoRoute,
    /// The winning route (index into [`Classifier::route`]).
    Route(u32),
}

/// Slots of the per-VIP tables.
const SLOT_TCP: usize = 0;
const SLOT_UDP: usize = 1;
const SLOT_SCTP: usize = 2;
const SLOT_OTHER: usize = 3;
const SLOTS: usize = 4;

#[inline(always)]
fn slot_of(p: u8) -> usize {
    match p {
        proto::TCP => SLOT_TCP,
        proto::UDP => SLOT_UDP,
        proto::SCTP => SLOT_SCTP,
        _ => SLOT_OTHER,
    }
}

/// (start, length) into one of the pools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Span {
    start: u32,
    len: u32,
}

impl Span {
    #[inline(always)]
    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// A route, compiled: what status and logs show.
#[derive(Clone, Debug)]
pub struct Route {
    /// Its name.
    pub name: String,
    /// Its priority.
    pub priority: i32,
    /// Index of its service.
    pub service: u32,
}

/// Match conditions beyond the destination, checked per candidate: the
/// first source prefix is inline (most routes have at most one), the rest
/// in pools.
#[derive(Clone, Copy, Debug)]
struct Cond {
    /// The route's service (hot: read right after the match).
    service: u32,
    flags: u8,
    src0: Cidr,
    /// Further source prefixes.
    src_more: Span,
    sports: Span,
    bytes: Span,
}

/// Any source address.
const ANY_SRC: u8 = 1;
/// Any source port.
const ANY_SPORT: u8 = 2;
/// No byte match.
const NO_BYTES: u8 = 4;

/// A (VIP, protocol slot)'s routes by destination port. Its two lists
/// are shared with every slot that has the same (interned when built):
/// with a vector each, 10,000 VIPs' four slots would be 80,000
/// allocations; interned, the slots without routes share one pair and the
/// VIPs with the same ports one list of bounds. Read as plain slices.
#[derive(Clone, Debug, Default)]
struct PortIndex {
    /// Start port of each elementary interval; the first is 0.
    bounds: Arc<[u16]>,
    /// Candidates of each interval.
    lists: Arc<[Span]>,
    /// Candidates for packets without ports: routes without port constraints.
    portless: Span,
}

/// The widest elementary interval whose ports are keys of
/// [`Classifier`]'s port hash: a route to a few ports gets the one-probe
/// way, a wide range stays with the interval search.
pub const PORT_SPAN_MAX: u32 = 8;

/// A slot of the port hash: 32 bytes, two to a cache line.
#[derive(Clone, Copy, Debug, Default)]
struct PortSlot {
    /// The VIP.
    key: u128,
    /// The destination port.
    port: u16,
    /// The protocol slot, plus one (0: the slot is empty).
    slot: u8,
    /// The VIP's index.
    vip: u32,
    /// The candidates.
    list: Span,
}

/// The port indexes' lists already made, to share.
type Interned = (HashMap<Vec<u16>, Arc<[u16]>>, HashMap<Vec<Span>, Arc<[Span]>>);

/// Compiled routes.
#[derive(Clone, Debug, Default)]
pub struct Classifier {
    /// Open addressing: one cache line holds a slot's key and value.
    vip_slots: Vec<VipSlot>,
    vip_mask: usize,
    /// (VIP, protocol slot, port) of the narrow intervals, open addressing.
    port_slots: Vec<PortSlot>,
    port_mask: usize,
    /// Per VIP, per slot.
    tables: Vec<[PortIndex; SLOTS]>,
    vips: Vec<Addr>,
    routes: Vec<Route>,
    conds: Vec<Cond>,
    candidates: Vec<u32>,
    cidrs: Vec<Cidr>,
    ports: Vec<PortRange>,
    bytes: Vec<ByteMatch>,
}

const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct VipSlot {
    key: u128,
    index: u32,
}

#[inline(always)]
#[allow(clippy::cast_possible_truncation)] // folding to the table size
fn vip_hash(a: u128) -> usize {
    let x = (a as u64) ^ ((a >> 64) as u64).rotate_left(17);
    (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize
}

/// A port hash up to this size stays in a core's cache
/// ([`Classifier::port_slot_addr`]).
const PORT_SLOTS_CACHED_BYTES: usize = 64 << 10;

#[inline(always)]
#[allow(clippy::cast_possible_truncation)] // folding to the table size
fn port_hash(a: u128, slot: usize, port: u16) -> usize {
    let pk = (u64::from(port) << 8 | slot as u64).wrapping_mul(0xff51_afd7_ed55_8ccd);
    let x = (a as u64) ^ ((a >> 64) as u64).rotate_left(17) ^ pk;
    (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize
}

fn push_span<T: Copy>(pool: &mut Vec<T>, items: &[T]) -> Span {
    let start = u32::try_from(pool.len()).unwrap_or(u32::MAX);
    pool.extend_from_slice(items);
    Span { start, len: u32::try_from(items.len()).unwrap_or(u32::MAX) }
}

impl Classifier {
    /// Compiles `routes`.
    pub fn build(routes: &[RouteSpec]) -> Classifier {
        // Precedence: priority descending, then name, then input order.
        let mut order: Vec<usize> = (0..routes.len()).collect();
        order.sort_by(|&a, &b| {
            routes[b].priority.cmp(&routes[a].priority).then_with(|| routes[a].name.cmp(&routes[b].name)).then(a.cmp(&b))
        });
        let mut c = Classifier { routes: Vec::with_capacity(routes.len()), conds: Vec::with_capacity(routes.len()), ..Classifier::default() };
        for &i in &order {
            let r = &routes[i];
            let mut flags = 0;
            if r.matches.src_cidrs.is_empty() {
                flags |= ANY_SRC;
            }
            let sports = if r.matches.src_ports.is_empty() || r.matches.src_ports.contains(&PortRange::ANY) {
                flags |= ANY_SPORT;
                Span::default()
            } else {
                push_span(&mut c.ports, &r.matches.src_ports)
            };
            if r.matches.byte_matches.is_empty() {
                flags |= NO_BYTES;
            }
            let src0 = r.matches.src_cidrs.first().copied().unwrap_or(Cidr::host(Addr(0)));
            let src_more = push_span(&mut c.cidrs, r.matches.src_cidrs.get(1..).unwrap_or_default());
            let bytes = push_span(&mut c.bytes, &r.matches.byte_matches);
            c.conds.push(Cond { service: r.service, flags, src0, src_more, sports, bytes });
            c.routes.push(Route { name: r.name.clone(), priority: r.priority, service: r.service });
        }

        // Routes per (VIP, slot), by rank.
        let mut vip_index: HashMap<Addr, usize> = HashMap::new();
        let mut per_vip: Vec<[Vec<u32>; SLOTS]> = Vec::new();
        for (rank, &i) in order.iter().enumerate() {
            let r = &routes[i];
            let rank = u32::try_from(rank).unwrap_or(u32::MAX);
            let slots: Vec<usize> = if r.matches.protocols.is_empty() {
                (0..SLOTS).collect()
            } else {
                let mut s: Vec<usize> = r.matches.protocols.iter().map(|&p| slot_of(p)).collect();
                s.sort_unstable();
                s.dedup();
                s
            };
            for &v in &r.matches.vips {
                let vi = *vip_index.entry(v).or_insert_with(|| {
                    per_vip.push(Default::default());
                    c.vips.push(v);
                    per_vip.len() - 1
                });
                for &s in &slots {
                    per_vip[vi][s].push(rank);
                }
            }
        }

        let mut shared: HashMap<Vec<u32>, Span> = HashMap::new();
        let mut interned: Interned = (HashMap::new(), HashMap::new());
        c.tables.reserve_exact(per_vip.len());
        for lists in &per_vip {
            let mut t: [PortIndex; SLOTS] = Default::default();
            for (s, ranks) in lists.iter().enumerate() {
                t[s] = c.port_index(routes, &order, ranks, &mut shared, &mut interned);
            }
            c.tables.push(t);
        }

        let cap = (c.vips.len() * 2).next_power_of_two().max(4);
        c.vip_slots = vec![VipSlot { key: 0, index: EMPTY }; cap];
        c.vip_mask = cap - 1;
        for (i, v) in c.vips.iter().enumerate() {
            let mut h = vip_hash(v.0) & c.vip_mask;
            while c.vip_slots[h].index != EMPTY {
                h = (h + 1) & c.vip_mask;
            }
            c.vip_slots[h] = VipSlot { key: v.0, index: u32::try_from(i).unwrap_or(EMPTY) };
        }
        c.index_ports();
        // Grown by doubling, the pools would keep up to twice what they
        // hold for as long as the snapshot lives (10,000 VIPs: 1.4 MB of
        // empty table rows).
        c.vips.shrink_to_fit();
        c.candidates.shrink_to_fit();
        c.cidrs.shrink_to_fit();
        c.ports.shrink_to_fit();
        c.bytes.shrink_to_fit();
        c
    }

    /// Fills the port hash: every port of each elementary interval of at
    /// most [`PORT_SPAN_MAX`] ports that has candidates.
    fn index_ports(&mut self) {
        let mut keys: Vec<(u128, usize, u16, u32, Span)> = Vec::new();
        for (vi, (t, v)) in self.tables.iter().zip(&self.vips).enumerate() {
            let vi = u32::try_from(vi).unwrap_or(EMPTY);
            for (s, pi) in t.iter().enumerate() {
                for (i, list) in pi.lists.iter().enumerate() {
                    let lo = u32::from(pi.bounds[i]);
                    let hi = pi.bounds.get(i + 1).map_or(u32::from(u16::MAX) + 1, |&b| u32::from(b));
                    if list.len == 0 || hi - lo > PORT_SPAN_MAX {
                        continue;
                    }
                    for port in lo..hi {
                        keys.push((v.0, s, u16::try_from(port).unwrap_or(u16::MAX), vi, *list));
                    }
                }
            }
        }
        let cap = (keys.len() * 2).next_power_of_two().max(4);
        self.port_slots = vec![PortSlot::default(); cap];
        self.port_mask = cap - 1;
        for (key, s, port, vip, list) in keys {
            let mut h = port_hash(key, s, port) & self.port_mask;
            while self.port_slots[h].slot != 0 {
                h = (h + 1) & self.port_mask;
            }
            #[allow(clippy::cast_possible_truncation)] // below SLOTS
            let slot = s as u8 + 1;
            self.port_slots[h] = PortSlot { key, port, slot, vip, list };
        }
    }

    /// Elementary destination-port intervals over the routes `ranks`.
    fn port_index(
        &mut self,
        routes: &[RouteSpec],
        order: &[usize],
        ranks: &[u32],
        shared: &mut HashMap<Vec<u32>, Span>,
        interned: &mut Interned,
    ) -> PortIndex {
        let dst = |rank: u32| -> &[PortRange] {
            let r = &routes[order[rank as usize]];
            if r.matches.dst_ports.contains(&PortRange::ANY) { &[] } else { &r.matches.dst_ports }
        };
        let mut intern = |list: Vec<u32>, pool: &mut Vec<u32>| -> Span {
            if let Some(s) = shared.get(&list) {
                return *s;
            }
            let s = push_span(pool, &list);
            shared.insert(list, s);
            s
        };
        let portless: Vec<u32> = ranks
            .iter()
            .copied()
            .filter(|&k| dst(k).is_empty() && self.conds[k as usize].flags & ANY_SPORT != 0)
            .collect();
        let portless = intern(portless, &mut self.candidates);

        // Sweep: at each boundary, the routes whose ranges cover it.
        let mut events: Vec<(u32, bool, u32)> = Vec::new(); // (port, is_start, rank)
        for &k in ranks {
            let ranges = dst(k);
            if ranges.is_empty() {
                events.push((0, true, k));
            }
            for r in ranges {
                events.push((u32::from(r.lo), true, k));
                events.push((u32::from(r.hi) + 1, false, k));
            }
        }
        events.sort_unstable_by_key(|&(p, start, k)| (p, start, k));
        let mut bounds = vec![0u16];
        let mut lists: Vec<Span> = Vec::new();
        // Rank -> how many of its ranges cover the current port.
        let mut active: BTreeMap<u32, u32> = BTreeMap::new();
        let mut i = 0;
        let mut cur = 0u32;
        loop {
            while i < events.len() && events[i].0 == cur {
                let (_, start, k) = events[i];
                if start {
                    *active.entry(k).or_default() += 1;
                } else if let Some(n) = active.get_mut(&k) {
                    *n -= 1;
                    if *n == 0 {
                        active.remove(&k);
                    }
                }
                i += 1;
            }
            let list: Vec<u32> = active.keys().copied().collect();
            let span = intern(list, &mut self.candidates);
            if cur == 0 || lists.last() != Some(&span) {
                if cur != 0 {
                    bounds.push(u16::try_from(cur).unwrap_or(u16::MAX));
                }
                lists.push(span);
            }
            match events.get(i) {
                Some(&(p, _, _)) if p <= u32::from(u16::MAX) => cur = p,
                _ => break,
            }
        }
        let bounds = Arc::clone(interned.0.entry(bounds).or_insert_with_key(|b| b.as_slice().into()));
        let lists = Arc::clone(interned.1.entry(lists).or_insert_with_key(|l| l.as_slice().into()));
        PortIndex { bounds, lists, portless }
    }

    /// True when `a` is a VIP.
    #[inline]
    pub fn is_vip(&self, a: Addr) -> bool {
        self.vip(a).is_some()
    }

    /// The index of VIP `a`, for [`Classifier::classify_vip`].
    #[inline]
    pub fn vip_index(&self, a: Addr) -> Option<usize> {
        self.vip(a)
    }

    #[inline(always)]
    fn vip(&self, a: Addr) -> Option<usize> {
        let mut h = vip_hash(a.0) & self.vip_mask;
        loop {
            let slot = self.vip_slots.get(h)?;
            if slot.index == EMPTY {
                return None;
            }
            if slot.key == a.0 {
                return Some(slot.index as usize);
            }
            h = (h + 1) & self.vip_mask;
        }
    }

    /// The VIP index of `flow`'s destination and the lookup of `flow`, as
    /// [`Classifier::vip_index`] and [`Classifier::classify`] would answer:
    /// in one probe of the port hash when the packet has ports and its
    /// (VIP, protocol, port) is a key there.
    #[inline]
    pub fn classify_with_vip(&self, flow: &Flow, has_ports: bool, l4: Option<&[u8]>) -> (Option<usize>, Lookup) {
        if has_ports {
            let s = slot_of(flow.proto);
            #[allow(clippy::cast_possible_truncation)] // below SLOTS
            let tag = s as u8 + 1;
            let mut h = port_hash(flow.dst.0, s, flow.dport) & self.port_mask;
            while let Some(slot) = self.port_slots.get(h) {
                if slot.slot == 0 {
                    break;
                }
                if slot.key == flow.dst.0 && slot.port == flow.dport && slot.slot == tag {
                    return (Some(slot.vip as usize), self.first_match(slot.list, flow, has_ports, l4));
                }
                h = (h + 1) & self.port_mask;
            }
        }
        match self.vip(flow.dst) {
            Some(v) => (Some(v), self.classify_vip(v, flow, has_ports, l4)),
            None => (None, Lookup::NotVip),
        }
    }

    /// Where [`Classifier::classify_with_vip`] first looks for `flow` (a
    /// packet with ports): the slot of the port hash its probe starts at
    /// (for a prefetch; not read). `None` when the port hash is small
    /// enough to stay in the cache, where a prefetch would only cost.
    #[inline(always)]
    pub fn port_slot_addr(&self, flow: &Flow) -> Option<*const u8> {
        if std::mem::size_of_val(self.port_slots.as_slice()) <= PORT_SLOTS_CACHED_BYTES {
            return None;
        }
        let h = port_hash(flow.dst.0, slot_of(flow.proto), flow.dport) & self.port_mask;
        Some(self.port_slots.as_ptr().wrapping_add(h).cast())
    }

    /// Classifies a packet of `flow` (ports meaningful when `has_ports`)
    /// whose transport header onward is `l4` (empty when absent or when
    /// byte matches cannot be evaluated, e.g. for ICMP errors).
    #[inline]
    pub fn classify(&self, flow: &Flow, has_ports: bool, l4: Option<&[u8]>) -> Lookup {
        self.classify_with_vip(flow, has_ports, l4).1
    }

    /// [`Classifier::classify`] when the destination's VIP index `v` is
    /// already known (from [`Classifier::vip_index`]).
    #[inline(always)]
    pub fn classify_vip(&self, v: usize, flow: &Flow, has_ports: bool, l4: Option<&[u8]>) -> Lookup {
        let Some(t) = self.tables.get(v).map(|t| &t[slot_of(flow.proto)]) else { return Lookup::NotVip };
        let list = if has_ports {
            let i = t.bounds.partition_point(|&b| b <= flow.dport) - 1;
            t.lists[i]
        } else {
            t.portless
        };
        self.first_match(list, flow, has_ports, l4)
    }

    /// The first of the candidates `list` that `flow` matches.
    #[inline(always)]
    fn first_match(&self, list: Span, flow: &Flow, has_ports: bool, l4: Option<&[u8]>) -> Lookup {
        let Some(cands) = self.candidates.get(list.range()) else { return Lookup::NoRoute };
        for &k in cands {
            if let Some(cond) = self.conds.get(k as usize) {
                if self.matches(cond, flow, has_ports, l4) {
                    return Lookup::Route(k);
                }
            }
        }
        Lookup::NoRoute
    }

    /// The common checks inline; the rest (more prefixes, source ports,
    /// byte matches) out of line, so the candidate loop stays small.
    #[inline(always)]
    fn matches(&self, r: &Cond, flow: &Flow, has_ports: bool, l4: Option<&[u8]>) -> bool {
        if r.flags & ANY_SRC == 0 && !r.src0.contains(flow.src) && (r.src_more.len == 0 || !self.more_sources(r, flow)) {
            return false;
        }
        if r.flags & (ANY_SPORT | NO_BYTES) != (ANY_SPORT | NO_BYTES) {
            return self.ports_and_bytes(r, flow, has_ports, l4);
        }
        true
    }

    #[inline(never)]
    fn more_sources(&self, r: &Cond, flow: &Flow) -> bool {
        self.cidrs.get(r.src_more.range()).is_some_and(|c| c.iter().any(|c| c.contains(flow.src)))
    }

    #[inline(never)]
    fn ports_and_bytes(&self, r: &Cond, flow: &Flow, has_ports: bool, l4: Option<&[u8]>) -> bool {
        if r.flags & ANY_SPORT == 0
            && !(has_ports && self.ports.get(r.sports.range()).is_some_and(|p| p.iter().any(|p| p.contains(flow.sport))))
        {
            return false;
        }
        if r.flags & NO_BYTES == 0 {
            for b in self.bytes.get(r.bytes.range()).unwrap_or_default() {
                if b.proto != flow.proto {
                    continue;
                }
                match l4 {
                    Some(l4) if b.matches(l4) => {}
                    Some(_) => return false,
                    // Not evaluable (ICMP error about the flow): ignored.
                    None => {}
                }
            }
        }
        true
    }

    /// The service of route `i` (from [`Lookup::Route`]).
    #[inline(always)]
    pub fn service_of(&self, i: u32) -> Option<u32> {
        self.conds.get(i as usize).map(|c| c.service)
    }

    /// Route `i` (from [`Lookup::Route`]).
    pub fn route(&self, i: u32) -> &Route {
        &self.routes[i as usize]
    }

    /// Every route, in precedence order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Every VIP.
    pub fn vips(&self) -> &[Addr] {
        &self.vips
    }

    /// Bytes of heap memory used (approximately: vectors' capacity, and
    /// the port indexes' shared lists counted for every slot that has them).
    pub fn heap_bytes(&self) -> usize {
        let t: usize = self
            .tables
            .iter()
            .flat_map(|t| t.iter())
            .map(|p| p.bounds.len() * 2 + p.lists.len() * std::mem::size_of::<Span>())
            .sum();
        t + self.tables.capacity() * std::mem::size_of::<[PortIndex; SLOTS]>()
            + self.vip_slots.capacity() * std::mem::size_of::<VipSlot>()
            + self.port_slots.capacity() * std::mem::size_of::<PortSlot>()
            + self.vips.capacity() * 16
            + self.routes.capacity() * std::mem::size_of::<Route>()
            + self.conds.capacity() * std::mem::size_of::<Cond>()
            + self.routes.iter().map(|r| r.name.capacity()).sum::<usize>()
            + self.candidates.capacity() * 4
            + self.cidrs.capacity() * std::mem::size_of::<Cidr>()
            + self.ports.capacity() * std::mem::size_of::<PortRange>()
            + self.bytes.capacity() * std::mem::size_of::<ByteMatch>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn a(s: &str) -> Addr {
        s.parse().unwrap()
    }

    fn route(name: &str, prio: i32, vips: &[&str], dports: &[(u16, u16)], protos: &[u8]) -> RouteSpec {
        RouteSpec {
            name: name.into(),
            priority: prio,
            service: 0,
            matches: RouteMatch {
                vips: vips.iter().map(|v| a(v)).collect(),
                dst_ports: dports.iter().map(|&(lo, hi)| PortRange { lo, hi }).collect(),
                protocols: protos.to_vec(),
                ..RouteMatch::default()
            }.into(),
        }
    }

    fn flow(src: &str, dst: &str, sport: u16, dport: u16, p: u8) -> Flow {
        Flow { src: a(src), dst: a(dst), sport, dport, proto: p }
    }

    fn name(c: &Classifier, l: Lookup) -> Option<&str> {
        match l {
            Lookup::Route(i) => Some(&c.route(i).name),
            _ => None,
        }
    }

    /// A snapshot keeps its classifier for as long as it serves: its
    /// pools hold what the routes need, not what doubling left, and the
    /// port indexes share their lists.
    #[test]
    fn a_classifier_holds_room_for_its_routes_only_and_shares_port_lists() {
        let vips: Vec<String> = (0..1000).map(|i| format!("20.0.{}.{}", i / 250, i % 250)).collect();
        let routes: Vec<RouteSpec> = vips.iter().enumerate().map(|(i, v)| route(&format!("r{i}"), 0, &[v], &[(80, 80)], &[proto::TCP])).collect();
        let c = Classifier::build(&routes);
        assert_eq!(c.vips.len(), 1000);
        for (what, len, cap) in [
            ("tables", c.tables.len(), c.tables.capacity()),
            ("vips", c.vips.len(), c.vips.capacity()),
            ("routes", c.routes.len(), c.routes.capacity()),
            ("conds", c.conds.len(), c.conds.capacity()),
            ("candidates", c.candidates.len(), c.candidates.capacity()),
        ] {
            assert_eq!(cap, len, "{what}");
        }
        // Every VIP's TCP slot has the same bounds (0, 80, 81) and its own
        // candidates; its other slots have none, like every other VIP's.
        let tcp = slot_of(proto::TCP);
        let udp = slot_of(proto::UDP);
        let (first, last) = (&c.tables[0], &c.tables[999]);
        assert_eq!(&*first[tcp].bounds, &[0, 80, 81]);
        assert!(Arc::ptr_eq(&first[tcp].bounds, &last[tcp].bounds));
        assert!(!Arc::ptr_eq(&first[tcp].lists, &last[tcp].lists));
        assert!(Arc::ptr_eq(&first[udp].bounds, &last[udp].bounds) && Arc::ptr_eq(&first[udp].lists, &last[udp].lists));
        assert_eq!(name(&c, c.classify(&flow("1.2.3.4", &vips[999], 5555, 80, proto::TCP), true, None)), Some("r999"));
        assert_eq!(c.classify(&flow("1.2.3.4", &vips[999], 5555, 81, proto::TCP), true, None), Lookup::NoRoute);
        assert_eq!(c.classify(&flow("1.2.3.4", &vips[999], 5555, 80, proto::UDP), true, None), Lookup::NoRoute);
    }

    /// Ports of narrow intervals are keys of the port hash, those of wide
    /// ranges are not; either way the lookup is the same.
    #[test]
    fn narrow_ports_take_one_probe_and_wide_ranges_the_interval_search() {
        let c = Classifier::build(&[
            route("web", 0, &["20.0.0.1", "2001:db8::1"], &[(80, 80), (4000, 4001)], &[proto::TCP]),
            route("range", 0, &["20.0.0.1"], &[(1000, 2000)], &[proto::UDP]),
        ]);
        let keyed = |vip: &str, s: usize, port: u16| c.port_slots.iter().any(|p| p.slot as usize == s + 1 && p.key == a(vip).0 && p.port == port);
        let (tcp, udp) = (slot_of(proto::TCP), slot_of(proto::UDP));
        for (vip, s, port, want) in [
            ("20.0.0.1", tcp, 80, true),
            ("2001:db8::1", tcp, 80, true),
            ("20.0.0.1", tcp, 4001, true),
            ("20.0.0.1", tcp, 81, false),
            ("20.0.0.1", udp, 80, false),
            ("20.0.0.1", udp, 1500, false),
        ] {
            assert_eq!(keyed(vip, s, port), want, "{vip} slot {s} port {port}");
        }
        assert_eq!(c.port_slots.iter().filter(|p| p.slot != 0).count(), 6);
        for (dst, port, p, want) in [
            ("20.0.0.1", 80, proto::TCP, Some("web")),
            ("2001:db8::1", 4000, proto::TCP, Some("web")),
            ("20.0.0.1", 1500, proto::UDP, Some("range")),
            ("20.0.0.1", 80, proto::UDP, None),
        ] {
            let src = if dst.contains(':') { "2001::9" } else { "1.2.3.4" };
            let (vip, l) = c.classify_with_vip(&flow(src, dst, 5555, port, p), true, None);
            assert_eq!((vip, name(&c, l)), (c.vip_index(a(dst)), want), "{dst} {port}");
        }
        assert_eq!(c.classify_with_vip(&flow("1.2.3.4", "20.0.0.9", 5555, 80, proto::TCP), true, None), (None, Lookup::NotVip));
    }

    #[test]
    fn meridio_example() {
        // The seed's L34Route: 20.0.0.1, TCP 4000-4001, any source.
        let mut r = route("vip-20-0-0-1-multi-ports-a", 10, &["20.0.0.1"], &[(4000, 4000), (4001, 4001)], &[proto::TCP]);
        let m = std::sync::Arc::make_mut(&mut r.matches);
        m.src_cidrs = vec!["0.0.0.0/0".parse().unwrap()];
        m.src_ports = vec![PortRange::ANY];
        let c = Classifier::build(&[r]);
        let hit = c.classify(&flow("1.2.3.4", "20.0.0.1", 5555, 4001, proto::TCP), true, Some(&[]));
        assert_eq!(name(&c, hit), Some("vip-20-0-0-1-multi-ports-a"));
        assert_eq!(c.classify(&flow("1.2.3.4", "20.0.0.1", 5555, 4002, proto::TCP), true, None), Lookup::NoRoute);
        assert_eq!(c.classify(&flow("1.2.3.4", "20.0.0.1", 5555, 4000, proto::UDP), true, None), Lookup::NoRoute);
        assert_eq!(c.classify(&flow("1.2.3.4", "20.0.0.2", 5555, 4000, proto::TCP), true, None), Lookup::NotVip);
        assert_eq!(c.classify(&flow("2001::1", "20.0.0.1", 5555, 4000, proto::TCP), true, None), Lookup::NoRoute, "v6 source, v4 prefix");
        assert!(c.is_vip(a("20.0.0.1")) && !c.is_vip(a("20.0.0.2")));
    }

    #[test]
    fn priority_then_name_decides() {
        let c = Classifier::build(&[
            route("b-low", 1, &["10.0.0.1"], &[], &[]),
            route("z-high", 5, &["10.0.0.1"], &[(80, 80)], &[proto::TCP]),
            route("a-high", 5, &["10.0.0.1"], &[(80, 80)], &[proto::TCP]),
        ]);
        let f = flow("1.1.1.1", "10.0.0.1", 1, 80, proto::TCP);
        assert_eq!(name(&c, c.classify(&f, true, None)), Some("a-high"));
        let g = flow("1.1.1.1", "10.0.0.1", 1, 81, proto::TCP);
        assert_eq!(name(&c, c.classify(&g, true, None)), Some("b-low"));
        // No ports (ICMP echo, later fragment): only port-free routes.
        let p = flow("1.1.1.1", "10.0.0.1", 0, 0, proto::ICMP);
        assert_eq!(name(&c, c.classify(&p, false, None)), Some("b-low"));
    }

    #[test]
    fn byte_matches_apply_to_their_protocol_only() {
        let mut r = route("syn-only", 9, &["10.0.0.1"], &[], &[proto::TCP, proto::UDP]);
        // tcp[13:1] & 0x02 = 0x02: SYN set.
        std::sync::Arc::make_mut(&mut r.matches).byte_matches = vec![ByteMatch { proto: proto::TCP, offset: 13, len: 1, mask: 0x02, value: 0x02 }];
        let c = Classifier::build(&[r, route("rest", 1, &["10.0.0.1"], &[], &[])]);
        let f = flow("1.1.1.1", "10.0.0.1", 1, 80, proto::TCP);
        let mut syn = [0u8; 20];
        syn[13] = 0x02;
        assert_eq!(name(&c, c.classify(&f, true, Some(&syn))), Some("syn-only"));
        assert_eq!(name(&c, c.classify(&f, true, Some(&[0u8; 20]))), Some("rest"));
        assert_eq!(name(&c, c.classify(&f, true, Some(&[0u8; 10]))), Some("rest"), "short header: no match");
        let u = flow("1.1.1.1", "10.0.0.1", 1, 80, proto::UDP);
        assert_eq!(name(&c, c.classify(&u, true, Some(&[0u8; 8]))), Some("syn-only"), "no UDP statement");
        assert!(ByteMatch { proto: 6, offset: 0, len: 4, mask: 0xffff_0000, value: 0x1234_0000 }.matches(&[0x12, 0x34, 9, 9]));
        assert!(!ByteMatch { proto: 6, offset: 0, len: 3, mask: 0, value: 0 }.matches(&[0; 8]), "bad length");
    }

    #[test]
    fn empty_and_many_vips() {
        let c = Classifier::build(&[]);
        assert_eq!(c.classify(&flow("1.1.1.1", "2.2.2.2", 1, 2, 6), true, None), Lookup::NotVip);
        let routes: Vec<RouteSpec> =
            (0..1000u32).map(|i| route(&format!("r{i}"), 0, &[&format!("10.{}.{}.1", i / 256, i % 256)], &[], &[])).collect();
        let c = Classifier::build(&routes);
        for i in (0..1000u32).step_by(7) {
            let f = flow("1.1.1.1", &format!("10.{}.{}.1", i / 256, i % 256), 1, 2, 6);
            assert_eq!(name(&c, c.classify(&f, true, None)), Some(format!("r{i}").as_str()));
        }
        assert!(c.heap_bytes() > 0);
    }

    /// Prefix membership from first principles, on the standard library's
    /// addresses: same family, and the first `len` bits agree.
    fn in_prefix(c: &Cidr, a: Addr) -> bool {
        use std::net::IpAddr;
        match (c.addr().to_ip(), a.to_ip()) {
            (IpAddr::V4(n), IpAddr::V4(x)) => {
                let m = u32::MAX.checked_shl(32 - u32::from(c.prefix_len())).unwrap_or(0);
                u32::from(n) & m == u32::from(x) & m
            }
            (IpAddr::V6(n), IpAddr::V6(x)) => {
                let m = u128::MAX.checked_shl(128 - u32::from(c.prefix_len())).unwrap_or(0);
                u128::from(n) & m == u128::from(x) & m
            }
            _ => false,
        }
    }

    /// Linear scan in precedence order: the definition the index must agree with.
    fn reference<'a>(routes: &'a [RouteSpec], f: &Flow, has_ports: bool, l4: Option<&[u8]>) -> Option<&'a str> {
        let mut order: Vec<&RouteSpec> = routes.iter().collect();
        order.sort_by(|x, y| y.priority.cmp(&x.priority).then_with(|| x.name.cmp(&y.name)));
        let any = |p: &[PortRange]| p.is_empty() || p.contains(&PortRange::ANY);
        order
            .into_iter()
            .find(|r| {
                r.matches.vips.contains(&f.dst)
                    && (r.matches.protocols.is_empty() || r.matches.protocols.contains(&f.proto))
                    && (any(&r.matches.dst_ports) || (has_ports && r.matches.dst_ports.iter().any(|p| p.contains(f.dport))))
                    && (r.matches.src_cidrs.is_empty() || r.matches.src_cidrs.iter().any(|c| in_prefix(c, f.src)))
                    && (any(&r.matches.src_ports) || (has_ports && r.matches.src_ports.iter().any(|p| p.contains(f.sport))))
                    && r.matches.byte_matches.iter().filter(|b| b.proto == f.proto).all(|b| l4.is_none_or(|l| b.matches(l)))
            })
            .map(|r| r.name.as_str())
    }

    const VIPS: [&str; 5] = ["20.0.0.1", "20.0.0.2", "20.0.0.3", "2001:db8::1", "2001:db8::2"];
    const SRCS: [&str; 8] = ["10.0.0.0/8", "10.1.0.0/16", "192.168.0.0/24", "0.0.0.0/0", "2001:db8:1::/48", "::/0", "::/80", "0.0.0.0/1"];
    const PORTS: [u16; 8] = [0, 1, 53, 80, 443, 8080, 40000, 65535];

    fn port_range() -> impl Strategy<Value = PortRange> {
        (0..PORTS.len(), 0..PORTS.len(), 0u16..3).prop_map(|(a, b, jitter)| {
            let (lo, hi) = (PORTS[a.min(b)], PORTS[a.max(b)]);
            PortRange { lo, hi: hi.saturating_add(jitter).max(lo) }
        })
    }

    fn route_spec(i: usize) -> impl Strategy<Value = RouteSpec> {
        (
            -2i32..3,
            proptest::sample::subsequence(VIPS.to_vec(), 1..3),
            proptest::sample::subsequence(SRCS.to_vec(), 0..3),
            proptest::collection::vec(port_range(), 0..3),
            proptest::collection::vec(port_range(), 0..3),
            proptest::sample::subsequence(vec![proto::TCP, proto::UDP, proto::SCTP], 0..3),
            proptest::option::of((0u16..24, 0u32..4)),
        )
            .prop_map(move |(priority, vips, srcs, sports, dports, protocols, bm)| RouteSpec {
                name: format!("r{i:03}"),
                priority,
                service: 0,
                matches: RouteMatch {
                    vips: vips.iter().map(|v| a(v)).collect(),
                    src_cidrs: srcs.iter().map(|s| s.parse().unwrap()).collect(),
                    src_ports: sports,
                    dst_ports: dports,
                    protocols,
                    byte_matches: bm
                        .map(|(off, v)| vec![ByteMatch { proto: proto::TCP, offset: off, len: 1, mask: 0x3, value: v }])
                        .unwrap_or_default(),
                }.into(),
            })
    }

    fn routes() -> impl Strategy<Value = Vec<RouteSpec>> {
        (1usize..40).prop_flat_map(|n| (0..n).map(route_spec).collect::<Vec<_>>())
    }

    fn flows() -> impl Strategy<Value = Vec<(Flow, bool, Option<Vec<u8>>)>> {
        let src = prop_oneof![
            (any::<[u8; 4]>()).prop_map(Addr::v4),
            Just(a("10.1.2.3")),
            Just(a("192.168.0.7")),
            Just(a("::1")),
            Just(a("2001:db8:1::9")),
            (any::<[u8; 16]>()).prop_map(Addr::v6),
        ];
        let port = prop_oneof![(0..PORTS.len()).prop_map(|i| PORTS[i]), any::<u16>()];
        proptest::collection::vec(
            (
                src,
                0..VIPS.len() + 1,
                port.clone(),
                port,
                prop_oneof![Just(proto::TCP), Just(proto::UDP), Just(proto::SCTP), Just(proto::ICMP)],
                any::<bool>(),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24)),
            )
                .prop_map(|(src, v, sport, dport, p, has_ports, l4)| {
                    let dst = if v == VIPS.len() { a("9.9.9.9") } else { a(VIPS[v]) };
                    (Flow { src, dst, sport, dport, proto: p }, has_ports, l4)
                }),
            1..64,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        #[test]
        fn agrees_with_linear_scan(rs in routes(), fs in flows()) {
            let c = Classifier::build(&rs);
            for (f, has_ports, l4) in &fs {
                let (vip, got) = c.classify_with_vip(f, *has_ports, l4.as_deref());
                // The port hash and the interval search agree.
                prop_assert_eq!(vip, c.vip_index(f.dst));
                prop_assert_eq!(got, vip.map_or(Lookup::NotVip, |v| c.classify_vip(v, f, *has_ports, l4.as_deref())));
                let want = reference(&rs, f, *has_ports, l4.as_deref());
                let is_vip = rs.iter().any(|r| r.matches.vips.contains(&f.dst));
                match got {
                    Lookup::NotVip => prop_assert!(!is_vip),
                    Lookup::NoRoute => prop_assert!(is_vip && want.is_none(), "{f:?}: index found none, reference {want:?}"),
                    Lookup::Route(i) => prop_assert_eq!(Some(c.route(i).name.as_str()), want, "{:?}", f),
                }
            }
        }
    }
}

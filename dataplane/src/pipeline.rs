//! What a worker does to one packet: filter by destination MAC, parse,
//! classify, select an endpoint, rewrite, and decide where it goes.
//!
//! - Destination is a VIP: load-balanced to an endpoint of the route's
//!   service (ICMP errors about a VIP flow follow that flow; later IP
//!   fragments follow their first fragment, or are held until it comes).
//! - Too big for its tunnel: the ICMP error path-MTU discovery needs goes
//!   back to the client instead ([`crate::icmp`]), at a bounded rate; an
//!   IPv4 packet without DF is dropped as `encap_too_big_no_df` (the
//!   appliance does not fragment outer packets).
//! - Forwarded at layer 2 (to an endpoint, or return traffic to the
//!   gateway) but larger than the output's MTU: IPv4 without DF goes on,
//!   and the worker sends it as fragments ([`crate::fragment`]); with DF,
//!   or IPv6, the ICMP error goes back to its source instead, or it is
//!   dropped as `too_big_for_output` where none may be sent.
//! - Source is a VIP: return traffic, sent to the gateway when it comes
//!   from an endpoint of a service that VIP routes to (input port and source
//!   MAC), dropped otherwise; to the kernel when it is addressed to one of
//!   the appliance's own addresses (the answer to a check of the VIP).
//! - With several workers, a packet whose fate depends on a worker's state
//!   (every fragment to a VIP, every packet of a service with a flow table,
//!   ICMP errors included) is handed to the worker that owns its flow
//!   ([`crate::steer`]), unless it came from another worker already.
//! - Anything else addressed to the appliance, and every broadcast or
//!   multicast frame: the kernel's business (exception path).
//!
//! Sharing pins with sibling appliances ([`crate::sync`], when attached
//! with [`Pipeline::attach_sync`]), for services with a flow table:
//! - a pin hit of a Maglev service whose table changed since the pin was
//!   made or last checked (the pin's sync mark differs from the service's)
//!   is checked once: when the table now chooses another endpoint than the
//!   pin's, a sibling without the pin would send the flow elsewhere, so
//!   its record goes into the worker's sync ring (`sync_exported`; a full
//!   ring is counted as `sync_ring_full` and the next packet tries again);
//! - a flow with no pin of its own (not a TCP SYN, which always takes the
//!   table) looks up the pins received from siblings before the table,
//!   and takes one whose endpoint is still there, of the same incarnation
//!   (`sync_pin_hits`); a pin so taken is checked for export at once, so
//!   that it outlives the sibling that sent it.

use crate::counters::WorkerCounters;
use crate::flow::{FlowKey, FlowPin, FlowState, FlowTable, FlowTimeouts, FragKey, FragTable, Pin};
use crate::handshake::{Answer, Handshakes};
use crate::hash::flow_hash;
use crate::icmp::{self, RateLimit};
use crate::io::{PacketBuf, BURST};
use crate::parse::{ethertype, parse_into, v4, v6, Flow, Fragment, Kind, Parsed, ETH_LEN};
use crate::rewrite::{encapsulate, forward_l2, remove_vlan_tag, Tunnel};
use crate::service::{Algorithm, Delivery, Endpoint, Service};
use crate::snapshot::Snapshot;
use crate::classify::Lookup;
use crate::addr::Addr;
use crate::steer::owner;
use crate::sync::{PinRecord, SyncRing, SyncedPins};
use crate::rcu::Reader;
use std::sync::Arc;
use crate::verdict::{DropReason, Verdict};

/// Offset of the flags in a TCP header, and the flags a new connection
/// is told by.
const TCP_FLAGS: usize = 13;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;
const TCP_RST: u8 = 0x04;

/// Sizes of a worker's tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Flow-table entries.
    pub flow_entries: usize,
    /// How long a flow-table entry lives without traffic, per protocol state.
    pub flow_timeouts: FlowTimeouts,
    /// Fragment-table entries.
    pub frag_entries: usize,
    /// Milliseconds a first fragment's decision is kept.
    pub frag_ttl_ms: u64,
    /// ICMP errors (fragmentation needed, packet too big) a worker may send
    /// per second, on average.
    pub icmp_rate: u32,
    /// ICMP errors a worker may send in a burst.
    pub icmp_burst: u32,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            flow_entries: 65536,
            flow_timeouts: FlowTimeouts::default(),
            frag_entries: 4096,
            frag_ttl_ms: 5000,
            icmp_rate: 1000,
            icmp_burst: 100,
        }
    }
}

const _: () = assert!(BURST <= 64, "the look-ahead stages keep a bit per packet of a burst in a u64");

/// What the look-ahead stages learned of one packet of a burst, kept so
/// that processing it does not parse and classify it again.
#[derive(Clone, Copy, Debug, Default)]
struct Ahead {
    /// The frame it was learned from (address, length): a packet other than
    /// the one looked at is never taken for it.
    frame: (usize, usize),
    /// Its headers; meaningful when `ip`.
    parsed: Parsed,
    /// The frame parsed as IP (otherwise processing parses it itself).
    ip: bool,
    /// Index of the destination VIP (`u32::MAX`: none looked up).
    vip: u32,
    /// Index of its service in the snapshot (`u32::MAX`: not classified:
    /// processing classifies it).
    service: u32,
    /// Its flow hash, when `service` is set.
    hash: u64,
    /// A TCP SYN (without ACK), when `service` is set.
    syn: bool,
    /// The position of the endpoint its Maglev table entry names (its
    /// record requested; its counters a stage later).
    chosen: Option<u16>,
    /// The endpoint the way of the flow-table bucket with the flow's
    /// signature is pinned to, when the service's table did not name it
    /// (its record requested; its counters a stage later).
    pinned: Option<u16>,
    /// What it is expected to look its service's table up with, when that
    /// is known only once its bucket is read: the draw of the random
    /// algorithm (a SYN, a flow without a pin), or the flow hash for a
    /// Maglev flow without a pin (its table entry requested in stage 3);
    /// and the position of the endpoint that entry names (its record
    /// requested; its counters a stage later).
    draw: Option<u64>,
    drawn: Option<u16>,
}

impl Ahead {
    /// Whether the packet looks its Maglev service's table up for certain,
    /// so that the stages request the entry at once: without flow state, or
    /// a SYN (which takes the table whatever its pin). A packet of a flow
    /// with a pin follows the pin and leaves the table alone.
    #[inline(always)]
    fn takes_table(&self, svc: &Service) -> bool {
        svc.algorithm == Algorithm::Maglev && (!svc.flow_table || self.syn)
    }

    fn frame_of(frame: &[u8]) -> (usize, usize) {
        (frame.as_ptr() as usize, frame.len())
    }

    /// The classification of the look-ahead stages for a packet parsed as
    /// IP (`frame`): its VIP, and for the common case its service (then
    /// requested), flow hash and whether it is a TCP SYN.
    #[inline(always)]
    fn classify(&mut self, snap: &Snapshot, frame: &[u8], prefetch: &impl Fn(*const u8)) {
        let c = &snap.classifier;
        let p = &self.parsed;
        if p.frag != Fragment::No || p.icmp_error {
            self.vip = c.vip_index(p.flow.dst).map_or(u32::MAX, |v| u32::try_from(v).unwrap_or(u32::MAX));
            return;
        }
        let l4 = frame.get(usize::from(p.l4)..usize::from(p.ip_end));
        let (vip, lookup) = c.classify_with_vip(&p.flow, p.has_ports, l4);
        let Some(vip) = vip else { return };
        self.vip = u32::try_from(vip).unwrap_or(u32::MAX);
        let Lookup::Route(r) = lookup else { return };
        let Some(s) = c.service_of(r) else { return };
        let Some(svc) = snap.services.get(s as usize) else { return };
        prefetch(std::sync::Arc::as_ptr(svc).cast());
        self.service = s;
        self.hash = flow_hash(&p.flow);
        self.syn = p.flow.proto == 6 && p.has_ports && l4.and_then(|l| l.get(TCP_FLAGS)).is_some_and(|f| f & (TCP_SYN | TCP_ACK) == TCP_SYN);
    }
}

/// The service and flow hash the look-ahead stages found for a packet.
#[derive(Clone, Copy)]
struct Classified {
    service: u32,
    hash: u64,
}

/// What the last packet did to fragment state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FragEvent {
    /// Nothing.
    #[default]
    None,
    /// A later fragment with no decision yet: held under this key.
    Held(FragKey),
    /// A first fragment: its decision now serves this key.
    Pinned(FragKey),
}

/// One worker's pipeline state.
#[derive(Debug)]
pub struct Pipeline {
    state: State,
    /// Headers of the packet being processed (reused: the parser sets
    /// every field the pipeline reads).
    parsed: Parsed,
    /// What the look-ahead stages learned of the burst being processed
    /// (the first `ahead_len` entries).
    ahead: Box<[Ahead; BURST]>,
    ahead_len: usize,
}

/// Which worker this is among how many, when packets are steered.
#[derive(Clone, Copy, Debug)]
struct Steer {
    workers: u16,
    me: u16,
}

/// The tables and the per-packet outcome a pipeline keeps.
#[derive(Debug)]
struct State {
    flows: FlowTable,
    frags: FragTable,
    rng: u64,
    frag_event: FragEvent,
    icmp: RateLimit,
    steer: Option<Steer>,
    sync: Option<SyncPort>,
    handshakes: Option<Arc<Handshakes>>,
}

/// A pipeline's link with sibling appliances: where its exports go, and
/// the pins received from them.
#[derive(Debug)]
struct SyncPort {
    ring: Arc<SyncRing>,
    synced: Reader<SyncedPins>,
}

fn frag_key(p: &Parsed) -> FragKey {
    FragKey { src: p.flow.src, dst: p.flow.dst, id: p.frag_id, proto: p.flow.proto }
}

impl Pipeline {
    /// A pipeline with its tables allocated; `seed` varies the `random`
    /// algorithm between workers.
    pub fn new(cfg: &PipelineConfig, seed: u64) -> Pipeline {
        Pipeline {
            state: State {
                flows: FlowTable::new(cfg.flow_entries, cfg.flow_timeouts),
                frags: FragTable::new(cfg.frag_entries, cfg.frag_ttl_ms),
                rng: seed | 1,
                frag_event: FragEvent::None,
                icmp: RateLimit::new(cfg.icmp_rate, cfg.icmp_burst),
                steer: None,
                sync: None,
                handshakes: None,
            },
            parsed: Parsed::default(),
            ahead: Box::new([Ahead::default(); BURST]),
            ahead_len: 0,
        }
    }

    /// Makes this the pipeline of worker `index` of `workers`: packets whose
    /// flow another worker owns get [`Verdict::Steer`]. One worker (or none)
    /// turns steering off.
    pub fn set_steering(&mut self, workers: u16, index: u16) {
        self.state.steer = (workers > 1).then_some(Steer { workers, me: index });
    }

    /// Shares pins with sibling appliances: exports go into `ring`, and
    /// flows without a pin look up the pins `synced` reads (see the
    /// module's header). [`Pipeline::begin_round`] moves to the latest
    /// synced pins.
    pub fn attach_sync(&mut self, ring: Arc<SyncRing>, synced: Reader<SyncedPins>) {
        self.state.sync = Some(SyncPort { ring, synced });
    }

    /// Records TCP handshakes with endpoints in `table`, shared with the
    /// other workers and the control side (passive health, see
    /// [`crate::handshake`]): each SYN sent to an endpoint, and the SYN-ACK
    /// or RST that comes back on the return path.
    pub fn attach_handshakes(&mut self, table: Arc<Handshakes>) {
        self.state.handshakes = Some(table);
    }

    /// Takes the latest pins received from siblings, and lets go of those
    /// it used before (the quiescent point of their reader). Call it once
    /// per round of bursts, as the snapshot is read.
    #[inline]
    pub fn begin_round(&mut self) {
        if let Some(s) = self.state.sync.as_mut() {
            s.synced.read();
        }
    }

    /// Stops holding back the reclamation of synced pins (a worker
    /// stopping).
    pub fn sync_offline(&mut self) {
        if let Some(s) = self.state.sync.as_mut() {
            s.synced.offline();
        }
    }

    /// The flow table (for status).
    pub fn flows(&self) -> &FlowTable {
        &self.state.flows
    }

    /// Moves the flow table's count of live entries on (a step, see
    /// [`FlowTable::census`]) and publishes it, with the table's capacity,
    /// in `ctr`; `now_ms` is the clock [`Pipeline::process`] is given.
    pub fn flow_census(&mut self, now_ms: u64, ctr: &WorkerCounters) {
        let now_s = u32::try_from(now_ms / 1000).unwrap_or(u32::MAX).saturating_add(1);
        let flows = &mut self.state.flows;
        ctr.flow_entries.set(flows.census(now_s) as u64);
        ctr.flow_capacity.set(flows.capacity() as u64);
    }

    /// Fragment state change made by the last [`Pipeline::process`].
    pub fn frag_event(&self) -> FragEvent {
        self.state.frag_event
    }

    /// The look-ahead stages over a burst about to be processed, as DPDK's
    /// l3fwd and VPP's nodes do: what [`Pipeline::process`] will read for
    /// each packet is requested with `prefetch` one dependency level at a
    /// time for the whole burst, so that the cache misses of the burst
    /// overlap instead of adding up (frames requested first):
    /// - stage 1 parses and classifies each packet and requests its
    ///   service; when the port hash is too big for the cache, the slot the
    ///   classification starts at is requested first, and the burst
    ///   classified in a second pass;
    /// - stage 2 its flow-table bucket, its service counters and, when it
    ///   will take its Maglev table for certain (no flow state, or a SYN),
    ///   its table entry;
    /// - stage 3 the key of the bucket's way with the flow's signature, the
    ///   endpoint its table entry names, and the endpoint that way is pinned
    ///   to when the table did not name it; stage 4 the counters of those
    ///   endpoints. A flow with a pin leaves the table alone;
    /// - a packet that takes its table once its bucket is read (a Maglev
    ///   flow without a pin; a random service's packet expected to draw: a
    ///   SYN, a flow without a pin, the draw worked out ahead from a copy of
    ///   the generator) has its table entry requested in stage 3, the
    ///   endpoint it names in stage 4 and that endpoint's counters in
    ///   stage 5.
    ///
    /// Only the common case (a whole datagram to a VIP, not an ICMP error)
    /// is looked at. Reads only: no state, verdict or counter changes.
    pub fn prefetch_burst<P: PacketBuf>(&mut self, snap: &Snapshot, ctr: &WorkerCounters, pkts: &[P], prefetch: impl Fn(*const u8)) {
        let pkts = pkts.get(..BURST).unwrap_or(pkts);
        for pkt in pkts {
            pkt.prefetch();
        }
        let c = &snap.classifier;
        self.ahead_len = pkts.len();
        // Stage 1: parse, and classify; when the port hash is too big to
        // stay in the cache, the slot each packet's classification starts
        // at is requested first, and the burst classified in a second pass.
        let mut later = 0u64; // bit i: packet i classified in the second pass
        for (i, (a, pkt)) in self.ahead.iter_mut().zip(pkts).enumerate() {
            let frame = pkt.data();
            a.frame = Ahead::frame_of(frame);
            a.vip = u32::MAX;
            a.service = u32::MAX;
            a.syn = false;
            a.ip = frame.first().is_some_and(|b| b & 1 == 0) && matches!(parse_into(frame, &mut a.parsed), Ok(Kind::Ip));
            if !a.ip {
                continue;
            }
            let p = &a.parsed;
            if p.has_ports && p.frag == Fragment::No && !p.icmp_error {
                if let Some(slot) = c.port_slot_addr(&p.flow) {
                    prefetch(slot);
                    later |= 1 << i;
                    continue;
                }
            }
            a.classify(snap, frame, &prefetch);
        }
        if later != 0 {
            for (i, (a, pkt)) in self.ahead.iter_mut().zip(pkts).enumerate() {
                if later & 1 << i != 0 {
                    a.classify(snap, pkt.data(), &prefetch);
                }
            }
        }
        for a in &self.ahead[..pkts.len()] {
            let Some(svc) = snap.services.get(a.service as usize) else { continue };
            if let Some(t) = &svc.table {
                if a.takes_table(svc) {
                    prefetch(t.entry_addr(a.hash));
                }
            }
            if svc.flow_table {
                prefetch(self.state.flows.bucket_addr(a.hash, svc.key));
            }
            if a.syn {
                // Passive health records the SYN in its slot.
                if let Some(hs) = self.state.handshakes.as_deref() {
                    prefetch(hs.slot_addr(a.hash));
                }
            }
            if let Some(sc) = ctr.services.get(svc.key as usize) {
                prefetch(std::ptr::from_ref(sc).cast());
            }
        }
        // The draws of the random algorithm the burst's packets will make,
        // in their order, from a copy of the generator (nothing changes):
        // where a guess of which packets make one is wrong, a request is
        // wasted, never an outcome changed.
        let mut rng = self.state.rng;
        let mut late = false; // a table entry requested in stage 3
        for a in &mut self.ahead[..pkts.len()] {
            (a.chosen, a.pinned, a.draw, a.drawn) = (None, None, None, None);
            let Some(svc) = snap.services.get(a.service as usize) else { continue };
            if a.takes_table(svc) {
                if let Some(t) = &svc.table {
                    // The entry requested a stage ago: the endpoint it names.
                    let at = t.lookup(a.hash);
                    prefetch(svc.endpoint_addr(at));
                    a.chosen = Some(at);
                }
            }
            if !svc.flow_table {
                continue;
            }
            // The bucket requested a stage ago: the key of the way whose
            // signature matches, which a hit compares, and the endpoint
            // that way is pinned to (where [`Service::pinned_flow`] looks
            // first; read even for a SYN, which then takes the table), when
            // the table did not name it (a random service's flows, a Maglev
            // flow pinned before its table changed).
            let hint = self.state.flows.way_hint(a.hash, svc.key);
            if let Some((key, pin)) = hint {
                prefetch(key);
                let id = pin.endpoint();
                if a.chosen != Some(id) {
                    prefetch(svc.endpoint_addr(id));
                    a.pinned = Some(id);
                }
            }
            let draw = match svc.algorithm {
                // A SYN, or a flow without a pin: it draws.
                Algorithm::Random if a.syn || hint.is_none() => {
                    let (next, draw) = random_step(rng);
                    rng = next;
                    Some(draw)
                }
                // A flow without a pin (not a SYN, whose entry is already
                // requested): it takes the table.
                Algorithm::Maglev if !a.syn && hint.is_none() => Some(a.hash),
                _ => None,
            };
            if let (Some(draw), Some(t)) = (draw, &svc.table) {
                prefetch(t.entry_addr(draw));
                a.draw = Some(draw);
                late = true;
            }
        }
        for a in &mut self.ahead[..pkts.len()] {
            // Stage 4: the counters of the endpoints whose records were
            // requested a stage ago; the endpoint a late table entry names (its
            // entry requested a stage ago).
            let Some(svc) = snap.services.get(a.service as usize) else { continue };
            if let Some(ep) = a.chosen.and_then(|at| svc.endpoint_at(at)) {
                request_counters(ctr, ep, &prefetch);
            }
            if let Some(ep) = a.pinned.and_then(|id| svc.endpoint_at(id).filter(|e| e.id == id)) {
                request_counters(ctr, ep, &prefetch);
            }
            if let (Some(draw), Some(t)) = (a.draw, &svc.table) {
                let at = t.lookup(draw);
                prefetch(svc.endpoint_addr(at));
                a.drawn = Some(at);
            }
        }
        if !late {
            return; // no table entry requested in stage 3
        }
        for a in &self.ahead[..pkts.len()] {
            // Stage 5: the counters of the endpoint a late entry names.
            let Some(at) = a.drawn else { continue };
            if let Some(ep) = snap.services.get(a.service as usize).and_then(|svc| svc.endpoint_at(at)) {
                request_counters(ctr, ep, &prefetch);
            }
        }
    }

    /// [`Pipeline::process`] for packet `index` of the burst last given to
    /// [`Pipeline::prefetch_burst`]: what the stages learned of it (headers,
    /// VIP, service, flow hash) is used instead of being worked out again.
    /// A packet the stages did not see (or not as it is now) is processed
    /// from scratch; the verdict is the same either way. `may_steer` false:
    /// a packet another worker handed over, never steered again (as
    /// [`Pipeline::process_steered`]).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn process_ahead<P: PacketBuf>(
        &mut self,
        index: usize,
        snap: &Snapshot,
        in_port: u8,
        pkt: &mut P,
        now_ms: u64,
        ctr: &WorkerCounters,
        may_steer: bool,
    ) -> Verdict {
        let staged = index < self.ahead_len && self.ahead[index].ip && self.ahead[index].frame == Ahead::frame_of(pkt.data());
        if !staged {
            return self.process_from(snap, in_port, pkt, now_ms, ctr, may_steer);
        }
        self.state.frag_event = FragEvent::None;
        if let Some(v) = check_l2(snap, in_port, pkt.data()) {
            return v;
        }
        let a = &self.ahead[index];
        if !vlan_served(snap, in_port, &a.parsed) {
            return Verdict::Drop(DropReason::VlanNotServed);
        }
        let cx = Cx { snap, in_port, now_ms, ctr, may_steer };
        let vip = (a.vip != u32::MAX).then_some(a.vip as usize);
        let pre = (a.service != u32::MAX).then_some(Classified { service: a.service, hash: a.hash });
        let v = self.state.decide_with(&cx, &a.parsed, pkt, vip, pre);
        if v == Verdict::Exception {
            return to_kernel(snap, in_port, pkt);
        }
        v
    }

    /// Decides the fate of `pkt`, received on port `in_port`, rewriting it
    /// in place when it is forwarded. `now_ms` is a monotonic clock.
    #[inline]
    pub fn process<P: PacketBuf>(
        &mut self,
        snap: &Snapshot,
        in_port: u8,
        pkt: &mut P,
        now_ms: u64,
        ctr: &WorkerCounters,
    ) -> Verdict {
        self.process_from(snap, in_port, pkt, now_ms, ctr, true)
    }

    /// [`Pipeline::process`] for a packet another worker handed over (or
    /// one this worker held back): never [`Verdict::Steer`].
    #[inline]
    pub fn process_steered<P: PacketBuf>(
        &mut self,
        snap: &Snapshot,
        in_port: u8,
        pkt: &mut P,
        now_ms: u64,
        ctr: &WorkerCounters,
    ) -> Verdict {
        self.process_from(snap, in_port, pkt, now_ms, ctr, false)
    }

    #[inline(always)]
    fn process_from<P: PacketBuf>(
        &mut self,
        snap: &Snapshot,
        in_port: u8,
        pkt: &mut P,
        now_ms: u64,
        ctr: &WorkerCounters,
        may_steer: bool,
    ) -> Verdict {
        self.state.frag_event = FragEvent::None;
        let frame = pkt.data();
        if let Some(v) = check_l2(snap, in_port, frame) {
            return if v == Verdict::Exception { to_kernel(snap, in_port, pkt) } else { v };
        }
        let v = match parse_into(frame, &mut self.parsed) {
            Ok(Kind::Ip) => {
                if !vlan_served(snap, in_port, &self.parsed) {
                    return Verdict::Drop(DropReason::VlanNotServed);
                }
                let cx = Cx { snap, in_port, now_ms, ctr, may_steer };
                self.state.decide(&cx, &self.parsed, pkt)
            }
            Ok(Kind::Other { .. }) => Verdict::Exception,
            Err(r) => Verdict::Drop(r),
        };
        if v == Verdict::Exception {
            return to_kernel(snap, in_port, pkt);
        }
        v
    }
}

/// The verdict for a frame that is too short, not for this appliance's
/// MAC on `in_port`, or broadcast/multicast; `None` when it goes on.
#[inline(always)]
fn check_l2(snap: &Snapshot, in_port: u8, frame: &[u8]) -> Option<Verdict> {
    if frame.len() < ETH_LEN {
        return Some(Verdict::Drop(DropReason::EthTruncated));
    }
    if frame[0] & 1 != 0 {
        return Some(Verdict::Exception); // broadcast, multicast
    }
    if let (Some(port), Some(dst)) = (snap.ports.get(usize::from(in_port)), frame.first_chunk::<6>()) {
        if *dst != port.mac {
            return Some(Verdict::Drop(DropReason::NotOurMac));
        }
    }
    None
}

/// True when the VLAN tags of `p` are what port `in_port` serves: none (or
/// one priority tag, VLAN 0) on a port without a VLAN, exactly its one tag
/// on a port with one.
#[inline(always)]
fn vlan_served(snap: &Snapshot, in_port: u8, p: &Parsed) -> bool {
    let want = snap.ports.get(usize::from(in_port)).map_or(0, |port| port.vlan);
    if p.vlans == 0 {
        want == 0
    } else {
        p.vlans == 1 && p.vlan_ids[0] == want
    }
}

/// A frame for the kernel's interface of `in_port`, which is untagged: a
/// frame of the port's VLAN loses its tag; a frame of no VLAN the port
/// serves is dropped.
#[cold]
fn to_kernel<P: PacketBuf>(snap: &Snapshot, in_port: u8, pkt: &mut P) -> Verdict {
    let want = snap.ports.get(usize::from(in_port)).map_or(0, |port| port.vlan);
    let f = pkt.data();
    let tpid = |at: usize| f.get(at..at + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    let is_tag = |t: Option<u16>| matches!(t, Some(ethertype::VLAN | ethertype::QINQ | ethertype::QINQ_OLD));
    if !is_tag(tpid(12)) {
        return if want == 0 { Verdict::Exception } else { Verdict::Drop(DropReason::VlanNotServed) };
    }
    let vid = tpid(14).map(|t| t & 0x0fff);
    if vid != Some(want) || is_tag(tpid(16)) {
        return Verdict::Drop(DropReason::VlanNotServed);
    }
    if !remove_vlan_tag(pkt) {
        return Verdict::Drop(DropReason::EthTruncated);
    }
    Verdict::Exception
}

/// One step of the `random` algorithm's generator (xorshift64*) from
/// state `x`: the next state and the draw.
#[inline(always)]
fn random_step(mut x: u64) -> (u64, u64) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    (x, x.wrapping_mul(0x2545_f491_4f6c_dd1d))
}

/// What a decision needs besides the packet.
struct Cx<'a> {
    snap: &'a Snapshot,
    in_port: u8,
    now_ms: u64,
    ctr: &'a WorkerCounters,
    may_steer: bool,
}

impl State {
    #[inline(always)]
    fn next_random(&mut self) -> u64 {
        let (next, draw) = random_step(self.rng);
        self.rng = next;
        draw
    }

    /// The worker that owns the flows between `client` and `vip`, when it
    /// is not this one and the packet may be steered.
    #[inline(always)]
    fn steer_to(&self, cx: &Cx<'_>, client: Addr, vip: Addr) -> Option<u16> {
        let s = self.steer.filter(|_| cx.may_steer)?;
        let o = owner(client, vip, s.workers);
        (o != s.me).then_some(o)
    }

    /// The verdict for a parsed IP packet.
    #[inline(always)]
    fn decide<P: PacketBuf>(&mut self, cx: &Cx<'_>, p: &Parsed, pkt: &mut P) -> Verdict {
        let c = &cx.snap.classifier;
        if p.frag != Fragment::No || p.icmp_error {
            return self.decide_with(cx, p, pkt, c.vip_index(p.flow.dst), None);
        }
        // The common case: the VIP and the route in one lookup.
        let l4 = pkt.data().get(usize::from(p.l4)..usize::from(p.ip_end));
        let (vip, lookup) = c.classify_with_vip(&p.flow, p.has_ports, l4);
        let pre = match lookup {
            Lookup::Route(r) => c.service_of(r).map(|service| Classified { service, hash: flow_hash(&p.flow) }),
            Lookup::NoRoute | Lookup::NotVip => None,
        };
        self.decide_with(cx, p, pkt, vip, pre)
    }

    /// [`State::decide`] given what is known already: the index of the
    /// destination VIP (`None`: not a VIP), and for a whole datagram to
    /// it that is not an ICMP error, its service and flow hash.
    #[inline(always)]
    fn decide_with<P: PacketBuf>(&mut self, cx: &Cx<'_>, p: &Parsed, pkt: &mut P, vip: Option<usize>, pre: Option<Classified>) -> Verdict {
        let snap = cx.snap;
        let c = &snap.classifier;
        if let Some(vip) = vip {
            return self.balance(cx, vip, p, pkt, pre);
        }
        if let Some(vip) = c.vip_index(p.flow.src) {
            let from = pkt.data().get(6..12).and_then(|m| <[u8; 6]>::try_from(m).ok()).unwrap_or_default();
            if !snap.return_allowed(vip, cx.in_port, from) {
                return Verdict::Drop(DropReason::ReturnNotFromEndpoint);
            }
            if snap.is_own(p.flow.dst) {
                // An endpoint's answer to the appliance's check of the VIP.
                return Verdict::Exception;
            }
            let gw = if p.v6 { snap.gateway_v6 } else { snap.gateway_v4 };
            let Some(gw) = gw else { return Verdict::Drop(DropReason::NoGateway) };
            let out = snap.ports.get(usize::from(gw.port)).copied().unwrap_or_default();
            if let Some(v) = self.too_big(cx, p, pkt, out.mtu) {
                return v;
            }
            if let Some(hs) = self.handshakes.as_deref() {
                answered(hs, p, pkt.data());
            }
            return match forward_l2(pkt, p, out.mac, gw.mac, out.vlan) {
                Ok(()) => {
                    cx.ctr.returned.add(1);
                    Verdict::Forward(gw.port)
                }
                Err(r) => Verdict::Drop(r),
            };
        }
        Verdict::Exception
    }

    #[inline]
    fn balance<P: PacketBuf>(&mut self, cx: &Cx<'_>, vip: usize, p: &Parsed, pkt: &mut P, pre: Option<Classified>) -> Verdict {
        let (snap, ctr, now_ms) = (cx.snap, cx.ctr, cx.now_ms);
        let c = &snap.classifier;
        let len = pkt.data().len();
        if p.frag != Fragment::No {
            // Fragments follow their first through the fragment table (and
            // the held ones wait in the stash) of the worker that owns the flow.
            if let Some(w) = self.steer_to(cx, p.flow.src, p.flow.dst) {
                return Verdict::Steer(w);
            }
        }
        if p.frag == Fragment::Later {
            let key = frag_key(p);
            let Some(pin) = self.frags.lookup(&key, now_ms.max(1)) else {
                self.frag_event = FragEvent::Held(key);
                return Verdict::Stash;
            };
            let Some(svc) = snap.service_by_key(pin.service) else { return Verdict::Drop(DropReason::NoEndpoint) };
            let Some(ep) = svc.pinned(&pin) else {
                return Verdict::Drop(DropReason::NoEndpoint);
            };
            return self.deliver(cx, svc, ep, p, pkt, flow_hash(&p.flow), len);
        }
        let about;
        let (key, has_ports, l4) = if p.icmp_error {
            // About a reply (VIP -> client): the flow is its reverse.
            about = if c.is_vip(p.inner.src) { p.inner.reversed() } else { p.inner };
            (&about, p.inner_ports, None)
        } else {
            (&p.flow, p.has_ports, pkt.data().get(usize::from(p.l4)..usize::from(p.ip_end)))
        };
        let pre = pre.filter(|_| !p.icmp_error && p.frag == Fragment::No);
        let service = if let Some(pre) = pre {
            pre.service
        } else {
            // An ICMP error's flow is towards the VIP it was sent to, or
            // towards another: look that one up.
            let lookup = if key.dst == p.flow.dst { c.classify_vip(vip, key, has_ports, l4) } else { c.classify(key, has_ports, l4) };
            match lookup {
                Lookup::Route(r) => c.service_of(r).unwrap_or(u32::MAX),
                Lookup::NoRoute | Lookup::NotVip => return Verdict::Drop(DropReason::NoRoute),
            }
        };
        let Some(svc) = snap.services.get(service as usize) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        if svc.flow_table && p.frag == Fragment::No {
            // The flow's endpoint is in the flow table of its owner.
            if let Some(w) = self.steer_to(cx, key.src, key.dst) {
                return Verdict::Steer(w);
            }
        }
        let hash = pre.map_or_else(|| flow_hash(key), |a| a.hash);
        let now_s = u32::try_from(now_ms / 1000).unwrap_or(u32::MAX).saturating_add(1);
        let tcp_flags = if key.proto == 6 && !p.icmp_error && has_ports { pkt.data().get(usize::from(p.l4) + TCP_FLAGS).copied().unwrap_or(0) } else { 0 };
        let Some(ep) = self.select(svc, key, hash, p.icmp_error, tcp_flags, (now_s, now_ms), ctr) else {
            return Verdict::Drop(DropReason::NoEndpoint);
        };
        if p.frag == Fragment::First {
            let fk = frag_key(p);
            let pin = Pin { service: svc.key, endpoint: ep.id, incarnation: ep.incarnation, at: svc.position(ep) };
            self.frags.insert(&fk, pin, now_ms.max(1));
            self.frag_event = FragEvent::Pinned(fk);
        }
        let v = self.deliver(cx, svc, ep, p, pkt, hash, len);
        if tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST) == TCP_SYN && matches!(v, Verdict::Forward(_)) {
            // A SYN on its way to its endpoint (one the appliance itself
            // dropped is not the endpoint's to answer).
            if let Some(hs) = self.handshakes.as_deref() {
                let c = if hs.syn(hash, svc.key, ep.id, ep.incarnation) { &ctr.handshakes_sampled } else { &ctr.handshakes_unsampled };
                c.add(1);
            }
        }
        ctr.flow_evictions.set(self.flows.stats.evictions);
        v
    }

    /// The endpoint for a flow of `svc` whose packet has TCP flags
    /// `tcp_flags` (0 when not TCP). With a flow table, a pinned flow
    /// follows its pin while the pinned endpoint (of that incarnation) is
    /// in the service, draining or not; a TCP SYN, a flow without a pin and
    /// a flow whose endpoint left take the service's table and are pinned
    /// to its choice. A flow without a pin (not a SYN) first looks up the
    /// pins received from siblings. An ICMP error follows its flow's pin,
    /// changing nothing. `now` is in seconds (the flow table's clock) and
    /// milliseconds.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn select<'s>(
        &mut self,
        svc: &'s Service,
        key: &Flow,
        hash: u64,
        icmp: bool,
        tcp_flags: u8,
        (now_s, now_ms): (u32, u64),
        ctr: &WorkerCounters,
    ) -> Option<&'s Endpoint> {
        if !svc.flow_table {
            let table = svc.table.as_ref()?;
            return svc.endpoint_at(table.lookup(hash));
        }
        let fk = FlowKey { flow: *key, service: svc.key };
        self.flows.advance(now_s);
        let (slot, found) = self.flows.probe(&fk, hash, now_s);
        let pinned = found.and_then(|p| Some((p, svc.pinned_flow(p)?)));
        if icmp {
            if let Some((_, ep)) = pinned {
                return Some(ep);
            }
            if let Some(ep) = found.is_none().then(|| self.synced(svc, &fk, hash, now_ms)).flatten() {
                return Some(ep);
            }
            let table = svc.table.as_ref()?;
            return svc.endpoint_at(table.lookup(hash));
        }
        let syn = key.proto == 6 && tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
        if let Some((p, ep)) = pinned.filter(|_| !syn) {
            let mut p = p.with_state(FlowState::after(Some(p.state()), key.proto, tcp_flags));
            if p.sync_mark() != svc.sync_mark() {
                p = self.check_export(svc, &fk, p, ep, hash, ctr);
            }
            self.flows.set(slot, &fk, p, now_s);
            return Some(ep);
        }
        let state = FlowState::after(None, key.proto, tcp_flags);
        if found.is_none() && !syn {
            if let Some(ep) = self.synced(svc, &fk, hash, now_ms) {
                // Checked for export at once: a sibling's pin this table
                // disagrees with is this appliance's to share now, so that
                // it outlives the sibling that sent it (an appliance that
                // starts takes only what its siblings hold).
                let p = self.check_export(svc, &fk, FlowPin::new(ep.id, ep.incarnation, state), ep, hash, ctr);
                self.flows.set(slot, &fk, p, now_s);
                ctr.sync_pin_hits.add(1);
                return Some(ep);
            }
        }
        let table = svc.table.as_ref()?;
        // Random: a uniformly random table entry, so weights hold.
        let at = if svc.algorithm == Algorithm::Maglev { table.lookup(hash) } else { table.lookup(self.next_random()) };
        let ep = svc.endpoint_at(at)?;
        self.flows.set(slot, &fk, FlowPin::new(ep.id, ep.incarnation, state).with_sync_mark(svc.sync_mark()), now_s);
        Some(ep)
    }

    /// The endpoint of a pin received from a sibling for `fk`, when there
    /// is one, still holding, whose endpoint is in `svc` with the same
    /// incarnation.
    #[inline]
    fn synced<'s>(&self, svc: &'s Service, fk: &FlowKey, hash: u64, now_ms: u64) -> Option<&'s Endpoint> {
        let sp = self.sync.as_ref()?.synced.last().lookup(fk, hash, now_ms)?;
        svc.endpoint(sp.endpoint).filter(|e| e.incarnation == sp.incarnation)
    }

    /// Pin `p` of flow `fk` (to `ep`), made under an older table of `svc`
    /// than the current one, checked once for export: when `svc` is a
    /// Maglev service whose table now chooses another endpoint for the
    /// flow, its record goes into the sync ring. Returns the pin with the
    /// service's mark, or unmarked when the ring was full (the next packet
    /// tries again).
    #[cold]
    #[inline(never)]
    fn check_export(&mut self, svc: &Service, fk: &FlowKey, p: FlowPin, ep: &Endpoint, hash: u64, ctr: &WorkerCounters) -> FlowPin {
        let marked = p.with_sync_mark(svc.sync_mark());
        let Some(sync) = self.sync.as_ref().filter(|_| svc.algorithm == Algorithm::Maglev) else { return marked };
        let choice = svc.table.as_ref().and_then(|t| svc.endpoint_at(t.lookup(hash)));
        if choice.is_some_and(|c| std::ptr::eq(c, ep)) {
            return marked;
        }
        let state = p.state();
        if sync.ring.push(PinRecord::new(fk, ep.id, ep.incarnation, state, self.flows.timeouts().of(state))) {
            ctr.sync_exported.add(1);
            marked
        } else {
            ctr.sync_ring_full.add(1);
            p
        }
    }

    /// Sends the packet to `ep`, or, when it is too big for the tunnel,
    /// answers the client with the ICMP error that says so.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn deliver<P: PacketBuf>(
        &mut self,
        cx: &Cx<'_>,
        svc: &Service,
        ep: &Endpoint,
        p: &Parsed,
        pkt: &mut P,
        hash: u64,
        len: usize,
    ) -> Verdict {
        let Some(port) = cx.snap.ports.get(usize::from(ep.port)) else { return Verdict::Drop(DropReason::NoEndpoint) };
        let r = match svc.delivery(ep) {
            Delivery::L2 => {
                if let Some(v) = self.too_big(cx, p, pkt, port.mtu) {
                    return v;
                }
                forward_l2(pkt, p, port.mac, ep.mac, port.vlan)
            }
            Delivery::IpIp { src } => {
                let t = Tunnel { src, dst: ep.addr, src_mac: port.mac, dst_mac: ep.mac, mtu: port.mtu, vlan: port.vlan };
                match encapsulate(pkt, p, &t, hash) {
                    Err(DropReason::EncapTooBig) if !p.v6 && !dont_fragment(pkt.data(), p) => {
                        return Verdict::Drop(DropReason::EncapTooBigNoDf);
                    }
                    Err(DropReason::EncapTooBig) => {
                        let outer = if src.is_v4() { v4::MIN_LEN } else { v6::LEN };
                        let mtu = port.mtu.saturating_sub(u16::try_from(outer).unwrap_or(u16::MAX));
                        return self.answer_too_big(cx, p, pkt, mtu, DropReason::EncapTooBig);
                    }
                    r => r,
                }
            }
        };
        match r {
            Ok(()) => {
                cx.ctr.balanced.add(1);
                count(cx.ctr, svc, ep, len);
                Verdict::Forward(ep.port)
            }
            Err(r) => Verdict::Drop(r),
        }
    }

    /// For a packet forwarded at layer 2 out of a port of MTU `mtu`: `None`
    /// when it fits, or is IPv4 without DF (the worker fragments it);
    /// otherwise the verdict that replaces it (the ICMP error to its
    /// source, or a drop).
    #[inline(always)]
    fn too_big<P: PacketBuf>(&mut self, cx: &Cx<'_>, p: &Parsed, pkt: &mut P, mtu: u16) -> Option<Verdict> {
        if usize::from(p.ip_end) - usize::from(p.l3) <= usize::from(mtu) {
            return None;
        }
        if !p.v6 && !dont_fragment(pkt.data(), p) {
            return None;
        }
        Some(self.answer_too_big(cx, p, pkt, mtu, DropReason::TooBigForOutput))
    }

    /// The ICMP error for a packet that does not fit `mtu`, out of the port
    /// it came in on; a drop (`otherwise`) when none may or can be sent.
    #[cold]
    fn answer_too_big<P: PacketBuf>(&mut self, cx: &Cx<'_>, p: &Parsed, pkt: &mut P, mtu: u16, otherwise: DropReason) -> Verdict {
        let Some(port) = cx.snap.ports.get(usize::from(cx.in_port)) else {
            return Verdict::Drop(otherwise);
        };
        if !icmp::may_answer(pkt.data(), p) {
            return Verdict::Drop(otherwise);
        }
        if !self.icmp.take(cx.now_ms) {
            return Verdict::Drop(DropReason::IcmpRateLimited);
        }
        match icmp::too_big(pkt, p, mtu, port.mac, port.vlan) {
            Ok(()) => {
                cx.ctr.icmp_too_big.add(1);
                Verdict::Forward(cx.in_port)
            }
            Err(r) => Verdict::Drop(r),
        }
    }
}

/// A packet on the return path (source = a VIP) that answers a SYN: a
/// SYN-ACK or an RST, recorded against the handshake of its reversed flow.
#[inline(always)]
fn answered(hs: &Handshakes, p: &Parsed, frame: &[u8]) {
    if p.flow.proto != 6 || !p.has_ports || p.frag != Fragment::No {
        return;
    }
    let flags = frame.get(usize::from(p.l4) + TCP_FLAGS).copied().unwrap_or(0);
    let answer = if flags & TCP_RST != 0 {
        Answer::Reset
    } else if flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK {
        Answer::SynAck
    } else {
        return;
    };
    hs.answer(flow_hash(&p.flow.reversed()), answer);
}

/// Whether the IPv4 packet `p` in `frame` has DF set.
#[inline]
fn dont_fragment(frame: &[u8], p: &Parsed) -> bool {
    let at = usize::from(p.l3) + v4::FRAG;
    frame.get(at).is_some_and(|b| u16::from(*b) << 8 & v4::DF != 0)
}

/// Requests (`prefetch`) the counters of endpoint `ep`, which [`count`]
/// adds to.
#[inline(always)]
fn request_counters(ctr: &WorkerCounters, ep: &Endpoint, prefetch: &impl Fn(*const u8)) {
    if let Some(ec) = ctr.endpoints.get(ep.counter as usize) {
        prefetch(std::ptr::from_ref(ec).cast());
    }
}

#[inline(always)]
fn count(ctr: &WorkerCounters, svc: &Service, ep: &Endpoint, len: usize) {
    if let Some(c) = ctr.services.get(svc.key as usize) {
        c.count(len);
    }
    if let Some(c) = ctr.endpoints.get(ep.counter as usize) {
        c.count(len);
    }
}

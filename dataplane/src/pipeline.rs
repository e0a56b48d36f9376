//! What a worker does to one packet: filter by destination MAC, parse,
//! classify, select an endpoint, rewrite, and decide where it goes.
//!
//! - Destination is a VIP: load-balanced to an endpoint of the route's
//!   service (ICMP errors about a VIP flow follow that flow; later IP
//!   fragments follow their first fragment, or are held until it comes).
//! - Source is a VIP: return traffic from an endpoint, sent to the gateway.
//! - Anything else addressed to the appliance, and every broadcast or
//!   multicast frame: the kernel's business (exception path).

use crate::counters::WorkerCounters;
use crate::flow::{FlowTable, FragKey, FragTable, Pin};
use crate::hash::flow_hash;
use crate::io::PacketBuf;
use crate::parse::{parse_into, Flow, Fragment, Kind, Parsed, ETH_LEN};
use crate::rewrite::{encapsulate, forward_l2, Tunnel};
use crate::service::{Algorithm, Delivery, Endpoint, Service};
use crate::snapshot::Snapshot;
use crate::classify::Lookup;
use crate::verdict::{DropReason, Verdict};

/// Sizes of a worker's tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Flow-table entries.
    pub flow_entries: usize,
    /// Seconds a flow-table entry lives without traffic.
    pub flow_idle_secs: u32,
    /// Fragment-table entries.
    pub frag_entries: usize,
    /// Milliseconds a first fragment's decision is kept.
    pub frag_ttl_ms: u64,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig { flow_entries: 65536, flow_idle_secs: 300, frag_entries: 4096, frag_ttl_ms: 5000 }
    }
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
}

/// The tables and the per-packet outcome a pipeline keeps.
#[derive(Debug)]
struct State {
    flows: FlowTable,
    frags: FragTable,
    rng: u64,
    frag_event: FragEvent,
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
                flows: FlowTable::new(cfg.flow_entries, cfg.flow_idle_secs),
                frags: FragTable::new(cfg.frag_entries, cfg.frag_ttl_ms),
                rng: seed | 1,
                frag_event: FragEvent::None,
            },
            parsed: Parsed::default(),
        }
    }

    /// The flow table (for status).
    pub fn flows(&self) -> &FlowTable {
        &self.state.flows
    }

    /// Fragment state change made by the last [`Pipeline::process`].
    pub fn frag_event(&self) -> FragEvent {
        self.state.frag_event
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
        self.state.frag_event = FragEvent::None;
        let frame = pkt.data();
        if frame.len() < ETH_LEN {
            return Verdict::Drop(DropReason::EthTruncated);
        }
        if frame[0] & 1 != 0 {
            return Verdict::Exception; // broadcast, multicast
        }
        if let (Some(port), Some(dst)) = (snap.ports.get(usize::from(in_port)), frame.first_chunk::<6>()) {
            if *dst != port.mac {
                return Verdict::Drop(DropReason::NotOurMac);
            }
        }
        match parse_into(frame, &mut self.parsed) {
            Ok(Kind::Ip) => self.state.decide(snap, in_port, &self.parsed, pkt, now_ms, ctr),
            Ok(Kind::Other { .. }) => Verdict::Exception,
            Err(r) => Verdict::Drop(r),
        }
    }
}

impl State {
    #[inline(always)]
    fn next_random(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// The verdict for a parsed IP packet.
    #[inline(always)]
    fn decide<P: PacketBuf>(
        &mut self,
        snap: &Snapshot,
        in_port: u8,
        p: &Parsed,
        pkt: &mut P,
        now_ms: u64,
        ctr: &WorkerCounters,
    ) -> Verdict {
        let c = &snap.classifier;
        if let Some(vip) = c.vip_index(p.flow.dst) {
            let v = self.balance(snap, vip, p, pkt, now_ms, ctr);
            if matches!(v, Verdict::Forward(_)) {
                ctr.balanced.add(1);
            }
            return v;
        }
        if let Some(vip) = c.vip_index(p.flow.src) {
            let gw = if p.v6 { snap.gateway_v6 } else { snap.gateway_v4 };
            let Some(gw) = gw else { return Verdict::Drop(DropReason::NoGateway) };
            let from = pkt.data().get(6..12).and_then(|m| <[u8; 6]>::try_from(m).ok()).unwrap_or_default();
            if !snap.return_allowed(vip, in_port, from) {
                return Verdict::Drop(DropReason::ReturnNotFromEndpoint);
            }
            let src = snap.ports.get(usize::from(gw.port)).map_or([0; 6], |p| p.mac);
            return match forward_l2(pkt, p, src, gw.mac) {
                Ok(()) => {
                    ctr.returned.add(1);
                    Verdict::Forward(gw.port)
                }
                Err(r) => Verdict::Drop(r),
            };
        }
        Verdict::Exception
    }

    #[inline]
    fn balance<P: PacketBuf>(
        &mut self,
        snap: &Snapshot,
        vip: usize,
        p: &Parsed,
        pkt: &mut P,
        now_ms: u64,
        ctr: &WorkerCounters,
    ) -> Verdict {
        let c = &snap.classifier;
        let len = pkt.data().len();
        if p.frag == Fragment::Later {
            let key = frag_key(p);
            let Some(pin) = self.frags.lookup(&key, now_ms.max(1)) else {
                self.frag_event = FragEvent::Held(key);
                return Verdict::Stash;
            };
            let Some(svc) = snap.service_by_key(pin.service) else { return Verdict::Drop(DropReason::NoEndpoint) };
            let Some(ep) = svc.endpoint(pin.endpoint).filter(|e| e.incarnation == pin.incarnation) else {
                return Verdict::Drop(DropReason::NoEndpoint);
            };
            let v = deliver(snap, ep, p, pkt, flow_hash(&p.flow));
            if matches!(v, Verdict::Forward(_)) {
                count(ctr, svc, ep, len);
            }
            return v;
        }
        let about;
        let (key, has_ports, l4) = if p.icmp_error {
            // About a reply (VIP -> client): the flow is its reverse.
            about = if c.is_vip(p.inner.src) { p.inner.reversed() } else { p.inner };
            (&about, p.inner_ports, None)
        } else {
            (&p.flow, p.has_ports, pkt.data().get(usize::from(p.l4)..usize::from(p.ip_end)))
        };
        // An ICMP error's flow is towards the VIP it was sent to, or towards
        // another: look that one up.
        let lookup = if key.dst == p.flow.dst { c.classify_vip(vip, key, has_ports, l4) } else { c.classify(key, has_ports, l4) };
        let service = match lookup {
            Lookup::Route(r) => c.service_of(r).unwrap_or(u32::MAX),
            Lookup::NoRoute | Lookup::NotVip => return Verdict::Drop(DropReason::NoRoute),
        };
        let Some(svc) = snap.services.get(service as usize) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        let hash = flow_hash(key);
        let now_s = u32::try_from(now_ms / 1000).unwrap_or(u32::MAX).saturating_add(1);
        let Some(ep) = self.select(svc, key, hash, p.icmp_error, now_s) else {
            return Verdict::Drop(DropReason::NoEndpoint);
        };
        if p.frag == Fragment::First {
            let fk = frag_key(p);
            let pin = Pin { service: svc.key, endpoint: ep.id, incarnation: ep.incarnation };
            self.frags.insert(&fk, pin, now_ms.max(1));
            self.frag_event = FragEvent::Pinned(fk);
        }
        let v = deliver(snap, ep, p, pkt, hash);
        if matches!(v, Verdict::Forward(_)) {
            count(ctr, svc, ep, len);
        }
        ctr.flow_evictions.set(self.flows.stats.evictions);
        v
    }

    /// The endpoint for a flow of `svc`.
    #[inline]
    fn select<'s>(&mut self, svc: &'s Service, key: &Flow, hash: u64, icmp: bool, now_s: u32) -> Option<&'s Endpoint> {
        if svc.flow_table {
            let pin = if icmp { self.flows.peek(key, svc.key, now_s) } else { self.flows.lookup(key, svc.key, now_s) };
            if let Some(pin) = pin {
                if let Some(ep) = svc.endpoint(pin.endpoint).filter(|e| e.incarnation == pin.incarnation) {
                    return Some(ep);
                }
            }
        }
        let table = svc.table.as_ref()?;
        if icmp || svc.algorithm == Algorithm::Maglev {
            let ep = svc.endpoint(table.lookup(hash))?;
            if svc.flow_table && !icmp {
                self.flows.insert(key, Pin { service: svc.key, endpoint: ep.id, incarnation: ep.incarnation }, now_s);
            }
            return Some(ep);
        }
        // Random: a uniformly random table entry, so weights hold.
        let r = self.next_random();
        let ep = svc.endpoint(table.lookup(r))?;
        self.flows.insert(key, Pin { service: svc.key, endpoint: ep.id, incarnation: ep.incarnation }, now_s);
        Some(ep)
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

#[inline]
fn deliver<P: PacketBuf>(snap: &Snapshot, ep: &Endpoint, p: &Parsed, pkt: &mut P, hash: u64) -> Verdict {
    let Some(port) = snap.ports.get(usize::from(ep.port)) else { return Verdict::Drop(DropReason::NoEndpoint) };
    let r = match ep.delivery {
        Delivery::L2 => forward_l2(pkt, p, port.mac, ep.mac),
        Delivery::IpIp { src } => {
            let t = Tunnel { src, dst: ep.addr, src_mac: port.mac, dst_mac: ep.mac, mtu: port.mtu };
            encapsulate(pkt, p, &t, hash)
        }
    };
    match r {
        Ok(()) => Verdict::Forward(ep.port),
        Err(r) => Verdict::Drop(r),
    }
}

//! Sharing pins with sibling appliances, as a worker does it: after a
//! change of a service's table, the flows pinned in changed slots (and
//! only those) are exported, each once per change; flows without a pin of
//! their own follow the pins received from siblings.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use common::*;
use sluice_dataplane::addr::Addr;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::craft;
use sluice_dataplane::flow::{FlowKey, FlowState};
use sluice_dataplane::hash::flow_hash;
use sluice_dataplane::io::PacketBuf;
use sluice_dataplane::memio::{MemBuf, MemIo};
use sluice_dataplane::parse::{ethertype, proto, Flow};
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::service::{Algorithm, Delivery, Service, ServiceSpec};
use sluice_dataplane::snapshot::{NextHop, PortInfo, Snapshot};
use sluice_dataplane::sync::{PinRecord, SyncRing, SyncedPin, SyncedPins};
use sluice_dataplane::worker::{Input, Worker, WorkerConfig};

const CLIENT_MAC: [u8; 6] = [0x02, 0xcc, 0, 0, 0, 1];
const DPORT: u16 = 8080;
const KEY: u32 = 4;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// The "sticky" service (maglev, flow table) with endpoints `0..n`, built
/// as the next version of `prev`.
fn sticky(n: u16, prev: Option<&Service>) -> Arc<Service> {
    let mut eps: Vec<_> = (0..n).map(|i| endpoint(4, i, 1, Delivery::L2)).collect();
    for e in &mut eps {
        let [hi, lo] = e.id.to_be_bytes();
        e.addr = Addr::v4([192, 168, hi, lo]);
    }
    let spec = ServiceSpec { name: "sticky".into(), key: KEY, algorithm: Algorithm::Maglev, flow_table: true, limit: 256, table_size: 0, endpoints: eps };
    Arc::new(Service::build_after(&spec, prev).unwrap())
}

fn snapshot(generation: u64, svc: &Arc<Service>) -> Snapshot {
    Snapshot::new(
        generation,
        &[route("sticky", 0, Addr::v4(VIP), Some(DPORT), &[proto::TCP])],
        vec![Arc::clone(svc)],
        vec![PortInfo { mac: FRONT_MAC, mtu: 1500, vlan: 0 }, PortInfo { mac: BACK_MAC, mtu: 1500, vlan: 0 }],
        Some(NextHop { port: 0, mac: GW_MAC }),
        None,
    )
}

struct Sibling {
    w: Worker<MemIo>,
    ctr: Arc<WorkerCounters>,
    ring: Arc<SyncRing>,
    synced: Publisher<SyncedPins>,
}

fn sibling(p: &Publisher<Snapshot>) -> Sibling {
    sibling_with_ring(p, 1 << 16)
}

/// A worker reading `p` whose sync ring holds `capacity` records.
fn sibling_with_ring(p: &Publisher<Snapshot>, capacity: usize) -> Sibling {
    let cfg = WorkerConfig {
        id: 0,
        inputs: vec![Input::Port { port: 0, exception: None }],
        outputs: 2,
        pipeline: Default::default(),
        stash_capacity: 16,
        stash_ttl_ms: 1000,
    };
    let ctr = Arc::new(WorkerCounters::new(8, 1000));
    let ring = Arc::new(SyncRing::new(capacity));
    let synced = Publisher::new(SyncedPins::default());
    let w = Worker::new(MemIo::new(1, 2), p.reader(), Arc::clone(&ctr), &cfg).with_sync(Arc::clone(&ring), synced.reader());
    Sibling { w, ctr, ring, synced }
}

fn flow(sport: u16) -> Flow {
    Flow { src: Addr::v4(CLIENT), dst: Addr::v4(VIP), sport, dport: DPORT, proto: proto::TCP }
}

fn key(sport: u16) -> FlowKey {
    FlowKey { flow: flow(sport), service: KEY }
}

/// One packet of each flow (by source port) with TCP flags `flags` at
/// `now_ms`: the endpoint (by MAC) each was sent to.
fn send(s: &mut Sibling, sports: &[u16], flags: u8, now_ms: u64) -> HashMap<u16, [u8; 6]> {
    let frames: Vec<MemBuf> = sports
        .iter()
        .map(|&sp| {
            let ip = craft::with_l4_checksum(craft::ipv4(CLIENT, VIP, proto::TCP, &craft::tcp(sp, DPORT, flags, b"")), 20);
            MemBuf::new(&craft::ether_with(FRONT_MAC, CLIENT_MAC, &[], ethertype::IPV4, &ip))
        })
        .collect();
    s.w.io_mut().inputs[0].extend(frames);
    while s.w.poll(now_ms) > 0 {}
    let out = std::mem::take(&mut s.w.io_mut().outputs[1]);
    assert_eq!(out.len(), sports.len(), "every flow forwarded");
    sports.iter().copied().zip(out.iter().map(|b| <[u8; 6]>::try_from(&b.data()[0..6]).unwrap())).collect()
}

/// The MAC of the endpoint `svc`'s table chooses for flow `sport`.
fn choice(svc: &Service, sport: u16) -> [u8; 6] {
    let t = svc.table.as_ref().unwrap();
    svc.endpoint_at(t.lookup(flow_hash(&flow(sport)))).unwrap().mac
}

fn drain(s: &Sibling) -> Vec<PinRecord> {
    let mut out = Vec::new();
    s.ring.drain_into(&mut out, usize::MAX);
    out
}

fn mac_id(m: &[u8; 6]) -> u16 {
    u16::from_be_bytes([m[4], m[5]])
}

/// Records pushed per change = flows pinned in the slots that changed, for
/// N = 10 and N = 100 endpoints; each exported once per change, with its
/// pinned endpoint, while every flow stays on it.
#[test]
fn a_change_exports_the_pins_of_changed_slots_once() {
    for n in [10u16, 100] {
        let flows: Vec<u16> = (1000..1000 + 60 * n).collect();
        let a = sticky(n, None);
        let mut p = Publisher::new(snapshot(1, &a));
        let mut s = sibling(&p);
        let pinned = send(&mut s, &flows, TCP_ACK, 1000);
        let _ = send(&mut s, &flows, TCP_ACK, 1500);
        assert!(drain(&s).is_empty(), "N = {n}: nothing changed, nothing exported");

        let mut prev = a;
        for change in 1..=2u16 {
            let next = sticky(n + change, Some(&prev));
            p.publish(snapshot(1 + u64::from(change), &next));
            let t = next.table.as_ref().unwrap();
            // The flows a sibling with the new table would send elsewhere.
            let moved: BTreeSet<u16> = flows.iter().copied().filter(|&f| choice(&next, f) != pinned[&f]).collect();
            if change == 1 {
                // Pinned under the previous table: exactly the changed slots.
                let in_changed: BTreeSet<u16> = flows.iter().copied().filter(|&f| next.changes().contains(t.slot(flow_hash(&flow(f))))).collect();
                assert_eq!(moved, in_changed, "N = {n}");
            }
            let share = moved.len() as f64 / flows.len() as f64;
            let ideal = f64::from(change) / f64::from(n + change);
            assert!(share > ideal * 0.6 && share < ideal * 1.6, "N = {n}, change {change}: {} of {} flows moved", moved.len(), flows.len());

            let before = s.ctr.sync_exported.get();
            let now = 2000 + 1000 * u64::from(change);
            assert_eq!(send(&mut s, &flows, TCP_ACK, now), pinned, "N = {n}: every flow stays on its endpoint");
            let recs = drain(&s);
            let got: BTreeSet<u16> = recs.iter().map(|r| r.sport).collect();
            assert_eq!(recs.len(), got.len(), "N = {n}, change {change}: each flow once");
            assert_eq!(got, moved, "N = {n}, change {change}: the records are the moved flows' pins");
            assert_eq!(s.ctr.sync_exported.get() - before, moved.len() as u64);
            for r in &recs {
                assert_eq!(r.key(), key(r.sport));
                assert_eq!(r.endpoint, mac_id(&pinned[&r.sport]), "the pinned endpoint, not the table's");
                assert!(r.is_incarnation(1));
                assert_eq!((r.flow_state(), r.lifetime), (FlowState::TcpOpen, 3600));
                assert_eq!(PinRecord::decode(&r.encode()), Ok(*r));
            }
            // More packets of the same flows: nothing more until the next change.
            let _ = send(&mut s, &flows, TCP_ACK, now + 500);
            assert!(drain(&s).is_empty(), "N = {n}, change {change}: exported once");
            prev = next;
        }
        assert_eq!(s.ctr.sync_ring_full.get(), 0);
    }
}

/// A full ring is counted, never waited on, and the flow's next packet
/// (after the control side drained the ring) exports it.
#[test]
fn a_full_ring_is_counted_and_the_next_packet_tries_again() {
    let flows: Vec<u16> = (1000..1600).collect();
    let a = sticky(10, None);
    let mut p = Publisher::new(snapshot(1, &a));
    let mut s = sibling_with_ring(&p, 4);
    let pinned = send(&mut s, &flows, TCP_ACK, 1000);
    let b = sticky(11, Some(&a));
    p.publish(snapshot(2, &b));
    let moved = flows.iter().filter(|&&f| choice(&b, f) != pinned[&f]).count() as u64;
    assert!(moved > 8, "{moved}");
    assert_eq!(send(&mut s, &flows, TCP_ACK, 2000), pinned, "a full ring changes no verdict");
    assert_eq!((s.ctr.sync_exported.get(), s.ctr.sync_ring_full.get()), (4, moved - 4));
    let mut got: Vec<PinRecord> = drain(&s);
    let _ = send(&mut s, &flows, TCP_ACK, 2500);
    got.extend(drain(&s));
    assert_eq!((s.ctr.sync_exported.get(), s.ctr.sync_ring_full.get()), (8, 2 * (moved - 4) - 4), "the next packets try again");
    assert_eq!(got.iter().map(|r| r.sport).collect::<BTreeSet<_>>().len(), 8, "no flow twice");
}

/// A flow whose slot moved to another endpoint keeps the endpoint a
/// sibling pinned it to; a SYN re-selects; a synced pin to a removed
/// endpoint (or another incarnation, or past its deadline) is ignored.
#[test]
fn flows_without_a_pin_follow_the_pins_of_siblings() {
    let n = 10;
    let a = sticky(n, None);
    let b = sticky(n + 1, Some(&a));
    // Flows the change moved (off an endpoint that stays), as a sibling
    // that pinned them under the old table saw them.
    let moved: Vec<u16> = (1000..5000u16).filter(|&f| choice(&a, f) != choice(&b, f)).take(40).collect();
    assert_eq!(moved.len(), 40);
    let p = Publisher::new(snapshot(2, &b));
    let mut s = sibling(&p);
    let deadline = 100_000;
    let pin = |f: u16, endpoint: u16, incarnation: u32, deadline_ms: u64| (key(f), SyncedPin { endpoint, incarnation, deadline_ms });
    let old_id = |f: u16| mac_id(&choice(&a, f));
    let (kept, syn, removed, reborn, expired) = (&moved[0..10], &moved[10..20], &moved[20..25], &moved[25..30], &moved[30..35]);
    let mut pins = Vec::new();
    pins.extend(kept.iter().chain(syn).map(|&f| pin(f, old_id(f), 1, deadline)));
    pins.extend(removed.iter().map(|&f| pin(f, 200, 1, deadline)));
    pins.extend(reborn.iter().map(|&f| pin(f, old_id(f), 2, deadline)));
    pins.extend(expired.iter().map(|&f| pin(f, old_id(f), 1, 5_000)));
    s.synced.publish(SyncedPins::build(pins));

    let got = send(&mut s, kept, TCP_ACK, 10_000);
    for f in kept {
        assert_eq!(mac_id(&got[f]), old_id(*f), "flow {f} keeps its synced endpoint");
        assert_ne!(got[f], choice(&b, *f));
    }
    assert_eq!(s.ctr.sync_pin_hits.get(), 10);
    // A sibling's pin this table disagrees with is exported as this
    // worker's own, once: the flow keeps its endpoint after the sibling
    // that sent it is gone and another one starts.
    let shared = drain(&s);
    let mut by_flow: Vec<(u16, u16)> = shared.iter().map(|r| (r.key().flow.sport, r.endpoint)).collect();
    by_flow.sort_unstable();
    let mut want: Vec<(u16, u16)> = kept.iter().map(|&f| (f, old_id(f))).collect();
    want.sort_unstable();
    assert_eq!(by_flow, want, "each taken pin exported once, naming its synced endpoint");
    let got = send(&mut s, syn, TCP_SYN, 10_000);
    assert!(syn.iter().all(|f| got[f] == choice(&b, *f)), "a SYN takes the table's choice");
    for (what, flows) in [("a removed endpoint", removed), ("another incarnation", reborn), ("a pin past its deadline", expired)] {
        let got = send(&mut s, flows, TCP_ACK, 10_000);
        assert!(flows.iter().all(|f| got[f] == choice(&b, *f)), "{what}: the table's choice");
    }
    assert_eq!(s.ctr.sync_pin_hits.get(), 10, "only the pins that hold were taken");

    // Taken pins are the worker's own now: they hold when the synced pins go.
    s.synced.publish(SyncedPins::default());
    let again = send(&mut s, kept, TCP_ACK, 11_000);
    assert!(kept.iter().all(|f| mac_id(&again[f]) == old_id(*f)));
    assert_eq!(s.ctr.sync_pin_hits.get(), 10);
    assert!(drain(&s).is_empty(), "a taken pin is exported once, not at every packet");
    // The worker let go of the replaced synced pins at its quiescent point.
    assert!(s.synced.synchronize(std::time::Duration::from_secs(1)));
}

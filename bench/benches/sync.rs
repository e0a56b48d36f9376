//! ns per packet of the pipeline with sibling sync off and on (a ring and
//! a table of synced pins attached), bursts of 32 TCP packets of 4,096
//! flows to a Maglev service with a flow table and 10 endpoints. Read
//! `on` against `off` of the same case, as a ratio:
//! - `sync/steady_*`: pin hits under a table that does not change;
//! - `sync/change_*`: pin hits right after a change, every one: each pass
//!   over the flows takes the other of two versions of the service, so
//!   every pin is checked again (the export check's worst case; `on` also
//!   drains the ring each burst, as the control side would);
//! - `sync/miss_*`: a flow table of 8 entries, so nearly every packet
//!   misses it: `off` takes the Maglev table, `on` first finds the flow in
//!   4,096 synced pins and takes that pin.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use sluice_dataplane::addr::Addr;
use sluice_dataplane::classify::{PortRange, RouteMatch, RouteSpec};
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::flow::FlowKey;
use sluice_dataplane::memio::MemBuf;
use sluice_dataplane::craft;
use sluice_dataplane::hash::flow_hash;
use sluice_dataplane::parse::{ethertype, parse_into, proto, Kind, Parsed};
use sluice_dataplane::pipeline::{Pipeline, PipelineConfig};
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::service::{Algorithm, Delivery, EndpointSpec, Service, ServiceSpec};
use sluice_dataplane::snapshot::{NextHop, PortInfo, Snapshot};
use sluice_dataplane::sync::{SyncRing, SyncedPin, SyncedPins};
use sluice_dataplane::verdict::Verdict;

const BURST: usize = 32;
const FLOWS: u16 = 4096;
const FRONT_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0];
const BACK_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 1];
const VIP: [u8; 4] = [20, 0, 0, 1];

/// One TCP packet (an ACK) of each flow, from varied clients.
fn frames() -> Vec<Vec<u8>> {
    (0..FLOWS)
        .map(|i| {
            let [hi, lo] = i.to_be_bytes();
            let tcp = craft::tcp(1024 + i * 7, 1000, 0x10, &[0; 6]);
            let ip = craft::with_l4_checksum(craft::ipv4([198, 51, hi, lo], VIP, proto::TCP, &tcp), 20);
            craft::ether_with(FRONT_MAC, [2, 0xcc, 0, 0, 0, 1], &[], ethertype::IPV4, &ip)
        })
        .collect()
}

fn service(n: u16, prev: Option<&Service>) -> Arc<Service> {
    let endpoints = (0..n)
        .map(|i| {
            let [hi, lo] = i.to_be_bytes();
            EndpointSpec {
                id: i,
                incarnation: 1,
                weight: 1,
                draining: false,
                addr: Addr::v4([10, 0, hi, lo]),
                port: 1,
                mac: [0x02, 0xee, 0, 0, hi, lo],
                delivery: Delivery::L2,
                counter: u32::from(i),
            }
        })
        .collect();
    let spec = ServiceSpec { name: "svc".into(), key: 0, algorithm: Algorithm::Maglev, flow_table: true, limit: 64, table_size: 0, endpoints };
    Arc::new(Service::build_after(&spec, prev).unwrap_or_else(|e| panic!("{e}")))
}

fn snapshot(generation: u64, svc: &Arc<Service>) -> Snapshot {
    let route = RouteSpec {
        name: "route".into(),
        priority: 0,
        service: 0,
        matches: RouteMatch {
            vips: vec![Addr::v4(VIP)],
            dst_ports: vec![PortRange::single(1000)],
            protocols: vec![proto::TCP],
            ..RouteMatch::default()
        }
        .into(),
    };
    Snapshot::new(
        generation,
        &[route],
        vec![Arc::clone(svc)],
        vec![PortInfo { mac: FRONT_MAC, mtu: 1500, vlan: 0 }, PortInfo { mac: BACK_MAC, mtu: 1500, vlan: 0 }],
        Some(NextHop { port: 0, mac: [2, 0, 0, 0, 0xf, 0xf] }),
        None,
    )
}

/// A pipeline with `flow_entries` entries, with sync attached when `ring`
/// is given.
fn pipeline(flow_entries: usize, sync: Option<(&Arc<SyncRing>, &Publisher<SyncedPins>)>) -> Pipeline {
    let mut pl = Pipeline::new(&PipelineConfig { flow_entries, ..PipelineConfig::default() }, 1);
    if let Some((ring, synced)) = sync {
        pl.attach_sync(Arc::clone(ring), synced.reader());
        pl.begin_round();
    }
    pl
}

fn sync(c: &mut Criterion) {
    let a = service(10, None);
    let b = service(11, Some(&a));
    let b2 = service(12, Some(&b));
    let (snap_a, snap_b, snap_b2) = (snapshot(1, &a), snapshot(2, &b), snapshot(3, &b2));
    let templates = frames();
    let ctr = WorkerCounters::new(1, 64);
    // Every flow's pin under `a`, as a sibling would have sent it.
    let mut parsed = Parsed::default();
    let mut pins: Vec<(FlowKey, SyncedPin)> = Vec::new();
    for f in &templates {
        assert!(matches!(parse_into(f, &mut parsed), Ok(Kind::Ip)));
        let at = a.table.as_ref().map_or(0, |t| t.lookup(flow_hash(&parsed.flow)));
        let ep = a.endpoint_at(at).map_or(0, |e| e.id);
        pins.push((FlowKey { flow: parsed.flow, service: 0 }, SyncedPin { endpoint: ep, incarnation: 1, deadline_ms: u64::MAX }));
    }
    let ring = Arc::new(SyncRing::new(1 << 16));
    let synced = Publisher::new(SyncedPins::build(pins));
    let mut bufs: Vec<MemBuf> = templates[..BURST].iter().map(|f| MemBuf::new(f)).collect();
    let mut drained = Vec::with_capacity(1 << 16);

    let mut g = c.benchmark_group("sync");
    g.throughput(Throughput::Elements(BURST as u64));
    for on in [false, true] {
        let name = if on { "on" } else { "off" };
        let sync = on.then_some((&ring, &synced));

        // Steady: every flow pinned under `a`, the table unchanged.
        let mut pl = pipeline(65536, sync);
        for f in &templates {
            bufs[0].reset(f);
            assert_eq!(pl.process(&snap_a, 0, &mut bufs[0], 1, &ctr), Verdict::Forward(1));
        }
        let mut next = 0usize;
        g.bench_function(format!("steady_{name}"), |bench| {
            bench.iter(|| {
                for buf in bufs.iter_mut() {
                    buf.reset(&templates[next % templates.len()]);
                    next += 1;
                    black_box(pl.process(&snap_a, 0, buf, 1, &ctr));
                }
            })
        });

        // Change: each pass over the flows takes the other of two later
        // versions of the service, so that every pin hit is the flow's
        // first since a change.
        g.bench_function(format!("change_{name}"), |bench| {
            bench.iter(|| {
                let snap = if next / templates.len() % 2 == 0 { &snap_b } else { &snap_b2 };
                for buf in bufs.iter_mut() {
                    buf.reset(&templates[next % templates.len()]);
                    next += 1;
                    black_box(pl.process(snap, 0, buf, 1, &ctr));
                }
                if on {
                    drained.clear();
                    ring.drain_into(&mut drained, usize::MAX);
                }
            })
        });

        // Miss: a flow table too small to keep the flows.
        let mut pl = pipeline(8, sync);
        g.bench_function(format!("miss_{name}"), |bench| {
            bench.iter(|| {
                for buf in bufs.iter_mut() {
                    buf.reset(&templates[next % templates.len()]);
                    next += 1;
                    black_box(pl.process(&snap_b, 0, buf, 1, &ctr));
                }
            })
        });
    }
    g.finish();
    let hits = ctr.sync_pin_hits.get();
    let exported = ctr.sync_exported.get();
    eprintln!("sync: {exported} pins exported, {hits} synced pins taken, {} ring full", ctr.sync_ring_full.get());
    assert!(hits > 0 && exported > 0, "the `on` cases exercised sync");
}

criterion_group!(benches, sync);
criterion_main!(benches);

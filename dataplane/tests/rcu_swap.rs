//! Snapshots swapped continuously while workers forward on other threads:
//! no packet lost, none sent to an endpoint its snapshot did not choose,
//! generations only move forward, and replaced snapshots are freed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use common::*;
use sluice_dataplane::addr::Addr;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::craft;
use sluice_dataplane::hash::flow_hash;
use sluice_dataplane::io::PacketBuf;
use sluice_dataplane::memio::{MemBuf, MemIo};
use sluice_dataplane::parse::{ethertype, proto, Flow};
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::service::{Algorithm, Delivery, Service};
use sluice_dataplane::snapshot::{NextHop, PortInfo, Snapshot};
use sluice_dataplane::worker::{Input, Worker, WorkerConfig};

/// Endpoint sets the snapshots cycle through.
const VARIANTS: [&[u16]; 3] = [&[0, 1, 2], &[0, 1, 2, 3], &[1, 2, 3]];

fn variant(generation: u64) -> usize {
    (generation % 256 % 3) as usize
}

fn snapshot(generation: u64) -> (Snapshot, Weak<Service>) {
    let g = u16::try_from(generation % 256).unwrap();
    let eps = VARIANTS[variant(generation)].iter().map(|&i| endpoint(0, i, g, Delivery::L2)).collect();
    let svc = service("web", 0, Algorithm::Maglev, false, eps);
    let weak = Arc::downgrade(&svc);
    let snap = Snapshot::new(
        generation,
        &[route("web", 0, Addr::v4(VIP), Some(80), &[proto::TCP])],
        vec![svc],
        vec![PortInfo { mac: FRONT_MAC, mtu: 1500, vlan: 0 }, PortInfo { mac: BACK_MAC, mtu: 1500, vlan: 0 }],
        Some(NextHop { port: 0, mac: GW_MAC }),
        None,
    );
    (snap, weak)
}

#[test]
fn swapping_snapshots_under_load_loses_and_misdirects_nothing() {
    let (first, first_weak) = snapshot(1);
    let mut publisher = Publisher::new(first);
    let tables: Vec<Service> = (0..3u64)
        .map(|v| {
            let eps = VARIANTS[v as usize].iter().map(|&i| endpoint(0, i, 0, Delivery::L2)).collect();
            Arc::try_unwrap(service("web", 0, Algorithm::Maglev, false, eps)).unwrap()
        })
        .collect();
    let tables = Arc::new(tables);
    let stop = Arc::new(AtomicBool::new(false));
    let cfg = WorkerConfig {
        id: 0,
        inputs: vec![Input::Port { port: 0, exception: None }],
        outputs: 2,
        pipeline: Default::default(),
        stash_capacity: 0,
        stash_ttl_ms: 1,
    };

    let workers: Vec<_> = (0..2u32)
        .map(|id| {
            let reader = publisher.reader();
            let (stop, tables, cfg) = (Arc::clone(&stop), Arc::clone(&tables), WorkerConfig { id, ..cfg.clone() });
            std::thread::spawn(move || {
                let ctr = Arc::new(WorkerCounters::new(4, 64));
                let mut w = Worker::new(MemIo::new(1, 2), reader, Arc::clone(&ctr), &cfg);
                let (mut sent, mut got, mut last_gen, mut gens) = (0u64, 0u64, 0u64, std::collections::BTreeSet::new());
                let mut sport = 1024u16 + u16::try_from(id).unwrap() * 30000;
                // After the stop, a bounded number of rounds to drain.
                let mut after_stop = 0;
                while !stop.load(Ordering::Relaxed) || (sent != got && after_stop < 1000) {
                    if stop.load(Ordering::Relaxed) {
                        after_stop += 1;
                    }
                    if !stop.load(Ordering::Relaxed) {
                        for _ in 0..32 {
                            sport = sport.wrapping_add(1).max(1024);
                            let ip = craft::ipv4(CLIENT, VIP, proto::TCP, &craft::tcp(sport, 80, 2, b""));
                            let f = craft::ether_with(FRONT_MAC, [2, 0xcc, 0, 0, 0, 1], &[], ethertype::IPV4, &ip);
                            w.io_mut().inputs[0].push_back(MemBuf::new(&f));
                            sent += 1;
                        }
                    }
                    w.poll(1);
                    let g = ctr.generation.get();
                    assert!(g >= last_gen, "generation went back from {last_gen} to {g}");
                    last_gen = g;
                    for out in std::mem::take(&mut w.io_mut().outputs[1]) {
                        let d = out.data();
                        let gbyte = u64::from(d[3]);
                        let id = u16::from_be_bytes([d[4], d[5]]);
                        let sport = u16::from_be_bytes([d[34], d[35]]);
                        let flow = Flow { src: Addr::v4(CLIENT), dst: Addr::v4(VIP), sport, dport: 80, proto: proto::TCP };
                        let t = &tables[variant(gbyte)];
                        let want = t.endpoint_at(t.table.as_ref().unwrap().lookup(flow_hash(&flow))).unwrap().id;
                        assert_eq!(id, want, "flow {sport} sent to endpoint {id} under generation byte {gbyte}");
                        gens.insert(gbyte);
                        got += 1;
                    }
                }
                assert_eq!(ctr.total_drops(), 0, "nothing dropped");
                w.shutdown();
                (sent, got, gens.len())
            })
        })
        .collect();

    let mut weaks = vec![first_weak];
    let end = Instant::now() + Duration::from_millis(1500);
    let mut generation = 1;
    while Instant::now() < end {
        generation += 1;
        let (s, weak) = snapshot(generation);
        weaks.push(weak);
        publisher.publish(s);
        std::thread::sleep(Duration::from_micros(300));
    }
    // Reclaimed while the workers ran (not only at the end).
    let freed_while_running = weaks.iter().filter(|w| w.upgrade().is_none()).count();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let (sent, got, gens) = w.join().unwrap();
        assert!(sent > 10_000, "the workers forwarded ({sent})");
        assert_eq!(sent, got, "no packet lost");
        assert!(gens > 3, "workers saw many generations ({gens})");
    }
    assert!(generation > 100, "many snapshots were published ({generation})");
    assert!(
        freed_while_running * 2 > weaks.len(),
        "old snapshots are freed as workers move on ({freed_while_running} of {} while they ran)",
        weaks.len()
    );
    assert!(publisher.synchronize(Duration::from_secs(1)));
    let alive = weaks.iter().filter(|w| w.upgrade().is_some()).count();
    assert_eq!(alive, 1, "only the current snapshot is still allocated");
}

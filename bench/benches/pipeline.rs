//! ns per packet for parse + classify + select + rewrite, on bursts of 32,
//! with 1, 100 and 10,000 routes. `pipeline/copy_only` measures the frame
//! refresh each iteration also does, to subtract it.
//!
//! `passive_health/{off,on}`: the same pipeline fed only TCP SYNs (the
//! packets passive health records: each takes a slot of the shared
//! handshake table), without and with the table attached, in the same run;
//! their ratio is passive health's per-packet cost at its worst (a
//! connection's other packets do not touch the table). The control side's
//! sweep, which frees the slots, runs between timed bursts.
//!
//! `return_path/{no_own,own_4}`: return traffic (from the VIP, through the
//! appliance to the gateway), without and with four own addresses of the
//! appliance to compare each reply's destination with (none matches: the
//! replies go to clients), in the same run; their ratio is what handing
//! the answers to checks of the VIP to the kernel costs every reply.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_bench::{appliance, frames, frames_with_flags, return_frames};
use sluice_dataplane::addr::Addr;
use sluice_dataplane::handshake::Handshakes;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::memio::MemBuf;
use sluice_dataplane::pipeline::{Pipeline, PipelineConfig};
use sluice_dataplane::verdict::Verdict;

const BURST: usize = 32;

fn pipeline(c: &mut Criterion) {
    let mut g = c.benchmark_group("pipeline");
    g.throughput(Throughput::Elements(BURST as u64));
    // (routes, ports per VIP, services)
    for (routes, per_vip, services) in [(1u32, 1u32, 1u32), (100, 10, 100), (10_000, 20, 1000)] {
        let a = appliance(routes, per_vip, services, 25);
        let templates = frames(&a, 4096, 7);
        let ctr = WorkerCounters::new(services as usize, services as usize * 25);
        let mut pl = Pipeline::new(&PipelineConfig::default(), 1);
        let mut bufs: Vec<MemBuf> = templates[..BURST].iter().map(|f| MemBuf::new(f)).collect();
        // Check the setup forwards everything before timing it.
        for b in &mut bufs {
            assert_eq!(pl.process(&a.snapshot, 0, b, 1, &ctr), Verdict::Forward(1));
        }
        let mut next = 0usize;
        g.bench_with_input(BenchmarkId::new("ipv4_tcp_routes", routes), &routes, |bench, _| {
            bench.iter(|| {
                for b in bufs.iter_mut() {
                    b.reset(&templates[next & 4095]);
                    next += 1;
                    black_box(pl.process(&a.snapshot, 0, b, 1, &ctr));
                }
            })
        });
        if routes == 1 {
            g.bench_function("copy_only", |bench| {
                bench.iter(|| {
                    for b in bufs.iter_mut() {
                        b.reset(&templates[next & 4095]);
                        next += 1;
                        black_box(&b);
                    }
                })
            });
        }
    }
    g.finish();
}

fn passive_health(c: &mut Criterion) {
    let mut g = c.benchmark_group("passive_health");
    g.throughput(Throughput::Elements(BURST as u64));
    let a = appliance(1, 1, 1, 25);
    let templates = frames_with_flags(&a, 4096, 7, 0x02);
    let ctr = WorkerCounters::new(1, 25);
    for on in [false, true] {
        // Timed by the TSC, as in the appliance (its rate only scales
        // the times recorded, not what a read costs).
        let table = Arc::new(Handshakes::with_clock(65536, sluice_ffi::tsc, 2_500_000_000));
        let mut pl = Pipeline::new(&PipelineConfig::default(), 1);
        if on {
            pl.attach_handshakes(Arc::clone(&table));
        }
        let mut bufs: Vec<MemBuf> = templates[..BURST].iter().map(|f| MemBuf::new(f)).collect();
        for b in &mut bufs {
            assert_eq!(pl.process(&a.snapshot, 0, b, 1, &ctr), Verdict::Forward(1));
        }
        let mut next = 0usize;
        let mut swept = Vec::new();
        g.bench_function(if on { "on" } else { "off" }, |bench| {
            bench.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for i in 0..iters {
                    let t = Instant::now();
                    for b in bufs.iter_mut() {
                        b.reset(&templates[next & 4095]);
                        next += 1;
                        black_box(pl.process(&a.snapshot, 0, b, 1, &ctr));
                    }
                    timed += t.elapsed();
                    // What the control side does every 100 ms: here every
                    // 1024 SYNs, so that slots are there to take.
                    if i % 32 == 31 {
                        swept.clear();
                        table.sweep(0, &mut swept);
                    }
                }
                timed
            })
        });
    }
    assert!(ctr.handshakes_sampled.get() > 0, "the table was used");
    g.finish();
}

fn return_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("return_path");
    g.throughput(Throughput::Elements(BURST as u64));
    let a = appliance(1, 1, 1, 25);
    let templates = return_frames(&a, 4096, 7, 25);
    let ctr = WorkerCounters::new(1, 25);
    let own: Arc<[Addr]> = Arc::from(["10.100.0.1", "10.200.0.1", "fd00:100::1", "fd00:200::1"].map(|s| s.parse().unwrap_or_else(|_| unreachable!())));
    for (name, own) in [("no_own", Arc::from([])), ("own_4", own)] {
        let snap = a.snapshot.clone().with_own(own);
        let mut pl = Pipeline::new(&PipelineConfig::default(), 1);
        let mut bufs: Vec<MemBuf> = templates[..BURST].iter().map(|f| MemBuf::new(f)).collect();
        for b in &mut bufs {
            assert_eq!(pl.process(&snap, 1, b, 1, &ctr), Verdict::Forward(0), "returned to the gateway");
        }
        let mut next = 0usize;
        g.bench_function(name, |bench| {
            bench.iter(|| {
                for b in bufs.iter_mut() {
                    b.reset(&templates[next & 4095]);
                    next += 1;
                    black_box(pl.process(&snap, 1, b, 1, &ctr));
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, pipeline, passive_health, return_path);
criterion_main!(benches);

//! ns per packet for parse + classify + select + rewrite, on bursts of 32,
//! with 1, 100 and 10,000 routes. `pipeline/copy_only` measures the frame
//! refresh each iteration also does, to subtract it.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sluice_bench::{appliance, frames};
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

criterion_group!(benches, pipeline);
criterion_main!(benches);

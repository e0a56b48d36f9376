//! Memory and build time of a snapshot with 10,000 services of 25
//! endpoints each (one route per service), as the control plane would
//! publish it. Memory is counted from the structures' own allocations and
//! cross-checked with the process's resident set.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use sluice_bench::appliance;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    pages * 4
}

fn memory(c: &mut Criterion) {
    let before = rss_kib();
    let a = appliance(10_000, 1, 10_000, 25);
    let after = rss_kib();
    let bytes = a.snapshot.heap_bytes();
    eprintln!(
        "snapshot/memory: 10000 services x 25 endpoints: {:.1} MB of tables and routes ({} bytes per service); resident set grew {:.1} MB",
        bytes as f64 / 1e6,
        bytes / 10_000,
        (after.saturating_sub(before)) as f64 / 1024.0
    );
    drop(a);
    let mut g = c.benchmark_group("snapshot");
    g.sample_size(10);
    g.bench_function("build_10000_services_x_25", |b| b.iter(|| black_box(appliance(10_000, 1, 10_000, 25))));
    g.finish();
}

criterion_group!(benches, memory);
criterion_main!(benches);

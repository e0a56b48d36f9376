//! Maglev table build time for M = 65537 with N = 100 and N = 1000, and for
//! the default table of a 32-endpoint service (M = 6421) with N = 10 (an xDS
//! service of 10 endpoints: 10,000 of them are the cold compile of
//! `bench/xds_scale.sh`) and N = 20 (near the most walkers for which the
//! population computes first visits instead of probing): Sluice's
//! population (`maglev/build`) and the textbook one
//! (`maglev/build_textbook`), measured in the same run.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use sluice_bench::{textbook_maglev, uniform};
use sluice_dataplane::maglev::Table;

fn build(c: &mut Criterion) {
    let mut g = c.benchmark_group("maglev/build");
    for n in [100u16, 1000] {
        let eps = uniform(n);
        g.bench_with_input(BenchmarkId::new("m65537_n", n), &eps, |b, eps| {
            b.iter(|| black_box(Table::build(65537, 1024, eps)))
        });
    }
    for n in [10u16, 20] {
        let eps: Vec<(u16, u32)> = (0..n).map(|i| (i * 3, 1)).collect();
        g.bench_with_input(BenchmarkId::new("m6421_n", n), &eps, |b, eps| {
            // Identifiers below 3 n: the limit of a default service of 32, or 64.
            let limit = (3 * u32::from(n)).next_power_of_two();
            b.iter(|| black_box(Table::build(6421, limit, eps)))
        });
    }
    let weighted: Vec<(u16, u32)> = (0..1000u16).map(|i| (i, 1 + u32::from(i % 8))).collect();
    g.bench_function("m65537_n1000_weighted_1_to_8", |b| b.iter(|| black_box(Table::build(65537, 1024, &weighted))));
    g.finish();
    let mut g = c.benchmark_group("maglev/build_textbook");
    for n in [100u16, 1000] {
        let ids: Vec<u16> = (0..n).collect();
        g.bench_with_input(BenchmarkId::new("m65537_n", n), &ids, |b, ids| b.iter(|| black_box(textbook_maglev(65537, ids))));
    }
    for n in [10u16, 20] {
        let ids: Vec<u16> = (0..n).map(|i| i * 3).collect();
        g.bench_with_input(BenchmarkId::new("m6421_n", n), &ids, |b, ids| b.iter(|| black_box(textbook_maglev(6421, ids))));
    }
    g.finish();
}

criterion_group!(benches, build);
criterion_main!(benches);

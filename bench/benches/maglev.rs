//! Maglev table build time for M = 65537 with N = 100 and N = 1000: Sluice's
//! rank-ordered population (`maglev/build`) and the textbook one
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
    let weighted: Vec<(u16, u32)> = (0..1000u16).map(|i| (i, 1 + u32::from(i % 8))).collect();
    g.bench_function("m65537_n1000_weighted_1_to_8", |b| b.iter(|| black_box(Table::build(65537, 1024, &weighted))));
    g.finish();
    let mut g = c.benchmark_group("maglev/build_textbook");
    for n in [100u16, 1000] {
        let ids: Vec<u16> = (0..n).collect();
        g.bench_with_input(BenchmarkId::new("m65537_n", n), &ids, |b, ids| b.iter(|| black_box(textbook_maglev(65537, ids))));
    }
    g.finish();
}

criterion_group!(benches, build);
criterion_main!(benches);

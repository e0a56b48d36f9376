//! Balance and disruption of Maglev tables across sizes: for each (N, M),
//! max/mean entries per endpoint, and the fraction of entries (= of flows)
//! that move when one endpoint leaves, times N (1.00 is the minimum: only
//! the leaver's flows move). Removes every endpoint in turn (up to 50).
//!
//!   cargo run --release -p sluice-bench --example maglev_quality
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::time::Instant;

use sluice_bench::{textbook_maglev, uniform};
use sluice_dataplane::maglev::{default_size, Table};

/// (max/mean, moved*N mean, moved*N max) over removals of one endpoint.
fn quality(n: u16, m: u32, build: &dyn Fn(&[u16]) -> Vec<u16>) -> (f64, f64, f64) {
    let all: Vec<u16> = (0..n).collect();
    let before = build(&all);
    let mut counts = vec![0u32; usize::from(n)];
    for &e in &before {
        counts[usize::from(e)] += 1;
    }
    let balance = f64::from(*counts.iter().max().unwrap()) / (f64::from(m) / f64::from(n));
    let (mut sum, mut worst, mut k) = (0.0f64, 0.0f64, 0);
    for gone in (0..n).step_by(usize::from(n / 50).max(1)) {
        let rest: Vec<u16> = all.iter().copied().filter(|&e| e != gone).collect();
        let after = build(&rest);
        let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count();
        let f = moved as f64 / f64::from(m) * f64::from(n);
        sum += f;
        worst = worst.max(f);
        k += 1;
    }
    (balance, sum / f64::from(k), worst)
}

/// Microseconds per build, best of a few.
fn build_us(f: &dyn Fn() -> usize) -> f64 {
    (0..7)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64() * 1e6
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    println!(
        "{:>5} {:>6} | {:>9} {:>12} {:>12} {:>9} | {:>9} {:>12} {:>12} {:>9}",
        "N", "M", "max/mean", "moved*N mean", "moved*N max", "build us", "textbook", "moved*N mean", "moved*N max", "build us"
    );
    for n in [5u16, 10, 25, 32, 50, 100, 250, 1000] {
        for m in [default_size(u32::from(n)), 65537] {
            let sluice = |ids: &[u16]| -> Vec<u16> {
                let eps: Vec<(u16, u32)> = ids.iter().map(|&i| (i, 1)).collect();
                let t = Table::build(m, 65536, &eps).unwrap().unwrap();
                (0..m as usize).map(|i| t.entries().get(i)).collect()
            };
            let textbook = |ids: &[u16]| textbook_maglev(m, ids);
            let (b1, mean1, max1) = quality(n, m, &sluice);
            let (b2, mean2, max2) = quality(n, m, &textbook);
            let all = uniform(n);
            let ids: Vec<u16> = (0..n).collect();
            let t1 = build_us(&|| Table::build(m, 65536, &all).map(|t| t.map_or(0, |t| t.size() as usize)).unwrap_or(0));
            let t2 = build_us(&|| textbook_maglev(m, &ids).len());
            println!(
                "{n:>5} {m:>6} | {b1:>9.3} {mean1:>12.3} {max1:>12.3} {t1:>9.0} | {b2:>9.3} {mean2:>12.3} {max2:>12.3} {t2:>9.0}"
            );
        }
    }
}

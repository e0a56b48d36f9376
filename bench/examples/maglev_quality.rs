//! Balance and disruption of Maglev tables across sizes: for each (N, M),
//! max/mean entries per endpoint, and the fraction of entries (= of flows)
//! that move when one endpoint leaves, times N (1.00 is the minimum: only
//! the leaver's flows move). Removes every endpoint in turn (up to 50).
//!
//!   cargo run --release -p sluice-bench --example maglev_quality
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use sluice_bench::uniform;
use sluice_dataplane::maglev::{default_size, Table};

fn main() {
    println!("{:>5} {:>6} {:>9} {:>12} {:>12}", "N", "M", "max/mean", "moved*N mean", "moved*N max");
    for n in [5u16, 10, 25, 32, 50, 100, 250, 1000] {
        for m in [default_size(u32::from(n)), 65537] {
            let all = uniform(n);
            let before = Table::build(m, 65536, &all).unwrap().unwrap();
            let counts = before.counts(65536);
            let balance = f64::from(*counts.iter().max().unwrap()) / (f64::from(m) / f64::from(n));
            let (mut sum, mut worst, mut k) = (0.0f64, 0.0f64, 0);
            for gone in (0..n).step_by(usize::from(n / 50).max(1)) {
                let rest: Vec<_> = all.iter().copied().filter(|e| e.0 != gone).collect();
                let after = Table::build(m, 65536, &rest).unwrap().unwrap();
                let moved = (0..m as usize).filter(|&i| before.entries().get(i) != after.entries().get(i)).count();
                let f = moved as f64 / f64::from(m) * f64::from(n);
                sum += f;
                worst = worst.max(f);
                k += 1;
            }
            println!("{n:>5} {m:>6} {balance:>9.3} {:>12.3} {worst:>12.3}", sum / f64::from(k));
        }
    }
}

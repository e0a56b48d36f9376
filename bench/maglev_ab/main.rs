//! The Maglev builds of two dataplane trees in one process (built by
//! `bench/maglev_ab.sh`, which names the trees `old` and `new`): for each
//! case, batches of 30 ms of one build alternate with batches of the other,
//! each going first in every other round; printed are the median time of
//! each, the median of the paired ratios new / old, and whether both trees
//! build the same entries. On a noisy host, the paired ratio is the figure
//! to read: both sides see the same moments of the host.
//!
//! ```text
//! mgb [ROUNDS] [CASE]     # CASE: one of the names below (default: all)
//! ```
#![allow(clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Instant;

/// Microseconds per call of `f`, over a batch of about 30 ms.
fn batch(f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    let mut n = 0u32;
    while t.elapsed().as_millis() < 30 {
        f();
        n += 1;
    }
    t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args().nth(1).map_or(21, |s| s.parse().unwrap());
    let only = std::env::args().nth(2);
    type Case = (&'static str, u32, u32, Vec<(u16, u32)>);
    let cases: Vec<Case> = vec![
        // The default table of a 32-endpoint service with 10 and 20 endpoints (first visits).
        ("m6421_n10", 6421, 32, (0..10u16).map(|i| (i * 3, 1)).collect()),
        ("m6421_n20", 6421, 64, (0..20u16).map(|i| (i * 3, 1)).collect()),
        // Probing.
        ("m65537_n100", 65537, 1024, (0..100u16).map(|i| (i, 1)).collect()),
        ("m65537_n1000", 65537, 1024, (0..1000u16).map(|i| (i, 1)).collect()),
        ("m65537_n1000_weighted_1_to_8", 65537, 1024, (0..1000u16).map(|i| (i, 1 + u32::from(i % 8))).collect()),
    ];
    for (name, m, limit, eps) in cases.iter().filter(|c| only.as_deref().is_none_or(|o| o == c.0)) {
        let a = old::maglev::Table::build(*m, *limit, eps).unwrap().unwrap();
        let b = new::maglev::Table::build(*m, *limit, eps).unwrap().unwrap();
        let same = (0..*m as usize).all(|i| a.entries().get(i) == b.entries().get(i));
        let (mut o, mut n, mut r) = (vec![], vec![], vec![]);
        for round in 0..rounds {
            let mut build_old = || {
                black_box(old::maglev::Table::build(*m, *limit, black_box(eps)).unwrap());
            };
            let mut build_new = || {
                black_box(new::maglev::Table::build(*m, *limit, black_box(eps)).unwrap());
            };
            let (x, y) = if round % 2 == 0 {
                let x = batch(&mut build_old);
                (x, batch(&mut build_new))
            } else {
                let y = batch(&mut build_new);
                (batch(&mut build_old), y)
            };
            o.push(x);
            n.push(y);
            r.push(y / x);
        }
        println!(
            "{name}: old {:.2} us, new {:.2} us, new/old {:.3} (median of {rounds} paired ratios; same entries: {same})",
            median(o),
            median(n),
            median(r)
        );
    }
}

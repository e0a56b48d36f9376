//! Runs one stage of the pipeline N times over prepared frames, for
//! `bench/instructions.sh`, which counts instructions with callgrind.
//!
//!   STAGE=parse|classify|interval|hash|rewrite|refresh|process|staged|cidr|none N=100000 ROUTES=1|100|10000
//!   FLOW_TABLE=1 ALGORITHM=maglev|random SYN=1
//!
//! `staged` is what a worker does to a burst of 32 when its tables are
//! large: the look-ahead stages over the burst
//! ([`Pipeline::prefetch_burst`]), then each packet processed with what
//! they learned ([`Pipeline::process_ahead`]); `process` is one packet at a
//! time. Services keep per-flow state with `FLOW_TABLE=1` (the default
//! configuration's), use the random algorithm with `ALGORITHM=random`, and
//! the frames are TCP SYNs with `SYN=1` (ACKs otherwise: established flows).
//!
//! `classify` is the lookup the pipeline makes (the port hash first);
//! `interval` the same lookup by the VIP's hash and the interval search
//! only, without the port hash: its baseline, in the same binary.
//!
//! `cidr` is one source-prefix check (`Cidr::contains`, family-aware) of
//! an address of either family against a prefix of either family.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use sluice_bench::{appliance_with, frames_with_flags};
use sluice_dataplane::service::Algorithm;
use sluice_dataplane::addr::{Addr, Cidr};
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::hash::flow_hash;
use sluice_dataplane::memio::MemBuf;
use sluice_dataplane::parse::{parse_into, Parsed};
use sluice_dataplane::pipeline::{Pipeline, PipelineConfig};
use sluice_dataplane::rewrite::forward_l2;

#[derive(Clone, Copy)]
enum Stage {
    None,
    Parse,
    Classify,
    Interval,
    Hash,
    Refresh,
    Rewrite,
    Process,
    Staged,
    Cidr,
}

fn main() {
    let stage = match std::env::var("STAGE").unwrap_or_default().as_str() {
        "parse" => Stage::Parse,
        "classify" => Stage::Classify,
        "interval" => Stage::Interval,
        "hash" => Stage::Hash,
        "refresh" => Stage::Refresh,
        "rewrite" => Stage::Rewrite,
        "process" => Stage::Process,
        "staged" => Stage::Staged,
        "cidr" => Stage::Cidr,
        _ => Stage::None,
    };
    let n: usize = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let routes: u32 = std::env::var("ROUTES").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let (per_vip, services) = match routes {
        1 => (1, 1),
        r if r <= 100 => (10, r),
        _ => (20, 1000),
    };
    let flag = |k: &str| std::env::var(k).is_ok_and(|v| v == "1");
    let algorithm = if std::env::var("ALGORITHM").is_ok_and(|v| v == "random") { Algorithm::Random } else { Algorithm::Maglev };
    let a = appliance_with(routes, per_vip, services, 25, algorithm, flag("FLOW_TABLE"));
    let t = frames_with_flags(&a, 1024, 7, if flag("SYN") { 0x02 } else { 0x10 });
    let mut bufs: Vec<MemBuf> = t.iter().map(|f| MemBuf::new(f)).collect();
    let parsed: Vec<Parsed> = t
        .iter()
        .map(|f| {
            let mut p = Parsed::default();
            parse_into(f, &mut p).expect("the frames parse");
            p
        })
        .collect();
    let ctr = WorkerCounters::new(services as usize, services as usize * 25);
    let mut pl = Pipeline::new(&PipelineConfig::default(), 1);
    let c = &a.snapshot.classifier;
    let mut p = Parsed::default();
    let prefixes: Vec<Cidr> = ["10.0.0.0/8", "::/0", "2001:db8::/32", "0.0.0.0/0"].iter().map(|c| c.parse().unwrap()).collect();
    let addrs: Vec<Addr> = ["10.1.2.3", "2001:db8::1", "192.0.2.1", "fd00::7"].iter().map(|a| a.parse().unwrap()).collect();
    for i in 0..n {
        let k = i & 1023;
        match stage {
            Stage::None => {
                black_box(k);
            }
            Stage::Parse => {
                let _ = black_box(parse_into(black_box(&t[k]), &mut p));
            }
            Stage::Classify => {
                let q = black_box(&parsed[k]);
                black_box(c.classify_with_vip(&q.flow, q.has_ports, t[k].get(34..)));
            }
            Stage::Interval => {
                let q = black_box(&parsed[k]);
                black_box(c.vip_index(q.flow.dst).map(|v| c.classify_vip(v, &q.flow, q.has_ports, t[k].get(34..))));
            }
            Stage::Hash => {
                black_box(flow_hash(black_box(&parsed[k].flow)));
            }
            Stage::Refresh => {
                bufs[k].reset(&t[k]);
                black_box(&bufs[k]);
            }
            Stage::Rewrite => {
                bufs[k].reset(&t[k]);
                let _ = black_box(forward_l2(&mut bufs[k], &parsed[k], [2; 6], [3; 6], 0));
            }
            Stage::Process => {
                bufs[k].reset(&t[k]);
                black_box(pl.process(&a.snapshot, 0, &mut bufs[k], 1, &ctr));
            }
            Stage::Staged => {
                // A burst of 32 every 32nd packet (1024 frames: bursts never wrap).
                if k % 32 == 0 {
                    let burst = &mut bufs[k..k + 32];
                    for (b, f) in burst.iter_mut().zip(&t[k..k + 32]) {
                        b.reset(f);
                    }
                    pl.prefetch_burst(&a.snapshot, &ctr, burst, |addr| {
                        black_box(addr);
                    });
                    for (j, b) in burst.iter_mut().enumerate() {
                        black_box(pl.process_ahead(j, &a.snapshot, 0, b, 1, &ctr, true));
                    }
                }
            }
            Stage::Cidr => {
                black_box(black_box(&prefixes[i & 3]).contains(black_box(addrs[(i >> 2) & 3])));
            }
        }
    }
}

//! Runs one stage of the pipeline N times over prepared frames, for
//! `bench/instructions.sh`, which counts instructions with callgrind.
//!
//!   STAGE=parse|classify|interval|hash|rewrite|refresh|process|cidr|none N=100000 ROUTES=1|100|10000
//!
//! `classify` is the lookup the pipeline makes (the port hash first);
//! `interval` the same lookup by the VIP's hash and the interval search
//! only, without the port hash: its baseline, in the same binary.
//!
//! `cidr` is one source-prefix check (`Cidr::contains`, family-aware) of
//! an address of either family against a prefix of either family.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use sluice_bench::{appliance, frames};
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
    let a = appliance(routes, per_vip, services, 25);
    let t = frames(&a, 1024, 7);
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
            Stage::Cidr => {
                black_box(black_box(&prefixes[i & 3]).contains(black_box(addrs[(i >> 2) & 3])));
            }
        }
    }
}

// Instruction counts per stage: run under callgrind with MODE and N.
use std::hint::black_box;
use sluice_bench::{appliance, frames};
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::hash::flow_hash;
use sluice_dataplane::memio::MemBuf;
use sluice_dataplane::parse::{parse_into, Kind, Parsed};
use sluice_dataplane::pipeline::{Pipeline, PipelineConfig};
use sluice_dataplane::rewrite::forward_l2;

fn main() {
    let mode = std::env::var("MODE").unwrap_or_default();
    let n: usize = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(100000);
    let a = appliance(1, 1, 1, 25);
    let t = frames(&a, 1024, 7);
    let mut bufs: Vec<MemBuf> = t.iter().map(|f| MemBuf::new(f)).collect();
    let parsed: Vec<Parsed> = t.iter().map(|f| { let mut p = Parsed::default(); parse_into(f, &mut p).unwrap(); p }).collect();
    let ctr = WorkerCounters::new(1, 25);
    let mut pl = Pipeline::new(&PipelineConfig::default(), 1);
    let c = &a.snapshot.classifier;
    for i in 0..n {
        let k = i & 1023;
        match mode.as_str() {
            "parse" => { let mut p = Parsed::default(); black_box(parse_into(black_box(&t[k]), &mut p).map(|x| x == Kind::Ip)); black_box(&p); }
            "classify" => { let p = black_box(&parsed[k]); black_box(c.classify(&p.flow, p.has_ports, Some(&t[k][34..]))); }
            "hash" => { black_box(flow_hash(black_box(&parsed[k].flow))); }
            "rewrite" => { let b = &mut bufs[k]; b.reset(&t[k]); black_box(forward_l2(b, &parsed[k], [2; 6], [3; 6])); }
            "reset" => { let b = &mut bufs[k]; b.reset(&t[k]); black_box(&b); }
            "process" => { let b = &mut bufs[k]; b.reset(&t[k]); black_box(pl.process(&a.snapshot, 0, b, 1, &ctr)); }
            _ => { black_box(k); }
        }
    }
}

use std::hint::black_box;
use std::time::Instant;
use sluice_bench::{appliance, frames};
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::hash::flow_hash;
use sluice_dataplane::memio::MemBuf;
use sluice_dataplane::parse::{parse, Frame};
use sluice_dataplane::pipeline::{Pipeline, PipelineConfig};

fn main() {
    let a = appliance(1, 1, 1, 25);
    let t = frames(&a, 4096, 7);
    let n = 4_000_000usize;
    let time = |name: &str, f: &mut dyn FnMut(usize)| {
        let s = Instant::now();
        for i in 0..n { f(i); }
        println!("{name:20} {:.1} ns/pkt", s.elapsed().as_nanos() as f64 / n as f64);
    };
    time("parse", &mut |i| { black_box(parse(black_box(&t[i & 4095]))); });
    time("parse+classify", &mut |i| {
        if let Ok(Frame::Ip(p)) = parse(black_box(&t[i & 4095])) {
            black_box(a.snapshot.classifier.classify(&p.flow, p.has_ports, Some(&t[i & 4095][34..])));
        }
    });
    time("parse+hash", &mut |i| {
        if let Ok(Frame::Ip(p)) = parse(black_box(&t[i & 4095])) { black_box(flow_hash(&p.flow)); }
    });
    let mut bufs: Vec<MemBuf> = t.iter().map(|f| MemBuf::new(f)).collect();
    time("reset", &mut |i| { bufs[i & 4095].reset(&t[i & 4095]); });
    let ctr = WorkerCounters::new(1, 25);
    let mut pl = Pipeline::new(&PipelineConfig::default(), 1);
    time("reset+process", &mut |i| { let b = &mut bufs[i & 4095]; b.reset(&t[i & 4095]); black_box(pl.process(&a.snapshot, 0, b, 1, &ctr)); });
}

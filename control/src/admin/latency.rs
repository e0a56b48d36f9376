//! `/latency`: each packet's time through the workers (from a burst's
//! arrival to its round's last transmit; see `sluice_dataplane::latency`),
//! as percentiles in microseconds, per worker and over all of them, since
//! the appliance started. Recorded only with `dpdk.latencyHistogram: true`.

use serde::Serialize;
use sluice_dataplane::latency::{histogram, LatencyHistogram};

use super::state::Shared;

/// Percentiles of one histogram, in microseconds.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct Percentiles {
    /// Packets counted.
    pub(crate) packets: u64,
    /// Median.
    pub(crate) p50: f64,
    /// 90th percentile.
    pub(crate) p90: f64,
    /// 99th percentile.
    pub(crate) p99: f64,
    /// 99.9th percentile.
    pub(crate) p999: f64,
    /// Longest.
    pub(crate) max: f64,
}

impl Percentiles {
    fn of(h: &LatencyHistogram, ticks_per_us: f64) -> Percentiles {
        let us = |ticks: u64| (ticks as f64 / ticks_per_us * 100.0).round() / 100.0;
        Percentiles {
            packets: h.len(),
            p50: us(h.value_at_quantile(0.5)),
            p90: us(h.value_at_quantile(0.9)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        }
    }
}

/// One worker's figures.
#[derive(Debug, Serialize)]
pub(super) struct WorkerLatency {
    /// Its lcore.
    pub(crate) lcore: u32,
    /// Its percentiles.
    #[serde(flatten)]
    pub(crate) percentiles: Percentiles,
}

/// The document `/latency` serves.
#[derive(Debug, Serialize)]
pub(super) struct LatencyView {
    /// What is measured.
    pub(crate) measures: &'static str,
    /// Every worker's packets together.
    pub(crate) all: Percentiles,
    /// Per worker.
    pub(crate) workers: Vec<WorkerLatency>,
}

/// The view, or `None` when the workers do not record.
pub(super) fn view(sh: &Shared) -> Option<LatencyView> {
    let ticks_per_us = (sh.cycles_hz.max(1) as f64) / 1e6;
    let mut all = histogram();
    let mut workers = Vec::new();
    for w in &sh.workers {
        let Some(l) = &w.latency else { continue };
        let h = l.snapshot();
        // Same bounds: adding cannot fail.
        let _ = all.add(&h);
        workers.push(WorkerLatency { lcore: w.lcore, percentiles: Percentiles::of(&h, ticks_per_us) });
    }
    if workers.is_empty() {
        return None;
    }
    Some(LatencyView {
        measures: "microseconds from a burst's arrival from a port to its poll round's last transmit, per packet, since start",
        all: Percentiles::of(&all, ticks_per_us),
        workers,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sluice_dataplane::counters::WorkerCounters;
    use sluice_dataplane::latency::SharedLatency;

    use super::*;
    use crate::admin::state::{IdlePool, WorkerEntry};

    #[test]
    fn percentiles_in_microseconds_over_every_worker() {
        let entry = |lcore, latency| WorkerEntry { lcore, counters: Arc::new(WorkerCounters::new(1, 1)), latency };
        let off = Shared::new("c.yaml".into(), Vec::new(), Arc::new(IdlePool), vec![entry(1, None)], 2_000_000_000);
        assert!(view(&off).is_none(), "nothing recorded: no view");
        let (a, b) = (Arc::new(SharedLatency::default()), Arc::new(SharedLatency::default()));
        // Worker a: 99 packets at 2 us, 1 at 1 ms; worker b: 100 at 4 us
        // (2 GHz ticks).
        let mut h = histogram();
        h.record_n(4_000, 99).unwrap();
        h.record(2_000_000).unwrap();
        let sh = Shared::new(
            "c.yaml".into(),
            Vec::new(),
            Arc::new(IdlePool),
            vec![entry(1, Some(Arc::clone(&a))), entry(2, Some(Arc::clone(&b))), entry(3, None)],
            2_000_000_000,
        );
        a.add(&h);
        let mut hb = histogram();
        hb.record_n(8_000, 100).unwrap();
        b.add(&hb);
        let v = view(&sh).unwrap();
        assert_eq!(v.workers.len(), 2);
        // Values within the histogram's 1 % resolution.
        let near = |got: f64, want: f64| (got - want).abs() <= want * 0.01 + 0.01;
        let w1 = &v.workers[0].percentiles;
        assert_eq!((v.workers[0].lcore, w1.packets), (1, 100));
        assert!(near(w1.p50, 2.0) && near(w1.p99, 2.0) && near(w1.max, 1000.0), "{w1:?}");
        assert_eq!(v.all.packets, 200);
        // Sorted: 99 at 2 us, 100 at 4 us, 1 at 1 ms.
        assert!(near(v.all.p50, 4.0) && near(v.all.p99, 4.0) && near(v.all.p999, 1000.0), "{:?}", v.all);
    }
}

//! Each packet's time through a worker, as a histogram (hdrhistogram).
//!
//! A worker that records takes a timestamp when a burst comes in from a
//! port, and one when its poll round has sent everything (the round's last
//! transmit): every packet of the burst spent that long in the worker.
//! Packets handed over by another worker are not counted (their receipt
//! was timed there). Time a packet waited in the port's ring before the
//! poll is not seen (the device gives no receive timestamp), nor is the
//! time the device takes to send it.
//!
//! Recording costs two clock reads per burst and a histogram update, so it
//! is off unless configured (`dpdk.latencyHistogram`). The worker records
//! into a histogram of its own and adds it to the one the control side
//! reads, [`SharedLatency`], about every [`MERGE_MS`] milliseconds, without
//! ever waiting for the lock.

use std::sync::{Arc, Mutex};

use hdrhistogram::Histogram;

/// Values are clock ticks (TSC cycles for `sluice run`).
pub type LatencyHistogram = Histogram<u64>;

/// The longest time a histogram tells apart, in ticks (about 27 s at
/// 5 GHz); longer times are recorded as this.
pub const MAX_TICKS: u64 = 1 << 37;

/// Significant decimal digits kept (1 % resolution).
const SIGFIG: u8 = 2;

/// How often, in milliseconds, a worker adds what it recorded to the
/// shared histogram.
pub const MERGE_MS: u64 = 100;

/// An empty histogram with the bounds every latency histogram has.
pub fn histogram() -> LatencyHistogram {
    match Histogram::new_with_bounds(1, MAX_TICKS, SIGFIG) {
        Ok(h) => h,
        // The bounds are constants that hdrhistogram accepts (tested).
        Err(e) => unreachable!("latency histogram bounds: {e}"),
    }
}

/// A worker's histogram as the control side reads it.
#[derive(Debug)]
pub struct SharedLatency {
    hist: Mutex<LatencyHistogram>,
}

impl Default for SharedLatency {
    fn default() -> Self {
        SharedLatency { hist: Mutex::new(histogram()) }
    }
}

impl SharedLatency {
    /// A copy of what the worker has added so far.
    pub fn snapshot(&self) -> LatencyHistogram {
        self.hist.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Adds `h` (a worker's recording, or a test's).
    pub fn add(&self, h: &LatencyHistogram) {
        self.merge(h, true);
    }

    fn merge(&self, h: &LatencyHistogram, wait: bool) -> bool {
        let guard = if wait {
            Some(self.hist.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
        } else {
            self.hist.try_lock().ok()
        };
        let Some(mut g) = guard else { return false };
        // Same bounds on both sides: adding cannot fail; were it to, the
        // values are kept for the next try.
        g.add(h).is_ok()
    }
}

/// The recording side, owned by a worker.
#[derive(Debug)]
pub struct Recorder {
    clock: fn() -> u64,
    local: LatencyHistogram,
    shared: Arc<SharedLatency>,
    /// This round's bursts: (clock when taken in, packets).
    bursts: Vec<(u64, u64)>,
    merged_ms: u64,
}

impl Recorder {
    /// Records with `clock` (any monotonic tick counter) into `shared`.
    pub fn new(clock: fn() -> u64, shared: Arc<SharedLatency>) -> Recorder {
        Recorder { clock, local: histogram(), shared, bursts: Vec::with_capacity(8), merged_ms: 0 }
    }

    /// `packets` came in from a port just now.
    #[inline]
    pub fn burst_in(&mut self, packets: usize) {
        self.bursts.push(((self.clock)(), packets as u64));
    }

    /// The round has sent everything: each burst's packets took from their
    /// arrival until now. Every [`MERGE_MS`] (by `now_ms`) the recorded
    /// values go to the shared histogram, when its lock is free.
    #[inline]
    pub fn round_done(&mut self, now_ms: u64) {
        if !self.bursts.is_empty() {
            let now = (self.clock)();
            for (t, n) in self.bursts.drain(..) {
                self.local.saturating_record_n(now.saturating_sub(t), n);
            }
        }
        if now_ms.saturating_sub(self.merged_ms) >= MERGE_MS && !self.local.is_empty() && self.shared.merge(&self.local, false) {
            self.local.reset();
            self.merged_ms = now_ms;
        }
    }

    /// Hands over whatever is left (when the worker stops).
    pub fn flush(&mut self) {
        if !self.local.is_empty() && self.shared.merge(&self.local, true) {
            self.local.reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    static TICKS: AtomicU64 = AtomicU64::new(1000);

    fn ticks() -> u64 {
        TICKS.load(Ordering::Relaxed)
    }

    #[test]
    fn bursts_take_from_arrival_to_the_end_of_the_round() {
        let shared = Arc::new(SharedLatency::default());
        let mut r = Recorder::new(ticks, Arc::clone(&shared));
        r.burst_in(32);
        TICKS.fetch_add(500, Ordering::Relaxed);
        r.burst_in(8);
        TICKS.fetch_add(100, Ordering::Relaxed);
        // Not merged before MERGE_MS has passed since the last merge.
        r.round_done(MERGE_MS - 1);
        assert!(shared.snapshot().is_empty());
        r.round_done(MERGE_MS);
        let h = shared.snapshot();
        assert_eq!(h.len(), 40, "every packet counted once");
        assert_eq!(h.count_between(595, 605), 32, "the first burst waited 600 ticks");
        assert_eq!(h.count_between(99, 101), 8, "the second 100");
        // A round without packets records nothing; what is left is flushed.
        r.round_done(MERGE_MS + 1);
        r.burst_in(1);
        TICKS.fetch_add(MAX_TICKS * 2, Ordering::Relaxed);
        r.round_done(MERGE_MS + 2);
        assert_eq!(shared.snapshot().len(), 40);
        r.flush();
        let h = shared.snapshot();
        assert_eq!(h.len(), 41);
        assert!(h.max() >= MAX_TICKS / 2, "a time beyond the bounds is kept at the top");
    }
}

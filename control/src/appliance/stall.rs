//! The stall watch.
//!
//! BGP and BFD reach this appliance's BIRD through the workers (the
//! exception path), so a worker that stops polling can neither forward nor
//! carry the withdrawal of the VIPs it attracts. The watch reads the
//! health sampler's view of each worker: one silent for more than
//! [`health::STALL`] is reported once in the log (and by
//! `sluice_worker_stalled` and `/healthz`, which read the same view); one
//! silent for `dpdk.stallExitSeconds` ends the process with
//! [`EXIT_STALLED`], so that its supervisor starts it again. The exit does
//! not wait for the workers (a stalled one would never be joined); the
//! supervised BIRD dies with the process and the next `sluice run` takes
//! over what was left, as after a kill.

use std::time::{Duration, Instant};

use tracing::{error, info};

use crate::admin::health;
use crate::admin::state::Shared;

/// The exit status of a process ended by a stalled worker.
pub(super) const EXIT_STALLED: i32 = 3;

/// What the watch remembers between samples.
#[derive(Debug)]
pub(super) struct StallWatch {
    exit_after: Duration,
    reported: Vec<bool>,
}

impl StallWatch {
    /// A watch over `workers` workers that gives up after `exit_after`.
    pub(super) fn new(workers: usize, exit_after: Duration) -> StallWatch {
        StallWatch { exit_after, reported: vec![false; workers] }
    }

    /// Logs each worker that stalled or polls again since the last check;
    /// returns why the process must exit, if a worker has been silent for
    /// the exit time.
    pub(super) fn check(&mut self, sh: &Shared, now: Instant) -> Option<String> {
        let silent = health::silent_for(sh, now);
        let mut exit = None;
        for ((w, d), reported) in sh.workers.iter().zip(silent).zip(self.reported.iter_mut()) {
            if d > health::STALL {
                if !*reported {
                    *reported = true;
                    error!(
                        lcore = %w.lcore,
                        silent_ms = d.as_millis(),
                        exit_after_s = self.exit_after.as_secs(),
                        "worker stalled: it has not polled for over a second and carries neither traffic nor BGP/BFD; the process exits if it stays so for dpdk.stallExitSeconds"
                    );
                }
                if d >= self.exit_after && exit.is_none() {
                    exit = Some(format!("worker on lcore {} has not polled for {:.1} s (dpdk.stallExitSeconds: {})", w.lcore, d.as_secs_f64(), self.exit_after.as_secs()));
                }
            } else if *reported {
                *reported = false;
                info!(lcore = %w.lcore, "worker polls again");
            }
        }
        exit
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sluice_dataplane::counters::WorkerCounters;

    use super::*;
    use crate::admin::health::sample;
    use crate::admin::state::{IdlePool, WorkerEntry};

    fn shared(workers: u32) -> Shared {
        let w = (1..=workers).map(|lcore| WorkerEntry { lcore, counters: Arc::new(WorkerCounters::new(1, 1)), latency: None }).collect();
        Shared::new("t.yaml".into(), Vec::new(), Arc::new(IdlePool), w, 1)
    }

    /// Bring-up between the shared state and the workers' launch can take
    /// seconds (it may wait on the kernel's routing lock): a worker that has
    /// not started yet is not stalled.
    #[test]
    fn a_worker_is_silent_only_from_its_launch() {
        let sh = shared(1);
        let launched = Instant::now() + Duration::from_millis(2200);
        crate::admin::health::workers_launched(&sh, launched);
        let mut watch = StallWatch::new(1, Duration::from_secs(3));
        let now = launched + Duration::from_millis(10);
        sample(&sh, now);
        assert_eq!(watch.check(&sh, now), None);
        assert!(!watch.reported[0], "not stalled 10 ms after its launch");
        assert_eq!(crate::admin::health::silent_for(&sh, now), vec![Duration::from_millis(10)]);
    }

    #[test]
    fn a_silent_worker_is_reported_once_then_ends_the_process() {
        let sh = shared(2);
        let t0 = Instant::now();
        let mut watch = StallWatch::new(2, Duration::from_secs(3));
        let poll = |i: usize| sh.workers[i].counters.idle_polls.add(1);
        let tick = |watch: &mut StallWatch, ms: u64, both: bool| {
            poll(0);
            if both {
                poll(1);
            }
            let now = t0 + Duration::from_millis(ms);
            sample(&sh, now);
            watch.check(&sh, now)
        };
        assert_eq!(tick(&mut watch, 0, true), None);
        assert_eq!(tick(&mut watch, 900, false), None);
        assert!(!watch.reported[1]);
        assert_eq!(tick(&mut watch, 1100, false), None);
        assert!(watch.reported[1] && !watch.reported[0], "reported once silent for over a second");
        assert_eq!(tick(&mut watch, 2000, false), None);
        let why = tick(&mut watch, 3000, false).expect("silent for the exit time");
        assert!(why.contains("lcore 2 has not polled for 3.0 s"), "{why}");
        // A worker that polls again is no longer reported.
        assert_eq!(tick(&mut watch, 3200, true), None);
        assert!(!watch.reported[1]);
    }
}

//! The last minute (`/status`'s `last_minute`, the first figures `sluice
//! status` prints): totals the health sampler reads once a second and
//! keeps for a minute, so that the received, balanced, dropped and lost
//! packets of the last 60 s are a difference of two samples, computed by
//! the appliance (the CLI and a dashboard's one-minute rates agree).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use sluice_admin_api::LastMinute;
use sluice_dataplane::verdict::DropReason;

use super::state::Shared;
use crate::ground::lock;

/// How far back the totals go.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// Between two samples kept.
const EVERY: Duration = Duration::from_secs(1);

/// Counters summed over the workers and the ports, at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    rx: u64,
    balanced: u64,
    /// By [`DropReason::index`].
    drops: Vec<u64>,
    lost: u64,
    missed: u64,
    nombuf: u64,
}

impl Totals {
    /// The counters now.
    pub(crate) fn read(sh: &Shared) -> Totals {
        let mut t = Totals { drops: vec![0; DropReason::ALL.len()], ..Totals::default() };
        for w in &sh.workers {
            let c = &w.counters;
            t.rx += c.rx_packets.get();
            t.balanced += c.balanced.get();
            for r in DropReason::ALL {
                t.drops[r.index()] += c.drops[r.index()].get();
            }
        }
        for p in &sh.ports {
            t.lost += lock(&p.loss).below_dpdk;
            if let Some(s) = p.port.stats() {
                t.missed += s.imissed;
                t.nombuf += s.rx_nombuf;
            }
        }
        t
    }

    /// What was counted from `earlier` to `self` (a counter never goes back
    /// within a run; a smaller one reads as 0).
    fn since(&self, earlier: &Totals) -> Totals {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        Totals {
            rx: d(self.rx, earlier.rx),
            balanced: d(self.balanced, earlier.balanced),
            drops: self.drops.iter().enumerate().map(|(i, n)| d(*n, earlier.drops.get(i).copied().unwrap_or(0))).collect(),
            lost: d(self.lost, earlier.lost),
            missed: d(self.missed, earlier.missed),
            nombuf: d(self.nombuf, earlier.nombuf),
        }
    }
}

/// The samples of the last minute, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Window {
    samples: VecDeque<(Instant, Totals)>,
}

impl Window {
    /// Whether a sample read at `now` would be kept: a second has passed
    /// since the last one (the totals are read only then).
    pub(crate) fn due(&self, now: Instant) -> bool {
        self.samples.back().is_none_or(|(at, _)| now.saturating_duration_since(*at) >= EVERY)
    }

    /// Keeps `t`, read at `now`, when it is [`due`](Self::due); lets go of
    /// the samples that no longer start a window.
    pub(crate) fn record(&mut self, now: Instant, t: Totals) {
        if !self.due(now) {
            return;
        }
        self.samples.push_back((now, t));
        // The oldest kept is the last one at least WINDOW old.
        while self.samples.get(1).is_some_and(|(at, _)| now.saturating_duration_since(*at) >= WINDOW) {
            self.samples.pop_front();
        }
    }

    /// The totals from the oldest sample at most [`WINDOW`] before `now` to
    /// `current`; none without such a sample.
    pub(crate) fn last_minute(&self, now: Instant, current: &Totals) -> LastMinute {
        let Some((at, first)) = self.samples.iter().find(|(at, _)| now.saturating_duration_since(*at) <= WINDOW) else {
            return LastMinute::default();
        };
        let d = current.since(first);
        LastMinute {
            seconds: now.saturating_duration_since(*at).as_secs_f64(),
            rx_packets: d.rx,
            balanced: d.balanced,
            drops: d.drops.iter().sum(),
            drops_by_reason: DropReason::ALL.iter().filter(|r| d.drops[r.index()] > 0).map(|r| (r.name().to_owned(), d.drops[r.index()])).collect(),
            lost_below_dpdk: d.lost,
            rx_missed: d.missed,
            rx_nombuf: d.nombuf,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Totals after `s` seconds of 1,000 packets a second received, 990
    /// balanced, 10 dropped (no route), and one frame lost every 10 s.
    fn at(s: u64) -> Totals {
        let mut drops = vec![0; DropReason::ALL.len()];
        drops[DropReason::NoRoute.index()] = 10 * s;
        Totals { rx: 1000 * s, balanced: 990 * s, drops, lost: s / 10, missed: 0, nombuf: 0 }
    }

    #[test]
    fn the_last_minute_is_the_difference_from_the_sample_a_minute_back() {
        let t0 = Instant::now();
        let mut w = Window::default();
        let none = w.last_minute(t0, &at(0));
        assert_eq!(none, LastMinute::default(), "no sample yet");
        // A sample every 200 ms (the health sampler's pace): one a second is kept.
        for ms in (0..=90_000).step_by(200) {
            w.record(t0 + Duration::from_millis(ms), at(ms / 1000));
            if ms == 10_000 {
                let m = w.last_minute(t0 + Duration::from_millis(ms), &at(10));
                assert_eq!((m.seconds, m.rx_packets, m.drops), (10.0, 10_000, 100), "ten seconds after the start: {m:?}");
            }
        }
        assert!(w.samples.len() <= 62, "a minute of samples kept: {}", w.samples.len());
        let now = t0 + Duration::from_secs(90);
        let m = w.last_minute(now, &at(90));
        assert_eq!(m.seconds, 60.0);
        assert_eq!((m.rx_packets, m.balanced, m.drops, m.lost_below_dpdk), (60_000, 59_400, 600, 6));
        assert_eq!(m.drops_by_reason, vec![(DropReason::NoRoute.name().to_owned(), 600)]);
        // Nothing since: a quiet minute reads as zeros, the window still a minute.
        let later = t0 + Duration::from_secs(150);
        w.record(later, at(90));
        let quiet = w.last_minute(later, &at(90));
        assert_eq!((quiet.seconds, quiet.rx_packets, quiet.drops), (60.0, 0, 0), "{quiet:?}");
    }
}

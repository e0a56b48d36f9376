//! Rate pacing by the clock: how many frames are due now.
//!
//! A [`Pacer`] at `pps` frames per second allows, at time `t` (in clock
//! ticks, `hz` per second, since it started), `t * pps / hz` frames in all;
//! each call hands out what is due and not yet issued, at most a burst.
//! When the sender falls behind by more than a backlog (it was descheduled,
//! or the port refused frames for a while), the excess is skipped and
//! counted rather than sent as one long burst, so that a given offered rate
//! keeps its spacing. Frames are released in batches of what is due in
//! [`BATCH_NS`] (1 to a burst), so that a high rate is not sent one frame
//! per round. A [`Schedule`] does the same for recorded times (a
//! pcap replayed at its own timing, looped).

use sluice_dataplane::io::BURST;

/// Frames are released once this much time's worth of them is due.
pub(crate) const BATCH_NS: u64 = 20_000;

/// Frames per second against a clock.
#[derive(Clone, Debug)]
pub struct Pacer {
    hz: u64,
    pps: u64,
    start: u64,
    issued: u64,
    max_backlog: u64,
    batch: u64,
    /// Frames skipped because the sender fell behind by more than the backlog.
    pub(crate) skipped: u64,
}

impl Pacer {
    /// A pacer for `pps` frames per second (0: no limit) on a clock of `hz`
    /// ticks per second, starting at tick `start`, that lets at most
    /// `max_backlog` due frames pile up.
    pub fn new(hz: u64, pps: u64, start: u64, max_backlog: u64) -> Pacer {
        let batch = (u128::from(pps) * u128::from(BATCH_NS) / 1_000_000_000).clamp(1, BURST as u128);
        Pacer {
            hz: hz.max(1),
            pps,
            start,
            issued: 0,
            max_backlog: max_backlog.max(BURST as u64),
            batch: u64::try_from(batch).unwrap_or(1),
            skipped: 0,
        }
    }

    /// Frames due at tick `now` and not yet issued, at most [`BURST`].
    #[inline]
    pub(crate) fn due(&mut self, now: u64) -> usize {
        if self.pps == 0 {
            return BURST;
        }
        let elapsed = u128::from(now.saturating_sub(self.start));
        let target = u64::try_from(elapsed * u128::from(self.pps) / u128::from(self.hz)).unwrap_or(u64::MAX);
        let behind = target.saturating_sub(self.issued);
        if behind > self.max_backlog {
            self.skipped += behind - self.max_backlog;
            self.issued = target - self.max_backlog;
        }
        let due = target.saturating_sub(self.issued);
        if due < self.batch {
            return 0;
        }
        usize::try_from(due).unwrap_or(BURST).min(BURST)
    }

    /// Records that `n` frames went out (a datagram's fragments may take
    /// the count past what was due; the next calls make up for it).
    #[inline]
    pub(crate) fn issued(&mut self, n: usize) {
        self.issued += n as u64;
    }
}

/// Recorded send times, replayed in a loop.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Offsets from the start of a pass, in clock ticks, not decreasing.
    offsets: Vec<u64>,
    /// Length of one pass in ticks.
    span: u64,
    start: u64,
    /// Next frame index, over all passes.
    next: u64,
}

impl Schedule {
    /// Frames at `offsets` (ticks from the start of a pass, not
    /// decreasing); a pass lasts `span` ticks (at least the last offset
    /// plus one); the first starts at `start`.
    pub fn new(offsets: Vec<u64>, span: u64, start: u64) -> Schedule {
        let last = offsets.last().copied().unwrap_or(0);
        Schedule { offsets, span: span.max(last + 1), start, next: 0 }
    }

    /// Frames due at `now` and not yet issued, at most [`BURST`]; marks them issued.
    #[inline]
    pub(crate) fn due(&mut self, now: u64) -> usize {
        let len = self.offsets.len() as u64;
        if len == 0 {
            return 0;
        }
        let mut n = 0;
        while n < BURST {
            let pass = self.next / len;
            let i = usize::try_from(self.next % len).unwrap_or(0);
            let at = self.start.saturating_add(pass.saturating_mul(self.span)).saturating_add(self.offsets[i]);
            if at > now {
                break;
            }
            self.next += 1;
            n += 1;
        }
        n
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // small test numbers
mod tests {
    use super::*;

    #[test]
    fn pacing_follows_the_rate() {
        // 1 MHz clock, 1000 pps: one frame per 1000 ticks.
        let mut p = Pacer::new(1_000_000, 1000, 5_000, 1000);
        assert_eq!(p.due(5_000), 0);
        assert_eq!(p.due(5_999), 0);
        assert_eq!(p.due(6_000), 1);
        p.issued(1);
        assert_eq!(p.due(6_500), 0);
        assert_eq!(p.due(15_000), 9);
        p.issued(9);
        // Over a long run the total matches the rate exactly.
        let mut sent = 10;
        let mut t = 15_000;
        while t < 1_005_000 {
            t += 77;
            let n = p.due(t);
            p.issued(n);
            sent += n;
        }
        assert_eq!(sent as u64, (t - 5_000) * 1000 / 1_000_000);
        assert_eq!(p.skipped, 0);
    }

    #[test]
    fn bursts_are_capped_and_backlog_is_skipped() {
        let mut p = Pacer::new(1000, 1000, 0, 100);
        // 10 s late: 10,000 due, 100 kept, the rest skipped.
        assert_eq!(p.due(10_000), BURST);
        assert_eq!(p.skipped, 9_900);
        p.issued(BURST);
        assert_eq!(p.due(10_000), BURST);
        // Fragments may overshoot; the next calls make up.
        let mut p = Pacer::new(1000, 1000, 0, 100);
        assert_eq!(p.due(1), 1);
        p.issued(2);
        assert_eq!(p.due(2), 0);
        assert_eq!(p.due(3), 1);
    }

    #[test]
    fn high_rates_go_in_batches() {
        // 1 GHz clock, 1 Mpps: a frame per 1000 ticks, released 20 at a time.
        let mut p = Pacer::new(1_000_000_000, 1_000_000, 0, 4096);
        assert_eq!(p.due(19_999), 0);
        assert_eq!(p.due(20_000), 20);
        p.issued(20);
        // 100 Mpps: whole bursts.
        let mut p = Pacer::new(1_000_000_000, 100_000_000, 0, 4096);
        assert_eq!(p.due(100), 0);
        assert_eq!(p.due(320), BURST);
    }

    #[test]
    fn unlimited_is_always_a_burst() {
        let mut p = Pacer::new(1000, 0, 0, 0);
        assert_eq!(p.due(0), BURST);
    }

    #[test]
    fn schedules_loop_over_passes() {
        let mut s = Schedule::new(vec![0, 10, 10, 30], 40, 100);
        assert_eq!(s.due(99), 0);
        assert_eq!(s.due(100), 1);
        assert_eq!(s.due(110), 2);
        assert_eq!(s.due(129), 0);
        assert_eq!(s.due(139), 1);
        // Second pass starts at 140.
        assert_eq!(s.due(139), 0);
        assert_eq!(s.due(150), 3);
        assert_eq!(s.due(10_000), BURST);
    }
}

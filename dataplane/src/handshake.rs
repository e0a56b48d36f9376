//! Passive health's meeting point: the TCP handshakes in flight, shared by
//! every worker and read by the control side.
//!
//! A client's SYN and the endpoint's answer (SYN-ACK, or RST from a closed
//! port) may reach different workers: the SYN comes in on the client's side
//! and goes to the worker that owns its flow, the answer (source = the VIP,
//! on the NAT-less return path) to whichever worker its port's RSS picks.
//! They meet in this table, one slot per handshake, found by the forward
//! flow's hash (the answer hashes its reversed tuple to the same slot):
//! - the worker that sends a SYN to an endpoint takes a free slot (a
//!   compare-and-swap: two workers never write one slot) and writes who it
//!   went to and when; a slot in use is left alone (the SYN goes unsampled,
//!   counted by the worker);
//! - the worker that forwards the answer claims the slot (a compare-and-swap
//!   from "SYN sent" to "writing"), writes the time and what the answer
//!   was, and marks it answered; a second SYN of the same flow while the
//!   first is unanswered marks it "retransmitted" the same way (the
//!   endpoint, or its path, lost the first);
//! - the control side sweeps the table ([`Handshakes::sweep`]) a few times
//!   a second: it takes every answered slot and every slot unanswered for
//!   longer than its bound, and frees them. Workers only write times; the
//!   control side counts and decides.
//!
//! A slot is three words: `head` (state, a tag of the flow's hash, and the
//! SYN's time), `who` (the service key, endpoint identifier and the low bits
//! of its incarnation), `answer` (time and kind). Only the worker that moved
//! `head` from free to "writing" writes `who`; only the worker that moved it
//! from "SYN sent" to "writing" writes `answer`; only the control side frees
//! an answered slot, or a SYN-sent one with a compare-and-swap. A slot being
//! written is in use for everyone else. Times are ticks of the table's
//! clock (the TSC in the appliance, cheaper to read than the system
//! clock) shifted so that a unit is half a microsecond to one, in 32
//! bits: they wrap after half an hour or more, and every difference taken
//! is of two times less than a sweep bound apart.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::maglev::EndpointId;

const STATE_SHIFT: u32 = 62;
const FREE: u64 = 0;
const WRITING: u64 = 1;
const SENT: u64 = 2;
const ANSWERED: u64 = 3;
const TAG_BITS: u32 = 30;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;

/// What answered a SYN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A SYN-ACK: the endpoint accepts connections.
    SynAck,
    /// An RST: nothing listens on the port.
    Reset,
    /// The client sent its SYN again before any answer came.
    Retransmitted,
    /// Nothing within the sweep's bound.
    Unanswered,
}

impl Answer {
    fn code(self) -> u64 {
        match self {
            Answer::SynAck => 1,
            Answer::Reset => 2,
            Answer::Retransmitted => 3,
            Answer::Unanswered => 4,
        }
    }

    fn of_code(c: u64) -> Answer {
        match c {
            1 => Answer::SynAck,
            2 => Answer::Reset,
            3 => Answer::Retransmitted,
            _ => Answer::Unanswered,
        }
    }

    /// True for a SYN-ACK: the handshake's endpoint side worked.
    pub fn is_success(self) -> bool {
        self == Answer::SynAck
    }
}

/// One handshake the sweep took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The service's stable key.
    pub service: u32,
    /// The endpoint the SYN went to.
    pub endpoint: EndpointId,
    /// The low 16 bits of its incarnation.
    pub incarnation: u16,
    /// What came back.
    pub answer: Answer,
    /// Microseconds from the SYN to its answer (0 when unanswered).
    pub micros: u32,
}

#[derive(Debug, Default)]
#[repr(align(32))]
struct Slot {
    head: AtomicU64,
    who: AtomicU64,
    answer: AtomicU64,
}

/// The shared table of handshakes in flight (see the module's header).
#[derive(Debug)]
pub struct Handshakes {
    slots: Box<[Slot]>,
    mask: u64,
    clock: fn() -> u64,
    /// A unit of time is `2^shift` ticks of `clock`...
    shift: u32,
    /// ...which tick this many times a microsecond.
    ticks_per_us: f64,
}

/// Nanoseconds of the system's monotonic clock since the first call.
fn monotonic_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    u64::try_from(EPOCH.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[inline(always)]
fn head(state: u64, tag: u64, at: u32) -> u64 {
    state << STATE_SHIFT | (tag & TAG_MASK) << 32 | u64::from(at)
}

#[inline(always)]
fn state_of(h: u64) -> u64 {
    h >> STATE_SHIFT
}

#[inline(always)]
fn tag_of(h: u64) -> u64 {
    h >> 32 & TAG_MASK
}

#[inline(always)]
#[allow(clippy::cast_possible_truncation)] // the low 32 bits
fn time_of(h: u64) -> u32 {
    h as u32
}

impl Handshakes {
    /// A table of `slots` slots (rounded up to a power of two, at least 64),
    /// 32 bytes each, timed by the system's monotonic clock.
    pub fn new(slots: usize) -> Handshakes {
        Handshakes::with_clock(slots, monotonic_ns, 1_000_000_000)
    }

    /// [`Handshakes::new`] timed by `clock`, which ticks `hz` times a second
    /// (the TSC and its rate in the appliance).
    pub fn with_clock(slots: usize, clock: fn() -> u64, hz: u64) -> Handshakes {
        let n = slots.clamp(64, 1 << 24).next_power_of_two();
        #[allow(clippy::cast_precision_loss)] // a rate
        let ticks_per_us = (hz.max(1_000_000) / 1_000_000) as f64;
        // The largest power of two of ticks within a microsecond.
        let shift = 63 - (hz.max(1_000_000) / 1_000_000).leading_zeros();
        Handshakes { slots: (0..n).map(|_| Slot::default()).collect(), mask: n as u64 - 1, clock, shift, ticks_per_us }
    }

    /// The time in the table's units, in 32 bits.
    #[inline]
    #[allow(clippy::cast_possible_truncation)] // wraps on purpose
    fn now(&self) -> u32 {
        ((self.clock)() >> self.shift) as u32
    }

    /// Units of `micros` microseconds (at least 1).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)] // bounded
    fn units(&self, micros: u32) -> u32 {
        (f64::from(micros) * self.ticks_per_us / f64::from(1u32 << self.shift)).clamp(1.0, f64::from(u32::MAX)) as u32
    }

    /// Microseconds of `units`.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // bounded
    fn micros(&self, units: u32) -> u32 {
        (f64::from(units) * f64::from(1u32 << self.shift) / self.ticks_per_us).min(f64::from(u32::MAX)) as u32
    }

    #[inline(always)]
    fn slot(&self, hash: u64) -> (&Slot, u64) {
        #[allow(clippy::cast_possible_truncation)] // masked to the table
        let s = &self.slots[(hash & self.mask) as usize];
        (s, (hash >> 34 & TAG_MASK).max(1))
    }

    /// Where the slot of the flow of forward hash `hash` lives (for a
    /// prefetch; not read).
    #[inline(always)]
    pub fn slot_addr(&self, hash: u64) -> *const u8 {
        #[allow(clippy::cast_possible_truncation)] // masked to the table
        self.slots.as_ptr().wrapping_add((hash & self.mask) as usize).cast()
    }

    /// A SYN of the flow of forward hash `hash` sent to `endpoint` (of
    /// incarnation `incarnation`) of service `service`. Returns false when
    /// it was not sampled (its slot holds another handshake).
    #[inline]
    pub fn syn(&self, hash: u64, service: u32, endpoint: EndpointId, incarnation: u32) -> bool {
        let (s, tag) = self.slot(hash);
        let h = s.head.load(Ordering::Acquire);
        match state_of(h) {
            FREE => {}
            SENT if tag_of(h) == tag => {
                // The client tries again: its first SYN went unanswered.
                self.answer_slot(s, h, Answer::Retransmitted);
                return true;
            }
            _ => return false,
        }
        let now = self.now();
        if s.head.compare_exchange(h, head(WRITING, tag, now), Ordering::Acquire, Ordering::Relaxed).is_err() {
            return false;
        }
        s.who.store(u64::from(service) << 32 | u64::from(endpoint) << 16 | u64::from(incarnation & 0xffff), Ordering::Relaxed);
        s.head.store(head(SENT, tag, now), Ordering::Release);
        true
    }

    /// An answer (`Answer::SynAck` or `Answer::Reset`) to the flow of
    /// forward hash `hash`. Nothing when no SYN of it is waiting.
    #[inline]
    pub fn answer(&self, hash: u64, answer: Answer) {
        let (s, tag) = self.slot(hash);
        let h = s.head.load(Ordering::Acquire);
        if state_of(h) == SENT && tag_of(h) == tag {
            self.answer_slot(s, h, answer);
        }
    }

    #[inline]
    fn answer_slot(&self, s: &Slot, h: u64, answer: Answer) {
        // Lost to another answer or to the sweep: theirs stands.
        if s.head.compare_exchange(h, head(WRITING, tag_of(h), time_of(h)), Ordering::Acquire, Ordering::Relaxed).is_err() {
            return;
        }
        s.answer.store(answer.code() << 32 | u64::from(self.now()), Ordering::Relaxed);
        s.head.store(head(ANSWERED, tag_of(h), time_of(h)), Ordering::Release);
    }

    /// Takes every answered handshake, and every one unanswered for more
    /// than `bound_us` microseconds, into `out` (the control side; one
    /// sweeper at a time). Returns how many slots were in use after it.
    pub fn sweep(&self, bound_us: u32, out: &mut Vec<Outcome>) -> usize {
        let now = self.now();
        // Ages are signed: a SYN written after `now` was read (the walk
        // takes time, cores' clocks differ a little) is younger than 0, not
        // 2^32 units old.
        let bound = if bound_us == u32::MAX { i32::MAX } else if bound_us == 0 { 0 } else { i32::try_from(self.units(bound_us)).unwrap_or(i32::MAX) };
        let mut held = 0;
        for s in self.slots.iter() {
            let h = s.head.load(Ordering::Acquire);
            match state_of(h) {
                ANSWERED => {
                    let (who, a) = (s.who.load(Ordering::Relaxed), s.answer.load(Ordering::Relaxed));
                    let answer = Answer::of_code(a >> 32);
                    #[allow(clippy::cast_possible_truncation)] // the low 32 bits
                    let micros = if answer == Answer::Retransmitted { 0 } else { self.micros((a as u32).wrapping_sub(time_of(h))) };
                    s.head.store(head(FREE, 0, 0), Ordering::Release);
                    out.push(outcome(who, answer, micros));
                }
                #[allow(clippy::cast_possible_wrap)] // a signed age, on purpose
                SENT if bound < i32::MAX && (now.wrapping_sub(time_of(h)) as i32) > bound => {
                    let who = s.who.load(Ordering::Relaxed);
                    if s.head.compare_exchange(h, head(FREE, 0, 0), Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                        out.push(outcome(who, Answer::Unanswered, 0));
                    } else {
                        held += 1;
                    }
                }
                FREE => {}
                _ => held += 1,
            }
        }
        held
    }
}

#[allow(clippy::cast_possible_truncation)] // fields packed by `Handshakes::syn`
fn outcome(who: u64, answer: Answer, micros: u32) -> Outcome {
    Outcome { service: (who >> 32) as u32, endpoint: (who >> 16) as u16, incarnation: who as u16, answer, micros }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn swept(t: &Handshakes, bound: u32) -> Vec<Outcome> {
        let mut out = Vec::new();
        t.sweep(bound, &mut out);
        out
    }

    #[test]
    fn a_syn_and_its_answer_meet_and_are_taken_once() {
        let t = Handshakes::new(64);
        assert!(t.syn(0xdead_beef_0000_0005, 7, 3, 0x1_0002));
        assert!(swept(&t, u32::MAX).is_empty(), "a SYN waiting within its bound stays");
        t.answer(0xdead_beef_0000_0005, Answer::SynAck);
        let out = swept(&t, u32::MAX);
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].service, out[0].endpoint, out[0].incarnation, out[0].answer), (7, 3, 2, Answer::SynAck));
        assert!(swept(&t, u32::MAX).is_empty(), "taken once");
        // The slot is free again.
        assert!(t.syn(0xdead_beef_0000_0005, 7, 3, 2));
    }

    #[test]
    fn another_flows_answer_or_a_busy_slot_changes_nothing() {
        let t = Handshakes::new(64);
        assert!(t.syn(0x0000_0000_0000_0001, 1, 1, 0));
        // Same slot (low bits), another flow (tag bits).
        t.answer(0xffff_ffff_0000_0001, Answer::Reset);
        assert!(!t.syn(0xffff_ffff_0000_0001, 2, 2, 0), "a slot in use is not taken");
        assert!(swept(&t, u32::MAX).is_empty());
        t.answer(0x0000_0000_0000_0001, Answer::Reset);
        let out = swept(&t, u32::MAX);
        assert_eq!((out[0].service, out[0].answer), (1, Answer::Reset));
        assert!(!out[0].answer.is_success());
    }

    #[test]
    fn an_unanswered_syn_is_taken_after_its_bound_and_a_second_syn_says_retransmitted() {
        let t = Handshakes::new(64);
        assert!(t.syn(9, 4, 1, 0));
        std::thread::sleep(std::time::Duration::from_millis(3));
        let out = swept(&t, 1000);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].answer, Answer::Unanswered);
        assert!(t.syn(9, 4, 1, 0));
        assert!(t.syn(9, 4, 1, 0), "the same flow's SYN again");
        let out = swept(&t, u32::MAX);
        assert_eq!(out[0].answer, Answer::Retransmitted);
    }

    static TICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    fn ticks() -> u64 {
        TICKS.load(Ordering::Relaxed)
    }

    #[test]
    fn a_syn_written_after_the_sweep_read_the_clock_is_young_not_ancient() {
        // A clock of 1 MHz: a unit is a microsecond.
        let t = Handshakes::with_clock(64, ticks, 1_000_000);
        TICKS.store(5_000, Ordering::Relaxed);
        assert!(t.syn(3, 1, 1, 0));
        // The sweep's clock reads a little earlier than the SYN's.
        TICKS.store(4_990, Ordering::Relaxed);
        assert!(swept(&t, 1000).is_empty(), "10 us in the future is not 2^32 us old");
        TICKS.store(5_000 + 1_001, Ordering::Relaxed);
        let out = swept(&t, 1000);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].answer, Answer::Unanswered);
        // Answered: the time between, in microseconds.
        assert!(t.syn(3, 1, 1, 0));
        TICKS.store(6_001 + 250, Ordering::Relaxed);
        t.answer(3, Answer::SynAck);
        assert_eq!(swept(&t, 1000)[0].micros, 250);
    }

    #[test]
    fn workers_on_two_threads_never_mix_up_handshakes() {
        // One thread sends SYNs (flow i to service i, endpoint i mod 2^16),
        // another answers the even flows behind it, while the control side
        // sweeps (unanswered after 1 ms): every outcome names the endpoint
        // its own SYN went to, and only even flows are answered.
        use std::sync::atomic::AtomicU32;
        let t = std::sync::Arc::new(Handshakes::new(1024));
        let sent = std::sync::Arc::new(AtomicU32::new(0));
        let n = 100_000u32;
        let h = |i: u32| crate::hash::hash_u64(u64::from(i), 1);
        let a = {
            let (t, sent) = (std::sync::Arc::clone(&t), std::sync::Arc::clone(&sent));
            std::thread::spawn(move || {
                for i in 0..n {
                    #[allow(clippy::cast_possible_truncation)]
                    t.syn(h(i), i, i as u16, i);
                    sent.store(i + 1, Ordering::Release);
                }
            })
        };
        let b = {
            let (t, sent) = (std::sync::Arc::clone(&t), std::sync::Arc::clone(&sent));
            std::thread::spawn(move || {
                let mut i = 0;
                while i < n {
                    if i < sent.load(Ordering::Acquire) {
                        t.answer(h(i), Answer::SynAck);
                        i += 2;
                    } else {
                        std::hint::spin_loop();
                    }
                }
            })
        };
        let mut out = Vec::new();
        while !(a.is_finished() && b.is_finished()) {
            t.sweep(1000, &mut out);
        }
        a.join().unwrap();
        b.join().unwrap();
        t.sweep(u32::MAX, &mut out);
        let answered = out.iter().filter(|o| o.answer == Answer::SynAck).count();
        assert!(answered > 100, "{answered} of {} outcomes answered", out.len());
        #[allow(clippy::cast_possible_truncation)]
        for o in &out {
            assert_eq!(o.endpoint, o.service as u16, "{o:?}");
            assert_eq!(o.incarnation, o.service as u16, "{o:?}");
            assert!(o.answer != Answer::SynAck || o.service % 2 == 0, "only even flows were answered: {o:?}");
        }
    }
}

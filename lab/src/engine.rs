//! The generator's loop: send what the pacing allows, receive what comes
//! back, until told to stop sending, then keep receiving for a drain time.
//!
//! Per frame: copy the template (from the plan's one arena) into a fresh
//! buffer, write the stamp's sequence number and timestamp, the datagram's
//! IP identification, and update the IP and transport checksums
//! incrementally. No allocation, no
//! lock, no logging: buffers come from [`GenIo::alloc`] in bursts, counters
//! are plain integers published to [`Control`] with relaxed stores once
//! per round.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice_dataplane::checksum::update16;
use crate::mix::{Plan, Slot, L4, ODD, STAMPED, UDP, V4_ID, V6_ID};
use crate::pace::{Pacer, Schedule};
use crate::rx::Receiver;
use crate::stamp;
use sluice_dataplane::io::{Burst, PacketBuf, PacketIo, BURST};

/// Packet I/O that can also hand out empty buffers to fill.
pub trait GenIo: PacketIo {
    /// Appends up to `n` empty buffers to `burst`; returns how many.
    fn alloc(&mut self, burst: &mut Burst<Self::Buf>, n: usize) -> usize;
    /// Sets the frame length of a buffer from [`GenIo::alloc`] (its bytes
    /// are then overwritten); false when it does not fit.
    fn set_len(&self, buf: &mut Self::Buf, len: usize) -> bool;
}

/// When frames are due.
#[derive(Clone, Debug)]
pub enum Timing {
    /// At a rate.
    Rate(Pacer),
    /// At recorded times (one frame per datagram).
    Recorded(Schedule),
}

/// What the sender did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxCounters {
    /// Frames the port accepted.
    pub sent: u64,
    /// Their bytes (without FCS).
    pub sent_bytes: u64,
    /// Frames the port refused (transmit queue full); freed, not sent.
    pub tx_full: u64,
    /// Frames not built for want of a buffer.
    pub alloc_failed: u64,
    /// Datagrams handed to the port (whole or in part).
    pub datagrams: u64,
}

/// The sending side.
#[derive(Debug)]
pub struct Generator {
    plan: Plan,
    /// The datagram to send next.
    next: usize,
    seq: Vec<u32>,
    timing: Timing,
    limit: Option<u64>,
    /// What was sent.
    pub counters: TxCounters,
}

impl Generator {
    /// Sends the datagrams of `plan` round robin, as `timing` allows,
    /// `limit` datagrams in all (none: until stopped). Flow ids of the
    /// datagrams must be below `flows`.
    pub fn new(plan: Plan, flows: u32, timing: Timing, limit: Option<u64>) -> Generator {
        Generator {
            plan,
            next: 0,
            seq: vec![0; usize::try_from(flows).unwrap_or(0)],
            timing,
            limit,
            counters: TxCounters::default(),
        }
    }

    /// The datagram limit is reached (or there is nothing to send).
    pub(crate) fn done(&self) -> bool {
        self.plan.starts.is_empty() || self.limit.is_some_and(|l| self.counters.datagrams >= l)
    }

    /// Frames skipped because the sender fell behind its rate.
    pub fn skipped(&self) -> u64 {
        match &self.timing {
            Timing::Rate(p) => p.skipped,
            Timing::Recorded(_) => 0,
        }
    }

    /// Frames and datagrams to build for `due` frames, at most `left`
    /// datagrams: whole datagrams, at least one, within a burst.
    #[inline]
    fn take(&self, due: usize, left: u64) -> (usize, usize) {
        let left = usize::try_from(left).unwrap_or(usize::MAX);
        if self.plan.single {
            let n = due.min(BURST).min(left);
            return (n, n);
        }
        let (mut frames, mut count, mut i) = (0usize, 0usize, self.next);
        while frames < due && count < left {
            let n = usize::from(self.plan.slots[self.plan.starts[i] as usize].frames);
            if frames + n > BURST {
                break;
            }
            frames += n;
            count += 1;
            i += 1;
            if i == self.plan.starts.len() {
                i = 0;
            }
        }
        (frames, count)
    }

    /// Builds and sends the frames due at `now` on output `out`.
    #[inline]
    pub(crate) fn send<I: GenIo>(&mut self, io: &mut I, out: usize, now: u64, burst: &mut Burst<I::Buf>) {
        let due = match &mut self.timing {
            Timing::Rate(p) => p.due(now),
            Timing::Recorded(s) => s.due(now),
        };
        if due == 0 || self.done() {
            return;
        }
        let (frames, count) = self.take(due, self.limit.map_or(u64::MAX, |l| l - self.counters.datagrams));
        if frames == 0 {
            return;
        }
        let got = io.alloc(burst, frames);
        if got < frames {
            self.counters.alloc_failed += (frames - got) as u64;
        }
        let mut lens = [0u16; BURST];
        let (at, built) = if self.plan.single {
            let n = self.build_single(io, now, burst, count.min(got), &mut lens);
            (n, n)
        } else {
            self.build(io, now, burst, count, got, &mut lens)
        };
        // Buffers past the last whole datagram (allocation fell short, or
        // a frame did not fit): freed unsent.
        if burst.len() > at {
            self.counters.alloc_failed += (burst.len() - at) as u64;
            burst.truncate(at);
        }
        let sent = io.tx(out, burst);
        self.counters.sent += sent as u64;
        self.counters.tx_full += (at - sent) as u64;
        self.counters.sent_bytes += lens[..sent].iter().map(|&l| u64::from(l)).sum::<u64>();
        self.counters.datagrams += built as u64;
        if let Timing::Rate(p) = &mut self.timing {
            p.issued(frames);
        }
    }

    /// Fills the first `got` buffers of `burst` with up to `count` whole
    /// datagrams from the next one on, their lengths in `lens`; returns
    /// the frames and the datagrams built.
    #[inline(always)]
    fn build<I: GenIo>(
        &mut self,
        io: &I,
        now: u64,
        burst: &mut Burst<I::Buf>,
        count: usize,
        got: usize,
        lens: &mut [u16; BURST],
    ) -> (usize, usize) {
        let Generator { plan, next, seq, .. } = self;
        let tsc = stamp::tsc_words(now);
        let (mut at, mut built) = (0usize, 0usize);
        'datagrams: while built < count {
            let first = plan.starts[*next] as usize;
            let head = plan.slots[first];
            let n = usize::from(head.frames);
            if at + n > got {
                break;
            }
            let flow = usize::try_from(head.flow).unwrap_or(usize::MAX);
            let seq0 = seq.get(flow).copied().unwrap_or(0);
            let mut l4_added = 0u64;
            for (k, s) in plan.slots[first..first + n].iter().enumerate() {
                let buf = &mut burst[at + k];
                if !io.set_len(buf, usize::from(s.len)) {
                    // Templates are checked against the buffer size before
                    // the start; a frame that still does not fit is not
                    // sent (nor the rest of its datagram).
                    break 'datagrams;
                }
                lens[at + k] = s.len;
                let b = buf.data_mut();
                copy_frame(b, plan.frame(s));
                if s.flags & STAMPED != 0 {
                    let seq = seq0.wrapping_add(u32::try_from(k).unwrap_or(0));
                    stamp::write_varying(&mut b[usize::from(s.stamp)..], seq, now);
                    l4_added += stamp::varying_sum(seq, tsc, s.flags & ODD != 0);
                }
                if s.flags & V4_ID != 0 {
                    // Sequence numbers of a flow's datagrams identify them (mod 2^16).
                    #[allow(clippy::cast_possible_truncation)]
                    let v = seq0 as u16;
                    let (id, check) = (usize::from(s.id), usize::from(s.id_check));
                    b[id..id + 2].copy_from_slice(&v.to_be_bytes());
                    let c = update16(u16::from_be_bytes([b[check], b[check + 1]]), 0, v);
                    b[check..check + 2].copy_from_slice(&c.to_be_bytes());
                } else if s.flags & V6_ID != 0 {
                    let id = usize::from(s.id);
                    b[id..id + 4].copy_from_slice(&seq0.to_be_bytes());
                }
            }
            if let Some(s) = seq.get_mut(flow) {
                *s = s.wrapping_add(u32::try_from(n).unwrap_or(1));
            }
            if head.flags & L4 != 0 {
                write_l4_check(burst[at].data_mut(), &head, l4_added);
            }
            at += n;
            built += 1;
            *next += 1;
            if *next == plan.starts.len() {
                *next = 0;
            }
        }
        (at, built)
    }

    /// [`Generator::build`] where every datagram is one frame (no
    /// fragments, so no identification to write): fills the first `count`
    /// buffers of `burst` (fewer if one does not take its frame); returns
    /// how many.
    #[inline(always)]
    fn build_single<I: GenIo>(
        &mut self,
        io: &I,
        now: u64,
        burst: &mut Burst<I::Buf>,
        count: usize,
        lens: &mut [u16; BURST],
    ) -> usize {
        let Generator { plan, next, seq, .. } = self;
        let tsc = stamp::tsc_words(now);
        let mut i = *next;
        let mut built = 0;
        for (buf, len) in burst.iter_mut().zip(lens.iter_mut()).take(count) {
            let s = &plan.slots[i];
            if !io.set_len(buf, usize::from(s.len)) {
                break;
            }
            *len = s.len;
            let b = buf.data_mut();
            copy_frame(b, plan.frame(s));
            let flow = usize::try_from(s.flow).unwrap_or(usize::MAX);
            let q = match seq.get_mut(flow) {
                Some(q) => {
                    let v = *q;
                    *q = v.wrapping_add(1);
                    v
                }
                None => 0,
            };
            if s.flags & STAMPED != 0 {
                stamp::write_varying(&mut b[usize::from(s.stamp)..], q, now);
                if s.flags & L4 != 0 {
                    write_l4_check(b, s, stamp::varying_sum(q, tsc, s.flags & ODD != 0));
                }
            }
            built += 1;
            i += 1;
            if i == plan.slots.len() {
                i = 0;
            }
        }
        *next = i;
        built
    }
}

/// Writes the transport checksum of the datagram `head` starts into its
/// first frame `b`: the template's, with `added` (what its stamps add)
/// joined; UDP sends a zero result as 0xffff.
#[inline(always)]
fn write_l4_check(b: &mut [u8], head: &Slot, added: u64) {
    let c = usize::from(head.l4);
    let mut new = stamp::add_to_checksum(head.l4_inverted, added);
    if head.flags & UDP != 0 && new == 0 {
        new = 0xffff;
    }
    b[c..c + 2].copy_from_slice(&new.to_be_bytes());
}

/// Copies a template into a buffer of its length. Frames of 32 to 128
/// bytes (the small frames a generator's rate depends on) are copied as two
/// fixed-size moves, the second overlapping the first, inline: a copy of a
/// length known only at run time is a call to `memcpy`, which costs more
/// than the copy of a small frame.
#[inline(always)]
fn copy_frame(dst: &mut [u8], src: &[u8]) {
    if dst.len() == src.len() && (32..=64).contains(&src.len()) {
        copy_ends::<32>(dst, src);
    } else if dst.len() == src.len() && (64..=128).contains(&src.len()) {
        copy_ends::<64>(dst, src);
    } else {
        dst.copy_from_slice(src);
    }
}

/// Copies the first and the last `W` bytes of `src` (of the same length as
/// `dst`, `W` to `2 * W` bytes), each as one fixed-size move.
#[inline(always)]
fn copy_ends<const W: usize>(dst: &mut [u8], src: &[u8]) {
    if let (Some(d), Some(s)) = (dst.first_chunk_mut::<W>(), src.first_chunk::<W>()) {
        *d = *s;
    }
    if let (Some(d), Some(s)) = (dst.last_chunk_mut::<W>(), src.last_chunk::<W>()) {
        *d = *s;
    }
}

/// Shared with the thread that watches: stop flags and running totals.
#[derive(Debug, Default)]
pub struct Control {
    /// Stop sending (then drain).
    pub stop_tx: AtomicBool,
    /// Stop at once.
    pub(crate) stop: AtomicBool,
    /// Sending has ended (limit reached or told to stop).
    pub tx_done: AtomicBool,
    /// The loop has returned.
    pub finished: AtomicBool,
    /// Frames sent so far.
    pub sent: AtomicU64,
    /// Stamped frames received so far.
    pub received: AtomicU64,
    /// Frames refused by the port so far.
    pub tx_full: AtomicU64,
}

/// Where the loop sends and receives, and how long it drains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lanes {
    /// The output frames are sent on.
    pub out: usize,
    /// Inputs `0..inputs` are received from.
    pub inputs: usize,
    /// Clock ticks to keep receiving after sending ends.
    pub drain: u64,
}

/// Runs the generator: sends on `lanes.out`, receives on every input,
/// until sending ends and the drain time passed (or [`Control::stop`]).
/// `clock` reads the same clock the stamps carry.
pub fn run<I: GenIo, C: FnMut() -> u64>(
    io: &mut I,
    lanes: Lanes,
    gen: &mut Generator,
    rx: &mut Receiver,
    ctl: &Control,
    mut clock: C,
) {
    let Lanes { out, inputs, drain } = lanes;
    let mut burst: Burst<I::Buf> = Burst::new();
    let mut tx_end: Option<u64> = None;
    loop {
        let now = clock();
        match tx_end {
            None if ctl.stop_tx.load(Ordering::Relaxed) || gen.done() => {
                tx_end = Some(now);
                ctl.tx_done.store(true, Ordering::Relaxed);
            }
            None => gen.send(io, out, now, &mut burst),
            Some(t) if now.saturating_sub(t) >= drain => break,
            Some(_) => {}
        }
        if ctl.stop.load(Ordering::Relaxed) {
            break;
        }
        for input in 0..inputs {
            if io.rx(input, &mut burst) == 0 {
                continue;
            }
            let at = clock();
            for b in burst.iter() {
                rx.on_frame(b.data(), at);
            }
            io.free(&mut burst);
        }
        ctl.sent.store(gen.counters.sent, Ordering::Relaxed);
        ctl.received.store(rx.received, Ordering::Relaxed);
        ctl.tx_full.store(gen.counters.tx_full, Ordering::Relaxed);
    }
    ctl.tx_done.store(true, Ordering::Relaxed);
    ctl.sent.store(gen.counters.sent, Ordering::Relaxed);
    ctl.received.store(rx.received, Ordering::Relaxed);
    ctl.finished.store(true, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::copy_frame;

    /// Every length copies exactly, on either side of the fixed-size moves.
    #[test]
    fn frames_of_every_length_are_copied_exactly() {
        let src: Vec<u8> = (0..300u32).map(|i| u8::try_from((i * 7 + 3) % 256).unwrap_or(0)).collect();
        for n in 0..=300 {
            let mut dst = vec![0xaa_u8; n];
            copy_frame(&mut dst, &src[..n]);
            assert_eq!(dst, &src[..n], "{n} bytes");
        }
    }
}

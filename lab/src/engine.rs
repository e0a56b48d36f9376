//! The generator's loop: send what the pacing allows, receive what comes
//! back, until told to stop sending, then keep receiving for a drain time.
//!
//! Per frame: copy the template into a fresh buffer, write the stamp's
//! sequence number and timestamp, the datagram's IP identification, and
//! update the IP and transport checksums incrementally. No allocation, no
//! lock, no logging: buffers come from [`GenIo::alloc`] in bursts, counters
//! are plain integers published to [`Control`] with relaxed stores once
//! per round.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice_dataplane::checksum::update16;
use crate::mix::{Datagram, IpId};
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
    datagrams: Vec<Datagram>,
    next: usize,
    seq: Vec<u32>,
    timing: Timing,
    limit: Option<u64>,
    /// What was sent.
    pub counters: TxCounters,
}

impl Generator {
    /// Sends `datagrams` round robin, as `timing` allows, `limit`
    /// datagrams in all (none: until stopped). Flow ids of the datagrams
    /// must be below `flows`.
    pub fn new(datagrams: Vec<Datagram>, flows: u32, timing: Timing, limit: Option<u64>) -> Generator {
        Generator {
            datagrams,
            next: 0,
            seq: vec![0; usize::try_from(flows).unwrap_or(0)],
            timing,
            limit,
            counters: TxCounters::default(),
        }
    }

    /// The datagram limit is reached (or there is nothing to send).
    pub(crate) fn done(&self) -> bool {
        self.datagrams.is_empty() || self.limit.is_some_and(|l| self.counters.datagrams >= l)
    }

    /// Frames skipped because the sender fell behind its rate.
    pub fn skipped(&self) -> u64 {
        match &self.timing {
            Timing::Rate(p) => p.skipped,
            Timing::Recorded(_) => 0,
        }
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
        // Whole datagrams, at least one, within a burst.
        let (mut frames, mut count, mut i) = (0usize, 0usize, self.next);
        let left = self.limit.map_or(u64::MAX, |l| l - self.counters.datagrams);
        while frames < due && (count as u64) < left {
            let n = self.datagrams[i].frames.len();
            if frames + n > BURST {
                break;
            }
            frames += n;
            count += 1;
            i += 1;
            if i == self.datagrams.len() {
                i = 0;
            }
        }
        if frames == 0 {
            return;
        }
        let got = io.alloc(burst, frames);
        if got < frames {
            self.counters.alloc_failed += (frames - got) as u64;
        }
        let mut at = 0;
        let mut built = 0;
        let mut lens = [0u16; BURST];
        'datagrams: while built < count {
            let d = &self.datagrams[self.next];
            let n = d.frames.len();
            if at + n > got {
                break;
            }
            let flow = usize::try_from(d.flow).unwrap_or(usize::MAX);
            let seq0 = self.seq.get(flow).copied().unwrap_or(0);
            let mut l4_added = 0u64;
            for (k, t) in d.frames.iter().enumerate() {
                let buf = &mut burst[at + k];
                if !io.set_len(buf, t.bytes.len()) {
                    // Templates are checked against the buffer size before
                    // the start; a frame that still does not fit is not
                    // sent (nor the rest of its datagram).
                    break 'datagrams;
                }
                lens[at + k] = u16::try_from(t.bytes.len()).unwrap_or(u16::MAX);
                let b = buf.data_mut();
                b.copy_from_slice(&t.bytes);
                let seq = seq0.wrapping_add(u32::try_from(k).unwrap_or(0));
                if let Some(s) = t.stamp {
                    stamp::write_varying(&mut b[s..], seq, now);
                    l4_added += stamp::varying_sum(seq, now, t.stamp_odd);
                }
                match t.ip_id {
                    Some(IpId::V4 { id, check }) => {
                        // Sequence numbers of a flow's datagrams identify them (mod 2^16).
                        #[allow(clippy::cast_possible_truncation)]
                        let v = seq0 as u16;
                        b[id..id + 2].copy_from_slice(&v.to_be_bytes());
                        let c = update16(u16::from_be_bytes([b[check], b[check + 1]]), 0, v);
                        b[check..check + 2].copy_from_slice(&c.to_be_bytes());
                    }
                    Some(IpId::V6(id)) => b[id..id + 4].copy_from_slice(&seq0.to_be_bytes()),
                    None => {}
                }
            }
            if let Some(s) = self.seq.get_mut(flow) {
                *s = s.wrapping_add(u32::try_from(n).unwrap_or(1));
            }
            if let Some(c) = d.l4_check {
                let b = burst[at].data_mut();
                let old = u16::from_be_bytes([b[c.offset], b[c.offset + 1]]);
                let mut new = stamp::add_to_checksum(old, l4_added);
                if c.udp && new == 0 {
                    new = 0xffff;
                }
                b[c.offset..c.offset + 2].copy_from_slice(&new.to_be_bytes());
            }
            at += n;
            built += 1;
            self.next += 1;
            if self.next == self.datagrams.len() {
                self.next = 0;
            }
        }
        // Buffers past the last whole datagram (allocation fell short, or
        // a frame did not fit): freed unsent.
        if burst.len() > at {
            self.counters.alloc_failed += (burst.len() - at) as u64;
            while burst.len() > at {
                drop(burst.pop());
            }
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

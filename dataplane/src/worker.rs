//! The worker loop: bursts of packets in from each input, a verdict for
//! each, bursts out to each output; drops freed in bulk and counted.
//!
//! Each poll round reads the snapshot once (the RCU quiescent point) and
//! allocates nothing. Outputs 0..P are the ports of the snapshot, in order;
//! more outputs (exception paths to the kernel) may follow.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::counters::WorkerCounters;
use crate::flow::FragKey;
use crate::io::{Burst, PacketBuf, PacketIo};
use crate::pipeline::{FragEvent, Pipeline, PipelineConfig};
use crate::rcu::Reader;
use crate::snapshot::Snapshot;
use crate::verdict::{DropReason, Verdict};

/// What a worker does with an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// A port's receive queue: every packet goes through the pipeline.
    Port {
        /// Port index in the snapshot.
        port: u8,
        /// Output index of this port's exception path, if any.
        exception: Option<usize>,
    },
    /// Packets the kernel sends (exception path back): out unchanged.
    Passthrough {
        /// Output index.
        output: usize,
    },
}

/// How a worker is set up.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Its number (seeds the random algorithm).
    pub id: u32,
    /// Inputs, by index of the I/O backend.
    pub inputs: Vec<Input>,
    /// Number of outputs of the I/O backend.
    pub outputs: usize,
    /// Table sizes.
    pub pipeline: PipelineConfig,
    /// Later fragments held while their first fragment is missing.
    pub stash_capacity: usize,
    /// How long a held fragment waits, in milliseconds.
    pub stash_ttl_ms: u64,
}

struct Held<P> {
    key: FragKey,
    port: u8,
    exception: Option<usize>,
    since: u64,
    pkt: P,
}

/// One poll-mode worker.
pub struct Worker<IO: PacketIo> {
    io: IO,
    reader: Reader<Snapshot>,
    pipeline: Pipeline,
    counters: Arc<WorkerCounters>,
    inputs: Vec<Input>,
    rx: Burst<IO::Buf>,
    tx: Vec<Burst<IO::Buf>>,
    free: Burst<IO::Buf>,
    stash: Vec<Held<IO::Buf>>,
    stash_capacity: usize,
    stash_ttl_ms: u64,
}

impl<IO: PacketIo> std::fmt::Debug for Worker<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker").field("inputs", &self.inputs).field("stash", &self.stash.len()).finish()
    }
}

/// Where packets go, and the counters and burst buffers they need; split
/// from the worker so the snapshot can be borrowed alongside.
struct Out<'a, P> {
    tx: &'a mut [Burst<P>],
    free: &'a mut Burst<P>,
    ctr: &'a WorkerCounters,
}

impl<P: PacketBuf> Out<'_, P> {
    #[inline(always)]
    fn send<IO: PacketIo<Buf = P>>(&mut self, io: &mut IO, output: usize, pkt: P) {
        let Some(b) = self.tx.get_mut(output) else {
            self.discard(io, DropReason::NoSuchOutput, pkt);
            return;
        };
        b.push(pkt);
        if b.is_full() {
            flush(io, output, b, self.ctr);
        }
    }

    #[inline(always)]
    fn discard<IO: PacketIo<Buf = P>>(&mut self, io: &mut IO, r: DropReason, pkt: P) {
        self.ctr.count_drop(r);
        self.free.push(pkt);
        if self.free.is_full() {
            io.free(self.free);
        }
    }
}

#[inline]
fn flush<IO: PacketIo>(io: &mut IO, output: usize, b: &mut Burst<IO::Buf>, ctr: &WorkerCounters) {
    let n = b.len();
    if n == 0 {
        return;
    }
    let sent = io.tx(output, b);
    ctr.tx_packets.add(sent as u64);
    if sent < n {
        ctr.drops[DropReason::TxQueueFull.index()].add((n - sent) as u64);
    }
}

impl<IO: PacketIo> Worker<IO> {
    /// A worker over `io`, reading snapshots through `reader`.
    pub fn new(io: IO, reader: Reader<Snapshot>, counters: Arc<WorkerCounters>, cfg: &WorkerConfig) -> Worker<IO> {
        Worker {
            io,
            reader,
            pipeline: Pipeline::new(&cfg.pipeline, u64::from(cfg.id).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed),
            counters,
            inputs: cfg.inputs.clone(),
            rx: Burst::new(),
            tx: (0..cfg.outputs).map(|_| Burst::new()).collect(),
            free: Burst::new(),
            stash: Vec::with_capacity(cfg.stash_capacity),
            stash_capacity: cfg.stash_capacity,
            stash_ttl_ms: cfg.stash_ttl_ms,
        }
    }

    /// Its counters.
    pub fn counters(&self) -> &Arc<WorkerCounters> {
        &self.counters
    }

    /// The I/O backend.
    pub fn io_mut(&mut self) -> &mut IO {
        &mut self.io
    }

    /// Fragments held right now.
    pub fn held(&self) -> usize {
        self.stash.len()
    }

    /// One round: a burst from every input, processed and sent. Returns the
    /// number of packets received. `now_ms` is a monotonic clock.
    pub fn poll(&mut self, now_ms: u64) -> usize {
        let Worker { io, reader, pipeline, counters, inputs, rx, tx, free, stash, stash_capacity, stash_ttl_ms } = self;
        let ctr: &WorkerCounters = counters;
        let snap = reader.read();
        ctr.generation.set(snap.generation);
        let mut out = Out { tx, free, ctr };
        let mut total = 0usize;
        for (i, input) in inputs.iter().enumerate() {
            if io.rx(i, rx) == 0 {
                continue;
            }
            total += rx.len();
            ctr.rx_packets.add(rx.len() as u64);
            ctr.rx_bytes.add(rx.iter().map(|p| p.data().len() as u64).sum());
            match *input {
                Input::Passthrough { output } => {
                    ctr.from_kernel.add(rx.len() as u64);
                    for pkt in rx.drain(..) {
                        out.send(io, output, pkt);
                    }
                }
                Input::Port { port, exception } => {
                    for mut pkt in rx.drain(..) {
                        let v = pipeline.process(snap, port, &mut pkt, now_ms, ctr);
                        route(io, &mut out, pipeline, stash, *stash_capacity, v, port, exception, now_ms, pkt);
                        if let FragEvent::Pinned(key) = pipeline.frag_event() {
                            release(io, &mut out, pipeline, snap, stash, key, now_ms);
                        }
                    }
                }
            }
        }
        if !stash.is_empty() {
            let ttl = *stash_ttl_ms;
            let mut k = 0;
            while k < stash.len() {
                if now_ms.saturating_sub(stash[k].since) > ttl {
                    let h = stash.swap_remove(k);
                    out.discard(io, DropReason::FragmentTimeout, h.pkt);
                } else {
                    k += 1;
                }
            }
        }
        for (o, b) in out.tx.iter_mut().enumerate() {
            flush(io, o, b, ctr);
        }
        io.free(out.free);
        if total == 0 {
            ctr.idle_polls.add(1);
        } else {
            ctr.busy_polls.add(1);
        }
        total
    }

    /// Polls until `stop` is set; `clock` gives milliseconds. Held fragments
    /// are dropped (and counted) at the end.
    pub fn run(&mut self, stop: &AtomicBool, clock: impl Fn() -> u64) {
        while !stop.load(Ordering::Relaxed) {
            self.poll(clock());
        }
        self.shutdown();
    }

    /// Drops what is held and goes offline for snapshot reclamation.
    pub fn shutdown(&mut self) {
        for h in self.stash.drain(..) {
            self.counters.count_drop(DropReason::FragmentTimeout);
            self.free.push(h.pkt);
            if self.free.is_full() {
                self.io.free(&mut self.free);
            }
        }
        self.io.free(&mut self.free);
        self.reader.offline();
    }
}

/// Sends a processed packet where its verdict says.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn route<IO: PacketIo>(
    io: &mut IO,
    out: &mut Out<'_, IO::Buf>,
    pipeline: &Pipeline,
    stash: &mut Vec<Held<IO::Buf>>,
    capacity: usize,
    v: Verdict,
    port: u8,
    exception: Option<usize>,
    now_ms: u64,
    pkt: IO::Buf,
) {
    match v {
        Verdict::Forward(o) => out.send(io, usize::from(o), pkt),
        Verdict::Exception => match exception {
            Some(o) => {
                out.ctr.exception.add(1);
                out.send(io, o, pkt);
            }
            None => out.discard(io, DropReason::NoExceptionPath, pkt),
        },
        Verdict::Stash => match pipeline.frag_event() {
            FragEvent::Held(key) if stash.len() < capacity => {
                out.ctr.stashed.add(1);
                stash.push(Held { key, port, exception, since: now_ms, pkt });
            }
            _ => out.discard(io, DropReason::FragmentStashFull, pkt),
        },
        Verdict::Drop(r) => out.discard(io, r, pkt),
    }
}

/// Processes again the held fragments of the datagram `key`, whose first
/// fragment just went through.
fn release<IO: PacketIo>(
    io: &mut IO,
    out: &mut Out<'_, IO::Buf>,
    pipeline: &mut Pipeline,
    snap: &Snapshot,
    stash: &mut Vec<Held<IO::Buf>>,
    key: FragKey,
    now_ms: u64,
) {
    let mut k = 0;
    while k < stash.len() {
        if stash[k].key != key {
            k += 1;
            continue;
        }
        let Held { port, exception, mut pkt, .. } = stash.swap_remove(k);
        let v = pipeline.process(snap, port, &mut pkt, now_ms, out.ctr);
        // The datagram is pinned now: a held fragment cannot be held again.
        let v = if v == Verdict::Stash { Verdict::Drop(DropReason::FragmentStashFull) } else { v };
        route(io, out, pipeline, stash, 0, v, port, exception, now_ms, pkt);
    }
}

//! The worker loop: bursts of packets in from each input, a verdict for
//! each, bursts out to each output; drops freed in bulk and counted.
//!
//! Each poll round reads the snapshot once (the RCU quiescent point) and
//! allocates nothing. Outputs 0..P are the ports of the snapshot, in order;
//! more outputs (exception paths to the kernel) may follow. With several
//! workers, packets whose flow another worker owns go to it through
//! [`Steering`] queues, drained by their owner every round.
//!
//! Every packet is counted once, in a way [`crate::counters::Ledger`]
//! checks: taken in (received or steered in), then sent (by category),
//! dropped under a reason, held, or steered out.
//!
//! A forwarded IPv4 packet larger than its port's MTU (the pipeline lets
//! through only those without DF) leaves as fragments ([`crate::fragment`]),
//! made in buffers the I/O backend gives; without them it is dropped as
//! `fragment_no_buffer`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::counters::{Ledger, WorkerCounters};
use crate::flow::FragKey;
use crate::io::{Burst, PacketBuf, PacketIo, Waited, BURST};
use crate::latency::{Recorder, SharedLatency};
use crate::pipeline::{FragEvent, Pipeline, PipelineConfig};
use crate::fragment;
use crate::rewrite::{add_vlan_tag, l2_len};
use crate::rcu::Reader;
use crate::snapshot::{PortInfo, Snapshot};
use crate::steer::{Steered, Steering};
use crate::sync::{SyncRing, SyncedPins};
use crate::verdict::{DropReason, Verdict};

/// How a worker waits when its inputs are empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdlePolicy {
    /// Empty rounds polled back to back before the first pause: a short gap
    /// in the traffic costs no sleep.
    pub spin_rounds: u32,
    /// The longest pause, in microseconds; 0 polls without ever pausing
    /// (dedicated cores).
    pub max_pause_us: u32,
    /// Spend pauses waiting on the inputs' receive interrupts where every
    /// input has them (and the pause is long enough for the backend): the
    /// first packet ends the pause.
    pub rx_interrupts: bool,
}

impl IdlePolicy {
    /// Never pause.
    pub const BUSY_POLL: IdlePolicy = IdlePolicy { spin_rounds: 0, max_pause_us: 0, rx_interrupts: false };
    /// First pause of a run of empty rounds, in microseconds; each further
    /// empty round doubles it up to the maximum.
    pub const FIRST_PAUSE_US: u32 = 1;
}

/// Bounded exponential back-off over empty poll rounds: none while rounds
/// take packets in, then pauses of 1, 2, 4 ... microseconds up to the
/// policy's maximum; one round with packets starts over.
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: IdlePolicy,
    empty: u32,
    next_us: u32,
}

impl Backoff {
    /// Back-off with no empty round seen.
    pub fn new(policy: IdlePolicy) -> Backoff {
        Backoff { policy, empty: 0, next_us: IdlePolicy::FIRST_PAUSE_US }
    }

    /// Starts over, as after a round that took packets in.
    pub fn reset(&mut self) {
        self.empty = 0;
        self.next_us = IdlePolicy::FIRST_PAUSE_US;
    }

    /// After a round that took `n` packets in: how long to pause, in
    /// microseconds (0: poll again at once).
    #[inline]
    pub fn after(&mut self, n: usize) -> u32 {
        if n > 0 || self.policy.max_pause_us == 0 {
            self.reset();
            return 0;
        }
        if self.empty < self.policy.spin_rounds {
            self.empty += 1;
            return 0;
        }
        let us = self.next_us.min(self.policy.max_pause_us);
        self.next_us = us.saturating_mul(2);
        us
    }
}

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
    /// Packets the kernel sends (exception path back): out unchanged, but
    /// for the VLAN tag of a port that serves one.
    Passthrough {
        /// Output index: port `output` of the snapshot.
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
    /// The queues between workers and this worker's index, when steering.
    steering: Option<(Arc<Steering<IO::Buf>>, usize)>,
    /// Whether bursts go through the look-ahead stages, decided for the
    /// snapshot of this generation.
    staged: (u64, bool),
    /// Least table memory of a snapshot that turns the stages on.
    staged_min_heap: usize,
    /// Each packet's time through the worker, when recorded.
    latency: Option<Recorder>,
}

/// Snapshots whose tables take at least this much memory (with the
/// worker's flow table, when a service keeps flow state) get the
/// look-ahead stages ([`Pipeline::prefetch_burst`]): smaller ones stay in
/// the cache, where the stages would only repeat work.
pub const STAGED_MIN_HEAP_BYTES: usize = 256 << 10;

impl<IO: PacketIo> std::fmt::Debug for Worker<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("inputs", &self.inputs)
            .field("stash", &self.stash.len())
            .field("steering", &self.steering.as_ref().map(|(_, i)| *i))
            .finish()
    }
}

/// How a packet came to be processed.
#[derive(Clone, Copy)]
enum Arrival {
    /// From a port.
    Port,
    /// From a port, packet `n` of a burst that went through the look-ahead
    /// stages.
    Staged(usize),
    /// Handed over by another worker (or held back by this one).
    Steered,
    /// Handed over by another worker, packet `n` of a burst of them that
    /// went through the look-ahead stages.
    StagedSteered(usize),
}

/// Where packets go, and the counters, burst buffers and hold-back area
/// they need; split from the worker so the snapshot can be borrowed alongside.
struct Out<'a, P> {
    /// The snapshot's ports: outputs `0..ports.len()`.
    ports: &'a [PortInfo],
    tx: &'a mut [Burst<P>],
    free: &'a mut Burst<P>,
    ctr: &'a WorkerCounters,
    stash: &'a mut Vec<Held<P>>,
    steering: Option<&'a Steering<P>>,
    now_ms: u64,
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

    /// Sends a processed packet where its verdict says; a later fragment is
    /// held when fewer than `capacity` are.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn route<IO: PacketIo<Buf = P>>(
        &mut self,
        io: &mut IO,
        pipeline: &Pipeline,
        capacity: usize,
        v: Verdict,
        port: u8,
        exception: Option<usize>,
        pkt: P,
    ) {
        match v {
            Verdict::Forward(o) => {
                let o = usize::from(o);
                match self.ports.get(o) {
                    Some(port) if pkt.data().len() > l2_len(port.vlan) + usize::from(port.mtu) => {
                        self.send_fragments(io, o, port.mtu, pkt);
                    }
                    _ => self.send(io, o, pkt),
                }
            }
            Verdict::Exception => match exception {
                Some(o) => {
                    self.ctr.exception.add(1);
                    self.send(io, o, pkt);
                }
                None => self.discard(io, DropReason::NoExceptionPath, pkt),
            },
            Verdict::Stash => match pipeline.frag_event() {
                FragEvent::Held(key) if self.stash.len() < capacity => {
                    self.ctr.stashed.add(1);
                    self.stash.push(Held { key, port, exception, since: self.now_ms, pkt });
                }
                _ => self.discard(io, DropReason::FragmentStashFull, pkt),
            },
            Verdict::Steer(w) => {
                let Some(st) = self.steering else {
                    self.discard(io, DropReason::SteerQueueFull, pkt);
                    return;
                };
                match st.push(usize::from(w), Steered { pkt, port, exception }) {
                    Ok(()) => self.ctr.steered_out.add(1),
                    Err(back) => self.discard(io, DropReason::SteerQueueFull, back.pkt),
                }
            }
            Verdict::Drop(r) => self.discard(io, r, pkt),
        }
    }

    /// Sends `pkt`, too big for `output` of IP MTU `mtu`, as fragments.
    /// All its fragments or none: it is dropped when the buffers for them
    /// cannot all be had.
    #[cold]
    fn send_fragments<IO: PacketIo<Buf = P>>(&mut self, io: &mut IO, output: usize, mtu: u16, mut pkt: P) {
        let plan = match fragment::plan(pkt.data(), mtu) {
            Ok(Some(p)) => p,
            // What the pipeline does not hand over for fragmenting (DF,
            // IPv6: those get an ICMP error instead) goes as it is, and the
            // output refuses it.
            Ok(None) | Err(_) => return self.send(io, output, pkt),
        };
        let later = fragment::later_header(&pkt.data()[plan.l3..plan.l3 + plan.header]);
        let mut frags: Burst<P> = Burst::new();
        let n = plan.count - 1;
        if n > BURST || io.alloc_frames(&mut frags, n, plan.frame_len(1, later.1)) < n {
            io.free(&mut frags);
            self.discard(io, DropReason::FragmentNoBuffer, pkt);
            return;
        }
        for (i, f) in frags.iter_mut().enumerate() {
            let len = plan.frame_len(i + 1, later.1);
            f.truncate(len);
            fragment::write(pkt.data(), &plan, &later, i + 1, f.data_mut());
        }
        fragment::first_in_place(pkt.data_mut(), &plan);
        pkt.truncate(plan.frame_len(0, later.1));
        self.ctr.fragmented.add(1);
        self.ctr.fragments.add(plan.count as u64);
        self.send(io, output, pkt);
        for f in frags.drain(..) {
            self.send(io, output, f);
        }
    }

    /// Processes again the held fragments of the datagram `key`, whose
    /// first fragment just went through.
    fn release<IO: PacketIo<Buf = P>>(&mut self, io: &mut IO, pipeline: &mut Pipeline, snap: &Snapshot, key: FragKey) {
        let mut k = 0;
        while k < self.stash.len() {
            if self.stash[k].key != key {
                k += 1;
                continue;
            }
            let Held { port, exception, mut pkt, .. } = self.stash.swap_remove(k);
            let v = pipeline.process_steered(snap, port, &mut pkt, self.now_ms, self.ctr);
            // The datagram is pinned now: a held fragment cannot be held again.
            let v = if v == Verdict::Stash { Verdict::Drop(DropReason::FragmentStashFull) } else { v };
            self.route(io, pipeline, 0, v, port, exception, pkt);
        }
    }

    /// Processes a packet from a port (`steered`: handed over by another
    /// worker) and sends it on.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn process<IO: PacketIo<Buf = P>>(
        &mut self,
        io: &mut IO,
        pipeline: &mut Pipeline,
        snap: &Snapshot,
        capacity: usize,
        port: u8,
        exception: Option<usize>,
        mut pkt: P,
        from: Arrival,
    ) {
        let v = match from {
            Arrival::Port => pipeline.process(snap, port, &mut pkt, self.now_ms, self.ctr),
            Arrival::Staged(i) => pipeline.process_ahead(i, snap, port, &mut pkt, self.now_ms, self.ctr, true),
            Arrival::Steered => pipeline.process_steered(snap, port, &mut pkt, self.now_ms, self.ctr),
            Arrival::StagedSteered(i) => pipeline.process_ahead(i, snap, port, &mut pkt, self.now_ms, self.ctr, false),
        };
        self.route(io, pipeline, capacity, v, port, exception, pkt);
        if let FragEvent::Pinned(key) = pipeline.frag_event() {
            self.release(io, pipeline, snap, key);
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
            steering: None,
            staged: (u64::MAX, false),
            staged_min_heap: STAGED_MIN_HEAP_BYTES,
            latency: None,
        }
    }

    /// Records each packet's time through this worker (see
    /// [`crate::latency`]) with `clock`, into `shared`.
    pub fn with_latency(mut self, clock: fn() -> u64, shared: Arc<SharedLatency>) -> Self {
        self.latency = Some(Recorder::new(clock, shared));
        self
    }

    /// Makes this worker number `index` of the workers sharing `steering`:
    /// it hands packets whose flow another worker owns to that worker, and
    /// drains its own queue every poll. Every worker of the set must have
    /// the same inputs and outputs (a steered packet carries its input port
    /// and exception output along).
    pub fn with_steering(mut self, steering: Arc<Steering<IO::Buf>>, index: usize) -> Self {
        let workers = u16::try_from(steering.workers()).unwrap_or(u16::MAX);
        self.pipeline.set_steering(workers, u16::try_from(index).unwrap_or(u16::MAX));
        self.steering = Some((steering, index));
        self
    }

    /// Shares pins with sibling appliances: this worker pushes the pins it
    /// exports into `ring` and looks up the pins `synced` reads (a reader
    /// of the control side's publisher of received pins), moving to the
    /// latest once per round. See [`crate::pipeline`].
    pub fn with_sync(mut self, ring: Arc<SyncRing>, synced: Reader<SyncedPins>) -> Self {
        self.pipeline.attach_sync(ring, synced);
        self
    }

    /// Records TCP handshakes with endpoints in `table` (passive health,
    /// see [`crate::handshake`]).
    pub fn with_handshakes(mut self, table: Arc<crate::handshake::Handshakes>) -> Self {
        self.pipeline.attach_handshakes(table);
        self
    }

    /// Runs bursts through the look-ahead stages
    /// ([`Pipeline::prefetch_burst`]) when the snapshot's tables take at
    /// least `min_heap_bytes` (default [`STAGED_MIN_HEAP_BYTES`]; 0: always,
    /// `usize::MAX`: never).
    pub fn with_staging(mut self, min_heap_bytes: usize) -> Self {
        self.staged_min_heap = min_heap_bytes;
        self.staged = (u64::MAX, false);
        self
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

    /// Its counters' conservation ledger (between polls).
    pub fn ledger(&self) -> Ledger {
        Ledger::of(&self.counters, self.stash.len() as u64)
    }

    /// One round: a burst from every input and from the steering queue,
    /// processed and sent. Returns the number of packets taken in.
    /// `now_ms` is a monotonic clock.
    pub fn poll(&mut self, now_ms: u64) -> usize {
        let Worker {
            io,
            reader,
            pipeline,
            counters,
            inputs,
            rx,
            tx,
            free,
            stash,
            stash_capacity,
            stash_ttl_ms,
            steering,
            staged,
            staged_min_heap,
            latency,
        } = self;
        let ctr: &WorkerCounters = counters;
        let snap = reader.read();
        ctr.generation.set(snap.generation);
        pipeline.begin_round();
        if staged.0 != snap.generation {
            // The flow table counts where a service keeps flow state.
            let flows = if snap.services.iter().any(|s| s.flow_table) { pipeline.flows().bytes() } else { 0 };
            *staged = (snap.generation, snap.heap_bytes() + flows >= *staged_min_heap);
        }
        let staged = staged.1;
        let capacity = *stash_capacity;
        let mut out = Out { ports: &snap.ports, tx, free, ctr, stash, steering: steering.as_ref().map(|(s, _)| &**s), now_ms };
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
                    // The kernel's interface is untagged; the port's VLAN is added here.
                    let vlan = snap.ports.get(output).map_or(0, |p| p.vlan);
                    for mut pkt in rx.drain(..) {
                        if vlan != 0 && !add_vlan_tag(&mut pkt, vlan) {
                            out.discard(io, DropReason::EncapNoHeadroom, pkt);
                            continue;
                        }
                        out.send(io, output, pkt);
                    }
                }
                Input::Port { port, exception } => {
                    if let Some(l) = latency.as_mut() {
                        l.burst_in(rx.len());
                    }
                    if staged {
                        let hints: &IO = io;
                        pipeline.prefetch_burst(snap, ctr, rx, |a| hints.prefetch(a));
                        for (i, pkt) in rx.drain(..).enumerate() {
                            out.process(io, pipeline, snap, capacity, port, exception, pkt, Arrival::Staged(i));
                        }
                    } else {
                        for pkt in rx.drain(..) {
                            out.process(io, pipeline, snap, capacity, port, exception, pkt, Arrival::Port);
                        }
                    }
                }
            }
        }
        if let Some((st, me)) = steering.as_ref() {
            // Another core wrote these packets last: a burst of them is
            // taken first, their descriptions and frames requested for all
            // (and, with staging, the look-ahead stages run over them), so
            // that their cache misses overlap instead of adding up. A poll
            // with none waiting costs one look at the queue.
            let mut next = st.pop(*me);
            if next.is_some() {
                let mut from = [(0u8, None); BURST];
                debug_assert!(rx.is_empty(), "every input burst was drained");
                while let Some(s) = next {
                    s.pkt.prefetch_meta();
                    from[rx.len()] = (s.port, s.exception);
                    rx.push(s.pkt);
                    next = if rx.len() < BURST { st.pop(*me) } else { None };
                }
                let n = rx.len();
                ctr.steered_in.add(n as u64);
                if staged {
                    let hints: &IO = io;
                    pipeline.prefetch_burst(snap, ctr, rx, |a| hints.prefetch(a));
                } else {
                    for pkt in rx.iter() {
                        pkt.prefetch();
                    }
                }
                for (i, (pkt, (port, exception))) in rx.drain(..).zip(from).enumerate() {
                    let arrival = if staged { Arrival::StagedSteered(i) } else { Arrival::Steered };
                    out.process(io, pipeline, snap, capacity, port, exception, pkt, arrival);
                }
                total += n;
            }
        }
        if !out.stash.is_empty() {
            let ttl = *stash_ttl_ms;
            let mut k = 0;
            while k < out.stash.len() {
                if now_ms.saturating_sub(out.stash[k].since) > ttl {
                    let h = out.stash.swap_remove(k);
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
        if let Some(l) = latency.as_mut() {
            l.round_done(now_ms);
        }
        if total == 0 {
            ctr.idle_polls.add(1);
        } else {
            ctr.busy_polls.add(1);
        }
        pipeline.flow_census(now_ms, ctr);
        total
    }

    /// Polls until `stop` is set, busy polling; `clock_ms` gives
    /// milliseconds, `cycles` a finer clock (TSC cycles, nanoseconds: any
    /// unit) by which the time of each round is counted as busy (it took
    /// something in) or idle. Held fragments and steered packets left over
    /// are dropped (and counted) at the end.
    pub fn run(&mut self, stop: &AtomicBool, clock_ms: impl Fn() -> u64, cycles: impl Fn() -> u64) {
        self.run_with(stop, clock_ms, cycles, IdlePolicy::BUSY_POLL, |_| {});
    }

    /// [`Worker::run`], pausing when it finds nothing as `policy` says:
    /// waiting on receive interrupts where the policy asks for them and
    /// the inputs have them, else `pause(us)`, called between rounds, which
    /// should sleep about `us` microseconds. Time paused counts as idle.
    pub fn run_with(
        &mut self,
        stop: &AtomicBool,
        clock_ms: impl Fn() -> u64,
        cycles: impl Fn() -> u64,
        policy: IdlePolicy,
        pause: impl Fn(u32),
    ) {
        let mut backoff = Backoff::new(policy);
        let interrupts = policy.rx_interrupts && policy.max_pause_us > 0 && self.io.arm_wait();
        if interrupts {
            self.counters.interrupts_armed.add(1);
        }
        let mut last = cycles();
        while !stop.load(Ordering::Relaxed) {
            let n = self.poll(clock_ms());
            let wait = backoff.after(n);
            if wait > 0 {
                self.counters.idle_pauses.add(1);
                match if interrupts { self.io.wait(wait) } else { Waited::Unable } {
                    Waited::Unable => pause(wait),
                    Waited::Woken => {
                        self.counters.interrupt_waits.add(1);
                        self.counters.interrupt_wakeups.add(1);
                        // Traffic is coming, and the device may show it a
                        // little after its interrupt (a tap reads its file
                        // descriptor once a signal says it has data): poll
                        // closely again instead of going back to the longest
                        // pause.
                        backoff.reset();
                    }
                    Waited::TimedOut => self.counters.interrupt_waits.add(1),
                }
            }
            let now = cycles();
            let spent = now.wrapping_sub(last);
            last = now;
            if n == 0 {
                self.counters.idle_cycles.add(spent);
            } else {
                self.counters.busy_cycles.add(spent);
            }
        }
        self.shutdown();
    }

    /// Drops what is held, and what waits in any steering queue, and goes
    /// offline for snapshot reclamation. Meant for when every worker of a
    /// steering set stops: each drains all the queues after its own last
    /// hand-over, so none is left once all have shut down.
    pub fn shutdown(&mut self) {
        for h in self.stash.drain(..) {
            self.counters.count_drop(DropReason::FragmentTimeout);
            self.free.push(h.pkt);
            if self.free.is_full() {
                self.io.free(&mut self.free);
            }
        }
        if let Some((st, _)) = self.steering.as_ref() {
            for q in 0..st.workers() {
                while let Some(s) = st.pop(q) {
                    self.counters.steered_in.add(1);
                    self.counters.count_drop(DropReason::SteeredAtShutdown);
                    self.free.push(s.pkt);
                    if self.free.is_full() {
                        self.io.free(&mut self.free);
                    }
                }
            }
        }
        self.io.free(&mut self.free);
        if let Some(l) = self.latency.as_mut() {
            l.flush();
        }
        self.reader.offline();
        self.pipeline.sync_offline();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pauses(b: &mut Backoff, rounds: &[usize]) -> Vec<u32> {
        rounds.iter().map(|&n| b.after(n)).collect()
    }

    #[test]
    fn busy_poll_never_pauses() {
        let mut b = Backoff::new(IdlePolicy::BUSY_POLL);
        assert!(pauses(&mut b, &[0; 1000]).iter().all(|&p| p == 0));
    }

    #[test]
    fn pauses_double_up_to_the_bound_after_the_spin() {
        let mut b = Backoff::new(IdlePolicy { spin_rounds: 3, max_pause_us: 50, rx_interrupts: false });
        assert_eq!(pauses(&mut b, &[0; 12]), [0, 0, 0, 1, 2, 4, 8, 16, 32, 50, 50, 50]);
    }

    #[test]
    fn traffic_starts_over() {
        let mut b = Backoff::new(IdlePolicy { spin_rounds: 1, max_pause_us: 1000, rx_interrupts: false });
        assert_eq!(pauses(&mut b, &[0, 0, 0, 0, 5, 0, 0, 0]), [0, 1, 2, 4, 0, 0, 1, 2]);
    }

    #[test]
    fn the_bound_holds_without_overflow() {
        let mut b = Backoff::new(IdlePolicy { spin_rounds: 0, max_pause_us: u32::MAX, rx_interrupts: false });
        let p = pauses(&mut b, &[0; 40]);
        assert_eq!(p[31], 1 << 31);
        assert!(p[32..].iter().all(|&x| x == u32::MAX));
    }
}

//! Per-worker counters. Each worker writes only its own (plain load and
//! store, no atomic read-modify-write), the control thread reads them with
//! relaxed loads. A worker's block is cache-line aligned so that workers do
//! not share lines.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::verdict::DropReason;

/// A counter with one writer.
#[derive(Debug, Default, bytemuck::Zeroable)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n` (single writer: a load and a store, no locked instruction).
    #[inline(always)]
    pub fn add(&self, n: u64) {
        self.0.store(self.0.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Sets the value.
    #[inline(always)]
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    /// The current value.
    #[inline(always)]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Packets and bytes.
#[derive(Debug, Default, bytemuck::Zeroable)]
pub struct PacketBytes {
    /// Packets.
    pub packets: Counter,
    /// Bytes (frame lengths as received).
    pub bytes: Counter,
}

impl PacketBytes {
    /// Counts one packet of `len` bytes.
    #[inline(always)]
    pub fn count(&self, len: usize) {
        self.packets.add(1);
        self.bytes.add(len as u64);
    }
}

/// One worker's counters.
#[repr(align(64))]
#[derive(Debug)]
pub struct WorkerCounters {
    /// Packets received from ports.
    pub rx_packets: Counter,
    /// Bytes received from ports.
    pub rx_bytes: Counter,
    /// Packets handed to an output and accepted.
    pub tx_packets: Counter,
    /// Load-balanced packets.
    pub balanced: Counter,
    /// Return traffic sent to the gateway.
    pub returned: Counter,
    /// Packets sent to the kernel.
    pub exception: Counter,
    /// Packets passed from the kernel to a port.
    pub from_kernel: Counter,
    /// Later IP fragments held back.
    pub stashed: Counter,
    /// ICMP errors ("fragmentation needed", "packet too big") sent back to
    /// the sources of packets too big for their tunnel or their output's
    /// MTU, in their place.
    pub icmp_too_big: Counter,
    /// IPv4 packets larger than their output's MTU sent as fragments
    /// ([`crate::fragment`]).
    pub fragmented: Counter,
    /// The fragments they were sent as.
    pub fragments: Counter,
    /// Packets handed to the worker that owns their flow.
    pub steered_out: Counter,
    /// Packets taken from this worker's steering queue (or, at shutdown,
    /// from any).
    pub steered_in: Counter,
    /// Poll rounds that received something.
    pub busy_polls: Counter,
    /// Poll rounds that received nothing.
    pub idle_polls: Counter,
    /// Time (in the units of the cycle clock given to `Worker::run`) spent
    /// in poll rounds that received something.
    pub busy_cycles: Counter,
    /// Time spent in poll rounds that received nothing.
    pub idle_cycles: Counter,
    /// Pauses taken after empty poll rounds (see `worker::IdlePolicy`).
    pub idle_pauses: Counter,
    /// 1 while the worker's pauses can wait on receive interrupts (every
    /// input has them and the policy asks for them), else 0.
    pub interrupts_armed: Counter,
    /// Of those, pauses spent waiting on receive interrupts rather than asleep.
    pub interrupt_waits: Counter,
    /// Of those, waits that a receive interrupt ended before their time.
    pub interrupt_wakeups: Counter,
    /// Snapshot generation in use.
    pub generation: Counter,
    /// Live flow-table entries evicted to make room.
    pub flow_evictions: Counter,
    /// Live flow-table entries at the last count (a gauge, counted once
    /// a second a few buckets a round: [`crate::flow::FlowTable::census`]).
    pub flow_entries: Counter,
    /// The flow table's entries at most (a gauge).
    pub flow_capacity: Counter,
    /// Pins pushed to the sync ring for sibling appliances.
    pub sync_exported: Counter,
    /// Pins not pushed because the sync ring was full (the flow's next
    /// packet tries again).
    pub sync_ring_full: Counter,
    /// Flows without a pin of their own that took a pin received from a
    /// sibling.
    pub sync_pin_hits: Counter,
    /// TCP SYNs to endpoints whose handshake went into the shared
    /// handshake table (passive health, [`crate::handshake`]).
    pub handshakes_sampled: Counter,
    /// SYNs whose handshake was not sampled: its slot held another.
    pub handshakes_unsampled: Counter,
    /// Drops, by [`DropReason::index`].
    pub drops: [Counter; DropReason::COUNT],
    /// Per service, by counter slot.
    pub services: Box<[PacketBytes]>,
    /// Per endpoint, by counter slot.
    pub endpoints: Box<[PacketBytes]>,
}

impl WorkerCounters {
    /// Counters with room for `services` service slots and `endpoints`
    /// endpoint slots.
    pub fn new(services: usize, endpoints: usize) -> WorkerCounters {
        WorkerCounters {
            rx_packets: Counter::default(),
            rx_bytes: Counter::default(),
            tx_packets: Counter::default(),
            balanced: Counter::default(),
            returned: Counter::default(),
            exception: Counter::default(),
            from_kernel: Counter::default(),
            stashed: Counter::default(),
            icmp_too_big: Counter::default(),
            fragmented: Counter::default(),
            fragments: Counter::default(),
            steered_out: Counter::default(),
            steered_in: Counter::default(),
            busy_polls: Counter::default(),
            idle_polls: Counter::default(),
            busy_cycles: Counter::default(),
            idle_cycles: Counter::default(),
            idle_pauses: Counter::default(),
            interrupts_armed: Counter::default(),
            interrupt_waits: Counter::default(),
            interrupt_wakeups: Counter::default(),
            generation: Counter::default(),
            flow_evictions: Counter::default(),
            flow_entries: Counter::default(),
            flow_capacity: Counter::default(),
            sync_exported: Counter::default(),
            sync_ring_full: Counter::default(),
            sync_pin_hits: Counter::default(),
            handshakes_sampled: Counter::default(),
            handshakes_unsampled: Counter::default(),
            drops: std::array::from_fn(|_| Counter::default()),
            // Zeroed memory: a slot's page becomes resident when its
            // service or endpoint is first counted.
            services: bytemuck::zeroed_slice_box(services),
            endpoints: bytemuck::zeroed_slice_box(endpoints),
        }
    }

    /// Counts a drop.
    #[inline(always)]
    pub fn count_drop(&self, r: DropReason) {
        self.drops[r.index()].add(1);
    }

    /// Sum of all drops.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().map(Counter::get).sum()
    }
}

/// The conservation identity of a worker's counters (or of several
/// workers' summed): every packet a worker takes in — received from an
/// input, or steered in from another worker — is counted exactly once as
///
/// ```text
/// received + steered_in
///     = balanced + returned + exception + icmp_generated + passthrough   (handed to an output)
///     + dropped                                  (every drop reason but the two below)
///     + held                                     (later fragments in the hold-back area now)
///     + steered_out                              (handed to the worker that owns the flow)
/// ```
///
/// and what was handed to an output, a packet sent as fragments counting
/// as its fragments, was either accepted or dropped there:
///
/// ```text
/// balanced + returned + exception + icmp_generated + passthrough
///     - fragmented + fragments
///     = sent + tx_queue_full + no_such_output + fragment_no_buffer
/// ```
///
/// Summed over the workers of a steering set, `steered_out - steered_in`
/// is what waits in the steering queues (0 once every worker has shut down).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Packets received from inputs (ports and the kernel).
    pub received: u64,
    /// Packets taken from steering queues.
    pub steered_in: u64,
    /// Load-balanced packets handed to an output.
    pub balanced: u64,
    /// Return traffic handed to an output.
    pub returned: u64,
    /// Packets handed to an exception path.
    pub exception: u64,
    /// ICMP errors generated in place of packets and handed to an output.
    pub icmp_generated: u64,
    /// Packets from the kernel handed to a port.
    pub passthrough: u64,
    /// Packets sent as fragments.
    pub fragmented: u64,
    /// The fragments they were sent as.
    pub fragments: u64,
    /// Drops before any output.
    pub dropped: u64,
    /// Later fragments held now.
    pub held: u64,
    /// Packets handed to another worker.
    pub steered_out: u64,
    /// Packets outputs accepted.
    pub sent: u64,
    /// Drops at an output (`tx_queue_full`, `no_such_output`,
    /// `fragment_no_buffer`).
    pub output_drops: u64,
}

impl Ledger {
    /// The ledger of `c`, for a worker holding `held` fragments. Read it
    /// when the worker is between polls (or stopped).
    pub fn of(c: &WorkerCounters, held: u64) -> Ledger {
        let output_drops = [DropReason::TxQueueFull, DropReason::NoSuchOutput, DropReason::FragmentNoBuffer]
            .iter()
            .map(|r| c.drops[r.index()].get())
            .sum::<u64>();
        Ledger {
            received: c.rx_packets.get(),
            steered_in: c.steered_in.get(),
            balanced: c.balanced.get(),
            returned: c.returned.get(),
            exception: c.exception.get(),
            icmp_generated: c.icmp_too_big.get(),
            passthrough: c.from_kernel.get(),
            fragmented: c.fragmented.get(),
            fragments: c.fragments.get(),
            dropped: c.total_drops() - output_drops,
            held,
            steered_out: c.steered_out.get(),
            sent: c.tx_packets.get(),
            output_drops,
        }
    }

    /// Packets handed to an output, by every category.
    pub fn to_outputs(&self) -> u64 {
        self.balanced + self.returned + self.exception + self.icmp_generated + self.passthrough
    }

    /// Packets taken in.
    pub fn taken_in(&self) -> u64 {
        self.received + self.steered_in
    }

    /// Packets accounted for.
    pub fn accounted(&self) -> u64 {
        self.to_outputs() + self.dropped + self.held + self.steered_out
    }

    /// Checks both identities; the error says which failed and by how much.
    pub fn check(&self) -> Result<(), String> {
        if self.taken_in() != self.accounted() {
            return Err(format!("taken in {} != accounted for {}: {self:?}", self.taken_in(), self.accounted()));
        }
        let frames = (self.to_outputs() + self.fragments).checked_sub(self.fragmented);
        if frames != Some(self.sent + self.output_drops) {
            return Err(format!(
                "frames handed to outputs {frames:?} != sent {} + dropped at outputs {}: {self:?}",
                self.sent,
                self.output_drops
            ));
        }
        Ok(())
    }
}

impl std::ops::Add for Ledger {
    type Output = Ledger;
    fn add(self, o: Ledger) -> Ledger {
        Ledger {
            received: self.received + o.received,
            steered_in: self.steered_in + o.steered_in,
            balanced: self.balanced + o.balanced,
            returned: self.returned + o.returned,
            exception: self.exception + o.exception,
            icmp_generated: self.icmp_generated + o.icmp_generated,
            passthrough: self.passthrough + o.passthrough,
            fragmented: self.fragmented + o.fragmented,
            fragments: self.fragments + o.fragments,
            dropped: self.dropped + o.dropped,
            held: self.held + o.held,
            steered_out: self.steered_out + o.steered_out,
            sent: self.sent + o.sent,
            output_drops: self.output_drops + o.output_drops,
        }
    }
}

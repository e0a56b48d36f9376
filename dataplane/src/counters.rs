//! Per-worker counters. Each worker writes only its own (plain load and
//! store, no atomic read-modify-write), the control thread reads them with
//! relaxed loads. A worker's block is cache-line aligned so that workers do
//! not share lines.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::verdict::DropReason;

/// A counter with one writer.
#[derive(Debug, Default)]
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
#[derive(Debug, Default)]
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
    /// ICMP errors sent back to clients ("fragmentation needed", "packet
    /// too big") in place of packets too big for their tunnel.
    pub icmp_too_big: Counter,
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
    /// Snapshot generation in use.
    pub generation: Counter,
    /// Live flow-table entries evicted to make room.
    pub flow_evictions: Counter,
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
            steered_out: Counter::default(),
            steered_in: Counter::default(),
            busy_polls: Counter::default(),
            idle_polls: Counter::default(),
            busy_cycles: Counter::default(),
            idle_cycles: Counter::default(),
            generation: Counter::default(),
            flow_evictions: Counter::default(),
            drops: std::array::from_fn(|_| Counter::default()),
            services: (0..services).map(|_| PacketBytes::default()).collect(),
            endpoints: (0..endpoints).map(|_| PacketBytes::default()).collect(),
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

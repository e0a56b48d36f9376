//! [`PacketIo`] over DPDK queues: a worker's receive queues are its inputs,
//! its transmit queues its outputs, in the order given, and new frames
//! (fragments) come from its pool. (The traffic generator's queues, with a
//! pool to allocate from, are the lab crate's.)

use std::sync::Arc;

use sluice_dataplane::io::{Burst, PacketIo, Waited};

use crate::mempool::Mempool;

use crate::mbuf::{free_burst, Mbuf};
use crate::port::{RxQueue, TxQueue};

/// The queues one worker polls and sends on.
#[derive(Debug, Default)]
pub struct QueueIo {
    /// Inputs, by index.
    pub rx: Vec<RxQueue>,
    /// Outputs, by index.
    pub tx: Vec<TxQueue>,
    /// The pool new frames (fragments) are allocated from; none: no frame
    /// can be made.
    pub pool: Option<Arc<Mempool>>,
    /// Every input's receive interrupt is armed on the polling thread.
    armed: bool,
}

impl QueueIo {
    /// No queues yet, allocating new frames from `pool`.
    pub fn with_pool(pool: Arc<Mempool>) -> QueueIo {
        QueueIo { pool: Some(pool), ..QueueIo::default() }
    }
}

/// The shortest pause spent waiting on receive interrupts, in
/// microseconds: DPDK's wait counts in milliseconds, and shorter pauses
/// sleep.
pub const INTERRUPT_WAIT_MIN_US: u32 = 1000;

impl PacketIo for QueueIo {
    type Buf = Mbuf;

    #[inline]
    fn rx(&mut self, input: usize, burst: &mut Burst<Mbuf>) -> usize {
        match self.rx.get_mut(input) {
            Some(q) => q.rx_burst(burst),
            None => 0,
        }
    }

    #[inline]
    fn tx(&mut self, output: usize, burst: &mut Burst<Mbuf>) -> usize {
        match self.tx.get_mut(output) {
            Some(q) => q.tx_burst(burst),
            None => {
                free_burst(burst);
                0
            }
        }
    }

    #[inline]
    fn free(&mut self, burst: &mut Burst<Mbuf>) {
        free_burst(burst);
    }

    fn alloc_frames(&mut self, burst: &mut Burst<Mbuf>, n: usize, len: usize) -> usize {
        let Some(pool) = &self.pool else { return 0 };
        let at = burst.len();
        if pool.alloc_bulk(burst, n) < n {
            return 0;
        }
        if burst[at..].iter_mut().all(|m| m.set_len(len)) {
            return n;
        }
        // Longer than the buffers: give them back.
        let mut extra: Burst<Mbuf> = burst.drain(at..).collect();
        free_burst(&mut extra);
        0
    }

    fn arm_wait(&mut self) -> bool {
        // Every input, or none: one that cannot wake the thread would wait
        // out the whole pause.
        self.armed = !self.rx.is_empty() && self.rx.iter().all(RxQueue::arm_interrupt);
        self.armed
    }

    fn wait(&mut self, us: u32) -> Waited {
        if !self.armed || us < INTERRUPT_WAIT_MIN_US {
            return Waited::Unable;
        }
        for q in &self.rx {
            q.set_interrupt(true);
        }
        // A packet that came between the last poll and the switch above
        // may raise no interrupt on some devices: the pause bounds its wait.
        let woken = crate::port::wait_for_rx(us / INTERRUPT_WAIT_MIN_US);
        for q in &self.rx {
            q.set_interrupt(false);
        }
        if woken {
            Waited::Woken
        } else {
            Waited::TimedOut
        }
    }

    #[inline(always)]
    fn prefetch(&self, addr: *const u8) {
        crate::mbuf::prefetch(addr);
    }
}

//! The generator's I/O over DPDK: [`GenQueues`], a worker's [`QueueIo`]
//! with the pool new frames come from.

use std::sync::Arc;

use sluice_dataplane::io::{Burst, PacketIo};
use sluice_ffi::{free_burst, Mbuf, Mempool, QueueIo};

use crate::engine::GenIo;

/// The generator's queues: [`QueueIo`] and the pool its frames come from.
#[derive(Debug)]
pub struct GenQueues {
    /// The queues.
    pub io: QueueIo,
    /// The pool new frames are allocated from.
    pub pool: Arc<Mempool>,
}

impl PacketIo for GenQueues {
    type Buf = Mbuf;

    #[inline]
    fn rx(&mut self, input: usize, burst: &mut Burst<Mbuf>) -> usize {
        self.io.rx(input, burst)
    }

    #[inline]
    fn tx(&mut self, output: usize, burst: &mut Burst<Mbuf>) -> usize {
        self.io.tx(output, burst)
    }

    #[inline]
    fn free(&mut self, burst: &mut Burst<Mbuf>) {
        free_burst(burst);
    }
}

impl GenIo for GenQueues {
    #[inline]
    fn alloc(&mut self, burst: &mut Burst<Mbuf>, n: usize) -> usize {
        // Not reset here: `set_len` sets what a send reads, once.
        self.pool.alloc_raw_bulk(burst, n)
    }

    #[inline]
    fn set_len(&self, buf: &mut Mbuf, len: usize) -> bool {
        buf.reset_to(len)
    }
}

//! [`PacketIo`] over DPDK queues: a worker's receive queues are its inputs,
//! its transmit queues its outputs, in the order given.

use sluice_dataplane::io::{Burst, PacketIo};

use crate::mbuf::{free_burst, Mbuf};
use crate::port::{RxQueue, TxQueue};

/// The queues one worker polls and sends on.
#[derive(Debug, Default)]
pub struct QueueIo {
    /// Inputs, by index.
    pub rx: Vec<RxQueue>,
    /// Outputs, by index.
    pub tx: Vec<TxQueue>,
}

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

    #[inline(always)]
    fn prefetch(&self, addr: *const u8) {
        crate::mbuf::prefetch(addr);
    }
}

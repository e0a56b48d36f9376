//! Packet I/O in memory: buffers with headroom like mbufs, inputs fed from
//! queues, outputs collected in vectors. For tests, benchmarks and replay
//! tools; the fast path itself never depends on it.

use std::collections::VecDeque;

use crate::io::{Burst, PacketBuf, PacketIo, Waited};

/// Headroom of a [`MemBuf`], as in a DPDK mbuf.
pub const HEADROOM: usize = 128;

/// A frame in an owned buffer with headroom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemBuf {
    mem: Vec<u8>,
    start: usize,
    headroom: usize,
}

impl MemBuf {
    /// A buffer holding `frame` after [`HEADROOM`] bytes.
    pub fn new(frame: &[u8]) -> MemBuf {
        MemBuf::with_headroom(frame, HEADROOM)
    }

    /// A buffer holding `frame` after `headroom` bytes.
    pub fn with_headroom(frame: &[u8], headroom: usize) -> MemBuf {
        let mut mem = Vec::with_capacity(headroom + frame.len());
        mem.resize(headroom, 0);
        mem.extend_from_slice(frame);
        MemBuf { mem, start: headroom, headroom }
    }

    /// Replaces the frame, restoring the headroom, without reallocating
    /// when the capacity suffices.
    pub fn reset(&mut self, frame: &[u8]) {
        self.mem.resize(self.headroom, 0);
        self.mem.extend_from_slice(frame);
        self.start = self.headroom;
    }
}

impl PacketBuf for MemBuf {
    #[inline(always)]
    fn data(&self) -> &[u8] {
        &self.mem[self.start..]
    }

    #[inline(always)]
    fn data_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..]
    }

    fn prepend(&mut self, n: usize) -> bool {
        if n > self.start {
            return false;
        }
        self.start -= n;
        true
    }

    fn adj(&mut self, n: usize) -> bool {
        if n > self.mem.len() - self.start {
            return false;
        }
        self.start += n;
        true
    }

    fn truncate(&mut self, len: usize) -> bool {
        if len > self.mem.len() - self.start {
            return false;
        }
        self.mem.truncate(self.start + len);
        true
    }
}

/// Inputs and outputs in memory.
#[derive(Debug, Default)]
pub struct MemIo {
    /// Frames waiting on each input.
    pub inputs: Vec<VecDeque<MemBuf>>,
    /// Frames sent on each output.
    pub outputs: Vec<Vec<MemBuf>>,
    /// Accept at most this many frames per transmit call (simulates a full queue).
    pub tx_limit: usize,
    /// Frames freed.
    pub freed: usize,
    /// Prefetch hints received (they are only counted).
    pub prefetches: std::cell::Cell<u64>,
    /// The inputs signal arrivals ([`PacketIo::arm_wait`] is true): a wait
    /// ends at once when a frame waits on an input, else times out.
    pub interrupts: bool,
    /// The pauses waited on the inputs, in microseconds.
    pub waited: Vec<u32>,
    /// Waits that end signalled although no frame shows yet (a device
    /// whose interrupt comes before its data is readable).
    pub early_signals: usize,
    /// New buffers it may still give out (simulates a pool running dry).
    pub buffers: usize,
    /// New buffers given out.
    pub allocated: usize,
}

impl MemIo {
    /// `inputs` empty inputs and `outputs` empty outputs.
    pub fn new(inputs: usize, outputs: usize) -> MemIo {
        MemIo {
            inputs: (0..inputs).map(|_| VecDeque::new()).collect(),
            outputs: (0..outputs).map(|_| Vec::new()).collect(),
            tx_limit: usize::MAX,
            freed: 0,
            prefetches: std::cell::Cell::new(0),
            interrupts: false,
            waited: Vec::new(),
            early_signals: 0,
            buffers: usize::MAX,
            allocated: 0,
        }
    }
}

impl PacketIo for MemIo {
    type Buf = MemBuf;

    fn rx(&mut self, input: usize, burst: &mut Burst<MemBuf>) -> usize {
        let Some(q) = self.inputs.get_mut(input) else { return 0 };
        let mut n = 0;
        while !burst.is_full() {
            let Some(b) = q.pop_front() else { break };
            burst.push(b);
            n += 1;
        }
        n
    }

    fn tx(&mut self, output: usize, burst: &mut Burst<MemBuf>) -> usize {
        let n = burst.len().min(self.tx_limit);
        let Some(out) = self.outputs.get_mut(output) else {
            self.freed += burst.len();
            burst.clear();
            return 0;
        };
        out.extend(burst.drain(..n));
        self.freed += burst.len();
        burst.clear();
        n
    }

    fn free(&mut self, burst: &mut Burst<MemBuf>) {
        self.freed += burst.len();
        burst.clear();
    }

    fn alloc_frames(&mut self, burst: &mut Burst<MemBuf>, n: usize, len: usize) -> usize {
        if n > self.buffers || n > burst.remaining_capacity() {
            return 0;
        }
        self.buffers -= n;
        self.allocated += n;
        for _ in 0..n {
            burst.push(MemBuf::new(&vec![0; len]));
        }
        n
    }

    fn arm_wait(&mut self) -> bool {
        self.interrupts
    }

    fn wait(&mut self, us: u32) -> Waited {
        if !self.interrupts {
            return Waited::Unable;
        }
        self.waited.push(us);
        if self.early_signals > 0 {
            self.early_signals -= 1;
            return Waited::Woken;
        }
        if self.inputs.iter().any(|q| !q.is_empty()) {
            Waited::Woken
        } else {
            Waited::TimedOut
        }
    }

    fn prefetch(&self, _addr: *const u8) {
        self.prefetches.set(self.prefetches.get() + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_restores_the_headroom() {
        let mut b = MemBuf::with_headroom(b"abc", 8);
        assert!(b.prepend(8) && !b.prepend(1));
        b.reset(b"xy");
        assert_eq!(b.data(), b"xy");
        assert!(b.prepend(8), "all the headroom is back");
        assert!(b.adj(10) && b.data().is_empty());
        b.reset(b"abcdef");
        assert!(!b.truncate(7) && b.truncate(6) && b.truncate(2));
        assert_eq!(b.data(), b"ab");
        assert!(b.truncate(0) && b.data().is_empty());
    }
}

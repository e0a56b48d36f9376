//! The worker's view of packet I/O: bursts of owned packet buffers moved in
//! and out of numbered inputs and outputs.
//!
//! `sluice-ffi` implements these traits over DPDK queues and mbufs; tests
//! implement them over plain vectors. The worker loop never sees a DPDK type.

use arrayvec::ArrayVec;

/// Packets moved per receive or transmit call.
pub const BURST: usize = 32;

/// A fixed-capacity burst of packets; never allocates.
pub type Burst<P> = ArrayVec<P, BURST>;

/// One packet buffer owned by the worker.
///
/// Dropping it returns it to wherever it came from (an mbuf to its pool).
pub trait PacketBuf {
    /// The frame, starting at the Ethernet header.
    fn data(&self) -> &[u8];
    /// The frame, writable in place.
    fn data_mut(&mut self) -> &mut [u8];
    /// Grows the frame at the front by `n` bytes taken from the headroom.
    /// Returns false, leaving the frame unchanged, when the headroom is short.
    fn prepend(&mut self, n: usize) -> bool;
    /// Removes `n` bytes from the front of the frame.
    /// Returns false, leaving the frame unchanged, when it is shorter than `n`.
    fn adj(&mut self, n: usize) -> bool;
    /// Shortens the frame to its first `len` bytes. Returns false, leaving
    /// the frame unchanged, when it is shorter than `len` or cannot be cut.
    fn truncate(&mut self, len: usize) -> bool;
    /// The receive-side flow hash computed by the NIC, when it gave one.
    fn rss_hash(&self) -> Option<u32> {
        None
    }
    /// A hint that the frame's first bytes are read soon (a cache prefetch
    /// where the backend can issue one).
    #[inline(always)]
    fn prefetch(&self) {}
    /// A hint that the buffer's own description (where its frame is, how
    /// long it is) is read soon: for a buffer another core touched last,
    /// before [`PacketBuf::prefetch`], which reads it.
    #[inline(always)]
    fn prefetch_meta(&self) {}
}

/// What [`PacketIo::wait`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// It cannot wait for this pause: sleep instead.
    Unable,
    /// An input signalled traffic before the time was up.
    Woken,
    /// The time passed with no signal.
    TimedOut,
}

/// Burst receive and transmit for one worker.
///
/// Inputs and outputs are small indexes the worker was configured with
/// (for instance port 0 and port 1, or the exception path).
pub trait PacketIo {
    /// The packet buffer type.
    type Buf: PacketBuf;

    /// Appends up to `burst.remaining_capacity()` received packets from
    /// `input` to `burst`; returns how many were added.
    fn rx(&mut self, input: usize, burst: &mut Burst<Self::Buf>) -> usize;

    /// Transmits the packets of `burst` on `output` and empties it. Packets the
    /// output did not accept are freed; returns how many were accepted.
    fn tx(&mut self, output: usize, burst: &mut Burst<Self::Buf>) -> usize;

    /// Appends `n` new buffers to `burst`, each holding a frame of `len`
    /// bytes (to be overwritten), or none when fewer than `n` can be had
    /// or `burst` has less room; returns how many were added. The default
    /// has none to give.
    fn alloc_frames(&mut self, burst: &mut Burst<Self::Buf>, n: usize, len: usize) -> usize {
        let _ = (burst, n, len);
        0
    }

    /// Frees every packet of `burst` (in bulk where the backend can).
    fn free(&mut self, burst: &mut Burst<Self::Buf>) {
        burst.clear();
    }

    /// Prepares [`PacketIo::wait`] on the calling thread, the one that
    /// polls: true when every input can wake it (receive interrupts).
    fn arm_wait(&mut self) -> bool {
        false
    }

    /// Waits until an input has packets or about `us` microseconds have
    /// passed, where the backend can ([`PacketIo::arm_wait`] said so);
    /// [`Waited::Unable`] at once where it cannot, and the caller sleeps.
    fn wait(&mut self, us: u32) -> Waited {
        let _ = us;
        Waited::Unable
    }

    /// A hint that memory at `addr` is read soon: a cache prefetch where the
    /// backend can issue one. Never dereferences `addr` (any address will
    /// do, dangling or not); does nothing by default.
    #[inline(always)]
    fn prefetch(&self, addr: *const u8) {
        let _ = addr;
    }
}

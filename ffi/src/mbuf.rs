//! Owned packet buffers.
//!
//! An [`Mbuf`] is a single-owner handle to an `rte_mbuf`: `Send` (it may move
//! to another lcore), not `Sync`, and it frees itself on drop. Sluice never
//! clones mbufs (no reference-count bumps), so the owner of an `Mbuf` is the
//! only one who can read or write its data.
//!
//! An `Mbuf` is one pointer and holds no reference to its pool or the EAL.
//! It stays valid because a [`Mempool`](crate::Mempool) is freed only once
//! every mbuf is back, and one dropped earlier is leaked together with its
//! EAL keep-alive, so `rte_eal_cleanup` never runs while an mbuf is out.

use std::fmt;
use std::ptr::NonNull;

use sluice_dataplane::io::{Burst, PacketBuf, BURST};

use crate::sys;

/// One packet buffer, owned.
#[repr(transparent)]
pub struct Mbuf(NonNull<sys::rte_mbuf>);

// SAFETY: an Mbuf is uniquely owned; freeing it from any lcore is allowed
// (the mempool is multi-producer).
unsafe impl Send for Mbuf {}

impl fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mbuf").field("len", &self.len()).field("port", &self.port()).finish()
    }
}

impl Mbuf {
    /// Takes ownership of a raw mbuf.
    ///
    /// # Safety
    /// `m` must point to a valid, direct mbuf with a reference count of one,
    /// that nothing else will use or free, from a [`Mempool`](crate::Mempool)
    /// of this crate (whose drop rules keep the mbuf's memory alive).
    pub unsafe fn from_raw(m: NonNull<sys::rte_mbuf>) -> Mbuf {
        Mbuf(m)
    }

    /// Gives up ownership without freeing.
    pub fn into_raw(self) -> NonNull<sys::rte_mbuf> {
        let p = self.0;
        std::mem::forget(self);
        p
    }

    fn raw(&self) -> &sys::rte_mbuf {
        // SAFETY: we own a valid mbuf (type invariant).
        unsafe { self.0.as_ref() }
    }

    fn raw_mut(&mut self) -> &mut sys::rte_mbuf {
        // SAFETY: we own a valid mbuf exclusively (type invariant).
        unsafe { self.0.as_mut() }
    }

    /// Bytes of packet data in the first segment.
    pub fn len(&self) -> usize {
        usize::from(self.raw().data_len)
    }

    /// True when the first segment holds no data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total packet length over all segments.
    pub fn pkt_len(&self) -> u32 {
        self.raw().pkt_len
    }

    /// The port the packet was received on.
    pub fn port(&self) -> u16 {
        self.raw().port
    }

    /// Free space before the data.
    pub fn headroom(&self) -> usize {
        usize::from(self.raw().data_off)
    }

    /// Free space after the data in the first (and last) segment.
    pub fn tailroom(&self) -> usize {
        let m = self.raw();
        usize::from(m.buf_len).saturating_sub(usize::from(m.data_off) + usize::from(m.data_len))
    }

    /// The packet data of the first segment.
    pub fn data(&self) -> &[u8] {
        let m = self.raw();
        // SAFETY: buf_addr + data_off .. + data_len lies inside the mbuf's
        // buffer (DPDK invariant); we own the mbuf, so no one writes it.
        unsafe {
            std::slice::from_raw_parts(
                m.buf_addr.cast::<u8>().add(usize::from(m.data_off)),
                usize::from(m.data_len),
            )
        }
    }

    /// The packet data of the first segment, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        let m = self.raw_mut();
        // SAFETY: as in `data`; `&mut self` makes the access exclusive and
        // the mbuf is direct with refcnt 1 (type invariant), so the buffer
        // is not shared with any other mbuf.
        unsafe {
            std::slice::from_raw_parts_mut(
                m.buf_addr.cast::<u8>().add(usize::from(m.data_off)),
                usize::from(m.data_len),
            )
        }
    }

    /// Appends `n` bytes at the end (from the tailroom) and returns them.
    /// Only for single-segment mbufs.
    pub fn append(&mut self, n: usize) -> Option<&mut [u8]> {
        if self.raw().nb_segs != 1 || n > self.tailroom() {
            return None;
        }
        let n16 = u16::try_from(n).ok()?;
        let old = self.len();
        let m = self.raw_mut();
        m.data_len += n16;
        m.pkt_len += u32::from(n16);
        Some(&mut self.data_mut()[old..])
    }

    /// Sets the length of a single-segment mbuf to `n` bytes, within its
    /// buffer. Returns false when it does not fit.
    pub fn set_len(&mut self, n: usize) -> bool {
        if self.raw().nb_segs != 1 || n > self.len() + self.tailroom() {
            return false;
        }
        let Ok(n16) = u16::try_from(n) else { return false };
        let m = self.raw_mut();
        m.data_len = n16;
        m.pkt_len = u32::from(n16);
        true
    }

    /// Makes this a new single-segment frame of `n` bytes, as
    /// `rte_pktmbuf_reset` would for a send: DPDK's headroom before the
    /// data, no offload flags, no packet type, no VLAN tag to insert.
    /// Returns false (and changes nothing) when `n` bytes do not fit after
    /// the headroom. For mbufs from [`Mempool::alloc_raw_bulk`](crate::Mempool::alloc_raw_bulk).
    #[inline]
    pub fn reset_to(&mut self, n: usize) -> bool {
        let m = self.raw_mut();
        let off = m.buf_len.min(crate::MBUF_HEADROOM);
        let Ok(n16) = u16::try_from(n) else { return false };
        if m.nb_segs != 1 || n16 > m.buf_len - off {
            return false;
        }
        m.data_off = off;
        m.data_len = n16;
        m.pkt_len = u32::from(n16);
        m.ol_flags = 0;
        m.__bindgen_anon_1.packet_type = 0;
        m.vlan_tci = 0;
        true
    }

    /// Prefetches the first cache line of packet data.
    #[inline(always)]
    pub fn prefetch(&self) {
        let m = self.raw();
        prefetch(m.buf_addr.cast::<u8>().wrapping_add(usize::from(m.data_off)));
    }
}

/// Asks the CPU to bring the cache line at `addr` into L1; any address will
/// do (nothing is read, nothing faults).
#[inline(always)]
pub fn prefetch(addr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint; it never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(addr.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

impl PacketBuf for Mbuf {
    #[inline(always)]
    fn data(&self) -> &[u8] {
        Mbuf::data(self)
    }

    #[inline(always)]
    fn data_mut(&mut self) -> &mut [u8] {
        Mbuf::data_mut(self)
    }

    #[inline]
    fn prepend(&mut self, n: usize) -> bool {
        let Ok(n16) = u16::try_from(n) else { return false };
        let m = self.raw_mut();
        if n16 > m.data_off {
            return false;
        }
        m.data_off -= n16;
        m.data_len += n16;
        m.pkt_len += u32::from(n16);
        true
    }

    #[inline]
    fn adj(&mut self, n: usize) -> bool {
        let Ok(n16) = u16::try_from(n) else { return false };
        let m = self.raw_mut();
        if n16 > m.data_len {
            return false;
        }
        m.data_off += n16;
        m.data_len -= n16;
        m.pkt_len -= u32::from(n16);
        true
    }

    #[inline]
    fn truncate(&mut self, len: usize) -> bool {
        len <= self.len() && self.set_len(len)
    }

    #[inline(always)]
    fn prefetch(&self) {
        Mbuf::prefetch(self);
    }

    #[inline(always)]
    fn prefetch_meta(&self) {
        // The first cache line of the rte_mbuf: buf_addr, data_off, lengths.
        prefetch(self.0.as_ptr().cast::<u8>());
    }

    #[inline(always)]
    fn rss_hash(&self) -> Option<u32> {
        let m = self.raw();
        if m.ol_flags & u64::from(sys::RTE_MBUF_F_RX_RSS_HASH) != 0 {
            // SAFETY: the RSS flag says the `rss` member of the hash union is set.
            Some(unsafe { m.__bindgen_anon_2.hash.rss })
        } else {
            None
        }
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: we own the mbuf and give it back exactly once.
        unsafe { sys::sluice_pktmbuf_free(self.0.as_ptr()) };
    }
}

/// Frees every mbuf of `burst` with one bulk call and empties it.
pub fn free_burst(burst: &mut Burst<Mbuf>) {
    let n = burst.len();
    if n == 0 {
        return;
    }
    let ptrs = burst.as_mut_ptr().cast::<*mut sys::rte_mbuf>();
    // SAFETY: Mbuf is repr(transparent) over a non-null mbuf pointer, so the
    // first `n` slots are `n` owned mbuf pointers; ownership passes to
    // rte_pktmbuf_free_bulk and set_len(0) forgets them without dropping.
    unsafe {
        sys::rte_pktmbuf_free_bulk(ptrs, burst_u32(n));
        burst.set_len(0);
    }
}

/// A count bounded by [`BURST`], as the 16-bit integer DPDK's burst calls take.
#[allow(clippy::cast_possible_truncation)] // n <= BURST = 32
#[inline(always)]
pub(crate) fn burst_u16(n: usize) -> u16 {
    debug_assert!(n <= BURST);
    n as u16
}

/// A count bounded by [`BURST`], as a 32-bit integer.
#[allow(clippy::cast_possible_truncation)] // n <= BURST = 32
#[inline(always)]
pub(crate) fn burst_u32(n: usize) -> u32 {
    debug_assert!(n <= BURST);
    n as u32
}

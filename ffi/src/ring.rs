//! Lock-free rings of mbufs, and ports made of rings (`rte_eth_from_rings`).
//!
//! Ring ports let tests and benchmarks inject exact packets into a port and
//! collect what comes out, through the same queue API as a real device.
//!
//! A [`Ring`] keeps the EAL up. A ring port uses the rings it was made of
//! until the port is closed, however early the caller drops its `Ring`s:
//! the EAL's table of ring ports keeps the underlying ring until then
//! (without keeping the EAL up by itself). A ring is freed with the mbufs
//! still in it.

use std::ffi::CString;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use sluice_dataplane::io::{Burst, BURST};

use crate::eal::Eal;
use crate::error::{call_error, Error, Result};
use crate::ids::PortId;
use crate::keep::{Holder, KeepAlive, PortBacking};
use crate::mbuf::{burst_u32, Mbuf};
use crate::sys;

/// A multi-producer, multi-consumer ring of mbufs.
pub struct Ring {
    inner: Arc<RingInner>,
    _keep: KeepAlive,
}

/// The DPDK ring itself, shared by the [`Ring`] and the ring ports using it.
struct RingInner {
    ptr: NonNull<sys::rte_ring>,
    name: String,
}

// SAFETY: rte_ring enqueue/dequeue are multi-thread safe in the default
// (MP/MC) mode used here.
unsafe impl Send for RingInner {}
// SAFETY: see above.
unsafe impl Sync for RingInner {}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring").field("name", &self.inner.name).field("count", &self.count()).finish()
    }
}

impl Ring {
    /// Creates a ring with room for `size - 1` mbufs (`size` a power of two).
    pub fn new(eal: &Eal, name: &str, size: u32) -> Result<Arc<Ring>> {
        let cname = CString::new(name).map_err(|_| Error::NulInArgument(name.to_owned()))?;
        // SAFETY: valid C string; the EAL is initialised.
        let p = unsafe { sys::rte_ring_create(cname.as_ptr(), size, eal.socket_id(), 0) };
        let ptr = NonNull::new(p).ok_or_else(|| call_error("rte_ring_create", format!("{name} size {size}"), 0))?;
        let inner = Arc::new(RingInner { ptr, name: name.to_owned() });
        Ok(Arc::new(Ring { inner, _keep: eal.keep(Holder::Ring) }))
    }

    /// The ring's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Mbufs waiting in the ring.
    pub fn count(&self) -> u32 {
        // SAFETY: live ring.
        unsafe { sys::sluice_ring_count(self.inner.ptr.as_ptr()) }
    }

    /// Moves as many mbufs of `burst` as fit into the ring, from the front;
    /// the rest stay in `burst`. Returns how many moved.
    pub fn enqueue(&self, burst: &mut Burst<Mbuf>) -> usize {
        let len = burst.len();
        if len == 0 {
            return 0;
        }
        // SAFETY: the first `len` slots are owned mbuf pointers; the ring
        // takes the first `n`; the remaining ones are moved to the front and
        // the length shortened, so each mbuf has exactly one owner.
        unsafe {
            let ptrs = burst.as_mut_ptr().cast::<*mut std::ffi::c_void>();
            let n = sys::sluice_ring_enqueue_burst(self.inner.ptr.as_ptr(), ptrs, burst_u32(len)) as usize;
            std::ptr::copy(ptrs.add(n), ptrs, len - n);
            burst.set_len(len - n);
            n
        }
    }

    /// Moves up to the burst's free capacity of mbufs out of the ring.
    pub fn dequeue(&self, burst: &mut Burst<Mbuf>) -> usize {
        self.inner.dequeue(burst)
    }

    /// Frees every mbuf still in the ring.
    pub fn drain(&self) {
        self.inner.drain();
    }
}

impl RingInner {
    fn dequeue(&self, burst: &mut Burst<Mbuf>) -> usize {
        let len = burst.len();
        let room = BURST - len;
        // SAFETY: the slots after `len` are free capacity; every object in
        // the ring is an owned mbuf put there by `enqueue` or a ring port.
        unsafe {
            let dst = burst.as_mut_ptr().add(len).cast::<*mut std::ffi::c_void>();
            let n = sys::sluice_ring_dequeue_burst(self.ptr.as_ptr(), dst, burst_u32(room)) as usize;
            burst.set_len(len + n);
            n
        }
    }

    fn drain(&self) {
        let mut b = Burst::new();
        while self.dequeue(&mut b) > 0 {
            crate::mbuf::free_burst(&mut b);
        }
    }
}

impl Drop for RingInner {
    fn drop(&mut self) {
        self.drain();
        // SAFETY: the last reference is gone: no `Ring` and no open ring
        // port uses it (the EAL's table holds the rings of ring ports until
        // they are closed). The EAL is still up: this runs before the
        // `Ring`'s keep-alive is dropped, while the closing port holds one,
        // or in the EAL's cleanup before `rte_eal_cleanup`. Freed once.
        unsafe { sys::rte_ring_free(self.ptr.as_ptr()) };
    }
}

/// Creates an Ethernet port named `name` that receives from `rx` rings and
/// transmits into `tx` rings (one ring per queue). The rings are kept until
/// the port is closed.
pub fn ring_port(eal: &Eal, name: &str, rx: &[Arc<Ring>], tx: &[Arc<Ring>]) -> Result<PortId> {
    let cname = CString::new(name).map_err(|_| Error::NulInArgument(name.to_owned()))?;
    let mut rxp: Vec<*mut sys::rte_ring> = rx.iter().map(|r| r.inner.ptr.as_ptr()).collect();
    let mut txp: Vec<*mut sys::rte_ring> = tx.iter().map(|r| r.inner.ptr.as_ptr()).collect();
    let nrx = u32::try_from(rxp.len()).unwrap_or(u32::MAX);
    let ntx = u32::try_from(txp.len()).unwrap_or(u32::MAX);
    // SAFETY: valid name and arrays of live rings, which are kept in the
    // EAL's ring-port table (below) for as long as the port can use them.
    let ret = unsafe {
        sys::rte_eth_from_rings(cname.as_ptr(), rxp.as_mut_ptr(), nrx, txp.as_mut_ptr(), ntx, eal.socket_id() as u32)
    };
    if ret < 0 {
        return Err(call_error("rte_eth_from_rings", name, 0));
    }
    let id = PortId(u16::try_from(ret).unwrap_or(u16::MAX));
    let backing = rx.iter().chain(tx).map(|r| Arc::clone(&r.inner) as PortBacking).collect();
    eal.shared().keep_ring_port(id, backing);
    Ok(id)
}

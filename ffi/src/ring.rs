//! Lock-free rings of mbufs, and ports made of rings (`rte_eth_from_rings`).
//!
//! Ring ports let tests and benchmarks inject exact packets into a port and
//! collect what comes out, through the same queue API as a real device.

use std::ffi::CString;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use sluice_dataplane::io::{Burst, BURST};

use crate::error::{call_error, Error, Result};
use crate::mbuf::{burst_u32, Mbuf};
use crate::port::PortId;
use crate::{sys, Eal};

/// A multi-producer, multi-consumer ring of mbufs.
pub struct Ring {
    ptr: NonNull<sys::rte_ring>,
    name: String,
}

// SAFETY: rte_ring enqueue/dequeue are multi-thread safe in the default
// (MP/MC) mode used here.
unsafe impl Send for Ring {}
// SAFETY: see above.
unsafe impl Sync for Ring {}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring").field("name", &self.name).field("count", &self.count()).finish()
    }
}

impl Ring {
    /// Creates a ring with room for `size - 1` mbufs (`size` a power of two).
    pub fn new(eal: &Eal, name: &str, size: u32) -> Result<Arc<Ring>> {
        let cname = CString::new(name).map_err(|_| Error::NulInArgument(name.to_owned()))?;
        // SAFETY: valid C string; the EAL is initialised.
        let p = unsafe { sys::rte_ring_create(cname.as_ptr(), size, eal.socket_id(), 0) };
        let ptr = NonNull::new(p).ok_or_else(|| call_error("rte_ring_create", format!("{name} size {size}"), 0))?;
        Ok(Arc::new(Ring { ptr, name: name.to_owned() }))
    }

    /// Mbufs waiting in the ring.
    pub fn count(&self) -> u32 {
        // SAFETY: live ring.
        unsafe { sys::sluice_ring_count(self.ptr.as_ptr()) }
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
            let n = sys::sluice_ring_enqueue_burst(self.ptr.as_ptr(), ptrs, burst_u32(len)) as usize;
            std::ptr::copy(ptrs.add(n), ptrs, len - n);
            burst.set_len(len - n);
            n
        }
    }

    /// Moves up to the burst's free capacity of mbufs out of the ring.
    pub fn dequeue(&self, burst: &mut Burst<Mbuf>) -> usize {
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

    /// Frees every mbuf still in the ring.
    pub fn drain(&self) {
        let mut b = Burst::new();
        while self.dequeue(&mut b) > 0 {
            crate::mbuf::free_burst(&mut b);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.drain();
        // SAFETY: no port uses the ring any more (the EAL keeps rings of ring
        // ports until it is cleaned up) and it is freed once.
        unsafe { sys::rte_ring_free(self.ptr.as_ptr()) };
    }
}

/// Creates an Ethernet port named `name` that receives from `rx` rings and
/// transmits into `tx` rings (one ring per queue). The rings live as long
/// as the EAL.
pub fn ring_port(eal: &Eal, name: &str, rx: &[Arc<Ring>], tx: &[Arc<Ring>]) -> Result<PortId> {
    let cname = CString::new(name).map_err(|_| Error::NulInArgument(name.to_owned()))?;
    let mut rxp: Vec<*mut sys::rte_ring> = rx.iter().map(|r| r.ptr.as_ptr()).collect();
    let mut txp: Vec<*mut sys::rte_ring> = tx.iter().map(|r| r.ptr.as_ptr()).collect();
    let nrx = u32::try_from(rxp.len()).unwrap_or(u32::MAX);
    let ntx = u32::try_from(txp.len()).unwrap_or(u32::MAX);
    // SAFETY: valid name and arrays of live rings, which are kept alive by
    // the EAL handle for as long as the port can exist.
    let ret = unsafe {
        sys::rte_eth_from_rings(cname.as_ptr(), rxp.as_mut_ptr(), nrx, txp.as_mut_ptr(), ntx, eal.socket_id() as u32)
    };
    if ret < 0 {
        return Err(call_error("rte_eth_from_rings", name, 0));
    }
    for r in rx.iter().chain(tx) {
        eal.keep_ring(Arc::clone(r));
    }
    Ok(PortId(u16::try_from(ret).unwrap_or(u16::MAX)))
}

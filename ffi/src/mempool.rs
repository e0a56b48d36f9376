//! Packet-buffer pools (`rte_pktmbuf_pool_create`).
//!
//! A pool is shared (`Arc`) by the ports that receive into it, and keeps the
//! EAL up. It is freed only when every mbuf has come back; a pool dropped
//! while mbufs are still out is leaked rather than freed under them, and so
//! is its EAL keep-alive, so that `rte_eal_cleanup` never runs under a live
//! [`Mbuf`] (which holds no reference of its own).

use std::ffi::CString;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::eal::Eal;
use crate::error::{call_error, Error, Result};
use crate::keep::{Holder, KeepAlive};
use sluice_dataplane::io::{Burst, BURST};

use crate::mbuf::{burst_u32, Mbuf};
use crate::sys;

/// A pool of packet buffers.
pub struct Mempool {
    ptr: NonNull<sys::rte_mempool>,
    name: String,
    /// Taken only by `drop`, to leak it.
    keep: Option<KeepAlive>,
}

// SAFETY: rte_mempool get/put and the count functions are multi-thread safe
// (the pool is created with the default multi-producer/multi-consumer ops).
unsafe impl Send for Mempool {}
// SAFETY: see above; `&Mempool` only exposes thread-safe operations.
unsafe impl Sync for Mempool {}

impl fmt::Debug for Mempool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mempool")
            .field("name", &self.name)
            .field("capacity", &self.capacity())
            .field("available", &self.available())
            .finish()
    }
}

/// DPDK's headroom before the packet data of each mbuf (`RTE_PKTMBUF_HEADROOM`).
pub const MBUF_HEADROOM: u16 = 128;

/// Default space for packet data in each mbuf (2048 plus DPDK's headroom).
pub const DEFAULT_DATA_ROOM: u16 = 2048 + MBUF_HEADROOM;

/// The pool's name as a C string, once the request is known to be sound.
fn check(name: &str, count: u32) -> Result<CString> {
    let cname = CString::new(name).map_err(|_| Error::NulInArgument(name.to_owned()))?;
    if count == 0 {
        return Err(Error::Call {
            call: "rte_pktmbuf_pool_create",
            what: name.to_owned(),
            errno: libc::EINVAL,
            reason: "a pool needs at least one mbuf".into(),
        });
    }
    Ok(cname)
}

impl Mempool {
    /// Creates a pool of `count` mbufs with a per-lcore cache of `cache`
    /// and `data_room` bytes of buffer each (headroom included), laid out
    /// as `rte_pktmbuf_pool_create` does: no mbuf crosses a page of the
    /// memory it is in, as a device reading physical addresses needs.
    pub fn new(eal: &Eal, name: &str, count: u32, cache: u32, data_room: u16) -> Result<Arc<Mempool>> {
        let cname = check(name, count)?;
        // SAFETY: `cname` is a valid C string; the EAL is initialised.
        let p = unsafe { sys::rte_pktmbuf_pool_create(cname.as_ptr(), count, cache, 0, data_room, eal.socket_id()) };
        Mempool::made(eal, name, p, "rte_pktmbuf_pool_create", count, data_room)
    }

    /// [`Mempool::new`], with the mbufs packed end to end across pages
    /// (`RTE_MEMPOOL_F_NO_IOVA_CONTIG`), for memory no device reads by
    /// physical address: without hugepages (`--no-huge`), where the pages
    /// are 4 KiB. There a page-bound pool spaces its 2.4 KiB mbufs 4 KiB
    /// apart, and `net_af_xdp` registers the pool with the kernel as
    /// `mbufs x mbuf size` bytes from its first: the mbufs beyond that are
    /// outside the area, and the kernel drops without a count every frame
    /// sent from one of them (of 26 frames sent on a veth, 15 leave it).
    pub fn packed(eal: &Eal, name: &str, count: u32, cache: u32, data_room: u16) -> Result<Arc<Mempool>> {
        let cname = check(name, count)?;
        let elt = u32::try_from(std::mem::size_of::<sys::rte_mbuf>()).unwrap_or(u32::MAX) + u32::from(data_room);
        let private = u32::try_from(std::mem::size_of::<sys::rte_pktmbuf_pool_private>()).unwrap_or(u32::MAX);
        // What rte_pktmbuf_pool_create does, with one more flag.
        // SAFETY: `cname` is a valid C string; the EAL is initialised.
        let p = unsafe {
            sys::rte_mempool_create_empty(
                cname.as_ptr(),
                count,
                elt,
                cache,
                private,
                eal.socket_id(),
                sys::RTE_MEMPOOL_F_NO_IOVA_CONTIG,
            )
        };
        let Some(mp) = NonNull::new(p) else {
            return Err(call_error("rte_mempool_create_empty", format!("{name}, {count} mbufs of {data_room} B"), 0));
        };
        let mut pool_private =
            sys::rte_pktmbuf_pool_private { mbuf_data_room_size: data_room, mbuf_priv_size: 0, flags: 0 };
        // SAFETY: `mp` is an empty pool made for mbufs of this size with
        // room for the private area; the operations are those
        // rte_pktmbuf_pool_create sets (the EAL's choice, a NUL-terminated
        // static string); `pool_private` outlives the call (copied into the
        // pool); rte_pktmbuf_init is the per-object initialiser
        // rte_pktmbuf_pool_create uses.
        let made = unsafe {
            let ops = sys::rte_mempool_set_ops_byname(mp.as_ptr(), sys::rte_mbuf_best_mempool_ops(), std::ptr::null_mut());
            if ops == 0 {
                sys::rte_pktmbuf_pool_init(mp.as_ptr(), std::ptr::from_mut(&mut pool_private).cast());
                let n = sys::rte_mempool_populate_default(mp.as_ptr());
                if n >= 0 {
                    sys::rte_mempool_obj_iter(mp.as_ptr(), Some(sys::rte_pktmbuf_init), std::ptr::null_mut());
                }
                ("rte_mempool_populate_default", n)
            } else {
                ("rte_mempool_set_ops_byname", ops)
            }
        };
        if made.1 < 0 {
            // SAFETY: no object of the pool was handed out.
            unsafe { sys::rte_mempool_free(mp.as_ptr()) };
            return Err(call_error(made.0, format!("{name}, {count} mbufs of {data_room} B"), made.1));
        }
        Mempool::made(eal, name, p, "rte_mempool_create_empty", count, data_room)
    }

    fn made(eal: &Eal, name: &str, p: *mut sys::rte_mempool, call: &'static str, count: u32, data_room: u16) -> Result<Arc<Mempool>> {
        let ptr = NonNull::new(p).ok_or_else(|| call_error(call, format!("{name}, {count} mbufs of {data_room} B"), 0))?;
        Ok(Arc::new(Mempool { ptr, name: name.to_owned(), keep: Some(eal.keep(Holder::Pool)) }))
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many mbufs the pool holds in all.
    pub fn capacity(&self) -> u32 {
        // SAFETY: `ptr` is a live mempool; `size` is set at creation.
        unsafe { self.ptr.as_ref().size }
    }

    /// Mbufs in the pool or its lcore caches, ready to allocate.
    pub fn available(&self) -> u32 {
        // SAFETY: `ptr` is a live mempool.
        unsafe { sys::rte_mempool_avail_count(self.ptr.as_ptr()) }
    }

    /// Mbufs handed out and not yet returned.
    pub fn in_use(&self) -> u32 {
        // SAFETY: `ptr` is a live mempool.
        unsafe { sys::rte_mempool_in_use_count(self.ptr.as_ptr()) }
    }

    /// Takes one mbuf from the pool, reset and empty.
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: `ptr` is a live packet mempool.
        let m = unsafe { sys::sluice_pktmbuf_alloc(self.ptr.as_ptr()) };
        // SAFETY: a non-null result is a freshly allocated mbuf we now own.
        NonNull::new(m).map(|m| unsafe { Mbuf::from_raw(m) })
    }

    /// Appends `n` mbufs, reset and empty, to `burst` in one call, or none
    /// when the pool has fewer than `n` free (or `burst` has less room);
    /// returns how many were added.
    pub fn alloc_bulk(&self, burst: &mut Burst<Mbuf>, n: usize) -> usize {
        self.take_bulk(burst, n, sys::sluice_pktmbuf_alloc_bulk)
    }

    /// [`Mempool::alloc_bulk`] without the reset: each mbuf is as the pool
    /// holds it, direct, alone (no next segment) and with a reference count
    /// of one, as DPDK keeps every free mbuf, but its data offset, lengths
    /// and flags are what its last user left. For a sender that sets them
    /// itself ([`Mbuf::reset_to`]), where the reset would write every field
    /// twice.
    pub fn alloc_raw_bulk(&self, burst: &mut Burst<Mbuf>, n: usize) -> usize {
        self.take_bulk(burst, n, sys::sluice_mbuf_raw_alloc_bulk)
    }

    /// Appends `n` mbufs from `get` (one of the shim's bulk allocations,
    /// which fill all `n` or none and return non-zero for none).
    fn take_bulk(
        &self,
        burst: &mut Burst<Mbuf>,
        n: usize,
        get: unsafe extern "C" fn(*mut sys::rte_mempool, *mut *mut sys::rte_mbuf, u32) -> i32,
    ) -> usize {
        let len = burst.len();
        if n == 0 || n > BURST - len {
            return 0;
        }
        // SAFETY: the `n` slots after `len` are free capacity for mbuf
        // pointers (Mbuf is repr(transparent) over a non-null pointer);
        // `get` fills all `n` or none; only on success does set_len take
        // them as owned mbufs. Both allocations hand out valid direct mbufs
        // with refcnt 1: reset ones, or raw ones that hold
        // rte_mbuf_raw_alloc's guarantees (nb_segs 1, next NULL) with a
        // stale data offset and length that still lie inside their buffer
        // (a DPDK invariant every earlier user kept).
        unsafe {
            let dst = burst.as_mut_ptr().add(len).cast::<*mut sys::rte_mbuf>();
            if get(self.ptr.as_ptr(), dst, burst_u32(n)) != 0 {
                return 0;
            }
            burst.set_len(len + n);
        }
        n
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.ptr.as_ptr()
    }
}

impl Drop for Mempool {
    fn drop(&mut self) {
        let out = self.in_use();
        if out != 0 {
            // Freeing now would leave those mbufs pointing at freed memory,
            // and so would cleaning the EAL up: keep both for good.
            eprintln!(
                "sluice-ffi: mempool {} dropped with {out} mbufs still in use; leaking it (the DPDK EAL \
                 will not be cleaned up)",
                self.name
            );
            if let Some(k) = self.keep.take() {
                k.leak();
            }
            return;
        }
        // SAFETY: every mbuf is back and no port holds the pool any more
        // (ports keep an Arc to the pools they receive into); the EAL is up
        // (`keep` is dropped after this).
        unsafe { sys::rte_mempool_free(self.ptr.as_ptr()) };
    }
}

//! The keep-alive registry: what holds the EAL up, by kind, and the
//! bookkeeping of devices that must outlive their users.
//!
//! [`EalShared`] is shared by the [`Eal`](crate::Eal) handle and every
//! [`KeepAlive`]; `rte_eal_cleanup` runs when the last reference goes (or
//! at once through [`EalShared::shut_down`] when the handle is the only
//! one). It also records which ports a [`Port`](crate::Port) owns, and the
//! rings that ring ports use until they are closed. Those rings are held
//! type-erased ([`PortBacking`]): this module only keeps them and drops
//! them, so it depends on nothing but the ids and the bindings, and every
//! module that needs the EAL can take a keep-alive from it.

use std::any::Any;
use std::ffi::{c_int, CStr, OsStr};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::ids::PortId;
use crate::sys;

/// What keeps the EAL from being cleaned up, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holders {
    /// Mempools alive.
    pub pools: usize,
    /// Mempools dropped while some of their mbufs were still out: they are
    /// leaked, and keep the EAL up for the rest of the process.
    pub leaked_pools: usize,
    /// Open ports (held by a `Port`, one of its queues or a statistics reader).
    pub ports: usize,
    /// Rings.
    pub rings: usize,
    /// Launched tasks not yet waited for.
    pub tasks: usize,
}

impl Holders {
    /// True when nothing but the [`Eal`](crate::Eal) handle holds the EAL.
    pub fn is_empty(&self) -> bool {
        *self == Holders::default()
    }
}

impl fmt::Display for Holders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = [
            (self.pools, "mempool", "mempools"),
            (self.leaked_pools, "leaked mempool (dropped with mbufs still out)", "leaked mempools (dropped with mbufs still out)"),
            (self.ports, "open port", "open ports"),
            (self.rings, "ring", "rings"),
            (self.tasks, "launched task", "launched tasks"),
        ];
        let mut first = true;
        for (n, one, many) in parts {
            if n == 0 {
                continue;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{n} {}", if n == 1 { one } else { many })?;
        }
        if first {
            f.write_str("nothing")?;
        }
        Ok(())
    }
}

/// A kind of EAL holder (an index into [`EalShared::counts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holder {
    Pool = 0,
    LeakedPool = 1,
    Port = 2,
    Ring = 3,
    Task = 4,
}

/// What a ring port receives from or sends into (one of its rings), held
/// without naming its type: the registry only keeps it until the port is
/// closed, then drops it.
pub(crate) type PortBacking = Arc<dyn Any + Send + Sync>;

/// State shared by the [`Eal`](crate::Eal) and every keep-alive. Dropping
/// the last reference cleans the EAL up.
pub(crate) struct EalShared {
    counts: [AtomicUsize; 5],
    /// Rings that ring ports send into and receive from, by port: kept until
    /// the port is closed (or the EAL cleaned up). They hold no keep-alive,
    /// so that this table does not keep the EAL up by itself.
    ring_ports: Mutex<Vec<(PortId, Vec<PortBacking>)>>,
    /// Ports a [`Port`](crate::Port) currently owns.
    open_ports: Mutex<Vec<PortId>>,
    cleaned: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl EalShared {
    /// The registry of a freshly initialised EAL: nothing holds it yet.
    pub(crate) fn new() -> EalShared {
        EalShared {
            counts: Default::default(),
            ring_ports: Mutex::new(Vec::new()),
            open_ports: Mutex::new(Vec::new()),
            cleaned: AtomicBool::new(false),
        }
    }

    /// What holds the EAL besides the [`Eal`](crate::Eal) handle.
    pub(crate) fn holders(&self) -> Holders {
        let c = |h: Holder| self.counts[h as usize].load(Ordering::SeqCst);
        Holders {
            pools: c(Holder::Pool),
            leaked_pools: c(Holder::LeakedPool),
            ports: c(Holder::Port),
            rings: c(Holder::Ring),
            tasks: c(Holder::Task),
        }
    }

    /// A keep-alive of kind `kind` for a value that needs the EAL.
    pub(crate) fn keep(self: &Arc<Self>, kind: Holder) -> KeepAlive {
        self.counts[kind as usize].fetch_add(1, Ordering::SeqCst);
        KeepAlive { shared: Arc::clone(self), kind }
    }

    /// Keeps the rings of ring port `port` until the port is closed.
    pub(crate) fn keep_ring_port(&self, port: PortId, rings: Vec<PortBacking>) {
        let mut t = lock(&self.ring_ports);
        match t.iter_mut().find(|(p, _)| *p == port) {
            Some((_, v)) => v.extend(rings),
            None => t.push((port, rings)),
        }
    }

    /// Lets go of the rings of ring port `port`, which has been closed.
    pub(crate) fn release_ring_port(&self, port: PortId) {
        let released: Vec<_> = {
            let mut t = lock(&self.ring_ports);
            let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut *t).into_iter().partition(|(p, _)| *p == port);
            *t = kept;
            gone
        };
        // Freed outside the lock: a ring frees the mbufs still in it.
        drop(released);
    }

    /// Marks `port` as owned by a `Port`; false when it already is.
    pub(crate) fn claim_port(&self, port: PortId) -> bool {
        let mut open = lock(&self.open_ports);
        if open.contains(&port) {
            return false;
        }
        open.push(port);
        true
    }

    pub(crate) fn unclaim_port(&self, port: PortId) {
        lock(&self.open_ports).retain(|p| *p != port);
    }

    /// Cleans the EAL up now when `this` is the last reference (no
    /// keep-alive exists), and gives `rte_eal_cleanup`'s return value;
    /// otherwise says what still holds it, and the EAL is cleaned up when
    /// the last holder is dropped.
    pub(crate) fn shut_down(this: Arc<EalShared>) -> Result<c_int, Holders> {
        match Arc::try_unwrap(this) {
            Ok(shared) => Ok(shared.cleanup()),
            Err(shared) => Err(shared.holders()),
        }
    }

    /// Runs `rte_eal_cleanup` once. Nothing may use DPDK afterwards.
    fn cleanup(&self) -> c_int {
        if self.cleaned.swap(true, Ordering::SeqCst) {
            return 0;
        }
        // Ring ports still open hold these rings' pointers, but their
        // driver never touches attached rings when closed, and the rings
        // must be freed while the EAL's memory is still there.
        let rings = std::mem::take(&mut *lock(&self.ring_ports));
        drop(rings);
        let runtime = primary_runtime_dir();
        // SAFETY: called from `shut_down` when no keep-alive exists, or from
        // the drop of the last reference to this state: either way no
        // mempool, port, ring or task of this crate is alive, no mbuf is
        // out (a pool dropped with mbufs out leaks its keep-alive, so this
        // never runs), and this runs once.
        let ret = unsafe { sys::rte_eal_cleanup() };
        if ret >= 0 {
            if let Some(dir) = runtime {
                remove_runtime_dir(&dir);
            }
        }
        ret
    }
}

/// The runtime directory (`/var/run/dpdk/<file-prefix>`) of this process
/// when it is DPDK's primary process for that prefix; `None` for a
/// secondary process, whose directory belongs to its primary.
fn primary_runtime_dir() -> Option<PathBuf> {
    // SAFETY: the EAL is initialised (this runs before its cleanup); both
    // calls only read the EAL's configuration.
    let (kind, dir) = unsafe { (sys::rte_eal_process_type(), sys::rte_eal_get_runtime_dir()) };
    if kind != sys::RTE_PROC_PRIMARY || dir.is_null() {
        return None;
    }
    // SAFETY: DPDK gives a NUL-terminated path that lives as long as the
    // process; it is copied at once.
    let dir = unsafe { CStr::from_ptr(dir) };
    Some(PathBuf::from(OsStr::from_bytes(dir.to_bytes())))
}

/// Removes what DPDK leaves in a primary's runtime directory after
/// `rte_eal_cleanup` (its shared `config`, the `fbarray_*` memory maps;
/// only `mp_socket` is removed by DPDK itself), then the directory, so that
/// processes that come and go do not pile directories up under
/// `/var/run/dpdk`. Only plain files are removed, and the directory only
/// when that leaves it empty; a failure leaves things as DPDK would have,
/// since nothing in this process uses them any more.
fn remove_runtime_dir(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| !t.is_dir()) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let _ = std::fs::remove_dir(dir);
}

impl Drop for EalShared {
    fn drop(&mut self) {
        let _ = self.cleanup();
    }
}

/// A `Send + Sync` reference to the EAL held by everything that needs it;
/// counted by kind for [`Eal::holders`](crate::Eal::holders).
pub(crate) struct KeepAlive {
    shared: Arc<EalShared>,
    kind: Holder,
}

impl KeepAlive {
    pub(crate) fn shared(&self) -> &EalShared {
        &self.shared
    }

    /// Never lets go of the EAL: it will not be cleaned up in this process.
    /// For a mempool dropped while some of its mbufs are still out.
    pub(crate) fn leak(self) {
        self.shared.counts[self.kind as usize].fetch_sub(1, Ordering::SeqCst);
        self.shared.counts[Holder::LeakedPool as usize].fetch_add(1, Ordering::SeqCst);
        std::mem::forget(self);
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.shared.counts[self.kind as usize].fetch_sub(1, Ordering::SeqCst);
    }
}

impl fmt::Debug for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeepAlive({:?})", self.kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_name_what_is_alive() {
        assert_eq!(Holders::default().to_string(), "nothing");
        let h = Holders { pools: 2, leaked_pools: 1, ports: 1, rings: 0, tasks: 3 };
        assert_eq!(
            h.to_string(),
            "2 mempools, 1 leaked mempool (dropped with mbufs still out), 1 open port, 3 launched tasks"
        );
        assert!(!h.is_empty());
    }
}

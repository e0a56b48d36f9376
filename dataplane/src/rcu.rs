//! Read-copy-update publication of an immutable value (the snapshot).
//!
//! Readers (workers) call [`Reader::read`] once per burst: one atomic load
//! of the generation and, only when it changed, a lock-free load of the new
//! value. That call is also the reader's quiescent point: it records the
//! generation it now uses. The writer swaps in a new value without waiting
//! and keeps the old one until every online reader has recorded a newer
//! generation; only then is it dropped, on the writer's thread, so no
//! worker ever frees a snapshot.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

#[repr(align(64))]
#[derive(Debug, Default)]
struct Slot {
    /// Generation in use at the reader's last quiescent point.
    seen: AtomicU64,
    online: AtomicBool,
}

struct Shared<T> {
    current: ArcSwap<T>,
    generation: AtomicU64,
    /// Reader registration (control path only).
    slots: Mutex<Vec<Arc<Slot>>>,
}

/// The writing side: publishes new values and frees old ones.
pub struct Publisher<T> {
    shared: Arc<Shared<T>>,
    /// Replaced values with the generation that replaced them.
    retired: Vec<(u64, Arc<T>)>,
}

impl<T> fmt::Debug for Publisher<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("generation", &self.generation())
            .field("retired", &self.retired.len())
            .finish()
    }
}

/// The reading side, one per worker.
pub struct Reader<T> {
    shared: Arc<Shared<T>>,
    slot: Arc<Slot>,
    cached: Arc<T>,
    generation: u64,
}

impl<T> fmt::Debug for Reader<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader").field("generation", &self.generation).finish()
    }
}

impl<T> Publisher<T> {
    /// Starts at generation 1 with `initial`.
    pub fn new(initial: T) -> Publisher<T> {
        Publisher {
            shared: Arc::new(Shared {
                current: ArcSwap::from_pointee(initial),
                generation: AtomicU64::new(1),
                slots: Mutex::new(Vec::new()),
            }),
            retired: Vec::new(),
        }
    }

    /// A new reader, online, using the current value.
    pub fn reader(&self) -> Reader<T> {
        let g = self.shared.generation.load(Ordering::Acquire);
        let cached = self.shared.current.load_full();
        let slot = Arc::new(Slot { seen: AtomicU64::new(g), online: AtomicBool::new(true) });
        if let Ok(mut s) = self.shared.slots.lock() {
            s.retain(|s| s.online.load(Ordering::Acquire));
            s.push(Arc::clone(&slot));
        }
        Reader { shared: Arc::clone(&self.shared), slot, cached, generation: g }
    }

    /// The current generation.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    /// The current value.
    pub fn current(&self) -> Arc<T> {
        self.shared.current.load_full()
    }

    /// Makes `next` current and returns its generation. Never waits; old
    /// values are freed by [`Publisher::reclaim`] (called here too).
    pub fn publish(&mut self, next: T) -> u64 {
        self.publish_shared(Arc::new(next))
    }

    /// [`Publisher::publish`] of a value already shared (the publisher
    /// holds one reference to it; whoever made it may keep others).
    pub fn publish_shared(&mut self, next: Arc<T>) -> u64 {
        let old = self.shared.current.swap(next);
        let g = self.shared.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.retired.push((g, old));
        self.reclaim();
        g
    }

    /// The oldest generation an online reader may still use.
    fn oldest_in_use(&self) -> u64 {
        let Ok(slots) = self.shared.slots.lock() else { return 0 };
        slots
            .iter()
            .filter(|s| s.online.load(Ordering::Acquire))
            .map(|s| s.seen.load(Ordering::Acquire))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Frees every replaced value no reader can still hold; returns how
    /// many remain.
    pub fn reclaim(&mut self) -> usize {
        let oldest = self.oldest_in_use();
        // A value retired by generation g is unused once every reader has
        // seen g or later.
        self.retired.retain(|(g, _)| *g > oldest);
        self.retired.len()
    }

    /// Replaced values not freed yet.
    pub fn pending(&self) -> usize {
        self.retired.len()
    }

    /// Waits (sleeping, up to `timeout`) until every replaced value is
    /// freed. Returns false on timeout.
    pub fn synchronize(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        while self.reclaim() > 0 {
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        true
    }
}

impl<T> Reader<T> {
    /// The current value. Also the reader's quiescent point: the value
    /// returned by the previous call must no longer be in use.
    #[inline(always)]
    pub fn read(&mut self) -> &T {
        let g = self.shared.generation.load(Ordering::Acquire);
        if g != self.generation {
            self.cached = self.shared.current.load_full();
            self.generation = g;
        }
        self.slot.seen.store(g, Ordering::Release);
        &self.cached
    }

    /// The value the last [`Reader::read`] returned, without a quiescent
    /// point: it stays valid until the next `read`.
    #[inline(always)]
    pub fn last(&self) -> &T {
        &self.cached
    }

    /// The generation of the value last returned.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Stops holding back reclamation (a worker going idle for good).
    pub fn offline(&mut self) {
        self.slot.online.store(false, Ordering::Release);
    }
}

impl<T> Drop for Reader<T> {
    fn drop(&mut self) {
        self.offline();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Tracked(u64, Arc<AtomicUsize>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn old_values_wait_for_every_reader() {
        let freed = Arc::new(AtomicUsize::new(0));
        let mut p = Publisher::new(Tracked(1, Arc::clone(&freed)));
        let mut a = p.reader();
        let mut b = p.reader();
        assert_eq!(a.read().0, 1);
        assert_eq!(p.publish(Tracked(2, Arc::clone(&freed))), 2);
        assert_eq!(freed.load(Ordering::SeqCst), 0, "readers still at generation 1");
        assert_eq!(a.read().0, 2);
        assert_eq!(p.reclaim(), 1, "b has not passed a quiescent point");
        assert_eq!(b.read().0, 2);
        assert_eq!(p.reclaim(), 0);
        assert_eq!(freed.load(Ordering::SeqCst), 1, "value 1 freed by the writer");
        p.publish(Tracked(3, Arc::clone(&freed)));
        drop(b);
        a.offline();
        assert!(p.synchronize(Duration::from_millis(10)), "offline readers do not hold values back");
        assert_eq!(freed.load(Ordering::SeqCst), 1, "a still owns its last value");
        drop(a);
        assert_eq!(freed.load(Ordering::SeqCst), 2);
        assert_eq!(p.current().0, 3);
    }
}

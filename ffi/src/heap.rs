//! The C heap (glibc malloc), which Rust's global allocator uses: how much
//! of it is free, and giving free pages back to the kernel.
//!
//! glibc keeps one arena per thread that allocated (up to eight per core)
//! and returns a freed page to the kernel only from the top of an arena.
//! A control plane that parses a 10,000-service configuration on one
//! thread and compiles it on another leaves each arena at its own peak:
//! the process grows by the transient size of each reload that lands on a
//! new thread. [`one_arena`] makes every thread share the main heap, and
//! [`release`] hands the free pages inside the arenas back.

/// What [`release`] found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Bytes free inside the arenas before (`mallinfo2().fordblks`).
    pub free: usize,
    /// Bytes in use (`mallinfo2().uordblks`).
    pub used: usize,
    /// Whether `malloc_trim` ran (only when `free` was at least the threshold).
    pub trimmed: bool,
}

/// Makes every thread that starts from now on allocate from the main heap
/// (glibc's `M_ARENA_MAX` = 1) instead of an arena of its own: call it
/// first thing in `main`, before any thread starts. For a process whose
/// allocating threads share one core, as the appliance's control threads
/// do (the workers do not allocate on the packet path), more arenas buy no
/// parallelism, and each keeps the peak of what the threads that used it
/// held (the tokio threads that handle each response change as tasks
/// move): after 200 SotW changes of 10,000 xDS clusters the appliance is
/// about 153 MiB resident with an arena per thread, 140 MiB with one
/// (`xds_scale --mode sotw`).
/// Returns whether glibc took the setting.
pub fn one_arena() -> bool {
    // SAFETY: mallopt only sets one of the allocator's parameters.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) == 1 }
}

/// Bytes free inside the heap's arenas and bytes in use.
pub fn usage() -> (usize, usize) {
    // SAFETY: mallinfo2 only reads the allocator's statistics (it takes
    // each arena's lock), and returns a plain struct.
    let mi = unsafe { libc::mallinfo2() };
    (mi.fordblks, mi.uordblks)
}

/// Bytes of heap in use: allocated inside the arenas plus allocations
/// the allocator mapped on their own (`uordblks + hblkhd`).
pub fn in_use() -> usize {
    // SAFETY: as in `usage`.
    let mi = unsafe { libc::mallinfo2() };
    mi.uordblks + mi.hblkhd
}

/// When at least `threshold` bytes are free inside the arenas, gives every
/// whole free page back to the kernel (`malloc_trim(0)`: all arenas, pages
/// in the middle too). Takes each arena's lock in turn: run it off any
/// thread that must not wait (milliseconds with hundreds of MB free).
pub fn release(threshold: usize) -> Released {
    let (free, used) = usage();
    let trimmed = free >= threshold;
    if trimmed {
        // SAFETY: malloc_trim only returns free memory of the allocator's
        // own arenas; no live allocation moves.
        unsafe {
            libc::malloc_trim(0);
        }
    }
    Released { free, used, trimmed }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_is_counted_free_and_a_trim_reports_it() {
        // 64 MiB in 64 KiB blocks (below the mmap threshold, so they live
        // in an arena and stay there when freed).
        let blocks: Vec<Vec<u8>> = (0..1024).map(|i| vec![u8::try_from(i % 251).unwrap_or(0); 64 << 10]).collect();
        let (_, used_with) = usage();
        assert!(used_with >= 64 << 20, "in use: {used_with}");
        // Keep the last block so the freed ones are not just the arena's top.
        let keep = blocks.last().cloned();
        drop(blocks);
        let r = release(usize::MAX);
        assert!(!r.trimmed, "a threshold above what is free trims nothing");
        assert!(r.free >= 32 << 20, "the freed blocks are free in the arena: {r:?}");
        let r = release(1);
        assert!(r.trimmed);
        // A block above the mmap threshold is counted in use too.
        let before = in_use();
        let big = std::hint::black_box(vec![1u8; 64 << 20]);
        assert!(in_use() >= before + (64 << 20), "{} -> {}", before, in_use());
        drop(std::hint::black_box(big));
        assert_eq!(keep.map(|k| k.len()), Some(64 << 10));
    }
}

//! A counting global allocator, for the tests and benches that prove a path allocates nothing
//! (or stays within a bound): every call is forwarded to the system allocator and counted.
//!
//! A test binary installs it once:
//!
//! ```no_run
//! use edgewatch_test_kit::alloc::CountingAllocator;
//!
//! #[global_allocator]
//! static ALLOCATOR: CountingAllocator = CountingAllocator::new();
//! ```
//!
//! Invariants:
//! - Counting never allocates: it touches atomics and a `const` thread-local without a
//!   destructor, so the allocator cannot recurse into itself.
//! - An allocation is one call of `alloc`, `alloc_zeroed` or `realloc`; `dealloc` is not one.
//! - Per-thread counts see only the calling thread, so tests and runtime threads running beside
//!   it do not disturb them; process-wide counts see every thread.
//! - Byte counts (live and peak) are kept only by [`CountingAllocator::tracking_bytes`]; a
//!   `realloc` counts the new block as live before the old one is released, as a copy would.
//! - Reading a count from an allocator that is not the global allocator panics instead of
//!   reporting a vacuous zero.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

thread_local! {
    /// Allocations made by this thread since it started.
    static THREAD_ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting allocations per thread and process-wide, and optionally the
/// live and peak heap bytes.
#[derive(Debug)]
pub struct CountingAllocator {
    /// Whether live and peak bytes are kept (two more atomic operations per call).
    track_bytes: bool,
    /// Set by the first allocation through this instance: it is the global allocator.
    installed: AtomicBool,
    /// Allocations by every thread since the process started.
    allocations: AtomicU64,
    /// Bytes allocated and not yet freed (with `track_bytes`).
    live_bytes: AtomicUsize,
    /// Highest `live_bytes` since the last [`CountingAllocator::peak_growth`] began.
    peak_bytes: AtomicUsize,
}

impl CountingAllocator {
    /// Counts allocations, per thread and process-wide.
    pub const fn new() -> Self {
        Self::with_bytes(false)
    }

    /// Counts allocations and also keeps the live and peak heap bytes.
    pub const fn tracking_bytes() -> Self {
        Self::with_bytes(true)
    }

    const fn with_bytes(track_bytes: bool) -> Self {
        Self {
            track_bytes,
            installed: AtomicBool::new(false),
            allocations: AtomicU64::new(0),
            live_bytes: AtomicUsize::new(0),
            peak_bytes: AtomicUsize::new(0),
        }
    }

    /// Allocations made by every thread since the process started.
    pub fn allocations(&self) -> u64 {
        self.assert_installed();
        self.allocations.load(Ordering::Relaxed)
    }

    /// Allocations made by the calling thread since it started.
    pub fn allocations_on_this_thread(&self) -> u64 {
        self.assert_installed();
        THREAD_ALLOCATIONS.with(Cell::get)
    }

    /// Runs `f` and returns how many allocations the calling thread made meanwhile, with `f`'s
    /// result.
    pub fn allocations_during<T>(&self, f: impl FnOnce() -> T) -> (u64, T) {
        let before = self.allocations_on_this_thread();
        let result = f();
        (self.allocations_on_this_thread() - before, result)
    }

    /// Heap bytes allocated and not yet freed, by every thread.
    ///
    /// # Panics
    /// If this allocator was not made by [`CountingAllocator::tracking_bytes`].
    pub fn live_bytes(&self) -> usize {
        self.assert_tracking_bytes();
        self.live_bytes.load(Ordering::Relaxed)
    }

    /// Runs `f` and returns its result with the peak heap growth meanwhile: the most bytes live
    /// at once above the level at the start. Every thread counts, so callers that measure in
    /// parallel must take turns.
    ///
    /// # Panics
    /// If this allocator was not made by [`CountingAllocator::tracking_bytes`].
    pub fn peak_growth<T>(&self, f: impl FnOnce() -> T) -> (T, usize) {
        self.assert_tracking_bytes();
        let base = self.live_bytes.load(Ordering::Relaxed);
        self.peak_bytes.store(base, Ordering::Relaxed);
        let out = f();
        (
            out,
            self.peak_bytes.load(Ordering::Relaxed).saturating_sub(base),
        )
    }

    fn assert_installed(&self) {
        assert!(
            self.installed.load(Ordering::Relaxed),
            "this CountingAllocator is not the #[global_allocator]: its counts would stay zero"
        );
    }

    fn assert_tracking_bytes(&self) {
        self.assert_installed();
        assert!(
            self.track_bytes,
            "byte counts need CountingAllocator::tracking_bytes()"
        );
    }

    fn count_allocation(&self) {
        if !self.installed.load(Ordering::Relaxed) {
            self.installed.store(true, Ordering::Relaxed);
        }
        self.allocations.fetch_add(1, Ordering::Relaxed);
        // `try_with`: the allocator may run while thread-locals are being torn down.
        let _ = THREAD_ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    }

    fn add_live(&self, bytes: usize) {
        if self.track_bytes {
            let live = self.live_bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
            self.peak_bytes.fetch_max(live, Ordering::Relaxed);
        }
    }

    fn remove_live(&self, bytes: usize) {
        if self.track_bytes {
            self.live_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

impl Default for CountingAllocator {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract holds as it does for `System`; counting touches only atomics and a const
// thread-local without a destructor, none of which allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.count_allocation();
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            self.add_live(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.count_allocation();
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            self.add_live(layout.size());
        }
        ptr
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.count_allocation();
        // Both blocks count as live for a moment, as when the block moves.
        self.add_live(new_size);
        // SAFETY: forwarded unchanged; the caller upholds `realloc`'s contract.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if new.is_null() {
            // The old block stays the caller's.
            self.remove_live(new_size);
        } else {
            self.remove_live(layout.size());
        }
        new
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.remove_live(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `dealloc`'s contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[global_allocator]
    static ALLOCATOR: CountingAllocator = CountingAllocator::tracking_bytes();

    #[test]
    fn an_allocation_on_this_thread_is_counted_here_and_process_wide() {
        let process_before = ALLOCATOR.allocations();
        let (n, v) = ALLOCATOR.allocations_during(|| std::hint::black_box(vec![1u8; 16]));
        assert_eq!(n, 1);
        assert_eq!(v.len(), 16);
        assert!(ALLOCATOR.allocations() > process_before);
    }

    #[test]
    fn another_threads_allocations_are_not_counted_on_this_one() {
        use std::sync::{Arc, Barrier};

        let (start, done) = (Arc::new(Barrier::new(2)), Arc::new(Barrier::new(2)));
        let other = {
            let (start, done) = (Arc::clone(&start), Arc::clone(&done));
            std::thread::spawn(move || {
                start.wait();
                let (n, _) = ALLOCATOR.allocations_during(|| std::hint::black_box(vec![0u8; 64]));
                done.wait();
                n
            })
        };
        let (here, ()) = ALLOCATOR.allocations_during(|| {
            start.wait();
            done.wait();
        });
        assert_eq!(here, 0);
        assert_eq!(other.join().unwrap(), 1);
    }

    #[test]
    fn peak_growth_sees_a_block_that_was_freed_again() {
        let ((), peak) = ALLOCATOR.peak_growth(|| {
            drop(std::hint::black_box(vec![0u8; 1 << 20]));
        });
        assert!(peak >= 1 << 20, "peak {peak}");
    }

    #[test]
    fn growing_a_vector_counts_both_blocks_at_the_peak() {
        let mut v: Vec<u8> = Vec::with_capacity(1 << 16);
        v.resize(1 << 16, 1);
        let ((), peak) = ALLOCATOR.peak_growth(|| {
            v.reserve_exact(1 << 17);
            std::hint::black_box(&v);
        });
        assert!(peak >= (1 << 16) + (1 << 17), "peak {peak}");
    }

    #[test]
    #[should_panic(expected = "not the #[global_allocator]")]
    fn an_allocator_that_is_not_installed_refuses_to_report_zero() {
        static NOT_GLOBAL: CountingAllocator = CountingAllocator::new();
        let _ = NOT_GLOBAL.allocations_during(|| ());
    }
}

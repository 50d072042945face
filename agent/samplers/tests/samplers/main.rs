//! Integration tests of the samplers against real probe files, real producer processes
//! (`edgewatch-synthetic-loop`), real manifests and engines, and a counting allocator.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod alloc;
mod bad_input;
mod model_watch;
mod probes;
mod synthetic;
mod util;

use edgewatch_test_kit::alloc::CountingAllocator;

/// Counts allocations per thread (`alloc` counts the sampler's thread only), so tests running in
/// parallel on other threads do not disturb the count.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

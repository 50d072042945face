//! Integration tests of loop-probe on real files in /dev/shm: writer and reader, hostile files,
//! the C ABI with a real C program, and allocation counting.

// Helpers here are test code too; clippy.toml allows unwrap only inside #[test] fns.
#![allow(clippy::unwrap_used)]
// The shared-memory shells do not exist in loom builds (`--cfg loom` checks `--lib` only).
#![cfg(not(loom))]

mod alloc;
mod bad_input;
mod c_abi;
mod file_io;
mod util;

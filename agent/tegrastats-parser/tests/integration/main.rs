//! Integration tests: real captures, every grammar form, property tests, and the CLI as a process.

// Helpers outside `#[test]` functions unwrap like the tests they serve (clippy.toml allows it
// only inside the test functions themselves).
#![allow(clippy::unwrap_used)]

mod captures;
#[cfg(feature = "cli")]
mod cli;
mod fixtures;
mod grammar;
mod robustness;

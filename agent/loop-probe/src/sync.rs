//! The atomics the shared layout is made of, swapped for loom's model-checked ones under `cfg(loom)`.
//!
//! Invariants:
//! - Every other module takes its atomics and fences from here, so one `--cfg loom` build checks
//!   exactly the code that ships.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, fence};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU32, AtomicU64, fence};

pub(crate) use core::sync::atomic::Ordering;

//! `loop-probe`: a control loop records every cycle into a shared-memory file; the edgewatch
//! agent maps it read-only and polls it.
//!
//! The loop side costs a handful of stores and fences per cycle: no syscalls, no locks, no
//! allocation, no waiting, and it never reads anything the agent writes (the agent writes
//! nothing). The agent side detects lost and torn records, producer restart (new epoch or
//! inode), death (the producer's `flock` is gone) and stall (stale heartbeat).
//!
//! Layout:
//! - [`layout`]: the file format (ABI v2, which extends v1), drawn as a table, with the
//!   deadline semantics; flags and autonomy modes.
//! - `sync`: the atomics, swapped for loom's under `cfg(loom)`.
//! - [`protocol`]: the seqlock, latch and ring procedures on plain references; pure.
//! - [`writer`]: the producer's I/O shell: create, size, map, lock, rename; [`ProbeWriter`].
//! - [`reader`]: the agent's I/O shell: open read-only, validate, guard, liveness; [`ProbeReader`].
//! - [`clock`]: CLOCK_MONOTONIC in nanoseconds, the time base of every timestamp.
//! - [`ffi`]: the C ABI (`include/loop_probe.h`).
//!
//! Invariants:
//! - Producer and agent share only the file; the agent's mapping is `PROT_READ` (`r--s`).
//! - Every shared word is an atomic accessed Relaxed inside fences (see [`protocol`]).
//! - The producer never shrinks the file; the agent checks its size before every read pass.

#[cfg(not(loom))]
pub mod clock;
#[cfg(not(loom))]
pub mod ffi;
pub mod layout;
pub mod protocol;
#[cfg(not(loom))]
pub mod reader;
mod sync;
#[cfg(not(loom))]
pub mod writer;

pub use layout::{
    AutonomyMode, FLAG_DEADLINE_MISS, FLAG_DEGRADED, FLAG_FALLBACK, FLAG_OVERRUN, FLAG_SKIPPED,
    recommended_capacity,
};
pub use protocol::{
    AutonomyState, Cycle, CycleCounters, EventCounters, ModelVersion, PollStats, Record, SlotBusy,
};
#[cfg(not(loom))]
pub use reader::{
    DeadlineSemantics, LastRecord, Liveness, OpenError, PollError, ProbeInfo, ProbeReader,
    ReadPass, RestartReason, Summary,
};
#[cfg(not(loom))]
pub use writer::{CreateError, MemoryLock, ProbeHandle, ProbeWriter, SetModelError, WriterConfig};

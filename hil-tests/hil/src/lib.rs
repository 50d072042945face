//! HIL timing validation: proof, on real processes, that the edgewatch agent never disturbs a
//! control loop. A ladder of levels, each stricter about the machine it needs:
//!
//! 1. invariants — deterministic, CI: no syscall in the probe's record path, read-only probe
//!    mappings, affinity off the loop core, SCHED_IDLE, no allocation and no fault in steady state.
//! 2. footprint — robust on a shared machine, CI: CPU time, wake-ups, time on a CPU per wake-up,
//!    allocations, peak RSS; preemption reported against a reference process's in the same
//!    window and by the scheduler's trace.
//! 3. interference — statistical, CI: paired agent-on/off blocks around a SCHED_FIFO loop.
//! 4. jetson — on the target only: cyclictest maxima on the isolated core, agent on vs off.
//!
//! Layout:
//! - [`levels`]: the four levels; each returns checks and numbers.
//! - [`rig`]: the agent binary, synthetic loops, a fake sysfs tree, the capture replay.
//! - [`seccomp`]: the record-under-seccomp child and its check.
//! - [`reference`]: the footprint level's reference, a SCHED_IDLE sleeper on the agent's CPUs.
//! - [`sched_trace`]: `sched_switch` of a few threads in a private tracefs instance, per wake-up.
//! - [`malloc_count`]: an `LD_PRELOAD` allocation counter built with the system C compiler.
//! - [`procfs`]: what `/proc` says about a process and the machine.
//! - [`backlog`]: a backlog submitted through the agent's local socket.
//! - [`stats`]: percentiles, block order, the paired bootstrap, the gate and its evidence rule,
//!   preemption against the reference (pure).
//! - [`cyclictest`]: cyclictest's command line, its output, the Jetson gate (pure).
//! - [`report`], [`plot`]: the Markdown report and its PNG chart.
//!
//! Invariants:
//! - Every level measures the shipped binaries from outside (`/proc`, probes, a preload
//!   counter); none asserts a property by reading code.
//! - The statistical level never decides without evidence: too few clean pairs, too small a
//!   share of the pairs run, or an interval too wide to pass or fail once every pair allowed
//!   has run, is SKIP with the reason; the maximum latency is logged and never gated on a
//!   shared machine.
//! - No level fails on the neighbours' load: the agent's time on a CPU per wake-up is gated, its
//!   preemptions (the neighbours' doing) are reported beside a reference process's.

pub mod backlog;
pub mod cyclictest;
pub mod levels;
pub mod malloc_count;
pub mod plot;
pub mod procfs;
pub mod reference;
pub mod report;
pub mod rig;
pub mod sched_trace;
pub mod seccomp;
pub mod stats;

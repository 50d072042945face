//! The ladder: each level sets up the rig, measures, and returns its findings; `report` renders
//! them. Levels 1–3 run in CI; level 4 needs a Jetson.
//!
//! Invariants:
//! - A level returns measurements and checks; it never prints and never exits.
//! - Every check carries the numbers it was decided on.

pub mod footprint;
pub mod interference;
pub mod invariants;
pub mod jetson;

use std::time::{Duration, Instant};

/// One assertion of a level, with its evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// What must hold, as a sentence.
    pub name: String,
    /// Whether it held (a skipped check did not fail).
    pub pass: bool,
    /// It could not be measured here; [`Self::detail`] says why.
    pub skipped: bool,
    /// The measured numbers behind it, or the reason for the SKIP.
    pub detail: String,
}

impl Check {
    /// A check.
    pub fn new(name: impl Into<String>, pass: bool, detail: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            pass,
            skipped: false,
            detail: detail.into(),
        }
    }

    /// A check this machine cannot make, with the reason: it neither passes nor fails the level,
    /// and the report shows SKIP.
    pub fn skip(name: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            pass: true,
            skipped: true,
            detail: reason.into(),
        }
    }
}

/// A level could not run at all (as opposed to a failed check).
#[derive(Debug, thiserror::Error)]
pub enum LevelError {
    /// Rig set-up failed.
    #[error(transparent)]
    Rig(#[from] crate::rig::RigError),
    /// Reading `/proc` failed.
    #[error(transparent)]
    Proc(#[from] crate::procfs::ProcError),
    /// The malloc counter failed.
    #[error(transparent)]
    Count(#[from] crate::malloc_count::CountError),
    /// The broker or proxy failed.
    #[error("harness: {0}")]
    Harness(#[from] edgewatch_harness::HarnessError),
    /// Filling the backlog failed.
    #[error(transparent)]
    Backlog(#[from] crate::backlog::BacklogError),
    /// Another I/O failure.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// The machine cannot run this level; the reason says why.
    #[error("{0}")]
    Unsupported(String),
}

/// Polls `check` every 20 ms until it holds or `timeout` passes.
pub(crate) fn wait_for(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// CLOCK_MONOTONIC now, ns (the probes' clock).
pub(crate) fn monotonic_ns() -> u64 {
    loop_probe::clock::monotonic_ns()
}

/// The CPUs this process may use, and the split the levels use: the last one for the loop, the
/// others for the agent. `None` with fewer than two.
pub fn cpu_split() -> Option<(Vec<usize>, usize)> {
    let mut cpus = crate::procfs::own_cpus();
    cpus.sort_unstable();
    let last = cpus.pop()?;
    (!cpus.is_empty()).then_some((cpus, last))
}

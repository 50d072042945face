//! Where and how the agent runs: pinned to its own cores, at idle CPU and I/O priority.
//!
//! The agent must never disturb a control loop: it never shares a core with one (checked before
//! anything starts), runs SCHED_IDLE (load weight 3 against 1024 for a normal task) and in the idle
//! I/O class. Child processes (tegrastats) inherit all of it.
//!
//! Invariants:
//! - `apply` fails, and the agent refuses to start, when the requested cores overlap a control-loop
//!   core or when the kernel refuses the placement; it never runs half-placed.

use std::collections::BTreeSet;

use crate::config::Scheduling;

/// Why the agent could not be placed.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// The agent's cores overlap a control-loop core.
    #[error(
        "agent core {0} is a control-loop core; the agent never shares a core with a control loop"
    )]
    SharesControlLoopCore(usize),
    /// A requested core does not exist on this machine.
    #[error("core {core} does not exist (this machine has cores 0 to {last})")]
    NoSuchCore {
        /// The core asked for.
        core: usize,
        /// Highest core id present.
        last: usize,
    },
    /// The kernel refused the CPU affinity.
    #[error("setting the CPU affinity to {0:?} failed")]
    Affinity(BTreeSet<usize>),
    /// The kernel refused SCHED_IDLE or the idle I/O class.
    #[error("{what} failed: {source}")]
    Priority {
        /// Which call failed.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// `ioprio_set` constants (linux/ioprio.h): class idle, target the calling process.
const IOPRIO_CLASS_IDLE: libc::c_int = 3;
const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
const IOPRIO_WHO_PROCESS: libc::c_int = 1;

/// Pins the calling process (all threads created afterwards inherit it) and lowers its priority.
pub fn apply(scheduling: &Scheduling) -> Result<(), PlacementError> {
    if let Some(&core) = scheduling
        .cores
        .intersection(&scheduling.control_loop_cores)
        .next()
    {
        return Err(PlacementError::SharesControlLoopCore(core));
    }
    if !scheduling.cores.is_empty() {
        pin(&scheduling.cores)?;
    }
    if scheduling.idle_priority {
        set_idle_priority()?;
    }
    Ok(())
}

fn pin(cores: &BTreeSet<usize>) -> Result<(), PlacementError> {
    let available = core_affinity::get_core_ids().unwrap_or_default();
    let last = available.iter().map(|core| core.id).max().unwrap_or(0);
    if let Some(&missing) = cores
        .iter()
        .find(|&&core| !available.iter().any(|c| c.id == core))
    {
        return Err(PlacementError::NoSuchCore {
            core: missing,
            last,
        });
    }
    // core_affinity pins to one core at a time; a set needs sched_setaffinity directly.
    // SAFETY: cpu_set_t is plain data; zeroed is its empty value.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &core in cores {
        // SAFETY: `core` exists on this machine (checked above), so it is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(core, &mut set) };
    }
    // SAFETY: pid 0 is the calling process; `set` is a valid cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc != 0 {
        return Err(PlacementError::Affinity(cores.clone()));
    }
    Ok(())
}

fn set_idle_priority() -> Result<(), PlacementError> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling process; `param` is valid for the call.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return Err(PlacementError::Priority {
            what: "sched_setscheduler(SCHED_IDLE)",
            source: std::io::Error::last_os_error(),
        });
    }
    let ioprio = IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT;
    // SAFETY: ioprio_set takes three integers and touches no memory of ours.
    if unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, ioprio) } != 0 {
        return Err(PlacementError::Priority {
            what: "ioprio_set(IOPRIO_CLASS_IDLE)",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The calling thread's scheduling policy (for status and tests).
pub fn current_policy() -> libc::c_int {
    // SAFETY: pid 0 is the calling process; no memory is passed.
    unsafe { libc::sched_getscheduler(0) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_cores_are_refused_before_anything_changes() {
        let scheduling = Scheduling {
            cores: [0, 1].into(),
            control_loop_cores: [1].into(),
            idle_priority: true,
        };
        assert!(matches!(
            apply(&scheduling),
            Err(PlacementError::SharesControlLoopCore(1))
        ));
        assert_ne!(current_policy(), libc::SCHED_IDLE);
    }

    #[test]
    fn a_core_that_does_not_exist_is_refused() {
        let scheduling = Scheduling {
            cores: [100_000].into(),
            control_loop_cores: BTreeSet::new(),
            idle_priority: false,
        };
        assert!(matches!(
            apply(&scheduling),
            Err(PlacementError::NoSuchCore { core: 100_000, .. })
        ));
    }
}

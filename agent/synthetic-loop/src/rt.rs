//! Real-time set-up and timing for the loop thread: SCHED_FIFO, CPU affinity, memory locking,
//! absolute-deadline sleeps, and SIGTERM/SIGINT as a stop flag.
//!
//! Invariants:
//! - Every failure names what was asked for and what would permit it; nothing fails silently.
//! - The signal handler only stores to an atomic; the loop checks it once per cycle, and a
//!   signal arriving during a sleep ends that sleep (EINTR) so stopping takes at most one cycle.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGTERM or SIGINT.
static STOP: AtomicBool = AtomicBool::new(false);

/// A real-time request the system refused.
#[derive(Debug, thiserror::Error)]
pub enum RtError {
    /// SCHED_FIFO refused.
    #[error(
        "SCHED_FIFO priority {priority} refused: {source}; needs root, CAP_SYS_NICE or an RLIMIT_RTPRIO \
         of at least {priority} (inside a cgroup-v1 cpu group with RT_GROUP_SCHED, also cpu.rt_runtime_us)"
    )]
    Fifo {
        /// Priority asked for.
        priority: i32,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Affinity refused.
    #[error(
        "pinning to CPU {cpu} refused: {source}; the CPU must be online and in this process's cpuset"
    )]
    Affinity {
        /// CPU asked for.
        cpu: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// mlockall refused.
    #[error("mlockall refused: {source}; needs root, CAP_IPC_LOCK or a larger RLIMIT_MEMLOCK")]
    MemoryLock {
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Installing a signal handler failed.
    #[error("installing the {signal} handler failed: {source}")]
    Signal {
        /// Signal name.
        signal: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl RtError {
    /// Process exit status for this error: 77 (EX_NOPERM) for refused privileges, 69
    /// (EX_UNAVAILABLE) for an unavailable CPU, 71 (EX_OSERR) otherwise.
    pub fn exit_code(&self) -> i32 {
        let perm = |e: &io::Error| e.kind() == io::ErrorKind::PermissionDenied;
        match self {
            RtError::Fifo { source, .. } | RtError::MemoryLock { source } if perm(source) => 77,
            RtError::Fifo { .. } | RtError::MemoryLock { .. } => 71,
            RtError::Affinity { source, .. } if perm(source) => 77,
            RtError::Affinity { .. } => 69,
            RtError::Signal { .. } => 71,
        }
    }
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Makes the calling thread SCHED_FIFO at `priority` (1..=99).
pub fn set_fifo(priority: i32) -> Result<(), RtError> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is a valid sched_param; pid 0 is the calling thread.
    check(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) })
        .map_err(|source| RtError::Fifo { priority, source })
}

/// Pins the calling thread to `cpu`.
pub fn set_affinity(cpu: usize) -> Result<(), RtError> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(RtError::Affinity {
            cpu,
            source: io::Error::from(io::ErrorKind::InvalidInput),
        });
    }
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    check(unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) })
        .map_err(|source| RtError::Affinity { cpu, source })
}

/// Locks current and future memory, then touches 256 KiB of stack so the loop takes no stack
/// page faults.
pub fn lock_memory() -> Result<(), RtError> {
    // SAFETY: mlockall takes flags only.
    check(unsafe { libc::mlockall(libc::MCL_CURRENT | libc::MCL_FUTURE) })
        .map_err(|source| RtError::MemoryLock { source })?;
    prefault_stack();
    Ok(())
}

#[inline(never)]
fn prefault_stack() {
    let mut buf = [0u8; 256 * 1024];
    for b in buf.iter_mut().step_by(4096) {
        // A volatile write per page so the compiler cannot drop the array.
        // SAFETY: `b` is a valid, aligned, exclusive reference into `buf`.
        unsafe { std::ptr::write_volatile(b, 1) };
    }
    std::hint::black_box(&buf);
}

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Routes SIGTERM and SIGINT to the stop flag (without SA_RESTART, so sleeps are cut short).
pub fn install_stop_handlers() -> Result<(), RtError> {
    for (sig, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        // SAFETY: an all-zero sigaction is valid; we fill in the handler and an empty mask.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: `sa.sa_mask` is a valid sigset_t.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: the handler is async-signal-safe (one atomic store); `sa` is valid.
        check(unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) }).map_err(|source| {
            RtError::Signal {
                signal: name,
                source,
            }
        })?;
    }
    Ok(())
}

/// Whether SIGTERM or SIGINT arrived.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// Now on CLOCK_MONOTONIC, ns.
pub fn now_ns() -> u64 {
    loop_probe::clock::monotonic_ns()
}

/// Sleeps until `deadline_ns` on CLOCK_MONOTONIC (absolute). Returns false if a stop signal
/// cut the sleep short.
pub fn sleep_until(deadline_ns: u64) -> bool {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; the remaining-time pointer may be null with
        // TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if rc == 0 {
            return true;
        }
        if rc == libc::EINTR {
            if stop_requested() {
                return false;
            }
            continue;
        }
        // EINVAL cannot happen for a valid timespec; treat as "deadline passed".
        return true;
    }
}

/// Busy-spins until `deadline_ns` (work that overruns on purpose).
pub fn spin_until(deadline_ns: u64) {
    while now_ns() < deadline_ns {
        std::hint::spin_loop();
    }
}

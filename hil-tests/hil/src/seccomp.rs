//! Proof that the probe's record path makes no syscall: a child process creates a probe, enters
//! seccomp strict mode (only `read`, `write`, `_exit` and `sigreturn` allowed; anything else
//! kills it with SIGKILL), records N cycles through `ProbeWriter::record`, writes one line and
//! leaves with a raw `exit` syscall. The parent then checks the exit status and reads the N
//! records back through `ProbeReader`. A control run makes one `getpid` after recording and must
//! be killed, which shows the filter is in force.
//!
//! Invariants:
//! - After `prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT)` the child calls nothing but `record`,
//!   one `write(1, ...)` and `syscall(SYS_exit)`: no allocation, no formatting, no std I/O.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use loop_probe::{Cycle, MemoryLock, ProbeReader, ProbeWriter, WriterConfig};

/// The line the child writes after recording.
pub const DONE: &[u8] = b"recorded\n";

/// The child side (`edgewatch-hil seccomp-record`). Returns only on a set-up error.
pub fn child(probe: &Path, count: u64, syscall_after: bool) -> std::io::Error {
    let mut config = WriterConfig::new(7, "seccomp", 1_000_000, 1_000_000);
    config.capacity = 4096;
    config.memory_lock = MemoryLock::BestEffort;
    let mut writer = match ProbeWriter::create(probe, &config) {
        Ok(writer) => writer,
        Err(error) => return std::io::Error::other(error.to_string()),
    };
    // Touch every slot once so that strict mode starts with the ring resident (page faults are
    // not syscalls, but this keeps the measured loop identical to a warm control loop's).
    for k in 0..u64::from(config.capacity) {
        writer.record(&cycle(k));
    }
    // SAFETY: prctl with integer arguments only.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_STRICT as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if rc != 0 {
        return std::io::Error::last_os_error();
    }
    let first = u64::from(config.capacity);
    for k in first..first + count {
        writer.record(&cycle(k));
    }
    if syscall_after {
        // SAFETY: getpid takes no arguments; under strict seccomp it kills the process.
        unsafe { libc::syscall(libc::SYS_getpid) };
    }
    // SAFETY: write(2) of a static buffer to stdout, then exit(2) of this (only) thread; nothing
    // runs after it.
    unsafe {
        libc::write(1, DONE.as_ptr().cast(), DONE.len());
        libc::syscall(libc::SYS_exit, 0);
    }
    std::io::Error::other("exit returned")
}

fn cycle(k: u64) -> Cycle {
    let release_ns = 1_000_000_000 + k * 1_000_000;
    Cycle {
        cycle: k,
        release_ns,
        start_ns: release_ns + 20_000,
        duration_ns: 50_000,
        flags: 0,
    }
}

/// What the parent saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeccompOutcome {
    /// Records made under strict mode.
    pub recorded_under_seccomp: u64,
    /// Cycles the probe's summary counts (warm-up included).
    pub summary_cycles: u64,
    /// The child exited 0 after writing its line.
    pub clean_exit: bool,
    /// The control child (one `getpid` after recording) was killed by SIGKILL.
    pub control_killed: bool,
    /// Exit details, for the report.
    pub detail: String,
}

impl SeccompOutcome {
    /// Proven: the run was clean, every record is in the probe, and the control was killed.
    pub fn proven(&self) -> bool {
        self.clean_exit
            && self.control_killed
            && self.summary_cycles == self.recorded_under_seccomp + 4096
    }
}

/// Runs the child (and the control) from `hil` with probes in `dir`.
pub fn check(hil: &Path, dir: &Path, count: u64) -> std::io::Result<SeccompOutcome> {
    let run = |name: &str, syscall_after: bool| {
        let probe = dir.join(name);
        let mut command = Command::new(hil);
        command
            .arg("seccomp-record")
            .arg("--probe")
            .arg(&probe)
            .args(["--count", &count.to_string()]);
        if syscall_after {
            command.arg("--syscall-after");
        }
        command.output().map(|output| (probe, output))
    };
    let (probe, output) = run("seccomp.probe", false)?;
    let clean_exit = output.status.success() && output.stdout == DONE;
    let summary_cycles = ProbeReader::open(&probe)
        .ok()
        .and_then(|reader| reader.summary().ok())
        .map_or(0, |summary| summary.cycles.cycles);
    let (_, control) = run("seccomp-control.probe", true)?;
    let control_killed = control.status.signal() == Some(libc::SIGKILL);
    Ok(SeccompOutcome {
        recorded_under_seccomp: count,
        summary_cycles,
        clean_exit,
        control_killed,
        detail: format!(
            "child: {} (stdout {:?}, stderr {:?}); control: {}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr).trim(),
            control.status
        ),
    })
}

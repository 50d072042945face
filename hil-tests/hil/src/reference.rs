//! The reference process of the footprint level: a SCHED_IDLE sleeper on the agent's CPUs with
//! the agent's wake-up pattern, so that the preemptions the neighbours cause are measured in the
//! same window, on the same CPUs, at the same policy, and the agent is charged only with its own.
//!
//! ```text
//! every 1/rate s (absolute, CLOCK_MONOTONIC):  wake ─► burn `work` of its own CPU time ─► sleep
//! ```
//!
//! Invariants:
//! - The work is measured in the sleeper's own CPU time (`CLOCK_THREAD_CPUTIME_ID`), so a
//!   preempted wake-up still costs the same CPU, as the agent's would.
//! - The child never exits by itself; its handle kills and reaps it on drop.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::rig::{RigError, pin_self};

/// The child side (`edgewatch-hil reference-sleeper`): pins itself to `cpus`, switches to
/// SCHED_IDLE and wakes `rate_hz` times a second, each time burning `work` of CPU time. Returns
/// only on a set-up error.
pub fn child(cpus: &[usize], rate_hz: f64, work: Duration) -> std::io::Error {
    if !cpus.is_empty()
        && let Err(error) = pin_self(cpus)
    {
        return std::io::Error::other(error.to_string());
    }
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler on the calling thread with a valid parameter block.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return std::io::Error::last_os_error();
    }
    if !(rate_hz.is_finite() && rate_hz > 0.0) {
        return std::io::Error::other(format!("rate {rate_hz} Hz is not a positive rate"));
    }
    let period_ns = (1e9 / rate_hz) as u64;
    let work_ns = work.as_nanos() as u64;
    let mut next = clock_ns(libc::CLOCK_MONOTONIC) + period_ns;
    loop {
        let ts = libc::timespec {
            tv_sec: (next / 1_000_000_000) as libc::time_t,
            tv_nsec: (next % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: an absolute sleep on CLOCK_MONOTONIC with a valid timespec; EINTR just wakes
        // early, which the loop tolerates.
        unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        let started = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        while clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(started) < work_ns {
            std::hint::spin_loop();
        }
        next += period_ns;
        let now = clock_ns(libc::CLOCK_MONOTONIC);
        if next <= now {
            // Woken late by more than a period (starved): keep the rate, drop the missed ones.
            next = now + period_ns;
        }
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A running reference sleeper.
pub struct ReferenceSleeper {
    child: Child,
}

impl ReferenceSleeper {
    /// Starts `edgewatch-hil reference-sleeper` and waits until it runs at SCHED_IDLE.
    pub fn start(
        hil: &Path,
        cpus: &[usize],
        rate_hz: f64,
        work: Duration,
    ) -> Result<Self, RigError> {
        let cpu_list = cpus
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut command = Command::new(hil);
        command
            .arg("reference-sleeper")
            .args(["--rate-hz", &format!("{rate_hz:.3}")])
            .args(["--work-us", &work.as_micros().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if !cpu_list.is_empty() {
            command.args(["--cpus", &cpu_list]);
        }
        let child = command.spawn().map_err(|source| RigError::Io {
            context: format!("starting {} reference-sleeper", hil.display()),
            source,
        })?;
        let mut sleeper = Self { child };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = sleeper.child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut err) = sleeper.child.stderr.take() {
                    use std::io::Read;
                    let _ = err.read_to_string(&mut stderr);
                }
                return Err(RigError::NotStarted {
                    what: "the reference sleeper".into(),
                    detail: format!("{status}: {}", stderr.trim()),
                });
            }
            let policies = crate::procfs::policies(sleeper.pid()).unwrap_or_default();
            if !policies.is_empty() && policies.iter().all(|&(_, p)| p == libc::SCHED_IDLE) {
                return Ok(sleeper);
            }
            if Instant::now() > deadline {
                return Err(RigError::NotStarted {
                    what: "the reference sleeper".into(),
                    detail: "not at SCHED_IDLE after 10 s".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ReferenceSleeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! The scheduler's own account of a few threads: a private tracefs instance records
//! `sched:sched_switch` for them only, and [`parse`] turns it into what each thread did per
//! wake-up (its time on a CPU from waking to sleeping again) and who preempted it, after how
//! much of that wake-up.
//!
//! ```text
//! start: mkdir <tracefs>/instances/edgewatch-hil-<pid>-<n>, filter on the threads, enable
//!   ... window ...
//! finish: disable, check no event was overwritten, read `trace`, rmdir
//! ```
//!
//! Invariants:
//! - Only the instance this process created is touched: the global trace and other instances
//!   stay as they were; the instance is removed on drop.
//! - A trace that lost events (a ring buffer overrun) is refused, never summarised: an
//!   incomplete trace would under-count long wake-ups.
//! - A wake-up is counted only between two switch-outs to sleep that the trace saw, so the
//!   wake-ups cut by the start and the end of the window are left out.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Why no trace could be taken or read (the level then reports the check as SKIP with this).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// No tracefs mount, and none could be made.
    #[error(
        "no tracefs: not mounted at /sys/kernel/tracing or /sys/kernel/debug/tracing ({0}); scheduler tracing needs root or a mounted tracefs"
    )]
    NoTracefs(String),
    /// A tracefs file could not be written or read.
    #[error("tracefs {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The ring buffer overwrote events: the trace is incomplete.
    #[error("the trace lost {0} events (ring buffer overrun)")]
    Overrun(u64),
}

/// A running trace of `sched_switch` for some threads.
pub struct SchedTrace {
    instance: PathBuf,
    tids: Vec<u32>,
}

/// Ring buffer per CPU and second of window, KiB: a thread waking 100 times a second and
/// preempted as often makes about 300 switch events a second, ~70 bytes each; this holds three
/// such threads on one CPU.
const BUFFER_KIB_PER_S: u64 = 64;
/// Bounds of the per-CPU buffer, KiB (the kernel allocates it on every CPU).
const BUFFER_KIB_MIN: u64 = 1024;
const BUFFER_KIB_MAX: u64 = 65_536;

impl SchedTrace {
    /// Starts tracing `sched_switch` events in which one of `tids` is switched out or in, with
    /// ring buffers sized for a window of `window` (a longer one may overrun, which
    /// [`Self::finish`] reports).
    pub fn start(tids: &[u32], window: std::time::Duration) -> Result<Self, TraceError> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let root = tracefs()?;
        let instance = root.join("instances").join(format!(
            "edgewatch-hil-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        // A run killed before its drop left its instance behind, and this pid came round again.
        let _ = std::fs::remove_dir(&instance);
        std::fs::create_dir(&instance).map_err(|source| TraceError::Io {
            path: instance.clone(),
            source,
        })?;
        let trace = Self {
            instance,
            tids: tids.to_vec(),
        };
        let buffer_kib = (window.as_secs().saturating_add(1) * BUFFER_KIB_PER_S)
            .clamp(BUFFER_KIB_MIN, BUFFER_KIB_MAX);
        trace.write("buffer_size_kb", &buffer_kib.to_string())?;
        let filter = tids
            .iter()
            .map(|t| format!("prev_pid == {t} || next_pid == {t}"))
            .collect::<Vec<_>>()
            .join(" || ");
        trace.write("events/sched/sched_switch/filter", &filter)?;
        trace.write("events/sched/sched_switch/enable", "1")?;
        trace.write("tracing_on", "1")?;
        Ok(trace)
    }

    /// Stops the trace and summarises each traced thread, in the order given to
    /// [`Self::start`].
    pub fn finish(self) -> Result<Vec<TaskRuns>, TraceError> {
        self.write("tracing_on", "0")?;
        let mut overrun = 0;
        let per_cpu = self.instance.join("per_cpu");
        let cpus = std::fs::read_dir(&per_cpu).map_err(|source| TraceError::Io {
            path: per_cpu.clone(),
            source,
        })?;
        for cpu in cpus.flatten() {
            let stats = std::fs::read_to_string(cpu.path().join("stats")).unwrap_or_default();
            overrun += stats
                .lines()
                .find_map(|l| l.strip_prefix("overrun:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0);
        }
        if overrun > 0 {
            return Err(TraceError::Overrun(overrun));
        }
        let path = self.instance.join("trace");
        let text = std::fs::read_to_string(&path).map_err(|source| TraceError::Io {
            path: path.clone(),
            source,
        })?;
        if let Some(keep) = std::env::var_os("EDGEWATCH_HIL_KEEP_TRACE") {
            // Best effort: the raw trace, for reading a surprising summary by hand.
            let _ = std::fs::write(keep, &text);
        }
        Ok(parse(&text, &self.tids))
    }

    fn write(&self, file: &str, value: &str) -> Result<(), TraceError> {
        let path = self.instance.join(file);
        std::fs::write(&path, value).map_err(|source| TraceError::Io { path, source })
    }
}

impl Drop for SchedTrace {
    fn drop(&mut self) {
        let _ = std::fs::write(self.instance.join("events/sched/sched_switch/enable"), "0");
        let _ = std::fs::remove_dir(&self.instance);
    }
}

/// The tracefs mount: an existing one, else (as root) tracefs mounted at /sys/kernel/tracing.
fn tracefs() -> Result<PathBuf, TraceError> {
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if Path::new(dir).join("instances").is_dir() {
            return Ok(dir.into());
        }
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: mount(2) with NUL-terminated strings and no data; it fails cleanly without root.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc == 0 && Path::new("/sys/kernel/tracing/instances").is_dir() {
        return Ok("/sys/kernel/tracing".into());
    }
    Err(TraceError::NoTracefs(format!(
        "mounting it failed: {}",
        std::io::Error::last_os_error()
    )))
}

/// What the trace says of one thread.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskRuns {
    /// The thread.
    pub tid: u32,
    /// Time on a CPU per complete wake-up (from its first switch-in to the switch-out that put
    /// it to sleep, preemptions excluded), ns, sorted ascending.
    pub wake_up_cpu_ns: Vec<u64>,
    /// Times it was switched out while runnable (preempted).
    pub preemptions: u64,
    /// Who took the CPU on those preemptions: task name and count, most frequent first.
    pub preempted_by: Vec<(String, u64)>,
}

impl TaskRuns {
    /// The `q` quantile (0..=1) of the time on a CPU per wake-up, ns; 0 without wake-ups.
    pub fn wake_up_cpu_quantile(&self, q: f64) -> u64 {
        let n = self.wake_up_cpu_ns.len();
        if n == 0 {
            return 0;
        }
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        self.wake_up_cpu_ns[rank - 1]
    }

    /// The longest wake-up, ns.
    pub fn longest_wake_up_ns(&self) -> u64 {
        self.wake_up_cpu_ns.last().copied().unwrap_or(0)
    }
}

/// One `sched_switch` line: timestamp (ns), prev_pid, prev_state, next_comm, next_pid.
fn switch_fields(line: &str) -> Option<(u64, u32, &str, &str, u32)> {
    let (head, event) = line.split_once(": sched_switch: ")?;
    let stamp = head.split_whitespace().last()?;
    let (secs, frac) = stamp.split_once('.').unwrap_or((stamp, "0"));
    let frac_ns = format!("{frac:0<9}");
    let ts = secs.parse::<u64>().ok()? * 1_000_000_000 + frac_ns.get(..9)?.parse::<u64>().ok()?;
    let (prev, next) = event.split_once(" ==> ")?;
    let prev_pid = field(prev, "prev_pid=")?.parse().ok()?;
    let prev_state = field(prev, "prev_state=")?;
    let next_pid_at = next.rfind(" next_pid=")?;
    let next_comm = next.get(..next_pid_at)?.strip_prefix("next_comm=")?;
    let next_pid = field(&next[next_pid_at..], "next_pid=")?.parse().ok()?;
    Some((ts, prev_pid, prev_state, next_comm, next_pid))
}

/// The whitespace-delimited value after the last `key` in `text`.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let at = text.rfind(key)? + key.len();
    text[at..].split_whitespace().next()
}

/// Summarises a tracefs `trace` text for each of `tids` (in that order). Lines that are not
/// `sched_switch` events (the header, comments) are skipped.
pub fn parse(text: &str, tids: &[u32]) -> Vec<TaskRuns> {
    #[derive(Default)]
    struct State {
        on_cpu_since: Option<u64>,
        current_ns: u64,
        slept_before: bool,
        by: HashMap<String, u64>,
        runs: TaskRuns,
    }
    let mut states: Vec<State> = tids
        .iter()
        .map(|&tid| State {
            runs: TaskRuns {
                tid,
                ..TaskRuns::default()
            },
            ..State::default()
        })
        .collect();
    for (ts, prev_pid, prev_state, next_comm, next_pid) in text.lines().filter_map(switch_fields) {
        if let Some(s) = states.iter_mut().find(|s| s.runs.tid == prev_pid) {
            if let Some(since) = s.on_cpu_since.take() {
                s.current_ns += ts.saturating_sub(since);
            }
            if prev_state.starts_with('R') {
                s.runs.preemptions += 1;
                *s.by.entry(next_comm.to_owned()).or_default() += 1;
            } else {
                if s.slept_before {
                    s.runs.wake_up_cpu_ns.push(s.current_ns);
                }
                s.current_ns = 0;
                s.slept_before = true;
            }
        }
        if let Some(s) = states.iter_mut().find(|s| s.runs.tid == next_pid) {
            s.on_cpu_since = Some(ts);
        }
    }
    states
        .into_iter()
        .map(|mut s| {
            s.runs.wake_up_cpu_ns.sort_unstable();
            let mut by: Vec<_> = s.by.into_iter().collect();
            by.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            s.runs.preempted_by = by;
            s.runs
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as this kernel's tracefs prints them (6.18, `trace` of an instance).
    const TRACE: &str = "\
# tracer: nop
#
# entries-in-buffer/entries-written: 9/9   #P:2
#
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
#              | |         |   |||||     |         |
 edgewatch-agent-10449   [000] d..2. 47005.000100: sched_switch: prev_comm=edgewatch-agent prev_pid=10449 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
          <idle>-0       [000] d..2. 47005.010000: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=edgewatch-agent next_pid=10449 next_prio=120
 edgewatch-agent-10449   [000] d..2. 47005.010040: sched_switch: prev_comm=edgewatch-agent prev_pid=10449 prev_prio=120 prev_state=R+ ==> next_comm=kworker/0:2 next_pid=77 next_prio=120
     kworker/0:2-77      [000] d..2. 47005.010060: sched_switch: prev_comm=kworker/0:2 prev_pid=77 prev_prio=120 prev_state=I ==> next_comm=edgewatch-agent next_pid=10449 next_prio=120
 edgewatch-agent-10449   [000] d..2. 47005.010080: sched_switch: prev_comm=edgewatch-agent prev_pid=10449 prev_prio=120 prev_state=S ==> next_comm=swapper/0 next_pid=0 next_prio=120
          <idle>-0       [000] d..2. 47005.020000: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=edgewatch-agent next_pid=10449 next_prio=120
 edgewatch-agent-10449   [000] d..2. 47005.021500: sched_switch: prev_comm=edgewatch-agent prev_pid=10449 prev_prio=120 prev_state=R ==> next_comm=my neighbour next_pid=88 next_prio=120
    my neighbour-88      [000] d..2. 47005.021520: sched_switch: prev_comm=my neighbour prev_pid=88 prev_prio=120 prev_state=S ==> next_comm=edgewatch-agent next_pid=10449 next_prio=120
 edgewatch-agent-10449   [000] d..2. 47005.022000: sched_switch: prev_comm=edgewatch-agent prev_pid=10449 prev_prio=120 prev_state=D ==> next_comm=swapper/0 next_pid=0 next_prio=120
          <idle>-0       [000] d..2. 47005.030000: sched_switch: prev_comm=swapper/0 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=edgewatch-agent next_pid=10449 next_prio=120
";

    #[test]
    fn wake_ups_sum_their_runs_and_preemptions_name_who_took_the_cpu() {
        let runs = parse(TRACE, &[10449, 4242]);
        assert_eq!(runs.len(), 2);
        let agent = &runs[0];
        // The first switch-out has no switch-in before it, the last switch-in no end: only the
        // two complete wake-ups count, preemptions excluded from their time on a CPU.
        assert_eq!(agent.wake_up_cpu_ns, vec![60_000, 1_980_000]);
        assert_eq!(agent.preemptions, 2);
        assert_eq!(
            agent.preempted_by,
            vec![
                ("kworker/0:2".to_string(), 1),
                ("my neighbour".to_string(), 1)
            ]
        );
        assert_eq!(agent.wake_up_cpu_quantile(0.5), 60_000);
        assert_eq!(agent.wake_up_cpu_quantile(0.99), 1_980_000);
        assert_eq!(agent.longest_wake_up_ns(), 1_980_000);
        assert_eq!(
            runs[1],
            TaskRuns {
                tid: 4242,
                ..TaskRuns::default()
            }
        );
    }

    #[test]
    fn lines_that_are_not_switch_events_are_skipped() {
        let text = "garbage\n: sched_switch: \n  x-1 [000] d..2. nan: sched_switch: prev_comm=a prev_pid=1 prev_prio=1 prev_state=S ==> next_comm=b next_pid=2 next_prio=1\n";
        assert_eq!(
            parse(text, &[1]),
            vec![TaskRuns {
                tid: 1,
                ..TaskRuns::default()
            }]
        );
    }

    #[test]
    fn a_trace_of_this_kernel_records_a_sleeping_thread_when_tracefs_is_there() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() } as u32;
        let trace = match SchedTrace::start(&[me], std::time::Duration::from_secs(1)) {
            Ok(t) => t,
            Err(e) if !root => {
                println!("SKIP scheduler trace: {e} (not root)");
                return;
            }
            Err(e) => panic!("root, yet no scheduler trace: {e}"),
        };
        for _ in 0..20 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let runs = trace.finish().unwrap();
        assert!(
            runs[0].wake_up_cpu_ns.len() >= 15,
            "20 sleeps, {} complete wake-ups traced",
            runs[0].wake_up_cpu_ns.len()
        );
    }
}

//! Level 1, invariants: deterministic properties of the real processes, measured, not read from
//! code.
//!
//! 1. `ProbeWriter::record` makes no syscall: 10⁶ records under seccomp strict mode
//!    ([`crate::seccomp`]).
//! 2. The agent maps every probe read-only and shared (`r--s` in `/proc/<pid>/maps`).
//! 3. Every agent thread's `Cpus_allowed_list` excludes the control-loop core.
//! 4. Every agent thread runs SCHED_IDLE.
//! 5. Steady state makes no heap allocation and takes no minor fault.
//!
//! **Steady state** (the definition this level asserts): the agent sampling two 1 kHz probes at
//! 100 Hz, a fake sysfs tree every 100 ms and a tegrastats replay at 10 lines/s, writing its
//! status files every second, with the uplink offline between two reconnection attempts (the
//! days-offline case; the attempts themselves are at most one per `uplink.backoff_max_ms`, 5 min
//! in production), after a warm-up that covers a full lap of every probe ring and a full pass of
//! the capture, and while no event is due (periodic snapshots and counters are set to their
//! longest interval, so nothing is committed to the queue in the window). Committing events and
//! draining them are not steady state: the drain path's allocations are measured and reported
//! separately (not gated), over a backlog sent through a real broker.
//!
//! Invariants:
//! - Counting happens outside the measured code: an `LD_PRELOAD` counter and `/proc`, on the
//!   shipped agent binary.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::proxy::{Fault, FaultProxy};

use super::{Check, LevelError, cpu_split, wait_for};
use crate::malloc_count::{self, Counts, MallocCounter};
use crate::procfs;
use crate::rig::{
    AgentSpec, Binaries, FakeSysfs, LoopProcess, LoopSpec, ProbeSpec, RigAgent, dead_port,
    default_capture, orin_sysfs, scratch,
};
use crate::seccomp::{self, SeccompOutcome};

/// Settings of level 1.
#[derive(Debug, Clone)]
pub struct InvariantsConfig {
    /// Time before the steady-state window.
    pub warm_up: Duration,
    /// The steady-state window.
    pub window: Duration,
    /// Windows tried at most: a window in which the agent's queue took an event is not steady
    /// state (see [`SteadyState::discarded`]) and another is measured.
    pub max_windows: usize,
    /// Records made under seccomp.
    pub seccomp_records: u64,
    /// Events in the drain measurement's backlog (0 skips it).
    pub drain_events: usize,
    /// The tegrastats capture to replay.
    pub capture: PathBuf,
}

impl Default for InvariantsConfig {
    fn default() -> Self {
        Self {
            warm_up: Duration::from_secs(6),
            window: Duration::from_secs(10),
            max_windows: 3,
            seccomp_records: 1_000_000,
            drain_events: 2_000,
            capture: default_capture(),
        }
    }
}

/// The relative deadline of the steady-state loops: half a second, far beyond any wake-up delay
/// of a loaded machine, so that no deadline miss (a safety event) falls in the window.
pub const STEADY_STATE_DEADLINE_MS: f64 = 500.0;

/// The steady-state window's numbers.
#[derive(Debug, Clone, Default)]
pub struct SteadyState {
    /// Window length, s.
    pub window_s: f64,
    /// Allocations during start-up and warm-up (shows the counter counts).
    pub warm_up_allocations: u64,
    /// Allocations in the window.
    pub allocations: Counts,
    /// Minor faults in the window.
    pub minor_faults: u64,
    /// Major faults in the window.
    pub major_faults: u64,
    /// Threads of the agent.
    pub threads: u64,
    /// Probe records the two loops wrote during the window (work the agent had to do).
    pub cycles_in_window: u64,
    /// Windows measured before this one and set aside: because the agent's queue took events in
    /// them (a deadline miss or a ring overrun when the SCHED_IDLE agent was starved of CPU by
    /// other processes), or because the agent took page faults, without allocating, while the
    /// kernel reclaimed, migrated or collapsed pages (work that unmaps pages the agent did not
    /// give up: a neighbour's memory pressure, not the agent's doing). Each with what it held.
    pub discarded: Vec<String>,
    /// Events the agent's queue took in this window, by its status snapshot (0 in steady state;
    /// `None` if there was no snapshot to read).
    pub events_in_window: Option<u64>,
    /// What the agent logged during this window (its last 2,000 bytes; empty in steady state).
    pub log_in_window: String,
    /// The malloc-family calls of the window, each with its time after the window's start and
    /// its size ([`crate::malloc_count::Trace::describe`]; empty when there were none).
    pub allocation_trace: String,
    /// Seconds the agent was runnable but kept off a core by other processes during the window
    /// (`None` if `/proc/<pid>/task/*/schedstat` could not be read). A SCHED_IDLE agent on a
    /// busy machine can wait long enough for a probe ring to overrun (an event).
    pub run_queue_wait_s: Option<f64>,
    /// The kernel's page work during this window, system-wide (`None` if `/proc/vmstat` could
    /// not be read).
    pub page_work_in_window: Option<procfs::PageWork>,
}

impl SteadyState {
    /// Why this window says nothing of the agent's own steady state, if it does not: the queue
    /// took events in it, or the agent took page faults without allocating while the kernel
    /// took pages away (faults with allocations, or with no such kernel work, are the agent's).
    /// A window without a queue snapshot or a `/proc/vmstat` reading is judged as it is.
    pub fn reason_to_set_aside(&self) -> Option<String> {
        let events = self.events_in_window.unwrap_or(0);
        let faults = self.minor_faults + self.major_faults;
        let kernel_took_pages = faults > 0
            && self.allocations.allocations == 0
            && self.page_work_in_window.is_some_and(|work| work.any());
        (events > 0 || kernel_took_pages).then(|| {
            format!(
                "{events} events taken, {} allocations, {} minor and {} major faults, the kernel: {}",
                self.allocations.allocations,
                self.minor_faults,
                self.major_faults,
                self.page_work_in_window
                    .map_or_else(|| "unknown".to_owned(), |work| work.to_string())
            )
        })
    }

    /// The windows set aside before this one, for a report: "none", or each with what it held.
    pub fn windows_set_aside(&self) -> String {
        if self.discarded.is_empty() {
            "none".to_owned()
        } else {
            self.discarded.join("; ")
        }
    }
}

/// How long after a window the level waits for a queue status snapshot (rewritten every second,
/// later when the idle-priority agent waits for a busy core) written after the window's end.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(15);

/// The last `max` bytes of `text` (from a character boundary).
fn last_bytes(text: &str, max: usize) -> String {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}

/// Events the agent's queue has taken since it started, all tiers (durable or pending), from its
/// status snapshot; `None` while there is none to read.
fn events_taken(queue_status: &std::path::Path) -> Option<u64> {
    events_taken_as_of(queue_status).map(|(events, _)| events)
}

/// [`events_taken`] with the snapshot's time (ms since the Unix epoch).
fn events_taken_as_of(queue_status: &std::path::Path) -> Option<(u64, u64)> {
    let status = edgewatch_queue::read_snapshot(queue_status).ok()?;
    let events = status
        .tiers
        .iter()
        .map(|(_, tier)| tier.durable_seq + tier.pending)
        .sum();
    Some((events, status.as_of_unix_ms))
}

/// [`events_taken`] by the first snapshot written at or after `not_before_unix_ms`, waiting up to
/// `wait` for it: an older snapshot would miss an event at the window's end. `None` when none
/// came.
fn events_taken_after(
    queue_status: &std::path::Path,
    not_before_unix_ms: u64,
    wait: Duration,
) -> Option<u64> {
    let deadline = Instant::now() + wait;
    loop {
        match events_taken_as_of(queue_status) {
            Some((events, as_of)) if as_of >= not_before_unix_ms => return Some(events),
            _ if Instant::now() >= deadline => return None,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the drain path cost (reported, not gated).
#[derive(Debug, Clone, Default)]
pub struct DrainCost {
    /// Events drained.
    pub events: u64,
    /// Batches acknowledged.
    pub batches: u64,
    /// Seconds from link-up to the last acknowledgement.
    pub seconds: f64,
    /// Allocations (reconnection included).
    pub allocations: Counts,
    /// Minor faults.
    pub minor_faults: u64,
    /// Peak RSS before and after, KiB.
    pub hwm_kib: (u64, u64),
}

/// Level 1's findings.
#[derive(Debug, Clone)]
pub struct InvariantsReport {
    /// The checks, in ladder order.
    pub checks: Vec<Check>,
    /// The seccomp run.
    pub seccomp: SeccompOutcome,
    /// The steady-state window.
    pub steady: SteadyState,
    /// The drain measurement, if run.
    pub drain: Option<DrainCost>,
    /// Why the drain measurement did not run, if it did not.
    pub drain_note: Option<String>,
}

impl InvariantsReport {
    /// Every check passed.
    pub fn pass(&self) -> bool {
        self.checks.iter().all(|c| c.pass)
    }
}

fn sampling_spec(
    fake: &FakeSysfs,
    capture: PathBuf,
    probes: Vec<ProbeSpec>,
    agent_cpus: &[usize],
    loop_cpu: usize,
) -> Result<AgentSpec, LevelError> {
    Ok(AgentSpec {
        uplink_port: dead_port()?,
        backoff_ms: (300_000, 300_000),
        cores: agent_cpus.to_vec(),
        control_loop_cores: vec![loop_cpu],
        probes,
        poll_hz: 100,
        snapshot_interval_s: 3600,
        sysfs_root: fake.root().to_owned(),
        sysfs_poll_ms: 100,
        capture,
        replay_speed: 10.0,
        counters_interval_s: 3600,
        debug_sample_every: 0,
        bandwidth_bytes_per_s: 0,
    })
}

/// Runs level 1.
pub fn run(bins: &Binaries, config: &InvariantsConfig) -> Result<InvariantsReport, LevelError> {
    let (agent_cpus, loop_cpu) = cpu_split().ok_or_else(|| {
        LevelError::Unsupported(
            "level 1 needs two CPUs: one for the control loop, one for the agent".into(),
        )
    })?;
    let dir = scratch("edgewatch-hil-invariants-")?;
    let mut checks = Vec::new();

    // 1. record() under seccomp strict mode.
    let seccomp =
        seccomp::check(&bins.hil, dir.path(), config.seccomp_records).map_err(|source| {
            LevelError::Io {
                context: "running the seccomp child".into(),
                source,
            }
        })?;
    checks.push(Check::new(
        format!(
            "ProbeWriter::record makes no syscall ({} records under seccomp strict mode)",
            config.seccomp_records
        ),
        seccomp.proven(),
        format!(
            "clean exit: {}; probe summary {} cycles (expected {}); control with one getpid killed by SIGKILL: {}; {}",
            seccomp.clean_exit,
            seccomp.summary_cycles,
            seccomp.recorded_under_seccomp + 4096,
            seccomp.control_killed,
            seccomp.detail
        ),
    ));

    // 2-5. The real agent, sampling two real loops.
    let counter = MallocCounter::build(dir.path())?;
    let sysfs = orin_sysfs(&dir.path().join("sysfs"))?;
    let mut loops = Vec::new();
    let mut probes = Vec::new();
    for (id, name) in [(1, "steering"), (2, "planner")] {
        let probe = dir.path().join(format!("{name}.probe"));
        loops.push(LoopProcess::start(
            &bins.synthetic_loop,
            &LoopSpec {
                probe: probe.clone(),
                loop_id: id,
                name: name.into(),
                rate_hz: 1000.0,
                budget_ms: 1.0,
                // Steady state is a window in which no event is due. With the default deadline
                // (the 1 ms period) a late wake-up of an unprivileged loop on a shared machine is
                // a deadline miss, hence a safety event and a commit; a deadline the scheduler
                // cannot overrun keeps the window free of events, as the level defines it.
                deadline_ms: Some(STEADY_STATE_DEADLINE_MS),
                fifo: None,
                cpu: Some(loop_cpu),
                require_rt: false,
                capacity: Some(2048),
            },
        )?);
        probes.push(ProbeSpec {
            path: probe,
            loop_name: name.into(),
        });
    }
    let spec = sampling_spec(
        &sysfs,
        config.capture.clone(),
        probes.clone(),
        &agent_cpus,
        loop_cpu,
    )?;
    let agent_dir = dir.path().join("agent");
    std::fs::create_dir_all(&agent_dir).map_err(|source| LevelError::Io {
        context: "creating the agent directory".into(),
        source,
    })?;
    let mut agent = RigAgent::start(&bins.agent, &spec, &agent_dir, &counter.env())?;
    let pid = agent.pid();
    std::thread::sleep(config.warm_up);

    let readers: Vec<_> = probes
        .iter()
        .filter_map(|p| loop_probe::ProbeReader::open(&p.path).ok())
        .collect();
    let cycles = || -> u64 {
        readers
            .iter()
            .filter_map(|r| r.summary().ok())
            .map(|s| s.cycles.cycles)
            .sum()
    };
    // Steady state is a window in which the agent's queue takes no event. The snapshot read
    // before a window may be up to a second old: an event just before the window counts as in
    // it, which only sets a window aside, never lets one with an event pass as steady.
    let queue_status = agent_dir.join(edgewatch_agent::config::QUEUE_STATUS_FILE_NAME);
    let warm_up_allocations = counter.read()?.allocations;
    let mut discarded = Vec::new();
    let (steady, c1, window_s) = loop {
        let taken_before = events_taken(&queue_status);
        let log_before = agent.log().len();
        let pages_before = procfs::page_work().ok();
        let (c0, s0, k0) = (counter.read()?, procfs::stat(pid)?, cycles());
        let waited_before = procfs::run_queue_wait_ns(pid).ok();
        let started = Instant::now();
        let started_ns = malloc_count::monotonic_ns();
        counter.arm()?;
        std::thread::sleep(config.window);
        counter.disarm()?;
        let (c1, s1, k1) = (counter.read()?, procfs::stat(pid)?, cycles());
        let run_queue_wait_s = waited_before
            .zip(procfs::run_queue_wait_ns(pid).ok())
            .map(|(before, after)| after.saturating_sub(before) as f64 / 1e9);
        let allocation_trace = counter.trace()?.describe(started_ns);
        let page_work_in_window = pages_before
            .zip(procfs::page_work().ok())
            .map(|(before, after)| after.since(&before));
        let window_s = started.elapsed().as_secs_f64();
        let ended_unix_ms = unix_ms_now();
        let log_in_window = last_bytes(agent.log().get(log_before..).unwrap_or_default(), 2000);
        // Without a snapshot to compare the window is judged as it is, and the report says so.
        let events_in_window = taken_before
            .zip(events_taken_after(
                &queue_status,
                ended_unix_ms,
                SNAPSHOT_WAIT,
            ))
            .map(|(before, after)| after.saturating_sub(before));
        let steady = SteadyState {
            window_s,
            warm_up_allocations,
            allocations: c1.since(&c0),
            minor_faults: s1.minflt - s0.minflt,
            major_faults: s1.majflt - s0.majflt,
            threads: s1.threads,
            cycles_in_window: k1 - k0,
            discarded: Vec::new(),
            events_in_window,
            log_in_window,
            page_work_in_window,
            allocation_trace,
            run_queue_wait_s,
        };
        // The last window allowed is judged whatever it holds.
        match steady.reason_to_set_aside() {
            Some(reason) if discarded.len() + 1 < config.max_windows.max(1) => {
                discarded.push(reason);
            }
            _ => break (steady, c1, window_s),
        }
    };
    let steady = SteadyState {
        discarded,
        ..steady
    };

    let maps = procfs::maps(pid)?;
    let mut mapping_detail = Vec::new();
    let mut read_only = true;
    for probe in &probes {
        let found = procfs::mappings_of(&maps, &probe.path);
        read_only &= !found.is_empty() && found.iter().all(|m| m.perms == "r--s");
        mapping_detail.push(format!(
            "{}: [{}]",
            probe
                .path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
            found
                .iter()
                .map(|m| m.perms.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    checks.push(Check::new(
        "The agent maps every probe read-only and shared (r--s)",
        read_only,
        mapping_detail.join("; "),
    ));

    let mut affinity_detail = Vec::new();
    let mut excludes = true;
    for tid in procfs::tasks(pid)? {
        let status = procfs::parse_status(
            &std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default(),
        )
        .unwrap_or_default();
        excludes &= !status.cpus_allowed.is_empty() && !status.cpus_allowed.contains(&loop_cpu);
        affinity_detail.push(format!("thread {tid}: {:?}", status.cpus_allowed));
    }
    checks.push(Check::new(
        format!("Every agent thread's Cpus_allowed_list excludes the loop core {loop_cpu}"),
        excludes,
        affinity_detail.join("; "),
    ));

    let policies = procfs::policies(pid)?;
    let all_idle = !policies.is_empty() && policies.iter().all(|&(_, p)| p == libc::SCHED_IDLE);
    checks.push(Check::new(
        "Every agent thread runs SCHED_IDLE",
        all_idle,
        policies
            .iter()
            .map(|&(tid, p)| format!("thread {tid}: {}", procfs::policy_name(p)))
            .collect::<Vec<_>>()
            .join("; "),
    ));

    checks.push(Check::new(
        "The malloc counter is loaded in the agent and counts (start-up allocated)",
        c1.loaded && steady.warm_up_allocations > 0,
        format!(
            "loaded: {}; {} allocations during start-up and warm-up",
            c1.loaded, steady.warm_up_allocations
        ),
    ));
    checks.push(Check::new(
        "No heap allocation in steady state",
        c1.loaded && steady.allocations.allocations == 0,
        format!(
            "{} allocations ({} bytes), {} frees over {:.1} s while the loops wrote {} cycles; the agent waited for a core {} of it; events the queue took in the window: {}; windows set aside before it: {}; the agent logged in the window: {}{}",
            steady.allocations.allocations,
            steady.allocations.bytes,
            steady.allocations.frees,
            window_s,
            steady.cycles_in_window,
            steady
                .run_queue_wait_s
                .map_or_else(|| "unknown".to_owned(), |s| format!("{s:.3} s")),
            steady
                .events_in_window
                .map_or_else(|| "unknown (no queue snapshot)".to_owned(), |n| n.to_string()),
            steady.windows_set_aside(),
            if steady.log_in_window.is_empty() {
                "nothing".to_owned()
            } else {
                format!("{:?}", steady.log_in_window)
            },
            if steady.allocation_trace.is_empty() {
                String::new()
            } else {
                format!("; the calls: {}", steady.allocation_trace)
            }
        ),
    ));
    checks.push(Check::new(
        "No minor fault in steady state",
        steady.minor_faults == 0 && steady.major_faults == 0,
        format!(
            "{} minor, {} major faults over {:.1} s ({} threads); the kernel meanwhile, system-wide: {}; windows set aside before it: {}",
            steady.minor_faults,
            steady.major_faults,
            window_s,
            steady.threads,
            steady
                .page_work_in_window
                .map_or_else(|| "unknown".to_owned(), |work| work.to_string()),
            steady.windows_set_aside(),
        ),
    ));
    checks.push(Check::new(
        "The loops wrote cycles during the window (the agent had work)",
        steady.cycles_in_window > 1000,
        format!("{} cycles", steady.cycles_in_window),
    ));
    let exit = agent.terminate();
    checks.push(Check::new(
        "The agent stops cleanly on SIGTERM",
        exit.contains("exit status: 0"),
        exit,
    ));
    for mut l in loops {
        let _ = l.stop();
    }

    let (drain, drain_note) = if config.drain_events == 0 {
        (None, Some("not run (no backlog requested)".to_owned()))
    } else {
        match measure_drain(bins, config, &sysfs, &agent_cpus, loop_cpu, dir.path()) {
            Ok(cost) => (Some(cost), None),
            Err(error @ (LevelError::Harness(_) | LevelError::Unsupported(_))) => {
                (None, Some(format!("not measured: {error}")))
            }
            Err(error) => return Err(error),
        }
    };
    Ok(InvariantsReport {
        checks,
        seccomp,
        steady,
        drain,
        drain_note,
    })
}

/// Fills a backlog while the link is down, then measures the allocations of draining it.
fn measure_drain(
    bins: &Binaries,
    config: &InvariantsConfig,
    sysfs: &FakeSysfs,
    agent_cpus: &[usize],
    loop_cpu: usize,
    root: &std::path::Path,
) -> Result<DrainCost, LevelError> {
    let dir = root.join("drain");
    std::fs::create_dir_all(&dir).map_err(|source| LevelError::Io {
        context: "creating the drain directory".into(),
        source,
    })?;
    let counter = MallocCounter::build(&dir)?;
    let broker = Mosquitto::start()?;
    let _subscriber = crate::rig::Subscriber::start(broker.addr())?;
    let proxy = FaultProxy::start(broker.addr())?;
    proxy.set(Fault::Reset);
    let mut spec = sampling_spec(
        sysfs,
        config.capture.clone(),
        Vec::new(),
        agent_cpus,
        loop_cpu,
    )?;
    spec.uplink_port = proxy.port();
    spec.backoff_ms = (200, 1000);
    let agent_dir = dir.join("agent");
    std::fs::create_dir_all(&agent_dir).map_err(|source| LevelError::Io {
        context: "creating the agent directory".into(),
        source,
    })?;
    let mut agent = RigAgent::start(&bins.agent, &spec, &agent_dir, &counter.env())?;
    crate::backlog::fill(&agent.socket(), config.drain_events, 1000)?;
    std::thread::sleep(Duration::from_secs(1));
    let pid = agent.pid();
    let (c0, s0, h0) = (
        counter.read()?,
        procfs::stat(pid)?,
        procfs::status(pid)?.vm_hwm_kib,
    );
    let started = Instant::now();
    proxy.set(Fault::Pass);
    let wanted = config.drain_events as u64;
    let drained = wait_for(Duration::from_secs(60), || {
        agent.status()["uplink"]["events_acked"].as_u64() >= Some(wanted)
    });
    let seconds = started.elapsed().as_secs_f64();
    let (c1, s1, h1) = (
        counter.read()?,
        procfs::stat(pid)?,
        procfs::status(pid)?.vm_hwm_kib,
    );
    let status = agent.status();
    agent.terminate();
    if !drained {
        return Err(LevelError::Unsupported(format!(
            "the backlog of {wanted} events did not drain within 60 s (status: {status})"
        )));
    }
    Ok(DrainCost {
        events: status["uplink"]["events_acked"].as_u64().unwrap_or(0),
        batches: status["uplink"]["batches_acked"].as_u64().unwrap_or(0),
        seconds,
        allocations: c1.since(&c0),
        minor_faults: s1.minflt - s0.minflt,
        hwm_kib: (h0, h1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window with `faults` minor faults, `allocations` allocations, `events` queue events
    /// and the kernel's page work.
    fn window(
        faults: u64,
        allocations: u64,
        events: Option<u64>,
        page_work: Option<procfs::PageWork>,
    ) -> SteadyState {
        SteadyState {
            window_s: 10.0,
            allocations: Counts {
                loaded: true,
                allocations,
                ..Counts::default()
            },
            minor_faults: faults,
            events_in_window: events,
            page_work_in_window: page_work,
            ..SteadyState::default()
        }
    }

    const MIGRATED: Option<procfs::PageWork> = Some(procfs::PageWork {
        reclaim_scanned: 0,
        migrated: 12,
        collapsed: 0,
    });
    const IDLE_KERNEL: Option<procfs::PageWork> = Some(procfs::PageWork {
        reclaim_scanned: 0,
        migrated: 0,
        collapsed: 0,
    });

    #[test]
    fn a_window_is_set_aside_for_queue_events_or_for_faults_the_kernel_caused() {
        // Steady: judged.
        assert_eq!(window(0, 0, Some(0), MIGRATED).reason_to_set_aside(), None);
        // The queue took events: set aside, whatever else.
        let reason = window(0, 0, Some(2), IDLE_KERNEL).reason_to_set_aside();
        assert!(reason.is_some_and(|r| r.starts_with("2 events taken")));
        // Faults without allocating while the kernel migrated pages: set aside, with the
        // kernel's figures.
        let reason = window(1, 0, Some(0), MIGRATED)
            .reason_to_set_aside()
            .unwrap();
        assert!(reason.contains("1 minor and 0 major faults"), "{reason}");
        assert!(reason.contains("12 migrated"), "{reason}");
        // Faults with an allocation are the agent's: judged.
        assert_eq!(window(1, 3, Some(0), MIGRATED).reason_to_set_aside(), None);
        // Faults while the kernel took no page: the agent's, judged.
        assert_eq!(
            window(1, 0, Some(0), IDLE_KERNEL).reason_to_set_aside(),
            None
        );
        // Without a reading of the kernel's work, or of the queue, the window is judged.
        assert_eq!(window(1, 0, Some(0), None).reason_to_set_aside(), None);
        assert_eq!(window(0, 0, None, MIGRATED).reason_to_set_aside(), None);
    }

    fn write_snapshot(file: &std::path::Path, as_of_unix_ms: u64, safety_durable: u64) {
        let mut status = edgewatch_queue::QueueStatus {
            as_of_unix_ms,
            store_available: true,
            ..Default::default()
        };
        status.tiers.safety.durable_seq = safety_durable;
        edgewatch_queue::status::write_snapshot(file, &status, &mut String::new()).unwrap();
    }

    #[test]
    fn the_events_after_a_window_come_from_a_snapshot_written_after_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("queue-status");
        // Written before the window ended (a starved agent): not an answer, however long one
        // waits.
        write_snapshot(&file, 1_000, 7);
        assert_eq!(events_taken(&file), Some(7));
        assert_eq!(
            events_taken_after(&file, 2_000, Duration::from_millis(300)),
            None
        );
        // The agent gets the core back and rewrites it while the level waits.
        let writer = {
            let file = file.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                write_snapshot(&file, 2_000, 9);
            })
        };
        assert_eq!(
            events_taken_after(&file, 2_000, Duration::from_secs(10)),
            Some(9)
        );
        writer.join().unwrap();
        // One written after the end answers at once.
        assert_eq!(events_taken_after(&file, 1_500, Duration::ZERO), Some(9));
    }
}

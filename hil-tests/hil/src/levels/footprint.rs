//! Level 2, footprint: the real agent at 10× production poll rates (probes at ten times the
//! agent's default `deadline.poll_hz`, sysfs every 100 ms, tegrastats replayed at 10×) over a fake
//! sysfs tree and two synthetic 1 kHz loops, for a fixed window; gated on what the agent itself
//! controls — its CPU time, its wake-ups, how long each wake-up keeps a CPU, its heap allocations
//! and its peak RSS — against the budgets of `docs/hil.md`. Robust on a shared machine: every
//! gated number is the agent's own, not a timing. Preemption, which the neighbours cause, is
//! measured and reported, never gated: against a reference process in the same window (an
//! idle-priority sleeper on the agent's CPUs with the agent's wake-up pattern), and, where the
//! scheduler can be traced, preemption by preemption with who took the CPU.
//!
//! ```text
//! warm-up (start-up, queue open) ─► calibration (the agent's wake-up rate and CPU per wake-up)
//!   ─► reference sleeper started with that pattern ─► window: agent and reference counted alike,
//!      `sched_switch` traced for both
//! ```
//!
//! Invariants:
//! - The budgets are the documented constants below; a change to them is a change to the docs.
//! - No check fails on the neighbours' load: CPU time, wake-ups, allocations, RSS and the time
//!   on a CPU per wake-up do not depend on it (a neighbour can only split a wake-up, never
//!   lengthen its time on a CPU), and preemption is reported, not gated.
//! - Without a scheduler trace (no root, no tracefs) the wake-up length check is SKIP with the
//!   reason, never a pass.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{Check, LevelError, cpu_split};
use crate::malloc_count::{Counts, MallocCounter};
use crate::procfs;
use crate::reference::ReferenceSleeper;
use crate::rig::{
    AgentSpec, Binaries, LoopProcess, LoopSpec, ProbeSpec, RigAgent, dead_port, default_capture,
    orin_sysfs, scratch,
};
use crate::sched_trace::{SchedTrace, TaskRuns};
use crate::stats::{LatencySummary, Preemption, PreemptionRule, Scheduling};

/// CPU budget: 1% of one core.
pub const CPU_BUDGET_FRACTION: f64 = 0.01;
/// Peak RSS budget (VmHWM): 32 MiB.
pub const HWM_BUDGET_KIB: u64 = 32 * 1024;
/// Wake-up budget at 10× poll rates: the agent's timers fire about 61 times a second there
/// (probes at 40 Hz, sysfs at 10 Hz, 10 tegrastats lines, the status file); 100 leaves room for
/// commits and flushes, while a busy poll or a retry loop would show thousands.
pub const WAKEUPS_BUDGET_PER_S: f64 = 100.0;
/// Heap allocation budget with events flowing (snapshots, counters and debug samples committed
/// to the queue), per second: about 400 are measured (`docs/hil.md`), while an allocation per
/// probe record (2,000 a second at these rates) or per poll would exceed the budget.
pub const ALLOCATIONS_BUDGET_PER_S: f64 = 1000.0;
/// Time on a CPU per wake-up, 99th percentile: 2 ms. The longest wake-up is logged, never gated:
/// the trace's clock also runs while the hypervisor holds a virtual CPU or interrupts are
/// served (a quiet run on a VM logged one of 16 ms among 3,308 with a p99 of 681 µs), as the
/// loops' maximum latency is logged and gated only on a Jetson. The agent's wake-ups take a p99 of 230 to
/// 260 µs at these rates on a quiet machine or beside CPU hogs, 490 µs beside a compiler sharing
/// the core's caches (`docs/hil.md`); a poll that scans, a commit that copies the queue or a loop
/// that retries without sleeping shows as milliseconds on most wake-ups.
pub const WAKE_UP_CPU_P99_NS: u64 = 2_000_000;
/// The preemption comparison with the reference, reported (never gated): preemptions beyond
/// the reference's share, against one per 100 voluntary switches plus 5, the fixed bound the
/// level once gated on.
pub const NONVOLUNTARY_PER_VOLUNTARY: f64 = 0.01;
/// Constant part of that comparison.
pub const NONVOLUNTARY_SLACK: u64 = 5;

/// Settings of level 2.
#[derive(Debug, Clone)]
pub struct FootprintConfig {
    /// Time before the window (start-up, queue open, first commits); its last
    /// [`Self::calibration`] measures the agent's wake-up pattern for the reference.
    pub warm_up: Duration,
    /// The end of the warm-up that measures the agent's wake-up rate and CPU per wake-up.
    pub calibration: Duration,
    /// The measured window.
    pub window: Duration,
    /// The tegrastats capture to replay.
    pub capture: PathBuf,
}

impl Default for FootprintConfig {
    fn default() -> Self {
        Self {
            warm_up: Duration::from_secs(5),
            calibration: Duration::from_secs(2),
            window: Duration::from_secs(60),
            capture: default_capture(),
        }
    }
}

/// What level 2 measured.
#[derive(Debug, Clone)]
pub struct FootprintReport {
    /// The checks.
    pub checks: Vec<Check>,
    /// Window, s.
    pub window_s: f64,
    /// On-CPU time of the agent's threads (schedstat), ns.
    pub cpu_ns: u64,
    /// utime + stime from `stat`, ms.
    pub cpu_ticks_ms: u64,
    /// Voluntary context switches in the window (the agent's wake-ups).
    pub voluntary: u64,
    /// Involuntary context switches in the window (preemptions).
    pub nonvoluntary: u64,
    /// The reference sleeper over the same window.
    pub reference: Scheduling,
    /// The reference's pattern: wake-ups per second and CPU per wake-up, as calibrated on the
    /// agent.
    pub reference_pattern: (f64, Duration),
    /// The agent's preemptions set against the reference's (`None`: the reference never ran);
    /// reported, not gated.
    pub preemption: Option<Preemption>,
    /// The scheduler's trace of the window: the agent's threads (merged) and the reference, or
    /// why there is none.
    pub traced: Result<(TaskRuns, TaskRuns), String>,
    /// Peak RSS, KiB.
    pub vm_hwm_kib: u64,
    /// RSS at the end, KiB.
    pub vm_rss_kib: u64,
    /// Minor faults in the window.
    pub minor_faults: u64,
    /// Threads.
    pub threads: u64,
    /// Heap allocations in the window, events flowing.
    pub allocations: Counts,
    /// Each loop's wake-up latency over the window: name, summary, sorted latencies (ns).
    pub loop_latency: Vec<(String, LatencySummary, Vec<u64>)>,
}

impl FootprintReport {
    /// CPU time as a fraction of one core.
    pub fn cpu_fraction(&self) -> f64 {
        self.cpu_ns as f64 / (self.window_s * 1e9)
    }

    /// The agent's wake-ups (voluntary switches) per second.
    pub fn wakeups_per_s(&self) -> f64 {
        self.voluntary as f64 / self.window_s.max(1e-9)
    }

    /// Heap allocations per second.
    pub fn allocations_per_s(&self) -> f64 {
        self.allocations.allocations as f64 / self.window_s.max(1e-9)
    }

    /// Every check passed.
    pub fn pass(&self) -> bool {
        self.checks.iter().all(|c| c.pass)
    }
}

/// The trace of a process's threads as one: their wake-ups together, their preemptions summed.
fn merge_threads(runs: Vec<TaskRuns>) -> TaskRuns {
    let mut merged = TaskRuns::default();
    let mut by = std::collections::BTreeMap::<String, u64>::new();
    for run in runs {
        if merged.tid == 0 {
            merged.tid = run.tid;
        }
        merged.wake_up_cpu_ns.extend(run.wake_up_cpu_ns);
        merged.preemptions += run.preemptions;
        for (who, n) in run.preempted_by {
            *by.entry(who).or_default() += n;
        }
    }
    merged.wake_up_cpu_ns.sort_unstable();
    merged.preempted_by = by.into_iter().collect();
    merged
        .preempted_by
        .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    merged
}

/// Ten times the agent's default probe poll rate, the rate this level runs the probes at.
pub fn ten_times_production_poll_hz() -> u32 {
    (10.0 * edgewatch_samplers::deadline::config::DEFAULT_POLL_HZ).round() as u32
}

/// The agent's scheduling counters now.
fn scheduling(pid: u32) -> Result<Scheduling, LevelError> {
    let (voluntary, nonvoluntary) = procfs::context_switches(pid)?;
    Ok(Scheduling {
        run_ns: procfs::cpu_ns(pid)?,
        voluntary,
        nonvoluntary,
    })
}

fn since(later: &Scheduling, earlier: &Scheduling) -> Scheduling {
    Scheduling {
        run_ns: later.run_ns.saturating_sub(earlier.run_ns),
        voluntary: later.voluntary.saturating_sub(earlier.voluntary),
        nonvoluntary: later.nonvoluntary.saturating_sub(earlier.nonvoluntary),
    }
}

/// Runs level 2.
pub fn run(bins: &Binaries, config: &FootprintConfig) -> Result<FootprintReport, LevelError> {
    let split = cpu_split();
    let dir = scratch("edgewatch-hil-footprint-")?;
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
                deadline_ms: None,
                fifo: None,
                cpu: split.as_ref().map(|s| s.1),
                require_rt: false,
                capacity: None,
            },
        )?);
        probes.push(ProbeSpec {
            path: probe,
            loop_name: name.into(),
        });
    }
    let agent_cpus = split.as_ref().map(|s| s.0.clone()).unwrap_or_default();
    let spec = AgentSpec {
        uplink_port: dead_port()?,
        // Production backoff: the offline agent retries at 1, 2, 4 ... up to 300 s.
        backoff_ms: (1_000, 300_000),
        cores: agent_cpus.clone(),
        control_loop_cores: split.as_ref().map(|s| vec![s.1]).unwrap_or_default(),
        probes: probes.clone(),
        poll_hz: ten_times_production_poll_hz(),
        snapshot_interval_s: 10,
        sysfs_root: sysfs.root().to_owned(),
        sysfs_poll_ms: 100,
        capture: config.capture.clone(),
        replay_speed: 10.0,
        counters_interval_s: 10,
        debug_sample_every: 10,
        bandwidth_bytes_per_s: 0,
    };
    let agent_dir = dir.path().join("agent");
    std::fs::create_dir_all(&agent_dir).map_err(|source| LevelError::Io {
        context: "creating the agent directory".into(),
        source,
    })?;
    // The counter costs two relaxed atomic adds per allocation: nothing next to the agent's own
    // work, and it tells what sampling with events flowing allocates.
    let counter = MallocCounter::build(dir.path())?;
    let mut agent = RigAgent::start(&bins.agent, &spec, &agent_dir, &counter.env())?;
    let pid = agent.pid();
    let calibration = config.calibration.min(config.warm_up);
    std::thread::sleep(config.warm_up - calibration);
    let calibration0 = scheduling(pid)?;
    let calibrated = Instant::now();
    std::thread::sleep(calibration);
    let pattern = since(&scheduling(pid)?, &calibration0);
    let pattern_s = calibrated.elapsed().as_secs_f64().max(1e-3);
    // The reference wakes as often as the agent did and burns its CPU per wake-up, on the same
    // CPUs at the same policy (clamped, should the agent have shown no pattern at all).
    let rate_hz = (pattern.voluntary as f64 / pattern_s).clamp(1.0, 1000.0);
    let work = Duration::from_nanos(
        pattern
            .run_ns
            .checked_div(pattern.voluntary)
            .unwrap_or(0)
            .clamp(10_000, 2_000_000),
    );
    let reference = ReferenceSleeper::start(&bins.hil, &agent_cpus, rate_hz, work)?;

    let mut readers: Vec<_> = probes
        .iter()
        .filter_map(|p| loop_probe::ProbeReader::open(&p.path).ok())
        .collect();
    let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); readers.len()];
    let drain_probes = |readers: &mut Vec<loop_probe::ProbeReader>, out: &mut Vec<Vec<u64>>| {
        let now = super::monotonic_ns();
        for (reader, out) in readers.iter_mut().zip(out.iter_mut()) {
            let _ = reader.poll(now, &mut |r: &loop_probe::Record| {
                out.push(r.start_ns.saturating_sub(r.release_ns));
            });
        }
    };
    drain_probes(&mut readers, &mut vec![Vec::new(); 2]);
    // The agent's threads, then the reference: the trace's summaries come in this order.
    let mut traced_tids = procfs::tasks(pid)?;
    traced_tids.push(reference.pid());
    let trace = SchedTrace::start(&traced_tids, config.window).map_err(|e| e.to_string());
    let counts0 = counter.read()?;
    let stat0 = procfs::stat(pid)?;
    let agent0 = scheduling(pid)?;
    let reference0 = scheduling(reference.pid())?;
    let started = Instant::now();
    while started.elapsed() < config.window {
        std::thread::sleep(Duration::from_secs(1).min(config.window));
        drain_probes(&mut readers, &mut latencies);
    }
    let agent1 = scheduling(pid)?;
    let reference1 = scheduling(reference.pid())?;
    let traced = trace
        .and_then(|t| t.finish().map_err(|e| e.to_string()))
        .map(|mut runs| {
            let reference = runs.pop().unwrap_or_default();
            (merge_threads(runs), reference)
        });
    let counts1 = counter.read()?;
    let stat1 = procfs::stat(pid)?;
    let window_s = started.elapsed().as_secs_f64();
    let status = procfs::status(pid)?;
    let ticks = procfs::clock_ticks();
    let running = agent.running();
    drop(reference);
    agent.terminate();
    for mut l in loops {
        let _ = l.stop();
    }

    let agent_window = since(&agent1, &agent0);
    let reference_window = since(&reference1, &reference0);
    let rule = PreemptionRule {
        per_voluntary: NONVOLUNTARY_PER_VOLUNTARY,
        slack: NONVOLUNTARY_SLACK,
        ..PreemptionRule::default()
    };
    let preemption =
        crate::stats::preemption_beyond_reference(&agent_window, &reference_window, &rule);
    let mut report = FootprintReport {
        checks: Vec::new(),
        window_s,
        cpu_ns: agent_window.run_ns,
        cpu_ticks_ms: ((stat1.utime + stat1.stime) - (stat0.utime + stat0.stime)) * 1000 / ticks,
        voluntary: agent_window.voluntary,
        nonvoluntary: agent_window.nonvoluntary,
        reference: reference_window,
        reference_pattern: (rate_hz, work),
        preemption,
        traced,
        vm_hwm_kib: status.vm_hwm_kib,
        vm_rss_kib: status.vm_rss_kib,
        minor_faults: stat1.minflt - stat0.minflt,
        threads: stat1.threads,
        allocations: counts1.since(&counts0),
        loop_latency: Vec::new(),
    };
    for (probe, mut l) in probes.iter().zip(latencies) {
        let summary = LatencySummary::of(&mut l);
        report
            .loop_latency
            .push((probe.loop_name.clone(), summary, l));
    }
    report.checks = checks(&report, running);
    Ok(report)
}

/// The level's checks, from its measurements.
fn checks(report: &FootprintReport, running: bool) -> Vec<Check> {
    let mut checks = vec![Check::new(
        "The agent kept running through the window",
        running,
        if running { "running" } else { "exited early" },
    )];
    checks.push(Check::new(
        format!("CPU time ≤ {:.0}% of one core", CPU_BUDGET_FRACTION * 100.0),
        report.cpu_fraction() <= CPU_BUDGET_FRACTION,
        format!(
            "{:.3}% ({:.1} ms on CPU in {:.1} s by schedstat; {} ms by utime+stime)",
            report.cpu_fraction() * 100.0,
            report.cpu_ns as f64 / 1e6,
            report.window_s,
            report.cpu_ticks_ms
        ),
    ));
    checks.push(Check::new(
        format!("Wake-ups ≤ {WAKEUPS_BUDGET_PER_S:.0} per second"),
        report.wakeups_per_s() <= WAKEUPS_BUDGET_PER_S,
        format!(
            "{:.1}/s ({} voluntary switches in {:.1} s)",
            report.wakeups_per_s(),
            report.voluntary,
            report.window_s
        ),
    ));
    checks.push(Check::new(
        format!("Heap allocations with events flowing ≤ {ALLOCATIONS_BUDGET_PER_S:.0} per second"),
        report.allocations_per_s() <= ALLOCATIONS_BUDGET_PER_S,
        format!(
            "{:.1}/s ({} allocations, {:.1} KiB/s)",
            report.allocations_per_s(),
            report.allocations.allocations,
            report.allocations.bytes as f64 / 1024.0 / report.window_s.max(1e-9)
        ),
    ));
    checks.push(Check::new(
        format!("Peak RSS (VmHWM) ≤ {} MiB", HWM_BUDGET_KIB / 1024),
        report.vm_hwm_kib <= HWM_BUDGET_KIB,
        format!(
            "VmHWM {:.1} MiB, VmRSS {:.1} MiB",
            report.vm_hwm_kib as f64 / 1024.0,
            report.vm_rss_kib as f64 / 1024.0
        ),
    ));
    let name = format!(
        "Wake-ups stay short: time on a CPU per wake-up ≤ {} ms at the 99th percentile (scheduler trace)",
        WAKE_UP_CPU_P99_NS / 1_000_000,
    );
    checks.push(match &report.traced {
        Ok((agent, _)) if agent.wake_up_cpu_ns.is_empty() => Check::new(
            name,
            false,
            "the trace holds no complete wake-up of the agent",
        ),
        Ok((agent, _)) => {
            let p99 = agent.wake_up_cpu_quantile(0.99);
            let longest = agent.longest_wake_up_ns();
            Check::new(
                name,
                p99 <= WAKE_UP_CPU_P99_NS,
                format!(
                    "{} wake-ups traced: p50 {:.0} µs, p99 {:.0} µs, longest {:.0} µs (logged, never gated)",
                    agent.wake_up_cpu_ns.len(),
                    agent.wake_up_cpu_quantile(0.5) as f64 / 1e3,
                    p99 as f64 / 1e3,
                    longest as f64 / 1e3
                ),
            )
        }
        Err(reason) => Check::skip(name, format!("SKIP: no scheduler trace: {reason}")),
    });
    checks
}

//! Level 2, footprint: the real agent at 10× production poll rates (probes at ten times the
//! agent's default `deadline.poll_hz`, sysfs every 100 ms, tegrastats replayed at 10×) over a fake sysfs tree and two synthetic 1 kHz loops, for a
//! fixed window; its own CPU time, involuntary context switches and peak RSS against the budgets
//! of `docs/hil.md`. Robust on a shared machine: every number is the agent's own, not a timing.
//!
//! Invariants:
//! - The budgets are the documented constants below; a change to them is a change to the docs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{Check, LevelError, cpu_split};
use crate::malloc_count::{Counts, MallocCounter};
use crate::procfs;
use crate::rig::{
    AgentSpec, Binaries, LoopProcess, LoopSpec, ProbeSpec, RigAgent, dead_port, default_capture,
    orin_sysfs, scratch,
};
use crate::stats::LatencySummary;

/// CPU budget: 1% of one core.
pub const CPU_BUDGET_FRACTION: f64 = 0.01;
/// Peak RSS budget (VmHWM): 32 MiB.
pub const HWM_BUDGET_KIB: u64 = 32 * 1024;
/// "Near zero" involuntary context switches: at most one per 100 voluntary ones (the agent
/// sleeping on its timers), plus 5 for start-of-window effects. A SCHED_IDLE task is preempted
/// by any other task that wakes on its core while it runs, so on a shared core a few are the
/// neighbours' doing; a busy agent would show them per wake-up, not per hundred.
pub const NONVOLUNTARY_PER_VOLUNTARY: f64 = 0.01;
/// Constant part of the involuntary-switch bound.
pub const NONVOLUNTARY_SLACK: u64 = 5;

/// Settings of level 2.
#[derive(Debug, Clone)]
pub struct FootprintConfig {
    /// Time before the window (start-up, queue open, first commits).
    pub warm_up: Duration,
    /// The measured window.
    pub window: Duration,
    /// The tegrastats capture to replay.
    pub capture: PathBuf,
}

impl Default for FootprintConfig {
    fn default() -> Self {
        Self {
            warm_up: Duration::from_secs(5),
            window: Duration::from_secs(60),
            capture: default_capture(),
        }
    }
}

/// What level 2 measured.
#[derive(Debug, Clone, Default)]
pub struct FootprintReport {
    /// The checks.
    pub checks: Vec<Check>,
    /// Window, s.
    pub window_s: f64,
    /// On-CPU time of the agent's threads (schedstat), ns.
    pub cpu_ns: u64,
    /// utime + stime from `stat`, ms.
    pub cpu_ticks_ms: u64,
    /// Voluntary context switches in the window.
    pub voluntary: u64,
    /// Involuntary context switches in the window.
    pub nonvoluntary: u64,
    /// Their bound.
    pub nonvoluntary_bound: u64,
    /// Peak RSS, KiB.
    pub vm_hwm_kib: u64,
    /// RSS at the end, KiB.
    pub vm_rss_kib: u64,
    /// Minor faults in the window.
    pub minor_faults: u64,
    /// Threads.
    pub threads: u64,
    /// Heap allocations in the window, events flowing (reported, not gated).
    pub allocations: Counts,
    /// Each loop's wake-up latency over the window: name, summary, sorted latencies (ns).
    pub loop_latency: Vec<(String, LatencySummary, Vec<u64>)>,
}

impl FootprintReport {
    /// CPU time as a fraction of one core.
    pub fn cpu_fraction(&self) -> f64 {
        self.cpu_ns as f64 / (self.window_s * 1e9)
    }

    /// Every check passed.
    pub fn pass(&self) -> bool {
        self.checks.iter().all(|c| c.pass)
    }
}

/// Runs level 2.
/// Ten times the agent's default probe poll rate, the rate this level runs the probes at.
pub fn ten_times_production_poll_hz() -> u32 {
    (10.0 * edgewatch_samplers::deadline::config::DEFAULT_POLL_HZ).round() as u32
}

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
    let spec = AgentSpec {
        uplink_port: dead_port()?,
        // Production backoff: the offline agent retries at 1, 2, 4 ... up to 300 s.
        backoff_ms: (1_000, 300_000),
        cores: split.as_ref().map(|s| s.0.clone()).unwrap_or_default(),
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
    std::thread::sleep(config.warm_up);

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
    let counts0 = counter.read()?;
    let cpu0 = procfs::cpu_ns(pid)?;
    let stat0 = procfs::stat(pid)?;
    let (vol0, nonvol0) = procfs::context_switches(pid)?;
    let started = Instant::now();
    while started.elapsed() < config.window {
        std::thread::sleep(Duration::from_secs(1).min(config.window));
        drain_probes(&mut readers, &mut latencies);
    }
    let cpu1 = procfs::cpu_ns(pid)?;
    let counts1 = counter.read()?;
    let stat1 = procfs::stat(pid)?;
    let (vol1, nonvol1) = procfs::context_switches(pid)?;
    let window_s = started.elapsed().as_secs_f64();
    let status = procfs::status(pid)?;
    let ticks = procfs::clock_ticks();
    let running = agent.running();
    agent.terminate();
    for mut l in loops {
        let _ = l.stop();
    }

    let voluntary = vol1.saturating_sub(vol0);
    let nonvoluntary = nonvol1.saturating_sub(nonvol0);
    let nonvoluntary_bound =
        (voluntary as f64 * NONVOLUNTARY_PER_VOLUNTARY) as u64 + NONVOLUNTARY_SLACK;
    let mut report = FootprintReport {
        checks: Vec::new(),
        window_s,
        cpu_ns: cpu1.saturating_sub(cpu0),
        cpu_ticks_ms: ((stat1.utime + stat1.stime) - (stat0.utime + stat0.stime)) * 1000 / ticks,
        voluntary,
        nonvoluntary,
        nonvoluntary_bound,
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
    report.checks.push(Check::new(
        "The agent kept running through the window",
        running,
        if running { "running" } else { "exited early" },
    ));
    report.checks.push(Check::new(
        format!("CPU time ≤ {:.0}% of one core", CPU_BUDGET_FRACTION * 100.0),
        report.cpu_fraction() <= CPU_BUDGET_FRACTION,
        format!(
            "{:.3}% ({:.1} ms on CPU in {:.1} s by schedstat; {} ms by utime+stime)",
            report.cpu_fraction() * 100.0,
            report.cpu_ns as f64 / 1e6,
            window_s,
            report.cpu_ticks_ms
        ),
    ));
    report.checks.push(Check::new(
        "Involuntary context switches near zero (≤ 1% of voluntary + 5)",
        nonvoluntary <= nonvoluntary_bound,
        format!("{nonvoluntary} involuntary, {voluntary} voluntary (bound {nonvoluntary_bound})"),
    ));
    report.checks.push(Check::new(
        format!("Peak RSS (VmHWM) ≤ {} MiB", HWM_BUDGET_KIB / 1024),
        report.vm_hwm_kib <= HWM_BUDGET_KIB,
        format!(
            "VmHWM {:.1} MiB, VmRSS {:.1} MiB",
            report.vm_hwm_kib as f64 / 1024.0,
            report.vm_rss_kib as f64 / 1024.0
        ),
    ));
    Ok(report)
}

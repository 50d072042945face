//! Level 3, interference: does the running agent change a real-time loop's wake-up latency?
//!
//! ```text
//! CPU last:   synthetic loop, SCHED_FIFO 80, mlockall, 1 kHz, probe ──────────────► records
//! CPU other:  agent (sampling the probe, thermal; draining a backlog through Mosquitto),
//!             Mosquitto, the fault proxy, this process
//! backlog:    filled through the agent's socket while the proxy blackholes the uplink,
//!             then the link passes and the agent drains it during the "on" blocks
//! pairs:      rounds of N × (on, off) 1 s blocks in seeded random order; off = SIGSTOP,
//!             on = SIGCONT; another round (backlog topped up) while the clean pairs are too
//!             few, too small a share of the pairs run, or the gate's interval holds the
//!             allowance, up to a maximum of pairs
//! per block:  wake-up latencies (start − release) of the cycles released in
//!             [start + guard, end); steal ticks of the loop's CPU; cycle-number gaps
//! drop:       a pair whose block saw steal, a gap, or fewer cycles than its length allows
//! gate:       bootstrap 95% bounds of the median paired Δp99 against max(25 µs, 25% baseline):
//!             PASS upper ≤ allowance, FAIL lower > allowance, else undecided (SKIP at the end)
//! reference:  cyclictest on the loop's CPU, agent on then off, after the pairs
//! ```
//!
//! Invariants:
//! - No verdict without evidence: fewer than `rule.min_clean_pairs` clean pairs or a share
//!   below `rule.min_clean_fraction` once `max_pairs` have run, a gate interval that still holds
//!   the allowance then, a refused SCHED_FIFO, or a single CPU give SKIP with the reason, never
//!   PASS and never FAIL.
//! - The agent is never left stopped: it is resumed before every exit path (its handle sends
//!   SIGCONT on drop).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::proxy::{Fault, FaultProxy};

use super::{LevelError, cpu_split, monotonic_ns, wait_for};
use crate::cyclictest::{self, CyclictestResult};
use crate::procfs;
use crate::rig::{
    AgentSpec, Binaries, LoopProcess, LoopSpec, ProbeSpec, RigAgent, RigError, default_capture,
    orin_sysfs, pin_self, scratch,
};
use crate::stats::{
    GateRule, LatencySummary, PairP99, SplitMix64, Step, Verdict, after_round, block_order,
    interference_gate,
};

/// Settings of level 3.
#[derive(Debug, Clone)]
pub struct InterferenceConfig {
    /// Pairs of blocks per round.
    pub pairs: usize,
    /// Most pairs run in all rounds, while the evidence rule asks for more.
    pub max_pairs: usize,
    /// Length of one block.
    pub block: Duration,
    /// Start of each block left out (the switch itself).
    pub guard: Duration,
    /// Seed of the block order and the bootstrap.
    pub seed: u64,
    /// Backlog events, submitted before the first round and again before each further round.
    pub backlog_events: usize,
    /// Padding bytes per backlog event.
    pub backlog_padding: usize,
    /// The agent's uplink bandwidth cap, bytes/s (0: none), so the backlog lasts the run.
    pub bandwidth_bytes_per_s: u64,
    /// cyclictest per arm, s (0: not run).
    pub cyclictest_seconds: u64,
    /// The loop's SCHED_FIFO priority.
    pub fifo_priority: u8,
    /// The gate.
    pub rule: GateRule,
    /// The tegrastats capture to replay.
    pub capture: PathBuf,
}

impl Default for InterferenceConfig {
    fn default() -> Self {
        Self {
            pairs: 30,
            max_pairs: 90,
            block: Duration::from_secs(1),
            guard: Duration::from_millis(100),
            seed: 0,
            backlog_events: 12_000,
            backlog_padding: 2_000,
            bandwidth_bytes_per_s: 512 * 1024,
            cyclictest_seconds: 3,
            fifo_priority: 80,
            rule: GateRule::default(),
            capture: default_capture(),
        }
    }
}

/// One block of one arm.
#[derive(Debug, Clone, Default)]
pub struct Block {
    /// The agent ran.
    pub agent_on: bool,
    /// Start, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// End, CLOCK_MONOTONIC ns.
    pub end_ns: u64,
    /// Steal ticks of the loop's CPU during the block.
    pub steal_ticks: u64,
    /// Cycles the block's measured span should hold.
    pub expected: u64,
    /// Missing cycle numbers between the block's first and last cycle.
    pub gaps: u64,
    /// Events the agent had acknowledged by the end of the block (agent-on blocks).
    pub events_acked: Option<u64>,
    /// Latencies, ns, sorted.
    pub latencies: Vec<u64>,
    /// Their summary.
    pub summary: LatencySummary,
}

impl Block {
    /// Why the block cannot be used, if it cannot.
    pub fn defect(&self) -> Option<String> {
        if self.steal_ticks > 0 {
            Some(format!("{} steal ticks", self.steal_ticks))
        } else if self.gaps > 0 {
            Some(format!("{} skipped cycles", self.gaps))
        } else if self.summary.count + 1 < self.expected {
            Some(format!(
                "{} of {} cycles",
                self.summary.count, self.expected
            ))
        } else {
            None
        }
    }
}

/// One pair.
#[derive(Debug, Clone, Default)]
pub struct Pair {
    /// The agent-on block ran first.
    pub on_first: bool,
    /// Agent on.
    pub on: Block,
    /// Agent off.
    pub off: Block,
}

impl Pair {
    /// Why the pair was dropped, if it was.
    pub fn dropped(&self) -> Option<String> {
        match (self.on.defect(), self.off.defect()) {
            (None, None) => None,
            (Some(on), None) => Some(format!("on: {on}")),
            (None, Some(off)) => Some(format!("off: {off}")),
            (Some(on), Some(off)) => Some(format!("on: {on}; off: {off}")),
        }
    }
}

/// What level 3 found.
#[derive(Debug, Clone)]
pub struct InterferenceReport {
    /// The gate's verdict.
    pub verdict: Verdict,
    /// Every pair, in run order.
    pub pairs: Vec<Pair>,
    /// The seed.
    pub seed: u64,
    /// The loop's CPU.
    pub loop_cpu: Option<usize>,
    /// The agent's CPUs.
    pub agent_cpus: Vec<usize>,
    /// Backlog events submitted.
    pub backlog_events: usize,
    /// Events acknowledged when the pairs started and when they ended.
    pub acked: (u64, u64),
    /// Latencies of the clean agent-on blocks, ns, sorted.
    pub on_latencies: Vec<u64>,
    /// Latencies of the clean agent-off blocks, ns, sorted.
    pub off_latencies: Vec<u64>,
    /// cyclictest on the loop's CPU: (arm, result or why not).
    pub cyclictest: Vec<(String, Result<CyclictestResult, String>)>,
    /// The loop's own JSON summary.
    pub loop_summary: serde_json::Value,
    /// Remarks for the report.
    pub notes: Vec<String>,
    /// The gate and evidence rule the verdict was reached by.
    pub rule: GateRule,
}

impl InterferenceReport {
    fn skipped(reason: String, seed: u64) -> Self {
        Self {
            verdict: Verdict::Skip {
                reason,
                numbers: None,
            },
            pairs: Vec::new(),
            seed,
            loop_cpu: None,
            agent_cpus: Vec::new(),
            backlog_events: 0,
            acked: (0, 0),
            on_latencies: Vec::new(),
            off_latencies: Vec::new(),
            cyclictest: Vec::new(),
            loop_summary: serde_json::Value::Null,
            notes: Vec::new(),
            rule: GateRule::default(),
        }
    }

    /// The clean pairs' p99s, µs.
    pub fn clean_p99s(&self) -> Vec<PairP99> {
        clean_p99s(&self.pairs)
    }
}

/// The p99s of the pairs not dropped, µs.
fn clean_p99s(pairs: &[Pair]) -> Vec<PairP99> {
    pairs
        .iter()
        .filter(|p| p.dropped().is_none())
        .map(|p| PairP99 {
            on_us: p.on.summary.p99_ns as f64 / 1000.0,
            off_us: p.off.summary.p99_ns as f64 / 1000.0,
        })
        .collect()
}

/// One probe record, as kept between polls.
#[derive(Debug, Clone, Copy)]
struct Seen {
    cycle: u64,
    release_ns: u64,
    start_ns: u64,
}

/// Runs level 3.
pub fn run(bins: &Binaries, config: &InterferenceConfig) -> Result<InterferenceReport, LevelError> {
    let Some((agent_cpus, loop_cpu)) = cpu_split() else {
        return Ok(InterferenceReport::skipped(
            "level 3 needs two CPUs (the loop alone on one)".into(),
            config.seed,
        ));
    };
    pin_self(&agent_cpus)?;
    let dir = scratch("edgewatch-hil-interference-")?;
    let sysfs = orin_sysfs(&dir.path().join("sysfs"))?;
    let broker = Mosquitto::start()?;
    let _subscriber = crate::rig::Subscriber::start(broker.addr())?;
    let proxy = FaultProxy::start(broker.addr())?;
    proxy.set(Fault::Blackhole);

    let probe = dir.path().join("control.probe");
    let loop_spec = LoopSpec {
        probe: probe.clone(),
        loop_id: 1,
        name: "control".into(),
        rate_hz: 1000.0,
        budget_ms: 0.5,
        deadline_ms: None,
        fifo: Some(config.fifo_priority),
        cpu: Some(loop_cpu),
        require_rt: true,
        capacity: None,
    };
    let mut control = match LoopProcess::start(&bins.synthetic_loop, &loop_spec) {
        Ok(control) => control,
        Err(RigError::NotStarted { detail, .. }) if detail.starts_with("exit status: 77") => {
            return Ok(InterferenceReport::skipped(
                format!(
                    "the loop was refused SCHED_FIFO or memory locking (inside a cgroup with RT_GROUP_SCHED, FIFO gets EPERM): {detail}"
                ),
                config.seed,
            ));
        }
        Err(error) => return Err(error.into()),
    };

    let spec = AgentSpec {
        uplink_port: proxy.port(),
        backoff_ms: (200, 1000),
        cores: agent_cpus.clone(),
        control_loop_cores: vec![loop_cpu],
        probes: vec![ProbeSpec {
            path: probe.clone(),
            loop_name: "control".into(),
        }],
        poll_hz: 100,
        snapshot_interval_s: 10,
        sysfs_root: sysfs.root().to_owned(),
        sysfs_poll_ms: 100,
        capture: config.capture.clone(),
        replay_speed: 10.0,
        counters_interval_s: 10,
        debug_sample_every: 10,
        bandwidth_bytes_per_s: config.bandwidth_bytes_per_s,
    };
    let agent_dir = dir.path().join("agent");
    std::fs::create_dir_all(&agent_dir).map_err(|source| LevelError::Io {
        context: "creating the agent directory".into(),
        source,
    })?;
    let mut agent = RigAgent::start(&bins.agent, &spec, &agent_dir, &[])?;
    crate::backlog::fill(
        &agent.socket(),
        config.backlog_events,
        config.backlog_padding,
    )?;
    proxy.set(Fault::Pass);
    let mut notes = Vec::new();
    if !wait_for(Duration::from_secs(30), || {
        agent.status()["uplink"]["connected"].as_bool() == Some(true)
    }) {
        let log = agent.log();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        notes.push(format!(
            "the agent had not reported a connection 30 s after the link came up (log tail: {})",
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        ));
    }
    let acked = |agent: &RigAgent| agent.status()["uplink"]["events_acked"].as_u64();
    let acked_start = acked(&agent).unwrap_or(0);

    let mut reader = loop_probe::ProbeReader::open(&probe).map_err(|e| LevelError::Io {
        context: "opening the loop's probe".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let period_ns = reader.info().period_ns;
    let max_pairs = config.max_pairs.max(config.pairs);
    let mut seen: Vec<Seen> = Vec::with_capacity(max_pairs * 2 * 1100 + 20_000);
    let mut poll = |seen: &mut Vec<Seen>| {
        let _ = reader.poll(monotonic_ns(), &mut |r: &loop_probe::Record| {
            seen.push(Seen {
                cycle: r.cycle,
                release_ns: r.release_ns,
                start_ns: r.start_ns,
            });
        });
    };
    poll(&mut seen);
    seen.clear();

    let guard_ns = config.guard.as_nanos() as u64;
    let mut rng = SplitMix64::new(config.seed);
    let mut pairs: Vec<Pair> = Vec::with_capacity(max_pairs);
    let mut round = config.pairs;
    let mut top_ups = 0;
    let verdict = loop {
        let order = block_order(round, &mut rng);
        let first = pairs.len();
        for &on_first in &order {
            let mut pair = Pair {
                on_first,
                ..Pair::default()
            };
            for on in [on_first, !on_first] {
                if on {
                    agent.resume();
                } else {
                    agent.pause();
                }
                let steal0 = procfs::steal(Some(loop_cpu))?;
                let start_ns = monotonic_ns();
                std::thread::sleep(config.block);
                let end_ns = monotonic_ns();
                let steal1 = procfs::steal(Some(loop_cpu))?;
                poll(&mut seen);
                let block = Block {
                    agent_on: on,
                    start_ns,
                    end_ns,
                    steal_ticks: steal1.saturating_sub(steal0),
                    events_acked: if on { acked(&agent) } else { None },
                    ..Block::default()
                };
                if on {
                    pair.on = block;
                } else {
                    pair.off = block;
                }
            }
            pairs.push(pair);
        }
        agent.resume();
        std::thread::sleep(Duration::from_millis(50));
        poll(&mut seen);
        for pair in &mut pairs[first..] {
            for block in [&mut pair.on, &mut pair.off] {
                fill_block(block, &seen, guard_ns, period_ns);
            }
        }
        let clean = clean_p99s(&pairs);
        match after_round(
            &clean,
            pairs.len(),
            config.pairs,
            max_pairs,
            &config.rule,
            config.seed,
        ) {
            Step::Decide(reached) => break reached,
            Step::MorePairs(more) => {
                notes.push(match interference_gate(&clean, &config.rule, config.seed).numbers() {
                    Some(n) => format!(
                        "after {} pairs, {} clean, the median paired Δp99 lay between {:+.1} and {:+.1} µs, across the allowance of {:.1} µs: {more} more pairs ran",
                        pairs.len(),
                        clean.len(),
                        n.lower_bound_us,
                        n.upper_bound_us,
                        n.allowance_us
                    ),
                    None => format!(
                        "after {} pairs only {} were clean: {more} more pairs ran",
                        pairs.len(),
                        clean.len()
                    ),
                });
                // The further round's agent-on blocks drain too, as the first round's did.
                crate::backlog::fill_from(
                    &agent.socket(),
                    top_ups * config.backlog_events + config.backlog_events,
                    config.backlog_events,
                    config.backlog_padding,
                )?;
                top_ups += 1;
                round = more;
            }
        }
    };
    // The agent rewrites its status file every second.
    std::thread::sleep(Duration::from_millis(1200));
    let acked_end = acked(&agent).unwrap_or(acked_start);
    let backlog = (config.backlog_events * (top_ups + 1)) as u64;
    if let Some(k) = pairs
        .iter()
        .position(|p| p.on.events_acked.is_some_and(|a| a >= backlog))
    {
        notes.push(format!(
            "the backlog was drained by pair {} of {}: later agent-on blocks only sampled",
            k + 1,
            pairs.len()
        ));
    }

    let loop_summary = control.stop()?;
    let mut cyclictest_runs = Vec::new();
    if config.cyclictest_seconds > 0 {
        let main_cpus = agent_cpus
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",");
        for on in [true, false] {
            if on {
                agent.resume();
            } else {
                agent.pause();
            }
            let label = if on { "agent on" } else { "agent off" };
            cyclictest_runs.push((
                label.to_owned(),
                run_cyclictest(loop_cpu, config.cyclictest_seconds, &main_cpus),
            ));
        }
        agent.resume();
    }
    agent.terminate();

    let mut on_latencies = Vec::new();
    let mut off_latencies = Vec::new();
    for pair in pairs.iter().filter(|p| p.dropped().is_none()) {
        on_latencies.extend_from_slice(&pair.on.latencies);
        off_latencies.extend_from_slice(&pair.off.latencies);
    }
    on_latencies.sort_unstable();
    off_latencies.sort_unstable();
    let report = InterferenceReport {
        verdict,
        pairs,
        seed: config.seed,
        loop_cpu: Some(loop_cpu),
        agent_cpus,
        backlog_events: config.backlog_events * (top_ups + 1),
        acked: (acked_start, acked_end),
        on_latencies,
        off_latencies,
        cyclictest: cyclictest_runs,
        loop_summary,
        notes,
        rule: config.rule,
    };
    Ok(report)
}

/// Assigns the records released in `[start + guard, end)` to `block`.
fn fill_block(block: &mut Block, seen: &[Seen], guard_ns: u64, period_ns: u64) {
    let from = block.start_ns + guard_ns;
    let mut cycles = Vec::new();
    for s in seen
        .iter()
        .filter(|s| s.release_ns >= from && s.release_ns < block.end_ns)
    {
        block
            .latencies
            .push(s.start_ns.saturating_sub(s.release_ns));
        cycles.push(s.cycle);
    }
    cycles.sort_unstable();
    cycles.dedup();
    block.gaps = match (cycles.first(), cycles.last()) {
        (Some(first), Some(last)) => (last - first + 1) - cycles.len() as u64,
        _ => 0,
    };
    block.expected = block.end_ns.saturating_sub(from) / period_ns.max(1);
    block.summary = LatencySummary::of(&mut block.latencies);
}

/// cyclictest on `cpu` for `seconds`, parsed; the error says why not.
pub fn run_cyclictest(
    cpu: usize,
    seconds: u64,
    main_cpus: &str,
) -> Result<CyclictestResult, String> {
    let args = cyclictest::args(cpu, 80, seconds, 1000, main_cpus);
    let output = Command::new("cyclictest")
        .args(&args)
        .output()
        .map_err(|e| {
            format!("cyclictest could not run ({e}); install it with apt-get install -y rt-tests")
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "cyclictest {} failed with {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    cyclictest::parse(&stdout).map_err(|e| e.to_string())
}

//! `edgewatch-hil`: runs the HIL levels against the real agent and writes the report.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use edgewatch_hil::levels::footprint::{self, FootprintConfig};
use edgewatch_hil::levels::interference::{self, InterferenceConfig};
use edgewatch_hil::levels::invariants::{self, InvariantsConfig};
use edgewatch_hil::levels::jetson::{self, AgentControl, JetsonConfig};
use edgewatch_hil::levels::{LevelError, cpu_split};
use edgewatch_hil::report::{self, RunReport};
use edgewatch_hil::rig::Binaries;

/// Bad arguments: the workspace's exit status for bad configuration.
const EXIT_USAGE: u8 = edgewatch_conventions::config::EXIT_BAD_CONFIG;
/// The machine cannot run the level (not a Jetson, a tool missing).
const EXIT_UNAVAILABLE: u8 = 69;
/// The rig failed (a process would not start, /proc unreadable).
const EXIT_SOFTWARE: u8 = 70;

#[derive(Debug, Parser)]
#[command(
    name = "edgewatch-hil",
    version,
    about = "HIL timing validation of the edgewatch agent"
)]
struct Cli {
    #[command(subcommand)]
    command: Level,
}

#[derive(Debug, Args)]
struct Common {
    /// Directory for report.md and latency.png.
    #[arg(long, default_value = "hil-report")]
    out: PathBuf,
    /// edgewatch-agent binary (default: beside edgewatch-hil).
    #[arg(long)]
    agent_bin: Option<PathBuf>,
    /// edgewatch-synthetic-loop binary (default: beside edgewatch-hil).
    #[arg(long)]
    loop_bin: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct Ladder {
    /// Footprint window, seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Interference pairs of 1 s blocks per round (at least 30 for a verdict worth having).
    #[arg(long, default_value_t = 30)]
    pairs: usize,
    /// Most interference pairs in all, while too few of them are clean (rounds of --pairs).
    #[arg(long, default_value_t = 90)]
    max_pairs: usize,
    /// Seed of the block order and the bootstrap (default: from the clock; printed).
    #[arg(long)]
    seed: Option<u64>,
    /// cyclictest seconds per arm in the interference level (0: not run).
    #[arg(long, default_value_t = 3)]
    cyclictest_seconds: u64,
}

#[derive(Debug, Subcommand)]
enum Level {
    /// Level 1: no syscall in record(), r--s mappings, affinity, SCHED_IDLE, no allocation.
    Invariants {
        #[command(flatten)]
        common: Common,
    },
    /// Level 2: CPU time, wake-ups, allocations and peak RSS at 10× poll rates; preemption
    /// against a reference process.
    Footprint {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        ladder: Ladder,
    },
    /// Level 3: paired agent-on/off blocks around a SCHED_FIFO 1 kHz loop.
    Interference {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        ladder: Ladder,
    },
    /// Levels 1 to 3.
    All {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        ladder: Ladder,
    },
    /// Level 4, on a Jetson: cyclictest on the isolated core, agent on/off blocks, stress-ng.
    Jetson {
        #[command(flatten)]
        common: Common,
        /// The isolated control core (default: the last CPU).
        #[arg(long)]
        control_cpu: Option<usize>,
        /// Housekeeping cores, e.g. `0-2` (default: every other CPU).
        #[arg(long)]
        housekeeping: Option<String>,
        /// Length of one block, seconds.
        #[arg(long, default_value_t = 600)]
        block_seconds: u64,
        /// Blocks, alternating agent off/on starting with off.
        #[arg(long, default_value_t = 6)]
        blocks: usize,
        /// Switch a running agent (e.g. the service) by SIGSTOP/SIGCONT.
        #[arg(long, conflicts_with = "agent_config")]
        agent_pid: Option<u32>,
        /// Start `edgewatch-agent run --config PATH` and switch it.
        #[arg(long)]
        agent_config: Option<PathBuf>,
        /// Do not run stress-ng.
        #[arg(long)]
        no_stress: bool,
        /// stress-ng --vm-bytes.
        #[arg(long, default_value = "1G")]
        vm_bytes: String,
        /// Extra load on the housekeeping cores, run with `sh -c` (e.g. a trtexec loop).
        #[arg(long)]
        extra_load: Option<String>,
        /// Run even without /etc/nv_tegra_release.
        #[arg(long)]
        force: bool,
    },
    /// Internal: the footprint level's reference, a SCHED_IDLE sleeper (runs until killed).
    #[command(hide = true)]
    ReferenceSleeper {
        /// CPUs to pin to, e.g. `0,1`.
        #[arg(long)]
        cpus: Option<String>,
        #[arg(long)]
        rate_hz: f64,
        #[arg(long)]
        work_us: u64,
    },
    /// Internal: record cycles under seccomp strict mode (level 1 runs this).
    #[command(hide = true)]
    SeccompRecord {
        #[arg(long)]
        probe: PathBuf,
        #[arg(long)]
        count: u64,
        #[arg(long)]
        syscall_after: bool,
    },
}

fn binaries(common: &Common) -> Result<Binaries, ExitCode> {
    Binaries::beside_current_exe(common.agent_bin.clone(), common.loop_bin.clone()).map_err(|e| {
        eprintln!("edgewatch-hil: {e}");
        ExitCode::from(EXIT_USAGE)
    })
}

fn level_error(error: &LevelError) -> ExitCode {
    eprintln!("edgewatch-hil: {error}");
    match error {
        LevelError::Unsupported(_) => ExitCode::from(EXIT_UNAVAILABLE),
        _ => ExitCode::from(EXIT_SOFTWARE),
    }
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn parse_cpus(text: &str) -> Result<Vec<usize>, ExitCode> {
    edgewatch_hil::procfs::parse_cpu_list(text).ok_or_else(|| {
        eprintln!("edgewatch-hil: `{text}` is not a CPU list such as 0-2,4");
        ExitCode::from(EXIT_USAGE)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command_line = std::env::args().collect::<Vec<_>>().join(" ");
    match cli.command {
        Level::SeccompRecord {
            probe,
            count,
            syscall_after,
        } => {
            let error = edgewatch_hil::seccomp::child(&probe, count, syscall_after);
            eprintln!("edgewatch-hil seccomp-record: {error}");
            ExitCode::from(EXIT_SOFTWARE)
        }
        Level::ReferenceSleeper {
            cpus,
            rate_hz,
            work_us,
        } => {
            let cpus = match cpus.as_deref().map(parse_cpus).transpose() {
                Ok(cpus) => cpus.unwrap_or_default(),
                Err(code) => return code,
            };
            let error =
                edgewatch_hil::reference::child(&cpus, rate_hz, Duration::from_micros(work_us));
            eprintln!("edgewatch-hil reference-sleeper: {error}");
            ExitCode::from(EXIT_SOFTWARE)
        }
        Level::Invariants { common } => ladder(&common, None, (true, false, false), &command_line),
        Level::Footprint { common, ladder: l } => {
            ladder(&common, Some(&l), (false, true, false), &command_line)
        }
        Level::Interference { common, ladder: l } => {
            ladder(&common, Some(&l), (false, false, true), &command_line)
        }
        Level::All { common, ladder: l } => {
            ladder(&common, Some(&l), (true, true, true), &command_line)
        }
        Level::Jetson {
            common,
            control_cpu,
            housekeeping,
            block_seconds,
            blocks,
            agent_pid,
            agent_config,
            no_stress,
            vm_bytes,
            extra_load,
            force,
        } => {
            if let Err(error) = jetson::platform_check(force) {
                return level_error(&error);
            }
            let agent = match (agent_pid, agent_config) {
                (Some(pid), _) => AgentControl::Pid(pid),
                (None, Some(path)) => AgentControl::Config(path),
                (None, None) => {
                    eprintln!(
                        "edgewatch-hil jetson: name the agent with --agent-pid PID (a running service) or --agent-config PATH"
                    );
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let split = cpu_split();
            let control_cpu = match control_cpu.or(split.as_ref().map(|s| s.1)) {
                Some(cpu) => cpu,
                None => {
                    eprintln!("edgewatch-hil jetson: --control-cpu is needed on this machine");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let housekeeping = match housekeeping {
                Some(text) => match parse_cpus(&text) {
                    Ok(cpus) => cpus,
                    Err(code) => return code,
                },
                None => edgewatch_hil::procfs::own_cpus()
                    .into_iter()
                    .filter(|&c| c != control_cpu)
                    .collect(),
            };
            let bins = match binaries(&common) {
                Ok(bins) => bins,
                Err(code) => return code,
            };
            let config = JetsonConfig {
                control_cpu,
                housekeeping,
                block: Duration::from_secs(block_seconds),
                blocks,
                agent,
                stress: !no_stress,
                stress_vm_bytes: vm_bytes,
                extra_load,
                slack_us: 10,
                histogram_us: 400,
                force,
            };
            match jetson::run(&bins, &config) {
                Ok(result) => {
                    let run = RunReport {
                        command: command_line,
                        unix_s: now_s(),
                        machine: report::machine_facts(),
                        jetson: Some(&result),
                        ..RunReport::default()
                    };
                    finish(&common.out, &run, result.verdict.pass)
                }
                Err(error) => level_error(&error),
            }
        }
    }
}

fn finish(out: &std::path::Path, run: &RunReport<'_>, pass: bool) -> ExitCode {
    match report::write(out, run) {
        Ok((md, png)) => {
            println!("report: {}", md.display());
            if let Some(png) = png {
                println!("chart: {}", png.display());
            }
        }
        Err(error) => {
            eprintln!(
                "edgewatch-hil: writing the report to {}: {error}",
                out.display()
            );
            return ExitCode::from(EXIT_SOFTWARE);
        }
    }
    if pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn ladder(
    common: &Common,
    ladder: Option<&Ladder>,
    (one, two, three): (bool, bool, bool),
    command_line: &str,
) -> ExitCode {
    let bins = match binaries(common) {
        Ok(bins) => bins,
        Err(code) => return code,
    };
    let mut pass = true;
    let inv = if one {
        match invariants::run(&bins, &InvariantsConfig::default()) {
            Ok(r) => {
                println!(
                    "level 1 invariants: {}",
                    if r.pass() { "PASS" } else { "FAIL" }
                );
                for c in r.checks.iter().filter(|c| !c.pass) {
                    println!("  FAIL {}: {}", c.name, c.detail);
                }
                pass &= r.pass();
                Some(r)
            }
            Err(error) => return level_error(&error),
        }
    } else {
        None
    };
    let foot = if two {
        let seconds = ladder.map_or(60, |l| l.seconds);
        let config = FootprintConfig {
            window: Duration::from_secs(seconds),
            ..FootprintConfig::default()
        };
        match footprint::run(&bins, &config) {
            Ok(r) => {
                println!(
                    "level 2 footprint: {} (CPU {:.3}% of a core, {:.1} wake-ups/s, {:.0} allocations/s, VmHWM {:.1} MiB; {} preemptions, the reference's {})",
                    if r.pass() { "PASS" } else { "FAIL" },
                    r.cpu_fraction() * 100.0,
                    r.wakeups_per_s(),
                    r.allocations_per_s(),
                    r.vm_hwm_kib as f64 / 1024.0,
                    r.nonvoluntary,
                    r.reference.nonvoluntary
                );
                for c in &r.checks {
                    if c.skipped {
                        println!("  SKIP {}: {}", c.name, c.detail);
                    } else if !c.pass {
                        println!("  FAIL {}: {}", c.name, c.detail);
                    }
                }
                pass &= r.pass();
                Some(r)
            }
            Err(error) => return level_error(&error),
        }
    } else {
        None
    };
    let inter = if three {
        let seed = ladder.and_then(|l| l.seed).unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
        let config = InterferenceConfig {
            pairs: ladder.map_or(30, |l| l.pairs),
            max_pairs: ladder.map_or(90, |l| l.max_pairs),
            seed,
            cyclictest_seconds: ladder.map_or(3, |l| l.cyclictest_seconds),
            ..InterferenceConfig::default()
        };
        match interference::run(&bins, &config) {
            Ok(r) => {
                match (r.verdict.numbers(), &r.verdict) {
                    (_, edgewatch_hil::stats::Verdict::Skip { reason, .. }) => {
                        println!("level 3 interference: SKIP: {reason} (seed {seed})");
                    }
                    (Some(n), verdict) => {
                        println!(
                            "level 3 interference: {} (seed {seed}; {} clean pairs; median Δp99 {:+.1} µs, bounds {:+.1} to {:+.1} µs, allowance {:.1} µs)",
                            verdict.word(),
                            n.pairs,
                            n.median_delta_us,
                            n.lower_bound_us,
                            n.upper_bound_us,
                            n.allowance_us
                        );
                    }
                    (None, verdict) => println!("level 3 interference: {}", verdict.word()),
                }
                pass &= !matches!(r.verdict, edgewatch_hil::stats::Verdict::Fail(_));
                Some(r)
            }
            Err(error) => return level_error(&error),
        }
    } else {
        None
    };
    let run = RunReport {
        command: command_line.to_owned(),
        unix_s: now_s(),
        machine: report::machine_facts(),
        invariants: inv.as_ref(),
        footprint: foot.as_ref(),
        interference: inter.as_ref(),
        jetson: None,
    };
    finish(&common.out, &run, pass)
}

//! One demo run, start to end: write the files, build the binaries, start the embedded broker,
//! the fault proxy, the gateway and the agents, run the control loops through the timeline
//! (partition, heat wave), wait until every queued event is in the gateway's store, stop, and
//! produce the report and the FOCUS export.
//!
//! ```text
//! files ─► build ─► broker (rumqttd) ─► proxy ─► gateway ─► agents connected ─► loops start
//!   ─► timeline: blackhole truck-102 · heat grader-301 · SIGKILL truck-101's agent · heal
//!      · start truck-101's agent again · cool ─► loops end
//!   ─► every agent saw its loop end ─► drain (store holds every sequence number queued by
//!      then) ─► stop agents, gateway ─► report, FOCUS ─► summary
//! ```
//!
//! Invariants:
//! - Progress goes to the writer handed in, one short line at a time; process output goes to log
//!   files, never to the terminal.
//! - The run fails (and says which log to read) if the gateway or an agent dies, or does not get
//!   ready; it never reports on a fleet that did not run. The agent the demo kills is the one
//!   exception, while it is down.
//! - The loops stop before the agents, and the drain's targets are taken only after each agent
//!   has seen its loop end, from a queue snapshot written later with nothing pending: so the
//!   loop's final counters are among what the drain waits for, however late an agent polls.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgewatch_harness::embedded::EmbeddedBroker;
use edgewatch_harness::proxy::{Fault, FaultProxy};

use crate::files::{self, GatewaySettings, Layout};
use crate::fleet::{Agent, AgentCounts, ControlLoop, FleetError, Gateway, GatewayCounts};
use crate::scenario::{LOOP_BUDGET_MS, LOOP_RATE_HZ, MODEL, Plan, Role};
use crate::summary::{
    DemoSummary, HeatSummary, MachineSummary, PartitionSummary, RestartSummary, Timings,
};
use crate::sysfs::{self, ThermalTree};

/// How a run is set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// The scenario.
    pub plan: Plan,
    /// Output directory (created; must not hold a previous run).
    pub out: PathBuf,
    /// After the report, leave broker, gateway and agents running until the process is stopped.
    pub keep: bool,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// A file could not be written or read.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// The output directory already holds a run.
    #[error("{0} already holds a demo run; give another --out")]
    OutputExists(PathBuf),
    /// Building the binaries or starting the broker or proxy failed.
    #[error(transparent)]
    Harness(#[from] edgewatch_harness::HarnessError),
    /// A process failed.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// A gateway command failed.
    #[error("edgewatch-gateway {command} failed ({status}): {stderr}")]
    Gateway {
        /// The subcommand.
        command: String,
        /// Exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> DemoError {
    let context = context.into();
    move |source| DemoError::Io { context, source }
}

/// What the caller prints at the end.
pub struct Outcome {
    /// The run.
    pub summary: DemoSummary,
    /// `edgewatch-gateway report` as printed.
    pub report: String,
    /// The gateway binary (to re-run the report).
    pub gateway_binary: PathBuf,
    /// The fleet page's address (served while the gateway runs: with `--keep`, until Ctrl-C).
    pub page_url: String,
    /// With `--keep`: the fleet, still running.
    pub kept: Option<Kept>,
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The binaries the demo runs, built (or found up to date) in the demo's own profile.
const BINARIES: [(&str, &str); 3] = [
    ("edgewatch-agent", "edgewatch-agent"),
    ("edgewatch-gateway", "edgewatch-gateway"),
    ("edgewatch-synthetic-loop", "edgewatch-synthetic-loop"),
];

/// Runs the demo, writing progress lines to `out`.
pub fn run(options: &Options, out: &mut dyn Write) -> Result<Outcome, DemoError> {
    let started = Instant::now();
    let plan = &options.plan;
    let layout = Layout::new(options.out.clone());
    if layout.summary().exists() || layout.gateway_config().exists() {
        return Err(DemoError::OutputExists(options.out.clone()));
    }
    layout
        .create(plan)
        .map_err(io(format!("writing {}", options.out.display())))?;
    let mut say = |line: String| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };

    say("[setup] building the agent, gateway and control-loop binaries (the first run compiles them)".into());
    let build = Instant::now();
    // Selecting this package too gives the build the features this binary was built with, so
    // a first run compiles each dependency once.
    let binaries =
        edgewatch_harness::binaries::workspace_binaries(&BINARIES, &[env!("CARGO_PKG_NAME")])?;
    let [agent_bin, gateway_bin, loop_bin] = [&binaries[0], &binaries[1], &binaries[2]];
    let build_s = build.elapsed().as_secs_f64();
    say(format!(
        "[setup] binaries ready in {build_s:.1} s ({})",
        short(agent_bin.parent().unwrap_or(Path::new(".")))
    ));

    let setup = Instant::now();
    let broker = EmbeddedBroker::start()?;
    let partitioned = plan
        .machine(Role::Partitioned)
        .map(|m| m.id)
        .unwrap_or_default();
    let proxy = FaultProxy::start(broker.addr())?;
    say(format!(
        "[setup] embedded MQTT broker (rumqttd) on {}; {partitioned} connects through a fault proxy on {}",
        broker.addr(),
        proxy.addr()
    ));

    let metrics = SocketAddr::from(([127, 0, 0, 1], edgewatch_harness::net::free_port()?));
    let page = SocketAddr::from(([127, 0, 0, 1], edgewatch_harness::net::free_port()?));
    // Shares are priced per UTC day; the loops start within seconds and may cross midnight.
    let days = files::days_of(
        unix_ms(),
        i64::try_from(plan.duration.as_millis()).unwrap_or(i64::MAX),
    );
    let gateway_config = files::gateway_toml(
        plan,
        &GatewaySettings {
            broker: broker.addr(),
            metrics,
            page,
            store: layout.store(),
            days,
        },
    );
    std::fs::write(layout.gateway_config(), gateway_config)
        .map_err(io("writing the gateway configuration"))?;
    let mut gateway = Gateway::start(
        gateway_bin,
        &layout.gateway_config(),
        &layout.gateway_log(),
        metrics,
    )?;
    say(format!(
        "[setup] gateway subscribed; store {}; fleet page: http://{page}/",
        short(&layout.store())
    ));

    let mut thermal = None;
    let mut agents = Vec::new();
    for machine in &plan.machines {
        let paths = layout.machine(machine.id);
        if machine.role == Role::Throttling {
            thermal = Some(
                ThermalTree::create(&paths.sysfs).map_err(io("building the fake sysfs tree"))?,
            );
        }
        let uplink = if machine.role == Role::Partitioned {
            proxy.addr()
        } else {
            broker.addr()
        };
        let config = files::agent_toml(machine, &paths, uplink);
        agents.push(Agent::start(agent_bin, machine, paths, &config)?);
    }
    for agent in &mut agents {
        agent.wait_connected(Duration::from_secs(30))?;
    }
    say(format!("[setup] {} agents connected", agents.len()));
    let setup_s = setup.elapsed().as_secs_f64();

    // The control loops, and the timeline around them.
    let run_started = Instant::now();
    let loops_started_unix_ms = unix_ms();
    let mut loops = Vec::new();
    for machine in &plan.machines {
        loops.push(ControlLoop::start(
            loop_bin,
            machine,
            &layout.machine(machine.id),
            plan.duration,
        )?);
    }
    say(format!(
        "[   0s] control loops started: {} machines at {LOOP_RATE_HZ} Hz, {LOOP_BUDGET_MS} ms budget, for {} s",
        loops.len(),
        plan.duration.as_secs()
    ));
    let heated = plan
        .machine(Role::Throttling)
        .map(|m| m.id)
        .unwrap_or_default();
    let progress_every = if plan.duration >= Duration::from_secs(60) {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(5)
    };
    let mut next_progress = progress_every;
    let (mut partition_start, mut partition_heal) = (None, None);
    let (mut heat_start, mut heat_end) = (None, None);
    let mut peak_backlog = 0;
    let mut latest: Vec<AgentCounts> = vec![AgentCounts::default(); agents.len()];
    let partitioned_ix = plan
        .machines
        .iter()
        .position(|m| m.role == Role::Partitioned);
    // The agent killed and started again: the overrunning machine's. SIGKILL, not SIGTERM: a
    // crash hands nothing in, so what its loop did since the agent's last durable state, and
    // while the agent is down, can only come from the probe's header when the agent is back.
    let restarted_ix = plan.machines.iter().position(|m| m.role == Role::Overruns);
    let restarted = restarted_ix.map_or("", |i| plan.machines[i].id);
    let (mut killed_at, mut restarted_at) = (None, None);
    loop {
        let elapsed = run_started.elapsed();
        let stamp = format!("[{:>4}s]", elapsed.as_secs());
        for agent in &mut agents {
            agent.process.check_running()?;
        }
        gateway.process.check_running()?;
        for (i, agent) in agents.iter().enumerate() {
            if let Some(counts) = agent.counts() {
                latest[i] = counts;
            }
        }
        if partition_start.is_some()
            && partition_heal.is_none()
            && let Some(i) = partitioned_ix
        {
            peak_backlog = peak_backlog.max(latest[i].backlog);
        }
        if partition_start.is_none() && elapsed >= plan.partition.start {
            proxy.set(Fault::Blackhole);
            partition_start = Some(unix_ms());
            say(format!(
                "{stamp} partition: {partitioned}'s link to the broker is blackholed; its agent queues on disk"
            ));
        }
        if partition_heal.is_none() && elapsed >= plan.partition.end {
            // Connections that lived through the partition are reset, as a peer that gave up
            // would reset them; the agent reconnects and re-sends what was not acknowledged.
            proxy.heal_with_reset();
            partition_heal = Some(unix_ms());
            let backlog = partitioned_ix.map_or(0, |i| latest[i].backlog);
            say(format!(
                "{stamp} partition healed: {partitioned} reconnects with {backlog} records queued"
            ));
        }
        if let Some(i) = restarted_ix {
            if killed_at.is_none() && elapsed >= plan.agent_down.start {
                agents[i].process.kill();
                killed_at = Some(unix_ms());
                say(format!(
                    "{stamp} {restarted}: agent killed (SIGKILL); its control loop keeps running"
                ));
            }
            if restarted_at.is_none() && elapsed >= plan.agent_down.end {
                restarted_at = Some(unix_ms());
                agents[i].process.respawn()?;
                say(format!(
                    "{stamp} {restarted}: agent started again; it continues from what its queue kept"
                ));
            }
        }
        if let Some(tree) = &thermal {
            if heat_start.is_none() && elapsed >= plan.heat.start {
                tree.set_gpu_millicelsius(sysfs::GPU_HOT_MILLICELSIUS)
                    .map_err(io("heating the GPU zone"))?;
                heat_start = Some(unix_ms());
                say(format!(
                    "{stamp} {heated}: GPU zone at {:.1} °C, past its {:.1} °C passive trip point: throttling",
                    celsius(sysfs::GPU_HOT_MILLICELSIUS),
                    celsius(sysfs::GPU_TRIP_MILLICELSIUS)
                ));
            }
            if heat_end.is_none() && elapsed >= plan.heat.end {
                tree.set_gpu_millicelsius(sysfs::GPU_COOL_MILLICELSIUS)
                    .map_err(io("cooling the GPU zone"))?;
                heat_end = Some(unix_ms());
                say(format!(
                    "{stamp} {heated}: GPU zone back to {:.1} °C",
                    celsius(sysfs::GPU_COOL_MILLICELSIUS)
                ));
            }
        }
        let running = loops
            .iter_mut()
            .map(|l| l.process.exited().is_none())
            .filter(|&alive| alive)
            .count();
        if elapsed >= next_progress && running > 0 {
            next_progress += progress_every;
            say(format!(
                "{stamp} {}",
                progress_line(
                    &agents,
                    &latest,
                    gateway.counts(),
                    &Offline {
                        partitioned: (partition_start.is_some() && partition_heal.is_none())
                            .then_some(partitioned),
                        agent_down: (killed_at.is_some() && restarted_at.is_none())
                            .then_some(restarted),
                    }
                )
            ));
        }
        if running == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let loops_ended_unix_ms = unix_ms();
    let run_s = run_started.elapsed().as_secs_f64();
    let mut injected = Vec::new();
    for control_loop in &mut loops {
        injected.push(control_loop.summary()?);
    }
    let line = plan
        .machines
        .iter()
        .zip(&injected)
        .map(|(m, s)| {
            format!(
                "{} {} activations/{} deadline misses",
                m.id, s.tally.total.activations, s.tally.total.deadline_misses
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    say(format!(
        "[{:>4}s] control loops done: {line}",
        run_s.round()
    ));

    // Drain: every record queued up to now must reach the store.
    let drain = Instant::now();
    let drained = drain_all(&agents, &layout.store(), Duration::from_secs(90))?;
    let drain_s = drain.elapsed().as_secs_f64();
    for (i, agent) in agents.iter().enumerate() {
        if let Some(counts) = agent.counts() {
            latest[i] = counts;
        }
    }
    if drained {
        say(format!(
            "[{:>4}s] drained in {drain_s:.1} s: the gateway's store holds every event the agents queued",
            run_started.elapsed().as_secs()
        ));
    } else {
        say(format!(
            "[{:>4}s] not everything arrived within 90 s; the report shows what did (see the agents' logs)",
            run_started.elapsed().as_secs()
        ));
    }

    let report_started = Instant::now();
    if !options.keep {
        for agent in &agents {
            agent.process.signal(libc::SIGTERM);
        }
        for agent in &mut agents {
            agent.process.terminate(Duration::from_secs(10));
        }
    }
    let gateway_counts = gateway.counts().unwrap_or_default();
    if !options.keep {
        gateway.process.terminate(Duration::from_secs(15));
        say(format!(
            "[{:>4}s] agents and gateway stopped",
            run_started.elapsed().as_secs()
        ));
    }

    let report_at_ms = unix_ms();
    let report_from = day(loops_started_unix_ms);
    let report_to = day(report_at_ms + edgewatch_slo::MS_PER_DAY);
    let report_at = edgewatch_slo::format_rfc3339(report_at_ms);
    let period = ["--from", &report_from, "--to", &report_to];
    let report = gateway_command(
        gateway_bin,
        &layout.gateway_config(),
        &[&["report", "--at", &report_at][..], &period[..]].concat(),
    )?;
    std::fs::write(layout.report_text(), &report).map_err(io("writing the report"))?;
    let json = gateway_command(
        gateway_bin,
        &layout.gateway_config(),
        &[&["report", "--json", "--at", &report_at][..], &period[..]].concat(),
    )?;
    std::fs::write(layout.report_json(), json).map_err(io("writing the JSON report"))?;
    let focus = layout.focus_csv();
    let autonomy = layout.focus_autonomy_csv();
    let (focus, autonomy) = (focus.display().to_string(), autonomy.display().to_string());
    gateway_command(
        gateway_bin,
        &layout.gateway_config(),
        &[
            &["export-focus", "--out", &focus, "--autonomy-out", &autonomy][..],
            &period[..],
        ]
        .concat(),
    )?;
    let report_s = report_started.elapsed().as_secs_f64();

    let machines = plan
        .machines
        .iter()
        .zip(injected)
        .zip(&latest)
        .map(|((m, injected), agent)| MachineSummary {
            id: m.id.to_owned(),
            class: m.class.to_owned(),
            site: m.site.to_owned(),
            model: MODEL.to_owned(),
            model_version: m.model_version.to_owned(),
            role: m.role,
            capture: m.capture.name.to_owned(),
            injected,
            agent: *agent,
        })
        .collect();
    let summary = DemoSummary {
        out_dir: options.out.clone(),
        duration_s: plan.duration.as_secs_f64(),
        loops_started_unix_ms,
        loops_ended_unix_ms,
        machines,
        partition: PartitionSummary {
            machine: partitioned.to_owned(),
            start_unix_ms: partition_start.unwrap_or_default(),
            heal_unix_ms: partition_heal.unwrap_or_default(),
            peak_backlog,
            disconnects: partitioned_ix.map_or(0, |i| latest[i].disconnects),
        },
        heat: HeatSummary {
            machine: heated.to_owned(),
            start_unix_ms: heat_start.unwrap_or_default(),
            end_unix_ms: heat_end.unwrap_or_default(),
        },
        restart: RestartSummary {
            machine: restarted.to_owned(),
            signal: "SIGKILL".to_owned(),
            killed_unix_ms: killed_at.unwrap_or_default(),
            restarted_unix_ms: restarted_at.unwrap_or_default(),
        },
        drained,
        gateway: gateway_counts,
        report_from,
        report_to,
        report_at,
        timings: Timings {
            build_s,
            setup_s,
            run_s,
            drain_s,
            report_s,
            total_s: started.elapsed().as_secs_f64(),
        },
    };
    let text = serde_json::to_string_pretty(&summary).map_err(|e| DemoError::Io {
        context: "encoding the summary".into(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(layout.summary(), text).map_err(io("writing the summary"))?;

    let kept = options.keep.then(|| Kept {
        _agents: agents,
        _gateway: gateway,
        _proxy: proxy,
        _broker: broker,
    });
    Ok(Outcome {
        summary,
        report,
        gateway_binary: gateway_bin.clone(),
        page_url: format!("http://{page}/"),
        kept,
    })
}

/// The fleet left running by `--keep`: broker and proxy live in this process, the gateway and
/// the agents are its children (stopped when this drops or the process ends).
pub struct Kept {
    _agents: Vec<Agent>,
    _gateway: Gateway,
    _proxy: FaultProxy,
    _broker: EmbeddedBroker,
}

impl Kept {
    /// Blocks until the process is stopped (Ctrl-C).
    pub fn wait(self) -> ! {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
}

fn celsius(millicelsius: i64) -> f64 {
    millicelsius as f64 / 1000.0
}

/// `YYYY-MM-DD` of the UTC day holding `ms`.
fn day(ms: i64) -> String {
    let midnight = ms.div_euclid(edgewatch_slo::MS_PER_DAY) * edgewatch_slo::MS_PER_DAY;
    edgewatch_slo::format_rfc3339(midnight)[..10].to_owned()
}

/// A path relative to the working directory when it is under it.
fn short(path: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
        .display()
        .to_string()
}

/// Machines whose counts are not moving on, and why.
#[derive(Debug, Clone, Copy, Default)]
pub struct Offline<'a> {
    /// The machine whose link is cut off, while it is.
    pub partitioned: Option<&'a str>,
    /// The machine whose agent is down, while it is.
    pub agent_down: Option<&'a str>,
}

/// One progress line: per machine events queued/acknowledged, then the gateway's counts.
pub fn progress_line(
    agents: &[Agent],
    counts: &[AgentCounts],
    gateway: Option<GatewayCounts>,
    offline: &Offline<'_>,
) -> String {
    let machines = agents
        .iter()
        .zip(counts)
        .map(|(agent, c)| {
            let note = if offline.partitioned == Some(agent.id) {
                " (offline)"
            } else if offline.agent_down == Some(agent.id) {
                " (agent down)"
            } else {
                ""
            };
            format!("{} {}/{}{note}", agent.id, c.queued, c.acked)
        })
        .collect::<Vec<_>>()
        .join("  ");
    let gateway = gateway.map_or_else(
        || "gateway not answering".to_owned(),
        |g| format!("gateway {} events, {} duplicates", g.events, g.duplicates),
    );
    format!("queued/acked {machines} | {gateway}")
}

/// Waits until the store holds, for every agent and tier, every sequence number the agent had
/// made durable once it had seen its loop end: the loop's final counters included.
fn drain_all(agents: &[Agent], store: &Path, timeout: Duration) -> Result<bool, DemoError> {
    let deadline = Instant::now() + timeout;
    // Per agent: when its status file first said its loop had ended, then its drain target.
    let mut ended: Vec<Option<u64>> = vec![None; agents.len()];
    let mut targets: Vec<Option<AgentCounts>> = vec![None; agents.len()];
    loop {
        for ((agent, ended), target) in agents.iter().zip(&mut ended).zip(&mut targets) {
            if target.is_some() {
                continue;
            }
            let Some(counts) = agent.counts() else {
                continue;
            };
            if ended.is_none() && counts.loop_ended {
                *ended = Some(counts.status_as_of_unix_ms);
            }
            if ended.is_some_and(|at| drain_target(at, &counts)) {
                *target = Some(counts);
            }
        }
        if targets.iter().all(Option::is_some) {
            let complete = edgewatch_gateway::store::Store::open_read_only(store)
                .ok()
                .and_then(|s| s.dedup_streams().ok())
                .is_some_and(|streams| {
                    agents.iter().zip(&targets).all(|(agent, target)| {
                        target.is_some_and(|t| holds_all(&streams, agent.id, &t))
                    })
                });
            if complete {
                return Ok(true);
            }
        }
        if Instant::now() > deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Whether `counts` can be an agent's drain target, its status file having said at
/// `ended_unix_ms` that its loop had ended: the agent queued the loop's final counters in the
/// poll that saw the end, before writing that status, so a queue snapshot written later with
/// no append pending holds them among its durable sequence numbers.
pub fn drain_target(ended_unix_ms: u64, counts: &AgentCounts) -> bool {
    counts.queue_as_of_unix_ms > ended_unix_ms && counts.pending == 0
}

/// True when the store's de-duplication ranges of `machine` cover `1..=durable_seq` of every tier.
pub fn holds_all(
    streams: &[edgewatch_gateway::store::DedupStream],
    machine: &str,
    target: &AgentCounts,
) -> bool {
    edgewatch_proto::tier::TIERS
        .iter()
        .zip(target.durable_seq)
        .all(|(tier, last)| {
            last == 0
                || streams.iter().any(|s| {
                    s.machine == machine
                        && s.tier == *tier as i32
                        && s.epoch == target.epoch
                        && s.ranges.iter().any(|&(a, b)| a <= 1 && b >= last)
                })
        })
}

/// Runs `edgewatch-gateway --config <config> <args>` and returns its stdout.
fn gateway_command(binary: &Path, config: &Path, args: &[&str]) -> Result<String, DemoError> {
    let output = Command::new(binary)
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .map_err(io("running edgewatch-gateway"))?;
    if !output.status.success() {
        return Err(DemoError::Gateway {
            command: args.join(" "),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgewatch_gateway::store::DedupStream;

    fn stream(machine: &str, tier: i32, ranges: Vec<(u64, u64)>) -> DedupStream {
        DedupStream {
            machine: machine.into(),
            tier,
            epoch: 7,
            ranges,
        }
    }

    fn target(seqs: [u64; 3]) -> AgentCounts {
        AgentCounts {
            durable_seq: seqs,
            epoch: 7,
            ..AgentCounts::default()
        }
    }

    #[test]
    fn a_machine_is_drained_when_every_tier_is_covered_from_one() {
        let streams = vec![
            stream("m", 1, vec![(1, 5)]),
            stream("m", 2, vec![(1, 40)]),
            stream("m", 3, vec![(1, 12)]),
        ];
        assert!(holds_all(&streams, "m", &target([5, 40, 10])));
        assert!(
            !holds_all(&streams, "m", &target([6, 40, 10])),
            "safety 6 missing"
        );
        assert!(!holds_all(&streams, "other", &target([1, 0, 0])));
        // A tier with nothing queued needs no stream.
        assert!(holds_all(&[], "m", &target([0, 0, 0])));
    }

    #[test]
    fn a_gap_or_another_epoch_is_not_drained() {
        let gap = vec![stream("m", 2, vec![(1, 10), (12, 40)])];
        assert!(!holds_all(&gap, "m", &target([0, 40, 0])));
        let mut other_epoch = stream("m", 2, vec![(1, 40)]);
        other_epoch.epoch = 8;
        assert!(!holds_all(&[other_epoch], "m", &target([0, 40, 0])));
    }

    #[test]
    fn a_drain_target_is_a_snapshot_taken_after_the_loop_ended_with_nothing_pending() {
        let snapshot = |as_of, pending| AgentCounts {
            queue_as_of_unix_ms: as_of,
            pending,
            ..AgentCounts::default()
        };
        assert!(drain_target(1_000, &snapshot(1_001, 0)));
        assert!(
            !drain_target(1_000, &snapshot(1_000, 0)),
            "same millisecond: maybe before"
        );
        assert!(!drain_target(1_000, &snapshot(999, 0)));
        assert!(
            !drain_target(1_000, &snapshot(2_000, 3)),
            "appends not yet durable"
        );
    }

    #[test]
    fn days_are_utc_dates() {
        assert_eq!(day(0), "1970-01-01");
        assert_eq!(day(86_400_000 - 1), "1970-01-01");
        assert_eq!(day(86_400_000), "1970-01-02");
    }
}

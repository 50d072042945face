//! The demo's processes: the gateway, one agent per machine and one control loop per machine,
//! each a real binary writing its output to a log file (run by `edgewatch_harness`'s process
//! handles), and what can be read from them while they run (agent status files, queue
//! snapshots, the gateway's `/metrics`) or leave behind (a control loop's JSON summary).
//!
//! Invariants:
//! - Every child is stopped when its handle drops (SIGTERM, then SIGKILL after a grace period),
//!   and dies with the demo if the demo dies (`PR_SET_PDEATHSIG`), so a run never leaves
//!   processes behind.
//! - Reading status never disturbs a process: files the agents write, and an HTTP scrape.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use edgewatch_harness::HarnessError;
use edgewatch_harness::agent::AgentProcess;
use edgewatch_harness::gateway::GatewayProcess;
use edgewatch_harness::metrics;
use edgewatch_harness::process::{Launch, Process, die_with_parent};

use crate::files::MachinePaths;
use crate::scenario::{LOOP_BUDGET_MS, LOOP_NAME, LOOP_RATE_HZ, Machine};

/// How long a child has to exit on SIGTERM when its handle drops.
const DROP_GRACE: Duration = Duration::from_secs(5);

/// How the demo launches the agents and the gateway: logging at info, dying with the demo,
/// SIGTERM first when dropped.
fn launch(name: String) -> Launch {
    Launch {
        name: Some(name),
        die_with_parent: true,
        drop_grace: Some(DROP_GRACE),
        ..Launch::new("info")
    }
}

/// Why a process could not be started or did not behave.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A process could not be started, did not get ready in time, or exited when it should have
    /// been running.
    #[error(transparent)]
    Process(#[from] HarnessError),
    /// A control loop's JSON summary could not be read.
    #[error("control loop of {machine}: no JSON summary in {path} ({reason})")]
    Summary {
        /// Machine id.
        machine: String,
        /// The summary file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

/// The gateway process, ready once subscribed.
#[derive(Debug)]
pub struct Gateway {
    /// The process.
    pub process: GatewayProcess,
}

/// The gateway's counters the demo shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GatewayCounts {
    /// Events accepted (after de-duplication).
    pub events: u64,
    /// Events dropped as already received (re-sends after a reconnect).
    pub duplicates: u64,
    /// Samples stored.
    pub samples: u64,
    /// Machine reconnects seen.
    pub reconnects: u64,
    /// Messages refused (dead letters), all reasons.
    pub dead_letters: u64,
}

impl Gateway {
    /// Starts `edgewatch-gateway run` and waits until it has subscribed.
    pub fn start(
        binary: &Path,
        config: &Path,
        log: &Path,
        metrics: SocketAddr,
    ) -> Result<Self, FleetError> {
        let process = GatewayProcess::start(
            binary,
            config,
            log,
            metrics,
            launch("the gateway".into()),
            Duration::from_secs(30),
        )?;
        Ok(Self { process })
    }

    /// The `/metrics` text, or `None` when the gateway does not answer.
    pub fn scrape(&self) -> Option<String> {
        self.process.scrape()
    }

    /// The counters, when the gateway answers.
    pub fn counts(&self) -> Option<GatewayCounts> {
        let text = self.scrape()?;
        let get = |name| metrics::value(&text, name).map_or(0, |v| v as u64);
        let dead_letters =
            metrics::sum_labelled(&text, "edgewatch_gateway_dead_letters_total") as u64;
        Some(GatewayCounts {
            events: get("edgewatch_gateway_events_total"),
            duplicates: get("edgewatch_gateway_events_duplicate_total"),
            samples: get("edgewatch_gateway_samples_stored_total"),
            reconnects: get("edgewatch_gateway_machine_reconnects_total"),
            dead_letters,
        })
    }
}

/// One machine's agent.
#[derive(Debug)]
pub struct Agent {
    /// Machine id.
    pub id: &'static str,
    /// The process.
    pub process: AgentProcess,
    paths: MachinePaths,
}

/// What an agent reports about itself, from its status file and its queue's snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentCounts {
    /// The uplink has a broker connection.
    pub connected: bool,
    /// Connections lost or refused so far.
    pub disconnects: u64,
    /// Events the broker acknowledged, which then left the queue: `queued` minus `backlog`
    /// (the demo's queues never evict), so that, like `queued`, it counts across agent
    /// restarts.
    pub acked: u64,
    /// Events queued durably since the queue was created (sum of the tiers' sequence numbers).
    pub queued: u64,
    /// Records waiting in the queue.
    pub backlog: u64,
    /// Highest durable sequence number per tier: safety, slo, debug.
    pub durable_seq: [u64; 3],
    /// The queue's epoch (the gateway de-duplicates per epoch).
    pub epoch: u64,
    /// When the queue wrote its snapshot (ms since the Unix epoch).
    pub queue_as_of_unix_ms: u64,
    /// Appends not yet durable when the queue wrote its snapshot, all tiers.
    pub pending: u64,
    /// The agent has seen its control loop end (its probe's producer is dead), so the loop's
    /// final counters are queued.
    pub loop_ended: bool,
    /// When the agent wrote its status file (ms since the Unix epoch).
    pub status_as_of_unix_ms: u64,
}

impl Agent {
    /// Writes `config` to the machine's `agent.toml` and starts `edgewatch-agent run` (no wait;
    /// see [`Agent::wait_connected`]).
    pub fn start(
        binary: &Path,
        machine: &Machine,
        paths: MachinePaths,
        config: &str,
    ) -> Result<Self, FleetError> {
        let process = AgentProcess::start(
            binary,
            &paths.dir,
            config,
            launch(format!("the agent of {}", machine.id)),
        )?;
        Ok(Self {
            id: machine.id,
            process,
            paths,
        })
    }

    /// Waits until the agent's uplink is connected.
    pub fn wait_connected(&mut self, timeout: Duration) -> Result<(), FleetError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.process.check_running()?;
            if self.counts().is_some_and(|c| c.connected) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(HarnessError::NotReady {
                    what: format!("the uplink of {}", self.id),
                    seconds: timeout.as_secs(),
                    detail: format!("; see {}", self.paths.agent_log.display()),
                }
                .into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Reads the status file and the queue snapshot; `None` before both exist.
    pub fn counts(&self) -> Option<AgentCounts> {
        let text = std::fs::read_to_string(&self.paths.status).ok()?;
        let status: serde_json::Value = serde_json::from_str(&text).ok()?;
        let uplink = &status["uplink"];
        let queue = edgewatch_queue::read_snapshot(&edgewatch_agent::config::queue_status_file(
            &self.paths.status,
        ))
        .ok()?;
        let tiers = [queue.tiers.safety, queue.tiers.slo, queue.tiers.debug];
        let queued: u64 = tiers.iter().map(|t| t.durable_seq).sum();
        let backlog: u64 = tiers.iter().map(|t| t.records).sum();
        let probe = format!("probe:{LOOP_NAME}");
        let loop_ended = status["sources"].as_array().is_some_and(|sources| {
            sources
                .iter()
                .any(|s| s["name"] == probe.as_str() && s["state"] == "dead")
        });
        Some(AgentCounts {
            connected: uplink["connected"].as_bool() == Some(true),
            disconnects: uplink["disconnects"].as_u64().unwrap_or(0),
            acked: queued.saturating_sub(backlog),
            queued,
            backlog,
            durable_seq: tiers.map(|t| t.durable_seq),
            epoch: queue.epoch,
            queue_as_of_unix_ms: queue.as_of_unix_ms,
            pending: tiers.iter().map(|t| t.pending).sum(),
            loop_ended,
            status_as_of_unix_ms: status["as_of_unix_ms"].as_u64().unwrap_or(0),
        })
    }
}

/// What a control loop counted of itself, from its own clock (`tally.total`, or one model
/// version's part, of its JSON summary).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoopCounts {
    /// Activations released: run or skipped.
    pub activations: u64,
    /// Activations that completed after release + deadline, or never ran.
    pub deadline_misses: u64,
    /// Steps whose duration exceeded the budget.
    pub overruns: u64,
    /// Activations that never ran.
    pub skipped: u64,
    /// Fallbacks to the safety controller.
    pub fallbacks: u64,
    /// Operator interventions.
    pub interventions: u64,
    /// Safe stops.
    pub safe_stops: u64,
    /// Nanoseconds in autonomous mode.
    pub autonomous_ns: u64,
}

/// A control loop's tally: in total and per model version (`""` before one was published).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoopTally {
    /// Over the whole run.
    pub total: LoopCounts,
    /// Per model version in effect.
    pub models: BTreeMap<String, LoopCounts>,
}

/// The part of `edgewatch-synthetic-loop`'s JSON summary the demo uses.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoopSummary {
    /// Releases passed (run and skipped).
    pub activations: u64,
    /// Cycles run and recorded.
    pub cycles: u64,
    /// Cycles made to overrun on purpose.
    pub misses_injected: u64,
    /// Cycles whose duration exceeded the budget (overruns, what ABI 1 probes called misses).
    pub misses_observed: u64,
    /// Activations skipped on purpose (skips, and the activations a hang swallowed).
    pub skipped_injected: u64,
    /// Steps started late on purpose.
    pub late_starts_injected: u64,
    /// Hangs carried out.
    pub hangs_injected: u64,
    /// Fallbacks to the safety controller.
    pub fallbacks: u64,
    /// Operator interventions.
    pub interventions: u64,
    /// Safe stops.
    pub safe_stops: u64,
    /// Seconds per autonomy mode (`autonomous`, `manual`, `teleoperated`, `idle`, `unknown`).
    pub autonomy_seconds: BTreeMap<String, f64>,
    /// The loop's own account of its activations, deadline misses and events.
    pub tally: LoopTally,
}

impl LoopSummary {
    /// Seconds in `mode`.
    pub fn seconds(&self, mode: &str) -> f64 {
        self.autonomy_seconds.get(mode).copied().unwrap_or(0.0)
    }
}

/// One machine's control loop.
#[derive(Debug)]
pub struct ControlLoop {
    /// Machine id.
    pub id: &'static str,
    /// The process.
    pub process: Process,
    summary: PathBuf,
}

impl ControlLoop {
    /// Starts `edgewatch-synthetic-loop` for `duration` with the machine's script.
    pub fn start(
        binary: &Path,
        machine: &Machine,
        paths: &MachinePaths,
        duration: Duration,
    ) -> Result<Self, FleetError> {
        let mut command = Command::new(binary);
        command
            .arg("--probe")
            .arg(&paths.probe)
            .args(["--loop-id", "1", "--loop-name", LOOP_NAME])
            .args(["--rate-hz", &LOOP_RATE_HZ.to_string()])
            .args(["--budget-ms", &LOOP_BUDGET_MS.to_string()])
            .args(["--duration", &format!("{}ms", duration.as_millis())])
            .arg("--script")
            .arg(&paths.script);
        die_with_parent(&mut command);
        let mut process = Process::spawn_split(
            format!("the control loop of {}", machine.id),
            command,
            &paths.loop_summary,
            &paths.loop_log,
        )?;
        process.terminate_on_drop(DROP_GRACE);
        Ok(Self {
            id: machine.id,
            process,
            summary: paths.loop_summary.clone(),
        })
    }

    /// The loop's JSON summary, once it has exited cleanly.
    pub fn summary(&mut self) -> Result<LoopSummary, FleetError> {
        let bad = |reason: String| FleetError::Summary {
            machine: self.id.to_owned(),
            path: self.summary.clone(),
            reason,
        };
        match self.process.exited() {
            Some(status) if status.success() => {}
            Some(status) => return Err(bad(format!("it exited with {status}"))),
            None => return Err(bad("it is still running".into())),
        }
        let text = std::fs::read_to_string(&self.summary).map_err(|e| bad(e.to_string()))?;
        let line = text.lines().last().ok_or_else(|| bad("empty".into()))?;
        serde_json::from_str(line).map_err(|e| bad(e.to_string()))
    }
}

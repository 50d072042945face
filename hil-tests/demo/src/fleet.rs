//! The demo's processes: the gateway, one agent per machine and one control loop per machine,
//! each a real binary writing its output to a log file, and what can be read from them while
//! they run (agent status files, queue snapshots, the gateway's `/metrics`) or left behind (a
//! control loop's JSON summary).
//!
//! Invariants:
//! - Every child is stopped when its handle drops, and dies with the demo if the demo dies
//!   (`PR_SET_PDEATHSIG`), so a run never leaves processes behind.
//! - Reading status never disturbs a process: files the agents write, and an HTTP scrape.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::files::MachinePaths;
use crate::scenario::{LOOP_BUDGET_MS, LOOP_NAME, LOOP_RATE_HZ, Machine};

/// Why a process could not be started or did not behave.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A program could not be started.
    #[error("starting {what}: {source}")]
    Spawn {
        /// Which process.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// A log or output file could not be opened.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A process did not get ready in time.
    #[error("{what} was not ready after {seconds} s; see {log}")]
    NotReady {
        /// Which process.
        what: String,
        /// How long we waited.
        seconds: u64,
        /// Its log.
        log: PathBuf,
    },
    /// A process exited when it should have been running.
    #[error("{what} exited ({status}); see {log}")]
    Exited {
        /// Which process.
        what: String,
        /// How it exited.
        status: ExitStatus,
        /// Its log.
        log: PathBuf,
    },
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

/// A child process with its log file; SIGTERM then SIGKILL on drop.
#[derive(Debug)]
pub struct Process {
    what: String,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    fn spawn(
        what: String,
        mut command: Command,
        stdout: &Path,
        log: &Path,
    ) -> Result<Self, FleetError> {
        let open = |path: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| FleetError::File {
                    path: path.to_owned(),
                    source,
                })
        };
        let err = open(log)?;
        let out = if stdout == log {
            err.try_clone().map_err(|source| FleetError::File {
                path: log.to_owned(),
                source,
            })?
        } else {
            open(stdout)?
        };
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: the closure runs in the child between fork and exec and only calls prctl(2),
        // which is async-signal-safe; it touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                // Die with the demo: the signal comes when the thread that spawned us exits, and
                // every child is spawned from the demo's main thread.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|source| FleetError::Spawn {
            what: what.clone(),
            source,
        })?;
        Ok(Self {
            what,
            log: log.to_owned(),
            child: Some(child),
        })
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Fails if the process exited.
    pub fn check_running(&mut self) -> Result<(), FleetError> {
        match self.exited() {
            Some(status) => Err(FleetError::Exited {
                what: self.what.clone(),
                status,
                log: self.log.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Sends SIGTERM (no wait).
    pub fn signal_stop(&self) {
        if let Some(child) = &self.child
            && let Ok(pid) = i32::try_from(child.id())
        {
            // SAFETY: kill(2) on our own child, which is not reaped yet (we hold its handle).
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }

    /// SIGTERM, then waits up to `grace` for the exit, then SIGKILL. Returns the exit status.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: as in `signal_stop`.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        child.wait().ok()
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// The gateway process and its `/metrics` address.
#[derive(Debug)]
pub struct Gateway {
    /// The process.
    pub process: Process,
    metrics: SocketAddr,
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
        let mut command = Command::new(binary);
        command
            .arg("--config")
            .arg(config)
            .arg("run")
            .env("RUST_LOG", "info");
        let mut gateway = Self {
            process: Process::spawn("the gateway".into(), command, log, log)?,
            metrics,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            gateway.process.check_running()?;
            if gateway
                .scrape()
                .is_some_and(|text| metric(&text, "edgewatch_gateway_subscribed") == Some(1.0))
            {
                return Ok(gateway);
            }
            if Instant::now() > deadline {
                return Err(FleetError::NotReady {
                    what: "the gateway's subscription".into(),
                    seconds: 30,
                    log: log.to_owned(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The `/metrics` text, or `None` when the gateway does not answer.
    pub fn scrape(&self) -> Option<String> {
        let mut stream =
            TcpStream::connect_timeout(&self.metrics, Duration::from_millis(500)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let body = response.split_once("\r\n\r\n")?.1;
        Some(body.to_owned())
    }

    /// The counters, when the gateway answers.
    pub fn counts(&self) -> Option<GatewayCounts> {
        let text = self.scrape()?;
        let get = |name| metric(&text, name).map_or(0, |v| v as u64);
        let dead_letters = text
            .lines()
            .filter(|line| line.starts_with("edgewatch_gateway_dead_letters_total{"))
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>() as u64;
        Some(GatewayCounts {
            events: get("edgewatch_gateway_events_total"),
            duplicates: get("edgewatch_gateway_events_duplicate_total"),
            samples: get("edgewatch_gateway_samples_stored_total"),
            reconnects: get("edgewatch_gateway_machine_reconnects_total"),
            dead_letters,
        })
    }
}

/// The value of an unlabelled metric in Prometheus text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// One machine's agent.
#[derive(Debug)]
pub struct Agent {
    /// Machine id.
    pub id: &'static str,
    /// The process.
    pub process: Process,
    paths: MachinePaths,
}

/// What an agent reports about itself, from its status file and its queue's snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AgentCounts {
    /// The uplink has a broker connection.
    pub connected: bool,
    /// Connections lost or refused so far.
    pub disconnects: u64,
    /// Events acknowledged by the broker.
    pub acked: u64,
    /// Events queued durably since the agent started (sum of the tiers' sequence numbers).
    pub queued: u64,
    /// Records waiting in the queue.
    pub backlog: u64,
    /// Highest durable sequence number per tier: safety, slo, debug.
    pub durable_seq: [u64; 3],
    /// The queue's epoch (the gateway de-duplicates per epoch).
    pub epoch: u64,
    /// When the queue wrote its snapshot (ms since the Unix epoch).
    pub queue_as_of_unix_ms: u64,
}

impl Agent {
    /// Starts `edgewatch-agent run` and waits for its status file.
    pub fn start(
        binary: &Path,
        machine: &Machine,
        paths: MachinePaths,
    ) -> Result<Self, FleetError> {
        let mut command = Command::new(binary);
        command
            .arg("run")
            .arg("--config")
            .arg(&paths.agent_config)
            .env("RUST_LOG", "info");
        let process = Process::spawn(
            format!("the agent of {}", machine.id),
            command,
            &paths.agent_log,
            &paths.agent_log,
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
                return Err(FleetError::NotReady {
                    what: format!("the uplink of {}", self.id),
                    seconds: timeout.as_secs(),
                    log: self.paths.agent_log.clone(),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Reads the status file and the queue snapshot; `None` before both exist.
    pub fn counts(&self) -> Option<AgentCounts> {
        let text = std::fs::read_to_string(&self.paths.status).ok()?;
        let status: serde_json::Value = serde_json::from_str(&text).ok()?;
        let uplink = &status["uplink"];
        let queue = edgewatch_queue::read_snapshot(&self.paths.queue).ok()?;
        let tiers = [queue.tiers.safety, queue.tiers.slo, queue.tiers.debug];
        Some(AgentCounts {
            connected: uplink["connected"].as_bool() == Some(true),
            disconnects: uplink["disconnects"].as_u64().unwrap_or(0),
            acked: uplink["events_acked"].as_u64().unwrap_or(0),
            queued: tiers.iter().map(|t| t.durable_seq).sum(),
            backlog: tiers.iter().map(|t| t.records).sum(),
            durable_seq: tiers.map(|t| t.durable_seq),
            epoch: queue.epoch,
            queue_as_of_unix_ms: queue.as_of_unix_ms,
        })
    }
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
    /// Cycles whose duration exceeded the budget (what the probe counts as misses).
    pub misses_observed: u64,
    /// Activations skipped on purpose.
    pub skipped_injected: u64,
    /// Fallbacks to the safety controller.
    pub fallbacks: u64,
    /// Operator interventions.
    pub interventions: u64,
    /// Safe stops.
    pub safe_stops: u64,
    /// Seconds per autonomy mode (`autonomous`, `manual`, `teleoperated`, `idle`, `unknown`).
    pub autonomy_seconds: BTreeMap<String, f64>,
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
        let process = Process::spawn(
            format!("the control loop of {}", machine.id),
            command,
            &paths.loop_summary,
            &paths.loop_log,
        )?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unlabelled_metric_is_read_and_a_longer_name_is_not_mistaken_for_it() {
        let text =
            "# HELP x\nedgewatch_gateway_events_total_other 3\nedgewatch_gateway_events_total 42\n";
        assert_eq!(metric(text, "edgewatch_gateway_events_total"), Some(42.0));
        assert_eq!(metric(text, "edgewatch_gateway_subscribed"), None);
    }
}

//! The real `edgewatch-agent` binary as a child process, in a directory of its own laid out the
//! same way by every user (the agent's tests and bench, the HIL rig, the demo):
//!
//! ```text
//! <dir>/agent.toml          configuration, written here from the caller's text
//! <dir>/agent.log           stdout and stderr, appended across restarts
//! <dir>/agent.sock          local ingest socket (when the configuration puts it here)
//! <dir>/agent-status.json   status file (when the configuration puts it here)
//! <dir>/queue/              the queue (when the configuration puts it here)
//! ```
//!
//! The configuration's text is the caller's: each user sets the keys its runs vary.
//!
//! Invariants:
//! - The agent is stopped and reaped when the handle drops ([`crate::process::Process`]).
//! - Ready means its local socket accepts connections; an agent that exits while starting is an
//!   error naming its log, not a timeout.

use std::ops::{Deref, DerefMut};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{Launch, Process, run_with_config};
use crate::{HarnessError, Result};

/// A running (or stopped, restartable) agent in its directory.
#[derive(Debug)]
pub struct AgentProcess {
    binary: PathBuf,
    dir: PathBuf,
    launch: Launch,
    process: Process,
}

impl AgentProcess {
    /// Writes `config` to `<dir>/agent.toml` and starts `<binary> run --config` on it (no wait;
    /// see [`AgentProcess::wait_for_socket`]).
    pub fn start(binary: &Path, dir: &Path, config: &str, launch: Launch) -> Result<Self> {
        let config_path = dir.join("agent.toml");
        std::fs::write(&config_path, config).map_err(HarnessError::io(format!(
            "writing {}",
            config_path.display()
        )))?;
        let process = Self::spawn_in(binary, dir, &launch)?;
        Ok(Self {
            binary: binary.to_owned(),
            dir: dir.to_owned(),
            launch,
            process,
        })
    }

    fn spawn_in(binary: &Path, dir: &Path, launch: &Launch) -> Result<Process> {
        let mut command = Command::new(binary);
        command
            .args(["run", "--config"])
            .arg(dir.join("agent.toml"));
        let log = dir.join("agent.log");
        launch.spawn("edgewatch-agent", command, &log)
    }

    /// Starts the agent again on the same directory (after [`Process::kill`] or
    /// [`Process::terminate`]).
    pub fn respawn(&mut self) -> Result<()> {
        self.process.kill();
        self.process = Self::spawn_in(&self.binary, &self.dir, &self.launch)?;
        Ok(())
    }

    /// Waits until the local socket accepts connections; fails if the agent exits first or
    /// `timeout` passes.
    pub fn wait_for_socket(&mut self, timeout: Duration) -> Result<()> {
        let socket = self.socket();
        self.process.wait_until("the agent's socket", timeout, || {
            UnixStream::connect(&socket).is_ok()
        })
    }

    /// The agent's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<dir>/agent.toml`.
    pub fn config(&self) -> PathBuf {
        self.dir.join("agent.toml")
    }

    /// `<dir>/agent.sock`.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }

    /// `<dir>/agent-status.json`, parsed (`Null` if absent or unreadable).
    pub fn status_file(&self) -> serde_json::Value {
        std::fs::read_to_string(self.dir.join("agent-status.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(serde_json::Value::Null)
    }

    /// Runs `<binary> <args> --config <dir>/agent.toml` to completion (`status --json`,
    /// `check-config`).
    pub fn command(&self, args: &[&str]) -> Result<std::process::Output> {
        run_with_config(&self.binary, args, &self.config())
    }
}

/// The process: log, pid, signals, pause, terminate, kill.
impl Deref for AgentProcess {
    type Target = Process;

    fn deref(&self) -> &Process {
        &self.process
    }
}

impl DerefMut for AgentProcess {
    fn deref_mut(&mut self) -> &mut Process {
        &mut self.process
    }
}

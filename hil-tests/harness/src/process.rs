//! A child process writing to a log file, as the agent and gateway handles, the HIL rig and the
//! demo run them: spawned with its output appended to a log, signalled, stopped with SIGTERM and
//! a grace period, and reaped.
//!
//! Invariants:
//! - The child is stopped and reaped when its handle drops: by SIGKILL, or (if asked) SIGTERM
//!   first with a grace period; a paused child is sent SIGCONT first, so it cannot outlive a
//!   failed run.
//! - Signals go only to a child this handle holds and has not reaped, so its pid cannot have been
//!   reused by another process.
//! - Output is appended, so a restarted process adds to the same log.

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{HarnessError, Result};

/// How often a wait looks at the child again.
const POLL: Duration = Duration::from_millis(20);

/// How a termination ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// The process exited within the grace period (on SIGTERM, or before it).
    Exited(ExitStatus),
    /// The process outlived the grace period and was SIGKILLed.
    Killed(ExitStatus),
    /// There was no process to stop (never started, or already reaped).
    NotRunning,
}

impl Termination {
    /// The exit status, if a process was reaped.
    pub fn status(self) -> Option<ExitStatus> {
        match self {
            Self::Exited(status) | Self::Killed(status) => Some(status),
            Self::NotRunning => None,
        }
    }
}

impl std::fmt::Display for Termination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited(status) => write!(f, "{status}"),
            Self::Killed(status) => write!(f, "{status} (after SIGKILL)"),
            Self::NotRunning => f.write_str("not running"),
        }
    }
}

/// Makes `command`'s process receive SIGTERM when the thread that spawns it exits
/// (`PR_SET_PDEATHSIG`), so that it dies with a program that dies. Only for programs that spawn
/// from a thread living as long as the child (the demo's main thread); a test's helper thread
/// would take its children with it.
pub fn die_with_parent(command: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl(2), which
    // is async-signal-safe; it touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A child process with its log file.
#[derive(Debug)]
pub struct Process {
    /// What the process is, for messages ("the gateway", "edgewatch-agent").
    what: String,
    /// Where its stderr (and, unless split, its stdout) is appended.
    log: PathBuf,
    /// The child, until reaped.
    child: Option<Child>,
    /// Stopped by SIGSTOP and not continued since.
    paused: bool,
    /// On drop: SIGTERM and this grace period before SIGKILL; `None`, SIGKILL at once.
    drop_grace: Option<Duration>,
}

fn open_append(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(HarnessError::io(path.display().to_string()))
}

impl Process {
    /// Spawns `command` with stdin from /dev/null and stdout and stderr appended to `log`.
    pub fn spawn(what: impl Into<String>, command: Command, log: &Path) -> Result<Self> {
        Self::spawn_split(what, command, log, log)
    }

    /// Spawns `command` with stdin from /dev/null, stdout appended to `stdout` and stderr to
    /// `log` (the same file if they are the same path).
    pub fn spawn_split(
        what: impl Into<String>,
        mut command: Command,
        stdout: &Path,
        log: &Path,
    ) -> Result<Self> {
        let what = what.into();
        let err = open_append(log)?;
        let out = if stdout == log {
            err.try_clone()
                .map_err(HarnessError::io(log.display().to_string()))?
        } else {
            open_append(stdout)?
        };
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = command
            .spawn()
            .map_err(HarnessError::io(format!("starting {what}")))?;
        Ok(Self {
            what,
            log: log.to_owned(),
            child: Some(child),
            paused: false,
            drop_grace: None,
        })
    }

    /// On drop, SIGTERM and up to `grace` for the exit before SIGKILL (instead of SIGKILL at once).
    pub fn terminate_on_drop(&mut self, grace: Duration) {
        self.drop_grace = Some(grace);
    }

    /// What the process is.
    pub fn what(&self) -> &str {
        &self.what
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The log so far (empty if there is none yet).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Process id, while the child is held.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(status)` once the process has exited (it stays held until dropped or stopped).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Still running (held and not exited)?
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Fails with [`HarnessError::Exited`] if the process exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.exited() {
            Some(status) => Err(HarnessError::Exited {
                what: self.what.clone(),
                status,
                log: self.log.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Sends `signal` (no wait).
    pub fn signal(&self, signal: libc::c_int) {
        if let Some(child) = &self.child
            && let Ok(pid) = libc::pid_t::try_from(child.id())
        {
            // SAFETY: kill(2) on our own child, not reaped yet (we hold its handle); no memory
            // is involved.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// SIGSTOP.
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
        self.paused = true;
    }

    /// SIGCONT.
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.paused = false;
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if self.paused {
            self.resume();
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM (after SIGCONT if paused), then up to `grace` for the exit, then SIGKILL; reaps.
    pub fn terminate(&mut self, grace: Duration) -> Termination {
        if self.paused {
            self.resume();
        }
        let Some(mut child) = self.child.take() else {
            return Termination::NotRunning;
        };
        if let Ok(Some(status)) = child.try_wait() {
            return Termination::Exited(status);
        }
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + grace;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Termination::Exited(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
                _ => break,
            }
        }
        let _ = child.kill();
        match child.wait() {
            Ok(status) => Termination::Killed(status),
            Err(_) => Termination::NotRunning,
        }
    }

    /// Polls `ready` until it holds; fails if the process exits first or `timeout` passes
    /// (`waiting_for` names what was awaited in the error).
    pub fn wait_until(
        &mut self,
        waiting_for: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready() {
                return Ok(());
            }
            self.check_running()?;
            if Instant::now() > deadline {
                return Err(HarnessError::NotReady {
                    what: waiting_for.to_owned(),
                    seconds: timeout.as_secs(),
                    detail: format!("; see {}", self.log.display()),
                });
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        match self.drop_grace {
            Some(grace) => {
                self.terminate(grace);
            }
            None => self.kill(),
        }
    }
}

/// Runs `<binary> <args> --config <config>` to completion: another subcommand (`status`,
/// `check-config`, `report`) on a running binary's configuration.
pub(crate) fn run_with_config(binary: &Path, args: &[&str], config: &Path) -> Result<Output> {
    Command::new(binary)
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .map_err(HarnessError::io(format!(
            "running {} {args:?}",
            binary.display()
        )))
}

/// How a workspace binary (agent or gateway) is launched by its handle.
#[derive(Debug, Clone)]
pub struct Launch {
    /// `RUST_LOG`.
    pub rust_log: String,
    /// More environment variables.
    pub env: Vec<(String, OsString)>,
    /// What to call the process in errors; `None`, the handle's name for it.
    pub name: Option<String>,
    /// SIGTERM the child when the launching thread exits ([`die_with_parent`]).
    pub die_with_parent: bool,
    /// On drop, SIGTERM and this grace period before SIGKILL; `None`, SIGKILL at once.
    pub drop_grace: Option<Duration>,
}

impl Launch {
    /// Logging at `rust_log`; no other variables; SIGKILL on drop.
    pub fn new(rust_log: &str) -> Self {
        Self {
            rust_log: rust_log.to_owned(),
            env: Vec::new(),
            name: None,
            die_with_parent: false,
            drop_grace: None,
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: &str, value: impl Into<OsString>) -> Self {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// Spawns `command` with this launch's environment, output appended to `log`.
    pub(crate) fn spawn(
        &self,
        default_name: &str,
        mut command: Command,
        log: &Path,
    ) -> Result<Process> {
        command.env("RUST_LOG", &self.rust_log);
        for (key, value) in &self.env {
            command.env(key, value);
        }
        if self.die_with_parent {
            die_with_parent(&mut command);
        }
        let name = self.name.as_deref().unwrap_or(default_name);
        let mut process = Process::spawn(name, command, log)?;
        if let Some(grace) = self.drop_grace {
            process.terminate_on_drop(grace);
        }
        Ok(process)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn shell(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        command
    }

    #[test]
    fn output_is_appended_to_the_log_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        for word in ["one", "two"] {
            let mut p = Process::spawn("echo", shell(&format!("echo {word}")), &log).unwrap();
            p.wait_until("never", Duration::from_secs(10), || false)
                .unwrap_err();
            assert!(p.exited().is_some_and(|s| s.success()));
        }
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "one\ntwo\n");
    }

    #[test]
    fn a_process_that_exits_while_awaited_is_an_error_naming_it_and_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        let mut p = Process::spawn("the quitter", shell("exit 3"), &log).unwrap();
        let error = p
            .wait_until("its socket", Duration::from_secs(10), || false)
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("the quitter exited ("), "{error}");
        assert!(
            error.ends_with(&format!("see {}", log.display())),
            "{error}"
        );
    }

    #[test]
    fn sigterm_stops_a_process_and_one_that_ignores_it_is_killed_after_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        let mut polite = Process::spawn("sleep", shell("exec sleep 30"), &log).unwrap();
        assert!(polite.running());
        assert!(matches!(
            polite.terminate(Duration::from_secs(10)),
            Termination::Exited(_)
        ));
        assert_eq!(polite.terminate(Duration::ZERO), Termination::NotRunning);

        let mut stubborn = Process::spawn(
            "stubborn",
            shell("trap '' TERM; echo ready; while :; do sleep 1; done"),
            &log,
        )
        .unwrap();
        stubborn
            .wait_until("ready", Duration::from_secs(10), || {
                std::fs::read_to_string(&log).unwrap().contains("ready")
            })
            .unwrap();
        let stopped = stubborn.terminate(Duration::from_millis(300));
        assert!(matches!(stopped, Termination::Killed(_)), "{stopped}");
        assert!(stopped.to_string().ends_with("(after SIGKILL)"));
    }

    #[test]
    fn a_paused_process_is_still_killed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let mut p =
            Process::spawn("sleep", shell("exec sleep 30"), &dir.path().join("x.log")).unwrap();
        let pid = p.pid().unwrap();
        p.pause();
        drop(p);
        // Reaped: the pid no longer names our child.
        // SAFETY: kill(2) with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
        assert!(!alive);
    }
}

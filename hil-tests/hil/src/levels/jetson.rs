//! Level 4, on a real Jetson: cyclictest on the isolated control core in alternating agent-off /
//! agent-on blocks, with stress-ng (and optionally a GPU load) on the housekeeping cores and the
//! synthetic 25 Hz / 40 ms loop beside cyclictest on the control core. Gate: max(on) ≤ max(off)
//! + 10 µs and zero misses of the loop.
//!
//! ```text
//! control core:      cyclictest (FIFO 95, -h histogram)  +  synthetic loop 25 Hz (FIFO 80, probe)
//! housekeeping:      agent (SIGCONT = on, SIGSTOP = off)  +  stress-ng --cpu N --io 2 --vm 2
//! blocks:            off, on, off, on, ...  each `block` long; misses read from the probe summary
//! ```
//!
//! Invariants:
//! - Off a Jetson (`/etc/nv_tegra_release` absent) the level refuses to run unless forced: its
//!   numbers mean nothing on another machine.
//! - Every process it started is stopped, and the agent resumed, on every exit path.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::LevelError;
use crate::cyclictest::{self, CyclictestResult, JetsonBlock, JetsonVerdict};
use crate::rig::{Binaries, LoopProcess, LoopSpec, pin_self, scratch};

/// The file whose presence marks an L4T (Jetson) system.
pub const TEGRA_RELEASE: &str = "/etc/nv_tegra_release";

/// Which agent the blocks switch.
#[derive(Debug, Clone)]
pub enum AgentControl {
    /// An agent already running (e.g. the systemd service): SIGSTOP / SIGCONT its pid.
    Pid(u32),
    /// Start `edgewatch-agent run --config <path>` and switch it.
    Config(PathBuf),
}

/// Settings of level 4.
#[derive(Debug, Clone)]
pub struct JetsonConfig {
    /// The isolated control core.
    pub control_cpu: usize,
    /// Housekeeping cores (agent, stress, cyclictest's main thread).
    pub housekeeping: Vec<usize>,
    /// Length of one block.
    pub block: Duration,
    /// Blocks, alternating off/on from off.
    pub blocks: usize,
    /// The agent.
    pub agent: AgentControl,
    /// Run stress-ng on the housekeeping cores.
    pub stress: bool,
    /// stress-ng `--vm-bytes`.
    pub stress_vm_bytes: String,
    /// An extra load command (e.g. a `trtexec` loop), run with `sh -c` on the housekeeping cores.
    pub extra_load: Option<String>,
    /// Allowed excess of max(on) over max(off), µs.
    pub slack_us: u64,
    /// cyclictest's histogram range, µs.
    pub histogram_us: u64,
    /// Run even without `/etc/nv_tegra_release`.
    pub force: bool,
}

/// What level 4 found.
#[derive(Debug, Clone)]
pub struct JetsonReport {
    /// Each block with its cyclictest result.
    pub blocks: Vec<(JetsonBlock, CyclictestResult)>,
    /// The gate.
    pub verdict: JetsonVerdict,
    /// Platform facts: L4T release, kernel, command line, PREEMPT_RT.
    pub platform: Vec<(String, String)>,
}

/// Whether this machine is a Jetson, or the reason it is taken as one.
pub fn platform_check(force: bool) -> Result<(), LevelError> {
    if Path::new(TEGRA_RELEASE).exists() || force {
        Ok(())
    } else {
        Err(LevelError::Unsupported(format!(
            "not a Jetson: {TEGRA_RELEASE} is absent. Level 4 gates on cyclictest's maxima, which mean something only on the target with its RT kernel; run it there (or pass --force to run anyway)"
        )))
    }
}

fn find_program(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

fn facts() -> Vec<(String, String)> {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().replace('\0', "").to_owned())
            .unwrap_or_else(|_| "(absent)".into())
    };
    let uname = Command::new("uname")
        .arg("-a")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let realtime = read("/sys/kernel/realtime");
    vec![
        ("L4T release".into(), read(TEGRA_RELEASE)),
        ("model".into(), read("/proc/device-tree/model")),
        ("kernel".into(), uname.clone()),
        ("command line".into(), read("/proc/cmdline")),
        (
            "PREEMPT_RT".into(),
            if realtime == "1" || uname.contains("PREEMPT_RT") {
                "yes".into()
            } else {
                "no".into()
            },
        ),
    ]
}

/// A process stopped and reaped on drop.
struct Owned(Child);

impl Drop for Owned {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own unreaped child; SIGCONT first in case it is stopped.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGCONT) };
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent, switched by signals; resumed on drop.
struct Switch {
    pid: u32,
    _owned: Option<Owned>,
}

impl Switch {
    fn set(&self, on: bool) {
        let signal = if on { libc::SIGCONT } else { libc::SIGSTOP };
        // SAFETY: kill(2) with a pid the operator named or our own child.
        unsafe { libc::kill(self.pid as libc::pid_t, signal) };
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.set(true);
    }
}

/// Runs level 4.
pub fn run(bins: &Binaries, config: &JetsonConfig) -> Result<JetsonReport, LevelError> {
    platform_check(config.force)?;
    if find_program("cyclictest").is_none() {
        return Err(LevelError::Unsupported(
            "cyclictest is not installed (apt-get install -y rt-tests)".into(),
        ));
    }
    if config.stress && find_program("stress-ng").is_none() {
        return Err(LevelError::Unsupported(
            "stress-ng is not installed (apt-get install -y stress-ng), or pass --no-stress".into(),
        ));
    }
    if config.housekeeping.contains(&config.control_cpu) {
        return Err(LevelError::Unsupported(format!(
            "the control core {} is also listed as housekeeping",
            config.control_cpu
        )));
    }
    pin_self(&config.housekeeping)?;
    let dir = scratch("edgewatch-hil-jetson-")?;
    let spawn = |command: &mut Command, what: &str| {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(Owned)
            .map_err(|source| LevelError::Io {
                context: format!("starting {what}"),
                source,
            })
    };
    let switch = match &config.agent {
        AgentControl::Pid(pid) => Switch {
            pid: *pid,
            _owned: None,
        },
        AgentControl::Config(path) => {
            let owned = spawn(
                Command::new(&bins.agent)
                    .args(["run", "--config"])
                    .arg(path),
                "the agent",
            )?;
            Switch {
                pid: owned.0.id(),
                _owned: Some(owned),
            }
        }
    };
    let mut loads = Vec::new();
    if config.stress {
        loads.push(spawn(
            Command::new("stress-ng")
                .args(["--cpu", &config.housekeeping.len().to_string()])
                .args([
                    "--io",
                    "2",
                    "--vm",
                    "2",
                    "--vm-bytes",
                    &config.stress_vm_bytes,
                ]),
            "stress-ng",
        )?);
    }
    if let Some(extra) = &config.extra_load {
        loads.push(spawn(
            Command::new("sh").args(["-c", extra]),
            "the extra load",
        )?);
    }
    let probe = dir.path().join("jetson-loop.probe");
    let mut control = LoopProcess::start(
        &bins.synthetic_loop,
        &LoopSpec {
            probe: probe.clone(),
            loop_id: 25,
            name: "jetson-25hz".into(),
            rate_hz: 25.0,
            budget_ms: 40.0,
            deadline_ms: None,
            fifo: Some(80),
            cpu: Some(config.control_cpu),
            require_rt: true,
            capacity: None,
        },
    )?;
    let reader = loop_probe::ProbeReader::open(&probe).map_err(|e| LevelError::Io {
        context: "opening the loop's probe".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let misses = || reader.summary().map_or(0, |s| s.cycles.deadline_misses);
    let main_cpus = config
        .housekeeping
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut blocks = Vec::new();
    for i in 0..config.blocks {
        let on = i % 2 == 1;
        switch.set(on);
        let misses0 = misses();
        let args = cyclictest::args(
            config.control_cpu,
            95,
            config.block.as_secs().max(1),
            config.histogram_us,
            &main_cpus,
        );
        let output = Command::new("cyclictest")
            .args(&args)
            .output()
            .map_err(|source| LevelError::Io {
                context: "running cyclictest".into(),
                source,
            })?;
        let result = cyclictest::parse(&String::from_utf8_lossy(&output.stdout)).map_err(|e| {
            LevelError::Unsupported(format!(
                "cyclictest {} gave no result ({e}): {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        })?;
        blocks.push((
            JetsonBlock {
                agent_on: on,
                max_us: result.max_us,
                loop_misses: misses().saturating_sub(misses0),
            },
            result,
        ));
    }
    switch.set(true);
    let _ = control.stop();
    drop(loads);
    let verdict = cyclictest::jetson_gate(
        &blocks.iter().map(|(b, _)| b.clone()).collect::<Vec<_>>(),
        config.slack_us,
    );
    Ok(JetsonReport {
        blocks,
        verdict,
        platform: facts(),
    })
}

//! The bench every level runs on: the real agent binary with a generated configuration, real
//! `edgewatch-synthetic-loop` processes writing real probes, a fake Jetson sysfs tree, and a
//! replayed tegrastats capture.
//!
//! Invariants:
//! - Every process started here is stopped and reaped when its handle drops (SIGCONT first, so a
//!   stopped agent cannot outlive a failed run).
//! - Nothing here imitates the agent: the agent under test is the binary that ships.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use edgewatch_harness::HarnessError;
use edgewatch_harness::collector::{Collector, Keep};
use edgewatch_harness::process::Launch;
pub use edgewatch_test_kit::sysfs::FakeSysfs;
use edgewatch_test_kit::sysfs::SysfsError;

/// A rig component that could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RigError {
    /// A binary is missing.
    #[error("{0}")]
    Binary(String),
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The fake sysfs tree could not be built.
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
    /// A harness component (agent process, subscriber) failed.
    #[error(transparent)]
    Harness(#[from] HarnessError),
    /// A process did not come up.
    #[error("{what} did not start: {detail}")]
    NotStarted {
        /// Which process.
        what: String,
        /// Its log or exit status.
        detail: String,
    },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RigError {
    let context = context.into();
    move |source| RigError::Io { context, source }
}

/// The environment variable naming the cargo profile the tests build the agent and the loop
/// in (`dist`, the shipped build, by default; `release` or `dev` for a quicker look, whose CPU
/// and memory numbers do not stand for the shipped binary).
pub const PROFILE_ENV: &str = "EDGEWATCH_HIL_PROFILE";

/// The cargo profile of the shipped binaries (`cross/build-machine`, the Debian packages).
pub const SHIPPED_PROFILE: &str = "dist";

/// The programs the levels run.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `edgewatch-agent`.
    pub agent: PathBuf,
    /// `edgewatch-synthetic-loop`.
    pub synthetic_loop: PathBuf,
    /// `edgewatch-hil` itself (its `seccomp-record` helper).
    pub hil: PathBuf,
}

impl Binaries {
    /// For tests: the agent and the loop built by the harness in the profile named by
    /// [`PROFILE_ENV`] (default [`SHIPPED_PROFILE`]: the levels measure the build that ships, and
    /// a debug agent costs several times the CPU); `hil` is the test's
    /// `CARGO_BIN_EXE_edgewatch-hil`.
    pub fn for_tests(hil: &Path) -> Result<Self, RigError> {
        let profile = std::env::var(PROFILE_ENV).unwrap_or_else(|_| SHIPPED_PROFILE.to_owned());
        let build = |package: &str| {
            edgewatch_harness::binaries::workspace_binary_in_profile(
                package,
                package,
                Some(&profile),
            )
            .map_err(|e| RigError::Binary(e.to_string()))
        };
        Ok(Self {
            agent: build("edgewatch-agent")?,
            synthetic_loop: build("edgewatch-synthetic-loop")?,
            hil: hil.to_owned(),
        })
    }

    /// For the command line: the binaries beside the running `edgewatch-hil`, unless given.
    pub fn beside_current_exe(
        agent: Option<PathBuf>,
        synthetic_loop: Option<PathBuf>,
    ) -> Result<Self, RigError> {
        let hil = std::env::current_exe().map_err(io("locating edgewatch-hil"))?;
        let dir = hil.parent().map(Path::to_owned).unwrap_or_default();
        let find = |given: Option<PathBuf>, name: &str| {
            let path = given.unwrap_or_else(|| dir.join(name));
            if path.is_file() {
                Ok(path)
            } else {
                Err(RigError::Binary(format!(
                    "{} not found; build it beside edgewatch-hil (cargo build --profile dist -p edgewatch-agent -p edgewatch-synthetic-loop -p edgewatch-hil) or pass its path",
                    path.display()
                )))
            }
        };
        Ok(Self {
            agent: find(agent, "edgewatch-agent")?,
            synthetic_loop: find(synthetic_loop, "edgewatch-synthetic-loop")?,
            hil,
        })
    }
}

/// The replayed tegrastats capture (AGX Orin, JetPack 6.2.1), from the parser's test data.
pub fn default_capture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../agent/tegrastats-parser/tests/data/orin-agx-64gb_jp6.2.1_l4t-r36.4.4.txt")
}

/// A scratch directory in `/dev/shm` when there is one (probes belong in shared memory), else in
/// the temporary directory.
pub fn scratch(prefix: &str) -> Result<tempfile::TempDir, RigError> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix);
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = builder.tempdir_in(shm)
    {
        return Ok(dir);
    }
    builder
        .tempdir()
        .map_err(io("creating a scratch directory"))
}

/// A fake Jetson sysfs tree (AGX Orin-like) under `root`, laid out as the real one (see
/// [`edgewatch_test_kit::sysfs`]): cpu, gpu, tj and soc0 zones, three clusters running at
/// 1728 MHz, the ga10b GPU, INA3221 and `soctherm_oc` hwmons, power mode 0. Trip points sit far
/// above the capture's temperatures, so sampling alone emits no throttle events.
pub fn orin_sysfs(root: &Path) -> Result<FakeSysfs, RigError> {
    let fake = FakeSysfs::at(root);
    for (n, kind, temp) in [
        (0, "cpu-thermal", 50_000),
        (1, "gpu-thermal", 48_000),
        (2, "tj-thermal", 50_000),
        (3, "soc0-thermal", 47_000),
    ] {
        fake.zone(
            n,
            kind,
            temp,
            &[(95_500, "passive", 0), (105_000, "critical", 0)],
        )?;
    }
    fake.orin_devices(1_728_000)?;
    Ok(fake)
}

/// One probe the agent samples.
#[derive(Debug, Clone)]
pub struct ProbeSpec {
    /// Probe file.
    pub path: PathBuf,
    /// Loop name (also in the probe).
    pub loop_name: String,
}

/// What varies between the levels' agents; the rest of the configuration is fixed.
#[derive(Debug, Clone)]
pub struct AgentSpec {
    /// Broker port the uplink connects to (nothing listening: offline).
    pub uplink_port: u16,
    /// Reconnect backoff, first and longest, ms.
    pub backoff_ms: (u64, u64),
    /// Agent cores; empty leaves affinity alone.
    pub cores: Vec<usize>,
    /// Control-loop cores the agent must avoid.
    pub control_loop_cores: Vec<usize>,
    /// Probes sampled.
    pub probes: Vec<ProbeSpec>,
    /// `deadline.poll_hz`.
    pub poll_hz: u32,
    /// `deadline.snapshot_interval_s`.
    pub snapshot_interval_s: u32,
    /// Fake sysfs root.
    pub sysfs_root: PathBuf,
    /// `thermal.poll_interval_ms`.
    pub sysfs_poll_ms: u32,
    /// Replayed capture.
    pub capture: PathBuf,
    /// `thermal.replay_speed`.
    pub replay_speed: f64,
    /// `thermal.counters_interval_s`.
    pub counters_interval_s: u32,
    /// `thermal.debug_sample_every`.
    pub debug_sample_every: u32,
    /// `uplink.bandwidth_bytes_per_s` (0: unlimited).
    pub bandwidth_bytes_per_s: u64,
}

impl AgentSpec {
    /// The configuration file's text, rooted at `dir`.
    pub fn config_text(&self, dir: &Path) -> String {
        let list = |v: &[usize]| {
            v.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut probes = String::new();
        for probe in &self.probes {
            probes.push_str(&format!(
                "\n[[probe]]\npath = \"{}\"\nloop_name = \"{}\"\n",
                probe.path.display(),
                probe.loop_name
            ));
        }
        format!(
            r#"# Generated by edgewatch-hil.
[machine]
id = "hil-1"
site = "lab"
class = "haul-truck"

[queue]
dir = "{queue}"
budget_bytes = 1073741824

[uplink]
host = "127.0.0.1"
port = {port}
keepalive_s = 5
backoff_min_ms = {backoff_min}
backoff_max_ms = {backoff_max}
initial_delay_max_ms = 0
bandwidth_bytes_per_s = {bandwidth}

[scheduling]
cores = [{cores}]
control_loop_cores = [{loop_cores}]
idle_priority = true

[ingest]
socket = "{socket}"

[status]
file = "{status}"

[deadline]
poll_hz = {poll_hz}
snapshot_interval_s = {snapshot}
{probes}
[thermal]
replay = "{capture}"
replay_speed = {speed:.1}
replay_loop = true
sysfs_root = "{sysfs}"
poll_interval_ms = {sysfs_poll}
counters_interval_s = {counters}
debug_sample_every = {debug_every}
"#,
            queue = dir.join("queue").display(),
            port = self.uplink_port,
            backoff_min = self.backoff_ms.0,
            backoff_max = self.backoff_ms.1,
            bandwidth = self.bandwidth_bytes_per_s,
            cores = list(&self.cores),
            loop_cores = list(&self.control_loop_cores),
            socket = dir.join("agent.sock").display(),
            status = dir.join("agent-status.json").display(),
            poll_hz = self.poll_hz,
            snapshot = self.snapshot_interval_s,
            capture = self.capture.display(),
            speed = self.replay_speed,
            sysfs = self.sysfs_root.display(),
            sysfs_poll = self.sysfs_poll_ms,
            counters = self.counters_interval_s,
            debug_every = self.debug_sample_every,
        )
    }
}

/// A port on 127.0.0.1 where nothing listens (bound, then closed): an offline uplink whose
/// connection attempts are refused at once.
pub fn dead_port() -> Result<u16, RigError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("binding a port"))?;
    let port = listener.local_addr().map_err(io("reading a port"))?.port();
    drop(listener);
    Ok(port)
}

/// The real agent, running (`edgewatch_harness::agent`, configured from an [`AgentSpec`]).
pub struct RigAgent {
    agent: edgewatch_harness::agent::AgentProcess,
}

impl RigAgent {
    /// Writes the configuration into `dir` and starts `agent run`; waits for its socket.
    pub fn start(
        binary: &Path,
        spec: &AgentSpec,
        dir: &Path,
        env: &[(&str, PathBuf)],
    ) -> Result<Self, RigError> {
        let mut launch = Launch::new("warn");
        for (key, value) in env {
            launch = launch.env(key, value);
        }
        let mut agent = edgewatch_harness::agent::AgentProcess::start(
            binary,
            dir,
            &spec.config_text(dir),
            launch,
        )?;
        let detail = match agent.wait_for_socket(Duration::from_secs(30)) {
            Ok(()) => return Ok(Self { agent }),
            Err(HarnessError::Exited { status, .. }) => {
                format!("exited with {status}; log:\n{}", agent.log())
            }
            Err(HarnessError::NotReady { .. }) => {
                format!("no socket after 30 s; log:\n{}", agent.log())
            }
            Err(other) => return Err(other.into()),
        };
        Err(RigError::NotStarted {
            what: "edgewatch-agent".into(),
            detail,
        })
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.agent.pid().unwrap_or(0)
    }

    /// The agent's directory (queue, socket, status, log).
    pub fn dir(&self) -> &Path {
        self.agent.dir()
    }

    /// The local ingest socket.
    pub fn socket(&self) -> PathBuf {
        self.agent.socket()
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.agent.log()
    }

    /// The agent's status file, parsed (`Null` if absent).
    pub fn status(&self) -> serde_json::Value {
        self.agent.status_file()
    }

    /// Still running (not exited)?
    pub fn running(&mut self) -> bool {
        self.agent.running()
    }

    /// SIGSTOP: the agent-off arm of a pair.
    pub fn pause(&mut self) {
        self.agent.pause();
    }

    /// SIGCONT.
    pub fn resume(&mut self) {
        self.agent.resume();
    }

    /// SIGTERM and wait (SIGKILL after 10 s); returns the exit status text.
    pub fn terminate(&mut self) -> String {
        self.agent.terminate(Duration::from_secs(10)).to_string()
    }
}

/// How a synthetic loop runs.
#[derive(Debug, Clone)]
pub struct LoopSpec {
    /// Probe file to create.
    pub probe: PathBuf,
    /// Loop id.
    pub loop_id: u32,
    /// Loop name.
    pub name: String,
    /// Rate, Hz.
    pub rate_hz: f64,
    /// Budget, ms.
    pub budget_ms: f64,
    /// Relative deadline, ms (`None`: the loop's default, its period).
    pub deadline_ms: Option<f64>,
    /// SCHED_FIFO priority.
    pub fifo: Option<u8>,
    /// CPU to pin to.
    pub cpu: Option<usize>,
    /// Fail unless memory can be locked.
    pub require_rt: bool,
    /// Ring slots (default: 16 s of records).
    pub capacity: Option<u32>,
}

/// A running `edgewatch-synthetic-loop`, stopped by SIGTERM.
pub struct LoopProcess {
    child: Option<Child>,
    spec: LoopSpec,
}

/// Exit status 77: the loop was refused real-time privileges.
pub const EXIT_NO_PERMISSION: i32 = 77;

impl LoopProcess {
    /// Starts the loop and waits until its probe file exists.
    pub fn start(binary: &Path, spec: &LoopSpec) -> Result<Self, RigError> {
        let mut command = Command::new(binary);
        command
            .arg("--probe")
            .arg(&spec.probe)
            .args(["--loop-id", &spec.loop_id.to_string()])
            .args(["--loop-name", &spec.name])
            .args(["--rate-hz", &spec.rate_hz.to_string()])
            .args(["--budget-ms", &spec.budget_ms.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(deadline_ms) = spec.deadline_ms {
            command.args(["--deadline", &format!("{deadline_ms}ms")]);
        }
        if let Some(fifo) = spec.fifo {
            command.args(["--fifo", &fifo.to_string()]);
        }
        if let Some(cpu) = spec.cpu {
            command.args(["--cpu", &cpu.to_string()]);
        }
        if let Some(capacity) = spec.capacity {
            command.args(["--capacity", &capacity.to_string()]);
        }
        if spec.require_rt {
            command.arg("--require-rt");
        }
        let child = command
            .spawn()
            .map_err(io(format!("starting {}", binary.display())))?;
        let mut process = Self {
            child: Some(child),
            spec: spec.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !spec.probe.exists() {
            if let Some(child) = process.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let mut stderr = String::new();
                if let Some(mut err) = child.stderr.take() {
                    let _ = err.read_to_string(&mut stderr);
                }
                return Err(RigError::NotStarted {
                    what: format!("synthetic loop {}", spec.name),
                    detail: format!("{status}: {}", stderr.trim()),
                });
            }
            if Instant::now() > deadline {
                return Err(RigError::NotStarted {
                    what: format!("synthetic loop {}", spec.name),
                    detail: "no probe file after 10 s".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(process)
    }

    /// The loop's spec.
    pub fn spec(&self) -> &LoopSpec {
        &self.spec
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// SIGTERM, wait, and return the loop's JSON summary.
    pub fn stop(&mut self) -> Result<serde_json::Value, RigError> {
        let Some(child) = self.child.take() else {
            return Ok(serde_json::Value::Null);
        };
        // SAFETY: kill(2) on our own unreaped child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let output = child
            .wait_with_output()
            .map_err(io("waiting for the synthetic loop"))?;
        serde_json::from_slice(&output.stdout).map_err(|e| RigError::NotStarted {
            what: format!("synthetic loop {}", self.spec.name),
            detail: format!(
                "no JSON summary ({e}); status {}; stderr: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        })
    }
}

impl Drop for LoopProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Pins the calling thread (and the threads and processes it creates afterwards) to `cpus`.
pub fn pin_self(cpus: &[usize]) -> Result<(), RigError> {
    // SAFETY: an all-zero cpu_set_t is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: CPU ids come from this machine's own CPU list, below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(RigError::Io {
            context: format!("pinning to CPUs {cpus:?}"),
            source: std::io::Error::last_os_error(),
        })
    }
}

/// A subscriber on `edgewatch/v1/#` (QoS 0), standing in for the gateway so the broker has
/// someone to deliver to (the agent keeps a batch the broker had no subscriber for). Counts the
/// messages it receives, without decoding them.
pub struct Subscriber {
    collector: Collector,
}

impl Subscriber {
    /// Connects to `broker` and subscribes; returns once the subscription is acknowledged.
    pub fn start(broker: std::net::SocketAddr) -> Result<Self, RigError> {
        let options = edgewatch_harness::mqtt::options("edgewatch-hil-subscriber", broker);
        match Collector::subscribe(
            options,
            rumqttc::v5::mqttbytes::QoS::AtMostOnce,
            Keep::MessageCount,
        ) {
            Ok(collector) => Ok(Self { collector }),
            Err(HarnessError::NotReady { .. }) => Err(RigError::NotStarted {
                what: "the broker subscriber".into(),
                detail: "no SUBACK within 15 s".into(),
            }),
            Err(other) => Err(other.into()),
        }
    }

    /// Messages received so far.
    pub fn received(&self) -> u64 {
        self.collector.messages()
    }
}

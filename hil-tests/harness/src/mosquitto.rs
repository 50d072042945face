//! A real Mosquitto broker on an ephemeral loopback port.
//!
//! The broker runs from a generated configuration in a temporary directory (config, log,
//! persistence, certificates, ACL). It can be SIGKILLed and restarted on the same port with the same
//! persistence directory, which the uplink's crash tests need.
//!
//! Invariants:
//! - Listens on 127.0.0.1 only; the process is killed and reaped when the handle drops.
//! - `max_queued_messages 0`: the broker never silently drops a slow subscriber's queue (the
//!   default of 1000 would lose data in exactly the tests that look for loss).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::net::{find_program, free_port, loopback, wait_for_listener};
use crate::{HarnessError, Result};

/// Broker-side TLS material (PEM files).
#[derive(Debug, Clone)]
pub struct BrokerTls {
    /// CA that signs client certificates.
    pub ca_file: PathBuf,
    /// Broker certificate (SAN 127.0.0.1 and localhost).
    pub cert_file: PathBuf,
    /// Broker private key.
    pub key_file: PathBuf,
    /// Optional certificate revocation list.
    pub crl_file: Option<PathBuf>,
}

/// How to configure the broker.
#[derive(Debug, Clone)]
pub struct MosquittoOptions {
    /// mTLS: require a client certificate and use its CN as the username.
    pub tls: Option<BrokerTls>,
    /// ACL file contents (`pattern write edgewatch/v1/+/%u/#` ...).
    pub acl: Option<String>,
    /// Keep messages and sessions in `mosquitto.db` across restarts.
    pub persistence: bool,
    /// Seconds between persistence snapshots.
    pub autosave_interval_s: u32,
    /// Largest MQTT packet accepted, in bytes.
    pub max_packet_size: u32,
    /// Receive Maximum announced to v5 clients.
    pub max_inflight_messages: u32,
    /// Extra configuration lines.
    pub extra: Vec<String>,
}

impl Default for MosquittoOptions {
    fn default() -> Self {
        Self {
            tls: None,
            acl: None,
            persistence: true,
            autosave_interval_s: 1,
            max_packet_size: 1024 * 1024,
            max_inflight_messages: 20,
            extra: Vec::new(),
        }
    }
}

/// A running (or stopped, restartable) Mosquitto process.
pub struct Mosquitto {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    program: PathBuf,
    config_file: PathBuf,
}

/// How long to wait for the broker to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(10);

impl Mosquitto {
    /// Starts a plain-TCP broker that allows anonymous clients.
    pub fn start() -> Result<Self> {
        Self::start_with(MosquittoOptions::default())
    }

    /// Starts a broker with the given options.
    pub fn start_with(options: MosquittoOptions) -> Result<Self> {
        let program = find_program("mosquitto", "EDGEWATCH_MOSQUITTO", "mosquitto")?;
        let dir = tempfile::Builder::new()
            .prefix("edgewatch-mosquitto-")
            .tempdir()
            .map_err(HarnessError::io("creating the broker directory"))?;
        let mut last_error = None;
        // Another process may take the ephemeral port before the broker binds it: try a few.
        for _attempt in 0..5 {
            let port = free_port()?;
            let config_file = write_config(dir.path(), port, &options)?;
            match spawn(&program, &config_file, dir.path(), port) {
                Ok(child) => {
                    return Ok(Self {
                        child: Some(child),
                        port,
                        dir,
                        program,
                        config_file,
                    });
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| HarnessError::Config("no attempt made".into())))
    }

    /// The port the broker listens on (stable across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> std::net::SocketAddr {
        loopback(self.port)
    }

    /// The broker's working directory (config, logs, persistence).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// PID of the running broker, if any.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the broker with SIGKILL (no persistence flush) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the broker with SIGTERM (it saves its persistence) and reaps it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(pid) = libc::pid_t::try_from(child.id()) {
                // SAFETY: kill(2) on a child we own and have not reaped; no memory is involved.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
            let _ = child.wait();
        }
    }

    /// Starts the broker again on the same port and directory. Retries for a while, since the
    /// port may still be held by the listener just killed.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        let mut last = None;
        for _ in 0..20 {
            match spawn(&self.program, &self.config_file, self.dir.path(), self.port) {
                Ok(child) => {
                    self.child = Some(child);
                    return Ok(());
                }
                Err(error) => {
                    last = Some(error);
                    std::thread::sleep(Duration::from_millis(250));
                }
            }
        }
        Err(last.unwrap_or_else(|| HarnessError::Config("restart never attempted".into())))
    }

    /// The broker's log (configuration errors, denied publishes), for assertions and diagnostics.
    pub fn log(&self) -> String {
        read_log(self.dir.path())
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_log(dir: &Path) -> String {
    let mut text = String::new();
    for name in ["mosquitto.log", "stdout.log"] {
        if let Ok(content) = std::fs::read_to_string(dir.join(name)) {
            text.push_str(&content);
        }
    }
    text
}

/// Starts the broker process and waits until it accepts connections.
fn spawn(program: &Path, config_file: &Path, dir: &Path, port: u16) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("stdout.log"))
        .map_err(HarnessError::io("opening the broker's stdout log"))?;
    let log_err = log
        .try_clone()
        .map_err(HarnessError::io("cloning the broker's log handle"))?;
    let mut child = Command::new(program)
        .arg("-c")
        .arg(config_file)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(HarnessError::io(format!("starting {}", program.display())))?;
    if wait_for_listener(loopback(port), START_TIMEOUT) {
        return Ok(child);
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = read_log(dir);
    let lines: Vec<&str> = log.lines().collect();
    Err(HarnessError::NotReady {
        what: format!("mosquitto on 127.0.0.1:{port}"),
        seconds: START_TIMEOUT.as_secs(),
        detail: format!(
            "; log:\n{}",
            lines[lines.len().saturating_sub(20)..].join("\n")
        ),
    })
}

fn write_config(dir: &Path, port: u16, options: &MosquittoOptions) -> Result<PathBuf> {
    let mut config = String::new();
    let mut line = |text: String| {
        config.push_str(&text);
        config.push('\n');
    };
    line("per_listener_settings false".into());
    line(format!("listener {port} 127.0.0.1"));
    // Stay the current user: started as root, mosquitto would otherwise switch to `mosquitto`,
    // which cannot write this temporary directory.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        line("user root".into());
    }
    line(format!(
        "log_dest file {}",
        dir.join("mosquitto.log").display()
    ));
    line("log_type all".into());
    line("connection_messages true".into());
    line(format!("persistence {}", options.persistence));
    line(format!("persistence_location {}/", dir.display()));
    line(format!("autosave_interval {}", options.autosave_interval_s));
    line(format!("max_packet_size {}", options.max_packet_size));
    line(format!(
        "max_inflight_messages {}",
        options.max_inflight_messages
    ));
    line("max_queued_messages 0".into());
    line("persistent_client_expiration 7d".into());
    match &options.tls {
        Some(tls) => {
            line("allow_anonymous false".into());
            line(format!("cafile {}", tls.ca_file.display()));
            line(format!("certfile {}", tls.cert_file.display()));
            line(format!("keyfile {}", tls.key_file.display()));
            line("require_certificate true".into());
            line("use_identity_as_username true".into());
            line("use_username_as_clientid true".into());
            line("tls_version tlsv1.2".into());
            if let Some(crl) = &tls.crl_file {
                line(format!("crlfile {}", crl.display()));
            }
        }
        None => line("allow_anonymous true".into()),
    }
    if let Some(acl) = &options.acl {
        let acl_file = dir.join("acl");
        std::fs::write(&acl_file, acl).map_err(HarnessError::io("writing the ACL file"))?;
        line(format!("acl_file {}", acl_file.display()));
    }
    for extra in &options.extra {
        line(extra.clone());
    }
    let config_file = dir.join("mosquitto.conf");
    std::fs::write(&config_file, config).map_err(HarnessError::io("writing mosquitto.conf"))?;
    Ok(config_file)
}

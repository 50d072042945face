//! Test harness for edgewatch: the real parts integration tests, benches, the HIL rig and the
//! demo talk to, on loopback, and the processes they run.
//!
//! Layout:
//! - [`mosquitto`]: a real Mosquitto process on an ephemeral loopback port, with a generated
//!   configuration, optional mTLS and ACL; it can be SIGKILLed and restarted on the same port.
//! - [`pki`]: a throwaway fleet PKI (CA, broker certificate, per-machine client certificates).
//! - [`embedded`]: an in-process rumqttd broker (no shutdown API upstream: it lives until the test
//!   process exits).
//! - [`proxy`]: a fault-injecting TCP proxy (pass, blackhole, reset, delay, throttle), switchable
//!   while connections are open, with byte counters.
//! - [`mqtt`]: small MQTT v5 client helpers for tests.
//! - [`prometheus`]: a real Prometheus with the remote-write receiver and an out-of-order window.
//! - [`net`]: ephemeral ports and readiness waits.
//! - [`binaries`]: other workspace crates' binaries, built on demand, for process-level tests.
//! - [`process`]: a child process with its log file: signals, SIGTERM with a grace period,
//!   SIGKILL, reaping on drop.
//! - [`agent`]: the real agent binary in a directory of its own (config, log, socket, status).
//! - [`gateway`]: the real gateway binary, ready once subscribed, read through `/metrics`.
//! - [`metrics`]: scraping and reading a Prometheus text exposition.
//! - [`collector`]: an MQTT subscriber on everything the agents publish, decoding every batch.
//! - [`events`]: custom events with an id and incompressible padding, for agents to carry.
//!
//! Invariants:
//! - Everything listens on 127.0.0.1 only and is stopped when its handle drops.
//! - Nothing here is a mock: the brokers are real brokers, the proxy moves real bytes, the agent
//!   and gateway are the binaries that ship.
//! - Depends on no agent or gateway crate: it runs their binaries (found by [`binaries`] or given
//!   by the caller) and speaks only the wire format (`edgewatch-proto`) to them.

pub mod agent;
pub mod binaries;
pub mod collector;
pub mod embedded;
pub mod events;
pub mod gateway;
pub mod metrics;
pub mod mosquitto;
pub mod mqtt;
pub mod net;
pub mod pki;
pub mod process;
pub mod prometheus;
pub mod proxy;

/// Why a harness component could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A program the harness runs is not installed.
    #[error(
        "{program} was not found (looked in $PATH, /usr/sbin and ${env}); install it (e.g. `apt-get install -y {package}`) or run the README's test command, which installs it"
    )]
    MissingProgram {
        /// Program name.
        program: &'static str,
        /// Environment variable that overrides the path.
        env: &'static str,
        /// Debian package that provides it.
        package: &'static str,
    },
    /// A process or listener did not become ready in time.
    #[error("{what} was not ready after {seconds} s{detail}")]
    NotReady {
        /// What was awaited.
        what: String,
        /// How long we waited.
        seconds: u64,
        /// Extra context (e.g. the tail of a log).
        detail: String,
    },
    /// A process exited when it should have been running.
    #[error("{what} exited ({status}); see {}", log.display())]
    Exited {
        /// Which process.
        what: String,
        /// How it exited.
        status: std::process::ExitStatus,
        /// Its log file.
        log: std::path::PathBuf,
    },
    /// An I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Certificate generation failed.
    #[error("certificate generation failed: {0}")]
    Certificate(#[from] rcgen::Error),
    /// A broker configuration could not be built.
    #[error("broker configuration: {0}")]
    Config(String),
}

impl HarnessError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }
}

/// Result type of the harness.
pub type Result<T, E = HarnessError> = std::result::Result<T, E>;

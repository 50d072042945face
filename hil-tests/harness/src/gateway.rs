//! The real `edgewatch-gateway` binary as a child process, run from a configuration file the
//! caller wrote, and read through its `/metrics` endpoint.
//!
//! Invariants:
//! - Ready means subscribed: `start` and `restart` return once `/metrics` reports
//!   `edgewatch_gateway_subscribed 1`; a gateway that exits while starting is an error naming its
//!   log, not a timeout.
//! - The gateway is stopped and reaped when the handle drops ([`crate::process::Process`]).
//! - Reading metrics never disturbs the gateway: one HTTP scrape, bounded by
//!   [`SCRAPE_TIMEOUT`].

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::Result;
use crate::metrics;
use crate::process::{Launch, Process, run_with_config};

/// How long a scrape of `/metrics` may take.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// A running (or stopped, restartable) gateway.
#[derive(Debug)]
pub struct GatewayProcess {
    binary: PathBuf,
    config: PathBuf,
    log: PathBuf,
    metrics: SocketAddr,
    launch: Launch,
    process: Process,
}

impl GatewayProcess {
    /// Starts `<binary> run --config <config>` with its output appended to `log`, and waits up to
    /// `ready_within` until its `/metrics` (which the configuration puts at `metrics`) reports
    /// the subscription.
    pub fn start(
        binary: &Path,
        config: &Path,
        log: &Path,
        metrics: SocketAddr,
        launch: Launch,
        ready_within: Duration,
    ) -> Result<Self> {
        let process = Self::spawn(binary, config, log, &launch)?;
        let mut gateway = Self {
            binary: binary.to_owned(),
            config: config.to_owned(),
            log: log.to_owned(),
            metrics,
            launch,
            process,
        };
        gateway.wait_subscribed(ready_within)?;
        Ok(gateway)
    }

    fn spawn(binary: &Path, config: &Path, log: &Path, launch: &Launch) -> Result<Process> {
        let mut command = Command::new(binary);
        command.arg("run").arg("--config").arg(config);
        launch.spawn("the gateway", command, log)
    }

    /// Starts the same gateway again (same configuration: same client id, same store) after
    /// [`Process::kill`] or [`Process::terminate`], and waits as [`GatewayProcess::start`].
    pub fn restart(&mut self, ready_within: Duration) -> Result<()> {
        self.process.kill();
        self.process = Self::spawn(&self.binary, &self.config, &self.log, &self.launch)?;
        self.wait_subscribed(ready_within)
    }

    fn wait_subscribed(&mut self, within: Duration) -> Result<()> {
        let addr = self.metrics;
        self.process
            .wait_until("the gateway's subscription", within, || {
                metrics::scrape(addr, SCRAPE_TIMEOUT).is_some_and(|text| {
                    metrics::value(&text, "edgewatch_gateway_subscribed") == Some(1.0)
                })
            })
    }

    /// The configuration file.
    pub fn config(&self) -> &Path {
        &self.config
    }

    /// The `/metrics` address.
    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics
    }

    /// The `/metrics` text, or `None` if the gateway does not answer.
    pub fn scrape(&self) -> Option<String> {
        metrics::scrape(self.metrics, SCRAPE_TIMEOUT)
    }

    /// The value of series `series` ([`metrics::value`]), or `None` if the gateway does not
    /// answer or does not export it.
    pub fn metric(&self, series: &str) -> Option<f64> {
        metrics::value(&self.scrape()?, series)
    }

    /// Waits up to `within` until `predicate` holds for the value of series `series`; returns
    /// that value, or the last value seen (`None`: never exported) as the error.
    pub fn wait_metric(
        &self,
        series: &str,
        predicate: impl Fn(f64) -> bool,
        within: Duration,
    ) -> std::result::Result<f64, Option<f64>> {
        let deadline = Instant::now() + within;
        loop {
            let value = self.metric(series);
            if let Some(value) = value
                && predicate(value)
            {
                return Ok(value);
            }
            if Instant::now() > deadline {
                return Err(value);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `<binary> <args> --config <config>` to completion.
    pub fn command(&self, args: &[&str]) -> Result<std::process::Output> {
        run_with_config(&self.binary, args, &self.config)
    }
}

/// The process: log, pid, signals, terminate, kill.
impl Deref for GatewayProcess {
    type Target = Process;

    fn deref(&self) -> &Process {
        &self.process
    }
}

impl DerefMut for GatewayProcess {
    fn deref_mut(&mut self) -> &mut Process {
        &mut self.process
    }
}

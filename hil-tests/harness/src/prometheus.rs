//! A real Prometheus server on an ephemeral loopback port, with the remote-write receiver enabled
//! and an out-of-order window, for tests that write samples days old, and a rule file that tests
//! fill while it runs ([`Prometheus::load_rules`]).
//!
//! Invariants:
//! - Listens on 127.0.0.1 only; its TSDB lives in a temporary directory; the process is killed and
//!   reaped when the handle drops.
//! - `start` returns only once `/-/ready` answers 200.
//! - Rules are evaluated at Prometheus' default interval (1 m) unless a rule group sets its own.
//! - Before `start` returns, one sample at the current time (`harness_head_anchor`) is written,
//!   so the TSDB's in-order head begins now: samples hours or days old that a test writes land in
//!   its out-of-order head, and no compaction runs while a test queries. (Prometheus compacts its
//!   head once the head spans 3 h; a head begun by a test's first, days-old sample spans that
//!   after a few hours of test data, and compactions then ran during the test's queries. Before
//!   Prometheus 2.49, a query racing a compaction could leave samples out of its answer.)

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::net::{find_program, free_port, loopback};
use crate::{HarnessError, Result};

/// How long to wait for `/-/ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The rule file named in the configuration, beside it (absent, so empty, until
/// [`Prometheus::load_rules`] writes it).
const RULE_FILE: &str = "rules.yml";

/// Options for the server.
#[derive(Debug, Clone)]
pub struct PrometheusOptions {
    /// `storage.tsdb.out_of_order_time_window`, e.g. "30d" (at least the age of the oldest sample
    /// the test writes).
    pub out_of_order_window: String,
    /// `--storage.tsdb.retention.time`.
    pub retention: String,
}

impl Default for PrometheusOptions {
    fn default() -> Self {
        Self {
            out_of_order_window: "30d".into(),
            retention: "90d".into(),
        }
    }
}

/// A running Prometheus.
pub struct Prometheus {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts a server with the default options (30 d out-of-order window).
    pub fn start() -> Result<Self> {
        Self::start_with(PrometheusOptions::default())
    }

    /// Starts a server with `options`.
    pub fn start_with(options: PrometheusOptions) -> Result<Self> {
        let program = find_program("prometheus", "EDGEWATCH_PROMETHEUS", "prometheus")?;
        let dir = tempfile::Builder::new()
            .prefix("edgewatch-prometheus-")
            .tempdir()
            .map_err(HarnessError::io("creating the Prometheus directory"))?;
        let config_file = dir.path().join("prometheus.yml");
        std::fs::write(
            &config_file,
            format!(
                "global:\n  scrape_interval: 1m\nrule_files:\n  - {RULE_FILE}\nstorage:\n  tsdb:\n    out_of_order_time_window: {}\n",
                options.out_of_order_window
            ),
        )
        .map_err(HarnessError::io("writing prometheus.yml"))?;
        let mut last_error = None;
        // The ephemeral port may be taken before Prometheus binds it: try a few.
        for _attempt in 0..5 {
            let port = free_port()?;
            match spawn(&program, &config_file, dir.path(), port, &options) {
                Ok(child) => {
                    let prometheus = Self {
                        child: Some(child),
                        port,
                        dir,
                    };
                    prometheus.anchor_head()?;
                    return Ok(prometheus);
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| HarnessError::Config("no attempt made".into())))
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.port)
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The remote-write endpoint, `http://127.0.0.1:<port>/api/v1/write`.
    pub fn remote_write_url(&self) -> String {
        format!("{}/api/v1/write", self.base_url())
    }

    /// The server's directory (config, TSDB, log).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Replaces the server's rules with `yaml` (a Prometheus rule file) and reloads its
    /// configuration; returns once the reload succeeded, so the new groups are scheduled.
    pub fn load_rules(&self, yaml: &str) -> Result<()> {
        std::fs::write(self.dir.path().join(RULE_FILE), yaml)
            .map_err(HarnessError::io("writing the rule file"))?;
        let answer = http_request(self.addr(), "POST", "/-/reload", "", &[])
            .map_err(HarnessError::io("asking Prometheus to reload"))?;
        expect_status(&answer, 200, "Prometheus refused the rules")
    }

    /// Writes `harness_head_anchor 1` at the current time (see the module doc).
    fn anchor_head(&self) -> Result<()> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|error| HarnessError::Config(format!("the clock is before 1970: {error}")))?
            .as_millis() as i64;
        self.write_samples("harness_head_anchor", &[(now_ms, 1.0)])
    }

    /// Writes `samples` (`(timestamp ms, value)`) of the series `metric` (no other label) by
    /// remote-write 1.0; returns once Prometheus answered 204.
    pub fn write_samples(&self, metric: &str, samples: &[(i64, f64)]) -> Result<()> {
        let body = snap::raw::Encoder::new()
            .compress_vec(&write_request(metric, samples))
            .map_err(|error| HarnessError::Config(format!("snappy: {error}")))?;
        let answer = http_request(
            self.addr(),
            "POST",
            "/api/v1/write",
            "Content-Type: application/x-protobuf\r\nContent-Encoding: snappy\r\n\
             X-Prometheus-Remote-Write-Version: 0.1.0\r\n",
            &body,
        )
        .map_err(HarnessError::io("remote-writing to Prometheus"))?;
        expect_status(
            &answer,
            204,
            &format!("Prometheus refused samples of {metric}"),
        )
    }

    /// The server's log, for diagnostics.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn(
    program: &Path,
    config_file: &Path,
    dir: &Path,
    port: u16,
    options: &PrometheusOptions,
) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("prometheus.log"))
        .map_err(HarnessError::io("opening the Prometheus log"))?;
    let log_err = log
        .try_clone()
        .map_err(HarnessError::io("cloning the Prometheus log handle"))?;
    let tsdb: PathBuf = dir.join("data");
    let mut child = Command::new(program)
        .arg(format!("--config.file={}", config_file.display()))
        .arg(format!("--storage.tsdb.path={}", tsdb.display()))
        .arg(format!(
            "--storage.tsdb.retention.time={}",
            options.retention
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--web.enable-remote-write-receiver")
        // `/-/reload`, for rules loaded while it runs (loopback only).
        .arg("--web.enable-lifecycle")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err)
        .spawn()
        .map_err(HarnessError::io(format!("starting {}", program.display())))?;
    let deadline = Instant::now() + READY_TIMEOUT;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if http_status(loopback(port), "/-/ready") == Some(200) {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    Err(HarnessError::NotReady {
        what: format!("prometheus on 127.0.0.1:{port}"),
        seconds: READY_TIMEOUT.as_secs(),
        detail: format!(
            "; log:\n{}",
            lines[lines.len().saturating_sub(20)..].join("\n")
        ),
    })
}

/// The whole answer to `method path` over plain HTTP/1.0, sending `headers` (each line ending in
/// `\r\n`) and `body`.
fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{headers}Content-Length: {}\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// `Ok` when `answer` has status `code`; otherwise an error saying `refused` and the answer's
/// last line (Prometheus puts its reason there).
fn expect_status(answer: &str, code: u16, refused: &str) -> Result<()> {
    if answer.starts_with(&format!("HTTP/1.0 {code}"))
        || answer.starts_with(&format!("HTTP/1.1 {code}"))
    {
        Ok(())
    } else {
        Err(HarnessError::Config(format!(
            "{refused}: {}",
            answer.lines().last().unwrap_or_default()
        )))
    }
}

/// A remote-write 1.0 `WriteRequest` of one series, `metric` with `samples`, encoded by hand
/// (`WriteRequest.timeseries` = 1, `TimeSeries.labels` = 1 / `.samples` = 2, `Label.name` = 1 /
/// `.value` = 2, `Sample.value` = 1 (double) / `.timestamp` = 2 (int64)).
fn write_request(metric: &str, samples: &[(i64, f64)]) -> Vec<u8> {
    fn length_delimited(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
        out.push(field << 3 | 2);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }
    fn varint(out: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            out.push(value as u8 | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }
    let mut label = Vec::new();
    length_delimited(&mut label, 1, b"__name__");
    length_delimited(&mut label, 2, metric.as_bytes());
    let mut series = Vec::new();
    length_delimited(&mut series, 1, &label);
    for &(ts_ms, value) in samples {
        let mut sample = vec![1 << 3 | 1];
        sample.extend_from_slice(&value.to_le_bytes());
        sample.push(2 << 3);
        varint(&mut sample, ts_ms as u64);
        length_delimited(&mut series, 2, &sample);
    }
    let mut request = Vec::new();
    length_delimited(&mut request, 1, &series);
    request
}

/// Status code of `GET path` over plain HTTP/1.0, or `None` if nothing answered.
fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

//! The gateway's ingest against VictoriaMetrics on the same samples, in the same run: the
//! samples the gateway stores from the ingest bench's batches (`ingest_payloads`), sent to a
//! VictoriaMetrics started here through Prometheus remote-write (the gateway's own request
//! builder, snappy and sender), one request at a time on one connection, as the gateway sends:
//! once as the gateway's outbox holds them (one request per machine and group), once merged into
//! one request per group of messages (fewer round trips, the same samples).
//!
//! Durability of each side, as run here: the gateway acknowledges a group only after redb
//! committed it with `Durability::Immediate` (fsync); VictoriaMetrics answers a remote-write
//! request once its rows are in its in-memory buffers, and writes them to disk about every
//! second (no fsync per request). So the gateway's figure is of durable samples, VictoriaMetrics'
//! of buffered ones.
//!
//! Needs Debian's `victoria-metrics` package (`sudo apt-get install victoria-metrics`), or the
//! binary named by `VICTORIA_METRICS`. Not part of the test run.
//!
//! Run: `cargo bench -p edgewatch-gateway --bench victoria`

#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::expect_used)]

mod ingest_payloads;

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use edgewatch_gateway::config::{IngestConfig, RemoteWriteConfig};
use edgewatch_gateway::ingest::{Incoming, Ingestor};
use edgewatch_gateway::remote_write::{RemoteWriter, SendStats, WriteRequest};
use edgewatch_gateway::store::Store;
use ingest_payloads::{DECODINGS, GROUP, loadavg, median, payloads};
use prost::Message as _;

const RUNS: usize = 3;

/// The VictoriaMetrics binary: `VICTORIA_METRICS`, else Debian's.
fn victoria_binary() -> PathBuf {
    let path = std::env::var_os("VICTORIA_METRICS")
        .map_or_else(|| PathBuf::from("/usr/bin/victoria-metrics"), PathBuf::from);
    if !path.is_file() {
        panic!(
            "VictoriaMetrics not found at {}: install it with `sudo apt-get install \
             victoria-metrics` (Debian), or set VICTORIA_METRICS to its binary",
            path.display()
        );
    }
    path
}

/// A VictoriaMetrics process on a loopback port with a data dir of its own; killed when dropped,
/// so it stops on a failed run too.
struct Victoria {
    child: Child,
    port: u16,
    _data: tempfile::TempDir,
}

impl Victoria {
    fn start(binary: &Path) -> Self {
        let data = tempfile::tempdir().unwrap();
        // An ephemeral port, free a moment ago.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(binary)
            .arg(format!("-storageDataPath={}", data.path().display()))
            .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
            .arg("-retentionPeriod=10y")
            .arg("-loggerLevel=ERROR")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let mut victoria = Self {
            child,
            port,
            _data: data,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while victoria
            .get("/health")
            .is_none_or(|body| body.trim() != "OK")
        {
            if let Some(status) = victoria.child.try_wait().unwrap() {
                panic!("VictoriaMetrics exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "VictoriaMetrics did not answer /health within 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        victoria
    }

    /// The body of a GET, `None` when it fails. HTTP/1.0, so the body comes whole (not chunked).
    fn get(&self, path: &str) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        head.split_whitespace()
            .nth(1)
            .filter(|status| *status == "200")?;
        Some(body.to_owned())
    }

    /// `vm_rows_inserted_total{type="promremotewrite"}`.
    fn rows_inserted(&self) -> u64 {
        let metrics = self.get("/metrics").unwrap_or_default();
        metrics
            .lines()
            .find_map(|line| {
                line.strip_prefix("vm_rows_inserted_total{type=\"promremotewrite\"} ")
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// CPU time (s) the process has used so far, all its threads: the sum of the first field of
    /// each thread's `/proc/<pid>/task/<tid>/schedstat` (ns on a CPU; finer than the clock ticks
    /// of `/proc/<pid>/stat`). VictoriaMetrics' threads live as long as it does.
    fn cpu_seconds(&self) -> f64 {
        let tasks = format!("/proc/{}/task", self.child.id());
        let mut ns = 0u64;
        for task in std::fs::read_dir(tasks).unwrap() {
            let stat =
                std::fs::read_to_string(task.unwrap().path().join("schedstat")).unwrap_or_default();
            ns += stat
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
        ns as f64 / 1e9
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/api/v1/write", self.port)
    }
}

impl Drop for Victoria {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Ingests every payload in groups; returns the samples stored and, per group, the outbox ids it
/// queued.
fn ingest_all(
    ingestor: &mut Ingestor,
    payloads: &[(String, Vec<u8>)],
    arrival_ns: i64,
) -> (u64, Vec<Vec<u64>>) {
    let mut samples = 0;
    let mut outbox = Vec::new();
    for group in payloads.chunks(GROUP) {
        let incoming: Vec<Incoming<'_>> = group
            .iter()
            .map(|(topic, payload)| Incoming { topic, payload })
            .collect();
        let report = ingestor.ingest(&incoming, arrival_ns).unwrap();
        samples += report.stats.samples_new;
        outbox.push(report.outbox_ids);
    }
    (samples, outbox)
}

/// Samples in remote-write bodies.
fn count(bodies: &[Vec<u8>]) -> u64 {
    bodies
        .iter()
        .map(|body| {
            WriteRequest::decode(body.as_slice())
                .unwrap()
                .timeseries
                .iter()
                .map(|s| s.samples.len() as u64)
                .sum::<u64>()
        })
        .sum()
}

/// Sends `bodies` one after another to a fresh VictoriaMetrics and waits until it counts `rows`
/// inserted; returns the seconds from the first request and the CPU seconds VictoriaMetrics used
/// meanwhile (all its threads). Stops it before returning.
fn send_all(binary: &Path, bodies: &[Vec<u8>], rows: u64) -> (f64, f64) {
    let vm = Victoria::start(binary);
    let writer = RemoteWriter::new(RemoteWriteConfig {
        url: vm.url(),
        timeout: Duration::from_secs(30),
        max_sample_age: Duration::from_secs(30 * 86_400),
        min_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(100),
        headers: Vec::new(),
    });
    let stop = AtomicBool::new(false);
    let mut stats = SendStats::default();
    let cpu_started = vm.cpu_seconds();
    let started = Instant::now();
    for body in bodies {
        writer.send(body, &stop, &mut stats).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut inserted = vm.rows_inserted();
    while inserted < rows {
        assert!(
            Instant::now() < deadline,
            "VictoriaMetrics counted {inserted} of {rows} rows after 60 s"
        );
        std::thread::sleep(Duration::from_millis(2));
        inserted = vm.rows_inserted();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = vm.cpu_seconds() - cpu_started;
    assert_eq!(
        inserted, rows,
        "VictoriaMetrics inserted exactly the samples sent"
    );
    assert_eq!(stats.retries, 0, "no request was retried");
    (elapsed, cpu)
}

fn main() {
    let binary = victoria_binary();
    println!("load average before: {}", loadavg());
    // Arrival now: VictoriaMetrics refuses samples stamped far from its clock.
    let arrival_ns = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap();
    let payloads = payloads(arrival_ns);

    // The remote-write requests the gateway queues for these batches (untimed): every sample it
    // stores, one request per machine and group.
    let dir = tempfile::tempdir().unwrap();
    let config = IngestConfig {
        remote_write_max_age: Some(Duration::from_secs(30 * 86_400)),
        ..IngestConfig::default()
    };
    let mut ingestor = Ingestor::new(
        Store::open_path(&dir.path().join("outbox.redb")).unwrap(),
        config,
    )
    .unwrap();
    let (stored, groups) = ingest_all(&mut ingestor, &payloads, arrival_ns);
    let outbox: std::collections::HashMap<u64, Vec<u8>> =
        ingestor.store().outbox().unwrap().into_iter().collect();
    drop(ingestor);
    let requests: Vec<Vec<u8>> = groups
        .iter()
        .flatten()
        .map(|id| outbox[id].clone())
        .collect();
    // Protobuf messages concatenated are one message with their repeated fields appended: one
    // WriteRequest per group.
    let merged: Vec<Vec<u8>> = groups
        .iter()
        .map(|ids| {
            ids.iter()
                .flat_map(|id| outbox[id].iter().copied())
                .collect()
        })
        .collect();
    assert_eq!(
        count(&requests),
        stored,
        "the remote-write requests carry every sample the gateway stored"
    );
    assert_eq!(count(&merged), stored, "and so do the merged ones");
    // Debian's build reports no version of its own: `dpkg-query -W victoria-metrics` does.
    println!("{}", binary.display());
    println!(
        "{} batches → {stored} samples; {} remote-write requests as queued, {} merged per group; \
         {RUNS} runs",
        payloads.len(),
        requests.len(),
        merged.len()
    );

    // Samples/s, CPU µs per sample and cores used (CPU time over wall time), per side: the
    // gateway decoding inline, the gateway decoding ahead, VictoriaMetrics as queued, merged.
    let sides = DECODINGS.len() + 2;
    let mut rate = vec![Vec::new(); sides];
    let mut cpu_per_sample = vec![Vec::new(); sides];
    let mut cores = vec![Vec::new(); sides];
    for _ in 0..RUNS {
        // The gateway: the whole ingest path (decode … durable commit), as the ingest bench.
        for (side, (_, decoding)) in DECODINGS.into_iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let mut ingestor = Ingestor::new(
                Store::open_path(&dir.path().join("bench.redb")).unwrap(),
                IngestConfig::default(),
            )
            .unwrap();
            ingestor.set_decoding(decoding);
            let cpu_started = ingest_payloads::cpu_seconds(libc::CLOCK_PROCESS_CPUTIME_ID);
            let started = Instant::now();
            let (samples, _) = ingest_all(&mut ingestor, &payloads, arrival_ns);
            let elapsed = started.elapsed().as_secs_f64();
            let cpu = ingest_payloads::cpu_seconds(libc::CLOCK_PROCESS_CPUTIME_ID) - cpu_started;
            assert_eq!(samples, stored);
            rate[side].push(samples as f64 / elapsed);
            cpu_per_sample[side].push(cpu * 1e6 / stored as f64);
            cores[side].push(cpu / elapsed);
        }

        // VictoriaMetrics, fresh each time.
        for (side, bodies) in [&requests, &merged].into_iter().enumerate() {
            let side = DECODINGS.len() + side;
            let (elapsed, cpu) = send_all(&binary, bodies, stored);
            rate[side].push(stored as f64 / elapsed);
            cpu_per_sample[side].push(cpu * 1e6 / stored as f64);
            cores[side].push(cpu / elapsed);
        }
    }
    let [rate, cpu_per_sample, cores] = [rate, cpu_per_sample, cores].map(|sides| -> Vec<f64> {
        sides
            .into_iter()
            .map(|mut runs| median(&mut runs))
            .collect()
    });
    // The gateway as packaged on a machine with two cores or more.
    let gateway = rate[DECODINGS.len() - 1];
    println!(
        "| side | samples/s (median of {RUNS}) | gateway (decoded ahead) / this | CPU µs per \
         sample | cores used | durable when acknowledged |"
    );
    println!("|---|---|---|---|---|---|");
    let mut names: Vec<String> = DECODINGS
        .iter()
        .map(|(name, _)| {
            format!(
                "gateway, full ingest {name} (decode … redb commit, fsync per group of {GROUP})"
            )
        })
        .collect();
    for name in [
        "as queued, one request per machine and group",
        "merged, one request per group",
    ] {
        names.push(format!(
            "VictoriaMetrics, remote-write {name} (in-memory buffers, flushed to disk about \
             every second)"
        ));
    }
    for (side, name) in names.iter().enumerate() {
        let durable = if side < DECODINGS.len() { "yes" } else { "no" };
        println!(
            "| {name} | {:.0} | {:.2}× | {:.3} | {:.2} | {durable} |",
            rate[side],
            gateway / rate[side],
            cpu_per_sample[side],
            cores[side]
        );
    }
    println!("load average after: {}", loadavg());
}

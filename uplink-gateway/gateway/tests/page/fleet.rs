//! The fleet the page tests look at: a store filled through the real ingest path with arrival
//! times the test chooses (so every instant and every state is known exactly), and the page
//! served from it by the real binary (`edgewatch-gateway page`).

// Shared by the page tests over HTTP and in the browser; each uses a part.
#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use std::sync::atomic::AtomicBool;

use edgewatch_gateway::config::{IngestConfig, RemoteWriteConfig};
use edgewatch_gateway::ingest::{Incoming, Ingestor};
use edgewatch_gateway::metrics::Metrics;
use edgewatch_gateway::remote_write::RemoteWriter;
use edgewatch_gateway::run::deliver_outbox;
use edgewatch_gateway::store::{DeadLetterSource, Store};
use edgewatch_proto::topic::status_topic;
use edgewatch_proto::v1::{
    AutonomySeconds, DeadlineCounters, DeadlineSemantics, Event, LoopRef, MachineStatus,
    ModeSeconds, ModelVersion, Tier, event,
};
use prost::Message as _;

use crate::util::{SITE, batch, free_addr, message};

pub const BIN: &str = env!("CARGO_BIN_EXE_edgewatch-gateway");
pub const MINUTE_MS: i64 = 60_000;
pub const HOUR_MS: i64 = 60 * MINUTE_MS;

pub const PRICES: &str = r#"
[prices]
currency = "USD"
[prices.machine_classes.haul-truck]
purchase_price = 4200.0
lifetime_hours = 30000.0
[prices.sites.pit-3]
energy_price_per_kwh = 0.19
"#;

/// Instants of the fleet's story, Unix ms (all whole seconds, in the past).
#[derive(Debug, Clone, Copy)]
pub struct Story {
    /// truck-18 goes offline (its last will arrives).
    pub offline: i64,
    /// truck-18 is online again.
    pub online_again: i64,
    /// The last event of the history.
    pub end: i64,
}

impl Story {
    /// While truck-18 is partitioned.
    pub fn during(&self) -> i64 {
        self.offline + 30 * MINUTE_MS
    }
    /// Before the partition.
    pub fn before(&self) -> i64 {
        self.offline - 30 * MINUTE_MS
    }
    /// After it.
    pub fn after(&self) -> i64 {
        self.online_again + 30 * MINUTE_MS
    }
}

fn model(version: &str) -> Option<ModelVersion> {
    Some(ModelVersion {
        name: "haul-perception".into(),
        version: version.into(),
        ..Default::default()
    })
}

/// An SLO batch of one machine: both loops' deadline counters and its autonomy seconds at
/// step `i` (cumulative since `start_ms`), stamped `time_ms`.
fn step(
    machine: &str,
    version: &str,
    seq: &mut u64,
    i: u64,
    start_ms: i64,
    time_ms: i64,
) -> Vec<Event> {
    let mut events = Vec::new();
    let mut push = |kind| {
        *seq += 1;
        events.push(Event {
            seq: *seq,
            event_time_unix_ns: time_ms * 1_000_000,
            monotonic_ns: *seq,
            kind: Some(kind),
        });
    };
    let miss_every = if machine == "truck-18" { 60 } else { 900 };
    for (loop_name, every) in [("safety", 40_000u64), ("assistive", miss_every)] {
        let cycles = 15_000 * (i + 1);
        let overruns = cycles / every + i / 3;
        push(event::Kind::DeadlineCounters(DeadlineCounters {
            control_loop: Some(LoopRef {
                loop_id: 1,
                loop_name: loop_name.into(),
            }),
            model: model(version),
            start_time_unix_ns: start_ms * 1_000_000,
            cycles,
            misses: overruns,
            skipped: 0,
            activations: Some(cycles),
            deadline_misses: Some(overruns),
            overruns: Some(overruns),
            deadline_ns: 40_000_000,
            semantics: DeadlineSemantics::Completion as i32,
            ..Default::default()
        }));
    }
    push(event::Kind::AutonomySeconds(AutonomySeconds {
        start_time_unix_ns: start_ms * 1_000_000,
        modes: vec![
            ModeSeconds {
                mode: 1,
                seconds: 500.0 * (i + 1) as f64,
            },
            ModeSeconds {
                mode: 2,
                seconds: 100.0 * (i + 1) as f64,
            },
        ],
        model: model(version),
    }));
    events
}

fn status(machine: &str, online: bool, time_ms: i64) -> (String, Vec<u8>) {
    (
        status_topic(SITE, machine),
        MachineStatus {
            schema_version: 1,
            machine_id: machine.into(),
            site_id: SITE.into(),
            online,
            time_unix_ns: time_ms * 1_000_000,
            agent_epoch: 1,
            agent_version: "0.1.0".into(),
            machine_class: "haul-truck".into(),
        }
        .encode_to_vec(),
    )
}

/// Fills the store at `path`: truck-17 and truck-18 (which runs 4.3.0 and misses more) report
/// every 10 minutes for 8 hours from `base`; truck-18 goes offline at `offline` and is online
/// again at `online_again`, sending nothing between; truck-19 reported once, at the start;
/// truck-17 sends events stamped an hour ahead of their arrival (refused) at 6 h 55 min.
/// Each message arrives 1 s after its events.
pub fn fill(path: &Path, now_ms: i64) -> Story {
    fill_and_write(path, now_ms, None)
}

/// [`fill`], and with `remote_write` (a Prometheus remote-write URL) every committed sample also
/// delivered there, as the running gateway does.
pub fn fill_and_write(path: &Path, now_ms: i64, remote_write: Option<&str>) -> Story {
    let base = (now_ms - 2 * 24 * HOUR_MS).div_euclid(HOUR_MS) * HOUR_MS;
    let story = Story {
        offline: base + 4 * HOUR_MS,
        online_again: base + 6 * HOUR_MS,
        end: base + 8 * HOUR_MS,
    };
    let config = IngestConfig {
        remote_write_max_age: remote_write.map(|_| Duration::from_secs(30 * 86_400)),
        ..IngestConfig::default()
    };
    let mut ingestor = Ingestor::new(Store::open_path(path).unwrap(), config).unwrap();
    let mut ingest = |messages: &[(String, Vec<u8>)], arrival_ms: i64| {
        let incoming: Vec<Incoming<'_>> = messages
            .iter()
            .map(|(topic, payload)| Incoming { topic, payload })
            .collect();
        ingestor.ingest(&incoming, arrival_ms * 1_000_000).unwrap();
    };
    ingest(&[status("truck-17", true, base)], base);
    ingest(&[status("truck-18", true, base)], base);
    let mut seqs = [0u64, 0u64];
    for i in 0..48u64 {
        let time = base + i as i64 * 10 * MINUTE_MS;
        if time == story.online_again {
            ingest(&[status("truck-18", true, time)], time + 500);
        }
        for (m, (machine, version)) in [("truck-17", "4.2.1"), ("truck-18", "4.3.0")]
            .into_iter()
            .enumerate()
        {
            if machine == "truck-18" && time > story.offline && time < story.online_again {
                continue;
            }
            let events = step(machine, version, &mut seqs[m], i, base, time);
            ingest(
                &[message(&batch(machine, 1, Tier::Slo, events))],
                time + 1000,
            );
        }
        if time == story.offline {
            ingest(&[status("truck-18", false, time)], time + 2000);
        }
    }
    // Events of truck-17 stamped an hour after their arrival: the gateway refuses them (future
    // time), and the report's rows of truck-17's group say how many samples they left out.
    let ahead = base + 7 * HOUR_MS + 55 * MINUTE_MS;
    let events = step("truck-17", "4.2.1", &mut seqs[0], 48, base, ahead);
    ingest(
        &[message(&batch("truck-17", 1, Tier::Slo, events))],
        ahead - HOUR_MS,
    );
    let mut seq = 0;
    let events = step("truck-19", "4.2.1", &mut seq, 0, base, base);
    ingest(
        &[message(&batch("truck-19", 1, Tier::Slo, events))],
        base + 1000,
    );
    if let Some(url) = remote_write {
        let writer = RemoteWriter::new(RemoteWriteConfig {
            url: url.to_owned(),
            timeout: Duration::from_secs(10),
            max_sample_age: Duration::from_secs(30 * 86_400),
            min_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            headers: Vec::new(),
        });
        let metrics = Metrics::default();
        assert!(ingestor.store().outbox_len().unwrap() > 0);
        deliver_outbox(ingestor.store(), &writer, &AtomicBool::new(false), &metrics).unwrap();
        assert_eq!(ingestor.store().outbox_len().unwrap(), 0);
        let refused: Vec<_> = ingestor
            .store()
            .dead_letters()
            .unwrap()
            .into_iter()
            .filter(|d| matches!(d.source, DeadLetterSource::RemoteWrite))
            .collect();
        assert!(
            refused.is_empty(),
            "{:?}",
            refused.iter().map(|d| &d.reason).collect::<Vec<_>>()
        );
    }
    story
}

/// `edgewatch-gateway page` serving a configuration, killed when dropped.
pub struct PageServer {
    child: Child,
    pub addr: SocketAddr,
    /// Its log (stderr), for a failure message.
    pub log: PathBuf,
}

impl PageServer {
    /// Serves the page of `config` on a free loopback port; `extra` are more arguments of `page`.
    pub fn start(config: &Path, extra: &[&str]) -> Self {
        for _ in 0..3 {
            let addr = free_addr();
            let log = config.with_extension(format!("page-{}.log", addr.port()));
            let child = Command::new(BIN)
                .arg("--config")
                .arg(config)
                .args(["page", "--listen", &addr.to_string()])
                .args(extra)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            let mut server = Self { child, addr, log };
            if edgewatch_harness::net::wait_for_listener(addr, Duration::from_secs(20)) {
                return server;
            }
            let log = std::fs::read_to_string(&server.log).unwrap_or_default();
            assert!(!log.contains("panicked"), "the page failed: {log}");
            let _ = server.child.kill();
            let _ = server.child.wait();
        }
        panic!("the page never listened; see {}", config.display());
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response as read off the wire.
#[derive(Debug)]
pub struct Reply {
    pub status: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// One request; the server closes after its answer.
pub fn request(addr: SocketAddr, method: &str, target: &str) -> Reply {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(stream, "{method} {target} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().to_owned();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n.to_owned(), v.to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// GET, expecting 200.
pub fn get(addr: SocketAddr, target: &str) -> String {
    let reply = request(addr, "GET", target);
    assert_eq!(reply.status, "HTTP/1.1 200 OK", "{target}: {}", reply.body);
    reply.body
}

/// The gateway configuration around a store.
pub fn config(dir: &Path, store: &Path) -> PathBuf {
    let path = dir.join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            "[mqtt]\nhost = \"127.0.0.1\"\nclient_id = \"gw-page\"\n[store]\npath = \"{}\"\n{PRICES}",
            store.display()
        ),
    )
    .unwrap();
    path
}

/// Another subcommand of the binary on `config`; its stdout.
pub fn command(config: &Path, args: &[&str]) -> String {
    let output = Command::new(BIN)
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Undoes the page's escaping.
pub fn unescape(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The value of attribute `name` in each element of `html` that has it, in document order.
pub fn attributes(html: &str, name: &str) -> Vec<String> {
    let needle = format!(" {name}=\"");
    html.match_indices(&needle)
        .map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            unescape(&rest[..rest.find('"').unwrap()])
        })
        .collect()
}

pub fn now_ms() -> i64 {
    crate::util::now_ns() / 1_000_000
}

/// `at=` of a query string for an instant.
pub fn at(ms: i64) -> String {
    format!(
        "at={}",
        edgewatch_slo::format_rfc3339(ms).replace(':', "%3A")
    )
}

/// The story's store, its configuration and its page being served.
pub struct Fixture {
    _dir: tempfile::TempDir,
    pub config: PathBuf,
    pub story: Story,
    pub page: PageServer,
}

pub fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.redb");
    let story = fill(&store, now_ms());
    let config = config(dir.path(), &store);
    let page = PageServer::start(&config, &[]);
    Fixture {
        _dir: dir,
        config,
        story,
        page,
    }
}

//! The fleet page at fleet scale: (1) the time to answer each view for a fleet of 2,000 machines
//! (read the store, compute, render), median of several requests; (2) the ingest path's rate
//! while the overview is requested every second through the page's HTTP server, against the
//! same ingest without it: paired runs, median ratio.
//!
//! Run: `cargo bench -p edgewatch-gateway --bench page` (release profile). Prints the medians and
//! the load average before and after, for docs/benchmarks.md.

#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use edgewatch_gateway::config::{Config, IngestConfig};
use edgewatch_gateway::http::Request;
use edgewatch_gateway::ingest::{Incoming, Ingestor};
use edgewatch_gateway::page::Page;
use edgewatch_gateway::source::Source;
use edgewatch_gateway::store::Store;
use edgewatch_proto::framing::encode_batch;
use edgewatch_proto::topic::{batch_topic, status_topic};
use edgewatch_proto::v1::{
    AgentHealth, AutonomySeconds, Batch, ComponentSeconds, DeadlineCounters, DeadlineSemantics,
    Event, LoopRef, MachineStatus, ModeSeconds, ModelVersion, ThrottleCounters, Tier, TierHealth,
    event,
};
use prost::Message as _;

const MACHINES: u64 = 2_000;
/// Ten-minute steps of history per machine before the measurements.
const STEPS: u64 = 6;
const RENDERS: usize = 7;
const PAIRS: usize = 7;
/// Messages ingested per run of the paired measurement.
const RUN_MESSAGES: u64 = 30_000;
const GROUP: usize = 64;
const MINUTE_MS: i64 = 60_000;

const CONFIG: &str = r#"
[mqtt]
host = "127.0.0.1"
client_id = "bench"
[store]
path = "/unused"
[prices]
currency = "USD"
[prices.machine_classes.haul-truck]
purchase_price = 4200.0
lifetime_hours = 30000.0
[prices.machine_classes.excavator]
purchase_price = 6500.0
lifetime_hours = 30000.0
[prices.sites.pit-1]
energy_price_per_kwh = 0.19
"#;

fn identity(m: u64) -> (String, &'static str, &'static str, &'static str) {
    let classes = ["haul-truck", "excavator", "grader"];
    let sites = ["pit-1", "pit-2", "pit-3", "pit-4"];
    let versions = ["4.2.1", "4.3.0", "4.4.0-rc1"];
    (
        format!("machine-{m:04}"),
        classes[(m % 3) as usize],
        sites[(m / 3 % 4) as usize],
        versions[(m / 12 % 3) as usize],
    )
}

/// One SLO batch of machine `m` at step `i` (cumulative counters since `start_ms`).
fn batch(m: u64, i: u64, start_ms: i64, time_ms: i64) -> (String, Vec<u8>) {
    let (machine, class, site, version) = identity(m);
    let model = Some(ModelVersion {
        name: "perception".into(),
        version: version.into(),
        ..Default::default()
    });
    let mut seq = i * 5;
    let mut events = Vec::new();
    let mut push = |kind| {
        seq += 1;
        events.push(Event {
            seq,
            event_time_unix_ns: time_ms * 1_000_000,
            monotonic_ns: seq,
            kind: Some(kind),
        });
    };
    for (name, every) in [("safety", 20_000u64), ("assistive", 700 + m % 300)] {
        let cycles = 15_000 * (i + 1);
        let misses = cycles / every;
        push(event::Kind::DeadlineCounters(DeadlineCounters {
            control_loop: Some(LoopRef {
                loop_id: 1,
                loop_name: name.into(),
            }),
            model: model.clone(),
            start_time_unix_ns: start_ms * 1_000_000,
            cycles,
            misses,
            activations: Some(cycles),
            deadline_misses: Some(misses),
            overruns: Some(misses),
            deadline_ns: 40_000_000,
            semantics: DeadlineSemantics::Completion as i32,
            ..Default::default()
        }));
    }
    push(event::Kind::AutonomySeconds(AutonomySeconds {
        start_time_unix_ns: start_ms * 1_000_000,
        modes: vec![ModeSeconds {
            mode: 1,
            seconds: 550.0 * (i + 1) as f64,
        }],
        model: model.clone(),
    }));
    push(event::Kind::ThrottleCounters(ThrottleCounters {
        start_time_unix_ns: start_ms * 1_000_000,
        components: vec![ComponentSeconds {
            component: 2,
            throttled_seconds: (m % 7) as f64 * i as f64,
        }],
        model,
    }));
    push(event::Kind::AgentHealth(AgentHealth {
        tiers: vec![TierHealth {
            tier: Tier::Debug as i32,
            records: m % 500,
            bytes: (m % 500) * 300,
            ..Default::default()
        }],
        ..Default::default()
    }));
    let batch = Batch {
        schema_version: 1,
        machine_id: machine.clone(),
        site_id: site.into(),
        agent_epoch: 1,
        tier: Tier::Slo as i32,
        first_seq: events[0].seq,
        last_seq: seq,
        sent_time_unix_ns: time_ms * 1_000_000,
        events,
        machine_class: class.into(),
        agent_version: "0.1.0".into(),
    };
    (
        batch_topic(site, &machine, Tier::Slo).unwrap(),
        encode_batch(&batch).unwrap(),
    )
}

fn status(m: u64, online: bool, time_ms: i64) -> (String, Vec<u8>) {
    let (machine, class, site, _) = identity(m);
    (
        status_topic(site, &machine),
        MachineStatus {
            schema_version: 1,
            machine_id: machine,
            site_id: site.into(),
            online,
            time_unix_ns: time_ms * 1_000_000,
            agent_epoch: 1,
            agent_version: "0.1.0".into(),
            machine_class: class.into(),
        }
        .encode_to_vec(),
    )
}

/// Ingests `messages` in groups; returns (samples stored, counter events refused).
fn ingest(ingestor: &mut Ingestor, messages: &[(String, Vec<u8>)], arrival_ms: i64) -> (u64, u64) {
    let (mut stored, mut refused) = (0, 0);
    for group in messages.chunks(GROUP) {
        let incoming: Vec<Incoming<'_>> = group
            .iter()
            .map(|(topic, payload)| Incoming { topic, payload })
            .collect();
        let stats = ingestor
            .ingest(&incoming, arrival_ms * 1_000_000)
            .unwrap()
            .stats;
        stored += stats.samples_new;
        refused += stats.events_refused.iter().sum::<u64>();
    }
    (stored, refused)
}

/// Bytes this process has caused to be written to the block device (`/proc/self/io`).
fn write_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("write_bytes: ")?.trim().parse().ok())
        .unwrap_or(0)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    println!("load average before: {}", loadavg());
    let config = Config::from_toml(CONFIG).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut ingestor = Ingestor::new(
        Store::open_path(&dir.path().join("store.redb")).unwrap(),
        IngestConfig::default(),
    )
    .unwrap();
    let now_ms = edgewatch_gateway::run::now_ms();
    // Room for the history and every measured run's ten-minute steps, all in the past: events
    // stamped after their arrival would be refused (`max_future_skew`), and the later runs would
    // measure refusals instead of ingest.
    let steps = STEPS + 2 * PAIRS as u64 * RUN_MESSAGES.div_ceil(MACHINES) + 1;
    let start_ms = (now_ms - steps as i64 * 10 * MINUTE_MS) / 1000 * 1000;
    let built = Instant::now();
    let statuses: Vec<_> = (0..MACHINES)
        .map(|m| status(m, m % 50 != 7, start_ms))
        .collect();
    ingest(&mut ingestor, &statuses, start_ms);
    for i in 0..STEPS {
        let time = start_ms + i as i64 * 10 * MINUTE_MS;
        let batches: Vec<_> = (0..MACHINES).map(|m| batch(m, i, start_ms, time)).collect();
        ingest(&mut ingestor, &batches, time + 1000);
    }
    println!(
        "store: {MACHINES} machines × {STEPS} batches built in {:.1} s",
        built.elapsed().as_secs_f64()
    );

    // (1) Render time per view.
    let new_page = || {
        Page::new(
            Source::Store(ingestor.shared_store()),
            config.catalog.clone(),
            config.prices.clone(),
            None,
        )
    };
    let page = Arc::new(new_page());
    let at_ms = start_ms + STEPS as i64 * 10 * MINUTE_MS;
    let at = edgewatch_slo::format_rfc3339(at_ms).replace(':', "%3A");
    println!("render time, median of {RENDERS} (read + compute + HTML), {MACHINES} machines:");
    for view in [
        "/",
        "/machines",
        "/machines?sort=backlog",
        "/machines/machine-0042",
        "/rollouts",
        "/cost",
    ] {
        let sep = if view.contains('?') { '&' } else { '?' };
        let head = format!("GET {view}{sep}at={at} HTTP/1.1\r\n\r\n");
        let request = Request::parse(head.as_bytes()).unwrap();
        // Cold: a page that never answered (the overview computes its sparklines' past points);
        // then refreshes of the same page.
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        for _ in 0..RENDERS {
            let fresh = new_page();
            let t = Instant::now();
            let response = fresh.handle(&request, at_ms);
            cold.push(t.elapsed().as_secs_f64());
            assert_eq!(response.status, "200 OK", "{view}");
            bytes = response.body.len();
            let t = Instant::now();
            let response = fresh.handle(&request, at_ms);
            warm.push(t.elapsed().as_secs_f64());
            assert_eq!(response.status, "200 OK", "{view}");
        }
        println!(
            "  {view:<24} first {:>8.1} ms  refresh {:>8.1} ms  ({bytes} bytes)",
            median(cold) * 1000.0,
            median(warm) * 1000.0
        );
    }

    // (2) Ingest rate with and without the overview requested every second.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(edgewatch_gateway::page::serve(
        listener,
        Arc::clone(&page),
        edgewatch_gateway::run::now_ms,
    ));
    let mut step = STEPS;
    let mut run = |ingestor: &mut Ingestor, refresh: bool| -> (f64, usize) {
        let store_bytes = std::fs::metadata(dir.path().join("store.redb")).map_or(0, |m| m.len());
        // Fresh batches (new sequence numbers), built before the clock starts.
        let mut messages = Vec::new();
        while (messages.len() as u64) < RUN_MESSAGES {
            let time = start_ms + step as i64 * 10 * MINUTE_MS;
            messages.extend((0..MACHINES).map(|m| batch(m, step, start_ms, time)));
            step += 1;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let refresher = refresh.then(|| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut served = 0;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let mut stream = TcpStream::connect(addr).unwrap();
                    write!(stream, "GET / HTTP/1.1\r\nHost: bench\r\n\r\n").unwrap();
                    let mut body = Vec::new();
                    stream.read_to_end(&mut body).unwrap();
                    if body.starts_with(b"HTTP/1.1 200 OK") {
                        served += 1;
                    } else {
                        println!("  an overview was not answered 200 within the deadline");
                    }
                    if let Some(rest) = Duration::from_secs(1).checked_sub(t.elapsed()) {
                        std::thread::sleep(rest);
                    }
                }
                served
            })
        });
        let written = write_bytes();
        let t = Instant::now();
        let arrival = edgewatch_gateway::run::now_ms();
        let (stored, refused) = ingest(ingestor, &messages, arrival);
        let rate = messages.len() as f64 / t.elapsed().as_secs_f64();
        // Every event of these batches is new and in the past: stored, none refused.
        assert_eq!(refused, 0, "events refused in a measured run");
        let written = write_bytes() - written;
        println!(
            "    run: {rate:>8.0} messages/s, {stored} samples stored, store {:.0} MiB before, \
             {:.0} MiB written ({:.0} bytes per sample)",
            store_bytes as f64 / 1048576.0,
            written as f64 / 1048576.0,
            written as f64 / stored.max(1) as f64
        );
        stop.store(true, Ordering::Relaxed);
        let served = refresher.map_or(0, |r| r.join().unwrap());
        (rate, served)
    };
    println!("ingest rate (messages/s, {RUN_MESSAGES} messages a run, groups of {GROUP}), paired:");
    let mut ratios = Vec::new();
    for pair in 0..PAIRS {
        // Alternate which goes first, so that the store's growth does not favour one side.
        let (without, with) = if pair % 2 == 0 {
            let a = run(&mut ingestor, false);
            (a, run(&mut ingestor, true))
        } else {
            let b = run(&mut ingestor, true);
            (run(&mut ingestor, false), b)
        };
        let ratio = with.0 / without.0;
        println!(
            "  pair {pair}: without {:>8.0}  with {:>8.0} ({} overviews served)  ratio {ratio:.3}",
            without.0, with.0, with.1
        );
        ratios.push(ratio);
    }
    println!(
        "median ratio with/without: {:.3} (a fall of {:.1} %)",
        median(ratios.clone()),
        (1.0 - median(ratios)) * 100.0
    );
    println!("load average after: {}", loadavg());
}

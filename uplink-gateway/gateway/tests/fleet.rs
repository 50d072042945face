//! `edgewatch-gateway fleet` through the real gateway binary at its packaged default
//! configuration (only the PROVISION lines filled in), a real Mosquitto and, for the second
//! source, a real Prometheus fed by remote-write: every column of the machines table equals
//! what the machines sent, from both sources alike; the silent for longest come first and
//! every sort key orders; a real agent killed (its last will) shows offline while it is, and
//! online again when it is back, with its health report's backlog; label values a crafted
//! store or Prometheus holds come back verbatim as data.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use edgewatch_gateway::config::RemoteWriteConfig;
use edgewatch_gateway::remote_write::{RemoteWriter, SendStats, build_request};
use edgewatch_gateway::series::{Sample, SeriesKey};
use edgewatch_gateway::store::Store;
use edgewatch_harness::agent::AgentProcess;
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::process::Launch;
use edgewatch_harness::prometheus::Prometheus;
use edgewatch_proto::topic::status_topic;
use edgewatch_proto::v1::{
    AgentHealth, AutonomySeconds, ComponentSeconds, Event, MachineStatus, ModeSeconds,
    ModelVersion, QueueLoss, ThrottleCounters, Tier, TierHealth, event,
};
use edgewatch_slo::names::{label, metric};
use prost::Message as _;
use serde_json::{Value, json};
use util::*;

const BIN: &str = env!("CARGO_BIN_EXE_edgewatch-gateway");
const MINUTE_NS: i64 = 60_000_000_000;
const MODEL: &str = "haul-perception";

fn now_ms() -> i64 {
    now_ns() / 1_000_000
}

/// `fleet --json --at <at_ms>` and `extra`, from the store or from `prometheus`.
fn fleet_json(gateway: &Gateway, at_ms: i64, prometheus: Option<&str>, extra: &[&str]) -> String {
    let at = edgewatch_slo::format_rfc3339(at_ms);
    let mut args = vec!["fleet", "--json", "--at", &at];
    if let Some(url) = prometheus {
        args.extend(["--prometheus", url]);
    }
    args.extend(extra);
    gateway.command(&args)
}

fn fleet(gateway: &Gateway, at_ms: i64, prometheus: Option<&str>, extra: &[&str]) -> Value {
    serde_json::from_str(&fleet_json(gateway, at_ms, prometheus, extra)).unwrap()
}

fn ids(table: &Value) -> Vec<String> {
    table["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["machine_id"].as_str().unwrap().to_owned())
        .collect()
}

fn row<'a>(table: &'a Value, id: &str) -> &'a Value {
    table["machines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["machine_id"] == id)
        .unwrap_or_else(|| panic!("no row for {id}: {table:#}"))
}

fn model(version: &str) -> Option<ModelVersion> {
    Some(ModelVersion {
        name: MODEL.into(),
        version: version.into(),
        ..Default::default()
    })
}

fn events(first_seq: u64, kinds: Vec<(i64, event::Kind)>) -> Vec<Event> {
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, (time, kind))| Event {
            seq: first_seq + i as u64,
            event_time_unix_ns: time,
            monotonic_ns: 1,
            kind: Some(kind),
        })
        .collect()
}

/// Throttled seconds (cpu, gpu, soc) of a run started at `start`.
fn throttle(version: &str, start: i64, cpu: f64, gpu: f64) -> event::Kind {
    event::Kind::ThrottleCounters(ThrottleCounters {
        start_time_unix_ns: start,
        components: [(1, cpu), (2, gpu), (3, 0.0)]
            .into_iter()
            .map(|(component, throttled_seconds)| ComponentSeconds {
                component,
                throttled_seconds,
            })
            .collect(),
        model: model(version),
    })
}

/// Seconds (autonomous, manual) of a run started at `start`.
fn autonomy(version: &str, start: i64, autonomous: f64, manual: f64) -> event::Kind {
    event::Kind::AutonomySeconds(AutonomySeconds {
        start_time_unix_ns: start,
        modes: vec![
            ModeSeconds {
                mode: 1,
                seconds: autonomous,
            },
            ModeSeconds {
                mode: 2,
                seconds: manual,
            },
        ],
        model: model(version),
    })
}

fn status(machine: &str, online: bool) -> (String, Vec<u8>) {
    (
        status_topic(SITE, machine),
        MachineStatus {
            schema_version: 1,
            machine_id: machine.into(),
            site_id: SITE.into(),
            online,
            time_unix_ns: now_ns(),
            agent_epoch: 1,
            agent_version: "0.1.0".into(),
            machine_class: "haul-truck".into(),
        }
        .encode_to_vec(),
    )
}

/// Publishes `messages` and waits until the gateway acknowledged `total` messages in all;
/// returns the wall clock (ms) just before publishing and just after the acknowledgement: the
/// arrivals lie between.
async fn deliver(
    gateway: &Gateway,
    broker: std::net::SocketAddr,
    client: &str,
    messages: &[(String, Vec<u8>)],
    total: f64,
) -> (i64, i64) {
    let before = now_ms();
    publish_all(broker, client, messages).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == total);
    let after = now_ms();
    // The next machine's arrivals come at least a millisecond later.
    tokio::time::sleep(Duration::from_millis(20)).await;
    (before, after)
}

fn ms(ns: i64) -> i64 {
    ns.div_euclid(1_000_000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_column_of_the_machines_table_is_what_the_machines_sent_from_both_sources() {
    let broker = Mosquitto::start().unwrap();
    let prometheus = Prometheus::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = prometheus.remote_write_url();
    let gateway = Gateway::start_packaged(dir.path(), broker.addr(), "gw-fleet", Some(&url));
    let t0 = now_ns() - 3 * HOUR_NS;
    let t = |minutes: i64| t0 + minutes * MINUTE_NS + 123_000_000;

    // truck-c sends first (and then nothing): 600 s autonomous, no status ever.
    let c = batch(
        "truck-c",
        1,
        Tier::Slo,
        events(1, vec![(t(1), autonomy("4.2.1", t(0), 600.0, 0.0))]),
    );
    let c_arrival = deliver(&gateway, broker.addr(), "c", &[message(&c)], 1.0).await;

    // truck-b: online, throttle counters, then its last will.
    let b = batch(
        "truck-b",
        1,
        Tier::Slo,
        events(1, vec![(t(2), throttle("4.2.1", t(0), 7.0, 0.0))]),
    );
    let b_messages = [
        status("truck-b", true),
        message(&b),
        status("truck-b", false),
    ];
    let b_arrival = deliver(&gateway, broker.addr(), "b", &b_messages, 4.0).await;

    // truck-a: online; model 4.2.1 then 4.3.0 (each a run of throttle and autonomy counters),
    // two loss reports, and a health report.
    let a_slo = batch(
        "truck-a",
        1,
        Tier::Slo,
        events(
            1,
            vec![
                (t(5), throttle("4.2.1", t(0), 1.0, 10.5)),
                (t(5), autonomy("4.2.1", t(0), 300.0, 60.0)),
                (t(10), throttle("4.2.1", t(0), 2.0, 20.25)),
                (t(10), autonomy("4.2.1", t(0), 600.0, 120.0)),
                (
                    t(12),
                    event::Kind::QueueLoss(QueueLoss {
                        tier: Tier::Debug as i32,
                        cause: 1,
                        count: 40,
                        total: 40,
                        ..Default::default()
                    }),
                ),
                (
                    t(13),
                    event::Kind::QueueLoss(QueueLoss {
                        tier: Tier::Slo as i32,
                        cause: 2,
                        count: 2,
                        total: 2,
                        ..Default::default()
                    }),
                ),
                (t(15), throttle("4.3.0", t(11), 0.5, 4.0)),
                (t(15), autonomy("4.3.0", t(11), 240.0, 30.0)),
                (t(20), throttle("4.3.0", t(11), 3.0, 9.5)),
                (t(20), autonomy("4.3.0", t(11), 540.0, 60.0)),
                (
                    t(21),
                    event::Kind::AgentHealth(AgentHealth {
                        tiers: [
                            (Tier::Safety, 0, 0),
                            (Tier::Slo, 12, 4_096),
                            (Tier::Debug, 900, 2_500_000),
                        ]
                        .into_iter()
                        .map(|(tier, records, bytes)| TierHealth {
                            tier: tier as i32,
                            records,
                            bytes,
                            ..Default::default()
                        })
                        .collect(),
                        ..Default::default()
                    }),
                ),
            ],
        ),
    );
    let a_messages = [status("truck-a", true), message(&a_slo)];
    let a_arrival = deliver(&gateway, broker.addr(), "a", &a_messages, 6.0).await;
    assert_eq!(
        gateway.metric("edgewatch_gateway_events_refused_total{reason=\"series_budget\"}"),
        Some(0.0)
    );

    let at = now_ms();
    let from_store = fleet_json(&gateway, at, None, &[]);
    let from_prometheus = fleet_json(&gateway, at, Some(&prometheus.base_url()), &[]);
    assert_eq!(from_store, from_prometheus, "the two sources disagree");
    let table: Value = serde_json::from_str(&from_store).unwrap();
    assert_eq!(table["evaluated_at_ms"], at);
    assert_eq!(
        (table["window"].as_str(), table["lookback"].as_str()),
        (Some("1d"), Some("30d"))
    );
    // Silent for longest first.
    assert_eq!(ids(&table), ["truck-c", "truck-b", "truck-a"]);

    let arrived = |row: &Value, (before, after): (i64, i64)| {
        let arrival = row["last_arrival_ms"].as_i64().unwrap();
        assert!(
            (before..=after).contains(&arrival),
            "{}: arrival {arrival} outside [{before}, {after}]",
            row["machine_id"]
        );
        assert_eq!(row["silent_for_ms"].as_i64().unwrap(), at - arrival);
        assert_eq!(
            row["last_arrival"],
            edgewatch_slo::format_rfc3339(arrival),
            "{row:#}"
        );
    };

    let a = row(&table, "truck-a");
    assert_eq!(a["machine_class"], "haul-truck");
    assert_eq!(a["site"], SITE);
    assert_eq!(a["online"], true);
    assert_eq!(a["last_event_ms"], ms(t(21)));
    assert_eq!(a["last_event"], edgewatch_slo::format_rfc3339(ms(t(21))));
    arrived(a, a_arrival);
    assert_eq!(
        a["models"],
        json!([{
            "model": MODEL,
            "model_version": "4.3.0",
            "first_event_ms": ms(t(15)),
            "last_event_ms": ms(t(20)),
        }])
    );
    assert_eq!(
        a["backlog"],
        json!({
            "as_of_ms": ms(t(21)),
            "as_of": edgewatch_slo::format_rfc3339(ms(t(21))),
            "tiers": {
                "safety": {"records": 0, "bytes": 0},
                "slo": {"records": 12, "bytes": 4096},
                "debug": {"records": 900, "bytes": 2_500_000},
            },
        })
    );
    assert_eq!(
        a["losses"],
        json!({
            "as_of_ms": ms(t(13)),
            "as_of": edgewatch_slo::format_rfc3339(ms(t(13))),
            "tiers": {"debug": 40, "slo": 2},
        })
    );
    // Each run counts from its start: 4.2.1's last values plus 4.3.0's.
    assert_eq!(
        a["throttled_seconds"],
        json!({"cpu": 2.0 + 3.0, "gpu": 20.25 + 9.5, "soc": 0.0})
    );
    assert_eq!(a["autonomous_hours"], (600.0 + 540.0) / 3600.0);

    let b = row(&table, "truck-b");
    assert_eq!(b["online"], false, "its last will");
    assert_eq!(b["last_event_ms"], ms(t(2)));
    arrived(b, b_arrival);
    assert_eq!(b["models"][0]["model_version"], "4.2.1");
    assert_eq!(
        b["throttled_seconds"],
        json!({"cpu": 7.0, "gpu": 0.0, "soc": 0.0})
    );
    for never in ["backlog", "losses", "autonomous_hours"] {
        assert!(b[never].is_null(), "{never}: {b:#}");
    }

    let c = row(&table, "truck-c");
    assert!(c["online"].is_null(), "no status ever: {c:#}");
    assert_eq!(c["last_event_ms"], ms(t(1)));
    arrived(c, c_arrival);
    assert_eq!(c["autonomous_hours"], 600.0 / 3600.0);
    assert!(c["throttled_seconds"].is_null());

    // Every sort key, from both sources.
    for (key, order) in [
        ("silent", ["truck-c", "truck-b", "truck-a"]),
        ("machine", ["truck-a", "truck-b", "truck-c"]),
        ("online", ["truck-b", "truck-c", "truck-a"]),
        ("last-event", ["truck-c", "truck-b", "truck-a"]),
        ("backlog", ["truck-a", "truck-b", "truck-c"]),
        ("losses", ["truck-a", "truck-b", "truck-c"]),
        ("throttled", ["truck-a", "truck-b", "truck-c"]),
        ("autonomy", ["truck-a", "truck-c", "truck-b"]),
    ] {
        for source in [None, Some(prometheus.base_url())] {
            let sorted = fleet(&gateway, at, source.as_deref(), &["--sort", key]);
            assert_eq!(ids(&sorted), order, "--sort {key} from {source:?}");
        }
    }

    // truck-a's detail over the day, from both sources: every version with its first and last
    // event, its health report, and its counters in hourly buckets that add up to what it sent.
    let detail_json =
        |source: Option<&str>| fleet_json(&gateway, at, source, &["--machine", "truck-a"]);
    let detail = detail_json(None);
    assert_eq!(detail, detail_json(Some(&prometheus.base_url())));
    let detail: Value = serde_json::from_str(&detail).unwrap();
    assert_eq!(detail["machine_class"], "haul-truck");
    assert_eq!(detail["last_event_ms"], ms(t(21)));
    assert_eq!(
        detail["model_versions"],
        json!([
            {"model": MODEL, "model_version": "4.2.1", "first_event_ms": ms(t(5)), "last_event_ms": ms(t(10))},
            {"model": MODEL, "model_version": "4.3.0", "first_event_ms": ms(t(15)), "last_event_ms": ms(t(20))},
        ])
    );
    assert_eq!(
        detail["backlog"],
        json!([{
            "at_ms": ms(t(21)),
            "tiers": {
                "safety": {"records": 0, "bytes": 0},
                "slo": {"records": 12, "bytes": 4096},
                "debug": {"records": 900, "bytes": 2_500_000},
            },
        }])
    );
    assert_eq!(detail["online"], true);
    assert_eq!(detail["partitions"], json!([]));
    let buckets = detail["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 24);
    let total = |field: &str, key: &str| -> f64 {
        buckets.iter().filter_map(|b| b[field][key].as_f64()).sum()
    };
    assert_eq!(total("throttled_seconds", "gpu"), 20.25 + 9.5);
    assert_eq!(total("throttled_seconds", "cpu"), 2.0 + 3.0);
    assert_eq!(total("mode_seconds", "autonomous"), 600.0 + 540.0);
    assert_eq!(total("mode_seconds", "manual"), 120.0 + 60.0);

    // The text table: the same rows, in the same order, every column.
    let text = gateway.command(&["fleet", "--at", &edgewatch_slo::format_rfc3339(at)]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].starts_with("MACHINE"), "{text}");
    let order: Vec<&str> = lines[2..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(order, ["truck-c", "truck-b", "truck-a"]);
    for cell in [
        "haul-perception 4.3.0",
        "online",
        "0/12/900",
        "2.5 MB",
        "-/2/40",
        "5/29.8/0",
        "0.32",
    ] {
        assert!(lines[4].contains(cell), "{cell:?} not in {:?}", lines[4]);
    }
}

/// A real agent at its packaged defaults (only its identity, broker, files and scheduling for
/// a shared test machine set), connected straight to the broker.
fn agent_config(dir: &Path, broker: std::net::SocketAddr) -> String {
    format!(
        r#"[machine]
id = "truck-live"
site = "{SITE}"
class = "haul-truck"

[queue]
dir = "{dir}/queue"

[uplink]
host = "127.0.0.1"
port = {port}

[scheduling]
cores = [0]
idle_priority = false

[ingest]
socket = "{dir}/agent.sock"

[status]
file = "{dir}/agent-status.json"

[thermal]
tegrastats_enabled = false
sysfs_root = "{dir}/no-sysfs"
"#,
        dir = dir.display(),
        port = broker.port()
    )
}

/// Polls `fleet --json` until `check` holds for truck-live's row (or its absence), up to
/// `timeout`; returns the last table.
fn wait_fleet(
    gateway: &Gateway,
    timeout: Duration,
    check: impl Fn(Option<&Value>) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let table = fleet(gateway, now_ms(), None, &[]);
        let live = table["machines"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["machine_id"] == "truck-live");
        if check(live) {
            return table;
        }
        assert!(
            Instant::now() < deadline,
            "the fleet never showed what was expected; last:\n{table:#}\ngateway log:\n{}",
            gateway.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_shows_offline_while_it_is_and_online_with_its_backlog_when_back() {
    let broker = Mosquitto::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gateway = Gateway::start_packaged(dir.path(), broker.addr(), "gw-live", None);
    let agent_dir = tempfile::tempdir().unwrap();
    let binary =
        edgewatch_harness::binaries::workspace_binary("edgewatch-agent", "edgewatch-agent")
            .unwrap();
    let mut agent = AgentProcess::start(
        &binary,
        agent_dir.path(),
        &agent_config(agent_dir.path(), broker.addr()),
        Launch::new("info"),
    )
    .unwrap();
    agent.wait_for_socket(Duration::from_secs(30)).unwrap();

    // Connected (its retained status) and reporting: its start-up health report, in the SLO
    // tier, gives its backlog. The first connection waits up to `initial_delay_max` (10 s).
    let table = wait_fleet(&gateway, Duration::from_secs(60), |live| {
        live.is_some_and(|r| r["online"] == true && !r["backlog"].is_null())
    });
    let live = row(&table, "truck-live");
    let backlog = &live["backlog"];
    assert_eq!(
        backlog["tiers"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["debug", "safety", "slo"],
        "{live:#}"
    );
    let as_of = backlog["as_of_ms"].as_i64().unwrap();
    assert!(as_of <= live["last_event_ms"].as_i64().unwrap(), "{live:#}");
    assert_eq!(live["machine_class"], "haul-truck");

    // SIGKILL: no DISCONNECT reaches the broker, which publishes the agent's last will.
    let killed_at = now_ms();
    agent.kill();
    let table = wait_fleet(&gateway, Duration::from_secs(30), |live| {
        live.is_some_and(|r| r["online"] == false)
    });
    let offline = row(&table, "truck-live");
    // While it is offline, what it reported last stays, as of its time.
    assert_eq!(offline["backlog"]["as_of_ms"], as_of);
    assert!(offline["last_arrival_ms"].as_i64().unwrap() <= killed_at);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        row(&fleet(&gateway, now_ms(), None, &[]), "truck-live")["online"],
        false,
        "offline while it is"
    );

    // Back: online again, and the partition is in its detail.
    agent.respawn().unwrap();
    agent.wait_for_socket(Duration::from_secs(30)).unwrap();
    wait_fleet(&gateway, Duration::from_secs(60), |live| {
        live.is_some_and(|r| r["online"] == true)
    });
    let detail = fleet(&gateway, now_ms(), None, &["--machine", "truck-live"]);
    assert_eq!(detail["online"], true);
    let partitions = detail["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 1, "{detail:#}");
    let (went, back) = (
        partitions[0]["offline_ms"].as_i64().unwrap(),
        partitions[0]["online_again_ms"].as_i64().unwrap(),
    );
    assert!(killed_at <= went && went < back, "{detail:#}");
    assert!(
        !detail["backlog"].as_array().unwrap().is_empty(),
        "{detail:#}"
    );
    agent.kill();
}

/// A series key from (label, value) pairs.
fn key(metric: &str, labels: &[(&str, &str)]) -> String {
    SeriesKey::build(metric, &mut labels.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_label_values_in_a_store_or_a_prometheus_come_back_verbatim_as_data() {
    // Ingest refuses such ids: these series are crafted, in a store and in a Prometheus.
    let machine = "<script>alert(\"fleet\")</script>";
    let site = "<img src=x onerror=alert(1)>";
    let class = "a&b'c\\d";
    let version = "</td><td onclick=\"x\">";
    let at = now_ms();
    let base = [
        (label::MACHINE_ID, machine),
        (label::SITE, site),
        (label::MACHINE_CLASS, class),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut labels = base.to_vec();
        labels.extend_from_slice(extra);
        labels
    };
    let arrival = at - 60_000;
    let samples = vec![
        Sample {
            series: key(metric::MACHINE_LAST_ARRIVAL, &base),
            ts_ms: arrival,
            value: arrival as f64 / 1000.0,
        },
        Sample {
            series: key(metric::MACHINE_ONLINE, &base),
            ts_ms: arrival,
            value: 1.0,
        },
        Sample {
            series: key(
                metric::MODEL_VERSION_LAST_EVENT,
                &with(&[
                    (label::MODEL, "<b>det</b>"),
                    (label::MODEL_VERSION, version),
                ]),
            ),
            ts_ms: arrival,
            value: (arrival - 5_000) as f64 / 1000.0,
        },
        Sample {
            series: key(
                metric::QUEUE_BACKLOG_RECORDS,
                &with(&[(label::TIER, "<i>slo</i>")]),
            ),
            ts_ms: arrival - 5_000,
            value: 3.0,
        },
    ];

    // The store.
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("store.redb");
    {
        let store = Store::open_path(&store_path).unwrap();
        store
            .write(|w| {
                for s in &samples {
                    let id = w.series_id_or_create(&s.series)?;
                    w.put_sample(id, s.ts_ms, s.value)?;
                }
                Ok(())
            })
            .unwrap();
    }
    // The Prometheus, by remote-write.
    let prometheus = Prometheus::start().unwrap();
    let writer = RemoteWriter::new(RemoteWriteConfig {
        url: prometheus.remote_write_url(),
        timeout: Duration::from_secs(10),
        max_sample_age: Duration::from_secs(86_400),
        min_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(500),
        headers: Vec::new(),
    });
    let refs: Vec<&Sample> = samples.iter().collect();
    writer
        .send(
            &build_request(&refs).encode_to_vec(),
            &AtomicBool::new(false),
            &mut SendStats::default(),
        )
        .unwrap();

    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[mqtt]\nhost = \"127.0.0.1\"\nclient_id = \"gw\"\n[store]\npath = \"{}\"\n",
            store_path.display()
        ),
    )
    .unwrap();
    let at_text = edgewatch_slo::format_rfc3339(at);
    let run = |extra: &[&str]| {
        let output = Command::new(BIN)
            .arg("--config")
            .arg(&config)
            .args(["fleet", "--at", &at_text])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    };
    let url = prometheus.base_url();
    let from_store = run(&["--json"]);
    assert_eq!(from_store, run(&["--json", "--prometheus", &url]));
    let table: Value = serde_json::from_str(&from_store).unwrap();
    let row = &table["machines"][0];
    assert_eq!(row["machine_id"], machine);
    assert_eq!(row["site"], site);
    assert_eq!(row["machine_class"], class);
    assert_eq!(row["online"], true);
    assert_eq!(row["models"][0]["model"], "<b>det</b>");
    assert_eq!(row["models"][0]["model_version"], version);
    assert_eq!(row["backlog"]["tiers"]["<i>slo</i>"]["records"], 3);
    // The JSON text holds them as JSON strings: every character kept, quotes escaped.
    assert!(
        from_store.contains(r#""<script>alert(\"fleet\")</script>""#),
        "{from_store}"
    );
    // The text table prints them as they are.
    assert!(run(&[]).contains(machine));
}

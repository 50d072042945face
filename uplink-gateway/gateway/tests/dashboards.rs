//! The Grafana dashboards of `edgewatch-gateway dashboards`, run against what they are made for:
//! a real Prometheus (2.42) holding a fleet's series written by remote-write through the real
//! gateway, with the gateway's `rules` output loaded and evaluated; at the packaged
//! configuration, and with one more SLO and a price book. Every target of every panel,
//! with the `machine` variable filled in with each machine it offers, returns series; the figures
//! with a ground truth (machines reporting, silent, alerts firing, burn rates, budget left, cost
//! per autonomous machine-hour) equal it; and the files have the shape Grafana provisions.
//!
//! The fleet, two days and a half of history at 10 min and a live last 20 minutes at 15 s:
//! - `truck-a` (haul-truck, pit-3): the safety loop misses 1 activation in 375, a burn of 26.7×
//!   at 99.99 %; rolled from model 4.2.1 to 4.3.0 at 18:00 the day before yesterday.
//! - `truck-b` (haul-truck, pit-4): the assistive loop misses 1 in 375, a burn of 2.67× at
//!   99.9 % and of 26.7× on the extra 99.99 % SLO of this test's catalog.
//! - `dozer-c` (dozer, pit-9, model 3.9.0): no misses; silent for the last 3 hours.
//!
//! Every machine also throttles, drives in three modes, draws energy, falls back, is intervened
//! on, stops safely, loses queue records and sends one impossible event the gateway refuses.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::prometheus::Prometheus;
use edgewatch_proto::v1::{
    AutonomySeconds, ComponentSeconds, DeadlineCounters, DeadlineSemantics, EnergyCounters, Event,
    Intervention, LoopRef, ModeSeconds, ModelVersion, QueueLoss, RailEnergy, SafeStop,
    SafetyFallback, ThrottleCounters, Tier, event,
};
use edgewatch_slo::catalog::{LoopsSli, RawCatalog, RawSli, RawSlo};
use edgewatch_slo::cost::{HardwarePrice, RawPriceBook, RawShare, ShareService, SitePrice};
use edgewatch_slo::dashboards::{GRID_COLUMNS, MACHINE_VARIABLE};
use serde_json::Value;
use util::*;

const MINUTE_NS: i64 = 60_000_000_000;
const HISTORY_STEP_NS: i64 = 10 * MINUTE_NS;
const LIVE_STEP_NS: i64 = 15_000_000_000;
const MODEL: &str = "haul-perception";

/// One model version a machine ran, from `start_ns` (its counters' start).
struct Run {
    version: &'static str,
    start_ns: i64,
}

struct Machine {
    id: &'static str,
    site: &'static str,
    class: &'static str,
    runs: Vec<Run>,
    /// Sample times, in order.
    times: Vec<i64>,
    /// Deadline misses per 15 s of the safety and the assistive loop (25 activations a second).
    safety_misses: bool,
    assistive_misses: bool,
}

impl Machine {
    fn run_at(&self, t: i64) -> &Run {
        self.runs.iter().rev().find(|r| r.start_ns < t).unwrap()
    }
}

fn model(version: &str) -> Option<ModelVersion> {
    Some(ModelVersion {
        name: MODEL.into(),
        version: version.into(),
        ..Default::default()
    })
}

/// Sample times from `from` to `live_from` every 10 min, then every 15 s through `to`.
fn times(from: i64, live_from: i64, to: i64) -> Vec<i64> {
    let mut out: Vec<i64> = (from..live_from.min(to + 1))
        .step_by(HISTORY_STEP_NS as usize)
        .collect();
    out.extend((live_from..=to).step_by(LIVE_STEP_NS as usize));
    out
}

/// The machine's SLO-tier and safety-tier batches.
fn batches(m: &Machine) -> Vec<edgewatch_proto::v1::Batch> {
    let mut slo = Vec::new();
    let mut safety = Vec::new();
    let mut increments = 0u64;
    let mut losses = 0u64;
    for (i, &t) in m.times.iter().enumerate() {
        let run = m.run_at(t);
        let s = (t - run.start_ns) / 1_000_000_000;
        let seconds = s as f64;
        let activations = 25 * s as u64;
        for (name, misses) in [
            ("safety", m.safety_misses),
            ("assistive", m.assistive_misses),
        ] {
            let missed = if misses { s as u64 / 15 } else { 0 };
            slo.push((
                t,
                event::Kind::DeadlineCounters(DeadlineCounters {
                    control_loop: Some(LoopRef {
                        loop_id: 1,
                        loop_name: name.into(),
                    }),
                    model: model(run.version),
                    start_time_unix_ns: run.start_ns,
                    cycles: activations,
                    misses: missed,
                    skipped: 0,
                    activations: Some(activations),
                    deadline_misses: Some(missed),
                    overruns: Some(missed),
                    deadline_ns: 40_000_000,
                    semantics: DeadlineSemantics::Completion as i32,
                    ..Default::default()
                }),
            ));
        }
        slo.push((
            t,
            event::Kind::ThrottleCounters(ThrottleCounters {
                start_time_unix_ns: run.start_ns,
                components: vec![
                    ComponentSeconds {
                        component: 2,
                        throttled_seconds: 0.005 * seconds,
                    },
                    ComponentSeconds {
                        component: 1,
                        throttled_seconds: 0.02 * seconds,
                    },
                ],
                model: model(run.version),
            }),
        ));
        slo.push((
            t,
            event::Kind::AutonomySeconds(AutonomySeconds {
                start_time_unix_ns: run.start_ns,
                modes: [(1, 0.5), (2, 0.25), (4, 0.25)]
                    .into_iter()
                    .map(|(mode, share)| ModeSeconds {
                        mode,
                        seconds: share * seconds,
                    })
                    .collect(),
                model: model(run.version),
            }),
        ));
        slo.push((
            t,
            event::Kind::EnergyCounters(EnergyCounters {
                start_time_unix_ns: run.start_ns,
                rails: vec![RailEnergy {
                    rail: "VDD_GPU_SOC".into(),
                    joules: 30.0 * seconds,
                }],
                model: model(run.version),
            }),
        ));
        // Hourly: a fallback, an intervention and a safe stop; every 6 hours, 5 records lost.
        if t % (60 * MINUTE_NS) == 0 {
            increments += 1;
            let loop_ref = Some(LoopRef {
                loop_id: 1,
                loop_name: "safety".into(),
            });
            safety.push((
                t,
                event::Kind::SafetyFallback(SafetyFallback {
                    control_loop: loop_ref,
                    model: model(run.version),
                    total: increments,
                    delta: 1,
                    reason: "obstacle".into(),
                    mode: 1,
                }),
            ));
            safety.push((
                t,
                event::Kind::Intervention(Intervention {
                    total: increments,
                    delta: 1,
                    reason: "operator".into(),
                    mode: 1,
                    model: model(run.version),
                    source: 1,
                }),
            ));
            safety.push((
                t,
                event::Kind::SafeStop(SafeStop {
                    total: increments,
                    delta: 1,
                    reason: "obstacle".into(),
                    mode: 1,
                    model: model(run.version),
                    source: 1,
                }),
            ));
            if increments.is_multiple_of(6) {
                losses += 5;
                slo.push((
                    t,
                    event::Kind::QueueLoss(QueueLoss {
                        tier: Tier::Debug as i32,
                        cause: 1,
                        count: 5,
                        total: losses,
                        ..Default::default()
                    }),
                ));
            }
        }
        // Once: misses above activations, which the gateway refuses (`bad_over_total`).
        if i == m.times.len() / 2 {
            slo.push((
                t,
                event::Kind::DeadlineCounters(DeadlineCounters {
                    control_loop: Some(LoopRef {
                        loop_id: 2,
                        loop_name: "planner".into(),
                    }),
                    model: model(run.version),
                    start_time_unix_ns: run.start_ns,
                    cycles: 10,
                    activations: Some(10),
                    deadline_misses: Some(20),
                    overruns: Some(0),
                    semantics: DeadlineSemantics::Completion as i32,
                    ..Default::default()
                }),
            ));
        }
    }
    let mut out = Vec::new();
    for (tier, kinds) in [(Tier::Slo, slo), (Tier::Safety, safety)] {
        let mut seq = 0u64;
        let events: Vec<Event> = kinds
            .into_iter()
            .map(|(t, kind)| {
                seq += 1;
                Event {
                    seq,
                    event_time_unix_ns: t,
                    monotonic_ns: seq,
                    kind: Some(kind),
                }
            })
            .collect();
        for chunk in events.chunks(400) {
            let mut b = batch(m.id, 7, tier, chunk.to_vec());
            b.site_id = m.site.into();
            b.machine_class = m.class.into();
            out.push(b);
        }
    }
    out
}

/// This test's configuration tables: the built-in catalog plus a strict SLO on the assistive
/// loop, and a price book with a share for each service.
fn tables(day_ms: i64) -> String {
    let mut catalog = RawCatalog::default();
    catalog.slos.push(RawSlo {
        name: "assistive-strict".into(),
        description: "Assistive control steps within their deadline, held to 99.99 %".into(),
        objective_percent: 99.99,
        period: "30d".into(),
        sli: RawSli::ControlDeadline(LoopsSli {
            loops: vec!["assistive".into()],
        }),
    });
    let day = |offset: i64| edgewatch_slo::format_rfc3339(day_ms + offset * 86_400_000);
    let share = |service, amount, from, to, version: Option<&str>| RawShare {
        service,
        amount,
        start: day(from),
        end: day(to),
        model: None,
        model_version: version.map(str::to_owned),
        machine_class: Some("haul-truck".into()),
        description: String::new(),
    };
    let prices = RawPriceBook {
        currency: "EUR".into(),
        base_lookback: "10m".into(),
        machine_classes: BTreeMap::from([(
            "haul-truck".to_owned(),
            HardwarePrice {
                purchase_price: 4200.0,
                lifetime_hours: 30000.0,
            },
        )]),
        sites: BTreeMap::from([
            (
                "pit-3".to_owned(),
                SitePrice {
                    energy_price_per_kwh: 0.19,
                },
            ),
            (
                "pit-4".to_owned(),
                SitePrice {
                    energy_price_per_kwh: 0.23,
                },
            ),
        ]),
        shares: vec![
            share(ShareService::CloudInference, 600.0, -10, 10, None),
            share(ShareService::Training, 90.0, -1, 2, Some("4.3.0")),
        ],
    };
    #[derive(serde::Serialize)]
    struct Tables {
        slo: RawCatalog,
        prices: RawPriceBook,
    }
    toml::to_string(&Tables {
        slo: catalog,
        prices,
    })
    .unwrap()
}

/// A Prometheus HTTP API call, its `data`. Queries are POSTed as a form, as Grafana's data source
/// does (`httpMethod: POST`); label values, which the API serves on GET only, are got.
fn api(base: &str, path: &str, form: &[(&str, String)]) -> Value {
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .http_status_as_error(false)
        .build()
        .new_agent();
    let url = format!("{base}{path}");
    let mut response = if path.starts_with("/api/v1/label/") {
        let mut request = agent.get(&url);
        for (k, v) in form {
            request = request.query(*k, v);
        }
        request.call().unwrap()
    } else {
        agent
            .post(&url)
            .send_form(form.iter().map(|(k, v)| (*k, v.as_str())))
            .unwrap()
    };
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().unwrap();
    assert_eq!(status, 200, "{path} {form:?}: {body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["status"], "success", "{body}");
    answer["data"].clone()
}

fn instant(base: &str, expr: &str, at_s: f64) -> Vec<Value> {
    let data = api(
        base,
        "/api/v1/query",
        &[("query", expr.to_owned()), ("time", format!("{at_s:.3}"))],
    );
    data["result"].as_array().unwrap().clone()
}

/// The value of each series of an instant vector, keyed by the values of `labels`.
fn values(result: &[Value], labels: &[&str]) -> BTreeMap<Vec<String>, f64> {
    result
        .iter()
        .map(|s| {
            let key = labels
                .iter()
                .map(|l| s["metric"][*l].as_str().unwrap_or_default().to_owned())
                .collect();
            (key, s["value"][1].as_str().unwrap().parse::<f64>().unwrap())
        })
        .collect()
}

fn close(actual: f64, expected: f64) -> bool {
    (actual - expected).abs() <= 1e-9 * expected.abs().max(1e-12)
}

/// `now-2d` → seconds.
fn range_seconds(from: &str) -> f64 {
    let rest = from.strip_prefix("now-").unwrap();
    let (n, unit) = rest.split_at(rest.len() - 1);
    let n: f64 = n.parse().unwrap();
    n * match unit {
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        other => panic!("unit {other}"),
    }
}

/// `1d` → seconds.
fn interval_seconds(text: &str) -> f64 {
    range_seconds(&format!("now-{text}"))
}

/// Checks what Grafana relies on: ids, grid, data source, targets.
fn check_shape(name: &str, d: &Value, uid: &str) {
    assert_eq!(d["schemaVersion"], 41, "{name}");
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()), "{name}");
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    for p in d["panels"].as_array().unwrap() {
        let id = p["id"]
            .as_u64()
            .unwrap_or_else(|| panic!("{name}: a panel has no id"));
        assert!(ids.insert(id), "{name}: panel id {id} twice");
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().unwrap());
        assert!(w > 0 && h > 0 && x + w <= GRID_COLUMNS, "{name}: {g}");
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    cells.insert((cx, cy)),
                    "{name}: panels overlap at {cx},{cy}"
                );
            }
        }
        if let Some(targets) = p["targets"].as_array() {
            assert_eq!(p["datasource"]["uid"], uid, "{name}: {}", p["title"]);
            assert_eq!(p["datasource"]["type"], "prometheus");
            for t in targets {
                assert_eq!(t["datasource"]["uid"], uid, "{name}: {}", p["title"]);
                assert!(t["expr"].as_str().is_some_and(|e| !e.is_empty()));
            }
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        assert_eq!(
            v["datasource"]["uid"], uid,
            "{name}: variable {}",
            v["name"]
        );
    }
}

/// Which gateway configuration the dashboards are generated from.
#[derive(Clone, Copy, PartialEq)]
enum Setup {
    /// The packaged `config/gateway.toml`, every key at its default: the built-in catalog, no
    /// price book (the cost dashboard shows usage only).
    Packaged,
    /// The test's configuration: one more SLO (`assistive-strict`) and a price book with shares.
    Priced,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_returns_series_at_the_packaged_configuration() {
    every_panel_returns_series(Setup::Packaged).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_returns_series_with_one_more_slo_and_a_price_book_and_costs_equal_the_report()
{
    every_panel_returns_series(Setup::Priced).await;
}

async fn every_panel_returns_series(setup: Setup) {
    let now = now_ns();
    let today_ns = now - now.rem_euclid(DAY_NS);
    let day_d = today_ns - DAY_NS;
    let t0 = now - now.rem_euclid(LIVE_STEP_NS);
    let live_from = (t0 - 20 * MINUTE_NS) - (t0 - 20 * MINUTE_NS).rem_euclid(HISTORY_STEP_NS);
    let first = day_d - 36 * HOUR_NS;
    let silent_until = (t0 - 3 * HOUR_NS) - (t0 - 3 * HOUR_NS).rem_euclid(HISTORY_STEP_NS);
    let rollout = day_d - 6 * HOUR_NS;
    let start = first - HISTORY_STEP_NS;
    let machines = [
        Machine {
            id: "truck-a",
            site: "pit-3",
            class: "haul-truck",
            runs: vec![
                Run {
                    version: "4.2.1",
                    start_ns: start,
                },
                Run {
                    version: "4.3.0",
                    start_ns: rollout,
                },
            ],
            times: times(first, live_from, t0),
            safety_misses: true,
            assistive_misses: false,
        },
        Machine {
            id: "truck-b",
            site: "pit-4",
            class: "haul-truck",
            runs: vec![Run {
                version: "4.2.1",
                start_ns: start,
            }],
            times: times(first, live_from, t0),
            safety_misses: false,
            assistive_misses: true,
        },
        Machine {
            id: "dozer-c",
            site: "pit-9",
            class: "dozer",
            runs: vec![Run {
                version: "3.9.0",
                start_ns: start,
            }],
            times: times(first, silent_until + 1, silent_until),
            safety_misses: false,
            assistive_misses: false,
        },
    ];

    let broker = Mosquitto::start().unwrap();
    let prometheus = Prometheus::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gateway = match setup {
        Setup::Packaged => Gateway::start_packaged(
            dir.path(),
            broker.addr(),
            "gw-dashboards",
            Some(&prometheus.remote_write_url()),
        ),
        Setup::Priced => {
            let mut spec = GatewaySpec::new(broker.addr(), "gw-dashboards");
            spec.remote_write_url = Some(prometheus.remote_write_url());
            spec.extra_tables = tables(day_d / 1_000_000);
            Gateway::start(dir.path(), &spec)
        }
    };
    // The `rules` output of this configuration, evaluated by Prometheus from now on.
    prometheus.load_rules(&gateway.command(&["rules"])).unwrap();

    let messages: Vec<_> = machines
        .iter()
        .flat_map(batches)
        .map(|b| message(&b))
        .collect();
    publish_all(broker.addr(), "fleet", &messages).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| {
        v == messages.len() as f64
    });
    // Acknowledged means stored; the remote-write outbox delivers afterwards, oldest first. A
    // rule evaluation before the last request landed records the long windows (old data) and
    // not the short ones, so the evaluation waited for below must come after this point.
    gateway.wait_metric("edgewatch_gateway_remote_write_outbox_pending", |v| {
        v == 0.0
    });
    let delivered_s = now_ns() as f64 / 1e9;
    assert_eq!(
        gateway.metric("edgewatch_gateway_remote_write_refused_total"),
        Some(0.0),
        "{}",
        gateway.log()
    );

    let out = dir.path().join("grafana");
    let base = prometheus.base_url();
    let out_text = out.display().to_string();
    gateway.command(&["dashboards", "--out", &out_text, "--prometheus", &base]);

    // The provisioning files: the data source's uid is the one every panel names.
    let datasources =
        std::fs::read_to_string(out.join("provisioning/datasources/edgewatch.yaml")).unwrap();
    let uid = datasources
        .lines()
        .find_map(|l| l.trim().strip_prefix("uid: "))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap();
    assert_eq!(uid, "edgewatch-prometheus");
    assert!(
        datasources.contains(&format!("url: \"{base}\"")),
        "{datasources}"
    );
    let providers =
        std::fs::read_to_string(out.join("provisioning/dashboards/edgewatch.yaml")).unwrap();
    let dashboards_dir = std::path::absolute(out.join("dashboards")).unwrap();
    assert!(
        providers.contains(&format!("path: \"{}\"", dashboards_dir.display())),
        "{providers}"
    );
    let mut boards: BTreeMap<String, Value> = BTreeMap::new();
    for entry in std::fs::read_dir(&dashboards_dir).unwrap() {
        let path = entry.unwrap().path();
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        check_shape(&name, &json, &uid);
        boards.insert(json["uid"].as_str().unwrap().to_owned(), json);
    }
    assert_eq!(
        boards.keys().collect::<Vec<_>>(),
        [
            "edgewatch-cost",
            "edgewatch-fleet",
            "edgewatch-machine",
            "edgewatch-slo-burn"
        ]
    );

    // Wait for an evaluation of every rule group after the data landed: each SLO's budget is
    // recorded (Prometheus evaluates every minute by default) with the time of an evaluation
    // that began after the last remote-write request was delivered, then its alerts, in the
    // same pass.
    let mut slos = vec![
        "safety-control",
        "assistive-control",
        "safety-event-freshness",
        "gpu-throttled-time",
    ];
    if setup == Setup::Priced {
        slos.push("assistive-strict");
    }
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let now_s = now_ns() as f64 / 1e9;
        let missing: Vec<&str> = slos
            .iter()
            .copied()
            .filter(|slo| {
                let evaluated = instant(
                    &base,
                    &format!("timestamp(slo:period_error_budget_remaining:ratio{{slo=\"{slo}\"}})"),
                    now_s,
                );
                !evaluated.iter().any(|s| {
                    s["value"][1]
                        .as_str()
                        .and_then(|v| v.parse::<f64>().ok())
                        .is_some_and(|at| at >= delivered_s)
                })
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no budget recorded after the data was delivered for {missing:?}; Prometheus log:\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Every target of every panel, as Grafana runs it: an instant query for stats, gauges and
    // tables, otherwise a range query over the dashboard's time range ending now; the machine
    // dashboard once per machine its variable offers.
    let end_s = now_ns() as f64 / 1e9;
    let mut failures = Vec::new();
    let mut runs = 0;
    for (uid, board) in &boards {
        let range = range_seconds(board["time"]["from"].as_str().unwrap());
        let mut assignments: Vec<Vec<(String, String)>> = vec![Vec::new()];
        for v in board["templating"]["list"].as_array().unwrap() {
            let name = v["name"].as_str().unwrap().to_owned();
            let label = v["query"]
                .as_str()
                .unwrap()
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap();
            let offered = api(
                &base,
                &format!("/api/v1/label/{label}/values"),
                &[
                    ("start", format!("{:.3}", end_s - range)),
                    ("end", format!("{end_s:.3}")),
                ],
            );
            let offered: Vec<String> = offered
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect();
            assert_eq!(name, MACHINE_VARIABLE);
            assert_eq!(offered, ["dozer-c", "truck-a", "truck-b"], "{uid}: ${name}");
            assignments = offered
                .into_iter()
                .map(|value| vec![(name.clone(), value)])
                .collect();
        }
        for p in board["panels"].as_array().unwrap() {
            let Some(targets) = p["targets"].as_array() else {
                continue;
            };
            let step = p["interval"]
                .as_str()
                .map_or(0.0, interval_seconds)
                .max((range / 500.0).ceil());
            for t in targets {
                for assignment in &assignments {
                    let mut expr = t["expr"].as_str().unwrap().to_owned();
                    for (name, value) in assignment {
                        expr = expr.replace(&format!("${name}"), value);
                    }
                    assert!(!expr.contains('$'), "{expr}");
                    let result = if t["instant"] == true {
                        instant(&base, &expr, end_s)
                    } else {
                        let points = (range / step).floor();
                        let data = api(
                            &base,
                            "/api/v1/query_range",
                            &[
                                ("query", expr.clone()),
                                ("start", format!("{:.3}", end_s - points * step)),
                                ("end", format!("{end_s:.3}")),
                                ("step", format!("{step}")),
                            ],
                        );
                        data["result"].as_array().unwrap().clone()
                    };
                    runs += 1;
                    if result.is_empty() {
                        failures.push(format!(
                            "{uid} / {} / {} {assignment:?}: no series\n    {expr}",
                            p["title"], t["refId"]
                        ));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {runs} targets returned nothing:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(runs > 80, "{runs} targets run");

    // Figures with a ground truth.
    let target = |uid: &str, title: &str, reference: &str| -> String {
        let panel = boards[uid]["panels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["title"] == title)
            .unwrap_or_else(|| panic!("no panel {title} in {uid}"));
        let t = panel["targets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["refId"] == reference)
            .unwrap();
        t["expr"].as_str().unwrap().to_owned()
    };
    let single = |expr: &str| -> f64 {
        let result = instant(&base, expr, end_s);
        assert_eq!(result.len(), 1, "{expr}: {result:?}");
        result[0]["value"][1].as_str().unwrap().parse().unwrap()
    };
    let fleet = "edgewatch-fleet";
    assert_eq!(
        single(&target(fleet, "Machines reporting, last hour", "A")),
        2.0
    );
    assert_eq!(
        single(&target(fleet, "Machines seen, last 7 days", "A")),
        3.0
    );
    assert_eq!(single(&target(fleet, "Silent for over an hour", "A")), 1.0);
    // truck-a's safety loop pages and tickets (3 windows); truck-b's assistive loop opens the
    // 3d/6h ticket at 99.9 % (2.67× > 1), and, on the extra SLO, all three at 99.99 % (26.7×).
    let firing = match setup {
        Setup::Packaged => 3.0 + 1.0,
        Setup::Priced => 3.0 + 1.0 + 3.0,
    };
    assert_eq!(
        single(&target(fleet, "Burn-rate alerts firing", "A")),
        firing
    );

    // Burn rates and budget: 1 miss in 375 over a budget of 1e-4 (truck-a, model 4.3.0).
    let burn = 1.0 / 375.0 / 1e-4;
    let group = [
        "haul-truck".to_owned(),
        "pit-3".to_owned(),
        MODEL.to_owned(),
        "4.3.0".to_owned(),
    ];
    let by_group = ["machine_class", "site", "model", "model_version"];
    let burn_board = "edgewatch-slo-burn";
    for (title, reference) in [
        ("safety-control: burn rate over 1h and 5m", "A"),
        ("safety-control: burn rate over 1h and 5m", "B"),
        ("safety-control: burn rate over 6h and 30m", "A"),
        ("safety-control: burn rate over 3d and 6h", "B"),
    ] {
        let expr = target(burn_board, title, reference);
        let got = values(&instant(&base, &expr, end_s), &by_group);
        assert!(
            close(got[&group.to_vec()], burn),
            "{title} {reference}: {got:?}"
        );
    }
    let left = values(
        &instant(
            &base,
            &target(
                burn_board,
                "safety-control: error budget left over 30d",
                "A",
            ),
            end_s,
        ),
        &by_group,
    );
    assert!(close(left[&group.to_vec()], 1.0 - burn), "{left:?}");

    if setup == Setup::Packaged {
        // No price book: usage only, and a text panel that says why.
        let cost = boards["edgewatch-cost"]["panels"].as_array().unwrap();
        assert!(cost.iter().any(|p| p["type"] == "text"));
        return;
    }

    // Cost per autonomous machine-hour of yesterday (UTC), at its end, against the report's
    // lines of that day, for the groups whose machines sent the whole day (dozer-c may have
    // fallen silent within it: its class, site and version are its own).
    let at = edgewatch_slo::format_rfc3339(today_ns / 1_000_000);
    let from = edgewatch_slo::format_rfc3339(day_d / 1_000_000);
    let report: Value = serde_json::from_str(&gateway.command(&[
        "report", "--json", "--at", &at, "--from", &from, "--to", &at,
    ]))
    .unwrap();
    let lines = report["cost"]["lines"].as_array().unwrap();
    let cost_board = "edgewatch-cost";
    let today_s = (today_ns / 1_000_000_000) as f64;
    for (title, labels, expected_groups) in [
        (
            "Cost per autonomous machine-hour, by machine class",
            vec!["machine_class"],
            vec![vec!["haul-truck"]],
        ),
        (
            "Cost per autonomous machine-hour, by site",
            vec!["site"],
            vec![vec!["pit-3"], vec!["pit-4"]],
        ),
        (
            "Cost per autonomous machine-hour, by model version",
            vec!["model", "model_version"],
            vec![vec![MODEL, "4.2.1"], vec![MODEL, "4.3.0"]],
        ),
    ] {
        let got = values(
            &instant(&base, &target(cost_board, title, "A"), today_s),
            &labels,
        );
        for group in expected_groups {
            let key: Vec<String> = group.iter().map(|v| (*v).to_owned()).collect();
            let mine: Vec<&Value> = lines
                .iter()
                .filter(|l| labels.iter().zip(&key).all(|(l2, v)| l[*l2] == v.as_str()))
                .collect();
            assert!(!mine.is_empty(), "{title}: no report line for {key:?}");
            let total: f64 = mine
                .iter()
                .map(|l| {
                    ["amortization", "energy", "cloud_inference", "training"]
                        .iter()
                        .map(|c| l[*c].as_f64().unwrap())
                        .sum::<f64>()
                })
                .sum();
            let hours: f64 = mine
                .iter()
                .map(|l| l["autonomous_hours"].as_f64().unwrap())
                .sum();
            let expected = total / hours;
            let actual = got
                .get(&key)
                .copied()
                .unwrap_or_else(|| panic!("{title}: no series for {key:?} in {got:?}"));
            assert!(
                close(actual, expected),
                "{title} {key:?}: dashboard {actual}, report {expected}"
            );
        }
    }
}

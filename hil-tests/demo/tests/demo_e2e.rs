//! End to end: a shortened demo run (real agents, loops, broker, gateway), then the gateway's
//! report (`report --json`, same evaluation time and period as the demo's) and its store checked
//! against what the control loops say they injected.
//!
//! Why the report's totals are not the loops' totals: a report counts the increase of each
//! counter series from its first sample (as PromQL's `increase()` does), and an agent sends a
//! series' first sample at its first poll, a few cycles (or, for autonomy seconds, up to one
//! snapshot interval) after the loop started. So the checks are, per series: the store's last
//! sample equals the loop's tally (the pipeline delivered every count), its first sample lies
//! within the first snapshot interval (the series starts at the loop's start), and the report
//! equals the sum of last minus first (the report counts exactly what arrived).
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use edgewatch_demo::scenario::{LOOP_RATE_HZ, Plan, Role};
use edgewatch_demo::summary::{DemoSummary, MachineSummary};
use edgewatch_gateway::store::{RawSeries, Store};
use serde_json::Value;

/// The agents' SLO snapshot interval in the demo (`deadline.snapshot_interval_s`).
const SNAPSHOT_S: f64 = 1.0;

struct Run {
    summary: DemoSummary,
    report: Value,
    store: Store,
}

fn run_demo(out: &Path) -> Run {
    let log = out.with_extension("log");
    let output = std::fs::File::create(&log).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_edgewatch-demo"))
        .args(["--quick", "--out"])
        .arg(out)
        .stdout(output.try_clone().unwrap())
        .stderr(output)
        .status()
        .unwrap();
    let printed = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "the demo failed ({status}):\n{printed}");
    assert!(
        printed.contains("== Fleet SLO and cost report"),
        "no report printed:\n{printed}"
    );
    let summary: DemoSummary =
        serde_json::from_str(&std::fs::read_to_string(out.join("demo-summary.json")).unwrap())
            .unwrap();

    let gateway =
        edgewatch_harness::binaries::workspace_binary("edgewatch-gateway", "edgewatch-gateway")
            .unwrap();
    let report = Command::new(gateway)
        .arg("--config")
        .arg(out.join("gateway/gateway.toml"))
        .args(["report", "--json", "--at", &summary.report_at])
        .args(["--from", &summary.report_from, "--to", &summary.report_to])
        .output()
        .unwrap();
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    let store = Store::open_read_only(&out.join("gateway/store.redb")).unwrap();
    Run {
        summary,
        report,
        store,
    }
}

impl Run {
    fn machine(&self, role: Role) -> &MachineSummary {
        self.summary
            .machines
            .iter()
            .find(|m| m.role == role)
            .unwrap()
    }

    /// Series of `metric` for `machine` whose labels include `extra`.
    fn series(&self, metric: &str, machine: &str, extra: &[(&str, &str)]) -> Vec<RawSeries> {
        self.store
            .query(metric, 0, i64::MAX)
            .unwrap()
            .into_iter()
            .filter(|s| {
                let label = |name: &str| {
                    s.labels
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, v)| v.as_str())
                };
                label("machine_id") == Some(machine)
                    && extra.iter().all(|(n, v)| label(n) == Some(v))
            })
            .collect()
    }

    /// The one series of `metric` for `machine` (with `extra` labels): (first, last) values.
    fn first_last(&self, metric: &str, machine: &str, extra: &[(&str, &str)]) -> (f64, f64) {
        let series = self.series(metric, machine, extra);
        assert_eq!(
            series.len(),
            1,
            "{metric} of {machine} {extra:?}: {} series",
            series.len()
        );
        let samples = &series[0].samples;
        assert!(
            samples.windows(2).all(|w| w[1].1 >= w[0].1),
            "{metric} of {machine} went down within one run"
        );
        (samples[0].1, samples[samples.len() - 1].1)
    }

    /// Report rows of `slo`, keyed by (class, site, version).
    fn slo_rows(&self, slo: &str) -> BTreeMap<(String, String, String), Value> {
        self.report["slo"]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|row| row["slo"] == slo)
            .map(|row| {
                let key = (
                    row["machine_class"].as_str().unwrap().to_owned(),
                    row["site"].as_str().unwrap().to_owned(),
                    row["model_version"].as_str().unwrap().to_owned(),
                );
                (key, row.clone())
            })
            .collect()
    }

    fn groups(&self) -> BTreeMap<(String, String, String), Vec<&MachineSummary>> {
        let mut groups: BTreeMap<_, Vec<&MachineSummary>> = BTreeMap::new();
        for m in &self.summary.machines {
            groups
                .entry((m.class.clone(), m.site.clone(), m.model_version.clone()))
                .or_default()
                .push(m);
        }
        groups
    }
}

fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance
}

#[test]
fn a_short_demo_reports_what_its_control_loops_injected() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_demo(&dir.path().join("run"));
    let s = &run.summary;
    // The scenario the demo ran: the scripts its loops were given.
    let plan = Plan::new(Duration::from_secs_f64(s.duration_s)).unwrap();
    assert!(s.drained, "the demo did not drain every queued event");
    assert_eq!(s.gateway.dead_letters, 0, "the gateway refused messages");

    // Deadline SLO: per machine, exact totals in the store; per group, exact report totals.
    // The old fields (cycles, and misses = overruns) arrive with the loops' counts; the row
    // counts the deadline semantics' activations and deadline misses.
    let loop_label = [("loop", "safety")];
    let first_window = SNAPSHOT_S * f64::from(LOOP_RATE_HZ) * 2.0;
    let rows = run.slo_rows("safety-control");
    assert_eq!(
        rows.len(),
        run.groups().len(),
        "one row per class, site and version"
    );
    for (key, machines) in run.groups() {
        let row = &rows[&key];
        assert_eq!(row["semantics"], "completion", "{key:?}");
        assert!(row["activations_not_judged"].is_null(), "{key:?}");
        let (mut activations, mut misses) = (0.0, 0.0);
        for m in machines {
            let (first, last) = run.first_last("edge_control_cycles_total", &m.id, &loop_label);
            assert_eq!(last, m.injected.cycles as f64, "{}: cycles delivered", m.id);
            assert!(
                first <= first_window,
                "{}: first cycles sample {first}",
                m.id
            );
            let (_, last) =
                run.first_last("edge_control_deadline_missed_total", &m.id, &loop_label);
            assert_eq!(
                last, m.injected.misses_observed as f64,
                "{}: overruns delivered",
                m.id
            );
            assert!(
                m.injected.misses_observed >= m.injected.misses_injected,
                "{}: an injected overrun was not an overrun",
                m.id
            );
            let (first, last) =
                run.first_last("edge_control_activations_total", &m.id, &loop_label);
            assert!(
                last >= m.injected.cycles as f64,
                "{}: {last} activations, {} cycles",
                m.id,
                m.injected.cycles
            );
            activations += last - first;
            let (first, last) =
                run.first_last("edge_control_activations_missed_total", &m.id, &loop_label);
            // The demo's budget is its period: every overrun also misses its deadline.
            assert!(
                last >= m.injected.misses_injected as f64,
                "{}: {last} deadline misses, {} overruns injected",
                m.id,
                m.injected.misses_injected
            );
            misses += last - first;
        }
        assert_eq!(
            row["total_events"].as_f64().unwrap(),
            activations,
            "{key:?}"
        );
        assert_eq!(row["bad_events"].as_f64().unwrap(), misses, "{key:?}");
        let compliance = 1.0 - misses / activations;
        assert!(close(
            row["compliance"].as_f64().unwrap(),
            compliance,
            1e-12
        ));
        let remaining = 1.0 - (misses / activations) / 1e-4;
        assert!(close(
            row["budget_remaining"].as_f64().unwrap(),
            remaining,
            1e-6
        ));
        let actions = row["policy_actions"].as_array().unwrap();
        assert_eq!(
            actions.is_empty(),
            misses == 0.0,
            "{key:?}: policy {actions:?}"
        );
    }

    // The overrunning machine's row: its bursts fire the fast page alert, and the policy halts
    // the rollout to that class and site.
    let overruns = run.machine(Role::Overruns);
    assert!(overruns.injected.misses_injected >= 10);
    let row = &rows[&(
        overruns.class.clone(),
        overruns.site.clone(),
        overruns.model_version.clone(),
    )];
    let alerts: Vec<&str> = row["alerts_firing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(alerts.contains(&"SloErrorBudgetBurn1h5m"), "{alerts:?}");
    let policy = row["policy_actions"].to_string();
    assert!(
        policy.contains("halt rollout of pit-perception 4.2.1 to haul-truck at north-pit"),
        "{policy}"
    );

    // Safety counters: fallbacks, interventions and safe stops arrive with the loops' totals.
    for m in &s.machines {
        for (metric, injected, extra) in [
            (
                "edge_safety_fallbacks_total",
                m.injected.fallbacks,
                &loop_label[..],
            ),
            (
                "edge_interventions_total",
                m.injected.interventions,
                &[][..],
            ),
            ("edge_safe_stops_total", m.injected.safe_stops, &[][..]),
        ] {
            let series = run.series(metric, &m.id, extra);
            if injected == 0 {
                assert!(series.is_empty(), "{}: {metric} without injection", m.id);
            } else {
                let (_, last) = run.first_last(metric, &m.id, extra);
                assert_eq!(last, injected as f64, "{}: {metric}", m.id);
            }
        }
    }
    // What each loop did is what its script asked for.
    for m in &s.machines {
        let scripted = |verb: &str| {
            plan.machines
                .iter()
                .find(|p| p.id == m.id)
                .unwrap()
                .script
                .iter()
                .filter(|rule| rule.starts_with(verb))
                .count() as u64
        };
        assert_eq!(m.injected.fallbacks, scripted("fallback "), "{}", m.id);
        assert_eq!(
            m.injected.interventions,
            scripted("intervention "),
            "{}",
            m.id
        );
        assert_eq!(m.injected.safe_stops, scripted("safe-stop "), "{}", m.id);
    }
    let autonomy = run.machine(Role::Autonomy);
    assert!(autonomy.injected.interventions > 0 && autonomy.injected.safe_stops > 0);

    // Cost: autonomous machine-hours per machine against the loops' autonomous seconds.
    let cost = &run.report["cost"];
    let lines = cost["lines"].as_array().unwrap();
    for m in &s.machines {
        let (first, last) = run.first_last(
            "edge_autonomy_seconds_total",
            &m.id,
            &[("mode", "autonomous")],
        );
        // The agent closes a loop's autonomy time at its last heartbeat, the loop at its exit:
        // they differ by less than a period.
        assert!(
            close(last, m.injected.seconds("autonomous"), 0.1),
            "{}: {last} s delivered, {} s injected",
            m.id,
            m.injected.seconds("autonomous")
        );
        assert!(first <= 2.0 * SNAPSHOT_S, "{}: first sample {first}", m.id);
        let hours: f64 = lines
            .iter()
            .filter(|l| l["machine_id"] == m.id.as_str())
            .map(|l| l["autonomous_hours"].as_f64().unwrap())
            .sum();
        assert!(
            close(hours * 3600.0, last - first, 1e-6),
            "{}: report {} s, store {} s",
            m.id,
            hours * 3600.0,
            last - first
        );
    }
    let manual = autonomy.injected.seconds("manual") + autonomy.injected.seconds("teleoperated");
    let planned = s.duration_s - plan.planned_autonomous_seconds(Some(&autonomy.model_version));
    assert!(
        close(manual, planned, 1.0),
        "{manual} s manual or teleoperated"
    );
    let total = &cost["total"];
    let kpi = total["cost_per_autonomous_hour"].as_f64().unwrap();
    assert!(close(
        kpi,
        total["total"].as_f64().unwrap() / total["autonomous_hours"].as_f64().unwrap(),
        1e-9
    ));
    assert!((0.6..10.0).contains(&kpi), "cost per autonomous hour {kpi}");
    assert!(cost["missing_prices"].as_array().unwrap().is_empty());

    // FOCUS: the exported rows add up to the report's total.
    let focus = std::fs::read_to_string(s.out_dir.join("focus.csv")).unwrap();
    let rows = edgewatch_slo::focus::parse_focus_csv(&focus).unwrap();
    let exported: f64 = rows.iter().map(|r| r.effective_cost).sum();
    assert!(
        close(exported, total["total"].as_f64().unwrap(), 1e-6),
        "FOCUS {exported}, report {}",
        total["total"]
    );

    // Throttling: the heated machine's GPU throttled for the heat wave, nobody else did.
    let heated = run.machine(Role::Throttling);
    let heat_s = (s.heat.end_unix_ms - s.heat.start_unix_ms) as f64 / 1000.0;
    let throttle = run.slo_rows("gpu-throttled-time");
    for (key, machines) in run.groups() {
        let bad = throttle[&key]["bad_events"].as_f64().unwrap();
        if machines.iter().any(|m| m.id == heated.id) {
            // Sysfs is polled once a second: each edge of the episode may move by a poll.
            assert!(
                close(bad, heat_s, 2.5),
                "{key:?}: {bad} s throttled, heat {heat_s} s"
            );
        } else {
            assert_eq!(bad, 0.0, "{key:?}");
        }
    }

    // The partition: the machine was cut off with events queued, and everything it queued
    // offline arrived afterwards, stamped with its event time.
    let p = &s.partition;
    assert!(
        p.peak_backlog > 0,
        "nothing was queued during the partition"
    );
    assert!(p.disconnects >= 1, "the agent never noticed the partition");
    let cut_off = run.series("edge_control_cycles_total", &p.machine, &loop_label);
    let offline = cut_off[0]
        .samples
        .iter()
        .filter(|(t, _)| *t > p.start_unix_ms && *t < p.heal_unix_ms)
        .count() as f64;
    let expected = (p.heal_unix_ms - p.start_unix_ms) as f64 / 1000.0 / SNAPSHOT_S;
    assert!(
        offline >= expected - 2.0,
        "{offline} cycle samples from the partition, {expected} expected"
    );
    let partitioned = run.machine(Role::Partitioned);
    let streams = run.store.dedup_streams().unwrap();
    assert!(edgewatch_demo::run::holds_all(
        &streams,
        &partitioned.id,
        &partitioned.agent
    ));
}

//! End to end: a demo run (real agents, control loops, broker and gateway, and one agent
//! SIGKILLed mid-run and started again while its loop keeps running), then the gateway's report
//! (`report --json`, at the demo's evaluation time and period) and its store checked against what
//! the control loops counted of themselves, **exactly**.
//!
//! Ground truth is each loop's own tally (`machines/<id>/loop-summary.json`: activations and
//! deadline misses by the loop's own clock, fallbacks, interventions, safe stops, nanoseconds in
//! autonomous mode), read from the loop's output, not through the demo. The checks:
//!
//! - `safety-control`, per report row (machine class, site, model version): semantics
//!   `completion`, complete (no refused sample), total events = the activations of the loops of
//!   the row's machines, bad events = their deadline misses; compliance, budget, alerts and policy
//!   follow from those.
//! - Per machine, in the store, by the report's own increase rule over the SLO period: activations
//!   and deadline misses (what the rows add up), fallbacks, and the interventions and safe stops
//!   the probe counted, each equal to the loop's tally. The report has no row for the last
//!   three: the store is where the gateway reports them.
//! - Per machine, the cost report's autonomous hours equal the loop's autonomous time to the
//!   nanosecond.
//! - The machine whose agent was killed passes the same checks; besides, its agent started
//!   twice, nothing of it is stamped while its agent was down, and each of its counters is one
//!   series from the loop's start (continued, not restarted).
//!
//! Two runs: the quick one (36 s), and the default one (90 s) that `cargo run -p edgewatch-demo`
//! shows a new user; the timeline scales with the run, so both are checked the same way.
//!
//! The comparisons with the tallies have no tolerance and no first-sample offset (the heat wave
//! and the partition, which no loop counts, are checked as before, within a poll): the gateway
//! writes a zero baseline at each counter's start; the demo's loops park (mode idle) in their last activation, so autonomous time ends at
//! an instant the loop and its probe share, not at the loop's exit, which no agent can see; and
//! the demo takes its drain targets only once each agent has seen its loop end.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use edgewatch_demo::scenario::{Plan, Role};
use edgewatch_demo::summary::{DemoSummary, MachineSummary};
use edgewatch_gateway::store::{RawSeries, Store};
use edgewatch_slo::Catalog;
use edgewatch_slo::names::{label, metric, value};
use edgewatch_slo::series::{Window, increase};
use serde_json::Value;

/// The deadline SLO of the built-in catalog, which selects the demo's loops (`loop="safety"`).
const DEADLINE_SLO: &str = "safety-control";

/// What a control loop counted of itself (`tally.total` of its JSON summary), and what it did
/// on purpose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tally {
    activations: u64,
    deadline_misses: u64,
    overruns: u64,
    skipped: u64,
    fallbacks: u64,
    interventions: u64,
    safe_stops: u64,
    autonomous_ns: u64,
    late_starts_injected: u64,
    hangs_injected: u64,
}

impl Tally {
    /// The tally in `machines/<id>/loop-summary.json` (the loop's stdout: one JSON line).
    fn read(out: &Path, machine: &str) -> Tally {
        let path = out.join("machines").join(machine).join("loop-summary.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let summary: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
        let n = |v: &Value| {
            v.as_u64()
                .unwrap_or_else(|| panic!("{machine}: {v} in {text}"))
        };
        let t = &summary["tally"]["total"];
        // The loops publish no model version (the agents take it from the manifest): their
        // whole tally is under "".
        let models: Vec<&String> = summary["tally"]["models"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(models, [""], "{machine}: tally per model version");
        Tally {
            activations: n(&t["activations"]),
            deadline_misses: n(&t["deadline_misses"]),
            overruns: n(&t["overruns"]),
            skipped: n(&t["skipped"]),
            fallbacks: n(&t["fallbacks"]),
            interventions: n(&t["interventions"]),
            safe_stops: n(&t["safe_stops"]),
            autonomous_ns: n(&t["autonomous_ns"]),
            late_starts_injected: n(&summary["late_starts_injected"]),
            hangs_injected: n(&summary["hangs_injected"]),
        }
    }
}

struct Run {
    summary: DemoSummary,
    report: Value,
    store: Store,
    tallies: BTreeMap<String, Tally>,
    /// The report's window for the deadline SLO: its period, ending at the evaluation time.
    window: Window,
    lookback_ms: i64,
}

/// Runs `edgewatch-demo <args> --out <out>` and reads what it left.
fn run_demo(args: &[&str], out: &Path) -> Run {
    let log = out.with_extension("log");
    let output = std::fs::File::create(&log).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_edgewatch-demo"))
        .args(args)
        .arg("--out")
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
    let tallies = summary
        .machines
        .iter()
        .map(|m| (m.id.clone(), Tally::read(out, &m.id)))
        .collect();
    // The demo's gateway runs the built-in catalog.
    let catalog = Catalog::default();
    let slo = catalog
        .slos
        .iter()
        .find(|s| s.name == DEADLINE_SLO)
        .unwrap();
    let at = edgewatch_slo::parse_rfc3339(&summary.report_at).unwrap();
    Run {
        summary,
        report,
        store,
        tallies,
        window: Window::ending_at(at, slo.period_ms),
        lookback_ms: catalog.lookback_ms,
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

    fn tally(&self, machine: &str) -> Tally {
        self.tallies[machine]
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
                label(label::MACHINE_ID) == Some(machine)
                    && extra.iter().all(|(n, v)| label(n) == Some(v))
            })
            .collect()
    }

    /// What the report counts of `metric` for `machine` (series with `extra` labels): the sum of
    /// the increase rule over the deadline SLO's window, series by series.
    fn total(&self, metric: &str, machine: &str, extra: &[(&str, &str)]) -> f64 {
        self.series(metric, machine, extra)
            .iter()
            .map(|s| increase(&s.samples, self.window, self.lookback_ms))
            .sum()
    }

    /// The one series of `metric` for `machine` (with `extra` labels), checked to start with
    /// its zero baseline and never to go down: one run of the counter from the loop's start.
    fn one_series(&self, metric: &str, machine: &str, extra: &[(&str, &str)]) -> RawSeries {
        let mut series = self.series(metric, machine, extra);
        assert_eq!(
            series.len(),
            1,
            "{metric} of {machine} {extra:?}: {series:?}"
        );
        let s = series.pop().unwrap();
        assert_eq!(
            s.samples[0].1, 0.0,
            "{metric} of {machine}: the first sample is the zero baseline"
        );
        assert!(
            s.samples.windows(2).all(|w| w[1].1 >= w[0].1),
            "{metric} of {machine} went down: {:?}",
            s.samples
        );
        s
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
fn a_short_demo_reports_exactly_what_its_control_loops_counted_across_an_agent_restart() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_demo(&["--quick"], &dir.path().join("run"));
    assert_eq!(run.summary.duration_s, 36.0);
    check(&run);
}

#[test]
fn the_default_demo_reports_exactly_what_its_control_loops_counted_across_an_agent_restart() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_demo(&[], &dir.path().join("run"));
    assert_eq!(run.summary.duration_s, 90.0);
    check(&run);
}

/// Every check of the module doc, on one run.
fn check(run: &Run) {
    let s = &run.summary;
    // The scenario the demo ran: the scripts its loops were given.
    let plan = Plan::new(Duration::from_secs_f64(s.duration_s)).unwrap();
    assert!(s.drained, "the demo did not drain every queued event");
    assert_eq!(s.gateway.dead_letters, 0, "the gateway refused messages");
    for row in run.report["slo"]["rows"].as_array().unwrap() {
        assert!(
            row["incomplete"].is_null(),
            "the gateway refused samples of a row: {row}"
        );
    }

    // The agent restart: one machine's agent was SIGKILLed while its loop ran, and started again.
    let restart = &s.restart;
    let restarted = run.machine(Role::Overruns);
    assert_eq!(restart.machine, restarted.id, "{restart:?}");
    assert_eq!(restart.signal, "SIGKILL");
    assert!(
        s.loops_started_unix_ms < restart.killed_unix_ms
            && restart.killed_unix_ms < restart.restarted_unix_ms
            && restart.restarted_unix_ms < s.loops_ended_unix_ms,
        "the agent was not down mid-run: {restart:?}, loops {}..{}",
        s.loops_started_unix_ms,
        s.loops_ended_unix_ms
    );
    let log = std::fs::read_to_string(
        s.out_dir
            .join("machines")
            .join(&restart.machine)
            .join("agent.log"),
    )
    .unwrap();
    assert_eq!(
        log.matches("The agent is running.").count(),
        2,
        "{}: the agent ran once before and once after the kill",
        restart.machine
    );
    // The restarted machine is the one that misses deadlines, in every way the semantics
    // count: overruns, late starts (a burst, and a fallback, while its agent was down) and a
    // hang (skipped activations).
    let t = run.tally(&restarted.id);
    assert!(t.overruns >= 10, "{t:?}");
    assert!(t.late_starts_injected >= 5, "{t:?}");
    assert!(t.hangs_injected == 1 && t.skipped >= 15, "{t:?}");
    // A late start (45 ms after its release, with a 40 ms deadline) and a skipped activation
    // always miss their deadline, and they are different activations.
    assert!(
        t.deadline_misses >= t.skipped + t.late_starts_injected,
        "{t:?}"
    );

    // The deadline SLO, per row: exactly the loops' tallies.
    let loop_label = [(label::LOOP, "safety")];
    let rows = run.slo_rows(DEADLINE_SLO);
    assert_eq!(
        rows.len(),
        run.groups().len(),
        "one row per class, site and version"
    );
    for (key, machines) in run.groups() {
        let row = &rows[&key];
        assert_eq!(row["semantics"], "completion", "{key:?}");
        assert!(row["activations_not_judged"].is_null(), "{key:?}");
        let (mut activations, mut misses) = (0, 0);
        for m in &machines {
            let t = run.tally(&m.id);
            activations += t.activations;
            misses += t.deadline_misses;
            // Per machine, in the store: the same numbers, one series from the loop's start.
            for (name, expected) in [
                (metric::CONTROL_ACTIVATIONS, t.activations),
                (metric::CONTROL_ACTIVATIONS_MISSED, t.deadline_misses),
            ] {
                run.one_series(name, &m.id, &loop_label);
                assert_eq!(
                    run.total(name, &m.id, &loop_label),
                    expected as f64,
                    "{}: {name}",
                    m.id
                );
            }
        }
        assert_eq!(
            row["total_events"].as_f64().unwrap(),
            activations as f64,
            "{key:?}: activations"
        );
        assert_eq!(
            row["bad_events"].as_f64().unwrap(),
            misses as f64,
            "{key:?}: deadline misses"
        );
        let ratio = misses as f64 / activations as f64;
        assert!(close(
            row["compliance"].as_f64().unwrap(),
            1.0 - ratio,
            1e-12
        ));
        assert!(close(
            row["budget_remaining"].as_f64().unwrap(),
            1.0 - ratio / 1e-4,
            1e-6
        ));
        let actions = row["policy_actions"].as_array().unwrap();
        assert_eq!(
            actions.is_empty(),
            misses == 0,
            "{key:?}: policy {actions:?}"
        );
    }

    // The machine that misses deadlines: its bursts fire the fast page alert and the policy
    // halts the rollout to its class and site.
    let row = &rows[&(
        restarted.class.clone(),
        restarted.site.clone(),
        restarted.model_version.clone(),
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

    // Safety counters, per machine: the report's rule over the store, exactly the tallies.
    let probe = [(label::SOURCE, value::PROBE)];
    for m in &s.machines {
        let t = run.tally(&m.id);
        for (name, expected, extra) in [
            (metric::SAFETY_FALLBACKS, t.fallbacks, &loop_label[..]),
            (metric::INTERVENTIONS, t.interventions, &probe[..]),
            (metric::SAFE_STOPS, t.safe_stops, &probe[..]),
        ] {
            assert_eq!(
                run.total(name, &m.id, extra),
                expected as f64,
                "{}: {name}",
                m.id
            );
        }
    }
    // What each loop did is what its script asked for.
    for m in &s.machines {
        let t = run.tally(&m.id);
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
        assert_eq!(t.fallbacks, scripted("fallback "), "{}", m.id);
        assert_eq!(t.interventions, scripted("intervention "), "{}", m.id);
        assert_eq!(t.safe_stops, scripted("safe-stop "), "{}", m.id);
    }
    let autonomy = run.machine(Role::Autonomy);
    let t = run.tally(&autonomy.id);
    assert!(t.interventions > 0 && t.safe_stops > 0, "{t:?}");
    assert!(restarted.injected.fallbacks > 0);

    // The restarted machine: nothing of it stamped while its agent was down, and every counter
    // above is one series from the loop's start, continued by the restarted agent.
    let (down_from, down_to) = (restart.killed_unix_ms, restart.restarted_unix_ms);
    let samples = run
        .one_series(metric::CONTROL_ACTIVATIONS, &restarted.id, &loop_label)
        .samples;
    assert!(
        samples.iter().all(|(t, _)| *t <= down_from || *t > down_to),
        "{}: samples stamped while its agent was down ({down_from}..{down_to})",
        restarted.id
    );
    assert!(
        samples.iter().any(|(t, _)| *t <= down_from) && samples.iter().any(|(t, _)| *t > down_to)
    );
    run.one_series(metric::SAFETY_FALLBACKS, &restarted.id, &loop_label);

    // Autonomous time, per machine: the cost report's autonomous hours are the loop's
    // autonomous time, to the nanosecond.
    let cost = &run.report["cost"];
    let lines = cost["lines"].as_array().unwrap();
    for m in &s.machines {
        let t = run.tally(&m.id);
        let hours: f64 = lines
            .iter()
            .filter(|l| l["machine_id"] == m.id.as_str())
            .map(|l| l["autonomous_hours"].as_f64().unwrap())
            .sum();
        assert_eq!(
            (hours * 3600.0 * 1e9).round() as u64,
            t.autonomous_ns,
            "{}: report {} s, loop {} s",
            m.id,
            hours * 3600.0,
            t.autonomous_ns as f64 / 1e9
        );
        let by_machine = cost["by_machine"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["by"] == m.id.as_str())
            .unwrap();
        assert!(close(
            by_machine["autonomous_hours"].as_f64().unwrap(),
            hours,
            1e-15
        ));
        let stored = run.total(
            metric::AUTONOMY_SECONDS,
            &m.id,
            &[(label::MODE, value::AUTONOMOUS)],
        );
        assert_eq!((stored * 1e9).round() as u64, t.autonomous_ns, "{}", m.id);
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
    let cut_off = run.one_series(metric::CONTROL_ACTIVATIONS, &p.machine, &loop_label);
    let offline = cut_off
        .samples
        .iter()
        .filter(|(t, _)| *t > p.start_unix_ms && *t < p.heal_unix_ms)
        .count() as f64;
    // One snapshot a second (`deadline.snapshot_interval` in the demo's agent configuration).
    let expected = (p.heal_unix_ms - p.start_unix_ms) as f64 / 1000.0;
    assert!(
        offline >= expected - 2.0,
        "{offline} activation samples from the partition, {expected} expected"
    );
    let partitioned = run.machine(Role::Partitioned);
    let streams = run.store.dedup_streams().unwrap();
    assert!(edgewatch_demo::run::holds_all(
        &streams,
        &partitioned.id,
        &partitioned.agent
    ));
}

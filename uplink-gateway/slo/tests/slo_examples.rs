//! SLO evaluation against hand-computed examples: compliance, budget, burn rates, alerts and
//! policy, including late data that lands after a partition.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use edgewatch_slo::catalog::{FreshnessSli, LoopsSli, RawCatalog, RawSli, RawSlo, ThrottleSli};
use edgewatch_slo::slo::SloRow;
use edgewatch_slo::{
    Catalog, Evaluation, Labels, SeriesSet, evaluate, parse_rfc3339, required_series,
};

const MIN: i64 = 60_000;
const HOUR: i64 = 60 * MIN;
const STEP: i64 = 5 * MIN;

fn t0() -> i64 {
    parse_rfc3339("2026-11-01T00:00:00Z").unwrap()
}

fn labels(metric: &str, pairs: &[(&str, &str)]) -> Labels {
    let mut l = Labels::from([("__name__".to_owned(), metric.to_owned())]);
    for (k, v) in pairs {
        l.insert((*k).to_owned(), (*v).to_owned());
    }
    l
}

fn m1(metric: &str, loop_name: &str) -> Labels {
    labels(
        metric,
        &[
            ("machine_id", "m1"),
            ("machine_class", "haul"),
            ("site", "pit-a"),
            ("model", "det"),
            ("model_version", "1.0"),
            ("loop", loop_name),
        ],
    )
}

fn assert_close(actual: Option<f64>, expected: f64, what: &str) {
    let actual = actual.unwrap_or_else(|| panic!("{what}: no value, expected {expected}"));
    assert!(
        (actual - expected).abs() <= 1e-12 * expected.abs().max(1.0),
        "{what}: {actual} != {expected}"
    );
}

/// One 99.9 % control SLO (budget 0.001) on loop `safety`, default windows and policy.
fn catalog() -> Catalog {
    let config = RawCatalog {
        slos: catalog_config_with_period("30d"),
        ..RawCatalog::default()
    };
    config.validate().unwrap()
}

fn burn<'a>(row: &'a SloRow, window: &str) -> &'a edgewatch_slo::slo::BurnRate {
    row.burn_rates.iter().find(|b| b.window == window).unwrap()
}

/// Machine m1, loop `safety`, one sample every 5 min from 0 h to 48 h (25 Hz → 7500 cycles per
/// step, one miss per step):
/// - k = 0..=431 (0 h to 35 h 55 m): cycles = 7500·k; misses = k, plus a burst of 900 misses
///   in the step ending at 30 h (k = 360), so misses = k + 900 from k = 360 on.
/// - The agent restarted just before 36 h: at 36 h cycles = 7500 and misses = 1 (counted from
///   zero), then +7500 and +1 per step up to 48 h (j = 0..=144: cycles 7500·(j+1), misses j+1).
///
/// The machine lost its link from 24 h to 36 h: samples in (24 h, 36 h) are `backlog`, the rest
/// `before` (t ≤ 24 h) or `live` (t ≥ 36 h).
struct Partition {
    before: Vec<(i64, f64, f64)>,
    backlog: Vec<(i64, f64, f64)>,
    live: Vec<(i64, f64, f64)>,
}

fn partition() -> Partition {
    let mut p = Partition {
        before: Vec::new(),
        backlog: Vec::new(),
        live: Vec::new(),
    };
    for k in 0..=431i64 {
        let t = t0() + k * STEP;
        let misses = k + if k >= 360 { 900 } else { 0 };
        let sample = (t, (7500 * k) as f64, misses as f64);
        if t <= t0() + 24 * HOUR {
            p.before.push(sample);
        } else {
            p.backlog.push(sample);
        }
    }
    for j in 0..=144i64 {
        let t = t0() + 36 * HOUR + j * STEP;
        p.live.push((t, (7500 * (j + 1)) as f64, (j + 1) as f64));
    }
    p
}

fn add(set: &mut SeriesSet, samples: &[(i64, f64, f64)]) {
    set.add(
        m1("edge_control_activations_total", "safety"),
        samples.iter().map(|(t, c, _)| (*t, *c)),
    );
    set.add(
        m1("edge_control_activations_missed_total", "safety"),
        samples.iter().map(|(t, _, m)| (*t, *m)),
    );
}

#[test]
fn during_the_partition_only_the_data_before_it_counts_and_short_windows_have_no_data() {
    let p = partition();
    let mut set = SeriesSet::new();
    add(&mut set, &p.before);
    let report = evaluate(&catalog(), &set, t0() + 36 * HOUR);
    assert_eq!(report.rows.len(), 1);
    let row = &report.rows[0];
    // Period: first sample (0 h) is the base; k = 1..=288 count: 288 · 7500 = 2,160,000 cycles,
    // 288 misses. Ratio 288 / 2,160,000 = 1/7500.
    assert_eq!(row.total_events, 2_160_000.0);
    assert_eq!(row.bad_events, Some(288.0));
    assert_close(row.compliance, 1.0 - 1.0 / 7500.0, "compliance");
    // Budget remaining = 1 − (1/7500) / 0.001 = 1 − 0.1333… = 0.8666…
    assert_close(row.budget_remaining, 1.0 - 1.0 / 7.5, "budget");
    // No sample in (30 h, 36 h]: no burn rate over 1h, 5m, 6h or 30m.
    for w in ["1h/5m", "6h/30m"] {
        assert_eq!((burn(row, w).long, burn(row, w).short), (None, None), "{w}");
    }
    // 3d reaches back to the start: same ratio as the period → burn 0.1333…
    assert_close(burn(row, "3d/6h").long, 1.0 / 7.5, "3d burn");
    assert_eq!(burn(row, "3d/6h").short, None);
    assert!(row.alerts_firing.is_empty());
    assert_eq!(row.policy_outcome(), "ok");
}

#[test]
fn late_data_after_a_partition_changes_period_compliance_but_not_recent_burn_rates() {
    let p = partition();
    let now = t0() + 48 * HOUR;
    let mut set = SeriesSet::new();
    add(&mut set, &p.before);
    add(&mut set, &p.live);

    // Reconnected, live data flowing, backlog not yet drained.
    let live_only = evaluate(&catalog(), &set, now);
    let row = &live_only.rows[0];
    // Period: 288 steps to 24 h (2,160,000 cycles, 288 misses); the 36 h sample is below the
    // 24 h one, a restart: +7500 cycles, +1 miss; then 144 steps to 48 h: +1,080,000, +144.
    // 3,247,500 cycles, 433 misses: ratio 433 / 3,247,500 = 1/7500.
    assert_eq!(row.total_events, 3_247_500.0);
    assert_eq!(row.bad_events, Some(433.0));
    assert_close(
        row.compliance,
        1.0 - 1.0 / 7500.0,
        "compliance before the backlog",
    );
    assert_close(
        row.budget_remaining,
        1.0 - 1.0 / 7.5,
        "budget before the backlog",
    );
    // 1h: base at 47 h, 12 steps: 12 / 90,000 = 1/7500 → burn 0.1333…; every recent window too.
    for w in ["1h/5m", "6h/30m"] {
        assert_close(burn(row, w).long, 1.0 / 7.5, w);
        assert_close(burn(row, w).short, 1.0 / 7.5, w);
    }
    assert_close(burn(row, "3d/6h").long, 1.0 / 7.5, "3d before the backlog");

    // The backlog lands: samples stamped 24 h – 36 h, arriving at 48 h.
    add(&mut set, &p.backlog);
    let after = evaluate(&catalog(), &set, now);
    let row = &after.rows[0];
    // Period: 431 steps to 35 h 55 m (3,232,500 cycles, 431 + 900 = 1331 misses), the restart at
    // 36 h (+7500, +1), 144 steps to 48 h (+1,080,000, +144): 4,320,000 cycles, 1476 misses.
    assert_eq!(row.total_events, 4_320_000.0);
    assert_eq!(row.bad_events, Some(1476.0));
    // Ratio 1476 / 4,320,000 = 0.000341666…; compliance 0.999658333…;
    // budget remaining 1 − 0.341666… = 0.658333…
    let ratio = 1476.0 / 4_320_000.0;
    assert_close(row.compliance, 1.0 - ratio, "compliance after the backlog");
    assert_close(
        row.budget_remaining,
        1.0 - ratio / 0.001,
        "budget after the backlog",
    );
    assert_close(
        row.budget_remaining,
        0.658_333_333_333_333_3,
        "budget, decimal",
    );
    // Recent windows hold only samples stamped in them: unchanged.
    for w in ["1h/5m", "6h/30m"] {
        assert_close(burn(row, w).long, 1.0 / 7.5, w);
        assert_close(burn(row, w).short, 1.0 / 7.5, w);
    }
    // 3d covers the partition: 0.341666… / 1 → burn 0.341666…
    assert_close(
        burn(row, "3d/6h").long,
        ratio / 0.001,
        "3d after the backlog",
    );
    assert!(row.alerts_firing.is_empty());
}

/// Two hours of 5 min steps, 7500 cycles each; misses +1 per step in the first hour and
/// `last_hour_misses` per step in the second. Plus m2 at pit-b with no misses, and an unselected
/// loop of m1 that misses every cycle.
fn burning(last_hour_misses: i64) -> SeriesSet {
    let mut set = SeriesSet::new();
    let (mut cycles, mut misses) = (Vec::new(), Vec::new());
    let mut missed = 0;
    for k in 0..=24i64 {
        if k > 0 {
            missed += if k <= 12 { 1 } else { last_hour_misses };
        }
        cycles.push((t0() + k * STEP, (7500 * k) as f64));
        misses.push((t0() + k * STEP, missed as f64));
    }
    set.add(
        m1("edge_control_activations_total", "safety"),
        cycles.clone(),
    );
    set.add(
        m1("edge_control_activations_missed_total", "safety"),
        misses,
    );
    set.add(
        m1("edge_control_activations_total", "assistive"),
        cycles.clone(),
    );
    set.add(
        m1("edge_control_activations_missed_total", "assistive"),
        cycles.clone(),
    );
    let m2 = |metric: &str| {
        let mut l = m1(metric, "safety");
        l.insert("machine_id".into(), "m2".into());
        l.insert("site".into(), "pit-b".into());
        l
    };
    set.add(m2("edge_control_activations_total"), cycles.clone());
    set.add(
        m2("edge_control_activations_missed_total"),
        cycles.iter().map(|(t, _)| (*t, 0.0)),
    );
    set
}

#[test]
fn a_fast_burn_fires_every_alert_and_the_policy_halts_and_freezes_the_rollout() {
    let report = evaluate(&catalog(), &burning(150), t0() + 2 * HOUR);
    assert_eq!(
        report.rows.len(),
        2,
        "one row per (class, site, model, version)"
    );
    let row = report
        .rows
        .iter()
        .find(|r| r.group.site == "pit-a")
        .unwrap();
    // 5m: 150 / 7500 = 0.02 → burn 20. 1h: 12·150 / 90,000 = 0.02 → 20 > 14.4: page.
    assert_close(burn(row, "1h/5m").short, 20.0, "5m");
    assert_close(burn(row, "1h/5m").long, 20.0, "1h");
    // 30m: 6·150 / 45,000 = 0.02 → 20. 6h (all 24 steps): (12 + 1800) / 180,000 = 0.0100666…
    // → burn 10.0666… > 6: page.
    assert_close(burn(row, "6h/30m").short, 20.0, "30m");
    assert_close(burn(row, "6h/30m").long, 1812.0 / 180_000.0 / 0.001, "6h");
    // 3d = 6h here → 10.0666… > 1: ticket.
    assert_eq!(
        row.alerts_firing,
        vec![
            "SloErrorBudgetBurn1h5m",
            "SloErrorBudgetBurn6h30m",
            "SloErrorBudgetBurn3d6h"
        ]
    );
    // Budget remaining 1 − 10.0666… = −9.0666…: exhausted.
    assert_close(row.budget_remaining, 1.0 - 1812.0 / 180.0, "budget");
    assert_eq!(
        row.policy_actions,
        vec![
            "halt rollout of det 1.0 to haul at pit-a",
            "freeze rollouts of det 1.0 to class haul"
        ]
    );
    let calm = report
        .rows
        .iter()
        .find(|r| r.group.site == "pit-b")
        .unwrap();
    assert_close(calm.compliance, 1.0, "pit-b compliance");
    assert_close(calm.budget_remaining, 1.0, "pit-b budget");
    assert_eq!(calm.policy_outcome(), "ok");
}

#[test]
fn a_slow_burn_opens_a_ticket_but_does_not_page() {
    let report = evaluate(&catalog(), &burning(30), t0() + 2 * HOUR);
    let row = report
        .rows
        .iter()
        .find(|r| r.group.site == "pit-a")
        .unwrap();
    // 1h: 12·30 / 90,000 = 0.004 → burn 4 < 14.4. 6h: (12 + 360) / 180,000 → 2.0666… < 6.
    assert_close(burn(row, "1h/5m").long, 4.0, "1h");
    assert_close(burn(row, "6h/30m").long, 372.0 / 180.0, "6h");
    assert!(!burn(row, "1h/5m").firing && !burn(row, "6h/30m").firing);
    // 3d and 6h both 2.0666… > 1: ticket.
    assert_eq!(row.alerts_firing, vec!["SloErrorBudgetBurn3d6h"]);
    assert_eq!(
        row.policy_actions,
        vec!["freeze rollouts of det 1.0 to class haul"]
    );
}

#[test]
fn freshness_and_throttled_time_follow_their_own_counters() {
    let mut config = RawCatalog::default();
    config.slos.retain(|s| {
        matches!(
            s.sli,
            RawSli::Freshness(FreshnessSli {}) | RawSli::ThrottledTime(ThrottleSli { .. })
        )
    });
    let catalog = config.validate().unwrap();
    let (a, b) = (t0(), t0() + HOUR);
    let gateway = |metric: &str, site: &str| {
        labels(
            metric,
            &[
                ("machine_id", "m1"),
                ("machine_class", "haul"),
                ("site", site),
            ],
        )
    };
    let mut set = SeriesSet::new();
    set.add(
        gateway("edgewatch_safety_events_received_total", "pit-a"),
        [(a, 0.0), (b, 200.0)],
    );
    set.add(
        gateway("edgewatch_safety_events_fresh_total", "pit-a"),
        [(a, 0.0), (b, 196.0)],
    );
    // pit-b: every event arrived late, so no fresh series exists at all.
    set.add(
        gateway("edgewatch_safety_events_received_total", "pit-b"),
        [(a, 0.0), (b, 10.0)],
    );
    let machine = |metric: &str, extra: (&str, &str)| {
        let mut l = m1(metric, "");
        l.remove("loop");
        l.insert(extra.0.into(), extra.1.into());
        l
    };
    set.add(
        machine("edge_autonomy_seconds_total", ("mode", "autonomous")),
        [(a, 0.0), (b, 3000.0)],
    );
    set.add(
        machine("edge_autonomy_seconds_total", ("mode", "manual")),
        [(a, 0.0), (b, 600.0)],
    );
    set.add(
        machine("edge_thermal_throttle_seconds_total", ("component", "gpu")),
        [(a, 0.0), (b, 36.0)],
    );
    set.add(
        machine("edge_thermal_throttle_seconds_total", ("component", "cpu")),
        [(a, 0.0), (b, 900.0)],
    );
    let report = evaluate(&catalog, &set, b);
    let find = |slo: &str, site: &str| {
        report
            .rows
            .iter()
            .find(|r| r.slo == slo && r.group.site == site)
            .unwrap()
    };
    // pit-a: 196 of 200 fresh → 0.98; bad 4/200 = 0.02 of a 0.05 budget → 0.6 left.
    let fresh = find("safety-event-freshness", "pit-a");
    assert_close(fresh.compliance, 0.98, "freshness");
    assert_close(fresh.budget_remaining, 0.6, "freshness budget");
    assert_eq!(fresh.group.model, "", "gateway series carry no model");
    // pit-b: 0 of 10 → compliance 0; 1 − 1/0.05 = −19 → exhausted; `{model}` shows `*`.
    let late = find("safety-event-freshness", "pit-b");
    assert_close(late.compliance, 0.0, "all late");
    assert_close(late.budget_remaining, -19.0, "all late budget");
    assert_eq!(
        late.policy_actions,
        vec!["freeze rollouts of * * to class haul"]
    );
    // GPU throttled 36 s of 3000 + 600 = 3600 machine seconds → 1 %; cpu is not selected.
    // Objective 99 %: compliance 0.99, budget 0.01 fully spent → 0 left → exhausted.
    let throttle = find("gpu-throttled-time", "pit-a");
    assert_eq!(
        (throttle.total_events, throttle.bad_events),
        (3600.0, Some(36.0))
    );
    assert_close(throttle.compliance, 0.99, "throttle");
    assert_close(throttle.budget_remaining, 0.0, "throttle budget");
}

#[test]
fn required_series_cover_the_period_plus_the_base_lookback_for_each_metric() {
    let needs = required_series(&Catalog::default(), t0());
    let find = |m: &str| needs.iter().find(|n| n.metric == m).unwrap();
    // 30 d + 10 m = 43,210 min.
    let activations = find("edge_control_activations_total");
    assert_eq!(activations.range_ms, 30 * 24 * HOUR + 10 * MIN);
    assert_eq!(activations.end_ms, t0());
    assert_eq!(
        activations.promql(),
        "edge_control_activations_total[43210m]"
    );
    assert_eq!(
        needs.len(),
        11,
        "activations, their misses, ABI 1 probe activations, cycles, misses, older agents' \
         activations, refusals, received, fresh, autonomy, throttle"
    );
    assert!(needs.iter().all(|n| n.range_ms == activations.range_ms));
}

#[test]
fn only_samples_inside_the_needed_range_affect_the_report() {
    // What a Prometheus range query returns, (end − range, end], gives the embedded store's numbers.
    let p = partition();
    let mut everything = SeriesSet::new();
    add(&mut everything, &p.before);
    add(&mut everything, &p.backlog);
    add(&mut everything, &p.live);
    let mut config = RawCatalog {
        slos: catalog_config_with_period("1d"),
        ..RawCatalog::default()
    };
    config.alert_windows.truncate(1);
    let catalog = config.validate().unwrap();
    let now = t0() + 48 * HOUR;
    let need = &required_series(&catalog, now)[0];
    let mut fetched = SeriesSet::new();
    for s in everything.iter() {
        fetched.add(
            s.labels().clone(),
            s.samples()
                .iter()
                .copied()
                .filter(|(t, _)| *t > need.end_ms - need.range_ms && *t <= need.end_ms),
        );
    }
    assert!(fetched.iter().all(|s| s.samples().len() < 300));
    assert_eq!(
        evaluate(&catalog, &fetched, now),
        evaluate(&catalog, &everything, now)
    );
}

fn catalog_config_with_period(period: &str) -> Vec<RawSlo> {
    vec![RawSlo {
        name: "safety-control".into(),
        description: String::new(),
        objective_percent: 99.9,
        period: period.into(),
        sli: RawSli::ControlDeadline(LoopsSli {
            loops: vec!["safety".into()],
        }),
    }]
}

#[test]
fn series_added_one_at_a_time_in_any_order_give_the_same_report() {
    let set = burning(150);
    let catalog = catalog();
    let now = t0() + 2 * HOUR;
    let mut evaluation = Evaluation::new(&catalog, now);
    let all: Vec<_> = set.iter().collect();
    for s in all.iter().rev() {
        evaluation.add(s);
    }
    assert_eq!(evaluation.finish(), evaluate(&catalog, &set, now));
}

/// One hour of 5 min steps of `metric` for machine `machine` at `site`, loop `safety`, growing
/// by `per_step`.
fn hour_of(set: &mut SeriesSet, metric: &str, machine: &str, site: &str, per_step: i64) {
    let mut l = m1(metric, "safety");
    l.insert("machine_id".into(), machine.into());
    l.insert("site".into(), site.into());
    set.add(
        l,
        (0..=12i64).map(|k| (t0() + k * STEP, (per_step * k) as f64)),
    );
}

#[test]
fn a_deadline_row_is_computed_by_one_semantics_and_counts_what_no_deadline_judged() {
    use edgewatch_slo::catalog::Semantics;
    let mut set = SeriesSet::new();
    // pit-a: an upgraded machine (completion: 7500 activations, 3 deadline misses per step;
    // overruns, 40 per step, only in the old fields) beside one still on an older agent.
    hour_of(
        &mut set,
        "edge_control_activations_total",
        "m1",
        "pit-a",
        7500,
    );
    hour_of(
        &mut set,
        "edge_control_activations_missed_total",
        "m1",
        "pit-a",
        3,
    );
    hour_of(&mut set, "edge_control_cycles_total", "m1", "pit-a", 7500);
    hour_of(
        &mut set,
        "edge_control_deadline_missed_total",
        "m1",
        "pit-a",
        40,
    );
    hour_of(&mut set, "edge_control_cycles_total", "m2", "pit-a", 7500);
    hour_of(
        &mut set,
        "edge_control_deadline_missed_total",
        "m2",
        "pit-a",
        40,
    );
    hour_of(
        &mut set,
        "edge_control_legacy_agent_activations_total",
        "m2",
        "pit-a",
        7501,
    );
    // pit-b: an ABI 1 probe, whose overruns are known and deadline misses are not.
    hour_of(
        &mut set,
        "edge_control_legacy_probe_activations_total",
        "m3",
        "pit-b",
        7500,
    );
    hour_of(&mut set, "edge_control_cycles_total", "m3", "pit-b", 7500);
    hour_of(
        &mut set,
        "edge_control_deadline_missed_total",
        "m3",
        "pit-b",
        40,
    );
    // pit-c: an older agent's counters stored before the gateway wrote its activations.
    hour_of(&mut set, "edge_control_cycles_total", "m4", "pit-c", 7500);
    hour_of(
        &mut set,
        "edge_control_deadline_missed_total",
        "m4",
        "pit-c",
        1,
    );
    let catalog = catalog();
    let now = t0() + HOUR;
    let report = evaluate(&catalog, &set, now);
    let row = |site: &str| report.rows.iter().find(|r| r.group.site == site).unwrap();

    // The upgraded machine's deadline misses only: 36 of 90,000; its overruns and the older
    // agent's counters are in no number, and the older agent's activations are counted apart.
    let a = row("pit-a");
    assert_eq!(a.semantics, Some(Semantics::Completion));
    assert_eq!((a.total_events, a.bad_events), (90_000.0, Some(36.0)));
    assert_close(a.compliance, 1.0 - 36.0 / 90_000.0, "completion");
    let not_judged = a.activations_not_judged.unwrap();
    assert_eq!(
        (not_judged.legacy_agent, not_judged.legacy_probe),
        (90_012.0, 0.0)
    );

    // Not measured: no compliance, budget, burn rate, alert or policy, however many overruns.
    let b = row("pit-b");
    assert_eq!(b.semantics, Some(Semantics::LegacyProbe));
    assert_eq!((b.total_events, b.bad_events), (90_000.0, None));
    assert_eq!((b.compliance, b.budget_remaining), (None, None));
    assert!(
        b.burn_rates
            .iter()
            .all(|r| r.long.is_none() && r.short.is_none() && !r.firing)
    );
    assert!(b.alerts_firing.is_empty() && b.policy_actions.is_empty());
    assert_eq!(b.policy_outcome(), "-");
    assert_eq!(b.activations_not_judged.unwrap().legacy_probe, 90_000.0);

    // Nothing but the old fields: the legacy computation, (cycles − misses) / cycles.
    let c = row("pit-c");
    assert_eq!(c.semantics, Some(Semantics::LegacyAgent));
    assert_eq!((c.total_events, c.bad_events), (90_000.0, Some(12.0)));
    assert_close(c.compliance, 1.0 - 12.0 / 90_000.0, "legacy");
    assert!(c.activations_not_judged.is_none());

    // One series at a time, in any order, gives the same rows.
    let mut evaluation = Evaluation::new(&catalog, now);
    let all: Vec<_> = set.iter().collect();
    for s in all.iter().rev() {
        evaluation.add(s);
    }
    assert_eq!(evaluation.finish(), report);
}

//! The plain-text and JSON forms of the reports the gateway prints.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use edgewatch_slo::cost::{Period, RawPriceBook};
use edgewatch_slo::{
    Catalog, Labels, MS_PER_DAY, SeriesSet, cost, evaluate, parse_rfc3339, render_cost_text,
    render_slo_text,
};

const STEP: i64 = 5 * 60_000;

fn labels(metric: &str, extra: (&str, &str)) -> Labels {
    [
        ("__name__", metric),
        ("machine_id", "m1"),
        ("machine_class", "haul"),
        ("site", "pit-a"),
        ("model", "det"),
        ("model_version", "1.0"),
        extra,
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// One hour of the `safety` loop at 7500 activations and 15 deadline misses per 5 min
/// (15 / 7500 = 0.2 % → burn 0.002 / 0.0001 = 20 at 99.99 %), one hour autonomous, 3.6e6 J.
fn data(t0: i64) -> SeriesSet {
    let mut set = SeriesSet::new();
    let steps = 0..=12i64;
    set.add(
        labels("edge_control_activations_total", ("loop", "safety")),
        steps.clone().map(|k| (t0 + k * STEP, (7500 * k) as f64)),
    );
    set.add(
        labels("edge_control_activations_missed_total", ("loop", "safety")),
        steps.clone().map(|k| (t0 + k * STEP, (15 * k) as f64)),
    );
    set.add(
        labels("edge_autonomy_seconds_total", ("mode", "autonomous")),
        steps.clone().map(|k| (t0 + k * STEP, (300 * k) as f64)),
    );
    set.add(
        labels("edge_energy_joules_total", ("rail", "gpu")),
        steps.map(|k| (t0 + k * STEP, (300_000 * k) as f64)),
    );
    set
}

#[test]
fn the_slo_table_shows_target_compliance_budget_burn_alerts_and_policy() {
    let t0 = parse_rfc3339("2026-11-10T00:00:00Z").unwrap();
    let report = evaluate(&Catalog::default(), &data(t0), t0 + 12 * STEP);
    let text = render_slo_text(&report);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "SLOs at 2026-11-10T01:00:00Z (event time)");
    for header in [
        "SLO",
        "CLASS",
        "SITE",
        "MODEL",
        "VERSION",
        "TARGET",
        "SEMANTICS",
        "COMPLIANCE",
        "BUDGET LEFT",
        "DATA",
        "BURN 1h/5m (14.4x)",
        "BURN 6h/30m (6x)",
        "BURN 3d/6h (1x)",
        "ALERTS",
        "POLICY",
    ] {
        assert!(
            lines[1].contains(header),
            "{header} missing in {}",
            lines[1]
        );
    }
    // Only the safety loop and the throttle SLO (autonomy seconds, no throttle) have series.
    let safety = lines
        .iter()
        .find(|l| l.starts_with("safety-control"))
        .unwrap();
    // 15 / 7500 = 0.2 % bad → compliance 99.8000 %, budget 1 − 20 = −1900.0 %, burn 20.00.
    for cell in [
        "haul",
        "pit-a",
        "det",
        "1.0",
        "99.99%",
        "30d",
        " completion ",
        "99.8000%",
        "-1900.0%",
        "complete",
        "20.00/20.00",
        "page 1h/5m, page 6h/30m, ticket 3d/6h",
        "halt rollout of det 1.0 to haul at pit-a; freeze rollouts of det 1.0 to class haul",
    ] {
        assert!(safety.contains(cell), "{cell} missing in {safety}");
    }
    let throttle = lines
        .iter()
        .find(|l| l.starts_with("gpu-throttled-time"))
        .unwrap();
    // No throttle series: nothing bad, as the rules' `or 0 * total` makes it.
    assert!(
        throttle.contains("100.0000%") && throttle.contains("0.00/0.00"),
        "{throttle}"
    );
    assert!(
        throttle.ends_with(" ok") && !throttle.contains("page"),
        "{throttle}"
    );
    // An SLO without deadline semantics says none.
    let semantics_col = lines[1].find("SEMANTICS").unwrap();
    assert_eq!(
        &throttle[semantics_col..semantics_col + 2],
        "- ",
        "{throttle}"
    );
    assert_eq!(lines.len(), 4, "{text}");
    // Columns line up: every row is as wide as its content needs, the header included.
    let policy_col = lines[1].find("POLICY").unwrap();
    assert!(lines[2..].iter().all(|l| l.len() > policy_col));

    let json: serde_json::Value = serde_json::to_value(&report).unwrap();
    let row = &json["rows"][0];
    assert_eq!(row["slo"], "safety-control");
    assert_eq!(row["semantics"], "completion");
    assert!(row["activations_not_judged"].is_null());
    assert_eq!(row["machine_class"], "haul");
    assert_eq!(row["burn_rates"][0]["window"], "1h/5m");
    assert_eq!(row["burn_rates"][0]["firing"], true);
    assert_eq!(row["alerts_firing"][0], "SloErrorBudgetBurn1h5m");
    let throttle_row = json["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["slo"] == "gpu-throttled-time")
        .unwrap();
    assert_eq!(throttle_row["compliance"], 1.0);
    assert!(throttle_row["burn_rates"][0]["short"].is_number());
    assert!(throttle_row["semantics"].is_null());
    assert!(row["incomplete"].is_null());
}

#[test]
fn deadline_rows_say_what_judged_their_activations_and_a_probe_without_deadlines_shows_no_number() {
    let t0 = parse_rfc3339("2026-11-10T00:00:00Z").unwrap();
    let mut set = SeriesSet::new();
    let hour = |set: &mut SeriesSet, metric: &str, version: &str, per_step: i64| {
        let mut l = labels(metric, ("loop", "safety"));
        l.insert("model_version".into(), version.into());
        set.add(
            l,
            (0..=12i64).map(|k| (t0 + k * STEP, (per_step * k) as f64)),
        );
    };
    // 1.0: an ABI 1 probe with overruns. 2.0: an agent from before deadline semantics.
    hour(
        &mut set,
        "edge_control_legacy_probe_activations_total",
        "1.0",
        7500,
    );
    hour(&mut set, "edge_control_cycles_total", "1.0", 7500);
    hour(&mut set, "edge_control_deadline_missed_total", "1.0", 15);
    hour(
        &mut set,
        "edge_control_legacy_agent_activations_total",
        "2.0",
        7500,
    );
    hour(&mut set, "edge_control_cycles_total", "2.0", 7500);
    hour(&mut set, "edge_control_deadline_missed_total", "2.0", 15);
    let report = evaluate(&Catalog::default(), &set, t0 + 12 * STEP);
    let text = render_slo_text(&report);
    let line = |version: &str| {
        text.lines()
            .find(|l| l.starts_with("safety-control") && l.contains(&format!(" {version} ")))
            .unwrap_or_else(|| panic!("no line for {version}:\n{text}"))
    };
    let probe = line("1.0");
    for cell in [
        "not measured (probe ABI 1)",
        "complete; 90000 activations not judged (probe ABI 1)",
        "-/-",
    ] {
        assert!(probe.contains(cell), "{cell} missing in {probe}");
    }
    assert!(!probe.contains("100.0000%"), "{probe}");
    assert!(
        probe.ends_with(" -"),
        "no policy for what is not measured: {probe}"
    );
    // The legacy computation, said so: 15 overruns in 7500 steps, as reports computed it before.
    let legacy = line("2.0");
    for cell in [
        "legacy (overruns, agent before deadlines)",
        "99.8000%",
        "complete; 90000 activations not judged (agent before deadlines)",
        "page 1h/5m",
    ] {
        assert!(legacy.contains(cell), "{cell} missing in {legacy}");
    }
    let json = serde_json::to_value(&report).unwrap();
    let probe_row = &json["rows"][0];
    assert_eq!(probe_row["semantics"], "legacy_probe");
    assert!(probe_row["bad_events"].is_null() && probe_row["compliance"].is_null());
    assert_eq!(
        probe_row["activations_not_judged"],
        serde_json::json!({ "legacy_agent": 0.0, "legacy_probe": 90000.0 })
    );
    assert_eq!(json["rows"][1]["semantics"], "legacy_agent");
}

/// Refusals of `series` (a metric name) on model version `version` of the `loop_name` loop: one
/// pair `(t − 1 ms, 0), (t, n)` per `(t, n)`, as the gateway writes them.
fn refusals(
    version: &str,
    loop_name: &str,
    series: &str,
    at: &[(i64, f64)],
) -> (Labels, Vec<(i64, f64)>) {
    let mut labels = labels("edgewatch_refused_samples_total", ("loop", loop_name));
    labels.insert("model_version".into(), version.into());
    labels.insert("series".into(), series.into());
    labels.insert("reason".into(), "bad_over_total".into());
    let samples = at
        .iter()
        .flat_map(|&(t, n)| [(t - 1, 0.0), (t, n)])
        .collect();
    (labels, samples)
}

#[test]
fn refused_samples_make_their_row_say_incomplete_with_the_count() {
    let t0 = parse_rfc3339("2026-11-10T00:00:00Z").unwrap();
    let now = t0 + 12 * STEP;
    let mut set = data(t0);
    // On the row of version 1.0: 2 + 1 refused samples of the safety loop's counters, added in
    // reverse time order (a late refusal), and one before the period that does not count.
    for (labels, samples) in [
        refusals(
            "1.0",
            "safety",
            "edge_control_deadline_missed_total",
            &[(t0 + 3 * STEP, 1.0)],
        ),
        refusals(
            "1.0",
            "safety",
            "edge_control_cycles_total",
            &[(t0 + 5 * STEP, 1.0), (t0 - 31 * MS_PER_DAY, 9.0)],
        ),
        refusals(
            "1.0",
            "safety",
            "edge_control_cycles_total",
            &[(t0 + 2 * STEP, 1.0)],
        ),
        // A loop no SLO reads, and a counter no SLO reads: on no row.
        refusals(
            "1.0",
            "planner",
            "edge_control_cycles_total",
            &[(t0 + STEP, 7.0)],
        ),
        refusals(
            "1.0",
            "safety",
            "edge_control_skipped_total",
            &[(t0 + STEP, 7.0)],
        ),
        // A version whose every sample was refused still has its row.
        refusals(
            "2.0",
            "safety",
            "edge_control_cycles_total",
            &[(t0 + STEP, 4.0)],
        ),
        refusals(
            "2.0",
            "safety",
            "edge_control_deadline_missed_total",
            &[(t0 + STEP, 4.0)],
        ),
    ] {
        set.add(labels, samples);
    }
    let report = evaluate(&Catalog::default(), &set, now);
    let json = serde_json::to_value(&report).unwrap();
    let row = |slo: &str, version: &str| {
        json["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["slo"] == slo && r["model_version"] == version)
            .unwrap_or_else(|| panic!("no {slo} row for {version}: {json:#}"))
            .clone()
    };
    assert_eq!(row("safety-control", "1.0")["incomplete"], 3);
    assert_eq!(row("safety-control", "1.0")["total_events"], 7500.0 * 12.0);
    let refused_only = row("safety-control", "2.0");
    assert_eq!(refused_only["incomplete"], 8);
    assert_eq!(refused_only["total_events"], 0.0);
    assert!(refused_only["compliance"].is_null());
    assert!(row("gpu-throttled-time", "1.0")["incomplete"].is_null());
    assert_eq!(json["rows"].as_array().unwrap().len(), 3, "{json:#}");

    let text = render_slo_text(&report);
    let line = |version: &str| {
        text.lines()
            .find(|l| l.starts_with("safety-control") && l.contains(&format!(" {version} ")))
            .unwrap()
            .to_owned()
    };
    assert!(line("1.0").contains("incomplete 3"), "{text}");
    assert!(line("2.0").contains("incomplete 8"), "{text}");
}

#[test]
fn the_cost_table_shows_each_component_and_the_cost_per_autonomous_hour() {
    let t0 = parse_rfc3339("2026-11-10T00:00:00Z").unwrap();
    let book = toml::from_str::<RawPriceBook>(
        "currency = \"USD\"\n[machine_classes.haul]\npurchase_price = 3000.0\nlifetime_hours = 30000.0\n\
         [sites.pit-a]\nenergy_price_per_kwh = 0.5\n",
    )
    .unwrap()
    .validate()
    .unwrap();
    let report = cost(
        &book,
        &data(t0),
        Period::utc_days(t0, t0 + MS_PER_DAY).unwrap(),
    );
    let text = render_cost_text(&report);
    // 1 machine hour × 0.1 = 0.10; 3.6e6 J = 1 kWh × 0.5 = 0.50; total 0.60 over 1 h.
    let expected_row = "m1               1.00          0.10    0.50             0.00      0.00   0.60              0.60";
    assert!(text.contains(expected_row), "{text}");
    assert!(text.starts_with("Cost from 2026-11-10T00:00:00Z to 2026-11-11T00:00:00Z (USD)\n"));
    for header in ["MACHINE", "SITE", "MODEL VERSION", "PER AUTONOMOUS H"] {
        assert!(text.contains(header), "{header}");
    }
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["total"]["cost_per_autonomous_hour"], 0.6);
    assert_eq!(json["lines"][0]["machine_id"], "m1");
}

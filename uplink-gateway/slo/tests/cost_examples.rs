//! Cost per autonomous machine-hour and FOCUS rows against hand-computed examples, and the
//! correction rows that late data for a closed day produces.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use edgewatch_slo::cost::{Period, RawPriceBook, ShareService};
use edgewatch_slo::focus::{FocusRow, parse_focus_csv, write_autonomy_csv, write_focus_csv};
use edgewatch_slo::{
    Costing, Labels, MS_PER_DAY, PriceBook, SeriesSet, cost, focus_rows, parse_rfc3339,
    render_cost_text,
};

const HOUR: i64 = 3_600_000;

fn day() -> i64 {
    parse_rfc3339("2026-11-10T00:00:00Z").unwrap()
}

/// USD; haul computers 2628 over 26,280 h = 0.1 per machine hour; pit-a energy 0.2 per kWh;
/// cloud inference 300 for November (30 days → 10 a day); training of `det` 600 for November
/// (20 a day).
fn book() -> PriceBook {
    let config: RawPriceBook = toml::from_str(
        r#"
        currency = "USD"
        [machine_classes.haul]
        purchase_price = 2628.0
        lifetime_hours = 26280.0
        [sites.pit-a]
        energy_price_per_kwh = 0.2
        [[shares]]
        service = "cloud-inference"
        amount = 300.0
        start = "2026-11-01T00:00:00Z"
        end = "2026-12-01T00:00:00Z"
        [[shares]]
        service = "training"
        amount = 600.0
        start = "2026-11-01T00:00:00Z"
        end = "2026-12-01T00:00:00Z"
        model = "det"
        "#,
    )
    .unwrap();
    config.validate().unwrap()
}

fn labels(metric: &str, machine: &str, extra: (&str, &str)) -> Labels {
    [
        ("__name__", metric),
        ("machine_id", machine),
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

/// Day 2026-11-10, counters at 0 at midnight and read at 18 h:
/// - m1: autonomous 18,000 s (5 h), manual 3,600 s (1 h); gpu rail 5.4e6 J, cpu rail 1.8e6 J.
/// - m2: autonomous 9,000 s (2.5 h), idle 1,800 s (0.5 h); gpu rail 3.6e6 J.
fn first_data() -> SeriesSet {
    let mut set = SeriesSet::new();
    let (a, b) = (day(), day() + 18 * HOUR);
    for (machine, metric, extra, value) in [
        (
            "m1",
            "edge_autonomy_seconds_total",
            ("mode", "autonomous"),
            18_000.0,
        ),
        (
            "m1",
            "edge_autonomy_seconds_total",
            ("mode", "manual"),
            3_600.0,
        ),
        ("m1", "edge_energy_joules_total", ("rail", "gpu"), 5.4e6),
        ("m1", "edge_energy_joules_total", ("rail", "cpu"), 1.8e6),
        (
            "m2",
            "edge_autonomy_seconds_total",
            ("mode", "autonomous"),
            9_000.0,
        ),
        (
            "m2",
            "edge_autonomy_seconds_total",
            ("mode", "idle"),
            1_800.0,
        ),
        ("m2", "edge_energy_joules_total", ("rail", "gpu"), 3.6e6),
    ] {
        set.add(labels(metric, machine, extra), [(a, 0.0), (b, value)]);
    }
    set
}

fn close(actual: f64, expected: f64, what: &str) {
    assert!(
        (actual - expected).abs() < 1e-9,
        "{what}: {actual} != {expected}"
    );
}

fn row<'a>(rows: &'a [FocusRow], machine: &str, service: &str) -> &'a FocusRow {
    rows.iter()
        .find(|r| r.resource_id == machine && r.service_name == service)
        .unwrap_or_else(|| panic!("no {service} row for {machine}"))
}

#[test]
fn cost_per_autonomous_machine_hour_matches_the_hand_computation() {
    let period = Period::utc_days(day(), day() + 2 * MS_PER_DAY).unwrap();
    let report = cost(&book(), &first_data(), period);
    let m1 = report.by_machine.iter().find(|s| s.by == "m1").unwrap();
    // m1: 6 machine h × 0.1 = 0.6; 7.2e6 J = 2 kWh × 0.2 = 0.4;
    // inference 10 × 5 / (5 + 2.5) = 6.666…; training 20 × 5 / 7.5 = 13.333…
    // total 21.0 over 5 autonomous h → 4.2 per autonomous machine-hour.
    close(m1.amortization, 0.6, "m1 amortization");
    close(m1.energy, 0.4, "m1 energy");
    close(m1.cloud_inference, 20.0 / 3.0, "m1 inference");
    close(m1.training, 40.0 / 3.0, "m1 training");
    close(m1.total, 21.0, "m1 total");
    close(m1.cost_per_autonomous_hour.unwrap(), 4.2, "m1 per hour");
    // m2: 3 h × 0.1 = 0.3; 1 kWh × 0.2 = 0.2; 10 × 2.5/7.5 = 3.333…; 20 × 2.5/7.5 = 6.666…
    // total 10.5 over 2.5 h → 4.2.
    let m2 = report.by_machine.iter().find(|s| s.by == "m2").unwrap();
    close(m2.total, 10.5, "m2 total");
    close(m2.cost_per_autonomous_hour.unwrap(), 4.2, "m2 per hour");
    // Site, model version and fleet: 31.5 over 7.5 h → 4.2.
    for s in [
        &report.by_site[0],
        &report.by_model_version[0],
        &report.total,
    ] {
        close(s.total, 31.5, &s.by);
        close(s.autonomous_hours, 7.5, &s.by);
        close(s.cost_per_autonomous_hour.unwrap(), 4.2, &s.by);
    }
    assert_eq!(report.by_model_version[0].by, "det 1.0");
    // 2026-11-11 has no autonomous hours: its 10 + 20 stay unallocated, and say so.
    let unallocated: Vec<(ShareService, f64)> = report
        .unallocated
        .iter()
        .map(|u| (u.service, u.amount))
        .collect();
    assert_eq!(
        unallocated,
        vec![
            (ShareService::CloudInference, 10.0),
            (ShareService::Training, 20.0)
        ]
    );
    assert!(report.missing_prices.is_empty());
    let text = render_cost_text(&report);
    assert!(text.contains("Unallocated shares: 30.00 USD"), "{text}");
    let total_line = text.lines().find(|l| l.starts_with("all")).unwrap();
    assert!(
        total_line.ends_with("31.50              4.20"),
        "{total_line}"
    );
}

#[test]
fn focus_rows_carry_the_hand_computed_costs_and_columns() {
    let period = Period::utc_days(day(), day() + MS_PER_DAY).unwrap();
    let report = cost(&book(), &first_data(), period);
    let rows = focus_rows(&report, &[], day() + 2 * MS_PER_DAY);
    assert_eq!(rows.len(), 8, "two machines × four components");
    let amort = row(&rows, "m1", "edge-compute-amortization");
    // The computer was billed when bought: BilledCost 0, EffectiveCost the amortized 0.6.
    assert_eq!((amort.billed_cost, amort.effective_cost), (0.0, 0.6));
    assert_eq!(amort.consumed_quantity, Some(6.0));
    assert_eq!(amort.pricing_unit, "Hours");
    let energy = row(&rows, "m1", "edge-energy");
    assert_eq!((energy.billed_cost, energy.effective_cost), (0.4, 0.4));
    assert_eq!(
        (energy.consumed_quantity, energy.consumed_unit.as_str()),
        (Some(2.0), "kWh")
    );
    close(
        row(&rows, "m2", "cloud-inference").effective_cost,
        10.0 / 3.0,
        "m2 inference",
    );
    assert_eq!(row(&rows, "m2", "training").consumed_quantity, None);

    let csv = write_focus_csv(&rows);
    let header = csv.lines().next().unwrap();
    assert!(
        header.starts_with("BilledCost,EffectiveCost,ListCost,ContractedCost,BillingCurrency,")
    );
    assert!(header.ends_with(
        ",Tags,x_MachineId,x_Site,x_MachineClass,x_Model,x_ModelVersion,x_AllocationMethod"
    ));
    let m1_amort = csv
        .lines()
        .find(|l| l.contains("m1") && l.contains("amortization"))
        .unwrap();
    assert!(
        m1_amort.starts_with(
            "0,0.6,0.6,0.6,USD,2026-11-01T00:00:00Z,2026-12-01T00:00:00Z,\
             2026-11-10T00:00:00Z,2026-11-11T00:00:00Z,Usage,,"
        ),
        "{m1_amort}"
    );
    assert!(m1_amort.contains(
        r#",6,Hours,6,Hours,m1,m1,Autonomous machine,edge-compute-amortization,Compute,"{""machine_class"":""haul"",""model"":""det"",""model_version"":""1.0"",""site"":""pit-a""}",m1,pit-a,haul,det,1.0,machine-hours"#
    ), "{m1_amort}");
    assert_eq!(parse_focus_csv(&csv).unwrap(), rows);

    // KPI from the files alone: Σ EffectiveCost / Σ x_AutonomousMachineHours = 31.5 / 7.5.
    let effective: f64 = rows.iter().map(|r| r.effective_cost).sum();
    let hours: f64 = write_autonomy_csv(&report)
        .lines()
        .skip(1)
        .map(|l| l.rsplit(',').next().unwrap().parse::<f64>().unwrap())
        .sum();
    close(effective / hours, 4.2, "KPI from the export");
}

#[test]
fn late_data_for_a_closed_day_yields_correction_rows_with_the_difference() {
    let book = book();
    let first_period = Period::utc_days(day(), day() + MS_PER_DAY).unwrap();
    let first = focus_rows(
        &cost(&book, &first_data(), first_period),
        &[],
        day() + MS_PER_DAY,
    );
    // The previous export goes through its CSV file, as it would in production.
    let previous = parse_focus_csv(&write_focus_csv(&first)).unwrap();

    // m2's backlog lands: by 23 h it was 18,000 s autonomous (+2.5 h) and 7.2e6 J on gpu (+1 kWh).
    // And m1 works 1 autonomous hour on 2026-11-12, a day never exported.
    let mut data = first_data();
    data.add(
        labels("edge_autonomy_seconds_total", "m2", ("mode", "autonomous")),
        [(day() + 23 * HOUR, 18_000.0)],
    );
    data.add(
        labels("edge_energy_joules_total", "m2", ("rail", "gpu")),
        [(day() + 23 * HOUR, 7.2e6)],
    );
    let d3 = day() + 2 * MS_PER_DAY;
    data.add(
        labels("edge_autonomy_seconds_total", "m1", ("mode", "autonomous")),
        [(d3, 18_000.0), (d3 + HOUR, 21_600.0)],
    );
    let now = parse_rfc3339("2026-12-02T08:00:00Z").unwrap();
    let period = Period::utc_days(day(), day() + 3 * MS_PER_DAY).unwrap();
    let report = cost(&book, &data, period);
    let new = focus_rows(&report, &previous, now);

    let corrections: Vec<&FocusRow> = new.iter().filter(|r| r.correction).collect();
    let regular: Vec<&FocusRow> = new.iter().filter(|r| !r.correction).collect();
    // Day 10, m2: 5.5 h → 0.55 (Δ +0.25, +2.5 h); 2 kWh → 0.4 (Δ +0.2, +1 kWh);
    // shares now 5 h : 5 h → inference 5 each (m1 Δ −1.666…, m2 Δ +1.666…),
    // training 10 each (m1 Δ −3.333…, m2 Δ +3.333…). m1's amortization and energy: unchanged.
    let delta = |machine: &str, service: &str| {
        let r = corrections
            .iter()
            .find(|r| r.resource_id == machine && r.service_name == service)
            .unwrap_or_else(|| panic!("no correction for {machine} {service}"));
        (r.effective_cost, r.consumed_quantity)
    };
    assert_eq!(corrections.len(), 6);
    let (cost_d, qty_d) = delta("m2", "edge-compute-amortization");
    close(cost_d, 0.25, "m2 amortization Δ");
    close(qty_d.unwrap(), 2.5, "m2 hours Δ");
    let (cost_d, qty_d) = delta("m2", "edge-energy");
    close(cost_d, 0.2, "m2 energy Δ");
    close(qty_d.unwrap(), 1.0, "m2 kWh Δ");
    close(
        delta("m2", "cloud-inference").0,
        5.0 - 10.0 / 3.0,
        "m2 inference Δ",
    );
    close(
        delta("m1", "cloud-inference").0,
        5.0 - 20.0 / 3.0,
        "m1 inference Δ",
    );
    close(
        delta("m2", "training").0,
        10.0 - 20.0 / 3.0,
        "m2 training Δ",
    );
    close(
        delta("m1", "training").0,
        10.0 - 40.0 / 3.0,
        "m1 training Δ",
    );
    for c in &corrections {
        // The restated charge period is the original day; the correction is billed in December.
        assert_eq!(c.charge_period_start_ms, day());
        assert_eq!(
            c.billing_period_start_ms,
            parse_rfc3339("2026-12-01T00:00:00Z").unwrap()
        );
        assert_eq!(c.charge_category, "Usage");
    }
    let correction_line = write_focus_csv(&new)
        .lines()
        .find(|l| l.contains(",Correction,"))
        .map(str::to_owned);
    assert!(correction_line.is_some());
    // Day 12 was never exported: regular rows, m1 alone takes the day's shares (10 and 20).
    assert_eq!(regular.len(), 3);
    assert!(regular.iter().all(|r| r.charge_period_start_ms == d3));
    close(
        row(&new, "m1", "training").effective_cost,
        10.0 - 40.0 / 3.0,
        "first training row is the correction",
    );
    let d3_training = regular
        .iter()
        .find(|r| r.service_name == "training")
        .unwrap();
    close(d3_training.effective_cost, 20.0, "day 12 training");

    // Previous + new rows sum to the current report, per machine.
    let all: Vec<FocusRow> = previous
        .iter()
        .cloned()
        .chain(new.iter().cloned())
        .collect();
    for s in &report.by_machine {
        let exported: f64 = all
            .iter()
            .filter(|r| r.resource_id == s.by)
            .map(|r| r.effective_cost)
            .sum();
        close(exported, s.total, &s.by);
    }
    // Exporting again from the same data restates nothing.
    let again = parse_focus_csv(&write_focus_csv(&all)).unwrap();
    assert_eq!(focus_rows(&report, &again, now), Vec::<FocusRow>::new());
}

#[test]
fn a_machine_class_or_site_without_a_price_is_reported_not_fatal() {
    let mut set = first_data();
    let mut dozer = labels("edge_autonomy_seconds_total", "m9", ("mode", "autonomous"));
    dozer.insert("machine_class".into(), "dozer".into());
    dozer.insert("site".into(), "pit-z".into());
    set.add(dozer.clone(), [(day(), 0.0), (day() + HOUR, 3600.0)]);
    dozer.insert("__name__".into(), "edge_energy_joules_total".into());
    dozer.remove("mode");
    dozer.insert("rail".into(), "gpu".into());
    set.add(dozer, [(day(), 0.0), (day() + HOUR, 3.6e6)]);
    let report = cost(
        &book(),
        &set,
        Period::utc_days(day(), day() + MS_PER_DAY).unwrap(),
    );
    assert_eq!(
        report.missing_prices,
        vec!["machine_class dozer", "site pit-z"]
    );
    let m9 = report.by_machine.iter().find(|s| s.by == "m9").unwrap();
    assert_eq!((m9.amortization, m9.energy), (0.0, 0.0));
    // It still takes its share: 1 h of 8.5 autonomous hours.
    close(m9.cloud_inference, 10.0 / 8.5, "m9 inference");
}

#[test]
fn price_book_errors_name_the_key() {
    let parse = |text: &str| {
        toml::from_str::<RawPriceBook>(text)
            .unwrap()
            .validate()
            .unwrap_err()
    };
    let err = parse("currency = \"usd\"");
    assert_eq!(err.key(), "currency");
    let err = parse(
        "currency = \"USD\"\n[machine_classes.haul]\npurchase_price = 1.0\nlifetime_hours = 0.0",
    );
    assert_eq!(err.key(), "machine_classes.haul.lifetime_hours");
    let err = parse(
        "currency = \"USD\"\n[[shares]]\nservice = \"training\"\namount = 1.0\nstart = \"2026-11-01T12:00:00Z\"\nend = \"2026-12-01T00:00:00Z\"",
    );
    assert_eq!(err.key(), "shares[0].start");
    assert!(toml::from_str::<RawPriceBook>("currency = \"USD\"\nvat = 0.2").is_err());
}

#[test]
fn series_costed_one_at_a_time_in_any_order_give_the_same_report() {
    let book = book();
    let data = first_data();
    let period = Period::utc_days(day(), day() + 2 * MS_PER_DAY).unwrap();
    let mut costing = Costing::new(&book, period);
    let all: Vec<_> = data.iter().collect();
    for s in all.iter().rev() {
        costing.add(s);
    }
    assert_eq!(costing.finish(), cost(&book, &data, period));
}

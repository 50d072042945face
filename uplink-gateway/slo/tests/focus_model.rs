//! Model-based test of repeated FOCUS exports while late samples keep landing: after every export
//! the appended file (regular rows plus corrections) sums, per (day, machine, service), to what the
//! current data costs, and an immediate re-export adds nothing. A restart re-reads the file.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use edgewatch_slo::cost::{Period, RawPriceBook};
use edgewatch_slo::focus::{FocusRow, parse_focus_csv, write_focus_csv};
use edgewatch_slo::{Labels, MS_PER_DAY, PriceBook, SeriesSet, cost, focus_rows, parse_rfc3339};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn start() -> i64 {
    parse_rfc3339("2026-11-10T00:00:00Z").unwrap()
}

fn book() -> PriceBook {
    toml::from_str::<RawPriceBook>(
        r#"
        currency = "EUR"
        [machine_classes.haul]
        purchase_price = 5000.0
        lifetime_hours = 20000.0
        [sites.pit-a]
        energy_price_per_kwh = 0.31
        [[shares]]
        service = "cloud-inference"
        amount = 93.0
        start = "2026-11-01T00:00:00Z"
        end = "2026-12-01T00:00:00Z"
        "#,
    )
    .unwrap()
    .validate()
    .unwrap()
}

#[derive(Debug, Clone)]
enum Action {
    /// A sample lands (possibly late, possibly out of order) on one of 3 machines × 3 series.
    Sample {
        machine: u8,
        series: u8,
        at_minute: i64,
        value: u32,
    },
    /// Export the period, appending to the file.
    Export,
    /// The exporter restarts: the previous rows are read back from the CSV file.
    Restart,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => (0u8..3, 0u8..3, 0i64..3 * 24 * 60, 0u32..200_000).prop_map(
            |(machine, series, at_minute, value)| Action::Sample { machine, series, at_minute, value }
        ),
        2 => Just(Action::Export),
        1 => Just(Action::Restart),
    ]
}

fn labels(machine: u8, series: u8) -> Labels {
    let (metric, extra) = match series {
        0 => ("edge_autonomy_seconds_total", ("mode", "autonomous")),
        1 => ("edge_autonomy_seconds_total", ("mode", "manual")),
        _ => ("edge_energy_joules_total", ("rail", "gpu")),
    };
    let id = format!("m{machine}");
    [
        ("__name__", metric),
        ("machine_id", id.as_str()),
        ("machine_class", "haul"),
        ("site", "pit-a"),
        ("model", "det"),
        ("model_version", if machine == 2 { "2.0" } else { "1.0" }),
        extra,
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

type Key = (i64, String, String, String);

fn sums(rows: &[FocusRow]) -> BTreeMap<Key, f64> {
    let mut out = BTreeMap::new();
    for r in rows {
        *out.entry((
            r.charge_period_start_ms,
            r.resource_id.clone(),
            r.model_version.clone(),
            r.service_name.clone(),
        ))
        .or_insert(0.0) += r.effective_cost;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn appended_exports_always_sum_to_the_current_cost(actions in prop::collection::vec(action(), 1..40)) {
        let book = book();
        let period = Period::utc_days(start(), start() + 3 * MS_PER_DAY).unwrap();
        let mut data = SeriesSet::new();
        let mut file: Vec<FocusRow> = Vec::new();
        let now = start() + 40 * MS_PER_DAY;
        for action in actions {
            match action {
                Action::Sample { machine, series, at_minute, value } => {
                    data.add(labels(machine, series), [(start() + at_minute * 60_000, f64::from(value))]);
                }
                Action::Restart => {
                    file = parse_focus_csv(&write_focus_csv(&file)).unwrap();
                }
                Action::Export => {
                    let report = cost(&book, &data, period);
                    let appended = focus_rows(&report, &file, now);
                    file.extend(appended);
                    // The model: the current rows computed from scratch, with nothing exported.
                    let expected = sums(&focus_rows(&report, &[], now));
                    let exported = sums(&file);
                    for (key, value) in &exported {
                        let want = expected.get(key).copied().unwrap_or(0.0);
                        prop_assert!((value - want).abs() < 1e-6, "{:?}: exported {} want {}", key, value, want);
                    }
                    for key in expected.keys() {
                        prop_assert!(exported.contains_key(key), "{:?} never exported", key);
                    }
                    prop_assert!(focus_rows(&report, &file, now).is_empty());
                }
            }
        }
    }
}

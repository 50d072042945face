//! How long the report takes per machine-month of raw samples: [`Evaluation`] and [`Costing`]
//! over 30 days of 15 s samples, fed one machine at a time as a source would, against a baseline
//! that only reads every sample once (the floor for any computation from raw samples).
//!
//! Run: `cargo bench -p edgewatch-slo --bench fleet` (machines: `FLEET_BENCH_MACHINES`, default 10).
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use edgewatch_slo::cost::{Period, RawPriceBook};
use edgewatch_slo::{Catalog, Costing, Evaluation, Labels, MS_PER_DAY, SeriesSet, parse_rfc3339};
use std::hint::black_box;
use std::time::{Duration, Instant};

const STEP_MS: i64 = 15_000;
const DAYS: i64 = 30;

/// One machine's series over 30 days: 2 loops × (cycles, misses), 4 modes, 2 rails, gpu throttle.
fn machine(id: usize, start: i64) -> SeriesSet {
    let base = |metric: &str, extra: (&str, &str)| -> Labels {
        [
            ("__name__", metric),
            ("machine_id", &format!("m{id}")),
            ("machine_class", "haul"),
            (
                "site",
                if id.is_multiple_of(2) {
                    "pit-a"
                } else {
                    "pit-b"
                },
            ),
            ("model", "det"),
            ("model_version", "1.0"),
            extra,
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    };
    let steps = DAYS * MS_PER_DAY / STEP_MS;
    let series: [(&str, (&str, &str), f64); 11] = [
        ("edge_control_cycles_total", ("loop", "safety"), 375.0),
        (
            "edge_control_deadline_missed_total",
            ("loop", "safety"),
            0.01,
        ),
        ("edge_control_cycles_total", ("loop", "assistive"), 150.0),
        (
            "edge_control_deadline_missed_total",
            ("loop", "assistive"),
            0.2,
        ),
        ("edge_autonomy_seconds_total", ("mode", "autonomous"), 10.0),
        ("edge_autonomy_seconds_total", ("mode", "manual"), 3.0),
        ("edge_autonomy_seconds_total", ("mode", "teleoperated"), 1.0),
        ("edge_autonomy_seconds_total", ("mode", "idle"), 1.0),
        ("edge_energy_joules_total", ("rail", "gpu"), 450.0),
        ("edge_energy_joules_total", ("rail", "cpu"), 150.0),
        (
            "edge_thermal_throttle_seconds_total",
            ("component", "gpu"),
            0.05,
        ),
    ];
    let mut set = SeriesSet::new();
    for (metric, extra, per_step) in series {
        set.add(
            base(metric, extra),
            (0..=steps).map(|k| (start + k * STEP_MS, (k as f64 * per_step).floor())),
        );
    }
    set
}

fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs[runs.len() / 2]
}

fn main() {
    let machines: usize = std::env::var("FLEET_BENCH_MACHINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let start = parse_rfc3339("2026-11-01T00:00:00Z").unwrap();
    let now = start + DAYS * MS_PER_DAY;
    let catalog = Catalog::default();
    let book = toml::from_str::<RawPriceBook>(
        "currency = \"USD\"\n[machine_classes.haul]\npurchase_price = 4200.0\nlifetime_hours = 30000.0\n\
         [sites.pit-a]\nenergy_price_per_kwh = 0.19\n",
    )
    .unwrap()
    .validate()
    .unwrap();
    let period = Period::utc_days(start, now).unwrap();
    let fleet: Vec<SeriesSet> = (0..machines).map(|id| machine(id, start)).collect();
    let samples: usize = fleet
        .iter()
        .flat_map(SeriesSet::iter)
        .map(|s| s.samples().len())
        .sum();

    let (mut read, mut slo, mut costs) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        let mut sum = 0.0;
        for set in &fleet {
            for s in set.iter() {
                sum += s.samples().iter().map(|(_, v)| v).sum::<f64>();
            }
        }
        black_box(sum);
        read.push(t.elapsed());

        let t = Instant::now();
        let mut evaluation = Evaluation::new(&catalog, now);
        for set in &fleet {
            for s in set.iter() {
                evaluation.add(s);
            }
        }
        black_box(evaluation.finish());
        slo.push(t.elapsed());

        let t = Instant::now();
        let mut costing = Costing::new(&book, period);
        for set in &fleet {
            for s in set.iter() {
                costing.add(s);
            }
        }
        black_box(costing.finish());
        costs.push(t.elapsed());
    }
    let per_machine = |d: Duration| d.as_secs_f64() * 1e3 / machines as f64;
    println!("{machines} machines × 30 d × 15 s, {samples} samples; medians of 5 runs");
    for (name, runs) in [
        ("baseline: read every sample once", read),
        ("evaluate (default catalog)", slo),
        ("cost (30 daily windows)", costs),
    ] {
        let m = median(runs);
        println!(
            "{name:36} {:>9.1} ms total {:>8.2} ms/machine",
            m.as_secs_f64() * 1e3,
            per_machine(m)
        );
    }
}

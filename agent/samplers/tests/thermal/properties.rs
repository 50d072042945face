//! Model-based property tests of the stateful pure logic, with restart and crash actions:
//! random action sequences run against the real component and a plain model recomputed from
//! the full history.

use std::time::Duration;

use edgewatch_proto::v1::{Component, Tier};
use edgewatch_samplers::thermal::config::{EnergyConfig, ThermalConfig};
use edgewatch_samplers::thermal::sysfs::{SysfsInventory, SysfsSnapshot, Trip, TripKind, ZoneInfo};
use edgewatch_samplers::thermal::{EnergyIntegrator, ThrottleDetector};
use edgewatch_samplers::{CollectingSink, Now};
use proptest::prelude::*;

use crate::util::throttles;

const GAP_MS: u64 = 5_000;

fn now(ms: u64) -> Now {
    Now {
        wall_unix_ns: 1_700_000_000_000_000_000 + ms as i64 * 1_000_000,
        monotonic_ns: 10_000_000_000 + ms * 1_000_000,
    }
}

// ---------------------------------------------------------------------------------------------
// Energy.

#[derive(Debug, Clone)]
enum EnergyAction {
    /// Time moves on, then one tegrastats line (rails A, NC, NC) and one sysfs input read.
    Sample {
        dt_ms: u64,
        mw: [u32; 3],
        input_mw: Option<u32>,
    },
    /// tegrastats exited and was restarted.
    TegrastatsRestart,
    /// The model version changed: a new counter series.
    NewSeries,
    /// The agent crashed and started again: everything starts over.
    AgentRestart,
}

fn energy_action() -> impl Strategy<Value = EnergyAction> {
    let dt = prop_oneof![4 => 0..2_000u64, 1 => 4_000..7_000u64];
    prop_oneof![
        8 => (dt, prop::array::uniform3(0..20_000u32), prop::option::of(0..9_000u32))
            .prop_map(|(dt_ms, mw, input_mw)| EnergyAction::Sample { dt_ms, mw, input_mw }),
        1 => Just(EnergyAction::TegrastatsRestart),
        1 => Just(EnergyAction::NewSeries),
        1 => Just(EnergyAction::AgentRestart),
    ]
}

/// One observed sample of a rail in the model's history.
#[derive(Debug, Clone, Copy)]
struct Observed {
    ms: u64,
    mw: f64,
    /// Continuity segment: a new one after each tegrastats restart.
    segment: u32,
    /// Counter series it was observed in.
    series: u32,
}

/// Joules of the current series, from the whole history of one rail.
fn model_joules(history: &[Observed], series: u32) -> f64 {
    history
        .windows(2)
        .filter(|w| {
            let (a, b) = (w[0], w[1]);
            a.segment == b.segment && b.series == series && b.ms - a.ms <= GAP_MS
        })
        .map(|w| (w[0].mw + w[1].mw) / 2.0 * (w[1].ms - w[0].ms) as f64 / 1e6)
        .sum()
}

fn integrator() -> EnergyIntegrator {
    EnergyIntegrator::new(
        &EnergyConfig {
            max_gap: Duration::from_millis(GAP_MS),
        },
        &["S".to_owned()],
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn energy_matches_a_model_recomputed_from_history_across_restarts_and_series(
        actions in prop::collection::vec(energy_action(), 1..80)
    ) {
        let mut real = integrator();
        // Histories: rails A, NC, NC#2 (tegrastats) and S (sysfs).
        let mut history: [Vec<Observed>; 4] = Default::default();
        let (mut ms, mut segment, mut series) = (0u64, 0u32, 0u32);
        let mut previous: Vec<(String, f64)> = Vec::new();
        for action in actions {
            match action {
                EnergyAction::Sample { dt_ms, mw, input_mw } => {
                    ms += dt_ms;
                    let line = format!(
                        "RAM 1/2MB A {}mW/0mW NC {}mW/0mW NC {}mW/0mW",
                        mw[0], mw[1], mw[2]
                    );
                    let sample = tegrastats_parser::parse_line(&line).unwrap();
                    real.observe_tegrastats(sample.rails(), now(ms));
                    real.observe_power_inputs(&[input_mw.map(f64::from)], now(ms));
                    let values = [Some(mw[0]), Some(mw[1]), Some(mw[2]), input_mw];
                    for (rail, value) in history.iter_mut().zip(values) {
                        let Some(value) = value else { continue };
                        // A sample at the same instant as the last one of its run adds nothing.
                        if rail.last().is_some_and(|last| last.ms == ms && last.segment == segment) {
                            continue;
                        }
                        rail.push(Observed { ms, mw: f64::from(value), segment, series });
                    }
                }
                EnergyAction::TegrastatsRestart => {
                    real.break_tegrastats();
                    segment += 1;
                    // The sysfs rail is not broken: move its history into the new segment.
                    for o in &mut history[3] {
                        o.segment = segment;
                    }
                }
                EnergyAction::NewSeries => {
                    real.reset_totals();
                    series += 1;
                    previous.clear();
                }
                EnergyAction::AgentRestart => {
                    real = integrator();
                    history = Default::default();
                    series += 1;
                    previous.clear();
                }
            }
            let got: Vec<(String, f64)> = real.rails().map(|(l, j)| (l.to_owned(), j)).collect();
            for (label, joules) in &got {
                let index = match label.as_str() {
                    "A" => 0,
                    "NC" => 1,
                    "NC#2" => 2,
                    "S" => 3,
                    other => panic!("unexpected rail {other}"),
                };
                let want = model_joules(&history[index], series);
                prop_assert!((joules - want).abs() < 1e-6, "{label}: {joules} != {want}");
            }
            // Within a series, joules never go down.
            for ((label, before), (_, after)) in previous.iter().zip(&got) {
                prop_assert!(after >= before, "{label} went down");
            }
            previous = got;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Throttle hysteresis.

const TRIP: f64 = 95.0;
const HYSTERESIS: f64 = 2.0;

#[derive(Debug, Clone)]
enum ThrottleAction {
    /// Time moves on, then a reading of the zone (None = unreadable).
    Read {
        dt_ms: u64,
        quarter_degrees: Option<i32>,
    },
    /// The agent crashed and started again.
    AgentRestart,
}

fn throttle_action() -> impl Strategy<Value = ThrottleAction> {
    let dt = prop_oneof![6 => 1..3_000u64, 1 => 5_001..20_000u64];
    // Readings within ±6 °C of the trip, in quarter degrees, to hit the edges exactly.
    let temp = prop::option::weighted(0.9, -24..24i32);
    prop_oneof![
        12 => (dt, temp).prop_map(|(dt_ms, quarter_degrees)| ThrottleAction::Read { dt_ms, quarter_degrees }),
        1 => Just(ThrottleAction::AgentRestart),
    ]
}

fn detector() -> (ThrottleDetector, SysfsInventory) {
    let inventory = SysfsInventory {
        zones: vec![ZoneInfo {
            id: 0,
            kind: "gpu-thermal".into(),
            trips: vec![Trip {
                index: 0,
                celsius: TRIP,
                kind: TripKind::Passive,
                hysteresis_celsius: 0.0,
            }],
        }],
        ..SysfsInventory::default()
    };
    let mut config = ThermalConfig::default().throttle;
    config.trip_hysteresis_celsius = HYSTERESIS;
    config.max_gap = Duration::from_millis(GAP_MS);
    (ThrottleDetector::new(&config, &inventory), inventory)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn throttle_state_seconds_and_episodes_match_a_hysteresis_model_across_restarts(
        actions in prop::collection::vec(throttle_action(), 1..120)
    ) {
        let (mut real, inventory) = detector();
        let mut sink = CollectingSink::default();
        // Model: state, episode start, seconds, time of the last observation.
        let mut throttled = false;
        let mut started_ms = 0u64;
        let mut seconds = 0.0f64;
        let mut last_ms: Option<u64> = None;
        let mut durations: Vec<f64> = Vec::new();
        let mut ms = 0u64;
        for action in actions {
            match action {
                ThrottleAction::Read { dt_ms, quarter_degrees } => {
                    ms += dt_ms;
                    let celsius = quarter_degrees.map(|q| TRIP + f64::from(q) / 4.0);
                    let mut snapshot = SysfsSnapshot::shaped_like(&inventory);
                    snapshot.zone_celsius[0] = celsius;
                    real.observe_sysfs(&snapshot, now(ms), &mut sink);

                    if let Some(last) = last_ms
                        && throttled
                        && ms - last <= GAP_MS
                    {
                        seconds += (ms - last) as f64 / 1e3;
                    }
                    last_ms = Some(ms);
                    match celsius {
                        Some(c) if !throttled && c >= TRIP => {
                            throttled = true;
                            started_ms = ms;
                        }
                        Some(c) if throttled && c < TRIP - HYSTERESIS => {
                            throttled = false;
                            durations.push((ms - started_ms) as f64 / 1e3);
                        }
                        _ => {}
                    }
                }
                ThrottleAction::AgentRestart => {
                    (real, _) = detector();
                    throttled = false;
                    seconds = 0.0;
                    last_ms = None;
                }
            }
            prop_assert_eq!(real.is_throttled(Component::Gpu), throttled);
            let got = real.throttled_seconds()[1];
            prop_assert!((got - seconds).abs() < 1e-6, "{} != {}", got, seconds);
        }
        // Episodes alternate start, end, start, ... within each agent run, and every end
        // carries the model's duration; all of them are SLO-tier.
        let events = throttles(&sink.events);
        prop_assert!(events.iter().all(|(tier, _, _)| *tier == Tier::Slo));
        let ends: Vec<f64> = events
            .iter()
            .filter(|(_, started, _)| !started)
            .map(|(_, _, t)| t.duration_seconds.unwrap())
            .collect();
        prop_assert_eq!(ends.len(), durations.len());
        for (got, want) in ends.iter().zip(&durations) {
            prop_assert!((got - want).abs() < 1e-6);
        }
    }
}

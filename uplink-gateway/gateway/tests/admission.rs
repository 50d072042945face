//! What the ingest path admits, in-process against a real store: every event whole or refused
//! whole, a machine's live series within its budget once stale ones retired (in event time), a
//! run that never goes down, baselines only where they cannot mislead, and every refused sample
//! in the refusal series. A model of the series lifecycle runs against the store through
//! deliveries in any time order, redeliveries and restarts.
//!
//! The proptest shortens the budget and the retire time to reach its cases in a few events; the
//! rollout tests of `sli_truth.rs` run the same rules at the packaged defaults.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use edgewatch_gateway::config::IngestConfig;
use edgewatch_gateway::ingest::{Incoming, IngestReport, Ingestor};
use edgewatch_gateway::store::{RawSeries, Store};
use edgewatch_proto::framing::encode_batch;
use edgewatch_proto::v1::{Batch, DeadlineCounters, Event, LoopRef, ModelVersion, Tier, event};
use edgewatch_slo::names::{metric, refusal};
use edgewatch_slo::series::{Window, increase};
use proptest::prelude::*;

const ARRIVAL: i64 = 1_800_000_000_000_000_000;
const MIN_MS: i64 = 60_000;
/// Event times of the tests, in minutes before arrival.
const T0_MS: i64 = ARRIVAL / 1_000_000 - 1_000 * MIN_MS;

fn open_ingestor(dir: &std::path::Path, budget: u32, retire_after: Duration) -> Ingestor {
    let config = IngestConfig {
        max_series_per_machine: budget,
        series_retire_after: retire_after,
        ..IngestConfig::default()
    };
    Ingestor::new(Store::open_path(&dir.join("store.redb")).unwrap(), config).unwrap()
}

/// Deadline counters of `loop_name` under model version `version`, whose series started at
/// `start_min`, stamped `minute` (both minutes after `T0_MS`).
fn counters(
    seq: u64,
    minute: i64,
    loop_name: &str,
    version: &str,
    start_min: i64,
    cycles: u64,
    misses: u64,
) -> Event {
    Event {
        seq,
        event_time_unix_ns: (T0_MS + minute * MIN_MS) * 1_000_000,
        monotonic_ns: seq,
        kind: Some(event::Kind::DeadlineCounters(DeadlineCounters {
            control_loop: Some(LoopRef {
                loop_id: 1,
                loop_name: loop_name.into(),
            }),
            model: Some(ModelVersion {
                name: "det".into(),
                version: version.into(),
                ..Default::default()
            }),
            start_time_unix_ns: (T0_MS + start_min * MIN_MS) * 1_000_000,
            cycles,
            misses,
            ..Default::default()
        })),
    }
}

fn slo_batch(machine: &str, events: Vec<Event>) -> Batch {
    Batch {
        schema_version: 1,
        machine_id: machine.into(),
        site_id: "pit-3".into(),
        agent_epoch: 1,
        tier: Tier::Slo as i32,
        first_seq: events.first().map_or(0, |e| e.seq),
        last_seq: events.last().map_or(0, |e| e.seq),
        sent_time_unix_ns: ARRIVAL,
        events,
        machine_class: "haul".into(),
        agent_version: String::new(),
    }
}

fn deliver(ingestor: &mut Ingestor, batches: &[Batch]) -> IngestReport {
    let encoded: Vec<(String, Vec<u8>)> = batches
        .iter()
        .map(|b| {
            (
                format!("edgewatch/v1/pit-3/{}/slo", b.machine_id),
                encode_batch(b).unwrap(),
            )
        })
        .collect();
    let incoming: Vec<Incoming<'_>> = encoded
        .iter()
        .map(|(topic, payload)| Incoming { topic, payload })
        .collect();
    ingestor.ingest(&incoming, ARRIVAL).unwrap()
}

fn series(store: &Store, metric: &str) -> Vec<RawSeries> {
    store.query(metric, 0, i64::MAX).unwrap()
}

fn label<'a>(series: &'a RawSeries, name: &str) -> &'a str {
    series
        .labels
        .iter()
        .find(|(n, _)| n == name)
        .map_or("", |(_, v)| v.as_str())
}

/// Refused samples per (reason, refused series name), summed over every refusal series.
fn refused(store: &Store) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for s in series(store, metric::REFUSED_SAMPLES) {
        let window = Window {
            start_ms: i64::MIN / 2,
            end_ms: i64::MAX / 2,
        };
        *out.entry((
            label(&s, "reason").to_owned(),
            label(&s, "series").to_owned(),
        ))
        .or_insert(0.0) += increase(&s.samples, window, 1);
    }
    out
}

#[test]
fn an_event_whose_series_do_not_all_fit_is_refused_whole_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut ingestor = open_ingestor(dir.path(), 5, Duration::from_secs(3600));
    // Four series (cycles, misses, skipped, and the activations of an agent from before
    // deadline semantics) of one loop fit; the next loop's four do not, although one place is
    // left: cycles alone would be stored and misses refused.
    let report = deliver(
        &mut ingestor,
        &[slo_batch(
            "m",
            vec![
                counters(1, 10, "safety", "1.0", 0, 100, 1),
                counters(2, 10, "assistive", "1.0", 0, 100, 7),
            ],
        )],
    );
    assert_eq!(report.stats.events_refused_for(refusal::SERIES_BUDGET), 1);
    assert_eq!(report.stats.samples_refused_for(refusal::SERIES_BUDGET), 4);
    let store = ingestor.store();
    for metric in [metric::CONTROL_CYCLES, metric::CONTROL_MISSED] {
        let stored = series(store, metric);
        assert_eq!(stored.len(), 1, "{metric}: only the safety loop");
        assert_eq!(label(&stored[0], "loop"), "safety");
    }
    let refused = refused(store);
    assert_eq!(
        refused[&(
            "series_budget".to_owned(),
            metric::CONTROL_MISSED.to_owned()
        )],
        1.0
    );
    assert_eq!(refused.values().sum::<f64>(), 4.0);
    assert!(
        store.dead_letters().unwrap().is_empty(),
        "the budget is not the event's fault"
    );
}

#[test]
fn a_series_not_written_for_the_retire_time_of_event_time_makes_room_and_comes_back_when_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut ingestor = open_ingestor(dir.path(), 4, Duration::from_secs(3600));
    let batches = [
        slo_batch("m", vec![counters(1, 10, "safety", "1.0", 0, 100, 1)]),
        // An hour and a minute later in event time, version 2.0 needs the four places.
        slo_batch("m", vec![counters(2, 71, "safety", "2.0", 70, 100, 2)]),
        // 1.0 again (a rollback, or its backlog): retired, admitted again like a new series
        // once 2.0 has not been written for an hour.
        slo_batch("m", vec![counters(3, 200, "safety", "1.0", 0, 900, 5)]),
    ];
    let report = deliver(&mut ingestor, &batches);
    assert_eq!(report.stats.series_retired, 8);
    assert_eq!(report.stats.events_refused.iter().sum::<u64>(), 0);
    let cycles = series(ingestor.store(), metric::CONTROL_CYCLES);
    let version_1 = cycles
        .iter()
        .find(|s| label(s, "model_version") == "1.0")
        .unwrap();
    assert_eq!(
        version_1.samples,
        vec![
            (T0_MS, 0.0),
            (T0_MS + 10 * MIN_MS, 100.0),
            (T0_MS + 200 * MIN_MS, 900.0)
        ],
        "retiring deleted nothing"
    );

    // Within the retire time, no room is made: refused.
    let dir = tempfile::tempdir().unwrap();
    let mut ingestor = open_ingestor(dir.path(), 4, Duration::from_secs(3600));
    let report = deliver(
        &mut ingestor,
        &[
            slo_batch("m", vec![counters(1, 10, "safety", "1.0", 0, 100, 1)]),
            slo_batch("m", vec![counters(2, 69, "safety", "2.0", 60, 100, 2)]),
        ],
    );
    assert_eq!(report.stats.series_retired, 0);
    assert_eq!(report.stats.events_refused_for(refusal::SERIES_BUDGET), 1);
}

#[test]
fn a_counter_that_goes_down_within_its_run_is_dead_lettered_and_a_new_run_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut ingestor = open_ingestor(dir.path(), 100, Duration::from_secs(3600));
    let report = deliver(
        &mut ingestor,
        &[slo_batch(
            "m",
            vec![
                counters(1, 10, "safety", "1.0", 0, 1_000, 10),
                // Same start, later, fewer misses: impossible.
                counters(2, 20, "safety", "1.0", 0, 2_000, 4),
                // A new start: the counters restarted from zero.
                counters(3, 30, "safety", "1.0", 25, 500, 1),
                // An earlier sample of the newest run above a later one: impossible too.
                counters(4, 28, "safety", "1.0", 25, 900, 0),
            ],
        )],
    );
    assert_eq!(
        report.stats.events_refused_for(refusal::COUNTER_DECREASED),
        2
    );
    let letters = ingestor.store().dead_letters().unwrap();
    assert_eq!(letters.len(), 2);
    assert!(
        letters[0].reason.starts_with("counter_decreased"),
        "{}",
        letters[0].reason
    );
    let missed = series(ingestor.store(), metric::CONTROL_MISSED);
    let window = Window::ending_at(T0_MS + 60 * MIN_MS, 60 * MIN_MS);
    // 10 from the first run (counted from its zero), 1 from the second.
    assert_eq!(increase(&missed[0].samples, window, 10 * MIN_MS), 11.0);
}

#[test]
fn a_baseline_is_skipped_where_another_runs_sample_lies_between_it_and_its_value() {
    let dir = tempfile::tempdir().unwrap();
    let mut ingestor = open_ingestor(dir.path(), 100, Duration::from_secs(3600));
    // The producer restarted at minute 20; the agent noticed at minute 22 and stamped the old
    // run's last counters then, after the new run's start.
    let report = deliver(
        &mut ingestor,
        &[slo_batch(
            "m",
            vec![
                counters(1, 10, "safety", "1.0", 0, 1_000, 10),
                counters(2, 22, "safety", "1.0", 0, 2_000, 30),
                counters(3, 23, "safety", "1.0", 20, 300, 2),
            ],
        )],
    );
    assert_eq!(report.stats.baselines_skipped, 4);
    let missed = series(ingestor.store(), metric::CONTROL_MISSED);
    // A zero at minute 20 would have counted the old run's 30 again: 30 + 2, not 30 + 30 + 2.
    let window = Window::ending_at(T0_MS + 60 * MIN_MS, 60 * MIN_MS);
    assert_eq!(increase(&missed[0].samples, window, 10 * MIN_MS), 32.0);
}

#[test]
fn the_same_events_replayed_under_another_queue_epoch_write_nothing_new() {
    let dir = tempfile::tempdir().unwrap();
    let mut ingestor = open_ingestor(dir.path(), 100, Duration::from_secs(3600));
    let events = || {
        vec![
            counters(1, 10, "safety", "1.0", 5, 1_000, 10),
            counters(2, 20, "safety", "1.0", 5, 2_000, 12),
        ]
    };
    let first = deliver(&mut ingestor, &[slo_batch("m", events())]);
    assert_eq!(
        first.stats.baselines_new, 4,
        "cycles, misses, skipped, activations from 0"
    );
    // A recreated queue re-sends them with new sequence numbers: de-duplication cannot tell,
    // and every sample, baselines included, is an identical no-op.
    let mut replay = slo_batch("m", events());
    replay.agent_epoch = 2;
    let again = deliver(&mut ingestor, &[replay]);
    assert_eq!(again.stats.events_new, 2);
    assert_eq!(again.stats.samples_new, 0);
    assert_eq!(again.stats.events_refused.iter().sum::<u64>(), 0);
}

#[test]
fn refusals_of_one_series_at_one_time_arriving_apart_are_all_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut ingestor = open_ingestor(dir.path(), 100, Duration::from_secs(3600));
    for seq in 1..=3 {
        deliver(
            &mut ingestor,
            &[slo_batch(
                "m",
                vec![counters(seq, 10, "safety", "1.0", 0, 5, 9)],
            )],
        );
    }
    let refused = refused(ingestor.store());
    assert_eq!(
        refused[&(
            "bad_over_total".to_owned(),
            metric::CONTROL_CYCLES.to_owned()
        )],
        3.0
    );
}

#[test]
fn a_machines_refusals_keep_their_labels_up_to_a_bound_then_fold() {
    let dir = tempfile::tempdir().unwrap();
    let mut ingestor = open_ingestor(dir.path(), 100, Duration::from_secs(3600));
    // 40 model versions refused for misses above cycles: 4 refusal series each, past the bound
    // of 64, after which they keep only machine, reason and series name.
    let events: Vec<Event> = (1..=40u64)
        .map(|seq| counters(seq, 10, "safety", &format!("1.{seq}"), 0, 5, 9))
        .collect();
    deliver(&mut ingestor, &[slo_batch("m", events)]);
    let refusals = series(ingestor.store(), metric::REFUSED_SAMPLES);
    assert!(
        refusals.len() <= 64 + 4,
        "{} refusal series",
        refusals.len()
    );
    let total: f64 = refused(ingestor.store()).values().sum();
    assert_eq!(total, 160.0, "every refused sample still counted");
    assert!(
        refusals
            .iter()
            .any(|s| label(s, "model_version") == "unknown" && label(s, "loop").is_empty())
    );
}

/// One event of the model test: machine, loop, model version, minute.
#[derive(Debug, Clone, Copy)]
struct Step {
    machine: usize,
    loop_index: usize,
    version: usize,
    minute: i64,
}

#[derive(Debug, Clone)]
enum Action {
    /// Deliver these events, one batch each, in one group.
    Deliver(Vec<Step>),
    /// The last group again (a redelivery after a crash between commit and acknowledgement).
    Redeliver,
    /// The gateway restarts on its store (a crash before a commit loses nothing the broker
    /// would not deliver again, so it is this plus a later delivery).
    Restart,
}

fn action() -> impl Strategy<Value = Action> {
    let step = (0usize..2, 0usize..2, 0usize..4, 0i64..400).prop_map(
        |(machine, loop_index, version, minute)| Step {
            machine,
            loop_index,
            version,
            minute,
        },
    );
    prop_oneof![
        6 => prop::collection::vec(step, 1..4).prop_map(Action::Deliver),
        1 => Just(Action::Redeliver),
        1 => Just(Action::Restart),
    ]
}

/// The series lifecycle as the documentation states it, on plain maps.
#[derive(Debug, Default)]
struct Model {
    /// Per machine: newest event time, and live series (key: loop, version) → last written.
    newest: [i64; 2],
    live: [BTreeMap<(usize, usize), i64>; 2],
    /// Per machine, stored (loop, version, minute).
    stored: [BTreeSet<(usize, usize, i64)>; 2],
    /// Refused samples (one per series of a refused event).
    refused: f64,
}

/// Series one event writes: cycles, misses, skipped, and the activations of an agent from
/// before deadline semantics.
const PER_EVENT: usize = 4;
const BUDGET: u32 = 2 * PER_EVENT as u32;
const RETIRE_MIN: i64 = 60;

impl Model {
    fn apply(&mut self, step: Step) {
        let m = step.machine;
        let key = (step.loop_index, step.version);
        self.newest[m] = self.newest[m].max(step.minute);
        if !self.live[m].contains_key(&key) {
            // One event: all its series new or all live.
            if (self.live[m].len() + 1) * PER_EVENT > BUDGET as usize {
                let cutoff = self.newest[m] - RETIRE_MIN;
                self.live[m].retain(|_, last| *last >= cutoff);
            }
            if (self.live[m].len() + 1) * PER_EVENT > BUDGET as usize {
                self.refused += PER_EVENT as f64;
                return;
            }
        }
        let last = self.live[m].entry(key).or_insert(step.minute);
        *last = (*last).max(step.minute);
        self.stored[m].insert((step.loop_index, step.version, step.minute));
    }
}

const LOOPS: [&str; 2] = ["safety", "assistive"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Model: live series per machine within the budget, retired in event time. Whatever the
    /// order of event times, redeliveries and restarts, the store admits exactly the events the
    /// model admits, never half of one, and counts every refused sample.
    #[test]
    fn the_store_admits_what_the_lifecycle_model_admits(
        actions in prop::collection::vec(action(), 1..30),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let open = || open_ingestor(dir.path(), BUDGET, Duration::from_secs(RETIRE_MIN as u64 * 60));
        let mut gateway = open();
        let mut model = Model::default();
        let mut seq = [0u64; 2];
        let mut last_group: Vec<Batch> = Vec::new();
        for action in actions {
            match action {
                Action::Restart => {
                    drop(gateway);
                    gateway = open();
                }
                Action::Redeliver => {
                    let report = deliver(&mut gateway, &last_group);
                    prop_assert_eq!(report.stats.samples_new, 0);
                }
                Action::Deliver(steps) => {
                    let mut group = Vec::new();
                    for step in steps {
                        seq[step.machine] += 1;
                        // Counters that are a function of time: never down, never conflicting.
                        let cycles = 1_000 + step.minute as u64 * 100;
                        let event = counters(
                            seq[step.machine],
                            step.minute,
                            LOOPS[step.loop_index],
                            &format!("{}.0", step.version),
                            -1,
                            cycles,
                            cycles / 50,
                        );
                        group.push(slo_batch(&format!("m{}", step.machine), vec![event]));
                        model.apply(step);
                    }
                    deliver(&mut gateway, &group);
                    last_group = group;
                }
            }
            let store = gateway.store();
            let mut stored: [BTreeSet<(usize, usize, i64)>; 2] = Default::default();
            for metric in [
                metric::CONTROL_CYCLES,
                metric::CONTROL_MISSED,
                metric::CONTROL_SKIPPED,
                metric::CONTROL_LEGACY_AGENT_ACTIVATIONS,
            ] {
                let mut of_metric: [BTreeSet<(usize, usize, i64)>; 2] = Default::default();
                for s in series(store, metric) {
                    let m: usize = label(&s, "machine_id")[1..].parse().unwrap();
                    let l = LOOPS.iter().position(|n| *n == label(&s, "loop")).unwrap();
                    let v: usize = label(&s, "model_version")[..1].parse().unwrap();
                    for (ts, _) in &s.samples {
                        let minute = (ts - T0_MS) / MIN_MS;
                        // The zero at the series' start (minute −1) is no event.
                        if minute >= 0 {
                            of_metric[m].insert((l, v, minute));
                        }
                    }
                }
                if metric == metric::CONTROL_CYCLES {
                    stored = of_metric;
                } else {
                    // Never half an event: every counter of it, or none.
                    prop_assert_eq!(&of_metric, &stored, "{}", metric);
                }
            }
            prop_assert_eq!(&stored, &model.stored);
            let counted: f64 = refused(store).values().sum();
            prop_assert_eq!(counted, model.refused);
        }
    }
}

use std::collections::BTreeMap;

use edgewatch_proto::v1::{Tier, event::Kind};
use loop_probe::{CycleCounters, EventCounters, PollStats, ProbeInfo, Record, Summary};
use proptest::prelude::*;

use super::*;
use crate::CollectingSink;
use crate::deadline::config::DEFAULT_HISTOGRAM_BOUNDS_BUDGET;

/// A real header's identity (its loop name is private to the probe crate), with our fields.
fn info(epoch: u64) -> ProbeInfo {
    use std::sync::OnceLock;
    static TEMPLATE: OnceLock<ProbeInfo> = OnceLock::new();
    let t = *TEMPLATE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.probe");
        let mut wc = loop_probe::WriterConfig::new(3, "steer", 1_000_000, 800_000);
        wc.capacity = 16;
        let _w = loop_probe::ProbeWriter::create(&p, &wc).unwrap();
        *loop_probe::ProbeReader::open(&p).unwrap().info()
    });
    let mut i = t;
    i.epoch = epoch;
    i.start_ns = 1_000;
    i
}

fn settings() -> LoopSettings {
    LoopSettings {
        burst: BurstRules {
            consecutive: 3,
            window_cycles: 100,
            window_misses: 5,
        },
        histogram: HistogramBounds::BudgetMultiples(
            DEFAULT_HISTOGRAM_BOUNDS_BUDGET.into_iter().collect(),
        ),
        burst_min_interval_ns: 0,
        status_min_interval_ns: 0,
        model_name: Some("det".into()),
        autonomy_source: false,
        configured_name: String::new(),
        path: "/dev/shm/t.probe".into(),
    }
}

fn at(t: u64) -> Now {
    Now {
        wall_unix_ns: 1_700_000_000_000_000_000 + t as i64,
        monotonic_ns: t,
    }
}

fn slot(v: &str) -> loop_probe::ModelVersion {
    loop_probe::ModelVersion::new(7, v).unwrap()
}

#[test]
fn the_probe_slot_wins_and_takes_its_name_from_config_or_a_manifest_of_the_same_version() {
    let mut manifest = unknown_model();
    manifest.name.push_str("haul");
    manifest.version.push_str("2.0");
    manifest.engine_sha256.push_str("ab");
    manifest.source = ModelSource::Manifest as i32;
    let mut m = unknown_model();
    resolve_model(&mut m, Some(&slot("2.0")), Some(&manifest), None);
    assert_eq!(
        (m.name.as_str(), m.version.as_str(), m.id_hash),
        ("haul", "2.0", 7)
    );
    assert_eq!(m.engine_sha256, "ab");
    assert_eq!(m.source(), ModelSource::Probe);
    resolve_model(&mut m, Some(&slot("3.0")), Some(&manifest), None);
    assert_eq!((m.name.as_str(), m.engine_sha256.as_str()), ("", ""));
    resolve_model(&mut m, Some(&slot("3.0")), Some(&manifest), Some("planner"));
    assert_eq!(m.name, "planner");
    resolve_model(&mut m, None, Some(&manifest), Some("planner"));
    assert_eq!(
        (m.name.as_str(), m.source()),
        ("haul", ModelSource::Manifest)
    );
    resolve_model(&mut m, None, None, None);
    assert!(is_unknown(&m));
}

fn summary(cycles: u64, misses: u64) -> Summary {
    Summary {
        cycles: CycleCounters {
            cycles,
            overruns: misses,
            skipped: 0,
            max_duration_ns: 1,
            sum_duration_ns: cycles,
            activations: cycles,
            deadline_misses: 0,
        },
        events: EventCounters::default(),
        head: cycles,
        heartbeat_ns: 0,
        ..Summary::default()
    }
}

#[test]
fn counts_made_before_the_agent_first_saw_a_running_producer_are_not_attributed() {
    let mut t = LoopTracker::new(settings());
    let (mut em, mut sink) = (Emitter::new(), CollectingSink::default());
    let base = summary(1_000, 10);
    t.start_epoch(&info(9), Some((base, None)), at(5_000), &mut em, &mut sink);
    t.begin_poll(
        None,
        None,
        AutonomyMode::Unknown,
        at(6_000),
        &mut em,
        &mut sink,
    );
    t.end_poll(
        &summary(1_050, 12),
        &PollStats::default(),
        None,
        at(6_000),
        &mut em,
        &mut sink,
    );
    let (_, start, s) = t.series().next().unwrap();
    assert_eq!((s.cycles, s.misses), (50, 2));
    assert_eq!(
        start,
        at(5_000).wall_unix_ns,
        "the series starts at first sight"
    );
}

#[test]
fn a_producer_started_after_the_agent_counts_from_its_start() {
    let mut t = LoopTracker::new(settings());
    let (mut em, mut sink) = (Emitter::new(), CollectingSink::default());
    t.start_epoch(&info(9), None, at(5_000), &mut em, &mut sink);
    t.begin_poll(
        None,
        None,
        AutonomyMode::Unknown,
        at(6_000),
        &mut em,
        &mut sink,
    );
    t.end_poll(
        &summary(40, 1),
        &PollStats::default(),
        None,
        at(6_000),
        &mut em,
        &mut sink,
    );
    let (_, start, s) = t.series().next().unwrap();
    assert_eq!((s.cycles, s.misses), (40, 1));
    assert_eq!(
        start,
        at(1_000).wall_unix_ns,
        "the series starts at the producer's start"
    );
}

/// What the test producer does between polls.
#[derive(Debug, Clone)]
enum Action {
    /// Record `n` cycles, every `miss_every`-th a miss, after `skip` skipped activations.
    Record { n: u64, miss_every: u64, skip: u64 },
    /// Publish model `v` in the slot.
    Model(u8),
    /// The agent polls; the oldest `lose` new records were overwritten before it read them.
    Poll { lose: u64 },
    /// The periodic snapshot.
    Snapshot,
    /// The producer crashes and a new one starts (new epoch, counters from zero).
    Restart,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (1..40u64, 1..6u64, 0..3u64).prop_map(|(n, miss_every, skip)| Action::Record { n, miss_every, skip }),
        1 => (0..3u8).prop_map(Action::Model),
        3 => (0..5u64).prop_map(|lose| Action::Poll { lose }),
        1 => Just(Action::Snapshot),
        1 => Just(Action::Restart),
    ]
}

/// The producer and the plain model of what the agent must have counted.
#[derive(Default)]
struct Model {
    epoch: u64,
    next_cycle: u64,
    totals: CycleCounters,
    /// Records written since the last poll.
    unread: Vec<Record>,
    model: Option<u8>,
    /// Expected (cycles, misses, skipped) per model version label, this epoch.
    expected: BTreeMap<String, (u64, u64, u64)>,
    /// Counters at the last poll.
    polled: CycleCounters,
    /// Records the agent read this epoch (for the histogram).
    delivered: u64,
}

fn label(m: Option<u8>) -> String {
    m.map_or_else(String::new, |v| format!("v{v}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn series_add_up_to_the_header_per_model_across_loss_and_restarts(
        actions in proptest::collection::vec(action(), 1..60)
    ) {
        let mut t = LoopTracker::new(settings());
        let (mut em, mut sink) = (Emitter::new(), CollectingSink::default());
        let mut m = Model { epoch: 1, ..Model::default() };
        let mut clock = 10_000u64;
        t.start_epoch(&info(m.epoch), None, at(clock), &mut em, &mut sink);
        for a in actions {
            clock += 1_000_000;
            match a {
                Action::Record { n, miss_every, skip } => {
                    if m.totals.cycles > 0 {
                        m.next_cycle += skip;
                        m.totals.skipped += skip;
                    }
                    for i in 0..n {
                        let miss = i % miss_every == 0;
                        let duration = if miss { 900_000 } else { 100_000 };
                        m.totals.cycles += 1;
                        m.totals.overruns += u64::from(miss);
                        m.totals.sum_duration_ns += duration;
                        m.totals.max_duration_ns = m.totals.max_duration_ns.max(duration);
                        m.unread.push(Record {
                            index: m.totals.cycles - 1,
                            cycle: m.next_cycle,
                            release_ns: clock,
                            start_ns: clock + 10,
                            duration_ns: duration,
                            budget_ns: 800_000,
                            loop_id: 3,
                            flags: if miss { loop_probe::FLAG_OVERRUN } else { 0 },
                        });
                        m.next_cycle += 1;
                    }
                }
                Action::Model(v) => m.model = Some(v),
                Action::Poll { lose } => {
                    let s = m.model.map(|v| slot(&format!("v{v}")));
                    t.begin_poll(s.as_ref(), None, AutonomyMode::Unknown, at(clock), &mut em, &mut sink);
                    let lose = lose.min(m.unread.len() as u64);
                    for r in m.unread.iter().skip(lose as usize) {
                        t.record(r);
                    }
                    m.delivered += m.unread.len() as u64 - lose;
                    m.unread.clear();
                    let summary = Summary { cycles: m.totals, events: EventCounters::default(), head: m.totals.cycles, heartbeat_ns: clock, ..Summary::default() };
                    let stats = PollStats { lost: lose, ..PollStats::default() };
                    t.end_poll(&summary, &stats, None, at(clock), &mut em, &mut sink);
                    let e = m.expected.entry(label(m.model)).or_default();
                    e.0 += m.totals.cycles - m.polled.cycles;
                    e.1 += m.totals.overruns - m.polled.overruns;
                    e.2 += m.totals.skipped - m.polled.skipped;
                    m.polled = m.totals;
                    // The invariant: per model, the series hold exactly the header's deltas.
                    let mut got: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
                    let mut histogram = 0;
                    for (model, _, s) in t.series() {
                        got.insert(model.version.clone(), (s.cycles, s.misses, s.skipped));
                        histogram += s.histogram.total();
                    }
                    let want: BTreeMap<_, _> = m.expected.iter().filter(|(_, v)| **v != (0, 0, 0)).map(|(k, v)| (k.clone(), *v)).collect();
                    let got: BTreeMap<_, _> = got.into_iter().filter(|(_, v)| *v != (0, 0, 0)).collect();
                    prop_assert_eq!(got, want);
                    prop_assert_eq!(histogram, m.delivered);
                }
                Action::Snapshot => t.snapshot(at(clock), &mut em, &mut sink),
                Action::Restart => {
                    t.end_epoch(at(clock), &mut em, &mut sink);
                    // The last report of each series of the old epoch holds its final counts.
                    let mut last: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
                    for (_, e) in &sink.events {
                        if let Some(Kind::DeadlineCounters(c)) = &e.kind
                            && c.producer_epoch == m.epoch
                        {
                            last.insert(c.model.as_ref().unwrap().version.clone(), (c.cycles, c.misses, c.skipped));
                        }
                    }
                    let want: BTreeMap<_, _> = m.expected.iter().filter(|(_, v)| v.0 + v.2 > 0).map(|(k, v)| (k.clone(), *v)).collect();
                    prop_assert_eq!(last, want);
                    m = Model { epoch: m.epoch + 1, model: None, ..Model::default() };
                    t.start_epoch(&info(m.epoch), None, at(clock), &mut em, &mut sink);
                }
            }
        }
        // Nothing is ever reported with zero counts, and every counter event is SLO tier.
        for (tier, e) in &sink.events {
            if let Some(Kind::DeadlineCounters(c)) = &e.kind {
                prop_assert_eq!(*tier, Tier::Slo);
                prop_assert!(c.cycles + c.skipped > 0);
            }
        }
    }
}

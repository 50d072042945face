use std::collections::BTreeMap;

use edgewatch_proto::v1::{Tier, event::Kind};
use loop_probe::{CycleCounters, EventCounters, LastRecord, PollStats, ProbeInfo, Record, Summary};
use proptest::prelude::*;
use prost::Message;

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

/// A header of `cycles` cycles, `overruns` of them over budget, none late or skipped, the last
/// released at `last_release_ns`.
fn summary(cycles: u64, overruns: u64, last_release_ns: u64) -> Summary {
    Summary {
        cycles: CycleCounters {
            cycles,
            overruns,
            skipped: 0,
            max_duration_ns: 1,
            sum_duration_ns: cycles,
            activations: cycles,
            deadline_misses: 0,
        },
        events: EventCounters::default(),
        head: cycles,
        heartbeat_ns: last_release_ns,
        last_record: Some(LastRecord {
            cycle: cycles - 1,
            release_ns: last_release_ns,
        }),
        ..Summary::default()
    }
}

#[test]
fn counts_made_before_the_agent_first_saw_a_running_producer_are_not_attributed() {
    let mut t = LoopTracker::new(settings());
    let (mut em, mut sink) = (Emitter::new(), CollectingSink::default());
    let base = summary(1_000, 10, 5_000);
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
        &summary(1_050, 12, 6_000),
        &PollStats::default(),
        None,
        true,
        at(6_000),
        &mut em,
        &mut sink,
    );
    let (_, start, s) = t.series().next().unwrap();
    assert_eq!((s.cycles, s.overruns, s.activations), (50, 2, 50));
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
        &summary(40, 1, 6_000),
        &PollStats::default(),
        None,
        true,
        at(6_000),
        &mut em,
        &mut sink,
    );
    let (_, start, s) = t.series().next().unwrap();
    assert_eq!((s.cycles, s.overruns, s.activations), (40, 1, 40));
    assert_eq!(
        start,
        at(1_000).wall_unix_ns,
        "the series starts at the producer's start"
    );
}

/// What the test producer does between polls.
#[derive(Debug, Clone)]
enum Action {
    /// Record `n` cycles after `skip` skipped activations: every `miss_every`-th over budget,
    /// every `late_every`-th completing past its deadline.
    Record {
        n: u64,
        miss_every: u64,
        late_every: u64,
        skip: u64,
    },
    /// Publish model `v` in the slot.
    Model(u8),
    /// The agent polls; the oldest `lose` new records were overwritten before it read them;
    /// the producer holds its lock (else it is dead, and owes nothing).
    Poll { lose: u64, holds_lock: bool },
    /// The periodic snapshot.
    Snapshot,
    /// The producer crashes and a new one starts (new epoch, counters from zero).
    Restart,
    /// The agent is SIGKILLed and started again: a new tracker takes the state kept last (the
    /// shell keeps it after every pass that emitted, in the events' transaction), finds the same
    /// producer running, and reads its whole ring again.
    AgentCrash,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (1..40u64, 1..6u64, 1..7u64, 0..3u64).prop_map(|(n, miss_every, late_every, skip)| {
            Action::Record { n, miss_every, late_every, skip }
        }),
        1 => (0..3u8).prop_map(Action::Model),
        3 => (0..5u64, proptest::bool::weighted(0.8))
            .prop_map(|(lose, holds_lock)| Action::Poll { lose, holds_lock }),
        1 => Just(Action::Snapshot),
        1 => Just(Action::Restart),
        1 => Just(Action::AgentCrash),
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
    /// Expected (cycles, overruns, skipped) per model version label, this epoch.
    expected: BTreeMap<String, (u64, u64, u64)>,
    /// Counters at the last poll.
    polled: CycleCounters,
    /// Records the agent read this epoch (for the histogram).
    delivered: u64,
    /// Activations and deadline misses the agent must have counted this epoch: the largest
    /// header total plus what was overdue, over the polls.
    counted: (u64, u64),
    /// The last record written.
    last: Option<LastRecord>,
    /// Every record of the epoch (the ring, never overwritten here).
    ring: Vec<Record>,
}

/// What the agent kept last, and the model's expectations as of then: a crash takes both back.
struct Kept {
    state: Vec<u8>,
    expected: BTreeMap<String, (u64, u64, u64)>,
    polled: CycleCounters,
    delivered: u64,
    counted: (u64, u64),
    records_read: u64,
}

fn label(m: Option<u8>) -> String {
    m.map_or_else(String::new, |v| format!("v{v}"))
}

/// The template's period and deadline (1 ms each).
const PERIOD: u64 = 1_000_000;

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
        let mut kept: Option<Kept> = None;
        let mut read_up_to = 0u64;
        for a in actions {
            clock += PERIOD;
            let emitted_before = sink.events.len();
            let is_crash = matches!(a, Action::AgentCrash);
            match a {
                Action::Record { n, miss_every, late_every, skip } => {
                    if m.totals.cycles > 0 {
                        m.next_cycle += skip;
                        m.totals.skipped += skip;
                        m.totals.activations += skip;
                        m.totals.deadline_misses += skip;
                    }
                    for i in 0..n {
                        let miss = i % miss_every == 0;
                        let late = i % late_every == 1;
                        let duration = if miss { 900_000 } else { 100_000 };
                        let release = clock + i * 10;
                        let start = if late { release + PERIOD } else { release + 10 };
                        m.totals.cycles += 1;
                        m.totals.activations += 1;
                        m.totals.overruns += u64::from(miss);
                        m.totals.deadline_misses += u64::from(late);
                        m.totals.sum_duration_ns += duration;
                        m.totals.max_duration_ns = m.totals.max_duration_ns.max(duration);
                        m.last = Some(LastRecord { cycle: m.next_cycle, release_ns: release });
                        let mut flags = 0;
                        if miss {
                            flags |= loop_probe::FLAG_OVERRUN;
                        }
                        if late {
                            flags |= loop_probe::FLAG_DEADLINE_MISS;
                        }
                        let record = Record {
                            index: m.totals.cycles - 1,
                            cycle: m.next_cycle,
                            release_ns: release,
                            start_ns: start,
                            duration_ns: duration,
                            budget_ns: 800_000,
                            loop_id: 3,
                            flags,
                        };
                        m.unread.push(record);
                        m.ring.push(record);
                        m.next_cycle += 1;
                    }
                }
                Action::Model(v) => m.model = Some(v),
                Action::Poll { lose, holds_lock } => {
                    let s = m.model.map(|v| slot(&format!("v{v}")));
                    t.begin_poll(s.as_ref(), None, AutonomyMode::Unknown, at(clock), &mut em, &mut sink);
                    let lose = lose.min(m.unread.len() as u64);
                    for r in m.unread.iter().skip(lose as usize) {
                        t.record(r);
                        // Records a restarted agent reads again, below what it read, are skipped.
                        if r.index >= read_up_to {
                            m.delivered += 1;
                        }
                    }
                    if let Some(r) = m.unread.last() {
                        read_up_to = read_up_to.max(r.index + 1);
                    }
                    m.unread.clear();
                    let summary = Summary { cycles: m.totals, events: EventCounters::default(), head: m.totals.cycles, heartbeat_ns: clock, last_record: m.last, ..Summary::default() };
                    let stats = PollStats { lost: lose, ..PollStats::default() };
                    t.end_poll(&summary, &stats, None, holds_lock, at(clock), &mut em, &mut sink);
                    let e = m.expected.entry(label(m.model)).or_default();
                    e.0 += m.totals.cycles - m.polled.cycles;
                    e.1 += m.totals.overruns - m.polled.overruns;
                    e.2 += m.totals.skipped - m.polled.skipped;
                    m.polled = m.totals;
                    let owed = if holds_lock && m.totals.cycles > 0 {
                        super::super::provisional::overdue_activations(clock, m.last.unwrap().release_ns, PERIOD, PERIOD)
                    } else {
                        0
                    };
                    m.counted.0 = m.counted.0.max(m.totals.activations + owed);
                    m.counted.1 = m.counted.1.max(m.totals.deadline_misses + owed);
                    // The invariant: per model, the series hold exactly the header's deltas.
                    let mut got: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
                    let mut histogram = 0;
                    let mut counted = (0, 0);
                    for (model, _, s) in t.series() {
                        got.insert(model.version.clone(), (s.cycles, s.overruns, s.skipped));
                        histogram += s.histogram.total();
                        counted.0 += s.activations;
                        counted.1 += s.deadline_misses;
                    }
                    let want: BTreeMap<_, _> = m.expected.iter().filter(|(_, v)| **v != (0, 0, 0)).map(|(k, v)| (k.clone(), *v)).collect();
                    let got: BTreeMap<_, _> = got.into_iter().filter(|(_, v)| *v != (0, 0, 0)).collect();
                    prop_assert_eq!(got, want);
                    prop_assert_eq!(histogram, m.delivered);
                    // And activations and deadline misses add up to max(header + overdue) so far.
                    prop_assert_eq!(counted, m.counted);
                    prop_assert_eq!(t.counts().activations, m.counted.0);
                    prop_assert_eq!(t.counts().deadline_misses, Some(m.counted.1));
                }
                Action::Snapshot => t.snapshot(at(clock), &mut em, &mut sink),
                Action::Restart => {
                    t.end_epoch(at(clock), &mut em, &mut sink);
                    // The last report of each series of the old epoch holds its final counts.
                    let mut last: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
                    let mut counted: BTreeMap<String, (u64, u64)> = BTreeMap::new();
                    for (_, e) in &sink.events {
                        if let Some(Kind::DeadlineCounters(c)) = &e.kind
                            && c.producer_epoch == m.epoch
                        {
                            let version = c.model.as_ref().unwrap().version.clone();
                            last.insert(version.clone(), (c.cycles, c.misses, c.skipped));
                            counted.insert(version, (c.activations.unwrap(), c.deadline_misses.unwrap()));
                        }
                    }
                    let want: BTreeMap<_, _> = m.expected.iter().filter(|(_, v)| v.0 + v.2 > 0).map(|(k, v)| (k.clone(), *v)).collect();
                    let last: BTreeMap<_, _> = last.into_iter().filter(|(_, v)| v.0 + v.2 > 0).collect();
                    prop_assert_eq!(last, want);
                    let total = counted.values().fold((0, 0), |a, v| (a.0 + v.0, a.1 + v.1));
                    prop_assert_eq!(total, m.counted);
                    m = Model { epoch: m.epoch + 1, model: None, ..Model::default() };
                    read_up_to = 0;
                    t.start_epoch(&info(m.epoch), None, at(clock), &mut em, &mut sink);
                }
                Action::AgentCrash => {
                    // Only what the last keep wrote survives, with the events before it.
                    let Some(k) = &kept else { continue };
                    t = LoopTracker::new(settings());
                    t.restore(LoopResume::decode_kept(&k.state).unwrap());
                    let header = Summary { cycles: m.totals, events: EventCounters::default(), head: m.totals.cycles, heartbeat_ns: clock, last_record: m.last, ..Summary::default() };
                    // The producer is found running: without the kept state this header would
                    // be the baseline and earlier counts lost.
                    t.start_epoch(&info(m.epoch), Some((header, None)), at(clock), &mut em, &mut sink);
                    m.expected = k.expected.clone();
                    m.polled = k.polled;
                    m.delivered = k.delivered;
                    m.counted = k.counted;
                    read_up_to = k.records_read;
                    // A new reader starts at the oldest record the ring holds: here, all of them.
                    m.unread = m.ring.clone();
                }
            }
            if sink.events.len() > emitted_before && !is_crash {
                // The shell keeps the state after a pass that emitted.
                let state = t.kept_state().encode_to_vec();
                let records_read = t.kept_state().records_read;
                kept = Some(Kept {
                    state,
                    expected: m.expected.clone(),
                    polled: m.polled,
                    delivered: m.delivered,
                    counted: m.counted,
                    records_read,
                });
            }
        }
        // Nothing is ever reported with zero counts, every counter event is SLO tier, and within
        // a series activations and deadline misses never go down (across agent crashes too) and
        // hold what the header held, and a series keeps its start.
        let mut seen: BTreeMap<(u64, String), (u64, u64)> = BTreeMap::new();
        let mut starts: BTreeMap<(u64, String), i64> = BTreeMap::new();
        for (tier, e) in &sink.events {
            if let Some(Kind::DeadlineCounters(c)) = &e.kind {
                prop_assert_eq!(*tier, Tier::Slo);
                let (a, d) = (c.activations.unwrap(), c.deadline_misses.unwrap());
                prop_assert!(c.cycles + c.skipped + a > 0);
                // (Activations are at least cycles + skipped over an epoch's series, checked at
                // each poll above, but not per series: what was counted provisionally under one
                // model is repaid by the probe's counts under the model of the poll that sees
                // the recovery.)
                prop_assert!(d <= a);
                prop_assert_eq!(c.overruns, Some(c.misses));
                prop_assert_eq!(c.semantics(), v1::DeadlineSemantics::Completion);
                let key = (c.producer_epoch, c.model.as_ref().unwrap().version.clone());
                let start = *starts.entry(key.clone()).or_insert(c.start_time_unix_ns);
                prop_assert_eq!(start, c.start_time_unix_ns, "a series changed its start");
                let before = seen.insert(key, (a, d)).unwrap_or((0, 0));
                prop_assert!(a >= before.0 && d >= before.1, "went down: {:?} -> {:?}", before, (a, d));
            }
        }
    }
}

/// One poll of a producer holding no lock (so nothing is owed) whose header says `cycles`, its
/// last cycle released (and its heartbeat) at `heartbeat`.
fn poll_at(
    t: &mut LoopTracker,
    em: &mut Emitter,
    sink: &mut CollectingSink,
    clock: u64,
    cycles: u64,
    heartbeat: u64,
) {
    t.begin_poll(None, None, AutonomyMode::Unknown, at(clock), em, sink);
    let header = summary(cycles, 0, heartbeat);
    t.end_poll(
        &header,
        &PollStats::default(),
        None,
        false,
        at(clock),
        em,
        sink,
    );
}

/// Event times of the `DeadlineCounters` emitted so far.
fn counter_times(sink: &CollectingSink) -> Vec<i64> {
    sink.events
        .iter()
        .filter(|(_, e)| matches!(e.kind, Some(Kind::DeadlineCounters(_))))
        .map(|(_, e)| e.event_time_unix_ns)
        .collect()
}

#[test]
fn an_epochs_last_values_are_stamped_at_its_last_heartbeat_after_its_last_report() {
    const S: u64 = 1_000_000_000;
    let mut t = LoopTracker::new(settings());
    let (mut em, mut sink) = (Emitter::new(), CollectingSink::default());
    t.start_epoch(&info(9), None, at(S / 1000), &mut em, &mut sink);
    poll_at(&mut t, &mut em, &mut sink, 2 * S, 40, 2 * S);
    poll_at(&mut t, &mut em, &mut sink, 5 * S, 100, 3 * S);
    // The agent sees the end at 10 s; the producer's last heartbeat was at 3 s.
    t.end_epoch(at(10 * S), &mut em, &mut sink);
    assert_eq!(
        counter_times(&sink),
        [at(2 * S).wall_unix_ns, at(3 * S).wall_unix_ns],
        "first value at once, last at the last heartbeat"
    );

    // A report after the last heartbeat (a hung loop's snapshot): the last values follow it by a
    // millisecond, the gateway's resolution, so the two never share a timestamp.
    let mut t = LoopTracker::new(settings());
    let mut sink = CollectingSink::default();
    t.start_epoch(&info(10), None, at(S / 1000), &mut em, &mut sink);
    poll_at(&mut t, &mut em, &mut sink, 2 * S, 40, 2 * S);
    poll_at(&mut t, &mut em, &mut sink, 5 * S, 100, 3 * S);
    t.snapshot(at(6 * S), &mut em, &mut sink);
    poll_at(&mut t, &mut em, &mut sink, 7 * S, 120, 3 * S);
    t.end_epoch(at(10 * S), &mut em, &mut sink);
    let times = counter_times(&sink);
    assert_eq!(
        times[times.len() - 2..],
        [at(6 * S).wall_unix_ns, at(6 * S + 1_000_000).wall_unix_ns]
    );
    // Never later than the poll that ends the epoch.
    let mut t = LoopTracker::new(settings());
    let mut sink = CollectingSink::default();
    t.start_epoch(&info(11), None, at(S / 1000), &mut em, &mut sink);
    poll_at(&mut t, &mut em, &mut sink, 2 * S, 40, 2 * S);
    poll_at(
        &mut t,
        &mut em,
        &mut sink,
        2 * S + 200_000,
        41,
        2 * S + 100_000,
    );
    t.end_epoch(at(2 * S + 300_000), &mut em, &mut sink);
    let times = counter_times(&sink);
    assert_eq!(times.last(), Some(&at(2 * S + 300_000).wall_unix_ns));
}

#[test]
fn a_kept_state_of_another_producer_is_not_resumed_but_names_the_restart() {
    let mut t = LoopTracker::new(settings());
    let (mut em, mut sink) = (Emitter::new(), CollectingSink::default());
    t.start_epoch(&info(9), None, at(1_000), &mut em, &mut sink);
    poll_at(&mut t, &mut em, &mut sink, 2_000_000, 40, 2_000_000);
    let kept = t.kept_state().encode_to_vec();

    // The agent restarts and finds another producer: it counts from first sight, and reports
    // the restart it missed.
    let mut t = LoopTracker::new(settings());
    let mut sink = CollectingSink::default();
    t.restore(LoopResume::decode_kept(&kept).unwrap());
    let base = summary(500, 0, 3_000_000);
    t.start_epoch(
        &info(10),
        Some((base, None)),
        at(3_000_000),
        &mut em,
        &mut sink,
    );
    poll_at(&mut t, &mut em, &mut sink, 4_000_000, 510, 4_000_000);
    let (_, _, s) = t.series().next().unwrap();
    assert_eq!(s.cycles, 10);
    assert!(sink.events.iter().any(|(_, e)| matches!(
        &e.kind,
        Some(Kind::ProbeStatus(p)) if p.state() == ProbeState::Restarted
    )));

    // The same producer: the series goes on from what was kept, the gap credited once.
    let mut t = LoopTracker::new(settings());
    let mut sink = CollectingSink::default();
    t.restore(LoopResume::decode_kept(&kept).unwrap());
    let base = summary(500, 0, 3_000_000);
    t.start_epoch(
        &info(9),
        Some((base, None)),
        at(3_000_000),
        &mut em,
        &mut sink,
    );
    poll_at(&mut t, &mut em, &mut sink, 4_000_000, 510, 4_000_000);
    let (_, start, s) = t.series().next().unwrap();
    assert_eq!((s.cycles, s.activations), (510, 510));
    assert_eq!(start, at(1_000).wall_unix_ns, "the series keeps its start");
    assert!(
        sink.events.is_empty(),
        "nothing to report at once: {:?}",
        sink.events
    );
}

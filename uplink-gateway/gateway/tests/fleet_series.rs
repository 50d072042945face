//! The fleet series the ingest path writes, in-process against a real store: each machine's
//! online state from its status messages, its last event time and last arrival from its
//! batches, its backlog per tier from its health reports, and the first and last event time of
//! each model version it ran. Only what changed is written, so a redelivery or a replay at the
//! same arrival writes nothing new. (`tests/fleet.rs` reads them back through `fleet` at the
//! packaged defaults.)

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use edgewatch_gateway::config::IngestConfig;
use edgewatch_gateway::ingest::{Incoming, IngestReport, Ingestor};
use edgewatch_gateway::store::{RawSeries, Store};
use edgewatch_proto::framing::encode_batch;
use edgewatch_proto::topic::{batch_topic, status_topic};
use edgewatch_proto::v1::{
    AgentHealth, AutonomySeconds, Batch, Event, MachineStatus, ModeSeconds, ModelVersion,
    QueueLoss, Tier, TierHealth, event,
};
use edgewatch_slo::names::{ONLINE_REFRESH_MS, label, metric};
use prost::Message as _;

const ARRIVAL: i64 = 1_800_000_000_000_000_000;
const MS: i64 = 1_000_000;
const MINUTE: i64 = 60_000 * MS;

fn ingestor(dir: &std::path::Path) -> Ingestor {
    Ingestor::new(
        Store::open_path(&dir.join("store.redb")).unwrap(),
        IngestConfig::default(),
    )
    .unwrap()
}

fn batch(
    machine: &str,
    class: &str,
    tier: Tier,
    first_seq: u64,
    kinds: Vec<(i64, event::Kind)>,
) -> Batch {
    let events: Vec<Event> = kinds
        .into_iter()
        .enumerate()
        .map(|(i, (time, kind))| Event {
            seq: first_seq + i as u64,
            event_time_unix_ns: time,
            monotonic_ns: 1,
            kind: Some(kind),
        })
        .collect();
    Batch {
        schema_version: 1,
        machine_id: machine.into(),
        site_id: "pit-3".into(),
        agent_epoch: 4,
        tier: tier as i32,
        first_seq,
        last_seq: first_seq + events.len() as u64 - 1,
        sent_time_unix_ns: ARRIVAL,
        events,
        machine_class: class.into(),
        agent_version: "0.1.0".into(),
    }
}

fn autonomy(version: &str, seconds: f64) -> event::Kind {
    event::Kind::AutonomySeconds(AutonomySeconds {
        start_time_unix_ns: ARRIVAL - 600 * MINUTE,
        modes: vec![ModeSeconds { mode: 1, seconds }],
        model: Some(ModelVersion {
            name: "det".into(),
            version: version.into(),
            ..Default::default()
        }),
    })
}

fn health(slo_records: u64, debug_bytes: u64) -> event::Kind {
    event::Kind::AgentHealth(AgentHealth {
        tiers: vec![
            TierHealth {
                tier: Tier::Safety as i32,
                ..Default::default()
            },
            TierHealth {
                tier: Tier::Slo as i32,
                records: slo_records,
                bytes: slo_records * 100,
                ..Default::default()
            },
            TierHealth {
                tier: Tier::Debug as i32,
                records: 9,
                bytes: debug_bytes,
                ..Default::default()
            },
        ],
        ..Default::default()
    })
}

enum Message {
    Batch(Batch),
    Status { machine: &'static str, online: bool },
}

fn deliver(ingestor: &mut Ingestor, messages: &[Message], arrival: i64) -> IngestReport {
    let encoded: Vec<(String, Vec<u8>)> = messages
        .iter()
        .map(|m| match m {
            Message::Batch(b) => (
                batch_topic(&b.site_id, &b.machine_id, Tier::try_from(b.tier).unwrap()).unwrap(),
                encode_batch(b).unwrap(),
            ),
            Message::Status { machine, online } => (
                status_topic("pit-3", machine),
                MachineStatus {
                    schema_version: 1,
                    machine_id: (*machine).into(),
                    site_id: "pit-3".into(),
                    online: *online,
                    time_unix_ns: arrival - MINUTE,
                    agent_epoch: 4,
                    agent_version: "0.1.0".into(),
                    machine_class: "haul".into(),
                }
                .encode_to_vec(),
            ),
        })
        .collect();
    let incoming: Vec<Incoming<'_>> = encoded
        .iter()
        .map(|(topic, payload)| Incoming { topic, payload })
        .collect();
    ingestor.ingest(&incoming, arrival).unwrap()
}

/// A series as (its labels other than the base ones, its samples).
type OwnSeries = (Vec<(String, String)>, Vec<(i64, f64)>);

/// Every sample of `metric` of machine `m`, as (labels other than the base ones, samples).
fn samples(store: &Store, metric: &str, m: &str) -> Vec<OwnSeries> {
    store
        .query_machine(metric, 0, i64::MAX, m)
        .unwrap()
        .into_iter()
        .map(
            |RawSeries {
                 labels, samples, ..
             }| {
                let own = labels
                    .into_iter()
                    .filter(|(n, _)| {
                        ![label::MACHINE_ID, label::SITE, label::MACHINE_CLASS]
                            .contains(&n.as_str())
                    })
                    .collect();
                (own, samples)
            },
        )
        .collect()
}

fn seconds(ns: i64) -> f64 {
    ns.div_euclid(MS) as f64 / 1000.0
}

fn ms(ns: i64) -> i64 {
    ns.div_euclid(MS)
}

#[test]
fn a_machines_status_batches_and_health_reports_become_its_fleet_series() {
    let dir = tempfile::tempdir().unwrap();
    let mut gateway = ingestor(dir.path());
    let t = |minutes: i64| ARRIVAL - 100 * MINUTE + minutes * MINUTE + 123 * MS;
    let first = [
        Message::Status {
            machine: "m",
            online: true,
        },
        Message::Batch(batch(
            "m",
            "haul",
            Tier::Slo,
            1,
            vec![
                (t(10), autonomy("1.0", 60.0)),
                (t(20), autonomy("1.0", 120.0)),
                (t(21), health(12, 4_096)),
                (t(30), autonomy("2.0", 30.0)),
            ],
        )),
    ];
    deliver(&mut gateway, &first, ARRIVAL);
    let store = gateway.store();
    let at = ms(ARRIVAL);
    // The online state is the group's last status, written after its batches: one stamp per
    // message, each a millisecond after the machine's previous one.
    assert_eq!(
        samples(store, metric::MACHINE_ONLINE, "m"),
        vec![(vec![], vec![(at + 1, 1.0)])]
    );
    assert_eq!(
        samples(store, metric::MACHINE_LAST_ARRIVAL, "m"),
        vec![(vec![], vec![(at, seconds(ARRIVAL))])]
    );
    assert_eq!(
        samples(store, metric::MACHINE_LAST_EVENT, "m"),
        vec![(vec![], vec![(at, seconds(t(30)))])]
    );
    let version = |v: &str| {
        vec![
            (label::MODEL.to_owned(), "det".to_owned()),
            (label::MODEL_VERSION.to_owned(), v.to_owned()),
        ]
    };
    assert_eq!(
        samples(store, metric::MODEL_VERSION_FIRST_EVENT, "m"),
        vec![
            (version("1.0"), vec![(at, seconds(t(10)))]),
            (version("2.0"), vec![(at, seconds(t(30)))]),
        ]
    );
    assert_eq!(
        samples(store, metric::MODEL_VERSION_LAST_EVENT, "m"),
        vec![
            (version("1.0"), vec![(at, seconds(t(20)))]),
            (version("2.0"), vec![(at, seconds(t(30)))]),
        ]
    );
    // The health report: gauges at its event time, and its time as a value.
    let tier = |name: &str| vec![(label::TIER.to_owned(), name.to_owned())];
    assert_eq!(
        samples(store, metric::QUEUE_BACKLOG_RECORDS, "m"),
        vec![
            (tier("debug"), vec![(ms(t(21)), 9.0)]),
            (tier("safety"), vec![(ms(t(21)), 0.0)]),
            (tier("slo"), vec![(ms(t(21)), 12.0)]),
        ]
    );
    assert_eq!(
        samples(store, metric::QUEUE_BACKLOG_BYTES, "m"),
        vec![
            (tier("debug"), vec![(ms(t(21)), 4_096.0)]),
            (tier("safety"), vec![(ms(t(21)), 0.0)]),
            (tier("slo"), vec![(ms(t(21)), 1_200.0)]),
        ]
    );
    assert_eq!(
        samples(store, metric::AGENT_HEALTH_TIMESTAMP, "m"),
        vec![(vec![], vec![(ms(t(21)), seconds(t(21)))])]
    );

    // The same group again at the same arrival: nothing new.
    assert_eq!(deliver(&mut gateway, &first, ARRIVAL).stats.samples_new, 0);

    // A backlog of older events under 1.0, with a loss report, arriving later: the first
    // event time falls, the last ones stay; the arrival moves.
    let later = ARRIVAL + 5 * MINUTE;
    let backlog = batch(
        "m",
        "haul",
        Tier::Slo,
        5,
        vec![
            (t(2), autonomy("1.0", 10.0)),
            (
                t(3),
                event::Kind::QueueLoss(QueueLoss {
                    tier: Tier::Debug as i32,
                    cause: 1,
                    count: 4,
                    total: 4,
                    ..Default::default()
                }),
            ),
        ],
    );
    let report = deliver(&mut gateway, &[Message::Batch(backlog)], later);
    let store = gateway.store();
    assert_eq!(
        samples(store, metric::MODEL_VERSION_FIRST_EVENT, "m")[0],
        (
            version("1.0"),
            vec![(at, seconds(t(10))), (ms(later), seconds(t(2)))]
        )
    );
    assert_eq!(
        samples(store, metric::MODEL_VERSION_LAST_EVENT, "m")[0]
            .1
            .len(),
        1,
        "1.0's last event did not move"
    );
    assert_eq!(
        samples(store, metric::MACHINE_LAST_EVENT, "m")[0].1.len(),
        1,
        "nothing newer than t(30) arrived"
    );
    assert_eq!(
        samples(store, metric::MACHINE_LAST_ARRIVAL, "m")[0]
            .1
            .last(),
        Some(&(ms(later), seconds(later)))
    );
    // Arrival and 1.0's first event; the autonomy sample (its run's baseline is stored
    // already), the loss and its baseline.
    assert_eq!(report.stats.samples_new, 2 + 3);
}

#[test]
fn a_cut_link_reads_offline_and_a_connected_machine_restates_its_state_every_hour() {
    let dir = tempfile::tempdir().unwrap();
    let mut gateway = ingestor(dir.path());
    let online = |online| Message::Status {
        machine: "m",
        online,
    };
    let slo = |seq: u64, arrival: i64| {
        Message::Batch(batch(
            "m",
            "haul",
            Tier::Slo,
            seq,
            vec![(arrival - MINUTE, autonomy("1.0", seq as f64))],
        ))
    };
    deliver(&mut gateway, &[online(true)], ARRIVAL);
    // Batches within the hour leave the online state as it was written.
    deliver(&mut gateway, &[slo(1, ARRIVAL + MINUTE)], ARRIVAL + MINUTE);
    // An hour after it was written, the next batch restates it.
    let hour = ONLINE_REFRESH_MS * MS;
    deliver(&mut gateway, &[slo(2, ARRIVAL + hour)], ARRIVAL + hour);
    // The last will: offline, at once; a retained status delivered again (a gateway
    // reconnecting) changes nothing, nor does a redelivered group in which the link flapped.
    let cut = ARRIVAL + hour + 10 * MINUTE;
    deliver(&mut gateway, &[online(false)], cut);
    deliver(&mut gateway, &[online(false)], cut + MINUTE);
    let flap = [online(true), online(false)];
    assert_eq!(
        deliver(&mut gateway, &flap, cut + 2 * MINUTE)
            .stats
            .samples_new,
        0,
        "the group's last status is the state it leaves"
    );
    // Back: online again.
    deliver(&mut gateway, &[online(true)], cut + 20 * MINUTE);
    assert_eq!(
        samples(gateway.store(), metric::MACHINE_ONLINE, "m"),
        vec![(
            vec![],
            vec![
                (ms(ARRIVAL), 1.0),
                (ms(ARRIVAL + hour), 1.0),
                (ms(cut), 0.0),
                (ms(cut + 20 * MINUTE), 1.0),
            ]
        )]
    );
    // A machine that never sent a status has no online state, only its arrivals.
    deliver(
        &mut gateway,
        &[Message::Batch(batch(
            "n",
            "haul",
            Tier::Slo,
            1,
            vec![(ARRIVAL, health(0, 0))],
        ))],
        ARRIVAL,
    );
    assert!(samples(gateway.store(), metric::MACHINE_ONLINE, "n").is_empty());
    assert_eq!(
        samples(gateway.store(), metric::MACHINE_LAST_ARRIVAL, "n").len(),
        1
    );
}

#[test]
fn a_machine_whose_class_is_not_an_id_is_still_listed_with_class_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let mut gateway = ingestor(dir.path());
    let report = deliver(
        &mut gateway,
        &[Message::Batch(batch(
            "m",
            "haul truck",
            Tier::Slo,
            1,
            vec![(ARRIVAL - MINUTE, autonomy("1.0", 5.0))],
        ))],
        ARRIVAL,
    );
    // Its counter event is refused (the class is a label)...
    assert_eq!(report.stats.events_refused.iter().sum::<u64>(), 1);
    // ...but the machine's arrival and last event are kept, under class `unknown`.
    let arrivals = gateway
        .store()
        .query_machine(metric::MACHINE_LAST_ARRIVAL, 0, i64::MAX, "m")
        .unwrap();
    assert_eq!(arrivals.len(), 1);
    assert!(
        arrivals[0]
            .labels
            .contains(&(label::MACHINE_CLASS.to_owned(), "unknown".to_owned()))
    );
    assert_eq!(
        samples(gateway.store(), metric::MACHINE_LAST_EVENT, "m")[0].1,
        vec![(ms(ARRIVAL), seconds(ARRIVAL - MINUTE))]
    );
    assert!(samples(gateway.store(), metric::MODEL_VERSION_LAST_EVENT, "m").is_empty());
}

/// A machine with everything the budget sizes, at two model versions: per version three loops
/// (deadline counters with deadline semantics and a fallback each), an intervention, a safe
/// stop, three throttled components, four modes, six rails; losses of every tier and cause; a
/// health report; a status.
fn full_machine() -> Vec<Message> {
    use edgewatch_proto::v1::{
        ComponentSeconds, DeadlineCounters, DeadlineSemantics, EnergyCounters, Intervention,
        LoopRef, RailEnergy, SafeStop, SafetyFallback, ThrottleCounters,
    };
    let t = |minutes: i64| ARRIVAL - 100 * MINUTE + minutes * MINUTE;
    let start = ARRIVAL - 200 * MINUTE;
    let (mut slo, mut safety) = (Vec::new(), Vec::new());
    for (k, version) in ["1.0", "2.0"].into_iter().enumerate() {
        let time = t(10 * k as i64);
        let model = Some(ModelVersion {
            name: "det".into(),
            version: version.into(),
            ..Default::default()
        });
        for loop_name in ["safety", "assistive", "planner"] {
            let control_loop = Some(LoopRef {
                loop_id: 1,
                loop_name: loop_name.into(),
            });
            slo.push((
                time,
                event::Kind::DeadlineCounters(DeadlineCounters {
                    control_loop: control_loop.clone(),
                    model: model.clone(),
                    start_time_unix_ns: start,
                    cycles: 100,
                    misses: 1,
                    skipped: 1,
                    activations: Some(101),
                    deadline_misses: Some(2),
                    overruns: Some(1),
                    semantics: DeadlineSemantics::Completion as i32,
                    ..Default::default()
                }),
            ));
            safety.push((
                time,
                event::Kind::SafetyFallback(SafetyFallback {
                    control_loop,
                    model: model.clone(),
                    total: 1,
                    delta: 1,
                    ..Default::default()
                }),
            ));
        }
        safety.push((
            time,
            event::Kind::Intervention(Intervention {
                total: 1,
                delta: 1,
                model: model.clone(),
                source: 1,
                ..Default::default()
            }),
        ));
        safety.push((
            time,
            event::Kind::SafeStop(SafeStop {
                total: 1,
                delta: 1,
                model: model.clone(),
                source: 1,
                ..Default::default()
            }),
        ));
        slo.push((
            time,
            event::Kind::ThrottleCounters(ThrottleCounters {
                start_time_unix_ns: start,
                components: (1..=3)
                    .map(|component| ComponentSeconds {
                        component,
                        throttled_seconds: 1.0,
                    })
                    .collect(),
                model: model.clone(),
            }),
        ));
        slo.push((
            time,
            event::Kind::AutonomySeconds(AutonomySeconds {
                start_time_unix_ns: start,
                modes: (1..=4)
                    .map(|mode| ModeSeconds { mode, seconds: 1.0 })
                    .collect(),
                model: model.clone(),
            }),
        ));
        slo.push((
            time,
            event::Kind::EnergyCounters(EnergyCounters {
                start_time_unix_ns: start,
                rails: (1..=6)
                    .map(|r| RailEnergy {
                        rail: format!("VDD_{r}"),
                        joules: 1.0,
                    })
                    .collect(),
                model,
            }),
        ));
    }
    for tier in [Tier::Safety, Tier::Slo, Tier::Debug] {
        for cause in 1..=7 {
            slo.push((
                t(30),
                event::Kind::QueueLoss(QueueLoss {
                    tier: tier as i32,
                    cause,
                    count: 1,
                    total: 1,
                    ..Default::default()
                }),
            ));
        }
    }
    slo.push((t(31), health(1, 1)));
    vec![
        Message::Batch(batch("m", "haul", Tier::Slo, 1, slo)),
        Message::Batch(batch("m", "haul", Tier::Safety, 1, safety)),
        Message::Status {
            machine: "m",
            online: true,
        },
    ]
}

#[test]
fn a_full_machine_owns_exactly_the_series_the_budget_arithmetic_counts() {
    use edgewatch_test_kit::config_docs::{fenced, section};
    const SERIES_DOC: &str = include_str!("../../../docs/series.md");
    let numbers = |block: &str| -> Vec<u32> {
        block
            .lines()
            .filter_map(|line| line.split_whitespace().last()?.parse().ok())
            .collect()
    };
    let budget = section(SERIES_DOC, "## Budget");
    let sizing = fenced(budget, "text");
    // "needed": two live versions, the losses and the backlog.
    let needed = numbers(sizing)[9];
    let after = &budget[budget.find(sizing).unwrap() + sizing.len()..];
    let own_at_two_versions = numbers(fenced(after, "text"))[3];

    let dir = tempfile::tempdir().unwrap();
    let mut gateway = ingestor(dir.path());
    let report = deliver(&mut gateway, &full_machine(), ARRIVAL);
    assert_eq!(report.stats.events_refused.iter().sum::<u64>(), 0);
    let store = gateway.store();
    let live = store.write(|w| w.live_count("m")).unwrap();
    assert_eq!(u64::from(needed), live, "live series at two versions");
    let mut own = 0;
    for name in store.metrics().unwrap() {
        if name.starts_with(metric::GATEWAY_PREFIX) && name != metric::REFUSED_SAMPLES {
            own += store.query_machine(&name, 0, i64::MAX, "m").unwrap().len();
        }
    }
    assert_eq!(
        own_at_two_versions as usize, own,
        "the gateway's own series"
    );
}

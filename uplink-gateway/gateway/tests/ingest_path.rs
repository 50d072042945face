//! The whole ingest path in-process (topic + payload → validate → dedup → normalize → embedded
//! store in a temp dir): no payload makes it fail or panic, and a model of received sequence
//! numbers agrees with the store through re-sends, overlaps and restarts.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::BTreeSet;

use edgewatch_gateway::config::{DEFAULT_RECEIVE_MAXIMUM, IngestConfig};
use edgewatch_gateway::ingest::{DECODE_AHEAD_MIN_MESSAGES, Decoding, Incoming, Ingestor, Outcome};
use edgewatch_gateway::store::Store;
use edgewatch_proto::framing::encode_batch;
use edgewatch_proto::v1::{
    AutonomySeconds, Batch, DeadlineCounters, EnergyCounters, Event, LoopRef, MachineStatus,
    ModeSeconds, ModelVersion, QueueLoss, RailEnergy, SafeStop, Tier, event,
};
use edgewatch_slo::names::refusal;
use proptest::prelude::*;
use prost::Message as _;

const ARRIVAL: i64 = 1_800_000_000_000_000_000;

fn ingestor(dir: &std::path::Path) -> Ingestor {
    let config = IngestConfig {
        remote_write_max_age: Some(std::time::Duration::from_secs(7 * 86_400)),
        ..IngestConfig::default()
    };
    Ingestor::new(Store::open_path(&dir.join("store.redb")).unwrap(), config).unwrap()
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z0-9.-]{1,12}", "\\PC{0,80}",]
}

fn model_version() -> impl Strategy<Value = Option<ModelVersion>> {
    proptest::option::of((text(), text()).prop_map(|(name, version)| ModelVersion {
        name,
        version,
        ..Default::default()
    }))
}

fn any_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-1.0),
        0.0..1e9
    ]
}

fn kind() -> impl Strategy<Value = Option<event::Kind>> {
    prop_oneof![
        Just(None),
        (
            text(),
            model_version(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(|(loop_name, model, cycles, misses, skipped)| Some(
                event::Kind::DeadlineCounters(DeadlineCounters {
                    control_loop: Some(LoopRef {
                        loop_id: 1,
                        loop_name,
                    }),
                    model,
                    cycles,
                    misses,
                    skipped,
                    ..Default::default()
                })
            )),
        (any::<i32>(), any_f64(), model_version()).prop_map(|(mode, seconds, model)| Some(
            event::Kind::AutonomySeconds(AutonomySeconds {
                start_time_unix_ns: 1,
                modes: vec![ModeSeconds { mode, seconds }],
                model,
            })
        )),
        (text(), any_f64()).prop_map(|(rail, joules)| Some(event::Kind::EnergyCounters(
            EnergyCounters {
                start_time_unix_ns: 1,
                rails: vec![RailEnergy { rail, joules }],
                model: None,
            }
        ))),
        (any::<i32>(), any::<i32>(), any::<u64>()).prop_map(|(tier, cause, total)| Some(
            event::Kind::QueueLoss(QueueLoss {
                tier,
                cause,
                total,
                ..Default::default()
            })
        )),
        any::<u64>().prop_map(|total| Some(event::Kind::SafeStop(SafeStop {
            total,
            ..Default::default()
        }))),
    ]
}

fn time() -> impl Strategy<Value = i64> {
    prop_oneof![
        any::<i64>(),
        Just(ARRIVAL),
        (ARRIVAL - 40 * 86_400_000_000_000)..(ARRIVAL + 3_600_000_000_000),
    ]
}

/// Batches that may break every rule: wrong schema, unknown tiers, bad ids, disorder.
fn wild_batch() -> impl Strategy<Value = Batch> {
    (
        prop_oneof![Just(1u32), any::<u32>()],
        prop_oneof![Just("truck-17".to_owned()), text()],
        any::<u64>(),
        prop_oneof![Just(1i32), Just(2), Just(3), any::<i32>()],
        time(),
        prop::collection::vec((any::<u64>(), time(), kind()), 0..12),
        text(),
        any::<bool>(),
    )
        .prop_map(
            |(schema_version, machine_id, epoch, tier, sent, events, class, ordered)| {
                let mut events: Vec<Event> = events
                    .into_iter()
                    .map(|(seq, event_time_unix_ns, kind)| Event {
                        seq,
                        event_time_unix_ns,
                        monotonic_ns: 0,
                        kind,
                    })
                    .collect();
                if ordered {
                    events.sort_by_key(|e| e.seq);
                    events.dedup_by_key(|e| e.seq);
                }
                Batch {
                    schema_version,
                    machine_id,
                    site_id: "pit-3".into(),
                    agent_epoch: epoch,
                    tier,
                    first_seq: events.first().map_or(0, |e| e.seq),
                    last_seq: events.last().map_or(0, |e| e.seq),
                    sent_time_unix_ns: sent,
                    events,
                    machine_class: class,
                    agent_version: String::new(),
                }
            },
        )
}

fn topic() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("edgewatch/v1/pit-3/truck-17/slo".to_owned()),
        Just("edgewatch/v1/pit-3/truck-17/safety".to_owned()),
        Just("edgewatch/v1/pit-3/truck-17/debug".to_owned()),
        Just("edgewatch/v1/pit-3/truck-17/status".to_owned()),
        "\\PC{0,60}",
    ]
}

/// A payload: raw bytes, a wild batch framed without the encoder's checks, a mutation of one, or
/// a status message.
fn payload() -> impl Strategy<Value = Vec<u8>> {
    let framed =
        || wild_batch().prop_map(|batch| zstd::bulk::compress(&batch.encode_to_vec(), 1).unwrap());
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        framed(),
        (framed(), any::<prop::sample::Index>(), any::<u8>()).prop_map(|(mut bytes, at, with)| {
            let at = at.index(bytes.len().max(1));
            if let Some(byte) = bytes.get_mut(at) {
                *byte ^= with | 1;
            }
            bytes
        }),
        (any::<bool>(), time()).prop_map(|(online, time_unix_ns)| MachineStatus {
            schema_version: 1,
            machine_id: "truck-17".into(),
            site_id: "pit-3".into(),
            online,
            time_unix_ns,
            ..Default::default()
        }
        .encode_to_vec()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_payload_makes_the_ingest_path_fail_or_panic(
        messages in prop::collection::vec((topic(), payload()), 1..8),
        arrival in time(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut ingestor = ingestor(dir.path());
        let incoming: Vec<Incoming<'_>> = messages
            .iter()
            .map(|(topic, payload)| Incoming { topic, payload })
            .collect();
        let report = ingestor.ingest(&incoming, arrival).unwrap();
        prop_assert_eq!(report.outcomes.len(), incoming.len());
        let dead = report
            .outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::DeadLettered { .. }))
            .count();
        // Refused messages, and refused events (those the series budget refused are counted
        // but not dead-lettered).
        let refused_events: u64 = report.stats.events_refused.iter().sum::<u64>()
            - report.stats.events_refused_for(refusal::SERIES_BUDGET);
        prop_assert_eq!(
            ingestor.store().dead_letters().unwrap().len(),
            dead + refused_events as usize
        );
        // The same group again: nothing new is accepted.
        let again = ingestor.ingest(&incoming, arrival).unwrap();
        prop_assert_eq!(again.stats.samples_new, 0);
        prop_assert_eq!(again.stats.events_new, 0);
    }
}

/// Deterministic events of one stream: re-sends carry identical values and times.
fn stream_batch(machine: usize, epoch: u64, first: u64, len: u64) -> Batch {
    let machine_id = format!("truck-{machine}");
    let events: Vec<Event> = (first..first + len)
        .map(|seq| Event {
            seq,
            event_time_unix_ns: ARRIVAL - 86_400_000_000_000
                + epoch as i64 * 1_000_000_000_000
                + seq as i64 * 10_000_000_000,
            monotonic_ns: seq,
            kind: Some(event::Kind::DeadlineCounters(DeadlineCounters {
                control_loop: Some(LoopRef {
                    loop_id: 1,
                    loop_name: "planner".into(),
                }),
                cycles: 250 * seq,
                ..Default::default()
            })),
        })
        .collect();
    Batch {
        schema_version: 1,
        machine_id,
        site_id: "pit-3".into(),
        agent_epoch: epoch,
        tier: Tier::Slo as i32,
        first_seq: first,
        last_seq: first + len - 1,
        sent_time_unix_ns: ARRIVAL,
        events,
        machine_class: "haul-truck".into(),
        agent_version: String::new(),
    }
}

#[derive(Debug, Clone)]
enum Action {
    /// Deliver a group of batches (machine, epoch, first seq, length) in one commit.
    Deliver(Vec<(usize, u64, u64, u64)>),
    /// The gateway process dies and restarts on the same store.
    Restart,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => prop::collection::vec((0usize..2, 1u64..3, 1u64..40, 1u64..6), 1..4)
            .prop_map(Action::Deliver),
        1 => Just(Action::Restart),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Model: the set of (machine, epoch, seq) delivered so far. Whatever the order, overlaps and
    /// restarts, each distinct event is one sample, counted new exactly once.
    #[test]
    fn the_store_counts_each_event_once_across_resends_and_restarts(
        actions in prop::collection::vec(action(), 1..25),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut ingestor = Some(ingestor(dir.path()));
        let mut model: BTreeSet<(usize, u64, u64)> = BTreeSet::new();
        let mut counted_new = 0u64;
        for action in actions {
            match action {
                Action::Restart => {
                    drop(ingestor.take());
                    ingestor = Some(self::ingestor(dir.path()));
                }
                Action::Deliver(batches) => {
                    let encoded: Vec<(String, Vec<u8>)> = batches
                        .iter()
                        .map(|&(m, epoch, first, len)| {
                            let batch = stream_batch(m, epoch, first, len);
                            (
                                format!("edgewatch/v1/pit-3/{}/slo", batch.machine_id),
                                encode_batch(&batch).unwrap(),
                            )
                        })
                        .collect();
                    let incoming: Vec<Incoming<'_>> = encoded
                        .iter()
                        .map(|(topic, payload)| Incoming { topic, payload })
                        .collect();
                    let report = ingestor.as_mut().unwrap().ingest(&incoming, ARRIVAL).unwrap();
                    counted_new += report.stats.events_new;
                    prop_assert_eq!(report.stats.samples_refused_for(refusal::CONFLICT), 0);
                    for (m, epoch, first, len) in batches {
                        model.extend((first..first + len).map(|seq| (m, epoch, seq)));
                    }
                }
            }
            let store = ingestor.as_ref().unwrap().store();
            let samples: usize = store
                .query("edge_control_cycles_total", 0, i64::MAX)
                .unwrap()
                .iter()
                .map(|s| s.samples.len())
                .sum();
            prop_assert_eq!(samples, model.len());
            prop_assert_eq!(counted_new, model.len() as u64);
            let mut received = BTreeSet::new();
            for stream in store.dedup_streams().unwrap() {
                let m: usize = stream.machine.trim_start_matches("truck-").parse().unwrap();
                for (first, last) in stream.ranges {
                    received.extend((first..=last).map(|seq| (m, stream.epoch, seq)));
                }
            }
            prop_assert_eq!(&received, &model);
        }
    }
}

/// A message of a group that decodes ahead or inline: a wild one, a batch of one of two
/// streams that the path admits, or a status of one of those machines.
fn group_message() -> impl Strategy<Value = (String, Vec<u8>)> {
    prop_oneof![
        2 => (topic(), payload()),
        4 => (0usize..2, 1u64..3, 1u64..40, 1u64..6).prop_map(|(m, epoch, first, len)| {
            let batch = stream_batch(m, epoch, first, len);
            (
                format!("edgewatch/v1/pit-3/{}/slo", batch.machine_id),
                encode_batch(&batch).unwrap(),
            )
        }),
        1 => (0usize..2, any::<bool>()).prop_map(|(m, online)| {
            let status = MachineStatus {
                schema_version: 1,
                machine_id: format!("truck-{m}"),
                site_id: "pit-3".into(),
                online,
                time_unix_ns: ARRIVAL,
                ..Default::default()
            };
            (
                format!("edgewatch/v1/pit-3/truck-{m}/status"),
                status.encode_to_vec(),
            )
        }),
    ]
}

/// Everything a store holds that the ingest path writes, in a comparable form.
fn store_contents(store: &Store) -> String {
    let mut contents = String::new();
    for metric in store.metrics().unwrap() {
        contents += &format!(
            "{metric}: {:?}\n",
            store.query(&metric, i64::MIN, i64::MAX).unwrap()
        );
    }
    contents += &format!("dead letters: {:?}\n", store.dead_letters().unwrap());
    contents += &format!("dedup: {:?}\n", store.dedup_streams().unwrap());
    contents += &format!("outbox: {:?}\n", store.outbox().unwrap());
    for machine in ["truck-0", "truck-1", "truck-17"] {
        contents += &format!("{machine}: {:?}\n", store.machine_state(machine).unwrap());
    }
    contents
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Decoding a group ahead on a second thread, in chunks, changes nothing the path reports or
    /// stores: the same groups ingested with the messages decoded inline give the same outcomes,
    /// counters, outbox requests and store contents, group by group.
    #[test]
    fn decoding_ahead_reports_and_stores_what_decoding_inline_does(
        groups in prop::collection::vec(prop::collection::vec(group_message(), 1..40), 1..4),
    ) {
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let mut inline = ingestor(dirs[0].path());
        inline.set_decoding(Decoding::Inline);
        let mut ahead = ingestor(dirs[1].path());
        ahead.set_decoding(Decoding::Ahead { min_messages: 1 });
        for group in &groups {
            let incoming: Vec<Incoming<'_>> = group
                .iter()
                .map(|(topic, payload)| Incoming { topic, payload })
                .collect();
            let expected = inline.ingest(&incoming, ARRIVAL).unwrap();
            let report = ahead.ingest(&incoming, ARRIVAL).unwrap();
            prop_assert_eq!(&report.outcomes, &expected.outcomes);
            prop_assert_eq!(&report.stats, &expected.stats);
            prop_assert_eq!(&report.outbox_ids, &expected.outbox_ids);
            prop_assert_eq!(store_contents(ahead.store()), store_contents(inline.store()));
        }
    }
}

/// The packaged default decodes ahead where it has two cores, for groups far smaller than the
/// default Receive Maximum, and inline on one core or with `decode_ahead = false`.
#[test]
fn the_default_decodes_ahead_with_a_second_core() {
    let dir = tempfile::tempdir().unwrap();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let expected = if cores >= 2 {
        Decoding::Ahead {
            min_messages: DECODE_AHEAD_MIN_MESSAGES,
        }
    } else {
        Decoding::Inline
    };
    assert!(IngestConfig::default().decode_ahead);
    assert_eq!(ingestor(dir.path()).decoding(), expected);
    assert!(DECODE_AHEAD_MIN_MESSAGES <= usize::from(DEFAULT_RECEIVE_MAXIMUM) / 8);
    let off = IngestConfig {
        decode_ahead: false,
        ..IngestConfig::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let ingestor = Ingestor::new(
        Store::open_path(&dir.path().join("store.redb")).unwrap(),
        off,
    );
    assert_eq!(ingestor.unwrap().decoding(), Decoding::Inline);
}

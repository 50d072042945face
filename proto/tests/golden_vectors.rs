//! Golden vectors: fixed encoded bytes in `testdata/golden/*.binpb` with their expected decoded form
//! in protobuf text format beside them (`*.txtpb`). A change to the schema or the encoder that alters
//! the bytes of an existing message fails here.
//!
//! `EDGEWATCH_REGENERATE_GOLDEN=1` writes missing `.binpb` files from their `.txtpb`; existing ones
//! are never rewritten, since that would defeat their purpose.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::path::{Path, PathBuf};

use edgewatch_proto::framing::{decode_batch, encode_batch};
use edgewatch_proto::v1::{Batch, DeadlineSemantics, Tier, event};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage, text_format::FormatOptions};

fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata")
}

fn pool() -> DescriptorPool {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fds = protox::compile(["edgewatch/v1/batch.proto"], [root]).expect("schema compiles");
    DescriptorPool::from_file_descriptor_set(fds).expect("descriptor pool")
}

fn canonical_text(message: &DynamicMessage) -> String {
    message.to_text_format_with_options(&FormatOptions::new().pretty(true))
}

fn golden_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(testdata().join("golden"))
        .unwrap()
        .filter_map(|entry| {
            let path = entry.unwrap().path();
            (path.extension()? == "txtpb").then(|| path.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect();
    names.sort();
    names
}

/// Decodes the golden bytes with the generated types and checks them against the text form.
#[test]
fn every_golden_vector_decodes_to_its_text_form_and_reencodes_to_the_same_bytes() {
    let pool = pool();
    let batch_descriptor = pool.get_message_by_name("edgewatch.v1.Batch").unwrap();
    let names = golden_names();
    assert!(names.len() >= 3, "golden vectors missing: {names:?}");
    for name in names {
        let dir = testdata().join("golden");
        let text = std::fs::read_to_string(dir.join(format!("{name}.txtpb"))).unwrap();
        let expected = DynamicMessage::parse_text_format(batch_descriptor.clone(), &text)
            .unwrap_or_else(|e| panic!("{name}.txtpb does not parse: {e}"));
        let bin_path = dir.join(format!("{name}.binpb"));
        if !bin_path.exists() && std::env::var_os("EDGEWATCH_REGENERATE_GOLDEN").is_some() {
            std::fs::write(&bin_path, expected.encode_to_vec()).unwrap();
        }
        let golden = std::fs::read(&bin_path)
            .unwrap_or_else(|e| panic!("{name}.binpb missing ({e}); see this file's doc"));

        // The text form, encoded independently of the generated code, gives the golden bytes.
        assert_eq!(
            expected.encode_to_vec(),
            golden,
            "{name}: text form and bytes disagree"
        );

        // The generated code decodes the bytes and encodes them back unchanged.
        let batch = Batch::decode(&golden[..]).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            batch.encode_to_vec(),
            golden,
            "{name}: re-encoding changed the bytes"
        );

        // And what it decoded reads as the expected text.
        let decoded =
            DynamicMessage::decode(batch_descriptor.clone(), &batch.encode_to_vec()[..]).unwrap();
        assert_eq!(
            canonical_text(&decoded),
            canonical_text(&expected),
            "{name}"
        );

        // The framed form round-trips too.
        assert_eq!(
            decode_batch(&encode_batch(&batch).unwrap())
                .unwrap()
                .encode_to_vec(),
            golden
        );
    }
}

/// Hand-checked fields, independent of any reflection library.
#[test]
fn golden_slo_batch_carries_the_expected_counters() {
    let golden = std::fs::read(testdata().join("golden/slo_batch.binpb")).unwrap();
    let batch = Batch::decode(&golden[..]).unwrap();
    assert_eq!(batch.schema_version, 1);
    assert_eq!(batch.machine_id, "truck-17");
    assert_eq!(batch.agent_epoch, 0x1122_3344_5566_7788);
    assert_eq!(batch.tier(), Tier::Slo);
    assert_eq!((batch.first_seq, batch.last_seq), (1000, 1004));
    let Some(event::Kind::DeadlineCounters(counters)) = &batch.events[0].kind else {
        panic!(
            "first event is not deadline counters: {:?}",
            batch.events[0].kind
        );
    };
    assert_eq!(counters.control_loop.as_ref().unwrap().loop_name, "planner");
    assert_eq!(counters.model.as_ref().unwrap().version, "4.2.1");
    assert_eq!(
        (counters.cycles, counters.misses, counters.skipped),
        (250_000, 3, 1)
    );
    let histogram = counters.response_time.as_ref().unwrap();
    assert_eq!(histogram.counts.len(), histogram.bounds_ns.len() + 1);
    assert_eq!(histogram.counts.iter().sum::<u64>(), 250_000);
    let Some(event::Kind::ThrottleEnded(throttle)) = &batch.events[4].kind else {
        panic!("last event is not a throttle end");
    };
    assert_eq!(throttle.cap_mhz, Some(1190));
}

/// An agent from before deadline semantics: the old counters only, the new ones absent.
#[test]
fn golden_counters_of_an_agent_before_deadline_semantics_read_as_unspecified_with_no_new_fields() {
    let golden = std::fs::read(testdata().join("golden/slo_batch.binpb")).unwrap();
    let batch = Batch::decode(&golden[..]).unwrap();
    let Some(event::Kind::DeadlineCounters(c)) = &batch.events[0].kind else {
        panic!("first event is not deadline counters");
    };
    assert_eq!(c.semantics(), DeadlineSemantics::Unspecified);
    assert_eq!(
        (c.activations, c.deadline_misses, c.overruns),
        (None, None, None)
    );
    assert_eq!(c.deadline_ns, 0);
}

#[test]
fn golden_deadline_counters_carry_activations_and_deadline_misses_beside_the_old_fields() {
    let golden = std::fs::read(testdata().join("golden/deadline_slo_batch.binpb")).unwrap();
    let batch = Batch::decode(&golden[..]).unwrap();
    assert_eq!(batch.tier(), Tier::Slo);
    let counters: Vec<_> = batch
        .events
        .iter()
        .map(|e| match &e.kind {
            Some(event::Kind::DeadlineCounters(c)) => c,
            other => panic!("not deadline counters: {other:?}"),
        })
        .collect();
    let hung = counters[0];
    assert_eq!(hung.semantics(), DeadlineSemantics::Completion);
    assert_eq!(
        (hung.activations, hung.deadline_misses, hung.overruns),
        (Some(7500), Some(54), Some(3))
    );
    assert_eq!(hung.deadline_ns, 40_000_000);
    // The fields an older gateway reads keep their meaning: `misses` are the overruns.
    assert_eq!((hung.cycles, hung.misses, hung.skipped), (7450, 3, 50));
    assert_eq!(
        hung.activations,
        Some(hung.cycles + hung.skipped),
        "no provisional counts left once the loop recovered"
    );
    let legacy = counters[1];
    assert_eq!(legacy.semantics(), DeadlineSemantics::LegacyProbe);
    assert_eq!(
        (legacy.activations, legacy.deadline_misses, legacy.overruns),
        (Some(30_001), None, Some(2)),
        "an ABI 1 probe's deadline misses are absent, never the overruns"
    );
    assert_eq!(legacy.deadline_ns, 0);

    let golden = std::fs::read(testdata().join("golden/deadline_safety_batch.binpb")).unwrap();
    let batch = Batch::decode(&golden[..]).unwrap();
    let Some(event::Kind::DeadlineMissBurst(burst)) = &batch.events[0].kind else {
        panic!("not a burst");
    };
    assert_eq!(burst.semantics(), DeadlineSemantics::Completion);
    assert_eq!(burst.misses, 51);
}

#[test]
fn golden_safety_batch_has_one_event_of_each_safety_kind() {
    let golden = std::fs::read(testdata().join("golden/safety_batch.binpb")).unwrap();
    let batch = Batch::decode(&golden[..]).unwrap();
    let kinds: Vec<&str> = batch
        .events
        .iter()
        .map(|e| match e.kind.as_ref().unwrap() {
            event::Kind::DeadlineMissBurst(_) => "burst",
            event::Kind::SafetyFallback(_) => "fallback",
            event::Kind::ProbeStatus(_) => "probe",
            event::Kind::ThrottleStarted(_) => "throttle",
            event::Kind::OverCurrent(_) => "over-current",
            event::Kind::AutonomyModeChange(_) => "mode",
            event::Kind::Intervention(_) => "intervention",
            event::Kind::SafeStop(_) => "safe-stop",
            event::Kind::ModelVersionChange(_) => "model",
            event::Kind::QueueLoss(_) => "loss",
            event::Kind::OfflineWindowLow(_) => "offline-window",
            other => panic!("unexpected kind in the safety batch: {other:?}"),
        })
        .collect();
    assert_eq!(kinds.len(), 11);
    let unique: std::collections::BTreeSet<_> = kinds.iter().collect();
    assert_eq!(unique.len(), kinds.len());
}

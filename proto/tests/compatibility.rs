//! Forward compatibility: a message written by a later revision of the schema (new fields, a new
//! event kind, new enum and oneof values; see `testdata/compat/future.proto`) still decodes with
//! this revision's code, keeping every field it knows.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::path::Path;

use edgewatch_proto::framing::{decode_batch, decode_batch_protobuf};
use edgewatch_proto::v1::{Batch, ProbeState, Tier, attribute, event};
use prost::Message;
use prost_reflect::{DescriptorPool, DynamicMessage};

fn future_batch_bytes() -> Vec<u8> {
    let compat = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/compat");
    let fds = protox::compile(["future.proto"], [&compat]).expect("future schema compiles");
    let pool = DescriptorPool::from_file_descriptor_set(fds).unwrap();
    let descriptor = pool.get_message_by_name("edgewatch.future.Batch").unwrap();
    let text = std::fs::read_to_string(compat.join("future_batch.txtpb")).unwrap();
    DynamicMessage::parse_text_format(descriptor, &text)
        .unwrap()
        .encode_to_vec()
}

#[test]
fn a_batch_from_a_later_schema_decodes_with_its_known_fields_intact() {
    let bytes = future_batch_bytes();
    let batch = decode_batch_protobuf(&bytes).expect("unknown fields are skipped, not errors");

    assert_eq!(batch.machine_id, "grader-2");
    assert_eq!(batch.site_id, "north-pit");
    assert_eq!(batch.tier(), Tier::Debug);
    assert_eq!(batch.agent_version, "9.0.0");
    assert_eq!(batch.events.len(), 3);

    // A known kind with a new field and a new oneof value inside.
    let Some(event::Kind::Custom(custom)) = &batch.events[0].kind else {
        panic!("custom event lost: {:?}", batch.events[0]);
    };
    assert_eq!(custom.name, "bed-raised");
    assert_eq!(custom.attributes.len(), 2);
    assert_eq!(
        custom.attributes[0].value,
        Some(attribute::Value::DoubleValue(42.5))
    );
    assert_eq!(custom.attributes[1].key, "blob");
    assert_eq!(
        custom.attributes[1].value, None,
        "unknown oneof value reads as unset"
    );

    // A kind this revision does not know: the event keeps its envelope, the kind reads as unset.
    assert_eq!(batch.events[1].seq, 2);
    assert_eq!(
        batch.events[1].event_time_unix_ns,
        1_764_499_991_000_000_000
    );
    assert_eq!(batch.events[1].kind, None);

    // An enum value from the future is kept as its number and reads as the default.
    let Some(event::Kind::ProbeStatus(status)) = &batch.events[2].kind else {
        panic!("probe status lost");
    };
    assert_eq!(status.state, 9);
    assert_eq!(status.state(), ProbeState::Unspecified);
    assert_eq!(status.pid, 77);
    assert_eq!(status.control_loop.as_ref().unwrap().loop_name, "steering");
}

#[test]
fn a_framed_batch_from_a_later_schema_passes_the_whole_decoder() {
    let bytes = future_batch_bytes();
    let payload = zstd::bulk::compress(&bytes, 3).unwrap();
    let batch = decode_batch(&payload).unwrap();
    assert_eq!(batch.events.len(), 3);
    // Re-encoding with this revision drops what it does not know and nothing else.
    let again = Batch::decode(&batch.encode_to_vec()[..]).unwrap();
    assert_eq!(again, batch);
}

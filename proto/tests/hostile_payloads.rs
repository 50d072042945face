//! Hostile payloads: whatever arrives on the wire, decoding returns a typed error, never panics,
//! and never allocates past the format's limits.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use edgewatch_proto::SCHEMA_VERSION;
use edgewatch_proto::framing::{
    DecodeError, MAX_COMPRESSED_BYTES, MAX_DECOMPRESSED_BYTES, MAX_EVENTS_PER_BATCH, decode_batch,
    decode_batch_protobuf, encode_batch,
};
use edgewatch_proto::v1::{Attribute, Batch, CustomEvent, Event, Tier, event};
use edgewatch_test_kit::alloc::CountingAllocator;
use proptest::prelude::*;
use prost::Message;

/// Counts live heap bytes and the peak, to show decoding stays bounded: `ALLOCATOR.peak_growth`
/// is the peak heap growth (bytes above the live level at the start) while a closure runs. Tests
/// in this file run one at a time under a lock so they do not see each other's allocations.
#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::tracking_bytes();

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn valid_batch(events: u64) -> Batch {
    let events: Vec<Event> = (1..=events)
        .map(|seq| Event {
            seq,
            event_time_unix_ns: 1_764_500_000_000_000_000,
            monotonic_ns: seq,
            kind: Some(event::Kind::Custom(CustomEvent {
                name: "tick".into(),
                attributes: vec![],
            })),
        })
        .collect();
    Batch {
        schema_version: SCHEMA_VERSION,
        machine_id: "m1".into(),
        site_id: "s1".into(),
        agent_epoch: 1,
        tier: Tier::Debug as i32,
        first_seq: 1,
        last_seq: events.len() as u64,
        sent_time_unix_ns: 0,
        events,
        machine_class: "test".into(),
        agent_version: "0".into(),
    }
}

#[test]
fn a_zstd_bomb_is_refused_from_its_header_without_allocating_its_size() {
    let _guard = serial();
    let zeros = vec![0u8; 256 * 1024 * 1024];
    let bomb = zstd::bulk::compress(&zeros, 19).unwrap();
    drop(zeros);
    assert!(
        bomb.len() < MAX_COMPRESSED_BYTES,
        "bomb is {} bytes",
        bomb.len()
    );
    let (result, peak) = ALLOCATOR.peak_growth(|| decode_batch(&bomb));
    assert!(
        matches!(result, Err(DecodeError::DecompressedTooLarge { declared }) if declared == 256 * 1024 * 1024),
        "{:?}",
        result.map(|b| b.events.len())
    );
    assert!(
        peak < 1024 * 1024,
        "decoding the bomb allocated {peak} bytes"
    );
}

#[test]
fn a_frame_without_a_declared_size_is_refused() {
    let _guard = serial();
    let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    encoder.include_contentsize(false).unwrap();
    std::io::Write::write_all(&mut encoder, &vec![0u8; 64 * 1024 * 1024]).unwrap();
    let streamed = encoder.finish().unwrap();
    let (result, peak) = ALLOCATOR.peak_growth(|| decode_batch(&streamed));
    assert!(
        matches!(result, Err(DecodeError::MissingContentSize)),
        "{:?}",
        result.map(|b| b.events.len())
    );
    assert!(peak < 1024 * 1024, "allocated {peak} bytes");
}

#[test]
fn a_frame_that_understates_its_size_fails_to_decompress() {
    let _guard = serial();
    let protobuf = valid_batch(3).encode_to_vec();
    assert!(protobuf.len() < 256);
    let mut payload = zstd::bulk::compress(&protobuf, 3).unwrap();
    // Small single-segment frame: byte 5 is the one-byte frame content size.
    assert_eq!(payload[5] as usize, protobuf.len());
    payload[5] = 10;
    let (result, peak) = ALLOCATOR.peak_growth(|| decode_batch(&payload));
    assert!(
        matches!(result, Err(DecodeError::Decompression(_))),
        "{:?}",
        result.map(|b| b.events.len())
    );
    assert!(peak < 1024 * 1024);
}

#[test]
fn every_truncation_of_a_valid_payload_is_an_error() {
    let _guard = serial();
    let payload = encode_batch(&valid_batch(50)).unwrap();
    for len in 0..payload.len() {
        assert!(
            decode_batch(&payload[..len]).is_err(),
            "prefix of {len} bytes decoded"
        );
    }
    assert!(decode_batch(&payload).is_ok());
}

#[test]
fn trailing_bytes_after_the_frame_are_refused() {
    let _guard = serial();
    let mut payload = encode_batch(&valid_batch(2)).unwrap();
    payload.extend_from_slice(b"tail");
    assert!(matches!(
        decode_batch(&payload),
        Err(DecodeError::FrameLength { .. })
    ));
}

#[test]
fn an_oversized_payload_is_refused_before_any_work() {
    let _guard = serial();
    let big = vec![0x28u8; MAX_COMPRESSED_BYTES + 1];
    let (result, peak) = ALLOCATOR.peak_growth(|| decode_batch(&big));
    assert!(matches!(
        result,
        Err(DecodeError::CompressedTooLarge { .. })
    ));
    assert!(peak < 1024 * 1024);
}

#[test]
fn random_bytes_and_text_are_not_zstd() {
    let _guard = serial();
    assert!(matches!(decode_batch(b""), Err(DecodeError::NotZstd)));
    assert!(matches!(
        decode_batch(b"{\"json\":1}"),
        Err(DecodeError::NotZstd)
    ));
}

#[test]
fn a_wrong_schema_version_is_refused_by_number() {
    let _guard = serial();
    let mut batch = valid_batch(1);
    batch.schema_version = 2;
    let payload = zstd::bulk::compress(&batch.encode_to_vec(), 3).unwrap();
    assert!(matches!(
        decode_batch(&payload),
        Err(DecodeError::UnsupportedSchema { found: 2 })
    ));
}

#[test]
fn too_many_events_are_refused_before_they_are_built() {
    let _guard = serial();
    let protobuf = valid_batch(MAX_EVENTS_PER_BATCH as u64 + 1).encode_to_vec();
    assert!(protobuf.len() < MAX_DECOMPRESSED_BYTES);
    assert!(matches!(
        decode_batch_protobuf(&protobuf),
        Err(DecodeError::TooManyEvents)
    ));
}

#[test]
fn a_swarm_of_tiny_nested_fields_cannot_inflate_memory() {
    let _guard = serial();
    // One event with about 1.9 million empty attributes: 2 bytes each on the wire, ~60 decoded.
    let mut batch = valid_batch(1);
    let Some(event::Kind::Custom(custom)) = &mut batch.events[0].kind else {
        unreachable!()
    };
    custom.attributes = vec![Attribute::default(); (MAX_DECOMPRESSED_BYTES - 1024) / 2];
    let protobuf = batch.encode_to_vec();
    assert!(
        protobuf.len() <= MAX_DECOMPRESSED_BYTES,
        "{}",
        protobuf.len()
    );
    let (result, peak) = ALLOCATOR.peak_growth(|| decode_batch_protobuf(&protobuf));
    assert!(
        matches!(result, Err(DecodeError::TooManyFields)),
        "{:?}",
        result.map(|b| b.events.len())
    );
    assert!(peak < 1024 * 1024, "allocated {peak} bytes");
}

#[test]
fn decoding_a_maximal_valid_batch_stays_within_a_small_multiple_of_its_size() {
    let _guard = serial();
    let protobuf = valid_batch(MAX_EVENTS_PER_BATCH as u64).encode_to_vec();
    let (result, peak) = ALLOCATOR.peak_growth(|| decode_batch_protobuf(&protobuf));
    assert_eq!(result.unwrap().events.len(), MAX_EVENTS_PER_BATCH);
    assert!(
        peak < 16 * MAX_DECOMPRESSED_BYTES,
        "decoding {} bytes peaked at {peak} bytes",
        protobuf.len()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _guard = serial();
        let _ = decode_batch(&bytes);
        let _ = decode_batch_protobuf(&bytes);
    }

    #[test]
    fn arbitrary_bytes_behind_a_zstd_magic_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let _guard = serial();
        let mut payload = vec![0x28, 0xB5, 0x2F, 0xFD];
        payload.extend_from_slice(&tail);
        let _ = decode_batch(&payload);
    }

    #[test]
    fn mutated_valid_payloads_decode_to_sound_batches_or_fail(
        events in 1u64..40,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let _guard = serial();
        let mut payload = encode_batch(&valid_batch(events)).unwrap();
        for (index, value) in flips {
            let i = index.index(payload.len());
            payload[i] ^= value;
        }
        if let Ok(batch) = decode_batch(&payload) {
            prop_assert!(edgewatch_proto::framing::check_structure(&batch).is_ok());
        }
    }

    #[test]
    fn mutated_protobuf_never_panics(
        events in 1u64..40,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let _guard = serial();
        let mut protobuf = valid_batch(events).encode_to_vec();
        for (index, value) in flips {
            let i = index.index(protobuf.len());
            protobuf[i] ^= value;
        }
        let _ = decode_batch_protobuf(&protobuf);
    }
}

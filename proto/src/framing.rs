//! Batch framing: one MQTT payload is one [`Batch`], protobuf-encoded, then compressed as a single
//! zstd frame that declares its content size.
//!
//! ```text
//! MQTT payload = zstd frame ( content size declared ) ── decompress ──► protobuf Batch
//!                ≤ MAX_COMPRESSED_BYTES                                   ≤ MAX_DECOMPRESSED_BYTES
//!                                                                          ≤ MAX_EVENTS_PER_BATCH events
//! ```
//!
//! Invariants:
//! - Decoding never allocates an output buffer larger than the frame's declared content size, and
//!   never accepts a declared size above [`MAX_DECOMPRESSED_BYTES`]: a zstd bomb is refused from its
//!   header, and a frame that lies about its size fails to decompress.
//! - Before the protobuf decoder builds any structure, a scan bounds the number of events and of
//!   fields in each event, so a small payload cannot expand into a large in-memory tree.
//! - A batch that decodes is structurally sound: known schema version, a tier, valid ids, at least one
//!   event, strictly increasing sequence numbers equal to `first_seq..=last_seq`'s ends.
//! - Every failure is a [`DecodeError`]; no input makes decoding panic.
//! - [`BatchDecoder::decode_into`] gives what [`BatchDecoder::decode`] gives, decoding over the
//!   batch before (`recycle`); a decoder keeps between calls at most one payload's decompressed
//!   bytes and about one batch's strings and lists.

use prost::Message;
use prost::encoding::{WireType, decode_key, decode_varint};

use crate::SCHEMA_VERSION;
use crate::tier;
use crate::topic::{IdError, validate_id};
use crate::v1::{Batch, Tier};

mod recycle;

/// Largest payload (compressed batch) an agent publishes and a gateway accepts. Stays well under
/// the broker's `max_packet_size` (1 MiB recommended) with room for topic and properties.
pub const MAX_COMPRESSED_BYTES: usize = 512 * 1024;

/// Largest protobuf encoding of one batch, before compression.
pub const MAX_DECOMPRESSED_BYTES: usize = 4 * 1024 * 1024;

/// Most events one batch may carry.
pub const MAX_EVENTS_PER_BATCH: usize = 10_000;

/// Most protobuf fields (at any of the first three nesting levels) one batch may hold. Each field
/// costs at least two bytes on the wire but up to a few dozen in memory once decoded; this bound
/// keeps a decoded batch within a small multiple of [`MAX_DECOMPRESSED_BYTES`].
pub const MAX_FIELDS_PER_BATCH: usize = 400_000;

/// zstd level the agent uses: fast, and most of the ratio for repetitive telemetry.
pub const DEFAULT_COMPRESSION_LEVEL: i32 = 3;

/// First four bytes of every zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

/// Protobuf field number of `Batch.events`.
const BATCH_EVENTS_FIELD: u32 = 9;

/// Why a batch could not be encoded. The batch itself is untouched: the caller still has it.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// The batch breaks a structural rule a reader would enforce.
    #[error("the batch is malformed: {0}")]
    Malformed(#[from] StructureError),
    /// The protobuf encoding exceeds [`MAX_DECOMPRESSED_BYTES`]; send fewer events.
    #[error("the encoded batch is {len} bytes; at most {MAX_DECOMPRESSED_BYTES} are allowed")]
    EncodedTooLarge {
        /// Size of the protobuf encoding.
        len: usize,
    },
    /// The compressed payload exceeds the caller's limit; send fewer events.
    #[error("the compressed batch is {len} bytes; the limit is {limit}")]
    CompressedTooLarge {
        /// Size after compression.
        len: usize,
        /// The limit it broke.
        limit: usize,
    },
    /// zstd refused to compress.
    #[error("zstd compression failed: {0}")]
    Compression(std::io::Error),
}

/// Why a payload was refused. Every variant is final: the payload is bad, not the decoder.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The payload is larger than [`MAX_COMPRESSED_BYTES`].
    #[error("the payload is {len} bytes; at most {MAX_COMPRESSED_BYTES} are allowed")]
    CompressedTooLarge {
        /// Payload size.
        len: usize,
    },
    /// The payload does not start with a zstd frame.
    #[error("the payload is not a zstd frame")]
    NotZstd,
    /// The zstd frame header is truncated or corrupt.
    #[error("the zstd frame header is truncated or corrupt")]
    BadFrameHeader,
    /// The frame does not declare its decompressed size, which this format requires.
    #[error("the zstd frame does not declare its content size")]
    MissingContentSize,
    /// The frame declares more than [`MAX_DECOMPRESSED_BYTES`].
    #[error(
        "the zstd frame declares {declared} bytes; at most {MAX_DECOMPRESSED_BYTES} are allowed"
    )]
    DecompressedTooLarge {
        /// Content size from the frame header.
        declared: u64,
    },
    /// Bytes follow the first zstd frame, or the frame is cut short.
    #[error("the payload holds {payload} bytes but its zstd frame spans {frame}")]
    FrameLength {
        /// Payload size.
        payload: usize,
        /// Size of the frame found at its start (0 when the frame is incomplete).
        frame: usize,
    },
    /// zstd failed to decompress (corrupt data, or output larger than declared).
    #[error("zstd decompression failed: {0}")]
    Decompression(std::io::Error),
    /// The decompressed bytes are not a valid protobuf `Batch`.
    #[error("the batch is not valid protobuf: {0}")]
    Protobuf(#[from] prost::DecodeError),
    /// More than [`MAX_EVENTS_PER_BATCH`] events.
    #[error("the batch holds more than {MAX_EVENTS_PER_BATCH} events")]
    TooManyEvents,
    /// More than [`MAX_FIELDS_PER_BATCH`] fields.
    #[error("the batch holds more than {MAX_FIELDS_PER_BATCH} protobuf fields")]
    TooManyFields,
    /// `schema_version` is not [`SCHEMA_VERSION`].
    #[error("schema version {found} is not supported; this reader knows version {SCHEMA_VERSION}")]
    UnsupportedSchema {
        /// The version the batch declared.
        found: u32,
    },
    /// The batch decoded but breaks a structural rule.
    #[error("the batch is malformed: {0}")]
    Malformed(#[from] StructureError),
}

/// Structural rules every batch obeys, checked on both sides of the wire.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StructureError {
    /// `schema_version` is not [`SCHEMA_VERSION`].
    #[error("schema version {0} is not {SCHEMA_VERSION}")]
    SchemaVersion(u32),
    /// The tier is missing or not one this reader knows.
    #[error("tier {0} is not safety, slo or debug")]
    Tier(i32),
    /// The machine id is not a valid id.
    #[error("machine id: {0}")]
    MachineId(IdError),
    /// The site id is not a valid id.
    #[error("site id: {0}")]
    SiteId(IdError),
    /// No events.
    #[error("the batch carries no events")]
    Empty,
    /// More than [`MAX_EVENTS_PER_BATCH`] events.
    #[error("{0} events; at most {MAX_EVENTS_PER_BATCH} are allowed")]
    TooManyEvents(usize),
    /// Event sequence numbers do not strictly increase.
    #[error("event sequence numbers do not strictly increase at index {index}")]
    SequenceOrder {
        /// Index of the first event that is not above its predecessor.
        index: usize,
    },
    /// `first_seq`/`last_seq` disagree with the events carried.
    #[error(
        "first_seq/last_seq {first}..={last} disagree with the events {events_first}..={events_last}"
    )]
    SequenceRange {
        /// Declared first sequence.
        first: u64,
        /// Declared last sequence.
        last: u64,
        /// Sequence of the first event.
        events_first: u64,
        /// Sequence of the last event.
        events_last: u64,
    },
}

/// Checks the structural rules of a batch (see the module invariants).
pub fn check_structure(batch: &Batch) -> Result<(), StructureError> {
    check_header(batch)?;
    let (Some(first), Some(last)) = (batch.events.first(), batch.events.last()) else {
        return Err(StructureError::Empty);
    };
    if batch.events.len() > MAX_EVENTS_PER_BATCH {
        return Err(StructureError::TooManyEvents(batch.events.len()));
    }
    if let Some(index) = batch
        .events
        .windows(2)
        .position(|pair| pair[1].seq <= pair[0].seq)
    {
        return Err(StructureError::SequenceOrder { index: index + 1 });
    }
    if batch.first_seq != first.seq || batch.last_seq != last.seq {
        return Err(StructureError::SequenceRange {
            first: batch.first_seq,
            last: batch.last_seq,
            events_first: first.seq,
            events_last: last.seq,
        });
    }
    Ok(())
}

/// Checks the fields of a batch other than its events.
fn check_header(batch: &Batch) -> Result<(), StructureError> {
    if batch.schema_version != SCHEMA_VERSION {
        return Err(StructureError::SchemaVersion(batch.schema_version));
    }
    if Tier::try_from(batch.tier)
        .ok()
        .and_then(tier::index)
        .is_none()
    {
        return Err(StructureError::Tier(batch.tier));
    }
    validate_id(&batch.machine_id).map_err(StructureError::MachineId)?;
    validate_id(&batch.site_id).map_err(StructureError::SiteId)?;
    if batch.first_seq > batch.last_seq {
        return Err(StructureError::SequenceRange {
            first: batch.first_seq,
            last: batch.last_seq,
            events_first: batch.first_seq,
            events_last: batch.last_seq,
        });
    }
    Ok(())
}

/// Encodes batches, reusing its compression context and scratch buffer between calls.
pub struct BatchEncoder {
    compressor: zstd::bulk::Compressor<'static>,
    encoded: Vec<u8>,
}

impl BatchEncoder {
    /// An encoder at the given zstd level (see [`DEFAULT_COMPRESSION_LEVEL`]).
    pub fn new(level: i32) -> Result<Self, EncodeError> {
        let mut compressor =
            zstd::bulk::Compressor::new(level).map_err(EncodeError::Compression)?;
        compressor
            .include_contentsize(true)
            .map_err(EncodeError::Compression)?;
        compressor
            .include_checksum(true)
            .map_err(EncodeError::Compression)?;
        Ok(Self {
            compressor,
            encoded: Vec::new(),
        })
    }

    /// Size of the batch's protobuf encoding, before compression.
    pub fn encoded_len(batch: &Batch) -> usize {
        batch.encoded_len()
    }

    /// Encodes `batch` into `out` (cleared first), refusing results above `limit` compressed bytes
    /// (at most [`MAX_COMPRESSED_BYTES`] is ever useful). Buffers are reused, so a steady stream of
    /// similar batches does not allocate.
    pub fn encode(
        &mut self,
        batch: &Batch,
        limit: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        check_structure(batch)?;
        let len = batch.encoded_len();
        if len > MAX_DECOMPRESSED_BYTES {
            return Err(EncodeError::EncodedTooLarge { len });
        }
        self.encoded.clear();
        self.encoded.reserve(len);
        batch
            .encode(&mut self.encoded)
            .map_err(|error| EncodeError::Compression(std::io::Error::other(error)))?;
        self.compress(limit, out)
    }
}

impl BatchEncoder {
    /// Encodes a batch whose events are already protobuf-encoded (as the agent's queue stores
    /// them), without decoding them: `header` carries every field but `events`, which must be
    /// empty; each `events` item is one encoded `Event`, in strictly increasing sequence order from
    /// `header.first_seq` to `header.last_seq` (the caller's invariant; the gateway checks it).
    pub fn encode_spliced<'e>(
        &mut self,
        header: &Batch,
        events: impl Iterator<Item = &'e [u8]> + Clone,
        limit: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), EncodeError> {
        check_header(header)?;
        let count = events.clone().count();
        if count == 0 {
            return Err(StructureError::Empty.into());
        }
        if count > MAX_EVENTS_PER_BATCH {
            return Err(StructureError::TooManyEvents(count).into());
        }
        let len = header.encoded_len()
            + events
                .clone()
                .map(|event| {
                    prost::encoding::key_len(BATCH_EVENTS_FIELD)
                        + prost::encoding::encoded_len_varint(event.len() as u64)
                        + event.len()
                })
                .sum::<usize>();
        if len > MAX_DECOMPRESSED_BYTES {
            return Err(EncodeError::EncodedTooLarge { len });
        }
        self.encoded.clear();
        self.encoded.reserve(len);
        header
            .encode(&mut self.encoded)
            .map_err(|error| EncodeError::Compression(std::io::Error::other(error)))?;
        // A repeated message field is a run of (key, length, bytes): appending encoded events
        // after the header fields is the same encoding prost would write.
        for event in events {
            prost::encoding::encode_key(
                BATCH_EVENTS_FIELD,
                WireType::LengthDelimited,
                &mut self.encoded,
            );
            prost::encoding::encode_varint(event.len() as u64, &mut self.encoded);
            self.encoded.extend_from_slice(event);
        }
        self.compress(limit, out)
    }

    fn compress(&mut self, limit: usize, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        out.clear();
        out.reserve(zstd::zstd_safe::compress_bound(self.encoded.len()));
        self.compressor
            .compress_to_buffer(&self.encoded[..], out)
            .map_err(EncodeError::Compression)?;
        let limit = limit.min(MAX_COMPRESSED_BYTES);
        if out.len() > limit {
            return Err(EncodeError::CompressedTooLarge {
                len: out.len(),
                limit,
            });
        }
        Ok(())
    }
}

/// Encodes one batch with a fresh encoder (convenience for tests and tools).
pub fn encode_batch(batch: &Batch) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::new();
    BatchEncoder::new(DEFAULT_COMPRESSION_LEVEL)?.encode(batch, MAX_COMPRESSED_BYTES, &mut out)?;
    Ok(out)
}

/// Decodes batches, reusing its decompression context, its decompression buffer and the parts of
/// the batches it decoded before ([`BatchDecoder::decode_into`]) between calls.
pub struct BatchDecoder {
    decompressor: zstd::bulk::Decompressor<'static>,
    /// The protobuf bytes of the payload being decoded (at most [`MAX_DECOMPRESSED_BYTES`]).
    decompressed: Vec<u8>,
    /// Emptied messages of batches decoded before, decoded into again.
    spare: recycle::Spare,
}

impl BatchDecoder {
    /// A decoder with the format's limits.
    pub fn new() -> Result<Self, DecodeError> {
        let decompressor = zstd::bulk::Decompressor::new().map_err(DecodeError::Decompression)?;
        Ok(Self {
            decompressor,
            decompressed: Vec::new(),
            spare: recycle::Spare::default(),
        })
    }

    /// Decompresses a payload into `out` (cleared first) without decoding the protobuf.
    pub fn decompress(&mut self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), DecodeError> {
        out.clear();
        if payload.len() > MAX_COMPRESSED_BYTES {
            return Err(DecodeError::CompressedTooLarge { len: payload.len() });
        }
        if payload.len() < ZSTD_MAGIC.len() || payload[..4] != ZSTD_MAGIC {
            return Err(DecodeError::NotZstd);
        }
        let declared = match zstd::zstd_safe::get_frame_content_size(payload) {
            Ok(Some(size)) => size,
            Ok(None) => return Err(DecodeError::MissingContentSize),
            Err(_) => return Err(DecodeError::BadFrameHeader),
        };
        if declared > MAX_DECOMPRESSED_BYTES as u64 {
            return Err(DecodeError::DecompressedTooLarge { declared });
        }
        let frame = zstd::zstd_safe::find_frame_compressed_size(payload).unwrap_or(0);
        if frame != payload.len() {
            return Err(DecodeError::FrameLength {
                payload: payload.len(),
                frame,
            });
        }
        // The declared size bounds the allocation; zstd fails if the frame holds more.
        out.reserve_exact(usize::try_from(declared).unwrap_or(MAX_DECOMPRESSED_BYTES));
        self.decompressor
            .decompress_to_buffer(payload, out)
            .map_err(DecodeError::Decompression)?;
        Ok(())
    }

    /// Decodes and checks one payload.
    pub fn decode(&mut self, payload: &[u8]) -> Result<Batch, DecodeError> {
        let mut batch = Batch::default();
        self.decode_into(payload, &mut batch)?;
        Ok(batch)
    }

    /// Decodes and checks one payload into `batch`, writing over the strings and lists of what it
    /// held (the batch this decoder decoded before, on a steady stream) rather than allocating
    /// them again. The result is what [`BatchDecoder::decode`] returns; after an error `batch`
    /// holds nothing of use.
    pub fn decode_into(&mut self, payload: &[u8], batch: &mut Batch) -> Result<(), DecodeError> {
        let mut decompressed = std::mem::take(&mut self.decompressed);
        let result = self
            .decompress(payload, &mut decompressed)
            .and_then(|()| decode_protobuf_into(&decompressed, batch, &mut self.spare));
        self.decompressed = decompressed;
        result
    }
}

/// Decodes and checks one payload with a fresh decoder.
pub fn decode_batch(payload: &[u8]) -> Result<Batch, DecodeError> {
    BatchDecoder::new()?.decode(payload)
}

/// Decodes and checks the protobuf encoding of a batch (already decompressed).
pub fn decode_batch_protobuf(bytes: &[u8]) -> Result<Batch, DecodeError> {
    let mut batch = Batch::default();
    decode_protobuf_into(bytes, &mut batch, &mut recycle::Spare::default())?;
    Ok(batch)
}

/// [`decode_batch_protobuf`] into `batch`, with the parts of `spare` (see [`recycle`]).
fn decode_protobuf_into(
    bytes: &[u8],
    batch: &mut Batch,
    spare: &mut recycle::Spare,
) -> Result<(), DecodeError> {
    if bytes.len() > MAX_DECOMPRESSED_BYTES {
        return Err(DecodeError::DecompressedTooLarge {
            declared: bytes.len() as u64,
        });
    }
    bound_fields(bytes)?;
    recycle::merge_batch(batch, spare, bytes)?;
    if batch.schema_version != SCHEMA_VERSION {
        return Err(DecodeError::UnsupportedSchema {
            found: batch.schema_version,
        });
    }
    check_structure(batch)?;
    Ok(())
}

/// Counts events and fields without building anything, refusing batches over the limits.
///
/// Length-delimited fields are scanned as nested messages down to the third level (batch → event →
/// event kind), where every repeated message of the schema sits. A length-delimited field that is not
/// a message (a string) ends its own scan early; the protobuf decoder judges its validity later.
fn bound_fields(bytes: &[u8]) -> Result<(), DecodeError> {
    let mut count = FieldCount::default();
    scan_message(bytes, 0, &mut count)?;
    if count.events > MAX_EVENTS_PER_BATCH {
        return Err(DecodeError::TooManyEvents);
    }
    Ok(())
}

/// Deepest nesting level scanned by [`bound_fields`] (0 = the batch itself).
const SCAN_DEPTH: usize = 2;

/// What [`scan_message`] counted so far.
#[derive(Debug, Default, PartialEq, Eq)]
struct FieldCount {
    /// Fields at the scanned levels.
    fields: usize,
    /// `Batch.events` fields (at level 0).
    events: usize,
}

/// Counts the fields of `buf` at `depth` and below (to [`SCAN_DEPTH`]), refusing past
/// [`MAX_FIELDS_PER_BATCH`]; stops at the first field it cannot read. It runs over every byte of
/// every batch: no callback, and a one-byte key (every field of this schema) read in place.
fn scan_message(mut buf: &[u8], depth: usize, count: &mut FieldCount) -> Result<(), DecodeError> {
    while let Some(&first) = buf.first() {
        let (number, wire_type) = if first < 0x80 {
            // `decode_key` of a one-byte key: field 0 and wire types 6 and 7 are invalid.
            buf = &buf[1..];
            let Ok(wire_type) = WireType::try_from(u64::from(first & 0x07)) else {
                return Ok(());
            };
            let number = u32::from(first >> 3);
            if number == 0 {
                return Ok(());
            }
            (number, wire_type)
        } else {
            let Ok(key) = decode_key(&mut buf) else {
                return Ok(());
            };
            key
        };
        count.fields += 1;
        if count.fields > MAX_FIELDS_PER_BATCH {
            return Err(DecodeError::TooManyFields);
        }
        if depth == 0 && number == BATCH_EVENTS_FIELD {
            count.events += 1;
        }
        let skip = match wire_type {
            WireType::Varint => match varint_len(buf) {
                Some(len) => len,
                None => return Ok(()),
            },
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => {
                let len = match buf.first() {
                    Some(&len) if len < 0x80 => {
                        buf = &buf[1..];
                        u64::from(len)
                    }
                    _ => match decode_varint(&mut buf) {
                        Ok(len) => len,
                        Err(_) => return Ok(()),
                    },
                };
                let Ok(len) = usize::try_from(len) else {
                    return Ok(());
                };
                if len > buf.len() {
                    return Ok(());
                }
                if depth < SCAN_DEPTH {
                    scan_message(&buf[..len], depth + 1, count)?;
                }
                len
            }
            // Groups are not used by this schema; the decoder rejects or skips them.
            WireType::StartGroup | WireType::EndGroup => return Ok(()),
        };
        if skip > buf.len() {
            return Ok(());
        }
        buf = &buf[skip..];
    }
    Ok(())
}

/// The length of the varint at the start of `buf`, where `decode_varint` would read one (at most
/// ten bytes, the tenth below 2); `None` where it would fail.
fn varint_len(buf: &[u8]) -> Option<usize> {
    for (at, &byte) in buf.iter().take(10).enumerate() {
        if byte < 0x80 {
            return (at < 9 || byte < 0x02).then_some(at + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{CustomEvent, Event, event};

    fn batch_with(events: Vec<Event>) -> Batch {
        Batch {
            schema_version: SCHEMA_VERSION,
            machine_id: "truck-17".into(),
            site_id: "pit-3".into(),
            agent_epoch: 0xfeed,
            tier: Tier::Safety as i32,
            first_seq: events.first().map_or(0, |e| e.seq),
            last_seq: events.last().map_or(0, |e| e.seq),
            sent_time_unix_ns: 1_700_000_000_000_000_000,
            events,
            machine_class: "haul-truck".into(),
            agent_version: "0.1.0".into(),
        }
    }

    fn custom(seq: u64) -> Event {
        Event {
            seq,
            event_time_unix_ns: 1_700_000_000_000_000_000 + seq as i64,
            monotonic_ns: seq,
            kind: Some(event::Kind::Custom(CustomEvent {
                name: "door-opened".into(),
                attributes: vec![],
            })),
        }
    }

    /// The scan as it was first written (`decode_key` for every key, a callback per field of
    /// the batch), the reference for [`scan_message`].
    fn reference_scan(
        mut buf: &[u8],
        depth: usize,
        fields: &mut usize,
        on_top_level_field: &mut dyn FnMut(u32),
    ) -> Result<(), DecodeError> {
        while !buf.is_empty() {
            let Ok((number, wire_type)) = decode_key(&mut buf) else {
                return Ok(());
            };
            *fields += 1;
            if *fields > MAX_FIELDS_PER_BATCH {
                return Err(DecodeError::TooManyFields);
            }
            if depth == 0 {
                on_top_level_field(number);
            }
            let skip = match wire_type {
                WireType::Varint => match decode_varint(&mut buf) {
                    Ok(_) => 0,
                    Err(_) => return Ok(()),
                },
                WireType::SixtyFourBit => 8,
                WireType::ThirtyTwoBit => 4,
                WireType::LengthDelimited => {
                    let Ok(len) = decode_varint(&mut buf) else {
                        return Ok(());
                    };
                    let Ok(len) = usize::try_from(len) else {
                        return Ok(());
                    };
                    if len > buf.len() {
                        return Ok(());
                    }
                    if depth < SCAN_DEPTH {
                        reference_scan(&buf[..len], depth + 1, fields, &mut |_| {})?;
                    }
                    len
                }
                WireType::StartGroup | WireType::EndGroup => return Ok(()),
            };
            if skip > buf.len() {
                return Ok(());
            }
            buf = &buf[skip..];
        }
        Ok(())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

        /// `varint_len` reads a varint where `decode_varint` does, and fails where it fails.
        #[test]
        fn a_varint_is_skipped_where_prost_reads_it(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![0x80u8..=0xff, 0u8..0x80, 0u8..3],
                0..14,
            ),
        ) {
            let mut rest = bytes.as_slice();
            let read = decode_varint(&mut rest).ok().map(|_| bytes.len() - rest.len());
            proptest::prop_assert_eq!(varint_len(&bytes), read);
        }

        /// Over valid batches with bytes changed and over arbitrary bytes, the scan counts what
        /// the reference counts, and stops or refuses where it does.
        #[test]
        fn the_field_scan_counts_what_the_reference_scan_counts(
            events in 1u64..30,
            flips in proptest::collection::vec(
                (proptest::prelude::any::<proptest::sample::Index>(), proptest::prelude::any::<u8>()),
                0..6,
            ),
            noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            let mut bytes = batch_with((1..=events).map(custom).collect()).encode_to_vec();
            for (index, value) in flips {
                let i = index.index(bytes.len());
                bytes[i] ^= value;
            }
            for input in [bytes.as_slice(), noise.as_slice()] {
                let mut count = FieldCount::default();
                let scanned = scan_message(input, 0, &mut count).map_err(|e| e.to_string());
                let mut reference = FieldCount::default();
                let expected = reference_scan(input, 0, &mut reference.fields, &mut |number| {
                    if number == BATCH_EVENTS_FIELD {
                        reference.events += 1;
                    }
                })
                .map_err(|e| e.to_string());
                proptest::prop_assert_eq!(scanned, expected);
                proptest::prop_assert_eq!(count, reference);
            }
        }
    }

    #[test]
    fn a_batch_survives_encoding_and_decoding() {
        let batch = batch_with((5..=9).map(custom).collect());
        let payload = encode_batch(&batch).unwrap();
        assert_eq!(payload[..4], ZSTD_MAGIC);
        assert_eq!(decode_batch(&payload).unwrap(), batch);
    }

    #[test]
    fn encoder_refuses_batches_that_a_reader_would_refuse() {
        let mut batch = batch_with(vec![custom(3), custom(3)]);
        assert!(matches!(
            encode_batch(&batch),
            Err(EncodeError::Malformed(StructureError::SequenceOrder {
                index: 1
            }))
        ));
        batch.events.clear();
        assert!(matches!(
            encode_batch(&batch),
            Err(EncodeError::Malformed(StructureError::Empty))
        ));
    }

    #[test]
    fn encoder_reports_a_payload_over_the_callers_limit() {
        let batch = batch_with((1..=200).map(custom).collect());
        let mut encoder = BatchEncoder::new(DEFAULT_COMPRESSION_LEVEL).unwrap();
        let mut out = Vec::new();
        assert!(matches!(
            encoder.encode(&batch, 16, &mut out),
            Err(EncodeError::CompressedTooLarge { limit: 16, .. })
        ));
    }

    #[test]
    fn spliced_encoding_equals_encoding_the_decoded_batch() {
        let batch = batch_with((3..=7).map(custom).collect());
        let stored: Vec<Vec<u8>> = batch.events.iter().map(Message::encode_to_vec).collect();
        let header = Batch {
            events: Vec::new(),
            ..batch.clone()
        };
        let mut encoder = BatchEncoder::new(DEFAULT_COMPRESSION_LEVEL).unwrap();
        let mut out = Vec::new();
        encoder
            .encode_spliced(
                &header,
                stored.iter().map(Vec::as_slice),
                MAX_COMPRESSED_BYTES,
                &mut out,
            )
            .unwrap();
        assert_eq!(decode_batch(&out).unwrap(), batch);
        assert!(matches!(
            encoder.encode_spliced(&header, std::iter::empty(), MAX_COMPRESSED_BYTES, &mut out),
            Err(EncodeError::Malformed(StructureError::Empty))
        ));
    }

    #[test]
    fn declared_range_must_match_the_events() {
        let mut batch = batch_with(vec![custom(1), custom(2)]);
        batch.last_seq = 7;
        assert!(matches!(
            check_structure(&batch),
            Err(StructureError::SequenceRange { last: 7, .. })
        ));
    }

    #[test]
    fn unknown_tier_and_bad_ids_are_malformed() {
        let mut batch = batch_with(vec![custom(1)]);
        batch.tier = 9;
        assert_eq!(check_structure(&batch), Err(StructureError::Tier(9)));
        batch.tier = Tier::Debug as i32;
        batch.machine_id = "a/b".into();
        assert!(matches!(
            check_structure(&batch),
            Err(StructureError::MachineId(_))
        ));
    }
}

//! Checks that bytes are an `edgewatch.v1.Event` exactly as prost's `Event::decode` would accept
//! them, in one pass over the bytes and without building the message (no allocation).
//!
//! Invariants:
//! - [`field`] accepts a top-level field of an `Event` if and only if prost would decode it: the
//!   same key rules (a varint of at most 32 bits, a known wire type, field number at least 1),
//!   varints of at most ten bytes without overflow, the wire type each known field requires
//!   (packed or not for repeated scalars), lengths inside their message, UTF-8 in strings,
//!   unknown fields skipped as prost skips them (groups included) and prost's recursion limit.
//! - [`MESSAGES`] is the schema of `proto/edgewatch/v1/event.proto` from `Event` down; a test
//!   compares it with the descriptor compiled from that file, and another compares this check
//!   with `Event::decode` on random and mutated encodings.
//! - Pure logic: no I/O, no clock.

/// How a known field's value is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// `Fixed32` and `Bytes` are the wire kinds no field of the schema uses today.
#[allow(dead_code)]
pub(crate) enum Check {
    /// int32, int64, uint32, uint64, sint32, sint64, bool, enum: a varint.
    Varint,
    /// fixed64, sfixed64, double: eight bytes.
    Fixed64,
    /// fixed32, sfixed32, float: four bytes.
    Fixed32,
    /// string: length-delimited UTF-8.
    Str,
    /// bytes: length-delimited.
    Bytes,
    /// A message, by its index in [`MESSAGES`].
    Message(u8),
}

/// A known field of a message.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Field {
    pub number: u32,
    pub check: Check,
    pub repeated: bool,
}

/// A message: its name (for the schema test) and its fields, in increasing number.
#[derive(Debug)]
pub(crate) struct Schema {
    #[cfg_attr(not(test), allow(dead_code))]
    pub name: &'static str,
    pub fields: &'static [Field],
    /// Field number → index in `fields` plus one (0: unknown), so a lookup is one load.
    by_number: [u8; 32],
}

impl Schema {
    /// Fails to compile if a field number is 32 or more (no message of the schema has one yet).
    const fn new(name: &'static str, fields: &'static [Field]) -> Self {
        let mut by_number = [0u8; 32];
        let mut i = 0;
        while i < fields.len() {
            let number = fields[i].number as usize;
            assert!(
                number < 32,
                "field numbers of 32 and more need a larger index"
            );
            by_number[number] = (i + 1) as u8;
            i += 1;
        }
        Self {
            name,
            fields,
            by_number,
        }
    }

    #[inline]
    fn find(&self, number: u32) -> Option<Field> {
        let at = *self.by_number.get(number as usize)?;
        let at = at.checked_sub(1)?;
        self.fields.get(usize::from(at)).copied()
    }
}

const fn def(number: u32, check: Check, repeated: bool) -> Field {
    Field {
        number,
        check,
        repeated,
    }
}

/// prost's default recursion limit (`DecodeContext`).
pub(crate) const RECURSION_LIMIT: u32 = 100;

/// Wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// Reads a varint at `pos` as prost does (at most ten bytes, the tenth 0 or 1); returns the
/// value and the position after it.
#[inline(always)]
pub(crate) fn varint(bytes: &[u8], pos: usize) -> Option<(u64, usize)> {
    match bytes.get(pos..pos + 2) {
        // One and two bytes (field keys up to 2047, lengths up to 16 KiB) without a loop.
        Some(&[low, _]) if low < 0x80 => Some((u64::from(low), pos + 1)),
        Some(&[low, high]) if high < 0x80 => {
            Some((u64::from(low & 0x7f) | u64::from(high) << 7, pos + 2))
        }
        _ => varint_long(bytes, pos),
    }
}

#[inline(never)]
fn varint_long(bytes: &[u8], mut pos: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for count in 0..10 {
        let byte = *bytes.get(pos)?;
        pos += 1;
        value |= u64::from(byte & 0x7f) << (count * 7);
        if byte < 0x80 {
            return (count < 9 || byte < 0x02).then_some((value, pos));
        }
    }
    None
}

/// Where the varint at `pos` ends, with the checks of [`varint`] but without assembling its
/// value (a varint field's value is not needed to check it): the bytes that end it are found in
/// one eight-byte load. Timestamps in nanoseconds, nine bytes long, are in every event.
#[inline(always)]
pub(crate) fn varint_end(bytes: &[u8], pos: usize) -> Option<usize> {
    let Some(word) = bytes.get(pos..pos + 8) else {
        return Some(varint(bytes, pos)?.1);
    };
    let word = u64::from_le_bytes(word.try_into().ok()?);
    let last = !word & 0x8080_8080_8080_8080;
    if last != 0 {
        return Some(pos + (last.trailing_zeros() / 8) as usize + 1);
    }
    // Eight bytes with the continuation bit: the ninth ends it, or else the tenth, which must
    // be 0 or 1 (more would overflow 64 bits).
    if *bytes.get(pos + 8)? < 0x80 {
        return Some(pos + 9);
    }
    (*bytes.get(pos + 9)? < 0x02).then_some(pos + 10)
}

/// Reads a field key at `pos`: field number, wire type, position after it.
pub(crate) fn key(bytes: &[u8], pos: usize) -> Option<(u32, u8, usize)> {
    let (key, pos) = varint(bytes, pos)?;
    let key = u32::try_from(key).ok()?;
    let wire = (key & 7) as u8;
    let number = key >> 3;
    (wire <= FIXED32 && number >= 1).then_some((number, wire, pos))
}

/// A length-delimited value at `pos`: its bytes' range.
fn delimited(bytes: &[u8], pos: usize) -> Option<(usize, usize)> {
    let (len, pos) = varint(bytes, pos)?;
    let end = pos.checked_add(usize::try_from(len).ok()?)?;
    (end <= bytes.len()).then_some((pos, end))
}

/// Checks the value of field `number` (wire type `wire`, starting at `pos`) of message `schema`
/// with `budget` levels of recursion left; returns the position after it. Inlined into the loop
/// of [`message`]: a call per nested message, not per field (the calls' register saves and the
/// dispatch behind them were most of the check's time).
#[inline(always)]
pub(crate) fn field(
    bytes: &[u8],
    schema: &Schema,
    number: u32,
    wire: u8,
    pos: usize,
    budget: u32,
) -> Option<usize> {
    let Some(known) = schema.find(number) else {
        return skip(bytes, number, wire, pos, budget);
    };
    match (known.check, wire) {
        (Check::Varint, VARINT) => varint_end(bytes, pos),
        (Check::Fixed64, FIXED64) => fixed(bytes, pos, 8),
        (Check::Fixed32, FIXED32) => fixed(bytes, pos, 4),
        (Check::Str, LEN) => {
            let (start, end) = delimited(bytes, pos)?;
            utf8(&bytes[start..end]).then_some(end)
        }
        (Check::Bytes, LEN) => Some(delimited(bytes, pos)?.1),
        (Check::Message(index), LEN) => {
            // prost checks the limit before entering the message, whose fields get one less.
            let inner = budget.checked_sub(1)?;
            let (start, end) = delimited(bytes, pos)?;
            message(&bytes[start..end], &MESSAGES[usize::from(index)], inner)?;
            Some(end)
        }
        (Check::Varint | Check::Fixed64 | Check::Fixed32, LEN) if known.repeated => {
            let (mut at, end) = delimited(bytes, pos)?;
            let packed = &bytes[..end];
            while at < end {
                at = match known.check {
                    Check::Varint => varint_end(packed, at)?,
                    Check::Fixed64 => fixed(packed, at, 8)?,
                    _ => fixed(packed, at, 4)?,
                };
            }
            Some(end)
        }
        _ => None,
    }
}

/// Checks every field of a message's bytes.
#[inline(never)]
pub(crate) fn message(bytes: &[u8], schema: &Schema, budget: u32) -> Option<()> {
    let mut pos = 0;
    while pos < bytes.len() {
        let (number, wire, after) = key(bytes, pos)?;
        pos = field(bytes, schema, number, wire, after, budget)?;
    }
    Some(())
}

/// True if `bytes` are UTF-8. Text here is mostly ASCII: the bytes are OR-ed together 32 at a
/// time, then in words, the last word ending at the last byte (it may overlap the one before:
/// OR-ing a byte twice changes nothing), without an early exit; only text with a byte of 0x80
/// or more takes the full validation.
#[inline]
fn utf8(bytes: &[u8]) -> bool {
    let high = if bytes.len() >= 8 {
        let (blocks, rest) = bytes.as_chunks::<32>();
        let blocks = blocks.iter().fold(0u64, |acc, block| {
            let (w, _) = block.as_chunks::<8>();
            acc | (u64::from_ne_bytes(w[0]) | u64::from_ne_bytes(w[1]))
                | (u64::from_ne_bytes(w[2]) | u64::from_ne_bytes(w[3]))
        });
        let (words, _) = rest.as_chunks::<8>();
        let words = words
            .iter()
            .fold(0u64, |acc, w| acc | u64::from_ne_bytes(*w));
        blocks
            | words
            | bytes
                .last_chunk::<8>()
                .map_or(0, |w| u64::from_ne_bytes(*w))
    } else {
        bytes.iter().fold(0u64, |acc, &byte| acc | u64::from(byte))
    };
    high & 0x8080_8080_8080_8080 == 0 || std::str::from_utf8(bytes).is_ok()
}

fn fixed(bytes: &[u8], pos: usize, len: usize) -> Option<usize> {
    let end = pos.checked_add(len)?;
    (end <= bytes.len()).then_some(end)
}

/// Checks the top-level field of an `Event` at `pos` as prost would, refusing groups (the uplink
/// splices records without decoding them); returns its number and where it ends.
pub(crate) fn top_field(event: &[u8], pos: usize) -> Option<(u32, usize)> {
    let (number, wire, after) = key(event, pos)?;
    if wire == START_GROUP || wire == END_GROUP {
        return None;
    }
    let end = field(event, &MESSAGES[0], number, wire, after, RECURSION_LIMIT)?;
    Some((number, end))
}

/// Skips a top-level field of wire type `wire` whose value starts at `pos`, looking only at its
/// length (groups are not skipped); returns the position after it.
pub(crate) fn skip_top(bytes: &[u8], wire: u8, pos: usize) -> Option<usize> {
    match wire {
        VARINT => varint_end(bytes, pos),
        FIXED64 => fixed(bytes, pos, 8),
        FIXED32 => fixed(bytes, pos, 4),
        LEN => Some(delimited(bytes, pos)?.1),
        _ => None,
    }
}

/// Skips an unknown field as prost's `skip_field` does.
fn skip(bytes: &[u8], number: u32, wire: u8, pos: usize, budget: u32) -> Option<usize> {
    if budget == 0 {
        return None;
    }
    match wire {
        VARINT => varint_end(bytes, pos),
        FIXED64 => fixed(bytes, pos, 8),
        FIXED32 => fixed(bytes, pos, 4),
        LEN => Some(delimited(bytes, pos)?.1),
        START_GROUP => {
            let mut pos = pos;
            loop {
                let (inner, inner_wire, after) = key(bytes, pos)?;
                if inner_wire == END_GROUP {
                    return (inner == number).then_some(after);
                }
                pos = skip(bytes, inner, inner_wire, after, budget - 1)?;
            }
        }
        _ => None,
    }
}

/// The schema of `Event` and every message under it; `Event` is the first.
#[rustfmt::skip]
pub(crate) static MESSAGES: [Schema; 30] = [
    Schema::new(
        "Event",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Varint, false),
            def(3, Check::Varint, false),
            def(10, Check::Message(1), false),
            def(11, Check::Message(2), false),
            def(12, Check::Message(3), false),
            def(13, Check::Message(4), false),
            def(14, Check::Message(5), false),
            def(15, Check::Message(6), false),
            def(16, Check::Message(6), false),
            def(17, Check::Message(7), false),
            def(18, Check::Message(8), false),
            def(19, Check::Message(9), false),
            def(20, Check::Message(10), false),
            def(21, Check::Message(11), false),
            def(22, Check::Message(12), false),
            def(23, Check::Message(13), false),
            def(24, Check::Message(14), false),
            def(25, Check::Message(15), false),
            def(26, Check::Message(16), false),
            def(27, Check::Message(17), false),
            def(28, Check::Message(18), false),
            def(29, Check::Message(19), false),
        ],
    ),
    Schema::new(
        "DeadlineCounters",
        &[
            def(1, Check::Message(20), false),
            def(2, Check::Message(21), false),
            def(3, Check::Varint, false),
            def(4, Check::Fixed64, false),
            def(5, Check::Varint, false),
            def(6, Check::Varint, false),
            def(7, Check::Varint, false),
            def(8, Check::Varint, false),
            def(9, Check::Varint, false),
            def(10, Check::Varint, false),
            def(11, Check::Varint, false),
            def(12, Check::Message(22), false),
            def(13, Check::Varint, false),
            def(14, Check::Varint, false),
            def(15, Check::Varint, false),
            def(16, Check::Varint, false),
            def(17, Check::Varint, false),
            def(18, Check::Varint, false),
        ],
    ),
    Schema::new(
        "DeadlineMissBurst",
        &[
            def(1, Check::Message(20), false),
            def(2, Check::Message(21), false),
            def(3, Check::Varint, false),
            def(4, Check::Varint, false),
            def(5, Check::Varint, false),
            def(6, Check::Varint, false),
            def(7, Check::Varint, false),
            def(8, Check::Varint, false),
            def(9, Check::Varint, false),
            def(10, Check::Varint, false),
        ],
    ),
    Schema::new(
        "SafetyFallback",
        &[
            def(1, Check::Message(20), false),
            def(2, Check::Message(21), false),
            def(3, Check::Varint, false),
            def(4, Check::Varint, false),
            def(5, Check::Str, false),
            def(6, Check::Varint, false),
        ],
    ),
    Schema::new(
        "ProbeStatus",
        &[
            def(1, Check::Message(20), false),
            def(2, Check::Varint, false),
            def(3, Check::Fixed64, false),
            def(4, Check::Varint, false),
            def(5, Check::Varint, false),
            def(6, Check::Str, false),
        ],
    ),
    Schema::new(
        "ThermalSample",
        &[
            def(1, Check::Message(23), true),
            def(2, Check::Message(24), true),
            def(3, Check::Fixed64, true),
            def(4, Check::Varint, true),
            def(5, Check::Fixed64, false),
            def(6, Check::Varint, true),
            def(7, Check::Varint, false),
            def(8, Check::Varint, false),
            def(9, Check::Varint, false),
        ],
    ),
    Schema::new(
        "Throttle",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Varint, false),
            def(3, Check::Str, false),
            def(4, Check::Fixed64, false),
            def(5, Check::Fixed64, false),
            def(6, Check::Varint, false),
            def(7, Check::Varint, false),
            def(8, Check::Fixed64, false),
        ],
    ),
    Schema::new(
        "ThrottleCounters",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Message(25), true),
            def(3, Check::Message(21), false),
        ],
    ),
    Schema::new(
        "OverCurrent",
        &[
            def(1, Check::Str, false),
            def(2, Check::Varint, false),
            def(3, Check::Varint, false),
        ],
    ),
    Schema::new(
        "EnergyCounters",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Message(26), true),
            def(3, Check::Message(21), false),
        ],
    ),
    Schema::new(
        "AutonomyModeChange",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Varint, false),
            def(3, Check::Str, false),
            def(4, Check::Varint, false),
            def(5, Check::Varint, false),
        ],
    ),
    Schema::new(
        "AutonomySeconds",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Message(27), true),
            def(3, Check::Message(21), false),
        ],
    ),
    Schema::new(
        "Intervention",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Varint, false),
            def(3, Check::Str, false),
            def(4, Check::Varint, false),
            def(5, Check::Message(21), false),
            def(6, Check::Varint, false),
        ],
    ),
    Schema::new(
        "SafeStop",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Varint, false),
            def(3, Check::Str, false),
            def(4, Check::Varint, false),
            def(5, Check::Message(21), false),
            def(6, Check::Varint, false),
        ],
    ),
    Schema::new(
        "ModelVersionChange",
        &[
            def(1, Check::Message(20), false),
            def(2, Check::Message(21), false),
            def(3, Check::Message(21), false),
        ],
    ),
    Schema::new(
        "QueueLoss",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Varint, false),
            def(3, Check::Varint, false),
            def(4, Check::Varint, false),
            def(5, Check::Varint, false),
            def(6, Check::Fixed64, false),
            def(7, Check::Varint, false),
            def(8, Check::Varint, false),
        ],
    ),
    Schema::new(
        "OfflineWindowLow",
        &[
            def(1, Check::Fixed64, false),
            def(2, Check::Fixed64, false),
            def(3, Check::Fixed64, false),
            def(4, Check::Varint, false),
        ],
    ),
    Schema::new(
        "AgentHealth",
        &[
            def(1, Check::Str, false),
            def(2, Check::Fixed64, false),
            def(3, Check::Varint, false),
            def(4, Check::Fixed64, false),
            def(5, Check::Message(28), true),
            def(6, Check::Fixed64, false),
            def(7, Check::Varint, false),
            def(8, Check::Varint, false),
            def(9, Check::Varint, false),
            def(10, Check::Str, false),
            def(11, Check::Str, false),
            def(12, Check::Fixed64, false),
            def(13, Check::Varint, false),
        ],
    ),
    Schema::new(
        "LogRecord",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Str, false),
            def(3, Check::Str, false),
            def(4, Check::Message(29), true),
        ],
    ),
    Schema::new(
        "CustomEvent",
        &[
            def(1, Check::Str, false),
            def(2, Check::Message(29), true),
        ],
    ),
    Schema::new(
        "LoopRef",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Str, false),
        ],
    ),
    Schema::new(
        "ModelVersion",
        &[
            def(1, Check::Str, false),
            def(2, Check::Str, false),
            def(3, Check::Fixed64, false),
            def(4, Check::Str, false),
            def(5, Check::Str, false),
            def(6, Check::Str, false),
            def(7, Check::Str, false),
            def(8, Check::Varint, false),
        ],
    ),
    Schema::new(
        "LatencyHistogram",
        &[
            def(1, Check::Varint, true),
            def(2, Check::Varint, true),
        ],
    ),
    Schema::new(
        "Temperature",
        &[
            def(1, Check::Str, false),
            def(2, Check::Fixed64, false),
        ],
    ),
    Schema::new(
        "RailPower",
        &[
            def(1, Check::Str, false),
            def(2, Check::Fixed64, false),
            def(3, Check::Fixed64, false),
        ],
    ),
    Schema::new(
        "ComponentSeconds",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Fixed64, false),
        ],
    ),
    Schema::new(
        "RailEnergy",
        &[
            def(1, Check::Str, false),
            def(2, Check::Fixed64, false),
        ],
    ),
    Schema::new(
        "ModeSeconds",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Fixed64, false),
        ],
    ),
    Schema::new(
        "TierHealth",
        &[
            def(1, Check::Varint, false),
            def(2, Check::Varint, false),
            def(3, Check::Varint, false),
            def(4, Check::Fixed64, false),
            def(5, Check::Varint, false),
            def(6, Check::Varint, false),
            def(7, Check::Varint, false),
        ],
    ),
    Schema::new(
        "Attribute",
        &[
            def(1, Check::Str, false),
            def(2, Check::Str, false),
            def(3, Check::Varint, false),
            def(4, Check::Fixed64, false),
            def(5, Check::Varint, false),
        ],
    ),
];

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::Path;

    use edgewatch_proto::v1::{self as pb, Event, event::Kind};
    use prost::Message;
    use prost_reflect::{Cardinality, DescriptorPool, Kind as FieldKind};

    use super::*;

    fn pool() -> DescriptorPool {
        let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
        let fds = protox::compile(["edgewatch/v1/event.proto"], [&proto]).unwrap();
        DescriptorPool::from_file_descriptor_set(fds).unwrap()
    }

    #[test]
    fn the_schema_table_is_the_event_proto_from_event_down() {
        let pool = pool();
        let mut reachable = vec!["Event".to_owned()];
        let mut i = 0;
        while let Some(name) = reachable.get(i).cloned() {
            let descriptor = pool
                .get_message_by_name(&format!("edgewatch.v1.{name}"))
                .unwrap();
            let schema = MESSAGES
                .iter()
                .find(|schema| schema.name == name)
                .unwrap_or_else(|| panic!("{name} is missing from the table"));
            let mut expected: Vec<(u32, Check, bool)> = descriptor
                .fields()
                .map(|field| {
                    let check = match field.kind() {
                        FieldKind::Double | FieldKind::Fixed64 | FieldKind::Sfixed64 => {
                            Check::Fixed64
                        }
                        FieldKind::Float | FieldKind::Fixed32 | FieldKind::Sfixed32 => {
                            Check::Fixed32
                        }
                        FieldKind::String => Check::Str,
                        FieldKind::Bytes => Check::Bytes,
                        FieldKind::Message(message) => {
                            let inner = message.name().to_owned();
                            if !reachable.contains(&inner) {
                                reachable.push(inner.clone());
                            }
                            let index = MESSAGES
                                .iter()
                                .position(|schema| schema.name == inner)
                                .unwrap_or_else(|| panic!("{inner} is missing from the table"));
                            Check::Message(index as u8)
                        }
                        _ => Check::Varint,
                    };
                    assert!(!field.is_map(), "maps are not in the table's vocabulary");
                    let repeated = field.cardinality() == Cardinality::Repeated;
                    (field.number(), check, repeated)
                })
                .collect();
            expected.sort_by_key(|field| field.0);
            let table: Vec<(u32, Check, bool)> = schema
                .fields
                .iter()
                .map(|field| (field.number, field.check, field.repeated))
                .collect();
            assert_eq!(table, expected, "fields of {name}");
            i += 1;
        }
        assert_eq!(MESSAGES[0].name, "Event");
        assert_eq!(
            reachable.len(),
            MESSAGES.len(),
            "the table holds only what Event reaches"
        );
    }

    /// What the queue accepted before this check: prost decodes the bytes, and their top level
    /// is a sequence of fields without groups.
    fn accepted_before(bytes: &[u8]) -> bool {
        if Event::decode(bytes).is_err() {
            return false;
        }
        let mut pos = 0;
        while pos < bytes.len() {
            let Some((_, wire_type, after)) = key(bytes, pos) else {
                return false;
            };
            let end = match wire_type {
                VARINT => varint(bytes, after).map(|v| v.1),
                FIXED64 => fixed(bytes, after, 8),
                LEN => delimited(bytes, after).map(|v| v.1),
                FIXED32 => fixed(bytes, after, 4),
                _ => None,
            };
            let Some(end) = end else {
                return false;
            };
            pos = end;
        }
        true
    }

    /// What `record::validate` and `record::encode` accept: every top-level field passes.
    fn accepted_now(bytes: &[u8]) -> bool {
        let mut pos = 0;
        while pos < bytes.len() {
            match top_field(bytes, pos) {
                Some((_, end)) => pos = end,
                None => return false,
            }
        }
        true
    }

    /// Events of every kind with every field set, nested messages and packed repeats included.
    fn seeds() -> Vec<Vec<u8>> {
        let loop_ref = Some(pb::LoopRef {
            loop_id: 7,
            loop_name: "steer".into(),
        });
        let model = Some(pb::ModelVersion {
            name: "det".into(),
            version: "1.2".into(),
            id_hash: u64::MAX,
            engine_sha256: "ab".into(),
            tensorrt_version: "8".into(),
            cuda_version: "12".into(),
            l4t_version: "36".into(),
            source: 2,
        });
        let kinds = vec![
            Kind::DeadlineCounters(pb::DeadlineCounters {
                control_loop: loop_ref.clone(),
                model: model.clone(),
                start_time_unix_ns: -5,
                producer_epoch: 9,
                period_ns: 1_000_000,
                cycles: 300,
                misses: 2,
                response_time: Some(pb::LatencyHistogram {
                    bounds_ns: vec![1, 300, u64::MAX],
                    counts: vec![0, 5, 1 << 40],
                }),
                mode: 1,
                activations: Some(0),
                ..Default::default()
            }),
            Kind::DeadlineMissBurst(pb::DeadlineMissBurst {
                control_loop: loop_ref.clone(),
                misses: 3,
                ..Default::default()
            }),
            Kind::ThermalSample(pb::ThermalSample {
                temperatures: vec![pb::Temperature {
                    zone: "cpu".into(),
                    celsius: Some(41.5),
                }],
                rails: vec![pb::RailPower {
                    rail: "VDD_IN".into(),
                    current_mw: 4200.0,
                    average_mw: Some(4100.0),
                }],
                cpu_load_pct: vec![1.0, 99.5, 0.0],
                cpu_freq_mhz: vec![1200, 2200],
                gpu_load_pct: Some(3.0),
                gpu_freq_mhz: vec![900],
                emc_freq_mhz: Some(3199),
                ram_used_mb: Some(1000),
                ram_total_mb: Some(8000),
            }),
            Kind::Custom(pb::CustomEvent {
                name: "door-open ✓".into(),
                attributes: vec![
                    pb::Attribute {
                        key: "s".into(),
                        value: Some(pb::attribute::Value::StringValue("é".into())),
                    },
                    pb::Attribute {
                        key: "i".into(),
                        value: Some(pb::attribute::Value::IntValue(-1)),
                    },
                    pb::Attribute {
                        key: "d".into(),
                        value: Some(pb::attribute::Value::DoubleValue(0.5)),
                    },
                    pb::Attribute {
                        key: "b".into(),
                        value: Some(pb::attribute::Value::BoolValue(true)),
                    },
                ],
            }),
            Kind::ModelVersionChange(pb::ModelVersionChange {
                control_loop: loop_ref,
                ..Default::default()
            }),
            Kind::SafetyFallback(pb::SafetyFallback::default()),
            Kind::ProbeStatus(pb::ProbeStatus::default()),
            Kind::QueueLoss(pb::QueueLoss::default()),
            Kind::AgentHealth(pb::AgentHealth::default()),
            Kind::Log(pb::LogRecord::default()),
        ];
        kinds
            .into_iter()
            .map(|kind| {
                Event {
                    seq: 3,
                    event_time_unix_ns: 1_700_000_000_000_000_000,
                    monotonic_ns: 42,
                    kind: Some(kind),
                }
                .encode_to_vec()
            })
            .collect()
    }

    #[test]
    fn every_seed_event_is_accepted() {
        for seed in seeds() {
            assert!(accepted_now(&seed));
        }
    }

    #[test]
    fn unknown_fields_nested_groups_and_the_recursion_limit_are_judged_as_prost_judges_them() {
        let event = seeds().remove(3);
        // An unknown varint, fixed and length-delimited field inside the custom event.
        let custom = Event::decode(event.as_slice()).unwrap();
        let Some(Kind::Custom(inner)) = custom.kind else {
            unreachable!()
        };
        let mut body = inner.encode_to_vec();
        body.extend_from_slice(&[0xf8, 0x01, 0x05, 0x81, 0x01, 1, 2, 3, 4, 5, 6, 7, 8]);
        body.extend_from_slice(&[0x8a, 0x01, 0x02, 0xff, 0xff]);
        // A group holding a group, in an unknown field 20: start 20, start 21, end 21, end 20.
        body.extend_from_slice(&[0xa3, 0x01, 0xab, 0x01, 0xac, 0x01, 0xa4, 0x01]);
        let mut bytes = vec![0xea, 0x01];
        bytes.extend_from_slice(&(body.len() as u8).to_le_bytes());
        bytes.extend_from_slice(&body);
        assert!(Event::decode(bytes.as_slice()).is_ok());
        assert_eq!(accepted_now(&bytes), accepted_before(&bytes));
        assert!(accepted_now(&bytes));
        // Groups nested deeper than prost allows.
        for depth in [98, 99, 100, 101] {
            let mut bytes = Vec::new();
            bytes.extend(std::iter::repeat_n(0xa3_u8, depth).flat_map(|b| [b, 0x01]));
            bytes.extend(std::iter::repeat_n(0xa4_u8, depth).flat_map(|b| [b, 0x01]));
            let mut wrapped = vec![0xea, 0x01];
            let mut len = Vec::new();
            let mut n = bytes.len();
            while n >= 0x80 {
                len.push((n as u8 & 0x7f) | 0x80);
                n >>= 7;
            }
            len.push(n as u8);
            wrapped.extend_from_slice(&len);
            wrapped.extend_from_slice(&bytes);
            assert_eq!(
                accepted_now(&wrapped),
                accepted_before(&wrapped),
                "groups {depth} deep"
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4000))]

        #[test]
        fn mutated_events_are_accepted_exactly_when_they_were_before(
            seed in 0usize..10,
            edits in proptest::collection::vec(
                (proptest::num::usize::ANY, proptest::num::u8::ANY, 0u8..4), 1..4),
        ) {
            let mut bytes = seeds().swap_remove(seed);
            for (at, byte, how) in edits {
                let at = at % (bytes.len() + 1);
                match how {
                    0 if at < bytes.len() => bytes[at] = byte,
                    1 => bytes.insert(at, byte),
                    2 if at < bytes.len() => { bytes.remove(at); }
                    _ => bytes.truncate(at),
                }
            }
            proptest::prop_assert_eq!(accepted_now(&bytes), accepted_before(&bytes));
        }

        #[test]
        fn a_varint_ends_where_reading_its_value_ends(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![0x80u8..=0xff, 0u8..0x80, 0u8..3], 0..14),
            pos in 0usize..14,
        ) {
            proptest::prop_assert_eq!(varint_end(&bytes, pos), varint(&bytes, pos).map(|v| v.1));
        }

        #[test]
        fn the_text_check_agrees_with_the_standard_library(
            bytes in proptest::collection::vec(
                proptest::prop_oneof![0u8..0x80, proptest::num::u8::ANY], 0..80),
            cut in 0usize..80,
        ) {
            let bytes = &bytes[..cut.min(bytes.len())];
            proptest::prop_assert_eq!(utf8(bytes), std::str::from_utf8(bytes).is_ok());
        }

        #[test]
        fn random_bytes_are_accepted_exactly_when_they_were_before(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
        ) {
            proptest::prop_assert_eq!(accepted_now(&bytes), accepted_before(&bytes));
        }
    }
}

//! Checks that bytes are an `edgewatch.v1.Event` exactly as prost's `Event::decode` would accept
//! them, in one pass over the bytes and without building the message (no allocation).
//!
//! Invariants:
//! - [`top_field`] accepts a top-level field of an `Event` if and only if prost would decode it:
//!   the same key rules (a varint of at most 32 bits, a known wire type, field number at least 1),
//!   varints of at most ten bytes without overflow, the wire type each known field requires
//!   (packed or not for repeated scalars), lengths inside their message, UTF-8 in strings,
//!   unknown fields skipped as prost skips them (groups included) and prost's recursion limit.
//!   [`check_event`], what the queue runs on an event, judges it exactly as one [`top_field`] per
//!   field from the start does (the fields in prost's order first, in one step).
//! - One list, in the `schema!` invocation at the end, is the schema of
//!   `proto/edgewatch/v1/event.proto` from `Event` down. It generates both the check (per
//!   message, a `match` on the field number whose arms check their field's value inline: no
//!   table lookup or dispatch on a field's kind at run time) and `MESSAGES`, the same list as
//!   data, which a test compares with the descriptor compiled from that file. Other tests compare
//!   the check with `Event::decode`: every field of every message in every wire type and shape,
//!   in and out of order, and random and mutated encodings.
//! - Pure logic: no I/O, no clock.

/// How a known field's value is checked.
#[cfg(test)]
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
#[cfg(test)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Field {
    pub number: u32,
    pub check: Check,
    pub repeated: bool,
    /// Marked `oneof` in the list: a member of a `oneof`, checked by the fast path's `match`.
    pub oneof: bool,
}

/// A message: its name (for the schema test) and its fields, in increasing number.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct Schema {
    pub name: &'static str,
    pub fields: &'static [Field],
}

/// prost's default recursion limit (`DecodeContext`).
pub(crate) const RECURSION_LIMIT: u32 = 100;

/// The key of `Event.seq` (field 1, varint): a record's event leads with it.
pub(crate) const SEQ_KEY: u8 = 0x08;

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
#[inline(always)]
fn delimited(bytes: &[u8], pos: usize) -> Option<(usize, usize)> {
    let (len, pos) = varint(bytes, pos)?;
    let end = pos.checked_add(usize::try_from(len).ok()?)?;
    (end <= bytes.len()).then_some((pos, end))
}

/// Checks every field of the bytes of message `M` (its index in [`MESSAGES`]) with `budget`
/// levels of recursion left. One instance per message: first the fields in the order prost
/// writes them ([`in_order`]), then any others in a loop whose fields' checks are inlined as a
/// `match` on the field number (see [`schema!`]).
#[inline(never)]
pub(crate) fn message<const M: usize>(bytes: &[u8], budget: u32) -> Option<()> {
    let pos = in_order::<M>(bytes, budget)?;
    rest::<M>(bytes, pos, budget)
}

/// The check of a nested message `M` without message fields of its own (see `LEAF`), inlined
/// into the fast path of the message holding it instead of a call of [`message`]: the fields as
/// prost writes them ([`in_order`]), then, out of line and only if a field of another shape
/// follows, the general loop.
#[inline(always)]
fn leaf<const M: usize>(bytes: &[u8], budget: u32) -> Option<()> {
    let pos = in_order::<M>(bytes, budget)?;
    if pos < bytes.len() {
        rest_out_of_line::<M>(bytes, pos, budget)
    } else {
        Some(())
    }
}

/// The general loop over the fields of message `M` from `pos` on: per field its key, then a
/// `match` on its number whose arms check the value inline (see [`schema!`]).
#[inline(always)]
fn rest<const M: usize>(bytes: &[u8], mut pos: usize, budget: u32) -> Option<()> {
    while pos < bytes.len() {
        let (number, wire, after) = key(bytes, pos)?;
        pos = field::<M>(bytes, number, wire, after, budget)?;
    }
    Some(())
}

/// [`rest`] for a message whose fast path was inlined into its holder's ([`leaf`]): rare, so
/// kept out of the holder's code.
#[inline(never)]
fn rest_out_of_line<const M: usize>(bytes: &[u8], pos: usize, budget: u32) -> Option<()> {
    rest::<M>(bytes, pos, budget)
}

/// The key of field `number` in wire type `wire`.
const fn key_of(number: u32, wire: u8) -> u32 {
    number << 3 | wire as u32
}

/// A key of one or two bytes at `pos` (field numbers up to 2047): its value and the position
/// after it.
#[inline(always)]
fn short_key(bytes: &[u8], pos: usize) -> Option<(u32, usize)> {
    let low = *bytes.get(pos)?;
    if low < 0x80 {
        return Some((u32::from(low), pos + 1));
    }
    let high = *bytes.get(pos + 1)?;
    (high < 0x80).then_some((u32::from(low & 0x7f) | u32::from(high) << 7, pos + 2))
}

/// Checks a packed repeated scalar at `pos` (length-delimited), each element with `each`;
/// returns the position after it.
#[inline(always)]
fn packed(bytes: &[u8], pos: usize, each: impl Fn(&[u8], usize) -> Option<usize>) -> Option<usize> {
    let (mut at, end) = delimited(bytes, pos)?;
    let packed = &bytes[..end];
    while at < end {
        at = each(packed, at)?;
    }
    Some(end)
}

/// Checks a string's value at `pos`: its length, then UTF-8.
#[inline(always)]
fn text(bytes: &[u8], pos: usize) -> Option<usize> {
    let (start, end) = delimited(bytes, pos)?;
    utf8(&bytes[start..end]).then_some(end)
}

/// The check of one known field's value, as an expression: `$wire` is the wire type read with
/// the key, `$pos` where the value starts; evaluates to the position after it. A scalar takes
/// its own wire type, or a length (packed) when repeated; anything else is refused, as prost
/// refuses a known field with another wire type.
macro_rules! value {
    ($bytes:ident, $wire:ident, $pos:ident, $budget:ident; Varint, single) => {
        if $wire == VARINT {
            varint_end($bytes, $pos)
        } else {
            None
        }
    };
    ($bytes:ident, $wire:ident, $pos:ident, $budget:ident; Varint, repeated) => {
        match $wire {
            VARINT => varint_end($bytes, $pos),
            LEN => packed($bytes, $pos, varint_end),
            _ => None,
        }
    };
    ($bytes:ident, $wire:ident, $pos:ident, $budget:ident; Fixed64, single) => {
        if $wire == FIXED64 {
            fixed($bytes, $pos, 8)
        } else {
            None
        }
    };
    ($bytes:ident, $wire:ident, $pos:ident, $budget:ident; Fixed64, repeated) => {
        match $wire {
            FIXED64 => fixed($bytes, $pos, 8),
            LEN => packed($bytes, $pos, |bytes, at| fixed(bytes, at, 8)),
            _ => None,
        }
    };
    ($bytes:ident, $wire:ident, $pos:ident, $budget:ident; Fixed32, single) => {
        if $wire == FIXED32 {
            fixed($bytes, $pos, 4)
        } else {
            None
        }
    };
    ($bytes:ident, $wire:ident, $pos:ident, $budget:ident; Fixed32, repeated) => {
        match $wire {
            FIXED32 => fixed($bytes, $pos, 4),
            LEN => packed($bytes, $pos, |bytes, at| fixed(bytes, at, 4)),
            _ => None,
        }
    };
    ($bytes:ident, $wire:ident, $pos:ident, $budget:ident; Str, $card:ident) => {
        if $wire == LEN {
            text($bytes, $pos)
        } else {
            None
        }
    };
    ($bytes:ident, $wire:ident, $pos:ident, $budget:ident; Bytes, $card:ident) => {
        if $wire == LEN {
            Some(delimited($bytes, $pos)?.1)
        } else {
            None
        }
    };
    // In a fast path: a message without message fields is checked inline (`leaf`), any other by a
    // call. prost checks the limit before entering the message, whose fields get one less.
    (@fast; $bytes:ident, $wire:ident, $pos:ident, $budget:ident; Message($index:literal), $card:ident) => {
        if $wire == LEN {
            let inner = $budget.checked_sub(1)?;
            let (start, end) = delimited($bytes, $pos)?;
            if LEAF[$index] {
                leaf::<$index>(&$bytes[start..end], inner)?;
            } else {
                message::<$index>(&$bytes[start..end], inner)?;
            }
            Some(end)
        } else {
            None
        }
    };
    (@fast; $($rest:tt)*) => {
        value!($($rest)*)
    };
    ($bytes:ident, $wire:ident, $pos:ident, $budget:ident; Message($index:literal), $card:ident) => {
        if $wire == LEN {
            // prost checks the limit before entering the message, whose fields get one less.
            let inner = $budget.checked_sub(1)?;
            let (start, end) = delimited($bytes, $pos)?;
            message::<$index>(&$bytes[start..end], inner)?;
            Some(end)
        } else {
            None
        }
    };
}

/// The wire type prost writes a field in: a repeated scalar packed.
macro_rules! wire_of {
    (Varint, single) => {
        VARINT
    };
    (Fixed64, single) => {
        FIXED64
    };
    (Fixed32, single) => {
        FIXED32
    };
    ($check:ident, $card:ident) => {
        LEN
    };
}

/// `true` for a message field.
macro_rules! is_message {
    (Message) => {
        true
    };
    ($check:ident) => {
        false
    };
}

/// `true` for a field marked `oneof` in the schema list.
macro_rules! oneof {
    () => {
        false
    };
    (oneof) => {
        true
    };
}

/// `true` for a repeated field.
macro_rules! repeated {
    (single) => {
        false
    };
    (repeated) => {
        true
    };
}

/// Defines [`MESSAGES`] (the schema as data, compared with the compiled descriptor by a test)
/// and, from the same list, [`field`]: one `match` on the field number per message, each arm the
/// inlined check of that field's value, so that checking a field is a key, a jump and its value
/// (no lookup in a table, no dispatch on its kind).
macro_rules! schema {
    ($(
        $index:literal $name:ident {
            $( $number:literal : $check:ident $( ($target:literal) )?, $card:ident $(, $oneof:ident)?; )*
        }
    )*) => {
        /// The schema as data, `Event` first.
        #[cfg(test)]
        pub(crate) static MESSAGES: [Schema; [$($index),*].len()] = [$(
            Schema {
                name: stringify!($name),
                fields: &[$(
                    Field {
                        number: $number,
                        check: Check::$check $( ($target) )?,
                        repeated: repeated!($card),
                        oneof: oneof!($($oneof)?),
                    },
                )*],
            },
        )*];

        /// Per message, `true` if none of its fields is a message: its check is inlined into
        /// the fast path of the message holding it (see `leaf`).
        const LEAF: [bool; [$($index),*].len()] = [$( true $( && !is_message!($check) )* ),*];

        // Each message's index is its place in the list.
        const _: () = {
            let indices = [$($index),*];
            let mut i = 0;
            while i < indices.len() {
                assert!(indices[i] == i, "a message's index must be its place in the list");
                i += 1;
            }
        };

        /// Checks the fields at the start of the bytes of message `M` that come as prost writes
        /// them: in increasing number, each in the wire type it writes. Per field of the schema
        /// with a one-byte key (field numbers up to 15), in order, one byte is compared with its
        /// key, except the members of a `oneof` (at most one of which is set); then those and
        /// the fields with a two-byte key (16 to 2047), in any order, by one `match` on the key
        /// (an `Event`'s kind is one jump). Returns where the first other field starts (the
        /// end of the bytes if none), for the general loop of [`message`] to go on from there. A
        /// field is checked exactly as that loop checks it; a nested message without message
        /// fields is checked inline (`leaf`).
        #[inline(always)]
        fn in_order<const M: usize>(bytes: &[u8], budget: u32) -> Option<usize> {
            let mut pos = 0;
            match M {
                $(
                    $index => {
                        $({
                            const WIRE: u8 = wire_of!($check, $card);
                            const KEY: u32 = ($number << 3) | WIRE as u32;
                            if KEY < 0x80 && !oneof!($($oneof)?) {
                                while bytes.get(pos) == Some(&(KEY as u8)) {
                                    let (wire, after) = (WIRE, pos + 1);
                                    pos = value!(@fast; bytes, wire, after, budget; $check $( ($target) )?, $card)?;
                                    if !repeated!($card) {
                                        break;
                                    }
                                }
                            }
                        })*
                        const MATCHED: bool = false $(
                                || (key_of($number, wire_of!($check, $card)) >= 0x80
                                    || oneof!($($oneof)?))
                                    && $number < 2048
                        )*;
                        if MATCHED {
                            while let Some((key, after)) = short_key(bytes, pos) {
                                pos = match key {
                                    $(
                                        key if (key >= 0x80 || oneof!($($oneof)?))
                                            && key == key_of($number, wire_of!($check, $card)) =>
                                        {
                                            let wire = wire_of!($check, $card);
                                            value!(@fast; bytes, wire, after, budget; $check $( ($target) )?, $card)?
                                        }
                                    )*
                                    _ => break,
                                };
                            }
                        }
                    }
                )*
                _ => {}
            }
            Some(pos)
        }

        /// Checks the value of field `number` (wire type `wire`, starting at `pos`) of message
        /// `M` with `budget` levels of recursion left; returns the position after it. Unknown
        /// fields are skipped as prost skips them.
        #[inline(always)]
        fn field<const M: usize>(
            bytes: &[u8],
            number: u32,
            wire: u8,
            pos: usize,
            budget: u32,
        ) -> Option<usize> {
            match M {
                $(
                    $index => match number {
                        $( $number => value!(bytes, wire, pos, budget; $check $( ($target) )?, $card), )*
                        _ => skip(bytes, number, wire, pos, budget),
                    },
                )*
                _ => None,
            }
        }
    };
}

/// True if `bytes` are UTF-8. Text here is mostly ASCII: the bytes are OR-ed together without
/// an early exit, and only text with a byte of 0x80 or more takes the full validation. Up to 16
/// bytes (names, keys, short values: most strings of an event) that is two loads that may overlap
/// (OR-ing a byte twice changes nothing), or three single bytes below four; longer text is OR-ed
/// 32 bytes at a time, then its last 32 ([`any_high_bit`]).
#[inline]
fn utf8(bytes: &[u8]) -> bool {
    let len = bytes.len();
    let ascii = if len > 16 {
        !any_high_bit(bytes)
    } else {
        let high = if let (Some(first), Some(last)) =
            (bytes.first_chunk::<8>(), bytes.last_chunk::<8>())
        {
            u64::from_ne_bytes(*first) | u64::from_ne_bytes(*last)
        } else if let (Some(first), Some(last)) =
            (bytes.first_chunk::<4>(), bytes.last_chunk::<4>())
        {
            u64::from(u32::from_ne_bytes(*first) | u32::from_ne_bytes(*last))
        } else if let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) {
            u64::from(first | bytes[len / 2] | last)
        } else {
            0
        };
        high & 0x8080_8080_8080_8080 == 0
    };
    ascii || std::str::from_utf8(bytes).is_ok()
}

/// True if a byte of `bytes` (more than 16 of them) is 0x80 or more. The whole 32-byte blocks
/// from the start are OR-ed four words each, then the last 32 bytes (which may overlap the
/// blocks: OR-ing a byte twice changes nothing), or below 32 bytes the first and last 16; the
/// high bits are tested once at the end. Per 32 bytes that is four loads and ORs and the loop's
/// step: the 150-byte text of a custom event takes four turns and the tail.
#[inline(always)]
fn any_high_bit(bytes: &[u8]) -> bool {
    let words = |block: &[u8; 32]| {
        let (halves, _) = block.as_chunks::<16>();
        halves
            .iter()
            .fold(0u128, |acc, half| acc | u128::from_ne_bytes(*half))
    };
    let tail = match (
        bytes.last_chunk::<32>(),
        bytes.first_chunk::<16>(),
        bytes.last_chunk::<16>(),
    ) {
        (Some(last), _, _) => words(last),
        (None, Some(first), Some(last)) => u128::from_ne_bytes(*first) | u128::from_ne_bytes(*last),
        _ => 0,
    };
    let (blocks, _) = bytes.as_chunks::<32>();
    let all = blocks.iter().fold(tail, |acc, block| acc | words(block));
    all & 0x8080_8080_8080_8080_8080_8080_8080_8080 != 0
}

fn fixed(bytes: &[u8], pos: usize, len: usize) -> Option<usize> {
    let end = pos.checked_add(len)?;
    (end <= bytes.len()).then_some(end)
}

/// Checks the top-level field of an `Event` at `pos` as prost would, refusing groups (the uplink
/// splices records without decoding them); returns its number and where it ends. Inlined into
/// the loop over an event's fields (a call per top-level field cost as much as its check).
#[inline(always)]
pub(crate) fn top_field(event: &[u8], pos: usize) -> Option<(u32, usize)> {
    let (number, wire, after) = key(event, pos)?;
    if wire == START_GROUP || wire == END_GROUP {
        return None;
    }
    let end = field::<0>(event, number, wire, after, RECURSION_LIMIT)?;
    Some((number, end))
}

/// Checks an encoded `Event` as [`top_field`] checks each of its top-level fields, calling
/// `field_1` with the byte range of every top-level field 1 (the caller drops them); on failure
/// returns the offset of the top-level field that failed. The fields at the start that come as
/// prost writes them are checked in one step (see `in_order`), unless the event starts with
/// field 1; from the first field out of that order on, one [`top_field`] per field. A field in
/// that order that fails its check is found again, with its offset, by the loop from the start.
#[inline(always)]
pub(crate) fn check_event(
    event: &[u8],
    mut field_1: impl FnMut(usize, usize),
) -> Result<(), usize> {
    let mut pos = if event.first() == Some(&SEQ_KEY) {
        0
    } else {
        // A known field in its own wire type is never a group: none is accepted here that
        // `top_field` would refuse.
        in_order::<0>(event, RECURSION_LIMIT).unwrap_or(0)
    };
    while pos < event.len() {
        let (number, end) = top_field(event, pos).ok_or(pos)?;
        if number == 1 {
            field_1(pos, end);
        }
        pos = end;
    }
    Ok(())
}

/// Walks the top-level fields of bytes prost just encoded from a typed `Event` as
/// [`check_event`] does, looking only at their lengths (their contents are not checked again).
#[inline(always)]
pub(crate) fn walk_trusted(
    event: &[u8],
    mut field_1: impl FnMut(usize, usize),
) -> Result<(), usize> {
    let mut pos = 0;
    while pos < event.len() {
        let (number, wire, after) = key(event, pos).ok_or(pos)?;
        let end = skip_top(event, wire, after).ok_or(pos)?;
        if number == 1 {
            field_1(pos, end);
        }
        pos = end;
    }
    Ok(())
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

// The schema of `Event` and every message under it, `Event` first: per message its index in
// `MESSAGES`, its name, then per field its number, how its value is checked (a message by its
// index) and whether it is repeated.
schema! {
    0 Event {
        1: Varint, single;
        2: Varint, single;
        3: Varint, single;
        10: Message(1), single, oneof;
        11: Message(2), single, oneof;
        12: Message(3), single, oneof;
        13: Message(4), single, oneof;
        14: Message(5), single, oneof;
        15: Message(6), single, oneof;
        16: Message(6), single, oneof;
        17: Message(7), single, oneof;
        18: Message(8), single, oneof;
        19: Message(9), single, oneof;
        20: Message(10), single, oneof;
        21: Message(11), single, oneof;
        22: Message(12), single, oneof;
        23: Message(13), single, oneof;
        24: Message(14), single, oneof;
        25: Message(15), single, oneof;
        26: Message(16), single, oneof;
        27: Message(17), single, oneof;
        28: Message(18), single, oneof;
        29: Message(19), single, oneof;
    }
    1 DeadlineCounters {
        1: Message(20), single;
        2: Message(21), single;
        3: Varint, single;
        4: Fixed64, single;
        5: Varint, single;
        6: Varint, single;
        7: Varint, single;
        8: Varint, single;
        9: Varint, single;
        10: Varint, single;
        11: Varint, single;
        12: Message(22), single;
        13: Varint, single;
        14: Varint, single;
        15: Varint, single;
        16: Varint, single;
        17: Varint, single;
        18: Varint, single;
    }
    2 DeadlineMissBurst {
        1: Message(20), single;
        2: Message(21), single;
        3: Varint, single;
        4: Varint, single;
        5: Varint, single;
        6: Varint, single;
        7: Varint, single;
        8: Varint, single;
        9: Varint, single;
        10: Varint, single;
    }
    3 SafetyFallback {
        1: Message(20), single;
        2: Message(21), single;
        3: Varint, single;
        4: Varint, single;
        5: Str, single;
        6: Varint, single;
    }
    4 ProbeStatus {
        1: Message(20), single;
        2: Varint, single;
        3: Fixed64, single;
        4: Varint, single;
        5: Varint, single;
        6: Str, single;
    }
    5 ThermalSample {
        1: Message(23), repeated;
        2: Message(24), repeated;
        3: Fixed64, repeated;
        4: Varint, repeated;
        5: Fixed64, single;
        6: Varint, repeated;
        7: Varint, single;
        8: Varint, single;
        9: Varint, single;
    }
    6 Throttle {
        1: Varint, single;
        2: Varint, single;
        3: Str, single;
        4: Fixed64, single;
        5: Fixed64, single;
        6: Varint, single;
        7: Varint, single;
        8: Fixed64, single;
    }
    7 ThrottleCounters {
        1: Varint, single;
        2: Message(25), repeated;
        3: Message(21), single;
    }
    8 OverCurrent {
        1: Str, single;
        2: Varint, single;
        3: Varint, single;
    }
    9 EnergyCounters {
        1: Varint, single;
        2: Message(26), repeated;
        3: Message(21), single;
    }
    10 AutonomyModeChange {
        1: Varint, single;
        2: Varint, single;
        3: Str, single;
        4: Varint, single;
        5: Varint, single;
    }
    11 AutonomySeconds {
        1: Varint, single;
        2: Message(27), repeated;
        3: Message(21), single;
    }
    12 Intervention {
        1: Varint, single;
        2: Varint, single;
        3: Str, single;
        4: Varint, single;
        5: Message(21), single;
        6: Varint, single;
    }
    13 SafeStop {
        1: Varint, single;
        2: Varint, single;
        3: Str, single;
        4: Varint, single;
        5: Message(21), single;
        6: Varint, single;
    }
    14 ModelVersionChange {
        1: Message(20), single;
        2: Message(21), single;
        3: Message(21), single;
    }
    15 QueueLoss {
        1: Varint, single;
        2: Varint, single;
        3: Varint, single;
        4: Varint, single;
        5: Varint, single;
        6: Fixed64, single;
        7: Varint, single;
        8: Varint, single;
    }
    16 OfflineWindowLow {
        1: Fixed64, single;
        2: Fixed64, single;
        3: Fixed64, single;
        4: Varint, single;
    }
    17 AgentHealth {
        1: Str, single;
        2: Fixed64, single;
        3: Varint, single;
        4: Fixed64, single;
        5: Message(28), repeated;
        6: Fixed64, single;
        7: Varint, single;
        8: Varint, single;
        9: Varint, single;
        10: Str, single;
        11: Str, single;
        12: Fixed64, single;
        13: Varint, single;
    }
    18 LogRecord {
        1: Varint, single;
        2: Str, single;
        3: Str, single;
        4: Message(29), repeated;
    }
    19 CustomEvent {
        1: Str, single;
        2: Message(29), repeated;
    }
    20 LoopRef {
        1: Varint, single;
        2: Str, single;
    }
    21 ModelVersion {
        1: Str, single;
        2: Str, single;
        3: Fixed64, single;
        4: Str, single;
        5: Str, single;
        6: Str, single;
        7: Str, single;
        8: Varint, single;
    }
    22 LatencyHistogram {
        1: Varint, repeated;
        2: Varint, repeated;
    }
    23 Temperature {
        1: Str, single;
        2: Fixed64, single;
    }
    24 RailPower {
        1: Str, single;
        2: Fixed64, single;
        3: Fixed64, single;
    }
    25 ComponentSeconds {
        1: Varint, single;
        2: Fixed64, single;
    }
    26 RailEnergy {
        1: Str, single;
        2: Fixed64, single;
    }
    27 ModeSeconds {
        1: Varint, single;
        2: Fixed64, single;
    }
    28 TierHealth {
        1: Varint, single;
        2: Varint, single;
        3: Varint, single;
        4: Fixed64, single;
        5: Varint, single;
        6: Varint, single;
        7: Varint, single;
    }
    29 Attribute {
        1: Str, single;
        2: Str, single;
        3: Varint, single;
        4: Fixed64, single;
        5: Varint, single;
    }
}

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
            for field in schema.fields.iter().filter(|field| field.oneof) {
                let member = descriptor.get_field(field.number).unwrap();
                assert!(
                    member.containing_oneof().is_some(),
                    "{name}.{} is marked oneof but is not a member of one",
                    field.number
                );
            }
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

    /// What `record::validate` and `record::encode` accept ([`check_event`]), after checking
    /// that it judges the bytes as the loop of one [`top_field`] per field from the start does:
    /// the same verdict, the same failing offset, the same fields 1.
    fn accepted_now(bytes: &[u8]) -> bool {
        let mut fields_1 = Vec::new();
        let checked = check_event(bytes, |from, to| fields_1.push((from, to)));
        assert_eq!((checked, fields_1), field_by_field(bytes), "{bytes:02x?}");
        checked.is_ok()
    }

    /// One [`top_field`] per field from the start: the verdict (the failing field's offset) and
    /// the ranges of the fields 1 before it.
    fn field_by_field(bytes: &[u8]) -> (Result<(), usize>, Vec<(usize, usize)>) {
        let mut fields_1 = Vec::new();
        let mut pos = 0;
        while pos < bytes.len() {
            match top_field(bytes, pos) {
                Some((number, end)) => {
                    if number == 1 {
                        fields_1.push((pos, end));
                    }
                    pos = end;
                }
                None => return (Err(pos), fields_1),
            }
        }
        (Ok(()), fields_1)
    }

    /// Events of every kind with every field set, nested messages and packed repeats included:
    /// first with a `seq` (field 1 leads), then the same without (as the agent's clients send
    /// them: fields 2 and 3 lead, checked in prost's order).
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
        [3, 0]
            .into_iter()
            .flat_map(|seq| {
                kinds.iter().map(move |kind| {
                    Event {
                        seq,
                        event_time_unix_ns: 1_700_000_000_000_000_000,
                        monotonic_ns: 42,
                        kind: Some(kind.clone()),
                    }
                    .encode_to_vec()
                })
            })
            .collect()
    }

    #[test]
    fn the_text_check_sees_a_byte_of_0x80_or_more_at_every_place_of_every_length() {
        // Past 200: several 32-byte turns, the overlapping tail, and a custom event's 150 bytes.
        for len in 0..=200 {
            let mut text = vec![b'a'; len];
            assert!(utf8(&text), "{len} ASCII bytes");
            for at in 0..len {
                text[at] = 0x80;
                assert!(!utf8(&text), "a lone continuation byte at {at} of {len}");
                text[at] = b'a';
            }
        }
    }

    #[test]
    fn every_seed_event_without_a_seq_is_checked_whole_by_the_fast_path() {
        // Every kind, field 29 (a two-byte key) included, and every message nested in it (those
        // without message fields inline): the fast path reaches the end, and its verdict is the
        // general loop's.
        let seeds = seeds();
        let (_, without_seq) = seeds.split_at(seeds.len() / 2);
        for bytes in without_seq {
            assert_eq!(
                in_order::<0>(bytes, RECURSION_LIMIT),
                Some(bytes.len()),
                "{bytes:02x?}"
            );
            assert!(accepted_now(bytes));
        }
        // Out of prost's order (a field 1 after field 2) the general loop takes over.
        let late_seq = [0x10, 0x05, 0x08, 0x63, 0x18, 0x07];
        assert_eq!(in_order::<0>(&late_seq, RECURSION_LIMIT), Some(2));
        assert!(accepted_now(&late_seq));
    }

    #[test]
    fn kinds_with_two_byte_keys_holding_a_model_are_checked_whole_by_the_fast_path() {
        let model = Some(pb::ModelVersion {
            name: "planner".into(),
            version: "2.1".into(),
            ..Default::default()
        });
        let kinds = [
            Kind::Intervention(pb::Intervention {
                total: 3,
                delta: 1,
                reason: "obstacle".into(),
                mode: 1,
                model: model.clone(),
                source: 1,
            }),
            Kind::SafeStop(pb::SafeStop {
                total: 1,
                reason: "e-stop".into(),
                model,
                ..Default::default()
            }),
        ];
        for kind in kinds {
            let bytes = Event {
                seq: 0,
                event_time_unix_ns: 1_700_000_000_000_000_000,
                monotonic_ns: 42,
                kind: Some(kind),
            }
            .encode_to_vec();
            assert_eq!(
                in_order::<0>(&bytes, RECURSION_LIMIT),
                Some(bytes.len()),
                "{bytes:02x?}"
            );
            assert!(accepted_now(&bytes));
            assert!(accepted_before(&bytes));
        }
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

    /// Wraps the bytes of a message `target` (its index in [`MESSAGES`]) in the fields that lead
    /// to it from `Event`, so that prost judges them as part of an `Event`.
    fn wrapped(target: usize, body: &[u8]) -> Vec<u8> {
        let mut parent: Vec<Option<(usize, u32)>> = vec![None; MESSAGES.len()];
        let mut reached = vec![0usize];
        let mut i = 0;
        while let Some(&at) = reached.get(i) {
            for field in MESSAGES[at].fields {
                if let Check::Message(inner) = field.check {
                    let inner = usize::from(inner);
                    if inner != 0 && parent[inner].is_none() {
                        parent[inner] = Some((at, field.number));
                        reached.push(inner);
                    }
                }
            }
            i += 1;
        }
        let mut bytes = body.to_vec();
        let mut at = target;
        while let Some((up, number)) = parent[at] {
            let mut outer = Vec::new();
            prost::encoding::encode_varint(u64::from(number << 3 | u32::from(LEN)), &mut outer);
            prost::encoding::encode_varint(bytes.len() as u64, &mut outer);
            outer.extend_from_slice(&bytes);
            bytes = outer;
            at = up;
        }
        bytes
    }

    /// One field of number `number` and wire type `wire` followed by a value of `value`'s shape:
    /// well-formed, over-long, overflowing, truncated, packed, non-UTF-8 text, a group. With
    /// fields in increasing and in other orders (see the test below) these reach both the check
    /// of fields in the order prost writes them and the general loop.
    fn one_field(number: u32, wire: u8, value: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        prost::encoding::encode_varint(u64::from(number << 3 | u32::from(wire)), &mut bytes);
        let tail: Vec<u8> = match (wire, value) {
            (VARINT, 0) => vec![0x01],
            (VARINT, 1) => [[0xff; 9].as_slice(), &[0x01]].concat(),
            (VARINT, 2) => [[0xff; 9].as_slice(), &[0x02]].concat(),
            (VARINT, 3) => [[0x80; 10].as_slice(), &[0x00]].concat(),
            (FIXED64, 0) => vec![0; 8],
            (FIXED64, 1) => vec![0; 7],
            (FIXED32, 0) => vec![0; 4],
            (FIXED32, 1) => vec![0; 3],
            (LEN, 0) => vec![0x02, 0x08, 0x01],
            (LEN, 1) => vec![0x02, 0xff, 0xfe],
            (LEN, 2) => [[0x08].as_slice(), &[0; 8]].concat(),
            (LEN, 3) => vec![0x00],
            (LEN, 4) => vec![0x03, 0xc3, 0xa9, 0x41],
            (LEN, 5) => vec![0x05, 0x01],
            (START_GROUP, 0) => {
                let mut end = Vec::new();
                let key = u64::from(number << 3 | u32::from(END_GROUP));
                prost::encoding::encode_varint(key, &mut end);
                end
            }
            _ => vec![],
        };
        bytes.extend_from_slice(&tail);
        bytes
    }

    /// The field with its key written one byte longer than it needs (prost accepts it).
    fn long_key(field: &[u8]) -> Vec<u8> {
        let (_, after) = varint(field, 0).unwrap();
        let mut bytes = field[..after].to_vec();
        *bytes.last_mut().unwrap() |= 0x80;
        bytes.push(0x00);
        bytes.extend_from_slice(&field[after..]);
        bytes
    }

    #[test]
    fn every_field_of_every_message_in_any_order_and_shape_is_judged_as_prost_judges_it() {
        for (index, schema) in MESSAGES.iter().enumerate() {
            let last = schema.fields.last().map_or(0, |field| field.number);
            let mut numbers: Vec<u32> = schema.fields.iter().map(|field| field.number).collect();
            numbers.extend([last + 1, 31, 1000, (1 << 29) - 1]);
            let singles: Vec<Vec<u8>> = numbers
                .iter()
                .flat_map(|&number| {
                    (0..=FIXED32).flat_map(move |wire| {
                        (0..6)
                            .map(move |value| one_field(number, wire, value))
                            .chain([long_key(&one_field(number, wire, 0))])
                    })
                })
                .collect();
            // Each field alone, then after each well-formed field of every number: in increasing
            // order, repeated, out of order.
            let firsts: Vec<Vec<u8>> = numbers
                .iter()
                .flat_map(|&number| (0..=FIXED32).map(move |wire| one_field(number, wire, 0)))
                .collect();
            for single in &singles {
                let bytes = wrapped(index, single);
                assert_eq!(
                    accepted_now(&bytes),
                    accepted_before(&bytes),
                    "{} {single:02x?}",
                    schema.name
                );
                for first in &firsts {
                    for body in [
                        [first.as_slice(), single].concat(),
                        [single.as_slice(), first].concat(),
                    ] {
                        let bytes = wrapped(index, &body);
                        assert_eq!(
                            accepted_now(&bytes),
                            accepted_before(&bytes),
                            "{} {body:02x?}",
                            schema.name
                        );
                    }
                }
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4000))]

        #[test]
        fn mutated_events_are_accepted_exactly_when_they_were_before(
            seed in 0usize..20,
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
                proptest::prop_oneof![0u8..0x80, proptest::num::u8::ANY], 0..300),
            cut in 0usize..300,
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

//! Stored record layout: a checksummed header followed by the protobuf `Event` with its `seq` set.
//!
//! ```text
//! value = crc32c:u32 LE | appended_unix_ms:u64 LE | event
//! event = 0x08 varint(seq) | the caller's fields other than field 1, in their order
//! crc32c covers appended_unix_ms and event (every byte after the checksum)
//! ```
//!
//! Invariants:
//! - `event` is a complete protobuf `Event` whose first field is `seq`; the uplink splices it into
//!   a batch without decoding.
//! - A value is trusted only if its checksum matches and its leading `seq` equals its key.
//! - Pure logic: no I/O, no clock.

/// Bytes before the event: checksum and append time.
pub const HEADER_LEN: usize = 12;
/// Bytes a record costs beyond its value: the `u64` key.
pub const KEY_LEN: u64 = 8;

use crate::wire::{self, SEQ_KEY};

/// The bytes are not an `Event` as prost would decode it, or hold a group at their top level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("event encoding is malformed in the field at byte {offset}")]
pub struct MalformedEvent {
    /// Offset of the top-level field that failed its check.
    pub offset: usize,
}

/// A stored value failed its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CorruptRecord {
    /// Shorter than the header plus a `seq` field.
    #[error("record is truncated")]
    Truncated,
    /// The CRC32C does not match the bytes.
    #[error("record checksum does not match")]
    Checksum,
    /// The event's `seq` differs from the key it is stored under.
    #[error("record seq does not match its key")]
    SeqMismatch,
}

/// A record that passed its checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// Wall-clock time of the append, ms since the Unix epoch.
    pub appended_unix_ms: u64,
    /// The protobuf `Event`, `seq` first.
    pub event: &'a [u8],
}

/// Appends one stored value to `out`: header, `seq`, then `event` without any field 1.
///
/// `event` is checked in the same pass: it must be an `Event` as prost would decode it (see
/// `wire`), without groups at its top level (the uplink splices records without decoding them).
/// On error `out` is left as it was.
pub fn encode(
    out: &mut Vec<u8>,
    seq: u64,
    appended_unix_ms: u64,
    event: &[u8],
) -> Result<(), MalformedEvent> {
    encode_after(out, 0, seq, appended_unix_ms, event)
}

/// [`encode`] after `lead` zero bytes (at most [`MAX_LEAD`]: the caller's frame header, written
/// with the record's header in one copy). On error `out` is left as it was. Inlined into the
/// queue's append, its one hot caller.
#[inline(always)]
pub fn encode_after(
    out: &mut Vec<u8>,
    lead: usize,
    seq: u64,
    appended_unix_ms: u64,
    event: &[u8],
) -> Result<(), MalformedEvent> {
    encode_walked::<Checked>(out, lead, seq, appended_unix_ms, event)
}

/// [`encode`] for bytes prost just encoded from a typed `Event` (the caller's, or the queue's
/// own): only the top-level fields are walked, to drop field 1; their contents are not checked
/// again.
pub fn encode_trusted(
    out: &mut Vec<u8>,
    seq: u64,
    appended_unix_ms: u64,
    event: &[u8],
) -> Result<(), MalformedEvent> {
    encode_trusted_after(out, 0, seq, appended_unix_ms, event)
}

/// [`encode_trusted`] after `lead` zero bytes, as [`encode_after`].
pub fn encode_trusted_after(
    out: &mut Vec<u8>,
    lead: usize,
    seq: u64,
    appended_unix_ms: u64,
    event: &[u8],
) -> Result<(), MalformedEvent> {
    encode_walked::<Trusted>(out, lead, seq, appended_unix_ms, event)
}

/// How an event's top-level fields are walked while it is copied: checked as prost would decode
/// them ([`Checked`]), or, for bytes prost just encoded, by their lengths only ([`Trusted`]).
/// Each calls `field_1(from, to)` for every field 1 it finds (dropped from the copy) and returns
/// the offset of a field that fails.
trait Walk {
    fn walk(event: &[u8], field_1: impl FnMut(usize, usize)) -> Result<(), usize>;
}

/// [`wire::check_event`].
struct Checked;
/// [`wire::walk_trusted`].
struct Trusted;

impl Walk for Checked {
    #[inline(always)]
    fn walk(event: &[u8], field_1: impl FnMut(usize, usize)) -> Result<(), usize> {
        wire::check_event(event, field_1)
    }
}

impl Walk for Trusted {
    #[inline(always)]
    fn walk(event: &[u8], field_1: impl FnMut(usize, usize)) -> Result<(), usize> {
        wire::walk_trusted(event, field_1)
    }
}

/// The header, `seq`, then `event` without its field 1, walked by `W`; see [`encode_after`].
#[inline(always)]
fn encode_walked<W: Walk>(
    out: &mut Vec<u8>,
    lead: usize,
    seq: u64,
    appended_unix_ms: u64,
    event: &[u8],
) -> Result<(), MalformedEvent> {
    let start = head(out, lead, seq, appended_unix_ms);
    let mut run = 0;
    let walked = W::walk(event, |from, to| {
        out.extend_from_slice(&event[run..from]);
        run = to;
    });
    finish(out, start, lead, event, run, walked)
}

/// Most zero bytes [`encode_after`] writes before a record (a frame header).
pub const MAX_LEAD: usize = 8;

/// Appends `lead` zero bytes, then a record's header and `seq` to `out` (the checksum is filled
/// in by [`finish`]); returns where the zero bytes start. The whole is copied at its longest (the
/// lead at its longest, a ten-byte `seq`: 31 bytes, rounded to 32), one copy of a fixed length
/// done with two moves instead of a call, then cut to its length: `out` needs room for the
/// longest, as a record's worst case does anyway.
#[inline(always)]
fn head(out: &mut Vec<u8>, lead: usize, seq: u64, appended_unix_ms: u64) -> usize {
    debug_assert!(lead <= MAX_LEAD);
    let lead = lead.min(MAX_LEAD);
    let start = out.len();
    let mut head = [0u8; 32];
    head[lead + 4..lead + HEADER_LEN].copy_from_slice(&appended_unix_ms.to_le_bytes());
    head[lead + HEADER_LEN] = SEQ_KEY;
    let seq_at = lead + HEADER_LEN + 1;
    let head_len = seq_at + put_varint(&mut head[seq_at..seq_at + 10], seq);
    out.extend_from_slice(&head);
    out.truncate(start + head_len);
    start
}

/// Completes the record started `lead` bytes after `start` once its event was walked: the
/// caller's fields from `run` on (the fields 1 before were dropped, the runs between them
/// copied), then the checksum; on a failed walk, leaves `out` as it was before `start`.
#[inline(always)]
fn finish(
    out: &mut Vec<u8>,
    start: usize,
    lead: usize,
    event: &[u8],
    run: usize,
    walked: Result<(), usize>,
) -> Result<(), MalformedEvent> {
    if let Err(offset) = walked {
        out.truncate(start);
        return Err(MalformedEvent { offset });
    }
    out.extend_from_slice(&event[run..]);
    let record = start + lead.min(MAX_LEAD);
    let crc = checksum(&out[record + 4..]);
    out[record..record + 4].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Checks `event` as [`encode`] does, without storing it.
pub fn validate(event: &[u8]) -> Result<(), MalformedEvent> {
    wire::check_event(event, |_, _| {}).map_err(|offset| MalformedEvent { offset })
}

/// Checks a stored value read under key `seq`.
pub fn check(value: &[u8], seq: u64) -> Result<RecordView<'_>, CorruptRecord> {
    if value.len() < HEADER_LEN + 2 {
        return Err(CorruptRecord::Truncated);
    }
    let (crc, rest) = value.split_at(4);
    let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    if checksum(rest) != stored {
        return Err(CorruptRecord::Checksum);
    }
    let event = &value[HEADER_LEN..];
    if event[0] != SEQ_KEY {
        return Err(CorruptRecord::SeqMismatch);
    }
    match read_varint(event, 1) {
        Some((found, _)) if found == seq => Ok(RecordView {
            appended_unix_ms: appended_unix_ms(value).unwrap_or(0),
            event,
        }),
        _ => Err(CorruptRecord::SeqMismatch),
    }
}

/// The append time in a stored value's header, without checking the checksum.
pub fn appended_unix_ms(value: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = value.get(4..HEADER_LEN)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// The CRC32C (Castagnoli) of `bytes`, as `crc32c::crc32c` computes it. A record is short
/// (about 200 bytes): where the CPU has a CRC32C instruction it is one instruction per eight
/// bytes in a single loop, then one each for the last four, two and one bytes; the crate's
/// general routine first aligns its reads byte by byte and sets up three-way interleaved loops
/// for long buffers, which on a record of 200 bytes cost about a third of its checksum. The path
/// is chosen at run time ([`checksum_path`]): `crc32` with SSE 4.2 on x86-64, `crc32c[bhwx]`
/// with the `crc` extension on aarch64 (every Jetson has it), the crate's routine elsewhere. The
/// CPU's features are detected once and cached by `std`: each call reads one cached word.
/// Public so that a comparison with a plain log (the queue bench's baseline) checksums its
/// records with the same routine.
#[inline]
pub fn checksum(bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE 4.2, checked just above.
        return unsafe { checksum_sse42(bytes) };
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("crc") {
        // SAFETY: the CPU has the CRC32 instructions, checked just above.
        return unsafe { checksum_arm_crc(bytes) };
    }
    crc32c::crc32c(bytes)
}

/// The routine [`checksum`] runs on this CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumPath {
    /// x86-64 with SSE 4.2: the `crc32` instruction.
    Sse42,
    /// aarch64 with the `crc` extension: the `crc32c` instructions.
    ArmCrc,
    /// The `crc32c` crate's routine.
    Crate,
}

/// Which routine [`checksum`] runs on this CPU (a test asserts it against the CPU's features).
pub fn checksum_path() -> ChecksumPath {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        return ChecksumPath::Sse42;
    }
    #[cfg(target_arch = "aarch64")]
    if std::arch::is_aarch64_feature_detected!("crc") {
        return ChecksumPath::ArmCrc;
    }
    ChecksumPath::Crate
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn checksum_sse42(bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u8, _mm_crc32_u16, _mm_crc32_u32, _mm_crc32_u64};
    let (words, rest) = bytes.as_chunks::<8>();
    let mut crc = u64::from(u32::MAX);
    for word in words {
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(*word));
    }
    let mut crc = crc as u32;
    let (four, rest) = rest.split_at(rest.len() & 4);
    if let Ok(four) = <[u8; 4]>::try_from(four) {
        crc = _mm_crc32_u32(crc, u32::from_le_bytes(four));
    }
    let (two, rest) = rest.split_at(rest.len() & 2);
    if let Ok(two) = <[u8; 2]>::try_from(two) {
        crc = _mm_crc32_u16(crc, u16::from_le_bytes(two));
    }
    if let Some(&one) = rest.first() {
        crc = _mm_crc32_u8(crc, one);
    }
    !crc
}

/// [`checksum_sse42`]'s loop with aarch64's instructions: `crc32cx` per eight bytes, then
/// `crc32cw`, `crc32ch` and `crc32cb` for the last four, two and one.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "crc")]
fn checksum_arm_crc(bytes: &[u8]) -> u32 {
    use std::arch::aarch64::{__crc32cb, __crc32cd, __crc32ch, __crc32cw};
    let (words, rest) = bytes.as_chunks::<8>();
    let mut crc = u32::MAX;
    for word in words {
        crc = __crc32cd(crc, u64::from_le_bytes(*word));
    }
    let (four, rest) = rest.split_at(rest.len() & 4);
    if let Ok(four) = <[u8; 4]>::try_from(four) {
        crc = __crc32cw(crc, u32::from_le_bytes(four));
    }
    let (two, rest) = rest.split_at(rest.len() & 2);
    if let Ok(two) = <[u8; 2]>::try_from(two) {
        crc = __crc32ch(crc, u16::from_le_bytes(two));
    }
    if let Some(&one) = rest.first() {
        crc = __crc32cb(crc, one);
    }
    !crc
}

/// Writes `value` as a varint at the start of `out` (ten bytes hold any `u64`); returns its
/// length.
fn put_varint(out: &mut [u8], mut value: u64) -> usize {
    let mut len = 0;
    while value >= 0x80 {
        out[len] = (value as u8 & 0x7f) | 0x80;
        value >>= 7;
        len += 1;
    }
    out[len] = value as u8;
    len + 1
}

/// Reads a varint at `pos`; returns the value and the position after it.
fn read_varint(bytes: &[u8], mut pos: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(pos)?;
        pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some((value, pos));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgewatch_proto::v1::{CustomEvent, Event, event::Kind};
    use prost::Message;

    fn event(seq: u64) -> Event {
        Event {
            seq,
            event_time_unix_ns: 1_700_000_000_000_000_000,
            monotonic_ns: 42,
            kind: Some(Kind::Custom(CustomEvent {
                name: "door-open".into(),
                attributes: vec![],
            })),
        }
    }

    #[test]
    fn the_stored_event_decodes_with_the_queue_seq() {
        let mut out = Vec::new();
        encode(&mut out, 300, 7, &event(0).encode_to_vec()).unwrap();
        let view = check(&out, 300).unwrap();
        assert_eq!(view.appended_unix_ms, 7);
        assert_eq!(Event::decode(view.event).unwrap(), event(300));
    }

    #[test]
    fn a_seq_set_by_the_caller_is_replaced_not_duplicated() {
        let mut out = Vec::new();
        encode(&mut out, 5, 0, &event(99).encode_to_vec()).unwrap();
        let view = check(&out, 5).unwrap();
        assert_eq!(Event::decode(view.event).unwrap(), event(5));
        assert_eq!(view.event, event(5).encode_to_vec().as_slice());
    }

    #[test]
    fn a_flipped_bit_anywhere_fails_the_check() {
        let mut out = Vec::new();
        encode(&mut out, 1, 9, &event(0).encode_to_vec()).unwrap();
        for byte in 0..out.len() {
            for bit in 0..8 {
                let mut bad = out.clone();
                bad[byte] ^= 1 << bit;
                assert!(check(&bad, 1).is_err(), "byte {byte} bit {bit}");
            }
        }
    }

    #[test]
    fn fields_1_anywhere_in_the_event_are_all_dropped_and_the_rest_kept_in_order() {
        // time = 5, seq = 99, monotonic = 7, seq = 300 (prost keeps the last of a repeated scalar)
        let bytes = [0x10, 0x05, 0x08, 0x63, 0x18, 0x07, 0x08, 0xac, 0x02];
        for trusted in [false, true] {
            let mut out = Vec::new();
            if trusted {
                encode_trusted(&mut out, 1, 0, &bytes).unwrap();
            } else {
                encode(&mut out, 1, 0, &bytes).unwrap();
            }
            let view = check(&out, 1).unwrap();
            assert_eq!(view.event, [0x08, 0x01, 0x10, 0x05, 0x18, 0x07]);
        }
    }

    #[test]
    fn a_record_under_another_key_is_refused() {
        let mut out = Vec::new();
        encode(&mut out, 1, 9, &event(0).encode_to_vec()).unwrap();
        assert_eq!(check(&out, 2), Err(CorruptRecord::SeqMismatch));
    }

    #[test]
    fn truncated_and_malformed_encodings_are_refused_and_leave_the_buffer_alone() {
        let mut out = vec![1, 2, 3];
        let good = event(0).encode_to_vec();
        assert!(encode(&mut out, 1, 0, &good[..good.len() - 1]).is_err());
        assert!(encode(&mut out, 1, 0, &[0x00]).is_err());
        assert!(encode(&mut out, 1, 0, &[0x0b]).is_err());
        assert_eq!(out, vec![1, 2, 3]);
        assert_eq!(check(&[0; 5], 1), Err(CorruptRecord::Truncated));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_stored_checked_or_refused_without_panic(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            seq in proptest::num::u64::ANY,
        ) {
            let mut out = Vec::new();
            match encode(&mut out, seq, 5, &bytes) {
                Ok(()) => {
                    let view = check(&out, seq).unwrap();
                    proptest::prop_assert_eq!(view.appended_unix_ms, 5);
                    proptest::prop_assert!(view.event.len() <= bytes.len() + 11);
                }
                Err(_) => proptest::prop_assert!(out.is_empty()),
            }
        }
    }

    #[test]
    fn a_typed_event_is_stored_the_same_trusted_or_checked() {
        let bytes = event(77).encode_to_vec();
        let (mut checked, mut trusted) = (Vec::new(), Vec::new());
        encode(&mut checked, 5, 9, &bytes).unwrap();
        encode_trusted(&mut trusted, 5, 9, &bytes).unwrap();
        assert_eq!(checked, trusted);
        // Only the checked form looks inside a field: a string that is not UTF-8.
        let bad = [0xea, 0x01, 0x03, 0x0a, 0x01, 0xff];
        assert!(encode(&mut Vec::new(), 1, 0, &bad).is_err());
        assert!(encode_trusted(&mut Vec::new(), 1, 0, &bad).is_ok());
    }

    proptest::proptest! {
        #[test]
        fn the_checksum_is_the_crc32c_of_the_crate_at_every_length_and_alignment(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
            from in 0usize..16,
        ) {
            let bytes = &bytes[from.min(bytes.len())..];
            proptest::prop_assert_eq!(checksum(bytes), crc32c::crc32c(bytes));
        }
    }

    #[test]
    fn the_checksum_runs_the_cpus_crc_instructions_where_the_cpu_has_them() {
        let path = checksum_path();
        // Printed so that a run under emulation shows which routine it tested.
        println!("checksum path: {path:?}");
        #[cfg(target_arch = "x86_64")]
        let expected = if std::arch::is_x86_feature_detected!("sse4.2") {
            ChecksumPath::Sse42
        } else {
            ChecksumPath::Crate
        };
        // The kernel's (or qemu-user's) hardware capabilities, read without `std`'s detection.
        #[cfg(target_arch = "aarch64")]
        // SAFETY: getauxval reads the process's auxiliary vector; it has no preconditions.
        let expected = if unsafe { libc::getauxval(libc::AT_HWCAP) } & libc::HWCAP_CRC32 != 0 {
            ChecksumPath::ArmCrc
        } else {
            ChecksumPath::Crate
        };
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let expected = ChecksumPath::Crate;
        assert_eq!(path, expected);
        assert_eq!(checksum(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn an_empty_event_is_stored_as_just_its_seq() {
        let mut out = Vec::new();
        encode(&mut out, u64::MAX, 0, &[]).unwrap();
        let view = check(&out, u64::MAX).unwrap();
        assert_eq!(Event::decode(view.event).unwrap().seq, u64::MAX);
    }
}

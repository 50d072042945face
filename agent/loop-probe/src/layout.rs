//! The probe file's binary layout (ABI version 2, and the version 1 it extends): a 4 KiB header
//! followed by a ring of 64-byte slots.
//!
//! Invariants:
//! - Every shared word is an atomic; nothing in the file is read or written non-atomically once the
//!   file has been renamed into place.
//! - Offsets and sizes below are the ABI: a change to any of them bumps [`ABI_VERSION`]. The
//!   `const` assertions at the bottom fail the build if the Rust structs drift from this table.
//! - The identity lines (0 and 1) are written once, before the rename, and never again.
//! - Integers are native-endian: producer and agent run on the same machine.
//! - ABI 2 only adds to ABI 1: every ABI 1 field keeps its offset and meaning (the summary's
//!   `misses` word is the overrun count in both), and the words ABI 2 adds were reserved (zero)
//!   in ABI 1. So one `Header` maps both, and an ABI 1 file reads with the ABI 2 words zero.
//!
//! ```text
//! offset  size  field                      written by / when
//! ------  ----  -------------------------  -------------------------------------------------
//!      0     8  magic "EWLPROBE"           producer, at creation (identity, line 0)
//!      8     4  abi_version = 2 (1: a producer from before deadlines; still read)
//!     12     4  header_size = 4096
//!     16     4  slot_size = 64
//!     20     4  capacity (power of two)
//!     24     4  loop_id
//!     28     4  pid
//!     32     8  period_ns
//!     40     8  budget_ns
//!     48     8  epoch (random, non-zero, new per producer start)
//!     56     8  start_ns (CLOCK_MONOTONIC at creation)
//!     64    16  boot_id (kernel boot UUID)  (identity, line 1)
//!     80    32  loop_name (UTF-8, NUL-padded, at most 31 bytes)
//!    112     8  deadline_ns (relative deadline D, non-zero; ABI 1: reserved, zero)
//!    120     8  reserved
//!    128     8  head (records published)    record path, every cycle (line 2)
//!    136     8  heartbeat_ns                record path: start + duration of the last cycle
//!    144     8  summary latch sequence      record path
//!    152    40  summary copy 0: cycles, overruns, skipped, max_duration_ns, sum_duration_ns
//!               (ABI 1 calls the overrun word `misses`)
//!    192    40  summary copy 1 (same fields; a latch, so one copy is always whole)
//!    232     8  summary copy 0: deadline_misses (ABI 2; ABI 1: reserved, zero)
//!    240     8  summary copy 1: deadline_misses
//!    248     8  reserved
//!    256     8  interventions               any producer thread (fetch_add)
//!    264     8  safe_stops
//!    272     8  fallbacks (to the safety controller)
//!    280    40  reserved
//!    320     8  autonomy sequence           any producer thread (seqlock, try-acquire)
//!    328     8  autonomy mode (AutonomyMode as u64)
//!    336     8  mode since_ns
//!    344    40  ns spent in each mode [unknown, idle, manual, teleoperated, autonomous]
//!    384     8  model sequence              any producer thread (seqlock, try-acquire)
//!    392     8  model id hash
//!    400     8  model version length
//!    408    64  model version bytes (UTF-8)
//!    472  3624  reserved (zero)
//!   4096  64*N  slots, slot i holds record n where n mod N = i:
//!               +0 seq (2n+1 while writing, 2n+2 when done; 0 = never written)
//!               +8 release_ns  +16 start_ns  +24 duration_ns  +32 budget_ns  +40 cycle
//!               +48 loop_id (u32)  +52 flags (u32)  +56 reserved
//! ```
//!
//! Deadline semantics (ABI 2), for activation k with release r_k, start s_k and duration C_k:
//! completion f_k = s_k + C_k; it *misses its deadline* when f_k > r_k + D. An activation that
//! never ran (a gap in cycle numbers) is skipped, and a skipped activation is a deadline miss.
//! So `deadline_misses = late completions + skipped`, kept in the latch beside the other
//! counters, and `activations = cycles + skipped`, read from one latch copy (not stored: both
//! terms are). The last record's release and cycle number, which the agent needs to count what a
//! silent loop owes, are those of record `cycles - 1` in the ring.
//! An *overrun* (C_k > budget) is a diagnostic of its own: a step can overrun and meet D, or stay
//! within its budget and miss D because it started late.
//!
//! ABI 1 files (producers built before deadlines) are read as they are: `cycles`, `skipped` and
//! the overrun word are exact, so activations are exact (`cycles + skipped`), but completions
//! were never compared with a deadline and `deadline_misses` does not exist there (its words are
//! reserved, zero); the reader reports such a summary with legacy semantics instead of
//! inventing a value.
//! ```

use crate::sync::{AtomicU32, AtomicU64};

/// First word of every probe file: the bytes `EWLPROBE`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"EWLPROBE");
/// Layout version this crate writes (and the newest it reads).
pub const ABI_VERSION: u32 = 2;
/// Oldest layout version this crate reads: ABI 1, without deadlines.
pub const MIN_ABI_VERSION: u32 = 1;
/// Bytes before the first slot: one page, so the ring starts page-aligned.
pub const HEADER_SIZE: usize = 4096;
/// Bytes per slot: one cache line, so a slot write touches exactly one line.
pub const SLOT_SIZE: usize = 64;
/// Smallest ring: two slots still tell an overwrite from a torn read.
pub const MIN_CAPACITY: u32 = 2;
/// Largest ring (64 MiB): far above any loop rate × starvation time we size for.
pub const MAX_CAPACITY: u32 = 1 << 20;
/// Bytes of the loop name field; names are at most one byte shorter so C sees a NUL.
pub const LOOP_NAME_CAPACITY: usize = 32;
/// Bytes of the model version string.
pub const MODEL_VERSION_CAPACITY: usize = 64;
/// Number of [`AutonomyMode`] values, and of per-mode time counters.
pub const AUTONOMY_MODES: usize = 5;

/// Slot flag: the cycle ran longer than its budget, an execution overrun (set by the probe).
pub const FLAG_OVERRUN: u32 = 1 << 0;
/// Slot flag: one or more activations before this cycle were skipped (set by the probe from a
/// gap in cycle numbers).
pub const FLAG_SKIPPED: u32 = 1 << 1;
/// Slot flag: the loop ran degraded this cycle (set by the loop).
pub const FLAG_DEGRADED: u32 = 1 << 2;
/// Slot flag: this cycle's output came from the safety controller (set by the loop).
pub const FLAG_FALLBACK: u32 = 1 << 3;
/// Slot flag: the cycle completed after its release plus the relative deadline, a deadline miss
/// (set by the probe, ABI 2).
pub const FLAG_DEADLINE_MISS: u32 = 1 << 4;
/// Flags a loop may pass in; the probe computes the others.
pub const CALLER_FLAGS: u32 = FLAG_DEGRADED | FLAG_FALLBACK;

/// Who is driving the machine, as reported by the autonomy stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum AutonomyMode {
    /// Never reported since the producer started.
    Unknown = 0,
    /// Machine parked or not tasked.
    Idle = 1,
    /// An operator on board drives.
    Manual = 2,
    /// A remote operator drives.
    Teleoperated = 3,
    /// The AI functions drive.
    Autonomous = 4,
}

impl AutonomyMode {
    /// All modes, in counter order.
    pub const ALL: [AutonomyMode; AUTONOMY_MODES] = [
        AutonomyMode::Unknown,
        AutonomyMode::Idle,
        AutonomyMode::Manual,
        AutonomyMode::Teleoperated,
        AutonomyMode::Autonomous,
    ];

    /// The mode with this wire value, if there is one.
    pub fn from_u64(value: u64) -> Option<AutonomyMode> {
        Self::ALL.into_iter().find(|m| *m as u64 == value)
    }

    /// Lower-case name, as used in JSON and logs.
    pub fn name(self) -> &'static str {
        match self {
            AutonomyMode::Unknown => "unknown",
            AutonomyMode::Idle => "idle",
            AutonomyMode::Manual => "manual",
            AutonomyMode::Teleoperated => "teleoperated",
            AutonomyMode::Autonomous => "autonomous",
        }
    }
}

/// One ring slot: one cache line, seqlocked by `seq`.
#[repr(C, align(64))]
pub struct Slot {
    /// `2n+1` while record `n` is written, `2n+2` once it is whole, 0 if never written.
    pub seq: AtomicU64,
    /// Planned activation time, CLOCK_MONOTONIC ns.
    pub release_ns: AtomicU64,
    /// Actual start; `start - release` is the wake-up latency.
    pub start_ns: AtomicU64,
    /// Execution time of the cycle.
    pub duration_ns: AtomicU64,
    /// Budget the cycle was judged against.
    pub budget_ns: AtomicU64,
    /// The loop's own cycle counter; gaps are skipped activations.
    pub cycle: AtomicU64,
    /// Loop id, repeated so a slot can be told apart on its own.
    pub loop_id: AtomicU32,
    /// `FLAG_*` bits.
    pub flags: AtomicU32,
    /// Zero; room for a later ABI.
    pub reserved: AtomicU64,
}

/// One copy of the cumulative counters kept in the summary latch (ABI 1's words; the copy's
/// `deadline_misses` word, ABI 2, lies after both copies).
#[repr(C)]
pub struct SummaryWords {
    /// Cycles recorded (equals `head` once the latch settles).
    pub cycles: AtomicU64,
    /// Cycles whose duration exceeded the budget: execution overruns (ABI 1 called them misses).
    pub overruns: AtomicU64,
    /// Activations skipped, from gaps in cycle numbers.
    pub skipped: AtomicU64,
    /// Longest duration recorded.
    pub max_duration_ns: AtomicU64,
    /// Sum of durations recorded (saturating).
    pub sum_duration_ns: AtomicU64,
}

/// Cumulative counters as a latch: two copies so that a reader always finds one whole, even if
/// the producer died in the middle of an update. Copy `i` is `copies[i]` and
/// `deadline_misses[i]`.
#[repr(C)]
pub struct SummaryCell {
    /// Bumped twice per update; odd while copy 0 is written, even while copy 1 is.
    pub seq: AtomicU64,
    /// The copy readers use while `seq` is even, and the one the writer updates while it is odd.
    pub copies: [SummaryWords; 2],
    /// Activations that missed their deadline, late completions plus skipped, per copy (ABI 2;
    /// reserved, zero, in ABI 1).
    pub deadline_misses: [AtomicU64; 2],
    reserved: AtomicU64,
}

/// Event counters any producer thread may bump.
#[repr(C)]
pub struct EventCells {
    /// Operator interventions (takeovers) reported.
    pub interventions: AtomicU64,
    /// Safe stops reported.
    pub safe_stops: AtomicU64,
    /// Fallbacks to the safety controller reported.
    pub fallbacks: AtomicU64,
}

/// The current autonomy mode and time spent per mode, seqlocked.
#[repr(C)]
pub struct AutonomyCell {
    /// Even when stable; a writer claims it by moving it from even to odd.
    pub seq: AtomicU64,
    /// Current [`AutonomyMode`] as u64.
    pub mode: AtomicU64,
    /// When the current mode began, CLOCK_MONOTONIC ns.
    pub since_ns: AtomicU64,
    /// Nanoseconds spent in each mode before `since_ns`, indexed by mode.
    pub ns_in_mode: [AtomicU64; AUTONOMY_MODES],
}

/// The model version the loop runs, seqlocked.
#[repr(C)]
pub struct ModelCell {
    /// 0 until first set; even when stable; a writer claims it by moving it from even to odd.
    pub seq: AtomicU64,
    /// Hash identifying the model artefact (e.g. first 8 bytes of the engine's sha256).
    pub id_hash: AtomicU64,
    /// Valid bytes in `version`.
    pub len: AtomicU64,
    /// Version string bytes, 8 per word, little-endian within a word.
    pub version: [AtomicU64; MODEL_VERSION_CAPACITY / 8],
}

/// The 4 KiB header, as mapped.
#[cfg(not(loom))]
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: AtomicU64,
    /// [`ABI_VERSION`].
    pub abi_version: AtomicU32,
    /// [`HEADER_SIZE`].
    pub header_size: AtomicU32,
    /// [`SLOT_SIZE`].
    pub slot_size: AtomicU32,
    /// Slots in the ring, a power of two.
    pub capacity: AtomicU32,
    /// The loop's id.
    pub loop_id: AtomicU32,
    /// Producer process id.
    pub pid: AtomicU32,
    /// Nominal loop period.
    pub period_ns: AtomicU64,
    /// Per-cycle execution budget.
    pub budget_ns: AtomicU64,
    /// Random per producer start; never 0.
    pub epoch: AtomicU64,
    /// Producer start, CLOCK_MONOTONIC ns.
    pub start_ns: AtomicU64,
    /// Kernel boot id (UUID bytes).
    pub boot_id: [AtomicU64; 2],
    /// Loop name bytes, NUL-padded.
    pub loop_name: [AtomicU64; LOOP_NAME_CAPACITY / 8],
    /// Relative deadline D, ns (ABI 2; zero in ABI 1).
    pub deadline_ns: AtomicU64,
    reserved1: AtomicU64,
    /// Records published so far.
    pub head: AtomicU64,
    /// End of the last recorded cycle, CLOCK_MONOTONIC ns.
    pub heartbeat_ns: AtomicU64,
    /// Cumulative counters.
    pub summary: SummaryCell,
    /// Event counters.
    pub events: EventCells,
    reserved4: [AtomicU64; 5],
    /// Autonomy mode and per-mode time.
    pub autonomy: AutonomyCell,
    /// Model version.
    pub model: ModelCell,
    reserved7: [AtomicU64; 5],
    tail: [AtomicU64; (HEADER_SIZE - 512) / 8],
}

#[cfg(not(loom))]
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Slot>() == SLOT_SIZE);
    assert!(align_of::<Slot>() == SLOT_SIZE);
    assert!(offset_of!(Slot, seq) == 0);
    assert!(offset_of!(Slot, cycle) == 40);
    assert!(offset_of!(Slot, loop_id) == 48);
    assert!(offset_of!(Slot, flags) == 52);
    assert!(size_of::<Header>() == HEADER_SIZE);
    assert!(offset_of!(Header, period_ns) == 32);
    assert!(offset_of!(Header, start_ns) == 56);
    assert!(offset_of!(Header, boot_id) == 64);
    assert!(offset_of!(Header, loop_name) == 80);
    assert!(offset_of!(Header, deadline_ns) == 112);
    assert!(offset_of!(Header, head) == 128);
    assert!(offset_of!(Header, heartbeat_ns) == 136);
    assert!(offset_of!(Header, summary) == 144);
    assert!(offset_of!(Header, events) == 256);
    assert!(offset_of!(Header, autonomy) == 320);
    assert!(offset_of!(Header, model) == 384);
    assert!(offset_of!(Header, reserved7) == 472);
    assert!(size_of::<SummaryWords>() == 40);
    assert!(offset_of!(SummaryWords, overruns) == 8);
    assert!(offset_of!(SummaryCell, copies) == 8);
    assert!(offset_of!(SummaryCell, deadline_misses) == 88);
    assert!(size_of::<SummaryCell>() == 112);
    assert!(offset_of!(Header, summary) + offset_of!(SummaryCell, deadline_misses) == 232);
};

/// Total file size for a ring of `capacity` slots, or `None` on overflow.
pub fn file_size(capacity: u32) -> Option<usize> {
    (capacity as usize)
        .checked_mul(SLOT_SIZE)?
        .checked_add(HEADER_SIZE)
}

/// Ring capacity for a loop of this period: 16 s of records, at least 1024 and at most 65536
/// slots (25 Hz → 1024 slots, 1 kHz → 16384), so a SCHED_IDLE agent starved for seconds loses
/// nothing.
pub fn recommended_capacity(period_ns: u64) -> u32 {
    const HORIZON_NS: u64 = 16_000_000_000;
    let records = HORIZON_NS / period_ns.max(1);
    records.clamp(1024, 65_536).next_power_of_two().min(65_536) as u32
}

/// Packs up to `8 * N` bytes into words, little-endian within each word, zero-padded.
pub(crate) fn pack_bytes<const N: usize>(bytes: &[u8]) -> [u64; N] {
    let mut words = [0u64; N];
    for (i, b) in bytes.iter().take(8 * N).enumerate() {
        if let Some(w) = words.get_mut(i / 8) {
            *w |= u64::from(*b) << (8 * (i % 8));
        }
    }
    words
}

/// Unpacks words written by [`pack_bytes`] into `out`.
pub(crate) fn unpack_bytes(words: &[u64], out: &mut [u8]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = words.get(i / 8).map_or(0, |w| (w >> (8 * (i % 8))) as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recommended_capacity_matches_the_sizing_rule() {
        assert_eq!(recommended_capacity(40_000_000), 1024);
        assert_eq!(recommended_capacity(1_000_000), 16_384);
        assert_eq!(recommended_capacity(10_000), 65_536);
        assert_eq!(recommended_capacity(0), 65_536);
        assert!(recommended_capacity(1_000_000_000).is_power_of_two());
    }

    #[test]
    fn packed_bytes_round_trip() {
        let words: [u64; 8] = pack_bytes(b"resnet-v1.2.3+trt10");
        let mut out = [0u8; 19];
        unpack_bytes(&words, &mut out);
        assert_eq!(&out, b"resnet-v1.2.3+trt10");
    }

    #[test]
    fn autonomy_modes_round_trip_through_their_wire_value() {
        for m in AutonomyMode::ALL {
            assert_eq!(AutonomyMode::from_u64(m as u64), Some(m));
        }
        assert_eq!(AutonomyMode::from_u64(5), None);
    }
}

/// Zeroed cells on the heap, for the loom and unit-test models of the protocol.
#[cfg(test)]
pub(crate) mod zeroed {
    use super::*;

    fn words<const N: usize>() -> [AtomicU64; N] {
        core::array::from_fn(|_| AtomicU64::new(0))
    }

    pub(crate) fn slot() -> Slot {
        Slot {
            seq: AtomicU64::new(0),
            release_ns: AtomicU64::new(0),
            start_ns: AtomicU64::new(0),
            duration_ns: AtomicU64::new(0),
            budget_ns: AtomicU64::new(0),
            cycle: AtomicU64::new(0),
            loop_id: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            reserved: AtomicU64::new(0),
        }
    }

    fn summary_words() -> SummaryWords {
        SummaryWords {
            cycles: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            max_duration_ns: AtomicU64::new(0),
            sum_duration_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn summary() -> SummaryCell {
        SummaryCell {
            seq: AtomicU64::new(0),
            copies: [summary_words(), summary_words()],
            deadline_misses: words(),
            reserved: AtomicU64::new(0),
        }
    }

    #[cfg(not(loom))]
    pub(crate) fn events() -> EventCells {
        EventCells {
            interventions: AtomicU64::new(0),
            safe_stops: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
        }
    }

    pub(crate) fn autonomy() -> AutonomyCell {
        AutonomyCell {
            seq: AtomicU64::new(0),
            mode: AtomicU64::new(0),
            since_ns: AtomicU64::new(0),
            ns_in_mode: words(),
        }
    }

    pub(crate) fn model() -> ModelCell {
        ModelCell {
            seq: AtomicU64::new(0),
            id_hash: AtomicU64::new(0),
            len: AtomicU64::new(0),
            version: words(),
        }
    }

    /// A whole ring on the heap.
    pub(crate) struct Ring {
        pub(crate) head: AtomicU64,
        pub(crate) heartbeat_ns: AtomicU64,
        pub(crate) summary: SummaryCell,
        pub(crate) slots: Vec<Slot>,
    }

    impl Ring {
        pub(crate) fn new(capacity: u32) -> Ring {
            Ring {
                head: AtomicU64::new(0),
                heartbeat_ns: AtomicU64::new(0),
                summary: summary(),
                slots: (0..capacity).map(|_| slot()).collect(),
            }
        }
    }
}

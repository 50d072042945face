//! Normalization: events of a validated batch become cumulative counter samples stamped with event
//! time, named and labelled as `docs/series.md` says, with the names of [`edgewatch_slo::names`]
//! (the SLO core reads by the same constants). Pure: no I/O, no clock (arrival is an argument).
//!
//! An event is the unit: [`normalize_event`] returns all of a counter event's samples, or refuses
//! the event whole with a reason from `names::refusal` (so no check can let half an SLO pair
//! through).
//!
//! Invariants:
//! - Only the labels of the contract are produced: base labels (`machine_id`, `site`,
//!   `machine_class`) plus the metric's own; never ids, sequence numbers, timestamps or free text.
//!   A label value that is not a short id-like string (see [`label_value`]) refuses the event
//!   (or, for one entry of a multi-entry event, that entry alone), so a hostile agent cannot
//!   mint series with arbitrary text.
//! - A series key is canonical: `metric{name="value",...}` with label names sorted, so equal
//!   series always have equal keys, byte for byte.
//! - A counter event is refused whole when its time is not sane (at or before the Unix epoch,
//!   later than `arrival + max_future_skew`, or a counter started after its own event), when a
//!   value is negative or not finite (or a count its semantics needs is absent), when a part of
//!   an SLO pair (`names::SLO_PAIRS`, and `deadline_misses` of `activations` where they become
//!   no series) exceeds its total, or when an increment event's total is zero or below its
//!   increment. Nothing of a refused event becomes a sample.
//! - Deadline counters travel under the names of their semantics (`docs/series.md`): the fields
//!   of agents from before deadline semantics (`cycles`, `misses` = overruns, `skipped`) always
//!   under their old names; `activations`, `deadline_misses` and `overruns` under new names only
//!   when the event's semantics is COMPLETION; the activations of any other event under a name
//!   that says why no deadline judged them (an older agent, or an ABI 1 probe).
//! - A health report (`AgentHealth`) becomes gauges: the queue's backlog per tier and the
//!   report's own time, each value standing alone as of the event time (no baseline, no run).
//! - Every counter value comes with its baseline, where the counter stood before the event
//!   ([`EventSamples::baseline`]), so the increase rule counts an event from the first: `0` at
//!   the counter's start for the kinds that carry a start time, `total − increment` one
//!   millisecond before the event for increment events. Both are functions of the event alone,
//!   so a re-sent or replayed event yields the same baselines.

use edgewatch_proto::topic::validate_id;
use edgewatch_proto::v1::{self, Batch, event};
use edgewatch_slo::names::{SLO_PAIRS, label, metric, refusal, value};

/// A series in one store `Writer`, for one machine: where the writer holds its chunks and its
/// live state, found once (`Writer::series_slot`) for the samples that follow. Good for the
/// writer that gave it only. Defined here, with the key memo that keeps it beside a key's id for
/// a batch, so that the pure series code names nothing of the store; only the store reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesSlot {
    /// Index in the writer's `chunks.list`.
    pub(crate) chunks: usize,
    /// Index in the writer's `live.list`.
    pub(crate) live: usize,
}

/// One sample of one series.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Canonical series key (see [`SeriesKey`]).
    pub series: String,
    /// Timestamp, milliseconds since the Unix epoch.
    pub ts_ms: i64,
    /// Counter value.
    pub value: f64,
}

/// What normalization makes of one event (borrowing from it).
#[derive(Debug, Clone, PartialEq)]
pub enum Normalized<'e> {
    /// Not a counter event: it writes no series.
    NotCounter,
    /// A counter event that passed every check of its own; its samples are admitted together
    /// or not at all.
    Counted(EventSamples<'e>),
    /// A counter event refused whole.
    Refused(Refusal),
}

/// The samples of one counter event.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventSamples<'e> {
    /// The counter values, at the event time.
    pub values: Vec<Sample>,
    /// Where each value's counter stood before the event (one for all: an event's counters
    /// share their start or their increment), a sample of each value's series.
    pub baseline: Option<Baseline>,
    /// Start time (ms) of the run the values belong to, for kinds that carry one.
    pub run_start_ms: Option<i64>,
    /// Entries refused alone (`bad_label`): a component, mode or rail this gateway cannot label,
    /// as the series key it would have had, with `unknown` for that label.
    pub refused_entries: Vec<String>,
    /// The `model` and `model_version` label values of an event about a model (`unknown` for
    /// one that names none), for the machine's model-version event times; `None` for events
    /// about no model (queue losses, health reports).
    pub model: Option<(&'e str, &'e str)>,
    /// Where each value's key is in the [`KeyMemo`] that built it, for the ids the caller
    /// attached to keys there ([`KeyMemo::id`]).
    pub slots: MemoSlots,
}

/// Most values of one event whose [`KeyMemo`] slot is kept: more than any event of a known kind
/// but a many-rail energy report writes.
const SLOTS_MAX: usize = 16;

/// No slot: the key's entry gave way to another while the event was built.
const NO_SLOT: u8 = u8::MAX;

/// The [`KeyMemo`] slots of an event's values, in their order (the first [`SLOTS_MAX`]): held
/// inline, so an event allocates nothing for them. Bookkeeping of the memo, not part of what the
/// event says: any two are equal.
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoSlots {
    slots: [u8; SLOTS_MAX],
    len: u8,
}

impl PartialEq for MemoSlots {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl MemoSlots {
    /// The slot of the value at `index`, when known.
    pub fn get(&self, index: usize) -> Option<usize> {
        self.slots[..usize::from(self.len)]
            .get(index)
            .filter(|&&slot| slot != NO_SLOT)
            .map(|&slot| usize::from(slot))
    }

    /// Notes the slot of the next value (past [`SLOTS_MAX`] values, nothing is kept).
    fn push(&mut self, slot: usize) {
        if let Some(at) = self.slots.get_mut(usize::from(self.len)) {
            *at = u8::try_from(slot).unwrap_or(NO_SLOT);
            self.len += 1;
        }
    }

    /// Forgets every value's slot that was `slot`, whose entry gave way to another key.
    fn evicted(&mut self, slot: usize) {
        for at in &mut self.slots[..usize::from(self.len)] {
            if usize::from(*at) == slot {
                *at = NO_SLOT;
            }
        }
    }
}

/// Where an event's counters stood before it: `0` at `min(start, event time − 1 ms)` for kinds
/// with a start time (a new start is a counter restarted from zero); `total − increment` at
/// event time − 1 ms for increment events (fallbacks, interventions, safe stops, queue losses),
/// whose series can start at a producer's running total (a model switch mid-run). Events without
/// either have none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Baseline {
    /// Timestamp, ms.
    pub ts_ms: i64,
    /// Value.
    pub value: f64,
}

/// A counter event refused whole, for the refusal series and the dead letter.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// One of `names::refusal::REASONS`.
    pub reason: &'static str,
    /// When (ms): the event time, or the arrival when the event time is what was wrong.
    pub ts_ms: i64,
    /// The series the event would have written, with `unknown` for each label value that is
    /// not valid.
    pub series: Vec<String>,
    /// What was wrong, for the dead letter.
    pub detail: String,
}

/// Builds canonical series keys.
#[derive(Debug, Clone)]
pub struct SeriesKey;

impl SeriesKey {
    /// `metric{a="x",b="y"}` with labels sorted by name (values are escaped like PromQL strings).
    pub fn build(metric: &str, labels: &mut [(&str, &str)]) -> String {
        labels.sort_unstable_by(|a, b| a.0.cmp(b.0));
        // Built once per sample on the ingest path: sized up front, pieces pushed whole.
        let size = labels
            .iter()
            .map(|(name, value)| name.len() + value.len() + 4)
            .sum::<usize>();
        let mut key = String::with_capacity(metric.len() + 2 + size);
        key.push_str(metric);
        key.push('{');
        for (index, (name, value)) in labels.iter().enumerate() {
            if index > 0 {
                key.push(',');
            }
            key.push_str(name);
            key.push_str("=\"");
            if value.bytes().any(|b| matches!(b, b'\\' | b'"' | b'\n')) {
                for c in value.chars() {
                    match c {
                        '\\' => key.push_str("\\\\"),
                        '"' => key.push_str("\\\""),
                        '\n' => key.push_str("\\n"),
                        _ => key.push(c),
                    }
                }
            } else {
                key.push_str(value);
            }
            key.push('"');
        }
        key.push('}');
        key
    }

    /// Splits a canonical key into its metric name and labels (sorted by name).
    pub fn parse(key: &str) -> Option<(String, Vec<(String, String)>)> {
        let open = key.find('{')?;
        let metric = key[..open].to_owned();
        let body = key[open + 1..].strip_suffix('}')?;
        let mut labels = Vec::new();
        let mut chars = body.chars().peekable();
        while chars.peek().is_some() {
            let mut name = String::new();
            for c in chars.by_ref() {
                if c == '=' {
                    break;
                }
                name.push(c);
            }
            if chars.next() != Some('"') {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()? {
                    '\\' => match chars.next()? {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    '"' => break,
                    other => value.push(other),
                }
            }
            labels.push((name, value));
            match chars.next() {
                None => break,
                Some(',') => {}
                Some(_) => return None,
            }
        }
        Some((metric, labels))
    }

    /// The metric name of a canonical key.
    pub fn metric(key: &str) -> &str {
        key.split('{').next().unwrap_or(key)
    }
}

/// A label value from agent-supplied text: a valid id (`[A-Za-z0-9._-]`, 1 to 64 bytes), or
/// `"unknown"` when empty. `None` for anything else.
pub fn label_value(text: &str) -> Option<&str> {
    if text.is_empty() {
        return Some(value::UNKNOWN);
    }
    validate_id(text).ok().map(|()| text)
}

/// The machine's base labels.
#[derive(Debug, Clone, Copy)]
pub struct BaseLabels<'a> {
    /// `machine_id`.
    pub machine: &'a str,
    /// `site`.
    pub site: &'a str,
    /// `machine_class` (`"unknown"` when the batch has none).
    pub class: &'a str,
}

impl<'a> BaseLabels<'a> {
    /// Base labels of a batch; `None` if its machine class is not a valid label value.
    pub fn of(batch: &'a Batch) -> Option<Self> {
        Some(Self {
            machine: &batch.machine_id,
            site: &batch.site_id,
            class: label_value(&batch.machine_class)?,
        })
    }

    /// Base labels of a batch with `unknown` for a machine class that is not a valid label
    /// value, for naming what the batch's refused events would have written.
    pub fn lenient(batch: &'a Batch) -> Self {
        Self {
            machine: &batch.machine_id,
            site: &batch.site_id,
            class: label_value(&batch.machine_class).unwrap_or(value::UNKNOWN),
        }
    }

    /// A series key of this machine.
    pub fn key(&self, metric: &str, extra: &[(&str, &str)]) -> String {
        let base = [
            (label::MACHINE_ID, self.machine),
            (label::SITE, self.site),
            (label::MACHINE_CLASS, self.class),
        ];
        // On the stack for the series the gateway writes (at most five labels of their own).
        let mut stack = [("", ""); 8];
        if let Some(labels) = stack.get_mut(..3 + extra.len()) {
            labels[..3].copy_from_slice(&base);
            labels[3..].copy_from_slice(extra);
            return SeriesKey::build(metric, labels);
        }
        let mut labels = base.to_vec();
        labels.extend_from_slice(extra);
        SeriesKey::build(metric, &mut labels)
    }
}

/// `model` and `model_version` of an event: `unknown` when it names no model; `None` in place of
/// a value that is not a valid label value.
fn model_labels(model: Option<&v1::ModelVersion>) -> (Option<&str>, Option<&str>) {
    match model {
        None => (Some(value::UNKNOWN), Some(value::UNKNOWN)),
        Some(model) => (label_value(&model.name), label_value(&model.version)),
    }
}

fn component_label(value: i32) -> Option<&'static str> {
    match v1::Component::try_from(value).ok()? {
        v1::Component::Cpu => Some(value::CPU),
        v1::Component::Gpu => Some(value::GPU),
        v1::Component::Soc => Some(value::SOC),
        v1::Component::Unspecified => None,
    }
}

fn mode_label(value: i32) -> Option<&'static str> {
    match v1::AutonomyMode::try_from(value).ok()? {
        v1::AutonomyMode::Autonomous => Some(value::AUTONOMOUS),
        v1::AutonomyMode::Manual => Some(value::MANUAL),
        v1::AutonomyMode::Teleoperated => Some(value::TELEOPERATED),
        v1::AutonomyMode::Idle => Some(value::IDLE),
        v1::AutonomyMode::Unspecified => None,
    }
}

/// The `source` label of an intervention or a safe stop: who counted it. The probe and the agent
/// (for the local socket) each keep a counter of their own, so they are separate series. An event
/// of an agent from before sources is the probe's; `None` for an unknown source.
fn source_label(source: i32) -> Option<&'static str> {
    match v1::EventSource::try_from(source).ok()? {
        v1::EventSource::Local => Some(value::LOCAL),
        v1::EventSource::Probe | v1::EventSource::Unspecified => Some(value::PROBE),
    }
}

fn tier_label(value: i32) -> Option<&'static str> {
    edgewatch_proto::tier::name(v1::Tier::try_from(value).ok()?)
}

fn cause_label(value: i32) -> Option<&'static str> {
    match v1::LossCause::try_from(value).ok()? {
        v1::LossCause::Evicted => Some("evicted"),
        v1::LossCause::Expired => Some("expired"),
        v1::LossCause::Corrupt => Some("corrupt"),
        v1::LossCause::DiskFull => Some("disk_full"),
        v1::LossCause::Quarantined => Some("quarantined"),
        v1::LossCause::BufferOverflow => Some("buffer_overflow"),
        v1::LossCause::Refused => Some("refused"),
        v1::LossCause::Unspecified => None,
    }
}

/// Whether an event time is acceptable for a sample, given arrival (both ns since the epoch).
pub fn event_time_ok(
    event_time_ns: i64,
    arrival_ns: i64,
    max_future_skew_ns: i64,
) -> Result<(), TimeProblem> {
    if event_time_ns <= 0 {
        return Err(TimeProblem::BeforeEpoch);
    }
    if event_time_ns > arrival_ns.saturating_add(max_future_skew_ns) {
        return Err(TimeProblem::Future);
    }
    Ok(())
}

/// What is wrong with an event time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeProblem {
    /// At or before the Unix epoch.
    BeforeEpoch,
    /// Later than arrival plus the allowed skew.
    Future,
}

/// Milliseconds from nanoseconds, rounding down (also for negative values).
pub fn ns_to_ms(ns: i64) -> i64 {
    ns.div_euclid(1_000_000)
}

/// The samples of one event being built: keys with `unknown` in place of a value that is not a
/// valid label, whether such a value was one of the event's own labels, and the entries refused
/// alone.
struct Builder<'a, 'e> {
    base: &'a BaseLabels<'a>,
    memo: &'a mut KeyMemo,
    values: Vec<Sample>,
    slots: MemoSlots,
    ts_ms: i64,
    bad_label: bool,
    refused_entries: Vec<String>,
    /// The labels of the value before and their [`MemoEntry::labels_id`]. Their values are
    /// borrowed from the event for as long as the builder lives: labels at the same addresses
    /// are the same labels.
    last_labels: LastLabels<'e>,
}

/// Most labels of a value [`Builder::last_labels`] keeps (as many as an event's value has; a
/// value with more is looked up by comparing its labels).
const LAST_LABELS_MAX: usize = 4;

/// [`Builder::last_labels`], updated in place (once per event and entry, not copied).
#[derive(Default)]
struct LastLabels<'e> {
    labels: [(&'static str, Option<&'e str>); LAST_LABELS_MAX],
    len: usize,
    /// `None`: no labels kept.
    id: Option<u64>,
}

impl<'e> LastLabels<'e> {
    /// The labels id of `labels` when they are these, at the same addresses (not reading their
    /// bytes).
    fn id_of(&self, labels: &[(&'static str, Option<&str>)]) -> Option<u64> {
        self.id.filter(|_| self.are(labels))
    }

    /// Keeps `labels` with their id (or nothing, past [`LAST_LABELS_MAX`]).
    fn set(&mut self, labels: &[(&'static str, Option<&'e str>)], id: u64) {
        match self.labels.get_mut(..labels.len()) {
            Some(kept) => {
                kept.copy_from_slice(labels);
                self.len = labels.len();
                self.id = Some(id);
            }
            None => self.id = None,
        }
    }

    fn are(&self, labels: &[(&'static str, Option<&str>)]) -> bool {
        let at_same_address =
            |a: &str, b: &str| a.len() == b.len() && std::ptr::eq(a.as_ptr(), b.as_ptr());
        self.len == labels.len()
            && self.labels[..self.len]
                .iter()
                .zip(labels)
                .all(|((n, v), (name, value))| {
                    at_same_address(n, name)
                        && match (v, value) {
                            (None, None) => true,
                            (Some(v), Some(value)) => at_same_address(v, value),
                            _ => false,
                        }
                })
    }
}

/// The series key of `metric` with `labels`, `unknown` for each value that is not a valid label
/// (`None`). Once per sample: the labels are gathered on the stack.
fn key_or_unknown(base: &BaseLabels<'_>, metric: &str, labels: &[(&str, Option<&str>)]) -> String {
    let mut stack = [("", ""); 8];
    match stack.get_mut(..labels.len()) {
        Some(resolved) => {
            for (slot, (name, v)) in resolved.iter_mut().zip(labels) {
                *slot = (*name, v.unwrap_or(value::UNKNOWN));
            }
            base.key(metric, resolved)
        }
        None => {
            let resolved: Vec<(&str, &str)> = labels
                .iter()
                .map(|(name, v)| (*name, v.unwrap_or(value::UNKNOWN)))
                .collect();
            base.key(metric, &resolved)
        }
    }
}

/// Most keys a [`KeyMemo`] keeps per machine: more than one machine's batch writes in the
/// common case.
const KEY_MEMO_MAX: usize = 32;

/// Most other machines whose keys a [`KeyMemo`] keeps (a few hundred KiB at most): a fleet's
/// machines send in turn, so the keys of each are built again only past that many.
const KEY_MEMO_MACHINES: usize = 256;

/// Series keys already built for one machine (one set of base labels), by metric and the
/// event's labels: the events of a batch mostly write the series of the events before them, so
/// a key is built once per machine and copied after. The keys of the last
/// [`KEY_MEMO_MACHINES`] other machines are kept apart, each with its base labels, and taken
/// back when their machine's next batch comes: it never gives a key of another machine.
///
/// It also keeps the samples of events admitted ([`KeyMemo::recycle`]) to build the next
/// events' samples in: a key is copied into a string that has room for it, not allocated.
///
/// The caller may attach an id to a key (the ingest's series id, [`KeyMemo::set_id`]), found by
/// the slot an event's value names ([`EventSamples::slots`]) without hashing the key again. An
/// id stays with its key until [`KeyMemo::forget_ids`], and goes with it when its entry gives
/// way to another key or the memo starts again: a slot never gives the id of another key.
#[derive(Debug, Default)]
pub struct KeyMemo {
    /// The base labels the keys were built with: machine, site, class.
    base: [String; 3],
    entries: Vec<MemoEntry>,
    /// The base labels and keys of other machines, the one seen longest ago first (a fleet's
    /// machines send in turn: the machine asked for is mostly the first).
    others: std::collections::VecDeque<([String; 3], Vec<MemoEntry>)>,
    /// Ids attached under another epoch are forgotten ([`KeyMemo::forget_ids`]).
    epoch: u64,
    /// The entry after the last one found: an event's series come in the order of the event
    /// before it.
    next: usize,
    /// Samples given back, their keys' strings to be written over.
    spare: Vec<Sample>,
    /// Emptied lists of samples given back.
    spare_lists: Vec<Vec<Sample>>,
    /// The last [`MemoEntry::labels_id`] given to new labels.
    last_labels_id: u64,
    /// Whether the caller said that every event until [`KeyMemo::forget_ids`] is of the base
    /// labels at hand ([`KeyMemo::begin_batch`]): then an event does not compare them again.
    pinned: bool,
}

/// Most samples and lists a [`KeyMemo`] keeps for reuse.
const SPARE_MAX: usize = 64;

#[derive(Debug)]
struct MemoEntry {
    /// The metric (a name of `names::metric`, static like the label names: mostly found equal
    /// by address).
    metric: &'static str,
    /// The event's labels as given (`None`: not a valid label value).
    labels: Vec<(&'static str, Option<String>)>,
    key: String,
    /// The id the caller attached to `key` in the memo's epoch `.0` (until
    /// [`KeyMemo::forget_ids`]), with the series' slot in the caller's writer when attached.
    id: Option<(u64, u64, Option<SeriesSlot>)>,
    /// Names `labels`: two entries of one machine have the same id exactly when their labels
    /// are equal (an entry takes the id of an entry with equal labels, else a new one), so the
    /// values of an event that share its labels find their entries without comparing them.
    labels_id: u64,
    /// The SLO pair ([`SLO_PAIRS`], by index) whose total and whose part `metric` is, if any:
    /// found once per key, not per value.
    pair: PairRole,
    /// A sample of `key` given back ([`KeyMemo::recycle`]), its key's string written: the next
    /// value of the key takes it, and its key is not copied again.
    sample: Option<Sample>,
}

/// [`MemoEntry::pair`]: the index in [`SLO_PAIRS`] of the pair whose total, and of the pair whose
/// part, the metric is ([`NO_PAIR`]: none).
#[derive(Debug, Clone, Copy)]
struct PairRole {
    total_of: u8,
    part_of: u8,
}

/// [`PairRole`] of a metric in no pair.
const NO_PAIR: u8 = u8::MAX;

impl PairRole {
    const NONE: Self = Self {
        total_of: NO_PAIR,
        part_of: NO_PAIR,
    };

    fn of(metric: &str) -> Self {
        let index = |found: Option<usize>| found.and_then(|at| u8::try_from(at).ok());
        Self {
            total_of: index(SLO_PAIRS.iter().position(|(t, _)| *t == metric)).unwrap_or(NO_PAIR),
            part_of: index(SLO_PAIRS.iter().position(|(_, p)| *p == metric)).unwrap_or(NO_PAIR),
        }
    }
}

/// Whether two strings are equal, without reading them when they are the same string (a name
/// the entry was built with, given again).
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && (std::ptr::eq(a.as_ptr(), b.as_ptr()) || a == b)
}

impl MemoEntry {
    fn matches(&self, metric: &str, labels: &[(&str, Option<&str>)]) -> bool {
        same(self.metric, metric) && self.same_labels(labels)
    }

    fn same_labels(&self, labels: &[(&str, Option<&str>)]) -> bool {
        self.labels.len() == labels.len()
            && self
                .labels
                .iter()
                .zip(labels)
                .all(|((n, v), (name, value))| same(n, name) && v.as_deref() == *value)
    }
}

/// Whether `labels` (machine, site, class) are `base`.
fn is_base([machine, site, class]: &[String; 3], base: &BaseLabels<'_>) -> bool {
    (machine.as_str(), site.as_str(), class.as_str()) == (base.machine, base.site, base.class)
}

impl KeyMemo {
    /// Whether the keys at hand are of the machine of `base`.
    fn is_of(&self, base: &BaseLabels<'_>) -> bool {
        is_base(&self.base, base)
    }

    /// The id attached to the key at `slot` (see [`EventSamples::slots`]), if any.
    pub fn id(&self, slot: usize) -> Option<u64> {
        self.entries
            .get(slot)
            .and_then(|entry| entry.id)
            .filter(|(epoch, ..)| *epoch == self.epoch)
            .map(|(_, id, _)| id)
    }

    /// The id and the writer's slot attached to the key at `slot` ([`KeyMemo::set_series_slot`]),
    /// if any.
    pub fn series_slot(&self, slot: usize) -> Option<(u64, SeriesSlot)> {
        match self.entries.get(slot)?.id? {
            (epoch, id, Some(handle)) if epoch == self.epoch => Some((id, handle)),
            _ => None,
        }
    }

    /// Attaches `id` and the series' slot in the caller's writer to the key at `slot` (see
    /// [`KeyMemo::set_id`]): one writer's slots, so they are forgotten with the ids.
    pub fn set_series_slot(&mut self, slot: usize, id: u64, handle: SeriesSlot) {
        if let Some(entry) = self.entries.get_mut(slot) {
            entry.id = Some((self.epoch, id, Some(handle)));
        }
    }

    /// Attaches `id` to the key at `slot`: the key of the value whose slot it is, as long as no
    /// other event was built since.
    pub fn set_id(&mut self, slot: usize, id: u64) {
        if let Some(entry) = self.entries.get_mut(slot) {
            entry.id = Some((self.epoch, id, None));
        }
    }

    /// Forgets every id attached to a key (the caller's ids may no longer hold: once per batch,
    /// a transaction that did not commit took its new series with it).
    pub fn forget_ids(&mut self) {
        self.epoch += 1;
        self.pinned = false;
    }

    /// Takes the keys of the machine of `base` for the events of one batch, all of that machine,
    /// until [`KeyMemo::forget_ids`]: its events are normalized without comparing their base
    /// labels again (once per batch, not per event).
    pub fn begin_batch(&mut self, base: &BaseLabels<'_>) {
        self.rebase(base);
        self.pinned = true;
    }

    /// Gives back the samples of an event once they are admitted, for the next events: each to
    /// its key's entry when `slots` (the event's [`EventSamples::slots`], no other event built
    /// since) knows it, so its key is not copied again.
    pub fn recycle(&mut self, mut values: Vec<Sample>, slots: &MemoSlots) {
        for (i, sample) in values.drain(..).enumerate() {
            let entry = slots.get(i).and_then(|slot| self.entries.get_mut(slot));
            match entry {
                Some(entry) if entry.sample.is_none() => {
                    debug_assert_eq!(sample.series, entry.key);
                    entry.sample = Some(sample);
                }
                _ if self.spare.len() < SPARE_MAX => self.spare.push(sample),
                _ => {}
            }
        }
        if self.spare_lists.len() < SPARE_MAX {
            self.spare_lists.push(values);
        }
    }

    /// Takes the keys of the machine of `base` (kept apart, or none) unless they are those at
    /// hand: once per event, before its keys are asked for.
    fn rebase(&mut self, base: &BaseLabels<'_>) {
        if self.is_of(base) {
            return;
        }
        let found = self.others.iter().position(|(b, _)| is_base(b, base));
        let (found_base, found) = match found.and_then(|at| self.others.remove(at)) {
            Some(found) => found,
            None => (
                [base.machine, base.site, base.class].map(str::to_owned),
                Vec::new(),
            ),
        };
        let base = std::mem::replace(&mut self.base, found_base);
        let entries = std::mem::replace(&mut self.entries, found);
        if !entries.is_empty() {
            // Full: the machine seen longest ago gives way.
            if self.others.len() == KEY_MEMO_MACHINES {
                self.others.pop_front();
            }
            self.others.push_back((base, entries));
        }
        self.next = 0;
    }

    /// The slot of the key of `metric` with `labels` for the machine of `base`, which
    /// [`KeyMemo::rebase`] was given for this event, and whether that slot's entry gave way to
    /// this key (the slot held another key before).
    ///
    /// `labels_id` is the [`MemoEntry::labels_id`] of `labels` when the caller knows it (the
    /// labels of the event's value before, found in this machine's entries): entries are then
    /// told apart by metric and that id, without comparing labels.
    fn slot(
        &mut self,
        base: &BaseLabels<'_>,
        metric: &'static str,
        labels: &[(&'static str, Option<&str>)],
        labels_id: Option<u64>,
    ) -> (usize, bool) {
        let found = match labels_id {
            Some(id) => {
                let matches = |e: &MemoEntry| same(e.metric, metric) && e.labels_id == id;
                match self.entries.get(self.next) {
                    Some(entry) if matches(entry) => Some(self.next),
                    _ => self.entries.iter().position(matches),
                }
            }
            None => match self.entries.get(self.next) {
                Some(entry) if entry.matches(metric, labels) => Some(self.next),
                _ => self.entries.iter().position(|e| e.matches(metric, labels)),
            },
        };
        if let Some(at) = found {
            self.next = at + 1;
            return (at, false);
        }
        // A new key (rare): its labels take the id of an entry with equal labels, if any.
        let labels_id = match self.entries.iter().find(|e| e.same_labels(labels)) {
            Some(entry) => entry.labels_id,
            None => {
                self.last_labels_id += 1;
                self.last_labels_id
            }
        };
        let entry = MemoEntry {
            metric,
            labels: labels
                .iter()
                .map(|(n, v)| (*n, v.map(str::to_owned)))
                .collect(),
            key: key_or_unknown(base, metric, labels),
            id: None,
            labels_id,
            pair: PairRole::of(metric),
            sample: None,
        };
        // Full: the last entry gives way (a machine writing more series than that is rare).
        let evicted = self.entries.len() == KEY_MEMO_MAX;
        if evicted {
            self.entries.pop();
        }
        self.entries.push(entry);
        self.next = self.entries.len();
        (self.entries.len() - 1, evicted)
    }
}

/// [`Builder::part_above_total`] read from the values' keys.
fn part_above_total_by_keys(values: &[Sample]) -> Option<(&'static str, &'static str, f64, f64)> {
    for (total_metric, part_metric) in SLO_PAIRS {
        for total in values
            .iter()
            .filter(|s| key_labels(&s.series, total_metric).is_some())
        {
            let labels = key_labels(&total.series, total_metric);
            let part = values
                .iter()
                .find(|s| key_labels(&s.series, part_metric) == labels);
            if let Some(part) = part
                && part.value > total.value
            {
                return Some((total_metric, part_metric, part.value, total.value));
            }
        }
    }
    None
}

impl<'e> Builder<'_, 'e> {
    /// Adds `metric` with the event's `labels` (`None`: a value that is not a valid label, which
    /// refuses the event) at the event time.
    fn push(
        &mut self,
        metric: &'static str,
        labels: &[(&'static str, Option<&'e str>)],
        value: f64,
    ) {
        self.bad_label |= labels.iter().any(|(_, v)| v.is_none());
        let slot = self.slot(metric, labels);
        let entry = &mut self.memo.entries[slot];
        let mut sample = match entry.sample.take() {
            Some(sample) => sample,
            None => {
                let key = &self.memo.entries[slot].key;
                let mut sample = self.memo.spare.pop().unwrap_or(Sample {
                    series: String::new(),
                    ts_ms: 0,
                    value: 0.0,
                });
                sample.series.clear();
                sample.series.push_str(key);
                sample
            }
        };
        sample.ts_ms = self.ts_ms;
        sample.value = value;
        self.values.push(sample);
        self.slots.push(slot);
    }

    /// The memo slot of `metric` with `labels`; the values before that named it forget it when
    /// its entry gave way to this key.
    fn slot(&mut self, metric: &'static str, labels: &[(&'static str, Option<&'e str>)]) -> usize {
        let known = self.last_labels.id_of(labels);
        let (slot, evicted) = self.memo.slot(self.base, metric, labels, known);
        if evicted {
            self.slots.evicted(slot);
        }
        if known.is_none()
            && let Some(entry) = self.memo.entries.get(slot)
        {
            self.last_labels.set(labels, entry.labels_id);
        }
        slot
    }

    /// The first SLO pair ([`SLO_PAIRS`]) whose part exceeds its total among the values, as
    /// (total metric, part metric, part, total): pairs in order, totals in value order, each
    /// with the first value of its part metric and the same labels.
    ///
    /// A value's metric and labels come from its memo entry (its metric by name, its labels by
    /// [`MemoEntry::labels_id`], equal exactly when the labels are), not from its key: no key is
    /// read. Values whose entry gave way while the event was built are compared by their keys.
    fn part_above_total(&self) -> Option<(&'static str, &'static str, f64, f64)> {
        // Each value's pair role and labels id, from its memo entry; by the keys when a value
        // has none (its entry gave way while the event was built, or past `SLOTS_MAX` values).
        let mut roles = [(PairRole::NONE, 0u64); SLOTS_MAX];
        let known = self.values.len() <= SLOTS_MAX
            && self.values.iter().enumerate().all(|(i, _)| {
                match self
                    .slots
                    .get(i)
                    .and_then(|slot| self.memo.entries.get(slot))
                {
                    Some(entry) => {
                        roles[i] = (entry.pair, entry.labels_id);
                        true
                    }
                    None => false,
                }
            });
        if !known {
            return part_above_total_by_keys(&self.values);
        }
        let roles = &roles[..self.values.len()];
        if roles.iter().all(|(role, _)| role.total_of == NO_PAIR) {
            return None;
        }
        for (p, (total_metric, part_metric)) in SLO_PAIRS.into_iter().enumerate() {
            for (i, total) in self.values.iter().enumerate() {
                if usize::from(roles[i].0.total_of) != p {
                    continue;
                }
                // Equal labels ids are equal labels; other ids may still name the same labels in
                // another order, which the keys tell.
                let part = roles
                    .iter()
                    .zip(&self.values)
                    .find(|((role, labels), s)| {
                        usize::from(role.part_of) == p
                            && (*labels == roles[i].1
                                || key_labels(&s.series, part_metric)
                                    == key_labels(&total.series, total_metric))
                    })
                    .map(|(_, s)| s);
                if let Some(part) = part
                    && part.value > total.value
                {
                    return Some((total_metric, part_metric, part.value, total.value));
                }
            }
        }
        None
    }

    /// Adds one entry of a multi-entry event (a component, mode or rail): an entry whose own
    /// label is not valid (an enum value this gateway does not know, a rail that is not an id)
    /// is refused alone, and the rest of the event stands.
    fn push_entry(
        &mut self,
        metric: &'static str,
        entry: (&'static str, Option<&'e str>),
        labels: &[(&'static str, Option<&'e str>)],
        value: f64,
    ) {
        // Once per entry: the labels are gathered on the stack.
        let mut stack = [("", None); 8];
        let mut heap = Vec::new();
        let all = match stack.get_mut(..labels.len() + 1) {
            Some(all) => {
                all[0] = entry;
                all[1..].copy_from_slice(labels);
                &*all
            }
            None => {
                heap.push(entry);
                heap.extend_from_slice(labels);
                heap.as_slice()
            }
        };
        match entry.1 {
            Some(_) => self.push(metric, all, value),
            None => {
                let slot = self.slot(metric, all);
                let key = self.memo.entries[slot].key.clone();
                self.refused_entries.push(key);
            }
        }
    }
}

/// Where a counter event's counters start (see [`Baseline`]), or that its values are gauges.
#[derive(Debug, Clone, Copy)]
enum Origin {
    /// Cumulative since this start time (ns); `0` or less: unknown.
    Start(i64),
    /// An increment event: `total` now, `increment` of it by this event.
    Increment { total: u64, increment: u64 },
    /// Gauges: each value stands alone as of the event time (no baseline, no run).
    Gauge,
}

/// The metric name of a series key and the rest of it (its labels).
fn split_key(key: &str) -> (&str, &str) {
    key.split_at(key.find('{').unwrap_or(key.len()))
}

/// The labels of a series key (`{…}`) when its metric is `metric`: [`split_key`] for one
/// metric, without searching the key (it runs for every pair of an event's values).
fn key_labels<'k>(key: &'k str, metric: &str) -> Option<&'k str> {
    key.strip_prefix(metric)
        .filter(|rest| rest.starts_with('{'))
}

/// Normalizes one event of a batch arriving at `arrival_ns`: its samples, or its refusal.
pub fn normalize_event<'e>(
    base: &BaseLabels<'_>,
    event: &'e v1::Event,
    arrival_ns: i64,
    max_future_skew_ns: i64,
) -> Normalized<'e> {
    let mut memo = KeyMemo::default();
    normalize_event_with(&mut memo, base, event, arrival_ns, max_future_skew_ns)
}

/// [`normalize_event`] with the keys built for the events before it (of any machine: `memo`
/// starts again for another; after [`KeyMemo::begin_batch`], of that batch's machine only).
pub fn normalize_event_with<'e>(
    memo: &mut KeyMemo,
    base: &BaseLabels<'_>,
    event: &'e v1::Event,
    arrival_ns: i64,
    max_future_skew_ns: i64,
) -> Normalized<'e> {
    let Some(kind) = &event.kind else {
        return Normalized::NotCounter;
    };
    let ts_ms = ns_to_ms(event.event_time_unix_ns);
    if memo.pinned {
        debug_assert!(memo.is_of(base), "a batch's events are of its base labels");
    } else {
        memo.rebase(base);
    }
    let values = memo.spare_lists.pop().unwrap_or_default();
    let mut b = Builder {
        base,
        memo,
        values,
        slots: MemoSlots::default(),
        ts_ms,
        bad_label: false,
        refused_entries: Vec::new(),
        last_labels: LastLabels::default(),
    };
    // Deadline fields that become no series (an event that is not COMPLETION but carries both):
    // (part, total), still checked, since they contradict each other.
    let mut extra_pair: Option<(u64, u64)> = None;
    // A deadline event whose semantics lacks the fields it needs.
    let mut semantics_problem: Option<&'static str> = None;
    // The model the event is about, when it is about one.
    let mut about: Option<(Option<&str>, Option<&str>)> = None;
    let origin = match kind {
        event::Kind::DeadlineCounters(c) => {
            let (model, version) = model_labels(c.model.as_ref());
            about = Some((model, version));
            let loop_name =
                label_value(c.control_loop.as_ref().map_or("", |l| l.loop_name.as_str()));
            let labels = [
                (label::LOOP, loop_name),
                (label::MODEL, model),
                (label::MODEL_VERSION, version),
            ];
            // The fields of agents from before deadline semantics keep their meaning and their
            // names, whatever the event's semantics.
            b.push(metric::CONTROL_CYCLES, &labels, c.cycles as f64);
            b.push(metric::CONTROL_MISSED, &labels, c.misses as f64);
            b.push(metric::CONTROL_SKIPPED, &labels, c.skipped as f64);
            let recorded_and_skipped = c.cycles.saturating_add(c.skipped) as f64;
            match v1::DeadlineSemantics::try_from(c.semantics) {
                Ok(v1::DeadlineSemantics::Completion) => match (c.activations, c.deadline_misses) {
                    (Some(activations), Some(misses)) => {
                        b.push(metric::CONTROL_ACTIVATIONS, &labels, activations as f64);
                        b.push(metric::CONTROL_ACTIVATIONS_MISSED, &labels, misses as f64);
                        let overruns = c.overruns.unwrap_or(c.misses);
                        b.push(metric::CONTROL_OVERRUNS, &labels, overruns as f64);
                    }
                    _ => {
                        semantics_problem =
                            Some("completion semantics without activations or deadline_misses");
                    }
                },
                Ok(v1::DeadlineSemantics::LegacyProbe) => {
                    let activations = c.activations.map_or(recorded_and_skipped, |a| a as f64);
                    b.push(
                        metric::CONTROL_LEGACY_PROBE_ACTIVATIONS,
                        &labels,
                        activations,
                    );
                    extra_pair = c.activations.zip(c.deadline_misses).map(|(a, m)| (m, a));
                }
                // An unknown value (a later agent's) reads as the default, as every unknown enum
                // value does (docs/wire-protocol.md): only the fields whose meaning never
                // changes are read.
                Ok(v1::DeadlineSemantics::Unspecified) | Err(_) => {
                    b.push(
                        metric::CONTROL_LEGACY_AGENT_ACTIVATIONS,
                        &labels,
                        recorded_and_skipped,
                    );
                    extra_pair = c.activations.zip(c.deadline_misses).map(|(a, m)| (m, a));
                }
            }
            Origin::Start(c.start_time_unix_ns)
        }
        event::Kind::SafetyFallback(f) => {
            let (model, version) = model_labels(f.model.as_ref());
            about = Some((model, version));
            let loop_name =
                label_value(f.control_loop.as_ref().map_or("", |l| l.loop_name.as_str()));
            let labels = [
                (label::LOOP, loop_name),
                (label::MODEL, model),
                (label::MODEL_VERSION, version),
            ];
            b.push(metric::SAFETY_FALLBACKS, &labels, f.total as f64);
            Origin::Increment {
                total: f.total,
                increment: f.delta,
            }
        }
        event::Kind::Intervention(i) => {
            let (model, version) = model_labels(i.model.as_ref());
            about = Some((model, version));
            let labels = [
                (label::MODEL, model),
                (label::MODEL_VERSION, version),
                (label::SOURCE, source_label(i.source)),
            ];
            b.push(metric::INTERVENTIONS, &labels, i.total as f64);
            Origin::Increment {
                total: i.total,
                increment: i.delta,
            }
        }
        event::Kind::SafeStop(stop) => {
            let (model, version) = model_labels(stop.model.as_ref());
            about = Some((model, version));
            let labels = [
                (label::MODEL, model),
                (label::MODEL_VERSION, version),
                (label::SOURCE, source_label(stop.source)),
            ];
            b.push(metric::SAFE_STOPS, &labels, stop.total as f64);
            Origin::Increment {
                total: stop.total,
                increment: stop.delta,
            }
        }
        event::Kind::ThrottleCounters(t) => {
            let (model, version) = model_labels(t.model.as_ref());
            about = Some((model, version));
            let labels = [(label::MODEL, model), (label::MODEL_VERSION, version)];
            for c in &t.components {
                let component = (label::COMPONENT, component_label(c.component));
                b.push_entry(
                    metric::THROTTLE_SECONDS,
                    component,
                    &labels,
                    c.throttled_seconds,
                );
            }
            Origin::Start(t.start_time_unix_ns)
        }
        event::Kind::AutonomySeconds(a) => {
            let (model, version) = model_labels(a.model.as_ref());
            about = Some((model, version));
            let labels = [(label::MODEL, model), (label::MODEL_VERSION, version)];
            for m in &a.modes {
                let mode = (label::MODE, mode_label(m.mode));
                b.push_entry(metric::AUTONOMY_SECONDS, mode, &labels, m.seconds);
            }
            Origin::Start(a.start_time_unix_ns)
        }
        event::Kind::EnergyCounters(e) => {
            let (model, version) = model_labels(e.model.as_ref());
            about = Some((model, version));
            let labels = [(label::MODEL, model), (label::MODEL_VERSION, version)];
            for r in &e.rails {
                let rail = label_value(&r.rail).filter(|rail| *rail != value::UNKNOWN);
                b.push_entry(
                    metric::ENERGY_JOULES,
                    (label::RAIL, rail),
                    &labels,
                    r.joules,
                );
            }
            Origin::Start(e.start_time_unix_ns)
        }
        event::Kind::QueueLoss(q) => {
            let labels = [
                (label::CAUSE, cause_label(q.cause)),
                (label::TIER, tier_label(q.tier)),
            ];
            b.push(metric::QUEUE_LOST_RECORDS, &labels, q.total as f64);
            // Every cause counts records, a quarantine too (the records of the old store that
            // could not be salvaged; agents before that reported one per store, `count` 1).
            Origin::Increment {
                total: q.total,
                increment: q.count,
            }
        }
        event::Kind::AgentHealth(h) => {
            // The queue's backlog per tier as of the report, and the report's own time: gauges
            // for the fleet view. A tier this gateway does not know costs its entry alone.
            for t in &h.tiers {
                let tier = (label::TIER, tier_label(t.tier));
                b.push_entry(metric::QUEUE_BACKLOG_RECORDS, tier, &[], t.records as f64);
                b.push_entry(metric::QUEUE_BACKLOG_BYTES, tier, &[], t.bytes as f64);
            }
            b.push(metric::AGENT_HEALTH_TIMESTAMP, &[], ts_ms as f64 / 1000.0);
            Origin::Gauge
        }
        _ => return Normalized::NotCounter,
    };
    let refuse = |reason: &'static str, ts_ms: i64, detail: String, values: &[Sample]| {
        let mut series: Vec<String> = values.iter().map(|s| s.series.clone()).collect();
        series.extend(b.refused_entries.iter().cloned());
        series.dedup();
        Normalized::Refused(Refusal {
            reason,
            ts_ms,
            series,
            detail,
        })
    };
    let arrival_ms = ns_to_ms(arrival_ns);
    match event_time_ok(event.event_time_unix_ns, arrival_ns, max_future_skew_ns) {
        Ok(()) => {}
        Err(TimeProblem::Future) => {
            let ahead_s = event.event_time_unix_ns.saturating_sub(arrival_ns) / 1_000_000_000;
            let detail = format!("stamped {ahead_s} s after its arrival");
            return refuse(refusal::FUTURE_TIME, arrival_ms, detail, &b.values);
        }
        Err(TimeProblem::BeforeEpoch) => {
            let detail = "stamped at or before the Unix epoch".to_owned();
            return refuse(refusal::BAD_TIME, arrival_ms, detail, &b.values);
        }
    }
    if b.bad_label {
        let detail = "a label value is not an id, or an enum value is unknown".to_owned();
        return refuse(refusal::BAD_LABEL, ts_ms, detail, &b.values);
    }
    if let Some(detail) = semantics_problem {
        return refuse(refusal::BAD_VALUE, ts_ms, detail.to_owned(), &b.values);
    }
    if let Some(bad) = b
        .values
        .iter()
        .find(|s| !(s.value.is_finite() && s.value >= 0.0))
    {
        let detail = format!("{} is {}", split_key(&bad.series).0, bad.value);
        return refuse(refusal::BAD_VALUE, ts_ms, detail, &b.values);
    }
    if let Origin::Start(start_ns) = origin
        && start_ns > event.event_time_unix_ns
    {
        let detail = "the counters start after their own event".to_owned();
        return refuse(refusal::BAD_TIME, ts_ms, detail, &b.values);
    }
    if let Some((total_metric, part_metric, part, total)) = b.part_above_total() {
        let detail = format!("{part_metric} {part} above {total_metric} {total}");
        return refuse(refusal::BAD_OVER_TOTAL, ts_ms, detail, &b.values);
    }
    if let Some((part, total)) = extra_pair
        && part > total
    {
        let detail = format!("deadline_misses {part} above activations {total}");
        return refuse(refusal::BAD_OVER_TOTAL, ts_ms, detail, &b.values);
    }
    let mut samples = EventSamples::default();
    match origin {
        Origin::Increment { total, increment } => {
            if total == 0 || increment > total {
                let detail = format!("total {total} with an increment of {increment}");
                return refuse(refusal::INCREMENT_INCONSISTENT, ts_ms, detail, &b.values);
            }
            samples.baseline = Some(Baseline {
                ts_ms: ts_ms - 1,
                value: (total - increment) as f64,
            });
        }
        Origin::Gauge => {}
        Origin::Start(start_ns) => {
            let start_ms = ns_to_ms(start_ns);
            // A start at or before the epoch is no start: nothing is known of where the
            // counter stood before its first sample.
            if start_ms > 0 {
                samples.run_start_ms = Some(start_ms);
                samples.baseline = Some(Baseline {
                    ts_ms: start_ms.min(ts_ms - 1),
                    value: 0.0,
                });
            }
        }
    }
    samples.values = b.values;
    samples.slots = b.slots;
    samples.refused_entries = b.refused_entries;
    // Every label of an event that reached here is valid (a bad one refused it above).
    samples.model = about.map(|(model, version)| {
        (
            model.unwrap_or(value::UNKNOWN),
            version.unwrap_or(value::UNKNOWN),
        )
    });
    Normalized::Counted(samples)
}

/// Whether a safety event arriving at `arrival_ns` is fresh: `arrival − max(event_time, reconnect)
/// ≤ limit` (docs/series.md).
pub fn is_fresh(arrival_ns: i64, event_time_ns: i64, reconnect_ns: i64, limit_ns: i64) -> bool {
    arrival_ns.saturating_sub(event_time_ns.max(reconnect_ns)) <= limit_ns
}

#[cfg(test)]
mod tests {
    use super::*;
    use edgewatch_proto::v1::{
        AutonomySeconds, DeadlineCounters, Event, LoopRef, ModeSeconds, ModelVersion, Tier,
    };

    const ARRIVAL: i64 = 1_800_000_000_000_000_000;

    #[test]
    fn keys_remembered_across_events_and_machines_are_the_keys_built_afresh() {
        let time = ARRIVAL - 1_500_000_000;
        let mut other = batch();
        other.machine_id = "truck-18".into();
        let mut other_site = batch();
        other_site.site_id = "pit-4".into();
        let energy = |rails: &[&str]| {
            rails_event(
                &rails
                    .iter()
                    .map(|rail| (*rail).to_owned())
                    .collect::<Vec<_>>(),
            )
        };
        let events = [
            counters(time, "safety"),
            counters(time, "safety"),
            counters(time, "planner"),
            counters(time, "not an id"),
            energy(&["VDD_GPU_SOC", "VDD_CPU_CV"]),
            energy(&["VDD_CPU_CV", "not a rail", "VDD_GPU_SOC"]),
            counters(time, "safety"),
        ];
        let mut memo = KeyMemo::default();
        for batch in [batch(), other, batch(), other_site, batch()] {
            let base = BaseLabels::of(&batch).unwrap();
            for event in &events {
                let remembered = normalize_event_with(&mut memo, &base, event, ARRIVAL, 0);
                assert_eq!(
                    remembered,
                    normalize_event(&base, event, ARRIVAL, 0),
                    "{} {event:?}",
                    batch.machine_id
                );
                // Samples given back carry their keys to the next events of those keys.
                if let Normalized::Counted(samples) = remembered {
                    memo.recycle(samples.values, &samples.slots);
                }
            }
        }
    }

    /// An energy event with one value per rail (rail names are ids: each a series of its own).
    fn rails_event(rails: &[String]) -> Event {
        let time = ARRIVAL - 1_500_000_000;
        Event {
            seq: 3,
            event_time_unix_ns: time,
            monotonic_ns: 0,
            kind: Some(event::Kind::EnergyCounters(v1::EnergyCounters {
                start_time_unix_ns: time - 1_000,
                rails: rails
                    .iter()
                    .map(|rail| v1::RailEnergy {
                        rail: rail.clone(),
                        joules: 1.0,
                    })
                    .collect(),
                model: None,
            })),
        }
    }

    /// The values' keys of `event` normalized with `memo`, with the id each one's slot gives;
    /// the samples are given back to `memo` (with their keys, for the next events).
    fn keys_and_ids(
        memo: &mut KeyMemo,
        base: &BaseLabels<'_>,
        event: &Event,
    ) -> Vec<(String, Option<usize>, Option<u64>)> {
        match normalize_event_with(memo, base, event, ARRIVAL, 0) {
            Normalized::Counted(samples) => {
                let keys = samples
                    .values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let slot = samples.slots.get(i);
                        (v.series.clone(), slot, slot.and_then(|s| memo.id(s)))
                    })
                    .collect();
                memo.recycle(samples.values, &samples.slots);
                keys
            }
            other => panic!("not counted: {other:?}"),
        }
    }

    #[test]
    fn an_id_attached_to_a_key_is_found_by_the_slot_of_its_later_values_until_forgotten() {
        let batch = batch();
        let base = BaseLabels::of(&batch).unwrap();
        let mut memo = KeyMemo::default();
        let rails: Vec<String> = ["VDD_GPU_SOC", "VDD_CPU_CV"].map(String::from).into();
        let first = keys_and_ids(&mut memo, &base, &rails_event(&rails));
        for (n, (_, slot, id)) in first.iter().enumerate() {
            assert_eq!(*id, None);
            memo.set_id(slot.unwrap(), 100 + n as u64);
        }
        let again = keys_and_ids(&mut memo, &base, &rails_event(&rails));
        let ids: Vec<_> = again.iter().map(|(_, _, id)| *id).collect();
        assert_eq!(ids, [Some(100), Some(101)]);
        memo.forget_ids();
        let forgotten = keys_and_ids(&mut memo, &base, &rails_event(&rails));
        assert!(forgotten.iter().all(|(_, _, id)| id.is_none()));
    }

    #[test]
    fn a_slot_whose_entry_gave_way_to_another_key_gives_no_id_not_the_other_keys() {
        let batch = batch();
        let base = BaseLabels::of(&batch).unwrap();
        let mut memo = KeyMemo::default();
        // 31 keys, then a 32nd with an id: the memo is full.
        let many: Vec<String> = (0..KEY_MEMO_MAX - 1).map(|n| format!("rail_{n}")).collect();
        keys_and_ids(&mut memo, &base, &rails_event(&many));
        let x = keys_and_ids(&mut memo, &base, &rails_event(&["x".into()]));
        memo.set_id(x[0].1.unwrap(), 7);
        // `y` takes the last entry from `x`, then `z` from `y`, within one event.
        let yz = keys_and_ids(&mut memo, &base, &rails_event(&["y".into(), "z".into()]));
        assert_eq!(yz[0].1, None, "y's entry gave way to z: {yz:?}");
        assert_eq!(yz[1].1, x[0].1);
        assert_eq!(yz[1].2, None, "z is not x: {yz:?}");
    }

    use proptest::prelude::*;

    proptest::proptest! {
        /// The model: an id is what was attached to that very key since the last forget, and
        /// the keys are those built afresh, whichever machines came between.
        #[test]
        fn a_slot_gives_only_the_id_attached_to_its_own_key(
            actions in proptest::collection::vec(
                proptest::prop_oneof![
                    4 => (0usize..3, proptest::collection::vec(0usize..48, 1..20)).prop_map(Some),
                    1 => proptest::strategy::Just(None),
                ],
                1..40,
            ),
        ) {
            let batches: Vec<Batch> = (0..3)
                .map(|m| Batch { machine_id: format!("truck-{m}"), ..batch() })
                .collect();
            let mut memo = KeyMemo::default();
            let mut model: std::collections::HashMap<String, u64> = Default::default();
            let mut next_id = 1;
            for action in actions {
                let Some((machine, rails)) = action else {
                    memo.forget_ids();
                    model.clear();
                    continue;
                };
                let rails: Vec<String> = rails.iter().map(|n| format!("rail_{n}")).collect();
                let base = BaseLabels::of(&batches[machine]).unwrap();
                let values = keys_and_ids(&mut memo, &base, &rails_event(&rails));
                let afresh = keys_and_ids(&mut KeyMemo::default(), &base, &rails_event(&rails));
                let keys = |values: &[(String, Option<usize>, Option<u64>)]| {
                    values.iter().map(|(key, _, _)| key.clone()).collect::<Vec<_>>()
                };
                prop_assert_eq!(keys(&values), keys(&afresh));
                for (i, (key, slot, id)) in values.iter().enumerate() {
                    if let Some(id) = id {
                        prop_assert_eq!(model.get(key), Some(id), "value {} of {:?}", i, values);
                    }
                    prop_assert!(i < SLOTS_MAX || slot.is_none(), "value {} has a slot", i);
                }
                for (key, slot, _) in &values {
                    if let Some(slot) = slot {
                        let id = *model.entry(key.clone()).or_insert_with(|| { next_id += 1; next_id });
                        memo.set_id(*slot, id);
                    }
                }
            }
        }
    }

    #[test]
    fn the_labels_of_a_key_for_its_metric_are_what_splitting_the_key_gives() {
        for key in ["a{x=\"1\"}", "ab{}", "a{b=\"{\"}", "abc{x=\"a{\"}"] {
            let (metric, labels) = split_key(key);
            assert_eq!(key_labels(key, metric), Some(labels), "{key}");
            for other in ["a", "ab", "b", "abc", ""] {
                let expected = (other == metric).then_some(labels);
                assert_eq!(key_labels(key, other), expected, "{key} as {other}");
            }
        }
    }

    fn batch() -> Batch {
        Batch {
            schema_version: 1,
            machine_id: "truck-17".into(),
            site_id: "pit-3".into(),
            agent_epoch: 7,
            tier: Tier::Slo as i32,
            first_seq: 1,
            last_seq: 1,
            sent_time_unix_ns: ARRIVAL,
            events: vec![],
            machine_class: "haul-truck".into(),
            agent_version: "0.1.0".into(),
        }
    }

    fn counters(time: i64, loop_name: &str) -> Event {
        Event {
            seq: 1,
            event_time_unix_ns: time,
            monotonic_ns: 0,
            kind: Some(event::Kind::DeadlineCounters(DeadlineCounters {
                control_loop: Some(LoopRef {
                    loop_id: 1,
                    loop_name: loop_name.into(),
                }),
                model: Some(ModelVersion {
                    name: "haul-perception".into(),
                    version: "4.2.1".into(),
                    ..Default::default()
                }),
                cycles: 90_000,
                misses: 3,
                skipped: 1,
                ..Default::default()
            })),
        }
    }

    fn counted(event: &Event, arrival: i64, skew: i64) -> EventSamples<'_> {
        let batch = batch();
        match normalize_event(&BaseLabels::of(&batch).unwrap(), event, arrival, skew) {
            Normalized::Counted(samples) => samples,
            other => panic!("not counted: {other:?}"),
        }
    }

    fn refused(event: &Event, arrival: i64, skew: i64) -> Refusal {
        let batch = batch();
        match normalize_event(&BaseLabels::of(&batch).unwrap(), event, arrival, skew) {
            Normalized::Refused(refusal) => refusal,
            other => panic!("not refused: {other:?}"),
        }
    }

    fn with_counts(mut event: Event, cycles: u64, misses: u64) -> Event {
        if let Some(event::Kind::DeadlineCounters(c)) = &mut event.kind {
            c.cycles = cycles;
            c.misses = misses;
        }
        event
    }

    #[test]
    fn deadline_counters_of_an_agent_before_deadlines_become_their_old_series_and_its_activations()
    {
        let time = ARRIVAL - 1_500_000_000;
        let event = counters(time, "planner");
        let samples = counted(&event, ARRIVAL, 0);
        let out = &samples.values;
        assert_eq!(out.len(), 4);
        assert_eq!(
            out[0].series,
            "edge_control_cycles_total{loop=\"planner\",machine_class=\"haul-truck\",machine_id=\"truck-17\",model=\"haul-perception\",model_version=\"4.2.1\",site=\"pit-3\"}"
        );
        assert_eq!(out[0].ts_ms, time / 1_000_000);
        assert_eq!(out[0].value, 90_000.0);
        assert_eq!(out[1].value, 3.0);
        // Judged against no deadline: recorded + skipped, under a name that says why.
        assert_eq!(
            split_key(&out[3].series).0,
            metric::CONTROL_LEGACY_AGENT_ACTIVATIONS
        );
        assert_eq!(split_key(&out[3].series).1, split_key(&out[0].series).1);
        assert_eq!(out[3].value, 90_001.0);
    }

    /// `counters` with deadline semantics `semantics` and the new fields set.
    fn with_semantics(
        mut event: Event,
        semantics: v1::DeadlineSemantics,
        activations: Option<u64>,
        deadline_misses: Option<u64>,
    ) -> Event {
        if let Some(event::Kind::DeadlineCounters(c)) = &mut event.kind {
            c.semantics = semantics as i32;
            c.activations = activations;
            c.deadline_misses = deadline_misses;
            c.overruns = Some(c.misses);
        }
        event
    }

    fn metrics_of<'a>(samples: &'a EventSamples<'_>) -> Vec<(&'a str, f64)> {
        samples
            .values
            .iter()
            .map(|s| (split_key(&s.series).0, s.value))
            .collect()
    }

    #[test]
    fn deadline_counters_travel_under_the_names_of_their_semantics() {
        use v1::DeadlineSemantics::{Completion, LegacyProbe};
        let event = counters(ARRIVAL, "planner");
        // Completion: the old fields keep their names and meaning; the new ones get their own.
        let completion = with_semantics(event.clone(), Completion, Some(90_001), Some(7));
        assert_eq!(
            metrics_of(&counted(&completion, ARRIVAL, 0)),
            vec![
                (metric::CONTROL_CYCLES, 90_000.0),
                (metric::CONTROL_MISSED, 3.0),
                (metric::CONTROL_SKIPPED, 1.0),
                (metric::CONTROL_ACTIVATIONS, 90_001.0),
                (metric::CONTROL_ACTIVATIONS_MISSED, 7.0),
                (metric::CONTROL_OVERRUNS, 3.0),
            ]
        );
        // An ABI 1 probe: no deadline misses; its activations say so by their name.
        let probe = with_semantics(event.clone(), LegacyProbe, Some(90_001), None);
        assert_eq!(
            metrics_of(&counted(&probe, ARRIVAL, 0))[3..],
            [(metric::CONTROL_LEGACY_PROBE_ACTIVATIONS, 90_001.0)]
        );
        // A later agent's semantics reads as the default: only the fields whose meaning never
        // changes.
        let mut later = completion.clone();
        if let Some(event::Kind::DeadlineCounters(c)) = &mut later.kind {
            c.semantics = 7;
        }
        assert_eq!(
            metrics_of(&counted(&later, ARRIVAL, 0))[3..],
            [(metric::CONTROL_LEGACY_AGENT_ACTIVATIONS, 90_001.0)]
        );
        // Completion semantics without its counts cannot be counted.
        let empty = with_semantics(event, Completion, Some(90_001), None);
        let r = refused(&empty, ARRIVAL, 0);
        assert_eq!(r.reason, refusal::BAD_VALUE);
        assert_eq!(r.series.len(), 3, "{r:?}");
    }

    #[test]
    fn every_counter_starts_from_a_zero_at_its_start_time() {
        let time = ARRIVAL - 1_500_000_000;
        let mut event = counters(time, "planner");
        if let Some(event::Kind::DeadlineCounters(c)) = &mut event.kind {
            c.start_time_unix_ns = time - 60_000_000_000;
        }
        let samples = counted(&event, ARRIVAL, 0);
        assert_eq!(
            samples.run_start_ms,
            Some((time - 60_000_000_000) / 1_000_000)
        );
        let baseline = samples.baseline.unwrap();
        assert_eq!(baseline.ts_ms, samples.run_start_ms.unwrap());
        assert_eq!(baseline.value, 0.0);
        // Started in the event's own millisecond: the zero goes one millisecond before it.
        if let Some(event::Kind::DeadlineCounters(c)) = &mut event.kind {
            c.start_time_unix_ns = time;
        }
        assert_eq!(
            counted(&event, ARRIVAL, 0).baseline.unwrap().ts_ms,
            time / 1_000_000 - 1
        );
        // No start: nothing is known of where the counter stood.
        if let Some(event::Kind::DeadlineCounters(c)) = &mut event.kind {
            c.start_time_unix_ns = 0;
        }
        assert!(counted(&event, ARRIVAL, 0).baseline.is_none());
    }

    #[test]
    fn an_increment_event_starts_from_its_total_before_the_increment() {
        let event = Event {
            seq: 1,
            event_time_unix_ns: ARRIVAL,
            monotonic_ns: 0,
            kind: Some(event::Kind::SafetyFallback(v1::SafetyFallback {
                total: 7,
                delta: 2,
                ..Default::default()
            })),
        };
        let samples = counted(&event, ARRIVAL, 0);
        assert_eq!(samples.values[0].value, 7.0);
        assert_eq!(samples.baseline.unwrap().value, 5.0);
        assert_eq!(samples.baseline.unwrap().ts_ms, samples.values[0].ts_ms - 1);
        assert_eq!(samples.run_start_ms, None);
        // A total that cannot hold its increment, or none at all (an individually submitted
        // event), cannot be placed in a cumulative series.
        for (total, delta) in [(1, 2), (0, 1), (0, 0)] {
            let event = Event {
                kind: Some(event::Kind::Intervention(v1::Intervention {
                    total,
                    delta,
                    ..Default::default()
                })),
                ..event.clone()
            };
            assert_eq!(
                refused(&event, ARRIVAL, 0).reason,
                refusal::INCREMENT_INCONSISTENT
            );
        }
    }

    #[test]
    fn interventions_of_the_probe_and_of_the_socket_are_separate_series() {
        let intervention = |total, source: v1::EventSource| Event {
            seq: 1,
            event_time_unix_ns: ARRIVAL,
            monotonic_ns: 0,
            kind: Some(event::Kind::Intervention(v1::Intervention {
                total,
                delta: 1,
                source: source as i32,
                ..Default::default()
            })),
        };
        let sources: Vec<(&str, f64)> = [
            (2, v1::EventSource::Probe),
            (5, v1::EventSource::Local),
            // An agent from before sources: only its probe filled a total.
            (3, v1::EventSource::Unspecified),
        ]
        .into_iter()
        .map(|(total, source)| {
            let sample = counted(&intervention(total, source), ARRIVAL, 0).values[0].clone();
            let source = if sample.series.contains("source=\"local\"") {
                "local"
            } else if sample.series.contains("source=\"probe\"") {
                "probe"
            } else {
                "none"
            };
            (source, sample.value)
        })
        .collect();
        assert_eq!(sources, [("probe", 2.0), ("local", 5.0), ("probe", 3.0)]);
        // A socket submission of an agent from before sources carries no total: refused (and
        // shown as a refusal), never stored as a zero among the probe's totals.
        assert_eq!(
            refused(&intervention(0, v1::EventSource::Unspecified), ARRIVAL, 0).reason,
            refusal::INCREMENT_INCONSISTENT
        );
    }

    #[test]
    fn both_counters_of_every_slo_pair_come_from_one_event() {
        // Machine pairs come from one event, so admitting an event whole admits both; the
        // gateway's own pair (freshness) is written in one step by the ingest path.
        let event = with_semantics(
            counters(ARRIVAL, "planner"),
            v1::DeadlineSemantics::Completion,
            Some(90_001),
            Some(7),
        );
        let samples = counted(&event, ARRIVAL, 0);
        let metrics: Vec<&str> = samples
            .values
            .iter()
            .map(|s| split_key(&s.series).0)
            .collect();
        for (total, part) in SLO_PAIRS {
            if total.starts_with(metric::GATEWAY_PREFIX) {
                continue;
            }
            assert!(
                metrics.contains(&total) && metrics.contains(&part),
                "{total}, {part}"
            );
        }
    }

    #[test]
    fn more_misses_than_cycles_refuses_the_whole_event() {
        let event = with_counts(counters(ARRIVAL, "planner"), 100, 101);
        let r = refused(&event, ARRIVAL, 0);
        assert_eq!(r.reason, refusal::BAD_OVER_TOTAL);
        assert_eq!(r.ts_ms, ARRIVAL / 1_000_000);
        assert_eq!(
            r.series.len(),
            4,
            "cycles, misses, skipped and the activations"
        );
        assert!(r.series[1].starts_with(metric::CONTROL_MISSED));
        // Equal is possible: every cycle missed.
        counted(
            &with_counts(counters(ARRIVAL, "planner"), 100, 100),
            ARRIVAL,
            0,
        );
        // The deadline fields are checked too: as series (completion semantics), and where
        // they become none.
        for semantics in [
            v1::DeadlineSemantics::Completion,
            v1::DeadlineSemantics::Unspecified,
        ] {
            let event = with_semantics(counters(ARRIVAL, "planner"), semantics, Some(10), Some(11));
            let r = refused(&event, ARRIVAL, 0);
            assert_eq!(r.reason, refusal::BAD_OVER_TOTAL, "{semantics:?}");
            assert!(r.detail.contains("11 above"), "{}", r.detail);
        }
    }

    #[test]
    fn a_part_above_its_total_is_refused_alike_whether_the_memo_knew_its_keys_or_gave_them_up() {
        let batch = batch();
        let base = BaseLabels::of(&batch).unwrap();
        let events = [
            with_counts(counters(ARRIVAL, "planner"), 100, 101),
            with_counts(counters(ARRIVAL, "planner"), 100, 100),
            with_semantics(
                counters(ARRIVAL, "planner"),
                v1::DeadlineSemantics::Completion,
                Some(10),
                Some(11),
            ),
            with_semantics(
                counters(ARRIVAL, "planner"),
                v1::DeadlineSemantics::Completion,
                Some(11),
                Some(11),
            ),
        ];
        // A memo that has seen the events' keys, and one full of a machine's other keys, so
        // that each new key of an event makes the one before it give way.
        let mut warm = KeyMemo::default();
        for event in &events {
            normalize_event_with(&mut warm, &base, event, ARRIVAL, 0);
        }
        let rails: Vec<String> = (0..KEY_MEMO_MAX).map(|i| format!("rail-{i}")).collect();
        let filler = rails_event(&rails);
        for event in &events {
            let fresh = normalize_event(&base, event, ARRIVAL, 0);
            let mut full = KeyMemo::default();
            normalize_event_with(&mut full, &base, &filler, ARRIVAL, 0);
            assert_eq!(full.entries.len(), KEY_MEMO_MAX);
            for memo in [&mut warm, &mut full] {
                let again = normalize_event_with(memo, &base, event, ARRIVAL, 0);
                assert_eq!(again, fresh);
            }
            match fresh {
                Normalized::Refused(r) => assert_eq!(r.reason, refusal::BAD_OVER_TOTAL),
                Normalized::Counted(_) => {}
                Normalized::NotCounter => panic!("a counter event"),
            }
        }
    }

    #[test]
    fn bad_times_and_free_text_labels_refuse_the_event_with_what_is_known_of_it() {
        let future = refused(
            &counters(ARRIVAL + 10_000_000_000, "planner"),
            ARRIVAL,
            5_000_000_000,
        );
        assert_eq!(future.reason, refusal::FUTURE_TIME);
        assert_eq!(future.ts_ms, ARRIVAL / 1_000_000, "stamped at arrival");
        let text = refused(&counters(ARRIVAL, "a loop with spaces"), ARRIVAL, 0);
        assert_eq!(text.reason, refusal::BAD_LABEL);
        assert!(
            text.series[0].contains("loop=\"unknown\""),
            "the invalid label is unknown: {}",
            text.series[0]
        );
        assert!(text.series[0].contains("model_version=\"4.2.1\""));
        assert_eq!(
            refused(&counters(0, "planner"), ARRIVAL, 0).reason,
            refusal::BAD_TIME
        );
        let mut late_start = counters(ARRIVAL - 1_000_000_000, "planner");
        if let Some(event::Kind::DeadlineCounters(c)) = &mut late_start.kind {
            c.start_time_unix_ns = ARRIVAL;
        }
        assert_eq!(refused(&late_start, ARRIVAL, 0).reason, refusal::BAD_TIME);
    }

    #[test]
    fn an_unknown_mode_is_refused_alone_and_a_nan_value_refuses_the_event_whole() {
        let event = |modes: Vec<ModeSeconds>| Event {
            seq: 2,
            event_time_unix_ns: ARRIVAL,
            monotonic_ns: 0,
            kind: Some(event::Kind::AutonomySeconds(AutonomySeconds {
                start_time_unix_ns: 1,
                modes,
                model: None,
            })),
        };
        let autonomous = ModeSeconds {
            mode: 1,
            seconds: 3600.0,
        };
        let one = event(vec![autonomous]);
        let ok = counted(&one, ARRIVAL, 0);
        assert!(ok.values[0].series.contains("mode=\"autonomous\""));
        assert!(ok.values[0].series.contains("model=\"unknown\""));
        let unknown_mode = ModeSeconds {
            mode: 0,
            seconds: 1.0,
        };
        let nan = ModeSeconds {
            mode: 2,
            seconds: f64::NAN,
        };
        // A mode this gateway does not know (a later agent's) costs that entry, not the others.
        let two = event(vec![autonomous, unknown_mode]);
        let partial = counted(&two, ARRIVAL, 0);
        assert_eq!(partial.values.len(), 1);
        assert_eq!(partial.refused_entries.len(), 1);
        assert!(partial.refused_entries[0].contains("mode=\"unknown\""));
        let r = refused(&event(vec![autonomous, nan, unknown_mode]), ARRIVAL, 0);
        assert_eq!(r.reason, refusal::BAD_VALUE);
        assert_eq!(r.series.len(), 3, "the refused entry among them");
    }

    /// A quarantine's report counts the records the machine lost in it, as every other loss
    /// report does: the series rises by them, from the total before it.
    #[test]
    fn a_quarantine_report_raises_the_lost_records_series_by_the_records_it_lost() {
        let loss = |cause: v1::LossCause, count: u64, total: u64| Event {
            seq: 1,
            event_time_unix_ns: ARRIVAL - 1_000_000_000,
            monotonic_ns: 0,
            kind: Some(event::Kind::QueueLoss(v1::QueueLoss {
                tier: Tier::Slo as i32,
                cause: cause as i32,
                count,
                total,
                epoch: 41,
                ..Default::default()
            })),
        };
        for cause in [v1::LossCause::Quarantined, v1::LossCause::Evicted] {
            let event = loss(cause, 11, 30);
            let samples = counted(&event, ARRIVAL, 0);
            assert_eq!(samples.values.len(), 1);
            assert_eq!(samples.values[0].value, 30.0);
            assert_eq!(
                samples.baseline.map(|b| b.value),
                Some(19.0),
                "{cause:?}: the total before the report"
            );
        }
    }

    #[test]
    fn a_health_report_becomes_the_backlog_per_tier_and_its_own_time_as_gauges() {
        let tier = |tier: Tier, records, bytes| v1::TierHealth {
            tier: tier as i32,
            records,
            bytes,
            ..Default::default()
        };
        let time = ARRIVAL - 90_000_000_123;
        let event = Event {
            seq: 3,
            event_time_unix_ns: time,
            monotonic_ns: 0,
            kind: Some(event::Kind::AgentHealth(v1::AgentHealth {
                tiers: vec![
                    tier(Tier::Safety, 0, 0),
                    tier(Tier::Slo, 12, 4_096),
                    tier(Tier::Debug, 7_000, 9_000_000),
                    // A tier this gateway does not know: that entry alone is refused.
                    tier(Tier::Unspecified, 1, 1),
                ],
                ..Default::default()
            })),
        };
        let samples = counted(&event, ARRIVAL, 0);
        let got: Vec<(String, f64)> = samples
            .values
            .iter()
            .map(|s| (s.series.clone(), s.value))
            .collect();
        let batch = batch();
        let base = BaseLabels::of(&batch).unwrap();
        let key = |metric: &str, tier: Option<&str>| match tier {
            Some(tier) => base.key(metric, &[(label::TIER, tier)]),
            None => base.key(metric, &[]),
        };
        let ms = time.div_euclid(1_000_000);
        assert_eq!(
            got,
            vec![
                (key(metric::QUEUE_BACKLOG_RECORDS, Some("safety")), 0.0),
                (key(metric::QUEUE_BACKLOG_BYTES, Some("safety")), 0.0),
                (key(metric::QUEUE_BACKLOG_RECORDS, Some("slo")), 12.0),
                (key(metric::QUEUE_BACKLOG_BYTES, Some("slo")), 4_096.0),
                (key(metric::QUEUE_BACKLOG_RECORDS, Some("debug")), 7_000.0),
                (key(metric::QUEUE_BACKLOG_BYTES, Some("debug")), 9_000_000.0),
                (
                    key(metric::AGENT_HEALTH_TIMESTAMP, None),
                    ms as f64 / 1000.0
                ),
            ]
        );
        assert!(samples.values.iter().all(|s| s.ts_ms == ms));
        // The report's time, read back from its value, is exactly its timestamp.
        assert_eq!((got[6].1 * 1000.0).round() as i64, ms);
        assert_eq!(samples.refused_entries.len(), 2);
        assert!(samples.refused_entries[0].contains("tier=\"unknown\""));
        // Gauges: no baseline, no run, and no model.
        assert_eq!(
            (samples.baseline, samples.run_start_ms, samples.model),
            (None, None, None)
        );
    }

    #[test]
    fn an_event_about_a_model_names_its_model_and_version() {
        let event = counters(ARRIVAL, "planner");
        let samples = counted(&event, ARRIVAL, 0);
        assert_eq!(samples.model, Some(("haul-perception", "4.2.1")));
        let mut anonymous = counters(ARRIVAL, "planner");
        if let Some(event::Kind::DeadlineCounters(c)) = &mut anonymous.kind {
            c.model = None;
        }
        assert_eq!(
            counted(&anonymous, ARRIVAL, 0).model,
            Some(("unknown", "unknown"))
        );
    }

    #[test]
    fn series_keys_parse_back_to_their_labels() {
        let key = SeriesKey::build("m", &mut [("b", "x\"y"), ("a", "1\\2")]);
        assert_eq!(key, "m{a=\"1\\\\2\",b=\"x\\\"y\"}");
        let (metric, labels) = SeriesKey::parse(&key).unwrap();
        assert_eq!(metric, "m");
        assert_eq!(
            labels,
            vec![("a".into(), "1\\2".into()), ("b".into(), "x\"y".into())]
        );
        assert_eq!(SeriesKey::metric(&key), "m");
    }

    #[test]
    fn freshness_counts_from_the_later_of_event_time_and_reconnect() {
        let hour = 3_600_000_000_000i64;
        // Happened 3 days ago, machine reconnected an hour ago: fresh.
        assert!(is_fresh(100 * hour, 28 * hour, 99 * hour, 24 * hour));
        // Machine reconnected 25 h ago and the event only arrives now: stale.
        assert!(!is_fresh(100 * hour, 28 * hour, 75 * hour, 24 * hour));
    }
}

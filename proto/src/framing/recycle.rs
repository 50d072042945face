//! Decoding into the batch decoded before: the same value as `Batch::decode`, with the strings
//! and lists of the previous batch's events written over in place rather than allocated again.
//!
//! ```text
//! Batch (the one before) ── its fields cleared; its events left in place, stale
//! bytes ── merge ──► event i decoded over stale event i: its fields reset, its deadline or
//!                    energy counters (same kind) reset in place, their loop, model and rails
//!                    cleared where the new event has them and taken away where it has not;
//!                    anything else (another kind, events past the old count) from Spare or new
//! Spare ◄── what the new batch does not use: the events past its count, kinds replaced
//! ```
//!
//! Invariants:
//! - For any bytes, [`merge_batch`] into any batch it decoded before (or any batch) gives what
//!   `Batch::decode` gives: the same value, or an error with the same message. Every field not
//!   handled here goes to the generated `merge_field` of the same message; every message
//!   handled here is merged by `prost::encoding::message::merge`, so wire-type checks and the
//!   recursion limit are prost's own. A stale field is never seen: each is reset before the
//!   first field of its message is merged into it, or taken away when the message ends without
//!   it; an item taken from [`Spare`] equals its `Default`.
//! - [`Spare`] holds at most [`SPARE_MAX`] items of each kind: a decoder keeps about one batch's
//!   allocations between calls, never more.

use prost::Message;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, check_wire_type};

use crate::v1::{
    Batch, DeadlineCounters, EnergyCounters, Event, LoopRef, ModelVersion, RailEnergy, event,
};

/// Most items of each kind a [`Spare`] keeps (a batch's worth of events; a larger batch's
/// surplus is freed).
const SPARE_MAX: usize = 1024;

/// `Batch.events`.
const BATCH_EVENTS: u32 = 9;
/// The last of `Event`'s fields before its `kind` (`seq`, `event_time_unix_ns`, `monotonic_ns`).
const EVENT_LAST_SCALAR: u32 = 3;
/// `Event.deadline_counters` (in `kind`).
const EVENT_DEADLINE_COUNTERS: u32 = 10;
/// `Event.energy_counters` (in `kind`).
const EVENT_ENERGY_COUNTERS: u32 = 19;
/// `DeadlineCounters.control_loop`.
const DEADLINE_CONTROL_LOOP: u32 = 1;
/// `DeadlineCounters.model`.
const DEADLINE_MODEL: u32 = 2;
/// `EnergyCounters.rails`.
const ENERGY_RAILS: u32 = 2;
/// `EnergyCounters.model`.
const ENERGY_MODEL: u32 = 3;

/// Emptied messages of batches decoded before, to decode the next into. Each equals its
/// `Default` (strings and lists empty, with their capacity).
#[derive(Debug, Default)]
pub(super) struct Spare {
    events: Vec<Event>,
    deadline: Vec<DeadlineCounters>,
    energy: Vec<EnergyCounters>,
    loops: Vec<LoopRef>,
    models: Vec<ModelVersion>,
    rails: Vec<RailEnergy>,
}

/// Keeps `item` (already emptied) unless `list` is full.
fn keep<T>(list: &mut Vec<T>, item: T) {
    if list.len() < SPARE_MAX {
        list.push(item);
    }
}

impl Spare {
    fn recycle_event(&mut self, mut event: Event) {
        if let Some(kind) = event.kind.take() {
            self.recycle_kind(kind);
        }
        event.clear();
        keep(&mut self.events, event);
    }

    fn recycle_kind(&mut self, kind: event::Kind) {
        match kind {
            event::Kind::DeadlineCounters(mut counters) => {
                if let Some(control_loop) = counters.control_loop.take() {
                    self.recycle_loop(control_loop);
                }
                if let Some(model) = counters.model.take() {
                    self.recycle_model(model);
                }
                counters.clear();
                keep(&mut self.deadline, counters);
            }
            event::Kind::EnergyCounters(mut counters) => {
                for rail in counters.rails.drain(..) {
                    self.recycle_rail(rail);
                }
                if let Some(model) = counters.model.take() {
                    self.recycle_model(model);
                }
                counters.clear();
                keep(&mut self.energy, counters);
            }
            // Other kinds are rare on the SLO tier's steady stream: freed.
            _ => {}
        }
    }

    fn recycle_loop(&mut self, mut control_loop: LoopRef) {
        control_loop.clear();
        keep(&mut self.loops, control_loop);
    }

    fn recycle_model(&mut self, mut model: ModelVersion) {
        model.clear();
        keep(&mut self.models, model);
    }

    /// A counters message ended with its model still the stale event's (`stale`): the model is
    /// taken away, kept as a spare.
    fn recycle_stale_model(&mut self, stale: bool, model: &mut Option<ModelVersion>) {
        if stale && let Some(model) = model.take() {
            self.recycle_model(model);
        }
    }

    fn recycle_rail(&mut self, mut rail: RailEnergy) {
        rail.clear();
        keep(&mut self.rails, rail);
    }
}

/// Decodes `bytes` into `batch`, over what `batch` held (see the module invariants). After an
/// error `batch` holds nothing of use (the next call still decodes over it correctly).
pub(super) fn merge_batch(
    batch: &mut Batch,
    spare: &mut Spare,
    bytes: &[u8],
) -> Result<(), prost::DecodeError> {
    let events = std::mem::take(&mut batch.events);
    batch.clear();
    batch.events = events;
    let mut recycled = RecycledBatch {
        msg: batch,
        spare,
        used: 0,
    };
    // `Message::merge` of the wrapper: the loop `Batch::decode` runs, with a fresh context.
    recycled.merge(bytes)?;
    let RecycledBatch { msg, spare, used } = recycled;
    for event in msg.events.drain(used..) {
        spare.recycle_event(event);
    }
    Ok(())
}

/// Merges one length-delimited message into `msg` with prost's checks (wire type, recursion
/// limit), pushing `context` on an error as the generated code does.
fn merge_message<M>(
    wire_type: WireType,
    msg: &mut M,
    buf: &mut impl Buf,
    ctx: DecodeContext,
    context: (&'static str, &'static str),
) -> Result<(), prost::DecodeError>
where
    M: Message,
{
    prost::encoding::message::merge(wire_type, msg, buf, ctx).map_err(|mut error| {
        error.push(context.0, context.1);
        error
    })
}

/// Merges a counters message's `model` field: over the stale event's model, cleared first
/// (once: `stale` is reset), else into a spare one or a new one.
fn merge_model(
    model: &mut Option<ModelVersion>,
    stale: &mut bool,
    spare: &mut Spare,
    (wire_type, buf, ctx): (WireType, &mut impl Buf, DecodeContext),
    context: (&'static str, &'static str),
) -> Result<(), prost::DecodeError> {
    if std::mem::take(stale)
        && let Some(model) = model
    {
        model.clear();
    }
    let model = model.get_or_insert_with(|| spare.models.pop().unwrap_or_default());
    merge_message(wire_type, model, buf, ctx, context)
}

/// A wrapper decodes into the message it wraps: its `merge_field` is below; it encodes,
/// measures and clears that message (it is only ever decoded into).
macro_rules! wrapped_message {
    ($wrapper:ident, |$this:ident, $tag:ident, $wire_type:ident, $buf:ident, $ctx:ident| $merge:block) => {
        impl Message for $wrapper<'_> {
            fn encode_raw(&self, buf: &mut impl BufMut) {
                self.msg.encode_raw(buf);
            }

            fn merge_field(
                &mut self,
                $tag: u32,
                $wire_type: WireType,
                $buf: &mut impl Buf,
                $ctx: DecodeContext,
            ) -> Result<(), prost::DecodeError> {
                let $this = self;
                $merge
            }

            fn encoded_len(&self) -> usize {
                self.msg.encoded_len()
            }

            fn clear(&mut self) {
                self.msg.clear();
            }
        }
    };
}

/// A batch being decoded: `msg.events[..used]` are this decode's, the rest stale.
#[derive(Debug)]
struct RecycledBatch<'a> {
    msg: &'a mut Batch,
    spare: &'a mut Spare,
    used: usize,
}

wrapped_message!(RecycledBatch, |this, tag, wire_type, buf, ctx| {
    if tag != BATCH_EVENTS {
        return this.msg.merge_field(tag, wire_type, buf, ctx);
    }
    // `message::merge_repeated`, over a stale event or a spare one.
    let result = check_wire_type(WireType::LengthDelimited, wire_type).and_then(|()| {
        let stale = this.used < this.msg.events.len();
        if !stale {
            let event = this.spare.events.pop().unwrap_or_default();
            this.msg.events.push(event);
        }
        let event = &mut this.msg.events[this.used];
        this.used += 1;
        let mut recycled = RecycledEvent::new(event, &mut *this.spare, stale);
        prost::encoding::message::merge(WireType::LengthDelimited, &mut recycled, buf, ctx)?;
        recycled.finish();
        Ok(())
    });
    result.map_err(|mut error| {
        error.push("Batch", "events");
        error
    })
});

/// An event being decoded; `kind_stale` while its `kind` is the stale event's, not yet reset.
#[derive(Debug)]
struct RecycledEvent<'a> {
    msg: &'a mut Event,
    spare: &'a mut Spare,
    kind_stale: bool,
}

impl<'a> RecycledEvent<'a> {
    fn new(msg: &'a mut Event, spare: &'a mut Spare, stale: bool) -> Self {
        if stale {
            // Every field: a field added to `Event` fails to compile here until it is reset.
            let Event {
                seq,
                event_time_unix_ns,
                monotonic_ns,
                kind: _,
            } = msg;
            *seq = 0;
            *event_time_unix_ns = 0;
            *monotonic_ns = 0;
        }
        let kind_stale = stale && msg.kind.is_some();
        Self {
            msg,
            spare,
            kind_stale,
        }
    }

    /// The event ended: a stale `kind` the bytes did not write over is taken away.
    fn finish(self) {
        if self.kind_stale
            && let Some(kind) = self.msg.kind.take()
        {
            self.spare.recycle_kind(kind);
        }
    }
}

wrapped_message!(RecycledEvent, |this, tag, wire_type, buf, ctx| {
    // The first field past the scalars settles a stale `kind`: deadline or energy counters
    // written over by the same kind are reset in place; anything else is taken away.
    let mut reset_in_place = false;
    if tag > EVENT_LAST_SCALAR && this.kind_stale {
        this.kind_stale = false;
        reset_in_place = matches!(
            (tag, &this.msg.kind),
            (
                EVENT_DEADLINE_COUNTERS,
                Some(event::Kind::DeadlineCounters(_))
            ) | (EVENT_ENERGY_COUNTERS, Some(event::Kind::EnergyCounters(_)))
        );
        if !reset_in_place && let Some(kind) = this.msg.kind.take() {
            this.spare.recycle_kind(kind);
        }
    }
    // The oneof `kind`: merged into the variant it holds, else into a new one that replaces it.
    match (tag, &mut this.msg.kind) {
        (EVENT_DEADLINE_COUNTERS, Some(event::Kind::DeadlineCounters(counters))) => {
            let mut recycled = RecycledDeadline::new(counters, &mut *this.spare, reset_in_place);
            merge_message(wire_type, &mut recycled, buf, ctx, ("Event", "kind"))?;
            recycled.finish();
            Ok(())
        }
        (EVENT_DEADLINE_COUNTERS, _) => {
            let mut counters = this.spare.deadline.pop().unwrap_or_default();
            let mut recycled = RecycledDeadline::new(&mut counters, &mut *this.spare, false);
            merge_message(wire_type, &mut recycled, buf, ctx, ("Event", "kind"))?;
            recycled.finish();
            let old = this
                .msg
                .kind
                .replace(event::Kind::DeadlineCounters(counters));
            if let Some(old) = old {
                this.spare.recycle_kind(old);
            }
            Ok(())
        }
        (EVENT_ENERGY_COUNTERS, Some(event::Kind::EnergyCounters(counters))) => {
            let mut recycled = RecycledEnergy::new(counters, &mut *this.spare, reset_in_place);
            merge_message(wire_type, &mut recycled, buf, ctx, ("Event", "kind"))?;
            recycled.finish();
            Ok(())
        }
        (EVENT_ENERGY_COUNTERS, _) => {
            let mut counters = this.spare.energy.pop().unwrap_or_default();
            let mut recycled = RecycledEnergy::new(&mut counters, &mut *this.spare, false);
            merge_message(wire_type, &mut recycled, buf, ctx, ("Event", "kind"))?;
            recycled.finish();
            let old = this.msg.kind.replace(event::Kind::EnergyCounters(counters));
            if let Some(old) = old {
                this.spare.recycle_kind(old);
            }
            Ok(())
        }
        _ => this.msg.merge_field(tag, wire_type, buf, ctx),
    }
});

/// Resets every field of `counters` but its loop and model to its `Default`.
fn reset_deadline_fields(counters: &mut DeadlineCounters) {
    // Every field: a field added to `DeadlineCounters` fails to compile here until it is reset.
    let DeadlineCounters {
        control_loop: _,
        model: _,
        start_time_unix_ns,
        producer_epoch,
        period_ns,
        budget_ns,
        cycles,
        misses,
        skipped,
        sum_duration_ns,
        max_duration_ns,
        response_time,
        mode,
        activations,
        deadline_misses,
        overruns,
        deadline_ns,
        semantics,
    } = counters;
    *start_time_unix_ns = 0;
    *producer_epoch = 0;
    *period_ns = 0;
    *budget_ns = 0;
    *cycles = 0;
    *misses = 0;
    *skipped = 0;
    *sum_duration_ns = 0;
    *max_duration_ns = 0;
    *response_time = None;
    *mode = 0;
    *activations = None;
    *deadline_misses = None;
    *overruns = None;
    *deadline_ns = 0;
    *semantics = 0;
}

/// Deadline counters being decoded; `loop_stale`/`model_stale` while their loop or model is the
/// stale event's, not yet cleared.
#[derive(Debug)]
struct RecycledDeadline<'a> {
    msg: &'a mut DeadlineCounters,
    spare: &'a mut Spare,
    loop_stale: bool,
    model_stale: bool,
}

impl<'a> RecycledDeadline<'a> {
    fn new(msg: &'a mut DeadlineCounters, spare: &'a mut Spare, stale: bool) -> Self {
        if stale {
            reset_deadline_fields(msg);
        }
        Self {
            loop_stale: stale && msg.control_loop.is_some(),
            model_stale: stale && msg.model.is_some(),
            msg,
            spare,
        }
    }

    /// The counters ended: a stale loop or model the bytes did not write over is taken away.
    fn finish(self) {
        if self.loop_stale
            && let Some(control_loop) = self.msg.control_loop.take()
        {
            self.spare.recycle_loop(control_loop);
        }
        self.spare
            .recycle_stale_model(self.model_stale, &mut self.msg.model);
    }
}

wrapped_message!(RecycledDeadline, |this, tag, wire_type, buf, ctx| {
    let spare = &mut *this.spare;
    match tag {
        DEADLINE_CONTROL_LOOP => {
            if std::mem::take(&mut this.loop_stale)
                && let Some(control_loop) = &mut this.msg.control_loop
            {
                control_loop.clear();
            }
            let control_loop = this
                .msg
                .control_loop
                .get_or_insert_with(|| spare.loops.pop().unwrap_or_default());
            merge_message(
                wire_type,
                control_loop,
                buf,
                ctx,
                ("DeadlineCounters", "control_loop"),
            )
        }
        DEADLINE_MODEL => merge_model(
            &mut this.msg.model,
            &mut this.model_stale,
            spare,
            (wire_type, buf, ctx),
            ("DeadlineCounters", "model"),
        ),
        _ => this.msg.merge_field(tag, wire_type, buf, ctx),
    }
});

/// Energy counters being decoded: `msg.rails[..rails_used]` are this decode's, the rest stale;
/// `model_stale` while the model is the stale event's, not yet cleared.
#[derive(Debug)]
struct RecycledEnergy<'a> {
    msg: &'a mut EnergyCounters,
    spare: &'a mut Spare,
    rails_used: usize,
    model_stale: bool,
}

impl<'a> RecycledEnergy<'a> {
    fn new(msg: &'a mut EnergyCounters, spare: &'a mut Spare, stale: bool) -> Self {
        if stale {
            // Every field: a field added to `EnergyCounters` fails to compile here until it is
            // reset.
            let EnergyCounters {
                start_time_unix_ns,
                rails: _,
                model: _,
            } = msg;
            *start_time_unix_ns = 0;
        }
        Self {
            rails_used: if stale { 0 } else { msg.rails.len() },
            model_stale: stale && msg.model.is_some(),
            msg,
            spare,
        }
    }

    /// The counters ended: stale rails and a stale model the bytes did not write over are
    /// taken away.
    fn finish(self) {
        for rail in self.msg.rails.drain(self.rails_used..) {
            self.spare.recycle_rail(rail);
        }
        self.spare
            .recycle_stale_model(self.model_stale, &mut self.msg.model);
    }
}

wrapped_message!(RecycledEnergy, |this, tag, wire_type, buf, ctx| {
    let spare = &mut *this.spare;
    match tag {
        ENERGY_RAILS => {
            // `message::merge_repeated`, over a stale rail or a spare one.
            let result = check_wire_type(WireType::LengthDelimited, wire_type).and_then(|()| {
                if let Some(rail) = this.msg.rails.get_mut(this.rails_used) {
                    rail.clear();
                } else {
                    let rail = spare.rails.pop().unwrap_or_default();
                    this.msg.rails.push(rail);
                }
                let rail = &mut this.msg.rails[this.rails_used];
                this.rails_used += 1;
                prost::encoding::message::merge(WireType::LengthDelimited, rail, buf, ctx)
            });
            result.map_err(|mut error| {
                error.push("EnergyCounters", "rails");
                error
            })
        }
        ENERGY_MODEL => merge_model(
            &mut this.msg.model,
            &mut this.model_stale,
            spare,
            (wire_type, buf, ctx),
            ("EnergyCounters", "model"),
        ),
        _ => this.msg.merge_field(tag, wire_type, buf, ctx),
    }
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::{CustomEvent, Tier};
    use proptest::prelude::*;

    fn model() -> impl Strategy<Value = Option<ModelVersion>> {
        proptest::option::of(
            ("[a-z]{0,12}", "[0-9.]{0,6}", any::<u64>(), "[a-f0-9]{0,3}").prop_map(
                |(name, version, id_hash, engine_sha256)| ModelVersion {
                    name,
                    version,
                    id_hash,
                    engine_sha256,
                    ..Default::default()
                },
            ),
        )
    }

    fn kind() -> impl Strategy<Value = Option<event::Kind>> {
        let deadline = (
            proptest::option::of((any::<u32>(), "[a-z]{0,10}")),
            model(),
            any::<i64>(),
            (any::<u64>(), any::<u64>(), 0i32..4),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
        )
            .prop_map(
                |(
                    control_loop,
                    model,
                    start,
                    (cycles, skipped, semantics),
                    activations,
                    overruns,
                )| {
                    event::Kind::DeadlineCounters(DeadlineCounters {
                        control_loop: control_loop
                            .map(|(loop_id, loop_name)| LoopRef { loop_id, loop_name }),
                        model,
                        start_time_unix_ns: start,
                        cycles,
                        skipped,
                        semantics,
                        activations,
                        overruns,
                        ..Default::default()
                    })
                },
            );
        let energy = (
            any::<i64>(),
            proptest::collection::vec(("[A-Z_]{0,12}", any::<f64>()), 0..4),
            model(),
        )
            .prop_map(|(start, rails, model)| {
                event::Kind::EnergyCounters(EnergyCounters {
                    start_time_unix_ns: start,
                    rails: rails
                        .into_iter()
                        .map(|(rail, joules)| RailEnergy { rail, joules })
                        .collect(),
                    model,
                })
            });
        let custom = "[a-z]{0,8}".prop_map(|name| {
            event::Kind::Custom(CustomEvent {
                name,
                attributes: vec![],
            })
        });
        proptest::option::of(prop_oneof![deadline, energy, custom])
    }

    fn batch() -> impl Strategy<Value = Batch> {
        (
            "[a-z]{0,8}",
            any::<u64>(),
            proptest::collection::vec((any::<u64>(), any::<i64>(), kind()), 0..6),
            "[a-z-]{0,10}",
        )
            .prop_map(|(machine_id, agent_epoch, events, machine_class)| Batch {
                schema_version: 1,
                machine_id,
                site_id: "pit-3".into(),
                agent_epoch,
                tier: Tier::Slo as i32,
                first_seq: 1,
                last_seq: 2,
                sent_time_unix_ns: 7,
                events: events
                    .into_iter()
                    .map(|(seq, event_time_unix_ns, kind)| Event {
                        seq,
                        event_time_unix_ns,
                        monotonic_ns: 3,
                        kind,
                    })
                    .collect(),
                machine_class,
                agent_version: String::new(),
            })
    }

    /// The encoding of `batch`, then (when `merged`) one more event whose bytes are the first
    /// and the last event's encodings one after the other (which protobuf merges into one),
    /// with `flips` applied (byte index, xor) to make some of them wrong.
    fn encoded(batch: &Batch, merged: bool, flips: &[(prop::sample::Index, u8)]) -> Vec<u8> {
        let mut bytes = batch.encode_to_vec();
        if let (true, Some(first), Some(last)) = (merged, batch.events.first(), batch.events.last())
        {
            let mut event = first.encode_to_vec();
            event.extend(last.encode_to_vec());
            prost::encoding::encode_key(BATCH_EVENTS, WireType::LengthDelimited, &mut bytes);
            prost::encoding::encode_varint(event.len() as u64, &mut bytes);
            bytes.extend(event);
        }
        if !bytes.is_empty() {
            for (index, value) in flips {
                let i = index.index(bytes.len());
                bytes[i] ^= value;
            }
        }
        bytes
    }

    #[test]
    fn a_recycled_batch_keeps_nothing_of_the_batch_before() {
        let full = Batch {
            machine_id: "truck-1".into(),
            events: vec![Event {
                seq: 4,
                kind: Some(event::Kind::DeadlineCounters(DeadlineCounters {
                    control_loop: Some(LoopRef {
                        loop_id: 1,
                        loop_name: "safety".into(),
                    }),
                    model: Some(ModelVersion {
                        name: "m".into(),
                        ..Default::default()
                    }),
                    cycles: 9,
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        };
        // The next event carries the same kind without its loop and model.
        let bare = Batch {
            events: vec![Event {
                seq: 5,
                kind: Some(event::Kind::DeadlineCounters(DeadlineCounters::default())),
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut spare = Spare::default();
        let mut batch = Batch::default();
        merge_batch(&mut batch, &mut spare, &full.encode_to_vec()).unwrap();
        assert_eq!(batch, full);
        merge_batch(&mut batch, &mut spare, &bare.encode_to_vec()).unwrap();
        assert_eq!(batch, bare);
    }

    #[test]
    fn deadline_counters_reset_in_place_equal_their_default_but_for_loop_and_model() {
        let mut counters = DeadlineCounters {
            control_loop: None,
            model: None,
            start_time_unix_ns: 1,
            producer_epoch: 2,
            period_ns: 3,
            budget_ns: 4,
            cycles: 5,
            misses: 6,
            skipped: 7,
            sum_duration_ns: 8,
            max_duration_ns: 9,
            response_time: Some(crate::v1::LatencyHistogram::default()),
            mode: 1,
            activations: Some(10),
            deadline_misses: Some(11),
            overruns: Some(12),
            deadline_ns: 13,
            semantics: 1,
        };
        reset_deadline_fields(&mut counters);
        assert_eq!(counters, DeadlineCounters::default());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Decoding batch after batch into one recycled batch gives, for each, what a fresh
        /// `Batch::decode` gives: the same batch, or an error with the same message.
        #[test]
        fn decoding_into_a_recycled_batch_gives_what_a_fresh_decode_gives(
            steps in proptest::collection::vec(
                (
                    batch(),
                    any::<bool>(),
                    proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
                ),
                1..8,
            ),
        ) {
            let mut spare = Spare::default();
            let mut batch = Batch::default();
            for (sent, merged, flips) in &steps {
                let bytes = encoded(sent, *merged, flips);
                let fresh = Batch::decode(bytes.as_slice());
                let recycled = merge_batch(&mut batch, &mut spare, &bytes);
                match (fresh, recycled) {
                    (Ok(fresh), Ok(())) => prop_assert_eq!(&batch, &fresh),
                    (Err(fresh), Err(recycled)) => {
                        prop_assert_eq!(fresh.to_string(), recycled.to_string());
                    }
                    (fresh, recycled) => prop_assert!(
                        false,
                        "fresh {:?}, recycled {:?}",
                        fresh.map(|_| ()),
                        recycled
                    ),
                }
            }
        }
    }
}

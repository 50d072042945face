//! Unit tests and a model-based proptest of the seqlock procedures, on heap-allocated rings.
//! Pure: they also run under miri (`cargo +nightly miri test -p loop-probe --lib protocol`).

use super::*;
use crate::layout::{AutonomyMode, FLAG_DEGRADED, FLAG_FALLBACK, zeroed};

const PERIOD: u64 = 1_000_000;
const BUDGET: u64 = 400_000;

/// The budget, and the deadline at the end of the period.
fn judge() -> Judgement {
    Judgement {
        budget_ns: BUDGET,
        deadline_ns: PERIOD,
    }
}

fn cycle(i: u64, duration_ns: u64) -> Cycle {
    Cycle {
        cycle: i,
        release_ns: 1_000_000_000 + i * PERIOD,
        start_ns: 1_000_000_000 + i * PERIOD + 20_000,
        duration_ns,
        flags: 0,
    }
}

fn collect(reader: &mut RingReader, ring: &zeroed::Ring, now: u64) -> (Vec<Record>, PollStats) {
    let mut out = Vec::new();
    let stats = reader
        .poll(&ring.ring_ref(), now, &mut |r: &Record| out.push(*r))
        .unwrap();
    (out, stats)
}

/// What a producer that died inside `record` leaves behind: the first `steps` steps of the
/// record procedure for position `n` and cycle `c`, with summary latch `k` and the next
/// counters. After step 2 the record itself is whole and published; only copy 1 is half done.
fn crash_inside_record(
    ring: &zeroed::Ring,
    n: u64,
    c: &Cycle,
    k: u64,
    next: &CycleCounters,
    steps: u8,
) {
    let slot = &ring.slots[(n % ring.slots.len() as u64) as usize];
    slot.seq.store(2 * n + 1, Ordering::Relaxed);
    ring.summary.seq.store(k + 1, Ordering::Release);
    if steps >= 1 {
        slot.duration_ns.store(c.duration_ns, Ordering::Relaxed);
        ring.summary.copies[0]
            .cycles
            .store(next.cycles, Ordering::Relaxed);
        ring.summary.deadline_misses[0].store(next.deadline_misses, Ordering::Relaxed);
    }
    if steps >= 2 {
        slot.release_ns.store(c.release_ns, Ordering::Relaxed);
        slot.start_ns.store(c.start_ns, Ordering::Relaxed);
        slot.cycle.store(c.cycle, Ordering::Relaxed);
        store_words(&ring.summary, 0, next);
        slot.seq.store(2 * n + 2, Ordering::Relaxed);
        ring.head.store(n + 1, Ordering::Relaxed);
        ring.summary.seq.store(k + 2, Ordering::Relaxed);
        ring.summary.copies[1]
            .overruns
            .store(next.overruns, Ordering::Relaxed);
        ring.summary.deadline_misses[1].store(next.deadline_misses, Ordering::Relaxed);
    }
}

#[test]
fn records_come_back_whole_and_in_order() {
    let ring = zeroed::Ring::new(8);
    let mut w = RingWriter::new(8, judge(), 7);
    for i in 0..5 {
        w.record(&ring.ring_ref(), &cycle(i, 100_000 + i));
    }
    let mut r = RingReader::new(8, PERIOD, 1_000_000_000, 0);
    let (recs, stats) = collect(&mut r, &ring, 2_000_000_000);
    assert_eq!(stats.new_records, 5);
    assert_eq!(stats.lost + stats.torn + stats.rejected, 0);
    for (i, rec) in recs.iter().enumerate() {
        let i = i as u64;
        assert_eq!(rec.index, i);
        assert_eq!(rec.cycle, i);
        assert_eq!(rec.duration_ns, 100_000 + i);
        assert_eq!(rec.budget_ns, BUDGET);
        assert_eq!(rec.loop_id, 7);
        assert_eq!(rec.latency_ns(), 20_000);
        assert_eq!(rec.flags, 0);
    }
    let (again, stats) = collect(&mut r, &ring, 2_000_000_000);
    assert!(again.is_empty());
    assert_eq!(stats, PollStats::default());
}

#[test]
fn records_overwritten_before_the_reader_came_are_counted_as_lost() {
    let ring = zeroed::Ring::new(4);
    let mut w = RingWriter::new(4, judge(), 1);
    for i in 0..10 {
        w.record(&ring.ring_ref(), &cycle(i, 1));
    }
    let mut r = RingReader::new(4, PERIOD, 1_000_000_000, 0);
    let (recs, stats) = collect(&mut r, &ring, 2_000_000_000);
    assert_eq!(stats.lost, 6);
    assert_eq!(stats.new_records, 4);
    assert_eq!(
        recs.iter().map(|r| r.cycle).collect::<Vec<_>>(),
        vec![6, 7, 8, 9]
    );
}

#[test]
fn overruns_and_cycle_gaps_set_flags_and_counters() {
    let ring = zeroed::Ring::new(8);
    let mut w = RingWriter::new(8, judge(), 1);
    let rr = ring.ring_ref();
    assert_eq!(w.record(&rr, &cycle(0, BUDGET)), 0);
    assert_eq!(w.record(&rr, &cycle(1, BUDGET + 1)), FLAG_OVERRUN);
    assert_eq!(w.record(&rr, &cycle(4, 10)), FLAG_SKIPPED);
    let mut c = cycle(5, 10);
    c.flags = FLAG_FALLBACK | FLAG_DEGRADED | FLAG_OVERRUN | 0x100;
    assert_eq!(w.record(&rr, &c), FLAG_FALLBACK | FLAG_DEGRADED);
    let s = read_summary(&ring.summary).unwrap();
    assert_eq!(
        s,
        CycleCounters {
            cycles: 4,
            overruns: 1,
            skipped: 2,
            max_duration_ns: BUDGET + 1,
            sum_duration_ns: 2 * BUDGET + 1 + 20,
            activations: 6,
            deadline_misses: 2,
        }
    );
    assert_eq!(ring.head.load(Ordering::Relaxed), 4);
    assert_eq!(
        ring.heartbeat_ns.load(Ordering::Relaxed),
        c.start_ns + c.duration_ns
    );
}

#[test]
fn a_step_that_starts_late_and_completes_past_its_deadline_is_a_miss() {
    let ring = zeroed::Ring::new(8);
    let mut w = RingWriter::new(8, judge(), 1);
    // Within its budget (0.3 ms of 0.4 ms), but started 0.8 ms after its release: it completes
    // 1.1 ms after the release, past D = 1 ms.
    let mut c = cycle(0, 300_000);
    c.start_ns = c.release_ns + 800_000;
    let flags = w.record(&ring.ring_ref(), &c);
    assert_eq!(flags, FLAG_DEADLINE_MISS, "a deadline miss, not an overrun");
    let s = read_summary(&ring.summary).unwrap();
    assert_eq!(
        (s.activations, s.deadline_misses, s.overruns, s.skipped),
        (1, 1, 0, 0)
    );
    let mut r = RingReader::new(8, PERIOD, 1_000_000_000, 0);
    let (recs, _) = collect(&mut r, &ring, 2_000_000_000);
    assert_eq!(recs[0].flags, FLAG_DEADLINE_MISS);
    assert_eq!(recs[0].completion_ns(), c.release_ns + 1_100_000);
}

#[test]
fn a_late_completion_without_overrun_and_an_overrun_that_meets_its_deadline_are_told_apart() {
    let ring = zeroed::Ring::new(8);
    let mut w = RingWriter::new(8, judge(), 1);
    let rr = ring.ring_ref();
    // Late: starts 0.9 ms after its release, runs 0.2 ms (within the 0.4 ms budget).
    let mut late = cycle(0, 200_000);
    late.start_ns = late.release_ns + 900_000;
    assert_eq!(w.record(&rr, &late), FLAG_DEADLINE_MISS);
    // Overrun: starts 20 µs after its release, runs 0.6 ms (over budget), done by 0.62 ms.
    assert_eq!(w.record(&rr, &cycle(1, 600_000)), FLAG_OVERRUN);
    // Both: starts 0.5 ms late and runs 0.6 ms.
    let mut both = cycle(2, 600_000);
    both.start_ns = both.release_ns + 500_000;
    assert_eq!(w.record(&rr, &both), FLAG_OVERRUN | FLAG_DEADLINE_MISS);
    // Completing exactly at release + D meets the deadline.
    let mut on_the_dot = cycle(3, 100_000);
    on_the_dot.start_ns = on_the_dot.release_ns + PERIOD - 100_000;
    assert_eq!(w.record(&rr, &on_the_dot), 0);
    let s = read_summary(&ring.summary).unwrap();
    assert_eq!(
        (s.activations, s.deadline_misses, s.overruns),
        (4, 2, 2),
        "two deadline misses and two overruns, one step being both"
    );
}

#[test]
fn skipped_activations_are_activations_and_deadline_misses() {
    let ring = zeroed::Ring::new(8);
    let mut w = RingWriter::new(8, judge(), 1);
    let rr = ring.ring_ref();
    w.record(&rr, &cycle(10, 1));
    // The loop hung through activations 11..=60 and resumed at 61, on time.
    assert_eq!(w.record(&rr, &cycle(61, 1)), FLAG_SKIPPED);
    let s = read_summary(&ring.summary).unwrap();
    assert_eq!(
        (s.cycles, s.skipped, s.activations, s.deadline_misses),
        (2, 50, 52, 50)
    );
}

#[test]
fn a_constrained_deadline_shorter_than_the_period_is_what_completions_are_judged_against() {
    let ring = zeroed::Ring::new(8);
    let judge = Judgement {
        budget_ns: BUDGET,
        deadline_ns: PERIOD / 2,
    };
    let mut w = RingWriter::new(8, judge, 1);
    let rr = ring.ring_ref();
    // 20 µs late plus 0.4 ms: within the budget, 0.42 ms after release, inside D = 0.5 ms.
    assert_eq!(w.record(&rr, &cycle(0, BUDGET)), 0);
    // Started 0.2 ms late, 0.35 ms long: done 0.55 ms after release, past D, well inside T.
    let mut c = cycle(1, 350_000);
    c.start_ns = c.release_ns + 200_000;
    assert_eq!(w.record(&rr, &c), FLAG_DEADLINE_MISS);
    assert_eq!(read_summary(&ring.summary).unwrap().deadline_misses, 1);
}

#[test]
fn a_slot_with_an_odd_sequence_is_rejected_as_torn() {
    let ring = zeroed::Ring::new(4);
    let mut w = RingWriter::new(4, judge(), 1);
    for i in 0..3 {
        w.record(&ring.ring_ref(), &cycle(i, 1));
    }
    ring.slots[1].seq.store(3, Ordering::Relaxed);
    let mut r = RingReader::new(4, PERIOD, 1_000_000_000, 0);
    let (recs, stats) = collect(&mut r, &ring, 2_000_000_000);
    assert_eq!(stats.torn, 1);
    assert_eq!(stats.new_records, 2);
    assert_eq!(recs.iter().map(|r| r.index).collect::<Vec<_>>(), vec![0, 2]);
}

#[test]
fn a_slot_already_holding_a_later_record_counts_as_lost() {
    let slot = zeroed::slot();
    slot.seq.store(2 * 9 + 2, Ordering::Relaxed);
    assert_eq!(read_slot(&slot, 5), SlotRead::Overwritten);
    slot.seq.store(2 * 9 + 1, Ordering::Relaxed);
    assert_eq!(read_slot(&slot, 5), SlotRead::Overwritten);
    slot.seq.store(2 * 5 + 3, Ordering::Relaxed);
    assert_eq!(read_slot(&slot, 5), SlotRead::Torn);
    slot.seq.store(0, Ordering::Relaxed);
    assert_eq!(read_slot(&slot, 5), SlotRead::Torn);
}

#[test]
fn a_head_below_the_cursor_is_reported_as_a_reset() {
    let ring = zeroed::Ring::new(4);
    let mut w = RingWriter::new(4, judge(), 1);
    for i in 0..3 {
        w.record(&ring.ring_ref(), &cycle(i, 1));
    }
    let mut r = RingReader::new(4, PERIOD, 1_000_000_000, 0);
    collect(&mut r, &ring, 2_000_000_000);
    ring.head.store(1, Ordering::Relaxed);
    let err = r
        .poll(&ring.ring_ref(), 2_000_000_000, &mut |_: &Record| {})
        .unwrap_err();
    assert_eq!(err, HeadWentBack { head: 1, cursor: 3 });
}

#[test]
fn an_absurd_head_jump_is_an_anomaly_not_a_loss() {
    let ring = zeroed::Ring::new(4);
    let mut w = RingWriter::new(4, judge(), 1);
    w.record(&ring.ring_ref(), &cycle(0, 1));
    let mut r = RingReader::new(4, PERIOD, 1_000_000_000, 0);
    collect(&mut r, &ring, 1_000_000_000);
    ring.head.store(1 << 60, Ordering::Relaxed);
    let (recs, stats) = collect(&mut r, &ring, 1_010_000_000);
    assert_eq!(stats.head_jumps, 1);
    assert_eq!(stats.lost, 0);
    assert_eq!(stats.torn, 4);
    assert!(recs.is_empty());
    assert_eq!(r.cursor(), 1 << 60);
}

#[test]
fn a_fast_but_plausible_head_counts_overwrites_as_lost() {
    let ring = zeroed::Ring::new(4);
    let mut w = RingWriter::new(4, judge(), 1);
    for i in 0..100 {
        w.record(&ring.ring_ref(), &cycle(i, 1));
    }
    let mut r = RingReader::new(4, PERIOD, 1_000_000_000, 0);
    let (_, stats) = collect(&mut r, &ring, 1_000_100_000);
    assert_eq!(stats.head_jumps, 0);
    assert_eq!(stats.lost, 96);
}

#[test]
fn a_duration_over_a_thousand_periods_is_rejected() {
    let ring = zeroed::Ring::new(4);
    let mut w = RingWriter::new(4, judge(), 1);
    w.record(&ring.ring_ref(), &cycle(0, PERIOD * 1000 + 1));
    w.record(&ring.ring_ref(), &cycle(1, PERIOD * 1000));
    let mut r = RingReader::new(4, PERIOD, 1_000_000_000, 0);
    let (recs, stats) = collect(&mut r, &ring, 2_000_000_000);
    assert_eq!(stats.rejected, 1);
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].cycle, 1);
}

#[test]
fn the_summary_stays_whole_when_the_writer_dies_inside_copy_zero() {
    let ring = zeroed::Ring::new(4);
    let mut w = RingWriter::new(4, judge(), 1);
    w.record(&ring.ring_ref(), &cycle(0, BUDGET + 5));
    let before = read_summary(&ring.summary).unwrap();
    let next = CycleCounters {
        cycles: 2,
        overruns: 2,
        activations: 2,
        ..before
    };
    crash_inside_record(&ring, 1, &cycle(1, 5), 2, &next, 1);
    assert_eq!(read_summary(&ring.summary), Some(before));
    let mut r = RingReader::new(4, PERIOD, 1_000_000_000, 0);
    let (recs, _) = collect(&mut r, &ring, 2_000_000_000);
    assert_eq!(recs.len(), 1, "the half-written record is never published");
}

#[test]
fn the_summary_stays_whole_when_the_writer_dies_inside_copy_one() {
    let ring = zeroed::Ring::new(4);
    let mut w = RingWriter::new(4, judge(), 1);
    w.record(&ring.ring_ref(), &cycle(0, BUDGET + 5));
    let before = read_summary(&ring.summary).unwrap();
    let next = CycleCounters {
        cycles: 2,
        overruns: 7,
        activations: 2,
        ..before
    };
    crash_inside_record(&ring, 1, &cycle(1, 5), 2, &next, 2);
    assert_eq!(read_summary(&ring.summary), Some(next));
}

#[test]
fn model_versions_round_trip_and_overlong_ones_are_refused() {
    let cell = zeroed::model();
    assert_eq!(read_model(&cell), CellRead::Empty);
    let m = ModelVersion::new(0xfeed, "yolo-v8.2.1+trt10.3-fp16").unwrap();
    write_model(&cell, &m).unwrap();
    assert_eq!(read_model(&cell), CellRead::Value(m));
    assert_eq!(m.version(), "yolo-v8.2.1+trt10.3-fp16");
    assert!(ModelVersion::new(1, &"x".repeat(64)).is_some());
    assert!(ModelVersion::new(1, &"x".repeat(65)).is_none());
}

#[test]
fn a_claimed_cell_makes_writers_give_up_and_readers_report_busy() {
    let cell = zeroed::model();
    cell.seq.store(5, Ordering::Relaxed);
    let m = ModelVersion::new(1, "a").unwrap();
    assert_eq!(
        write_model(&cell, &m),
        Err(SlotBusy {
            what: "model version"
        })
    );
    assert_eq!(read_model(&cell), CellRead::Busy);
    let a = zeroed::autonomy();
    a.seq.store(1, Ordering::Relaxed);
    assert!(write_autonomy(&a, AutonomyMode::Manual, 5).is_err());
    assert_eq!(read_autonomy(&a), CellRead::Busy);
}

#[test]
fn garbage_in_the_model_cell_is_implausible_not_a_panic() {
    let cell = zeroed::model();
    cell.seq.store(2, Ordering::Relaxed);
    cell.len.store(65, Ordering::Relaxed);
    assert!(matches!(read_model(&cell), CellRead::Implausible(_)));
    cell.len.store(u64::MAX, Ordering::Relaxed);
    assert!(matches!(read_model(&cell), CellRead::Implausible(_)));
    cell.len.store(2, Ordering::Relaxed);
    cell.version[0].store(0xffff, Ordering::Relaxed);
    assert!(matches!(read_model(&cell), CellRead::Implausible(_)));
}

#[test]
fn autonomy_time_is_credited_to_the_mode_that_was_left() {
    let cell = zeroed::autonomy();
    init_autonomy(&cell, 100);
    write_autonomy(&cell, AutonomyMode::Manual, 150).unwrap();
    write_autonomy(&cell, AutonomyMode::Autonomous, 1_150).unwrap();
    write_autonomy(&cell, AutonomyMode::Manual, 3_150).unwrap();
    write_autonomy(&cell, AutonomyMode::Autonomous, 3_400).unwrap();
    let CellRead::Value(s) = read_autonomy(&cell) else {
        panic!("autonomy cell unreadable")
    };
    assert_eq!(s.mode, AutonomyMode::Autonomous);
    assert_eq!(s.total_ns(AutonomyMode::Unknown, 5_000), 50);
    assert_eq!(s.total_ns(AutonomyMode::Manual, 5_000), 1_250);
    assert_eq!(s.total_ns(AutonomyMode::Autonomous, 5_000), 2_000 + 1_600);
    assert_eq!(s.total_ns(AutonomyMode::Teleoperated, 5_000), 0);
}

#[test]
fn a_clock_going_backwards_credits_nothing_and_keeps_since_monotonic() {
    let cell = zeroed::autonomy();
    init_autonomy(&cell, 1_000);
    write_autonomy(&cell, AutonomyMode::Idle, 500).unwrap();
    let CellRead::Value(s) = read_autonomy(&cell) else {
        panic!("autonomy cell unreadable")
    };
    assert_eq!(s.ns_in_mode, [0; AUTONOMY_MODES]);
    assert_eq!(s.since_ns, 1_000);
}

#[test]
fn an_unknown_autonomy_value_is_implausible() {
    let cell = zeroed::autonomy();
    cell.mode.store(99, Ordering::Relaxed);
    assert!(matches!(read_autonomy(&cell), CellRead::Implausible(_)));
}

mod model {
    //! Model-based test: random records, polls, producer crashes (inside `record`) and
    //! restarts against a plain model of what the reader must deliver.
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[derive(Debug, Clone)]
    enum Action {
        /// Record a cycle after skipping `gap` activations, over budget if `over`, completing
        /// past its deadline if `late`.
        Record { gap: u8, over: bool, late: bool },
        /// A burst of records (forces overwrites).
        Burst(u8),
        /// The agent polls.
        Poll,
        /// The producer dies inside `record` after `steps` steps, then a new one starts.
        CrashAndRestart { steps: u8 },
    }

    fn action() -> impl Strategy<Value = Action> {
        prop_oneof![
            6 => (0u8..3, any::<bool>(), any::<bool>())
                .prop_map(|(gap, over, late)| Action::Record { gap, over, late }),
            1 => (1u8..20).prop_map(Action::Burst),
            4 => Just(Action::Poll),
            1 => (0u8..3).prop_map(|steps| Action::CrashAndRestart { steps }),
        ]
    }

    struct Producer {
        ring: zeroed::Ring,
        writer: RingWriter,
        next_cycle: u64,
        expected: CycleCounters,
    }

    impl Producer {
        fn new(cap: u32) -> Producer {
            Producer {
                ring: zeroed::Ring::new(cap),
                writer: RingWriter::new(cap, judge(), 3),
                next_cycle: 0,
                expected: CycleCounters::default(),
            }
        }

        fn record(&mut self, gap: u64, over: bool, late: bool, unread: &mut VecDeque<(u64, u64)>) {
            let idx = self.writer.head();
            let first = idx == 0;
            self.next_cycle += gap;
            let d = if over { BUDGET + 1 } else { BUDGET / 2 };
            let mut c = cycle(self.next_cycle, d);
            if late {
                // Starts so late that it completes past release + D, whatever its duration.
                c.start_ns = c.release_ns + PERIOD;
            }
            self.writer.record(&self.ring.ring_ref(), &c);
            let e = &mut self.expected;
            e.cycles += 1;
            e.activations += 1;
            e.overruns += u64::from(over);
            e.deadline_misses += u64::from(late);
            if !first {
                e.skipped += gap;
                e.activations += gap;
                e.deadline_misses += gap;
            }
            e.max_duration_ns = e.max_duration_ns.max(d);
            e.sum_duration_ns += d;
            unread.push_back((idx, self.next_cycle));
            self.next_cycle += 1;
        }
    }

    /// What a poll must deliver: the last `cap` unread records, minus `clobbered` (a slot a
    /// dead producer left half-written), and how many are lost.
    fn expect_poll(
        unread: &mut VecDeque<(u64, u64)>,
        cap: usize,
        clobbered: Option<u64>,
    ) -> (Vec<u64>, u64) {
        let keep = unread.len().min(cap);
        let mut lost = (unread.len() - keep) as u64;
        let mut want = Vec::new();
        for (idx, cyc) in unread.drain(..).skip(lost as usize) {
            if Some(idx) == clobbered {
                lost += 1;
            } else {
                want.push(cyc);
            }
        }
        (want, lost)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]
        #[test]
        #[cfg_attr(miri, ignore)]
        fn reader_delivers_exactly_the_unoverwritten_records_across_crashes(
            cap_log in 1u32..4,
            actions in proptest::collection::vec(action(), 1..60),
        ) {
            let cap = 1u32 << cap_log;
            let mut p = Producer::new(cap);
            let mut reader = RingReader::new(cap, PERIOD, 0, 0);
            let mut unread: VecDeque<(u64, u64)> = VecDeque::new();
            let mut now = 0u64;
            for a in actions {
                now += PERIOD * 1000;
                match a {
                    Action::Record { gap, over, late } => {
                        p.record(u64::from(gap), over, late, &mut unread)
                    }
                    Action::Burst(n) => {
                        for _ in 0..n {
                            p.record(0, false, false, &mut unread);
                        }
                    }
                    Action::Poll => {
                        let mut got = Vec::new();
                        let stats = reader
                            .poll(&p.ring.ring_ref(), now, &mut |r: &Record| got.push(r.cycle))
                            .unwrap();
                        let (want, lost) = expect_poll(&mut unread, cap as usize, None);
                        prop_assert_eq!(&got, &want);
                        prop_assert_eq!(stats.lost, lost);
                        prop_assert_eq!(stats.torn + stats.rejected + stats.head_jumps, 0);
                        prop_assert_eq!(read_summary(&p.ring.summary), Some(p.expected));
                    }
                    Action::CrashAndRestart { steps } => {
                        let n = p.writer.head();
                        let c = cycle(p.next_cycle, BUDGET + 1);
                        let mut next = p.expected;
                        next.cycles += 1;
                        next.activations += 1;
                        next.overruns += 1;
                        crash_inside_record(&p.ring, n, &c, 2 * n, &next, steps);
                        let clobbered = if steps >= 2 {
                            unread.push_back((n, c.cycle));
                            None
                        } else {
                            n.checked_sub(u64::from(cap))
                        };
                        // Whatever the crash left, the summary is one whole update.
                        let s = read_summary(&p.ring.summary).unwrap();
                        prop_assert!(s == p.expected || s == next);
                        // The agent drains the dead ring: never a half-written record.
                        let mut got = Vec::new();
                        let stats = reader
                            .poll(&p.ring.ring_ref(), now, &mut |r: &Record| got.push(r.cycle))
                            .unwrap();
                        let (want, lost) = expect_poll(&mut unread, cap as usize, clobbered);
                        prop_assert_eq!(&got, &want);
                        prop_assert_eq!(stats.lost, lost);
                        prop_assert_eq!(stats.torn + stats.rejected, 0);
                        // The new producer starts a new ring; the agent reopens at 0.
                        p = Producer::new(cap);
                        reader = RingReader::new(cap, PERIOD, now, 0);
                    }
                }
            }
        }
    }
}

#[test]
fn event_counters_read_back_what_was_counted() {
    let e = zeroed::events();
    e.interventions.fetch_add(2, Ordering::Release);
    e.fallbacks.fetch_add(1, Ordering::Release);
    assert_eq!(
        read_events(&e),
        EventCounters {
            interventions: 2,
            safe_stops: 0,
            fallbacks: 1
        }
    );
}

#[test]
fn a_reader_racing_a_writer_on_real_threads_never_delivers_a_torn_record() {
    // Small under miri, whose data-race detector and weak-memory emulation check the fences.
    let records: u64 = if cfg!(miri) { 60 } else { 20_000 };
    let ring = std::sync::Arc::new(zeroed::Ring::new(4));
    let w_ring = ring.clone();
    let writer = std::thread::spawn(move || {
        let mut w = RingWriter::new(4, judge(), 5);
        for i in 0..records {
            // Every field derived from the cycle number, so a mix of two records shows.
            let c = Cycle {
                cycle: i,
                release_ns: i * 3,
                start_ns: i * 3 + 1,
                duration_ns: i % 7,
                flags: 0,
            };
            w.record(&w_ring.ring_ref(), &c);
        }
    });
    let mut reader = RingReader::new(4, PERIOD, 0, 0);
    let mut total = PollStats::default();
    let mut check = |r: &Record| {
        assert_eq!(r.cycle, r.index);
        assert_eq!((r.release_ns, r.start_ns), (r.index * 3, r.index * 3 + 1));
        assert_eq!(r.duration_ns, r.index % 7);
        assert_eq!(r.loop_id, 5);
    };
    // Each poll claims a second has passed, so the plausibility bound never trips.
    let mut now = 0;
    while !writer.is_finished() {
        now += 1_000_000_000;
        let s = reader.poll(&ring.ring_ref(), now, &mut check).unwrap();
        total.accumulate(&s);
        if let Some(c) = read_summary(&ring.summary) {
            assert!(c.overruns <= c.cycles && c.max_duration_ns <= 6);
            assert_eq!(c.activations, c.cycles + c.skipped);
        }
    }
    writer.join().unwrap();
    total.accumulate(
        &reader
            .poll(&ring.ring_ref(), now + 1_000_000_000, &mut check)
            .unwrap(),
    );
    assert_eq!(total.new_records + total.lost + total.torn, records);
    assert_eq!(total.rejected + total.head_jumps, 0);
}

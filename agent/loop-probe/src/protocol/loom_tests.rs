//! loom models of writer against reader, over every interleaving and every value the memory
//! model allows a Relaxed load to return (within a preemption bound).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p loop-probe --release --lib loom`

use super::*;
use crate::layout::zeroed;
use loom::sync::Arc;
use loom::thread;

/// Every field of record `i` is derived from `i`, so a mix of two records is detectable.
fn cycle_for(i: u64) -> Cycle {
    Cycle {
        cycle: i,
        release_ns: 1000 + i,
        start_ns: 2000 + i,
        duration_ns: if i % 2 == 1 { 50 } else { 10 },
        flags: 0,
    }
}

fn assert_whole(r: &Record) {
    let want = cycle_for(r.index);
    assert_eq!(r.cycle, want.cycle, "cycle from another record: {r:?}");
    assert_eq!(r.release_ns, want.release_ns, "torn release: {r:?}");
    assert_eq!(r.start_ns, want.start_ns, "torn start: {r:?}");
    assert_eq!(r.duration_ns, want.duration_ns, "torn duration: {r:?}");
    assert_eq!(r.budget_ns, 20);
    assert_eq!(r.loop_id, 9);
}

/// Budget 20 and deadline 1040 after release: `cycle_for` starts 1000 after its release, so
/// the odd cycles (duration 50) overrun and complete past their deadline, the even ones (10)
/// do neither.
const JUDGE: Judgement = Judgement {
    budget_ns: 20,
    deadline_ns: 1040,
};

/// Counters after `k` records of `cycle_for`: overruns and deadline misses on odd cycles.
fn counters_after(k: u64) -> CycleCounters {
    let mut c = CycleCounters::default();
    for i in 0..k {
        let r = cycle_for(i);
        let d = r.duration_ns;
        c.cycles += 1;
        c.activations += 1;
        c.overruns += u64::from(d > 20);
        c.deadline_misses += u64::from(d > 20);
        c.max_duration_ns = c.max_duration_ns.max(d);
        c.sum_duration_ns += d;
    }
    c
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(2);
    }
    b
}

#[test]
fn loom_reader_rejects_torn_slots_and_accounts_for_every_record() {
    const RECORDS: u64 = 3;
    builder().check(|| {
        let ring = Arc::new(zeroed::Ring::new(2));
        let w_ring = ring.clone();
        let writer = thread::spawn(move || {
            let mut w = RingWriter::new(2, JUDGE, 9);
            for i in 0..RECORDS {
                w.record(&w_ring.ring_ref(), &cycle_for(i));
            }
        });
        let mut reader = RingReader::new(2, 1_000, 0, 0);
        let mut total = PollStats::default();
        let mut last_index = None;
        let mut sink = |r: &Record| {
            assert_whole(r);
            assert!(last_index < Some(r.index), "records out of order");
            last_index = Some(r.index);
        };
        let s = reader.poll(&ring.ring_ref(), 0, &mut sink).unwrap();
        total.accumulate(&s);
        writer.join().unwrap();
        let s = reader.poll(&ring.ring_ref(), 0, &mut sink).unwrap();
        total.accumulate(&s);
        assert_eq!(
            total.new_records + total.lost + total.torn + total.rejected,
            RECORDS,
            "every record accounted for once: {total:?}"
        );
        assert_eq!(total.head_jumps, 0);
        // The last ring's worth is always readable once the writer is done.
        assert!(total.new_records >= 1);
    });
}

#[test]
fn loom_summary_is_never_torn() {
    // Two updates exercise both copies being rewritten under a reader.
    const RECORDS: u64 = 2;
    builder().check(|| {
        let ring = Arc::new(zeroed::Ring::new(2));
        let w_ring = ring.clone();
        let writer = thread::spawn(move || {
            let mut w = RingWriter::new(2, JUDGE, 9);
            for i in 0..RECORDS {
                w.record(&w_ring.ring_ref(), &cycle_for(i));
            }
        });
        let valid: Vec<CycleCounters> = (0..=RECORDS).map(counters_after).collect();
        // One read per execution: loom already tries it at every point of the writer's run,
        // and every value each Relaxed load may return.
        if let Some(s) = read_summary(&ring.summary) {
            assert!(valid.contains(&s), "torn summary {s:?}");
        }
        writer.join().unwrap();
        assert_eq!(read_summary(&ring.summary), Some(counters_after(RECORDS)));
    });
}

#[test]
fn loom_summary_stays_whole_when_the_writer_stops_mid_update() {
    builder().check(|| {
        let ring = Arc::new(zeroed::Ring::new(2));
        let w_ring = ring.clone();
        let writer = thread::spawn(move || {
            let mut w = RingWriter::new(2, JUDGE, 9);
            w.record(&w_ring.ring_ref(), &cycle_for(0));
            // The producer dies inside the second update: latch odd, copy 0 half written (its
            // counters and its deadline misses).
            let s = &w_ring.summary;
            s.seq.store(3, Ordering::Release);
            fence(Ordering::Release);
            s.copies[0].cycles.store(2, Ordering::Relaxed);
            s.deadline_misses[0].store(2, Ordering::Relaxed);
        });
        let ok = [counters_after(0), counters_after(1)];
        if let Some(s) = read_summary(&ring.summary) {
            assert!(ok.contains(&s), "torn summary {s:?}");
        }
        writer.join().unwrap();
        assert_eq!(read_summary(&ring.summary), Some(counters_after(1)));
    });
}

#[test]
fn loom_model_version_writers_never_wait_and_readers_see_whole_versions() {
    builder().check(|| {
        let cell = Arc::new(zeroed::model());
        let a = ModelVersion::new(0xaaaa, "alpha-1").unwrap();
        let b = ModelVersion::new(0xbbbb, "beta-22").unwrap();
        let (ca, cb) = (cell.clone(), cell.clone());
        let ta = thread::spawn(move || write_model(&ca, &a).is_ok());
        let tb = thread::spawn(move || write_model(&cb, &b).is_ok());
        match read_model(&cell) {
            CellRead::Value(m) => assert!(m == a || m == b, "torn model {m:?}"),
            CellRead::Empty | CellRead::Busy => {}
            CellRead::Implausible(w) => panic!("implausible: {w}"),
        }
        let (oka, okb) = (ta.join().unwrap(), tb.join().unwrap());
        assert!(oka || okb, "at least one writer succeeds");
        match read_model(&cell) {
            CellRead::Value(m) => assert!((oka && m == a) || (okb && m == b)),
            other => panic!("after both writers: {other:?}"),
        }
    });
}

#[test]
fn loom_autonomy_time_is_never_read_half_updated() {
    builder().check(|| {
        let cell = Arc::new(zeroed::autonomy());
        init_autonomy(&cell, 0);
        let wc = cell.clone();
        let writer = thread::spawn(move || {
            write_autonomy(&wc, AutonomyMode::Autonomous, 10).unwrap();
            write_autonomy(&wc, AutonomyMode::Manual, 30).unwrap();
        });
        if let CellRead::Value(s) = read_autonomy(&cell) {
            // Time accounted up to `since` always equals `since`: nothing half credited.
            assert_eq!(s.ns_in_mode.iter().sum::<u64>(), s.since_ns, "{s:?}");
        }
        writer.join().unwrap();
        let CellRead::Value(s) = read_autonomy(&cell) else {
            panic!("unreadable after writer finished")
        };
        assert_eq!(s.mode, AutonomyMode::Manual);
        assert_eq!(s.total_ns(AutonomyMode::Autonomous, 100), 20);
    });
}

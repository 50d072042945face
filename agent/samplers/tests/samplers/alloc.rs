//! The sampler's steady state allocates nothing: a producer thread writes well over 100,000
//! cycles (with misses, bursts and fallbacks) through `loop_probe::ProbeWriter` while the
//! sampler polls, emits snapshots and safety events into a sink that encodes into a reserved
//! buffer (and copies the states it keeps into another), and the model watcher ticks over an
//! unchanged manifest; the allocations of the sampler's thread are counted after a warm-up.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use edgewatch_proto::v1::{Event, Tier, event::Kind};
use edgewatch_samplers::EventSink;
use edgewatch_samplers::deadline::DeadlineSampler;
use edgewatch_samplers::model::{ModelConfig, ModelWatcher};
use loop_probe::{Cycle, FLAG_FALLBACK};
use prost::Message;

use crate::ALLOCATOR;
use crate::probes::writer;
use crate::util::{config, now, probe, scratch};

const RECORDS: u64 = 150_000;
const WARM_UP_RECORDS: u64 = 20_000;

/// Encodes every event into a buffer reserved up front, copies kept states into another; keeps
/// counts, never allocates.
struct EncodingSink {
    buf: Vec<u8>,
    kept: Vec<u8>,
    keeps: u64,
    events: u64,
    snapshots: u64,
    bursts: u64,
    fallbacks: u64,
    fallback_total: u64,
    autonomy: u64,
    last_cycles: u64,
    last_misses: u64,
    last_deadline_misses: u64,
}

impl EventSink for EncodingSink {
    fn emit(&mut self, _tier: Tier, event: &Event) {
        let len = event.encoded_len();
        if self.buf.len() + len > self.buf.capacity() {
            self.buf.clear();
        }
        event.encode(&mut self.buf).unwrap();
        self.events += 1;
        match &event.kind {
            Some(Kind::DeadlineCounters(c)) => {
                self.snapshots += 1;
                self.last_cycles = c.cycles;
                self.last_misses = c.misses;
                self.last_deadline_misses = c.deadline_misses.unwrap_or(0);
            }
            Some(Kind::DeadlineMissBurst(_)) => self.bursts += 1,
            Some(Kind::SafetyFallback(f)) => {
                self.fallbacks += 1;
                self.fallback_total = f.total;
            }
            Some(Kind::AutonomySeconds(_)) => self.autonomy += 1,
            _ => {}
        }
    }

    fn keep(&mut self, _key: &str, state: &[u8]) {
        self.kept.clear();
        self.kept.extend_from_slice(state);
        self.keeps += 1;
    }
}

#[test]
fn the_sampler_allocates_nothing_in_steady_state_over_150000_cycles() {
    let dir = scratch();
    let path = dir.path().join("loop.probe");
    let manifest = dir.path().join("model.json");
    std::fs::write(dir.path().join("model.engine"), vec![7u8; 256 << 10]).unwrap();
    std::fs::write(
        &manifest,
        br#"{"name": "haul-perception", "version": "4.2.1", "engine": "model.engine"}"#,
    )
    .unwrap();
    let mut watcher = ModelWatcher::new(ModelConfig {
        manifest,
        hash_step_bytes: 64 << 10,
    });
    let mut s = DeadlineSampler::new(config(vec![probe(&path)], 0.01, |_| {}), now());
    let mut sink = EncodingSink {
        buf: Vec::with_capacity(1 << 20),
        kept: Vec::with_capacity(64 << 10),
        keeps: 0,
        events: 0,
        snapshots: 0,
        bursts: 0,
        fallbacks: 0,
        fallback_total: 0,
        autonomy: 0,
        last_cycles: 0,
        last_misses: 0,
        last_deadline_misses: 0,
    };

    let mut w = writer(&path, "steer", 1 << 16);
    let handle = w.handle().clone();
    handle
        .set_autonomy(loop_probe::AutonomyMode::Autonomous, now().monotonic_ns)
        .unwrap();
    let written = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let misses = Arc::new(AtomicU64::new(0));
    let producer = {
        let (written, done, misses) = (written.clone(), done.clone(), misses.clone());
        std::thread::spawn(move || {
            let base = now().monotonic_ns;
            for k in 0..RECORDS {
                let release = base + k * 1_000_000;
                // A miss every 97 cycles, and three in a row every 5,000: over budget and,
                // starting 0.2 ms late, past the 1 ms deadline.
                let over = k % 97 == 0 || (k % 5000 < 3);
                let mut flags = 0;
                if k % 1000 == 500 {
                    handle.count_fallback();
                    flags = FLAG_FALLBACK;
                }
                misses.fetch_add(u64::from(over), Ordering::Relaxed);
                w.record(&Cycle {
                    cycle: k,
                    release_ns: release,
                    start_ns: release + if over { 200_000 } else { 5_000 },
                    duration_ns: if over { 900_000 } else { 300_000 },
                    flags,
                });
                written.store(k + 1, Ordering::Release);
                if k % 100 == 99 {
                    std::thread::sleep(Duration::from_micros(500));
                }
            }
            done.store(true, Ordering::Release);
            w
        })
    };

    let mut counting = false;
    let mut counted_from = (0, 0);
    let mut allocations_before = 0;
    loop {
        let finished = done.load(Ordering::Acquire);
        let t = now();
        watcher.tick(t, &mut sink);
        s.poll(t, watcher.current(), &mut sink);
        if !counting
            && written.load(Ordering::Acquire) >= WARM_UP_RECORDS
            && sink.snapshots > 0
            && watcher
                .current()
                .is_some_and(|m| !m.engine_sha256.is_empty())
        {
            counting = true;
            counted_from = (written.load(Ordering::Acquire), sink.events);
            allocations_before = ALLOCATOR.allocations_on_this_thread();
        }
        if finished {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // One more poll after a snapshot interval, so the last snapshot holds every cycle.
    std::thread::sleep(Duration::from_millis(15));
    let t = now();
    watcher.tick(t, &mut sink);
    s.poll(t, watcher.current(), &mut sink);
    let allocations = ALLOCATOR.allocations_on_this_thread() - allocations_before;
    let w = producer.join().unwrap();

    assert!(counting, "warm-up never completed");
    let cycles_counted = RECORDS - counted_from.0;
    assert!(cycles_counted >= 100_000, "{cycles_counted} cycles counted");
    let events_counted = sink.events - counted_from.1;
    println!(
        "{allocations} allocations over {cycles_counted} cycles and {events_counted} events \
         ({} snapshots, {} bursts, {} fallbacks in all)",
        sink.snapshots, sink.bursts, sink.fallbacks
    );
    assert_eq!(allocations, 0, "allocations in steady state");
    assert!(
        events_counted > 100,
        "{events_counted} events in the counted phase"
    );
    assert!(sink.bursts >= 30, "{} bursts", sink.bursts);
    assert!(sink.autonomy > 10, "{} autonomy snapshots", sink.autonomy);
    assert!(sink.keeps > 100, "{} states kept", sink.keeps);
    assert_eq!(sink.fallback_total, RECORDS / 1000);
    assert_eq!(
        sink.last_cycles, RECORDS,
        "the last snapshot holds every cycle"
    );
    assert_eq!(sink.last_misses, misses.load(Ordering::Relaxed));
    assert_eq!(sink.last_deadline_misses, misses.load(Ordering::Relaxed));
    drop(w);
}

//! The deadline sampler against probe files written in-process through `loop_probe::ProbeWriter`:
//! exact counters, safety events, model and mode attribution.

use edgewatch_proto::v1::{self, BurstRule, ProbeState, Tier, event::Kind};
use edgewatch_samplers::CollectingSink;
use edgewatch_samplers::deadline::{DeadlineSampler, LoopState};
use loop_probe::{AutonomyMode, Cycle, DeadlineSemantics, ProbeWriter, WriterConfig};

use crate::util::{config, now, picked, probe, scratch, states};

/// Writes `n` cycles starting at cycle number `from`, one period apart from `base_ns`; cycles in
/// `over` run twice the budget.
pub fn write_cycles(w: &mut ProbeWriter, base_ns: u64, from: u64, n: u64, over: &[u64]) {
    let (period, budget) = (1_000_000, 800_000);
    for k in from..from + n {
        let release = base_ns + k * period;
        let duration = if over.contains(&k) {
            2 * budget
        } else {
            budget / 2
        };
        w.record(&Cycle {
            cycle: k,
            release_ns: release,
            start_ns: release + 10_000,
            duration_ns: duration,
            flags: 0,
        });
    }
}

pub fn writer(path: &std::path::Path, name: &str, capacity: u32) -> ProbeWriter {
    let mut wc = WriterConfig::new(7, name, 1_000_000, 800_000);
    wc.capacity = capacity;
    ProbeWriter::create(path, &wc).unwrap()
}

fn counters(sink: &CollectingSink) -> Vec<&v1::DeadlineCounters> {
    picked(sink, Tier::Slo, |k| match k {
        Kind::DeadlineCounters(c) => Some(c),
        _ => None,
    })
    .collect()
}

#[test]
fn counters_match_the_header_exactly_even_when_the_ring_overruns() {
    let dir = scratch();
    let path = dir.path().join("a.probe");
    let mut s = DeadlineSampler::new(config(vec![probe(&path)], 1000.0, |_| {}), now());
    let mut sink = CollectingSink::default();
    s.poll(now(), None, &mut sink);
    assert_eq!(s.status(now()).next().unwrap().state, LoopState::Waiting);
    assert!(
        sink.events.is_empty(),
        "a probe not yet started is no anomaly"
    );

    let mut w = writer(&path, "steer", 16);
    // The reader opens at the oldest record still in the ring; open it before the overrun.
    s.poll(now(), None, &mut sink);
    let base = now().monotonic_ns;
    let over: Vec<u64> = (0..1000).filter(|k| k % 10 == 0).collect();
    write_cycles(&mut w, base, 0, 1000, &over);
    s.poll(now(), None, &mut sink);
    let overrun: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::ProbeStatus(p) if p.state() == ProbeState::RingOverrun => Some(p),
        _ => None,
    })
    .collect();
    assert_eq!(overrun.len(), 1);
    assert_eq!(overrun[0].lost_records, 1000 - 16);
    let first = counters(&sink);
    assert_eq!(first.len(), 1, "a new series is reported at once");
    assert_eq!((first[0].cycles, first[0].misses), (1000, 100));
    assert_eq!(first[0].producer_epoch, w.handle().epoch());
    assert_eq!(
        (first[0].period_ns, first[0].budget_ns),
        (1_000_000, 800_000)
    );

    // Two activations skipped (1002 and 1003), then 500 more cycles, again overrunning.
    write_cycles(&mut w, base, 1000, 2, &[]);
    write_cycles(&mut w, base, 1004, 498, &[]);
    s.poll(now(), None, &mut sink);
    drop(w);
    s.poll(now(), None, &mut sink);
    assert_eq!(states(&sink, "steer").last(), Some(&ProbeState::Died));
    let last = *counters(&sink).last().unwrap();
    assert_eq!((last.cycles, last.misses, last.skipped), (1500, 100, 2));
    let h = last.response_time.as_ref().unwrap();
    assert_eq!(h.counts.len(), h.bounds_ns.len() + 1);
    assert_eq!(
        h.counts.iter().sum::<u64>(),
        16 + 16,
        "the histogram counts the records read"
    );
    assert_eq!(last.max_duration_ns, 1_600_000);
    let st = s.status(now()).next().unwrap();
    assert_eq!(st.state, LoopState::Dead);
    assert_eq!(st.counts.lost_records, 984 + 484);
}

#[test]
fn header_counters_model_versions_and_modes_become_safety_events_and_split_series() {
    let dir = scratch();
    let path = dir.path().join("a.probe");
    let mut raw = probe(&path);
    raw.model_name = Some("planner".into());
    let mut s = DeadlineSampler::new(config(vec![raw], 1000.0, |_| {}), now());
    let mut sink = CollectingSink::default();
    let mut w = writer(&path, "plan", 4096);
    let h = w.handle().clone();
    let base = now().monotonic_ns;
    h.set_model_version(0xa1, "1.0").unwrap();
    h.set_autonomy(AutonomyMode::Autonomous, now().monotonic_ns)
        .unwrap();
    write_cycles(&mut w, base, 0, 100, &[]);
    s.poll(now(), None, &mut sink);
    h.count_fallback();
    h.count_fallback();
    h.count_intervention();
    h.count_safe_stop();
    s.poll(now(), None, &mut sink);
    h.count_fallback();
    s.poll(now(), None, &mut sink);
    h.set_model_version(0xa2, "2.0").unwrap();
    write_cycles(&mut w, base, 100, 50, &[110, 120, 130, 140, 141]);
    s.poll(now(), None, &mut sink);
    h.set_autonomy(AutonomyMode::Manual, now().monotonic_ns)
        .unwrap();
    s.poll(now(), None, &mut sink);
    drop((w, h));
    s.poll(now(), None, &mut sink);

    let fallbacks: Vec<(u64, u64)> = picked(&sink, Tier::Safety, |k| match k {
        Kind::SafetyFallback(f) => Some(f),
        _ => None,
    })
    .map(|f| (f.total, f.delta))
    .collect();
    assert_eq!(fallbacks, vec![(2, 2), (3, 1)]);
    let interventions: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::Intervention(i) => Some(i),
        _ => None,
    })
    .collect();
    assert_eq!(interventions.len(), 1);
    assert_eq!((interventions[0].total, interventions[0].delta), (1, 1));
    assert_eq!(interventions[0].mode(), v1::AutonomyMode::Autonomous);
    assert_eq!(interventions[0].model.as_ref().unwrap().version, "1.0");
    let stops = picked(&sink, Tier::Safety, |k| match k {
        Kind::SafeStop(x) => Some(x),
        _ => None,
    })
    .count();
    assert_eq!(stops, 1);

    let changes: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::ModelVersionChange(c) => Some(c),
        _ => None,
    })
    .collect();
    assert_eq!(changes.len(), 1, "the first model is no change");
    let c = changes[0];
    assert_eq!(c.control_loop.as_ref().unwrap().loop_name, "plan");
    let (p, n) = (c.previous.as_ref().unwrap(), c.current.as_ref().unwrap());
    assert_eq!(
        (p.name.as_str(), p.version.as_str(), p.id_hash),
        ("planner", "1.0", 0xa1)
    );
    assert_eq!((n.version.as_str(), n.id_hash), ("2.0", 0xa2));
    assert_eq!(n.source(), v1::ModelSource::Probe);

    let modes: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::AutonomyModeChange(m) => Some(m),
        _ => None,
    })
    .map(|m| (m.previous(), m.current()))
    .collect();
    assert_eq!(
        modes,
        vec![(v1::AutonomyMode::Autonomous, v1::AutonomyMode::Manual)]
    );

    // Final values per model version.
    let mut last = std::collections::BTreeMap::new();
    for c in counters(&sink) {
        last.insert(
            c.model.as_ref().unwrap().version.clone(),
            (c.cycles, c.misses),
        );
    }
    assert_eq!(last["1.0"], (100, 0));
    assert_eq!(last["2.0"], (50, 5));
    let mut auto = std::collections::BTreeMap::new();
    for a in picked(&sink, Tier::Slo, |k| match k {
        Kind::AutonomySeconds(a) => Some(a),
        _ => None,
    }) {
        assert_eq!(a.modes.len(), 4);
        auto.insert(a.model.as_ref().unwrap().version.clone(), a.modes.clone());
    }
    let secs =
        |v: &str, m: v1::AutonomyMode| auto[v].iter().find(|x| x.mode() == m).unwrap().seconds;
    assert!(secs("1.0", v1::AutonomyMode::Autonomous) > 0.0);
    assert!(secs("2.0", v1::AutonomyMode::Manual) > 0.0);
    assert_eq!(secs("1.0", v1::AutonomyMode::Manual), 0.0);
}

#[test]
fn misses_in_a_row_and_misses_in_a_window_are_reported_as_bursts() {
    let dir = scratch();
    let path = dir.path().join("a.probe");
    let mut s = DeadlineSampler::new(config(vec![probe(&path)], 1000.0, |_| {}), now());
    let mut sink = CollectingSink::default();
    let mut w = writer(&path, "steer", 4096);
    let base = now().monotonic_ns;
    write_cycles(&mut w, base, 0, 200, &[10, 11, 12, 13, 50, 60, 70, 150]);
    s.poll(now(), None, &mut sink);
    let bursts: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::DeadlineMissBurst(b) => Some(b),
        _ => None,
    })
    .collect();
    assert_eq!(bursts.len(), 2, "one per rule");
    let c = bursts
        .iter()
        .find(|b| b.rule() == BurstRule::Consecutive)
        .unwrap();
    assert_eq!((c.misses, c.first_cycle, c.last_cycle), (4, 10, 13));
    assert_eq!((c.window_cycles, c.worst_duration_ns), (3, 1_600_000));
    let w_ = bursts
        .iter()
        .find(|b| b.rule() == BurstRule::Window)
        .unwrap();
    assert_eq!((w_.misses, w_.first_cycle, w_.last_cycle), (7, 10, 70));
    assert_eq!(w_.control_loop.as_ref().unwrap().loop_name, "steer");
}

#[test]
fn bursts_closer_than_the_minimum_interval_are_merged_not_dropped() {
    let dir = scratch();
    let path = dir.path().join("a.probe");
    let cfg = config(vec![probe(&path)], 1000.0, |d| {
        d.burst_min_interval_s = Some(3600.0);
        d.burst_window_misses = Some(64);
    });
    let mut s = DeadlineSampler::new(cfg, now());
    let mut sink = CollectingSink::default();
    let mut w = writer(&path, "steer", 4096);
    let base = now().monotonic_ns;
    for round in 0..5u64 {
        let from = round * 100;
        write_cycles(&mut w, base, from, 100, &[from + 1, from + 2, from + 3]);
        s.poll(now(), None, &mut sink);
    }
    drop(w);
    s.poll(now(), None, &mut sink);
    let bursts: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::DeadlineMissBurst(b) => Some(b),
        _ => None,
    })
    .collect();
    assert_eq!(
        bursts.len(),
        2,
        "the first at once, the rest merged into the last"
    );
    assert_eq!(bursts.iter().map(|b| b.misses).sum::<u64>(), 15);
    assert_eq!((bursts[1].first_cycle, bursts[1].last_cycle), (101, 403));
}

#[test]
fn a_miss_run_spanning_two_polls_is_one_report() {
    let dir = scratch();
    let path = dir.path().join("a.probe");
    let cfg = config(vec![probe(&path)], 1000.0, |d| {
        d.burst_min_interval_s = Some(1.0);
    });
    let mut s = DeadlineSampler::new(cfg, now());
    let mut sink = CollectingSink::default();
    let mut w = writer(&path, "steer", 4096);
    let base = now().monotonic_ns;
    write_cycles(&mut w, base, 0, 14, &[10, 11, 12, 13]);
    s.poll(now(), None, &mut sink);
    write_cycles(&mut w, base, 14, 10, &[14, 15]);
    s.poll(now(), None, &mut sink);
    let bursts: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::DeadlineMissBurst(b) if b.rule() == BurstRule::Consecutive => Some(b),
        _ => None,
    })
    .map(|b| (b.first_cycle, b.last_cycle, b.misses))
    .collect();
    assert_eq!(bursts, vec![(10, 15, 6)]);
}

#[test]
fn an_abi_1_probe_is_sampled_with_its_loop_reported_as_legacy_semantics() {
    let dir = scratch();
    let path = dir.path().join("old.probe");
    // The agent starts first, so it counts the producer from its start.
    let mut s = DeadlineSampler::new(config(vec![probe(&path)], 1000.0, |_| {}), now());
    let mut w = writer(&path, "old", 4096);
    let base = now().monotonic_ns;
    write_cycles(&mut w, base, 0, 100, &[10, 11, 12, 50]);
    write_cycles(&mut w, base, 102, 98, &[]);
    drop(w);
    // What an ABI 1 producer leaves: version 1, and the deadline and the summary's deadline
    // misses (words ABI 1 reserved) zero.
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&1u32.to_ne_bytes(), 8).unwrap();
    f.write_all_at(&0u64.to_ne_bytes(), 112).unwrap();
    f.write_all_at(&[0u8; 16], 232).unwrap();

    let mut sink = CollectingSink::default();
    s.poll(now(), None, &mut sink);
    s.poll(now(), None, &mut sink);
    assert_eq!(states(&sink, "old").last(), Some(&ProbeState::Died));
    let last = *counters(&sink).last().unwrap();
    assert_eq!(last.semantics(), v1::DeadlineSemantics::LegacyProbe);
    assert_eq!((last.cycles, last.misses, last.skipped), (198, 4, 2));
    assert_eq!(
        (last.activations, last.overruns, last.deadline_misses),
        (Some(200), Some(4), None),
        "activations and overruns are exact; deadline misses absent, never the overruns"
    );
    assert_eq!(last.deadline_ns, 0);
    let st = s.status(now()).next().unwrap();
    assert_eq!(st.semantics, DeadlineSemantics::Legacy);
    assert_eq!(st.counts.deadline_misses, None);
    // Bursts of such a loop count overruns, as before deadlines, and say so.
    let bursts: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::DeadlineMissBurst(b) => Some(b),
        _ => None,
    })
    .collect();
    assert!(!bursts.is_empty());
    assert!(
        bursts
            .iter()
            .all(|b| b.semantics() == v1::DeadlineSemantics::LegacyProbe)
    );
}

#[test]
fn counters_carry_activations_deadline_misses_and_overruns_under_their_own_names() {
    let dir = scratch();
    let path = dir.path().join("a.probe");
    let mut s = DeadlineSampler::new(config(vec![probe(&path)], 1000.0, |_| {}), now());
    let mut sink = CollectingSink::default();
    let mut w = writer(&path, "steer", 4096);
    let base = now().monotonic_ns;
    // Overruns within the deadline: 0.9 ms of a 0.8 ms budget, done 0.91 ms after release.
    for k in 0..20u64 {
        let release = base + k * 1_000_000;
        let late = k == 7;
        w.record(&Cycle {
            cycle: k,
            release_ns: release,
            // Cycle 7 starts 0.95 ms late: done past its 1 ms deadline, within its budget.
            start_ns: release + if late { 950_000 } else { 10_000 },
            duration_ns: if k % 5 == 0 { 900_000 } else { 100_000 },
            flags: 0,
        });
    }
    // Two skipped activations (20, 21).
    write_cycles(&mut w, base, 22, 8, &[]);
    drop(w);
    s.poll(now(), None, &mut sink);
    s.poll(now(), None, &mut sink);
    let last = *counters(&sink).last().unwrap();
    assert_eq!(last.semantics(), v1::DeadlineSemantics::Completion);
    assert_eq!(last.deadline_ns, 1_000_000);
    assert_eq!(
        (last.activations, last.deadline_misses, last.overruns),
        (Some(30), Some(3), Some(4)),
        "one late completion and two skipped activations; four overruns, all on time"
    );
    assert_eq!(
        (last.cycles, last.misses, last.skipped),
        (28, 4, 2),
        "the old fields keep their old meaning"
    );
}

#[test]
fn a_flush_emits_every_series_and_a_new_sampler_continues_them_from_the_kept_state() {
    let dir = scratch();
    let path = dir.path().join("k.probe");
    // Snapshots far apart: only the first value of a series is reported before the flush.
    let cfg = || config(vec![probe(&path)], 3600.0, |_| {});
    let mut s = DeadlineSampler::new(cfg(), now());
    let mut sink = CollectingSink::default();
    let mut w = writer(&path, "steer", 4096);
    s.poll(now(), None, &mut sink);
    let base = now().monotonic_ns;
    write_cycles(&mut w, base, 0, 10, &[]);
    s.poll(now(), None, &mut sink);
    write_cycles(&mut w, base, 10, 90, &[50, 51]);
    s.poll(now(), None, &mut sink);
    assert_eq!(
        counters(&sink).last().unwrap().cycles,
        10,
        "not yet reported"
    );

    // The agent stops: a last read, then every series, due or not.
    s.flush(now(), None, &mut sink);
    let last = counters(&sink).last().copied().unwrap().clone();
    assert_eq!((last.cycles, last.overruns), (100, Some(2)));
    let key = DeadlineSampler::state_key(&path);
    let kept = sink
        .kept
        .get(&key)
        .expect("the loop's state is kept")
        .clone();

    // While the agent is down the loop runs on; the next agent continues the same series.
    write_cycles(&mut w, base, 100, 50, &[120]);
    let mut s = DeadlineSampler::new(cfg(), now());
    s.restore(|k| (k == key).then_some(kept.as_slice()));
    let mut sink = CollectingSink::default();
    s.poll(now(), None, &mut sink);
    s.flush(now(), None, &mut sink);
    let resumed = counters(&sink).last().copied().unwrap().clone();
    assert_eq!((resumed.cycles, resumed.overruns), (150, Some(3)));
    assert_eq!(resumed.start_time_unix_ns, last.start_time_unix_ns);
    assert_eq!(resumed.activations, Some(150));
    let histogram: u64 = resumed.response_time.unwrap().counts.iter().sum();
    assert_eq!(
        histogram, 150,
        "records read before the restart are not counted again"
    );
    assert!(
        !states(&sink, "steer").contains(&ProbeState::Restarted),
        "the same producer is no restart"
    );
}

#[test]
fn a_probe_path_of_any_length_keeps_its_state_under_a_short_distinct_key() {
    let short = DeadlineSampler::state_key(std::path::Path::new("/dev/shm/steer.probe"));
    assert_eq!(short, "deadline//dev/shm/steer.probe");
    let long = |tail: &str| format!("/dev/shm/{}é/{tail}.probe", "a".repeat(300));
    let a = DeadlineSampler::state_key(std::path::Path::new(&long("steer")));
    let b = DeadlineSampler::state_key(std::path::Path::new(&long("plan")));
    assert_ne!(a, b);
    // The queue's key-value area takes keys of at most 256 bytes.
    assert!(a.len() <= 256 && b.len() <= 256, "{} {}", a.len(), b.len());
    assert!(a.ends_with("steer.probe"));
}

//! Writer and reader on real files: layout on disk, counters, liveness, restart.

use std::os::unix::fs::{FileExt, PermissionsExt};

use loop_probe::{
    AutonomyMode, DeadlineSemantics, FLAG_DEADLINE_MISS, FLAG_FALLBACK, FLAG_OVERRUN, FLAG_SKIPPED,
    Liveness, ProbeReader, ProbeWriter, Record, RestartReason, clock::monotonic_ns,
};

use crate::util::{BUDGET, PERIOD, config, cycle, probe_path, scratch};

fn drain(r: &mut ProbeReader) -> Vec<Record> {
    let mut out = Vec::new();
    r.poll(monotonic_ns(), &mut |rec: &Record| out.push(*rec))
        .unwrap();
    out
}

#[test]
fn the_file_is_mode_0640_and_the_agent_maps_it_read_only_and_shared() {
    let dir = scratch();
    let path = probe_path(&dir);
    let _w = ProbeWriter::create(&path, &config(64)).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["loop.probe"], "no temporary file left behind");

    let r = ProbeReader::open(&path).unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let canonical = path.canonicalize().unwrap();
    let lines: Vec<&str> = maps
        .lines()
        .filter(|l| l.ends_with(canonical.to_str().unwrap()))
        .collect();
    // The writer's mapping (rw-s) and the reader's (r--s) of the same file.
    assert!(
        lines
            .iter()
            .any(|l| l.split_whitespace().nth(1) == Some("r--s")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.split_whitespace().nth(1) == Some("rw-s")),
        "{lines:?}"
    );
    assert_eq!(r.info().loop_name(), "steer");
}

#[test]
fn records_and_counters_written_are_read_back() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w = ProbeWriter::create(&path, &config(64)).unwrap();
    let mut r = ProbeReader::open(&path).unwrap();
    assert_eq!(r.info().loop_id, 7);
    assert_eq!(r.info().period_ns, PERIOD);
    assert_eq!(r.info().budget_ns, BUDGET);
    assert_eq!(r.info().capacity, 64);
    assert_eq!(r.info().pid, std::process::id());
    assert_ne!(r.info().epoch, 0);
    assert_eq!(r.model_version().unwrap(), None);
    assert_eq!(r.autonomy().unwrap().mode, AutonomyMode::Unknown);

    let h = w.handle().clone();
    let t0 = monotonic_ns();
    h.set_autonomy(AutonomyMode::Autonomous, t0).unwrap();
    h.set_model_version(0xabcdef, "planner-2.4.0").unwrap();
    for i in 0..20u64 {
        if i == 13 {
            continue;
        }
        let mut c = cycle(i, if i % 5 == 0 { BUDGET + 1 } else { BUDGET - 1 });
        if i == 7 {
            c.flags = FLAG_FALLBACK;
            h.count_fallback();
        }
        w.record(&c);
    }
    h.count_intervention();
    h.count_safe_stop();
    h.set_autonomy(AutonomyMode::Manual, t0 + 5_000_000)
        .unwrap();

    let recs = drain(&mut r);
    assert_eq!(recs.len(), 19);
    assert_eq!(
        recs.iter().filter(|r| r.flags & FLAG_OVERRUN != 0).count(),
        4
    );
    assert_eq!(recs[7].flags, FLAG_FALLBACK);
    assert_eq!(recs[13].cycle, 14);
    assert_eq!(recs[13].flags & FLAG_SKIPPED, FLAG_SKIPPED);
    let s = r.summary().unwrap();
    assert_eq!(s.head, 19);
    assert_eq!(s.cycles.cycles, 19);
    assert_eq!(s.cycles.overruns, 4);
    assert_eq!(s.cycles.skipped, 1);
    assert_eq!(s.cycles.max_duration_ns, BUDGET + 1);
    assert_eq!(s.events.fallbacks, 1);
    assert_eq!(s.events.interventions, 1);
    assert_eq!(s.events.safe_stops, 1);
    let m = r.model_version().unwrap().unwrap();
    assert_eq!((m.id_hash, m.version()), (0xabcdef, "planner-2.4.0"));
    let a = r.autonomy().unwrap();
    assert_eq!(a.mode, AutonomyMode::Manual);
    assert_eq!(
        a.total_ns(AutonomyMode::Autonomous, t0 + 9_000_000),
        5_000_000
    );
    assert_eq!(r.liveness(monotonic_ns()).unwrap(), Liveness::Alive);
}

#[test]
fn a_read_pass_reads_what_the_reader_methods_read() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w = ProbeWriter::create(&path, &config(64)).unwrap();
    let h = w.handle().clone();
    h.set_model_version(0x42, "perception-1.2").unwrap();
    h.set_autonomy(AutonomyMode::Autonomous, monotonic_ns())
        .unwrap();
    for i in 0..10u64 {
        w.record(&cycle(i, if i == 4 { BUDGET + 1 } else { 1 }));
    }
    let mut by_pass = ProbeReader::open(&path).unwrap();
    let mut by_calls = ProbeReader::open(&path).unwrap();
    let mut pass = by_pass.pass().unwrap();
    let mut pass_records = Vec::new();
    let pass_stats = pass
        .poll(monotonic_ns(), &mut |rec| pass_records.push(*rec))
        .unwrap();
    let (pass_summary, pass_model, pass_mode) = (
        pass.summary().unwrap(),
        pass.model_version().unwrap().unwrap(),
        pass.autonomy().unwrap().mode,
    );
    let mut call_records = Vec::new();
    let call_stats = by_calls
        .poll(monotonic_ns(), &mut |rec| call_records.push(*rec))
        .unwrap();
    assert_eq!(pass_records, call_records);
    assert_eq!(pass_stats.new_records, 10);
    assert_eq!(pass_stats.new_records, call_stats.new_records);
    assert_eq!(pass_summary, by_calls.summary().unwrap());
    assert_eq!(pass_summary.cycles.overruns, 1);
    assert_eq!(pass_model.version(), "perception-1.2");
    assert_eq!(pass_mode, AutonomyMode::Autonomous);
    // The pass advanced its reader's cursor like a poll does.
    assert_eq!(drain(&mut by_pass).len(), 0);
}

#[test]
fn a_reader_opened_late_starts_at_the_oldest_record_still_in_the_ring() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w = ProbeWriter::create(&path, &config(8)).unwrap();
    for i in 0..20 {
        w.record(&cycle(i, 1));
    }
    let mut r = ProbeReader::open(&path).unwrap();
    let recs = drain(&mut r);
    assert_eq!(
        recs.iter().map(|r| r.cycle).collect::<Vec<_>>(),
        (12..20).collect::<Vec<_>>()
    );
    assert_eq!(r.totals().lost, 0);
    for i in 20..40 {
        w.record(&cycle(i, 1));
    }
    let recs = drain(&mut r);
    assert_eq!(recs.len(), 8);
    assert_eq!(r.totals().lost, 12);
}

#[test]
fn a_live_producer_cannot_be_replaced() {
    let dir = scratch();
    let path = probe_path(&dir);
    let _w = ProbeWriter::create(&path, &config(8)).unwrap();
    let err = ProbeWriter::create(&path, &config(8)).unwrap_err();
    match err {
        loop_probe::CreateError::AlreadyRunning { pid, .. } => assert_eq!(pid, std::process::id()),
        other => panic!("expected AlreadyRunning, got {other}"),
    }
}

#[test]
fn a_dropped_writer_is_seen_dead_and_its_records_stay_readable() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w = ProbeWriter::create(&path, &config(8)).unwrap();
    let r0 = ProbeReader::open(&path).unwrap();
    assert_eq!(r0.liveness(monotonic_ns()).unwrap(), Liveness::Alive);
    for i in 0..5 {
        w.record(&cycle(i, 1));
    }
    drop(w);
    let mut r = ProbeReader::open(&path).unwrap();
    assert_eq!(r.liveness(monotonic_ns()).unwrap(), Liveness::Dead);
    assert_eq!(r0.liveness(monotonic_ns()).unwrap(), Liveness::Dead);
    assert_eq!(drain(&mut r).len(), 5);
    assert_eq!(r.summary().unwrap().cycles.cycles, 5);
}

#[test]
fn a_new_producer_is_seen_as_a_restart_and_reopen_follows_it() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w1 = ProbeWriter::create(&path, &config(8)).unwrap();
    w1.record(&cycle(0, 1));
    let mut r = ProbeReader::open(&path).unwrap();
    let old_epoch = r.info().epoch;
    assert_eq!(drain(&mut r).len(), 1);
    drop(w1);
    let mut w2 = ProbeWriter::create(&path, &config(8)).unwrap();
    w2.record(&cycle(100, 1));
    w2.record(&cycle(101, 1));
    assert_eq!(
        r.liveness(monotonic_ns()).unwrap(),
        Liveness::Restarted(RestartReason::NewInode)
    );
    r.reopen().unwrap();
    assert_ne!(r.info().epoch, old_epoch);
    assert_eq!(w2.handle().epoch(), r.info().epoch);
    let cycles: Vec<u64> = drain(&mut r).iter().map(|r| r.cycle).collect();
    assert_eq!(cycles, vec![100, 101]);
    assert_eq!(r.liveness(monotonic_ns()).unwrap(), Liveness::Alive);
}

#[test]
fn the_lighter_liveness_check_sees_a_new_file_once_the_old_producer_is_gone() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w1 = ProbeWriter::create(&path, &config(8)).unwrap();
    w1.record(&cycle(0, 1));
    let r = ProbeReader::open(&path).unwrap();
    // A second file takes the path while the first producer still holds its lock.
    let aside = dir.path().join("first.probe");
    std::fs::rename(&path, &aside).unwrap();
    let mut w2 = ProbeWriter::create(&path, &config(8)).unwrap();
    w2.record(&cycle(100, 1));
    let now = monotonic_ns();
    assert!(matches!(
        r.liveness_while_locked(now).unwrap(),
        Liveness::Alive | Liveness::Stalled { .. }
    ));
    assert_eq!(
        r.liveness(now).unwrap(),
        Liveness::Restarted(RestartReason::NewInode)
    );
    drop(w1);
    assert_eq!(
        r.liveness_while_locked(now).unwrap(),
        Liveness::Restarted(RestartReason::NewInode)
    );
    // Without a new file, a released lock is a death.
    std::fs::remove_file(&path).unwrap();
    std::fs::rename(&aside, &path).unwrap();
    assert_eq!(r.liveness_while_locked(now).unwrap(), Liveness::Dead);
}

#[test]
fn a_heartbeat_older_than_three_periods_is_a_stall() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w = ProbeWriter::create(&path, &config(8)).unwrap();
    let c = cycle(0, 1000);
    w.record(&c);
    let r = ProbeReader::open(&path).unwrap();
    let hb = c.start_ns + c.duration_ns;
    assert_eq!(r.summary().unwrap().heartbeat_ns, hb);
    assert_eq!(r.liveness(hb + 3 * PERIOD).unwrap(), Liveness::Alive);
    assert_eq!(
        r.liveness(hb + 3 * PERIOD + 1).unwrap(),
        Liveness::Stalled {
            heartbeat_age_ns: 3 * PERIOD + 1
        }
    );
    // A clock behind the heartbeat is not a stall.
    assert_eq!(r.liveness(hb - 1).unwrap(), Liveness::Alive);
}

#[test]
fn setters_on_other_threads_do_not_disturb_recording() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w = ProbeWriter::create(&path, &config(1024)).unwrap();
    let h = w.handle().clone();
    let t = std::thread::spawn(move || {
        let mut busy = 0u32;
        for i in 0..500u64 {
            let mode = if i % 2 == 0 {
                AutonomyMode::Autonomous
            } else {
                AutonomyMode::Teleoperated
            };
            busy += u32::from(h.set_autonomy(mode, monotonic_ns()).is_err());
            h.count_intervention();
        }
        busy
    });
    for i in 0..1000 {
        w.record(&cycle(i, 1));
    }
    let busy = t.join().unwrap();
    assert_eq!(busy, 0, "a single setter thread never collides with itself");
    let mut r = ProbeReader::open(&path).unwrap();
    assert_eq!(drain(&mut r).len(), 1000);
    let s = r.summary().unwrap();
    assert_eq!(s.cycles.cycles, 1000);
    assert_eq!(s.events.interventions, 500);
    let a = r.autonomy().unwrap();
    assert_eq!(a.mode, AutonomyMode::Teleoperated);
    // Every nanosecond from start to the last switch is credited to exactly one mode.
    assert_eq!(
        a.ns_in_mode.iter().sum::<u64>(),
        a.since_ns - r.info().start_ns
    );
}

#[test]
fn the_declared_deadline_is_in_the_header_and_judges_every_completion() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut c = config(64);
    c.deadline_ns = PERIOD / 2;
    let mut w = ProbeWriter::create(&path, &c).unwrap();
    let mut r = ProbeReader::open(&path).unwrap();
    assert_eq!(r.info().deadline_ns, Some(PERIOD / 2));
    assert_eq!(r.info().abi_version, 2);
    assert_eq!(r.info().semantics(), DeadlineSemantics::Completion);
    // cycle() starts 10 µs after the release: 0.3 ms meets D = 0.5 ms, 0.6 ms does not.
    w.record(&cycle(0, 300_000));
    let late = cycle(1, 600_000);
    w.record(&late);
    w.record(&cycle(4, 300_000));
    let recs = drain(&mut r);
    let flags: Vec<u32> = recs.iter().map(|r| r.flags).collect();
    assert_eq!(
        flags,
        vec![0, FLAG_OVERRUN | FLAG_DEADLINE_MISS, FLAG_SKIPPED]
    );
    let s = r.summary().unwrap();
    assert_eq!(s.semantics, DeadlineSemantics::Completion);
    assert_eq!(
        (s.cycles.activations, s.deadline_misses(), s.cycles.overruns),
        (5, Some(3), 1),
        "one late completion and two skipped activations"
    );
    assert_eq!(s.last_record.map(|r| r.cycle), Some(4));

    let dir2 = scratch();
    let implicit = ProbeWriter::create(probe_path(&dir2), &config(8)).unwrap();
    let r2 = ProbeReader::open(probe_path(&dir2)).unwrap();
    assert_eq!(r2.info().deadline_ns, Some(PERIOD), "0 declares the period");
    drop(implicit);
}

#[test]
fn an_abi_1_probe_file_is_still_read_with_its_loop_reported_as_legacy_semantics() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w = ProbeWriter::create(&path, &config(64)).unwrap();
    for i in 0..10u64 {
        if i == 4 {
            continue;
        }
        let mut c = cycle(i, if i % 3 == 0 { BUDGET + 1 } else { 1 });
        if i == 7 {
            // Completes past its deadline; an ABI 1 producer never judged that.
            c.start_ns = c.release_ns + PERIOD;
        }
        w.record(&c);
    }
    drop(w);
    // What an ABI 1 producer leaves: the same offsets, version 1, and the words ABI 2 added
    // (the deadline at 112, each summary copy's deadline misses at 232 and 240) reserved, zero.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&1u32.to_ne_bytes(), 8).unwrap();
    f.write_all_at(&0u64.to_ne_bytes(), 112).unwrap();
    f.write_all_at(&[0u8; 16], 232).unwrap();

    let mut r = ProbeReader::open(&path).unwrap();
    assert_eq!(r.info().abi_version, 1);
    assert_eq!(r.info().deadline_ns, None);
    assert_eq!(r.info().semantics(), DeadlineSemantics::Legacy);
    let s = r.summary().unwrap();
    assert_eq!(s.semantics, DeadlineSemantics::Legacy);
    assert_eq!(
        (
            s.cycles.cycles,
            s.cycles.skipped,
            s.cycles.activations,
            s.cycles.overruns
        ),
        (9, 1, 10, 4),
        "activations, skipped and overruns are exact"
    );
    assert_eq!(
        s.deadline_misses(),
        None,
        "deadline misses were never measured: absent, not the overruns"
    );
    assert_eq!(
        s.last_record.map(|l| l.cycle),
        Some(9),
        "the ring is the same in both ABIs"
    );
    assert_eq!(drain(&mut r).len(), 9);
    assert_eq!(r.liveness(monotonic_ns()).unwrap(), Liveness::Dead);
}

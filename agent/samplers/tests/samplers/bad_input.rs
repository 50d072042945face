//! Bad probe files and bad producers, with real files: each is a clear state and a counted,
//! rate-limited anomaly for its loop, while a good probe in the same sampler keeps being served.

use std::os::unix::fs::FileExt;
use std::path::Path;

use edgewatch_proto::v1::{ProbeState, ProbeStatus, Tier, event::Kind};
use edgewatch_samplers::CollectingSink;
use edgewatch_samplers::deadline::{DeadlineSampler, LoopState, RawProbeConfig};

use crate::probes::{write_cycles, writer};
use crate::util::{config, now, picked, probe, scratch};

fn anomalies<'a>(sink: &'a CollectingSink, path: &'a Path) -> Vec<&'a ProbeStatus> {
    let p = path.display().to_string();
    picked(sink, Tier::Safety, |k| match k {
        Kind::ProbeStatus(s) if s.state() == ProbeState::Anomaly => Some(s),
        _ => None,
    })
    .filter(|s| s.detail.contains(&p))
    .collect()
}

/// Cycles counted into the good loop's series.
fn good_cycles(s: &DeadlineSampler) -> u64 {
    s.trackers()
        .filter(|t| t.loop_name() == "good")
        .flat_map(|t| t.series().map(|(_, _, v)| v.cycles))
        .sum()
}

/// The bytes of a real probe file, to damage.
fn real_probe_bytes(dir: &Path) -> Vec<u8> {
    let p = dir.join("template.probe");
    let w = writer(&p, "steer", 16);
    let bytes = std::fs::read(&p).unwrap();
    drop(w);
    bytes
}

#[test]
fn truncated_garbage_wrong_magic_wrong_abi_and_misnamed_files_are_refused_and_others_served() {
    let dir = scratch();
    let d = dir.path();
    let real = real_probe_bytes(d);
    let mut garbage = vec![0u8; 8192];
    let mut x: u32 = 0x1234_5678;
    for b in &mut garbage {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    let mut wrong_abi = real.clone();
    wrong_abi[8..12].copy_from_slice(&99u32.to_ne_bytes());
    let mut bad_capacity = real.clone();
    bad_capacity[20..24].copy_from_slice(&3u32.to_ne_bytes());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", real[..100].to_vec(), "truncated"),
        ("garbage", garbage, "bad magic"),
        ("abi", wrong_abi, "unsupported ABI"),
        ("capacity", bad_capacity, "invalid field"),
        ("empty", Vec::new(), "truncated"),
    ];
    let good = d.join("good.probe");
    let mut probes = vec![probe(&good)];
    for (name, bytes, _) in &cases {
        let p = d.join(format!("{name}.probe"));
        std::fs::write(&p, bytes).unwrap();
        probes.push(probe(&p));
    }
    // A valid probe of another loop than configured.
    let misnamed = d.join("misnamed.probe");
    let _other = writer(&misnamed, "brake", 16);
    probes.push(RawProbeConfig {
        loop_name: Some("steer".into()),
        ..probe(&misnamed)
    });

    let mut s = DeadlineSampler::new(config(probes, 1000.0, |_| {}), now());
    let mut sink = CollectingSink::default();
    let mut w = writer(&good, "good", 1024);
    let base = now().monotonic_ns;
    for round in 0..20 {
        write_cycles(&mut w, base, round * 10, 10, &[]);
        s.poll(now(), None, &mut sink);
    }
    assert_eq!(good_cycles(&s), 200, "the good loop is served throughout");
    for (name, _, needle) in &cases {
        let p = d.join(format!("{name}.probe"));
        let a = anomalies(&sink, &p);
        assert_eq!(a.len(), 1, "{name}: one report for an unchanged bad file");
        assert!(a[0].detail.contains(needle), "{name}: {}", a[0].detail);
    }
    let a = anomalies(&sink, &misnamed);
    assert_eq!(a.len(), 1);
    assert!(a[0].detail.contains("loop name"), "{}", a[0].detail);
    let faulty = s
        .status(now())
        .filter(|l| l.state == LoopState::Faulty)
        .count();
    assert_eq!(faulty, cases.len() + 1);
    assert!(
        s.status(now())
            .filter(|l| l.state == LoopState::Faulty)
            .all(|l| l.problem.is_some())
    );

    // A bad file replaced by a good producer is picked up.
    let fixed = d.join("garbage.probe");
    let mut w2 = writer(&fixed, "fixed", 64);
    write_cycles(&mut w2, base, 0, 5, &[]);
    s.poll(now(), None, &mut sink);
    let st = s.status(now()).find(|l| l.path == fixed).unwrap();
    assert_eq!((st.state, st.counts.cycles), (LoopState::Alive, 5));
}

#[test]
fn a_file_that_shrinks_while_mapped_is_refused_without_a_fault() {
    let dir = scratch();
    let path = dir.path().join("a.probe");
    let good = dir.path().join("good.probe");
    let mut s = DeadlineSampler::new(
        config(vec![probe(&path), probe(&good)], 1000.0, |_| {}),
        now(),
    );
    let mut sink = CollectingSink::default();
    let mut w = writer(&path, "shrinking", 1024);
    let mut g = writer(&good, "good", 1024);
    let base = now().monotonic_ns;
    write_cycles(&mut w, base, 0, 10, &[]);
    s.poll(now(), None, &mut sink);
    // Only root or the owner can do this; the producer never does. It must not record again.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    for round in 0..5 {
        write_cycles(&mut g, base, round * 10, 10, &[]);
        s.poll(now(), None, &mut sink);
    }
    let a = anomalies(&sink, &path);
    assert_eq!(a.len(), 1);
    assert!(a[0].detail.contains("shrank"), "{}", a[0].detail);
    let st = s.status(now()).find(|l| l.path == path).unwrap();
    assert_eq!(st.state, LoopState::Faulty);
    assert_eq!(good_cycles(&s), 50);
    drop(w);
}

#[test]
fn nonsense_values_from_a_live_producer_are_counted_and_rate_limited_anomalies() {
    let dir = scratch();
    let path = dir.path().join("a.probe");
    let cfg = config(vec![probe(&path)], 1000.0, |d| {
        d.status_min_interval_s = Some(3600.0);
    });
    let mut s = DeadlineSampler::new(cfg, now());
    let mut sink = CollectingSink::default();
    let mut w = writer(&path, "liar", 1024);
    let base = now().monotonic_ns;
    write_cycles(&mut w, base, 0, 10, &[]);
    s.poll(now(), None, &mut sink);
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // Autonomy mode 99 (offset 328): no such mode.
    file.write_all_at(&99u64.to_ne_bytes(), 328).unwrap();
    for round in 1..50 {
        write_cycles(&mut w, base, round * 10, 10, &[]);
        s.poll(now(), None, &mut sink);
    }
    let a = anomalies(&sink, &path);
    assert_eq!(
        a.len(),
        1,
        "one report per interval, however many polls found it"
    );
    assert!(a[0].detail.contains("autonomy mode"), "{}", a[0].detail);
    let st = s.status(now()).next().unwrap();
    assert_eq!(st.counts.anomalies, 49);
    assert_eq!(st.counts.cycles, 500, "counting goes on beside a bad cell");

    // A model version length past its 64 bytes (offset 400; sequence 384 even and non-zero).
    file.write_all_at(&2u64.to_ne_bytes(), 384).unwrap();
    file.write_all_at(&200u64.to_ne_bytes(), 400).unwrap();
    // More misses than cycles in both summary copies (offsets 160 and 200).
    file.write_all_at(&u64::MAX.to_ne_bytes(), 160).unwrap();
    file.write_all_at(&u64::MAX.to_ne_bytes(), 200).unwrap();
    s.poll(now(), None, &mut sink);
    drop(w);
    s.poll(now(), None, &mut sink);
    let a = anomalies(&sink, &path);
    assert_eq!(
        a.len(),
        2,
        "the pending count is reported when the producer goes"
    );
    assert!(
        a[1].detail.contains("since the last report"),
        "{}",
        a[1].detail
    );
    let st = s.status(now()).next().unwrap();
    assert!(st.counts.anomalies >= 52, "{}", st.counts.anomalies);
    assert_eq!(
        st.counts.overruns, 0,
        "an implausible summary is not counted"
    );
}

//! Hostile and broken probe files: every one gives a typed error or a counted anomaly, never a
//! panic or a fault. Patches are made with `pwrite`, as a buggy producer would.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::Path;

use loop_probe::{
    Liveness, OpenError, PollError, ProbeReader, ProbeWriter, Record, RestartReason,
    clock::monotonic_ns,
};

use crate::util::{PERIOD, config, cycle, probe_path, scratch};

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

/// A finished probe file (its producer gone) with `n` records.
fn dead_probe(dir: &tempfile::TempDir, n: u64) -> std::path::PathBuf {
    let path = probe_path(dir);
    let mut w = ProbeWriter::create(&path, &config(8)).unwrap();
    for i in 0..n {
        w.record(&cycle(i, 1));
    }
    path
}

fn poll(r: &mut ProbeReader) -> Result<loop_probe::PollStats, PollError> {
    r.poll(monotonic_ns(), &mut |_: &Record| {})
}

#[test]
fn a_missing_file_is_an_io_error() {
    let dir = scratch();
    let err = ProbeReader::open(probe_path(&dir)).unwrap_err();
    assert!(
        matches!(err, OpenError::Io { op: "open", ref source, .. } if source.kind() == std::io::ErrorKind::NotFound),
        "{err}"
    );
}

#[test]
fn an_empty_file_is_too_small() {
    let dir = scratch();
    let path = probe_path(&dir);
    std::fs::write(&path, b"").unwrap();
    let err = ProbeReader::open(&path).unwrap_err();
    assert!(
        matches!(
            err,
            OpenError::TooSmall {
                len: 0,
                needed: 4096,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_file_shorter_than_its_header_is_too_small() {
    let dir = scratch();
    let path = dead_probe(&dir, 1);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    let err = ProbeReader::open(&path).unwrap_err();
    assert!(matches!(err, OpenError::TooSmall { len: 100, .. }), "{err}");
}

#[test]
fn garbage_is_refused_for_its_magic() {
    let dir = scratch();
    let path = probe_path(&dir);
    let garbage: Vec<u8> = (0..20_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&path, &garbage).unwrap();
    let err = ProbeReader::open(&path).unwrap_err();
    assert!(matches!(err, OpenError::BadMagic { .. }), "{err}");
}

#[test]
fn another_abi_version_is_unsupported() {
    let dir = scratch();
    let path = dead_probe(&dir, 1);
    for found in [0u32, 3] {
        patch(&path, 8, &found.to_ne_bytes());
        let err = ProbeReader::open(&path).unwrap_err();
        assert!(
            matches!(
                err,
                OpenError::UnsupportedAbi {
                    found: f,
                    supported: 2,
                    ..
                } if f == found
            ),
            "{err}"
        );
    }
}

#[test]
fn out_of_range_header_fields_are_named() {
    let cases: [(&str, u64, Vec<u8>); 8] = [
        ("header_size", 12, 512u32.to_ne_bytes().to_vec()),
        ("slot_size", 16, 32u32.to_ne_bytes().to_vec()),
        ("capacity", 20, 6u32.to_ne_bytes().to_vec()),
        ("capacity", 20, 0u32.to_ne_bytes().to_vec()),
        ("period_ns", 32, 0u64.to_ne_bytes().to_vec()),
        ("budget_ns", 40, 0u64.to_ne_bytes().to_vec()),
        ("deadline_ns", 112, 0u64.to_ne_bytes().to_vec()),
        (
            "deadline_ns",
            112,
            (PERIOD * 1000 + 1).to_ne_bytes().to_vec(),
        ),
    ];
    for (field, offset, bytes) in cases {
        let dir = scratch();
        let path = dead_probe(&dir, 1);
        patch(&path, offset, &bytes);
        let err = ProbeReader::open(&path).unwrap_err();
        assert!(
            matches!(err, OpenError::InvalidHeader { field: f, .. } if f == field),
            "{field}: {err}"
        );
    }
}

#[test]
fn a_ring_cut_short_is_too_small() {
    let dir = scratch();
    let path = dead_probe(&dir, 1);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096 + 64 * 7)
        .unwrap();
    let err = ProbeReader::open(&path).unwrap_err();
    assert!(
        matches!(err, OpenError::TooSmall { needed, .. } if needed == 4096 + 64 * 8),
        "{err}"
    );
}

#[test]
fn a_huge_capacity_claim_is_too_small_not_a_huge_mapping() {
    let dir = scratch();
    let path = dead_probe(&dir, 1);
    patch(&path, 20, &(1u32 << 20).to_ne_bytes());
    let err = ProbeReader::open(&path).unwrap_err();
    assert!(matches!(err, OpenError::TooSmall { .. }), "{err}");
}

#[test]
fn a_file_that_shrinks_while_mapped_is_refused_without_a_fault() {
    let dir = scratch();
    let path = dead_probe(&dir, 3);
    let mut r = ProbeReader::open(&path).unwrap();
    assert_eq!(poll(&mut r).unwrap().new_records, 3);
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let shrunk = |e: PollError| matches!(e, PollError::FileShrunk { expected, actual: 4096 } if expected == 4096 + 64 * 8);
    assert!(shrunk(poll(&mut r).unwrap_err()));
    assert!(shrunk(r.summary().unwrap_err()));
    assert!(shrunk(r.model_version().unwrap_err()));
    assert!(shrunk(r.autonomy().unwrap_err()));
    assert!(shrunk(r.liveness(monotonic_ns()).unwrap_err()));
    assert!(r.pass().is_err_and(shrunk));
    // Grown back (never by our producer, but possible): readable again.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096 + 64 * 8)
        .unwrap();
    assert!(poll(&mut r).is_ok());
}

#[test]
fn a_head_jumping_backwards_is_a_restart() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w = ProbeWriter::create(&path, &config(8)).unwrap();
    for i in 0..5 {
        w.record(&cycle(i, 1));
    }
    let mut r = ProbeReader::open(&path).unwrap();
    poll(&mut r).unwrap();
    patch(&path, 128, &2u64.to_ne_bytes());
    let want = RestartReason::HeadWentBack { head: 2, cursor: 5 };
    assert!(matches!(poll(&mut r).unwrap_err(), PollError::ProducerRestarted(got) if got == want));
    assert_eq!(
        r.liveness(monotonic_ns()).unwrap(),
        Liveness::Restarted(want)
    );
}

#[test]
fn a_head_jumping_absurdly_far_is_a_counted_anomaly() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w = ProbeWriter::create(&path, &config(8)).unwrap();
    w.record(&cycle(0, 1));
    let mut r = ProbeReader::open(&path).unwrap();
    poll(&mut r).unwrap();
    patch(&path, 128, &(u64::MAX / 2).to_ne_bytes());
    let stats = poll(&mut r).unwrap();
    assert_eq!(stats.head_jumps, 1);
    assert_eq!(stats.lost, 0, "garbage must not inflate loss counts");
    assert_eq!(stats.new_records, 0);
    assert_eq!(stats.torn, 8);
}

#[test]
fn nonsense_durations_do_not_reach_the_caller() {
    let dir = scratch();
    let path = probe_path(&dir);
    let mut w = ProbeWriter::create(&path, &config(8)).unwrap();
    w.record(&cycle(0, PERIOD * 1000 + 1));
    w.record(&cycle(1, u64::MAX));
    w.record(&cycle(2, 5));
    let mut r = ProbeReader::open(&path).unwrap();
    let mut got = Vec::new();
    let stats = r
        .poll(monotonic_ns(), &mut |rec: &Record| got.push(rec.cycle))
        .unwrap();
    assert_eq!(stats.rejected, 2);
    assert_eq!(got, vec![2]);
}

#[test]
fn an_epoch_changing_under_the_reader_is_a_restart() {
    let dir = scratch();
    let path = probe_path(&dir);
    let _w = ProbeWriter::create(&path, &config(8)).unwrap();
    let mut r = ProbeReader::open(&path).unwrap();
    patch(&path, 48, &77u64.to_ne_bytes());
    let want = RestartReason::NewEpoch { epoch: 77 };
    assert!(matches!(poll(&mut r).unwrap_err(), PollError::ProducerRestarted(got) if got == want));
    assert_eq!(
        r.liveness(monotonic_ns()).unwrap(),
        Liveness::Restarted(want)
    );
}

#[test]
fn an_impossible_summary_is_implausible() {
    let dir = scratch();
    let path = dead_probe(&dir, 2);
    let r = ProbeReader::open(&path).unwrap();
    assert!(r.summary().is_ok());
    // Latch sequence 4 (even): readers use copy 0: cycles, overruns, skipped, max, sum at 152,
    // and its deadline misses at 232.
    let implausible = |what: &str| match r.summary() {
        Err(PollError::Implausible { what: w }) => assert!(w.contains(what), "{w}"),
        other => panic!("expected implausible {what}: {other:?}"),
    };
    patch(&path, 160, &9u64.to_ne_bytes());
    implausible("more overruns than cycles");
    patch(&path, 160, &0u64.to_ne_bytes());
    patch(&path, 176, &u64::MAX.to_ne_bytes());
    implausible("longest cycle");
    patch(&path, 176, &1u64.to_ne_bytes());
    assert!(r.summary().is_ok());
    patch(&path, 232, &3u64.to_ne_bytes());
    implausible("more deadline misses than activations");
    patch(&path, 232, &0u64.to_ne_bytes());
    patch(&path, 168, &1u64.to_ne_bytes());
    implausible("fewer deadline misses than skipped");
}

#[test]
fn a_summary_latch_left_mid_update_by_a_dead_producer_still_reads_whole() {
    let dir = scratch();
    let path = dead_probe(&dir, 2);
    let r = ProbeReader::open(&path).unwrap();
    let before = r.summary().unwrap();
    // Died with the latch odd, half-way through copy 0.
    patch(&path, 144, &5u64.to_ne_bytes());
    patch(&path, 152, &3u64.to_ne_bytes());
    assert_eq!(r.summary().unwrap(), before);
}

#[test]
fn garbage_in_the_model_and_autonomy_cells_is_implausible() {
    let dir = scratch();
    let path = dead_probe(&dir, 1);
    let r = ProbeReader::open(&path).unwrap();
    patch(&path, 384, &2u64.to_ne_bytes());
    patch(&path, 400, &1000u64.to_ne_bytes());
    assert!(matches!(
        r.model_version().unwrap_err(),
        PollError::Implausible { .. }
    ));
    patch(&path, 328, &42u64.to_ne_bytes());
    assert!(matches!(
        r.autonomy().unwrap_err(),
        PollError::Implausible { .. }
    ));
    // A cell whose writer died holding it is busy, not a hang.
    patch(&path, 384, &3u64.to_ne_bytes());
    assert!(matches!(
        r.model_version().unwrap_err(),
        PollError::Busy { .. }
    ));
}

#[test]
fn a_torn_slot_in_a_dead_ring_is_counted_and_skipped() {
    let dir = scratch();
    let path = dead_probe(&dir, 4);
    // Slot 2 (record 2) left mid-write: odd sequence.
    patch(&path, 4096 + 64 * 2, &(2u64 * 2 + 1).to_ne_bytes());
    let mut r = ProbeReader::open(&path).unwrap();
    let mut got = Vec::new();
    let stats = r
        .poll(monotonic_ns(), &mut |rec: &Record| got.push(rec.cycle))
        .unwrap();
    assert_eq!(stats.torn, 1);
    assert_eq!(got, vec![0, 1, 3]);
}

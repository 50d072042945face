//! Replaying captures: pacing, logical time, looping, the end, malformed lines, cancellation.

use std::time::Duration;

use edgewatch_samplers::thermal::TegrastatsSource;
use edgewatch_samplers::thermal::config::{RawThermalConfig, TegrastatsConfig};
use edgewatch_samplers::thermal::tegrastats::{MalformedLine, TegrastatsEvent};

use crate::util::capture;

fn replay_config(path: &std::path::Path, speed: f64, looped: bool) -> TegrastatsConfig {
    RawThermalConfig {
        replay: Some(path.to_owned()),
        replay_speed: speed,
        replay_loop: looped,
        ..RawThermalConfig::default()
    }
    .validate()
    .unwrap()
    .tegrastats
}

/// A short description of an event: (kind, logical monotonic time).
fn describe(event: &TegrastatsEvent<'_>) -> (&'static str, u64) {
    let kind = match event {
        TegrastatsEvent::Sample { .. } => "sample",
        TegrastatsEvent::Malformed { .. } => "malformed",
        TegrastatsEvent::ReplayLooped { .. } => "looped",
        TegrastatsEvent::ReplayFinished { .. } => "finished",
        _ => "other",
    };
    (kind, event.at().monotonic_ns)
}

#[tokio::test(flavor = "current_thread")]
async fn lines_are_stamped_one_interval_apart_whatever_the_speed_and_the_end_is_reported_once() {
    let path = capture("thor_jp7.1_l4t-r38.4.txt");
    let mut source = TegrastatsSource::new(&replay_config(&path, 500.0, false)).unwrap();
    let mut seen = Vec::new();
    loop {
        let event = source.next().await;
        seen.push(describe(&event));
        if seen.last().unwrap().0 == "finished" {
            break;
        }
    }
    let kinds: Vec<&str> = seen.iter().map(|s| s.0).collect();
    assert_eq!(kinds, ["sample", "sample", "sample", "finished"]);
    let t0 = seen[0].1;
    let offsets: Vec<u64> = seen.iter().map(|s| s.1 - t0).collect();
    assert_eq!(offsets, [0, 1_000_000_000, 2_000_000_000, 3_000_000_000]);
    // After the end the source stays silent, so it can sit in a select! forever.
    assert!(
        tokio::time::timeout(Duration::from_millis(30), source.next())
            .await
            .is_err()
    );
    let status = source.status();
    assert_eq!((status.samples, status.finished), (3, true));
}

#[tokio::test(flavor = "current_thread")]
async fn a_looping_replay_starts_over_and_counts_its_passes() {
    let path = capture("thor_jp7.1_l4t-r38.4.txt");
    let mut source = TegrastatsSource::new(&replay_config(&path, 1000.0, true)).unwrap();
    let mut kinds = Vec::new();
    while kinds.len() < 9 {
        let event = source.next().await;
        kinds.push(describe(&event).0);
    }
    assert_eq!(
        kinds,
        [
            "sample", "sample", "sample", "looped", "sample", "sample", "sample", "looped",
            "sample"
        ]
    );
    assert_eq!(source.status().replay_passes, 2);
}

#[tokio::test(flavor = "current_thread")]
async fn malformed_lines_in_a_capture_are_counted_and_blank_lines_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("capture.txt");
    let good = std::fs::read_to_string(capture("orin-nano-8gb_jp6.x_l4t-r36.txt")).unwrap();
    let first = good.lines().next().unwrap();
    std::fs::write(
        &path,
        format!("{first}\r\n\nMon Dec 14 10:00:00 PST 2020\n   \n{first}\n"),
    )
    .unwrap();
    let mut source = TegrastatsSource::new(&replay_config(&path, 1000.0, false)).unwrap();
    let mut seen = Vec::new();
    loop {
        let event = source.next().await;
        if let TegrastatsEvent::Malformed { error, .. } = &event {
            assert!(matches!(error, MalformedLine::Parse(_)));
        }
        seen.push(describe(&event));
        if seen.last().unwrap().0 == "finished" {
            break;
        }
    }
    let kinds: Vec<&str> = seen.iter().map(|s| s.0).collect();
    assert_eq!(kinds, ["sample", "malformed", "sample", "finished"]);
    // A malformed line still takes its interval: it was printed at that time.
    assert_eq!(seen[2].1 - seen[0].1, 2_000_000_000);
    assert_eq!((source.status().samples, source.status().malformed), (2, 1));
}

#[tokio::test(flavor = "current_thread")]
async fn cancelling_next_in_a_select_loses_and_repeats_no_line() {
    let path = capture("tx2_jp4.x_l4t-r32.txt");
    let expected = std::fs::read_to_string(&path).unwrap().lines().count();
    // 100 ms interval at speed 10: a line every 10 ms, raced against a 3 ms timer.
    let config = RawThermalConfig {
        replay: Some(path),
        replay_speed: 10.0,
        interval: Some("100ms".into()),
        max_gap: Some("5s".into()),
        ..RawThermalConfig::default()
    }
    .validate()
    .unwrap();
    let mut source = TegrastatsSource::new(&config.tegrastats).unwrap();
    let mut times = Vec::new();
    let mut cancelled = 0;
    loop {
        tokio::select! {
            event = source.next() => {
                let (kind, at) = describe(&event);
                if kind == "finished" { break; }
                assert_eq!(kind, "sample");
                times.push(at);
            }
            () = tokio::time::sleep(Duration::from_millis(3)) => cancelled += 1,
        }
    }
    assert!(cancelled > 0, "the race never cancelled a call");
    assert_eq!(times.len(), expected);
    let offsets: Vec<u64> = times.iter().map(|t| (t - times[0]) / 100_000_000).collect();
    assert_eq!(offsets, (0..expected as u64).collect::<Vec<_>>());
}

#[test]
fn a_missing_capture_is_an_error_naming_the_key() {
    let error = TegrastatsSource::new(&replay_config(
        std::path::Path::new("/nonexistent/capture.txt"),
        1.0,
        false,
    ))
    .unwrap_err();
    assert!(error.to_string().contains("thermal.replay"), "{error}");
}

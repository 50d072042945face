//! tegrastats as a real child process: fake `tegrastats` scripts in a temporary directory,
//! given as the configured program, that print capture lines and exit.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use edgewatch_proto::v1::{LogLevel, Tier};
use edgewatch_samplers::CollectingSink;
use edgewatch_samplers::thermal::config::RawThermalConfig;
use edgewatch_samplers::thermal::tegrastats::{MalformedLine, TegrastatsEvent};
use edgewatch_samplers::thermal::{SysfsInventory, TegrastatsSource, ThermalSampler, clock};

use crate::util::{capture, logs};

/// Tests that write and run scripts take turns: a script written while another test forks can
/// be held open by that child for an instant, and exec then fails with ETXTBSY.
static SPAWNING: Mutex<()> = Mutex::new(());

fn spawning() -> MutexGuard<'static, ()> {
    SPAWNING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Writes an executable `tegrastats` script with `body` into `dir`.
fn fake_tegrastats(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("tegrastats");
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn config(program: &Path, min_ms: u64, max_ms: u64) -> RawThermalConfig {
    RawThermalConfig {
        tegrastats: program.to_owned(),
        interval: Some("1s".into()),
        restart_backoff_min: Some(format!("{min_ms}ms")),
        restart_backoff_max: Some(format!("{max_ms}ms")),
        ..RawThermalConfig::default()
    }
}

fn is_running(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test(flavor = "current_thread")]
#[allow(clippy::await_holding_lock)] // Each test has its own runtime thread; the lock only orders tests.
async fn tegrastats_that_dies_is_restarted_with_doubling_backoff_and_every_exit_is_counted_and_logged()
 {
    let _turn = spawning();
    let dir = tempfile::tempdir().unwrap();
    let args = dir.path().join("args");
    let thor = capture("thor_jp7.1_l4t-r38.4.txt");
    let program = fake_tegrastats(
        dir.path(),
        &format!(
            "echo \"$@\" >> '{}'\ncat '{}'\nexit 3",
            args.display(),
            thor.display()
        ),
    );
    let config = config(&program, 50, 200).validate().unwrap();
    let mut source = TegrastatsSource::new(&config.tegrastats).unwrap();
    let mut sampler = ThermalSampler::new(&config, &SysfsInventory::default(), clock::now(), None);
    let mut sink = CollectingSink::default();

    let mut runs: Vec<Vec<&'static str>> = Vec::new();
    let mut delays = Vec::new();
    let mut exited_at = None;
    while delays.len() < 4 {
        let event = source.next().await;
        sampler.on_tegrastats(&event, None, &mut sink);
        match &event {
            TegrastatsEvent::Started { starts, at, .. } => {
                assert_eq!(*starts as usize, runs.len() + 1);
                if let (Some(exit_at), Some(delay)) = (exited_at, delays.last()) {
                    // The restart waited at least its backoff delay.
                    let waited = Duration::from_nanos(at.monotonic_ns - exit_at);
                    assert!(
                        waited >= *delay,
                        "restarted after {waited:?}, before {delay:?}"
                    );
                }
                runs.push(vec!["started"]);
            }
            TegrastatsEvent::Sample { .. } => runs.last_mut().unwrap().push("sample"),
            TegrastatsEvent::Exited {
                exit,
                restart_in,
                exits,
                at,
            } => {
                assert_eq!((exit.code, exit.signal, exit.lines), (Some(3), None, 3));
                assert_eq!(*exits as usize, runs.len());
                runs.last_mut().unwrap().push("exited");
                delays.push(*restart_in);
                exited_at = Some(at.monotonic_ns);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    let run = ["started", "sample", "sample", "sample", "exited"];
    assert_eq!(runs, [run; 4]);
    let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
    assert_eq!(ms, [50, 100, 200, 200]);
    assert_eq!(
        fs::read_to_string(&args).unwrap(),
        "--interval 1000\n".repeat(4)
    );

    let status = source.status();
    assert_eq!(
        (status.starts, status.restarts, status.exits, status.samples),
        (4, 3, 4, 12)
    );
    assert!(!status.running);
    assert_eq!(status.last_exit.unwrap().code, Some(3));
    assert_eq!(status.next_backoff, Duration::from_millis(200));

    // Each start and exit is a debug-tier log record; no energy is integrated across exits.
    let records = logs(&sink);
    assert!(records.iter().all(|(tier, _)| *tier == Tier::Debug));
    let messages: Vec<&str> = records.iter().map(|(_, l)| l.message.as_str()).collect();
    let started_then_exited = [
        "tegrastats restarted.",
        "tegrastats exited; restarting after the backoff delay.",
    ];
    assert_eq!(messages[0], "tegrastats started.");
    assert_eq!(messages[1], started_then_exited[1]);
    assert_eq!(&messages[2..4], started_then_exited);
    assert_eq!(&messages[4..6], started_then_exited);
    assert_eq!(&messages[6..8], started_then_exited);
    assert_eq!(records[1].1.level, LogLevel::Warn as i32);
    let sampler_status = sampler.status();
    assert_eq!(
        (
            sampler_status.tegrastats_starts,
            sampler_status.tegrastats_exits,
            sampler_status.energy.continuity_breaks
        ),
        (4, 4, 4)
    );
}

#[tokio::test(flavor = "current_thread")]
#[allow(clippy::await_holding_lock)] // Each test has its own runtime thread; the lock only orders tests.
async fn a_program_that_cannot_be_started_is_retried_with_backoff_and_counted() {
    let _turn = spawning();
    let dir = tempfile::tempdir().unwrap();
    let config = config(&dir.path().join("no-such-tegrastats"), 20, 50)
        .validate()
        .unwrap();
    let mut source = TegrastatsSource::new(&config.tegrastats).unwrap();
    let mut sampler = ThermalSampler::new(&config, &SysfsInventory::default(), clock::now(), None);
    let mut sink = CollectingSink::default();
    let mut delays = Vec::new();
    for _ in 0..3 {
        let event = source.next().await;
        sampler.on_tegrastats(&event, None, &mut sink);
        match event {
            TegrastatsEvent::SpawnFailed {
                error, restart_in, ..
            } => {
                assert_eq!(error, std::io::ErrorKind::NotFound);
                delays.push(restart_in.as_millis());
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(delays, [20, 40, 50]);
    assert_eq!(source.status().spawn_failures, 3);
    assert_eq!(sampler.status().spawn_failures, 3);
    assert_eq!(logs(&sink).len(), 3);
}

#[tokio::test(flavor = "current_thread")]
#[allow(clippy::await_holding_lock)] // Each test has its own runtime thread; the lock only orders tests.
async fn garbage_overlong_and_cut_short_lines_are_counted_never_fatal() {
    let _turn = spawning();
    let dir = tempfile::tempdir().unwrap();
    let nano = capture("nano_jp4.6.1_l4t-r32.7.txt");
    let long = "x".repeat(20_000);
    let program = fake_tegrastats(
        dir.path(),
        &format!(
            "echo 'RAM garbage'\necho\necho '{long}'\ncat '{}'\nprintf 'RAM 1205/306'\nexit 0",
            nano.display()
        ),
    );
    let config = config(&program, 10_000, 10_000).validate().unwrap();
    let mut source = TegrastatsSource::new(&config.tegrastats).unwrap();
    let mut kinds = Vec::new();
    loop {
        let event = source.next().await;
        let kind = match &event {
            TegrastatsEvent::Started { .. } => "started",
            TegrastatsEvent::Malformed {
                error: MalformedLine::Parse(_),
                ..
            } => "garbage",
            TegrastatsEvent::Malformed {
                error: MalformedLine::Truncated,
                ..
            } => "overlong",
            TegrastatsEvent::Sample { sample, .. } => {
                assert_eq!(sample.rails().len(), 3);
                "sample"
            }
            TegrastatsEvent::Exited { exit, .. } => {
                assert_eq!(exit.code, Some(0));
                "exited"
            }
            other => panic!("unexpected {other:?}"),
        };
        kinds.push(kind);
        if kind == "exited" {
            break;
        }
    }
    // The blank line is skipped; the unterminated last line is counted when output ends.
    assert_eq!(
        kinds,
        ["started", "garbage", "overlong", "sample", "exited"]
    );
    let status = source.status();
    assert_eq!((status.samples, status.malformed), (1, 3));
    source.shutdown().await;
}

#[tokio::test(flavor = "current_thread")]
#[allow(clippy::await_holding_lock)] // Each test has its own runtime thread; the lock only orders tests.
async fn lines_survive_cancelled_reads_and_shutdown_leaves_no_process() {
    let _turn = spawning();
    let dir = tempfile::tempdir().unwrap();
    let tx2 = capture("tx2_jp4.x_l4t-r32.txt");
    // Print each capture line in two halves 20 ms apart, then stay alive like tegrastats does.
    let program = fake_tegrastats(
        dir.path(),
        &format!(
            "while IFS= read -r line; do\n  printf '%s' \"${{line%% *}}\"; sleep 0.02\n  printf ' %s\\n' \"${{line#* }}\"\ndone < '{}'\nexec sleep 30",
            tx2.display()
        ),
    );
    let expected: Vec<String> = fs::read_to_string(&tx2)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let config = config(&program, 1_000, 1_000).validate().unwrap();
    let mut source = TegrastatsSource::new(&config.tegrastats).unwrap();
    let mut pid = None;
    let mut rams = Vec::new();
    let mut cancelled = 0;
    while rams.len() < expected.len() {
        tokio::select! {
            event = source.next() => match event {
                TegrastatsEvent::Started { pid: p, .. } => pid = p,
                TegrastatsEvent::Sample { sample, .. } => rams.push(sample.ram().unwrap().used_mb),
                other => panic!("unexpected {other:?}"),
            },
            () = tokio::time::sleep(Duration::from_millis(5)) => cancelled += 1,
        }
    }
    assert!(cancelled > 0, "the race never cancelled a read");
    let want: Vec<u32> = expected
        .iter()
        .map(|l| {
            tegrastats_parser::parse_line(l)
                .unwrap()
                .ram()
                .unwrap()
                .used_mb
        })
        .collect();
    assert_eq!(rams, want);

    let pid = pid.unwrap();
    assert!(is_running(pid));
    assert!(source.status().running);
    source.shutdown().await;
    assert!(!is_running(pid), "the child outlived shutdown");
    assert!(!source.status().running);
    assert!(
        tokio::time::timeout(Duration::from_millis(30), source.next())
            .await
            .is_err(),
        "a stopped source stays silent"
    );
}

//! The synthetic loop as a real process, read back through the loop-probe reader: injected
//! counts against the probe's, and kill / restart / freeze detected by the reader.

// Helpers here are test code too; clippy.toml allows unwrap only inside #[test] fns.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use loop_probe::{
    AutonomyMode, FLAG_DEADLINE_MISS, FLAG_FALLBACK, FLAG_OVERRUN, FLAG_SKIPPED, Liveness,
    ProbeReader, Record, RestartReason,
};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_edgewatch-synthetic-loop");

fn scratch() -> tempfile::TempDir {
    let base = Path::new("/dev/shm");
    let b = &mut tempfile::Builder::new();
    b.prefix("synthetic-loop-test");
    if base.is_dir() {
        b.tempdir_in(base)
    } else {
        b.tempdir()
    }
    .unwrap()
}

fn now() -> u64 {
    loop_probe::clock::monotonic_ns()
}

fn cmd(probe: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("--probe").arg(probe).args(args);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "loop failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A running loop process; killed and reaped on drop, so a failing test leaves nothing behind.
struct Running(Option<Child>);

impl Running {
    fn spawn(mut c: Command) -> Running {
        Running(Some(c.spawn().unwrap()))
    }

    fn child(&self) -> &Child {
        self.0.as_ref().unwrap()
    }

    fn pid(&self) -> u32 {
        self.child().id()
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill with the pid of a child we have not reaped yet.
        assert_eq!(unsafe { libc::kill(self.pid() as libc::pid_t, sig) }, 0);
    }

    /// Waits for exit and collects its output.
    fn output(mut self) -> Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }

    /// Waits for exit (after a fatal signal).
    fn reap(&mut self) {
        self.0.take().unwrap().wait().unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (bounded) until the probe exists and has recorded at least `n` cycles.
fn wait_for_records(probe: &Path, n: u64) -> ProbeReader {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(r) = ProbeReader::open(probe)
            && r.summary().unwrap().head >= n
        {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "no {n} records in {}",
            probe.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits (bounded) until the producer is seen alive. A SCHED_OTHER loop on a busy 2-core VM can
/// miss 3 periods now and then, which is (correctly) a momentary stall.
fn wait_alive(r: &ProbeReader) {
    wait_until("a live producer", || {
        r.liveness(now()).unwrap() == Liveness::Alive
    });
}

/// Waits (bounded) until `f` holds.
fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn probe_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("loop.probe")
}

#[test]
fn a_scripted_run_reports_what_it_injected_and_the_probe_agrees() {
    let dir = scratch();
    let probe = probe_in(&dir);
    let script = dir.path().join("pattern");
    std::fs::write(
        &script,
        "# 200 Hz for 1 s: activations 0..199\n\
         overrun 2x at cycles 20..25\n\
         overrun 1.5x every 50\n\
         skip at cycles 60..63\n\
         skip every 70\n\
         fallback at cycle 30\n\
         mode autonomous at 0s\n\
         mode manual at 500ms\n\
         mode autonomous at 700ms\n\
         model det-1.0 hash=0xd1 at 0s\n",
    )
    .unwrap();
    let out = cmd(
        &probe,
        &[
            "--loop-id",
            "3",
            "--loop-name",
            "haul",
            "--rate-hz",
            "200",
            "--budget-ms",
            "2",
            "--duration",
            "1s",
        ],
    )
    .arg("--script")
    .arg(&script)
    .args([
        "--event",
        "intervention at 300ms",
        "--event",
        "safe-stop at 800ms",
    ])
    .args(["--event", "model det-1.1 hash=0xd2 at 600ms"])
    .output()
    .unwrap();
    let j = json(&out);

    // Expected from the pattern alone: overruns at 20..25 and 50, 100, 150; skips at 60..63,
    // 70, 140 (none in the last activation, so every gap is seen).
    assert_eq!(j["activations"], 200);
    assert_eq!(j["skipped_injected"], 5);
    assert_eq!(j["cycles"], 195);
    assert_eq!(j["misses_injected"], 8);
    assert_eq!(
        (
            j["fallbacks"].as_u64(),
            j["interventions"].as_u64(),
            j["safe_stops"].as_u64()
        ),
        (Some(1), Some(1), Some(1))
    );
    assert_eq!(j["model_version"], "det-1.1");
    let total = &j["tally"]["total"];
    assert_eq!(
        (total["activations"].as_u64(), total["skipped"].as_u64()),
        (Some(200), Some(5))
    );
    assert_eq!(total["fallbacks"], 1);
    let per_model_activations: u64 = j["tally"]["models"]
        .as_object()
        .unwrap()
        .values()
        .map(|m| m["activations"].as_u64().unwrap())
        .sum();
    assert_eq!(per_model_activations, 200);
    let observed = j["misses_observed"].as_u64().unwrap();
    assert!(
        observed >= 8,
        "every injected overrun is observed: {observed}"
    );

    let mut r = ProbeReader::open(&probe).unwrap();
    assert_eq!(r.info().loop_id, 3);
    assert_eq!(r.info().loop_name(), "haul");
    assert_eq!(r.info().period_ns, 5_000_000);
    assert_eq!(
        format!("{:#018x}", r.info().epoch),
        j["epoch"].as_str().unwrap()
    );
    let s = r.summary().unwrap();
    assert_eq!(s.cycles.cycles, 195);
    assert_eq!(s.cycles.skipped, 5);
    assert_eq!(s.cycles.overruns, observed);
    assert_eq!(s.cycles.activations, 200);
    assert_eq!(
        s.deadline_misses(),
        total["deadline_misses"].as_u64(),
        "the loop's own clock and the probe judge every completion alike"
    );
    assert_eq!(
        (
            s.events.fallbacks,
            s.events.interventions,
            s.events.safe_stops
        ),
        (1, 1, 1)
    );
    let m = r.model_version().unwrap().unwrap();
    assert_eq!((m.id_hash, m.version()), (0xd2, "det-1.1"));
    let a = r.autonomy().unwrap();
    assert_eq!(a.mode, AutonomyMode::Autonomous);
    let end = j["end_monotonic_ns"].as_u64().unwrap();
    for mode in AutonomyMode::ALL {
        assert_eq!(
            a.total_ns(mode, end),
            j["autonomy_ns"][mode.name()].as_u64().unwrap(),
            "{} time",
            mode.name()
        );
    }
    assert_eq!(
        total["autonomous_ns"], j["autonomy_ns"]["autonomous"],
        "autonomous time split by model adds up"
    );
    let manual_s = j["autonomy_seconds"]["manual"].as_f64().unwrap();
    assert!(
        (0.1..0.3).contains(&manual_s),
        "manual for 40 cycles of 5 ms: {manual_s}"
    );

    let mut recs = Vec::new();
    r.poll(now(), &mut |rec: &Record| recs.push(*rec)).unwrap();
    assert_eq!(recs.len(), 195);
    let fallback: Vec<u64> = recs
        .iter()
        .filter(|r| r.flags & FLAG_FALLBACK != 0)
        .map(|r| r.cycle)
        .collect();
    assert_eq!(fallback, vec![30]);
    for c in [20, 21, 22, 23, 24, 50, 100, 150] {
        let rec = recs.iter().find(|r| r.cycle == c).unwrap();
        assert!(
            rec.duration_ns > rec.budget_ns,
            "cycle {c} overran: {rec:?}"
        );
    }
    for c in [60, 61, 62, 70, 140] {
        assert!(recs.iter().all(|r| r.cycle != c), "cycle {c} was skipped");
    }
    assert!(
        recs.windows(2)
            .all(|w| w[1].release_ns - w[0].release_ns == 5_000_000 * (w[1].cycle - w[0].cycle))
    );
    assert_eq!(r.liveness(now()).unwrap(), Liveness::Dead);
}

#[test]
fn late_starts_and_a_hang_are_deadline_misses_in_the_loops_own_tally_and_in_the_probe_alike() {
    let dir = scratch();
    let probe = probe_in(&dir);
    // 100 Hz for 2 s: activations 0..199, period and deadline 10 ms, budget 3 ms.
    let out = cmd(
        &probe,
        &[
            "--rate-hz",
            "100",
            "--budget-ms",
            "3",
            "--duration",
            "2s",
            "--event",
            "late-start 12ms at cycle 20",
            "--event",
            "overrun 2x at cycle 40",
            "--event",
            "late-start 5 ms at cycle 60",
            "--event",
            "overrun 2x at cycle 60",
            "--event",
            "hang 200ms at cycle 100",
            "--event",
            "model m-2 at cycle 110",
            "--event",
            "skip at cycle 150",
        ],
    )
    .output()
    .unwrap();
    let j = json(&out);
    let total = &j["tally"]["total"];
    assert_eq!(j["deadline_ns"], 10_000_000);
    assert_eq!(
        (
            j["late_starts_injected"].as_u64(),
            j["hangs_injected"].as_u64()
        ),
        (Some(2), Some(1))
    );
    // The hang swallows 100..119 (it resumes at the release 200 ms after 100's); 150 is skipped.
    assert_eq!(total["activations"], 200);
    assert_eq!(total["skipped"], 21);
    assert_eq!(j["skipped_injected"], 21);
    assert_eq!(j["cycles"], 179);
    let misses = total["deadline_misses"].as_u64().unwrap();
    // 20 (completes 12 ms after its release) and 60 (5 ms late, then 6 ms) miss; 40 overruns
    // and meets its deadline; every skipped activation misses.
    assert!(misses >= 21 + 2, "{total}");
    assert!(total["overruns"].as_u64().unwrap() >= 2, "{total}");
    assert_eq!(total["overruns"], j["misses_observed"]);
    // Activations skipped by the hang are counted under the model in effect then; m-2 is
    // published during the hang and takes effect when the loop resumes.
    let models = &j["tally"]["models"];
    assert_eq!(models[""]["skipped"], 20);
    assert_eq!(models["m-2"]["skipped"], 1);
    assert_eq!(
        models[""]["activations"].as_u64().unwrap()
            + models["m-2"]["activations"].as_u64().unwrap(),
        200
    );

    // The probe, read independently, agrees to the activation.
    let mut r = ProbeReader::open(&probe).unwrap();
    assert_eq!(r.info().deadline_ns, Some(10_000_000));
    let s = r.summary().unwrap();
    assert_eq!(s.cycles.activations, 200);
    assert_eq!(s.cycles.skipped, 21);
    assert_eq!(s.deadline_misses(), Some(misses));
    assert_eq!(s.cycles.overruns, total["overruns"].as_u64().unwrap());
    let mut recs = Vec::new();
    r.poll(now(), &mut |rec: &Record| recs.push(*rec)).unwrap();
    let rec = |c: u64| *recs.iter().find(|r| r.cycle == c).unwrap();
    assert_ne!(rec(20).flags & FLAG_DEADLINE_MISS, 0, "{:?}", rec(20));
    assert!(rec(20).latency_ns() >= 12_000_000);
    assert_ne!(rec(40).flags & FLAG_OVERRUN, 0, "{:?}", rec(40));
    assert_ne!(rec(60).flags & (FLAG_OVERRUN | FLAG_DEADLINE_MISS), 0);
    assert_eq!(rec(60).flags & FLAG_DEADLINE_MISS, FLAG_DEADLINE_MISS);
    assert_eq!(
        rec(120).flags & FLAG_SKIPPED,
        FLAG_SKIPPED,
        "the hang is a gap"
    );
    assert!(recs.iter().all(|r| !(100..120).contains(&r.cycle)));
    // The hang's gap in heartbeats: nothing completed between 99's release and 120's.
    let (before, after) = (rec(99), rec(120));
    assert!(after.start_ns - before.completion_ns() >= 190_000_000);
}

#[test]
fn sigterm_stops_the_loop_cleanly_with_a_summary() {
    let dir = scratch();
    let probe = probe_in(&dir);
    let child = Running::spawn(cmd(&probe, &["--rate-hz", "500", "--budget-ms", "1"]));
    let r = wait_for_records(&probe, 20);
    wait_alive(&r);
    child.signal(libc::SIGTERM);
    let out = child.output();
    let j = json(&out);
    assert_eq!(j["stopped_by"], "signal");
    assert_eq!(
        r.summary().unwrap().cycles.cycles,
        j["cycles"].as_u64().unwrap()
    );
    assert_eq!(r.liveness(now()).unwrap(), Liveness::Dead);
}

#[test]
fn a_killed_producer_is_seen_dead() {
    let dir = scratch();
    let probe = probe_in(&dir);
    let mut child = Running::spawn(cmd(&probe, &["--rate-hz", "500", "--budget-ms", "1"]));
    let mut r = wait_for_records(&probe, 10);
    wait_alive(&r);
    child.signal(libc::SIGKILL);
    child.reap();
    assert_eq!(r.liveness(now()).unwrap(), Liveness::Dead);
    // What it recorded before dying is still there, whole.
    let stats = r.poll(now(), &mut |_: &Record| {}).unwrap();
    assert_eq!(stats.torn + stats.rejected, 0);
    assert!(stats.new_records >= 10);
}

#[test]
fn a_restarted_producer_is_seen_as_a_restart_and_followed() {
    let dir = scratch();
    let probe = probe_in(&dir);
    let args = ["--rate-hz", "500", "--budget-ms", "1"];
    let mut first = Running::spawn(cmd(&probe, &args));
    let mut r = wait_for_records(&probe, 10);
    let first_epoch = r.info().epoch;

    // While the first lives, a second producer is refused.
    let refused = cmd(&probe, &args)
        .arg("--duration")
        .arg("1s")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(75));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("held by a live producer"));

    first.signal(libc::SIGKILL);
    first.reap();
    let mut second = Running::spawn(cmd(&probe, &args));
    wait_until("the new producer's file", || {
        matches!(
            r.liveness(now()),
            Ok(Liveness::Restarted(RestartReason::NewInode))
        )
    });
    r.reopen().unwrap();
    assert_ne!(r.info().epoch, first_epoch);
    assert_eq!(r.info().pid, second.pid());
    wait_until("records from the new producer", || {
        r.summary().unwrap().head >= 5
    });
    let mut first_cycle = None;
    r.poll(now(), &mut |rec: &Record| {
        first_cycle.get_or_insert(rec.cycle);
    })
    .unwrap();
    assert_eq!(
        first_cycle,
        Some(0),
        "the new ring starts at the new producer's first cycle"
    );
    wait_alive(&r);
    second.signal(libc::SIGKILL);
    second.reap();
}

#[test]
fn a_frozen_producer_is_seen_stalled_and_alive_again_after_sigcont() {
    let dir = scratch();
    let probe = probe_in(&dir);
    let mut child = Running::spawn(cmd(&probe, &["--rate-hz", "200", "--budget-ms", "1"]));
    let r = wait_for_records(&probe, 5);
    child.signal(libc::SIGSTOP);
    // Stalled after 3 periods (15 ms) without a heartbeat.
    wait_until("a stall", || {
        matches!(r.liveness(now()), Ok(Liveness::Stalled { .. }))
    });
    let Liveness::Stalled { heartbeat_age_ns } = r.liveness(now()).unwrap() else {
        panic!("not stalled")
    };
    assert!(heartbeat_age_ns > 15_000_000);
    child.signal(libc::SIGCONT);
    wait_until("recovery", || r.liveness(now()).unwrap() == Liveness::Alive);
    child.signal(libc::SIGKILL);
    child.reap();
}

#[test]
fn bad_flags_exit_64_naming_the_flag() {
    let dir = scratch();
    let probe = probe_in(&dir);
    for (args, key) in [
        (&["--rate-hz", "0", "--budget-ms", "1"][..], "--rate-hz"),
        (
            &["--rate-hz", "100", "--budget-ms", "50"][..],
            "--budget-ms",
        ),
        (
            &[
                "--rate-hz",
                "100",
                "--budget-ms",
                "1",
                "--event",
                "overrun 2x at noon",
            ][..],
            "--event",
        ),
        (
            &[
                "--rate-hz",
                "100",
                "--budget-ms",
                "1",
                "--script",
                "/nonexistent/pattern",
            ][..],
            "--script",
        ),
        (
            &["--rate-hz", "100", "--budget-ms", "1", "--no-such-flag"][..],
            "--no-such-flag",
        ),
    ] {
        let out = cmd(&probe, args).output().unwrap();
        assert_eq!(out.status.code(), Some(64), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key), "{args:?}: {err}");
    }
    assert!(!probe.exists(), "no probe file for a refused configuration");
}

#[test]
fn realtime_requests_either_take_effect_or_fail_with_a_clear_reason() {
    let dir = scratch();
    let probe = probe_in(&dir);
    let out = cmd(
        &probe,
        &[
            "--rate-hz",
            "200",
            "--budget-ms",
            "1",
            "--duration",
            "200ms",
            "--fifo",
            "10",
            "--cpu",
            "0",
            "--require-rt",
        ],
    )
    .output()
    .unwrap();
    if out.status.success() {
        let j = json(&out);
        assert_eq!(j["sched"], "fifo:10");
        assert_eq!(j["cpu"], 0);
        assert_eq!(j["memory_locked"], true);
    } else {
        // E.g. no CAP_SYS_NICE, or a cgroup-v1 cpu group without an RT budget.
        let err = String::from_utf8_lossy(&out.stderr);
        println!("SCHED_FIFO not permitted here; checked the error instead: {err}");
        assert_eq!(out.status.code(), Some(77), "{err}");
        assert!(
            err.contains("SCHED_FIFO") || err.contains("mlockall"),
            "{err}"
        );
    }
    let out = cmd(
        &probe,
        &[
            "--rate-hz",
            "200",
            "--budget-ms",
            "1",
            "--duration",
            "100ms",
            "--cpu",
            "1023",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(String::from_utf8_lossy(&out.stderr).contains("pinning to CPU 1023"));
}

#[test]
fn without_privileges_fifo_is_refused_with_the_remedy() {
    let Ok(setpriv) = which("setpriv") else {
        println!("skipped: `setpriv` (util-linux) not installed, cannot drop privileges");
        return;
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: not root, cannot switch to user nobody");
        return;
    }
    let dir = scratch();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let probe = probe_in(&dir);
    let out = Command::new(setpriv)
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(BIN)
        .arg("--probe")
        .arg(&probe)
        .args([
            "--rate-hz",
            "100",
            "--budget-ms",
            "1",
            "--duration",
            "100ms",
            "--fifo",
            "50",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{err}");
    assert!(
        err.contains("SCHED_FIFO priority 50 refused") && err.contains("CAP_SYS_NICE"),
        "{err}"
    );
}

fn which(name: &str) -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .ok_or(())
}

//! The deadline sampler against the real `edgewatch-synthetic-loop` process: an injected
//! pattern checked against the loop's own JSON summary, and kill / restart / freeze seen as
//! `ProbeStatus` events.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use edgewatch_proto::v1::{self, BurstRule, ProbeState, Tier, event::Kind};
use edgewatch_samplers::CollectingSink;
use edgewatch_samplers::deadline::{DeadlineSampler, LoopState};
use serde_json::Value;

use crate::util::{config, now, picked, probe, scratch, states, synthetic_loop};

/// A running loop process; killed and reaped on drop, so a failing test leaves nothing behind.
struct Running(Option<Child>);

impl Running {
    fn spawn(probe: &Path, args: &[&str]) -> Running {
        let child = Command::new(synthetic_loop())
            .arg("--probe")
            .arg(probe)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Running(Some(child))
    }

    fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill with the pid of a child we have not reaped yet.
        assert_eq!(unsafe { libc::kill(self.pid() as libc::pid_t, sig) }, 0);
    }

    fn exited(&mut self) -> bool {
        self.0.as_mut().unwrap().try_wait().unwrap().is_some()
    }

    fn output(mut self) -> Output {
        self.0.take().unwrap().wait_with_output().unwrap()
    }

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

/// Polls every 20 ms until `f` holds (bounded by 15 s).
fn poll_until(
    s: &mut DeadlineSampler,
    sink: &mut CollectingSink,
    what: &str,
    mut f: impl FnMut(&DeadlineSampler, &CollectingSink) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        s.poll(now(), None, sink);
        if f(s, sink) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_sampler_reports_what_a_scripted_loop_injected() {
    let dir = scratch();
    let path = dir.path().join("loop.probe");
    let mut raw = probe(&path);
    raw.model_name = Some("det".into());
    let cfg = config(vec![raw], 0.2, |d| {
        d.stall_min_ms = Some(1000.0);
        d.burst_min_interval_s = Some(1.0);
    });
    let mut s = DeadlineSampler::new(cfg, now());
    let mut sink = CollectingSink::default();
    let script = dir.path().join("pattern");
    std::fs::write(
        &script,
        "# 200 Hz for 3 s: activations 0..599\n\
         mode autonomous at 0s\n\
         model det-1.0 hash=0xd1 at 0s\n\
         overrun 3x at cycles 101..106\n\
         overrun 2x at cycle 301\n\
         fallback at cycle 201\n\
         fallback at cycle 251\n\
         intervention at 1s\n\
         mode manual at 1.5s\n\
         mode autonomous at 2s\n\
         model det-1.1 hash=0xd2 at 2.2s\n\
         safe-stop at 2.5s\n\
         skip every 50\n",
    )
    .unwrap();
    let mut child = Running::spawn(
        &path,
        &[
            "--loop-name",
            "haul",
            "--rate-hz",
            "200",
            "--budget-ms",
            "2",
            "--duration",
            "3s",
            "--script",
            script.to_str().unwrap(),
        ],
    );
    poll_until(&mut s, &mut sink, "the loop to finish", |_, _| {
        child.exited()
    });
    let out = child.output();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    poll_until(&mut s, &mut sink, "the producer's death", |_, sink| {
        states(sink, "haul").contains(&ProbeState::Died)
    });

    // Last value of each (model version) series.
    let mut series: BTreeMap<String, &v1::DeadlineCounters> = BTreeMap::new();
    for c in picked(&sink, Tier::Slo, |k| match k {
        Kind::DeadlineCounters(c) => Some(c),
        _ => None,
    }) {
        assert_eq!(c.control_loop.as_ref().unwrap().loop_name, "haul");
        assert_eq!(
            format!("{:#018x}", c.producer_epoch),
            j["epoch"].as_str().unwrap()
        );
        series.insert(c.model.as_ref().unwrap().version.clone(), c);
    }
    let sum = |f: fn(&v1::DeadlineCounters) -> u64| series.values().map(|c| f(c)).sum::<u64>();
    assert_eq!(sum(|c| c.cycles), j["cycles"].as_u64().unwrap());
    assert_eq!(sum(|c| c.misses), j["misses_observed"].as_u64().unwrap());
    assert_eq!(sum(|c| c.skipped), j["skipped_injected"].as_u64().unwrap());
    assert_eq!(j["skipped_injected"], 11);
    // Deadline misses and activations, against the loop's own clock.
    let tally = &j["tally"]["total"];
    assert_eq!(
        sum(|c| c.deadline_misses.unwrap()),
        tally["deadline_misses"].as_u64().unwrap()
    );
    assert_eq!(sum(|c| c.activations.unwrap()), 600);
    assert_eq!(tally["activations"], 600);
    let v10 = series["det-1.0"];
    let v11 = series["det-1.1"];
    assert!(
        v10.misses >= 6,
        "the injected overruns ran under det-1.0: {}",
        v10.misses
    );
    // Cycles 440..599 less three skips ran under det-1.1; a poll attributes what it reads to the
    // model it sees, so det-1.1 holds at least those, plus what ran before the poll saw it.
    assert!(
        (157..300).contains(&v11.cycles),
        "det-1.1 ran for the last 0.8 s: {} cycles",
        v11.cycles
    );
    assert_eq!(v10.model.as_ref().unwrap().name, "det");
    assert_eq!(v11.model.as_ref().unwrap().id_hash, 0xd2);

    let fallbacks: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::SafetyFallback(f) => Some(f),
        _ => None,
    })
    .collect();
    assert_eq!(
        fallbacks.last().unwrap().total,
        j["fallbacks"].as_u64().unwrap()
    );
    assert_eq!(fallbacks.iter().map(|f| f.delta).sum::<u64>(), 2);
    let interventions: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::Intervention(i) => Some(i),
        _ => None,
    })
    .collect();
    assert_eq!(interventions.len(), 1);
    assert_eq!(interventions[0].total, j["interventions"].as_u64().unwrap());
    assert_eq!(interventions[0].mode(), v1::AutonomyMode::Autonomous);
    let stops: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::SafeStop(x) => Some(x),
        _ => None,
    })
    .collect();
    assert_eq!(stops.len(), 1);
    assert_eq!(stops[0].total, j["safe_stops"].as_u64().unwrap());
    assert_eq!(stops[0].model.as_ref().unwrap().version, "det-1.1");

    let bursts: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::DeadlineMissBurst(b) => Some(b),
        _ => None,
    })
    .collect();
    // Activation 100 is skipped (`skip every 50`), a deadline miss; the five overruns of 6 ms
    // after it each complete past their 5 ms deadline: one run of misses from 100.
    assert!(
        bursts.iter().any(|b| b.rule() == BurstRule::Consecutive
            && b.semantics() == v1::DeadlineSemantics::Completion
            && b.first_cycle == 100
            && b.last_cycle >= 105
            && b.worst_duration_ns >= 6_000_000),
        "the skipped activation and the five injected overruns after it are a burst: {:?}",
        bursts
            .iter()
            .map(|b| (
                b.rule(),
                b.first_cycle,
                b.last_cycle,
                b.misses,
                b.worst_duration_ns
            ))
            .collect::<Vec<_>>()
    );

    let changes: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::ModelVersionChange(c) => Some(c),
        _ => None,
    })
    .map(|c| {
        (
            c.previous.as_ref().unwrap().version.clone(),
            c.current.as_ref().unwrap().version.clone(),
        )
    })
    .collect();
    assert_eq!(
        j["model_changes"], 2,
        "the first model is published, the second a change"
    );
    assert_eq!(changes, vec![("det-1.0".to_owned(), "det-1.1".to_owned())]);
    let modes: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::AutonomyModeChange(m) => Some(m),
        _ => None,
    })
    .map(|m| (m.previous(), m.current()))
    .collect();
    use v1::AutonomyMode::{Autonomous, Manual};
    assert_eq!(modes, vec![(Autonomous, Manual), (Manual, Autonomous)]);

    // Autonomous seconds, over both models, against the loop's own tally.
    let mut secs: BTreeMap<(String, i32), f64> = BTreeMap::new();
    for a in picked(&sink, Tier::Slo, |k| match k {
        Kind::AutonomySeconds(a) => Some(a),
        _ => None,
    }) {
        for m in &a.modes {
            secs.insert(
                (a.model.as_ref().unwrap().version.clone(), m.mode),
                m.seconds,
            );
        }
    }
    let total = |mode: v1::AutonomyMode| {
        secs.iter()
            .filter(|((_, m), _)| *m == mode as i32)
            .map(|(_, s)| s)
            .sum::<f64>()
    };
    for (mode, key) in [(Autonomous, "autonomous"), (Manual, "manual")] {
        let expected = j["autonomy_seconds"][key].as_f64().unwrap();
        let got = total(mode);
        assert!(
            (got - expected).abs() < 0.05,
            "{key}: sampler {got:.4} s, loop {expected:.4} s"
        );
    }
    assert!(secs[&("det-1.1".to_owned(), Autonomous as i32)] > 0.5);
}

/// Last value of each (epoch, model version) series' `DeadlineCounters`, checking on the way that
/// activations and deadline misses never go down within a series.
fn last_counters(sink: &CollectingSink) -> BTreeMap<(u64, String), &v1::DeadlineCounters> {
    let mut last: BTreeMap<(u64, String), &v1::DeadlineCounters> = BTreeMap::new();
    for c in picked(sink, Tier::Slo, |k| match k {
        Kind::DeadlineCounters(c) => Some(c),
        _ => None,
    }) {
        let key = (c.producer_epoch, c.model.as_ref().unwrap().version.clone());
        if let Some(before) = last.get(&key) {
            assert!(
                c.activations >= before.activations && c.deadline_misses >= before.deadline_misses,
                "a counter went down: {before:?} -> {c:?}"
            );
        }
        last.insert(key, c);
    }
    last
}

/// Sums a field over the series.
fn total(
    last: &BTreeMap<(u64, String), &v1::DeadlineCounters>,
    f: fn(&v1::DeadlineCounters) -> u64,
) -> u64 {
    last.values().map(|c| f(c)).sum()
}

#[test]
fn a_step_that_starts_late_and_completes_past_its_deadline_is_a_miss_from_loop_to_sampler() {
    let dir = scratch();
    let path = dir.path().join("loop.probe");
    let cfg = config(vec![probe(&path)], 0.2, |d| d.stall_min_ms = Some(1000.0));
    let mut s = DeadlineSampler::new(cfg, now());
    let mut sink = CollectingSink::default();
    // 100 Hz for 1.5 s: an overrun that meets its deadline, then four steps within their
    // budget that complete 10 ms past theirs because they start 20 ms late.
    let mut child = Running::spawn(
        &path,
        &[
            "--loop-name",
            "haul",
            "--rate-hz",
            "100",
            "--budget-ms",
            "4",
            "--duration",
            "1.5s",
            "--event",
            "overrun 1.5x at cycle 29",
            "--event",
            "late-start 20ms at cycles 30..34",
        ],
    );
    poll_until(&mut s, &mut sink, "the loop to finish", |_, _| {
        child.exited()
    });
    let out = child.output();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    poll_until(&mut s, &mut sink, "the producer's death", |_, sink| {
        states(sink, "haul").contains(&ProbeState::Died)
    });
    let tally = &j["tally"]["total"];
    let last = last_counters(&sink);
    for c in last.values() {
        assert_eq!(c.semantics(), v1::DeadlineSemantics::Completion);
        assert_eq!(c.deadline_ns, 10_000_000);
    }
    let misses = total(&last, |c| c.deadline_misses.unwrap());
    assert!(misses >= 4, "the four late steps are misses: {misses}");
    assert_eq!(misses, tally["deadline_misses"].as_u64().unwrap());
    assert_eq!(
        total(&last, |c| c.activations.unwrap()),
        tally["activations"].as_u64().unwrap()
    );
    assert_eq!(
        total(&last, |c| c.overruns.unwrap()),
        tally["overruns"].as_u64().unwrap()
    );
    // The old field keeps its old meaning: overruns.
    assert_eq!(
        total(&last, |c| c.misses),
        j["misses_observed"].as_u64().unwrap()
    );
    let bursts: Vec<_> = picked(&sink, Tier::Safety, |k| match k {
        Kind::DeadlineMissBurst(b) if b.rule() == BurstRule::Consecutive => Some(b),
        _ => None,
    })
    .collect();
    // With `burst_min_interval` at 0 a run still going at a poll is reported then and goes on
    // in a later report, so the run may arrive in pieces: together they cover the four steps.
    assert!(
        (30..=33).all(|cycle| bursts
            .iter()
            .any(|b| b.first_cycle <= cycle && cycle <= b.last_cycle)),
        "four late steps in a row are a burst: {bursts:?}"
    );
}

#[test]
fn a_loop_that_hangs_2s_at_25_hz_yields_at_least_50_deadline_misses_equal_to_its_own_tally() {
    let dir = scratch();
    let path = dir.path().join("loop.probe");
    let cfg = config(vec![probe(&path)], 0.1, |d| d.stall_min_ms = Some(100.0));
    let mut s = DeadlineSampler::new(cfg, now());
    let mut sink = CollectingSink::default();
    // 25 Hz for 4 s: activations 0..99; the hang swallows 25..74 and the loop resumes at 75.
    let mut child = Running::spawn(
        &path,
        &[
            "--loop-name",
            "haul",
            "--rate-hz",
            "25",
            "--budget-ms",
            "20",
            "--duration",
            "4s",
            "--event",
            "hang 2s at cycle 25",
        ],
    );
    // While it hangs: the producer's last record is cycle 24, a second and more ago.
    let hanging = || {
        let r = loop_probe::ProbeReader::open(&path).ok()?;
        let summary = r.summary().ok()?;
        let last = summary.last_record?;
        let silent_ns = loop_probe::clock::monotonic_ns().saturating_sub(last.release_ns);
        Some(last.cycle == 24 && silent_ns >= 1_200_000_000)
    };
    let latest_misses = |sink: &CollectingSink| {
        picked(sink, Tier::Slo, |k| match k {
            Kind::DeadlineCounters(c) => Some(c),
            _ => None,
        })
        .last()
        .and_then(|c| c.deadline_misses)
        .unwrap_or(0)
    };
    poll_until(&mut s, &mut sink, "1.2 s into the hang", |_, _| {
        hanging() == Some(true)
    });
    // Provisional counting: one more snapshot, then the loop must still be hanging.
    std::thread::sleep(Duration::from_millis(150));
    s.poll(now(), None, &mut sink);
    let while_hanging = latest_misses(&sink);
    let status = s.status(now()).next().unwrap();
    assert_eq!(
        hanging(),
        Some(true),
        "the loop recovered too early to tell"
    );
    assert!(
        while_hanging >= 25,
        "1.3 s into a hang at 25 Hz, its overdue activations are misses already: {while_hanging}"
    );
    assert_eq!(status.state, LoopState::Stalled);
    assert!(status.counts.deadline_misses >= Some(while_hanging));
    assert!(states(&sink, "haul").contains(&ProbeState::Stalled));

    poll_until(&mut s, &mut sink, "the loop to finish", |_, _| {
        child.exited()
    });
    let out = child.output();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    poll_until(&mut s, &mut sink, "the producer's death", |_, sink| {
        states(sink, "haul").contains(&ProbeState::Died)
    });
    let tally = &j["tally"]["total"];
    assert_eq!(tally["skipped"], 50);
    assert_eq!(tally["activations"], 100);
    // After recovery the probe's counts took over: no activation counted twice.
    let last = last_counters(&sink);
    let misses = total(&last, |c| c.deadline_misses.unwrap());
    assert!(misses >= 50, "{misses}");
    assert_eq!(misses, tally["deadline_misses"].as_u64().unwrap());
    assert_eq!(total(&last, |c| c.activations.unwrap()), 100);
    assert_eq!(total(&last, |c| c.skipped), 50);
    assert!(misses >= while_hanging);
}

#[test]
fn a_killed_producer_is_reported_dead_and_its_successor_restarted() {
    let dir = scratch();
    let path = dir.path().join("loop.probe");
    let mut s = DeadlineSampler::new(config(vec![probe(&path)], 0.1, |_| {}), now());
    let mut sink = CollectingSink::default();
    let args = [
        "--loop-name",
        "haul",
        "--rate-hz",
        "500",
        "--budget-ms",
        "1",
    ];
    let mut first = Running::spawn(&path, &args);
    poll_until(
        &mut s,
        &mut sink,
        "cycles from the first producer",
        |s, _| s.status(now()).next().unwrap().counts.cycles > 200,
    );
    let first_epoch = s.status(now()).next().unwrap().producer.unwrap().0;
    first.signal(libc::SIGKILL);
    first.reap();
    poll_until(&mut s, &mut sink, "DIED", |s, _| {
        s.status(now()).next().unwrap().state == LoopState::Dead
    });
    assert_eq!(states(&sink, "haul").last(), Some(&ProbeState::Died));
    let before = sink.events.len();

    let mut second = Running::spawn(&path, &args);
    poll_until(&mut s, &mut sink, "RESTARTED", |_, sink| {
        states(sink, "haul").contains(&ProbeState::Restarted)
    });
    let restarted = picked(&sink, Tier::Safety, |k| match k {
        Kind::ProbeStatus(p) if p.state() == ProbeState::Restarted => Some(p),
        _ => None,
    })
    .map(|p| (p.producer_epoch, p.pid))
    .next()
    .unwrap();
    let (new_epoch, new_pid) = restarted;
    assert_ne!(new_epoch, first_epoch);
    assert_eq!(new_pid, second.pid());
    poll_until(
        &mut s,
        &mut sink,
        "counters of the new producer",
        |_, sink| {
            sink.events[before..].iter().any(|(_, e)| {
            matches!(&e.kind, Some(Kind::DeadlineCounters(c)) if c.producer_epoch == new_epoch)
        })
        },
    );
    let old_last = picked(&sink, Tier::Slo, |k| match k {
        Kind::DeadlineCounters(c) if c.producer_epoch == first_epoch => Some(c),
        _ => None,
    })
    .last()
    .unwrap();
    let new_first = picked(&sink, Tier::Slo, |k| match k {
        Kind::DeadlineCounters(c) if c.producer_epoch == new_epoch => Some(c),
        _ => None,
    })
    .next()
    .unwrap();
    assert!(
        new_first.start_time_unix_ns > old_last.start_time_unix_ns,
        "a new producer starts a new series"
    );
    assert!(
        new_first.cycles < old_last.cycles,
        "and its counts start from zero"
    );
    second.signal(libc::SIGKILL);
    second.reap();
}

#[test]
fn a_frozen_producer_is_reported_stalled_then_recovered() {
    let dir = scratch();
    let path = dir.path().join("loop.probe");
    let cfg = config(vec![probe(&path)], 1.0, |d| d.stall_min_ms = Some(50.0));
    let mut s = DeadlineSampler::new(cfg, now());
    let mut sink = CollectingSink::default();
    let mut child = Running::spawn(
        &path,
        &[
            "--loop-name",
            "haul",
            "--rate-hz",
            "200",
            "--budget-ms",
            "1",
        ],
    );
    poll_until(&mut s, &mut sink, "a live producer", |s, _| {
        let st = s.status(now()).next().unwrap();
        st.state == LoopState::Alive && st.counts.cycles > 5
    });
    child.signal(libc::SIGSTOP);
    poll_until(&mut s, &mut sink, "STALLED", |_, sink| {
        states(sink, "haul").contains(&ProbeState::Stalled)
    });
    child.signal(libc::SIGCONT);
    poll_until(&mut s, &mut sink, "RECOVERED", |_, sink| {
        states(sink, "haul").contains(&ProbeState::Recovered)
    });
    let st = states(&sink, "haul");
    let stalled = st.iter().position(|x| *x == ProbeState::Stalled).unwrap();
    let recovered = st.iter().position(|x| *x == ProbeState::Recovered).unwrap();
    assert!(stalled < recovered, "{st:?}");
    assert!(!st.contains(&ProbeState::Died));
    child.signal(libc::SIGKILL);
    child.reap();
}

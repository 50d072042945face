//! The agent end to end with a real control loop: `edgewatch-synthetic-loop` writes a probe with
//! injected overruns, a fallback, an intervention and mode changes; what reaches the broker must
//! match what the loop says it injected.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::process::Command;
use std::time::Duration;

use edgewatch_harness::binaries::workspace_binary;
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_proto::v1::{AutonomyMode, Tier, event};
use util::{Agent, AgentSetup, Collector, wait_until};

#[test]
fn deadline_counters_fallbacks_interventions_and_autonomous_seconds_match_the_loop() {
    let broker = Mosquitto::start().unwrap();
    let collector = Collector::start(broker.addr()).unwrap();
    let probe_dir = tempfile::tempdir().unwrap();
    let probe = probe_dir.path().join("planner.probe");
    let mut setup = AgentSetup::new(broker.addr());
    setup.extra = format!(
        "\n[deadline]\nsnapshot_interval_s = 1\n\n[[probe]]\npath = \"{}\"\nloop_name = \"planner\"\nmodel_name = \"haul-perception\"\n",
        probe.display()
    );
    let agent = Agent::start(&setup);

    let synthetic =
        workspace_binary("edgewatch-synthetic-loop", "edgewatch-synthetic-loop").unwrap();
    let output = Command::new(synthetic)
        .arg("--probe")
        .arg(&probe)
        .args([
            "--loop-id",
            "1",
            "--loop-name",
            "planner",
            "--rate-hz",
            "100",
            "--budget-ms",
            "5",
            "--duration",
            "3s",
        ])
        .args(["--event", "mode autonomous at 0s"])
        .args(["--event", "model 4.2.1 at 0s"])
        .args(["--event", "overrun 3x at cycles 50..54"])
        .args(["--event", "fallback at cycle 120"])
        .args(["--event", "intervention at 1s"])
        .args(["--event", "mode manual at 2s"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let cycles = summary["cycles"].as_u64().unwrap();
    let misses = summary["misses_observed"].as_u64().unwrap();
    assert!(misses >= 4, "{summary}");

    // The final snapshot (every second) carries the loop's totals.
    let totals = || {
        collector
            .snapshot()
            .into_iter()
            .filter_map(|r| match r.event.kind {
                Some(event::Kind::DeadlineCounters(c)) => Some((c.cycles, c.misses, c.model)),
                _ => None,
            })
            .fold((0u64, 0u64, None), |acc, (c, m, model)| {
                if c >= acc.0 { (c, m, model) } else { acc }
            })
    };
    assert!(
        wait_until(Duration::from_secs(20), || totals().0 == cycles),
        "counters {:?} never reached {cycles} cycles; log:\n{}",
        (totals().0, totals().1),
        agent.log()
    );
    let (_, seen_misses, model) = totals();
    assert_eq!(seen_misses, misses);
    assert_eq!(model.unwrap().version, "4.2.1");

    let received = collector.snapshot();
    let fallbacks: u64 = received
        .iter()
        .filter_map(|r| match &r.event.kind {
            Some(event::Kind::SafetyFallback(f)) if r.tier == Tier::Safety => Some(f.delta),
            _ => None,
        })
        .sum();
    assert_eq!(fallbacks, summary["fallbacks"].as_u64().unwrap());
    let interventions: u64 = received
        .iter()
        .filter_map(|r| match &r.event.kind {
            Some(event::Kind::Intervention(i)) => Some(i.delta),
            _ => None,
        })
        .sum();
    assert_eq!(interventions, 1);
    assert!(
        received.iter().any(
            |r| matches!(&r.event.kind, Some(event::Kind::DeadlineMissBurst(_)))
                && r.tier == Tier::Safety
        ),
        "no miss burst reported"
    );

    // Autonomous seconds: the latest cumulative value, against the loop's own count.
    assert!(wait_until(Duration::from_secs(10), || {
        let autonomous = collector
            .snapshot()
            .into_iter()
            .filter_map(|r| match r.event.kind {
                Some(event::Kind::AutonomySeconds(a)) => a
                    .modes
                    .iter()
                    .find(|m| m.mode == AutonomyMode::Autonomous as i32)
                    .map(|m| m.seconds),
                _ => None,
            })
            .fold(0.0f64, f64::max);
        let expected = summary["autonomy_seconds"]["autonomous"].as_f64().unwrap();
        (autonomous - expected).abs() < 0.1
    }));
}

#[test]
fn a_replayed_tegrastats_capture_becomes_energy_counters_and_raw_samples() {
    let broker = Mosquitto::start().unwrap();
    let collector = Collector::start(broker.addr()).unwrap();
    let capture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tegrastats-parser/tests/data/orin-agx-64gb_jp6.2.1_l4t-r36.4.4.txt");
    assert!(capture.is_file(), "{}", capture.display());
    let mut setup = AgentSetup::new(broker.addr());
    setup.thermal = format!(
        "replay = \"{}\"\nreplay_speed = 20.0\nreplay_loop = true\ncounters_interval_s = 1\ndebug_sample_every = 1\nsysfs_root = \"{{dir}}/no-sysfs\"\n",
        capture.display()
    );
    let agent = Agent::start(&setup);
    let energy = || {
        collector
            .snapshot()
            .into_iter()
            .filter_map(|r| match r.event.kind {
                Some(event::Kind::EnergyCounters(e)) if r.tier == Tier::Slo => {
                    Some(e.rails.iter().map(|rail| rail.joules).sum::<f64>())
                }
                _ => None,
            })
            .fold(0.0f64, f64::max)
    };
    assert!(
        wait_until(Duration::from_secs(20), || energy() > 0.0),
        "no energy counters; log:\n{}",
        agent.log()
    );
    assert!(wait_until(Duration::from_secs(10), || {
        collector.snapshot().iter().any(|r| {
            r.tier == Tier::Debug && matches!(&r.event.kind, Some(event::Kind::ThermalSample(s)) if !s.temperatures.is_empty())
        })
    }));
    let status = agent.status();
    let sources = status["agent"]["sources"].as_array().unwrap();
    assert!(
        sources.iter().any(|s| s["name"] == "tegrastats"),
        "{sources:?}"
    );
}

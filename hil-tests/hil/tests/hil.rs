//! The HIL ladder in CI: levels 1–3 against the real agent, synthetic loops, Mosquitto and the
//! fault proxy, each writing its report; level 4's refusal off a Jetson; cyclictest output
//! captured on this kind of machine.
//!
//! The level tests take the machine to themselves (`.config/nextest.toml` gives them every test
//! slot; under `cargo test` a lock serializes them), since they measure CPU time, context
//! switches and latency.
#![allow(clippy::unwrap_used, clippy::print_stdout)] // Test code: a failed unwrap is a failed test.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use edgewatch_hil::cyclictest;
use edgewatch_hil::levels::footprint::{self, FootprintConfig};
use edgewatch_hil::levels::interference::{self, InterferenceConfig};
use edgewatch_hil::levels::invariants::{self, InvariantsConfig};
use edgewatch_hil::report::{self, RunReport};
use edgewatch_hil::rig::Binaries;
use edgewatch_hil::stats::Verdict;

const HIL: &str = env!("CARGO_BIN_EXE_edgewatch-hil");

static MACHINE: Mutex<()> = Mutex::new(());

fn binaries() -> Binaries {
    Binaries::for_tests(Path::new(HIL)).unwrap()
}

/// Writes the report into a temporary directory, prints it, and returns its text.
fn write_report(run: &RunReport<'_>) -> (String, bool) {
    let dir = tempfile::tempdir().unwrap();
    let (md, png) = report::write(dir.path(), run).unwrap();
    let text = std::fs::read_to_string(md).unwrap();
    println!("{text}");
    let png_ok = png.is_some_and(|p| std::fs::read(p).unwrap().starts_with(b"\x89PNG\r\n\x1a\n"));
    (text, png_ok)
}

#[test]
fn level_1_invariants_hold_for_the_real_agent() {
    let _machine = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    let result = invariants::run(&binaries(), &InvariantsConfig::default()).unwrap();
    let (text, _) = write_report(&RunReport {
        command: "cargo nextest run -p edgewatch-hil level_1".into(),
        invariants: Some(&result),
        ..RunReport::default()
    });
    assert!(
        text.contains("## Level 1 — invariants: PASS"),
        "see the report above"
    );
    for check in &result.checks {
        assert!(check.pass, "{}: {}", check.name, check.detail);
    }
    // The drain is measured and reported, not gated, but it must have run.
    let drain = result.drain.as_ref().expect("drain measured");
    assert!(drain.events >= 2000 && drain.batches > 0, "{drain:?}");
}

#[test]
fn level_2_footprint_stays_within_its_budgets() {
    let _machine = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    let result = footprint::run(&binaries(), &FootprintConfig::default()).unwrap();
    let (text, png) = write_report(&RunReport {
        command: "cargo nextest run -p edgewatch-hil level_2".into(),
        footprint: Some(&result),
        ..RunReport::default()
    });
    assert!(
        text.contains("## Level 2 — footprint"),
        "see the report above"
    );
    assert!(png, "the footprint run charts the loops' latency");
    for check in &result.checks {
        assert!(check.pass, "{}: {}", check.name, check.detail);
    }
}

#[test]
fn level_3_interference_is_bounded_or_skipped_with_a_reason() {
    let _machine = MACHINE.lock().unwrap_or_else(|e| e.into_inner());
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let config = InterferenceConfig {
        seed,
        ..InterferenceConfig::default()
    };
    let result = interference::run(&binaries(), &config).unwrap();
    let (text, png) = write_report(&RunReport {
        command: format!("edgewatch-hil interference --pairs 30 --seed {seed}"),
        interference: Some(&result),
        ..RunReport::default()
    });
    match &result.verdict {
        Verdict::Skip { reason } => {
            println!("SKIP: level 3 interference: {reason}");
            assert!(text.contains("SKIP: "), "the report says why");
        }
        Verdict::Pass(numbers) => {
            assert!(numbers.pairs >= 10);
            assert!(png, "a decided run charts agent on vs off");
            assert_eq!(result.pairs.len(), 30);
            // The agent worked during the "on" blocks: it sampled and drained.
            assert!(result.acked.1 > result.acked.0, "{:?}", result.acked);
        }
        Verdict::Fail(numbers) => panic!(
            "the agent raised the loop's p99 wake-up latency: {numbers:?} (seed {seed}); see the report above"
        ),
    }
}

#[test]
fn the_jetson_level_refuses_to_run_off_a_jetson_unless_forced() {
    if Path::new(edgewatch_hil::levels::jetson::TEGRA_RELEASE).exists() {
        println!("SKIP: this machine is a Jetson; the refusal cannot be shown here");
        return;
    }
    let output = Command::new(HIL)
        .args(["jetson", "--agent-pid", "1", "--out"])
        .arg(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(69));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/etc/nv_tegra_release"), "{stderr}");
    assert!(stderr.contains("--force"), "{stderr}");
}

#[test]
fn the_jetson_level_needs_to_be_told_which_agent_to_switch() {
    let output = Command::new(HIL)
        .args(["jetson", "--force", "--out"])
        .arg(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--agent-pid"));
}

#[test]
fn cyclictest_output_captured_on_this_kind_of_machine_parses() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let histogram = std::fs::read_to_string(fixtures.join("cyclictest-histogram-vm.txt")).unwrap();
    let result = cyclictest::parse(&histogram).unwrap();
    assert_eq!(
        (
            result.cycles,
            result.min_us,
            result.avg_us,
            result.max_us,
            result.overflows
        ),
        (1970, 9, 41, 6351, 15)
    );
    // `# Total:` (1955) is the histogram's own count; the 15 overflows come on top.
    let in_range: u64 = result.histogram.iter().map(|&(_, count)| count).sum();
    assert_eq!(in_range, 1955);
    let summary = std::fs::read_to_string(fixtures.join("cyclictest-summary-vm.txt")).unwrap();
    let result = cyclictest::parse(&summary).unwrap();
    assert_eq!(
        (result.cycles, result.min_us, result.avg_us, result.max_us),
        (954, 7, 79, 8424)
    );
}

//! The generated rules, checked and unit-tested by the real `promtool` (Debian's `prometheus`
//! package): `check rules` accepts them, and `test rules` shows the 1h/5m page alert firing for a
//! fast burn of deadline misses and silent for a slow one, firing on the legacy computation for
//! an agent from before deadlines and saying so, and silent for overruns that met their
//! deadline and for a probe that measures no deadline.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use edgewatch_slo::catalog::{LoopsSli, RawCatalog, RawSli};
use edgewatch_slo::{Catalog, render_rules};
use std::path::{Path, PathBuf};
use std::process::Command;

fn promtool() -> PathBuf {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("promtool"))
        .find(|p| p.is_file());
    match found {
        Some(path) => path,
        None => panic!(
            "promtool not found: run .ci/test, which installs Debian's `prometheus` package \
             (or `apt-get install prometheus`)"
        ),
    }
}

fn run(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// One 99.99 % SLO over two loops, one of them with a regex metacharacter in its name.
fn catalog() -> Catalog {
    let mut config = RawCatalog::default();
    config.slos.truncate(1);
    config.slos[0].sli = RawSli::ControlDeadline(LoopsSli {
        loops: vec!["safety.main".into(), "safety_aux".into()],
    });
    config.validate().unwrap()
}

const LABELS: &str =
    r#"machine_id="m1",machine_class="haul",site="pit-a",model="det",model_version="1.0""#;

fn series(metric: &str, loop_name: &str, values: &str) -> String {
    format!(
        "      - series: '{metric}{{{LABELS},loop=\"{loop_name}\"}}'\n        values: '{values}'\n"
    )
}

fn alert_labels(semantics: &str) -> String {
    format!(
        "              severity: page\n              slo: safety-control\n              long_window: 1h\n              short_window: 5m\n              machine_class: haul\n              site: pit-a\n              model: det\n              model_version: \"1.0\"\n              semantics: {semantics}\n"
    )
}

/// The 1h/5m page at 60m, with its labels and annotations, for rows of `semantics`.
fn page_fires(t: &mut String, semantics: &str) {
    t.push_str("    alert_rule_test:\n");
    t.push_str(
        "      - eval_time: 60m\n        alertname: SloErrorBudgetBurn1h5m\n        exp_alerts:\n",
    );
    t.push_str("          - exp_labels:\n");
    t.push_str(&alert_labels(semantics));
    t.push_str(&format!(
        "            exp_annotations:\n              summary: \"safety-control: error budget burning 14.4x over 1h and 5m\"\n              description: \"Safety-relevant on-machine AI function: control steps within their deadline. Objective 99.99% over 30d; at this rate 2% of the period's budget goes in 1h. Class haul, site pit-a, model det 1.0. Semantics {semantics}.\"\n"
    ));
}

/// No page and no 6h/30m page at 60m.
fn no_page(t: &mut String) {
    t.push_str("    alert_rule_test:\n");
    for alert in ["SloErrorBudgetBurn1h5m", "SloErrorBudgetBurn6h30m"] {
        t.push_str(&format!(
            "      - eval_time: 60m\n        alertname: {alert}\n        exp_alerts: []\n"
        ));
    }
}

/// `expr` at 60m: one sample per `(semantics, value)`, none for an empty list.
fn recorded(t: &mut String, expr: &str, samples: &[(&str, &str)]) {
    t.push_str(&format!(
        "      - expr: {expr}\n        eval_time: 60m\n        exp_samples:{}\n",
        if samples.is_empty() { " []" } else { "" }
    ));
    for (semantics, value) in samples {
        t.push_str(&format!(
            "          - labels: '{expr}{{slo=\"safety-control\",machine_class=\"haul\",site=\"pit-a\",model=\"det\",model_version=\"1.0\",semantics=\"{semantics}\"}}'\n            value: {value}\n"
        ));
    }
}

/// A promtool unit-test file. Arithmetic of the scenarios (25 Hz loop → 1500 activations/min):
/// - fast burn: 15 deadline misses/min → error ratio 15/1500 = 1 % → burn 0.01 / 0.0001 = 100 >
///   14.4 over both 1h and 5m: the page fires at 60m.
/// - slow burn: 1 miss per 2000 activations → 0.05 % → burn 5 < 14.4: no 1h/5m page (nor
///   6h/30m, 6). A loop named `safetyXmain` burns hard beside it: it must not match
///   `safety.main`.
/// - an agent from before deadlines, 15 overruns/min sent as misses: the legacy computation
///   burns at 100 and pages, saying so in its `semantics` label.
/// - overruns meeting their deadline: the same 15 overruns/min beside 1500 activations without
///   a deadline miss: the group counts by completion only, and nothing fires.
/// - an ABI 1 probe: its activations beside the overruns: not measured, so no ratio and no page.
fn test_file() -> String {
    let mut t = String::from("rule_files:\n  - rules.yml\nevaluation_interval: 1m\ntests:\n");
    t.push_str("  - name: fast burn\n    interval: 1m\n    input_series:\n");
    t.push_str(&series(
        "edge_control_activations_total",
        "safety.main",
        "0+1500x120",
    ));
    t.push_str(&series(
        "edge_control_activations_missed_total",
        "safety.main",
        "0+15x120",
    ));
    page_fires(&mut t, "completion");
    // Totals are recorded, not ratios: 5 min × 1500 = 7500 activations, 75 misses, ratio 0.01.
    t.push_str("    promql_expr_test:\n");
    for (expr, value) in [
        ("slo:sli_total:increase5m", "7500"),
        ("slo:sli_error:increase5m", "75"),
        ("slo:sli_error:ratio_rate5m", "0.01"),
    ] {
        recorded(&mut t, expr, &[("completion", value)]);
    }

    t.push_str("  - name: slow burn\n    interval: 1m\n    input_series:\n");
    t.push_str(&series(
        "edge_control_activations_total",
        "safety.main",
        "0+2000x120",
    ));
    t.push_str(&series(
        "edge_control_activations_missed_total",
        "safety.main",
        "0+1x120",
    ));
    t.push_str(&series(
        "edge_control_activations_total",
        "safetyXmain",
        "0+1500x120",
    ));
    t.push_str(&series(
        "edge_control_activations_missed_total",
        "safetyXmain",
        "0+1500x120",
    ));
    no_page(&mut t);

    t.push_str("  - name: agent before deadlines\n    interval: 1m\n    input_series:\n");
    t.push_str(&series(
        "edge_control_cycles_total",
        "safety.main",
        "0+1500x120",
    ));
    t.push_str(&series(
        "edge_control_deadline_missed_total",
        "safety.main",
        "0+15x120",
    ));
    page_fires(&mut t, "legacy_agent");
    t.push_str("    promql_expr_test:\n");
    recorded(
        &mut t,
        "slo:sli_error:ratio_rate5m",
        &[("legacy_agent", "0.01")],
    );

    t.push_str("  - name: overruns meeting their deadline\n    interval: 1m\n    input_series:\n");
    t.push_str(&series(
        "edge_control_activations_total",
        "safety.main",
        "0+1500x120",
    ));
    t.push_str(&series(
        "edge_control_activations_missed_total",
        "safety.main",
        "0+0x120",
    ));
    t.push_str(&series(
        "edge_control_cycles_total",
        "safety.main",
        "0+1500x120",
    ));
    t.push_str(&series(
        "edge_control_deadline_missed_total",
        "safety.main",
        "0+15x120",
    ));
    no_page(&mut t);
    t.push_str("    promql_expr_test:\n");
    recorded(&mut t, "slo:sli_error:ratio_rate5m", &[("completion", "0")]);

    t.push_str("  - name: ABI 1 probe\n    interval: 1m\n    input_series:\n");
    t.push_str(&series(
        "edge_control_legacy_probe_activations_total",
        "safety.main",
        "0+1500x120",
    ));
    t.push_str(&series(
        "edge_control_cycles_total",
        "safety.main",
        "0+1500x120",
    ));
    t.push_str(&series(
        "edge_control_deadline_missed_total",
        "safety.main",
        "0+15x120",
    ));
    no_page(&mut t);
    t.push_str("    promql_expr_test:\n");
    recorded(&mut t, "slo:sli_error:ratio_rate5m", &[]);
    t
}

#[test]
fn promtool_accepts_the_rules_of_the_default_catalog() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yml"),
        render_rules(&Catalog::default()),
    )
    .unwrap();
    let out = run(dir.path(), &["check", "rules", "rules.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn promtool_unit_tests_show_the_page_alert_for_a_fast_burn_and_not_for_a_slow_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yml"), render_rules(&catalog())).unwrap();
    std::fs::write(dir.path().join("test.yml"), test_file()).unwrap();
    run(dir.path(), &["check", "rules", "rules.yml"]);
    let out = run(dir.path(), &["test", "rules", "test.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn promtool_unit_test_fails_when_the_fast_burn_data_is_replaced_by_a_slow_one() {
    // Guards the test above against passing vacuously: same expectations, no burn in the data.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("rules.yml"), render_rules(&catalog())).unwrap();
    let calm = test_file().replacen("0+15x120", "0+1x120", 1);
    assert_ne!(calm, test_file());
    std::fs::write(dir.path().join("test.yml"), calm).unwrap();
    let out = Command::new(promtool())
        .args(["test", "rules", "test.yml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("alertname: SloErrorBudgetBurn1h5m"), "{text}");
}

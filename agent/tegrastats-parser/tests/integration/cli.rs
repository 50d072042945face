//! The `tegrastats-parser` binary, run as a real process on files and standard input.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use tegrastats_parser::parse_line;

use crate::fixtures::{capture, captures};

const BIN: &str = env!("CARGO_BIN_EXE_tegrastats-parser");

fn run_with_stdin(args: &[&str], input: &str) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn json_lines(output: &Output) -> Vec<Value> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

#[test]
fn every_capture_line_becomes_one_json_object_in_input_order() {
    let all = captures();
    let input: String = all.iter().map(|c| format!("{}\n", c.line)).collect();
    let output = run_with_stdin(&[], &input);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stderr(&output), "");
    let objects = json_lines(&output);
    assert_eq!(objects.len(), all.len());
    for (c, object) in all.iter().zip(&objects) {
        let sample = parse_line(&c.line).unwrap();
        let ram = sample.ram().unwrap();
        assert_eq!(object["ram"]["used_mb"], ram.used_mb, "{}", c.origin());
        assert_eq!(object["ram"]["total_mb"], ram.total_mb, "{}", c.origin());
        assert_eq!(
            object["cpus"].as_array().unwrap().len(),
            sample.cpus().len()
        );
        assert_eq!(
            object["temperatures"].as_array().unwrap().len(),
            sample.temperatures().len()
        );
        assert_eq!(
            object["rails"].as_array().unwrap().len(),
            sample.rails().len()
        );
        assert_eq!(object["unknown"], Value::Array(vec![]));
        match sample.timestamp() {
            Some(t) => assert_eq!(object["timestamp"], t.to_string()),
            None => assert_eq!(object["timestamp"], Value::Null),
        }
    }
}

#[test]
fn json_uses_null_for_values_the_line_does_not_print() {
    let thor = capture("thor_jp7.1_l4t-r38.4.txt", 1);
    let orin_jp5 = capture("orin-agx-64gb_jp5.1_l4t-r35.2-35.3.txt", 1);
    let orin_nx = capture("orin-nx-16gb_jp5.1.1_l4t-r35.3.1.txt", 1);
    let old = capture("tx2-or-drivepx2_l4t-r27-r28.1_old-format.txt", 1);
    let input = format!("{thor}\n{orin_jp5}\n{orin_nx}\n{old}\n");
    let output = run_with_stdin(&["--json"], &input);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let objects = json_lines(&output);

    let thor = &objects[0];
    assert_eq!(thor["timestamp"], "05-17-2026 10:00:32");
    assert_eq!(thor["gpu"]["load_pct"], Value::Null);
    assert_eq!(thor["gpu"]["freq_mhz"], serde_json::json!([0, 0, 0]));
    assert_eq!(
        thor["temperatures"][0],
        serde_json::json!({"zone": "cpu", "celsius": 34.468, "max_celsius": null})
    );
    assert_eq!(
        thor["rails"][1],
        serde_json::json!({"name": "VDD_CPU_SOC_MSS", "current_mw": 4165, "average_mw": 4165, "max_mw": null})
    );

    let orin_jp5 = &objects[1];
    assert_eq!(
        orin_jp5["temperatures"][0],
        serde_json::json!({"zone": "CV0", "celsius": null, "max_celsius": null})
    );
    assert_eq!(
        orin_jp5["gpu"],
        serde_json::json!({"load_pct": 0, "freq_mhz": [0, 0]})
    );

    let orin_nx = &objects[2];
    assert_eq!(
        orin_nx["cpus"][4],
        serde_json::json!({"online": false, "load_pct": null, "freq_mhz": null})
    );
    assert_eq!(
        orin_nx["cpus"][0],
        serde_json::json!({"online": true, "load_pct": 6, "freq_mhz": 729})
    );

    let old = &objects[3];
    assert_eq!(old["gpu"], Value::Null);
    assert_eq!(old["timestamp"], Value::Null);
    assert_eq!(old["temperatures"], serde_json::json!([]));
}

#[test]
fn bad_lines_go_to_stderr_with_line_and_column_and_the_rest_still_print() {
    let good = capture("xavier-nx_jp5.1.2_l4t-r35.4.txt", 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log.txt");
    let text = format!("{good}\nMon Dec 14 10:00:00 PST 2020\n\n{good} NEWFIELD ??\r\nRAM 1205/\n");
    std::fs::write(&path, text).unwrap();
    let output = Command::new(BIN).arg(&path).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        stderr(&output),
        "line 2, column 1: not a tegrastats line: no known field\n\
         line 5, column 10: malformed RAM field: expected `USED/TOTALMB`\n"
    );
    let objects = json_lines(&output);
    assert_eq!(objects.len(), 2, "the blank line 3 is skipped");
    assert_eq!(objects[0]["unknown"], serde_json::json!([]));
    assert_eq!(objects[1]["unknown"], serde_json::json!(["NEWFIELD", "??"]));
    assert_eq!(objects[0]["ram"]["used_mb"], 3168);
}

#[test]
fn a_dash_reads_standard_input() {
    let line = capture("tx1_l4t-r28.1_old-format.txt", 1);
    let output = run_with_stdin(&["--json", "-"], &format!("{line}\n"));
    assert_eq!(output.status.code(), Some(0));
    let objects = json_lines(&output);
    assert_eq!(
        objects[0]["cpus"][0],
        serde_json::json!({"online": true, "load_pct": 17, "freq_mhz": 408})
    );
}

#[test]
fn an_unknown_option_is_a_usage_error_naming_it() {
    let output = Command::new(BIN).arg("--yaml").output().unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(
        stderr(&output).starts_with("tegrastats-parser: unknown option `--yaml`"),
        "{}",
        stderr(&output)
    );
    let output = Command::new(BIN).args(["a.txt", "b.txt"]).output().unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(stderr(&output).contains("`b.txt`"));
}

#[test]
fn a_missing_file_exits_66_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.log");
    let output = Command::new(BIN).arg(&path).output().unwrap();
    assert_eq!(output.status.code(), Some(66));
    assert!(
        stderr(&output).contains("absent.log"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn help_prints_usage_and_exits_0() {
    let output = Command::new(BIN).arg("--help").output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(
        String::from_utf8(output.stdout)
            .unwrap()
            .starts_with("usage: tegrastats-parser [--json] [FILE]")
    );
}

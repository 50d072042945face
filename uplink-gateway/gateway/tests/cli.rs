//! The command line: a bad configuration or argument exits with status 64 naming the key; `rules`
//! renders the catalog; `report` and `fleet` read an (empty) store; `dashboards` writes what
//! Grafana provisions.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::process::{Command, Output};

fn gateway(config: &str, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let text = config.replace("STORE", &dir.path().join("s.redb").display().to_string());
    let file = dir.path().join("gw.toml");
    std::fs::write(&file, text).unwrap();
    Command::new(env!("CARGO_BIN_EXE_edgewatch-gateway"))
        .args(args)
        .arg("--config")
        .arg(&file)
        .output()
        .unwrap()
}

const GOOD: &str = "[mqtt]\nhost = \"127.0.0.1\"\nclient_id = \"gw\"\n[store]\npath = \"STORE\"\n";

#[test]
fn a_bad_configuration_exits_64_naming_the_key() {
    for (config, key) in [
        (GOOD.replace("client_id", "colour = 1\nclient_id"), "colour"),
        (
            GOOD.replace("[store]", "[ingest]\nfreshness_limit = \"soon\"\n[store]"),
            "ingest.freshness_limit",
        ),
        (
            format!("{GOOD}[metrics]\nlisten = \"everywhere\"\n"),
            "metrics.listen",
        ),
    ] {
        let output = gateway(&config, &["check-config"]);
        assert_eq!(output.status.code(), Some(64));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&format!("`{key}`")), "{stderr}");
    }
}

#[test]
fn export_focus_without_a_price_book_exits_64_naming_prices() {
    let output = gateway(GOOD, &["export-focus"]);
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("`prices`"));
}

#[test]
fn rules_render_the_built_in_catalog() {
    let output = gateway(GOOD, &["rules"]);
    assert!(output.status.success());
    let rules = String::from_utf8(output.stdout).unwrap();
    assert!(rules.contains("slo:sli_error:ratio_rate"));
    assert!(rules.contains("SloErrorBudgetBurn1h5m"));
}

#[test]
fn a_report_on_a_store_without_samples_has_no_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.redb");
    drop(edgewatch_gateway::store::Store::open_path(&store).unwrap());
    let config = GOOD.replace("STORE", &store.display().to_string());
    let output = gateway(&config, &["report", "--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["slo"]["rows"].as_array().unwrap().len(), 0);
}

#[test]
fn dashboards_write_four_dashboards_and_the_provisioning_files_for_grafana() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().display().to_string();
    let output = gateway(
        GOOD,
        &[
            "dashboards",
            "--out",
            &dir,
            "--prometheus",
            "http://prometheus:9090",
            "--datasource-uid",
            "site-prom",
            "--dashboards-path",
            "/var/lib/grafana/dashboards/edgewatch",
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut files: Vec<String> = std::fs::read_dir(out.path().join("dashboards"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "edgewatch-cost.json",
            "edgewatch-fleet.json",
            "edgewatch-machine.json",
            "edgewatch-slo-burn.json"
        ]
    );
    for file in &files {
        let text = std::fs::read_to_string(out.path().join("dashboards").join(file)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["schemaVersion"], 41);
        assert!(
            !text.contains("edgewatch-prometheus"),
            "{file} names the default uid"
        );
    }
    let datasource =
        std::fs::read_to_string(out.path().join("provisioning/datasources/edgewatch.yaml"))
            .unwrap();
    assert!(datasource.contains("uid: \"site-prom\""), "{datasource}");
    assert!(datasource.contains("url: \"http://prometheus:9090\""));
    let provider =
        std::fs::read_to_string(out.path().join("provisioning/dashboards/edgewatch.yaml")).unwrap();
    assert!(provider.contains("path: \"/var/lib/grafana/dashboards/edgewatch\""));
}

#[test]
fn dashboards_with_a_bad_url_or_uid_exit_64_naming_the_flag() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().display().to_string();
    for (args, key) in [
        (vec!["--prometheus", "prometheus:9090"], "--prometheus"),
        (
            vec![
                "--prometheus",
                "http://127.0.0.1:9090",
                "--datasource-uid",
                "a/b",
            ],
            "--datasource-uid",
        ),
    ] {
        let mut all = vec!["dashboards", "--out", &dir];
        all.extend(args);
        let output = gateway(GOOD, &all);
        assert_eq!(output.status.code(), Some(64));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&format!("`{key}`")), "{stderr}");
    }
}

#[test]
fn fleet_arguments_out_of_bounds_exit_64_naming_the_argument() {
    for (args, named) in [
        (&["fleet", "--sort", "newest"][..], "--sort"),
        (&["fleet", "--window", "24"][..], "--window"),
        (&["fleet", "--window", "10s"][..], "--window"),
        (&["fleet", "--lookback", "forever"][..], "--lookback"),
        (&["fleet", "--at", "yesterday"][..], "--at"),
    ] {
        let output = gateway(GOOD, args);
        assert_eq!(output.status.code(), Some(64), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&format!("`{named}`")), "{args:?}: {stderr}");
    }
}

#[test]
fn fleet_on_a_store_without_samples_lists_no_machine() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.redb");
    drop(edgewatch_gateway::store::Store::open_path(&store).unwrap());
    let config = GOOD.replace("STORE", &store.display().to_string());
    let output = gateway(&config, &["fleet", "--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(table["machines"].as_array().unwrap().len(), 0);
    let text = gateway(&config, &["fleet"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("No machine has reported"));
}

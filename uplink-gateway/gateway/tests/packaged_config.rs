//! The gateway's configuration documentation stays true to the code: the packaged default file
//! (`config/gateway.toml`, installed as `/etc/edgewatch/gateway.toml`) passes `check-config` with
//! and without its TLS table, keeps its store where the unit may write, and its commented lines
//! state the defaults; the reference in `docs/configuration.md` has a row and an example line for
//! every key the parser accepts, and the `[slo]`/`[prices]` example of `docs/slo-catalog.md` shows
//! every key of those tables. Every gateway metric the operator documents name is one the
//! gateway exports.
//!
//! The accepted keys are read from the parser's own refusal of an unknown key ("expected one of
//! ..."), so a key added to the code and not to the documentation fails these tests.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::BTreeSet;
use std::process::Command;

use edgewatch_gateway::config::Config;
use edgewatch_test_kit::config_docs::{
    accepted_keys_in_refusal, fenced, section, uncomment_stated_defaults, uncomment_table,
};

const PACKAGED_PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/gateway.toml");
const PACKAGED: &str = include_str!("../config/gateway.toml");
const CONFIGURATION: &str = include_str!("../../../docs/configuration.md");
const SLO_CATALOG: &str = include_str!("../../../docs/slo-catalog.md");
const RUNBOOK: &str = include_str!("../../../docs/runbook.md");
const SECURITY: &str = include_str!("../../../docs/security.md");
const GATEWAY: &str = include_str!("../../../docs/gateway.md");
const SERIES: &str = include_str!("../../../docs/series.md");

/// The tables of the gateway's file with a row per key in the reference: (dotted table, heading
/// of its section).
const TABLES: [(&str, &str); 8] = [
    ("mqtt", "### `[mqtt]`"),
    ("mqtt.tls", "### `[mqtt.tls]`"),
    ("ingest", "### `[ingest]`"),
    ("dedup", "### `[dedup]`"),
    ("store", "### `[store]`"),
    ("metrics", "### `[metrics]`"),
    ("http", "### `[http]`"),
    ("remote_write", "### `[remote_write]`"),
];

/// Tables whose keys are shown in the example of `docs/slo-catalog.md`, with the TOML that opens
/// one of them.
const SLO_TABLES: [(&str, &str); 8] = [
    ("slo", "[slo]"),
    ("slo.slos", "[[slo.slos]]"),
    ("slo.alert_windows", "[[slo.alert_windows]]"),
    ("slo.policy", "[[slo.policy]]"),
    ("prices", "[prices]"),
    ("prices.machine_classes.x", "[prices.machine_classes.x]"),
    ("prices.sites.x", "[prices.sites.x]"),
    ("prices.shares", "[[prices.shares]]"),
];

/// The required keys only, for provoking the parser.
const REQUIRED: &str = "[mqtt]\nhost = \"h\"\nclient_id = \"c\"\n[store]\npath = \"/s\"\n";

/// The keys the parser accepts in the table that `opening` opens ("" for the top level).
fn accepted_keys(opening: &str) -> Vec<String> {
    const PROBE: &str = "zz_not_a_key = 1\n";
    let text = match opening {
        "" => format!("{PROBE}{REQUIRED}"),
        "[mqtt]" | "[store]" => {
            REQUIRED.replace(&format!("{opening}\n"), &format!("{opening}\n{PROBE}"))
        }
        other => format!("{REQUIRED}{other}\n{PROBE}"),
    };
    let error = Config::from_toml(&text).unwrap_err().reason;
    accepted_keys_in_refusal(opening, &error)
}

/// The gateway section's complete example.
fn complete_example() -> &'static str {
    let gateway = &CONFIGURATION[CONFIGURATION.find("\n## Gateway").unwrap()..];
    fenced(section(gateway, "### Complete example"), "toml")
}

/// Keys assigned in TOML text (`key = ...` at the start of a line, comments included).
fn assigned_keys(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim_start_matches(['#', ' ']);
            let (key, _) = line.split_once(" = ")?;
            key.chars()
                .all(|c| c.is_ascii_lowercase() || c == '_')
                .then(|| key.to_owned())
        })
        .collect()
}

fn check_config(text: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    Command::new(env!("CARGO_BIN_EXE_edgewatch-gateway"))
        .arg("--config")
        .arg(&path)
        .arg("check-config")
        .output()
        .unwrap()
}

#[test]
fn the_packaged_configuration_passes_check_config() {
    let output = Command::new(env!("CARGO_BIN_EXE_edgewatch-gateway"))
        .args(["--config", PACKAGED_PATH, "check-config"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("/var/lib/edgewatch-gateway/"));
}

#[test]
fn the_packaged_configuration_uses_a_state_directory_store_and_loopback_metrics_and_no_tls_yet() {
    let config = Config::from_toml(PACKAGED).unwrap();
    assert!(config.store.path.starts_with("/var/lib/edgewatch-gateway"));
    // Certificates are a provisioning step: the shipped file must pass without them.
    assert!(config.mqtt.tls.is_none());
    assert!(config.metrics_listen.unwrap().ip().is_loopback());
    assert!(config.remote_write.is_none());
}

#[test]
fn the_packaged_tls_table_once_uncommented_passes_check_config_and_names_the_provisioned_files() {
    let provisioned = uncomment_table(PACKAGED, "mqtt.tls");
    let output = check_config(&provisioned);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tls = Config::from_toml(&provisioned).unwrap().mqtt.tls.unwrap();
    assert!(tls.ca_file.starts_with("/etc/edgewatch/tls"));
    let (cert, key) = tls.client.unwrap();
    assert!(cert.starts_with("/etc/edgewatch/tls") && key.starts_with("/etc/edgewatch/tls"));
}

#[test]
fn every_key_the_parser_accepts_has_a_row_in_the_reference_and_a_line_in_the_complete_example() {
    let gateway = &CONFIGURATION[CONFIGURATION.find("\n## Gateway").unwrap()..];
    for table in accepted_keys("") {
        let mentioned = format!("`[{table}]`");
        assert!(
            gateway
                .lines()
                .any(|line| line.starts_with("### ") && line.contains(&mentioned)),
            "no section for [{table}] in the Gateway part of docs/configuration.md"
        );
    }
    let example = complete_example();
    let in_example = assigned_keys(example);
    let nested: Vec<&str> = TABLES.iter().map(|(table, _)| *table).collect();
    for (table, heading) in TABLES {
        let rows: Vec<&str> = section(gateway, heading)
            .lines()
            .filter(|line| line.starts_with("| `"))
            .collect();
        for key in accepted_keys(&format!("[{table}]")) {
            if nested.contains(&format!("{table}.{key}").as_str()) {
                continue;
            }
            assert!(
                rows.iter()
                    .any(|row| row.starts_with(&format!("| `{key}`"))),
                "{table}.{key} has no row in the section {heading} of docs/configuration.md"
            );
            assert!(
                in_example.contains(&key),
                "{table}.{key} is missing from the gateway's complete example"
            );
        }
    }
}

#[test]
fn every_key_of_the_reference_is_one_the_parser_accepts() {
    let gateway = &CONFIGURATION[CONFIGURATION.find("\n## Gateway").unwrap()..];
    let mut checked = 0;
    for (table, heading) in TABLES {
        let known = accepted_keys(&format!("[{table}]"));
        for row in section(gateway, heading)
            .lines()
            .filter(|line| line.starts_with("| `"))
        {
            let cell = row.trim_start_matches('|').split('|').next().unwrap_or("");
            for key in cell.split('`').skip(1).step_by(2) {
                checked += 1;
                assert!(
                    known.iter().any(|k| k == key),
                    "the section {heading} of docs/configuration.md documents `{key}`, which the parser refuses"
                );
            }
        }
    }
    assert!(checked >= 30, "only {checked} documented keys");
}

#[test]
fn the_slo_catalog_example_shows_every_key_of_the_slo_and_prices_tables() {
    let example = fenced(section(SLO_CATALOG, "## Example configuration"), "toml");
    let shown = assigned_keys(example);
    for (table, opening) in SLO_TABLES {
        for key in accepted_keys(opening) {
            let nested = SLO_TABLES
                .iter()
                .any(|(t, _)| t.starts_with(&format!("{table}.{key}")));
            assert!(
                nested || shown.contains(&key),
                "{table}.{key} is not shown in the example of docs/slo-catalog.md"
            );
        }
    }
    let output = check_config(&format!("{REQUIRED}{example}"));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_complete_example_passes_check_config_and_its_default_lines_state_the_defaults() {
    let example = complete_example();
    let output = check_config(example);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let without_defaults: String = example
        .lines()
        .filter(|line| !line.ends_with("# default"))
        .map(|line| format!("{line}\n"))
        .collect();
    let removed = example.lines().count() - without_defaults.lines().count();
    assert!(removed >= 15, "only {removed} lines state a default");
    assert_eq!(
        format!("{:?}", Config::from_toml(&without_defaults).unwrap()),
        format!("{:?}", Config::from_toml(example).unwrap())
    );
}

#[test]
fn uncommenting_the_stated_defaults_of_the_packaged_configuration_changes_nothing() {
    let (uncommented, stated) = uncomment_stated_defaults(PACKAGED);
    assert!(stated >= 8, "only {stated} stated defaults");
    assert_eq!(
        format!("{:?}", Config::from_toml(&uncommented).unwrap()),
        format!("{:?}", Config::from_toml(PACKAGED).unwrap())
    );
}

#[test]
fn gateway_metrics_named_in_the_operator_documents_are_exported() {
    let exported: BTreeSet<String> = edgewatch_gateway::metrics::Metrics::default()
        .render()
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split(' ').next())
        .map(str::to_owned)
        .collect();
    let mut checked = 0;
    for (name, doc) in [
        ("runbook.md", RUNBOOK),
        ("security.md", SECURITY),
        ("configuration.md", CONFIGURATION),
        ("gateway.md", GATEWAY),
    ] {
        for (at, _) in doc.match_indices("edgewatch_gateway_") {
            let metric: String = doc[at..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            checked += 1;
            assert!(
                exported.contains(&metric),
                "docs/{name} names {metric}, which the gateway does not export"
            );
        }
    }
    assert!(checked >= 15, "only {checked} metric references found");
}

/// The last number of each line of a sizing block.
fn last_numbers(block: &str) -> Vec<u32> {
    block
        .lines()
        .filter_map(|line| line.split_whitespace().last()?.parse().ok())
        .collect()
}

#[test]
fn the_default_series_budget_is_the_sum_shown_in_the_series_contract() {
    // The last number of each line of the arithmetic in docs/series.md, "Budget".
    let budget = section(SERIES, "## Budget");
    let sizing = fenced(budget, "text");
    let numbers = last_numbers(sizing);
    let [
        loops,
        events,
        throttle,
        autonomy,
        energy,
        version,
        two,
        losses,
        backlog,
        needed,
        margin,
        total,
    ] = numbers[..]
    else {
        panic!("unexpected sizing lines: {numbers:?}\n{sizing}");
    };
    assert_eq!(loops + events + throttle + autonomy + energy, version);
    assert_eq!(2 * version, two);
    assert_eq!(two + losses + backlog, needed);
    assert_eq!(version, margin, "the margin is one more model version");
    assert_eq!(needed + margin, total);
    assert_eq!(
        total,
        edgewatch_gateway::config::DEFAULT_MAX_SERIES_PER_MACHINE
    );
    assert_eq!(
        Config::from_toml(PACKAGED)
            .unwrap()
            .ingest
            .max_series_per_machine,
        total
    );
    // The gateway's own series of a machine, outside the budget: the second block.
    let after = &budget[budget.find(sizing).unwrap() + sizing.len()..];
    let own = last_numbers(fenced(after, "text"));
    let [freshness, connection, per_two_versions, at_two] = own[..] else {
        panic!("unexpected lines of the gateway's own series: {own:?}");
    };
    assert_eq!(freshness + connection + per_two_versions, at_two);
    // `tests/fleet_series.rs` counts what a machine really owns against both blocks.
}

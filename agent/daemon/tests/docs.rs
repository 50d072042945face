//! The operator documentation stays true to the agent: the configuration reference and its
//! complete example (`docs/configuration.md`), the packaged default configuration
//! (`config/agent.toml`), the agent keys named in the runbook, security model and wire protocol,
//! the documents index, and the broker ACL of `docs/security.md`, run by a real Mosquitto against
//! the real agent.
//!
//! The status fields the runbook names are read from a real agent's `status --json` and its
//! queue's snapshot file; the message and event kind names they use, from the wire format.
//!
//! The keys the parser accepts are not listed here by hand: each table's list is read from the
//! parser's own refusal of an unknown key ("expected one of ..."), so a key added to the code and
//! not to the documentation fails these tests.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use edgewatch_agent::config::Config;
use edgewatch_harness::mosquitto::{Mosquitto, MosquittoOptions};
use edgewatch_harness::pki::FleetPki;
use edgewatch_proto::v1::Tier;
use edgewatch_test_kit::config_docs::{
    accepted_keys_in_refusal, fenced, section, uncomment_stated_defaults, uncomment_table,
};
use util::{Agent, AgentSetup, BIN, Collector, check_config, submit_all, test_event, wait_until};

const CONFIGURATION: &str = include_str!("../../../docs/configuration.md");
const RUNBOOK: &str = include_str!("../../../docs/runbook.md");
const SECURITY: &str = include_str!("../../../docs/security.md");
const WIRE_PROTOCOL: &str = include_str!("../../../docs/wire-protocol.md");
const INDEX: &str = include_str!("../../../docs/README.md");
const PACKAGED: &str = include_str!("../config/agent.toml");
const PROTO_GENERATED: &str = include_str!("../../../proto/src/generated/edgewatch.v1.rs");
const PROTO_FRAMING: &str = include_str!("../../../proto/src/framing.rs");

/// The tables of the agent's file: (dotted table, heading of its section in the reference, prefix
/// of its keys in that section's rows).
const TABLES: [(&str, &str, &str); 14] = [
    ("machine", "### `[machine]`", ""),
    ("queue", "### `[queue]`", ""),
    ("queue.share_percent", "### `[queue]`", "share_percent."),
    ("queue.max_age", "### `[queue]`", "max_age."),
    ("queue.max_age_s", "### `[queue]`", "max_age_s."),
    ("uplink", "### `[uplink]`", ""),
    ("uplink.tls", "### `[uplink.tls]`", ""),
    ("uplink.topics", "### `[uplink.topics]`", ""),
    ("scheduling", "### `[scheduling]`", ""),
    ("ingest", "### `[ingest]`", ""),
    ("status", "### `[status]`", ""),
    ("deadline", "### `[deadline]`", ""),
    ("probe", "### `[[probe]]`", ""),
    ("model", "### `[model]`", ""),
];

/// The required keys only, for provoking the parser.
const REQUIRED: &str = "[machine]\nid = \"m\"\nsite = \"s\"\nclass = \"c\"\n\
                        [queue]\ndir = \"/q\"\n[uplink]\nhost = \"h\"\nport = 1\n";

fn parse(text: &str) -> Config {
    Config::parse(text, Path::new("agent.toml")).unwrap_or_else(|error| panic!("{error}"))
}

/// The keys the parser accepts in `table` ("" for the top level).
fn accepted_keys(table: &str) -> Vec<String> {
    const PROBE: &str = "zz_not_a_key = 1\n";
    let text = match table {
        "" => format!("{PROBE}{REQUIRED}"),
        "machine" | "queue" | "uplink" => {
            REQUIRED.replace(&format!("[{table}]\n"), &format!("[{table}]\n{PROBE}"))
        }
        "probe" => format!("{REQUIRED}[[probe]]\n{PROBE}"),
        other => format!("{REQUIRED}[{other}]\n{PROBE}"),
    };
    let error = Config::parse(&text, Path::new("agent.toml"))
        .unwrap_err()
        .to_string();
    accepted_keys_in_refusal(table, &error)
}

fn complete_example() -> &'static str {
    fenced(section(CONFIGURATION, "### Complete example"), "toml")
}

/// Dotted keys of a TOML document; arrays of tables contribute their entries' keys.
fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeSet<String>) {
    match value {
        toml::Value::Table(table) => {
            for (key, value) in table {
                let dotted = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                out.insert(dotted.clone());
                flatten(&dotted, value, out);
            }
        }
        toml::Value::Array(items) if items.iter().all(toml::Value::is_table) => {
            for item in items {
                flatten(prefix, item, out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_documented_complete_example_passes_check_config() {
    let output = check_config(complete_example());
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_documented_complete_example_states_the_defaults() {
    let example = parse(complete_example());
    let minimal = parse(&format!(
        "[machine]\nid = \"{}\"\nsite = \"{}\"\nclass = \"{}\"\n[queue]\ndir = \"{}\"\n\
         [uplink]\nhost = \"{}\"\nport = {}\n",
        example.machine.id,
        example.machine.site,
        example.machine.class,
        example.queue.dir.display(),
        example.uplink.host,
        example.uplink.port,
    ));
    assert_eq!(example.queue.queue.get(), minimal.queue.queue.get());
    let mut uplink = example.uplink.clone();
    assert!(uplink.tls.take().is_some(), "the example shows mTLS");
    assert_eq!(format!("{uplink:?}"), format!("{:?}", minimal.uplink));
    assert_eq!(
        format!("{:?}", example.scheduling),
        format!("{:?}", minimal.scheduling)
    );
    assert_eq!(
        format!("{:?}", example.ingest),
        format!("{:?}", minimal.ingest)
    );
    assert_eq!(example.status_file, minimal.status_file);
    assert_eq!(example.thermal, minimal.thermal);

    // [deadline] at its defaults, and the probe inheriting them.
    let mut deadline = example.deadline.clone();
    let probe = deadline.probes.remove(0);
    assert_eq!(deadline, minimal.deadline);
    let bare_probe = parse(&format!(
        "{REQUIRED}[[probe]]\npath = \"{}\"\n",
        probe.path.display()
    ));
    assert_eq!(probe.burst, bare_probe.deadline.probes[0].burst);
    assert_eq!(probe.histogram, bare_probe.deadline.probes[0].histogram);

    // [model] at its defaults apart from the manifest.
    let model = example.model.unwrap();
    let bare_model = parse(&format!(
        "{REQUIRED}[model]\nmanifest = \"{}\"\n",
        model.manifest.display()
    ));
    assert_eq!(Some(model), bare_model.model);
}

#[test]
fn every_key_the_parser_accepts_is_in_the_reference_and_in_the_complete_example() {
    let top = accepted_keys("");
    for table in &top {
        let heading = if table == "probe" {
            "### `[[probe]]`".to_owned()
        } else {
            format!("### `[{table}]`")
        };
        assert!(
            CONFIGURATION.contains(&heading),
            "no section {heading} in docs/configuration.md"
        );
    }

    let example_text = complete_example();
    let mut in_example = BTreeSet::new();
    flatten("", &toml::from_str(example_text).unwrap(), &mut in_example);
    let comments: Vec<&str> = example_text
        .lines()
        .filter_map(|line| line.split_once('#').map(|(_, comment)| comment))
        .collect();

    for (table, heading, prefix) in TABLES {
        let rows: Vec<&str> = section(CONFIGURATION, heading)
            .lines()
            .filter(|line| line.starts_with("| `"))
            .collect();
        for key in accepted_keys(table) {
            if TABLES
                .iter()
                .any(|(t, _, _)| *t == format!("{table}.{key}"))
            {
                // A nested table: its keys are checked as a table of their own.
                continue;
            }
            let documented = format!("`{prefix}{key}`");
            assert!(
                rows.iter().any(|row| row.contains(&documented)),
                "{table}.{key} has no row in the section {heading} of docs/configuration.md"
            );
            let shown = in_example.contains(&format!("{table}.{key}"))
                || comments.iter().any(|comment| {
                    comment
                        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .any(|word| word == key)
                });
            assert!(shown, "{table}.{key} is missing from the complete example");
        }
    }
}

/// Backquoted names in the first cell of a table row.
fn first_cell_keys(row: &str) -> Vec<&str> {
    let cell = row.trim_start_matches('|').split('|').next().unwrap_or("");
    cell.split('`').skip(1).step_by(2).collect()
}

#[test]
fn every_key_of_the_reference_is_one_the_parser_accepts() {
    let mut checked = 0;
    let headings: BTreeSet<&str> = TABLES.iter().map(|(_, heading, _)| *heading).collect();
    for heading in headings {
        let mut known = BTreeSet::new();
        for (table, _, prefix) in TABLES.iter().filter(|(_, h, _)| *h == heading) {
            for key in accepted_keys(table) {
                known.insert(format!("{prefix}{key}"));
            }
        }
        for row in section(CONFIGURATION, heading)
            .lines()
            .filter(|line| line.starts_with("| `"))
        {
            for key in first_cell_keys(row) {
                checked += 1;
                assert!(
                    known.contains(key),
                    "the section {heading} of docs/configuration.md documents `{key}`, which the parser refuses"
                );
            }
        }
    }
    assert!(checked >= 60, "only {checked} documented keys");
}

#[test]
fn the_packaged_configuration_passes_check_config_and_keeps_state_where_the_unit_allows() {
    let output = Command::new(BIN)
        .args(["check-config", "--config"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/config/agent.toml"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let config = parse(PACKAGED);
    // The packaged unit: User=edgewatch, StateDirectory=edgewatch-agent, RuntimeDirectory=edgewatch.
    assert_eq!(config.queue.dir, Path::new("/var/lib/edgewatch-agent"));
    assert!(config.ingest.socket.starts_with("/run/edgewatch"));
    assert!(config.status_file.starts_with("/run/edgewatch"));
    // The queue's snapshot, rewritten every second, is volatile too: on tmpfs, not the eMMC.
    assert_eq!(
        config.queue.queue.get().status_file,
        Path::new("/run/edgewatch/queue-status")
    );
    // Certificates are a provisioning step: the shipped file must pass without them.
    assert!(config.uplink.tls.is_none());
    assert!(config.scheduling.idle_priority);
    assert!(!config.scheduling.cores.is_empty());
    assert_eq!(config.ingest.mode, 0o660);
}

#[test]
fn the_packaged_tls_table_once_uncommented_passes_check_config_and_names_the_provisioned_files() {
    let provisioned = uncomment_table(PACKAGED, "uplink.tls");
    let output = check_config(&provisioned);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let tls = parse(&provisioned).uplink.tls.unwrap();
    for file in [&tls.ca, &tls.cert, &tls.key] {
        assert!(file.starts_with("/etc/edgewatch/tls"), "{}", file.display());
    }
}

#[test]
fn uncommenting_the_stated_defaults_of_the_packaged_configuration_changes_nothing() {
    let (uncommented, stated) = uncomment_stated_defaults(PACKAGED);
    assert!(stated >= 10, "only {stated} stated defaults");
    assert_eq!(
        format!("{:?}", parse(&uncommented)),
        format!("{:?}", parse(PACKAGED))
    );
}

#[test]
fn agent_keys_named_in_the_operator_documents_exist() {
    let mut known = BTreeSet::new();
    for (table, _, _) in TABLES {
        known.insert(table.to_owned());
        for key in accepted_keys(table) {
            known.insert(format!("{table}.{key}"));
        }
    }
    // Agent-only tables: the gateway has its own `[ingest]`, and `[thermal]` has its own test.
    let tables = [
        "machine.",
        "queue.",
        "uplink.",
        "scheduling.",
        "status.",
        "deadline.",
        "model.",
    ];
    // Names that look like keys but are files (`queue.log`, `queue.redb`, `machine.crt`).
    let file_extensions = [
        "log", "redb", "tmp", "crt", "key", "crl", "pem", "json", "toml", "md", "rs",
    ];
    let mut checked = 0;
    for (name, doc) in [
        ("runbook.md", RUNBOOK),
        ("security.md", SECURITY),
        ("wire-protocol.md", WIRE_PROTOCOL),
    ] {
        for token in doc.split('`').skip(1).step_by(2) {
            let looks_like_key = tables.iter().any(|t| token.starts_with(t))
                && token
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.');
            let is_file = token
                .rsplit('.')
                .next()
                .is_some_and(|last| file_extensions.contains(&last));
            if !looks_like_key || is_file {
                continue;
            }
            checked += 1;
            assert!(
                known.contains(token),
                "docs/{name} names `{token}`, not a key"
            );
        }
    }
    assert!(checked >= 20, "only {checked} key references found");
}

#[test]
fn every_document_is_listed_in_the_index() {
    let docs = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs"));
    let mut listed = 0;
    for dir in [docs.to_path_buf(), docs.join("decisions")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|ext| ext != "md") || path.ends_with("README.md") {
                continue;
            }
            let relative = path.strip_prefix(docs).unwrap().display().to_string();
            assert!(
                INDEX.contains(&format!("]({relative})")),
                "docs/{relative} is not listed in docs/README.md"
            );
            listed += 1;
        }
    }
    assert!(listed >= 10);
}

/// Sends `count` test events with ids from `first` into `tier` and checks they were accepted.
fn submit(agent: &Agent, tier: Tier, first: i64, count: i64) {
    let replies = submit_all(
        &agent.socket,
        (first..first + count)
            .map(|id| (tier, test_event(id, 0)))
            .collect(),
    );
    assert!(replies.iter().all(|reply| reply.accepted));
}

#[test]
fn the_documented_acl_admits_a_machine_under_its_own_id_only_and_lets_the_gateway_read() {
    let pki = FleetPki::generate().unwrap();
    let broker = Mosquitto::start_with(MosquittoOptions {
        tls: Some(pki.broker_tls().unwrap()),
        acl: Some(fenced(SECURITY, "acl").to_owned()),
        ..MosquittoOptions::default()
    })
    .unwrap();
    let gateway = pki.issue_client("gw-1").unwrap();
    let ca = pki.ca_pem().to_owned();
    let collector = Collector::start_with(broker.addr(), move |options| {
        options.set_transport(edgewatch_harness::mqtt::tls_transport(&ca, &gateway));
    })
    .unwrap();

    let machine = pki.issue_client("truck-17").unwrap();
    let mut setup = AgentSetup::new(broker.addr());
    setup.machine = "truck-17".into();
    // SLO batches under another site, debug batches under another machine.
    setup.extra_uplink = format!(
        "tls = {{ ca = \"{}\", cert = \"{}\", key = \"{}\" }}\n[uplink.topics]\n\
         slo = \"edgewatch/v1/pit-9/truck-17/slo\"\ndebug = \"edgewatch/v1/pit-3/truck-18/debug\"\n",
        pki.ca_file().display(),
        machine.cert_file.display(),
        machine.key_file.display()
    );
    let agent = Agent::start(&setup);
    submit(&agent, Tier::Safety, 1, 10);
    submit(&agent, Tier::Slo, 100, 10);
    submit(&agent, Tier::Debug, 200, 10);

    let arrived = |tier, first: i64| {
        let ids: BTreeSet<i64> = collector.ids(tier).into_iter().collect();
        (first..first + 10).all(|id| ids.contains(&id))
    };
    assert!(
        wait_until(Duration::from_secs(30), || arrived(Tier::Safety, 1)
            && arrived(Tier::Slo, 100)),
        "own batches were not delivered; agent log:\n{}",
        agent.log()
    );
    let topics: BTreeSet<String> = collector.snapshot().into_iter().map(|r| r.topic).collect();
    assert!(topics.contains("edgewatch/v1/pit-3/truck-17/safety"));
    // The site is not authenticated by the pattern (docs/security.md says so).
    assert!(topics.contains("edgewatch/v1/pit-9/truck-17/slo"));
    assert!(
        collector
            .statuses
            .lock()
            .unwrap()
            .iter()
            .any(|(topic, _)| topic == "edgewatch/v1/pit-3/truck-17/status"),
        "the machine's retained status did not arrive"
    );

    assert!(wait_until(Duration::from_secs(20), || {
        agent.status()["agent"]["uplink"]["refused"].as_u64() >= Some(1)
    }));
    assert!(collector.ids(Tier::Debug).is_empty());
    assert!(broker.log().contains("Denied PUBLISH from truck-17"));
}

/// Backquoted snake_case names in `text`: field names, not paths, keys or commands.
fn field_names(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|token| {
            !token.is_empty()
                && token
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .collect()
}

fn json_keys(value: &serde_json::Value, out: &mut BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                out.insert(key.clone());
                json_keys(value, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| json_keys(item, out)),
        _ => {}
    }
}

#[test]
fn status_fields_named_in_the_runbook_are_in_a_running_agents_status() {
    let broker = Mosquitto::start().unwrap();
    let agent = Agent::start(&AgentSetup::new(broker.addr()));
    // Every field is printed from the first status write, connected or not.
    assert!(
        wait_until(Duration::from_secs(20), || {
            agent.status()["agent"]["uplink"].is_object()
        }),
        "no status; log:\n{}",
        agent.log()
    );
    let mut keys = BTreeSet::new();
    json_keys(&agent.status(), &mut keys);
    // No `[status] file` here: the status file is in the queue directory, the snapshot beside it.
    let status_file = agent.dir.path().join("queue").join("agent-status.json");
    let snapshot =
        std::fs::read_to_string(edgewatch_agent::config::queue_status_file(&status_file)).unwrap();

    let start = RUNBOOK.find("`--json` prints everything").unwrap();
    let paragraph = &RUNBOOK[start..start + RUNBOOK[start..].find("\n\n").unwrap()];
    let (json_part, snapshot_part) = paragraph.split_once("The queue's own").unwrap();
    let json_fields = field_names(json_part);
    assert!(json_fields.len() >= 8, "only {} fields", json_fields.len());
    for field in json_fields {
        assert!(
            keys.contains(field),
            "docs/runbook.md names `{field}`, which `status --json` does not print"
        );
    }
    let snapshot_fields = field_names(snapshot_part);
    assert!(snapshot_fields.len() >= 3);
    for field in snapshot_fields {
        assert!(
            snapshot.split_whitespace().any(|word| word == field),
            "docs/runbook.md names `{field}`, which the queue's snapshot does not hold"
        );
    }
}

#[test]
fn message_and_event_names_in_the_operator_documents_exist_in_the_wire_format() {
    let mut checked = 0;
    for (name, doc) in [
        ("runbook.md", RUNBOOK),
        ("security.md", SECURITY),
        ("wire-protocol.md", WIRE_PROTOCOL),
    ] {
        for token in doc.split('`').skip(1).step_by(2) {
            let camel_case = token.starts_with(|c: char| c.is_ascii_uppercase())
                && token.chars().all(|c| c.is_ascii_alphabetic())
                && token.chars().any(|c| c.is_ascii_lowercase());
            if !camel_case {
                continue;
            }
            checked += 1;
            let defined = [
                format!("pub struct {token} "),
                format!("pub enum {token} "),
                format!("        {token}(super::"),
            ]
            .iter()
            .any(|pattern| PROTO_GENERATED.contains(pattern) || PROTO_FRAMING.contains(pattern));
            assert!(
                defined,
                "docs/{name} names `{token}`, not a message, event kind or error of edgewatch-proto"
            );
        }
    }
    assert!(checked >= 10, "only {checked} names found");
}

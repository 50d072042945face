//! The one duration grammar, pinned for every duration key of the agent's file: a table of key →
//! bounds, accepted and refused values, and the integer key it replaced, each run through the
//! real parser (`Config::parse`). A duration key in the code without a row here fails, and so
//! does a row for a key the code does not have: the keys are read from `duration_keys()` and from
//! every `DurationKey::new` in the configuration sources.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::BTreeSet;
use std::path::Path;

use edgewatch_agent::config::{Config, LoadError, duration_keys};
use edgewatch_conventions::config::RenamedKey;
use edgewatch_conventions::duration;
use edgewatch_test_kit::config_docs::{NOT_DURATIONS, constructed_duration_keys};

/// The sources that define the agent's duration keys.
const SOURCES: [&str; 3] = [
    include_str!("../src/config.rs"),
    include_str!("../../samplers/src/deadline/config.rs"),
    include_str!("../../samplers/src/thermal/config.rs"),
];

/// The required keys only.
const REQUIRED: &str = "[machine]\nid = \"m\"\nsite = \"s\"\nclass = \"c\"\n\
                        [queue]\ndir = \"/q\"\n[uplink]\nhost = \"h\"\nport = 1\n";

/// One duration key of the agent's file.
struct Row {
    /// The key.
    key: &'static str,
    /// Its bounds, as the grammar spells them.
    min: &'static str,
    max: &'static str,
    /// Values it takes (with `context`), bounds included where other keys allow them.
    accepted: &'static [&'static str],
    /// Values it refuses besides the malformed ones, with an error naming it.
    refused: &'static [&'static str],
    /// Other lines of the same table the examples need (a cross-field rule).
    context: &'static str,
    /// The integer key it replaced, a value of it, and the same value in the grammar.
    old: (&'static str, &'static str, &'static str),
}

const ROWS: [Row; 23] = [
    Row {
        key: "uplink.keep_alive",
        min: "5s",
        max: "65535s",
        accepted: &["5s", "30s", "18h", "65535s"],
        refused: &["0s", "4999ms", "65536s"],
        context: "",
        old: ("uplink.keepalive_s", "45", "45s"),
    },
    Row {
        key: "uplink.backoff_min",
        min: "1ms",
        max: "1h",
        accepted: &["1ms", "1s", "1h"],
        refused: &["0s", "61m"],
        context: "backoff_max = \"1h\"",
        old: ("uplink.backoff_min_ms", "250", "250ms"),
    },
    Row {
        key: "uplink.backoff_max",
        min: "1ms",
        max: "1d",
        accepted: &["1ms", "5m", "1d"],
        refused: &["0s", "25h"],
        context: "backoff_min = \"1ms\"",
        old: ("uplink.backoff_max_ms", "120000", "2m"),
    },
    Row {
        key: "uplink.initial_delay_max",
        min: "0s",
        max: "1h",
        accepted: &["0s", "10s", "1h"],
        refused: &["61m"],
        context: "",
        old: ("uplink.initial_delay_max_ms", "0", "0s"),
    },
    Row {
        key: "queue.safety_flush",
        min: "1ms",
        max: "1m",
        accepted: &["1ms", "10ms", "60s"],
        refused: &["0ms", "61s"],
        context: "bulk_flush = \"1m\"",
        old: ("queue.safety_flush_ms", "20", "20ms"),
    },
    Row {
        key: "queue.bulk_flush",
        min: "1ms",
        max: "1m",
        accepted: &["1ms", "1s", "1m"],
        refused: &["0s", "2m"],
        context: "safety_flush = \"1ms\"",
        old: ("queue.bulk_flush_ms", "2000", "2s"),
    },
    Row {
        key: "queue.offline_window_alarm",
        min: "0s",
        max: "365d",
        accepted: &["0s", "1d", "52w", "365d"],
        refused: &["366d", "53w"],
        context: "",
        old: ("queue.offline_window_alarm_s", "0", "0s"),
    },
    Row {
        key: "queue.max_age.safety",
        min: "0s",
        max: "3650d",
        accepted: &["0s", "1s", "30d", "3650d"],
        // Above zero, the queue keeps records at least a second.
        refused: &["500ms", "3651d"],
        context: "",
        old: ("queue.max_age_s.safety", "3600", "1h"),
    },
    Row {
        key: "queue.max_age.slo",
        min: "0s",
        max: "3650d",
        accepted: &["0s", "1s", "30d", "3650d"],
        refused: &["999ms", "3651d"],
        context: "",
        old: ("queue.max_age_s.slo", "0", "0s"),
    },
    Row {
        key: "queue.max_age.debug",
        min: "0s",
        max: "3650d",
        accepted: &["0s", "1s", "7d", "3650d"],
        refused: &["1ms", "3651d"],
        context: "",
        old: ("queue.max_age_s.debug", "86400", "1d"),
    },
    Row {
        key: "deadline.snapshot_interval",
        min: "1ms",
        max: "1h",
        // Never shorter than one poll: 10 ms at the highest poll rate.
        accepted: &["10ms", "10s", "1h"],
        refused: &["0s", "9ms", "61m"],
        context: "poll_hz = 100",
        old: ("deadline.snapshot_interval_s", "1.5", "1500ms"),
    },
    Row {
        key: "deadline.burst_min_interval",
        min: "0s",
        max: "1h",
        accepted: &["0s", "1s", "1h"],
        refused: &["61m"],
        context: "",
        old: ("deadline.burst_min_interval_s", "2", "2s"),
    },
    Row {
        key: "deadline.status_min_interval",
        min: "0s",
        max: "1h",
        accepted: &["0s", "10s", "1h"],
        refused: &["2h"],
        context: "",
        old: ("deadline.status_min_interval_s", "0", "0s"),
    },
    Row {
        key: "deadline.stall_min",
        min: "0s",
        max: "1m",
        accepted: &["0s", "100ms", "1m"],
        refused: &["60001ms"],
        context: "",
        old: ("deadline.stall_min_ms", "250", "250ms"),
    },
    Row {
        key: "thermal.interval",
        min: "100ms",
        max: "1m",
        accepted: &["100ms", "1s", "1m"],
        refused: &["0s", "99ms", "61s"],
        context: "max_gap = \"1h\"",
        old: ("thermal.interval_ms", "500", "500ms"),
    },
    Row {
        key: "thermal.restart_backoff_min",
        min: "1ms",
        max: "1h",
        accepted: &["1ms", "1s", "1h"],
        refused: &["0s", "2h"],
        context: "restart_backoff_max = \"1h\"",
        old: ("thermal.restart_backoff_min_ms", "2000", "2s"),
    },
    Row {
        key: "thermal.restart_backoff_max",
        min: "1ms",
        max: "1h",
        accepted: &["1ms", "1m", "1h"],
        refused: &["0s", "2h"],
        context: "restart_backoff_min = \"1ms\"",
        old: ("thermal.restart_backoff_max_ms", "30000", "30s"),
    },
    Row {
        key: "thermal.poll_interval",
        min: "100ms",
        max: "1m",
        accepted: &["100ms", "1s", "1m"],
        refused: &["0s", "99ms", "2m"],
        context: "max_gap = \"1h\"",
        old: ("thermal.poll_interval_ms", "250", "250ms"),
    },
    Row {
        key: "thermal.counters_interval",
        min: "1s",
        max: "1h",
        accepted: &["1s", "10s", "1h"],
        refused: &["0s", "999ms", "2h"],
        context: "",
        old: ("thermal.counters_interval_s", "60", "1m"),
    },
    Row {
        key: "thermal.debug_sample_min_interval",
        min: "0s",
        max: "1d",
        accepted: &["0s", "1s", "1d"],
        refused: &["25h"],
        context: "",
        old: ("thermal.debug_sample_min_interval_ms", "1000", "1s"),
    },
    Row {
        key: "thermal.oc_hold",
        min: "1ms",
        max: "1h",
        accepted: &["1ms", "1s", "1h"],
        refused: &["0s", "61m"],
        context: "",
        old: ("thermal.oc_hold_ms", "500", "500ms"),
    },
    Row {
        key: "thermal.oc_report_interval",
        min: "1s",
        max: "1d",
        accepted: &["1s", "1m", "1d"],
        refused: &["0s", "999ms", "2d"],
        context: "",
        old: ("thermal.oc_report_interval_s", "120", "2m"),
    },
    Row {
        key: "thermal.max_gap",
        min: "200ms",
        max: "1h",
        accepted: &["200ms", "5s", "1h"],
        refused: &["0s", "199ms", "2h"],
        context: "interval = \"100ms\"\npoll_interval = \"100ms\"",
        old: ("thermal.max_gap_ms", "10000", "10s"),
    },
];

/// The required keys with `lines` in `table` (created, or extended when it is a required one).
fn with_lines(table: &str, lines: &str) -> String {
    let header = format!("[{table}]\n");
    if REQUIRED.contains(&header) {
        REQUIRED.replace(&header, &format!("{header}{lines}\n"))
    } else {
        format!("{REQUIRED}{header}{lines}\n")
    }
}

/// The required keys with the dotted `key` set to the TOML `value`, and `context` in its table.
fn file_with(key: &str, value: &str, context: &str) -> String {
    let (table, name) = key.rsplit_once('.').unwrap();
    with_lines(table, &format!("{name} = {value}\n{context}"))
}

fn parse(text: &str) -> Result<Config, LoadError> {
    Config::parse(text, Path::new("agent.toml"))
}

/// `Debug` of a configuration, without the list of deprecated keys it used.
fn settings(mut config: Config) -> String {
    config.renamed_keys.clear();
    format!("{config:?}")
}

#[test]
fn every_duration_key_of_the_agent_has_a_row_and_every_row_a_key() {
    let rows: BTreeSet<&str> = ROWS.iter().map(|row| row.key).collect();
    assert_eq!(rows.len(), ROWS.len(), "a key has two rows");
    let listed: BTreeSet<&str> = duration_keys().map(|key| key.name).collect();
    assert_eq!(listed, rows, "duration_keys() and the rows differ");
    let constructed: BTreeSet<&str> = SOURCES
        .iter()
        .flat_map(|s| constructed_duration_keys(s))
        .collect();
    assert_eq!(
        constructed, rows,
        "a DurationKey defined in the sources is missing from duration_keys() or the rows"
    );
}

#[test]
fn every_key_states_the_bounds_of_its_row() {
    for key in duration_keys() {
        let row = ROWS.iter().find(|row| row.key == key.name).unwrap();
        assert_eq!(duration::format(key.min), row.min, "{}", key.name);
        assert_eq!(duration::format(key.max), row.max, "{}", key.name);
    }
}

#[test]
fn every_key_takes_its_accepted_values_and_refuses_the_others_naming_itself() {
    for row in &ROWS {
        for value in row.accepted {
            let text = file_with(row.key, &format!("\"{value}\""), row.context);
            if let Err(error) = parse(&text) {
                panic!("{} = {value:?} refused: {error}", row.key);
            }
        }
        let malformed = NOT_DURATIONS.iter().map(|text| (*text, "malformed"));
        let out_of_bounds = row.refused.iter().map(|text| (*text, "refused"));
        for (value, why) in malformed.chain(out_of_bounds) {
            let text = file_with(row.key, &format!("\"{value}\""), row.context);
            let error = parse(&text).err().unwrap_or_else(|| {
                panic!("{} = {value:?} ({why}) was accepted", row.key);
            });
            assert_eq!(error.key(), Some(row.key), "{value:?}: {error}");
        }
        // A duration is a string; a bare TOML number is the wrong type.
        let error = parse(&file_with(row.key, "30", row.context)).unwrap_err();
        assert_eq!(error.key(), Some(row.key), "{error}");
    }
}

#[test]
fn the_old_integer_key_loads_to_the_same_value_is_listed_and_is_refused_beside_the_new_one() {
    for row in &ROWS {
        let (old_key, old_value, same) = row.old;
        let old = parse(&file_with(old_key, old_value, row.context))
            .unwrap_or_else(|error| panic!("{old_key} = {old_value}: {error}"));
        assert_eq!(
            old.renamed_keys,
            [RenamedKey {
                old: old_key,
                new: row.key
            }]
        );
        let new = parse(&file_with(row.key, &format!("\"{same}\""), row.context)).unwrap();
        assert!(new.renamed_keys.is_empty(), "{}", row.key);
        assert_eq!(settings(old), settings(new), "{old_key} = {old_value}");

        let (table, name) = old_key.rsplit_once('.').unwrap();
        let (new_table, new_name) = row.key.rsplit_once('.').unwrap();
        let both = if table == new_table {
            with_lines(
                table,
                &format!(
                    "{name} = {old_value}\n{new_name} = \"{same}\"\n{}",
                    row.context
                ),
            )
        } else {
            format!(
                "{}[{table}]\n{name} = {old_value}\n",
                file_with(row.key, &format!("\"{same}\""), row.context)
            )
        };
        let error = parse(&both).unwrap_err();
        assert_eq!(error.key(), Some(row.key), "{error}");
        assert!(error.to_string().contains(old_key), "{error}");
    }
}

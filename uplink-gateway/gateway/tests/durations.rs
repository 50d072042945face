//! The one duration grammar, pinned for every duration key of the gateway's file, `[slo]` and
//! `[prices]` included: a table of key → bounds, accepted and refused values, each run through
//! the real parser (`Config::from_toml`). A duration key in the code without a row here fails,
//! and so does a row for a key the code does not have: the keys are read from `duration_keys()`
//! and from every `DurationKey::new` in the configuration sources.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::collections::BTreeSet;

use edgewatch_conventions::duration;
use edgewatch_gateway::config::{Config, duration_keys};
use edgewatch_test_kit::config_docs::{NOT_DURATIONS, constructed_duration_keys};

/// The sources that define the gateway's duration keys (the SLO core's are named relative to
/// their table).
const SOURCES: [&str; 3] = [
    include_str!("../src/config.rs"),
    include_str!("../../slo/src/catalog.rs"),
    include_str!("../../slo/src/cost.rs"),
];

/// The required keys only.
const REQUIRED: &str = "[mqtt]\nhost = \"h\"\nclient_id = \"c\"\n[store]\npath = \"/s\"\n";

/// One duration key of the gateway's file.
struct Row {
    /// The key (`[]` for an entry of an array of tables).
    key: &'static str,
    /// Its bounds, as the grammar spells them.
    min: &'static str,
    max: &'static str,
    /// Values it takes (in `toml`), bounds included where other keys allow them.
    accepted: &'static [&'static str],
    /// Values it refuses besides the malformed ones, with an error naming `at`.
    refused: &'static [&'static str],
    /// The file's text with `VALUE` where the value goes.
    toml: &'static str,
    /// The key the errors name.
    at: &'static str,
}

const ROWS: [Row; 17] = [
    Row {
        key: "mqtt.keep_alive",
        min: "5s",
        max: "65535s",
        accepted: &["5s", "30s", "65535s"],
        refused: &["0s", "4999ms", "65536s"],
        toml: "[mqtt]\nhost = \"h\"\nclient_id = \"c\"\nkeep_alive = VALUE\n[store]\npath = \"/s\"\n",
        at: "mqtt.keep_alive",
    },
    Row {
        key: "mqtt.session_expiry",
        min: "1s",
        max: "4294967295s",
        accepted: &["1s", "7d", "4294967295s"],
        refused: &["0s", "999ms", "4294967296s"],
        toml: "[mqtt]\nhost = \"h\"\nclient_id = \"c\"\nsession_expiry = VALUE\n[store]\npath = \"/s\"\n",
        at: "mqtt.session_expiry",
    },
    Row {
        key: "ingest.max_future_skew",
        min: "0s",
        max: "365d",
        accepted: &["0ms", "5m", "365d"],
        refused: &["366d"],
        toml: "REQUIRED[ingest]\nmax_future_skew = VALUE\n",
        at: "ingest.max_future_skew",
    },
    Row {
        key: "ingest.max_clock_skew",
        min: "0s",
        max: "365d",
        accepted: &["0s", "5m", "52w"],
        refused: &["53w"],
        toml: "REQUIRED[ingest]\nmax_clock_skew = VALUE\n",
        at: "ingest.max_clock_skew",
    },
    Row {
        key: "ingest.reconnect_gap",
        min: "0s",
        max: "365d",
        accepted: &["0s", "10m", "365d"],
        refused: &["8761h"],
        toml: "REQUIRED[ingest]\nreconnect_gap = VALUE\n",
        at: "ingest.reconnect_gap",
    },
    Row {
        key: "ingest.freshness_limit",
        min: "0s",
        max: "365d",
        accepted: &["0s", "24h", "3w", "365d"],
        refused: &["366d"],
        toml: "REQUIRED[ingest]\nfreshness_limit = VALUE\n",
        at: "ingest.freshness_limit",
    },
    Row {
        key: "ingest.series_retire_after",
        min: "1s",
        max: "365d",
        accepted: &["1s", "1h", "2w", "365d"],
        refused: &["0s", "999ms", "366d"],
        toml: "REQUIRED[ingest]\nseries_retire_after = VALUE\n",
        at: "ingest.series_retire_after",
    },
    Row {
        key: "dedup.retention",
        min: "0s",
        max: "3650d",
        accepted: &["0s", "30d", "3650d"],
        refused: &["3651d"],
        toml: "REQUIRED[dedup]\nretention = VALUE\n",
        at: "dedup.retention",
    },
    Row {
        key: "remote_write.timeout",
        min: "1ms",
        max: "1h",
        accepted: &["1ms", "30s", "1h"],
        refused: &["0s", "61m"],
        toml: "REQUIRED[remote_write]\nurl = \"http://p/w\"\ntimeout = VALUE\n",
        at: "remote_write.timeout",
    },
    Row {
        key: "remote_write.max_sample_age",
        min: "0s",
        max: "3650d",
        accepted: &["0s", "7d", "60d", "3650d"],
        refused: &["3651d"],
        toml: "REQUIRED[remote_write]\nurl = \"http://p/w\"\nmax_sample_age = VALUE\n",
        at: "remote_write.max_sample_age",
    },
    Row {
        key: "remote_write.min_backoff",
        min: "1ms",
        max: "1h",
        accepted: &["1ms", "500ms", "1h"],
        refused: &["0s", "2h"],
        toml: "REQUIRED[remote_write]\nurl = \"http://p/w\"\nmax_backoff = \"1d\"\nmin_backoff = VALUE\n",
        at: "remote_write.min_backoff",
    },
    Row {
        key: "remote_write.max_backoff",
        min: "1ms",
        max: "1d",
        accepted: &["1ms", "60s", "1d"],
        refused: &["0s", "25h"],
        toml: "REQUIRED[remote_write]\nurl = \"http://p/w\"\nmin_backoff = \"1ms\"\nmax_backoff = VALUE\n",
        at: "remote_write.max_backoff",
    },
    Row {
        key: "slo.base_lookback",
        min: "1ms",
        max: "1w",
        accepted: &["1ms", "10m", "7d"],
        refused: &["0s", "8d"],
        toml: "REQUIRED[slo]\nbase_lookback = VALUE\n",
        at: "slo.base_lookback",
    },
    Row {
        key: "slo.slos[].period",
        min: "1ms",
        max: "3650d",
        // At least the longest of the default alert windows, 3 d.
        accepted: &["3d", "30d", "3650d"],
        refused: &["0s", "2d", "3651d"],
        toml: "REQUIRED[slo]\n[[slo.slos]]\nname = \"a\"\nobjective_percent = 99.0\n\
               sli = { kind = \"freshness\" }\nperiod = VALUE\n",
        at: "slo.slos[0].period",
    },
    Row {
        key: "slo.alert_windows[].long",
        min: "1ms",
        max: "3650d",
        accepted: &["2ms", "1h", "3650d"],
        refused: &["0s", "3651d"],
        toml: "REQUIRED[slo]\n[[slo.slos]]\nname = \"a\"\nobjective_percent = 99.0\n\
               sli = { kind = \"freshness\" }\nperiod = \"3650d\"\n\
               [[slo.alert_windows]]\nshort = \"1ms\"\nbudget_percent = 2.0\n\
               severity = \"page\"\nlong = VALUE\n",
        at: "slo.alert_windows[0].long",
    },
    Row {
        key: "slo.alert_windows[].short",
        min: "1ms",
        max: "3650d",
        // Shorter than the long window.
        accepted: &["1ms", "5m", "3649d"],
        refused: &["0s", "3650d", "3651d"],
        toml: "REQUIRED[slo]\n[[slo.slos]]\nname = \"a\"\nobjective_percent = 99.0\n\
               sli = { kind = \"freshness\" }\nperiod = \"3650d\"\n\
               [[slo.alert_windows]]\nlong = \"3650d\"\nbudget_percent = 2.0\n\
               severity = \"page\"\nshort = VALUE\n",
        at: "slo.alert_windows[0].short",
    },
    Row {
        key: "prices.base_lookback",
        min: "1ms",
        max: "1w",
        accepted: &["1ms", "10m", "1w"],
        refused: &["0s", "2w"],
        toml: "REQUIRED[prices]\ncurrency = \"USD\"\nbase_lookback = VALUE\n",
        at: "prices.base_lookback",
    },
];

/// The file of `row` with `value` (TOML) in its place.
fn file_with(row: &Row, value: &str) -> String {
    row.toml
        .replace("REQUIRED", REQUIRED)
        .replace("VALUE", value)
}

#[test]
fn every_duration_key_of_the_gateway_has_a_row_and_every_row_a_key() {
    let rows: BTreeSet<&str> = ROWS.iter().map(|row| row.key).collect();
    assert_eq!(rows.len(), ROWS.len(), "a key has two rows");
    let listed: BTreeSet<String> = duration_keys().into_iter().map(|(name, _)| name).collect();
    let rows_owned: BTreeSet<String> = rows.iter().map(|key| (*key).to_owned()).collect();
    assert_eq!(listed, rows_owned, "duration_keys() and the rows differ");
    // Every key defined is listed, under one table or more (base_lookback serves [slo] and
    // [prices]).
    let defined: BTreeSet<&str> = SOURCES
        .iter()
        .flat_map(|s| constructed_duration_keys(s))
        .collect();
    let listed_keys: BTreeSet<&str> = duration_keys().iter().map(|(_, key)| key.name).collect();
    assert_eq!(
        defined, listed_keys,
        "a DurationKey defined in the sources is missing from duration_keys() or the rows"
    );
}

#[test]
fn every_key_states_the_bounds_of_its_row() {
    for (name, key) in duration_keys() {
        let row = ROWS.iter().find(|row| row.key == name).unwrap();
        assert_eq!(duration::format(key.min), row.min, "{name}");
        assert_eq!(duration::format(key.max), row.max, "{name}");
    }
}

#[test]
fn every_key_takes_its_accepted_values_and_refuses_the_others_naming_itself() {
    for row in &ROWS {
        for value in row.accepted {
            if let Err(error) = Config::from_toml(&file_with(row, &format!("\"{value}\""))) {
                panic!("{} = {value:?} refused: {error}", row.key);
            }
        }
        let malformed = NOT_DURATIONS.iter().map(|text| (*text, "malformed"));
        let out_of_bounds = row.refused.iter().map(|text| (*text, "refused"));
        for (value, why) in malformed.chain(out_of_bounds) {
            let error = Config::from_toml(&file_with(row, &format!("\"{value}\"")))
                .err()
                .unwrap_or_else(|| panic!("{} = {value:?} ({why}) was accepted", row.key));
            assert_eq!(error.key, row.at, "{value:?}: {error}");
        }
    }
}

#[test]
fn the_gateway_renamed_no_key_so_a_valid_file_lists_none() {
    for row in &ROWS {
        let value = format!("\"{}\"", row.accepted[0]);
        let config = Config::from_toml(&file_with(row, &value)).unwrap();
        assert!(config.renamed_keys().is_empty(), "{}", row.key);
    }
}

//! The `[thermal]` example in `docs/configuration.md` parses, validates, and states the defaults.

use std::collections::BTreeMap;

use edgewatch_samplers::thermal::config::{RawThermalConfig, ZoneComponent};
use serde::Deserialize;

const DOC: &str = include_str!("../../../../docs/configuration.md");

/// How the agent embeds the table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Embedded {
    thermal: RawThermalConfig,
}

fn thermal_example() -> &'static str {
    let section = &DOC[DOC.find("## Agent: thermal").unwrap()..];
    let start = section.find("```toml\n").unwrap() + "```toml\n".len();
    let len = section[start..].find("```").unwrap();
    &section[start..start + len]
}

#[test]
fn the_documented_thermal_example_is_valid_and_spells_out_the_defaults() {
    let embedded: Embedded = toml::from_str(thermal_example()).unwrap();
    let raw = embedded.thermal;
    let config = raw.validate().unwrap();
    assert_eq!(config.throttle.per_power_mode[&2].cpu_mhz, Some(1497));
    assert_eq!(config.sysfs.power_inputs[0].rail, "VDD_IN");
    assert_eq!(
        raw.zone_components,
        BTreeMap::from([("Tboard_tegra".to_owned(), ZoneComponent::Ignore)])
    );

    // Without its examples of maps and lists, the table is exactly the defaults.
    let scalars = RawThermalConfig {
        power_mode_nominal_max_mhz: BTreeMap::new(),
        zone_components: BTreeMap::new(),
        power_input: Vec::new(),
        ..raw
    };
    assert_eq!(scalars, RawThermalConfig::default());
}

#[test]
fn every_key_of_the_table_is_documented() {
    let section = &DOC[DOC.find("## Agent: thermal").unwrap()..];
    let table = &section[section.find("| key | default |").unwrap()..];
    for key in [
        "tegrastats_enabled",
        "tegrastats",
        "interval_ms",
        "replay",
        "replay_speed",
        "replay_loop",
        "restart_backoff_min_ms",
        "restart_backoff_max_ms",
        "sysfs_root",
        "poll_interval_ms",
        "gpu_devfreq",
        "counters_interval_s",
        "debug_sample_every",
        "debug_sample_min_interval_ms",
        "oc_hold_ms",
        "oc_report_interval_s",
        "trip_hysteresis_celsius",
        "cap_tolerance_mhz",
        "max_gap_ms",
        "nominal_max_mhz",
        "power_mode_nominal_max_mhz",
        "zone_components",
        "power_input[].rail",
        "power_input[].power_uw",
        "power_input[].millivolts",
        "power_input[].milliamps",
    ] {
        assert!(
            table.contains(&format!("`{key}")),
            "{key} is not documented"
        );
    }
}

//! The example configuration in `docs/slo-catalog.md` parses, validates, and states the defaults.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use edgewatch_slo::{RawCatalog, RawPriceBook};
use serde::Deserialize;

const DOC: &str = include_str!("../../../docs/slo-catalog.md");

/// How a gateway config embeds both tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Embedded {
    slo: RawCatalog,
    prices: RawPriceBook,
}

fn toml_block() -> &'static str {
    let start = DOC.find("```toml\n").unwrap() + "```toml\n".len();
    let len = DOC[start..].find("```").unwrap();
    &DOC[start..start + len]
}

#[test]
fn the_documented_example_configuration_is_valid() {
    let embedded: Embedded = toml::from_str(toml_block()).unwrap();
    let catalog = embedded.slo.validate().unwrap();
    assert_eq!(catalog.slos.len(), 4);
    assert_eq!(catalog.policy.len(), 3);
    let book = embedded.prices.validate().unwrap();
    assert_eq!(book.shares.len(), 2);
    assert_eq!(book.machine_classes["haul-truck"].purchase_price, 4200.0);
}

#[test]
fn the_documented_catalog_spells_out_the_defaults() {
    let embedded: Embedded = toml::from_str(toml_block()).unwrap();
    let defaults = RawCatalog::default();
    assert_eq!(embedded.slo.slos, defaults.slos);
    assert_eq!(embedded.slo.alert_windows, defaults.alert_windows);
    assert_eq!(embedded.slo.base_lookback, defaults.base_lookback);
    assert_eq!(embedded.slo.policy[..2], defaults.policy[..]);
}

//! Tier order, tier index and tier name: the one table from [`Tier`] to a priority position, and
//! [`PerTier`], a value per tier.
//!
//! ```text
//! index   0 SAFETY   1 SLO   2 DEBUG      (TIERS: the drain order, the reverse of eviction)
//! name    "safety"   "slo"   "debug"      (topic level, label value, status files, CLI)
//! Tier::Unspecified: no index, no name
//! ```
//!
//! Invariants:
//! - Index 0 is safety, 1 SLO counters, 2 debug: iterating indices in order is strict priority.
//! - `Tier::Unspecified` never becomes an index or a name: [`index`] and [`name`] return `None`,
//!   and each caller decides at its call site what an unspecified tier means there.
//! - [`TIERS`], [`NAMES`] and the fields of [`PerTier`] are in the same order.

use crate::v1::Tier;

/// Tiers in strict priority order: the order batches are handed out and the reverse of eviction.
pub const TIERS: [Tier; 3] = [Tier::Safety, Tier::Slo, Tier::Debug];

/// Index of `Tier::Safety`.
pub const SAFETY: usize = 0;
/// Index of `Tier::Slo`.
pub const SLO: usize = 1;
/// Index of `Tier::Debug`.
pub const DEBUG: usize = 2;

/// Short lowercase names of the tiers, by index: the topic level, the `tier` label value, and the
/// name in status files and on the command line.
pub const NAMES: [&str; 3] = ["safety", "slo", "debug"];

/// Index of a tier in [`TIERS`], or `None` for `Tier::Unspecified`.
pub const fn index(tier: Tier) -> Option<usize> {
    match tier {
        Tier::Safety => Some(SAFETY),
        Tier::Slo => Some(SLO),
        Tier::Debug => Some(DEBUG),
        Tier::Unspecified => None,
    }
}

/// The name of a tier (see [`NAMES`]); `None` for `Tier::Unspecified`.
pub fn name(tier: Tier) -> Option<&'static str> {
    index(tier).map(|ix| NAMES[ix])
}

/// The tier a name names (see [`NAMES`]).
pub fn from_name(name: &str) -> Option<Tier> {
    NAMES
        .iter()
        .position(|known| *known == name)
        .map(|ix| TIERS[ix])
}

/// One value for each tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerTier<T> {
    /// Value for the safety tier.
    pub safety: T,
    /// Value for the SLO counters tier.
    pub slo: T,
    /// Value for the debug tier.
    pub debug: T,
}

impl<T> PerTier<T> {
    /// The same value for every tier.
    pub fn all(value: T) -> Self
    where
        T: Clone,
    {
        Self {
            safety: value.clone(),
            slo: value.clone(),
            debug: value,
        }
    }

    /// The value of `tier`; `None` for `Tier::Unspecified`.
    pub fn get(&self, tier: Tier) -> Option<&T> {
        index(tier).map(|ix| self.at(ix))
    }

    /// `(tier, value)` pairs in priority order.
    pub fn iter(&self) -> impl Iterator<Item = (Tier, &T)> {
        [
            (Tier::Safety, &self.safety),
            (Tier::Slo, &self.slo),
            (Tier::Debug, &self.debug),
        ]
        .into_iter()
    }

    /// The value at index `ix` (from [`index`]); any index past [`SLO`] is debug's.
    pub fn at(&self, ix: usize) -> &T {
        match ix {
            SAFETY => &self.safety,
            SLO => &self.slo,
            _ => &self.debug,
        }
    }

    /// The value at index `ix` (from [`index`]); any index past [`SLO`] is debug's.
    pub fn at_mut(&mut self, ix: usize) -> &mut T {
        match ix {
            SAFETY => &mut self.safety,
            SLO => &mut self.slo,
            _ => &mut self.debug,
        }
    }
}

impl PerTier<u64> {
    /// Sum over the tiers.
    pub fn sum(&self) -> u64 {
        self.safety
            .saturating_add(self.slo)
            .saturating_add(self.debug)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_order_names_and_fields_agree() {
        let values = PerTier {
            safety: "safety",
            slo: "slo",
            debug: "debug",
        };
        for (ix, tier) in TIERS.into_iter().enumerate() {
            assert_eq!(index(tier), Some(ix));
            assert_eq!(name(tier), Some(NAMES[ix]));
            assert_eq!(from_name(NAMES[ix]), Some(tier));
            assert_eq!(*values.at(ix), NAMES[ix]);
            assert_eq!(values.get(tier), Some(&NAMES[ix]));
        }
        let in_order: Vec<Tier> = values.iter().map(|(tier, _)| tier).collect();
        assert_eq!(in_order, TIERS);
    }

    #[test]
    fn an_unspecified_tier_has_no_index_and_no_name() {
        assert_eq!(index(Tier::Unspecified), None);
        assert_eq!(name(Tier::Unspecified), None);
        assert_eq!(PerTier::all(1).get(Tier::Unspecified), None);
        assert_eq!(from_name("unspecified"), None);
        assert_eq!(from_name("Safety"), None);
    }
}

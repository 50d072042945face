//! The three priority tiers as array indices, and [`PerTier`], a value per tier.
//!
//! Invariants:
//! - Index 0 is safety, 1 SLO counters, 2 debug: iterating indices in order is strict priority.
//! - `Tier::Unspecified` never becomes an index; it is refused at the API boundary.

use crate::v1::Tier;

/// Tiers in strict priority order: the order batches are handed out and the reverse of eviction.
pub const TIERS: [Tier; 3] = [Tier::Safety, Tier::Slo, Tier::Debug];

/// Index of a tier in [`TIERS`], or `None` for `Tier::Unspecified`.
pub fn index(tier: Tier) -> Option<usize> {
    match tier {
        Tier::Safety => Some(0),
        Tier::Slo => Some(1),
        Tier::Debug => Some(2),
        Tier::Unspecified => None,
    }
}

/// Short lowercase name of a tier index, as used in table names and the status snapshot.
pub fn name(ix: usize) -> &'static str {
    match ix {
        0 => "safety",
        1 => "slo",
        _ => "debug",
    }
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

    pub fn at(&self, ix: usize) -> &T {
        match ix {
            0 => &self.safety,
            1 => &self.slo,
            _ => &self.debug,
        }
    }

    pub fn at_mut(&mut self, ix: usize) -> &mut T {
        match ix {
            0 => &mut self.safety,
            1 => &mut self.slo,
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

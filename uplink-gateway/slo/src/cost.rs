//! Cost per autonomous machine-hour: a price book in config, and the cost of each
//! (UTC day, machine, model version) computed from the counters of `docs/series.md`.
//!
//! Components, per cell (all increases over the day's window `(D, D + 1 d]`):
//! - **edge-compute-amortization** = machine hours × `purchase_price / lifetime_hours` of the
//!   machine's class, where machine hours = Σ over every `mode` of `edge_autonomy_seconds_total`
//!   / 3600: the computer ages whenever the machine reports time, not only in autonomy.
//! - **edge-energy** = Σ over rails of `edge_energy_joules_total` / 3.6e6 kWh × the site's price.
//! - **cloud-inference** and **training** shares: an amount per period is spread evenly over the
//!   UTC days of its period; each day's slice goes to the cells in the share's scope in proportion
//!   to their autonomous hours that day. A day with no autonomous hours in scope leaves its slice
//!   unallocated (reported, never silently dropped).
//! - The denominator, autonomous hours, is `edge_autonomy_seconds_total{mode="autonomous"}` / 3600.
//!
//! Invariants:
//! - A cell's cost depends only on that day's samples (and the price book), so late data changes
//!   only the days it is stamped in; [`crate::focus`] restates exactly those.
//! - Missing prices never fail the report: the component is 0 and the report says which price is
//!   missing.

use crate::calendar::{MS_PER_DAY, format_rfc3339, parse_rfc3339};
use crate::catalog::{BASE_LOOKBACK, DEFAULT_BASE_LOOKBACK, bad_name, duration_ms, out_of_range};
use crate::names::{label, metric, value};
use crate::series::{Series, SeriesSet, Window};
use edgewatch_conventions::config::ConfigError;
use edgewatch_conventions::duration::DurationKey;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Joules in one kilowatt-hour.
pub const JOULES_PER_KWH: f64 = 3.6e6;
/// Seconds in one hour: machine time is counted in seconds and priced in hours.
pub const SECONDS_PER_HOUR: f64 = 3600.0;
/// The FOCUS `ServiceName` of the edge hardware's amortization.
pub const AMORTIZATION_SERVICE: &str = "edge-compute-amortization";
/// The FOCUS `ServiceName` of the energy the machines drew.
pub const ENERGY_SERVICE: &str = "edge-energy";
/// Every duration key of the price book, named relative to its table (`[prices]` in the
/// gateway's file): the increase rule's base lookback, bounded as the catalog's.
pub const DURATION_KEYS: [DurationKey; 1] = [BASE_LOOKBACK];

/// The price book as written in TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPriceBook {
    /// ISO 4217 code of every amount, e.g. `USD`.
    pub currency: String,
    /// Base lookback of the increase rule (default [`DEFAULT_BASE_LOOKBACK`]).
    #[serde(default = "default_lookback")]
    pub base_lookback: String,
    /// Edge hardware per `machine_class`.
    #[serde(default)]
    pub machine_classes: BTreeMap<String, HardwarePrice>,
    /// Energy tariff per `site`.
    #[serde(default)]
    pub sites: BTreeMap<String, SitePrice>,
    /// Cloud inference and training amounts per period.
    #[serde(default)]
    pub shares: Vec<RawShare>,
}

fn default_lookback() -> String {
    DEFAULT_BASE_LOOKBACK.to_owned()
}

/// Edge computer of one machine class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwarePrice {
    /// Purchase price of one edge computer (with its installation), in the currency.
    pub purchase_price: f64,
    /// Hours of machine time over which it is amortized.
    pub lifetime_hours: f64,
}

/// Energy tariff of one site.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SitePrice {
    /// Price of one kWh.
    pub energy_price_per_kwh: f64,
}

/// Which FOCUS service a share is billed under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ShareService {
    /// Cloud inference serving the machines.
    #[serde(rename = "cloud-inference")]
    CloudInference,
    /// Model training.
    #[serde(rename = "training")]
    Training,
}

impl ShareService {
    /// The FOCUS `ServiceName`.
    pub fn service_name(self) -> &'static str {
        match self {
            Self::CloudInference => "cloud-inference",
            Self::Training => "training",
        }
    }
}

/// An amount for a period, allocated by autonomous hours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawShare {
    /// `cloud-inference` or `training`.
    pub service: ShareService,
    /// Amount for the whole period, in the currency.
    pub amount: f64,
    /// Period start, RFC 3339 UTC at 00:00:00Z (inclusive).
    pub start: String,
    /// Period end, RFC 3339 UTC at 00:00:00Z (exclusive).
    pub end: String,
    /// Allocate only to cells of this model (any when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Allocate only to cells of this model version (any when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<String>,
    /// Allocate only to machines of this class (any when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_class: Option<String>,
    /// Free text for `ChargeDescription`.
    #[serde(default)]
    pub description: String,
}

/// A validated price book.
#[derive(Debug, Clone, PartialEq)]
pub struct PriceBook {
    /// ISO 4217 code.
    pub currency: String,
    /// Base lookback, ms.
    pub lookback_ms: i64,
    /// Hardware per machine class.
    pub machine_classes: BTreeMap<String, HardwarePrice>,
    /// Tariff per site.
    pub sites: BTreeMap<String, SitePrice>,
    /// Shares with their periods.
    pub shares: Vec<Share>,
}

/// A validated share.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    /// The configured values.
    pub config: RawShare,
    /// Its period.
    pub period: Period,
}

impl Share {
    fn in_scope(&self, cell: &CellKey) -> bool {
        let c = &self.config;
        c.model.as_ref().is_none_or(|m| *m == cell.model)
            && c.model_version
                .as_ref()
                .is_none_or(|v| *v == cell.model_version)
            && c.machine_class
                .as_ref()
                .is_none_or(|k| *k == cell.machine_class)
    }
}

impl RawPriceBook {
    /// Checks every value: [`PriceBook::from_raw`].
    pub fn validate(&self) -> Result<PriceBook, ConfigError> {
        PriceBook::from_raw(self)
    }
}

impl PriceBook {
    /// Checks every value of `raw`; the error names the first bad key.
    pub fn from_raw(raw: &RawPriceBook) -> Result<PriceBook, ConfigError> {
        let c = &raw.currency;
        if c.len() != 3 || !c.chars().all(|ch| ch.is_ascii_uppercase()) {
            return Err(bad_name("currency", c, "an ISO 4217 code such as USD"));
        }
        let lookback_ms = duration_ms(&BASE_LOOKBACK, BASE_LOOKBACK.name, &raw.base_lookback)?;
        let non_negative = |key: String, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(out_of_range(key, v, "a finite amount ≥ 0"))
            }
        };
        for (class, hw) in &raw.machine_classes {
            non_negative(
                format!("machine_classes.{class}.purchase_price"),
                hw.purchase_price,
            )?;
            if !(hw.lifetime_hours.is_finite() && hw.lifetime_hours > 0.0) {
                return Err(out_of_range(
                    format!("machine_classes.{class}.lifetime_hours"),
                    hw.lifetime_hours,
                    "a finite number of hours > 0",
                ));
            }
        }
        for (site, price) in &raw.sites {
            non_negative(
                format!("sites.{site}.energy_price_per_kwh"),
                price.energy_price_per_kwh,
            )?;
        }
        let mut shares = Vec::with_capacity(raw.shares.len());
        for (i, share) in raw.shares.iter().enumerate() {
            let key = format!("shares[{i}]");
            non_negative(format!("{key}.amount"), share.amount)?;
            let midnight = |field: &str, text: &str| {
                parse_rfc3339(text)
                    .filter(|ms| ms.rem_euclid(MS_PER_DAY) == 0)
                    .ok_or_else(|| {
                        ConfigError::new(
                            format!("{key}.{field}"),
                            format!("`{text}` is not an RFC 3339 UTC timestamp at 00:00:00Z"),
                        )
                    })
            };
            let start_ms = midnight("start", &share.start)?;
            let end_ms = midnight("end", &share.end)?;
            if end_ms <= start_ms {
                return Err(ConfigError::new(
                    format!("{key}.end"),
                    "the end must come after the start",
                ));
            }
            shares.push(Share {
                config: share.clone(),
                period: Period { start_ms, end_ms },
            });
        }
        Ok(PriceBook {
            currency: raw.currency.clone(),
            lookback_ms,
            machine_classes: raw.machine_classes.clone(),
            sites: raw.sites.clone(),
            shares,
        })
    }
}

/// Whole UTC days `[start_ms, end_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Period {
    /// First midnight, inclusive.
    pub start_ms: i64,
    /// Last midnight, exclusive.
    pub end_ms: i64,
}

/// A cost period that is not a run of whole UTC days.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PeriodError {
    /// A bound is not at 00:00:00Z.
    #[error("{0} is not a UTC midnight")]
    NotMidnight(i64),
    /// The end is not after the start.
    #[error("the period is empty")]
    Empty,
}

impl Period {
    /// The whole UTC days from `start_ms` to `end_ms`; both must be midnights.
    pub fn utc_days(start_ms: i64, end_ms: i64) -> Result<Self, PeriodError> {
        for ms in [start_ms, end_ms] {
            if ms.rem_euclid(MS_PER_DAY) != 0 {
                return Err(PeriodError::NotMidnight(ms));
            }
        }
        if end_ms <= start_ms {
            return Err(PeriodError::Empty);
        }
        Ok(Self { start_ms, end_ms })
    }

    /// Midnights of the days in the period.
    pub fn days(self) -> impl Iterator<Item = i64> {
        (self.start_ms..self.end_ms).step_by(MS_PER_DAY as usize)
    }

    pub(crate) fn day_count(self) -> i64 {
        (self.end_ms - self.start_ms) / MS_PER_DAY
    }
}

/// A (day, machine, model version) cell.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct CellKey {
    /// Midnight starting the UTC day, Unix ms.
    pub day_start_ms: i64,
    /// `machine_id`.
    pub machine_id: String,
    /// `site`.
    pub site: String,
    /// `machine_class`.
    pub machine_class: String,
    /// `model`.
    pub model: String,
    /// `model_version`.
    pub model_version: String,
}

/// Usage and cost of one cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostLine {
    /// Which cell.
    #[serde(flatten)]
    pub key: CellKey,
    /// Machine time in every mode, hours.
    pub machine_hours: f64,
    /// Autonomous time, hours (the denominator).
    pub autonomous_hours: f64,
    /// Energy from all rails, kWh.
    pub energy_kwh: f64,
    /// Edge hardware amortization.
    pub amortization: f64,
    /// Amortization rate used, per machine hour (`None`: the class has no price).
    pub hourly_rate: Option<f64>,
    /// Energy cost.
    pub energy: f64,
    /// Tariff used, per kWh (`None`: the site has no price).
    pub energy_price_per_kwh: Option<f64>,
    /// Allocated cloud inference.
    pub cloud_inference: f64,
    /// Allocated training.
    pub training: f64,
}

impl CostLine {
    /// Sum of the four components.
    pub fn total(&self) -> f64 {
        self.amortization + self.energy + self.cloud_inference + self.training
    }
}

/// A share slice that had no autonomous hours to go to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unallocated {
    /// Midnight of the day.
    pub day_start_ms: i64,
    /// `cloud-inference` or `training`.
    pub service: ShareService,
    /// Amount left unallocated.
    pub amount: f64,
}

/// Totals over a set of cells.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostSummary {
    /// What the row sums: a machine id, a site, `model model_version`, or `all`.
    pub by: String,
    /// Autonomous hours.
    pub autonomous_hours: f64,
    /// Amortization.
    pub amortization: f64,
    /// Energy.
    pub energy: f64,
    /// Cloud inference.
    pub cloud_inference: f64,
    /// Training.
    pub training: f64,
    /// Sum of the components.
    pub total: f64,
    /// `total / autonomous_hours`; `None` without autonomous hours.
    pub cost_per_autonomous_hour: Option<f64>,
}

/// Costs of a period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostReport {
    /// ISO 4217 code.
    pub currency: String,
    /// The period.
    pub period: Period,
    /// Period start, RFC 3339.
    pub period_start: String,
    /// Period end (exclusive), RFC 3339.
    pub period_end: String,
    /// One line per (day, machine, model version) with any usage.
    pub lines: Vec<CostLine>,
    /// Per machine.
    pub by_machine: Vec<CostSummary>,
    /// Per site.
    pub by_site: Vec<CostSummary>,
    /// Per `model model_version`.
    pub by_model_version: Vec<CostSummary>,
    /// Everything.
    pub total: CostSummary,
    /// Share slices with nobody to allocate to.
    pub unallocated: Vec<Unallocated>,
    /// Prices the book lacks for cells that had usage, e.g. `machine_class dozer`.
    pub missing_prices: Vec<String>,
}

#[derive(Debug, Default)]
struct Usage {
    machine_seconds: f64,
    autonomous_seconds: f64,
    joules: f64,
}

fn cell_key(day_start_ms: i64, s: &Series) -> CellKey {
    CellKey {
        day_start_ms,
        machine_id: s.label(label::MACHINE_ID).to_owned(),
        site: s.label(label::SITE).to_owned(),
        machine_class: s.label(label::MACHINE_CLASS).to_owned(),
        model: s.label(label::MODEL).to_owned(),
        model_version: s.label(label::MODEL_VERSION).to_owned(),
    }
}

/// Computes the cost of every (day, machine, model version) of `period` from `series`.
pub fn cost(book: &PriceBook, series: &SeriesSet, period: Period) -> CostReport {
    let mut costing = Costing::new(book, period);
    for s in series.iter() {
        costing.add(s);
    }
    costing.finish()
}

/// [`cost()`] one series at a time, for bounded memory (each series added whole, as for
/// [`crate::slo::Evaluation`]).
#[derive(Debug)]
pub struct Costing<'a> {
    book: &'a PriceBook,
    period: Period,
    usage: BTreeMap<CellKey, Usage>,
}

impl<'a> Costing<'a> {
    /// Starts costing `period`.
    pub fn new(book: &'a PriceBook, period: Period) -> Self {
        Self {
            book,
            period,
            usage: BTreeMap::new(),
        }
    }

    /// Adds one whole series; series of other metrics are ignored.
    pub fn add(&mut self, s: &Series) {
        let metric = s.metric();
        if metric != metric::AUTONOMY_SECONDS && metric != metric::ENERGY_JOULES {
            return;
        }
        for day in self.period.days() {
            let window = Window {
                start_ms: day,
                end_ms: day + MS_PER_DAY,
            };
            let increase = s.increase(window, self.book.lookback_ms);
            if increase <= 0.0 {
                continue;
            }
            let u = self.usage.entry(cell_key(day, s)).or_default();
            if metric == metric::ENERGY_JOULES {
                u.joules += increase;
            } else {
                u.machine_seconds += increase;
                if s.label(label::MODE) == value::AUTONOMOUS {
                    u.autonomous_seconds += increase;
                }
            }
        }
    }

    /// The report.
    pub fn finish(self) -> CostReport {
        price(self.book, self.usage, self.period)
    }
}

fn price(book: &PriceBook, usage: BTreeMap<CellKey, Usage>, period: Period) -> CostReport {
    let mut missing = BTreeSet::new();
    let mut lines: Vec<CostLine> = usage
        .into_iter()
        .map(|(key, u)| {
            let hw = book.machine_classes.get(&key.machine_class);
            let hourly_rate = hw.map(|hw| hw.purchase_price / hw.lifetime_hours);
            let tariff = book.sites.get(&key.site).map(|s| s.energy_price_per_kwh);
            let machine_hours = u.machine_seconds / SECONDS_PER_HOUR;
            let energy_kwh = u.joules / JOULES_PER_KWH;
            if hourly_rate.is_none() && machine_hours > 0.0 {
                missing.insert(format!("machine_class {}", key.machine_class));
            }
            if tariff.is_none() && energy_kwh > 0.0 {
                missing.insert(format!("site {}", key.site));
            }
            CostLine {
                machine_hours,
                autonomous_hours: u.autonomous_seconds / SECONDS_PER_HOUR,
                energy_kwh,
                amortization: hourly_rate.map_or(0.0, |r| machine_hours * r),
                hourly_rate,
                energy: tariff.map_or(0.0, |p| energy_kwh * p),
                energy_price_per_kwh: tariff,
                cloud_inference: 0.0,
                training: 0.0,
                key,
            }
        })
        .collect();

    let mut unallocated = Vec::new();
    for share in &book.shares {
        let slice = share.config.amount / share.period.day_count() as f64;
        for day in period
            .days()
            .filter(|d| (share.period.start_ms..share.period.end_ms).contains(d))
        {
            let in_scope = |l: &CostLine| l.key.day_start_ms == day && share.in_scope(&l.key);
            let hours: f64 = lines
                .iter()
                .filter(|l| in_scope(l))
                .map(|l| l.autonomous_hours)
                .sum();
            if hours <= 0.0 {
                if slice > 0.0 {
                    unallocated.push(Unallocated {
                        day_start_ms: day,
                        service: share.config.service,
                        amount: slice,
                    });
                }
                continue;
            }
            for line in lines.iter_mut().filter(|l| in_scope(l)) {
                let part = slice * line.autonomous_hours / hours;
                match share.config.service {
                    ShareService::CloudInference => line.cloud_inference += part,
                    ShareService::Training => line.training += part,
                }
            }
        }
    }
    lines.sort_by(|a, b| a.key.cmp(&b.key));

    CostReport {
        currency: book.currency.clone(),
        period,
        period_start: format_rfc3339(period.start_ms),
        period_end: format_rfc3339(period.end_ms),
        by_machine: summarize(&lines, |k| k.machine_id.clone()),
        by_site: summarize(&lines, |k| k.site.clone()),
        by_model_version: summarize(&lines, |k| format!("{} {}", k.model, k.model_version)),
        total: summarize(&lines, |_| "all".to_owned())
            .pop()
            .unwrap_or_else(|| summary("all".to_owned(), std::iter::empty())),
        lines,
        unallocated,
        missing_prices: missing.into_iter().collect(),
    }
}

fn summary<'a>(by: String, lines: impl Iterator<Item = &'a CostLine>) -> CostSummary {
    let mut s = CostSummary {
        by,
        autonomous_hours: 0.0,
        amortization: 0.0,
        energy: 0.0,
        cloud_inference: 0.0,
        training: 0.0,
        total: 0.0,
        cost_per_autonomous_hour: None,
    };
    for l in lines {
        s.autonomous_hours += l.autonomous_hours;
        s.amortization += l.amortization;
        s.energy += l.energy;
        s.cloud_inference += l.cloud_inference;
        s.training += l.training;
        s.total += l.total();
    }
    s.cost_per_autonomous_hour = (s.autonomous_hours > 0.0).then(|| s.total / s.autonomous_hours);
    s
}

fn summarize(lines: &[CostLine], by: impl Fn(&CellKey) -> String) -> Vec<CostSummary> {
    let keys: BTreeSet<String> = lines.iter().map(|l| by(&l.key)).collect();
    keys.into_iter()
        .map(|k| {
            let matching = lines.iter().filter(|l| by(&l.key) == k);
            summary(k.clone(), matching)
        })
        .collect()
}

//! Where reports read raw samples: the embedded store, or a Prometheus-compatible HTTP query API.
//! Both return the same [`RawSeries`] for the same data, and this module turns them into the SLO
//! core's [`SeriesSet`], so a report is the same numbers whichever source fed it.
//!
//! Invariants:
//! - A need `metric[range]` at `end` reads the samples with `end − range < ts ≤ end` from either
//!   source (Prometheus' range-selector semantics; the store query is made to match).
//! - A fleet need read [`Read::Latest`] gives, per series, the value of its latest sample in that
//!   range stamped at `end`, from either source (Prometheus' `last_over_time` gives no sample
//!   time, so the store's time is dropped too): the fleet core sees the same set from both.

use edgewatch_slo::fleet::{FleetNeed, Read};
use edgewatch_slo::series::METRIC_NAME_LABEL;
use edgewatch_slo::{
    Catalog, CostReport, Labels, MS_PER_DAY, Period, PriceBook, SeriesSet, SloReport,
};

use crate::prometheus::{QueryError, query_latest, query_raw, query_raw_of};
use crate::store::{RawSeries, Store, StoreError};

/// A source of raw samples.
pub enum Source {
    /// The embedded store: opened read-only beside a running gateway, or the running gateway's
    /// own handle (shared with its ingest path, read only here).
    Store(std::sync::Arc<Store>),
    /// A Prometheus base URL, e.g. `http://127.0.0.1:9090`.
    Prometheus(String),
}

/// Reading samples failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The Prometheus query failed.
    #[error(transparent)]
    Query(#[from] QueryError),
}

impl Source {
    /// Raw samples of `metric` with `end_ms − range_ms < ts ≤ end_ms`.
    pub fn fetch(
        &self,
        metric: &str,
        range_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<RawSeries>, SourceError> {
        let start_ms = end_ms.saturating_sub(range_ms);
        Ok(match self {
            Self::Store(store) => store.query(metric, start_ms.saturating_add(1), end_ms)?,
            Self::Prometheus(url) => query_raw(url, metric, start_ms, end_ms)?,
        })
    }

    /// Fetches every `(metric, range_ms, end_ms)` into one series set.
    pub fn series_set(
        &self,
        needs: impl IntoIterator<Item = (&'static str, i64, i64)>,
    ) -> Result<SeriesSet, SourceError> {
        let mut set = SeriesSet::new();
        for (metric, range_ms, end_ms) in needs {
            for raw in self.fetch(metric, range_ms, end_ms)? {
                set.add(labels_of(&raw), raw.samples);
            }
        }
        Ok(set)
    }
}

/// Days in the default cost period (whole UTC days ending at the midnight before the evaluation
/// time): a month of days, enough to see a trend and short enough to read.
pub const DEFAULT_COST_DAYS: i64 = 30;

/// The default cost period at `at_ms`: the [`DEFAULT_COST_DAYS`] UTC days before the midnight
/// at or before `at_ms`.
pub fn default_cost_period(at_ms: i64) -> Period {
    let end = at_ms.div_euclid(MS_PER_DAY) * MS_PER_DAY;
    Period {
        start_ms: end - DEFAULT_COST_DAYS * MS_PER_DAY,
        end_ms: end,
    }
}

impl Source {
    /// The SLO report at `at_ms`: what `report` prints and the fleet page's overview shows, by
    /// one code path.
    pub fn slo_report(&self, catalog: &Catalog, at_ms: i64) -> Result<SloReport, SourceError> {
        let needs = edgewatch_slo::required_series(catalog, at_ms);
        let set = self.series_set(needs.iter().map(|n| (n.metric, n.range_ms, n.end_ms)))?;
        Ok(edgewatch_slo::evaluate(catalog, &set, at_ms))
    }

    /// The cost report of `period`, as `report` prints it and the fleet page's cost view shows.
    pub fn cost_report(&self, book: &PriceBook, period: Period) -> Result<CostReport, SourceError> {
        let needs = edgewatch_slo::cost_required_series(book, period);
        let set = self.series_set(needs.iter().map(|n| (n.metric, n.range_ms, n.end_ms)))?;
        Ok(edgewatch_slo::cost(book, &set, period))
    }
}

impl Source {
    /// Reads what the fleet view needs (`edgewatch_slo::fleet::table_needs`, `detail_needs`)
    /// into one series set.
    pub fn fleet_set(&self, needs: &[FleetNeed]) -> Result<SeriesSet, SourceError> {
        let mut set = SeriesSet::new();
        for need in needs {
            let (metric, end) = (need.metric, need.end_ms);
            let start = end.saturating_sub(need.range_ms);
            let machine = need.machine.as_deref();
            let raws = match (self, need.read) {
                (Self::Store(store), Read::Samples) => match machine {
                    Some(machine) => store.query_machine(metric, start + 1, end, machine)?,
                    None => store.query(metric, start + 1, end)?,
                },
                (Self::Store(store), Read::Latest) => {
                    let mut raws = store.query_latest(metric, start + 1, end, machine)?;
                    for raw in &mut raws {
                        for sample in &mut raw.samples {
                            sample.0 = end;
                        }
                    }
                    raws
                }
                (Self::Prometheus(url), Read::Samples) => {
                    query_raw_of(url, metric, machine, start, end)?
                }
                (Self::Prometheus(url), Read::Latest) => {
                    query_latest(url, metric, machine, start, end)?
                }
            };
            for raw in raws {
                set.add(labels_of(&raw), raw.samples);
            }
        }
        Ok(set)
    }
}

/// The SLO core's labels (with `__name__`) of a raw series.
pub fn labels_of(raw: &RawSeries) -> Labels {
    let mut labels: Labels = raw.labels.iter().cloned().collect();
    labels.insert(METRIC_NAME_LABEL.to_owned(), raw.metric.clone());
    labels
}

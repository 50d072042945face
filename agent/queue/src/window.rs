//! Offline window: how long the queue can keep accepting at current append rates before it must
//! evict, and the alarm raised when that falls below a threshold.
//!
//! Invariants:
//! - Pure logic: time is an argument; nothing here reads a clock or does I/O.
//! - Rates are exponentially smoothed bytes per second per tier; with no rate, the window is
//!   unbounded (`None`).
//! - The alarm fires once when the window drops below the threshold and re-arms only after the
//!   window climbs above threshold × [`REARM_FACTOR`], so a window hovering at the threshold does
//!   not raise an event per flush.

use std::time::{Duration, SystemTime};

use edgewatch_proto::tier::PerTier;

/// The window must recover to this multiple of the threshold before the alarm can fire again.
pub const REARM_FACTOR: f64 = 1.25;
/// Rates are folded in over at least this span, so a single flush's burst is not a rate.
const MIN_SAMPLE_SPAN: Duration = Duration::from_secs(1);

/// Smoothed append rates per tier.
#[derive(Clone, Debug)]
pub struct RateEstimator {
    time_constant: Duration,
    /// Smoothed bytes per second per tier.
    rate: PerTier<f64>,
    /// Bytes appended since `since`.
    accumulated: PerTier<u64>,
    since: Option<SystemTime>,
}

impl RateEstimator {
    /// An estimator with no history (all rates zero).
    pub fn new(time_constant: Duration) -> Self {
        Self {
            time_constant,
            rate: PerTier::default(),
            accumulated: PerTier::default(),
            since: None,
        }
    }

    /// Counts `bytes` appended to tier `ix`.
    pub fn record(&mut self, ix: usize, bytes: u64) {
        let slot = self.accumulated.at_mut(ix);
        *slot = slot.saturating_add(bytes);
    }

    /// Folds the bytes counted since the last update into the rates. A clock that stepped back
    /// restarts the sample span without changing the rates.
    pub fn update(&mut self, now: SystemTime) {
        let Some(since) = self.since else {
            self.since = Some(now);
            return;
        };
        let Ok(span) = now.duration_since(since) else {
            self.since = Some(now);
            self.accumulated = PerTier::default();
            return;
        };
        if span < MIN_SAMPLE_SPAN {
            return;
        }
        let seconds = span.as_secs_f64();
        let weight = 1.0 - (-seconds / self.time_constant.as_secs_f64()).exp();
        for ix in 0..3 {
            let instant = *self.accumulated.at(ix) as f64 / seconds;
            let rate = self.rate.at_mut(ix);
            *rate += (instant - *rate) * weight;
        }
        self.accumulated = PerTier::default();
        self.since = Some(now);
    }

    /// Smoothed bytes per second per tier.
    pub fn rates(&self) -> PerTier<f64> {
        self.rate
    }
}

/// Time until the first tier reaches its cap, or the total reaches the budget, if nothing is
/// delivered meanwhile. `None` when nothing is being appended.
pub fn offline_window(
    rates: PerTier<f64>,
    bytes: PerTier<u64>,
    caps: PerTier<u64>,
    budget: u64,
) -> Option<Duration> {
    let mut window = f64::INFINITY;
    for ix in 0..3 {
        let rate = *rates.at(ix);
        if rate > 0.0 {
            let room = caps.at(ix).saturating_sub(*bytes.at(ix)) as f64;
            window = window.min(room / rate);
        }
    }
    let total_rate = rates.safety + rates.slo + rates.debug;
    if total_rate > 0.0 {
        window = window.min(budget.saturating_sub(bytes.sum()) as f64 / total_rate);
    }
    window
        .is_finite()
        .then(|| Duration::from_secs_f64(window.clamp(0.0, 1.0e12)))
}

/// The `OfflineWindowLow` alarm with hysteresis.
#[derive(Clone, Copy, Debug)]
pub struct WindowAlarm {
    armed: bool,
}

impl Default for WindowAlarm {
    fn default() -> Self {
        Self { armed: true }
    }
}

impl WindowAlarm {
    /// Feeds the current window; returns true when the alarm event should be raised now.
    pub fn observe(&mut self, window: Option<Duration>, threshold: Duration) -> bool {
        let seconds = window.map_or(f64::INFINITY, |w| w.as_secs_f64());
        let threshold = threshold.as_secs_f64();
        if self.armed && seconds < threshold {
            self.armed = false;
            return true;
        }
        if !self.armed && seconds > threshold * REARM_FACTOR {
            self.armed = true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + seconds)
    }

    #[test]
    fn a_steady_rate_converges_to_its_value() {
        let mut rates = RateEstimator::new(Duration::from_secs(60));
        rates.update(at(0));
        for second in 1..=600 {
            rates.record(2, 1000);
            rates.update(at(second));
        }
        assert!(
            (rates.rates().debug - 1000.0).abs() < 1.0,
            "{}",
            rates.rates().debug
        );
        assert_eq!(rates.rates().safety, 0.0);
    }

    #[test]
    fn a_clock_stepping_back_keeps_the_rates() {
        let mut rates = RateEstimator::new(Duration::from_secs(60));
        rates.update(at(100));
        rates.record(0, 6000);
        rates.update(at(160));
        let before = rates.rates().safety;
        rates.record(0, 1_000_000);
        rates.update(at(10));
        assert_eq!(rates.rates().safety, before);
    }

    #[test]
    fn the_window_is_the_first_tier_to_reach_its_cap() {
        let rates = PerTier {
            safety: 1.0,
            slo: 10.0,
            debug: 0.0,
        };
        let bytes = PerTier {
            safety: 0,
            slo: 900,
            debug: 0,
        };
        let caps = PerTier::all(1000);
        assert_eq!(
            offline_window(rates, bytes, caps, 10_000),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn the_window_is_limited_by_the_total_budget() {
        let rates = PerTier::all(10.0);
        let caps = PerTier::all(1_000_000);
        assert_eq!(
            offline_window(rates, PerTier::default(), caps, 300),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn with_no_appends_the_window_is_unbounded() {
        let caps = PerTier::all(1000);
        assert_eq!(
            offline_window(PerTier::default(), PerTier::default(), caps, 1000),
            None
        );
    }

    #[test]
    fn the_alarm_fires_once_and_rearms_only_above_the_hysteresis() {
        let mut alarm = WindowAlarm::default();
        let threshold = 24 * HOUR;
        assert!(!alarm.observe(Some(30 * HOUR), threshold));
        assert!(alarm.observe(Some(23 * HOUR), threshold));
        assert!(!alarm.observe(Some(20 * HOUR), threshold));
        assert!(!alarm.observe(Some(25 * HOUR), threshold));
        assert!(!alarm.observe(Some(23 * HOUR), threshold));
        assert!(!alarm.observe(Some(31 * HOUR), threshold));
        assert!(alarm.observe(Some(10 * HOUR), threshold));
        assert!(!alarm.observe(None, threshold));
        assert!(alarm.observe(Some(HOUR), threshold));
    }
}

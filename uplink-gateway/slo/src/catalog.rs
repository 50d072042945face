//! The SLO catalog: what is promised, measured from which counters, alerted on which burn-rate
//! windows, and what the error-budget policy answers. A raw form mirrors the TOML
//! ([`RawCatalog`], embedded by the gateway in its own config file), and [`Catalog::from_raw`]
//! turns it into the [`Catalog`] the rest of the crate uses.
//!
//! Invariants:
//! - A [`Catalog`] holds only checked values: objectives strictly between 0 and 100 %, windows
//!   shorter than every period, unique names that are safe as Prometheus label values.
//! - Every [`ConfigError`] names the offending key, relative to the catalog's own table.
//! - Durations are read only through [`DURATION_KEYS`], by the workspace's one grammar
//!   (`edgewatch_conventions::duration`), then held as i64 milliseconds; formatting them back
//!   into Prometheus units is `calendar::format_duration`.
//! - The defaults are the field's starting points (see `docs/slo-catalog.md`).

use crate::calendar::format_duration;
use crate::names::{label, metric, value};
use crate::series::Series;
use edgewatch_conventions::config::ConfigError;
use edgewatch_conventions::duration::DurationKey;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How far before a window's start a sample may serve as its base: agents sample every 10–15 s,
/// so ten minutes bridges short gaps without reaching into an earlier run of the counter.
pub const DEFAULT_BASE_LOOKBACK: &str = "10m";
/// The SLO period: the SRE workbook's windows and burn factors assume 30 days.
pub const DEFAULT_PERIOD: &str = "30d";
/// Placeholders a policy action may use: the SLO's name and its group's labels.
pub const ACTION_PLACEHOLDERS: [&str; 5] = [
    "slo",
    label::MACHINE_CLASS,
    label::SITE,
    label::MODEL,
    label::MODEL_VERSION,
];

/// Ten years: longer than any SLO period or alert window anyone evaluates.
const LONGEST_WINDOW: Duration = Duration::from_secs(3_650 * 86_400);
/// `base_lookback` of the catalog and of the price book: above zero, at most a week.
pub const BASE_LOOKBACK: DurationKey = DurationKey::new(
    "base_lookback",
    Duration::from_millis(1),
    Duration::from_secs(7 * 86_400),
);
/// `slos[].period`: above zero (and at least every alert window).
pub const PERIOD: DurationKey =
    DurationKey::new("slos[].period", Duration::from_millis(1), LONGEST_WINDOW);
/// `alert_windows[].long`: above zero.
pub const ALERT_LONG: DurationKey = DurationKey::new(
    "alert_windows[].long",
    Duration::from_millis(1),
    LONGEST_WINDOW,
);
/// `alert_windows[].short`: above zero (and shorter than the long window).
pub const ALERT_SHORT: DurationKey = DurationKey::new(
    "alert_windows[].short",
    Duration::from_millis(1),
    LONGEST_WINDOW,
);
/// Every duration key of the catalog, named relative to its table (`[slo]` in the gateway's
/// file).
pub const DURATION_KEYS: [DurationKey; 4] = [BASE_LOOKBACK, PERIOD, ALERT_LONG, ALERT_SHORT];

/// `text` under `key` (the entry `at`, e.g. `slos[2].period`), in milliseconds.
pub(crate) fn duration_ms(key: &DurationKey, at: &str, text: &str) -> Result<i64, ConfigError> {
    let value = key.parse_at(at, text)?;
    // The bounds keep every value far below i64::MAX milliseconds.
    Ok(i64::try_from(value.as_millis()).unwrap_or(i64::MAX))
}

/// `key` out of its range: `value` is not `expected`.
pub(crate) fn out_of_range(key: impl Into<String>, value: f64, expected: &str) -> ConfigError {
    ConfigError::new(key, format!("{value} is out of range ({expected})"))
}

/// `key` holds `value`, with characters or a form outside `expected`.
pub(crate) fn bad_name(key: impl Into<String>, value: &str, expected: &str) -> ConfigError {
    ConfigError::new(key, format!("`{value}` is not allowed ({expected})"))
}

/// `key` repeats `value`, which must be unique.
pub(crate) fn duplicate(key: impl Into<String>, value: &str) -> ConfigError {
    ConfigError::new(key, format!("`{value}` appears twice"))
}

/// `key` is an empty list or text that must not be.
pub(crate) fn empty(key: impl Into<String>) -> ConfigError {
    ConfigError::new(key, "must not be empty")
}

/// The catalog as written in TOML. Missing keys take [`RawCatalog::default`]'s values.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RawCatalog {
    /// See [`DEFAULT_BASE_LOOKBACK`] and the increase rule in [`crate::series`].
    pub base_lookback: String,
    /// The SLOs; evaluated and rendered in this order.
    pub slos: Vec<RawSlo>,
    /// Multi-window burn-rate alerts, shared by every SLO.
    pub alert_windows: Vec<RawAlertWindow>,
    /// Error-budget policy rules; every matching rule's action applies.
    pub policy: Vec<RawPolicyRule>,
}

/// One SLO as written in TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSlo {
    /// Identifier: lowercase letters, digits, `-` and `_`; becomes the `slo` label.
    pub name: String,
    /// One line for humans (rule annotations, reports).
    #[serde(default)]
    pub description: String,
    /// Target share of good events, in percent (e.g. 99.99).
    pub objective_percent: f64,
    /// Rolling compliance period over event time (default [`DEFAULT_PERIOD`]).
    #[serde(default = "default_period")]
    pub period: String,
    /// Which counters measure it.
    pub sli: RawSli,
}

fn default_period() -> String {
    DEFAULT_PERIOD.to_owned()
}

/// Which counters an SLO is computed from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RawSli {
    /// good = activations − deadline misses of the named loops (an activation misses its
    /// deadline when it completes after release + D or never runs); rows fed by older agents or
    /// probes say so (see [`Semantics`]).
    ControlDeadline(LoopsSli),
    /// good = safety events that reached the gateway within the freshness limit of the
    /// machine's reconnect, out of all safety events received.
    Freshness(FreshnessSli),
    /// bad = throttled seconds of the named components, out of all machine seconds (every mode).
    ThrottledTime(ThrottleSli),
}

/// Loops selected by name (`loop` label).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopsSli {
    /// Exact `loop` label values.
    pub loops: Vec<String>,
}

/// The freshness SLI has no parameters: the gateway applies the freshness limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FreshnessSli {}

/// Components whose throttled seconds count as bad.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThrottleSli {
    /// Values of the `component` label (`cpu`, `gpu`, `soc`). With several, a second in which two
    /// components throttle counts twice.
    pub components: Vec<String>,
}

/// Page or ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Someone acts now.
    Page,
    /// Someone acts this week.
    Ticket,
}

impl Severity {
    /// `page` or `ticket`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Page => "page",
            Self::Ticket => "ticket",
        }
    }
}

/// One multi-window burn-rate alert as written in TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAlertWindow {
    /// Long window, e.g. `1h`.
    pub long: String,
    /// Short window, e.g. `5m`; confirms the burn is still going on.
    pub short: String,
    /// Share of the period's budget that burning through the long window would spend, percent.
    pub budget_percent: f64,
    /// Page or ticket.
    pub severity: Severity,
}

/// When a policy rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyWhen {
    /// Budget remaining ≤ 0 over the period.
    BudgetExhausted,
    /// Budget remaining below `percent`.
    BudgetBelow,
    /// A page alert is firing.
    PageAlertFiring,
    /// A ticket alert is firing.
    TicketAlertFiring,
}

/// One error-budget policy rule as written in TOML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicyRule {
    /// The condition.
    pub when: PolicyWhen,
    /// Threshold for `budget_below`, percent of the budget; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<f64>,
    /// What to do; may use `{slo}`, `{machine_class}`, `{site}`, `{model}`, `{model_version}`.
    pub action: String,
}

impl Default for RawCatalog {
    /// The field's starting points: safety-relevant AI control 99.99 %, assistive 99.9 %, safety
    /// event freshness 95 %, GPU throttled time at most 1 % of machine time; the SRE workbook's
    /// windows; freeze on an exhausted budget, halt on a page.
    fn default() -> Self {
        let slo = |name: &str, description: &str, objective_percent: f64, sli: RawSli| RawSlo {
            name: name.to_owned(),
            description: description.to_owned(),
            objective_percent,
            period: default_period(),
            sli,
        };
        let window =
            |long: &str, short: &str, budget_percent: f64, severity: Severity| RawAlertWindow {
                long: long.to_owned(),
                short: short.to_owned(),
                budget_percent,
                severity,
            };
        Self {
            base_lookback: DEFAULT_BASE_LOOKBACK.to_owned(),
            slos: vec![
                slo(
                    "safety-control",
                    "Safety-relevant on-machine AI function: control steps within their deadline",
                    99.99,
                    RawSli::ControlDeadline(LoopsSli {
                        loops: vec!["safety".to_owned()],
                    }),
                ),
                slo(
                    "assistive-control",
                    "Assistive on-machine AI function: control steps within their deadline",
                    99.9,
                    RawSli::ControlDeadline(LoopsSli {
                        loops: vec!["assistive".to_owned()],
                    }),
                ),
                slo(
                    "safety-event-freshness",
                    "Safety events at the gateway within the freshness limit of the machine's reconnect",
                    95.0,
                    RawSli::Freshness(FreshnessSli {}),
                ),
                slo(
                    "gpu-throttled-time",
                    "Machine time during which the GPU was not thermally throttled",
                    99.0,
                    RawSli::ThrottledTime(ThrottleSli {
                        components: vec![value::GPU.to_owned()],
                    }),
                ),
            ],
            alert_windows: vec![
                window("1h", "5m", 2.0, Severity::Page),
                window("6h", "30m", 5.0, Severity::Page),
                window("3d", "6h", 10.0, Severity::Ticket),
            ],
            policy: vec![
                RawPolicyRule {
                    when: PolicyWhen::PageAlertFiring,
                    percent: None,
                    action: "halt rollout of {model} {model_version} to {machine_class} at {site}"
                        .to_owned(),
                },
                RawPolicyRule {
                    when: PolicyWhen::BudgetExhausted,
                    percent: None,
                    action: "freeze rollouts of {model} {model_version} to class {machine_class}"
                        .to_owned(),
                },
            ],
        }
    }
}

/// A validated catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    /// Base lookback of the increase rule, ms.
    pub lookback_ms: i64,
    /// The SLOs, in configured order.
    pub slos: Vec<Slo>,
    /// Burn-rate alert windows, in configured order.
    pub alert_windows: Vec<AlertWindow>,
    /// Policy rules, in configured order.
    pub policy: Vec<PolicyRule>,
}

/// A validated SLO.
#[derive(Debug, Clone, PartialEq)]
pub struct Slo {
    /// Identifier, also the `slo` label value.
    pub name: String,
    /// One line for humans.
    pub description: String,
    /// Target share of good events, as a ratio (0.9999).
    pub objective: f64,
    /// Objective as configured, percent, for display and rules (`99.99`).
    pub objective_percent: f64,
    /// Rolling compliance period, ms.
    pub period_ms: i64,
    /// What is counted.
    pub sli: Sli,
}

impl Slo {
    /// The error budget as a ratio of events: `1 − objective`.
    pub fn budget(&self) -> f64 {
        // 100 − 99.99 is 0.010000000000005116 in binary; rounding to 1e-12 of a ratio gives the
        // 1e-4 that was meant, so hand-computed burn rates and rule thresholds match exactly.
        ((100.0 - self.objective_percent) * 1e10).round() / 1e12
    }
}

/// A validated SLI.
#[derive(Debug, Clone, PartialEq)]
pub enum Sli {
    /// good = activations − deadline misses of these loops; per row, by the [`Semantics`] that
    /// feed it.
    ControlDeadline {
        /// `loop` label values.
        loops: Vec<String>,
    },
    /// good = fresh safety events, total = received safety events.
    Freshness,
    /// bad = throttled seconds of these components, total = machine seconds in every mode.
    ThrottledTime {
        /// `component` label values.
        components: Vec<String>,
    },
}

/// A metric with an optional set-membership matcher on one label.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Selector {
    pub metric: &'static str,
    pub matcher: Option<(&'static str, Vec<String>)>,
}

impl Selector {
    fn all(metric: &'static str) -> Self {
        Self {
            metric,
            matcher: None,
        }
    }

    fn one_of(metric: &'static str, label: &'static str, values: &[String]) -> Self {
        Self {
            metric,
            matcher: Some((label, values.to_vec())),
        }
    }

    pub fn matches(&self, series: &Series) -> bool {
        series.metric() == self.metric
            && self
                .matcher
                .as_ref()
                .is_none_or(|(label, values)| values.iter().any(|v| v == series.label(label)))
    }

    /// Whether a refusal series ([`metric::REFUSED_SAMPLES`]) is about a series this selector
    /// matches: it names this metric, and it either carries the matcher's label with a selected
    /// value or does not carry it at all (the machine's refusals are folded), which counts, so
    /// a refusal is never lost for want of a label.
    pub fn matches_refusal(&self, refusal: &Series) -> bool {
        refusal.metric() == metric::REFUSED_SAMPLES
            && refusal.label(label::SERIES) == self.metric
            && self.matcher.as_ref().is_none_or(|(label, values)| {
                refusal
                    .labels()
                    .get(*label)
                    .is_none_or(|v| values.contains(v))
            })
    }
}

/// How the bad events of an SLI are counted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Bad {
    /// A counter of bad events.
    Counter(Selector),
    /// Total minus a counter of good events.
    TotalMinusGood(Selector),
}

impl Bad {
    /// The counter read: of bad or of good events.
    pub fn selector(&self) -> &Selector {
        match self {
            Self::Counter(sel) | Self::TotalMinusGood(sel) => sel,
        }
    }
}

/// What judged the activations of a deadline SLO's row: the semantics of the deadline counters
/// that feed it (`docs/slo-catalog.md`, "Deadline semantics"). A row takes the first, in this
/// order, whose counters hold samples of its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Semantics {
    /// An activation misses its deadline when it completes after release + D or never runs:
    /// the deadline SLI, (activations − deadline misses) / activations.
    Completion,
    /// The loop's probe predates deadlines (ABI 1): activations are counted, deadline misses
    /// are not, so the SLI is not measured.
    LegacyProbe,
    /// An agent from before deadline semantics: the legacy computation, (cycles − misses) /
    /// cycles, its misses being execution overruns.
    LegacyAgent,
}

impl Semantics {
    /// Its identifier, as in `report --json` and the `semantics` label of generated rules.
    pub fn id(self) -> &'static str {
        match self {
            Self::Completion => "completion",
            Self::LegacyProbe => "legacy_probe",
            Self::LegacyAgent => "legacy_agent",
        }
    }

    /// What a report says of a row of these semantics.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Completion => "completion",
            Self::LegacyProbe => "not measured (probe ABI 1)",
            Self::LegacyAgent => "legacy (overruns, agent before deadlines)",
        }
    }

    /// Why activations of these semantics were judged against no deadline (`None`: they were).
    pub fn unjudged_because(self) -> Option<&'static str> {
        match self {
            Self::Completion => None,
            Self::LegacyProbe => Some("probe ABI 1"),
            Self::LegacyAgent => Some("agent before deadlines"),
        }
    }
}

/// One way of computing an SLI from its counters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Computation {
    /// The deadline semantics it reads (`None` for SLIs that have no such thing).
    pub semantics: Option<Semantics>,
    /// The counter of all events.
    pub total: Selector,
    /// How bad events are counted; `None`: they are not measured.
    pub bad: Option<Bad>,
}

impl Sli {
    /// The ways the SLI is computed, in order of precedence: a row takes the first whose
    /// counters hold its group. The deadline SLI has one per [`Semantics`]; the others, one.
    pub(crate) fn computations(&self) -> Vec<Computation> {
        match self {
            Self::ControlDeadline { loops } => {
                let by_loop = |metric| Selector::one_of(metric, label::LOOP, loops);
                vec![
                    Computation {
                        semantics: Some(Semantics::Completion),
                        total: by_loop(metric::CONTROL_ACTIVATIONS),
                        bad: Some(Bad::Counter(by_loop(metric::CONTROL_ACTIVATIONS_MISSED))),
                    },
                    Computation {
                        semantics: Some(Semantics::LegacyProbe),
                        total: by_loop(metric::CONTROL_LEGACY_PROBE_ACTIVATIONS),
                        bad: None,
                    },
                    Computation {
                        semantics: Some(Semantics::LegacyAgent),
                        total: by_loop(metric::CONTROL_CYCLES),
                        bad: Some(Bad::Counter(by_loop(metric::CONTROL_MISSED))),
                    },
                ]
            }
            Self::Freshness => vec![Computation {
                semantics: None,
                total: Selector::all(metric::SAFETY_EVENTS_RECEIVED),
                bad: Some(Bad::TotalMinusGood(Selector::all(
                    metric::SAFETY_EVENTS_FRESH,
                ))),
            }],
            Self::ThrottledTime { components } => vec![Computation {
                semantics: None,
                total: Selector::all(metric::AUTONOMY_SECONDS),
                bad: Some(Bad::Counter(Selector::one_of(
                    metric::THROTTLE_SECONDS,
                    label::COMPONENT,
                    components,
                ))),
            }],
        }
    }

    /// The counters of the activations no deadline judged, per cause: agents from before
    /// deadline semantics, and probes from before deadlines (ABI 1). The deadline SLI only.
    pub(crate) fn unjudged(&self) -> Option<[(Semantics, Selector); 2]> {
        match self {
            Self::ControlDeadline { loops } => Some([
                (
                    Semantics::LegacyAgent,
                    Selector::one_of(metric::CONTROL_LEGACY_AGENT_ACTIVATIONS, label::LOOP, loops),
                ),
                (
                    Semantics::LegacyProbe,
                    Selector::one_of(metric::CONTROL_LEGACY_PROBE_ACTIVATIONS, label::LOOP, loops),
                ),
            ]),
            Self::Freshness | Self::ThrottledTime { .. } => None,
        }
    }

    /// Every metric the SLI reads, refusals included, each once.
    pub(crate) fn metrics(&self) -> Vec<&'static str> {
        let mut metrics = Vec::new();
        for c in self.computations() {
            metrics.push(c.total.metric);
            metrics.extend(c.bad.as_ref().map(|bad| bad.selector().metric));
        }
        for (_, sel) in self.unjudged().into_iter().flatten() {
            metrics.push(sel.metric);
        }
        metrics.push(metric::REFUSED_SAMPLES);
        let mut seen = Vec::with_capacity(metrics.len());
        metrics.retain(|m| {
            let new = !seen.contains(m);
            seen.push(*m);
            new
        });
        metrics
    }

    /// Whether a refusal series is about one of the counters this SLI computes with: the total
    /// and bad (or good) counter of every computation that measures bad events. Every
    /// deadline-counter event writes the legacy computation's two, so a refused one always
    /// counts, whatever its semantics.
    pub(crate) fn reads_refused(&self, refusal: &Series) -> bool {
        self.computations().iter().any(|c| {
            c.bad.as_ref().is_some_and(|bad| {
                c.total.matches_refusal(refusal) || bad.selector().matches_refusal(refusal)
            })
        })
    }
}

/// A validated multi-window burn-rate alert.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertWindow {
    /// Long window, ms.
    pub long_ms: i64,
    /// Short window, ms.
    pub short_ms: i64,
    /// Share of the period's budget spent when burning at the threshold for `long_ms`, percent.
    pub budget_percent: f64,
    /// Page or ticket.
    pub severity: Severity,
}

impl AlertWindow {
    /// Burn-rate threshold for an SLO period: `budget% × period_h / long_h`
    /// (30 d: 2 % over 1 h → 14.4; 5 % over 6 h → 6; 10 % over 3 d → 1).
    pub fn factor(&self, period_ms: i64) -> f64 {
        self.budget_percent * period_ms as f64 / (100.0 * self.long_ms as f64)
    }

    /// `1h/5m`.
    pub fn label(&self) -> String {
        format!(
            "{}/{}",
            format_duration(self.long_ms),
            format_duration(self.short_ms)
        )
    }

    /// The alert's name, shared by reports and generated rules: `SloErrorBudgetBurn1h5m`.
    pub fn alert_name(&self) -> String {
        format!(
            "SloErrorBudgetBurn{}{}",
            format_duration(self.long_ms),
            format_duration(self.short_ms)
        )
    }
}

/// A validated policy condition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PolicyCondition {
    /// Budget remaining ≤ 0.
    BudgetExhausted,
    /// Budget remaining below this ratio (0.25 = 25 %).
    BudgetBelow(f64),
    /// An alert of this severity is firing.
    AlertFiring(Severity),
}

/// A validated policy rule.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyRule {
    /// The condition.
    pub condition: PolicyCondition,
    /// The action template (placeholders checked).
    pub action: String,
}

impl RawCatalog {
    /// Checks every value and cross-field rule: [`Catalog::from_raw`].
    pub fn validate(&self) -> Result<Catalog, ConfigError> {
        Catalog::from_raw(self)
    }
}

impl Catalog {
    /// Checks every value and cross-field rule of `raw`; the error names the first bad key.
    pub fn from_raw(raw: &RawCatalog) -> Result<Catalog, ConfigError> {
        let lookback_ms = duration_ms(&BASE_LOOKBACK, BASE_LOOKBACK.name, &raw.base_lookback)?;
        let mut alert_windows = Vec::with_capacity(raw.alert_windows.len());
        for (i, w) in raw.alert_windows.iter().enumerate() {
            let key = format!("alert_windows[{i}]");
            let long_ms = duration_ms(&ALERT_LONG, &format!("{key}.long"), &w.long)?;
            let short_ms = duration_ms(&ALERT_SHORT, &format!("{key}.short"), &w.short)?;
            if short_ms >= long_ms {
                return Err(ConfigError::new(
                    format!("{key}.short"),
                    "the short window must be shorter than the long one",
                ));
            }
            if !(w.budget_percent > 0.0 && w.budget_percent <= 100.0) {
                return Err(out_of_range(
                    format!("{key}.budget_percent"),
                    w.budget_percent,
                    "greater than 0 and at most 100",
                ));
            }
            let window = AlertWindow {
                long_ms,
                short_ms,
                budget_percent: w.budget_percent,
                severity: w.severity,
            };
            if alert_windows
                .iter()
                .any(|o: &AlertWindow| o.alert_name() == window.alert_name())
            {
                return Err(duplicate(key, &window.label()));
            }
            alert_windows.push(window);
        }
        let longest_window = alert_windows.iter().map(|w| w.long_ms).max().unwrap_or(0);

        let mut slos: Vec<Slo> = Vec::with_capacity(raw.slos.len());
        for (i, s) in raw.slos.iter().enumerate() {
            let key = format!("slos[{i}]");
            check_name(&format!("{key}.name"), &s.name)?;
            if slos.iter().any(|o| o.name == s.name) {
                return Err(duplicate(format!("{key}.name"), &s.name));
            }
            if !(s.objective_percent > 0.0 && s.objective_percent < 100.0) {
                return Err(out_of_range(
                    format!("{key}.objective_percent"),
                    s.objective_percent,
                    "strictly between 0 and 100",
                ));
            }
            let period_ms = duration_ms(&PERIOD, &format!("{key}.period"), &s.period)?;
            if period_ms < longest_window {
                return Err(ConfigError::new(
                    format!("{key}.period"),
                    "the period must be at least as long as every alert window",
                ));
            }
            let sli = match &s.sli {
                RawSli::ControlDeadline(l) => {
                    let key = format!("{key}.sli.loops");
                    check_values(&key, &l.loops, None)?;
                    Sli::ControlDeadline {
                        loops: l.loops.clone(),
                    }
                }
                RawSli::Freshness(FreshnessSli {}) => Sli::Freshness,
                RawSli::ThrottledTime(t) => {
                    let key = format!("{key}.sli.components");
                    check_values(&key, &t.components, Some(&value::COMPONENTS))?;
                    Sli::ThrottledTime {
                        components: t.components.clone(),
                    }
                }
            };
            slos.push(Slo {
                name: s.name.clone(),
                description: s.description.clone(),
                objective: s.objective_percent / 100.0,
                objective_percent: s.objective_percent,
                period_ms,
                sli,
            });
        }

        let mut policy = Vec::with_capacity(raw.policy.len());
        for (i, p) in raw.policy.iter().enumerate() {
            let key = format!("policy[{i}]");
            let condition = match (p.when, p.percent) {
                (PolicyWhen::BudgetBelow, Some(percent)) if percent > 0.0 && percent <= 100.0 => {
                    PolicyCondition::BudgetBelow(percent / 100.0)
                }
                (PolicyWhen::BudgetBelow, Some(percent)) => {
                    return Err(out_of_range(
                        format!("{key}.percent"),
                        percent,
                        "greater than 0 and at most 100",
                    ));
                }
                (PolicyWhen::BudgetBelow, None) => {
                    return Err(ConfigError::new(
                        format!("{key}.percent"),
                        "`budget_below` needs a percent",
                    ));
                }
                (_, Some(_)) => {
                    return Err(ConfigError::new(
                        format!("{key}.percent"),
                        "only `budget_below` takes a percent",
                    ));
                }
                (PolicyWhen::BudgetExhausted, None) => PolicyCondition::BudgetExhausted,
                (PolicyWhen::PageAlertFiring, None) => PolicyCondition::AlertFiring(Severity::Page),
                (PolicyWhen::TicketAlertFiring, None) => {
                    PolicyCondition::AlertFiring(Severity::Ticket)
                }
            };
            check_template(&format!("{key}.action"), &p.action)?;
            policy.push(PolicyRule {
                condition,
                action: p.action.clone(),
            });
        }

        Ok(Catalog {
            lookback_ms,
            slos,
            alert_windows,
            policy,
        })
    }
}

impl Default for Catalog {
    /// The validated default catalog.
    fn default() -> Self {
        match Catalog::from_raw(&RawCatalog::default()) {
            Ok(catalog) => catalog,
            // The defaults are constants checked by a unit test.
            Err(error) => unreachable!("the default catalog is invalid: {error}"),
        }
    }
}

/// SLO names become label values, rule group names and file-friendly identifiers.
fn check_name(key: &str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(bad_name(
            key,
            name,
            "1 to 64 of a-z, 0-9, '-', '_', starting with a letter or digit",
        ))
    }
}

/// Label values to match: non-empty list of non-empty, distinct values, from `allowed` if given.
fn check_values(key: &str, values: &[String], allowed: Option<&[&str]>) -> Result<(), ConfigError> {
    if values.is_empty() {
        return Err(empty(key));
    }
    for (i, v) in values.iter().enumerate() {
        let bad_char = v.chars().any(char::is_control);
        if v.is_empty() || bad_char || allowed.is_some_and(|a| !a.contains(&v.as_str())) {
            return Err(bad_name(
                format!("{key}[{i}]"),
                v,
                if allowed.is_some() {
                    "one of cpu, gpu, soc"
                } else {
                    "a non-empty label value without control characters"
                },
            ));
        }
        if values[..i].contains(v) {
            return Err(duplicate(format!("{key}[{i}]"), v));
        }
    }
    Ok(())
}

fn check_template(key: &str, template: &str) -> Result<(), ConfigError> {
    if template.trim().is_empty() {
        return Err(empty(key));
    }
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let name = after.find('}').map(|close| &after[..close]);
        match name {
            Some(name) if ACTION_PLACEHOLDERS.contains(&name) => {
                rest = &after[name.len() + 1..];
            }
            _ => {
                return Err(bad_name(
                    key,
                    template,
                    "placeholders {slo}, {machine_class}, {site}, {model}, {model_version}",
                ));
            }
        }
    }
    Ok(())
}

/// Fills an action template; a group without a value for a placeholder shows `*`.
pub(crate) fn fill_template(template: &str, slo: &str, group: &crate::GroupKey) -> String {
    let or_any = |v: &str| if v.is_empty() { "*" } else { v }.to_owned();
    template
        .replace("{slo}", slo)
        .replace("{machine_class}", &or_any(&group.machine_class))
        .replace("{site}", &or_any(&group.site))
        .replace("{model_version}", &or_any(&group.model_version))
        .replace("{model}", &or_any(&group.model))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calendar::MS_PER_DAY;

    #[test]
    fn durations_parse_and_format_in_prometheus_units() {
        // A window of the catalog in milliseconds, `None` when refused.
        let parse_duration = |text: &str| duration_ms(&ALERT_LONG, ALERT_LONG.name, text).ok();
        assert_eq!(parse_duration("5m"), Some(300_000));
        assert_eq!(parse_duration("30d"), Some(30 * MS_PER_DAY));
        assert_eq!(parse_duration("250ms"), Some(250));
        for bad in ["", "5", "m", "0m", "1h30m", "-5m", "5 m", "1y"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        assert_eq!(format_duration(3_600_000), "1h");
        assert_eq!(format_duration(3 * MS_PER_DAY), "3d");
        assert_eq!(format_duration(90 * 60_000), "90m");
        assert_eq!(format_duration(14 * MS_PER_DAY), "2w");
    }

    #[test]
    fn the_default_catalog_is_valid_and_has_the_workbook_factors() {
        let catalog = RawCatalog::default().validate().unwrap();
        assert_eq!(catalog.slos.len(), 4);
        let period = catalog.slos[0].period_ms;
        let factors: Vec<f64> = catalog
            .alert_windows
            .iter()
            .map(|w| w.factor(period))
            .collect();
        // 2 % × 720 h / 1 h = 14.4; 5 % × 720 / 6 = 6; 10 % × 720 / 72 = 1.
        assert_eq!(factors, vec![14.4, 6.0, 1.0]);
        assert_eq!(catalog.slos[0].budget(), 1e-4);
        assert_eq!(
            catalog.alert_windows[0].alert_name(),
            "SloErrorBudgetBurn1h5m"
        );
    }

    #[test]
    fn errors_name_the_offending_key() {
        let mut c = RawCatalog::default();
        c.slos[1].objective_percent = 100.0;
        assert_eq!(c.validate().unwrap_err().key(), "slos[1].objective_percent");

        let mut c = RawCatalog::default();
        c.slos[2].period = "30 days".into();
        assert_eq!(c.validate().unwrap_err().key(), "slos[2].period");

        let mut c = RawCatalog::default();
        c.slos[1].name = c.slos[0].name.clone();
        assert_eq!(c.validate().unwrap_err().key(), "slos[1].name");

        let mut c = RawCatalog::default();
        c.slos[3].sli = RawSli::ThrottledTime(ThrottleSli {
            components: vec!["gpu".into(), "fan".into()],
        });
        assert_eq!(c.validate().unwrap_err().key(), "slos[3].sli.components[1]");

        let mut c = RawCatalog::default();
        c.alert_windows[1].short = "6h".into();
        assert_eq!(c.validate().unwrap_err().key(), "alert_windows[1].short");

        let mut c = RawCatalog::default();
        c.slos[0].period = "2d".into();
        assert_eq!(c.validate().unwrap_err().key(), "slos[0].period");

        let mut c = RawCatalog::default();
        c.policy[0].action = "halt {modle}".into();
        assert_eq!(c.validate().unwrap_err().key(), "policy[0].action");

        let mut c = RawCatalog::default();
        c.policy[1].when = PolicyWhen::BudgetBelow;
        assert_eq!(c.validate().unwrap_err().key(), "policy[1].percent");
    }

    #[test]
    fn the_counters_of_every_sli_written_by_one_event_are_an_slo_pair_of_the_names() {
        // Throttled time divides seconds of two different events (throttle and autonomy
        // counters), so it is no pair: its rows show refusals of either counter.
        for sli in Catalog::default().slos.iter().map(|s| &s.sli) {
            for c in sli.computations() {
                let Some(bad) = &c.bad else { continue };
                let pair = (c.total.metric, bad.selector().metric);
                match sli {
                    Sli::ThrottledTime { .. } => {
                        assert!(!crate::names::SLO_PAIRS.contains(&pair))
                    }
                    _ => assert!(crate::names::SLO_PAIRS.contains(&pair), "{pair:?}"),
                }
            }
        }
    }

    #[test]
    fn the_deadline_sli_counts_completions_first_and_never_mixes_two_meanings_in_a_computation() {
        let sli = Sli::ControlDeadline {
            loops: vec!["safety".into()],
        };
        let computations = sli.computations();
        let order: Vec<_> = computations.iter().map(|c| c.semantics).collect();
        assert_eq!(
            order,
            [
                Some(Semantics::Completion),
                Some(Semantics::LegacyProbe),
                Some(Semantics::LegacyAgent)
            ]
        );
        let completion = &computations[0];
        assert_eq!(completion.total.metric, metric::CONTROL_ACTIVATIONS);
        assert_eq!(
            completion.bad.as_ref().map(|b| b.selector().metric),
            Some(metric::CONTROL_ACTIVATIONS_MISSED)
        );
        assert!(computations[1].bad.is_none(), "ABI 1: not measured");
        assert_eq!(
            sli.metrics(),
            [
                metric::CONTROL_ACTIVATIONS,
                metric::CONTROL_ACTIVATIONS_MISSED,
                metric::CONTROL_LEGACY_PROBE_ACTIVATIONS,
                metric::CONTROL_CYCLES,
                metric::CONTROL_MISSED,
                metric::CONTROL_LEGACY_AGENT_ACTIVATIONS,
                metric::REFUSED_SAMPLES,
            ]
        );
    }

    #[test]
    fn a_refusal_counts_for_an_slo_when_its_labels_do_not_say_otherwise() {
        let refusal = |pairs: &[(&str, &str)]| {
            let mut labels: crate::Labels = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            labels.insert("__name__".into(), metric::REFUSED_SAMPLES.into());
            Series::new(labels, [(1, 1.0)])
        };
        let sli = Sli::ControlDeadline {
            loops: vec!["safety".into()],
        };
        let missed = metric::CONTROL_MISSED;
        assert!(sli.reads_refused(&refusal(&[("series", missed), ("loop", "safety")])));
        assert!(sli.reads_refused(&refusal(&[("series", missed)])));
        assert!(!sli.reads_refused(&refusal(&[("series", missed), ("loop", "planner")])));
        assert!(!sli.reads_refused(&refusal(&[("series", metric::CONTROL_SKIPPED)])));
        let activations_missed = metric::CONTROL_ACTIVATIONS_MISSED;
        assert!(sli.reads_refused(&refusal(&[("series", activations_missed)])));
        // The activations that only say which semantics fed a row are no counter of the SLI.
        let probe = metric::CONTROL_LEGACY_PROBE_ACTIVATIONS;
        assert!(!sli.reads_refused(&refusal(&[("series", probe)])));
    }

    #[test]
    fn unknown_keys_are_refused_at_every_level() {
        for text in [
            "base_lookbak = \"5m\"",
            "[[slos]]\nname = \"a\"\nobjective_percent = 99.0\nsli = { kind = \"freshness\" }\ntarget = 1",
            "[[slos]]\nname = \"a\"\nobjective_percent = 99.0\nsli = { kind = \"control_deadline\", loops = [\"x\"], loop = \"y\" }",
            "[[slos]]\nname = \"a\"\nobjective_percent = 99.0\nsli = { kind = \"freshness\", limit = \"24h\" }",
            "[[alert_windows]]\nlong = \"1h\"\nshort = \"5m\"\nbudget_percent = 2.0\nseverity = \"page\"\nfor = \"2m\"",
        ] {
            assert!(toml::from_str::<RawCatalog>(text).is_err(), "{text}");
        }
        let parsed: RawCatalog = toml::from_str(
            "[[slos]]\nname = \"a\"\nobjective_percent = 99.0\nsli = { kind = \"control_deadline\", loops = [\"x\"] }",
        )
        .unwrap();
        assert_eq!(parsed.alert_windows, RawCatalog::default().alert_windows);
        assert!(parsed.validate().is_ok());
    }
}

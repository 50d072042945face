//! Series names, label names and the label values both sides match on: the vocabulary of
//! `docs/series.md`, written once. The gateway writes series with these names; the SLO & cost
//! core selects, groups and reports by them.
//!
//! ```text
//! edge_control_cycles_total{machine_id, site, machine_class, loop, model, model_version}
//! └ metric::CONTROL_CYCLES  └ BASE_LABELS ─────────────────┘ └ label::LOOP, MODEL, MODEL_VERSION
//! ```
//!
//! Invariants:
//! - Every series name and label name the gateway writes or the SLO core reads is a constant
//!   here, and nowhere else a literal.
//! - Values never change: a renamed series or label is a new series to every store, and the SLO
//!   core would stop counting the old one.
//! - Machine series (event time) are named `edge_*`; series the gateway derives itself are named
//!   [`metric::GATEWAY_PREFIX`]`*`, and each says which time stamps it.
//! - Series named `*_total` are cumulative counters, read with the increase rule; the others
//!   (the fleet view's backlog, health time, online state and event times) are gauges, read by
//!   their latest value and never with the increase rule.
//! - The two counters of an SLO pair ([`SLO_PAIRS`]) come from one event with the same labels, so
//!   the gateway can check the pair on every event and admit its two series together.
//! - One name, one meaning: deadline counters judged by completion
//!   ([`metric::CONTROL_ACTIVATIONS`], [`metric::CONTROL_ACTIVATIONS_MISSED`]) never share a
//!   name with the overrun counts of agents from before deadline semantics
//!   ([`metric::CONTROL_CYCLES`], [`metric::CONTROL_MISSED`]), so no window mixes the two.

/// Series names.
pub mod metric {
    /// Prefix of the series the gateway derives itself (the freshness counters and the fleet
    /// view's connection and model-version series, stamped with arrival time, and
    /// [`REFUSED_SAMPLES`]); machine series start with `edge_`. They count against no machine's
    /// series budget (`docs/series.md` bounds them apart).
    pub const GATEWAY_PREFIX: &str = "edgewatch_";

    /// Control-loop cycles recorded (`DeadlineCounters.cycles`), per `loop`, `model`,
    /// `model_version`; from every agent. With [`CONTROL_MISSED`], the legacy computation of
    /// the deadline SLI (agents from before deadline semantics).
    pub const CONTROL_CYCLES: &str = "edge_control_cycles_total";
    /// Control-loop execution overruns as agents before deadline semantics counted deadline
    /// misses (`DeadlineCounters.misses`: duration above budget), same labels; from every agent,
    /// with that meaning.
    pub const CONTROL_MISSED: &str = "edge_control_deadline_missed_total";
    /// Control-loop activations skipped (`DeadlineCounters.skipped`), same labels; from every
    /// agent.
    pub const CONTROL_SKIPPED: &str = "edge_control_skipped_total";
    /// Control-loop activations judged against their deadline (`DeadlineCounters.activations`
    /// of events with semantics COMPLETION), same labels: the deadline SLI's total.
    pub const CONTROL_ACTIVATIONS: &str = "edge_control_activations_total";
    /// Of those, the activations that missed their deadline: completed after release + D, or
    /// never ran (`DeadlineCounters.deadline_misses`, semantics COMPLETION), same labels: the
    /// deadline SLI's bad events.
    pub const CONTROL_ACTIVATIONS_MISSED: &str = "edge_control_activations_missed_total";
    /// Execution overruns, duration above budget (`DeadlineCounters.overruns`, semantics
    /// COMPLETION), same labels: a diagnostic, never in an SLI.
    pub const CONTROL_OVERRUNS: &str = "edge_control_overruns_total";
    /// Activations of loops whose agent predates deadline semantics (`cycles + skipped` of
    /// events with semantics UNSPECIFIED), same labels: judged against no deadline. Tells the
    /// SLO core which rows are fed by such agents, and how much.
    pub const CONTROL_LEGACY_AGENT_ACTIVATIONS: &str =
        "edge_control_legacy_agent_activations_total";
    /// Activations of loops whose probe predates deadlines, ABI 1 (`DeadlineCounters.activations`
    /// of events with semantics LEGACY_PROBE), same labels: judged against no deadline, so
    /// their deadline SLI is not measured.
    pub const CONTROL_LEGACY_PROBE_ACTIVATIONS: &str =
        "edge_control_legacy_probe_activations_total";
    /// Safety fallbacks (`SafetyFallback.total`), same labels.
    pub const SAFETY_FALLBACKS: &str = "edge_safety_fallbacks_total";
    /// Interventions (`Intervention.total`), per `model`, `model_version`, `source`.
    pub const INTERVENTIONS: &str = "edge_interventions_total";
    /// Safe stops (`SafeStop.total`), per `model`, `model_version`, `source`.
    pub const SAFE_STOPS: &str = "edge_safe_stops_total";
    /// Thermally throttled seconds (`ThrottleCounters.components[].throttled_seconds`), per
    /// `component`, `model`, `model_version`.
    pub const THROTTLE_SECONDS: &str = "edge_thermal_throttle_seconds_total";
    /// Machine seconds per `mode` (`AutonomySeconds.modes[].seconds`), and `model`,
    /// `model_version`.
    pub const AUTONOMY_SECONDS: &str = "edge_autonomy_seconds_total";
    /// Energy from the power rails, joules (`EnergyCounters.rails[].joules`), per `rail`, `model`,
    /// `model_version`.
    pub const ENERGY_JOULES: &str = "edge_energy_joules_total";
    /// Records the agent's queue lost (`QueueLoss.total`), per `tier`, `cause`.
    pub const QUEUE_LOST_RECORDS: &str = "edge_queue_lost_records_total";
    /// Records waiting in the agent's queue (`AgentHealth.tiers[].records`), per `tier`: a
    /// gauge, the figure as of the health report's event time.
    pub const QUEUE_BACKLOG_RECORDS: &str = "edge_queue_backlog_records";
    /// Bytes waiting in the agent's queue (`AgentHealth.tiers[].bytes`), per `tier`: a gauge.
    pub const QUEUE_BACKLOG_BYTES: &str = "edge_queue_backlog_bytes";
    /// The event time of the health report the backlog comes from, in seconds: a gauge whose
    /// value is its own timestamp, so a reader that gets values only (PromQL `last_over_time`)
    /// knows how old the backlog figures are.
    pub const AGENT_HEALTH_TIMESTAMP: &str = "edge_agent_health_timestamp_seconds";
    /// 1 after the machine's status said online, 0 after it said offline (the MQTT last will the
    /// broker publishes when the link is cut, or the agent's own at a clean stop); timestamp:
    /// arrival. Written at each status message and again, with the state of the last one, by
    /// the machine's batches at most once per [`super::ONLINE_REFRESH_MS`].
    pub const MACHINE_ONLINE: &str = "edgewatch_machine_online";
    /// The newest event time (seconds) of the events received from the machine so far;
    /// timestamp: the arrival that raised it.
    pub const MACHINE_LAST_EVENT: &str = "edgewatch_machine_last_event_timestamp_seconds";
    /// The arrival (seconds) of the machine's latest batch with an event not received before;
    /// timestamp: that arrival (or a millisecond after the machine's previous fleet sample).
    pub const MACHINE_LAST_ARRIVAL: &str = "edgewatch_machine_last_arrival_timestamp_seconds";
    /// The oldest event time (seconds) of the machine's stored counter events under one `model`,
    /// `model_version`; timestamp: the arrival that lowered it.
    pub const MODEL_VERSION_FIRST_EVENT: &str =
        "edgewatch_model_version_first_event_timestamp_seconds";
    /// The newest event time (seconds) of the machine's stored counter events under one `model`,
    /// `model_version`; timestamp: the arrival that raised it.
    pub const MODEL_VERSION_LAST_EVENT: &str =
        "edgewatch_model_version_last_event_timestamp_seconds";
    /// Safety events accepted by the gateway (timestamp: arrival).
    pub const SAFETY_EVENTS_RECEIVED: &str = "edgewatch_safety_events_received_total";
    /// Of those, the ones within the freshness limit of the machine's reconnect (timestamp:
    /// arrival).
    pub const SAFETY_EVENTS_FRESH: &str = "edgewatch_safety_events_fresh_total";
    /// Samples the gateway refused, per refused series and [`super::label::REASON`]: labelled
    /// with the refused series' own labels (as far as they are valid) and its metric name in
    /// [`super::label::SERIES`]. Timestamp: the refused sample's event time (arrival, when that
    /// time is what was wrong). Each refusal is written as a pair, `0` one millisecond before
    /// the count, so the increase rule (and PromQL's, which reads the drop as a reset) sums
    /// refusals over any window whatever order they arrived in.
    pub const REFUSED_SAMPLES: &str = "edgewatch_refused_samples_total";
}

/// Label names.
pub mod label {
    /// The machine (`Batch.machine_id`); a base label.
    pub const MACHINE_ID: &str = "machine_id";
    /// The site (`Batch.site_id`); a base label.
    pub const SITE: &str = "site";
    /// The machine class (`Batch.machine_class`); a base label.
    pub const MACHINE_CLASS: &str = "machine_class";
    /// The model's name (`ModelVersion.name`).
    pub const MODEL: &str = "model";
    /// The model's version (`ModelVersion.version`).
    pub const MODEL_VERSION: &str = "model_version";
    /// The control loop (`LoopRef.loop_name`).
    pub const LOOP: &str = "loop";
    /// The throttled component (see [`super::value::COMPONENTS`]).
    pub const COMPONENT: &str = "component";
    /// The autonomy mode (see [`super::value::MODES`]).
    pub const MODE: &str = "mode";
    /// The power rail.
    pub const RAIL: &str = "rail";
    /// The queue tier (`edgewatch_proto::tier::NAMES`).
    pub const TIER: &str = "tier";
    /// Why queue records were lost.
    pub const CAUSE: &str = "cause";
    /// Why samples were refused (a label of [`super::metric::REFUSED_SAMPLES`], one of
    /// [`super::refusal::REASONS`]).
    pub const REASON: &str = "reason";
    /// The metric name of a refused series (a label of [`super::metric::REFUSED_SAMPLES`]).
    pub const SERIES: &str = "series";
    /// Who counted an intervention or a safe stop (see [`super::value::PROBE`] and
    /// [`super::value::LOCAL`]): each source is a counter of its own.
    pub const SOURCE: &str = "source";
    /// The SLO a recorded series or alert of the generated rules is about (its catalog name).
    pub const SLO: &str = "slo";
    /// Which deadline semantics a recorded series of a deadline SLO computes
    /// (`catalog::Semantics::id`).
    pub const SEMANTICS: &str = "semantics";
}

/// Series and labels Prometheus itself writes, which the dashboards read.
pub mod prometheus {
    /// One series per active alert of the loaded rules, with the alert's labels.
    pub const ALERTS: &str = "ALERTS";
    /// The alert's name, a label of [`ALERTS`].
    pub const ALERTNAME: &str = "alertname";
    /// `pending` or `firing`, a label of [`ALERTS`].
    pub const ALERTSTATE: &str = "alertstate";
    /// The [`ALERTSTATE`] of an alert that fires.
    pub const FIRING: &str = "firing";
}

/// Why the gateway refused samples: the values of [`label::REASON`].
pub mod refusal {
    /// The sample would create a series beyond the machine's series budget.
    pub const SERIES_BUDGET: &str = "series_budget";
    /// An SLO pair's part exceeds its total in one event (misses above cycles).
    pub const BAD_OVER_TOTAL: &str = "bad_over_total";
    /// An increment event's total is zero or below its increment.
    pub const INCREMENT_INCONSISTENT: &str = "increment_inconsistent";
    /// A counter is lower than an earlier sample of the same run (same start time).
    pub const COUNTER_DECREASED: &str = "counter_decreased";
    /// Stamped later than arrival plus the allowed skew.
    pub const FUTURE_TIME: &str = "future_time";
    /// Stamped at or before the Unix epoch, or a counter started after its own event.
    pub const BAD_TIME: &str = "bad_time";
    /// A counter value that is negative, NaN or infinite.
    pub const BAD_VALUE: &str = "bad_value";
    /// A label value that is not an id (or an unknown enum value).
    pub const BAD_LABEL: &str = "bad_label";
    /// Another value is stored at that (series, timestamp).
    pub const CONFLICT: &str = "conflict";
    /// Every reason, for metric exposition.
    pub const REASONS: [&str; 9] = [
        SERIES_BUDGET,
        BAD_OVER_TOTAL,
        INCREMENT_INCONSISTENT,
        COUNTER_DECREASED,
        FUTURE_TIME,
        BAD_TIME,
        BAD_VALUE,
        BAD_LABEL,
        CONFLICT,
    ];
}

/// Label values that the gateway writes and the SLO core matches on.
pub mod value {
    /// The value of `model` and `model_version` when an event names no model, and of any
    /// agent-supplied label left empty.
    pub const UNKNOWN: &str = "unknown";

    /// `component` for `Component::Cpu`.
    pub const CPU: &str = "cpu";
    /// `component` for `Component::Gpu`.
    pub const GPU: &str = "gpu";
    /// `component` for `Component::Soc`.
    pub const SOC: &str = "soc";
    /// Every `component` value.
    pub const COMPONENTS: [&str; 3] = [CPU, GPU, SOC];

    /// `mode` for `AutonomyMode::Autonomous`: its seconds are the denominator of cost per
    /// autonomous machine-hour.
    pub const AUTONOMOUS: &str = "autonomous";
    /// `mode` for `AutonomyMode::Manual`.
    pub const MANUAL: &str = "manual";
    /// `mode` for `AutonomyMode::Teleoperated`.
    pub const TELEOPERATED: &str = "teleoperated";
    /// `mode` for `AutonomyMode::Idle`.
    pub const IDLE: &str = "idle";
    /// Every `mode` value.
    pub const MODES: [&str; 4] = [AUTONOMOUS, MANUAL, TELEOPERATED, IDLE];

    /// `source` of what a control loop's probe counted (`EventSource::Probe`).
    pub const PROBE: &str = "probe";
    /// `source` of what processes submitted over the agent's local socket, counted by the agent
    /// (`EventSource::Local`).
    pub const LOCAL: &str = "local";
}

/// Labels every machine series carries.
pub const BASE_LABELS: [&str; 3] = [label::MACHINE_ID, label::SITE, label::MACHINE_CLASS];

/// SLO pairs `(total, part)`: two counters written together, from one event (or, for the
/// gateway's own freshness counters, in one step), with the same labels, the part never above
/// the total. The gateway refuses an event whose part exceeds its total and admits the two series
/// of a pair together or not at all.
pub const SLO_PAIRS: [(&str, &str); 3] = [
    (
        metric::CONTROL_ACTIVATIONS,
        metric::CONTROL_ACTIVATIONS_MISSED,
    ),
    (metric::CONTROL_CYCLES, metric::CONTROL_MISSED),
    (metric::SAFETY_EVENTS_RECEIVED, metric::SAFETY_EVENTS_FRESH),
];

/// How often (ms of arrival time) a machine's batches re-write its online state
/// ([`metric::MACHINE_ONLINE`]) when no status message changed it: a machine connected for
/// months still has a sample within any lookback longer than this.
pub const ONLINE_REFRESH_MS: i64 = 3_600_000;

/// Labels an SLO is reported by, in this order. A missing label counts as `""`, as in PromQL.
pub const GROUP_LABELS: [&str; 4] = [
    label::MACHINE_CLASS,
    label::SITE,
    label::MODEL,
    label::MODEL_VERSION,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_series_and_gateway_series_are_told_apart_by_their_prefix() {
        let machine = [
            metric::CONTROL_CYCLES,
            metric::CONTROL_MISSED,
            metric::CONTROL_SKIPPED,
            metric::CONTROL_ACTIVATIONS,
            metric::CONTROL_ACTIVATIONS_MISSED,
            metric::CONTROL_OVERRUNS,
            metric::CONTROL_LEGACY_AGENT_ACTIVATIONS,
            metric::CONTROL_LEGACY_PROBE_ACTIVATIONS,
            metric::SAFETY_FALLBACKS,
            metric::INTERVENTIONS,
            metric::SAFE_STOPS,
            metric::THROTTLE_SECONDS,
            metric::AUTONOMY_SECONDS,
            metric::ENERGY_JOULES,
            metric::QUEUE_LOST_RECORDS,
            metric::QUEUE_BACKLOG_RECORDS,
            metric::QUEUE_BACKLOG_BYTES,
            metric::AGENT_HEALTH_TIMESTAMP,
        ];
        for name in machine {
            assert!(name.starts_with("edge_") && !name.starts_with(metric::GATEWAY_PREFIX));
        }
        for name in [
            metric::SAFETY_EVENTS_RECEIVED,
            metric::SAFETY_EVENTS_FRESH,
            metric::REFUSED_SAMPLES,
            metric::MACHINE_ONLINE,
            metric::MACHINE_LAST_EVENT,
            metric::MACHINE_LAST_ARRIVAL,
            metric::MODEL_VERSION_FIRST_EVENT,
            metric::MODEL_VERSION_LAST_EVENT,
        ] {
            assert!(name.starts_with(metric::GATEWAY_PREFIX));
        }
    }

    #[test]
    fn refusal_reasons_are_distinct_label_values() {
        let mut reasons = refusal::REASONS.to_vec();
        reasons.sort_unstable();
        reasons.dedup();
        assert_eq!(reasons.len(), refusal::REASONS.len());
        assert!(
            reasons
                .iter()
                .all(|r| r.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        );
    }
}

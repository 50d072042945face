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
//! - Machine series (event time) are named `edge_*`; series the gateway derives itself (arrival
//!   time) are named [`metric::GATEWAY_PREFIX`]`*`.

/// Series names.
pub mod metric {
    /// Prefix of the series the gateway derives itself (stamped with arrival time); machine
    /// series start with `edge_`.
    pub const GATEWAY_PREFIX: &str = "edgewatch_";

    /// Control-loop cycles (`DeadlineCounters.cycles`), per `loop`, `model`, `model_version`.
    pub const CONTROL_CYCLES: &str = "edge_control_cycles_total";
    /// Control-loop deadline misses (`DeadlineCounters.misses`), same labels.
    pub const CONTROL_MISSED: &str = "edge_control_deadline_missed_total";
    /// Control-loop cycles skipped (`DeadlineCounters.skipped`), same labels.
    pub const CONTROL_SKIPPED: &str = "edge_control_skipped_total";
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
    /// Safety events accepted by the gateway (timestamp: arrival).
    pub const SAFETY_EVENTS_RECEIVED: &str = "edgewatch_safety_events_received_total";
    /// Of those, the ones within the freshness limit of the machine's reconnect (timestamp:
    /// arrival).
    pub const SAFETY_EVENTS_FRESH: &str = "edgewatch_safety_events_fresh_total";
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
    /// Who counted an intervention or a safe stop (see [`super::value::PROBE`] and
    /// [`super::value::LOCAL`]): each source is a counter of its own.
    pub const SOURCE: &str = "source";
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
            metric::SAFETY_FALLBACKS,
            metric::INTERVENTIONS,
            metric::SAFE_STOPS,
            metric::THROTTLE_SECONDS,
            metric::AUTONOMY_SECONDS,
            metric::ENERGY_JOULES,
            metric::QUEUE_LOST_RECORDS,
        ];
        for name in machine {
            assert!(name.starts_with("edge_") && !name.starts_with(metric::GATEWAY_PREFIX));
        }
        for name in [metric::SAFETY_EVENTS_RECEIVED, metric::SAFETY_EVENTS_FRESH] {
            assert!(name.starts_with(metric::GATEWAY_PREFIX));
        }
    }
}

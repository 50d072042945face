//! What a run did, written as `demo-summary.json`: the timeline as it happened, what each control
//! loop injected (its own JSON summary), what each agent said last, and the gateway's counters.
//! The end-to-end test compares the report with it.
//!
//! Invariants:
//! - Loop numbers are the loops' own tallies, never derived from what the pipeline delivered.
//! - Times are Unix milliseconds (wall clock), the same clock the agents stamp events with.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::fleet::{AgentCounts, GatewayCounts, LoopSummary};
use crate::scenario::Role;

/// One machine's part of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineSummary {
    /// Machine id.
    pub id: String,
    /// Machine class.
    pub class: String,
    /// Site.
    pub site: String,
    /// Model name.
    pub model: String,
    /// Model version.
    pub model_version: String,
    /// What it showed.
    pub role: Role,
    /// The capture its agent replayed.
    pub capture: String,
    /// What its control loop injected.
    pub injected: LoopSummary,
    /// Its agent's counters after the drain, before it stopped.
    pub agent: AgentCounts,
}

/// The partition as it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionSummary {
    /// The machine cut off.
    pub machine: String,
    /// When its link was blackholed.
    pub start_unix_ms: i64,
    /// When it was healed.
    pub heal_unix_ms: i64,
    /// Most records waiting in its queue during the partition.
    pub peak_backlog: u64,
    /// Its agent's connection losses by the end of the run.
    pub disconnects: u64,
}

/// The heat wave as it happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeatSummary {
    /// The machine heated.
    pub machine: String,
    /// When its GPU zone went past the trip point.
    pub start_unix_ms: i64,
    /// When it cooled down.
    pub end_unix_ms: i64,
}

/// The agent restart the demo injected: one machine's agent stopped mid-run and started again on
/// the same configuration and queue, while its control loop kept running.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RestartSummary {
    /// The machine.
    pub machine: String,
    /// How its agent was stopped (`SIGKILL`).
    pub signal: String,
    /// When it was stopped (and reaped): nothing it stamped is later.
    pub killed_unix_ms: i64,
    /// When it was started again: nothing the new agent stamps is earlier.
    pub restarted_unix_ms: i64,
}

/// Seconds spent in each part of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Building (or checking) the binaries.
    pub build_s: f64,
    /// Broker, gateway and agents up.
    pub setup_s: f64,
    /// Control loops running.
    pub run_s: f64,
    /// Waiting for every queued event to reach the store.
    pub drain_s: f64,
    /// Stopping, report and FOCUS export.
    pub report_s: f64,
    /// Everything.
    pub total_s: f64,
}

/// The whole run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemoSummary {
    /// The output directory.
    pub out_dir: PathBuf,
    /// How long the control loops ran, seconds.
    pub duration_s: f64,
    /// When the loops started.
    pub loops_started_unix_ms: i64,
    /// When the last loop exited.
    pub loops_ended_unix_ms: i64,
    /// The machines.
    pub machines: Vec<MachineSummary>,
    /// The partition.
    pub partition: PartitionSummary,
    /// The heat wave.
    pub heat: HeatSummary,
    /// The agent restart.
    pub restart: RestartSummary,
    /// Every event the agents had queued when the loops ended reached the gateway's store.
    pub drained: bool,
    /// The gateway's counters at the end.
    pub gateway: GatewayCounts,
    /// `--from` of the report's cost period (UTC day).
    pub report_from: String,
    /// `--to` of the report's cost period (UTC day, exclusive).
    pub report_to: String,
    /// Evaluation time of the report (`--at`).
    pub report_at: String,
    /// Where the time went.
    pub timings: Timings,
}

//! The edgewatch agent: runs on a machine's Jetson beside the control loops, samples them and the
//! computer's health, keeps events in a durable priority queue, and drains it over MQTT.
//!
//! Layout:
//! - [`config`]: the TOML configuration, raw then validated.
//! - [`placement`]: cores, SCHED_IDLE and the idle I/O class.
//! - [`run`]: the daemon: one current-thread runtime running every task.
//! - [`uplink`]: MQTT v5 drain, safety first, deletion only on PUBACK.
//! - [`ingest`]: the local Unix socket for other processes' events, and `emit`.
//! - [`status`]: the status file `run` writes and `status` reads.
//! - [`health`]: the agent's own health, sent upstream as `AgentHealth` events.
//! - [`pacing`]: token buckets.
//! - [`systemd`]: READY/WATCHDOG notifications.
//!
//! Invariants:
//! - The agent never shares a core with a control loop and never takes a lock a loop could wait
//!   on: it reads probes through read-only mappings.
//! - Nothing is lost silently: a record leaves the queue on a broker acknowledgement or as a
//!   counted, reported loss.

pub mod config;
pub mod health;
pub mod ingest;
pub mod pacing;
pub mod placement;
pub mod run;
pub mod status;
pub mod systemd;
pub mod ticker;
pub mod uplink;

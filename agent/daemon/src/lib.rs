//! The edgewatch agent: runs on a machine's Jetson beside the control loops, samples them and the
//! computer's health, keeps events in a durable priority queue, and drains it over MQTT.
//!
//! Layout:
//! - [`config`]: the TOML configuration, raw then validated.
//! - [`placement`]: cores, SCHED_IDLE and the idle I/O class.
//! - [`run`]: the daemon's wiring: one current-thread runtime running the tasks below.
//! - [`spool`]: the one handle on the queue, the group-commit flusher, the samplers' sink and the
//!   one "records are durable" signal.
//! - [`sampling`]: the sampling loop (probes, model, sysfs, tegrastats) and its source statuses.
//! - [`degraded`]: what the agent reports while the queue's store cannot be opened or written
//!   (status file section, one safety-tier health report per fault); the queue holds safety
//!   events and retries meanwhile.
//! - [`compaction`]: compacts the queue file after a backlog, copying on a blocking thread.
//! - [`drain`]: empties the queue over MQTT v5 (the `[uplink]` section), safety first, deletion
//!   only on a success PUBACK in the same queue epoch; its decisions are a sans-IO core
//!   (`drain::core`), rumqttc runs in a shell that only moves bytes (`drain::link`).
//! - [`ingest`]: the local Unix socket for other processes' events, and `emit`.
//! - [`status`]: the status file the agent writes every second and `status` reads.
//! - [`health`]: the agent's own health, sent upstream as `AgentHealth` events.
//! - [`clock`]: the agent's one clock: wall and monotonic time, the sampling loop's tick.
//! - [`pacing`]: token buckets.
//! - [`systemd`]: READY/WATCHDOG notifications.
//!
//! Module dependencies point one way: `run` imports the tasks (`sampling`, `drain`, `ingest`,
//! `status`, `health`, `compaction`); they import `spool`, `clock`, `config` and `pacing`, and
//! `status`, `health` and `sampling` also read the types of the tasks they report on (`status`
//! and `health` read `degraded`, which imports only `clock`). Nothing imports `run`.
//!
//! Invariants:
//! - The agent never shares a core with a control loop and never takes a lock a loop could wait
//!   on: it reads probes through read-only mappings.
//! - Nothing is lost silently: a record leaves the queue on a broker acknowledgement or as a
//!   counted, reported loss.

pub mod clock;
pub mod compaction;
pub mod config;
pub mod degraded;
pub mod drain;
pub mod health;
pub mod ingest;
pub mod pacing;
pub mod placement;
pub mod run;
pub mod sampling;
pub mod spool;
pub mod status;
pub mod systemd;

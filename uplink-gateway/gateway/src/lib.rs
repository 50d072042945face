//! The edgewatch uplink gateway: MQTT batches in, event-time series out.
//!
//! Layout (the ingest path first, then the I/O shell):
//! - [`config`]: the TOML file, raw then validated (units in types; errors name the key).
//! - [`validate`]: topic identity, framing limits, schema version, identity agreement (pure).
//! - [`dedup`]: received sequence ranges per `(machine, epoch, tier)`, bounded (pure).
//! - [`series`]: an event → its cumulative counter samples per `docs/series.md` with their
//!   baselines, or its refusal with a reason (pure).
//! - [`store`]: the embedded redb store (samples, series and the live ones per machine, dedup
//!   state, dead letters, outbox) and its query API for raw samples.
//! - [`ingest`]: a group of messages → validate → dedup → normalize → admit (conflicts, runs,
//!   series budget and retirement) → one store transaction, refusals written as a series, and
//!   each machine's fleet series (online state, last event and arrival, model versions).
//! - [`remote_write`]: Prometheus remote-write 1.0 types, request building, response
//!   classification, blocking sender.
//! - [`prometheus`]: reading raw samples back from a Prometheus HTTP query API.
//! - [`source`]: raw samples for reports and the fleet view from either source, as the SLO
//!   core's series set; the SLO and cost reports' one code path.
//! - [`http`]: the one HTTP/1.1 request reader and response writer of the read-only endpoints.
//! - [`metrics`]: the gateway's own counters and the `/metrics` HTTP endpoint.
//! - [`page`]: the fleet page: reports rendered to HTML (pure views, one escaping function), served
//!   read-only with a strict Content-Security-Policy.
//! - [`run`]: the MQTT v5 session with manual acknowledgements around the ingest path, serving
//!   `/metrics` and the fleet page beside it.
//!
//! Invariants:
//! - A message is acknowledged to the broker only after its effects are committed (see [`run`]).
//! - No payload makes the ingest path panic (proptest in `tests/`, fuzz target in `fuzz/`).
//! - The pure modules (`validate`, `dedup`, `series`) read no clock and do no I/O.

pub mod config;
pub mod dedup;
pub mod http;
pub mod ingest;
pub mod metrics;
pub mod page;
pub mod prometheus;
pub mod remote_write;
pub mod run;
pub mod series;
pub mod source;
pub mod store;
pub mod validate;

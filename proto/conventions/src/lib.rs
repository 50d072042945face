//! The rules the agent and the gateway share besides the wire format, each written once.
//!
//! Layout:
//! - [`duration`]: the one duration grammar of every configuration file (`"30s"`, `"10ms"`,
//!   `"30d"`), with bounds per key.
//! - [`config`]: the configuration convention: a `RawX` read by serde, validated by `X::from_raw`
//!   into one error shape that names the key; the exit status for bad configuration.
//! - [`backoff`]: exponential backoff with jitter, for every reconnect and retry.
//!
//! Invariants:
//! - Pure: no I/O, no clock, no global state; randomness comes from the caller.
//! - Nothing here describes bytes on the network: that is `edgewatch-proto`'s alone.

pub mod backoff;
pub mod config;
pub mod duration;

//! The `edgewatch.v1` wire format: the one contract between thousands of machines and the cloud.
//!
//! Layout:
//! - [`v1`]: the protobuf messages, generated from `proto/edgewatch/v1/*.proto` and checked in
//!   (`tests/generated_code.rs` regenerates them and fails on a difference), so no build needs
//!   `protoc`.
//! - [`framing`]: one MQTT payload = one [`v1::Batch`], protobuf-encoded then zstd-compressed,
//!   with hard limits. Decoding hostile input returns a typed error and never allocates past them.
//! - [`topic`]: topic names `edgewatch/v1/<site>/<machine>/<tier|status>` and identity rules.
//! - [`tier`]: tier order, index and name ([`tier::TIERS`], [`tier::index`], [`tier::name`]) and
//!   [`tier::PerTier`], for every table that maps a tier to a position or a word.
//!
//! Invariants:
//! - Field numbers are never reused; removed fields are `reserved` (see `docs/wire-protocol.md`).
//! - A reader accepts only [`SCHEMA_VERSION`]; unknown fields are skipped, never an error.

pub mod framing;
pub mod tier;
pub mod topic;

/// Messages of the `edgewatch.v1` protobuf package.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    include!("generated/edgewatch.v1.rs");
}

/// The `schema_version` every `edgewatch.v1` batch and status message carries.
pub const SCHEMA_VERSION: u32 = 1;

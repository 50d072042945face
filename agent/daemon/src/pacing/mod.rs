//! Pacing: how fast the agent may reconnect, send and accept.

pub mod backoff;
pub mod token_bucket;

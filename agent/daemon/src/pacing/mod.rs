//! Pacing: how fast the agent may send and accept.

pub mod token_bucket;

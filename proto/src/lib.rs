//! The `edgewatch.v1` wire format shared by the agent and the gateway.

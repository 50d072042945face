//! An embedded rumqttd broker, in-process, on an ephemeral loopback port (MQTT v5 and v3.1.1).
//!
//! rumqttd has no shutdown API: the broker's threads live until the process exits. Tests use one
//! per test; the all-in-one demo uses one for its whole run. State is memory-only.

use std::net::SocketAddr;
use std::time::Duration;

use crate::net::{free_port, loopback, wait_for_listener};
use crate::{HarnessError, Result};

/// A running embedded broker.
pub struct EmbeddedBroker {
    v5_port: u16,
    v4_port: u16,
}

/// Largest payload the embedded broker accepts, in bytes (matches the Mosquitto harness).
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

impl EmbeddedBroker {
    /// Starts a broker with a v5 and a v3.1.1 listener on loopback.
    pub fn start() -> Result<Self> {
        let v5_port = free_port()?;
        let v4_port = free_port()?;
        let config: rumqttd::Config = toml::from_str(&config_toml(v5_port, v4_port))
            .map_err(|error| HarnessError::Config(error.to_string()))?;
        let mut broker = rumqttd::Broker::new(config);
        std::thread::Builder::new()
            .name("embedded-rumqttd".into())
            .spawn(move || {
                if let Err(error) = broker.start() {
                    tracing::error!(%error, "The embedded broker stopped.");
                }
            })
            .map_err(HarnessError::io("spawning the embedded broker thread"))?;
        for port in [v5_port, v4_port] {
            if !wait_for_listener(loopback(port), Duration::from_secs(10)) {
                return Err(HarnessError::NotReady {
                    what: format!("embedded rumqttd on 127.0.0.1:{port}"),
                    seconds: 10,
                    detail: String::new(),
                });
            }
        }
        Ok(Self { v5_port, v4_port })
    }

    /// Address of the MQTT v5 listener.
    pub fn addr(&self) -> SocketAddr {
        loopback(self.v5_port)
    }

    /// Port of the MQTT v5 listener.
    pub fn port(&self) -> u16 {
        self.v5_port
    }

    /// Address of the MQTT v3.1.1 listener.
    pub fn v4_addr(&self) -> SocketAddr {
        loopback(self.v4_port)
    }
}

fn config_toml(v5_port: u16, v4_port: u16) -> String {
    let connections = format!(
        "connection_timeout_ms = 60000\nmax_payload_size = {MAX_PAYLOAD_BYTES}\nmax_inflight_count = 100\ndynamic_filters = true\n"
    );
    format!(
        r#"id = 0

[router]
id = 0
max_connections = 10010
max_outgoing_packet_count = 200
max_segment_size = 104857600
max_segment_count = 10

[v5.1]
name = "v5-1"
listen = "127.0.0.1:{v5_port}"
next_connection_delay_ms = 1
[v5.1.connections]
{connections}
[v4.1]
name = "v4-1"
listen = "127.0.0.1:{v4_port}"
next_connection_delay_ms = 1
[v4.1.connections]
{connections}"#
    )
}

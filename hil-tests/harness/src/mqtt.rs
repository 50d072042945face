//! MQTT v5 client helpers for tests: options, TLS transport, and waiting for events.

use std::net::SocketAddr;
use std::sync::Once;
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use rumqttc::{TlsConfiguration, Transport};

use crate::pki::Identity;

/// Client options for `addr`: clean start, 5 s keepalive, 1 MiB packets both ways.
pub fn options(client_id: &str, addr: SocketAddr) -> MqttOptions {
    let mut options = MqttOptions::new(client_id, addr.ip().to_string(), addr.port());
    options.set_keep_alive(Duration::from_secs(5));
    options.set_clean_start(true);
    options.set_max_packet_size(Some(1024 * 1024));
    options
}

/// Installs the process-wide rustls crypto provider (ring) once.
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// mTLS transport trusting `ca_pem` and presenting `identity`.
pub fn tls_transport(ca_pem: &str, identity: &Identity) -> Transport {
    install_crypto_provider();
    Transport::Tls(TlsConfiguration::Simple {
        ca: ca_pem.as_bytes().to_vec(),
        alpn: None,
        client_auth: Some((
            identity.cert_pem.as_bytes().to_vec(),
            identity.key_pem.as_bytes().to_vec(),
        )),
    })
}

/// A client and its event loop.
pub fn connect(options: MqttOptions) -> (AsyncClient, EventLoop) {
    AsyncClient::new(options, 64)
}

/// Polls `events` until `pick` returns something, an error occurs, or `timeout` passes.
/// Errors are returned to the caller as `Err` with the error text.
pub async fn poll_until<T>(
    events: &mut EventLoop,
    timeout: Duration,
    mut pick: impl FnMut(&Event) -> Option<T>,
) -> Result<Option<T>, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let event = tokio::select! {
            event = events.poll() => event,
            () = tokio::time::sleep_until(deadline) => return Ok(None),
        };
        match event {
            Ok(event) => {
                if let Some(found) = pick(&event) {
                    return Ok(Some(found));
                }
            }
            Err(error) => return Err(error.to_string()),
        }
    }
}

/// Polls until the CONNACK arrives.
pub async fn wait_connected(events: &mut EventLoop, timeout: Duration) -> Result<(), String> {
    match poll_until(events, timeout, |event| {
        matches!(event, Event::Incoming(Packet::ConnAck(_))).then_some(())
    })
    .await?
    {
        Some(()) => Ok(()),
        None => Err("no CONNACK in time".into()),
    }
}

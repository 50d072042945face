//! systemd service notifications (`sd_notify`): READY once serving, WATCHDOG while healthy,
//! STOPPING on shutdown. A datagram to `$NOTIFY_SOCKET`; nothing happens outside systemd.
//!
//! Invariants:
//! - Never blocks and never fails the agent: a lost notification is logged, not fatal.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Where notifications go, if the agent runs under systemd with `Type=notify`.
#[derive(Debug)]
pub struct Notifier {
    socket: Option<(UnixDatagram, std::path::PathBuf)>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET` and `$WATCHDOG_USEC` (only when `$WATCHDOG_PID` is ours or unset).
    pub fn from_env() -> Self {
        let socket = std::env::var_os("NOTIFY_SOCKET")
            .filter(|path| {
                // Abstract sockets ("@name") are not supported by std's path API; systemd uses
                // a filesystem path unless configured otherwise.
                !path.to_string_lossy().starts_with('@')
            })
            .and_then(|path| {
                UnixDatagram::unbound()
                    .ok()
                    .map(|socket| (socket, path.into()))
            });
        let ours = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_none_or(|pid| pid == std::process::id());
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|usec| usec.parse::<u64>().ok())
            .filter(|&usec| ours && usec > 0)
            .map(Duration::from_micros);
        Self { socket, watchdog }
    }

    /// How often to send WATCHDOG=1 (half the configured timeout), if systemd asked for it.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog.map(|timeout| timeout / 2)
    }

    fn send(&self, message: &str) {
        if let Some((socket, path)) = &self.socket
            && let Err(error) = socket.send_to(message.as_bytes(), path)
        {
            tracing::warn!(%error, message, "A systemd notification could not be sent.");
        }
    }

    /// The agent is serving.
    pub fn ready(&self) {
        self.send("READY=1\nSTATUS=serving");
    }

    /// The agent is healthy.
    pub fn watchdog(&self) {
        self.send("WATCHDOG=1");
    }

    /// The agent is shutting down.
    pub fn stopping(&self) {
        self.send("STOPPING=1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_reach_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier {
            socket: Some((UnixDatagram::unbound().unwrap(), path)),
            watchdog: Some(Duration::from_secs(30)),
        };
        notifier.ready();
        notifier.watchdog();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"WATCHDOG=1");
        assert_eq!(notifier.watchdog_interval(), Some(Duration::from_secs(15)));
    }
}

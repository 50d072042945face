//! Ephemeral loopback ports and readiness waits.
//!
//! A port is found by binding `127.0.0.1:0` and releasing it; another process could take it before
//! the component binds it, so starters retry a few times on a bind failure.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::{HarnessError, Result};

/// A loopback port that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(HarnessError::io("binding an ephemeral port"))?;
    let port = listener
        .local_addr()
        .map_err(HarnessError::io("reading the ephemeral port"))?
        .port();
    Ok(port)
}

/// Loopback address for a port.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Waits until something accepts TCP connections on `addr`, or `timeout` passes.
pub fn wait_for_listener(addr: SocketAddr, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Finds a program: `$env` if set, else `$PATH`, else `/usr/sbin` and `/usr/bin`.
pub(crate) fn find_program(
    program: &'static str,
    env: &'static str,
    package: &'static str,
) -> Result<std::path::PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Ok(path.into());
    }
    let path_dirs = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_dirs)
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .ok_or(HarnessError::MissingProgram {
            program,
            env,
            package,
        })
}

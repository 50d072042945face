//! A fault-injecting TCP proxy between a client (the agent) and a server (the broker).
//!
//! Faults, switchable while connections are open:
//! - [`Fault::Pass`]: bytes flow unchanged.
//! - [`Fault::Blackhole`]: nothing is forwarded and nothing is reset, like a dead radio link: bytes
//!   wait in socket buffers, new connections are accepted but never reach the server. When the fault
//!   ends, held bytes flow on (as TCP retransmission would deliver them), unless the client gave up.
//! - [`Fault::Reset`]: every open connection is reset (RST), and so is every new one.
//! - [`Fault::Delay`]: each chunk is held for a fixed time before it is forwarded.
//! - [`Fault::Throttle`]: each direction is limited to a byte rate shared by all connections.
//!
//! Invariants:
//! - The proxy never alters, reorders or invents bytes; it only holds, delays, or resets.
//! - Byte counters count bytes actually written to the other side.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

use crate::{HarnessError, Result};

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything unchanged.
    Pass,
    /// Forward nothing, reset nothing.
    Blackhole,
    /// Reset every connection, open or new.
    Reset,
    /// Hold each chunk this long before forwarding it.
    Delay(Duration),
    /// Limit each direction to this many bytes per second.
    Throttle {
        /// Rate limit per direction, shared by all connections.
        bytes_per_second: u64,
    },
}

/// Counters of what crossed the proxy.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Bytes written to the server (client → server).
    pub bytes_upstream: AtomicU64,
    /// Bytes written to the client (server → client).
    pub bytes_downstream: AtomicU64,
    /// Connections accepted.
    pub connections_accepted: AtomicU64,
    /// Connections currently open.
    pub connections_open: AtomicU64,
}

/// A running proxy. Dropping it stops it and resets its connections.
pub struct FaultProxy {
    listen: SocketAddr,
    fault: watch::Sender<Fault>,
    reset_generation: watch::Sender<u64>,
    stats: Arc<ProxyStats>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy on an ephemeral loopback port, forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> Result<Self> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")
            .map_err(HarnessError::io("binding the proxy listener"))?;
        std_listener
            .set_nonblocking(true)
            .map_err(HarnessError::io("configuring the proxy listener"))?;
        let listen = std_listener
            .local_addr()
            .map_err(HarnessError::io("reading the proxy address"))?;
        let (fault, fault_rx) = watch::channel(Fault::Pass);
        let (reset_generation, reset_rx) = watch::channel(0u64);
        let stats = Arc::new(ProxyStats::default());
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(HarnessError::io("building the proxy runtime"))?;
        let thread_stats = Arc::clone(&stats);
        let thread = std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(std_listener) else {
                        return;
                    };
                    let shared = Shared {
                        upstream,
                        fault: fault_rx,
                        reset: reset_rx,
                        stats: thread_stats,
                        up_bucket: Arc::new(Mutex::new(None)),
                        down_bucket: Arc::new(Mutex::new(None)),
                    };
                    tokio::select! {
                        () = accept_loop(listener, shared) => {}
                        _ = shutdown_rx => {}
                    }
                });
            })
            .map_err(HarnessError::io("spawning the proxy thread"))?;
        Ok(Self {
            listen,
            fault,
            reset_generation,
            stats,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.listen
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.listen.port()
    }

    /// Switches the fault; open connections follow at once.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// Resets every open connection once; new connections are unaffected.
    pub fn reset_open_connections(&self) {
        self.reset_generation
            .send_modify(|generation| *generation += 1);
    }

    /// Ends a long partition: connections that lived through it are reset (as TCP connections
    /// whose peers gave up would be) without delivering the bytes they held, then traffic passes.
    pub fn heal_with_reset(&self) {
        self.reset_open_connections();
        self.set(Fault::Pass);
    }

    /// Counters of what crossed the proxy.
    pub fn stats(&self) -> &ProxyStats {
        &self.stats
    }

    /// Bytes written to the server so far.
    pub fn bytes_upstream(&self) -> u64 {
        self.stats.bytes_upstream.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Earliest time the next byte may pass in one direction while throttled.
type Bucket = Arc<Mutex<Option<Instant>>>;

#[derive(Clone)]
struct Shared {
    upstream: SocketAddr,
    fault: watch::Receiver<Fault>,
    reset: watch::Receiver<u64>,
    stats: Arc<ProxyStats>,
    up_bucket: Bucket,
    down_bucket: Bucket,
}

async fn accept_loop(listener: TcpListener, shared: Shared) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared
            .stats
            .connections_accepted
            .fetch_add(1, Ordering::Relaxed);
        let shared = shared.clone();
        tokio::spawn(async move {
            shared
                .stats
                .connections_open
                .fetch_add(1, Ordering::Relaxed);
            serve(client, shared.clone()).await;
            shared
                .stats
                .connections_open
                .fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Why a pump stopped.
enum PumpEnd {
    /// The source closed cleanly; the other direction may go on.
    Eof,
    /// Reset requested, or an I/O error: tear the connection down.
    Abort,
}

async fn serve(client: TcpStream, shared: Shared) {
    // Linger 0: dropping a socket sends RST, which is how faults and errors tear connections down.
    let _ = client.set_zero_linger();
    let mut fault = shared.fault.clone();
    let mut reset = shared.reset.clone();
    reset.borrow_and_update();
    if !wait_until_flowing(&mut fault).await {
        return;
    }
    let server = tokio::select! {
        server = TcpStream::connect(shared.upstream) => server,
        _ = reset.changed() => return,
    };
    let Ok(server) = server else { return };
    let _ = server.set_zero_linger();
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(
        client_read,
        server_write,
        shared.fault.clone(),
        Arc::clone(&shared.up_bucket),
        Arc::clone(&shared.stats),
        true,
    );
    let down = pump(
        server_read,
        client_write,
        shared.fault.clone(),
        Arc::clone(&shared.down_bucket),
        Arc::clone(&shared.stats),
        false,
    );
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    while !(up_done && down_done) {
        tokio::select! {
            // A reset wins over bytes a heal released in the same instant.
            biased;
            _ = reset.changed() => return,
            end = &mut up, if !up_done => match end {
                PumpEnd::Eof => up_done = true,
                PumpEnd::Abort => return,
            },
            end = &mut down, if !down_done => match end {
                PumpEnd::Eof => down_done = true,
                PumpEnd::Abort => return,
            },
        }
    }
}

/// Waits while the fault is a blackhole. False when the connection must be reset instead.
async fn wait_until_flowing(fault: &mut watch::Receiver<Fault>) -> bool {
    loop {
        match *fault.borrow_and_update() {
            Fault::Reset => return false,
            Fault::Blackhole => {}
            Fault::Pass | Fault::Delay(_) | Fault::Throttle { .. } => return true,
        }
        if fault.changed().await.is_err() {
            return false;
        }
    }
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
    bucket: Bucket,
    stats: Arc<ProxyStats>,
    upstream: bool,
) -> PumpEnd {
    let mut buf = vec![0u8; 16 * 1024];
    let counter = if upstream {
        &stats.bytes_upstream
    } else {
        &stats.bytes_downstream
    };
    loop {
        if !wait_until_flowing(&mut fault).await {
            return PumpEnd::Abort;
        }
        let limit = match *fault.borrow() {
            // Small reads keep a throttled stream smooth (about 20 chunks a second).
            Fault::Throttle { bytes_per_second } => {
                usize::try_from(bytes_per_second / 20).map_or(buf.len(), |n| n.clamp(1, buf.len()))
            }
            _ => buf.len(),
        };
        let read = tokio::select! {
            read = from.read(&mut buf[..limit]) => read,
            // Reads are cancel-safe: nothing is lost by re-checking the fault.
            changed = fault.changed() => {
                if changed.is_err() {
                    return PumpEnd::Abort;
                }
                continue;
            }
        };
        let n = match read {
            Ok(0) => {
                let _ = to.shutdown().await;
                return PumpEnd::Eof;
            }
            Ok(n) => n,
            Err(_) => return PumpEnd::Abort,
        };
        let current = *fault.borrow();
        match current {
            Fault::Delay(delay) => tokio::time::sleep(delay).await,
            Fault::Throttle { bytes_per_second } => {
                let wait_until = reserve(&bucket, n, bytes_per_second).await;
                tokio::time::sleep_until(wait_until).await;
            }
            Fault::Pass | Fault::Blackhole | Fault::Reset => {}
        }
        // A blackhole that began meanwhile holds these bytes too.
        if !wait_until_flowing(&mut fault).await {
            return PumpEnd::Abort;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return PumpEnd::Abort;
        }
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Reserves transmission time for `n` bytes at `rate`; returns when they may be written.
async fn reserve(bucket: &Bucket, n: usize, rate: u64) -> Instant {
    let rate = rate.max(1);
    let cost = Duration::from_secs_f64(n as f64 / rate as f64);
    let mut next_free = bucket.lock().await;
    let now = Instant::now();
    let start = next_free.map_or(now, |free| free.max(now));
    *next_free = Some(start + cost);
    start + cost
}

//! The `run` service: the I/O shell around the ingest path. An MQTT v5 session (rumqttc, manual
//! acknowledgements) feeds groups of messages to [`Ingestor::ingest`]; after the group's store
//! transaction commits (and, with remote-write, after its outbox is delivered or dead-lettered),
//! the messages are acknowledged to the broker.
//!
//! Invariants:
//! - A message is acknowledged only after everything it caused is durable in the embedded store
//!   and, when remote-write is configured, after the remote-write requests of its group were
//!   accepted by the sink or refused for good (and then dead-lettered). A crash at any point
//!   before the acknowledgement means redelivery (persistent session, stable client id), and
//!   redelivery is harmless: de-duplication drops what was committed, and a committed but
//!   undelivered remote-write request is still in the outbox, delivered first at start-up.
//! - The session is persistent (`clean_start = false`, a session expiry), so the broker keeps this
//!   instance's unacknowledged and queued messages while it is away.
//! - At most `receive_maximum` messages are unacknowledged at once (announced to the broker), which
//!   bounds the messages held in memory; one group commit covers at most that many.
//! - Connection errors are followed by a capped, jittered backoff; the loop never spins.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use edgewatch_conventions::backoff::{Backoff, Jitter};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use rumqttc::{Outgoing, TlsConfiguration, Transport};
use tokio::sync::{mpsc, watch};

use crate::config::{Config, MqttConfig};
use crate::ingest::{Incoming, Ingestor};
use crate::metrics::Metrics;
use crate::remote_write::{RemoteWriter, SendError, SendStats};
use crate::store::{DeadLetter, DeadLetterSource, Store, StoreError};

/// Why the service stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The store could not be opened or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The zstd decoder could not start.
    #[error("the batch decoder could not start: {0}")]
    Decoder(#[from] edgewatch_proto::framing::DecodeError),
    /// A TLS file could not be read.
    #[error("reading {path}: {source}")]
    TlsFile {
        /// File.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The metrics listener could not be bound.
    #[error("binding the metrics endpoint {addr}: {source}")]
    MetricsBind {
        /// Address.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The fleet page's listener could not be bound.
    #[error("binding the fleet page {addr} (http.listen): {source}")]
    PageBind {
        /// Address.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// Shutdown was requested while a remote-write request was still being retried; it stays in
    /// the outbox and its messages stay unacknowledged.
    #[error("shutdown requested before the remote-write outbox was delivered")]
    Interrupted,
    /// A blocking task panicked or was cancelled.
    #[error("an ingest task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Longest pause between MQTT reconnect attempts.
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(30);
/// First pause after a connection error.
const MIN_RECONNECT_BACKOFF: Duration = Duration::from_millis(250);
/// How often expired de-duplication streams are pruned.
const PRUNE_INTERVAL: Duration = Duration::from_secs(3600);
/// How long a clean shutdown waits for the last acknowledgements to reach the broker.
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Nanoseconds since the Unix epoch, now.
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Milliseconds since the Unix epoch, now: the fleet page's instant when `?at=` is absent.
pub fn now_ms() -> i64 {
    now_ns() / 1_000_000
}

/// Binds the fleet page (when `[http]` is on) and serves it from `source`.
pub async fn start_page(
    config: &Config,
    source: crate::source::Source,
    metrics: Option<Arc<Metrics>>,
) -> Result<Option<tokio::task::JoinHandle<()>>, RunError> {
    let Some(http) = &config.http else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(http.listen)
        .await
        .map_err(|source| RunError::PageBind {
            addr: http.listen.to_string(),
            source,
        })?;
    let addr = listener.local_addr().unwrap_or(http.listen);
    let page = crate::page::Page::new(
        source,
        config.catalog.clone(),
        config.prices.clone(),
        metrics,
    );
    tracing::info!(%addr, "Serving the fleet page.");
    Ok(Some(tokio::spawn(crate::page::serve(
        listener,
        Arc::new(page),
        now_ms,
    ))))
}

/// Builds the rumqttc options for the gateway's session.
pub fn mqtt_options(config: &MqttConfig) -> Result<MqttOptions, RunError> {
    let mut options = MqttOptions::new(config.client_id.clone(), config.host.clone(), config.port);
    options.set_keep_alive(config.keep_alive);
    options.set_clean_start(false);
    options.set_session_expiry_interval(Some(
        u32::try_from(config.session_expiry.as_secs()).unwrap_or(u32::MAX),
    ));
    options.set_receive_maximum(Some(config.receive_maximum));
    // Announced to the broker (which then never sends larger packets) and enforced on read.
    options.set_max_packet_size(Some(config.max_packet_size));
    options.set_manual_acks(true);
    if let Some((user, password)) = &config.credentials {
        options.set_credentials(user.clone(), password.0.clone());
    }
    if let Some(tls) = &config.tls {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|source| RunError::TlsFile {
                path: path.display().to_string(),
                source,
            })
        };
        let client_auth = match &tls.client {
            Some((cert, key)) => Some((read(cert)?, read(key)?)),
            None => None,
        };
        options.set_transport(Transport::Tls(TlsConfiguration::Simple {
            ca: read(&tls.ca_file)?,
            alpn: None,
            client_auth,
        }));
    }
    Ok(options)
}

/// Delivers every pending outbox request in order. Refused requests are dead-lettered. Returns
/// `Err(Interrupted)` if `stop` was set while a request was still being retried.
pub fn deliver_outbox(
    store: &Store,
    writer: &RemoteWriter,
    stop: &AtomicBool,
    metrics: &Metrics,
) -> Result<(), RunError> {
    let pending = store.outbox()?;
    for (id, body) in pending {
        let mut stats = SendStats::default();
        let result = writer.send(&body, stop, &mut stats);
        metrics
            .rw_retries
            .fetch_add(stats.retries, Ordering::Relaxed);
        match result {
            Ok(()) => {
                metrics.rw_requests.fetch_add(1, Ordering::Relaxed);
                store.remove_outbox(&[id])?;
            }
            Err(SendError::Interrupted) => return Err(RunError::Interrupted),
            Err(error) => {
                metrics.rw_refused.fetch_add(1, Ordering::Relaxed);
                tracing::error!(%error, id, "Remote-write request refused for good; dead-lettered.");
                store.write(|w| {
                    w.dead_letter(&DeadLetter {
                        arrival_ns: now_ns(),
                        source: DeadLetterSource::RemoteWrite,
                        reason: format!("remote_write_refused: {error}"),
                        topic: writer.url().to_owned(),
                        payload_len: body.len() as u64,
                        payload: body.clone(),
                    })?;
                    Ok(())
                })?;
                store.remove_outbox(&[id])?;
            }
        }
    }
    metrics
        .outbox_pending
        .store(store.outbox_len()?, Ordering::Relaxed);
    Ok(())
}

/// Runs the gateway until `shutdown` resolves, then finishes the group in hand, sends its
/// acknowledgements and disconnects (the persistent session stays on the broker).
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let metrics = Arc::new(Metrics::default());
    let store = Store::open(&config.store)?;
    let mut ingestor = Ingestor::new(store, config.ingest.clone())?;
    let remote = config
        .remote_write
        .clone()
        .map(|rw| Arc::new(RemoteWriter::new(rw)));
    let stop = Arc::new(AtomicBool::new(false));

    let metrics_task = match config.metrics_listen {
        Some(addr) => {
            let listener =
                crate::metrics::bind(addr)
                    .await
                    .map_err(|source| RunError::MetricsBind {
                        addr: addr.to_string(),
                        source,
                    })?;
            tracing::info!(%addr, "Serving /metrics.");
            Some(tokio::spawn(crate::metrics::serve(
                listener,
                Arc::clone(&metrics),
            )))
        }
        None => None,
    };

    let page_source = match config.http.as_ref().and_then(|h| h.prometheus.clone()) {
        Some(url) => crate::source::Source::Prometheus(url),
        None => crate::source::Source::Store(ingestor.shared_store()),
    };
    let page_task = start_page(&config, page_source, Some(Arc::clone(&metrics))).await?;

    let (stop_tx, mut stop_rx) = watch::channel(false);
    {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            shutdown.await;
            tracing::info!("Shutdown requested; finishing the current group.");
            stop.store(true, Ordering::Relaxed);
            let _ = stop_tx.send(true);
        });
    }

    // A crash may have left committed requests undelivered: deliver them before anything new.
    if let Some(remote) = &remote {
        let (back, result) = {
            let remote = Arc::clone(remote);
            let stop = Arc::clone(&stop);
            let metrics = Arc::clone(&metrics);
            tokio::task::spawn_blocking(move || {
                let result = deliver_outbox(ingestor.store(), &remote, &stop, &metrics);
                (ingestor, result)
            })
            .await?
        };
        ingestor = back;
        if result.is_err() && stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        result?;
    }

    let options = mqtt_options(&config.mqtt)?;
    let capacity = usize::from(config.mqtt.receive_maximum) * 2 + 16;
    let (client, mut eventloop) = AsyncClient::new(options, capacity);
    let filter = config.mqtt.filter();
    // Unbounded in type, bounded in practice: the broker never has more than receive_maximum
    // messages unacknowledged to us (plus redeliveries of those after a reconnect).
    let (tx, mut rx) = mpsc::unbounded_channel::<Publish>();

    let poller = {
        let client = client.clone();
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            let mut backoff = Backoff::new(MIN_RECONNECT_BACKOFF, MAX_RECONNECT_BACKOFF);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                        backoff.reset();
                        tracing::info!(
                            session_present = ack.session_present,
                            "Connected to the broker."
                        );
                        // Re-subscribing is harmless with a kept session and needed without one.
                        if let Err(error) = client.try_subscribe(filter.clone(), QoS::AtLeastOnce) {
                            tracing::error!(%error, "Could not queue the subscription.");
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(ack))) => {
                        tracing::info!(reasons = ?ack.return_codes, "Subscribed.");
                        metrics.subscribed.store(1, Ordering::Relaxed);
                    }
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        if tx.send(publish).is_err() {
                            break;
                        }
                    }
                    Ok(Event::Outgoing(Outgoing::Disconnect)) => break,
                    Ok(_) => {}
                    Err(error) => {
                        metrics.subscribed.store(0, Ordering::Relaxed);
                        metrics.mqtt_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(%error, "MQTT connection failed; reconnecting after a pause.");
                        let pause = backoff.next_wait(Jitter::Equal(rand::random::<f64>()));
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        })
    };

    let max_group = usize::from(config.mqtt.receive_maximum);
    let mut last_prune = std::time::Instant::now() - PRUNE_INTERVAL;
    let result: Result<(), RunError> = loop {
        let first = tokio::select! {
            biased;
            _ = stop_rx.changed() => break Ok(()),
            publish = rx.recv() => match publish {
                Some(publish) => publish,
                None => break Ok(()),
            },
        };
        let mut group = vec![first];
        while group.len() < max_group {
            match rx.try_recv() {
                Ok(publish) => group.push(publish),
                Err(_) => break,
            }
        }
        metrics
            .messages_received
            .fetch_add(group.len() as u64, Ordering::Relaxed);
        if last_prune.elapsed() >= PRUNE_INTERVAL {
            last_prune = std::time::Instant::now();
            let cutoff = now_ns().saturating_sub(
                i64::try_from(config.ingest.dedup_retention.as_nanos()).unwrap_or(i64::MAX),
            );
            match ingestor.store().prune_dedup(cutoff) {
                Ok(removed) => {
                    metrics
                        .dedup_streams_expired
                        .fetch_add(removed, Ordering::Relaxed);
                }
                Err(error) => {
                    tracing::warn!(%error, "Pruning expired de-duplication state failed.")
                }
            }
        }
        // Retry the same group until it commits: nothing is acknowledged before that.
        let committed = loop {
            let arrival = now_ns();
            let remote = remote.clone();
            let stop_flag = Arc::clone(&stop);
            let metrics_for_task = Arc::clone(&metrics);
            let (back, group_back, outcome) = tokio::task::spawn_blocking(move || {
                let messages: Vec<Incoming<'_>> = group
                    .iter()
                    .map(|p| Incoming {
                        topic: std::str::from_utf8(&p.topic).unwrap_or(""),
                        payload: &p.payload,
                    })
                    .collect();
                let result = ingestor.ingest(&messages, arrival);
                drop(messages);
                let outcome = match result {
                    Ok(report) => {
                        metrics_for_task.add(&report.stats);
                        metrics_for_task.commits.fetch_add(1, Ordering::Relaxed);
                        metrics_for_task
                            .last_commit_unix_s
                            .store(arrival / 1_000_000_000, Ordering::Relaxed);
                        match &remote {
                            Some(remote) => deliver_outbox(
                                ingestor.store(),
                                remote,
                                &stop_flag,
                                &metrics_for_task,
                            )
                            .map(|()| true),
                            None => Ok(true),
                        }
                    }
                    Err(error) => {
                        metrics_for_task.store_errors.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(%error, "Store transaction failed; nothing acknowledged, retrying.");
                        Ok(false)
                    }
                };
                (ingestor, group, outcome)
            })
            .await?;
            ingestor = back;
            group = group_back;
            match outcome {
                Ok(true) => break Some(group),
                Ok(false) => {
                    if stop.load(Ordering::Relaxed) {
                        break None;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                // Delivery interrupted by shutdown: leave the group unacknowledged.
                Err(_) => break None,
            }
        };
        let Some(group) = committed else {
            break Ok(());
        };
        for publish in &group {
            if let Err(error) = client.ack(publish).await {
                tracing::warn!(%error, "Could not queue an acknowledgement.");
            } else {
                metrics.messages_acked.fetch_add(1, Ordering::Relaxed);
            }
        }
    };

    let _ = client.disconnect().await;
    if tokio::time::timeout(DISCONNECT_TIMEOUT, poller)
        .await
        .is_err()
    {
        tracing::warn!("The broker connection did not close in time.");
    }
    for task in [metrics_task, page_task].into_iter().flatten() {
        task.abort();
    }
    tracing::info!("Gateway stopped.");
    result
}

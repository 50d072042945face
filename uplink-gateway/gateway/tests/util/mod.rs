//! Helpers shared by the gateway's integration tests: batch builders, a publisher that waits for
//! PUBACKs, and the real `edgewatch-gateway` binary (`edgewatch_harness::gateway`) run from a
//! configuration the tests vary, in a temp dir.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use edgewatch_harness::gateway::GatewayProcess;
use edgewatch_harness::process::{Launch, Termination};
use edgewatch_proto::framing::encode_batch;
use edgewatch_proto::topic::batch_topic;
use edgewatch_proto::v1::{
    Batch, DeadlineCounters, Event, LoopRef, ModelVersion, SafeStop, Tier, event,
};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason};
use rumqttc::v5::{AsyncClient, Event as MqttEvent};

const BIN: &str = env!("CARGO_BIN_EXE_edgewatch-gateway");

/// How long the gateway may take to subscribe, or a metric to reach its value.
const WAIT: Duration = Duration::from_secs(60);

pub const SITE: &str = "pit-3";
pub const HOUR_NS: i64 = 3_600_000_000_000;
pub const DAY_NS: i64 = 24 * HOUR_NS;

pub fn now_ns() -> i64 {
    edgewatch_gateway::run::now_ns()
}

/// An SLO batch of `count` deadline-counter events (loop "planner"), seq `first..first+count`,
/// the i-th stamped `start_ns + i × 10 s` with cumulative cycles `250 × seq`.
pub fn slo_batch(machine: &str, epoch: u64, first: u64, count: u64, start_ns: i64) -> Batch {
    let events = (0..count)
        .map(|i| {
            let seq = first + i;
            Event {
                seq,
                event_time_unix_ns: start_ns + i as i64 * 10_000_000_000,
                monotonic_ns: seq,
                kind: Some(event::Kind::DeadlineCounters(DeadlineCounters {
                    control_loop: Some(LoopRef {
                        loop_id: 1,
                        loop_name: "planner".into(),
                    }),
                    model: Some(ModelVersion {
                        name: "haul-perception".into(),
                        version: "4.2.1".into(),
                        ..Default::default()
                    }),
                    start_time_unix_ns: 1,
                    cycles: 250 * seq,
                    misses: seq / 7,
                    skipped: 0,
                    ..Default::default()
                })),
            }
        })
        .collect();
    batch(machine, epoch, Tier::Slo, events)
}

/// A safety batch of `count` safe-stop events.
pub fn safety_batch(machine: &str, epoch: u64, first: u64, count: u64, start_ns: i64) -> Batch {
    let events = (0..count)
        .map(|i| {
            let seq = first + i;
            Event {
                seq,
                event_time_unix_ns: start_ns + i as i64 * 1_000_000_000,
                monotonic_ns: seq,
                kind: Some(event::Kind::SafeStop(SafeStop {
                    total: seq,
                    delta: 1,
                    reason: "obstacle".into(),
                    mode: 1,
                    model: None,
                    ..Default::default()
                })),
            }
        })
        .collect();
    batch(machine, epoch, Tier::Safety, events)
}

pub fn batch(machine: &str, epoch: u64, tier: Tier, events: Vec<Event>) -> Batch {
    Batch {
        schema_version: 1,
        machine_id: machine.into(),
        site_id: SITE.into(),
        agent_epoch: epoch,
        tier: tier as i32,
        first_seq: events.first().map_or(0, |e| e.seq),
        last_seq: events.last().map_or(0, |e| e.seq),
        sent_time_unix_ns: now_ns(),
        events,
        machine_class: "haul-truck".into(),
        agent_version: "0.1.0".into(),
    }
}

/// Topic and encoded payload of a batch.
pub fn message(batch: &Batch) -> (String, Vec<u8>) {
    let tier = Tier::try_from(batch.tier).unwrap();
    (
        batch_topic(&batch.site_id, &batch.machine_id, tier).unwrap(),
        encode_batch(batch).unwrap(),
    )
}

/// Publishes every message at QoS 1 from one connection and waits until the broker acknowledged
/// each with reason Success. Returns the number acknowledged.
pub async fn publish_all(broker: SocketAddr, client_id: &str, messages: &[(String, Vec<u8>)]) {
    let options = edgewatch_harness::mqtt::options(client_id, broker);
    let (client, mut events) = AsyncClient::new(options, 64);
    let expected = messages.len();
    let poller = tokio::spawn(async move {
        let mut acked = 0usize;
        while acked < expected {
            match tokio::time::timeout(Duration::from_secs(30), events.poll()).await {
                Ok(Ok(MqttEvent::Incoming(Packet::PubAck(ack)))) => {
                    assert_eq!(ack.reason, PubAckReason::Success, "publish refused");
                    acked += 1;
                }
                Ok(Ok(_)) => {}
                Ok(Err(error)) => panic!("publisher connection failed: {error}"),
                Err(_) => panic!("no PUBACK within 30 s ({acked}/{expected})"),
            }
        }
        // Let the DISCONNECT go out.
        let _ = tokio::time::timeout(Duration::from_secs(1), events.poll()).await;
    });
    for (topic, payload) in messages {
        client
            .publish(topic.clone(), QoS::AtLeastOnce, false, payload.clone())
            .await
            .unwrap();
    }
    poller.await.unwrap();
    let _ = client.disconnect().await;
}

/// The real gateway binary, run from a generated configuration.
pub struct Gateway {
    process: GatewayProcess,
    pub dir: PathBuf,
    pub config_file: PathBuf,
    pub metrics: SocketAddr,
    /// The fleet page's address (`[http] listen`).
    pub page: SocketAddr,
}

pub struct GatewaySpec<'a> {
    pub broker: SocketAddr,
    pub client_id: &'a str,
    pub shared_group: Option<&'a str>,
    pub remote_write_url: Option<String>,
    pub extra_ingest: &'a str,
    /// Appended to the configuration file (e.g. `[slo]`, `[prices]` tables).
    pub extra_tables: String,
    /// `remote_write.max_sample_age`.
    pub rw_max_sample_age: &'a str,
}

impl<'a> GatewaySpec<'a> {
    pub fn new(broker: SocketAddr, client_id: &'a str) -> Self {
        Self {
            broker,
            client_id,
            shared_group: None,
            remote_write_url: None,
            extra_ingest: "",
            extra_tables: String::new(),
            rw_max_sample_age: "30d",
        }
    }
}

pub fn free_addr() -> SocketAddr {
    edgewatch_harness::net::loopback(edgewatch_harness::net::free_port().unwrap())
}

impl Gateway {
    /// Writes the configuration into `dir` (store at `dir/store.redb`) and starts the binary.
    pub fn start(dir: &Path, spec: &GatewaySpec<'_>) -> Self {
        let metrics = free_addr();
        let page = free_addr();
        let mut config = format!(
            "[mqtt]\nhost = \"127.0.0.1\"\nport = {}\nclient_id = \"{}\"\nkeep_alive = \"5s\"\nreceive_maximum = 64\n",
            spec.broker.port(),
            spec.client_id
        );
        if let Some(group) = spec.shared_group {
            config.push_str(&format!("shared_group = \"{group}\"\n"));
        }
        config.push_str(&format!("[ingest]\n{}\n", spec.extra_ingest));
        config.push_str(&format!(
            "[store]\npath = \"{}\"\n[metrics]\nlisten = \"{metrics}\"\n[http]\nlisten = \"{page}\"\n",
            dir.join("store.redb").display()
        ));
        if let Some(url) = &spec.remote_write_url {
            config.push_str(&format!(
                "[remote_write]\nurl = \"{url}\"\nmax_sample_age = \"{}\"\nmin_backoff = \"50ms\"\nmax_backoff = \"500ms\"\ntimeout = \"5s\"\n",
                spec.rw_max_sample_age
            ));
        }
        config.push_str(&spec.extra_tables);
        Self::launch(dir, config, metrics, page)
    }

    /// Starts the binary on the packaged configuration (`config/gateway.toml`, every key at its
    /// default), with only its PROVISION lines filled in for this test: the broker, the client
    /// id, the store in `dir`, free `/metrics` and fleet page ports, and, when given, a
    /// `[remote_write]` table holding only its URL.
    pub fn start_packaged(
        dir: &Path,
        broker: SocketAddr,
        client_id: &str,
        remote_write_url: Option<&str>,
    ) -> Self {
        let metrics = free_addr();
        let page = free_addr();
        let packaged = include_str!("../../config/gateway.toml");
        let mut section = String::new();
        let mut config: String = packaged
            .lines()
            .map(|line| {
                if line.starts_with('[') {
                    section = line.to_owned();
                }
                let value = |key: &str| line.starts_with(&format!("{key} = "));
                if section == "[http]" && line.starts_with("#listen = ") {
                    format!("listen = \"{page}\"")
                } else if value("host") {
                    "host = \"127.0.0.1\"".to_owned()
                } else if value("port") {
                    format!("port = {}", broker.port())
                } else if value("client_id") {
                    format!("client_id = \"{client_id}\"")
                } else if value("path") {
                    format!("path = \"{}\"", dir.join("store.redb").display())
                } else if value("listen") {
                    format!("listen = \"{metrics}\"")
                } else {
                    line.to_owned()
                }
            })
            .map(|line| line + "\n")
            .collect();
        if let Some(url) = remote_write_url {
            config.push_str(&format!("\n[remote_write]\nurl = \"{url}\"\n"));
        }
        Self::launch(dir, config, metrics, page)
    }

    fn launch(dir: &Path, config: String, metrics: SocketAddr, page: SocketAddr) -> Self {
        let config_file = dir.join("gateway.toml");
        std::fs::write(&config_file, config).unwrap();
        let log = dir.join("gateway.log");
        let process = GatewayProcess::start(
            Path::new(BIN),
            &config_file,
            &log,
            metrics,
            Launch::new("info"),
            WAIT,
        )
        .unwrap_or_else(|error| panic!("{error}; log:\n{}", log_tail(dir)));
        Self {
            process,
            dir: dir.to_owned(),
            config_file,
            metrics,
            page,
        }
    }

    /// Starts the same instance again (same client id, same store).
    pub fn restart(&mut self) {
        assert!(self.process.pid().is_none(), "restart of a running gateway");
        self.process
            .restart(WAIT)
            .unwrap_or_else(|error| panic!("{error}; log:\n{}", self.log()));
    }

    pub fn pid(&self) -> i32 {
        self.process.pid().unwrap() as i32
    }

    pub fn signal(&self, signal: i32) {
        self.process.signal(signal);
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// SIGTERM, and wait for a clean exit.
    pub fn stop(&mut self) {
        match self.process.terminate(Duration::from_secs(20)) {
            Termination::Exited(status) => assert!(
                status.success(),
                "gateway exited with {status}; log:\n{}",
                self.log()
            ),
            Termination::Killed(_) => {
                panic!("gateway did not stop on SIGTERM; log:\n{}", self.log())
            }
            Termination::NotRunning => {}
        }
    }

    pub fn log(&self) -> String {
        log_tail(&self.dir)
    }

    /// The gateway's `/metrics` text, or `None` if it does not answer.
    pub fn scrape(&self) -> Option<String> {
        self.process.scrape()
    }

    /// Value of a metric line that starts with `name ` (or `name{...} `).
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.process.metric(name)
    }

    /// Waits (up to 60 s) until `predicate(metric)` holds.
    pub fn wait_metric(&self, name: &str, predicate: impl Fn(f64) -> bool) -> f64 {
        self.process
            .wait_metric(name, predicate, WAIT)
            .unwrap_or_else(|last| {
                panic!(
                    "{name} never reached the expected value (last {last:?}); log:\n{}",
                    self.log()
                )
            })
    }

    /// Runs another subcommand of the binary with this gateway's configuration; returns stdout.
    pub fn command(&self, args: &[&str]) -> String {
        let output = self.process.command(args).unwrap();
        assert!(
            output.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    pub fn store_path(&self) -> PathBuf {
        self.dir.join("store.redb")
    }
}

/// The last 40 lines of the gateway's log in `dir`.
fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("gateway.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

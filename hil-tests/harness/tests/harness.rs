//! The harness's own tests: real brokers on loopback, the fault proxy between client and broker,
//! and an ACL denial seen by an MQTT v5 client as a PUBACK reason code.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use edgewatch_harness::embedded::EmbeddedBroker;
use edgewatch_harness::mosquitto::{Mosquitto, MosquittoOptions};
use edgewatch_harness::mqtt::{self, connect, poll_until, wait_connected};
use edgewatch_harness::pki::FleetPki;
use edgewatch_harness::proxy::{Fault, FaultProxy};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAckReason};
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use tokio::sync::mpsc;

const TOPIC: &str = "edgewatch/v1/pit-3/truck-17/safety";
const WAIT: Duration = Duration::from_secs(10);

/// Subscribes to `filter` and forwards every received payload on the returned channel.
async fn subscriber(options: MqttOptions, filter: &str) -> mpsc::UnboundedReceiver<Vec<u8>> {
    let (client, mut events) = connect(options);
    client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    let subscribed = poll_until(&mut events, WAIT, |event| {
        matches!(event, Event::Incoming(Packet::SubAck(_))).then_some(())
    })
    .await
    .unwrap();
    assert!(subscribed.is_some(), "no SUBACK");
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let _client = client;
        while let Ok(event) = events.poll().await {
            if let Event::Incoming(Packet::Publish(publish)) = event
                && tx.send(publish.payload.to_vec()).is_err()
            {
                break;
            }
        }
    });
    rx
}

/// Polls until the PUBACK for our one publish arrives; returns its reason.
async fn puback(events: &mut EventLoop, timeout: Duration) -> Option<PubAckReason> {
    poll_until(events, timeout, |event| match event {
        Event::Incoming(Packet::PubAck(ack)) => Some(ack.reason),
        _ => None,
    })
    .await
    .unwrap()
}

async fn publisher(options: MqttOptions) -> (AsyncClient, EventLoop) {
    let (client, mut events) = connect(options);
    wait_connected(&mut events, WAIT).await.unwrap();
    (client, events)
}

async fn assert_qos1_round_trip(broker: SocketAddr) {
    let mut received = subscriber(mqtt::options("sub", broker), TOPIC).await;
    let (client, mut events) = publisher(mqtt::options("pub", broker)).await;
    client
        .publish(TOPIC, QoS::AtLeastOnce, false, b"hello".to_vec())
        .await
        .unwrap();
    assert_eq!(puback(&mut events, WAIT).await, Some(PubAckReason::Success));
    let payload = tokio::time::timeout(WAIT, received.recv()).await.unwrap();
    assert_eq!(payload.as_deref(), Some(&b"hello"[..]));
}

#[tokio::test]
async fn qos1_round_trip_through_mosquitto() {
    let broker = Mosquitto::start().unwrap();
    assert_qos1_round_trip(broker.addr()).await;
}

#[tokio::test]
async fn qos1_round_trip_through_embedded_rumqttd() {
    let broker = EmbeddedBroker::start().unwrap();
    assert_qos1_round_trip(broker.addr()).await;
}

#[tokio::test]
async fn qos1_round_trip_through_the_proxy_in_pass_mode() {
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    assert_qos1_round_trip(proxy.addr()).await;
    assert!(proxy.bytes_upstream() > 0);
}

#[tokio::test]
async fn a_publish_held_in_a_blackhole_arrives_once_it_heals() {
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let mut received = subscriber(mqtt::options("sub", broker.addr()), TOPIC).await;
    let (client, mut events) = publisher(mqtt::options("pub", proxy.addr())).await;

    proxy.set(Fault::Blackhole);
    let upstream_before = proxy.bytes_upstream();
    client
        .publish(TOPIC, QoS::AtLeastOnce, false, b"held".to_vec())
        .await
        .unwrap();
    // Within the keepalive, the connection stays up but nothing gets through either way.
    assert_eq!(puback(&mut events, Duration::from_millis(1500)).await, None);
    assert_eq!(proxy.bytes_upstream(), upstream_before, "bytes leaked");
    assert!(received.try_recv().is_err(), "message crossed a blackhole");

    proxy.set(Fault::Pass);
    assert_eq!(puback(&mut events, WAIT).await, Some(PubAckReason::Success));
    let payload = tokio::time::timeout(WAIT, received.recv()).await.unwrap();
    assert_eq!(payload.as_deref(), Some(&b"held"[..]));
}

#[tokio::test]
async fn a_blackholed_link_is_detected_by_keepalive_without_a_reset() {
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let mut options = mqtt::options("pub", proxy.addr());
    options.set_keep_alive(Duration::from_secs(5));
    let (_client, mut events) = publisher(options).await;
    proxy.set(Fault::Blackhole);
    let started = Instant::now();
    let outcome = poll_until(&mut events, Duration::from_secs(15), |_| None::<()>).await;
    assert!(outcome.is_err(), "the dead link was never noticed");
    // The client noticed by itself (missing PINGRESP), not through a reset: that takes a
    // keepalive at least.
    assert!(started.elapsed() >= Duration::from_millis(4500));
}

#[tokio::test]
async fn reset_tears_down_open_connections_and_refuses_new_ones() {
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let (_client, mut events) = publisher(mqtt::options("pub", proxy.addr())).await;
    proxy.set(Fault::Reset);
    let outcome = poll_until(&mut events, WAIT, |_| None::<()>).await;
    assert!(outcome.is_err(), "the connection survived a reset");
    // The client reconnects at once, and the new connection is reset too.
    let outcome = poll_until(&mut events, WAIT, |_| None::<()>).await;
    assert!(outcome.is_err());
    proxy.set(Fault::Pass);
    wait_connected(&mut events, WAIT).await.unwrap();
}

#[tokio::test]
async fn reset_open_connections_is_one_shot() {
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let (_client, mut events) = publisher(mqtt::options("pub", proxy.addr())).await;
    proxy.reset_open_connections();
    assert!(poll_until(&mut events, WAIT, |_| None::<()>).await.is_err());
    wait_connected(&mut events, WAIT).await.unwrap();
    assert_eq!(proxy.fault(), Fault::Pass);
}

#[tokio::test]
async fn delay_and_throttle_slow_traffic_down() {
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let (client, mut events) = publisher(mqtt::options("pub", proxy.addr())).await;

    let mut _received = subscriber(mqtt::options("sub", broker.addr()), TOPIC).await;
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let started = Instant::now();
    client
        .publish(TOPIC, QoS::AtLeastOnce, false, b"slow".to_vec())
        .await
        .unwrap();
    assert_eq!(puback(&mut events, WAIT).await, Some(PubAckReason::Success));
    // The publish and its PUBACK each waited at the proxy.
    assert!(started.elapsed() >= Duration::from_millis(600));

    proxy.set(Fault::Throttle {
        bytes_per_second: 40_000,
    });
    let before = proxy.bytes_upstream();
    let started = Instant::now();
    client
        .publish(TOPIC, QoS::AtLeastOnce, false, vec![7u8; 100_000])
        .await
        .unwrap();
    assert_eq!(puback(&mut events, WAIT).await, Some(PubAckReason::Success));
    let moved = proxy.bytes_upstream() - before;
    assert!(moved >= 100_000);
    // 100 kB at 40 kB/s cannot cross in less than about 2.5 s.
    assert!(
        started.elapsed() >= Duration::from_millis(2300),
        "{moved} bytes crossed in {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn mosquitto_comes_back_on_the_same_port_after_sigkill() {
    let mut broker = Mosquitto::start().unwrap();
    let port = broker.port();
    broker.kill();
    assert!(broker.pid().is_none());
    broker.restart().unwrap();
    assert_eq!(broker.port(), port);
    assert_qos1_round_trip(broker.addr()).await;
}

#[tokio::test]
async fn acl_denial_is_seen_as_a_v5_puback_reason_code() {
    let pki = FleetPki::generate().unwrap();
    let broker = Mosquitto::start_with(MosquittoOptions {
        tls: Some(pki.broker_tls().unwrap()),
        acl: Some(
            "pattern write edgewatch/v1/+/%u/#\nuser gateway-1\ntopic read edgewatch/v1/#\n".into(),
        ),
        ..MosquittoOptions::default()
    })
    .unwrap();
    let truck_a = pki.issue_client("truck-a").unwrap();
    let gateway = pki.issue_client("gateway-1").unwrap();

    let mut gateway_options = mqtt::options("gateway-1", broker.addr());
    gateway_options.set_transport(mqtt::tls_transport(pki.ca_pem(), &gateway));
    let mut received =
        subscriber(gateway_options, edgewatch_harness::collector::TOPIC_FILTER).await;

    let mut options = mqtt::options("truck-a", broker.addr());
    options.set_transport(mqtt::tls_transport(pki.ca_pem(), &truck_a));
    let (client, mut events) = publisher(options).await;

    // Machine A may not write under machine B's topics.
    client
        .publish(
            "edgewatch/v1/pit-3/truck-b/safety",
            QoS::AtLeastOnce,
            false,
            b"forged".to_vec(),
        )
        .await
        .unwrap();
    // Mosquitto 2.0.11 answers PUBACK 0x87 and closes the connection at once. rumqttc may read
    // both in one go and report the close first; the PUBACK it already read then comes out of the
    // next poll that reconnects, just before that connection's CONNACK.
    let mut refusal = None;
    let mut connected_again = false;
    let deadline = Instant::now() + WAIT;
    while !(refusal.is_some() && connected_again) && Instant::now() < deadline {
        let outcome = poll_until(&mut events, Duration::from_secs(1), |event| match event {
            Event::Incoming(Packet::PubAck(ack)) => Some(Some(ack.reason)),
            Event::Incoming(Packet::ConnAck(_)) => Some(None),
            _ => None,
        })
        .await;
        match outcome {
            Ok(Some(Some(reason))) => refusal = Some(reason),
            Ok(Some(None)) => connected_again = true,
            // Still connected after a second without a close: nothing more to wait for.
            Ok(None) if refusal.is_some() => connected_again = true,
            Ok(None) | Err(_) => {}
        }
    }
    assert_eq!(refusal, Some(PubAckReason::NotAuthorized));
    assert!(connected_again);

    // Its own topic works, and only that message reaches the gateway.
    client
        .publish(
            "edgewatch/v1/pit-3/truck-a/safety",
            QoS::AtLeastOnce,
            false,
            b"own".to_vec(),
        )
        .await
        .unwrap();
    assert_eq!(puback(&mut events, WAIT).await, Some(PubAckReason::Success));
    let payload = tokio::time::timeout(WAIT, received.recv()).await.unwrap();
    assert_eq!(payload.as_deref(), Some(&b"own"[..]));
    assert!(received.try_recv().is_err());
    assert!(
        broker.log().contains("Denied PUBLISH from truck-a"),
        "broker log lacks the denial"
    );
}

#[tokio::test]
async fn a_client_without_a_certificate_is_refused() {
    let pki = FleetPki::generate().unwrap();
    let broker = Mosquitto::start_with(MosquittoOptions {
        tls: Some(pki.broker_tls().unwrap()),
        ..MosquittoOptions::default()
    })
    .unwrap();
    let other_pki = FleetPki::generate().unwrap();
    let stranger = other_pki.issue_client("truck-a").unwrap();
    let mut options = mqtt::options("truck-a", broker.addr());
    options.set_transport(mqtt::tls_transport(pki.ca_pem(), &stranger));
    let (_client, mut events) = connect(options);
    assert!(wait_connected(&mut events, WAIT).await.is_err());
}

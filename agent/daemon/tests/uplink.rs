//! The uplink against a real Mosquitto through the fault proxy: partitions, broker and agent
//! crashes, a dead link without RST, the bandwidth cap, and an ACL refusal under mTLS.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use edgewatch_harness::mosquitto::{Mosquitto, MosquittoOptions};
use edgewatch_harness::pki::FleetPki;
use edgewatch_harness::proxy::{Fault, FaultProxy};
use edgewatch_proto::v1::{Tier, event};
use prost::Message;
use util::{Agent, AgentSetup, Collector, Received, submit_all, test_event, test_id, wait_until};

const SAFETY_IDS: i64 = 1_000_000;
const SLO_IDS: i64 = 2_000_000;
const DEBUG_IDS: i64 = 3_000_000;

fn submit_range(agent: &Agent, tier: Tier, first_id: i64, count: i64, padding: usize) {
    let replies = submit_all(
        &agent.socket,
        (first_id..first_id + count)
            .map(|id| (tier, test_event(id, padding)))
            .collect(),
    );
    assert!(
        replies.iter().all(|reply| reply.accepted),
        "a submission was refused: {:?}",
        replies.iter().find(|r| !r.accepted).map(|r| &r.error)
    );
}

/// Every id in `first..first+count` arrived in `tier`.
fn all_arrived(collector: &Collector, tier: Tier, first: i64, count: i64) -> bool {
    let ids: BTreeSet<i64> = collector.ids(tier).into_iter().collect();
    (first..first + count).all(|id| ids.contains(&id))
}

/// Checks the at-least-once contract on everything received: per tier the sequence numbers of
/// first arrivals increase, and a duplicate is an exact re-send of the same record.
fn assert_ordered_and_exact_duplicates(received: &[Received]) {
    let mut first: BTreeMap<(i32, u64, u64), Vec<u8>> = BTreeMap::new();
    let mut last_seq: BTreeMap<(i32, u64), u64> = BTreeMap::new();
    for r in received {
        let key = (r.tier as i32, r.epoch, r.seq);
        let bytes = r.event.encode_to_vec();
        match first.get(&key) {
            Some(previous) => {
                assert_eq!(previous, &bytes, "{key:?} re-sent with different content")
            }
            None => {
                let tier_key = (r.tier as i32, r.epoch);
                if let Some(&last) = last_seq.get(&tier_key) {
                    assert!(
                        r.seq > last,
                        "tier {:?}: seq {} arrived after {last}",
                        r.tier,
                        r.seq
                    );
                }
                last_seq.insert(tier_key, r.seq);
                first.insert(key, bytes);
            }
        }
    }
}

#[test]
fn a_partition_is_detected_by_keepalive_and_the_backlog_drains_safety_first() {
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let collector = Collector::start(broker.addr()).unwrap();
    let agent = Agent::start(&AgentSetup::new(proxy.addr()));

    // Connected and delivering.
    submit_range(&agent, Tier::Debug, 0, 5, 0);
    assert!(wait_until(Duration::from_secs(20), || all_arrived(
        &collector,
        Tier::Debug,
        0,
        5
    )));
    assert!(wait_until(Duration::from_secs(5), || agent.uplink_connected()));

    // A dead link that never resets: the agent must notice by itself.
    proxy.set(Fault::Blackhole);
    let cut = Instant::now();
    // The backlog: bulk tiers first, safety last, so that only priority can put safety first.
    submit_range(&agent, Tier::Debug, DEBUG_IDS, 600, 200);
    submit_range(&agent, Tier::Slo, SLO_IDS, 600, 100);
    submit_range(&agent, Tier::Safety, SAFETY_IDS, 200, 50);
    assert!(
        wait_until(Duration::from_secs(15), || !agent.uplink_connected()),
        "the dead link was not noticed; log:\n{}",
        agent.log()
    );
    let noticed = cut.elapsed();
    // Keepalive 5 s: noticed within two keepalives (plus the status file's 1 s period).
    assert!(
        noticed <= Duration::from_secs(12),
        "noticed after {noticed:?}"
    );
    let before_heal = collector.count();

    proxy.heal_with_reset();
    assert!(
        wait_until(Duration::from_secs(60), || {
            all_arrived(&collector, Tier::Safety, SAFETY_IDS, 200)
                && all_arrived(&collector, Tier::Slo, SLO_IDS, 600)
                && all_arrived(&collector, Tier::Debug, DEBUG_IDS, 600)
        }),
        "backlog incomplete; log:\n{}",
        agent.log()
    );

    let received = collector.snapshot();
    assert_ordered_and_exact_duplicates(&received);
    // Every backlog safety record arrived before any backlog SLO or debug record.
    let after_heal = &received[before_heal..];
    let position = |pred: &dyn Fn(&Received) -> bool| after_heal.iter().position(pred);
    let last_safety = after_heal
        .iter()
        .rposition(|r| {
            r.tier == Tier::Safety && test_id(&r.event).is_some_and(|id| id >= SAFETY_IDS)
        })
        .unwrap();
    let first_bulk = position(&|r: &Received| {
        r.tier != Tier::Safety && test_id(&r.event).is_some_and(|id| id >= SLO_IDS)
    })
    .unwrap();
    assert!(
        last_safety < first_bulk,
        "a bulk record (index {first_bulk}) arrived before the last safety record (index {last_safety})"
    );
    assert_eq!(*collector.undecodable.lock().unwrap(), 0);
}

#[test]
fn a_broker_killed_mid_drain_loses_nothing() {
    let mut broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let collector = Collector::start(broker.addr()).unwrap();
    let agent = Agent::start(&AgentSetup::new(proxy.addr()));
    assert!(wait_until(Duration::from_secs(20), || agent.uplink_connected()));

    // A slow link, so that the drain is still going when the broker dies.
    proxy.set(Fault::Throttle {
        bytes_per_second: 150_000,
    });
    submit_range(&agent, Tier::Debug, DEBUG_IDS, 3000, 500);
    assert!(wait_until(Duration::from_secs(30), || collector.count() >= 300));
    broker.kill();
    std::thread::sleep(Duration::from_secs(1));
    broker.restart().unwrap();
    proxy.set(Fault::Pass);
    assert!(
        wait_until(Duration::from_secs(90), || all_arrived(
            &collector,
            Tier::Debug,
            DEBUG_IDS,
            3000
        )),
        "lost records after the broker was killed: {} of 3000 distinct; log:\n{}",
        collector
            .ids(Tier::Debug)
            .into_iter()
            .collect::<BTreeSet<_>>()
            .len(),
        agent.log()
    );
    assert_ordered_and_exact_duplicates(&collector.snapshot());
}

#[test]
fn an_agent_killed_mid_drain_loses_nothing_that_was_durable() {
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let collector = Collector::start(broker.addr()).unwrap();
    let mut agent = Agent::start(&AgentSetup::new(proxy.addr()));
    assert!(wait_until(Duration::from_secs(20), || agent.uplink_connected()));

    proxy.set(Fault::Blackhole);
    submit_range(&agent, Tier::Safety, SAFETY_IDS, 500, 100);
    submit_range(&agent, Tier::Debug, DEBUG_IDS, 2000, 500);
    // Safety replies come after durability; bulk tiers flush within 200 ms here.
    std::thread::sleep(Duration::from_millis(1500));
    proxy.heal_with_reset();
    proxy.set(Fault::Throttle {
        bytes_per_second: 150_000,
    });
    assert!(wait_until(Duration::from_secs(60), || collector.count() >= 800));
    agent.kill();
    proxy.set(Fault::Pass);
    agent.spawn();
    assert!(
        wait_until(Duration::from_secs(60), || {
            all_arrived(&collector, Tier::Safety, SAFETY_IDS, 500)
                && all_arrived(&collector, Tier::Debug, DEBUG_IDS, 2000)
        }),
        "records lost across the agent's crash; log:\n{}",
        agent.log()
    );
    assert_ordered_and_exact_duplicates(&collector.snapshot());
}

#[test]
fn the_bandwidth_cap_holds_within_ten_percent_over_thirty_seconds() {
    let broker = Mosquitto::start().unwrap();
    let proxy = FaultProxy::start(broker.addr()).unwrap();
    let _collector = Collector::start(broker.addr()).unwrap();
    let cap = 40_000u64;
    let mut setup = AgentSetup::new(proxy.addr());
    setup.bandwidth_bytes_per_s = cap;
    let agent = Agent::start(&setup);
    assert!(wait_until(Duration::from_secs(20), || agent.uplink_connected()));
    // About 3 MB of poorly compressible events: far more than 35 s at the cap.
    submit_range(&agent, Tier::Debug, DEBUG_IDS, 3000, 1000);
    // Skip the first seconds (the bucket starts full), then measure 30 s.
    std::thread::sleep(Duration::from_secs(5));
    let start_bytes = proxy.bytes_upstream();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(30));
    let rate = (proxy.bytes_upstream() - start_bytes) as f64 / start.elapsed().as_secs_f64();
    assert!(
        (rate - cap as f64).abs() <= cap as f64 * 0.10,
        "measured {rate:.0} B/s against a cap of {cap} B/s"
    );
}

#[test]
fn a_refused_topic_is_reported_parked_and_the_agent_keeps_draining_its_own_data() {
    let pki = FleetPki::generate().unwrap();
    let broker = Mosquitto::start_with(MosquittoOptions {
        tls: Some(pki.broker_tls().unwrap()),
        acl: Some(
            "pattern write edgewatch/v1/+/%u/#\nuser collector\ntopic read edgewatch/v1/#\n".into(),
        ),
        ..MosquittoOptions::default()
    })
    .unwrap();
    let collector_id = pki.issue_client("collector").unwrap();
    let ca = pki.ca_pem().to_owned();
    let collector = Collector::start_with(broker.addr(), move |options| {
        options.set_transport(edgewatch_harness::mqtt::tls_transport(&ca, &collector_id));
    })
    .unwrap();
    let truck_a = pki.issue_client("truck-a").unwrap();
    let mut setup = AgentSetup::new(broker.addr());
    setup.machine = "truck-a".into();
    // A misconfigured debug topic that names another machine: the certificate says truck-a.
    setup.extra_uplink = format!(
        "tls = {{ ca = \"{}\", cert = \"{}\", key = \"{}\" }}\n[uplink.topics]\ndebug = \"edgewatch/v1/pit-3/truck-b/debug\"\n",
        pki.ca_file().display(),
        truck_a.cert_file.display(),
        truck_a.key_file.display()
    );
    // `host` must match the broker certificate's SAN.
    let agent = Agent::start(&setup);

    submit_range(&agent, Tier::Debug, DEBUG_IDS, 50, 0);
    submit_range(&agent, Tier::Safety, SAFETY_IDS, 50, 0);
    submit_range(&agent, Tier::Slo, SLO_IDS, 50, 0);
    assert!(
        wait_until(Duration::from_secs(30), || {
            all_arrived(&collector, Tier::Safety, SAFETY_IDS, 50)
                && all_arrived(&collector, Tier::Slo, SLO_IDS, 50)
        }),
        "own data did not drain; log:\n{}",
        agent.log()
    );
    assert!(wait_until(Duration::from_secs(10), || {
        agent.status()["agent"]["uplink"]["refused"].as_u64() >= Some(1)
    }));
    // More own data after the refusal still drains.
    submit_range(&agent, Tier::Safety, SAFETY_IDS + 50, 20, 0);
    assert!(wait_until(Duration::from_secs(30), || all_arrived(
        &collector,
        Tier::Safety,
        SAFETY_IDS + 50,
        20
    )));
    // No hot retry loop: the refused tier stays parked.
    std::thread::sleep(Duration::from_secs(3));
    let status = agent.status();
    let uplink = &status["agent"]["uplink"];
    assert!(uplink["refused"].as_u64().unwrap() <= 2, "{uplink}");
    assert!(
        uplink["parked_until_unix_ms"][2].as_u64().is_some(),
        "{uplink}"
    );
    assert!(
        uplink["last_refusal"]
            .as_str()
            .unwrap()
            .contains("NotAuthorized"),
        "{uplink}"
    );
    assert!(collector.ids(Tier::Debug).is_empty());
    // Nothing was deleted: the refused records wait in the queue, and only they: the agent's
    // health reports travel in the SLO tier, so a parked debug tier does not hold them back.
    assert_eq!(status["queue"]["tiers"][2]["records"].as_u64(), Some(50));
    assert!(
        collector.snapshot().iter().any(|r| r.tier == Tier::Slo
            && matches!(&r.event.kind, Some(event::Kind::AgentHealth(h)) if h.tiers.len() == 3)),
        "no health report arrived while the debug tier was parked"
    );
    assert!(broker.log().contains("Denied PUBLISH from truck-a"));
}

#[test]
fn batches_nobody_subscribes_to_are_kept_and_delivered_once_a_subscriber_appears() {
    let broker = Mosquitto::start().unwrap();
    let agent = Agent::start(&AgentSetup::new(broker.addr()));
    submit_range(&agent, Tier::Safety, SAFETY_IDS, 20, 0);
    // The broker answers PUBACK 0x10: the agent backs off and deletes nothing.
    assert!(wait_until(Duration::from_secs(20), || {
        agent.status()["agent"]["uplink"]["no_subscribers"].as_u64() >= Some(1)
    }));
    assert_eq!(
        agent.status()["queue"]["tiers"][0]["records"].as_u64(),
        Some(20)
    );
    let collector = Collector::start(broker.addr()).unwrap();
    assert!(
        wait_until(Duration::from_secs(30), || all_arrived(
            &collector,
            Tier::Safety,
            SAFETY_IDS,
            20
        )),
        "log:\n{}",
        agent.log()
    );
}

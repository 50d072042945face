//! While a large backlog drains, the queue's store shrinks: it does not keep its high-water size
//! on the eMMC while the rest drains (the log unlinks each segment once its records are
//! delivered; no compaction is needed), and ends small. The agent runs the packaged
//! defaults except a bandwidth cap, which makes the drain last long enough to watch; the broker
//! is down while the backlog builds, then comes back.
#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

mod util;

use std::path::Path;
use std::time::Duration;

use edgewatch_harness::agent::AgentProcess;
use edgewatch_harness::mosquitto::Mosquitto;
use edgewatch_harness::process::Launch;
use edgewatch_proto::v1::Tier;
use util::{BIN, Collector, submit_all, test_event, wait_until};

const EVENTS: i64 = 600;
const PADDING: usize = 60_000;

fn config_text(dir: &Path, broker_port: u16) -> String {
    format!(
        r#"
[machine]
id = "truck-11"
site = "pit-3"
class = "haul-truck"

[queue]
dir = "{dir}/queue"

[uplink]
host = "127.0.0.1"
port = {broker_port}
bandwidth_bytes_per_s = 1000000

[scheduling]
idle_priority = false

[ingest]
socket = "{dir}/agent.sock"

[status]
file = "{dir}/agent-status.json"

[thermal]
tegrastats_enabled = false
sysfs_root = "{dir}/no-sysfs"
"#,
        dir = dir.display(),
    )
}

fn file_bytes(agent: &AgentProcess) -> u64 {
    let output = agent.command(&["status", "--json"]).unwrap();
    let status: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    status["queue"]["file_bytes"].as_u64().unwrap_or(0)
}

#[test]
fn the_queue_file_shrinks_while_a_large_backlog_drains_and_ends_small() {
    let mut broker = Mosquitto::start().unwrap();
    let collector = Collector::start(broker.addr()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start(
        Path::new(BIN),
        dir.path(),
        &config_text(dir.path(), broker.port()),
        Launch::new("info"),
    )
    .unwrap();
    agent.wait_for_socket(Duration::from_secs(20)).unwrap();

    // A backlog of about 36 MB builds while the broker is down.
    broker.stop();
    for chunk in 0..(EVENTS / 50) {
        let batch = (0..50)
            .map(|i| (Tier::Debug, test_event(chunk * 50 + i, PADDING)))
            .collect();
        let replies = submit_all(&agent.socket(), batch);
        assert!(replies.iter().all(|r| r.accepted), "{replies:?}");
    }
    assert!(
        wait_until(Duration::from_secs(10), || file_bytes(&agent)
            > EVENTS as u64 * PADDING as u64),
        "the backlog is in the file: {} bytes",
        file_bytes(&agent)
    );
    let high_water = file_bytes(&agent);

    broker.restart().unwrap();
    // Watch the file while the backlog drains: once most of it is delivered, the file holds
    // far less than its high-water size, before the drain ends.
    let mut smallest_late = u64::MAX;
    let drained = wait_until(Duration::from_secs(300), || {
        let delivered = distinct(&collector);
        let size = file_bytes(&agent);
        if delivered * 100 >= EVENTS as usize * 85 && delivered < EVENTS as usize {
            smallest_late = smallest_late.min(size);
        }
        delivered >= EVENTS as usize
    });
    assert!(drained, "drained {} of {EVENTS}", distinct(&collector));
    println!(
        "queue file: {high_water} bytes at the high-water mark, at most {smallest_late} once 85 % \
         was delivered"
    );
    assert!(
        smallest_late <= high_water * 6 / 10,
        "the file kept {smallest_late} of its {high_water} bytes while the rest drained:\n{}",
        agent.log()
    );
    // Drained: the store's files end under the size at which a compaction would be worth it
    // (the log unlinks each segment once its records are delivered; it is never compacted).
    let small = edgewatch_queue::queue::COMPACT_MIN_FILE_BYTES;
    let shrunk = wait_until(Duration::from_secs(90), || file_bytes(&agent) <= small);
    println!("queue file after the drain: {} bytes", file_bytes(&agent));
    assert!(
        shrunk,
        "the file kept {} bytes after the drain:\n{}",
        file_bytes(&agent),
        agent.log()
    );
    assert!(agent.running());
    // The store shrank by itself: no compaction ran.
    assert!(
        !agent.log().contains("Compacted the queue file"),
        "{}",
        agent.log()
    );
}

fn distinct(collector: &Collector) -> usize {
    let ids: std::collections::BTreeSet<i64> = collector.ids(Tier::Debug).into_iter().collect();
    ids.len()
}

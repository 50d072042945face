//! The whole ingest path (topic + payload → validate → dedup → normalize → embedded store in a
//! temp dir) must never panic or fail on any input.
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run ingest` in `uplink-gateway/gateway`.
//!
//! Input layout: first byte picks the topic (or, above the fixed set, the next byte says how many
//! bytes of topic follow), the rest is the payload; the last 8 bytes of long inputs also set the
//! arrival time.
#![no_main]

use std::sync::Mutex;

use edgewatch_gateway::config::IngestConfig;
use edgewatch_gateway::ingest::{Incoming, Ingestor};
use edgewatch_gateway::store::Store;
use libfuzzer_sys::fuzz_target;

const TOPICS: [&str; 5] = [
    "edgewatch/v1/pit-3/truck-17/slo",
    "edgewatch/v1/pit-3/truck-17/safety",
    "edgewatch/v1/pit-3/truck-17/debug",
    "edgewatch/v1/pit-3/truck-17/status",
    "edgewatch/v1/pit-3/truck-18/slo",
];

struct State {
    _dir: tempfile::TempDir,
    ingestor: Ingestor,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (topic, payload) = match TOPICS.get(usize::from(selector)) {
        Some(topic) => ((*topic).to_owned(), rest),
        None => {
            let len = usize::from(rest.first().copied().unwrap_or(0)).min(rest.len().saturating_sub(1));
            let topic = String::from_utf8_lossy(rest.get(1..1 + len).unwrap_or_default()).into_owned();
            (topic, rest.get(1 + len..).unwrap_or_default())
        }
    };
    let arrival = match payload.len().checked_sub(8).and_then(|at| payload.get(at..)) {
        Some(tail) if payload.len() > 64 => i64::from_le_bytes(tail.try_into().unwrap_or([0; 8])),
        _ => 1_800_000_000_000_000_000,
    };
    let mut state = STATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let state = state.get_or_insert_with(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = Store::open_path(&dir.path().join("fuzz.redb")).expect("store");
        let ingestor = Ingestor::new(store, IngestConfig::default()).expect("ingestor");
        State { _dir: dir, ingestor }
    });
    let report = state
        .ingestor
        .ingest(&[Incoming { topic: &topic, payload }], arrival)
        .expect("the ingest path failed on an input");
    assert_eq!(report.outcomes.len(), 1);
});

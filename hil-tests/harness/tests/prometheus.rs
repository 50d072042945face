//! The Prometheus the harness starts: ready when `start` returns, remote-write receiver on, an
//! out-of-order window in its configuration, stopped on drop.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::io::{Read, Write};
use std::net::TcpStream;

use edgewatch_harness::prometheus::Prometheus;

fn get(prometheus: &Prometheus, path: &str) -> String {
    let mut stream = TcpStream::connect(prometheus.addr()).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn a_started_prometheus_is_ready_with_an_out_of_order_window_and_stops_on_drop() {
    let prometheus = Prometheus::start().unwrap();
    assert!(get(&prometheus, "/-/ready").starts_with("HTTP/1.0 200"));
    let config = get(&prometheus, "/api/v1/status/config");
    assert!(config.contains("out_of_order_time_window: 30d"), "{config}");
    // The receiver answers (400 for an empty body) instead of 404 when it is enabled.
    let mut stream = TcpStream::connect(prometheus.addr()).unwrap();
    write!(
        stream,
        "POST /api/v1/write HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(!response.starts_with("HTTP/1.0 404"), "{response}");
    let addr = prometheus.addr();
    drop(prometheus);
    assert!(
        TcpStream::connect(addr).is_err(),
        "the server stopped on drop"
    );
}

#[test]
fn rules_loaded_into_a_running_prometheus_are_evaluated_and_bad_ones_refused() {
    let prometheus = Prometheus::start().unwrap();
    prometheus
        .load_rules(
            "groups:\n  - name: harness\n    interval: 1s\n    rules:\n      - record: harness:answer\n        expr: vector(42)\n",
        )
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let answer = get(&prometheus, "/api/v1/query?query=harness:answer");
        if answer.contains("\"42\"") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rule never recorded: {answer}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let refused = prometheus.load_rules("groups:\n  - name: bad\n    rules:\n      - record: x\n");
    assert!(
        refused.is_err(),
        "a rule without an expression was accepted"
    );
}

/// The value of the sample `name` (no labels) on Prometheus' own `/metrics`.
fn own_metric(prometheus: &Prometheus, name: &str) -> f64 {
    let page = get(prometheus, "/metrics");
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} is not on /metrics"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn hours_of_days_old_samples_written_to_a_started_prometheus_start_no_compaction() {
    // Tests write days-old samples spanning hours and then query them. Prometheus compacts its
    // head once it spans 3 h; the harness anchors the head at the time it starts, so the old
    // samples land in the out-of-order head and nothing is compacted under the test's queries.
    let prometheus = Prometheus::start().unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    const MINUTE_MS: i64 = 60_000;
    let start = (now_ms - 2 * 24 * 60 * MINUTE_MS) / MINUTE_MS * MINUTE_MS;
    let samples: Vec<(i64, f64)> = (0..=60)
        .map(|i| (start + i * 10 * MINUTE_MS, i as f64))
        .collect();
    prometheus
        .write_samples("harness_old_samples", &samples)
        .unwrap();
    let end_s = (start + 600 * MINUTE_MS) / 1000;
    // A compaction is started right after the write that makes the head span 3 h; watch for one
    // for 3 s (a compaction of these few samples takes well under a second when it happens).
    for _ in 0..15 {
        assert_eq!(
            own_metric(&prometheus, "prometheus_tsdb_compactions_total"),
            0.0,
            "a compaction ran; log:\n{}",
            prometheus.log()
        );
        let answer = get(
            &prometheus,
            &format!(
                "/api/v1/query?query=count_over_time(harness_old_samples%5B601m%5D)&time={end_s}"
            ),
        );
        assert!(answer.contains("\"61\""), "{answer}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let head_min_ms = own_metric(&prometheus, "prometheus_tsdb_head_min_time");
    assert!(
        head_min_ms >= (now_ms - 60_000) as f64,
        "head begins at {head_min_ms}"
    );
}

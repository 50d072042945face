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

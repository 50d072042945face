//! Reading a Prometheus text exposition (the gateway's `/metrics`) over HTTP, as the gateway's
//! tests and benches and the demo read it.
//!
//! Invariants:
//! - A scrape never waits longer than its timeout, and a failed or timed-out scrape is `None`,
//!   never a partial body.
//! - A series is found by its whole name: `name` never matches `name_other`.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long to wait for the TCP connection of a scrape.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// The body of `GET /metrics` at `addr`, or `None` if nothing answers within `timeout`.
pub fn scrape(addr: SocketAddr, timeout: Duration) -> Option<String> {
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let body = response.split_once("\r\n\r\n")?.1;
    Some(body.to_owned())
}

/// The value of series `series` in Prometheus text: an unlabelled metric by its name, or a
/// labelled one written out in full (`name{label="value"}`).
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The sum of every labelled series of metric `name` (`name{...} value` lines).
pub fn sum_labelled(text: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{");
    text.lines()
        .filter(|line| line.starts_with(&prefix))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unlabelled_metric_is_read_and_a_longer_name_is_not_mistaken_for_it() {
        let text =
            "# HELP x\nedgewatch_gateway_events_total_other 3\nedgewatch_gateway_events_total 42\n";
        assert_eq!(value(text, "edgewatch_gateway_events_total"), Some(42.0));
        assert_eq!(value(text, "edgewatch_gateway_subscribed"), None);
    }

    #[test]
    fn a_labelled_series_is_read_in_full_and_a_family_sums_its_series() {
        let text = "m_total{reason=\"a\"} 2\nm_total{reason=\"b\"} 3\nm_total_other{x=\"y\"} 7\n";
        assert_eq!(value(text, "m_total{reason=\"b\"}"), Some(3.0));
        assert_eq!(sum_labelled(text, "m_total"), 5.0);
        assert_eq!(sum_labelled(text, "absent"), 0.0);
    }
}

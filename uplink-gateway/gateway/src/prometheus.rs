//! Reads raw samples back from a Prometheus-compatible HTTP query API: an instant query of a
//! range-vector selector `metric[<range>s]` at time `t` returns every raw sample in `(t − range, t]`,
//! which is what the SLO core consumes (the same shape as [`crate::store::Store::query`]).
//!
//! Invariants:
//! - Timestamps come back in milliseconds (Prometheus answers seconds with millisecond decimals;
//!   they are rounded, never truncated), labels sorted by name, `__name__` split off as the metric.
//! - Series are sorted by their labels, samples by time, so results compare equal to the embedded
//!   store's for the same data.

use std::time::Duration;

use crate::store::RawSeries;

/// Why a query failed.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The request failed or the server answered with an error status.
    #[error("querying {url}: {message}")]
    Http {
        /// URL queried.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The answer is not the JSON the API documents.
    #[error("unexpected answer from the query API: {0}")]
    Shape(String),
}

/// Raw samples of `metric` with `from_ms < ts <= to_ms`, read from the Prometheus at `base_url`
/// (e.g. `http://127.0.0.1:9090`).
pub fn query_raw(
    base_url: &str,
    metric: &str,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<RawSeries>, QueryError> {
    let range_ms = (to_ms - from_ms).max(1);
    let query = format!("{metric}[{range_ms}ms]");
    let time = format!("{}.{:03}", to_ms.div_euclid(1000), to_ms.rem_euclid(1000));
    let url = format!("{}/api/v1/query", base_url.trim_end_matches('/'));
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(60)))
        .http_status_as_error(false)
        .build()
        .new_agent();
    let http = |message: String| QueryError::Http {
        url: url.clone(),
        message,
    };
    let mut response = agent
        .get(&url)
        .query("query", &query)
        .query("time", &time)
        .call()
        .map_err(|error| http(error.to_string()))?;
    let status = response.status().as_u16();
    let body = response
        .body_mut()
        .with_config()
        .limit(512 * 1024 * 1024)
        .read_to_string()
        .map_err(|error| http(error.to_string()))?;
    if status != 200 {
        return Err(http(format!(
            "HTTP {status}: {}",
            body.chars().take(300).collect::<String>()
        )));
    }
    parse_matrix(&body)
}

/// Parses a `resultType: matrix` answer.
pub fn parse_matrix(body: &str) -> Result<Vec<RawSeries>, QueryError> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|error| QueryError::Shape(error.to_string()))?;
    let shape = |what: &str| QueryError::Shape(what.to_owned());
    if value["status"] != "success" {
        return Err(shape("status is not success"));
    }
    let result = value["data"]["result"]
        .as_array()
        .ok_or_else(|| shape("no data.result array"))?;
    let mut out = Vec::with_capacity(result.len());
    for series in result {
        let labels_json = series["metric"]
            .as_object()
            .ok_or_else(|| shape("a series has no metric object"))?;
        let mut metric = String::new();
        let mut labels = Vec::with_capacity(labels_json.len());
        for (name, value) in labels_json {
            let value = value
                .as_str()
                .ok_or_else(|| shape("a label value is not a string"))?;
            if name == "__name__" {
                metric = value.to_owned();
            } else {
                labels.push((name.clone(), value.to_owned()));
            }
        }
        labels.sort();
        let values = series["values"]
            .as_array()
            .ok_or_else(|| shape("a series has no values array (not a range vector?)"))?;
        let mut samples = Vec::with_capacity(values.len());
        for pair in values {
            let ts = pair[0]
                .as_f64()
                .ok_or_else(|| shape("a timestamp is not a number"))?;
            let v: f64 = pair[1]
                .as_str()
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| shape("a value is not a numeric string"))?;
            samples.push(((ts * 1000.0).round() as i64, v));
        }
        samples.sort_by_key(|&(ts, _)| ts);
        out.push(RawSeries {
            metric,
            labels,
            samples,
        });
    }
    out.sort_by(|a, b| (&a.metric, &a.labels).cmp(&(&b.metric, &b.labels)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_matrix_answer_becomes_sorted_raw_series_in_milliseconds() {
        let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"__name__":"m","site":"s","machine_id":"b"},"values":[[1700000000.123,"5"],[1699999999.5,"4"]]},
            {"metric":{"__name__":"m","site":"s","machine_id":"a"},"values":[[1700000000,"1"]]}]}}"#;
        let series = parse_matrix(body).unwrap();
        assert_eq!(series.len(), 2);
        assert_eq!(series[0].labels[0], ("machine_id".into(), "a".into()));
        assert_eq!(series[1].metric, "m");
        assert_eq!(
            series[1].samples,
            vec![(1_699_999_999_500, 4.0), (1_700_000_000_123, 5.0)]
        );
    }

    #[test]
    fn an_error_answer_is_refused() {
        assert!(parse_matrix(r#"{"status":"error","error":"bad"}"#).is_err());
        assert!(parse_matrix("not json").is_err());
    }
}

//! Reads raw samples back from a Prometheus-compatible HTTP query API: an instant query of a
//! range-vector selector `metric[<range>s]` at time `t` returns every raw sample in `(t − range, t]`,
//! which is what the SLO core consumes (the same shape as [`crate::store::Store::query`]); and
//! `last_over_time(metric[<range>])` at `t`, the latest value of each series in that range, for
//! the fleet view (see [`edgewatch_slo::fleet::Read::Latest`]).
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
    query_raw_of(base_url, metric, None, from_ms, to_ms)
}

/// [`query_raw`] of one machine's series when `machine` is given.
pub fn query_raw_of(
    base_url: &str,
    metric: &str,
    machine: Option<&str>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<RawSeries>, QueryError> {
    let range_ms = (to_ms - from_ms).max(1);
    let query = format!("{}[{range_ms}ms]", selector(metric, machine));
    parse_matrix(&instant_query(base_url, &query, to_ms)?)
}

/// Per series of `metric` (of one machine when `machine` is given), the value of its latest
/// sample with `from_ms < ts <= to_ms`, stamped `to_ms`: PromQL's `last_over_time` gives the
/// value only.
pub fn query_latest(
    base_url: &str,
    metric: &str,
    machine: Option<&str>,
    from_ms: i64,
    to_ms: i64,
) -> Result<Vec<RawSeries>, QueryError> {
    let range_ms = (to_ms - from_ms).max(1);
    let query = format!(
        "last_over_time({}[{range_ms}ms])",
        selector(metric, machine)
    );
    parse_vector(&instant_query(base_url, &query, to_ms)?, metric, to_ms)
}

/// `metric`, or `metric{machine_id="<machine>"}` with the value escaped as a PromQL string.
fn selector(metric: &str, machine: Option<&str>) -> String {
    let Some(machine) = machine else {
        return metric.to_owned();
    };
    let mut out = format!("{metric}{{{}=\"", edgewatch_slo::names::label::MACHINE_ID);
    for c in machine.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            _ => out.push(c),
        }
    }
    out.push_str("\"}");
    out
}

/// Runs an instant query at `time_ms`; returns the answer's body.
fn instant_query(base_url: &str, query: &str, time_ms: i64) -> Result<String, QueryError> {
    let time = format!(
        "{}.{:03}",
        time_ms.div_euclid(1000),
        time_ms.rem_euclid(1000)
    );
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
        .query("query", query)
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
    Ok(body)
}

/// The JSON answer's `data.result`, after checking its status and type.
fn result<'a>(
    value: &'a serde_json::Value,
    kind: &str,
) -> Result<&'a Vec<serde_json::Value>, QueryError> {
    let shape = |what: &str| QueryError::Shape(what.to_owned());
    if value["status"] != "success" {
        return Err(shape("status is not success"));
    }
    if value["data"]["resultType"] != kind {
        return Err(QueryError::Shape(format!("the result is not a {kind}")));
    }
    value["data"]["result"]
        .as_array()
        .ok_or_else(|| shape("no data.result array"))
}

/// A series' labels, sorted by name, with `__name__` split off (empty when absent).
fn series_labels(
    series: &serde_json::Value,
) -> Result<(String, Vec<(String, String)>), QueryError> {
    let shape = |what: &str| QueryError::Shape(what.to_owned());
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
    Ok((metric, labels))
}

/// A sample value: Prometheus writes numbers as strings.
fn sample_value(value: &serde_json::Value) -> Result<f64, QueryError> {
    value
        .as_str()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| QueryError::Shape("a value is not a numeric string".to_owned()))
}

/// Parses a `resultType: vector` answer of a query about `metric` (functions drop the name)
/// into one sample per series, stamped `at_ms`.
pub fn parse_vector(body: &str, metric: &str, at_ms: i64) -> Result<Vec<RawSeries>, QueryError> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|error| QueryError::Shape(error.to_string()))?;
    let mut out = Vec::new();
    for series in result(&value, "vector")? {
        let (_, labels) = series_labels(series)?;
        let v = sample_value(&series["value"][1])?;
        out.push(RawSeries {
            metric: metric.to_owned(),
            labels,
            samples: vec![(at_ms, v)],
        });
    }
    out.sort_by(|a, b| a.labels.cmp(&b.labels));
    Ok(out)
}

/// Parses a `resultType: matrix` answer.
pub fn parse_matrix(body: &str) -> Result<Vec<RawSeries>, QueryError> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|error| QueryError::Shape(error.to_string()))?;
    let shape = |what: &str| QueryError::Shape(what.to_owned());
    let result = result(&value, "matrix")?;
    let mut out = Vec::with_capacity(result.len());
    for series in result {
        let (metric, labels) = series_labels(series)?;
        let values = series["values"]
            .as_array()
            .ok_or_else(|| shape("a series has no values array (not a range vector?)"))?;
        let mut samples = Vec::with_capacity(values.len());
        for pair in values {
            let ts = pair[0]
                .as_f64()
                .ok_or_else(|| shape("a timestamp is not a number"))?;
            samples.push(((ts * 1000.0).round() as i64, sample_value(&pair[1])?));
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
    fn a_vector_answer_becomes_one_sample_per_series_at_the_evaluation_time() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"site":"s","machine_id":"<b>"},"value":[1700000000.5,"1700000000.123"]}]}}"#;
        let series = parse_vector(body, "m", 1_800_000_000_000).unwrap();
        assert_eq!(series[0].metric, "m");
        assert_eq!(series[0].labels[0], ("machine_id".into(), "<b>".into()));
        assert_eq!(
            series[0].samples,
            vec![(1_800_000_000_000, 1_700_000_000.123)]
        );
        assert!(parse_vector(body.replace("vector", "matrix").as_str(), "m", 0).is_err());
    }

    #[test]
    fn a_machine_is_selected_with_its_id_escaped_as_a_promql_string() {
        assert_eq!(selector("m", None), "m");
        assert_eq!(
            selector("m", Some("a\"b\\c")),
            "m{machine_id=\"a\\\"b\\\\c\"}"
        );
    }

    #[test]
    fn an_error_answer_is_refused() {
        assert!(parse_matrix(r#"{"status":"error","error":"bad"}"#).is_err());
        assert!(parse_matrix("not json").is_err());
    }
}

//! The fleet page over HTTP, served by the real binary from a store filled through the real
//! ingest path with chosen arrival times: every view answers GET and HEAD with the strict
//! security headers and refuses other methods; the overview's figures are `report --json`'s at
//! the same `?at=`, exactly; the partitioned machine is listed offline while it is, and only
//! then; each sort link orders the machines as `fleet --sort` does; label values a crafted
//! store holds are shown as text.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

#[path = "page/fleet.rs"]
mod fleet;
mod util;

use edgewatch_gateway::series::SeriesKey;
use edgewatch_gateway::store::Store;
use edgewatch_slo::format_rfc3339;
use edgewatch_slo::names::{label, metric};
use fleet::*;
use serde_json::Value;

const VIEWS: [&str; 6] = [
    "/",
    "/machines",
    "/machines/truck-18",
    "/rollouts",
    "/cost",
    "/style.css",
];

#[test]
fn every_view_answers_get_and_head_with_strict_headers_and_refuses_other_methods() {
    let f = fixture();
    let q = at(f.story.during());
    for view in VIEWS {
        let target = format!("{view}?{q}");
        let get = request(f.page.addr, "GET", &target);
        assert_eq!(get.status, "HTTP/1.1 200 OK", "{view}: {}", get.body);
        let csp = get.header("Content-Security-Policy").unwrap();
        for directive in [
            "default-src 'none'",
            "style-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{view}: {csp}");
        }
        assert!(
            !csp.contains("script-src"),
            "no script is ever allowed: {csp}"
        );
        assert_eq!(get.header("X-Content-Type-Options"), Some("nosniff"));
        assert_eq!(get.header("Referrer-Policy"), Some("no-referrer"));
        if view != "/style.css" {
            assert!(get.body.starts_with("<!DOCTYPE html>"), "{view}");
            assert!(!get.body.contains("<script"), "{view}");
            assert!(!get.body.contains(" style=\""), "{view}: no inline style");
            assert!(
                !get.body.contains("http://") && !get.body.contains("https://"),
                "{view}: no external asset"
            );
        }
        let head = request(f.page.addr, "HEAD", &target);
        assert_eq!(head.status, get.status);
        assert_eq!(head.body, "", "{view}");
        assert_eq!(head.header("Content-Length"), get.header("Content-Length"));
        for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            let reply = request(f.page.addr, method, &target);
            assert_eq!(
                reply.status, "HTTP/1.1 405 Method Not Allowed",
                "{method} {view}"
            );
            assert_eq!(reply.header("Allow"), Some("GET, HEAD"));
        }
    }
    assert_eq!(
        request(f.page.addr, "GET", "/nowhere").status,
        "HTTP/1.1 404 Not Found"
    );
    let bad = request(f.page.addr, "GET", "/?at=yesterday%3Cb%3E");
    assert_eq!(bad.status, "HTTP/1.1 400 Bad Request");
    assert!(bad.body.contains("yesterday&lt;b&gt;"), "{}", bad.body);
}

/// `(field, exact value)` of every figure of overview row `i`.
fn row_figures(html: &str, i: usize) -> Vec<(String, String)> {
    let start = html.find(&format!("<tr data-row=\"{i}\">")).unwrap();
    let row = &html[start..start + html[start..].find("</tr>").unwrap()];
    let fields = attributes(row, "data-field");
    let mut out = Vec::new();
    for cell in row.split("<td").skip(1) {
        let field = attributes(&format!(" {cell}"), "data-field");
        let values = attributes(&format!(" {cell}"), "data-value");
        if let (Some(field), Some(value)) = (field.first(), values.first()) {
            out.push((field.clone(), value.clone()));
        }
        for name in ["data-long", "data-short"] {
            if let Some(v) = attributes(&format!(" {cell}"), name).first() {
                out.push((
                    format!(
                        "{}:{name}",
                        attributes(&format!(" {cell}"), "data-window")[0]
                    ),
                    v.clone(),
                ));
            }
        }
    }
    assert!(!fields.is_empty());
    out
}

fn f64_of(text: &str) -> f64 {
    text.parse().unwrap()
}

#[test]
fn the_overview_shows_exactly_the_figures_of_report_json_at_the_same_instant() {
    let f = fixture();
    for instant in [f.story.before(), f.story.during(), f.story.end] {
        let html = get(f.page.addr, &format!("/?{}", at(instant)));
        let report: Value = serde_json::from_str(&command(
            &f.config,
            &["report", "--json", "--at", &format_rfc3339(instant)],
        ))
        .unwrap();
        let rows = report["slo"]["rows"].as_array().unwrap();
        assert!(rows.len() >= 4, "{report:#}");
        assert!(
            html.contains(&format!(
                "<h2>SLOs at {}</h2>",
                report["slo"]["evaluated_at"].as_str().unwrap()
            )),
            "same instant"
        );
        assert!(
            !html.contains(&format!("<tr data-row=\"{}\">", rows.len())),
            "no extra row"
        );
        let mut compared = 0;
        for (i, row) in rows.iter().enumerate() {
            let figures = row_figures(&html, i);
            let value = |field: &str| {
                figures
                    .iter()
                    .find(|(f, _)| f == field)
                    .map(|(_, v)| f64_of(v))
            };
            assert_eq!(
                value("objective_percent"),
                row["objective_percent"].as_f64()
            );
            assert_eq!(value("compliance"), row["compliance"].as_f64(), "row {i}");
            assert_eq!(
                value("budget_remaining"),
                row["budget_remaining"].as_f64(),
                "row {i}"
            );
            for burn in row["burn_rates"].as_array().unwrap() {
                let window = burn["window"].as_str().unwrap();
                assert_eq!(
                    value(&format!("{window}:data-long")),
                    burn["long"].as_f64(),
                    "row {i} {window}"
                );
                assert_eq!(
                    value(&format!("{window}:data-short")),
                    burn["short"].as_f64(),
                    "row {i} {window}"
                );
                compared += 2;
            }
            assert_eq!(value("data"), row["incomplete"].as_f64(), "row {i}");
            // The row is the report's: its SLO, group, alerts and policy.
            let start = html.find(&format!("<tr data-row=\"{i}\">")).unwrap();
            let tr = &html[start..start + html[start..].find("</tr>").unwrap()];
            let text = unescape(tr);
            for key in ["slo", "machine_class", "site", "model", "model_version"] {
                let v = row[key].as_str().unwrap();
                assert!(
                    text.contains(&format!(">{}<", if v.is_empty() { "-" } else { v })),
                    "row {i} {key}"
                );
            }
            let alerts: Vec<&str> = row["alerts_firing"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect();
            if !alerts.is_empty() {
                assert!(text.contains(&alerts.join(", ")), "row {i} alerts");
            }
            compared += 3;
        }
        assert!(compared > 20);
        if instant == f.story.end {
            assert!(
                rows.iter()
                    .any(|r| r["incomplete"].as_u64().is_some_and(|n| n > 0)),
                "the refused event makes rows incomplete: {report:#}"
            );
            assert!(html.contains("incomplete: "));
        }
    }
}

fn statuses(html: &str) -> Vec<(String, String)> {
    let machines = attributes(html, "data-machine");
    let status: Vec<String> = html
        .match_indices("data-field=\"status\" data-value=\"")
        .map(|(at, _)| {
            let rest = &html[at + 32..];
            rest[..rest.find('"').unwrap()].to_owned()
        })
        .collect();
    assert_eq!(machines.len(), status.len());
    machines.into_iter().zip(status).collect()
}

#[test]
fn the_partitioned_machine_is_listed_offline_while_it_is_and_only_then() {
    let f = fixture();
    let status_at = |instant: i64| {
        statuses(&get(
            f.page.addr,
            &format!("/machines?sort=machine&{}", at(instant)),
        ))
    };
    let s = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(
        status_at(f.story.before()),
        vec![
            s("truck-17", "online"),
            s("truck-18", "online"),
            s("truck-19", "unknown")
        ]
    );
    assert_eq!(
        status_at(f.story.during()),
        vec![
            s("truck-17", "online"),
            s("truck-18", "offline"),
            s("truck-19", "unknown")
        ]
    );
    assert_eq!(
        status_at(f.story.offline + 2000),
        vec![
            s("truck-17", "online"),
            s("truck-18", "offline"),
            s("truck-19", "unknown")
        ],
        "offline from its last will's arrival"
    );
    assert_eq!(
        status_at(f.story.after()),
        vec![
            s("truck-17", "online"),
            s("truck-18", "online"),
            s("truck-19", "unknown")
        ]
    );
    let during = get(f.page.addr, &format!("/machines?{}", at(f.story.during())));
    assert!(during.contains("<tr data-machine=\"truck-18\" class=\"offline\">"));
    // The detail lists the partition with its exact ends.
    let detail = get(
        f.page.addr,
        &format!("/machines/truck-18?{}", at(f.story.after())),
    );
    assert!(
        detail.contains(&format!(
            "<tr><td>{}</td><td>{}</td>",
            format_rfc3339(f.story.offline + 2000),
            format_rfc3339(f.story.online_again + 500)
        )),
        "{detail}"
    );
}

#[test]
fn each_sort_link_orders_the_machines_as_fleet_sort_does() {
    let f = fixture();
    let instant = f.story.during();
    let html = get(f.page.addr, &format!("/machines?{}", at(instant)));
    let links = attributes(&html, "data-sort");
    assert_eq!(links.len(), 11);
    // Silent for longest first by default: truck-19 (once, at the start), then truck-18.
    assert_eq!(
        attributes(&html, "data-machine")[..2],
        ["truck-19", "truck-18"]
    );
    for key in links {
        let href = format!("/machines?sort={key}&{}", at(instant));
        assert!(
            html.contains(&format!("href=\"{}\"", href.replace('&', "&amp;"))),
            "{href}"
        );
        let page_order = attributes(&get(f.page.addr, &href), "data-machine");
        let table: Value = serde_json::from_str(&command(
            &f.config,
            &[
                "fleet",
                "--json",
                "--sort",
                &key,
                "--at",
                &format_rfc3339(instant),
            ],
        ))
        .unwrap();
        let cli_order: Vec<String> = table["machines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["machine_id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(page_order, cli_order, "sort={key}");
    }
    assert_eq!(
        request(f.page.addr, "GET", "/machines?sort=nonsense").status,
        "HTTP/1.1 400 Bad Request"
    );
}

#[test]
fn label_values_of_a_crafted_store_are_shown_as_text() {
    // Ingest refuses such ids: these series are written into a store directly.
    let machine = "<script>alert(\"fleet\")</script>";
    let site = "<img src=x onerror=alert(1)>";
    let version = "</td><td onclick=\"x\">";
    let dir = tempfile::tempdir().unwrap();
    let store_path = dir.path().join("store.redb");
    let at_ms = now_ms() - 60_000;
    {
        let store = Store::open_path(&store_path).unwrap();
        let base = [
            (label::MACHINE_ID, machine),
            (label::SITE, site),
            (label::MACHINE_CLASS, "a&b'c"),
        ];
        let key = |metric: &str, extra: &[(&'static str, &'static str)]| {
            let mut labels = base.to_vec();
            labels.extend_from_slice(extra);
            SeriesKey::build(metric, &mut labels)
        };
        let samples = [
            (
                key(metric::MACHINE_LAST_ARRIVAL, &[]),
                at_ms / 1000 * 1000,
                (at_ms / 1000) as f64,
            ),
            (key(metric::MACHINE_ONLINE, &[]), at_ms / 1000 * 1000, 0.0),
            (
                key(
                    metric::MODEL_VERSION_LAST_EVENT,
                    &[
                        (label::MODEL, "<b>det</b>"),
                        (label::MODEL_VERSION, version),
                    ],
                ),
                at_ms / 1000 * 1000,
                (at_ms / 1000 - 5) as f64,
            ),
        ];
        store
            .write(|w| {
                for (series, ts, value) in &samples {
                    let id = w.series_id_or_create(series)?;
                    w.put_sample(id, *ts, *value)?;
                }
                Ok(())
            })
            .unwrap();
    }
    let config = config(dir.path(), &store_path);
    let page = PageServer::start(&config, &[]);
    let encoded: String = machine.bytes().map(|b| format!("%{b:02X}")).collect();
    for target in [
        "/machines".to_owned(),
        "/rollouts".to_owned(),
        "/".to_owned(),
        format!("/machines/{encoded}"),
    ] {
        let html = get(page.addr, &target);
        assert!(!html.contains("<script"), "{target}: {html}");
        assert!(!html.contains("<img"), "{target}");
        assert!(!html.contains("<b>det"), "{target}");
        assert!(!html.contains("onclick=\"x\""), "{target}");
        if target != "/" {
            assert!(
                html.contains("&lt;script&gt;alert(&quot;fleet&quot;)&lt;/script&gt;"),
                "{target}: {html}"
            );
        }
    }
    let machines = get(page.addr, "/machines");
    assert!(machines.contains("&lt;img src=x onerror=alert(1)&gt;"));
    assert!(machines.contains("&lt;/td&gt;&lt;td onclick=&quot;x&quot;&gt;"));
    assert!(machines.contains("a&amp;b&#39;c"));
    assert_eq!(attributes(&machines, "data-machine"), [machine]);
}

#[test]
fn the_cost_view_shows_the_report_of_the_same_days_per_class_site_and_version() {
    let f = fixture();
    let instant = f.story.end;
    let day = edgewatch_slo::MS_PER_DAY;
    let midnight = instant.div_euclid(day) * day;
    let (from, to) = (
        format_rfc3339(midnight - 29 * day)[..10].to_owned(),
        format_rfc3339(midnight + day)[..10].to_owned(),
    );
    let html = get(f.page.addr, &format!("/cost?{}", at(instant)));
    assert!(
        html.contains(&format!("UTC days from {from}T00:00:00Z to {to}T00:00:00Z")),
        "{html}"
    );
    let report: Value = serde_json::from_str(&command(
        &f.config,
        &[
            "report",
            "--json",
            "--at",
            &format_rfc3339(instant),
            "--from",
            &from,
            "--to",
            &to,
        ],
    ))
    .unwrap();
    let lines = report["cost"]["lines"].as_array().unwrap();
    assert!(!lines.is_empty());
    for (by, key) in [
        (
            "class",
            &(|l: &Value| l["machine_class"].as_str().unwrap().to_owned())
                as &dyn Fn(&Value) -> String,
        ),
        ("site", &|l: &Value| l["site"].as_str().unwrap().to_owned()),
        ("model_version", &|l: &Value| {
            format!(
                "{} {}",
                l["model"].as_str().unwrap(),
                l["model_version"].as_str().unwrap()
            )
        }),
    ] {
        // The report's lines summed per (day, key), in the report's order, as the page must.
        let mut expected: std::collections::BTreeMap<(i64, String), (f64, f64)> =
            Default::default();
        for l in lines {
            let total = l["amortization"].as_f64().unwrap()
                + l["energy"].as_f64().unwrap()
                + l["cloud_inference"].as_f64().unwrap()
                + l["training"].as_f64().unwrap();
            let cell = expected
                .entry((l["day_start_ms"].as_i64().unwrap(), key(l)))
                .or_default();
            cell.0 += total;
            cell.1 += l["autonomous_hours"].as_f64().unwrap();
        }
        let start = html.find(&format!("<table data-by=\"{by}\">")).unwrap();
        let table = &html[start..start + html[start..].find("</table>").unwrap()];
        let rows: Vec<&str> = table.split("<tr>").skip(2).collect();
        assert_eq!(rows.len(), expected.len(), "{by}");
        for (row, ((day_ms, name), (total, hours))) in rows.iter().zip(expected.iter().rev()) {
            assert!(
                row.starts_with(&format!(
                    "<td>{}</td><td>{}</td>",
                    &format_rfc3339(*day_ms)[..10],
                    name
                )),
                "{row}"
            );
            let values = attributes(&format!(" {row}"), "data-value");
            assert_eq!(values[0].parse::<f64>().unwrap(), *hours, "{by} {name}");
            assert_eq!(values[1].parse::<f64>().unwrap(), *total, "{by} {name}");
            if *hours > 0.0 {
                assert_eq!(
                    values[2].parse::<f64>().unwrap(),
                    total / hours,
                    "{by} {name}"
                );
            }
        }
    }
}

/// The figure of the overview's health list named `field`, as text.
fn health(html: &str, field: &str) -> String {
    let needle = format!("<dd data-field=\"{field}\">");
    let start = html.find(&needle).unwrap() + needle.len();
    let text = &html[start..start + html[start..].find("</dd>").unwrap()];
    unescape(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_gateway_serves_the_page_from_its_own_store_with_its_health() {
    use edgewatch_harness::mosquitto::Mosquitto;
    let broker = Mosquitto::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gateway = util::Gateway::start(
        dir.path(),
        &util::GatewaySpec::new(broker.addr(), "gw-page"),
    );
    let before = get(gateway.page, "/");
    assert!(
        health(&before, "subscribed").contains(">subscribed<"),
        "{before}"
    );
    assert_eq!(health(&before, "dead_letters"), "0 since start");
    assert_eq!(health(&before, "outbox"), "0 pending");
    let sent = util::now_ns() - util::HOUR_NS;
    let messages = vec![
        util::message(&util::slo_batch("truck-17", 1, 1, 3, sent)),
        (
            "edgewatch/v1/pit-3/truck-17/slo".to_owned(),
            b"not zstd".to_vec(),
        ),
    ];
    util::publish_all(broker.addr(), "agent-page", &messages).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == 2.0);
    // What was just committed is on the page once its answer for "now" is no longer reused
    // (NOW_REUSE after the first): it reads the store the ingest path writes. With `?at=`, at
    // once.
    let q = at(now_ms());
    let machines = get(gateway.page, &format!("/machines?{q}"));
    assert_eq!(attributes(&machines, "data-machine"), ["truck-17"]);
    assert!(
        get(gateway.page, &format!("/?{q}"))
            .contains("<dd data-field=\"dead_letters\">1 since start")
    );
    let deadline = std::time::Instant::now() + edgewatch_gateway::page::NOW_REUSE * 2;
    let after = loop {
        let after = get(gateway.page, "/");
        if health(&after, "dead_letters") == "1 since start" {
            break after;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never updated: {after}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let newest = health(&after, "newest_event");
    assert!(
        newest.starts_with(&format_rfc3339((sent + 2 * 10_000_000_000) / 1_000_000)),
        "{newest}"
    );
}

/// `(field, exact value)` of every figure of every overview row, in order.
fn all_figures(html: &str) -> Vec<Vec<(String, String)>> {
    (0..)
        .take_while(|i| html.contains(&format!("<tr data-row=\"{i}\">")))
        .map(|i| row_figures(html, i))
        .collect()
}

#[test]
fn from_prometheus_the_page_shows_what_it_shows_from_the_store() {
    let prometheus = edgewatch_harness::prometheus::Prometheus::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store.redb");
    let story = fill_and_write(&store, now_ms(), Some(&prometheus.remote_write_url()));
    let config = config(dir.path(), &store);
    let from_store = PageServer::start(&config, &[]);
    let url = prometheus.base_url();
    let from_prometheus = PageServer::start(&config, &["--prometheus", &url]);
    for instant in [story.before(), story.during(), story.after()] {
        let q = at(instant);
        let store_overview = get(from_store.addr, &format!("/?{q}"));
        let prometheus_overview = get(from_prometheus.addr, &format!("/?{q}"));
        let figures = all_figures(&prometheus_overview);
        assert!(figures.len() >= 4, "{prometheus_overview}");
        assert_eq!(figures, all_figures(&store_overview), "at {instant}");
        // And they are `report --json --prometheus`'s.
        let report: Value = serde_json::from_str(&command(
            &config,
            &[
                "report",
                "--json",
                "--at",
                &format_rfc3339(instant),
                "--prometheus",
                &url,
            ],
        ))
        .unwrap();
        for (row, expected) in figures
            .iter()
            .zip(report["slo"]["rows"].as_array().unwrap())
        {
            let value = |field: &str| {
                row.iter()
                    .find(|(f, _)| f == field)
                    .map(|(_, v)| v.parse::<f64>().unwrap())
            };
            assert_eq!(value("compliance"), expected["compliance"].as_f64());
            assert_eq!(
                value("budget_remaining"),
                expected["budget_remaining"].as_f64()
            );
        }
        for view in [
            "/machines?sort=machine&",
            "/rollouts?",
            "/machines/truck-18?",
        ] {
            let target = format!("{view}{q}");
            assert_eq!(
                get(from_store.addr, &target),
                get(from_prometheus.addr, &target),
                "{target}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stopped_after_serving_the_page_leaves_its_store_closed_cleanly() {
    // The page holds the store the ingest path writes; a store not closed when the gateway
    // stops needs a repair that a read-only open (report, page) cannot make.
    use edgewatch_harness::mosquitto::Mosquitto;
    let broker = Mosquitto::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut gateway = util::Gateway::start(
        dir.path(),
        &util::GatewaySpec::new(broker.addr(), "gw-close"),
    );
    let sent = util::now_ns() - util::HOUR_NS;
    let messages = vec![util::message(&util::slo_batch("truck-17", 1, 1, 3, sent))];
    util::publish_all(broker.addr(), "agent-close", &messages).await;
    gateway.wait_metric("edgewatch_gateway_messages_acked_total", |v| v == 1.0);
    for view in ["/", "/machines", "/machines/truck-17", "/rollouts", "/cost"] {
        get(gateway.page, view);
    }
    gateway.stop();
    Store::open_read_only(&gateway.store_path()).unwrap();
}

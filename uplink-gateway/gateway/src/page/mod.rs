//! The fleet page: server-rendered HTML views of the SLO report, the machines table, one
//! machine, the rollouts and the cost, served read-only over [`crate::http`].
//!
//! ```text
//! GET /path?at=&sort= ─▶ route ─▶ needs (SLO/fleet/cost cores) ─▶ Source (store | Prometheus)
//!                                 ─▶ reports ─▶ views (pure HTML) ─▶ Response + security headers
//! ```
//!
//! Invariants:
//! - Read-only: GET and HEAD only (anything else is 405 in [`crate::http`]); nothing here
//!   writes to the store.
//! - The overview's rows are [`Source::slo_report`] at the page's instant, the code path of
//!   `report --json`, so the page and the report give the same numbers for the same `?at=`.
//! - Every response carries [`SECURITY_HEADERS`]: a CSP that allows no script, no frame, no
//!   external asset, only the same-origin stylesheet.
//! - Reads and rendering run on tokio's blocking pool one request at a time (the store and the
//!   Prometheus client block), never on the tasks that accept connections: requests wait their
//!   turn, the page never takes more than one core.

pub mod html;
pub mod views;

use std::sync::Arc;

use edgewatch_slo::fleet::{self, FleetQuery, SortKey};
use edgewatch_slo::{Catalog, PriceBook, SloReport};

use crate::http::{self, Request, Response, percent_decode};
use crate::metrics::Metrics;
use crate::source::{Source, SourceError, default_cost_period};
use html::Html;
use views::{At, Health, Newest, View};

/// The page's Content-Security-Policy: nothing but same-origin styles and images, no script,
/// no framing, forms only to this origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Headers on every page response.
pub const SECURITY_HEADERS: [(&str, &str); 4] = [
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
];

/// How long the sparklines' past points are reused before they are read again: a page refreshed
/// every second then costs one SLO report per refresh, not thirteen, and data arriving late
/// (a machine back from a partition) shows in the past points within this time.
pub const SPARK_REUSE: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a view asked for without `?at=` (the instant "now") is answered again as it was:
/// a page refreshed every second then reads and computes once per this time, not once per
/// refresh, and the ingest path keeps its rate (docs/benchmarks.md, "Fleet page"). The answer
/// says the instant it is of.
pub const NOW_REUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// A view answered for "now": its instant, when, and the answer.
type NowAnswer = (i64, std::time::Instant, &'static str, Option<View>, Html);

/// What the page reads and how.
pub struct Page {
    /// Where samples come from.
    source: Source,
    /// The SLO catalog of the overview and the rollouts.
    catalog: Catalog,
    /// The price book of the cost view, when configured.
    prices: Option<PriceBook>,
    /// The ingesting gateway's counters, when this process is that gateway.
    metrics: Option<Arc<Metrics>>,
    /// The sparklines' past points, once computed.
    sparks: std::sync::Mutex<Option<SparkPoints>>,
    /// The latest answer for "now" of each view and order (not machine details: their number
    /// grows with the fleet), keyed by path and `?sort=`.
    now_answers: std::sync::Mutex<std::collections::HashMap<String, NowAnswer>>,
}

/// The sparklines' past points: their grid instant, when they were computed, the reports.
type SparkPoints = (i64, std::time::Instant, Arc<Vec<SloReport>>);

fn respond(status: &'static str, content_type: &str, body: String) -> Response {
    let mut headers: Vec<(&'static str, String)> = SECURITY_HEADERS
        .iter()
        .map(|(name, value)| (*name, (*value).to_owned()))
        .collect();
    headers.push(("Content-Type", content_type.to_owned()));
    Response {
        status,
        headers,
        body,
    }
}

fn html_page(
    status: &'static str,
    title: &str,
    view: Option<View>,
    at: &At,
    path: &str,
    body: &Html,
) -> Response {
    respond(
        status,
        "text/html; charset=utf-8",
        views::document(title, view, at, path, body),
    )
}

impl Page {
    /// The page over `source`; `metrics` when this process is the ingesting gateway.
    pub fn new(
        source: Source,
        catalog: Catalog,
        prices: Option<PriceBook>,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        Self {
            source,
            catalog,
            prices,
            metrics,
            sparks: std::sync::Mutex::new(None),
            now_answers: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Answers one GET or HEAD at wall-clock time `now_ms` (the instant when `?at=` is absent).
    /// Blocking: it reads the source.
    pub fn handle(&self, request: &Request, now_ms: i64) -> Response {
        if request.path == views::STYLESHEET_PATH {
            return respond(
                "200 OK",
                "text/css; charset=utf-8",
                views::STYLESHEET.to_owned(),
            );
        }
        if request.path == views::ICON_PATH || request.path == "/favicon.ico" {
            return respond("200 OK", "image/svg+xml", views::ICON.to_owned());
        }
        let path = request.path.as_str();
        let given = request.param("at").filter(|t| !t.is_empty());
        let at = match &given {
            Some(text) => match edgewatch_slo::parse_rfc3339(text) {
                Some(ms) => At {
                    given: given.clone(),
                    ms,
                },
                None => {
                    let now = At {
                        given: None,
                        ms: now_ms,
                    };
                    return html_page(
                        "400 Bad Request",
                        "Bad instant",
                        None,
                        &now,
                        path,
                        &views::message(
                            "Bad instant",
                            &format!("`{text}` is not RFC 3339 UTC, e.g. 2026-12-01T08:00:00Z."),
                        ),
                    );
                }
            },
            None => At {
                given: None,
                ms: now_ms,
            },
        };
        // "Now" (no `?at=`) of a view other than a machine's detail: reuse a recent answer.
        // Keys stay few: the views, and the machines table's valid orders (an invalid one is
        // refused before any answer is kept).
        let reuse_key = (given.is_none() && !path.starts_with("/machines/")).then(|| {
            match (path, request.param("sort")) {
                ("/machines", Some(sort)) => format!("{path}?{sort}"),
                _ => path.to_owned(),
            }
        });
        if let Some(key) = &reuse_key
            && let Ok(answers) = self.now_answers.lock()
            && let Some((ms, computed, title, view, body)) = answers.get(key)
            && computed.elapsed() < NOW_REUSE
        {
            let at = At {
                given: None,
                ms: *ms,
            };
            return html_page("200 OK", title, *view, &at, path, body);
        }
        let result = match path {
            "/" => self
                .overview(&at)
                .map(|body| ("Overview", Some(View::Overview), body)),
            "/machines" => {
                let sort = match request.param("sort").filter(|s| !s.is_empty()) {
                    None => Ok(SortKey::default()),
                    Some(text) => text.parse::<SortKey>(),
                };
                match sort {
                    Ok(sort) => self
                        .machines(&at, sort)
                        .map(|body| ("Machines", Some(View::Machines), body)),
                    Err(error) => {
                        return html_page(
                            "400 Bad Request",
                            "Bad order",
                            Some(View::Machines),
                            &at,
                            path,
                            &views::message("Bad order", &error.to_string()),
                        );
                    }
                }
            }
            "/rollouts" => self
                .rollouts(&at)
                .map(|body| ("Rollouts", Some(View::Rollouts), body)),
            "/cost" => self.cost(&at).map(|body| ("Cost", Some(View::Cost), body)),
            _ => match path.strip_prefix("/machines/") {
                Some(id) if !id.is_empty() && !id.contains('/') => {
                    let id = percent_decode(id);
                    self.machine(&at, &id)
                        .map(|body| ("Machine", Some(View::Machines), body))
                }
                _ => {
                    return html_page(
                        "404 Not Found",
                        "Not found",
                        None,
                        &at,
                        "/",
                        &views::message("Not found", &format!("No page at {path}.")),
                    );
                }
            },
        };
        match result {
            Ok((title, view, body)) => {
                let response = html_page("200 OK", title, view, &at, path, &body);
                if let Some(key) = reuse_key
                    && let Ok(mut answers) = self.now_answers.lock()
                {
                    answers.insert(key, (at.ms, std::time::Instant::now(), title, view, body));
                }
                response
            }
            Err(error) => {
                tracing::warn!(%error, path, "The fleet page could not read its samples.");
                html_page(
                    "503 Service Unavailable",
                    "Samples unavailable",
                    None,
                    &at,
                    path,
                    &views::message(
                        "Samples unavailable",
                        &format!("Reading samples failed: {error}"),
                    ),
                )
            }
        }
    }

    fn query(&self, at: &At) -> FleetQuery {
        FleetQuery::at(at.ms, self.catalog.lookback_ms)
    }

    fn table(&self, at: &At, sort: SortKey) -> Result<fleet::FleetTable, SourceError> {
        let query = self.query(at);
        let set = self.source.fleet_set(&fleet::table_needs(&query))?;
        Ok(fleet::table(&set, &query, sort))
    }

    /// The span of the overview's sparklines: the catalog's longest alert window.
    fn spark_span_ms(&self) -> i64 {
        self.catalog
            .alert_windows
            .iter()
            .map(|w| w.long_ms)
            .max()
            .unwrap_or(3_600_000)
    }

    /// The SLO reports of the sparklines' past points, oldest first: at the
    /// [`views::SPARK_POINTS`]` − 1` instants of a grid of step `span / (points − 1)` at or before
    /// `at_ms` (so they stay the same while `at` moves within a step), from one read of the needs
    /// widened by the span; reused for [`SPARK_REUSE`]. The newest point is the overview's own
    /// report at `at`.
    fn spark_reports(&self, at_ms: i64) -> Result<Arc<Vec<SloReport>>, SourceError> {
        let span = self.spark_span_ms();
        let past = (views::SPARK_POINTS - 1) as i64;
        let step = (span / past).max(1);
        let grid = at_ms.div_euclid(step) * step;
        if let Ok(cache) = self.sparks.lock()
            && let Some((at, computed, reports)) = cache.as_ref()
            && *at == grid
            && computed.elapsed() < SPARK_REUSE
        {
            return Ok(Arc::clone(reports));
        }
        let needs = edgewatch_slo::required_series(&self.catalog, grid);
        let set = self.source.series_set(
            needs
                .iter()
                .map(|n| (n.metric, n.range_ms + span, n.end_ms)),
        )?;
        let reports = Arc::new(
            (0..past)
                .rev()
                .map(|k| edgewatch_slo::evaluate(&self.catalog, &set, grid - k * step))
                .collect::<Vec<_>>(),
        );
        if let Ok(mut cache) = self.sparks.lock() {
            *cache = Some((grid, std::time::Instant::now(), Arc::clone(&reports)));
        }
        Ok(reports)
    }

    fn overview(&self, at: &At) -> Result<Html, SourceError> {
        let report = self.source.slo_report(&self.catalog, at.ms)?;
        let mut points: Vec<SloReport> = self.spark_reports(at.ms)?.as_ref().clone();
        points.push(report.clone());
        let sparks = views::sparks(&points);
        let table = self.table(at, SortKey::default())?;
        let health = self.metrics.as_deref().map(health_of);
        let span = self
            .catalog
            .alert_windows
            .iter()
            .max_by_key(|w| w.long_ms)
            .map_or_else(
                || "1h".to_owned(),
                |w| w.label().split('/').next().unwrap_or_default().to_owned(),
            );
        Ok(views::overview(
            &report,
            &sparks,
            &span,
            health.as_ref(),
            Newest::of(&table),
            at,
        ))
    }

    fn machines(&self, at: &At, sort: SortKey) -> Result<Html, SourceError> {
        let table = self.table(at, sort)?;
        Ok(views::machines(
            &table,
            sort,
            at,
            &edgewatch_proto::tier::NAMES,
        ))
    }

    fn machine(&self, at: &At, id: &str) -> Result<Html, SourceError> {
        let query = self.query(at);
        let set = self.source.fleet_set(&fleet::detail_needs(&query, id))?;
        let detail = fleet::detail(&set, &query, id, fleet::DEFAULT_DETAIL_BUCKETS);
        Ok(views::machine(&detail, at, &edgewatch_proto::tier::NAMES))
    }

    fn rollouts(&self, at: &At) -> Result<Html, SourceError> {
        let table = self.table(at, SortKey::Machine)?;
        let report = self.source.slo_report(&self.catalog, at.ms)?;
        Ok(views::rollouts(&table, &report, at))
    }

    fn cost(&self, at: &At) -> Result<Html, SourceError> {
        let report = match &self.prices {
            Some(book) => Some(self.source.cost_report(book, cost_period(at.ms))?),
            None => None,
        };
        Ok(views::cost(report.as_ref()))
    }
}

/// The cost view's period: the [`crate::source::DEFAULT_COST_DAYS`] UTC days up to and including
/// the day of `at_ms` (so today, so far, is on the page; `report`'s default period ends at the
/// midnight before).
pub fn cost_period(at_ms: i64) -> edgewatch_slo::Period {
    let mut period = default_cost_period(at_ms);
    period.start_ms += edgewatch_slo::MS_PER_DAY;
    period.end_ms += edgewatch_slo::MS_PER_DAY;
    period
}

/// The overview's health figures from the gateway's counters.
pub fn health_of(metrics: &Metrics) -> Health {
    use std::sync::atomic::Ordering::Relaxed;
    Health {
        subscribed: metrics.subscribed.load(Relaxed) == 1,
        last_commit_unix_s: metrics.last_commit_unix_s.load(Relaxed),
        outbox_pending: metrics.outbox_pending.load(Relaxed),
        dead_letters: metrics
            .rejected
            .iter()
            .map(|c| c.load(Relaxed))
            .sum::<u64>()
            + metrics.rw_refused.load(Relaxed),
    }
}

/// Serves the page on `listener` until the task is dropped; `clock` gives wall-clock Unix ms
/// (the instant of a request without `?at=`). Answers are computed on tokio's blocking pool one
/// at a time: the page never takes more than one core. (The page holds the store; on the pool,
/// it is dropped with the runtime, so the store closes cleanly when the gateway stops.)
pub async fn serve(listener: tokio::net::TcpListener, page: Arc<Page>, clock: fn() -> i64) {
    let one_at_a_time = Arc::new(tokio::sync::Semaphore::new(1));
    http::serve(listener, move |request: Request| {
        let page = Arc::clone(&page);
        let one_at_a_time = Arc::clone(&one_at_a_time);
        async move {
            let Ok(_turn) = one_at_a_time.acquire_owned().await else {
                return Response::text("503 Service Unavailable", "the page is stopping\n");
            };
            let now_ms = clock();
            tokio::task::spawn_blocking(move || page.handle(&request, now_ms))
                .await
                .unwrap_or_else(|_| {
                    Response::text("500 Internal Server Error", "the page failed\n")
                })
        }
    })
    .await;
}

//! `edgewatch-gateway`: the uplink gateway's command line.
//!
//! Subcommands:
//! - `run`: the service (MQTT in, embedded store and optional remote-write out);
//! - `report`: SLO report (and cost report when `[prices]` is set) from raw samples of the
//!   embedded store or, with `--prometheus`, of a Prometheus query API;
//! - `fleet`: the machines table (online state, last event and arrival, backlog, losses,
//!   throttled time, autonomous hours, model versions), or one machine's detail, from either
//!   source, through the fleet core the fleet page shares;
//! - `page`: the fleet page alone (read-only, no ingest), from the store beside a running
//!   gateway or from Prometheus (`run` serves the same page itself);
//! - `rules`: the SLO catalog as Prometheus recording and alerting rules;
//! - `dashboards`: Grafana dashboards for the same catalog and price book, with the provisioning
//!   files for them and their Prometheus data source;
//! - `export-focus`: FOCUS CSV rows of a cost period, with corrections for days already exported;
//! - `check-config`: validate a configuration file, print what it resolves to and list the
//!   deprecated keys it uses.
//!
//! Exit status 64 for a bad configuration or argument (the message names the key), 1 for other
//! failures.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use edgewatch_conventions::config::{ConfigError, EXIT_BAD_CONFIG};
use edgewatch_gateway::config::Config;
use edgewatch_gateway::run::now_ns;
use edgewatch_gateway::source::{DEFAULT_COST_DAYS, Source, default_cost_period};
use edgewatch_gateway::store::Store;
use edgewatch_slo::{MS_PER_DAY, Period};

#[derive(Parser)]
#[command(
    name = "edgewatch-gateway",
    version,
    about = "edgewatch uplink gateway"
)]
struct Cli {
    /// Configuration file (TOML).
    #[arg(
        long,
        short,
        global = true,
        default_value = "/etc/edgewatch/gateway.toml"
    )]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct PeriodArgs {
    /// First UTC day of the cost period (YYYY-MM-DD, inclusive); default: 30 days before `--to`.
    #[arg(long)]
    from: Option<String>,
    /// UTC day after the cost period (YYYY-MM-DD, exclusive); default: today.
    #[arg(long)]
    to: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway: subscribe, validate, de-duplicate, store, acknowledge.
    Run,
    /// Validate the configuration file and print the resolved settings.
    CheckConfig,
    /// SLO report (and cost report when [prices] is configured) from raw samples.
    Report {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
        /// Read samples from this Prometheus (e.g. http://127.0.0.1:9090) instead of the store.
        #[arg(long, value_name = "URL")]
        prometheus: Option<String>,
        /// Evaluation time (RFC 3339 UTC); default: now.
        #[arg(long)]
        at: Option<String>,
        #[command(flatten)]
        period: PeriodArgs,
    },
    /// The machines table (or, with --machine, one machine's detail) from the fleet series.
    Fleet {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Read samples from this Prometheus (e.g. http://127.0.0.1:9090) instead of the store.
        #[arg(long, value_name = "URL")]
        prometheus: Option<String>,
        /// Evaluation time (RFC 3339 UTC); default: now.
        #[arg(long)]
        at: Option<String>,
        /// Order of the machines: silent (silent for longest first), machine, class, site,
        /// model, online, last-event, backlog, losses, throttled, autonomy.
        #[arg(long, default_value = "silent")]
        sort: String,
        /// Throttled time and autonomous hours over this window before --at (the detail's
        /// range); default 1d.
        #[arg(long)]
        window: Option<String>,
        /// How far back the latest state of a machine is looked for; default 30d.
        #[arg(long)]
        lookback: Option<String>,
        /// One machine's detail instead of the table.
        #[arg(long, value_name = "ID")]
        machine: Option<String>,
    },
    /// Serve the fleet page only (read-only, no ingest), from the store beside a running
    /// gateway or from Prometheus.
    Page {
        /// Read samples from this Prometheus (e.g. http://127.0.0.1:9090) instead of the store.
        #[arg(long, value_name = "URL")]
        prometheus: Option<String>,
        /// Listen address instead of `[http] listen`.
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
    },
    /// Print the SLO catalog as Prometheus recording and alerting rules (YAML).
    Rules,
    /// Write Grafana dashboards for the catalog and price book, and their provisioning files.
    Dashboards {
        /// Directory to write: `dashboards/*.json`, `provisioning/dashboards/edgewatch.yaml`
        /// and `provisioning/datasources/edgewatch.yaml`.
        #[arg(long)]
        out: PathBuf,
        /// The Prometheus Grafana is to query (holding the gateway's series and the `rules`
        /// output), e.g. http://prometheus:9090.
        #[arg(long, value_name = "URL")]
        prometheus: String,
        /// uid of the provisioned data source, which every panel names.
        #[arg(long, default_value = edgewatch_slo::dashboards::DEFAULT_DATASOURCE_UID)]
        datasource_uid: String,
        /// The dashboards directory as Grafana sees it (the provider's path); default: the
        /// absolute path of `<out>/dashboards`.
        #[arg(long, value_name = "PATH")]
        dashboards_path: Option<String>,
    },
    /// Write FOCUS CSV rows for a cost period (needs [prices]).
    ExportFocus {
        /// Read samples from this Prometheus instead of the store.
        #[arg(long, value_name = "URL")]
        prometheus: Option<String>,
        /// FOCUS CSV file: rows already in it count as exported; new rows and corrections are
        /// appended. Default: print the new rows to stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Also write the companion table of autonomous machine-hours (the KPI denominator).
        #[arg(long)]
        autonomy_out: Option<PathBuf>,
        #[command(flatten)]
        period: PeriodArgs,
    },
}

/// A configuration or argument problem: exit 64.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct UsageError(#[from] ConfigError);

fn usage(key: &str, message: impl Into<String>) -> anyhow::Error {
    UsageError(ConfigError::new(key, message)).into()
}

fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        ConfigError::new(
            "--config",
            format!("cannot read {}: {error}", path.display()),
        )
    })?;
    Config::from_toml(&text)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match load(&cli.config) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("edgewatch-gateway: {error}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    match run(cli.command, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.downcast_ref::<UsageError>().is_some() => {
            eprintln!("edgewatch-gateway: {error:#}");
            ExitCode::from(EXIT_BAD_CONFIG)
        }
        Err(error) => {
            eprintln!("edgewatch-gateway: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn source(config: &Config, prometheus: Option<String>) -> anyhow::Result<Source> {
    Ok(match prometheus {
        Some(url) => Source::Prometheus(url),
        None => Source::Store(std::sync::Arc::new(
            Store::open_read_only(&config.store.path)
                .with_context(|| format!("opening the store {}", config.store.path.display()))?,
        )),
    })
}

fn day(key: &str, text: &str) -> anyhow::Result<i64> {
    let full = if text.len() == 10 {
        format!("{text}T00:00:00Z")
    } else {
        text.to_owned()
    };
    edgewatch_slo::parse_rfc3339(&full)
        .ok_or_else(|| usage(key, format!("`{text}` is not a UTC day (YYYY-MM-DD)")))
}

fn period(args: &PeriodArgs, now_ms: i64) -> anyhow::Result<Period> {
    let end = match &args.to {
        Some(text) => day("--to", text)?,
        None => default_cost_period(now_ms).end_ms,
    };
    let start = match &args.from {
        Some(text) => day("--from", text)?,
        None => end - DEFAULT_COST_DAYS * MS_PER_DAY,
    };
    Period::utc_days(start, end).map_err(|error| usage("--from", error.to_string()))
}

/// Writes the dashboards and provisioning files under `out` (see `docs/gateway.md`, "Grafana
/// dashboards").
fn write_dashboards(
    config: &Config,
    out: &Path,
    prometheus: &str,
    datasource_uid: &str,
    dashboards_path: Option<String>,
) -> anyhow::Result<()> {
    use edgewatch_slo::dashboards;
    if !(prometheus.starts_with("http://") || prometheus.starts_with("https://")) {
        return Err(usage(
            "--prometheus",
            format!("`{prometheus}` is not an http:// or https:// URL"),
        ));
    }
    dashboards::check_datasource_uid("--datasource-uid", datasource_uid).map_err(UsageError)?;
    let dashboards_dir = out.join("dashboards");
    let provisioning = out.join("provisioning");
    for dir in [
        &dashboards_dir,
        &provisioning.join("dashboards"),
        &provisioning.join("datasources"),
    ] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let path = match dashboards_path {
        Some(path) => path,
        None => std::path::absolute(&dashboards_dir)
            .with_context(|| format!("resolving {}", dashboards_dir.display()))?
            .display()
            .to_string(),
    };
    let write = |file: PathBuf, text: String| {
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))
    };
    let boards = dashboards::dashboards(&config.catalog, config.prices.as_ref(), datasource_uid);
    for board in &boards {
        let text = serde_json::to_string_pretty(&board.json)? + "\n";
        write(dashboards_dir.join(board.file_name()), text)?;
    }
    write(
        provisioning.join("dashboards").join("edgewatch.yaml"),
        dashboards::dashboard_provisioning(&path),
    )?;
    write(
        provisioning.join("datasources").join("edgewatch.yaml"),
        dashboards::datasource_provisioning(datasource_uid, prometheus),
    )?;
    eprintln!(
        "edgewatch-gateway: {} dashboards in {}, provisioning files in {} \
         (data source uid {datasource_uid})",
        boards.len(),
        dashboards_dir.display(),
        provisioning.display()
    );
    Ok(())
}

/// `--at`: RFC 3339 UTC, default now.
fn at_ms(at: Option<&str>, now_ms: i64) -> anyhow::Result<i64> {
    match at {
        Some(text) => edgewatch_slo::parse_rfc3339(text)
            .ok_or_else(|| usage("--at", format!("`{text}` is not RFC 3339 UTC"))),
        None => Ok(now_ms),
    }
}

/// A duration argument in the one grammar, within the bounds of `key`.
fn duration_ms(
    key: &edgewatch_conventions::duration::DurationKey,
    arg: &str,
    text: Option<&str>,
    default_ms: i64,
) -> anyhow::Result<i64> {
    match text {
        Some(text) => {
            let duration = key.parse_at(arg, text).map_err(UsageError)?;
            Ok(i64::try_from(duration.as_millis()).unwrap_or(i64::MAX))
        }
        None => Ok(default_ms),
    }
}

struct FleetArgs {
    json: bool,
    prometheus: Option<String>,
    at: Option<String>,
    sort: String,
    window: Option<String>,
    lookback: Option<String>,
    machine: Option<String>,
}

fn fleet(config: &Config, args: FleetArgs, now_ms: i64) -> anyhow::Result<()> {
    use edgewatch_slo::fleet::{self, FleetQuery, SortKey};
    let sort: SortKey = args
        .sort
        .parse()
        .map_err(|error: fleet::UnknownSortKey| usage("--sort", error.to_string()))?;
    let query = FleetQuery {
        at_ms: at_ms(args.at.as_deref(), now_ms)?,
        window_ms: duration_ms(
            &fleet::WINDOW,
            "--window",
            args.window.as_deref(),
            fleet::DEFAULT_WINDOW_MS,
        )?,
        lookback_ms: duration_ms(
            &fleet::LOOKBACK,
            "--lookback",
            args.lookback.as_deref(),
            fleet::DEFAULT_LOOKBACK_MS,
        )?,
        increase_lookback_ms: config.catalog.lookback_ms,
    };
    let source = source(config, args.prometheus)?;
    let tiers = edgewatch_proto::tier::NAMES;
    match &args.machine {
        Some(machine) => {
            let set = source
                .fleet_set(&fleet::detail_needs(&query, machine))
                .context("reading samples")?;
            let detail = fleet::detail(&set, &query, machine, fleet::DEFAULT_DETAIL_BUCKETS);
            if args.json {
                println!("{}", serde_json::to_string_pretty(&detail)?);
            } else {
                print!("{}", edgewatch_slo::render_detail_text(&detail, &tiers));
            }
        }
        None => {
            let set = source
                .fleet_set(&fleet::table_needs(&query))
                .context("reading samples")?;
            let table = fleet::table(&set, &query, sort);
            if args.json {
                println!("{}", serde_json::to_string_pretty(&table)?);
            } else {
                print!("{}", edgewatch_slo::render_fleet_text(&table, &tiers));
            }
        }
    }
    Ok(())
}

/// `page`: the fleet page alone until SIGTERM or SIGINT.
fn page(
    mut config: Config,
    prometheus: Option<String>,
    listen: Option<String>,
) -> anyhow::Result<()> {
    if let Some(text) = listen {
        let addr = text
            .parse()
            .map_err(|_| usage("--listen", format!("`{text}` is not an address:port")))?;
        config.http = Some(edgewatch_gateway::config::HttpConfig {
            listen: addr,
            prometheus: None,
        });
    }
    if config.http.is_none() {
        return Err(usage(
            "http.enabled",
            "the fleet page is turned off; give --listen to serve it anyway",
        ));
    }
    let prometheus = prometheus.or_else(|| config.http.as_ref().and_then(|h| h.prometheus.clone()));
    let source = source(&config, prometheus)?;
    init_logging();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let task = edgewatch_gateway::run::start_page(&config, source, None).await?;
        shutdown_signal().await;
        if let Some(task) = task {
            task.abort();
        }
        anyhow::Ok(())
    })
}

fn run(command: Command, config: Config) -> anyhow::Result<()> {
    let now_ms = now_ns() / 1_000_000;
    match command {
        Command::Fleet {
            json,
            prometheus,
            at,
            sort,
            window,
            lookback,
            machine,
        } => fleet(
            &config,
            FleetArgs {
                json,
                prometheus,
                at,
                sort,
                window,
                lookback,
                machine,
            },
            now_ms,
        ),
        Command::CheckConfig => {
            println!("{config:#?}");
            for renamed in config.renamed_keys() {
                println!(
                    "deprecated key `{}` still loads; rename it `{}`",
                    renamed.old, renamed.new
                );
            }
            Ok(())
        }
        Command::Page { prometheus, listen } => page(config, prometheus, listen),
        Command::Rules => {
            print!("{}", edgewatch_slo::render_rules(&config.catalog));
            Ok(())
        }
        Command::Dashboards {
            out,
            prometheus,
            datasource_uid,
            dashboards_path,
        } => write_dashboards(&config, &out, &prometheus, &datasource_uid, dashboards_path),
        Command::Report {
            json,
            prometheus,
            at,
            period: period_args,
        } => {
            let at_ms = at_ms(at.as_deref(), now_ms)?;
            let source = source(&config, prometheus)?;
            let slo = source
                .slo_report(&config.catalog, at_ms)
                .context("reading samples")?;
            let cost = match &config.prices {
                Some(book) => {
                    let period = period(&period_args, at_ms)?;
                    Some(
                        source
                            .cost_report(book, period)
                            .context("reading samples")?,
                    )
                }
                None => None,
            };
            if json {
                let value = serde_json::json!({ "slo": slo, "cost": cost });
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                print!("{}", edgewatch_slo::render_slo_text(&slo));
                if let Some(cost) = &cost {
                    println!();
                    print!("{}", edgewatch_slo::render_cost_text(cost));
                }
            }
            Ok(())
        }
        Command::ExportFocus {
            prometheus,
            out,
            autonomy_out,
            period: period_args,
        } => {
            let Some(book) = &config.prices else {
                return Err(usage("prices", "export-focus needs a [prices] table"));
            };
            let period = period(&period_args, now_ms)?;
            let source = source(&config, prometheus)?;
            let report = source
                .cost_report(book, period)
                .context("reading samples")?;
            let previous = match &out {
                Some(path) if path.exists() => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    edgewatch_slo::focus::parse_focus_csv(&text)
                        .with_context(|| format!("parsing {}", path.display()))?
                }
                _ => Vec::new(),
            };
            let rows = edgewatch_slo::focus_rows(&report, &previous, now_ms);
            match &out {
                Some(path) => {
                    let mut all = previous;
                    let added = rows.len();
                    all.extend(rows);
                    std::fs::write(path, edgewatch_slo::focus::write_focus_csv(&all))
                        .with_context(|| format!("writing {}", path.display()))?;
                    eprintln!(
                        "edgewatch-gateway: {added} FOCUS rows added to {}",
                        path.display()
                    );
                }
                None => print!("{}", edgewatch_slo::focus::write_focus_csv(&rows)),
            }
            if let Some(path) = &autonomy_out {
                std::fs::write(path, edgewatch_slo::focus::write_autonomy_csv(&report))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
        Command::Run => {
            init_logging();
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime
                .block_on(edgewatch_gateway::run::run(config, shutdown_signal()))
                .context("the gateway stopped")?;
            Ok(())
        }
    }
}

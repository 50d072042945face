//! `edgewatch-gateway`: the uplink gateway's command line.
//!
//! Subcommands: `run` (the service), `check-config` (validate a configuration file and print what
//! it resolves to). Exit status 64 for a bad configuration (the message names the key), 1 for
//! other failures.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use edgewatch_gateway::config::{Config, ConfigError};

/// Exit status for a bad configuration (EX_USAGE... EX_DATAERR is 65; sysexits' EX_USAGE is 64).
const EXIT_CONFIG: u8 = 64;

#[derive(Parser)]
#[command(
    name = "edgewatch-gateway",
    version,
    about = "edgewatch uplink gateway"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway: subscribe, validate, de-duplicate, store, acknowledge.
    Run {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a configuration file and print the resolved settings.
    CheckConfig {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|error| ConfigError {
        key: "(file)".into(),
        message: format!("cannot read {}: {error}", path.display()),
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
    let config_path = match &cli.command {
        Command::Run { config } | Command::CheckConfig { config } => config.clone(),
    };
    let config = match load(&config_path) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("edgewatch-gateway: {error}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match run(cli.command, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("edgewatch-gateway: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command, config: Config) -> anyhow::Result<()> {
    match command {
        Command::CheckConfig { .. } => {
            println!("{config:#?}");
            Ok(())
        }
        Command::Run { .. } => {
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

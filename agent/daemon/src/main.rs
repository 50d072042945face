//! `edgewatch-agent`: the on-machine daemon and its operator commands.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use edgewatch_agent::config::Config;

/// Exit status for a configuration error (EX_CONFIG would be 78; sysexits' EX_USAGE, 64, is what
/// operators' tooling here expects for "fix your config").
const EXIT_BAD_CONFIG: u8 = 64;

#[derive(Debug, Parser)]
#[command(name = "edgewatch-agent", version, about = "edgewatch machine agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent (sampling, queue, uplink, local socket) until SIGTERM.
    Run {
        /// Agent configuration file (TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the running agent's status: queue tiers, uplink, sources.
    Status {
        /// Agent configuration file (TOML).
        #[arg(long)]
        config: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Validate a configuration file and exit (0 when valid, 64 naming the key otherwise).
    CheckConfig {
        /// Agent configuration file (TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Submit one event to the running agent through its local socket.
    Emit {
        /// Agent configuration file (TOML).
        #[arg(long)]
        config: PathBuf,
        /// Tier: safety, slo or debug.
        #[arg(long)]
        tier: String,
        /// Kind: intervention, safe-stop, mode-change, or any other name for a custom event.
        #[arg(long)]
        kind: String,
        /// Attributes as key=value (repeatable).
        #[arg(long = "attr", value_name = "KEY=VALUE")]
        attrs: Vec<String>,
    },
}

fn load(path: &std::path::Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|error| {
        eprintln!("edgewatch-agent: configuration error: {error}");
        ExitCode::from(EXIT_BAD_CONFIG)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::CheckConfig { config } => match load(&config) {
            Ok(_) => {
                println!("{}: valid", config.display());
                Ok(())
            }
            Err(code) => return code,
        },
        Command::Run { config } => match load(&config) {
            Ok(config) => edgewatch_agent::run::run(config),
            Err(code) => return code,
        },
        Command::Status { config, json } => match load(&config) {
            Ok(config) => edgewatch_agent::status::print(&config, json),
            Err(code) => return code,
        },
        Command::Emit {
            config,
            tier,
            kind,
            attrs,
        } => match load(&config) {
            Ok(config) => edgewatch_agent::ingest::emit(&config, &tier, &kind, &attrs),
            Err(code) => return code,
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("edgewatch-agent: {error:#}");
            ExitCode::FAILURE
        }
    }
}

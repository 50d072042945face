//! `edgewatch-agent`: the on-machine daemon and its operator commands.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use edgewatch_agent::config::Config;
use edgewatch_conventions::config::EXIT_BAD_CONFIG;

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
    /// Validate a configuration file and exit (0 when valid, 64 naming the key otherwise); list
    /// the deprecated keys it uses.
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
        /// Submission id (1 to 64 bytes), the same when retrying one submission: the agent
        /// answers a retry it already accepted as the original and counts it no more.
        #[arg(long)]
        id: Option<String>,
    },
}

/// Logs go to stderr (the journal under systemd); `RUST_LOG` filters them.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
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
        Command::CheckConfig { config: path } => match load(&path) {
            Ok(config) => {
                println!("{}: valid", path.display());
                for renamed in &config.renamed_keys {
                    println!(
                        "{}: deprecated key `{}` still loads; rename it `{}`",
                        path.display(),
                        renamed.old,
                        renamed.new
                    );
                }
                Ok(())
            }
            Err(code) => return code,
        },
        Command::Run { config } => {
            // Before loading, so that deprecated keys are logged to the journal.
            init_logging();
            match load(&config) {
                Ok(config) => edgewatch_agent::run::run(config).map_err(anyhow::Error::from),
                Err(code) => return code,
            }
        }
        Command::Status { config, json } => match load(&config) {
            Ok(config) => {
                let status = edgewatch_agent::status::read(&config);
                if json {
                    match serde_json::to_string_pretty(&status) {
                        Ok(text) => println!("{text}"),
                        Err(error) => eprintln!("edgewatch-agent: {error}"),
                    }
                } else {
                    print!("{}", edgewatch_agent::status::render_text(&status));
                }
                if status.agent_running {
                    Ok(())
                } else {
                    // Status printed, but say so in the exit code for scripts.
                    return ExitCode::from(3);
                }
            }
            Err(code) => return code,
        },
        Command::Emit {
            config,
            tier,
            kind,
            attrs,
            id,
        } => match load(&config) {
            Ok(config) => {
                match edgewatch_agent::ingest::emit(&config, &tier, &kind, &attrs, id.as_deref()) {
                    Ok(seq) => {
                        println!("accepted: {tier} seq {seq}");
                        Ok(())
                    }
                    Err(edgewatch_agent::ingest::EmitError::Usage(message)) => {
                        eprintln!("edgewatch-agent emit: {message}");
                        return ExitCode::from(EXIT_BAD_CONFIG);
                    }
                    Err(error) => Err(anyhow::Error::from(error)),
                }
            }
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

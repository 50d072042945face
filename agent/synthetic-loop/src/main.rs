//! `edgewatch-synthetic-loop`: a real timed control loop for tests and demos. It writes every
//! cycle through loop-probe while injecting a scripted pattern, then prints a JSON summary of
//! what it injected so that what the agent reports can be checked against it.
//!
//! Layout:
//! - `config`: flags and the validated configuration (exit 64 naming the flag).
//! - `script`: the pattern language, resolved to cycle numbers; pure.
//! - `rt`: SCHED_FIFO, affinity, mlockall, absolute sleeps, stop signals.
//! - `run`: the loop and its tally.
//!
//! Exit status: 0 after a clean stop (duration or SIGTERM/SIGINT), 64 bad flags, 69 CPU
//! unavailable, 71 OS error, 74 probe I/O error, 75 probe held by a live producer, 77
//! privileges refused.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod config;
mod rt;
mod run;
mod script;

use std::process::ExitCode;

use clap::Parser;
use edgewatch_conventions::config::{ConfigError, EXIT_BAD_CONFIG};
use loop_probe::{CreateError, MemoryLock, ProbeWriter, WriterConfig};

use crate::config::{Config, RawConfig};

fn exit(code: u8, message: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("edgewatch-synthetic-loop: {message}");
    ExitCode::from(code)
}

fn main() -> ExitCode {
    let flags = match RawConfig::try_parse() {
        Ok(f) => f,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    let script = match &flags.script {
        None => None,
        Some(p) => match std::fs::read_to_string(p) {
            Ok(t) => Some(t),
            Err(e) => {
                let error = ConfigError::new("--script", format!("{}: {e}", p.display()));
                return exit(EXIT_BAD_CONFIG, &error);
            }
        },
    };
    let cfg = match Config::from_raw(&flags, script.as_deref()) {
        Ok(c) => c,
        Err(e) => return exit(EXIT_BAD_CONFIG, &e),
    };
    match set_up_and_run(&cfg) {
        Ok(outcome) => match serde_json::to_string(&outcome) {
            Ok(json) => {
                println!("{json}");
                ExitCode::SUCCESS
            }
            Err(e) => exit(71, &e),
        },
        Err((code, message)) => exit(code, &message),
    }
}

fn set_up_and_run(cfg: &Config) -> Result<run::Outcome, (u8, String)> {
    let rt_fail = |e: rt::RtError| (e.exit_code() as u8, e.to_string());
    rt::install_stop_handlers().map_err(rt_fail)?;
    if let Some(cpu) = cfg.cpu {
        rt::set_affinity(cpu).map_err(rt_fail)?;
    }
    if let Some(priority) = cfg.fifo {
        rt::set_fifo(priority).map_err(rt_fail)?;
    }
    let memory_locked = match rt::lock_memory() {
        Ok(()) => true,
        Err(e) if cfg.require_rt => return Err(rt_fail(e)),
        Err(e) => {
            eprintln!("edgewatch-synthetic-loop: warning: {e}; continuing without locked memory");
            false
        }
    };
    let mut wc = WriterConfig::new(cfg.loop_id, &cfg.loop_name, cfg.period_ns, cfg.budget_ns);
    wc.deadline_ns = cfg.deadline_ns;
    wc.capacity = cfg.capacity;
    if cfg.require_rt {
        wc.memory_lock = MemoryLock::Required;
    }
    let mut writer = ProbeWriter::create(&cfg.probe, &wc).map_err(|e| {
        let code = match e {
            CreateError::InvalidConfig { .. } => EXIT_BAD_CONFIG,
            CreateError::AlreadyRunning { .. } => 75,
            CreateError::Io { .. } => 74,
            CreateError::MemoryLock { .. } => 77,
        };
        (code, e.to_string())
    })?;
    Ok(run::run(cfg, &mut writer, memory_locked))
}

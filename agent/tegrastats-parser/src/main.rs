//! `tegrastats-parser [--json] [FILE]`: reads tegrastats output (FILE, or standard input when
//! FILE is absent or `-`) and prints one JSON object per line.
//!
//! Invariants:
//! - Every non-blank input line gives either one JSON line on stdout or one
//!   `line N, column C: message` line on stderr; blank lines give neither.
//! - Exit status: 0 when every line was read, 1 when any line failed, 64 for a usage error,
//!   66 when FILE cannot be opened, 74 when reading or writing fails.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::process::ExitCode;

use tegrastats_parser::{OwnedSample, parse_line};

const USAGE: &str = "\
usage: tegrastats-parser [--json] [FILE]

Reads tegrastats output from FILE (standard input when FILE is absent or `-`) and prints one
JSON object per line. Lines that cannot be read are reported on standard error as
`line N, column C: message`; the other lines are still printed. Blank lines are skipped.

options:
  --json         print JSON Lines (the default and only output format)
  -h, --help     print this help
  -V, --version  print the version

exit status: 0 all lines read, 1 some line failed, 64 usage error, 66 FILE cannot be opened,
74 read or write error";

const EX_USAGE: u8 = 64;
const EX_NOINPUT: u8 = 66;
const EX_IOERR: u8 = 74;

/// What the command line asked for.
enum Command {
    Help,
    Version,
    Run { input: Option<OsString> },
}

fn parse_args(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    let mut input = None;
    let mut options_done = false;
    for arg in args {
        let is_option =
            !options_done && arg.to_str().is_some_and(|a| a.starts_with('-') && a != "-");
        if is_option {
            match arg.to_str() {
                Some("--json") => {}
                Some("-h" | "--help") => return Ok(Command::Help),
                Some("-V" | "--version") => return Ok(Command::Version),
                Some("--") => options_done = true,
                _ => return Err(format!("unknown option `{}`", arg.to_string_lossy())),
            }
        } else if input.is_some() {
            return Err(format!(
                "unexpected argument `{}`: only one FILE is read",
                arg.to_string_lossy()
            ));
        } else {
            input = Some(arg);
        }
    }
    Ok(Command::Run {
        input: input.filter(|path| path != "-"),
    })
}

fn main() -> ExitCode {
    let input = match parse_args(std::env::args_os().skip(1)) {
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("tegrastats-parser {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Ok(Command::Run { input }) => input,
        Err(message) => {
            eprintln!("tegrastats-parser: {message}\n\n{USAGE}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let reader: Box<dyn BufRead> = match &input {
        None => Box::new(io::stdin().lock()),
        Some(path) => match File::open(path) {
            Ok(file) => Box::new(BufReader::new(file)),
            Err(error) => {
                eprintln!(
                    "tegrastats-parser: cannot open `{}`: {error}",
                    path.to_string_lossy()
                );
                return ExitCode::from(EX_NOINPUT);
            }
        },
    };
    match run(reader, &mut io::BufWriter::new(io::stdout().lock())) {
        Ok(Outcome::AllRead) => ExitCode::SUCCESS,
        Ok(Outcome::SomeFailed) => ExitCode::FAILURE,
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("tegrastats-parser: {error}");
            ExitCode::from(EX_IOERR)
        }
    }
}

enum Outcome {
    AllRead,
    SomeFailed,
}

fn run(mut reader: impl BufRead, out: &mut impl Write) -> io::Result<Outcome> {
    let mut outcome = Outcome::AllRead;
    let mut buffer = Vec::new();
    let mut number = 0u64;
    loop {
        buffer.clear();
        if reader.read_until(b'\n', &mut buffer)? == 0 {
            break;
        }
        number += 1;
        let text = String::from_utf8_lossy(&buffer);
        let line = text.trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(line) {
            Ok(sample) => {
                serde_json::to_writer(&mut *out, &OwnedSample::from(&sample))?;
                out.write_all(b"\n")?;
            }
            Err(error) => {
                // Keeps stdout and stderr in input order when both go to one terminal or file.
                out.flush()?;
                eprintln!("line {number}, {error}");
                outcome = Outcome::SomeFailed;
            }
        }
    }
    out.flush()?;
    Ok(outcome)
}

//! Parser for the output of NVIDIA's `tegrastats` on Jetson and DRIVE boards, from the TK1/TX1
//! format to Thor and JetPack 7.2, that never allocates and never panics.
//!
//! ```
//! use tegrastats_parser::parse_line;
//!
//! let line = "10-08-2026 04:35:02 RAM 6712/7620MB (lfb 12x4MB) SWAP 369/3810MB (cached 8MB) \
//!             CPU [38%@1497,2%@729,off,off] EMC_FREQ 61%@2133 GR3D_FREQ 99%@[612] NVDEC off \
//!             APE 200 cpu@57.125C gpu@-256C VDD_IN 16321mW/11204mW";
//! let sample = parse_line(line)?;
//!
//! assert_eq!(sample.ram().map(|ram| ram.used_mb), Some(6712));
//! assert_eq!(sample.cpus()[0].load_pct, Some(38));
//! assert!(!sample.cpus()[3].online);
//! let gpu = sample.gpu().expect("the line has a GR3D field");
//! assert_eq!((gpu.load_pct, gpu.freq_mhz.as_slice()), (Some(99), &[612][..]));
//! // `-256C` means "unreadable", not a temperature.
//! assert_eq!(sample.temperatures()[1].celsius, None);
//! assert_eq!(sample.rails()[0].average_mw, Some(11204));
//! assert!(sample.unknown().is_empty());
//! # Ok::<(), tegrastats_parser::ParseError>(())
//! ```
//!
//! # What it reads
//!
//! One line is one sample. Every field family is optional and, except the timestamp, may come in
//! any order; tokens are dispatched on their *shape*, not their name, because names collide:
//! `CPU [` is the CPU block, `CPU@41C` a temperature, `CPU 466/466` a power rail.
//!
//! ```text
//! line      = [ts] item *(SP item)                      ; SP = one or more whitespace
//! ts        = MM "-" DD "-" YYYY SP hh ":" mm ":" ss
//! ram       = "RAM" SP n "/" n unit [SP] ["(lfb" SP n "x" n unit ")"]   ; unit = "MB" | "kB"
//! swap      = "SWAP" SP n "/" n unit [SP "(cached" SP n unit ")"]
//! iram      = "IRAM" SP n "/" n unit [SP] ["(lfb" SP n unit ")"]      ; `0/252kB(lfb 252kB)`
//! cpu       = ("CPU" | "cpu") SP "[" [core *("," core)] "]" ["@" n]  ; trailing @F: shared clock
//! core      = "off" | "" | n "%" ["@" n] | "@" n                      ; "" = old-form offline core
//! util_freq = [n "%"] ["@" (n | "[" n *("," n) "]")]                   ; at least one part
//! emc       = ("EMC" | "EMC_FREQ") SP util_freq
//! gpu       = ("GR3D" | "GR3D_FREQ" | "GR3D" digits "_FREQ" | "GR3D_PCI") SP util_freq
//! engine    = NAME SP ("off" | n "%" ["@" n] | "@" n | n)            ; NAME = [A-Z][A-Z0-9_]*
//! ape       = "APE" SP n
//! mts       = "MTS" SP "fg" SP n "%" SP "bg" SP n "%"
//! edp       = "EDP" SP "limit" SP n
//! temp      = ZONE "@" dec "C" ["/" dec "C"]                          ; dec = ["-"] n ["." n]
//! rail      = RAIL SP (n ["mW"] "/" n ["mW"] ["/" n ["mW"]] | n "mW")
//! ```
//!
//! Values the line does not print are `None`, never 0: Thor's `GR3D_FREQ @[0,0,0]` has no
//! utilisation, non-root `GR3D_FREQ 0%` has no clock, and the `-256C` sentinel is an unreadable
//! zone. Tokens that fit no rule are kept verbatim in [`Sample::unknown`] and never fail the line;
//! a line fails ([`ParseError`], with a column) only when nothing in it is a field.
//!
//! # Allocation and capacity
//!
//! [`parse_line`] returns a [`Sample`] that borrows names from the line and keeps lists in
//! fixed-capacity storage ([`MAX_CPUS`], [`MAX_TEMPERATURES`], [`MAX_RAILS`], [`MAX_ENGINES`],
//! [`MAX_GPU_FIELDS`], [`MAX_CLOCKS`], [`MAX_UNKNOWN`]), so it never touches the heap; the
//! capacities are several times the largest line observed, and anything beyond them is counted in
//! [`Sample::overflow`]. [`OwnedSample`] is the allocating convenience form.
//!
//! # Features
//!
//! - `serde`: `Serialize` for [`OwnedSample`] and the model types.
//! - `cli` (default): the `tegrastats-parser` binary, which prints one JSON object per line.
//!   Library users who do not need it can set `default-features = false`.
//!
//! # Layout
//!
//! - `parse`: [`parse_line`], the tokenizer and field grammar (pure, allocation-free).
//! - `model`: [`Sample`] and the field types it is made of.
//! - `owned`: [`OwnedSample`].
//! - `error`: [`ParseError`].
//! - `main.rs`: the CLI, a thin shell over `parse_line` and `OwnedSample`.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod error;
mod model;
mod owned;
mod parse;

pub use error::ParseError;
pub use model::{
    Clocks, Cpu, Engine, GpuField, Iram, Lfb, MAX_CLOCKS, MAX_CPUS, MAX_ENGINES, MAX_GPU_FIELDS,
    MAX_RAILS, MAX_TEMPERATURES, MAX_UNKNOWN, Mts, Rail, Ram, Sample, Swap, Temperature, Timestamp,
    Utilisation,
};
pub use owned::OwnedSample;
pub use parse::parse_line;

/// The README's examples, compiled and run as doctests so they cannot drift from the code.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

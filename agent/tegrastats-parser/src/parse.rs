//! The tokenizer and field grammar: one left-to-right pass that dispatches on token shape.
//!
//! Each token (a run of non-whitespace) is read in this order, first match wins:
//! 1. At the start of the line only: the `MM-DD-YYYY HH:MM:SS` timestamp.
//! 2. Fixed keys: `RAM`, `SWAP`, `IRAM`, `MTS fg .. bg ..`, `EDP limit ..`; a malformed one is
//!    unknown text. `CPU`/`cpu` followed by `[` is the CPU block; `EMC`/`EMC_FREQ`, `GR3D*`
//!    and `APE` followed by their value shape are their fields. These five fall through to 4 when
//!    their value has another shape (`CPU 466/466` is a rail on AGX Xavier).
//! 3. `ZONE@VALUEC[/MAXC]` is a temperature (`CPU@41C`).
//! 4. `NAME` then a rail value (`cur[mW]/avg[mW][/max[mW]]` or `curmW`) is a rail; an upper-case
//!    `NAME` then `off`, `X%@F`, `X%`, `@F` or `F` is an engine.
//! 5. Anything else is an unknown token, kept verbatim; parsing goes on at the next token.
//!
//! Invariants:
//! - No allocation and no panic on any input: indexing is checked, numbers are overflow-checked.
//! - Every loop step consumes input, so a line is read in linear time.
//! - The scanner moves only over ASCII bytes or whole tokens ending at ASCII whitespace, so every
//!   position is a char boundary and every slice handed out is a sub-slice of the line.

use crate::error::ParseError;
use crate::model::{
    Clocks, Cpu, Engine, GpuField, Iram, Lfb, MAX_CLOCKS, MAX_CPUS, Mts, Rail, Ram, Sample, Swap,
    Temperature, Timestamp, Utilisation,
};

/// Reads one tegrastats line into a [`Sample`] that borrows from it, without allocating.
///
/// Leading and trailing whitespace (including a `\r`) and runs of spaces are tolerated. Tokens
/// that are no known field are kept in [`Sample::unknown`]; a line is an error only when it yields
/// no field at all.
///
/// # Errors
///
/// [`ParseError`] with a 1-based character column when the line is blank, has no known field, or
/// has only a malformed one (for example a line cut short after `RAM 1205/`).
pub fn parse_line(line: &str) -> Result<Sample<'_>, ParseError> {
    let mut scanner = Scanner { line, pos: 0 };
    scanner.skip_ws();
    if scanner.at_end() {
        return Err(ParseError::EmptyLine { column: 1 });
    }
    let first_token = scanner.pos;
    let mut parser = Parser {
        sample: Sample::empty(),
        anchored: false,
        cpu_seen: false,
        first_fail: None,
    };
    let mut probe = scanner;
    if let Ok(timestamp) = timestamp(&mut probe) {
        parser.sample.timestamp = Some(timestamp);
        scanner = probe;
    }
    loop {
        scanner.skip_ws();
        if scanner.at_end() {
            break;
        }
        parser.item(&mut scanner);
    }
    if parser.anchored {
        return Ok(parser.sample);
    }
    Err(match parser.first_fail {
        Some((field, fail)) => ParseError::MalformedField {
            column: column(line, fail.pos),
            field,
            expected: fail.expected,
        },
        None => ParseError::NoField {
            column: column(line, first_token),
        },
    })
}

/// 1-based character column of a byte position.
fn column(line: &str, pos: usize) -> usize {
    line.get(..pos)
        .map_or_else(|| line.chars().count(), |head| head.chars().count())
        + 1
}

/// Where the grammar broke and what it wanted there.
#[derive(Debug, Clone, Copy)]
struct Fail {
    pos: usize,
    expected: &'static str,
}

type Step<T> = Result<T, Fail>;

/// A position in the line; `Copy`, so trying a parse and backtracking is a copy.
#[derive(Debug, Clone, Copy)]
struct Scanner<'a> {
    line: &'a str,
    pos: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.line.as_bytes().get(self.pos).copied()
    }

    fn at_end(&self) -> bool {
        self.pos >= self.line.len()
    }

    fn at_token_end(&self) -> bool {
        self.peek().is_none_or(|b| b.is_ascii_whitespace())
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.pos += 1;
        }
    }

    fn fail<T>(&self, expected: &'static str) -> Step<T> {
        Err(Fail {
            pos: self.pos,
            expected,
        })
    }

    /// The token starting here (empty at whitespace or the end).
    fn token(&self) -> &'a str {
        let rest = self.line.get(self.pos..).unwrap_or("");
        let len = rest
            .bytes()
            .position(|b| b.is_ascii_whitespace())
            .unwrap_or(rest.len());
        rest.get(..len).unwrap_or("")
    }

    /// The token after this one and the whitespace that follows it.
    fn next_token(&self) -> &'a str {
        let mut next = *self;
        next.pos += self.token().len();
        next.skip_ws();
        next.token()
    }

    fn eat(&mut self, literal: &str) -> bool {
        let matches = self
            .line
            .as_bytes()
            .get(self.pos..)
            .is_some_and(|rest| rest.starts_with(literal.as_bytes()));
        if matches {
            self.pos += literal.len();
        }
        matches
    }

    fn expect(&mut self, literal: &str, expected: &'static str) -> Step<()> {
        if self.eat(literal) {
            Ok(())
        } else {
            self.fail(expected)
        }
    }

    /// One or more whitespace characters.
    fn space(&mut self, expected: &'static str) -> Step<()> {
        if self.peek().is_some_and(|b| b.is_ascii_whitespace()) {
            self.skip_ws();
            Ok(())
        } else {
            self.fail(expected)
        }
    }

    fn token_end(&self, expected: &'static str) -> Step<()> {
        if self.at_token_end() {
            Ok(())
        } else {
            self.fail(expected)
        }
    }

    fn at_digit(&self) -> bool {
        self.peek().is_some_and(|b| b.is_ascii_digit())
    }

    /// An unsigned decimal that fits in `u32`.
    fn number(&mut self, expected: &'static str) -> Step<u32> {
        let start = *self;
        let mut value: u32 = 0;
        while let Some(digit @ b'0'..=b'9') = self.peek() {
            value = match value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u32::from(digit - b'0')))
            {
                Some(v) => v,
                None => return start.fail(expected),
            };
            self.pos += 1;
        }
        if self.pos == start.pos {
            return start.fail(expected);
        }
        Ok(value)
    }

    /// Exactly `count` digits.
    fn fixed_digits(&mut self, count: usize, expected: &'static str) -> Step<u32> {
        let start = *self;
        let value = self.number(expected)?;
        if self.pos - start.pos == count {
            Ok(value)
        } else {
            start.fail(expected)
        }
    }

    /// `-?DIGITS(.DIGITS)?` as a finite `f32`.
    fn decimal(&mut self, expected: &'static str) -> Step<f32> {
        let start = *self;
        self.eat("-");
        let int_start = self.pos;
        while self.at_digit() {
            self.pos += 1;
        }
        if self.pos == int_start {
            return start.fail(expected);
        }
        if self.eat(".") {
            let frac_start = self.pos;
            while self.at_digit() {
                self.pos += 1;
            }
            if self.pos == frac_start {
                return start.fail(expected);
            }
        }
        match self
            .line
            .get(start.pos..self.pos)
            .and_then(|text| text.parse::<f32>().ok())
        {
            Some(value) if value.is_finite() => Ok(value),
            _ => start.fail(expected),
        }
    }

    /// `MB` or `kB`.
    fn unit(&mut self) -> Step<Unit> {
        if self.eat("MB") {
            Ok(Unit::Mb)
        } else if self.eat("kB") {
            Ok(Unit::Kb)
        } else {
            self.fail("a unit, `MB` or `kB`")
        }
    }

    /// `NUMBER(MB|kB)` in KiB.
    fn size_kb(&mut self, expected: &'static str) -> Step<u32> {
        let start = *self;
        let value = self.number(expected)?;
        let unit = self.unit()?;
        unit.kb(value)
            .map_or_else(|| start.fail("a size that fits in 32 bits of KiB"), Ok)
    }

    /// `USED/TOTAL(MB|kB)`: both values and the unit printed after the total.
    fn used_total(&mut self, expected: &'static str) -> Step<(u32, u32, Unit)> {
        let used = self.number(expected)?;
        self.expect("/", expected)?;
        let total = self.number(expected)?;
        let unit = self.unit()?;
        Ok((used, total, unit))
    }
}

/// The memory unit printed after a value.
#[derive(Debug, Clone, Copy)]
enum Unit {
    Kb,
    Mb,
}

impl Unit {
    /// In MiB; kB rounds down.
    fn mb(self, value: u32) -> u32 {
        match self {
            Unit::Kb => value / 1024,
            Unit::Mb => value,
        }
    }

    /// In KiB; `None` when that overflows.
    fn kb(self, value: u32) -> Option<u32> {
        match self {
            Unit::Kb => Some(value),
            Unit::Mb => value.checked_mul(1024),
        }
    }
}

/// One field read from the line.
enum Field<'a> {
    Ram(Ram),
    Swap(Swap),
    Iram(Iram),
    /// The CPU block, already stored in the sample (or validated and dropped, for a repeat);
    /// carries the number of cores past capacity.
    Cpu(u32),
    Emc(Utilisation),
    Gpu(GpuField<&'a str>),
    Engine(Engine<&'a str>),
    Ape(u32),
    Mts(Mts),
    Edp(u32),
    Temperature(Temperature<&'a str>),
    Rail(Rail<&'a str>),
}

struct Parser<'a> {
    sample: Sample<'a>,
    /// Whether a field other than an engine was read: engines alone (`NAME NUMBER`) are too
    /// common in other text to call a line tegrastats output.
    anchored: bool,
    /// A `CPU [...]` block was read (it may have had no entries).
    cpu_seen: bool,
    /// The first keyed field that broke its grammar, reported if nothing else is read.
    first_fail: Option<(&'static str, Fail)>,
}

impl<'a> Parser<'a> {
    /// Reads the token at `scanner` (not whitespace, not the end) and whatever belongs to it.
    fn item(&mut self, scanner: &mut Scanner<'a>) {
        let key = scanner.token();
        let mut probe = *scanner;
        // (field name for errors, whether a malformed value is unknown rather than generic, result)
        let keyed: Option<(&'static str, bool, Step<Field<'a>>)> = match key {
            "RAM" => Some(("RAM", true, ram(&mut probe).map(Field::Ram))),
            "SWAP" => Some(("SWAP", true, swap(&mut probe).map(Field::Swap))),
            "IRAM" => Some(("IRAM", true, iram(&mut probe).map(Field::Iram))),
            "MTS" => Some(("MTS", true, mts(&mut probe).map(Field::Mts))),
            "EDP" => Some(("EDP", true, edp(&mut probe).map(Field::Edp))),
            "CPU" | "cpu" if scanner.next_token().starts_with('[') => {
                Some(("CPU", false, self.cpu_block(&mut probe)))
            }
            "EMC" | "EMC_FREQ" => Some(("EMC", false, emc(&mut probe).map(Field::Emc))),
            _ if is_gpu_key(key) => Some(("GR3D", false, gpu(&mut probe).map(Field::Gpu))),
            "APE" => Some(("APE", false, ape(&mut probe).map(Field::Ape))),
            _ if is_temperature_shaped(key) => Some((
                "temperature",
                true,
                temperature(&mut probe).map(Field::Temperature),
            )),
            _ => None,
        };
        if let Some((name, strict, result)) = keyed {
            match result {
                Ok(field) => {
                    self.store(field, span(scanner, &probe));
                    *scanner = probe;
                    return;
                }
                Err(fail) => {
                    self.first_fail.get_or_insert((name, fail));
                    if strict {
                        self.unknown(scanner);
                        return;
                    }
                }
            }
        }
        let mut probe = *scanner;
        if let Some(field) = rail_or_engine(&mut probe) {
            self.store(field, span(scanner, &probe));
            *scanner = probe;
            return;
        }
        self.unknown(scanner);
    }

    /// Reads a CPU block straight into the sample, or into scratch space when the line already
    /// had one (so the repeat is checked, then kept as unknown text).
    fn cpu_block(&mut self, scanner: &mut Scanner<'a>) -> Step<Field<'a>> {
        if self.cpu_seen {
            let mut scratch = heapless::Vec::new();
            return cpu(scanner, &mut scratch).map(Field::Cpu);
        }
        let result = cpu(scanner, &mut self.sample.cpus);
        if result.is_err() {
            self.sample.cpus.clear();
        }
        result.map(Field::Cpu)
    }

    fn unknown(&mut self, scanner: &mut Scanner<'a>) {
        let token = scanner.token();
        scanner.pos += token.len();
        self.push_unknown(token);
    }

    fn push_unknown(&mut self, text: &'a str) {
        if self.sample.unknown.push(text).is_err() {
            self.sample.overflow = self.sample.overflow.saturating_add(1);
        }
    }

    fn store(&mut self, field: Field<'a>, span: &'a str) {
        self.anchored |= !matches!(field, Field::Engine(_));
        let sample = &mut self.sample;
        let fresh = match field {
            Field::Ram(v) => set_once(&mut sample.ram, v),
            Field::Swap(v) => set_once(&mut sample.swap, v),
            Field::Iram(v) => set_once(&mut sample.iram, v),
            Field::Emc(v) => set_once(&mut sample.emc, v),
            Field::Ape(v) => set_once(&mut sample.ape_mhz, v),
            Field::Mts(v) => set_once(&mut sample.mts, v),
            Field::Edp(v) => set_once(&mut sample.edp_limit_mhz, v),
            Field::Cpu(overflow) => {
                let fresh = !self.cpu_seen;
                if fresh {
                    self.cpu_seen = true;
                    sample.overflow = sample.overflow.saturating_add(overflow);
                }
                fresh
            }
            Field::Gpu(v) => push_counted(&mut sample.gpu_fields, v, &mut sample.overflow),
            Field::Engine(v) => push_counted(&mut sample.engines, v, &mut sample.overflow),
            Field::Temperature(v) => {
                push_counted(&mut sample.temperatures, v, &mut sample.overflow)
            }
            Field::Rail(v) => push_counted(&mut sample.rails, v, &mut sample.overflow),
        };
        if !fresh {
            self.push_unknown(span);
        }
    }
}

/// The text between two positions of the same line.
fn span<'a>(from: &Scanner<'a>, to: &Scanner<'a>) -> &'a str {
    from.line.get(from.pos..to.pos).unwrap_or("")
}

/// Stores a single-valued field; false when the line already had one.
fn set_once<T>(slot: &mut Option<T>, value: T) -> bool {
    if slot.is_some() {
        return false;
    }
    *slot = Some(value);
    true
}

/// Appends to a list field, counting what does not fit; always "fresh" (lists keep duplicates).
fn push_counted<T, const N: usize>(
    list: &mut heapless::Vec<T, N>,
    value: T,
    overflow: &mut u32,
) -> bool {
    if list.push(value).is_err() {
        *overflow = overflow.saturating_add(1);
    }
    true
}

/// `ZONE@` followed by a digit or `-`, where ZONE is a zone name: the shape of a temperature,
/// and not that of free text such as an e-mail address.
fn is_temperature_shaped(token: &str) -> bool {
    let Some((zone, value)) = token.split_once('@') else {
        return false;
    };
    is_zone_name(zone) && value.starts_with(|c: char| c.is_ascii_digit() || c == '-')
}

/// A thermal zone type as the kernel names them (`CPU`, `soc012`, `max170xx`, `PMIC-Die`).
fn is_zone_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphanumeric())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

fn is_gpu_key(key: &str) -> bool {
    let Some(rest) = key.strip_prefix("GR3D") else {
        return false;
    };
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    matches!(rest, "" | "_FREQ" | "_PCI")
}

/// `MM-DD-YYYY HH:MM:SS`.
fn timestamp(s: &mut Scanner<'_>) -> Step<Timestamp> {
    const DATE: &str = "`MM-DD-YYYY`";
    const TIME: &str = "`HH:MM:SS`";
    let month = s.fixed_digits(2, DATE)?;
    s.expect("-", DATE)?;
    let day = s.fixed_digits(2, DATE)?;
    s.expect("-", DATE)?;
    let year = s.fixed_digits(4, DATE)?;
    s.space(TIME)?;
    let hour = s.fixed_digits(2, TIME)?;
    s.expect(":", TIME)?;
    let minute = s.fixed_digits(2, TIME)?;
    s.expect(":", TIME)?;
    let second = s.fixed_digits(2, TIME)?;
    s.token_end(TIME)?;
    let in_range = (1..=12).contains(&month)
        && (1..=31).contains(&day)
        && hour <= 23
        && minute <= 59
        && second <= 60;
    if !in_range {
        return s.fail("a valid date and time");
    }
    // The ranges were checked above, so the narrowing casts cannot fail.
    let narrow = |v: u32| u8::try_from(v).unwrap_or(u8::MAX);
    Ok(Timestamp {
        year: u16::try_from(year).unwrap_or(u16::MAX),
        month: narrow(month),
        day: narrow(day),
        hour: narrow(hour),
        minute: narrow(minute),
        second: narrow(second),
    })
}

/// `RAM used/totalMB [(lfb NxSIZE)]`.
fn ram(s: &mut Scanner<'_>) -> Step<Ram> {
    const USED_TOTAL: &str = "`USED/TOTALMB`";
    s.expect("RAM", "`RAM`")?;
    s.space(USED_TOTAL)?;
    let (used, total, unit) = s.used_total(USED_TOTAL)?;
    let lfb = optional(s, |s| {
        s.skip_ws();
        s.expect("(lfb", "`(lfb`")?;
        s.space("`(lfb NxSIZE)`")?;
        let blocks = s.number("`(lfb NxSIZE)`")?;
        s.expect("x", "`x` in `(lfb NxSIZE)`")?;
        let block_kb = s.size_kb("a block size")?;
        s.expect(")", "`)` closing `(lfb`")?;
        s.token_end("the end of the RAM field")?;
        Ok(Lfb { blocks, block_kb })
    });
    s.token_end("`(lfb NxSIZE)` or the end of the RAM field")?;
    Ok(Ram {
        used_mb: unit.mb(used),
        total_mb: unit.mb(total),
        lfb,
    })
}

/// Runs an optional trailing part; on failure nothing is consumed and the part is `None`, so
/// a garbled `(lfb ...)` leaves its tokens unknown without losing the field before it.
fn optional<'a, T>(
    s: &mut Scanner<'a>,
    part: impl FnOnce(&mut Scanner<'a>) -> Step<T>,
) -> Option<T> {
    let mut probe = *s;
    let value = part(&mut probe).ok()?;
    *s = probe;
    Some(value)
}

/// `SWAP used/totalMB [(cached NMB)]`.
fn swap(s: &mut Scanner<'_>) -> Step<Swap> {
    const USED_TOTAL: &str = "`USED/TOTALMB`";
    s.expect("SWAP", "`SWAP`")?;
    s.space(USED_TOTAL)?;
    let (used, total, unit) = s.used_total(USED_TOTAL)?;
    let cached_mb = optional(s, |s| {
        s.skip_ws();
        s.expect("(cached", "`(cached`")?;
        s.space("`(cached NMB)`")?;
        let cached = s.number("`(cached NMB)`")?;
        let cached_mb = s.unit()?.mb(cached);
        s.expect(")", "`)` closing `(cached`")?;
        s.token_end("the end of the SWAP field")?;
        Ok(cached_mb)
    });
    s.token_end("`(cached NMB)` or the end of the SWAP field")?;
    Ok(Swap {
        used_mb: unit.mb(used),
        total_mb: unit.mb(total),
        cached_mb,
    })
}

/// `IRAM used/totalkB[ ](lfb NkB)`.
fn iram(s: &mut Scanner<'_>) -> Step<Iram> {
    const USED_TOTAL: &str = "`USED/TOTALkB`";
    s.expect("IRAM", "`IRAM`")?;
    s.space(USED_TOTAL)?;
    let values_at = *s;
    let (used, total, unit) = s.used_total(USED_TOTAL)?;
    let (Some(used_kb), Some(total_kb)) = (unit.kb(used), unit.kb(total)) else {
        return values_at.fail("a size that fits in 32 bits of KiB");
    };
    let lfb_kb = optional(s, |s| {
        s.skip_ws();
        s.expect("(lfb", "`(lfb`")?;
        s.space("`(lfb NkB)`")?;
        let lfb_kb = s.size_kb("`(lfb NkB)`")?;
        s.expect(")", "`)` closing `(lfb`")?;
        s.token_end("the end of the IRAM field")?;
        Ok(lfb_kb)
    });
    s.token_end("`(lfb NkB)` or the end of the IRAM field")?;
    Ok(Iram {
        used_kb,
        total_kb,
        lfb_kb,
    })
}

/// `CPU [core,...][@F]` where core = `off` | `X%[@F]` | `@F` | empty, appended to `cpus`
/// (which starts empty); returns how many cores did not fit.
fn cpu(s: &mut Scanner<'_>, cpus: &mut heapless::Vec<Cpu, MAX_CPUS>) -> Step<u32> {
    const ENTRY: &str = "a core: `off`, `X%`, `X%@F` or `@F`";
    const SEPARATOR: &str = "`,` or `]` after a core";
    if !s.eat("CPU") {
        s.expect("cpu", "`CPU`")?;
    }
    s.space("`[` opening the core list")?;
    s.expect("[", "`[` opening the core list")?;
    let mut overflow = 0;
    s.skip_ws();
    if !s.eat("]") {
        loop {
            s.skip_ws();
            let core = if s.eat("off") {
                Cpu::default()
            } else if matches!(s.peek(), Some(b',' | b']')) {
                // The documented old form `CPU [X%,Y%, , ]@F` leaves unplugged cores empty.
                Cpu::default()
            } else {
                let load_pct = if s.at_digit() {
                    let load = s.number(ENTRY)?;
                    s.expect("%", "`%` after a core load")?;
                    Some(load)
                } else {
                    None
                };
                let freq_mhz = if s.eat("@") {
                    Some(s.number("a core clock in MHz")?)
                } else {
                    None
                };
                if load_pct.is_none() && freq_mhz.is_none() {
                    return s.fail(ENTRY);
                }
                Cpu {
                    online: true,
                    load_pct,
                    freq_mhz,
                }
            };
            s.skip_ws();
            if cpus.push(core).is_err() {
                overflow = u32::saturating_add(overflow, 1);
            }
            if s.eat(",") {
                continue;
            }
            s.expect("]", SEPARATOR)?;
            break;
        }
    }
    if s.eat("@") {
        let shared = s.number("the shared CPU clock in MHz")?;
        for core in cpus.iter_mut() {
            if core.online && core.freq_mhz.is_none() {
                core.freq_mhz = Some(shared);
            }
        }
    }
    s.token_end("the end of the CPU block")?;
    Ok(overflow)
}

/// `[X%][@F | @[F,...]]` with at least one part, ending the token.
fn util_freq(s: &mut Scanner<'_>) -> Step<(Option<u32>, Clocks)> {
    const VALUE: &str = "`X%`, `@F`, `X%@F` or `X%@[F,...]`";
    let load_pct = if s.at_digit() {
        let load = s.number(VALUE)?;
        s.expect("%", "`%` after the load")?;
        Some(load)
    } else {
        None
    };
    let mut clocks = Clocks::default();
    if s.eat("@") {
        if s.eat("[") {
            loop {
                s.skip_ws();
                let at = *s;
                let mhz = s.number("a clock in MHz")?;
                if clocks.push(mhz).is_err() {
                    const _: () = assert!(MAX_CLOCKS == 8, "the message below names the capacity");
                    return at.fail("at most 8 clocks");
                }
                s.skip_ws();
                if s.eat(",") {
                    continue;
                }
                s.expect("]", "`,` or `]` in the clock list")?;
                break;
            }
        } else {
            let mhz = s.number("a clock in MHz or `[`")?;
            // An empty list never overflows.
            let _ = clocks.push(mhz);
        }
    } else if load_pct.is_none() {
        return s.fail(VALUE);
    }
    s.token_end("the end of the field")?;
    Ok((load_pct, clocks))
}

/// `EMC X%@F` or `EMC_FREQ [X%][@F]`.
fn emc(s: &mut Scanner<'_>) -> Step<Utilisation> {
    let key = s.token();
    s.pos += key.len();
    s.space("the EMC value")?;
    let (load_pct, freq_mhz) = util_freq(s)?;
    Ok(Utilisation { load_pct, freq_mhz })
}

/// `GR3D`, `GR3D_FREQ`, `GR3Dn_FREQ`, `GR3D_PCI` with a [`util_freq`] value.
fn gpu<'a>(s: &mut Scanner<'a>) -> Step<GpuField<&'a str>> {
    let name = s.token();
    s.pos += name.len();
    s.space("the GPU value")?;
    let (load_pct, freq_mhz) = util_freq(s)?;
    Ok(GpuField {
        name,
        load_pct,
        freq_mhz,
    })
}

/// `APE F`.
fn ape(s: &mut Scanner<'_>) -> Step<u32> {
    s.expect("APE", "`APE`")?;
    s.space("the APE clock in MHz")?;
    let mhz = s.number("the APE clock in MHz")?;
    s.token_end("the end of the APE field")?;
    Ok(mhz)
}

/// `MTS fg X% bg Y%`.
fn mts(s: &mut Scanner<'_>) -> Step<Mts> {
    const FORM: &str = "`MTS fg X% bg Y%`";
    s.expect("MTS", FORM)?;
    s.space(FORM)?;
    s.expect("fg", "`fg`")?;
    s.space(FORM)?;
    let fg_pct = s.number("the foreground percentage")?;
    s.expect("%", "`%`")?;
    s.space(FORM)?;
    s.expect("bg", "`bg`")?;
    s.space(FORM)?;
    let bg_pct = s.number("the background percentage")?;
    s.expect("%", "`%`")?;
    s.token_end("the end of the MTS field")?;
    Ok(Mts { fg_pct, bg_pct })
}

/// `EDP limit F`.
fn edp(s: &mut Scanner<'_>) -> Step<u32> {
    s.expect("EDP", "`EDP limit F`")?;
    s.space("`limit`")?;
    s.expect("limit", "`limit`")?;
    s.space("the EDP limit in MHz")?;
    let mhz = s.number("the EDP limit in MHz")?;
    s.token_end("the end of the EDP field")?;
    Ok(mhz)
}

/// `ZONE@VALUEC[/MAXC]`; `-256` reads as unavailable.
fn temperature<'a>(s: &mut Scanner<'a>) -> Step<Temperature<&'a str>> {
    let token = s.token();
    let Some((zone, _)) = token.split_once('@').filter(|(zone, _)| is_zone_name(zone)) else {
        return s.fail("`ZONE@VALUEC`");
    };
    s.pos += zone.len() + 1;
    let celsius = s.decimal("a temperature such as `45.5`")?;
    s.expect("C", "`C` after the temperature")?;
    let max_celsius = if s.eat("/") {
        let max = s.decimal("a maximum temperature such as `45.5`")?;
        s.expect("C", "`C` after the maximum temperature")?;
        readable(max)
    } else {
        None
    };
    s.token_end("the end of the temperature")?;
    Ok(Temperature {
        zone,
        celsius: readable(celsius),
        max_celsius,
    })
}

/// Maps the `-256` "zone unreadable" sentinel to `None`.
fn readable(celsius: f32) -> Option<f32> {
    // Exact comparison on purpose: the sentinel is printed as the integer -256.
    #[allow(clippy::float_cmp)]
    let sentinel = celsius == -256.0;
    (!sentinel).then_some(celsius)
}

/// `NAME value` where the value is a rail or (upper-case names only) an engine reading.
fn rail_or_engine<'a>(s: &mut Scanner<'a>) -> Option<Field<'a>> {
    let name = s.token();
    if !is_rail_name(name) {
        return None;
    }
    s.pos += name.len();
    s.space("").ok()?;
    let mut probe = *s;
    if let Ok((current_mw, average_mw, max_mw)) = rail_value(&mut probe) {
        *s = probe;
        return Some(Field::Rail(Rail {
            name,
            current_mw,
            average_mw,
            max_mw,
        }));
    }
    if !is_engine_name(name) {
        return None;
    }
    let (active, load_pct, freq_mhz) = engine_value(s).ok()?;
    Some(Field::Engine(Engine {
        name,
        active,
        load_pct,
        freq_mhz,
    }))
}

fn is_rail_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn is_engine_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_uppercase())
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// `cur[mW]/avg[mW][/max[mW]]` or `curmW`.
fn rail_value(s: &mut Scanner<'_>) -> Step<(u32, Option<u32>, Option<u32>)> {
    let current = s.number("the current power")?;
    let unit = s.eat("mW");
    if !s.eat("/") {
        if !unit {
            return s.fail("`/` after the current power");
        }
        s.token_end("the end of the rail")?;
        return Ok((current, None, None));
    }
    let average = s.number("the average power")?;
    s.eat("mW");
    let max = if s.eat("/") {
        let max = s.number("the maximum power")?;
        s.eat("mW");
        Some(max)
    } else {
        None
    };
    s.token_end("the end of the rail")?;
    Ok((current, Some(average), max))
}

/// `off`, `X%@F`, `X%`, `@F` or `F`: (active, load, clock).
fn engine_value(s: &mut Scanner<'_>) -> Step<(bool, Option<u32>, Option<u32>)> {
    if s.eat("off") {
        s.token_end("the end of the engine")?;
        return Ok((false, None, None));
    }
    let load_pct = if s.at_digit() {
        let value = s.number("an engine load or clock")?;
        if !s.eat("%") {
            // A bare number is the engine clock in MHz (`NVDEC 716`, `VIC_FREQ 729`).
            s.token_end("the end of the engine")?;
            return Ok((true, None, Some(value)));
        }
        Some(value)
    } else {
        None
    };
    let freq_mhz = if s.eat("@") {
        Some(s.number("an engine clock in MHz")?)
    } else {
        None
    };
    if load_pct.is_none() && freq_mhz.is_none() {
        return s.fail("`off`, `X%@F`, `X%`, `@F` or `F`");
    }
    s.token_end("the end of the engine")?;
    Ok((true, load_pct, freq_mhz))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(text: &str) -> Scanner<'_> {
        Scanner { line: text, pos: 0 }
    }

    #[test]
    fn numbers_past_u32_max_fail_at_their_first_digit() {
        assert_eq!(scan("4294967295").number("n").ok(), Some(u32::MAX));
        let mut s = scan("x 4294967296");
        s.pos = 2;
        assert_eq!(s.number("n").unwrap_err().pos, 2);
    }

    #[test]
    fn decimals_are_plain_digits_with_an_optional_sign_and_fraction() {
        for good in ["45", "45.5", "-256", "47.281", "0.000"] {
            assert!(scan(good).decimal("d").is_ok(), "{good}");
        }
        for bad in ["1e5", "inf", "NaN", "1.", ".5", "+5", "-", ""] {
            let mut s = scan(bad);
            let value = s.decimal("d");
            // Either rejected, or only a plain prefix was read (`1` of `1e5`), never the whole.
            assert!(value.is_err() || s.pos < bad.len(), "{bad}");
        }
        let huge = "9".repeat(60);
        assert!(
            scan(&huge).decimal("d").is_err(),
            "an infinite value is rejected"
        );
    }

    #[test]
    fn gpu_keys_are_gr3d_with_an_optional_index_and_suffix() {
        for key in [
            "GR3D",
            "GR3D2",
            "GR3D_FREQ",
            "GR3D2_FREQ",
            "GR3D10_FREQ",
            "GR3D_PCI",
        ] {
            assert!(is_gpu_key(key), "{key}");
        }
        for key in ["GR3", "GR3D_", "gr3d_freq", "GR3D_FREQX", "GR3D_LOAD"] {
            assert!(!is_gpu_key(key), "{key}");
        }
    }

    #[test]
    fn engine_names_are_upper_case_while_rail_names_may_mix_case() {
        assert!(is_engine_name("NVDLA0_LOAD") && is_rail_name("NVDLA0_LOAD"));
        assert!(!is_engine_name("Dec") && is_rail_name("Dec"));
        assert!(!is_rail_name("0ABC") && !is_rail_name("") && !is_rail_name("A@B"));
    }

    #[test]
    fn columns_count_characters_from_one() {
        assert_eq!(column("abc", 0), 1);
        assert_eq!(column("é b", 3), 3);
        assert_eq!(column("abc", 3), 4);
        assert_eq!(column("abc", 99), 4);
    }
}

//! The injection pattern: a small line language, parsed into rules that say what happens at
//! which cycle. Pure: no I/O, no clock; times are converted to cycle numbers with the loop rate,
//! so a pattern means the same cycles on every run.
//!
//! Invariants:
//! - Every time-based rule is resolved to a cycle at parse time: `at T` fires at cycle
//!   `round(T × rate)`.
//! - Looking up a cycle allocates nothing and visits each rule once.
//!
//! Syntax, one rule per line (or per `--event`); `#` starts a comment:
//!
//! ```text
//! rule   := action when
//! action := "overrun" FACTOR "x"       busy-spin FACTOR × budget (FACTOR > 1)
//!         | "late-start" TIME          start TIME after the release (combines with overrun)
//!         | "hang" TIME                stop for TIME from the release: no records, no heartbeat;
//!                                      resume at the first release at or after its end
//!         | "skip"                     skip the activation: nothing runs, nothing is recorded
//!         | "fallback"                 report a fallback to the safety controller
//!         | "intervention"             report an operator intervention
//!         | "safe-stop"                report a safe stop
//!         | "mode" MODE                autonomous | manual | teleoperated | idle
//!         | "model" VERSION ["hash=" HEX]   publish a model version (hash defaults to FNV-1a)
//! when   := "at" "cycle" N             one cycle
//!         | "at" "cycles" A ".." B     cycles A to B-1
//!         | "at" TIME                  the cycle released at TIME after start: 1.5s, 250ms
//!         | "every" N ["from" A]       cycles A, A+N, A+2N, … (A defaults to N)
//! ```
//!
//! TIME in an action is `20ms` or `1.5s`, or a number and a unit as two words (`20 ms`).
//!
//! Examples: `overrun 2x at cycles 100..110`, `skip every 97`, `mode manual at 1.2s`,
//! `model yolo-v8.1 hash=0xfeed at 0s`, `late-start 45 ms at cycle 300`, `hang 2s at 4s`.

use loop_probe::AutonomyMode;

/// Maximum model version length (the probe's slot).
const MODEL_VERSION_MAX: usize = 64;

/// What a rule does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Busy-spin this many budgets.
    Overrun(f64),
    /// Start this many ns after the release.
    LateStart(u64),
    /// Stop for this many ns from the release (no records, no heartbeat).
    Hang(u64),
    /// Skip the activation.
    Skip,
    /// Report a fallback to the safety controller.
    Fallback,
    /// Report an operator intervention.
    Intervention,
    /// Report a safe stop.
    SafeStop,
    /// Switch autonomy mode.
    Mode(AutonomyMode),
    /// Publish a model version.
    Model {
        /// Id hash.
        hash: u64,
        /// Version string.
        version: String,
    },
}

/// Which cycles a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Cycles `from..to`.
    Range {
        /// First cycle.
        from: u64,
        /// One past the last cycle.
        to: u64,
    },
    /// Cycles `from`, `from + every`, …
    Every {
        /// Stride (≥ 1).
        every: u64,
        /// First cycle.
        from: u64,
    },
}

impl When {
    fn matches(&self, cycle: u64) -> bool {
        match *self {
            When::Range { from, to } => (from..to).contains(&cycle),
            When::Every { every, from } => cycle >= from && (cycle - from).is_multiple_of(every),
        }
    }
}

/// One parsed rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// What happens.
    pub action: Action,
    /// When.
    pub when: When,
}

/// A rule that did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{line}`: {reason}")]
pub struct ParseError {
    /// The offending rule text.
    pub line: String,
    /// What is wrong.
    pub reason: String,
}

/// All rules, looked up per cycle.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Schedule {
    rules: Vec<Rule>,
}

/// What a cycle must do, borrowed from the schedule.
#[derive(Debug, Default)]
pub struct CyclePlan<'a> {
    /// Skip the activation.
    pub skip: bool,
    /// Largest overrun factor that applies.
    pub overrun: Option<f64>,
    /// Longest late start that applies, ns after the release.
    pub late_start_ns: Option<u64>,
    /// Longest hang that applies, ns from the release.
    pub hang_ns: Option<u64>,
    /// Report a fallback.
    pub fallback: bool,
    /// Interventions to report.
    pub interventions: u32,
    /// Safe stops to report.
    pub safe_stops: u32,
    /// Mode to switch to (the last rule wins).
    pub mode: Option<AutonomyMode>,
    /// Model to publish (the last rule wins).
    pub model: Option<(u64, &'a str)>,
}

impl Schedule {
    /// A schedule from rules.
    pub fn new(rules: Vec<Rule>) -> Schedule {
        Schedule { rules }
    }

    /// The rules.
    #[cfg(test)]
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Every model version the schedule can publish, in rule order, each once.
    pub fn model_versions(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for r in &self.rules {
            if let Action::Model { version, .. } = &r.action
                && !out.contains(&version.as_str())
            {
                out.push(version);
            }
        }
        out
    }

    /// What cycle `cycle` must do.
    pub fn plan(&self, cycle: u64) -> CyclePlan<'_> {
        let mut p = CyclePlan::default();
        for r in self.rules.iter().filter(|r| r.when.matches(cycle)) {
            match &r.action {
                Action::Skip => p.skip = true,
                Action::Overrun(f) => p.overrun = Some(p.overrun.map_or(*f, |o| o.max(*f))),
                Action::LateStart(ns) => p.late_start_ns = p.late_start_ns.max(Some(*ns)),
                Action::Hang(ns) => p.hang_ns = p.hang_ns.max(Some(*ns)),
                Action::Fallback => p.fallback = true,
                Action::Intervention => p.interventions += 1,
                Action::SafeStop => p.safe_stops += 1,
                Action::Mode(m) => p.mode = Some(*m),
                Action::Model { hash, version } => p.model = Some((*hash, version.as_str())),
            }
        }
        p
    }
}

/// Parses a script: one rule per line, blank lines and `#` comments ignored.
/// Errors carry the 1-based line number.
pub fn parse_script(text: &str, rate_hz: f64) -> Result<Vec<Rule>, (usize, ParseError)> {
    let mut rules = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        rules.push(parse_rule(line, rate_hz).map_err(|e| (i + 1, e))?);
    }
    Ok(rules)
}

/// Parses one rule.
pub fn parse_rule(text: &str, rate_hz: f64) -> Result<Rule, ParseError> {
    let err = |reason: &str| ParseError {
        line: text.to_owned(),
        reason: reason.to_owned(),
    };
    let words: Vec<&str> = text.split_whitespace().collect();
    let split = words
        .iter()
        .position(|w| *w == "at" || *w == "every")
        .ok_or_else(|| err("missing `at …` or `every …`"))?;
    let (action, when) = words.split_at(split);
    let action = parse_action(action).map_err(|r| err(&r))?;
    let when = parse_when(when, rate_hz).map_err(|r| err(&r))?;
    Ok(Rule { action, when })
}

fn parse_action(words: &[&str]) -> Result<Action, String> {
    match words {
        ["overrun", factor] => {
            let f: f64 = factor
                .strip_suffix('x')
                .ok_or("overrun factor needs an `x` suffix, e.g. `2x`")?
                .parse()
                .map_err(|_| format!("overrun factor `{factor}` is not a number"))?;
            if !(f > 1.0 && f <= 1000.0) {
                return Err("overrun factor must be above 1x and at most 1000x".into());
            }
            Ok(Action::Overrun(f))
        }
        ["late-start", time @ ..] => Ok(Action::LateStart(action_time(time)?)),
        ["hang", time @ ..] => {
            let ns = action_time(time)?;
            if ns == 0 {
                return Err("a hang needs a time above 0".into());
            }
            Ok(Action::Hang(ns))
        }
        ["skip"] => Ok(Action::Skip),
        ["fallback"] => Ok(Action::Fallback),
        ["intervention"] => Ok(Action::Intervention),
        ["safe-stop"] => Ok(Action::SafeStop),
        ["mode", m] => {
            let mode = match *m {
                "autonomous" => AutonomyMode::Autonomous,
                "manual" => AutonomyMode::Manual,
                "teleoperated" => AutonomyMode::Teleoperated,
                "idle" => AutonomyMode::Idle,
                other => return Err(format!("unknown mode `{other}`")),
            };
            Ok(Action::Mode(mode))
        }
        ["model", version, rest @ ..] => {
            if version.len() > MODEL_VERSION_MAX {
                return Err(format!(
                    "model version longer than {MODEL_VERSION_MAX} bytes"
                ));
            }
            let hash = match rest {
                [] => fnv1a(version.as_bytes()),
                [h] => {
                    let hex = h
                        .strip_prefix("hash=")
                        .ok_or("expected `hash=HEX` after the model version")?;
                    let hex = hex.strip_prefix("0x").unwrap_or(hex);
                    u64::from_str_radix(hex, 16)
                        .map_err(|_| format!("model hash `{hex}` is not hexadecimal"))?
                }
                _ => return Err("too many words after `model VERSION`".into()),
            };
            Ok(Action::Model {
                hash,
                version: (*version).to_owned(),
            })
        }
        [] => Err("missing action".into()),
        [other, ..] => Err(format!("unknown action `{other}`")),
    }
}

/// Nanoseconds from an action's TIME: one word (`20ms`) or a number and a unit (`20 ms`).
fn action_time(words: &[&str]) -> Result<u64, String> {
    let secs = match words {
        [t] => parse_time(t)?,
        [n, unit @ ("s" | "ms")] => parse_time(&format!("{n}{unit}"))?,
        _ => return Err("expected a time such as `20ms`, `20 ms` or `1.5s`".into()),
    };
    if secs > 3600.0 {
        return Err("a time in an action must be at most 3600s".into());
    }
    Ok((secs * 1e9).round() as u64)
}

fn parse_u64(w: &str) -> Result<u64, String> {
    w.parse()
        .map_err(|_| format!("`{w}` is not a cycle number"))
}

fn parse_when(words: &[&str], rate_hz: f64) -> Result<When, String> {
    match words {
        ["at", "cycle", n] => {
            let n = parse_u64(n)?;
            Ok(When::Range { from: n, to: n + 1 })
        }
        ["at", "cycles", range] => {
            let (a, b) = range
                .split_once("..")
                .ok_or("cycle range must be written A..B")?;
            let (from, to) = (parse_u64(a)?, parse_u64(b)?);
            if to <= from {
                return Err("cycle range A..B needs B > A".into());
            }
            Ok(When::Range { from, to })
        }
        ["at", t] => {
            let secs = parse_time(t)?;
            let n = (secs * rate_hz).round() as u64;
            Ok(When::Range { from: n, to: n + 1 })
        }
        ["every", n, rest @ ..] => {
            let every = parse_u64(n)?;
            if every == 0 {
                return Err("`every` needs N ≥ 1".into());
            }
            let from = match rest {
                [] => every,
                ["from", a] => parse_u64(a)?,
                _ => return Err("expected `every N` or `every N from A`".into()),
            };
            Ok(When::Every { every, from })
        }
        _ => Err("expected `at cycle N`, `at cycles A..B`, `at TIME` or `every N [from A]`".into()),
    }
}

/// Seconds from `1.5s` or `250ms`.
pub fn parse_time(t: &str) -> Result<f64, String> {
    let (num, scale) = if let Some(ms) = t.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(s) = t.strip_suffix('s') {
        (s, 1.0)
    } else {
        return Err(format!("time `{t}` needs a unit: s or ms"));
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("time `{t}` is not a number"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("time `{t}` must be finite and not negative"));
    }
    Ok(v * scale)
}

/// FNV-1a 64: a stable default id hash for a version string.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        parse_rule(s, 100.0).unwrap()
    }

    #[test]
    fn every_documented_form_parses() {
        assert_eq!(
            rule("overrun 2x at cycles 100..110"),
            Rule {
                action: Action::Overrun(2.0),
                when: When::Range { from: 100, to: 110 }
            }
        );
        assert_eq!(
            rule("skip every 97").when,
            When::Every {
                every: 97,
                from: 97
            }
        );
        assert_eq!(
            rule("skip every 10 from 3").when,
            When::Every { every: 10, from: 3 }
        );
        assert_eq!(
            rule("fallback at cycle 5").when,
            When::Range { from: 5, to: 6 }
        );
        assert_eq!(
            rule("mode manual at 1.2s").when,
            When::Range { from: 120, to: 121 }
        );
        assert_eq!(
            rule("intervention at 250ms").when,
            When::Range { from: 25, to: 26 }
        );
        assert_eq!(rule("safe-stop at 0s").action, Action::SafeStop);
        assert_eq!(
            rule("model yolo-v8.1 hash=0xfeed at 0s").action,
            Action::Model {
                hash: 0xfeed,
                version: "yolo-v8.1".into()
            }
        );
        assert_eq!(
            rule("model v2 at 0s").action,
            Action::Model {
                hash: fnv1a(b"v2"),
                version: "v2".into()
            }
        );
        assert_eq!(
            rule("late-start 45 ms at cycle 3").action,
            Action::LateStart(45_000_000)
        );
        assert_eq!(
            rule("late-start 2.5ms every 10").action,
            Action::LateStart(2_500_000)
        );
        assert_eq!(
            rule("hang 2s at 4s"),
            Rule {
                action: Action::Hang(2_000_000_000),
                when: When::Range { from: 400, to: 401 }
            }
        );
        assert_eq!(
            rule("hang 500 ms at cycle 9").action,
            Action::Hang(500_000_000)
        );
    }

    #[test]
    fn malformed_rules_say_what_is_wrong() {
        for (text, needle) in [
            ("overrun 2 at cycle 1", "`x` suffix"),
            ("overrun 0.5x at cycle 1", "above 1x"),
            ("overrun 2x", "missing `at"),
            ("jump at cycle 1", "unknown action"),
            ("mode flying at 1s", "unknown mode"),
            ("skip at cycles 5..5", "B > A"),
            ("skip at 5", "needs a unit"),
            ("skip every 0", "N ≥ 1"),
            ("skip at -1s", "not negative"),
            ("model v1 hash=zz at 0s", "not hexadecimal"),
            ("late-start at cycle 1", "expected a time"),
            ("late-start 20 at cycle 1", "needs a unit"),
            ("late-start 20 us at cycle 1", "expected a time"),
            ("hang 0s at cycle 1", "above 0"),
            ("hang 2h at cycle 1", "needs a unit"),
            ("hang 7200s at cycle 1", "at most 3600s"),
        ] {
            let e = parse_rule(text, 100.0).unwrap_err();
            assert!(e.reason.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn a_script_skips_comments_and_reports_the_failing_line() {
        let s = "# pattern\nskip every 5\n\n  overrun 3x at cycle 2 # late\n";
        assert_eq!(parse_script(s, 10.0).unwrap().len(), 2);
        let (line, _) = parse_script("skip every 5\nbogus at 1s\n", 10.0).unwrap_err();
        assert_eq!(line, 2);
    }

    #[test]
    fn a_plan_combines_every_rule_that_matches_the_cycle() {
        let sched = Schedule::new(
            [
                "overrun 2x every 10",
                "overrun 3x at cycles 18..22",
                "skip at cycle 30",
                "fallback at cycle 20",
                "intervention at cycle 20",
                "intervention every 20",
                "mode manual at cycle 20",
                "model m2 at cycle 20",
                "late-start 5ms at cycle 20",
                "late-start 7ms at cycles 20..22",
                "hang 1s at cycle 50",
            ]
            .into_iter()
            .map(rule)
            .collect(),
        );
        let p = sched.plan(20);
        assert_eq!(p.overrun, Some(3.0));
        assert!(p.fallback && !p.skip);
        assert_eq!(p.interventions, 2);
        assert_eq!(p.mode, Some(AutonomyMode::Manual));
        assert_eq!(p.model.map(|m| m.1), Some("m2"));
        assert!(sched.plan(30).skip);
        assert_eq!(sched.plan(0).overrun, None);
        assert_eq!(sched.plan(19).overrun, Some(3.0));
        assert_eq!(sched.plan(40).overrun, Some(2.0));
        assert_eq!(p.late_start_ns, Some(7_000_000), "the longest late start");
        assert_eq!(sched.plan(21).late_start_ns, Some(7_000_000));
        assert_eq!(sched.plan(22).late_start_ns, None);
        assert_eq!(sched.plan(50).hang_ns, Some(1_000_000_000));
        assert_eq!(p.hang_ns, None);
    }
}

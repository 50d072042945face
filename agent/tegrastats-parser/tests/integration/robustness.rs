//! Property tests: no input panics, and lines built from the grammar read back exactly.

use proptest::prelude::*;
use tegrastats_parser::{OwnedSample, ParseError, Sample, parse_line};

use crate::fixtures::captures;

/// Whether `part` lies inside `line`'s memory (borrowed names must come from the line).
fn within(line: &str, part: &str) -> bool {
    let start = line.as_ptr() as usize;
    let at = part.as_ptr() as usize;
    at >= start && at + part.len() <= start + line.len()
}

/// What must hold for any input, whatever it parses to.
fn check_invariants(line: &str, result: &Result<Sample<'_>, ParseError>) {
    match result {
        Ok(sample) => {
            for token in sample.unknown() {
                assert!(
                    !token.is_empty() && within(line, token),
                    "{token:?} not from {line:?}"
                );
            }
            for t in sample.temperatures() {
                assert!(within(line, t.zone));
                assert!(t.celsius.is_none_or(f32::is_finite));
            }
            for r in sample.rails() {
                assert!(!r.name.is_empty() && within(line, r.name));
            }
            for e in sample.engines() {
                assert!(!e.name.is_empty() && within(line, e.name));
                assert!(e.active || (e.load_pct.is_none() && e.freq_mhz.is_none()));
            }
            for f in sample.gpu_fields() {
                assert!(within(line, f.name));
            }
            for cpu in sample.cpus() {
                assert!(cpu.online || (cpu.load_pct.is_none() && cpu.freq_mhz.is_none()));
            }
            let owned = OwnedSample::from(sample);
            assert_eq!(owned.unknown.len(), sample.unknown().len());
            #[cfg(feature = "serde")]
            serde_json::to_string(&owned).expect("a sample always serializes");
        }
        Err(error) => {
            let column = error.column();
            assert!(
                column >= 1 && column <= line.chars().count() + 1,
                "{error} for {line:?}"
            );
        }
    }
}

fn parse_and_check(line: &str) {
    let result = parse_line(line);
    check_invariants(line, &result);
}

/// Characters tegrastats prints, so random strings often look like fields.
const ALPHABET: &str = "[A-Za-z0-9@%/,.:()x_ \\[\\]C-]{0,160}";

#[derive(Debug, Clone)]
enum Mutation {
    Delete { at: usize, len: usize },
    Duplicate { at: usize, len: usize },
    Replace { at: usize, byte: u8 },
    Insert { at: usize, byte: u8 },
    ShuffleTokens { seed: u64 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let byte = prop_oneof![
        any::<u8>(),
        proptest::sample::select(b" @%/,[]().-0123456789xCmWkMB".to_vec())
    ];
    prop_oneof![
        (any::<usize>(), 1usize..12).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (any::<usize>(), 1usize..24).prop_map(|(at, len)| Mutation::Duplicate { at, len }),
        (any::<usize>(), byte.clone()).prop_map(|(at, byte)| Mutation::Replace { at, byte }),
        (any::<usize>(), byte).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        any::<u64>().prop_map(|seed| Mutation::ShuffleTokens { seed }),
    ]
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let len = bytes.len();
    match *mutation {
        Mutation::Delete { at, len: n } if len > 0 => {
            let at = at % len;
            bytes.drain(at..(at + n).min(len));
        }
        Mutation::Duplicate { at, len: n } if len > 0 => {
            let at = at % len;
            let copy = bytes[at..(at + n).min(len)].to_vec();
            bytes.splice(at..at, copy);
        }
        Mutation::Replace { at, byte } if len > 0 => bytes[at % len] = byte,
        Mutation::Insert { at, byte } => bytes.insert(at % (len + 1), byte),
        Mutation::ShuffleTokens { mut seed } => {
            let text = String::from_utf8_lossy(bytes).into_owned();
            let mut tokens: Vec<&str> = text.split(' ').collect();
            for i in (1..tokens.len()).rev() {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                tokens.swap(i, (seed >> 33) as usize % (i + 1));
            }
            *bytes = tokens.join(" ").into_bytes();
        }
        _ => {}
    }
}

proptest! {
    #[test]
    fn arbitrary_unicode_strings_never_panic(line in any::<String>()) {
        parse_and_check(&line);
    }

    #[test]
    fn strings_of_tegrastats_characters_never_panic(line in ALPHABET) {
        parse_and_check(&line);
    }

    #[test]
    fn mutated_real_lines_never_panic(
        index in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(mutation(), 1..8),
    ) {
        let all = captures();
        let mut bytes = index.get(&all).line.clone().into_bytes();
        for m in &mutations {
            apply(&mut bytes, m);
        }
        parse_and_check(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn real_lines_with_any_one_token_removed_still_read(
        index in any::<prop::sample::Index>(),
        drop in any::<prop::sample::Index>(),
    ) {
        let all = captures();
        let line = &index.get(&all).line;
        let tokens: Vec<&str> = line.split(' ').collect();
        let drop = drop.index(tokens.len());
        let kept: Vec<&str> = tokens.iter().enumerate().filter(|(i, _)| *i != drop).map(|(_, t)| *t).collect();
        let cut = kept.join(" ");
        let sample = parse_line(&cut);
        check_invariants(&cut, &sample);
        // Every capture has RAM and a CPU block, so one lost token never makes a line unreadable.
        prop_assert!(sample.is_ok(), "{cut}");
    }

    #[test]
    fn generated_lines_read_back_the_values_they_were_built_from(model in model()) {
        let line = model.render();
        let sample = parse_line(&line).map_err(|e| TestCaseError::fail(format!("{e}: {line}")))?;
        prop_assert!(sample.unknown().is_empty(), "unknown {:?} in {}", sample.unknown(), line);
        model.check(&sample, &line)?;
    }
}

// The model: a sample described field by field, rendered in one of the documented forms.

#[derive(Debug, Clone)]
enum EngineForm {
    Off,
    LoadAt(u32, u32),
    Load(u32),
    At(u32),
    Bare(u32),
}

/// Zone, value in millidegrees (`None`: the `-256` sentinel), and the JetPack 7.2 maximum.
type ModelTemperature = (&'static str, Option<i32>, Option<Option<i32>>);

#[derive(Debug, Clone)]
struct Model {
    timestamp: Option<(u8, u8, u16, u8, u8, u8)>,
    ram: (u32, u32, u32, bool),
    swap: Option<(u32, u32, u32)>,
    cpus: Vec<Option<(u32, u32)>>,
    shared_clock: Option<u32>,
    emc: Option<(Option<u32>, Option<u32>)>,
    gpu: Option<(Option<u32>, Vec<u32>, bool)>,
    engines: Vec<(&'static str, EngineForm)>,
    ape: Option<u32>,
    temperatures: Vec<ModelTemperature>,
    rails: Vec<(&'static str, u32, u32, Option<u32>, bool)>,
}

const ZONES: &[&str] = &[
    "CPU", "GPU", "cpu", "gpu", "tj", "SOC0", "soc012", "Tboard", "iwlwifi", "PMIC", "CV0",
];
const RAILS: &[&str] = &[
    "VDD_IN",
    "CPU",
    "GPU",
    "NC",
    "VDD_CPU_GPU_CV",
    "POM_5V_IN",
    "VIN",
    "SYS5V",
];
const ENGINES: &[&str] = &[
    "NVENC",
    "NVDEC0",
    "NVJPG1",
    "VIC",
    "OFA_FREQ",
    "NVDLA0",
    "PVA0_FREQ",
    "VIC_FREQ",
    "NVENC_LOAD",
    "AVP",
];

fn engine_form() -> impl Strategy<Value = EngineForm> {
    prop_oneof![
        Just(EngineForm::Off),
        (0u32..=100, 0u32..5000).prop_map(|(l, f)| EngineForm::LoadAt(l, f)),
        (0u32..=100).prop_map(EngineForm::Load),
        (0u32..5000).prop_map(EngineForm::At),
        (0u32..5000).prop_map(EngineForm::Bare),
    ]
}

fn milli() -> impl Strategy<Value = i32> {
    (-40_000i32..110_000).prop_filter("the sentinel", |m| *m != -256_000)
}

fn model() -> impl Strategy<Value = Model> {
    let timestamp =
        proptest::option::of((1u8..=12, 1u8..=31, 2000u16..2100, 0u8..24, 0u8..60, 0u8..60));
    let ram = (0u32..200_000, 1u32..200_000, 0u32..20_000, any::<bool>());
    let swap = proptest::option::of((0u32..50_000, 0u32..50_000, 0u32..1000));
    let cpus = prop::collection::vec(proptest::option::of((0u32..=100, 100u32..3000)), 1..16);
    let shared_clock = proptest::option::of(100u32..3000);
    let emc = proptest::option::of((
        proptest::option::of(0u32..=100),
        proptest::option::of(40u32..4267),
    ));
    let gpu = proptest::option::of((
        proptest::option::of(0u32..=100),
        prop::collection::vec(0u32..2000, 0..4),
        any::<bool>(),
    ));
    let engines = prop::collection::vec((proptest::sample::select(ENGINES), engine_form()), 0..10);
    let ape = proptest::option::of(0u32..400);
    let temperatures = prop::collection::vec(
        (
            proptest::sample::select(ZONES),
            proptest::option::weighted(0.9, milli()),
            proptest::option::of(proptest::option::weighted(0.9, milli())),
        ),
        0..12,
    );
    let rails = prop::collection::vec(
        (
            proptest::sample::select(RAILS),
            0u32..100_000,
            0u32..100_000,
            proptest::option::of(0u32..100_000),
            any::<bool>(),
        ),
        0..8,
    );
    (
        timestamp,
        ram,
        swap,
        cpus,
        shared_clock,
        emc,
        gpu,
        engines,
        ape,
        temperatures,
        rails,
    )
        .prop_map(
            |(
                timestamp,
                ram,
                swap,
                cpus,
                shared_clock,
                emc,
                gpu,
                engines,
                ape,
                temperatures,
                rails,
            )| Model {
                timestamp,
                ram,
                swap,
                cpus,
                shared_clock,
                emc,
                gpu,
                engines,
                ape,
                temperatures,
                rails,
            },
        )
}

fn decimal(milli: Option<i32>) -> String {
    let Some(m) = milli else {
        return "-256".to_owned();
    };
    let sign = if m < 0 { "-" } else { "" };
    let (whole, frac) = (m.unsigned_abs() / 1000, m.unsigned_abs() % 1000);
    let frac = format!("{frac:03}");
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() {
        format!("{sign}{whole}")
    } else {
        format!("{sign}{whole}.{frac}")
    }
}

fn celsius(milli: Option<i32>) -> Option<f32> {
    milli.map(|m| decimal(Some(m)).parse().unwrap())
}

impl Model {
    fn render(&self) -> String {
        let mut out = Vec::new();
        if let Some((mo, d, y, h, mi, s)) = self.timestamp {
            out.push(format!("{mo:02}-{d:02}-{y:04} {h:02}:{mi:02}:{s:02}"));
        }
        let (used, total, blocks, small) = self.ram;
        let lfb = if small { "512kB" } else { "4MB" };
        out.push(format!("RAM {used}/{total}MB (lfb {blocks}x{lfb})"));
        if let Some((used, total, cached)) = self.swap {
            out.push(format!("SWAP {used}/{total}MB (cached {cached}MB)"));
        }
        let entries: Vec<String> = self
            .cpus
            .iter()
            .map(|c| match (c, self.shared_clock) {
                (None, _) => "off".to_owned(),
                (Some((load, _)), Some(_)) => format!("{load}%"),
                (Some((load, freq)), None) => format!("{load}%@{freq}"),
            })
            .collect();
        let shared = self
            .shared_clock
            .map(|f| format!("@{f}"))
            .unwrap_or_default();
        out.push(format!("CPU [{}]{shared}", entries.join(",")));
        if let Some((load, freq)) = self.emc {
            let load = load.map(|l| format!("{l}%")).unwrap_or_default();
            let freq = freq.map(|f| format!("@{f}")).unwrap_or_default();
            let value = if load.is_empty() && freq.is_empty() {
                "0%".to_owned()
            } else {
                format!("{load}{freq}")
            };
            out.push(format!("EMC_FREQ {value}"));
        }
        if let Some((load, clocks, array)) = &self.gpu {
            let load_text = load.map(|l| format!("{l}%")).unwrap_or_default();
            let clock_text = match clocks.as_slice() {
                [] => String::new(),
                [one] if !array => format!("@{one}"),
                many => format!(
                    "@[{}]",
                    many.iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            };
            let value = if load_text.is_empty() && clock_text.is_empty() {
                "0%".to_owned()
            } else {
                format!("{load_text}{clock_text}")
            };
            out.push(format!("GR3D_FREQ {value}"));
        }
        for (name, form) in &self.engines {
            let value = match form {
                EngineForm::Off => "off".to_owned(),
                EngineForm::LoadAt(l, f) => format!("{l}%@{f}"),
                EngineForm::Load(l) => format!("{l}%"),
                EngineForm::At(f) => format!("@{f}"),
                EngineForm::Bare(f) => f.to_string(),
            };
            out.push(format!("{name} {value}"));
        }
        if let Some(ape) = self.ape {
            out.push(format!("APE {ape}"));
        }
        for (zone, value, max) in &self.temperatures {
            let max = max.map(|m| format!("/{}C", decimal(m))).unwrap_or_default();
            out.push(format!("{zone}@{}C{max}", decimal(*value)));
        }
        for (name, current, average, max, mw) in &self.rails {
            let unit = if *mw { "mW" } else { "" };
            let max = max.map(|m| format!("/{m}{unit}")).unwrap_or_default();
            out.push(format!("{name} {current}{unit}/{average}{unit}{max}"));
        }
        out.join(" ")
    }

    fn check(&self, sample: &Sample<'_>, line: &str) -> Result<(), TestCaseError> {
        let ts = sample
            .timestamp()
            .map(|t| (t.month, t.day, t.year, t.hour, t.minute, t.second));
        prop_assert_eq!(ts, self.timestamp, "{}", line);
        let ram = sample.ram().unwrap();
        let (used, total, blocks, small) = self.ram;
        prop_assert_eq!((ram.used_mb, ram.total_mb), (used, total));
        prop_assert_eq!(
            ram.lfb.map(|l| (l.blocks, l.block_kb)),
            Some((blocks, if small { 512 } else { 4096 }))
        );
        prop_assert_eq!(
            sample.swap().map(|s| (s.used_mb, s.total_mb, s.cached_mb)),
            self.swap.map(|(u, t, c)| (u, t, Some(c)))
        );
        let cpus: Vec<_> = sample
            .cpus()
            .iter()
            .map(|c| (c.online, c.load_pct, c.freq_mhz))
            .collect();
        let expected: Vec<_> = self
            .cpus
            .iter()
            .map(|c| match c {
                None => (false, None, None),
                Some((load, freq)) => (true, Some(*load), Some(self.shared_clock.unwrap_or(*freq))),
            })
            .collect();
        prop_assert_eq!(cpus, expected);
        let emc = sample
            .emc()
            .map(|e| (e.load_pct, e.freq_mhz.first().copied()));
        let expected_emc = self.emc.map(|(l, f)| {
            if l.is_none() && f.is_none() {
                (Some(0), None)
            } else {
                (l, f)
            }
        });
        prop_assert_eq!(emc, expected_emc);
        let gpu = sample.gpu().map(|g| (g.load_pct, g.freq_mhz.to_vec()));
        let expected_gpu = self.gpu.as_ref().map(|(l, c, _)| {
            if l.is_none() && c.is_empty() {
                (Some(0), vec![])
            } else {
                (*l, c.clone())
            }
        });
        prop_assert_eq!(gpu, expected_gpu);
        let engines: Vec<_> = sample
            .engines()
            .iter()
            .map(|e| (e.name, e.active, e.load_pct, e.freq_mhz))
            .collect();
        let expected: Vec<_> = self
            .engines
            .iter()
            .map(|(name, form)| match *form {
                EngineForm::Off => (*name, false, None, None),
                EngineForm::LoadAt(l, f) => (*name, true, Some(l), Some(f)),
                EngineForm::Load(l) => (*name, true, Some(l), None),
                EngineForm::At(f) | EngineForm::Bare(f) => (*name, true, None, Some(f)),
            })
            .collect();
        prop_assert_eq!(engines, expected);
        prop_assert_eq!(sample.ape_mhz(), self.ape);
        let temps: Vec<_> = sample
            .temperatures()
            .iter()
            .map(|t| (t.zone, t.celsius, t.max_celsius))
            .collect();
        let expected: Vec<_> = self
            .temperatures
            .iter()
            .map(|(zone, value, max)| (*zone, celsius(*value), max.and_then(celsius)))
            .collect();
        prop_assert_eq!(temps, expected);
        let rails: Vec<_> = sample
            .rails()
            .iter()
            .map(|r| (r.name, r.current_mw, r.average_mw, r.max_mw))
            .collect();
        let expected: Vec<_> = self
            .rails
            .iter()
            .map(|(n, c, a, m, _)| (*n, *c, Some(*a), *m))
            .collect();
        prop_assert_eq!(rails, expected);
        Ok(())
    }
}

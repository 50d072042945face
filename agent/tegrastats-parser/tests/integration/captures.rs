//! Every real capture line, read whole, with values checked against the text.

use tegrastats_parser::{Cpu, Sample, parse_line};

use crate::fixtures::{capture, captures};

/// Tokens a capture line may leave unknown, each with the reason it is not a field.
///
/// Empty: every token of every capture is a documented field. A token that shows up here must
/// be a genuinely new field (a name and shape the grammar does not know), never a known field
/// that failed to parse.
const ALLOWED_UNKNOWN: &[(&str, &str)] = &[];

#[test]
fn every_capture_line_parses_with_no_unknown_token_outside_the_allowed_list() {
    let mut failures = Vec::new();
    for c in captures() {
        match parse_line(&c.line) {
            Ok(sample) => {
                for token in sample.unknown() {
                    if !ALLOWED_UNKNOWN.iter().any(|(allowed, _)| allowed == token) {
                        failures.push(format!("{}: unknown token `{token}`", c.origin()));
                    }
                }
                if sample.overflow() != 0 {
                    failures.push(format!("{}: overflow {}", c.origin(), sample.overflow()));
                }
            }
            Err(error) => failures.push(format!("{}: {error}", c.origin())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_capture_line_has_ram_first_and_a_cpu_block() {
    for c in captures() {
        let sample = parse_line(&c.line).unwrap();
        let ram = sample
            .ram()
            .unwrap_or_else(|| panic!("{}: no RAM", c.origin()));
        assert!(ram.used_mb <= ram.total_mb, "{}", c.origin());
        assert!(ram.lfb.is_some(), "{}: no lfb", c.origin());
        assert!(!sample.cpus().is_empty(), "{}: no CPU", c.origin());
        let starts_with_date = c.line.as_bytes()[0].is_ascii_digit();
        assert_eq!(
            sample.timestamp().is_some(),
            starts_with_date,
            "{}",
            c.origin()
        );
    }
}

/// Recounts fields with plain string operations, independently of the parser's grammar.
struct Recount<'a> {
    zones: Vec<&'a str>,
    rails: Vec<&'a str>,
    cores: usize,
    off_cores: usize,
}

fn recount(line: &str) -> Recount<'_> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    let zones = tokens
        .iter()
        .filter(|t| !t.starts_with('@') && t.contains('@') && t.ends_with('C'))
        .map(|t| t.split('@').next().unwrap())
        .collect();
    let rails = tokens
        .windows(2)
        .filter(|w| !["RAM", "SWAP", "IRAM"].contains(&w[0]) && w[1].contains('/'))
        .map(|w| w[0])
        .collect();
    let block = tokens
        .windows(2)
        .find(|w| (w[0] == "CPU" || w[0] == "cpu") && w[1].starts_with('['))
        .map(|w| w[1])
        .unwrap();
    let entries = block.trim_start_matches('[').split(']').next().unwrap();
    Recount {
        zones,
        rails,
        cores: entries.split(',').count(),
        off_cores: entries.split(',').filter(|e| *e == "off").count(),
    }
}

#[test]
fn every_capture_line_keeps_each_zone_rail_and_core_in_line_order() {
    for c in captures() {
        let sample = parse_line(&c.line).unwrap();
        let expected = recount(&c.line);
        let zones: Vec<&str> = sample.temperatures().iter().map(|t| t.zone).collect();
        assert_eq!(zones, expected.zones, "{}", c.origin());
        let rails: Vec<&str> = sample.rails().iter().map(|r| r.name).collect();
        assert_eq!(rails, expected.rails, "{}", c.origin());
        assert_eq!(sample.cpus().len(), expected.cores, "{}", c.origin());
        let off = sample.cpus().iter().filter(|cpu| !cpu.online).count();
        assert_eq!(off, expected.off_cores, "{}", c.origin());
    }
}

fn parsed(line: &str) -> Sample<'_> {
    parse_line(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn agx_orin_jp5_0_keeps_both_nc_rails_and_reads_minus_256_as_unavailable() {
    let line = capture("orin-agx-32gb_jp5.0.2_l4t-r35.1.txt", 1);
    let s = parsed(line);
    let t = s.timestamp().unwrap();
    assert_eq!(
        (t.month, t.day, t.year, t.hour, t.minute, t.second),
        (10, 16, 2023, 10, 59, 22)
    );
    assert_eq!(t.to_string(), "10-16-2023 10:59:22");
    let nc: Vec<_> = s.rails().iter().filter(|r| r.name == "NC").collect();
    assert_eq!(nc.len(), 2);
    assert!(
        nc.iter()
            .all(|r| r.current_mw == 0 && r.average_mw == Some(0))
    );
    let cv0 = s.temperatures()[0];
    assert_eq!((cv0.zone, cv0.celsius), ("CV0", None));
    assert_eq!(s.temperatures()[1].celsius, Some(43.5));
    let fields: Vec<_> = s
        .gpu_fields()
        .iter()
        .map(|f| (f.name, f.load_pct, f.freq_mhz.to_vec()))
        .collect();
    assert_eq!(
        fields,
        [
            ("GR3D_FREQ", Some(0), vec![114]),
            ("GR3D2_FREQ", Some(0), vec![114])
        ]
    );
    assert_eq!(s.gpu().unwrap().freq_mhz.as_slice(), [114, 114]);
    let engines: Vec<_> = s.engines().iter().map(|e| (e.name, e.freq_mhz)).collect();
    assert_eq!(engines, [("NVJPG1", Some(729)), ("VIC_FREQ", Some(729))]);
    assert_eq!(s.ape_mhz(), Some(233));
    assert_eq!(s.cpus().len(), 12);
    assert_eq!(
        s.cpus()[5],
        Cpu {
            online: true,
            load_pct: Some(0),
            freq_mhz: Some(730)
        }
    );
}

#[test]
fn agx_xavier_jp4_tells_the_cpu_rail_from_the_cpu_temperature_and_block() {
    let line = capture("xavier-agx_jp4.1_l4t-r31.txt", 1);
    let s = parsed(line);
    assert_eq!(s.cpus().len(), 8);
    assert!(s.cpus()[..4].iter().all(|c| c.online));
    assert!(s.cpus()[4..].iter().all(|c| *c
        == Cpu {
            online: false,
            load_pct: None,
            freq_mhz: None
        }));
    let cpu_temp = s.temperatures().iter().find(|t| t.zone == "CPU").unwrap();
    assert_eq!(cpu_temp.celsius, Some(30.0));
    let cpu_rail = s.rails().iter().find(|r| r.name == "CPU").unwrap();
    assert_eq!(
        (cpu_rail.current_mw, cpu_rail.average_mw, cpu_rail.max_mw),
        (466, Some(466), None)
    );
    let gpu_rail = s.rails().iter().find(|r| r.name == "GPU").unwrap();
    assert_eq!(gpu_rail.current_mw, 466);
    assert_eq!(s.mts().map(|m| (m.fg_pct, m.bg_pct)), Some((0, 0)));
    assert_eq!(
        s.temperatures()
            .iter()
            .find(|t| t.zone == "thermal")
            .unwrap()
            .celsius,
        Some(29.45)
    );
}

#[test]
fn tx2_jp3_keeps_a_512_kb_lfb_and_off_cores_at_their_index() {
    let s = parsed(capture("tx2_jp3.x_l4t-r28.txt", 1));
    assert_eq!(
        s.ram().unwrap().lfb.map(|l| (l.blocks, l.block_kb)),
        Some((1, 512))
    );
    assert!(s.swap().is_none());
    let s = parsed(capture("tx2_jp3.x_l4t-r28.txt", 2));
    let online: Vec<bool> = s.cpus().iter().map(|c| c.online).collect();
    assert_eq!(online, [true, false, false, false, false, false]);
    assert_eq!(s.cpus()[0].freq_mhz, Some(345));
    assert_eq!(
        s.emc().map(|e| (e.load_pct, e.freq_mhz.to_vec())),
        Some((Some(13), vec![40]))
    );
    assert_eq!(
        s.swap().map(|w| (w.used_mb, w.total_mb, w.cached_mb)),
        Some((0, 512, Some(0)))
    );
}

#[test]
fn old_tx1_format_shares_one_clock_across_cores_and_reads_edp_limit() {
    let s = parsed(capture("tx1_l4t-r23-r24_old-format.txt", 1));
    let loads: Vec<_> = s.cpus().iter().map(|c| (c.load_pct, c.freq_mhz)).collect();
    assert_eq!(
        loads,
        [
            (Some(2), Some(1734)),
            (Some(5), Some(1734)),
            (Some(8), Some(1734)),
            (Some(11), Some(1734))
        ]
    );
    assert_eq!(
        s.emc().map(|e| (e.load_pct, e.freq_mhz.to_vec())),
        Some((Some(0), vec![1600]))
    );
    let engines: Vec<_> = s
        .engines()
        .iter()
        .map(|e| (e.name, e.load_pct, e.freq_mhz))
        .collect();
    assert_eq!(
        engines,
        [
            ("AVP", Some(1), Some(115)),
            ("NVDEC", None, Some(192)),
            ("MSENC", None, Some(192))
        ]
    );
    assert_eq!(s.gpu_fields()[0].name, "GR3D");
    assert_eq!(
        s.gpu().map(|g| (g.load_pct, g.freq_mhz.to_vec())),
        Some((Some(0), vec![998]))
    );
    assert_eq!(s.edp_limit_mhz(), Some(1734));
    assert!(s.temperatures().is_empty() && s.rails().is_empty());
}

#[test]
fn nano_reads_iram_with_the_lfb_glued_to_the_total() {
    let s = parsed(capture("nano_jp4.2_l4t-r32.1-32.2.txt", 1));
    let iram = s.iram().unwrap();
    assert_eq!(
        (iram.used_kb, iram.total_kb, iram.lfb_kb),
        (0, 252, Some(252))
    );
    assert_eq!(
        s.rails().iter().map(|r| r.name).collect::<Vec<_>>(),
        ["POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"]
    );
    assert_eq!(s.rails()[0].average_mw, Some(4680));
}

#[test]
fn non_root_jp4_lines_have_utilisation_without_clocks() {
    let s = parsed(capture("tx2_jp4.x_l4t-r32.txt", 2));
    assert_eq!(
        s.emc().map(|e| (e.load_pct, e.freq_mhz.len())),
        Some((Some(0), 0))
    );
    let gpu = s.gpu().unwrap();
    assert_eq!((gpu.load_pct, gpu.freq_mhz.len()), (Some(99), 0));
    assert!(s.engines().is_empty() && s.ape_mhz().is_none() && s.mts().is_none());
}

#[test]
fn orin_nx_jp5_keeps_gr3d2_clock_apart_when_gr3d_has_none() {
    let s = parsed(capture("orin-nx-16gb_jp5.0-5.1.1_l4t-r35.1-35.3.txt", 1));
    let fields: Vec<_> = s
        .gpu_fields()
        .iter()
        .map(|f| (f.name, f.load_pct, f.freq_mhz.to_vec()))
        .collect();
    assert_eq!(
        fields,
        [
            ("GR3D_FREQ", Some(0), vec![]),
            ("GR3D2_FREQ", Some(0), vec![0])
        ]
    );
    assert!(s.rails().is_empty());
}

#[test]
fn agx_orin_jp6_reads_array_clocks_and_busy_engines() {
    let s = parsed(capture("orin-agx-64gb_jp6.2.1_l4t-r36.4.4.txt", 1));
    assert_eq!(
        s.gpu().map(|g| (g.load_pct, g.freq_mhz.to_vec())),
        Some((Some(0), vec![0, 0]))
    );
    let nvenc = s.engines()[0];
    assert_eq!(
        (nvenc.name, nvenc.active, nvenc.load_pct, nvenc.freq_mhz),
        ("NVENC", true, Some(79), Some(166))
    );
    let nvdec = s.engines()[1];
    assert_eq!(
        (nvdec.name, nvdec.active, nvdec.load_pct, nvdec.freq_mhz),
        ("NVDEC", false, None, None)
    );
    assert_eq!(s.engines().len(), 9);
    assert!(
        s.temperatures().iter().all(|t| t.zone != "gpu"),
        "JP6 omits an unreadable zone"
    );
    let s = parsed(capture("orin-agx-64gb_jp6.x_l4t-r36.txt", 4));
    assert_eq!(s.gpu().unwrap().freq_mhz.as_slice(), [1300, 1300]);
}

#[test]
fn thor_gpu_has_three_gpc_clocks_and_no_utilisation() {
    let s = parsed(capture("thor_jp7.1_l4t-r38.4.txt", 1));
    let gpu = s.gpu().unwrap();
    assert_eq!(gpu.load_pct, None);
    assert_eq!(gpu.freq_mhz.as_slice(), [0, 0, 0]);
    assert_eq!(s.cpus().len(), 14);
    let ofa = s.engines().iter().find(|e| e.name == "OFA_FREQ").unwrap();
    assert_eq!(
        (ofa.active, ofa.load_pct, ofa.freq_mhz),
        (true, None, Some(0))
    );
    let s = parsed(capture("thor_jp7.x_l4t-r38.txt", 1));
    assert!(s.gpu().is_none() && s.swap().is_none() && s.emc().is_none());
    assert_eq!(
        s.rails().last().map(|r| (r.name, r.current_mw)),
        Some(("VIN", 16802))
    );
}

#[test]
fn old_parker_lines_are_ram_and_a_lowercase_cpu_block_only() {
    let s = parsed(capture("tx2-or-drivepx2_l4t-r27-r28.1_old-format.txt", 5));
    let cores: Vec<_> = s.cpus().iter().map(|c| (c.load_pct, c.freq_mhz)).collect();
    assert_eq!(cores[1], (Some(34), Some(2035)));
    assert_eq!(cores.len(), 6);
    assert!(s.emc().is_none() && s.gpu().is_none() && s.temperatures().is_empty());
}

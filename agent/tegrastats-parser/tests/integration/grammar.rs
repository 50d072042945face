//! One test per form of the tegrastats grammar, including forms absent from the real captures.
//!
//! Lines marked "composed" are built from the documented grammar (field by field, values in
//! observed ranges), not copied from a device; the real lines are in `captures.rs`.

use tegrastats_parser::{Cpu, ParseError, Sample, parse_line};

fn parsed(line: &str) -> Sample<'_> {
    let sample = parse_line(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(sample.overflow(), 0);
    sample
}

/// Parses a line that must read whole, with no unknown token.
fn clean(line: &str) -> Sample<'_> {
    let sample = parsed(line);
    assert!(
        sample.unknown().is_empty(),
        "unknown {:?} in {line}",
        sample.unknown()
    );
    sample
}

const CPU4: &str = "CPU [1%@729,2%@729,3%@729,4%@729]";

fn cores(sample: &Sample<'_>) -> Vec<(bool, Option<u32>, Option<u32>)> {
    sample
        .cpus()
        .iter()
        .map(|c| (c.online, c.load_pct, c.freq_mhz))
        .collect()
}

fn temps(sample: &Sample<'_>) -> Vec<(String, Option<f32>, Option<f32>)> {
    sample
        .temperatures()
        .iter()
        .map(|t| (t.zone.to_owned(), t.celsius, t.max_celsius))
        .collect()
}

fn rails(sample: &Sample<'_>) -> Vec<(String, u32, Option<u32>, Option<u32>)> {
    sample
        .rails()
        .iter()
        .map(|r| (r.name.to_owned(), r.current_mw, r.average_mw, r.max_mw))
        .collect()
}

fn engines(sample: &Sample<'_>) -> Vec<(String, bool, Option<u32>, Option<u32>)> {
    sample
        .engines()
        .iter()
        .map(|e| (e.name.to_owned(), e.active, e.load_pct, e.freq_mhz))
        .collect()
}

fn gpu_fields(sample: &Sample<'_>) -> Vec<(String, Option<u32>, Vec<u32>)> {
    sample
        .gpu_fields()
        .iter()
        .map(|f| (f.name.to_owned(), f.load_pct, f.freq_mhz.to_vec()))
        .collect()
}

fn s(text: &str) -> String {
    text.to_owned()
}

// §1 line structure

#[test]
fn runs_of_whitespace_tabs_and_a_crlf_ending_are_tolerated() {
    let sample = clean("  RAM 1/2MB   (lfb 1x4MB)\tCPU [1%@2,off]  tj@40C \r");
    assert_eq!(sample.ram().map(|r| r.total_mb), Some(2));
    assert_eq!(
        cores(&sample),
        [(true, Some(1), Some(2)), (false, None, None)]
    );
    assert_eq!(temps(&sample), [(s("tj"), Some(40.0), None)]);
}

#[test]
fn the_timestamp_is_optional_and_read_only_at_the_start() {
    let sample = clean("01-20-2026 22:46:22 RAM 1/2MB (lfb 1x4MB) CPU [1%@2]");
    assert_eq!(
        sample.timestamp().map(|t| t.to_string()),
        Some(s("01-20-2026 22:46:22"))
    );
    assert!(
        clean("RAM 1/2MB (lfb 1x4MB) CPU [1%@2]")
            .timestamp()
            .is_none()
    );
    let late = parsed("RAM 1/2MB CPU [1%@2] 01-20-2026 22:46:22");
    assert!(late.timestamp().is_none());
    assert_eq!(late.unknown(), ["01-20-2026", "22:46:22"]);
}

#[test]
fn an_impossible_date_is_not_a_timestamp() {
    let sample = parsed("13-40-2026 25:61:00 RAM 1/2MB");
    assert!(sample.timestamp().is_none());
    assert_eq!(sample.unknown(), ["13-40-2026", "25:61:00"]);
}

#[test]
fn families_are_read_in_any_order() {
    let sample = clean("VDD_IN 5/5 tj@40C CPU [1%@2] RAM 1/2MB (lfb 1x4MB) GR3D_FREQ 5%@[9]");
    assert_eq!(sample.ram().map(|r| r.used_mb), Some(1));
    assert_eq!(sample.cpus().len(), 1);
    assert_eq!(rails(&sample), [(s("VDD_IN"), 5, Some(5), None)]);
    assert_eq!(sample.gpu().map(|g| g.load_pct), Some(Some(5)));
}

// §2.1 RAM, §2.2 SWAP, §2.3 IRAM

#[test]
fn ram_lfb_sizes_convert_to_kilobytes() {
    for (lfb, blocks, block_kb) in [
        ("6429x4MB", 6429, 4096),
        ("3x2MB", 3, 2048),
        ("5x1MB", 5, 1024),
        ("1x512kB", 1, 512),
    ] {
        let line = format!("RAM 4722/7844MB (lfb {lfb}) {CPU4}");
        let ram = clean(&line).ram().unwrap();
        assert_eq!((ram.used_mb, ram.total_mb), (4722, 7844));
        assert_eq!(
            ram.lfb.map(|l| (l.blocks, l.block_kb)),
            Some((blocks, block_kb))
        );
    }
}

#[test]
fn ram_printed_in_kilobytes_is_given_in_megabytes() {
    let ram = clean("RAM 2097152/4194304kB (lfb 1x4MB)").ram().unwrap();
    assert_eq!((ram.used_mb, ram.total_mb), (2048, 4096));
}

#[test]
fn ram_with_the_lfb_glued_or_missing_still_reads() {
    let glued = clean("RAM 125811/125811MB(lfb 1x4MB)").ram().unwrap();
    assert_eq!(
        (glued.used_mb, glued.lfb.map(|l| l.blocks)),
        (125811, Some(1))
    );
    assert!(clean("RAM 1/2MB CPU [1%@2]").ram().unwrap().lfb.is_none());
}

#[test]
fn a_garbled_lfb_keeps_the_ram_values_and_leaves_its_tokens_unknown() {
    let sample = parsed("RAM 1/2MB (lfb 1x4 CPU [1%@2]");
    assert_eq!(sample.ram().map(|r| (r.used_mb, r.lfb)), Some((1, None)));
    assert_eq!(sample.unknown(), ["(lfb", "1x4"]);
    assert_eq!(sample.cpus().len(), 1);
}

#[test]
fn swap_reads_used_total_and_cached() {
    let swap = clean("RAM 1/2MB SWAP 2640/16384MB (cached 202MB)")
        .swap()
        .unwrap();
    assert_eq!(
        (swap.used_mb, swap.total_mb, swap.cached_mb),
        (2640, 16384, Some(202))
    );
}

#[test]
fn iram_reads_with_or_without_a_space_before_the_lfb() {
    for line in ["IRAM 0/252kB(lfb 252kB)", "IRAM 10/252kB (lfb 200kB)"] {
        let iram = clean(line).iram().unwrap();
        assert_eq!(iram.total_kb, 252);
        assert!(iram.lfb_kb.is_some_and(|kb| kb >= 200));
    }
}

// §2.4 CPU

#[test]
fn off_cores_keep_their_index_in_the_middle_at_the_end_or_alone() {
    let middle = clean("CPU [1%@345,off,off,1%@345,0%@345,2%@345]");
    let online: Vec<bool> = middle.cpus().iter().map(|c| c.online).collect();
    assert_eq!(online, [true, false, false, true, true, true]);
    let end = clean("CPU [6%@729,9%@729,5%@729,16%@729,off,off,off,off]");
    assert_eq!(end.cpus().iter().filter(|c| !c.online).count(), 4);
    assert_eq!(end.cpus()[3].load_pct, Some(16));
    let alone = clean("CPU [2%@345,off,off,off,off,off]");
    assert_eq!(
        alone.cpus()[0],
        Cpu {
            online: true,
            load_pct: Some(2),
            freq_mhz: Some(345)
        }
    );
}

#[test]
fn lowercase_cpu_block_with_per_core_clocks_is_the_parker_form() {
    let sample = clean(
        "RAM 2417/6660MB (lfb 620x4MB) cpu [0%@1996,0%@2035,0%@2035,0%@1996,0%@1996,0%@1996]",
    );
    assert_eq!(sample.cpus()[1].freq_mhz, Some(2035));
}

#[test]
fn tk1_line_shares_the_trailing_clock_across_cores() {
    // Composed from the TK1 forms: lowercase `cpu [X%,...]@F`, `EMC`, `AVP`, `VDE`, `GR3D`, EDP.
    let sample = clean(
        "RAM 714/1876MB (lfb 139x4MB) SWAP 0/2048MB (cached 0MB) cpu [25%,7%,1%,1%]@2218 \
         EMC 3%@924 AVP 0%@81 VDE 120 GR3D 0%@252 EDP limit 0",
    );
    assert_eq!(cores(&sample)[0], (true, Some(25), Some(2218)));
    assert!(sample.cpus().iter().all(|c| c.freq_mhz == Some(2218)));
    assert_eq!(
        sample.emc().map(|e| (e.load_pct, e.freq_mhz.to_vec())),
        Some((Some(3), vec![924]))
    );
    assert_eq!(
        engines(&sample),
        [
            (s("AVP"), true, Some(0), Some(81)),
            (s("VDE"), true, None, Some(120))
        ]
    );
    assert_eq!(gpu_fields(&sample), [(s("GR3D"), Some(0), vec![252])]);
    assert_eq!(sample.edp_limit_mhz(), Some(0));
}

#[test]
fn old_shared_clock_form_leaves_off_cores_without_a_clock() {
    let sample = clean("cpu [48%,off,off,off]@2065");
    assert_eq!(
        cores(&sample),
        [
            (true, Some(48), Some(2065)),
            (false, None, None),
            (false, None, None),
            (false, None, None)
        ]
    );
}

#[test]
fn documented_blank_entries_are_offline_cores() {
    let sample = clean("CPU [30%,12%, , ]@1734");
    assert_eq!(
        cores(&sample),
        [
            (true, Some(30), Some(1734)),
            (true, Some(12), Some(1734)),
            (false, None, None),
            (false, None, None)
        ]
    );
}

#[test]
fn an_unusually_low_core_clock_is_kept() {
    let sample = clean("CPU [97%@1984,93%@247]");
    assert_eq!(sample.cpus()[1].freq_mhz, Some(247));
}

// §2.5 EMC

#[test]
fn every_emc_form_reads_with_missing_parts_as_none() {
    let cases: [(&str, Option<u32>, &[u32]); 6] = [
        ("EMC_FREQ 61%@2133", Some(61), &[2133]),
        ("EMC_FREQ 0%", Some(0), &[]),
        ("EMC_FREQ @3199", None, &[3199]),
        ("EMC_FREQ @0", None, &[0]),
        ("EMC 17%@924", Some(17), &[924]),
        ("EMC_FREQ 13%@40", Some(13), &[40]),
    ];
    for (field, load, clocks) in cases {
        let line = format!("RAM 1/2MB {field}");
        let emc = clean(&line)
            .emc()
            .unwrap_or_else(|| panic!("no EMC in {field}"));
        assert_eq!(
            (emc.load_pct, emc.freq_mhz.as_slice()),
            (load, clocks),
            "{field}"
        );
    }
    assert!(clean("RAM 1/2MB CPU [1%@2]").emc().is_none());
}

// §2.6 GR3D

#[test]
fn every_gr3d_shape_reads_with_missing_utilisation_as_none() {
    let cases: [(&str, Option<u32>, &[u32]); 9] = [
        ("GR3D 0%@998", Some(0), &[998]),
        ("GR3D_FREQ 71%@1300", Some(71), &[1300]),
        ("GR3D_FREQ 0%", Some(0), &[]),
        ("GR3D_FREQ 84%@[713]", Some(84), &[713]),
        ("GR3D_FREQ 0%@[0,0]", Some(0), &[0, 0]),
        ("GR3D_FREQ 87%@[305,305]", Some(87), &[305, 305]),
        ("GR3D_FREQ 0%@[1300,1300]", Some(0), &[1300, 1300]),
        ("GR3D_FREQ @[0,0,0]", None, &[0, 0, 0]),
        ("GR3D_FREQ @[314,314,314]", None, &[314, 314, 314]),
    ];
    for (field, load, clocks) in cases {
        let line = format!("RAM 1/2MB {field}");
        let gpu = clean(&line)
            .gpu()
            .unwrap_or_else(|| panic!("no GPU in {field}"));
        assert_eq!(
            (gpu.load_pct, gpu.freq_mhz.as_slice()),
            (load, clocks),
            "{field}"
        );
    }
}

#[test]
fn jp5_orin_per_gpc_fields_keep_their_own_loads() {
    // Composed: the DRIVE-like pair whose GPC loads differ.
    let sample = clean("RAM 1/2MB GR3D_FREQ 73%@1275 GR3D2_FREQ 99%@1275");
    assert_eq!(
        gpu_fields(&sample),
        [
            (s("GR3D_FREQ"), Some(73), vec![1275]),
            (s("GR3D2_FREQ"), Some(99), vec![1275])
        ]
    );
    let gpu = sample.gpu().unwrap();
    assert_eq!(
        (gpu.load_pct, gpu.freq_mhz.as_slice()),
        (Some(73), &[1275, 1275][..])
    );
    let gated = clean("RAM 1/2MB GR3D_FREQ 0%@611 GR3D2_FREQ 0%@0");
    assert_eq!(gated.gpu().unwrap().freq_mhz.as_slice(), [611, 0]);
}

#[test]
fn gr3d_pci_is_a_discrete_gpu_outside_the_integrated_summary() {
    let sample = clean("RAM 1/2MB GR3D 5%@998 GR3D_PCI 40%@1500");
    assert_eq!(
        gpu_fields(&sample)[1],
        (s("GR3D_PCI"), Some(40), vec![1500])
    );
    assert_eq!(
        sample.gpu().map(|g| (g.load_pct, g.freq_mhz.to_vec())),
        Some((Some(5), vec![998]))
    );
    let only_pci = clean("RAM 1/2MB GR3D_PCI 40%@1500");
    assert!(only_pci.gpu().is_none());
    assert_eq!(only_pci.gpu_fields().len(), 1);
}

#[test]
fn a_line_without_gr3d_has_no_gpu() {
    assert!(clean("RAM 1/2MB CPU [1%@2] cpu@30C").gpu().is_none());
}

// §2.7 APE, MTS, EDP

#[test]
fn ape_mts_and_edp_limit_read_their_values() {
    let sample = clean("RAM 1/2MB APE 150 MTS fg 1% bg 9% EDP limit 1734");
    assert_eq!(sample.ape_mhz(), Some(150));
    assert_eq!(sample.mts().map(|m| (m.fg_pct, m.bg_pct)), Some((1, 9)));
    assert_eq!(sample.edp_limit_mhz(), Some(1734));
    assert_eq!(clean("RAM 1/2MB EDP limit 0").edp_limit_mhz(), Some(0));
}

// §2.8 engines

#[test]
fn old_and_jp4_engines_print_a_clock_or_a_load_at_a_clock() {
    let sample = clean("RAM 1/2MB AVP 1%@115 VDE 120 NVDEC 192 MSENC 192 NVENC 716");
    assert_eq!(
        engines(&sample),
        [
            (s("AVP"), true, Some(1), Some(115)),
            (s("VDE"), true, None, Some(120)),
            (s("NVDEC"), true, None, Some(192)),
            (s("MSENC"), true, None, Some(192)),
            (s("NVENC"), true, None, Some(716)),
        ]
    );
}

#[test]
fn jp6_and_jp7_2_engines_are_off_or_busy_at_a_clock() {
    let sample = clean(
        "RAM 1/2MB NVENC0 off NVDEC0 40%@115 NVJPG0 off NVJPG1 off VIC 31%@115 OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off",
    );
    let list = engines(&sample);
    assert_eq!(list.len(), 9);
    assert_eq!(list[0], (s("NVENC0"), false, None, None));
    assert_eq!(list[1], (s("NVDEC0"), true, Some(40), Some(115)));
    assert_eq!(list[8], (s("PVA0_FREQ"), false, None, None));
}

#[test]
fn thor_engines_print_a_clock_after_an_at_sign() {
    let sample = clean("RAM 1/2MB NVENC0_FREQ @1556 NVDEC1_FREQ @0 VIC 59%@423 OFA_FREQ @315");
    assert_eq!(
        engines(&sample),
        [
            (s("NVENC0_FREQ"), true, None, Some(1556)),
            (s("NVDEC1_FREQ"), true, None, Some(0)),
            (s("VIC"), true, Some(59), Some(423)),
            (s("OFA_FREQ"), true, None, Some(315)),
        ]
    );
}

#[test]
fn drive_load_engines_print_a_load_without_a_clock() {
    // Composed DRIVE-OS-like line: `*_LOAD X%` engines, `EMC_FREQ @F`, guest RAM total.
    let sample = clean(
        "RAM 6443/24402MB (lfb 92x4MB) CPU [3%@2201,1%@2201] EMC_FREQ @3199 GR3D_FREQ 73%@[1275,1275] \
         NVENC_LOAD 5% NVDEC_LOAD 0% VIC_LOAD 12% NVDLA0_LOAD 0% NVDLA1_LOAD 100% APE 81",
    );
    let list = engines(&sample);
    assert_eq!(list[0], (s("NVENC_LOAD"), true, Some(5), None));
    assert_eq!(list[4], (s("NVDLA1_LOAD"), true, Some(100), None));
    assert_eq!(sample.emc().map(|e| e.load_pct), Some(None));
    assert_eq!(sample.ape_mhz(), Some(81));
}

#[test]
fn a_documented_but_unseen_pva_load_array_is_kept_as_unknown_text() {
    let sample = parsed("RAM 1/2MB PVA0_FREQ [10%,20%]@1000 OFA 5%@500");
    assert_eq!(sample.unknown(), ["PVA0_FREQ", "[10%,20%]@1000"]);
    assert_eq!(engines(&sample), [(s("OFA"), true, Some(5), Some(500))]);
}

// §2.9 temperatures

#[test]
fn temperatures_keep_zero_to_three_decimals_and_negative_values() {
    let sample = clean("RAM 1/2MB PLL@57C CPU@60.5C thermal@46.4C tj@47.281C cpu@42.593C AO@-5.5C");
    let values: Vec<Option<f32>> = sample.temperatures().iter().map(|t| t.celsius).collect();
    assert_eq!(
        values,
        [
            Some(57.0),
            Some(60.5),
            Some(46.4),
            Some(47.281),
            Some(42.593),
            Some(-5.5)
        ]
    );
}

#[test]
fn minus_256_is_an_unreadable_zone_not_a_temperature() {
    let sample = clean("RAM 1/2MB CV0@-256C GPU@-256C CPU@43.5C");
    assert_eq!(
        temps(&sample),
        [
            (s("CV0"), None, None),
            (s("GPU"), None, None),
            (s("CPU"), Some(43.5), None)
        ]
    );
}

#[test]
fn jp7_2_temperatures_carry_a_maximum_and_both_forms_mix_on_one_line() {
    let sample = clean("RAM 1/2MB cpu@34.312C/34.843C gpu@62.906C tj@35C/35.5C soc012@-256C/40C");
    assert_eq!(
        temps(&sample),
        [
            (s("cpu"), Some(34.312), Some(34.843)),
            (s("gpu"), Some(62.906), None),
            (s("tj"), Some(35.0), Some(35.5)),
            (s("soc012"), None, Some(40.0)),
        ]
    );
}

#[test]
fn zone_names_keep_their_case_and_odd_names() {
    let sample = clean(
        "RAM 1/2MB CPU@30C cpu@31C Tboard@32C tboard@33C iwlwifi@35C max170xx@36C Charger@37C",
    );
    let zones: Vec<&str> = sample.temperatures().iter().map(|t| t.zone).collect();
    assert_eq!(
        zones,
        [
            "CPU", "cpu", "Tboard", "tboard", "iwlwifi", "max170xx", "Charger"
        ]
    );
}

// §2.10 rails

#[test]
fn rails_read_without_unit_with_mw_and_with_a_jp7_2_maximum() {
    let sample = clean(
        "RAM 1/2MB VDD_IN 2532/2698 VDD_CPU 8896mW/7585mW VIN 87426mW/43713mW/87426mW VDD_SOC 5mW",
    );
    assert_eq!(
        rails(&sample),
        [
            (s("VDD_IN"), 2532, Some(2698), None),
            (s("VDD_CPU"), 8896, Some(7585), None),
            (s("VIN"), 87426, Some(43713), Some(87426)),
            (s("VDD_SOC"), 5, None, None),
        ]
    );
}

#[test]
fn a_jp7_2_orin_line_reads_whole() {
    // Composed JetPack 7.2 AGX Orin line: indexed codec names, cur/max temps, cur/avg/max rails.
    let sample = clean(
        "04-02-2026 10:00:01 RAM 3000/62841MB (lfb 10x4MB) SWAP 0/31420MB (cached 0MB) \
         CPU [1%@729,0%@729,off,off] EMC_FREQ 0%@2133 GR3D_FREQ 0%@[1300,1300] NVENC0 off NVDEC0 off \
         NVJPG0 off NVJPG1 off VIC off OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off APE 174 \
         cpu@34.312C/34.843C soc2@33C/33.5C tj@35C/35.5C VDD_GPU_SOC 2412mW/2412mW/2412mW \
         VDD_CPU_CV 1607mW/1500mW/1700mW VIN_SYS_5V0 4707mW/4707mW/4707mW",
    );
    assert_eq!(sample.temperatures().len(), 3);
    assert!(sample.rails().iter().all(|r| r.max_mw.is_some()));
    assert_eq!(sample.engines().len(), 9);
}

#[test]
fn duplicate_rail_names_are_all_kept() {
    let sample = clean("RAM 1/2MB NC 0mW/0mW VDDQ_VDD2_1V8AO 707mW/707mW NC 0mW/0mW");
    assert_eq!(sample.rails().iter().filter(|r| r.name == "NC").count(), 2);
}

// §5 pitfalls

#[test]
fn gpu_and_cpu_names_are_told_apart_by_token_shape() {
    let sample = clean("RAM 1/2MB CPU [1%@2] CPU@41C GPU@30C CPU 466/466 GPU 10120mW/9639mW");
    assert_eq!(sample.cpus().len(), 1);
    assert_eq!(
        temps(&sample),
        [(s("CPU"), Some(41.0), None), (s("GPU"), Some(30.0), None)]
    );
    assert_eq!(
        rails(&sample),
        [
            (s("CPU"), 466, Some(466), None),
            (s("GPU"), 10120, Some(9639), None)
        ]
    );
}

#[test]
fn unknown_tokens_are_kept_verbatim_and_do_not_stop_the_line() {
    let sample = parsed("RAM 1/2MB FOO [1,2] bar?? CPU [1%@2] tj@40C");
    assert_eq!(sample.unknown(), ["FOO", "[1,2]", "bar??"]);
    assert_eq!(sample.cpus().len(), 1);
    assert_eq!(sample.temperatures().len(), 1);
}

#[test]
fn a_repeated_single_field_is_kept_whole_as_unknown() {
    let sample = parsed("RAM 1/2MB (lfb 1x4MB) RAM 3/4MB (lfb 2x4MB) CPU [1%@2] cpu [5%]@9");
    assert_eq!(sample.ram().map(|r| r.used_mb), Some(1));
    assert_eq!(sample.unknown(), ["RAM 3/4MB (lfb 2x4MB)", "cpu [5%]@9"]);
}

#[test]
fn lists_past_their_capacity_are_counted_as_overflow() {
    let mut line = String::from("RAM 1/2MB");
    for zone in 0..40 {
        line.push_str(&format!(" z{zone}@40C"));
    }
    let sample = parse_line(&line).unwrap();
    assert_eq!(
        sample.temperatures().len(),
        tegrastats_parser::MAX_TEMPERATURES
    );
    assert_eq!(
        sample.overflow(),
        40 - tegrastats_parser::MAX_TEMPERATURES as u32
    );
    assert_eq!(sample.temperatures().last().map(|t| t.zone), Some("z31"));
}

#[test]
fn numbers_too_big_for_32_bits_leave_the_field_unknown() {
    let sample = parsed("RAM 1/2MB VDD_IN 99999999999/1");
    assert_eq!(sample.unknown(), ["VDD_IN", "99999999999/1"]);
}

// Errors

#[test]
fn text_with_an_at_sign_is_not_taken_for_a_temperature() {
    let error = parse_line("mail root@localhost about GR3D@").unwrap_err();
    assert_eq!(error, ParseError::NoField { column: 1 });
    let sample = parsed("RAM 1/2MB [x]@40C cpu@40C");
    assert_eq!(sample.unknown(), ["[x]@40C"]);
    assert_eq!(sample.temperatures().len(), 1);
}

#[test]
fn a_blank_line_is_an_error_at_column_one() {
    assert_eq!(
        parse_line("").unwrap_err(),
        ParseError::EmptyLine { column: 1 }
    );
    assert_eq!(
        parse_line(" \t\r").unwrap_err(),
        ParseError::EmptyLine { column: 1 }
    );
}

#[test]
fn free_text_is_not_a_tegrastats_line_even_with_a_name_number_pair() {
    let error = parse_line("  Mon Dec 14 10:00:00 PST 2020").unwrap_err();
    assert_eq!(error, ParseError::NoField { column: 3 });
    assert_eq!(
        error.to_string(),
        "column 3: not a tegrastats line: no known field"
    );
    assert_eq!(
        parse_line("10-16-2023 10:59:22").unwrap_err(),
        ParseError::NoField { column: 1 }
    );
}

#[test]
fn a_line_cut_short_points_at_where_the_field_broke() {
    let error = parse_line("10-16-2023 10:59:22 RAM 1205/").unwrap_err();
    assert_eq!(
        error,
        ParseError::MalformedField {
            column: 30,
            field: "RAM",
            expected: "`USED/TOTALMB`"
        }
    );
    assert_eq!(
        error.to_string(),
        "column 30: malformed RAM field: expected `USED/TOTALMB`"
    );
    let cut_later = parse_line("RAM 1205/30623MB (lfb 6429x4MB) SWAP").unwrap();
    assert_eq!(
        cut_later.unknown(),
        ["SWAP"],
        "a readable RAM field makes the line"
    );
}

#[test]
fn error_columns_count_characters_not_bytes() {
    let error = parse_line("«é» RAM 1/x").unwrap_err();
    assert_eq!(error.column(), 11);
}

//! The C ABI: the checked-in header matches the Rust declarations, and a real C loop built
//! with the system `cc` against the cdylib writes a probe the Rust reader reads back exactly.

use std::path::{Path, PathBuf};
use std::process::Command;

use loop_probe::ffi;
use loop_probe::{
    AutonomyMode, FLAG_DEADLINE_MISS, FLAG_FALLBACK, FLAG_OVERRUN, Liveness, ProbeReader, Record,
};

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn strip_c_comments(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        rest = rest[i..].find("*/").map_or("", |j| &rest[i + j + 2..]);
    }
    out.push_str(rest);
    out
}

fn squash(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace(" *", "*")
        .replace("* ", "*")
}

/// C type of a parameter declaration: drops the parameter name.
fn c_param_type(p: &str) -> String {
    let p = p.trim();
    let cut = p.trim_end_matches(|c: char| c.is_alphanumeric() || c == '_');
    squash(if cut.trim().is_empty() { p } else { cut })
}

fn rust_to_c(ty: &str) -> String {
    let ty = squash(ty);
    let c = match ty.as_str() {
        "u64" => "uint64_t",
        "u32" => "uint32_t",
        "c_int" => "int",
        "*const c_char" => "const char*",
        "*mut LpWriter" => "LpWriter*",
        "*const LpWriter" => "const LpWriter*",
        "*mut*mut LpWriter" => "LpWriter**",
        "" => "void",
        other => panic!("no C mapping for Rust type `{other}`; extend the header check"),
    };
    c.to_owned()
}

type Signatures = std::collections::BTreeMap<String, (String, Vec<String>)>;

fn header_functions(h: &str) -> Signatures {
    let mut out = Signatures::new();
    for decl in h.split(';') {
        let decl = squash(decl);
        let Some(open) = decl.find("lp_") else {
            continue;
        };
        if decl.starts_with('#') || decl.contains("typedef") || !decl.contains('(') {
            continue;
        }
        let decl = decl.rsplit('}').next().unwrap().trim().to_owned();
        let open = decl.find("lp_").unwrap_or(open);
        let paren = decl.find('(').unwrap();
        let name = decl[open..paren].trim().to_owned();
        let ret = squash(&decl[..open]);
        let args = &decl[paren + 1..decl.rfind(')').unwrap()];
        let params = if args.trim() == "void" {
            vec![]
        } else {
            args.split(',').map(c_param_type).collect()
        };
        out.insert(name, (ret, params));
    }
    out
}

fn rust_functions(src: &str) -> Signatures {
    let mut out = Signatures::new();
    for (i, _) in src.match_indices("extern \"C\" fn lp_") {
        let rest = &src[i + "extern \"C\" fn ".len()..];
        let paren = rest.find('(').unwrap();
        let name = rest[..paren].to_owned();
        let close = rest.find(')').unwrap();
        let params = rest[paren + 1..close]
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| rust_to_c(p.split_once(':').unwrap().1))
            .collect();
        let after = &rest[close + 1..rest.find('{').unwrap()];
        let ret = rust_to_c(after.trim().trim_start_matches("->"));
        out.insert(name, (ret, params));
    }
    out
}

#[test]
fn the_c_header_declares_exactly_the_exported_functions_with_their_types() {
    let header = std::fs::read_to_string(manifest().join("include/loop_probe.h")).unwrap();
    let src = std::fs::read_to_string(manifest().join("src/ffi.rs")).unwrap();
    let h = header_functions(&strip_c_comments(&header));
    let r = rust_functions(&src);
    assert!(r.len() >= 12, "parsed too few Rust functions: {r:?}");
    assert_eq!(
        h, r,
        "include/loop_probe.h (left) differs from src/ffi.rs (right)"
    );
}

#[test]
fn the_c_header_constants_have_the_rust_values() {
    let header = std::fs::read_to_string(manifest().join("include/loop_probe.h")).unwrap();
    let src = std::fs::read_to_string(manifest().join("src/ffi.rs")).unwrap();
    let mut in_header = std::collections::BTreeMap::new();
    for line in header.lines() {
        let mut w = line.split_whitespace();
        if w.next() == Some("#define")
            && let (Some(name), Some(v)) = (w.next(), w.next())
            && name.starts_with("LP_")
        {
            let v = v.trim_end_matches('u');
            let v = match v.strip_prefix("0x") {
                Some(hex) => i64::from_str_radix(hex, 16).unwrap(),
                None => v.parse().unwrap(),
            };
            in_header.insert(name.to_owned(), v);
        }
    }
    let rust: std::collections::BTreeMap<String, i64> = [
        ("LP_OK", i64::from(ffi::LP_OK)),
        ("LP_ERR_INVALID", ffi::LP_ERR_INVALID.into()),
        ("LP_ERR_ALREADY_RUNNING", ffi::LP_ERR_ALREADY_RUNNING.into()),
        ("LP_ERR_IO", ffi::LP_ERR_IO.into()),
        ("LP_ERR_MLOCK", ffi::LP_ERR_MLOCK.into()),
        ("LP_ERR_BUSY", ffi::LP_ERR_BUSY.into()),
        ("LP_ERR_TOO_LONG", ffi::LP_ERR_TOO_LONG.into()),
        ("LP_ERR_PANIC", ffi::LP_ERR_PANIC.into()),
        ("LP_FLAG_OVERRUN", ffi::LP_FLAG_OVERRUN.into()),
        ("LP_FLAG_SKIPPED", ffi::LP_FLAG_SKIPPED.into()),
        ("LP_FLAG_DEGRADED", ffi::LP_FLAG_DEGRADED.into()),
        ("LP_FLAG_FALLBACK", ffi::LP_FLAG_FALLBACK.into()),
        ("LP_FLAG_DEADLINE_MISS", ffi::LP_FLAG_DEADLINE_MISS.into()),
        ("LP_MODE_UNKNOWN", ffi::LP_MODE_UNKNOWN.into()),
        ("LP_MODE_IDLE", ffi::LP_MODE_IDLE.into()),
        ("LP_MODE_MANUAL", ffi::LP_MODE_MANUAL.into()),
        ("LP_MODE_TELEOPERATED", ffi::LP_MODE_TELEOPERATED.into()),
        ("LP_MODE_AUTONOMOUS", ffi::LP_MODE_AUTONOMOUS.into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(in_header, rust);
    // Every constant ffi.rs declares is in the table above.
    let declared: Vec<&str> = src
        .match_indices("pub const LP_")
        .map(|(i, _)| {
            let s = &src[i + "pub const ".len()..];
            &s[..s.find(':').unwrap()]
        })
        .collect();
    assert_eq!(declared.len(), rust.len());
    assert!(declared.iter().all(|d| rust.contains_key(*d)));
}

/// The directory cargo put `libloop_probe.so` in for this test run: `deps/`, which every test
/// build refreshes, before the profile directory, which only `cargo build` does (a copy there
/// can be older than the library under test).
fn cdylib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    for dir in [deps, deps.parent().unwrap()] {
        if dir.join("libloop_probe.so").exists() {
            return dir.to_path_buf();
        }
    }
    panic!("libloop_probe.so not found next to {}", exe.display());
}

#[test]
fn a_c_loop_built_with_cc_writes_a_probe_the_rust_reader_reads_exactly() {
    let dir = crate::util::scratch();
    let lib = cdylib_dir();
    let exe = dir.path().join("loop_example");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(manifest().join("include"))
        .arg(manifest().join("examples/c/loop_example.c"))
        .arg("-L")
        .arg(&lib)
        .arg("-lloop_probe")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{cc}` (install gcc): {e}"));
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let probe = dir.path().join("c.probe");
    // The test runner's library path may name an older copy in the profile directory; the
    // library under test comes first.
    let out = Command::new(&exe)
        .arg(&probe)
        .arg("1000")
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "example failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["failures"], 0);

    // What the example injects, computed here independently of it.
    let ran: Vec<u64> = (0..1000).filter(|i| i % 100 != 99).collect();
    let overruns = ran.iter().filter(|i| *i % 10 == 5).count() as u64;
    // A skip is seen when the next cycle records; cycle 999's skip has no successor.
    let gaps_seen = 9;
    let late = ran.iter().filter(|i| *i % 50 == 20).count() as u64;
    assert_eq!(report["recorded"], ran.len() as u64);
    assert_eq!(report["overruns"], overruns);
    assert_eq!(report["flagged_overruns"], overruns);
    assert_eq!(report["late"], late);
    assert_eq!(report["flagged_late"], late);

    let mut r = ProbeReader::open(&probe).unwrap();
    assert_eq!(r.info().loop_id, 42);
    assert_eq!(r.info().loop_name(), "c-example");
    assert_eq!(r.info().capacity, 1024);
    assert_eq!(r.info().deadline_ns, Some(800_000));
    let s = r.summary().unwrap();
    assert_eq!(s.cycles.cycles, ran.len() as u64);
    assert_eq!(s.cycles.overruns, overruns);
    assert_eq!(s.cycles.skipped, gaps_seen);
    assert_eq!(s.cycles.activations, ran.len() as u64 + gaps_seen);
    assert_eq!(
        s.deadline_misses(),
        Some(late + gaps_seen),
        "late completions and skipped activations, not the overruns"
    );
    assert_eq!(
        (
            s.events.fallbacks,
            s.events.interventions,
            s.events.safe_stops
        ),
        (1, 1, 1)
    );
    let m = r.model_version().unwrap().unwrap();
    assert_eq!((m.id_hash, m.version()), (0xc0ffee, "c-model-1.0"));
    let a = r.autonomy().unwrap();
    assert_eq!(a.mode, AutonomyMode::Manual);
    assert_eq!(
        a.ns_in_mode[AutonomyMode::Autonomous as usize],
        600 * 1_000_000
    );

    let mut recs = Vec::new();
    let stats = r
        .poll(loop_probe::clock::monotonic_ns(), &mut |rec: &Record| {
            recs.push(*rec)
        })
        .unwrap();
    assert_eq!(stats.new_records, ran.len() as u64);
    assert_eq!(recs.iter().map(|r| r.cycle).collect::<Vec<_>>(), ran);
    assert_eq!(
        recs.iter().filter(|r| r.flags & FLAG_OVERRUN != 0).count() as u64,
        overruns
    );
    assert_eq!(
        recs.iter()
            .filter(|r| r.flags & FLAG_DEADLINE_MISS != 0)
            .count() as u64,
        late
    );
    let fallback: Vec<u64> = recs
        .iter()
        .filter(|r| r.flags & FLAG_FALLBACK != 0)
        .map(|r| r.cycle)
        .collect();
    assert_eq!(fallback, vec![500]);
    assert_eq!(
        r.liveness(loop_probe::clock::monotonic_ns()).unwrap(),
        Liveness::Dead
    );
}

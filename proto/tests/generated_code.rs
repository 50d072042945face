//! The checked-in Rust code in `src/generated/` is exactly what the schema generates.
//!
//! Builds (and cross builds) need no `protoc`: the code is generated here, in a test, by `protox`
//! (a pure-Rust protobuf compiler) and `prost-build`. After editing a `.proto` file run
//! `EDGEWATCH_REGENERATE=1 cargo test -p edgewatch-proto --test generated_code` and commit the diff.

#![allow(clippy::unwrap_used)] // Test code: a failed unwrap is a failed test.

use std::path::{Path, PathBuf};

const PROTO_FILES: &[&str] = &[
    "edgewatch/v1/batch.proto",
    "edgewatch/v1/event.proto",
    "edgewatch/v1/local.proto",
];

fn generate_into(out_dir: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let descriptors = protox::compile(PROTO_FILES, [root]).expect("schema compiles");
    prost_build::Config::new()
        .out_dir(out_dir)
        .compile_fds(descriptors)
        .expect("prost-build generates code");
}

#[test]
fn checked_in_generated_code_matches_the_schema() {
    let checked_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/generated");
    let scratch = std::env::temp_dir().join(format!("edgewatch-proto-gen-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    generate_into(&scratch);

    let mut generated: Vec<PathBuf> = std::fs::read_dir(&scratch)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    generated.sort();
    assert!(!generated.is_empty(), "prost-build wrote no files");

    let regenerate = std::env::var_os("EDGEWATCH_REGENERATE").is_some();
    let mut stale = Vec::new();
    for path in &generated {
        let name = path.file_name().unwrap();
        let fresh = std::fs::read_to_string(path).unwrap();
        let target = checked_in.join(name);
        let current = std::fs::read_to_string(&target).unwrap_or_default();
        if fresh != current {
            if regenerate {
                std::fs::write(&target, &fresh).unwrap();
            } else {
                stale.push(target.display().to_string());
            }
        }
    }
    std::fs::remove_dir_all(&scratch).unwrap();
    assert!(
        stale.is_empty(),
        "generated code is stale: {stale:?}; run EDGEWATCH_REGENERATE=1 cargo test -p edgewatch-proto --test generated_code"
    );
}

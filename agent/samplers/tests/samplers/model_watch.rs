//! The model watcher against real manifest and engine files: identity, engine hash once per
//! file version, changes reported once complete, bad manifests.

use edgewatch_proto::v1::{ModelSource, Tier, event::Kind};
use edgewatch_samplers::CollectingSink;
use edgewatch_samplers::model::{ModelConfig, ModelWatcher};
use sha2::{Digest, Sha256};

use crate::util::{now, picked, scratch};

fn hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn tick_until_hashed(w: &mut ModelWatcher, sink: &mut CollectingSink) -> usize {
    for n in 1..1000 {
        w.tick(now(), sink);
        if w.current().is_some_and(|m| !m.engine_sha256.is_empty()) && w.status().hashing.is_none()
        {
            return n;
        }
    }
    panic!("engine never hashed");
}

fn changes(sink: &CollectingSink) -> Vec<(String, String, String, String)> {
    picked(sink, Tier::Safety, |k| match k {
        Kind::ModelVersionChange(c) => Some(c),
        _ => None,
    })
    .map(|c| {
        let (p, n) = (c.previous.as_ref().unwrap(), c.current.as_ref().unwrap());
        (
            p.version.clone(),
            n.version.clone(),
            p.engine_sha256.clone(),
            n.engine_sha256.clone(),
        )
    })
    .collect()
}

#[test]
fn the_engine_is_hashed_in_steps_once_per_file_version_and_a_deploy_is_one_change() {
    let dir = scratch();
    let d = dir.path();
    let manifest = d.join("model.json");
    let engine_v1: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(d.join("v1.engine"), &engine_v1).unwrap();
    std::fs::write(
        &manifest,
        br#"{"name": "haul-perception", "version": "4.2.1", "engine": "v1.engine",
             "tensorrt_version": "8.6.2", "cuda_version": "12.2", "l4t_version": "36.3.0"}"#,
    )
    .unwrap();
    let mut w = ModelWatcher::new(ModelConfig {
        manifest: manifest.clone(),
        hash_step_bytes: 1 << 20,
    });
    let mut sink = CollectingSink::default();
    let ticks = tick_until_hashed(&mut w, &mut sink);
    assert_eq!(ticks, 3, "1 MiB per tick over a 2.9 MiB engine");
    let m = w.current().unwrap();
    assert_eq!(
        (m.name.as_str(), m.version.as_str()),
        ("haul-perception", "4.2.1")
    );
    assert_eq!(m.engine_sha256, hex(&engine_v1));
    assert_eq!(m.tensorrt_version, "8.6.2");
    assert_eq!(m.source(), ModelSource::Manifest);
    for _ in 0..10 {
        w.tick(now(), &mut sink);
        assert!(
            w.status().hashing.is_none(),
            "an unchanged engine is not hashed again"
        );
    }
    assert!(changes(&sink).is_empty(), "the first identity is no change");

    // A deploy: new engine, new manifest (replaced, as a deploy tool renames it into place).
    let engine_v2 = vec![9u8; 1_500_000];
    std::fs::write(d.join("v2.engine"), &engine_v2).unwrap();
    let tmp = d.join("model.json.tmp");
    std::fs::write(
        &tmp,
        br#"{"name": "haul-perception", "version": "4.3.0", "engine": "v2.engine"}"#,
    )
    .unwrap();
    std::fs::rename(&tmp, &manifest).unwrap();
    w.tick(now(), &mut sink);
    assert_eq!(
        w.current().unwrap().version,
        "4.3.0",
        "counters switch at once"
    );
    assert!(
        changes(&sink).is_empty(),
        "reported once the engine is hashed"
    );
    tick_until_hashed(&mut w, &mut sink);
    assert_eq!(
        changes(&sink),
        vec![(
            "4.2.1".to_owned(),
            "4.3.0".to_owned(),
            hex(&engine_v1),
            hex(&engine_v2)
        )]
    );

    // The engine rebuilt in place under the same version: a change of engine only.
    let engine_v2b = vec![8u8; 1_500_000];
    std::fs::write(d.join("v2.engine"), &engine_v2b).unwrap();
    tick_until_hashed(&mut w, &mut sink);
    for _ in 0..3 {
        w.tick(now(), &mut sink);
    }
    let c = changes(&sink);
    assert_eq!(c.len(), 2);
    assert_eq!((c[1].0.as_str(), c[1].1.as_str()), ("4.3.0", "4.3.0"));
    assert_eq!(c[1].3, hex(&engine_v2b));
}

#[test]
fn a_missing_or_broken_manifest_means_an_unknown_model_and_a_stated_problem() {
    let dir = scratch();
    let manifest = dir.path().join("model.json");
    let mut w = ModelWatcher::new(ModelConfig {
        manifest: manifest.clone(),
        hash_step_bytes: 1 << 20,
    });
    let mut sink = CollectingSink::default();
    w.tick(now(), &mut sink);
    assert!(w.current().is_none());
    assert!(w.status().problem.unwrap().contains("not found"));
    std::fs::write(
        &manifest,
        br#"{"name": "x", "version": "1", "engine_sha256": "abc"}"#,
    )
    .unwrap();
    w.tick(now(), &mut sink);
    assert!(w.current().is_none());
    assert!(
        w.status().problem.unwrap().contains("engine_sha256"),
        "{:?}",
        w.status().problem
    );
    let declared = "ab".repeat(32);
    std::fs::write(
        &manifest,
        format!(r#"{{"name": "x", "version": "1", "engine_sha256": "{declared}"}}"#),
    )
    .unwrap();
    w.tick(now(), &mut sink);
    let m = w.current().unwrap();
    assert_eq!(
        m.engine_sha256, declared,
        "a declared hash stands when there is no engine to hash"
    );
    assert!(w.status().problem.is_none());
    std::fs::write(
        &manifest,
        br#"{"name": "x", "version": "1", "engine": "missing.engine"}"#,
    )
    .unwrap();
    w.tick(now(), &mut sink);
    assert!(w.status().problem.unwrap().contains("missing.engine"));
    assert!(
        sink.events.is_empty(),
        "no change is reported for an incomplete identity"
    );
}

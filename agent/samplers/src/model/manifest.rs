//! The model manifest: a JSON file deployed beside the inference engine that says which model it
//! is. Pure: parses bytes handed in by the watcher. The format is documented in
//! `docs/model-manifest.md`.
//!
//! Invariants:
//! - `name` and `version` are required and become the `model` / `model_version` labels, so they
//!   are checked against the label rules here (1–64 bytes of `[A-Za-z0-9._+-]`).
//! - A declared `engine_sha256` is 64 lowercase or uppercase hex digits and is kept lowercase.
//! - Unknown keys are ignored: build pipelines add their own, and the agent must not refuse a
//!   deployment over a key it does not use.

use serde::Deserialize;

/// Largest manifest the watcher reads; a larger file is an error, not a parse.
pub const MAX_MANIFEST_BYTES: u64 = 64 * 1024;

/// A manifest as parsed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Manifest {
    /// Model name, e.g. `haul-perception`.
    pub name: String,
    /// Deployed version, e.g. `4.2.1`.
    pub version: String,
    /// Engine file, absolute or relative to the manifest's directory; hashed by the agent.
    #[serde(default)]
    pub engine: Option<String>,
    /// sha256 of the engine as built, lowercase hex; checked against the agent's own hash.
    #[serde(default)]
    pub engine_sha256: Option<String>,
    /// sha256 of the ONNX file the engine was built from.
    #[serde(default)]
    pub onnx_sha256: Option<String>,
    /// Training run that produced the weights.
    #[serde(default)]
    pub training_run: Option<String>,
    /// TensorRT version the engine was built with (engines only load on that exact version).
    #[serde(default)]
    pub tensorrt_version: Option<String>,
    /// CUDA version.
    #[serde(default)]
    pub cuda_version: Option<String>,
    /// L4T (Jetson Linux) release, e.g. `36.3.0`.
    #[serde(default)]
    pub l4t_version: Option<String>,
    /// Precision, e.g. `fp16`, `int8`.
    #[serde(default)]
    pub precision: Option<String>,
    /// GPU compute capability the engine targets, e.g. `87`.
    #[serde(default)]
    pub sm: Option<String>,
}

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// Not JSON, or a required key is missing or of the wrong type.
    #[error("manifest is not valid: {0}")]
    Syntax(String),
    /// A key holds a value the agent cannot use.
    #[error("manifest key `{key}`: {reason}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// What it must be.
        reason: &'static str,
    },
}

/// Whether `s` may be a label value: 1–64 bytes of `[A-Za-z0-9._+-]`.
pub fn is_label_value(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'))
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Parses a manifest.
pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
    let mut m: Manifest =
        serde_json::from_slice(bytes).map_err(|e| ManifestError::Syntax(e.to_string()))?;
    if !is_label_value(&m.name) {
        return Err(ManifestError::Invalid {
            key: "name",
            reason: "must be 1 to 64 characters of A-Z a-z 0-9 . _ + -",
        });
    }
    if !is_label_value(&m.version) {
        return Err(ManifestError::Invalid {
            key: "version",
            reason: "must be 1 to 64 characters of A-Z a-z 0-9 . _ + -",
        });
    }
    for (key, v) in [
        ("engine_sha256", &mut m.engine_sha256),
        ("onnx_sha256", &mut m.onnx_sha256),
    ] {
        if let Some(h) = v {
            if !is_sha256_hex(h) {
                return Err(ManifestError::Invalid {
                    key,
                    reason: "must be 64 hexadecimal digits",
                });
            }
            h.make_ascii_lowercase();
        }
    }
    if m.engine.as_deref().is_some_and(str::is_empty) {
        return Err(ManifestError::Invalid {
            key: "engine",
            reason: "must not be empty",
        });
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let m = parse(
            br#"{"name": "haul-perception", "version": "4.2.1", "engine": "model.engine",
                 "engine_sha256": "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789",
                 "tensorrt_version": "8.6.2", "cuda_version": "12.2", "l4t_version": "36.3.0",
                 "precision": "fp16", "sm": "87", "built_by": "ci-42"}"#,
        )
        .unwrap();
        assert_eq!(
            (m.name.as_str(), m.version.as_str()),
            ("haul-perception", "4.2.1")
        );
        assert_eq!(m.engine.as_deref(), Some("model.engine"));
        assert!(
            m.engine_sha256.unwrap().starts_with("abcdef"),
            "kept lowercase"
        );
        assert_eq!(m.tensorrt_version.as_deref(), Some("8.6.2"));
    }

    #[test]
    fn bad_manifests_say_which_key_is_wrong() {
        for (text, needle) in [
            (&br#"{"version": "1"}"#[..], "name"),
            (br#"{"name": "a b", "version": "1"}"#, "`name`"),
            (br#"{"name": "a", "version": ""}"#, "`version`"),
            (
                br#"{"name": "a", "version": "1", "engine_sha256": "xyz"}"#,
                "`engine_sha256`",
            ),
            (
                br#"{"name": "a", "version": "1", "engine": ""}"#,
                "`engine`",
            ),
            (b"{\"name\": \"a\", \"vers", "valid"),
            (b"\xff\xfe", "valid"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
        }
    }
}

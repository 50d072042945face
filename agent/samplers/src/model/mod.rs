//! Which model is running: the identity carried by every per-model counter and the
//! `ModelVersionChange` safety event.
//!
//! Two sources, best first (`docs/model-manifest.md`, "Which source wins"): the probe's seqlocked
//! model-version slot, read by the deadline sampler for its own loop, and a manifest file beside
//! the deployed engine, watched here. For a loop whose probe publishes a version, the slot wins; otherwise the
//! manifest's identity applies.
//!
//! Layout:
//! - [`manifest`]: the manifest's JSON format and its checks (pure).
//! - [`hasher`]: a resumable sha256 of the engine file, N bytes per step.
//! - [`ModelWatcher`]: the shell: polls the manifest's and engine's metadata each tick (two
//!   `stat`s), re-parses the manifest when it changed, hashes the engine once per (inode, size,
//!   mtime) a bounded number of bytes per tick, and reports changes.
//! - [`PerModel`]: a small fixed table of values kept per model version.
//!
//! Invariants:
//! - A model's series identity is its (name, version) pair (the `model`/`model_version` labels);
//!   a different engine hash under the same pair is a `ModelVersionChange`, not a new series.
//! - Hashing never holds the caller for more than one step of `hash_step_bytes`; the agent runs
//!   at idle priority, so each step runs when the cores have nothing better to do.
//! - A `ModelVersionChange` is reported once the new identity is complete (its engine hashed),
//!   with the previous complete identity; the first identity seen after start is not a change.
//!   Counters switch to the new (name, version) at once, before the hash completes.
//! - In steady state (nothing changed on disk) a tick allocates nothing.
//! - The last complete identity is kept through the sink whenever it changes
//!   ([`ModelWatcher::KEPT_KEY`]); a restarted agent hands it back ([`ModelWatcher::restore`]),
//!   so that a model deployed while the agent was down is reported as a change.

pub mod hasher;
pub mod manifest;

use std::io::Read;
use std::path::{Path, PathBuf};

use edgewatch_conventions::config::ConfigError;
use edgewatch_proto::v1::{Event, ModelSource, ModelVersion, Tier, event::Kind};
use prost::Message;
use serde::Deserialize;

use crate::sink::{EventSink, Now};
use hasher::{EngineHasher, FileKey, HashError, Step};
use manifest::{MAX_MANIFEST_BYTES, Manifest};

/// MiB hashed per tick: about 10 ms of sha256 on one Orin core without crypto extensions; a
/// 500 MiB engine is hashed in 13 s at 10 ticks a second.
pub const DEFAULT_HASH_STEP_MIB: f64 = 4.0;
/// Bytes read per `read` call while hashing (the hasher's one buffer).
const HASH_READ_BYTES: usize = 1 << 20;
/// Bytes reserved in each string of a reused `ModelVersion`: versions, names, hex hashes and
/// toolkit versions fit, so refilling one does not allocate.
pub(crate) const MODEL_STRING_CAPACITY: usize = 64;

/// The `[model]` section as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModelConfig {
    /// Manifest path (optional: without it only probe slots identify models).
    pub manifest: Option<PathBuf>,
    /// MiB of engine hashed per tick (default [`DEFAULT_HASH_STEP_MIB`]).
    pub hash_step_mib: Option<f64>,
}

/// The model watcher's validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelConfig {
    /// Manifest path.
    pub manifest: PathBuf,
    /// Bytes of engine hashed per tick.
    pub hash_step_bytes: u64,
}

impl RawModelConfig {
    /// Validates this section; `None` when no manifest is configured. Errors name their key.
    pub fn validate(&self) -> Result<Option<ModelConfig>, ConfigError> {
        ModelConfig::from_raw(self)
    }
}

impl ModelConfig {
    /// Validates `[model]`; `None` when no manifest is configured.
    pub fn from_raw(raw: &RawModelConfig) -> Result<Option<ModelConfig>, ConfigError> {
        let step = raw.hash_step_mib.unwrap_or(DEFAULT_HASH_STEP_MIB);
        if !(step.is_finite() && (0.0625..=1024.0).contains(&step)) {
            return Err(ConfigError::new(
                "model.hash_step_mib",
                "must be a number from 0.0625 to 1024",
            ));
        }
        let Some(manifest) = &raw.manifest else {
            return Ok(None);
        };
        if manifest.as_os_str().is_empty() {
            return Err(ConfigError::new("model.manifest", "must not be empty"));
        }
        Ok(Some(ModelConfig {
            manifest: manifest.clone(),
            hash_step_bytes: (step * 1024.0 * 1024.0) as u64,
        }))
    }
}

/// A `ModelVersion` with its strings reserved, standing for "unknown" until filled.
pub fn unknown_model() -> ModelVersion {
    let s = || String::with_capacity(MODEL_STRING_CAPACITY);
    ModelVersion {
        name: s(),
        version: s(),
        id_hash: 0,
        engine_sha256: s(),
        tensorrt_version: s(),
        cuda_version: s(),
        l4t_version: s(),
        source: ModelSource::Unspecified as i32,
    }
}

/// Whether `m` names no model.
pub fn is_unknown(m: &ModelVersion) -> bool {
    m.name.is_empty() && m.version.is_empty() && m.id_hash == 0
}

/// Whether two identities are the same series (same labels).
pub fn same_series(a: &ModelVersion, b: &ModelVersion) -> bool {
    a.name == b.name && a.version == b.version
}

/// Whether two identities are the same model for change reporting (labels, id and engine).
pub fn same_identity(a: &ModelVersion, b: &ModelVersion) -> bool {
    same_series(a, b) && a.id_hash == b.id_hash && a.engine_sha256 == b.engine_sha256
}

/// Copies `src` into `dst`, reusing `dst`'s string buffers.
pub fn copy_model(dst: &mut ModelVersion, src: &ModelVersion) {
    dst.name.clone_from(&src.name);
    dst.version.clone_from(&src.version);
    dst.id_hash = src.id_hash;
    dst.engine_sha256.clone_from(&src.engine_sha256);
    dst.tensorrt_version.clone_from(&src.tensorrt_version);
    dst.cuda_version.clone_from(&src.cuda_version);
    dst.l4t_version.clone_from(&src.l4t_version);
    dst.source = src.source;
}

/// Resets `dst` to unknown, keeping its buffers.
pub fn clear_model(dst: &mut ModelVersion) {
    dst.name.clear();
    dst.version.clear();
    dst.id_hash = 0;
    dst.engine_sha256.clear();
    dst.tensorrt_version.clear();
    dst.cuda_version.clear();
    dst.l4t_version.clear();
    dst.source = ModelSource::Unspecified as i32;
}

/// One value kept for one model version.
#[derive(Debug, Clone)]
pub struct PerModelEntry<T> {
    /// The model, as last seen.
    pub model: ModelVersion,
    /// Start of the cumulative series, wall ns.
    pub start_time_unix_ns: i64,
    /// The value.
    pub value: T,
    /// When it was last selected, CLOCK_MONOTONIC ns (for eviction).
    pub last_used_ns: u64,
}

/// At most `N` values keyed by model (name, version); the least recently used is evicted to make
/// room, and handed back so its last value can be reported.
#[derive(Debug, Clone)]
pub struct PerModel<T, const N: usize> {
    entries: heapless::Vec<PerModelEntry<T>, N>,
}

impl<T, const N: usize> Default for PerModel<T, N> {
    fn default() -> Self {
        PerModel {
            entries: heapless::Vec::new(),
        }
    }
}

impl<T, const N: usize> PerModel<T, N> {
    /// Forgets every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// The index of `model`'s entry.
    pub fn find(&self, model: &ModelVersion) -> Option<usize> {
        self.entries
            .iter()
            .position(|e| same_series(&e.model, model))
    }

    /// The index of `model`'s entry, created with `make` if needed; a created entry may evict
    /// the least recently used one, which is returned. The entry's model is refreshed (e.g. an
    /// engine hash that arrived later).
    pub fn select(
        &mut self,
        model: &ModelVersion,
        start_time_unix_ns: i64,
        now_ns: u64,
        make: impl FnOnce() -> T,
    ) -> (usize, Option<PerModelEntry<T>>) {
        if let Some(i) = self.find(model) {
            if let Some(e) = self.entries.get_mut(i) {
                e.last_used_ns = now_ns;
                if !same_identity(&e.model, model) || e.model.source != model.source {
                    copy_model(&mut e.model, model);
                }
            }
            return (i, None);
        }
        let mut evicted = None;
        if self.entries.is_full()
            && let Some((i, _)) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used_ns)
        {
            evicted = Some(self.entries.swap_remove(i));
        }
        let mut m = unknown_model();
        copy_model(&mut m, model);
        let entry = PerModelEntry {
            model: m,
            start_time_unix_ns,
            value: make(),
            last_used_ns: now_ns,
        };
        // Room was made above when full.
        let _ = self.entries.push(entry);
        (self.entries.len() - 1, evicted)
    }

    /// The entry at `i`.
    pub fn get(&self, i: usize) -> Option<&PerModelEntry<T>> {
        self.entries.get(i)
    }

    /// The entry at `i`, mutably.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut PerModelEntry<T>> {
        self.entries.get_mut(i)
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = &PerModelEntry<T>> {
        self.entries.iter()
    }

    /// Every entry, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut PerModelEntry<T>> {
        self.entries.iter_mut()
    }
}

/// What the watcher knows about the manifest, for the agent's `status` command.
#[derive(Debug, Clone, Copy)]
pub struct ModelStatus<'a> {
    /// Manifest path.
    pub manifest: &'a Path,
    /// The identity counters are attributed to, if any.
    pub current: Option<&'a ModelVersion>,
    /// Engine bytes hashed / total, while hashing.
    pub hashing: Option<(u64, u64)>,
    /// The last problem (missing manifest, bad JSON, unreadable engine), if it persists.
    pub problem: Option<&'a str>,
    /// The engine's hash differs from the manifest's `engine_sha256` (the computed one is used).
    pub declared_sha256_mismatch: bool,
}

/// Watches a model manifest and hashes its engine; see the module doc.
pub struct ModelWatcher {
    cfg: ModelConfig,
    /// Key of the manifest last read (parsed or refused); `None` when absent.
    manifest_key: Option<FileKey>,
    manifest: Option<Manifest>,
    engine_path: Option<PathBuf>,
    /// Key of the engine as last stat'ed.
    engine_key: Option<FileKey>,
    /// The finished hash and the file it is of.
    engine_digest: Option<(FileKey, String)>,
    hasher: EngineHasher,
    /// Identity counters use now.
    current: Option<ModelVersion>,
    /// Last complete identity, reported or taken as the start.
    reported: Option<ModelVersion>,
    problem: Option<String>,
    mismatch: bool,
    event: Event,
}

impl std::fmt::Debug for ModelWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelWatcher")
            .field("manifest", &self.cfg.manifest)
            .field("current", &self.current)
            .field("problem", &self.problem)
            .finish()
    }
}

/// The manifest could not be used; kept as the watcher's `problem`.
#[derive(Debug, thiserror::Error)]
enum WatchProblem {
    #[error("manifest {0} not found")]
    Missing(String),
    #[error("manifest {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("manifest {path} is larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge { path: String },
    #[error("manifest {path}: {source}")]
    Invalid {
        path: String,
        source: manifest::ManifestError,
    },
    #[error("engine {path}: {source}")]
    Engine { path: String, source: HashError },
}

impl ModelWatcher {
    /// The key the last complete identity is kept under.
    pub const KEPT_KEY: &'static str = "model/reported";

    /// Takes the identity an earlier run of the agent last reported (kept under
    /// [`ModelWatcher::KEPT_KEY`]): the first complete identity is compared with it, and a
    /// difference is reported as a change. A state that does not decode is ignored.
    pub fn restore(&mut self, kept: Option<&[u8]>) {
        if let Some(model) = kept.and_then(|bytes| ModelVersion::decode(bytes).ok()) {
            self.reported = Some(model);
        }
    }

    /// A watcher; nothing is read until the first [`tick`](Self::tick).
    pub fn new(cfg: ModelConfig) -> ModelWatcher {
        ModelWatcher {
            cfg,
            manifest_key: None,
            manifest: None,
            engine_path: None,
            engine_key: None,
            engine_digest: None,
            hasher: EngineHasher::new(HASH_READ_BYTES),
            current: None,
            reported: None,
            problem: None,
            mismatch: false,
            event: Event {
                kind: Some(Kind::ModelVersionChange(
                    edgewatch_proto::v1::ModelVersionChange {
                        control_loop: None,
                        previous: Some(unknown_model()),
                        current: Some(unknown_model()),
                    },
                )),
                ..Event::default()
            },
        }
    }

    /// The identity counters are attributed to (name and version as soon as the manifest is
    /// read; the engine hash once computed).
    pub fn current(&self) -> Option<&ModelVersion> {
        self.current.as_ref()
    }

    /// What the watcher knows, for the agent's `status` command.
    pub fn status(&self) -> ModelStatus<'_> {
        let hashing = self.hasher.progress();
        ModelStatus {
            manifest: &self.cfg.manifest,
            current: self.current.as_ref(),
            hashing,
            problem: self.problem.as_deref(),
            declared_sha256_mismatch: self.mismatch,
        }
    }

    /// Checks the manifest's and engine's metadata, re-reads what changed, hashes at most one
    /// step of the engine, and reports a completed change through `sink`. Call it once per
    /// agent tick (e.g. with every deadline poll).
    pub fn tick<S: EventSink + ?Sized>(&mut self, now: Now, sink: &mut S) {
        let mut changed = self.check_manifest();
        changed |= self.check_engine();
        changed |= self.hash_step();
        if changed {
            self.rebuild_current();
        }
        self.report(now, sink);
    }

    fn set_problem(&mut self, p: WatchProblem) {
        let text = p.to_string();
        if self.problem.as_deref() != Some(&text) {
            tracing::warn!(problem = %text, "Model manifest problem; the model is unknown until it is fixed.");
        }
        self.problem = Some(text);
    }

    /// Returns whether the parsed manifest changed.
    fn check_manifest(&mut self) -> bool {
        let path = &self.cfg.manifest;
        let key = match FileKey::stat(path) {
            Ok(k) => k,
            Err(e) => {
                let had = self.manifest_key.take().is_some() || self.problem.is_none();
                let problem = if e.kind() == std::io::ErrorKind::NotFound {
                    WatchProblem::Missing(path.display().to_string())
                } else {
                    WatchProblem::Io {
                        path: path.display().to_string(),
                        source: e,
                    }
                };
                if had {
                    self.set_problem(problem);
                }
                return self.forget_manifest();
            }
        };
        if self.manifest_key == Some(key) {
            return false;
        }
        self.manifest_key = Some(key);
        match read_manifest(path) {
            Ok(m) => {
                self.problem = None;
                self.engine_path = m.engine.as_ref().map(|e| {
                    let e = Path::new(e);
                    if e.is_absolute() {
                        e.to_path_buf()
                    } else {
                        path.parent().unwrap_or(Path::new(".")).join(e)
                    }
                });
                self.manifest = Some(m);
                self.engine_key = None;
                self.hasher.cancel();
                true
            }
            Err(p) => {
                self.set_problem(p);
                self.forget_manifest()
            }
        }
    }

    fn forget_manifest(&mut self) -> bool {
        self.engine_path = None;
        self.engine_key = None;
        self.hasher.cancel();
        self.manifest.take().is_some() || self.current.is_some()
    }

    /// Starts a hash when the engine file is new or changed. Returns whether anything changed.
    fn check_engine(&mut self) -> bool {
        let Some(path) = &self.engine_path else {
            return false;
        };
        let key = match FileKey::stat(path) {
            Ok(k) => k,
            Err(e) => {
                if self.engine_key.take().is_some() || self.problem.is_none() {
                    let p = WatchProblem::Engine {
                        path: path.display().to_string(),
                        source: HashError::Io {
                            op: "stat",
                            source: e,
                        },
                    };
                    self.hasher.cancel();
                    self.set_problem(p);
                    return true;
                }
                return false;
            }
        };
        if self.engine_key == Some(key) {
            return false;
        }
        self.engine_key = Some(key);
        if self.engine_digest.as_ref().is_some_and(|(k, _)| *k == key) {
            return true;
        }
        if let Err(source) = self.hasher.start(path) {
            let p = WatchProblem::Engine {
                path: path.display().to_string(),
                source,
            };
            self.set_problem(p);
        }
        true
    }

    /// Hashes one step. Returns whether a hash completed.
    fn hash_step(&mut self) -> bool {
        match self.hasher.step(self.cfg.hash_step_bytes) {
            Ok(Step::Idle | Step::Progress { .. }) => false,
            Ok(Step::Done { key, digest }) => {
                self.engine_digest = Some((key, hasher::hex(&digest)));
                // A problem with an earlier engine is over once this one is hashed.
                self.problem = None;
                if self.engine_key != Some(key) {
                    // The file changed since; the next check starts again.
                    self.engine_key = None;
                }
                true
            }
            Err(source) => {
                // Changed under us, or unreadable: look again next tick.
                self.engine_key = None;
                let path = self
                    .engine_path
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                self.set_problem(WatchProblem::Engine { path, source });
                false
            }
        }
    }

    /// The engine hash for the engine currently on disk, if computed.
    fn digest(&self) -> Option<&str> {
        match (&self.engine_digest, self.engine_key) {
            (Some((k, d)), Some(now)) if *k == now => Some(d),
            _ => None,
        }
    }

    /// Whether the identity is complete: a manifest, and its engine (if any) hashed.
    fn complete(&self) -> bool {
        self.manifest.is_some() && (self.engine_path.is_none() || self.digest().is_some())
    }

    fn rebuild_current(&mut self) {
        let Some(m) = &self.manifest else {
            self.current = None;
            return;
        };
        let mut v = self.current.take().unwrap_or_else(unknown_model);
        clear_model(&mut v);
        v.name.push_str(&m.name);
        v.version.push_str(&m.version);
        let computed = self.digest();
        let mismatch = matches!((computed, &m.engine_sha256), (Some(c), Some(d)) if c != d);
        if mismatch {
            tracing::warn!(
                manifest = %self.cfg.manifest.display(),
                "Engine sha256 differs from the manifest's engine_sha256; reporting the computed one."
            );
        }
        if let Some(h) = computed.or(m.engine_sha256.as_deref()) {
            v.engine_sha256.push_str(h);
        }
        for (dst, src) in [
            (&mut v.tensorrt_version, &m.tensorrt_version),
            (&mut v.cuda_version, &m.cuda_version),
            (&mut v.l4t_version, &m.l4t_version),
        ] {
            if let Some(s) = src {
                dst.push_str(s);
            }
        }
        v.source = ModelSource::Manifest as i32;
        self.mismatch = mismatch;
        self.current = Some(v);
    }

    fn report<S: EventSink + ?Sized>(&mut self, now: Now, sink: &mut S) {
        if !self.complete() {
            return;
        }
        let Some(cur) = &self.current else {
            return;
        };
        match &mut self.reported {
            None => {
                self.reported = Some(cur.clone());
                sink.keep(Self::KEPT_KEY, &cur.encode_to_vec());
            }
            Some(prev) if same_identity(prev, cur) => {}
            Some(prev) => {
                self.event.event_time_unix_ns = now.wall_unix_ns;
                self.event.monotonic_ns = now.monotonic_ns;
                if let Some(Kind::ModelVersionChange(c)) = &mut self.event.kind {
                    c.control_loop = None;
                    copy_model(c.previous.get_or_insert_with(unknown_model), prev);
                    copy_model(c.current.get_or_insert_with(unknown_model), cur);
                }
                sink.emit(Tier::Safety, &self.event);
                copy_model(prev, cur);
                sink.keep(Self::KEPT_KEY, &cur.encode_to_vec());
            }
        }
    }
}

fn read_manifest(path: &Path) -> Result<Manifest, WatchProblem> {
    let p = || path.display().to_string();
    let file =
        std::fs::File::open(path).map_err(|source| WatchProblem::Io { path: p(), source })?;
    let mut bytes = Vec::new();
    file.take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| WatchProblem::Io { path: p(), source })?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(WatchProblem::TooLarge { path: p() });
    }
    manifest::parse(&bytes).map_err(|source| WatchProblem::Invalid { path: p(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_section_names_its_bad_keys() {
        let e = RawModelConfig {
            manifest: Some(PathBuf::from("/m.json")),
            hash_step_mib: Some(0.0),
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.key, "model.hash_step_mib");
        let e = RawModelConfig {
            manifest: Some(PathBuf::new()),
            hash_step_mib: None,
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.key, "model.manifest");
        let c = RawModelConfig {
            manifest: Some(PathBuf::from("/m.json")),
            hash_step_mib: None,
        }
        .validate()
        .unwrap()
        .unwrap();
        assert_eq!(c.hash_step_bytes, 4 << 20);
        assert_eq!(RawModelConfig::default().validate().unwrap(), None);
    }

    #[test]
    fn the_least_recently_used_model_is_evicted_and_handed_back() {
        let mut t: PerModel<u32, 2> = PerModel::default();
        let m = |v: &str| {
            let mut x = unknown_model();
            x.version.push_str(v);
            x
        };
        assert_eq!(t.select(&m("a"), 0, 1, || 1).0, 0);
        assert_eq!(t.select(&m("b"), 0, 2, || 2).0, 1);
        t.select(&m("a"), 0, 3, || 0);
        let (_, evicted) = t.select(&m("c"), 0, 4, || 3);
        assert_eq!(evicted.unwrap().model.version, "b");
        assert!(t.find(&m("a")).is_some() && t.find(&m("c")).is_some());
    }
}

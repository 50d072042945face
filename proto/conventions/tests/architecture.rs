//! The workspace's shape, checked: no module graph with a cycle, and one owner per shared rule.
//!
//! Two checks read every crate's Rust sources as text (comments and, where they do not matter,
//! string literals removed):
//! - **No cycles.** Inside each crate (library, binary, test or bench target), the top-level
//!   modules form a graph with an edge `a → b` when code in `a` names `crate::b` (or reaches `b`
//!   through `super::`). A cycle in that graph fails, naming a line for each edge.
//! - **One owner per rule.** Each rule that the agent, the gateway and their tests share (the
//!   duration grammar, the configuration error shape, backoff, the tier index, metric names, the
//!   counting allocator, the fake sysfs tree, the harness's process handles …) has one owner file;
//!   a definition of the same rule anywhere else fails, naming the file and line.
//!
//! Invariants:
//! - The checks read only files under the workspace root; they build nothing and run nothing.
//! - Each check is exercised on a small synthetic crate first, so a check that could not fail
//!   fails its own self-test.

mod scan {
    //! Text-level reading of Rust sources: comment and literal stripping, module discovery.

    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    /// A source file with its text in three forms, line structure kept.
    pub struct Source {
        /// Path relative to the workspace root.
        pub path: PathBuf,
        /// Comments blanked, literals kept.
        pub code: String,
        /// Comments and string/char literals blanked (a literal becomes `""`).
        pub bare: String,
    }

    impl Source {
        pub fn read(root: &Path, path: &Path) -> Source {
            let text = std::fs::read_to_string(root.join(path))
                .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            Source::from_text(path.to_path_buf(), &text)
        }

        pub fn from_text(path: PathBuf, text: &str) -> Source {
            let (code, bare) = strip(text);
            Source { path, code, bare }
        }
    }

    /// Blanks comments (both forms) and, in the second result, the contents of string, raw string
    /// and char literals. Newlines are kept so that byte offsets map to the same lines.
    fn strip(text: &str) -> (String, String) {
        let chars: Vec<char> = text.chars().collect();
        let mut code = String::with_capacity(text.len());
        let mut bare = String::with_capacity(text.len());
        // Blanks keep every character's byte length, so offsets agree across the three forms.
        let blank = |out: &mut String, c: char| {
            if c == '\n' {
                out.push('\n');
            } else {
                out.extend(std::iter::repeat_n(' ', c.len_utf8()));
            }
        };
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            if c == '/' && next == Some('/') {
                while i < chars.len() && chars[i] != '\n' {
                    blank(&mut code, chars[i]);
                    blank(&mut bare, chars[i]);
                    i += 1;
                }
            } else if c == '/' && next == Some('*') {
                let mut depth = 0usize;
                while i < chars.len() {
                    if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                        depth += 1;
                        code.push_str("  ");
                        bare.push_str("  ");
                        i += 2;
                    } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        code.push_str("  ");
                        bare.push_str("  ");
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        blank(&mut code, chars[i]);
                        blank(&mut bare, chars[i]);
                        i += 1;
                    }
                }
            } else if (c == 'r' || c == 'b')
                && raw_string_hashes(&chars[i..]).is_some()
                && !is_ident_char(i.checked_sub(1).map(|p| chars[p]))
            {
                let (prefix, hashes) = raw_string_hashes(&chars[i..]).unwrap_or((0, 0));
                let start = i;
                i += prefix;
                // Find the closing quote followed by the same number of hashes.
                while i < chars.len() {
                    if chars[i] == '"' && chars[i + 1..].iter().take(hashes).all(|&h| h == '#') {
                        i += 1 + hashes;
                        break;
                    }
                    i += 1;
                }
                push_literal(&chars[start..i], &mut code, &mut bare);
            } else if c == '"' {
                let start = i;
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                push_literal(&chars[start..i.min(chars.len())], &mut code, &mut bare);
            } else if c == '\'' {
                // A char literal ('a', '\n', '\u{1F600}') or a lifetime / label ('a).
                let end = if next == Some('\\') {
                    chars[i + 3..]
                        .iter()
                        .position(|&q| q == '\'')
                        .map(|p| i + 4 + p)
                } else if chars.get(i + 2) == Some(&'\'') {
                    Some(i + 3)
                } else {
                    None
                };
                match end {
                    Some(end) => {
                        push_literal(&chars[i..end], &mut code, &mut bare);
                        i = end;
                    }
                    None => {
                        code.push(c);
                        bare.push(c);
                        i += 1;
                    }
                }
            } else {
                code.push(c);
                bare.push(c);
                i += 1;
            }
        }
        (code, bare)
    }

    fn push_literal(literal: &[char], code: &mut String, bare: &mut String) {
        for &c in literal {
            code.push(c);
        }
        let quote = if literal.first() == Some(&'\'') {
            '\''
        } else {
            '"'
        };
        for (n, &c) in literal.iter().enumerate() {
            match (n, c) {
                (_, '\n') => bare.push('\n'),
                (0, _) => bare.push(quote),
                (n, _) if n + 1 == literal.len() => bare.push(quote),
                _ => bare.extend(std::iter::repeat_n(' ', c.len_utf8())),
            }
        }
    }

    /// `r"`, `r#"`, `br##"` …: the prefix length up to and including the quote, and the hashes.
    fn raw_string_hashes(chars: &[char]) -> Option<(usize, usize)> {
        let mut i = 0;
        if chars.first() == Some(&'b') {
            i += 1;
        }
        if chars.get(i) != Some(&'r') {
            return None;
        }
        i += 1;
        let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
        i += hashes;
        (chars.get(i) == Some(&'"')).then_some((i + 1, hashes))
    }

    pub fn is_ident_char(c: Option<char>) -> bool {
        c.is_some_and(|c| c.is_alphanumeric() || c == '_')
    }

    /// The 1-based line of a byte offset.
    pub fn line_of(text: &str, offset: usize) -> usize {
        text[..offset].matches('\n').count() + 1
    }

    /// A crate target: its root file and its files grouped by top-level module.
    pub struct Target {
        pub root: PathBuf,
        /// Top-level module name → the files of its subtree, each with its module path.
        pub modules: BTreeMap<String, Vec<(Vec<String>, Source)>>,
    }

    /// `mod name;` declarations of a file (not inline `mod name { … }`), with `#[path]` values.
    fn declared_modules(source: &Source) -> Vec<(String, Option<String>)> {
        let mut found = Vec::new();
        let bare = &source.bare;
        let code = &source.code;
        let mut search = 0;
        while let Some(at) = bare[search..].find("mod ") {
            let at = search + at;
            search = at + 4;
            let before = bare[..at].chars().next_back();
            if is_ident_char(before) {
                continue;
            }
            let rest = &bare[at + 4..];
            let name: String = rest
                .trim_start()
                .chars()
                .take_while(|&c| c.is_alphanumeric() || c == '_')
                .collect();
            if name.is_empty() {
                continue;
            }
            let after = rest.trim_start()[name.len()..].trim_start();
            if !after.starts_with(';') {
                continue;
            }
            // A `#[path = "…"]` attribute on the declaration, if any: look back over attributes.
            let head = &code[..at];
            let attribute_start = head.rfind(['}', ';']).map_or(0, |p| p + 1);
            let attributes = &head[attribute_start..];
            let path = attributes.find("#[path").and_then(|p| {
                let tail = &attributes[p..];
                let open = tail.find('"')?;
                let close = tail[open + 1..].find('"')?;
                Some(tail[open + 1..open + 1 + close].to_owned())
            });
            found.push((name, path));
        }
        found
    }

    /// Reads a crate target from its root file: the modules it declares and their subtrees.
    pub fn target(workspace: &Path, root: &Path) -> Target {
        let root_source = Source::read(workspace, root);
        let base = root.parent().unwrap_or(Path::new("")).to_path_buf();
        let mut modules = BTreeMap::new();
        for (name, path) in declared_modules(&root_source) {
            let mut files = Vec::new();
            if let Some(file) = module_file(workspace, &base, &name, path.as_deref()) {
                collect(workspace, &file, vec![name.clone()], &mut files);
            }
            modules.insert(name, files);
        }
        Target {
            root: root.to_path_buf(),
            modules,
        }
    }

    fn module_file(
        workspace: &Path,
        dir: &Path,
        name: &str,
        path: Option<&str>,
    ) -> Option<PathBuf> {
        if let Some(path) = path {
            return Some(dir.join(path));
        }
        [
            dir.join(format!("{name}.rs")),
            dir.join(name).join("mod.rs"),
        ]
        .into_iter()
        .find(|candidate| workspace.join(candidate).is_file())
    }

    fn collect(
        workspace: &Path,
        file: &Path,
        module_path: Vec<String>,
        out: &mut Vec<(Vec<String>, Source)>,
    ) {
        let source = Source::read(workspace, file);
        let children_dir = if file.file_name().is_some_and(|n| n == "mod.rs") {
            file.parent().unwrap_or(Path::new("")).to_path_buf()
        } else {
            file.with_extension("")
        };
        for (name, path) in declared_modules(&source) {
            if let Some(child) = module_file(workspace, &children_dir, &name, path.as_deref()) {
                let mut child_path = module_path.clone();
                child_path.push(name);
                collect(workspace, &child, child_path, out);
            }
        }
        out.push((module_path, source));
    }
}

mod graph {
    //! The top-level module graph of a crate target and its cycles.

    use std::collections::{BTreeMap, BTreeSet};

    use super::scan::{Source, Target, is_ident_char, line_of};

    /// Why `from` depends on `to`: the first place seen.
    #[derive(Clone, Debug)]
    pub struct Edge {
        pub file: String,
        pub line: usize,
    }

    /// Edges between top-level modules: (from, to) → first evidence.
    pub fn edges(target: &Target) -> BTreeMap<(String, String), Edge> {
        let mut edges = BTreeMap::new();
        for (top, files) in &target.modules {
            for (module_path, source) in files {
                for (reached, offset) in references(source, module_path) {
                    if reached != *top && target.modules.contains_key(&reached) {
                        edges.entry((top.clone(), reached)).or_insert_with(|| Edge {
                            file: source.path.display().to_string(),
                            line: line_of(&source.bare, offset),
                        });
                    }
                }
            }
        }
        edges
    }

    /// Top-level modules named by a file's paths: `crate::x`, `crate::{x, y::z}`, and `super::`
    /// chains resolved from the (inline-module-aware) position in the file.
    fn references(source: &Source, file_module: &[String]) -> Vec<(String, usize)> {
        let text = &source.bare;
        let mut found = Vec::new();
        // Inline modules (`mod tests { … }`): their depth decides what `super` means.
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        let mut i = 0;
        while let Some(c) = text[i..].chars().next() {
            let at_word = !is_ident_char(text[..i].chars().next_back());
            if c == '{' {
                depth += 1;
                i += 1;
                continue;
            }
            if c == '}' {
                depth = depth.saturating_sub(1);
                while inline.last().is_some_and(|(_, d)| *d > depth) {
                    inline.pop();
                }
                i += 1;
                continue;
            }
            if at_word && text[i..].starts_with("mod ") {
                let rest = text[i + 4..].trim_start();
                let name: String = rest
                    .chars()
                    .take_while(|&c| c.is_alphanumeric() || c == '_')
                    .collect();
                let after = rest[name.len()..].trim_start();
                if !name.is_empty() && after.starts_with('{') {
                    inline.push((name, depth + 1));
                }
                i += 4;
                continue;
            }
            if at_word && text[i..].starts_with("crate::") {
                for name in heads(&text[i + "crate::".len()..]) {
                    found.push((name, i));
                }
                i += "crate::".len();
                continue;
            }
            if at_word && text[i..].starts_with("super::") {
                let mut module: Vec<String> = file_module.to_vec();
                module.extend(inline.iter().map(|(name, _)| name.clone()));
                let mut j = i;
                while text[j..].starts_with("super::") {
                    module.pop();
                    j += "super::".len();
                }
                match module.first() {
                    Some(top) => found.push((top.clone(), i)),
                    None => {
                        for name in heads(&text[j..]) {
                            found.push((name, i));
                        }
                    }
                }
                i = j;
                continue;
            }
            i += c.len_utf8();
        }
        found
    }

    /// The first path segment after `crate::`: one name, or each item of a `{ … }` group.
    fn heads(rest: &str) -> Vec<String> {
        let rest = rest.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut names = Vec::new();
            let mut depth = 0usize;
            let mut item_start = true;
            for (n, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        let name: String = group[n..]
                            .chars()
                            .take_while(|&c| c.is_alphanumeric() || c == '_')
                            .collect();
                        names.push(name);
                        item_start = false;
                    }
                    c if c.is_whitespace() => {}
                    _ => item_start = false,
                }
            }
            names
        } else {
            let name: String = rest
                .chars()
                .take_while(|&c| c.is_alphanumeric() || c == '_')
                .collect();
            if name.is_empty() {
                Vec::new()
            } else {
                vec![name]
            }
        }
    }

    /// Every elementary cycle reported once, as the list of modules in order (first repeated).
    pub fn cycles(edges: &BTreeMap<(String, String), Edge>) -> Vec<Vec<String>> {
        let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (from, to) in edges.keys() {
            next.entry(from).or_default().push(to);
        }
        let mut found = BTreeSet::new();
        for start in next.keys() {
            let mut stack = vec![(*start, vec![*start])];
            while let Some((at, path)) = stack.pop() {
                for &to in next.get(at).map(Vec::as_slice).unwrap_or(&[]) {
                    if to == *start {
                        // Report each cycle once, from its smallest module.
                        let smallest = path.iter().min().copied().unwrap_or(start);
                        if smallest == *start {
                            let mut cycle: Vec<String> =
                                path.iter().map(|m| (*m).to_owned()).collect();
                            cycle.push((*start).to_owned());
                            found.insert(cycle);
                        }
                    } else if !path.contains(&to) && to > *start {
                        let mut longer = path.clone();
                        longer.push(to);
                        stack.push((to, longer));
                    }
                }
            }
        }
        found.into_iter().collect()
    }
}

mod owners {
    //! The shared rules, each with its one owner, and how a second definition is recognised.

    use super::scan::{Source, line_of};

    /// A rule and the files allowed to define it.
    pub struct Rule {
        pub name: &'static str,
        pub owners: &'static [&'static str],
        /// Offsets in `source` where the rule is defined.
        pub finds: fn(&Source) -> Vec<usize>,
    }

    /// Offsets of every match of `needle` in `haystack` that starts a word.
    fn words(haystack: &str, needle: &str) -> Vec<usize> {
        haystack
            .match_indices(needle)
            .filter(|(at, _)| !super::scan::is_ident_char(haystack[..*at].chars().next_back()))
            .map(|(at, _)| at)
            .collect()
    }

    /// A violation: the rule, where it was defined a second time, and the line's text.
    pub fn violations(rules: &[Rule], sources: &[Source]) -> Vec<String> {
        let mut found = Vec::new();
        for rule in rules {
            for source in sources {
                let path = source.path.to_string_lossy().replace('\\', "/");
                if rule.owners.iter().any(|owner| path == *owner) {
                    continue;
                }
                for offset in (rule.finds)(source) {
                    let line = line_of(&source.code, offset);
                    let text = source.code.lines().nth(line - 1).unwrap_or("").trim();
                    found.push(format!(
                        "{}: {path}:{line}: `{text}` (owner: {})",
                        rule.name,
                        rule.owners.join(", ")
                    ));
                }
            }
        }
        found
    }

    /// A type definition (`struct`, `enum`, `type`) whose name satisfies `matches`.
    fn type_named(source: &Source, matches: fn(&str) -> bool) -> Vec<usize> {
        ["struct ", "enum ", "type "]
            .iter()
            .flat_map(|keyword| words(&source.bare, keyword))
            .filter(|&at| {
                let rest = &source.bare[at..];
                let rest = &rest[rest.find(' ').unwrap_or(0) + 1..];
                let name: String = rest
                    .trim_start()
                    .chars()
                    .take_while(|&c| c.is_alphanumeric() || c == '_')
                    .collect();
                matches(&name)
            })
            .collect()
    }

    /// `const NAME: &str = "<metric name>"` for a series the gateway writes and the SLO core reads.
    fn metric_name_constants(source: &Source) -> Vec<usize> {
        words(&source.bare, "const ")
            .into_iter()
            .filter(|&at| {
                let line_end = source.code[at..]
                    .find(';')
                    .map_or(source.code.len(), |e| at + e);
                let statement = &source.code[at..line_end];
                statement.contains("&str")
                    && statement.split('"').nth(1).is_some_and(|value| {
                        (value.starts_with("edge_") || value.starts_with("edgewatch_"))
                            && !value.starts_with("edgewatch_gateway_")
                            && value
                                .chars()
                                .all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit())
                    })
            })
            .collect()
    }

    /// Match arms that turn a tier into a number or a name: `Tier::Safety => 0`,
    /// `Tier::Safety => Some(SAFETY)`, `Tier::Safety => "safety"`.
    fn tier_to_index(source: &Source) -> Vec<usize> {
        source
            .code
            .match_indices("Tier::Safety")
            .filter(|(at, found)| {
                let after = source.code[at + found.len()..].trim_start();
                let before = source.code[..*at].trim_end();
                !source.bare[*at..].starts_with(' ')
                    && !before.ends_with("==")
                    && !before.ends_with("!=")
                    && after.strip_prefix("=>").is_some_and(|value| {
                        let value = value.trim_start();
                        value.starts_with(|c: char| c.is_ascii_digit())
                            || value.starts_with("Some(")
                            || value.starts_with('"')
                    })
            })
            .map(|(at, _)| at)
            .collect()
    }

    /// Offsets where a literal starting with `prefix` (its quote included) begins.
    fn literal(source: &Source, prefix: &str) -> Vec<usize> {
        source
            .code
            .match_indices(prefix)
            .filter(|(at, _)| {
                let quote = at + prefix.find('"').unwrap_or(0);
                source.bare[quote..].starts_with('"')
            })
            .map(|(at, _)| at)
            .collect()
    }

    /// The literal `"ms"` on its own: the start of a duration unit table or suffix parser.
    fn unit_literals(source: &Source) -> Vec<usize> {
        source
            .code
            .match_indices("\"ms\"")
            .filter(|(at, _)| source.bare[*at..].starts_with("\"  \""))
            .map(|(at, _)| at)
            .collect()
    }

    /// The number 64 as an exit status: `ExitCode::from(64)`, `exit(64)`, `const X: u8 = 64`.
    fn exit_status_64(source: &Source) -> Vec<usize> {
        let bare = &source.bare;
        let mut found: Vec<usize> = ["from(64)", "exit(64)"]
            .iter()
            .flat_map(|needle| bare.match_indices(needle).map(|(at, _)| at))
            .collect();
        found.extend(words(bare, "const ").into_iter().filter(|&at| {
            let end = bare[at..].find(';').map_or(bare.len(), |e| at + e);
            let statement = &bare[at..end];
            statement.contains(": u8") && statement.trim_end().ends_with("= 64")
        }));
        found
    }

    /// The rules of issue "one owner per rule", with their owners.
    pub fn rules() -> Vec<Rule> {
        vec![
            Rule {
                name: "duration grammar",
                owners: &[
                    "proto/conventions/src/duration.rs",
                    // Not a configuration duration: an instant within a scripted run, written
                    // with fractions (`mode manual at 1.2s`), in the synthetic loop's own
                    // pattern language.
                    "agent/synthetic-loop/src/script.rs",
                ],
                finds: unit_literals,
            },
            Rule {
                name: "exit status for bad configuration",
                owners: &[
                    "proto/conventions/src/config.rs",
                    // Publishable on its own: depends on no workspace crate, so it keeps its
                    // own copy of the sysexits value.
                    "agent/tegrastats-parser/src/main.rs",
                ],
                finds: exit_status_64,
            },
            Rule {
                name: "configuration error type",
                owners: &["proto/conventions/src/config.rs"],
                finds: |source| type_named(source, |name| name == "ConfigError"),
            },
            Rule {
                name: "backoff",
                owners: &["proto/conventions/src/backoff.rs"],
                finds: |source| type_named(source, |name| name.ends_with("Backoff")),
            },
            Rule {
                name: "tier index",
                owners: &["proto/src/tier.rs"],
                finds: tier_to_index,
            },
            Rule {
                name: "metric name",
                owners: &["uplink-gateway/slo/src/names.rs"],
                finds: metric_name_constants,
            },
            Rule {
                name: "counting allocator",
                owners: &["hil-tests/test-kit/src/alloc.rs"],
                finds: |source| words(&source.bare, "impl GlobalAlloc for"),
            },
            Rule {
                name: "fake sysfs tree",
                owners: &["hil-tests/test-kit/src/sysfs.rs"],
                // A tree of sysfs's shape needs its class links.
                finds: |source| words(&source.bare, "symlink("),
            },
            Rule {
                name: "agent or gateway process handle",
                owners: &[
                    "hil-tests/harness/src/agent.rs",
                    "hil-tests/harness/src/gateway.rs",
                ],
                finds: |source| {
                    type_named(source, |name| {
                        name == "AgentProcess" || name == "GatewayProcess"
                    })
                },
            },
            Rule {
                name: "MQTT collector",
                owners: &["hil-tests/harness/src/collector.rs"],
                finds: |source| literal(source, "\"edgewatch/v1/#\""),
            },
            Rule {
                name: "/metrics client",
                owners: &[
                    "hil-tests/harness/src/metrics.rs",
                    // The gateway's own test of its HTTP server speaks the protocol itself: it
                    // checks the status line, which a scrape does not return.
                    "uplink-gateway/gateway/src/metrics.rs",
                ],
                finds: |source| literal(source, "b\"GET /metrics"),
            },
            Rule {
                name: "LD_PRELOAD library build",
                owners: &["hil-tests/test-kit/src/preload.rs"],
                finds: |source| literal(source, "\"-shared\""),
            },
        ]
    }
}

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use scan::{Source, Target};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|manifest| manifest.contains("[workspace]"))
        })
        .expect("the workspace root holds a Cargo.toml with [workspace]")
        .to_path_buf()
}

/// The workspace members, from the root manifest's `members = [ … ]`.
fn members(root: &Path) -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("root Cargo.toml");
    let start = manifest.find("members").expect("members = [...]");
    let open = start + manifest[start..].find('[').expect("[");
    let close = open + manifest[open..].find(']').expect("]");
    manifest[open + 1..close]
        .split(',')
        .filter_map(|item| {
            let item = item
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .collect::<String>();
            let item = item.trim().trim_matches('"');
            (!item.is_empty()).then(|| PathBuf::from(item))
        })
        .collect()
}

/// Every crate-root file of a member: lib, main, bins, tests, benches, examples, fuzz targets.
fn target_roots(root: &Path, member: &Path) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for file in ["src/lib.rs", "src/main.rs"] {
        if root.join(member).join(file).is_file() {
            roots.push(member.join(file));
        }
    }
    for dir in [
        "src/bin",
        "tests",
        "benches",
        "examples",
        "fuzz/fuzz_targets",
    ] {
        let Ok(entries) = std::fs::read_dir(root.join(member).join(dir)) else {
            continue;
        };
        let mut entries: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        entries.sort();
        for path in entries {
            let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
            if path.extension().is_some_and(|e| e == "rs") {
                roots.push(relative);
            } else if path.join("main.rs").is_file() {
                roots.push(relative.join("main.rs"));
            }
        }
    }
    roots
}

fn all_targets(root: &Path) -> Vec<Target> {
    members(root)
        .iter()
        .flat_map(|member| target_roots(root, member))
        .map(|target_root| scan::target(root, &target_root))
        .collect()
}

/// Cycles of every target, as readable lines.
fn cycle_report(targets: &[Target]) -> Vec<String> {
    let mut report = Vec::new();
    for target in targets {
        let edges = graph::edges(target);
        for cycle in graph::cycles(&edges) {
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|pair| {
                    let edge = &edges[&(pair[0].clone(), pair[1].clone())];
                    format!("{} → {} ({}:{})", pair[0], pair[1], edge.file, edge.line)
                })
                .collect();
            report.push(format!("{}: {}", target.root.display(), steps.join(", ")));
        }
    }
    report
}

/// Every Rust file of the workspace's members (each once), for the owner rules.
fn all_sources(root: &Path, targets: &[Target]) -> Vec<Source> {
    let mut by_path: BTreeMap<PathBuf, ()> = BTreeMap::new();
    for target in targets {
        by_path.insert(target.root.clone(), ());
        for files in target.modules.values() {
            for (_, source) in files {
                by_path.insert(source.path.clone(), ());
            }
        }
    }
    by_path
        .into_keys()
        .map(|path| Source::read(root, &path))
        .collect()
}

#[test]
fn no_crate_has_a_cycle_between_its_top_level_modules() {
    let root = workspace_root();
    let targets = all_targets(&root);
    assert!(
        targets.len() > 20,
        "the scan found only {} crate targets: it is not reading the workspace",
        targets.len()
    );
    let cycles = cycle_report(&targets);
    assert!(
        cycles.is_empty(),
        "module cycles (a → b means code in a names crate::b):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn every_shared_rule_is_defined_only_by_its_owner() {
    let root = workspace_root();
    let targets = all_targets(&root);
    let sources = all_sources(&root, &targets);
    let rules = owners::rules();
    for rule in &rules {
        for owner in rule.owners {
            let source = sources
                .iter()
                .find(|s| s.path.to_string_lossy() == *owner)
                .unwrap_or_else(|| panic!("{}: owner {owner} is not a source file", rule.name));
            assert!(
                !(rule.finds)(source).is_empty(),
                "{}: its owner {owner} does not define it (the rule's pattern is stale)",
                rule.name
            );
        }
    }
    let violations = owners::violations(&rules, &sources);
    assert!(
        violations.is_empty(),
        "rules defined outside their owner:\n{}",
        violations.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// The checks on synthetic crates: each can fail.

/// Writes `files` under a fresh directory and reads the target rooted at `src/lib.rs`.
fn synthetic(files: &[(&str, &str)]) -> (tempdir::Dir, Target) {
    let dir = tempdir::Dir::new();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, text).expect("write");
    }
    let target = scan::target(dir.path(), Path::new("src/lib.rs"));
    (dir, target)
}

mod tempdir {
    //! A scratch directory removed on drop (std only).

    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicU32, Ordering};

    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new() -> Dir {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "edgewatch-architecture-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&path).expect("scratch dir");
            Dir(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn a_cycle_through_use_crate_is_found_with_its_lines() {
    let (_dir, target) = synthetic(&[
        ("src/lib.rs", "pub mod run;\npub mod ingest;\nmod quiet;\n"),
        (
            "src/run.rs",
            "use crate::ingest::Server;\npub struct Shared;\n",
        ),
        (
            "src/ingest/mod.rs",
            "mod codec;\n// crate::quiet is only mentioned in a comment\npub struct Server;\n",
        ),
        (
            "src/ingest/codec.rs",
            "use crate::{quiet, run::Shared};\nconst S: &str = \"crate::quiet\";\n",
        ),
        ("src/quiet.rs", "pub fn f() {}\n"),
    ]);
    let edges = graph::edges(&target);
    let pairs: Vec<(&str, &str)> = edges
        .keys()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [("ingest", "quiet"), ("ingest", "run"), ("run", "ingest")]
    );
    let report = cycle_report(std::slice::from_ref(&target));
    assert_eq!(report.len(), 1, "{report:?}");
    assert!(
        report[0].contains("ingest → run (src/ingest/codec.rs:1)")
            && report[0].contains("run → ingest (src/run.rs:1)"),
        "{}",
        report[0]
    );
}

#[test]
fn super_paths_resolve_through_files_and_inline_modules() {
    let (_dir, target) = synthetic(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        (
            "src/a.rs",
            "mod inner;\nfn f() {}\n#[cfg(test)]\nmod tests {\n    use super::f;\n}\nuse super::b::X;\n",
        ),
        ("src/a/inner.rs", "use super::super::b::Y;\nuse super::f;\n"),
        ("src/b.rs", "pub struct X;\npub struct Y;\nuse crate::a;\n"),
    ]);
    let edges = graph::edges(&target);
    let lines: Vec<String> = edges
        .iter()
        .map(|((a, b), edge)| format!("{a}→{b}@{}:{}", edge.file, edge.line))
        .collect();
    // `use super::f` inside `mod tests` stays in `a`; `super::b` from a.rs and
    // `super::super::b` from a/inner.rs both reach `b`.
    assert_eq!(lines, ["a→b@src/a/inner.rs:1", "b→a@src/b.rs:3"]);
    assert_eq!(graph::cycles(&edges), [vec!["a", "b", "a"]]);
}

#[test]
fn a_second_definition_of_each_rule_is_found() {
    let text = r##"
pub fn parse_duration(text: &str) -> Option<u64> { None }
pub struct ConfigError { key: String }
struct ReconnectBackoff;
fn index(tier: Tier) -> usize { match tier { Tier::Safety => 0, _ => 1 } }
fn guard(r: Record) -> Option<u64> { match r { r if r.tier == Tier::Safety => Some(1), _ => None } }
pub const CYCLES: &str = "edge_control_cycles_total";
pub const SELF: &str = "edgewatch_gateway_commits_total";
unsafe impl GlobalAlloc for Counting {}
const EX_USAGE: u8 = 64;
fn seconds(text: &str) -> Option<f64> { text.strip_suffix("ms").map(|_| 0.0) }
fn name(tier: Tier) -> &'static str { match tier { Tier::Safety => "safety", _ => "x" } }
fn tree(dir: &Path) { std::os::unix::fs::symlink(dir.join("a"), dir.join("b")).unwrap() }
pub struct GatewayProcess { child: Child }
const TOPICS: &str = "edgewatch/v1/#";
fn scrape(stream: &mut TcpStream) { stream.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap() }
fn preload(cc: &mut Command) { cc.args(["-O2", "-shared", "-fPIC"]); }
// pub struct ConfigError in a comment is not a definition
const NOT: &str = "pub struct ConfigError";
"##;
    let source = Source::from_text(PathBuf::from("some/crate/src/lib.rs"), text);
    let violations = owners::violations(&owners::rules(), std::slice::from_ref(&source));
    let names: Vec<&str> = violations
        .iter()
        .map(|v| v.split(':').next().unwrap_or(""))
        .collect();
    assert_eq!(
        names,
        [
            "duration grammar",
            "exit status for bad configuration",
            "configuration error type",
            "backoff",
            "tier index",
            "tier index",
            "metric name",
            "counting allocator",
            "fake sysfs tree",
            "agent or gateway process handle",
            "MQTT collector",
            "/metrics client",
            "LD_PRELOAD library build",
        ],
        "{violations:#?}"
    );
    assert!(
        violations[6].contains("some/crate/src/lib.rs:7"),
        "{}",
        violations[6]
    );
}

#[test]
fn the_owner_of_a_rule_may_define_it() {
    let source = Source::from_text(
        PathBuf::from("proto/conventions/src/backoff.rs"),
        "pub struct Backoff;\n",
    );
    assert!(owners::violations(&owners::rules(), std::slice::from_ref(&source)).is_empty());
}

//! Reading what the configuration documentation tests compare: the keys a parser accepts, taken
//! from its own refusal of an unknown key, and the sections, fenced examples and commented-out
//! tables of the reference (`docs/configuration.md`) and the packaged files; and what the duration
//! pin tests share (the values no duration key takes, the keys a source constructs).
//!
//! The agent's and the gateway's documentation tests both use these, so a key added to either
//! parser and not to the documentation fails the same way.
//!
//! Invariants:
//! - Nothing here knows a key or a table: lists come from the parser's error text, sections and
//!   examples from the document given.
//! - A document or error that does not have the expected shape is a failed test (a panic naming
//!   what is missing), never an empty list that would pass vacuously.

// Test helpers: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

/// Values every duration key refuses: the one grammar is a whole number and one unit, nothing
/// else (no bare numbers, compound forms, fractions, signs, spaces, upper case or other units).
pub const NOT_DURATIONS: [&str; 13] = [
    "", "30", "s", "1h30m", "1.5s", "-5s", "+5s", "5 s", " 5s", "5s ", "5S", "1y", "5sec",
];

/// The key names given to `DurationKey::new` in a configuration `source`, so that a test can
/// check that every key the code defines is pinned by a row of its own.
pub fn constructed_duration_keys(source: &str) -> Vec<&str> {
    source
        .match_indices("DurationKey::new(")
        .map(|(at, _)| {
            let rest = &source[at..];
            let start = rest.find('"').unwrap() + 1;
            let len = rest[start..].find('"').unwrap();
            &rest[start..start + len]
        })
        .collect()
}

/// The keys named by a parser's `error` refusing an unknown key in `table` (`table` only names
/// it in the failure messages).
pub fn accepted_keys_in_refusal(table: &str, error: &str) -> Vec<String> {
    // serde: "unknown field `x`, expected `a`", "... expected `a` or `b`", "... expected one of
    // `a`, `b`, `c`".
    let expected = error
        .split(", expected ")
        .nth(1)
        .unwrap_or_else(|| panic!("{table}: no list of fields in {error:?}"));
    let keys: Vec<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(!keys.is_empty(), "{table}: {error}");
    keys
}

/// Text from `heading` to the next heading of level 2 or 3.
pub fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no section {heading}"));
    let rest = &doc[start + heading.len()..];
    let end = [rest.find("\n## "), rest.find("\n### ")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(rest.len());
    &doc[start..start + heading.len() + end]
}

/// The body of the first fenced block opened by "```<info>" in `text`.
pub fn fenced<'a>(text: &'a str, info: &str) -> &'a str {
    let open = format!("```{info}\n");
    let start = text
        .find(&open)
        .unwrap_or_else(|| panic!("no ```{info} block"))
        + open.len();
    let len = text[start..].find("```").unwrap();
    &text[start..start + len]
}

/// `text` with the commented-out table `# [<table>]` and its `# key = value` lines uncommented:
/// what provisioning does.
pub fn uncomment_table(text: &str, table: &str) -> String {
    let header = format!("# [{table}]");
    let mut inside = false;
    let mut found = false;
    let out: String = text
        .lines()
        .map(|line| {
            if line == header {
                inside = true;
                found = true;
                return format!("[{table}]\n");
            }
            match line.strip_prefix("# ") {
                Some(rest) if inside && rest.contains(" = ") => format!("{rest}\n"),
                _ => {
                    inside = false;
                    format!("{line}\n")
                }
            }
        })
        .collect();
    assert!(found, "no commented-out {header}");
    out
}

/// `text` with every commented-out `#key = value` line (a stated default) uncommented, and how
/// many there were.
pub fn uncomment_stated_defaults(text: &str) -> (String, usize) {
    let mut stated = 0;
    let uncommented: String = text
        .lines()
        .map(|line| match line.strip_prefix('#') {
            Some(rest)
                if rest.starts_with(|c: char| c.is_ascii_lowercase()) && rest.contains(" = ") =>
            {
                stated += 1;
                format!("{rest}\n")
            }
            _ => format!("{line}\n"),
        })
        .collect();
    (uncommented, stated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_serdes_list_of_fields_is_read() {
        for (error, keys) in [
            ("unknown field `x`, expected `a`", vec!["a"]),
            ("unknown field `x`, expected `a` or `b`", vec!["a", "b"]),
            (
                "at line 1: unknown field `x`, expected one of `a`, `b`, `c`",
                vec!["a", "b", "c"],
            ),
        ] {
            assert_eq!(accepted_keys_in_refusal("t", error), keys);
        }
    }

    #[test]
    #[should_panic(expected = "t: no list of fields")]
    fn an_error_without_a_list_of_fields_fails() {
        accepted_keys_in_refusal("t", "missing field `host`");
    }

    #[test]
    fn a_section_ends_at_the_next_heading_of_level_two_or_three() {
        let doc = "# T\n## A\na\n### B\nb\n#### c\nc\n## D\nd\n";
        assert_eq!(section(doc, "## A"), "## A\na");
        assert_eq!(section(doc, "### B"), "### B\nb\n#### c\nc");
        assert_eq!(section(doc, "## D"), "## D\nd\n");
    }

    #[test]
    fn the_first_block_of_the_info_string_is_taken() {
        let text = "```sh\nx\n```\n```toml\na = 1\n```\n```toml\nb = 2\n```\n";
        assert_eq!(fenced(text, "toml"), "a = 1\n");
    }

    #[test]
    fn stated_defaults_are_uncommented_and_counted_and_prose_is_not() {
        let text = "# The queue.\n[queue]\n#budget_bytes = 1\n# see = the docs\n#dir = \"/q\"\n";
        assert_eq!(
            uncomment_stated_defaults(text),
            (
                "# The queue.\n[queue]\nbudget_bytes = 1\n# see = the docs\ndir = \"/q\"\n"
                    .to_owned(),
                2
            )
        );
    }

    #[test]
    fn a_commented_table_is_uncommented_up_to_its_last_key() {
        let text = "[a]\nx = 1\n# [a.tls]\n# ca = \"c\"\n# key = \"k\"\n# a comment\n# y = 2\n";
        assert_eq!(
            uncomment_table(text, "a.tls"),
            "[a]\nx = 1\n[a.tls]\nca = \"c\"\nkey = \"k\"\n# a comment\n# y = 2\n"
        );
    }
}

//! The error for a line that cannot be read at all.
//!
//! Invariants:
//! - Errors are returned only when the line yields no field; a bad field on an otherwise readable
//!   line is kept as unknown text instead.
//! - `column` is 1-based and counts characters (not bytes) of the line as given; it is at most the
//!   line's character count plus one (one past the end, for "expected more here").
//! - Errors are `Copy` and borrow nothing, so they never allocate.

/// Why a line could not be read at all, and where.
///
/// `Display` prints `column C: message`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The line is empty or holds only whitespace.
    #[error("column {column}: the line is empty")]
    EmptyLine {
        /// Always 1.
        column: usize,
    },
    /// No token of the line is a tegrastats field (free text, a `date` line, a bare timestamp, or
    /// only `NAME NUMBER` pairs, which alone are too weak to call the line tegrastats output).
    #[error("column {column}: not a tegrastats line: no known field")]
    NoField {
        /// Column of the line's first token.
        column: usize,
    },
    /// A field key such as `RAM` was found, its value breaks the grammar, and nothing else on the
    /// line could be read (typically a line cut short).
    #[error("column {column}: malformed {field} field: expected {expected}")]
    MalformedField {
        /// Column where the grammar was broken.
        column: usize,
        /// The field's key, e.g. `RAM`.
        field: &'static str,
        /// What the grammar wanted at that column.
        expected: &'static str,
    },
}

impl ParseError {
    /// The 1-based character column the error points at.
    pub fn column(&self) -> usize {
        match *self {
            ParseError::EmptyLine { column }
            | ParseError::NoField { column }
            | ParseError::MalformedField { column, .. } => column,
        }
    }
}

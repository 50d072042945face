//! The real captures in `tests/data/`, one entry per line, for every test that reads them.

use std::path::{Path, PathBuf};

/// One verbatim tegrastats line and where it comes from.
#[derive(Debug, Clone)]
pub struct Capture {
    /// File name inside `tests/data/`, e.g. `thor_jp7.1_l4t-r38.4.txt`.
    pub file: String,
    /// 1-based line number inside that file.
    pub number: usize,
    /// The line without its newline.
    pub line: String,
}

impl Capture {
    /// `file:line`, for assertion messages.
    pub fn origin(&self) -> String {
        format!("{}:{}", self.file, self.number)
    }
}

pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Every line of every `tests/data/*.txt`, files in name order.
pub fn captures() -> Vec<Capture> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir())
        .expect("tests/data is readable")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "txt"))
        .collect();
    files.sort();
    let mut captures = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("capture is UTF-8");
        let file = path
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        for (index, line) in text.lines().enumerate() {
            captures.push(Capture {
                file: file.clone(),
                number: index + 1,
                line: line.to_owned(),
            });
        }
    }
    assert!(
        captures.len() >= 57,
        "the capture set lost lines: {}",
        captures.len()
    );
    captures
}

/// Line `number` of a capture file, leaked so a `Sample` borrowing it can outlive the call.
pub fn capture(file: &str, number: usize) -> &'static str {
    let line = captures()
        .into_iter()
        .find(|c| c.file == file && c.number == number)
        .unwrap_or_else(|| panic!("no capture {file}:{number}"))
        .line;
    Box::leak(line.into_boxed_str())
}

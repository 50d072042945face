//! Fuzzes `parse_line` with arbitrary text: it must never panic, borrowed names must come from
//! the line, an error's column must lie within the line, and any sample must convert and
//! serialize.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tegrastats_parser::{OwnedSample, parse_line};

fn within(line: &str, part: &str) -> bool {
    let start = line.as_ptr() as usize;
    let at = part.as_ptr() as usize;
    at >= start && at + part.len() <= start + line.len()
}

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    match parse_line(&line) {
        Ok(sample) => {
            assert!(
                sample
                    .unknown()
                    .iter()
                    .all(|t| !t.is_empty() && within(&line, t))
            );
            assert!(sample.temperatures().iter().all(|t| within(&line, t.zone)));
            assert!(sample.rails().iter().all(|r| within(&line, r.name)));
            assert!(sample.engines().iter().all(|e| within(&line, e.name)));
            assert!(sample.gpu_fields().iter().all(|f| within(&line, f.name)));
            let owned = OwnedSample::from(&sample);
            assert!(serde_json::to_string(&owned).is_ok());
        }
        Err(error) => {
            let column = error.column();
            assert!(column >= 1 && column <= line.chars().count() + 1);
        }
    }
});

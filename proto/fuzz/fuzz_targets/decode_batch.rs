//! Whole-payload decoding (zstd, limits, protobuf, structure) must never panic or over-allocate.
//! Run: `RUSTC_BOOTSTRAP=1 cargo fuzz run decode_batch` in `proto/` (see docs/wire-protocol.md).
#![no_main]

use edgewatch_proto::framing::{decode_batch, decode_batch_protobuf};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = decode_batch(data) {
        assert!(edgewatch_proto::framing::check_structure(&batch).is_ok());
    }
    let _ = decode_batch_protobuf(data);
});

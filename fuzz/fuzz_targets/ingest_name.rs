#![no_main]
//! The `name=app.suffix{k=v}` parameter and profefe's `labels=k=v,k=v`.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kiln_ingest::pyroscope::parse_name(text);
        let _ = kiln_ingest::profefe::parse_labels(text);
    }
});

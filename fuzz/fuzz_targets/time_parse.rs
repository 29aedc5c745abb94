#![no_main]
//! Time arguments: now-1h, epochs, RFC 3339.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = kiln_model::time::parse_time_nanos(text, 1_800_000_000_000_000_000);
        let _ = kiln_model::time::parse_duration_nanos(text);
        let _ = kiln_model::time::parse_epoch_nanos(text);
    }
});

#![no_main]
//! `perf script` text into a pprof.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(profile) = kiln_model::perf_script::parse(data, 16_000) {
        assert!(kiln_model::pprof::validate(&profile, &Default::default()).is_ok());
    }
});

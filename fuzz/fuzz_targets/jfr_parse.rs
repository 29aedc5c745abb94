#![no_main]
//! JFR recordings: chunk headers, metadata, constant pools and events, into pprofs.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let contexts = kiln_model::jfr::Contexts::new();
    if let Ok(recordings) = kiln_model::jfr::parse(data, 10_000_000, 16_000, &contexts) {
        for recording in recordings {
            assert!(kiln_model::pprof::validate(&recording.profile, &Default::default()).is_ok());
        }
    }
});

#![no_main]
//! What a scrape target or an HTTP SD server may answer: the first half of the input as a
//! profile, taken twice through the delta state (baseline, then delta against a second
//! profile from the other half), and the whole input as HTTP SD target groups and as
//! relabel rules.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (first, second) = data.split_at(data.len() / 2);
    let mut state = kiln_scrape::delta::DeltaState::default();
    for half in [first, second] {
        let Ok(profile) = kiln_model::pprof::decode(half, 1 << 24) else {
            continue;
        };
        if kiln_model::pprof::validate(&profile, &Default::default()).is_err() {
            continue;
        }
        if let kiln_scrape::delta::Delta::Profile(delta) = state.apply(profile) {
            // A delta is still a valid profile.
            assert!(kiln_model::pprof::validate(&delta, &Default::default()).is_ok());
        }
    }
    let _ = serde_json::from_slice::<Vec<kiln_scrape::config::StaticConfig>>(data);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(rules) = serde_yaml::from_str::<Vec<kiln_scrape::relabel::RelabelConfig>>(text) {
            let labels = [("__address__".to_string(), "h:1".to_string())].into_iter().collect();
            let _ = kiln_scrape::relabel::relabel(&labels, &rules);
        }
    }
});

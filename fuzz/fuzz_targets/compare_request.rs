#![no_main]
//! Comparisons as `POST /api/v1/compare` takes them (JSON from any client): parsed,
//! checked and resolved, and ranked over sums built from the bytes; never a panic.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = serde_json::from_slice::<kiln_insight::CompareRequest>(data) {
        let _ = request.resolve(1_700_000_000_000_000_000);
    }
    // Arbitrary sides: function names and values from the bytes, ranked.
    let mut sides = [kiln_insight::stats::SideSums::default(), Default::default()];
    for (index, chunk) in data.chunks(3).enumerate() {
        let name = format!("f{}", chunk[0] % 8);
        let value = i64::from(*chunk.get(1).unwrap_or(&0)) - 16;
        sides[index % 2].add_profile([(name.as_str(), value), ("g", i64::from(*chunk.get(2).unwrap_or(&1)))]);
    }
    let ranking = kiln_insight::stats::rank(&sides[0], &sides[1], &Default::default());
    for change in &ranking.functions {
        if let Some(p) = change.p_value {
            assert!((0.0..=1.0).contains(&p), "{change:?}");
        }
    }
});

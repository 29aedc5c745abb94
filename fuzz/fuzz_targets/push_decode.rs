#![no_main]
//! Pyroscope PushRequest bodies, protobuf and JSON, and the profiles inside.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // No retention: random times would otherwise stop most inputs before the builder.
    let limits = kiln_ingest::Limits {
        retention_days: 0,
        ..Default::default()
    };
    if let Ok(request) = kiln_ingest::push::decode_proto(data) {
        let _ = kiln_ingest::push::parse_push(request, &limits);
    }
    if let Ok(request) = kiln_ingest::push::decode_json(data) {
        let _ = kiln_ingest::push::parse_push(request, &limits);
    }
});

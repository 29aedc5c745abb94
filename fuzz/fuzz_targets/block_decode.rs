#![no_main]
//! Block objects: a corrupt block must be an error, never a panic.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let block = bytes::Bytes::copy_from_slice(data);
    if let Ok(dataset) = kiln_storage::format::decode_dataset(&block, 0, kiln_storage::format::Projection::ALL) {
        let _ = dataset.check();
    }
});

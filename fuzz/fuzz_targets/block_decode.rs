#![no_main]
//! Block objects: a corrupt block must be an error, never a panic, whether it is decoded
//! whole or, as compaction does, from its tail and one dataset's byte range.
use libfuzzer_sys::fuzz_target;

fuzz_target!(
    // The parquet crate panics on some corrupt metadata; the decoder catches that and
    // answers an error (kiln-storage's format.rs). libFuzzer's panic hook would abort at
    // the panic, before the decoder could catch it, so this target prints instead. A
    // panic the decoder does not catch still reaches libFuzzer, which aborts on it.
    init: {
        std::panic::set_hook(Box::new(|info| eprintln!("caught later: {info}")));
    },
    |data: &[u8]| kiln_fuzz::targets::block_decode(data)
);

#![no_main]
//! Block objects: a corrupt block must be an error, never a panic, whether it is decoded
//! whole or, as compaction does, from its tail and one dataset's byte range.
use kiln_storage::format::Projection;
use kiln_storage::ranged::{decode_partial, BlockTail, PartialBlock};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let block = bytes::Bytes::copy_from_slice(data);
    if let Ok(dataset) = kiln_storage::format::decode_dataset(&block, 0, Projection::ALL) {
        let _ = dataset.check();
    }
    let len = block.len() as u64;
    let Ok(Ok(tail)) = BlockTail::parse(block.clone(), len) else {
        return;
    };
    for row_group in 0..tail.dataset_count().min(8) {
        let Ok(range) = tail.dataset_range(row_group) else {
            continue;
        };
        let part = block.slice(range.start as usize..range.end as usize);
        let (start, bytes) = tail.bytes();
        let partial = PartialBlock::new(len, vec![(range.start, part), (start, bytes.clone())]);
        if let Ok(dataset) = decode_partial(partial, row_group, Projection::ALL) {
            let _ = dataset.check();
        }
    }
});

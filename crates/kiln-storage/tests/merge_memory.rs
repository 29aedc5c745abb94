//! A streaming merge holds what its memory limit allows, however many samples its inputs
//! hold; the in-memory merge of the same inputs holds several times more. One test in
//! its own binary: the allocator counts every thread's heap.

#[path = "support/synthetic.rs"]
mod synthetic;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kiln_storage::format::{decode_dataset, BlockEncoding, Projection};
use kiln_storage::merge::{merge, MergeInput, Streamed};
use kiln_storage::DatasetBuilder;

struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let held = HELD.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(held, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            let held = HELD.fetch_add(new_size - layout.size(), Ordering::Relaxed)
                + (new_size - layout.size());
            PEAK.fetch_max(held, Ordering::Relaxed);
        } else {
            HELD.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The heap `work` held at its peak beyond what was held when it started.
fn peak_of<T>(work: impl FnOnce() -> T) -> (T, usize) {
    let before = HELD.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let done = work();
    (done, PEAK.load(Ordering::Relaxed) - before)
}

#[test]
fn a_merge_of_many_inputs_stays_under_its_memory_limit() {
    const LIMIT: usize = 64 << 20;
    // Sixteen inputs of 300 profiles of ~1,200 samples: 6 M samples, whose decoded merge
    // would hold several times the limit. Each input's sample columns are several
    // Parquet pages (a dataset's tables are split over records of 65,536 rows, and
    // parquet-rs ends pages between records).
    let datasets: Vec<_> = (0..16)
        .map(|i| synthetic::merged(&synthetic::raw(10 + i, 300, 2_000, i as i64 * 3_000)))
        .collect();
    let samples: usize = datasets.iter().map(|d| d.sample_stack.len()).sum();
    let sent: i64 = datasets.iter().flat_map(|d| d.sample_value.iter()).sum();
    let inputs: Vec<MergeInput> = (datasets.iter().enumerate())
        .map(|(i, d)| synthetic::input(&format!("input {i}"), d, BlockEncoding::Compacted))
        .collect();
    let fetched: usize = inputs.iter().map(|i| i.block.size_bytes()).sum();

    let (_, in_memory) = peak_of(|| {
        let mut builder = DatasetBuilder::new("t", "checkout");
        for input in &inputs {
            let dataset =
                kiln_storage::ranged::decode_partial(input.block.clone(), 0, Projection::ALL)
                    .unwrap();
            builder.add_dataset(&dataset);
        }
        let mut dataset = builder.finish();
        dataset.sum_stacks_if_smaller();
        kiln_storage::format::encode_block_as(&[dataset], BlockEncoding::Compacted).unwrap()
    });
    drop(datasets);

    // Merged under the limit, a few inputs at a time, until one block holds them all.
    let mut remaining = inputs;
    let mut merges = Vec::new();
    let mut total = 0i64;
    while !remaining.is_empty() {
        let (streamed, peak) =
            peak_of(|| merge("t", "checkout", &remaining, BlockEncoding::Compacted, LIMIT));
        let Streamed::Merged(merged) = streamed.unwrap() else {
            panic!("declined")
        };
        println!(
            "merged {} of {} inputs: peak {:.1} MiB (estimated {:.1} MiB, limit {} MiB)",
            merged.inputs_used,
            remaining.len(),
            peak as f64 / 1048576.0,
            merged.estimated_bytes as f64 / 1048576.0,
            LIMIT >> 20
        );
        assert!(peak <= LIMIT, "peak {peak} over the limit {LIMIT}");
        assert!(
            peak <= merged.estimated_bytes,
            "peak {peak} over the estimate {}",
            merged.estimated_bytes
        );
        let block = bytes::Bytes::from(merged.block);
        let dataset = decode_dataset(&block, 0, Projection::ALL).unwrap();
        dataset.check().unwrap();
        total += dataset.sample_value.iter().sum::<i64>();
        merges.push(merged.inputs_used);
        remaining.drain(..merged.inputs_used);
    }
    println!(
        "{samples} samples, {:.1} MiB fetched; in-memory merge of all: peak {:.1} MiB; \
         streamed in {} merges {merges:?}",
        fetched as f64 / 1048576.0,
        in_memory as f64 / 1048576.0,
        merges.len()
    );
    assert_eq!(total, sent, "every value is in a merged block, once");
    assert!(merges.len() > 1 && merges.len() < 16, "{merges:?}");
    assert!(
        in_memory > 2 * LIMIT,
        "the in-memory merge held {in_memory}: the limit tests nothing"
    );
}

//! The streaming merge makes what the in-memory merge makes of the same inputs.

#[path = "support/synthetic.rs"]
mod synthetic;

use kiln_storage::format::{decode_dataset, encode_block_as, BlockEncoding, Projection};
use kiln_storage::merge::{merge, MergeInput, Streamed};
use kiln_storage::{Dataset, DatasetBuilder};

/// A sample as (stack, value, its labels as (name, value)).
type Sample = (u32, i64, Vec<(u32, u32)>);

/// Each profile's row and its samples, order-free within it.
fn normalized(dataset: &Dataset) -> Vec<(kiln_storage::ProfileRow, Vec<Sample>)> {
    let offsets = dataset.profile_sample_offsets();
    let mut labels: Vec<Vec<(u32, u32)>> = vec![Vec::new(); dataset.sample_stack.len()];
    for row in 0..dataset.sample_label_sample.len() {
        labels[dataset.sample_label_sample[row] as usize].push((
            dataset.sample_label_name[row],
            dataset.sample_label_value[row],
        ));
    }
    (dataset.profiles.iter().enumerate())
        .map(|(index, row)| {
            let mut samples: Vec<_> = (offsets[index] as usize..offsets[index + 1] as usize)
                .map(|sample| {
                    let mut set = labels[sample].clone();
                    set.sort_unstable();
                    (
                        dataset.sample_stack[sample],
                        dataset.sample_value[sample],
                        set,
                    )
                })
                .collect();
            samples.sort();
            (row.clone(), samples)
        })
        .collect()
}

fn in_memory(inputs: &[Dataset]) -> Dataset {
    let mut builder = DatasetBuilder::new("t", "checkout");
    for input in inputs {
        builder.add_dataset(input);
    }
    let mut dataset = builder.finish();
    dataset.sum_stacks_if_smaller();
    dataset
}

fn streamed(inputs: &[MergeInput], encoding: BlockEncoding) -> (Dataset, usize) {
    match merge("t", "checkout", inputs, encoding, usize::MAX).unwrap() {
        Streamed::Merged(merged) => {
            let block = bytes::Bytes::from(merged.block);
            let dataset = decode_dataset(&block, 0, Projection::ALL).unwrap();
            dataset.check().unwrap();
            // Its sample columns, encoded as they filled, are what the block writer makes
            // of the whole dataset, byte for byte.
            let whole = encode_block_as(std::slice::from_ref(&dataset), encoding).unwrap();
            assert!(
                whole == block,
                "the streamed block differs from the dataset's"
            );
            assert_eq!(merged.min_time_nanos, dataset.min_time_nanos);
            assert_eq!(merged.max_time_nanos, dataset.max_time_nanos);
            (dataset, merged.decoded_whole)
        }
        Streamed::Declined(why) => panic!("declined: {why}"),
    }
}

#[test]
fn a_streamed_merge_holds_what_the_in_memory_merge_holds() {
    // Overlapping hours, one input as no merge writes it (series out of canonical order).
    let datasets = [
        synthetic::merged(&synthetic::raw(1, 600, 800, 0)),
        synthetic::merged(&synthetic::raw(2, 80, 200, 300)),
        synthetic::raw(3, 60, 250, 150),
        synthetic::merged(&synthetic::raw(4, 100, 100, 3_600)),
    ];
    for encoding in [BlockEncoding::Compacted, BlockEncoding::Snappy] {
        let inputs: Vec<MergeInput> = (datasets.iter().enumerate())
            .map(|(i, dataset)| synthetic::input(&format!("input {i}"), dataset, encoding))
            .collect();
        let expected = in_memory(&datasets);
        let (merged, whole) = streamed(&inputs, encoding);
        assert_eq!(whole, 1, "only the raw input is decoded whole");
        assert_eq!(merged.strings, expected.strings);
        assert_eq!(merged.functions, expected.functions);
        assert_eq!(merged.location_address, expected.location_address);
        assert_eq!(merged.stack_parent, expected.stack_parent);
        assert_eq!(merged.stack_location, expected.stack_location);
        assert_eq!(merged.series, expected.series);
        assert_eq!(merged.profiles.len(), 840);
        assert_eq!(normalized(&merged), normalized(&expected));
        assert_eq!(merged.stack_sum_series, expected.stack_sum_series);
        assert_eq!(merged.stack_sum_stack, expected.stack_sum_stack);
        assert_eq!(merged.stack_sum_value, expected.stack_sum_value);
        assert!(!merged.stack_sum_stack.is_empty());
        let sent: i64 = (datasets.iter()).flat_map(|d| d.sample_value.iter()).sum();
        let totals: i64 = merged.profiles.iter().map(|p| p.total).sum();
        assert_eq!(totals, sent);
        assert_eq!(merged.sample_value.iter().sum::<i64>(), sent);
        // The output is canonical: merged again with itself, every input streams.
        let again = synthetic::input("merged", &merged, encoding);
        let (twice, whole) = streamed(std::slice::from_ref(&again), encoding);
        assert_eq!(whole, 0);
        assert_eq!(normalized(&twice), normalized(&merged));
    }
}

#[test]
fn inputs_of_another_service_are_refused() {
    let mut other = synthetic::raw(5, 8, 10, 0);
    other.service = "billing".into();
    let inputs = [synthetic::input("other", &other, BlockEncoding::Compacted)];
    let err = match merge(
        "t",
        "checkout",
        &inputs,
        BlockEncoding::Compacted,
        usize::MAX,
    ) {
        Err(err) => err.to_string(),
        Ok(_) => panic!("merged another service's dataset"),
    };
    assert!(err.contains("holds t/billing"), "{err}");
}

#[test]
fn inputs_with_the_same_stack_twice_go_to_the_in_memory_merge() {
    let mut twice = synthetic::raw(6, 8, 10, 0);
    // Node 3 made a copy of node 2: same parent, same frame.
    twice.stack_parent[3] = twice.stack_parent[2];
    twice.stack_location[3] = twice.stack_location[2];
    let inputs = [synthetic::input("twice", &twice, BlockEncoding::Compacted)];
    assert!(matches!(
        merge(
            "t",
            "checkout",
            &inputs,
            BlockEncoding::Compacted,
            usize::MAX
        )
        .unwrap(),
        Streamed::Declined(_)
    ));
}

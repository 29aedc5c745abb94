//! Blocks of an older format version, as an older Kiln wrote them, still read, and merge
//! with blocks of the current one: `testdata/blocks/v2-profefe-collector_cpu_1.parquet`
//! (format version 2, one record per dataset; testdata/README.md says how it was made).

// Only its `partial`.
#[allow(dead_code)]
#[path = "support/synthetic.rs"]
mod synthetic;

use bytes::Bytes;
use kiln_storage::format::{decode_dataset, encode_block_as, BlockEncoding, Projection};
use kiln_storage::merge::{merge, MergeInput, Streamed};
use kiln_storage::Dataset;
use parquet::file::reader::{FileReader, SerializedFileReader};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

fn testdata(name: &str) -> Bytes {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name);
    Bytes::from(std::fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display())))
}

/// The footer's `kiln.block.version` and the first row group's rows (records).
fn version_and_records(block: &Bytes) -> (String, i64) {
    let reader = SerializedFileReader::new(block.clone()).unwrap();
    let version = (reader
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .unwrap()
        .iter())
    .find(|kv| kv.key == "kiln.block.version")
    .and_then(|kv| kv.value.clone())
    .unwrap();
    (version, reader.metadata().row_group(0).num_rows())
}

/// The sum of the CPU samples' values, from the samples and from the profile totals.
fn cpu_sums(dataset: &Dataset) -> (i64, i64) {
    let offsets = dataset.profile_sample_offsets();
    let (mut samples, mut totals) = (0, 0);
    for (index, profile) in dataset.profiles.iter().enumerate() {
        let series = &dataset.series[profile.series as usize];
        if dataset.strings.get(series.profile_type as usize) != Some(CPU) {
            continue;
        }
        let range = offsets[index] as usize..offsets[index + 1] as usize;
        samples += dataset.sample_value[range].iter().sum::<i64>();
        totals += profile.total;
    }
    (samples, totals)
}

/// The fixture's profile's CPU total (its second sample type), as the pprof holds it.
fn pprof_cpu_total() -> i64 {
    let bytes = testdata("profefe-collector_cpu_1.prof");
    let profile = kiln_model::pprof::decode(&bytes, 64 << 20).unwrap();
    profile.sample.iter().map(|sample| sample.value[1]).sum()
}

#[test]
fn a_version_2_block_reads_rewrites_and_merges() {
    let block = testdata("blocks/v2-profefe-collector_cpu_1.parquet");
    assert_eq!(version_and_records(&block), ("2".to_string(), 1));
    let old = decode_dataset(&block, 0, Projection::ALL).unwrap();
    old.check().unwrap();
    assert_eq!(
        (old.tenant.as_str(), old.service.as_str()),
        ("anonymous", "api")
    );
    // The profile twice, as two sample types each.
    assert_eq!(old.profiles.len(), 4);
    let sent = 2 * pprof_cpu_total();
    assert!(sent > 0);
    assert_eq!(cpu_sums(&old), (sent, sent));

    // Written again by this build: the current version, the same dataset.
    let rewritten =
        Bytes::from(encode_block_as(std::slice::from_ref(&old), BlockEncoding::Compacted).unwrap());
    assert_eq!(
        version_and_records(&rewritten).0,
        kiln_storage::format::FORMAT_VERSION
    );
    assert_eq!(decode_dataset(&rewritten, 0, Projection::ALL).unwrap(), old);

    // Merged, streaming, with a block of the current version: both read, every value once.
    let inputs = [
        MergeInput {
            name: "version 2".into(),
            block: synthetic::partial(&block),
            row_group: 0,
        },
        MergeInput {
            name: "current".into(),
            block: synthetic::partial(&rewritten),
            row_group: 0,
        },
    ];
    let merged = match merge(
        "anonymous",
        "api",
        &inputs,
        BlockEncoding::Compacted,
        usize::MAX,
    )
    .unwrap()
    {
        Streamed::Merged(merged) => merged,
        Streamed::Declined(why) => panic!("declined: {why}"),
    };
    assert_eq!(merged.inputs_used, 2);
    let merged = decode_dataset(&Bytes::from(merged.block), 0, Projection::ALL).unwrap();
    merged.check().unwrap();
    assert_eq!(merged.profiles.len(), 8);
    assert_eq!(cpu_sums(&merged), (2 * sent, 2 * sent));
}

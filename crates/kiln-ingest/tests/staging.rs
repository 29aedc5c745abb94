//! The write path's batches under concurrent writers: each request's profiles land whole
//! in one segment, each exactly once, and the memory they were counted by is released once
//! their flush is done. Real segments on a local directory and SQLite.

use std::collections::BTreeMap;

use kiln_ingest::parse::{from_pprof_bytes, ProfileContext};
use kiln_ingest::{Ingester, IngesterConfig, Limits, ParsedProfile};
use kiln_metastore::{DatasetQuery, Metastore};
use kiln_model::labels::Labels;
use kiln_storage::ObjectStorage;

const REQUESTS: usize = 64;

fn profile(pprof: &[u8], service: &str, id: String) -> ParsedProfile {
    let context = ProfileContext {
        labels: Labels::from_pairs(vec![("service_name".to_string(), service.to_string())]),
        id: Some(id),
        time_nanos: Some(kiln_model::time::now_nanos()),
        ..Default::default()
    };
    from_pprof_bytes(pprof, context, &Limits::default()).expect("fixture parses")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_land_whole_once_and_release_their_memory() {
    let dir = tempfile::tempdir().unwrap();
    let storage =
        ObjectStorage::open(&format!("file://{}", dir.path().join("blocks").display())).unwrap();
    let metastore = Metastore::open(&format!("sqlite://{}", dir.path().join("m.db").display()))
        .await
        .unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/parca-two-stacks.pb.gz");
    let pprof = std::fs::read(fixture).unwrap();
    let (ingester, flusher) =
        Ingester::start(storage, metastore.clone(), IngesterConfig::default());

    // Every request carries one profile of each of two services, so a request split
    // between two batches would leave a segment with more of one than of the other.
    let writes: Vec<_> = (0..REQUESTS)
        .map(|request| {
            let ingester = ingester.clone();
            let profiles = vec![
                profile(&pprof, "left", format!("left-{request}")),
                profile(&pprof, "right", format!("right-{request}")),
            ];
            tokio::spawn(async move { ingester.write("t", profiles).await })
        })
        .collect();
    for write in writes {
        write.await.unwrap().unwrap();
    }
    assert_eq!(
        ingester.metrics().pending_bytes.get(),
        0,
        "the staged memory of flushed batches is released"
    );

    let datasets = metastore
        .list_datasets(DatasetQuery {
            tenant: "t".into(),
            service: None,
            from_nanos: i64::MIN,
            to_nanos: i64::MAX,
        })
        .await
        .unwrap();
    let mut per_segment: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for dataset in &datasets {
        let counts = per_segment.entry(dataset.block_id.clone()).or_default();
        match dataset.service.as_str() {
            "left" => counts.0 += dataset.profile_count,
            "right" => counts.1 += dataset.profile_count,
            other => panic!("unexpected service {other}"),
        }
    }
    for (segment, (left, right)) in &per_segment {
        assert_eq!(left, right, "segment {segment} holds part of a request");
    }
    let left: u64 = per_segment.values().map(|(left, _)| left).sum();
    assert_eq!(left, REQUESTS as u64, "every profile once");

    drop(ingester);
    flusher.await.unwrap();
}

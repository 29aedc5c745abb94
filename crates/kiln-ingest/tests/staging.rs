//! The write path's batches under concurrent writers: each request's profiles land whole
//! in one segment, each exactly once, and the memory they were counted by is released once
//! their flush is done. Real segments on a local directory and SQLite.

use std::collections::BTreeMap;

mod common;

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

/// A local block directory and a SQLite metastore in `dir`.
async fn open(dir: &tempfile::TempDir) -> (ObjectStorage, Metastore) {
    let storage =
        ObjectStorage::open(&format!("file://{}", dir.path().join("blocks").display())).unwrap();
    let metastore = Metastore::open(&format!("sqlite://{}", dir.path().join("m.db").display()))
        .await
        .unwrap();
    (storage, metastore)
}

use kiln_testkit::fixture;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_land_whole_once_and_release_their_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, metastore) = open(&dir).await;
    let pprof = fixture("parca-two-stacks.pb.gz");
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

/// The datasets of `service` in the order their segments were written (one flush per
/// write here).
async fn written(
    metastore: &Metastore,
    storage: &ObjectStorage,
    service: &str,
) -> Vec<kiln_storage::Dataset> {
    common::decoded(metastore, storage, Some(service)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_services_symbols_stay_warm_between_flushes_within_their_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (storage, metastore) = open(&dir).await;
    let (cpu, other) = (
        fixture("pprof-report-sample.cpu.pb.gz"),
        fixture("parca-profile-with-labels.pb.gz"),
    );
    let (ingester, flusher) = Ingester::start(
        storage.clone(),
        metastore.clone(),
        IngesterConfig::default(),
    );
    // One write after another, each a flush of its own. A service's tables are kept after
    // its first flush, and after each flush that found at least half of its rows known;
    // a profile of another program under the same name starts them afresh.
    for (id, pprof, kept) in [
        ("a", &cpu, true),
        ("b", &cpu, true),
        ("c", &other, false),
        ("d", &cpu, true),
    ] {
        let profiles = vec![profile(pprof, "svc", id.to_string())];
        ingester.write("t", profiles).await.unwrap();
        let warm = ingester.metrics().warm_bytes.get();
        assert_eq!(warm > 0, kept, "after write {id}: {warm} bytes kept");
    }
    let datasets = written(&metastore, &storage, "svc").await;
    assert_eq!(datasets.len(), 4);
    // The second segment, written from warm tables, holds the same profile as the first,
    // built fresh (which also kept the strings no row of the profile uses).
    let (first, second) = (&datasets[0], &datasets[1]);
    let text = |dataset: &kiln_storage::Dataset, id: u32| dataset.strings[id as usize].to_string();
    let names = |dataset: &kiln_storage::Dataset| {
        let functions = dataset.functions.iter();
        functions
            .map(|f| {
                (
                    text(dataset, f.name),
                    text(dataset, f.filename),
                    f.start_line,
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(names(second), names(first));
    assert_eq!(second.line_function, first.line_function);
    assert_eq!(second.stack_parent, first.stack_parent);
    assert_eq!(second.stack_location, first.stack_location);
    assert_eq!(second.sample_stack, first.sample_stack);
    assert_eq!(second.sample_value, first.sample_value);
    assert!(second.strings.len() <= first.strings.len());
    let totals = |dataset: &kiln_storage::Dataset| {
        let profiles = dataset.profiles.iter();
        profiles
            .map(|p| (p.total, p.sample_count))
            .collect::<Vec<_>>()
    };
    assert_eq!(totals(second), totals(first));
    drop(ingester);
    flusher.await.unwrap();

    // With a budget too small for one service's tables, nothing is kept.
    let config = IngesterConfig {
        max_pending_bytes: 64 << 10,
        ..IngesterConfig::default()
    };
    let (ingester, flusher) = Ingester::start(storage, metastore, config);
    ingester
        .write("t", vec![profile(&cpu, "small", "d".into())])
        .await
        .unwrap();
    assert_eq!(ingester.metrics().warm_bytes.get(), 0);
    drop(ingester);
    flusher.await.unwrap();
}

/// Compaction's backlog is read from the metastore: a level-0 dataset that waited an hour
/// (the mean with the test's own fresh ones stays far over the bound) spaces the flushes, up to `flush_interval`; once they are merged away (here, expired)
/// the flushes run at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_are_spaced_while_compaction_is_behind_and_not_once_it_catches_up() {
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let (storage, metastore) = open(&dir).await;
    let hour_ago = kiln_model::time::now_ms() - 3_600_000;
    let stale = kiln_metastore::BlockMeta {
        id: "stale".into(),
        object_key: "segments/stale.parquet".into(),
        level: 0,
        size_bytes: 1,
        created_at_ms: hour_ago,
        deleted_at_ms: None,
    };
    let dataset = kiln_metastore::DatasetMeta {
        block_id: "stale".into(),
        object_key: stale.object_key.clone(),
        tenant: "t".into(),
        service: "old".into(),
        row_group: 0,
        min_time_nanos: hour_ago * 1_000_000,
        max_time_nanos: hour_ago * 1_000_000,
        profile_types: vec!["process_cpu:cpu:nanoseconds:cpu:nanoseconds".into()],
        profile_count: 1,
        rules_counted: false,
    };
    metastore
        .register_block(stale, vec![dataset])
        .await
        .unwrap();
    let interval = Duration::from_millis(400);
    let config = IngesterConfig {
        flush_interval: interval,
        max_compaction_wait: Some(Duration::from_secs(10)),
        ..IngesterConfig::default()
    };
    let (ingester, flusher) = Ingester::start(storage, metastore.clone(), config);
    let pprof = fixture("parca-two-stacks.pb.gz");
    let sequential_writes = |ingester: Ingester, first: usize| {
        let pprof = pprof.clone();
        async move {
            let write =
                |n: usize| ingester.write("t", vec![profile(&pprof, "api", format!("w{n}"))]);
            // Four writes, one after another, are four flushes: the last starts three
            // gaps after the first, and both start within the timed span. (Timing from the
            // first ack instead took that flush's own length off, which a loaded host
            // makes longer than any margin.)
            let started = Instant::now();
            for n in first..first + 4 {
                write(n).await.unwrap();
            }
            started.elapsed()
        }
    };

    // Waits (20 s at most) until the gap the backlog reader set is `wanted`.
    let gap_becomes = |wanted: Duration| {
        let ingester = ingester.clone();
        async move {
            let waited = Instant::now();
            while ingester.flush_backoff() != wanted {
                assert!(
                    waited.elapsed() < Duration::from_secs(20),
                    "the gap stayed at {:?}, not {wanted:?}",
                    ingester.flush_backoff()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    gap_becomes(interval).await;
    let spaced = sequential_writes(ingester.clone(), 0).await;
    assert!(
        spaced >= interval * 3,
        "four writes took {spaced:?}, less than three gaps of {interval:?}"
    );

    // Compaction catches up.
    assert_eq!(
        metastore
            .expire_datasets("t", (hour_ago + 1) * 1_000_000, 0)
            .await
            .unwrap(),
        1
    );
    gap_becomes(Duration::ZERO).await;
    let prompt = sequential_writes(ingester.clone(), 10).await;
    // Spaced, they would take three gaps; unspaced, four flushes of a few milliseconds.
    assert!(
        prompt < interval * 2,
        "four writes took {prompt:?} with compaction caught up"
    );
    drop(ingester);
    flusher.await.unwrap();
}

/// With the rules' hook, a segment is counted in its registration: the datasets of a
/// tenant with rules are marked `rules_counted` and their samples are in the outbox; a
/// tenant without rules is left to level 0, and a rule saved after the writer last
/// looked counts from the next segment on (its first at level 0, not here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_is_counted_at_its_registration_for_the_tenants_with_rules() {
    use kiln_metastore::{Exports, RuleRecord, RuleSample};
    let dir = tempfile::tempdir().unwrap();
    let (storage, metastore) = open(&dir).await;
    let pprof = fixture("parca-two-stacks.pb.gz");
    let rule = |tenant: &str| RuleRecord {
        tenant: tenant.into(),
        name: "cpu".into(),
        spec: "{}".into(),
        source: "api".into(),
        live_from_ms: 0,
        updated_at_ms: 0,
    };
    metastore.put_recording_rule(rule("t")).await.unwrap();
    let (ingester, _flusher) =
        Ingester::start(storage, metastore.clone(), IngesterConfig::default());
    // One sample per dataset, of its profiles.
    ingester.count_rules_with(
        std::sync::Arc::new(|_, dataset| Exports {
            targets: vec!["prom".into()],
            samples: vec![RuleSample {
                tenant: dataset.tenant.clone(),
                rule: "cpu".into(),
                series: "{}".into(),
                step_start_ms: 0,
                step_ms: 15_000,
                value: dataset.summary().1 as i64,
            }],
        }),
        ["t".to_string()].into(),
    );
    let write = |tenant: &'static str, id: &'static str| {
        let ingester = ingester.clone();
        let profiles = vec![profile(&pprof, "api", id.to_string())];
        async move { ingester.write(tenant, profiles).await.unwrap() }
    };
    write("t", "t-1").await;
    write("u", "u-1").await;
    // u's rule is saved after the writer learnt who has rules: u's next segment is not
    // counted at its registration, which tells the writer; the one after is.
    metastore.put_recording_rule(rule("u")).await.unwrap();
    write("u", "u-2").await;
    write("u", "u-3").await;
    let counted = |tenant: &str| {
        let metastore = metastore.clone();
        let tenant = tenant.to_string();
        async move {
            let mut found: Vec<bool> = metastore
                .list_datasets(DatasetQuery {
                    tenant,
                    service: None,
                    from_nanos: i64::MIN,
                    to_nanos: i64::MAX,
                })
                .await
                .unwrap()
                .into_iter()
                .map(|dataset| dataset.rules_counted)
                .collect();
            found.sort();
            found
        }
    };
    assert_eq!(counted("t").await, vec![true]);
    assert_eq!(counted("u").await, vec![false, false, true]);
    let outbox = metastore
        .claim_exports("prom", i64::MAX, 100)
        .await
        .unwrap();
    let mut tenants: Vec<(String, i64)> = outbox
        .iter()
        .map(|sample| (sample.tenant.clone(), sample.value))
        .collect();
    tenants.sort();
    assert_eq!(
        tenants,
        vec![("t".to_string(), 1), ("u".to_string(), 1)],
        "t's segment and u's last, each once"
    );
}

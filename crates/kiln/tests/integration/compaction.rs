//! Compaction and retention on a live server: every answer is the same before and after
//! compaction, segments are merged into per-service blocks and their objects deleted, and
//! retention removes exactly what is older than the window.

use std::time::Duration;

use kiln_node::ServerConfig;
use kiln_query::api;
use prost::Message;

use crate::common::*;

const FIXTURES: [&str; 4] = [
    "profefe-collector_cpu_1.prof",
    "pprof-report-sample.cpu.pb.gz",
    "parca-profile-with-labels.pb.gz",
    "profefe-collector_heap_1.prof",
];

fn no_compaction(config: &mut ServerConfig) {
    config.compaction.enabled = false;
}

on_every_backend!(
    compaction_changes_no_answer_and_leaves_one_block_per_service,
    retention_removes_only_what_is_older_than_the_window,
    compaction_reads_each_segment_about_once,
    a_lone_dataset_is_copied_out_of_its_segment,
    a_segment_of_lone_datasets_is_promoted_whole,
    a_segment_holding_one_lone_dataset_is_promoted_in_place,
);

/// Without compaction, and every write that arrives within two seconds of a batch's
/// first in that batch's flush (acknowledged once its segment is, with no write-ahead
/// log): writes sent together share one segment.
fn writes_sent_together_share_a_segment(config: &mut ServerConfig) {
    no_compaction(config);
    config.wal = false;
    config.flush_adaptive = false;
    config.flush_interval_ms = 2_000;
}

/// Compaction as [`eager_compaction`] has it, but above level 0 a level is due only when
/// it holds two datasets of a window: a lone dataset there waits (for its age, which is
/// never reached here) to move up, so what level 0 did stays to be seen.
fn eager_by_count(config: &mut ServerConfig) {
    eager_compaction(config);
    for level in config.compaction.levels.iter_mut().skip(1) {
        level.max_age_ms = i64::MAX / 4;
    }
}

/// A service with one dataset at level 0, in a segment it shares with a service that has
/// more due than a promotion raises (three), gets a level-1 block of it by a copy of its
/// column chunks, not a merge: the segment goes, the copy keeps the segment's pages
/// (uncompressed) where the other service's merge is snappy, and every answer is the same
/// before and after.
fn a_lone_dataset_is_copied_out_of_its_segment(backend: Backend) {
    let server = TestServer::start_on(backend, writes_sent_together_share_a_segment);
    let base = 1_700_000_000;
    for offset in [0, 10] {
        post_pprof(&server, "busy", base + offset, &fixture(FIXTURES[1]));
    }
    std::thread::scope(|scope| {
        for (service, name) in [("solo", FIXTURES[0]), ("busy", FIXTURES[3])] {
            let server = &server;
            scope.spawn(move || post_pprof(server, service, base + 20, &fixture(name)));
        }
    });
    assert_eq!(
        server.object_keys().len(),
        3,
        "busy's two segments and one of both services"
    );
    let (start, end) = ((base - 10) * 1000, (base + 600) * 1000);
    let before = answers(&server, start, end);
    let server = server.restart_with(eager_by_count);
    let (runtime, store) = server.open_metastore();
    wait_until_both_at_level_1(&runtime, &store);
    assert_eq!(server.metric("kiln_compaction_copies_total"), 1.0);
    assert_eq!(server.metric("kiln_compaction_promotions_total"), 0.0);
    let mut codecs: Vec<(String, Vec<String>)> = runtime
        .block_on(store.datasets_at_level(1))
        .unwrap()
        .into_iter()
        .map(|(dataset, _)| {
            let bytes = server.read_object(&dataset.object_key);
            let codecs = kiln_storage::format::block_compression(&bytes).unwrap();
            (dataset.service, codecs)
        })
        .collect();
    codecs.sort();
    assert_eq!(
        codecs,
        [
            ("busy".to_string(), vec!["SNAPPY".to_string()]),
            ("solo".to_string(), vec!["UNCOMPRESSED".to_string()])
        ]
    );
    assert_eq!(answers(&server, start, end), before);
    wait_until("the segments deleted", || {
        server
            .object_keys()
            .iter()
            .all(|key| key.starts_with("blocks/"))
    });
    // They read back after a restart too.
    let server = server.restart_with(no_compaction);
    assert_eq!(answers(&server, start, end), before);
}

/// Waits until every live block is at level 1, holding two datasets in all.
fn wait_until_both_at_level_1(
    runtime: &tokio::runtime::Runtime,
    store: &kiln_metastore::Metastore,
) {
    wait_until("both datasets moved to level 1", || {
        let blocks = runtime.block_on(store.list_blocks()).unwrap();
        blocks
            .iter()
            .filter(|b| b.deleted_at_ms.is_none())
            .all(|b| b.level == 1)
            && runtime.block_on(store.datasets_at_level(1)).unwrap().len() == 2
    });
}

/// A segment whose every dataset is its service's only one due (as the write-ahead log's
/// segments of many services at a low rate are) is raised to level 1 whole: no object is
/// written for either service, the block keeps the segment's pages (uncompressed) and
/// its key, and every answer is the same before and after.
fn a_segment_of_lone_datasets_is_promoted_whole(backend: Backend) {
    let server = TestServer::start_on(backend, writes_sent_together_share_a_segment);
    let base = 1_700_000_000;
    std::thread::scope(|scope| {
        for (service, name) in [("solo", FIXTURES[0]), ("other", FIXTURES[3])] {
            let server = &server;
            scope.spawn(move || post_pprof(server, service, base, &fixture(name)));
        }
    });
    assert_eq!(
        server.object_keys().len(),
        1,
        "both services in one segment"
    );
    let (start, end) = ((base - 10) * 1000, (base + 600) * 1000);
    let before = answers(&server, start, end);
    let server = server.restart_with(eager_by_count);
    let (runtime, store) = server.open_metastore();
    wait_until_both_at_level_1(&runtime, &store);
    assert_eq!(server.metric("kiln_compaction_promotions_total"), 1.0);
    assert_eq!(server.metric("kiln_compaction_copies_total"), 0.0);
    let raised: Vec<String> = runtime
        .block_on(store.datasets_at_level(1))
        .unwrap()
        .into_iter()
        .map(|(dataset, _)| dataset.object_key)
        .collect();
    assert!(
        raised.len() == 2
            && raised.iter().all(|key| key.starts_with("segments/"))
            && raised[0] == raised[1],
        "both datasets in the segment, raised: {raised:?}"
    );
    assert_eq!(
        compressed_as_their_level_says(&server, &runtime, &store, "UNCOMPRESSED"),
        [1]
    );
    assert_eq!(answers(&server, start, end), before);
    assert_eq!(server.object_keys().len(), 1, "no object written");
    // They read back after a restart too.
    let server = server.restart_with(no_compaction);
    assert_eq!(answers(&server, start, end), before);
}

/// A level-0 dataset alone in its segment (a flush of one service, as most are with many
/// services at a low rate) is raised to level 1 with its segment, even beside others of
/// its service: no object is written for it, and level 1 merges them. Here `solo`'s two
/// segments are raised and then merged into one level-2 block, and `other`'s one segment
/// stays, at level 1; every answer is the same before and after, and after a restart.
fn a_segment_holding_one_lone_dataset_is_promoted_in_place(backend: Backend) {
    let server = TestServer::start_on(backend, |config| {
        no_compaction(config);
        config.wal = false;
    });
    let base = 1_700_000_000;
    for (service, from, name) in [
        ("solo", base, FIXTURES[0]),
        ("solo", base + 10, FIXTURES[1]),
        ("other", base, FIXTURES[3]),
    ] {
        post_pprof(&server, service, from, &fixture(name));
    }
    let segments = server.object_keys();
    assert_eq!(segments.len(), 3, "one segment per write: {segments:?}");
    let (runtime, store) = server.open_metastore();
    let other_segment = runtime
        .block_on(store.datasets_at_level(0))
        .unwrap()
        .into_iter()
        .find(|(dataset, _)| dataset.service == "other")
        .map(|(dataset, _)| dataset.object_key)
        .unwrap();
    drop(store);
    let (start, end) = ((base - 10) * 1000, (base + 600) * 1000);
    let before = answers(&server, start, end);
    let server = server.restart_with(eager_by_count);
    let (runtime, store) = server.open_metastore();
    wait_until(
        "solo at level 2 and other at level 1, the rest deleted",
        || {
            let blocks = runtime.block_on(store.list_blocks()).unwrap();
            let mut levels: Vec<u32> = blocks.iter().map(|b| b.level).collect();
            levels.sort();
            levels == [1, 2]
                && blocks.iter().all(|b| b.deleted_at_ms.is_none())
                && server.object_keys().len() == 2
        },
    );
    assert_eq!(server.metric("kiln_compaction_promotions_total"), 3.0);
    assert_eq!(server.metric("kiln_compaction_copies_total"), 0.0);
    // Compaction's CPU counts its merge and, beyond it, its planning and transactions.
    let (cpu, merge) = (
        server.metric("kiln_compaction_cpu_seconds_total"),
        server.metric("kiln_compaction_merge_cpu_seconds_total"),
    );
    assert!(
        merge > 0.0 && cpu > merge,
        "compaction {cpu} s, merges {merge} s"
    );
    let blocks = runtime.block_on(store.list_blocks()).unwrap();
    let level_of = |key: &str| blocks.iter().find(|b| b.object_key == key).map(|b| b.level);
    assert_eq!(level_of(&other_segment), Some(1), "{blocks:?}");
    assert_eq!(
        compressed_as_their_level_says(&server, &runtime, &store, "UNCOMPRESSED"),
        [1, 2]
    );
    assert_eq!(answers(&server, start, end), before);
    let server = server.restart_with(no_compaction);
    assert_eq!(answers(&server, start, end), before);
}

/// Segments hold one dataset per service; compaction fetches each service's dataset by
/// its byte range, so it reads what was written about once, however many services share
/// a segment (it read a whole segment per service before: 20× here).
fn compaction_reads_each_segment_about_once(backend: Backend) {
    const SERVICES: usize = 20;
    let server = TestServer::start_on(backend, |config| {
        // Segments as the rounds make them, each acknowledged once written.
        config.wal = false;
        config.compaction.enabled = true;
        config.compaction.interval_ms = 20;
        config.compaction.grace_ms = 0;
        // Level 0 is due at three datasets per service; nothing above it is, so the
        // bytes read are level 0's alone.
        for (index, level) in config.compaction.levels.iter_mut().enumerate() {
            level.max_datasets = if index == 0 { 3 } else { 1_000 };
            level.max_age_ms = i64::MAX / 4;
        }
    });
    let profile = fixture("profefe-collector_cpu_1.prof");
    let base = 1_700_000_000;
    for round in 0..3 {
        std::thread::scope(|scope| {
            for service in 0..SERVICES {
                let (server, profile) = (&server, &profile);
                scope.spawn(move || {
                    let from = base + round * 60;
                    let (status, text) = server.post(
                        &format!("/ingest?name=svc{service}&format=pprof&from={from}"),
                        profile,
                    );
                    assert_eq!(status, 200, "{text}");
                });
            }
        });
        std::thread::sleep(Duration::from_millis(120)); // the next round, another segment
    }
    let (runtime, store) = server.open_metastore();
    wait_until("level 0 to be compacted", || {
        runtime
            .block_on(store.datasets_at_level(0))
            .unwrap()
            .is_empty()
    });
    let levels = compressed_as_their_level_says(&server, &runtime, &store, "SNAPPY");
    assert!(levels.iter().all(|&level| level == 1), "{levels:?}");
    let metrics = server.metrics();
    let written = metric_value(&metrics, "kiln_ingest_segment_bytes_total");
    let read = metric_value(&metrics, "kiln_compaction_input_bytes_total");
    let segments = metric_value(&metrics, "kiln_ingest_flushes_total");
    assert!(segments >= 3.0, "{segments} segments");
    println!(
        "compaction read {read} bytes of {written} segment bytes ({:.3}×)",
        read / written
    );
    assert!(
        read <= 1.2 * written,
        "compaction read {read} bytes of {written} written ({:.2}×)",
        read / written
    );
    assert!(
        read >= 0.5 * written,
        "read {read} of {written}: not everything was compacted"
    );
    // Every dataset of every segment is merged: no segment's footer is kept for later.
    assert_eq!(
        metric_value(&metrics, "kiln_compaction_tail_cache_bytes"),
        0.0,
        "footers kept after their segments were merged away"
    );
    // Every service's profiles are all still there.
    for service in 0..SERVICES {
        let query = format!(
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds%7Bservice_name%3D%22svc{service}%22%7D"
        );
        let answer = server.json(
            &format!("/pyroscope/render?query={query}&from=0&until=now"),
            &[],
        );
        assert_eq!(
            answer["flamebearer"]["numTicks"].as_i64(),
            Some(3 * pprof_total(&profile, 1)),
            "svc{service}"
        );
    }
}

/// Checks that every live block is compressed as the default policy of its level says
/// (level 1, which the next level merges again soon, snappy, or as `level_1` says where
/// its datasets were copied or promoted from segments, whose pages they keep; the levels
/// above zstd, but for their small chunks), and returns their levels.
fn compressed_as_their_level_says(
    server: &TestServer,
    runtime: &tokio::runtime::Runtime,
    store: &kiln_metastore::Metastore,
    level_1: &str,
) -> Vec<u32> {
    let mut levels = Vec::new();
    for block in runtime.block_on(store.list_blocks()).unwrap() {
        if block.deleted_at_ms.is_some() || block.level == 0 {
            continue;
        }
        let bytes = server.read_object(&block.object_key);
        let codecs = kiln_storage::format::block_compression(&bytes).unwrap();
        match block.level {
            1 => assert_eq!(codecs, [level_1], "level 1"),
            // zstd, and none on chunks too small to gain from it (`SMALL_CHUNK_BYTES`).
            level => assert_eq!(codecs, ["UNCOMPRESSED", "ZSTD"], "level {level}"),
        }
        levels.push(block.level);
    }
    levels.sort();
    levels
}

/// Datasets the server aggregated from their stack sums since it started.
fn summed_datasets(server: &TestServer) -> f64 {
    server.counter(r#"kiln_query_datasets_aggregated_total{source="stack_sums"}"#)
}

/// Every answer a client could ask of this data, in canonical form.
fn answers(server: &TestServer, start: i64, end: i64) -> Vec<String> {
    let mut out = Vec::new();
    let post = |method: &str, body: Vec<u8>| -> Vec<u8> {
        let (status, bytes) = server.post_bytes(
            &format!("/querier.v1.QuerierService/{method}"),
            &body,
            &[("Content-Type", "application/proto")],
        );
        assert_eq!(status, 200, "{method}: {}", String::from_utf8_lossy(&bytes));
        bytes
    };
    let types = api::ProfileTypesResponse::decode(
        post(
            "ProfileTypes",
            api::ProfileTypesRequest { start, end }.encode_to_vec(),
        )
        .as_slice(),
    )
    .unwrap();
    assert!(types.profile_types.len() >= 4);
    for profile_type in &types.profile_types {
        for selector in [
            "{}",
            r#"{service_name="api"}"#,
            r#"{service_name="web", instance="b"}"#,
        ] {
            let request = api::SelectMergeStacktracesRequest {
                profile_type_id: profile_type.id.clone(),
                label_selector: selector.to_string(),
                start,
                end,
                max_nodes: Some(-1),
                format: api::PROFILE_FORMAT_TREE,
                ..Default::default()
            };
            let tree = post("SelectMergeStacktraces", request.encode_to_vec());
            let response = api::SelectMergeStacktracesResponse::decode(tree.as_slice()).unwrap();
            out.push(format!(
                "{} {selector} tree {:?}",
                profile_type.id,
                canonical_tree(&response.tree)
            ));
            let pprof = post(
                "SelectMergeProfile",
                api::SelectMergeProfileRequest {
                    profile_type_id: profile_type.id.clone(),
                    label_selector: selector.to_string(),
                    start,
                    end,
                    ..Default::default()
                }
                .encode_to_vec(),
            );
            let profile = kiln_model::pprof::decode(&pprof, 1 << 30).unwrap();
            let total: i64 = profile.sample.iter().map(|s| s.value[0]).sum();
            out.push(format!(
                "{} {selector} pprof total {total} samples {}",
                profile_type.id,
                profile.sample.len()
            ));
            let series = api::SelectSeriesResponse::decode(
                post(
                    "SelectSeries",
                    api::SelectSeriesRequest {
                        profile_type_id: profile_type.id.clone(),
                        label_selector: selector.to_string(),
                        start,
                        end,
                        step: 60.0,
                        group_by: vec!["instance".into()],
                        exemplar_type: api::EXEMPLAR_TYPE_INDIVIDUAL,
                        ..Default::default()
                    }
                    .encode_to_vec(),
                )
                .as_slice(),
            )
            .unwrap();
            out.push(format!("{} {selector} series {series:?}", profile_type.id));
        }
    }
    let series = api::SeriesResponse::decode(
        post(
            "Series",
            api::SeriesRequest {
                start,
                end,
                ..Default::default()
            }
            .encode_to_vec(),
        )
        .as_slice(),
    )
    .unwrap();
    out.push(format!("series sets {:?}", series.labels_set));
    out
}

/// Tree bytes as sorted (path, self) pairs: child order is not part of the answer.
fn canonical_tree(bytes: &[u8]) -> Vec<(String, i64)> {
    let mut nodes: Vec<(String, i64)> = kiln_query::merge::read_tree_bytes(bytes)
        .expect("tree")
        .into_iter()
        .map(|(path, value)| (path.join(";"), value))
        .collect();
    nodes.sort();
    nodes
}

/// Posts `pprof` to `/ingest` as `name` (with its `{labels}`) for the ten seconds from
/// `from`, and asserts it was acknowledged.
fn post_pprof(server: &TestServer, name: &str, from: i64, pprof: &[u8]) {
    let (status, text) = server.post(
        &format!(
            "/ingest?name={name}&format=pprof&from={from}&until={}",
            from + 10
        ),
        pprof,
    );
    assert_eq!(status, 200, "{text}");
}

/// [`kiln_testkit::wait_until`] for up to a minute.
fn wait_until(what: &str, done: impl FnMut() -> bool) {
    kiln_testkit::wait_until(what, Duration::from_secs(60), done);
}

fn compaction_changes_no_answer_and_leaves_one_block_per_service(backend: Backend) {
    let server = TestServer::start_on(backend, writes_sent_together_share_a_segment);
    let base = 1_700_000_000;
    // A round is sent at once, so it is one flush (segment) holding both services: level 0
    // then has datasets to merge, not segments of one dataset to raise as they are.
    let post_round = |server: &TestServer, round: i64| {
        let segments = server.object_keys().len();
        std::thread::scope(|scope| {
            for (index, name) in FIXTURES.iter().enumerate() {
                for (service, instance) in [("api", "a"), ("web", "b")] {
                    let from = base + round * 60 + index as i64;
                    let name_and_labels = format!("{service}{{instance={instance}}}");
                    scope.spawn(move || post_pprof(server, &name_and_labels, from, &fixture(name)));
                }
            }
        });
        assert_eq!(
            server.object_keys().len(),
            segments + 1,
            "round {round} in one segment"
        );
    };
    for round in 0..3 {
        post_round(&server, round);
    }
    let (start, end) = ((base - 10) * 1000, (base + 600) * 1000);
    let before = answers(&server, start, end);
    // Segments carry no stack sums: every answer came from the samples.
    assert_eq!(summed_datasets(&server), 0.0);
    let (runtime, store) = server.open_metastore();
    let segments_before = runtime.block_on(store.datasets_at_level(0)).unwrap().len();
    assert!(segments_before >= 6, "{segments_before} level-0 datasets");
    drop(store);

    // Every live block is at `level`, one per service, and nothing else is stored.
    let one_block_per_service_at = |server: &TestServer, level: u32| {
        let (runtime, store) = server.open_metastore();
        wait_until(&format!("one block per service at level {level}"), || {
            let blocks = runtime.block_on(store.list_blocks()).unwrap();
            blocks.len() == 2
                && blocks
                    .iter()
                    .all(|b| b.deleted_at_ms.is_none() && b.level == level)
        });
        let files = server.object_keys();
        assert_eq!(files.len(), 2, "objects left: {files:?}");
        assert!(files.iter().all(|f| f.starts_with("blocks/")), "{files:?}");
        assert_eq!(
            compressed_as_their_level_says(server, &runtime, &store, "SNAPPY"),
            [level, level]
        );
    };
    let server = server.restart_with(eager_compaction);
    // All of a service's segments merge at once into one level-1 block each, which,
    // alone in its window at every level, moves up to the top (level 3, the day's).
    let top = ServerConfig::default().compaction.levels.len() as u32;
    assert_eq!(top, 3, "the default levels");
    one_block_per_service_at(&server, top);
    let after = answers(&server, start, end);
    assert_eq!(before.len(), after.len());
    for (before, after) in before.iter().zip(&after) {
        assert_eq!(before, after);
    }
    // The compacted blocks answered the whole-range queries from their stack sums.
    assert!(
        summed_datasets(&server) > 0.0,
        "no answer used the stack sums"
    );
    // And they still are after a restart.
    let server = server.restart_with(writes_sent_together_share_a_segment);
    assert_eq!(answers(&server, start, end), before);

    // One more round: it moves up on its own and, at the top, is merged into the day's
    // block there, and the answers are those of all four rounds.
    post_round(&server, 3);
    let before = answers(&server, start, end);
    let server = server.restart_with(eager_compaction);
    one_block_per_service_at(&server, top);
    assert_eq!(answers(&server, start, end), before);
}

fn retention_removes_only_what_is_older_than_the_window(backend: Backend) {
    let server = TestServer::start_on(backend, no_compaction);
    let now = kiln_model::time::now_nanos() / 1_000_000_000;
    let day = 86_400;
    let profile = fixture("profefe-collector_cpu_1.prof");
    // One profile 40 days old, one 20 days old, one from now; two services.
    for (service, age_days) in [("old", 40), ("mid", 20), ("new", 0)] {
        let from = now - age_days * day - 60;
        post_pprof(&server, service, from, &profile);
        std::thread::sleep(Duration::from_millis(120));
    }
    let (start, end) = ((now - 60 * day) * 1000, (now + 60) * 1000);
    let total = |server: &TestServer, service: &str| -> i64 {
        let request = api::SelectMergeStacktracesRequest {
            profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            label_selector: format!(r#"{{service_name="{service}"}}"#),
            start,
            end,
            ..Default::default()
        };
        let (status, bytes) = server.post_bytes(
            "/querier.v1.QuerierService/SelectMergeStacktraces",
            &request.encode_to_vec(),
            &[("Content-Type", "application/proto")],
        );
        assert_eq!(status, 200);
        api::SelectMergeStacktracesResponse::decode(bytes.as_slice())
            .unwrap()
            .flamegraph
            .map_or(0, |graph| graph.total)
    };
    let expected = pprof_total(&profile, 1);
    for service in ["old", "mid", "new"] {
        assert_eq!(
            total(&server, service),
            expected,
            "{service} before retention"
        );
    }
    let mid_before = answers_for(&server, "mid", start, end);
    // 31 days by default; no level ever due, so that only retention acts.
    let server = server.restart_with(|config| {
        config.limits.retention_days = 31;
        config.compaction.enabled = true;
        config.compaction.interval_ms = 20;
        // The default grace: with none, a query that listed the expired dataset could
        // find its object already deleted (a 503), which grace exists to prevent.
        for level in &mut config.compaction.levels {
            level.max_age_ms = i64::MAX;
            level.max_datasets = usize::MAX;
        }
    });
    wait_until("the 40-day-old profile to expire", || {
        total(&server, "old") == 0
    });
    // A profile already past retention is refused, not acknowledged and then deleted.
    let old = now - 40 * day;
    let (status, text) = server.post(
        &format!(
            "/ingest?name=late&format=pprof&from={old}&until={}",
            old + 10
        ),
        &profile,
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("retention"), "{text}");
    assert_eq!(total(&server, "mid"), expected);
    assert_eq!(total(&server, "new"), expected);
    assert_eq!(answers_for(&server, "mid", start, end), mid_before);
    // A tenant-specific retention of 10 days takes "mid" too, and nothing else.
    let server = server.restart_with(|config| {
        config.compaction.interval_ms = 20;
        config.limits.retention_days = 31;
        let mut tenant = config.limits;
        tenant.retention_days = 10;
        config.tenant_limits.insert("anonymous".into(), tenant);
    });
    wait_until("the 20-day-old profile to expire", || {
        total(&server, "mid") == 0
    });
    assert_eq!(total(&server, "new"), expected);
}

/// The full tree of one service's CPU profiles.
fn answers_for(server: &TestServer, service: &str, start: i64, end: i64) -> Vec<(String, i64)> {
    let request = api::SelectMergeStacktracesRequest {
        profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
        label_selector: format!(r#"{{service_name="{service}"}}"#),
        start,
        end,
        max_nodes: Some(-1),
        format: api::PROFILE_FORMAT_TREE,
        ..Default::default()
    };
    let (_, bytes) = server.post_bytes(
        "/querier.v1.QuerierService/SelectMergeStacktraces",
        &request.encode_to_vec(),
        &[("Content-Type", "application/proto")],
    );
    canonical_tree(
        &api::SelectMergeStacktracesResponse::decode(bytes.as_slice())
            .unwrap()
            .tree,
    )
}

#[test]
fn admin_blocks_shows_levels_and_symbol_counts() {
    let server = TestServer::start_with(no_compaction);
    for service in ["api", "web"] {
        let (status, text) = server.post(
            &format!("/ingest?name={service}&format=pprof&from=1700000000&until=1700000010"),
            &fixture("profefe-collector_cpu_1.prof"),
        );
        assert_eq!(status, 200, "{text}");
    }
    // A read flushes what the write-ahead log acknowledged; the admin tool reads the
    // metastore as it is.
    assert_eq!(
        server.json("/api/0/services", &[])["body"],
        serde_json::json!(["api", "web"])
    );
    let data_dir = server.data_dir().to_path_buf();
    let data_dir = data_dir.to_string_lossy().into_owned();
    let admin = |args: &[&str]| -> String {
        run_kiln(
            ["admin", "--data-dir", data_dir.as_str()]
                .iter()
                .chain(args),
        )
    };
    let list = admin(&["blocks", "list"]);
    let rows: Vec<&str> = list.lines().filter(|line| line.ends_with("live")).collect();
    assert!(!rows.is_empty(), "{list}");
    assert!(
        list.contains("2023-11-14T22:13:20"),
        "time range shown: {list}"
    );
    let id = rows[0].split_whitespace().next().unwrap();
    let inspect = admin(&["blocks", "inspect", id]);
    // No compaction: a segment, uncompressed.
    assert!(
        inspect.contains("\ncompression UNCOMPRESSED\n"),
        "{inspect}"
    );
    assert!(
        inspect.contains("service api") || inspect.contains("service web"),
        "{inspect}"
    );
    assert!(
        inspect.contains("functions") && inspect.contains("stack nodes"),
        "{inspect}"
    );
    // Where its bytes go, from the footer: a segment's symbols are a real share of it.
    let stored = inspect
        .lines()
        .find_map(|line| line.trim().strip_prefix("bytes stored: symbols "))
        .and_then(|rest| rest.split_once("  profiles and samples "))
        .and_then(|(symbols, rest)| Some((symbols.parse::<u64>().ok()?, rest.parse::<u64>().ok()?)))
        .unwrap_or_else(|| panic!("no bytes stored line: {inspect}"));
    assert!(stored.0 > 1_000 && stored.1 > 100, "{stored:?}");
    assert!(
        inspect.contains("type process_cpu:cpu:nanoseconds:cpu:nanoseconds"),
        "{inspect}"
    );
}

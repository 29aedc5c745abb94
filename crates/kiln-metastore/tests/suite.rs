//! The metastore's contract, run by one macro against every backend: embedded SQLite
//! and a real PostgreSQL server on loopback (skipped, saying so, when it cannot be
//! started). Migrations, the time-overlap lookup, tenant and service scoping,
//! all-or-nothing registration, compaction swaps, leases and retention, and the races
//! between concurrent writers that a shared metastore must settle.

use kiln_metastore::{
    BlockMeta, DatasetMeta, DatasetQuery, DatasetRef, Exports, LeaseKey, LevelBacklog, Metastore,
    MetastoreError, NodeRecord, NodeState, OutboxSample, RegressionRecord, RuleRecord, RuleSample,
    SegmentCounting, VersionCheck, WriteIdentity,
};

fn sample(series: &str, step_start_ms: i64, value: i64) -> RuleSample {
    RuleSample {
        tenant: "t".into(),
        rule: "cpu".into(),
        series: series.into(),
        step_start_ms,
        step_ms: 15_000,
        value,
    }
}

fn exports(targets: &[&str], samples: Vec<RuleSample>) -> Exports {
    Exports {
        targets: targets.iter().map(|t| t.to_string()).collect(),
        samples,
    }
}

/// (series, ts, value) of claimed rows, for comparing.
fn rows(samples: &[OutboxSample]) -> Vec<(String, i64, i64)> {
    samples
        .iter()
        .map(|s| (s.series.clone(), s.ts_ms, s.value))
        .collect()
}

/// Everything in `target`'s outbox, claimed.
async fn claim_all(metastore: &Metastore, target: &str) -> Vec<(String, i64, i64)> {
    rows(
        &metastore
            .claim_exports(target, i64::MAX, 100)
            .await
            .unwrap(),
    )
}

fn block(id: &str) -> BlockMeta {
    BlockMeta {
        id: id.to_string(),
        object_key: format!("segments/{id}.parquet"),
        level: 0,
        size_bytes: 1234,
        created_at_ms: 1,
        deleted_at_ms: None,
    }
}

fn dataset(
    block: &str,
    row_group: u32,
    tenant: &str,
    service: &str,
    from: i64,
    to: i64,
) -> DatasetMeta {
    DatasetMeta {
        block_id: block.to_string(),
        object_key: format!("segments/{block}.parquet"),
        tenant: tenant.to_string(),
        service: service.to_string(),
        row_group,
        min_time_nanos: from,
        max_time_nanos: to,
        profile_types: vec![
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            "memory:alloc_space:bytes:space:bytes".into(),
        ],
        profile_count: 3,
        rules_counted: false,
    }
}

/// Swaps `dataset` for the same dataset in a new level-1 block `into`, as a copy does.
async fn move_to_level_1(metastore: &Metastore, dataset: DatasetMeta, into: &str) {
    let reference = dataset.reference();
    let moved = DatasetMeta {
        block_id: into.to_string(),
        object_key: format!("segments/{into}.parquet"),
        row_group: 0,
        ..dataset
    };
    metastore
        .replace_datasets(
            level(block(into), 1),
            vec![moved],
            vec![reference],
            Exports::default(),
        )
        .await
        .unwrap();
}

/// A level-0 segment `id` holding tenant t's services api and web, both over [10, 20].
async fn register_api_and_web(metastore: &Metastore, id: &str) {
    metastore
        .register_block(
            block(id),
            vec![
                dataset(id, 0, "t", "api", 10, 20),
                dataset(id, 1, "t", "web", 10, 20),
            ],
        )
        .await
        .unwrap();
}

fn query(tenant: &str, service: Option<&str>, from: i64, to: i64) -> DatasetQuery {
    DatasetQuery {
        tenant: tenant.to_string(),
        service: service.map(str::to_string),
        from_nanos: from,
        to_nanos: to,
    }
}

fn level(mut meta: BlockMeta, level: u32) -> BlockMeta {
    meta.level = level;
    meta
}

/// Puts the metastore at `url` back at schema version 8, whose write identities were
/// hex text, holding `identities`: what an upgrade from it finds.
async fn as_version_8(url: &str, identities: &[(&str, i64)]) {
    const VERSION_8: &str = "DELETE FROM schema_migrations WHERE version = 9;
         DROP TABLE write_identities;
         CREATE TABLE write_identities (identity TEXT PRIMARY KEY, expires_at_ms BIGINT NOT NULL);
         CREATE INDEX write_identities_by_expiry ON write_identities (expires_at_ms);";
    if let Some(path) = url.strip_prefix("sqlite://") {
        let connection = rusqlite::Connection::open(path).unwrap();
        connection.execute_batch(VERSION_8).unwrap();
        for (identity, expires_at_ms) in identities {
            connection
                .execute(
                    "INSERT INTO write_identities VALUES (?1, ?2)",
                    rusqlite::params![identity, expires_at_ms],
                )
                .unwrap();
        }
    } else {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        let connection = tokio::spawn(connection);
        client.batch_execute(VERSION_8).await.unwrap();
        for (identity, expires_at_ms) in identities {
            client
                .execute(
                    "INSERT INTO write_identities VALUES ($1, $2)",
                    &[identity, expires_at_ms],
                )
                .await
                .unwrap();
        }
        drop(client);
        connection.await.unwrap().unwrap();
    }
}

/// One backend's metastore for one test, and what keeps it alive.
struct Fixture {
    url: String,
    metastore: Metastore,
    _dir: Option<tempfile::TempDir>,
}

async fn sqlite() -> Option<Fixture> {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    Some(Fixture {
        metastore: Metastore::open(&url).await.unwrap(),
        url,
        _dir: Some(dir),
    })
}

async fn postgres() -> Option<Fixture> {
    let server = match kiln_testkit::postgres() {
        Ok(server) => server,
        Err(reason) => {
            println!("skipped: {reason}");
            return None;
        }
    };
    let url = server.fresh_database();
    Some(Fixture {
        metastore: Metastore::open(&url).await.unwrap(),
        url,
        _dir: None,
    })
}

macro_rules! metastore_suite {
    ($backend:ident) => {
        mod $backend {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn migrations_run_once_and_lookups_respect_time_tenant_and_service() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let url = fixture.url.clone();
                let metastore = fixture.metastore.clone();
                assert_eq!(metastore.schema_version().await.unwrap(), 9);
                metastore
                    .register_block(
                        block("b1"),
                        vec![
                            dataset("b1", 0, "t1", "api", 10, 20),
                            dataset("b1", 1, "t2", "api", 10, 20),
                        ],
                    )
                    .await
                    .unwrap();
                // Reopening applies no migration twice and keeps the data.
                drop(metastore);
                let metastore = Metastore::open(&url).await.unwrap();
                assert_eq!(metastore.schema_version().await.unwrap(), 9);
                assert_eq!(metastore.list_blocks().await.unwrap(), vec![block("b1")]);

                let found = metastore
                    .list_datasets(query("t1", None, 0, 100))
                    .await
                    .unwrap();
                assert_eq!(found, vec![dataset("b1", 0, "t1", "api", 10, 20)]);
                // Inclusive overlap at both ends, nothing outside.
                assert_eq!(
                    metastore
                        .list_datasets(query("t1", None, 20, 30))
                        .await
                        .unwrap()
                        .len(),
                    1
                );
                assert_eq!(
                    metastore
                        .list_datasets(query("t1", None, 0, 10))
                        .await
                        .unwrap()
                        .len(),
                    1
                );
                assert_eq!(
                    metastore
                        .list_datasets(query("t1", None, 15, 15))
                        .await
                        .unwrap()
                        .len(),
                    1
                );
                assert!(metastore
                    .list_datasets(query("t1", None, 21, 30))
                    .await
                    .unwrap()
                    .is_empty());
                assert!(metastore
                    .list_datasets(query("t1", None, 0, 9))
                    .await
                    .unwrap()
                    .is_empty());
                assert!(metastore
                    .list_datasets(query("t1", Some("web"), 0, 100))
                    .await
                    .unwrap()
                    .is_empty());
                assert!(metastore
                    .list_datasets(query("t3", None, 0, 100))
                    .await
                    .unwrap()
                    .is_empty());
                assert_eq!(
                    metastore.services("t2", 0, 100).await.unwrap(),
                    vec!["api".to_string()]
                );
                assert!(metastore.services("t2", 30, 100).await.unwrap().is_empty());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_failed_registration_leaves_nothing_behind() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = fixture.metastore.clone();
                // The second dataset repeats the first one's row group: the whole transaction fails.
                let result = metastore
                    .register_block(
                        block("bad"),
                        vec![
                            dataset("bad", 0, "t", "a", 1, 2),
                            dataset("bad", 0, "t", "b", 1, 2),
                        ],
                    )
                    .await;
                assert!(result.is_err());
                assert!(metastore.list_blocks().await.unwrap().is_empty());
                assert!(metastore
                    .list_datasets(query("t", None, 0, 10))
                    .await
                    .unwrap()
                    .is_empty());
            }

            /// The write path registers a segment from the thread that wrote it, off the
            /// runtime: the same rows, all or nothing, as the async registration.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_registration_off_the_runtime_commits_as_the_async_one_does() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = fixture.metastore.clone();
                let runtime = tokio::runtime::Handle::current();
                let registering = metastore.clone();
                let good = vec![
                    dataset("b1", 0, "t", "api", 10, 20),
                    dataset("b1", 1, "t", "web", 15, 25),
                ];
                // A repeated row group fails the whole transaction.
                let bad = vec![
                    dataset("bad", 0, "t", "a", 1, 2),
                    dataset("bad", 0, "t", "b", 1, 2),
                ];
                let registered = std::thread::spawn(move || {
                    let register = |id: &str, datasets| {
                        registering.register_block_blocking(
                            &runtime,
                            block(id),
                            datasets,
                            Vec::new(),
                            None,
                        )
                    };
                    (register("b1", good), register("bad", bad))
                });
                let (good, bad) = tokio::task::spawn_blocking(move || registered.join().unwrap())
                    .await
                    .unwrap();
                good.unwrap();
                assert!(bad.is_err(), "a repeated row group must fail");
                assert_eq!(metastore.list_blocks().await.unwrap(), vec![block("b1")]);
                assert_eq!(
                    metastore
                        .list_datasets(query("t", None, 0, 100))
                        .await
                        .unwrap(),
                    vec![
                        dataset("b1", 0, "t", "api", 10, 20),
                        dataset("b1", 1, "t", "web", 15, 25),
                    ]
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn write_identities_are_registered_with_their_segment_and_expire() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = fixture.metastore.clone();
                // 32 hex digits, as kiln_ingest's are; "bb…" sets the high bits.
                let identity = |name: &str, expires_at_ms| WriteIdentity {
                    identity: name.repeat(16),
                    expires_at_ms,
                };
                metastore
                    .register_segment(
                        BlockMeta {
                            created_at_ms: 100,
                            ..block("i1")
                        },
                        vec![dataset("i1", 0, "t", "api", 10, 20)],
                        vec![identity("aa", 150), identity("bb", 500)],
                        None,
                    )
                    .await
                    .unwrap();
                let mut listed = metastore.write_identities(120).await.unwrap();
                listed.sort_by(|a, b| a.identity.cmp(&b.identity));
                assert_eq!(listed, vec![identity("aa", 150), identity("bb", 500)]);
                assert_eq!(
                    metastore.write_identities(200).await.unwrap(),
                    vec![identity("bb", 500)]
                );
                // A registration whose block id exists already fails whole: no identity.
                let again = metastore
                    .register_segment(block("i1"), vec![], vec![identity("cc", 900)], None)
                    .await;
                assert!(again.is_err());
                assert!(!metastore
                    .write_identities(0)
                    .await
                    .unwrap()
                    .iter()
                    .any(|listed| listed.identity == "cc".repeat(16)));
                // A later registration deletes what expired before its time, and an
                // identity written again takes the later expiry.
                metastore
                    .register_segment(
                        BlockMeta {
                            created_at_ms: 200,
                            ..block("i2")
                        },
                        vec![dataset("i2", 0, "t", "api", 10, 20)],
                        vec![identity("bb", 800)],
                        None,
                    )
                    .await
                    .unwrap();
                assert_eq!(
                    metastore.write_identities(0).await.unwrap(),
                    vec![identity("bb", 800)]
                );
                // What is not 32 hex digits is not stored, and the segment still is.
                metastore
                    .register_segment(
                        BlockMeta {
                            created_at_ms: 300,
                            ..block("i3")
                        },
                        vec![dataset("i3", 0, "t", "api", 10, 20)],
                        vec![identity("zz", 900), identity("0A", 900)],
                        None,
                    )
                    .await
                    .unwrap();
                let mut listed = metastore.write_identities(0).await.unwrap();
                listed.sort_by_key(|listed| listed.expires_at_ms);
                assert_eq!(listed, vec![identity("bb", 800), identity("0a", 900)]);
                assert_eq!(metastore.list_blocks().await.unwrap().len(), 3);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn write_identities_stored_as_text_survive_the_upgrade() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let url = fixture.url.clone();
                drop(fixture.metastore);
                let high = "ffffffffffffffff0000000000000001";
                let mixed = "8000000000000000ABCDEF0123456789";
                as_version_8(&url, &[(high, 500), (mixed, 700), ("not hex", 900)]).await;
                let metastore = Metastore::open(&url).await.unwrap();
                assert_eq!(metastore.schema_version().await.unwrap(), 9);
                let mut listed = metastore.write_identities(0).await.unwrap();
                listed.sort_by_key(|listed| listed.expires_at_ms);
                assert_eq!(
                    listed,
                    vec![
                        WriteIdentity {
                            identity: high.to_string(),
                            expires_at_ms: 500
                        },
                        WriteIdentity {
                            identity: mixed.to_lowercase(),
                            expires_at_ms: 700
                        },
                    ]
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_compaction_swap_is_all_or_nothing_and_tombstones_emptied_blocks() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = fixture.metastore.clone();
                assert_eq!(
                    metastore.level_backlog(0).await.unwrap(),
                    LevelBacklog::default()
                );
                // Two segments; s1 holds two services, s2 one.
                register_api_and_web(&metastore, "s1").await;
                metastore
                    .register_block(block("s2"), vec![dataset("s2", 0, "t", "api", 30, 40)])
                    .await
                    .unwrap();
                let at_zero = metastore.datasets_at_level(0).await.unwrap();
                assert_eq!(at_zero.len(), 3);
                metastore
                    .register_block(
                        BlockMeta {
                            created_at_ms: 9,
                            ..block("s3")
                        },
                        vec![dataset("s3", 0, "t", "db", 30, 40)],
                    )
                    .await
                    .unwrap();
                // Each dataset comes with its block's creation time, which makes it due:
                // read from the wrong column, every dataset looked due at every level
                // and one pass merged each segment through all of them.
                let created: Vec<(String, i64)> = metastore
                    .datasets_at_level(0)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|(dataset, created)| (dataset.block_id, created))
                    .collect();
                assert_eq!(
                    created,
                    [("s1", 1), ("s2", 1), ("s3", 9), ("s1", 1)]
                        .map(|(id, at)| (id.to_string(), at))
                );
                // Datasets are counted, and their blocks' times averaged per dataset:
                // (1 + 1 + 1 + 9) / 4 (a whole number: SQLite truncates, PostgreSQL rounds).
                assert_eq!(
                    metastore.level_backlog(0).await.unwrap(),
                    LevelBacklog {
                        datasets: 4,
                        mean_created_at_ms: Some(3),
                    }
                );

                // Compact api's two datasets into c1.
                metastore
                    .replace_datasets(
                        level(block("c1"), 1),
                        vec![dataset("c1", 0, "t", "api", 10, 40)],
                        vec![
                            dataset("s1", 0, "t", "api", 10, 20).reference(),
                            dataset("s2", 0, "t", "api", 30, 40).reference(),
                        ],
                        Exports::default(),
                    )
                    .await
                    .unwrap();
                let api = metastore
                    .list_datasets(query("t", Some("api"), 0, 100))
                    .await
                    .unwrap();
                assert_eq!(api, vec![dataset("c1", 0, "t", "api", 10, 40)]);
                // s2 is empty now and tombstoned as of c1's creation (the compactor's
                // clock, which its grace period is read by); s1 still holds web.
                let blocks = metastore.list_blocks().await.unwrap();
                let state = |id: &str| blocks.iter().find(|b| b.id == id).unwrap().deleted_at_ms;
                assert_eq!(state("s2"), Some(block("c1").created_at_ms));
                assert!(state("s1").is_none());
                assert!(state("c1").is_none());
                // Garbage collection asks for the tombstoned blocks alone, by time.
                let at = state("s2").unwrap();
                let ids = |blocks: Vec<BlockMeta>| -> Vec<String> {
                    blocks.into_iter().map(|b| b.id).collect()
                };
                assert_eq!(ids(metastore.tombstoned_blocks(at).await.unwrap()), ["s2"]);
                assert_eq!(
                    ids(metastore.tombstoned_blocks(i64::MAX).await.unwrap()),
                    ["s2"]
                );
                assert!(metastore
                    .tombstoned_blocks(at - 1)
                    .await
                    .unwrap()
                    .is_empty());
                assert_eq!(metastore.datasets_at_level(1).await.unwrap().len(), 1);
                // s2 left the backlog; s1 (web still waits) and s3 did not.
                assert_eq!(
                    metastore.level_backlog(0).await.unwrap(),
                    LevelBacklog {
                        datasets: 2,
                        mean_created_at_ms: Some(5),
                    }
                );
                assert_eq!(
                    metastore.level_backlog(1).await.unwrap(),
                    LevelBacklog {
                        datasets: 1,
                        mean_created_at_ms: Some(1),
                    }
                );

                // A second compactor with the same, now stale, inputs changes nothing.
                let stale = metastore
                    .replace_datasets(
                        level(block("c2"), 1),
                        vec![dataset("c2", 0, "t", "api", 10, 40)],
                        vec![
                            dataset("s1", 1, "t", "web", 10, 20).reference(),
                            dataset("s2", 0, "t", "api", 30, 40).reference(),
                        ],
                        Exports::default(),
                    )
                    .await;
                assert!(matches!(
                    stale,
                    Err(kiln_metastore::MetastoreError::Conflict(_))
                ));
                assert!(metastore
                    .list_blocks()
                    .await
                    .unwrap()
                    .iter()
                    .all(|b| b.id != "c2"));
                assert_eq!(
                    metastore
                        .list_datasets(query("t", Some("web"), 0, 100))
                        .await
                        .unwrap()
                        .len(),
                    1,
                    "the rolled-back swap kept web's dataset"
                );

                // Tombstoned blocks can be forgotten; live ones cannot.
                metastore.delete_block("s2").await.unwrap();
                metastore.delete_block("s1").await.unwrap();
                let ids: Vec<String> = metastore
                    .list_blocks()
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|b| b.id)
                    .collect();
                assert_eq!(ids, vec!["c1", "s1", "s3"]);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn only_live_blocks_holding_the_datasets_seen_are_promoted_in_place() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = fixture.metastore.clone();
                // s1 and s4 hold two services, s2 and s3 one each; s3's is then merged
                // away, which tombstones s3; c1 is already at level 1.
                register_api_and_web(&metastore, "s1").await;
                register_api_and_web(&metastore, "s4").await;
                for id in ["s2", "s3"] {
                    metastore
                        .register_block(block(id), vec![dataset(id, 0, "t", "db", 30, 40)])
                        .await
                        .unwrap();
                }
                move_to_level_1(&metastore, dataset("s3", 0, "t", "db", 30, 40), "c1").await;
                let ids = |ids: &[&str]| ids.iter().map(|id| id.to_string()).collect::<Vec<_>>();
                let seen = |blocks: &[(&str, u32)]| {
                    blocks
                        .iter()
                        .map(|(id, count)| (id.to_string(), *count))
                        .collect::<Vec<_>>()
                };
                // s1 is not as seen (one dataset, where it holds two); s4 is.
                let promoted = metastore
                    .promote_blocks(
                        seen(&[
                            ("s1", 1),
                            ("s2", 1),
                            ("s3", 1),
                            ("c1", 1),
                            ("absent", 1),
                            ("s4", 2),
                        ]),
                        0,
                        1_000,
                    )
                    .await
                    .unwrap();
                assert_eq!(promoted, ids(&["s2", "s4"]));
                let blocks = metastore.list_blocks().await.unwrap();
                let of = |id: &str| blocks.iter().find(|b| b.id == id).unwrap().clone();
                let s2 = of("s2");
                assert_eq!(
                    (s2.level, s2.object_key.as_str(), s2.deleted_at_ms),
                    (1, "segments/s2.parquet", None)
                );
                assert_eq!(
                    s2.created_at_ms, 1_000,
                    "a promoted block's age starts again"
                );
                assert_eq!((of("s1").level, of("s3").level, of("c1").level), (0, 0, 1));
                // The dataset is where it was, and counted at its new level only.
                let at_one: Vec<DatasetMeta> = metastore
                    .datasets_at_level(1)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|(dataset, _)| dataset)
                    .collect();
                assert!(
                    at_one.contains(&dataset("s2", 0, "t", "db", 30, 40)),
                    "{at_one:?}"
                );
                assert!(
                    at_one.contains(&dataset("s4", 0, "t", "api", 10, 20))
                        && at_one.contains(&dataset("s4", 1, "t", "web", 10, 20)),
                    "a block of two services is raised with both: {at_one:?}"
                );
                assert_eq!(metastore.level_backlog(0).await.unwrap().datasets, 2);
                assert_eq!(metastore.level_backlog(1).await.unwrap().datasets, 4);
                // Raised once: a second call (another compactor's) changes nothing.
                assert!(metastore
                    .promote_blocks(seen(&[("s2", 1)]), 0, 2_000)
                    .await
                    .unwrap()
                    .is_empty());
                assert_eq!(
                    metastore
                        .promote_blocks(seen(&[("s2", 1)]), 1, 2_000)
                        .await
                        .unwrap(),
                    ids(&["s2"])
                );
                // Once one of s1's datasets is merged away, s1 holds one: raised as seen
                // with one, not as seen before with two.
                move_to_level_1(&metastore, dataset("s1", 0, "t", "api", 10, 20), "c2").await;
                assert!(metastore
                    .promote_blocks(seen(&[("s1", 2)]), 0, 2_000)
                    .await
                    .unwrap()
                    .is_empty());
                assert_eq!(
                    metastore
                        .promote_blocks(seen(&[("s1", 1)]), 0, 2_000)
                        .await
                        .unwrap(),
                    ids(&["s1"])
                );
                assert!(metastore
                    .promote_blocks(Vec::new(), 0, 2_000)
                    .await
                    .unwrap()
                    .is_empty());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn leases_are_exclusive_until_released_or_expired() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = fixture.metastore.clone();
                let group = kiln_metastore::LeaseKey {
                    tenant: "t".into(),
                    service: "api".into(),
                    level: 0,
                };
                assert!(metastore
                    .acquire_lease(group.clone(), "a", 60_000)
                    .await
                    .unwrap());
                assert!(!metastore
                    .acquire_lease(group.clone(), "b", 60_000)
                    .await
                    .unwrap());
                // The owner may renew; another group is free.
                assert!(metastore
                    .acquire_lease(group.clone(), "a", 60_000)
                    .await
                    .unwrap());
                let other = kiln_metastore::LeaseKey {
                    level: 1,
                    ..group.clone()
                };
                assert!(metastore.acquire_lease(other, "b", 60_000).await.unwrap());
                metastore.release_lease(group.clone(), "b").await.unwrap(); // not b's: no effect
                assert!(!metastore
                    .acquire_lease(group.clone(), "b", 60_000)
                    .await
                    .unwrap());
                metastore.release_lease(group.clone(), "a").await.unwrap();
                assert!(metastore
                    .acquire_lease(group.clone(), "b", -1)
                    .await
                    .unwrap());
                // b's lease expired at once: a takes over.
                assert!(metastore.acquire_lease(group, "a", 60_000).await.unwrap());
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn retention_removes_only_what_ended_before_the_cutoff() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = fixture.metastore.clone();
                metastore
                    .register_block(
                        block("old"),
                        vec![
                            dataset("old", 0, "t", "api", 10, 20),
                            dataset("old", 1, "other", "api", 10, 20),
                        ],
                    )
                    .await
                    .unwrap();
                metastore
                    .register_block(block("edge"), vec![dataset("edge", 0, "t", "api", 20, 50)])
                    .await
                    .unwrap();
                assert_eq!(metastore.tenants().await.unwrap(), vec!["other", "t"]);
                // Cutoff 21: "old" ended at 20 (gone); "edge" ends at 50 (kept, though it starts before).
                assert_eq!(metastore.expire_datasets("t", 21, 3_000).await.unwrap(), 1);
                let left = metastore
                    .list_datasets(query("t", None, 0, 100))
                    .await
                    .unwrap();
                assert_eq!(left, vec![dataset("edge", 0, "t", "api", 20, 50)]);
                // Another tenant's data in the same block is untouched, so the block stays live.
                assert_eq!(
                    metastore
                        .list_datasets(query("other", None, 0, 100))
                        .await
                        .unwrap()
                        .len(),
                    1
                );
                assert!(metastore
                    .list_blocks()
                    .await
                    .unwrap()
                    .iter()
                    .all(|b| b.deleted_at_ms.is_none()));
                assert_eq!(
                    metastore.expire_datasets("other", 21, 3_000).await.unwrap(),
                    1
                );
                let blocks = metastore.list_blocks().await.unwrap();
                let old = blocks.iter().find(|b| b.id == "old").unwrap();
                assert_eq!(
                    old.deleted_at_ms,
                    Some(3_000),
                    "tombstoned at the time given"
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_swaps_over_the_same_inputs_let_exactly_one_win() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = fixture.metastore.clone();
                for id in ["s1", "s2", "s3"] {
                    metastore
                        .register_block(block(id), vec![dataset(id, 0, "t", "api", 10, 20)])
                        .await
                        .unwrap();
                }
                let inputs: Vec<DatasetRef> = ["s1", "s2", "s3"]
                    .iter()
                    .map(|id| dataset(id, 0, "t", "api", 10, 20).reference())
                    .collect();
                let mut racers = Vec::new();
                for racer in 0..8 {
                    let metastore = metastore.clone();
                    let inputs = inputs.clone();
                    racers.push(tokio::spawn(async move {
                        let id = format!("c{racer}");
                        metastore
                            .replace_datasets(
                                level(block(&id), 1),
                                vec![dataset(&id, 0, "t", "api", 10, 20)],
                                inputs,
                                // Every racer would export the same profiles' samples.
                                exports(&["prom"], vec![sample("a", 0, 7)]),
                            )
                            .await
                    }));
                }
                let mut won = 0;
                for racer in racers {
                    match racer.await.unwrap() {
                        Ok(()) => won += 1,
                        Err(MetastoreError::Conflict(_)) => {}
                        Err(other) => panic!("unexpected error: {other}"),
                    }
                }
                assert_eq!(won, 1);
                assert_eq!(
                    claim_all(&metastore, "prom").await,
                    vec![("a".to_string(), 0, 7)],
                    "only the winning swap's samples were committed"
                );
                let live = metastore
                    .list_datasets(query("t", None, 0, 100))
                    .await
                    .unwrap();
                assert_eq!(live.len(), 1, "{live:?}");
                assert!(live[0].block_id.starts_with('c'));
                let blocks = metastore.list_blocks().await.unwrap();
                assert_eq!(
                    blocks.len(),
                    4,
                    "three tombstoned inputs and one output: {blocks:?}"
                );
                assert_eq!(
                    blocks.iter().filter(|b| b.deleted_at_ms.is_some()).count(),
                    3
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn rule_samples_add_up_until_claimed_then_late_ones_get_their_own_row() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = &fixture.metastore;
                let commit = |samples: Vec<RuleSample>, id: &str| {
                    let id = id.to_string();
                    async move {
                        metastore
                            .register_block(block(&format!("in-{id}")), vec![])
                            .await
                            .unwrap();
                        metastore
                            .replace_datasets(
                                level(block(&id), 1),
                                vec![],
                                vec![],
                                exports(&["prom", "metrics"], samples),
                            )
                            .await
                            .unwrap();
                    }
                };
                commit(vec![sample("a", 0, 5), sample("a", 15_000, 1)], "c1").await;
                // Same step, still pending: added.
                commit(vec![sample("a", 0, 3), sample("b", 0, 2)], "c2").await;
                assert_eq!(metastore.export_backlog("prom").await.unwrap(), 3);
                // Only what is due.
                let claimed = metastore.claim_exports("prom", 15_000, 100).await.unwrap();
                assert_eq!(
                    rows(&claimed),
                    vec![("a".to_string(), 0, 8), ("b".to_string(), 0, 2)]
                );
                // Claimed rows no longer change: late data for step 0 is a new row at +1 ms.
                commit(vec![sample("a", 0, 4)], "c3").await;
                // A sender that died before its ack: claimed rows come back, first.
                let again = metastore.claim_exports("prom", 15_000, 100).await.unwrap();
                assert_eq!(
                    rows(&again),
                    vec![
                        ("a".to_string(), 0, 8),
                        ("b".to_string(), 0, 2),
                        ("a".to_string(), 1, 4)
                    ]
                );
                metastore.ack_exports("prom", again).await.unwrap();
                commit(vec![sample("a", 0, 6)], "c4").await;
                let late = metastore.claim_exports("prom", 15_000, 100).await.unwrap();
                assert_eq!(rows(&late), vec![("a".to_string(), 2, 6)]);
                metastore.ack_exports("prom", late).await.unwrap();
                // The other target's outbox is its own: everything of step 0 still pending,
                // summed into one row.
                let metrics = metastore
                    .claim_exports("metrics", 15_000, 100)
                    .await
                    .unwrap();
                assert_eq!(
                    rows(&metrics),
                    vec![("a".to_string(), 0, 18), ("b".to_string(), 0, 2)]
                );
                assert_eq!(metastore.export_backlog("prom").await.unwrap(), 1);
                // Pruning removes only delivered rows.
                assert_eq!(metastore.prune_exports(15_000).await.unwrap(), 4);
                assert_eq!(metastore.export_backlog("prom").await.unwrap(), 1);
                assert_eq!(metastore.export_backlog("metrics").await.unwrap(), 3);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_segment_is_counted_once_by_the_rules_stored_when_it_is_registered() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = &fixture.metastore;
                let counted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
                let counting = |value: i64| -> SegmentCounting {
                    let counted = counted.clone();
                    std::sync::Arc::new(move |rules: &[RuleRecord]| {
                        counted
                            .lock()
                            .unwrap()
                            .push(rules.iter().map(|r| r.tenant.clone()).collect::<Vec<_>>());
                        if rules.is_empty() {
                            return Vec::new();
                        }
                        vec![exports(&["prom"], vec![sample("s", 0, value)])]
                    })
                };
                let counted_dataset = |id: &str| DatasetMeta {
                    rules_counted: true,
                    ..dataset(id, 0, "a", "api", 10, 20)
                };
                let register = |id: &str, value: i64| {
                    metastore.register_segment(
                        block(id),
                        vec![counted_dataset(id)],
                        vec![],
                        Some(counting(value)),
                    )
                };
                // No rule yet: the closure learns it, and counts nothing.
                register("r0", 1).await.unwrap();
                assert_eq!(*counted.lock().unwrap(), vec![Vec::<String>::new()]);
                metastore
                    .put_recording_rule(RuleRecord {
                        tenant: "a".into(),
                        name: "cpu".into(),
                        spec: "{}".into(),
                        source: "api".into(),
                        live_from_ms: 0,
                        updated_at_ms: 0,
                    })
                    .await
                    .unwrap();
                register("r1", 5).await.unwrap();
                assert_eq!(
                    *counted.lock().unwrap(),
                    vec![vec![], vec!["a".to_string()]]
                );
                // A second registration of the segment (a retry, the log's recovery) fails
                // whole: its samples are not added again.
                assert!(register("r1", 5).await.is_err());
                // Off the runtime, as the write path's threads register.
                let (registering, runtime) = (metastore.clone(), tokio::runtime::Handle::current());
                let blocking = counting(7);
                tokio::task::spawn_blocking(move || {
                    registering.register_block_blocking(
                        &runtime,
                        block("r2"),
                        vec![counted_dataset("r2")],
                        vec![],
                        Some(blocking),
                    )
                })
                .await
                .unwrap()
                .unwrap();
                assert_eq!(
                    claim_all(metastore, "prom").await,
                    vec![("s".to_string(), 0, 12)],
                    "each registration's samples once"
                );
                // Whether a dataset was counted is stored with it, for level 0 to read.
                metastore
                    .register_block(block("r3"), vec![dataset("r3", 0, "a", "api", 10, 20)])
                    .await
                    .unwrap();
                let mut listed: Vec<(String, bool)> = metastore
                    .list_datasets(query("a", None, 0, 100))
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|d| (d.block_id, d.rules_counted))
                    .collect();
                listed.sort();
                assert_eq!(
                    listed,
                    vec![
                        ("r0".to_string(), true),
                        ("r1".to_string(), true),
                        ("r2".to_string(), true),
                        ("r3".to_string(), false)
                    ]
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn rules_are_per_tenant_and_backfills_never_overlap() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = &fixture.metastore;
                let rule = |tenant: &str, spec: &str, live_from_ms: i64| RuleRecord {
                    tenant: tenant.into(),
                    name: "cpu".into(),
                    spec: spec.into(),
                    source: "api".into(),
                    live_from_ms,
                    updated_at_ms: live_from_ms,
                };
                metastore
                    .put_recording_rule(rule("a", "{}", 100))
                    .await
                    .unwrap();
                metastore
                    .put_recording_rule(rule("b", "{}", 100))
                    .await
                    .unwrap();
                let updated = metastore
                    .put_recording_rule(rule("a", "{\"x\":1}", 900))
                    .await
                    .unwrap();
                assert_eq!(updated.spec, "{\"x\":1}");
                assert_eq!(
                    updated.live_from_ms, 100,
                    "an update keeps when counting began"
                );
                assert_eq!(
                    metastore.recording_rules(Some("a".into())).await.unwrap(),
                    vec![updated]
                );
                assert_eq!(metastore.recording_rules(None).await.unwrap().len(), 2);
                assert!(metastore.delete_recording_rule("b", "cpu").await.unwrap());
                assert!(!metastore.delete_recording_rule("b", "cpu").await.unwrap());

                metastore
                    .record_backfill(
                        "a",
                        "cpu",
                        0,
                        60_000,
                        exports(&["prom"], vec![sample("s", 0, 1)]),
                    )
                    .await
                    .unwrap();
                let overlap = metastore
                    .record_backfill(
                        "a",
                        "cpu",
                        30_000,
                        90_000,
                        exports(&["prom"], vec![sample("s", 30_000, 1)]),
                    )
                    .await;
                assert!(
                    matches!(overlap, Err(MetastoreError::Conflict(_))),
                    "{overlap:?}"
                );
                metastore
                    .record_backfill(
                        "a",
                        "cpu",
                        60_000,
                        90_000,
                        exports(&["prom"], vec![sample("s", 60_000, 2)]),
                    )
                    .await
                    .unwrap();
                let claimed = metastore
                    .claim_exports("prom", i64::MAX, 100)
                    .await
                    .unwrap();
                assert_eq!(
                    rows(&claimed),
                    vec![("s".to_string(), 0, 1), ("s".to_string(), 60_000, 2)],
                    "the refused backfill wrote nothing"
                );
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_version_is_checked_once_and_its_findings_listed_per_tenant_and_service() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = fixture.metastore.clone();
                let check = |tenant: &str, service: &str, version: &str, at: i64| VersionCheck {
                    tenant: tenant.into(),
                    service: service.into(),
                    profile_type: "cpu".into(),
                    version_label: "version".into(),
                    new_version: version.into(),
                    old_version: "1.0".into(),
                    checked_at_ms: at,
                    outcome: "1 finding".into(),
                };
                let finding =
                    |tenant: &str, service: &str, version: &str, function: &str, at: i64| {
                        RegressionRecord {
                            tenant: tenant.into(),
                            service: service.into(),
                            profile_type: "cpu".into(),
                            version_label: "version".into(),
                            new_version: version.into(),
                            function: function.into(),
                            detected_at_ms: at,
                            finding: format!("{{\"function\": \"{function}\"}}"),
                        }
                    };
                assert!(!metastore
                    .version_checked("t1", "api", "cpu", "version", "1.1")
                    .await
                    .unwrap());
                // Two watchers check one version at once: one records it.
                let (a, b) = tokio::join!(
                    metastore.record_version_check(
                        check("t1", "api", "1.1", 100),
                        vec![finding("t1", "api", "1.1", "parse", 100)]
                    ),
                    metastore.record_version_check(
                        check("t1", "api", "1.1", 101),
                        vec![finding("t1", "api", "1.1", "other", 101)]
                    )
                );
                assert_eq!(u8::from(a.unwrap()) + u8::from(b.unwrap()), 1);
                assert!(metastore
                    .version_checked("t1", "api", "cpu", "version", "1.1")
                    .await
                    .unwrap());
                for (tenant, service, version, function, at) in [
                    ("t1", "web", "2.0", "render", 200),
                    ("t2", "api", "1.1", "secret", 300),
                ] {
                    assert!(metastore
                        .record_version_check(
                            check(tenant, service, version, at),
                            vec![finding(tenant, service, version, function, at)]
                        )
                        .await
                        .unwrap());
                }
                let all = metastore.regressions("t1", None, 0).await.unwrap();
                let functions: Vec<&str> = all.iter().map(|r| r.function.as_str()).collect();
                assert_eq!(functions.len(), 2, "{all:?}");
                assert_eq!(functions[0], "render", "newest first");
                assert!(functions[1] == "parse" || functions[1] == "other");
                assert!(all.iter().all(|r| r.tenant == "t1"));
                let web = metastore
                    .regressions("t1", Some("web".into()), 0)
                    .await
                    .unwrap();
                assert_eq!(web.len(), 1);
                assert_eq!(web[0].finding, "{\"function\": \"render\"}");
                assert!(metastore
                    .regressions("t1", None, 201)
                    .await
                    .unwrap()
                    .is_empty());
                // Survives a reopen.
                drop(metastore);
                let reopened = Metastore::open(&fixture.url).await.unwrap();
                assert_eq!(reopened.regressions("t2", None, 0).await.unwrap().len(), 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_lease_requests_grant_one_owner() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let group = LeaseKey {
                    tenant: "t".into(),
                    service: "api".into(),
                    level: 0,
                };
                let mut requests = Vec::new();
                for owner in 0..8 {
                    let metastore = fixture.metastore.clone();
                    let group = group.clone();
                    requests.push(tokio::spawn(async move {
                        metastore
                            .acquire_lease(group, &format!("node-{owner}"), 60_000)
                            .await
                    }));
                }
                let mut granted = 0;
                for request in requests {
                    granted += usize::from(request.await.unwrap().unwrap());
                }
                assert_eq!(granted, 1);
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn nodes_are_live_while_their_lease_runs_and_left_once_they_say_so() {
                let Some(fixture) = super::$backend().await else {
                    return;
                };
                let metastore = &fixture.metastore;
                let node = |id: &str, roles: &[&str], heartbeat: i64| NodeRecord {
                    id: id.to_string(),
                    roles: roles.iter().map(|r| r.to_string()).collect(),
                    address: format!("{id}:4040"),
                    started_at_ms: 1_000,
                    heartbeat_at_ms: heartbeat,
                    lease_expires_at_ms: heartbeat + 6_000,
                    left_at_ms: None,
                };
                metastore
                    .heartbeat(&node("a", &["ingest"], 10_000))
                    .await
                    .unwrap();
                metastore
                    .heartbeat(&node("b", &["query", "compact"], 10_000))
                    .await
                    .unwrap();
                // A later heartbeat replaces the row, roles included.
                metastore
                    .heartbeat(&node("a", &["ingest", "query"], 20_000))
                    .await
                    .unwrap();
                let nodes = metastore.nodes().await.unwrap();
                assert_eq!(
                    nodes,
                    vec![
                        node("a", &["ingest", "query"], 20_000),
                        node("b", &["query", "compact"], 10_000)
                    ]
                );
                assert_eq!(nodes[0].state(21_000), NodeState::Live);
                assert_eq!(nodes[1].state(21_000), NodeState::Down);
                assert!(nodes[0].has_role("query") && !nodes[1].has_role("ingest"));
                // Leaving is immediate, and a heartbeat after it makes the node live again.
                metastore.leave("a").await.unwrap();
                let left = metastore.nodes().await.unwrap().remove(0);
                assert_eq!(left.state(21_000), NodeState::Left);
                assert!(left.lease_expires_at_ms <= left.left_at_ms.unwrap());
                metastore
                    .heartbeat(&node("a", &["ingest"], 30_000))
                    .await
                    .unwrap();
                assert_eq!(
                    metastore.nodes().await.unwrap()[0].state(31_000),
                    NodeState::Live
                );
                // Nodes silent since before the cutoff are forgotten.
                assert_eq!(metastore.forget_nodes(15_000).await.unwrap(), 1);
                let ids: Vec<String> = metastore
                    .nodes()
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|n| n.id)
                    .collect();
                assert_eq!(ids, ["a"]);
            }
        }
    };
}

metastore_suite!(sqlite);
metastore_suite!(postgres);

#[tokio::test]
async fn unsupported_urls_are_refused_without_echoing_passwords() {
    let err = Metastore::open("mysql://user:secret@host/db")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected sqlite://"), "{err}");
    assert!(!err.contains("secret"), "{err}");
    let err = Metastore::open("postgres://user:secret@127.0.0.1:1/db")
        .await
        .unwrap_err()
        .to_string();
    assert!(!err.contains("secret"), "{err}");
}

/// SQLite's WAL stays about a megabyte however many commits a node makes: it is
/// checkpointed every 256 pages and cut back once emptied, instead of staying at its
/// largest size (4 MB at SQLite's defaults, a fifth of a day of compacted data).
#[tokio::test]
async fn the_sqlite_wal_stays_near_a_megabyte() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metastore.db");
    let metastore = Metastore::open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let wal = dir.path().join("metastore.db-wal");
    let mut largest = 0;
    for i in 0..3000 {
        let id = format!("b{i:05}");
        metastore
            .register_segment(
                block(&id),
                vec![dataset(&id, 0, "t", "api", i, i + 10)],
                vec![],
                None,
            )
            .await
            .unwrap();
        largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
    }
    let database = std::fs::metadata(&path).unwrap().len();
    println!("database {database} bytes, WAL at most {largest} bytes");
    // 3,000 commits of a few pages each wrote far more than that through the WAL (at
    // SQLite's defaults it grows to 4 MB here, and stays).
    assert!(largest <= (1 << 20) + (1 << 20) / 2, "{largest}");
    assert_eq!(metastore.list_blocks().await.unwrap().len(), 3000);
}

/// `(page_count, freelist_count, auto_vacuum)` of the SQLite file at `path`, as committed.
fn sqlite_pages(path: &std::path::Path) -> (i64, i64, i64) {
    let connection = rusqlite::Connection::open(path).unwrap();
    let pragma = |name: &str| -> i64 {
        connection
            .query_row(&format!("PRAGMA {name}"), [], |row| row.get(0))
            .unwrap()
    };
    (
        pragma("page_count"),
        pragma("freelist_count"),
        pragma("auto_vacuum"),
    )
}

/// A settled SQLite metastore is the size of what it holds: the pages that expired write
/// identities (or compaction's swaps) free are given back, and an older file, made with
/// SQLite's default of keeping every page, is rewritten once so that they can be.
#[tokio::test]
async fn the_sqlite_metastore_gives_back_the_pages_it_frees() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metastore.db");
    let url = format!("sqlite://{}", path.display());
    let metastore = Metastore::open(&url).await.unwrap();
    let identities = (0..20_000u64)
        .map(|i| WriteIdentity {
            identity: format!(
                "{:032x}",
                u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
            ),
            expires_at_ms: 150,
        })
        .collect();
    metastore
        .register_segment(
            BlockMeta {
                created_at_ms: 100,
                ..block("s1")
            },
            vec![dataset("s1", 0, "t", "api", 10, 20)],
            identities,
            None,
        )
        .await
        .unwrap();
    let (full, _, mode) = sqlite_pages(&path);
    assert_eq!(mode, 2, "a new file vacuums incrementally");
    assert_eq!(metastore.write_identities(0).await.unwrap().len(), 20_000);
    // A registration after they expired deletes them.
    metastore
        .register_segment(
            BlockMeta {
                created_at_ms: 200,
                ..block("s2")
            },
            vec![dataset("s2", 0, "t", "api", 10, 20)],
            vec![WriteIdentity {
                identity: "ab".repeat(16),
                expires_at_ms: 900,
            }],
            None,
        )
        .await
        .unwrap();
    let (settled, free, _) = sqlite_pages(&path);
    println!("{full} pages with 20,000 identities, {settled} after they expired ({free} free)");
    assert!(settled * 2 < full, "{settled} of {full} pages kept");
    assert!(
        free <= 16.max(settled / 8),
        "{free} of {settled} pages free"
    );
    assert_eq!(metastore.write_identities(0).await.unwrap().len(), 1);
    drop(metastore);

    // A file SQLite made with its default mode is converted once, keeping what it holds.
    let older = dir.path().join("older.db");
    rusqlite::Connection::open(&older)
        .unwrap()
        .execute_batch("CREATE TABLE kept (value INTEGER); INSERT INTO kept VALUES (7);")
        .unwrap();
    assert_eq!(sqlite_pages(&older).2, 0);
    let metastore = Metastore::open(&format!("sqlite://{}", older.display()))
        .await
        .unwrap();
    assert_eq!(sqlite_pages(&older).2, 2);
    assert_eq!(metastore.schema_version().await.unwrap(), 9);
    let kept: i64 = rusqlite::Connection::open(&older)
        .unwrap()
        .query_row("SELECT value FROM kept", [], |row| row.get(0))
        .unwrap();
    assert_eq!(kept, 7);
}

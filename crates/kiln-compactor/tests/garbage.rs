//! Garbage collection: objects nobody registered and blocks nobody uses are deleted once
//! past the grace period, and never before; live blocks are never touched. Run on both
//! deployments: local directory + SQLite, and S3 + PostgreSQL servers on loopback.

use bytes::Bytes;
use kiln_compactor::{Compactor, CompactorConfig, LevelPolicy};
use kiln_metastore::{BlockMeta, DatasetMeta, Metastore};
use kiln_storage::ObjectStorage;

mod common;

const GRACE_MS: i64 = 60_000;

fn block(id: &str, key: &str) -> BlockMeta {
    BlockMeta {
        id: id.into(),
        object_key: key.into(),
        level: 0,
        size_bytes: 1,
        created_at_ms: 0,
        deleted_at_ms: None,
    }
}

fn dataset(block: &str, key: &str, max_time_nanos: i64) -> DatasetMeta {
    DatasetMeta {
        block_id: block.into(),
        object_key: key.into(),
        tenant: "t".into(),
        service: "s".into(),
        row_group: 0,
        min_time_nanos: 0,
        max_time_nanos,
        profile_types: vec![],
        profile_count: 1,
        rules_counted: false,
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test]
async fn local_sqlite_only_garbage_older_than_the_grace_period_is_deleted() {
    let (_dir, storage, metastore) = common::local_sqlite().await;
    only_garbage_older_than_the_grace_period_is_deleted(storage, metastore).await;
}

#[tokio::test]
async fn s3_postgres_only_garbage_older_than_the_grace_period_is_deleted() {
    let servers = kiln_testkit::s3().and_then(|s3| Ok((s3, kiln_testkit::postgres()?)));
    let (s3, postgres) = match servers {
        Ok(servers) => servers,
        Err(reason) => {
            println!("skipped: {reason}");
            return;
        }
    };
    let storage = ObjectStorage::open_with(&s3.fresh_bucket(), &s3.env()).unwrap();
    let metastore = Metastore::open(&postgres.fresh_database()).await.unwrap();
    only_garbage_older_than_the_grace_period_is_deleted(storage, metastore).await;
}

async fn only_garbage_older_than_the_grace_period_is_deleted(
    storage: ObjectStorage,
    metastore: Metastore,
) {
    for key in [
        "segments/live.parquet",
        "segments/orphan.parquet",
        "segments/expired.parquet",
    ] {
        storage.put(key, Bytes::from_static(b"x")).await.unwrap();
    }
    metastore
        .register_block(
            block("live", "segments/live.parquet"),
            vec![dataset("live", "segments/live.parquet", i64::MAX)],
        )
        .await
        .unwrap();
    metastore
        .register_block(
            block("expired", "segments/expired.parquet"),
            vec![dataset("expired", "segments/expired.parquet", 1)],
        )
        .await
        .unwrap();
    let config = CompactorConfig {
        grace_ms: GRACE_MS,
        orphan_age_ms: GRACE_MS,
        retention_days: 1,
        // No level is ever due: this test is about garbage only.
        levels: vec![LevelPolicy {
            max_datasets: usize::MAX,
            max_age_ms: i64::MAX,
            window_ms: 0,
            ..LevelPolicy::default()
        }],
        ..CompactorConfig::default()
    };
    let compactor = Compactor::new(metastore.clone(), storage.clone(), config);
    let keys = |storage: ObjectStorage| async move { storage.list_keys("segments").await.unwrap() };

    // Now: retention tombstones "expired"; nothing is old enough to delete.
    let report = compactor.run_pass(now_ms()).await.unwrap();
    assert_eq!((report.expired_datasets, report.deleted_objects), (1, 0));
    assert_eq!(keys(storage.clone()).await.len(), 3);

    // Past the grace period: the orphan and the tombstoned block go, the live one stays.
    let report = compactor.run_pass(now_ms() + 2 * GRACE_MS).await.unwrap();
    assert_eq!(report.deleted_objects, 2);
    assert_eq!(
        keys(storage.clone()).await,
        vec!["segments/live.parquet".to_string()]
    );
    let blocks = metastore.list_blocks().await.unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].id, "live");

    // A new orphan right after a sweep waits for the next one, a grace period later.
    storage
        .put("segments/late.parquet", Bytes::from_static(b"x"))
        .await
        .unwrap();
    let report = compactor
        .run_pass(now_ms() + 2 * GRACE_MS + 1)
        .await
        .unwrap();
    assert_eq!(report.deleted_objects, 0);
    let report = compactor.run_pass(now_ms() + 4 * GRACE_MS).await.unwrap();
    assert_eq!(report.deleted_objects, 1);
    assert_eq!(
        keys(storage).await,
        vec!["segments/live.parquet".to_string()]
    );
}

//! The metastore's contract, on the embedded SQLite backend: migrations, the time-overlap
//! lookup, tenant and service scoping, and all-or-nothing registration.

use kiln_metastore::{BlockMeta, DatasetMeta, DatasetQuery, Metastore};

fn block(id: &str) -> BlockMeta {
    BlockMeta {
        id: id.to_string(),
        object_key: format!("segments/{id}.parquet"),
        level: 0,
        size_bytes: 1234,
        created_at_ms: 1,
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
    }
}

fn query(tenant: &str, service: Option<&str>, from: i64, to: i64) -> DatasetQuery {
    DatasetQuery {
        tenant: tenant.to_string(),
        service: service.map(str::to_string),
        from_nanos: from,
        to_nanos: to,
    }
}

#[tokio::test]
async fn migrations_run_once_and_lookups_respect_time_tenant_and_service() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("m.db").display());
    let metastore = Metastore::open(&url).await.unwrap();
    assert_eq!(metastore.schema_version().await.unwrap(), 1);
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
    assert_eq!(metastore.schema_version().await.unwrap(), 1);
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

#[tokio::test]
async fn a_failed_registration_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let metastore = Metastore::open(&format!("sqlite://{}", dir.path().join("m.db").display()))
        .await
        .unwrap();
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
    assert!(
        Metastore::open("postgres://nowhere").await.is_err(),
        "unsupported URLs are refused"
    );
}

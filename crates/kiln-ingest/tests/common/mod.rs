//! Helpers shared by the write path's test files.

use kiln_metastore::{DatasetQuery, Metastore};
use kiln_storage::{Dataset, ObjectStorage};

/// The datasets of tenant `t` (of `service` only, when given) in (service, block) order
/// (block ids are ULIDs, so in the order their segments were written), decoded from
/// storage and checked.
pub async fn decoded(
    metastore: &Metastore,
    storage: &ObjectStorage,
    service: Option<&str>,
) -> Vec<Dataset> {
    let mut metas = metastore
        .list_datasets(DatasetQuery {
            tenant: "t".into(),
            service: service.map(str::to_string),
            from_nanos: i64::MIN,
            to_nanos: i64::MAX,
        })
        .await
        .unwrap();
    metas.sort_by(|a, b| (&a.service, &a.block_id).cmp(&(&b.service, &b.block_id)));
    let mut decoded = Vec::new();
    for meta in metas {
        let block = storage.get(&meta.object_key).await.unwrap();
        let dataset = kiln_storage::format::decode_dataset(
            &block,
            meta.row_group as usize,
            kiln_storage::format::Projection::ALL,
        )
        .unwrap();
        dataset.check().unwrap();
        decoded.push(dataset);
    }
    decoded
}

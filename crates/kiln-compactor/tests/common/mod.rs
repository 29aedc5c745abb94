//! The local deployment the compactor's tests run on: a directory of blocks and SQLite.

use kiln_metastore::Metastore;
use kiln_storage::ObjectStorage;

/// Storage and metastore in a fresh directory, removed when the guard drops.
pub async fn local_sqlite() -> (tempfile::TempDir, ObjectStorage, Metastore) {
    let dir = tempfile::tempdir().unwrap();
    let storage =
        ObjectStorage::open(&format!("file://{}", dir.path().join("blocks").display())).unwrap();
    let metastore = Metastore::open(&format!("sqlite://{}", dir.path().join("m.db").display()))
        .await
        .unwrap();
    (dir, storage, metastore)
}

//! Object storage behind one URL: `file:///path` today, any `object_store` backend later.
//!
//! `object_store`'s local backend writes to a temporary file and renames it into place,
//! but does not fsync. An acknowledged profile must survive a crash of the machine, not
//! just of the process, so after a local put the file and its directory are synced here.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::StorageError;

#[derive(Clone)]
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    /// Root directory when the store is local, for fsync.
    local_root: Option<PathBuf>,
    url: String,
}

impl std::fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStorage")
            .field("url", &self.url)
            .finish()
    }
}

impl ObjectStorage {
    /// Opens the store named by `url`: `file:///absolute/path` or a plain path.
    pub fn open(url: &str) -> Result<Self, StorageError> {
        let path = if let Some(rest) = url.strip_prefix("file://") {
            PathBuf::from(rest)
        } else if url.contains("://") {
            return Err(StorageError::InvalidUrl {
                url: url.to_string(),
                message: "only file:// object stores are supported by this build".to_string(),
            });
        } else {
            PathBuf::from(url)
        };
        std::fs::create_dir_all(&path)?;
        let root = path.canonicalize()?;
        let store = LocalFileSystem::new_with_prefix(&root)?;
        Ok(ObjectStorage {
            store: Arc::new(store),
            local_root: Some(root),
            url: url.to_string(),
        })
    }

    /// Writes an object durably: when this returns Ok, the bytes survive a crash.
    pub async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
        let path = Path::from(key);
        self.store.put(&path, PutPayload::from_bytes(data)).await?;
        if let Some(root) = &self.local_root {
            let file = root.join(key);
            tokio::task::spawn_blocking(move || sync_file_and_parent(&file))
                .await
                .map_err(|err| std::io::Error::other(err.to_string()))??;
        }
        Ok(())
    }

    pub async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
        let path = Path::from(key);
        Ok(self.store.get(&path).await?.bytes().await?)
    }

    /// Deletes an object. One already gone is fine: deletions are retried after a crash.
    pub async fn delete(&self, key: &str) -> Result<(), StorageError> {
        match self.store.delete(&Path::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Every object under `prefix`, as (key, last modified in ms since the epoch).
    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, i64)>, StorageError> {
        use futures_util::StreamExt;
        let mut stream = self.store.list(Some(&Path::from(prefix)));
        let mut objects = Vec::new();
        while let Some(meta) = stream.next().await {
            match meta {
                Ok(meta) => objects.push((
                    meta.location.to_string(),
                    meta.last_modified.timestamp_millis(),
                )),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(objects)
    }
}

fn sync_file_and_parent(file: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(file)?.sync_all()?;
    if let Some(parent) = file.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

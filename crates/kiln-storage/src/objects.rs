//! Object storage behind one URL: `file:///path` (or a plain path), `s3://bucket/prefix`,
//! `gs://bucket/prefix` or `az://container/prefix`, through the `object_store` crate.
//!
//! Cloud credentials, regions and endpoints come from the environment the way each
//! backend's tools read it (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, `GOOGLE_*`,
//! `AZURE_*`), so one URL flag is all Kiln needs to be told.
//!
//! `object_store`'s local backend writes to a temporary file and renames it into place.
//! An acknowledged profile must survive a crash of the machine, not just of the process,
//! so it is opened with fsync on: the file is synced before the rename and its directory
//! after, all in the one blocking task of the put (a flush of the write path pays one
//! hand-off to a blocking thread per object, not two). A cloud store acknowledges a PUT
//! only once the object is durable.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::StorageError;

#[derive(Clone)]
pub struct ObjectStorage {
    store: Arc<dyn ObjectStore>,
    /// Root directory when the store is local, for reads off the runtime.
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
    /// Opens the store named by `url`; see the module docs for the schemes.
    pub fn open(url: &str) -> Result<Self, StorageError> {
        Self::open_with(url, &[])
    }

    /// Like [`ObjectStorage::open`], with settings that take precedence over the
    /// environment's, named as the environment names them (`AWS_ENDPOINT_URL`, ...).
    pub fn open_with(url: &str, options: &[(String, String)]) -> Result<Self, StorageError> {
        let invalid = |message: &str| StorageError::InvalidUrl {
            url: url.to_string(),
            message: message.to_string(),
        };
        let Some((scheme, rest)) = url.split_once("://") else {
            return Self::open_local(PathBuf::from(url), url);
        };
        if scheme == "file" {
            return Self::open_local(PathBuf::from(rest), url);
        }
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(invalid("the url names no bucket"));
        }
        let bucket_url = format!("{scheme}://{bucket}");
        let store: Arc<dyn ObjectStore> = match scheme {
            "s3" | "s3a" => {
                let mut builder = AmazonS3Builder::from_env().with_url(bucket_url);
                let mut endpoint = std::env::var("AWS_ENDPOINT_URL")
                    .or_else(|_| std::env::var("AWS_ENDPOINT"))
                    .ok();
                for (key, value) in options {
                    let config_key = key
                        .to_ascii_lowercase()
                        .parse()
                        .map_err(|_| invalid(&format!("unknown S3 setting {key}")))?;
                    if matches!(config_key, object_store::aws::AmazonS3ConfigKey::Endpoint) {
                        endpoint = Some(value.clone());
                    }
                    builder = builder.with_config(config_key, value);
                }
                // An endpoint given as http:// (MinIO, a local test server) is meant to be used.
                if endpoint.is_some_and(|endpoint| endpoint.starts_with("http://")) {
                    builder = builder.with_allow_http(true);
                }
                Arc::new(builder.build()?)
            }
            "gs" => Arc::new(
                GoogleCloudStorageBuilder::from_env()
                    .with_url(bucket_url)
                    .build()?,
            ),
            "az" | "azure" | "abfs" | "abfss" => Arc::new(
                MicrosoftAzureBuilder::from_env()
                    .with_url(bucket_url)
                    .build()?,
            ),
            _ => {
                return Err(invalid(
                    "expected file:///path, s3://bucket/prefix, gs://bucket/prefix or az://container/prefix",
                ))
            }
        };
        let prefix = prefix.trim_matches('/');
        let store = if prefix.is_empty() {
            store
        } else {
            Arc::new(PrefixStore::new(store, Path::from(prefix)))
        };
        Ok(ObjectStorage {
            store,
            local_root: None,
            url: url.to_string(),
        })
    }

    fn open_local(path: PathBuf, url: &str) -> Result<Self, StorageError> {
        std::fs::create_dir_all(&path)?;
        let root = path.canonicalize()?;
        let store = LocalFileSystem::new_with_prefix(&root)?.with_fsync(true);
        Ok(ObjectStorage {
            store: Arc::new(store),
            local_root: Some(root),
            url: url.to_string(),
        })
    }

    /// The URL this store was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Writes an object durably: when this returns Ok, the bytes survive a crash.
    pub async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
        let path = Path::from(key);
        self.store.put(&path, PutPayload::from_bytes(data)).await?;
        Ok(())
    }

    /// Whether objects are files on this machine: a put is then a few system calls, cheap
    /// enough to run on the thread that encoded the object ([`ObjectStorage::put_blocking`]).
    pub fn is_local(&self) -> bool {
        self.local_root.is_some()
    }

    /// [`ObjectStorage::put`] from a thread outside the runtime, blocked until the object
    /// is stored. Off the runtime, `object_store`'s local backend does its file work on the
    /// calling thread, so the put completes at its first poll, with no hand-off to a
    /// blocking thread and back. A cloud store's put is driven on `runtime` from the start:
    /// its HTTP client needs the runtime's timers and sockets even to begin.
    pub fn put_blocking(
        &self,
        runtime: &tokio::runtime::Handle,
        key: &str,
        data: Bytes,
    ) -> Result<(), StorageError> {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let path = Path::from(key);
        let mut put = std::pin::pin!(self.store.put(&path, PutPayload::from_bytes(data)));
        if self.is_local() {
            if let Poll::Ready(result) = put.as_mut().poll(&mut Context::from_waker(Waker::noop()))
            {
                result?;
                return Ok(());
            }
        }
        runtime.block_on(put)?;
        Ok(())
    }

    pub async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
        let path = Path::from(key);
        Ok(self.store.get(&path).await?.bytes().await?)
    }

    /// The last `length` bytes of an object (all of it when shorter), and its size.
    pub async fn get_suffix(&self, key: &str, length: u64) -> Result<(Bytes, u64), StorageError> {
        let options = object_store::GetOptions {
            range: Some(object_store::GetRange::Suffix(length)),
            ..Default::default()
        };
        let result = self.store.get_opts(&Path::from(key), options).await?;
        let size = result.meta.size;
        Ok((result.bytes().await?, size))
    }

    /// Bytes `range` of an object.
    pub async fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StorageError> {
        Ok(self.store.get_range(&Path::from(key), range).await?)
    }

    /// [`ObjectStorage::get_range`] for several ranges of one object, in order, for a
    /// thread that may block (never an async worker): a local store's file is read right
    /// here, so the buffers are this thread's allocations; a remote store is asked once,
    /// on `runtime`, through `object_store`'s `get_ranges`, which joins ranges under 1 MiB
    /// apart into one request (a dataset's few column chunks, or those of every dataset of
    /// a small segment, cost one GET). A range running past the object's end gives the
    /// bytes there are.
    ///
    /// Why it matters: `object_store` reads local files on tokio's blocking pool, and a
    /// buffer allocated there and freed by the thread that consumed it stays with the
    /// allocating thread until that thread allocates the same size again. Compaction read
    /// its level-1 inputs (4 MB each) that way, and the server's RSS climbed by about
    /// 25 MiB a merge through a pass (docs/benchmarks.md).
    pub fn get_ranges_blocking(
        &self,
        runtime: &tokio::runtime::Handle,
        key: &str,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Vec<Bytes>, StorageError> {
        let Some(root) = &self.local_root else {
            return runtime
                .block_on(async { Ok(self.store.get_ranges(&Path::from(key), ranges).await?) });
        };
        let mut file = std::fs::File::open(root.join(key))?;
        ranges
            .iter()
            .map(|range| read_file_range(&mut file, range.clone()))
            .collect()
    }

    /// Stores a local file as an object, read and sent in parts: a debug file may be
    /// gigabytes, more than a node should hold in memory at once.
    pub async fn put_file(&self, key: &str, file: &std::path::Path) -> Result<(), StorageError> {
        use tokio::io::AsyncReadExt;
        const PART: usize = 8 << 20;
        let upload = self.store.put_multipart(&Path::from(key)).await?;
        let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, PART);
        let mut input = tokio::fs::File::open(file).await?;
        let mut buffer = vec![0u8; PART];
        loop {
            let read = input.read(&mut buffer).await?;
            if read == 0 {
                break;
            }
            writer.wait_for_capacity(2).await?;
            writer.write(&buffer[..read]);
        }
        writer.finish().await?;
        Ok(())
    }

    /// Writes an object into a local file, at most `limit` bytes of it, streamed: `None`
    /// when there is no such object, an error past `limit`. The file is synced, as it is
    /// read back by another component that trusts it whole.
    pub async fn get_to_file(
        &self,
        key: &str,
        file: &std::path::Path,
        limit: u64,
    ) -> Result<Option<u64>, StorageError> {
        use futures_util::StreamExt;
        use tokio::io::AsyncWriteExt;
        let result = match self.store.get(&Path::from(key)).await {
            Ok(result) => result,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        if result.meta.size > limit {
            return Err(StorageError::Corrupt(format!(
                "{key} holds {} bytes, more than the {limit} allowed",
                result.meta.size
            )));
        }
        let mut output = tokio::fs::File::create(file).await?;
        let mut stream = result.into_stream();
        let mut written = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            written += chunk.len() as u64;
            if written > limit {
                return Err(StorageError::Corrupt(format!(
                    "{key} grew past the {limit} bytes allowed while read"
                )));
            }
            output.write_all(&chunk).await?;
        }
        output.sync_all().await?;
        Ok(Some(written))
    }

    /// An object's size, or `None` when there is none under `key`.
    pub async fn size(&self, key: &str) -> Result<Option<u64>, StorageError> {
        match self.store.head(&Path::from(key)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(err) => Err(err.into()),
        }
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

    /// The keys under `prefix`, sorted: [`ObjectStorage::list`] without the times.
    pub async fn list_keys(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let mut keys: Vec<String> = self
            .list(prefix)
            .await?
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        keys.sort();
        Ok(keys)
    }
}

/// The bytes of `range` of a local file, or those there are before its end.
fn read_file_range(
    file: &mut std::fs::File,
    range: std::ops::Range<u64>,
) -> Result<Bytes, StorageError> {
    use std::io::{Read, Seek, SeekFrom};
    let len = range.end.saturating_sub(range.start);
    file.seek(SeekFrom::Start(range.start))?;
    let mut buffer = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    file.take(len).read_to_end(&mut buffer)?;
    Ok(Bytes::from(buffer))
}

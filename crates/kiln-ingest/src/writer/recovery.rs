//! Recovery from the write-ahead log: the identities an earlier run stored, so a retry
//! is still known after a restart, and the segments of the log files it left, written
//! through the sink once and only if their block is not registered already.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kiln_metastore::Metastore;
use kiln_storage::DatasetBuilder;

use super::metrics::WriterMetrics;
use super::sink::SegmentSink;
use super::warm::ServiceKey;
use crate::dedup::Dedup;
use crate::error::StoreError;

/// What recovering needs: the metastore to ask what is registered, the sink to write.
pub(super) struct Recovery {
    pub(super) metastore: Metastore,
    pub(super) sink: Arc<SegmentSink>,
    pub(super) dedup: Arc<Dedup>,
    pub(super) metrics: WriterMetrics,
    pub(super) max_stack_depth: usize,
    /// How often a file that could not be written is tried again (`segment_interval`).
    pub(super) retry_every: Duration,
}

impl Recovery {
    /// Fills the dedup table with the identities stored before this start, from the
    /// metastore and from the log files left, then lets writes through. A metastore that
    /// cannot be read leaves the table to what the log knows: writes are not refused
    /// for it.
    pub(super) async fn remember_identities(&self, leftovers: &[(String, PathBuf)]) {
        let now_ms = kiln_model::time::now_ms();
        match self.metastore.write_identities(now_ms).await {
            Ok(identities) => self.dedup.remember(identities, now_ms),
            Err(err) => {
                tracing::error!(error = %err, "identities of stored writes not read; retries may be stored twice")
            }
        }
        for (_, path) in leftovers {
            let path = path.clone();
            match crate::cpu::spawn(move || crate::wal::identities(&path)).await {
                Ok(Ok(identities)) => self.dedup.remember(identities, now_ms),
                Ok(Err(err)) => tracing::warn!(error = %err, "identities of a log file not read"),
                Err(err) => tracing::warn!(error = %err, "identities of a log file not read"),
            }
        }
        self.dedup.open();
    }

    /// Writes the segment of every log file an earlier run left (see [`crate::wal`]):
    /// at start, before any read is answered. A file that cannot be recovered now is
    /// retried in the background.
    pub(super) async fn recover(self: &Arc<Self>, leftovers: Vec<(String, PathBuf)>) {
        for (block_id, path) in leftovers {
            if let Err(err) = self.recover_file(&block_id, &path).await {
                tracing::error!(file = %path.display(), error = %err, "write-ahead log file not recovered; retrying");
                self.clone().retry(block_id, path);
            }
        }
    }

    /// Retries [`Recovery::recover_file`] every `segment_interval` until it succeeds: for
    /// a leftover file, and for a logged batch whose flush failed (its requests were
    /// acknowledged, so the log is their only copy).
    pub(super) fn retry(self: Arc<Self>, block_id: String, path: PathBuf) {
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(self.retry_every).await;
                match self.recover_file(&block_id, &path).await {
                    Ok(()) => return,
                    Err(err) => {
                        tracing::warn!(file = %path.display(), error = %err, "write-ahead log file not recovered yet")
                    }
                }
            }
        });
    }

    /// One log file's segment, written unless its block is registered already; then the
    /// file is deleted. A file that cannot be read back is kept aside as `.corrupt`.
    async fn recover_file(&self, block_id: &str, path: &Path) -> Result<(), StoreError> {
        let registered = self
            .metastore
            .list_blocks()
            .await
            .map_err(StoreError::Metastore)?
            .iter()
            .any(|block| block.id == block_id);
        if !registered {
            let read_path = path.to_path_buf();
            let max_stack_depth = self.max_stack_depth;
            let read = crate::cpu::spawn(move || {
                let requests = crate::wal::read(&read_path)?;
                let mut builders: HashMap<ServiceKey, DatasetBuilder> = HashMap::new();
                let mut profiles = 0;
                let mut identities = Vec::new();
                for (tenant, parsed) in requests {
                    for profile in parsed {
                        identities.extend(profile.identity.clone());
                        let key = (tenant.clone(), profile.service().to_string());
                        builders
                            .entry(key)
                            .or_insert_with(|| DatasetBuilder::new(&tenant, profile.service()))
                            .add_pprof(&profile.input(max_stack_depth));
                        profiles += 1;
                    }
                }
                Ok::<_, crate::wal::WalError>((
                    builders.into_iter().collect::<Vec<_>>(),
                    profiles,
                    identities,
                ))
            })
            .await
            .map_err(StoreError::Task)?;
            let (builders, profiles, identities) = match read {
                Ok(read) => read,
                Err(crate::wal::WalError::Io { source, .. }) => {
                    return Err(StoreError::Wal(source))
                }
                Err(err @ crate::wal::WalError::Corrupt { .. }) => {
                    tracing::error!(error = %err, "write-ahead log file kept aside as .corrupt");
                    let aside = path.with_extension("wal.corrupt");
                    return std::fs::rename(path, aside).map_err(StoreError::Wal);
                }
            };
            self.sink
                .write(builders, profiles, block_id, identities)
                .await?;
            self.metrics.wal_recovered.inc_by(profiles as u64);
            tracing::info!(block = %block_id, profiles, "write-ahead log file recovered");
        }
        remove_logged(path);
        Ok(())
    }
}

/// Deletes a log file whose segment is registered. One left behind is found registered
/// at the next start, and deleted then.
pub(super) fn remove_logged(path: &Path) {
    if let Err(err) = std::fs::remove_file(path) {
        if err.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %path.display(), error = %err, "write-ahead log file not deleted");
        }
    }
}

//! The open batch: the generation that staged requests intern into until a flush swaps
//! it for the next, and the count of writes still on their way.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use kiln_metastore::{DatasetQuery, WriteIdentity};
use kiln_storage::DatasetBuilder;
use tokio::sync::{watch, Notify};

use super::warm::{ServiceKey, WarmBuilders};
use crate::dedup::Resolver;
use crate::error::StoreError;
use crate::wal::{Wal, WalFile};

/// A staged request, as the flusher hears of it: enough to size and time the batch.
pub(super) struct Job {
    pub(super) generation: u64,
    /// Received bytes, which decide when a batch is big enough to flush.
    pub(super) bytes: usize,
    /// Sent by [`Ingester::sync`]: flush the open batch now.
    pub(super) sync: bool,
}

pub(super) type FlushResult = Option<Result<(), Arc<StoreError>>>;
pub(super) type SharedBuilder = Arc<Mutex<DatasetBuilder>>;

/// One batch: the builders that staged requests intern into, until a flush takes them.
pub(super) struct Generation {
    pub(super) id: u64,
    /// The block id of its segment, and the name of its log file.
    pub(super) block_id: String,
    /// Its log file, created by the first request logged here.
    pub(super) wal: Mutex<Option<Arc<WalFile>>>,
    pub(super) builders: Mutex<HashMap<ServiceKey, SharedBuilder>>,
    /// The times each (tenant, service) staged here spans, first start to last end: a
    /// read need not wait for a batch it cannot see ([`Generation::reaches`]). Kept
    /// after the flush takes the builders.
    reach: Mutex<HashMap<ServiceKey, (i64, i64)>>,
    /// Heap of the builders, counted in `pending_bytes` until the flush is done.
    pub(super) bytes: AtomicUsize,
    pub(super) requests: AtomicUsize,
    pub(super) profiles: AtomicUsize,
    /// The flush's outcome, for every request staged here.
    pub(super) done: watch::Sender<FlushResult>,
    /// Identities of the profiles staged here, registered with the segment.
    pub(super) identities: Mutex<Vec<WriteIdentity>>,
    /// Their outcome as their duplicates wait for it, resolved with the flush.
    pub(super) resolvers: Mutex<Vec<Resolver>>,
}

impl Generation {
    pub(super) fn new(id: u64) -> Self {
        Generation {
            id,
            block_id: ulid::Ulid::new().to_string(),
            wal: Mutex::new(None),
            builders: Mutex::new(HashMap::new()),
            reach: Mutex::new(HashMap::new()),
            bytes: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            profiles: AtomicUsize::new(0),
            done: watch::channel(None).0,
            identities: Mutex::default(),
            resolvers: Mutex::default(),
        }
    }

    /// The identities to register with this generation's segment.
    pub(super) fn take_identities(&self) -> Vec<WriteIdentity> {
        std::mem::take(
            &mut *self
                .identities
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// The builder of (`tenant`, `service`), whose profiles to be staged span `times`.
    pub(super) fn builder(
        &self,
        tenant: &str,
        service: &str,
        times: (i64, i64),
        warm: &WarmBuilders,
    ) -> Arc<Mutex<DatasetBuilder>> {
        let key = (tenant.to_string(), service.to_string());
        {
            let mut reach = self.reach.lock().unwrap_or_else(PoisonError::into_inner);
            let span = reach.entry(key.clone()).or_insert(times);
            *span = (span.0.min(times.0), span.1.max(times.1));
        }
        let mut builders = self.builders.lock().unwrap_or_else(PoisonError::into_inner);
        builders
            .entry(key)
            .or_insert_with(|| Arc::new(Mutex::new(warm.take(tenant, service))))
            .clone()
    }

    /// Whether a listing of `scope` could see a profile staged here.
    pub(super) fn reaches(&self, scope: &DatasetQuery) -> bool {
        let reach = self.reach.lock().unwrap_or_else(PoisonError::into_inner);
        reach.iter().any(|((tenant, service), (first, last))| {
            *tenant == scope.tenant
                && scope
                    .service
                    .as_ref()
                    .is_none_or(|wanted| wanted == service)
                && *first <= scope.to_nanos
                && *last >= scope.from_nanos
        })
    }

    /// Its log file, created if this is the first request logged here.
    pub(super) fn wal_file(&self, wal: &Wal) -> std::io::Result<Arc<WalFile>> {
        let mut file = self.wal.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(file) = &*file {
            return Ok(file.clone());
        }
        let created = Arc::new(wal.create(&self.block_id)?);
        *file = Some(created.clone());
        Ok(created)
    }
}

/// The open generation, shared by the ingester handles and the flusher. Staging holds
/// the read lock for its whole add; a flush takes the write lock to swap in a new one.
pub(super) struct Staging {
    pub(super) open: RwLock<Arc<Generation>>,
    pub(super) next_id: AtomicU64,
    pub(super) warm: Arc<WarmBuilders>,
    /// The write-ahead log, when writes are acknowledged from it.
    pub(super) wal: Option<Wal>,
    /// Generations swapped out and not yet settled, for [`Ingester::sync`]: added under
    /// the write lock that swaps them, so a reader of the open generation finds every
    /// older one here or settled.
    pub(super) closed: Mutex<BTreeMap<u64, Arc<Generation>>>,
}

impl Staging {
    /// Closes the open generation and opens the next; waits for adds in progress.
    pub(super) fn swap(&self) -> Arc<Generation> {
        let mut open = self.open.write().unwrap_or_else(PoisonError::into_inner);
        self.open_next(&mut open)
    }

    /// [`Staging::swap`] when no add is in progress; `None` when it would wait.
    pub(super) fn try_swap(&self) -> Option<Arc<Generation>> {
        self.try_swap_if(|_| true)
    }

    /// [`Staging::try_swap`] of the open generation only if `wanted` says so of it, under
    /// the write lock: no add can join it between the check and the swap.
    pub(super) fn try_swap_if(
        &self,
        wanted: impl FnOnce(&Generation) -> bool,
    ) -> Option<Arc<Generation>> {
        let mut open = match self.open.try_write() {
            Ok(open) => open,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        if !wanted(&open) {
            return None;
        }
        Some(self.open_next(&mut open))
    }

    /// Puts a new generation in `open`'s place (under the write lock) and returns the old.
    fn open_next(&self, open: &mut Arc<Generation>) -> Arc<Generation> {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let closed = std::mem::replace(open, Arc::new(Generation::new(id)));
        if self.wal.is_some() {
            self.closed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(closed.id, closed.clone());
        }
        closed
    }

    /// The open generation's id, without the lock: only the flusher swaps, so between
    /// its swaps this is exact.
    pub(super) fn open_id(&self) -> u64 {
        self.next_id.load(Ordering::SeqCst) - 1
    }

    /// Heap of the open generation's builders: what the next flush takes, without the
    /// flushes in progress that `pending_bytes` also counts.
    pub(super) fn open_bytes(&self) -> usize {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        open.bytes.load(Ordering::SeqCst)
    }
}

/// A request's profiles, interned into a generation, waiting for its flush.
pub(super) struct Staged {
    pub(super) generation: u64,
    pub(super) done: watch::Receiver<FlushResult>,
    pub(super) received_bytes: usize,
    /// Logged: the log's bytes to wait for before the acknowledgement, which then does
    /// not wait for the flush.
    pub(super) sync: Option<PendingSync>,
}

/// A logged write's place in its log file, and its claim to resolve once that is on disk.
pub(super) struct PendingSync {
    pub(super) file: Arc<WalFile>,
    pub(super) end: u64,
    pub(super) resolver: Option<Resolver>,
}

/// Counters of the write path, exported on `/metrics`.
/// Writes admitted but not yet staged, and a wake-up for the flusher whenever one ends
/// or a flush finishes.
#[derive(Default)]
pub(super) struct Arrivals {
    pub(super) count: AtomicUsize,
    pub(super) changed: Notify,
}

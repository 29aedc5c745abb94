//! The write-ahead log: a write is acknowledged before its segment exists, is visible
//! after `sync` (what every query calls first), and after a crash is written from the log
//! exactly once, as it would have been written directly. Real files, a local block
//! directory and SQLite.

mod common;

use std::io::Write;
use std::path::Path;

use kiln_ingest::parse::{from_pprof_bytes, ProfileContext};
use kiln_ingest::wal::Wal;
use kiln_ingest::{IngestError, Ingester, IngesterConfig, Limits, ParsedProfile};
use kiln_metastore::{DatasetQuery, Metastore};
use kiln_model::labels::Labels;
use kiln_storage::{Dataset, ObjectStorage};

const REQUESTS: usize = 4;
/// The time of the first profile, the same for every run of a test.
static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();

use kiln_testkit::fixture;

/// Request `request`: one profile of each of two services, with fixed ids and times so
/// that two runs write the same datasets.
fn request(request: usize) -> Vec<ParsedProfile> {
    let pprof = fixture("pprof-report-sample.cpu.pb.gz");
    ["left", "right"]
        .iter()
        .enumerate()
        .map(|(index, service)| {
            let context = ProfileContext {
                labels: Labels::from_pairs(vec![
                    ("service_name".to_string(), service.to_string()),
                    ("request".to_string(), request.to_string()),
                ]),
                id: Some(format!("{service}-{request}")),
                time_nanos: Some(
                    *BASE.get_or_init(kiln_model::time::now_nanos) + (request * 2 + index) as i64,
                ),
                ..Default::default()
            };
            from_pprof_bytes(&pprof, context, &Limits::default()).expect("fixture parses")
        })
        .collect()
}

async fn open(dir: &Path) -> (ObjectStorage, Metastore) {
    let storage = ObjectStorage::open(&format!("file://{}", dir.join("blocks").display())).unwrap();
    let metastore = Metastore::open(&format!("sqlite://{}", dir.join("m.db").display()))
        .await
        .unwrap();
    (storage, metastore)
}

/// A fresh directory's block store, metastore and log.
struct Fresh {
    _dir: tempfile::TempDir,
    storage: ObjectStorage,
    metastore: Metastore,
    wal: Wal,
}

impl Fresh {
    fn start(&self) -> (Ingester, tokio::task::JoinHandle<()>) {
        start(&self.storage, &self.metastore, &self.wal)
    }

    async fn datasets(&self) -> Vec<Dataset> {
        datasets(&self.metastore, &self.storage).await
    }
}

async fn fresh() -> Fresh {
    let dir = tempfile::tempdir().unwrap();
    let (storage, metastore) = open(dir.path()).await;
    let wal = Wal::open(dir.path().join("wal")).unwrap();
    Fresh {
        _dir: dir,
        storage,
        metastore,
        wal,
    }
}

/// An ingester logging in `wal`; nothing is flushed by time (only `sync` and shutdown
/// flush).
fn start(
    storage: &ObjectStorage,
    metastore: &Metastore,
    wal: &Wal,
) -> (Ingester, tokio::task::JoinHandle<()>) {
    Ingester::start_with_wal(
        storage.clone(),
        metastore.clone(),
        IngesterConfig {
            segment_interval: std::time::Duration::from_secs(3600),
            ..IngesterConfig::default()
        },
        Some(wal.clone()),
    )
}

/// Every dataset of the tenant, decoded, in (service, block) order.
async fn datasets(metastore: &Metastore, storage: &ObjectStorage) -> Vec<Dataset> {
    common::decoded(metastore, storage, None).await
}

/// Profiles stored, by id (a profile has a row per sample type).
fn profiles(datasets: &[Dataset]) -> usize {
    let ids: std::collections::BTreeSet<&[u8]> = datasets
        .iter()
        .flat_map(|dataset| dataset.profiles.iter().map(|row| &row.id[..]))
        .collect();
    let rows: usize = datasets.iter().map(|dataset| dataset.profiles.len()).sum();
    // Each of the fixture's two sample types once per profile: none stored twice.
    assert_eq!(rows, 2 * ids.len(), "a profile stored more than once");
    ids.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logged_writes_are_acked_first_visible_after_sync_and_recovered_once() {
    let fresh = fresh().await;
    let (ingester, flusher) = fresh.start();
    for index in 0..REQUESTS {
        ingester.write("t", request(index)).await.unwrap();
    }
    assert_eq!(
        profiles(&fresh.datasets().await),
        0,
        "acknowledged from the log, before any segment"
    );
    let leftovers = fresh.wal.leftovers().unwrap();
    assert_eq!(leftovers.len(), 1, "one log file for the open batch");
    assert_eq!(ingester.metrics().wal_records.get(), REQUESTS as u64);
    let syncs = ingester.metrics().wal_syncs.get();
    assert!(
        (1..=REQUESTS as u64).contains(&syncs),
        "{syncs} fdatasyncs for {REQUESTS} records"
    );

    // A crash: the flusher dies with the batch unflushed, and the last append was cut
    // short (never acknowledged, since its sync never ran).
    flusher.abort();
    assert!(flusher.await.unwrap_err().is_cancelled());
    drop(ingester);
    let (_, log_path) = &leftovers[0];
    let log = std::fs::read(log_path).unwrap();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(log_path)
        .unwrap();
    file.write_all(&[0xe8, 0x03, 0, 0, 1, 2, 3, 4, 5, 6, 7])
        .unwrap();
    drop(file);

    let (ingester, flusher) = fresh.start();
    ingester.sync().await;
    let recovered = fresh.datasets().await;
    assert_eq!(
        profiles(&recovered),
        2 * REQUESTS,
        "every logged profile, once"
    );
    assert_eq!(ingester.metrics().wal_recovered.get(), 2 * REQUESTS as u64);
    assert!(
        fresh.wal.leftovers().unwrap().is_empty(),
        "the recovered log is deleted"
    );

    // The same requests written directly, with no log, make the same datasets.
    let direct_dir = tempfile::tempdir().unwrap();
    let (direct_storage, direct_metastore) = open(direct_dir.path()).await;
    let (direct, direct_flusher) = Ingester::start(
        direct_storage.clone(),
        direct_metastore.clone(),
        IngesterConfig::default(),
    );
    direct
        .write("t", (0..REQUESTS).flat_map(request).collect())
        .await
        .unwrap();
    drop(direct);
    direct_flusher.await.unwrap();
    assert_eq!(
        recovered,
        datasets(&direct_metastore, &direct_storage).await,
        "recovered from the log as written directly"
    );

    // The log found again, as a crash between registering its segment and deleting it
    // leaves it: its block is registered, so it is deleted and nothing is written twice.
    drop(ingester);
    flusher.await.unwrap();
    std::fs::write(log_path, &log).unwrap();
    let (ingester, flusher) = fresh.start();
    ingester.sync().await;
    assert_eq!(profiles(&fresh.datasets().await), 2 * REQUESTS);
    assert_eq!(ingester.metrics().wal_recovered.get(), 0);
    assert!(fresh.wal.leftovers().unwrap().is_empty());
    drop(ingester);
    flusher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_cannot_be_logged_is_refused_and_not_staged() {
    let fresh = fresh().await;
    let (ingester, flusher) = fresh.start();
    // The log's directory is gone (a failed or unmounted disk): no file can be created.
    std::fs::remove_dir_all(fresh.wal.dir()).unwrap();
    let err = ingester.write("t", request(0)).await.unwrap_err();
    assert!(
        matches!(&err, IngestError::Store(_)) && err.kind().status() == 503,
        "{err:?}"
    );
    assert!(err.to_string().contains("write-ahead log"), "{err}");
    ingester.sync().await;
    assert_eq!(profiles(&fresh.datasets().await), 0);
    assert_eq!(ingester.metrics().pending_bytes.get(), 0, "nothing staged");

    // Once the directory is back, writes are logged again.
    std::fs::create_dir_all(fresh.wal.dir()).unwrap();
    ingester.write("t", request(1)).await.unwrap();
    ingester.sync().await;
    assert_eq!(profiles(&fresh.datasets().await), 2);
    drop(ingester);
    flusher.await.unwrap();
}

/// A write that arrives while others are on their way is logged as a lone one is, and
/// acknowledged before any segment: when a batch's first write among others was left
/// unlogged, its batch became a group commit flushed at once, and under steady load every
/// batch after it did too (1,853 segments of a few profiles where 2 h of 50 services need
/// a handful; docs/benchmarks.md, "Every write logged").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_among_others_is_logged_and_its_batch_lives_on() {
    let fresh = fresh().await;
    let (ingester, flusher) = fresh.start();
    let metrics = ingester.metrics().clone();

    // Two writes on their way: the first write of a batch is not alone.
    let others = [
        ingester.check_room().unwrap(),
        ingester.check_room().unwrap(),
    ];
    ingester.write("t", request(0)).await.unwrap();
    assert_eq!(
        metrics.wal_records.get(),
        1,
        "a write among others, first in its batch"
    );
    assert_eq!(
        metrics.flushes.get(),
        0,
        "acknowledged from the log, not a segment"
    );
    assert_eq!(profiles(&fresh.datasets().await), 0);

    // Alone, and among others again: the same batch, still no segment.
    ingester.write("t", request(1)).await.unwrap();
    ingester.write("t", request(2)).await.unwrap();
    drop(others);
    assert_eq!(metrics.wal_records.get(), 3);
    assert_eq!(
        metrics.wal_syncs.get(),
        3,
        "one each: every write waited for its own"
    );
    assert_eq!(metrics.flushes.get(), 0, "no flush cut the batch short");
    assert_eq!(profiles(&fresh.datasets().await), 0);

    // A read makes the batch one segment, every profile in it.
    ingester.sync().await;
    assert_eq!(metrics.flushes.get(), 1);
    assert_eq!(profiles(&fresh.datasets().await), 6);
    drop(ingester);
    flusher.await.unwrap();
}

/// Writes made at once share the log's `fdatasync`s: each sync covers every record
/// appended before it, so there are fewer syncs than writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_made_at_once_share_the_logs_syncs() {
    let fresh = fresh().await;
    let (ingester, flusher) = fresh.start();
    let metrics = ingester.metrics().clone();
    let writes: Vec<_> = (0..64)
        .map(|n| {
            let ingester = ingester.clone();
            tokio::spawn(async move { ingester.write("t", request(n)).await })
        })
        .collect();
    for write in writes {
        write.await.unwrap().unwrap();
    }
    assert_eq!(metrics.wal_records.get(), 64);
    assert!(
        metrics.wal_syncs.get() < 64,
        "{} syncs for 64 writes",
        metrics.wal_syncs.get()
    );
    ingester.sync().await;
    assert_eq!(profiles(&fresh.datasets().await), 128);
    drop(ingester);
    flusher.await.unwrap();
}

/// A read waits only for the batches it could list: of its tenant and service, and
/// in its time range. Every read flushing the open batch made one of last hour wait for
/// the fresh batch's flush (docs/benchmarks.md, "Every write logged").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_flushes_only_a_batch_it_could_see() {
    let fresh = fresh().await;
    let (ingester, flusher) = fresh.start();
    let metrics = ingester.metrics().clone();
    ingester.write("t", request(0)).await.unwrap();
    let at = *BASE.get().expect("set by the write");
    let scope =
        |tenant: &str, service: Option<&str>, from_nanos: i64, to_nanos: i64| DatasetQuery {
            tenant: tenant.to_string(),
            service: service.map(str::to_string),
            from_nanos,
            to_nanos,
        };
    let syncer = ingester.syncer();
    for unseen in [
        scope("other", None, i64::MIN, i64::MAX),
        scope("t", Some("elsewhere"), i64::MIN, i64::MAX),
        scope("t", Some("left"), i64::MIN, at - 1),
        // An hour after: later than any profile of the fixture ends.
        scope("t", None, at + 3_600_000_000_000, i64::MAX),
    ] {
        syncer.sync_for(&unseen).await;
        assert_eq!(metrics.flushes.get(), 0, "{unseen:?}");
    }
    assert_eq!(profiles(&fresh.datasets().await), 0);
    // "right" is staged at `at` + 1.
    syncer
        .sync_for(&scope("t", Some("right"), at + 1, at + 1))
        .await;
    assert_eq!(metrics.flushes.get(), 1);
    assert_eq!(profiles(&fresh.datasets().await), 2);
    drop(ingester);
    flusher.await.unwrap();
}

//! The object storage contract, run against every backend: a local directory and a real
//! S3-compatible server on loopback (skipped, saying so, when that cannot be started).

use bytes::Bytes;
use kiln_storage::ObjectStorage;

/// A store for one test, and what keeps it alive.
struct Fixture {
    storage: ObjectStorage,
    /// Opens another store on the same bucket or directory, under a different prefix.
    sibling: Box<dyn Fn(&str) -> ObjectStorage>,
    _dir: Option<tempfile::TempDir>,
}

fn local() -> Option<Fixture> {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    Some(Fixture {
        storage: ObjectStorage::open(&format!("file://{}", root.join("blocks").display())).unwrap(),
        sibling: Box::new(move |prefix| {
            ObjectStorage::open(&format!("file://{}", root.join(prefix).display())).unwrap()
        }),
        _dir: Some(dir),
    })
}

fn s3() -> Option<Fixture> {
    let server = match kiln_testkit::s3() {
        Ok(server) => server,
        Err(reason) => {
            println!("skipped: {reason}");
            return None;
        }
    };
    let url = server.fresh_bucket();
    let env = server.env();
    let bucket = url.trim_end_matches("/kiln").to_string();
    Some(Fixture {
        storage: ObjectStorage::open_with(&url, &env).unwrap(),
        sibling: Box::new(move |prefix| {
            ObjectStorage::open_with(&format!("{bucket}/{prefix}"), &env).unwrap()
        }),
        _dir: None,
    })
}

macro_rules! object_storage_suite {
    ($backend:ident) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn put_get_list_and_delete() {
                let Some(fixture) = super::$backend() else {
                    return;
                };
                let store = &fixture.storage;
                let payload =
                    Bytes::from((0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
                store
                    .put("segments/a.parquet", payload.clone())
                    .await
                    .unwrap();
                store
                    .put("segments/b.parquet", Bytes::from_static(b"b"))
                    .await
                    .unwrap();
                store
                    .put("blocks/c.parquet", Bytes::from_static(b"c"))
                    .await
                    .unwrap();
                assert_eq!(store.get("segments/a.parquet").await.unwrap(), payload);

                assert_eq!(
                    store.list_keys("segments").await.unwrap(),
                    ["segments/a.parquet", "segments/b.parquet"]
                );
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as i64;
                for (_, modified_ms) in store.list("blocks").await.unwrap() {
                    assert!(
                        (modified_ms - now_ms).abs() < 120_000,
                        "modified {modified_ms} vs now {now_ms}"
                    );
                }

                store.delete("segments/a.parquet").await.unwrap();
                assert!(store.get("segments/a.parquet").await.is_err());
                // Deleting what is already gone is not an error: deletions are retried.
                store.delete("segments/a.parquet").await.unwrap();
                assert_eq!(store.list("segments").await.unwrap().len(), 1);
                assert!(store.list("nothing-here").await.unwrap().is_empty());
            }

            /// Compaction reads its inputs on a thread of its own, off the runtime; what it
            /// reads there must be what the async read returns.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_range_read_off_the_runtime_matches_the_async_read() {
                let Some(fixture) = super::$backend() else {
                    return;
                };
                let store = fixture.storage.clone();
                let payload =
                    Bytes::from((0..200_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
                store
                    .put("blocks/r.parquet", payload.clone())
                    .await
                    .unwrap();
                let ranges = [0..100u64, 1_000..150_000, 199_990..200_000];
                let runtime = tokio::runtime::Handle::current();
                let read = std::thread::spawn(move || {
                    let ranges = ranges.map(|range| {
                        store
                            .get_ranges_blocking(&runtime, "blocks/r.parquet", &[range])
                            .unwrap()
                            .remove(0)
                    });
                    let missing = store
                        .get_ranges_blocking(&runtime, "blocks/missing.parquet", &[0..10])
                        .map(|_| ());
                    let past_end = store
                        .get_ranges_blocking(&runtime, "blocks/r.parquet", &[199_990..200_010])
                        .map(|bytes| bytes[0].len());
                    // Several at once (joined into fewer requests where remote) read the same.
                    let together = store
                        .get_ranges_blocking(
                            &runtime,
                            "blocks/r.parquet",
                            &[0..100u64, 1_000..150_000, 199_990..200_000],
                        )
                        .unwrap();
                    assert_eq!(together, ranges);
                    (ranges, (missing, past_end))
                });
                let (read, (missing, past_end)) =
                    tokio::task::spawn_blocking(move || read.join().unwrap())
                        .await
                        .unwrap();
                for (range, bytes) in [0..100usize, 1_000..150_000, 199_990..200_000]
                    .into_iter()
                    .zip(read)
                {
                    assert_eq!(bytes, payload.slice(range.clone()), "range {range:?}");
                }
                assert!(missing.is_err(), "a missing object is an error");
                // A range running past the end gives the bytes there are, as S3 does; the
                // caller checks the length (`ranged::ColumnFetch::partial`).
                assert!(matches!(past_end, Ok(10)), "{past_end:?}");
            }

            /// The write path stores a segment from the thread that encoded it, off the
            /// runtime: a local put runs there, a remote one is driven on the runtime, and
            /// either way the object is then there whole, as an async put leaves it.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_put_off_the_runtime_stores_what_the_async_put_does() {
                let Some(fixture) = super::$backend() else {
                    return;
                };
                let store = fixture.storage.clone();
                let payload =
                    Bytes::from((0..300_000u32).map(|i| (i % 241) as u8).collect::<Vec<_>>());
                let runtime = tokio::runtime::Handle::current();
                let (writer, written) = (store.clone(), payload.clone());
                let put = std::thread::spawn(move || {
                    writer.put_blocking(&runtime, "segments/p.parquet", written.clone())?;
                    // Replacing an object replaces it whole.
                    writer.put_blocking(
                        &runtime,
                        "segments/q.parquet",
                        Bytes::from_static(b"old"),
                    )?;
                    writer.put_blocking(&runtime, "segments/q.parquet", written.slice(..10))
                });
                tokio::task::spawn_blocking(move || put.join().unwrap())
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(store.get("segments/p.parquet").await.unwrap(), payload);
                assert_eq!(
                    store.get("segments/q.parquet").await.unwrap(),
                    payload.slice(..10)
                );
                // Nothing else is left behind (a local put writes a temporary file first).
                assert_eq!(
                    store.list_keys("segments").await.unwrap(),
                    ["segments/p.parquet", "segments/q.parquet"]
                );
            }

            #[tokio::test]
            async fn a_prefix_isolates_one_deployment_from_another() {
                let Some(fixture) = super::$backend() else {
                    return;
                };
                let other = (fixture.sibling)("other");
                fixture
                    .storage
                    .put("blocks/x.parquet", Bytes::from_static(b"mine"))
                    .await
                    .unwrap();
                other
                    .put("blocks/x.parquet", Bytes::from_static(b"theirs"))
                    .await
                    .unwrap();
                assert_eq!(
                    fixture.storage.get("blocks/x.parquet").await.unwrap(),
                    Bytes::from_static(b"mine")
                );
                assert_eq!(
                    other.get("blocks/x.parquet").await.unwrap(),
                    Bytes::from_static(b"theirs")
                );
                assert_eq!(other.list("blocks").await.unwrap().len(), 1);
            }
        }
    };
}

object_storage_suite!(local);
object_storage_suite!(s3);

#[test]
fn unknown_schemes_and_settings_are_clear_errors() {
    let err = ObjectStorage::open("ftp://host/x").unwrap_err().to_string();
    assert!(err.contains("expected file:///path, s3://"), "{err}");
    let err = ObjectStorage::open("s3:///prefix").unwrap_err().to_string();
    assert!(err.contains("names no bucket"), "{err}");
    let err = ObjectStorage::open_with("s3://b/p", &[("AWS_NO_SUCH".into(), "1".into())])
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown S3 setting AWS_NO_SUCH"), "{err}");
}

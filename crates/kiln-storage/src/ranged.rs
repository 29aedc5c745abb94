//! Reading one dataset of a block without downloading the block.
//!
//! A segment holds one dataset per (tenant, service) of a flush, and compaction merges
//! per (tenant, service). Fetching the whole segment for each of its datasets made
//! compaction read each segment once per service in it (18× the ingested bytes with many
//! services; on S3 every byte and GET is billed). Instead a reader fetches the block's
//! tail once ([`BlockTail`]: the Parquet footer, which locates every dataset's column
//! chunks), keeps it, and then fetches each dataset's own byte range. Across all the
//! datasets of a block that reads each byte about once.

use std::ops::Range;

use bytes::{Buf, Bytes};
use std::sync::Arc;

use parquet::file::metadata::{ParquetMetaData, ParquetMetaDataReader};
use parquet::file::reader::{ChunkReader, Length};

use crate::format::{decode_dataset_from, decode_row_group, Projection};
use crate::{Dataset, ObjectStorage, StorageError};

/// Parquet's trailer: a 4-byte little-endian footer length and the `PAR1` magic.
const TRAILER: u64 = 8;
/// First guess at the tail to fetch; a footer larger than this costs a second read.
const TAIL_GUESS: u64 = 64 << 10;

/// The end of a block, holding at least its footer, and where each dataset's bytes are.
#[derive(Debug, Clone)]
pub struct BlockTail {
    /// Offset of `bytes` in the block.
    start: u64,
    bytes: Bytes,
    block_len: u64,
    /// Byte range of each dataset (row group), in block offsets.
    datasets: Vec<Range<u64>>,
    /// The parsed footer, kept: a segment's footer describes every service's dataset,
    /// and parsing it again for each one made compaction quadratic in the services.
    metadata: Arc<ParquetMetaData>,
}

impl BlockTail {
    /// Parses the tail of a block of `block_len` bytes, `bytes` being its last bytes.
    /// `Ok(Err(n))` when `bytes` is too short to hold the footer: fetch the last `n`.
    pub fn parse(bytes: Bytes, block_len: u64) -> Result<Result<BlockTail, u64>, StorageError> {
        let len = bytes.len() as u64;
        if len < TRAILER || len > block_len {
            return Err(StorageError::Corrupt(format!(
                "block tail of {len} bytes for a block of {block_len}"
            )));
        }
        let trailer = &bytes[bytes.len() - TRAILER as usize..];
        if &trailer[4..] != b"PAR1" {
            return Err(StorageError::Corrupt("block does not end in PAR1".into()));
        }
        let footer_len = u64::from(u32::from_le_bytes([
            trailer[0], trailer[1], trailer[2], trailer[3],
        ]));
        let needed = footer_len + TRAILER;
        if needed > block_len {
            return Err(StorageError::Corrupt(format!(
                "footer of {footer_len} bytes in a block of {block_len}"
            )));
        }
        if needed > len {
            return Ok(Err(needed));
        }
        let footer = &bytes[(len - needed) as usize..(len - TRAILER) as usize];
        let metadata = ParquetMetaDataReader::decode_metadata(footer)?;
        let datasets = metadata
            .row_groups()
            .iter()
            .map(|group| {
                let mut range: Option<Range<u64>> = None;
                for column in group.columns() {
                    // `byte_range()` asserts these are not negative: a corrupt footer
                    // would panic there instead of being refused.
                    let start = column
                        .dictionary_page_offset()
                        .unwrap_or(column.data_page_offset());
                    let length = column.compressed_size();
                    let (Ok(start), Ok(length)) = (u64::try_from(start), u64::try_from(length))
                    else {
                        return Err(StorageError::Corrupt(format!(
                            "column chunk at {start}+{length}: negative offset or size"
                        )));
                    };
                    let end = start.checked_add(length).filter(|end| *end <= block_len);
                    let Some(end) = end else {
                        return Err(StorageError::Corrupt(format!(
                            "column chunk at {start}+{length} is past the block's {block_len} bytes"
                        )));
                    };
                    range = Some(match range {
                        None => start..end,
                        Some(range) => range.start.min(start)..range.end.max(end),
                    });
                }
                Ok(range.unwrap_or(0..0))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Ok(BlockTail {
            start: block_len - len,
            bytes,
            block_len,
            datasets,
            metadata: Arc::new(metadata),
        }))
    }

    /// Where dataset `row_group` lies in the block.
    pub fn dataset_range(&self, row_group: usize) -> Result<Range<u64>, StorageError> {
        self.datasets.get(row_group).cloned().ok_or_else(|| {
            StorageError::Corrupt(format!(
                "row group {row_group} out of range ({})",
                self.datasets.len()
            ))
        })
    }

    /// The parsed footer, for [`crate::format::decode_row_group`].
    pub fn metadata(&self) -> &ParquetMetaData {
        &self.metadata
    }

    /// How many datasets the block holds.
    pub fn dataset_count(&self) -> usize {
        self.datasets.len()
    }

    /// Offset in the block of the tail's first byte, and the tail's bytes.
    pub fn bytes(&self) -> (u64, &Bytes) {
        (self.start, &self.bytes)
    }

    /// Memory held, for a cache's budget.
    pub fn size_bytes(&self) -> usize {
        self.bytes.len()
            + self.datasets.len() * std::mem::size_of::<Range<u64>>()
            + self.metadata.memory_size()
    }
}

/// Block tails by object key, oldest evicted first, within a memory budget. A segment's
/// tail locates every service's dataset in it: the compactor's jobs for the services of
/// a segment, and the queries reading several of its datasets, fetch and parse it once.
pub struct TailCache {
    tails: std::collections::HashMap<String, Arc<BlockTail>>,
    order: std::collections::VecDeque<String>,
    bytes: usize,
    capacity: usize,
}

impl TailCache {
    pub fn new(capacity: usize) -> Self {
        TailCache {
            tails: Default::default(),
            order: Default::default(),
            bytes: 0,
            capacity,
        }
    }

    pub fn get(&self, key: &str) -> Option<Arc<BlockTail>> {
        self.tails.get(key).cloned()
    }

    /// The tail of object `key`, from `cache` or fetched and kept there, with the bytes
    /// fetched (0 when cached). The cache holds only whole entries, so a lock poisoned by
    /// a panic elsewhere still guards a consistent map and is used as is.
    pub async fn get_or_read(
        cache: &std::sync::Mutex<TailCache>,
        storage: &ObjectStorage,
        key: &str,
    ) -> Result<(Arc<BlockTail>, u64), StorageError> {
        let lock = || {
            cache
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        };
        if let Some(tail) = lock().get(key) {
            return Ok((tail, 0));
        }
        let (tail, fetched) = read_tail(storage, key).await?;
        let tail = Arc::new(tail);
        lock().insert(key, tail.clone());
        Ok((tail, fetched))
    }

    pub fn insert(&mut self, key: &str, tail: Arc<BlockTail>) {
        if self.tails.contains_key(key) {
            return;
        }
        self.bytes += tail.size_bytes();
        self.tails.insert(key.to_string(), tail);
        self.order.push_back(key.to_string());
        while self.bytes > self.capacity {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(tail) = self.tails.remove(&oldest) {
                self.bytes -= tail.size_bytes();
            }
        }
    }
}

/// Fetches a block's tail: one suffix read, or two when the footer is larger than a guess.
/// Returns the tail and the bytes fetched.
pub async fn read_tail(
    storage: &ObjectStorage,
    key: &str,
) -> Result<(BlockTail, u64), StorageError> {
    let (bytes, block_len) = storage.get_suffix(key, TAIL_GUESS).await?;
    let mut fetched = bytes.len() as u64;
    match BlockTail::parse(bytes, block_len)? {
        Ok(tail) => Ok((tail, fetched)),
        Err(needed) => {
            let (bytes, block_len) = storage.get_suffix(key, needed).await?;
            fetched += bytes.len() as u64;
            let tail = BlockTail::parse(bytes, block_len)?.map_err(|needed| {
                StorageError::Corrupt(format!("block {key} changed while read ({needed})"))
            })?;
            Ok((tail, fetched))
        }
    }
}

/// Fetches the bytes of dataset `row_group` that `tail` does not already hold. Returns
/// them with the bytes fetched.
pub async fn read_dataset_bytes(
    storage: &ObjectStorage,
    key: &str,
    tail: &BlockTail,
    row_group: usize,
) -> Result<(PartialBlock, u64), StorageError> {
    let fetched = match dataset_fetch_range(tail, row_group)? {
        Some(range) => storage.get_range(key, range).await?,
        None => Bytes::new(),
    };
    let len = fetched.len() as u64;
    Ok((dataset_partial(key, tail, row_group, fetched)?, len))
}

/// The bytes of dataset `row_group` that `tail` does not hold, if any: what
/// [`read_dataset_bytes`] fetches, for a caller that fetches them its own way.
pub fn dataset_fetch_range(
    tail: &BlockTail,
    row_group: usize,
) -> Result<Option<Range<u64>>, StorageError> {
    let range = tail.dataset_range(row_group)?;
    Ok((range.start < tail.start).then(|| range.start..range.end.min(tail.start)))
}

/// The parts to decode dataset `row_group` of object `key` from, given the bytes fetched
/// for [`dataset_fetch_range`] (empty when there was nothing to fetch).
pub fn dataset_partial(
    key: &str,
    tail: &BlockTail,
    row_group: usize,
    fetched: Bytes,
) -> Result<PartialBlock, StorageError> {
    let range = tail.dataset_range(row_group)?;
    let expected = dataset_fetch_range(tail, row_group)?.map_or(0, |range| range.end - range.start);
    if fetched.len() as u64 != expected {
        return Err(StorageError::Corrupt(format!(
            "ranged read of {key} returned {} bytes, not {expected}",
            fetched.len()
        )));
    }
    Ok(dataset_parts(tail, range, fetched))
}

/// The parts to decode a dataset from: its bytes before the tail (`before_tail`, fetched)
/// and the tail. When the dataset runs on into the tail, its bytes are joined into one
/// part: the Parquet reader streams a page header from one offset and cannot cross from
/// one part into the next.
fn dataset_parts(tail: &BlockTail, range: Range<u64>, before_tail: Bytes) -> PartialBlock {
    let mut parts = Vec::with_capacity(2);
    if range.start < tail.start && range.end > tail.start {
        let overlap = (range.end - tail.start).min(tail.bytes.len() as u64) as usize;
        let mut joined = Vec::with_capacity(before_tail.len() + overlap);
        joined.extend_from_slice(&before_tail);
        joined.extend_from_slice(&tail.bytes[..overlap]);
        parts.push((range.start, Bytes::from(joined)));
    } else {
        parts.push((range.start, before_tail));
    }
    parts.push((tail.start, tail.bytes.clone()));
    PartialBlock {
        block_len: tail.block_len,
        parts,
        metadata: Some(tail.metadata.clone()),
    }
}

/// Decodes dataset `row_group` from the parts [`read_dataset_bytes`] fetched.
pub fn decode_partial(
    block: PartialBlock,
    row_group: usize,
    projection: Projection,
) -> Result<Dataset, StorageError> {
    match block.metadata.clone() {
        Some(metadata) => decode_row_group(block, &metadata, row_group, projection),
        None => decode_dataset_from(block, row_group, projection),
    }
}

/// Some byte ranges of a block, enough for the Parquet reader to decode one dataset. A
/// read outside them is an error, not a silent zero fill.
#[derive(Debug, Clone)]
pub struct PartialBlock {
    block_len: u64,
    /// (offset in the block, bytes); may be empty or adjacent.
    parts: Vec<(u64, Bytes)>,
    /// The block's footer, when its tail was parsed already.
    metadata: Option<Arc<ParquetMetaData>>,
}

impl PartialBlock {
    /// A block of `block_len` bytes of which only `parts` (offset, bytes) are at hand.
    pub fn new(block_len: u64, parts: Vec<(u64, Bytes)>) -> Self {
        PartialBlock {
            block_len,
            parts,
            metadata: None,
        }
    }

    /// The bytes from `start` to the end of the part holding it.
    fn from(&self, start: u64) -> parquet::errors::Result<Bytes> {
        for (offset, bytes) in &self.parts {
            if start >= *offset && start < offset + bytes.len() as u64 {
                return Ok(bytes.slice((start - offset) as usize..));
            }
        }
        Err(parquet::errors::ParquetError::General(format!(
            "offset {start} of the block was not fetched"
        )))
    }
}

impl Length for PartialBlock {
    fn len(&self) -> u64 {
        self.block_len
    }
}

impl ChunkReader for PartialBlock {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(self.from(start)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        let bytes = self.from(start)?;
        if bytes.len() < length {
            // A read across two adjacent parts (the dataset's bytes, then the tail's).
            let mut joined = Vec::with_capacity(length);
            let mut at = start;
            while joined.len() < length {
                let part = self.from(at)?;
                let take = part.len().min(length - joined.len());
                joined.extend_from_slice(&part[..take]);
                at += take as u64;
            }
            return Ok(Bytes::from(joined));
        }
        Ok(bytes.slice(..length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{decode_dataset, encode_block};
    use crate::DatasetBuilder;

    /// A block of one small CPU dataset per service, `main;<service>` with 10 ns.
    fn block_of(services: &[&str]) -> Bytes {
        let datasets: Vec<Dataset> = services
            .iter()
            .map(|service| {
                let mut builder = DatasetBuilder::new("t", service);
                crate::testing::add_cpu_profile(
                    &mut builder,
                    service,
                    &[("service_name", service)],
                    1_000,
                    &[(&[service, "main"], 10, &[])],
                );
                builder.finish()
            })
            .collect();
        Bytes::from(encode_block(&datasets).unwrap())
    }

    #[test]
    fn every_dataset_decodes_from_the_tail_and_its_own_range() {
        let services = ["a", "b", "c", "d"];
        let block = block_of(&services);
        let block_len = block.len() as u64;
        // A tail too short for the footer asks for the right length.
        let short = block.slice(block.len() - 16..);
        let needed = BlockTail::parse(short, block_len).unwrap().unwrap_err();
        let tail = BlockTail::parse(block.slice(block.len() - needed as usize..), block_len)
            .unwrap()
            .unwrap();
        let mut previous_end = 4; // after the leading PAR1
        for (index, service) in services.iter().enumerate() {
            let range = tail.dataset_range(index).unwrap();
            // Each dataset's own bytes: disjoint, in order, before the footer.
            assert!(
                range.start >= previous_end && range.end > range.start,
                "{range:?}"
            );
            assert!(range.end <= block_len - needed);
            previous_end = range.end;
            let partial = PartialBlock {
                block_len,
                parts: vec![
                    (
                        range.start,
                        block.slice(range.start as usize..range.end as usize),
                    ),
                    (tail.start, tail.bytes.clone()),
                ],
                metadata: None,
            };
            let whole = decode_dataset(&block, index, Projection::ALL).unwrap();
            // Decoded with the footer parsed again, and with the tail's parsed footer.
            let with_footer = PartialBlock {
                metadata: Some(tail.metadata.clone()),
                ..partial.clone()
            };
            let dataset = decode_partial(partial, index, Projection::ALL).unwrap();
            assert_eq!(dataset.service, *service);
            assert_eq!(dataset, whole);
            let dataset = decode_partial(with_footer, index, Projection::ALL).unwrap();
            assert_eq!(dataset, whole);
        }
        assert!(tail.dataset_range(services.len()).is_err());
        // A part that was not fetched is an error, not zeros.
        let range = tail.dataset_range(0).unwrap();
        let missing = PartialBlock {
            block_len,
            parts: vec![(tail.start, tail.bytes.clone())],
            metadata: Some(tail.metadata.clone()),
        };
        if range.end <= tail.start {
            assert!(decode_partial(missing.clone(), 0, Projection::ALL).is_err());
            let missing = PartialBlock {
                metadata: None,
                ..missing
            };
            assert!(decode_partial(missing, 0, Projection::ALL).is_err());
        }
    }

    /// Wherever the fetched tail begins, even inside a dataset (a segment with one big
    /// dataset and a 64 KiB tail), the dataset decodes: its bytes are joined across the cut.
    #[test]
    fn a_dataset_cut_by_the_tail_decodes_at_every_cut() {
        let services = ["a", "b"];
        let block = block_of(&services);
        let block_len = block.len() as u64;
        let exact = BlockTail::parse(block.slice(block.len() - 16..), block_len)
            .unwrap()
            .unwrap_err();
        let whole_tail = BlockTail::parse(block.slice(block.len() - exact as usize..), block_len)
            .unwrap()
            .unwrap();
        for index in 0..services.len() {
            let range = whole_tail.dataset_range(index).unwrap();
            let whole = decode_dataset(&block, index, Projection::ALL).unwrap();
            for cut in range.start..=range.end {
                let tail = BlockTail::parse(block.slice(cut as usize..), block_len)
                    .unwrap()
                    .unwrap();
                // What a caller fetching on its own thread is told to fetch, and given.
                let fetched =
                    dataset_fetch_range(&tail, index)
                        .unwrap()
                        .map_or_else(Bytes::new, |fetch| {
                            assert_eq!(fetch, range.start..cut);
                            block.slice(fetch.start as usize..fetch.end as usize)
                        });
                if !fetched.is_empty() {
                    let short = fetched.slice(1..);
                    assert!(dataset_partial("k", &tail, index, short).is_err());
                }
                let partial = dataset_partial("k", &tail, index, fetched).unwrap();
                let dataset = decode_partial(partial, index, Projection::ALL)
                    .unwrap_or_else(|err| panic!("dataset {index} cut at {cut}: {err}"));
                assert_eq!(dataset, whole, "dataset {index} cut at {cut}");
            }
        }
    }

    #[test]
    fn datasets_decoded_one_at_a_time_from_one_footer_match_each_decoded_alone() {
        let block = block_of(&["a", "b", "c", "d"]);
        let services =
            crate::format::decode_datasets_each(&block, &[3, 1], Projection::ALL, |dataset| {
                let alone = decode_dataset(&block, dataset_index(&dataset), Projection::ALL);
                assert_eq!(dataset, alone.unwrap());
                dataset.service
            })
            .unwrap();
        assert_eq!(services, ["d", "b"]);
        let err = crate::format::decode_datasets_each(&block, &[0, 4], Projection::INDEX, |_| ())
            .unwrap_err()
            .to_string();
        assert!(err.contains("row group 4 out of range (4)"), "{err}");
    }

    fn dataset_index(dataset: &Dataset) -> usize {
        ["a", "b", "c", "d"]
            .iter()
            .position(|service| *service == dataset.service)
            .unwrap()
    }

    #[test]
    fn garbage_tails_are_refused() {
        assert!(BlockTail::parse(Bytes::from_static(b"not parquet at all"), 18).is_err());
        assert!(BlockTail::parse(Bytes::from_static(b"\xff\xff\xff\x7fPAR1"), 8).is_err());
        assert!(BlockTail::parse(Bytes::from_static(b"PAR1"), 4).is_err());
    }
}

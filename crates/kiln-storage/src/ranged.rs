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

use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData, ParquetMetaDataReader};
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
                    let chunk = chunk_range(column, block_len)?;
                    range = Some(match range {
                        None => chunk,
                        Some(range) => range.start.min(chunk.start)..range.end.max(chunk.end),
                    });
                }
                Ok(range.unwrap_or(0..0))
            })
            .collect::<Result<Vec<_>, StorageError>>()?;
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

/// Where a column chunk lies in a block of `block_len` bytes. Parquet's `byte_range()`
/// asserts the offset and size are not negative: a corrupt footer would panic there
/// instead of being refused.
fn chunk_range(column: &ColumnChunkMetaData, block_len: u64) -> Result<Range<u64>, StorageError> {
    let start = column
        .dictionary_page_offset()
        .unwrap_or(column.data_page_offset());
    let length = column.compressed_size();
    let (Ok(start), Ok(length)) = (u64::try_from(start), u64::try_from(length)) else {
        return Err(StorageError::Corrupt(format!(
            "column chunk at {start}+{length}: negative offset or size"
        )));
    };
    match start.checked_add(length).filter(|end| *end <= block_len) {
        Some(end) => Ok(start..end),
        None => Err(StorageError::Corrupt(format!(
            "column chunk at {start}+{length} is past the block's {block_len} bytes"
        ))),
    }
}

/// The column chunks of one dataset that a decode with a [`Projection`] may read, for a
/// reader that fetches only those: the regression watcher reads a dataset's strings,
/// series and profile rows (a quarter of a segment's bytes, a twelfth of a compacted
/// block's), thousands of datasets a minute under load, and fetched each whole object
/// for them.
#[derive(Debug, Clone)]
pub struct ColumnFetch {
    /// The wanted chunks, adjacent ones joined, in block order.
    chunks: Vec<Range<u64>>,
    /// Where the tail the fetch was planned against begins; bytes from there on are in it.
    tail_start: u64,
}

/// Plans the fetch of dataset `row_group`'s column chunks that `projection` may read.
pub fn column_fetch(
    tail: &BlockTail,
    row_group: usize,
    projection: Projection,
) -> Result<ColumnFetch, StorageError> {
    let group = tail.metadata.row_groups().get(row_group).ok_or_else(|| {
        StorageError::Corrupt(format!(
            "row group {row_group} out of range ({})",
            tail.datasets.len()
        ))
    })?;
    let mut wanted = group
        .columns()
        .iter()
        .enumerate()
        .filter(|(index, _)| projection.may_read(*index))
        .map(|(_, column)| chunk_range(column, tail.block_len))
        .collect::<Result<Vec<_>, _>>()?;
    wanted.sort_by_key(|range| range.start);
    let mut chunks: Vec<Range<u64>> = Vec::with_capacity(wanted.len());
    for range in wanted {
        match chunks.last_mut() {
            Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
            _ => chunks.push(range),
        }
    }
    Ok(ColumnFetch {
        chunks,
        tail_start: tail.start,
    })
}

impl ColumnFetch {
    /// The byte ranges to fetch, in order: the wanted chunks' bytes before the tail.
    pub fn ranges(&self) -> Vec<Range<u64>> {
        self.chunks
            .iter()
            .filter(|chunk| chunk.start < self.tail_start)
            .map(|chunk| chunk.start..chunk.end.min(self.tail_start))
            .collect()
    }

    /// The parts to decode the dataset from, given the bytes fetched for each of
    /// [`ColumnFetch::ranges`], in order, and the tail the fetch was planned against. A
    /// chunk that runs on into the tail is joined with the tail's bytes (the Parquet reader
    /// cannot cross from one part into the next); a column not fetched is an error when
    /// read, not zeros. With [`Projection::ALL`] this is the whole dataset, as compaction
    /// and queries read it.
    pub fn partial(
        &self,
        key: &str,
        tail: &BlockTail,
        fetched: Vec<Bytes>,
    ) -> Result<PartialBlock, StorageError> {
        if tail.start != self.tail_start {
            return Err(StorageError::Corrupt(format!(
                "ranged read of {key}: planned against another tail of the block"
            )));
        }
        let ranges = self.ranges();
        if fetched.len() != ranges.len() {
            return Err(StorageError::Corrupt(format!(
                "ranged read of {key}: {} parts for {} ranges",
                fetched.len(),
                ranges.len()
            )));
        }
        let mut parts = Vec::with_capacity(fetched.len() + 1);
        // `ranges` are the chunks starting before the tail, a prefix of them in order.
        for ((chunk, range), bytes) in self.chunks.iter().zip(&ranges).zip(fetched) {
            let expected = range.end - range.start;
            if bytes.len() as u64 != expected {
                return Err(StorageError::Corrupt(format!(
                    "ranged read of {key} at {} returned {} bytes, not {expected}",
                    range.start,
                    bytes.len()
                )));
            }
            parts.push(part_before_tail(tail, chunk, bytes));
        }
        Ok(with_tail(tail, parts))
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

/// Fetches the bytes of dataset `row_group` that `tail` does not already hold: its
/// [`column_fetch`] with every column. Returns them with the bytes fetched.
pub async fn read_dataset_bytes(
    storage: &ObjectStorage,
    key: &str,
    tail: &BlockTail,
    row_group: usize,
) -> Result<(PartialBlock, u64), StorageError> {
    let plan = column_fetch(tail, row_group, Projection::ALL)?;
    let mut fetched = Vec::new();
    for range in plan.ranges() {
        fetched.push(storage.get_range(key, range).await?);
    }
    let len = fetched.iter().map(|bytes| bytes.len() as u64).sum();
    Ok((plan.partial(key, tail, fetched)?, len))
}

/// The part (offset, bytes) for `range`, given its bytes before the tail (`fetched`). When
/// the range runs on into the tail, the tail's bytes are joined on: the Parquet reader
/// streams a page header from one offset and cannot cross from one part into the next.
fn part_before_tail(tail: &BlockTail, range: &Range<u64>, fetched: Bytes) -> (u64, Bytes) {
    if range.start < tail.start && range.end > tail.start {
        let overlap = (range.end - tail.start).min(tail.bytes.len() as u64) as usize;
        let mut joined = Vec::with_capacity(fetched.len() + overlap);
        joined.extend_from_slice(&fetched);
        joined.extend_from_slice(&tail.bytes[..overlap]);
        (range.start, Bytes::from(joined))
    } else {
        (range.start, fetched)
    }
}

/// `parts` and the tail, with the tail's parsed footer.
fn with_tail(tail: &BlockTail, mut parts: Vec<(u64, Bytes)>) -> PartialBlock {
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

    /// [`block_of`] and its tail of exactly the footer.
    fn block_and_footer(services: &[&str]) -> (Bytes, BlockTail) {
        let block = block_of(services);
        let block_len = block.len() as u64;
        let needed = BlockTail::parse(block.slice(block.len() - 16..), block_len)
            .unwrap()
            .unwrap_err();
        let tail = BlockTail::parse(block.slice(block.len() - needed as usize..), block_len)
            .unwrap()
            .unwrap();
        (block, tail)
    }

    /// Wherever the fetched tail begins, even inside a dataset (a segment with one big
    /// dataset and a 64 KiB tail), the dataset decodes: its bytes are joined across the cut.
    #[test]
    fn a_dataset_cut_by_the_tail_decodes_at_every_cut() {
        let services = ["a", "b"];
        let (block, whole_tail) = block_and_footer(&services);
        let block_len = block.len() as u64;
        for index in 0..services.len() {
            let range = whole_tail.dataset_range(index).unwrap();
            let whole = decode_dataset(&block, index, Projection::ALL).unwrap();
            for cut in range.start..=range.end {
                let tail = BlockTail::parse(block.slice(cut as usize..), block_len)
                    .unwrap()
                    .unwrap();
                // Every column: the dataset's bytes before the cut, in one range.
                let plan = column_fetch(&tail, index, Projection::ALL).unwrap();
                let ranges = plan.ranges();
                let expected = (cut > range.start).then_some(range.start..cut);
                assert_eq!(ranges, expected.into_iter().collect::<Vec<_>>());
                let fetched: Vec<Bytes> = ranges
                    .iter()
                    .map(|r| block.slice(r.start as usize..r.end as usize))
                    .collect();
                if let Some(first) = fetched.first() {
                    let short = vec![first.slice(1..)];
                    assert!(plan.partial("k", &tail, short).is_err());
                }
                let partial = plan.partial("k", &tail, fetched).unwrap();
                let dataset = decode_partial(partial, index, Projection::ALL)
                    .unwrap_or_else(|err| panic!("dataset {index} cut at {cut}: {err}"));
                assert_eq!(dataset, whole, "dataset {index} cut at {cut}");
            }
        }
    }

    /// Fetching only the chunks a projection reads decodes the same dataset as the whole
    /// block, wherever the tail begins, and fetches less than the dataset's bytes where
    /// the projection leaves tables out.
    #[test]
    fn a_projections_columns_alone_decode_as_the_whole_block_at_every_cut() {
        let services = ["a", "b", "c"];
        let (block, whole_tail) = block_and_footer(&services);
        let block_len = block.len() as u64;
        let needed = block_len - whole_tail.bytes().0;
        for projection in [Projection::INDEX, Projection::SUMMED, Projection::ALL] {
            for index in 0..services.len() {
                let range = whole_tail.dataset_range(index).unwrap();
                let whole = decode_dataset(&block, index, projection).unwrap();
                let planned = column_fetch(&whole_tail, index, projection).unwrap();
                let fetched: u64 = planned.ranges().iter().map(|r| r.end - r.start).sum();
                if projection == Projection::ALL {
                    assert_eq!(fetched, range.end - range.start);
                } else {
                    assert!(fetched < range.end - range.start, "{projection:?}");
                }
                for cut in range.start..=range.end {
                    let tail = BlockTail::parse(block.slice(cut as usize..), block_len)
                        .unwrap()
                        .unwrap();
                    let plan = column_fetch(&tail, index, projection).unwrap();
                    let parts: Vec<Bytes> = plan
                        .ranges()
                        .iter()
                        .map(|r| block.slice(r.start as usize..r.end as usize))
                        .collect();
                    if let Some(first) = parts.first().filter(|part| !part.is_empty()) {
                        let mut short = parts.clone();
                        short[0] = first.slice(1..);
                        assert!(plan.partial("k", &tail, short).is_err());
                    }
                    let partial = plan.partial("k", &tail, parts).unwrap();
                    let dataset = decode_partial(partial, index, projection)
                        .unwrap_or_else(|err| panic!("dataset {index} cut at {cut}: {err}"));
                    assert_eq!(
                        dataset, whole,
                        "{projection:?}, dataset {index} cut at {cut}"
                    );
                }
            }
        }
        // A plan is for the tail it was made against.
        let other = BlockTail::parse(block.slice(block.len() - needed as usize - 1..), block_len)
            .unwrap()
            .unwrap();
        let plan = column_fetch(&whole_tail, 0, Projection::INDEX).unwrap();
        let parts: Vec<Bytes> = plan
            .ranges()
            .iter()
            .map(|r| block.slice(r.start as usize..r.end as usize))
            .collect();
        assert!(plan.partial("k", &whole_tail, parts.clone()).is_ok());
        assert!(plan.partial("k", &other, parts).is_err());
        assert!(column_fetch(&whole_tail, 3, Projection::INDEX).is_err());
    }

    #[test]
    fn garbage_tails_are_refused() {
        assert!(BlockTail::parse(Bytes::from_static(b"not parquet at all"), 18).is_err());
        assert!(BlockTail::parse(Bytes::from_static(b"\xff\xff\xff\x7fPAR1"), 8).is_err());
        assert!(BlockTail::parse(Bytes::from_static(b"PAR1"), 4).is_err());
    }
}

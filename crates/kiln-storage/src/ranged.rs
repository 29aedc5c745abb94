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

use parquet::basic::{Compression, Encoding};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::{
    ColumnChunkMetaData, ParquetMetaData, ParquetMetaDataReader, RowGroupMetaData,
};
use parquet::file::reader::{ChunkReader, Length};
use parquet::schema::types::SchemaDescPtr;

use crate::format::{
    block_writer, check_version, decode_dataset_from, decode_row_group, BlockEncoding, Projection,
    COLUMN_COUNT,
};
use crate::{Dataset, ObjectStorage, StorageError};

/// Parquet's trailer: a 4-byte little-endian footer length and the `PAR1` magic.
const TRAILER: u64 = 8;
/// First guess at the tail to fetch; a footer larger than this costs a second read.
const TAIL_GUESS: u64 = 64 << 10;

/// The end of a block: its parsed footer, and the bytes of datasets that lay in the
/// fetched tail (all of a small block's).
#[derive(Debug, Clone)]
pub struct BlockTail {
    /// Offset of `bytes` in the block.
    start: u64,
    /// The tail's bytes up to the footer. The footer's own bytes are not kept once parsed.
    bytes: Bytes,
    block_len: u64,
    /// The parsed footer, kept: a segment's footer describes every service's dataset,
    /// and parsing it again for each one made compaction quadratic in the services.
    footer: Arc<Footer>,
}

/// What reading a dataset needs of a block's footer, and no more. Parquet's own parsed
/// footer keeps 424 bytes per column chunk (statistics, encodings, index offsets, level
/// histograms, held inline whether present or not): 355 KiB for a segment of 19
/// services, and compaction keeps the footers of the segments it has still to merge
/// (64 MiB of a saturated server's RSS). This keeps 56 bytes per chunk, and builds
/// Parquet's metadata of one row group when a dataset is read.
#[derive(Debug)]
pub struct Footer {
    schema: SchemaDescPtr,
    /// Columns of the block's format version (checked when the footer was parsed).
    column_count: usize,
    groups: Vec<Group>,
}

#[derive(Debug)]
struct Group {
    rows: i64,
    chunks: Box<[Chunk]>,
}

/// One column chunk: where it lies and how to read it.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    /// Its bytes, dictionary page first if it has one (checked against the block).
    start: u64,
    end: u64,
    data_page_offset: i64,
    has_dictionary: bool,
    /// Values plain, levels RLE, as a segment writes them: what [`copy_dataset`]
    /// records of a chunk it copies. A zstd block's small chunks are uncompressed too
    /// (`format::SMALL_CHUNK_BYTES`), but some of them byte-stream-split or delta-packed.
    plain: bool,
    uncompressed_size: i64,
    values: i64,
    codec: Compression,
}

impl Footer {
    fn new(metadata: &ParquetMetaData, block_len: u64) -> Result<Footer, StorageError> {
        let column_count = check_version(metadata)?;
        let groups = metadata
            .row_groups()
            .iter()
            .map(|group| {
                let chunks = group
                    .columns()
                    .iter()
                    .map(|column| {
                        let range = chunk_range(column, block_len)?;
                        Ok(Chunk {
                            start: range.start,
                            end: range.end,
                            data_page_offset: column.data_page_offset(),
                            has_dictionary: column.dictionary_page_offset().is_some(),
                            plain: column.encodings().all(|encoding| {
                                matches!(encoding, Encoding::PLAIN | Encoding::RLE)
                            }),
                            uncompressed_size: column.uncompressed_size(),
                            values: column.num_values(),
                            codec: column.compression(),
                        })
                    })
                    .collect::<Result<Box<[Chunk]>, StorageError>>()?;
                Ok(Group {
                    rows: group.num_rows(),
                    chunks,
                })
            })
            .collect::<Result<Vec<_>, StorageError>>()?;
        Ok(Footer {
            schema: metadata.file_metadata().schema_descr_ptr(),
            column_count,
            groups,
        })
    }

    fn group(&self, row_group: usize) -> Result<&Group, StorageError> {
        self.groups.get(row_group).ok_or_else(|| {
            StorageError::Corrupt(format!(
                "row group {row_group} out of range ({})",
                self.groups.len()
            ))
        })
    }

    /// Parquet's metadata of row group `row_group`, for its reader.
    fn row_group(&self, row_group: usize) -> Result<RowGroupMetaData, StorageError> {
        let group = self.group(row_group)?;
        let columns = self.schema.columns();
        if columns.len() != group.chunks.len() {
            return Err(StorageError::Corrupt(format!(
                "row group {row_group} has {} columns, the schema {}",
                group.chunks.len(),
                columns.len()
            )));
        }
        let chunks = group
            .chunks
            .iter()
            .zip(columns)
            .map(|(chunk, column)| {
                ColumnChunkMetaData::builder(column.clone())
                    .set_compression(chunk.codec)
                    .set_num_values(chunk.values)
                    .set_total_compressed_size((chunk.end - chunk.start) as i64)
                    .set_total_uncompressed_size(chunk.uncompressed_size)
                    .set_data_page_offset(chunk.data_page_offset)
                    .set_dictionary_page_offset(chunk.has_dictionary.then_some(chunk.start as i64))
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(RowGroupMetaData::builder(self.schema.clone())
            .set_num_rows(group.rows)
            .set_column_metadata(chunks)
            .build()?)
    }

    fn memory_size(&self) -> usize {
        self.groups
            .iter()
            .map(|group| {
                std::mem::size_of::<Group>() + group.chunks.len() * std::mem::size_of::<Chunk>()
            })
            .sum()
    }
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
        let footer_at = (len - needed) as usize;
        let metadata =
            ParquetMetaDataReader::decode_metadata(&bytes[footer_at..(len - TRAILER) as usize])?;
        let footer = Footer::new(&metadata, block_len)?;
        // Copied, so that the footer's bytes (and the rest of the fetched buffer) are freed.
        let bytes = match footer_at {
            0 => Bytes::new(),
            _ => Bytes::copy_from_slice(&bytes[..footer_at]),
        };
        Ok(Ok(BlockTail {
            start: block_len - len,
            bytes,
            block_len,
            footer: Arc::new(footer),
        }))
    }

    /// Where dataset `row_group` lies in the block.
    pub fn dataset_range(&self, row_group: usize) -> Result<Range<u64>, StorageError> {
        let chunks = &self.footer.group(row_group)?.chunks;
        let start = chunks.iter().map(|chunk| chunk.start).min().unwrap_or(0);
        let end = chunks.iter().map(|chunk| chunk.end).max().unwrap_or(0);
        Ok(start..end)
    }

    /// Decodes dataset `row_group` from `reader`, which holds (at least) its bytes, with
    /// this footer instead of parsing the block's again.
    pub fn decode<R: ChunkReader + 'static>(
        &self,
        reader: R,
        row_group: usize,
        projection: Projection,
    ) -> Result<Dataset, StorageError> {
        let group = self.footer.row_group(row_group)?;
        decode_row_group(reader, &group, self.footer.column_count, projection)
    }

    /// How many datasets the block holds.
    pub fn dataset_count(&self) -> usize {
        self.footer.groups.len()
    }

    /// Offset in the block of the tail's first byte, and the tail's bytes.
    pub fn bytes(&self) -> (u64, &Bytes) {
        (self.start, &self.bytes)
    }

    /// Memory held, for a cache's budget.
    pub fn size_bytes(&self) -> usize {
        self.bytes.len() + self.footer.memory_size()
    }
}

/// Block tails by object key, oldest evicted first, within a memory budget. A segment's
/// tail locates every service's dataset in it: the compactor's jobs for the services of
/// a segment, and the queries reading several of its datasets, fetch and parse it once.
///
/// A reader that reads each dataset of a block once (compaction, whose merges then
/// delete the block) says so with [`TailCache::read_once`], and a tail goes as soon as
/// its last dataset is read. Without that, the tails of segments already merged away
/// filled the budget for good under load: 64 MiB of a saturated server's RSS.
pub struct TailCache {
    tails: std::collections::HashMap<String, Cached>,
    /// Keys in insertion order, each with the sequence number of its insertion: a key
    /// dropped by `read_once` and cached again is not evicted by its stale place here.
    order: std::collections::VecDeque<(String, u64)>,
    bytes: usize,
    capacity: usize,
    inserted: u64,
}

struct Cached {
    tail: Arc<BlockTail>,
    sequence: u64,
    /// Datasets not yet counted by `read_once`.
    unread: usize,
}

impl TailCache {
    pub fn new(capacity: usize) -> Self {
        TailCache {
            tails: Default::default(),
            order: Default::default(),
            bytes: 0,
            capacity,
            inserted: 0,
        }
    }

    pub fn get(&self, key: &str) -> Option<Arc<BlockTail>> {
        self.tails.get(key).map(|cached| cached.tail.clone())
    }

    /// Memory held by the cached tails.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Counts one dataset of `key` as read, by a reader that will not read it again; the
    /// tail is dropped once every dataset of its block is. Counting one twice (a job
    /// retried) only drops the tail early: the next read fetches it again.
    pub fn read_once(&mut self, key: &str) {
        let Some(cached) = self.tails.get_mut(key) else {
            return;
        };
        cached.unread = cached.unread.saturating_sub(1);
        if cached.unread == 0 {
            self.remove(key);
        }
    }

    fn remove(&mut self, key: &str) {
        if let Some(cached) = self.tails.remove(key) {
            self.bytes -= cached.tail.size_bytes();
        }
    }

    /// Locks a shared cache. The cache holds only whole entries, so a lock poisoned by a
    /// panic elsewhere still guards a consistent map and is used as is.
    pub fn lock(cache: &std::sync::Mutex<TailCache>) -> std::sync::MutexGuard<'_, TailCache> {
        cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The tail of object `key`, from `cache` or fetched and kept there, with the bytes
    /// fetched (0 when cached).
    pub async fn get_or_read(
        cache: &std::sync::Mutex<TailCache>,
        storage: &ObjectStorage,
        key: &str,
    ) -> Result<(Arc<BlockTail>, u64), StorageError> {
        if let Some(tail) = Self::lock(cache).get(key) {
            return Ok((tail, 0));
        }
        let (tail, fetched) = read_tail(storage, key).await?;
        let tail = Arc::new(tail);
        Self::lock(cache).insert(key, tail.clone());
        Ok((tail, fetched))
    }

    pub fn insert(&mut self, key: &str, tail: Arc<BlockTail>) {
        if self.tails.contains_key(key) {
            return;
        }
        self.bytes += tail.size_bytes();
        self.inserted += 1;
        let sequence = self.inserted;
        let unread = tail.dataset_count();
        self.tails.insert(
            key.to_string(),
            Cached {
                tail,
                sequence,
                unread,
            },
        );
        self.order.push_back((key.to_string(), sequence));
        while self.bytes > self.capacity {
            let Some((oldest, sequence)) = self.order.pop_front() else {
                break;
            };
            if self
                .tails
                .get(&oldest)
                .is_some_and(|cached| cached.sequence == sequence)
            {
                self.remove(&oldest);
            }
        }
        // Places left by tails that `read_once` dropped: keep the queue as short as the
        // cache, so it does not grow with every tail ever read.
        if self.order.len() > 2 * self.tails.len() + 16 {
            let tails = &self.tails;
            self.order.retain(|(key, sequence)| {
                tails
                    .get(key)
                    .is_some_and(|cached| cached.sequence == *sequence)
            });
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
    let group = tail.footer.group(row_group)?;
    let mut wanted: Vec<Range<u64>> = group
        .chunks
        .iter()
        .enumerate()
        .filter(|(index, _)| projection.may_read(*index))
        .map(|(_, chunk)| chunk.start..chunk.end)
        .collect();
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
        footer: Some(tail.footer.clone()),
    }
}

/// Decodes dataset `row_group` from the parts [`read_dataset_bytes`] fetched.
pub fn decode_partial(
    block: PartialBlock,
    row_group: usize,
    projection: Projection,
) -> Result<Dataset, StorageError> {
    match block.footer.clone() {
        Some(footer) => {
            let group = footer.row_group(row_group)?;
            decode_row_group(block, &group, footer.column_count, projection)
        }
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
    footer: Option<Arc<Footer>>,
}

impl PartialBlock {
    /// A block of `block_len` bytes of which only `parts` (offset, bytes) are at hand.
    pub fn new(block_len: u64, parts: Vec<(u64, Bytes)>) -> Self {
        PartialBlock {
            block_len,
            parts,
            footer: None,
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

impl PartialBlock {
    /// The bytes held (the parts fetched, and the tail).
    pub fn size_bytes(&self) -> usize {
        self.parts.iter().map(|(_, bytes)| bytes.len()).sum()
    }

    /// Row group `row_group`'s metadata and the block's column count, from the footer
    /// parsed with the block's tail.
    pub(crate) fn group(
        &self,
        row_group: usize,
    ) -> Result<(RowGroupMetaData, usize), StorageError> {
        let footer = self.footer.as_ref().ok_or_else(|| {
            StorageError::Corrupt("a partial block read without its footer".into())
        })?;
        Ok((footer.row_group(row_group)?, footer.column_count))
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

/// Dataset `row_group` of `block` as a block of its own, its column chunks copied byte
/// for byte. Compaction moves a service's lone dataset out of a segment so that the
/// segment can go; a merge of one input would decode it and encode the same columns
/// again (docs/benchmarks.md, "A lone dataset is copied"). The chunks keep their codec:
/// a segment's are uncompressed (or snappy, written before that), and a fast level
/// (`encoding` other than [`BlockEncoding::Compacted`]) takes them as they are, as it
/// takes a promoted segment. `None` when the chunks are not what a fast level takes
/// (zstd, a dictionary, values not plain, an older format version, a footer not parsed):
/// such a dataset is merged instead.
pub fn copy_dataset(
    block: &PartialBlock,
    row_group: usize,
    encoding: BlockEncoding,
) -> Result<Option<Vec<u8>>, StorageError> {
    let Some(footer) = &block.footer else {
        return Ok(None);
    };
    if encoding == BlockEncoding::Compacted {
        return Ok(None);
    }
    let fast =
        |codec: Compression| matches!(codec, Compression::UNCOMPRESSED | Compression::SNAPPY);
    let group = footer.group(row_group)?;
    if footer.column_count != COLUMN_COUNT
        || group
            .chunks
            .iter()
            .any(|chunk| !fast(chunk.codec) || chunk.has_dictionary || !chunk.plain)
    {
        return Ok(None);
    }
    let metadata = footer.row_group(row_group)?;
    let mut writer = block_writer(encoding)?;
    let mut out = writer.next_row_group()?;
    for (chunk, column) in group.chunks.iter().zip(metadata.columns()) {
        let length = chunk.end - chunk.start;
        // What the segment's writer recorded of the chunk but the compact footer does not
        // keep: plain values, RLE levels, no dictionary (`format::writer_properties`).
        let column = ColumnChunkMetaData::builder(column.column_descr_ptr())
            .set_compression(chunk.codec)
            .set_encodings(vec![Encoding::PLAIN, Encoding::RLE])
            .set_num_values(chunk.values)
            .set_total_compressed_size(length as i64)
            .set_total_uncompressed_size(chunk.uncompressed_size)
            .set_data_page_offset(chunk.data_page_offset)
            .build()?;
        // A chunk lies within one of the block's parts (a range running on into the tail
        // was joined to it when fetched), which the writer reads from in one go.
        out.append_column(
            block,
            ColumnCloseResult {
                bytes_written: length,
                rows_written: group.rows.max(0) as u64,
                metadata: column,
                bloom_filter: None,
                column_index: None,
                offset_index: None,
            },
        )?;
    }
    out.close()?;
    Ok(Some(writer.into_inner()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{decode_dataset, COLUMN_COUNT};
    use crate::DatasetBuilder;

    /// A block of one small CPU dataset per service, `main;<service>` with 10 ns.
    fn block_of(services: &[&str]) -> Bytes {
        block_as(services, BlockEncoding::Segment)
    }

    /// [`block_of`], written as `encoding` writes blocks.
    fn block_as(services: &[&str], encoding: BlockEncoding) -> Bytes {
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
        Bytes::from(crate::format::encode_block_as(&datasets, encoding).unwrap())
    }

    fn whole_tail(services: &[&str]) -> Arc<BlockTail> {
        let block = block_of(services);
        let len = block.len() as u64;
        Arc::new(BlockTail::parse(block, len).unwrap().unwrap())
    }

    #[test]
    fn a_tail_read_to_the_end_is_dropped_and_eviction_skips_stale_places() {
        let three = whole_tail(&["a", "b", "c"]);
        let size = three.size_bytes();
        let mut cache = TailCache::new(2 * size + size / 2);
        cache.insert("s1", three.clone());
        cache.read_once("s1");
        cache.read_once("s1");
        assert!(cache.get("s1").is_some(), "one dataset is still unread");
        assert_eq!(cache.bytes(), size);
        cache.read_once("s1");
        assert!(cache.get("s1").is_none(), "every dataset was read");
        assert_eq!(cache.bytes(), 0);
        cache.read_once("unknown"); // harmless

        // Cached again after the drop: its first place in the queue is stale, so filling
        // the cache evicts the oldest live tail ("s2"), not the re-read "s1".
        cache.insert("s2", three.clone());
        cache.insert("s1", three.clone());
        cache.insert("s3", three.clone());
        assert!(cache.get("s2").is_none(), "the oldest live tail is evicted");
        assert!(cache.get("s1").is_some() && cache.get("s3").is_some());
        assert_eq!(cache.bytes(), 2 * size);

        // Tails read to the end do not leave their places behind for good. (The first
        // one's insertion evicts "s1": three tails would be over the budget.)
        for round in 0..1_000 {
            let key = format!("r{round}");
            cache.insert(&key, three.clone());
            for _ in 0..3 {
                cache.read_once(&key);
            }
        }
        assert_eq!(cache.bytes(), size);
        assert!(cache.get("s3").is_some());
        assert!(
            cache.order.len() <= 2 * cache.tails.len() + 16,
            "{}",
            cache.order.len()
        );
    }

    /// A dataset copied out of a segment chunk by chunk is a block of its own that
    /// decodes to the same dataset, whichever row group it was, with its pages as they
    /// were: uncompressed from a segment, snappy from one written before segments were
    /// uncompressed. A zstd block, or a copy for a zstd level, is left to a merge.
    #[test]
    fn a_copied_dataset_decodes_as_it_did_in_its_segment() {
        for (written, codec) in [
            (BlockEncoding::Segment, "UNCOMPRESSED"),
            (BlockEncoding::Snappy, "SNAPPY"),
        ] {
            copied_as_it_was(written, codec);
        }
        let zstd = block_as(&["a"], BlockEncoding::Compacted);
        let partial = fetched(&zstd, zstd.len() as u64, 0);
        assert!(copy_dataset(&partial, 0, BlockEncoding::Snappy)
            .unwrap()
            .is_none());
    }

    /// Dataset `row_group`'s parts as compaction fetches them, with the tail cut `cut`
    /// bytes before the block's end.
    fn fetched(block: &Bytes, cut: u64, row_group: usize) -> PartialBlock {
        let block_len = block.len() as u64;
        let tail = BlockTail::parse(block.slice((block_len - cut) as usize..), block_len)
            .unwrap()
            .unwrap();
        let plan = column_fetch(&tail, row_group, Projection::ALL).unwrap();
        let bytes = plan
            .ranges()
            .into_iter()
            .map(|range| block.slice(range.start as usize..range.end as usize))
            .collect();
        plan.partial("s", &tail, bytes).unwrap()
    }

    fn copied_as_it_was(written: BlockEncoding, codec: &str) {
        let services = ["a", "b", "c", "d"];
        let block = block_as(&services, written);
        let block_len = block.len() as u64;
        // The shortest tail: the footer alone.
        let needed = BlockTail::parse(block.slice(block.len() - 16..), block_len)
            .unwrap()
            .unwrap_err();
        // At every cut of the tail, from the footer alone through the datasets' bytes.
        for cut in (needed..block_len).step_by(97) {
            for (row_group, service) in services.iter().enumerate() {
                let partial = fetched(&block, cut, row_group);
                let copy = copy_dataset(&partial, row_group, BlockEncoding::Snappy)
                    .unwrap()
                    .expect("a segment's dataset is copied");
                let copy = Bytes::from(copy);
                let decoded = decode_dataset(&copy, 0, Projection::ALL).unwrap();
                assert_eq!(decoded.service, *service);
                assert_eq!(
                    decoded,
                    decode_dataset(&block, row_group, Projection::ALL).unwrap(),
                    "cut {cut}, row group {row_group}"
                );
                assert_eq!(crate::format::dataset_bytes(&copy).unwrap().len(), 1);
                assert_eq!(crate::format::block_compression(&copy).unwrap(), [codec]);
                assert!(
                    copy_dataset(&partial, row_group, BlockEncoding::Compacted)
                        .unwrap()
                        .is_none(),
                    "zstd blocks are merged"
                );
            }
        }
        // Without a parsed footer there is nothing to copy by.
        let bare = PartialBlock::new(block_len, vec![(0, block.clone())]);
        assert!(copy_dataset(&bare, 0, BlockEncoding::Snappy)
            .unwrap()
            .is_none());
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
        // The tail holds exactly the footer, whose bytes it does not keep once parsed, and
        // keeps 56 bytes per column chunk of it (the struct's doc says why).
        assert!(tail.bytes.is_empty());
        assert!(std::mem::size_of::<Chunk>() <= 56);
        assert_eq!(
            tail.footer.memory_size(),
            services.len()
                * (std::mem::size_of::<Group>() + COLUMN_COUNT * std::mem::size_of::<Chunk>())
        );
        let footer = (tail.start, block.slice(tail.start as usize..));
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
                    footer.clone(),
                ],
                footer: None,
            };
            let whole = decode_dataset(&block, index, Projection::ALL).unwrap();
            // Decoded with the footer parsed again, and with the tail's parsed footer.
            let with_footer = PartialBlock {
                footer: Some(tail.footer.clone()),
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
            parts: vec![footer.clone()],
            footer: Some(tail.footer.clone()),
        };
        if range.end <= tail.start {
            assert!(decode_partial(missing.clone(), 0, Projection::ALL).is_err());
            let missing = PartialBlock {
                footer: None,
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

//! The block file format: Apache Parquet, one row group per dataset, every table a
//! repeated group column. `docs/FORMAT.md` is the specification.
//!
//! Why tables as repeated groups: a dataset's tables have different lengths and schemas,
//! and Parquet requires one schema per file. Nesting each table as a repeated group lets
//! one object hold every table of many datasets, so the write path does one PUT per flush
//! and a reader fetches only the column chunks it needs of the one row group it needs.
//! A row group's rows (records) split the tables into parts of at most [`RECORD_ROWS`]
//! rows, a table's rows being its records' lists end to end, so that pages stay small:
//! parquet-rs ends a page only between records.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::column::reader::ColumnReader;
use parquet::column::writer::{ColumnCloseResult, ColumnWriter, ColumnWriterImpl};
use parquet::data_type::{ByteArray, DataType};
use parquet::file::metadata::page_index::RowGroupPageIndex;
use parquet::file::metadata::{KeyValue, ParquetMetaData, RowGroupMetaData};
use parquet::file::properties::ReaderProperties;
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterVersion};
use parquet::file::reader::{FileReader, RowGroupReader, SerializedFileReader};
use parquet::file::serialized_reader::SerializedRowGroupReader;
use parquet::file::writer::{SerializedFileWriter, SerializedPageWriter, TrackedWrite};
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::{ColumnPath, SchemaDescriptor, Type};

use crate::dataset::{Dataset, FunctionRow, MappingRow, ProfileRow, SeriesRow};
use crate::strings::Strings;
use crate::StorageError;

/// Version of the layout below, stored in the footer as `kiln.block.version`. Version 3
/// splits a dataset's tables over records of at most [`RECORD_ROWS`] rows each; version 2
/// held them in one record. Version 2 appended `profile_totals` and `stack_sums`; blocks
/// of version 1 still read, without them (totals are then summed from the samples).
pub const FORMAT_VERSION: &str = "3";

/// The most rows of a table in one record (one Parquet row) of a dataset. parquet-rs ends
/// a data page only between records, so while a dataset was one record each of its
/// columns was one page: a 13 MB column was encoded whole, at about 5 times its size, and
/// a reader held it whole to read any of it. Records of this many rows let pages end near
/// the writer's 1 MiB page size, so compaction reads and writes samples a page at a time.
pub const RECORD_ROWS: usize = 65_536;

/// Columns of a version 1 block: the first [`V1_COLUMN_COUNT`] of [`SCHEMA`].
pub const V1_COLUMN_COUNT: usize = 38;

/// The tables of a version 1 block, in column order.
macro_rules! v1_tables {
    () => {
        "
  required binary tenant (STRING);
  required binary service (STRING);
  required int64 min_time_nanos;
  required int64 max_time_nanos;
  repeated binary strings (STRING);
  repeated group mappings {
    required int64 memory_start;
    required int64 memory_limit;
    required int64 file_offset;
    required int32 filename;
    required int32 build_id;
    required int32 flags;
  }
  repeated group functions {
    required int32 name;
    required int32 system_name;
    required int32 filename;
    required int64 start_line;
  }
  repeated group locations {
    required int32 mapping;
    required int64 address;
    required int32 line_count;
  }
  repeated group lines {
    required int32 function;
    required int64 line;
  }
  repeated group stacks {
    required int32 parent;
    required int32 location;
  }
  repeated group series {
    required int32 profile_type;
    required int32 label_count;
  }
  repeated group series_labels {
    required int32 name;
    required int32 value;
  }
  repeated group profiles {
    required binary id;
    required int32 series;
    required int64 time_nanos;
    required int64 duration_nanos;
    required int64 period;
    required int32 type_index;
    required int32 sample_count;
  }
  repeated group samples {
    required int32 stack;
    required int64 value;
  }
  repeated group sample_labels {
    required int32 sample;
    required int32 name;
    required int32 value;
  }
"
    };
}

/// The tables version 2 appended.
macro_rules! v2_tables {
    () => {
        "  repeated group profile_totals {
    required int64 value;
  }
  repeated group stack_sums {
    required int32 series;
    required int32 stack;
    required int64 value;
  }
"
    };
}

/// The Parquet schema of a block. Leaf order is the column order the codec relies on.
pub const SCHEMA: &str = concat!("message kiln_dataset {", v1_tables!(), v2_tables!(), "}");

/// The schema of a version 1 block, which readers still take.
#[cfg(test)]
const SCHEMA_V1: &str = concat!("message kiln_dataset {", v1_tables!(), "}");

/// Number of leaf columns in [`SCHEMA`].
pub const COLUMN_COUNT: usize = 42;

/// Column ranges of each table, to read only what a query needs.
pub mod columns {
    use std::ops::Range;
    pub const HEADER: Range<usize> = 0..4;
    pub const STRINGS: Range<usize> = 4..5;
    pub const MAPPINGS: Range<usize> = 5..11;
    pub const FUNCTIONS: Range<usize> = 11..15;
    pub const LOCATIONS: Range<usize> = 15..18;
    pub const LINES: Range<usize> = 18..20;
    pub const STACKS: Range<usize> = 20..22;
    pub const SERIES: Range<usize> = 22..26;
    pub const PROFILES: Range<usize> = 26..33;
    pub const SAMPLES: Range<usize> = 33..35;
    pub const SAMPLE_LABELS: Range<usize> = 35..38;
    pub const PROFILE_TOTALS: Range<usize> = 38..39;
    pub const STACK_SUMS: Range<usize> = 39..42;
}

enum Column {
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bytes(Vec<ByteArray>),
}

impl Column {
    fn len(&self) -> usize {
        match self {
            Column::I32(values) => values.len(),
            Column::I64(values) => values.len(),
            Column::Bytes(values) => values.len(),
        }
    }
}

fn i32s(values: impl Iterator<Item = u32>) -> Column {
    Column::I32(values.map(|value| value as i32).collect())
}

fn i64s(values: impl Iterator<Item = i64>) -> Column {
    Column::I64(values.collect())
}

/// What column `index` of a dataset is written from, in schema order; `None` past the
/// last. The tables that grow with the samples and stacks are written straight from the
/// dataset's own vectors; the rest are made one at a time. Every table of a dataset is
/// one Parquet record, written in one call (parquet-rs starts each call at a record
/// boundary), so the writer buffers a whole column anyway; a copy of it beside that, and
/// two level vectors as long as it, were 30 MB more at the peak of a compaction of a few
/// thousand profiles (docs/benchmarks.md).
fn column_source(dataset: &Dataset, index: usize) -> Option<Source<'_>> {
    Some(match index {
        15 => Source::U32(&dataset.location_mapping),
        17 => Source::U32(&dataset.location_line_count),
        18 => Source::U32(&dataset.line_function),
        19 => Source::I64(&dataset.line_number),
        20 => Source::U32(&dataset.stack_parent),
        21 => Source::U32(&dataset.stack_location),
        33 => Source::U32(&dataset.sample_stack),
        34 => Source::I64(&dataset.sample_value),
        35 => Source::U32(&dataset.sample_label_sample),
        36 => Source::U32(&dataset.sample_label_name),
        37 => Source::U32(&dataset.sample_label_value),
        39 => Source::U32(&dataset.stack_sum_series),
        40 => Source::U32(&dataset.stack_sum_stack),
        41 => Source::I64(&dataset.stack_sum_value),
        _ => Source::Made(dataset_column(dataset, index)?),
    })
}

/// A column to write: made from the dataset's rows, or one of its vectors as it is.
enum Source<'a> {
    Made(Column),
    U32(&'a [u32]),
    I64(&'a [i64]),
}

impl Source<'_> {
    #[cfg(test)]
    fn len(&self) -> usize {
        match self {
            Source::Made(column) => column.len(),
            Source::U32(values) => values.len(),
            Source::I64(values) => values.len(),
        }
    }
}

/// The levels of a repeated column of `count` values in one record (a dataset's table, or
/// its part in one record): every value defined, each but the first repeating. One vector serves both, as
/// `(definition, repetition)` slices of it: the repetition levels are the definition
/// levels shifted by one.
fn repeated_levels(count: usize) -> Vec<i16> {
    let mut levels = vec![1i16; count + 1];
    levels[0] = 0;
    levels
}

/// Column `index` of a dataset made from its rows, in schema order (see
/// [`column_source`]). Made one at a time, so that encoding holds one column's copy of a
/// dataset, not all of them.
fn dataset_column(dataset: &Dataset, index: usize) -> Option<Column> {
    let bytes = |value: &str| ByteArray::from(value.as_bytes().to_vec());
    Some(match index {
        0 => Column::Bytes(vec![bytes(&dataset.tenant)]),
        1 => Column::Bytes(vec![bytes(&dataset.service)]),
        2 => Column::I64(vec![dataset.min_time_nanos]),
        3 => Column::I64(vec![dataset.max_time_nanos]),
        4 => {
            // One copy of the whole table, each value a slice of it: no allocation per
            // string.
            let (text, ends) = dataset.strings.as_parts();
            let buffer = Bytes::copy_from_slice(text.as_bytes());
            let mut start = 0;
            Column::Bytes(
                ends.iter()
                    .map(|&end| {
                        let value = ByteArray::from(buffer.slice(start..end));
                        start = end;
                        value
                    })
                    .collect(),
            )
        }
        5 => i64s(dataset.mappings.iter().map(|m| m.memory_start as i64)),
        6 => i64s(dataset.mappings.iter().map(|m| m.memory_limit as i64)),
        7 => i64s(dataset.mappings.iter().map(|m| m.file_offset as i64)),
        8 => i32s(dataset.mappings.iter().map(|m| m.filename)),
        9 => i32s(dataset.mappings.iter().map(|m| m.build_id)),
        10 => i32s(dataset.mappings.iter().map(|m| m.flags)),
        11 => i32s(dataset.functions.iter().map(|f| f.name)),
        12 => i32s(dataset.functions.iter().map(|f| f.system_name)),
        13 => i32s(dataset.functions.iter().map(|f| f.filename)),
        14 => i64s(dataset.functions.iter().map(|f| f.start_line)),
        16 => i64s(dataset.location_address.iter().map(|a| *a as i64)),
        22 => i32s(dataset.series.iter().map(|s| s.profile_type)),
        23 => i32s(dataset.series.iter().map(|s| s.labels.len() as u32)),
        24 => i32s(
            dataset
                .series
                .iter()
                .flat_map(|s| s.labels.iter().map(|l| l.0)),
        ),
        25 => i32s(
            dataset
                .series
                .iter()
                .flat_map(|s| s.labels.iter().map(|l| l.1)),
        ),
        26 => Column::Bytes(
            dataset
                .profiles
                .iter()
                .map(|p| ByteArray::from(p.id.clone()))
                .collect(),
        ),
        27 => i32s(dataset.profiles.iter().map(|p| p.series)),
        28 => i64s(dataset.profiles.iter().map(|p| p.time_nanos)),
        29 => i64s(dataset.profiles.iter().map(|p| p.duration_nanos)),
        30 => i64s(dataset.profiles.iter().map(|p| p.period)),
        31 => i32s(dataset.profiles.iter().map(|p| p.type_index)),
        32 => i32s(dataset.profiles.iter().map(|p| p.sample_count)),
        38 => i64s(dataset.profiles.iter().map(|p| p.total)),
        _ => return None,
    })
}

/// What a block is written for: the write path wants cheap encoding (segments live
/// seconds), compaction wants small output (blocks live for the retention period).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockEncoding {
    /// Uncompressed, plain: the write path's segments, which live until their first
    /// compaction. Snappy was half of a segment's encoding and a third of reading it back
    /// (`kiln bench stages`), for pages that are read once and then deleted.
    Segment,
    /// Snappy, plain: compacted blocks that are merged again within minutes (level 1 by
    /// default, `compaction.levels[i].compression`).
    Snappy,
    /// zstd level 3, byte-stream-split values, delta-packed indices.
    Compacted,
}

fn writer_properties(
    encoding: BlockEncoding,
    version: &str,
) -> Result<WriterProperties, StorageError> {
    let column = |table: &str, field: &str| ColumnPath::new(vec![table.into(), field.into()]);
    let builder = WriterProperties::builder()
        .set_writer_version(WriterVersion::PARQUET_1_0)
        .set_statistics_enabled(EnabledStatistics::Chunk)
        // Ids are small integers already; plain + zstd measured smaller and faster than
        // dictionary + zstd (docs/FORMAT.md).
        .set_dictionary_enabled(false);
    let builder = match encoding {
        // Parquet makes a codec per column chunk, and a zstd codec allocates a compression
        // and a decompression context each time: with forty columns per dataset, a flush
        // of one-profile datasets spent a quarter of its CPU creating contexts. Segments
        // live seconds before compaction, so their size matters less than the CPU: they
        // went from zstd to snappy, then to none (2.1 times snappy's bytes, half its
        // encoding CPU; docs/benchmarks.md). Level 1's merges keep snappy.
        //
        // Nothing in Kiln reads column statistics, and a segment's footer describes every
        // service's dataset: min and max of each of forty columns per dataset were most of
        // its 80–90 KiB at 20 services, parsed and cached by compaction for each segment.
        // Compacted blocks keep theirs, for other Parquet readers.
        BlockEncoding::Segment => builder
            .set_compression(Compression::UNCOMPRESSED)
            .set_statistics_enabled(EnabledStatistics::None),
        BlockEncoding::Snappy => builder
            .set_compression(Compression::SNAPPY)
            .set_statistics_enabled(EnabledStatistics::None),
        BlockEncoding::Compacted => builder
            .set_compression(Compression::ZSTD(ZstdLevel::try_new(3)?))
            // Sample values are small next to the int64 range: split into byte streams,
            // the high bytes are runs of zeros that zstd all but erases.
            .set_column_encoding(column("samples", "value"), Encoding::BYTE_STREAM_SPLIT)
            .set_column_encoding(column("stack_sums", "value"), Encoding::BYTE_STREAM_SPLIT)
            // Sorted within each series: small deltas.
            .set_column_encoding(column("stack_sums", "stack"), Encoding::DELTA_BINARY_PACKED)
            // Global sample indices only grow: their deltas pack into a few bits.
            .set_column_encoding(
                column("sample_labels", "sample"),
                Encoding::DELTA_BINARY_PACKED,
            ),
    };
    Ok(builder
        .set_created_by(format!("kiln {}", env!("CARGO_PKG_VERSION")))
        .set_key_value_metadata(Some(vec![KeyValue::new(
            "kiln.block.version".to_string(),
            version.to_string(),
        )]))
        .build())
}

/// The current schema and `encoding`'s writer properties, made once per process. Made
/// for each block, parsing the forty-column schema's text was 1.5 % of the server's CPU
/// where most flushes hold one small dataset (500 services at 40 profiles/s in all;
/// docs/benchmarks.md, "The schema is parsed once").
fn current_format(
    encoding: BlockEncoding,
) -> Result<(Arc<Type>, Arc<WriterProperties>), StorageError> {
    type Made = (Arc<Type>, Arc<WriterProperties>);
    static SEGMENT: OnceLock<Made> = OnceLock::new();
    static SNAPPY: OnceLock<Made> = OnceLock::new();
    static COMPACTED: OnceLock<Made> = OnceLock::new();
    let cell = match encoding {
        BlockEncoding::Segment => &SEGMENT,
        BlockEncoding::Snappy => &SNAPPY,
        BlockEncoding::Compacted => &COMPACTED,
    };
    if let Some(made) = cell.get() {
        return Ok(made.clone());
    }
    let made = (
        Arc::new(parse_message_type(SCHEMA)?),
        Arc::new(writer_properties(encoding, FORMAT_VERSION)?),
    );
    Ok(cell.get_or_init(|| made).clone())
}

/// A writer of blocks of the current format version, as `encoding` writes them.
pub(crate) fn block_writer(
    encoding: BlockEncoding,
) -> Result<SerializedFileWriter<Vec<u8>>, StorageError> {
    let (schema, properties) = current_format(encoding)?;
    Ok(SerializedFileWriter::new(Vec::new(), schema, properties)?)
}

/// Encodes datasets into one block object as a segment; dataset `i` is row group `i`.
pub fn encode_block(datasets: &[Dataset]) -> Result<Vec<u8>, StorageError> {
    encode_block_as(datasets, BlockEncoding::Segment)
}

/// Encodes datasets into one block object; dataset `i` is row group `i`.
pub fn encode_block_as(
    datasets: &[Dataset],
    encoding: BlockEncoding,
) -> Result<Vec<u8>, StorageError> {
    let (schema, properties) = current_format(encoding)?;
    if encoding != BlockEncoding::Compacted {
        // Uncompressed or snappy pages take about their plain values' bytes or less: the
        // output is sized once instead of doubled, and copied, a dozen times (2 % of the
        // server's CPU with segments of 500 one-profile datasets).
        let plain: usize = (datasets.iter())
            .flat_map(|dataset| (0..COLUMN_COUNT).map(|index| plain_bytes(dataset, index)))
            .sum();
        // Beside the values: levels, page headers and the footer, about 6 KiB a dataset.
        let sink = Vec::with_capacity(plain + 8192 * (datasets.len() + 1));
        return encode_with(
            datasets,
            SerializedFileWriter::new(sink, schema, properties)?,
            RECORD_ROWS,
        );
    }
    let small = |index: usize| {
        (datasets.iter()).all(|dataset| plain_bytes(dataset, index) <= SMALL_CHUNK_BYTES)
    };
    let writer = SerializedFileWriter::new(Vec::new(), schema, compacted_properties(small)?)?;
    encode_with(datasets, writer, RECORD_ROWS)
}

/// A zstd block's writer properties, columns `small` says are small written uncompressed
/// ([`SMALL_CHUNK_BYTES`]).
fn compacted_properties(
    small: impl Fn(usize) -> bool,
) -> Result<Arc<WriterProperties>, StorageError> {
    let (schema, properties) = current_format(BlockEncoding::Compacted)?;
    let small: Vec<usize> = (0..COLUMN_COUNT).filter(|index| small(*index)).collect();
    if small.is_empty() {
        return Ok(properties);
    }
    let descriptor = SchemaDescriptor::new(schema);
    let mut builder = (*properties).clone().into_builder();
    for index in small {
        let path = descriptor.column(index).path().clone();
        builder = builder.set_column_compression(path, Compression::UNCOMPRESSED);
    }
    Ok(Arc::new(builder.build()))
}

/// A column of one dataset's block encoded before the rest of its row group, as
/// [`ChunkWriter`] wrote it: its bytes, and what its writer reported on closing.
pub(crate) struct EncodedChunk {
    bytes: Bytes,
    close: ColumnCloseResult,
}

impl EncodedChunk {
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }
}

/// The sink of a [`ChunkWriter`], made by [`ChunkWriter::sink`] and owned by its caller:
/// the column writer borrows it while it writes.
pub(crate) type ChunkSink = TrackedWrite<Vec<u8>>;

/// Writes column `index` of a block's one dataset ahead of the row group, record by
/// record, as [`encode_block_as`] would write it, pages going to its own sink as they
/// fill: a merge fills its sample columns together, while a row group's columns are
/// written one after another, so it encodes them this way instead of holding their values
/// whole (docs/FORMAT.md, section 1). [`encode_with_chunks`] puts them in place.
pub(crate) struct ChunkWriter<'a, T: DataType> {
    index: usize,
    writer: ColumnWriterImpl<'a, T>,
    /// The record being filled: at most [`RECORD_ROWS`] values.
    record: Vec<T::T>,
    records: usize,
    levels: &'a [i16],
}

impl<'a, T: DataType> ChunkWriter<'a, T> {
    pub(crate) fn sink() -> ChunkSink {
        TrackedWrite::new(Vec::new())
    }

    /// `plain`: the bytes the column's values will take in all, which decides whether a
    /// zstd block compresses it ([`SMALL_CHUNK_BYTES`]). `levels`: [`record_levels`].
    pub(crate) fn new(
        sink: &'a mut ChunkSink,
        index: usize,
        encoding: BlockEncoding,
        plain: usize,
        levels: &'a [i16],
    ) -> Result<Self, StorageError> {
        let (schema, properties) = current_format(encoding)?;
        let properties = if encoding == BlockEncoding::Compacted {
            compacted_properties(|at| at == index && plain <= SMALL_CHUNK_BYTES)?
        } else {
            properties
        };
        let descriptor = SchemaDescriptor::new(schema);
        if index >= descriptor.num_columns() || index < columns::STRINGS.start {
            return Err(StorageError::Corrupt(format!("no table column {index}")));
        }
        let column = descriptor.column(index);
        if column.physical_type() != T::get_physical_type() {
            return Err(unexpected_type(index));
        }
        Ok(ChunkWriter {
            index,
            writer: ColumnWriterImpl::new(
                column,
                properties,
                Box::new(SerializedPageWriter::new(sink)),
            ),
            record: Vec::with_capacity(RECORD_ROWS),
            records: 0,
            levels,
        })
    }

    pub(crate) fn push(&mut self, value: T::T) -> Result<(), StorageError> {
        self.record.push(value);
        if self.record.len() == RECORD_ROWS {
            self.end_record()?;
        }
        Ok(())
    }

    fn end_record(&mut self) -> Result<(), StorageError> {
        let count = self.record.len();
        if count == 0 {
            self.writer.write_batch(&[], Some(&[0]), Some(&[0]))?;
        } else {
            self.writer.write_batch(
                &self.record,
                Some(&self.levels[1..=count]),
                Some(&self.levels[..count]),
            )?;
            self.record.clear();
        }
        self.records += 1;
        Ok(())
    }

    /// The column in `records` records: the last values, then empty records.
    pub(crate) fn finish(mut self, records: usize) -> Result<(usize, ChunkClose), StorageError> {
        if !self.record.is_empty() {
            self.end_record()?;
        }
        while self.records < records {
            self.end_record()?;
        }
        if self.records != records {
            return Err(StorageError::Corrupt(format!(
                "column {} needs {} records, not {records}",
                self.index, self.records
            )));
        }
        Ok((self.index, ChunkClose(self.writer.close()?)))
    }
}

/// What a [`ChunkWriter`] reported on closing, before its sink's bytes are taken.
pub(crate) struct ChunkClose(ColumnCloseResult);

impl ChunkClose {
    pub(crate) fn with_bytes(self, sink: ChunkSink) -> Result<EncodedChunk, StorageError> {
        Ok(EncodedChunk {
            bytes: Bytes::from(sink.into_inner()?),
            close: self.0,
        })
    }
}

/// The levels of a full record, for [`ChunkWriter`]s.
pub(crate) fn record_levels() -> Vec<i16> {
    repeated_levels(RECORD_ROWS)
}

/// Encodes one dataset as a block of `encoding`, the columns in `chunks` (by column
/// index) as [`ChunkWriter`]s wrote them and the dataset's own vectors for those columns
/// left empty: `rows` are the tables' true rows ([`table_rows`]' order), which decide the
/// records.
pub(crate) fn encode_with_chunks(
    dataset: &Dataset,
    encoding: BlockEncoding,
    rows: [usize; 12],
    chunks: Vec<(usize, EncodedChunk)>,
) -> Result<Vec<u8>, StorageError> {
    let (schema, properties) = current_format(encoding)?;
    let properties = if encoding == BlockEncoding::Compacted {
        compacted_properties(|index| plain_bytes(dataset, index) <= SMALL_CHUNK_BYTES)?
    } else {
        properties
    };
    // Beside the chunks: the other columns, no larger than their plain values.
    let capacity: usize = chunks.iter().map(|(_, chunk)| chunk.len()).sum::<usize>()
        + (0..COLUMN_COUNT)
            .map(|index| plain_bytes(dataset, index))
            .sum::<usize>()
        + 8192;
    let mut writer = SerializedFileWriter::new(Vec::with_capacity(capacity), schema, properties)?;
    let longest = rows.into_iter().max().unwrap_or(0);
    let levels = repeated_levels(longest.min(RECORD_ROWS));
    let layout = Records {
        count: records_for(longest, RECORD_ROWS),
        rows: RECORD_ROWS,
        longest,
        levels: &levels,
    };
    write_dataset(&mut writer, dataset, &layout, chunks)?;
    Ok(writer.into_inner()?)
}

/// The records of a dataset whose longest table has `longest` rows.
pub(crate) fn records_for(longest: usize, record_rows: usize) -> usize {
    longest.div_ceil(record_rows.max(1)).max(1)
}

/// Column chunks of at most this many bytes of plain values are written uncompressed in
/// zstd blocks. Parquet makes a codec for every chunk it writes or reads, and a zstd codec
/// makes a compression and a decompression context, each asking the CPU for its features
/// (`cpuid`, a trap to the hypervisor on a virtual machine): about 23 µs a chunk here,
/// more than compressing a few KiB takes, to save at most those few KiB. A merge of a
/// few one-profile datasets (many services at a low rate) spent more of its CPU making
/// contexts than compressing (docs/benchmarks.md).
pub const SMALL_CHUNK_BYTES: usize = 4096;

/// The rows of each table of a dataset, in the order of the schema's tables (the header
/// excluded).
pub(crate) fn table_rows(dataset: &Dataset) -> [usize; 12] {
    [
        dataset.strings.len(),
        dataset.mappings.len(),
        dataset.functions.len(),
        dataset.location_mapping.len(),
        dataset.line_function.len(),
        dataset.stack_parent.len(),
        dataset.series.len(),
        dataset.series.iter().map(|s| s.labels.len()).sum(),
        dataset.profiles.len(),
        dataset.sample_stack.len(),
        dataset.sample_label_sample.len(),
        dataset.stack_sum_stack.len(),
    ]
}

/// The records a dataset is written as, at most `record_rows` rows of each table in each:
/// enough for its longest table, and at least one.
fn record_count(dataset: &Dataset, record_rows: usize) -> usize {
    records_for(
        table_rows(dataset).into_iter().max().unwrap_or(0),
        record_rows,
    )
}

/// The bytes column `index` of a dataset takes as plain values, counted from its tables
/// without making the column ([`column_source`] makes it).
fn plain_bytes(dataset: &Dataset, index: usize) -> usize {
    let (profiles, series) = (dataset.profiles.len(), dataset.series.len());
    let (mappings, functions) = (dataset.mappings.len(), dataset.functions.len());
    let locations = dataset.location_mapping.len();
    let lines = dataset.line_function.len();
    let stacks = dataset.stack_parent.len();
    let samples = dataset.sample_stack.len();
    let sample_labels = dataset.sample_label_sample.len();
    let stack_sums = dataset.stack_sum_stack.len();
    // Byte arrays are written as a 4-byte length and the bytes.
    let text = |len: usize, count: usize| len + 4 * count;
    match index {
        0 => text(dataset.tenant.len(), 1),
        1 => text(dataset.service.len(), 1),
        2 | 3 => 8,
        4 => text(dataset.strings.as_parts().0.len(), dataset.strings.len()),
        5..=7 => 8 * mappings,
        8..=10 => 4 * mappings,
        11..=13 => 4 * functions,
        14 => 8 * functions,
        15 | 17 => 4 * locations,
        16 => 8 * locations,
        18 => 4 * lines,
        19 => 8 * lines,
        20 | 21 => 4 * stacks,
        22 | 23 => 4 * series,
        24 | 25 => 4 * dataset.series.iter().map(|s| s.labels.len()).sum::<usize>(),
        26 => text(dataset.profiles.iter().map(|p| p.id.len()).sum(), profiles),
        27 | 31 | 32 => 4 * profiles,
        28..=30 | 38 => 8 * profiles,
        33 => 4 * samples,
        34 => 8 * samples,
        35..=37 => 4 * sample_labels,
        39 | 40 => 4 * stack_sums,
        41 => 8 * stack_sums,
        _ => 0,
    }
}

/// Encodes with a schema and the version it claims, for tests: an older one (whose columns
/// are a prefix of the current ones), or one not yet known.
#[cfg(test)]
fn encode_version(
    datasets: &[Dataset],
    encoding: BlockEncoding,
    schema: &str,
    version: &str,
) -> Result<Vec<u8>, StorageError> {
    let schema = Arc::new(parse_message_type(schema)?);
    let properties = Arc::new(writer_properties(encoding, version)?);
    // Versions before 3 hold a dataset in one record.
    let record_rows = if version == FORMAT_VERSION {
        RECORD_ROWS
    } else {
        usize::MAX
    };
    encode_with(
        datasets,
        SerializedFileWriter::new(Vec::new(), schema, properties)?,
        record_rows,
    )
}

/// Writes each dataset as a row group of `writer`, its tables split over records of at
/// most `record_rows` rows (the header repeated in each), and closes it.
fn encode_with(
    datasets: &[Dataset],
    mut writer: SerializedFileWriter<Vec<u8>>,
    record_rows: usize,
) -> Result<Vec<u8>, StorageError> {
    for dataset in datasets {
        let records = record_count(dataset, record_rows);
        let longest = table_rows(dataset).into_iter().max().unwrap_or(0);
        // The levels of the fullest record: a prefix serves any shorter one.
        let levels = repeated_levels(longest.min(record_rows));
        let layout = Records {
            count: records,
            rows: record_rows,
            longest,
            levels: &levels,
        };
        write_dataset(&mut writer, dataset, &layout, Vec::new())?;
    }
    Ok(writer.into_inner()?)
}

/// Writes `dataset` as the next row group of `writer`, as `layout` cuts it into records,
/// but for the columns in `chunks` (by index, in order), which are put in as encoded.
fn write_dataset(
    writer: &mut SerializedFileWriter<Vec<u8>>,
    dataset: &Dataset,
    layout: &Records<'_>,
    chunks: Vec<(usize, EncodedChunk)>,
) -> Result<(), StorageError> {
    let mut chunks = chunks.into_iter().peekable();
    let mut row_group = writer.next_row_group()?;
    let mut index = 0;
    loop {
        if let Some((_, chunk)) = chunks.next_if(|(at, _)| *at == index) {
            row_group.append_column(&chunk.bytes, chunk.close)?;
            index += 1;
            continue;
        }
        let Some(mut column_writer) = row_group.next_column()? else {
            break;
        };
        let source = column_source(dataset, index).ok_or_else(|| {
            StorageError::Corrupt("schema has more columns than the codec".into())
        })?;
        let top_level = index < columns::STRINGS.start;
        match (column_writer.untyped(), &source) {
            (ColumnWriter::Int32ColumnWriter(writer), Source::Made(Column::I32(values))) => {
                layout.write(writer, values, top_level)?;
            }
            (ColumnWriter::Int32ColumnWriter(writer), Source::U32(values)) => {
                // Ids are written as Parquet's int32, bit for bit.
                layout.write(writer, bytemuck::cast_slice(values), top_level)?;
            }
            (ColumnWriter::Int64ColumnWriter(writer), Source::Made(Column::I64(values))) => {
                layout.write(writer, values, top_level)?;
            }
            (ColumnWriter::Int64ColumnWriter(writer), Source::I64(values)) => {
                layout.write(writer, values, top_level)?;
            }
            (ColumnWriter::ByteArrayColumnWriter(writer), Source::Made(Column::Bytes(values))) => {
                layout.write(writer, values, top_level)?;
            }
            _ => return Err(unexpected_type(index)),
        }
        column_writer.close()?;
        index += 1;
    }
    if let Some((at, _)) = chunks.next() {
        return Err(StorageError::Corrupt(format!(
            "an encoded chunk for column {at} out of place"
        )));
    }
    row_group.close()?;
    Ok(())
}

/// How a dataset's columns are cut into records.
struct Records<'a> {
    count: usize,
    rows: usize,
    /// The longest table's rows: no column may hold more.
    longest: usize,
    /// `0, 1, 1, …` for the fullest record ([`repeated_levels`]).
    levels: &'a [i16],
}

impl Records<'_> {
    /// Writes one column: a header value once per record, or a table's rows `rows` to a
    /// record (definition levels 1, repetition `0, 1, …`), its records past its last row
    /// empty (one level pair `0, 0`). One call per record, since parquet-rs takes a call
    /// only at a record's start, and ends its pages only between records.
    fn write<T: parquet::data_type::DataType>(
        &self,
        writer: &mut parquet::column::writer::ColumnWriterImpl<'_, T>,
        values: &[T::T],
        top_level: bool,
    ) -> Result<(), StorageError> {
        if !top_level && values.len() > self.longest {
            // A table `table_rows` does not count: its rows would not fit its records.
            return Err(StorageError::Corrupt(format!(
                "a column of {} values in a dataset whose longest table has {}",
                values.len(),
                self.longest
            )));
        }
        for record in 0..self.count {
            if top_level {
                writer.write_batch(values, None, None)?;
                continue;
            }
            let start = record.saturating_mul(self.rows).min(values.len());
            let end = start.saturating_add(self.rows).min(values.len());
            if start == end {
                writer.write_batch(&values[..0], Some(&[0]), Some(&[0]))?;
            } else {
                let count = end - start;
                writer.write_batch(
                    &values[start..end],
                    Some(&self.levels[1..=count]),
                    Some(&self.levels[..count]),
                )?;
            }
        }
        Ok(())
    }
}

fn unexpected_type(index: usize) -> StorageError {
    StorageError::Corrupt(format!("column {index} has an unexpected type"))
}

/// A column's values over all `records` of its dataset: a table's rows in order (the
/// records' lists concatenated), or a header's value once per record.
fn read_column(
    reader: ColumnReader,
    top_level: bool,
    records: usize,
) -> Result<Column, StorageError> {
    fn read<T: parquet::data_type::DataType>(
        mut reader: parquet::column::reader::ColumnReaderImpl<T>,
        top_level: bool,
        records: usize,
    ) -> Result<Vec<T::T>, StorageError> {
        let mut values = Vec::new();
        let mut definition = Vec::new();
        let mut repetition = Vec::new();
        if top_level {
            reader.read_records(records, None, None, &mut values)?;
        } else {
            reader.read_records(
                records,
                Some(&mut definition),
                Some(&mut repetition),
                &mut values,
            )?;
        }
        Ok(values)
    }
    Ok(match reader {
        ColumnReader::Int32ColumnReader(reader) => Column::I32(read(reader, top_level, records)?),
        ColumnReader::Int64ColumnReader(reader) => Column::I64(read(reader, top_level, records)?),
        ColumnReader::ByteArrayColumnReader(reader) => {
            Column::Bytes(read(reader, top_level, records)?)
        }
        _ => return Err(StorageError::Corrupt("unexpected column type".into())),
    })
}

/// Which tables to decode; the rest are left empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Projection {
    pub symbols: bool,
    pub samples: Samples,
    pub sample_labels: bool,
    /// The profile rows (and their totals) even where stack sums stand in for the
    /// samples; without them a summed dataset gives a flame graph but no time series.
    pub profiles_when_summed: bool,
}

/// When to decode the samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Samples {
    Skip,
    Read,
    /// Only when the dataset has no stack sums: they stand in for the samples of a merge
    /// over the whole dataset, at a fraction of the size.
    UnlessSummed,
}

impl Projection {
    pub const ALL: Projection = Projection {
        symbols: true,
        samples: Samples::Read,
        sample_labels: true,
        profiles_when_summed: true,
    };
    /// Series and profile rows only: enough to list profiles and match labels.
    pub const INDEX: Projection = Projection {
        symbols: false,
        samples: Samples::Skip,
        sample_labels: false,
        profiles_when_summed: true,
    };
    /// What a merge over the whole dataset needs: symbols, profile rows and the stack
    /// sums, or the samples where there are no sums.
    pub const SUMMED: Projection = Projection {
        symbols: true,
        samples: Samples::UnlessSummed,
        sample_labels: false,
        profiles_when_summed: true,
    };
    /// What a flame graph over the whole dataset needs: [`Projection::SUMMED`] without
    /// the profile rows where there are sums. A busy service's hour holds thousands of
    /// rows, more memory than its symbols; a flame graph reads none of them.
    pub const VALUES: Projection = Projection {
        symbols: true,
        samples: Samples::UnlessSummed,
        sample_labels: false,
        profiles_when_summed: false,
    };

    /// Whether a dataset decoded with `self` holds everything `other` would read.
    pub fn covers(&self, other: &Projection) -> bool {
        let samples = matches!(
            (self.samples, other.samples),
            (Samples::Read, _)
                | (_, Samples::Skip)
                | (Samples::UnlessSummed, Samples::UnlessSummed)
        );
        (self.symbols || !other.symbols)
            && samples
            && (self.sample_labels || !other.sample_labels)
            && (self.profiles_when_summed || !other.profiles_when_summed)
    }

    /// Whether a decode may read a column at all, before or after the samples are
    /// decided on: what a reader that fetches only some columns must fetch
    /// ([`crate::ranged::column_fetch`]). The profile rows are read wherever a dataset has
    /// no stack sums, and that is known only once its sums are read.
    pub fn may_read(&self, column: usize) -> bool {
        use columns::*;
        self.wants(column)
            || PROFILES.contains(&column)
            || PROFILE_TOTALS.contains(&column)
            || (SAMPLES.contains(&column) && self.samples != Samples::Skip)
    }

    /// Whether a column is read before the samples are decided on.
    fn wants(&self, column: usize) -> bool {
        use columns::*;
        if HEADER.contains(&column) || STRINGS.contains(&column) || SERIES.contains(&column) {
            return true;
        }
        if SAMPLES.contains(&column)
            || PROFILES.contains(&column)
            || PROFILE_TOTALS.contains(&column)
        {
            return false;
        }
        if STACK_SUMS.contains(&column) {
            return self.samples != Samples::Skip;
        }
        if SAMPLE_LABELS.contains(&column) {
            return self.sample_labels;
        }
        self.symbols
    }
}

/// The stored (compressed) bytes of one dataset, split where the schema splits: its
/// symbols (`strings` to `stacks`, columns 4–21), which every flush writes again for each
/// dataset of a service, and the rest (series, profiles, samples, sums).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DatasetBytes {
    pub symbols: u64,
    pub profiles: u64,
}

/// [`DatasetBytes`] of every dataset of a block, in row-group order, from its footer.
pub fn dataset_bytes(block: &Bytes) -> Result<Vec<DatasetBytes>, StorageError> {
    guarded(|| {
        let reader = SerializedFileReader::new(block.clone())?;
        Ok(reader
            .metadata()
            .row_groups()
            .iter()
            .map(|group| {
                let mut bytes = DatasetBytes::default();
                for (index, column) in group.columns().iter().enumerate() {
                    let size = u64::try_from(column.compressed_size()).unwrap_or(0);
                    match index {
                        4..=21 => bytes.symbols += size,
                        22.. => bytes.profiles += size,
                        _ => {}
                    }
                }
                bytes
            })
            .collect())
    })
}

/// The codecs of a block's column chunks (`SNAPPY`, `ZSTD`, …), each once, from its
/// footer: which of [`BlockEncoding`] wrote it, for operators and tests. The footer does
/// not keep a codec's level.
pub fn block_compression(block: &Bytes) -> Result<Vec<String>, StorageError> {
    guarded(|| {
        let reader = SerializedFileReader::new(block.clone())?;
        let mut codecs: Vec<String> = reader
            .metadata()
            .row_groups()
            .iter()
            .flat_map(|group| group.columns())
            .map(|column| match column.compression() {
                Compression::ZSTD(_) => "ZSTD".to_string(),
                Compression::GZIP(_) => "GZIP".to_string(),
                Compression::BROTLI(_) => "BROTLI".to_string(),
                other => other.to_string(),
            })
            .collect();
        codecs.sort();
        codecs.dedup();
        Ok(codecs)
    })
}

/// Decodes dataset `row_group` of a block, reading only the projected columns.
///
/// The `parquet` crate panics on some corrupt metadata instead of returning an error; a
/// corrupt object must not take the server down, so such a panic becomes an error here.
pub fn decode_dataset(
    block: &Bytes,
    row_group: usize,
    projection: Projection,
) -> Result<Dataset, StorageError> {
    decode_dataset_from(block.clone(), row_group, projection)
}

/// [`decode_dataset`] from any Parquet reader: the whole block in memory, or only the
/// parts of it one dataset needs ([`crate::ranged::PartialBlock`]).
pub fn decode_dataset_from<R: parquet::file::reader::ChunkReader + 'static>(
    reader: R,
    row_group: usize,
    projection: Projection,
) -> Result<Dataset, StorageError> {
    guarded(|| decode_dataset_unguarded(reader, row_group, projection))
}

/// [`decode_dataset_from`] with the block's footer already parsed (a block tail's), so
/// that it is not parsed again for each dataset: `group` is the dataset's row group, of a
/// block whose version has `column_count` columns ([`check_version`]).
pub fn decode_row_group<R: parquet::file::reader::ChunkReader + 'static>(
    reader: R,
    group: &RowGroupMetaData,
    column_count: usize,
    projection: Projection,
) -> Result<Dataset, StorageError> {
    guarded(|| {
        let reader = SerializedRowGroupReader::new(
            Arc::new(reader),
            group,
            // No page index is read: the row group's position does not matter.
            RowGroupPageIndex::new(0, None),
            Arc::new(ReaderProperties::builder().build()),
        )?;
        decode_group(&reader, projection, column_count)
    })
}

/// Runs a decoder, turning a panic inside the parquet crate into a corrupt-block error.
fn guarded<T>(decode: impl FnOnce() -> Result<T, StorageError>) -> Result<T, StorageError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        Err(StorageError::Corrupt(format!(
            "parquet decoder failed: {message}"
        )))
    })
}

/// The number of columns the block's format version has, or an error for a version this
/// reader does not know.
pub(crate) fn check_version(metadata: &ParquetMetaData) -> Result<usize, StorageError> {
    let version = metadata
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| kv.iter().find(|kv| kv.key == "kiln.block.version"))
        .and_then(|kv| kv.value.clone());
    match version.as_deref() {
        Some(FORMAT_VERSION | "2") => Ok(COLUMN_COUNT),
        Some("1") => Ok(V1_COLUMN_COUNT),
        _ => Err(StorageError::Corrupt(format!(
            "unsupported block format version {version:?}"
        ))),
    }
}

fn decode_dataset_unguarded<R: parquet::file::reader::ChunkReader + 'static>(
    block: R,
    row_group: usize,
    projection: Projection,
) -> Result<Dataset, StorageError> {
    let reader = SerializedFileReader::new(block)?;
    let column_count = check_version(reader.metadata())?;
    if row_group >= reader.num_row_groups() {
        return Err(StorageError::Corrupt(format!(
            "row group {row_group} out of range ({})",
            reader.num_row_groups()
        )));
    }
    let group = reader.get_row_group(row_group)?;
    decode_group(group.as_ref(), projection, column_count)
}

/// Decodes the projected columns of a block with `column_count` columns (its version's).
fn decode_group(
    group: &dyn RowGroupReader,
    projection: Projection,
    column_count: usize,
) -> Result<Dataset, StorageError> {
    if group.num_columns() != column_count {
        return Err(StorageError::Corrupt(format!(
            "block has {} columns, expected {column_count}",
            group.num_columns()
        )));
    }
    let records = usize::try_from(group.metadata().num_rows())
        .ok()
        .filter(|records| *records >= 1)
        .ok_or_else(|| StorageError::Corrupt("a dataset of no records".into()))?;
    let read = |index: usize| -> Result<Option<Column>, StorageError> {
        let column = group.get_column_reader(index)?;
        Ok(Some(read_column(
            column,
            index < columns::STRINGS.start,
            records,
        )?))
    };
    let mut decoded: Vec<Option<Column>> = (0..COLUMN_COUNT).map(|_| None).collect();
    for (index, slot) in decoded.iter_mut().enumerate().take(column_count) {
        if projection.wants(index) {
            *slot = read(index)?;
        }
    }
    let summed = decoded[columns::STACK_SUMS.start]
        .as_ref()
        .is_some_and(|column| column.len() > 0);
    let samples = match projection.samples {
        Samples::Read => true,
        Samples::Skip => false,
        Samples::UnlessSummed => !summed,
    };
    let profiles = samples || !summed || projection.profiles_when_summed;
    let mut late: Vec<usize> = Vec::new();
    if profiles {
        late.extend(columns::PROFILES);
        late.extend(columns::PROFILE_TOTALS.filter(|index| *index < column_count));
    }
    if samples {
        late.extend(columns::SAMPLES);
    }
    for index in late {
        decoded[index] = read(index)?;
    }
    let mut dataset = assemble(decoded, column_count == COLUMN_COUNT, samples)?;
    dataset.profiles_omitted = !profiles;
    Ok(dataset)
}

struct Decoded(Vec<Option<Column>>);

impl Decoded {
    fn u32s(&mut self, index: usize) -> Result<Vec<u32>, StorageError> {
        match self.0[index].take() {
            None => Ok(Vec::new()),
            Some(Column::I32(values)) => Ok(values.into_iter().map(|v| v as u32).collect()),
            Some(_) => Err(StorageError::Corrupt(format!(
                "column {index} is not int32"
            ))),
        }
    }

    fn i64s(&mut self, index: usize) -> Result<Vec<i64>, StorageError> {
        match self.0[index].take() {
            None => Ok(Vec::new()),
            Some(Column::I64(values)) => Ok(values),
            Some(_) => Err(StorageError::Corrupt(format!(
                "column {index} is not int64"
            ))),
        }
    }

    fn bytes(&mut self, index: usize) -> Result<Vec<ByteArray>, StorageError> {
        match self.0[index].take() {
            None => Ok(Vec::new()),
            Some(Column::Bytes(values)) => Ok(values),
            Some(_) => Err(StorageError::Corrupt(format!(
                "column {index} is not binary"
            ))),
        }
    }

    fn text(&mut self, index: usize) -> Result<String, StorageError> {
        Ok(self.bytes(index)?.first().map(text).unwrap_or_default())
    }

    fn single_i64(&mut self, index: usize) -> Result<i64, StorageError> {
        Ok(self.i64s(index)?.first().copied().unwrap_or(0))
    }
}

fn text(value: &ByteArray) -> String {
    String::from_utf8_lossy(value.data()).into_owned()
}

/// The string table, copied once into one buffer (see [`Strings`]).
fn strings(values: &[ByteArray]) -> Strings {
    let bytes = values.iter().map(|value| value.len()).sum();
    let mut strings = Strings::with_capacity(values.len(), bytes);
    for value in values {
        strings.push(&String::from_utf8_lossy(value.data()));
    }
    strings
}

/// Builds the dataset from its decoded columns. `has_totals`: the block is of a version
/// that stores profile totals (otherwise they are summed from the samples, when read).
fn assemble(
    columns: Vec<Option<Column>>,
    has_totals: bool,
    samples_read: bool,
) -> Result<Dataset, StorageError> {
    let mut c = Decoded(columns);
    let mut dataset = Dataset {
        tenant: c.text(0)?,
        service: c.text(1)?,
        min_time_nanos: c.single_i64(2)?,
        max_time_nanos: c.single_i64(3)?,
        strings: strings(&c.bytes(4)?),
        ..Default::default()
    };
    let (starts, limits, offsets) = (c.i64s(5)?, c.i64s(6)?, c.i64s(7)?);
    let (filenames, build_ids, flags) = (c.u32s(8)?, c.u32s(9)?, c.u32s(10)?);
    same_lengths(
        &[
            starts.len(),
            limits.len(),
            offsets.len(),
            filenames.len(),
            build_ids.len(),
            flags.len(),
        ],
        "mappings",
    )?;
    dataset.mappings = (0..starts.len())
        .map(|i| MappingRow {
            memory_start: starts[i] as u64,
            memory_limit: limits[i] as u64,
            file_offset: offsets[i] as u64,
            filename: filenames[i],
            build_id: build_ids[i],
            flags: flags[i],
        })
        .collect();
    let (names, system_names, files, start_lines) =
        (c.u32s(11)?, c.u32s(12)?, c.u32s(13)?, c.i64s(14)?);
    same_lengths(
        &[
            names.len(),
            system_names.len(),
            files.len(),
            start_lines.len(),
        ],
        "functions",
    )?;
    dataset.functions = (0..names.len())
        .map(|i| FunctionRow {
            name: names[i],
            system_name: system_names[i],
            filename: files[i],
            start_line: start_lines[i],
        })
        .collect();
    dataset.location_mapping = c.u32s(15)?;
    dataset.location_address = c.i64s(16)?.into_iter().map(|a| a as u64).collect();
    dataset.location_line_count = c.u32s(17)?;
    dataset.line_function = c.u32s(18)?;
    dataset.line_number = c.i64s(19)?;
    dataset.stack_parent = c.u32s(20)?;
    dataset.stack_location = c.u32s(21)?;
    let (types, label_counts) = (c.u32s(22)?, c.u32s(23)?);
    let (label_names, label_values) = (c.u32s(24)?, c.u32s(25)?);
    same_lengths(&[types.len(), label_counts.len()], "series")?;
    same_lengths(&[label_names.len(), label_values.len()], "series labels")?;
    let mut label_offset = 0usize;
    for (profile_type, count) in types.iter().zip(&label_counts) {
        let end = label_offset
            .checked_add(*count as usize)
            .filter(|end| *end <= label_names.len())
            .ok_or_else(|| {
                StorageError::Corrupt("series label counts overrun the labels".into())
            })?;
        dataset.series.push(SeriesRow {
            profile_type: *profile_type,
            labels: (label_offset..end)
                .map(|i| (label_names[i], label_values[i]))
                .collect(),
        });
        label_offset = end;
    }
    let ids = c.bytes(26)?;
    let (series, times, durations, periods) = (c.u32s(27)?, c.i64s(28)?, c.i64s(29)?, c.i64s(30)?);
    let (type_indexes, sample_counts) = (c.u32s(31)?, c.u32s(32)?);
    same_lengths(
        &[
            ids.len(),
            series.len(),
            times.len(),
            durations.len(),
            periods.len(),
            type_indexes.len(),
            sample_counts.len(),
        ],
        "profiles",
    )?;
    dataset.profiles = (0..ids.len())
        .map(|i| ProfileRow {
            id: ids[i].data().to_vec(),
            series: series[i],
            time_nanos: times[i],
            duration_nanos: durations[i],
            period: periods[i],
            type_index: type_indexes[i],
            sample_count: sample_counts[i],
            total: 0,
        })
        .collect();
    dataset.sample_stack = c.u32s(33)?;
    dataset.sample_value = c.i64s(34)?;
    dataset.sample_label_sample = c.u32s(35)?;
    dataset.sample_label_name = c.u32s(36)?;
    dataset.sample_label_value = c.u32s(37)?;
    dataset.samples_omitted = !samples_read;
    if has_totals {
        let totals = c.i64s(38)?;
        same_lengths(&[totals.len(), dataset.profiles.len()], "profile totals")?;
        for (profile, total) in dataset.profiles.iter_mut().zip(totals) {
            profile.total = total;
        }
    } else if samples_read {
        let mut start = 0usize;
        for profile in &mut dataset.profiles {
            let end = start.saturating_add(profile.sample_count as usize);
            profile.total = dataset
                .sample_value
                .get(start..end)
                .unwrap_or_default()
                .iter()
                .fold(0i64, |total, value| total.saturating_add(*value));
            start = end;
        }
    }
    dataset.stack_sum_series = c.u32s(39)?;
    dataset.stack_sum_stack = c.u32s(40)?;
    dataset.stack_sum_value = c.i64s(41)?;
    Ok(dataset)
}

fn same_lengths(lengths: &[usize], table: &str) -> Result<(), StorageError> {
    if lengths.windows(2).any(|pair| pair[0] != pair[1]) {
        return Err(StorageError::Corrupt(format!(
            "{table} columns differ in length: {lengths:?}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DatasetBuilder;

    /// Two instances' CPU profiles of two stacks each, a sample label on one sample.
    fn dataset() -> Dataset {
        let mut builder = DatasetBuilder::new("t", "svc");
        for (index, instance) in ["a", "b", "a"].iter().enumerate() {
            crate::testing::add_cpu_profile(
                &mut builder,
                &format!("p{index}"),
                &[("service_name", "svc"), ("instance", *instance)],
                1_000 + index as i64,
                &[
                    (&["work", "main"], 10 + index as i64, &[("span_id", "s1")]),
                    (&["idle", "main"], 5, &[]),
                ],
            );
        }
        builder.finish()
    }

    /// Segments leave column statistics out (no Kiln reader uses them, and they were half
    /// of a segment's footer); compacted zstd blocks keep them for other readers.
    #[test]
    fn segments_carry_no_statistics_and_compacted_blocks_do() {
        for (encoding, with_statistics) in [
            (BlockEncoding::Segment, false),
            (BlockEncoding::Snappy, false),
            (BlockEncoding::Compacted, true),
        ] {
            let block = Bytes::from(encode_block_as(&[dataset()], encoding).expect("encodes"));
            let reader = SerializedFileReader::new(block.clone()).expect("a footer");
            let chunks = reader.metadata().row_group(0).columns();
            assert_eq!(chunks.len(), COLUMN_COUNT);
            let counted = chunks
                .iter()
                .filter(|chunk| chunk.statistics().is_some())
                .count();
            let expected = if with_statistics { COLUMN_COUNT } else { 0 };
            assert_eq!(counted, expected, "{encoding:?}");
            assert_eq!(
                decode_dataset(&block, 0, Projection::ALL).expect("decodes"),
                dataset()
            );
        }
    }

    /// `plain_bytes` counts, for every column, what the written column holds: a column
    /// added to the schema without it would be sized 0 and never compressed.
    #[test]
    fn plain_bytes_counts_every_column_as_written() {
        let mut dataset = dataset();
        dataset.sum_stacks();
        for index in 0..COLUMN_COUNT {
            let written = match column_source(&dataset, index).expect("a column") {
                Source::Made(Column::I32(values)) => 4 * values.len(),
                Source::Made(Column::I64(values)) => 8 * values.len(),
                Source::Made(Column::Bytes(values)) => {
                    values.iter().map(|value| value.len() + 4).sum()
                }
                Source::U32(values) => 4 * values.len(),
                Source::I64(values) => 8 * values.len(),
            };
            assert!(written > 0, "column {index} is empty in the test dataset");
            assert_eq!(plain_bytes(&dataset, index), written, "column {index}");
        }
    }

    /// `table_rows` counts every table: each column holds as many values as one of them,
    /// so the records `record_count` makes hold every column.
    #[test]
    fn table_rows_counts_every_table_as_written() {
        let mut dataset = dataset();
        dataset.sum_stacks();
        let rows = table_rows(&dataset);
        for index in columns::STRINGS.start..COLUMN_COUNT {
            let written = column_source(&dataset, index).expect("a column").len();
            assert!(
                rows.contains(&written),
                "column {index}: {written} values, {rows:?}"
            );
        }
    }

    /// In a zstd block, chunks of at most `SMALL_CHUNK_BYTES` are uncompressed (no codec
    /// is made to write or read them) and larger ones zstd; both read back.
    #[test]
    fn small_chunks_of_zstd_blocks_are_uncompressed() {
        let functions: Vec<String> = (0..3_000).map(|i| format!("function_{i}")).collect();
        let stacks: Vec<[&str; 2]> = functions.iter().map(|f| [f.as_str(), "main"]).collect();
        let samples: Vec<crate::testing::TestSample<'_>> = stacks
            .iter()
            .enumerate()
            .map(|(i, stack)| (&stack[..], i as i64 + 1, &[][..]))
            .collect();
        let mut builder = DatasetBuilder::new("t", "svc");
        crate::testing::add_cpu_profile(
            &mut builder,
            "big",
            &[("service_name", "svc")],
            1,
            &samples,
        );
        let mut large = builder.finish();
        large.sum_stacks();
        for (datasets, zstd) in [
            (vec![dataset()], false),
            (vec![dataset(), large.clone()], true),
        ] {
            let block =
                Bytes::from(encode_block_as(&datasets, BlockEncoding::Compacted).expect("encodes"));
            let reader = SerializedFileReader::new(block.clone()).expect("a footer");
            for group in reader.metadata().row_groups() {
                for (index, chunk) in group.columns().iter().enumerate() {
                    let small = datasets
                        .iter()
                        .all(|d| plain_bytes(d, index) <= SMALL_CHUNK_BYTES);
                    let zstd = matches!(chunk.compression(), Compression::ZSTD(_));
                    assert_eq!(zstd, !small, "column {index}: {:?}", chunk.compression());
                    if small {
                        assert_eq!(chunk.compression(), Compression::UNCOMPRESSED);
                    }
                }
            }
            let codecs = block_compression(&block).expect("codecs");
            assert_eq!(codecs.contains(&"ZSTD".to_string()), zstd, "{codecs:?}");
            assert!(codecs.contains(&"UNCOMPRESSED".to_string()), "{codecs:?}");
            for (index, dataset) in datasets.iter().enumerate() {
                assert_eq!(
                    &decode_dataset(&block, index, Projection::ALL).expect("decodes"),
                    dataset
                );
            }
        }
        assert!(plain_bytes(&large, columns::SAMPLES.start) > SMALL_CHUNK_BYTES);
    }

    /// The tables written from the dataset's own vectors (samples, sample labels, stacks,
    /// locations, lines, stack sums), long ones, beside a small dataset in one block.
    #[test]
    fn long_tables_written_from_the_datasets_vectors_round_trip_in_both_encodings() {
        let functions: Vec<String> = (0..70_000).map(|i| format!("f{i}")).collect();
        let stacks: Vec<[&str; 2]> = functions.iter().map(|f| [f.as_str(), "main"]).collect();
        let labels = [("span_id", "s1")];
        let samples: Vec<crate::testing::TestSample<'_>> = stacks
            .iter()
            .enumerate()
            .map(|(i, stack)| (&stack[..], i as i64 + 1, &labels[..]))
            .collect();
        let mut builder = DatasetBuilder::new("t", "svc");
        // Profiles of up to 14,000 samples, under the limit on one profile.
        for (index, samples) in samples.chunks(14_000).enumerate() {
            let id = format!("p{index}");
            let labels = [("service_name", "svc")];
            crate::testing::add_cpu_profile(&mut builder, &id, &labels, 1 + index as i64, samples);
        }
        let mut large = builder.finish();
        large.sum_stacks();
        for len in [
            large.sample_value.len(),
            large.sample_label_sample.len(),
            large.stack_parent.len(),
            large.location_mapping.len(),
            large.line_function.len(),
            large.stack_sum_value.len(),
        ] {
            assert!(len > 65_536, "{len}");
        }
        let small = dataset();
        for encoding in [
            BlockEncoding::Segment,
            BlockEncoding::Snappy,
            BlockEncoding::Compacted,
        ] {
            let block = Bytes::from(
                encode_block_as(&[large.clone(), small.clone()], encoding).expect("encodes"),
            );
            assert_eq!(
                decode_dataset(&block, 0, Projection::ALL).expect("decodes"),
                large
            );
            assert_eq!(
                decode_dataset(&block, 1, Projection::ALL).expect("decodes"),
                small
            );
        }
    }

    /// The pages of a long column end near the writer's 1 MiB: a dataset's tables are
    /// split over records of `RECORD_ROWS` rows, and pages end between records. A
    /// version-2 block of the same dataset (one record, so one page a column) still reads.
    #[test]
    fn long_tables_are_split_over_records_and_paged() {
        let functions: Vec<String> = (0..10_000).map(|i| format!("f{i}")).collect();
        let stacks: Vec<[&str; 2]> = functions.iter().map(|f| [f.as_str(), "main"]).collect();
        let samples: Vec<crate::testing::TestSample<'_>> = stacks
            .iter()
            .enumerate()
            .map(|(i, stack)| (&stack[..], 1 + (i as i64 * 7919) % 100_003, &[][..]))
            .collect();
        let mut builder = DatasetBuilder::new("t", "svc");
        for profile in 0..20 {
            let labels = [("service_name", "svc")];
            let id = format!("p{profile}");
            crate::testing::add_cpu_profile(&mut builder, &id, &labels, 1 + profile, &samples);
        }
        let dataset = builder.finish();
        assert_eq!(dataset.sample_value.len(), 200_000);
        let pages = |block: &Bytes, index: usize| -> Vec<usize> {
            let reader = SerializedFileReader::new(block.clone()).expect("a footer");
            let group = reader.get_row_group(0).expect("a row group");
            let mut pages = group.get_column_page_reader(index).expect("pages");
            let mut sizes = Vec::new();
            while let Some(page) = pages.get_next_page().expect("a page") {
                if matches!(page.page_type(), parquet::basic::PageType::DATA_PAGE) {
                    sizes.push(page.buffer().len());
                }
            }
            sizes
        };
        let rows = |block: &Bytes| {
            let reader = SerializedFileReader::new(block.clone()).expect("a footer");
            reader.metadata().row_group(0).num_rows()
        };
        let value = columns::SAMPLES.start + 1;
        for encoding in [BlockEncoding::Segment, BlockEncoding::Compacted] {
            let block = Bytes::from(
                encode_block_as(std::slice::from_ref(&dataset), encoding).expect("encodes"),
            );
            assert_eq!(
                rows(&block),
                4,
                "{encoding:?}: 200,000 samples in 65,536-row records"
            );
            let sizes = pages(&block, value);
            assert!(sizes.len() >= 2, "{encoding:?}: {sizes:?}");
            let bound = (1 << 20) + 8 * RECORD_ROWS + 4096;
            assert!(
                sizes.iter().all(|size| *size <= bound),
                "{encoding:?}: {sizes:?}"
            );
            assert_eq!(
                decode_dataset(&block, 0, Projection::ALL).expect("decodes"),
                dataset
            );
        }
        let version_2 = Bytes::from(
            encode_version(
                std::slice::from_ref(&dataset),
                BlockEncoding::Compacted,
                SCHEMA,
                "2",
            )
            .expect("encodes"),
        );
        assert_eq!(rows(&version_2), 1);
        let sizes = pages(&version_2, value);
        assert_eq!(sizes.len(), 1, "one record, one page: {sizes:?}");
        assert!(sizes[0] >= 8 * 200_000, "{sizes:?}");
        assert_eq!(
            decode_dataset(&version_2, 0, Projection::ALL).expect("decodes"),
            dataset
        );
    }

    #[test]
    fn version_1_blocks_still_read_and_sum_their_totals() {
        let mut dataset = dataset();
        assert!(dataset.profiles.iter().all(|p| p.total != 0));
        let block = Bytes::from(
            encode_version(
                std::slice::from_ref(&dataset),
                BlockEncoding::Compacted,
                SCHEMA_V1,
                "1",
            )
            .expect("encodes"),
        );
        // The totals are summed from the samples, as version 2 stores them.
        assert_eq!(
            decode_dataset(&block, 0, Projection::ALL).expect("decodes"),
            dataset
        );
        // No sums in version 1: a summed read falls back to the samples.
        let summed = decode_dataset(&block, 0, Projection::SUMMED).expect("decodes");
        assert!(!summed.samples_omitted);
        assert_eq!(summed.sample_value, dataset.sample_value);
        // Written today, the same dataset carries its sums and skips its samples.
        dataset.sum_stacks();
        let block = Bytes::from(
            encode_block_as(std::slice::from_ref(&dataset), BlockEncoding::Compacted)
                .expect("encodes"),
        );
        let summed = decode_dataset(&block, 0, Projection::SUMMED).expect("decodes");
        assert!(summed.samples_omitted);
        assert!(summed.sample_value.is_empty());
        summed.check().expect("a summed dataset passes its checks");
        // Instance a: work 10 + 12, idle 5 + 5; instance b: work 11, idle 5. One row per
        // (series, stack), the label sets of the samples merged.
        let mut sums = summed.stack_sum_value.clone();
        sums.sort_unstable();
        assert_eq!(sums, [5, 10, 11, 22]);
        assert!(summed.stack_sum_series.windows(2).all(|w| w[0] <= w[1]));
        // An unknown version is refused.
        let future =
            encode_version(&[dataset], BlockEncoding::Segment, SCHEMA, "4").expect("encodes");
        assert!(decode_dataset(&Bytes::from(future), 0, Projection::ALL).is_err());
    }

    /// Compaction keeps a dataset's stack sums only where they are much smaller than its
    /// samples. Ten instances with one profile each would sum to as many rows as they
    /// have samples: none are kept, and a summed read gets the samples, totals and all.
    /// One instance's ten alike profiles sum to a tenth of their samples: kept, equal to
    /// the unconditional sums, and sized once.
    #[test]
    fn sums_are_kept_only_where_much_smaller_than_the_samples() {
        let stacks = [["work", "main"], ["idle", "main"], ["gc", "main"]];
        let samples: Vec<crate::testing::TestSample<'_>> = stacks
            .iter()
            .map(|stack| (&stack[..], 10, &[][..]))
            .collect();
        let dataset = |instances: usize| {
            let mut builder = DatasetBuilder::new("t", "svc");
            for i in 0..10 {
                let instance = format!("i{}", i % instances);
                crate::testing::add_cpu_profile(
                    &mut builder,
                    &format!("p{i}"),
                    &[("service_name", "svc"), ("instance", &instance)],
                    i as i64 + 1,
                    &samples,
                );
            }
            builder.finish()
        };
        let summed_read = |dataset: &Dataset| {
            let block = Bytes::from(
                encode_block_as(std::slice::from_ref(dataset), BlockEncoding::Compacted)
                    .expect("encodes"),
            );
            decode_dataset(&block, 0, Projection::SUMMED).expect("decodes")
        };

        let mut spread = dataset(10);
        assert_eq!(spread.sample_stack.len(), 30);
        assert!(!spread.sum_stacks_if_smaller());
        assert!(spread.stack_sum_series.is_empty() && spread.stack_sum_value.is_empty());
        let read = summed_read(&spread);
        assert!(!read.samples_omitted);
        assert_eq!(read.sample_value.iter().sum::<i64>(), 300);
        assert_eq!(read.profiles.iter().map(|p| p.total).sum::<i64>(), 300);

        let mut alike = dataset(1);
        let mut reference = alike.clone();
        reference.sum_stacks();
        assert!(alike.sum_stacks_if_smaller());
        assert_eq!(alike.stack_sum_series, reference.stack_sum_series);
        assert_eq!(alike.stack_sum_stack, reference.stack_sum_stack);
        let mut sums = alike.stack_sum_value.clone();
        sums.sort_unstable();
        assert_eq!(sums, [100, 100, 100]);
        assert_eq!(sums, {
            let mut reference = reference.stack_sum_value.clone();
            reference.sort_unstable();
            reference
        });
        assert_eq!(alike.stack_sum_series.capacity(), 3);
        assert_eq!(alike.stack_sum_value.capacity(), 3);
        let read = summed_read(&alike);
        assert!(read.samples_omitted);
        assert_eq!(read.stack_sum_value.iter().sum::<i64>(), 300);
    }
}

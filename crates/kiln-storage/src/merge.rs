//! The streaming merge: many datasets of one (tenant, service) into one, holding their
//! samples once, as the output's columns, and not the inputs decoded whole.
//!
//! Compaction used to decode every input whole into a [`DatasetBuilder`] and encode the
//! result at the end, so a job held all of its samples twice over: a day of one service
//! at 0.1 Hz (8,640 profiles) peaked at 224 MiB, and a job was capped at 2,000 profiles,
//! which left a day in five blocks that each repeated its symbols (docs/benchmarks.md).
//! Here only what is small is held whole:
//!
//! 1. **Symbols, once.** Each input's symbol tables, series and profile rows are decoded
//!    (not its samples) and interned into one builder, which says where each input's
//!    strings, stack nodes and series went. The builder numbers the series canonically
//!    (by text, [`crate::builder::canonical_series`]), as every merge's output is.
//! 2. **The order of the profile rows.** Rows sort by (series, time, id); an input that
//!    was itself written by a merge is sorted the same way in canonical series, so its
//!    rows appear in the output in the order it stores them.
//! 3. **Samples, one page at a time.** The sample columns of each such input are read
//!    front to back, a page at a time ([`Gate`]), renumbered, and written to the output's
//!    sample and sample-label columns as they come, each by a [`format::ChunkWriter`]
//!    into a buffer of its own, so that what the merge holds of them is their encoded
//!    pages. Stack sums ([`StackSums`]) and profile totals are summed on the way. An
//!    input whose rows would be read out of order (a segment, or a block written before
//!    series were numbered canonically, each small: jobs were capped then) is decoded
//!    whole.
//! 4. **The block.** The other columns are written from the output's tables, and the
//!    sample columns put in place as encoded ([`format::encode_with_chunks`]).
//!
//! What is held: the inputs' fetched (compressed) bytes, the symbols, the profile rows,
//! one page and at most a record of values per input column (a block of format version 3
//! splits a dataset's tables over records of [`format::RECORD_ROWS`] rows, and parquet-rs
//! ends pages between records; a version-2 block's columns are one page each, and so
//! whole), the output's sample columns as encoded, the stack sums (at most half as many
//! rows as the samples, or none) and the block. The sample columns were held as plain
//! values, 12 bytes a sample, while they were encoded with the rest of the row group at
//! the end: a row group's columns are written one after another, while a merge fills
//! them together. Encoded apart and put in after, byte for byte as the block writer
//! would write them (tests/stream_merge.rs), they take what their compressed pages take:
//! a 1 Hz day of one service then merges into one block under the default
//! `memory_limit`, where it took four (docs/benchmarks.md).
//!
//! Each input sample becomes one output sample (its stack renumbered), so the output is
//! what the in-memory merge makes of the same inputs, row for row: an input whose stack
//! nodes do not map to distinct nodes (two nodes with the same frame and parent, which no
//! Kiln writer makes) would need its profiles' samples summed anew, and the merge then
//! answers [`Streamed::Declined`] for the caller's in-memory merge.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::column::reader::{get_column_reader, get_typed_column_reader, ColumnReaderImpl};
use parquet::data_type::{DataType, Int32Type, Int64Type};
use parquet::file::metadata::page_index::RowGroupPageIndex;
use parquet::file::properties::ReaderProperties;
use parquet::file::reader::RowGroupReader;
use parquet::file::serialized_reader::SerializedRowGroupReader;

use crate::builder::DatasetBuilder;
use crate::dataset::{Dataset, ProfileRow};
use crate::format::{self, columns, BlockEncoding, ChunkWriter, Projection, Samples};
use crate::ranged::PartialBlock;
use crate::StorageError;

/// One input: a dataset's fetched bytes, and a name for errors.
pub struct MergeInput {
    pub name: String,
    pub block: PartialBlock,
    pub row_group: usize,
}

/// What [`merge`] made.
pub enum Streamed {
    /// The block (one dataset) and its dataset's header: times, profile types and count.
    Merged(MergedBlock),
    /// Inputs the streaming merge does not take as they are (see the module doc).
    Declined(String),
}

pub struct MergedBlock {
    pub block: Vec<u8>,
    pub min_time_nanos: i64,
    pub max_time_nanos: i64,
    pub profile_types: Vec<String>,
    pub profile_count: u64,
    /// Inputs decoded whole because their rows were out of the output's order.
    pub decoded_whole: usize,
    /// How many of the inputs, from the first, the block holds: those that fit in the
    /// memory limit (at least one). The rest are for another merge.
    pub inputs_used: usize,
    /// What the merge expected to hold at its peak, for the inputs it took.
    pub estimated_bytes: usize,
}

/// The symbol columns, series and profile rows: everything but the samples.
const HEAD: Projection = Projection {
    symbols: true,
    samples: Samples::Skip,
    sample_labels: false,
    profiles_when_summed: true,
};

/// Merges `inputs`, all of `tenant`'s `service`, into one block of `encoding`: as many of
/// them, from the first, as fit in `memory_limit` bytes by [`input_cost`] (at least one).
/// Stack sums are kept as [`Dataset::sum_stacks_if_smaller`] keeps them.
pub fn merge(
    tenant: &str,
    service: &str,
    inputs: &[MergeInput],
    encoding: BlockEncoding,
    memory_limit: usize,
) -> Result<Streamed, StorageError> {
    // The encoder's pages, once for the output.
    let mut estimated_bytes = ENCODER_BYTES;
    let corrupt = |name: &str, what: String| StorageError::Corrupt(format!("{name}: {what}"));
    // 1. Symbols, series and profile rows of every input.
    let mut builder = DatasetBuilder::new(tenant, service);
    let mut heads = Vec::with_capacity(inputs.len());
    for input in inputs {
        let head = crate::ranged::decode_partial(input.block.clone(), input.row_group, HEAD)
            .map_err(|err| corrupt(&input.name, err.to_string()))?;
        head.check().map_err(|err| corrupt(&input.name, err))?;
        if head.tenant != tenant || head.service != service {
            return Err(corrupt(
                &input.name,
                format!(
                    "holds {}/{}, not {tenant}/{service}",
                    head.tenant, head.service
                ),
            ));
        }
        let cost = input_cost(input, &head, encoding)?;
        if !heads.is_empty() && estimated_bytes.saturating_add(cost) > memory_limit {
            break;
        }
        estimated_bytes = estimated_bytes.saturating_add(cost);
        let map = builder.add_symbols(&head);
        heads.push(Head {
            strings: map.strings,
            stacks: map.stacks,
            series: map.series,
            profiles: head.profiles,
        });
    }
    let (mut out, series_order) = builder.finish_with_series();
    let stack_count = out.stack_parent.len();
    let mut seen = vec![false; stack_count];
    let inputs = &inputs[..heads.len()];
    for (head, input) in heads.iter_mut().zip(inputs) {
        for series in &mut head.series {
            *series = series_order[*series as usize];
        }
        // Distinct nodes must stay distinct, or a profile's samples would need summing.
        for node in head.stacks.iter().skip(1) {
            if std::mem::replace(&mut seen[*node as usize], true) {
                return Ok(Streamed::Declined(format!(
                    "{}: two stack nodes are the same",
                    input.name
                )));
            }
        }
        for node in head.stacks.iter().skip(1) {
            seen[*node as usize] = false;
        }
    }
    drop(seen);

    // 2. The output's row order, and which inputs it reads front to back.
    let mut order: Vec<(u32, u32)> = Vec::new();
    for (input, head) in heads.iter().enumerate() {
        order.extend((0..head.profiles.len() as u32).map(|row| (input as u32, row)));
    }
    let row = |(input, row): (u32, u32)| &heads[input as usize].profiles[row as usize];
    let series_of = |(input, row): (u32, u32)| {
        let head = &heads[input as usize];
        head.series[head.profiles[row as usize].series as usize]
    };
    order.sort_by(|a, b| {
        (series_of(*a), row(*a).time_nanos, &row(*a).id, a.0, a.1).cmp(&(
            series_of(*b),
            row(*b).time_nanos,
            &row(*b).id,
            b.0,
            b.1,
        ))
    });
    let mut last: Vec<Option<u32>> = vec![None; inputs.len()];
    let mut in_order = vec![true; inputs.len()];
    for (input, row) in &order {
        let input = *input as usize;
        if last[input].is_some_and(|last| last > *row) {
            in_order[input] = false;
        }
        last[input] = Some(*row);
    }
    let mut sources = Vec::with_capacity(inputs.len());
    let mut decoded_whole = 0;
    for ((input, head), in_order) in inputs.iter().zip(&heads).zip(&in_order) {
        sources.push(if *in_order {
            Source::Streamed(Box::new(
                StreamedInput::open(input).map_err(|err| corrupt(&input.name, err.to_string()))?,
            ))
        } else {
            decoded_whole += 1;
            let whole = crate::ranged::decode_partial(
                input.block.clone(),
                input.row_group,
                Projection::ALL,
            )
            .map_err(|err| corrupt(&input.name, err.to_string()))?;
            whole.check().map_err(|err| corrupt(&input.name, err))?;
            if whole.profiles.len() != head.profiles.len() {
                return Err(corrupt(&input.name, "read differently twice".into()));
            }
            Source::Whole(Box::new(whole))
        });
    }
    let samples: u64 = (heads.iter())
        .flat_map(|head| head.profiles.iter().map(|p| u64::from(p.sample_count)))
        .sum();

    // 3. The sample columns, encoded as the rows come: held as their pages, not whole.
    out.profiles = order
        .iter()
        .map(|at| ProfileRow {
            series: series_of(*at),
            total: 0,
            ..row(*at).clone()
        })
        .collect();
    let label_rows: usize = inputs.iter().map(label_rows_of).sum();
    let levels = format::record_levels();
    let mut sinks = [(); 5].map(|_| ChunkWriter::<Int32Type>::sink());
    let [stack_sink, value_sink, label_sample_sink, label_name_sink, label_value_sink] = &mut sinks;
    let (first, labels_at) = (columns::SAMPLES.start, columns::SAMPLE_LABELS.start);
    let samples = samples as usize;
    let mut stack_column =
        ChunkWriter::<Int32Type>::new(stack_sink, first, encoding, 4 * samples, &levels)?;
    let mut value_column =
        ChunkWriter::<Int64Type>::new(value_sink, first + 1, encoding, 8 * samples, &levels)?;
    let label_column = |sink, at| {
        ChunkWriter::<Int32Type>::new(sink, labels_at + at, encoding, 4 * label_rows, &levels)
    };
    let mut label_sample_column = label_column(label_sample_sink, 0)?;
    let mut label_name_column = label_column(label_name_sink, 1)?;
    let mut label_value_column = label_column(label_value_sink, 2)?;
    let mut sums = StackSums::new(stack_count, samples / 2);
    let (mut written, mut labels_written) = (0usize, 0usize);
    let mut picked: Vec<(u32, u32)> = Vec::new();
    let mut labels: Vec<(u32, u32, u32)> = Vec::new();
    for (at, profile) in order.iter().zip(out.profiles.iter_mut()) {
        let input = at.0 as usize;
        let head = &heads[input];
        let count = profile.sample_count as usize;
        let (stacks, values) = sources[input]
            .samples(at.1 as usize, count, &mut labels)
            .map_err(|err| corrupt(&inputs[input].name, err.to_string()))?;
        // Renumbered, a profile's samples sort by their new stacks.
        picked.clear();
        for (local, stack) in stacks.iter().enumerate() {
            let node = head.stacks.get(*stack as usize).copied().unwrap_or(0);
            picked.push((node, local as u32));
        }
        picked.sort_unstable();
        labels.sort_unstable_by_key(|(local, _, _)| *local);
        let string = |id: u32| head.strings.get(id as usize).copied().unwrap_or(0);
        sums.enter(profile.series);
        let mut total = 0i64;
        for (node, local) in &picked {
            let value = values[*local as usize];
            total = total.saturating_add(value);
            let start = labels.partition_point(|(l, _, _)| l < local);
            for (_, name, label) in labels[start..].iter().take_while(|(l, _, _)| l == local) {
                // Ids are stored as int32, bit for bit.
                label_sample_column.push(written as u32 as i32)?;
                label_name_column.push(string(*name) as i32)?;
                label_value_column.push(string(*label) as i32)?;
                labels_written += 1;
            }
            stack_column.push(*node as i32)?;
            value_column.push(value)?;
            sums.add(*node, value);
            written += 1;
        }
        profile.total = total;
    }
    drop(sources);
    if let Some((series, stacks, values)) = sums.finish(written / 2) {
        out.stack_sum_series = series;
        out.stack_sum_stack = stacks;
        out.stack_sum_value = values;
    }
    out.min_time_nanos = out.profiles.iter().map(|p| p.time_nanos).min().unwrap_or(0);
    out.max_time_nanos = out.profiles.iter().map(|p| p.time_nanos).max().unwrap_or(0);
    let (profile_types, profile_count) = out.summary();
    let mut rows = format::table_rows(&out);
    rows[9] = written;
    rows[10] = labels_written;
    let records = format::records_for(rows.into_iter().max().unwrap_or(0), format::RECORD_ROWS);
    let closed = [
        stack_column.finish(records)?,
        value_column.finish(records)?,
        label_sample_column.finish(records)?,
        label_name_column.finish(records)?,
        label_value_column.finish(records)?,
    ];
    drop(levels);
    let mut chunks = Vec::with_capacity(closed.len());
    for ((index, close), sink) in closed.into_iter().zip(sinks) {
        chunks.push((index, close.with_bytes(sink)?));
    }
    let block = format::encode_with_chunks(&out, encoding, rows, chunks)?;
    Ok(Streamed::Merged(MergedBlock {
        block,
        min_time_nanos: out.min_time_nanos,
        max_time_nanos: out.max_time_nanos,
        inputs_used: heads.len(),
        estimated_bytes,
        profile_types,
        profile_count,
        decoded_whole,
    }))
}

/// The stack sums of a merge's output ([`Dataset::sum_stacks_if_smaller`]'s rows, made
/// as the output's samples go by rather than from them, since they are not kept): the
/// output's profiles come series by series, so each series' sums are made in turn.
struct StackSums {
    slots: Vec<i64>,
    used: Vec<bool>,
    touched: Vec<u32>,
    current: Option<u32>,
    /// Distinct stacks per series, summed: [`Dataset::sum_stacks_if_smaller`]'s bound.
    distinct: usize,
    max_rows: usize,
    /// Over `max_rows`: no sums.
    over: bool,
    series: Vec<u32>,
    stacks: Vec<u32>,
    values: Vec<i64>,
}

impl StackSums {
    fn new(stack_count: usize, max_rows: usize) -> Self {
        StackSums {
            slots: vec![0; stack_count],
            used: vec![false; stack_count],
            touched: Vec::new(),
            current: None,
            distinct: 0,
            max_rows,
            over: false,
            series: Vec::new(),
            stacks: Vec::new(),
            values: Vec::new(),
        }
    }

    fn enter(&mut self, series: u32) {
        if self.current != Some(series) {
            self.close_series();
            self.current = Some(series);
        }
    }

    fn add(&mut self, stack: u32, value: i64) {
        if self.over {
            return;
        }
        let Some(slot) = self.slots.get_mut(stack as usize) else {
            return;
        };
        *slot = slot.saturating_add(value);
        if !std::mem::replace(&mut self.used[stack as usize], true) {
            self.touched.push(stack);
        }
    }

    fn close_series(&mut self) {
        let Some(series) = self.current.take() else {
            return;
        };
        if self.over {
            return;
        }
        self.distinct += self.touched.len();
        if self.distinct > self.max_rows {
            *self = StackSums {
                over: true,
                ..StackSums::new(0, 0)
            };
            return;
        }
        self.touched.sort_unstable();
        for stack in self.touched.drain(..) {
            self.used[stack as usize] = false;
            let value = std::mem::take(&mut self.slots[stack as usize]);
            if value != 0 {
                self.series.push(series);
                self.stacks.push(stack);
                self.values.push(value);
            }
        }
    }

    /// The rows, or `None` when they would be more than `max_rows` (at most the bound it
    /// was made with: that one is the samples expected, this one those written).
    fn finish(mut self, max_rows: usize) -> Option<(Vec<u32>, Vec<u32>, Vec<i64>)> {
        self.close_series();
        (!self.over && self.distinct <= max_rows).then_some((self.series, self.stacks, self.values))
    }
}

/// An input's sample-label rows, at most: its column chunk's level count.
fn label_rows_of(input: &MergeInput) -> usize {
    (input.block.group(input.row_group).ok())
        .map(|(group, _)| {
            group
                .column(columns::SAMPLE_LABELS.start)
                .num_values()
                .max(0) as usize
        })
        .unwrap_or(0)
}

/// The most a data page of a block of format version 3 holds, in bytes: parquet-rs ends a
/// page at the first record boundary past its 1 MiB limit, and a record of an int64
/// column is at most [`format::RECORD_ROWS`] values.
const PAGE_BYTES: usize = (1 << 20) + 8 * format::RECORD_ROWS;

/// What the output's encoders hold beside their chunks, once per merge: the five sample
/// and sample-label columns' writers, each a page of plain values and a record of values
/// staged ([`format::ChunkWriter`]), and the page being compressed; and, as the block is
/// put together, the writer of one other column and its page.
const ENCODER_BYTES: usize = 7 * PAGE_BYTES + 5 * 8 * format::RECORD_ROWS;

/// What merging `input` holds at the merge's peak, in bytes, from its decoded `head`.
/// Measured against a counting allocator (tests/merge_memory.rs):
///
/// - always: its fetched bytes; its symbols twice (decoded, and interned into the
///   output), and a stack sum's slot and mark for each of its stack nodes; its profile
///   rows twice;
/// - while merging: its five sample and sample-label columns, each a page at a time: the
///   decompressed page and at most two records of decoded values (in a block of version
///   2, where a dataset is one record and so each column one page, the columns whole and
///   their page once more); and its share of the output's sample columns as encoded
///   ([`output_chunk_bytes`]), twice, as their buffers grow by doubling;
/// - after (the inputs freed): those chunks, copied into the block (sized once), and the
///   output's stack sums, at most a row of 16 bytes per two samples or per row of the
///   input's own sums ([`Dataset::sum_stacks_if_smaller`]), twice, as they grow.
///
/// The output's samples were held whole, 12 bytes a sample and label, until their columns
/// were encoded as they fill: a day at 1 Hz then took four blocks at the default
/// `memory_limit` (docs/benchmarks.md).
///
/// An input whose series are not in canonical order is decoded whole, once more.
pub fn input_cost(
    input: &MergeInput,
    head: &Dataset,
    encoding: BlockEncoding,
) -> Result<usize, StorageError> {
    let (group, column_count) = input.block.group(input.row_group)?;
    let samples: usize = head.profiles.iter().map(|p| p.sample_count as usize).sum();
    let order = crate::builder::canonical_series(&head.strings, &head.series);
    let canonical = order.iter().enumerate().all(|(at, id)| at == *id as usize);
    let profiles: usize = (head.profiles.iter())
        .map(|p| p.id.len() + std::mem::size_of::<ProfileRow>())
        .sum();
    let one_record = group.num_rows() <= 1;
    let (mut read, mut plain) = (0usize, 0usize);
    for index in columns::SAMPLES.start..columns::SAMPLE_LABELS.end {
        let chunk = group.column(index);
        let width = if index == columns::SAMPLES.start + 1 {
            8
        } else {
            4
        };
        let values = chunk.num_values().max(0) as usize;
        let page = chunk.uncompressed_size().max(0) as usize;
        read += if one_record {
            page + width * values
        } else {
            (page + width * values).min(PAGE_BYTES + 2 * width * format::RECORD_ROWS)
        };
        plain += width * values;
    }
    let chunks = output_chunk_bytes(input, encoding, plain)?;
    // An empty table is a level a record, no rows; a version-1 block has no such column.
    let sums = (column_count > columns::STACK_SUMS.start)
        .then(|| group.column(columns::STACK_SUMS.start).num_values().max(0) as usize)
        .filter(|sums| *sums > group.num_rows().max(0) as usize);
    let sum_rows = sums.unwrap_or(samples).min(samples / 2);
    let merging = read + 2 * chunks;
    let finishing = 2 * chunks + 32 * sum_rows;
    let whole = if canonical { 0 } else { plain + read };
    Ok(input.block.size_bytes()
        + 2 * head.heap_bytes()
        + 9 * head.stack_parent.len()
        + 2 * profiles
        + merging.max(finishing)
        + whole)
}

/// What `input`'s samples and sample labels take in the output's encoded columns, whose
/// plain values are `plain` bytes: about what they take in the input where both are zstd
/// (twice that, for a margin: the merged stack ids are wider), at most their plain
/// values.
fn output_chunk_bytes(
    input: &MergeInput,
    encoding: BlockEncoding,
    plain: usize,
) -> Result<usize, StorageError> {
    // Levels (RLE runs: a record's definition levels are one, its repetition levels two),
    // page headers, and snappy's framing of what does not compress: well under a byte in
    // 256 of the values; a record's worth at least.
    let levels = plain / 256 + 4096;
    if encoding != BlockEncoding::Compacted {
        return Ok(plain + levels);
    }
    let (group, _) = input.block.group(input.row_group)?;
    let compressed: usize = (columns::SAMPLES.start..columns::SAMPLE_LABELS.end)
        .map(|index| group.column(index).compressed_size().max(0) as usize)
        .sum();
    Ok((2 * compressed).min(plain) + levels)
}

/// An input's head: where its ids went, and its profile rows.
struct Head {
    strings: Vec<u32>,
    stacks: Vec<u32>,
    series: Vec<u32>,
    profiles: Vec<ProfileRow>,
}

/// Where an input's samples come from.
enum Source {
    /// Read front to back, a page at a time.
    Streamed(Box<StreamedInput>),
    /// Decoded whole, read in any order.
    Whole(Box<Dataset>),
}

impl Source {
    /// Profile row `row`'s `count` samples (stacks and values, in the input's ids), and
    /// into `labels` its sample labels as (sample within the profile, name, value).
    fn samples(
        &mut self,
        row: usize,
        count: usize,
        labels: &mut Vec<(u32, u32, u32)>,
    ) -> Result<(Vec<u32>, Vec<i64>), StorageError> {
        labels.clear();
        match self {
            Source::Streamed(input) => input.next(count, labels),
            Source::Whole(dataset) => {
                let offsets = dataset.profile_sample_offsets();
                let start = offsets.get(row).copied().unwrap_or(0) as usize;
                let end = start + count;
                if end > dataset.sample_stack.len() {
                    return Err(StorageError::Corrupt("samples past the end".into()));
                }
                let first = dataset
                    .sample_label_sample
                    .partition_point(|sample| (*sample as usize) < start);
                for index in first..dataset.sample_label_sample.len() {
                    let sample = dataset.sample_label_sample[index] as usize;
                    if sample >= end {
                        break;
                    }
                    labels.push((
                        (sample - start) as u32,
                        dataset.sample_label_name[index],
                        dataset.sample_label_value[index],
                    ));
                }
                Ok((
                    dataset.sample_stack[start..end].to_vec(),
                    dataset.sample_value[start..end].to_vec(),
                ))
            }
        }
    }
}

/// An input's sample columns, each read a page at a time.
struct StreamedInput {
    stack: Column<Int32Type>,
    value: Column<Int64Type>,
    label_sample: Column<Int32Type>,
    label_name: Column<Int32Type>,
    label_value: Column<Int32Type>,
    /// Samples consumed so far: the global index of the next one.
    consumed: u64,
}

impl StreamedInput {
    fn open(input: &MergeInput) -> Result<Self, StorageError> {
        let (group, column_count) = input.block.group(input.row_group)?;
        if column_count < columns::SAMPLE_LABELS.end {
            return Err(StorageError::Corrupt(format!(
                "block has {column_count} columns"
            )));
        }
        let reader = SerializedRowGroupReader::new(
            Arc::new(input.block.clone()),
            &group,
            RowGroupPageIndex::new(0, None),
            Arc::new(ReaderProperties::builder().build()),
        )?;
        let start = columns::SAMPLES.start;
        let whole = group.num_rows() <= 1;
        Ok(StreamedInput {
            stack: Column::open(&reader, start, whole)?,
            value: Column::open(&reader, start + 1, whole)?,
            label_sample: Column::open(&reader, start + 2, whole)?,
            label_name: Column::open(&reader, start + 3, whole)?,
            label_value: Column::open(&reader, start + 4, whole)?,
            consumed: 0,
        })
    }

    fn next(
        &mut self,
        count: usize,
        labels: &mut Vec<(u32, u32, u32)>,
    ) -> Result<(Vec<u32>, Vec<i64>), StorageError> {
        let stacks: Vec<u32> = (self.stack.take(count)?.iter())
            .map(|v| *v as u32)
            .collect();
        let values = self.value.take(count)?.to_vec();
        let end = self.consumed + count as u64;
        while let Some(sample) = self.label_sample.peek()? {
            let sample = sample as u32 as u64;
            if sample >= end {
                break;
            }
            if sample < self.consumed {
                return Err(StorageError::Corrupt("sample labels out of order".into()));
            }
            self.label_sample.take(1)?;
            let name = *self.label_name.take(1)?.first().unwrap_or(&0) as u32;
            let value = *self.label_value.take(1)?.first().unwrap_or(&0) as u32;
            labels.push(((sample - self.consumed) as u32, name, value));
        }
        self.consumed = end;
        Ok((stacks, values))
    }
}

/// One column of a dataset, read a page at a time.
struct Column<T: DataType> {
    /// Dropped once the chunk's values are all read, with the page it last decoded.
    reader: Option<ColumnReaderImpl<T>>,
    /// Values of the chunk not yet read (its level count: an upper bound).
    left: usize,
    /// The chunk is one page (a dataset of one record).
    whole: bool,
    gate: Arc<Gates>,
    values: Vec<T::T>,
    at: usize,
    definition: Vec<i16>,
    repetition: Vec<i16>,
}

#[derive(Default)]
struct Gates {
    open: AtomicBool,
    ended: AtomicBool,
}

impl<T: DataType> Column<T>
where
    T::T: Copy,
{
    /// `whole`: the dataset is one record, so the column is one page (format version 2).
    fn open(
        reader: &SerializedRowGroupReader<'_, PartialBlock>,
        index: usize,
        whole: bool,
    ) -> Result<Self, StorageError> {
        let gate = Arc::new(Gates::default());
        let pages = Gate {
            inner: reader.get_column_page_reader(index)?,
            gates: gate.clone(),
        };
        let chunk = reader.metadata().column(index);
        let left = chunk.num_values().max(0) as usize;
        let descriptor = chunk.column_descr_ptr();
        let reader = get_typed_column_reader::<T>(get_column_reader(descriptor, Box::new(pages)));
        Ok(Column {
            reader: Some(reader),
            left,
            whole,
            gate,
            values: Vec::new(),
            at: 0,
            definition: Vec::new(),
            repetition: Vec::new(),
        })
    }

    /// Reads pages until `count` values are buffered past `at`, or the column ends.
    fn fill(&mut self, count: usize) -> Result<(), StorageError> {
        while self.values.len() - self.at < count {
            let Some(reader) = self.reader.as_mut() else {
                break;
            };
            if self.gate.ended.load(Ordering::Relaxed) {
                self.reader = None;
                break;
            }
            if self.at > 0 {
                self.values.drain(..self.at);
                self.at = 0;
            }
            // A page that is the whole chunk is sized once: growing to it by doubling
            // would hold it twice over for a moment. Pages of several records are a
            // fraction of the chunk, and the buffer keeps the size of the largest.
            if self.whole {
                self.values.reserve_exact(self.left);
            }
            self.gate.open.store(true, Ordering::Relaxed);
            self.definition.clear();
            self.repetition.clear();
            let before = self.values.len();
            reader.read_records(
                1,
                Some(&mut self.definition),
                Some(&mut self.repetition),
                &mut self.values,
            )?;
            self.left = self.left.saturating_sub(self.values.len() - before);
            if self.left == 0 {
                self.reader = None;
            }
        }
        Ok(())
    }

    fn take(&mut self, count: usize) -> Result<&[T::T], StorageError> {
        self.fill(count)?;
        if self.values.len() - self.at < count {
            return Err(StorageError::Corrupt(
                "a sample column ends before its profiles' samples".into(),
            ));
        }
        let start = self.at;
        self.at += count;
        Ok(&self.values[start..self.at])
    }

    fn peek(&mut self) -> Result<Option<T::T>, StorageError> {
        self.fill(1)?;
        Ok(self.values.get(self.at).copied())
    }
}

/// A page reader that hands out one page each time its gate is opened, so that a column
/// reader asked for a whole record (a dataset's table is one) stops after each page.
struct Gate {
    inner: Box<dyn PageReader>,
    gates: Arc<Gates>,
}

impl Iterator for Gate {
    type Item = parquet::errors::Result<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for Gate {
    fn get_next_page(&mut self) -> parquet::errors::Result<Option<Page>> {
        if !self.gates.open.swap(false, Ordering::Relaxed) {
            return Ok(None);
        }
        let page = self.inner.get_next_page()?;
        if page.is_none() {
            self.gates.ended.store(true, Ordering::Relaxed);
        }
        Ok(page)
    }

    fn peek_next_page(&mut self) -> parquet::errors::Result<Option<PageMetadata>> {
        if !self.gates.open.load(Ordering::Relaxed) {
            return Ok(None);
        }
        self.inner.peek_next_page()
    }

    fn skip_next_page(&mut self) -> parquet::errors::Result<()> {
        self.inner.skip_next_page()
    }

    fn at_record_boundary(&mut self) -> parquet::errors::Result<bool> {
        Ok(false)
    }
}

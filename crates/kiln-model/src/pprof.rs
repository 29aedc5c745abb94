//! The pprof `profile.proto` messages, written from the documented wire format
//! (github.com/google/pprof/proto/profile.proto; field numbers are the contract).
//!
//! `string_table` is decoded as raw bytes rather than `string`: real profiles carry invalid
//! UTF-8 (the corpus has one), and refusing a whole profile over one bad symbol would lose
//! data. Names are converted lossily when they are interned.

use prost::Message;

use crate::compress::maybe_gunzip;
use crate::FormatError;

/// A pprof profile. `Message` is implemented by hand (below) only so that samples decode
/// into [`Samples`]' flat columns instead of three vectors per sample.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct Profile {
    pub sample_type: Vec<ValueType>,
    pub sample: Samples,
    pub mapping: Vec<Mapping>,
    pub location: Vec<Location>,
    pub function: Vec<Function>,
    pub string_table: StringTable,
    pub drop_frames: i64,
    pub keep_frames: i64,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub period_type: Option<ValueType>,
    pub period: i64,
    pub comment: Vec<i64>,
    pub default_sample_type: i64,
    pub doc_url: i64,
}

/// Field numbers of `Profile` (profile.proto).
mod tag {
    pub const SAMPLE_TYPE: u32 = 1;
    pub const SAMPLE: u32 = 2;
    pub const MAPPING: u32 = 3;
    pub const LOCATION: u32 = 4;
    pub const FUNCTION: u32 = 5;
    pub const STRING_TABLE: u32 = 6;
    pub const DROP_FRAMES: u32 = 7;
    pub const KEEP_FRAMES: u32 = 8;
    pub const TIME_NANOS: u32 = 9;
    pub const DURATION_NANOS: u32 = 10;
    pub const PERIOD_TYPE: u32 = 11;
    pub const PERIOD: u32 = 12;
    pub const COMMENT: u32 = 13;
    pub const DEFAULT_SAMPLE_TYPE: u32 = 14;
    pub const DOC_URL: u32 = 15;
    /// Inside `Sample`.
    pub const SAMPLE_LOCATION_ID: u32 = 1;
    pub const SAMPLE_VALUE: u32 = 2;
    pub const SAMPLE_LABEL: u32 = 3;
}

/// Scalar fields of `Profile`, in field order, for encoding and length.
fn profile_scalars(profile: &Profile) -> [(u32, i64); 6] {
    [
        (tag::DROP_FRAMES, profile.drop_frames),
        (tag::KEEP_FRAMES, profile.keep_frames),
        (tag::TIME_NANOS, profile.time_nanos),
        (tag::DURATION_NANOS, profile.duration_nanos),
        (tag::PERIOD, profile.period),
        (tag::DEFAULT_SAMPLE_TYPE, profile.default_sample_type),
    ]
}

impl Message for Profile {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        use prost::encoding::{encode_key, encode_varint, int64, message, WireType};
        message::encode_repeated(tag::SAMPLE_TYPE, &self.sample_type, buf);
        for sample in self.sample.iter() {
            encode_key(tag::SAMPLE, WireType::LengthDelimited, buf);
            encode_varint(sample.encoded_len() as u64, buf);
            sample.encode_raw(buf);
        }
        message::encode_repeated(tag::MAPPING, &self.mapping, buf);
        message::encode_repeated(tag::LOCATION, &self.location, buf);
        message::encode_repeated(tag::FUNCTION, &self.function, buf);
        self.string_table.encode_raw(buf);
        let scalars = profile_scalars(self);
        for (field, value) in &scalars[..4] {
            if *value != 0 {
                int64::encode(*field, value, buf);
            }
        }
        if let Some(period_type) = &self.period_type {
            message::encode(tag::PERIOD_TYPE, period_type, buf);
        }
        if self.period != 0 {
            int64::encode(tag::PERIOD, &self.period, buf);
        }
        int64::encode_packed(tag::COMMENT, &self.comment, buf);
        if self.default_sample_type != 0 {
            int64::encode(tag::DEFAULT_SAMPLE_TYPE, &self.default_sample_type, buf);
        }
        if self.doc_url != 0 {
            int64::encode(tag::DOC_URL, &self.doc_url, buf);
        }
    }

    fn merge_field(
        &mut self,
        field: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        use prost::encoding::{int64, message, skip_field};
        match field {
            tag::SAMPLE_TYPE => message::merge_repeated(wire_type, &mut self.sample_type, buf, ctx),
            tag::SAMPLE => self.sample.merge_sample(wire_type, buf, ctx),
            tag::MAPPING => message::merge_repeated(wire_type, &mut self.mapping, buf, ctx),
            tag::LOCATION => message::merge_repeated(wire_type, &mut self.location, buf, ctx),
            tag::FUNCTION => message::merge_repeated(wire_type, &mut self.function, buf, ctx),
            tag::STRING_TABLE => self.string_table.merge_string(wire_type, buf),
            tag::DROP_FRAMES => int64::merge(wire_type, &mut self.drop_frames, buf, ctx),
            tag::KEEP_FRAMES => int64::merge(wire_type, &mut self.keep_frames, buf, ctx),
            tag::TIME_NANOS => int64::merge(wire_type, &mut self.time_nanos, buf, ctx),
            tag::DURATION_NANOS => int64::merge(wire_type, &mut self.duration_nanos, buf, ctx),
            tag::PERIOD_TYPE => message::merge(
                wire_type,
                self.period_type.get_or_insert_with(ValueType::default),
                buf,
                ctx,
            ),
            tag::PERIOD => int64::merge(wire_type, &mut self.period, buf, ctx),
            tag::COMMENT => int64::merge_repeated(wire_type, &mut self.comment, buf, ctx),
            tag::DEFAULT_SAMPLE_TYPE => {
                int64::merge(wire_type, &mut self.default_sample_type, buf, ctx)
            }
            tag::DOC_URL => int64::merge(wire_type, &mut self.doc_url, buf, ctx),
            _ => skip_field(wire_type, field, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        use prost::encoding::{encoded_len_varint, int64, message};
        let samples: usize = self
            .sample
            .iter()
            .map(|sample| {
                let len = sample.encoded_len();
                1 + encoded_len_varint(len as u64) + len
            })
            .sum();
        let scalars: usize = profile_scalars(self)
            .iter()
            .filter(|(_, value)| *value != 0)
            .map(|(field, value)| int64::encoded_len(*field, value))
            .sum();
        message::encoded_len_repeated(tag::SAMPLE_TYPE, &self.sample_type)
            + samples
            + message::encoded_len_repeated(tag::MAPPING, &self.mapping)
            + message::encoded_len_repeated(tag::LOCATION, &self.location)
            + message::encoded_len_repeated(tag::FUNCTION, &self.function)
            + self.string_table.encoded_len()
            + scalars
            + self.period_type.as_ref().map_or(0, |period_type| {
                message::encoded_len(tag::PERIOD_TYPE, period_type)
            })
            + int64::encoded_len_packed(tag::COMMENT, &self.comment)
            + if self.doc_url != 0 {
                int64::encoded_len(tag::DOC_URL, &self.doc_url)
            } else {
                0
            }
    }

    fn clear(&mut self) {
        *self = Profile::default();
    }
}

/// A profile's samples, stored column-wise: location ids, values and labels of all samples
/// in three flat vectors with per-sample end offsets. Decoding a sample costs no allocation
/// of its own, where one struct per sample cost three (a quarter of the ingest CPU went to
/// allocating and freeing them; docs/benchmarks.md).
///
/// Location ids are held as `u32`: they were 44 % of a decoded profile's heap as `u64`
/// (docs/benchmarks.md), and profilers number their locations from 1. A profile whose
/// ids do not all fit is renumbered as it is decoded (the `renumbered` map).
#[derive(Clone, PartialEq, Default, Debug)]
pub struct Samples {
    location_ids: Vec<u32>,
    values: Vec<i64>,
    labels: Vec<Label>,
    ends: Vec<SampleEnds>,
    /// Set once a location id over `u32::MAX` was read: every id read, before and after,
    /// then maps to a new one (in order of first sight), and [`decode`] gives the
    /// locations the same new ids once the whole message is read.
    renumbered: Option<foldhash::HashMap<u64, u32>>,
}

#[derive(Clone, Copy, PartialEq, Default, Debug)]
struct SampleEnds {
    location_ids: usize,
    values: usize,
    labels: usize,
}

/// One sample, borrowed from [`Samples`]. Field names follow profile.proto.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Sample<'a> {
    pub location_id: &'a [u32],
    pub value: &'a [i64],
    pub label: &'a [Label],
}

impl Sample<'_> {
    fn encoded_len(&self) -> usize {
        use prost::encoding::{int64, message, uint32};
        // A varint is the same whether the field is declared uint64 or uint32.
        uint32::encoded_len_packed(tag::SAMPLE_LOCATION_ID, self.location_id)
            + int64::encoded_len_packed(tag::SAMPLE_VALUE, self.value)
            + message::encoded_len_repeated(tag::SAMPLE_LABEL, self.label)
    }

    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        use prost::encoding::{int64, message, uint32};
        uint32::encode_packed(tag::SAMPLE_LOCATION_ID, self.location_id, buf);
        int64::encode_packed(tag::SAMPLE_VALUE, self.value, buf);
        message::encode_repeated(tag::SAMPLE_LABEL, self.label, buf);
    }
}

impl Samples {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, index: usize) -> Option<Sample<'_>> {
        (index < self.len()).then(|| self.sample_at(index))
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = Sample<'_>> + '_ {
        (0..self.len()).map(|index| self.sample_at(index))
    }

    /// Sample `index`, which must be below `len()`; the offsets only ever grow, so every
    /// range is in bounds.
    fn sample_at(&self, index: usize) -> Sample<'_> {
        let end = self.ends[index];
        let start = match index {
            0 => SampleEnds::default(),
            _ => self.ends[index - 1],
        };
        Sample {
            location_id: &self.location_ids[start.location_ids..end.location_ids],
            value: &self.values[start.values..end.values],
            label: &self.labels[start.labels..end.labels],
        }
    }

    /// Room for `samples` more samples holding `location_ids` location ids and `values`
    /// values in all, for a converter that knows its sizes up front.
    pub fn reserve(&mut self, samples: usize, location_ids: usize, values: usize) {
        self.ends.reserve(samples);
        self.location_ids.reserve(location_ids);
        self.values.reserve(values);
    }

    pub fn push(&mut self, location_id: &[u32], value: &[i64], label: &[Label]) {
        self.location_ids.extend_from_slice(location_id);
        self.values.extend_from_slice(value);
        self.labels.extend_from_slice(label);
        self.close_sample();
    }

    /// The values of sample `index`, for merging into an existing sample.
    pub fn values_mut(&mut self, index: usize) -> Option<&mut [i64]> {
        let end = self.ends.get(index)?.values;
        let start = match index {
            0 => 0,
            _ => self.ends[index - 1].values,
        };
        self.values.get_mut(start..end)
    }

    fn close_sample(&mut self) {
        self.ends.push(SampleEnds {
            location_ids: self.location_ids.len(),
            values: self.values.len(),
            labels: self.labels.len(),
        });
    }

    /// Decodes one length-delimited `Sample` message onto the columns. Samples are most of
    /// a profile's bytes, so a message held in one contiguous chunk (always, when decoding
    /// from a slice) is read by a loop the compiler specialises for slices.
    fn merge_sample(
        &mut self,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        let len = delimited_length(wire_type, buf)?;
        if buf.chunk().len() >= len {
            let mut message = &buf.chunk()[..len];
            self.merge_sample_fields(&mut message, ctx)?;
            buf.advance(len);
        } else {
            self.merge_sample_fields(&mut prost::bytes::Buf::take(&mut *buf, len), ctx)?;
        }
        self.close_sample();
        Ok(())
    }

    fn merge_sample_fields(
        &mut self,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        use prost::encoding::{
            check_wire_type, decode_key, decode_varint, int64, message, skip_field, WireType,
        };
        while buf.has_remaining() {
            let (field, wire_type) = decode_key(buf)?;
            match (field, wire_type) {
                (tag::SAMPLE_LOCATION_ID, WireType::LengthDelimited) => {
                    merge_packed_varints(buf, |value| self.push_location_id(value))?
                }
                (tag::SAMPLE_VALUE, WireType::LengthDelimited) => {
                    merge_packed_varints(buf, |value| self.values.push(value as i64))?
                }
                (tag::SAMPLE_LOCATION_ID, _) => {
                    // Unpacked: one varint per field.
                    check_wire_type(WireType::Varint, wire_type)?;
                    self.push_location_id(decode_varint(buf)?);
                }
                (tag::SAMPLE_VALUE, _) => {
                    int64::merge_repeated(wire_type, &mut self.values, buf, ctx.clone())?
                }
                (tag::SAMPLE_LABEL, _) => {
                    message::merge_repeated(wire_type, &mut self.labels, buf, ctx.clone())?
                }
                _ => skip_field(wire_type, field, buf, ctx.clone())?,
            }
        }
        Ok(())
    }
}

impl Samples {
    #[inline]
    fn push_location_id(&mut self, id: u64) {
        match (&mut self.renumbered, u32::try_from(id)) {
            (None, Ok(id)) => self.location_ids.push(id),
            _ => self.push_renumbered(id),
        }
    }

    #[cold]
    fn push_renumbered(&mut self, id: u64) {
        let map = self.renumbered.get_or_insert_with(|| {
            // Renumber what was read so far, in order, into a map of its own.
            let mut map = foldhash::HashMap::default();
            for stored in &mut self.location_ids {
                *stored = renumber(&mut map, u64::from(*stored));
            }
            map
        });
        let new = renumber(map, id);
        self.location_ids.push(new);
    }

    /// Gives `locations` the ids the samples were renumbered to, if they were; a
    /// location no sample names gets a new id after theirs.
    fn apply_renumbering(&mut self, locations: &mut [Location]) {
        let Some(mut map) = self.renumbered.take() else {
            return;
        };
        for location in locations {
            location.id = u64::from(renumber(&mut map, location.id));
        }
    }
}

/// The new id of `id`: its own if already seen, else the next (ids are 1-based). A
/// message holds far fewer than four billion ids, as each takes at least a byte.
fn renumber(map: &mut foldhash::HashMap<u64, u32>, id: u64) -> u32 {
    let next = u32::try_from(map.len() + 1).unwrap_or(u32::MAX);
    *map.entry(id).or_insert(next)
}

/// Reads a packed run of varints (its length prefix first), as prost's `merge_repeated`
/// does, with a one-byte fast path: most location ids and many values fit in one byte.
#[inline]
fn merge_packed_varints(
    buf: &mut impl prost::bytes::Buf,
    mut push: impl FnMut(u64),
) -> Result<(), prost::DecodeError> {
    use prost::encoding::decode_varint;
    let len = decode_varint(buf)?;
    if len > buf.remaining() as u64 {
        return Err(prost_error(Malformed::Underflow));
    }
    let end = buf.remaining() - len as usize;
    while buf.remaining() > end {
        let value = match buf.chunk().first() {
            Some(&byte) if byte < 0x80 => {
                buf.advance(1);
                u64::from(byte)
            }
            _ => decode_varint(buf)?,
        };
        push(value);
    }
    if buf.remaining() != end {
        return Err(prost_error(Malformed::PastDelimitedLength));
    }
    Ok(())
}

/// The length prefix of a length-delimited field, checked against the bytes left.
fn delimited_length(
    wire_type: prost::encoding::WireType,
    buf: &mut impl prost::bytes::Buf,
) -> Result<usize, prost::DecodeError> {
    use prost::encoding::{check_wire_type, decode_varint, WireType};
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    let len = decode_varint(buf)?;
    if len > buf.remaining() as u64 {
        return Err(prost_error(Malformed::Underflow));
    }
    Ok(len as usize)
}

/// Malformations the hand-written decoders find themselves.
#[derive(Clone, Copy)]
enum Malformed {
    Underflow,
    PastDelimitedLength,
}

/// prost's own error for a malformation (its constructor is not public API), made by
/// letting prost decode a minimal input with the same fault.
fn prost_error(fault: Malformed) -> prost::DecodeError {
    use prost::encoding::{uint64, DecodeContext, WireType};
    let input: &[u8] = match fault {
        // a packed length of 5 with nothing after it
        Malformed::Underflow => &[5],
        // a packed length of 1 holding a two-byte varint
        Malformed::PastDelimitedLength => &[1, 0x80, 1],
    };
    let mut scratch = Vec::new();
    match uint64::merge_repeated(
        WireType::LengthDelimited,
        &mut scratch,
        &mut &input[..],
        DecodeContext::default(),
    ) {
        Err(err) => err,
        Ok(()) => unreachable!("each input holds its fault"),
    }
}

impl<'a> FromIterator<Sample<'a>> for Samples {
    fn from_iter<T: IntoIterator<Item = Sample<'a>>>(iter: T) -> Self {
        let mut samples = Samples::default();
        for sample in iter {
            samples.push(sample.location_id, sample.value, sample.label);
        }
        samples
    }
}

/// A profile's string table, every string's bytes in one buffer with end offsets: decoding
/// a string costs a copy and no allocation of its own, where one `Vec<u8>` per string cost
/// one allocation each (a profile holds thousands; docs/benchmarks.md).
#[derive(Clone, PartialEq, Eq, Default, Debug)]
pub struct StringTable {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl StringTable {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, index: usize) -> Option<&[u8]> {
        let end = *self.ends.get(index)?;
        let start = match index {
            0 => 0,
            _ => self.ends[index - 1],
        };
        Some(&self.bytes[start..end])
    }

    pub fn first(&self) -> Option<&[u8]> {
        self.get(0)
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|index| self.get(index).unwrap_or_default())
    }

    /// Appends a string; its index is the length before the push.
    pub fn push(&mut self, value: &[u8]) {
        self.bytes.extend_from_slice(value);
        self.ends.push(self.bytes.len());
    }

    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        use prost::encoding::{encode_key, encode_varint, WireType};
        for value in self.iter() {
            encode_key(tag::STRING_TABLE, WireType::LengthDelimited, buf);
            encode_varint(value.len() as u64, buf);
            buf.put_slice(value);
        }
    }

    fn encoded_len(&self) -> usize {
        use prost::encoding::{encoded_len_varint, key_len};
        self.iter()
            .map(|value| key_len(tag::STRING_TABLE) + encoded_len_varint(value.len() as u64))
            .sum::<usize>()
            + self.bytes.len()
    }

    /// Decodes one length-delimited string onto the buffer.
    fn merge_string(
        &mut self,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
    ) -> Result<(), prost::DecodeError> {
        let len = delimited_length(wire_type, buf)?;
        if buf.chunk().len() >= len {
            self.bytes.extend_from_slice(&buf.chunk()[..len]);
            buf.advance(len);
        } else {
            let start = self.bytes.len();
            self.bytes.resize(start + len, 0);
            buf.copy_to_slice(&mut self.bytes[start..]);
        }
        self.ends.push(self.bytes.len());
        Ok(())
    }
}

/// Writes strings into a [`StringTable`] once each: every writer of pprofs (the other
/// formats, OTLP, merged exports) interns its names through one of these.
#[derive(Debug, Default)]
pub struct StringInterner {
    ids: foldhash::HashMap<String, i64>,
}

impl StringInterner {
    /// The index of `value` in `table`, appending it the first time.
    pub fn intern(&mut self, table: &mut StringTable, value: &str) -> i64 {
        if let Some(index) = self.ids.get(value) {
            return *index;
        }
        let index = table.len() as i64;
        table.push(value.as_bytes());
        self.ids.insert(value.to_string(), index);
        index
    }
}

impl<T: AsRef<[u8]>> FromIterator<T> for StringTable {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut table = StringTable::default();
        for value in iter {
            table.push(value.as_ref());
        }
        table
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// A location's lines, held in the location when there is one (most locations: a frame
/// not inlined), so decoding a location allocates nothing of its own. One allocation per
/// location was a sixth of decoding a pprof (docs/benchmarks.md, session 37).
pub type Lines = smallvec::SmallVec<[Line; 1]>;

/// `vec!` for [`Lines`].
pub use smallvec::smallvec as lines;

/// `Message` is implemented by hand (below) only so that `line` can be [`Lines`].
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct Location {
    pub id: u64,
    pub mapping_id: u64,
    pub address: u64,
    pub line: Lines,
    pub is_folded: bool,
}

/// Field numbers of `Location` (profile.proto).
mod location_tag {
    pub const ID: u32 = 1;
    pub const MAPPING_ID: u32 = 2;
    pub const ADDRESS: u32 = 3;
    pub const LINE: u32 = 4;
    pub const IS_FOLDED: u32 = 5;
}

impl Location {
    /// The uint64 fields and their numbers, in field order; each is written unless zero.
    fn numbers(&self) -> impl Iterator<Item = (u32, u64)> {
        use location_tag::*;
        [
            (ID, self.id),
            (MAPPING_ID, self.mapping_id),
            (ADDRESS, self.address),
        ]
        .into_iter()
        .filter(|(_, value)| *value != 0)
    }
}

impl Message for Location {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        use location_tag::*;
        use prost::encoding::{bool, message, uint64};
        for (field, value) in self.numbers() {
            uint64::encode(field, &value, buf);
        }
        message::encode_repeated(LINE, &self.line, buf);
        if self.is_folded {
            bool::encode(IS_FOLDED, &self.is_folded, buf);
        }
    }

    fn merge_field(
        &mut self,
        field: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        use location_tag::*;
        use prost::encoding::{bool, message, skip_field, uint64};
        match field {
            ID => uint64::merge(wire_type, &mut self.id, buf, ctx),
            MAPPING_ID => uint64::merge(wire_type, &mut self.mapping_id, buf, ctx),
            ADDRESS => uint64::merge(wire_type, &mut self.address, buf, ctx),
            LINE => {
                let mut line = Line::default();
                message::merge(wire_type, &mut line, buf, ctx)?;
                self.line.push(line);
                Ok(())
            }
            IS_FOLDED => bool::merge(wire_type, &mut self.is_folded, buf, ctx),
            _ => skip_field(wire_type, field, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        use location_tag::*;
        use prost::encoding::{bool, message, uint64};
        self.numbers()
            .map(|(field, value)| uint64::encoded_len(field, &value))
            .sum::<usize>()
            + message::encoded_len_repeated(LINE, &self.line)
            + if self.is_folded {
                bool::encoded_len(IS_FOLDED, &self.is_folded)
            } else {
                0
            }
    }

    fn clear(&mut self) {
        *self = Location::default();
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

#[derive(Clone, PartialEq, Eq, Hash, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

impl Profile {
    /// Appends `location` under the next id (locations numbered from 1, as samples hold
    /// them: `u32`) and returns that id. Four billion locations would take more memory
    /// than any input a converter reads, so the id saturates rather than fails.
    pub fn push_location(&mut self, location: Location) -> u32 {
        let id = u32::try_from(self.location.len() + 1).unwrap_or(u32::MAX);
        self.location.push(Location {
            id: u64::from(id),
            ..location
        });
        id
    }

    /// The heap memory the decoded profile holds (allocated capacity, not length): what it
    /// costs while it waits for its flush. The encoded size understates it about fourfold,
    /// since ids and values are 4 or 8 bytes here and one or two as varints.
    pub fn heap_bytes(&self) -> usize {
        fn vec<T>(items: &Vec<T>) -> usize {
            items.capacity() * std::mem::size_of::<T>()
        }
        let samples = &self.sample;
        vec(&self.sample_type)
            + vec(&samples.location_ids)
            + vec(&samples.values)
            + vec(&samples.labels)
            + vec(&samples.ends)
            + vec(&self.mapping)
            + vec(&self.location)
            + self
                .location
                .iter()
                .filter(|location| location.line.spilled())
                .map(|location| location.line.capacity() * std::mem::size_of::<Line>())
                .sum::<usize>()
            + vec(&self.function)
            + vec(&self.string_table.bytes)
            + vec(&self.string_table.ends)
            + vec(&self.comment)
    }

    /// The string at `index`, or an error naming the field when it is out of range.
    pub fn string(&self, index: i64, what: &str) -> Result<String, FormatError> {
        usize::try_from(index)
            .ok()
            .and_then(|index| self.string_table.get(index))
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
            .ok_or_else(|| {
                FormatError::malformed(format!(
                    "{what} refers to string {index}, but the string table has {} entries",
                    self.string_table.len()
                ))
            })
    }

    /// The string at `index`, or "" when the index is out of range. For display only.
    pub fn string_or_empty(&self, index: i64) -> String {
        self.string(index, "").unwrap_or_default()
    }

    pub fn encode_to_bytes(&self) -> Vec<u8> {
        self.encode_to_vec()
    }
}

/// Signatures of pre-protobuf profile formats, which carry no symbols and are refused.
fn legacy_format_name(data: &[u8]) -> Option<&'static str> {
    if data.starts_with(b"--- heap") || data.starts_with(b"heap profile:") {
        return Some("legacy text heap profile");
    }
    if data.starts_with(b"--- contention") || data.starts_with(b"--- threadz") {
        return Some("legacy text profile");
    }
    // gperftools / legacy Go CPU profiles start with the words 0, 3, 0 (header count,
    // version, sampling period) in the machine's word size.
    if data.len() >= 24 && data[..8] == [0u8; 8] && (data[8] == 3 || data[15] == 3) {
        return Some("legacy binary CPU profile (gperftools/Go before 1.9)");
    }
    if data.len() >= 12 && data[..4] == [0u8; 4] && (data[4] == 3 || data[7] == 3) {
        return Some("legacy binary CPU profile (gperftools/Go before 1.9)");
    }
    None
}

/// Decodes a pprof profile, gzip-compressed or not, inflating at most `limit` bytes.
pub fn decode(data: &[u8], limit: usize) -> Result<Profile, FormatError> {
    let raw = maybe_gunzip(data, limit)?;
    if let Some(name) = legacy_format_name(&raw) {
        return Err(FormatError::malformed(format!(
            "{name} is not supported; send pprof protobuf (go tool pprof -proto converts it)"
        )));
    }
    let mut profile = Profile::default();
    presize(&raw, &mut profile);
    profile
        .merge(&*raw)
        .map_err(|err| FormatError::malformed(format!("invalid pprof protobuf: {err}")))?;
    profile.sample.apply_renumbering(&mut profile.location);
    if profile
        .string_table
        .first()
        .is_some_and(|first| !first.is_empty())
    {
        return Err(FormatError::malformed(
            "invalid pprof: string_table[0] must be the empty string",
        ));
    }
    if profile.string_table.is_empty() && !profile.sample.is_empty() {
        return Err(FormatError::malformed("invalid pprof: empty string table"));
    }
    Ok(profile)
}

/// Sizes the profile's tables from one pass over the message's top-level fields, which
/// reads only keys and lengths, so each is allocated once instead of grown by doubling and
/// copied as it is read: that growth was a sixth of decoding (docs/benchmarks.md, session
/// 37). The sizes are what the message declares, so they cost no more than decoding it
/// does. A malformed message ends the pass early; decoding then reports it.
fn presize(message: &[u8], profile: &mut Profile) {
    use prost::encoding::{decode_key, skip_field, DecodeContext, WireType};
    let mut buf = message;
    let mut counts = [0usize; 16];
    let (mut sample_bytes, mut string_bytes) = (0, 0);
    while !buf.is_empty() {
        let Ok((field, wire_type)) = decode_key(&mut buf) else {
            break;
        };
        if wire_type != WireType::LengthDelimited {
            if skip_field(wire_type, field, &mut buf, DecodeContext::default()).is_err() {
                break;
            }
            continue;
        }
        let Ok(len) = delimited_length(wire_type, &mut buf) else {
            break;
        };
        if let Some(count) = counts.get_mut(field as usize) {
            *count += 1;
        }
        match field {
            tag::SAMPLE => sample_bytes += len,
            tag::STRING_TABLE => string_bytes += len,
            _ => {}
        }
        buf = &buf[len..];
    }
    let count = |field: u32| counts[field as usize];
    let samples = count(tag::SAMPLE);
    // A location id takes one or two bytes, a sample's keys and lengths about six. Every
    // count is bounded by the bytes that hold it, so a hostile message reserves no more
    // than it would take decoded (a product of two counts is not).
    let location_ids = sample_bytes.saturating_sub(samples * 6) / 2;
    let values = samples
        .saturating_mul(count(tag::SAMPLE_TYPE).max(1))
        .min(sample_bytes);
    profile.sample.reserve(samples, location_ids, values);
    profile.mapping.reserve(count(tag::MAPPING));
    profile.location.reserve(count(tag::LOCATION));
    profile.function.reserve(count(tag::FUNCTION));
    profile.string_table.ends.reserve(count(tag::STRING_TABLE));
    profile.string_table.bytes.reserve(string_bytes);
}

impl Profile {
    /// Keeps the `keep` heaviest samples, in their order, and drops the rest; returns how
    /// many were dropped. A sample's weight is its largest share of any sample type's
    /// total, so a heap profile keeps what is large in allocations or in use alike. The
    /// light tail a cut drops is where a flame graph shows least.
    pub fn keep_heaviest_samples(&mut self, keep: usize) -> usize {
        let count = self.sample.len();
        if count <= keep {
            return 0;
        }
        let types = self.sample.iter().map(|s| s.value.len()).max().unwrap_or(0);
        let mut totals = vec![0f64; types];
        for sample in self.sample.iter() {
            for (total, value) in totals.iter_mut().zip(sample.value) {
                *total += value.unsigned_abs() as f64;
            }
        }
        let weight = |sample: Sample<'_>| -> f64 {
            sample
                .value
                .iter()
                .zip(&totals)
                .map(|(value, total)| match *total {
                    t if t > 0.0 => value.unsigned_abs() as f64 / t,
                    _ => 0.0,
                })
                .fold(0.0, f64::max)
        };
        let mut ranked: Vec<(f64, usize)> = self
            .sample
            .iter()
            .enumerate()
            .map(|(index, sample)| (weight(sample), index))
            .collect();
        if keep > 0 {
            ranked.select_nth_unstable_by(keep - 1, |a, b| b.0.total_cmp(&a.0));
        }
        let mut kept: Vec<usize> = ranked[..keep].iter().map(|&(_, index)| index).collect();
        kept.sort_unstable();
        let mut samples = Samples::default();
        for index in kept {
            if let Some(sample) = self.sample.get(index) {
                samples.push(sample.location_id, sample.value, sample.label);
            }
        }
        self.sample = samples;
        count - keep
    }
}

/// Limits on one profile's shape.
#[derive(Debug, Clone, Copy)]
pub struct ProfileLimits {
    pub max_samples: usize,
    pub max_stack_depth: usize,
}

impl Default for ProfileLimits {
    fn default() -> Self {
        ProfileLimits {
            max_samples: 16_000,
            max_stack_depth: 1_000,
        }
    }
}

/// Maps pprof ids (`Location.id`, `Function.id`, `Mapping.id`) to positions in their table.
/// Go writes ids `1..=n` in order, which needs no hash map at all.
#[derive(Debug, Clone)]
pub enum IdIndex {
    Dense(usize),
    Sparse(foldhash::HashMap<u64, usize>),
}

impl IdIndex {
    fn build(ids: impl ExactSizeIterator<Item = u64>, what: &str) -> Result<Self, FormatError> {
        let len = ids.len();
        let ids: Vec<u64> = ids.collect();
        if ids
            .iter()
            .enumerate()
            .all(|(position, id)| *id == position as u64 + 1)
        {
            return Ok(IdIndex::Dense(len));
        }
        let mut map = foldhash::HashMap::with_capacity_and_hasher(len, Default::default());
        for (position, id) in ids.into_iter().enumerate() {
            if map.insert(id, position).is_some() {
                return Err(FormatError::malformed(format!("duplicate {what} id {id}")));
            }
        }
        Ok(IdIndex::Sparse(map))
    }

    pub fn get(&self, id: u64) -> Option<usize> {
        match self {
            IdIndex::Dense(len) => (id >= 1 && id <= *len as u64).then(|| id as usize - 1),
            IdIndex::Sparse(map) => map.get(&id).copied(),
        }
    }
}

/// The id lookups of a profile whose every reference has been checked.
#[derive(Debug, Clone)]
pub struct Validated {
    pub locations: IdIndex,
    pub functions: IdIndex,
    pub mappings: IdIndex,
}

impl Validated {
    /// Heap memory of the indexes (none when ids are dense, as most profiles' are).
    pub fn heap_bytes(&self) -> usize {
        [&self.locations, &self.functions, &self.mappings]
            .iter()
            .map(|index| match index {
                IdIndex::Dense(_) => 0,
                IdIndex::Sparse(map) => map.capacity() * (2 * std::mem::size_of::<u64>() + 1),
            })
            .sum()
    }
}

/// Checks every cross-reference and string index of a decoded profile, so that later
/// stages can index without failing: a profile is either accepted whole or refused whole.
pub fn validate(profile: &Profile, limits: &ProfileLimits) -> Result<Validated, FormatError> {
    if profile.sample.len() > limits.max_samples {
        return Err(FormatError::TooLarge(format!(
            "profile has {} samples, over the limit of {}",
            profile.sample.len(),
            limits.max_samples
        )));
    }
    let strings = profile.string_table.len() as i64;
    let check_string = |index: i64, what: &dyn Fn() -> String| -> Result<(), FormatError> {
        if index < 0 || index >= strings {
            return Err(FormatError::malformed(format!(
                "{} refers to string {index}, but the string table has {strings} entries",
                what()
            )));
        }
        Ok(())
    };
    for (position, value_type) in profile
        .sample_type
        .iter()
        .chain(profile.period_type.iter())
        .enumerate()
    {
        check_string(value_type.r#type, &|| format!("sample type {position}"))?;
        check_string(value_type.unit, &|| format!("sample type {position} unit"))?;
    }
    let mappings = IdIndex::build(profile.mapping.iter().map(|m| m.id), "mapping")?;
    for mapping in &profile.mapping {
        check_string(mapping.filename, &|| {
            format!("mapping {} filename", mapping.id)
        })?;
        check_string(mapping.build_id, &|| {
            format!("mapping {} build id", mapping.id)
        })?;
    }
    let functions = IdIndex::build(profile.function.iter().map(|f| f.id), "function")?;
    for function in &profile.function {
        check_string(function.name, &|| format!("function {} name", function.id))?;
        check_string(function.system_name, &|| {
            format!("function {} system name", function.id)
        })?;
        check_string(function.filename, &|| {
            format!("function {} filename", function.id)
        })?;
    }
    let locations = IdIndex::build(profile.location.iter().map(|l| l.id), "location")?;
    for location in &profile.location {
        if location.mapping_id != 0 && mappings.get(location.mapping_id).is_none() {
            return Err(FormatError::malformed(format!(
                "location {} refers to mapping {}, which is not defined",
                location.id, location.mapping_id
            )));
        }
        for line in &location.line {
            if functions.get(line.function_id).is_none() {
                return Err(FormatError::malformed(format!(
                    "location {} refers to function {}, which is not defined",
                    location.id, line.function_id
                )));
            }
        }
    }
    let value_count = profile.sample_type.len();
    for (position, sample) in profile.sample.iter().enumerate() {
        if sample.value.len() != value_count && !(value_count == 0 && sample.value.len() == 1) {
            return Err(FormatError::malformed(format!(
                "sample {position} has {} values but the profile has {value_count} sample types",
                sample.value.len()
            )));
        }
        for id in sample.location_id {
            if locations.get(u64::from(*id)).is_none() {
                return Err(FormatError::malformed(format!(
                    "sample {position} refers to location {id}, which is not defined"
                )));
            }
        }
        for label in sample.label {
            check_string(label.key, &|| format!("sample {position} label key"))?;
            check_string(label.str, &|| format!("sample {position} label value"))?;
            check_string(label.num_unit, &|| format!("sample {position} label unit"))?;
        }
    }
    Ok(Validated {
        locations,
        functions,
        mappings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Profile {
        Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            sample: [Sample {
                location_id: &[1],
                value: &[5],
                label: &[],
            }]
            .into_iter()
            .collect(),
            location: vec![Location {
                id: 1,
                line: crate::pprof::lines![Line {
                    function_id: 1,
                    line: 3,
                    column: 0,
                }],
                ..Default::default()
            }],
            function: vec![Function {
                id: 1,
                name: 3,
                ..Default::default()
            }],
            string_table: vec![
                b"".to_vec(),
                b"cpu".to_vec(),
                b"nanoseconds".to_vec(),
                b"main".to_vec(),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn round_trip_and_validate() {
        let profile = tiny();
        let bytes = crate::compress::gzip(&profile.encode_to_vec());
        let decoded = decode(&bytes, 1 << 20).unwrap();
        assert_eq!(decoded, profile);
        let validated = validate(&decoded, &ProfileLimits::default()).unwrap();
        assert_eq!(validated.locations.get(1), Some(0));
        assert_eq!(validated.locations.get(2), None);
    }

    #[test]
    fn dangling_references_are_refused() {
        let mut profile = tiny();
        profile.sample = Samples::default();
        profile.sample.push(&[9], &[5], &[]);
        let err = validate(&profile, &ProfileLimits::default()).unwrap_err();
        assert!(err.to_string().contains("location 9"), "{err}");
        let mut profile = tiny();
        profile.function[0].name = 99;
        assert!(validate(&profile, &ProfileLimits::default()).is_err());
        let mut profile = tiny();
        profile.sample = Samples::default();
        profile.sample.push(&[1], &[1, 2], &[]);
        assert!(validate(&profile, &ProfileLimits::default()).is_err());
    }

    /// What `prost` derives for profile.proto's `Profile` and `Sample`: the hand-written
    /// codec must agree with it byte for byte.
    #[derive(Clone, PartialEq, Message)]
    struct DerivedProfile {
        #[prost(message, repeated, tag = "1")]
        sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        sample: Vec<DerivedSample>,
        #[prost(message, repeated, tag = "3")]
        mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        location: Vec<DerivedLocation>,
        #[prost(message, repeated, tag = "5")]
        function: Vec<Function>,
        #[prost(bytes = "vec", repeated, tag = "6")]
        string_table: Vec<Vec<u8>>,
        #[prost(int64, tag = "7")]
        drop_frames: i64,
        #[prost(int64, tag = "8")]
        keep_frames: i64,
        #[prost(int64, tag = "9")]
        time_nanos: i64,
        #[prost(int64, tag = "10")]
        duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        period: i64,
        #[prost(int64, repeated, tag = "13")]
        comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        default_sample_type: i64,
        #[prost(int64, tag = "15")]
        doc_url: i64,
    }

    #[derive(Clone, PartialEq, Message)]
    struct DerivedLocation {
        #[prost(uint64, tag = "1")]
        id: u64,
        #[prost(uint64, tag = "2")]
        mapping_id: u64,
        #[prost(uint64, tag = "3")]
        address: u64,
        #[prost(message, repeated, tag = "4")]
        line: Vec<Line>,
        #[prost(bool, tag = "5")]
        is_folded: bool,
    }

    impl From<&Location> for DerivedLocation {
        fn from(location: &Location) -> Self {
            DerivedLocation {
                id: location.id,
                mapping_id: location.mapping_id,
                address: location.address,
                line: location.line.to_vec(),
                is_folded: location.is_folded,
            }
        }
    }

    #[derive(Clone, PartialEq, Message)]
    struct DerivedSample {
        #[prost(uint64, repeated, tag = "1")]
        location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        label: Vec<Label>,
    }

    /// The same sample written with unpacked repeated fields, as some encoders do.
    #[derive(Clone, PartialEq, Message)]
    struct UnpackedSample {
        #[prost(uint64, repeated, packed = "false", tag = "1")]
        location_id: Vec<u64>,
        #[prost(int64, repeated, packed = "false", tag = "2")]
        value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        label: Vec<Label>,
        #[prost(string, tag = "99")]
        unknown: String,
    }

    #[derive(Clone, PartialEq, Message)]
    struct UnpackedProfile {
        #[prost(message, repeated, tag = "2")]
        sample: Vec<UnpackedSample>,
    }

    fn every_field() -> Profile {
        let label = Label {
            key: 1,
            str: 2,
            num: -3,
            num_unit: 0,
        };
        let mut profile = tiny();
        profile.sample.push(&[], &[-7], &[label, label]);
        profile.sample.push(&[1, 1, 1], &[i64::MAX], &[]);
        profile.mapping = vec![Mapping {
            id: 1,
            memory_start: 0x400000,
            filename: 3,
            has_functions: true,
            ..Default::default()
        }];
        let line = |line| Line {
            function_id: 1,
            line,
            column: 4,
        };
        profile.location.extend([
            Location {
                id: 2,
                mapping_id: 1,
                address: 0x401000,
                line: crate::pprof::lines![line(7), line(8), line(9)],
                is_folded: true,
            },
            Location {
                id: 3,
                mapping_id: 1,
                address: 0x402000,
                ..Default::default()
            },
        ]);
        profile.drop_frames = 1;
        profile.keep_frames = 2;
        profile.time_nanos = 1_700_000_000_000_000_000;
        profile.duration_nanos = 10_000_000_000;
        profile.period_type = Some(ValueType { r#type: 1, unit: 2 });
        profile.period = 10_000_000;
        profile.comment = vec![1, 3];
        profile.default_sample_type = 1;
        profile.doc_url = 3;
        profile
    }

    fn derived(profile: &Profile) -> DerivedProfile {
        DerivedProfile {
            sample_type: profile.sample_type.clone(),
            sample: profile
                .sample
                .iter()
                .map(|sample| DerivedSample {
                    location_id: sample.location_id.iter().map(|&id| u64::from(id)).collect(),
                    value: sample.value.to_vec(),
                    label: sample.label.to_vec(),
                })
                .collect(),
            mapping: profile.mapping.clone(),
            location: profile.location.iter().map(DerivedLocation::from).collect(),
            function: profile.function.clone(),
            string_table: profile.string_table.iter().map(<[u8]>::to_vec).collect(),
            drop_frames: profile.drop_frames,
            keep_frames: profile.keep_frames,
            time_nanos: profile.time_nanos,
            duration_nanos: profile.duration_nanos,
            period_type: profile.period_type,
            period: profile.period,
            comment: profile.comment.clone(),
            default_sample_type: profile.default_sample_type,
            doc_url: profile.doc_url,
        }
    }

    #[test]
    fn codec_matches_the_derived_one_byte_for_byte() {
        for profile in [tiny(), every_field(), Profile::default()] {
            let reference = derived(&profile).encode_to_vec();
            assert_eq!(profile.encode_to_vec(), reference);
            assert_eq!(profile.encoded_len(), reference.len());
            assert_eq!(Profile::decode(reference.as_slice()).unwrap(), profile);
        }
    }

    /// Every table is allocated once, at the size the message declares, and a location's
    /// one line is held in the location. Decoding grew each table by doubling, and gave
    /// every location a vector of its own.
    #[test]
    fn decoding_sizes_each_table_once_and_keeps_one_line_inline() {
        let mut profile = tiny();
        for id in 2..=100u64 {
            profile.function.push(Function {
                id,
                name: 3,
                ..Default::default()
            });
            let line = |line| Line {
                function_id: id,
                line,
                column: 0,
            };
            profile.location.push(Location {
                id,
                line: match id {
                    2 => crate::pprof::lines![line(1), line(2)],
                    _ => crate::pprof::lines![line(1)],
                },
                ..Default::default()
            });
        }
        for depth in 1..=37u32 {
            let stack: Vec<u32> = (1..=depth).collect();
            profile.sample.push(&stack, &[i64::from(depth)], &[]);
        }
        let decoded = decode(&profile.encode_to_vec(), 1 << 20).unwrap();
        assert_eq!(decoded, profile);
        assert_eq!(decoded.location.capacity(), 100);
        assert_eq!(decoded.function.capacity(), 100);
        assert_eq!(decoded.sample.ends.capacity(), 38);
        assert_eq!(decoded.string_table.ends.capacity(), 4);
        assert_eq!(decoded.string_table.bytes.capacity(), 18);
        let spilled: Vec<u64> = (decoded.location.iter())
            .filter(|location| location.line.spilled())
            .map(|location| location.id)
            .collect();
        assert_eq!(spilled, [2]);
    }

    /// Each size is bounded by the bytes that declare it: 100,000 empty sample types and
    /// 100,000 empty samples (400 KB) reserve no room for their product of values, which
    /// would be 80 GB.
    #[test]
    fn a_hostile_message_reserves_no_more_than_it_holds() {
        // The string table's empty string, then the fields.
        let mut bytes = vec![(tag::STRING_TABLE << 3 | 2) as u8, 0];
        for field in [tag::SAMPLE_TYPE, tag::SAMPLE] {
            for _ in 0..100_000 {
                bytes.extend_from_slice(&[(field << 3 | 2) as u8, 0]);
            }
        }
        let mut profile = Profile::default();
        presize(&bytes, &mut profile);
        assert!(profile.sample.values.capacity() <= bytes.len());
        assert!(profile.sample.location_ids.capacity() <= bytes.len());
        let decoded = decode(&bytes, 1 << 20).unwrap();
        assert_eq!(
            (decoded.sample_type.len(), decoded.sample.len()),
            (100_000, 100_000)
        );
    }

    #[test]
    fn location_ids_past_u32_are_renumbered_with_their_locations() {
        let wide: u64 = 1 << 40;
        // Location `id` is function `id`'s frame; 99 is named by no sample.
        let ids = [7, wide, 3, 99];
        let mut reference = derived(&tiny());
        reference.location = ids
            .iter()
            .map(|&id| DerivedLocation {
                id,
                line: vec![Line {
                    function_id: id,
                    line: 1,
                    column: 0,
                }],
                ..Default::default()
            })
            .collect();
        reference.function = ids
            .iter()
            .enumerate()
            .map(|(index, &id)| Function {
                id,
                name: 3 + index as i64,
                ..Default::default()
            })
            .collect();
        reference.string_table = ["", "cpu", "nanoseconds", "seven", "wide", "three", "unused"]
            .map(|s| s.as_bytes().to_vec())
            .to_vec();
        let stacks: [&[u64]; 3] = [&[7, wide], &[3], &[wide, 7, 3]];
        reference.sample = stacks
            .iter()
            .map(|stack| DerivedSample {
                location_id: stack.to_vec(),
                value: vec![1],
                label: Vec::new(),
            })
            .collect();
        let profile = decode(&reference.encode_to_vec(), 1 << 20).unwrap();
        let index = validate(&profile, &Default::default()).unwrap();
        let name = |id: u32| {
            let location = &profile.location[index.locations.get(u64::from(id)).unwrap()];
            let function = location.line[0].function_id;
            let function = &profile.function[index.functions.get(function).unwrap()];
            profile.string_or_empty(function.name)
        };
        let named: Vec<Vec<String>> = profile
            .sample
            .iter()
            .map(|sample| sample.location_id.iter().map(|&id| name(id)).collect())
            .collect();
        assert_eq!(
            named,
            [
                vec!["seven", "wide"],
                vec!["three"],
                vec!["wide", "seven", "three"]
            ]
        );
        // Renumbered in order of first sight; the unnamed location after them.
        let mut renumbered: Vec<u64> = profile.location.iter().map(|l| l.id).collect();
        renumbered.sort_unstable();
        assert_eq!(renumbered, [1, 2, 3, 4]);
    }

    #[test]
    fn unpacked_sample_fields_and_unknown_fields_decode() {
        let unpacked = UnpackedProfile {
            sample: vec![
                UnpackedSample {
                    location_id: vec![3, 2, 1],
                    value: vec![4, -5],
                    label: vec![Label {
                        key: 1,
                        str: 2,
                        ..Default::default()
                    }],
                    unknown: "ignored".to_string(),
                },
                UnpackedSample::default(),
            ],
        };
        let profile = Profile::decode(unpacked.encode_to_vec().as_slice()).unwrap();
        assert_eq!(profile.sample.len(), 2);
        let first = profile.sample.get(0).unwrap();
        assert_eq!(first.location_id, &[3, 2, 1]);
        assert_eq!(first.value, &[4, -5]);
        assert_eq!(first.label.len(), 1);
        let second = profile.sample.get(1).unwrap();
        assert!(second.location_id.is_empty() && second.value.is_empty());
        assert!(profile.sample.get(2).is_none());
    }

    #[test]
    fn a_cut_message_never_yields_a_partial_sample() {
        let profile = every_field();
        let bytes = profile.encode_to_vec();
        let mut decoded_prefixes = 0;
        for cut in 1..bytes.len() {
            // A prefix either fails or decodes to the first samples, each one whole.
            if let Ok(prefix) = Profile::decode(&bytes[..cut]) {
                decoded_prefixes += 1;
                for (index, sample) in prefix.sample.iter().enumerate() {
                    assert_eq!(Some(sample), profile.sample.get(index), "cut at {cut}");
                }
            }
        }
        assert!(decoded_prefixes > 0);
    }

    #[test]
    fn malformed_bytes_fail_exactly_where_the_derived_codec_fails() {
        let bytes = every_field().encode_to_vec();
        let mut inputs: Vec<Vec<u8>> = (0..bytes.len()).map(|cut| bytes[..cut].to_vec()).collect();
        for position in 0..bytes.len() {
            for corrupt in [0x00, 0x7f, 0x80, 0xff] {
                let mut input = bytes.clone();
                input[position] = corrupt;
                inputs.push(input);
            }
        }
        let mut failures = 0;
        for input in &inputs {
            let ours = Profile::decode(input.as_slice());
            let reference = DerivedProfile::decode(input.as_slice());
            match (ours, reference) {
                (Ok(ours), Ok(reference)) => assert_eq!(derived(&ours), reference),
                // The derived codec's messages also name the field path; ours do not.
                (Err(_), Err(_)) => failures += 1,
                (ours, reference) => panic!("{input:?}: ours {ours:?}, derived {reference:?}"),
            }
        }
        assert!(failures > bytes.len() / 2, "{failures} failures");
    }

    #[test]
    fn a_profile_split_across_buffers_decodes_the_same() {
        use prost::bytes::Buf;
        let profile = every_field();
        let bytes = profile.encode_to_vec();
        for split in 0..=bytes.len() {
            let (head, tail) = bytes.split_at(split);
            let decoded = Profile::decode(head.chain(tail)).unwrap();
            assert_eq!(decoded, profile, "split at {split}");
        }
    }

    #[test]
    fn garbage_and_legacy_are_refused() {
        assert!(decode(b"\x0a\xff\xff\xff", 1 << 20).is_err());
        assert!(decode(b"--- heapz 1 ---\n", 1 << 20)
            .unwrap_err()
            .to_string()
            .contains("legacy"));
    }
}

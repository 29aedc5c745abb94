//! An `ExportProfilesServiceRequest` read straight from its protobuf bytes into flat
//! tables that borrow the body, as [`kiln_model::pprof`] reads pprof.
//!
//! prost's derived decoder allocates per string, per location's lines, per stack, and per
//! sample (its values, attribute indices and timestamps): for the same profiles, OTLP cost
//! three times the CPU of pprof, most of it there (docs/benchmarks.md). Here strings and
//! ids are slices of the body, and every repeated scalar of every sample, stack and
//! location lands in one vector per kind, addressed by ranges.
//!
//! It reads the same wire format as the derived messages in `super` and refuses what they
//! refuse (a known field with the wrong wire type, a string that is not UTF-8, a length
//! past the end, groups); `tests/mutations.rs` checks both on mutated requests. OTLP/JSON
//! still decodes into the derived messages, and [`Request::from_message`] gives the same
//! view of them.

use std::ops::Range;

use prost::encoding::{decode_varint, WireType};
use prost::Message;

use super::{
    AnyValue, ExportProfilesServiceRequest, Function, InstrumentationScope, KeyValue, Line,
    OtlpValueType, Resource,
};

/// A malformation, as text for the request's 400.
pub type WireError = String;

/// One request's tables. Ranges index the flat vectors of this struct.
#[derive(Default, Debug)]
pub struct Request<'a> {
    pub dictionary: Dictionary<'a>,
    pub resources: Vec<ResourceView>,
    pub profiles: Vec<ProfileView<'a>>,
    pub samples: Vec<SampleView>,
    /// Attribute indices of profiles and samples.
    pub indices: Vec<i32>,
    pub values: Vec<i64>,
    pub timestamps: Vec<u64>,
}

#[derive(Default, Debug)]
pub struct Dictionary<'a> {
    pub strings: Vec<&'a str>,
    pub mappings: Vec<MappingView>,
    pub locations: Vec<LocationView>,
    pub lines: Vec<Line>,
    pub functions: Vec<Function>,
    /// (trace id, span id).
    pub links: Vec<(&'a [u8], &'a [u8])>,
    pub attributes: Vec<AttributeView>,
    /// Each stack's range of `stack_locations`.
    pub stacks: Vec<Range<u32>>,
    pub stack_locations: Vec<i32>,
    /// Attribute indices of mappings and locations.
    pub indices: Vec<i32>,
}

#[derive(Default, Debug, Clone)]
pub struct MappingView {
    pub memory_start: u64,
    pub memory_limit: u64,
    pub file_offset: u64,
    pub filename_strindex: i32,
    pub attributes: Range<u32>,
}

#[derive(Default, Debug, Clone)]
pub struct LocationView {
    pub mapping_index: i32,
    pub address: u64,
    pub lines: Range<u32>,
    pub attributes: Range<u32>,
}

#[derive(Default, Debug, Clone)]
pub struct AttributeView {
    pub key_strindex: i32,
    pub value: Option<AnyValue>,
}

#[derive(Default, Debug)]
pub struct ResourceView {
    pub attributes: Option<Vec<KeyValue>>,
    pub scopes: Vec<ScopeView>,
}

#[derive(Default, Debug)]
pub struct ScopeView {
    pub attributes: Vec<KeyValue>,
    /// Range of [`Request::profiles`].
    pub profiles: Range<usize>,
}

#[derive(Default, Debug, Clone)]
pub struct ProfileView<'a> {
    pub sample_type: Option<OtlpValueType>,
    pub time_unix_nano: u64,
    pub duration_nano: u64,
    pub period_type: Option<OtlpValueType>,
    pub period: i64,
    pub profile_id: &'a [u8],
    /// Range of [`Request::indices`].
    pub attributes: Range<u32>,
    /// Range of [`Request::samples`].
    pub samples: Range<u32>,
}

#[derive(Default, Debug, Clone)]
pub struct SampleView {
    pub stack_index: i32,
    pub link_index: i32,
    /// Range of [`Request::indices`].
    pub attributes: Range<u32>,
    /// Range of [`Request::values`].
    pub values: Range<u32>,
    /// Range of [`Request::timestamps`].
    pub timestamps: Range<u32>,
}

/// Reads a binary request.
pub fn decode(body: &[u8]) -> Result<Request<'_>, WireError> {
    if u32::try_from(body.len()).is_err() {
        return Err("request over 4 GiB".into());
    }
    let mut request = Request::default();
    let mut buf = body;
    while let Some((field, wire)) = key(&mut buf)? {
        match field {
            1 => {
                let message = delimited(&mut buf, wire, "resource_profiles")?;
                request.resource_profiles(message)?;
            }
            2 => {
                let message = delimited(&mut buf, wire, "dictionary")?;
                request.dictionary.merge(message)?;
            }
            _ => skip(&mut buf, wire, field)?,
        }
    }
    Ok(request)
}

impl<'a> Request<'a> {
    fn resource_profiles(&mut self, mut buf: &'a [u8]) -> Result<(), WireError> {
        let mut resource = ResourceView::default();
        while let Some((field, wire)) = key(&mut buf)? {
            match field {
                1 => {
                    let message = delimited(&mut buf, wire, "resource")?;
                    let mut merged = Resource {
                        attributes: resource.attributes.take().unwrap_or_default(),
                        dropped_attributes_count: 0,
                    };
                    merged.merge(message).map_err(|err| err.to_string())?;
                    resource.attributes = Some(merged.attributes);
                }
                2 => {
                    let message = delimited(&mut buf, wire, "scope_profiles")?;
                    let scope = self.scope_profiles(message)?;
                    resource.scopes.push(scope);
                }
                3 => {
                    string(&mut buf, wire, "schema_url")?;
                }
                _ => skip(&mut buf, wire, field)?,
            }
        }
        self.resources.push(resource);
        Ok(())
    }

    fn scope_profiles(&mut self, mut buf: &'a [u8]) -> Result<ScopeView, WireError> {
        let mut scope: Option<InstrumentationScope> = None;
        // Only this scope's profiles are pushed while it is read, so they are contiguous
        // however its fields interleave.
        let start = self.profiles.len();
        while let Some((field, wire)) = key(&mut buf)? {
            match field {
                1 => {
                    let message = delimited(&mut buf, wire, "scope")?;
                    scope
                        .get_or_insert_with(Default::default)
                        .merge(message)
                        .map_err(|err| err.to_string())?;
                }
                2 => {
                    let message = delimited(&mut buf, wire, "profiles")?;
                    let profile = self.profile(message)?;
                    self.profiles.push(profile);
                }
                3 => {
                    string(&mut buf, wire, "schema_url")?;
                }
                _ => skip(&mut buf, wire, field)?,
            }
        }
        Ok(ScopeView {
            attributes: scope.map(|scope| scope.attributes).unwrap_or_default(),
            profiles: start..self.profiles.len(),
        })
    }

    fn profile(&mut self, mut buf: &'a [u8]) -> Result<ProfileView<'a>, WireError> {
        let mut profile = ProfileView::default();
        // Samples' attribute indices share `self.indices`, so the profile's own are
        // gathered apart; only this profile's samples are pushed while it is read.
        let mut attributes = Vec::new();
        let samples = len_u32(self.samples.len())?;
        while let Some((field, wire)) = key(&mut buf)? {
            match field {
                1 => {
                    let message = delimited(&mut buf, wire, "sample_type")?;
                    value_type(
                        profile.sample_type.get_or_insert_with(Default::default),
                        message,
                    )?;
                }
                2 => {
                    let message = delimited(&mut buf, wire, "samples")?;
                    let sample = self.sample(message)?;
                    self.samples.push(sample);
                }
                3 => profile.time_unix_nano = fixed64(&mut buf, wire, "time_unix_nano")?,
                4 => profile.duration_nano = varint(&mut buf, wire, "duration_nano")?,
                5 => {
                    let message = delimited(&mut buf, wire, "period_type")?;
                    value_type(
                        profile.period_type.get_or_insert_with(Default::default),
                        message,
                    )?;
                }
                6 => profile.period = varint(&mut buf, wire, "period")? as i64,
                7 => profile.profile_id = delimited(&mut buf, wire, "profile_id")?,
                8 => {
                    varint(&mut buf, wire, "dropped_attributes_count")?;
                }
                9 => {
                    string(&mut buf, wire, "original_payload_format")?;
                }
                10 => {
                    delimited(&mut buf, wire, "original_payload")?;
                }
                11 => repeated_int32(&mut buf, wire, &mut attributes, "attribute_indices")?,
                _ => skip(&mut buf, wire, field)?,
            }
        }
        profile.attributes = append(&mut self.indices, &attributes)?;
        profile.samples = samples..len_u32(self.samples.len())?;
        Ok(profile)
    }

    fn sample(&mut self, mut buf: &'a [u8]) -> Result<SampleView, WireError> {
        let mut sample = SampleView::default();
        // Packed fields may repeat and interleave: each kind collects on the end of its
        // shared vector, and only one sample is being read at a time.
        let (indices, values, timestamps) =
            (self.indices.len(), self.values.len(), self.timestamps.len());
        while let Some((field, wire)) = key(&mut buf)? {
            match field {
                1 => sample.stack_index = varint(&mut buf, wire, "stack_index")? as i32,
                2 => repeated_int32(&mut buf, wire, &mut self.indices, "attribute_indices")?,
                3 => sample.link_index = varint(&mut buf, wire, "link_index")? as i32,
                4 => repeated_varint(&mut buf, wire, "values", |value| {
                    self.values.push(value as i64)
                })?,
                5 => repeated_fixed64(&mut buf, wire, &mut self.timestamps, "timestamps")?,
                _ => skip(&mut buf, wire, field)?,
            }
        }
        sample.attributes = len_u32(indices)?..len_u32(self.indices.len())?;
        sample.values = len_u32(values)?..len_u32(self.values.len())?;
        sample.timestamps = len_u32(timestamps)?..len_u32(self.timestamps.len())?;
        Ok(sample)
    }

    /// The view of an already decoded request (OTLP/JSON, or prost's decoder in tests).
    pub fn from_message(message: &'a ExportProfilesServiceRequest) -> Result<Self, WireError> {
        let mut request = Request::default();
        if let Some(dictionary) = &message.dictionary {
            let out = &mut request.dictionary;
            out.strings = dictionary.string_table.iter().map(String::as_str).collect();
            for mapping in &dictionary.mapping_table {
                let attributes = append(&mut out.indices, &mapping.attribute_indices)?;
                out.mappings.push(MappingView {
                    memory_start: mapping.memory_start,
                    memory_limit: mapping.memory_limit,
                    file_offset: mapping.file_offset,
                    filename_strindex: mapping.filename_strindex,
                    attributes,
                });
            }
            for location in &dictionary.location_table {
                let attributes = append(&mut out.indices, &location.attribute_indices)?;
                let start = len_u32(out.lines.len())?;
                out.lines.extend(location.lines.iter().cloned());
                out.locations.push(LocationView {
                    mapping_index: location.mapping_index,
                    address: location.address,
                    lines: start..len_u32(out.lines.len())?,
                    attributes,
                });
            }
            out.functions = dictionary.function_table.clone();
            out.links = dictionary
                .link_table
                .iter()
                .map(|link| (link.trace_id.as_slice(), link.span_id.as_slice()))
                .collect();
            out.attributes = dictionary
                .attribute_table
                .iter()
                .map(|attribute| AttributeView {
                    key_strindex: attribute.key_strindex,
                    value: attribute.value.clone(),
                })
                .collect();
            for stack in &dictionary.stack_table {
                let range = append(&mut out.stack_locations, &stack.location_indices)?;
                out.stacks.push(range);
            }
        }
        for resource in &message.resource_profiles {
            let mut view = ResourceView {
                attributes: resource
                    .resource
                    .as_ref()
                    .map(|resource| resource.attributes.clone()),
                scopes: Vec::new(),
            };
            for scope in &resource.scope_profiles {
                let start = request.profiles.len();
                for profile in &scope.profiles {
                    let attributes = append(&mut request.indices, &profile.attribute_indices)?;
                    let first = len_u32(request.samples.len())?;
                    for sample in &profile.samples {
                        let attributes = append(&mut request.indices, &sample.attribute_indices)?;
                        let values = append(&mut request.values, &sample.values)?;
                        let timestamps =
                            append(&mut request.timestamps, &sample.timestamps_unix_nano)?;
                        request.samples.push(SampleView {
                            stack_index: sample.stack_index,
                            link_index: sample.link_index,
                            attributes,
                            values,
                            timestamps,
                        });
                    }
                    request.profiles.push(ProfileView {
                        sample_type: profile.sample_type,
                        time_unix_nano: profile.time_unix_nano,
                        duration_nano: profile.duration_nano,
                        period_type: profile.period_type,
                        period: profile.period,
                        profile_id: &profile.profile_id,
                        attributes,
                        samples: first..len_u32(request.samples.len())?,
                    });
                }
                view.scopes.push(ScopeView {
                    attributes: scope
                        .scope
                        .as_ref()
                        .map(|scope| scope.attributes.clone())
                        .unwrap_or_default(),
                    profiles: start..request.profiles.len(),
                });
            }
            request.resources.push(view);
        }
        Ok(request)
    }
}

impl<'a> Dictionary<'a> {
    /// Appends one `ProfilesDictionary` occurrence: protobuf merges repeated occurrences
    /// of a message field, which for tables means concatenating them.
    fn merge(&mut self, mut buf: &'a [u8]) -> Result<(), WireError> {
        while let Some((field, wire)) = key(&mut buf)? {
            match field {
                1 => {
                    let message = delimited(&mut buf, wire, "mapping_table")?;
                    self.mapping(message)?;
                }
                2 => {
                    let message = delimited(&mut buf, wire, "location_table")?;
                    self.location(message)?;
                }
                3 => {
                    let message = delimited(&mut buf, wire, "function_table")?;
                    self.functions.push(function(message)?);
                }
                4 => {
                    let message = delimited(&mut buf, wire, "link_table")?;
                    self.links.push(link(message)?);
                }
                5 => self.strings.push(string(&mut buf, wire, "string_table")?),
                6 => {
                    let message = delimited(&mut buf, wire, "attribute_table")?;
                    self.attributes.push(attribute(message)?);
                }
                7 => {
                    let message = delimited(&mut buf, wire, "stack_table")?;
                    self.stack(message)?;
                }
                _ => skip(&mut buf, wire, field)?,
            }
        }
        Ok(())
    }

    fn mapping(&mut self, mut buf: &'a [u8]) -> Result<(), WireError> {
        let mut mapping = MappingView::default();
        let start = len_u32(self.indices.len())?;
        while let Some((field, wire)) = key(&mut buf)? {
            match field {
                1 => mapping.memory_start = varint(&mut buf, wire, "memory_start")?,
                2 => mapping.memory_limit = varint(&mut buf, wire, "memory_limit")?,
                3 => mapping.file_offset = varint(&mut buf, wire, "file_offset")?,
                4 => {
                    mapping.filename_strindex = varint(&mut buf, wire, "filename_strindex")? as i32
                }
                5 => repeated_int32(&mut buf, wire, &mut self.indices, "attribute_indices")?,
                _ => skip(&mut buf, wire, field)?,
            }
        }
        mapping.attributes = start..len_u32(self.indices.len())?;
        self.mappings.push(mapping);
        Ok(())
    }

    fn location(&mut self, mut buf: &'a [u8]) -> Result<(), WireError> {
        let mut location = LocationView::default();
        // Lines and attribute indices may interleave: attribute indices are gathered
        // apart and appended after the lines.
        let lines = len_u32(self.lines.len())?;
        let mut attributes = Vec::new();
        while let Some((field, wire)) = key(&mut buf)? {
            match field {
                1 => location.mapping_index = varint(&mut buf, wire, "mapping_index")? as i32,
                2 => location.address = varint(&mut buf, wire, "address")?,
                3 => {
                    let message = delimited(&mut buf, wire, "lines")?;
                    self.lines.push(line(message)?);
                }
                4 => repeated_int32(&mut buf, wire, &mut attributes, "attribute_indices")?,
                _ => skip(&mut buf, wire, field)?,
            }
        }
        location.lines = lines..len_u32(self.lines.len())?;
        location.attributes = append(&mut self.indices, &attributes)?;
        self.locations.push(location);
        Ok(())
    }

    fn stack(&mut self, mut buf: &'a [u8]) -> Result<(), WireError> {
        let start = len_u32(self.stack_locations.len())?;
        while let Some((field, wire)) = key(&mut buf)? {
            match field {
                1 => repeated_int32(
                    &mut buf,
                    wire,
                    &mut self.stack_locations,
                    "location_indices",
                )?,
                _ => skip(&mut buf, wire, field)?,
            }
        }
        self.stacks
            .push(start..len_u32(self.stack_locations.len())?);
        Ok(())
    }
}

fn function(mut buf: &[u8]) -> Result<Function, WireError> {
    let mut function = Function::default();
    while let Some((field, wire)) = key(&mut buf)? {
        match field {
            1 => function.name_strindex = varint(&mut buf, wire, "name_strindex")? as i32,
            2 => {
                function.system_name_strindex =
                    varint(&mut buf, wire, "system_name_strindex")? as i32
            }
            3 => function.filename_strindex = varint(&mut buf, wire, "filename_strindex")? as i32,
            4 => function.start_line = varint(&mut buf, wire, "start_line")? as i64,
            _ => skip(&mut buf, wire, field)?,
        }
    }
    Ok(function)
}

fn line(mut buf: &[u8]) -> Result<Line, WireError> {
    let mut line = Line::default();
    while let Some((field, wire)) = key(&mut buf)? {
        match field {
            1 => line.function_index = varint(&mut buf, wire, "function_index")? as i32,
            2 => line.line = varint(&mut buf, wire, "line")? as i64,
            3 => line.column = varint(&mut buf, wire, "column")? as i64,
            _ => skip(&mut buf, wire, field)?,
        }
    }
    Ok(line)
}

fn link(mut buf: &[u8]) -> Result<(&[u8], &[u8]), WireError> {
    let (mut trace_id, mut span_id): (&[u8], &[u8]) = (&[], &[]);
    while let Some((field, wire)) = key(&mut buf)? {
        match field {
            1 => trace_id = delimited(&mut buf, wire, "trace_id")?,
            2 => span_id = delimited(&mut buf, wire, "span_id")?,
            _ => skip(&mut buf, wire, field)?,
        }
    }
    Ok((trace_id, span_id))
}

fn attribute(mut buf: &[u8]) -> Result<AttributeView, WireError> {
    let mut attribute = AttributeView::default();
    while let Some((field, wire)) = key(&mut buf)? {
        match field {
            1 => attribute.key_strindex = varint(&mut buf, wire, "key_strindex")? as i32,
            2 => {
                let message = delimited(&mut buf, wire, "value")?;
                attribute
                    .value
                    .get_or_insert_with(Default::default)
                    .merge(message)
                    .map_err(|err| err.to_string())?;
            }
            // Read to refuse what prost refuses; a unit does not change a label.
            3 => {
                varint(&mut buf, wire, "unit_strindex")?;
            }
            _ => skip(&mut buf, wire, field)?,
        }
    }
    Ok(attribute)
}

fn value_type(value_type: &mut OtlpValueType, mut buf: &[u8]) -> Result<(), WireError> {
    while let Some((field, wire)) = key(&mut buf)? {
        match field {
            1 => value_type.type_strindex = varint(&mut buf, wire, "type_strindex")? as i32,
            2 => value_type.unit_strindex = varint(&mut buf, wire, "unit_strindex")? as i32,
            _ => skip(&mut buf, wire, field)?,
        }
    }
    Ok(())
}

fn len_u32(len: usize) -> Result<u32, WireError> {
    u32::try_from(len).map_err(|_| "request has over 4 G entries".to_string())
}

/// Appends `items` to `to`, returning where they went.
fn append<T: Clone>(to: &mut Vec<T>, items: &[T]) -> Result<Range<u32>, WireError> {
    let start = len_u32(to.len())?;
    to.extend_from_slice(items);
    Ok(start..len_u32(to.len())?)
}

/// The next field key, or None at the end of the message.
///
/// This and the helpers below are inlined into every message's field loop, with their
/// error text built out of line: a call per field cost more than reading the field.
#[inline(always)]
fn key(buf: &mut &[u8]) -> Result<Option<(u32, WireType)>, WireError> {
    if buf.is_empty() {
        return Ok(None);
    }
    let key = next_varint(buf)?;
    let wire = match key & 0x7 {
        0 => WireType::Varint,
        1 => WireType::SixtyFourBit,
        2 => WireType::LengthDelimited,
        3 => WireType::StartGroup,
        4 => WireType::EndGroup,
        5 => WireType::ThirtyTwoBit,
        _ => return Err(bad_key(key)),
    };
    if key > u64::from(u32::MAX) || key >> 3 == 0 {
        return Err(bad_key(key));
    }
    Ok(Some(((key as u32) >> 3, wire)))
}

#[cold]
#[inline(never)]
fn bad_key(key: u64) -> WireError {
    match key {
        _ if key > u64::from(u32::MAX) => format!("invalid key value: {key}"),
        _ if key & 0x7 > 5 => format!("invalid wire type value: {}", key & 0x7),
        _ => "invalid tag value: 0".into(),
    }
}

#[inline(always)]
fn expect(wire: WireType, expected: WireType, what: &str) -> Result<(), WireError> {
    if wire != expected {
        return Err(wrong_wire_type(wire, expected, what));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn wrong_wire_type(wire: WireType, expected: WireType, what: &str) -> WireError {
    format!("invalid wire type for {what}: {wire:?} (expected {expected:?})")
}

#[cold]
#[inline(never)]
fn underflow(what: &str) -> WireError {
    format!("{what}: buffer underflow")
}

#[inline(always)]
fn delimited<'a>(buf: &mut &'a [u8], wire: WireType, what: &str) -> Result<&'a [u8], WireError> {
    expect(wire, WireType::LengthDelimited, what)?;
    let len = next_varint(buf)?;
    if len > buf.len() as u64 {
        return Err(underflow(what));
    }
    let (head, tail) = buf.split_at(len as usize);
    *buf = tail;
    Ok(head)
}

fn string<'a>(buf: &mut &'a [u8], wire: WireType, what: &str) -> Result<&'a str, WireError> {
    let bytes = delimited(buf, wire, what)?;
    std::str::from_utf8(bytes)
        .map_err(|_| format!("{what}: invalid string value: data is not UTF-8 encoded"))
}

#[inline(always)]
fn varint(buf: &mut &[u8], wire: WireType, what: &str) -> Result<u64, WireError> {
    expect(wire, WireType::Varint, what)?;
    next_varint(buf)
}

/// One- and two-byte varints (field keys, indices, most values) inline; longer ones
/// through prost.
#[inline(always)]
fn next_varint(buf: &mut &[u8]) -> Result<u64, WireError> {
    match *buf {
        [byte, rest @ ..] if *byte < 0x80 => {
            *buf = rest;
            Ok(u64::from(*byte))
        }
        [low, high, rest @ ..] if *high < 0x80 => {
            *buf = rest;
            Ok(u64::from(low & 0x7f) | (u64::from(*high) << 7))
        }
        _ => long_varint(buf),
    }
}

#[inline(never)]
fn long_varint(buf: &mut &[u8]) -> Result<u64, WireError> {
    decode_varint(buf).map_err(|err| err.to_string())
}

fn fixed64(buf: &mut &[u8], wire: WireType, what: &str) -> Result<u64, WireError> {
    expect(wire, WireType::SixtyFourBit, what)?;
    let Some((bytes, tail)) = buf.split_first_chunk::<8>() else {
        return Err(underflow(what));
    };
    *buf = tail;
    Ok(u64::from_le_bytes(*bytes))
}

/// A repeated varint field, packed or not.
#[inline(always)]
fn repeated_varint(
    buf: &mut &[u8],
    wire: WireType,
    what: &str,
    mut push: impl FnMut(u64),
) -> Result<(), WireError> {
    if wire == WireType::LengthDelimited {
        let mut packed = delimited(buf, wire, what)?;
        while !packed.is_empty() {
            push(next_varint(&mut packed)?);
        }
        return Ok(());
    }
    push(varint(buf, wire, what)?);
    Ok(())
}

#[inline(always)]
fn repeated_int32(
    buf: &mut &[u8],
    wire: WireType,
    to: &mut Vec<i32>,
    what: &str,
) -> Result<(), WireError> {
    repeated_varint(buf, wire, what, |value| to.push(value as i32))
}

/// A repeated fixed64 field, packed or not.
fn repeated_fixed64(
    buf: &mut &[u8],
    wire: WireType,
    to: &mut Vec<u64>,
    what: &str,
) -> Result<(), WireError> {
    if wire == WireType::LengthDelimited {
        let packed = delimited(buf, wire, what)?;
        if packed.len() % 8 != 0 {
            return Err(format!(
                "{what}: packed fixed64 length is not a multiple of 8"
            ));
        }
        to.extend(
            packed
                .chunks_exact(8)
                .map(|bytes| u64::from_le_bytes(bytes.try_into().unwrap_or_default())),
        );
        return Ok(());
    }
    to.push(fixed64(buf, wire, what)?);
    Ok(())
}

/// Skips an unknown field the way prost does (groups included).
fn skip(buf: &mut &[u8], wire: WireType, field: u32) -> Result<(), WireError> {
    prost::encoding::skip_field(wire, field, buf, Default::default()).map_err(|err| err.to_string())
}

//! Java Flight Recorder recordings (the JDK's own, async-profiler's, pyroscope-java's),
//! read from the documented chunk format: a 68-byte header, a metadata event describing
//! every type and its fields, checkpoint events holding the constant pools (stack traces,
//! methods, classes, symbols), and events whose fields follow their type's metadata.
//!
//! Written here rather than taken from a crate: the Rust JFR readers on crates.io cover
//! the JDK's own recordings only partly and none is maintained for ingest; this reader
//! is small, bounds every count and length by the bytes left, and never recurses deeper
//! than the metadata's type nesting (checked, so cyclic type graphs are refused).
//!
//! Events become pprof profiles by kind, each with its own profile type:
//! - `jdk.ExecutionSample` → CPU time (one sampling interval per sample);
//! - `jdk.NativeMethodSample` → wall time;
//! - `jdk.ObjectAllocationInNewTLAB`, `jdk.ObjectAllocationOutsideTLAB`,
//!   `jdk.ObjectAllocationSample` → allocated objects and bytes;
//! - `jdk.JavaMonitorEnter`, `jdk.ThreadPark` → lock count and time.

use std::collections::HashMap;

use crate::build::{Frame, ProfileBuilder};
use crate::pprof::Profile;
use crate::FormatError;

const MAGIC: &[u8; 4] = b"FLR\0";
const HEADER_BYTES: usize = 68;
const METADATA_EVENT: i64 = 0;
const CHECKPOINT_EVENT: i64 = 1;
/// Deepest nesting of inline (non-pool) fields; real metadata nests a few levels.
const MAX_NESTING: usize = 32;

fn bad(message: impl Into<String>) -> FormatError {
    FormatError::malformed(format!("invalid JFR recording: {}", message.into()))
}

/// A cursor over one chunk's bytes; every read is bounds-checked.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
    compressed: bool,
}

impl<'a> Reader<'a> {
    fn byte(&mut self) -> Result<u8, FormatError> {
        let byte = *self
            .data
            .get(self.at)
            .ok_or_else(|| bad(format!("truncated at byte {}", self.at)))?;
        self.at += 1;
        Ok(byte)
    }

    fn bytes(&mut self, count: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .at
            .checked_add(count)
            .filter(|end| *end <= self.data.len())
            .ok_or_else(|| bad(format!("{count} bytes at {} run past the end", self.at)))?;
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    /// JFR's variable-length integer: 7 bits per byte, the ninth byte whole.
    fn varint(&mut self) -> Result<i64, FormatError> {
        let mut value: u64 = 0;
        for shift in 0..8 {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << (7 * shift);
            if byte & 0x80 == 0 {
                return Ok(value as i64);
            }
        }
        let byte = self.byte()?;
        value |= u64::from(byte) << 56;
        Ok(value as i64)
    }

    fn int(&mut self, fixed_bytes: usize) -> Result<i64, FormatError> {
        if self.compressed {
            return self.varint();
        }
        Ok(match fixed_bytes {
            2 => i64::from(i16::from_be_bytes(self.fixed()?)),
            4 => i64::from(i32::from_be_bytes(self.fixed()?)),
            _ => i64::from_be_bytes(self.fixed()?),
        })
    }

    /// A count, bounded by the bytes left (every element takes at least one byte).
    fn count(&mut self) -> Result<usize, FormatError> {
        let count = self.varint()?;
        let left = self.data.len() - self.at;
        usize::try_from(count)
            .ok()
            .filter(|count| *count <= left)
            .ok_or_else(|| {
                bad(format!(
                    "count {count} at byte {} exceeds the data",
                    self.at
                ))
            })
    }

    fn string(&mut self) -> Result<StringValue, FormatError> {
        Ok(match self.byte()? {
            0 => StringValue::Null,
            1 => StringValue::Text(String::new()),
            2 => StringValue::Pool(self.varint()?),
            3 => {
                let len = self.count()?;
                StringValue::Text(String::from_utf8_lossy(self.bytes(len)?).into_owned())
            }
            4 => {
                let len = self.count()?;
                let mut text = String::with_capacity(len);
                for _ in 0..len {
                    let unit = self.varint()?;
                    text.push(
                        u32::try_from(unit)
                            .ok()
                            .and_then(char::from_u32)
                            .unwrap_or(char::REPLACEMENT_CHARACTER),
                    );
                }
                StringValue::Text(text)
            }
            5 => {
                let len = self.count()?;
                StringValue::Text(self.bytes(len)?.iter().map(|b| *b as char).collect())
            }
            other => {
                return Err(bad(format!(
                    "unknown string encoding {other} at byte {}",
                    self.at - 1
                )))
            }
        })
    }
}

#[derive(Debug, Clone)]
enum StringValue {
    Null,
    Text(String),
    Pool(i64),
}

#[derive(Debug, Clone)]
enum Value {
    Null,
    Int(i64),
    Float(f64),
    Text(String),
    /// A reference into the constant pool of a type: (type id, key).
    Ref(i64, i64),
    Array(Vec<Value>),
    Object(Vec<Value>),
}

#[derive(Debug, Clone)]
struct Field {
    name: String,
    type_id: i64,
    pooled: bool,
    array: bool,
}

#[derive(Debug, Clone, Default)]
struct Type {
    name: String,
    fields: Vec<Field>,
}

/// The metadata's element tree, as parsed: (name, attributes, children).
struct Element {
    name: String,
    attributes: Vec<(String, String)>,
    children: Vec<Element>,
}

impl Element {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.as_str())
    }
}

fn read_element(
    reader: &mut Reader<'_>,
    strings: &[String],
    depth: usize,
) -> Result<Element, FormatError> {
    if depth > MAX_NESTING {
        return Err(bad("metadata elements nest too deep"));
    }
    let string = |index: i64| -> Result<String, FormatError> {
        usize::try_from(index)
            .ok()
            .and_then(|index| strings.get(index))
            .cloned()
            .ok_or_else(|| bad(format!("metadata string {index} is out of range")))
    };
    let name = string(reader.varint()?)?;
    let attribute_count = reader.count()?;
    let mut attributes = Vec::with_capacity(attribute_count);
    for _ in 0..attribute_count {
        let key = string(reader.varint()?)?;
        let value = string(reader.varint()?)?;
        attributes.push((key, value));
    }
    let child_count = reader.count()?;
    let mut children = Vec::with_capacity(child_count);
    for _ in 0..child_count {
        children.push(read_element(reader, strings, depth + 1)?);
    }
    Ok(Element {
        name,
        attributes,
        children,
    })
}

/// Reads the metadata event at `offset`: every type by id.
fn read_metadata(
    reader: &mut Reader<'_>,
    offset: usize,
) -> Result<HashMap<i64, Type>, FormatError> {
    reader.at = offset;
    let _size = reader.int(4)?;
    if reader.varint()? != METADATA_EVENT {
        return Err(bad(
            "the metadata offset does not point at a metadata event",
        ));
    }
    let _start = reader.varint()?;
    let _duration = reader.varint()?;
    let _metadata_id = reader.varint()?;
    let string_count = reader.count()?;
    let mut strings = Vec::with_capacity(string_count);
    for _ in 0..string_count {
        strings.push(match reader.string()? {
            StringValue::Text(text) => text,
            _ => String::new(),
        });
    }
    let root = read_element(reader, &strings, 0)?;
    let mut types = HashMap::new();
    let classes = root
        .children
        .iter()
        .filter(|element| element.name == "metadata")
        .flat_map(|metadata| &metadata.children)
        .filter(|element| element.name == "class");
    for class in classes {
        let id: i64 = class
            .attribute("id")
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| bad("a metadata class has no numeric id"))?;
        let fields = class
            .children
            .iter()
            .filter(|element| element.name == "field")
            .map(|field| {
                Ok(Field {
                    name: field.attribute("name").unwrap_or_default().to_string(),
                    type_id: field
                        .attribute("class")
                        .and_then(|id| id.parse().ok())
                        .ok_or_else(|| bad("a metadata field has no numeric class"))?,
                    pooled: field.attribute("constantPool") == Some("true"),
                    array: field.attribute("dimension") == Some("1"),
                })
            })
            .collect::<Result<Vec<_>, FormatError>>()?;
        types.insert(
            id,
            Type {
                name: class.attribute("name").unwrap_or_default().to_string(),
                fields,
            },
        );
    }
    Ok(types)
}

struct Chunk<'a> {
    types: &'a HashMap<i64, Type>,
    /// Constant pools: type id → key → value.
    pools: HashMap<i64, HashMap<i64, Value>>,
}

impl Chunk<'_> {
    fn read_value(
        &self,
        reader: &mut Reader<'_>,
        type_id: i64,
        depth: usize,
    ) -> Result<Value, FormatError> {
        if depth > MAX_NESTING {
            return Err(bad("field types nest too deep (a cycle in the metadata?)"));
        }
        let kind = self
            .types
            .get(&type_id)
            .ok_or_else(|| bad(format!("a field refers to unknown type {type_id}")))?;
        Ok(match kind.name.as_str() {
            "boolean" | "byte" => Value::Int(i64::from(reader.byte()?)),
            "char" | "short" => Value::Int(reader.int(2)?),
            "int" => Value::Int(reader.int(4)?),
            "long" => Value::Int(reader.int(8)?),
            "float" => Value::Float(f64::from(f32::from_be_bytes(reader.fixed()?))),
            "double" => Value::Float(f64::from_be_bytes(reader.fixed()?)),
            "java.lang.String" => match reader.string()? {
                StringValue::Null => Value::Null,
                StringValue::Text(text) => Value::Text(text),
                StringValue::Pool(key) => Value::Ref(type_id, key),
            },
            _ => {
                let mut values = Vec::with_capacity(kind.fields.len());
                for field in &kind.fields {
                    values.push(self.read_field(reader, field, depth + 1)?);
                }
                Value::Object(values)
            }
        })
    }

    fn read_field(
        &self,
        reader: &mut Reader<'_>,
        field: &Field,
        depth: usize,
    ) -> Result<Value, FormatError> {
        let one = |reader: &mut Reader<'_>| -> Result<Value, FormatError> {
            if field.pooled {
                Ok(Value::Ref(field.type_id, reader.varint()?))
            } else {
                self.read_value(reader, field.type_id, depth)
            }
        };
        if field.array {
            let count = reader.count()?;
            let mut values = Vec::with_capacity(count);
            for _ in 0..count {
                values.push(one(reader)?);
            }
            return Ok(Value::Array(values));
        }
        one(reader)
    }

    /// Follows pool references (at most a few levels; pools may refer to pools).
    fn resolve<'v>(&'v self, mut value: &'v Value) -> &'v Value {
        for _ in 0..8 {
            match value {
                Value::Ref(type_id, key) => {
                    match self.pools.get(type_id).and_then(|pool| pool.get(key)) {
                        Some(next) => value = next,
                        None => return &Value::Null,
                    }
                }
                _ => return value,
            }
        }
        &Value::Null
    }

    /// Field `name` of an object of type `type_id`.
    fn field<'v>(&'v self, value: &'v Value, type_id: i64, name: &str) -> &'v Value {
        let value = self.resolve(value);
        let (Value::Object(values), Some(kind)) = (value, self.types.get(&type_id)) else {
            return &Value::Null;
        };
        kind.fields
            .iter()
            .position(|field| field.name == name)
            .and_then(|position| values.get(position))
            .map_or(&Value::Null, |value| self.resolve(value))
    }

    fn field_type(&self, type_id: i64, name: &str) -> Option<i64> {
        self.types
            .get(&type_id)?
            .fields
            .iter()
            .find(|field| field.name == name)
            .map(|field| field.type_id)
    }

    fn text(&self, value: &Value) -> String {
        match self.resolve(value) {
            Value::Text(text) => text.clone(),
            // A Symbol or similar: its single string field.
            Value::Object(values) => values
                .iter()
                .find_map(|value| match self.resolve(value) {
                    Value::Text(text) => Some(text.clone()),
                    _ => None,
                })
                .unwrap_or_default(),
            _ => String::new(),
        }
    }

    fn int(&self, value: &Value) -> i64 {
        match self.resolve(value) {
            Value::Int(value) => *value,
            Value::Float(value) => *value as i64,
            _ => 0,
        }
    }
}

/// Reads every checkpoint of a chunk, newest first, following each one's delta back.
fn read_pools(
    chunk: &mut Chunk<'_>,
    reader: &mut Reader<'_>,
    first: usize,
) -> Result<(), FormatError> {
    let mut offset = first;
    let mut seen = 0;
    loop {
        seen += 1;
        if seen > 100_000 {
            return Err(bad("too many checkpoints (a cycle in their deltas?)"));
        }
        reader.at = offset;
        let _size = reader.int(4)?;
        if reader.varint()? != CHECKPOINT_EVENT {
            return Err(bad(format!("no checkpoint event at byte {offset}")));
        }
        let _start = reader.varint()?;
        let _duration = reader.varint()?;
        let delta = reader.varint()?;
        let _flags = reader.byte()?;
        let pool_count = reader.count()?;
        for _ in 0..pool_count {
            let type_id = reader.varint()?;
            let count = reader.count()?;
            for _ in 0..count {
                let key = reader.varint()?;
                let value = chunk.read_value(reader, type_id, 0)?;
                chunk.pools.entry(type_id).or_default().insert(key, value);
            }
        }
        if delta == 0 {
            return Ok(());
        }
        // Deltas point backwards from this checkpoint to the previous one.
        offset = i64::try_from(offset)
            .ok()
            .and_then(|at| at.checked_add(delta))
            .and_then(|next| usize::try_from(next).ok())
            .filter(|next| *next >= HEADER_BYTES && *next < reader.data.len() && *next != offset)
            .ok_or_else(|| {
                bad(format!(
                    "checkpoint delta {delta} at byte {offset} leaves the chunk"
                ))
            })?;
    }
}

/// The profile types a recording yields, each its own pprof.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Cpu,
    Wall,
    Alloc,
    Lock,
}

impl Kind {
    /// Kiln's profile name for this kind (the `__name__` of its series).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Cpu => "process_cpu",
            Kind::Wall => "wall",
            Kind::Alloc => "memory",
            Kind::Lock => "mutex",
        }
    }

    fn sample_types(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Kind::Cpu => &[("cpu", "nanoseconds")],
            Kind::Wall => &[("wall", "nanoseconds")],
            Kind::Alloc => &[("alloc_objects", "count"), ("alloc_space", "bytes")],
            Kind::Lock => &[("lock_count", "count"), ("lock_time", "nanoseconds")],
        }
    }

    fn period_type(self) -> (&'static str, &'static str) {
        match self {
            Kind::Cpu => ("cpu", "nanoseconds"),
            Kind::Wall => ("wall", "nanoseconds"),
            Kind::Alloc => ("space", "bytes"),
            Kind::Lock => ("lock", "nanoseconds"),
        }
    }
}

/// One profile type of a recording.
pub struct Recording {
    pub kind: Kind,
    pub profile: Profile,
}

/// What one event adds to its profile.
struct EventValues {
    kind: Kind,
    values: [i64; 2],
}

/// Labels of pyroscope-java's context ids: events carrying a `contextId` field get the
/// labels of that context.
pub type Contexts = HashMap<i64, Vec<(String, String)>>;

/// Parses a JFR recording (one or more chunks). `cpu_interval_nanos` is the value of one
/// execution sample (the profiler's sampling interval).
pub fn parse(
    data: &[u8],
    cpu_interval_nanos: i64,
    max_samples: usize,
    contexts: &Contexts,
) -> Result<Vec<Recording>, FormatError> {
    if !data.starts_with(MAGIC) {
        return Err(bad("it does not start with the FLR magic"));
    }
    let mut builders: HashMap<Kind, ProfileBuilder> = HashMap::new();
    let mut start_nanos = i64::MAX;
    let mut end_nanos = i64::MIN;
    let mut offset = 0;
    while offset < data.len() {
        let rest = &data[offset..];
        if rest.len() < HEADER_BYTES || !rest.starts_with(MAGIC) {
            return Err(bad(format!("no chunk header at byte {offset}")));
        }
        let header =
            |at: usize| i64::from_be_bytes(rest[at..at + 8].try_into().unwrap_or_default());
        let major = u16::from_be_bytes([rest[4], rest[5]]);
        if major != 2 && major != 1 {
            return Err(bad(format!(
                "chunk version {major} is not supported (1.x and 2.x are)"
            )));
        }
        let size = usize::try_from(header(8))
            .ok()
            .filter(|size| *size >= HEADER_BYTES && *size <= rest.len())
            .ok_or_else(|| {
                bad(format!(
                    "chunk at byte {offset} declares a size past the data"
                ))
            })?;
        let chunk_data = &rest[..size];
        let position = |value: i64, what: &str| {
            usize::try_from(value)
                .ok()
                .filter(|at| *at >= HEADER_BYTES && *at < size)
                .ok_or_else(|| bad(format!("{what} offset {value} is outside its chunk")))
        };
        let pool_offset = position(header(16), "constant pool")?;
        let metadata_offset = position(header(24), "metadata")?;
        let chunk_start = header(32);
        let chunk_duration = header(40);
        let ticks_per_second = header(56).max(1);
        let compressed = i32::from_be_bytes([rest[64], rest[65], rest[66], rest[67]]) & 1 != 0;
        start_nanos = start_nanos.min(chunk_start);
        end_nanos = end_nanos.max(chunk_start.saturating_add(chunk_duration));

        let mut reader = Reader {
            data: chunk_data,
            at: 0,
            compressed,
        };
        let types = read_metadata(&mut reader, metadata_offset)?;
        let mut chunk = Chunk {
            types: &types,
            pools: HashMap::new(),
        };
        read_pools(&mut chunk, &mut reader, pool_offset)?;
        let type_names: HashMap<&str, i64> = types
            .iter()
            .map(|(id, kind)| (kind.name.as_str(), *id))
            .collect();
        let ticks_to_nanos =
            |ticks: i64| (ticks as f64 * 1e9 / ticks_per_second as f64).round() as i64;

        reader.at = HEADER_BYTES;
        while reader.at < size {
            let event_start = reader.at;
            let event_size = usize::try_from(reader.int(4)?)
                .ok()
                .filter(|len| *len > 0 && event_start + len <= size)
                .ok_or_else(|| bad(format!("event at byte {event_start} has an invalid size")))?;
            let event_end = event_start + event_size;
            let type_id = reader.varint()?;
            let Some(kind) = types.get(&type_id) else {
                reader.at = event_end;
                continue;
            };
            let Some(kind_of_event) = event_kind(&kind.name) else {
                reader.at = event_end;
                continue;
            };
            let mut event_reader = Reader {
                data: &chunk_data[..event_end],
                at: reader.at,
                compressed,
            };
            let mut fields = Vec::with_capacity(kind.fields.len());
            for field in &kind.fields {
                fields.push(chunk.read_field(&mut event_reader, field, 0)?);
            }
            reader.at = event_end;
            let event = Value::Object(fields);
            let get = |name: &str| chunk.field(&event, type_id, name);
            let values = match kind_of_event {
                Kind::Cpu => [cpu_interval_nanos, 0],
                Kind::Wall => [cpu_interval_nanos, 0],
                Kind::Lock => [1, ticks_to_nanos(chunk.int(get("duration")))],
                Kind::Alloc => {
                    let bytes = match kind.name.as_str() {
                        "jdk.ObjectAllocationInNewTLAB" => chunk.int(get("tlabSize")),
                        "jdk.ObjectAllocationSample" => chunk.int(get("weight")),
                        _ => chunk.int(get("allocationSize")),
                    };
                    [1, bytes]
                }
            };
            let event_values = EventValues {
                kind: kind_of_event,
                values,
            };
            let Some(stack_type) = chunk.field_type(type_id, "stackTrace") else {
                continue;
            };
            let stack_value = get("stackTrace");
            let builder = builders.entry(event_values.kind).or_insert_with(|| {
                let kind = event_values.kind;
                ProfileBuilder::new(kind.sample_types(), Some(kind.period_type()), 0)
            });
            let stack = stack_locations(&chunk, &type_names, stack_value, stack_type, builder);
            if stack.is_empty() {
                continue;
            }
            let count = kind_of_event.sample_types().len();
            let labels: Vec<(&str, &str)> = match get("contextId") {
                Value::Int(context) if *context != 0 => contexts
                    .get(context)
                    .map(|labels| {
                        labels
                            .iter()
                            .map(|(key, value)| (key.as_str(), value.as_str()))
                            .collect()
                    })
                    .unwrap_or_default(),
                _ => Vec::new(),
            };
            builder.add(&stack, &event_values.values[..count], &labels);
            if builder.sample_count() > max_samples {
                return Err(FormatError::Limit(format!(
                    "JFR recording has more than {max_samples} distinct stacks of one kind"
                )));
            }
        }
        offset += size;
    }
    let duration = end_nanos.saturating_sub(start_nanos).max(0);
    let mut recordings: Vec<Recording> = builders
        .into_iter()
        .map(|(kind, builder)| Recording {
            kind,
            profile: builder.finish(start_nanos.max(0), duration),
        })
        .collect();
    recordings.sort_by_key(|recording| recording.kind);
    Ok(recordings)
}

fn event_kind(name: &str) -> Option<Kind> {
    Some(match name {
        "jdk.ExecutionSample" => Kind::Cpu,
        "jdk.NativeMethodSample" => Kind::Wall,
        "jdk.ObjectAllocationInNewTLAB"
        | "jdk.ObjectAllocationOutsideTLAB"
        | "jdk.ObjectAllocationSample" => Kind::Alloc,
        "jdk.JavaMonitorEnter" | "jdk.ThreadPark" => Kind::Lock,
        _ => return None,
    })
}

/// The location ids of a stack trace, leaf first (JFR's order too).
fn stack_locations(
    chunk: &Chunk<'_>,
    type_names: &HashMap<&str, i64>,
    stack: &Value,
    stack_type: i64,
    builder: &mut ProfileBuilder,
) -> Vec<u32> {
    let Value::Array(frames) = chunk.field(stack, stack_type, "frames") else {
        return Vec::new();
    };
    let frame_type = type_names
        .get("jdk.types.StackFrame")
        .copied()
        .unwrap_or(-1);
    let method_type = type_names.get("jdk.types.Method").copied().unwrap_or(-1);
    let class_type = type_names.get("java.lang.Class").copied().unwrap_or(-1);
    let mut locations = Vec::with_capacity(frames.len());
    for frame in frames {
        let method = chunk.field(frame, frame_type, "method");
        let line = chunk.int(chunk.field(frame, frame_type, "lineNumber"));
        let class = chunk.field(method, method_type, "type");
        let class_name = chunk
            .text(chunk.field(class, class_type, "name"))
            .replace('/', ".");
        let method_name = chunk.text(chunk.field(method, method_type, "name"));
        let function = match (class_name.is_empty(), method_name.is_empty()) {
            (true, true) => "[unknown]".to_string(),
            (true, false) => method_name,
            (false, _) => format!("{class_name}.{method_name}"),
        };
        locations.push(builder.location(&Frame {
            function: &function,
            line: line.max(0),
            ..Default::default()
        }));
    }
    locations
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_truncation_are_refused() {
        let contexts = Contexts::new();
        assert!(parse(b"", 10_000_000, 1000, &contexts).is_err());
        assert!(parse(b"not a recording", 10_000_000, 1000, &contexts).is_err());
        let mut header = b"FLR\0\x00\x02\x00\x01".to_vec();
        header.extend_from_slice(&1_000_000i64.to_be_bytes());
        header.resize(HEADER_BYTES, 0);
        let err = parse(&header, 10_000_000, 1000, &contexts)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("size past the data"), "{err}");
    }

    /// Each sample as `root;…;leaf:line values`, sorted.
    fn stacks(profile: &Profile) -> Vec<String> {
        let mut out: Vec<String> = profile
            .sample
            .iter()
            .map(|sample| {
                let frames: Vec<String> = sample
                    .location_id
                    .iter()
                    .rev()
                    .map(|id| {
                        let location = &profile.location[*id as usize - 1];
                        let line = &location.line[0];
                        let function = &profile.function[line.function_id as usize - 1];
                        format!("{}:{}", profile.string_or_empty(function.name), line.line)
                    })
                    .collect();
                format!("{} {:?}", frames.join(";"), sample.value)
            })
            .collect();
        out.sort();
        out
    }

    /// The fuzz target's seeds (`fuzz/seeds/jfr_seeds.py`): their events, both integer
    /// encodings, two chunks and chained checkpoints read as written, so the fuzzer starts
    /// from recordings this reader takes in full.
    #[test]
    fn the_fuzz_seeds_read_as_written() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/regressions/jfr_parse");
        let contexts = Contexts::new();
        for (file, chunks) in [
            ("seed-compressed.jfr", 1),
            ("seed-fixed.jfr", 1),
            ("seed-two-chunks.jfr", 2),
        ] {
            let data = std::fs::read(dir.join(file)).unwrap();
            let recordings = parse(&data, 10, 1000, &contexts).unwrap();
            let kinds: Vec<Kind> = recordings.iter().map(|r| r.kind).collect();
            assert_eq!(kinds, [Kind::Cpu, Kind::Alloc, Kind::Lock], "{file}");
            let n = chunks as i64;
            assert_eq!(
                stacks(&recordings[0].profile),
                [
                    format!("com.example.Shop.main:5;com.example.Shop.checkout:17;com.example.Shop.price:42 [{}]", 20 * n),
                    format!("com.example.Shop.main:5;com.example.Shop.checkout:18 [{}]", 10 * n),
                ],
                "{file}"
            );
            assert_eq!(
                stacks(&recordings[1].profile),
                [format!(
                    "com.example.Shop.main:5;com.example.Shop.checkout:18 [{n}, {}]",
                    4096 * n
                )],
                "{file}"
            );
            assert_eq!(
                stacks(&recordings[2].profile),
                [
                    format!("com.example.Shop.main:5;com.example.Shop.checkout:17;com.example.Shop.price:42 [{n}, {}]", 5000 * n),
                    format!("com.example.Shop.main:5;com.example.Shop.checkout:18 [{n}, {}]", 7000 * n),
                ],
                "{file}"
            );
        }
    }

    #[test]
    fn varints_read_as_jfr_writes_them() {
        let mut reader = Reader {
            data: &[
                0x05, 0x96, 0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            ],
            at: 0,
            compressed: true,
        };
        assert_eq!(reader.varint().unwrap(), 5);
        assert_eq!(reader.varint().unwrap(), 150);
        assert_eq!(reader.varint().unwrap(), -1);
        assert!(reader.varint().is_err());
    }
}

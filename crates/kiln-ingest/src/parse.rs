//! Shared conversion from a decoded pprof to a validated [`ParsedProfile`].

use kiln_model::labels::{self, Labels, METRIC_NAME, SERVICE_NAME};
use kiln_model::pprof::{self, Profile, Validated, ValueType};
use kiln_model::profile_type::name_for_sample_type;
use kiln_model::ProfileType;
use kiln_storage::builder::{PprofInput, TypePlan, PER_SAMPLE_LABELS};

use crate::{IngestError, Limits};

/// The service name used when a client sends none, as OpenTelemetry does.
pub const UNKNOWN_SERVICE: &str = "unknown_service";

/// A profile ready to be written: decoded, validated and with its series decided.
pub struct ParsedProfile {
    pub id: String,
    /// The client named the profile: its id is kept, not derived from its identity.
    pub id_given: bool,
    /// Set when it was claimed for storing ([`crate::dedup`]): registered with its
    /// segment, and logged with it.
    pub identity: Option<kiln_metastore::WriteIdentity>,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    /// Series labels, always with `service_name`.
    pub labels: Labels,
    pub profile: Profile,
    pub index: Validated,
    pub types: Vec<TypePlan>,
    /// Size of the profile as received, for accounting.
    pub received_bytes: usize,
    /// See [`ProfileContext::sample_labels_per_sample`].
    pub sample_labels_per_sample: bool,
    /// What the client should hear although the write succeeded (a dropped reserved
    /// label), for the response's `Warning` header.
    pub warnings: Vec<String>,
    /// What was cut from the profile as sent, for the server's counters.
    pub cuts: Cuts,
    /// The pprof bytes as received (gzip or plain), when they decode to `profile`
    /// exactly: the write-ahead log keeps them rather than encode the profile again,
    /// which cost as much as decoding it (docs/benchmarks.md, session 34).
    pub source: Option<Vec<u8>>,
}

impl ParsedProfile {
    /// The memory the decoded profile holds ([`Profile::heap_bytes`] and its index),
    /// whatever the wire format was. Asked by benchmarks only: the write path counts a
    /// profile by what staging it adds to its batch, and drops the decoded form there.
    pub fn decoded_bytes(&self) -> usize {
        self.profile.heap_bytes() + self.index.heap_bytes()
    }

    pub fn service(&self) -> &str {
        self.labels.get(SERVICE_NAME).unwrap_or(UNKNOWN_SERVICE)
    }

    /// The builder's view of this profile.
    pub fn input(&self, max_stack_depth: usize) -> PprofInput<'_> {
        PprofInput {
            profile: &self.profile,
            index: &self.index,
            id: &self.id,
            time_nanos: self.time_nanos,
            duration_nanos: self.duration_nanos,
            labels: &self.labels,
            types: &self.types,
            max_stack_depth,
            sample_labels_per_sample: self.sample_labels_per_sample,
        }
    }
}

/// What a profile lost to the shape limits on its way in; each also puts a warning on
/// the response. A write is cut rather than refused where the rest is still true: the
/// heaviest stacks of a profile over `max_samples_per_profile`, the innermost frames of a
/// stack deeper than `max_stack_depth`, the first [`MAX_SYMBOL_BYTES`] of a name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cuts {
    /// Samples dropped (the lightest) past `max_samples_per_profile`.
    pub samples: usize,
    /// Stacks deeper than `max_stack_depth`, whose outermost frames became one
    /// `[truncated]` frame.
    pub stacks: usize,
    /// Function, system and file names cut to [`MAX_SYMBOL_BYTES`].
    pub names: usize,
}

impl Cuts {
    pub fn add(&mut self, other: &Cuts) {
        self.samples += other.samples;
        self.stacks += other.stacks;
        self.names += other.names;
    }
}

/// The longest function or file name kept; a longer one keeps its first bytes and ends in
/// [`CUT_MARKER`]. Real names stay far below (C++ templates reach a few hundred bytes);
/// a 4 MB name is an attack on every flame graph that shows it.
pub const MAX_SYMBOL_BYTES: usize = 4096;
pub const CUT_MARKER: &str = "…[truncated]";

/// What the request says about a profile beyond its bytes.
#[derive(Debug, Clone, Default)]
pub struct ProfileContext {
    /// Series labels; `service_name` is filled with [`UNKNOWN_SERVICE`] when absent and
    /// `__name__`, when present, names the profile type instead of the sample types.
    pub labels: Labels,
    pub name: Option<String>,
    pub time_nanos: Option<i64>,
    pub duration_nanos: Option<i64>,
    pub id: Option<String>,
    /// Multiplier applied to every value (legacy CPU sample counts to nanoseconds).
    pub scale: Option<f64>,
    /// Keep every sample label with its sample instead of making string labels series
    /// labels: OTLP's sample attributes (thread ids, pids) are per sample by design.
    pub sample_labels_per_sample: bool,
    /// See [`ParsedProfile::warnings`].
    pub warnings: Vec<String>,
}

/// A new profile id: a UUIDv7 carrying the profile's time, so it sorts by time and a
/// lookup by id knows where to search.
pub fn new_profile_id(time_nanos: i64) -> String {
    let seconds = time_nanos.div_euclid(1_000_000_000) as u64;
    let nanos = time_nanos.rem_euclid(1_000_000_000) as u32;
    let timestamp = uuid::Timestamp::from_unix(uuid::NoContext, seconds, nanos);
    uuid::Uuid::new_v7(timestamp).to_string()
}

/// Decodes and converts one pprof payload (gzip or plain).
pub fn from_pprof_bytes(
    data: &[u8],
    context: ProfileContext,
    limits: &Limits,
) -> Result<ParsedProfile, IngestError> {
    let profile = pprof::decode(data, limits.max_decompressed_bytes)?;
    // `from_pprof` changes a profile only to fill in missing sample types, and to cut it
    // to the shape limits.
    let typed = !profile.sample_type.is_empty();
    let mut parsed = from_pprof(profile, context, data.len(), limits)?;
    if typed && parsed.cuts.samples == 0 && parsed.cuts.names == 0 {
        parsed.source = Some(data.to_vec());
    }
    Ok(parsed)
}

pub fn from_pprof(
    mut profile: Profile,
    mut context: ProfileContext,
    received_bytes: usize,
    limits: &Limits,
) -> Result<ParsedProfile, IngestError> {
    if profile.sample_type.is_empty() {
        // Some writers omit sample_type and rely on the period type (go tool pprof does too).
        match profile.period_type {
            Some(period_type) => profile.sample_type.push(period_type),
            None if profile.sample.is_empty() => {}
            None => {
                return Err(IngestError::BadRequest(
                    "profile has samples but no sample types".into(),
                ))
            }
        }
    }
    let cuts = cut_to_limits(&mut profile, limits);
    if cuts.samples > 0 {
        context.warnings.push(format!(
            "the profile had {} samples, over the limit of {} (limits.max_samples_per_profile): the {} lightest were dropped",
            profile.sample.len() + cuts.samples,
            limits.max_samples_per_profile,
            cuts.samples
        ));
    }
    if cuts.stacks > 0 {
        context.warnings.push(format!(
            "{} stacks deeper than {} frames (limits.max_stack_depth) keep their innermost frames under one [truncated] frame",
            cuts.stacks, limits.max_stack_depth
        ));
    }
    if cuts.names > 0 {
        context.warnings.push(format!(
            "{} function or file names longer than {MAX_SYMBOL_BYTES} bytes were cut, ending in {CUT_MARKER}",
            cuts.names
        ));
    }
    let index = pprof::validate(&profile, &limits.profile())?;

    if let Some(name) = context.labels.get(METRIC_NAME) {
        context.name.get_or_insert_with(|| name.to_string());
        context.labels.remove(METRIC_NAME);
    }
    if context.labels.get(SERVICE_NAME).is_none() {
        context.labels.set(SERVICE_NAME, UNKNOWN_SERVICE);
    }
    check_labels(
        &profile,
        &context.labels,
        context.sample_labels_per_sample,
        limits,
    )?;

    let type_names: Vec<String> = profile
        .sample_type
        .iter()
        .map(|value_type| profile.string_or_empty(value_type.r#type))
        .collect();
    let type_refs: Vec<&str> = type_names.iter().map(String::as_str).collect();
    let period = profile
        .period_type
        .unwrap_or(ValueType { r#type: 0, unit: 0 });
    let period_type = profile.string_or_empty(period.r#type);
    let period_unit = profile.string_or_empty(period.unit);
    let types = profile
        .sample_type
        .iter()
        .enumerate()
        .map(|(value_index, value_type)| {
            let sample_type = &type_names[value_index];
            let name = context
                .name
                .clone()
                .unwrap_or_else(|| name_for_sample_type(sample_type, &type_refs, &period_type));
            TypePlan {
                value_index,
                profile_type: ProfileType {
                    name,
                    sample_type: sample_type.clone(),
                    sample_unit: profile.string_or_empty(value_type.unit),
                    period_type: period_type.clone(),
                    period_unit: period_unit.clone(),
                },
                scale: context.scale,
            }
        })
        .collect();

    let now = kiln_model::time::now_nanos();
    let time_nanos = context
        .time_nanos
        .or((profile.time_nanos > 0).then_some(profile.time_nanos))
        .unwrap_or_else(kiln_model::time::arrival_nanos);
    if limits.retention_days > 0 {
        let retention_nanos = i64::from(limits.retention_days) * 86_400 * 1_000_000_000;
        if time_nanos < now.saturating_sub(retention_nanos) {
            return Err(IngestError::BadRequest(format!(
                "profile time {} is older than the retention period of {} days; it would be deleted at once",
                kiln_model::time::format_rfc3339(time_nanos),
                limits.retention_days
            )));
        }
    }
    if limits.max_future_skew_ms > 0 {
        let skew_nanos = i64::try_from(limits.max_future_skew_ms)
            .unwrap_or(i64::MAX)
            .saturating_mul(1_000_000);
        if time_nanos > now.saturating_add(skew_nanos) {
            return Err(IngestError::BadRequest(format!(
                "profile time {} is more than {} s ahead of the server's time {}; check the client's clock (or max_future_skew_ms)",
                kiln_model::time::format_rfc3339(time_nanos),
                limits.max_future_skew_ms / 1000,
                kiln_model::time::format_rfc3339(now)
            )));
        }
    }
    let duration_nanos = context
        .duration_nanos
        .unwrap_or(profile.duration_nanos)
        .max(0);
    let given = context.id.filter(|id| !id.is_empty());
    let id_given = given.is_some();
    let id = given.unwrap_or_else(|| new_profile_id(time_nanos));
    if id.len() > 256 {
        return Err(IngestError::BadRequest(
            "profile id is longer than 256 bytes".into(),
        ));
    }
    Ok(ParsedProfile {
        id,
        id_given,
        identity: None,
        time_nanos,
        duration_nanos,
        labels: context.labels,
        profile,
        index,
        types,
        received_bytes,
        sample_labels_per_sample: context.sample_labels_per_sample,
        warnings: context.warnings,
        cuts,
        source: None,
    })
}

/// Cuts a profile to the shape limits ([`Cuts`]): samples first, so names are cut only
/// in what is kept.
fn cut_to_limits(profile: &mut Profile, limits: &Limits) -> Cuts {
    let samples = profile.keep_heaviest_samples(limits.max_samples_per_profile);
    let stacks = profile
        .sample
        .iter()
        .filter(|sample| sample.location_id.len() > limits.max_stack_depth)
        .count();
    let mut names = 0;
    for position in 0..profile.function.len() {
        for field in 0..3 {
            let function = &profile.function[position];
            let index = [function.name, function.system_name, function.filename][field];
            let Some(text) = usize::try_from(index)
                .ok()
                .and_then(|index| profile.string_table.get(index))
            else {
                continue;
            };
            if text.len() <= MAX_SYMBOL_BYTES {
                continue;
            }
            let mut end = MAX_SYMBOL_BYTES - CUT_MARKER.len();
            while end > 0 && (text[end] & 0xC0) == 0x80 {
                end -= 1;
            }
            let mut cut = text[..end].to_vec();
            cut.extend_from_slice(CUT_MARKER.as_bytes());
            // A new string: the long one may also be a label's, which keeps its own.
            let new_index = profile.string_table.len() as i64;
            profile.string_table.push(&cut);
            let function = &mut profile.function[position];
            *[
                &mut function.name,
                &mut function.system_name,
                &mut function.filename,
            ][field] = new_index;
            names += 1;
        }
    }
    Cuts {
        samples,
        stacks,
        names,
    }
}

/// Checks the limits on the labels each series will carry: the request's labels plus the
/// string sample labels that become series labels (or, kept per sample, their lengths).
fn check_labels(
    profile: &Profile,
    labels: &Labels,
    sample_labels_per_sample: bool,
    limits: &Limits,
) -> Result<(), IngestError> {
    let label_limits = limits.labels();
    labels::validate(labels, &label_limits)?;
    let mut extra_names: Vec<i64> = Vec::new();
    let string = |index: i64| profile.string_table.get(index as usize).unwrap_or_default();
    for sample in profile.sample.iter() {
        for label in sample.label {
            if label.str == 0 {
                continue;
            }
            // Every value is checked; a name once (names repeat on every sample).
            let too_long = |name: &[u8]| {
                name.len() > label_limits.max_name_length
                    || string(label.str).len() > label_limits.max_value_length
            };
            if extra_names.contains(&label.key) {
                if string(label.str).len() > label_limits.max_value_length {
                    return Err(label_too_long(string(label.key)));
                }
                continue;
            }
            let name = string(label.key);
            if PER_SAMPLE_LABELS
                .iter()
                .any(|known| known.as_bytes() == name)
            {
                continue;
            }
            if too_long(name) {
                return Err(label_too_long(name));
            }
            if !sample_labels_per_sample {
                extra_names.push(label.key);
            }
        }
    }
    let total = labels.len() + extra_names.len();
    if total > label_limits.max_labels {
        return Err(IngestError::BadRequest(format!(
            "series would have {total} labels (request and sample labels), over the limit of {}",
            label_limits.max_labels
        )));
    }
    Ok(())
}

fn label_too_long(name: &[u8]) -> IngestError {
    IngestError::BadRequest(format!(
        "sample label {:?} is over the label length limits",
        String::from_utf8_lossy(name)
            .chars()
            .take(64)
            .collect::<String>()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_ids_carry_time() {
        let id = new_profile_id(1_700_000_000_123_000_000);
        let parsed = uuid::Uuid::parse_str(&id).unwrap();
        let (seconds, _) = parsed.get_timestamp().unwrap().to_unix();
        assert_eq!(seconds, 1_700_000_000);
    }

    /// The decoded heap `kiln bench stages` reports is what a profile holds: every id,
    /// value and sample end of the decoded columns, the symbol tables and the strings,
    /// which together far exceed the protobuf encoding.
    #[test]
    fn decoded_bytes_count_the_heap_not_the_encoding() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata");
        let bytes = std::fs::read(dir.join("profefe-collector_heap_1.prof")).expect("fixture");
        let raw = kiln_model::compress::maybe_gunzip(&bytes, 1 << 30).expect("gunzip");
        let profile = pprof::decode(&raw, 1 << 30).expect("decodes");
        let (samples, frames) = (
            profile.sample.len(),
            profile
                .sample
                .iter()
                .map(|s| s.location_id.len())
                .sum::<usize>(),
        );
        let values = samples * profile.sample_type.len();
        let string_bytes: usize = profile.string_table.iter().map(<[u8]>::len).sum();
        let context = ProfileContext {
            time_nanos: Some(kiln_model::time::now_nanos()),
            ..Default::default()
        };
        let parsed = from_pprof(profile, context, bytes.len(), &Limits::default()).expect("valid");
        let floor = 8 * (frames + values) + string_bytes;
        assert!(
            parsed.decoded_bytes() >= floor,
            "{} bytes counted, under the {floor} its ids, values and strings alone hold",
            parsed.decoded_bytes()
        );
        assert!(
            parsed.decoded_bytes() > 2 * raw.len(),
            "{} bytes counted for {} bytes of pprof",
            parsed.decoded_bytes(),
            raw.len()
        );
    }
}

//! The rules of a query request, whichever API it arrives by: querier.v1 (Connect and
//! gRPC), Pyroscope's legacy HTTP API, profefe's, and the CLI.
//!
//! An API only names its parameters; what a time, a selector, a profile type or a step
//! means, and which combinations are refused, is decided here once, so one query text
//! means the same on every API. Functions take `now` rather than reading the clock, so
//! relative times (`now-1h`) are testable.

use kiln_model::labels::SERVICE_NAME;
use kiln_model::profile_type::{default_legacy_type, split_legacy_name};
use kiln_model::selector::{self, Matcher, Selector};
use kiln_model::time::parse_time_nanos;

use crate::api;
use crate::labels::SeriesQuery;
use crate::select::{SelectRequest, TypeFilter, TYPE_LABELS};
use crate::QueryError;

/// A time as users write it (`now-1h`, RFC 3339, epoch seconds to nanoseconds); errors
/// name the parameter as the client spelled it.
pub fn parse_time(name: &str, value: &str, now: i64) -> Result<i64, QueryError> {
    parse_time_nanos(value, now).map_err(|err| QueryError::BadRequest(format!("{name}: {err}")))
}

/// [`parse_time`] of `value`, or of `default` when the parameter is absent.
pub fn time_or(
    name: &str,
    value: Option<&str>,
    default: &str,
    now: i64,
) -> Result<i64, QueryError> {
    parse_time(name, value.unwrap_or(default), now)
}

/// `(from, to)` when `to` is not before `from`; otherwise "`to_name` is before `from_name`".
pub fn ordered(
    from: i64,
    to: i64,
    from_name: &str,
    to_name: &str,
) -> Result<(i64, i64), QueryError> {
    if to < from {
        return Err(QueryError::BadRequest(format!(
            "{to_name} is before {from_name}"
        )));
    }
    Ok((from, to))
}

/// A time as Kiln's JSON APIs take it: epoch milliseconds, or text the query APIs accept
/// (`now-1h`, RFC 3339).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum Time {
    Millis(i64),
    Text(String),
}

impl Time {
    /// Epoch milliseconds; errors name the parameter `name`.
    pub fn millis(&self, name: &str, now_nanos: i64) -> Result<i64, QueryError> {
        match self {
            Time::Millis(ms) => Ok(*ms),
            Time::Text(text) => Ok(parse_time(name, text, now_nanos)?.div_euclid(1_000_000)),
        }
    }
}

/// A selection's range cut into `count` buckets of whole milliseconds, the first
/// starting where the range does: a heatmap's columns, an overview's sparkline points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buckets {
    pub from_ms: i64,
    pub step_ms: i64,
    pub count: usize,
}

impl Buckets {
    /// `count` (at least 1) buckets covering `[from_nanos, to_nanos]`.
    pub fn over(from_nanos: i64, to_nanos: i64, count: usize) -> Self {
        let count = count.max(1);
        let from_ms = from_nanos.div_euclid(1_000_000);
        let span_ms = to_nanos.div_euclid(1_000_000) - from_ms + 1;
        Buckets {
            from_ms,
            step_ms: ((span_ms + count as i64 - 1) / count as i64).max(1),
            count,
        }
    }

    /// The bucket of a time; times outside the range go to the nearest end.
    pub fn index(&self, time_nanos: i64) -> usize {
        let origin = self.from_ms.saturating_mul(1_000_000);
        let step = self.step_ms.saturating_mul(1_000_000);
        (time_nanos.saturating_sub(origin) / step).clamp(0, self.count as i64 - 1) as usize
    }
}

/// What Kiln's JSON APIs select (a profile type, a selector, `[from, until]`) for
/// `tenant`, under the same rules as querier.v1's selections; an empty type selects every
/// type.
pub fn json_selection(
    tenant: &str,
    profile_type_id: &str,
    selector: &str,
    from: &Time,
    until: &Time,
    now: i64,
) -> Result<SelectRequest, QueryError> {
    let from_ms = from.millis("from", now)?;
    let until_ms = until.millis("until", now)?;
    if until_ms < from_ms {
        return Err(QueryError::BadRequest(format!(
            "until ({until_ms}) is before from ({from_ms})"
        )));
    }
    Ok(SelectRequest {
        tenant: tenant.to_string(),
        types: if profile_type_id.is_empty() {
            TypeFilter::Any
        } else {
            profile_type(profile_type_id)?
        },
        selector: label_selector(selector)?,
        from_nanos: from_ms.saturating_mul(1_000_000),
        to_nanos: until_ms.saturating_mul(1_000_000),
        ..SelectRequest::default()
    })
}

/// querier.v1's `[start, end]` in milliseconds, as nanoseconds. A start of 0 is the epoch,
/// as everywhere else in Kiln (`/pyroscope/render?from=0`, `kiln query --from 0`); an end
/// of 0 is an absent end (proto3 cannot tell them apart), and means now.
pub fn time_range_ms(start_ms: i64, end_ms: i64, now: i64) -> Result<(i64, i64), QueryError> {
    let to_nanos = if end_ms == 0 {
        now
    } else {
        end_ms.saturating_mul(1_000_000)
    };
    let from_nanos = start_ms.saturating_mul(1_000_000);
    if to_nanos < from_nanos {
        return Err(QueryError::BadRequest(format!(
            "end ({end_ms}) is before start ({start_ms})"
        )));
    }
    Ok((from_nanos, to_nanos))
}

/// A label selector such as `{service_name="api"}`; empty selects everything. The profile
/// type has its own field, so a name before the braces is refused.
pub fn label_selector(text: &str) -> Result<Selector, QueryError> {
    if text.trim().is_empty() {
        return Ok(Selector::default());
    }
    let parsed = selector::parse(text)
        .map_err(|err| QueryError::BadRequest(format!("invalid label selector: {err}")))?;
    if let Some(name) = &parsed.name {
        return Err(QueryError::BadRequest(format!(
            "invalid label selector: unexpected name {name:?} before the braces; the profile type goes in profile_typeID"
        )));
    }
    Ok(parsed)
}

/// Pyroscope's `matchers` strings; an empty list selects everything.
pub fn matchers(matchers: &[String]) -> Result<Vec<Selector>, QueryError> {
    matchers
        .iter()
        .filter(|text| !text.trim().is_empty())
        .map(|text| {
            selector::parse(text)
                .map_err(|err| QueryError::BadRequest(format!("invalid matcher {text:?}: {err}")))
        })
        .collect()
}

/// A full profile type id, `name:sample_type:sample_unit:period_type:period_unit`.
pub fn profile_type(profile_type_id: &str) -> Result<TypeFilter, QueryError> {
    if profile_type_id.split(':').count() != 5 {
        return Err(QueryError::BadRequest(format!(
            "invalid profile_typeID {profile_type_id:?}: expected name:sample_type:sample_unit:period_type:period_unit"
        )));
    }
    Ok(TypeFilter::Exact(profile_type_id.to_string()))
}

/// A series step in seconds, as milliseconds (at least 1).
pub fn step_ms(step_seconds: f64) -> Result<i64, QueryError> {
    if !(step_seconds.is_finite() && step_seconds > 0.0) {
        return Err(QueryError::BadRequest(format!(
            "step must be a positive number of seconds, got {step_seconds}"
        )));
    }
    Ok(((step_seconds * 1000.0).round() as i64).max(1))
}

/// A render query, `TYPE_ID{matchers}` or the legacy `app.cpu{matchers}` form (the app
/// becomes a `service_name` matcher), as a profile type id and a selector.
pub fn render_query(query: &str) -> Result<(String, Selector), QueryError> {
    let mut parsed = selector::parse(query)
        .map_err(|err| QueryError::BadRequest(format!("invalid query: {err}")))?;
    let name = parsed.name.take().ok_or_else(|| {
        QueryError::BadRequest("invalid query: a profile type is required before the braces".into())
    })?;
    if name.split(':').count() == 5 {
        return Ok((name, parsed));
    }
    let (app, kind) = split_legacy_name(&name);
    let type_id = kind.unwrap_or_else(default_legacy_type).profile_type.id();
    parsed.matchers.insert(0, Matcher::equal(SERVICE_NAME, app));
    Ok((type_id, parsed))
}

/// The selectors of a legacy label query's optional `query`: a bare `{…}`, or `TYPE{…}`,
/// whose type becomes a `__profile_type__` matcher.
pub fn legacy_series_selectors(query: Option<&str>) -> Result<Vec<Selector>, QueryError> {
    match query.filter(|query| !query.trim().is_empty()) {
        Some(query) if query.trim_start().starts_with('{') => matchers(&[query.to_string()]),
        Some(query) => {
            let (type_id, mut selector) = render_query(query)?;
            selector
                .matchers
                .push(Matcher::equal(TYPE_LABELS[0], &type_id));
            Ok(vec![selector])
        }
        None => Ok(Vec::new()),
    }
}

/// The selection of a request that also takes a call site and profile ids: two messages
/// of the same fields and no common trait.
macro_rules! selection_with_ids {
    ($request:expr) => {
        Selection {
            call_site: $request.stack_trace_selector.as_ref(),
            profile_ids: &$request.profile_id_selector,
            ..Selection::new(
                &$request.profile_type_id,
                &$request.label_selector,
                $request.start,
                $request.end,
            )
        }
    };
}

/// What a querier.v1 selection names, before its rules are applied.
pub struct Selection<'a> {
    pub profile_type_id: &'a str,
    pub label_selector: &'a str,
    pub start_ms: i64,
    pub end_ms: i64,
    pub call_site: Option<&'a api::StackTraceSelector>,
    pub profile_ids: &'a [String],
}

impl<'a> Selection<'a> {
    pub fn new(
        profile_type_id: &'a str,
        label_selector: &'a str,
        start_ms: i64,
        end_ms: i64,
    ) -> Self {
        Selection {
            profile_type_id,
            label_selector,
            start_ms,
            end_ms,
            call_site: None,
            profile_ids: &[],
        }
    }

    /// The selection of `SelectMergeStacktraces` (and of each side of a `Diff`).
    pub fn of_stacktraces(request: &'a api::SelectMergeStacktracesRequest) -> Self {
        selection_with_ids!(request)
    }

    pub fn of_profile(request: &'a api::SelectMergeProfileRequest) -> Self {
        selection_with_ids!(request)
    }

    pub fn of_series(request: &'a api::SelectSeriesRequest) -> Self {
        Selection {
            call_site: request.stack_trace_selector.as_ref(),
            ..Selection::new(
                &request.profile_type_id,
                &request.label_selector,
                request.start,
                request.end,
            )
        }
    }

    pub fn of_span_profile(request: &'a api::SelectMergeSpanProfileRequest) -> Self {
        Selection::new(
            &request.profile_type_id,
            &request.label_selector,
            request.start,
            request.end,
        )
    }

    /// The [`SelectRequest`] of this selection for `tenant`, or why it is refused.
    pub fn request(&self, tenant: &str, now: i64) -> Result<SelectRequest, QueryError> {
        let (from_nanos, to_nanos) = time_range_ms(self.start_ms, self.end_ms, now)?;
        Ok(SelectRequest {
            tenant: tenant.to_string(),
            types: profile_type(self.profile_type_id)?,
            selector: label_selector(self.label_selector)?,
            from_nanos,
            to_nanos,
            profile_ids: (!self.profile_ids.is_empty()).then(|| {
                self.profile_ids
                    .iter()
                    .map(|id| id.as_bytes().to_vec())
                    .collect()
            }),
            call_site: self
                .call_site
                .map(|selector| {
                    selector
                        .call_site
                        .iter()
                        .map(|location| location.name.clone())
                        .collect()
                })
                .unwrap_or_default(),
            span_ids: None,
            per_sample: false,
            values_only: false,
            value_range: None,
            datasets: None,
        })
    }
}

/// The series query of querier.v1's metadata calls (`LabelNames`, `LabelValues`,
/// `Series`).
pub fn series_query(
    tenant: &str,
    selectors: &[String],
    start_ms: i64,
    end_ms: i64,
    now: i64,
) -> Result<SeriesQuery, QueryError> {
    let (from_nanos, to_nanos) = time_range_ms(start_ms, end_ms, now)?;
    Ok(SeriesQuery {
        tenant: tenant.to_string(),
        selectors: matchers(selectors)?,
        from_nanos,
        to_nanos,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000_000_000;

    #[test]
    fn an_end_of_zero_means_now_and_order_is_checked() {
        assert_eq!(time_range_ms(0, 0, NOW).unwrap(), (0, NOW));
        assert_eq!(
            time_range_ms(1_000, 2_000, NOW).unwrap(),
            (1_000_000_000, 2_000_000_000)
        );
        let err = time_range_ms(2_000, 1_000, NOW).unwrap_err();
        assert_eq!(err.to_string(), "end (1000) is before start (2000)");
        assert!(ordered(2, 1, "from", "until").is_err());
        assert_eq!(
            time_or("from", None, "now-1h", NOW).unwrap(),
            NOW - 3_600_000_000_000
        );
        let err = parse_time("leftFrom", "soon", NOW).unwrap_err();
        assert!(err.to_string().starts_with("leftFrom: "), "{err}");
    }

    #[test]
    fn legacy_and_full_type_queries_agree() {
        let (type_id, selector) = render_query(r#"myapp.cpu{env="prod"}"#).unwrap();
        assert_eq!(type_id, "process_cpu:cpu:nanoseconds:cpu:nanoseconds");
        assert_eq!(selector.equality(SERVICE_NAME), Some("myapp"));
        assert_eq!(selector.equality("env"), Some("prod"));
        assert_eq!(
            selector.to_string(),
            r#"{service_name="myapp", env="prod"}"#
        );
        let full = "memory:alloc_space:bytes:space:bytes";
        assert_eq!(render_query(&format!("{full}{{}}")).unwrap().0, full);
        assert!(render_query("{a=\"b\"}").is_err());
    }

    #[test]
    fn selectors_types_and_steps_are_checked() {
        assert!(label_selector("").unwrap().matchers.is_empty());
        assert!(label_selector("cpu{a=\"b\"}").is_err());
        assert!(profile_type("cpu").is_err());
        assert_eq!(step_ms(0.0004).unwrap(), 1);
        assert_eq!(step_ms(15.0).unwrap(), 15_000);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(step_ms(bad).is_err(), "{bad}");
        }
        let selectors = legacy_series_selectors(Some("myapp.cpu{}")).unwrap();
        assert_eq!(
            selectors[0].equality(TYPE_LABELS[0]),
            Some("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
        );
        assert!(legacy_series_selectors(Some("  ")).unwrap().is_empty());
    }
}

//! The service overview: every service of a tenant in one query, each with a sparkline of
//! its main profile type over the range, its hottest functions, and its change against
//! the previous period of equal length, largest change first.
//!
//! One pass over the range's datasets serves every service, because a level-0 segment
//! holds one dataset per service: a query per service would read each segment once per
//! service. The previous period is a second pass that reads only profile totals, from
//! stack sums where a dataset lies wholly inside it. A function's self value is summed
//! per location while a dataset is in hand and named once per location, not per stack.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::request::{json_selection, Buckets, Time};
use crate::select::{DatasetSelection, Querier, SelectRequest, TypeFilter};
use crate::symbols::FrameNames;
use crate::QueryError;

pub const DEFAULT_POINTS: usize = 30;
pub const MAX_POINTS: usize = 500;
/// Hottest functions listed per service.
pub const TOP_FUNCTIONS: usize = 3;

/// `GET /api/v1/overview`'s parameters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OverviewRequest {
    /// Default `now-1h`.
    pub from: Option<String>,
    /// Default `now`.
    pub until: Option<String>,
    /// One type for every service; by default each service's main type.
    pub profile_type: Option<String>,
    /// Which services (and series); by default every one.
    pub selector: Option<String>,
    /// Sparkline points per service.
    pub points: Option<usize>,
}

impl OverviewRequest {
    pub fn select(&self, tenant: &str, now: i64) -> Result<SelectRequest, QueryError> {
        json_selection(
            tenant,
            self.profile_type.as_deref().unwrap_or(""),
            self.selector.as_deref().unwrap_or(""),
            &Time::Text(self.from.clone().unwrap_or_else(|| "now-1h".to_string())),
            &Time::Text(self.until.clone().unwrap_or_else(|| "now".to_string())),
            now,
        )
    }

    pub fn points(&self) -> usize {
        self.points.unwrap_or(DEFAULT_POINTS)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Overview {
    /// Start of the range and of the sparklines' first point, in epoch milliseconds.
    pub from_ms: i64,
    pub until_ms: i64,
    /// Width of each sparkline point, in milliseconds.
    pub step_ms: i64,
    /// The previous period compared against: the same length, just before `from_ms`.
    pub previous_from_ms: i64,
    pub services: Vec<ServiceOverview>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ServiceOverview {
    pub service: String,
    /// The type shown: CPU where the service has it, else its type with most profiles.
    pub profile_type: String,
    pub profiles: u64,
    /// The sum of the type's profile values in each step of the range.
    pub points: Vec<i64>,
    pub total: i64,
    /// The same sum over the previous period.
    pub previous: i64,
    /// `(total - previous) / previous`; absent when the previous period had nothing (a
    /// new service), which sorts first.
    pub change: Option<f64>,
    pub top: Vec<FunctionSelf>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FunctionSelf {
    pub name: String,
    pub self_value: i64,
}

/// What one (service, type) has gathered so far.
#[derive(Default)]
struct Gathered {
    points: Vec<i64>,
    total: i64,
    profiles: u64,
    functions: HashMap<String, i64>,
}

/// The overview of every service `request` selects (its types, selector and range), with
/// `points` sparkline points each.
pub async fn overview(
    querier: &Querier,
    request: &SelectRequest,
    points: usize,
) -> Result<Overview, QueryError> {
    if points == 0 || points > MAX_POINTS {
        return Err(QueryError::BadRequest(format!(
            "points must be between 1 and {MAX_POINTS}, not {points}"
        )));
    }
    let buckets = Buckets::over(request.from_nanos, request.to_nanos, points);
    let until_ms = request.to_nanos.div_euclid(1_000_000);
    let span_ms = until_ms - buckets.from_ms + 1;
    let previous_request = SelectRequest {
        from_nanos: request
            .from_nanos
            .saturating_sub(span_ms.saturating_mul(1_000_000)),
        to_nanos: request.from_nanos.saturating_sub(1),
        ..request.clone()
    };
    let mut current: HashMap<(String, String), Gathered> = HashMap::new();
    let mut previous: HashMap<(String, String), i64> = HashMap::new();
    futures_util::future::try_join(
        querier.select_each(request, |selection| {
            gather(&selection, &mut current, &buckets)
        }),
        querier.select_each(&previous_request, |selection| {
            for profile in &selection.profiles {
                let type_id = &selection.types[profile.local_type].0;
                let key = (selection.dataset.service.clone(), type_id.clone());
                let sum = previous.entry(key).or_default();
                *sum = sum.saturating_add(profile.total);
            }
        }),
    )
    .await?;
    let mut by_service: HashMap<String, Vec<(String, Gathered)>> = HashMap::new();
    for ((service, type_id), gathered) in current {
        by_service
            .entry(service)
            .or_default()
            .push((type_id, gathered));
    }
    let pinned = matches!(request.types, TypeFilter::Exact(_));
    let mut services: Vec<ServiceOverview> = by_service
        .into_iter()
        .filter_map(|(service, types)| {
            let (type_id, gathered) = main_type(types, pinned)?;
            let before = previous
                .get(&(service.clone(), type_id.clone()))
                .copied()
                .unwrap_or(0);
            let mut top: Vec<FunctionSelf> = gathered
                .functions
                .into_iter()
                .filter(|(_, value)| *value > 0)
                .map(|(name, self_value)| FunctionSelf { name, self_value })
                .collect();
            top.sort_by(|a, b| b.self_value.cmp(&a.self_value).then(a.name.cmp(&b.name)));
            top.truncate(TOP_FUNCTIONS);
            Some(ServiceOverview {
                service,
                profile_type: type_id,
                profiles: gathered.profiles,
                points: gathered.points,
                total: gathered.total,
                previous: before,
                change: (before > 0).then(|| (gathered.total - before) as f64 / before as f64),
                top,
            })
        })
        .collect();
    services.sort_by(|a, b| {
        let rank = |s: &ServiceOverview| s.change.map_or(f64::INFINITY, f64::abs);
        rank(b)
            .total_cmp(&rank(a))
            .then_with(|| a.service.cmp(&b.service))
    });
    Ok(Overview {
        from_ms: buckets.from_ms,
        until_ms,
        step_ms: buckets.step_ms,
        previous_from_ms: buckets.from_ms - span_ms,
        services,
    })
}

/// Folds one dataset's selection into the per-(service, type) sums.
fn gather(
    selection: &DatasetSelection,
    gathered: &mut HashMap<(String, String), Gathered>,
    buckets: &Buckets,
) {
    let dataset = &selection.dataset;
    let names = FrameNames::new(dataset);
    for (local_type, (type_id, _)) in selection.types.iter().enumerate() {
        let entry = gathered
            .entry((dataset.service.clone(), type_id.clone()))
            .or_insert_with(|| Gathered {
                points: vec![0; buckets.count],
                ..Default::default()
            });
        for profile in selection
            .profiles
            .iter()
            .filter(|p| p.local_type == local_type)
        {
            let slot = &mut entry.points[buckets.index(profile.time_nanos)];
            *slot = slot.saturating_add(profile.total);
            entry.total = entry.total.saturating_add(profile.total);
            entry.profiles += 1;
        }
        // Self values per location first: a location is under many stacks, and naming
        // it costs more than adding to it.
        let mut by_location: HashMap<u32, i64> = HashMap::new();
        for (stack, value) in selection.values[local_type].iter().enumerate() {
            if *value != 0 {
                if let Some(location) = dataset.stack_location.get(stack) {
                    let slot = by_location.entry(*location).or_default();
                    *slot = slot.saturating_add(*value);
                }
            }
        }
        for (location, value) in by_location {
            let slot = entry.functions.entry(names.leaf(location)).or_default();
            *slot = slot.saturating_add(value);
        }
    }
}

/// The type a service is shown by: the only one when the request pinned it, else CPU
/// when there is one, else the type with the most profiles.
fn main_type(mut types: Vec<(String, Gathered)>, pinned: bool) -> Option<(String, Gathered)> {
    types.retain(|(_, gathered)| gathered.profiles > 0);
    if pinned {
        return types.pop();
    }
    let rank = |type_id: &str, gathered: &Gathered| {
        let mut parts = type_id.split(':');
        let name = parts.next().unwrap_or("");
        let sample_type = parts.next().unwrap_or("");
        let cpu = if type_id.starts_with("process_cpu:cpu:") {
            2
        } else if sample_type == "cpu" || name.contains("cpu") {
            1
        } else {
            0
        };
        (
            cpu,
            gathered.profiles,
            std::cmp::Reverse(type_id.to_string()),
        )
    };
    types
        .into_iter()
        .max_by_key(|(id, gathered)| rank(id, gathered))
}

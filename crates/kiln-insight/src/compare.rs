//! `POST /api/v1/compare`: two selections, every function's change between them, ranked
//! with the confidence [`crate::stats`] gives it.
//!
//! Each side is read like any query (datasets by time and service, series by matchers),
//! but summed per profile instead of per stack: each matched profile's self value per
//! function, turned into shares of that profile's total and added to the side's sums.
//! Nothing per profile outlives its pass, so a day of profiles a side costs one pass over
//! its samples and memory in the number of functions.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use kiln_model::selector::Selector;
use kiln_query::request::{label_selector, profile_type};
use kiln_query::select::{matching_series, SelectRequest};
use kiln_query::symbols::FrameNames;
use kiln_query::Querier;
use kiln_storage::Dataset;
use serde::{Deserialize, Serialize};

use crate::stats::{rank, FunctionChange, FunctionSums, Method, SideSums};
use crate::InsightError;

pub use kiln_query::request::Time;

/// One side: a selector and a time range `[from, until)`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SideRequest {
    #[serde(default)]
    pub selector: String,
    pub from: Time,
    pub until: Time,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CompareRequest {
    pub profile_type: String,
    pub left: SideRequest,
    pub right: SideRequest,
    /// Functions returned, most important first; 0 returns all.
    #[serde(default = "default_limit")]
    pub limit: usize,
    /// Family-wise error rate [default 0.01].
    #[serde(default)]
    pub alpha: Option<f64>,
    /// Profiles a side needs before anything is tested [default 10].
    #[serde(default)]
    pub min_profiles: Option<u64>,
}

fn default_limit() -> usize {
    20
}

/// Whole-profile figures of one side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideSummary {
    pub selector: String,
    pub from: i64,
    pub until: i64,
    pub profiles: u64,
    pub total: i64,
    /// Total per second of the range.
    pub rate: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MethodSummary {
    pub test: &'static str,
    pub correction: &'static str,
    pub alpha: f64,
    pub min_profiles: u64,
    /// Functions tested: the m of the correction.
    pub tested: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub profile_type: String,
    pub left: SideSummary,
    pub right: SideSummary,
    pub method: MethodSummary,
    /// Why nothing was tested, when so (too few profiles on a side).
    pub refused: Option<String>,
    /// Functions called significant, of all tested (not only those returned).
    pub significant: usize,
    pub functions: Vec<FunctionChange>,
}

/// A side resolved: what to read.
#[derive(Debug, Clone)]
pub struct Side {
    pub selector_text: String,
    pub selector: Selector,
    pub from_ms: i64,
    pub until_ms: i64,
}

impl CompareRequest {
    /// Checks the request and resolves its times against `now_nanos`.
    pub fn resolve(&self, now_nanos: i64) -> Result<(Side, Side, Method), InsightError> {
        profile_type(&self.profile_type)?;
        let side = |name: &str, side: &SideRequest| -> Result<Side, InsightError> {
            let from_ms = side.from.millis(&format!("{name}.from"), now_nanos)?;
            let until_ms = side.until.millis(&format!("{name}.until"), now_nanos)?;
            if until_ms <= from_ms {
                return Err(InsightError::BadRequest(format!(
                    "{name}: until ({until_ms}) must be after from ({from_ms})"
                )));
            }
            let selector = label_selector(&side.selector)
                .map_err(|err| InsightError::BadRequest(format!("{name}.selector: {err}")))?;
            Ok(Side {
                selector_text: side.selector.clone(),
                selector,
                from_ms,
                until_ms,
            })
        };
        let mut method = Method::default();
        if let Some(alpha) = self.alpha {
            if !(alpha > 0.0 && alpha <= 0.5) {
                return Err(InsightError::BadRequest(format!(
                    "alpha must be in (0, 0.5], not {alpha}"
                )));
            }
            method.alpha = alpha;
        }
        if let Some(min) = self.min_profiles {
            if min < 2 {
                return Err(InsightError::BadRequest(
                    "min_profiles must be at least 2: a variance needs two profiles".into(),
                ));
            }
            method.min_profiles = min;
        }
        Ok((
            side("left", &self.left)?,
            side("right", &self.right)?,
            method,
        ))
    }
}

/// Runs a comparison for `tenant`.
pub async fn compare(
    querier: &Querier,
    tenant: &str,
    request: &CompareRequest,
    now_nanos: i64,
) -> Result<Comparison, InsightError> {
    let (left, right, method) = request.resolve(now_nanos)?;
    let (left_sums, right_sums) = futures_util::future::try_join(
        side_sums(querier, tenant, &request.profile_type, &left),
        side_sums(querier, tenant, &request.profile_type, &right),
    )
    .await?;
    Ok(comparison(
        &request.profile_type,
        (&left, &left_sums),
        (&right, &right_sums),
        &method,
        request.limit,
    ))
}

/// The answer, from both sides' sums.
pub fn comparison(
    profile_type: &str,
    left: (&Side, &SideSums),
    right: (&Side, &SideSums),
    method: &Method,
    limit: usize,
) -> Comparison {
    let ranking = rank(left.1, right.1, method);
    let summary = |(side, sums): (&Side, &SideSums)| SideSummary {
        selector: side.selector_text.clone(),
        from: side.from_ms,
        until: side.until_ms,
        profiles: sums.profiles,
        total: sums.total,
        rate: sums.total as f64 * 1000.0 / (side.until_ms - side.from_ms).max(1) as f64,
    };
    let significant = ranking.functions.iter().filter(|f| f.significant).count();
    let mut functions = ranking.functions;
    if limit > 0 {
        functions.truncate(limit);
    }
    Comparison {
        profile_type: profile_type.to_string(),
        left: summary(left),
        right: summary(right),
        method: MethodSummary {
            test: "welch-t on per-profile shares",
            correction: "holm",
            alpha: method.alpha,
            min_profiles: method.min_profiles,
            tested: ranking.tested,
        },
        refused: ranking.refused,
        significant,
        functions,
    }
}

/// Sums one side over every dataset it touches, in parallel.
pub async fn side_sums(
    querier: &Querier,
    tenant: &str,
    type_id: &str,
    side: &Side,
) -> Result<SideSums, InsightError> {
    let request = Arc::new(SelectRequest {
        tenant: tenant.to_string(),
        types: profile_type(type_id)?,
        selector: side.selector.clone(),
        from_nanos: side.from_ms.saturating_mul(1_000_000),
        // SelectRequest's end is inclusive; the side's is not.
        to_nanos: side.until_ms.saturating_mul(1_000_000).saturating_sub(1),
        ..Default::default()
    });
    let metas = querier.datasets_within_budget(&request).await?;
    let tasks = metas.into_iter().map(|meta| {
        let request = request.clone();
        async move {
            let dataset = querier.load(&meta).await?;
            Ok::<_, InsightError>(
                tokio::task::spawn_blocking(move || dataset_sums(&dataset, &request)).await?,
            )
        }
    });
    let in_flight = 2 * kiln_runtime::priority::cores();
    // In order, so that floating-point sums, and so p-values, are the same on every run.
    let mut results = futures_util::stream::iter(tasks).buffered(in_flight);
    let mut side = SideSums::default();
    while let Some(result) = results.next().await {
        side.merge(result?);
    }
    Ok(side)
}

/// One dataset's contribution to a side: per matched profile, the self value of each
/// leaf function (the innermost frame of the sample's leaf location).
pub fn dataset_sums(dataset: &Dataset, request: &SelectRequest) -> SideSums {
    let matched = matching_series(dataset, request);
    let mut side = SideSums::default();
    if !matched.iter().any(|m| *m) {
        return side;
    }
    let names = FrameNames::new(dataset);
    // Location → local id of its leaf function, resolved the first time a sample needs it.
    const UNRESOLVED: u32 = u32::MAX;
    let mut location_function = vec![UNRESOLVED; dataset.location_address.len()];
    let mut function_names: Vec<String> = Vec::new();
    let mut function_ids: HashMap<String, u32> = HashMap::new();
    let mut sums: Vec<FunctionSums> = Vec::new();
    let mut scratch: Vec<i64> = Vec::new();
    let mut touched: Vec<u32> = Vec::new();
    let offsets = dataset.profile_sample_offsets();
    for (row, profile) in dataset.profiles.iter().enumerate() {
        if !matched
            .get(profile.series as usize)
            .copied()
            .unwrap_or(false)
            || profile.time_nanos < request.from_nanos
            || profile.time_nanos > request.to_nanos
        {
            continue;
        }
        let mut total = 0i64;
        for sample in offsets[row] as usize..offsets[row + 1] as usize {
            let value = dataset.sample_value[sample];
            if value == 0 {
                continue;
            }
            let stack = dataset.sample_stack[sample] as usize;
            let location = dataset.stack_location.get(stack).copied().unwrap_or(0);
            let function = match location_function.get(location as usize).copied() {
                Some(id) if id != UNRESOLVED => id,
                _ => {
                    // The leaf is the innermost frame: the last one emitted.
                    let mut leaf = String::new();
                    names.for_each_frame(location, |frame| {
                        leaf.clear();
                        leaf.push_str(frame);
                    });
                    let next = function_names.len() as u32;
                    let id = *function_ids.entry(leaf.clone()).or_insert(next);
                    if id == next {
                        function_names.push(leaf);
                        sums.push(FunctionSums::default());
                        scratch.push(0);
                    }
                    if let Some(slot) = location_function.get_mut(location as usize) {
                        *slot = id;
                    }
                    id
                }
            };
            let slot = &mut scratch[function as usize];
            if *slot == 0 {
                touched.push(function);
            }
            *slot = slot.saturating_add(value);
            total = total.saturating_add(value);
        }
        if total > 0 {
            side.profiles += 1;
            side.total = side.total.saturating_add(total);
            for function in &touched {
                let value = std::mem::take(&mut scratch[*function as usize]);
                if value != 0 {
                    sums[*function as usize].add_profile(value, total);
                }
            }
        } else {
            for function in &touched {
                scratch[*function as usize] = 0;
            }
        }
        touched.clear();
    }
    side.functions = function_names
        .into_iter()
        .zip(sums)
        .filter(|(_, sums)| sums.value != 0 || sums.share != 0.0)
        .collect();
    side
}

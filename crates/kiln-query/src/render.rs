//! The query behind Pyroscope's render API (`/pyroscope/render` and `render-diff`): one
//! legacy selection, `TYPE{matchers}` from `from` to `until`, folded in one pass over its
//! datasets into a flame tree, its total's timeline and, with a `groupBy` label, one
//! timeline per value of that label. Each dataset is folded into all of them as it comes
//! and then dropped. The edge names the parameters and shapes the JSON.

use std::collections::BTreeMap;

use kiln_model::selector::Selector;

use crate::api::Series;
use crate::flamebearer::{auto_step_seconds, timeline, Timeline};
use crate::merge::DEFAULT_MAX_NODES;
use crate::request::{ordered, render_query, time_or};
use crate::select::{Querier, SelectRequest, TypeFilter};
use crate::series::{SeriesBuilder, SeriesOptions};
use crate::tree::FlameTree;
use crate::QueryError;

/// One selection of a render request.
#[derive(Debug, Clone)]
pub struct RenderSelection {
    pub type_id: String,
    pub selector: Selector,
    pub from_nanos: i64,
    pub to_nanos: i64,
}

/// A render request's parameters, as text, under the names its errors use
/// (`leftFrom` for render-diff's left side).
pub struct RenderParams<'a> {
    pub query: Option<&'a str>,
    pub query_name: &'a str,
    pub from: Option<&'a str>,
    pub from_name: &'a str,
    pub until: Option<&'a str>,
    pub until_name: &'a str,
}

impl RenderSelection {
    /// The selection `params` name at `now`: `from` defaults to an hour ago and `until`
    /// to now; a missing query, a bad time or `until` before `from` is a bad request.
    pub fn parse(params: &RenderParams, now: i64) -> Result<Self, QueryError> {
        let query = params.query.ok_or_else(|| {
            QueryError::BadRequest(format!("the {} parameter is required", params.query_name))
        })?;
        let (type_id, selector) = render_query(query)?;
        let (from_nanos, to_nanos) = ordered(
            time_or(params.from_name, params.from, "now-1h", now)?,
            time_or(params.until_name, params.until, "now", now)?,
            "from",
            "until",
        )?;
        Ok(RenderSelection {
            type_id,
            selector,
            from_nanos,
            to_nanos,
        })
    }

    /// What this selection reads, for `tenant`.
    pub fn request(&self, tenant: &str) -> SelectRequest {
        SelectRequest {
            tenant: tenant.to_string(),
            types: TypeFilter::Exact(self.type_id.clone()),
            selector: self.selector.clone(),
            from_nanos: self.from_nanos,
            to_nanos: self.to_nanos,
            ..Default::default()
        }
    }

    fn step_seconds(&self) -> i64 {
        auto_step_seconds(self.from_nanos, self.to_nanos)
    }

    /// Series options of this selection's timelines, grouped by `group_by`.
    fn series_options(&self, group_by: Vec<String>) -> SeriesOptions {
        SeriesOptions {
            step_ms: self.step_seconds() * 1000,
            group_by,
            ..Default::default()
        }
    }

    /// Timelines of the selection's totals, one per value of each series' `group_by`
    /// labels (one with no labels when `group_by` is empty).
    fn timelines(&self, series: Vec<Series>) -> BTreeMap<String, Timeline> {
        let step = self.step_seconds();
        series
            .into_iter()
            .map(|series| {
                let key = series
                    .labels
                    .iter()
                    .map(|label| label.value.as_str())
                    .collect::<Vec<_>>()
                    .join(",");
                let points: Vec<(i64, i64)> = series
                    .points
                    .iter()
                    .map(|point| (point.timestamp * 1_000_000, point.value as i64))
                    .collect();
                (key, timeline(&points, self.from_nanos, self.to_nanos, step))
            })
            .collect()
    }

    /// The selection's total over time: the one ungrouped timeline, or an empty one.
    fn total_timeline(&self, series: Vec<Series>) -> Timeline {
        self.timelines(series)
            .into_values()
            .next()
            .unwrap_or_else(|| timeline(&[], self.from_nanos, self.to_nanos, self.step_seconds()))
    }
}

/// A selection folded: its flame tree (uncut, totals computed), its timeline and, with a
/// `groupBy` label, one timeline per value.
pub struct Rendered {
    pub tree: FlameTree,
    pub timeline: Timeline,
    pub groups: Option<BTreeMap<String, Timeline>>,
}

/// Folds `selection` for `tenant`, in one pass over its datasets.
pub async fn fold(
    querier: &Querier,
    selection: &RenderSelection,
    tenant: &str,
    group_by: Option<&str>,
) -> Result<Rendered, QueryError> {
    let total_options = selection.series_options(Vec::new());
    let group_options = group_by.map(|label| selection.series_options(vec![label.to_string()]));
    let mut tree = FlameTree::default();
    let mut total = SeriesBuilder::new(&total_options)?;
    let mut groups = group_options.as_ref().map(SeriesBuilder::new).transpose()?;
    querier
        .select_each(&selection.request(tenant), |selected| {
            tree.add_selection(&selected, &selection.type_id);
            total.add(&selected);
            if let Some(groups) = &mut groups {
                groups.add(&selected);
            }
        })
        .await?;
    tree.compute_totals();
    Ok(Rendered {
        tree,
        timeline: selection.total_timeline(total.finish()),
        groups: groups.map(|groups| selection.timelines(groups.finish())),
    })
}

/// The `max-nodes` of a render request, [`DEFAULT_MAX_NODES`] when not given.
pub fn max_nodes(value: Option<&str>) -> Result<usize, QueryError> {
    match value {
        Some(value) => value
            .parse::<usize>()
            .map_err(|_| QueryError::BadRequest(format!("invalid max-nodes {value:?}"))),
        None => Ok(DEFAULT_MAX_NODES),
    }
}

//! Metadata queries: `ProfileTypes`, `LabelNames`, `LabelValues`, `Series` and
//! `GetProfileStats`. They read series rows only, and a series counts when at least one of
//! its profiles lies in the time range.

use std::collections::BTreeSet;

use kiln_model::labels::Labels;
use kiln_model::selector::Selector;

use crate::api::{self, LabelPair, ProfileType};
use crate::select::{selectable_labels, Querier, SelectRequest};
use crate::QueryError;

/// Which series a metadata query looks at: those matching any of `selectors` (all of
/// them when there is none), with a profile in `[from_nanos, to_nanos]`.
#[derive(Debug, Clone, Default)]
pub struct SeriesQuery {
    pub tenant: String,
    pub selectors: Vec<Selector>,
    pub from_nanos: i64,
    pub to_nanos: i64,
}

/// Calls `visit` with the selectable labels of every distinct matching series.
async fn visit_series(
    querier: &Querier,
    query: &SeriesQuery,
    mut visit: impl FnMut(&Labels),
) -> Result<(), QueryError> {
    let request = SelectRequest {
        tenant: query.tenant.clone(),
        selector: match query.selectors.as_slice() {
            [only] => only.clone(),
            _ => Selector::default(),
        },
        from_nanos: query.from_nanos,
        to_nanos: query.to_nanos,
        ..Default::default()
    };
    let mut seen: BTreeSet<Vec<(String, String)>> = BTreeSet::new();
    for meta in querier.datasets_within_budget(&request).await? {
        let dataset = querier.load(&meta).await?;
        let mut in_range = vec![false; dataset.series.len()];
        for profile in &dataset.profiles {
            if profile.time_nanos >= query.from_nanos && profile.time_nanos <= query.to_nanos {
                if let Some(slot) = in_range.get_mut(profile.series as usize) {
                    *slot = true;
                }
            }
        }
        for (series, _) in dataset
            .series
            .iter()
            .zip(&in_range)
            .filter(|(_, in_range)| **in_range)
        {
            let labels = selectable_labels(&dataset, series);
            if !query.selectors.is_empty()
                && !query
                    .selectors
                    .iter()
                    .any(|selector| selector.matches(&labels))
            {
                continue;
            }
            let key: Vec<(String, String)> = labels
                .iter()
                .map(|label| (label.name.clone(), label.value.clone()))
                .collect();
            if seen.insert(key) {
                visit(&labels);
            }
        }
    }
    Ok(())
}

/// Every label name of the matching series, sorted.
pub async fn label_names(
    querier: &Querier,
    query: &SeriesQuery,
) -> Result<Vec<String>, QueryError> {
    let mut names = BTreeSet::new();
    visit_series(querier, query, |labels| {
        names.extend(labels.iter().map(|label| label.name.clone()));
    })
    .await?;
    Ok(names.into_iter().collect())
}

/// Every value of label `name` among the matching series, sorted.
pub async fn label_values(
    querier: &Querier,
    query: &SeriesQuery,
    name: &str,
) -> Result<Vec<String>, QueryError> {
    let mut values = BTreeSet::new();
    visit_series(querier, query, |labels| {
        if let Some(value) = labels.get(name) {
            values.insert(value.to_string());
        }
    })
    .await?;
    Ok(values.into_iter().collect())
}

/// The distinct label sets of the matching series, restricted to `label_names` when given.
pub async fn series(
    querier: &Querier,
    query: &SeriesQuery,
    label_names: &[String],
) -> Result<Vec<api::Labels>, QueryError> {
    let mut sets = BTreeSet::new();
    visit_series(querier, query, |labels| {
        let set: Vec<LabelPair> = labels
            .iter()
            .filter(|label| label_names.is_empty() || label_names.contains(&label.name))
            .map(|label| LabelPair {
                name: label.name.clone(),
                value: label.value.clone(),
            })
            .collect();
        sets.insert(set);
    })
    .await?;
    Ok(sets
        .into_iter()
        .map(|labels| api::Labels { labels })
        .collect())
}

/// The profile types with data in the range, from the metastore alone.
pub async fn profile_types(
    querier: &Querier,
    tenant: &str,
    from_nanos: i64,
    to_nanos: i64,
) -> Result<Vec<ProfileType>, QueryError> {
    let request = SelectRequest {
        tenant: tenant.to_string(),
        from_nanos,
        to_nanos,
        ..Default::default()
    };
    let mut ids = BTreeSet::new();
    for meta in querier.datasets(&request).await? {
        ids.extend(meta.profile_types);
    }
    // Where both on- and off-CPU time were profiled, their sum is offered too.
    if crate::select::WALL_PARTS
        .iter()
        .all(|part| ids.contains(*part))
    {
        ids.insert(crate::select::WALL_TYPE.to_string());
    }
    Ok(ids.into_iter().map(|id| profile_type(&id)).collect())
}

/// A profile type message from its id `name:sample_type:sample_unit:period_type:period_unit`.
pub fn profile_type(id: &str) -> ProfileType {
    let mut parts = id.split(':').map(str::to_string);
    ProfileType {
        id: id.to_string(),
        name: parts.next().unwrap_or_default(),
        sample_type: parts.next().unwrap_or_default(),
        sample_unit: parts.next().unwrap_or_default(),
        period_type: parts.next().unwrap_or_default(),
        period_unit: parts.next().unwrap_or_default(),
    }
}

/// Whether the tenant has any data, and its oldest and newest profile times (ms).
pub async fn profile_stats(
    querier: &Querier,
    tenant: &str,
) -> Result<api::GetProfileStatsResponse, QueryError> {
    let request = SelectRequest {
        tenant: tenant.to_string(),
        from_nanos: i64::MIN,
        to_nanos: i64::MAX,
        ..Default::default()
    };
    let metas = querier.datasets(&request).await?;
    let oldest = metas.iter().map(|meta| meta.min_time_nanos).min();
    let newest = metas.iter().map(|meta| meta.max_time_nanos).max();
    Ok(api::GetProfileStatsResponse {
        data_ingested: !metas.is_empty(),
        oldest_profile_time: oldest.map_or(0, |nanos| nanos.div_euclid(1_000_000)),
        newest_profile_time: newest.map_or(0, |nanos| nanos.div_euclid(1_000_000)),
    })
}

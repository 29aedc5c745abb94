//! Single profiles: listing profile metadata, and fetching profiles by id.

use std::collections::BTreeMap;

use kiln_model::labels::{Labels, METRIC_NAME};
use kiln_model::selector::Selector;
use kiln_model::ProfileType;

use crate::select::{DatasetSelection, Querier, SelectRequest, TypeFilter};
use crate::QueryError;

/// One stored profile as listed (all its sample types together).
#[derive(Debug, Clone)]
pub struct ProfileInfo {
    pub id: String,
    pub service: String,
    pub profile_name: String,
    pub labels: Labels,
    pub time_nanos: i64,
}

/// The time a UUIDv7 id carries, to narrow a lookup by id.
pub fn id_time_nanos(id: &str) -> Option<i64> {
    let uuid = uuid_parse(id)?;
    if uuid[6] >> 4 != 7 {
        return None;
    }
    let millis = uuid[..6].iter().fold(0i64, |acc, b| (acc << 8) | *b as i64);
    Some(millis * 1_000_000)
}

fn uuid_parse(id: &str) -> Option<[u8; 16]> {
    let hex: String = id.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Selects the given profiles, whatever their type. Ids with a UUIDv7 time are searched
/// around that time; other ids over all time.
pub async fn select_by_ids(
    querier: &Querier,
    tenant: &str,
    ids: &[String],
) -> Result<(Vec<DatasetSelection>, Vec<String>), QueryError> {
    let times: Vec<Option<i64>> = ids.iter().map(|id| id_time_nanos(id)).collect();
    let (from_nanos, to_nanos) = if times.iter().all(Option::is_some) {
        let min = times.iter().flatten().min().copied().unwrap_or(0);
        let max = times.iter().flatten().max().copied().unwrap_or(0);
        (min - 1_000_000, max + 1_000_000)
    } else {
        (i64::MIN, i64::MAX)
    };
    let request = SelectRequest {
        tenant: tenant.to_string(),
        types: TypeFilter::Any,
        selector: Selector::default(),
        from_nanos,
        to_nanos,
        profile_ids: Some(ids.iter().map(|id| id.as_bytes().to_vec()).collect()),
        ..Default::default()
    };
    let selections = querier.select(&request).await?;
    let mut found: Vec<&[u8]> = Vec::new();
    for selection in &selections {
        for profile in &selection.profiles {
            found.push(&selection.dataset.profiles[profile.row].id);
        }
    }
    for id in ids {
        if !found.contains(&id.as_bytes()) {
            return Err(QueryError::NotFound(format!("profile {id:?} not found")));
        }
    }
    let types = ordered_types(&selections);
    Ok((selections, types))
}

/// Type ids of the selections ordered as they were in the received profiles.
pub fn ordered_types(selections: &[DatasetSelection]) -> Vec<String> {
    let mut positions: BTreeMap<String, u32> = BTreeMap::new();
    for selection in selections {
        for (id, position) in &selection.types {
            let entry = positions.entry(id.clone()).or_insert(*position);
            *entry = (*entry).min(*position);
        }
    }
    let mut types: Vec<(u32, String)> = positions.into_iter().map(|(id, p)| (p, id)).collect();
    types.sort();
    types.into_iter().map(|(_, id)| id).collect()
}

/// Lists profiles (newest first), one entry per id, at most `limit`.
pub async fn list_profiles(
    querier: &Querier,
    request: &SelectRequest,
    limit: usize,
) -> Result<Vec<ProfileInfo>, QueryError> {
    let selections = querier.select(request).await?;
    let mut by_id: BTreeMap<Vec<u8>, ProfileInfo> = BTreeMap::new();
    for selection in &selections {
        let dataset = &selection.dataset;
        for selected in &selection.profiles {
            let row = &dataset.profiles[selected.row];
            if by_id.contains_key(&row.id) {
                continue;
            }
            let series = &dataset.series[row.series as usize];
            let mut labels = dataset.series_labels(series);
            labels.remove(METRIC_NAME);
            let profile_name = ProfileType::parse(dataset.string(series.profile_type))
                .map(|t| t.name)
                .unwrap_or_default();
            by_id.insert(
                row.id.clone(),
                ProfileInfo {
                    id: String::from_utf8_lossy(&row.id).into_owned(),
                    service: dataset.service.clone(),
                    profile_name,
                    labels,
                    time_nanos: row.time_nanos,
                },
            );
        }
    }
    let mut profiles: Vec<ProfileInfo> = by_id.into_values().collect();
    profiles.sort_by(|a, b| b.time_nanos.cmp(&a.time_nanos).then(a.id.cmp(&b.id)));
    profiles.truncate(limit);
    Ok(profiles)
}

//! A heatmap of individual profiles: time on x, each profile's value on y in log buckets,
//! and how many profiles fall in each cell, as Pyroscope's heatmap draws them. A
//! rectangle of cells becomes a selection again ([`Rectangle::request`]): its time range
//! and the value range of its rows, so the flame graph of just those profiles is one
//! more query, not a list of profile ids sent back.
//!
//! Rows are fixed, not fitted to the data: row `k` holds the values from
//! `ceil(2^(k/4))` up to the next row's bound, four rows per doubling, and row 0 every
//! value below 2 (zero and negative ones too). So the same profile is in the same row in
//! every heatmap, and a row's bounds are integers the value filter applies exactly: a
//! profile is in a rectangle exactly when it was counted in one of its cells.

use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

use crate::request::{json_selection, Buckets, Time};
use crate::select::{Querier, SelectRequest};
use crate::tree::FlameTree;
use crate::QueryError;

/// Rows per doubling of the value.
pub const ROWS_PER_DOUBLING: u32 = 4;
/// Columns a heatmap may be asked for.
pub const MAX_COLUMNS: usize = 1_000;
pub const DEFAULT_COLUMNS: usize = 100;

/// Lower bound of each row (row 0's is unbounded below), while it fits an i64.
static BOUNDS: LazyLock<Vec<i64>> = LazyLock::new(|| {
    let mut bounds = vec![i64::MIN];
    for k in 1.. {
        let bound = 2f64
            .powf(f64::from(k) / f64::from(ROWS_PER_DOUBLING))
            .ceil();
        if bound >= i64::MAX as f64 {
            break;
        }
        bounds.push(bound as i64);
    }
    bounds
});

/// The row a value is counted in: the last whose lower bound it reaches.
pub fn row_of(value: i64) -> usize {
    BOUNDS
        .partition_point(|bound| *bound <= value)
        .saturating_sub(1)
}

/// `[min, max)` of a row, `None` where it is unbounded.
pub fn row_bounds(row: usize) -> (Option<i64>, Option<i64>) {
    let min = (row > 0).then(|| BOUNDS.get(row).copied()).flatten();
    let max = BOUNDS.get(row + 1).copied();
    (min, max)
}

/// `POST /api/v1/heatmap`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HeatmapRequest {
    pub profile_type: String,
    #[serde(default)]
    pub selector: String,
    pub from: Time,
    pub until: Time,
    #[serde(default = "default_columns")]
    pub columns: usize,
}

fn default_columns() -> usize {
    DEFAULT_COLUMNS
}

impl HeatmapRequest {
    pub fn select(&self, tenant: &str, now: i64) -> Result<SelectRequest, QueryError> {
        json_selection(
            tenant,
            &self.profile_type,
            &self.selector,
            &self.from,
            &self.until,
            now,
        )
    }
}

/// `POST /api/v1/heatmap/flamegraph`: the flame graph of a rectangle's profiles, or the
/// diff of two rectangles' (`compare`, the right side).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RectangleRequest {
    pub profile_type: String,
    #[serde(default)]
    pub selector: String,
    pub rectangle: Rectangle,
    #[serde(default)]
    pub compare: Option<Rectangle>,
    #[serde(default)]
    pub max_nodes: Option<i64>,
}

impl RectangleRequest {
    /// The request of each rectangle: the first, then the one compared with it.
    pub fn select(
        &self,
        tenant: &str,
        now: i64,
    ) -> Result<(SelectRequest, Option<SelectRequest>), QueryError> {
        let base = json_selection(
            tenant,
            &self.profile_type,
            &self.selector,
            &Time::Millis(self.rectangle.from),
            &Time::Millis(self.rectangle.until),
            now,
        )?;
        let compare = match &self.compare {
            Some(rectangle) => Some(rectangle.request(&base)?),
            None => None,
        };
        Ok((self.rectangle.request(&base)?, compare))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Heatmap {
    pub profile_type: String,
    /// Start of column 0, in epoch milliseconds.
    pub from_ms: i64,
    /// Width of each column, in milliseconds.
    pub step_ms: i64,
    pub columns: usize,
    /// The rows from the lowest to the highest that holds a profile, with their bounds.
    pub rows: Vec<HeatmapRow>,
    /// Non-empty cells only.
    pub cells: Vec<Cell>,
    pub profiles: u64,
    pub max_count: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HeatmapRow {
    pub row: usize,
    /// Inclusive lower bound; absent for the row of every value below 2.
    pub min: Option<i64>,
    /// Exclusive upper bound; absent when unbounded.
    pub max: Option<i64>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Cell {
    pub column: usize,
    pub row: usize,
    pub count: u64,
}

/// Counts the profiles of `request`'s one type per column of `columns` over its range and
/// per value row. Each profile's value is its stored total: the whole profile's, which
/// the value filter of a [`Rectangle`] reads too.
pub async fn heatmap(
    querier: &Querier,
    request: &SelectRequest,
    columns: usize,
) -> Result<Heatmap, QueryError> {
    let type_id = crate::merge::exact_type(request)?.to_string();
    if columns == 0 || columns > MAX_COLUMNS {
        return Err(QueryError::BadRequest(format!(
            "columns must be between 1 and {MAX_COLUMNS}, not {columns}"
        )));
    }
    let buckets = Buckets::over(request.from_nanos, request.to_nanos, columns);
    let rows = BOUNDS.len();
    let mut counts = vec![0u64; columns * rows];
    let mut profiles = 0u64;
    querier
        .select_each(request, |selection| {
            let Some(local_type) = selection.local_type(&type_id) else {
                return;
            };
            for profile in &selection.profiles {
                if profile.local_type != local_type {
                    continue;
                }
                let Some(row) = selection.dataset.profiles.get(profile.row) else {
                    continue;
                };
                counts[buckets.index(profile.time_nanos) * rows + row_of(row.total)] += 1;
                profiles += 1;
            }
        })
        .await?;
    let mut cells = Vec::new();
    let (mut lowest, mut highest) = (usize::MAX, 0);
    for (index, count) in counts.iter().enumerate() {
        if *count > 0 {
            let (column, row) = (index / rows, index % rows);
            lowest = lowest.min(row);
            highest = highest.max(row);
            cells.push(Cell {
                column,
                row,
                count: *count,
            });
        }
    }
    let rows = if cells.is_empty() {
        Vec::new()
    } else {
        (lowest..=highest)
            .map(|row| {
                let (min, max) = row_bounds(row);
                HeatmapRow { row, min, max }
            })
            .collect()
    };
    Ok(Heatmap {
        profile_type: type_id,
        from_ms: buckets.from_ms,
        step_ms: buckets.step_ms,
        columns,
        rows,
        max_count: cells.iter().map(|cell| cell.count).max().unwrap_or(0),
        cells,
        profiles,
    })
}

/// A rectangle of a heatmap: the profiles from `from` (inclusive) to `until` (exclusive,
/// both epoch milliseconds) whose value is in `min_value..max_value` (absent: unbounded).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Rectangle {
    pub from: i64,
    pub until: i64,
    #[serde(default)]
    pub min_value: Option<i64>,
    #[serde(default)]
    pub max_value: Option<i64>,
}

impl Rectangle {
    /// `base` (its type and selector) narrowed to this rectangle.
    pub fn request(&self, base: &SelectRequest) -> Result<SelectRequest, QueryError> {
        if self.until <= self.from {
            return Err(QueryError::BadRequest(format!(
                "a rectangle's until ({}) must be after its from ({})",
                self.until, self.from
            )));
        }
        let min = self.min_value.unwrap_or(i64::MIN);
        let max = self.max_value.unwrap_or(i64::MAX);
        if max <= min {
            return Err(QueryError::BadRequest(format!(
                "a rectangle's max_value ({max}) must be above its min_value ({min})"
            )));
        }
        Ok(SelectRequest {
            from_nanos: self.from.saturating_mul(1_000_000),
            to_nanos: self.until.saturating_mul(1_000_000).saturating_sub(1),
            value_range: Some((min, max)),
            ..base.clone()
        })
    }
}

/// What a rectangle selected: the merged tree of its profiles, how many there were and
/// the sum of their values, so a client can check one against the other.
pub struct Selected {
    pub tree: FlameTree,
    pub profiles: u64,
    pub total: i64,
}

/// The merged flame tree of a rectangle's profiles, with their count and summed values.
pub async fn select_rectangle(
    querier: &Querier,
    request: &SelectRequest,
) -> Result<Selected, QueryError> {
    let type_id = crate::merge::exact_type(request)?.to_string();
    let mut tree = FlameTree::default();
    let (mut profiles, mut total) = (0u64, 0i64);
    querier
        .select_each(request, |selection| {
            if let Some(local_type) = selection.local_type(&type_id) {
                for profile in selection
                    .profiles
                    .iter()
                    .filter(|p| p.local_type == local_type)
                {
                    profiles += 1;
                    total = total.saturating_add(profile.total);
                }
            }
            tree.add_selection(&selection, &type_id);
        })
        .await?;
    tree.compute_totals();
    Ok(Selected {
        tree,
        profiles,
        total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_in_the_row_whose_bounds_hold_it() {
        for value in [
            -5,
            0,
            1,
            2,
            3,
            7,
            8,
            1000,
            1_000_000_007,
            10_000_000_000,
            i64::MAX,
        ] {
            let row = row_of(value);
            let (min, max) = row_bounds(row);
            assert!(
                min.is_none_or(|min| min <= value),
                "{value} below row {row}"
            );
            assert!(max.is_none_or(|max| value < max), "{value} above row {row}");
        }
        assert_eq!(row_of(1), 0);
        assert_eq!(row_of(2), row_of(2));
        // Four rows per doubling, once the bounds are apart.
        assert_eq!(row_of(1 << 20) - row_of(1 << 19), 4);
        // Bounds rise, and each row's upper bound is the next one's lower bound.
        for row in 1..BOUNDS.len() - 1 {
            assert!(BOUNDS[row] <= BOUNDS[row + 1]);
            assert_eq!(row_bounds(row).1, row_bounds(row + 1).0);
        }
    }

    #[test]
    fn a_rectangle_is_its_time_range_and_value_range() {
        let base = SelectRequest::default();
        let request = Rectangle {
            from: 1_000,
            until: 2_000,
            min_value: Some(8),
            max_value: None,
        }
        .request(&base)
        .unwrap();
        assert_eq!(request.from_nanos, 1_000_000_000);
        assert_eq!(request.to_nanos, 1_999_999_999);
        assert_eq!(request.value_range, Some((8, i64::MAX)));
        let empty = Rectangle {
            from: 5,
            until: 5,
            ..Default::default()
        };
        assert!(empty.request(&base).is_err());
    }
}

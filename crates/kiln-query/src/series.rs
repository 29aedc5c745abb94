//! `SelectSeries`: profile totals over time, one series per distinct value of the
//! `group_by` labels, with the individual profiles behind each point as exemplars.

use std::collections::BTreeMap;

use kiln_model::labels::Labels;

use crate::api::{Exemplar, LabelPair, Point, Series};
use crate::select::selectable_labels;
use crate::selection::DatasetSelection;
use crate::QueryError;

/// The exemplars kept per point: the profiles with the largest values.
pub const EXEMPLARS_PER_POINT: usize = 10;

#[derive(Debug, Clone, Default)]
pub struct SeriesOptions {
    /// Bucket width in milliseconds. Buckets are aligned to multiples of the step since
    /// the epoch, so the same profile lands on the same timestamp whatever range is asked.
    pub step_ms: i64,
    pub group_by: Vec<String>,
    /// Average the profiles of a bucket instead of summing them.
    pub average: bool,
    /// Keep only the `limit` series with the largest sum.
    pub limit: Option<usize>,
    /// One exemplar per profile behind a point (`EXEMPLAR_TYPE_INDIVIDUAL`).
    pub exemplars: bool,
    /// One exemplar per trace span behind a point, from the samples' `span_id` labels,
    /// with the profile holding it (`EXEMPLAR_TYPE_SPAN`).
    pub span_exemplars: bool,
}

#[derive(Default)]
struct Bucket {
    sum: i64,
    count: i64,
    exemplars: Vec<Exemplar>,
}

/// A share's series before [`SeriesBuilder::finish`]: per group and bucket the sum, the
/// count (for averages) and the best exemplars, so that the node that split the query
/// adds the shares up and averages, ranks and cuts once. Sent between query nodes as
/// protobuf.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PartialSeries {
    #[prost(message, repeated, tag = "1")]
    pub groups: Vec<PartialGroup>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PartialGroup {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    pub buckets: Vec<PartialBucket>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PartialBucket {
    /// The bucket's start, milliseconds since the epoch.
    #[prost(int64, tag = "1")]
    pub timestamp: i64,
    #[prost(int64, tag = "2")]
    pub sum: i64,
    #[prost(int64, tag = "3")]
    pub count: i64,
    #[prost(message, repeated, tag = "4")]
    pub exemplars: Vec<Exemplar>,
}

impl PartialSeries {
    /// A share's series as a peer returned them.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, QueryError> {
        <PartialSeries as prost::Message>::decode(bytes)
            .map_err(|err| QueryError::Remote(format!("a share's series do not decode: {err}")))
    }
}

/// The exemplars a point keeps: the largest values, ties by profile id.
fn keep_best(exemplars: &mut Vec<Exemplar>) {
    exemplars.sort_by(|a, b| b.value.cmp(&a.value).then(a.profile_id.cmp(&b.profile_id)));
    exemplars.truncate(EXEMPLARS_PER_POINT);
}

/// Series built one selection at a time, so that a caller can fold each selection into
/// its flame graph and its timelines and drop it.
pub struct SeriesBuilder<'a> {
    options: &'a SeriesOptions,
    series: BTreeMap<Vec<LabelPair>, BTreeMap<i64, Bucket>>,
}

impl<'a> SeriesBuilder<'a> {
    pub fn new(options: &'a SeriesOptions) -> Result<Self, QueryError> {
        if options.step_ms <= 0 {
            return Err(QueryError::BadRequest("step must be positive".to_string()));
        }
        Ok(SeriesBuilder {
            options,
            series: BTreeMap::new(),
        })
    }

    /// Adds one dataset's selected profiles. Span exemplars need the selection's samples:
    /// select with [`SelectRequest::per_sample`] for them.
    pub fn add(&mut self, selection: &DatasetSelection) {
        let options = self.options;
        let series = &mut self.series;
        let dataset = &selection.dataset;
        let offsets = if options.span_exemplars {
            dataset.profile_sample_offsets()
        } else {
            Vec::new()
        };
        // Group labels per dataset series, computed once.
        let mut group_of: Vec<Option<(Vec<LabelPair>, Labels)>> = vec![None; dataset.series.len()];
        for profile in &selection.profiles {
            let row = &dataset.profiles[profile.row];
            let series_index = row.series as usize;
            if group_of[series_index].is_none() {
                let labels = selectable_labels(dataset, &dataset.series[series_index]);
                let group: Vec<LabelPair> = options
                    .group_by
                    .iter()
                    .filter_map(|name| {
                        labels.get(name).map(|value| LabelPair {
                            name: name.clone(),
                            value: value.to_string(),
                        })
                    })
                    .collect();
                group_of[series_index] = Some((group, labels));
            }
            let Some((group, labels)) = &group_of[series_index] else {
                continue;
            };
            let time_ms = profile.time_nanos.div_euclid(1_000_000);
            let bucket_ms = time_ms.div_euclid(options.step_ms) * options.step_ms;
            let bucket = series
                .entry(group.clone())
                .or_default()
                .entry(bucket_ms)
                .or_default();
            bucket.sum = bucket.sum.saturating_add(profile.total);
            bucket.count += 1;
            let exemplar = |span_id: String, value: i64| Exemplar {
                timestamp: time_ms,
                profile_id: String::from_utf8_lossy(&row.id).into_owned(),
                span_id,
                value,
                labels: labels
                    .iter()
                    .filter(|label| !label.name.starts_with("__"))
                    .map(|label| LabelPair {
                        name: label.name.clone(),
                        value: label.value.clone(),
                    })
                    .collect(),
            };
            if options.exemplars {
                bucket
                    .exemplars
                    .push(exemplar(String::new(), profile.total));
            }
            if options.span_exemplars {
                for (span_id, value) in span_values(dataset, &offsets, profile.row) {
                    bucket.exemplars.push(exemplar(span_id, value));
                }
            }
        }
    }

    /// The series as they stand, for another node to add ([`Self::add_partial`]). Each
    /// bucket keeps only its best exemplars: the best of all shares are among them.
    pub fn into_partial(self) -> PartialSeries {
        let groups = self
            .series
            .into_iter()
            .map(|(labels, buckets)| PartialGroup {
                labels,
                buckets: buckets
                    .into_iter()
                    .map(|(timestamp, mut bucket)| {
                        keep_best(&mut bucket.exemplars);
                        PartialBucket {
                            timestamp,
                            sum: bucket.sum,
                            count: bucket.count,
                            exemplars: bucket.exemplars,
                        }
                    })
                    .collect(),
            })
            .collect();
        PartialSeries { groups }
    }

    /// Adds a share's series: sums and counts per group and bucket, exemplars pooled.
    pub fn add_partial(&mut self, partial: PartialSeries) {
        for group in partial.groups {
            let buckets = self.series.entry(group.labels).or_default();
            for part in group.buckets {
                let bucket = buckets.entry(part.timestamp).or_default();
                bucket.sum = bucket.sum.saturating_add(part.sum);
                bucket.count = bucket.count.saturating_add(part.count);
                bucket.exemplars.extend(part.exemplars);
            }
        }
    }

    pub fn finish(self) -> Vec<Series> {
        let options = self.options;
        let mut result: Vec<(i64, Series)> = self
            .series
            .into_iter()
            .map(|(labels, buckets)| {
                let mut sum = 0i64;
                let points = buckets
                    .into_iter()
                    .map(|(timestamp, mut bucket)| {
                        sum = sum.saturating_add(bucket.sum);
                        keep_best(&mut bucket.exemplars);
                        let value = if options.average {
                            bucket.sum as f64 / bucket.count.max(1) as f64
                        } else {
                            bucket.sum as f64
                        };
                        Point {
                            value,
                            timestamp,
                            exemplars: bucket.exemplars,
                        }
                    })
                    .collect();
                (sum, Series { labels, points })
            })
            .collect();
        if let Some(limit) = options.limit {
            // Largest first; ties by labels, for a stable answer.
            result.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.labels.cmp(&b.1.labels)));
            result.truncate(limit);
            result.sort_by(|a, b| a.1.labels.cmp(&b.1.labels));
        }
        result.into_iter().map(|(_, series)| series).collect()
    }
}

/// The value of each span in one profile: its samples' values summed by `span_id` label.
fn span_values(dataset: &kiln_storage::Dataset, offsets: &[u32], row: usize) -> Vec<(String, i64)> {
    let (Some(start), Some(end)) = (offsets.get(row), offsets.get(row + 1)) else {
        return Vec::new();
    };
    // Label rows are sorted by sample: find this profile's first one.
    let first = dataset
        .sample_label_sample
        .partition_point(|sample| sample < start);
    let mut spans: BTreeMap<String, i64> = BTreeMap::new();
    for label in first..dataset.sample_label_sample.len() {
        let sample = dataset.sample_label_sample[label];
        if sample >= *end {
            break;
        }
        if dataset.string(dataset.sample_label_name[label]) == "span_id" {
            let value = dataset.sample_value[sample as usize];
            let slot = spans
                .entry(
                    dataset
                        .string(dataset.sample_label_value[label])
                        .to_string(),
                )
                .or_default();
            *slot = slot.saturating_add(value);
        }
    }
    spans.into_iter().collect()
}

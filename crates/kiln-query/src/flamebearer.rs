//! Pyroscope's flamebearer JSON (`/pyroscope/render`): `names`, and per depth a `levels`
//! row of `[x offset delta, total, self, name index]` quadruples.

use serde::Serialize;

use crate::tree::FlameTree;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Flamebearer {
    pub names: Vec<String>,
    pub levels: Vec<Vec<i64>>,
    pub num_ticks: i64,
    pub max_self: i64,
    /// Kiln's addition: the binaries of the frames shown as `binary+0xoffset`, with their
    /// build ids, for the notice that asks for their debug info.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unnamed_binaries: Vec<UnnamedBinary>,
}

pub use crate::api::UnnamedBinary;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    pub format: &'static str,
    pub spy_name: String,
    pub sample_rate: i64,
    pub units: String,
    pub name: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeline {
    /// Seconds since the epoch of the first point.
    pub start_time: i64,
    pub samples: Vec<i64>,
    /// Seconds between points.
    pub duration_delta: i64,
}

#[derive(Debug, Serialize)]
pub struct RenderResponse {
    pub version: u32,
    pub flamebearer: Flamebearer,
    pub metadata: Metadata,
    pub timeline: Timeline,
    /// With `groupBy`: one timeline per value of the label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<std::collections::BTreeMap<String, Timeline>>,
}

/// `/pyroscope/render-diff`: levels of seven numbers per node (left x offset, left total,
/// left self, right x offset, right total, right self, name index).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderDiffResponse {
    pub version: u32,
    pub flamebearer: Flamebearer,
    pub metadata: Metadata,
    pub left_ticks: i64,
    pub right_ticks: i64,
    pub left_timeline: Timeline,
    pub right_timeline: Timeline,
}

/// Lays out the tree level by level, children in name order.
pub fn flamebearer(tree: &FlameTree) -> Flamebearer {
    let (levels, max_self) = tree.levels();
    Flamebearer {
        names: tree.names.clone(),
        levels,
        num_ticks: tree.total(),
        max_self,
        unnamed_binaries: tree.unnamed.iter().cloned().collect(),
    }
}

/// Metadata units and sample rate as Pyroscope reports them for a profile type.
pub fn metadata_for(type_id: &str) -> Metadata {
    let parts: Vec<&str> = type_id.split(':').collect();
    let name = parts.first().copied().unwrap_or("");
    let unit = parts.get(2).copied().unwrap_or("");
    let (units, sample_rate) = match (name, unit) {
        (_, "nanoseconds") => ("samples", 1_000_000_000),
        (_, "microseconds") => ("samples", 1_000_000),
        (_, "bytes") => ("bytes", 100),
        ("memory", _) => ("objects", 100),
        ("goroutines", _) => ("goroutines", 100),
        ("mutex" | "block", _) => ("lock_samples", 100),
        _ => ("short", 100),
    };
    Metadata {
        format: "single",
        spy_name: String::new(),
        sample_rate,
        units: units.to_string(),
        name: type_id.to_string(),
    }
}

/// Sums profile totals into buckets of `step` seconds starting at `from`.
pub fn timeline(
    points: &[(i64, i64)],
    from_nanos: i64,
    to_nanos: i64,
    step_seconds: i64,
) -> Timeline {
    let step_nanos = step_seconds.max(1) * 1_000_000_000;
    let start = from_nanos.div_euclid(step_nanos) * step_nanos;
    let buckets = ((to_nanos - start).max(0) / step_nanos + 1).min(100_000) as usize;
    let mut samples = vec![0i64; buckets];
    for (time, value) in points {
        let bucket = ((time - start) / step_nanos) as usize;
        if let Some(slot) = samples.get_mut(bucket) {
            *slot = slot.saturating_add(*value);
        }
    }
    Timeline {
        start_time: start / 1_000_000_000,
        samples,
        duration_delta: step_seconds.max(1),
    }
}

/// A step giving at most about 1,000 points, and never under 10 s.
pub fn auto_step_seconds(from_nanos: i64, to_nanos: i64) -> i64 {
    let seconds = ((to_nanos - from_nanos) / 1_000_000_000).max(1);
    (seconds / 1000).max(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_delta_encoded() {
        let mut tree = FlameTree::default();
        let (a, b, c) = (tree.name_id("a"), tree.name_id("b"), tree.name_id("c"));
        let na = tree.child(0, a);
        let nb = tree.child(0, b);
        let nc = tree.child(na, c);
        tree.nodes[na as usize].self_value = 1;
        tree.nodes[nc as usize].self_value = 2;
        tree.nodes[nb as usize].self_value = 3;
        tree.compute_totals();
        let fb = flamebearer(&tree);
        assert_eq!(fb.num_ticks, 6);
        assert_eq!(fb.max_self, 3);
        assert_eq!(fb.levels[0], vec![0, 6, 0, 0]);
        // a at x=0 (total 3, self 1), b right after it at x=3.
        assert_eq!(fb.levels[1], vec![0, 3, 1, a as i64, 0, 3, 3, b as i64]);
        assert_eq!(fb.levels[2], vec![0, 2, 2, c as i64]);
    }

    #[test]
    fn truncation_keeps_large_nodes_and_sums_the_rest() {
        let mut tree = FlameTree::default();
        let names: Vec<u32> = ["big", "s1", "s2", "s3"]
            .iter()
            .map(|n| tree.name_id(n))
            .collect();
        let values = [100, 1, 2, 3];
        for (name, value) in names.iter().zip(values) {
            let node = tree.child(0, *name);
            tree.nodes[node as usize].self_value = value;
        }
        tree.compute_totals();
        let cut = tree.truncate(2);
        assert_eq!(cut.total(), 106);
        let children: Vec<(String, i64)> = cut.nodes[0]
            .children
            .iter()
            .map(|c| {
                (
                    cut.names[cut.nodes[*c as usize].name as usize].clone(),
                    cut.nodes[*c as usize].total,
                )
            })
            .collect();
        assert_eq!(
            children,
            vec![("big".to_string(), 100), ("other".to_string(), 6)]
        );
    }
}

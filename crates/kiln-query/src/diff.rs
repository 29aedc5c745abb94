//! `Diff`: two selections merged into one flame graph whose nodes carry both sides.

use crate::api::{FlameGraphDiff, Level};
use crate::tree::{DiffTree, FlameTree, Sides};

/// The diff flame graph of two merged trees, cut to `max_nodes` (0 keeps all). Children
/// are laid out in name order; each side's x offsets count in that side's own values.
pub fn flame_graph_diff(left: &FlameTree, right: &FlameTree, max_nodes: usize) -> FlameGraphDiff {
    let mut combined = DiffTree::default();
    combined.add_tree(left, |left| Sides { left, right: 0 });
    combined.add_tree(right, |right| Sides { left: 0, right });
    combined.compute_totals();
    let tree = combined.truncate(max_nodes);

    let (levels, max_self) = tree.levels();
    let Sides {
        left: left_ticks,
        right: right_ticks,
    } = tree.total();
    FlameGraphDiff {
        names: tree.names,
        levels: levels.into_iter().map(|values| Level { values }).collect(),
        total: left_ticks.saturating_add(right_ticks),
        max_self,
        left_ticks,
        right_ticks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::OTHER_NAME;

    fn tree(stacks: &[(&[&str], i64)]) -> FlameTree {
        let mut tree = FlameTree::default();
        for (frames, value) in stacks {
            let mut node = 0;
            for frame in *frames {
                let name = tree.name_id(frame);
                node = tree.child(node, name);
            }
            tree.nodes[node as usize].self_value += value;
        }
        tree.compute_totals();
        tree
    }

    #[test]
    fn each_side_keeps_its_own_totals_and_offsets() {
        let left = tree(&[(&["main", "a"], 10), (&["main", "b"], 5)]);
        let right = tree(&[(&["main", "b"], 20), (&["main", "c"], 1)]);
        let diff = flame_graph_diff(&left, &right, 0);
        assert_eq!(
            (diff.left_ticks, diff.right_ticks, diff.total),
            (15, 21, 36)
        );
        assert_eq!(diff.max_self, 20);
        let name = |values: &[i64]| diff.names[values[6] as usize].clone();
        // Level 2 holds a, b, c in name order.
        let level: Vec<&[i64]> = diff.levels[2].values.chunks(7).collect();
        assert_eq!(level.len(), 3);
        assert_eq!(name(level[0]), "a");
        assert_eq!(level[0][..6], [0, 10, 10, 0, 0, 0]);
        assert_eq!(name(level[1]), "b");
        assert_eq!(level[1][..6], [0, 5, 5, 0, 20, 20]);
        assert_eq!(name(level[2]), "c");
        assert_eq!(level[2][..6], [0, 0, 0, 0, 1, 1]);
    }

    #[test]
    fn truncation_sums_the_rest_per_side() {
        let left = tree(&[
            (&["main", "a"], 10),
            (&["main", "b"], 5),
            (&["main", "c"], 1),
        ]);
        let right = tree(&[(&["main", "a"], 1), (&["main", "c"], 7)]);
        let diff = flame_graph_diff(&left, &right, 4);
        assert_eq!((diff.left_ticks, diff.right_ticks), (16, 8));
        let level: Vec<&[i64]> = diff.levels[2].values.chunks(7).collect();
        let totals: (i64, i64) = level
            .iter()
            .fold((0, 0), |(l, r), values| (l + values[1], r + values[4]));
        assert_eq!(totals, (16, 8));
        assert!(level
            .iter()
            .any(|values| diff.names[values[6] as usize] == OTHER_NAME));
    }
}

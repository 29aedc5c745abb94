//! `Diff`: two selections merged into one flame graph whose nodes carry both sides.

use foldhash::{HashMap, HashMapExt};

use crate::api::{FlameGraphDiff, Level};
use crate::tree::{FlameTree, OTHER_NAME, ROOT_NAME};

#[derive(Debug, Clone, Default)]
struct Side {
    self_value: i64,
    total: i64,
}

#[derive(Debug, Clone)]
struct DiffNode {
    name: u32,
    parent: u32,
    left: Side,
    right: Side,
    children: Vec<u32>,
}

/// Both trees on one shape: a node exists when either side has it.
struct DiffTree {
    names: Vec<String>,
    name_ids: HashMap<String, u32>,
    nodes: Vec<DiffNode>,
    child_index: HashMap<(u32, u32), u32>,
}

impl DiffTree {
    fn new() -> Self {
        let mut tree = DiffTree {
            names: Vec::new(),
            name_ids: HashMap::new(),
            nodes: Vec::new(),
            child_index: HashMap::new(),
        };
        let root = tree.name_id(ROOT_NAME);
        tree.nodes.push(DiffNode {
            name: root,
            parent: 0,
            left: Side::default(),
            right: Side::default(),
            children: Vec::new(),
        });
        tree
    }

    fn name_id(&mut self, name: &str) -> u32 {
        if let Some(id) = self.name_ids.get(name) {
            return *id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.name_ids.insert(name.to_string(), id);
        id
    }

    fn child(&mut self, parent: u32, name: u32) -> u32 {
        if let Some(id) = self.child_index.get(&(parent, name)) {
            return *id;
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(DiffNode {
            name,
            parent,
            left: Side::default(),
            right: Side::default(),
            children: Vec::new(),
        });
        self.nodes[parent as usize].children.push(id);
        self.child_index.insert((parent, name), id);
        id
    }

    /// Adds one side's self values; nodes of a `FlameTree` follow their parents.
    fn add(&mut self, tree: &FlameTree, right: bool) {
        let mut mapped = vec![0u32; tree.nodes.len()];
        for (index, node) in tree.nodes.iter().enumerate() {
            let id = if index == 0 {
                0
            } else {
                let name = self.name_id(&tree.names[node.name as usize]);
                self.child(mapped[node.parent as usize], name)
            };
            mapped[index] = id;
            let side = if right {
                &mut self.nodes[id as usize].right
            } else {
                &mut self.nodes[id as usize].left
            };
            side.self_value = side.self_value.saturating_add(node.self_value);
        }
    }

    fn compute_totals(&mut self) {
        for node in &mut self.nodes {
            node.left.total = node.left.self_value;
            node.right.total = node.right.self_value;
        }
        for index in (1..self.nodes.len()).rev() {
            let (left, right) = (self.nodes[index].left.total, self.nodes[index].right.total);
            let parent_index = self.nodes[index].parent as usize;
            let parent = &mut self.nodes[parent_index];
            parent.left.total = parent.left.total.saturating_add(left);
            parent.right.total = parent.right.total.saturating_add(right);
        }
    }

    fn weight(&self, index: usize) -> i64 {
        let node = &self.nodes[index];
        node.left.total.max(node.right.total)
    }

    /// Keeps the `max_nodes` nodes weighing most on either side; the rest of each parent's
    /// children are summed, per side, into one `other` child.
    fn truncate(&self, max_nodes: usize) -> DiffTree {
        let mut out = DiffTree::new();
        let mut keep = vec![true; self.nodes.len()];
        if max_nodes > 0 && self.nodes.len() > max_nodes {
            let mut depth = vec![0u32; self.nodes.len()];
            for index in 1..self.nodes.len() {
                depth[index] = depth[self.nodes[index].parent as usize] + 1;
            }
            let mut order: Vec<usize> = (0..self.nodes.len()).collect();
            order.sort_by(|a, b| {
                self.weight(*b)
                    .cmp(&self.weight(*a))
                    .then(depth[*a].cmp(&depth[*b]))
                    .then(a.cmp(b))
            });
            keep = vec![false; self.nodes.len()];
            for index in order.into_iter().take(max_nodes) {
                keep[index] = true;
            }
        }
        let other = out.name_id(OTHER_NAME);
        let mut mapped = vec![u32::MAX; self.nodes.len()];
        mapped[0] = 0;
        for index in 1..self.nodes.len() {
            let node = &self.nodes[index];
            let parent = mapped[node.parent as usize];
            if parent == u32::MAX {
                continue;
            }
            let (id, left, right) = if keep[index] {
                let name = out.name_id(&self.names[node.name as usize]);
                let id = out.child(parent, name);
                mapped[index] = id;
                (id, node.left.self_value, node.right.self_value)
            } else {
                (out.child(parent, other), node.left.total, node.right.total)
            };
            let target = &mut out.nodes[id as usize];
            target.left.self_value = target.left.self_value.saturating_add(left);
            target.right.self_value = target.right.self_value.saturating_add(right);
        }
        out.nodes[0].left.self_value = self.nodes[0].left.self_value;
        out.nodes[0].right.self_value = self.nodes[0].right.self_value;
        out.compute_totals();
        out
    }
}

/// The diff flame graph of two merged trees, cut to `max_nodes` (0 keeps all). Children
/// are laid out in name order; each side's x offsets count in that side's own values.
pub fn flame_graph_diff(left: &FlameTree, right: &FlameTree, max_nodes: usize) -> FlameGraphDiff {
    let mut combined = DiffTree::new();
    combined.add(left, false);
    combined.add(right, true);
    combined.compute_totals();
    let tree = combined.truncate(max_nodes);

    let mut levels: Vec<Vec<i64>> = Vec::new();
    let mut level_ends: Vec<(i64, i64)> = Vec::new();
    let mut max_self = 0i64;
    // (node, depth, left x, right x)
    let mut stack: Vec<(u32, usize, i64, i64)> = vec![(0, 0, 0, 0)];
    while let Some((index, depth, left_x, right_x)) = stack.pop() {
        let node = &tree.nodes[index as usize];
        if index != 0 && node.left.total == 0 && node.right.total == 0 {
            continue;
        }
        if levels.len() <= depth {
            levels.push(Vec::new());
            level_ends.push((0, 0));
        }
        let (left_end, right_end) = level_ends[depth];
        levels[depth].extend_from_slice(&[
            left_x.saturating_sub(left_end),
            node.left.total,
            node.left.self_value,
            right_x.saturating_sub(right_end),
            node.right.total,
            node.right.self_value,
            node.name as i64,
        ]);
        level_ends[depth] = (
            left_x.saturating_add(node.left.total),
            right_x.saturating_add(node.right.total),
        );
        max_self = max_self
            .max(node.left.self_value)
            .max(node.right.self_value);
        let mut children = node.children.clone();
        children.sort_by(|a, b| {
            tree.names[tree.nodes[*a as usize].name as usize]
                .cmp(&tree.names[tree.nodes[*b as usize].name as usize])
        });
        let mut placed = Vec::with_capacity(children.len());
        let (mut x_left, mut x_right) = (left_x, right_x);
        for child in children {
            placed.push((child, x_left, x_right));
            let child_node = &tree.nodes[child as usize];
            x_left = x_left.saturating_add(child_node.left.total);
            x_right = x_right.saturating_add(child_node.right.total);
        }
        for (child, x_left, x_right) in placed.into_iter().rev() {
            stack.push((child, depth + 1, x_left, x_right));
        }
    }
    let left_ticks = tree.nodes[0].left.total;
    let right_ticks = tree.nodes[0].right.total;
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

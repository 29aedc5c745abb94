//! The call tree behind every flame graph: one structure, keyed by frame name, for a
//! merged selection ([`FlameTree`], one value per node) and for a diff ([`DiffTree`], one
//! value per side), so both are built, summed and cut by the same code.

use foldhash::{HashMap, HashMapExt};

use crate::select::DatasetSelection;
use crate::symbols::FrameNames;

pub const ROOT_NAME: &str = "total";
/// Name of the node that sums the children cut by `max_nodes`.
pub const OTHER_NAME: &str = "other";

/// What a node carries: one value for a flame graph, one per side for a diff.
pub trait Weight: Copy + Default + PartialEq + std::fmt::Debug {
    fn saturating_add(self, other: Self) -> Self;
    fn saturating_sub(self, other: Self) -> Self;
    /// The size truncation ranks nodes by, and the largest self value a layout reports.
    fn rank(self) -> i64;
    /// A laid-out node's columns, before its name: per value, the offset from the end of
    /// the previous node on its level, the total and the self value.
    fn columns(gap: Self, total: Self, self_value: Self, out: &mut Vec<i64>);
}

impl Weight for i64 {
    fn saturating_add(self, other: i64) -> i64 {
        i64::saturating_add(self, other)
    }

    fn saturating_sub(self, other: i64) -> i64 {
        i64::saturating_sub(self, other)
    }

    fn rank(self) -> i64 {
        self
    }

    fn columns(gap: i64, total: i64, self_value: i64, out: &mut Vec<i64>) {
        out.extend_from_slice(&[gap, total, self_value]);
    }
}

/// A diff node's values: the left and the right selection's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sides {
    pub left: i64,
    pub right: i64,
}

impl Weight for Sides {
    fn saturating_add(self, other: Sides) -> Sides {
        Sides {
            left: self.left.saturating_add(other.left),
            right: self.right.saturating_add(other.right),
        }
    }

    fn saturating_sub(self, other: Sides) -> Sides {
        Sides {
            left: self.left.saturating_sub(other.left),
            right: self.right.saturating_sub(other.right),
        }
    }

    fn columns(gap: Sides, total: Sides, self_value: Sides, out: &mut Vec<i64>) {
        out.extend_from_slice(&[
            gap.left,
            total.left,
            self_value.left,
            gap.right,
            total.right,
            self_value.right,
        ]);
    }

    /// A node matters as much as its larger side.
    fn rank(self) -> i64 {
        self.left.max(self.right)
    }
}

#[derive(Debug, Clone)]
pub struct Node<V> {
    pub name: u32,
    pub parent: u32,
    pub self_value: V,
    pub total: V,
    pub children: Vec<u32>,
}

/// A call tree keyed by frame name. Node 0 is the root; names are indexes into `names`;
/// a node's parent always precedes it, so one backward pass sums totals.
#[derive(Debug, Clone)]
pub struct Tree<V> {
    pub names: Vec<String>,
    name_ids: HashMap<String, u32>,
    pub nodes: Vec<Node<V>>,
    child_index: HashMap<(u32, u32), u32>,
}

/// The merged call tree of one selection: the flame graph's.
pub type FlameTree = Tree<i64>;

/// Two selections' trees on one shape: a node exists when either side has it.
pub type DiffTree = Tree<Sides>;

impl<V: Weight> Default for Tree<V> {
    fn default() -> Self {
        let mut tree = Tree {
            names: Vec::new(),
            name_ids: HashMap::new(),
            nodes: Vec::new(),
            child_index: HashMap::new(),
        };
        let root = tree.name_id(ROOT_NAME);
        tree.nodes.push(Node {
            name: root,
            parent: 0,
            self_value: V::default(),
            total: V::default(),
            children: Vec::new(),
        });
        tree
    }
}

impl<V: Weight> Tree<V> {
    pub fn name_id(&mut self, name: &str) -> u32 {
        if let Some(id) = self.name_ids.get(name) {
            return *id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.to_string());
        self.name_ids.insert(name.to_string(), id);
        id
    }

    pub fn child(&mut self, parent: u32, name: u32) -> u32 {
        if let Some(id) = self.child_index.get(&(parent, name)) {
            return *id;
        }
        let id = self.nodes.len() as u32;
        self.nodes.push(Node {
            name,
            parent,
            self_value: V::default(),
            total: V::default(),
            children: Vec::new(),
        });
        self.nodes[parent as usize].children.push(id);
        self.child_index.insert((parent, name), id);
        id
    }

    pub fn total(&self) -> V {
        self.nodes[0].total
    }

    fn add_self(&mut self, node: u32, value: V) {
        let node = &mut self.nodes[node as usize];
        node.self_value = node.self_value.saturating_add(value);
    }

    /// Adds another tree's self values, each turned into this tree's by `value`, matching
    /// nodes by their path of names.
    pub fn add_tree<U: Weight>(&mut self, other: &Tree<U>, value: impl Fn(U) -> V) {
        let mut mapped = vec![0u32; other.nodes.len()];
        for (index, node) in other.nodes.iter().enumerate() {
            if index != 0 {
                let name = self.name_id(&other.names[node.name as usize]);
                mapped[index] = self.child(mapped[node.parent as usize], name);
            }
            self.add_self(mapped[index], value(node.self_value));
        }
    }

    /// Computes every node's total from the self values (children come after parents).
    pub fn compute_totals(&mut self) {
        for node in &mut self.nodes {
            node.total = node.self_value;
        }
        for index in (1..self.nodes.len()).rev() {
            let total = self.nodes[index].total;
            let parent = self.nodes[index].parent as usize;
            let parent = &mut self.nodes[parent];
            parent.total = parent.total.saturating_add(total);
        }
    }

    /// Keeps the `max_nodes` nodes of largest [`Weight::rank`] (never hiding a node larger
    /// than one kept) and sums the rest under one `other` child per parent, so totals still
    /// add up.
    pub fn truncate(&self, max_nodes: usize) -> Tree<V> {
        if max_nodes == 0 || self.nodes.len() <= max_nodes {
            return self.clone();
        }
        let mut depth = vec![0u32; self.nodes.len()];
        for index in 1..self.nodes.len() {
            depth[index] = depth[self.nodes[index].parent as usize] + 1;
        }
        let mut order: Vec<u32> = (0..self.nodes.len() as u32).collect();
        // Parents sort before their children: larger-or-equal rank and smaller depth.
        order.sort_by(|a, b| {
            let (a, b) = (*a as usize, *b as usize);
            self.nodes[b]
                .total
                .rank()
                .cmp(&self.nodes[a].total.rank())
                .then(depth[a].cmp(&depth[b]))
                .then(a.cmp(&b))
        });
        let mut keep = vec![false; self.nodes.len()];
        for index in order.iter().take(max_nodes) {
            keep[*index as usize] = true;
        }
        let mut out = Tree::default();
        let mut mapped = vec![u32::MAX; self.nodes.len()];
        mapped[0] = 0;
        let other = out.name_id(OTHER_NAME);
        for index in 1..self.nodes.len() {
            let node = &self.nodes[index];
            let parent = mapped[node.parent as usize];
            if parent == u32::MAX {
                continue; // an ancestor was cut and already counted in its parent's "other"
            }
            if keep[index] {
                let name = out.name_id(&self.names[node.name as usize]);
                let id = out.child(parent, name);
                out.add_self(id, node.self_value);
                mapped[index] = id;
            } else {
                let id = out.child(parent, other);
                out.add_self(id, node.total);
            }
        }
        out.nodes[0].self_value = self.nodes[0].self_value;
        out.compute_totals();
        out
    }

    /// Lays the tree out level by level, as Pyroscope's flame graphs are sent: each node
    /// is its [`Weight::columns`] then its name index; children go left to right in name
    /// order, and nodes with a zero total are left out. Returns the levels and the largest
    /// self value.
    pub fn levels(&self) -> (Vec<Vec<i64>>, i64) {
        let mut levels: Vec<Vec<i64>> = Vec::new();
        let mut level_end: Vec<V> = Vec::new();
        let mut max_self = 0i64;
        // (node, depth, x offset)
        let mut stack: Vec<(u32, usize, V)> = vec![(0, 0, V::default())];
        while let Some((index, depth, offset)) = stack.pop() {
            let node = &self.nodes[index as usize];
            if index != 0 && node.total == V::default() {
                continue;
            }
            if levels.len() <= depth {
                levels.push(Vec::new());
                level_end.push(V::default());
            }
            // Saturating: values near i64::MAX must not overflow the layout.
            V::columns(
                offset.saturating_sub(level_end[depth]),
                node.total,
                node.self_value,
                &mut levels[depth],
            );
            levels[depth].push(node.name as i64);
            level_end[depth] = offset.saturating_add(node.total);
            max_self = max_self.max(node.self_value.rank());
            let mut children = node.children.clone();
            children.sort_by(|a, b| {
                self.names[self.nodes[*a as usize].name as usize]
                    .cmp(&self.names[self.nodes[*b as usize].name as usize])
            });
            // Pushed reversed, so the first child pops first.
            let mut x = offset;
            let mut placed = Vec::with_capacity(children.len());
            for child in children {
                placed.push((child, x));
                x = x.saturating_add(self.nodes[child as usize].total);
            }
            for (child, x) in placed.into_iter().rev() {
                stack.push((child, depth + 1, x));
            }
        }
        (levels, max_self)
    }
}

impl FlameTree {
    /// Adds one dataset's values of `type_id` (totals are left to compute once). Each
    /// stack node is resolved to a tree node once, from its parent's tree node, so names
    /// are looked up once per distinct stack prefix rather than once per sample.
    pub fn add_selection(&mut self, selection: &DatasetSelection, type_id: &str) {
        let dataset = &selection.dataset;
        let Some(values) = selection
            .local_type(type_id)
            .and_then(|local| selection.values.get(local))
        else {
            return;
        };
        let names = FrameNames::new(dataset);
        let stack_count = dataset.stack_parent.len();
        // Which stack nodes carry value or lead to one: only those get tree nodes.
        let mut needed = vec![false; stack_count];
        for node in (1..stack_count).rev() {
            if values[node] != 0 || needed[node] {
                needed[node] = true;
                let parent = dataset.stack_parent[node] as usize;
                if parent != 0 {
                    needed[parent] = true;
                }
            }
        }
        let mut tree_node = vec![0u32; stack_count];
        // Parents precede children in the stack table, so one forward pass suffices.
        for node in 1..stack_count {
            if !needed[node] {
                continue;
            }
            let mut current = tree_node[dataset.stack_parent[node] as usize];
            names.for_each_frame(dataset.stack_location[node], |frame| {
                let name = self.name_id(frame);
                current = self.child(current, name);
            });
            tree_node[node] = current;
            let value = values[node];
            if value != 0 {
                let node = &mut self.nodes[current as usize];
                node.self_value = node.self_value.saturating_add(value);
            }
        }
    }
}

/// Builds the merged tree of one type id from all selections.
pub fn build_tree(selections: &[DatasetSelection], type_id: &str) -> FlameTree {
    let mut tree = FlameTree::default();
    for selection in selections {
        tree.add_selection(selection, type_id);
    }
    tree.compute_totals();
    tree
}

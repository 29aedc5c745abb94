//! The call tree behind every flame graph: one structure, keyed by frame name, for a
//! merged selection ([`FlameTree`], one value per node) and for a diff ([`DiffTree`], one
//! value per side), so both are built, summed and cut by the same code.

use std::collections::BTreeSet;

use foldhash::{HashMap, HashMapExt};
use prost::encoding::{decode_varint, encode_varint};

use crate::api::UnnamedBinary;
use crate::selection::DatasetSelection;
use crate::symbols::FrameNames;
use crate::QueryError;

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
    /// The binaries whose frames are shown as `binary+0xoffset`, with their build ids
    /// (empty when the profile had none): what a flame graph's notice asks the user to
    /// upload debug info for. Kept beside the nodes because a name cannot say it.
    pub unnamed: BTreeSet<UnnamedBinary>,
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
            unnamed: BTreeSet::new(),
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

    pub fn add_self(&mut self, node: u32, value: V) {
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
        self.unnamed.extend(other.unnamed.iter().cloned());
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
        out.unnamed = self.unnamed.clone();
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
    /// Adds one dataset's values of `type_id` (totals are left to compute once).
    pub fn add_selection(&mut self, selection: &DatasetSelection, type_id: &str) {
        self.add_dataset_tree(&DatasetTree::new(selection, type_id));
    }

    /// Adds one dataset's share, matching its nodes to this tree's by parent and name.
    /// Each of its names is looked up here once, not once per node that carries it.
    pub fn add_dataset_tree(&mut self, part: &DatasetTree) {
        let mut name_ids = vec![u32::MAX; part.names.len()];
        let mut mapped = Vec::with_capacity(part.parent.len());
        mapped.push(0u32);
        for index in 1..part.parent.len() {
            let local = part.name[index] as usize;
            let name = match name_ids[local] {
                u32::MAX => {
                    let id = self.name_id(part.names.get(local).unwrap_or(""));
                    name_ids[local] = id;
                    id
                }
                id => id,
            };
            let node = self.child(mapped[part.parent[index] as usize], name);
            let value = part.self_value[index];
            if value != 0 {
                self.add_self(node, value);
            }
            mapped.push(node);
        }
        self.unnamed.extend(part.unnamed.iter().cloned());
    }
}

/// One dataset's share of a flame graph of one type: every frame of the stacks that
/// carry value, with its parent, name and self value, names in one buffer. It is what a
/// dataset contributes to every query with the same type and selector that covers the
/// whole dataset, at a small fraction of the decoded dataset's memory (its other types,
/// series, locations and unused symbols are gone), so [`crate::tree_cache`] keeps these
/// rather than decoded datasets for flame graphs. Nodes may repeat a (parent, name) pair
/// (two locations of one function); adding the share to a tree merges them.
#[derive(Debug, Default)]
pub struct DatasetTree {
    names: kiln_storage::strings::Strings,
    /// Per node (node 0 the root), parents before children.
    parent: Vec<u32>,
    name: Vec<u32>,
    self_value: Vec<i64>,
    /// [`Tree::unnamed`] of this share.
    unnamed: Vec<UnnamedBinary>,
}

impl DatasetTree {
    /// The share of `type_id` in `selection`. Each stack node becomes its location's
    /// frames under its parent's last frame; a dataset's string is copied once, however
    /// many frames name it.
    pub fn new(selection: &DatasetSelection, type_id: &str) -> DatasetTree {
        let mut tree = DatasetTree {
            parent: vec![0],
            name: vec![0],
            self_value: vec![0],
            ..Default::default()
        };
        let dataset = &selection.dataset;
        let Some(values) = selection
            .local_type(type_id)
            .and_then(|local| selection.values.get(local))
        else {
            return tree;
        };
        let names = FrameNames::new(dataset);
        let stack_count = dataset.stack_parent.len().min(values.len());
        // Which stack nodes carry value or lead to one: only those get tree nodes.
        let mut needed = vec![false; stack_count];
        for node in (1..stack_count).rev() {
            if values[node] != 0 || needed[node] {
                needed[node] = true;
                let parent = dataset.stack_parent[node] as usize;
                if parent != 0 && parent < stack_count {
                    needed[parent] = true;
                }
            }
        }
        let mut tree_node = vec![0u32; stack_count];
        // This tree's name of each of the dataset's strings, on first use; names that are
        // no string of the dataset (`[unknown]`, addresses) by text.
        let mut name_of_string = vec![u32::MAX; dataset.strings.len()];
        // Which mappings have frames shown unnamed: their binaries, once at the end.
        let mut unnamed_mappings = vec![false; dataset.mappings.len()];
        let mut other_names: HashMap<String, u32> = HashMap::new();
        // Parents precede children in the stack table, so one forward pass suffices.
        for node in 1..stack_count {
            if !needed[node] {
                continue;
            }
            let mut current = tree_node
                .get(dataset.stack_parent[node] as usize)
                .copied()
                .unwrap_or(0);
            names.for_each_frame_id(dataset.stack_location[node], |string, frame| {
                let name = match string.and_then(|id| name_of_string.get_mut(id as usize)) {
                    Some(known) if *known != u32::MAX => *known,
                    Some(unknown) => {
                        *unknown = tree.names.len() as u32;
                        tree.names.push(frame);
                        *unknown
                    }
                    None => match other_names.get(frame) {
                        Some(id) => *id,
                        None => {
                            let id = tree.names.len() as u32;
                            tree.names.push(frame);
                            other_names.insert(frame.to_string(), id);
                            id
                        }
                    },
                };
                tree.parent.push(current);
                tree.name.push(name);
                tree.self_value.push(0);
                current = (tree.parent.len() - 1) as u32;
            });
            if let Some(mapping) = names.unnamed_mapping(dataset.stack_location[node]) {
                unnamed_mappings[mapping as usize] = true;
            }
            tree_node[node] = current;
            if current != 0 {
                tree.self_value[current as usize] =
                    tree.self_value[current as usize].saturating_add(values[node]);
            }
        }
        tree.parent.shrink_to_fit();
        tree.name.shrink_to_fit();
        tree.self_value.shrink_to_fit();
        tree.unnamed = (0..unnamed_mappings.len() as u32)
            .filter(|m| unnamed_mappings[*m as usize])
            .filter_map(|m| names.binary(m))
            .collect();
        tree.unnamed.sort();
        tree.unnamed.dedup();
        tree
    }

    /// What this share holds in memory, for the cache's budget.
    pub fn heap_bytes(&self) -> usize {
        self.names.heap_bytes()
            + self
                .unnamed
                .iter()
                .map(|b| 48 + b.binary.len() + b.build_id.len())
                .sum::<usize>()
            + self.parent.len() * (2 * std::mem::size_of::<u32>() + std::mem::size_of::<i64>())
    }
}

#[cfg(test)]
impl DatasetTree {
    /// Adds a frame named `name` under the root, with self value 1.
    pub(crate) fn push_for_test(&mut self, name: &str) {
        if self.parent.is_empty() {
            self.parent.push(0);
            self.name.push(0);
            self.self_value.push(0);
        }
        self.parent.push(0);
        self.name.push(self.names.len() as u32);
        self.names.push(name);
        self.self_value.push(1);
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

/// A partial tree as one query node sends it to another ([`crate::root`]): every node
/// with its parent, name and self value, uncut, so that the parts add up exactly.
///
/// Layout: `KFT1`, then varints: the name count and each name (length, UTF-8 bytes), the
/// node count (the root included), and per node after the root its parent, its name and
/// its self value (zigzag). Parents precede children, as in the tree itself.
///
/// `KFT2` is the same followed by the unnamed binaries ([`Tree::unnamed`]): their count,
/// then per binary its file name and build id as names are written. It is sent only when
/// there are some, so that a node of the version before reads every other part.
pub fn encode_partial(tree: &FlameTree) -> Vec<u8> {
    let mut out = if tree.unnamed.is_empty() {
        b"KFT1".to_vec()
    } else {
        b"KFT2".to_vec()
    };
    encode_varint(tree.names.len() as u64, &mut out);
    for name in &tree.names {
        encode_varint(name.len() as u64, &mut out);
        out.extend_from_slice(name.as_bytes());
    }
    encode_varint(tree.nodes.len() as u64, &mut out);
    for node in tree.nodes.iter().skip(1) {
        encode_varint(u64::from(node.parent), &mut out);
        encode_varint(u64::from(node.name), &mut out);
        encode_varint(
            ((node.self_value << 1) ^ (node.self_value >> 63)) as u64,
            &mut out,
        );
    }
    if !tree.unnamed.is_empty() {
        encode_varint(tree.unnamed.len() as u64, &mut out);
        for text in tree.unnamed.iter().flat_map(|b| [&b.binary, &b.build_id]) {
            encode_varint(text.len() as u64, &mut out);
            out.extend_from_slice(text.as_bytes());
        }
    }
    out
}

/// Reads [`encode_partial`]'s bytes back, checking every reference: a part comes from
/// another process, and a bad one is an error, never a panic or a wrong tree.
pub fn decode_partial(bytes: &[u8]) -> Result<FlameTree, QueryError> {
    let bad = |what: &str| QueryError::Remote(format!("partial tree: {what}"));
    let (mut rest, binaries) = match bytes.split_at_checked(4) {
        Some((b"KFT1", rest)) => (rest, false),
        Some((b"KFT2", rest)) => (rest, true),
        _ => return Err(bad("no KFT1 or KFT2 magic")),
    };
    let next = |rest: &mut &[u8]| decode_varint(rest).map_err(|_| bad("truncated"));
    let text = |rest: &mut &[u8]| -> Result<String, QueryError> {
        let length = next(rest)? as usize;
        if length > rest.len() {
            return Err(bad("truncated name"));
        }
        let (name, after) = rest.split_at(length);
        *rest = after;
        Ok(String::from_utf8_lossy(name).into_owned())
    };
    let mut tree = FlameTree::default();
    let count = next(&mut rest)? as usize;
    // Capacities are bounded by the bytes there are: a count is only a claim.
    let mut names = Vec::with_capacity(count.min(rest.len()));
    for _ in 0..count {
        names.push(text(&mut rest)?);
    }
    let nodes = next(&mut rest)? as usize;
    // Ids in this tree of each received name, interned as they are first used.
    let mut interned: Vec<Option<u32>> = vec![None; names.len()];
    let mut mapped: Vec<u32> = Vec::with_capacity(nodes.min(rest.len()));
    mapped.push(0);
    for index in 1..nodes.max(1) {
        let parent = next(&mut rest)? as usize;
        let name = next(&mut rest)? as usize;
        let zigzag = next(&mut rest)?;
        let value = ((zigzag >> 1) as i64) ^ -((zigzag & 1) as i64);
        if parent >= index {
            return Err(bad("a parent after its child"));
        }
        let Some(text) = names.get(name) else {
            return Err(bad("name out of range"));
        };
        let id = match interned[name] {
            Some(id) => id,
            None => {
                let id = tree.name_id(text);
                interned[name] = Some(id);
                id
            }
        };
        let node = tree.child(mapped[parent], id);
        tree.add_self(node, value);
        mapped.push(node);
    }
    if binaries {
        for _ in 0..next(&mut rest)? {
            let binary = text(&mut rest)?;
            let build_id = text(&mut rest)?;
            tree.unnamed.insert(UnnamedBinary { binary, build_id });
        }
    }
    if !rest.is_empty() {
        return Err(bad("trailing bytes"));
    }
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(paths: &[(&[&str], i64)]) -> FlameTree {
        let mut tree = FlameTree::default();
        for (path, value) in paths {
            let mut node = 0;
            for frame in *path {
                let name = tree.name_id(frame);
                node = tree.child(node, name);
            }
            tree.add_self(node, *value);
        }
        tree
    }

    fn flat(tree: &FlameTree) -> Vec<(Vec<String>, i64)> {
        let mut out = Vec::new();
        for (index, node) in tree.nodes.iter().enumerate().skip(1) {
            let mut path = Vec::new();
            let mut at = index;
            while at != 0 {
                path.push(tree.names[tree.nodes[at].name as usize].clone());
                at = tree.nodes[at].parent as usize;
            }
            path.reverse();
            out.push((path, node.self_value));
        }
        out.sort();
        out
    }

    #[test]
    fn partial_trees_read_back_whole_and_add_up_to_the_tree_of_both() {
        let left = tree(&[(&["main", "a"], 5), (&["main", "b"], -3), (&["gc"], 7)]);
        let mut right = tree(&[(&["main", "a"], 2), (&["main", "c", "ü"], i64::MAX)]);
        for (binary, build_id) in [("libfoo.so", "ab12"), ("checkout", "")] {
            right.unnamed.insert(UnnamedBinary {
                binary: binary.into(),
                build_id: build_id.into(),
            });
        }
        let bytes = encode_partial(&left);
        assert!(
            bytes.starts_with(b"KFT1"),
            "no unnamed binaries: the older layout"
        );
        assert_eq!(flat(&decode_partial(&bytes).unwrap()), flat(&left));
        let mut merged = decode_partial(&bytes).unwrap();
        let right_bytes = encode_partial(&right);
        assert!(right_bytes.starts_with(b"KFT2"));
        merged.add_tree(&decode_partial(&right_bytes).unwrap(), |v| v);
        let mut whole = left.clone();
        whole.add_tree(&right, |v| v);
        assert_eq!(flat(&merged), flat(&whole));
        assert_eq!(merged.unnamed, right.unnamed);
        for end in 0..right_bytes.len() {
            assert!(decode_partial(&right_bytes[..end]).is_err(), "cut at {end}");
        }
        // Every cut and every corrupted byte is an error or a tree, never a panic.
        for end in 0..bytes.len() {
            assert!(decode_partial(&bytes[..end]).is_err(), "cut at {end}");
        }
        for index in 4..bytes.len() {
            let mut bad = bytes.clone();
            bad[index] ^= 0xff;
            let _ = decode_partial(&bad);
        }
        assert!(
            decode_partial(b"KFT1\x00\x02\x05\x00\x00").is_err(),
            "parent after child"
        );
    }
}

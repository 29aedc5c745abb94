//! The flame tree: a call tree keyed by frame name, merged across datasets.

use foldhash::{HashMap, HashMapExt};

use crate::select::DatasetSelection;
use crate::symbols::FrameNames;

pub const ROOT_NAME: &str = "total";
/// Name of the node that sums the children cut by `max_nodes`.
pub const OTHER_NAME: &str = "other";

#[derive(Debug, Clone)]
pub struct Node {
    pub name: u32,
    pub parent: u32,
    pub self_value: i64,
    pub total: i64,
    pub children: Vec<u32>,
}

/// Node 0 is the root; names are indexes into `names`.
#[derive(Debug, Clone)]
pub struct FlameTree {
    pub names: Vec<String>,
    name_ids: HashMap<String, u32>,
    pub nodes: Vec<Node>,
    child_index: HashMap<(u32, u32), u32>,
}

impl Default for FlameTree {
    fn default() -> Self {
        let mut tree = FlameTree {
            names: Vec::new(),
            name_ids: HashMap::new(),
            nodes: Vec::new(),
            child_index: HashMap::new(),
        };
        let root = tree.name_id(ROOT_NAME);
        tree.nodes.push(Node {
            name: root,
            parent: 0,
            self_value: 0,
            total: 0,
            children: Vec::new(),
        });
        tree
    }
}

impl FlameTree {
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
            self_value: 0,
            total: 0,
            children: Vec::new(),
        });
        self.nodes[parent as usize].children.push(id);
        self.child_index.insert((parent, name), id);
        id
    }

    pub fn total(&self) -> i64 {
        self.nodes[0].total
    }

    /// Adds one dataset's values of local type `local_type`. Each stack node is resolved to
    /// a tree node once, from its parent's tree node, so names are looked up once per
    /// distinct stack prefix rather than once per sample.
    pub fn add_selection(&mut self, selection: &DatasetSelection, local_type: usize) {
        let dataset = &selection.dataset;
        let Some(values) = selection.values.get(local_type) else {
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

    /// Computes every node's total from the self values (children come after parents).
    pub fn compute_totals(&mut self) {
        for node in &mut self.nodes {
            node.total = node.self_value;
        }
        for index in (1..self.nodes.len()).rev() {
            let total = self.nodes[index].total;
            let parent = self.nodes[index].parent as usize;
            self.nodes[parent].total = self.nodes[parent].total.saturating_add(total);
        }
    }

    /// Keeps the `max_nodes` nodes of largest total (never hiding a node larger than one
    /// kept) and sums the rest under one `other` child per parent, so totals still add up.
    pub fn truncate(&self, max_nodes: usize) -> FlameTree {
        if max_nodes == 0 || self.nodes.len() <= max_nodes {
            return self.clone();
        }
        let mut depth = vec![0u32; self.nodes.len()];
        for index in 1..self.nodes.len() {
            depth[index] = depth[self.nodes[index].parent as usize] + 1;
        }
        let mut order: Vec<u32> = (0..self.nodes.len() as u32).collect();
        // Parents sort before their children: larger-or-equal total and smaller depth.
        order.sort_by(|a, b| {
            let (a, b) = (*a as usize, *b as usize);
            self.nodes[b]
                .total
                .cmp(&self.nodes[a].total)
                .then(depth[a].cmp(&depth[b]))
                .then(a.cmp(&b))
        });
        let mut keep = vec![false; self.nodes.len()];
        for index in order.iter().take(max_nodes) {
            keep[*index as usize] = true;
        }
        let mut out = FlameTree::default();
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
                out.nodes[id as usize].self_value = out.nodes[id as usize]
                    .self_value
                    .saturating_add(node.self_value);
                mapped[index] = id;
            } else {
                let id = out.child(parent, other);
                out.nodes[id as usize].self_value =
                    out.nodes[id as usize].self_value.saturating_add(node.total);
            }
        }
        out.nodes[0].self_value = self.nodes[0].self_value;
        out.compute_totals();
        out
    }
}

/// Builds the merged tree of one type id from all selections.
pub fn build_tree(selections: &[DatasetSelection], type_id: &str) -> FlameTree {
    let mut tree = FlameTree::default();
    for selection in selections {
        if let Some(local) = selection.types.iter().position(|(id, _)| id == type_id) {
            tree.add_selection(selection, local);
        }
    }
    tree.compute_totals();
    tree
}

//! The merged call tree, as the querier's `SelectMergeStacktraces` gives it (the
//! flamebearer layout), read back into nodes: for the top table, the text flame graph and
//! a profile's summary.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::{int, Target};
use crate::api::{self, Api, ApiRequest, ToolError};

#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub total: i64,
    pub self_value: i64,
    pub children: Vec<usize>,
}

/// Nodes, the root (every stack's sum, named "total") first.
#[derive(Debug, Clone)]
pub struct Tree {
    pub nodes: Vec<Node>,
}

/// A function's self and total in a tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    pub self_value: i64,
    pub total: i64,
}

impl Tree {
    pub fn total(&self) -> i64 {
        self.nodes.first().map_or(0, |root| root.total)
    }

    /// Reads the flamebearer layout: per level, quadruples of (x offset from the previous
    /// node's end, total, self, name index); a node's parent is the node of the level
    /// above whose span holds its start.
    pub fn from_flamebearer(graph: &Value) -> Result<Tree, String> {
        let names: Vec<&str> = graph["names"]
            .as_array()
            .ok_or("no names")?
            .iter()
            .map(|name| name.as_str().unwrap_or(""))
            .collect();
        let levels = graph["levels"].as_array().ok_or("no levels")?;
        let mut nodes: Vec<Node> = Vec::new();
        // The previous level's nodes: (start, end, index).
        let mut above: Vec<(i64, i64, usize)> = Vec::new();
        for (depth, level) in levels.iter().enumerate() {
            let values: Vec<i64> = level["values"]
                .as_array()
                .or_else(|| level.as_array())
                .ok_or("a level without values")?
                .iter()
                .map(int)
                .collect();
            if !values.len().is_multiple_of(4) {
                return Err(format!("level {depth} has {} values", values.len()));
            }
            let mut here = Vec::with_capacity(values.len() / 4);
            let mut x = 0i64;
            let mut parent_at = 0usize;
            for quad in values.chunks_exact(4) {
                let (offset, total, self_value, name) = (quad[0], quad[1], quad[2], quad[3]);
                x += offset;
                let name = usize::try_from(name)
                    .ok()
                    .and_then(|i| names.get(i))
                    .ok_or_else(|| format!("name index {name} out of range"))?;
                let index = nodes.len();
                nodes.push(Node {
                    name: (*name).to_string(),
                    total,
                    self_value,
                    children: Vec::new(),
                });
                if depth > 0 {
                    while parent_at < above.len() && above[parent_at].1 <= x {
                        parent_at += 1;
                    }
                    let (start, _, parent) = *above
                        .get(parent_at)
                        .ok_or_else(|| format!("a node at level {depth} without a parent"))?;
                    if start > x {
                        return Err(format!("a node at level {depth} without a parent"));
                    }
                    nodes[parent].children.push(index);
                }
                here.push((x, x + total, index));
                x += total;
            }
            above = here;
        }
        if nodes.is_empty() {
            nodes.push(Node {
                name: "total".into(),
                total: 0,
                self_value: 0,
                children: Vec::new(),
            });
        }
        Ok(Tree { nodes })
    }

    /// Every function's self, and its total counted once per stack (a recursive call
    /// does not count twice), largest self first.
    pub fn functions(&self) -> Vec<Function> {
        let mut sums: HashMap<&str, (i64, i64)> = HashMap::new();
        let mut on_path: HashMap<&str, usize> = HashMap::new();
        // Depth-first, with an explicit stack: (node, entering).
        let mut stack = vec![(0usize, true)];
        while let Some((index, entering)) = stack.pop() {
            let node = &self.nodes[index];
            let name = node.name.as_str();
            if index == 0 {
                if entering {
                    stack.extend(node.children.iter().rev().map(|child| (*child, true)));
                }
                continue;
            }
            if entering {
                let entry = sums.entry(name).or_default();
                entry.0 += node.self_value;
                let depth = on_path.entry(name).or_default();
                if *depth == 0 {
                    entry.1 += node.total;
                }
                *depth += 1;
                stack.push((index, false));
                stack.extend(node.children.iter().rev().map(|child| (*child, true)));
            } else if let Some(depth) = on_path.get_mut(name) {
                *depth -= 1;
            }
        }
        let mut functions: Vec<Function> = sums
            .into_iter()
            .map(|(name, (self_value, total))| Function {
                name: name.to_string(),
                self_value,
                total,
            })
            .collect();
        functions.sort_by(|a, b| {
            b.self_value
                .cmp(&a.self_value)
                .then(b.total.cmp(&a.total))
                .then_with(|| a.name.cmp(&b.name))
        });
        functions
    }
}

/// The merged tree of a selection, whole (no node cut by the server), optionally of one
/// profile only.
pub async fn merged(
    api: &impl Api,
    target: &Target,
    profile_ids: &[String],
) -> Result<Tree, ToolError> {
    let mut body = target.query();
    // -1: every node, so that the sums here are the API's own, not those of a cut tree.
    body.insert("maxNodes".into(), json!("-1"));
    if !profile_ids.is_empty() {
        body.insert("profileIdSelector".into(), json!(profile_ids));
    }
    let path = "/querier.v1.QuerierService/SelectMergeStacktraces";
    let answer = api::json(api, ApiRequest::post(path, Value::Object(body))).await?;
    Tree::from_flamebearer(&answer["flamegraph"]).map_err(|message| ToolError::Unexpected {
        path: path.into(),
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// main → a (self 3) → b (self 2); main → b (self 5); a recursive: a → a.
    fn sample() -> Tree {
        Tree::from_flamebearer(&json!({
            "names": ["total", "main", "a", "b"],
            "levels": [
                { "values": ["0", "10", "0", "0"] },
                { "values": ["0", "10", "0", "1"] },
                { "values": ["0", "5", "2", "2", "0", "5", "5", "3"] },
                { "values": ["0", "2", "2", "3", "0", "1", "1", "2"] },
            ],
        }))
        .unwrap()
    }

    #[test]
    fn levels_become_a_tree() {
        let tree = sample();
        assert_eq!(tree.total(), 10);
        let main = &tree.nodes[tree.nodes[0].children[0]];
        assert_eq!(main.name, "main");
        let kids: Vec<&str> = main
            .children
            .iter()
            .map(|c| tree.nodes[*c].name.as_str())
            .collect();
        assert_eq!(kids, ["a", "b"]);
        let a = &tree.nodes[main.children[0]];
        let grandkids: Vec<&str> = a
            .children
            .iter()
            .map(|c| tree.nodes[*c].name.as_str())
            .collect();
        assert_eq!(grandkids, ["b", "a"]);
    }

    #[test]
    fn a_recursive_function_counts_once_in_its_total() {
        let functions = sample().functions();
        let get = |name: &str| functions.iter().find(|f| f.name == name).unwrap().clone();
        assert_eq!((get("b").self_value, get("b").total), (7, 7));
        assert_eq!((get("a").self_value, get("a").total), (3, 5));
        assert_eq!((get("main").self_value, get("main").total), (0, 10));
        assert_eq!(functions[0].name, "b");
    }

    #[test]
    fn broken_layouts_are_errors() {
        assert!(Tree::from_flamebearer(
            &json!({ "names": ["total"], "levels": [{ "values": ["0", "1", "0"] }] })
        )
        .is_err());
        assert!(Tree::from_flamebearer(
            &json!({ "names": ["total"], "levels": [{ "values": ["0", "1", "0", "7"] }] })
        )
        .is_err());
    }
}

//! `SelectMergeStacktraces`, `SelectMergeSpanProfile` and `SelectMergeProfile`: the
//! matching profiles merged into one flame graph, Pyroscope tree or pprof.

use prost::encoding::{decode_varint, encode_varint};

use crate::api::{FlameGraph, Level};
use crate::flamebearer::flamebearer;
use crate::select::{SelectRequest, TypeFilter};
use crate::tree::FlameTree;
use crate::QueryError;

/// Nodes kept when the client names no `max_nodes`, as Pyroscope's default.
pub const DEFAULT_MAX_NODES: usize = 8192;

/// `max_nodes` as the API gives it: absent or 0 means the default, negative means all.
pub fn max_nodes(requested: Option<i64>) -> usize {
    match requested {
        None | Some(0) => DEFAULT_MAX_NODES,
        Some(count) if count < 0 => 0,
        Some(count) => usize::try_from(count).unwrap_or(usize::MAX),
    }
}

/// The one profile type id a merge query asks for.
pub fn exact_type(request: &SelectRequest) -> Result<&str, QueryError> {
    match &request.types {
        TypeFilter::Exact(type_id) => Ok(type_id),
        _ => Err(QueryError::BadRequest(
            "a merge query needs one profile type id".to_string(),
        )),
    }
}

/// The tree cut to `max_nodes` (0 keeps every node).
pub fn cut(tree: FlameTree, max_nodes: usize) -> FlameTree {
    if max_nodes == 0 {
        tree
    } else {
        tree.truncate(max_nodes)
    }
}

/// The API's flame graph: the flamebearer layout, levels wrapped as messages.
pub fn flame_graph(tree: &FlameTree) -> FlameGraph {
    let layout = flamebearer(tree);
    FlameGraph {
        names: layout.names,
        levels: layout
            .levels
            .into_iter()
            .map(|values| Level { values })
            .collect(),
        total: layout.num_ticks,
        max_self: layout.max_self,
        unnamed_binaries: layout.unnamed_binaries,
    }
}

/// Pyroscope's serialized tree (`PROFILE_FORMAT_TREE`): nodes in depth-first pre-order,
/// each as varint name length, name bytes, varint self value, varint child count. The
/// first node is a nameless virtual root whose children are the outermost frames.
pub fn tree_bytes(tree: &FlameTree) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stack = vec![0u32];
    while let Some(index) = stack.pop() {
        let node = &tree.nodes[index as usize];
        let name = if index == 0 {
            ""
        } else {
            tree.names[node.name as usize].as_str()
        };
        let children: Vec<u32> = node
            .children
            .iter()
            .copied()
            .filter(|child| tree.nodes[*child as usize].total != 0)
            .collect();
        encode_varint(name.len() as u64, &mut out);
        out.extend_from_slice(name.as_bytes());
        encode_varint(node.self_value.max(0) as u64, &mut out);
        encode_varint(children.len() as u64, &mut out);
        stack.extend(children.iter().rev());
    }
    out
}

/// Reads Pyroscope's tree bytes back ([`tree_bytes`]): every node but the virtual root,
/// as (frame names from the outermost, self value), in the order written.
pub fn read_tree_bytes(bytes: &[u8]) -> Result<Vec<(Vec<String>, i64)>, QueryError> {
    fn varint(rest: &mut &[u8]) -> Result<u64, QueryError> {
        decode_varint(rest)
            .map_err(|err| QueryError::BadRequest(format!("invalid varint in tree: {err}")))
    }
    let mut nodes = Vec::new();
    let mut rest = bytes;
    // (path, children still to read) of each open node; the first node is the root.
    let mut open: Vec<(Vec<String>, u64)> = Vec::new();
    let mut first = true;
    while !rest.is_empty() {
        let length = usize::try_from(varint(&mut rest)?).unwrap_or(usize::MAX);
        let name = rest
            .get(..length)
            .ok_or_else(|| QueryError::BadRequest("truncated tree name".to_string()))?;
        rest = &rest[length..];
        let self_value = varint(&mut rest)? as i64;
        let children = varint(&mut rest)?;
        let mut path = match open.last_mut() {
            Some((path, remaining)) => {
                *remaining -= 1;
                path.clone()
            }
            None => Vec::new(),
        };
        if !first {
            path.push(String::from_utf8_lossy(name).into_owned());
            nodes.push((path.clone(), self_value));
        }
        first = false;
        open.push((path, children));
        while open.last().is_some_and(|(_, remaining)| *remaining == 0) {
            open.pop();
        }
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> FlameTree {
        let mut tree = FlameTree::default();
        let main = tree.name_id("main");
        let work = tree.name_id("work");
        let main_node = tree.child(0, main);
        let work_node = tree.child(main_node, work);
        tree.nodes[main_node as usize].self_value = 2;
        tree.nodes[work_node as usize].self_value = 300;
        tree.compute_totals();
        tree
    }

    #[test]
    fn tree_bytes_are_preorder_with_child_counts() {
        let bytes = tree_bytes(&tree());
        let mut expected = vec![0, 0, 1]; // virtual root: no name, self 0, one child
        expected.extend_from_slice(&[4, b'm', b'a', b'i', b'n', 2, 1]);
        expected.extend_from_slice(&[4, b'w', b'o', b'r', b'k', 0xac, 0x02, 0]);
        assert_eq!(bytes, expected);
        let names = |path: &[&str]| path.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            read_tree_bytes(&bytes).unwrap(),
            vec![(names(&["main"]), 2), (names(&["main", "work"]), 300)]
        );
        assert!(read_tree_bytes(&bytes[..bytes.len() - 2]).is_err());
    }

    #[test]
    fn flame_graph_levels_come_in_fours() {
        let graph = flame_graph(&tree());
        assert_eq!(graph.total, 302);
        assert_eq!(graph.max_self, 300);
        assert_eq!(graph.levels.len(), 3);
        for level in &graph.levels {
            assert_eq!(level.values.len() % 4, 0);
        }
        assert_eq!(graph.levels[2].values[1..3], [300, 300]);
    }

    #[test]
    fn max_nodes_follows_the_api() {
        assert_eq!(max_nodes(None), DEFAULT_MAX_NODES);
        assert_eq!(max_nodes(Some(0)), DEFAULT_MAX_NODES);
        assert_eq!(max_nodes(Some(-1)), 0);
        assert_eq!(max_nodes(Some(10)), 10);
    }
}

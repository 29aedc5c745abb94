//! `flame_graph`: the hot paths of a selection's merged profile as an indented text tree,
//! cut to a node budget, every cut subtree summed into an explicit "… more" line so the
//! shares always add up. Focused on one function, the tree of its callees and the
//! inverted tree of its callers.

use std::collections::BinaryHeap;

use serde_json::Value;

use super::tree::{merged, Node, Tree};
use super::{target, tool, Args};
use crate::api::{Api, ToolError};
use crate::budget::{tokens_for, Answer};
use crate::units::{human, percent};

const DEFAULT_NODES: usize = 60;
/// The smallest node shown on its own, as a share of the whole (pprof's default
/// `nodefraction`): a flat profile of thousands of 0.01 % functions is summed into one
/// line rather than listed sixty at a time.
const MIN_SHARE: f64 = 0.005;
/// Longest function name written; longer ones are cut with an ellipsis.
const MAX_NAME: usize = 160;

pub fn definition() -> Value {
    let mut properties = super::where_properties();
    properties.push((
        "max_nodes",
        super::integer(
            "Nodes shown at most (default 60); the rest are summed into \"… more\" lines",
            1,
            2000,
        ),
    ));
    properties.push((
        "focus",
        super::string(
            "A function name: show its callees and its callers instead of the whole tree",
        ),
    ));
    tool(
        "flame_graph",
        "Flame graph as text",
        "The hot call paths of a service or selection as an indented tree, largest first: each line is a function's share of the whole (its total, with callees) and its self share. Chains of single calls are joined with →. Subtrees beyond max_nodes, and those under 0.5 % of the whole, are summed into \"… N more\" lines. With focus, the callees of that function and, inverted, its callers.",
        properties,
        &[],
    )
}

pub async fn run(api: &impl Api, args: &Args<'_>) -> Result<String, ToolError> {
    let max_nodes = args.count("max_nodes", DEFAULT_NODES, 2000)?;
    let focus = args.str("focus").map(str::to_string);
    let target = target(api, args).await?;
    let tree = merged(api, &target, &[]).await?;
    let whole = tree.total() as f64;
    let kind = target.kind();
    let mut answer = Answer::new(tokens_for(max_nodes, DEFAULT_NODES));
    answer.line(format!(
        "flame graph of {}: total {}; lines are share of the total (self share)",
        target.header(),
        human(whole, &kind, Some(target.range.span_ns()))
    ));
    match &focus {
        None => render(&tree, 0, max_nodes, whole, &mut answer),
        Some(function) => {
            let (callees, callers) = focused(&tree, function);
            if callees.total() == 0 {
                let mut names: Vec<&str> = tree.nodes.iter().map(|n| n.name.as_str()).collect();
                names.sort_unstable();
                names.dedup();
                let hint = match super::closest(function, &names) {
                    Some(close) => format!("; did you mean '{close}'?"),
                    None => "; top_functions names the functions there are".into(),
                };
                return Err(ToolError::Empty(format!(
                    "no function {function:?} in {}{hint}",
                    target.header()
                )));
            }
            answer.line(format!(
                "{function}: total {} of the whole; its callees:",
                percent(callees.total() as f64, whole)
            ));
            render(&callees, 0, max_nodes.div_ceil(2), whole, &mut answer);
            answer.line(format!(
                "{function}: its callers (inverted, callers below):"
            ));
            render(&callers, 0, max_nodes / 2 + 1, whole, &mut answer);
        }
    }
    let focus_param = focus.unwrap_or_default();
    let mut extra = vec![("view", "flamegraph")];
    if !focus_param.is_empty() {
        extra.push(("focus", focus_param.as_str()));
    }
    answer.line(format!("ui: {}", target.link(api, &extra)));
    Ok(answer.finish())
}

/// Writes the tree below `root`, at most `budget` nodes, the largest first: a node is
/// shown only after its parent, and what is not shown under a shown node is one line.
fn render(tree: &Tree, root: usize, budget: usize, whole: f64, answer: &mut Answer) {
    // Choose: the largest nodes whose parents are chosen.
    let mut chosen = vec![false; tree.nodes.len()];
    chosen[root] = true;
    let floor = (whole * MIN_SHARE).ceil() as i64;
    let mut heap: BinaryHeap<(i64, std::cmp::Reverse<usize>)> = tree.nodes[root]
        .children
        .iter()
        .map(|c| (tree.nodes[*c].total, std::cmp::Reverse(*c)))
        .filter(|(total, _)| *total >= floor)
        .collect();
    let mut count = 0;
    while let Some((_, std::cmp::Reverse(index))) = heap.pop() {
        if count == budget {
            break;
        }
        chosen[index] = true;
        count += 1;
        heap.extend(
            tree.nodes[index]
                .children
                .iter()
                .map(|c| (tree.nodes[*c].total, std::cmp::Reverse(*c)))
                .filter(|(total, _)| *total >= floor),
        );
    }
    let mut stopped = false;
    write(tree, root, 0, &chosen, whole, answer, &mut stopped);
}

fn write(
    tree: &Tree,
    index: usize,
    depth: usize,
    chosen: &[bool],
    whole: f64,
    answer: &mut Answer,
    stopped: &mut bool,
) {
    // Join the chain of single, whole calls below this node: a → b → c.
    let mut chain = vec![index];
    let mut last = index;
    loop {
        let node = &tree.nodes[last];
        let kept: Vec<usize> = node
            .children
            .iter()
            .copied()
            .filter(|c| chosen[*c])
            .collect();
        match kept.as_slice() {
            [only]
                if node.self_value == 0
                    && tree.nodes[*only].total == node.total
                    && node.children.len() == 1 =>
            {
                chain.push(*only);
                last = *only;
            }
            _ => break,
        }
    }
    let node: &Node = &tree.nodes[last];
    let names: Vec<String> = chain.iter().map(|i| short(&tree.nodes[*i].name)).collect();
    let mut line = format!(
        "{}{} {}",
        "  ".repeat(depth),
        percent(tree.nodes[index].total as f64, whole),
        names.join(" → ")
    );
    if node.self_value > 0 {
        line.push_str(&format!(
            " (self {})",
            percent(node.self_value as f64, whole)
        ));
    }
    if *stopped || !answer.row(&line) {
        *stopped = true;
        return;
    }
    let mut kept: Vec<usize> = node
        .children
        .iter()
        .copied()
        .filter(|c| chosen[*c])
        .collect();
    kept.sort_by(|a, b| tree.nodes[*b].total.cmp(&tree.nodes[*a].total));
    for child in &kept {
        write(tree, *child, depth + 1, chosen, whole, answer, stopped);
        if *stopped {
            break;
        }
    }
    let (cut, weight) = node
        .children
        .iter()
        .filter(|c| !chosen[**c])
        .fold((0usize, 0i64), |(n, w), c| {
            (n + 1, w + tree.nodes[*c].total)
        });
    if *stopped {
        return;
    }
    if cut > 0 {
        // Much weight in many small callees: a ranking says more than their tree.
        let hint = if weight as f64 >= 0.1 * whole && cut > 10 {
            " (each under 0.5 %: top_functions ranks them)"
        } else {
            ""
        };
        answer.line(format!(
            "{}{} … {cut} more {}{hint}",
            "  ".repeat(depth + 1),
            percent(weight as f64, whole),
            if cut == 1 { "callee" } else { "callees" }
        ));
    }
}

fn short(name: &str) -> String {
    if name.chars().count() <= MAX_NAME {
        name.to_string()
    } else {
        let cut: String = name.chars().take(MAX_NAME - 1).collect();
        format!("{cut}…")
    }
}

/// The callees of `function` merged from each of its outermost calls, and its callers
/// inverted (the function at the root, its callers below it), weighted by its totals.
fn focused(tree: &Tree, function: &str) -> (Tree, Tree) {
    let mut callees = Tree {
        nodes: vec![node(function)],
    };
    let mut callers = Tree {
        nodes: vec![node(function)],
    };
    // Depth-first with the path from the root.
    let mut stack: Vec<(usize, usize)> = vec![(0, 0)];
    let mut path: Vec<usize> = Vec::new();
    while let Some((index, depth)) = stack.pop() {
        path.truncate(depth);
        let here = &tree.nodes[index];
        if index != 0 && here.name == function {
            graft(tree, index, &mut callees, 0);
            let mut at = 0;
            callers.nodes[0].total += here.total;
            for caller in path.iter().rev().filter(|i| **i != 0) {
                at = child(&mut callers, at, &tree.nodes[*caller].name);
                callers.nodes[at].total += here.total;
            }
            continue; // an inner call of it is inside this one's callees
        }
        path.push(index);
        stack.extend(here.children.iter().rev().map(|c| (*c, depth + 1)));
    }
    (callees, callers)
}

fn node(name: &str) -> Node {
    Node {
        name: name.to_string(),
        total: 0,
        self_value: 0,
        children: Vec::new(),
    }
}

/// The child of `at` named `name`, made when missing.
fn child(tree: &mut Tree, at: usize, name: &str) -> usize {
    if let Some(found) = tree.nodes[at]
        .children
        .iter()
        .copied()
        .find(|c| tree.nodes[*c].name == name)
    {
        return found;
    }
    let index = tree.nodes.len();
    tree.nodes.push(node(name));
    tree.nodes[at].children.push(index);
    index
}

/// Adds the subtree of `from` in `source` to `at` in `target`, merging by name.
fn graft(source: &Tree, from: usize, target: &mut Tree, at: usize) {
    let mut work = vec![(from, at)];
    while let Some((from, at)) = work.pop() {
        let node = &source.nodes[from];
        target.nodes[at].total += node.total;
        target.nodes[at].self_value += node.self_value;
        for c in &node.children {
            let into = child(target, at, &source.nodes[*c].name);
            work.push((*c, into));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Tree {
        // total 100: main 100 → a 60 (self 10) → c 50; main → b 40 (self 40). a → c.
        Tree::from_flamebearer(&json!({
            "names": ["total", "main", "a", "b", "c"],
            "levels": [
                { "values": [0, 100, 0, 0] },
                { "values": [0, 100, 0, 1] },
                { "values": [0, 60, 10, 2, 0, 40, 40, 3] },
                { "values": [0, 50, 50, 4] },
            ],
        }))
        .unwrap()
    }

    #[test]
    fn a_cut_tree_says_what_it_cut_and_shares_add_up() {
        let tree = sample();
        let mut answer = Answer::new(2000);
        render(&tree, 0, 2, 100.0, &mut answer);
        let text = answer.finish();
        assert_eq!(
            text,
            "100.00 % total → main\n  60.00 % a (self 10.00 %)\n    50.00 % … 1 more callee\n  40.00 % … 1 more callee\n"
        );
    }

    #[test]
    fn focus_gives_callees_and_inverted_callers() {
        let (callees, callers) = focused(&sample(), "a");
        assert_eq!((callees.total(), callees.nodes[0].self_value), (60, 10));
        assert_eq!(callees.nodes[callees.nodes[0].children[0]].name, "c");
        let main = &callers.nodes[callers.nodes[0].children[0]];
        assert_eq!((main.name.as_str(), main.total), ("main", 60));
    }
}

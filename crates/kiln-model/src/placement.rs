//! Which node owns a piece of work: rendezvous (highest random weight) hashing over the
//! live nodes. Every node computes the same owner from the same membership with no
//! coordination, and when a node joins or leaves only the keys it wins or held move,
//! about 1/N of them, where a modulo hash would move nearly all.
//!
//! The weight is FNV-1a over the node and the key, finished by splitmix64's mixer: written
//! here because it must give the same answer in every Kiln process of every version, which
//! `std`'s and foldhash's hashers do not promise.

/// The node, among `nodes`, that owns `key`; `None` when there is none.
pub fn owner<'a>(key: &str, nodes: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    nodes
        .into_iter()
        .max_by_key(|node| (weight(node, key), *node))
}

fn weight(node: &str, key: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in node.bytes().chain([0xff]).chain(key.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // splitmix64's finalizer: FNV's low bits are weak, and the maximum reads them all.
    hash ^= hash >> 30;
    hash = hash.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash ^= hash >> 27;
    hash = hash.wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_spread_evenly_and_a_new_node_takes_about_its_share() {
        let three = ["node-a:4040", "node-b:4040", "node-c:4040"];
        let four = ["node-a:4040", "node-b:4040", "node-c:4040", "node-d:4040"];
        let keys: Vec<String> = (0..12_000).map(|i| format!("tenant/service-{i}")).collect();
        let mut per_node = [0usize; 3];
        let mut moved = 0;
        for key in &keys {
            let before = owner(key, three).unwrap();
            per_node[three.iter().position(|n| *n == before).unwrap()] += 1;
            let after = owner(key, four).unwrap();
            if after != before {
                // Only to the new node, never between the old ones.
                assert_eq!(after, "node-d:4040");
                moved += 1;
            }
        }
        for count in per_node {
            assert!((3_600..4_400).contains(&count), "{per_node:?}");
        }
        // About a quarter moves to the fourth node.
        assert!((2_600..3_400).contains(&moved), "{moved}");
        // The answer does not depend on the order the nodes are listed in.
        assert_eq!(owner("k", ["b", "a"]), owner("k", ["a", "b"]));
        assert_eq!(owner("k", []), None);
    }
}

//! The one way the read path sizes an in-memory cache by weight.

/// A cache of `capacity` by weight, scan-resistant (quick_cache's policy), in one shard:
/// quick_cache splits the capacity between its shards (several per core, down to 32
/// expected entries each) and keeps nothing heavier than one shard's part, and a week of
/// one service decodes to more than that would be. Lookups are not where queries wait.
pub(crate) fn weighed_cache<K, V, W>(
    capacity: u64,
    typical_entry: u64,
    weighter: W,
) -> quick_cache::sync::Cache<K, V, W>
where
    K: Eq + std::hash::Hash,
    V: Clone,
    W: quick_cache::Weighter<K, V> + Clone,
{
    let items = usize::try_from(capacity / typical_entry.max(1)).unwrap_or(usize::MAX);
    let options = quick_cache::OptionsBuilder::new()
        .estimated_items_capacity(items.max(16))
        .weight_capacity(capacity.max(1))
        .shards(1)
        .build();
    match options {
        Ok(options) => quick_cache::sync::Cache::with_options(
            options,
            weighter,
            Default::default(),
            Default::default(),
        ),
        Err(_) => quick_cache::sync::Cache::with_weighter(items.max(16), capacity.max(1), weighter),
    }
}

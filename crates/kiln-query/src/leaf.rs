//! The leaf of a query: one part of it, run over data this node reads itself.
//!
//! [`crate::root`] plans a query and splits it; each part, here or on a peer (through
//! `/api/v1/partial/*`), runs one of these over the datasets it was given. A leaf knows
//! nothing of other nodes: it reads, folds and returns a part that adds up with the others
//! (an uncut tree, a pprof, unfinished series).

use kiln_model::pprof::Profile;

use crate::pprof_export::PprofMerge;
use std::sync::Arc;

use kiln_metastore::DatasetMeta;

use crate::select::{DatasetSelection, Querier, SelectRequest};
use crate::series::{PartialSeries, SeriesBuilder, SeriesOptions};
use crate::tree::DatasetTree;
use crate::tree::FlameTree;
use crate::tree_cache::TreeKey;
use crate::QueryError;

/// The tree of the request's datasets read here (totals not yet computed).
pub async fn local_tree(
    querier: &Querier,
    request: &SelectRequest,
) -> Result<FlameTree, QueryError> {
    let type_id = crate::merge::exact_type(request)?;
    // Each dataset's share is folded into the tree as it comes and dropped (a month of
    // blocks is never in memory at once), or kept for the next flame graph of this shape
    // (crate::tree_cache).
    let mut tree = FlameTree::default();
    let request = SelectRequest {
        values_only: true,
        ..request.clone()
    };
    fold_dataset_trees(querier, &request, type_id, |share| {
        tree.add_dataset_tree(share)
    })
    .await?;
    Ok(tree)
}

/// The merged pprof of the request's datasets read here.
pub async fn local_profile(
    querier: &Querier,
    request: &SelectRequest,
) -> Result<Profile, QueryError> {
    let type_id = crate::merge::exact_type(request)?;
    // Folded as each dataset comes, as the flame graph is: a month is never held at once.
    let mut merge = PprofMerge::new(&[type_id.to_string()]);
    // The profiles' rows too: the merged profile spans their times.
    let request = SelectRequest {
        values_only: false,
        ..request.clone()
    };
    querier
        .select_each(&request, |selection| merge.add(&selection))
        .await?;
    Ok(merge.finish())
}

/// The request's series over the datasets read here, not yet finished: sums, counts and
/// the best exemplars per bucket.
pub async fn local_series(
    querier: &Querier,
    request: &SelectRequest,
    options: &SeriesOptions,
) -> Result<PartialSeries, QueryError> {
    let mut builder = SeriesBuilder::new(options)?;
    // The profiles' rows: each is a point's time.
    let request = SelectRequest {
        per_sample: request.per_sample || options.span_exemplars,
        values_only: false,
        ..request.clone()
    };
    querier
        .select_each(&request, |selection| builder.add(&selection))
        .await?;
    Ok(builder.into_partial())
}

/// Every matching dataset's share of the flame graph of `type_id`, handed to `each`
/// in dataset order: kept shares where the query covers their dataset whole, else
/// read, aggregated and kept for the next query of the same shape.
pub async fn fold_dataset_trees(
    querier: &Querier,
    request: &SelectRequest,
    type_id: &str,
    mut each: impl FnMut(&DatasetTree),
) -> Result<(), QueryError> {
    let trees = querier.trees();
    let shape = Arc::new((
        request.tenant.clone(),
        type_id.to_string(),
        request.selector.to_string(),
    ));
    let generation = querier.names_generation();
    let key = move |meta: &DatasetMeta| {
        TreeKey::new(
            meta.object_key.clone(),
            meta.row_group,
            shape.clone(),
            generation,
        )
    };
    let metrics = querier.metrics().clone();
    let lookup = {
        let (trees, key, metrics) = (trees.clone(), key.clone(), metrics.clone());
        move |meta: &DatasetMeta| {
            // Only a dataset the query covers whole can have a share that serves it.
            if !request.summable(meta.min_time_nanos, meta.max_time_nanos) {
                return None;
            }
            let hit = trees.get(&key(meta), |min, max| request.summable(min, max))?;
            metrics.share_reused();
            Some(hit)
        }
    };
    let type_id = type_id.to_string();
    let pending_in = querier.clone();
    let names_pending =
        move |meta: &DatasetMeta| pending_in.names_pending(&meta.object_key, meta.row_group);
    let build = move |meta: &DatasetMeta, request: &SelectRequest, selection: DatasetSelection| {
        let tree = Arc::new(DatasetTree::new(&selection, &type_id));
        let dataset = &selection.dataset;
        if request.summable(dataset.min_time_nanos, dataset.max_time_nanos) && !names_pending(meta)
        {
            trees.insert(
                key(meta),
                &tree,
                dataset.min_time_nanos,
                dataset.max_time_nanos,
            );
            metrics.tree_cache_holds(trees.bytes());
        }
        Some(tree)
    };
    querier
        .select_map(request, lookup, build, |tree| each(&tree))
        .await
}

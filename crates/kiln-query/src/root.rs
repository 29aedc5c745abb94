//! The root of a query: plan, split by block over the live query nodes, merge.
//!
//! A flame graph, a merged pprof and a series' buckets (sums and counts) are sums over
//! datasets, so any partition of a query's datasets gives parts that add up to the whole. The node a client asked lists the datasets (one
//! metastore query), and when they hold more than `min_profiles` profiles and other query
//! nodes are live, it splits their blocks into one share per node, balanced by profile
//! count: its own share it runs itself, each other share it sends as a [`PartialQuery`]
//! (the request with the share's datasets as listed, so that a compaction between the
//! listing and the share's reading cannot hide them: replaced objects stay readable for
//! the grace period). Parts come back as uncut trees
//! ([`crate::tree::encode_partial`]), pprof or unfinished series, and are added up, so
//! the result is what one node would have built, exactly. A query found too small to
//! split runs here on the datasets just listed: one metastore listing either way.
//!
//! Nothing here may fail a query that one node could answer: a share whose node fails
//! or times out is asked of the next peer ([`Peers::run`] tries them in turn), and
//! when none answers it is run here. Small queries never leave the node: below the
//! threshold the transfer costs more than the split saves.
//!
//! Peers are reached by kiln-cluster (this crate does not know the network): it
//! implements [`Peers`] over the membership. A peer re-checks the caller's credentials,
//! which the HTTP edge makes available to the fan-out with [`with_credentials`].

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use kiln_metastore::DatasetMeta;
use kiln_model::pprof::Profile;
use serde::{Deserialize, Serialize};

use crate::api::Series;
use crate::leaf::{local_profile, local_series, local_tree};
use crate::pprof_export::PprofMerge;
use crate::select::{Querier, SelectRequest, TypeFilter};
use crate::series::{PartialSeries, SeriesBuilder, SeriesOptions};
use crate::tree::{decode_partial, FlameTree};
use crate::QueryError;

/// A share of a query as another node runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartialQuery {
    pub profile_type: String,
    /// The request's selector, as text.
    pub selector: String,
    pub from_nanos: i64,
    pub to_nanos: i64,
    #[serde(default)]
    pub call_site: Vec<String>,
    /// The share: these datasets, as the splitting node listed them.
    pub datasets: Vec<DatasetMeta>,
    /// For a share of a series query: how its points are bucketed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub series: Option<SeriesSpec>,
}

/// What a series share needs of [`SeriesOptions`]: averaging and the top-N cut are done
/// once, by the node that split the query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeriesSpec {
    pub step_ms: i64,
    #[serde(default)]
    pub group_by: Vec<String>,
    #[serde(default)]
    pub exemplars: bool,
}

impl SeriesSpec {
    pub fn options(&self) -> SeriesOptions {
        SeriesOptions {
            step_ms: self.step_ms,
            group_by: self.group_by.clone(),
            exemplars: self.exemplars,
            ..Default::default()
        }
    }
}

impl PartialQuery {
    /// The request this part stands for, for `tenant` (the peer's own, from its header).
    pub fn request(&self, tenant: &str) -> Result<SelectRequest, QueryError> {
        let selector = kiln_model::selector::parse(&self.selector)
            .map_err(|err| QueryError::BadRequest(format!("selector: {err}")))?;
        if self.from_nanos > self.to_nanos {
            return Err(QueryError::BadRequest(
                "from_nanos is after to_nanos".to_string(),
            ));
        }
        Ok(SelectRequest {
            tenant: tenant.to_string(),
            types: TypeFilter::Exact(self.profile_type.clone()),
            selector,
            from_nanos: self.from_nanos,
            to_nanos: self.to_nanos,
            call_site: self.call_site.clone(),
            values_only: true,
            datasets: Some(Arc::new(self.datasets.clone())),
            ..Default::default()
        })
    }
}

/// The other live query nodes, as the cluster sees them.
pub trait Peers: Send + Sync {
    /// How many other query nodes are live now.
    fn count(&self) -> usize;

    /// Runs `part` for `tenant` on a peer, the `index`th first and then the others in
    /// turn, and returns its answer in the form `output` names; `Err` when none answered.
    /// `credentials`: the client's `Authorization`, presented again.
    fn run<'a>(
        &'a self,
        index: usize,
        tenant: &'a str,
        credentials: Option<&'a str>,
        output: &'a Output,
        part: &'a PartialQuery,
    ) -> BoxFuture<'a, Result<Bytes, QueryError>>;
}

/// What a share answers: an uncut flame tree ([`crate::tree::encode_partial`]), a
/// merged pprof, or unfinished series ([`PartialSeries`]); protobufs are not gzipped:
/// they travel between nodes of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Tree,
    Profile,
    /// Series bucketed so ([`PartialQuery::series`] carries it to the peer).
    Series(SeriesSpec),
}

/// How this node splits large queries.
#[derive(Clone)]
pub struct Fanout {
    pub peers: Arc<dyn Peers>,
    /// A query over fewer profiles runs here alone.
    pub min_profiles: u64,
}

tokio::task_local! {
    static CREDENTIALS: Option<String>;
}

/// Runs `work` (a request's handling) with the client's `Authorization` header known to
/// the fan-out, which presents it to the peers.
pub async fn with_credentials<T>(credentials: Option<String>, work: impl Future<Output = T>) -> T {
    CREDENTIALS.scope(credentials, work).await
}

fn credentials() -> Option<String> {
    CREDENTIALS.try_with(|c| c.clone()).ok().flatten()
}

/// The root of every query this node is asked: it plans, splits over the live query
/// nodes when the query is large enough, runs its own share as a leaf ([`crate::leaf`])
/// and merges the parts. The querier below it reads local data and knows nothing of
/// peers. Clones share the fan-out, which is set once the cluster is known.
#[derive(Clone)]
pub struct Root {
    querier: Querier,
    fanout: Arc<std::sync::OnceLock<Fanout>>,
}

impl Root {
    pub fn new(querier: Querier) -> Self {
        Root {
            querier,
            fanout: Arc::new(std::sync::OnceLock::new()),
        }
    }

    /// Splits large queries over `fanout`'s peers from now on (set once; later calls
    /// are ignored).
    pub fn fan_out(&self, fanout: Fanout) {
        let _ = self.fanout.set(fanout);
    }

    /// The merged flame tree of the request's one profile type, cut to `max_nodes` (0
    /// keeps every node). The call site, when given, was applied to the samples, so the
    /// tree holds that subtree at full resolution under its call-site path. Split over
    /// the other query nodes when large enough; either way the same uncut tree, cut once
    /// here.
    pub async fn merged_tree(
        &self,
        request: &SelectRequest,
        max_nodes: usize,
    ) -> Result<FlameTree, QueryError> {
        let mut tree = self.tree(request).await?;
        tree.compute_totals();
        Ok(crate::merge::cut(tree, max_nodes))
    }

    /// Sums (or averages) the matching profiles per series and step, split over the
    /// other query nodes when the range is large.
    pub async fn select_series(
        &self,
        request: &SelectRequest,
        options: &SeriesOptions,
    ) -> Result<Vec<Series>, QueryError> {
        let mut builder = SeriesBuilder::new(options)?;
        let parts = if options.span_exemplars {
            // Span exemplars read every sample: a filter of few profiles, never split.
            vec![local_series(&self.querier, request, options).await?]
        } else {
            self.series(request, options).await?
        };
        for part in parts {
            builder.add_partial(part);
        }
        Ok(builder.finish())
    }

    /// The request's tree (totals not yet computed), split over the peers when it is large
    /// enough; else built here.
    async fn tree(&self, request: &SelectRequest) -> Result<FlameTree, QueryError> {
        let parts = self
            .split(
                request,
                Output::Tree,
                move |part| async move { local_tree(&self.querier, &part).await },
                decode_partial,
            )
            .await?;
        let mut parts = parts.into_iter();
        let mut merged = parts.next().unwrap_or_default();
        for tree in parts {
            merged.add_tree(&tree, |value| value);
        }
        Ok(merged)
    }

    /// The merged pprof of the request's profile type, never truncated: split over the
    /// peers when it is large enough, else merged here. Parts are merged as pprof, symbols
    /// re-interned: a stack is the same stack whichever node read it.
    pub async fn merged_profile(&self, request: &SelectRequest) -> Result<Profile, QueryError> {
        let type_id = crate::merge::exact_type(request)?.to_string();
        let parts = self
            .split(
                request,
                Output::Profile,
                move |part| async move { local_profile(&self.querier, &part).await },
                decode_profile,
            )
            .await?;
        if parts.len() == 1 {
            return Ok(parts.into_iter().next().unwrap_or_default());
        }
        let mut merge = PprofMerge::new(&[type_id]);
        for part in &parts {
            merge.add_profile(part);
        }
        Ok(merge.finish())
    }

    /// The request's series in parts, one per share, unfinished: the caller adds them up
    /// ([`crate::series::SeriesBuilder::add_partial`]) and finishes once.
    async fn series(
        &self,
        request: &SelectRequest,
        options: &SeriesOptions,
    ) -> Result<Vec<PartialSeries>, QueryError> {
        let spec = SeriesSpec {
            step_ms: options.step_ms,
            group_by: options.group_by.clone(),
            exemplars: options.exemplars,
        };
        self.split(
            request,
            Output::Series(spec),
            move |part| async move { local_series(&self.querier, &part, options).await },
            PartialSeries::from_bytes,
        )
        .await
    }

    /// Runs `request` in parts, one per share of its datasets, when it is large enough and
    /// other query nodes are live: the first share with `local`, each other on a peer (its
    /// answer read with `decode`), and a share no peer answered with `local` too. Otherwise
    /// one part, the whole request run with `local` (on the datasets already listed, if the
    /// listing was what showed the query small).
    async fn split<T, Local, Run>(
        &self,
        request: &SelectRequest,
        output: Output,
        local: Local,
        decode: fn(&[u8]) -> Result<T, QueryError>,
    ) -> Result<Vec<T>, QueryError>
    where
        Local: Fn(SelectRequest) -> Run,
        Run: Future<Output = Result<T, QueryError>>,
    {
        let restricted = |datasets: Vec<DatasetMeta>| SelectRequest {
            datasets: Some(Arc::new(datasets)),
            ..request.clone()
        };
        let (fanout, profile_type, shares) = match self.plan(request).await? {
            Plan::Here => return Ok(vec![local(request.clone()).await?]),
            Plan::HereListed(metas) => return Ok(vec![local(restricted(metas)).await?]),
            Plan::Split(fanout, profile_type, shares) => (fanout, profile_type, shares),
        };
        self.querier.metrics().fanned_out(shares.len() - 1);
        let credentials = credentials();
        let (local, restricted, output) = (&local, &restricted, &output);
        let parts = shares.into_iter().enumerate().map(|(index, datasets)| {
            let fanout = fanout.clone();
            let credentials = credentials.clone();
            let part = PartialQuery {
                profile_type: profile_type.clone(),
                selector: request.selector.to_string(),
                from_nanos: request.from_nanos,
                to_nanos: request.to_nanos,
                call_site: request.call_site.clone(),
                datasets,
                series: match output {
                    Output::Series(spec) => Some(spec.clone()),
                    _ => None,
                },
            };
            async move {
                if index == 0 {
                    return local(restricted(part.datasets)).await;
                }
                let remote = fanout
                    .peers
                    .run(index - 1, &request.tenant, credentials.as_deref(), output, &part)
                    .await
                    .and_then(|bytes| decode(&bytes));
                match remote {
                    Ok(answer) => Ok(answer),
                    Err(err) => {
                        // No peer answered: the share is run here, and the query still holds.
                        tracing::warn!(error = %err, datasets = part.datasets.len(), "query share failed on every peer; running it here");
                        self.querier.metrics().share_run_here();
                        local(restricted(part.datasets)).await
                    }
                }
            }
        });
        futures_util::future::join_all(parts)
            .await
            .into_iter()
            .collect()
    }

    async fn plan(&self, request: &SelectRequest) -> Result<Plan, QueryError> {
        let Some(fanout) = self.fanout.get().filter(|_| splittable(request)) else {
            return Ok(Plan::Here);
        };
        let TypeFilter::Exact(profile_type) = &request.types else {
            return Ok(Plan::Here);
        };
        let peers = fanout.peers.count();
        if peers == 0 {
            return Ok(Plan::Here);
        }
        let metas = self.querier.datasets_within_budget(request).await?;
        let profiles: u64 = metas.iter().map(|meta| meta.profile_count).sum();
        if profiles < fanout.min_profiles {
            return Ok(Plan::HereListed(metas));
        }
        let shares = shares(&metas, peers + 1);
        if shares.len() < 2 {
            return Ok(Plan::HereListed(metas));
        }
        Ok(Plan::Split(fanout.clone(), profile_type.clone(), shares))
    }
}

/// Whether a request may be split: a sum over whole profiles' stacks, without filters
/// that pick single profiles or samples (those select little anyway).
fn splittable(request: &SelectRequest) -> bool {
    matches!(request.types, TypeFilter::Exact(_))
        && request.profile_ids.is_none()
        && request.span_ids.is_none()
        && request.value_range.is_none()
        && !request.per_sample
        && request.datasets.is_none()
}

/// A share's pprof as a peer returned it: bounded like any profile read from the network.
fn decode_profile(bytes: &[u8]) -> Result<Profile, QueryError> {
    const MAX_DECODED: usize = 1 << 30;
    kiln_model::pprof::decode(bytes, MAX_DECODED)
        .map_err(|err| QueryError::Remote(format!("a share's pprof does not decode: {err}")))
}

/// Where a request runs.
enum Plan {
    /// Here, listing its datasets as usual: it cannot be split, or no other query node
    /// is live.
    Here,
    /// Here, on these datasets, listed to learn that the query is too small to split.
    HereListed(Vec<DatasetMeta>),
    /// Over the peers: the profile type, and one share of datasets per node.
    Split(Fanout, String, Vec<Vec<DatasetMeta>>),
}

/// The datasets of `metas` in up to `count` shares of about equal profile counts, a
/// block's datasets together (one object read once): largest block first, each to the
/// lightest share; empty shares are left out.
fn shares(metas: &[DatasetMeta], count: usize) -> Vec<Vec<DatasetMeta>> {
    let mut blocks: BTreeMap<&str, (u64, Vec<DatasetMeta>)> = BTreeMap::new();
    for meta in metas {
        let block = blocks.entry(meta.block_id.as_str()).or_default();
        block.0 += meta.profile_count.max(1);
        block.1.push(meta.clone());
    }
    let mut ordered: Vec<(&str, (u64, Vec<DatasetMeta>))> = blocks.into_iter().collect();
    ordered.sort_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(b.0)));
    let mut shares: Vec<(u64, Vec<DatasetMeta>)> = vec![(0, Vec::new()); count.max(1)];
    for (_, (profiles, datasets)) in ordered {
        if let Some(lightest) = shares.iter_mut().min_by_key(|(load, _)| *load) {
            lightest.0 += profiles;
            lightest.1.extend(datasets);
        }
    }
    shares
        .into_iter()
        .map(|(_, datasets)| datasets)
        .filter(|datasets| !datasets.is_empty())
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A dataset of tenant `t`, service `s`, alone in block `block` (`{block}.parquet`).
    pub(crate) fn meta(block: &str, profiles: u64) -> DatasetMeta {
        DatasetMeta {
            block_id: block.to_string(),
            object_key: format!("{block}.parquet"),
            tenant: "t".to_string(),
            service: "s".to_string(),
            row_group: 0,
            min_time_nanos: 0,
            max_time_nanos: 0,
            profile_types: Vec::new(),
            profile_count: profiles,
            rules_counted: false,
        }
    }

    #[test]
    fn shares_hold_every_block_once_balanced_by_profiles() {
        let metas = vec![
            meta("a", 100),
            meta("b", 60),
            meta("c", 50),
            meta("d", 10),
            meta("a", 20),
        ];
        let shares = shares(&metas, 2);
        assert_eq!(shares.len(), 2);
        let blocks = |share: &[DatasetMeta]| -> Vec<String> {
            share.iter().map(|meta| meta.block_id.clone()).collect()
        };
        let mut all: Vec<String> = shares.iter().flat_map(|share| blocks(share)).collect();
        all.sort();
        // Every dataset once, both of block a's in one share.
        assert_eq!(all, ["a", "a", "b", "c", "d"]);
        // a (120) alone against b + c + d (120).
        assert_eq!(blocks(&shares[0]), ["a", "a"]);
        // More shares than blocks: one block each, no empty share.
        assert_eq!(super::shares(&metas[..2], 5).len(), 2);
    }

    #[test]
    fn a_partial_query_is_a_request_limited_to_its_blocks() {
        let part = PartialQuery {
            profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".to_string(),
            selector: r#"{service_name="api", region=~"eu-.*"}"#.to_string(),
            from_nanos: 1,
            to_nanos: 2,
            call_site: vec!["main".to_string()],
            datasets: vec![meta("b1", 3), meta("b2", 4)],
            series: None,
        };
        let request = part.request("team").unwrap();
        assert_eq!(request.tenant, "team");
        assert_eq!(request.selector.matchers.len(), 2);
        assert_eq!(
            request.datasets.as_deref().map(|d| d.len()),
            Some(2),
            "{request:?}"
        );
        let bad = PartialQuery {
            selector: "{".to_string(),
            ..part.clone()
        };
        assert!(bad.request("team").is_err());
        let backwards = PartialQuery {
            from_nanos: 3,
            ..part
        };
        assert!(backwards.request("team").is_err());
    }
}

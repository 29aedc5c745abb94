//! The other live query nodes, for kiln-query's fan-out ([`kiln_query::root`]): who they
//! are (the membership's cached view, so a split costs no metastore round trip), and how
//! a share is asked of them, with the next node tried when one fails.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use kiln_query::root::{Output, PartialQuery, Peers};
use kiln_query::QueryError;

use crate::membership::Membership;

/// Where a share of a flame-tree query is sent (kiln-server runs it with
/// `fanout::local_tree`).
pub const PARTIAL_TREE_PATH: &str = "/api/v1/partial/tree";
/// Where a share of a pprof query is sent (`fanout::local_profile`).
pub const PARTIAL_PROFILE_PATH: &str = "/api/v1/partial/profile";
/// Where a share of a series query is sent (`series::local_series`).
pub const PARTIAL_SERIES_PATH: &str = "/api/v1/partial/series";

/// The live query nodes other than this one.
pub struct QueryPeers {
    membership: Arc<Membership>,
    client: reqwest::Client,
    scheme: &'static str,
    /// The node credential's `Authorization` (`cluster.token_file`), presented instead
    /// of the caller's when set: the shares' endpoints are for nodes only.
    node_authorization: Option<String>,
}

impl QueryPeers {
    /// `client`: [`crate::http_client`] with a query's time limit, after which the next
    /// peer is asked.
    pub fn new(
        membership: Arc<Membership>,
        client: reqwest::Client,
        https: bool,
        node_authorization: Option<String>,
    ) -> Self {
        QueryPeers {
            membership,
            client,
            scheme: if https { "https" } else { "http" },
            node_authorization,
        }
    }

    fn addresses(&self) -> Vec<(String, String)> {
        let mut peers: Vec<(String, String)> = self
            .membership
            .live_with_role("query")
            .into_iter()
            .filter(|node| node.id != self.membership.id())
            .map(|node| (node.id, node.address))
            .collect();
        peers.sort();
        peers
    }

    async fn ask(
        &self,
        address: &str,
        tenant: &str,
        credentials: Option<&str>,
        output: &Output,
        part: &PartialQuery,
    ) -> Result<Bytes, String> {
        let path = match output {
            Output::Tree => PARTIAL_TREE_PATH,
            Output::Profile => PARTIAL_PROFILE_PATH,
            Output::Series(_) => PARTIAL_SERIES_PATH,
        };
        let mut request = self
            .client
            .post(format!("{}://{address}{path}", self.scheme))
            .header("x-scope-orgid", tenant)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(part).map_err(|err| err.to_string())?);
        if let Some(credentials) = self.node_authorization.as_deref().or(credentials) {
            request = request.header("authorization", credentials);
        }
        let response = request.send().await.map_err(|err| err.to_string())?;
        let status = response.status();
        let body = response.bytes().await.map_err(|err| err.to_string())?;
        if !status.is_success() {
            return Err(format!(
                "{status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)]).trim()
            ));
        }
        Ok(body)
    }
}

impl Peers for QueryPeers {
    fn count(&self) -> usize {
        self.addresses().len()
    }

    fn run<'a>(
        &'a self,
        index: usize,
        tenant: &'a str,
        credentials: Option<&'a str>,
        output: &'a Output,
        part: &'a PartialQuery,
    ) -> BoxFuture<'a, Result<Bytes, QueryError>> {
        Box::pin(async move {
            let peers = self.addresses();
            let mut failures = Vec::new();
            // The share's own peer first, then each other in turn: a node that died
            // mid-query costs one failed request, not the query.
            for offset in 0..peers.len() {
                let (id, address) = &peers[(index + offset) % peers.len()];
                match self.ask(address, tenant, credentials, output, part).await {
                    Ok(bytes) => return Ok(bytes),
                    Err(err) => {
                        tracing::warn!(node = %id, error = %err, "query share failed; asking the next node");
                        failures.push(format!("{id}: {err}"));
                    }
                }
            }
            Err(QueryError::Remote(if failures.is_empty() {
                "no other query node is live".to_string()
            } else {
                failures.join("; ")
            }))
        })
    }
}

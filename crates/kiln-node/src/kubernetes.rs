//! The host agent's pods (`agent.kubernetes`, `kiln agent --kubernetes`): kiln-kube's
//! watch of this node's pods, answering the agent's question of who a container is.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the agent waits for the first list of its node's pods before it starts, so
/// its first reports carry pod labels; past this it starts anyway, and labels processes
/// once the list arrives.
const FIRST_LIST_WAIT: Duration = Duration::from_secs(10);

/// Watches the pods of this node: `NODE_NAME` (set from `spec.nodeName` by the downward
/// API, as deploy/kubernetes's DaemonSet does), else the host name, which the kubelet
/// takes as its node's name by default. The API server is the pod's own (the service
/// account's in-cluster config), or `$KUBECONFIG`'s outside a pod.
pub async fn node_pods() -> Result<Arc<dyn kiln_agent::Containers>, kiln_kube::KubeError> {
    let node = std::env::var("NODE_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(kiln_cluster::host_name);
    let mut api = kiln_kube::ApiConfig::default();
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        api.kubeconfig_file = std::env::var_os("KUBECONFIG")
            .and_then(|paths| std::env::split_paths(&paths).next())
            .filter(|path| !path.as_os_str().is_empty());
    }
    let client = api.client().await?;
    let pods = kiln_kube::NodePods::start(client, &node);
    let started = Instant::now();
    while !pods.listed() && started.elapsed() < FIRST_LIST_WAIT {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if pods.listed() {
        tracing::info!(
            node,
            pods = pods.pods(),
            "agent: labelling processes with their pods"
        );
    } else {
        tracing::warn!(node, "agent: the pods of this node are not listed yet; processes keep their own labels until they are");
    }
    Ok(Arc::new(NodePods { node, pods }))
}

struct NodePods {
    node: String,
    pods: kiln_kube::NodePods,
}

impl std::fmt::Debug for NodePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePods")
            .field("node", &self.node)
            .field("pods", &self.pods.pods())
            .finish()
    }
}

impl kiln_agent::Containers for NodePods {
    fn labels(
        &self,
        container_id: Option<&str>,
        cgroup: &str,
    ) -> Option<kiln_agent::ContainerLabels> {
        let found = self.pods.container(container_id, cgroup)?;
        Some(kiln_agent::ContainerLabels {
            labels: found.labels.clone(),
            meta: found.meta.clone(),
        })
    }
}

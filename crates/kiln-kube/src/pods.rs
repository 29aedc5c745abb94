//! The pods of one node, for the host agent: which pod and container a process runs in,
//! from its cgroup.
//!
//! The agent watches only its own node's pods (`spec.nodeName=<node>`, the field selector
//! the kubelet's own watch uses), so its memory and the API server's work stay a node's
//! worth whatever the cluster's size. A process is matched by the container id in its
//! cgroup path against the pods' `containerStatuses`; a container so new that its status
//! has no id yet is matched by the pod uid that the kubelet also writes into the path
//! (`…/kubepods-burstable-pod<uid>.slice/…` or `…/pod<uid>/…`), with no container then.
//! A process in no pod (the kubelet, containerd, sshd) matches nothing and keeps the
//! agent's own labels.
//!
//! The index is rebuilt whole at every change (a node runs at most a few hundred pods)
//! behind a lock that the agent's report thread takes for a lookup per process per
//! report.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::Api;

use crate::targets::{self, container_ids, pod_labels, with_container};
use crate::watch::{follow_changes, Change, Key};

/// The annotations that name a pod's service, in order: Pyroscope's and Alloy's, then
/// kube-profefe's.
pub const SERVICE_ANNOTATIONS: [&str; 2] =
    ["profiles.grafana.com/service_name", "profefe.com/service"];

/// What a process in a pod's container is labelled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodContainer {
    /// The profile's labels: `service_name`, `namespace`, `pod`, `container` (when
    /// known), `node`, and the workload as `controller_kind` and `controller_name`.
    pub labels: Arc<[(String, String)]>,
    /// The pod's `__meta_kubernetes_*` labels, as the scrape role `pod` names them, for
    /// relabeling.
    pub meta: Arc<[(String, String)]>,
}

#[derive(Default)]
struct Index {
    by_container: HashMap<String, Arc<PodContainer>>,
    /// By pod uid, with `-` as in the API.
    by_pod: HashMap<String, Arc<PodContainer>>,
    pods: usize,
}

/// The pods of a node, followed (see the module's doc).
pub struct NodePods {
    index: Arc<RwLock<Index>>,
    listed: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for NodePods {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NodePods {
    /// Starts following the pods of `node` on the runtime this is called in.
    pub fn start(client: kube::Client, node: &str) -> NodePods {
        let index = Arc::new(RwLock::new(Index::default()));
        let listed = Arc::new(AtomicBool::new(false));
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let (shared, done) = (index.clone(), listed.clone());
        let what = format!("pods of node {node}");
        let task = tokio::spawn(async move {
            let mut pods: BTreeMap<Key, Pod> = BTreeMap::new();
            follow_changes(Api::<Pod>::all(client), config, &what, |change| {
                match change {
                    Change::Listed(listed) => {
                        pods = listed;
                        tracing::info!(pods = pods.len(), watch = %what, "kubernetes: listed");
                        done.store(true, Ordering::Release);
                    }
                    Change::Applied(pod) => {
                        pods.insert(key(&pod), pod);
                    }
                    Change::Deleted(pod) => {
                        pods.remove(&key(&pod));
                    }
                }
                let built = build(pods.values());
                if let Ok(mut index) = shared.write() {
                    *index = built;
                }
            })
            .await;
        });
        NodePods {
            index,
            listed,
            task,
        }
    }

    /// The pod and container of a process with this container id (from its cgroup
    /// path) and cgroup path.
    pub fn container(&self, container_id: Option<&str>, cgroup: &str) -> Option<Arc<PodContainer>> {
        let index = self.index.read().ok()?;
        if let Some(found) = container_id.and_then(|id| index.by_container.get(id)) {
            return Some(found.clone());
        }
        index.by_pod.get(&pod_uid(cgroup)?).cloned()
    }

    /// Whether the node's pods were listed once.
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// Pods known now.
    pub fn pods(&self) -> usize {
        self.index.read().map_or(0, |index| index.pods)
    }
}

fn key(pod: &Pod) -> Key {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

fn build<'a>(pods: impl Iterator<Item = &'a Pod>) -> Index {
    let mut index = Index::default();
    for pod in pods {
        index.pods += 1;
        let meta = pod_labels(pod);
        let plain = pod_plain_labels(pod);
        if let Some(uid) = pod.metadata.uid.as_ref() {
            index.by_pod.insert(
                uid.clone(),
                Arc::new(PodContainer {
                    labels: plain.clone().into(),
                    meta: meta.clone().into_iter().collect(),
                }),
            );
        }
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        for (name, id, init) in container_ids(pod) {
            let declared = if init {
                spec.init_containers
                    .iter()
                    .flatten()
                    .find(|c| c.name == name)
            } else {
                spec.containers.iter().find(|c| c.name == name)
            };
            let meta = match declared {
                Some(container) => with_container(&meta, container, init, Some(&id)),
                None => meta.clone(),
            };
            let mut labels = plain.clone();
            labels.push(("container".into(), name));
            index.by_container.insert(
                id,
                Arc::new(PodContainer {
                    labels: labels.into(),
                    meta: meta.into_iter().collect(),
                }),
            );
        }
    }
    index
}

/// A pod's own labels for its processes' profiles (see [`PodContainer::labels`]).
fn pod_plain_labels(pod: &Pod) -> Vec<(String, String)> {
    let meta = &pod.metadata;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    let workload = targets::workload(pod);
    let annotated = SERVICE_ANNOTATIONS.iter().find_map(|annotation| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(*annotation))
            .filter(|service| !service.is_empty())
            .cloned()
    });
    let service = annotated.unwrap_or_else(|| match &workload {
        Some((_, controller)) => format!("{namespace}/{controller}"),
        None => format!("{namespace}/{name}"),
    });
    let mut labels = vec![
        ("service_name".to_string(), service),
        ("namespace".to_string(), namespace),
        ("pod".to_string(), name),
    ];
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        labels.push(("node".into(), node));
    }
    if let Some((kind, controller)) = workload {
        labels.push(("controller_kind".into(), kind));
        labels.push(("controller_name".into(), controller));
    }
    labels
}

/// The pod uid the kubelet writes into a container's cgroup path, with `-` again where
/// the systemd driver wrote `_`.
pub fn pod_uid(cgroup: &str) -> Option<String> {
    cgroup.split(['/', '.']).find_map(|part| {
        let uid = part
            .strip_prefix("pod")
            .or_else(|| part.rsplit_once("-pod").map(|(_, uid)| uid))?;
        let uid = uid.replace('_', "-");
        let groups: Vec<&str> = uid.split('-').collect();
        let shape = [8, 4, 4, 4, 12];
        (groups.len() == 5
            && groups.iter().zip(shape).all(|(group, len)| {
                group.len() == len && group.bytes().all(|b| b.is_ascii_hexdigit())
            }))
        .then_some(uid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("a pod")
    }

    const ID: &str = "3b1f6c6f0f6b4d5e9c1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70";

    fn checkout() -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "checkout-7d4b9c-x2x9q", "namespace": "shop",
                "uid": "0e5f9a34-1b2c-4d5e-8f90-123456789abc",
                "labels": {"app": "checkout", "pod-template-hash": "7d4b9c"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "checkout-7d4b9c", "uid": "u", "controller": true}]},
            "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "shop/checkout:1.2"}]},
            "status": {"containerStatuses": [{"name": "app", "containerID": format!("containerd://{ID}"),
                "image": "", "imageID": "", "ready": true, "restartCount": 0}]}
        }))
    }

    fn label<'a>(labels: &'a [(String, String)], name: &str) -> Option<&'a str> {
        labels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn a_container_is_found_by_its_id_and_a_new_one_by_its_pod() {
        let pods = [checkout()];
        let index = build(pods.iter());
        let found = index.by_container.get(ID).expect("by container id");
        assert_eq!(label(&found.labels, "service_name"), Some("shop/checkout"));
        assert_eq!(label(&found.labels, "container"), Some("app"));
        assert_eq!(label(&found.labels, "node"), Some("node-1"));
        assert_eq!(label(&found.labels, "controller_kind"), Some("Deployment"));
        assert_eq!(label(&found.labels, "controller_name"), Some("checkout"));
        assert_eq!(
            label(&found.meta, "__meta_kubernetes_pod_container_image"),
            Some("shop/checkout:1.2")
        );
        assert_eq!(
            label(&found.meta, "__meta_kubernetes_pod_label_app"),
            Some("checkout")
        );
        let systemd = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0e5f9a34_1b2c_4d5e_8f90_123456789abc.slice/cri-containerd-ffff.scope";
        let cgroupfs = "/kubepods/burstable/pod0e5f9a34-1b2c-4d5e-8f90-123456789abc/ffff";
        for path in [systemd, cgroupfs] {
            assert_eq!(
                pod_uid(path).as_deref(),
                Some("0e5f9a34-1b2c-4d5e-8f90-123456789abc"),
                "{path}"
            );
            let by_pod = index
                .by_pod
                .get(&pod_uid(path).unwrap())
                .expect("by pod uid");
            assert_eq!(label(&by_pod.labels, "pod"), Some("checkout-7d4b9c-x2x9q"));
            assert_eq!(label(&by_pod.labels, "container"), None);
        }
        assert_eq!(pod_uid("/system.slice/containerd.service"), None);
        assert_eq!(pod_uid("/user.slice/user-0.slice/session-1.scope"), None);
    }

    #[test]
    fn an_annotation_names_the_service_and_a_bare_pod_is_its_own() {
        let mut annotated = checkout();
        annotated.metadata.annotations = Some(
            [(
                "profefe.com/service".to_string(),
                "checkout-api".to_string(),
            )]
            .into(),
        );
        let mut bare = checkout();
        bare.metadata.owner_references = None;
        bare.metadata.name = Some("debug".into());
        for (pod, service) in [(annotated, "checkout-api"), (bare, "shop/debug")] {
            let labels = pod_plain_labels(&pod);
            assert_eq!(label(&labels, "service_name"), Some(service));
        }
    }
}

//! Targets from API objects, with the `__meta_kubernetes_*` labels Prometheus gives each
//! role, so relabel rules written for Prometheus (and Alloy) work unchanged.
//!
//! Beyond Prometheus's labels, a pod also carries its *workload*
//! (`__meta_kubernetes_pod_workload_kind` and `_name`): its controller followed up the
//! owner chain as far as the pod itself tells. A ReplicaSet made by a Deployment is named
//! `<deployment>-<pod-template-hash>` and the pod carries that hash as a label; a Job made
//! by a CronJob is named `<cronjob>-<minutes since the epoch>`. Reading the ReplicaSets
//! and Jobs instead would need RBAC on them, which Kiln does not ask for.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Endpoints, Node, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// One target: its address and labels (the group shape of `file_sd_configs`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Target {
    pub address: String,
    pub labels: BTreeMap<String, String>,
}

const META: &str = "__meta_kubernetes_";

/// A label name as Prometheus makes it from a Kubernetes key: every character that may
/// not appear in a label name becomes `_` (`app.kubernetes.io/name` →
/// `app_kubernetes_io_name`).
pub fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `<prefix>_label_<name>`, `<prefix>_labelpresent_<name>` and the same for annotations.
fn object_labels(labels: &mut BTreeMap<String, String>, prefix: &str, meta: &ObjectMeta) {
    for (kind, map) in [("label", &meta.labels), ("annotation", &meta.annotations)] {
        for (name, value) in map.iter().flatten() {
            let name = sanitize(name);
            labels.insert(format!("{META}{prefix}_{kind}_{name}"), value.clone());
            labels.insert(
                format!("{META}{prefix}_{kind}present_{name}"),
                "true".into(),
            );
        }
    }
}

fn join_host_port(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The controller that owns an object: (kind, name).
pub fn controller(meta: &ObjectMeta) -> Option<(&str, &str)> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|owner| owner.controller == Some(true))
        .map(|owner| (owner.kind.as_str(), owner.name.as_str()))
}

/// The workload a pod belongs to: its controller, or the Deployment or CronJob above that
/// controller when the pod tells (see the module's doc). `None` for a bare pod.
pub fn workload(pod: &Pod) -> Option<(String, String)> {
    let (kind, name) = controller(&pod.metadata)?;
    let labels = pod.metadata.labels.as_ref();
    match kind {
        "ReplicaSet" => {
            let hash = labels.and_then(|labels| labels.get("pod-template-hash"));
            if let Some(deployment) = hash
                .and_then(|hash| name.strip_suffix(hash.as_str()))
                .and_then(|rest| rest.strip_suffix('-'))
                .filter(|rest| !rest.is_empty())
            {
                return Some(("Deployment".into(), deployment.into()));
            }
        }
        "Job" => {
            if let Some((cronjob, minutes)) = name.rsplit_once('-') {
                if !cronjob.is_empty()
                    && minutes.len() >= 8
                    && minutes.bytes().all(|b| b.is_ascii_digit())
                {
                    return Some(("CronJob".into(), cronjob.into()));
                }
            }
        }
        _ => {}
    }
    Some((kind.into(), name.into()))
}

/// The labels of a pod shared by its containers' targets.
pub fn pod_labels(pod: &Pod) -> BTreeMap<String, String> {
    let meta = &pod.metadata;
    let mut labels = BTreeMap::new();
    let mut set = |name: &str, value: Option<&str>| {
        if let Some(value) = value {
            labels.insert(format!("{META}{name}"), value.to_string());
        }
    };
    set("namespace", meta.namespace.as_deref());
    set("pod_name", meta.name.as_deref());
    set("pod_uid", meta.uid.as_deref());
    let status = pod.status.as_ref();
    set("pod_ip", status.and_then(|s| s.pod_ip.as_deref()));
    set("pod_host_ip", status.and_then(|s| s.host_ip.as_deref()));
    set("pod_phase", status.and_then(|s| s.phase.as_deref()));
    set(
        "pod_node_name",
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
    );
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.to_lowercase())
        .unwrap_or_else(|| "unknown".into());
    set("pod_ready", Some(&ready));
    if let Some((kind, name)) = controller(meta) {
        set("pod_controller_kind", Some(kind));
        set("pod_controller_name", Some(name));
    }
    if let Some((kind, name)) = workload(pod) {
        set("pod_workload_kind", Some(&kind));
        set("pod_workload_name", Some(&name));
    }
    object_labels(&mut labels, "pod", meta);
    labels
}

/// The container ids of a pod's containers, by container name, as the runtime writes them
/// into cgroup paths: `containerd://0123…` becomes `0123…`.
pub fn container_ids(pod: &Pod) -> Vec<(String, String, bool)> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let init = status
        .init_container_statuses
        .iter()
        .flatten()
        .map(|s| (s, true));
    let plain = status
        .container_statuses
        .iter()
        .flatten()
        .map(|s| (s, false));
    init.chain(plain)
        .filter_map(|(s, init)| {
            let id = s.container_id.as_deref()?;
            let id = id.split_once("://").map_or(id, |(_, id)| id);
            (!id.is_empty()).then(|| (s.name.clone(), id.to_string(), init))
        })
        .collect()
}

/// A pod's labels ([`pod_labels`]) with one container's: its name, image and id, and
/// whether it is an init container.
pub fn with_container(
    pod: &BTreeMap<String, String>,
    container: &Container,
    init: bool,
    id: Option<&String>,
) -> BTreeMap<String, String> {
    let mut labels = pod.clone();
    labels.insert(format!("{META}pod_container_name"), container.name.clone());
    labels.insert(format!("{META}pod_container_init"), init.to_string());
    if let Some(image) = &container.image {
        labels.insert(format!("{META}pod_container_image"), image.clone());
    }
    if let Some(id) = id {
        labels.insert(format!("{META}pod_container_id"), id.clone());
    }
    labels
}

/// Role `pod`: a target per declared port of each container, and one without a port for a
/// container that declares none (a port to add by relabeling), as Prometheus makes them.
/// A pod with no IP yet has no targets.
pub fn pod_targets(pod: &Pod) -> Vec<Target> {
    let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()) else {
        return Vec::new();
    };
    let shared = pod_labels(pod);
    let ids: BTreeMap<String, String> = container_ids(pod)
        .into_iter()
        .map(|(name, id, _)| (name, id))
        .collect();
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let init = spec.init_containers.iter().flatten().map(|c| (c, true));
    let plain = spec.containers.iter().map(|c| (c, false));
    let mut targets = Vec::new();
    for (container, init) in plain.chain(init) {
        let labels = with_container(&shared, container, init, ids.get(&container.name));
        let ports = container.ports.as_deref().unwrap_or_default();
        if ports.is_empty() {
            targets.push(Target {
                address: ip.to_string(),
                labels,
            });
            continue;
        }
        for port in ports {
            let mut labels = labels.clone();
            labels.insert(
                format!("{META}pod_container_port_number"),
                port.container_port.to_string(),
            );
            labels.insert(
                format!("{META}pod_container_port_protocol"),
                port.protocol.clone().unwrap_or_else(|| "TCP".into()),
            );
            if let Some(name) = &port.name {
                labels.insert(format!("{META}pod_container_port_name"), name.clone());
            }
            targets.push(Target {
                address: join_host_port(ip, port.container_port),
                labels,
            });
        }
    }
    targets
}

fn service_labels(service: &Service) -> BTreeMap<String, String> {
    let meta = &service.metadata;
    let mut labels = BTreeMap::new();
    let spec = service.spec.as_ref();
    for (name, value) in [
        ("namespace", meta.namespace.as_deref()),
        ("service_name", meta.name.as_deref()),
        ("service_type", spec.and_then(|s| s.type_.as_deref())),
        (
            "service_cluster_ip",
            spec.and_then(|s| s.cluster_ip.as_deref()),
        ),
        (
            "service_external_name",
            spec.and_then(|s| s.external_name.as_deref()),
        ),
        (
            "service_loadbalancer_ip",
            spec.and_then(|s| s.load_balancer_ip.as_deref()),
        ),
    ] {
        if let Some(value) = value {
            labels.insert(format!("{META}{name}"), value.to_string());
        }
    }
    object_labels(&mut labels, "service", meta);
    labels
}

/// Role `service`: a target per port, at the service's DNS name.
pub fn service_targets(service: &Service) -> Vec<Target> {
    let (Some(name), Some(namespace)) = (
        service.metadata.name.as_deref(),
        service.metadata.namespace.as_deref(),
    ) else {
        return Vec::new();
    };
    let shared = service_labels(service);
    let spec = service.spec.as_ref();
    spec.and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .map(|port| {
            let mut labels = shared.clone();
            labels.insert(format!("{META}service_port_number"), port.port.to_string());
            labels.insert(
                format!("{META}service_port_protocol"),
                port.protocol.clone().unwrap_or_else(|| "TCP".into()),
            );
            if let Some(port_name) = &port.name {
                labels.insert(format!("{META}service_port_name"), port_name.clone());
            }
            Target {
                address: format!("{name}.{namespace}.svc:{}", port.port),
                labels,
            }
        })
        .collect()
}

/// Role `endpoints`: a target per address and port, with the service's labels when the
/// service is known, and its pod's (and container's, for the port it declares) when the
/// address is a pod's.
#[allow(deprecated)] // Endpoints, which Prometheus's role of that name reads.
pub fn endpoints_targets(
    endpoints: &Endpoints,
    service: Option<&Service>,
    pod_of: &dyn Fn(&str, &str) -> Option<Pod>,
) -> Vec<Target> {
    let meta = &endpoints.metadata;
    let mut shared = service.map(service_labels).unwrap_or_default();
    if let Some(namespace) = &meta.namespace {
        shared.insert(format!("{META}namespace"), namespace.clone());
    }
    if let Some(name) = &meta.name {
        shared.insert(format!("{META}endpoints_name"), name.clone());
    }
    object_labels(&mut shared, "endpoints", meta);
    let mut targets = Vec::new();
    for subset in endpoints.subsets.iter().flatten() {
        let ready = subset.addresses.iter().flatten().map(|a| (a, true));
        let unready = subset
            .not_ready_addresses
            .iter()
            .flatten()
            .map(|a| (a, false));
        for (address, ready) in ready.chain(unready) {
            for port in subset.ports.iter().flatten() {
                let mut labels = shared.clone();
                labels.insert(format!("{META}endpoint_ready"), ready.to_string());
                labels.insert(
                    format!("{META}endpoint_port_protocol"),
                    port.protocol.clone().unwrap_or_else(|| "TCP".into()),
                );
                if let Some(name) = &port.name {
                    labels.insert(format!("{META}endpoint_port_name"), name.clone());
                }
                if let Some(hostname) = &address.hostname {
                    labels.insert(format!("{META}endpoint_hostname"), hostname.clone());
                }
                if let Some(node) = &address.node_name {
                    labels.insert(format!("{META}endpoint_node_name"), node.clone());
                }
                if let Some(target) = &address.target_ref {
                    if let Some(kind) = &target.kind {
                        labels.insert(format!("{META}endpoint_address_target_kind"), kind.clone());
                    }
                    if let Some(name) = &target.name {
                        labels.insert(format!("{META}endpoint_address_target_name"), name.clone());
                    }
                    let pod = match (target.kind.as_deref(), &target.namespace, &target.name) {
                        (Some("Pod"), Some(namespace), Some(name)) => pod_of(namespace, name),
                        _ => None,
                    };
                    if let Some(pod) = pod {
                        labels.extend(pod_labels(&pod));
                        // The container that declares this port, as Prometheus adds it.
                        let container = pod.spec.iter().flat_map(|s| &s.containers).find(|c| {
                            c.ports
                                .iter()
                                .flatten()
                                .any(|p| p.container_port == port.port)
                        });
                        if let Some(container) = container {
                            labels.insert(
                                format!("{META}pod_container_name"),
                                container.name.clone(),
                            );
                            labels.insert(
                                format!("{META}pod_container_port_number"),
                                port.port.to_string(),
                            );
                        }
                    }
                }
                targets.push(Target {
                    address: join_host_port(&address.ip, port.port),
                    labels,
                });
            }
        }
    }
    targets
}

/// Role `node`: one target per node, at its first address by Prometheus's order of
/// address types, on the kubelet's port; `instance` is the node's name.
pub fn node_targets(node: &Node) -> Vec<Target> {
    let Some(name) = node.metadata.name.as_deref() else {
        return Vec::new();
    };
    let status = node.status.as_ref();
    let addresses = status
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default();
    let mut labels = BTreeMap::new();
    labels.insert(format!("{META}node_name"), name.to_string());
    labels.insert("instance".to_string(), name.to_string());
    if let Some(provider) = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) {
        labels.insert(format!("{META}node_provider_id"), provider.to_string());
    }
    for address in addresses {
        labels
            .entry(format!("{META}node_address_{}", address.type_))
            .or_insert_with(|| address.address.clone());
    }
    object_labels(&mut labels, "node", &node.metadata);
    let order = [
        "InternalIP",
        "InternalDNS",
        "ExternalIP",
        "ExternalDNS",
        "LegacyHostIP",
        "Hostname",
    ];
    let Some(host) = order
        .iter()
        .find_map(|kind| addresses.iter().find(|a| a.type_ == *kind))
    else {
        return Vec::new();
    };
    let port = status
        .and_then(|s| s.daemon_endpoints.as_ref())
        .and_then(|d| d.kubelet_endpoint.as_ref())
        .map_or(10250, |e| e.port);
    vec![Target {
        address: join_host_port(&host.address, port),
        labels,
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("a pod")
    }

    #[test]
    fn a_deployments_pod_has_prometheus_labels_and_its_workload() {
        let pod = pod(serde_json::json!({
            "metadata": {
                "name": "checkout-7d4b9c-x2x9q", "namespace": "shop", "uid": "u-1",
                "labels": {"app.kubernetes.io/name": "checkout", "pod-template-hash": "7d4b9c"},
                "annotations": {"profiles.grafana.com/cpu.scrape": "true"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "checkout-7d4b9c", "uid": "r-1", "controller": true}]
            },
            "spec": {"nodeName": "node-a", "containers": [
                {"name": "app", "image": "shop/checkout:1.4",
                 "ports": [{"name": "http", "containerPort": 6060}, {"containerPort": 9090, "protocol": "UDP"}]},
                {"name": "sidecar"}
            ]},
            "status": {"podIP": "10.1.2.3", "hostIP": "192.168.0.7", "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "app", "containerID": "containerd://abc123",
                    "image": "", "imageID": "", "ready": true, "restartCount": 0}]}
        }));
        let targets = pod_targets(&pod);
        let addresses: Vec<&str> = targets.iter().map(|t| t.address.as_str()).collect();
        assert_eq!(addresses, ["10.1.2.3:6060", "10.1.2.3:9090", "10.1.2.3"]);
        let first = &targets[0].labels;
        for (name, value) in [
            ("__meta_kubernetes_namespace", "shop"),
            ("__meta_kubernetes_pod_name", "checkout-7d4b9c-x2x9q"),
            ("__meta_kubernetes_pod_ip", "10.1.2.3"),
            ("__meta_kubernetes_pod_node_name", "node-a"),
            ("__meta_kubernetes_pod_ready", "true"),
            ("__meta_kubernetes_pod_phase", "Running"),
            ("__meta_kubernetes_pod_container_name", "app"),
            ("__meta_kubernetes_pod_container_id", "abc123"),
            ("__meta_kubernetes_pod_container_port_name", "http"),
            ("__meta_kubernetes_pod_container_port_number", "6060"),
            ("__meta_kubernetes_pod_container_port_protocol", "TCP"),
            ("__meta_kubernetes_pod_controller_kind", "ReplicaSet"),
            ("__meta_kubernetes_pod_controller_name", "checkout-7d4b9c"),
            ("__meta_kubernetes_pod_workload_kind", "Deployment"),
            ("__meta_kubernetes_pod_workload_name", "checkout"),
            (
                "__meta_kubernetes_pod_label_app_kubernetes_io_name",
                "checkout",
            ),
            (
                "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name",
                "true",
            ),
            (
                "__meta_kubernetes_pod_annotation_profiles_grafana_com_cpu_scrape",
                "true",
            ),
        ] {
            assert_eq!(first.get(name).map(String::as_str), Some(value), "{name}");
        }
        assert_eq!(
            targets[1].labels["__meta_kubernetes_pod_container_port_protocol"],
            "UDP"
        );
        assert!(!targets[2]
            .labels
            .contains_key("__meta_kubernetes_pod_container_port_number"));
        assert_eq!(
            targets[2].labels["__meta_kubernetes_pod_container_name"],
            "sidecar"
        );
    }

    #[test]
    fn a_cronjobs_pod_names_the_cronjob_and_a_bare_pod_none() {
        let job = pod(
            serde_json::json!({"metadata": {"name": "p", "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "nightly-report-29480000",
             "uid": "j", "controller": true}]}}),
        );
        assert_eq!(
            workload(&job),
            Some(("CronJob".to_string(), "nightly-report".to_string()))
        );
        let plain_job = pod(
            serde_json::json!({"metadata": {"name": "p", "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "migrate", "uid": "j", "controller": true}]}}),
        );
        assert_eq!(
            workload(&plain_job),
            Some(("Job".to_string(), "migrate".to_string()))
        );
        assert_eq!(
            workload(&pod(serde_json::json!({"metadata": {"name": "p"}}))),
            None
        );
    }

    #[test]
    fn a_node_is_a_target_at_its_internal_ip_on_the_kubelets_port() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-a", "labels": {"kubernetes.io/arch": "amd64"}},
            "status": {"addresses": [{"type": "Hostname", "address": "node-a"},
                {"type": "InternalIP", "address": "10.0.0.5"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}
        }))
        .expect("a node");
        let targets = node_targets(&node);
        assert_eq!(targets[0].address, "10.0.0.5:10250");
        assert_eq!(targets[0].labels["instance"], "node-a");
        assert_eq!(
            targets[0].labels["__meta_kubernetes_node_address_InternalIP"],
            "10.0.0.5"
        );
        assert_eq!(
            targets[0].labels["__meta_kubernetes_node_label_kubernetes_io_arch"],
            "amd64"
        );
    }

    #[test]
    fn a_service_is_a_target_per_port_at_its_dns_name() {
        let service: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "checkout", "namespace": "shop"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10",
                "ports": [{"name": "pprof", "port": 6060}]}
        }))
        .expect("a service");
        let targets = service_targets(&service);
        assert_eq!(targets[0].address, "checkout.shop.svc:6060");
        assert_eq!(
            targets[0].labels["__meta_kubernetes_service_port_name"],
            "pprof"
        );
        assert_eq!(
            targets[0].labels["__meta_kubernetes_service_cluster_ip"],
            "10.96.0.10"
        );
    }
}

//! Kubernetes, as Kiln sees it: pods, services, endpoints and nodes, followed through the
//! API server, turned into scrape targets with Prometheus's `__meta_kubernetes_*`
//! labels (`kubernetes_sd_configs`), and into the pod and container of a process for the
//! host agent.
//!
//! The client and the watches are kube-rs's (`kube`, with `k8s-openapi`'s types): they
//! list, watch from the list's `resourceVersion` with bookmarks, list again on `410 Gone`
//! and back off while the API server is down ([`watch`]). What this crate adds is the
//! labels ([`targets`]), the choice of API server and credentials ([`client`]), keeping
//! the last complete list while a new one is under way, and the index of a node's pods
//! by container id that labels the agent's profiles ([`pods`]).

pub mod client;
pub mod pods;
pub mod targets;
pub mod watch;

pub use client::ApiConfig;
pub use pods::{NodePods, PodContainer};
pub use targets::Target;
pub use watch::{Discovery, Role, Selector, WatchConfig};

/// Why Kubernetes cannot be reached as configured.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubernetes: {0}")]
    Config(String),
    #[error("kubernetes: cannot use the kubeconfig {path}: {source}")]
    Kubeconfig {
        path: std::path::PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("kubernetes: cannot make a client: {0}")]
    Client(#[source] kube::Error),
}

//! Following the cluster: per resource and namespace, kube's watcher lists, then watches
//! from the list's `resourceVersion` with bookmarks, lists again on `410 Gone` or a lost
//! stream, and backs off while the API server is down. Objects are kept here between
//! lists: a list replaces them only once it is complete, so an API server that is down
//! leaves the last known targets in place.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use kube::runtime::watcher;
use kube::Api;
use serde::de::DeserializeOwned;
use tokio::sync::watch as channel;

use crate::targets::{self, Target};

/// Prometheus's roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Pod,
    Service,
    Endpoints,
    Node,
}

impl Role {
    pub fn parse(text: &str) -> Option<Role> {
        Some(match text {
            "pod" => Role::Pod,
            "service" => Role::Service,
            "endpoints" => Role::Endpoints,
            "node" => Role::Node,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Pod => "pod",
            Role::Service => "service",
            Role::Endpoints => "endpoints",
            Role::Node => "node",
        }
    }
}

/// A label or field selector for one role's watches (`selectors`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    pub role: Option<Role>,
    pub label: Option<String>,
    pub field: Option<String>,
}

/// What to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchConfig {
    pub role: Role,
    /// Empty: every namespace.
    pub namespaces: Vec<String>,
    pub selectors: Vec<Selector>,
}

/// (namespace, name) of an object.
/// (namespace, name).
pub(crate) type Key = (String, String);

#[derive(Default)]
struct Objects {
    pods: BTreeMap<Key, Pod>,
    services: BTreeMap<Key, Service>,
    endpoints: BTreeMap<Key, Endpoints>,
    nodes: BTreeMap<Key, Node>,
}

/// The objects of one kind, as a watch updates them.
trait Kind: Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static {
    const ROLE: Role;
    fn store(objects: &mut Objects) -> &mut BTreeMap<Key, Self>;
}

macro_rules! kind {
    ($type:ty, $role:expr, $field:ident) => {
        impl Kind for $type {
            const ROLE: Role = $role;
            fn store(objects: &mut Objects) -> &mut BTreeMap<Key, Self> {
                &mut objects.$field
            }
        }
    };
}
kind!(Pod, Role::Pod, pods);
kind!(Service, Role::Service, services);
#[allow(deprecated)]
mod endpoints_kind {
    use super::*;
    kind!(Endpoints, Role::Endpoints, endpoints);
}
kind!(Node, Role::Node, nodes);

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// A running discovery: its targets, sent again at every change.
pub struct Discovery {
    targets: channel::Receiver<Arc<Vec<Target>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Discovery {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Discovery {
    /// Starts the watches `config` needs (the endpoints role also watches services and
    /// pods, whose labels its targets carry).
    pub fn start(client: kube::Client, config: WatchConfig) -> Discovery {
        let (send, targets) = channel::channel(Arc::new(Vec::new()));
        let shared = Arc::new(Shared {
            objects: Mutex::new(Objects::default()),
            send,
            role: config.role,
        });
        let namespaces: Vec<Option<String>> = if config.namespaces.is_empty() {
            vec![None]
        } else {
            config.namespaces.iter().cloned().map(Some).collect()
        };
        let mut tasks = Vec::new();
        let kinds: &[Role] = match config.role {
            Role::Endpoints => &[Role::Endpoints, Role::Service, Role::Pod],
            role => match role {
                Role::Pod => &[Role::Pod],
                Role::Service => &[Role::Service],
                Role::Node => &[Role::Node],
                Role::Endpoints => &[],
            },
        };
        for kind in kinds {
            let selector = |role: Role| {
                config
                    .selectors
                    .iter()
                    .filter(|s| s.role.is_none_or(|r| r == role))
                    .fold(watcher::Config::default(), |mut watch, s| {
                        if let Some(label) = &s.label {
                            watch = watch.labels(label);
                        }
                        if let Some(field) = &s.field {
                            watch = watch.fields(field);
                        }
                        watch
                    })
            };
            let watch = selector(*kind);
            // Nodes have no namespace.
            let spaces = if *kind == Role::Node {
                vec![None]
            } else {
                namespaces.clone()
            };
            for namespace in spaces {
                let (client, shared, watch) = (client.clone(), shared.clone(), watch.clone());
                tasks.push(match kind {
                    Role::Pod => {
                        let api = api::<Pod>(client, &namespace);
                        tokio::spawn(follow(api, namespace, watch, shared))
                    }
                    Role::Service => {
                        let api = api::<Service>(client, &namespace);
                        tokio::spawn(follow(api, namespace, watch, shared))
                    }
                    #[allow(deprecated)]
                    Role::Endpoints => {
                        let api = api::<Endpoints>(client, &namespace);
                        tokio::spawn(follow(api, namespace, watch, shared))
                    }
                    Role::Node => {
                        tokio::spawn(follow(Api::<Node>::all(client), None, watch, shared))
                    }
                });
            }
        }
        Discovery { targets, tasks }
    }

    /// The targets now.
    pub fn targets(&self) -> Arc<Vec<Target>> {
        self.targets.borrow().clone()
    }

    /// A receiver that wakes at every change of the targets.
    pub fn subscribe(&self) -> channel::Receiver<Arc<Vec<Target>>> {
        self.targets.clone()
    }
}

struct Shared {
    objects: Mutex<Objects>,
    send: channel::Sender<Arc<Vec<Target>>>,
    role: Role,
}

impl Shared {
    /// Builds the role's targets from the objects and sends them when they changed.
    fn publish(&self, objects: &Objects) {
        let mut all: Vec<Target> = match self.role {
            Role::Pod => objects
                .pods
                .values()
                .flat_map(targets::pod_targets)
                .collect(),
            Role::Service => objects
                .services
                .values()
                .flat_map(targets::service_targets)
                .collect(),
            Role::Node => objects
                .nodes
                .values()
                .flat_map(targets::node_targets)
                .collect(),
            Role::Endpoints => {
                let pod_of = |namespace: &str, name: &str| {
                    objects
                        .pods
                        .get(&(namespace.to_string(), name.to_string()))
                        .cloned()
                };
                objects
                    .endpoints
                    .iter()
                    .flat_map(|(key, endpoints)| {
                        targets::endpoints_targets(endpoints, objects.services.get(key), &pod_of)
                    })
                    .collect()
            }
        };
        all.sort();
        self.send.send_if_modified(|current| {
            if **current == all {
                return false;
            }
            *current = Arc::new(all);
            true
        });
    }
}

/// The API of a namespaced kind in one namespace, or in all.
fn api<K>(client: kube::Client, namespace: &Option<String>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    }
}

/// What a watch saw: a whole list (complete, after `Init`…`InitDone`), or one object.
pub(crate) enum Change<K> {
    Listed(BTreeMap<Key, K>),
    Applied(K),
    Deleted(K),
}

/// Follows `api` for as long as the task runs: kube-rs's watcher lists, watches from the
/// list's version with bookmarks, lists again on `410 Gone` and backs off while the API
/// server is down; a list is handed over only once complete, so the last one stands
/// meanwhile. `what` names the watch in logs.
pub(crate) async fn follow_changes<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &str,
    mut apply: impl FnMut(Change<K>),
) where
    K: kube::Resource + Clone + std::fmt::Debug + Send + DeserializeOwned + 'static,
    K::DynamicType: Default,
{
    use kube::runtime::WatchStreamExt;
    let mut stream = watcher(api, config).default_backoff().boxed();
    // Objects of the list under way, put in place once it is complete.
    let mut listing: Option<BTreeMap<Key, K>> = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::Init) => listing = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(object)) => {
                if let Some(listing) = &mut listing {
                    listing.insert(key(kube::Resource::meta(&object)), object);
                }
            }
            Ok(watcher::Event::InitDone) => {
                apply(Change::Listed(listing.take().unwrap_or_default()))
            }
            Ok(watcher::Event::Apply(object)) => apply(Change::Applied(object)),
            Ok(watcher::Event::Delete(object)) => apply(Change::Deleted(object)),
            Err(err) => {
                tracing::warn!(watch = what, error = %err, "kubernetes: the watch failed; keeping the last objects and trying again");
            }
        }
    }
}

async fn follow<K>(
    api: Api<K>,
    namespace: Option<String>,
    config: watcher::Config,
    shared: Arc<Shared>,
) where
    K: Kind + kube::Resource,
    K::DynamicType: Default,
{
    let role = K::ROLE.name();
    let space = namespace.as_deref().unwrap_or("*");
    let what = format!("{role} in {space}");
    follow_changes(api, config, &what, |change| {
        let Ok(mut objects) = shared.objects.lock() else {
            return;
        };
        let store = K::store(&mut objects);
        match change {
            Change::Listed(listed) => {
                // Only this watch's namespace is replaced: others have watches of their own.
                store.retain(|(ns, _), _| namespace.as_ref().is_some_and(|mine| mine != ns));
                store.extend(listed);
                tracing::debug!(
                    role,
                    namespace = space,
                    objects = store.len(),
                    "kubernetes: listed"
                );
            }
            Change::Applied(object) => {
                store.insert(key(kube::Resource::meta(&object)), object);
            }
            Change::Deleted(object) => {
                store.remove(&key(kube::Resource::meta(&object)));
            }
        }
        shared.publish(&objects);
    })
    .await;
}

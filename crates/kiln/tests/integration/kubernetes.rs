//! Kubernetes service discovery end to end, against kiln-testkit's API server double (no
//! cluster runs here; Prometheus tests its discovery the same way): real Go programs
//! behind pods annotated in kube-profefe's and in Pyroscope's convention, scraped
//! through `deploy/kubernetes/scrape.yaml` as shipped.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kiln_node::ServerConfig;
use kiln_testkit::kubernetes::{param, ApiServer};

use crate::agent::stop;
use crate::common::*;
use crate::pyroscope::url_escape;
use crate::scrape::{cumulative_heap, serve, start_burner, wait_until};

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// The shipped scrape config, pointed at `api_server`, scraping every 2 s.
fn shipped_config(api_server: &str) -> Vec<kiln_scrape::ScrapeConfig> {
    #[derive(serde::Deserialize)]
    struct File {
        scrape_configs: Vec<kiln_scrape::ScrapeConfig>,
    }
    let text = std::fs::read_to_string(workspace_root().join("deploy/kubernetes/scrape.yaml"))
        .expect("deploy/kubernetes/scrape.yaml");
    let mut file: File = yaml_serde::from_str(&text).expect("scrape.yaml parses");
    for job in &mut file.scrape_configs {
        job.validate().expect("scrape.yaml is valid");
        job.scrape_interval = Duration::from_secs(2);
        job.scrape_timeout = Duration::from_millis(1900);
        for kubernetes in &mut job.kubernetes_sd_configs {
            kubernetes.api_server = Some(api_server.to_string());
        }
    }
    file.scrape_configs
}

fn pod(
    namespace: &str,
    name: &str,
    owner: Option<(&str, &str)>,
    labels: serde_json::Value,
    annotations: serde_json::Value,
    ports: serde_json::Value,
) -> serde_json::Value {
    let owners: Vec<serde_json::Value> = owner
        .map(|(kind, owner)| {
            serde_json::json!({"apiVersion": "apps/v1", "kind": kind, "name": owner,
                "uid": format!("uid-{owner}"), "controller": true})
        })
        .into_iter()
        .collect();
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
            "labels": labels, "annotations": annotations, "ownerReferences": owners},
        "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": "shop/app:1", "ports": ports}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1", "hostIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "app", "containerID": format!("containerd://{name}-id"),
                "image": "shop/app:1", "imageID": "", "ready": true, "restartCount": 0}]}
    })
}

fn port_of(address: &str) -> u16 {
    address
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("host:port")
}

/// Active targets: (pod, kind) → the target's JSON.
fn active(server: &TestServer) -> Vec<serde_json::Value> {
    let targets = server.json("/api/v1/targets", &[]);
    targets["data"]["activeTargets"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn kinds_of(targets: &[serde_json::Value], pod: &str) -> Vec<String> {
    let mut kinds: Vec<String> = targets
        .iter()
        .filter(|t| t["labels"]["pod"] == pod)
        .map(|t| t["profileKind"].as_str().unwrap_or_default().to_string())
        .collect();
    kinds.sort();
    kinds
}

/// Pods annotated in each convention are scraped through the shipped config, with
/// `service_name` from the annotation or `<namespace>/<workload>` and `namespace`, `pod`,
/// `container` labels; an unannotated pod is not. A pod added is scraped within 2 s; one
/// deleted is not scraped after its event. The watch resumes from its bookmark when the
/// connection drops (no new list); an API server that goes down leaves the targets in
/// place, and once it is back (its history gone: `410 Gone`) the pods are listed again.
#[test]
fn annotated_pods_are_discovered_scraped_and_followed() {
    let dir = tempfile::tempdir().unwrap();
    let (Some(profefe), Some(grafana)) = (start_burner(dir.path()), start_burner(dir.path()))
    else {
        println!("skipped: the Kubernetes discovery test (go not installed)");
        return;
    };
    let api = ApiServer::start();
    // kube-profefe's convention: the port in an annotation, none declared.
    api.apply(
        "pods",
        pod(
            "shop",
            "checkout-7d4b9c-x2x9q",
            Some(("ReplicaSet", "checkout-7d4b9c")),
            serde_json::json!({"pod-template-hash": "7d4b9c"}),
            serde_json::json!({"profefe.com/enable": "true",
                "profefe.com/port": port_of(&profefe.address).to_string()}),
            serde_json::json!([]),
        ),
    );
    // Pyroscope's: CPU only, on the port named in the annotation.
    api.apply(
        "pods",
        pod(
            "shop",
            "cart-0",
            Some(("StatefulSet", "cart")),
            serde_json::json!({}),
            serde_json::json!({"profiles.grafana.com/cpu.scrape": "true",
                "profiles.grafana.com/cpu.port_name": "pprof",
                "profiles.grafana.com/service_name": "cart"}),
            serde_json::json!([{"name": "http", "containerPort": 1},
                {"name": "pprof", "containerPort": port_of(&grafana.address)}]),
        ),
    );
    // No annotation: not scraped.
    api.apply(
        "pods",
        pod(
            "shop",
            "web-1",
            None,
            serde_json::json!({}),
            serde_json::json!({}),
            serde_json::json!([{"name": "http", "containerPort": port_of(&grafana.address)}]),
        ),
    );
    let configs = shipped_config(&api.url());
    let server = TestServer::start_with(|config: &mut ServerConfig| {
        config.scrape_configs = configs;
    });
    wait_until(
        "the annotated pods' targets",
        Duration::from_secs(30),
        || {
            let targets = active(&server);
            kinds_of(&targets, "checkout-7d4b9c-x2x9q").len() == 5
                && kinds_of(&targets, "cart-0").len() == 1
        },
    );
    let targets = active(&server);
    assert_eq!(
        kinds_of(&targets, "checkout-7d4b9c-x2x9q"),
        ["block", "goroutine", "memory", "mutex", "process_cpu"]
    );
    assert_eq!(kinds_of(&targets, "cart-0"), ["process_cpu"]);
    assert!(kinds_of(&targets, "web-1").is_empty(), "{targets:?}");
    for target in &targets {
        let labels = &target["labels"];
        let (service, address) = if labels["pod"] == "cart-0" {
            ("cart", &grafana.address)
        } else {
            ("shop/checkout", &profefe.address)
        };
        assert_eq!(labels["service_name"], service, "{target}");
        assert_eq!(labels["namespace"], "shop", "{target}");
        assert_eq!(labels["container"], "app", "{target}");
        assert_eq!(labels["node"], "node-a", "{target}");
        assert_eq!(labels["instance"], address.as_str(), "{target}");
        let discovered = &target["discoveredLabels"];
        assert_eq!(discovered["__meta_kubernetes_pod_ip"], "127.0.0.1");
        assert_eq!(discovered["__meta_kubernetes_pod_node_name"], "node-a");
        assert_eq!(discovered["__meta_kubernetes_pod_container_name"], "app");
    }
    let checkout = targets
        .iter()
        .find(|t| t["labels"]["pod"] == "checkout-7d4b9c-x2x9q")
        .unwrap();
    let discovered = &checkout["discoveredLabels"];
    assert_eq!(
        discovered["__meta_kubernetes_pod_controller_kind"],
        "ReplicaSet"
    );
    assert_eq!(
        discovered["__meta_kubernetes_pod_controller_name"],
        "checkout-7d4b9c"
    );
    assert_eq!(
        discovered["__meta_kubernetes_pod_workload_name"],
        "checkout"
    );
    assert_eq!(
        discovered["__meta_kubernetes_pod_container_id"],
        "checkout-7d4b9c-x2x9q-id"
    );
    // Real profiles from both programs, under their service names.
    for service in ["shop/checkout", "cart"] {
        wait_until(
            &format!("{service}'s CPU profile"),
            Duration::from_secs(60),
            || {
                crate::scrape::self_by_function(&server, CPU, service)
                    .iter()
                    .any(|(name, _)| name == "main.kilnBurnCPU")
            },
        );
    }
    println!("scraped through Kubernetes discovery: shop/checkout (profefe.com), cart (profiles.grafana.com)");

    // A pod added is scraped within 2 s (its scrape interval); deleted, it is not
    // scraped again.
    let hits: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let recorded = hits.clone();
    let heap = cumulative_heap(1);
    let fake = serve(move |_| {
        recorded.lock().unwrap().push(Instant::now());
        (200, heap.clone())
    });
    let added = Instant::now();
    api.apply(
        "pods",
        pod(
            "shop",
            "cache-5f6d7-abcde",
            Some(("ReplicaSet", "cache-5f6d7")),
            serde_json::json!({"pod-template-hash": "5f6d7"}),
            serde_json::json!({"profiles.grafana.com/memory.scrape": "true",
                "profiles.grafana.com/memory.port": port_of(&fake).to_string()}),
            serde_json::json!([]),
        ),
    );
    wait_until(
        "the new pod's first scrape",
        Duration::from_secs(10),
        || !hits.lock().unwrap().is_empty(),
    );
    let first = hits.lock().unwrap()[0].duration_since(added);
    println!(
        "a pod added: scraped {} ms after its event",
        first.as_millis()
    );
    assert!(first <= Duration::from_millis(2500), "{first:?}");
    let cache = active(&server)
        .into_iter()
        .find(|t| t["labels"]["pod"] == "cache-5f6d7-abcde")
        .expect("the new pod's target");
    assert_eq!(cache["labels"]["service_name"], "shop/cache");
    assert!(api.delete("pods", "shop", "cache-5f6d7-abcde"));
    let deleted = Instant::now();
    wait_until(
        "the deleted pod's target to go",
        Duration::from_secs(5),
        || kinds_of(&active(&server), "cache-5f6d7-abcde").is_empty(),
    );
    let gone = deleted.elapsed();
    std::thread::sleep(Duration::from_secs(5));
    let after: Vec<Duration> = hits
        .lock()
        .unwrap()
        .iter()
        .filter(|at| **at > deleted)
        .map(|at| at.duration_since(deleted))
        .collect();
    println!(
        "a pod deleted: its target gone {} ms after the event, {} scrapes after it",
        gone.as_millis(),
        after.len()
    );
    assert!(gone <= Duration::from_secs(1), "{gone:?}");
    assert!(after.is_empty(), "scraped after its deletion: {after:?}");

    // A dropped watch resumes from the last version seen, with no new list.
    let lists = |api: &ApiServer| api.log().iter().filter(|r| !r.is_watch()).count();
    let watches = |api: &ApiServer| api.log().iter().filter(|r| r.is_watch()).count();
    let (lists_before, watches_before) = (lists(&api), watches(&api));
    api.drop_watches();
    wait_until("a new watch", Duration::from_secs(10), || {
        watches(&api) > watches_before
    });
    assert_eq!(lists(&api), lists_before, "a dropped watch listed again");
    let resumed = api
        .log()
        .into_iter()
        .rfind(|r| r.is_watch())
        .expect("a watch");
    assert!(
        resumed.query.contains("allowWatchBookmarks=true")
            && resumed.query.contains("resourceVersion="),
        "{resumed:?}"
    );

    // The API server down: the targets stay. Back, with its history gone, the watch
    // from the old version gets 410 and the pods are listed again.
    api.stop();
    std::thread::sleep(Duration::from_secs(3));
    let targets = active(&server);
    assert_eq!(kinds_of(&targets, "checkout-7d4b9c-x2x9q").len(), 5);
    assert_eq!(kinds_of(&targets, "cart-0").len(), 1);
    let lists_down = lists(&api);
    api.apply(
        "pods",
        pod(
            "shop",
            "cart-1",
            Some(("StatefulSet", "cart")),
            serde_json::json!({}),
            serde_json::json!({"profiles.grafana.com/goroutine.scrape": "true",
                "profiles.grafana.com/goroutine.port": port_of(&grafana.address).to_string()}),
            serde_json::json!([]),
        ),
    );
    api.restart();
    wait_until("the pods listed again", Duration::from_secs(60), || {
        kinds_of(&active(&server), "cart-1") == ["goroutine"]
    });
    assert!(lists(&api) > lists_down, "no list after the restart");
    println!(
        "the API server: {} lists and {} watches in all; a dropped watch resumed at {:?} with no list; after the restart (410 Gone) listed again",
        lists(&api),
        watches(&api),
        param(&resumed.query, "resourceVersion")
    );
    let targets = active(&server);
    assert_eq!(kinds_of(&targets, "checkout-7d4b9c-x2x9q").len(), 5);
    assert_eq!(kinds_of(&targets, "cart-0"), ["process_cpu"]);
}

/// A pod `shop/<name>` of StatefulSet `cache` annotated for memory scrapes, served by a
/// heap endpoint; the times of its scrapes.
fn memory_pod(api: &ApiServer, name: &str) -> Arc<Mutex<Vec<Instant>>> {
    let hits: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let recorded = hits.clone();
    let heap = cumulative_heap(1);
    let target = serve(move |_| {
        recorded.lock().unwrap().push(Instant::now());
        (200, heap.clone())
    });
    api.apply(
        "pods",
        pod(
            "shop",
            name,
            Some(("StatefulSet", "cache")),
            serde_json::json!({}),
            serde_json::json!({"profiles.grafana.com/memory.scrape": "true",
                "profiles.grafana.com/memory.port": port_of(&target).to_string()}),
            serde_json::json!([]),
        ),
    );
    hits
}

/// An API server double over HTTPS that takes only the token `token-one`, and a service
/// account directory in `dir` for namespace `namespace` that trusts it; `None` (`test`
/// says it skipped) where no certificate can be made.
fn in_cluster(
    dir: &std::path::Path,
    namespace: &str,
    test: &str,
) -> Option<(ApiServer, std::path::PathBuf)> {
    let certs = match kiln_testkit::tls::certificates(dir, "apiserver") {
        Ok(certs) => certs,
        Err(err) => {
            println!("skipped: {test} ({err})");
            return None;
        }
    };
    let account = dir.join("serviceaccount");
    std::fs::create_dir(&account).unwrap();
    std::fs::copy(&certs.ca, account.join("ca.crt")).unwrap();
    std::fs::write(account.join("namespace"), format!("{namespace}\n")).unwrap();
    std::fs::write(account.join("token"), "token-one\n").unwrap();
    let api = ApiServer::start_tls(&certs);
    api.require_token("token-one");
    Some((api, account))
}

/// The environment a pod's process finds: the API server's service, and (for the test)
/// where its service account is.
fn in_cluster_env(api: &ApiServer, account: &std::path::Path) -> Vec<(String, std::ffi::OsString)> {
    vec![
        ("KUBERNETES_SERVICE_HOST".into(), "127.0.0.1".into()),
        (
            "KUBERNETES_SERVICE_PORT".into(),
            api.port().to_string().into(),
        ),
        ("KILN_KUBERNETES_SERVICE_ACCOUNT_DIR".into(), account.into()),
    ]
}

/// In a pod: no `api_server`, so `kiln scrape` reads its service account (a fake
/// directory here, named by `KILN_KUBERNETES_SERVICE_ACCOUNT_DIR`; the API server at
/// `KUBERNETES_SERVICE_HOST`/`_PORT`, over HTTPS checked against the account's `ca.crt`),
/// watches only its own namespace (`own_namespace`), and sends the account's token. When
/// the kubelet rotates the token (the file replaced by a rename), the next request
/// carries the new one, and the API server, which now takes only that, keeps answering.
#[test]
fn in_cluster_config_reads_the_service_account_and_follows_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let Some((api, account)) = in_cluster(dir.path(), "shop", "the in-cluster test") else {
        return;
    };
    let hits = memory_pod(&api, "cache-0");
    let text = std::fs::read_to_string(workspace_root().join("deploy/kubernetes/scrape.yaml"))
        .unwrap()
        .replace("scrape_interval: 15s", "scrape_interval: 1s")
        .replace("scrape_timeout: 14s", "scrape_timeout: 900ms")
        .replace(
            "      - role: pod\n",
            "      - role: pod\n        namespaces: {own_namespace: true}\n",
        );
    let config = dir.path().join("scrape.yaml");
    std::fs::write(&config, text).unwrap();
    let receiver = TestServer::start();
    let mut scraper = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["scrape", "--config"])
        .arg(&config)
        .args(["--push-url", &receiver.url])
        .env("KILN_LOG_LEVEL", "warn")
        .envs(in_cluster_env(&api, &account))
        .spawn()
        .expect("kiln scrape starts");
    wait_until("a scrape of the pod", Duration::from_secs(30), || {
        !hits.lock().unwrap().is_empty()
    });
    let log = api.log();
    assert!(
        log.iter().all(|r| r.path == "/api/v1/namespaces/shop/pods"),
        "only its own namespace: {:?}",
        log.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    assert!(log
        .iter()
        .all(|r| r.authorization.as_deref() == Some("Bearer token-one")));
    // The kubelet's rotation: a new file renamed over the old.
    std::fs::write(account.join("token.new"), "token-two\n").unwrap();
    std::fs::rename(account.join("token.new"), account.join("token")).unwrap();
    api.require_token("token-two");
    let rotated = api.log().len();
    api.drop_watches();
    wait_until(
        "a request with the new token",
        Duration::from_secs(20),
        || {
            api.log()[rotated..]
                .iter()
                .any(|r| r.authorization.as_deref() == Some("Bearer token-two"))
        },
    );
    // Still following: a pod added now is scraped.
    let second = memory_pod(&api, "cache-1");
    wait_until(
        "a scrape of the pod added after the rotation",
        Duration::from_secs(20),
        || !second.lock().unwrap().is_empty(),
    );
    let refused = api.log()[rotated..]
        .iter()
        .filter(|r| r.authorization.as_deref() != Some("Bearer token-two"))
        .count();
    println!(
        "in-cluster: {} requests to /api/v1/namespaces/shop/pods over HTTPS; after the rotation, {refused} with the old token (refused), then the new one",
        api.log().len()
    );
    let _ = scraper.kill();
    let _ = scraper.wait();
}

/// A cgroup made for a test in the cgroup v2 hierarchy, removed (with its children, once
/// their processes are gone) when dropped.
struct TestCgroup(std::path::PathBuf);

impl TestCgroup {
    /// `None` (the test says it skipped) where cgroup v2 is not writable.
    fn create() -> Option<TestCgroup> {
        // cgroup v2: the root, or where a host with v1 too mounts it.
        let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
            .map(std::path::Path::new)
            .into_iter()
            .find(|root| root.join("cgroup.controllers").exists());
        let dir = root.map(|root| root.join(format!("kiln-test-kubepods-{}", std::process::id())));
        match dir.as_ref().map(std::fs::create_dir) {
            Some(Ok(())) => dir.map(TestCgroup),
            Some(Err(err)) => {
                println!("skipped: the agent's pods test (cannot make a cgroup: {err})");
                None
            }
            None => {
                println!("skipped: the agent's pods test (no cgroup v2 at /sys/fs/cgroup)");
                None
            }
        }
    }

    /// A child cgroup at `relative` (made with its parents).
    fn child(&self, relative: &str) -> std::path::PathBuf {
        let dir = self.0.join(relative);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Deepest first: a cgroup goes only once it has no children and no processes.
        let mut dirs: Vec<std::path::PathBuf> = walk(&self.0);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            all.extend(walk(&entry.path()));
        }
    }
    all
}

/// A Python busy loop of `seconds`, started in cgroup `cgroup` (none: the test's own).
fn busy_python(cgroup: Option<&std::path::Path>, seconds: u32) -> std::process::Child {
    let program =
        format!("import time\nt = time.time() + {seconds}\nwhile time.time() < t: pass\n");
    let enter = cgroup.map_or(String::new(), |dir| {
        format!("echo $$ > {}/cgroup.procs && ", dir.display())
    });
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{enter}exec python3 -c \"$0\""))
        .arg(program)
        .spawn()
        .expect("sh and python3 run")
}

/// The values of `label` in the series of process `pid` once it runs Python. Its first
/// moments, the fork of the test binary and `sh` before it enters its cgroup, are
/// rightly labelled as what they were then, and are not what the test asks about.
fn label_of(server: &TestServer, pid: u32, label: &str) -> Vec<String> {
    let query = format!(r#"{{pid="{pid}", comm=~"python.*"}}"#);
    let path = format!(
        "/pyroscope/label-values?label={label}&query={}&from=0&until=now",
        url_escape(&query)
    );
    serde_json::from_value(server.json(&path, &[])).unwrap_or_default()
}

/// `kiln agent --kubernetes` on node `node-test`, in a pod (in-cluster config): it
/// watches only its node's pods (`spec.nodeName`), finds each process's pod by the
/// container id in its cgroup path, or by the pod uid there for a container whose id the
/// pod's status does not have yet, and labels its profiles with the pod's namespace, pod,
/// container, node and workload; `service_name` is the workload's, or the pod's
/// annotation. Relabeling sees `__meta_kubernetes_*`. A process of a pod on another node,
/// and one in no pod, keep the agent's own labels. Real processes in real cgroups.
#[test]
fn the_agent_labels_each_process_with_its_pod() {
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: the agent's pods test (needs root for cgroups and perf events)");
        return;
    }
    let Some(cgroups) = TestCgroup::create() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some((api, account)) = in_cluster(dir.path(), "kiln", "the agent's pods test") else {
        return;
    };
    let id = |seed: char| seed.to_string().repeat(64);
    let with = |mut pod: serde_json::Value, uid: &str, node: &str, container_id: Option<String>| {
        pod["metadata"]["uid"] = uid.into();
        pod["spec"]["nodeName"] = node.into();
        match container_id {
            Some(id) => {
                pod["status"]["containerStatuses"][0]["containerID"] =
                    format!("containerd://{id}").into()
            }
            None => pod["status"]["containerStatuses"][0]
                .as_object_mut()
                .unwrap()
                .retain(|key, _| key != "containerID"),
        }
        pod
    };
    let (checkout_uid, report_uid, elsewhere_uid) = (
        "0e5f9a34-1b2c-4d5e-8f90-123456789abc",
        "7c9e6679-7425-40de-944b-e07fc1f90ae7",
        "16fd2706-8baf-433b-82eb-8c7fada847da",
    );
    api.apply(
        "pods",
        with(
            pod(
                "shop",
                "checkout-7d4b9c-x2x9q",
                Some(("ReplicaSet", "checkout-7d4b9c")),
                serde_json::json!({"app": "checkout", "pod-template-hash": "7d4b9c"}),
                serde_json::json!({}),
                serde_json::json!([]),
            ),
            checkout_uid,
            "node-test",
            Some(id('a')),
        ),
    );
    api.apply(
        "pods",
        with(
            pod(
                "shop",
                "cart-0",
                Some(("StatefulSet", "cart")),
                serde_json::json!({"app": "cart"}),
                serde_json::json!({}),
                serde_json::json!([]),
            ),
            elsewhere_uid,
            "node-other",
            Some(id('c')),
        ),
    );
    let config = dir.path().join("kiln.yaml");
    std::fs::write(
        &config,
        "agent:\n  relabel_configs:\n    - source_labels: [__meta_kubernetes_pod_label_app]\n      target_label: app\n",
    )
    .unwrap();
    let server = TestServer::start();
    let env = in_cluster_env(&api, &account);
    let mut env: Vec<(&str, &std::ffi::OsStr)> = env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_os_str()))
        .collect();
    env.push(("NODE_NAME", std::ffi::OsStr::new("node-test")));
    let config_arg = config.to_string_lossy().to_string();
    let Some(agent) = crate::agent::start_agent_env(
        &["--push-url", &server.url],
        &[
            "--kubernetes",
            "--config",
            &config_arg,
            "--interpreters",
            "false",
        ],
        &env,
    ) else {
        return;
    };
    // A pod that arrives once the agent runs, its container's id not in its status yet.
    api.apply(
        "pods",
        with(
            pod(
                "batch",
                "report-29000000-q8z7w",
                Some(("Job", "report-29000000")),
                serde_json::json!({}),
                serde_json::json!({"profefe.com/service": "nightly-report"}),
                serde_json::json!([]),
            ),
            report_uid,
            "node-test",
            None,
        ),
    );
    std::thread::sleep(Duration::from_millis(300));
    let in_checkout = cgroups.child(&format!("pod{checkout_uid}/{}", id('a')));
    let in_report = cgroups.child(&format!(
        "kubepods-besteffort-pod{}.slice/cri-containerd-{}.scope",
        report_uid.replace('-', "_"),
        id('b')
    ));
    let in_elsewhere = cgroups.child(&format!("pod{elsewhere_uid}/{}", id('c')));
    let mut processes = [
        busy_python(Some(&in_checkout), 4),
        busy_python(Some(&in_report), 4),
        busy_python(Some(&in_elsewhere), 4),
        busy_python(None, 4),
    ];
    let pids: Vec<u32> = processes.iter().map(|p| p.id()).collect();
    for process in &mut processes {
        assert!(process.wait().unwrap().success());
    }
    wait_until(
        "the four processes' profiles",
        Duration::from_secs(20),
        || {
            pids.iter()
                .all(|pid| !label_of(&server, *pid, "service_name").is_empty())
        },
    );
    stop(agent);
    let labels = |pid: u32| -> Vec<(String, String)> {
        [
            "service_name",
            "namespace",
            "pod",
            "container",
            "node",
            "controller_kind",
            "controller_name",
            "app",
            "container_id",
        ]
        .into_iter()
        .flat_map(|name| {
            label_of(&server, pid, name)
                .into_iter()
                .map(move |value| (name.to_string(), value))
        })
        .collect()
    };
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let checkout = labels(pids[0]);
    assert_eq!(
        checkout,
        pairs(&[
            ("service_name", "shop/checkout"),
            ("namespace", "shop"),
            ("pod", "checkout-7d4b9c-x2x9q"),
            ("container", "app"),
            ("node", "node-test"),
            ("controller_kind", "Deployment"),
            ("controller_name", "checkout"),
            ("app", "checkout"),
            ("container_id", &id('a')),
        ])
    );
    let report = labels(pids[1]);
    assert_eq!(
        report,
        pairs(&[
            ("service_name", "nightly-report"),
            ("namespace", "batch"),
            ("pod", "report-29000000-q8z7w"),
            ("node", "node-test"),
            ("controller_kind", "CronJob"),
            ("controller_name", "report"),
            ("container_id", &id('b')),
        ])
    );
    for (pid, what) in [(pids[2], "a pod of another node"), (pids[3], "no pod")] {
        let own = labels(pid);
        let service = label_of(&server, pid, "service_name");
        assert!(
            service.len() == 1 && service[0].starts_with("python3"),
            "{what}: {own:?}"
        );
        assert!(
            own.iter()
                .all(|(k, _)| !["namespace", "pod", "app"].contains(&k.as_str())),
            "{what}: {own:?}"
        );
    }
    let watches: Vec<String> = api
        .log()
        .iter()
        .map(|r| {
            param(&r.query, "fieldSelector")
                .map(|f| f.replace("%3D", "="))
                .unwrap_or_default()
        })
        .collect();
    assert!(
        !watches.is_empty() && watches.iter().all(|f| f == "spec.nodeName=node-test"),
        "{watches:?}"
    );
    println!(
        "the agent's pods: {} requests to the API server, each for spec.nodeName=node-test; checkout {:?}; report (by pod uid, added after the agent started) {:?}",
        watches.len(),
        checkout.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        report.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>()
    );
}

/// `kubectl kustomize deploy/kubernetes/overlays/<name>`, parsed: one JSON value per
/// object; `None` (the test says it skipped) without kubectl.
fn rendered(overlay: &str) -> Option<Vec<serde_json::Value>> {
    let output = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(
            workspace_root()
                .join("deploy/kubernetes/overlays")
                .join(overlay),
        )
        .output();
    let output = match output {
        Ok(output) => output,
        Err(err) => {
            println!("skipped: the kustomize test (kubectl: {err})");
            return None;
        }
    };
    assert!(
        output.status.success(),
        "kubectl kustomize {overlay}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    let objects = yaml_serde::Deserializer::from_str(&text)
        .map(|document| {
            let value: yaml_serde::Value = serde::Deserialize::deserialize(document).unwrap();
            serde_json::to_value(value).unwrap()
        })
        .filter(|value| !value.is_null())
        .collect();
    Some(objects)
}

/// `object` read as the Kubernetes type of its kind and written back keeps every field
/// as it was: none is unknown to the API (a typo, a field of another version; serde
/// would drop it) and none has the wrong type.
fn the_api_takes(object: &serde_json::Value) {
    use k8s_openapi::api::{apps, core, policy, rbac};
    fn round<T: serde::de::DeserializeOwned + serde::Serialize>(
        object: &serde_json::Value,
    ) -> Result<serde_json::Value, String> {
        let typed: T = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
        serde_json::to_value(typed).map_err(|e| e.to_string())
    }
    let kind = object["kind"].as_str().unwrap_or_default();
    let back = match (object["apiVersion"].as_str().unwrap_or_default(), kind) {
        ("v1", "Namespace") => round::<core::v1::Namespace>(object),
        ("v1", "ServiceAccount") => round::<core::v1::ServiceAccount>(object),
        ("v1", "ConfigMap") => round::<core::v1::ConfigMap>(object),
        ("v1", "Service") => round::<core::v1::Service>(object),
        ("apps/v1", "StatefulSet") => round::<apps::v1::StatefulSet>(object),
        ("apps/v1", "Deployment") => round::<apps::v1::Deployment>(object),
        ("apps/v1", "DaemonSet") => round::<apps::v1::DaemonSet>(object),
        ("policy/v1", "PodDisruptionBudget") => round::<policy::v1::PodDisruptionBudget>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round::<rbac::v1::ClusterRole>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round::<rbac::v1::ClusterRoleBinding>(object)
        }
        (version, kind) => Err(format!(
            "an object the test does not know: {version} {kind}"
        )),
    };
    let name = &object["metadata"]["name"];
    let back = back.unwrap_or_else(|err| panic!("{kind} {name}: {err}"));
    let mut lost = Vec::new();
    not_kept(object, &back, String::new(), &mut lost);
    assert!(
        lost.is_empty(),
        "{kind} {name}: fields the API does not take: {lost:?}"
    );
}

/// The paths of `original` that `back` does not hold as they were (what serialization
/// adds, a nested object's `apiVersion` and `kind`, is not counted).
fn not_kept(
    original: &serde_json::Value,
    back: &serde_json::Value,
    path: String,
    lost: &mut Vec<String>,
) {
    match (original, back) {
        (serde_json::Value::Object(original), serde_json::Value::Object(back)) => {
            for (key, value) in original {
                match back.get(key) {
                    Some(kept) => not_kept(value, kept, format!("{path}.{key}"), lost),
                    None => lost.push(format!("{path}.{key}")),
                }
            }
        }
        (serde_json::Value::Array(original), serde_json::Value::Array(back))
            if original.len() == back.len() =>
        {
            for (i, (value, kept)) in original.iter().zip(back).enumerate() {
                not_kept(value, kept, format!("{path}[{i}]"), lost);
            }
        }
        (original, back) if original == back => {}
        _ => lost.push(format!("{path}: {original} became {back}")),
    }
}

/// A container's environment variable `name`, as written (`value` or `valueFrom`).
fn env_of<'a>(container: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

fn of_kind<'a>(objects: &'a [serde_json::Value], kind: &str) -> Vec<&'a serde_json::Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

/// The pod template's labels match `selector` (a Service's, a PDB's `matchLabels`).
fn selects(selector: &serde_json::Value, template: &serde_json::Value) -> bool {
    let labels = &template["spec"]["template"]["metadata"]["labels"];
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &labels[k] == v))
}

/// What every rendered layout must hold: objects the API takes, flags and variables the
/// binary knows, ConfigMaps that exist for every volume, discovery RBAC of get, list and
/// watch on pods, nodes, endpoints and services only, bound only to service accounts that
/// pods use, and an agent with the least privilege: the host's pids and five
/// capabilities, not `privileged`. Returns the pods' templates by name.
fn check_layout(
    overlay: &str,
    objects: &[serde_json::Value],
) -> std::collections::BTreeMap<String, serde_json::Value> {
    let mut workloads = std::collections::BTreeMap::new();
    for object in objects {
        the_api_takes(object);
        assert_eq!(
            object["metadata"]["namespace"].as_str().unwrap_or("kiln"),
            "kiln",
            "{overlay}: {}",
            object["metadata"]["name"]
        );
        if ["Deployment", "StatefulSet", "DaemonSet"]
            .contains(&object["kind"].as_str().unwrap_or_default())
        {
            workloads.insert(
                object["metadata"]["name"].as_str().unwrap().to_string(),
                object.clone(),
            );
        }
    }
    let config_maps: Vec<&str> = of_kind(objects, "ConfigMap")
        .iter()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .collect();
    let mut accounts_used = std::collections::BTreeSet::new();
    let help = |command: &str| run_kiln([command, "--help"]);
    let (server_help, agent_help) = (help("server"), help("agent"));
    for (name, workload) in &workloads {
        let pod = &workload["spec"]["template"]["spec"];
        if let Some(account) = pod["serviceAccountName"].as_str() {
            accounts_used.insert(account.to_string());
        }
        for volume in pod["volumes"].as_array().into_iter().flatten() {
            if let Some(map) = volume["configMap"]["name"].as_str() {
                assert!(
                    config_maps.contains(&map),
                    "{overlay} {name}: no ConfigMap {map}"
                );
            }
        }
        let container = &pod["containers"][0];
        let args: Vec<&str> = container["args"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        let help = match args[0] {
            "server" => &server_help,
            "agent" => &agent_help,
            other => panic!("{overlay} {name}: kiln {other}"),
        };
        for flag in &args[1..] {
            let flag = flag.split('=').next().unwrap();
            assert!(
                help.contains(flag),
                "{overlay} {name}: kiln {} has no {flag}",
                args[0]
            );
        }
        for env in container["env"].as_array().into_iter().flatten() {
            let variable = env["name"].as_str().unwrap();
            if variable.starts_with("KILN_") {
                assert!(
                    help.contains(&format!("[env: {variable}=")),
                    "{overlay} {name}: kiln {} reads no {variable}",
                    args[0]
                );
            }
        }
        let resources = &container["resources"];
        assert!(
            resources["requests"]["cpu"].is_string() && resources["requests"]["memory"].is_string(),
            "{overlay} {name}: no requests"
        );
        assert!(
            resources["limits"]["memory"].is_string(),
            "{overlay} {name}: no memory limit"
        );
        let security = &container["securityContext"];
        assert_eq!(
            security["allowPrivilegeEscalation"], false,
            "{overlay} {name}"
        );
        assert_ne!(security["privileged"], true, "{overlay} {name}");
        assert_eq!(
            security["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{overlay} {name}"
        );
        if args[0] == "server" {
            assert_eq!(
                container["readinessProbe"]["httpGet"]["path"], "/ready",
                "{overlay} {name}"
            );
            assert!(
                security["capabilities"]["add"].is_null(),
                "{overlay} {name}"
            );
            assert!(
                !pod["hostPID"].as_bool().unwrap_or(false),
                "{overlay} {name}"
            );
        } else {
            assert_eq!(
                pod["hostPID"], true,
                "{overlay}: the agent sees the host's pids"
            );
            let added: Vec<&str> = security["capabilities"]["add"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|c| c.as_str())
                .collect();
            assert_eq!(
                added,
                [
                    "PERFMON",
                    "BPF",
                    "SYS_PTRACE",
                    "CHECKPOINT_RESTORE",
                    "SYS_RESOURCE"
                ],
                "{overlay}"
            );
            assert!(args.contains(&"--kubernetes"), "{overlay}");
            let node = env_of(container, "NODE_NAME").expect("NODE_NAME");
            assert_eq!(node["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
            // It pushes to a Service of the layout that selects Kiln's ingest.
            let push = env_of(container, "KILN_PUSH_URL")
                .and_then(|e| e["value"].as_str())
                .expect("KILN_PUSH_URL");
            let host = push
                .trim_start_matches("http://")
                .split(':')
                .next()
                .unwrap();
            let service = of_kind(objects, "Service")
                .into_iter()
                .find(|s| s["metadata"]["name"] == host)
                .unwrap_or_else(|| panic!("{overlay}: the agent pushes to {push}, no Service"));
            let ingest = workloads
                .values()
                .find(|w| selects(&service["spec"]["selector"], w))
                .expect("a workload behind the push Service");
            let target = env_of(
                &ingest["spec"]["template"]["spec"]["containers"][0],
                "KILN_TARGET",
            )
            .and_then(|e| e["value"].as_str())
            .unwrap_or("all");
            assert!(
                ["all", "ingest"].contains(&target),
                "{overlay}: {push} is {target}"
            );
        }
    }
    for role in of_kind(objects, "ClusterRole") {
        for rule in role["rules"].as_array().unwrap() {
            assert_eq!(rule["apiGroups"], serde_json::json!([""]));
            for resource in rule["resources"].as_array().unwrap() {
                assert!(
                    ["pods", "nodes", "endpoints", "services"]
                        .contains(&resource.as_str().unwrap()),
                    "{overlay}: {resource}"
                );
            }
            for verb in rule["verbs"].as_array().unwrap() {
                assert!(
                    ["get", "list", "watch"].contains(&verb.as_str().unwrap()),
                    "{overlay}: {verb}"
                );
            }
        }
    }
    for binding in of_kind(objects, "ClusterRoleBinding") {
        for subject in binding["subjects"].as_array().unwrap() {
            assert_eq!(subject["kind"], "ServiceAccount");
            assert_eq!(subject["namespace"], "kiln");
            let account = subject["name"].as_str().unwrap();
            assert!(
                accounts_used.contains(account),
                "{overlay}: {account} bound, used by no pod"
            );
        }
    }
    // The server's config as mounted: kiln.yaml and, beside it, the scrape config.
    let dir = tempfile::tempdir().unwrap();
    for (map, key, path) in [
        ("kiln-config", "kiln.yaml", "config/kiln.yaml"),
        ("kiln-scrape-config", "scrape.yaml", "scrape/scrape.yaml"),
    ] {
        let object = of_kind(objects, "ConfigMap")
            .into_iter()
            .find(|c| {
                c["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(map))
            })
            .unwrap_or_else(|| panic!("{overlay}: no ConfigMap {map}"));
        let file = dir.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, object["data"][key].as_str().unwrap()).unwrap();
    }
    let config = kiln_node::ServerConfig::from_yaml_file(&dir.path().join("config/kiln.yaml"))
        .unwrap_or_else(|err| panic!("{overlay}: {err}"));
    let jobs: Vec<&str> = config
        .scrape_configs
        .iter()
        .map(|j| j.job_name.as_str())
        .collect();
    assert_eq!(jobs, ["kubernetes-pods"], "{overlay}");
    workloads
}

/// The kustomize layouts, rendered by `kubectl kustomize` as users will: `single` (one
/// server with a volume, and the agent) and `scale-out` (a Deployment per role over
/// PostgreSQL and S3 from a Secret, PodDisruptionBudgets, RBAC for the scrape role and
/// the agents only).
#[test]
fn the_kustomize_layouts_render_what_the_api_and_kiln_take() {
    let Some(single) = rendered("single") else {
        return;
    };
    let workloads = check_layout("single", &single);
    assert_eq!(workloads.keys().collect::<Vec<_>>(), ["kiln", "kiln-agent"]);
    let server = &workloads["kiln"];
    assert_eq!(server["kind"], "StatefulSet");
    assert_eq!(
        server["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
        "data"
    );
    let scale_out = rendered("scale-out").expect("kubectl ran once");
    let workloads = check_layout("scale-out", &scale_out);
    let pdbs = of_kind(&scale_out, "PodDisruptionBudget");
    let mut roles = Vec::new();
    for (name, workload) in &workloads {
        if workload["kind"] != "Deployment" {
            continue;
        }
        let container = &workload["spec"]["template"]["spec"]["containers"][0];
        let env = |variable: &str| env_of(container, variable);
        let role = env("KILN_TARGET").unwrap()["value"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(
            env("KILN_ADVERTISE_ADDRESS").unwrap()["value"],
            "$(POD_IP):4040"
        );
        assert_eq!(container["envFrom"][0]["secretRef"]["name"], "kiln-storage");
        assert!(
            pdbs.iter()
                .any(|p| selects(&p["spec"]["selector"]["matchLabels"], workload)),
            "{name}: no PodDisruptionBudget"
        );
        let pod = &workload["spec"]["template"]["spec"];
        if role == "scrape" {
            assert_eq!(pod["serviceAccountName"], "kiln");
        } else {
            assert_eq!(pod["automountServiceAccountToken"], false, "{name}");
        }
        roles.push(role);
    }
    roles.sort();
    assert_eq!(roles, ["compact", "ingest", "query", "rules", "scrape"]);
    println!(
        "kubectl kustomize: single {} objects, scale-out {} objects ({} PodDisruptionBudgets), all taken by k8s-openapi's types unchanged",
        single.len(),
        scale_out.len(),
        pdbs.len()
    );
}

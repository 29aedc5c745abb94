//! Scaling out by role: processes sharing one metastore and one object store, each
//! running the roles `--target` names, listed in the metastore's `nodes` table and by
//! `GET /api/v1/nodes`; a node refuses what its roles do not serve, naming the live nodes
//! that do.

use serde_json::Value;

use crate::common::*;

on_every_backend!(roles_split_the_work_and_every_node_lists_the_others);

fn roles_split_the_work_and_every_node_lists_the_others(backend: Backend) {
    // Local: one SQLite file and one directory of blocks for all three.
    let shared = tempfile::tempdir().expect("temp dir");
    let urls = matches!(backend, Backend::Local).then(|| {
        (
            format!("sqlite://{}/metastore.db", shared.path().display()),
            format!("file://{}/blocks", shared.path().display()),
        )
    });
    let start = |target: &str| {
        let urls = urls.clone();
        let target = target.to_string();
        TestServer::start_on(backend.clone(), move |config| {
            config.target = target;
            config.node.heartbeat_ms = 200;
            config.node.lease_ms = 2_000;
            if let Some((metastore, blocks)) = urls {
                config.metastore = metastore;
                config.object_store = blocks;
            }
        })
    };
    let ingest = start("ingest");
    let query = start("query");
    let background = start("compact,rules,scrape");
    let address = |server: &TestServer| server.url.trim_start_matches("http://").to_string();

    // Every node lists all three, live, with their roles and addresses.
    let listed = query.json("/api/v1/nodes", &[]);
    let nodes = listed["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 3, "{listed:#}");
    for (server, roles) in [
        (&ingest, vec!["ingest"]),
        (&query, vec!["query"]),
        (&background, vec!["compact", "scrape", "rules"]),
    ] {
        let node = nodes
            .iter()
            .find(|n| n["address"] == address(server))
            .unwrap_or_else(|| panic!("{} not listed: {listed:#}", server.url));
        assert_eq!(node["state"], "live", "{node}");
        assert_eq!(node["roles"], serde_json::json!(roles), "{node}");
        assert!(node["last_heartbeat_ms"].as_i64() > Some(0));
    }
    // The same membership whichever node is asked.
    let ids = |listed: &Value| -> Vec<String> {
        listed["nodes"]
            .as_array()
            .map(|nodes| nodes.iter().map(|n| n["id"].to_string()).collect())
            .unwrap_or_default()
    };
    assert_eq!(ids(&ingest.json("/api/v1/nodes", &[])), ids(&listed));

    // A write to the query node is refused with the ingest node's address; a query to
    // the ingest node with the query node's. Both are 503: retry elsewhere.
    let now = kiln_model::time::now_nanos() / 1_000_000_000;
    let write = format!(
        "/ingest?name=scaled.cpu&format=folded&sampleRate=100&from={}&until={now}",
        now - 10
    );
    let (status, text) = query.post(&write, b"main;work 7\n");
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains(&address(&ingest)) && text.contains("ingest"),
        "{text}"
    );
    let (status, text) = ingest.get("/pyroscope/label-values?label=service_name");
    assert_eq!(status, 503, "{text}");
    assert!(text.contains(&address(&query)), "{text}");
    let (status, _) = ingest.get("/");
    assert_eq!(status, 503, "the UI is served by query nodes");
    for server in [&ingest, &query, &background] {
        assert_eq!(server.get("/ready").0, 200);
        assert_eq!(server.get("/metrics").0, 200);
    }

    // Written through the ingest node, read through the query node.
    let (status, text) = ingest.post(&write, b"main;work 7\n");
    assert_eq!(status, 200, "{text}");
    let (status, text) = query.get("/pyroscope/label-values?label=service_name");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("scaled"), "{text}");

    // A clean shutdown is recorded at once as having left.
    let background_address = address(&background);
    drop(background);
    let listed = query.json("/api/v1/nodes", &[]);
    let gone = listed["nodes"]
        .as_array()
        .and_then(|nodes| {
            nodes
                .iter()
                .find(|n| n["address"] == background_address.as_str())
        })
        .cloned()
        .unwrap_or_default();
    assert_eq!(gone["state"], "left", "{listed:#}");
}

#[test]
fn an_unknown_role_is_refused_at_start_with_the_roles_there_are() {
    let config = kiln_node::ServerConfig {
        target: "ingest,writer".to_string(),
        ..kiln_node::ServerConfig::default()
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let err = runtime
        .block_on(kiln_node::node::Server::start(config))
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("\"writer\"") && err.contains("compact"),
        "{err}"
    );
}

/// The active targets' URLs a node reports (`/api/v1/targets`): the ones it scrapes.
fn active_targets(server: &TestServer) -> Vec<String> {
    server.json("/api/v1/targets", &[])["data"]["activeTargets"]
        .as_array()
        .map(|targets| {
            targets
                .iter()
                .filter_map(|t| t["scrapeUrl"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn scrape_nodes_share_the_targets_and_take_over_those_of_one_that_leaves() {
    use crate::scrape::{cumulative_heap, scrape_configs, serve, wait_until, MEMORY_ONLY};
    use std::time::Duration;
    let shared = tempfile::tempdir().expect("temp dir");
    let addresses: Vec<String> = (0..16)
        .map(|_| serve(|_| (200, cumulative_heap(1))))
        .collect();
    let quoted: Vec<String> = addresses.iter().map(|a| format!("\"{a}\"")).collect();
    let yaml = format!(
        "- job_name: shared\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  static_configs: [{{targets: [{}]}}]\n{MEMORY_ONLY}      memory: {{path: /debug/pprof/heap, delta: true}}\n",
        quoted.join(", ")
    );
    let start = || {
        let yaml = yaml.clone();
        let metastore = format!("sqlite://{}/metastore.db", shared.path().display());
        let blocks = format!("file://{}/blocks", shared.path().display());
        TestServer::start_with(move |config| {
            config.target = "scrape,ingest,query".to_string();
            config.node.heartbeat_ms = 200;
            config.node.lease_ms = 2_000;
            config.metastore = metastore;
            config.object_store = blocks;
            config.scrape_configs = scrape_configs(&yaml);
        })
    };
    let first = start();
    let second = start();
    // Once each has seen the other: every target on exactly one node, both with some.
    wait_until("the targets shared", Duration::from_secs(30), || {
        let (a, b) = (active_targets(&first), active_targets(&second));
        a.len() + b.len() == 16
            && !a.is_empty()
            && !b.is_empty()
            && a.iter().all(|t| !b.contains(t))
    });
    let (a, b) = (active_targets(&first), active_targets(&second));
    let mut all: Vec<String> = a.iter().chain(&b).cloned().collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 16, "{a:?} {b:?}");
    // The split holds: the same a few heartbeats later.
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(active_targets(&first), a);
    // The second leaves; the first takes its targets over.
    drop(second);
    wait_until(
        "the leaver's targets taken over",
        Duration::from_secs(30),
        || active_targets(&first).len() == 16,
    );
}

/// Three ingest nodes over one SQLite metastore and one directory of blocks, each
/// flushing once per `flush_ms` (not adaptively), so that what arrives together shares a
/// segment.
fn ingest_cluster(shared: &std::path::Path, placement: bool, flush_ms: u64) -> Vec<TestServer> {
    let nodes: Vec<TestServer> = (0..3)
        .map(|_| {
            let metastore = format!("sqlite://{}/metastore.db", shared.display());
            let blocks = format!("file://{}/blocks", shared.display());
            TestServer::start_with(move |config| {
                config.target = "ingest,query".to_string();
                config.node.heartbeat_ms = 200;
                config.node.lease_ms = 5_000;
                config.node.placement = placement;
                config.node.forward_timeout_ms = 700;
                config.flush_adaptive = false;
                config.flush_interval_ms = flush_ms;
                config.metastore = metastore;
                config.object_store = blocks;
            })
        })
        .collect();
    // Every node has read the others at a heartbeat.
    crate::scrape::wait_until(
        "three live nodes",
        std::time::Duration::from_secs(30),
        || {
            nodes.iter().all(|node| {
                node.json("/api/v1/nodes", &[])["nodes"]
                    .as_array()
                    .is_some_and(|listed| {
                        listed.iter().filter(|n| n["state"] == "live").count() == 3
                    })
            })
        },
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    nodes
}

/// A folded profile of `service` with `frames` functions of long, service-specific names:
/// symbols that dominate a segment, as real ones do.
fn symbol_heavy(service: &str, frames: usize, value: u64) -> String {
    (0..frames)
        .map(|i| {
            format!(
                "main;{service}::handlers::request_{i}::process;{service}::storage::codec::decode_{i} {value}\n"
            )
        })
        .collect()
}

/// Sends every (service, node) write at once, from one thread each, and expects each
/// acknowledged.
fn push_together(nodes: &[TestServer], services: &[String], value: u64) {
    let now = kiln_model::time::now_nanos() / 1_000_000_000;
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(services.len() * nodes.len()));
    std::thread::scope(|scope| {
        for service in services {
            for (index, node) in nodes.iter().enumerate() {
                let barrier = barrier.clone();
                // Each node's copy a second apart: three profiles, not one sent thrice
                // (a retry, which is stored once).
                let until = now - index as i64;
                scope.spawn(move || {
                    let path = format!(
                        "/ingest?name={service}.cpu&format=folded&sampleRate=100&from={}&until={until}",
                        until - 10
                    );
                    let body = symbol_heavy(service, 40, value);
                    barrier.wait();
                    let (status, text) = node.post(&path, body.as_bytes());
                    assert_eq!(status, 200, "{service} via {}: {text}", node.url);
                });
            }
        }
    });
}

/// Per service: its level-0 datasets' count, profiles, and symbol bytes, read from the
/// metastore and the segments themselves.
fn datasets_per_service(
    node: &TestServer,
) -> std::collections::BTreeMap<String, (usize, u64, u64)> {
    let (runtime, metastore) = node.open_metastore();
    let datasets = runtime
        .block_on(metastore.datasets_at_level(0))
        .expect("datasets");
    let mut per_service = std::collections::BTreeMap::new();
    let mut blocks: std::collections::HashMap<String, Vec<kiln_storage::format::DatasetBytes>> =
        Default::default();
    for (dataset, _) in datasets {
        let sizes = blocks.entry(dataset.object_key.clone()).or_insert_with(|| {
            let bytes = node.read_object(&dataset.object_key);
            kiln_storage::format::dataset_bytes(&bytes).expect("block footer")
        });
        let entry = per_service
            .entry(dataset.service.clone())
            .or_insert((0, 0, 0));
        entry.0 += 1;
        entry.1 += dataset.profile_count;
        entry.2 += sizes[dataset.row_group as usize].symbols;
    }
    per_service
}

/// A node in the membership that is not running: live by a lease of two minutes, at
/// `address`, with `role`.
fn pretend_node(server: &TestServer, id: &str, address: &str, role: &str) {
    let (runtime, metastore) = server.open_metastore();
    let now = kiln_model::time::now_ms();
    runtime
        .block_on(metastore.heartbeat(&kiln_metastore::NodeRecord {
            id: id.to_string(),
            roles: vec![role.to_string()],
            address: address.to_string(),
            started_at_ms: now,
            heartbeat_at_ms: now,
            lease_expires_at_ms: now + 120_000,
            left_at_ms: None,
        }))
        .expect("heartbeat");
}

/// The ids of the nodes `server` lists.
fn node_ids(server: &TestServer) -> Vec<String> {
    server.json("/api/v1/nodes", &[])["nodes"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .filter_map(|n| n["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `count` service names whose (tenant, service) node `owner` owns among `ids`.
fn owned_by(ids: &[String], owner: &str, tenant: &str, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("svc-{i}"))
        .filter(|service| {
            let key = kiln_cluster::forward::placement_key(tenant, service);
            kiln_model::placement::owner(&key, ids.iter().map(String::as_str)) == Some(owner)
        })
        .take(count)
        .collect()
}

fn placement_count(node: &TestServer, outcome: &str) -> u64 {
    let needle = format!("kiln_placement_writes_total{{outcome=\"{outcome}\"}} ");
    node.metrics()
        .lines()
        .find_map(|line| line.strip_prefix(&needle))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

#[test]
fn a_services_writes_meet_on_one_ingest_node_and_its_symbols_are_written_once() {
    let services: Vec<String> = (0..12).map(|i| format!("placed-{i}")).collect();
    let mut symbols = Vec::new();
    for placement in [true, false] {
        let shared = tempfile::tempdir().expect("temp dir");
        let nodes = ingest_cluster(shared.path(), placement, 2_000);
        // Each service written through every node at once, as a load balancer would.
        push_together(&nodes, &services, 10);
        let per_service = datasets_per_service(&nodes[0]);
        assert_eq!(per_service.len(), services.len(), "{per_service:?}");
        for (service, (datasets, profiles, _)) in &per_service {
            assert_eq!(*profiles, 3, "{service}: every acknowledged profile once");
            // With placement the three meet in one segment of the owner; without, each
            // node writes its own.
            let expected = if placement { 1 } else { 3 };
            assert_eq!(*datasets, expected, "{service} (placement {placement})");
        }
        let forwarded: u64 = nodes.iter().map(|n| placement_count(n, "forwarded")).sum();
        let received: u64 = nodes.iter().map(|n| placement_count(n, "received")).sum();
        let owner: u64 = nodes.iter().map(|n| placement_count(n, "owner")).sum();
        let unplaced: u64 = nodes.iter().map(|n| placement_count(n, "unplaced")).sum();
        if placement {
            assert_eq!(forwarded, received);
            assert_eq!(
                forwarded + owner,
                36,
                "forwarded {forwarded}, owner {owner}"
            );
            assert_eq!(owner, 12, "each service's owner took its own write");
        } else {
            assert_eq!((forwarded, unplaced), (0, 36));
        }
        // Totals through the query API: 3 profiles of 40 frames × 10 samples each.
        let (status, text) = nodes[1].get(&format!(
            "/pyroscope/render?query=process_cpu:cpu:nanoseconds:cpu:nanoseconds{{service_name=\"{}\"}}&from=now-1h&until=now&format=json",
            services[0]
        ));
        assert_eq!(status, 200, "{text}");
        let rendered: serde_json::Value = serde_json::from_str(&text).expect("json");
        let total = rendered["flamebearer"]["numTicks"].as_f64().unwrap_or(0.0);
        assert_eq!(total, 3.0 * 40.0 * 10.0 * 1e7, "{text:.300}");
        let bytes: u64 = per_service.values().map(|entry| entry.2).sum();
        symbols.push(bytes as f64 / 36.0);
    }
    eprintln!(
        "symbol bytes per profile: {:.0} with placement, {:.0} without",
        symbols[0], symbols[1]
    );
    assert!(
        symbols[0] * 2.0 < symbols[1],
        "placement writes a service's symbols once per flush: {symbols:?}"
    );
}

#[test]
fn a_write_whose_owner_is_down_is_written_where_it_landed_and_an_unanswered_one_is_retried() {
    let shared = tempfile::tempdir().expect("temp dir");
    let nodes = ingest_cluster(shared.path(), true, 50);
    // Two more "ingest nodes" in the membership, live by their lease: one whose port
    // refuses connections, one that accepts and never answers.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_address = dead.local_addr().expect("address").to_string();
    drop(dead);
    let slow = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let slow_address = slow.local_addr().expect("address").to_string();
    let _held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in slow.incoming().flatten() {
            open.push(stream);
        }
    });
    for (id, address) in [("dead", &dead_address), ("slow", &slow_address)] {
        pretend_node(&nodes[0], &format!("{id}@{address}"), address, "ingest");
    }
    std::thread::sleep(std::time::Duration::from_millis(600));
    // Services that the dead and the slow node own among the five.
    let ids = node_ids(&nodes[0]);
    assert_eq!(ids.len(), 5, "{ids:?}");
    let (dead_id, slow_id) = (
        format!("dead@{dead_address}"),
        format!("slow@{slow_address}"),
    );
    // The dead node's services whose next owner, once it is skipped, is a real node.
    let without_dead: Vec<String> = ids.iter().filter(|id| **id != dead_id).cloned().collect();
    let dead_owned: Vec<String> = owned_by(&ids, &dead_id, "anonymous", 12)
        .into_iter()
        .filter(|service| {
            let key = kiln_cluster::forward::placement_key("anonymous", service);
            kiln_model::placement::owner(&key, without_dead.iter().map(String::as_str))
                != Some(slow_id.as_str())
        })
        .take(3)
        .collect();
    let slow_owned = owned_by(&ids, &slow_id, "anonymous", 3);
    let started = std::time::Instant::now();
    // An owner that refuses connections never got the write: written here, 200.
    for service in &dead_owned {
        push_together(&nodes[..1], std::slice::from_ref(service), 10);
    }
    // An owner that took the write and never answered may have stored it: 503, and the
    // client's retry (the owner now skipped) is written elsewhere.
    let now_s = kiln_model::time::now_nanos() / 1_000_000_000;
    let mut unanswered = 0;
    for service in &slow_owned {
        let path = format!(
            "/ingest?name={service}.cpu&format=folded&sampleRate=100&from={}&until={now_s}",
            now_s - 10
        );
        let body = symbol_heavy(service, 4, 10);
        let (status, text) = nodes[0].post(&path, body.as_bytes());
        if status == 503 {
            unanswered += 1;
            assert!(text.contains("retry"), "{text}");
            let (status, text) = nodes[0].post(&path, body.as_bytes());
            assert_eq!(status, 200, "the retry: {text}");
        } else {
            assert_eq!(status, 200, "{text}");
        }
    }
    let took = started.elapsed();
    // Every write acknowledged once and stored once.
    let per_service = datasets_per_service(&nodes[0]);
    for service in dead_owned.iter().chain(&slow_owned) {
        assert_eq!(per_service.get(service).map(|e| e.1), Some(1), "{service}");
    }
    assert!(unanswered >= 1, "the silent owner was asked once at least");
    assert_eq!(
        placement_count(&nodes[0], "unanswered"),
        unanswered,
        "counted"
    );
    assert!(placement_count(&nodes[0], "fallback_unreachable") >= 1);
    // A failed owner is skipped for a while instead of costing each write its timeout.
    assert!(
        took < std::time::Duration::from_secs(12),
        "a failed owner is not asked again and again: {took:?}"
    );
}

#[test]
fn rules_nodes_share_the_watched_services_and_each_regression_is_found_once() {
    use crate::insight::{push_service, webhook, with_watcher};
    let shared = tempfile::tempdir().expect("temp dir");
    let (hook_url, hooked) = webhook();
    let start = || {
        let metastore = format!("sqlite://{}/metastore.db", shared.path().display());
        let blocks = format!("file://{}/blocks", shared.path().display());
        let watcher = with_watcher(hook_url.clone());
        TestServer::start_with(move |config| {
            watcher(config);
            config.target = "ingest,query,rules".to_string();
            config.node.heartbeat_ms = 200;
            config.node.lease_ms = 5_000;
            config.metastore = metastore;
            config.object_store = blocks;
        })
    };
    let nodes = [start(), start()];
    crate::scrape::wait_until("two live nodes", std::time::Duration::from_secs(30), || {
        nodes[0].json("/api/v1/nodes", &[])["nodes"]
            .as_array()
            .is_some_and(|listed| listed.len() == 2)
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Two services each node watches.
    let ids = node_ids(&nodes[0]);
    let services: Vec<String> = ids
        .iter()
        .flat_map(|id| owned_by(&ids, id, "team-a", 2))
        .collect();
    let now_s = kiln_model::time::now_ms() / 1000;
    for service in &services {
        push_service(&nodes[0], "team-a", service, "1.0", now_s - 1800, false);
        push_service(&nodes[1], "team-a", service, "1.1", now_s - 1500, true);
    }
    let increases = |service: &str| -> usize {
        hooked
            .lock()
            .expect("bodies")
            .iter()
            .filter(|body| body.contains(&format!("\"{service}\"")) && body.contains("slow_path"))
            .count()
    };
    crate::scrape::wait_until(
        "every service's regression posted",
        std::time::Duration::from_secs(60),
        || services.iter().all(|service| increases(service) >= 1),
    );
    // A few more looks of both watchers: still once each.
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    for service in &services {
        assert_eq!(increases(service), 1, "{service}");
    }
    // Each node checked its own two.
    for node in &nodes {
        let checks: f64 = node
            .metrics()
            .lines()
            .filter(|line| line.starts_with("kiln_regressions_version_checks_total"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert_eq!(checks, 2.0, "{}", node.url);
    }
}

/// A counter's value on a node's `/metrics` (0 when absent).
fn counter(node: &TestServer, name: &str) -> f64 {
    node.metrics()
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn a_large_query_is_split_over_the_query_nodes_and_survives_one_dying() {
    let shared = tempfile::tempdir().expect("temp dir");
    let start = |min_profiles: u64| {
        let metastore = format!("sqlite://{}/metastore.db", shared.path().display());
        let blocks = format!("file://{}/blocks", shared.path().display());
        TestServer::start_with(move |config| {
            config.target = "ingest,query".to_string();
            config.node.heartbeat_ms = 200;
            config.node.lease_ms = 5_000;
            config.node.fanout_min_profiles = min_profiles;
            config.metastore = metastore;
            config.object_store = blocks;
            config.compaction.enabled = false;
        })
    };
    let (first, second) = (start(1), start(1));
    // Many segments: each write its own flush, across a week.
    let now_s = kiln_model::time::now_ms() / 1000;
    let mut expected = 0i64;
    for index in 0..24i64 {
        let from = now_s - 6 * 86_400 + index * 21_600;
        let body = format!(
            "main;serve;handler_{} {}\nmain;gc {}\n",
            index % 5,
            100 + index,
            10 + index
        );
        expected += 110 + 2 * index;
        let node = if index % 2 == 0 { &first } else { &second };
        let (status, text) = node.post(
            &format!(
                "/ingest?name=week.cpu&format=folded&sampleRate=100&from={from}&until={}",
                from + 10
            ),
            body.as_bytes(),
        );
        assert_eq!(status, 200, "{text}");
    }
    crate::scrape::wait_until("two live nodes", std::time::Duration::from_secs(30), || {
        node_ids(&first).len() == 2
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    // A week's flame graph through querier.v1, as the UI and Grafana ask for it: per
    // function (self, total).
    let render = |node: &TestServer| {
        let request = kiln_query::api::SelectMergeStacktracesRequest {
            profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            label_selector: r#"{service_name="week"}"#.into(),
            start: (now_s - 7 * 86_400) * 1000,
            end: now_s * 1000 + 1000,
            max_nodes: Some(-1),
            format: kiln_query::api::PROFILE_FORMAT_TREE,
            ..Default::default()
        };
        let response: kiln_query::api::SelectMergeStacktracesResponse =
            call(node, "SelectMergeStacktraces", &request, None);
        let mut functions: Vec<(String, (i64, i64))> =
            tree_functions(&response.tree).into_iter().collect();
        functions.sort();
        functions
    };
    let total = |functions: &[(String, (i64, i64))]| -> i64 {
        functions.iter().map(|(_, (flat, _))| flat).sum()
    };
    // The week's merged pprof (SelectMergeProfile, as `go tool pprof` and Grafana's
    // export get it): each stack of function names, root first, with its value.
    let pprof = |node: &TestServer| -> Vec<(String, i64)> {
        let request = kiln_query::api::SelectMergeProfileRequest {
            profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            label_selector: r#"{service_name="week"}"#.into(),
            start: (now_s - 7 * 86_400) * 1000,
            end: now_s * 1000 + 1000,
            ..Default::default()
        };
        let (status, body) = node.post_bytes(
            "/querier.v1.QuerierService/SelectMergeProfile",
            &prost::Message::encode_to_vec(&request),
            &[("Content-Type", "application/proto")],
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        let profile = kiln_model::pprof::decode(&body, 1 << 30).expect("pprof");
        let name = |location_id: &u32| -> String {
            let location = profile
                .location
                .iter()
                .find(|l| l.id == u64::from(*location_id));
            let function_id = location.and_then(|l| l.line.first()).map(|l| l.function_id);
            let function = profile.function.iter().find(|f| Some(f.id) == function_id);
            function.map_or("?".to_string(), |f| profile.string_or_empty(f.name))
        };
        let mut stacks = std::collections::BTreeMap::<String, i64>::new();
        for sample in profile.sample.iter() {
            let stack: Vec<String> = sample.location_id.iter().rev().map(name).collect();
            *stacks.entry(stack.join(";")).or_default() += sample.value[0];
        }
        stacks.into_iter().collect()
    };
    // The week's series by handler, 6 h steps, summed and averaged, with the profiles
    // behind each point.
    let series = |node: &TestServer, aggregation: i32| -> kiln_query::api::SelectSeriesResponse {
        let request = kiln_query::api::SelectSeriesRequest {
            profile_type_id: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
            label_selector: r#"{service_name="week"}"#.into(),
            start: (now_s - 7 * 86_400) * 1000,
            end: now_s * 1000 + 1000,
            step: 21_600.0,
            aggregation: Some(aggregation),
            exemplar_type: kiln_query::api::EXEMPLAR_TYPE_INDIVIDUAL,
            ..Default::default()
        };
        call(node, "SelectSeries", &request, None)
    };
    // The answer of one node reading it all (it never splits), which then leaves.
    let alone = start(u64::MAX);
    let whole = render(&alone);
    let whole_pprof = pprof(&alone);
    let whole_series = [
        series(&alone, 0),
        series(&alone, kiln_query::api::AGGREGATION_AVERAGE),
    ];
    assert_eq!(counter(&alone, "kiln_query_fanned_out_total"), 0.0);
    drop(alone);
    // Gone from the live nodes, and from the first node's cache of them (a heartbeat):
    // else the first node would deal it a share.
    let live = |node: &TestServer| -> usize {
        node.json("/api/v1/nodes", &[])["nodes"]
            .as_array()
            .map_or(0, |nodes| {
                nodes.iter().filter(|n| n["state"] == "live").count()
            })
    };
    crate::scrape::wait_until(
        "two live nodes again",
        std::time::Duration::from_secs(30),
        || live(&first) == 2,
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Six stacks (main;serve and a handler, five times; main;gc), every profile once.
    assert_eq!(whole_pprof.len(), 6, "{whole_pprof:?}");
    assert_eq!(
        whole_pprof.iter().map(|(_, value)| value).sum::<i64>(),
        expected * 10_000_000
    );
    let split = render(&first);
    assert_eq!(total(&split), expected * 10_000_000, "every profile once");
    assert_eq!(
        split.len(),
        8,
        "main, serve, gc and five handlers: {split:?}"
    );
    assert_eq!(counter(&first, "kiln_query_fanned_out_total"), 1.0);
    assert_eq!(counter(&first, "kiln_query_shares_sent_total"), 1.0);
    assert_eq!(split, whole);
    // The pprof is split the same way, and merges to the same stacks.
    assert_eq!(pprof(&first), whole_pprof);
    assert_eq!(counter(&first, "kiln_query_fanned_out_total"), 2.0);
    assert_eq!(counter(&first, "kiln_query_shares_sent_total"), 2.0);
    // So are series: the same points, averages and exemplars as one node's.
    let sum = &whole_series[0].series;
    assert_eq!(sum.len(), 1, "{sum:?}");
    assert_eq!(
        sum[0].points.iter().map(|p| p.value).sum::<f64>(),
        (expected * 10_000_000) as f64
    );
    assert!(sum[0].points.iter().all(|p| !p.exemplars.is_empty()));
    assert_eq!(series(&first, 0), whole_series[0]);
    assert_eq!(
        series(&first, kiln_query::api::AGGREGATION_AVERAGE),
        whole_series[1]
    );
    assert_eq!(counter(&first, "kiln_query_fanned_out_total"), 4.0);
    assert_eq!(counter(&first, "kiln_query_shares_sent_total"), 4.0);

    // A query node that died without leaving: live by its lease, refusing connections.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_address = dead.local_addr().expect("address").to_string();
    drop(dead);
    pretend_node(
        &first,
        &format!("aaa-dead@{dead_address}"),
        &dead_address,
        "query",
    );
    std::thread::sleep(std::time::Duration::from_millis(600));
    let survived = render(&first);
    assert_eq!(survived, whole);
    // Three shares now (here, the dead node, the live one): two more sent, and the dead
    // one's asked of the next node instead.
    assert_eq!(counter(&first, "kiln_query_shares_sent_total"), 6.0);
    assert_eq!(pprof(&first), whole_pprof);
    assert_eq!(series(&first, 0), whole_series[0]);
    assert_eq!(counter(&first, "kiln_query_shares_sent_total"), 10.0);
    assert_eq!(counter(&first, "kiln_query_shares_run_here_total"), 0.0);
    // A share names its datasets, so a peer checks whose they are: another tenant's
    // dataset, relabelled as the caller's, is refused when its stored tenant is read.
    let (runtime, metastore) = first.open_metastore();
    let mut datasets: Vec<kiln_metastore::DatasetMeta> = runtime
        .block_on(metastore.datasets_at_level(0))
        .expect("datasets")
        .into_iter()
        .map(|(meta, _)| meta)
        .collect();
    datasets.truncate(2);
    for meta in &mut datasets {
        meta.tenant = "intruder".to_string();
    }
    let part = kiln_query::root::PartialQuery {
        profile_type: "process_cpu:cpu:nanoseconds:cpu:nanoseconds".into(),
        selector: "{}".into(),
        from_nanos: 0,
        to_nanos: i64::MAX,
        call_site: Vec::new(),
        datasets,
        series: None,
    };
    let (status, text) = first.post_with(
        kiln_cluster::fanout::PARTIAL_TREE_PATH,
        &serde_json::to_vec(&part).expect("json"),
        &[("X-Scope-OrgID", "intruder")],
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("is not tenant"), "{text}");

    // With no live peer left, the dead node's share runs here.
    drop(second);
    std::thread::sleep(std::time::Duration::from_millis(600));
    let alone_again = render(&first);
    assert_eq!(alone_again, whole);
    assert_eq!(counter(&first, "kiln_query_shares_run_here_total"), 1.0);
}

/// The short form of `kiln bench chaos` (docs/benchmarks.md has the full one): 3 ingest,
/// 2 query and 2 compact processes over PostgreSQL and S3; an ingest node killed with
/// SIGKILL every 8 s, a query node killed during a week's query, PostgreSQL restarted
/// once. The bench fails on any breach: an acknowledged write lost or doubled, a query
/// that answered less than was acknowledged before it or failed with a status that is
/// not retryable, compaction behind.
#[test]
fn a_cluster_under_kills_and_a_postgres_restart_keeps_every_acknowledged_write_once() {
    if let Err(reason) = kiln_testkit::s3().and_then(|_| kiln_testkit::postgres().map(|_| ())) {
        println!("skipped: {reason}");
        return;
    }
    let output = run_kiln([
        "bench",
        "chaos",
        "--duration",
        "32",
        "--kill-every",
        "8",
        "--writers",
        "2",
        "--services",
        "4",
    ]);
    println!("{output}");
    // A row's last cell as a number.
    let row = |name: &str| -> u64 {
        output
            .lines()
            .find(|line| line.starts_with(&format!("| {name} |")))
            .and_then(|line| line.trim_end_matches(" |").rsplit("| ").next())
            .and_then(|cell| cell.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} row in {output}"))
    };
    // Not a rate (that is the bench's to report, and a loaded machine's to lower): enough
    // writes for loss to show, and a cluster that takes them again after every fault.
    assert!(row("acknowledged") >= 100, "{output}");
    assert_eq!(
        row("acknowledged, present exactly once"),
        row("acknowledged")
    );
    assert_eq!(row("acknowledged, lost"), 0);
    assert_eq!(row("acknowledged, stored twice or wrong"), 0);
    assert!(row("ingest kills (SIGKILL + restart)") >= 3, "{output}");
    let again = output
        .lines()
        .find_map(|line| {
            line.strip_prefix("| restarted ingest nodes acknowledging writes again | ")
        })
        .and_then(|rest| rest.trim_end_matches(" |").split_once(" / "))
        .map(|(got, of)| (got.to_string(), of.to_string()))
        .unwrap_or_else(|| panic!("no restart row in {output}"));
    assert_eq!(again.0, again.1, "{output}");
    assert!(again.1.parse::<u32>().is_ok_and(|n| n >= 2), "{output}");
    assert_eq!(row("PostgreSQL restarts"), 1);
    assert_eq!(row("query node killed during a week's query"), 1);
    assert!(output.contains("every acknowledged write present exactly once"));
}

/// The files `docs/deploy.md` tells operators to install, read as systemd reads them for
/// each instance (`EnvironmentFile=`, `Environment=`, `ExecStart=`), with only what
/// names this machine replaced: addresses, the data directory, and the metastore and
/// object store (SQLite and a directory instead of PostgreSQL and S3). The shipped
/// `kiln.yaml` is used as is.
#[test]
fn the_systemd_example_starts_a_working_cluster() {
    use std::collections::BTreeMap;
    let root = workspace_root().join("deploy/systemd");
    let unit = std::fs::read_to_string(root.join("kiln@.service")).expect("unit");
    let exec = unit
        .lines()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let args: Vec<&str> = exec.split_whitespace().skip(1).collect();
    let assignments = |text: &str| -> Vec<(String, String)> {
        text.lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    };
    let shared = tempfile::tempdir().expect("temp dir");
    let mut nodes = Vec::new();
    for instance in ["ingest", "query", "background"] {
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        for line in unit.lines() {
            let line = line.replace("%i", instance);
            if let Some(path) = line.strip_prefix("EnvironmentFile=") {
                let name = std::path::Path::new(path).file_name().expect("file name");
                let text = std::fs::read_to_string(root.join(name)).expect("environment file");
                env.extend(assignments(&text));
            } else if let Some(assignment) = line.strip_prefix("Environment=") {
                env.extend(assignments(assignment));
            }
        }
        assert!(env.contains_key("KILN_TARGET"), "{instance}: {env:?}");
        let port = kiln_testkit::free_port();
        let url = format!("http://127.0.0.1:{port}");
        env.insert("KILN_LISTEN".into(), format!("127.0.0.1:{port}"));
        env.insert(
            "KILN_CONFIG".into(),
            root.join("kiln.yaml").display().to_string(),
        );
        env.insert(
            "KILN_DATA_DIR".into(),
            shared.path().join(instance).display().to_string(),
        );
        env.insert(
            "KILN_METASTORE".into(),
            format!("sqlite://{}/metastore.db", shared.path().display()),
        );
        env.insert(
            "KILN_OBJECT_STORE".into(),
            format!("file://{}/blocks", shared.path().display()),
        );
        env.retain(|key, _| !key.starts_with("AWS_"));
        env.insert("KILN_LOG_LEVEL".into(), "warn".into());
        // Told where to listen by KILN_LISTEN, as systemd tells it.
        let child = KilnCommand::new(env!("CARGO_BIN_EXE_kiln"), port)
            .args(&args)
            .envs(&env)
            .start()
            .unwrap_or_else(|err| panic!("{instance}: {err}"));
        let server = TestServer::at(&url);
        nodes.push((instance, child, server));
    }
    let (ingest, query) = (&nodes[0].2, &nodes[1].2);
    let listed = query.json("/api/v1/nodes", &[]);
    let roles: Vec<String> = listed["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|node| node["state"] == "live")
        .map(|node| node["roles"].to_string())
        .collect();
    assert_eq!(roles.len(), 3, "{listed:#}");
    assert!(
        roles.contains(&r#"["compact","scrape","rules"]"#.to_string()),
        "{roles:?}"
    );
    push_folded(ingest, "deployed", "", 1, "main;work 5\n");
    let (status, text) = query.get("/pyroscope/label-values?label=service_name");
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("deployed"), "{text}");
    assert_eq!(ingest.get("/").0, 503, "the UI is on the query node");
}

/// `kiln bench ingest --ingest-nodes 2`, briefly: the clients spread over two ingest
/// processes on PostgreSQL (and a compact one), each service's writes meet on its owner,
/// nothing refused, and the CPU per MB the benchmarks page quotes is printed.
#[test]
fn the_ingest_bench_spreads_its_clients_over_ingest_nodes_that_forward_to_the_owner() {
    if let Err(reason) = kiln_testkit::postgres() {
        println!("skipped: {reason}");
        return;
    }
    let fixtures = workspace_root().join("testdata");
    let output = run_kiln([
        "bench".as_ref(),
        "ingest".as_ref(),
        "--corpus".as_ref(),
        fixtures.as_os_str(),
        "--ingest-nodes".as_ref(),
        "2".as_ref(),
        "--clients".as_ref(),
        "6".as_ref(),
        "--services".as_ref(),
        "3".as_ref(),
        "--seconds".as_ref(),
        "3".as_ref(),
        "--compaction".as_ref(),
        "true".as_ref(),
    ]);
    println!("{output}");
    let value = |prefix: &str| -> String {
        output
            .lines()
            .find_map(|line| line.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in:\n{output}"))
            .trim()
            .to_string()
    };
    let profiles: f64 = value("profiles/s").parse().expect("a rate");
    assert!(profiles > 1.0, "{output}");
    assert_eq!(value("errors"), "0", "{output}");
    // Six clients over two nodes (client i on node i % 2), three services (client i sends
    // service i % 3): every service arrives at both nodes, so whichever owns it, one
    // node forwards it and the owner writes its own.
    let placement = value("placement");
    let count = |outcome: &str| -> u64 {
        placement
            .split(", ")
            .find_map(|part| part.strip_prefix(&format!("{outcome} ")))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    assert!(count("forwarded") > 0, "{placement}");
    assert_eq!(count("forwarded"), count("received"), "{placement}");
    assert!(count("owner") > 0, "{placement}");
    assert!(
        value("server CPU per MB").ends_with("of gzip body)"),
        "{output}"
    );
    // With compaction on, a compact node joins, and its merge CPU is reported.
    assert!(
        value("  compaction").contains("ingest and the rest"),
        "{output}"
    );
}

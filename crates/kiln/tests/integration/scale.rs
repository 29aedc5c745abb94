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
    let config = kiln_server::ServerConfig {
        target: "ingest,writer".to_string(),
        ..kiln_server::ServerConfig::default()
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let err = runtime
        .block_on(kiln_server::server::Server::start(config))
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
            for node in nodes {
                let barrier = barrier.clone();
                scope.spawn(move || {
                    let path = format!(
                        "/ingest?name={service}.cpu&format=folded&sampleRate=100&from={}&until={now}",
                        now - 10
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
fn a_write_whose_owner_is_down_or_slow_is_written_where_it_landed() {
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
    let (runtime, metastore) = nodes[0].open_metastore();
    let now = kiln_model::time::now_ms();
    for (id, address) in [("dead", &dead_address), ("slow", &slow_address)] {
        runtime
            .block_on(metastore.heartbeat(&kiln_metastore::NodeRecord {
                id: format!("{id}@{address}"),
                roles: vec!["ingest".to_string()],
                address: address.clone(),
                started_at_ms: now,
                heartbeat_at_ms: now,
                lease_expires_at_ms: now + 120_000,
                left_at_ms: None,
            }))
            .expect("heartbeat");
    }
    std::thread::sleep(std::time::Duration::from_millis(600));
    // Services that the dead and the slow node own among the five.
    let ids = node_ids(&nodes[0]);
    assert_eq!(ids.len(), 5, "{ids:?}");
    let dead_owned = owned_by(&ids, &format!("dead@{dead_address}"), "anonymous", 3);
    let slow_owned = owned_by(&ids, &format!("slow@{slow_address}"), "anonymous", 3);
    let started = std::time::Instant::now();
    for service in dead_owned.iter().chain(&slow_owned) {
        push_together(&nodes[..1], std::slice::from_ref(service), 10);
    }
    let took = started.elapsed();
    // Every write acknowledged once and stored once, on the node it reached.
    let per_service = datasets_per_service(&nodes[0]);
    for service in dead_owned.iter().chain(&slow_owned) {
        assert_eq!(per_service.get(service).map(|e| e.1), Some(1), "{service}");
    }
    let unreachable = placement_count(&nodes[0], "fallback_unreachable");
    let timeout = placement_count(&nodes[0], "fallback_timeout");
    // The first write to each failed owner waits for it; later ones skip it for a while
    // (the next owner in hash order, maybe this node, takes them).
    assert!(unreachable >= 1, "unreachable {unreachable}");
    assert!(timeout >= 1, "timeout {timeout}");
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

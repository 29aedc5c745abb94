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

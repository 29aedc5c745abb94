//! `querier.v1.QuerierService` end to end: real profiles ingested, then every method called
//! over Connect proto, Connect JSON and gRPC, and checked against the inputs and against
//! `go tool pprof`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use kiln_query::api::{self, CallSiteLocation, StackTraceSelector};
use kiln_query::merge::read_tree_bytes;
use prost::Message;
use serde_json::{json, Value};

use crate::common::*;
use crate::pyroscope::url_escape;

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const FIXTURE: &str = "profefe-collector_cpu_1.prof";
const CPU_INDEX: usize = 1; // samples/count, then cpu/nanoseconds

/// Seconds of the first upload, the start of the previous hour, so that every upload
/// (a minute apart) falls in one hour-wide series step.
fn base_seconds() -> i64 {
    let now = kiln_model::time::now_nanos() / 1_000_000_000;
    now - now % 3600 - 3600
}

struct Loaded {
    server: TestServer,
    /// Milliseconds spanning every upload.
    start: i64,
    end: i64,
    base: i64,
    fixture_total: i64,
}

/// Three uploads of one CPU profile for tenant "anonymous" (`api` instances `a` and `b`,
/// and `web`), one for tenant "other" (`secret`).
fn loaded() -> Loaded {
    let server = TestServer::start();
    let base = base_seconds();
    let profile = fixture(FIXTURE);
    let uploads = [
        ("api", "a", 0, None),
        ("api", "b", 60, None),
        ("web", "a", 120, None),
        ("secret", "a", 0, Some("other")),
    ];
    for (service, instance, offset, tenant) in uploads {
        let from = base + offset;
        let headers: Vec<(&str, &str)> = tenant.map(|t| ("X-Scope-OrgID", t)).into_iter().collect();
        let (status, text) = server.post_with(
            &format!(
                "/ingest?name={service}{{instance={instance}}}&format=pprof&from={from}&until={}",
                from + 10
            ),
            &profile,
            &headers,
        );
        assert_eq!(status, 200, "{text}");
    }
    Loaded {
        server,
        start: (base - 1) * 1000,
        end: (base + 300) * 1000,
        base,
        fixture_total: pprof_total(&profile, CPU_INDEX),
    }
}

/// Connect with `application/json`; returns (status, body as JSON).
fn call_json(server: &TestServer, method: &str, request: Value) -> (u16, Value) {
    let (status, text) = server.post_with(
        &path(method),
        request.to_string().as_bytes(),
        &[("Content-Type", "application/json")],
    );
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn label_values(
    server: &TestServer,
    name: &str,
    matchers: &[String],
    (start, end): (i64, i64),
    tenant: Option<&str>,
) -> Vec<String> {
    let request = api::LabelValuesRequest {
        name: name.to_string(),
        matchers: matchers.to_vec(),
        start,
        end,
    };
    let response: api::LabelValuesResponse = call(server, "LabelValues", &request, tenant);
    response.names
}

fn merge_request(loaded: &Loaded, selector: &str) -> api::SelectMergeStacktracesRequest {
    api::SelectMergeStacktracesRequest {
        profile_type_id: CPU.to_string(),
        label_selector: selector.to_string(),
        start: loaded.start,
        end: loaded.end,
        ..Default::default()
    }
}

fn flame_total(
    server: &TestServer,
    request: &api::SelectMergeStacktracesRequest,
    tenant: Option<&str>,
) -> i64 {
    let response: api::SelectMergeStacktracesResponse =
        call(server, "SelectMergeStacktraces", request, tenant);
    response.flamegraph.map_or(0, |graph| graph.total)
}

/// Pyroscope's tree bytes read back: (sum of self values, node count).
fn read_tree(bytes: &[u8]) -> (i64, usize) {
    let nodes = read_tree_bytes(bytes).expect("tree");
    (nodes.iter().map(|(_, value)| value).sum(), nodes.len())
}

#[test]
fn merged_flame_graphs_in_every_encoding_agree_with_the_inputs() {
    let loaded = loaded();
    let server = &loaded.server;
    let request = merge_request(&loaded, r#"{service_name="api"}"#);
    let response: api::SelectMergeStacktracesResponse =
        call(server, "SelectMergeStacktraces", &request, None);
    let graph = response.flamegraph.expect("flame graph");
    assert_eq!(graph.total, 2 * loaded.fixture_total);
    assert!(graph.levels.iter().all(|level| level.values.len() % 4 == 0));
    assert_eq!(graph.levels[0].values[1], graph.total);

    // The same query in JSON: int64 as strings, the same numbers.
    let (status, body) = call_json(
        server,
        "SelectMergeStacktraces",
        json!({"profileTypeID": CPU, "labelSelector": "{service_name=\"api\"}",
               "start": loaded.start.to_string(), "end": loaded.end}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["flamegraph"]["total"], json!(graph.total.to_string()));
    assert_eq!(body["flamegraph"]["names"], json!(graph.names));
    let first_level: Vec<i64> = body["flamegraph"]["levels"][1]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(first_level, graph.levels[1].values);

    // Pyroscope's tree format carries the same total.
    let mut tree_request = request.clone();
    tree_request.format = api::PROFILE_FORMAT_TREE;
    let response: api::SelectMergeStacktracesResponse =
        call(server, "SelectMergeStacktraces", &tree_request, None);
    let (sum, nodes) = read_tree(&response.tree);
    assert_eq!(sum, graph.total);
    assert!(nodes > 10);

    // max_nodes cuts the graph but keeps the total.
    let mut small = request.clone();
    small.max_nodes = Some(8);
    let response: api::SelectMergeStacktracesResponse =
        call(server, "SelectMergeStacktraces", &small, None);
    let small_graph = response.flamegraph.unwrap();
    let node_count: usize = small_graph.levels.iter().map(|l| l.values.len() / 4).sum();
    assert!(
        node_count <= 8 + small_graph.levels.len(),
        "{node_count} nodes"
    );
    assert_eq!(small_graph.total, graph.total);
    // What was cut is still there, summed into explicit "other" nodes, and every level
    // still adds up: no node is larger than its parent.
    let other = small_graph
        .names
        .iter()
        .position(|name| name == "other")
        .expect("an other node") as i64;
    let other_total: i64 = small_graph
        .levels
        .iter()
        .flat_map(|level| level.values.chunks(4))
        .filter(|node| node[3] == other)
        .map(|node| node[1])
        .sum();
    assert!(other_total > 0);
    for level in &small_graph.levels[1..] {
        let level_total: i64 = level.values.chunks(4).map(|node| node[1]).sum();
        assert!(level_total <= graph.total);
    }
}

#[test]
fn a_call_site_selects_its_subtree_at_full_resolution() {
    let loaded = loaded();
    let server = &loaded.server;
    let request = merge_request(&loaded, r#"{service_name="api"}"#);
    let full: api::SelectMergeStacktracesResponse =
        call(server, "SelectMergeStacktraces", &request, None);
    let full = full.flamegraph.unwrap();
    // The largest node of depth 2 and its parent at depth 1.
    let (mut best, mut best_total) = (None, 0);
    let mut x_parent = Vec::new();
    let mut x = 0;
    for node in full.levels[1].values.chunks(4) {
        x += node[0];
        x_parent.push((x, x + node[1], full.names[node[3] as usize].clone()));
        x += node[1];
    }
    let mut x = 0;
    for node in full.levels[2].values.chunks(4) {
        x += node[0];
        if node[1] > best_total {
            let parent = x_parent
                .iter()
                .find(|(start, end, _)| *start <= x && x < *end)
                .map(|(_, _, name)| name.clone())
                .unwrap();
            best = Some((parent, full.names[node[3] as usize].clone()));
            best_total = node[1];
        }
        x += node[1];
    }
    let (parent, child) = best.expect("a node at depth 2");
    let mut focused = request.clone();
    focused.stack_trace_selector = Some(StackTraceSelector {
        call_site: vec![
            CallSiteLocation {
                name: parent.clone(),
            },
            CallSiteLocation {
                name: child.clone(),
            },
        ],
    });
    focused.max_nodes = Some(-1);
    assert_eq!(flame_total(server, &focused, None), best_total);
    // A call site that matches nothing selects nothing.
    focused.stack_trace_selector = Some(StackTraceSelector {
        call_site: vec![CallSiteLocation {
            name: "no such function".into(),
        }],
    });
    assert_eq!(flame_total(server, &focused, None), 0);
}

#[test]
fn merged_pprof_matches_go_tool_pprof() {
    let loaded = loaded();
    let server = &loaded.server;
    let request = api::SelectMergeProfileRequest {
        profile_type_id: CPU.to_string(),
        label_selector: r#"{service_name="api"}"#.to_string(),
        start: loaded.start,
        end: loaded.end,
        ..Default::default()
    };
    let (status, body) = server.post_bytes(
        &path("SelectMergeProfile"),
        &request.encode_to_vec(),
        &[("Content-Type", "application/proto")],
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let merged = kiln_model::pprof::decode(&body, 1 << 30).expect("pprof");
    let total: i64 = merged.sample.iter().map(|s| s.value[0]).sum();
    assert_eq!(total, 2 * loaded.fixture_total);
    let Some(go) = go_binary() else {
        eprintln!("skipped: go tool pprof comparison (go not installed)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let input = temp_file(dir.path(), "in.prof", &fixture(FIXTURE));
    let output = temp_file(dir.path(), "merged.prof", &body);
    let expected = go_function_totals(&go, &[&input, &input], CPU_INDEX);
    let actual = go_function_totals(&go, &[&output], 0);
    assert_eq!(actual, expected);
    // The flame graph, read as a full tree, gives go's per-function values too.
    let mut tree_request = merge_request(&loaded, r#"{service_name="api"}"#);
    tree_request.format = api::PROFILE_FORMAT_TREE;
    tree_request.max_nodes = Some(-1);
    let response: api::SelectMergeStacktracesResponse =
        call(server, "SelectMergeStacktraces", &tree_request, None);
    let from_tree = tree_functions(&response.tree);
    let expected_nonzero: std::collections::HashMap<String, (i64, i64)> = expected
        .into_iter()
        .filter(|(_, (_, cum))| *cum != 0)
        .collect();
    assert_eq!(from_tree, expected_nonzero);
    // In Connect JSON, the same profile as the proto3 JSON mapping of pprof's Profile.
    let (status, json) = call_json(
        server,
        "SelectMergeProfile",
        json!({"profileTypeID": CPU, "labelSelector": r#"{service_name="api"}"#,
               "start": loaded.start.to_string(), "end": loaded.end.to_string()}),
    );
    assert_eq!(status, 200, "{json}");
    let strings: Vec<&str> = json["stringTable"]
        .as_array()
        .expect("stringTable")
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let type_index: usize = json["sampleType"][0]["type"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(strings[type_index], "cpu");
    let json_total: i64 = json["sample"]
        .as_array()
        .expect("samples")
        .iter()
        .map(|sample| sample["value"][0].as_str().unwrap().parse::<i64>().unwrap())
        .sum();
    assert_eq!(json_total, 2 * loaded.fixture_total);
    assert_eq!(
        json["sample"].as_array().unwrap().len(),
        merged.sample.len()
    );
    let names: std::collections::BTreeSet<&str> = json["function"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| strings[f["name"].as_str().unwrap().parse::<usize>().unwrap()])
        .collect();
    assert!(names.contains("runtime.mallocgc"), "{names:?}");
}

#[test]
fn series_points_sum_to_the_flame_graph_and_name_their_profiles() {
    let loaded = loaded();
    let server = &loaded.server;
    let request = api::SelectSeriesRequest {
        profile_type_id: CPU.to_string(),
        label_selector: r#"{service_name="api"}"#.to_string(),
        start: loaded.start,
        end: loaded.end,
        group_by: vec!["instance".into()],
        step: 60.0,
        exemplar_type: api::EXEMPLAR_TYPE_INDIVIDUAL,
        ..Default::default()
    };
    let response: api::SelectSeriesResponse = call(server, "SelectSeries", &request, None);
    assert_eq!(response.series.len(), 2);
    let mut sum = 0.0;
    for (series, instance, offset) in [
        (&response.series[0], "a", 0),
        (&response.series[1], "b", 60),
    ] {
        assert_eq!(
            series.labels,
            vec![api::LabelPair {
                name: "instance".into(),
                value: instance.into()
            }]
        );
        assert_eq!(series.points.len(), 1);
        let point = &series.points[0];
        assert_eq!(point.timestamp, (loaded.base + offset) * 1000);
        sum += point.value;
        // The exemplar names the one profile behind the point; fetching it by id gives it alone.
        assert_eq!(point.exemplars.len(), 1);
        let exemplar = &point.exemplars[0];
        assert_eq!(exemplar.value, loaded.fixture_total);
        let mut single = merge_request(&loaded, "");
        single.profile_id_selector = vec![exemplar.profile_id.clone()];
        assert_eq!(flame_total(server, &single, None), loaded.fixture_total);
    }
    let flame = flame_total(
        server,
        &merge_request(&loaded, r#"{service_name="api"}"#),
        None,
    );
    assert_eq!(sum as i64, flame);

    // Top-1 by total, and averaging over one wide step.
    let mut limited = request.clone();
    limited.limit = Some(1);
    let response: api::SelectSeriesResponse = call(server, "SelectSeries", &limited, None);
    assert_eq!(response.series.len(), 1);
    let mut average = request.clone();
    average.group_by.clear();
    average.step = 3600.0;
    average.aggregation = Some(api::AGGREGATION_AVERAGE);
    average.exemplar_type = 0;
    let response: api::SelectSeriesResponse = call(server, "SelectSeries", &average, None);
    assert_eq!(response.series.len(), 1);
    assert_eq!(response.series[0].points.len(), 1);
    assert_eq!(
        response.series[0].points[0].value as i64,
        loaded.fixture_total
    );
    assert!(response.series[0].points[0].exemplars.is_empty());

    // JSON, with enum names.
    let (status, body) = call_json(
        server,
        "SelectSeries",
        json!({"profileTypeID": CPU, "labelSelector": "{}", "start": loaded.start,
               "end": loaded.end, "step": 60, "groupBy": ["service_name"],
               "aggregation": "TIME_SERIES_AGGREGATION_TYPE_SUM"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["series"].as_array().unwrap().len(), 2);
}

#[test]
fn diff_sides_equal_the_separate_queries() {
    let loaded = loaded();
    let server = &loaded.server;
    let left = merge_request(&loaded, r#"{service_name="api"}"#);
    let right = merge_request(&loaded, r#"{service_name="web"}"#);
    let request = api::DiffRequest {
        left: Some(left.clone()),
        right: Some(right.clone()),
    };
    let response: api::DiffResponse = call(server, "Diff", &request, None);
    let diff = response.flamegraph.expect("diff");
    assert_eq!(diff.left_ticks, flame_total(server, &left, None));
    assert_eq!(diff.right_ticks, flame_total(server, &right, None));
    assert_eq!(diff.total, diff.left_ticks + diff.right_ticks);
    assert!(diff.levels.iter().all(|level| level.values.len() % 7 == 0));
    assert_eq!(diff.levels[0].values[1], diff.left_ticks);
    assert_eq!(diff.levels[0].values[4], diff.right_ticks);
}

#[test]
fn label_queries_see_series_in_range() {
    let loaded = loaded();
    let server = &loaded.server;
    let (status, body) = call_json(
        server,
        "LabelNames",
        json!({"start": loaded.start, "end": loaded.end}),
    );
    assert_eq!(status, 200, "{body}");
    let names = body["names"].as_array().unwrap();
    for name in ["instance", "service_name", "__profile_type__"] {
        assert!(names.contains(&json!(name)), "{name} in {names:?}");
    }
    let values = label_values(
        server,
        "service_name",
        &[],
        (loaded.start, loaded.end),
        None,
    );
    assert_eq!(values, vec!["api", "web"]);
    // Grafana narrows by profile type and labels.
    let values = label_values(
        server,
        "service_name",
        &[format!(r#"{{__profile_type__="{CPU}", instance="b"}}"#)],
        (loaded.start, loaded.end),
        None,
    );
    assert_eq!(values, vec!["api"]);
    // Outside the range there is nothing.
    let values = label_values(
        server,
        "service_name",
        &[],
        (loaded.end + 1, loaded.end + 60_000),
        None,
    );
    assert!(values.is_empty());
    let series: api::SeriesResponse = call(
        server,
        "Series",
        &api::SeriesRequest {
            matchers: vec![format!(r#"{{__profile_type__="{CPU}"}}"#)],
            label_names: vec!["service_name".into(), "instance".into()],
            start: loaded.start,
            end: loaded.end,
        },
        None,
    );
    assert_eq!(series.labels_set.len(), 3);
    let types: api::ProfileTypesResponse = call(
        server,
        "ProfileTypes",
        &api::ProfileTypesRequest {
            start: loaded.start,
            end: loaded.end,
        },
        None,
    );
    let ids: Vec<&str> = types.profile_types.iter().map(|t| t.id.as_str()).collect();
    assert!(ids.contains(&CPU), "{ids:?}");
    let cpu = types.profile_types.iter().find(|t| t.id == CPU).unwrap();
    assert_eq!(
        (
            cpu.name.as_str(),
            cpu.sample_type.as_str(),
            cpu.period_unit.as_str()
        ),
        ("process_cpu", "cpu", "nanoseconds")
    );
    let stats: api::GetProfileStatsResponse = call(
        server,
        "GetProfileStats",
        &api::GetProfileStatsRequest {},
        None,
    );
    assert!(stats.data_ingested);
    assert_eq!(stats.oldest_profile_time, loaded.base * 1000);
}

/// Datasets whose share of a flame graph came from the kept shares (`tree_cache`).
fn shares_reused(server: &TestServer) -> f64 {
    server.counter(r#"kiln_query_dataset_loads_total{source="tree_cache"}"#)
}

/// A flame graph asked again is built from its datasets' kept shares, and equals the
/// first; a query of another selector, type or tenant is not served another's shares.
#[test]
fn a_flame_graph_asked_again_is_built_from_kept_shares() {
    let loaded = loaded();
    let server = &loaded.server;
    let api = merge_request(&loaded, r#"{service_name="api"}"#);
    let ask = |request: &api::SelectMergeStacktracesRequest, tenant: Option<&str>| {
        call::<_, api::SelectMergeStacktracesResponse>(
            server,
            "SelectMergeStacktraces",
            request,
            tenant,
        )
    };
    let first = ask(&api, None);
    assert_eq!(shares_reused(server), 0.0, "nothing was asked before");
    let second = ask(&api, None);
    let reused = shares_reused(server);
    assert!(
        reused >= 1.0,
        "the second flame graph read every dataset again"
    );
    assert_eq!(second, first);
    assert_eq!(
        first.flamegraph.as_ref().map_or(0, |graph| graph.total),
        2 * loaded.fixture_total
    );
    // Another selector over the same datasets gets its own shares, not api's.
    let web = merge_request(&loaded, r#"{service_name="web"}"#);
    assert_eq!(flame_total(server, &web, None), loaded.fixture_total);
    let everything = merge_request(&loaded, "");
    assert_eq!(
        flame_total(server, &everything, None),
        3 * loaded.fixture_total
    );
    // Another type of the same profiles.
    let samples = api::SelectMergeStacktracesRequest {
        profile_type_id: "process_cpu:samples:count:cpu:nanoseconds".to_string(),
        ..api.clone()
    };
    let profile = fixture(FIXTURE);
    assert_eq!(
        flame_total(server, &samples, None),
        2 * pprof_total(&profile, 0)
    );
    // Another tenant asking the same shape sees only its own profile.
    assert_eq!(
        flame_total(server, &everything, Some("other")),
        loaded.fixture_total
    );
    assert_eq!(
        shares_reused(server),
        reused,
        "only the repeat reused shares"
    );
    // Asked again, each of them reuses its own.
    assert_eq!(flame_total(server, &web, None), loaded.fixture_total);
    assert_eq!(
        flame_total(server, &everything, Some("other")),
        loaded.fixture_total
    );
    assert!(shares_reused(server) >= reused + 2.0);
}

#[test]
fn no_method_shows_another_tenants_data() {
    let loaded = loaded();
    let server = &loaded.server;
    let tenant = Some("other");
    // Tenant "other" asks for the anonymous tenant's service by every method.
    let request = merge_request(&loaded, r#"{service_name="api"}"#);
    assert_eq!(flame_total(server, &request, tenant), 0);
    let everything = merge_request(&loaded, "");
    assert_eq!(
        flame_total(server, &everything, tenant),
        loaded.fixture_total
    );
    let diff: api::DiffResponse = call(
        server,
        "Diff",
        &api::DiffRequest {
            left: Some(request.clone()),
            right: Some(request.clone()),
        },
        tenant,
    );
    assert_eq!(diff.flamegraph.map_or(0, |d| d.total), 0);
    let merged_request = api::SelectMergeProfileRequest {
        profile_type_id: CPU.into(),
        label_selector: r#"{service_name="api"}"#.into(),
        start: loaded.start,
        end: loaded.end,
        ..Default::default()
    };
    let (status, body) = server.post_bytes(
        &path("SelectMergeProfile"),
        &merged_request.encode_to_vec(),
        &[
            ("Content-Type", "application/proto"),
            ("X-Scope-OrgID", "other"),
        ],
    );
    assert_eq!(status, 200);
    let merged = kiln_model::pprof::decode(&body, 1 << 30).unwrap();
    assert!(merged.sample.is_empty());
    let series: api::SelectSeriesResponse = call(
        server,
        "SelectSeries",
        &api::SelectSeriesRequest {
            profile_type_id: CPU.into(),
            label_selector: r#"{service_name="api"}"#.into(),
            start: loaded.start,
            end: loaded.end,
            step: 60.0,
            ..Default::default()
        },
        tenant,
    );
    assert!(series.series.is_empty());
    let values = label_values(
        server,
        "service_name",
        &[],
        (loaded.start, loaded.end),
        tenant,
    );
    assert_eq!(values, vec!["secret"]);
    let names: api::LabelNamesResponse = call(
        server,
        "LabelNames",
        &api::LabelNamesRequest {
            matchers: vec![r#"{service_name="api"}"#.into()],
            start: loaded.start,
            end: loaded.end,
        },
        tenant,
    );
    assert!(names.names.is_empty());
    let series_sets: api::SeriesResponse = call(
        server,
        "Series",
        &api::SeriesRequest {
            start: loaded.start,
            end: loaded.end,
            ..Default::default()
        },
        tenant,
    );
    // One set per profile type of the one upload: all of it "secret".
    assert_eq!(series_sets.labels_set.len(), 2);
    for set in &series_sets.labels_set {
        let service = set
            .labels
            .iter()
            .find(|l| l.name == "service_name")
            .unwrap();
        assert_eq!(service.value, "secret");
    }
    let span: api::SelectMergeStacktracesResponse = call(
        server,
        "SelectMergeSpanProfile",
        &api::SelectMergeSpanProfileRequest {
            profile_type_id: CPU.into(),
            label_selector: r#"{service_name="api"}"#.into(),
            span_selector: vec!["0000000000000001".into()],
            start: loaded.start,
            end: loaded.end,
            ..Default::default()
        },
        tenant,
    );
    assert_eq!(span.flamegraph.map_or(0, |graph| graph.total), 0);
    // The legacy HTTP API is scoped the same way.
    let (from, until) = (loaded.start / 1000, loaded.end / 1000);
    let render = server.json(
        &format!(
            "/pyroscope/render?query={}&from={from}&until={until}",
            url_escape(&format!(r#"{CPU}{{service_name="api"}}"#))
        ),
        &[("X-Scope-OrgID", "other")],
    );
    assert_eq!(render["flamebearer"]["numTicks"], json!(0));
    let legacy_values = server.json(
        &format!("/pyroscope/label-values?label=service_name&from={from}&until={until}"),
        &[("X-Scope-OrgID", "other")],
    );
    assert_eq!(legacy_values, json!(["secret"]));
    // And the anonymous tenant never sees "secret".
    let values = label_values(
        server,
        "service_name",
        &[],
        (loaded.start, loaded.end),
        None,
    );
    assert!(!values.contains(&"secret".to_string()));
    let stats: api::GetProfileStatsResponse = call(
        server,
        "GetProfileStats",
        &api::GetProfileStatsRequest {},
        Some("nobody"),
    );
    assert!(!stats.data_ingested);
    let types: api::ProfileTypesResponse = call(
        server,
        "ProfileTypes",
        &api::ProfileTypesRequest::default(),
        Some("nobody"),
    );
    assert!(types.profile_types.is_empty());
}

#[test]
fn bad_requests_get_clear_errors() {
    let loaded = loaded();
    let server = &loaded.server;
    let (status, body) = call_json(
        server,
        "SelectMergeStacktraces",
        json!({"profileTypeID": CPU, "labelSelector": "{service_name=~\"(\"}"}),
    );
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["code"], "invalid_argument");
    let (status, body) = call_json(
        server,
        "SelectMergeStacktraces",
        json!({"profileTypeID": CPU, "labelSelector": "{service_name=\"api\""}),
    );
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("position"),
        "{body}"
    );
    let (status, body) = call_json(
        server,
        "SelectMergeStacktraces",
        json!({"profileTypeID": "cpu"}),
    );
    assert_eq!(status, 400);
    assert!(
        body["message"].as_str().unwrap().contains("profile_typeID"),
        "{body}"
    );
    let (status, _) = call_json(
        server,
        "SelectSeries",
        json!({"profileTypeID": CPU, "step": 0}),
    );
    assert_eq!(status, 400);
    let (status, _) = call_json(server, "NoSuchMethod", json!({}));
    assert_eq!(status, 404);
    let (status, _) = server.post_with(
        &path("LabelNames"),
        b"{",
        &[("Content-Type", "application/json")],
    );
    assert_eq!(status, 400);
    let (status, _) = server.post_with(
        &path("LabelNames"),
        b"\xff\xff",
        &[("Content-Type", "application/proto")],
    );
    assert_eq!(status, 400);
    let (status, _) = server.post_with(&path("LabelNames"), b"", &[("Content-Type", "text/plain")]);
    assert_eq!(status, 400);
}

#[test]
fn grpc_clients_get_the_same_answers() {
    let loaded = loaded();
    let server = &loaded.server;
    let request = merge_request(&loaded, r#"{service_name="api"}"#);
    let mut frame = vec![0u8];
    let message = request.encode_to_vec();
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let url = format!("{}{}", server.url, path("SelectMergeStacktraces"));
    let (status, body) = server.runtime().block_on(async move {
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .http2_only(true)
                .build_http::<Full<Bytes>>();
        let request = hyper::Request::post(url)
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(Bytes::from(frame)))
            .unwrap();
        let response = client.request(request).await.expect("h2c request");
        let headers = response.headers().clone();
        let collected = response.into_body().collect().await.expect("body");
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let status = trailers
            .get("grpc-status")
            .or(headers.get("grpc-status"))
            .map(|v| v.to_str().unwrap_or("").to_string())
            .unwrap_or_default();
        (status, collected.to_bytes())
    });
    assert_eq!(status, "0");
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let response = api::SelectMergeStacktracesResponse::decode(&body[5..5 + length]).unwrap();
    assert_eq!(response.flamegraph.unwrap().total, 2 * loaded.fixture_total);
}

#[test]
fn legacy_http_queries_agree_with_the_api() {
    let loaded = loaded();
    let server = &loaded.server;
    let (from, until) = (loaded.start / 1000, loaded.end / 1000);
    let api_query = url_escape(&format!(r#"{CPU}{{service_name="api"}}"#));
    let web_query = url_escape(&format!(r#"{CPU}{{service_name="web"}}"#));
    let render = server.json(
        &format!("/pyroscope/render?query={api_query}&from={from}&until={until}&groupBy=instance"),
        &[],
    );
    let sum = |timeline: &Value| -> i64 {
        timeline["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .sum()
    };
    assert_eq!(
        render["flamebearer"]["numTicks"],
        json!(2 * loaded.fixture_total)
    );
    assert_eq!(sum(&render["timeline"]), 2 * loaded.fixture_total);
    let groups = render["groups"].as_object().expect("groups");
    assert_eq!(groups.len(), 2);
    for instance in ["a", "b"] {
        assert_eq!(sum(&groups[instance]), loaded.fixture_total);
    }

    let diff = server.json(
        &format!(
            "/pyroscope/render-diff?leftQuery={api_query}&leftFrom={from}&leftUntil={until}\
             &rightQuery={web_query}&rightFrom={from}&rightUntil={until}"
        ),
        &[],
    );
    assert_eq!(diff["leftTicks"], json!(2 * loaded.fixture_total));
    assert_eq!(diff["rightTicks"], json!(loaded.fixture_total));
    assert_eq!(diff["metadata"]["format"], "double");
    for level in diff["flamebearer"]["levels"].as_array().unwrap() {
        assert_eq!(level.as_array().unwrap().len() % 7, 0);
    }
    assert_eq!(sum(&diff["leftTimeline"]), 2 * loaded.fixture_total);

    let names = server.json(
        &format!("/pyroscope/label-names?from={from}&until={until}"),
        &[],
    );
    assert!(names.as_array().unwrap().contains(&json!("service_name")));
    let values = server.json(
        &format!("/pyroscope/label-values?label=service_name&from={from}&until={until}"),
        &[],
    );
    assert_eq!(values, json!(["api", "web"]));
    let narrowed = server.json(
        &format!(
            "/pyroscope/label-values?label=service_name&query={}&from={from}&until={until}",
            url_escape(r#"{instance="b"}"#)
        ),
        &[],
    );
    assert_eq!(narrowed, json!(["api"]));
    let (status, body) = server.get("/pyroscope/render-diff?leftQuery=x");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("rightQuery"), "{body}");
}

#[test]
fn span_selector_merges_only_the_samples_of_those_spans() {
    let Some(bytes) = corpus("pyro-span_id.pb.gz") else {
        eprintln!("skipped: ../shared/corpus/pyro-span_id.pb.gz is absent");
        return;
    };
    let server = TestServer::start();
    let profile = kiln_model::pprof::decode(&bytes, 1 << 30).unwrap();
    let (status, text) = server.post(
        "/ingest?name=spans&format=pprof&from=1700000000&until=1700000010",
        &bytes,
    );
    assert_eq!(status, 200, "{text}");
    // The expected value per span: the sum of the samples carrying it, first value type.
    let mut by_span: std::collections::BTreeMap<String, i64> = Default::default();
    for sample in profile.sample.iter() {
        for label in sample.label {
            if profile.string_or_empty(label.key) == "span_id" {
                *by_span
                    .entry(profile.string_or_empty(label.str))
                    .or_default() += sample.value[0];
            }
        }
    }
    assert!(!by_span.is_empty(), "the profile has span ids");
    let type_index = profile.sample_type[0];
    let types: api::ProfileTypesResponse = call(
        &server,
        "ProfileTypes",
        &api::ProfileTypesRequest {
            start: 1_699_999_990_000,
            end: 1_700_000_100_000,
        },
        None,
    );
    let sample_type = profile.string_or_empty(type_index.r#type);
    let type_id = types
        .profile_types
        .iter()
        .find(|t| t.sample_type == sample_type)
        .map(|t| t.id.clone())
        .expect("the first sample type is stored");
    let span_total = |spans: Vec<String>| -> i64 {
        let response: api::SelectMergeStacktracesResponse = call(
            &server,
            "SelectMergeSpanProfile",
            &api::SelectMergeSpanProfileRequest {
                profile_type_id: type_id.clone(),
                label_selector: r#"{service_name="spans"}"#.into(),
                span_selector: spans,
                start: 1_699_999_990_000,
                end: 1_700_000_100_000,
                ..Default::default()
            },
            None,
        );
        response.flamegraph.map_or(0, |graph| graph.total)
    };
    let all: i64 = profile.sample.iter().map(|sample| sample.value[0]).sum();
    let spans: Vec<String> = by_span.keys().cloned().collect();
    let with_spans: i64 = by_span.values().sum();
    assert!(with_spans < all, "some samples carry no span");
    for (span, total) in &by_span {
        assert_eq!(span_total(vec![span.clone()]), *total, "span {span}");
    }
    assert_eq!(span_total(spans.clone()), with_spans);
    let mut with_unknown = spans;
    with_unknown.push("no-such-span".into());
    assert_eq!(span_total(with_unknown), with_spans);
    assert_eq!(span_total(vec!["no-such-span".into()]), 0);
    // Span exemplars on the series name each span with its value.
    let series: api::SelectSeriesResponse = call(
        &server,
        "SelectSeries",
        &api::SelectSeriesRequest {
            profile_type_id: type_id.clone(),
            label_selector: r#"{service_name="spans"}"#.into(),
            start: 1_699_999_990_000,
            end: 1_700_000_100_000,
            step: 3600.0,
            exemplar_type: api::EXEMPLAR_TYPE_SPAN,
            ..Default::default()
        },
        None,
    );
    let exemplars: std::collections::BTreeMap<String, i64> = series.series[0].points[0]
        .exemplars
        .iter()
        .map(|exemplar| (exemplar.span_id.clone(), exemplar.value))
        .collect();
    assert_eq!(exemplars, by_span);
    assert!(series.series[0].points[0]
        .exemplars
        .iter()
        .all(|e| !e.profile_id.is_empty()));
}

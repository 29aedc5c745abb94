//! The crate graph docs/ARCHITECTURE.md draws, checked against `cargo metadata`: no crate
//! depends on one in its own layer or above, so the layering cannot drift silently.

use std::collections::BTreeMap;
use std::process::Command;

/// Each crate's layer, lowest first. A crate may depend only on lower layers; crates of
/// one layer are independent of each other (storage and metastore, for one).
const LAYERS: &[(&str, u32)] = &[
    ("kiln-model", 0),
    ("kiln-runtime", 0),
    ("kiln-child", 0),
    ("kiln-gosym", 0),
    ("kiln-kube", 0),
    ("kiln-testkit", 1),
    ("kiln-storage", 1),
    ("kiln-metastore", 1),
    ("kiln-auth", 1),
    ("kiln-mcp", 1),
    ("kiln-ingest", 2),
    ("kiln-compactor", 2),
    ("kiln-query", 2),
    ("kiln-scrape", 2),
    ("kiln-agent", 2),
    ("kiln-symbolize", 2),
    ("kiln-rules", 3),
    ("kiln-insight", 3),
    ("kiln-cluster", 3),
    ("kiln-server", 4),
    ("kiln-bench", 4),
    ("kiln-node", 5),
    ("kiln", 6),
];

#[test]
fn no_crate_depends_on_its_own_layer_or_above() {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let layers: BTreeMap<&str, u32> = LAYERS.iter().copied().collect();
    let mut seen = Vec::new();
    let mut violations = Vec::new();
    for package in metadata["packages"].as_array().expect("packages") {
        let name = package["name"].as_str().expect("name");
        let layer = *layers.get(name).unwrap_or_else(|| {
            panic!(
                "{name} is not in LAYERS: give it a layer here and a place in docs/ARCHITECTURE.md"
            )
        });
        seen.push(name.to_string());
        for dependency in package["dependencies"].as_array().expect("dependencies") {
            let target = dependency["name"].as_str().expect("dependency name");
            // Dev-dependencies (the test kit) may come from anywhere.
            if dependency["kind"].as_str() == Some("dev") {
                continue;
            }
            if let Some(target_layer) = layers.get(target) {
                if *target_layer >= layer {
                    violations.push(format!(
                        "{name} (layer {layer}) depends on {target} (layer {target_layer})"
                    ));
                }
            }
        }
    }
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(
        seen.len(),
        LAYERS.len(),
        "crates in the workspace: {seen:?}"
    );
    // The host agent and pull collection stand on the data model alone (the agent also
    // on kiln-gosym, a reader of Go binaries' tables with no layer of its own below it;
    // pull collection on kiln-kube, which follows a Kubernetes cluster).
    for (name, allowed) in [
        ("kiln-agent", &["kiln-model", "kiln-gosym"][..]),
        ("kiln-scrape", &["kiln-model", "kiln-kube"][..]),
    ] {
        let package = metadata["packages"]
            .as_array()
            .and_then(|packages| packages.iter().find(|p| p["name"] == name))
            .expect("package");
        for dependency in package["dependencies"].as_array().expect("dependencies") {
            let target = dependency["name"].as_str().unwrap_or_default();
            if target.starts_with("kiln-") && dependency["kind"].as_str() != Some("dev") {
                assert!(allowed.contains(&target), "{name} depends on {target}");
            }
        }
    }
    let architecture = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ARCHITECTURE.md"),
    )
    .expect("docs/ARCHITECTURE.md");
    for name in seen {
        assert!(
            architecture.contains(&name),
            "docs/ARCHITECTURE.md does not mention {name}"
        );
    }
}

/// Every file of a module: `name.rs`, or the files under the directory `name/`.
fn module_files(path: &std::path::Path) -> Vec<std::path::PathBuf> {
    if path.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path).expect("module directory") {
            files.extend(module_files(&entry.expect("entry").path()));
        }
        files
    } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
        vec![path.to_path_buf()]
    } else {
        Vec::new()
    }
}

/// The top-level modules of a crate's `src` and the ones each refers to (`crate::x`,
/// `crate::{x, y}`, `super::x` from a module's own files), comments and `#[cfg(test)]`
/// code left out: tests may import anything.
fn module_graph(krate: &str) -> BTreeMap<String, Vec<String>> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src");
    let mut graph: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("src") {
        let path = entry.expect("entry").path();
        let Some(module) = path
            .file_stem()
            .and_then(|s| s.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        if module == "lib" || module == "main" {
            continue;
        }
        let uses = graph.entry(module.clone()).or_default();
        for file in module_files(&path) {
            let text = std::fs::read_to_string(&file).expect("source");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for line in code
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
            {
                for prefix in ["crate::", "super::"] {
                    let mut rest = line;
                    while let Some(at) = rest.find(prefix) {
                        rest = &rest[at + prefix.len()..];
                        let names: Vec<&str> = match rest.strip_prefix('{') {
                            Some(group) => group
                                .split('}')
                                .next()
                                .unwrap_or_default()
                                .split(',')
                                .map(|name| name.trim().split("::").next().unwrap_or_default())
                                .collect(),
                            None => vec![rest
                                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                                .next()
                                .unwrap_or_default()],
                        };
                        for name in names {
                            if !name.is_empty() && name != module && !uses.iter().any(|u| u == name)
                            {
                                uses.push(name.to_string());
                            }
                        }
                    }
                }
            }
        }
    }
    graph
}

/// The first import cycle among a crate's modules, if any.
fn import_cycle(graph: &BTreeMap<String, Vec<String>>) -> Option<String> {
    // Depth-first search; a module met again while still on the path closes a cycle.
    fn visit(
        module: &str,
        graph: &BTreeMap<String, Vec<String>>,
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<String> {
        if done.iter().any(|d| d == module) {
            return None;
        }
        if let Some(start) = path.iter().position(|p| p == module) {
            return Some(format!("{} -> {module}", path[start..].join(" -> ")));
        }
        path.push(module.to_string());
        for next in graph.get(module).into_iter().flatten() {
            if graph.contains_key(next) {
                if let Some(cycle) = visit(next, graph, path, done) {
                    return Some(cycle);
                }
            }
        }
        path.pop();
        done.push(module.to_string());
        None
    }
    let mut done = Vec::new();
    graph
        .keys()
        .find_map(|module| visit(module, graph, &mut Vec::new(), &mut done))
}

/// Files of one crate import each other in one direction: a module that needs another's
/// helper and is needed by it is two modules that should be three.
#[test]
fn no_crate_has_files_that_import_each_other_in_a_cycle() {
    let mut cycles = Vec::new();
    for (krate, _) in LAYERS {
        let graph = module_graph(krate);
        if let Some(cycle) = import_cycle(&graph) {
            cycles.push(format!("{krate}: {cycle}"));
        }
    }
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
    // The check sees imports: a cycle planted in a copy of a real graph is found.
    let mut planted = module_graph("kiln-query");
    assert!(
        planted.contains_key("root") && planted.contains_key("leaf"),
        "{planted:?}"
    );
    planted
        .get_mut("leaf")
        .expect("leaf")
        .push("root".to_string());
    assert!(import_cycle(&planted).is_some(), "{planted:?}");
    // The router is the top: only the edge's entry point (`kiln_server::serve`, in
    // lib.rs) refers to it.
    let server = module_graph("kiln-server");
    assert!(
        server.contains_key("routes") && server.contains_key("rpc"),
        "{server:?}"
    );
    for (module, uses) in &server {
        assert!(!uses.iter().any(|u| u == "routes"), "{module} uses routes");
    }
}

/// Every `/metrics` line comes from prometheus-client (custom collectors where the values
/// live elsewhere), which escapes label values by the exposition's rules; the one
/// exception is the recording rules' values, which carry their own sample times.
#[test]
fn no_exposition_is_written_by_hand() {
    let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for (krate, _) in LAYERS {
        for file in module_files(&crates.join(krate).join("src")) {
            let text = std::fs::read_to_string(&file).expect("source");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            if code.contains("# TYPE ") || code.contains("# HELP ") {
                found.push(file.display().to_string());
            }
        }
    }
    let allowed = ["kiln-rules/src/export.rs"];
    found.retain(|file| !allowed.iter().any(|allowed| file.ends_with(allowed)));
    assert!(
        found.is_empty(),
        "Prometheus text written by hand in {found:#?}"
    );
}

/// The release binary holds no test code: the test kit (its PostgreSQL and S3
/// launchers) reaches `kiln` only as a dev-dependency, or through the `bench-services`
/// feature that release builds leave off.
#[test]
fn the_release_binary_has_no_test_kit() {
    let tree = |features: &[&str]| -> String {
        let output = Command::new(env!("CARGO"))
            .args([
                "tree",
                "--offline",
                "-e",
                "normal",
                "--prefix",
                "none",
                "-p",
                "kiln",
            ])
            .args(features)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo tree runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let has_testkit = |tree: &str| tree.lines().any(|line| line.starts_with("kiln-testkit "));
    let release = tree(&[]);
    assert!(
        release.lines().any(|line| line.starts_with("kiln-bench ")),
        "{release}"
    );
    assert!(!has_testkit(&release), "{release}");
    // The check sees the kit where it is linked in.
    assert!(has_testkit(&tree(&["--features", "bench-services"])));
    // One HTTP client in what users run: reqwest. ureq is the tests' blocking client (a
    // dev-dependency, and the test kit's), seen here only where the kit is linked in.
    let has = |tree: &str, name: &str| {
        tree.lines()
            .any(|line| line.starts_with(&format!("{name} ")))
    };
    assert!(has(&release, "reqwest"), "{release}");
    assert!(!has(&release, "ureq"), "{release}");
    assert!(has(&tree(&["--features", "bench-services"]), "ureq"));
}

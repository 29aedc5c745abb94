//! The crate graph docs/ARCHITECTURE.md draws, checked against `cargo metadata`: no crate
//! depends on one in its own layer or above, so the layering cannot drift silently.

use std::collections::BTreeMap;
use std::process::Command;

/// Each crate's layer, lowest first. A crate may depend only on lower layers; crates of
/// one layer are independent of each other (storage and metastore, for one).
const LAYERS: &[(&str, u32)] = &[
    ("kiln-model", 0),
    ("kiln-testkit", 0),
    ("kiln-storage", 1),
    ("kiln-metastore", 1),
    ("kiln-ingest", 2),
    ("kiln-compactor", 2),
    ("kiln-query", 2),
    ("kiln-scrape", 2),
    ("kiln-agent", 2),
    ("kiln-server", 3),
    ("kiln-bench", 3),
    ("kiln", 4),
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
    // The host agent and pull collection stand on the data model alone.
    for name in ["kiln-agent", "kiln-scrape"] {
        let package = metadata["packages"]
            .as_array()
            .and_then(|packages| packages.iter().find(|p| p["name"] == name))
            .expect("package");
        for dependency in package["dependencies"].as_array().expect("dependencies") {
            let target = dependency["name"].as_str().unwrap_or_default();
            if target.starts_with("kiln-") && dependency["kind"].as_str() != Some("dev") {
                assert_eq!(target, "kiln-model", "{name} depends on {target}");
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

//! Relabeling against Prometheus's documented semantics (the `relabel_config` section of
//! its configuration docs): one test per action, with the defaults (`separator: ;`,
//! `regex: (.*)`, `replacement: $1`, `action: replace`) and full-string anchoring.

use kiln_scrape::relabel::{relabel, LabelSet, RelabelConfig};

fn labels(pairs: &[(&str, &str)]) -> LabelSet {
    pairs
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

fn rules(yaml: &str) -> Vec<RelabelConfig> {
    let rules: Vec<RelabelConfig> = yaml_serde::from_str(yaml).expect("rules parse");
    for rule in &rules {
        rule.validate().expect("rule is valid");
    }
    rules
}

#[test]
fn replace_joins_sources_expands_groups_and_deletes_on_empty() {
    let input = labels(&[("a", "foo"), ("b", "bar")]);
    let out = relabel(
        &input,
        &rules(
            r#"
- source_labels: [a, b]
  regex: "f(.*);(.*)r"
  target_label: c
  replacement: "ok-${1}-$2"
"#,
        ),
    )
    .unwrap();
    assert_eq!(out.get("c").map(String::as_str), Some("ok-oo-ba"));
    // Defaults: regex (.*), replacement $1: a plain copy.
    let out = relabel(&input, &rules("- {source_labels: [a], target_label: d}")).unwrap();
    assert_eq!(out.get("d").map(String::as_str), Some("foo"));
    // The regex is anchored: "oo" does not match "foo", so nothing changes.
    let out = relabel(
        &input,
        &rules("- {source_labels: [a], regex: oo, target_label: e}"),
    )
    .unwrap();
    assert_eq!(out, input);
    // An empty result deletes the target label.
    let out = relabel(
        &input,
        &rules("- {source_labels: [missing], target_label: a}"),
    )
    .unwrap();
    assert!(!out.contains_key("a"));
    // The target label name may use groups; an invalid resulting name changes nothing.
    let out = relabel(
        &input,
        &rules(r#"- {source_labels: [a], regex: "(f)oo", target_label: "x_${1}", replacement: v}"#),
    )
    .unwrap();
    assert_eq!(out.get("x_f").map(String::as_str), Some("v"));
    let out = relabel(
        &input,
        &rules(r#"- {source_labels: [a], target_label: "1bad", replacement: v}"#),
    )
    .unwrap();
    assert_eq!(out, input);
    // A custom separator.
    let out = relabel(
        &input,
        &rules(r#"- {source_labels: [a, b], separator: "/", target_label: path}"#),
    )
    .unwrap();
    assert_eq!(out.get("path").map(String::as_str), Some("foo/bar"));
}

#[test]
fn keep_and_drop_decide_on_the_joined_value() {
    let input = labels(&[("env", "prod"), ("team", "perf")]);
    let keep = rules("- {source_labels: [env], regex: prod|staging, action: keep}");
    assert!(relabel(&input, &keep).is_some());
    let keep_other = rules("- {source_labels: [env], regex: staging, action: keep}");
    assert!(relabel(&input, &keep_other).is_none());
    // A missing label is the empty string: keep with the default regex keeps it.
    assert!(relabel(&input, &rules("- {source_labels: [nope], action: keep}")).is_some());
    let drop = rules("- {source_labels: [env, team], regex: 'prod;perf', action: drop}");
    assert!(relabel(&input, &drop).is_none());
    let drop_other = rules("- {source_labels: [env], regex: prod.+, action: drop}");
    assert!(relabel(&input, &drop_other).is_some());
}

#[test]
fn keepequal_and_dropequal_compare_with_the_target_label() {
    let input = labels(&[
        ("__address__", "host:8080"),
        ("port", "8080"),
        ("want", "host:8080"),
    ]);
    let keep = rules("- {source_labels: [__address__], target_label: want, action: keepequal}");
    assert!(relabel(&input, &keep).is_some());
    let keep = rules("- {source_labels: [port], target_label: want, action: keepequal}");
    assert!(relabel(&input, &keep).is_none());
    let drop = rules("- {source_labels: [__address__], target_label: want, action: dropequal}");
    assert!(relabel(&input, &drop).is_none());
}

#[test]
fn hashmod_matches_prometheus_values() {
    // Prometheus: target = (the last 8 bytes of md5(value), big-endian) mod modulus.
    // md5("foo") = acbd18db4cc2f85cedef654fccc4a4d8; 0xedef654fccc4a4d8 mod 1000 = 280.
    let input = labels(&[("a", "foo")]);
    let out = relabel(
        &input,
        &rules("- {source_labels: [a], modulus: 1000, target_label: shard, action: hashmod}"),
    )
    .unwrap();
    assert_eq!(
        out.get("shard").map(String::as_str),
        Some((0xedef_654f_ccc4_a4d8u64 % 1000).to_string().as_str())
    );
    // hashmod then keep: the usual sharding recipe.
    let shard = rules(
        "- {source_labels: [a], modulus: 2, target_label: __tmp_hash, action: hashmod}\n\
         - {source_labels: [__tmp_hash], regex: '0', action: keep}",
    );
    let kept = ["a", "b", "c", "d", "e", "f"]
        .iter()
        .filter(|value| relabel(&labels(&[("a", value)]), &shard).is_some())
        .count();
    assert!(kept > 0 && kept < 6, "{kept} of 6 in shard 0");
}

#[test]
fn labelmap_labeldrop_and_labelkeep_act_on_names() {
    let input = labels(&[
        ("__meta_kubernetes_pod_label_app", "api"),
        ("__meta_kubernetes_pod_label_tier", "web"),
        ("job", "k8s"),
    ]);
    let out = relabel(
        &input,
        &rules("- {regex: __meta_kubernetes_pod_label_(.+), action: labelmap}"),
    )
    .unwrap();
    assert_eq!(out.get("app").map(String::as_str), Some("api"));
    assert_eq!(out.get("tier").map(String::as_str), Some("web"));
    assert!(
        out.contains_key("__meta_kubernetes_pod_label_app"),
        "labelmap copies"
    );
    let out = relabel(&out, &rules("- {regex: __meta_.*, action: labeldrop}")).unwrap();
    assert_eq!(
        out,
        labels(&[("app", "api"), ("job", "k8s"), ("tier", "web")])
    );
    let out = relabel(&out, &rules("- {regex: 'app|job', action: labelkeep}")).unwrap();
    assert_eq!(out, labels(&[("app", "api"), ("job", "k8s")]));
}

#[test]
fn lowercase_and_uppercase_set_the_target() {
    let input = labels(&[("a", "MiXeD")]);
    let out = relabel(
        &input,
        &rules("- {source_labels: [a], target_label: low, action: lowercase}\n- {source_labels: [a], target_label: up, action: uppercase}"),
    )
    .unwrap();
    assert_eq!(out.get("low").map(String::as_str), Some("mixed"));
    assert_eq!(out.get("up").map(String::as_str), Some("MIXED"));
}

#[test]
fn invalid_rules_are_refused_at_load() {
    let rule: Vec<RelabelConfig> =
        yaml_serde::from_str("- {action: hashmod, target_label: x}").unwrap();
    assert!(rule[0].validate().unwrap_err().contains("modulus"));
    let rule: Vec<RelabelConfig> = yaml_serde::from_str("- {action: replace}").unwrap();
    assert!(rule[0].validate().unwrap_err().contains("target_label"));
    let bad: Result<Vec<RelabelConfig>, _> = yaml_serde::from_str("- {regex: '('}");
    assert!(bad.unwrap_err().to_string().contains("invalid regex"));
    let bad: Result<Vec<RelabelConfig>, _> = yaml_serde::from_str("- {action: explode}");
    assert!(bad.is_err());
}

#[test]
fn scrape_configs_parse_in_prometheus_shape() {
    let configs: Vec<kiln_scrape::ScrapeConfig> = yaml_serde::from_str(
        r#"
- job_name: api
  scrape_interval: 1m30s
  scrape_timeout: 500ms
  params: {debug: ["1"]}
  basic_auth: {username: u, password: p}
  static_configs: [{targets: ["a:1", "b:2"], labels: {env: prod}}]
  profiling_config:
    pprof_config:
      goroutine: {enabled: false}
      memory: {path: /custom/heap}
"#,
    )
    .unwrap();
    let config = &configs[0];
    config.validate().unwrap();
    assert_eq!(config.scrape_interval, std::time::Duration::from_secs(90));
    assert_eq!(config.scrape_timeout, std::time::Duration::from_millis(500));
    let endpoints = config.profiling_config.endpoints();
    assert!(!endpoints.contains_key("goroutine"));
    assert_eq!(endpoints["memory"].path, "/custom/heap");
    assert_eq!(endpoints["process_cpu"].path, "/debug/pprof/profile");
    assert!(
        endpoints["mutex"].delta && endpoints["block"].delta && !endpoints["process_cpu"].delta
    );
    let bad: Vec<kiln_scrape::ScrapeConfig> =
        yaml_serde::from_str("- {job_name: x, scrape_interval: 5s, scrape_timeout: 10s}").unwrap();
    assert!(bad[0]
        .validate()
        .unwrap_err()
        .contains("greater than scrape_interval"));
    assert!(yaml_serde::from_str::<Vec<kiln_scrape::ScrapeConfig>>(
        "- {job_name: x, scrape_interval: 5x}"
    )
    .is_err());
}

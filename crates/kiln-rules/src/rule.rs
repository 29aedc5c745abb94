//! A recording rule's definition, its checks, and its compiled form.
//!
//! Every check names the rule and the field, because a rule that fails stops the server
//! at start-up (file rules) or is refused with 400 (the API), and either way the user has
//! to find what to fix.

use std::collections::BTreeMap;

use kiln_model::labels::{is_reserved_label_name, is_valid_label_name};
use kiln_model::profile_type::ProfileType;
use kiln_model::selector::{self, Selector};
use kiln_query::select::TypeFilter;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A rule, as written in the config file (`recording_rules:`) or sent to the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The exported metric; also the rule's name (unique per tenant).
    pub metric_name: String,
    /// The full profile type id: `process_cpu:cpu:nanoseconds:cpu:nanoseconds`.
    pub profile_type: String,
    /// Prometheus label matchers over the profiles' series: `{service_name="checkout"}`.
    #[serde(default)]
    pub matchers: String,
    /// Labels kept on the exported series; every other label is summed away.
    #[serde(default)]
    pub group_by: Vec<String>,
    /// When set, only samples whose stack holds this function (at any depth, inlined
    /// frames included) count, each once however often it recurs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_name: Option<String>,
    /// Labels added to every exported series.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub external_labels: BTreeMap<String, String>,
    /// Config file only: the tenant whose profiles the rule reads (default `anonymous`).
    /// Through the API the tenant is the request's `X-Scope-OrgID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// What is wrong with a rule, naming the rule and the field.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("recording rule {rule:?}: {field}: {message}")]
pub struct RuleError {
    pub rule: String,
    pub field: &'static str,
    pub message: String,
}

/// A checked rule, ready to evaluate.
#[derive(Debug, Clone)]
pub struct CompiledRule {
    pub spec: RuleSpec,
    pub selector: Selector,
    pub types: TypeFilter,
    /// (label read from the series, label name exported), in `group_by` order.
    pub group_by: Vec<(String, String)>,
}

/// Prometheus's metric name rule: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
pub fn is_valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Prometheus's label name rule (no dots: a Prometheus 2 receiver refuses them).
fn is_prometheus_label_name(name: &str) -> bool {
    is_valid_label_name(name) && !name.contains('.')
}

impl RuleSpec {
    pub fn compile(&self) -> Result<CompiledRule, RuleError> {
        let fail = |field: &'static str, message: String| RuleError {
            rule: self.metric_name.clone(),
            field,
            message,
        };
        if !is_valid_metric_name(&self.metric_name) {
            return Err(fail(
                "metric_name",
                "not a valid Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)".into(),
            ));
        }
        ProfileType::parse(&self.profile_type).map_err(|err| {
            fail(
                "profile_type",
                format!("{err} (expected name:sample_type:sample_unit:period_type:period_unit, such as process_cpu:cpu:nanoseconds:cpu:nanoseconds)"),
            )
        })?;
        let text = self.matchers.trim();
        let selector = if text.is_empty() {
            Selector::default()
        } else {
            selector::parse(text).map_err(|err| fail("matchers", err.to_string()))?
        };
        if let Some(name) = &selector.name {
            return Err(fail(
                "matchers",
                format!("give label matchers only, such as {{service_name=\"{name}\"}}; the profile type is the profile_type field"),
            ));
        }
        let mut group_by = Vec::new();
        for label in &self.group_by {
            if !is_valid_label_name(label) || is_reserved_label_name(label) {
                return Err(fail(
                    "group_by",
                    format!("{label:?} is not a label name profiles carry"),
                ));
            }
            // Prometheus 2 label names have no dots: `service.version` → `service_version`.
            let exported = label.replace('.', "_");
            if group_by.iter().any(|(_, name)| name == &exported) {
                return Err(fail("group_by", format!("{label:?} is listed twice")));
            }
            group_by.push((label.clone(), exported));
        }
        if self
            .function_name
            .as_deref()
            .is_some_and(|name| name.trim().is_empty())
        {
            return Err(fail("function_name", "is empty".into()));
        }
        for name in self.external_labels.keys() {
            if !is_prometheus_label_name(name) || is_reserved_label_name(name) {
                return Err(fail(
                    "external_labels",
                    format!("{name:?} is not a valid Prometheus label name"),
                ));
            }
            if group_by.iter().any(|(_, exported)| exported == name) {
                return Err(fail(
                    "external_labels",
                    format!("{name:?} is also in group_by"),
                ));
            }
        }
        if let Some(tenant) = &self.tenant {
            if tenant.is_empty() {
                return Err(fail("tenant", "is empty".into()));
            }
        }
        Ok(CompiledRule {
            spec: self.clone(),
            selector,
            types: TypeFilter::Exact(self.profile_type.clone()),
            group_by,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RuleSpec {
        serde_yaml_like(
            r#"{"metric_name": "checkout_cpu_nanoseconds", "profile_type": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
                "matchers": "{service_name=\"checkout\"}", "group_by": ["service_name", "env"],
                "function_name": "main.parse", "external_labels": {"source": "kiln"}}"#,
        )
    }

    fn serde_yaml_like(json: &str) -> RuleSpec {
        serde_json::from_str(json).expect("rule parses")
    }

    #[test]
    fn the_issue_example_compiles() {
        let rule = spec().compile().expect("valid");
        assert_eq!(rule.selector.equality("service_name"), Some("checkout"));
        assert_eq!(rule.group_by.len(), 2);
    }

    #[test]
    fn each_mistake_names_the_rule_and_the_field() {
        type Change = Box<dyn Fn(&mut RuleSpec)>;
        let cases: Vec<(Change, &str, &str)> = vec![
            (
                Box::new(|r| r.metric_name = "9cpu".into()),
                "metric_name",
                "valid Prometheus metric name",
            ),
            (
                Box::new(|r| r.profile_type = "cpu".into()),
                "profile_type",
                "expected name:sample_type",
            ),
            (
                Box::new(|r| r.matchers = "{service_name=".into()),
                "matchers",
                "position",
            ),
            (
                Box::new(|r| r.matchers = "process_cpu{}".into()),
                "matchers",
                "label matchers only",
            ),
            (
                Box::new(|r| r.group_by = vec!["__name__".into()]),
                "group_by",
                "not a label name",
            ),
            (
                Box::new(|r| r.group_by = vec!["env".into(), "env".into()]),
                "group_by",
                "twice",
            ),
            (
                Box::new(|r| r.function_name = Some(" ".into())),
                "function_name",
                "empty",
            ),
            (
                Box::new(|r| {
                    r.external_labels.insert("env".into(), "x".into());
                }),
                "external_labels",
                "also in group_by",
            ),
            (
                Box::new(|r| {
                    r.external_labels.insert("a.b".into(), "x".into());
                }),
                "external_labels",
                "valid Prometheus label",
            ),
        ];
        for (change, field, words) in cases {
            let mut rule = spec();
            change(&mut rule);
            let err = rule.compile().expect_err(field);
            assert_eq!(err.field, field);
            let text = err.to_string();
            assert!(
                text.contains(&format!("recording rule {:?}", rule.metric_name)),
                "{text}"
            );
            assert!(text.contains(field) && text.contains(words), "{text}");
        }
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = serde_json::from_str::<RuleSpec>(
            r#"{"metric_name": "x", "profile_type": "a:b:c:d:e", "group-by": []}"#,
        )
        .expect_err("typo");
        assert!(err.to_string().contains("group-by"), "{err}");
    }
}

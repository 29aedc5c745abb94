//! Label sets: sorted, unique name/value pairs that identify a series.

use serde::{Deserialize, Serialize};

/// One `name=value` pair.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Label {
    pub name: String,
    pub value: String,
}

/// The label name holding the service a series belongs to.
pub const SERVICE_NAME: &str = "service_name";
/// The label name holding the profile name (the first part of a profile type id).
pub const METRIC_NAME: &str = "__name__";

/// A label set kept sorted by name with unique names, so equal sets compare and hash equal.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Labels(Vec<Label>);

impl Labels {
    pub fn new() -> Self {
        Labels(Vec::new())
    }

    /// Builds a set from pairs; a later pair with the same name replaces an earlier one.
    pub fn from_pairs<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        let mut labels = Labels::new();
        for (name, value) in pairs {
            labels.set(name, value);
        }
        labels
    }

    /// Sets `name` to `value`, replacing any previous value. An empty value removes the
    /// label, as in Prometheus, where an empty label is the same as a missing one.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let name = name.into();
        let value = value.into();
        match self
            .0
            .binary_search_by(|label| label.name.as_str().cmp(&name))
        {
            Ok(index) if value.is_empty() => {
                self.0.remove(index);
            }
            Ok(index) => self.0[index].value = value,
            Err(_) if value.is_empty() => {}
            Err(index) => self.0.insert(index, Label { name, value }),
        }
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .binary_search_by(|label| label.name.as_str().cmp(name))
            .ok()
            .map(|index| self.0[index].value.as_str())
    }

    pub fn remove(&mut self, name: &str) {
        if let Ok(index) = self
            .0
            .binary_search_by(|label| label.name.as_str().cmp(name))
        {
            self.0.remove(index);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Label> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Limits on label sets, checked on every write.
#[derive(Debug, Clone, Copy)]
pub struct LabelLimits {
    pub max_labels: usize,
    pub max_name_length: usize,
    pub max_value_length: usize,
}

impl Default for LabelLimits {
    fn default() -> Self {
        LabelLimits {
            max_labels: 30,
            max_name_length: 1024,
            max_value_length: 2048,
        }
    }
}

/// Turns an arbitrary key into a valid label name: `[A-Za-z_][A-Za-z0-9_.]*`.
///
/// Dots are kept because OpenTelemetry attribute names (`otel.scope.name`) use them and
/// Pyroscope keeps them; anything else outside the set becomes `_`.
pub fn sanitize_label_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    for (index, ch) in name.chars().enumerate() {
        let valid = ch.is_ascii_alphanumeric() || ch == '_' || ch == '.';
        if index == 0 && ch.is_ascii_digit() {
            out.push('_');
        }
        out.push(if valid { ch } else { '_' });
    }
    out
}

/// Whether `name` is a label name Kiln stores as sent: `[A-Za-z_][A-Za-z0-9_.]*`, the
/// Prometheus rule plus dots (OpenTelemetry's `service.version`, which Pyroscope keeps).
pub fn is_valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
}

/// Names beginning with `__` are Kiln's own (`__name__` is the profile name), as in
/// Prometheus, so a client cannot change a profile's type or other internal labels.
pub fn is_reserved_label_name(name: &str) -> bool {
    name.starts_with("__")
}

/// A client's labels, checked, and what was left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientLabels {
    pub labels: Labels,
    /// One sentence per reserved label dropped, for a `Warning` header.
    pub warnings: Vec<String>,
}

/// Builds a series label set from what a client sent, without rewriting anything: an
/// invalid name or a name given twice refuses the request with a message naming the
/// label, because a silently renamed (`a-b` stored as `a_b`) or overwritten label makes
/// the client's own queries miss. Reserved (`__`) names are dropped with a warning rather
/// than refused, so that SDKs which send protocol labels of their own (`__session_id__`)
/// keep working; names in `protocol` are the request's protocol labels and are kept.
pub fn client_labels<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    protocol: &[&str],
) -> Result<ClientLabels, crate::FormatError> {
    let mut out = ClientLabels::default();
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for (name, value) in pairs {
        if !is_valid_label_name(name) {
            return Err(crate::FormatError::Malformed(format!(
                "invalid label name {name:?}: a label name is a letter or _, then letters, digits, _ or ."
            )));
        }
        if let Some((_, first)) = seen.iter().find(|(seen, _)| *seen == name) {
            return Err(crate::FormatError::Malformed(format!(
                "duplicate label {name:?} (values {first:?} and {value:?}): give each label once"
            )));
        }
        seen.push((name, value));
        if is_reserved_label_name(name) && !protocol.contains(&name) {
            out.warnings.push(format!(
                "label {name:?} dropped: names beginning with __ are reserved to Kiln"
            ));
            continue;
        }
        out.labels.set(name, value);
    }
    Ok(out)
}

/// Checks a label set against the limits, naming the offending label.
pub fn validate(labels: &Labels, limits: &LabelLimits) -> Result<(), crate::FormatError> {
    if labels.len() > limits.max_labels {
        return Err(crate::FormatError::Limit(format!(
            "series has {} labels, over the limit of {}",
            labels.len(),
            limits.max_labels
        )));
    }
    for label in labels.iter() {
        if label.name.is_empty() {
            return Err(crate::FormatError::Limit("empty label name".into()));
        }
        if label.name.len() > limits.max_name_length {
            return Err(crate::FormatError::Limit(format!(
                "label name of {} bytes is over the limit of {} (name starts {:?})",
                label.name.len(),
                limits.max_name_length,
                label.name.chars().take(32).collect::<String>()
            )));
        }
        if label.value.len() > limits.max_value_length {
            return Err(crate::FormatError::Limit(format!(
                "value of label {:?} is {} bytes, over the limit of {}",
                label.name.chars().take(64).collect::<String>(),
                label.value.len(),
                limits.max_value_length
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_unique_and_empty_values_removed() {
        let mut labels = Labels::from_pairs([("b", "2"), ("a", "1"), ("b", "3")]);
        let pairs: Vec<(&str, &str)> = labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()))
            .collect();
        assert_eq!(pairs, vec![("a", "1"), ("b", "3")]);
        labels.set("a", "");
        assert_eq!(labels.get("a"), None);
        assert_eq!(labels.len(), 1);
    }

    #[test]
    fn sanitizes_names() {
        assert_eq!(sanitize_label_name("otel.scope.name"), "otel.scope.name");
        assert_eq!(sanitize_label_name("k8s-pod"), "k8s_pod");
        assert_eq!(sanitize_label_name("1abc"), "_1abc");
    }

    #[test]
    fn client_labels_are_checked_not_rewritten() {
        let ok = client_labels([("env", "prod"), ("service.version", "1.2")], &[]).unwrap();
        assert_eq!(ok.labels.get("service.version"), Some("1.2"));
        assert!(ok.warnings.is_empty());
        for bad in ["a-b", "1abc", "", "é", "a b"] {
            let err = client_labels([(bad, "1")], &[]).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        let err = client_labels([("k", "a"), ("k", "b")], &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("duplicate label \"k\""), "{err}");
        let reserved = client_labels([("__name__", "evil"), ("env", "x")], &[]).unwrap();
        assert_eq!(reserved.labels.get("__name__"), None);
        assert_eq!(reserved.labels.get("env"), Some("x"));
        assert_eq!(reserved.warnings.len(), 1);
        assert!(reserved.warnings[0].contains("__name__"));
        let push = client_labels([("__name__", "process_cpu")], &[METRIC_NAME]).unwrap();
        assert_eq!(push.labels.get("__name__"), Some("process_cpu"));
    }

    #[test]
    fn limits_name_the_problem() {
        let limits = LabelLimits {
            max_labels: 2,
            max_name_length: 4,
            max_value_length: 4,
        };
        let too_many = Labels::from_pairs([("a", "1"), ("b", "2"), ("c", "3")]);
        assert!(validate(&too_many, &limits)
            .unwrap_err()
            .to_string()
            .contains("3 labels"));
        let long_value = Labels::from_pairs([("a", "12345")]);
        assert!(validate(&long_value, &limits)
            .unwrap_err()
            .to_string()
            .contains("\"a\""));
        assert!(validate(&Labels::from_pairs([("abcd", "1234")]), &limits).is_ok());
    }
}

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

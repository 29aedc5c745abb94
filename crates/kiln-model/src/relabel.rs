//! Prometheus relabeling, with Prometheus's semantics: the same actions, defaults,
//! anchoring and `$1`/`${name}` expansion, so rules copied from a Prometheus config do the
//! same thing here. Reference: the `relabel_config` section of Prometheus's configuration
//! documentation.

use std::collections::BTreeMap;

use md5::{Digest, Md5};
use regex::Regex;
use serde::{Deserialize, Deserializer};

/// A target's labels while relabeling: sorted, `__`-prefixed ones included.
pub type LabelSet = BTreeMap<String, String>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    #[default]
    Replace,
    Keep,
    Drop,
    KeepEqual,
    DropEqual,
    HashMod,
    LabelMap,
    LabelDrop,
    LabelKeep,
    Lowercase,
    Uppercase,
}

/// One rule, as written under `relabel_configs`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelabelConfig {
    #[serde(default)]
    pub source_labels: Vec<String>,
    #[serde(default = "default_separator")]
    pub separator: String,
    #[serde(default)]
    pub target_label: String,
    #[serde(default = "default_regex", deserialize_with = "anchored_regex")]
    pub regex: AnchoredRegex,
    #[serde(default)]
    pub modulus: u64,
    #[serde(default = "default_replacement")]
    pub replacement: String,
    #[serde(default)]
    pub action: Action,
}

/// A regex matched against the whole value, as Prometheus anchors every relabel regex.
#[derive(Debug, Clone)]
pub struct AnchoredRegex {
    pub source: String,
    regex: Regex,
}

impl AnchoredRegex {
    pub fn new(source: &str) -> Result<Self, regex::Error> {
        Ok(AnchoredRegex {
            source: source.to_string(),
            regex: Regex::new(&format!("^(?:{source})$"))?,
        })
    }
}

fn default_separator() -> String {
    ";".to_string()
}

fn default_regex() -> AnchoredRegex {
    AnchoredRegex::new("(.*)").expect("the default regex compiles")
}

fn default_replacement() -> String {
    "$1".to_string()
}

fn anchored_regex<'de, D: Deserializer<'de>>(deserializer: D) -> Result<AnchoredRegex, D::Error> {
    let source = String::deserialize(deserializer)?;
    AnchoredRegex::new(&source)
        .map_err(|err| serde::de::Error::custom(format!("invalid regex {source:?}: {err}")))
}

impl RelabelConfig {
    /// Checks what Prometheus checks when it loads a config.
    pub fn validate(&self) -> Result<(), String> {
        let needs_target = matches!(
            self.action,
            Action::Replace
                | Action::HashMod
                | Action::Lowercase
                | Action::Uppercase
                | Action::KeepEqual
                | Action::DropEqual
        );
        if needs_target && self.target_label.is_empty() {
            return Err(format!(
                "relabel action {:?} requires target_label",
                self.action
            ));
        }
        if self.action == Action::HashMod && self.modulus == 0 {
            return Err("relabel action hashmod requires a non-zero modulus".to_string());
        }
        Ok(())
    }
}

fn valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The low 64 bits of the MD5 of `value`, big-endian: Prometheus's hashmod.
fn hash_mod(value: &str, modulus: u64) -> u64 {
    let digest = Md5::digest(value.as_bytes());
    let mut low = [0u8; 8];
    low.copy_from_slice(&digest[8..16]);
    u64::from_be_bytes(low) % modulus
}

/// Applies the rules in order; `None` when a rule drops the target.
pub fn relabel(labels: &LabelSet, rules: &[RelabelConfig]) -> Option<LabelSet> {
    let mut labels = labels.clone();
    for rule in rules {
        if !apply(&mut labels, rule) {
            return None;
        }
    }
    Some(labels)
}

/// One rule; false when it drops the target.
fn apply(labels: &mut LabelSet, rule: &RelabelConfig) -> bool {
    let value = rule
        .source_labels
        .iter()
        .map(|name| labels.get(name).map(String::as_str).unwrap_or(""))
        .collect::<Vec<_>>()
        .join(&rule.separator);
    let regex = &rule.regex.regex;
    match rule.action {
        Action::Keep => regex.is_match(&value),
        Action::Drop => !regex.is_match(&value),
        Action::KeepEqual => {
            labels
                .get(&rule.target_label)
                .map(String::as_str)
                .unwrap_or("")
                == value
        }
        Action::DropEqual => {
            labels
                .get(&rule.target_label)
                .map(String::as_str)
                .unwrap_or("")
                != value
        }
        Action::Replace => {
            let Some(captures) = regex.captures(&value) else {
                return true;
            };
            let mut target = String::new();
            captures.expand(&rule.target_label, &mut target);
            if !valid_label_name(&target) {
                return true;
            }
            let mut replaced = String::new();
            captures.expand(&rule.replacement, &mut replaced);
            if replaced.is_empty() {
                labels.remove(&target);
            } else {
                labels.insert(target, replaced);
            }
            true
        }
        Action::Lowercase => {
            labels.insert(rule.target_label.clone(), value.to_lowercase());
            true
        }
        Action::Uppercase => {
            labels.insert(rule.target_label.clone(), value.to_uppercase());
            true
        }
        Action::HashMod => {
            labels.insert(
                rule.target_label.clone(),
                hash_mod(&value, rule.modulus).to_string(),
            );
            true
        }
        Action::LabelMap => {
            let mapped: Vec<(String, String)> = labels
                .iter()
                .filter_map(|(name, value)| {
                    let captures = regex.captures(name)?;
                    let mut target = String::new();
                    captures.expand(&rule.replacement, &mut target);
                    Some((target, value.clone()))
                })
                .collect();
            labels.extend(mapped);
            true
        }
        Action::LabelDrop => {
            labels.retain(|name, _| !regex.is_match(name));
            true
        }
        Action::LabelKeep => {
            labels.retain(|name, _| regex.is_match(name));
            true
        }
    }
}

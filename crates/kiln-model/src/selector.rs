//! Prometheus label selectors: `name{a="x", b!="y", c=~"re", d!~"re"}`.
//!
//! Regexes are fully anchored, as in Prometheus (`=~"ab"` matches only "ab"), and a
//! missing label matches as the empty string. A syntax error carries the byte offset of
//! the problem so an API can point at it.

use regex::Regex;
use thiserror::Error;

use crate::labels::Labels;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    Equal,
    NotEqual,
    Regex,
    NotRegex,
}

#[derive(Debug, Clone)]
pub struct Matcher {
    pub name: String,
    pub op: MatchOp,
    pub value: String,
    regex: Option<Regex>,
}

impl PartialEq for Matcher {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.op == other.op && self.value == other.value
    }
}

impl Matcher {
    pub fn new(name: &str, op: MatchOp, value: &str) -> Result<Self, SelectorError> {
        let regex = match op {
            MatchOp::Regex | MatchOp::NotRegex => Some(
                Regex::new(&format!("^(?s:{value})$")).map_err(|err| SelectorError {
                    position: 0,
                    message: format!("invalid regex {value:?}: {err}"),
                })?,
            ),
            _ => None,
        };
        Ok(Matcher {
            name: name.to_string(),
            op,
            value: value.to_string(),
            regex,
        })
    }

    pub fn equal(name: &str, value: &str) -> Self {
        Matcher {
            name: name.to_string(),
            op: MatchOp::Equal,
            value: value.to_string(),
            regex: None,
        }
    }

    /// Whether a label value (None when the label is absent) satisfies the matcher.
    pub fn matches_value(&self, value: Option<&str>) -> bool {
        let value = value.unwrap_or("");
        match self.op {
            MatchOp::Equal => value == self.value,
            MatchOp::NotEqual => value != self.value,
            MatchOp::Regex => self.regex.as_ref().is_some_and(|re| re.is_match(value)),
            MatchOp::NotRegex => !self.regex.as_ref().is_some_and(|re| re.is_match(value)),
        }
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.matches_value(labels.get(&self.name))
    }
}

/// A parsed selector: an optional name before the braces and the matchers inside.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    pub name: Option<String>,
    pub matchers: Vec<Matcher>,
}

impl Selector {
    pub fn matches(&self, labels: &Labels) -> bool {
        self.matchers.iter().all(|matcher| matcher.matches(labels))
    }

    /// The value a label must equal, when one `=` matcher pins it.
    pub fn equality(&self, name: &str) -> Option<&str> {
        self.matchers
            .iter()
            .find(|matcher| matcher.name == name && matcher.op == MatchOp::Equal)
            .map(|matcher| matcher.value.as_str())
    }
}

/// The selector as text [`parse`] reads back to an equal selector: values quoted with
/// `\`, `"` and newlines escaped.
impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(name) = &self.name {
            f.write_str(name)?;
        }
        f.write_str("{")?;
        for (index, matcher) in self.matchers.iter().enumerate() {
            let op = match matcher.op {
                MatchOp::Equal => "=",
                MatchOp::NotEqual => "!=",
                MatchOp::Regex => "=~",
                MatchOp::NotRegex => "!~",
            };
            let value = matcher
                .value
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            let separator = if index == 0 { "" } else { ", " };
            write!(f, "{separator}{}{op}\"{value}\"", matcher.name)?;
        }
        f.write_str("}")
    }
}

#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("parse error at position {position}: {message}")]
pub struct SelectorError {
    pub position: usize,
    pub message: String,
}

struct Parser<'a> {
    input: &'a str,
    position: usize,
}

impl<'a> Parser<'a> {
    fn error<T>(&self, message: impl Into<String>) -> Result<T, SelectorError> {
        Err(SelectorError {
            position: self.position,
            message: message.into(),
        })
    }

    fn peek(&self) -> Option<char> {
        self.input[self.position..].chars().next()
    }

    fn skip_whitespace(&mut self) {
        while let Some(ch) = self.peek() {
            if !ch.is_whitespace() {
                break;
            }
            self.position += ch.len_utf8();
        }
    }

    fn eat(&mut self, token: &str) -> bool {
        if self.input[self.position..].starts_with(token) {
            self.position += token.len();
            return true;
        }
        false
    }

    fn identifier(&mut self, allow_colon_and_dots: bool) -> Option<String> {
        let start = self.position;
        while let Some(ch) = self.peek() {
            let first = self.position == start;
            let valid = ch.is_ascii_alphabetic()
                || ch == '_'
                || (!first && ch.is_ascii_digit())
                || (ch == '.' && !first)
                || (allow_colon_and_dots
                    && (ch == ':' || ch == '.' || ch == '-' || ch.is_ascii_digit()));
            if !valid {
                break;
            }
            self.position += ch.len_utf8();
        }
        (self.position > start).then(|| self.input[start..self.position].to_string())
    }

    fn quoted(&mut self) -> Result<String, SelectorError> {
        let Some(quote) = self.peek().filter(|ch| matches!(ch, '"' | '\'' | '`')) else {
            return self.error("expected a quoted label value");
        };
        let start = self.position;
        self.position += 1;
        let mut out = String::new();
        loop {
            let Some(ch) = self.peek() else {
                self.position = start;
                return self.error("unterminated quoted string");
            };
            self.position += ch.len_utf8();
            if ch == quote {
                return Ok(out);
            }
            if ch != '\\' || quote == '`' {
                out.push(ch);
                continue;
            }
            let Some(escaped) = self.peek() else {
                return self.error("unterminated escape sequence");
            };
            self.position += escaped.len_utf8();
            match escaped {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '\\' | '"' | '\'' => out.push(escaped),
                'u' => {
                    let digits = self
                        .input
                        .get(self.position..self.position + 4)
                        .unwrap_or("");
                    let Some(decoded) = u32::from_str_radix(digits, 16)
                        .ok()
                        .and_then(char::from_u32)
                    else {
                        return self.error("invalid \\u escape");
                    };
                    out.push(decoded);
                    self.position += 4;
                }
                other => {
                    // Keep unknown escapes verbatim so regexes like `\d` survive.
                    out.push('\\');
                    out.push(other);
                }
            }
        }
    }

    fn matcher(&mut self) -> Result<Matcher, SelectorError> {
        let name_position = self.position;
        let Some(name) = self.identifier(false) else {
            return self.error("expected a label name");
        };
        self.skip_whitespace();
        let op = if self.eat("=~") {
            MatchOp::Regex
        } else if self.eat("!~") {
            MatchOp::NotRegex
        } else if self.eat("!=") {
            MatchOp::NotEqual
        } else if self.eat("=") {
            MatchOp::Equal
        } else {
            return self.error(format!(
                "expected one of =, !=, =~, !~ after label {name:?}"
            ));
        };
        self.skip_whitespace();
        let value_position = self.position;
        let value = self.quoted()?;
        Matcher::new(&name, op, &value).map_err(|mut err| {
            err.position = if matches!(op, MatchOp::Regex | MatchOp::NotRegex) {
                value_position
            } else {
                name_position
            };
            err
        })
    }
}

/// Parses `name{matchers}`, `{matchers}` or a bare `name`.
pub fn parse(input: &str) -> Result<Selector, SelectorError> {
    let mut parser = Parser { input, position: 0 };
    parser.skip_whitespace();
    let name = parser.identifier(true);
    parser.skip_whitespace();
    let mut matchers = Vec::new();
    if parser.eat("{") {
        loop {
            parser.skip_whitespace();
            if parser.eat("}") {
                break;
            }
            matchers.push(parser.matcher()?);
            parser.skip_whitespace();
            if parser.eat(",") {
                continue;
            }
            if parser.eat("}") {
                break;
            }
            return parser.error("expected ',' or '}'");
        }
    } else if name.is_none() {
        return parser.error("expected a selector such as {service_name=\"app\"}");
    }
    parser.skip_whitespace();
    if parser.position != input.len() {
        return parser.error("unexpected text after the selector");
    }
    Ok(Selector { name, matchers })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels() -> Labels {
        Labels::from_pairs([("service_name", "api"), ("region", "eu-west")])
    }

    #[test]
    fn selectors_print_as_they_parse() {
        for text in [
            r#"{service_name="api", region!="eu", path=~"/a\\d+", q!~"x\"y"}"#,
            r#"cpu{a="line\nbreak", b="back\\slash"}"#,
            "{}",
        ] {
            let parsed = parse(text).unwrap();
            let printed = parsed.to_string();
            assert_eq!(
                parse(&printed).unwrap(),
                parsed,
                "{text} printed as {printed}"
            );
        }
        let parsed = parse(r#"{a=~"\d"}"#).unwrap();
        assert_eq!(parsed.to_string(), r#"{a=~"\\d"}"#);
        assert!(parsed.matches(&Labels::from_pairs([("a", "7")])));
    }

    #[test]
    fn all_operators() {
        let selector = parse(r#"process_cpu:cpu:nanoseconds:cpu:nanoseconds{service_name="api", region=~"eu-.*", env!="prod", zone!~"b"}"#).unwrap();
        assert_eq!(
            selector.name.as_deref(),
            Some("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
        );
        assert_eq!(selector.matchers.len(), 4);
        assert!(selector.matches(&labels()));
        assert_eq!(selector.equality("service_name"), Some("api"));
    }

    #[test]
    fn regexes_are_anchored() {
        let selector = parse(r#"{region=~"eu"}"#).unwrap();
        assert!(!selector.matches(&labels()));
        let selector = parse(r#"{missing=~""}"#).unwrap();
        assert!(
            selector.matches(&labels()),
            "an absent label matches the empty string"
        );
        let selector = parse(r#"{region!~"eu-.*"}"#).unwrap();
        assert!(!selector.matches(&labels()));
    }

    #[test]
    fn errors_point_at_the_problem() {
        let err = parse(r#"{service_name="api", region~"x"}"#).unwrap_err();
        assert_eq!(err.position, 27);
        let err = parse(r#"{a="unterminated}"#).unwrap_err();
        assert_eq!(err.position, 3);
        let err = parse(r#"{a=~"("}"#).unwrap_err();
        assert_eq!(err.position, 4);
        assert!(parse("{a=\"b\"} trailing").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn app_name_form_and_escapes() {
        let selector = parse(r#"my.app.cpu{k="a\"b"}"#).unwrap();
        assert_eq!(selector.name.as_deref(), Some("my.app.cpu"));
        assert_eq!(selector.matchers[0].value, "a\"b");
        assert!(parse("{}").unwrap().matchers.is_empty());
    }
}

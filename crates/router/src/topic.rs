//! Topic names: Kafka's rules, the topic pattern, and the guard that keeps rows inside
//! the topics an operator allowed (`topics.allow`).

use regex::{Captures, Regex};

use crate::config::RouterConfig;
use crate::error::RouteError;

/// The `topics.allow` entry that allows every topic (Kafka's internal `__` topics still
/// excepted).
pub const TOPICS_ALLOW_ANY: &str = "*";
/// A `topics.allow` entry starting with this is a regular expression the whole topic
/// name must match (`re:^orders\..*$`); any other entry is a literal prefix.
pub const TOPICS_ALLOW_REGEX: &str = "re:";
/// Topic names starting with this are Kafka's own (`__consumer_offsets`,
/// `__transaction_state`): never a destination for a row.
pub const INTERNAL_TOPIC_PREFIX: &str = "__";

/// Why a topic name may not receive records. Its text never contains the topic name, which
/// may have been built from a column value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TopicRejection {
    /// Kafka would refuse the name.
    #[error("it is not a valid Kafka topic name: {0}")]
    Invalid(&'static str),
    /// A `__` name: Kafka's internal topics.
    #[error("names starting with '__' belong to Kafka's internal topics (such as __consumer_offsets) and are always refused")]
    Internal,
    /// No `topics.allow` entry matches.
    #[error("it matches no entry of topics.allow")]
    NotAllowed,
}

impl TopicRejection {
    /// `invalid_topic` or `topic_not_allowed` (the [`RouteError::class`] of the same refusal).
    pub fn class(&self) -> &'static str {
        match self {
            TopicRejection::Invalid(_) => "invalid_topic",
            TopicRejection::Internal | TopicRejection::NotAllowed => "topic_not_allowed",
        }
    }
}

/// Kafka's rules for topic names: 1..=249 characters of `[a-zA-Z0-9._-]`, not `.`/`..`.
pub fn validate_topic(topic: &str) -> Result<(), TopicRejection> {
    let invalid = |reason| Err(TopicRejection::Invalid(reason));
    if topic.is_empty() {
        return invalid("it is empty");
    }
    if topic.len() > 249 {
        return invalid("it is longer than 249 characters");
    }
    if topic == "." || topic == ".." {
        return invalid("'.' and '..' are reserved");
    }
    if !topic.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return invalid("only ASCII letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Allow {
    Any,
    Prefix(String),
    Pattern(Regex),
}

/// The topics records may go to (`topics.allow`): literal prefixes, `re:` regular
/// expressions (whole-name match), or `*`. Whatever the entries, a topic must be a valid
/// Kafka name and must not start with `__`.
///
/// The default, when `topics.allow` is not set, is the literal text of
/// `route.topic.replacement` before its first group reference (`outbox.event.` for
/// `outbox.event.${routedByValue}`); a pattern that starts with a reference has no
/// default and needs `topics.allow`.
#[derive(Debug, Clone)]
pub struct TopicGuard {
    allow: Vec<Allow>,
}

impl TopicGuard {
    /// A guard from `topics.allow` entries.
    pub fn new<S: AsRef<str>>(entries: &[S]) -> Result<TopicGuard, RouteError> {
        let bad = |reason: String| RouteError::InvalidOption { key: "topics.allow", reason };
        if entries.is_empty() {
            return Err(bad(format!(
                "the list is empty, so no record could be published: list topic prefixes, re:<regex> entries, or \"{TOPICS_ALLOW_ANY}\""
            )));
        }
        let mut allow = Vec::with_capacity(entries.len());
        for entry in entries {
            let entry = entry.as_ref().trim();
            allow.push(if entry == TOPICS_ALLOW_ANY {
                Allow::Any
            } else if let Some(re) = entry.strip_prefix(TOPICS_ALLOW_REGEX) {
                Allow::Pattern(
                    Regex::new(&format!("^(?:{re})$"))
                        .map_err(|_| bad(format!("'{entry}' is not a valid regular expression")))?,
                )
            } else if entry.is_empty() {
                return Err(bad(format!("an entry is empty (to allow every topic, write \"{TOPICS_ALLOW_ANY}\")")));
            } else if entry.starts_with(INTERNAL_TOPIC_PREFIX) {
                return Err(bad(format!("'{entry}' starts with '__': Kafka's internal topics are always refused")));
            } else if validate_topic(entry).is_err() {
                return Err(bad(format!(
                    "'{entry}' is not a topic prefix (only ASCII letters, digits, '.', '_' and '-'; a regular expression is written re:<regex>)"
                )));
            } else {
                Allow::Prefix(entry.to_owned())
            });
        }
        Ok(TopicGuard { allow })
    }

    /// The guard a router configuration describes: `topics.allow`, or its default.
    pub fn from_config(config: &RouterConfig) -> Result<TopicGuard, RouteError> {
        match &config.topics_allow {
            Some(entries) => TopicGuard::new(entries),
            None => {
                let prefix = literal_prefix(&config.topic_pattern);
                if prefix.is_empty() {
                    return Err(RouteError::InvalidOption {
                        key: "topics.allow",
                        reason: "route.topic.replacement starts with a group reference, so there is no literal topic prefix to allow by default: set topics.allow to the topic prefixes (or re:<regex> entries) rows may be routed to, or \"*\"".into(),
                    });
                }
                TopicGuard::new(&[prefix])
            }
        }
    }

    /// Whether records may go to `topic`. Also for topics the binary names itself (the
    /// dead-letter topic).
    pub fn check(&self, topic: &str) -> Result<(), TopicRejection> {
        validate_topic(topic)?;
        if topic.starts_with(INTERNAL_TOPIC_PREFIX) {
            return Err(TopicRejection::Internal);
        }
        let allowed = self.allow.iter().any(|a| match a {
            Allow::Any => true,
            Allow::Prefix(p) => topic.starts_with(p.as_str()),
            Allow::Pattern(re) => re.is_match(topic),
        });
        if allowed {
            Ok(())
        } else {
            Err(TopicRejection::NotAllowed)
        }
    }

    /// True when an entry is `*` (`walpost check` warns about it).
    pub fn allows_any(&self) -> bool {
        self.allow.iter().any(|a| matches!(a, Allow::Any))
    }
}

/// The literal text of a topic pattern before its first group reference.
fn literal_prefix(pattern: &str) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '$' => break,
            '\\' => match chars.next() {
                Some(escaped) => out.push(escaped),
                None => break,
            },
            c => out.push(c),
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Index(usize),
    Name(String),
}

/// `route.topic.replacement` in the syntax of Java's `Matcher.appendReplacement`, which
/// Debezium's RegexRouter uses: `$n` (as many digits as still name a group of the
/// regex), `${name}`, and `\c` for a literal `c`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicPattern {
    segments: Vec<Segment>,
}

impl TopicPattern {
    pub(crate) fn parse(replacement: &str, regex: &Regex) -> Result<TopicPattern, String> {
        let groups = regex.captures_len().saturating_sub(1);
        let mut segments = Vec::new();
        let mut literal = String::new();
        let mut chars = replacement.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' => literal.push(chars.next().ok_or("it ends with a lone '\\' (write \\\\ for a backslash)")?),
                '$' => {
                    let reference = match chars.next() {
                        Some('{') => {
                            let mut name = String::new();
                            loop {
                                match chars.next() {
                                    Some('}') => break,
                                    Some(ch) if ch.is_ascii_alphanumeric() => name.push(ch),
                                    _ => {
                                        return Err(format!(
                                            "'${{{name}' is not a group reference such as ${{routedByValue}}"
                                        ))
                                    }
                                }
                            }
                            if !name.starts_with(|ch: char| ch.is_ascii_alphabetic()) {
                                return Err(format!("'${{{name}}}': a group name starts with a letter"));
                            }
                            if !regex.capture_names().any(|n| n == Some(name.as_str())) {
                                return Err(format!("route.topic.regex has no group named '{name}'"));
                            }
                            Segment::Name(name)
                        }
                        Some(d) if d.is_ascii_digit() => {
                            let mut index = d.to_digit(10).map_or(0, |v| v as usize);
                            if index > groups {
                                return Err(format!("route.topic.regex has no group {index}"));
                            }
                            // Java reads further digits while the number still names a group.
                            while let Some(next) = chars.peek().and_then(|ch| ch.to_digit(10)) {
                                let longer = index.saturating_mul(10).saturating_add(next as usize);
                                if longer > groups {
                                    break;
                                }
                                index = longer;
                                chars.next();
                            }
                            Segment::Index(index)
                        }
                        _ => {
                            return Err(
                                "a '$' must start a group reference ($1, ${name}); write \\$ for a dollar sign".into()
                            )
                        }
                    };
                    if !literal.is_empty() {
                        segments.push(Segment::Literal(std::mem::take(&mut literal)));
                    }
                    segments.push(reference);
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            segments.push(Segment::Literal(literal));
        }
        Ok(TopicPattern { segments })
    }

    /// The topic for one match; a group that did not take part adds nothing (as in Java).
    pub(crate) fn expand(&self, caps: &Captures<'_>) -> String {
        let mut out = String::new();
        for s in &self.segments {
            match s {
                Segment::Literal(l) => out.push_str(l),
                Segment::Index(i) => out.push_str(caps.get(*i).map_or("", |m| m.as_str())),
                Segment::Name(n) => out.push_str(caps.name(n).map_or("", |m| m.as_str())),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(entries: &[&str]) -> TopicGuard {
        TopicGuard::new(entries).unwrap()
    }

    #[test]
    fn default_guard_is_the_literal_prefix_of_the_pattern() {
        let g = TopicGuard::from_config(&RouterConfig::default()).unwrap();
        assert_eq!(g.check("outbox.event.order"), Ok(()));
        assert_eq!(g.check("outbox.events"), Err(TopicRejection::NotAllowed));
        assert_eq!(g.check("billing.order"), Err(TopicRejection::NotAllowed));
        assert_eq!(g.check("__consumer_offsets"), Err(TopicRejection::Internal));
        assert!(matches!(g.check("outbox.event.a b"), Err(TopicRejection::Invalid(_))));
        assert!(!g.allows_any());
        // `\$` is a literal dollar sign: part of the prefix, which no topic can have.
        let escaped = RouterConfig { topic_pattern: "a\\$b.${routedByValue}".into(), ..RouterConfig::default() };
        assert_eq!(TopicGuard::from_config(&escaped).unwrap_err().class(), "invalid_option");
        let dotted = RouterConfig { topic_pattern: "a\\.b.${routedByValue}".into(), ..RouterConfig::default() };
        assert_eq!(TopicGuard::from_config(&dotted).unwrap().check("a.b.x"), Ok(()));
        let fixed = RouterConfig { topic_pattern: "all-events".into(), ..RouterConfig::default() };
        let g = TopicGuard::from_config(&fixed).unwrap();
        assert_eq!(g.check("all-events"), Ok(()));
        assert_eq!(g.check("other"), Err(TopicRejection::NotAllowed));
    }

    #[test]
    fn a_pattern_starting_with_a_reference_needs_topics_allow() {
        let c = RouterConfig { topic_pattern: "${routedByValue}.events".into(), ..RouterConfig::default() };
        let err = TopicGuard::from_config(&c).unwrap_err();
        assert_eq!(err.class(), "invalid_option");
        assert!(err.to_string().starts_with("topics.allow: "), "{err}");
        let c = RouterConfig { topics_allow: Some(vec!["orders.".into()]), ..c };
        assert_eq!(TopicGuard::from_config(&c).unwrap().check("orders.events"), Ok(()));
    }

    #[test]
    fn entries_prefix_regex_and_any() {
        let g = guard(&["orders.", r"re:^billing\.(eu|us)\.[a-z]+$", "  audit  "]);
        for ok in ["orders.placed", "orders.", "billing.eu.paid", "audit", "audit.x"] {
            assert_eq!(g.check(ok), Ok(()), "{ok}");
        }
        for refused in ["order", "billing.asia.paid", "billing.eu.Paid", "xorders.placed", "billing.eu.paid.x"] {
            assert_eq!(g.check(refused), Err(TopicRejection::NotAllowed), "{refused}");
        }
        // A regex is matched against the whole name even without anchors.
        assert_eq!(guard(&["re:billing"]).check("billing.x"), Err(TopicRejection::NotAllowed));
        let any = guard(&["*"]);
        assert!(any.allows_any());
        assert_eq!(any.check("anything.at-all"), Ok(()));
        for internal in ["__consumer_offsets", "__transaction_state", "__x"] {
            assert_eq!(any.check(internal), Err(TopicRejection::Internal), "{internal}");
            assert_eq!(guard(&["re:.*"]).check(internal), Err(TopicRejection::Internal), "{internal}");
        }
        assert!(matches!(any.check(""), Err(TopicRejection::Invalid(_))));
        assert!(matches!(any.check(&"x".repeat(250)), Err(TopicRejection::Invalid(_))));
    }

    #[test]
    fn bad_entries_are_refused_naming_the_option() {
        let empty: &[&str] = &[];
        for entries in [empty, &[""], &["re:("], &["__internal"], &["a b"], &["orders", " "]] {
            let err = TopicGuard::new(entries).unwrap_err();
            assert_eq!(err.class(), "invalid_option", "{entries:?}");
            assert!(err.to_string().starts_with("topics.allow: "), "{entries:?}: {err}");
        }
    }

    #[test]
    fn rejections_never_contain_the_topic() {
        let topic = "canary-secret.example.com";
        let err = guard(&["orders."]).check(topic).unwrap_err();
        assert!(!err.to_string().contains("canary"), "{err}");
        assert_eq!(err.class(), "topic_not_allowed");
        let err = validate_topic("canary-secret@example.com").unwrap_err();
        assert!(!err.to_string().contains("canary"), "{err}");
        assert_eq!(err.class(), "invalid_topic");
    }
}

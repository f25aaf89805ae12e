//! `walpost inbox`'s settings (the `inbox` crate's [`InboxSettings`]) resolved from
//! `[inbox]`, with the flags and `WALPOST_INBOX_*` variables layered over it by
//! [`super::Overrides`], the connections and the metrics address.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use inbox::settings::{
    BatchLimits, Dedup, HeaderNames, InboxRetention, InboxSettings, OnInvalid, StartFrom, Subscription,
};

use super::admin::AdminSettings;
use super::resolve::{resolve_inbox_postgres, resolve_kafka_properties, resolve_metrics_addr};
use super::{ConfigError, FileConfig, InboxDedup, InboxFile, InboxOnInvalid, InboxStartFrom, Overrides};

/// `walpost inbox`'s settings: `overrides` over `file` over defaults.
pub fn resolve(overrides: &Overrides, file: FileConfig) -> Result<InboxSettings, ConfigError> {
    resolve_with_admin(overrides, file).map(|(settings, _)| settings)
}

/// `walpost inbox`'s settings and its admin listener: `[admin]` with the same flags,
/// variables and refusals as `walpost run`'s.
pub fn resolve_with_admin(
    overrides: &Overrides,
    mut file: FileConfig,
) -> Result<(InboxSettings, Option<AdminSettings>), ConfigError> {
    overrides.layer_onto(&mut file);
    let admin = std::mem::take(&mut file.admin);
    let settings = resolve_layered(overrides, file)?;
    Ok((settings, super::admin::resolve(&admin)?))
}

fn resolve_layered(overrides: &Overrides, mut file: FileConfig) -> Result<InboxSettings, ConfigError> {
    let postgres = resolve_inbox_postgres(overrides, &mut file)?;
    let brokers = file.kafka.brokers.take().ok_or(ConfigError::Missing {
        key: "kafka.brokers",
        flag: "kafka-brokers",
        env: "KAFKA_BROKERS",
    })?;
    let properties = resolve_kafka_properties(overrides, &file.kafka)?;
    let metrics_addr = resolve_metrics_addr(file.metrics_addr.take())?;
    resolve_section(file.inbox, postgres, brokers, properties, metrics_addr)
}

fn resolve_section(
    f: InboxFile,
    postgres: replication::Config,
    brokers: String,
    properties: BTreeMap<String, String>,
    metrics_addr: Option<SocketAddr>,
) -> Result<InboxSettings, ConfigError> {
    let topics: Vec<String> = f.topics.iter().map(|t| t.trim().to_owned()).filter(|t| !t.is_empty()).collect();
    let subscription = match (topics.is_empty(), f.topic_regex.filter(|r| !r.is_empty())) {
        (false, None) => {
            for t in &topics {
                router::validate_topic(t).map_err(|_| ConfigError::Invalid {
                    key: "inbox.topics",
                    value: t.clone(),
                    expected: "Kafka topic names (letters, digits, . _ -; at most 249 characters)",
                })?;
            }
            Subscription::Topics(topics)
        }
        // librdkafka compiles it (its own regex dialect) and refuses a bad one at subscribe.
        (true, Some(r)) => Subscription::Regex(r),
        (true, None) => {
            return Err(ConfigError::Missing { key: "inbox.topics", flag: "topics", env: "INBOX_TOPICS" });
        }
        (false, Some(r)) => {
            return Err(ConfigError::Invalid {
                key: "inbox.topic_regex",
                value: r,
                expected: "either inbox.topics or inbox.topic_regex, not both",
            })
        }
    };
    let group = f.group.ok_or(ConfigError::Missing { key: "inbox.group", flag: "group", env: "INBOX_GROUP" })?;
    if group.is_empty() || group.len() > 255 || group.chars().any(char::is_control) {
        return Err(ConfigError::Invalid {
            key: "inbox.group",
            value: group,
            expected: "a consumer group id of 1 to 255 printable characters",
        });
    }
    let schema = f.schema.unwrap_or_else(|| "inbox".into());
    super::validate_identifier(&schema).map_err(|expected| ConfigError::Invalid {
        key: "inbox.schema",
        value: schema.clone(),
        expected,
    })?;
    let mut headers = HeaderNames::default();
    let header = |key: &'static str, v: String| {
        if v.is_empty() {
            Err(ConfigError::Invalid { key, value: v, expected: "a header name" })
        } else {
            Ok(v)
        }
    };
    if let Some(h) = f.event_id_header {
        headers.event_id = header_list("inbox.event_id_header", &h)?;
    }
    if let Some(h) = f.event_type_header {
        headers.event_type = vec![header("inbox.event_type_header", h)?];
    }
    headers.aggregate_id = f.aggregate_id_header.map(|h| header("inbox.aggregate_id_header", h)).transpose()?;
    let on_invalid = match f.on_invalid {
        None | Some(InboxOnInvalid::Halt) => OnInvalid::Halt,
        Some(InboxOnInvalid::Reject) => OnInvalid::Reject,
    };
    let dedup = match f.dedup {
        None | Some(InboxDedup::Topic) => Dedup::Topic,
        Some(InboxDedup::Global) => Dedup::Global,
    };
    let start_from = match f.start_from {
        None | Some(InboxStartFrom::Earliest) => StartFrom::Earliest,
        Some(InboxStartFrom::Latest) => StartFrom::Latest,
    };
    let count = |key: &'static str, v: Option<u64>, default: usize| -> Result<usize, ConfigError> {
        match v {
            None => Ok(default),
            Some(n) => usize::try_from(n).ok().filter(|n| *n > 0).ok_or(ConfigError::Invalid {
                key,
                value: n.to_string(),
                expected: "a positive number",
            }),
        }
    };
    let defaults = BatchLimits::default();
    let batch = BatchLimits {
        max_records: count("inbox.batch_max_records", f.batch_max_records, defaults.max_records)?,
        max_bytes: count("inbox.batch_max_bytes", f.batch_max_bytes, defaults.max_bytes)?,
        max_wait: f.batch_max_wait_ms.map_or(defaults.max_wait, |m| m.0),
    };
    let stats_interval = super::resolve::positive_duration(
        "inbox.stats_interval_secs",
        f.stats_interval_secs.map(|s| s.0),
        Duration::from_secs(10),
    )?;
    let retention = match f.retention {
        Some(false) => None,
        _ => {
            let d = InboxRetention::default();
            let r = InboxRetention {
                keep_days: f.retention_keep_days.unwrap_or(d.keep_days),
                max_days: f.retention_max_days.unwrap_or(d.max_days),
                days_ahead: f.retention_days_ahead.unwrap_or(d.days_ahead),
                interval: super::resolve::positive_duration(
                    "inbox.retention_interval_secs",
                    f.retention_interval_secs.map(|s| s.0),
                    d.interval,
                )?,
                lock_timeout: super::resolve::positive_duration(
                    "inbox.retention_lock_timeout_ms",
                    f.retention_lock_timeout_ms.map(|m| m.0),
                    d.lock_timeout,
                )?,
            };
            if r.max_days < r.keep_days {
                return Err(ConfigError::Invalid {
                    key: "inbox.retention_max_days",
                    value: r.max_days.to_string(),
                    expected: "at least inbox.retention_keep_days (a day is kept keep_days, and dropped after max_days even with open deliveries)",
                });
            }
            Some(r)
        }
    };
    Ok(InboxSettings {
        retention,
        postgres,
        brokers,
        properties,
        subscription,
        group,
        schema,
        create_schema: f.create_schema.unwrap_or(false),
        headers,
        on_invalid,
        dedup,
        start_from,
        max_record_bytes: count("inbox.max_record_bytes", f.max_record_bytes, 1 << 20)?,
        batch,
        stats_interval,
        metrics_addr,
    })
}

/// Header names tried in order, from a list of strings or one string of names separated
/// by commas (what the flag and the variable give, and what the key took before it took
/// lists).
fn header_list(key: &'static str, v: &toml::Value) -> Result<Vec<String>, ConfigError> {
    let names: Option<Vec<String>> = match v {
        toml::Value::String(s) => Some(s.split(',').map(|n| n.trim().to_owned()).collect()),
        toml::Value::Array(a) => a.iter().map(|n| n.as_str().map(|n| n.trim().to_owned())).collect(),
        _ => None,
    };
    match names {
        Some(names) if !names.is_empty() && names.iter().all(|n| !n.is_empty()) => Ok(names),
        _ => Err(ConfigError::Invalid {
            key,
            value: v.to_string(),
            expected: "header names tried in order, as a list or one string separated by commas (they replace the defaults: list id and ce_id too to keep them, e.g. [\"id\", \"ce_id\", \"event-id\"])",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(toml: &str, o: Overrides) -> Result<InboxSettings, ConfigError> {
        let file = FileConfig::parse(toml).unwrap();
        super::resolve(&o, file)
    }

    const BASE: &str = "postgres = \"postgres://u@h/db\"\n[kafka]\nbrokers = \"k:9092\"\n";

    #[test]
    fn the_file_section_with_flags_over_it() {
        let s = resolve(
            &format!("{BASE}[inbox]\ntopics = [\"a\", \"b\"]\ngroup = \"g\"\nbatch_max_wait_ms = \"5ms\"\non_invalid = \"reject\"\n"),
            Overrides { inbox_group: Some("g2".into()), inbox_schema: Some("inbox_b".into()), ..Overrides::default() },
        )
        .unwrap();
        assert_eq!(s.subscription, Subscription::Topics(vec!["a".into(), "b".into()]));
        assert_eq!((s.group.as_str(), s.schema.as_str()), ("g2", "inbox_b"));
        assert_eq!(s.batch.max_wait, Duration::from_millis(5));
        assert_eq!(s.on_invalid, OnInvalid::Reject);
        assert_eq!(s.headers, HeaderNames::default());
        assert_eq!(s.start_from, StartFrom::Earliest);
    }

    #[test]
    fn dedup_is_per_topic_unless_set_global() {
        let base =
            |line: &str, o: Overrides| resolve(&format!("{BASE}[inbox]\ntopics = [\"a\"]\ngroup = \"g\"\n{line}\n"), o);
        assert_eq!(base("", Overrides::default()).unwrap().dedup, Dedup::Topic);
        assert_eq!(base("dedup = \"global\"", Overrides::default()).unwrap().dedup, Dedup::Global);
        let flag = Overrides { inbox_dedup: Some(InboxDedup::Topic), ..Overrides::default() };
        assert_eq!(base("dedup = \"global\"", flag).unwrap().dedup, Dedup::Topic, "the flag wins");
    }

    /// The replay runbook's fix: a record whose id is in another header is stored, and so
    /// are the normal records read with it (a single header replaced id and ce_id).
    #[test]
    fn event_id_headers_are_a_list_tried_in_order() {
        let with =
            |line: &str, o: Overrides| resolve(&format!("{BASE}[inbox]\ntopics = [\"a\"]\ngroup = \"g\"\n{line}\n"), o);
        let list = with("event_id_header = [\"id\", \"ce_id\", \"event-id\"]", Overrides::default()).unwrap();
        assert_eq!(list.headers.event_id, ["id", "ce_id", "event-id"]);
        let one = with("event_id_header = \"msg_id\"", Overrides::default()).unwrap();
        assert_eq!(one.headers.event_id, ["msg_id"], "one string: that header alone, as before");
        let commas = with("event_id_header = \"id, event-id\"", Overrides::default()).unwrap();
        assert_eq!(commas.headers.event_id, ["id", "event-id"]);
        let flag =
            Overrides { inbox_event_id_header: Some(vec!["event-id".into(), "id".into()]), ..Overrides::default() };
        assert_eq!(with("event_id_header = \"msg_id\"", flag).unwrap().headers.event_id, ["event-id", "id"]);
        for bad in [
            "event_id_header = []",
            "event_id_header = \"id,,ce_id\"",
            "event_id_header = 5",
            "event_id_header = [\"id\", 1]",
        ] {
            let e = with(bad, Overrides::default()).unwrap_err().to_string();
            assert!(e.contains("inbox.event_id_header") && e.contains("tried in order"), "{bad}: {e}");
        }
    }

    #[test]
    fn what_is_missing_or_wrong_is_named() {
        let e = resolve(&format!("{BASE}[inbox]\ngroup = \"g\"\n"), Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("inbox.topics is required") && e.contains("--topics"), "{e}");
        let e = resolve(&format!("{BASE}[inbox]\ntopics = [\"a\"]\n"), Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("inbox.group is required"), "{e}");
        let both = format!("{BASE}[inbox]\ntopics = [\"a\"]\ntopic_regex = \"^a\"\ngroup = \"g\"\n");
        assert!(resolve(&both, Overrides::default()).unwrap_err().to_string().contains("not both"));
        let schema = format!("{BASE}[inbox]\ntopics = [\"a\"]\ngroup = \"g\"\nschema = \"in box;\"\n");
        assert!(resolve(&schema, Overrides::default()).unwrap_err().to_string().contains("inbox.schema"));
        let zero = format!("{BASE}[inbox]\ntopics = [\"a\"]\ngroup = \"g\"\nbatch_max_records = 0\n");
        assert!(resolve(&zero, Overrides::default()).unwrap_err().to_string().contains("inbox.batch_max_records"));
        assert!(FileConfig::parse("[inbox]\ntopic = [\"a\"]\n").is_err(), "unknown keys are refused");
    }

    /// `[admin]` as `walpost run` takes it: the flags over the file, its refusals.
    #[test]
    fn the_admin_section_and_flags_as_for_run() {
        let with = |admin: &str, o: Overrides| {
            let file = FileConfig::parse(&format!("{BASE}[inbox]\ntopics = [\"a\"]\ngroup = \"g\"\n{admin}")).unwrap();
            resolve_with_admin(&o, file).map(|(_, a)| a).map_err(|e| e.to_string())
        };
        assert_eq!(with("", Overrides::default()).unwrap(), None);
        let flags = Overrides {
            admin_addr: Some("127.0.0.1:9189".into()),
            admin_tokens_file: Some("/t".into()),
            ..Overrides::default()
        };
        let a = with("[admin]\naddr = \"127.0.0.1:1\"\n", flags).unwrap().unwrap();
        assert_eq!((a.addr.to_string(), a.tokens_file.display().to_string()), ("127.0.0.1:9189".into(), "/t".into()));
        let e = with("[admin]\naddr = \"127.0.0.1:9189\"\n", Overrides::default()).unwrap_err();
        assert!(e.contains("needs [admin] tokens_file"), "{e}");
        let e = with("[admin]\naddr = \"0.0.0.0:9189\"\ntokens_file = \"/t\"\n", Overrides::default()).unwrap_err();
        assert!(e.contains("not a loopback address"), "{e}");
    }
}

//! `walpost import-debezium`: a Debezium PostgreSQL connector configuration (the JSON
//! POSTed to Kafka Connect, or a Debezium Server `application.properties`) with an
//! Outbox Event Router transform, converted to an equivalent walpost TOML.
//!
//! Equivalence includes Debezium's own defaults: an EventRouter that does not set
//! `table.field.event.key` routes by `aggregateid`, so the TOML says so explicitly.
//! Every option that cannot be carried over is listed with the reason; the conversion
//! is complete only when that list is empty.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use java_properties::{LineContent, PropertiesIter};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::settings::secrets::{kafka_secret_env_var, KAFKA_SECRET_PROPERTIES};
use crate::settings::{FileConfig, OutboxFile, RouterFile};

/// What a URL's user, database or query value may hold unencoded (RFC 3986 unreserved).
const URL_COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// What a query value (a path such as sslrootcert) may hold unencoded besides those.
const QUERY_VALUE: &AsciiSet = &URL_COMPONENT.remove(b'/').remove(b':');

fn encoded(text: &str) -> String {
    utf8_percent_encode(text, URL_COMPONENT).to_string()
}

fn encoded_value(text: &str) -> String {
    utf8_percent_encode(text, QUERY_VALUE).to_string()
}

/// Whether an option's value may be a secret: it is then named, never shown (in the
/// TOML, the notes or the list of what was not carried over).
fn secret_like(key: &str, value: &str) -> bool {
    let k = key.to_ascii_lowercase();
    const WORDS: &[&str] = &["password", "secret", "jaas", "token", "credential", "private", "keystore", "truststore"];
    WORDS.iter().any(|w| k.contains(w))
        || KAFKA_SECRET_PROPERTIES.iter().any(|p| k.ends_with(p))
        || k.ends_with("ssl.key")
        || value.to_ascii_lowercase().contains("password")
}

/// How an option's value is shown: as it is, or not at all when it may be a secret.
fn shown(key: &str, value: &str) -> String {
    if secret_like(key, value) {
        "(value not shown: it may be a secret)".to_owned()
    } else {
        value.to_owned()
    }
}

/// The result of a conversion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conversion {
    pub toml: String,
    /// (option, reason) for everything not carried over.
    pub not_carried: Vec<(String, String)>,
    /// Remarks that need no action but are worth knowing (e.g. defaults made explicit).
    pub notes: Vec<String>,
}

const EVENT_ROUTER: &str = "io.debezium.transforms.outbox.EventRouter";

/// EventRouter options walpost implements under the same name, with Debezium's default.
const ROUTER_OPTIONS: &[(&str, Option<&str>)] = &[
    ("table.field.event.id", Some("id")),
    ("table.field.event.key", Some("aggregateid")),
    ("table.field.event.payload", Some("payload")),
    ("table.field.event.timestamp", None),
    ("route.by.field", Some("aggregatetype")),
    ("route.topic.regex", None),
    ("route.topic.replacement", Some("outbox.event.${routedByValue}")),
    ("route.tombstone.on.empty.payload", None),
    ("table.fields.additional.placement", None),
    ("table.field.additional.missing", None),
    ("table.op.invalid.behavior", None),
    ("table.expand.json.payload", None),
    // Written back as walpost's name, table.field.event.tracing.
    ("tracing.span.context.field", None),
];

/// Connector options that describe Kafka Connect / Debezium internals walpost does not
/// need; they are dropped with this reason.
const NOT_NEEDED: &[(&str, &str)] = &[
    ("name", "connector name"),
    ("tasks.max", "walpost is one process per slot"),
    ("topic.prefix", "topics come from the Event Router, not from the server name"),
    ("database.server.name", "topics come from the Event Router, not from the server name"),
    ("connector.class", "walpost is the connector"),
    ("key.converter", "walpost sends the key as text"),
    ("key.converter.schemas.enable", "walpost sends the key as text"),
    ("value.converter.schemas.enable", "walpost sends the payload bytes"),
    ("tombstones.on.delete", "walpost publishes inserts only"),
    ("heartbeat.interval.ms", "use --heartbeat-interval (seconds)"),
];

fn parse_input(text: &str) -> Result<BTreeMap<String, String>, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
        let config = v.get("config").unwrap_or(&v);
        let obj = config.as_object().ok_or("the JSON has no \"config\" object")?;
        return Ok(obj
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())))
            .collect());
    }
    // Debezium Server application.properties, in Java's properties format (`key=value`,
    // `key: value` or `key value`, `\` continuations and escapes), read as UTF-8 as
    // Quarkus reads it. A line is never echoed: it may hold a secret.
    let raw: Vec<&str> = text.split("\r\n").flat_map(|l| l.split(['\r', '\n'])).collect();
    let mut out = BTreeMap::new();
    for line in PropertiesIter::new_with_encoding(text.as_bytes(), encoding_rs::UTF_8) {
        let line = line.map_err(|e| match e.line_number() {
            Some(n) => format!("line {n} has a malformed \\uXXXX escape (its text is not shown: it may hold a secret)"),
            None => format!("cannot read the properties: {e}"),
        })?;
        let number = line.line_number();
        let LineContent::KVPair(k, v) = line.consume_content() else { continue };
        // Java takes a lone word for a key with an empty value; in a connector's
        // configuration it is a line pasted wrong.
        if v.is_empty() && !raw.get(number - 1).is_some_and(|l| has_separator(l)) {
            return Err(format!("line {number} is not key=value (its text is not shown: it may hold a secret)"));
        }
        // Trailing blanks are part of a Java value; none of Debezium's options wants them.
        let v = v.trim_end().to_owned();
        let key = if let Some(rest) = k.strip_prefix("debezium.source.") {
            rest.to_owned()
        } else if let Some(rest) = k.strip_prefix("debezium.transforms") {
            format!("transforms{rest}")
        } else if let Some(rest) = k.strip_prefix("debezium.sink.kafka.producer.") {
            format!("walpost.kafka.{rest}")
        } else {
            format!("walpost.other.{k}")
        };
        out.insert(key, v);
    }
    Ok(out)
}

/// Whether a properties line (the first of a logical line) has a separator after its
/// key: an unescaped `=`, `:` or blank, or a continuation (its key goes on).
fn has_separator(line: &str) -> bool {
    let mut chars = line.trim_start_matches([' ', '\t', '\x0c']).chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.next().is_none() => return true,
            '\\' => {}
            '=' | ':' | ' ' | '\t' | '\x0c' => return true,
            _ => {}
        }
    }
    false
}

/// The value of `field="..."` in a JAAS line.
fn jaas_field(jaas: &str, field: &str) -> Option<String> {
    let at = jaas.find(&format!("{field}="))? + field.len() + 1;
    let rest = jaas.get(at..)?;
    let quoted = rest.strip_prefix('"')?;
    Some(quoted.get(..quoted.find('"')?)?.to_owned())
}

/// What `[kafka] brokers` says when the connector did not name them.
pub(crate) const BROKERS_PLACEHOLDER: &str = "CHANGE-ME:9092";

/// The router options as a `[router]` table (through TOML, so every key and value type
/// is exactly what the settings parser reads).
fn router_file(options: &[(String, String)]) -> Result<RouterFile, toml::de::Error> {
    let mut table = toml::Table::new();
    for (k, v) in options {
        let value = match k.as_str() {
            "route.tombstone.on.empty.payload" | "table.expand.json.payload" => toml::Value::Boolean(v == "true"),
            _ => toml::Value::String(v.clone()),
        };
        table.insert(k.clone(), value);
    }
    table.try_into()
}

/// Converts a connector configuration; `Err` when the input cannot be read at all.
pub(crate) fn convert(text: &str) -> Result<Conversion, String> {
    let mut cfg = parse_input(text)?;
    let mut not_carried: Vec<(String, String)> = Vec::new();
    let mut notes = Vec::new();

    if let Some(class) = cfg.remove("connector.class") {
        if class != "io.debezium.connector.postgresql.PostgresConnector" {
            return Err(format!("connector.class {class} is not Debezium's PostgreSQL connector"));
        }
    }
    let host = cfg.remove("database.hostname").unwrap_or_else(|| "localhost".into());
    let port = cfg.remove("database.port").unwrap_or_else(|| "5432".into());
    let user = cfg.remove("database.user").unwrap_or_else(|| "postgres".into());
    let db = cfg.remove("database.dbname").unwrap_or_else(|| "postgres".into());
    if cfg.remove("database.password").is_some() {
        notes.push(
            "database.password is not copied: pass it in PGPASSWORD (or add it to the URL) rather than in a file"
                .into(),
        );
    }
    if !host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']')) {
        return Err("database.hostname is not a host name or address".into());
    }
    if !port.chars().all(|c| c.is_ascii_digit()) {
        return Err("database.port is not a port number".into());
    }
    // Every part that comes from the input is percent-encoded: a dbname such as
    // `shop?sslmode=disable` stays a database name, never becomes connection options.
    let mut url = format!("postgres://{}@{host}:{port}/{}", encoded(&user), encoded(&db));
    if let Some(mode) = cfg.remove("database.sslmode") {
        let _ = write!(url, "?sslmode={}", encoded_value(&mode));
        if let Some(root) = cfg.remove("database.sslrootcert") {
            let _ = write!(url, "&sslrootcert={}", encoded_value(&root));
        }
    }
    if let Some(plugin) = cfg.remove("plugin.name") {
        if plugin != "pgoutput" {
            not_carried.push((
                "plugin.name".into(),
                format!("{plugin}: walpost decodes pgoutput only (the slot must be re-created)"),
            ));
        }
    }
    let slot = cfg.remove("slot.name").unwrap_or_else(|| {
        notes.push("slot.name not set: Debezium's default slot is \"debezium\"; kept".into());
        "debezium".into()
    });
    let publication = cfg.remove("publication.name").unwrap_or_else(|| "dbz_publication".into());
    if let Some(mode) = cfg.remove("publication.autocreate.mode") {
        if mode != "filtered" {
            notes.push(format!(
                "publication.autocreate.mode={mode}: walpost creates (if missing) a publication FOR TABLE the outbox tables WITH (publish = 'insert')"
            ));
        }
    }
    let tables: Vec<String> = cfg
        .remove("table.include.list")
        .map(|t| t.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    for t in &tables {
        if t.contains(['*', '+', '?', '[', '(', '|', '\\']) {
            not_carried.push((
                "table.include.list".into(),
                format!("'{t}' is a regular expression; list the outbox tables by name"),
            ));
        }
    }
    let snapshot = match cfg.remove("snapshot.mode").as_deref() {
        None => Some("initial"),
        Some("initial") => Some("initial"),
        Some("never") | Some("no_data") => Some("never"),
        Some("initial_only") => Some("initial_only"),
        Some("when_needed") => Some("when_needed"),
        Some(other) => {
            not_carried.push((
                "snapshot.mode".into(),
                format!("{other} has no walpost equivalent (never, initial, initial_only, when_needed)"),
            ));
            None
        }
    };
    let value_converter = cfg.remove("value.converter");
    // Debezium's signal table (source channel): the same table and format in walpost.
    let signal_table = cfg.remove("signal.data.collection").map(|t| {
        // Debezium accepts `<database>.<schema>.<table>` too; walpost's key is schema.table.
        let parts: Vec<&str> = t.split('.').collect();
        match parts.as_slice() {
            [_, schema, table] => format!("{schema}.{table}"),
            _ => t,
        }
    });
    if let Some(channels) = cfg.remove("signal.enabled.channels") {
        if !channels.split(',').any(|c| c.trim() == "source") {
            notes.push(format!(
                "signal.enabled.channels={channels}: walpost reads signals from the signal table only (the source channel)"
            ));
        }
    }

    // The EventRouter transform.
    let transforms: Vec<String> = cfg
        .remove("transforms")
        .map(|t| t.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    let mut router: Vec<(String, String)> = Vec::new();
    let mut router_found = false;
    for name in &transforms {
        let prefix = format!("transforms.{name}.");
        let ty = cfg.remove(&format!("{prefix}type")).unwrap_or_default();
        let options: Vec<(String, String)> = cfg
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .cloned()
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|k| cfg.remove(&k).map(|v| (k[prefix.len()..].to_owned(), v)))
            .collect();
        if ty != EVENT_ROUTER || router_found {
            not_carried.push((
                format!("transforms.{name}"),
                format!("transform {ty} is not supported: walpost applies the Outbox Event Router only"),
            ));
            continue;
        }
        router_found = true;
        let mut set: BTreeMap<String, String> = options.into_iter().collect();
        for (opt, default) in ROUTER_OPTIONS {
            match (set.remove(*opt), default) {
                (Some(v), _) => router.push((opt.to_string(), v)),
                (None, Some(d)) => {
                    router.push((opt.to_string(), d.to_string()));
                    if matches!(*opt, "table.field.event.key" | "route.by.field") {
                        notes.push(format!("{opt} not set: Debezium's default \"{d}\" is written out"));
                    }
                }
                (None, None) => {}
            }
        }
        // The option's spelling before Debezium 2.x.
        if let Some(v) = set.remove("table.fields.additional.error.on.missing") {
            if !router.iter().any(|(k, _)| k == "table.field.additional.missing") {
                router.push((
                    "table.field.additional.missing".into(),
                    if v == "false" { "ignore".into() } else { "error".into() },
                ));
            }
        }
        // Debezium 0.9-1.1 put this column in the value; since 1.2 it reads no such option.
        if let Some(v) = set.remove("table.field.event.type") {
            notes.push(format!(
                "table.field.event.type = {v} dropped: Debezium has ignored it since 1.2; walpost's eventType header is {} (off in this conversion, as in Debezium's output)",
                router::EVENT_TYPE_HEADER_OPTION
            ));
        }
        for (k, v) in set {
            let value = shown(&k, &v);
            not_carried.push((
                format!("transforms.{name}.{k}"),
                format!("EventRouter option '{k}' = {value} is not implemented by walpost"),
            ));
        }
    }
    if !router_found {
        not_carried.push((
            "transforms".into(),
            "no io.debezium.transforms.outbox.EventRouter transform: walpost only publishes outbox events".into(),
        ));
    }
    // Debezium 2+ puts only `id` in the headers unless placements add more.
    router.push((router::EVENT_TYPE_HEADER_OPTION.into(), String::new()));
    let expand = router.iter().any(|(k, v)| k == "table.expand.json.payload" && v == "true");
    if value_converter.as_deref().is_some_and(|c| c.contains("JsonConverter")) && !expand {
        notes.push(
            "value.converter is JsonConverter without table.expand.json.payload: Debezium sent the payload as a JSON *string*; walpost sends the JSON document itself (consumers that unwrap the string must change)".into(),
        );
    }

    let mut kafka_props: Vec<(String, String)> = Vec::new();
    let mut brokers = None;
    for (k, v) in std::mem::take(&mut cfg) {
        if let Some(p) = k.strip_prefix("producer.override.").or_else(|| k.strip_prefix("walpost.kafka.")) {
            if p == "bootstrap.servers" {
                brokers = Some(v);
            } else if p == "sasl.jaas.config" {
                // Java's login module line; librdkafka takes the user name as a property
                // and the password from walpost's environment, never from this file.
                match jaas_field(&v, "username") {
                    Some(user) => kafka_props.push(("sasl.username".into(), user)),
                    None => not_carried.push((
                        k.clone(),
                        "a JAAS line without username=\"...\" (value not shown: it holds a secret)".into(),
                    )),
                }
                notes.push(format!(
                    "{k}: its password is not copied: give it to walpost in {} (or [kafka] properties_file, owner-only)",
                    kafka_secret_env_var("sasl.password")
                ));
            } else if secret_like(p, &v) {
                notes.push(format!(
                    "{k} is not copied (a secret): give it to walpost in {} (or [kafka] properties_file, owner-only)",
                    kafka_secret_env_var(p)
                ));
            } else {
                kafka_props.push((p.to_owned(), v));
            }
        } else if let Some(reason) = NOT_NEEDED.iter().find(|(n, _)| *n == k).map(|(_, r)| *r) {
            notes.push(format!("{k} dropped: {reason}"));
        } else if let Some(setting) = k.strip_prefix("walpost.other.") {
            notes.push(format!("{setting} dropped: Debezium Server setting"));
        } else {
            let value = shown(&k, &v);
            not_carried.push((k, format!("{value}: no walpost equivalent")));
        }
    }

    let mut file = FileConfig {
        postgres: Some(url),
        slot: Some(slot),
        publication: Some(publication),
        table: tables.first().cloned(),
        snapshot: snapshot.and_then(|m| serde_json::from_value(serde_json::Value::String(m.into())).ok()),
        signal_table,
        ..FileConfig::default()
    };
    file.kafka.brokers = brokers.clone().or_else(|| Some(BROKERS_PLACEHOLDER.into()));
    if brokers.is_none() {
        notes.push(
            "Kafka brokers are set on the Kafka Connect worker, not the connector: fill in [kafka] brokers".into(),
        );
    }
    file.kafka.properties = kafka_props.into_iter().collect();
    file.router = router_file(&router).map_err(|e| format!("cannot write the router options: {e}"))?;
    file.outbox =
        tables.iter().skip(1).map(|t| OutboxFile { table: t.clone(), router: RouterFile::default() }).collect();
    let body = toml::to_string(&file).map_err(|e| format!("cannot write TOML: {e}"))?;
    let t = format!("# walpost configuration converted from a Debezium PostgreSQL connector.\n{body}");
    Ok(Conversion { toml: t, not_carried, notes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{FileConfig, Overrides, Settings, SnapshotMode};

    /// The connector of seed 003, section 11.2.2 (Korean original), as users POST it.
    const SEED_003: &str = r#"{
        "name": "shop-outbox",
        "config": {
          "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
          "database.hostname": "postgres",
          "database.port": "5432",
          "database.user": "postgres",
          "database.password": "postgres",
          "database.dbname": "shop",
          "topic.prefix": "shop",
          "table.include.list": "public.outbox",
          "plugin.name": "pgoutput",
          "snapshot.mode": "initial",
          "transforms": "outbox",
          "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
          "transforms.outbox.route.by.field": "aggregate_type",
          "transforms.outbox.route.topic.replacement": "domain.${routedByValue}.events"
        }
      }"#;

    fn parse(toml_text: &str) -> FileConfig {
        FileConfig::parse(toml_text).unwrap_or_else(|e| panic!("{e}\n{toml_text}"))
    }

    #[test]
    fn seed_003_connector_converts_completely() {
        let c = convert(SEED_003).unwrap();
        assert!(c.not_carried.is_empty(), "{:?}", c.not_carried);
        let f = parse(&c.toml);
        assert_eq!(f.postgres.as_deref(), Some("postgres://postgres@postgres:5432/shop"));
        assert!(!c.toml.contains("postgres:postgres@"), "password copied:\n{}", c.toml);
        assert_eq!(f.table.as_deref(), Some("public.outbox"));
        assert_eq!(f.router.route_by_field.as_deref(), Some("aggregate_type"));
        assert_eq!(f.router.topic_replacement.as_deref(), Some("domain.${routedByValue}.events"));
        // Debezium's defaults, not walpost's, for what the connector left unset.
        assert_eq!(f.router.key_field.as_deref(), Some("aggregateid"));
        assert_eq!(f.router.id_field.as_deref(), Some("id"));
        assert!(c.notes.iter().any(|n| n.contains("aggregateid")), "{:?}", c.notes);
        assert!(c.notes.iter().any(|n| n.contains("PGPASSWORD")));
    }

    #[test]
    fn full_event_router_with_placements_and_producer_overrides() {
        let json = r#"{"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "database.hostname": "db.internal", "database.port": "6432", "database.user": "cdc", "database.dbname": "orders",
            "database.sslmode": "verify-full", "database.sslrootcert": "/etc/ssl/ca.pem",
            "slot.name": "orders_outbox", "publication.name": "orders_pub", "plugin.name": "pgoutput",
            "table.include.list": "billing.outbox,licensing.outbox", "snapshot.mode": "no_data",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            "transforms.outbox.table.field.event.key": "aggregate_id",
            "transforms.outbox.table.field.event.timestamp": "occurred_at",
            "transforms.outbox.table.fields.additional.placement": "event_type:header:eventType,tenant:envelope",
            "transforms.outbox.table.fields.additional.error.on.missing": "false",
            "transforms.outbox.route.tombstone.on.empty.payload": "true",
            "transforms.outbox.table.expand.json.payload": "true",
            "transforms.outbox.tracing.span.context.field": "tracingspancontext",
            "producer.override.compression.type": "zstd", "producer.override.linger.ms": "20",
            "signal.data.collection": "orders.billing.debezium_signal"}"#;
        let c = convert(json).unwrap();
        assert!(c.not_carried.is_empty(), "{:?}", c.not_carried);
        let f = parse(&c.toml);
        assert_eq!(f.signal_table.as_deref(), Some("billing.debezium_signal"));
        assert_eq!(
            f.postgres.as_deref(),
            Some("postgres://cdc@db.internal:6432/orders?sslmode=verify-full&sslrootcert=/etc/ssl/ca.pem")
        );
        assert_eq!(f.slot.as_deref(), Some("orders_outbox"));
        assert_eq!(f.snapshot, Some(SnapshotMode::Never));
        assert_eq!(f.outbox.len(), 1);
        assert_eq!(f.outbox[0].table, "licensing.outbox");
        assert_eq!(f.router.timestamp_field.as_deref(), Some("occurred_at"));
        assert_eq!(f.router.tracing_field.as_deref(), Some("tracingspancontext"));
        assert!(c.toml.contains("\"table.field.event.tracing\" = \"tracingspancontext\""), "{}", c.toml);
        assert_eq!(f.router.additional_missing.as_deref(), Some("ignore"));
        assert_eq!(f.router.tombstone_on_empty_payload, Some(true));
        assert_eq!(f.kafka.properties["compression.type"], "zstd");
        // The TOML resolves into working settings.
        let s = Settings::resolve(&Overrides::default(), f).unwrap();
        assert_eq!(s.source.outboxes.len(), 2);
        assert_eq!(s.source.router().additional.len(), 2);
    }

    #[test]
    fn debezium_server_properties_and_what_cannot_be_carried() {
        let props = "
            # Debezium Server
            debezium.sink.type=kafka
            debezium.sink.kafka.producer.bootstrap.servers=kafka:9092
            debezium.sink.kafka.producer.acks=all
            debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector
            debezium.source.database.hostname=pg
            debezium.source.database.user=app
            debezium.source.database.dbname=app
            debezium.source.plugin.name=decoderbufs
            debezium.source.table.include.list=public.outbox_.*
            debezium.source.snapshot.mode=always
            debezium.transforms=unwrap,outbox
            debezium.transforms.unwrap.type=io.debezium.transforms.ExtractNewRecordState
            debezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
            debezium.transforms.outbox.table.json.payload.null.behavior=optional_bytes
        ";
        let c = convert(props).unwrap();
        let keys: Vec<&str> = c.not_carried.iter().map(|(k, _)| k.as_str()).collect();
        for expected in [
            "plugin.name",
            "table.include.list",
            "snapshot.mode",
            "transforms.unwrap",
            "transforms.outbox.table.json.payload.null.behavior",
        ] {
            assert!(keys.contains(&expected), "{expected} missing from {keys:?}");
        }
        let f = parse(&c.toml);
        assert_eq!(f.kafka.brokers.as_deref(), Some("kafka:9092"));
        assert_eq!(f.kafka.properties["acks"], "all");
    }

    /// Regression: a value continued on the next line with `\` was cut at the backslash
    /// (and the continuation read as a key of its own); escapes were kept as written.
    #[test]
    fn regression_properties_continuations_and_escapes_are_read_as_java_reads_them() {
        let props = "debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
            debezium.source.database.hostname=pg\n\
            debezium.source.database.user=app\n\
            debezium.source.database.dbname=caf\\u00e9\n\
            debezium.sink.kafka.producer.bootstrap.servers=kafka-1:9092,\\\n\
            \x20   kafka-2:9092\n\
            debezium.sink.kafka.producer.client.id=a\\=b\\:c\n\
            debezium.sink.kafka.producer.client.rack: \\\n\
            \x20 eu\\u00e9\n\
            debezium.transforms=outbox\n\
            debezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n";
        let c = convert(props).unwrap();
        let f = parse(&c.toml);
        assert_eq!(f.kafka.brokers.as_deref(), Some("kafka-1:9092,kafka-2:9092"), "{}", c.toml);
        assert_eq!(f.kafka.properties["client.id"], "a=b:c");
        assert_eq!(f.kafka.properties["client.rack"], "eu\u{e9}");
        assert!(c.toml.contains("caf%C3%A9"), "the database name, decoded then URL-encoded: {}", c.toml);
        // A continued line counts as one: the line numbers of errors stay the file's.
        let e = convert("a=1\nb=2,\\\n  3\nlonely\n").unwrap_err();
        assert_eq!(e, "line 4 is not key=value (its text is not shown: it may hold a secret)");
        let e = convert("a=1\nsecret=\\u00zz\n").unwrap_err();
        assert!(e.starts_with("line 2 ") && !e.contains("00zz"), "{e}");
    }

    #[test]
    fn unreadable_input_is_an_error() {
        assert!(convert("{not json").is_err());
        // Java's properties format takes `key value`; a line without any separator is no pair.
        assert!(convert("just words").is_ok_and(|c| !c.not_carried.is_empty()));
        assert!(convert("justoneword").is_err());
        assert!(convert(r#"{"connector.class": "io.debezium.connector.mysql.MySqlConnector"}"#).is_err());
    }
}

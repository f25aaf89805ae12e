//! The producer's librdkafka configuration: walpost's defaults over the user's
//! properties, checked by the one table of refused properties the producer and the
//! inbox's consumer share (`kafka_common::refusal`: what would break ordering,
//! durability or the one delivery report per record the checkpoint depends on).

use std::collections::{BTreeMap, BTreeSet};

use kafka_common::{RefusedProperty, Role};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::ClientConfig;

/// The sink cannot be set up as configured.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error(transparent)]
    RefusedProperty(#[from] RefusedProperty),
    #[error("cannot create the Kafka producer: {0}")]
    Create(#[source] rdkafka::error::KafkaError),
}

/// Properties walpost sets unless the user overrides them (and may not override where
/// `kafka_common::refusal` says so), with the reason, logged once at start-up.
pub(crate) const DEFAULTS: &[(&str, &str, &str)] = &[
    ("acks", "all", "a record counts as delivered only once every in-sync replica has it"),
    ("enable.idempotence", "true", "retries never duplicate or reorder a partition's records"),
    (
        "enable.gapless.guarantee",
        "true",
        "a failure that could leave a gap in a partition stops the producer instead (walpost then restarts from the confirmed position), so an aggregate's events are never reordered",
    ),
    ("partitioner", "murmur2_random", "a key lands in the same partition as with Java clients and Debezium"),
    ("compression.type", "lz4", "cheap compression of JSON payloads"),
    (
        "linger.ms",
        "50",
        "a backlog goes in batches of up to 50 ms, which cuts the broker's CPU per record (by up to half); a transaction read as it commits is sent at once (walpost asks librdkafka to send it when it is handed over), so live records do not wait for linger",
    ),
    ("client.id", "walpost", "the broker's logs and quotas name walpost"),
    (
        "enable.sparse.connections",
        "false",
        "the brokers are connected (and the idempotent producer id fetched) while PostgreSQL is checked, not on the first record",
    ),
    (
        "reconnect.backoff.max.ms",
        "1000",
        "a restarted broker is reconnected within 1 s of its return (librdkafka's default cap, 10 s, left the producer idle up to 10 s after the broker was back; the Java client's default is 1 s)",
    ),
    (
        "topic.metadata.propagation.max.ms",
        "300000",
        "a topic created on first use (the first records of many new topics go out together) may take a loaded broker longer than librdkafka's 30 s to appear, and its records would fail as unknown topic; one that really cannot be created still fails, after 5 minutes",
    ),
    (
        "message.timeout.ms",
        "0",
        "records never expire inside librdkafka (an expired record followed by a delivered one is a gap); a silent producer is restarted by walpost after [pipeline] delivery_timeout_secs instead",
    ),
];

/// A transactional producer's identity and its transactions' timeout
/// (`--delivery exactly-once`).
#[derive(Debug, Clone)]
pub struct Transactional {
    pub id: String,
    pub timeout: std::time::Duration,
}

/// The producer configuration: defaults, then user properties (checked). Also the set
/// of keys the user gave (librdkafka's configuration warnings are shown for those only).
pub(crate) fn producer_config(
    brokers: &str,
    properties: &BTreeMap<String, String>,
    transactional: Option<&Transactional>,
) -> Result<(ClientConfig, BTreeSet<String>), SinkError> {
    let mut cfg = client_config(brokers, properties)?;
    for (k, v, _) in DEFAULTS {
        if !properties.contains_key(*k) {
            cfg.set(*k, *v);
        }
    }
    // librdkafka tells that it counted a record delivered because a later batch of its
    // partition was (the record may never have been written: see `kafka::barrier`) only
    // in its `eos` debug output; the sink watches for that line (`sink::IMPLICIT_ACK`).
    // Quiet otherwise: a few lines per producer start, per Kafka transaction and per
    // idempotence error.
    let debug = cfg.get("debug").unwrap_or_default().to_owned();
    if !debug.split(',').any(|c| matches!(c.trim(), "eos" | "msg" | "all")) {
        cfg.set("debug", if debug.trim().is_empty() { "eos".to_owned() } else { format!("{debug},eos") });
    }
    cfg.set_log_level(RDKafkaLogLevel::Debug);
    if let Some(t) = transactional {
        // An expired record aborts its transaction (nothing of it is ever read), so
        // records may expire with it; the gap-less guarantee is the idempotent
        // producer's answer to what transactions answer by aborting.
        let ms = t.timeout.as_millis().to_string();
        cfg.set("transactional.id", &t.id);
        cfg.set("transaction.timeout.ms", &ms);
        cfg.set("message.timeout.ms", &ms);
        cfg.remove("enable.gapless.guarantee");
    }
    if cfg.get("partitioner") != Some("murmur2_random") {
        tracing::warn!(
            partitioner = cfg.get("partitioner").unwrap_or_default(),
            "partitioner is not murmur2_random: keys will not map to the same partitions as Java clients and Debezium"
        );
    }
    Ok((cfg, properties.keys().cloned().collect()))
}

/// A client configuration with the user's properties only (admin clients for
/// `walpost check`, exactly-once's consumers): the same TLS/SASL settings the producer
/// uses, refused where the producer's would be.
pub(crate) fn client_config(brokers: &str, properties: &BTreeMap<String, String>) -> Result<ClientConfig, SinkError> {
    Ok(kafka_common::client_config(Role::Producer, brokers, properties)?)
}

/// One INFO line: what walpost sets and why (instead of librdkafka's warnings about
/// properties the user never set).
pub(crate) fn log_defaults(properties: &BTreeMap<String, String>) {
    let set: Vec<String> =
        DEFAULTS.iter().filter(|(k, _, _)| !properties.contains_key(*k)).map(|(k, v, _)| format!("{k}={v}")).collect();
    tracing::info!(
        properties = %set.join(" "),
        "Kafka producer: acks=all with idempotence and the gap-less guarantee keep each aggregate's events in order and durable; records never expire in the client (see docs/kafka.md)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordering_breaking_properties_are_refused() {
        for (k, v) in [
            ("enable.idempotence", "false"),
            ("acks", "1"),
            ("request.required.acks", "0"),
            ("max.in.flight.requests.per.connection", "10"),
            ("transactional.id", "x"),
            ("bootstrap.servers", "h:1"),
            ("message.timeout.ms", "30000"),
            ("delivery.timeout.ms", "120000"),
        ] {
            let mut props = BTreeMap::new();
            props.insert(k.to_owned(), v.to_owned());
            let err = producer_config("h:9092", &props, None).unwrap_err().to_string();
            assert!(err.contains(&format!("{k}={v} is refused")), "{err}");
        }
        for (k, v) in [
            ("acks", "all"),
            ("acks", "-1"),
            ("max.in.flight", "5"),
            ("compression.type", "zstd"),
            ("message.timeout.ms", "0"),
        ] {
            let mut props = BTreeMap::new();
            props.insert(k.to_owned(), v.to_owned());
            assert!(producer_config("h:9092", &props, None).is_ok(), "{k}={v}");
        }
    }

    #[test]
    fn defaults_are_durable_and_java_compatible() {
        let (cfg, user) = producer_config("h:9092", &BTreeMap::new(), None).unwrap();
        assert_eq!(cfg.get("acks"), Some("all"));
        assert_eq!(cfg.get("enable.idempotence"), Some("true"));
        assert_eq!(cfg.get("partitioner"), Some("murmur2_random"));
        assert_eq!(cfg.get("compression.type"), Some("lz4"));
        assert_eq!(cfg.get("reconnect.backoff.max.ms"), Some("1000"));
        assert_eq!(cfg.get("debug"), Some("eos"), "the implicit-ack line is watched for");
        assert!(matches!(cfg.log_level, RDKafkaLogLevel::Debug));
        assert!(user.is_empty());
    }

    #[test]
    fn a_transactional_producer_gets_its_id_and_expiring_records() {
        let t = Transactional { id: "walpost-1-db-slot".into(), timeout: std::time::Duration::from_secs(30) };
        let (cfg, _) = producer_config("h:9092", &BTreeMap::new(), Some(&t)).unwrap();
        assert_eq!(cfg.get("transactional.id"), Some("walpost-1-db-slot"));
        assert_eq!(cfg.get("transaction.timeout.ms"), Some("30000"));
        assert_eq!(cfg.get("message.timeout.ms"), Some("30000"));
        assert_eq!(cfg.get("enable.gapless.guarantee"), None);
        assert_eq!(cfg.get("enable.idempotence"), Some("true"));
    }

    #[test]
    fn librdkafka_debug_property_lets_its_debug_logs_through() {
        let mut props = BTreeMap::new();
        props.insert("debug".to_owned(), "broker,msg".to_owned());
        assert!(matches!(producer_config("h:9092", &props, None).unwrap().0.log_level, RDKafkaLogLevel::Debug));
    }

    /// Regression: librdkafka was built without libzstd, so `compression.type = "zstd"`
    /// (the README's own example configuration) failed at start-up with "libzstd not
    /// available at build time". librdkafka checks the codec when the producer is created,
    /// no broker needed: every codec Kafka defines must create one.
    #[test]
    fn regression_every_kafka_compression_codec_is_built_in() {
        use rdkafka::producer::BaseProducer;
        for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
            let mut props = BTreeMap::new();
            props.insert("compression.type".to_owned(), codec.to_owned());
            let (cfg, _) = producer_config("127.0.0.1:9", &props, None).unwrap();
            let created: Result<BaseProducer, _> = cfg.create();
            assert!(created.is_ok(), "compression.type={codec}: {:?}", created.err());
        }
    }

    /// Regression: `walpost check` built a bare client and ignored [kafka.properties].
    #[test]
    fn regression_admin_clients_get_the_users_security_properties() {
        let mut props = BTreeMap::new();
        props.insert("security.protocol".to_owned(), "SASL_PLAINTEXT".to_owned());
        props.insert("sasl.mechanisms".to_owned(), "PLAIN".to_owned());
        let cfg = client_config("h:9092", &props).unwrap();
        assert_eq!(cfg.get("security.protocol"), Some("SASL_PLAINTEXT"));
        assert_eq!(cfg.get("acks"), None, "producer defaults stay out of other clients");
    }
}

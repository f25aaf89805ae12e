//! A librdkafka client configuration from the user's properties (`[kafka.properties]`,
//! `--kafka-property`), and the one table of properties walpost refuses, for each kind
//! of client: those that would break ordering, durability or the one delivery report
//! per record the producer's checkpoint depends on, and those the inbox decides itself
//! because its offsets live in PostgreSQL.

use std::collections::BTreeMap;

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::ClientConfig;

/// The kind of client a configuration is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `walpost run`'s producer, and the admin clients of `walpost check` and
    /// exactly-once (they take the producer's properties).
    Producer,
    /// `walpost inbox`'s consumer.
    Consumer,
}

/// A property the user set that walpost refuses. Only keys that are never secrets are
/// refused, so the value is shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kafka property {key}={value} is refused: {reason}")]
pub struct RefusedProperty {
    pub key: String,
    pub value: String,
    pub reason: &'static str,
}

/// Why walpost refuses `key` = `value` for a client of `role`, or `None`.
pub fn refusal(role: Role, key: &str, value: &str) -> Option<&'static str> {
    let v = value.trim().to_ascii_lowercase();
    match (key, role) {
        ("bootstrap.servers" | "metadata.broker.list", _) => Some("set the brokers with --kafka-brokers or [kafka] brokers"),
        ("dr_cb" | "dr_msg_cb" | "opaque", _) => Some("set internally by walpost"),
        ("enable.idempotence", Role::Producer) if v != "true" => {
            Some("without idempotence a retried batch can land after a later one and reorder an aggregate's events")
        }
        ("acks" | "request.required.acks", Role::Producer) if v != "all" && v != "-1" => {
            Some("walpost confirms WAL only after acks=all; fewer acks can lose acknowledged events")
        }
        ("max.in.flight.requests.per.connection" | "max.in.flight", Role::Producer)
            if v.parse::<u32>().map_or(true, |n| n > 5) =>
        {
            Some("more than 5 in-flight requests breaks idempotent ordering")
        }
        ("transactional.id", Role::Producer) => Some("walpost derives the transactional id itself (--delivery exactly-once)"),
        ("message.timeout.ms" | "delivery.timeout.ms", Role::Producer) if v != "0" => Some(
            "a record that expires in the producer's queue can leave a gap a later record skips over; set [pipeline] delivery_timeout_secs instead",
        ),
        ("enable.gapless.guarantee", Role::Producer) if v != "true" => {
            Some("without it a failed batch can leave a gap that a later batch of the same partition skips over")
        }
        ("delivery.report.only.error", Role::Producer) if v == "true" => {
            Some("walpost needs a delivery report for every record to confirm WAL positions")
        }
        ("group.id", Role::Consumer) => {
            Some("the group is --group ([inbox] group): it is also the group_id of the stored offsets")
        }
        ("enable.auto.commit", Role::Consumer) => {
            Some("offsets are stored in PostgreSQL with the records; Kafka commits follow them, for dashboards only")
        }
        ("enable.auto.offset.store", Role::Consumer) => Some("offsets are stored in PostgreSQL with the records"),
        _ => None,
    }
}

/// A client configuration with the brokers and the user's properties (checked against
/// [`refusal`] for `role`), and the log level that lets librdkafka's `debug` output
/// through when the user asked for it. Each client adds its own settings after.
pub fn client_config(
    role: Role,
    brokers: &str,
    properties: &BTreeMap<String, String>,
) -> Result<ClientConfig, RefusedProperty> {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", brokers);
    for (k, v) in properties {
        if let Some(reason) = refusal(role, k, v) {
            return Err(RefusedProperty { key: k.clone(), value: v.clone(), reason });
        }
        cfg.set(k, v);
    }
    // librdkafka's own debug output (`debug` = "broker,msg,...") comes through only if
    // the client's log level lets it; it is then logged at tracing's debug level.
    cfg.set_log_level(if cfg.get("debug").is_some_and(|d| !d.is_empty()) {
        RDKafkaLogLevel::Debug
    } else {
        RDKafkaLogLevel::Warning
    });
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(k: &str, v: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(k.to_owned(), v.to_owned())])
    }

    #[test]
    fn each_role_refuses_its_own_and_both_refuse_the_brokers() {
        for role in [Role::Producer, Role::Consumer] {
            let e = client_config(role, "h:9092", &one("bootstrap.servers", "x:1")).unwrap_err();
            assert!(e.to_string().contains("bootstrap.servers=x:1 is refused: set the brokers"), "{e}");
        }
        assert!(client_config(Role::Producer, "h:9092", &one("acks", "1")).is_err());
        assert!(client_config(Role::Consumer, "h:9092", &one("acks", "1")).is_ok(), "no producer rule on a consumer");
        let e = client_config(Role::Consumer, "h:9092", &one("group.id", "other")).unwrap_err();
        assert!(e.to_string().contains("group.id=other is refused: the group is --group"), "{e}");
        assert!(client_config(Role::Producer, "h:9092", &one("group.id", "g")).is_ok());
    }

    #[test]
    fn the_users_properties_are_set_and_debug_lets_librdkafka_talk() {
        let mut props = one("security.protocol", "SASL_PLAINTEXT");
        let cfg = client_config(Role::Consumer, "h:9092", &props).unwrap();
        assert_eq!(cfg.get("security.protocol"), Some("SASL_PLAINTEXT"));
        assert_eq!(cfg.get("bootstrap.servers"), Some("h:9092"));
        assert!(matches!(cfg.log_level, RDKafkaLogLevel::Warning));
        props.insert("debug".into(), "broker".into());
        assert!(matches!(client_config(Role::Producer, "h:9092", &props).unwrap().log_level, RDKafkaLogLevel::Debug));
    }
}

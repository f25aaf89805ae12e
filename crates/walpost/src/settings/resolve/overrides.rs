//! What the command line (flags and `WALPOST_*` variables) sets, and the one place it is
//! written over the file's values ([`Overrides::layer_onto`]): resolution reads only
//! that merged layer.

use std::time::Duration;

use super::super::duration::Seconds;
use super::super::{
    DeliveryMode, Envelope, FileConfig, InboxDedup, InboxOnInvalid, KeyFormat, OnPermanentError, SnapshotMode,
    UnknownEventType, ValueFormat,
};

/// What the command line (flags and `WALPOST_*` variables, already merged by it) sets.
/// `None` everywhere means "not given": the file or the default decides.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `postgres` came from the command line itself (not `WALPOST_POSTGRES`).
    pub postgres_on_argv: bool,
    /// `--metrics-addr` is on the command line itself (a backfill serves metrics only then).
    pub metrics_addr_on_argv: bool,
    /// `--on-permanent-error`.
    pub on_permanent_error: Option<OnPermanentError>,
    /// `--dead-letter-topic`.
    pub dead_letter_topic: Option<String>,
    pub postgres: Option<String>,
    /// `--postgres-primary`: where walpost writes while it decodes on a standby.
    pub postgres_primary: Option<String>,
    /// `postgres_primary` came from the command line itself.
    pub postgres_primary_on_argv: bool,
    pub kafka_brokers: Option<String>,
    pub table: Option<String>,
    pub slot: Option<String>,
    pub publication: Option<String>,
    pub topic: Option<String>,
    pub route_by_field: Option<String>,
    pub key_field: Option<String>,
    pub payload_field: Option<String>,
    pub id_field: Option<String>,
    pub event_type_field: Option<String>,
    pub metrics_addr: Option<String>,
    pub snapshot: Option<SnapshotMode>,
    pub snapshot_filter: Option<String>,
    pub heartbeat_interval: Option<Duration>,
    /// `--signal-table`.
    pub signal_table: Option<String>,
    pub slot_failover: bool,
    /// `KEY=VALUE` librdkafka properties; override `[kafka.properties]`.
    pub kafka_properties: Vec<String>,
    /// `walpost retention --keep-days` / `--days-ahead`.
    pub retention_keep_days: Option<u32>,
    pub retention_days_ahead: Option<u32>,
    /// `--postgres-password-file` / `WALPOST_POSTGRES_PASSWORD_FILE`.
    pub postgres_password_file: Option<std::path::PathBuf>,
    /// Secret Kafka properties from `WALPOST_KAFKA_*` variables: (property, value).
    pub kafka_secret_env: Vec<(String, String)>,
    /// `--delivery`.
    pub delivery: Option<DeliveryMode>,
    /// `--envelope`.
    pub envelope: Option<Envelope>,
    /// `--contracts-dir`: a directory of `<event type>.json` schemas.
    pub contracts_dir: Option<std::path::PathBuf>,
    /// `--contracts-unknown`.
    pub contracts_unknown: Option<UnknownEventType>,
    /// `--contracts-max-depth`: levels a payload may nest.
    pub contracts_max_depth: Option<usize>,
    /// `--value-format`.
    pub value_format: Option<ValueFormat>,
    /// `--key-format`.
    pub key_format: Option<KeyFormat>,
    /// `--registry-url`.
    pub registry_url: Option<String>,
    /// `walpost inbox --topics` (comma-separated on the command line).
    pub inbox_topics: Option<Vec<String>>,
    pub inbox_topic_regex: Option<String>,
    pub inbox_group: Option<String>,
    pub inbox_schema: Option<String>,
    /// `--create-schema`.
    pub inbox_create_schema: bool,
    pub inbox_on_invalid: Option<InboxOnInvalid>,
    pub inbox_dedup: Option<InboxDedup>,
    /// `walpost inbox --event-id-header` (comma-separated on the command line).
    pub inbox_event_id_header: Option<Vec<String>>,
    /// `--admin-addr`.
    pub admin_addr: Option<String>,
    /// `--admin-tokens-file`.
    pub admin_tokens_file: Option<std::path::PathBuf>,
}

impl Overrides {
    /// Writes what the command line set over the file's values: after this one merge, the
    /// file-shaped layer holds every source (flag over environment over file), and
    /// [`resolve`] reads that layer alone. What has no place in the file stays here: where
    /// a value came from (`*_on_argv`), `--kafka-property` and the secret variables
    /// (judged as they are read: see [`resolve`]).
    pub(in crate::settings) fn layer_onto(&self, file: &mut FileConfig) {
        fn over<T: Clone>(flag: &Option<T>, file: &mut Option<T>) {
            if flag.is_some() {
                file.clone_from(flag);
            }
        }
        over(&self.postgres, &mut file.postgres);
        over(&self.postgres_primary, &mut file.postgres_primary);
        over(&self.postgres_password_file, &mut file.postgres_password_file);
        over(&self.kafka_brokers, &mut file.kafka.brokers);
        over(&self.table, &mut file.table);
        over(&self.slot, &mut file.slot);
        over(&self.publication, &mut file.publication);
        over(&self.metrics_addr, &mut file.metrics_addr);
        over(&self.snapshot, &mut file.snapshot);
        over(&self.snapshot_filter, &mut file.snapshot_filter);
        over(&self.heartbeat_interval.map(Seconds), &mut file.heartbeat_interval_secs);
        over(&self.signal_table, &mut file.signal_table);
        if self.slot_failover {
            file.slot_failover = Some(true);
        }
        over(&self.on_permanent_error, &mut file.on_permanent_error);
        over(&self.dead_letter_topic, &mut file.dead_letter_topic);
        over(&self.delivery, &mut file.delivery);
        over(&self.envelope, &mut file.envelope);
        over(&self.contracts_dir, &mut file.contracts.dir);
        over(&self.contracts_unknown, &mut file.contracts.unknown);
        over(&self.contracts_max_depth, &mut file.contracts.max_depth);
        over(&self.value_format, &mut file.contracts.value_format);
        over(&self.key_format, &mut file.contracts.key_format);
        over(&self.registry_url, &mut file.registry.url);
        over(&self.retention_keep_days, &mut file.retention.keep_days);
        over(&self.retention_days_ahead, &mut file.retention.days_ahead);
        over(&self.admin_addr, &mut file.admin.addr);
        over(&self.admin_tokens_file, &mut file.admin.tokens_file);
        let inbox = &mut file.inbox;
        if let Some(topics) = &self.inbox_topics {
            inbox.topics.clone_from(topics);
        }
        over(&self.inbox_topic_regex, &mut inbox.topic_regex);
        over(&self.inbox_group, &mut inbox.group);
        over(&self.inbox_schema, &mut inbox.schema);
        if self.inbox_create_schema {
            inbox.create_schema = Some(true);
        }
        over(&self.inbox_on_invalid, &mut inbox.on_invalid);
        over(&self.inbox_dedup, &mut inbox.dedup);
        if let Some(headers) = &self.inbox_event_id_header {
            inbox.event_id_header =
                Some(toml::Value::Array(headers.iter().cloned().map(toml::Value::String).collect()));
        }
        // The router flags set the first outbox's [router]; [[outbox]] tables and
        // [messages] inherit the result.
        let r = &mut file.router;
        over(&self.route_by_field, &mut r.route_by_field);
        over(&self.topic, &mut r.topic_replacement);
        over(&self.key_field, &mut r.key_field);
        over(&self.payload_field, &mut r.payload_field);
        over(&self.id_field, &mut r.id_field);
        over(&self.event_type_field, &mut r.event_type_header_field);
    }
}

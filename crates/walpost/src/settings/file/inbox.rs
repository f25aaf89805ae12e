//! `[inbox]` as the file gives it (`walpost inbox`'s section).

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use super::super::duration::{Millis, Seconds};

/// `[inbox]`: what `walpost inbox` consumes and where it stores it (see docs/inbox.md).
#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InboxFile {
    /// Topics to consume (or `topic_regex`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topics: Vec<String>,
    /// A regular expression over topic names, instead of `topics`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topic_regex: Option<String>,
    /// The Kafka consumer group (also the `group_id` of `inbox.offsets`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The schema of the inbox tables [default: inbox].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Apply the inbox migration (idempotent) at start-up.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub create_schema: Option<bool>,
    /// The headers holding the event id, tried in order: a list, or one string (names
    /// separated by commas) [default: id, then ce_id]. It replaces the default list, so a
    /// producer's own header is added with the defaults: `["id", "ce_id", "event-id"]`.
    /// Kept as the file gives it (a string or a list): resolving checks it and names what
    /// is wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id_header: Option<toml::Value>,
    /// The header holding the event type [default: eventType, then ce_type].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_type_header: Option<String>,
    /// The header holding the aggregate id [default: none: the record key].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregate_id_header: Option<String>,
    /// A record that cannot be stored (no event id, too large): `halt` (default) or
    /// `reject` (a row in the inbox's `rejected` table with the reason).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_invalid: Option<InboxOnInvalid>,
    /// What makes a record a duplicate: `topic` (default: its event id within its topic)
    /// or `global` (the event id alone: ids unique across every producer, such as UUIDs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedup: Option<InboxDedup>,
    /// Where a partition with no stored offset starts: `earliest` (default) or `latest`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_from: Option<InboxStartFrom>,
    /// The largest record value stored [default: 1 MiB].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_record_bytes: Option<u64>,
    /// A PostgreSQL transaction holds at most this many records...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_max_records: Option<u64>,
    /// ...and this many bytes of values...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_max_bytes: Option<u64>,
    /// ...and waits at most this long for more records after the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_max_wait_ms: Option<Millis>,
    /// How often the handler statistics (backlog, oldest pending) are read for /metrics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats_interval_secs: Option<Seconds>,
    /// Run the inbox's retention passes (create days ahead, drop finished days) [default: true].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention: Option<bool>,
    /// A day is dropped only when it is older than this many days (the dedup window) and
    /// no delivery in it is open [default: 7].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_keep_days: Option<u32>,
    /// A day older than this many days is dropped even with open deliveries, reported [default: 30].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_max_days: Option<u32>,
    /// Days ahead that have their partitions [default: 3].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_days_ahead: Option<u32>,
    /// Seconds between retention passes [default: 3600].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_interval_secs: Option<Seconds>,
    /// lock_timeout of each partition's create or drop, in milliseconds [default: 1000].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_lock_timeout_ms: Option<Millis>,
}

/// `inbox.on_invalid` (`--on-invalid`): a record that cannot be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum InboxOnInvalid {
    Halt,
    Reject,
}

/// `inbox.dedup` (`--dedup`): what makes a record a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum InboxDedup {
    Topic,
    Global,
}

/// `inbox.start_from`: where a partition with no stored offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InboxStartFrom {
    Earliest,
    Latest,
}

impl InboxFile {
    pub(in crate::settings) fn is_empty(&self) -> bool {
        self.topics.is_empty()
            && self.topic_regex.is_none()
            && self.group.is_none()
            && self.schema.is_none()
            && self.create_schema.is_none()
            && self.event_id_header.is_none()
            && self.event_type_header.is_none()
            && self.aggregate_id_header.is_none()
            && self.on_invalid.is_none()
            && self.dedup.is_none()
            && self.start_from.is_none()
            && self.max_record_bytes.is_none()
            && self.batch_max_records.is_none()
            && self.batch_max_bytes.is_none()
            && self.batch_max_wait_ms.is_none()
            && self.stats_interval_secs.is_none()
            && self.retention.is_none()
            && self.retention_keep_days.is_none()
            && self.retention_max_days.is_none()
            && self.retention_days_ahead.is_none()
            && self.retention_interval_secs.is_none()
            && self.retention_lock_timeout_ms.is_none()
    }
}

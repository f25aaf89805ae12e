//! `walpost inbox`'s settings, validated once: `[inbox]` with the flags and
//! `WALPOST_INBOX_*` variables over it, the connections and the metrics address (the
//! binary's `settings::inbox` resolves them from the command line and the file).
//!
//! Invariants of an [`InboxSettings`] value: the schema and the group are names that can
//! reach SQL quoted, there is at least one topic or a regex (never both), every limit is
//! positive, and the headers named are not empty.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// Resolved settings of `walpost inbox`.
#[derive(Debug, Clone)]
pub struct InboxSettings {
    pub postgres: replication::Config,
    pub brokers: String,
    /// librdkafka properties given by the user (checked by [`crate::consumer`]).
    pub properties: BTreeMap<String, String>,
    pub subscription: Subscription,
    pub group: String,
    /// The schema of the inbox tables.
    pub schema: String,
    /// Apply the inbox migration at start-up.
    pub create_schema: bool,
    pub headers: HeaderNames,
    pub on_invalid: OnInvalid,
    pub dedup: Dedup,
    pub start_from: StartFrom,
    /// A record whose value is larger is invalid ([`OnInvalid`] decides).
    pub max_record_bytes: usize,
    pub batch: BatchLimits,
    pub stats_interval: Duration,
    pub metrics_addr: Option<SocketAddr>,
    /// `None`: no retention passes (`[inbox] retention = false`).
    pub retention: Option<InboxRetention>,
}

/// The inbox's retention (see [`crate::retention`]). Invariant: `keep_days <= max_days`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboxRetention {
    /// A day is dropped only when it is older than this (the dedup window) and finished.
    pub keep_days: u32,
    /// A day older than this is dropped even when deliveries in it are open.
    pub max_days: u32,
    pub days_ahead: u32,
    pub interval: Duration,
    pub lock_timeout: Duration,
}

impl Default for InboxRetention {
    fn default() -> Self {
        InboxRetention {
            keep_days: 7,
            max_days: 30,
            days_ahead: 3,
            interval: Duration::from_secs(3600),
            lock_timeout: Duration::from_millis(1000),
        }
    }
}

/// What the consumer subscribes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subscription {
    Topics(Vec<String>),
    /// A regular expression over topic names (librdkafka's `^` subscription).
    Regex(String),
}

/// Which headers name a record's event id, type and aggregate: the first present wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderNames {
    pub event_id: Vec<String>,
    pub event_type: Vec<String>,
    /// `None`: the aggregate id is the record key (as walpost run writes it).
    pub aggregate_id: Option<String>,
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            event_id: vec!["id".into(), "ce_id".into()],
            event_type: vec!["eventType".into(), "ce_type".into()],
            aggregate_id: None,
        }
    }
}

/// A record that cannot be stored as a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnInvalid {
    /// Stop with its topic, partition and offset; nothing after it is stored.
    Halt,
    /// Store it in the inbox's `rejected` table with the reason, and go on.
    Reject,
}

/// What makes a record a duplicate of a stored message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dedup {
    /// The same event id in the same topic: ids are unique per producer (an outbox's
    /// BIGSERIAL), and two producers' topics may share one.
    Topic,
    /// The same event id in any topic: ids unique everywhere (UUIDs, CloudEvents ids).
    Global,
}

/// Where a partition without a stored offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    Earliest,
    Latest,
}

/// When a batch of records is written (one PostgreSQL transaction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    pub max_records: usize,
    pub max_bytes: usize,
    /// How long a batch waits for more records after its first.
    pub max_wait: Duration,
}

impl Default for BatchLimits {
    fn default() -> Self {
        // 2,000 records or 4 MiB or 20 ms: bench/inbox.sh measured 2,000-record
        // transactions at the COPY floor's rate; larger ones gained nothing and cost memory.
        BatchLimits { max_records: 2_000, max_bytes: 4 << 20, max_wait: Duration::from_millis(20) }
    }
}

//! Configuration: a TOML file ([`FileConfig`]), `WALPOST_*` environment variables and
//! flags ([`Overrides`], filled by the command line layer), merged once into a validated
//! [`Settings`].
//!
//! Precedence: flag > environment variable > file > default. The file is parsed with
//! `deny_unknown_fields`, so a misspelt key is an error naming it, never a silently
//! ignored setting. The command line layer turns its arguments into [`Overrides`]; the
//! only trace of clap here is the `ValueEnum` derive of the enumerations
//! ([`DeliveryMode`], [`Envelope`], [`OnPermanentError`], [`SnapshotMode`], [`ValueFormat`],
//! [`KeyFormat`], [`UnknownEventType`], [`InboxOnInvalid`], [`InboxDedup`],
//! [`InboxStartFrom`]), so a flag, its variable and its key accept the same spellings,
//! each listed once.
//!
//! Invariants of a [`Settings`] value: every name that reaches SQL (slot, publication,
//! tables) is a valid identifier, every duration and limit is positive, thresholds are
//! ordered (warning <= critical), and the router options resolve into routers.

pub mod admin;
pub mod contracts;
pub mod duration;
mod file;
pub mod inbox;
pub mod keys;
pub mod otel;
mod resolve;
pub mod secrets;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use clap::ValueEnum;
use router::RouterConfig;
use serde::{Deserialize, Serialize};

pub use contracts::{ContractsFile, RegistryAuth, RegistryFile, RegistrySettings, UnknownEventType};
pub use file::{
    AdminFile, CloudEventsFile, ExactlyOnceFile, FileConfig, InboxDedup, InboxFile, InboxOnInvalid, InboxStartFrom,
    KafkaFile, MessagesFile, MonitorFile, OutboxFile, PipelineFile, RetentionFile, RouterFile,
};
pub use resolve::{validate_identifier, Overrides};

/// Resolved, validated settings: one resolved struct per section, each made by one
/// function of `resolve` from its raw part of [`FileConfig`] with the flags layered on.
#[derive(Debug, Clone)]
pub struct Settings {
    pub postgres: PostgresSettings,
    pub source: SourceSettings,
    /// `None` for the commands that never talk to Kafka ([`Settings::resolve_without_kafka`]):
    /// they have no brokers, rather than an empty brokers string.
    pub kafka: Option<KafkaSettings>,
    pub stream: StreamSettings,
    pub snapshot: SnapshotSettings,
    pub monitor: MonitorSettings,
    pub retention: RetentionSettings,
    pub telemetry: TelemetrySettings,
    /// `[registry]` with `contracts.value_format = json-schema | avro`: `app` gives every
    /// router the registry's contract.
    pub registry: Option<RegistrySettings>,
    /// `[admin] addr`: the admin API listener; `None`: not served.
    pub admin: Option<admin::AdminSettings>,
    /// `[contracts]` as given: a redrive reads the schema files again from it.
    pub contracts: ContractsFile,
}

impl Settings {
    /// The Kafka settings of a command that talks to Kafka (resolved by
    /// [`Settings::resolve`], which requires the brokers).
    pub fn kafka(&self) -> Result<&KafkaSettings, ConfigError> {
        self.kafka.as_ref().ok_or(ConfigError::Missing {
            key: "kafka.brokers",
            flag: "kafka-brokers",
            env: "KAFKA_BROKERS",
        })
    }
}

/// The PostgreSQL connections (`postgres`, `postgres_primary`, `postgres_password_file`).
#[derive(Debug, Clone)]
pub struct PostgresSettings {
    /// The server the slot is read from: the primary, or a standby when
    /// `target_session_attrs` is `standby` or `prefer-standby`.
    pub server: replication::Config,
    /// Decoding on a standby: where walpost writes (`postgres_primary`, or `postgres`'s
    /// hosts with `read-write`). `None`: walpost decodes on the primary and writes there.
    pub primary: Option<replication::Config>,
}

impl PostgresSettings {
    /// Whether the settings ask to decode on a standby (the server found may still be a
    /// primary: `prefer-standby`, or a standby promoted since).
    pub fn standby_decoding(&self) -> bool {
        self.primary.is_some()
    }

    /// Where walpost writes: the primary connection when decoding on a standby, else the
    /// server it decodes on.
    pub fn writer(&self) -> &replication::Config {
        self.primary.as_ref().unwrap_or(&self.server)
    }
}

/// What the process serves and exports about itself.
#[derive(Debug, Clone)]
pub struct TelemetrySettings {
    /// `/metrics`, `/healthz`, `/readyz` (`metrics_addr`); `None`: not served.
    pub metrics_addr: Option<SocketAddr>,
    /// Span export (`OTEL_EXPORTER_OTLP_ENDPOINT`...); `None`: no exporter, no spans.
    pub otel: Option<otel::OtelSettings>,
}

/// What is read from PostgreSQL: the slot, the publication, the outbox tables.
#[derive(Debug, Clone)]
pub struct SourceSettings {
    pub slot: String,
    pub publication: String,
    /// Create the slot with `FAILOVER` (PostgreSQL 17+).
    pub slot_failover: bool,
    /// Every outbox table; never empty. The first is `--table`.
    pub outboxes: Vec<Outbox>,
    /// The table-less outbox (`pg_logical_emit_message`), if configured.
    pub messages: Option<Messages>,
    /// Emit an empty logical message this often (a quiet database on a busy server).
    pub heartbeat_interval: Option<Duration>,
    /// Debezium-format signal table (`--signal-table`): replays on demand.
    pub signal_table: Option<TableName>,
    /// Roles that may INSERT into the signal table (`[signal] allowed_roles`; superusers
    /// and walpost's own role always may).
    pub signal_allowed_roles: Vec<String>,
    /// `[signal] trust_all_roles`: any role that can insert signals, PUBLIC included.
    pub signal_trust_all_roles: bool,
}

impl SourceSettings {
    /// The first outbox table (`--table`).
    pub fn table(&self) -> &TableName {
        &self.outboxes[0].table
    }

    /// The first outbox table's router configuration.
    pub fn router(&self) -> &RouterConfig {
        &self.outboxes[0].router
    }

    /// The router of every outbox table, then the table-less outbox's.
    pub fn routers_mut(&mut self) -> impl Iterator<Item = &mut RouterConfig> {
        self.outboxes.iter_mut().map(|o| &mut o.router).chain(self.messages.iter_mut().map(|m| &mut m.router))
    }

    pub fn routers(&self) -> impl Iterator<Item = &RouterConfig> {
        self.outboxes.iter().map(|o| &o.router).chain(self.messages.iter().map(|m| &m.router))
    }

    /// The tables the publication must publish: every outbox, and the signal table.
    pub fn published_tables(&self) -> impl Iterator<Item = &TableName> {
        self.outboxes.iter().map(|o| &o.table).chain(self.signal_table.iter())
    }
}

/// Where records go and what happens to the ones Kafka will never take.
#[derive(Debug, Clone)]
pub struct KafkaSettings {
    pub brokers: String,
    /// librdkafka properties given by the user (checked by `crate::kafka`).
    pub properties: BTreeMap<String, String>,
    pub on_permanent_error: OnPermanentError,
    pub dead_letter_topic: String,
    /// Errors, log lines and dead-letter headers may show column values.
    pub log_values: bool,
    pub delivery: Delivery,
}

/// `delivery` as the file, `--delivery` or `WALPOST_DELIVERY` spell it; resolved into
/// [`Delivery`] with `[exactly_once]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
#[value(rename_all = "kebab-case")]
pub enum DeliveryMode {
    AtLeastOnce,
    ExactlyOnce,
}

/// `envelope` (`--envelope`, `WALPOST_ENVELOPE`): the records as Debezium writes them, or
/// CloudEvents (`[cloudevents]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
pub enum Envelope {
    #[serde(rename = "none")]
    #[value(name = "none")]
    Plain,
    #[serde(rename = "cloudevents")]
    #[value(name = "cloudevents")]
    CloudEvents,
}

/// `contracts.value_format` (`--value-format`): the payload unchanged, or framed by a
/// schema registry's subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
#[value(rename_all = "kebab-case")]
pub enum ValueFormat {
    Json,
    JsonSchema,
    Avro,
}

/// `contracts.key_format` (`--key-format`): the aggregate id's bytes, or framed by the
/// subject `<topic>-key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
#[value(rename_all = "kebab-case")]
pub enum KeyFormat {
    String,
    JsonSchema,
    Avro,
}

/// The name a value enum is spelt with (on the command line, in a variable, in the file).
pub fn spelling<E: ValueEnum>(value: E) -> String {
    value.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default()
}

/// The delivery guarantee (`--delivery`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Every event at least once; after a crash, what was acknowledged but not yet
    /// confirmed is sent again.
    AtLeastOnce,
    /// Kafka transactions with the slot position in a progress topic: a read_committed
    /// consumer sees every event exactly once.
    ExactlyOnce(ExactlyOnce),
}

/// `[exactly_once]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExactlyOnce {
    /// Compacted topic holding each slot's last committed WAL position.
    pub progress_topic: String,
    /// A Kafka transaction is committed once it holds this many records...
    pub max_transaction_records: u64,
    /// ...or this many payload bytes...
    pub max_transaction_bytes: u64,
    /// ...or has been open this long (at the next PostgreSQL commit).
    pub max_transaction_interval: Duration,
    /// While the stream reads a backlog, a Kafka transaction is committed after this long
    /// instead (the record and byte bounds wait too): each commit stops the stream while
    /// the records in flight are acknowledged, and a backlog has no reader waiting on
    /// the latency the shorter bounds keep.
    pub backlog_transaction_interval: Duration,
    /// librdkafka's `transaction.timeout.ms`: the broker aborts a transaction open longer.
    pub transaction_timeout: Duration,
}

impl Default for ExactlyOnce {
    fn default() -> Self {
        ExactlyOnce {
            progress_topic: "walpost.progress".into(),
            max_transaction_records: 10_000,
            max_transaction_bytes: 32 << 20,
            max_transaction_interval: Duration::from_millis(100),
            backlog_transaction_interval: Duration::from_millis(1_000),
            transaction_timeout: Duration::from_secs(60),
        }
    }
}

/// The produce window and the replication session.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    pub max_in_flight_bytes: u64,
    pub max_in_flight_records: u64,
    /// A standby status update at least this often.
    pub status_interval: Duration,
    /// How long a shutdown waits for Kafka's acknowledgements.
    pub shutdown_timeout: Duration,
    /// Reconnect backoff cap.
    pub max_backoff: Duration,
    /// Restart a producer that acknowledges nothing this long while records wait.
    pub delivery_timeout: Duration,
    /// `/readyz` fails once Kafka has acknowledged nothing this long while records wait.
    pub unready_after: Duration,
    /// The largest WAL message (one row) read whole; larger ones are a permanent error
    /// of their event, read and dropped without being buffered.
    pub max_message_bytes: usize,
    /// After a halt, how long `walpost_halted 1` is served before the exit (0: none).
    pub halt_linger: Duration,
    /// With `target_session_attrs=standby`: how long the hosts may answer only as
    /// primaries (or not at all) before walpost stops, advising `prefer-standby`.
    pub no_standby_timeout: Duration,
}

/// The initial snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSettings {
    pub mode: SnapshotMode,
    /// A SQL condition on the outbox rows.
    pub filter: Option<String>,
    /// This snapshot is a replay (`walpost replay`, or a signal): its records carry the
    /// header `walpost.replay` instead of `walpost.snapshot`.
    pub replay: Option<ReplayMark>,
}

/// What marks a replay's records, and whether it only counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayMark {
    /// The value of the `walpost.replay` header.
    pub id: String,
    /// Count the rows per topic; publish nothing.
    pub dry_run: bool,
    /// The values of the snapshot filter's `$1`, `$2`, ... (the range and the strings of
    /// the condition, bound as parameters: never SQL text).
    pub filter_params: Vec<String>,
}

/// When to snapshot the rows already in the outbox (Debezium's snapshot.mode names).
/// The variants' docs are `--snapshot`'s help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Stream only; rows that exist before the slot are not published.
    Never,
    /// Snapshot once, when walpost creates the slot; then stream.
    Initial,
    /// Snapshot, then exit 0 (a backfill; no slot is created).
    InitialOnly,
    /// Snapshot when the slot is missing or lost; then stream.
    WhenNeeded,
}

/// The slot monitor.
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorSettings {
    pub interval: Duration,
    pub thresholds: Thresholds,
    /// Seconds between reminders while an alarm stays raised.
    pub reminder: Duration,
}

pub use slot_alarm::Thresholds;

/// Partition retention (see `crate::retention`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionSettings {
    /// `Some(false)`: no task in `walpost run`; `None`: the task acts when the table is partitioned.
    pub enabled: Option<bool>,
    pub interval: Duration,
    pub keep_days: u32,
    pub days_ahead: u32,
    pub lock_timeout: Duration,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        RetentionSettings {
            enabled: None,
            interval: Duration::from_secs(3600),
            keep_days: 7,
            days_ahead: 3,
            lock_timeout: Duration::from_millis(1000),
        }
    }
}

/// What to do with an UPDATE/DELETE/TRUNCATE of an outbox table, or a message that may
/// not be published (Debezium's `table.op.invalid.behavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpInvalid {
    /// Log a warning and go on.
    Warn,
    /// Log an error and go on.
    Error,
    /// Stop walpost.
    Fatal,
}

/// One outbox table and how its rows are routed.
#[derive(Debug, Clone)]
pub struct Outbox {
    pub table: TableName,
    pub router: RouterConfig,
    pub op_invalid: OpInvalid,
}

/// What happens to a record that can never be published (`on_permanent_error`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum OnPermanentError {
    /// Stop; nothing after it is confirmed.
    Halt,
    /// To the dead-letter topic, and go on.
    DeadLetter,
}

/// The table-less outbox, resolved.
#[derive(Debug, Clone)]
pub struct Messages {
    pub prefixes: Vec<String>,
    pub allow_non_transactional: bool,
    /// Roles that may execute `pg_logical_emit_message` (superusers always can).
    pub allowed_roles: Vec<String>,
    /// Accept any role that can execute it, PUBLIC included (not recommended).
    pub trust_all_roles: bool,
    pub router: RouterConfig,
    pub op_invalid: OpInvalid,
}

/// A schema-qualified table name; both parts are valid identifiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

impl TableName {
    /// `schema.name` (or `name`, in schema `public`).
    pub fn parse(text: &str) -> Result<TableName, ConfigError> {
        let (schema, name) = text.split_once('.').unwrap_or(("public", text));
        let invalid = || ConfigError::Invalid {
            key: "table",
            value: text.into(),
            expected: "schema.name of two identifiers, e.g. events.outbox",
        };
        validate_identifier(schema).map_err(|_| invalid())?;
        validate_identifier(name).map_err(|_| invalid())?;
        Ok(TableName { schema: schema.into(), name: name.into() })
    }

    /// `"schema"."name"` for SQL.
    pub fn quoted(&self) -> String {
        format!("{}.{}", replication::quote_ident(&self.schema), replication::quote_ident(&self.name))
    }
}

/// Configuration that cannot be used. No variant carries a configuration file's text
/// or a connection string (either may hold a secret).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: String, message: String },
    #[error("{path} holds {what} and is readable by group or others (mode {mode}): run chmod 600 {path} (and chown it to the user walpost runs as)")]
    Insecure { path: String, what: String, mode: String },
    #[error("{key} is required: pass --{flag}, set WALPOST_{env}, or put {key} in the config file")]
    Missing { key: &'static str, flag: &'static str, env: &'static str },
    #[error("{key} = '{value}' is not valid: expected {expected}")]
    Invalid { key: &'static str, value: String, expected: &'static str },
    /// A router option that cannot be used (the text names the option).
    #[error("{0}")]
    Option(String),
    #[error(transparent)]
    Postgres(#[from] replication::ConfigError),
}

impl From<ConfigError> for crate::error::PipelineError {
    fn from(e: ConfigError) -> Self {
        crate::error::PipelineError::definite(crate::error::ErrorKind::Config, &e).caused_by(e)
    }
}

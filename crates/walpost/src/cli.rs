//! Command-line flags: clap types only, turned into [`Overrides`] for the settings
//! layer. Every `run` flag can also come from a `WALPOST_*` environment variable (flag
//! wins) or from the TOML file given with `--config` (env wins). Help never prints the
//! values of environment variables (a connection string may hold a password).
//!
//! Why one file over 600 lines: it is the whole command line as clap types and their
//! `--help` text, read as one reference; splitting it by command would scatter the
//! flags that `run`, `check`, `slot` and `replay` share. `walpost ctl`, which shares none
//! (it is a client of a running walpost), is in [`ctl`].
// The `///` comments below are `--help` text, printed verbatim by clap: `[retention]`
// names a TOML table and `<table>` a placeholder, not a rustdoc link or an HTML tag.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use std::path::PathBuf;

use std::collections::BTreeSet;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, FromArgMatches, Parser, Subcommand, ValueEnum};

pub mod ctl;

use crate::settings::{
    DeliveryMode, Envelope, InboxDedup, InboxOnInvalid, KeyFormat, OnPermanentError, Overrides, SnapshotMode,
    UnknownEventType, ValueFormat,
};

#[derive(Debug, Parser)]
#[command(
    name = "walpost",
    version = crate::VERSION,
    about = "Streams transactional-outbox events from PostgreSQL's WAL to Kafka",
    long_about = "walpost reads INSERTs into an outbox table from a PostgreSQL logical replication \
slot (pgoutput), routes each row to a Kafka topic keyed by its aggregate id (Debezium Outbox \
Event Router semantics), and confirms the WAL position to the slot only after Kafka has \
acknowledged every record up to it."
)]
pub struct Cli {
    /// TOML configuration file (flags and WALPOST_* variables override it).
    #[arg(long, global = true, env = "WALPOST_CONFIG", hide_env_values = true, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Log output format.
    #[arg(long, global = true, env = "WALPOST_LOG_FORMAT", hide_env_values = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Colour in text logs: auto (only when stderr is a terminal), always, never.
    #[arg(long, global = true, env = "WALPOST_LOG_COLOR", hide_env_values = true, value_enum, default_value_t = LogColor::Auto)]
    pub log_color: LogColor,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogColor {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stream outbox INSERTs to Kafka until SIGINT/SIGTERM.
    ///
    /// Creates the publication and the logical slot when they are missing, then
    /// publishes every committed INSERT into the outbox table, in commit order, and
    /// confirms the slot's position only after Kafka acknowledged everything before it.
    Run(RunArgs),

    /// Preflight against a live server and broker: one line per check, exit 1 on any
    /// failure, each failure with its fix.
    Check(Box<CheckArgs>),

    /// Convert a Debezium PostgreSQL connector config (Kafka Connect JSON or Debezium
    /// Server application.properties) with an Outbox Event Router into walpost TOML.
    /// Prints the TOML; lists what could not be carried over on stderr; exit 2 if any.
    ImportDebezium {
        /// connector.json or application.properties
        file: PathBuf,
    },

    /// Inspect or manage the replication slot.
    Slot {
        #[command(subcommand)]
        action: SlotAction,
    },

    /// One retention pass on the partitioned outbox: create partitions ahead, seal and
    /// drop old ones. One line per partition with the action and its reason.
    ///
    /// A partition is dropped only once its whole range is older than the retention
    /// period and the slot has confirmed every row in it (see docs/retention.md).
    /// `walpost run` runs the same pass every [retention] interval_secs.
    Retention(RetentionArgs),

    /// Publish existing outbox rows again (a range, a condition) through the same router,
    /// beside a running `walpost run`; exits 0 once Kafka acknowledged every one.
    ///
    /// Rows are read on one consistent snapshot in id order; each record keeps its `id`
    /// header and carries `walpost.replay: <id>`. Progress goes to stderr, a summary per
    /// topic to stdout. No slot is used.
    Replay(ReplayArgs),

    /// Consume Kafka records into a consuming service's PostgreSQL inbox, exactly once,
    /// until SIGINT/SIGTERM (see docs/inbox.md).
    ///
    /// Each record goes into <schema>.messages (once per event id) together with its
    /// partition's next offset in <schema>.offsets, in one transaction; a partition is
    /// read from the offset stored there. Handlers then claim and complete messages
    /// with the SQL functions of migrations/inbox/ (walpost migrate --inbox).
    Inbox(InboxArgs),

    /// Apply the pending versioned migrations (migrations/outbox/, or migrations/inbox/
    /// with --inbox) and record each in <schema>.walpost_migrations; `migrate status`
    /// lists the applied and pending ones.
    ///
    /// Each migration runs in its own transaction, one walpost migrate per schema at a
    /// time (a second waits, then applies nothing). An applied migration whose file has
    /// changed stops it, naming the file (exit 1). A database migrated by hand before is
    /// recognised by its objects and recorded without running anything.
    Migrate(MigrateArgs),

    /// Local schemas against a schema registry, for a producing service's CI: `check`
    /// asks whether each may follow its subject's latest version (exit 1 naming the
    /// incompatible ones); `push` registers them (walpost never registers implicitly).
    ///
    /// DIR holds <event type>.json (JSON Schema) and <event type>.avsc (Avro) files; the
    /// subject of each is named by --subject-strategy, as `walpost run` names it.
    Contracts {
        #[command(subcommand)]
        action: ContractsAction,
    },

    /// The admin API from a terminal: status, pause and resume, dead letters, replays, the
    /// inbox's handlers (docs/control-plane.md, "walpost ctl").
    ///
    /// Prints the API's JSON answer on stdout (pipe it to jq); an error answer's error and
    /// hint on stderr. The token comes from WALPOST_ADMIN_TOKEN or --token-file, never from
    /// the command line. Exit codes: 0 done; 1 the API answered an error (4xx, 5xx);
    /// 2 walpost ctl could not ask (usage, no URL or token, unreachable, TLS, timeout).
    Ctl(ctl::CtlArgs),
}

/// `walpost migrate`: apply, or `walpost migrate status`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MigrateArgs {
    #[command(subcommand)]
    pub action: Option<MigrateAction>,
    #[command(flatten)]
    pub target: MigrateTarget,
    /// Print what would be applied and recorded; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Subcommand)]
pub enum MigrateAction {
    /// List the applied and pending migrations; exit 1 if an applied one's file changed.
    Status(MigrateTarget),
}

/// The database and schema `walpost migrate` works on.
#[derive(Debug, Args)]
pub struct MigrateTarget {
    /// PostgreSQL URL of the database: the outbox's, or with --inbox the consuming
    /// service's. The role needs CREATE on the schema (and on the database when the
    /// schema does not exist yet).
    #[arg(long, env = "WALPOST_POSTGRES", hide_env_values = true, value_name = "URL")]
    pub postgres: Option<String>,

    /// File holding the PostgreSQL password (owner-only), when the URL has none.
    #[arg(long, env = "WALPOST_POSTGRES_PASSWORD_FILE", hide_env_values = true, value_name = "FILE")]
    pub postgres_password_file: Option<PathBuf>,

    /// The inbox's migrations (migrations/inbox/) instead of the outbox's.
    #[arg(long)]
    pub inbox: bool,

    /// The inbox's schema (with --inbox; the outbox's migrations name theirs, events)
    /// [default: inbox].
    #[arg(long, requires = "inbox", value_name = "NAME")]
    pub schema: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ContractsAction {
    /// Exit 1 if a schema is not compatible with its subject's latest version.
    Check(ContractsArgs),
    /// Register each schema under its subject; prints the schema ids.
    Push(ContractsArgs),
}

#[derive(Debug, Args)]
pub struct ContractsArgs {
    /// The schema registry's API base URL ([registry] url).
    #[arg(
        long = "registry",
        alias = "registry-url",
        env = "WALPOST_REGISTRY_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub registry: Option<String>,
    /// The directory of schemas.
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// record_name (the event type), topic_name (<topic>-value) or topic_record_name
    /// (<topic>-<event type>) ([registry] subject_strategy) [default: record_name].
    #[arg(long, value_name = "STRATEGY")]
    pub subject_strategy: Option<String>,
    /// The topic, for the topic_name and topic_record_name strategies.
    #[arg(long, value_name = "TOPIC")]
    pub topic: Option<String>,
}

/// `walpost check`: `run`'s flags, or `walpost check inbox` with `inbox`'s.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CheckArgs {
    #[command(subcommand)]
    pub target: Option<CheckTarget>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum CheckTarget {
    /// Preflight of `walpost inbox`: the database, the inbox schema and the rights the
    /// ingest needs, the brokers with the consumer's properties, the topics, the group.
    Inbox(InboxArgs),
}

#[derive(Debug, Args)]
pub struct InboxArgs {
    /// First: clap's derive takes each value out of the matches as it reads it.
    #[command(flatten)]
    pub on_argv: OnArgv,

    /// PostgreSQL URL of the consuming service's database (where the inbox tables are).
    #[arg(long, env = "WALPOST_POSTGRES", hide_env_values = true, value_name = "URL")]
    pub postgres: Option<String>,

    /// File holding the PostgreSQL password (owner-only), when the URL has none.
    #[arg(long, env = "WALPOST_POSTGRES_PASSWORD_FILE", hide_env_values = true, value_name = "FILE")]
    pub postgres_password_file: Option<PathBuf>,

    /// Kafka bootstrap servers, host:port[,host:port...].
    #[arg(long, env = "WALPOST_KAFKA_BROKERS", hide_env_values = true, value_name = "HOSTS")]
    pub kafka_brokers: Option<String>,

    /// Topics to consume, comma-separated ([inbox] topics).
    #[arg(long, env = "WALPOST_INBOX_TOPICS", hide_env_values = true, value_name = "T1,T2", value_delimiter = ',')]
    pub topics: Option<Vec<String>>,

    /// A regular expression over topic names, instead of --topics ([inbox] topic_regex).
    #[arg(long, env = "WALPOST_INBOX_TOPIC_REGEX", hide_env_values = true, value_name = "REGEX")]
    pub topic_regex: Option<String>,

    /// The consumer group; also the group_id of the stored offsets ([inbox] group).
    #[arg(long, env = "WALPOST_INBOX_GROUP", hide_env_values = true, value_name = "GROUP")]
    pub group: Option<String>,

    /// Schema of the inbox tables ([inbox] schema) [default: inbox].
    #[arg(long, env = "WALPOST_INBOX_SCHEMA", hide_env_values = true, value_name = "SCHEMA")]
    pub schema: Option<String>,

    /// Apply the inbox migration (idempotent) before consuming ([inbox] create_schema).
    #[arg(long, env = "WALPOST_INBOX_CREATE_SCHEMA", hide_env_values = true)]
    pub create_schema: bool,

    /// A record that cannot be stored (no event id, too large): halt, or reject (a row
    /// in <schema>.rejected with the reason) ([inbox] on_invalid) [default: halt].
    #[arg(long, env = "WALPOST_INBOX_ON_INVALID", hide_env_values = true, value_enum, value_name = "halt|reject")]
    pub on_invalid: Option<InboxOnInvalid>,

    /// The headers holding the event id, tried in order, comma-separated ([inbox]
    /// event_id_header) [default: id,ce_id]; they replace the defaults.
    #[arg(
        long,
        env = "WALPOST_INBOX_EVENT_ID_HEADER",
        hide_env_values = true,
        value_name = "H1,H2",
        value_delimiter = ','
    )]
    pub event_id_header: Option<Vec<String>>,

    /// What makes a record a duplicate: its event id within its topic (topic), or the event
    /// id alone, for ids unique across every producer such as UUIDs (global)
    /// ([inbox] dedup) [default: topic].
    #[arg(long, env = "WALPOST_INBOX_DEDUP", hide_env_values = true, value_enum, value_name = "topic|global")]
    pub dedup: Option<InboxDedup>,

    /// Serve Prometheus /metrics, /healthz and /readyz on this address, e.g. 127.0.0.1:9188.
    #[arg(long, env = "WALPOST_METRICS_ADDR", hide_env_values = true, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,

    /// A librdkafka consumer property, KEY=VALUE; repeatable; overrides [kafka.properties].
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_property: Vec<String>,

    /// Serve the admin API (/api/v1/inbox/...) on this address, e.g. 127.0.0.1:9189
    /// ([admin] addr; needs --admin-tokens-file) [default: not served].
    #[arg(long, env = "WALPOST_ADMIN_ADDR", hide_env_values = true, value_name = "HOST:PORT")]
    pub admin_addr: Option<String>,

    /// The admin API's tokens: one line NAME ROLE SHA256 each ([admin] tokens_file).
    #[arg(long, env = "WALPOST_ADMIN_TOKENS_FILE", hide_env_values = true, value_name = "FILE")]
    pub admin_tokens_file: Option<PathBuf>,
}

impl InboxArgs {
    /// What these flags (and `WALPOST_*` variables) set, for the settings layer.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            postgres: self.postgres.clone(),
            postgres_on_argv: self.on_argv.has("postgres"),
            postgres_password_file: self.postgres_password_file.clone(),
            kafka_brokers: self.kafka_brokers.clone(),
            kafka_properties: self.kafka_property.clone(),
            kafka_secret_env: kafka_secret_env(&|k| std::env::var(k).ok()),
            metrics_addr: self.metrics_addr.clone(),
            inbox_topics: self.topics.clone(),
            inbox_topic_regex: self.topic_regex.clone(),
            inbox_group: self.group.clone(),
            inbox_schema: self.schema.clone(),
            inbox_create_schema: self.create_schema,
            inbox_on_invalid: self.on_invalid,
            inbox_event_id_header: self.event_id_header.clone(),
            inbox_dedup: self.dedup,
            admin_addr: self.admin_addr.clone(),
            admin_tokens_file: self.admin_tokens_file.clone(),
            ..Overrides::default()
        }
    }
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Connection, table, router and Kafka settings as for `run` (the slot is not used).
    #[command(flatten)]
    pub run: ConnectionArgs,

    /// Rows whose time column is at or after this timestamp (e.g. 2026-11-28T00:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,

    /// Rows whose time column is before this timestamp.
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,

    /// A further condition on the rows, e.g. "aggregate_type = 'order'": columns compared
    /// with constants (=, <>, <, >, IN, BETWEEN, IS NULL, LIKE, AND, OR, NOT).
    #[arg(long = "where", value_name = "CONDITION")]
    pub condition: Option<String>,

    /// Run --where as any SQL expression (function calls and subqueries included),
    /// under the replay's statement timeout.
    #[arg(long)]
    pub unsafe_where: bool,

    /// How long one statement of the replay may run (e.g. 30s, 5min) [default: 5min].
    #[arg(long, value_name = "DURATION", value_parser = crate::settings::duration::parse_duration)]
    pub statement_timeout: Option<std::time::Duration>,

    /// The column --since and --until apply to [default: the router's
    /// table.field.event.timestamp, else occurred_at].
    #[arg(long, value_name = "COLUMN")]
    pub time_column: Option<String>,

    /// Count the rows per topic; publish nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// The replay's id (the walpost.replay header) [default: replay-<UTC time>].
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
}

#[derive(Debug, Args)]
pub struct RetentionArgs {
    /// Connection, table and slot as for `run` (Kafka settings are not used).
    #[command(flatten)]
    pub run: RunArgs,

    /// Print what the pass would do; change nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Retention period in days, over [retention] keep_days [default: 7].
    #[arg(long, value_name = "DAYS")]
    pub keep_days: Option<u32>,

    /// Days of partitions kept created ahead, over [retention] days_ahead [default: 3].
    #[arg(long, value_name = "DAYS")]
    pub days_ahead: Option<u32>,
}

#[derive(Debug, Subcommand)]
pub enum SlotAction {
    /// Retained and unconfirmed WAL, wal_status, lag and alarm level of the slot.
    Status {
        #[command(flatten)]
        args: RunArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Create the slot (and the publication) without streaming.
    Create {
        #[command(flatten)]
        args: RunArgs,
    },
    /// Drop the slot: PostgreSQL stops retaining WAL for it; events not yet confirmed
    /// will not be streamed (see runbooks/slot-lost.md to republish them).
    Drop {
        #[command(flatten)]
        args: RunArgs,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

/// What every command that reads the outbox or writes Kafka takes: the connections, the
/// table, the router and the producer.
#[derive(Debug, Args)]
pub struct ConnectionArgs {
    /// First: clap's derive takes each value out of the matches as it reads it.
    #[command(flatten)]
    pub on_argv: OnArgv,

    /// PostgreSQL URL: postgres://user:password@host:port/dbname?sslmode=... (a host
    /// starting with / is a Unix-socket directory). The role needs REPLICATION.
    #[arg(long, env = "WALPOST_POSTGRES", hide_env_values = true, value_name = "URL")]
    pub postgres: Option<String>,

    /// Kafka bootstrap servers, host:port[,host:port...].
    #[arg(long, env = "WALPOST_KAFKA_BROKERS", hide_env_values = true, value_name = "HOSTS")]
    pub kafka_brokers: Option<String>,

    /// Outbox table, schema.name [default: events.outbox].
    #[arg(long, env = "WALPOST_TABLE", hide_env_values = true, value_name = "SCHEMA.NAME")]
    pub table: Option<String>,

    /// Logical replication slot name [default: walpost].
    #[arg(long, env = "WALPOST_SLOT", hide_env_values = true, value_name = "NAME")]
    pub slot: Option<String>,

    /// Publication name; created FOR TABLE <table> WITH (publish = 'insert',
    /// publish_via_partition_root = true) when missing [default: walpost_outbox].
    #[arg(long, env = "WALPOST_PUBLICATION", hide_env_values = true, value_name = "NAME")]
    pub publication: Option<String>,

    /// Topic pattern; ${routedByValue} is replaced by the route column's value
    /// (Debezium route.topic.replacement) [default: outbox.event.${routedByValue}].
    #[arg(long, env = "WALPOST_TOPIC", hide_env_values = true, value_name = "PATTERN")]
    pub topic: Option<String>,

    /// Column whose value names the topic (Debezium route.by.field) [default: aggregate_type].
    #[arg(long, env = "WALPOST_ROUTE_BY_FIELD", hide_env_values = true, value_name = "COLUMN")]
    pub route_by_field: Option<String>,

    /// Column used as the record key (Debezium table.field.event.key) [default: aggregate_id].
    #[arg(long, env = "WALPOST_KEY_FIELD", hide_env_values = true, value_name = "COLUMN")]
    pub key_field: Option<String>,

    /// Column whose bytes become the record value (Debezium table.field.event.payload) [default: payload].
    #[arg(long, env = "WALPOST_PAYLOAD_FIELD", hide_env_values = true, value_name = "COLUMN")]
    pub payload_field: Option<String>,

    /// Column sent as the `id` header (Debezium table.field.event.id) [default: id].
    #[arg(long, env = "WALPOST_ID_FIELD", hide_env_values = true, value_name = "COLUMN")]
    pub id_field: Option<String>,

    /// Column sent as the `eventType` header; empty for none [default: event_type].
    #[arg(long, env = "WALPOST_EVENT_TYPE_FIELD", hide_env_values = true, value_name = "COLUMN")]
    pub event_type_field: Option<String>,

    /// Record envelope: none (Debezium's records), or cloudevents (CloudEvents Kafka
    /// binding 1.0; [cloudevents] mode = binary or structured) [default: none].
    #[arg(long, env = "WALPOST_ENVELOPE", hide_env_values = true, value_enum, value_name = "ENVELOPE")]
    pub envelope: Option<Envelope>,

    /// A directory of JSON Schemas, <event type>.json: every payload is checked against
    /// its event type's before it reaches Kafka (see docs/contracts.md).
    #[arg(long, env = "WALPOST_CONTRACTS_DIR", hide_env_values = true, value_name = "DIR")]
    pub contracts_dir: Option<PathBuf>,

    /// An event type without a schema: allow (published unchecked) or refuse (a
    /// permanent error of that event) [default: allow].
    #[arg(long, env = "WALPOST_CONTRACTS_UNKNOWN", hide_env_values = true, value_enum, value_name = "allow|refuse")]
    pub contracts_unknown: Option<UnknownEventType>,

    /// Levels of objects and arrays a payload may nest; a deeper one is a contract
    /// breach ([contracts] max_depth, 1 to 128) [default: 32].
    #[arg(long, env = "WALPOST_CONTRACTS_MAX_DEPTH", hide_env_values = true, value_name = "LEVELS")]
    pub contracts_max_depth: Option<usize>,

    /// How record values are written: json (the payload unchanged), json-schema or avro
    /// (checked by the subject's schema in [registry], Confluent wire format)
    /// ([contracts] value_format) [default: json].
    #[arg(
        long,
        env = "WALPOST_CONTRACTS_VALUE_FORMAT",
        hide_env_values = true,
        value_enum,
        value_name = "json|json-schema|avro"
    )]
    pub value_format: Option<ValueFormat>,

    /// How record keys are written: string (the aggregate id unchanged), json-schema or
    /// avro (by the subject <topic>-key in [registry], Confluent wire format; needs
    /// --value-format json-schema or avro) ([contracts] key_format) [default: string].
    #[arg(
        long,
        env = "WALPOST_CONTRACTS_KEY_FORMAT",
        hide_env_values = true,
        value_enum,
        value_name = "string|json-schema|avro"
    )]
    pub key_format: Option<KeyFormat>,

    /// The schema registry's API base URL, e.g. http://registry:8081 or Apicurio's
    /// http://host:8080/apis/ccompat/v7 ([registry] url).
    #[arg(long, alias = "registry", env = "WALPOST_REGISTRY_URL", hide_env_values = true, value_name = "URL")]
    pub registry_url: Option<String>,

    /// File holding the PostgreSQL password (owner-only), when the URL has none; it wins
    /// over PGPASSWORD. Keeps the password out of argv and the environment.
    #[arg(long, env = "WALPOST_POSTGRES_PASSWORD_FILE", hide_env_values = true, value_name = "FILE")]
    pub postgres_password_file: Option<PathBuf>,

    /// Decoding on a standby (--postgres with target_session_attrs=standby or
    /// prefer-standby): the primary, where walpost writes its heartbeat, slot lineage,
    /// publication, retention and snapshot progress [default: --postgres's hosts with
    /// target_session_attrs=read-write].
    #[arg(long, env = "WALPOST_POSTGRES_PRIMARY", hide_env_values = true, value_name = "URL")]
    pub postgres_primary: Option<String>,

    /// A librdkafka property, KEY=VALUE; repeatable; overrides [kafka.properties].
    /// Secrets (sasl.password, ...) belong in WALPOST_KAFKA_SASL_PASSWORD-style
    /// variables or [kafka] properties_file, not on the command line.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_property: Vec<String>,

    /// A record Kafka will never take, or a row that cannot be routed: halt (stop, nothing
    /// after it confirmed) or dead_letter (to --dead-letter-topic) [default: halt].
    #[arg(
        long,
        env = "WALPOST_ON_PERMANENT_ERROR",
        hide_env_values = true,
        value_enum,
        value_name = "halt|dead_letter"
    )]
    pub on_permanent_error: Option<OnPermanentError>,

    /// The dead-letter topic [default: walpost.dead_letter].
    #[arg(long, env = "WALPOST_DEAD_LETTER_TOPIC", hide_env_values = true, value_name = "TOPIC")]
    pub dead_letter_topic: Option<String>,
}

/// What only `walpost run` (and the commands that check or manage what it runs) takes:
/// the snapshot, the slot's options, signals, the heartbeat, the delivery guarantee and
/// the metrics server.
#[derive(Debug, Args)]
pub struct StreamArgs {
    /// First: clap's derive takes each value out of the matches as it reads it.
    #[command(flatten)]
    pub on_argv: OnArgv,

    /// Serve Prometheus /metrics, /healthz and /readyz on this address, e.g. 127.0.0.1:9187.
    #[arg(long, env = "WALPOST_METRICS_ADDR", hide_env_values = true, value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,

    /// When to publish rows that already exist: never, initial (once, when the slot is
    /// created), initial_only (then exit 0), when_needed (slot missing or lost) [default: never].
    #[arg(long, env = "WALPOST_SNAPSHOT", hide_env_values = true, value_enum, value_name = "MODE")]
    pub snapshot: Option<SnapshotMode>,

    /// SQL condition limiting the snapshot, e.g. "published_at IS NULL".
    #[arg(long, env = "WALPOST_SNAPSHOT_FILTER", hide_env_values = true, value_name = "SQL")]
    pub snapshot_filter: Option<String>,

    /// Every DURATION (a number of seconds, or 500ms, 30s, 5min), emit an empty
    /// transactional logical message so a quiet database on a busy server still lets the
    /// slot advance [default: off].
    #[arg(
        long,
        env = "WALPOST_HEARTBEAT_INTERVAL",
        hide_env_values = true,
        value_name = "DURATION",
        value_parser = crate::settings::duration::parse_duration
    )]
    pub heartbeat_interval: Option<std::time::Duration>,

    /// Create the slot with failover enabled (PostgreSQL 17+: synchronized to standbys
    /// listed in synchronized_standby_slots).
    #[arg(long, env = "WALPOST_SLOT_FAILOVER", hide_env_values = true)]
    pub slot_failover: bool,

    /// A table in Debezium's signal format (id, type, data): inserting an
    /// execute-snapshot row replays outbox rows while the stream goes on [default: none].
    #[arg(long, env = "WALPOST_SIGNAL_TABLE", hide_env_values = true, value_name = "SCHEMA.NAME")]
    pub signal_table: Option<String>,

    /// Delivery guarantee: at-least-once, or exactly-once (Kafka transactions, progress
    /// in a compacted topic; consumers read with isolation.level=read_committed)
    /// [default: at-least-once].
    #[arg(long, env = "WALPOST_DELIVERY", hide_env_values = true, value_enum, value_name = "MODE")]
    pub delivery: Option<DeliveryMode>,

    /// Serve the admin API on this address, e.g. 127.0.0.1:9188 ([admin] addr; needs
    /// --admin-tokens-file) [default: not served].
    #[arg(long, env = "WALPOST_ADMIN_ADDR", hide_env_values = true, value_name = "HOST:PORT")]
    pub admin_addr: Option<String>,

    /// The admin API's tokens: one line NAME ROLE SHA256 each ([admin] tokens_file).
    #[arg(long, env = "WALPOST_ADMIN_TOKENS_FILE", hide_env_values = true, value_name = "FILE")]
    pub admin_tokens_file: Option<PathBuf>,
}

/// `walpost run`'s flags.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub stream: StreamArgs,
}

impl ConnectionArgs {
    /// What these flags (and `WALPOST_*` variables) set, for the settings layer.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            postgres: self.postgres.clone(),
            postgres_on_argv: self.on_argv.has("postgres"),
            postgres_primary: self.postgres_primary.clone(),
            postgres_primary_on_argv: self.on_argv.has("postgres_primary"),
            kafka_brokers: self.kafka_brokers.clone(),
            table: self.table.clone(),
            slot: self.slot.clone(),
            publication: self.publication.clone(),
            topic: self.topic.clone(),
            route_by_field: self.route_by_field.clone(),
            key_field: self.key_field.clone(),
            payload_field: self.payload_field.clone(),
            id_field: self.id_field.clone(),
            event_type_field: self.event_type_field.clone(),
            kafka_properties: self.kafka_property.clone(),
            postgres_password_file: self.postgres_password_file.clone(),
            envelope: self.envelope,
            contracts_dir: self.contracts_dir.clone(),
            contracts_unknown: self.contracts_unknown,
            contracts_max_depth: self.contracts_max_depth,
            value_format: self.value_format,
            key_format: self.key_format,
            registry_url: self.registry_url.clone(),
            on_permanent_error: self.on_permanent_error,
            dead_letter_topic: self.dead_letter_topic.clone(),
            kafka_secret_env: kafka_secret_env(&|k| std::env::var(k).ok()),
            ..Overrides::default()
        }
    }
}

impl RunArgs {
    /// What these flags (and `WALPOST_*` variables) set, for the settings layer.
    pub fn overrides(&self) -> Overrides {
        let s = &self.stream;
        Overrides {
            metrics_addr: s.metrics_addr.clone(),
            metrics_addr_on_argv: s.on_argv.has("metrics_addr"),
            snapshot: s.snapshot,
            snapshot_filter: s.snapshot_filter.clone(),
            heartbeat_interval: s.heartbeat_interval,
            signal_table: s.signal_table.clone(),
            slot_failover: s.slot_failover,
            delivery: s.delivery,
            admin_addr: s.admin_addr.clone(),
            admin_tokens_file: s.admin_tokens_file.clone(),
            ..self.connection.overrides()
        }
    }
}

/// Secret Kafka properties from their `WALPOST_KAFKA_*` variables.
fn kafka_secret_env(env: &dyn Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    crate::settings::secrets::KAFKA_SECRET_PROPERTIES
        .iter()
        .filter_map(|p| env(&crate::settings::secrets::kafka_secret_env_var(p)).map(|v| ((*p).to_owned(), v)))
        .collect()
}

impl RetentionArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides { retention_keep_days: self.keep_days, retention_days_ahead: self.days_ahead, ..self.run.overrides() }
    }
}

/// Which arguments of a command were given on the command line itself, as opposed to
/// their `WALPOST_*` variable or a default (clap's [`ArgMatches::value_source`]): a value
/// on the command line is readable by every user of the machine (`/proc/<pid>/cmdline`),
/// and a backfill serves metrics only when its own command line names a port.
///
/// Flattened into a command's arguments, it adds none: it reads the matches of the
/// command it is part of.
#[derive(Debug, Clone, Default)]
pub struct OnArgv(BTreeSet<String>);

impl OnArgv {
    /// Whether the argument `id` (the field's name, e.g. `postgres_primary`) came from
    /// the command line.
    pub fn has(&self, id: &str) -> bool {
        self.0.contains(id)
    }
}

impl FromArgMatches for OnArgv {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let on_argv = matches.ids().filter(|id| matches.value_source(id.as_str()) == Some(ValueSource::CommandLine));
        Ok(OnArgv(on_argv.map(|id| id.as_str().to_owned()).collect()))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = OnArgv::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for OnArgv {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent_and_every_run_flag_is_documented() {
        Cli::command().debug_assert();
        let mut cmd = Cli::command();
        let run = cmd.find_subcommand_mut("run").unwrap();
        for arg in run.get_arguments() {
            assert!(arg.get_help().is_some(), "flag --{} has no help", arg.get_id());
        }
    }

    /// Regression: `--help` printed `[env: WALPOST_POSTGRES=postgres://walpost:walpost@...]`,
    /// the password from the environment.
    #[test]
    fn regression_help_never_shows_environment_values() {
        let mut cmd = Cli::command();
        for sub in ["run", "check", "inbox", "migrate"] {
            let sub = cmd.find_subcommand_mut(sub).unwrap();
            for arg in sub.get_arguments() {
                if arg.get_env().is_some() {
                    assert!(arg.is_hide_env_values_set(), "--{} shows its environment value", arg.get_id());
                }
            }
        }
        let help = Cli::command().find_subcommand("slot").unwrap().clone().render_long_help().to_string();
        assert!(!help.contains("WALPOST_POSTGRES="), "{help}");
    }

    #[test]
    fn flags_become_overrides() {
        let cli =
            Cli::try_parse_from(["walpost", "run", "--slot", "s1", "--snapshot", "initial_only", "--slot-failover"])
                .unwrap();
        let Command::Run(args) = cli.command else { panic!() };
        let o = args.overrides();
        assert_eq!(o.slot.as_deref(), Some("s1"));
        assert_eq!(o.snapshot, Some(SnapshotMode::InitialOnly));
        assert!(o.slot_failover);
    }

    /// Where a value came from is clap's `value_source`: a flag in argv, whatever its
    /// spelling; never a variable (the tests of variables are in tests/configuration.rs).
    #[test]
    fn on_argv_is_what_the_command_line_holds() {
        let cli = Cli::try_parse_from([
            "walpost",
            "run",
            "--postgres",
            "postgres://u@h/d",
            "--metrics-addr=127.0.0.1:1",
            "--delivery",
            "exactly-once",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else { panic!() };
        let o = args.overrides();
        assert!(o.postgres_on_argv && o.metrics_addr_on_argv && !o.postgres_primary_on_argv, "{o:?}");
        assert_eq!(o.delivery, Some(DeliveryMode::ExactlyOnce));
        let cli = Cli::try_parse_from(["walpost", "check", "inbox", "--postgres=postgres://u@h/d"]).unwrap();
        let Command::Check(check) = cli.command else { panic!() };
        let Some(CheckTarget::Inbox(inbox)) = check.target else { panic!() };
        assert!(inbox.overrides().postgres_on_argv);
    }

    /// The enumerations take the spellings they always took, and a wrong one is refused
    /// naming the flag and every allowed value.
    #[test]
    fn enumerations_take_their_documented_spellings() {
        let parse = |flag: &str, value: &str| Cli::try_parse_from(["walpost", "run", flag, value]);
        for (flag, values) in [
            ("--delivery", &["at-least-once", "exactly-once"][..]),
            ("--envelope", &["none", "cloudevents"]),
            ("--on-permanent-error", &["halt", "dead_letter"]),
            ("--value-format", &["json", "json-schema", "avro"]),
            ("--key-format", &["string", "json-schema", "avro"]),
            ("--snapshot", &["never", "initial", "initial_only", "when_needed"]),
        ] {
            for value in values {
                assert!(parse(flag, value).is_ok(), "{flag} {value}");
            }
            let e = parse(flag, "bogus").unwrap_err().to_string();
            assert!(e.contains(flag) && values.iter().all(|v| e.contains(v)), "{flag}: {e}");
        }
    }
}

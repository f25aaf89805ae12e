//! Command-line flags. Every `run` flag can also come from a `WALPOST_*` environment
//! variable (flag wins) or from the TOML file given with `--config` (env wins).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

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
    #[arg(long, global = true, env = "WALPOST_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Log output format.
    #[arg(long, global = true, env = "WALPOST_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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
    Check(RunArgs),

    /// Convert a Debezium PostgreSQL connector config (Kafka Connect JSON or Debezium
    /// Server application.properties) with an Outbox Event Router into walpost TOML.
    /// Prints the TOML; lists what could not be carried over on stderr; exit 2 if any.
    ImportDebezium {
        /// connector.json or application.properties
        file: std::path::PathBuf,
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
    /// period and the slot has confirmed every row in it (see README, Retention).
    /// `walpost run` runs the same pass every [retention] interval_secs.
    Retention(RetentionArgs),
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

#[derive(Debug, Args)]
pub struct RunArgs {
    /// PostgreSQL URL: postgres://user:password@host:port/dbname?sslmode=... (a host
    /// starting with / is a Unix-socket directory). The role needs REPLICATION.
    #[arg(long, env = "WALPOST_POSTGRES", value_name = "URL")]
    pub postgres: Option<String>,

    /// Kafka bootstrap servers, host:port[,host:port...].
    #[arg(long, env = "WALPOST_KAFKA_BROKERS", value_name = "HOSTS")]
    pub kafka_brokers: Option<String>,

    /// Outbox table, schema.name [default: events.outbox].
    #[arg(long, env = "WALPOST_TABLE", value_name = "SCHEMA.NAME")]
    pub table: Option<String>,

    /// Logical replication slot name [default: walpost].
    #[arg(long, env = "WALPOST_SLOT", value_name = "NAME")]
    pub slot: Option<String>,

    /// Publication name; created FOR TABLE <table> WITH (publish = 'insert',
    /// publish_via_partition_root = true) when missing [default: walpost_outbox].
    #[arg(long, env = "WALPOST_PUBLICATION", value_name = "NAME")]
    pub publication: Option<String>,

    /// Topic pattern; ${routedByValue} is replaced by the route column's value
    /// (Debezium route.topic.replacement) [default: outbox.event.${routedByValue}].
    #[arg(long, env = "WALPOST_TOPIC", value_name = "PATTERN")]
    pub topic: Option<String>,

    /// Column whose value names the topic (Debezium route.by.field) [default: aggregate_type].
    #[arg(long, env = "WALPOST_ROUTE_BY_FIELD", value_name = "COLUMN")]
    pub route_by_field: Option<String>,

    /// Column used as the record key (Debezium table.field.event.key) [default: aggregate_id].
    #[arg(long, env = "WALPOST_KEY_FIELD", value_name = "COLUMN")]
    pub key_field: Option<String>,

    /// Column whose bytes become the record value (Debezium table.field.event.payload) [default: payload].
    #[arg(long, env = "WALPOST_PAYLOAD_FIELD", value_name = "COLUMN")]
    pub payload_field: Option<String>,

    /// Column sent as the `id` header (Debezium table.field.event.id) [default: id].
    #[arg(long, env = "WALPOST_ID_FIELD", value_name = "COLUMN")]
    pub id_field: Option<String>,

    /// Column sent as the `eventType` header; empty for none [default: event_type].
    #[arg(long, env = "WALPOST_EVENT_TYPE_FIELD", value_name = "COLUMN")]
    pub event_type_field: Option<String>,

    /// Serve Prometheus /metrics, /healthz and /readyz on this address, e.g. 0.0.0.0:9187.
    #[arg(long, env = "WALPOST_METRICS_ADDR", value_name = "HOST:PORT")]
    pub metrics_addr: Option<String>,

    /// When to publish rows that already exist: never, initial (once, when the slot is
    /// created), initial_only (then exit 0), when_needed (slot missing or lost) [default: never].
    #[arg(long, env = "WALPOST_SNAPSHOT", value_enum, value_name = "MODE")]
    pub snapshot: Option<crate::snapshot::SnapshotMode>,

    /// SQL condition limiting the snapshot, e.g. "published_at IS NULL".
    #[arg(long, env = "WALPOST_SNAPSHOT_FILTER", value_name = "SQL")]
    pub snapshot_filter: Option<String>,

    /// Every SECS seconds, emit an empty transactional logical message so a quiet
    /// database on a busy server still lets the slot advance [default: off].
    #[arg(long, env = "WALPOST_HEARTBEAT_INTERVAL", value_name = "SECS")]
    pub heartbeat_interval: Option<u64>,

    /// Create the slot with failover enabled (PostgreSQL 17+: synchronized to standbys
    /// listed in synchronized_standby_slots).
    #[arg(long, env = "WALPOST_SLOT_FAILOVER")]
    pub slot_failover: bool,

    /// A librdkafka property, KEY=VALUE; repeatable; overrides [kafka.properties].
    #[arg(long = "kafka-property", value_name = "KEY=VALUE")]
    pub kafka_property: Vec<String>,
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
}

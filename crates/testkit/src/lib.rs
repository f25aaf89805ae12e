//! Integration-test harness for walpost: throwaway **real** servers.
//!
//! * [`Postgres`] — a private PostgreSQL cluster (`initdb` + `pg_ctl`) in a temporary
//!   directory, listening on a free `127.0.0.1` port with `wal_level = logical`.
//!   Clients connect as the superuser role `walpost` / password `walpost` (SCRAM) to
//!   the database `walpost`: [`Postgres::url`] gives
//!   `postgres://walpost:walpost@127.0.0.1:PORT/walpost`.
//! * [`Kafka`] — a single-node Apache Kafka 4.1.1 broker+controller (KRaft) run from the
//!   jars fetched by `scripts/fetch-kafka.sh`, listening on free `127.0.0.1` ports.
//!   [`Kafka::bootstrap`] gives `127.0.0.1:PORT` (PLAINTEXT).
//! * [`Proxy`] — a TCP forwarder the test controls (cut every connection, stall for N
//!   seconds, refuse new connections), to break the network between a client and a
//!   server without root.
//! * [`shared_postgres`] / [`shared_kafka`] — one server per test binary, started on first
//!   use and shared by all tests of that binary. Give every test its own database
//!   ([`Postgres::create_database`]), replication-slot names, publication names and topic
//!   names (see [`unique_name`]).
//!
//! Everything is synchronous and std-only, so it can be used from plain `#[test]`
//! functions (and from `#[tokio::test]` ones: the calls block, which is fine in tests).
//!
//! ```no_run
//! let pg = testkit::Postgres::start(testkit::PgOptions::default())?;
//! pg.psql("CREATE TABLE t (id int PRIMARY KEY, v text)")?;
//! assert_eq!(pg.psql("SHOW wal_level")?, "logical");
//! let url = pg.url(); // postgres://walpost:walpost@127.0.0.1:PORT/walpost
//!
//! let kafka = testkit::shared_kafka();
//! kafka.create_topic("orders", 3)?;
//! let bootstrap = kafka.bootstrap(); // 127.0.0.1:PORT
//! # Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
//! ```
//!
//! # Requirements
//!
//! Run `scripts/setup-deps.sh` once (Debian 12; installs PostgreSQL 15, the librdkafka
//! build dependencies, creates an OS user for the clusters and fetches the Kafka jars).
//! Java 17+ must be on `PATH` (or `JAVA_HOME` set). If the Kafka jars are missing,
//! [`Kafka::start`] runs `scripts/fetch-kafka.sh` itself (needs Maven and network).
//!
//! # Environment variables
//!
//! | variable | meaning |
//! |---|---|
//! | `WALPOST_PG_BINDIR` | directory holding `initdb`, `pg_ctl`, `postgres`, `psql`. Default: `pg_config --bindir` if it has `initdb`, else the highest `/usr/lib/postgresql/*/bin`. |
//! | `WALPOST_PSQL` | the `psql` binary. Default: `psql` in the bin directory, else (server-only builds, e.g. `scripts/fetch-postgres.sh`) the highest `/usr/lib/postgresql/*/bin/psql`, else `psql` on `PATH`. |
//! | `WALPOST_PG_OS_USER` | when the tests run as **root**: the ordinary OS user that owns and runs the clusters (`initdb` refuses root). Default: `postgres` if it exists, else `walpost-pg` (created with `useradd` if missing). Ignored when not root: the cluster then runs as the current user. |
//! | `WALPOST_KAFKA_LIBS` | directory with the Kafka class path (the jars). Default `$HOME/.cache/walpost/kafka-4.1.1/libs`. Considered complete when it holds the marker file `.walpost-complete`. |
//! | `WALPOST_KEEP_TEST_DIRS` | if set (to anything), temporary server directories (data, config, logs) are kept instead of deleted, and their paths are printed to stderr. |
//! | `WALPOST_KAFKA_NO_CDS` | if set, do not use/create AppCDS archives (`<libs>/../cds/*.jsa`, which halve JVM start-up). |
//! | `JAVA_HOME` | if set, `$JAVA_HOME/bin/java` is used, else `java` from `PATH`. |
//! | `TMPDIR` | where the temporary server directories are created (default `/tmp`). When running as root it must be traversable by the cluster's OS user. |
//!
//! # Things to know
//!
//! * PostgreSQL: `initdb --locale=C -E UTF8`; `timezone = 'UTC'`; `fsync = off`,
//!   `full_page_writes = off` (a crash of the *machine* loses data, a crash of the
//!   server does not), `synchronous_commit = on`, `wal_sender_timeout = 60s`,
//!   `log_replication_commands = on`. [`Postgres::psql`] connects as `walpost` over the
//!   Unix socket (trust), so objects it creates are owned by `walpost`. TCP logins use
//!   SCRAM (`pg_hba`: `host all|replication all 127.0.0.1/32 scram-sha-256`). When the
//!   tests run as root the server runs as another OS user: files you want the *server*
//!   to read (e.g. for `COPY FROM`) must be readable by it.
//! * Replication slot names are cluster-wide; with [`shared_postgres`] make them unique
//!   ([`unique_name`]) and drop them when done (inactive slots pin WAL).
//! * Kafka: ready ~3-5 s after [`Kafka::start`] on an idle 2-core machine; a restart
//!   after [`Kafka::kill`] takes ~4 s longer than after [`Kafka::stop`] (the controller
//!   waits for the dead broker's session to expire). [`Kafka::create_topic`] and
//!   [`Kafka::run_tool`] start a JVM (~1-1.5 s each); auto-created topics get 3
//!   partitions. Only a PLAINTEXT listener (no TLS/SASL).
//! * Servers print one line to stderr when ready (port, timing, directory); on failure
//!   the error includes the tail of the server log.
//!
//! # Cleanup / orphans
//!
//! Each server gets a tiny watchdog process (`sh`, in its own process group) whose stdin
//! is a pipe held by the test process. When the test process ends for **any** reason
//! (normal exit — statics such as [`shared_kafka`] are never dropped —, panic, `SIGKILL`,
//! Ctrl-C) the pipe closes and the watchdog kills the server (PostgreSQL: `SIGQUIT`, i.e.
//! immediate shutdown, then `SIGKILL`; Kafka: `SIGKILL`) and deletes its directory
//! (unless `WALPOST_KEEP_TEST_DIRS` is set). Servers owned by a value are also cleaned up
//! synchronously by its `Drop`.

mod cluster;
mod kafka;
mod kafka_meta;
mod pg;
mod proxy;
mod util;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use cluster::{KafkaCluster, KafkaClusterOptions, CLUSTER_SETTLE_TIMEOUT};
pub use kafka::{Kafka, KafkaOptions};
pub use kafka_meta::{fetch_metadata, BrokerMetadata, Metadata, PartitionMetadata, TopicMetadata};
pub use pg::{
    pg_bin_dir_for_major, pg_bin_major, pg_default_bin_dir, PgOptions, Postgres, StandbyOptions, StopMode,
    STANDBY_TIMEOUT,
};
pub use proxy::Proxy;
pub use util::{free_port, unique_name};

/// Error type of the harness: any error, with a readable message (tool output included).
pub type Error = Box<dyn std::error::Error + Send + Sync>;
/// Result type of the harness.
pub type Result<T> = std::result::Result<T, Error>;

/// One PostgreSQL cluster shared by all tests of the current test binary, started on
/// first use with [`PgOptions::default`] except `max_replication_slots` and
/// `max_wal_senders`, which are raised to 64 (slots of finished tests that are not
/// dropped still count).
///
/// Give each test its own database ([`Postgres::create_database`]) and unique slot and
/// publication names (slot names are cluster-wide). Do not stop or restart the shared
/// cluster; start a private [`Postgres`] for that.
///
/// # Panics
/// If the cluster cannot be started (every caller gets the same message).
pub fn shared_postgres() -> &'static Postgres {
    static PG: OnceLock<std::result::Result<Postgres, String>> = OnceLock::new();
    let started = PG.get_or_init(|| {
        let opts = PgOptions {
            extra_conf: vec![("max_replication_slots".into(), "64".into()), ("max_wal_senders".into(), "64".into())],
            ..PgOptions::default()
        };
        Postgres::start(opts).map_err(|e| e.to_string())
    });
    match started {
        Ok(pg) => pg,
        Err(e) => panic!("testkit: shared PostgreSQL failed to start: {e}"),
    }
}

/// One Kafka broker shared by all tests of the current test binary, started on first use
/// with [`KafkaOptions::default`] (auto-creation of topics on, 3 partitions by default).
///
/// Use unique topic names per test. Do not stop or kill the shared broker (you cannot:
/// [`Kafka::stop`] needs `&mut`); start a private [`Kafka`] for that.
///
/// # Panics
/// If the broker cannot be started (every caller gets the same message).
pub fn shared_kafka() -> &'static Kafka {
    static KAFKA: OnceLock<std::result::Result<Kafka, String>> = OnceLock::new();
    let started = KAFKA.get_or_init(|| Kafka::start(KafkaOptions::default()).map_err(|e| e.to_string()));
    match started {
        Ok(k) => k,
        Err(e) => panic!("testkit: shared Kafka failed to start: {e}"),
    }
}

/// Polls `cond` every 50 ms until it returns true or `timeout` elapses; returns whether
/// it became true.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

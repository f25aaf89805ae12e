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
//! * [`Postgres::start_standby`] — a hot standby streaming from a [`Postgres`] (PostgreSQL
//!   14-18; no `pg_basebackup` needed), [`Postgres::promote`], and on 17+ failover-slot
//!   synchronization ([`Postgres::wait_slot_synced`]).
//! * [`KafkaCluster`] — N (default 3) Kafka 4.1.1 KRaft nodes, each broker+controller,
//!   replication factor 3 and `min.insync.replicas=2`; per-node [`KafkaCluster::kill`],
//!   [`KafkaCluster::stop`], [`KafkaCluster::start_again`] (waits until the node is back
//!   in every ISR), [`KafkaCluster::leader_of`].
//! * [`fetch_metadata`] — a std-only Kafka `Metadata` request (live brokers, leaders,
//!   ISR) in a few milliseconds, without a JVM; also [`Kafka::metadata`],
//!   [`KafkaCluster::metadata`].
//! * [`Proxy`] — a TCP forwarder the test controls (cut every connection, stall for N
//!   seconds, refuse new connections), to break the network between a client and a
//!   server without root.
//! * [`SchemaRegistry`] — Apicurio Registry 2.4.2.Final (in-memory storage, no auth), the
//!   Confluent Schema Registry API at [`SchemaRegistry::url`]
//!   (`http://127.0.0.1:PORT/apis/ccompat/v7`), built once by `scripts/fetch-test-tools.sh`;
//!   [`SchemaRegistry::pause`] / [`SchemaRegistry::resume`] make it hang without losing
//!   schemas, [`SchemaRegistry::restart`] brings it back empty on the same port. [`python`]
//!   is the Python with Confluent's serializers (`confluent-kafka[avro,json,schemaregistry]`).
//! * [`Chromedriver`] / [`Browser`] — Debian's `chromedriver` and headless `chromium`
//!   driven over W3C WebDriver (navigate, find by CSS, click, type, text, scripts,
//!   screenshots) for tests of the admin listener's web console.
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
//! A standby and a 3-node cluster:
//!
//! ```no_run
//! use testkit::{KafkaCluster, KafkaClusterOptions, PgOptions, Postgres, StandbyOptions, StopMode};
//! let primary = Postgres::start(PgOptions { bin_dir: Some(testkit::pg_bin_dir_for_major(17)?), ..Default::default() })?;
//! let standby = Postgres::start_standby(&primary, StandbyOptions::default())?;
//! primary.psql("SELECT pg_create_logical_replication_slot('s', 'pgoutput', failover => true)")?;
//! // ... consume the slot on the primary (see Postgres::wait_slot_synced) ...
//! standby.wait_slot_synced("s", &primary)?;
//! primary.stop(StopMode::Immediate)?;
//! standby.promote()?; // `s` is usable on the new primary
//!
//! let mut kafka = KafkaCluster::start(KafkaClusterOptions::default())?;
//! kafka.create_topic("orders", 3, 3)?;
//! let leader = kafka.leader_of("orders", 0)?;
//! kafka.kill(leader)?;
//! kafka.wait_for_leader("orders", 0, std::time::Duration::from_secs(30), |l| l != leader)?;
//! kafka.start_again(leader)?; // back in every ISR
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
//! | `WALPOST_PG_CACHE`, `WALPOST_PG_NPM_VERSION` | read by `scripts/fetch-postgres.sh`, which [`pg_bin_dir_for_major`] runs when the wanted major is neither the default nor Debian's (installs under `$HOME/.cache/walpost/pg-MAJOR`, or `/var/cache/walpost/pg-MAJOR` as root). |
//! | `WALPOST_KAFKA_LIBS` | directory with the Kafka class path (the jars). Default `$HOME/.cache/walpost/kafka-4.1.1/libs`. Considered complete when it holds the marker file `.walpost-complete`. |
//! | `WALPOST_TOOLS_CACHE` | where `scripts/fetch-test-tools.sh` builds and installs the test tools. Default `$HOME/.cache/walpost/tools`. |
//! | `WALPOST_APICURIO_DIR` | the built Apicurio Registry (a Quarkus `quarkus-app` directory with `quarkus-run.jar`) [`SchemaRegistry`] runs. Default `<tools cache>/apicurio-2.4.2`, used when it holds the marker `.walpost-complete`. |
//! | `WALPOST_CE_PYTHON` | the Python [`python`] returns. Default `<tools cache>/ce-venv/bin/python`. |
//! | `WALPOST_KEEP_TEST_DIRS` | if set (to anything), temporary server directories (data, config, logs) are kept instead of deleted, and their paths are printed to stderr. |
//! | `WALPOST_KAFKA_NO_CDS` | if set, do not use/create AppCDS archives (`<libs>/../cds/*.jsa`, which halve JVM start-up; the schema registry's are in `<apicurio dir>/cds/`). |
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
//! * Kafka Transactions work on the single-node [`Kafka`] (transaction state log
//!   replication factor 1, min ISR 1; `tests/smoke.rs` commits with a transactional
//!   producer, `TransactionsCommand describe` shows `CompleteCommit`, a `read_committed`
//!   consumer sees every record) and on [`KafkaCluster`] (RF 3, min ISR 2, also with one
//!   node down).
//! * [`KafkaCluster`]: nodes `1..=N` in `DIR/node-ID/`, a static quorum
//!   (`controller.quorum.voters` lists all N), each JVM `-Xms128m -Xmx256m` and C1-only
//!   JIT by default ([`KafkaClusterOptions`]); `log.cleaner.dedupe.buffer.size` is cut to
//!   16 MiB (the default, 128 MiB, is taken from the heap). Three nodes use ~550 MiB RSS
//!   together. [`KafkaCluster::bootstrap`] lists every node; a client given it survives
//!   any one node's loss. A killed node stays leader of its partitions until the
//!   controller fences it (`broker.session.timeout.ms` = 4 s): leadership moved ~6 s
//!   after a SIGKILL. A clean [`KafkaCluster::stop`] moves leaderships first (controlled
//!   shutdown). Metadata answers are per node and may lag by milliseconds:
//!   [`KafkaCluster::leader_of`] asks every running node and believes the highest leader
//!   epoch; [`KafkaCluster::wait_healthy`] waits until all running nodes agree. The
//!   `controller_id` of a KRaft Metadata answer is a random broker, so it is not exposed.
//! * Measured on this project's shared 2-core machine (idle-ish, load ~3 / under other
//!   engineers' builds, load ~13-15): 3-node [`KafkaCluster::start`] 6.4-6.8 s / 19-23 s
//!   (first run ever, without AppCDS archives: 64 s); [`KafkaCluster::start_again`]
//!   until back in every ISR 2.6-3.0 s / 6-8 s; [`KafkaCluster::stop`] ~1.6 s / 2-3 s;
//!   [`KafkaCluster::create_topic`] ~1.5 s; each `tests/kafka_cluster.rs` test ~28 s /
//!   ~60 s. [`Postgres::start_standby`] 0.5-3 s (mostly the checkpoint of
//!   `pg_backup_start` and copying ~40 MB); [`Postgres::promote`] 120-160 ms; a failover
//!   slot synced 0.15-0.6 s after the primary consumed.
//! * Standbys ([`Postgres::start_standby`]): the base copy uses the low-level backup
//!   API (`pg_backup_start`/`pg_backup_stop`, on 14 `pg_start_backup`/`pg_stop_backup`
//!   non-exclusive) in one psql session while this process copies the data directory
//!   (without `postmaster.pid`, WAL, `pg_replslot` and other runtime state), so it works
//!   with the npm server builds, which lack `pg_basebackup`. The primary gets a physical
//!   slot (WAL reserved before the copy); drop standbys before their primary and call
//!   [`Postgres::drop_standby_slot`] on a primary that lives on. Verified on 14, 15,
//!   16, 17, 18: rows replicate, the standby is read-only, promotion makes it writable on
//!   timeline 2.
//! * Failover slots (17+; verified on 17 and 18): the standby has
//!   `sync_replication_slots = on`, the primary `synchronized_standby_slots = <standby
//!   slot>`. PostgreSQL's sync worker only persists a slot once the primary slot's
//!   `restart_lsn`/`catalog_xmin` have moved past what the standby reserved: a fresh slot
//!   on an idle primary needs a running-xacts record and a consume
//!   ([`Postgres::log_standby_snapshot`], then `pg_logical_slot_get_changes`); a slot
//!   older than the standby's base copy cannot sync until it moves past the copy's start.
//!   `synced = true` may describe an older position, so [`Postgres::wait_slot_synced`]
//!   waits for the primary slot's `confirmed_flush_lsn` (a promotion right after a
//!   consume otherwise re-decodes the consumed changes — observed). On the standby a
//!   synced slot refuses decoding ("This replication slot is being synchronized from the
//!   primary server"); after [`Postgres::promote`] it still shows `synced = t` (also on
//!   18) but decodes exactly the changes after its confirmed position.
//! * Schema registry: ready ~4-6 s after [`SchemaRegistry::start`] on an idle 2-core
//!   machine (~185-200 MB RSS; JVM `-Xmx256m`, serial GC, C1 only). Its global
//!   compatibility is set to `BACKWARD` (Confluent's default; Apicurio's is `NONE`). Schema
//!   ids are Apicurio content ids and some error codes differ from Confluent's (see
//!   [`SchemaRegistry`]). Storage is in memory: [`SchemaRegistry::stop`] and
//!   [`SchemaRegistry::restart`] lose every schema.
//! * Servers print one line to stderr when ready (port, timing, directory); on failure
//!   the error includes the tail of the server log.
//!
//! # Cleanup / orphans
//!
//! Each server (each [`KafkaCluster`]: one for all its nodes) gets a tiny watchdog process (`sh`, in its own process group) whose stdin
//! is a pipe held by the test process. When the test process ends for **any** reason
//! (normal exit — statics such as [`shared_kafka`] are never dropped —, panic, `SIGKILL`,
//! Ctrl-C) the pipe closes and the watchdog kills the server (PostgreSQL: `SIGQUIT`, i.e.
//! immediate shutdown, then `SIGKILL`; Kafka and the schema registry: `SIGKILL`) and deletes its directory
//! (unless `WALPOST_KEEP_TEST_DIRS` is set). Servers owned by a value are also cleaned up
//! synchronously by its `Drop`.

mod cluster;
mod kafka;
mod kafka_meta;
mod pg;
mod proxy;
mod registry;
mod util;
pub mod webdriver;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use cluster::{KafkaCluster, KafkaClusterOptions, CLUSTER_SETTLE_TIMEOUT};
pub use kafka::{Kafka, KafkaOptions};
pub use kafka_meta::{fetch_metadata, BrokerMetadata, Metadata, PartitionMetadata, TopicMetadata};
pub use pg::{
    make_tls_files, pg_bin_dir_for_major, pg_bin_major, pg_default_bin_dir, PgOptions, Postgres, StandbyOptions,
    StopMode, STANDBY_TIMEOUT,
};
pub use proxy::Proxy;
pub use registry::{apicurio_dir, python, tools_cache_dir, SchemaRegistry, APICURIO_VERSION, DEFAULT_COMPATIBILITY};
pub use util::{free_port, unique_name};
pub use webdriver::{Browser, Chromedriver, Element};

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

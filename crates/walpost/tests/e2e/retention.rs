//! The partitioned outbox (migration 0002) and partition retention.
//!
//! The rule under test (crates/walpost/src/retention.rs): a partition whose whole range
//! is older than the retention period is sealed (read-only, WAL position W recorded
//! under its lock) and dropped only once the slot's confirmed_flush_lsn >= W.

#![allow(clippy::unwrap_used)] // tests may fail loudly

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use testkit::Postgres;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);
pub(crate) const MIGRATION_0002: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations/outbox/0002_outbox_partitioned.sql");

/// Runs migration 0002 as the table's owner, walpost's role (docs/least-privilege.md,
/// recipe B): it needs no superuser.
fn apply_0002(w: &World) -> String {
    let sql = std::fs::read_to_string(MIGRATION_0002).expect("read migration 0002");
    w.pg.psql_as(&w.role, &w.db, &sql).unwrap_or_else(|e| panic!("migration 0002 as {}: {e}", w.role))
}

/// A database with migrations 0001 and 0002 applied back to back (a fresh install).
fn partitioned_world(name: &str) -> World {
    let w = World::new(name);
    apply_0002(&w);
    w
}

/// The UTC day `offset` days from today: (`YYYYMMDD`, `YYYY-MM-DD 00:00:00+00`).
fn day(w: &World, offset: i32) -> (String, String) {
    let out = w.sql(&format!(
        "SELECT to_char(d AT TIME ZONE 'UTC', 'YYYYMMDD') || '|' || to_char(d AT TIME ZONE 'UTC', 'YYYY-MM-DD') || ' 00:00:00+00'
         FROM (SELECT date_trunc('day', now(), 'UTC') + interval '24 hours' * {offset} AS d) x"
    ));
    let (a, b) = out.split_once('|').unwrap();
    (a.to_owned(), b.to_owned())
}

/// Creates the daily partition for `offset` days from today; returns its name.
fn old_partition(w: &World, offset: i32) -> String {
    let (ymd, from) = day(w, offset);
    let (_, to) = day(w, offset + 1);
    let name = format!("outbox_p{ymd}");
    // As the table owner (walpost's role), like the partitions retention creates itself.
    let create =
        format!("CREATE TABLE events.{name} PARTITION OF events.outbox FOR VALUES FROM ('{from}') TO ('{to}')");
    w.pg.psql_as(&w.role, &w.db, &create).unwrap_or_else(|e| panic!("{create}: {e}"));
    name
}

/// Partitions of events.outbox, by name.
fn partitions(w: &World) -> Vec<String> {
    let out = w.sql(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
         WHERE i.inhparent = 'events.outbox'::regclass ORDER BY 1",
    );
    out.lines().map(str::to_owned).collect()
}

fn exists(w: &World, table: &str) -> bool {
    w.sql(&format!("SELECT to_regclass('events.{table}') IS NOT NULL")) == "t"
}

/// Inserts `n` events with `occurred_at` = `at` (SQL expression) in one transaction.
fn insert_at(w: &World, n: u32, at: &str, tag: &str) {
    w.sql(&format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload, occurred_at)
         SELECT 'order', ('00000000-0000-4000-8000-' || lpad((g % 20)::text, 12, '0'))::uuid, '{tag}',
                jsonb_build_object('tag', '{tag}', 'n', g), {at}
         FROM generate_series(1, {n}) g"
    ));
}

/// The seal's WAL position recorded on `partition`, if sealed.
fn seal_lsn(w: &World, partition: &str) -> Option<u64> {
    let c = w.sql(&format!(
        "SELECT obj_description(oid, 'pg_constraint') FROM pg_constraint
         WHERE conrelid = to_regclass('events.{partition}') AND conname = 'walpost_retired'"
    ));
    let lsn = c.strip_prefix("walpost retention: sealed at WAL ")?.split(';').next()?;
    parse_lsn(lsn)
}

fn fmt_lsn(l: u64) -> String {
    format!("{:X}/{:X}", l >> 32, l & 0xFFFF_FFFF)
}

/// Output of `walpost retention`.
struct Pass {
    ok: bool,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Pass {
    /// The line of `partition`: (action, reason).
    fn line(&self, partition: &str) -> Option<(String, String)> {
        let name = format!("events.{partition}");
        let line = self.stdout.lines().find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
        // name, range (two words unless DEFAULT), action, reason
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = if words.get(1) == Some(&"DEFAULT") { 2 } else { 3 };
        Some((words.get(at)?.to_string(), words.get(at + 1)?.to_string()))
    }

    fn expect(&self, partition: &str, action: &str, reason: &str) {
        let got = self.line(partition);
        assert_eq!(
            got.as_ref().map(|(a, r)| (a.as_str(), r.as_str())),
            Some((action, reason)),
            "{partition}: expected {action} {reason}\nstdout:\n{}\nstderr:\n{}",
            self.stdout,
            self.stderr
        );
    }
}

fn retention_args(w: &World, slot: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> =
        vec!["retention".into(), "--postgres".into(), w.url.clone(), "--slot".into(), slot.into()];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run_retention(w: &World, slot: &str, extra: &[&str]) -> Pass {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_walpost"))
        .args(retention_args(w, slot, extra))
        .env("WALPOST_LOG", "info,walpost=debug")
        .output()
        .expect("run walpost retention");
    Pass {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        took: started.elapsed(),
    }
}

fn retention_ok(w: &World, slot: &str, extra: &[&str]) -> Pass {
    let p = run_retention(w, slot, extra);
    assert!(p.ok, "walpost retention failed\nstdout:\n{}\nstderr:\n{}", p.stdout, p.stderr);
    p
}

fn config_file(w: &World, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}-retention.toml", w.db));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// Every expected row in Kafka exactly once, with its content, and nothing else.
fn assert_exactly_once(w: &World, expected: &BTreeMap<i64, Row>, records: &[Consumed]) {
    let mut seen: HashMap<i64, usize> = HashMap::new();
    let mut wrong = Vec::new();
    for r in records {
        let id = r.event_id();
        *seen.entry(id).or_insert(0) += 1;
        match expected.get(&id) {
            Some(row) => {
                let ok = r.topic == w.topic(&row.aggregate_type)
                    && r.key.as_deref() == Some(row.aggregate_id.as_bytes())
                    && r.value.as_deref() == Some(row.payload.as_bytes());
                if !ok {
                    wrong.push(id);
                }
            }
            None => wrong.push(id),
        }
    }
    let lost: Vec<i64> = expected.keys().filter(|id| !seen.contains_key(id)).copied().collect();
    let dups: Vec<i64> = seen.iter().filter(|(_, n)| **n > 1).map(|(id, _)| *id).collect();
    assert!(lost.is_empty(), "lost {} events, first {:?}", lost.len(), &lost[..lost.len().min(10)]);
    assert!(dups.is_empty(), "duplicated events: {dups:?}");
    assert!(wrong.is_empty(), "phantom or wrong events: {wrong:?}");
    assert_eq!(records.len(), expected.len());
}

/// Background writer: small transactions of 5 events at now(), until stopped.
struct Writer {
    stop: Arc<AtomicBool>,
    commits: Arc<AtomicU32>,
    handle: Option<JoinHandle<()>>,
}

impl Writer {
    fn start(pg: &'static Postgres, db: &str, tag: &'static str) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let commits = Arc::new(AtomicU32::new(0));
        let (s, c, db) = (stop.clone(), commits.clone(), db.to_owned());
        let handle = std::thread::spawn(move || {
            let mut i = 0u32;
            while !s.load(Ordering::Relaxed) {
                let sql = format!(
                    "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
                     SELECT (ARRAY['order','payment'])[1 + g % 2],
                            ('00000000-0000-4000-8000-' || lpad((({i} + g) % 30)::text, 12, '0'))::uuid,
                            '{tag}{i}', jsonb_build_object('w', {i}, 'n', g)
                     FROM generate_series(1, 5) g"
                );
                // The only failure tolerated: the migration's lock wait is over (retry).
                if pg.psql_db(&db, &sql).is_ok() {
                    c.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Writer { stop, commits, handle: Some(handle) }
    }

    fn wait_commits(&self, n: u32) {
        assert!(testkit::wait_until(WAIT, || self.commits.load(Ordering::Relaxed) >= n), "writer stalled");
    }

    fn stop(mut self) -> u32 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            h.join().unwrap();
        }
        self.commits.load(Ordering::Relaxed)
    }
}

/// Migrations 0001 + 0002 on an empty database: the partitioned table, its key, indexes,
/// partitions named by range from today to 3 days ahead, the sequence, the publication;
/// re-running either migration changes nothing.
#[test]
fn migrations_on_an_empty_database_build_the_partitioned_outbox() {
    let w = partitioned_world("ret-fresh");
    assert_eq!(w.sql("SELECT relkind FROM pg_class WHERE oid = 'events.outbox'::regclass"), "p");
    assert_eq!(w.sql("SELECT pg_get_partkeydef('events.outbox'::regclass)"), "RANGE (occurred_at)");
    assert_eq!(
        w.sql("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'events.outbox'::regclass AND contype = 'p'"),
        "PRIMARY KEY (id, occurred_at)"
    );
    assert_eq!(
        w.sql("SELECT indexdef FROM pg_indexes WHERE schemaname = 'events' AND indexname = 'outbox_aggregate_idx'"),
        "CREATE INDEX outbox_aggregate_idx ON ONLY events.outbox USING btree (aggregate_type, aggregate_id, id)"
    );
    let expected: Vec<String> = (0..=3).map(|k| format!("outbox_p{}", day(&w, k).0)).collect();
    assert_eq!(partitions(&w), expected, "today and 3 days ahead, named by range");
    let (_, today) = day(&w, 0);
    let (_, tomorrow) = day(&w, 1);
    assert_eq!(
        w.sql(&format!("SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = '{}'", expected[0])),
        format!("FOR VALUES FROM ('{today}') TO ('{tomorrow}')")
    );
    assert!(!exists(&w, "outbox_legacy"), "an empty 0001 table is dropped, not attached");
    // Ids still come from the 0001 sequence, now owned by the partitioned table.
    assert_eq!(w.sql("SELECT pg_get_serial_sequence('events.outbox', 'id')"), "events.outbox_id_seq");
    assert_eq!(
        w.sql("SELECT pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot FROM pg_publication WHERE pubname = 'walpost_outbox'"),
        "t|f|f|f|t"
    );
    assert_eq!(
        w.sql("SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = 'walpost_outbox'"),
        "events.outbox"
    );
    // Idempotent: both migrations again change nothing.
    let before = w.sql("SELECT count(*) FROM pg_class");
    apply_0002(&w);
    w.sql(&std::fs::read_to_string(MIGRATION_0001).unwrap());
    assert_eq!(w.sql("SELECT count(*) FROM pg_class"), before);
    assert_eq!(partitions(&w), expected);
    // A service's insert lands in today's partition with the next id.
    let got = w.sql(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', gen_random_uuid(), 'Created', '{}') RETURNING id, tableoid::regclass",
    );
    assert_eq!(got, format!("1|events.{}", expected[0]));
}

/// After a pass the partitions ahead exist (a dry run creates nothing);
/// rows at a range boundary land in the partition whose range starts there.
#[test]
fn pass_creates_partitions_ahead_and_boundary_rows_land_in_the_right_partition() {
    let w = partitioned_world("ret-ahead");
    let dry = retention_ok(&w, &w.slot, &["--days-ahead", "6", "--dry-run"]);
    for k in 4..=6 {
        dry.expect(&format!("outbox_p{}", day(&w, k).0), "would-create", "ahead");
    }
    assert_eq!(partitions(&w).len(), 4, "a dry run changes nothing");

    let pass = retention_ok(&w, &w.slot, &["--days-ahead", "6"]);
    let expected: Vec<String> = (0..=6).map(|k| format!("outbox_p{}", day(&w, k).0)).collect();
    for name in &expected[4..] {
        pass.expect(name, "created", "ahead");
    }
    pass.expect(&expected[0], "kept", "not_old_enough");
    assert_eq!(partitions(&w), expected);
    // A second pass has nothing to create.
    let again = retention_ok(&w, &w.slot, &["--days-ahead", "6"]);
    assert!(!again.stdout.contains("created"), "{}", again.stdout);

    // Boundaries: [D, D+1) holds D 00:00:00 and not D+1 00:00:00.
    let (_, d5) = day(&w, 5);
    let landed = |at: &str| {
        w.sql(&format!(
            "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload, occurred_at)
             VALUES ('order', gen_random_uuid(), 'Boundary', '{{}}', {at}) RETURNING tableoid::regclass"
        ))
    };
    assert_eq!(landed(&format!("'{d5}'")), format!("events.{}", expected[5]));
    assert_eq!(landed(&format!("'{d5}'::timestamptz - interval '1 microsecond'")), format!("events.{}", expected[4]));
    assert_eq!(
        landed(&format!("'{d5}'::timestamptz + interval '1 day' - interval '1 microsecond'")),
        format!("events.{}", expected[5])
    );
    // The partition walpost created has the table's key and indexes.
    assert_eq!(
        w.sql(&format!("SELECT count(*) FROM pg_index WHERE indrelid = 'events.{}'::regclass", expected[6])),
        "3"
    );
}

/// The rule's edge, exactly: an expired partition is sealed, kept while
/// the slot's confirmed_flush_lsn is W - 1 and dropped at W. A partition whose range ends
/// less than keep_days ago is not touched; without a usable slot nothing is dropped.
#[test]
fn expired_partition_is_dropped_exactly_when_the_slot_confirms_its_seal() {
    let w = partitioned_world("ret-edge");
    let expired = old_partition(&w, -8); // [D-8, D-7): ends at or before now() - 7 days
    let recent = old_partition(&w, -7); // [D-7, D-6): ends after now() - 7 days
    insert_at(&w, 50, &format!("'{}'::timestamptz + interval '1 hour'", day(&w, -8).1), "old");
    insert_at(&w, 50, &format!("'{}'::timestamptz + interval '1 hour'", day(&w, -7).1), "recent");
    // A slot of our own, moved by hand (pg_replication_slot_advance) to the edge.
    let slot = format!("{}_edge", w.slot);
    w.sql(&format!("SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"));

    let dry = retention_ok(&w, &slot, &["--dry-run"]);
    dry.expect(&expired, "would-seal", "expired");
    dry.expect(&recent, "kept", "not_old_enough");
    assert!(seal_lsn(&w, &expired).is_none(), "a dry run seals nothing");

    let missing = retention_ok(&w, "no_such_slot", &[]);
    missing.expect(&expired, "sealed", "slot_missing");
    let wal = seal_lsn(&w, &expired).expect("sealed");
    missing.expect(&recent, "kept", "not_old_enough");
    // Sealed: rows readable, no row can be added.
    assert_eq!(w.sql(&format!("SELECT count(*) FROM events.{expired}")), "50");
    let refused = w.try_sql(&format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload, occurred_at)
         VALUES ('order', gen_random_uuid(), 'Late', '{{}}', '{}'::timestamptz + interval '2 hours')",
        day(&w, -8).1
    ));
    assert!(refused.unwrap_err().contains("walpost_retired"));

    let behind = retention_ok(&w, &slot, &[]);
    behind.expect(&expired, "kept", "slot_behind");
    w.sql(&format!("SELECT pg_replication_slot_advance('{slot}', '{}')", fmt_lsn(wal - 1)));
    retention_ok(&w, &slot, &[]).expect(&expired, "kept", "slot_behind");
    assert!(exists(&w, &expired));
    assert_eq!(seal_lsn(&w, &expired), Some(wal), "the seal stays put");

    w.sql(&format!("SELECT pg_replication_slot_advance('{slot}', '{}')", fmt_lsn(wal)));
    let dropped = retention_ok(&w, &slot, &[]);
    dropped.expect(&expired, "dropped", "expired");
    dropped.expect(&recent, "kept", "not_old_enough");
    assert!(!exists(&w, &expired));
    assert!(exists(&w, &recent));
    assert_eq!(w.sql(&format!("SELECT count(*) FROM events.{recent}")), "50");
    w.sql(&format!("SELECT pg_drop_replication_slot('{slot}')"));
}

/// The rule with walpost itself: rows in an expired partition that walpost
/// has not confirmed (it is paused with SIGSTOP) keep the partition; after SIGCONT it
/// catches up and the next pass drops it. Writers keep inserting across every drop and
/// every event reaches Kafka exactly once.
#[test]
fn unconfirmed_rows_keep_their_partition_until_walpost_catches_up() {
    let w = partitioned_world("ret-paused");
    let first = old_partition(&w, -20);
    let second = old_partition(&w, -19);
    // Passes by hand only: no retention task inside this walpost.
    let mut args = w.args();
    args.extend(["--config".into(), config_file(&w, "[retention]\nenabled = false\n")]);
    let mut walpost = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", walpost.log_text());
    let writer = Writer::start(w.pg, &w.db, "live");
    insert_at(&w, 100, &format!("'{}'::timestamptz + interval '5 hours'", day(&w, -20).1), "first");
    insert_at(&w, 100, &format!("'{}'::timestamptz + interval '5 hours'", day(&w, -19).1), "second");
    writer.wait_commits(10);
    let mut expected = w.committed_rows();

    // Confirmed rows: sealed, then dropped once the slot passes the seal.
    let pass = retention_ok(&w, &w.slot, &[]);
    pass.expect(&first, "sealed", "slot_behind");
    pass.expect(&second, "sealed", "slot_behind");
    let wal = seal_lsn(&w, &first).unwrap().max(seal_lsn(&w, &second).unwrap());
    assert!(testkit::wait_until(WAIT, || w.confirmed_flush_lsn().unwrap() >= wal), "{}", walpost.log_text());
    let pass = retention_ok(&w, &w.slot, &[]);
    pass.expect(&first, "dropped", "expired");
    pass.expect(&second, "dropped", "expired");
    assert!(!exists(&w, &first) && !exists(&w, &second));

    // Unconfirmed rows: walpost is frozen when they commit.
    let third = old_partition(&w, -18);
    walpost.signal("-STOP");
    std::thread::sleep(Duration::from_millis(500));
    insert_at(&w, 100, &format!("'{}'::timestamptz + interval '5 hours'", day(&w, -18).1), "third");
    writer.wait_commits(writer.commits.load(Ordering::Relaxed) + 5);
    expected.extend(w.committed_rows());
    let pass = retention_ok(&w, &w.slot, &[]);
    pass.expect(&third, "sealed", "slot_behind");
    let wal = seal_lsn(&w, &third).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let pass = retention_ok(&w, &w.slot, &[]);
    pass.expect(&third, "kept", "slot_behind");
    assert!(w.confirmed_flush_lsn().unwrap() < wal);
    assert_eq!(w.sql(&format!("SELECT count(*) FROM events.{third}")), "100");

    walpost.signal("-CONT");
    assert!(testkit::wait_until(WAIT, || w.confirmed_flush_lsn().unwrap() >= wal), "{}", walpost.log_text());
    retention_ok(&w, &w.slot, &[]).expect(&third, "dropped", "expired");
    assert!(!exists(&w, &third));

    writer.wait_commits(writer.commits.load(Ordering::Relaxed) + 5);
    writer.stop();
    expected.extend(w.committed_rows());
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, expected.len(), WAIT);
    std::thread::sleep(Duration::from_secs(1));
    let records = if read_all(&w.kafka_bootstrap, &w.topic_prefix).len() != records.len() {
        read_all(&w.kafka_bootstrap, &w.topic_prefix)
    } else {
        records
    };
    assert_exactly_once(&w, &expected, &records);
    let status = walpost.terminate(Duration::from_secs(60)).expect("walpost did not stop");
    assert!(status.success(), "{}", walpost.log_text());
}

/// The retention task inside `walpost run`: creates the partitions ahead, seals and then
/// drops an expired one while a writer streams; counted in the metrics; no event lost or
/// duplicated across the drop.
#[test]
fn run_task_keeps_partitions_ahead_and_drops_expired_ones_while_streaming() {
    let w = partitioned_world("ret-task");
    // The slot first (`walpost slot create`), so that the old rows below are streamed.
    let mut create = w.args();
    create[0] = "create".into();
    create.insert(0, "slot".into());
    let out = Command::new(env!("CARGO_BIN_EXE_walpost")).args(&create).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let expired = old_partition(&w, -10);
    insert_at(&w, 200, &format!("'{}'::timestamptz + interval '3 hours'", day(&w, -10).1), "old");
    let cfg =
        config_file(&w, "[retention]\nenabled = true\ninterval_secs = 1\ndays_ahead = 5\nlock_timeout_ms = 500\n");
    let port = testkit::free_port();
    let mut args = w.args();
    args.extend(["--config".into(), cfg, "--metrics-addr".into(), format!("127.0.0.1:{port}")]);
    let mut walpost = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", walpost.log_text());
    let writer = Writer::start(w.pg, &w.db, "live");
    writer.wait_commits(5);
    let mut expected = w.committed_rows();
    let ahead = format!("outbox_p{}", day(&w, 5).0);
    assert!(testkit::wait_until(WAIT, || exists(&w, &ahead)), "{}", walpost.log_text());
    assert!(testkit::wait_until(WAIT, || !exists(&w, &expired)), "not dropped:\n{}", walpost.log_text());
    writer.wait_commits(writer.commits.load(Ordering::Relaxed) + 10);
    writer.stop();
    expected.extend(w.committed_rows());
    let log = walpost.log_text();
    assert!(log.contains("retention: created"), "{log}");
    assert!(log.contains("retention: sealed"), "{log}");
    assert!(log.contains("retention: dropped"), "{log}");

    let metrics = scrape(port);
    let value = |series: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{series} missing:\n{metrics}"))
    };
    assert!(value("walpost_retention_partitions_created_total ") >= 2, "{metrics}");
    assert_eq!(value("walpost_retention_partitions_sealed_total "), 1, "{metrics}");
    assert_eq!(value("walpost_retention_partitions_dropped_total "), 1, "{metrics}");
    assert!(value("walpost_retention_partitions_skipped_total{reason=\"slot_behind\"} ") >= 1, "{metrics}");
    assert!(value("walpost_retention_passes_total{result=\"ok\"} ") >= 2, "{metrics}");
    assert!(value("walpost_retention_last_success_timestamp_seconds ") > 1_700_000_000, "{metrics}");

    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, expected.len(), WAIT);
    assert_exactly_once(&w, &expected, &records);
    assert!(walpost.terminate(Duration::from_secs(60)).unwrap().success());
}

fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics endpoint");
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// A pass never waits long for a lock (skips with lock_timeout and retries next time),
/// warns about a default partition that holds rows and never drops it.
#[test]
fn busy_partition_is_skipped_on_lock_timeout_and_default_partition_is_reported() {
    let w = partitioned_world("ret-locks");
    let expired = old_partition(&w, -9);
    insert_at(&w, 10, &format!("'{}'::timestamptz + interval '1 hour'", day(&w, -9).1), "old");
    w.pg.psql_as(&w.role, &w.db, "CREATE TABLE events.outbox_default PARTITION OF events.outbox DEFAULT")
        .expect("default partition");
    insert_at(&w, 3, "'2001-01-01 00:00:00+00'", "ancient");
    let cfg = config_file(&w, "[retention]\nlock_timeout_ms = 300\n");

    // A reader holds the partition for a while (an audit query, say).
    let holder = {
        let (pg, db, t) = (w.pg, w.db.clone(), expired.clone());
        std::thread::spawn(move || {
            pg.psql_db(&db, &format!("BEGIN; LOCK TABLE events.{t} IN ACCESS SHARE MODE; SELECT pg_sleep(6); COMMIT;"))
        })
    };
    std::thread::sleep(Duration::from_millis(800));
    let pass = retention_ok(&w, &w.slot, &["--config", &cfg]);
    pass.expect(&expired, "kept", "lock_timeout");
    pass.expect("outbox_default", "kept", "default_partition");
    assert!(pass.stdout.contains("holds rows"), "{}", pass.stdout);
    assert!(pass.took < Duration::from_secs(5), "the pass waited {:?}", pass.took);
    assert!(seal_lsn(&w, &expired).is_none());
    holder.join().unwrap().expect("holder");

    let pass = retention_ok(&w, &w.slot, &["--config", &cfg]);
    pass.expect(&expired, "sealed", "slot_missing");
    assert!(exists(&w, "outbox_default"));
    assert_eq!(w.sql("SELECT count(*) FROM events.outbox_default"), "3");
}

/// The migration path: walpost streams while writers insert and migration 0002
/// converts the populated 0001 table (one writer's transaction even spans the start of
/// the conversion): every event is published exactly once, the old rows stay readable
/// through events.outbox in the attached legacy partition, and an application role keeps
/// its grants.
#[test]
fn migration_under_load_publishes_every_event_exactly_once() {
    let w = World::new("ret-migrate");
    w.sql(&format!(
        "CREATE ROLE app_{s} LOGIN; GRANT USAGE ON SCHEMA events TO app_{s};
         GRANT INSERT, SELECT ON events.outbox TO app_{s}; GRANT USAGE ON SEQUENCE events.outbox_id_seq TO app_{s};",
        s = w.slot
    ));
    let walpost = w.start_walpost();
    assert!(w.wait_for_slot(WAIT), "{}", walpost.log_text());
    insert_batches(&w, 0, 20, 50, 20, &["order", "payment"]);
    let writer = Writer::start(w.pg, &w.db, "pre");
    writer.wait_commits(20);
    // A transaction open across the start of the conversion: the migration waits for it.
    let straddler = {
        let (pg, db) = (w.pg, w.db.clone());
        std::thread::spawn(move || {
            pg.psql_db(
                &db,
                "BEGIN;
                 INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('order', '00000000-0000-4000-8000-0000000000ff', 'Straddle', '{\"n\": 1}');
                 SELECT pg_sleep(2);
                 INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('order', '00000000-0000-4000-8000-0000000000ff', 'Straddle', '{\"n\": 2}');
                 COMMIT;",
            )
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    let before = w.sql("SELECT count(*) FROM events.outbox").parse::<usize>().unwrap();
    apply_0002(&w);
    straddler.join().unwrap().expect("straddling transaction");
    // Rows of today go to the legacy partition (its range ends tomorrow), rows of tomorrow
    // to a daily one: both through the new table.
    insert_at(&w, 20, &format!("'{}'::timestamptz + interval '1 hour'", day(&w, 1).1), "tomorrow");
    writer.wait_commits(writer.commits.load(Ordering::Relaxed) + 20);
    let app_insert = w.pg.psql_as(
        &format!("app_{}", w.slot),
        &w.db,
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', gen_random_uuid(), 'FromApp', '{}') RETURNING tableoid::regclass",
    );
    assert!(app_insert.is_ok(), "the application role lost its grants: {app_insert:?}");
    writer.stop();

    assert_eq!(w.sql("SELECT relkind FROM pg_class WHERE oid = 'events.outbox'::regclass"), "p");
    assert!(partitions(&w).contains(&"outbox_legacy".to_string()), "{:?}", partitions(&w));
    let legacy_rows: usize = w.sql("SELECT count(*) FROM events.outbox_legacy").parse().unwrap();
    assert!(legacy_rows >= before, "legacy rows {legacy_rows} < {before} committed before the migration");
    assert_eq!(
        w.sql(&format!("SELECT string_agg(schemaname || '.' || tablename, ',') FROM pg_publication_tables WHERE pubname = '{}_pub'", w.slot)),
        "events.outbox"
    );
    let expected = w.committed_rows();
    assert!(expected.len() > before + 100, "too few rows written after the migration");
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, expected.len(), WAIT);
    std::thread::sleep(Duration::from_secs(2));
    let records_later = read_all(&w.kafka_bootstrap, &w.topic_prefix);
    assert_eq!(records.len(), records_later.len(), "more records arrived later");
    let a = audit(&w, &records);
    assert!(a.lost.is_empty(), "lost {:?}", &a.lost[..a.lost.len().min(10)]);
    assert!(a.phantoms.is_empty() && a.wrong_content.is_empty() && a.reordered.is_empty(), "{a:?}");
    assert_eq!(a.duplicates, 0, "published twice across the migration");
    assert_eq!(records.len(), expected.len());
    drop(walpost);
}

/// The partitioned outbox with `--snapshot initial`: rows in the attached legacy
/// partition and in several daily partitions are snapshotted once, later inserts into
/// any partition are streamed once.
#[test]
fn snapshot_and_stream_read_every_partition_once() {
    let w = World::new("ret-snapshot");
    insert_batches(&w, 0, 10, 100, 20, &["order"]);
    apply_0002(&w);
    for k in 1..=3 {
        insert_at(&w, 50, &format!("'{}'::timestamptz + interval '1 hour'", day(&w, k).1), &format!("ahead{k}"));
    }
    assert!(w.sql("SELECT count(DISTINCT tableoid) FROM events.outbox").parse::<u32>().unwrap() >= 4);
    let snapshotted = w.committed_rows().len();
    let mut args = w.args();
    args.extend(["--snapshot".into(), "initial".into()]);
    let mut walpost = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", walpost.log_text());
    for k in 0..=3 {
        insert_at(&w, 25, &format!("'{}'::timestamptz + interval '2 hours'", day(&w, k).1), &format!("live{k}"));
    }
    let expected = w.committed_rows();
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, expected.len(), WAIT);
    assert_exactly_once(&w, &expected, &records);
    let from_snapshot = records.iter().filter(|r| r.header("walpost.snapshot") == Some(&b"true"[..])).count();
    assert_eq!(from_snapshot, snapshotted, "{}", walpost.log_text());
    assert!(walpost.terminate(Duration::from_secs(60)).unwrap().success());
}

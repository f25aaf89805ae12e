//! `walpost inbox` against a real Kafka and PostgreSQL: records
//! into `inbox.messages` once per event id, with their offsets in the same transaction;
//! kill -9, rebalances and replays neither lose nor duplicate a row; records that cannot
//! be stored halt or are rejected with the reason; a missing schema is a clear error.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;

use crate::drills::metric;
use crate::support::{high_watermarks, insert_batches, strip_ansi, Walpost, World};

pub(crate) const WAIT: Duration = Duration::from_secs(120);

/// The consuming service's database: a world of its own (its outbox tables unused).
/// Whether `walpost inbox --create-schema` applied every inbox migration: each is a
/// transaction of its own, so `inbox.handlers` (the first's) exists while later ones
/// still change the functions a test calls; a call then may deadlock with the migration.
pub(crate) fn inbox_schema_complete(w: &World) -> bool {
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations/inbox"))
        .expect("migrations/inbox")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".sql"))
        .count();
    w.try_sql("SELECT count(*) FROM inbox.walpost_migrations").is_ok_and(|n| n.trim() == files.to_string())
}

pub(crate) fn inbox_db(name: &str) -> World {
    World::new(name)
}

pub(crate) fn inbox_args(inbox: &World, topics: &str, group: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "inbox",
        "--postgres",
        &inbox.superuser_url,
        "--kafka-brokers",
        &inbox.kafka_bootstrap,
        "--topics",
        topics,
        "--group",
        group,
        "--kafka-property",
        "topic.metadata.refresh.interval.ms=1000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

pub(crate) fn start_inbox(args: &[String], env: &[(&str, &str)]) -> Walpost {
    Walpost::start(args, env)
}

pub(crate) fn count(w: &World, sql: &str) -> i64 {
    w.sql(sql).trim().parse().unwrap_or_else(|_| panic!("not a number from {sql}"))
}

/// Messages stored so far (0 before `--create-schema` made the table).
pub(crate) fn messages(w: &World) -> i64 {
    w.try_sql("SELECT count(*) FROM inbox.messages").ok().and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

pub(crate) fn wait_for_messages(w: &World, n: i64, p: &Walpost) {
    let ok = testkit::wait_until(WAIT, || messages(w) >= n);
    assert!(ok, "inbox holds {} of {n} messages:\n{}", messages(w), p.log_text());
}

/// Stored next offset per (topic, partition) of `group`.
pub(crate) fn stored_offsets(w: &World, group: &str) -> BTreeMap<(String, i32), i64> {
    w.sql(&format!("SELECT topic, \"partition\", next_offset FROM inbox.offsets WHERE group_id = '{group}'"))
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            ((f[0].to_owned(), f[1].parse().unwrap()), f[2].parse().unwrap())
        })
        .collect()
}

/// Produces `(key, id header, value)` records to `topic` and waits for the acknowledgements.
pub(crate) fn produce(bootstrap: &str, topic: &str, records: &[(String, Option<String>, Vec<u8>)]) {
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .expect("create producer");
    for (key, id, value) in records {
        let mut record = BaseRecord::to(topic).key(key.as_bytes()).payload(value.as_slice());
        if let Some(id) = id {
            record = record.headers(
                OwnedHeaders::new()
                    .insert(Header { key: "id", value: Some(id.as_bytes()) })
                    .insert(Header { key: "eventType", value: Some(b"T".as_slice()) }),
            );
        }
        let mut pending = record;
        loop {
            match p.send(pending) {
                Ok(()) => break,
                Err((_, back)) => {
                    pending = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    p.flush(Duration::from_secs(60)).expect("flush");
}

pub(crate) fn json_records(
    prefix: &str,
    from: usize,
    n: usize,
    aggregates: usize,
) -> Vec<(String, Option<String>, Vec<u8>)> {
    (from..from + n)
        .map(|i| {
            let value = format!(r#"{{"n": {i}, "note": "{}"}}"#, "x".repeat(900));
            (format!("agg-{}", i % aggregates), Some(format!("{prefix}-{i}")), value.into_bytes())
        })
        .collect()
}

pub(crate) fn create_topic(name: &str, partitions: u32) {
    testkit::shared_kafka().create_topic(name, partitions).expect("create topic");
}

/// The whole producer half into the inbox: every outbox event stored once, with its
/// payload bytes, type and aggregate, and the offsets at the topics' ends; a replay of
/// every event (walpost replay) stores nothing again and counts the duplicates.
#[test]
fn inbox_ingest_stores_every_outbox_event_once_with_its_offsets() {
    let outbox = World::new("inbox-e2e-out");
    let inbox = inbox_db("inbox-e2e-in");
    let run = outbox.start_walpost();
    assert!(outbox.wait_for_slot(WAIT), "{}", run.log_text());
    insert_batches(&outbox, 0, 4, 500, 50, &["order"]);
    let topic = outbox.topic("order");
    let port = testkit::free_port();
    let args = inbox_args(&inbox, &topic, "svc", &["--create-schema", "--metrics-addr", &format!("127.0.0.1:{port}")]);
    let p = start_inbox(&args, &[]);
    wait_for_messages(&inbox, 2000, &p);

    // Each outbox row once, unchanged.
    let committed = outbox.committed_rows();
    let stored: BTreeMap<i64, (String, String, String, String)> = inbox
        .sql("SELECT event_id, aggregate_id, event_type, convert_from(payload, 'UTF8'), payload_json IS NOT NULL FROM inbox.messages")
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.splitn(5, '|').collect();
            (f[0].parse().unwrap(), (f[1].to_owned(), f[2].to_owned(), f[3].to_owned(), f[4].to_owned()))
        })
        .collect();
    assert_eq!(stored.keys().collect::<Vec<_>>(), committed.keys().collect::<Vec<_>>(), "every event once");
    for (id, row) in &committed {
        let (aggregate, event_type, payload, is_json) = &stored[id];
        assert_eq!((aggregate, event_type, is_json.as_str()), (&row.aggregate_id, &row.event_type, "t"), "event {id}");
        let sent: serde_json::Value = serde_json::from_str(payload).unwrap();
        let original: serde_json::Value = serde_json::from_str(&row.payload).unwrap();
        assert_eq!(sent, original, "event {id}: the payload's bytes as walpost run sent them");
    }
    // Offsets at the end of each partition, in the rows' transaction.
    let highs = high_watermarks(&outbox.kafka_bootstrap, &topic);
    let offsets = stored_offsets(&inbox, "svc");
    for ((t, partition), high) in &highs {
        if *high > 0 {
            assert_eq!(offsets.get(&(t.clone(), *partition)), Some(high), "partition {partition}");
        }
    }
    assert!(testkit::wait_until(Duration::from_secs(10), || {
        metric(port, &format!("walpost_inbox_records_total{{result=\"stored\",topic=\"{topic}\"}}")) == Some(2000.0)
    }));

    // A replay of every event: the same ids again, nothing stored twice.
    let mut replay = outbox.args();
    replay[0] = "replay".into();
    replay.extend(["--since".into(), "2000-01-01T00:00:00Z".into()]);
    let out = Command::new(env!("CARGO_BIN_EXE_walpost")).args(&replay).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let duplicates = format!("walpost_inbox_records_total{{result=\"duplicate\",topic=\"{topic}\"}}");
    let counted = testkit::wait_until(WAIT, || metric(port, &duplicates) == Some(2000.0));
    assert!(counted, "duplicates counted: {:?}\n{}", metric(port, &duplicates), p.log_text());
    assert_eq!(count(&inbox, "SELECT count(*) FROM inbox.messages"), 2000, "a replay stores nothing twice");
    let highs = high_watermarks(&outbox.kafka_bootstrap, &topic);
    assert_eq!(stored_offsets(&inbox, "svc").values().sum::<i64>(), highs.values().sum::<i64>());
    assert!(!p.log_text().contains("xxxxxxxx"), "no payload in the log");
}

/// kill -9 at random points of an ingest, and at the crash seams between the COPY and
/// the COMMIT and after the COMMIT: every record is stored once, and the stored offsets
/// end at the topics' ends.
#[test]
fn inbox_kill9_at_any_point_loses_and_duplicates_nothing() {
    let inbox = inbox_db("inbox-kill");
    let topic = format!("{}events", inbox.topic_prefix);
    create_topic(&topic, 3);
    produce(&inbox.kafka_bootstrap, &topic, &json_records("k", 0, 20_000, 97));
    let base = inbox_args(&inbox, &topic, "kill", &["--create-schema"]);
    // Small batches: many transactions, so a kill lands between and inside them.
    let config = inbox.pg.dir().join(format!("{}-inbox.toml", inbox.db));
    std::fs::write(&config, "[inbox]\nbatch_max_records = 200\n").unwrap();
    let mut args = base.clone();
    args.extend(["--config".into(), config.display().to_string()]);

    for seam in ["inbox-after-copy", "inbox-after-commit"] {
        let mut p = start_inbox(&args, &[("FAILPOINTS", &format!("{seam}=return"))]);
        let status = p.wait_exit(WAIT).expect("the crash seam is reached");
        assert!(!status.success(), "{seam}: {}", p.log_text());
        assert!(p.log_text().contains(&format!("failpoint {seam} reached")), "{}", p.log_text());
    }
    let mut rng = 0x2545_f491_u64;
    for kill in 0..6 {
        let mut p = start_inbox(&args, &[]);
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let before = messages(&inbox);
        let moved = testkit::wait_until(WAIT, || messages(&inbox) > before);
        assert!(moved || before == 20_000, "kill {kill}: no progress\n{}", p.log_text());
        std::thread::sleep(Duration::from_millis(100 + rng % 700));
        p.kill9();
    }
    let p = start_inbox(&args, &[]);
    wait_for_messages(&inbox, 20_000, &p);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(count(&inbox, "SELECT count(*) FROM inbox.messages"), 20_000);
    let ids: BTreeSet<String> =
        inbox.sql("SELECT event_id FROM inbox.messages").lines().filter(|l| !l.is_empty()).map(str::to_owned).collect();
    let expected: BTreeSet<String> = (0..20_000).map(|i| format!("k-{i}")).collect();
    assert_eq!(ids, expected, "each record once");
    let highs = high_watermarks(&inbox.kafka_bootstrap, &topic);
    let offsets = stored_offsets(&inbox, "kill");
    assert_eq!(offsets.len(), 3);
    for ((t, partition), high) in highs {
        assert_eq!(offsets.get(&(t, partition)), Some(&high), "partition {partition} ends at its high watermark");
    }
    // Every message reached the deliveries of a handler registered before it arrived.
    assert_eq!(count(&inbox, "SELECT count(*) FROM inbox.rejected"), 0);
}

/// Two instances of one group share the partitions; one joins mid-ingest, the other
/// leaves: cooperative rebalances move partitions only after their records are stored,
/// and the next owner starts at the offsets stored with them.
#[test]
fn inbox_rebalances_hand_partitions_over_at_their_stored_offsets() {
    let inbox = inbox_db("inbox-rebalance");
    let topic = format!("{}events", inbox.topic_prefix);
    create_topic(&topic, 4);
    produce(&inbox.kafka_bootstrap, &topic, &json_records("r", 0, 8_000, 31));
    let args = inbox_args(&inbox, &topic, "pair", &["--create-schema"]);
    let mut a = start_inbox(&args, &[]);
    assert!(testkit::wait_until(WAIT, || messages(&inbox) > 500), "{}", a.log_text());
    let b = start_inbox(&args, &[]);
    // More records while the group rebalances.
    produce(&inbox.kafka_bootstrap, &topic, &json_records("r", 8_000, 8_000, 31));
    let both = testkit::wait_until(WAIT, || b.log_text().contains("partitions assigned"));
    assert!(both, "the second instance got partitions:\n{}", b.log_text());
    assert!(a.terminate(WAIT).is_some_and(|s| s.success()), "{}", a.log_text());
    produce(&inbox.kafka_bootstrap, &topic, &json_records("r", 16_000, 4_000, 31));
    wait_for_messages(&inbox, 20_000, &b);
    let ids: BTreeSet<String> =
        inbox.sql("SELECT event_id FROM inbox.messages").lines().filter(|l| !l.is_empty()).map(str::to_owned).collect();
    assert_eq!(ids, (0..20_000).map(|i| format!("r-{i}")).collect::<BTreeSet<_>>());
    let offsets = stored_offsets(&inbox, "pair");
    for ((t, partition), high) in high_watermarks(&inbox.kafka_bootstrap, &topic) {
        assert_eq!(offsets.get(&(t, partition)), Some(&high), "partition {partition}");
    }
    // Per aggregate, arrival order (seq) is offset order: one partition per key.
    let out_of_order = count(
        &inbox,
        "SELECT count(*) FROM (SELECT \"partition\", \"offset\", lag(\"offset\") OVER (PARTITION BY \"partition\" ORDER BY seq) AS before FROM inbox.messages) m WHERE before > \"offset\"",
    );
    assert_eq!(out_of_order, 0, "a partition's records arrive in offset order");
}

/// No id header, a value over the limit, a value that is not JSON: halt at the first
/// with its position (and again at the same place after a restart), or rejected rows
/// with the reason; a non-JSON value is stored as bytes with payload_json NULL.
#[test]
fn inbox_records_it_cannot_store_halt_or_are_rejected_with_the_reason() {
    let inbox = inbox_db("inbox-invalid");
    let topic = format!("{}mixed", inbox.topic_prefix);
    create_topic(&topic, 1);
    let mut records = json_records("v", 0, 3, 1);
    records.push(("agg".into(), None, b"{\"no\": \"id\"}".to_vec()));
    records.push(("agg".into(), Some("big".into()), vec![b'x'; 5000]));
    records.push(("agg".into(), Some("plain".into()), b"not json at all".to_vec()));
    records.extend(json_records("v", 3, 2, 1));
    produce(&inbox.kafka_bootstrap, &topic, &records);

    // Halt (the default): the three before it are stored, and the position is named.
    for attempt in 0..2 {
        let mut p = start_inbox(&inbox_args(&inbox, &topic, "halt", &["--create-schema"]), &[]);
        let status = p.wait_exit(WAIT).expect("halts");
        let log = strip_ansi(&p.log_text());
        assert_eq!(status.code(), Some(1), "{log}");
        assert!(
            log.contains(&format!("record {topic}/0@3 cannot be stored in the inbox: no_event_id")),
            "attempt {attempt}: {log}"
        );
        assert_eq!(count(&inbox, "SELECT count(*) FROM inbox.messages"), 3, "attempt {attempt}");
        assert_eq!(stored_offsets(&inbox, "halt").get(&(topic.clone(), 0)), Some(&3), "the offset stops at it");
        assert!(!log.contains("\"no\""), "no payload in the log");
    }

    // Reject: rows with the reason, and the records after them stored.
    let config = inbox.pg.dir().join(format!("{}-reject.toml", inbox.db));
    std::fs::write(&config, "[inbox]\nmax_record_bytes = 4096\n").unwrap();
    let mut args = inbox_args(&inbox, &topic, "reject", &["--on-invalid", "reject"]);
    args.extend(["--config".into(), config.display().to_string()]);
    let p = start_inbox(&args, &[]);
    wait_for_messages(&inbox, 6, &p);
    assert!(testkit::wait_until(WAIT, || count(&inbox, "SELECT count(*) FROM inbox.rejected") == 2));
    let rejected = inbox.sql("SELECT \"offset\", reason FROM inbox.rejected ORDER BY \"offset\"");
    assert_eq!(
        rejected.trim(),
        format!(
            "3|no_event_id: the record has none of the headers id, ce_id\n4|value_too_large: the value has 5000 bytes, over inbox.max_record_bytes = 4096"
        )
    );
    assert_eq!(
        inbox.sql("SELECT convert_from(payload, 'UTF8'), payload_json IS NULL FROM inbox.messages WHERE event_id = 'plain'").trim(),
        "not json at all|t"
    );
    assert_eq!(stored_offsets(&inbox, "reject").get(&(topic, 0)), Some(&8));
}

/// Without the schema, or with a column dropped: a definite error naming what is
/// missing and the fix; nothing is consumed.
#[test]
fn inbox_without_its_schema_stops_with_the_fix() {
    let inbox = inbox_db("inbox-noschema");
    let topic = format!("{}t", inbox.topic_prefix);
    create_topic(&topic, 1);
    let mut p = start_inbox(&inbox_args(&inbox, &topic, "g", &[]), &[]);
    assert_eq!(p.wait_exit(WAIT).and_then(|s| s.code()), Some(1));
    let log = strip_ansi(&p.log_text());
    assert!(log.contains("the inbox schema is incomplete (missing: table inbox.messages"), "{log}");
    assert!(log.contains("--create-schema"), "{log}");

    // --create-schema as a role that may not create the schema: exit 1 with the fix.
    inbox.sql(&format!("REVOKE CREATE ON DATABASE \"{}\" FROM {}, PUBLIC", inbox.db, inbox.role));
    let mut args = inbox_args(&inbox, &topic, "g", &["--create-schema"]);
    assert_eq!(args[1], "--postgres");
    args[2] = inbox.url.clone();
    let mut p = start_inbox(&args, &[]);
    assert_eq!(p.wait_exit(WAIT).and_then(|s| s.code()), Some(1), "{}", p.log_text());
    let log = strip_ansi(&p.log_text());
    let expected = ::inbox::messages::inbox_migration_failed("inbox");
    assert!(log.contains(&format!("{expected}: ")) && log.contains("SQLSTATE 42501"), "{log}");

    inbox.sql(&crate::support::inbox_migrations());
    inbox.sql("ALTER TABLE inbox.messages DROP COLUMN aggregate_id CASCADE");
    let mut p = start_inbox(&inbox_args(&inbox, &topic, "g", &[]), &[]);
    assert_eq!(p.wait_exit(WAIT).and_then(|s| s.code()), Some(1));
    let log = strip_ansi(&p.log_text());
    assert!(log.contains("missing: column inbox.messages.aggregate_id"), "{log}");
    let started = Instant::now();
    // And a schema of another name, created by --create-schema.
    let mut args = inbox_args(&inbox, &topic, "g", &["--create-schema", "--schema", "billing_inbox"]);
    args.extend(["--kafka-property".into(), "session.timeout.ms=6000".into()]);
    let mut p = start_inbox(&args, &[]);
    produce(&inbox.kafka_bootstrap, &topic, &json_records("s", 0, 5, 1));
    let ok = testkit::wait_until(WAIT, || {
        inbox.try_sql("SELECT count(*) FROM billing_inbox.messages").is_ok_and(|n| n.trim() == "5")
    });
    assert!(ok, "{}", p.log_text());
    assert!(p.terminate(WAIT).is_some_and(|s| s.success()));
    println!("schema test took {:?}", started.elapsed());
}

/// The messages table dropped while walpost inbox writes: it stops (exit 1) with the
/// schema error and the fix, the stored offset stays where the last committed batch put
/// it, and a start without the table stops the same way before reading (no crash loop
/// that moves anything).
#[test]
fn inbox_tables_dropped_while_running_stop_it_with_the_fix() {
    let inbox = inbox_db("inbox-dropped");
    let topic = format!("{}t", inbox.topic_prefix);
    create_topic(&topic, 1);
    produce(&inbox.kafka_bootstrap, &topic, &json_records("k", 0, 10, 2));
    let mut p = start_inbox(&inbox_args(&inbox, &topic, "g", &["--create-schema"]), &[]);
    wait_for_messages(&inbox, 10, &p);
    assert!(testkit::wait_until(WAIT, || stored_offsets(&inbox, "g").get(&(topic.clone(), 0)) == Some(&10)));
    inbox.sql("DROP TABLE inbox.messages CASCADE");
    produce(&inbox.kafka_bootstrap, &topic, &json_records("k", 10, 5, 2));
    assert_eq!(p.wait_exit(WAIT).and_then(|s| s.code()), Some(1), "{}", p.log_text());
    let log = strip_ansi(&p.log_text());
    assert!(log.contains("the inbox schema is incomplete ("), "{log}");
    assert!(log.contains("run walpost migrate --inbox --schema"), "{log}");
    assert_eq!(stored_offsets(&inbox, "g").get(&(topic.clone(), 0)), Some(&10), "nothing moved past the last commit");
    let mut again = start_inbox(&inbox_args(&inbox, &topic, "g", &[]), &[]);
    assert_eq!(again.wait_exit(WAIT).and_then(|s| s.code()), Some(1));
    assert!(strip_ansi(&again.log_text()).contains("missing: table inbox.messages"), "{}", again.log_text());
    assert_eq!(stored_offsets(&inbox, "g").get(&(topic, 0)), Some(&10));
}

/// `walpost check inbox`: one line per check, FAIL with the fix while the schema is
/// missing (exit 1), ok once it is there; the topic and the group are looked at.
#[test]
fn inbox_check_names_what_is_missing_and_passes_once_it_is_there() {
    let inbox = inbox_db("inbox-check");
    let topic = format!("{}t", inbox.topic_prefix);
    create_topic(&topic, 2);
    let run = |extra: &[&str]| {
        let mut args = inbox_args(&inbox, &topic, "g", extra);
        args.insert(0, "check".into());
        let out = Command::new(env!("CARGO_BIN_EXE_walpost")).args(&args).output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, out) = run(&[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("FAIL  the inbox schema is incomplete (missing: table inbox.messages"), "{out}");
    assert!(out.contains(&format!("ok    topic {topic}: 2 partition(s)")), "{out}");
    inbox.sql(&crate::support::inbox_migrations());
    let (code, out) = run(&[]);
    assert_eq!(code, Some(0), "{out}");
    for line in [
        "ok    inbox schema inbox: its tables and functions are present",
        "ok    the role may write the inbox",
        "ok    group g: 0 partition offset(s) stored; 0 handler(s) registered",
        "ok    3 daily partition(s) of inbox.messages; one covers now",
        "warn  no handler is registered",
        "ok    Kafka at ",
    ] {
        assert!(out.contains(line.trim_end()), "no line {line:?} in:\n{out}");
    }
    assert!(!out.contains("FAIL"), "{out}");
    // The days run out (retention off, days passed): the check names it with the fix.
    inbox.sql(&format!(
        "DROP TABLE inbox.messages_p{}",
        inbox.sql("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')").trim()
    ));
    let (code, out) = run(&[]);
    assert_eq!(code, Some(1), "{out}");
    let expected = ::inbox::messages::inbox_partition_missing("inbox");
    assert!(out.contains(&format!("FAIL  {expected}")), "{out}");
}

/// A topic deleted while consumed and created again: walpost inbox keeps running (no
/// crash loop), and the new topic's records are stored although their offsets are below
/// the stored ones (regression: they were skipped as "stored before").
#[test]
fn regression_a_topic_deleted_and_created_again_is_stored_not_skipped() {
    let inbox = inbox_db("inbox-recreated");
    let topic = format!("{}t", inbox.topic_prefix);
    create_topic(&topic, 1);
    produce(&inbox.kafka_bootstrap, &topic, &json_records("old", 0, 50, 5));
    let mut args = inbox_args(&inbox, &topic, "g", &["--create-schema"]);
    args.extend(["--kafka-property".into(), "topic.metadata.refresh.interval.ms=500".into()]);
    let mut p = start_inbox(&args, &[]);
    wait_for_messages(&inbox, 50, &p);
    assert_eq!(stored_offsets(&inbox, "g").get(&(topic.clone(), 0)), Some(&50));
    let tool = |a: &[&str]| {
        let mut full = vec!["--bootstrap-server", inbox.kafka_bootstrap.as_str()];
        full.extend_from_slice(a);
        testkit::shared_kafka().run_tool("org.apache.kafka.tools.TopicCommand", &full).expect("TopicCommand")
    };
    tool(&["--delete", "--topic", &topic]);
    std::thread::sleep(Duration::from_secs(3));
    assert!(p.is_running(), "a deleted topic stops nothing:\n{}", p.log_text());
    let recreated = testkit::wait_until(WAIT, || testkit::shared_kafka().create_topic(&topic, 1).is_ok());
    assert!(recreated, "topic could not be created again");
    produce(&inbox.kafka_bootstrap, &topic, &json_records("new", 0, 20, 5));
    wait_for_messages(&inbox, 70, &p);
    assert!(p.is_running());
    assert_eq!(count(&inbox, "SELECT count(*) FROM inbox.messages WHERE event_id LIKE 'new-%'"), 20);
    assert_eq!(stored_offsets(&inbox, "g").get(&(topic.clone(), 0)), Some(&20), "the offset follows the new log");
    assert!(p.log_text().contains("restarts below its stored offset"), "{}", p.log_text());
    assert!(p.terminate(WAIT).is_some_and(|s| s.success()));
}

/// A second `walpost inbox --create-schema` beside one that is writing (CI, 2026-12-02:
/// it deadlocked with the writer, DROP TRIGGER and CREATE INDEX IF NOT EXISTS lock their
/// tables even when there is nothing to do, and the deadlock was reported as a refused
/// privilege). Here a writer's transaction stays open with an uncommitted message (its
/// locks on messages and deliveries held): the second instance gets past its schema and
/// consumes all the same, and the held row commits afterwards.
#[test]
fn regression_create_schema_beside_a_writing_inbox_takes_no_lock_the_writer_holds() {
    let inbox = inbox_db("inbox-schema-again");
    let topic = format!("{}t", inbox.topic_prefix);
    create_topic(&topic, 1);
    let args = inbox_args(&inbox, &topic, "g", &["--create-schema"]);
    let mut first = start_inbox(&args, &[]);
    assert!(testkit::wait_until(WAIT, || first.log_text().contains("walpost inbox consuming")), "{}", first.log_text());
    assert!(first.terminate(WAIT).is_some_and(|s| s.success()), "{}", first.log_text());
    inbox.sql("SELECT inbox.register_handler('h', '{}', '{}', 3, '1 second', '1 minute', false)");

    let mut writer = Command::new(inbox.pg.psql_path())
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", &inbox.superuser_url])
        .env("PGAPPNAME", "held-writer")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("psql");
    let mut stdin = writer.stdin.take().expect("stdin");
    use std::io::Write as _;
    stdin
        .write_all(
            b"BEGIN; INSERT INTO inbox.messages (event_id, topic, \"partition\", \"offset\") VALUES ('held', 't', 0, 0);\n",
        )
        .unwrap();
    stdin.flush().unwrap();
    let holding = testkit::wait_until(Duration::from_secs(20), || {
        inbox
            .sql(
                "SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
                 WHERE a.application_name = 'held-writer' AND l.relation = 'inbox.deliveries'::regclass \
                 AND l.mode = 'RowExclusiveLock' AND l.granted)",
            )
            .trim()
            == "t"
    });
    assert!(holding, "the writer's transaction does not hold its locks");

    let mut second = start_inbox(&args, &[]);
    let consuming =
        testkit::wait_until(Duration::from_secs(30), || second.log_text().contains("walpost inbox consuming"));
    assert!(consuming, "the second instance is stuck on its schema:\n{}", second.log_text());
    produce(&inbox.kafka_bootstrap, &topic, &json_records("after", 0, 10, 2));
    wait_for_messages(&inbox, 10, &second);
    stdin.write_all(b"COMMIT;\n").unwrap();
    drop(stdin);
    assert!(writer.wait().unwrap().success(), "the held transaction commits");
    assert_eq!(count(&inbox, "SELECT count(*) FROM inbox.deliveries WHERE handler = 'h'"), 11);
    assert!(second.terminate(WAIT).is_some_and(|s| s.success()), "{}", second.log_text());
}

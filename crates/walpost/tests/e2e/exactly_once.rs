//! `--delivery exactly-once` against the real broker: Kafka transactions,
//! progress in a compacted topic, the slot gated by it, fencing of a zombie, and the
//! faults around the progress topic.

use std::time::{Duration, Instant};

use testkit::{PgOptions, Postgres};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

fn progress_topic(w: &World) -> String {
    format!("{}-progress", w.db)
}

/// walpost's arguments with exactly-once on (and `extra` TOML lines).
fn eos_args(w: &World, extra: &str) -> Vec<String> {
    let path = std::env::temp_dir().join(format!("{}-{}.toml", w.db, testkit::unique_name("eos")));
    std::fs::write(
        &path,
        format!("delivery = \"exactly-once\"\n{extra}\n[exactly_once]\nprogress_topic = \"{}\"\n", progress_topic(w)),
    )
    .unwrap();
    let mut args = vec!["--config".to_string(), path.display().to_string()];
    args.extend(w.args());
    args
}

fn eos_args_with(w: &World, exactly_once: &str) -> Vec<String> {
    let path = std::env::temp_dir().join(format!("{}-{}.toml", w.db, testkit::unique_name("eos")));
    std::fs::write(
        &path,
        format!(
            "delivery = \"exactly-once\"\n[exactly_once]\nprogress_topic = \"{}\"\n{exactly_once}\n",
            progress_topic(w)
        ),
    )
    .unwrap();
    let mut args = vec!["--config".to_string(), path.display().to_string()];
    args.extend(w.args());
    args
}

/// Reads committed records until every committed outbox row is there (or `timeout`).
fn committed_every_row(w: &World, timeout: Duration) -> Vec<Consumed> {
    let deadline = Instant::now() + timeout;
    loop {
        let rows = w.committed_rows();
        let records = read_all_committed(&w.kafka_bootstrap, &w.topic_prefix);
        let seen: std::collections::HashSet<i64> = records.iter().map(Consumed::event_id).collect();
        if rows.keys().all(|id| seen.contains(id)) || Instant::now() > deadline {
            return records;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn assert_exactly_once(w: &World, records: &[Consumed]) {
    let a = audit(w, records);
    assert!(a.lost.is_empty(), "lost: {:?}", &a.lost[..a.lost.len().min(10)]);
    assert_eq!(a.duplicates, 0, "duplicates under read_committed: {a:?}");
    assert!(a.reordered.is_empty() && a.phantoms.is_empty() && a.wrong_content.is_empty(), "{a:?}");
}

/// The progress record's LSN for this world's slot (read_committed), if any.
fn progress_lsn(w: &World) -> Option<u64> {
    let records = read_all_committed(&w.kafka_bootstrap, &progress_topic(w));
    let key = format!("{}/{}", w.db, w.slot);
    records
        .iter()
        .filter(|r| r.key.as_deref() == Some(key.as_bytes()))
        .filter_map(|r| r.value.as_ref())
        .filter_map(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
        .filter_map(|v| v["lsn"].as_str().and_then(parse_lsn))
        .max()
}

/// No line of `log` is an ERROR about the end of a partition (every
/// exactly-once start logged `ERROR rdkafka::client: ... PartitionEOF`).
fn assert_no_partition_eof_error(log: &str) {
    let noisy: Vec<&str> = log.lines().filter(|l| l.contains("ERROR") && l.contains("PartitionEOF")).collect();
    assert!(noisy.is_empty(), "{noisy:?}");
}

#[test]
fn exactly_once_streams_in_transactions_and_the_slot_never_leads_the_progress() {
    let w = World::new("eos-basic");
    let mut p = Walpost::start(&eos_args(&w, ""), &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 50, 20, 20, &["order", "payment"]);
    let records = committed_every_row(&w, WAIT);
    assert_eq!(records.len(), 1000);
    assert_exactly_once(&w, &records);
    assert!(testkit::wait_until(WAIT, || progress_lsn(&w).is_some()), "no progress record");
    for _ in 0..20 {
        let (slot, progress) = (w.confirmed_flush_lsn().unwrap(), progress_lsn(&w).unwrap());
        assert!(slot <= progress, "the slot ({slot:X}) leads the committed progress ({progress:X})");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A read_uncommitted reader sees the same records: nothing was aborted.
    assert_eq!(read_all(&w.kafka_bootstrap, &w.topic_prefix).len(), 1000);
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success(), "{}", p.log_text());
    assert_no_partition_eof_error(&p.log_text());
    // Progress records are not counted as events.
    assert!(!p.log_text().contains("PartitionEOF (Broker: No more messages)"), "{}", p.log_text());
}

/// kill -9 while transactions are open: nothing is published twice (read_committed),
/// nothing is lost, per-aggregate order holds.
#[test]
fn exactly_once_kill9_five_times_publishes_nothing_twice() {
    let w = World::new("eos-kill");
    let args = eos_args(&w, "");
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    for round in 0..5u32 {
        insert_batches(&w, round * 20, 20, 25, 30, &["order", "payment"]);
        std::thread::sleep(Duration::from_millis(150 + 100 * u64::from(round)));
        p.kill9();
        p = Walpost::start(&args, &[]);
    }
    let records = committed_every_row(&w, WAIT);
    assert_eq!(w.committed_rows().len(), 2500);
    assert_exactly_once(&w, &records);
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success(), "{}", p.log_text());
}

/// One PostgreSQL transaction of 12,000 rows with a bound of 1,000 records: it is split
/// across Kafka transactions (the progress says how many of its records are in), and a
/// crash right after the third Kafka commit, before the slot is confirmed, resends none
/// of the committed part.
#[test]
fn exactly_once_splits_an_oversized_transaction_and_resumes_inside_it() {
    let w = World::new("eos-split");
    let args = eos_args_with(&w, "max_transaction_records = 1000");
    let mut p = Walpost::start(&args, &[("FAILPOINTS", "after-kafka-commit-before-confirm=2*off->return")]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 1, 12_000, 50, &["order"]);
    let status = p.wait_exit(WAIT).expect("the failpoint must stop walpost");
    assert!(!status.success(), "{}", p.log_text());
    assert!(p.log_text().contains("failpoint after-kafka-commit-before-confirm reached"), "{}", p.log_text());
    let partial = read_all_committed(&w.kafka_bootstrap, &w.topic_prefix).len();
    assert!(partial > 0 && partial < 12_000, "the crash was not inside the transaction ({partial} records in)");
    let _p = Walpost::start(&args, &[]);
    let records = committed_every_row(&w, WAIT);
    assert_eq!(records.len(), 12_000);
    assert_exactly_once(&w, &records);
}

/// A frozen instance (SIGSTOP) with a Kafka transaction open loses the slot to the
/// waiting instance when the walsender gives up on it; resumed, it must not commit
/// anything: the broker fenced its transactional id when the other one started, and it
/// stops with the runbook's error. (A zombie with no transaction open just waits for
/// the slot again, like any standby.)
#[test]
fn exactly_once_zombie_is_fenced_and_stops() {
    let pg: &'static Postgres = Box::leak(Box::new(
        Postgres::start(PgOptions {
            extra_conf: vec![("wal_sender_timeout".into(), "5s".into())],
            ..PgOptions::default()
        })
        .expect("start postgres"),
    ));
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "eos-zombie");
    // Transactions stay open 5 s: long enough to freeze the instance inside one.
    let args = eos_args_with(&w, "max_transaction_ms = 5000");
    let zombie = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", zombie.log_text());
    insert_batches(&w, 0, 5, 20, 10, &["order"]);
    committed_every_row(&w, WAIT);
    let standby = Walpost::start(&args, &[]);
    assert!(testkit::wait_until(WAIT, || standby.log_text().contains("in use by server process")));
    insert_batches(&w, 5, 5, 20, 10, &["order"]);
    // The records are in Kafka, their transaction not committed: freeze now.
    assert!(testkit::wait_until(Duration::from_secs(4), || read_all(&w.kafka_bootstrap, &w.topic_prefix).len() >= 200));
    zombie.signal("-STOP");
    let committed = read_all_committed(&w.kafka_bootstrap, &w.topic_prefix).len();
    assert!(committed < 200, "the transaction was committed before the freeze ({committed} records)");
    assert!(
        testkit::wait_until(Duration::from_secs(60), || standby.log_text().contains("streaming slot=")),
        "the standby did not take over:\n{}",
        standby.log_text()
    );
    committed_every_row(&w, WAIT);
    zombie.signal("-CONT");
    let mut zombie = zombie;
    let status = zombie.wait_exit(Duration::from_secs(60)).expect("the zombie must stop");
    assert_eq!(status.code(), Some(1), "{}", zombie.log_text());
    assert!(zombie.log_text().contains("fenced this one"), "{}", zombie.log_text());
    insert_batches(&w, 10, 5, 20, 10, &["order"]);
    let records = committed_every_row(&w, WAIT);
    assert_eq!(w.committed_rows().len(), 300);
    assert_exactly_once(&w, &records);
}

/// A progress record of another cluster under this slot's key (a restored database):
/// refused with the runbook's error, nothing published.
#[test]
fn exactly_once_refuses_a_progress_record_from_another_cluster() {
    let w = World::new("eos-foreign");
    let topic = progress_topic(&w);
    let key = format!("{}/{}", w.db, w.slot);
    let value = format!(r#"{{"system_id":"1","database":"{}","slot":"{}","lsn":"0/1"}}"#, w.db, w.slot);
    produce_one(&w.kafka_bootstrap, &topic, &key, &value);
    let mut p = Walpost::start(&eos_args(&w, ""), &[]);
    let status = p.wait_exit(Duration::from_secs(60)).expect("must stop");
    assert_eq!(status.code(), Some(1), "{}", p.log_text());
    assert!(p.log_text().contains("from another PostgreSQL cluster"), "{}", p.log_text());
}

/// The progress topic deleted while walpost is stopped: it starts from the slot's
/// confirmed position (which never leads the progress), says so, and loses nothing.
#[test]
fn exactly_once_survives_a_deleted_progress_topic() {
    let w = World::new("eos-deleted");
    let args = eos_args(&w, "");
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 10, 10, 10, &["order"]);
    committed_every_row(&w, WAIT);
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success());
    testkit::shared_kafka()
        .run_tool(
            "org.apache.kafka.tools.TopicCommand",
            &["--bootstrap-server", &w.kafka_bootstrap, "--delete", "--topic", &progress_topic(&w)],
        )
        .expect("delete the progress topic");
    insert_batches(&w, 10, 10, 10, 10, &["order"]);
    let p = Walpost::start(&args, &[]);
    let records = committed_every_row(&w, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.reordered.is_empty(), "{a:?}\n{}", p.log_text());
    assert!(progress_lsn(&w).is_some() || testkit::wait_until(WAIT, || progress_lsn(&w).is_some()));
}

/// `--snapshot initial` in exactly-once mode: the rows in one Kafka transaction with the
/// slot's consistent point as progress, then the stream; each row exactly once.
#[test]
fn exactly_once_snapshot_then_stream() {
    let w = World::new("eos-snap");
    insert_batches(&w, 0, 20, 50, 20, &["order"]);
    let mut args = eos_args(&w, "");
    args.extend(["--snapshot".to_string(), "initial".to_string()]);
    let _p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 20, 10, 10, 20, &["order"]);
    let records = committed_every_row(&w, WAIT);
    assert_eq!(records.len(), 1100);
    assert_exactly_once(&w, &records);
}

/// Drill of runbooks/exactly-once.md, "Progress record from another cluster": the
/// progress topic holds this slot's key from another cluster (a restored database). walpost
/// refuses to start with the runbook's line; step 1's query shows the cluster changed;
/// step 2's own progress topic (the TOML block, as written) lets it start; every event is
/// then published exactly once and the new topic holds the progress.
#[test]
fn drill_exactly_once_progress_record_from_another_cluster() {
    let runbook = crate::drills::Runbook::open("exactly-once");
    let w = World::new("eos-drill-foreign");
    let topic = progress_topic(&w);
    let key = format!("{}/{}", w.db, w.slot);
    let foreign = "7301234567890123456";
    let value = format!(r#"{{"system_id":"{foreign}","database":"{}","slot":"{}","lsn":"0/1"}}"#, w.db, w.slot);
    produce_one(&w.kafka_bootstrap, &topic, &key, &value);
    let mut p = Walpost::start(&eos_args(&w, ""), &[]);
    let status = p.wait_exit(Duration::from_secs(60)).expect("walpost must refuse the foreign progress record");
    assert_eq!(status.code(), Some(1), "{}", p.log_text());
    let log = p.log_text();
    assert!(
        log.contains("from another PostgreSQL cluster") && log.contains("follow runbooks/exactly-once.md"),
        "{log}"
    );
    // The slot exists (created before the progress was read) and events wait in it.
    assert!(w.wait_for_slot(WAIT), "{log}");
    insert_batches(&w, 0, 10, 10, 10, &["order", "payment"]);

    // Step 1: the system identifier differs from the record's and is the one the line names.
    let ours = w.sql(&runbook.block("system-identifier").fill(&[]));
    assert_ne!(ours, foreign);
    assert!(log.contains(&format!("system identifier {foreign}, this one is {ours}")), "{log}");

    // Step 2: this deployment gets its own progress topic.
    let own_topic = format!("walpost.progress.{}", w.db);
    let own = runbook.block("own-topic").fill(&[("env", &w.db)]);
    assert!(own.contains(&own_topic), "{own}");
    let path = std::env::temp_dir().join(format!("{}-{}.toml", w.db, testkit::unique_name("eos-own")));
    std::fs::write(&path, format!("delivery = \"exactly-once\"\n{own}")).unwrap();
    let mut args = vec!["--config".to_string(), path.display().to_string()];
    args.extend(w.args());

    // Step 3: start; every event exactly once; the new topic holds the progress.
    let p = Walpost::start(&args, &[]);
    let records = committed_every_row(&w, WAIT);
    assert_exactly_once(&w, &records);
    let progressed = || {
        read_all_committed(&w.kafka_bootstrap, &own_topic)
            .iter()
            .any(|r| r.key.as_deref() == Some(key.as_bytes()) && r.value.as_ref().is_some_and(|v| !v.is_empty()))
    };
    assert!(testkit::wait_until(WAIT, progressed), "no progress record in {own_topic}:\n{}", p.log_text());
}

/// Regression: a progress record produced by a plain Kafka client under
/// this slot's key, with a position ahead of the events in the slot (any role can read
/// the system identifier with pg_control_system()), made walpost skip those events and
/// confirm the slot past them, silently. Now it stops with the runbook's error, confirms
/// nothing, and the runbook's tombstone lets it resume from the slot without a loss. A
/// record with a made-up signature is refused the same way.
#[test]
fn regression_a_forged_progress_record_stops_walpost_instead_of_skipping() {
    let runbook = crate::drills::Runbook::open("exactly-once");
    let w = World::new("eos-forged");
    let topic = progress_topic(&w);
    let key = format!("{}/{}", w.db, w.slot);
    let args = eos_args(&w, "");
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 5, 10, 10, &["order"]);
    assert_exactly_once(&w, &committed_every_row(&w, WAIT));
    assert_eq!(p.terminate(WAIT).and_then(|s| s.code()), Some(0), "{}", p.log_text());
    // Events the forged position would skip, then the forgery.
    insert_batches(&w, 5, 5, 10, 10, &["order"]);
    let confirmed = w.confirmed_flush_lsn();
    let system_id = w.sql("SELECT system_identifier FROM pg_control_system()");
    let ahead = w.sql("SELECT pg_current_wal_insert_lsn()");
    for mac in [None, Some("00".repeat(32))] {
        let mac = mac.map(|m| format!(r#","mac":"{m}""#)).unwrap_or_default();
        let value =
            format!(r#"{{"system_id":"{system_id}","database":"{}","slot":"{}","lsn":"{ahead}"{mac}}}"#, w.db, w.slot);
        produce_one(&w.kafka_bootstrap, &topic, &key, &value);
        let mut p = Walpost::start(&args, &[]);
        assert_eq!(p.wait_exit(WAIT).and_then(|s| s.code()), Some(1), "{}", p.log_text());
        let log = p.log_text();
        let expected = format!("the progress topic {topic} holds a record for {key} that walpost did not write");
        assert!(log.contains(&expected) && log.contains("runbooks/exactly-once.md"), "{log}");
        assert_eq!(w.confirmed_flush_lsn(), confirmed, "the slot moved past events walpost did not publish");
    }
    // The runbook: a tombstone for the key, then start: nothing is lost.
    crate::drills::sh_ok(&runbook.block("tombstone").fill(&[
        ("key", &key),
        ("brokers", &w.kafka_bootstrap),
        ("progress-topic", &topic),
    ]));
    let p = Walpost::start(&args, &[]);
    let records = committed_every_row(&w, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.reordered.is_empty() && a.phantoms.is_empty(), "{a:?}\n{}", p.log_text());
}

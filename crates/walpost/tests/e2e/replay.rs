//! `walpost replay` and Debezium-format signal rows republish outbox
//! rows through the same router while `walpost run` keeps streaming.

use std::collections::{BTreeMap, HashSet};
use std::process::Command;
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

/// `walpost <args>` with `run` replaced by `replay` and `extra` appended: (exit code,
/// stdout, stderr).
fn replay(w: &World, extra: &[&str]) -> (i32, String, String) {
    let mut args = w.args();
    args[0] = "replay".into();
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = Command::new(env!("CARGO_BIN_EXE_walpost")).args(&args).output().expect("run walpost replay");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Inserts `n` rows of `aggregate_type` with occurred_at `day` (+ i seconds), over 5
/// aggregates, in one transaction.
fn insert_on(w: &World, day: &str, aggregate_type: &str, n: u32) {
    w.sql(&format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload, occurred_at)
         SELECT '{aggregate_type}', ('00000000-0000-4000-8000-00000000000' || (g % 5))::uuid, 'E',
                jsonb_build_object('g', g), '{day}'::timestamptz + g * interval '1 second'
         FROM generate_series(1, {n}) g"
    ));
}

fn ids_where(w: &World, condition: &str) -> Vec<i64> {
    w.sql(&format!("SELECT id FROM events.outbox WHERE {condition} ORDER BY id"))
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

fn replayed<'a>(records: &'a [Consumed], id: &str) -> Vec<&'a Consumed> {
    records.iter().filter(|r| r.header("walpost.replay") == Some(id.as_bytes())).collect()
}

/// Replayed records: exactly `expected` ids, each once, each aggregate in id order.
fn assert_replayed_exactly(records: &[&Consumed], expected: &[i64]) {
    let ids: Vec<i64> = records.iter().map(|r| r.event_id()).collect();
    let set: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(ids.len(), set.len(), "a row replayed twice");
    assert_eq!(set, expected.iter().copied().collect::<HashSet<_>>(), "replayed ids");
    // (topic, key) -> (partition, offset, id) of each copy.
    type Copies = Vec<(i32, i64, i64)>;
    let mut per_key: BTreeMap<(String, Vec<u8>), Copies> = BTreeMap::new();
    for r in records {
        per_key.entry((r.topic.clone(), r.key.clone().unwrap_or_default())).or_default().push((
            r.partition,
            r.offset,
            r.event_id(),
        ));
    }
    for (key, mut copies) in per_key {
        copies.sort();
        assert!(copies.windows(2).all(|p| p[0].2 < p[1].2), "aggregate {key:?} replayed out of id order: {copies:?}");
    }
}

#[test]
fn replay_republishes_a_range_beside_the_stream() {
    let w = World::new("replay-cli");
    let mut p = w.start_walpost();
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_on(&w, "2026-11-27 10:00:00+00", "order", 30);
    insert_on(&w, "2026-11-28 10:00:00+00", "order", 40);
    insert_on(&w, "2026-11-28 12:00:00+00", "payment", 20);
    insert_on(&w, "2026-11-29 10:00:00+00", "order", 30);
    wait_for_every_committed(&w, WAIT);

    // Dry run: counts per topic, publishes nothing.
    let before = read_all(&w.kafka_bootstrap, &w.topic_prefix).len();
    let (code, out, err) =
        replay(&w, &["--since", "2026-11-28T00:00:00Z", "--until", "2026-11-29T00:00:00Z", "--dry-run", "--id", "dry"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.starts_with("replay dry (dry run): 60 rows read, 60 would be published\n"), "{out}");
    let count_of = |topic: &str| {
        out.lines().find_map(|l| l.trim_start().strip_prefix(topic).map(|n| n.trim().to_owned())).unwrap_or_default()
    };
    assert_eq!((count_of(&w.topic("order")), count_of(&w.topic("payment"))), ("40".into(), "20".into()), "{out}");
    assert_eq!(read_all(&w.kafka_bootstrap, &w.topic_prefix).len(), before, "a dry run published");

    // The replay, while the stream goes on.
    let writer = {
        let (pg, db) = (w.pg, w.db.clone());
        std::thread::spawn(move || insert_batches_in(pg, &db, 100, 20, 10, 5, &["order"]))
    };
    let (code, out, err) = replay(
        &w,
        &[
            "--since",
            "2026-11-28T00:00:00Z",
            "--until",
            "2026-11-29T00:00:00Z",
            "--where",
            "aggregate_type = 'order'",
            "--id",
            "fix-42",
        ],
    );
    writer.join().unwrap();
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.starts_with("replay fix-42: 40 rows read, 40 published\n"), "{out}");
    assert!(err.contains("replay progress"), "progress on stderr:\n{err}");
    let records = consume_every_committed(&w, WAIT);
    let expected =
        ids_where(&w, "occurred_at >= '2026-11-28' AND occurred_at < '2026-11-29' AND aggregate_type = 'order'");
    assert_eq!(expected.len(), 40);
    assert_replayed_exactly(&replayed(&records, "fix-42"), &expected);
    // Apart from the replay, every event exactly where the router puts it.
    let live: Vec<Consumed> = records.iter().filter(|r| r.header("walpost.replay").is_none()).cloned().collect();
    let a = audit(&w, &live);
    assert!(a.lost.is_empty() && a.reordered.is_empty() && a.duplicates == 0, "{a:?}");
    assert!(p.is_running(), "the stream stopped:\n{}", p.log_text());
}

#[test]
fn replay_refuses_bad_ranges_and_filters_before_publishing() {
    let w = World::new("replay-bad");
    insert_on(&w, "2026-11-28 10:00:00+00", "order", 5);
    for (extra, expected) in [
        (vec!["--where", "no_such_column = 1"], "no_such_column"),
        (vec!["--where", "1; DROP TABLE events.outbox"], "not a condition walpost runs"),
        (vec!["--where", "1; DROP TABLE events.outbox", "--unsafe-where"], "not a valid condition"),
        (vec!["--since", "2026-11-29", "--until", "2026-11-28"], "is not before --until"),
        (vec!["--since", "yesterday-ish"], "is not a timestamp"),
        (vec!["--since", "2026-11-01", "--time-column", "created"], "created"),
    ] {
        let (code, out, err) = replay(&w, &extra);
        assert_eq!(code, 1, "{extra:?}: {out}\n{err}");
        assert!(err.contains(expected) && err.contains("nothing was published"), "{extra:?}: {err}");
    }
    assert_eq!(w.sql("SELECT count(*) FROM events.outbox"), "5", "the table is untouched");
    assert!(topics_with_prefix(&w.kafka_bootstrap, &w.topic_prefix).is_empty(), "something was published");
}

/// A signal row in Debezium's format replays while the stream goes on; the signal's
/// transaction is confirmed only after the replay, so a restart does not act on it
/// again; a bad signal is logged and the stream goes on.
#[test]
fn replay_from_a_debezium_signal_row_runs_once() {
    let w = World::new("replay-signal");
    w.sql(&format!(
        "CREATE TABLE events.debezium_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));
         ALTER TABLE events.debezium_signal OWNER TO {};",
        w.role
    ));
    let args = with_flag(w.args(), "--signal-table", "events.debezium_signal");
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 10, 10, 5, &["order", "payment"]);
    wait_for_every_committed(&w, WAIT);
    w.sql(
        r#"INSERT INTO events.debezium_signal VALUES ('sig-1', 'execute-snapshot',
           '{"data-collections": ["events.outbox"], "type": "incremental",
             "additional-conditions": [{"data-collection": "events.outbox", "filter": "aggregate_type = ''payment''"}]}')"#,
    );
    assert!(testkit::wait_until(WAIT, || p.log_text().contains("signal: replay done")), "{}", p.log_text());
    // The signal's transaction is confirmed now: the slot moved past it.
    let signal_lsn = w.sql("SELECT pg_current_wal_lsn()");
    insert_batches(&w, 10, 2, 10, 5, &["order"]);
    assert!(testkit::wait_until(WAIT, || w.confirmed_flush_lsn() >= parse_lsn(&signal_lsn)));
    let records = consume_every_committed(&w, WAIT);
    assert_replayed_exactly(&replayed(&records, "sig-1"), &ids_where(&w, "aggregate_type = 'payment'"));

    // Restarted: the signal is not acted on again.
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success());
    let mut p = Walpost::start(&args, &[]);
    insert_batches(&w, 12, 2, 10, 5, &["order"]);
    let records = consume_every_committed(&w, WAIT);
    assert_eq!(
        replayed(&records, "sig-1").len(),
        ids_where(&w, "aggregate_type = 'payment'").len(),
        "replayed again after a restart"
    );
    assert!(!p.log_text().contains("signal: replay started"), "{}", p.log_text());

    // A signal whose filter the server refuses: logged, the stream goes on.
    w.sql(
        r#"INSERT INTO events.debezium_signal VALUES ('sig-bad', 'execute-snapshot',
           '{"data-collections": ["events.outbox"], "additional-conditions": [{"data-collection": "events.outbox", "filter": "no_such_column = 1"}]}')"#,
    );
    w.sql("INSERT INTO events.debezium_signal VALUES ('sig-log', 'log', '{\"message\": \"hi\"}')");
    assert!(
        testkit::wait_until(WAIT, || {
            let log = p.log_text();
            log.contains("replay failed") && log.contains("signal ignored")
        }),
        "{}",
        p.log_text()
    );
    insert_batches(&w, 14, 2, 10, 5, &["order"]);
    let records = consume_every_committed(&w, WAIT);
    assert!(replayed(&records, "sig-bad").is_empty());
    assert!(p.is_running(), "{}", p.log_text());
}

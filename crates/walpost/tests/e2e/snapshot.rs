//! `--snapshot`: rows that exist before the slot are published once, consistently with
//! the stream.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(180);

fn snapshot_args(w: &World, mode: &str, extra: &[&str]) -> Vec<String> {
    let mut args = w.args();
    args.push("--snapshot".into());
    args.push(mode.into());
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn is_snapshot(r: &Consumed) -> bool {
    r.header("walpost.snapshot") == Some(&b"true"[..])
}

/// 50,000 existing rows and writers inserting during the snapshot:
/// every row arrives exactly once and per-aggregate order holds across the boundary.
#[test]
fn initial_snapshot_of_50k_rows_with_concurrent_writers_is_exactly_once() {
    let w = World::new("snap-50k");
    insert_batches(&w, 0, 100, 500, 100, &["order", "payment"]);
    let mut p = Walpost::start(&snapshot_args(&w, "initial", &[]), &[]);
    // Writers start at once, so some commit before the slot's consistent point (snapshot)
    // and most after it (stream).
    for round in 0..10 {
        insert_batches(&w, 100 + round * 5, 5, 40, 100, &["order", "payment"]);
    }
    let expected = w.committed_rows().len();
    assert_eq!(expected, 50_000 + 2_000);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, expected, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.wrong_content.is_empty(), "{a:?}");
    assert!(a.reordered.is_empty(), "{:?}", a.reordered);
    assert_eq!(a.duplicates, 0);
    assert_eq!(records.len(), expected);
    let snap: Vec<i64> = records.iter().filter(|r| is_snapshot(r)).map(Consumed::event_id).collect();
    assert!(snap.len() >= 50_000, "only {} snapshot records", snap.len());
    let max_snapshot_id = *snap.iter().max().unwrap();
    // The snapshot is a prefix of commit order: every later row came from the stream.
    assert!(records.iter().filter(|r| !is_snapshot(r)).all(|r| r.event_id() > max_snapshot_id));
    assert!(p.log_text().contains("snapshot finished"), "{}", p.log_text());
    assert!(p.terminate(Duration::from_secs(60)).unwrap().success());
}

/// `--snapshot-filter "published_at IS NULL"` publishes only the rows a
/// polling relay never published, then streams.
#[test]
fn snapshot_filter_publishes_only_unpublished_rows_then_streams() {
    let w = World::new("snap-filter");
    insert_batches(&w, 0, 10, 100, 10, &["order"]);
    w.sql("UPDATE events.outbox SET published_at = now() WHERE id <= 600");
    let _p = Walpost::start(&snapshot_args(&w, "initial", &["--snapshot-filter", "published_at IS NULL"]), &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 10, 1, 100, 10, &["order"]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 500, WAIT);
    std::thread::sleep(Duration::from_secs(2));
    let records_later = read_all(&w.kafka_bootstrap, &w.topic_prefix);
    assert_eq!(records.len(), records_later.len());
    let ids: Vec<i64> = records.iter().map(Consumed::event_id).collect();
    let unique: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(unique.len(), 500, "exactly the 400 unpublished rows and 100 streamed ones");
    assert!(ids.iter().all(|&id| id > 600), "a row the poller had published was snapshotted");
    assert_eq!(records.iter().filter(|r| is_snapshot(r)).count(), 400);
}

/// An invalid filter is refused at start-up with the server's reason.
#[test]
fn invalid_snapshot_filter_is_refused_at_start() {
    let w = World::new("snap-badfilter");
    let mut p = Walpost::start(&snapshot_args(&w, "initial", &["--snapshot-filter", "no_such_column > 1"]), &[]);
    let status = p.wait_exit(Duration::from_secs(60)).expect("must stop");
    assert!(!status.success());
    let log = p.log_text();
    assert!(log.contains("--snapshot-filter \"no_such_column > 1\" is not a valid condition"), "{log}");
    assert!(w.confirmed_flush_lsn().is_none(), "no slot may be created");
}

/// `kill -9` during the snapshot, start again: the snapshot starts over
/// on a new slot and nothing is missing.
#[test]
fn kill9_during_snapshot_then_restart_loses_nothing() {
    let w = World::new("snap-kill");
    insert_batches(&w, 0, 100, 2000, 100, &["order"]);
    let config = std::env::temp_dir().join(format!("{}.toml", w.db));
    // A small in-flight window makes the snapshot take long enough to be interrupted.
    std::fs::write(&config, "[pipeline]\nmax_in_flight_records = 50\n").unwrap();
    let mut args = vec!["--config".to_string(), config.display().to_string()];
    args.extend(snapshot_args(&w, "initial", &[]));
    let mut first = Walpost::start(&args, &[]);
    let mut published = 0;
    assert!(
        testkit::wait_until(Duration::from_secs(120), || {
            published = high_watermarks(&w.kafka_bootstrap, &w.topic_prefix).values().sum::<i64>();
            published > 1000
        }),
        "snapshot did not start:\n{}",
        first.log_text()
    );
    first.kill9();
    assert!(published < 200_000, "the snapshot finished before the kill; nothing was tested");
    let second = Walpost::start(&snapshot_args(&w, "initial", &[]), &[]);
    insert_batches(&w, 100, 5, 20, 100, &["order"]);
    let expected = w.committed_rows().len();
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, expected, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.wrong_content.is_empty(), "{a:?}");
    assert!(a.reordered.is_empty(), "{:?}", a.reordered);
    assert!(second.log_text().contains("an earlier snapshot did not finish"), "{}", second.log_text());
}

/// `initial_only` exits 0 after publishing every row (and creates no
/// slot); `never` publishes no existing row.
#[test]
fn initial_only_backfills_and_exits_0_never_skips_existing_rows() {
    let w = World::new("snap-only");
    insert_batches(&w, 0, 4, 500, 10, &["order"]);
    let mut p = Walpost::start(&snapshot_args(&w, "initial_only", &[]), &[]);
    let status = p.wait_exit(Duration::from_secs(120)).expect("initial_only must exit");
    assert!(status.success(), "{}", p.log_text());
    let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
    assert_eq!(records.len(), 2000);
    assert!(records.iter().all(is_snapshot));
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.duplicates == 0 && a.reordered.is_empty(), "{a:?}");
    assert!(w.confirmed_flush_lsn().is_none(), "a backfill creates no slot");

    let w2 = World::new("snap-never");
    insert_batches(&w2, 0, 4, 500, 10, &["order"]);
    let _never = Walpost::start(&snapshot_args(&w2, "never", &[]), &[]);
    assert!(w2.wait_for_slot(WAIT));
    insert_batches(&w2, 4, 1, 10, 10, &["order"]);
    let records = consume_at_least(&w2.kafka_bootstrap, &w2.topic_prefix, 10, WAIT);
    std::thread::sleep(Duration::from_secs(2));
    let records = read_all(&w2.kafka_bootstrap, &w2.topic_prefix).into_iter().chain(records).collect::<Vec<_>>();
    let ids: HashSet<i64> = records.iter().map(Consumed::event_id).collect();
    assert_eq!(ids.len(), 10, "only the rows inserted after the slot");
    assert!(ids.iter().all(|&id| id > 2000));
}

/// An existing slot with `--snapshot initial` says clearly that no snapshot is taken.
#[test]
fn initial_with_existing_slot_says_no_snapshot_is_taken() {
    let w = World::new("snap-exists");
    let mut first = w.start_walpost();
    assert!(w.wait_for_slot(WAIT));
    assert!(first.terminate(Duration::from_secs(30)).unwrap().success());
    insert_batches(&w, 0, 1, 10, 10, &["order"]);
    let p = Walpost::start(&snapshot_args(&w, "initial", &[]), &[]);
    assert!(
        testkit::wait_until(Duration::from_secs(30), || p.log_text().contains("no snapshot will be taken")),
        "{}",
        p.log_text()
    );
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, WAIT);
    assert!(records.iter().all(|r| !is_snapshot(r)), "rows after the slot come from the stream");
}

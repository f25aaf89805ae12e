//! Bad input and hostile conditions: each gives a clear error naming the problem and
//! the fix, loses nothing and confirms nothing past an unacknowledged record.

use std::time::Duration;

use testkit::{PgOptions, Postgres};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

/// Runs walpost with `args` and expects it to stop by itself with a failure; returns its log.
fn run_expecting_failure(args: &[String]) -> String {
    let mut p = Walpost::start(args, &[]);
    let status =
        p.wait_exit(Duration::from_secs(60)).unwrap_or_else(|| panic!("walpost kept running:\n{}", p.log_text()));
    assert!(!status.success(), "walpost exited 0:\n{}", p.log_text());
    p.log_text()
}

#[test]
fn wal_level_replica_is_named_with_the_fix() {
    let pg: &'static Postgres = Box::leak(Box::new(
        Postgres::start(PgOptions { extra_conf: vec![("wal_level".into(), "replica".into())], ..PgOptions::default() })
            .expect("start postgres"),
    ));
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "err-wal-level");
    let log = run_expecting_failure(&w.args());
    assert!(log.contains("wal_level is 'replica' but walpost needs 'logical'"), "{log}");
    assert!(log.contains("restart PostgreSQL"), "{log}");
    assert!(w.confirmed_flush_lsn().is_none(), "no slot may be created");
}

#[test]
fn role_without_replication_is_named() {
    let w = World::new("err-role");
    w.sql(&format!(
        "CREATE ROLE norepl_{slot} LOGIN PASSWORD 'pw'; GRANT USAGE ON SCHEMA events TO norepl_{slot}; GRANT SELECT ON events.outbox TO norepl_{slot};",
        slot = w.slot
    ));
    let url = w.pg.url_for(&format!("norepl_{}", w.slot), "pw", &w.db);
    let args = with_flag(w.args(), "--postgres", &url);
    let log = run_expecting_failure(&args);
    assert!(log.contains("lacks the REPLICATION attribute"), "{log}");
    assert!(log.contains("WITH REPLICATION"), "{log}");
    assert!(!log.contains(":pw@"), "password leaked into the log:\n{log}");
}

#[test]
fn wrong_password_is_a_definite_error_without_the_password() {
    let w = World::new("err-password");
    let url = w.pg.url_for("walpost", "not-the-password", &w.db);
    let log = run_expecting_failure(&with_flag(w.args(), "--postgres", &url));
    assert!(log.contains("password authentication failed"), "{log}");
    assert!(!log.contains("not-the-password"), "password leaked into the log:\n{log}");
}

#[test]
fn missing_table_and_missing_column_are_named() {
    let w = World::new("err-table");
    let log = run_expecting_failure(&with_flag(w.args(), "--table", "events.nope"));
    assert!(log.contains("table events.nope does not exist"), "{log}");
    let log = run_expecting_failure(&with_flag(w.args(), "--key-field", "tenant_key"));
    assert!(
        log.contains("events.outbox has no column \"tenant_key\"") && log.contains("table.field.event.key"),
        "{log}"
    );
}

#[test]
fn slot_with_another_plugin_is_refused() {
    let w = World::new("err-plugin");
    w.sql(&format!("SELECT pg_create_logical_replication_slot('{}', 'test_decoding')", w.slot));
    let log = run_expecting_failure(&w.args());
    assert!(log.contains("plugin test_decoding") && log.contains("pg_drop_replication_slot"), "{log}");
}

#[test]
fn publication_without_the_table_is_refused_with_the_fix() {
    let w = World::new("err-pub");
    w.sql(&format!("CREATE TABLE public.t (id int); CREATE PUBLICATION {}_pub FOR TABLE public.t", w.slot));
    let log = run_expecting_failure(&w.args());
    assert!(log.contains("does not include events.outbox") && log.contains("ALTER PUBLICATION"), "{log}");
}

#[test]
fn unknown_config_key_and_refused_kafka_property_are_named() {
    let dir = std::env::temp_dir().join(testkit::unique_name("cfg"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("walpost.toml");
    std::fs::write(&file, "postgres = 'postgres://u@h/d'\nslot_name = 'x'\n").unwrap();
    let log = run_expecting_failure(&["--config".into(), file.display().to_string(), "run".into()]);
    assert!(log.contains("slot_name"), "{log}");
    std::fs::write(
        &file,
        "postgres = 'postgres://u@h/d'\n[kafka]\nbrokers = 'k:1'\n[kafka.properties]\n'enable.idempotence' = 'false'\n",
    )
    .unwrap();
    let log = run_expecting_failure(&["--config".into(), file.display().to_string(), "run".into()]);
    assert!(log.contains("enable.idempotence=false is refused"), "{log}");
}

/// A second instance on the same slot waits (hot standby) and takes over when the
/// first one dies; nothing is lost across the hand-over.
#[test]
fn second_instance_waits_for_the_slot_and_takes_over() {
    let w = World::new("standby");
    let mut active = w.start_walpost();
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 5, 10, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 50, WAIT);
    let standby = w.start_walpost();
    assert!(
        testkit::wait_until(Duration::from_secs(30), || standby.log_text().contains("is in use by server process")),
        "standby did not report the busy slot:\n{}",
        standby.log_text()
    );
    active.kill9();
    insert_batches(&w, 5, 5, 10, 5, &["order"]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 100, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.reordered.is_empty(), "{a:?}");
}

/// A record larger than the producer's message.max.bytes: walpost halts naming the
/// event id and the fix, confirms nothing past it, and after the fix it is delivered.
#[test]
fn oversized_record_halts_with_event_id_and_is_not_lost() {
    let w = World::new("err-too-large");
    let mut first = w.start_walpost();
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 2, 5, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, WAIT);
    assert!(first.terminate(Duration::from_secs(30)).unwrap().success());
    let big_id = w.sql(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', '00000000-0000-4000-8000-000000000001', 'Big', jsonb_build_object('blob', repeat('z', 5000)))
         RETURNING id",
    );
    let lsn_big = parse_lsn(&w.sql("SELECT pg_current_wal_insert_lsn()")).unwrap();
    let args = with_flag(w.args(), "--kafka-property", "message.max.bytes=2000");
    let log = run_expecting_failure(&args);
    assert!(log.contains(&format!("Kafka rejected event id={big_id}")), "{log}");
    assert!(log.contains("message.max.bytes"), "{log}");
    assert!(w.confirmed_flush_lsn().unwrap() < lsn_big, "confirmed past the rejected record");
    // Fixed configuration: the event is delivered, nothing lost.
    let _fixed = w.start_walpost();
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 11, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty(), "{a:?}");
}

/// PostgreSQL unreachable at start is transient: walpost keeps retrying with backoff
/// and starts streaming once the server is there.
#[test]
fn postgres_unreachable_at_start_is_retried() {
    let w = World::new("err-unreachable");
    let port = testkit::free_port();
    let url = format!("postgres://walpost:walpost@127.0.0.1:{port}/{}", w.db);
    let mut p = Walpost::start(&with_flag(w.args(), "--postgres", &url), &[]);
    assert!(
        testkit::wait_until(Duration::from_secs(20), || p.log_text().matches("reconnecting").count() >= 3),
        "{}",
        p.log_text()
    );
    assert!(p.wait_exit(Duration::from_millis(10)).is_none(), "walpost gave up:\n{}", p.log_text());
    assert!(p.log_text().contains("cannot connect to PostgreSQL"), "{}", p.log_text());
    assert!(!p.log_text().contains("walpost:walpost@"), "password in log");
}

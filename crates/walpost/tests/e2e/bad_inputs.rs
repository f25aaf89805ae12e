//! The bad-input catalogue (docs/bad-inputs.md): the rows no other module tests.
//!
//! Each test runs the walpost binary into the bad input, checks the exact error the
//! operator sees, and proves that nothing past the bad record was confirmed (the
//! slot's confirmed_flush_lsn stays below it) and, where there is a fix, that after
//! the fix every committed event arrives. Each prints the error line it saw
//! (`-- --nocapture` shows them), which is what the catalogue quotes.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use testkit::{PgOptions, Postgres};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);
/// The slot monitor's default interval (10 s) and room for a slow machine.
const OUTBOX_CHECK: Duration = Duration::from_secs(45);

/// Runs walpost until it exits by itself (it must, within a minute).
fn run_to_exit(args: &[String]) -> (ExitStatus, String) {
    let mut p = Walpost::start(args, &[]);
    let status =
        p.wait_exit(Duration::from_secs(60)).unwrap_or_else(|| panic!("walpost kept running:\n{}", p.log_text()));
    (status, p.log_text())
}

/// The last ERROR line of a walpost log, without timestamp and colours; printed so
/// the catalogue can quote it.
fn last_error(case: &str, log: &str) -> String {
    let clean = strip_ansi(log);
    let line = clean
        .lines()
        .rev()
        .find(|l| l.contains(" ERROR ") || l.starts_with("error:"))
        .unwrap_or_else(|| panic!("{case}: no ERROR line in:\n{clean}"))
        .to_owned();
    let text = match line.split_once(" ERROR ") {
        Some((_, rest)) => rest.split_once(": ").map_or(rest, |(_, m)| m).to_owned(),
        None => line,
    };
    eprintln!("[bad-input] {case}: {text}");
    text
}

fn lsn_now(w: &World) -> u64 {
    parse_lsn(&w.sql("SELECT pg_current_wal_lsn()")).unwrap()
}

/// Inserts one outbox row; returns its id and the WAL position after its commit.
fn insert(w: &World, aggregate_type: &str, aggregate_id: &str, payload: &str) -> (String, u64) {
    let id = w.sql(&format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ({aggregate_type}, {aggregate_id}, 'Bad', '{payload}') RETURNING id"
    ));
    (id, lsn_now(w))
}

fn assert_exit_failure(case: &str, status: ExitStatus, log: &str) {
    assert!(!status.success(), "{case}: walpost exited 0:\n{log}");
    assert_eq!(status.code(), Some(1), "{case}: exit status 1 means 'an operator must fix this'");
}

// ---- configuration: refused before any connection ----

/// Invalid TOML, a snapshot filter without a snapshot mode, a flag given twice and
/// inverted alarm thresholds: refused at start, before anything is connected to.
#[test]
fn invalid_toml_and_conflicting_flags_are_refused_before_connecting() {
    let dir = std::env::temp_dir().join(testkit::unique_name("bad-cfg"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("walpost.toml");
    let base = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> =
            ["run", "--postgres", "postgres://u:p@127.0.0.1:1/d", "--kafka-brokers", "127.0.0.1:1"]
                .map(String::from)
                .to_vec();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };

    std::fs::write(&file, "postgres = 'postgres://u@h/d'\n[kafka\nbrokers = 'k:1'\n").unwrap();
    let (status, log) = run_to_exit(&["--config".into(), file.display().to_string(), "run".into()]);
    assert_exit_failure("invalid TOML", status, &log);
    let e = last_error("invalid TOML", &log);
    assert!(e.contains(&format!("config file {} is not valid: TOML parse error at line 2", file.display())), "{e}");
    // Logs to a file carry no colour codes (only a terminal gets them).
    assert!(!log.contains('\u{1b}'), "ANSI escape codes in a log written to a file:\n{log}");

    let (status, log) = run_to_exit(&base(&["--snapshot-filter", "published_at IS NULL"]));
    assert_exit_failure("snapshot filter without snapshot", status, &log);
    let e = last_error("snapshot filter without snapshot", &log);
    assert!(
        e.contains("snapshot_filter = 'published_at IS NULL' is not valid: expected no filter unless --snapshot is initial, initial_only or when_needed"),
        "{e}"
    );

    let (status, log) = run_to_exit(&base(&["--slot", "a", "--slot", "b"]));
    assert_eq!(status.code(), Some(2), "clap usage errors exit 2:\n{log}");
    let e = last_error("flag given twice", &log);
    assert!(e.contains("the argument '--slot <") && e.contains("cannot be used multiple times"), "{e}");

    std::fs::write(
        &file,
        "postgres = 'postgres://u@127.0.0.1:1/d'\n[kafka]\nbrokers = '127.0.0.1:1'\n[monitor]\nwarning_bytes = 2000\ncritical_bytes = 1000\n",
    )
    .unwrap();
    let (status, log) = run_to_exit(&["--config".into(), file.display().to_string(), "run".into()]);
    assert_exit_failure("inverted thresholds", status, &log);
    let e = last_error("inverted thresholds", &log);
    assert!(e.contains("expected warning thresholds at or below the critical ones"), "{e}");
    assert!(!log.contains("walpost starting"), "nothing may start on a bad configuration:\n{log}");
}

// ---- transport ----

/// Forwards 127.0.0.2:<port> to `upstream`: a second address of this machine that
/// the server certificate (127.0.0.1, localhost) does not name.
fn forward_from_127_0_0_2(upstream: u16) -> u16 {
    let listener = TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (mut c, mut s) = (client, server);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c, &mut s);
                let _ = s.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    port
}

/// A server that accepts TLS only (pg_hba `hostnossl ... reject`): sslmode=disable is
/// refused by the server, with pg_hba's reason. verify-full against an address the
/// certificate does not name is refused by walpost. Neither creates a slot.
#[test]
fn tls_only_server_refuses_plaintext_and_verify_full_checks_the_host_name() {
    let pg: &'static Postgres = Box::leak(Box::new(
        Postgres::start(PgOptions {
            tls: true,
            extra_hba: vec![
                "hostnossl all all 127.0.0.1/32 reject".into(),
                "hostnossl replication all 127.0.0.1/32 reject".into(),
            ],
            ..PgOptions::default()
        })
        .expect("start postgres with TLS"),
    ));
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "bad-tls");
    let ca = pg.tls_dir().unwrap().join("ca.crt").display().to_string();

    let plain = format!("{}?sslmode=disable", w.url);
    let (status, log) = run_to_exit(&with_flag(w.args(), "--postgres", &plain));
    assert_exit_failure("TLS required, sslmode=disable", status, &log);
    let e = last_error("TLS required, sslmode=disable", &log);
    assert!(e.contains("pg_hba.conf rejects connection for host \"127.0.0.1\"") && e.contains("no encryption"), "{e}");
    assert!(e.contains("SQLSTATE 28000"), "{e}");
    assert!(!log.contains(APP_PASSWORD), "password in the log");

    let port = forward_from_127_0_0_2(pg.port());
    let wrong_host =
        format!("postgres://{}:{APP_PASSWORD}@127.0.0.2:{port}/{}?sslmode=verify-full&sslrootcert={ca}", w.role, w.db);
    let (status, log) = run_to_exit(&with_flag(w.args(), "--postgres", &wrong_host));
    assert_exit_failure("verify-full, wrong host", status, &log);
    let e = last_error("verify-full, wrong host", &log);
    assert!(e.contains("TLS to PostgreSQL failed") && e.contains("certificate check: IP address mismatch"), "{e}");

    // The same certificate is fine for the name it carries.
    let right = format!("{}?sslmode=verify-full&sslrootcert={ca}", w.url);
    let mut p = Walpost::start(&with_flag(w.args(), "--postgres", &right), &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    p.terminate(Duration::from_secs(30));
}

// ---- the outbox table and its columns ----

/// pgoutput (protocol 1) sends every value in its text form, so no column type is
/// unusable as a key: the key is the column's text output. walpost pins
/// `TimeZone=UTC` and `DateStyle=ISO` on its connections, so even a timestamptz key
/// is the same bytes whatever the server's defaults.
#[test]
fn key_column_of_any_type_is_keyed_by_its_debezium_form() {
    let w = World::new("bad-keytype");
    let _p = Walpost::start(&with_flag(w.args(), "--key-field", "occurred_at"), &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 1, 3, 3, &["order"]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 3, WAIT);
    // Debezium's form of a timestamptz (io.debezium.time.ZonedTimestamp): ISO-8601 in UTC
    // with the column's fraction digits (crates/router/CONFORMANCE.md).
    let expected: Vec<String> = w
        .sql("SELECT to_char(occurred_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM events.outbox ORDER BY id")
        .lines()
        .map(str::to_owned)
        .collect();
    let mut got: Vec<(i64, String)> =
        records.iter().map(|r| (r.event_id(), String::from_utf8(r.key.clone().unwrap()).unwrap())).collect();
    got.sort();
    assert_eq!(got.into_iter().map(|(_, k)| k).collect::<Vec<_>>(), expected);
    assert!(expected[0].ends_with('Z') && expected[0].contains('T'), "{expected:?}");
}

/// A NULL key (nullable key column): walpost halts on the row with the column and
/// the config key; nothing past it is confirmed. The fix for a row that is already
/// committed: on_permanent_error = "dead_letter" diverts it, the rest flows.
#[test]
fn null_key_halts_then_dead_letter_diverts_it_and_nothing_is_lost() {
    let w = World::new("bad-nullkey");
    w.sql("ALTER TABLE events.outbox ALTER COLUMN aggregate_id DROP NOT NULL");
    let mut p = w.streaming_walpost(5, WAIT);
    let (null_id, lsn_null) = insert(&w, "'order'", "NULL", "{\"n\": 1}");
    let status = p.wait_exit(Duration::from_secs(60)).expect("walpost must halt on a NULL key");
    assert_exit_failure("NULL key", status, &p.log_text());
    let e = last_error("NULL key", &p.log_text());
    assert!(
        e.contains(&format!(
            "column \"aggregate_id\" of events.outbox (set by table.field.event.key) is NULL in event id {null_id}: the event cannot be routed"
        )),
        "{e}"
    );
    assert!(e.contains("nothing past") && e.contains("on_permanent_error"), "{e}");
    assert!(w.confirmed_flush_lsn().unwrap() < lsn_null, "confirmed past the NULL-key row");

    insert_batches(&w, 1, 1, 5, 5, &["order"]);
    let dlq = format!("{}dead", w.topic_prefix);
    let file = std::env::temp_dir().join(format!("{}.toml", testkit::unique_name("bad-nullkey")));
    std::fs::write(&file, format!("on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n")).unwrap();
    let mut args = vec!["--config".to_string(), file.display().to_string()];
    args.extend(w.args());
    let _fixed = Walpost::start(&args, &[]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 11, WAIT);
    let dead: Vec<&Consumed> = records.iter().filter(|r| r.topic == dlq).collect();
    assert_eq!(dead.len(), 1, "{records:?}");
    assert_eq!(dead[0].header("walpost.event.id"), Some(null_id.as_bytes()));
    let delivered: Vec<Consumed> = records.into_iter().filter(|r| r.topic != dlq).collect();
    let a = audit(&w, &delivered);
    assert_eq!(a.lost, vec![null_id.parse::<i64>().unwrap()], "only the NULL-key row is not on its topic: {a:?}");
    assert!(a.phantoms.is_empty() && a.reordered.is_empty() && a.wrong_content.is_empty(), "{a:?}");
}

/// A route value that makes an invalid topic name: walpost halts naming the topic and
/// why; nothing past the row is confirmed.
#[test]
fn invalid_topic_after_routing_halts_and_confirms_nothing_past_it() {
    let w = World::new("bad-topic");
    let mut p = w.start_walpost();
    assert!(w.wait_for_slot(WAIT));
    let (bad_id, lsn_bad) = insert(&w, "'no/slash'", "gen_random_uuid()", "{}");
    let status = p.wait_exit(Duration::from_secs(60)).expect("walpost must halt on an invalid topic");
    assert_exit_failure("invalid topic", status, &p.log_text());
    let e = last_error("invalid topic", &p.log_text());
    // The row is named by its event id and column; the value (a column value) is not shown.
    assert!(
        e.contains(&format!(
            "the topic route.topic.replacement made from column \"aggregate_type\" of events.outbox in event id {bad_id} is not a valid Kafka topic name"
        )),
        "{e}"
    );
    assert!(!p.log_text().contains("no/slash"), "a column value reached the log:\n{}", p.log_text());
    assert!(w.confirmed_flush_lsn().unwrap() < lsn_bad, "confirmed past the unroutable row");
    assert!(read_all(&w.kafka_bootstrap, &w.topic_prefix).is_empty());
}

/// RENAME COLUMN of a mapped column while streaming: the next Relation message lacks
/// the column, walpost halts on the first row after it and confirms nothing past it;
/// pointed at the new name, it delivers everything.
#[test]
fn mapped_column_renamed_mid_stream_halts_then_the_fix_delivers_everything() {
    let w = World::new("bad-rename");
    let mut p = w.streaming_walpost(5, WAIT);
    w.sql("ALTER TABLE events.outbox RENAME COLUMN aggregate_id TO agg_id");
    w.sql("INSERT INTO events.outbox (aggregate_type, agg_id, event_type, payload) VALUES ('order', gen_random_uuid(), 'After', '{}')");
    // After the row's commit. While idle, walpost may confirm a keepalive position past
    // the ALTER's own WAL (nothing to publish there); what it must never confirm is the
    // row's transaction (the CI run of 2026-11-30 confirmed between the two: correct).
    let lsn_row = lsn_now(&w);
    let status = p.wait_exit(Duration::from_secs(60)).expect("walpost must halt");
    assert_exit_failure("column renamed", status, &p.log_text());
    let e = last_error("column renamed", &p.log_text());
    assert!(
        e.contains("table events.outbox has no column \"aggregate_id\" (set by table.field.event.key): add the column or point table.field.event.key at an existing one"),
        "{e}"
    );
    // The row's commit record (the error names it): a slot confirmed past its start would
    // skip the transaction on the next start.
    let commit_lsn = e
        .split("transaction committing at ")
        .nth(1)
        .and_then(|rest| parse_lsn(rest.split(':').next().unwrap_or_default()))
        .unwrap_or_else(|| panic!("no commit LSN in: {e}"));
    assert!(commit_lsn < lsn_row, "{e}");
    let confirmed = w.confirmed_flush_lsn().unwrap();
    assert!(confirmed <= commit_lsn, "confirmed {confirmed:X} past the renamed column's first row ({e})");

    let _fixed = Walpost::start(&with_flag(w.args(), "--key-field", "agg_id"), &[]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 6, WAIT);
    assert_eq!(records.len(), 6);
    let ids: Vec<i64> = records.iter().map(Consumed::event_id).collect();
    assert_eq!(ids.iter().collect::<std::collections::BTreeSet<_>>().len(), 6, "{ids:?}");
}

/// DROP TABLE events.outbox while streaming. A DROP is not in the replication stream,
/// so the slot monitor checks every tick that each outbox table still exists and is
/// still published; it stops walpost naming runbooks/outbox-recreated.md. At the next
/// start walpost refuses to run, naming the missing table.
#[test]
fn regression_outbox_dropped_mid_stream_halts_walpost() {
    let w = World::new("bad-drop");
    let mut p = w.streaming_walpost(5, WAIT);
    w.sql("DROP TABLE events.outbox");
    let status =
        p.wait_exit(OUTBOX_CHECK).unwrap_or_else(|| panic!("walpost kept running after the DROP:\n{}", p.log_text()));
    assert_exit_failure("outbox dropped mid-stream", status, &p.log_text());
    let e = last_error("outbox dropped mid-stream", &p.log_text());
    assert!(e.contains("outbox table events.outbox no longer exists; this changed while walpost was streaming"), "{e}");
    assert!(e.contains("follow runbooks/outbox-recreated.md"), "{e}");

    let (status, log) = run_to_exit(&w.args());
    assert_exit_failure("outbox dropped", status, &log);
    let e = last_error("outbox dropped", &log);
    assert!(e.contains(&format!("table events.outbox does not exist in database {}", w.db)), "{e}");
}

/// The outbox dropped and re-created while walpost runs: the new table is not in the
/// publication, so its rows are never decoded and keepalives would let the slot be
/// confirmed past them (the silent skip this test was written for). walpost stops
/// within a monitor tick naming the publication and the runbook; following
/// runbooks/outbox-recreated.md (ADD TABLE, backfill with `--snapshot initial_only`,
/// restart; the commands are read from the runbook) publishes every row of the new
/// table, nothing lost. Also the runbook's drill for a re-created table (see
/// `drills::drill_outbox_left_the_publication_and_came_back` for the other case).
#[test]
fn regression_outbox_recreated_mid_stream_halts_and_the_runbook_recovers_every_row() {
    let w = World::new("bad-recreate");
    let mut p = w.streaming_walpost(5, WAIT);

    // Dropped and re-created in one go (ids continue past the old table's, so the
    // audit below can tell the tables' rows apart), then written to at once.
    w.sql(&format!(
        "DROP TABLE events.outbox; {} ALTER TABLE events.outbox OWNER TO {};
         SELECT setval(pg_get_serial_sequence('events.outbox', 'id'), 1000);",
        std::fs::read_to_string(MIGRATION_0001).unwrap(),
        w.role
    ));
    let (unstreamed_id, lsn_unstreamed) = insert(&w, "'order'", "gen_random_uuid()", "{}");
    let status = p.wait_exit(OUTBOX_CHECK).unwrap_or_else(|| panic!("walpost kept running:\n{}", p.log_text()));
    assert_exit_failure("outbox re-created mid-stream", status, &p.log_text());
    let e = last_error("outbox re-created mid-stream", &p.log_text());
    let publication = format!("{}_pub", w.slot);
    assert!(
        e.contains(&format!(
            "publication \"{publication}\" exists but does not include events.outbox: run ALTER PUBLICATION \"{publication}\" ADD TABLE \"events\".\"outbox\""
        )),
        "{e}"
    );
    assert!(
        e.contains("this changed while walpost was streaming") && e.contains("follow runbooks/outbox-recreated.md"),
        "{e}"
    );
    assert_eq!(
        read_all(&w.kafka_bootstrap, &w.topic_prefix).len(),
        5,
        "the re-created table's row cannot have been streamed"
    );
    eprintln!(
        "[bad-input] outbox re-created mid-stream: walpost stopped; slot confirmed past the unstreamed row id={unstreamed_id}: {}",
        w.confirmed_flush_lsn().unwrap() >= lsn_unstreamed
    );

    // The runbook, its commands taken from runbooks/outbox-recreated.md: put the table
    // back, backfill, restart.
    let rb = crate::drills::Runbook::open("outbox-recreated");
    w.sql(&rb.block("add-table").fill(&[("publication", &publication)]));
    let config = crate::drills::service_config(&w, "");
    let out = crate::drills::sh(&rb.block("backfill").fill(&[("config", &config)]));
    assert!(out.status.success(), "backfill failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let _restarted = crate::drills::service(&config, &[]);
    let (after_id, _) = insert(&w, "'order'", "gen_random_uuid()", "{}");
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 7, WAIT);
    let a = audit(&w, &records);
    // The audit compares with the rows in the table now: the new table's.
    assert!(a.lost.is_empty() && a.reordered.is_empty() && a.wrong_content.is_empty(), "{a:?}");
    assert_eq!(a.phantoms.len(), 5, "only the dropped table's 5 rows are not in the new table: {a:?}");
    let ids: Vec<String> = records.iter().map(|r| r.event_id().to_string()).collect();
    assert!(ids.contains(&unstreamed_id) && ids.contains(&after_id), "{ids:?}");
}

/// A publication FOR ALL TABLES: accepted with a warning (every table's changes are
/// decoded); only outbox rows are published, nothing else, nothing lost.
#[test]
fn publication_for_all_tables_streams_only_the_outbox_with_a_warning() {
    let w = World::new("bad-alltables");
    w.sql(&format!(
        "CREATE TABLE public.orders (id int, note text);
         CREATE PUBLICATION {}_pub FOR ALL TABLES WITH (publish = 'insert');",
        w.slot
    ));
    let p = w.start_walpost();
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    w.sql("INSERT INTO public.orders SELECT g, 'x' FROM generate_series(1, 50) g");
    insert_batches(&w, 0, 2, 5, 5, &["order"]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.wrong_content.is_empty() && a.duplicates == 0, "{a:?}");
    assert_eq!(records.len(), 10);
    let log = strip_ansi(&p.log_text());
    let warning =
        log.lines().find(|l| l.contains("FOR ALL TABLES")).expect("a warning about FOR ALL TABLES").to_owned();
    eprintln!("[bad-input] FOR ALL TABLES: {warning}");
    assert!(
        warning.contains("every table's changes are decoded and sent, and only events.outbox is published"),
        "{warning}"
    );
}

// ---- Kafka ----

pub(crate) fn topic_command(kafka_bootstrap: &str, args: &[&str]) -> String {
    let kafka = testkit::shared_kafka();
    let mut full = vec!["--bootstrap-server", kafka_bootstrap];
    full.extend_from_slice(args);
    kafka.run_tool("org.apache.kafka.tools.TopicCommand", &full).expect("TopicCommand")
}

/// A topic whose broker-side max.message.bytes is below the record: the broker
/// refuses it (not the producer), walpost halts naming the event and the fix, and
/// nothing from its transaction on is confirmed. Raised limit: delivered.
#[test]
fn payload_over_the_brokers_topic_limit_halts_then_is_delivered_after_the_fix() {
    let w = World::new("bad-brokerlimit");
    let topic = w.topic("order");
    topic_command(
        &w.kafka_bootstrap,
        &[
            "--create",
            "--topic",
            &topic,
            "--partitions",
            "3",
            "--replication-factor",
            "1",
            "--config",
            "max.message.bytes=2000",
        ],
    );
    let mut p = w.streaming_walpost(3, WAIT);
    let big_id = w.sql(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', '00000000-0000-4000-8000-000000000001', 'Big',
                 jsonb_build_object('blob', (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400))))
         RETURNING id",
    );
    let lsn_big = lsn_now(&w);
    let status = p.wait_exit(Duration::from_secs(90)).expect("walpost must halt on a refused record");
    assert_exit_failure("broker limit", status, &p.log_text());
    let e = last_error("broker limit", &p.log_text());
    assert!(
        e.contains(&format!("Kafka rejected event id={big_id} for topic {topic} permanently (message_size_too_large")),
        "{e}"
    );
    assert!(e.contains("raise the topic's max.message.bytes"), "{e}");
    assert!(w.confirmed_flush_lsn().unwrap() < lsn_big, "confirmed past the refused record");

    testkit::shared_kafka()
        .run_tool(
            "kafka.admin.ConfigCommand",
            &[
                "--bootstrap-server",
                &w.kafka_bootstrap,
                "--alter",
                "--entity-type",
                "topics",
                "--entity-name",
                &topic,
                "--add-config",
                "max.message.bytes=1048588",
            ],
        )
        .expect("raise max.message.bytes");
    let _fixed = w.start_walpost();
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 4, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.reordered.is_empty(), "{a:?}");
}

/// Regression: in dead-letter mode a record
/// the broker refuses (topic max.message.bytes below it) stopped the producer (the
/// gap-less guarantee), the dead letter waited on the dead producer, and walpost
/// restarted every 60 s re-sending the same transaction. Now the refused record goes to
/// the dead-letter topic within seconds, with its own transaction's LSN, the rest of the
/// stream flows, nothing is lost or duplicated, and the dead letter is counted once
/// acknowledged.
#[test]
fn regression_dead_letter_mode_with_a_broker_side_rejection_does_not_livelock() {
    let w = World::new("bad-dlq-broker");
    let topic = w.topic("order");
    topic_command(
        &w.kafka_bootstrap,
        &[
            "--create",
            "--topic",
            &topic,
            "--partitions",
            "1",
            "--replication-factor",
            "1",
            "--config",
            "max.message.bytes=2000",
        ],
    );
    let dlq = format!("{}dead", w.topic_prefix);
    let port = testkit::free_port();
    let cfg = std::env::temp_dir().join(format!("{}.toml", testkit::unique_name("dlq-broker")));
    std::fs::write(&cfg, format!("on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n")).unwrap();
    let mut args = vec!["--config".to_string(), cfg.display().to_string()];
    args.extend(w.args());
    args.extend(["--metrics-addr".to_string(), format!("127.0.0.1:{port}")]);
    let p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 1, 3, 3, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 3, WAIT);
    let started = std::time::Instant::now();
    let big_id = w.sql(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', '00000000-0000-4000-8000-000000000001', 'Big',
                 jsonb_build_object('blob', (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400))))
         RETURNING id",
    );
    let big_txn_lsn = w.sql("SELECT pg_current_wal_lsn()");
    insert_batches(&w, 1, 2, 3, 3, &["order"]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, Duration::from_secs(60));
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}:\n{}", started.elapsed(), p.log_text());
    let dead: Vec<&Consumed> = records.iter().filter(|r| r.topic == dlq).collect();
    assert_eq!(dead.len(), 1, "one dead letter: {records:?}");
    assert_eq!(dead[0].header("walpost.event.id"), Some(big_id.as_bytes()));
    assert_eq!(dead[0].header("walpost.error.class"), Some(&b"message_size_too_large"[..]));
    // The dead letter names the LSN of the refused record's own transaction: its
    // commit LSN is at or before the WAL position read right after its INSERT committed.
    let lsn = parse_lsn(std::str::from_utf8(dead[0].header("walpost.lsn").unwrap()).unwrap()).unwrap();
    let after_big = parse_lsn(&big_txn_lsn).unwrap();
    assert!(
        lsn <= after_big && lsn > lsn_after_batch(&w, 0),
        "walpost.lsn {lsn:X} is not the refused row's transaction"
    );
    let delivered: Vec<Consumed> = records.iter().filter(|r| r.topic != dlq).cloned().collect();
    let a = audit(&w, &delivered);
    assert_eq!(a.lost, vec![big_id.parse::<i64>().unwrap()], "{a:?}");
    assert!(a.duplicates == 0 && a.reordered.is_empty() && a.phantoms.is_empty(), "{a:?}");
    let metrics = http_get_metrics(port);
    assert!(metrics.contains("walpost_dead_letters_total{class=\"message_size_too_large\"} 1"), "{metrics}");
}

/// Regression (found by the poison-record drill): the broker refuses a whole
/// batch when one record in it is over the topic's max.message.bytes, and librdkafka
/// reports every record of the batch refused; in dead-letter mode the small records that
/// only shared the batch were dead-lettered too (without their values: lost to their
/// topic). Now the records of a refused batch are sent again one at a time, and only the
/// one the broker refuses on its own becomes a dead letter.
#[test]
fn regression_dead_letter_mode_dead_letters_only_the_record_too_large_of_a_refused_batch() {
    let w = World::new("bad-dlq-batch");
    let topic = w.topic("order");
    topic_command(
        &w.kafka_bootstrap,
        &[
            "--create",
            "--topic",
            &topic,
            "--partitions",
            "1",
            "--replication-factor",
            "1",
            "--config",
            "max.message.bytes=2000",
        ],
    );
    let dlq = format!("{}dead", w.topic_prefix);
    let cfg = std::env::temp_dir().join(format!("{}.toml", testkit::unique_name("dlq-batch")));
    std::fs::write(&cfg, format!("on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n")).unwrap();
    let mut args = vec!["--config".to_string(), cfg.display().to_string()];
    args.extend(w.args());
    let p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 1, 3, 3, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 3, WAIT);
    // One transaction: small, big, small events of one aggregate (one partition, one batch).
    let ids = w.sql(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'order', '00000000-0000-4000-8000-000000000001', 'E',
                CASE WHEN g = 2 THEN jsonb_build_object('blob', (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 400)))
                     ELSE jsonb_build_object('g', g) END
         FROM generate_series(1, 3) g RETURNING id",
    );
    let ids: Vec<i64> = ids.lines().map(|l| l.trim().parse().unwrap()).collect();
    insert_batches(&w, 1, 2, 3, 3, &["order"]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 12, Duration::from_secs(90));
    let dead: Vec<&Consumed> = records.iter().filter(|r| r.topic == dlq).collect();
    assert_eq!(dead.len(), 1, "only the record too large is a dead letter: {dead:?}\n{}", p.log_text());
    assert_eq!(dead[0].header("walpost.event.id"), Some(ids[1].to_string().as_bytes()));
    let delivered: Vec<Consumed> = records.iter().filter(|r| r.topic != dlq).cloned().collect();
    let a = audit(&w, &delivered);
    assert_eq!(a.lost, vec![ids[1]], "the small events of the refused batch must reach their topic: {a:?}");
    let mut seen = std::collections::HashMap::new();
    for r in &delivered {
        *seen.entry(r.event_id()).or_insert(0) += 1;
    }
    let twice: Vec<(&i64, &i32)> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        a.duplicates == 0 && a.reordered.is_empty() && a.phantoms.is_empty(),
        "{a:?} twice: {twice:?}\n{}",
        p.log_text()
    );
}

fn lsn_after_batch(w: &World, batch: u32) -> u64 {
    parse_lsn(&w.sql(&format!("SELECT lsn_after FROM public.txlog WHERE batch = {batch}"))).unwrap()
}

fn http_get_metrics(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A broker that refuses every write, the stand-in for a full disk: here the topic
/// accepts no record older than 1 ms (`message.timestamp.before.max.ms=1`) and walpost
/// stamps records with their commit time, so the broker refuses each one
/// (INVALID_RECORD). walpost halts with the event id and the broker's reason,
/// publishes nothing and confirms nothing from that transaction on; once the broker
/// takes writes again, a restart delivers every event exactly once, in order.
///
/// A real full disk makes the broker answer KAFKA_STORAGE_ERROR (or take the log
/// directory offline and stop): librdkafka retries that until message.timeout.ms and
/// walpost then reconnects from the confirmed position, the path
/// `core::kafka_outage_of_10s_loses_nothing` proves. (`min.insync.replicas=2` on a
/// one-broker cluster is no stand-in on Kafka 4.1: the broker caps the effective value
/// at the replication factor and takes the writes.)
///
/// One partition: every partition's batch is refused, and which partition's delivery
/// report arrives first is up to the network; within one partition the reports come
/// in offset order, so the first refused record is the first event (the CI run of
/// 2026-11-29 saw id=2 first with three partitions).
#[test]
fn broker_refusing_writes_halts_confirms_nothing_and_recovers_without_loss() {
    let w = World::new("bad-diskfull");
    let topic = w.topic("order");
    topic_command(
        &w.kafka_bootstrap,
        &[
            "--create",
            "--topic",
            &topic,
            "--partitions",
            "1",
            "--replication-factor",
            "1",
            "--config",
            "message.timestamp.before.max.ms=1",
        ],
    );
    let mut p = w.start_walpost();
    assert!(w.wait_for_slot(WAIT));
    let start = w.confirmed_flush_lsn().unwrap();
    insert_batches(&w, 0, 2, 5, 5, &["order"]);
    let lsn_rows = lsn_now(&w);
    let status = p.wait_exit(Duration::from_secs(90)).expect("walpost must halt when the broker refuses writes");
    assert_exit_failure("broker refuses writes", status, &p.log_text());
    let e = last_error("broker refuses writes", &p.log_text());
    assert!(e.contains(&format!("Kafka rejected event id=1 for topic {topic} permanently (invalid_timestamp")), "{e}");
    assert!(e.contains("outside what the topic accepts"), "{e}");
    assert!(e.contains("nothing from its transaction on is confirmed"), "{e}");
    assert!(read_all(&w.kafka_bootstrap, &w.topic_prefix).is_empty(), "a refused write became visible");
    let confirmed = w.confirmed_flush_lsn().unwrap();
    assert!(confirmed < lsn_rows && confirmed >= start, "confirmed past unwritten events");

    testkit::shared_kafka()
        .run_tool(
            "kafka.admin.ConfigCommand",
            &[
                "--bootstrap-server",
                &w.kafka_bootstrap,
                "--alter",
                "--entity-type",
                "topics",
                "--entity-name",
                &topic,
                "--delete-config",
                "message.timestamp.before.max.ms",
            ],
        )
        .expect("let the broker take writes again");
    let _fixed = w.start_walpost();
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.reordered.is_empty() && a.duplicates == 0, "{a:?}");
    assert!(testkit::wait_until(Duration::from_secs(60), || w.confirmed_flush_lsn().unwrap() >= lsn_rows));
}

/// No broker at the configured address at start: walpost keeps trying (a transient
/// condition), says so, confirms nothing; with the right address everything arrives.
#[test]
fn kafka_unreachable_at_start_confirms_nothing_and_loses_nothing() {
    let w = World::new("bad-nokafka");
    let nowhere = format!("127.0.0.1:{}", testkit::free_port());
    let mut p = Walpost::start(&with_flag(w.args(), "--kafka-brokers", &nowhere), &[]);
    // The slot is created (PostgreSQL is fine); the events wait in it.
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    let start = w.confirmed_flush_lsn().unwrap();
    insert_batches(&w, 0, 2, 5, 5, &["order"]);
    let lsn_rows = lsn_now(&w);
    assert!(
        testkit::wait_until(Duration::from_secs(30), || strip_ansi(&p.log_text()).contains("Connection refused")),
        "{}",
        p.log_text()
    );
    let log = strip_ansi(&p.log_text());
    let line = log.lines().find(|l| l.contains("Connection refused")).unwrap();
    eprintln!("[bad-input] Kafka unreachable: {line}");
    assert!(line.contains(&nowhere), "{line}");
    assert!(p.wait_exit(Duration::from_millis(10)).is_none(), "walpost gave up:\n{log}");
    let confirmed = w.confirmed_flush_lsn().unwrap();
    assert!(confirmed < lsn_rows && confirmed >= start, "confirmed with no broker");
    assert!(p.terminate(Duration::from_secs(60)).is_some());
    assert!(w.confirmed_flush_lsn().unwrap() < lsn_rows, "confirmed at shutdown with no broker");

    let _fixed = w.start_walpost();
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.reordered.is_empty() && a.duplicates == 0, "{a:?}");
}

// ---- malformed protocol bytes ----

/// What the corrupting proxy does to the next replication stream.
const PASS: u8 = 0;
/// Flip the new-tuple marker of the first outbox Insert (the mutation the fuzz
/// corpus's `seed-xlog-top-level-insert` cut-short/flipped forms exercise).
const CORRUPT_PGOUTPUT: u8 = 1;
/// Give the first CopyData frame after the first Insert a negative length.
const CORRUPT_FRAME: u8 = 2;

fn read_frame(s: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut header = [0; 5];
    s.read_exact(&mut header).ok()?;
    let len = i32::from_be_bytes(header[1..5].try_into().unwrap());
    let mut body = vec![0; usize::try_from(len - 4).ok()?];
    s.read_exact(&mut body).ok()?;
    Some((header[0], body))
}

/// A proxy in front of PostgreSQL (plaintext) that passes everything through, and in
/// the first replication stream after `mode` is set corrupts one message.
fn corrupting_proxy(pg_port: u16, mode: Arc<AtomicU8>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(("127.0.0.1", pg_port)) else {
                continue;
            };
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_in, &mut s_out);
                let _ = s_out.shutdown(std::net::Shutdown::Write);
            });
            let (mut s_in, mut c_out) = (server, client);
            let mode = mode.clone();
            std::thread::spawn(move || {
                let mut copy_both = false;
                while let Some((tag, mut body)) = read_frame(&mut s_in) {
                    let mut len = i32::try_from(body.len() + 4).unwrap();
                    if tag == b'W' {
                        copy_both = true;
                    }
                    let insert = tag == b'd' && body.first() == Some(&b'w') && body.get(25) == Some(&b'I');
                    if copy_both && insert {
                        match mode.load(Ordering::SeqCst) {
                            CORRUPT_PGOUTPUT => {
                                body[25 + 5] = b'X';
                                mode.store(PASS, Ordering::SeqCst);
                            }
                            CORRUPT_FRAME => {
                                len = -1;
                                mode.store(PASS, Ordering::SeqCst);
                            }
                            _ => {}
                        }
                    }
                    let mut out = vec![tag];
                    out.extend_from_slice(&len.to_be_bytes());
                    out.extend_from_slice(&body);
                    if c_out.write_all(&out).is_err() {
                        break;
                    }
                }
                let _ = c_out.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    port
}

/// Malformed bytes from the server, injected by a proxy into a real replication
/// stream: a pgoutput Insert with an invalid tuple marker, then a CopyData frame with
/// a negative length. Each time walpost halts with the error, never confirms the
/// corrupted record, and a clean connection then delivers every event exactly where
/// it belongs.
#[test]
fn malformed_protocol_bytes_halt_without_confirming_and_lose_nothing() {
    let w = World::new("bad-protocol");
    let mode = Arc::new(AtomicU8::new(PASS));
    let port = corrupting_proxy(w.pg.port(), mode.clone());
    let via_proxy = format!("postgres://{}:{APP_PASSWORD}@127.0.0.1:{port}/{}?sslmode=disable", w.role, w.db);
    let args = with_flag(w.args(), "--postgres", &via_proxy);

    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 1, 5, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 5, WAIT);
    p.terminate(Duration::from_secs(30));

    for (case, corruption, batch, expected_text) in [
        ("malformed pgoutput", CORRUPT_PGOUTPUT, 1, "malformed pgoutput message at LSN"),
        (
            "malformed frame",
            CORRUPT_FRAME,
            2,
            "PostgreSQL protocol violation: backend message 'd' has invalid length -1",
        ),
    ] {
        let before = w.confirmed_flush_lsn().unwrap();
        insert_batches(&w, batch, 1, 5, 5, &["order"]);
        let lsn_rows = lsn_now(&w);
        mode.store(corruption, Ordering::SeqCst);
        let (status, log) = run_to_exit(&args);
        assert_exit_failure(case, status, &log);
        let e = last_error(case, &log);
        assert!(e.contains(expected_text), "{case}: {e}");
        let confirmed = w.confirmed_flush_lsn().unwrap();
        assert!(confirmed < lsn_rows && confirmed >= before, "{case}: confirmed past the corrupted record");
        assert_eq!(mode.load(Ordering::SeqCst), PASS, "{case}: the proxy did not corrupt anything");
    }

    let _clean = w.start_walpost();
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 15, WAIT);
    let a = audit(&w, &records);
    assert!(
        a.lost.is_empty() && a.phantoms.is_empty() && a.reordered.is_empty() && a.wrong_content.is_empty(),
        "{a:?}"
    );
}

// ---- privileges ----

/// docs/least-privilege.md, recipe A: a role with LOGIN REPLICATION, USAGE on the
/// schema and SELECT on the outbox, that owns nothing. With no publication walpost
/// cannot create one and says how to; once the table owner has created it, the same
/// role streams every event.
#[test]
fn reader_role_needs_the_publication_created_by_the_owner() {
    let w = World::new("bad-reader");
    let reader = format!("reader_{}", w.slot);
    w.sql(&format!(
        "CREATE ROLE {reader} LOGIN REPLICATION PASSWORD 'pw';
         GRANT USAGE ON SCHEMA events TO {reader}; GRANT SELECT ON events.outbox TO {reader};"
    ));
    let url = w.pg.url_for(&reader, "pw", &w.db);
    let args = with_flag(w.args(), "--postgres", &url);
    let (status, log) = run_to_exit(&args);
    assert_exit_failure("reader role, no publication", status, &log);
    let e = last_error("reader role, no publication", &log);
    assert!(e.contains(&format!("cannot create publication \"{}_pub\"", w.slot)), "{e}");
    assert!(
        e.contains("(SQLSTATE 42501)")
            && e.contains("create it as the table owner or a superuser with: CREATE PUBLICATION"),
        "{e}"
    );
    assert!(w.confirmed_flush_lsn().is_none(), "no slot may be created");

    // The owner (walpost's usual test role) creates the publication walpost asked for.
    w.pg
        .psql_as(
            &w.role,
            &w.db,
            &format!(
                "CREATE PUBLICATION {}_pub FOR TABLE events.outbox WITH (publish = 'insert', publish_via_partition_root = true)",
                w.slot
            ),
        )
        .expect("the owner creates the publication");
    let p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 2, 5, 5, &["order"]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.reordered.is_empty() && a.duplicates == 0, "{a:?}");
}

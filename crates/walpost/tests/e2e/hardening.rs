//! Issue 19's findings, each a regression test against the real servers: row-chosen
//! topics outside the allowed set, SQL through settings, secrets and column values in
//! logs.

use std::time::{Duration, Instant};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

fn config(w: &World, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}-{}.toml", w.db, testkit::unique_name("hard")));
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    path.display().to_string()
}

fn start_with(w: &World, toml: &str) -> Walpost {
    let mut args = vec!["--config".to_string(), config(w, toml)];
    args.extend(w.args().into_iter().filter(|a| !a.contains("${routedByValue}") && a != "--topic"));
    Walpost::start(&args, &[])
}

/// Inserts one outbox row routed by `aggregate_type`; its id and the WAL position right
/// after its commit.
fn insert_row(w: &World, aggregate_type: &str) -> (String, u64) {
    let id = w.sql(&format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('{aggregate_type}', gen_random_uuid(), 'E', '{{\"n\": 1}}') RETURNING id"
    ));
    (id, parse_lsn(&w.sql("SELECT pg_current_wal_lsn()")).unwrap())
}

fn halts_within(p: &mut Walpost, limit: Duration) -> String {
    let started = Instant::now();
    let status = p.wait_exit(Duration::from_secs(60)).expect("walpost must halt");
    assert_eq!(status.code(), Some(1), "{}", p.log_text());
    assert!(started.elapsed() < limit, "halted after {:?}", started.elapsed());
    p.log_text()
}

/// A route value the regex does not match was used as the topic name as it is, so a
/// row could publish into another team's topic; and a row routed to
/// `__consumer_offsets` made librdkafka fail for good and walpost restart every 60 s,
/// re-sending the transaction each time. Now: a routing error (halt within seconds,
/// nothing confirmed past the row, nothing published there), or a dead letter.
#[test]
fn regression_rows_cannot_choose_topics_outside_the_allowed_set() {
    let w = World::new("hard-topics");
    let prefix = &w.topic_prefix;
    // 1. The regex does not match: halt, naming the option that restores Debezium's way.
    let strict = format!(
        "[router]\n\"route.topic.regex\" = \"(?<routedByValue>order|payment)\"\n\"route.topic.replacement\" = \"{prefix}${{routedByValue}}\"\n"
    );
    let mut p = start_with(&w, &strict);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 1, 3, 3, &["order"]);
    consume_at_least(&w.kafka_bootstrap, prefix, 3, WAIT);
    let (id, lsn) = insert_row(&w, "otherteam.ledger");
    let log = halts_within(&mut p, Duration::from_secs(10));
    assert!(log.contains(&format!("in event id {id}")) && log.contains("route.topic.regex.fallthrough"), "{log}");
    assert!(!log.contains("otherteam.ledger"), "the row's value reached the log:\n{log}");
    assert!(w.confirmed_flush_lsn().unwrap() < lsn, "confirmed past the refused row");
    assert!(read_all(&w.kafka_bootstrap, "otherteam.").is_empty());

    // 2. Debezium's fall-through with every topic allowed: still never an internal topic.
    let w = World::new("hard-internal");
    let prefix = &w.topic_prefix;
    let open = format!(
        "[router]\n\"route.topic.regex\" = \"(?<routedByValue>order|payment)\"\n\"route.topic.replacement\" = \"{prefix}${{routedByValue}}\"\n\"route.topic.regex.fallthrough\" = true\n\"topics.allow\" = [\"*\"]\n"
    );
    let mut p = start_with(&w, &open);
    assert!(w.wait_for_slot(WAIT));
    let (id, lsn) = insert_row(&w, "__consumer_offsets");
    let log = halts_within(&mut p, Duration::from_secs(10));
    assert!(log.contains(&format!("in event id {id}")) && log.contains("is refused"), "{log}");
    assert!(w.confirmed_flush_lsn().unwrap() < lsn, "confirmed past the refused row");

    // 3. Dead-letter mode: rows outside the allowed prefix (after the fall-through) and
    // for an internal topic go to the dead-letter topic within seconds, the stream goes
    // on, nothing is duplicated.
    let w = World::new("hard-dlq-topics");
    let prefix = &w.topic_prefix;
    let dlq = format!("{prefix}dead");
    let dead_letters = format!(
        "on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n[router]\n\"route.topic.regex\" = \"(?<routedByValue>order|payment)\"\n\"route.topic.replacement\" = \"{prefix}${{routedByValue}}\"\n\"route.topic.regex.fallthrough\" = true\n"
    );
    let _p = start_with(&w, &dead_letters);
    assert!(w.wait_for_slot(WAIT));
    let started = Instant::now();
    let (outside, _) = insert_row(&w, "otherteam.ledger");
    let (internal, _) = insert_row(&w, "__team.secret.topic");
    insert_batches(&w, 0, 1, 3, 3, &["payment"]);
    let records = consume_at_least(&w.kafka_bootstrap, prefix, 5, Duration::from_secs(30));
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    let dead: Vec<&Consumed> = records.iter().filter(|r| r.topic == dlq).collect();
    assert_eq!(dead.len(), 2, "{records:?}");
    for id in [&outside, &internal] {
        assert!(dead.iter().any(|r| r.header("walpost.event.id") == Some(id.as_bytes())), "{id} not dead-lettered");
    }
    for r in &dead {
        let message = String::from_utf8_lossy(r.header("walpost.error.message").unwrap()).into_owned();
        assert!(!message.contains("otherteam") && !message.contains("__team"), "a row's value in {message}");
    }
    assert!(read_all(&w.kafka_bootstrap, "otherteam.").is_empty());
    let delivered: Vec<Consumed> = records.iter().filter(|r| r.topic != dlq).cloned().collect();
    assert_eq!(delivered.len(), 3);
    let a = audit(&w, &delivered);
    assert_eq!(a.duplicates, 0, "{a:?}");
    assert!(a.reordered.is_empty() && a.phantoms.is_empty(), "{a:?}");
}

/// `--snapshot-filter` was checked by running it, and stacked statements ran outside
/// the read-only transaction; a publication name reached SQL through quote-doubling,
/// which `standard_conforming_strings = off` defeats. Both leave no table behind now.
#[test]
fn regression_sql_through_a_setting_creates_nothing() {
    let w = World::new("hard-sql");
    w.sql(&format!("ALTER DATABASE \"{}\" SET standard_conforming_strings = off", w.db));
    let mut args = w.args();
    args.extend(
        ["--snapshot", "initial", "--snapshot-filter", "false); CREATE TABLE public.pwned_filter (); SELECT (1"]
            .map(String::from),
    );
    let mut p = Walpost::start(&args, &[]);
    let status = p.wait_exit(Duration::from_secs(60)).expect("must refuse the filter");
    assert_eq!(status.code(), Some(1), "{}", p.log_text());
    assert!(p.log_text().contains("is not a valid condition"), "{}", p.log_text());

    let mut args = w.args();
    let i = args.iter().position(|a| a == "--publication").unwrap();
    args[i + 1] = "x\\'; CREATE TABLE public.pwned_name (); --".into();
    let mut p = Walpost::start(&args, &[]);
    let status = p.wait_exit(Duration::from_secs(60)).expect("must refuse the name");
    assert_eq!(status.code(), Some(1), "{}", p.log_text());
    assert!(p.log_text().contains("publication"), "{}", p.log_text());

    let tables = w.sql("SELECT count(*) FROM pg_class WHERE relname LIKE 'pwned%'");
    assert_eq!(tables, "0", "an injected statement ran");
    assert!(w.confirmed_flush_lsn().is_none(), "no slot may be created");
}

/// Secrets and column values never reach the log: a canary password in the connection
/// string, in a Kafka SASL password and in a broken config file, and a canary column
/// value in rows that fail to route (an invalid topic, a NULL key with the canary in
/// the payload).
#[test]
fn regression_no_secret_or_column_value_in_any_log_line() {
    const PASSWORD: &str = "Canary-Pw/With?Odd@Chars#1";
    const VALUE: &str = "canary.person@example.com";
    let w = World::new("hard-canary");
    let mut logs = Vec::new();
    let run = |args: Vec<String>, env: &[(&str, &str)]| {
        let mut p = Walpost::start(&args, env);
        let _ = p.wait_exit(Duration::from_secs(60));
        p.log_text()
    };
    // A broken URL with the password, and an unreachable server with it.
    let url = format!("postgres://app:{}@127.0.0.1:1/db?sslmode=disable&bogus=1", PASSWORD);
    logs.push(run(vec!["run".into(), "--postgres".into(), url, "--kafka-brokers".into(), "127.0.0.1:1".into()], &[]));
    let url = format!("postgres://app:{}@[::1/db", PASSWORD);
    logs.push(run(vec!["run".into(), "--postgres".into(), url, "--kafka-brokers".into(), "127.0.0.1:1".into()], &[]));
    // A config file with the SASL password and a syntax error on the same line.
    let bad = config(&w, &format!("[kafka.properties]\n\"sasl.password\" = \"{PASSWORD}\" oops\n"));
    logs.push(run(vec!["--config".into(), bad, "run".into()], &[]));
    // The same secret in a group-readable file: refused with the chmod, not shown.
    let path = std::env::temp_dir().join(format!("{}-open.toml", w.db));
    std::fs::write(&path, format!("[kafka.properties]\n\"sasl.password\" = \"{PASSWORD}\"\n")).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let open = run(vec!["--config".into(), path.display().to_string(), "run".into()], &[]);
    assert!(open.contains("chmod 600"), "{open}");
    logs.push(open);
    // Rows whose values fail to route.
    w.sql("ALTER TABLE events.outbox ALTER COLUMN aggregate_id DROP NOT NULL");
    let mut p = w.start_walpost();
    assert!(w.wait_for_slot(WAIT));
    w.sql(&format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('{VALUE}', gen_random_uuid(), 'E', '{{}}')"
    ));
    let _ = p.wait_exit(Duration::from_secs(60)).expect("halts on the invalid topic");
    logs.push(p.log_text());
    w.sql("DELETE FROM events.outbox");
    w.drop_slot();
    let mut p = w.start_walpost();
    assert!(w.wait_for_slot(WAIT));
    w.sql(&format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', NULL, 'E', '{{\"email\": \"{VALUE}\"}}')"
    ));
    let _ = p.wait_exit(Duration::from_secs(60)).expect("halts on the NULL key");
    logs.push(p.log_text());
    for (i, log) in logs.iter().enumerate() {
        assert!(log.contains("ERROR"), "run {i} did not fail:\n{log}");
        for line in log.lines() {
            assert!(!line.contains(PASSWORD) && !line.contains("Canary-Pw"), "run {i} logged the password: {line}");
            assert!(!line.contains(VALUE), "run {i} logged a column value: {line}");
        }
    }
}

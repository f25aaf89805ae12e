//! The security review's findings, each a regression test against the real servers: row-chosen
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

/// Regression: 300 distinct `aggregate_type` values within the allowed
/// prefix created 300 topics, and a row behind them arrived after 31 s, because the first
/// record per topic was sent alone. Now the first records of new topics go out together
/// (each alone in its topic) and the number of topics rows may open is capped
/// (`topics.max`). 1,000 new topics (on a broker of their own, one partition each), then
/// one event of a topic that exists: it arrives within seconds, and every event arrives.
#[test]
fn regression_a_thousand_new_topics_do_not_stall_the_row_behind_them() {
    let kafka =
        testkit::Kafka::start(testkit::KafkaOptions { extra_props: vec![("num.partitions".into(), "1".into())] })
            .expect("start a broker");
    let w = World::on(testkit::shared_postgres(), &kafka.bootstrap(), "many-topics");
    let config = crate::drills::service_config(&w, "");
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + "\"topics.max\" = 1100\n").unwrap();
    let mut p = crate::drills::service(&config, &[]);
    assert!(w.wait_for_slot(Duration::from_secs(120)), "{}", p.log_text());
    insert_batches(&w, 0, 1, 5, 5, &["order"]);
    wait_for_every_committed(&w, Duration::from_secs(120));
    let started = Instant::now();
    w.sql(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'burst' || g, gen_random_uuid(), 'E', '{}' FROM generate_series(1, 1000) g",
    );
    w.sql("INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', gen_random_uuid(), 'Behind', '{}')");
    let behind: i64 = w.sql("SELECT id FROM events.outbox WHERE event_type = 'Behind'").parse().unwrap();
    let arrived = testkit::wait_until(Duration::from_secs(60), || {
        read_all(&w.kafka_bootstrap, &w.topic("order")).iter().any(|r| r.event_id() == behind)
    });
    let delay = started.elapsed();
    assert!(arrived, "the event behind 1,000 new topics did not arrive within 60 s:\n{}", p.log_text());
    let records = wait_for_every_committed(&w, Duration::from_secs(300));
    let all = started.elapsed();
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.duplicates == 0 && a.reordered.is_empty(), "{a:?}");
    eprintln!("[many-topics] the event behind 1,000 new topics arrived after {delay:?}; all 1,001 after {all:?}");
    assert!(delay < Duration::from_secs(15), "the event behind them took {delay:?}");
    assert!(p.is_running(), "{}", p.log_text());
}

/// A row that would open one topic more than `topics.max` is a routing
/// error: walpost halts on it (nothing after it confirmed), or dead-letters it.
#[test]
fn rows_beyond_topics_max_halt_or_are_dead_lettered() {
    let w = World::new("topics-max");
    let config = crate::drills::service_config(&w, "");
    std::fs::write(&config, std::fs::read_to_string(&config).unwrap() + "\"topics.max\" = 2\n").unwrap();
    let mut p = crate::drills::service(&config, &[]);
    assert!(w.wait_for_slot(Duration::from_secs(120)), "{}", p.log_text());
    insert_batches(&w, 0, 1, 4, 4, &["a", "b"]);
    wait_for_every_committed(&w, Duration::from_secs(120));
    // Regression (CI on PostgreSQL 18, 2026-12-02): the check was against a position read
    // before the transaction, which an idle walpost may rightly pass (WAL of the other
    // tests' databases); the bound is a position inside the refused transaction.
    let inside = insert_refused_batch(&w, 1, 3, 3, "c");
    assert_eq!(p.wait_exit(Duration::from_secs(60)).and_then(|s| s.code()), Some(1), "{}", p.log_text());
    assert!(p.log_text().contains("but topics.max is 2"), "{}", p.log_text());
    let confirmed = w.confirmed_flush_lsn();
    assert!(
        confirmed <= Some(inside),
        "confirmed {confirmed:?} at or past the refused transaction (inside it: {inside:X})"
    );
    let dead = crate::drills::service_config(&w, "on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"DLQ\"");
    let dead_letter_topic = format!("{}dlq", w.topic_prefix);
    let text = std::fs::read_to_string(&dead).unwrap().replace("\"DLQ\"", &format!("\"{dead_letter_topic}\""));
    std::fs::write(&dead, text + "\"topics.max\" = 2\n").unwrap();
    // The cap counts the topics this process routed to: the waiting "c" rows open one,
    // "d" the second, and "e" would be the third.
    let _p = crate::drills::service(&dead, &[]);
    insert_batches(&w, 2, 1, 3, 3, &["d"]);
    insert_batches(&w, 3, 1, 3, 3, &["e"]);
    let letters = consume_at_least(&w.kafka_bootstrap, &dead_letter_topic, 3, Duration::from_secs(120));
    assert_eq!(letters.len(), 3, "{letters:?}");
    assert!(letters.iter().all(|r| r.header("walpost.error.class") == Some(&b"too_many_topics"[..])), "{letters:?}");
    assert!(topics_with_prefix(&w.kafka_bootstrap, &w.topic("e")).is_empty(), "topic e was created");
}

/// Peak resident memory of a process (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Regression: a 200 MB payload took walpost from 14.5 MB to 422 MB RSS,
/// and frames up to 1 GiB were read whole, so an out-of-memory kill could re-read the
/// same row forever. A WAL message over `[pipeline] max_message_bytes` is now read and
/// dropped as it arrives: in halt mode walpost stops naming the event, its size and the
/// limit, with nothing confirmed past it; in dead-letter mode the event's dead letter
/// (id, key, no value) goes out, the stream goes on, and walpost's peak RSS stays in
/// tens of megabytes for a 1 GB row.
#[test]
fn regression_a_row_over_max_message_bytes_is_never_buffered_whole() {
    let w = World::new("huge-row");
    w.sql("ALTER TABLE events.outbox ADD COLUMN blob text");
    let config = crate::drills::service_config(&w, "[pipeline]\nmax_message_bytes = 4000000");
    let mut p = crate::drills::service(&config, &[]);
    assert!(w.wait_for_slot(Duration::from_secs(120)), "{}", p.log_text());
    insert_batches(&w, 0, 1, 5, 5, &["order"]);
    wait_for_every_committed(&w, Duration::from_secs(120));
    // The bound: a WAL position inside the refused transaction (see insert_refused_batch).
    let inside = w.sql(
        "BEGIN;
         INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload, blob) VALUES ('order', gen_random_uuid(), 'Huge', '{}', repeat('x', 8000000));
         SELECT pg_current_wal_insert_lsn();
         COMMIT;",
    );
    let huge: i64 = w.sql("SELECT id FROM events.outbox WHERE event_type = 'Huge'").parse().unwrap();
    assert_eq!(p.wait_exit(Duration::from_secs(120)).and_then(|s| s.code()), Some(1), "{}", p.log_text());
    let log = p.log_text();
    assert!(
        log.contains(&format!("event id {huge} is ")) && log.contains("over the per-message limit of 4000000 bytes"),
        "{log}"
    );
    assert!(w.confirmed_flush_lsn() <= parse_lsn(&inside), "confirmed at or past the refused row");

    // Dead-letter mode, and a row of 1 GB.
    let dlq = format!("{}dlq", w.topic_prefix);
    let dead = crate::drills::service_config(
        &w,
        &format!("on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n[pipeline]\nmax_message_bytes = 4000000"),
    );
    let mut p = crate::drills::service(&dead, &[]);
    let letter_id =
        |r: &Consumed| String::from_utf8_lossy(r.header("walpost.event.id").unwrap_or_default()).into_owned();
    let letters = consume_at_least(&w.kafka_bootstrap, &dlq, 1, Duration::from_secs(120));
    assert_eq!(letter_id(&letters[0]), huge.to_string(), "{:?}", letters[0]);
    w.sql("INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload, blob) VALUES ('order', gen_random_uuid(), 'Giant', '{}', repeat('x', 1000000000))");
    let giant: i64 = w.sql("SELECT id FROM events.outbox WHERE event_type = 'Giant'").parse().unwrap();
    insert_batches(&w, 1, 1, 5, 5, &["order"]);
    let letters = consume_at_least(&w.kafka_bootstrap, &dlq, 2, Duration::from_secs(600));
    let letter = letters.iter().find(|r| letter_id(r) == giant.to_string()).expect("the 1 GB row's dead letter");
    assert_eq!(letter.header("walpost.error.class"), Some(&b"message_too_large"[..]), "{letter:?}");
    assert!(letter.value.as_ref().is_none_or(|v| v.is_empty()), "the dead letter carries no value");
    let expected = w.committed_rows().len() - 2;
    let live = consume_at_least(&w.kafka_bootstrap, &w.topic("order"), expected, Duration::from_secs(120));
    let a = audit(&w, &live);
    assert_eq!(a.lost, vec![huge, giant], "only the two rows too large are not in their topic: {a:?}");
    let peak = peak_rss(p.pid());
    eprintln!("[huge-row] walpost's peak RSS with a 1 GB row: {:.1} MB", peak as f64 / 1e6);
    assert!(peak > 0 && peak < 100_000_000, "peak RSS {peak} bytes");
    assert!(p.is_running(), "{}", p.log_text());
}

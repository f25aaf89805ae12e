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

fn walpost_output(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_walpost"));
    cmd.args(args).env_remove("WALPOST_POSTGRES");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Regression: `walpost import-debezium` printed `database.sslpassword`'s
/// value, the JAAS line with its password, `notification.sink.password`, echoed a
/// `key value` properties line whole, and pasted a `database.dbname` of
/// `shop?sslmode=disable&require_auth=password` into the URL as options. Secrets are now
/// named, never shown; the user name of the JAAS line is carried over; the dbname is
/// percent-encoded.
#[test]
fn regression_import_debezium_never_prints_a_secret() {
    const CANARY: &str = "CANARY-s3cr3t-9f2c";
    let dir = std::env::temp_dir().join(testkit::unique_name("import-canary"));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("connector.json");
    std::fs::write(
        &json,
        format!(
            r#"{{"name": "outbox", "config": {{
                "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                "database.hostname": "db", "database.user": "cdc", "database.password": "{CANARY}",
                "database.dbname": "shop?sslmode=disable&require_auth=password",
                "database.sslpassword": "{CANARY}",
                "producer.override.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"svc\" password=\"{CANARY}\";",
                "producer.override.sasl.mechanism": "PLAIN",
                "notification.sink.password": "{CANARY}",
                "transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
                "transforms.outbox.secret.thing": "{CANARY}"
            }}}}"#
        ),
    )
    .unwrap();
    let (_, out) = walpost_output(&["import-debezium", json.to_str().unwrap()], &[]);
    assert!(!out.contains(CANARY), "a secret was printed:\n{out}");
    assert!(out.contains("database.sslpassword") && out.contains("notification.sink.password"), "{out}");
    assert!(out.contains("\"sasl.username\" = \"svc\"") && out.contains("WALPOST_KAFKA_SASL_PASSWORD"), "{out}");
    assert!(out.contains("/shop%3Fsslmode%3Ddisable%26require_auth%3Dpassword"), "{out}");
    assert!(!out.contains("?sslmode=disable"), "{out}");

    let props = dir.join("application.properties");
    std::fs::write(
        &props,
        format!("debezium.source.database.hostname db\ndebezium.source.database.password {CANARY}\nnotakeyvalue\n"),
    )
    .unwrap();
    let (code, out) = walpost_output(&["import-debezium", props.to_str().unwrap()], &[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(!out.contains(CANARY) && out.contains("line 3 is not key=value"), "{out}");
}

/// Regression: a password in `--postgres` is readable by any local user
/// from /proc/PID/cmdline; walpost warned about `sasl.password` on the command line but
/// not about this. Now it warns (and never prints the password); the same URL in
/// `WALPOST_POSTGRES` draws no warning.
#[test]
fn regression_a_postgres_password_on_the_command_line_is_warned_about() {
    const CANARY: &str = "CANARY-pw-7731";
    let url = format!("postgres://app:{CANARY}@127.0.0.1:1/shop?connect_timeout=1");
    let args = ["check", "--postgres", url.as_str(), "--kafka-brokers", "127.0.0.1:1"];
    let (_, out) = walpost_output(&args, &[]);
    assert!(out.contains(walpost::settings::secrets::POSTGRES_PASSWORD_ON_ARGV), "{out}");
    assert!(!out.contains(CANARY), "the password was printed:\n{out}");
    let (_, out) = walpost_output(&["check", "--kafka-brokers", "127.0.0.1:1"], &[("WALPOST_POSTGRES", url.as_str())]);
    assert!(!out.contains("on the command line") && !out.contains(CANARY), "{out}");
}

/// Regression: `walpost replay --help` listed options of `run` only
/// (`--snapshot`, `--slot-failover`, `--signal-table`, `--heartbeat-interval`,
/// `--delivery`), which replay ignores.
#[test]
fn regression_replay_help_lists_only_what_replay_uses() {
    let (_, help) = walpost_output(&["replay", "--help"], &[]);
    for run_only in
        ["--snapshot", "--slot-failover", "--signal-table", "--heartbeat-interval", "--delivery", "--metrics-addr"]
    {
        assert!(!help.contains(run_only), "{run_only} in replay --help:\n{help}");
    }
    for replay in ["--since", "--where", "--unsafe-where", "--statement-timeout", "--postgres", "--dead-letter-topic"] {
        assert!(help.contains(replay), "{replay} missing from replay --help:\n{help}");
    }
    let (_, run) = walpost_output(&["run", "--help"], &[]);
    assert!(run.contains("--snapshot") && run.contains("--on-permanent-error"), "{run}");
}

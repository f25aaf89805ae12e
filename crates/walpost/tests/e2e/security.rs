//! Transport and authentication (TLS with certificate checks, SCRAM, md5, Unix sockets),
//! and what other database roles can plant for walpost to run (signal filters, functions).

use std::time::Duration;

use testkit::{PgOptions, Postgres};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

fn args_with_url(w: &World, url: &str) -> Vec<String> {
    let mut args = w.args();
    let i = args.iter().position(|a| a == "--postgres").unwrap();
    args[i + 1] = url.to_owned();
    args
}

/// One stream run: start, insert a batch of 10, wait for it, stop cleanly. Returns
/// whether walpost's replication connection used TLS.
fn stream_once(w: &World, url: &str, first_batch: u32, expected_total: usize) -> bool {
    let mut p = Walpost::start(&args_with_url(w, url), &[]);
    // Rows committed before the slot exists are not streamed (no snapshot).
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(w, first_batch, 1, 10, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, expected_total, WAIT);
    let tls = w.sql(
        "SELECT bool_or(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
         WHERE a.application_name = 'walpost' AND a.backend_type = 'walsender'",
    ) == "t";
    let status = p.terminate(Duration::from_secs(30)).expect("stops on SIGTERM");
    assert!(status.success(), "{}", p.log_text());
    assert!(!p.log_text().contains("pw-md5") && !p.log_text().contains(":walpost@"), "password in log");
    tls
}

#[test]
fn tls_verify_full_md5_and_unix_socket_all_stream() {
    let pg: &'static Postgres = Box::leak(Box::new(
        Postgres::start(PgOptions {
            tls: true,
            extra_hba: vec![
                "host all md5user 127.0.0.1/32 md5".into(),
                "host replication md5user 127.0.0.1/32 md5".into(),
            ],
            ..PgOptions::default()
        })
        .expect("start postgres with TLS"),
    ));
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "tls");
    let tls = pg.tls_dir().unwrap().to_owned();
    let ca = tls.join("ca.crt").display().to_string();

    // TLS, certificate chain and host name checked; SCRAM-SHA-256 inside.
    let verify_full = format!("{}?sslmode=verify-full&sslrootcert={ca}", pg.url_for("walpost", "walpost", &w.db));
    assert!(stream_once(&w, &verify_full, 0, 10), "verify-full must stream over TLS");

    // md5 authentication (a role whose password is stored as md5).
    w.sql(
        "SET password_encryption = 'md5'; CREATE ROLE md5user LOGIN REPLICATION PASSWORD 'pw-md5';
         GRANT USAGE ON SCHEMA events TO md5user; GRANT SELECT ON events.outbox TO md5user;",
    );
    // Over plain TCP walpost sends an md5 response only when told to (require_auth).
    let md5 = format!("{}?sslmode=disable&require_auth=md5", pg.url_for("md5user", "pw-md5", &w.db));
    assert!(!stream_once(&w, &md5, 1, 20), "sslmode=disable must not use TLS");

    // Unix socket (trust for local connections in the harness's pg_hba.conf).
    let socket = format!("postgres://walpost@/{}?host={}&port={}", w.db, pg.socket_dir().display(), pg.port());
    assert!(!stream_once(&w, &socket, 2, 30));

    // A certificate that does not chain to the given root: refused, nothing streamed.
    let wrong_ca = tls.join("client.crt").display().to_string();
    let url = format!("{}?sslmode=verify-full&sslrootcert={wrong_ca}", pg.url_for("walpost", "walpost", &w.db));
    let mut p = Walpost::start(&args_with_url(&w, &url), &[]);
    let status = p.wait_exit(Duration::from_secs(60)).expect("walpost must stop on a bad certificate");
    assert!(!status.success());
    assert!(p.log_text().contains("TLS to PostgreSQL failed"), "{}", p.log_text());
    assert!(p.log_text().contains("certificate"), "{}", p.log_text());

    let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.reordered.is_empty() && a.duplicates == 0, "{a:?}");
    assert_eq!(records.len(), 30);
}

/// Kafka SASL/PLAIN through librdkafka properties: walpost streams to a SASL listener
/// with the right credentials, and a wrong password is reported, not silently retried
/// forever without a word.
#[test]
fn kafka_sasl_plain_through_kafka_properties() {
    let sasl_port = testkit::free_port();
    let jaas = "org.apache.kafka.common.security.plain.PlainLoginModule required \
                username=\"admin\" password=\"admin-secret\" user_admin=\"admin-secret\" user_walpost=\"walpost-secret\";";
    let kafka: &'static testkit::Kafka = Box::leak(Box::new(
        testkit::Kafka::start(testkit::KafkaOptions {
            extra_props: vec![
                (
                    "listeners".into(),
                    format!("PLAINTEXT://127.0.0.1:{{port}},CONTROLLER://127.0.0.1:{{controller_port}},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"),
                ),
                (
                    "advertised.listeners".into(),
                    format!("PLAINTEXT://127.0.0.1:{{port}},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"),
                ),
                (
                    "listener.security.protocol.map".into(),
                    "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT".into(),
                ),
                ("sasl.enabled.mechanisms".into(), "PLAIN".into()),
                ("listener.name.sasl_plaintext.plain.sasl.jaas.config".into(), jaas.into()),
            ],
        })
        .expect("start kafka with a SASL listener"),
    ));
    // walpost talks to the SASL listener only; the test reads through the plain one.
    let w = World::on(testkit::shared_postgres(), &kafka.bootstrap(), "sasl");
    let mut args = w.args();
    let i = args.iter().position(|a| a == "--kafka-brokers").unwrap();
    args[i + 1] = format!("127.0.0.1:{sasl_port}");
    for p in ["security.protocol=SASL_PLAINTEXT", "sasl.mechanisms=PLAIN", "sasl.username=walpost"] {
        args.extend(["--kafka-property".to_string(), p.to_string()]);
    }
    let mut good = args.clone();
    good.extend(["--kafka-property".to_string(), "sasl.password=walpost-secret".to_string()]);
    // Regression: `walpost check` built a bare Kafka client without [kafka.properties]
    // and reported a SASL cluster unreachable.
    let mut check = good.clone();
    check[0] = "check".into();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walpost")).args(&check).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains(&format!("ok    Kafka at 127.0.0.1:{sasl_port}: 1 broker(s)")), "{report}");
    assert!(!report.contains("not reachable"), "{report}");
    let mut p = Walpost::start(&good, &[]);
    assert!(w.wait_for_slot(WAIT));
    insert_batches(&w, 0, 1, 10, 5, &["order"]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 10, WAIT);
    assert_eq!(records.len(), 10);
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success());
    assert!(!p.log_text().contains("walpost-secret"), "SASL password in the log");

    let mut bad = args;
    bad.extend(["--kafka-property".to_string(), "sasl.password=wrong".to_string()]);
    let mut p = Walpost::start(&bad, &[]);
    insert_batches(&w, 1, 1, 10, 5, &["order"]);
    assert!(
        testkit::wait_until(Duration::from_secs(60), || p.log_text().contains("Authentication failed")),
        "{}",
        p.log_text()
    );
    assert!(!p.log_text().contains("sasl.password=wrong"));
    assert_eq!(read_all(&w.kafka_bootstrap, &w.topic_prefix).len(), 10, "nothing published without authentication");
    // Nothing of the unauthenticated run was confirmed: with the right password again,
    // every event arrives (a confirmed-but-unpublished event would never be re-sent).
    p.kill9();
    let _fixed = Walpost::start(&good, &[]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 20, WAIT);
    let a = audit(&w, &records);
    assert!(a.lost.is_empty() && a.phantoms.is_empty() && a.reordered.is_empty(), "{a:?}");
}

/// A role with INSERT on the signal table and nothing else put SQL into a
/// signal's filter, and walpost ran it as its REPLICATION role: it dropped another slot,
/// ended walpost's walsender, read pg_stat_activity through error texts, froze
/// confirmation with pg_sleep and forged events with pg_logical_emit_message. Now a
/// filter is parsed into columns-against-constants: each of those rows is refused and
/// logged, nothing of it runs, and a plain filter from the same role still replays.
/// And walpost refuses to run while PUBLIC, or a role outside `[signal] allowed_roles`,
/// may insert signals.
#[test]
fn regression_a_signal_filter_cannot_run_sql_as_walpost() {
    let w = World::new("sec-signal");
    let writer = format!("sigw_{}", w.slot);
    let victim = format!("victim_{}", w.slot);
    w.sql(&format!(
        "CREATE TABLE events.debezium_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));
         ALTER TABLE events.debezium_signal OWNER TO {role};
         CREATE ROLE {writer} LOGIN;
         GRANT USAGE ON SCHEMA events TO {writer};
         GRANT INSERT ON events.debezium_signal TO PUBLIC;
         SELECT pg_create_logical_replication_slot('{victim}', 'pgoutput');",
        role = w.role
    ));
    let base = crate::drills::service_config(&w, "signal_table = \"events.debezium_signal\"");
    // PUBLIC may insert signals: refused, with the REVOKE to run.
    let mut p = crate::drills::service(&base, &[]);
    assert_eq!(p.wait_exit(WAIT).and_then(|s| s.code()), Some(1), "{}", p.log_text());
    let table = walpost::settings::TableName { schema: "events".into(), name: "debezium_signal".into() };
    let public = texts::replay::signal_table_public(&table, &table.quoted());
    assert!(p.log_text().contains(&public), "{}", p.log_text());
    w.sql(&format!(
        "REVOKE INSERT ON events.debezium_signal FROM PUBLIC; GRANT INSERT ON events.debezium_signal TO {writer};"
    ));
    // A role outside [signal] allowed_roles may: refused, naming it.
    let mut p = crate::drills::service(&base, &[]);
    assert_eq!(p.wait_exit(WAIT).and_then(|s| s.code()), Some(1), "{}", p.log_text());
    assert!(
        p.log_text().contains(&texts::replay::signal_table_roles(
            &table,
            &table.quoted(),
            &[writer.as_str()],
            &[replication::quote_ident(&writer)]
        )),
        "{}",
        p.log_text()
    );
    let config = crate::drills::service_config(
        &w,
        &format!("signal_table = \"events.debezium_signal\"\n[signal]\nallowed_roles = [\"{writer}\"]\n[monitor]\ninterval_secs = 1"),
    );
    let mut p = crate::drills::service(&config, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 2, 10, 5, &["order", "payment"]);
    wait_for_every_committed(&w, WAIT);

    let hostile = [
        format!("(SELECT pg_drop_replication_slot(''{victim}'')) IS NULL"),
        format!(
            "(SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = ''{}'') IS NOT NULL",
            w.slot
        ),
        "id = (SELECT string_agg(query, '','') FROM pg_stat_activity)::int".to_owned(),
        "pg_sleep(100000) IS NOT NULL".to_owned(),
        "pg_logical_emit_message(true, ''forged'', ''{}'') IS NOT NULL".to_owned(),
    ];
    for (i, filter) in hostile.iter().enumerate() {
        w.pg
            .psql_as(
                &writer,
                &w.db,
                &format!(
                    r#"INSERT INTO events.debezium_signal VALUES ('evil-{i}', 'execute-snapshot',
                       '{{"data-collections": ["events.outbox"], "additional-conditions": [{{"data-collection": "events.outbox", "filter": "{filter}"}}]}}')"#
                ),
            )
            .unwrap_or_else(|e| panic!("signal {i}: {e}"));
    }
    let refused =
        testkit::wait_until(WAIT, || p.log_text().matches("not a condition walpost runs").count() >= hostile.len());
    assert!(refused, "{}", p.log_text());
    assert!(!p.log_text().contains("signal: replay started"), "{}", p.log_text());
    assert_eq!(
        w.sql(&format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{victim}'")),
        "1",
        "the other slot was dropped"
    );
    // Confirmation goes on (pg_sleep would have frozen it) and walpost still streams.
    let after = w.sql("SELECT pg_current_wal_lsn()");
    insert_batches(&w, 2, 1, 10, 5, &["order"]);
    assert!(testkit::wait_until(WAIT, || w.confirmed_flush_lsn() >= parse_lsn(&after)), "{}", p.log_text());
    assert!(p.is_running(), "{}", p.log_text());
    // A filter of the grammar, from the same role, replays.
    w.pg
        .psql_as(
            &writer,
            &w.db,
            r#"INSERT INTO events.debezium_signal VALUES ('ok-1', 'execute-snapshot',
               '{"data-collections": ["events.outbox"], "additional-conditions": [{"data-collection": "events.outbox", "filter": "aggregate_type = ''payment'' AND id > 0"}]}')"#,
        )
        .unwrap();
    assert!(testkit::wait_until(WAIT, || p.log_text().contains("signal: replay done")), "{}", p.log_text());
    let records = wait_for_every_committed(&w, WAIT);
    let replayed = records.iter().filter(|r| r.header("walpost.replay") == Some(&b"ok-1"[..])).count();
    assert_eq!(replayed, 10, "the payment events replayed");
    assert!(!records.iter().any(|r| r.topic.ends_with("forged")), "a forged event");
    w.sql(&format!("SELECT pg_drop_replication_slot('{victim}')"));
    // The rights are checked while walpost runs too, not only at start.
    w.sql("GRANT INSERT ON events.debezium_signal TO PUBLIC");
    assert_eq!(p.wait_exit(WAIT).and_then(|s| s.code()), Some(1), "{}", p.log_text());
    let expected = format!(
        "{} (changed while walpost was streaming)",
        texts::replay::signal_table_public(&table, &table.quoted())
    );
    assert!(p.log_text().contains(&expected), "{}", p.log_text());
}

/// `walpost replay --where` takes the same grammar unless `--unsafe-where`,
/// and a replay's statements run under a statement timeout.
#[test]
fn regression_replay_where_is_a_condition_unless_unsafe_where() {
    let w = World::new("sec-where");
    w.sql("INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', gen_random_uuid(), 'E', '{}')");
    let run = |extra: &[&str]| {
        let mut args = w.args();
        args[0] = "replay".into();
        args.extend(extra.iter().map(|s| s.to_string()));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_walpost")).args(&args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, err) = run(&["--where", "pg_sleep(1000) IS NOT NULL", "--dry-run"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("not a condition walpost runs") && err.contains("--unsafe-where"), "{err}");
    let (code, out, err) = run(&["--where", "aggregate_type = 'order'", "--dry-run"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("1 rows read"), "{out}");
    let (code, out, err) = run(&["--where", "length(aggregate_type) = 5", "--unsafe-where", "--dry-run"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("1 rows read"), "{out}");
    let started = std::time::Instant::now();
    let (code, out, err) =
        run(&["--where", "pg_sleep(60) IS NOT NULL", "--unsafe-where", "--statement-timeout", "1s", "--dry-run"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("statement timeout"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "the timeout did not end it: {:?}", started.elapsed());
}

/// A role with CREATE on `public` (every role's right on PostgreSQL 14,
/// and on clusters upgraded from it) planted overloads of built-ins that match walpost's
/// calls more exactly than the built-ins do (`to_jsonb` of the slots view's row type,
/// `left(name, integer)`, `has_table_privilege(text, oid, text)`, an `=(oid, regclass)`
/// operator, ...). Before every walpost connection fixed its search_path they ran as
/// walpost's role at start-up: with walpost a superuser, `ALTER ROLE mallory SUPERUSER`
/// went through. Migration 0002's `format(...)` call was caught the same way. Now walpost
/// runs (preflight with a signal table, an initial snapshot, retention, the slot monitor),
/// checks and drops its slot, and 0002 is applied, and nothing planted runs. The operator
/// is reached by no function name, so it tests the connections' search_path alone.
#[test]
fn regression_functions_planted_in_public_never_run_as_walpost() {
    let w = World::new("sec-path");
    let mallory = format!("mallory_{}", w.slot);
    w.sql(&format!(
        "CREATE ROLE {mallory} LOGIN;
         GRANT USAGE, CREATE ON SCHEMA public TO {mallory};
         CREATE TABLE public.planted_calls (fn text NOT NULL, by_role name NOT NULL DEFAULT current_user);
         GRANT INSERT ON public.planted_calls TO PUBLIC;
         CREATE TABLE events.debezium_signal (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));"
    ));
    // (name, parameters, result, the built-in it stands in for)
    let planted = [
        ("to_jsonb", "s pg_catalog.pg_replication_slots", "jsonb", "pg_catalog.to_jsonb(s)"),
        ("left", "s name, n integer", "text", "pg_catalog.left(s::text, n)"),
        ("has_table_privilege", "r text, t oid, p text", "boolean", "pg_catalog.has_table_privilege(r, t, p)"),
        ("hashtextextended", "t text, seed integer", "bigint", "pg_catalog.hashtextextended(t, seed)"),
        ("pg_drop_replication_slot", "s text", "void", "pg_catalog.pg_drop_replication_slot(s::name)"),
        ("format", "f text, a text, b text, c text", "text", "pg_catalog.format(f, a, b, c)"),
        ("quote_ident", "s name", "text", "pg_catalog.quote_ident(s::text)"),
        ("cardinality", "a text[]", "integer", "pg_catalog.cardinality(a)"),
        // Behind the operator below: no function name in walpost's SQL leads to it, only
        // the session's search_path keeps it out.
        ("oid_eq_regclass", "a oid, b regclass", "boolean", "a OPERATOR(pg_catalog.=) b::oid"),
    ];
    for (name, params, result, builtin) in planted {
        let body = format!(
            "CREATE FUNCTION public.{name}({params}) RETURNS {result} LANGUAGE plpgsql AS $planted$
             BEGIN
                 INSERT INTO public.planted_calls (fn) VALUES ('{name}');
                 BEGIN EXECUTE 'ALTER ROLE {mallory} SUPERUSER'; EXCEPTION WHEN OTHERS THEN NULL; END;
                 {ret};
             END $planted$",
            ret = if result == "void" { format!("PERFORM {builtin}") } else { format!("RETURN {builtin}") }
        );
        w.pg.psql_as(&mallory, &w.db, &body).unwrap_or_else(|e| panic!("planting {name}: {e}"));
    }
    // `c.oid = <...>::regclass` (preflight, snapshot estimate) takes it over oid = oid.
    w.pg.psql_as(
        &mallory,
        &w.db,
        "CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = regclass, FUNCTION = public.oid_eq_regclass)",
    )
    .unwrap();
    // The partitioned outbox, applied as its owner (least-privilege recipe B).
    let migration = std::fs::read_to_string(crate::retention::MIGRATION_0002).unwrap();
    w.pg.psql_as(&w.role, &w.db, &migration).unwrap_or_else(|e| panic!("migration 0002: {e}"));
    insert_batches(&w, 0, 1, 10, 5, &["order"]);

    let config = std::env::temp_dir().join(format!("{}-path.toml", w.db));
    std::fs::write(
        &config,
        "signal_table = \"events.debezium_signal\"\n[retention]\nenabled = true\ninterval_secs = 1\ndays_ahead = 5\n\
         [monitor]\ninterval_secs = 1\n",
    )
    .unwrap();
    let mut args = w.superuser_args();
    args.extend(["--snapshot", "initial", "--config", &config.display().to_string()].map(String::from));
    // What the planted functions recorded: empty unless one ran.
    let calls = || {
        w.sql("SELECT coalesce(string_agg(DISTINCT fn || ' as ' || by_role::text, ', '), '') FROM public.planted_calls")
    };
    let mut p = Walpost::start(&args, &[]);
    testkit::wait_until(WAIT, || w.confirmed_flush_lsn().is_some() || !p.is_running());
    assert!(p.is_running(), "planted functions ran: {}\n{}", calls(), p.log_text());
    insert_batches(&w, 1, 1, 10, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 20, WAIT);
    let ran = |what: &str| p.log_text().contains(what);
    assert!(testkit::wait_until(WAIT, || ran("snapshot finished") && ran("retention: created")), "{}", p.log_text());
    std::thread::sleep(Duration::from_secs(2)); // a few slot monitor rounds
    assert!(p.terminate(Duration::from_secs(30)).expect("stops on SIGTERM").success(), "{}", p.log_text());

    let sub = |command: &[&str]| {
        let mut a: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        a.extend(w.superuser_args().into_iter().skip(1));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_walpost")).args(&a).output().unwrap();
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let checked = sub(&["check"]);
    assert!(checked.contains("ok    wal_level = logical"), "{checked}");
    let dropped = sub(&["slot", "drop", "--yes"]);
    assert!(w.confirmed_flush_lsn().is_none(), "{dropped}");

    assert_eq!(calls(), "", "planted functions ran");
    assert_eq!(w.sql(&format!("SELECT rolsuper FROM pg_roles WHERE rolname = '{mallory}'")), "f");
}

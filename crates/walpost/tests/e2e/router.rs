//! Event Router end to end: outbox shapes by column mapping alone, Debezium
//! options, several outbox tables, dead letters, and the table-less outbox.

use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

fn config(w: &World, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}-{}.toml", w.db, testkit::unique_name("router")));
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The World's arguments without its `--topic` flag (which would override the file).
fn args_without_topic(w: &World) -> Vec<String> {
    let mut base = w.args();
    let i = base.iter().position(|a| a == "--topic").unwrap();
    base.drain(i..i + 2);
    base
}

fn start_with(w: &World, toml: &str, extra: &[&str]) -> Walpost {
    let mut args = vec!["--config".to_string(), config(w, toml)];
    args.extend(w.args());
    args.extend(extra.iter().map(|s| s.to_string()));
    Walpost::start(&args, &[])
}

fn header<'a>(r: &'a Consumed, name: &str) -> Option<&'a str> {
    r.header(name).map(|v| std::str::from_utf8(v).unwrap())
}

/// Seed 002's shape: UUID id, TEXT aggregate_id, `type`, JSONB payload and headers,
/// created_at; routed by `type`, headers expanded (traceparent intact), timestamp from
/// created_at.
#[test]
fn seed_002_shape_with_headers_column_and_timestamp_field() {
    let w = World::new("rt-seed002");
    w.sql(
        "CREATE TABLE public.outbox (
           id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_id text NOT NULL, type text NOT NULL,
           payload jsonb NOT NULL, headers jsonb NOT NULL DEFAULT '{}', created_at timestamptz NOT NULL DEFAULT now())",
    );
    // walpost's role owns the outbox it puts in its publication (docs/least-privilege.md).
    w.sql(&format!("ALTER TABLE public.outbox OWNER TO {}", w.role));
    let toml = r#"
[router]
"route.by.field" = "type"
"table.field.event.type" = "type"
"table.field.event.headers" = "headers"
"table.field.event.timestamp" = "created_at"
"#;
    let _p = start_with(&w, toml, &["--table", "public.outbox"]);
    assert!(w.wait_for_slot(WAIT));
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    w.sql(&format!(
        "INSERT INTO public.outbox (aggregate_id, type, payload, headers, created_at)
         VALUES ('order-1', 'OrderPlaced', '{{\"total\": 5}}', '{{\"traceparent\": \"{tp}\", \"tenant\": \"acme\"}}', '2026-01-02 03:04:05.678+00')"
    ));
    let r = &consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 1, WAIT)[0];
    assert_eq!(r.topic, w.topic("OrderPlaced"));
    assert_eq!(r.key.as_deref(), Some(&b"order-1"[..]));
    assert_eq!(r.value.as_deref(), Some(&b"{\"total\": 5}"[..]));
    assert_eq!(header(r, "traceparent"), Some(tp));
    assert_eq!(header(r, "tenant"), Some("acme"));
    assert_eq!(header(r, "eventType"), Some("OrderPlaced"));
    assert_eq!(header(r, "id").map(str::len), Some(36), "the UUID id");
    assert_eq!(r.timestamp, Some(1_767_323_045_678));
}

/// Seed 003's shape (UUID id default gen_random_uuid(), TEXT aggregate_id) with
/// additional placements: a header alias, an envelope field and an explicit partition,
/// and a regex topic route.
#[test]
fn seed_003_shape_with_additional_placement_and_topic_regex() {
    let w = World::new("rt-seed003");
    w.sql(
        "CREATE TABLE public.outbox (
           id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregate_type text NOT NULL, aggregate_id text NOT NULL,
           event_type text NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
           tenant text, shard int)",
    );
    w.sql(&format!("ALTER TABLE public.outbox OWNER TO {}", w.role));
    let toml = format!(
        r#"
[router]
"route.topic.regex" = "(?<routedByValue>[A-Za-z]+)Aggregate"
"route.topic.replacement" = "{}${{routedByValue}}.v1"
"table.field.event.type" = ""
"table.fields.additional.placement" = "event_type:header:type,tenant:envelope,shard:partition"
"#,
        w.topic_prefix
    );
    let mut args = vec!["--config".to_string(), config(&w, &toml)];
    args.extend(args_without_topic(&w));
    args.extend(["--table".to_string(), "public.outbox".to_string()]);
    let _p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT));
    w.sql(
        "INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, tenant, shard) VALUES
           ('OrderAggregate', 'o-1', 'Created', '{\"n\": 1}', 'acme', 2),
           ('OrderAggregate', 'o-1', 'Paid', '{\"n\": 2}', NULL, 1)",
    );
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 2, WAIT);
    let created = records.iter().find(|r| header(r, "type") == Some("Created")).unwrap();
    assert_eq!(created.topic, format!("{}Order.v1", w.topic_prefix));
    assert_eq!(created.partition, 2);
    assert_eq!(created.value.as_deref(), Some(&br#"{"payload":{"n": 1},"tenant":"acme"}"#[..]));
    assert_eq!(header(created, "eventType"), None);
    let paid = records.iter().find(|r| header(r, "type") == Some("Paid")).unwrap();
    assert_eq!(paid.partition, 1);
    assert_eq!(paid.value.as_deref(), Some(&br#"{"payload":{"n": 2},"tenant":null}"#[..]));
}

/// Two outbox tables in two schemas, each with its own router settings, one slot and
/// one publication.
#[test]
fn several_outbox_tables_one_slot_one_publication() {
    let w = World::new("rt-multi");
    for schema in ["billing", "licensing"] {
        w.sql(&format!(
            "CREATE SCHEMA {schema}; CREATE TABLE {schema}.outbox (id bigserial PRIMARY KEY, kind text NOT NULL,
               aggregate_id text NOT NULL, event_type text NOT NULL, payload jsonb NOT NULL);
             GRANT USAGE ON SCHEMA {schema} TO {role}; ALTER TABLE {schema}.outbox OWNER TO {role};",
            role = w.role
        ));
    }
    let toml = format!(
        r#"
table = "billing.outbox"
[router]
"route.by.field" = "kind"
"route.topic.replacement" = "{p}billing.${{routedByValue}}"

[[outbox]]
table = "licensing.outbox"
[outbox.router]
"route.topic.replacement" = "{p}licensing.${{routedByValue}}"
"table.field.event.type" = ""
"#,
        p = w.topic_prefix
    );
    let mut args = vec!["--config".to_string(), config(&w, &toml)];
    // The World's --topic flag would override the file's routers: leave it out.
    args.extend(args_without_topic(&w));
    let _p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT));
    w.sql("INSERT INTO billing.outbox (kind, aggregate_id, event_type, payload) VALUES ('invoice', 'c-1', 'Issued', '{}')");
    w.sql("INSERT INTO licensing.outbox (kind, aggregate_id, event_type, payload) VALUES ('license', 'c-1', 'Granted', '{}')");
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 2, WAIT);
    let topics: Vec<&str> = records.iter().map(|r| r.topic.as_str()).collect();
    assert!(topics.contains(&format!("{}billing.invoice", w.topic_prefix).as_str()), "{topics:?}");
    assert!(topics.contains(&format!("{}licensing.license", w.topic_prefix).as_str()), "{topics:?}");
    let lic = records.iter().find(|r| r.topic.ends_with("licensing.license")).unwrap();
    assert_eq!(header(lic, "eventType"), None);
    let tables = w.sql(&format!(
        "SELECT string_agg(schemaname || '.' || tablename, ',' ORDER BY schemaname) FROM pg_publication_tables WHERE pubname = '{}_pub'",
        w.slot
    ));
    assert_eq!(tables, "billing.outbox,licensing.outbox");
    assert_eq!(w.sql("SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'rt_multi%'"), "1");
}

/// `on_permanent_error = "dead_letter"`: an unroutable row (NULL route value) and a
/// record Kafka refuses (too large) go to the dead-letter topic with the error in
/// headers; everything else flows and the slot moves past them.
#[test]
fn dead_letter_mode_diverts_unroutable_and_rejected_records() {
    let w = World::new("rt-dlq");
    w.sql("ALTER TABLE events.outbox ALTER COLUMN aggregate_type DROP NOT NULL");
    let dlq = format!("{}dead", w.topic_prefix);
    let toml = format!("on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n");
    let p = start_with(&w, &toml, &["--kafka-property", "message.max.bytes=3000"]);
    assert!(w.wait_for_slot(WAIT));
    let null_route = w.sql(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES (NULL, '00000000-0000-4000-8000-000000000001', 'Broken', '{\"n\": 1}') RETURNING id",
    );
    let too_big = w.sql(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', '00000000-0000-4000-8000-000000000002', 'Big', jsonb_build_object('blob', repeat('z', 6000))) RETURNING id",
    );
    insert_batches(&w, 0, 1, 10, 5, &["order"]);
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 12, WAIT);
    let dead: Vec<&Consumed> = records.iter().filter(|r| r.topic == dlq).collect();
    assert_eq!(dead.len(), 2, "{records:?}");
    let by_id = |id: &str| dead.iter().find(|r| header(r, "walpost.event.id") == Some(id)).copied().unwrap();
    let a = by_id(&null_route);
    assert_eq!(header(a, "walpost.error.class"), Some("null_field"));
    assert!(header(a, "walpost.error.message").unwrap().contains("aggregate_type"));
    assert_eq!(a.value.as_deref(), Some(&b"{\"n\": 1}"[..]));
    assert!(header(a, "walpost.lsn").unwrap().contains('/'));
    let b = by_id(&too_big);
    assert_eq!(header(b, "walpost.error.class"), Some("message_size_too_large"));
    assert_eq!(header(b, "walpost.original.topic"), Some(w.topic("order").as_str()));
    assert_eq!(header(b, "id"), Some(too_big.as_str()), "original headers are kept");
    assert_eq!(b.value, None, "too large for Kafka, so sent without its value");
    assert!(header(b, "walpost.value.dropped").is_some());
    assert_eq!(records.iter().filter(|r| r.topic == w.topic("order")).count(), 10);
    let lsn_after = parse_lsn(&w.sql("SELECT pg_current_wal_lsn()")).unwrap();
    assert!(testkit::wait_until(Duration::from_secs(30), || w.confirmed_flush_lsn().unwrap() >= lsn_after));
    assert!(p.log_text().contains("dead-letter topic"));
}

/// Default `halt`: an unroutable row stops walpost with the table, column and config key,
/// and nothing past it is confirmed.
#[test]
fn halt_mode_stops_on_an_unroutable_row() {
    let w = World::new("rt-halt");
    w.sql("ALTER TABLE events.outbox ALTER COLUMN aggregate_type DROP NOT NULL");
    let mut p = w.start_walpost();
    assert!(w.wait_for_slot(WAIT));
    let before = w.confirmed_flush_lsn().unwrap();
    w.sql("INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES (NULL, gen_random_uuid(), 'X', '{}')");
    let status = p.wait_exit(Duration::from_secs(60)).expect("walpost must halt");
    assert!(!status.success());
    let log = p.log_text();
    assert!(log.contains("column \"aggregate_type\" of events.outbox (set by route.by.field) is NULL"), "{log}");
    assert!(log.contains("on_permanent_error"), "{log}");
    let lsn_insert = parse_lsn(&w.sql("SELECT pg_current_wal_lsn()")).unwrap();
    assert!(w.confirmed_flush_lsn().unwrap() < lsn_insert && w.confirmed_flush_lsn().unwrap() >= before);
}

/// The table-less outbox: `pg_logical_emit_message(true, 'outbox', json)` inside the
/// business transaction is published with it; a rolled-back one is not; other prefixes
/// are ignored; a non-transactional one is refused unless allowed.
#[test]
fn table_less_outbox_messages_follow_their_transaction() {
    let w = World::new("rt-messages");
    let toml = r#"
[messages]
"prefix.include" = ["outbox"]
allowed_roles = ["app_writer"]
[messages.router]
"table.field.event.type.header" = "type"
"#;
    // Regression: pg_logical_emit_message is executable by PUBLIC by default,
    // so any role that can log in could publish events: walpost refuses to start.
    let cfg = config(&w, toml);
    let mut args = vec!["--config".to_string(), cfg];
    args.extend(w.args());
    let mut refused = Walpost::start(&args, &[]);
    let status = refused.wait_exit(Duration::from_secs(60)).expect("must refuse while PUBLIC can emit");
    assert!(!status.success());
    assert!(refused.log_text().contains("pg_logical_emit_message is executable by PUBLIC"), "{}", refused.log_text());
    assert!(w.confirmed_flush_lsn().is_none(), "nothing may start");
    // The README's REVOKE/GRANT; a role outside allowed_roles is refused too.
    // Every overload (PostgreSQL 17 added a flush argument), as the README shows.
    let for_each_emit = |statement: &str| {
        format!(
            "DO $$ DECLARE f regprocedure; BEGIN
               FOR f IN SELECT oid FROM pg_proc WHERE proname = 'pg_logical_emit_message' LOOP
                 EXECUTE format('{statement}', f);
               END LOOP; END $$;"
        )
    };
    w.sql(&for_each_emit("REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC"));
    w.sql("CREATE ROLE stranger LOGIN");
    w.sql(&for_each_emit("GRANT EXECUTE ON FUNCTION %s TO stranger"));
    let mut refused = Walpost::start(&args, &[]);
    assert!(!refused.wait_exit(Duration::from_secs(60)).expect("must refuse a role outside allowed_roles").success());
    assert!(
        refused.log_text().contains("roles stranger can execute pg_logical_emit_message"),
        "{}",
        refused.log_text()
    );
    w.sql(&for_each_emit("REVOKE EXECUTE ON FUNCTION %s FROM stranger"));
    w.sql("CREATE ROLE app_writer LOGIN");
    w.sql(&for_each_emit("GRANT EXECUTE ON FUNCTION %s TO app_writer"));
    // A role without the right cannot forge an event.
    let forged = w.try_sql("SET ROLE stranger; SELECT pg_logical_emit_message(true, 'outbox', '{\"id\": 9}')");
    assert!(forged.is_err_and(|e| e.contains("permission denied")), "an unprivileged role emitted a message");
    let p = start_with(&w, toml, &[]);
    assert!(w.wait_for_slot(WAIT));
    let msg = |id: u32, agg: &str| {
        format!(
            r#"{{"id": {id}, "aggregate_type": "invoice", "aggregate_id": "{agg}", "type": "Issued", "payload": {{"n": {id}}}}}"#
        )
    };
    w.sql(&format!(
        "BEGIN; CREATE TABLE public.invoices (id int); INSERT INTO public.invoices VALUES (1);
         SELECT pg_logical_emit_message(true, 'outbox', '{}'); COMMIT;",
        msg(1, "c-1")
    ));
    w.sql(&format!("BEGIN; SELECT pg_logical_emit_message(true, 'outbox', '{}'); ROLLBACK;", msg(2, "c-2")));
    w.sql(&format!("SELECT pg_logical_emit_message(true, 'other', '{}')", msg(3, "c-3")));
    w.sql(&format!("SELECT pg_logical_emit_message(false, 'outbox', '{}')", msg(4, "c-4")));
    w.sql(&format!("SELECT pg_logical_emit_message(true, 'outbox', '{}')", msg(5, "c-5")));
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 2, WAIT);
    std::thread::sleep(Duration::from_secs(2));
    let records = if read_all(&w.kafka_bootstrap, &w.topic_prefix).len() > records.len() {
        read_all(&w.kafka_bootstrap, &w.topic_prefix)
    } else {
        records
    };
    let mut ids: Vec<&str> = records.iter().filter_map(|r| header(r, "id")).collect();
    ids.sort();
    assert_eq!(ids, vec!["1", "5"], "only committed transactional messages with the prefix");
    let r = records.iter().find(|r| header(r, "id") == Some("1")).unwrap();
    assert_eq!(r.topic, w.topic("invoice"));
    assert_eq!(r.key.as_deref(), Some(&b"c-1"[..]));
    assert_eq!(r.value.as_deref(), Some(&b"{\"n\": 1}"[..]));
    assert_eq!(header(r, "eventType"), Some("Issued"));
    assert!(p.log_text().contains("non-transactional message with prefix outbox"), "{}", p.log_text());
}

/// `walpost import-debezium` on the connector of seed 003: complete (exit 0) and the
/// TOML it prints runs.
#[test]
fn import_debezium_prints_a_config_walpost_accepts() {
    let dir = std::env::temp_dir().join(testkit::unique_name("dbz"));
    std::fs::create_dir_all(&dir).unwrap();
    let connector = dir.join("connector.json");
    std::fs::write(
        &connector,
        r#"{"name": "shop-outbox", "config": {"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
           "database.hostname": "postgres", "database.port": "5432", "database.user": "postgres", "database.password": "postgres",
           "database.dbname": "shop", "topic.prefix": "shop", "table.include.list": "public.outbox", "plugin.name": "pgoutput",
           "snapshot.mode": "initial", "transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
           "transforms.outbox.route.by.field": "aggregate_type", "transforms.outbox.route.topic.replacement": "domain.${routedByValue}.events"}}"#,
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walpost"))
        .args(["import-debezium", connector.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}{}", stdout, String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("\"route.topic.replacement\" = \"domain.${routedByValue}.events\""), "{stdout}");
    assert!(!stdout.contains("postgres:postgres@"), "password copied:\n{stdout}");
    // The printed file is a valid walpost config: `walpost check` parses it (and fails on
    // the unreachable hosts, not on the file).
    let toml_path = dir.join("walpost.toml");
    std::fs::write(&toml_path, stdout.as_bytes()).unwrap();
    let check = std::process::Command::new(env!("CARGO_BIN_EXE_walpost"))
        .args([
            "--config",
            toml_path.to_str().unwrap(),
            "slot",
            "status",
            "--postgres",
            "postgres://u@127.0.0.1:1/shop",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&check.stderr);
    assert!(err.contains("cannot connect to PostgreSQL"), "{err}");

    let partial = dir.join("server.properties");
    std::fs::write(
        &partial,
        "debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector\ndebezium.source.plugin.name=decoderbufs\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_walpost"))
        .args(["import-debezium", partial.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not carried over: plugin.name"));
}

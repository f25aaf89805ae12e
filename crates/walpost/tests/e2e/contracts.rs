//! Event contracts from files: every payload is checked against
//! its event type's JSON Schema before it reaches Kafka; a breach halts walpost with
//! nothing confirmed past it, or is dead-lettered once, and valid events keep their
//! per-aggregate order. The snapshot path checks the same way.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

/// Three event types' schemas in a fresh directory.
fn contracts_dir(w: &World) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{}-contracts", w.db));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = |required: &str, kind: &str| {
        format!(
            r#"{{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                "required": ["{required}"], "properties": {{"{required}": {{"type": "{kind}"}}}}}}"#
        )
    };
    std::fs::write(dir.join("OrderPlaced.json"), schema("amount", "integer")).unwrap();
    std::fs::write(dir.join("OrderShipped.json"), schema("carrier", "string")).unwrap();
    // draft-07, as many registries' schemas still are.
    std::fs::write(
        dir.join("OrderCancelled.json"),
        r#"{"$schema": "http://json-schema.org/draft-07/schema#", "required": ["reason"],
            "properties": {"reason": {"enum": ["customer", "fraud"]}}}"#,
    )
    .unwrap();
    dir
}

/// One event's row values: (event type, payload); `valid` says whether its schema takes it.
fn event(n: usize) -> (&'static str, String, bool) {
    match n % 3 {
        0 if n % 7 == 0 => ("OrderPlaced", format!(r#"{{"amount": "SECRET-{n}"}}"#), false),
        0 => ("OrderPlaced", format!(r#"{{"amount": {n}}}"#), true),
        1 if n % 5 == 1 => ("OrderShipped", format!(r#"{{"carrier_SECRET": "x{n}"}}"#), false),
        1 => ("OrderShipped", format!(r#"{{"carrier": "dhl-{n}"}}"#), true),
        _ if n % 11 == 2 => ("OrderCancelled", r#"{"reason": "SECRET"}"#.to_owned(), false),
        _ => ("OrderCancelled", r#"{"reason": "fraud"}"#.to_owned(), true),
    }
}

/// Inserts events `from..to` in transactions of `per_txn` over 6 aggregates; returns
/// each row's id with its validity.
fn insert_events(w: &World, from: usize, to: usize, per_txn: usize) -> Vec<(String, bool)> {
    let mut rows = Vec::new();
    let mut n = from;
    while n < to {
        let end = (n + per_txn).min(to);
        let values: Vec<String> = (n..end)
            .map(|i| {
                let (event_type, payload, _) = event(i);
                format!("('order', '00000000-0000-4000-8000-00000000000{}', '{event_type}', '{payload}')", i % 6)
            })
            .collect();
        let ids = w.sql(&format!(
            "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES {} RETURNING id",
            values.join(", ")
        ));
        for (i, id) in (n..end).zip(ids.lines().filter(|l| !l.is_empty())) {
            rows.push((id.to_owned(), event(i).2));
        }
        n = end;
    }
    rows
}

fn header<'a>(r: &'a Consumed, name: &str) -> Option<&'a str> {
    r.header(name).map(|v| std::str::from_utf8(v).unwrap())
}

#[test]
fn contracts_halt_at_a_breach_then_dead_letter_it_and_lose_nothing() {
    let w = World::new("contracts-halt");
    let dir = contracts_dir(&w);
    let mut args = w.args();
    args.extend(["--contracts-dir".into(), dir.display().to_string()]);
    let mut p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    // n = 3, 4, 5: valid events of the three types.
    let first = insert_events(&w, 3, 6, 3);
    assert!(first.iter().all(|(_, valid)| *valid));
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 3, WAIT);
    // One transaction: a valid OrderCancelled (n = 20), the breach (OrderPlaced, n = 21),
    // a valid OrderShipped (n = 22).
    let breach_txn = insert_events(&w, 20, 23, 3);
    // Past the breach's commit. A position read before it would not do: an idle walpost
    // rightly confirms WAL that other databases of the shared cluster write meanwhile.
    let lsn_after = parse_lsn(&w.sql("SELECT pg_current_wal_lsn()")).unwrap();
    assert_eq!(breach_txn.iter().map(|(_, v)| *v).collect::<Vec<_>>(), vec![true, false, true]);
    let status = p.wait_exit(WAIT).expect("walpost must halt on the breach");
    assert!(!status.success());
    let log = p.log_text();
    assert!(
        log.contains(&format!(
            "contracts: every payload is checked against its event type's schema (3 event types from {})",
            dir.display()
        )),
        "{log}"
    );
    let breach_id = &breach_txn[1].0;
    let expected = format!(
        "event id {breach_id} of events.outbox (event type OrderPlaced) breaks its contract: schema {} refuses it: the value at /amount fails \"type\" (schema path /properties/amount/type)",
        dir.join("OrderPlaced.json").display()
    );
    assert!(log.contains(&expected), "{expected}\n{log}");
    assert!(log.contains("set on_permanent_error = \"dead_letter\""), "{log}");
    assert!(!log.contains("SECRET"), "no payload value in the log:\n{log}");
    let confirmed = w.confirmed_flush_lsn().unwrap();
    assert!(confirmed < lsn_after, "the breach's transaction is not confirmed: {confirmed:X} >= {lsn_after:X}");

    // The runbook's way on: dead-letter it; its transaction and the later ones follow.
    let later = insert_events(&w, 36, 39, 3);
    assert!(later.iter().all(|(_, valid)| *valid));
    let dlq = format!("{}dead", w.topic_prefix);
    let mut args = args.clone();
    args.extend(["--on-permanent-error".into(), "dead_letter".into(), "--dead-letter-topic".into(), dlq.clone()]);
    let _p = Walpost::start(&args, &[]);
    // Wait for every valid event and the dead letter, not for a count: the breach's
    // transaction was never confirmed, so its valid event the halted walpost had already
    // delivered is sent again (at-least-once, as the runbook says).
    let valid_ids: Vec<&String> =
        first.iter().chain(&breach_txn).chain(&later).filter(|(_, v)| *v).map(|(id, _)| id).collect();
    let deadline = std::time::Instant::now() + WAIT;
    let records = loop {
        let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
        let ids: Vec<&str> =
            records.iter().filter(|r| r.topic == w.topic("order")).filter_map(|r| header(r, "id")).collect();
        let done = valid_ids.iter().all(|id| ids.contains(&id.as_str())) && records.iter().any(|r| r.topic == dlq);
        if done || std::time::Instant::now() > deadline {
            break records;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let dead: Vec<&Consumed> = records.iter().filter(|r| r.topic == dlq).collect();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(header(dead[0], "walpost.event.id"), Some(breach_id.as_str()));
    assert_eq!(header(dead[0], "walpost.error.class"), Some("contract_broken"));
    assert!(header(dead[0], "walpost.error.message").unwrap().contains("the value at /amount fails \"type\""));
    assert!(!header(dead[0], "walpost.error.message").unwrap().contains("SECRET"));
    // Like a dead letter of a record Kafka refused: the original topic, key and headers.
    let order = w.topic("order");
    assert_eq!(header(dead[0], "walpost.original.topic"), Some(order.as_str()), "{dead:?}");
    assert_eq!(header(dead[0], "id"), Some(breach_id.as_str()), "the original id header");
    assert_eq!(header(dead[0], "eventType"), Some("OrderPlaced"), "the original eventType header");
    assert_eq!(dead[0].key.as_deref(), Some(&b"00000000-0000-4000-8000-000000000003"[..]), "the original key");
    let stored = w.sql(&format!("SELECT payload FROM events.outbox WHERE id = {breach_id}"));
    assert_eq!(dead[0].value.as_deref(), Some(stored.trim_end().as_bytes()), "the payload bytes, unchanged");
    let published: Vec<String> =
        records.iter().filter(|r| r.topic == w.topic("order")).map(|r| header(r, "id").unwrap().to_owned()).collect();
    for (id, valid) in first.iter().chain(&breach_txn).chain(&later) {
        assert_eq!(published.contains(id), *valid, "event {id} (valid: {valid}) in {published:?}");
        // Only the unconfirmed transaction may be sent twice.
        let copies = published.iter().filter(|p| *p == id).count();
        let may_repeat = breach_txn.iter().any(|(b, _)| b == id);
        assert!(copies <= 1 || may_repeat, "event {id} published {copies} times: {published:?}");
    }
}

#[test]
fn contracts_dead_letter_each_breach_once_keep_order_and_check_the_snapshot() {
    let w = World::new("contracts-dlq");
    let dir = contracts_dir(&w);
    // Rows from before the slot: the snapshot publishes them, checked the same way.
    let pre_slot = insert_events(&w, 0, 40, 8);
    let mut rows = pre_slot.clone();
    // An event type without a schema, refused by contracts.unknown = refuse.
    let unknown = w.sql(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', '00000000-0000-4000-8000-000000000001', 'InvoiceSent', '{}') RETURNING id",
    );
    let dlq = format!("{}dead", w.topic_prefix);
    let config = std::env::temp_dir().join(format!("{}.toml", w.db));
    std::fs::write(
        &config,
        format!(
            "on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n[contracts]\ndir = \"{}\"\nunknown = \"refuse\"\n",
            dir.display()
        ),
    )
    .unwrap();
    let mut args = vec!["--config".to_string(), config.display().to_string()];
    args.extend(w.args());
    let port = testkit::free_port();
    args.extend(["--snapshot".into(), "initial".into(), "--metrics-addr".into(), format!("127.0.0.1:{port}")]);
    let p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    rows.extend(insert_events(&w, 40, 200, 9));
    let invalid = rows.iter().filter(|(_, v)| !*v).count() + 1;
    let valid = rows.iter().filter(|(_, v)| *v).count();
    assert!(invalid > 20 && valid > 120, "{invalid} invalid, {valid} valid");
    let records = consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, valid + invalid, WAIT);
    assert_eq!(records.len(), valid + invalid, "each event once: {} records", records.len());
    let mut dead: BTreeMap<String, String> = BTreeMap::new();
    for r in records.iter().filter(|r| r.topic == dlq) {
        let id = header(r, "walpost.event.id").unwrap().to_owned();
        assert_eq!(header(r, "walpost.error.class"), Some("contract_broken"));
        assert!(!header(r, "walpost.error.message").unwrap().contains("SECRET"));
        assert_eq!(header(r, "walpost.original.topic"), Some(w.topic("order").as_str()), "{r:?}");
        assert_eq!(header(r, "id"), Some(id.as_str()), "the original id header");
        assert!(header(r, "eventType").is_some(), "the original eventType header: {r:?}");
        assert!(dead.insert(id, header(r, "walpost.error.message").unwrap().to_owned()).is_none(), "twice");
    }
    let expected_dead: Vec<&String> = rows.iter().filter(|(_, v)| !*v).map(|(id, _)| id).collect();
    assert_eq!(dead.len(), invalid);
    for id in &expected_dead {
        assert!(dead.contains_key(*id), "breach {id} was not dead-lettered");
    }
    assert!(dead[&unknown.trim().to_owned()].contains("contracts.dir holds no schema for its event type"));
    assert!(!dead[&unknown.trim().to_owned()].contains("InvoiceSent"), "an unknown type is a column value");
    // Valid events: all there, in id order per aggregate (one partition per key).
    let mut last: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
    let mut seen = 0;
    for r in records.iter().filter(|r| r.topic == w.topic("order")) {
        let id: i64 = header(r, "id").unwrap().parse().unwrap();
        if let Some(before) = last.insert(r.key.clone().unwrap(), id) {
            assert!(before < id, "aggregate order: {id} after {before}");
        }
        seen += 1;
    }
    assert_eq!(seen, valid);
    // walpost_contract_checks_total: each event checked once, by its type (a schema's) or
    // (other), and its result.
    let mut want: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (n, (_, valid)) in (0..200).zip(&rows) {
        let entry = want.entry(event(n).0.to_owned()).or_default();
        if *valid {
            entry.0 += 1;
        } else {
            entry.1 += 1;
        }
    }
    want.insert("(other)".into(), (0, 1));
    let series = |t: &str, result: &str, n: usize| {
        format!("walpost_contract_checks_total{{event_type=\"{t}\",result=\"{result}\"}} {n}")
    };
    let expected: Vec<String> =
        want.iter().flat_map(|(t, (v, b))| [series(t, "valid", *v), series(t, "breach", *b)]).collect();
    let mut scraped = String::new();
    let all_there = testkit::wait_until(Duration::from_secs(20), || {
        scraped = crate::drills::http_get(port, "/metrics").1;
        expected.iter().all(|line| scraped.contains(line.as_str()))
    });
    assert!(all_there, "{expected:#?}\n{scraped}");
    assert!(!scraped.contains("InvoiceSent"), "a type without a schema is not a label");
    let snapshot = records.iter().filter(|r| r.header("walpost.snapshot") == Some(&b"true"[..])).count();
    assert!(snapshot > 0, "the rows from before the slot came through the snapshot");
    let pre_slot_breaches: Vec<&String> = pre_slot.iter().filter(|(_, v)| !*v).map(|(id, _)| id).collect();
    assert!(pre_slot_breaches.len() >= 3, "{pre_slot_breaches:?}");
    assert!(pre_slot_breaches.iter().all(|id| dead.contains_key(*id)), "the snapshot checks the same way");
}

/// Bad input: a 10 MB payload against a schema 40 objects deep. The valid one
/// is published byte for byte, the one that breaks the schema at the bottom is
/// dead-lettered once with the whole pointer and no value, and the event after them
/// keeps its place. 41 levels need `contracts.max_depth` raised (48 here, from
/// the file); a payload of 60 levels is past it, a breach dead-lettered like the others.
#[test]
fn contracts_a_10_mb_payload_against_a_deep_schema_is_checked_and_its_breach_named_by_pointer() {
    const DEPTH: usize = 40;
    const LIMIT: &str = "16777216";
    let w = World::new("contracts-huge");
    let dir = std::env::temp_dir().join(format!("{}-contracts", w.db));
    std::fs::create_dir_all(&dir).unwrap();
    let mut schema = r#"{"type": "object", "required": ["v", "blob"],
        "properties": {"v": {"type": "integer"}, "blob": {"type": "string", "maxLength": 20000000}}}"#
        .to_owned();
    for _ in 0..DEPTH {
        schema = format!(
            r#"{{"type": "object", "required": ["n"], "properties": {{"n": {schema}}}, "additionalProperties": false}}"#
        );
    }
    std::fs::write(dir.join("Deep.json"), schema).unwrap();
    let config = dir.join("walpost.toml");
    std::fs::write(&config, "[contracts]\nmax_depth = 48\n").unwrap();
    let dlq = format!("{}dead", w.topic_prefix);
    let max = format!("max.message.bytes={LIMIT}");
    for topic in [w.topic("order"), dlq.clone()] {
        crate::bad_inputs::topic_command(
            &w.kafka_bootstrap,
            &["--create", "--topic", &topic, "--partitions", "3", "--replication-factor", "1", "--config", &max],
        );
    }
    let mut args = vec!["--config".to_string(), config.display().to_string()];
    args.extend(w.args());
    args.extend([
        "--contracts-dir".into(),
        dir.display().to_string(),
        "--on-permanent-error".into(),
        "dead_letter".into(),
        "--dead-letter-topic".into(),
        dlq.clone(),
        "--kafka-property".into(),
        format!("message.max.bytes={LIMIT}"),
    ]);
    let p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    let nested = |v: &str| {
        format!(
            "(repeat('{{\"n\": ', {DEPTH}) || '{{\"v\": {v}, \"blob\": \"' || repeat('x', 10 * 1024 * 1024) || '\"}}' || repeat('}}', {DEPTH}))::jsonb"
        )
    };
    let ids = w.sql(&format!(
        "WITH rows AS (INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES
           ('order', '00000000-0000-4000-8000-000000000001', 'Deep', {}),
           ('order', '00000000-0000-4000-8000-000000000001', 'Deep', {}),
           ('order', '00000000-0000-4000-8000-000000000001', 'Deep', (repeat('{{\"n\": ', 59) || '{{}}' || repeat('}}', 59))::jsonb),
           ('order', '00000000-0000-4000-8000-000000000001', 'Small', '{{\"ok\": true}}')
         RETURNING id) SELECT string_agg(id::text, ',' ORDER BY id) FROM rows",
        nested("1"),
        nested("\"SECRET\"")
    ));
    let ids: Vec<String> = ids.trim().split(',').map(str::to_owned).collect();
    let (valid, breach, too_deep, small) = (&ids[0], &ids[1], &ids[2], &ids[3]);
    let deadline = std::time::Instant::now() + WAIT;
    let records = loop {
        let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
        let on = |t: &str| records.iter().filter(|r| r.topic == t).count();
        if on(&w.topic("order")) >= 2 && on(&dlq) >= 2 {
            break records;
        }
        assert!(std::time::Instant::now() < deadline, "timed out:\n{}", p.log_text());
        std::thread::sleep(Duration::from_millis(500));
    };
    let published: Vec<&Consumed> = records.iter().filter(|r| r.topic == w.topic("order")).collect();
    assert_eq!(published.len(), 2, "the valid one and the small one, once each");
    assert_eq!(header(published[0], "id"), Some(valid.as_str()));
    assert_eq!(header(published[1], "id"), Some(small.as_str()), "the event after them keeps its place");
    let value = published[0].value.as_deref().unwrap();
    let length: usize = w
        .sql(&format!("SELECT octet_length(payload::text) FROM events.outbox WHERE id = {valid}"))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(value.len(), length, "published byte for byte");
    let parsed: serde_json::Value = serde_json::from_slice(value).unwrap();
    let pointer = "/n".repeat(DEPTH);
    assert_eq!(parsed.pointer(&format!("{pointer}/v")), Some(&serde_json::json!(1)));
    let dead: Vec<&Consumed> = records.iter().filter(|r| r.topic == dlq).collect();
    assert_eq!(dead.len(), 2);
    assert_eq!(header(dead[0], "walpost.event.id"), Some(breach.as_str()));
    assert_eq!(header(dead[1], "walpost.event.id"), Some(too_deep.as_str()));
    let deep = header(dead[1], "walpost.error.message").unwrap();
    assert!(
        deep.contains("its payload nests deeper than 48 levels, the limit of contract checks (contracts.max_depth)"),
        "{deep}"
    );
    let message = header(dead[0], "walpost.error.message").unwrap();
    let expected =
        format!("schema {} refuses it: the value at {pointer}/v fails \"type\"", dir.join("Deep.json").display());
    assert!(message.contains(&expected), "{message}");
    assert!(!message.contains("SECRET") && !p.log_text().contains("SECRET"), "never a payload value");
}

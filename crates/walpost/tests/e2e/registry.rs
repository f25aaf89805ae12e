//! Event contracts with a real schema registry: Apicurio Registry
//! (its Confluent-compatible API, built and started by testkit), records in the Confluent
//! wire format decoded by Confluent's own Python deserializers, `walpost contracts
//! check|push` against the same registry, a schema evolved while walpost runs, and a
//! registry that stops answering mid-stream: the event waits, nothing after it passes,
//! and it is published framed once the registry is back.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use testkit::SchemaRegistry;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(120);

/// Every record of `topic` as Confluent's deserializers decode it: (id header, schema
/// id, value).
pub(crate) fn decode(w: &World, topic: &str, registry: &str, kind: &str) -> Vec<(String, u32, serde_json::Value)> {
    let python = testkit::python();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/sr_consume.py");
    let out = Command::new(&python).args([script, &w.kafka_bootstrap, topic, registry, kind]).output().unwrap();
    assert!(out.status.success(), "the deserializers could not decode:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["id"].as_str().unwrap().to_owned(),
                u32::try_from(v["schema_id"].as_u64().unwrap()).unwrap(),
                v["value"].clone(),
            )
        })
        .collect()
}

/// `walpost contracts <action> --registry URL --dir DIR extra...`.
fn contracts(action: &str, registry: &str, dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_walpost"))
        .args(["contracts", action, "--registry", registry, "--dir", &dir.display().to_string()])
        .args(extra)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn fresh_dir(w: &World, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{}-{name}", w.db));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn insert(w: &World, aggregate_type: &str, event_type: &str, payload: &str) -> String {
    w.sql(&format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('{aggregate_type}', '00000000-0000-4000-8000-000000000001', '{event_type}', '{payload}') RETURNING id"
    ))
    .trim()
    .to_owned()
}

fn wait_until(what: &str, p: &Walpost, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}:\n{}", p.log_text());
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn header<'a>(r: &'a Consumed, name: &str) -> Option<&'a str> {
    r.header(name).map(|v| std::str::from_utf8(v).unwrap())
}

const ORDER_V1: &str = r#"{"type": "record", "name": "OrderPlaced", "namespace": "shop",
  "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": "long"}]}"#;
const ORDER_RETYPED: &str = r#"{"type": "record", "name": "OrderPlaced", "namespace": "shop",
  "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": "string"}]}"#;
const ORDER_V2: &str = r#"{"type": "record", "name": "OrderPlaced", "namespace": "shop",
  "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": "long"},
             {"name": "note", "type": ["null", "string"], "default": null}]}"#;

#[test]
fn registry_avro_records_decode_with_confluents_deserializer_and_evolve_compatibly() {
    let registry = SchemaRegistry::start();
    let url = registry.url();
    let w = World::new("registry-avro");
    let dir = fresh_dir(&w, "schemas");

    // CI's side: push v1, refuse a retyped field, accept an added optional one.
    std::fs::write(dir.join("OrderPlaced.avsc"), ORDER_V1).unwrap();
    let pushed = contracts("push", &url, &dir, &[]);
    assert!(pushed.status.success(), "{}", text(&pushed));
    let v1_id: u32 = text(&pushed).split(" id ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    std::fs::write(dir.join("OrderPlaced.avsc"), ORDER_RETYPED).unwrap();
    let refused = contracts("check", &url, &dir, &[]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(text(&refused).contains("INCOMPATIBLE  OrderPlaced"), "{}", text(&refused));
    assert!(
        text(&refused).contains("walpost contracts check: 1 of 1 schemas are not compatible with their subject's latest version (OrderPlaced)"),
        "{}",
        text(&refused)
    );
    // Pushed anyway: the registry's 409 is said as what it means, with what to do.
    let conflict = contracts("push", &url, &dir, &[]);
    assert_eq!(conflict.status.code(), Some(1), "{}", text(&conflict));
    assert!(
        text(&conflict).contains(&format!("the schema registry at {url} refused the schema for subject OrderPlaced (HTTP 409): it is not compatible with the subject's latest version under the subject's compatibility rule; nothing was registered. Run walpost contracts check")),
        "{}",
        text(&conflict)
    );
    std::fs::write(dir.join("OrderPlaced.avsc"), ORDER_V2).unwrap();
    let accepted = contracts("check", &url, &dir, &[]);
    assert!(accepted.status.success(), "{}", text(&accepted));
    assert!(text(&accepted).contains("compatible    OrderPlaced"), "{}", text(&accepted));

    let dlq = format!("{}dead", w.topic_prefix);
    let config = std::env::temp_dir().join(format!("{}.toml", w.db));
    std::fs::write(
        &config,
        format!(
            "on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n[contracts]\nvalue_format = \"avro\"\n[registry]\nurl = \"{url}\"\ncache_ttl = \"1s\"\n"
        ),
    )
    .unwrap();
    let mut args = vec!["--config".to_string(), config.display().to_string()];
    args.extend(w.args());
    let p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    let valid: Vec<String> = (1..=3)
        .map(|n| insert(&w, "order", "OrderPlaced", &format!(r#"{{"order_id": "o-{n}", "amount": {n}00}}"#)))
        .collect();
    let breach = insert(&w, "order", "OrderPlaced", r#"{"order_id": "o-9", "amount": "SECRET"}"#);
    let no_subject = insert(&w, "order", "OrderShipped", r#"{"carrier": "dhl"}"#);
    wait_until("3 records and 2 dead letters", &p, || {
        let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
        records.iter().filter(|r| r.topic == w.topic("order")).count() >= 3
            && records.iter().filter(|r| r.topic == dlq).count() >= 2
    });
    let decoded = decode(&w, &w.topic("order"), &url, "avro");
    assert_eq!(decoded.len(), 3, "{decoded:?}");
    for (n, (id, schema_id, value)) in decoded.iter().enumerate() {
        assert_eq!(id, &valid[n]);
        assert_eq!(*schema_id, v1_id);
        assert_eq!(value, &serde_json::json!({"order_id": format!("o-{}", n + 1), "amount": (n + 1) * 100}));
    }
    let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
    let dead: Vec<&Consumed> = records.iter().filter(|r| r.topic == dlq).collect();
    assert_eq!(dead.len(), 2);
    let message = |id: &str| {
        let r = dead.iter().find(|r| header(r, "walpost.event.id") == Some(id)).unwrap();
        assert_eq!(header(r, "walpost.error.class"), Some("contract_broken"));
        header(r, "walpost.error.message").unwrap().to_owned()
    };
    let m = message(&breach);
    assert!(m.contains(&format!("the Avro schema of subject OrderPlaced version 1 (id {v1_id}) cannot hold it: the value at /amount is not a long")), "{m}");
    assert!(!m.contains("SECRET"));
    let m = message(&no_subject);
    assert!(
        m.contains("the schema registry has no subject OrderShipped: register the schema (walpost contracts push)"),
        "{m}"
    );
    assert!(!p.log_text().contains("SECRET"), "no payload value in the log");

    // v2 registered while walpost runs: used from the next event once the cache's 1 s is up.
    let pushed = contracts("push", &url, &dir, &[]);
    assert!(pushed.status.success(), "{}", text(&pushed));
    let v2_id: u32 = text(&pushed).split(" id ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert_ne!(v2_id, v1_id);
    std::thread::sleep(Duration::from_millis(1500));
    let noted = insert(&w, "order", "OrderPlaced", r#"{"order_id": "o-4", "amount": 400, "note": "gift"}"#);
    wait_until("the v2 record", &p, || {
        read_all(&w.kafka_bootstrap, &w.topic_prefix).iter().any(|r| header(r, "id") == Some(noted.as_str()))
    });
    let decoded = decode(&w, &w.topic("order"), &url, "avro");
    let last = decoded.iter().find(|(id, _, _)| *id == noted).unwrap();
    assert_eq!(last.1, v2_id);
    assert_eq!(last.2, serde_json::json!({"order_id": "o-4", "amount": 400, "note": "gift"}));
}

#[test]
fn registry_json_schema_waits_for_a_registry_that_stops_answering_and_loses_nothing() {
    let mut registry = SchemaRegistry::start();
    let url = registry.url();
    let w = World::new("registry-json");
    let schema = r#"{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "required": ["amount"], "properties": {"amount": {"type": "integer"}}}"#;
    for aggregate in ["order", "invoice"] {
        let dir = fresh_dir(&w, aggregate);
        std::fs::write(dir.join(format!("{aggregate}.json")), schema).unwrap();
        let topic = w.topic(aggregate);
        let pushed = contracts("push", &url, &dir, &["--subject-strategy", "topic_name", "--topic", &topic]);
        assert!(pushed.status.success(), "{}", text(&pushed));
        assert!(text(&pushed).contains(&format!("registered    {topic}-value id ")), "{}", text(&pushed));
    }
    let config = std::env::temp_dir().join(format!("{}.toml", w.db));
    std::fs::write(
        &config,
        format!("[contracts]\nvalue_format = \"json-schema\"\n[registry]\nurl = \"{url}\"\nsubject_strategy = \"topic_name\"\ntimeout = \"2s\"\n"),
    )
    .unwrap();
    let port = testkit::free_port();
    let mut args = vec!["--config".to_string(), config.display().to_string()];
    args.extend(w.args());
    args.extend(["--metrics-addr".into(), format!("127.0.0.1:{port}")]);
    let p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    let first = insert(&w, "order", "OrderPlaced", r#"{"amount": 1}"#);
    wait_until("the first record", &p, || {
        read_all(&w.kafka_bootstrap, &w.topic_prefix).iter().any(|r| header(r, "id") == Some(first.as_str()))
    });

    // The registry stops answering: the invoice's subject was never fetched, so its event
    // waits, and so does the order event committed after it.
    registry.pause();
    let invoice = insert(&w, "invoice", "InvoiceSent", r#"{"amount": 2}"#);
    let after = insert(&w, "order", "OrderPlaced", r#"{"amount": 3}"#);
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        let ids: Vec<String> = read_all(&w.kafka_bootstrap, &w.topic_prefix)
            .iter()
            .filter_map(|r| header(r, "id").map(str::to_owned))
            .collect();
        assert!(!ids.contains(&invoice) && !ids.contains(&after), "published while the registry was down: {ids:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let log = p.log_text();
    assert!(
        log.contains(&format!("cannot check event id {invoice} of events.outbox against its contract now")),
        "{log}"
    );
    registry.resume();
    wait_until("the held events", &p, || {
        let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
        [&invoice, &after].iter().all(|id| records.iter().any(|r| header(r, "id") == Some(id.as_str())))
    });
    for aggregate in ["order", "invoice"] {
        for (id, _, value) in decode(&w, &w.topic(aggregate), &url, "json") {
            let expected = if id == first {
                1
            } else if id == invoice {
                2
            } else {
                3
            };
            assert_eq!(value, serde_json::json!({"amount": expected}), "event {id}");
        }
    }
    let metrics = crate::drills::http_get(port, "/metrics").1;
    for line in [
        "walpost_registry_requests_total{result=\"found\"}",
        "walpost_registry_requests_total{result=\"error\"}",
        "walpost_registry_cache_lookups_total{result=\"hit\"}",
    ] {
        assert!(metrics.lines().any(|l| l.starts_with(line) && !l.ends_with(" 0")), "{line} in\n{metrics}");
    }
}

#[test]
fn registry_refusing_walposts_credentials_stops_it_naming_the_registry_not_the_secret() {
    // A registry that answers 401 to everything (Apicurio here runs without auth).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            use std::io::{Read, Write};
            let mut stream = stream;
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    let w = World::new("registry-auth");
    let config = std::env::temp_dir().join(format!("{}.toml", w.db));
    std::fs::write(
        &config,
        format!("[contracts]\nvalue_format = \"avro\"\n[registry]\nurl = \"http://{addr}\"\nusername = \"walpost\"\n"),
    )
    .unwrap();
    let mut args = vec!["--config".to_string(), config.display().to_string()];
    args.extend(w.args());
    let mut p = Walpost::start(&args, &[("WALPOST_REGISTRY_PASSWORD", "s3cret-pw")]);
    let status = p.wait_exit(WAIT).expect("walpost must stop");
    assert!(!status.success());
    let log = p.log_text();
    assert!(
        log.contains(&format!("the schema registry at http://{addr} refused walpost's credentials (HTTP 401): check registry.username with WALPOST_REGISTRY_PASSWORD or registry.password_file, or the token (WALPOST_REGISTRY_TOKEN, registry.token_file)")),
        "{log}"
    );
    assert!(!log.contains("s3cret-pw"), "{log}");
}

/// Registers `schema` (Avro) under `subject` through the registry's REST API, as any
/// tool would; returns its id.
pub(crate) fn register_avro(registry: &str, subject: &str, schema: &str) -> u32 {
    let body = serde_json::json!({ "schema": schema }).to_string();
    let out = Command::new("curl")
        .args(["-sS", "-f", "-X", "POST", "-H", "Content-Type: application/vnd.schemaregistry.v1+json", "--data"])
        .arg(&body)
        .arg(format!("{registry}/subjects/{subject}/versions"))
        .output()
        .unwrap();
    assert!(out.status.success(), "register {subject}: {}", text(&out));
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    u32::try_from(answer["id"].as_u64().unwrap()).unwrap()
}

/// `contracts.key_format = avro` writes every key by the subject `<topic>-key`
/// (Confluent's deserializer reads it back as the aggregate id), `walpost check` asks the
/// registry, and payloads the Avro schema cannot hold (a missing field without default,
/// an array for a record) are dead-lettered with the pointer and no value, while the
/// events around them are published in order.
#[test]
fn registry_avro_keys_decode_and_payloads_the_schema_cannot_hold_are_dead_lettered() {
    let registry = SchemaRegistry::start();
    let url = registry.url();
    let w = World::new("registry-keys");
    let topic = w.topic("order");
    let dir = fresh_dir(&w, "schemas");
    std::fs::write(dir.join("OrderPlaced.avsc"), ORDER_V1).unwrap();
    let pushed = contracts("push", &url, &dir, &[]);
    assert!(pushed.status.success(), "{}", text(&pushed));
    let key_id = register_avro(&url, &format!("{topic}-key"), r#""string""#);

    let dlq = format!("{}dead", w.topic_prefix);
    let config = std::env::temp_dir().join(format!("{}.toml", w.db));
    std::fs::write(
        &config,
        format!(
            "on_permanent_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n[contracts]\nvalue_format = \"avro\"\nkey_format = \"avro\"\n[registry]\nurl = \"{url}\"\n"
        ),
    )
    .unwrap();
    let mut args = vec!["--config".to_string(), config.display().to_string()];
    args.extend(w.args());

    let check_args = ["check".to_string(), "--config".into(), config.display().to_string()];
    let check = Command::new(env!("CARGO_BIN_EXE_walpost"))
        .args(check_args.iter().chain(w.args().iter().skip_while(|a| *a == "run")))
        .output()
        .unwrap();
    assert!(text(&check).contains(&format!("ok    schema registry at {url} answers (2 subjects)")), "{}", text(&check));

    let p = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    let aggregate = |n: u32| format!("00000000-0000-4000-8000-00000000000{n}");
    let insert_for = |n: u32, payload: &str| {
        w.sql(&format!(
            "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', '{}', 'OrderPlaced', '{payload}') RETURNING id",
            aggregate(n)
        ))
        .trim()
        .to_owned()
    };
    let first = insert_for(1, r#"{"order_id": "o-1", "amount": 100}"#);
    let missing = insert_for(2, r#"{"order_id": "o-SECRET"}"#);
    let array = insert_for(3, r#"[1, 2]"#);
    let last = insert_for(4, r#"{"order_id": "o-4", "amount": 400}"#);
    wait_until("2 records and 2 dead letters", &p, || {
        let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
        records.iter().filter(|r| r.topic == topic).count() >= 2
            && records.iter().filter(|r| r.topic == dlq).count() >= 2
    });

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/sr_consume.py");
    let out = Command::new(testkit::python())
        .args([script, &w.kafka_bootstrap, &topic, &url, "avro", "avro-key"])
        .output()
        .unwrap();
    assert!(out.status.success(), "the deserializers could not decode:\n{}", String::from_utf8_lossy(&out.stderr));
    let decoded: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(decoded.len(), 2, "{decoded:?}");
    // The two aggregates' keys may hash to different partitions, and a consumer reads
    // partitions in no fixed order: find each record by its id, not by its position.
    for (id, n) in [(&first, 1), (&last, 4)] {
        let line = decoded
            .iter()
            .find(|line| line["id"].as_str() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("event {id} was not decoded: {decoded:?}"));
        assert_eq!(line["key"].as_str(), Some(aggregate(n).as_str()), "the key reads back as the aggregate id");
        assert_eq!(line["value"]["amount"].as_u64(), Some(u64::from(n) * 100));
    }
    let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
    let framed = records.iter().find(|r| r.topic == topic).unwrap();
    let key = framed.key.as_deref().unwrap();
    assert_eq!(key[0], 0, "magic byte");
    assert_eq!(u32::from_be_bytes(key[1..5].try_into().unwrap()), key_id, "the key subject's schema id");
    let dead: Vec<&Consumed> = records.iter().filter(|r| r.topic == dlq).collect();
    let message = |id: &str| {
        let r = dead.iter().find(|r| header(r, "walpost.event.id") == Some(id)).unwrap();
        assert_eq!(header(r, "walpost.error.class"), Some("contract_broken"));
        header(r, "walpost.error.message").unwrap().to_owned()
    };
    let m = message(&missing);
    assert!(m.contains("cannot hold it: the value at /amount is missing, and its field has no default"), "{m}");
    let m = message(&array);
    assert!(m.contains("cannot hold it: the value at the payload itself is not an object"), "{m}");
    assert!(!p.log_text().contains("SECRET"), "no payload value in the log");
    for r in records.iter().filter(|r| r.topic == dlq) {
        assert!(!header(r, "walpost.error.message").unwrap().contains("SECRET"));
    }
}

//! `walpost inbox` against records PostgreSQL refuses, producers whose event ids
//! collide, and roles beside walpost's that try to stall it (real Kafka, real
//! PostgreSQL): one bad record fails only itself, named by its position; two topics'
//! ids never shadow each other; no role without write rights on the inbox can hold the
//! ingest back, and a lock held by one that can is reported and waited out.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;

use crate::drills::metric;
use crate::inbox_ingest::{count, create_topic, inbox_args, inbox_db, produce, start_inbox, stored_offsets, WAIT};
use crate::support::{strip_ansi, World};

/// A record to produce: key, headers (name, value), value.
type Raw = (Vec<u8>, Vec<(&'static str, Vec<u8>)>, Vec<u8>);

/// Produces records to partition 0 of `topic`.
fn produce_raw(bootstrap: &str, topic: &str, records: &[Raw]) {
    let p: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).set("acks", "all").create().expect("producer");
    for (key, headers, value) in records {
        let mut h = OwnedHeaders::new();
        for (name, v) in headers {
            h = h.insert(Header { key: name, value: Some(v.as_slice()) });
        }
        let record = BaseRecord::to(topic).partition(0).key(key.as_slice()).payload(value.as_slice()).headers(h);
        p.send(record).map_err(|(e, _)| e).expect("send");
    }
    p.flush(Duration::from_secs(60)).expect("flush");
}

fn ok(id: &str) -> Raw {
    (b"agg".to_vec(), vec![("id", id.as_bytes().to_vec())], br#"{"ok": true}"#.to_vec())
}

/// A LATIN1 database of the same cluster, created with the inbox's migrations.
fn latin1_inbox(w: &World) -> (String, String) {
    let db = format!("{}_latin1", w.db);
    w.pg.psql(&format!("CREATE DATABASE \"{db}\" ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"))
        .unwrap();
    w.pg.psql_db(&db, &crate::support::inbox_migrations()).unwrap();
    w.pg.psql_db(&db, "SELECT inbox.register_handler('h', '{}', '{}', 3, '1 second', '1 minute', true)").unwrap();
    let url = w.superuser_url.replace(&format!("/{}", w.db), &format!("/{db}"));
    assert_ne!(url, w.superuser_url);
    (db, url)
}

/// A number `numeric` cannot hold, an aggregate id (key) of 3,000 bytes and text a LATIN1
/// database cannot hold, in one batch: the first two are stored (the number without its
/// jsonb copy, the key indexed by its hash), the third is rejected alone with its
/// SQLSTATE, or halts at its offset with the records around it stored.
#[test]
fn inbox_a_record_postgres_refuses_fails_only_itself() {
    let w = inbox_db("inbox-refused");
    let (db, url) = latin1_inbox(&w);
    let sql = |q: &str| w.pg.psql_db(&db, q).unwrap();
    let topic = format!("{}refused", w.topic_prefix);
    create_topic(&topic, 1);
    let euro = "price in \u{20ac}".as_bytes().to_vec();
    produce_raw(
        &w.kafka_bootstrap,
        &topic,
        &[
            ok("r0"),
            (b"agg".to_vec(), vec![("id", b"r1".to_vec())], br#"{"a":1e1000000}"#.to_vec()),
            (vec![b'k'; 3_000], vec![("id", b"r2".to_vec())], br#"{"long": "key"}"#.to_vec()),
            (b"agg".to_vec(), vec![("id", b"r3".to_vec()), ("note", euro)], br#"{"b": 1}"#.to_vec()),
            ok("r4"),
        ],
    );
    let mut args = inbox_args(&w, &topic, "reject", &["--on-invalid", "reject"]);
    let at = args.iter().position(|a| *a == w.superuser_url).unwrap();
    args[at] = url.clone();
    let mut p = start_inbox(&args, &[]);
    let stored = || sql("SELECT count(*) FROM inbox.messages").trim().parse::<i64>().unwrap_or(0);
    assert!(testkit::wait_until(WAIT, || stored() == 4), "stored {}:\n{}", stored(), p.log_text());
    assert!(p.is_running(), "one refused record does not stop the inbox:\n{}", p.log_text());
    assert_eq!(
        sql(
            "SELECT string_agg(event_id || ':' || (payload_json IS NULL), ',' ORDER BY \"offset\") FROM inbox.messages"
        )
        .trim(),
        "r0:false,r1:true,r2:false,r4:false"
    );
    assert_eq!(
        sql("SELECT \"offset\" || '|' || reason FROM inbox.rejected").trim(),
        "3|refused_by_postgres: PostgreSQL refused the record with SQLSTATE 22P05 (text the database's encoding cannot hold); the record is in Kafka at this topic, partition and offset"
    );
    assert_eq!(sql("SELECT count(*) FROM inbox.deliveries WHERE aggregate_id LIKE 'sha256:%'").trim(), "1");
    let offset = sql("SELECT next_offset FROM inbox.offsets WHERE group_id = 'reject'");
    assert_eq!(offset.trim(), "5");
    let log = strip_ansi(&p.log_text());
    assert!(log.contains("writing the batch again record by record"), "{log}");
    assert!(!log.contains("price in") && !log.contains("1e1000000"), "no value in the log:\n{log}");
    p.terminate(WAIT);

    // Halt: the record's position named, the records before and after it on the partition
    // before it stored, its offset kept at it, and the same at every restart.
    let topic2 = format!("{}refused-halt", w.topic_prefix);
    create_topic(&topic2, 1);
    let euro = "\u{20ac}".as_bytes().to_vec();
    produce_raw(
        &w.kafka_bootstrap,
        &topic2,
        &[ok("h0"), ok("h1"), (b"agg".to_vec(), vec![("id", b"h2".to_vec()), ("n", euro)], b"{}".to_vec()), ok("h3")],
    );
    for attempt in 0..2 {
        let mut args = inbox_args(&w, &topic2, "halt", &[]);
        args[at] = url.clone();
        let mut p = start_inbox(&args, &[]);
        let status = p.wait_exit(WAIT).expect("halts");
        let log = strip_ansi(&p.log_text());
        assert_eq!(status.code(), Some(1), "{log}");
        assert!(
            log.contains(&format!(
                "record {topic2}/0@2 cannot be stored in the inbox: refused_by_postgres: PostgreSQL refused the record with SQLSTATE 22P05"
            )),
            "attempt {attempt}: {log}"
        );
        assert_eq!(
            sql(&format!(
                "SELECT string_agg(event_id, ',' ORDER BY \"offset\") FROM inbox.messages WHERE topic = '{topic2}'"
            ))
            .trim(),
            "h0,h1",
            "attempt {attempt}"
        );
        assert_eq!(sql("SELECT next_offset FROM inbox.offsets WHERE group_id = 'halt'").trim(), "2");
        assert_eq!(sql(&format!("SELECT count(*) FROM inbox.rejected WHERE topic = '{topic2}'")).trim(), "0");
    }
}

/// Two producers' outboxes both send event id 42: with `dedup = topic` (the default) both
/// are stored, the collision counted; with `dedup = global` the second is a duplicate,
/// counted too.
#[test]
fn inbox_the_same_event_id_from_two_topics_is_stored_per_topic() {
    for (mode, stored, duplicates) in [("topic", 3, 0), ("global", 2, 1)] {
        let w = inbox_db(&format!("inbox-dedup-{mode}"));
        let orders = format!("{}orders", w.topic_prefix);
        let payments = format!("{}payments", w.topic_prefix);
        create_topic(&orders, 1);
        create_topic(&payments, 1);
        let rec = |id: &str| vec![("k".to_owned(), Some(id.to_owned()), br#"{"a":1}"#.to_vec())];
        produce(&w.kafka_bootstrap, &orders, &[rec("42"), rec("43")].concat());
        let port = testkit::free_port();
        let mut p = start_inbox(
            &inbox_args(
                &w,
                &format!("{orders},{payments}"),
                "g",
                &["--create-schema", "--dedup", mode, "--metrics-addr", &format!("127.0.0.1:{port}")],
            ),
            &[],
        );
        assert!(testkit::wait_until(WAIT, || crate::inbox_ingest::messages(&w) == 2), "{}", p.log_text());
        produce(&w.kafka_bootstrap, &payments, &rec("42"));
        assert!(
            testkit::wait_until(WAIT, || stored_offsets(&w, "g").get(&(payments.clone(), 0)) == Some(&1)),
            "{}",
            p.log_text()
        );
        assert_eq!(crate::inbox_ingest::messages(&w), stored, "{mode}");
        assert_eq!(metric(port, "walpost_inbox_event_id_collisions_total"), Some(1.0), "{mode}");
        let dup = format!("walpost_inbox_records_total{{result=\"duplicate\",topic=\"{payments}\"}}");
        assert_eq!(metric(port, &dup).unwrap_or(0.0), f64::from(duplicates), "{mode}");
        p.terminate(WAIT);
    }
}

/// A role that may read the inbox takes the advisory lock the ingest used to take, and
/// tries to lock the offsets table: neither stalls the ingest. A lock held by a role that
/// may (the owner here) is waited for 10 s at most, said in a WARN line, then retried,
/// and the records are stored once it goes.
#[test]
fn inbox_roles_beside_walpost_cannot_stall_the_ingest() {
    let w = inbox_db("inbox-stall");
    let topic = format!("{}t", w.topic_prefix);
    create_topic(&topic, 1);
    w.sql(&crate::support::inbox_migrations());
    let nosy = format!("{}_nosy", w.role);
    w.sql(&format!(
        "CREATE ROLE {nosy} LOGIN; GRANT USAGE ON SCHEMA inbox TO {nosy}; GRANT SELECT ON ALL TABLES IN SCHEMA inbox TO {nosy};"
    ));
    let pg = w.pg;
    let (db, role) = (w.db.clone(), nosy.clone());
    let holder = std::thread::spawn(move || {
        pg.psql_as(
            &role,
            &db,
            "SELECT pg_advisory_lock(hashtextextended('walpost inbox write inbox', 0)); SELECT pg_sleep(20);",
        )
    });
    let refused = w.pg.psql_as(&nosy, &w.db, "BEGIN; LOCK TABLE inbox.offsets IN ACCESS EXCLUSIVE MODE; COMMIT;");
    assert!(refused.unwrap_err().to_string().contains("permission denied"), "a reader cannot lock the offsets");
    let in_tx = w.pg.psql_as(&nosy, &w.db, "BEGIN; SELECT count(*) FROM inbox.offsets; SELECT pg_sleep(0.1); COMMIT;");
    assert!(in_tx.is_ok(), "{in_tx:?}");

    let mut p = start_inbox(&inbox_args(&w, &topic, "g", &[]), &[]);
    let started = std::time::Instant::now();
    produce(&w.kafka_bootstrap, &topic, &crate::inbox_ingest::json_records("s", 0, 10, 2));
    assert!(
        testkit::wait_until(Duration::from_secs(15), || crate::inbox_ingest::messages(&w) == 10),
        "stored {} while another role held the advisory lock:\n{}",
        crate::inbox_ingest::messages(&w),
        p.log_text()
    );
    assert!(started.elapsed() < Duration::from_secs(15));
    let _ = holder.join();

    // The owner holds a conflicting lock for 13 s: waited out, said, retried.
    let (db, pg) = (w.db.clone(), w.pg);
    let owner = std::thread::spawn(move || {
        pg.psql_db(&db, "BEGIN; LOCK TABLE inbox.offsets IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(13); COMMIT;")
    });
    std::thread::sleep(Duration::from_millis(500));
    produce(&w.kafka_bootstrap, &topic, &crate::inbox_ingest::json_records("s", 10, 5, 2));
    let warned = testkit::wait_until(Duration::from_secs(30), || {
        strip_ansi(&p.log_text()).contains("waited 10000 ms for the inbox's write lock (a lock on inbox.offsets)")
    });
    assert!(warned, "{}", p.log_text());
    owner.join().unwrap().unwrap();
    assert!(testkit::wait_until(WAIT, || crate::inbox_ingest::messages(&w) == 15), "{}", p.log_text());
    assert!(p.is_running());
    assert_eq!(count(&w, "SELECT count(DISTINCT event_id) FROM inbox.messages"), 15);
    p.terminate(WAIT);
}

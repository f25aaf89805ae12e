//! Drills of the inbox runbooks (runbooks/inbox-*.md): each creates the incident with a
//! running `walpost inbox` and handler workers that call only the SQL API, runs the
//! runbook's own blocks (read from the file) and checks the outcome.

use std::time::Duration;

use crate::drills::{http_get, metric, sh_ok, Runbook};
use crate::inbox_ingest::{
    count, create_topic, inbox_args, inbox_db, inbox_schema_complete, json_records, messages, produce, start_inbox,
    wait_for_messages, WAIT,
};
use crate::ops::{foreign_metrics, missing_metrics};
use crate::support::World;
use testkit::{PgOptions, Postgres, StopMode};

/// `walpost inbox` with its metrics on `port` and the handler statistics read every second.
fn inbox_with_metrics(w: &World, topic: &str, group: &str, port: u16) -> crate::support::Walpost {
    let config = w.pg.dir().join(format!("{}-{group}.toml", w.db));
    std::fs::write(&config, format!("metrics_addr = \"127.0.0.1:{port}\"\n[inbox]\nstats_interval_secs = 1\n"))
        .unwrap();
    let mut args = inbox_args(w, topic, group, &["--create-schema"]);
    args.extend(["--config".into(), config.display().to_string()]);
    start_inbox(&args, &[])
}

fn register(w: &World, handler: &str, max_attempts: u32, backoff: &str) {
    w.sql(&format!(
        "SELECT inbox.register_handler('{handler}', '{{}}', '{{}}', {max_attempts}, '{backoff}', '1 hour', false)"
    ));
}

/// Claims up to `n` with `lease`: (event id, token).
fn claim(w: &World, handler: &str, n: u32, lease: &str) -> Vec<(String, String)> {
    w.sql(&format!("SELECT event_id, lease_token FROM inbox.claim('{handler}', {n}, '{lease}')"))
        .lines()
        .filter_map(|l| l.split_once('|').map(|(a, b)| (a.to_owned(), b.to_owned())))
        .collect()
}

/// A worker that completes everything it claims, its effect in the same transaction.
fn drain(w: &World, handler: &str) {
    loop {
        let claimed = claim(w, handler, 20, "30 seconds");
        if claimed.is_empty() {
            return;
        }
        for (id, token) in claimed {
            w.sql(&format!(
                "WITH c AS (SELECT inbox.complete('{handler}', '{id}', '{token}') AS ok)
                 INSERT INTO effects SELECT '{handler}', '{id}' FROM c WHERE ok"
            ));
        }
    }
}

fn gauge(port: u16, name: &str, handler: &str) -> Option<f64> {
    metric(port, &format!("{name}{{handler=\"{handler}\"}}"))
}

#[test]
fn drill_inbox_backlog_a_stuck_worker_and_a_lease_storm_then_a_drain() {
    let rb = Runbook::open("inbox-backlog");
    let w = inbox_db("drill-inbox-backlog");
    let topic = format!("{}orders", w.topic_prefix);
    create_topic(&topic, 2);
    let port = testkit::free_port();
    let p = inbox_with_metrics(&w, &topic, "svc", port);
    assert!(testkit::wait_until(WAIT, || inbox_schema_complete(&w)), "{}", p.log_text());
    register(&w, "billing", 5, "1 second");
    w.sql("CREATE TABLE effects (handler text, event_id text, UNIQUE (handler, event_id))");
    produce(&w.kafka_bootstrap, &topic, &json_records("b", 0, 50, 7));
    wait_for_messages(&w, 50, &p);
    // A worker that claims with a lease shorter than its work, and never completes.
    assert_eq!(claim(&w, "billing", 20, "1 second").len(), 20);
    let seen = testkit::wait_until(WAIT, || gauge(port, "walpost_inbox_handler_backlog", "billing") == Some(50.0));
    assert!(seen, "backlog metric: {:?}", gauge(port, "walpost_inbox_handler_backlog", "billing"));

    let stats = w.sql(&rb.block("stats").fill(&[]));
    assert!(stats.lines().any(|l| l.starts_with("billing|50|")), "{stats}");
    std::thread::sleep(Duration::from_millis(1_500));
    let leases = w.sql(&rb.block("leases").fill(&[("handler", "billing")]));
    assert_eq!(leases.trim(), "0|20|30|0", "leased now | run out | never claimed | attempts");

    // Act: workers with a lease longer than the work drain it, each effect once.
    drain(&w, "billing");
    let drained = testkit::wait_until(WAIT, || gauge(port, "walpost_inbox_handler_backlog", "billing") == Some(0.0));
    assert!(drained, "{:?}", gauge(port, "walpost_inbox_handler_backlog", "billing"));
    assert_eq!(count(&w, "SELECT count(*) FROM effects"), 50);
    assert_eq!(gauge(port, "walpost_inbox_handler_oldest_pending_seconds", "billing"), Some(0.0));
    // The storm's leases ran out without complete or fail: the metric is the count the
    // handler's claims kept in inbox.handlers.
    let lost: f64 = w.sql("SELECT leases_lost FROM inbox.handlers WHERE name = 'billing'").trim().parse().unwrap();
    assert!(lost >= 20.0, "the 20 leases of the storm: {lost}");
    let exported =
        testkit::wait_until(WAIT, || gauge(port, "walpost_inbox_leases_lost_total", "billing") == Some(lost));
    assert!(exported, "{:?} exported, {lost} counted", gauge(port, "walpost_inbox_leases_lost_total", "billing"));
    let row = w.sql(&rb.block("leases-lost").fill(&[]));
    assert!(row.lines().any(|l| l.starts_with(&format!("billing|{lost}|"))), "{row}");
    let blocked = w.sql(&rb.block("blocked-aggregates").fill(&[("handler", "billing")]));
    assert!(blocked.trim().is_empty(), "{blocked}");
    // Every metric of walpost inbox the runbook and docs/metrics.md name is on the
    // endpoint, and none of walpost run's (published events, the slot, its retention).
    let mut missing = Vec::new();
    let all = testkit::wait_until(Duration::from_secs(20), || {
        missing = missing_metrics(::inbox::metrics::METRICS, &http_get(port, "/metrics").1, |_| true);
        missing.is_empty()
    });
    assert!(all, "walpost inbox does not export {missing:?}");
    let text = http_get(port, "/metrics").1;
    let foreign = foreign_metrics(::inbox::metrics::METRICS, &text);
    assert!(foreign.is_empty(), "walpost inbox exports series that are not its own: {foreign:?}");
    for relay in ["walpost_events_published_total", "walpost_slot_retained_bytes", "walpost_retention_passes_total"] {
        assert!(!text.contains(relay), "walpost inbox exports {relay}");
    }
}

/// The drill's PostgreSQL outage: `/readyz` said ready all along and the handler gauges
/// froze. Now the inbox's own PostgreSQL stops: `/readyz` answers 503 naming it and the
/// statistics' age grows; back, ready again and storing. A second instance of a
/// one-partition group holds nothing: not ready, and it says why.
#[test]
fn drill_inbox_does_not_store_readiness_follows_its_postgres_and_its_partitions() {
    let rb = Runbook::open("inbox-backlog");
    let pg: &'static Postgres = Box::leak(Box::new(Postgres::start(PgOptions::default()).expect("start postgres")));
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "drill-inbox-down");
    let topic = format!("{}orders", w.topic_prefix);
    create_topic(&topic, 1);
    let port = testkit::free_port();
    let mut p = inbox_with_metrics(&w, &topic, "svc", port);
    produce(&w.kafka_bootstrap, &topic, &json_records("a", 0, 10, 3));
    wait_for_messages(&w, 10, &p);
    let readyz = |port: u16| {
        let out = sh_ok(&rb.block("readyz").fill(&[("metrics-addr", &format!("127.0.0.1:{port}"))]));
        out.trim().to_owned()
    };
    let ready = testkit::wait_until(WAIT, || readyz(port).ends_with(" 200"));
    assert!(ready, "{}\n{}", readyz(port), p.log_text());
    // Both come with the statistics, every second here.
    let held = testkit::wait_until(WAIT, || {
        metric(port, "walpost_inbox_assigned_partitions") == Some(1.0)
            && metric(port, "walpost_inbox_group_partitions") == Some(1.0)
    });
    assert!(held, "{}", http_get(port, "/metrics").1);
    assert!(readyz(port).ends_with(" 200"), "{}", readyz(port));

    // A second instance of the group: the one partition stays the first one's.
    let port2 = testkit::free_port();
    let mut spare = inbox_with_metrics(&w, &topic, "svc", port2);
    let idle = testkit::wait_until(WAIT, || http_get(port2, "/readyz").1.contains("holds no partition"));
    assert!(idle, "{}\n{}", http_get(port2, "/readyz").1, spare.log_text());
    assert!(readyz(port2).ends_with(" 503"), "{}", readyz(port2));
    assert!(spare.terminate(WAIT).is_some_and(|s| s.success()), "{}", spare.log_text());

    // The outage: not ready while it lasts, and the gauges' age says how stale they are.
    pg.stop(StopMode::Fast).expect("stop postgres");
    let down = testkit::wait_until(WAIT, || {
        let r = readyz(port);
        r.contains("cannot read the inbox's PostgreSQL") && r.ends_with(" 503")
    });
    assert!(down, "{}\n{}", readyz(port), p.log_text());
    let stale = testkit::wait_until(WAIT, || metric(port, "walpost_inbox_handler_stats_age_seconds") > Some(2.0));
    assert!(stale, "{:?}", metric(port, "walpost_inbox_handler_stats_age_seconds"));
    pg.start_again().expect("start postgres again");
    let back = testkit::wait_until(WAIT, || readyz(port).ends_with(" 200"));
    assert!(back, "{}\n{}", readyz(port), p.log_text());
    assert!(metric(port, "walpost_inbox_handler_stats_age_seconds") < Some(2.0));
    produce(&w.kafka_bootstrap, &topic, &json_records("a", 10, 10, 3));
    wait_for_messages(&w, 20, &p);
    assert!(p.terminate(WAIT).is_some_and(|s| s.success()), "{}", p.log_text());
}

#[test]
fn drill_inbox_review_required_inspect_fix_and_retry() {
    let rb = Runbook::open("inbox-review-required");
    let w = inbox_db("drill-inbox-review");
    let topic = format!("{}mail", w.topic_prefix);
    create_topic(&topic, 1);
    let port = testkit::free_port();
    let p = inbox_with_metrics(&w, &topic, "svc", port);
    assert!(testkit::wait_until(WAIT, || inbox_schema_complete(&w)), "{}", p.log_text());
    register(&w, "mailer", 2, "10 milliseconds");
    w.sql("CREATE TABLE effects (handler text, event_id text, UNIQUE (handler, event_id))");
    produce(&w.kafka_bootstrap, &topic, &json_records("m", 0, 5, 5));
    wait_for_messages(&w, 5, &p);
    // The handler fails on m-2 every time (its mail server refuses it): two attempts.
    for _ in 0..2 {
        let ok = testkit::wait_until(WAIT, || {
            let mut failed = false;
            for (id, token) in claim(&w, "mailer", 10, "30 seconds") {
                if id == "m-2" {
                    w.sql(&format!("SELECT inbox.fail('mailer', '{id}', '{token}', 'smtp_550')"));
                    failed = true;
                    continue;
                }
                w.sql(&format!(
                    "WITH c AS (SELECT inbox.complete('mailer', '{id}', '{token}') AS ok)
                     INSERT INTO effects SELECT 'mailer', '{id}' FROM c WHERE ok"
                ));
            }
            failed
        });
        assert!(ok, "m-2 was never offered again");
    }
    let seen =
        testkit::wait_until(WAIT, || gauge(port, "walpost_inbox_handler_review_required", "mailer") == Some(1.0));
    assert!(seen, "{:?}", gauge(port, "walpost_inbox_handler_review_required", "mailer"));
    let waiting = w.sql(&rb.block("inspect").fill(&[("handler", "mailer")]));
    let row: Vec<&str> = waiting.trim().split('|').collect();
    assert_eq!((row[0], row[4], row[5]), ("m-2", "2", "smtp_550"), "{waiting}");
    assert!(claim(&w, "mailer", 10, "30 seconds").is_empty(), "not offered while it waits for review");

    // Fixed (the address corrected): retry the ones of that cause; a worker completes them.
    let retried = w.sql(&rb.block("retry").fill(&[("handler", "mailer"), ("error-code", "smtp_550")]));
    assert_eq!(retried.trim(), "1");
    drain(&w, "mailer");
    assert_eq!(w.sql(&rb.block("check").fill(&[("handler", "mailer")])).trim(), "5");
    let cleared =
        testkit::wait_until(WAIT, || gauge(port, "walpost_inbox_handler_review_required", "mailer") == Some(0.0));
    assert!(cleared);
    assert_eq!(count(&w, "SELECT count(*) FROM effects"), 5, "each effect once");

    // One that must never be handled: two failures, then the decision to dismiss it.
    produce(&w.kafka_bootstrap, &topic, &json_records("m", 5, 1, 5));
    wait_for_messages(&w, 6, &p);
    let reviewed = testkit::wait_until(WAIT, || {
        for (id, token) in claim(&w, "mailer", 10, "30 seconds") {
            w.sql(&format!("SELECT inbox.fail('mailer', '{id}', '{token}', 'bad_address')"));
        }
        count(&w, "SELECT count(*) FROM inbox.deliveries WHERE state = 'review_required'") == 1
    });
    assert!(reviewed, "m-5 did not reach review_required");
    let dismissed = w.sql(&rb.block("dismiss").fill(&[("handler", "mailer"), ("event-id", "m-5")]));
    assert_eq!(dismissed.trim(), "t");
    assert_eq!(count(&w, "SELECT count(*) FROM inbox.deliveries WHERE state IN ('pending', 'review_required')"), 0);
    assert!(claim(&w, "mailer", 10, "30 seconds").is_empty(), "a dismissed message is not offered");
    assert_eq!(w.sql(&rb.block("check").fill(&[("handler", "mailer")])).trim(), "5", "and has no receipt");
}

#[test]
fn drill_inbox_replay_from_a_time_stores_and_handles_nothing_twice() {
    let rb = Runbook::open("inbox-replay");
    let w = inbox_db("drill-inbox-replay");
    let topic = format!("{}orders", w.topic_prefix);
    create_topic(&topic, 1);
    produce(&w.kafka_bootstrap, &topic, &json_records("r", 0, 15, 3));
    std::thread::sleep(Duration::from_millis(50));
    let since_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    std::thread::sleep(Duration::from_millis(50));
    produce(&w.kafka_bootstrap, &topic, &json_records("r", 15, 15, 3));
    let mut p = start_inbox(&inbox_args(&w, &topic, "svc", &["--create-schema"]), &[]);
    wait_for_messages(&w, 30, &p);
    register(&w, "h", 5, "1 second");
    // A second handler, ordered, that has not handled anything yet when the rows go: its
    // deliveries of them are open.
    w.sql("SELECT inbox.register_handler('late', '{}', '{}', 5, '1 second', '1 hour', true)");
    w.sql("CREATE TABLE effects (handler text, event_id text, n bigserial, UNIQUE (handler, event_id))");
    drain(&w, "h");
    assert!(p.terminate(WAIT).is_some_and(|s| s.success()), "{}", p.log_text());
    // Rows lost by mistake, after the time: five of the second half.
    w.sql("DELETE FROM inbox.messages WHERE event_id IN ('r-20', 'r-21', 'r-22', 'r-23', 'r-24')");

    let answer = sh_ok(&rb.block("offset-for-time").fill(&[
        ("brokers", &w.kafka_bootstrap),
        ("topic", &topic),
        ("partition", "0"),
        ("unix-ms", &since_ms.to_string()),
    ]));
    let offset: i64 = answer
        .split("offset ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no offset in {answer:?}"));
    assert_eq!(offset, 15, "the first record at or after the time");
    w.sql(&rb.block("rewind").fill(&[
        ("offset", &offset.to_string()),
        ("group", "svc"),
        ("topic", &topic),
        ("partition", "0"),
    ]));
    let port = testkit::free_port();
    let mut args = inbox_args(&w, &topic, "svc", &[]);
    args.extend(["--metrics-addr".into(), format!("127.0.0.1:{port}")]);
    let p = start_inbox(&args, &[]);
    wait_for_messages(&w, 30, &p);
    let out = sh_ok(&rb.block("check").fill(&[("metrics-addr", &format!("127.0.0.1:{port}"))]));
    assert!(
        out.contains(&format!("walpost_inbox_records_total{{result=\"duplicate\",topic=\"{topic}\"}} 10")),
        "{out}"
    );
    assert!(out.contains(&format!("walpost_inbox_records_total{{result=\"stored\",topic=\"{topic}\"}} 5")), "{out}");
    assert_eq!(messages(&w), 30);
    // The restored messages are deliveries again (their receipts stand): nothing is handled twice.
    drain(&w, "h");
    assert_eq!(count(&w, "SELECT count(*) FROM effects WHERE handler = 'h'"), 30);
    // The handler that had not handled them acts on every one once, each aggregate in the
    // order its events were first stored: its open deliveries followed the new rows.
    for _ in 0..40 {
        drain(&w, "late");
    }
    assert_eq!(
        count(
            &w,
            "SELECT count(*) FROM inbox.deliveries d WHERE d.state IN ('pending', 'review_required') \
             AND NOT EXISTS (SELECT FROM inbox.messages m \
             WHERE m.event_id = d.event_id AND m.topic = d.topic AND m.received_at = d.received_at)"
        ),
        0,
        "no open delivery points at a message that is gone"
    );
    assert_eq!(count(&w, "SELECT count(*) FROM effects WHERE handler = 'late'"), 30);
    let order = w.sql(
        "SELECT string_agg(event_id, ',' ORDER BY n) FROM effects WHERE handler = 'late' \
         GROUP BY split_part(event_id, '-', 2)::int % 3 ORDER BY 1",
    );
    for aggregate in order.lines() {
        let ids: Vec<i64> = aggregate.split(',').map(|id| id.trim_start_matches("r-").parse().unwrap()).collect();
        assert!(ids.windows(2).all(|p| p[0] < p[1]), "not in first order: {aggregate}");
    }
}

/// One message crashes its worker every time (the worker process dies before `complete`
/// or `fail`): its batch-mates go on, the runbook's `crashed` query shows it charged for
/// each lost lease, it reaches review_required after max_attempts, and `set-aside`
/// (dismiss) closes a pending one at once.
#[test]
fn drill_inbox_backlog_one_message_crashes_the_handler() {
    let rb = Runbook::open("inbox-backlog");
    let w = inbox_db("drill-inbox-crash");
    let topic = format!("{}orders", w.topic_prefix);
    create_topic(&topic, 1);
    let port = testkit::free_port();
    let p = inbox_with_metrics(&w, &topic, "svc", port);
    assert!(testkit::wait_until(WAIT, || inbox_schema_complete(&w)), "{}", p.log_text());
    w.sql("SELECT inbox.register_handler('mailer', '{}', '{}', 3, '10 milliseconds', '10 milliseconds', false)");
    w.sql("CREATE TABLE effects (handler text, event_id text, UNIQUE (handler, event_id))");
    produce(&w.kafka_bootstrap, &topic, &json_records("c", 0, 8, 8));
    wait_for_messages(&w, 8, &p);
    // The worker: claims 5, handles them in order, and dies at c-2 (nothing after it).
    let mut crashes = 0;
    for _ in 0..30 {
        let claimed = claim(&w, "mailer", 5, "300 milliseconds");
        if claimed.is_empty() && count(&w, "SELECT count(*) FROM inbox.deliveries WHERE state = 'pending'") == 0 {
            break;
        }
        for (id, token) in claimed {
            if id == "c-2" {
                crashes += 1;
                break;
            }
            w.sql(&format!(
                "WITH c AS (SELECT inbox.complete('mailer', '{id}', '{token}') AS ok)
                 INSERT INTO effects SELECT 'mailer', '{id}' FROM c WHERE ok"
            ));
        }
        if crashes == 2 {
            // Diagnose while it loops: the runbook's query shows it.
            let crashed = w.sql(&rb.block("crashed").fill(&[("handler", "mailer")]));
            assert!(crashed.lines().any(|l| l.starts_with(&format!("c-2|{topic}|"))), "{crashed}");
        }
        std::thread::sleep(Duration::from_millis(350));
    }
    assert_eq!(count(&w, "SELECT count(*) FROM effects"), 7, "every other message handled once");
    assert_eq!(
        w.sql("SELECT state || '|' || attempts || '|' || last_error_code FROM inbox.deliveries WHERE event_id = 'c-2'")
            .trim(),
        "review_required|3|lease_expired"
    );
    let lost = testkit::wait_until(WAIT, || {
        metric(port, "walpost_inbox_leases_lost_total{handler=\"mailer\"}").is_some_and(|n| n >= 4.0)
    });
    assert!(lost, "{:?}", metric(port, "walpost_inbox_leases_lost_total{handler=\"mailer\"}"));

    // The same again, set aside at once by the runbook's dismiss.
    produce(&w.kafka_bootstrap, &topic, &json_records("d", 0, 1, 1));
    wait_for_messages(&w, 9, &p);
    assert_eq!(claim(&w, "mailer", 5, "1 hour").len(), 1, "d-0, held by a worker that hangs");
    let dismissed = w.sql(&rb.block("set-aside").fill(&[("handler", "mailer"), ("event_id", "d-0")]));
    assert_eq!(dismissed.trim(), "t");
    assert!(claim(&w, "mailer", 5, "1 hour").is_empty());
    assert_eq!(count(&w, "SELECT count(*) FROM inbox.deliveries WHERE state = 'pending'"), 0);
}

/// Produces one record per id to `topic`, its id in the header `header` only.
fn produce_with_id_header(bootstrap: &str, topic: &str, header: &str, ids: &[&str]) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let p: ThreadedProducer<DefaultProducerContext> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", bootstrap).set("acks", "all").create().unwrap();
    for id in ids {
        let headers = OwnedHeaders::new().insert(Header { key: header, value: Some(id.as_bytes()) });
        p.send(BaseRecord::to(topic).key("k").payload(b"{\"own\": true}".as_slice()).headers(headers)).unwrap();
    }
    p.flush(Duration::from_secs(60)).unwrap();
}

/// The replay runbook's fix path for records rejected as `no_event_id` because their
/// producer puts the id in a header of its own: that header is listed after the default
/// ones, the partition is read again from the first rejected offset, the rejected records
/// are stored, the normal ones read again are duplicates (with the header alone, as the
/// runbook said before, every one of them was rejected), and `inbox.rejected` is cleaned up.
#[test]
fn drill_inbox_replay_stores_rejected_records_after_the_event_id_header_fix() {
    let rb = Runbook::open("inbox-replay");
    let w = inbox_db("drill-inbox-rejected");
    let topic = format!("{}orders", w.topic_prefix);
    create_topic(&topic, 1);
    // Offsets 0-4 and 8-9 carry `id`; 5-7 only `event-id`.
    produce(&w.kafka_bootstrap, &topic, &json_records("n", 0, 5, 2));
    produce_with_id_header(&w.kafka_bootstrap, &topic, "event-id", &["x-0", "x-1", "x-2"]);
    produce(&w.kafka_bootstrap, &topic, &json_records("n", 5, 2, 2));
    let next = format!("SELECT next_offset FROM inbox.offsets WHERE group_id = 'svc' AND topic = '{topic}'");
    let mut p = start_inbox(&inbox_args(&w, &topic, "svc", &["--create-schema", "--on-invalid", "reject"]), &[]);
    assert!(testkit::wait_until(WAIT, || w.try_sql(&next).is_ok_and(|n| n.trim() == "10")), "{}", p.log_text());
    assert!(p.terminate(WAIT).is_some_and(|s| s.success()), "{}", p.log_text());
    assert_eq!(messages(&w), 7);
    let causes = w.sql(&rb.block("rejected").fill(&[]));
    assert!(causes.trim().starts_with(&format!("{topic}|0|5|3|no_event_id")), "{causes}");

    w.sql(&rb.block("rewind").fill(&[("offset", "5"), ("group", "svc"), ("topic", &topic), ("partition", "0")]));
    let port = testkit::free_port();
    let mut args = inbox_args(&w, &topic, "svc", &["--on-invalid", "reject"]);
    args.extend(["--event-id-header".into(), "id,ce_id,event-id".into()]);
    args.extend(["--metrics-addr".into(), format!("127.0.0.1:{port}")]);
    let p = start_inbox(&args, &[]);
    wait_for_messages(&w, 10, &p);
    assert!(testkit::wait_until(WAIT, || w.try_sql(&next).is_ok_and(|n| n.trim() == "10")), "{}", p.log_text());
    let records =
        |result: &str| metric(port, &format!("walpost_inbox_records_total{{result=\"{result}\",topic=\"{topic}\"}}"));
    assert!(testkit::wait_until(WAIT, || records("duplicate") == Some(2.0)), "{:?}", records("duplicate"));
    assert_eq!(records("stored"), Some(3.0));
    assert_eq!(records("rejected"), None, "the normal records read again are not rejected");
    assert_eq!(count(&w, "SELECT count(*) FROM inbox.messages WHERE event_id LIKE 'x-%'"), 3);

    w.sql(&rb.block("clean-rejected").fill(&[]));
    assert_eq!(count(&w, "SELECT count(*) FROM inbox.rejected"), 0);
    assert!(w.sql(&rb.block("rejected").fill(&[])).trim().is_empty());
}

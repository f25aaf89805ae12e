//! The inbox's SQL API (migrations/inbox/) against a real PostgreSQL and no Kafka: what a
//! consuming service's handlers call, from any language. Messages are
//! inserted here as `walpost inbox` will store them.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::World;

fn inbox_world(name: &str) -> World {
    let w = World::postgres_only(name);
    let migration = crate::support::inbox_migrations();
    w.sql(&migration);
    // Idempotent: a second run changes nothing and fails on nothing.
    w.sql(&migration);
    w
}

/// Stores a message as the ingest does: (event id, topic, aggregate, event type).
pub(crate) fn store(w: &World, rows: &[(&str, &str, &str, &str)]) {
    let values: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(i, (id, topic, aggregate, event_type))| {
            format!("('{id}', '{topic}', 0, {i}, '{{}}', convert_to('{{\"n\": {i}}}', 'UTF8'), '{event_type}', '{aggregate}')")
        })
        .collect();
    w.sql(&format!(
        "INSERT INTO inbox.messages (event_id, topic, \"partition\", \"offset\", headers, payload, event_type, aggregate_id)
         VALUES {}",
        values.join(", ")
    ));
}

fn register(w: &World, name: &str, topics: &str, max_attempts: u32, backoff: &str, ordered: bool) {
    w.sql(&format!(
        "SELECT inbox.register_handler('{name}', {topics}, '{{}}', {max_attempts}, '{backoff}', '1 day', {ordered})"
    ));
}

/// `inbox.claim` as (event id, lease token, attempts), in the order returned.
fn claim(w: &World, handler: &str, max_rows: u32, lease: &str) -> Vec<(String, String, u32)> {
    w.sql(&format!("SELECT event_id, lease_token, attempts FROM inbox.claim('{handler}', {max_rows}, '{lease}')"))
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (f[0].to_owned(), f[1].to_owned(), f[2].parse().unwrap())
        })
        .collect()
}

fn complete(w: &World, handler: &str, event_id: &str, token: &str) -> bool {
    w.sql(&format!("SELECT inbox.complete('{handler}', '{event_id}', '{token}')")).trim() == "t"
}

fn ids(claimed: &[(String, String, u32)]) -> Vec<&str> {
    claimed.iter().map(|(id, _, _)| id.as_str()).collect()
}

#[test]
fn inbox_claim_complete_gives_one_receipt_per_handler_and_event() {
    let w = inbox_world("inbox-basic");
    store(&w, &[("e1", "orders", "a", "Placed"), ("e2", "payments", "b", "Paid"), ("e3", "orders", "c", "Placed")]);
    register(&w, "billing", "'{orders}'", 5, "1 second", false);
    register(&w, "audit", "'{}'", 5, "1 second", false);
    // Registering again with the same settings is a no-op.
    register(&w, "billing", "'{orders}'", 5, "1 second", false);
    // A message stored after the handlers exist is theirs too.
    store(&w, &[("e4", "orders", "a", "Shipped")]);

    let billing = claim(&w, "billing", 10, "30 seconds");
    assert_eq!(ids(&billing), ["e1", "e3", "e4"], "only its topic, oldest first");
    assert!(claim(&w, "billing", 10, "30 seconds").is_empty(), "leased messages are not offered twice");
    assert_eq!(ids(&claim(&w, "audit", 10, "30 seconds")), ["e1", "e2", "e3", "e4"], "every topic");

    let (id, token, _) = &billing[0];
    assert!(complete(&w, "billing", id, token));
    assert!(!complete(&w, "billing", id, token), "a second complete writes nothing");
    assert!(!complete(&w, "billing", "e3", "00000000-0000-4000-8000-000000000000"), "not the lease's token");
    assert_eq!(w.sql("SELECT handler || ':' || event_id FROM inbox.receipts").trim(), "billing:e1");

    // The three tables are partitioned by day, and the migration made today's and the
    // next two days' partitions of each (dedup by event id is the ingest's: see
    // inbox_retention.rs).
    let days = w.sql(
        "SELECT i.inhparent::regclass::text, count(*) FROM pg_inherits i \
         WHERE i.inhparent IN ('inbox.messages'::regclass, 'inbox.deliveries'::regclass, 'inbox.receipts'::regclass) \
         GROUP BY 1 ORDER BY 1",
    );
    assert_eq!(days.trim(), "inbox.deliveries|3\ninbox.messages|3\ninbox.receipts|3");
    let stats = w.sql("SELECT handler, backlog, review_required FROM inbox.handler_stats ORDER BY handler");
    assert_eq!(stats.trim(), "audit|4|0\nbilling|2|0");
    let err = w.try_sql("SELECT * FROM inbox.claim('nobody', 1, '1 second')").unwrap_err();
    assert!(err.contains("inbox handler \"nobody\" is not registered"), "{err}");
}

#[test]
fn inbox_an_expired_lease_passes_to_another_worker_and_the_late_complete_is_refused() {
    let w = inbox_world("inbox-lease");
    register(&w, "h", "'{}'", 5, "1 second", false);
    store(&w, &[("e1", "t", "a", "T")]);
    let first = claim(&w, "h", 1, "1 second");
    assert_eq!(ids(&first), ["e1"]);
    assert!(claim(&w, "h", 1, "1 second").is_empty(), "held by a live lease");
    std::thread::sleep(Duration::from_millis(1_300));
    let second = claim(&w, "h", 1, "30 seconds");
    assert_eq!(ids(&second), ["e1"], "the lease ran out: the message is offered again");
    assert_ne!(first[0].1, second[0].1, "with a new token");
    // The frozen worker wakes up: its complete (and so its writes, in the same
    // transaction) does not count.
    assert!(!complete(&w, "h", "e1", &first[0].1));
    assert!(complete(&w, "h", "e1", &second[0].1));
    assert_eq!(w.sql("SELECT count(*) FROM inbox.receipts").trim(), "1");
}

#[test]
fn inbox_failures_back_off_then_wait_for_review_and_retry_starts_over() {
    let w = inbox_world("inbox-fail");
    register(&w, "h", "'{}'", 3, "1 hour", false);
    store(&w, &[("e1", "t", "a", "T")]);
    let fail = |token: &str, code: &str| w.sql(&format!("SELECT inbox.fail('h', 'e1', '{token}', '{code}')"));
    let due_now = || w.sql("UPDATE inbox.deliveries SET next_attempt_at = now() WHERE event_id = 'e1'");
    let next_attempt_in = |w: &World| -> f64 {
        w.sql("SELECT extract(epoch FROM next_attempt_at - now()) FROM inbox.deliveries WHERE event_id = 'e1'")
            .trim()
            .parse()
            .unwrap()
    };

    let c = claim(&w, "h", 1, "30 seconds");
    assert_eq!(fail(&c[0].1, "http_503").trim(), "pending");
    // Backoff: base * 2^0 = 1 hour, times a jitter of 0.5 to 1.
    let wait = next_attempt_in(&w);
    assert!((1_790.0..=3_600.0).contains(&wait), "first retry in {wait} s");
    assert!(claim(&w, "h", 1, "30 seconds").is_empty(), "not due before its backoff");
    assert_eq!(fail(&c[0].1, "http_503").trim(), "lease_lost", "the failed lease is gone");

    due_now();
    let c = claim(&w, "h", 1, "30 seconds");
    assert_eq!(c[0].2, 1, "one attempt so far");
    assert_eq!(fail(&c[0].1, "http_503").trim(), "pending");
    let wait = next_attempt_in(&w);
    assert!((3_590.0..=7_200.0).contains(&wait), "second retry in {wait} s (base * 2)");
    due_now();
    let c = claim(&w, "h", 1, "30 seconds");
    assert_eq!(fail(&c[0].1, "validation.bad_sku").trim(), "review_required", "after max_attempts");
    due_now();
    assert!(claim(&w, "h", 1, "30 seconds").is_empty(), "review_required is never offered");
    assert_eq!(
        w.sql("SELECT backlog, review_required FROM inbox.handler_stats").trim(),
        "0|1",
        "counted for the review alarm"
    );
    assert_eq!(
        w.sql("SELECT last_error_code FROM inbox.deliveries WHERE event_id = 'e1'").trim(),
        "validation.bad_sku"
    );

    assert_eq!(w.sql("SELECT inbox.retry('h', 'e1')").trim(), "t");
    assert_eq!(w.sql("SELECT inbox.retry('h', 'e1')").trim(), "f", "already pending");
    let c = claim(&w, "h", 1, "30 seconds");
    assert_eq!((ids(&c), c[0].2), (vec!["e1"], 0), "due at once, attempts reset");

    let err =
        w.try_sql(&format!("SELECT inbox.fail('h', 'e1', '{}', 'customer Jane Doe not found')", c[0].1)).unwrap_err();
    assert!(err.contains("an error code is a short code"), "{err}");
}

#[test]
fn inbox_an_ordered_handler_gets_one_aggregate_in_arrival_order() {
    let w = inbox_world("inbox-ordered");
    register(&w, "seq", "'{}'", 2, "1 hour", true);
    register(&w, "any", "'{}'", 2, "1 hour", false);
    store(&w, &[("a1", "t", "A", "T"), ("a2", "t", "A", "T"), ("b1", "t", "B", "T"), ("a3", "t", "A", "T")]);
    assert_eq!(ids(&claim(&w, "any", 10, "30 seconds")), ["a1", "a2", "b1", "a3"], "unordered: all at once");

    let c = claim(&w, "seq", 10, "30 seconds");
    assert_eq!(ids(&c), ["a1", "b1"], "one open message per aggregate");
    assert!(claim(&w, "seq", 10, "30 seconds").is_empty(), "a2 waits for a1");
    assert!(complete(&w, "seq", "a1", &c[0].1));
    let c = claim(&w, "seq", 10, "30 seconds");
    assert_eq!(ids(&c), ["a2"]);
    // A message waiting for review holds its aggregate back.
    w.sql("UPDATE inbox.handlers SET max_attempts = 1 WHERE name = 'seq'");
    assert_eq!(w.sql(&format!("SELECT inbox.fail('seq', 'a2', '{}', 'boom')", c[0].1)).trim(), "review_required");
    assert!(claim(&w, "seq", 10, "30 seconds").is_empty(), "a3 waits behind a2 in review");
    assert_eq!(w.sql("SELECT inbox.retry('seq', 'a2')").trim(), "t");
    assert_eq!(ids(&claim(&w, "seq", 10, "30 seconds")), ["a2"]);
}

/// Four workers share 200 messages: each completes in the transaction of its side
/// effect, so every message has exactly one effect and one receipt, however the claims
/// interleave.
#[test]
fn inbox_four_workers_share_the_work_and_each_effect_happens_once() {
    let w = inbox_world("inbox-workers");
    register(&w, "h", "'{}'", 5, "1 second", false);
    w.sql("CREATE TABLE effects (event_id text NOT NULL, worker int NOT NULL)");
    let rows: Vec<(String, String)> = (0..200).map(|i| (format!("e{i:03}"), format!("agg{}", i % 7))).collect();
    let refs: Vec<(&str, &str, &str, &str)> =
        rows.iter().map(|(id, agg)| (id.as_str(), "t", agg.as_str(), "T")).collect();
    store(&w, &refs);
    let w = &w;
    std::thread::scope(|s| {
        for worker in 0..4 {
            s.spawn(move || loop {
                let claimed = claim(w, "h", 5, "30 seconds");
                if claimed.is_empty() {
                    return;
                }
                for (id, token, _) in claimed {
                    // The side effect and the receipt in one statement, so one transaction.
                    w.sql(&format!(
                        "WITH c AS (SELECT inbox.complete('h', '{id}', '{token}') AS ok)
                         INSERT INTO effects SELECT '{id}', {worker} FROM c WHERE ok"
                    ));
                }
            });
        }
    });
    let counts = w.sql("SELECT count(*), count(DISTINCT event_id) FROM effects");
    assert_eq!(counts.trim(), "200|200", "one effect per message");
    assert_eq!(w.sql("SELECT count(*) FROM inbox.receipts").trim(), "200");
    let per_worker: BTreeMap<String, String> = w
        .sql("SELECT worker, count(*) FROM effects GROUP BY worker")
        .lines()
        .filter_map(|l| l.split_once('|').map(|(a, b)| (a.to_owned(), b.to_owned())))
        .collect();
    println!("effects per worker: {per_worker:?}");
    assert_eq!(w.sql("SELECT backlog FROM inbox.handler_stats").trim(), "0");
}

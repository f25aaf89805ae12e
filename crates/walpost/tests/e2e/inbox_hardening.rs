//! The inbox's SQL API under hostile or unlucky conditions, against a real PostgreSQL
//! (no Kafka): a worker that crashes on one message, rows deleted by hand and stored
//! again, workers of one handler acting for another, a role planting functions in
//! `public`, two producers with the same event ids, failures past any interval, an
//! aggregate id too long for an index.

use std::time::Duration;

use crate::support::World;

fn inbox_world(name: &str) -> World {
    let w = World::postgres_only(name);
    w.sql(&crate::support::inbox_migrations());
    w
}

/// Stores messages as the ingest does: (event id, topic, aggregate), of type `T`.
fn store(w: &World, rows: &[(&str, &str, &str)]) {
    let rows: Vec<(&str, &str, &str, &str)> =
        rows.iter().map(|(id, topic, aggregate)| (*id, *topic, *aggregate, "T")).collect();
    crate::inbox::store(w, &rows);
}

fn register(w: &World, name: &str, max_attempts: u32, ordered: bool) {
    w.sql(&format!(
        "SELECT inbox.register_handler('{name}', '{{}}', '{{}}', {max_attempts}, '1 millisecond', '1 millisecond', {ordered})"
    ));
}

/// `inbox.claim` as (event id, topic, lease token, attempts), in the order returned.
fn claim(w: &World, handler: &str, max_rows: u32, lease: &str) -> Vec<(String, String, String, u32)> {
    w.sql(&format!(
        "SELECT event_id, topic, lease_token, attempts FROM inbox.claim('{handler}', {max_rows}, '{lease}')"
    ))
    .lines()
    .filter(|l| !l.is_empty())
    .map(|l| {
        let f: Vec<&str> = l.split('|').collect();
        (f[0].to_owned(), f[1].to_owned(), f[2].to_owned(), f[3].parse().unwrap())
    })
    .collect()
}

fn complete(w: &World, handler: &str, event_id: &str, token: &str) -> bool {
    w.sql(&format!("SELECT inbox.complete('{handler}', '{event_id}', '{token}')")).trim() == "t"
}

fn delivery(w: &World, handler: &str, event_id: &str) -> String {
    w.sql(&format!(
        "SELECT state || '|' || attempts || '|' || coalesce(last_error_code, '') FROM inbox.deliveries \
         WHERE handler = '{handler}' AND event_id = '{event_id}'"
    ))
    .trim()
    .to_owned()
}

/// A worker that handles its claimed messages one by one and dies (without complete or
/// fail) when it reaches `poison`: the poison message reaches review_required after
/// max_attempts, charged once per crash, and the messages claimed with it are done,
/// never charged. A pending message can be dismissed.
#[test]
fn inbox_a_message_that_crashes_its_worker_reaches_review_and_spares_its_batch() {
    let w = inbox_world("inbox-crash");
    register(&w, "h", 3, false);
    store(&w, &[("e1", "t", "a"), ("poison", "t", "b"), ("e3", "t", "c"), ("e4", "t", "d")]);
    let mut crashes = 0;
    for _ in 0..20 {
        let claimed = claim(&w, "h", 10, "200 milliseconds");
        if claimed.is_empty() && w.sql("SELECT count(*) FROM inbox.deliveries WHERE state = 'pending'").trim() == "0" {
            break;
        }
        for (id, _, token, _) in &claimed {
            if id == "poison" {
                crashes += 1;
                break; // the worker process dies here: no complete, no fail
            }
            assert!(complete(&w, "h", id, token), "{id}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(delivery(&w, "h", "poison"), "review_required|3|lease_expired", "crashes: {crashes}");
    for id in ["e1", "e3", "e4"] {
        assert_eq!(delivery(&w, "h", id), "done|0|", "{id} was claimed with the poison message, never charged");
    }
    assert_eq!(crashes, 4, "the first crash (a batch of three) charges nobody; then three crashes alone");
    let lost: i64 = w.sql("SELECT leases_lost FROM inbox.handlers WHERE name = 'h'").trim().parse().unwrap();
    assert!(lost >= 4, "leases lost: {lost}");

    // Setting a pending message aside: dismiss acts on it, and a worker holding its lease
    // gets false from complete.
    store(&w, &[("e5", "t", "e")]);
    let held = claim(&w, "h", 1, "1 hour");
    assert_eq!(held.len(), 1);
    assert_eq!(w.sql("SELECT inbox.dismiss('h', 'e5')").trim(), "t");
    assert!(!complete(&w, "h", "e5", &held[0].2), "the dismissed message's lease is gone");
    assert_eq!(delivery(&w, "h", "e5"), "dismissed|0|");
}

/// Rows deleted by mistake, then stored again (the inbox-replay runbook): the open
/// deliveries follow the message again and keep their place, so an ordered handler acts
/// on the aggregate in its first order; while a message is missing its delivery is set
/// aside (never leased blind) and holds its aggregate back.
#[test]
fn inbox_a_message_stored_again_takes_back_its_open_deliveries_in_order() {
    let w = inbox_world("inbox-orphans");
    register(&w, "ordered", 5, true);
    register(&w, "any", 5, false);
    store(&w, &[("e1", "t", "a"), ("e2", "t", "a"), ("e3", "t", "a"), ("x1", "t", "b")]);
    w.sql("DELETE FROM inbox.messages WHERE event_id IN ('e1', 'e2')");

    // The ordered handler: e1's message is gone, so it is set aside and a holds back.
    let got = claim(&w, "ordered", 10, "1 hour");
    assert_eq!(got.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["x1"], "{got:?}");
    assert_eq!(delivery(&w, "ordered", "e1"), "review_required|0|message_missing");
    let got = claim(&w, "any", 10, "1 hour");
    assert_eq!(got.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["e3", "x1"], "{got:?}");
    for (id, _, token, _) in &got {
        assert!(complete(&w, "any", id, token));
    }

    // Stored again, later (a replay reads them from Kafka): their deliveries follow.
    std::thread::sleep(Duration::from_millis(20));
    store(&w, &[("e1", "t", "a"), ("e2", "t", "a")]);
    let mut order = Vec::new();
    for _ in 0..5 {
        for (id, _, token, _) in claim(&w, "ordered", 10, "1 hour") {
            assert!(complete(&w, "ordered", &id, &token));
            order.push(id);
        }
    }
    assert_eq!(order, ["e1", "e2", "e3"], "aggregate a in its first order");
    let got = claim(&w, "any", 10, "1 hour");
    assert_eq!(got.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["e1", "e2"]);
    assert_eq!(w.sql("SELECT count(*) FROM inbox.receipts WHERE handler = 'any' AND event_id = 'e3'").trim(), "1");
    let orphans = w.sql(
        "SELECT count(*) FROM inbox.deliveries d WHERE d.state IN ('pending', 'review_required') \
         AND NOT EXISTS (SELECT FROM inbox.messages m \
         WHERE m.event_id = d.event_id AND m.topic = d.topic AND m.received_at = d.received_at)",
    );
    assert_eq!(orphans.trim(), "0", "every open delivery points at a stored message");
}

/// Two producers' outboxes both have event 42: two messages, one per topic, each with its
/// own delivery and receipt.
#[test]
fn inbox_the_same_event_id_in_two_topics_is_two_messages() {
    let w = inbox_world("inbox-two-sources");
    register(&w, "h", 5, false);
    store(&w, &[("42", "outbox.event.orders", "a"), ("42", "outbox.event.payments", "b")]);
    let got = claim(&w, "h", 10, "1 hour");
    let topics: Vec<&str> = got.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(topics, ["outbox.event.orders", "outbox.event.payments"]);
    for (id, _, token, _) in &got {
        assert!(complete(&w, "h", id, token));
    }
    assert_eq!(
        w.sql("SELECT string_agg(topic, ',' ORDER BY topic) FROM inbox.receipts").trim(),
        "outbox.event.orders,outbox.event.payments"
    );
}

/// inbox.fail past 50 attempts: the backoff is computed in seconds and capped, so the
/// 100th failure is recorded (review_required), never "interval out of range".
#[test]
fn inbox_fail_counts_every_attempt_up_to_a_bounded_max_attempts() {
    let w = inbox_world("inbox-fail-100");
    w.sql("SELECT inbox.register_handler('h', '{}', '{}', 100, '1 hour', '1 day', false)");
    store(&w, &[("e1", "t", "a")]);
    for attempt in 1..=100 {
        w.sql("UPDATE inbox.deliveries SET next_attempt_at = now() WHERE event_id = 'e1'");
        let got = claim(&w, "h", 1, "1 hour");
        assert_eq!(got.len(), 1, "attempt {attempt}");
        let state = w.sql(&format!("SELECT inbox.fail('h', 'e1', '{}', 'boom')", got[0].2));
        let want = if attempt == 100 { "review_required" } else { "pending" };
        assert_eq!(state.trim(), want, "attempt {attempt}");
    }
    assert_eq!(delivery(&w, "h", "e1"), "review_required|100|boom");
    let err =
        w.try_sql("SELECT inbox.register_handler('h2', '{}', '{}', 1001, '1 second', '1 day', false)").unwrap_err();
    assert!(err.contains("max_attempts must be between 1 and 1000"), "{err}");
}

/// An aggregate id of 3,000 bytes (over a btree row's 2,704) is indexed by its hash:
/// stored, delivered and ordered like any other.
#[test]
fn inbox_an_aggregate_id_too_long_for_an_index_is_delivered_in_order() {
    let w = inbox_world("inbox-long-aggregate");
    register(&w, "h", 5, true);
    let long = "a".repeat(3_000);
    store(&w, &[("e1", "t", &long), ("e2", "t", &long)]);
    let first = claim(&w, "h", 10, "1 hour");
    assert_eq!(first.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["e1"], "one aggregate, one at a time");
    assert!(complete(&w, "h", "e1", &first[0].2));
    assert_eq!(claim(&w, "h", 10, "1 hour")[0].0, "e2");
}

/// Workers act only for the handlers their role was granted; registering and granting
/// are the owner's; workers need no grant on the tables and cannot read them.
#[test]
fn inbox_a_worker_acts_only_for_the_handlers_its_role_was_granted() {
    let w = inbox_world("inbox-grants");
    register(&w, "pay", 5, false);
    register(&w, "billing", 5, false);
    store(&w, &[("e1", "t", "a")]);
    let worker = format!("{}_pay", w.role);
    w.sql(&format!(
        "CREATE ROLE {worker} LOGIN;
         GRANT USAGE ON SCHEMA inbox TO {worker};
         GRANT EXECUTE ON FUNCTION inbox.claim(text, integer, interval), inbox.complete(text, text, uuid),
             inbox.fail(text, text, uuid, text), inbox.extend(text, text, uuid, interval) TO {worker};
         SELECT inbox.grant_handler('pay', '{worker}');"
    ));
    let as_worker = |sql: &str| w.pg.psql_as(&worker, &w.db, sql).map_err(|e| e.to_string());
    let got = as_worker("SELECT event_id || '|' || lease_token FROM inbox.claim('pay', 10, '1 hour')").unwrap();
    let (id, token) = got.trim().split_once('|').unwrap();
    assert_eq!(id, "e1");
    assert_eq!(as_worker(&format!("SELECT inbox.extend('pay', 'e1', '{token}', '2 hours')")).unwrap().trim(), "t");
    assert_eq!(as_worker(&format!("SELECT inbox.complete('pay', 'e1', '{token}')")).unwrap().trim(), "t");

    let refused = as_worker("SELECT * FROM inbox.claim('billing', 10, '1 hour')").unwrap_err();
    assert!(
        refused.contains(&format!("role \"{worker}\" may not call inbox.claim for inbox handler \"billing\"")),
        "{refused}"
    );
    let billing = w.sql("SELECT lease_token FROM inbox.claim('billing', 1, '1 hour')");
    let refused = as_worker(&format!("SELECT inbox.complete('billing', 'e1', '{}')", billing.trim())).unwrap_err();
    assert!(refused.contains("may not call inbox.complete"), "{refused}");
    for sql in [
        "SELECT inbox.register_handler('pay', '{}', '{}', 1, '1 second', '1 second', false)".to_owned(),
        format!("SELECT inbox.grant_handler('billing', '{worker}')"),
        "SELECT inbox.retry('billing', 'e1')".into(),
        "SELECT count(*) FROM inbox.messages".into(),
        "SELECT count(*) FROM inbox.deliveries".into(),
        "UPDATE inbox.handlers SET max_attempts = 1".into(),
    ] {
        let e = as_worker(&sql).unwrap_err();
        assert!(e.contains("permission denied") || e.contains("may not call"), "{sql}: {e}");
    }
    assert_eq!(
        w.sql("SELECT state FROM inbox.deliveries WHERE handler = 'billing'").trim(),
        "pending",
        "billing's message untouched by pay's worker"
    );
    assert_eq!(w.sql(&format!("SELECT inbox.revoke_handler('pay', '{worker}')")).trim(), "t");
    assert!(as_worker("SELECT * FROM inbox.claim('pay', 10, '1 hour')").unwrap_err().contains("may not call"));
}

/// A role with CREATE on `public` (PostgreSQL 14's default) plants functions that shadow
/// built-ins the inbox's SQL calls, with exact argument types so they would win over
/// pg_catalog's polymorphic ones; sessions whose search_path holds `public` (the default)
/// then store messages, register handlers and work them: nothing planted runs.
#[test]
fn inbox_functions_planted_in_public_never_run_as_the_inbox() {
    let w = World::postgres_only("inbox-search-path");
    let mallory = format!("{}_mallory", w.role);
    w.sql(&format!(
        "CREATE ROLE {mallory} LOGIN;
         GRANT CREATE ON SCHEMA public TO {mallory};
         CREATE TABLE public.planted_ran (f text);
         GRANT INSERT ON public.planted_ran TO {mallory};"
    ));
    // Planted before the migration runs (applied by hand with psql, as the docs allow) and
    // before any function is called.
    w.pg.psql_as(
        &mallory,
        &w.db,
        "CREATE FUNCTION public.cardinality(text[]) RETURNS integer LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO public.planted_ran VALUES ('cardinality'); RETURN 0; END $$;
         CREATE FUNCTION public.to_char(date, text) RETURNS text LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO public.planted_ran VALUES ('to_char'); RETURN '19700101'; END $$;
         CREATE FUNCTION public.octet_length(text) RETURNS integer LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO public.planted_ran VALUES ('octet_length'); RETURN 0; END $$;
         CREATE FUNCTION public.random() RETURNS double precision LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO public.planted_ran VALUES ('random'); RETURN 0; END $$;
         CREATE FUNCTION public.gen_random_uuid() RETURNS uuid LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO public.planted_ran VALUES ('gen_random_uuid'); RETURN '00000000-0000-4000-8000-000000000000'; END $$;",
    )
    .unwrap();
    w.sql(&crate::support::inbox_migrations());
    w.sql("SELECT inbox.register_handler('h', '{t}', '{}', 2, '1 second', '1 minute', true)");
    store(&w, &[("e1", "t", "a"), ("e2", "t", "b")]);
    let got = claim(&w, "h", 10, "1 hour");
    assert_eq!(got.len(), 2);
    w.sql(&format!("SELECT inbox.fail('h', 'e1', '{}', 'boom')", got[0].2));
    assert!(complete(&w, "h", "e2", &got[1].2));
    let ran = w.sql("SELECT coalesce(string_agg(DISTINCT f, ','), '') FROM public.planted_ran");
    assert_eq!(ran.trim(), "", "planted functions ran as the inbox's caller");
}

/// Every aggregate of `handler` with an open delivery has exactly one head, its earliest
/// open delivery, and a heads row with that seq; no other delivery is a head. "" when so,
/// else the aggregates that are not.
fn heads_out_of_step(w: &World, handler: &str) -> String {
    w.sql(&format!(
        "WITH firsts AS (
             SELECT aggregate_id, min(seq) AS seq FROM inbox.deliveries
             WHERE handler = '{handler}' AND state IN ('pending', 'review_required') GROUP BY aggregate_id)
         SELECT coalesce(string_agg(DISTINCT aggregate_id, ','), '') FROM (
             SELECT d.aggregate_id FROM inbox.deliveries d JOIN firsts f USING (aggregate_id)
             WHERE d.handler = '{handler}' AND d.state IN ('pending', 'review_required') AND d.head <> (d.seq = f.seq)
             UNION ALL
             SELECT f.aggregate_id FROM firsts f
             WHERE NOT EXISTS (SELECT FROM inbox.heads x
                               WHERE x.handler = '{handler}' AND x.aggregate_id = f.aggregate_id AND x.seq = f.seq)
             UNION ALL
             SELECT x.aggregate_id FROM inbox.heads x
             WHERE x.handler = '{handler}' AND NOT EXISTS (SELECT FROM firsts f WHERE f.aggregate_id = x.aggregate_id)
         ) wrong"
    ))
    .trim()
    .to_owned()
}

/// Stores messages `m<first>`..`m<last>` of topic `t` in one statement (one batch of the
/// ingest), message `m<g>` of aggregate `agg<g % aggregates>`.
fn store_range(w: &World, first: u32, last: u32, aggregates: u32) {
    w.sql(&format!(
        "INSERT INTO inbox.messages (event_id, topic, \"partition\", \"offset\", payload, event_type, aggregate_id)
         SELECT 'm' || g, 't', 0, g, convert_to('{{}}', 'UTF8'), 'T', 'agg' || (g % {aggregates})
         FROM generate_series({first}, {last}) g"
    ));
}

fn ids_of(claimed: &[(String, String, String, u32)]) -> Vec<String> {
    claimed.iter().map(|c| c.0.clone()).collect()
}

fn m(range: std::ops::Range<u32>) -> Vec<String> {
    range.map(|g| format!("m{g}")).collect()
}

/// With a backlog of many aggregates, an ordered claim is offered each aggregate's earliest
/// open message and nothing behind it: the heads, one per aggregate, are what its index
/// holds (so a claim reads the heads, not the backlog; its time is bench/inbox-sql.sh's).
/// Completing, dismissing and storing more hand each aggregate on to its next message, in
/// arrival order; a plain handler of the same messages has no heads and gets them all.
#[test]
fn inbox_an_ordered_claim_offers_each_aggregates_earliest_open_message_only() {
    let w = inbox_world("inbox-heads");
    register(&w, "o", 5, true);
    register(&w, "p", 5, false);
    // 200 aggregates, 40 messages each, in two batches of the ingest.
    store_range(&w, 0, 3_999, 200);
    store_range(&w, 4_000, 7_999, 200);
    assert_eq!(heads_out_of_step(&w, "o"), "");
    let indexed = "SELECT count(*) FROM inbox.deliveries WHERE handler = 'o' AND state = 'pending' AND head";
    assert_eq!(w.sql(indexed).trim(), "200", "one head per aggregate in deliveries_heads, not 8,000 rows");
    assert_eq!(w.sql("SELECT count(*) FROM inbox.deliveries WHERE handler = 'p' AND head").trim(), "0");

    // Four claims of 50: the 200 heads, m0..m199, in arrival order; then nothing, with
    // 7,800 messages behind leased heads.
    let mut held = Vec::new();
    for k in 0..4 {
        let got = claim(&w, "o", 50, "1 hour");
        assert_eq!(ids_of(&got), m(k * 50..k * 50 + 50), "claim {k}");
        held.extend(got);
    }
    assert!(claim(&w, "o", 50, "1 hour").is_empty(), "every aggregate's head is leased");
    assert_eq!(claim(&w, "p", 1_000, "1 hour").len(), 1_000, "a plain handler is offered the backlog");

    // The first 50 complete in one batch: their aggregates' second messages come next.
    let (ids, tokens): (Vec<&str>, Vec<&str>) = held[..50].iter().map(|c| (c.0.as_str(), c.2.as_str())).unzip();
    let done = w.sql(&format!(
        "SELECT cardinality(inbox.complete_many('o', ARRAY['{}'], ARRAY['{}']::uuid[]))",
        ids.join("','"),
        tokens.join("','")
    ));
    assert_eq!(done.trim(), "50");
    assert_eq!(ids_of(&claim(&w, "o", 100, "1 hour")), m(200..250));
    // m50 is dismissed while leased (the decision not to handle it): agg50 goes on with m250.
    assert_eq!(w.sql("SELECT inbox.dismiss('o', 'm50')").trim(), "t");
    assert_eq!(ids_of(&claim(&w, "o", 100, "1 hour")), ["m250"]);
    // m51 fails for good (max_attempts 5): it holds agg51 back until it is retried.
    for attempt in 1..=5 {
        let token = if attempt == 1 {
            held[51].2.clone()
        } else {
            std::thread::sleep(Duration::from_millis(5));
            let got = claim(&w, "o", 100, "1 hour");
            assert_eq!(ids_of(&got), ["m51"], "attempt {attempt}");
            got[0].2.clone()
        };
        w.sql(&format!("SELECT inbox.fail('o', 'm51', '{token}', 'boom')"));
    }
    assert_eq!(delivery(&w, "o", "m51"), "review_required|5|boom");
    assert!(claim(&w, "o", 100, "1 hour").is_empty(), "m251 waits behind m51");

    // Stored later: a new aggregate's first message is its head at once; agg0's new
    // message waits behind m200 (leased).
    w.sql(
        "INSERT INTO inbox.messages (event_id, topic, \"partition\", \"offset\", payload, event_type, aggregate_id)
         VALUES ('n1', 't', 0, 1, convert_to('{}', 'UTF8'), 'T', 'agg0'),
                ('n2', 't', 0, 2, convert_to('{}', 'UTF8'), 'T', 'fresh'),
                ('n3', 't', 0, 3, convert_to('{}', 'UTF8'), 'T', 'fresh')",
    );
    assert_eq!(ids_of(&claim(&w, "o", 100, "1 hour")), ["n2"]);
    assert_eq!(heads_out_of_step(&w, "o"), "");

    // The ordering changed: a plain handler has no heads and is offered everything due; an
    // ordered one again has them, rebuilt.
    w.sql("SELECT inbox.register_handler('o', '{}', '{}', 5, '1 millisecond', '1 millisecond', false)");
    let open_heads = "SELECT count(*) FROM inbox.deliveries WHERE handler = 'o' AND head AND state IN ('pending', 'review_required')";
    assert_eq!(w.sql(open_heads).trim(), "0");
    assert_eq!(w.sql("SELECT count(*) FROM inbox.heads WHERE handler = 'o'").trim(), "0");
    w.sql("SELECT inbox.register_handler('o', '{}', '{}', 5, '1 millisecond', '1 millisecond', true)");
    assert_eq!(heads_out_of_step(&w, "o"), "");
    assert_eq!(w.sql("SELECT inbox.retry('o', 'm51')").trim(), "t");
    assert_eq!(ids_of(&claim(&w, "o", 100, "1 hour")), ["m51"], "the others' heads are still leased");
}

/// An inbox at 0003 with an ordered handler's backlog, one head leased and one done:
/// 0004 builds the heads, and the handler goes on in arrival order.
#[test]
fn inbox_heads_are_built_for_an_inbox_migrated_before_them() {
    let w = World::postgres_only("inbox-heads-upgrade");
    let files = |names: &[&str]| -> String {
        names
            .iter()
            .map(|f| {
                std::fs::read_to_string(format!("{}/../../migrations/inbox/{f}", env!("CARGO_MANIFEST_DIR"))).unwrap()
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    w.sql(&format!(
        "CREATE SCHEMA inbox; SET search_path = inbox, pg_temp;\n{}\nRESET search_path;",
        files(&["0001_inbox.sql", "0002_inbox_hardening.sql", "0003_inbox_batches.sql"])
    ));
    register(&w, "o", 5, true);
    store(&w, &[("a1", "t", "a"), ("a2", "t", "a"), ("b1", "t", "b"), ("b2", "t", "b"), ("c1", "t", "c")]);
    let got = claim(&w, "o", 2, "1 hour");
    assert_eq!(ids_of(&got), ["a1", "b1"]);
    assert!(complete(&w, "o", "a1", &got[0].2));

    w.sql(&format!("SET search_path = inbox, pg_temp;\n{}", files(&["0004_inbox_heads.sql"])));
    assert_eq!(heads_out_of_step(&w, "o"), "");
    assert_eq!(ids_of(&claim(&w, "o", 10, "1 hour")), ["a2", "c1"], "b2 waits behind b1 (leased)");
    assert!(complete(&w, "o", "b1", &got[1].2));
    assert_eq!(ids_of(&claim(&w, "o", 10, "1 hour")), ["b2"]);
}

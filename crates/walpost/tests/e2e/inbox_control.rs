//! The inbox's operator calls (migrations/inbox/0005_inbox_control.sql) against a real
//! PostgreSQL and no Kafka: a paused handler's claim offers nothing, ordered or not, and
//! resuming gives its messages back; the review queue grouped by error code; retry and
//! dismiss in bulk change exactly the messages in review_required that were selected, and
//! an ordered handler's heads stay what inbox.repair_heads would make them; selections
//! over 10,000 ids refused; and the Rust calls of `inbox::control`, as the owner and as a
//! role granted as docs/inbox.md says.

use ::inbox::control::{self, AuditRow, ControlError, Selection};
use replication::ReplicationClient;

use crate::support::{World, APP_PASSWORD};

fn inbox_world(name: &str) -> World {
    let w = World::postgres_only(name);
    w.sql(&crate::support::inbox_migrations());
    w
}

fn register(w: &World, name: &str, max_attempts: u32, ordered: bool) {
    w.sql(&format!(
        "SELECT inbox.register_handler('{name}', '{{}}', '{{}}', {max_attempts}, '1 second', '1 minute', {ordered})"
    ));
}

/// Stores messages (event id, aggregate id), in that order.
fn store(w: &World, rows: &[(&str, &str)]) {
    let rows: Vec<(&str, &str, &str, &str)> = rows.iter().map(|(id, agg)| (*id, "t", *agg, "T")).collect();
    crate::inbox::store(w, &rows);
}

/// `inbox.claim` as (event id, lease token), in the order returned.
fn claim(w: &World, handler: &str) -> Vec<(String, String)> {
    w.sql(&format!("SELECT event_id, lease_token FROM inbox.claim('{handler}', 100, '1 hour')"))
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (id, token) = l.split_once('|').unwrap();
            (id.to_owned(), token.to_owned())
        })
        .collect()
}

fn ids(claimed: &[(String, String)]) -> Vec<&str> {
    claimed.iter().map(|(id, _)| id.as_str()).collect()
}

/// Fails every claimed message with the error code its id maps to (max_attempts 1: each
/// goes to review_required), completes those that map to None.
fn act(w: &World, handler: &str, claimed: &[(String, String)], code: impl Fn(&str) -> Option<&'static str>) {
    for (id, token) in claimed {
        match code(id) {
            Some(c) => assert_eq!(
                w.sql(&format!("SELECT inbox.fail('{handler}', '{id}', '{token}', '{c}')")),
                "review_required",
                "{id}"
            ),
            None => assert_eq!(w.sql(&format!("SELECT inbox.complete('{handler}', '{id}', '{token}')")), "t"),
        }
    }
}

fn state(w: &World, handler: &str, event_id: &str) -> String {
    w.sql(&format!(
        "SELECT state || '|' || attempts || '|' || coalesce(last_error_code, '') \
         FROM inbox.deliveries WHERE handler = '{handler}' AND event_id = '{event_id}'"
    ))
}

/// The ways `handler`'s heads differ from what inbox.repair_heads makes of its open
/// deliveries (0: none): a heads row per aggregate with an open delivery, at its earliest,
/// and the head flag on exactly those deliveries (and on those without an aggregate).
fn heads_wrong(w: &World, handler: &str) -> String {
    w.sql(&format!(
        "SELECT (SELECT count(*) FROM (
                   SELECT d.aggregate_id, min(d.seq) AS seq FROM inbox.deliveries d
                   WHERE d.handler = '{handler}' AND d.aggregate_id IS NOT NULL AND d.state NOT IN ('done', 'dismissed')
                   GROUP BY d.aggregate_id) f
                 FULL JOIN (SELECT aggregate_id, seq FROM inbox.heads WHERE handler = '{handler}') x USING (aggregate_id)
                 WHERE f.seq IS DISTINCT FROM x.seq)
              + (SELECT count(*) FROM inbox.deliveries d
                 WHERE d.handler = '{handler}' AND d.state NOT IN ('done', 'dismissed')
                   AND d.head <> (d.aggregate_id IS NULL OR coalesce(d.seq = (
                       SELECT x.seq FROM inbox.heads x WHERE x.handler = d.handler AND x.aggregate_id = d.aggregate_id), false)))"
    ))
}

/// A handler paused offers nothing, ordered or plain, and changes nothing when claimed
/// (not even a lease that ran out); registering it again, or applying the migrations
/// again, keeps it paused; resumed, it
/// offers its messages again. Pausing or resuming a handler that does not exist is false.
#[test]
fn inbox_control_a_paused_handler_is_offered_nothing_until_resumed() {
    let w = inbox_world("inbox-ctl-pause");
    register(&w, "plain", 5, false);
    register(&w, "ordered", 5, true);
    store(&w, &[("e1", "a"), ("e2", "b"), ("e3", "a")]);

    // A lease that ran out, for the claim after resume to take back.
    assert_eq!(ids(&claim(&w, "plain")), ["e1", "e2", "e3"]);
    w.sql("UPDATE inbox.deliveries SET lease_until = now() - interval '1 second' WHERE handler = 'plain' AND event_id = 'e1'");

    for h in ["plain", "ordered"] {
        assert_eq!(w.sql(&format!("SELECT inbox.pause_handler('{h}')")), "t");
        assert_eq!(w.sql(&format!("SELECT inbox.pause_handler('{h}')")), "t", "pausing twice is no error");
    }
    let before = w.sql("SELECT string_agg(handler || event_id || state || coalesce(lease_until::text, '-'), ',' ORDER BY handler, event_id) FROM inbox.deliveries");
    assert_eq!(claim(&w, "plain"), Vec::<(String, String)>::new());
    assert_eq!(claim(&w, "ordered"), Vec::<(String, String)>::new());
    let after = w.sql("SELECT string_agg(handler || event_id || state || coalesce(lease_until::text, '-'), ',' ORDER BY handler, event_id) FROM inbox.deliveries");
    assert_eq!(before, after, "a paused claim writes nothing");
    assert_eq!(w.sql("SELECT leases_lost FROM inbox.handlers WHERE name = 'plain'"), "0");
    assert_eq!(
        w.sql("SELECT handler || ':' || paused FROM inbox.handler_overview ORDER BY handler"),
        "ordered:true\nplain:true"
    );

    // The owner registering it again (new settings) does not resume it, nor does applying
    // every file again (they are idempotent; the claim of 0005 is the one in place).
    register(&w, "ordered", 7, true);
    w.sql(&crate::support::inbox_migrations());
    assert_eq!(claim(&w, "ordered"), Vec::<(String, String)>::new());
    assert_eq!(claim(&w, "plain"), Vec::<(String, String)>::new());

    assert_eq!(w.sql("SELECT inbox.pause_handler('nobody')"), "f");
    assert_eq!(w.sql("SELECT inbox.resume_handler('nobody')"), "f");

    for h in ["plain", "ordered"] {
        assert_eq!(w.sql(&format!("SELECT inbox.resume_handler('{h}')")), "t");
    }
    assert_eq!(ids(&claim(&w, "plain")), ["e1"], "the lease that ran out is taken back, alone");
    assert_eq!(w.sql("SELECT leases_lost FROM inbox.handlers WHERE name = 'plain'"), "1");
    assert_eq!(ids(&claim(&w, "ordered")), ["e1", "e2"], "each aggregate's head");
    assert_eq!(
        w.sql("SELECT string_agg(handler || ':' || paused, ',' ORDER BY handler) FROM inbox.handler_overview"),
        "ordered:false,plain:false"
    );
}

/// The review queue grouped by error code, largest first, with its arrival times and a
/// sample of at most 10 ids; the listing without payload; retry_by_error and dismiss_many
/// change exactly the messages in review_required selected and return their count.
#[test]
fn inbox_control_review_groups_and_bulk_retry_and_dismiss() {
    let w = inbox_world("inbox-ctl-review");
    register(&w, "h", 1, false);
    let many: Vec<String> = (1..=12).map(|i| format!("m{i:02}")).collect();
    let mut rows: Vec<(&str, &str)> = many.iter().map(|id| (id.as_str(), "")).collect();
    rows.extend([("b1", ""), ("b2", ""), ("d1", "")]);
    store(&w, &rows);
    let claimed = claim(&w, "h");
    assert_eq!(claimed.len(), 15);
    act(&w, "h", &claimed, |id| match id.chars().next() {
        Some('m') => Some("http_503"),
        Some('b') => Some("validation.bad_sku"),
        _ => None,
    });

    let groups = w.sql(
        "SELECT error_code || '|' || count || '|' || (first_at <= last_at) || '|' || array_to_string(sample_event_ids, ',')
         FROM inbox.review_groups('h')",
    );
    assert_eq!(
        groups, "http_503|12|true|m01,m02,m03,m04,m05,m06,m07,m08,m09,m10\nvalidation.bad_sku|2|true|b1,b2",
        "largest first, the 10 oldest ids"
    );
    let first_last = w.sql(
        "SELECT (g.first_at = (SELECT min(received_at) FROM inbox.messages WHERE event_id LIKE 'm%'))
             AND (g.last_at = (SELECT max(received_at) FROM inbox.messages WHERE event_id LIKE 'm%'))
         FROM inbox.review_groups('h') g WHERE g.error_code = 'http_503'",
    );
    assert_eq!(first_last, "t");
    assert_eq!(
        w.sql("SELECT event_id || '|' || topic || '|' || \"partition\" || '|' || \"offset\" || '|' || event_type || '|' || attempts || '|' || last_error_code
               FROM inbox.review_messages('h', 'validation.bad_sku')"),
        "b1|t|0|12|T|1|validation.bad_sku\nb2|t|0|13|T|1|validation.bad_sku"
    );
    assert_eq!(w.sql("SELECT count(*) FROM inbox.review_messages('h')"), "14");
    assert_eq!(w.sql("SELECT string_agg(event_id, ',') FROM inbox.review_messages('h', NULL, 2)"), "m01,m02");
    let columns = w.sql(
        "SELECT string_agg(parameter_name, ',' ORDER BY ordinal_position) FROM information_schema.parameters p
         JOIN information_schema.routines r USING (specific_schema, specific_name)
         WHERE r.routine_schema = 'inbox' AND r.routine_name = 'review_messages' AND p.parameter_mode = 'OUT'",
    );
    assert!(!columns.contains("payload"), "{columns}");

    assert_eq!(w.sql("SELECT inbox.retry_by_error('h', 'http_503')"), "12");
    assert_eq!(w.sql("SELECT inbox.retry_by_error('h', 'http_503')"), "0", "none left in review");
    for id in &many {
        assert_eq!(state(&w, "h", id), "pending|0|", "{id}");
    }
    assert_eq!(state(&w, "h", "b1"), "review_required|1|validation.bad_sku");
    assert_eq!(ids(&claim(&w, "h")), many.iter().map(String::as_str).collect::<Vec<_>>(), "due now");

    // b1 in review, d1 done, m01 leased (pending), one id unknown: only b1 changes.
    assert_eq!(w.sql("SELECT inbox.dismiss_many('h', ARRAY['b1', 'd1', 'm01', 'nope'])"), "1");
    assert_eq!(state(&w, "h", "b1"), "dismissed|1|validation.bad_sku");
    assert_eq!(state(&w, "h", "d1"), "done|0|");
    assert_eq!(state(&w, "h", "m01"), "pending|0|");
    assert_eq!(w.sql("SELECT inbox.retry_many('h', ARRAY['b1', 'd1', 'm01'])"), "0", "nothing there in review");
    assert_eq!(
        w.sql("SELECT error_code || '|' || count || '|' || array_to_string(sample_event_ids, ',') FROM inbox.review_groups('h')"),
        "validation.bad_sku|1|b2"
    );
    assert_eq!(w.sql("SELECT inbox.retry_many('h', ARRAY['b2', 'b2'])"), "1", "an id given twice acts once");
    assert_eq!(w.sql("SELECT count(*) FROM inbox.review_groups('h')"), "0");
    assert_eq!(w.sql("SELECT inbox.dismiss_by_error('h', 'validation.bad_sku')"), "0");
    assert_eq!(
        w.sql("SELECT backlog || '|' || leased || '|' || review_required || '|' || paused FROM inbox.handler_overview"),
        "13|12|0|false"
    );
}

/// An ordered handler: a head in review holds its aggregate back; dismissed in bulk, the
/// aggregate's next message is its head and is claimable, at once; retried in bulk, the
/// head itself is claimed again and the messages behind it wait. The heads stay what
/// repair_heads would make them at every step.
#[test]
fn inbox_control_an_ordered_handlers_heads_hold_after_bulk_actions() {
    let w = inbox_world("inbox-ctl-heads");
    register(&w, "o", 1, true);
    store(&w, &[("a1", "A"), ("b1", "B"), ("a2", "A"), ("b2", "B"), ("a3", "A"), ("c1", "C")]);
    let first = claim(&w, "o");
    assert_eq!(ids(&first), ["a1", "b1", "c1"]);
    act(&w, "o", &first, |id| if id == "c1" { None } else { Some("x") });
    assert_eq!(claim(&w, "o"), Vec::<(String, String)>::new(), "the heads in review hold their aggregates");
    assert_eq!(heads_wrong(&w, "o"), "0");

    assert_eq!(w.sql("SELECT inbox.dismiss_many('o', ARRAY['a1'])"), "1");
    assert_eq!(heads_wrong(&w, "o"), "0");
    let next = claim(&w, "o");
    assert_eq!(ids(&next), ["a2"], "A's next message, not B's (b1 is in review)");
    act(&w, "o", &next, |_| Some("y"));

    assert_eq!(w.sql("SELECT inbox.retry_by_error('o', 'x')"), "1");
    assert_eq!(heads_wrong(&w, "o"), "0");
    let retried = claim(&w, "o");
    assert_eq!(ids(&retried), ["b1"], "b1 again, b2 waits behind it; a2 is in review");
    assert_eq!(claim(&w, "o"), Vec::<(String, String)>::new());
    act(&w, "o", &retried, |_| None);
    assert_eq!(heads_wrong(&w, "o"), "0");
    assert_eq!(ids(&claim(&w, "o")), ["b2"]);

    // Dismissed by error code, a head hands its aggregate on as dismiss_many does.
    assert_eq!(w.sql("SELECT inbox.dismiss_by_error('o', 'y')"), "1");
    assert_eq!(heads_wrong(&w, "o"), "0");
    assert_eq!(ids(&claim(&w, "o")), ["a3"]);
    assert_eq!(heads_wrong(&w, "o"), "0");
}

/// More than 10,000 ids, a NULL id, a sentence for an error code, max_rows out of bounds:
/// refused, with nothing changed; exactly 10,000 ids is a call like any other.
#[test]
fn inbox_control_refuses_more_than_10000_ids_and_bad_input() {
    let w = inbox_world("inbox-ctl-bounds");
    register(&w, "h", 1, false);
    store(&w, &[("e1", "")]);
    act(&w, "h", &claim(&w, "h"), |_| Some("x"));
    let ids = |n: u32| format!("ARRAY(SELECT 'e' || g FROM generate_series(1, {n}) g)");
    for f in ["retry_many", "dismiss_many"] {
        let e = w.try_sql(&format!("SELECT inbox.{f}('h', {})", ids(10_001))).unwrap_err();
        assert!(e.contains(&format!("inbox.{f}: at most 10000 event ids a call (event_ids has 10001)")), "{e}");
        let e = w.try_sql(&format!("SELECT inbox.{f}('h', ARRAY['e1', NULL])")).unwrap_err();
        assert!(e.contains(&format!("inbox.{f}: event_ids[2] is NULL")), "{e}");
    }
    for f in ["retry_by_error", "dismiss_by_error"] {
        let e = w.try_sql(&format!("SELECT inbox.{f}('h', 'the customer''s card was declined')")).unwrap_err();
        assert!(e.contains(&format!("inbox.{f}: an error code is a short code")), "{e}");
        assert!(!e.contains("declined"), "the refused code is not quoted back: {e}");
    }
    for bad in ["0", "10001", "NULL"] {
        let e = w.try_sql(&format!("SELECT * FROM inbox.review_messages('h', NULL, {bad})")).unwrap_err();
        assert!(e.contains("max_rows is between 1 and 10000"), "{e}");
    }
    assert_eq!(state(&w, "h", "e1"), "review_required|1|x", "nothing changed");
    assert_eq!(w.sql(&format!("SELECT inbox.retry_many('h', {})", ids(10_000))), "1", "10,000 ids, e1 among them");
    assert_eq!(w.sql("SELECT inbox.dismiss_many('h', NULL)"), "0", "a NULL array is an empty one");
}

async fn connect(url: &str) -> ReplicationClient {
    let config = replication::Config::parse(url).unwrap();
    ReplicationClient::connect_sql(&config).await.unwrap()
}

/// The Rust calls of `inbox::control`, once each, as the inbox's owner and as a role
/// granted what docs/inbox.md says an admin API's role needs; a role not granted the
/// handler is refused (42501); a selection over the bound is refused before sending.
#[test]
fn inbox_control_the_rust_calls_as_the_owner_and_as_a_granted_role() {
    let w = inbox_world("inbox-ctl-rust");
    register(&w, "h", 1, false);
    register(&w, "other", 1, false);
    store(&w, &[("e1", ""), ("e2", ""), ("e3", ""), ("e4", "")]);
    act(&w, "h", &claim(&w, "h"), |id| match id {
        "e1" | "e2" => Some("http_503"),
        "e3" => Some("bad_sku"),
        _ => None,
    });
    // The grants of docs/inbox.md, "Roles and grants", for the admin API's role.
    w.sql(&format!(
        "CREATE ROLE ctl_admin LOGIN PASSWORD '{APP_PASSWORD}';
         CREATE ROLE ctl_stranger LOGIN PASSWORD '{APP_PASSWORD}';
         GRANT USAGE ON SCHEMA inbox TO ctl_admin, ctl_stranger;
         GRANT EXECUTE ON FUNCTION inbox.pause_handler(text), inbox.resume_handler(text),
             inbox.retry_many(text, text[]), inbox.retry_by_error(text, text),
             inbox.dismiss_many(text, text[]), inbox.dismiss_by_error(text, text),
             inbox.review_groups(text), inbox.review_messages(text, text, integer) TO ctl_admin, ctl_stranger;
         GRANT SELECT ON inbox.handler_overview TO ctl_admin;
         GRANT INSERT ON inbox.admin_audit TO ctl_admin;
         SELECT inbox.grant_handler('h', 'ctl_admin');"
    ));
    let owner_url = w.superuser_url.clone();
    let admin_url = w.pg.url_for("ctl_admin", APP_PASSWORD, &w.db);
    let stranger_url = w.pg.url_for("ctl_stranger", APP_PASSWORD, &w.db);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut owner = connect(&owner_url).await;
        let overview = control::handlers(&mut owner, "inbox").await.unwrap();
        assert_eq!(overview.iter().map(|o| o.handler.as_str()).collect::<Vec<_>>(), ["h", "other"]);
        let h = &overview[0];
        assert_eq!((h.backlog, h.leased, h.review_required, h.attempts, h.paused), (0, 0, 3, 3, false), "{h:?}");
        assert_eq!(overview[1].backlog, 4);
        assert!(overview[1].oldest_pending_seconds >= 0.0);
        assert!(control::pause(&mut owner, "inbox", "other").await.unwrap());
        assert!(!control::pause(&mut owner, "inbox", "nobody").await.unwrap());

        let mut admin = connect(&admin_url).await;
        let overview = control::handlers(&mut admin, "inbox").await.unwrap();
        assert!(overview[1].paused);
        assert!(control::resume(&mut admin, "inbox", "h").await.unwrap());

        let groups = control::review_groups(&mut admin, "inbox", "h").await.unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!((groups[0].error_code.as_deref(), groups[0].count), (Some("http_503"), 2));
        assert_eq!(groups[0].sample_event_ids, ["e1", "e2"]);
        assert!(groups[0].first_at.ends_with('Z') && groups[0].first_at <= groups[0].last_at, "{groups:?}");
        let listed = control::review_messages(&mut admin, "inbox", "h", Some("bad_sku"), 10).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].event_id.as_str(), listed[0].partition, listed[0].offset), ("e3", Some(0), Some(2)));
        assert_eq!(listed[0].event_type.as_deref(), Some("T"));
        assert_eq!(control::review_messages(&mut admin, "inbox", "h", None, 100).await.unwrap().len(), 3);
        let e = control::review_messages(&mut admin, "inbox", "h", None, 0).await.unwrap_err();
        assert!(e.is_bad_input(), "{e}");

        let n = control::retry(&mut admin, "inbox", "h", Selection::ErrorCode("http_503")).await.unwrap();
        assert_eq!(n, 2);
        let picked = vec!["e3".to_owned(), "e1".to_owned()];
        assert_eq!(control::dismiss(&mut admin, "inbox", "h", Selection::EventIds(&picked)).await.unwrap(), 1);
        assert_eq!(control::retry(&mut admin, "inbox", "h", Selection::EventIds(&picked)).await.unwrap(), 0);
        assert_eq!(control::dismiss(&mut admin, "inbox", "h", Selection::ErrorCode("bad_sku")).await.unwrap(), 0);
        let e = control::retry(&mut admin, "inbox", "h", Selection::ErrorCode("not a code")).await.unwrap_err();
        assert_eq!(e.sqlstate(), Some("22023"), "{e}");
        assert!(e.is_bad_input());
        let too_many: Vec<String> = (0..=control::MAX_EVENT_IDS).map(|i| format!("e{i}")).collect();
        let e = control::dismiss(&mut admin, "inbox", "h", Selection::EventIds(&too_many)).await.unwrap_err();
        assert!(matches!(e, ControlError::Refused(_)) && e.is_bad_input(), "{e}");

        control::audit(
            &mut admin,
            "inbox",
            &AuditRow { token_name: "ci", role: "operator", action: "retry", target: Some("h"), result: "2" },
        )
        .await
        .unwrap();
        control::audit(
            &mut admin,
            "inbox",
            &AuditRow { token_name: "ci", role: "operator", action: "pause", target: None, result: "refused" },
        )
        .await
        .unwrap();

        // Not granted the handler: refused by the SQL API, not a bad input.
        let mut stranger = connect(&stranger_url).await;
        let e = control::review_groups(&mut stranger, "inbox", "h").await.unwrap_err();
        assert_eq!(e.sqlstate(), Some("42501"), "{e}");
        assert!(!e.is_bad_input());
        let e = control::pause(&mut stranger, "inbox", "h").await.unwrap_err();
        assert_eq!(e.sqlstate(), Some("42501"), "{e}");
        let e = control::handlers(&mut stranger, "inbox").await.unwrap_err();
        assert_eq!(e.sqlstate(), Some("42501"), "no SELECT on the view: {e}");
        for c in [owner, admin, stranger] {
            c.close().await;
        }
    });
    assert_eq!(state(&w, "h", "e1"), "pending|0|", "retried, then left alone by the dismiss");
    assert_eq!(state(&w, "h", "e2"), "pending|0|");
    assert_eq!(state(&w, "h", "e3"), "dismissed|1|bad_sku");
    assert_eq!(
        w.sql("SELECT string_agg(token_name || '|' || role || '|' || action || '|' || coalesce(target, '-') || '|' || result, ',' ORDER BY at, action DESC) FROM inbox.admin_audit"),
        "ci|operator|retry|h|2,ci|operator|pause|-|refused"
    );
    assert_eq!(w.sql("SELECT paused FROM inbox.handlers WHERE name = 'other'"), "t");
}

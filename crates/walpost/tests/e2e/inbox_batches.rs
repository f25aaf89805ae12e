//! The inbox's batch calls, `inbox.complete_many` and `inbox.fail_many`
//! (migrations/inbox/0003_inbox_batches.sql), against a real PostgreSQL and no Kafka:
//! receipts for the leases still held and for nothing else, attempts and backoff as
//! `inbox.fail` charges them, the handler grants, the arrays refused, the batched psql
//! worker of docs/inbox.md run as written, and a property: over seeded random
//! interleavings of claims, lease expiry, review decisions and acts, a handler driven by
//! the batch calls ends exactly where one driven by the single calls does.
//!
//! Over 500 lines: the property's generator and its SQL script builder stay beside the
//! one test they serve.

use crate::support::World;

fn inbox_world(name: &str) -> World {
    let w = World::postgres_only(name);
    w.sql(&crate::support::inbox_migrations());
    w
}

fn register(w: &World, name: &str, max_attempts: u32, backoff_base: &str, backoff_max: &str) {
    w.sql(&format!(
        "SELECT inbox.register_handler('{name}', '{{}}', '{{}}', {max_attempts}, '{backoff_base}', '{backoff_max}', false)"
    ));
}

fn store(w: &World, ids: &[&str]) {
    let rows: Vec<(&str, &str, &str, &str)> = ids.iter().map(|id| (*id, "t", *id, "T")).collect();
    crate::inbox::store(w, &rows);
}

/// `inbox.claim` as (event id, lease token), in the order returned.
fn claim(w: &World, handler: &str, max_rows: u32) -> Vec<(String, String)> {
    w.sql(&format!("SELECT event_id, lease_token FROM inbox.claim('{handler}', {max_rows}, '1 hour')"))
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (id, token) = l.split_once('|').unwrap();
            (id.to_owned(), token.to_owned())
        })
        .collect()
}

fn token<'a>(claimed: &'a [(String, String)], id: &str) -> &'a str {
    &claimed.iter().find(|(i, _)| i == id).unwrap_or_else(|| panic!("{id} not claimed: {claimed:?}")).1
}

/// A SQL array literal of `items`, of type `ty`.
fn array(items: &[&str], ty: &str) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
    format!("ARRAY[{}]::{ty}[]", quoted.join(", "))
}

/// psql's text of a one-dimensional text[] of plain words, as its elements.
fn elements(text: &str) -> Vec<String> {
    let inner = text.trim().trim_start_matches('{').trim_end_matches('}');
    inner.split(',').filter(|s| !s.is_empty()).map(str::to_owned).collect()
}

fn complete_many(w: &World, handler: &str, ids: &[&str], tokens: &[&str]) -> Vec<String> {
    elements(&w.sql(&format!(
        "SELECT inbox.complete_many('{handler}', {}, {})",
        array(ids, "text"),
        array(tokens, "uuid")
    )))
}

fn delivery(w: &World, handler: &str, event_id: &str) -> String {
    w.sql(&format!(
        "SELECT state || '|' || attempts || '|' || coalesce(last_error_code, '') || '|' || (lease_token IS NOT NULL) \
         FROM inbox.deliveries WHERE handler = '{handler}' AND event_id = '{event_id}'"
    ))
    .trim()
    .to_owned()
}

fn receipts(w: &World, handler: &str) -> String {
    w.sql(&format!(
        "SELECT coalesce(string_agg(event_id, ',' ORDER BY event_id), '') FROM inbox.receipts WHERE handler = '{handler}'"
    ))
    .trim()
    .to_owned()
}

/// complete_many writes the receipts of the leases the caller still holds, returns those
/// ids in the order given, and writes nothing for the others: a lease taken over after it
/// ran out, a message dismissed or completed already, a copy of an element. A lease that
/// ran out but was not taken over still counts, as for inbox.complete. Rolled back with
/// the worker's transaction, it leaves nothing.
#[test]
fn inbox_batches_complete_many_writes_the_receipts_of_held_leases_only() {
    let w = inbox_world("inbox-batch-complete");
    register(&w, "h", 5, "1 second", "1 minute");
    store(&w, &["e1", "e2", "e3", "e4", "e5", "e6"]);
    let held = claim(&w, "h", 10);
    assert_eq!(held.len(), 6);

    // Rolled back with the worker's other writes: nothing stays.
    w.sql(&format!(
        "BEGIN; SELECT inbox.complete_many('h', ARRAY['e1'], ARRAY['{}'::uuid]); ROLLBACK;",
        token(&held, "e1")
    ));
    assert_eq!(receipts(&w, "h"), "");
    assert_eq!(delivery(&w, "h", "e1"), "pending|0||true");

    // e2's lease ran out and another worker's claim took it; e3 was dismissed; e4 was
    // completed by the single call; e5's lease ran out but nobody took it yet.
    w.sql("UPDATE inbox.deliveries SET lease_until = now() - interval '1 second' WHERE event_id = 'e2'");
    let taken = claim(&w, "h", 10);
    assert_eq!(taken.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["e2"]);
    assert_eq!(w.sql("SELECT inbox.dismiss('h', 'e3')"), "t");
    assert_eq!(w.sql(&format!("SELECT inbox.complete('h', 'e4', '{}')", token(&held, "e4"))), "t");
    w.sql("UPDATE inbox.deliveries SET lease_until = now() - interval '1 second' WHERE event_id = 'e5'");

    let order = ["e6", "e5", "e4", "e3", "e2", "e1", "e6"];
    let tokens: Vec<&str> = order.iter().map(|id| token(&held, id)).collect();
    assert_eq!(complete_many(&w, "h", &order, &tokens), ["e6", "e5", "e1"], "in the order given, each once");
    assert_eq!(receipts(&w, "h"), "e1,e4,e5,e6");
    assert_eq!(delivery(&w, "h", "e2"), "pending|0||true", "the other worker's lease stands");
    assert_eq!(delivery(&w, "h", "e3"), "dismissed|0||false");
    for id in ["e1", "e4", "e5", "e6"] {
        assert_eq!(delivery(&w, "h", id), "done|0||false", "{id}");
    }
    // The worker that took e2 over completes it; the first worker's token stays refused.
    assert_eq!(complete_many(&w, "h", &["e2"], &[token(&held, "e2")]), Vec::<String>::new());
    assert_eq!(complete_many(&w, "h", &["e2"], &[token(&taken, "e2")]), ["e2"]);
    assert_eq!(complete_many(&w, "h", &["e2"], &[token(&taken, "e2")]), Vec::<String>::new());
    assert_eq!(w.sql("SELECT inbox.complete_many('h', '{}', '{}')"), "{}", "an empty batch writes nothing");
    assert_eq!(w.sql("SELECT count(*) FROM inbox.receipts WHERE handler = 'h'"), "5");
}

/// fail_many charges each element as inbox.fail does: one handler failed by the single
/// call and one by the batch go through the same attempts, error codes and backoff
/// windows (base 10 s, doubled, at most 25 s, times a jitter of 0.5 to 1) to
/// review_required at max_attempts; a lost lease is 'lease_lost' and charged nothing.
#[test]
fn inbox_batches_fail_many_charges_attempts_and_backoff_like_fail() {
    let w = inbox_world("inbox-batch-fail");
    register(&w, "one", 4, "10 seconds", "25 seconds");
    register(&w, "many", 4, "10 seconds", "25 seconds");
    store(&w, &["e1", "e2", "e3"]);
    let codes = ["http_503", "boom", "validation.bad_sku:1-a"];
    let mut last = (Vec::new(), Vec::new());
    for attempt in 1..=4_u32 {
        w.sql("UPDATE inbox.deliveries SET next_attempt_at = now() WHERE state = 'pending'");
        let one = claim(&w, "one", 10);
        let many = claim(&w, "many", 10);
        let ids: Vec<&str> = one.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(ids, ["e1", "e2", "e3"], "attempt {attempt}");
        assert_eq!(many.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ids, "attempt {attempt}");

        // Backoff of this attempt, in seconds: now() is the transaction's, in fail's too.
        let full = (10.0 * 2f64.powi(i32::try_from(attempt).unwrap() - 1)).min(25.0);
        let window = |h: &str| {
            format!(
                "SELECT bool_and(next_attempt_at >= now() + make_interval(secs => {lo} - 0.001) \
                     AND next_attempt_at <= now() + make_interval(secs => {full})) \
                 FROM inbox.deliveries WHERE handler = '{h}'",
                lo = full / 2.0
            )
        };
        let singles: Vec<String> = ids
            .iter()
            .zip(codes)
            .map(|(id, code)| format!("SELECT inbox.fail('one', '{id}', '{}', '{code}');", token(&one, id)))
            .collect();
        let out = w.sql(&format!("BEGIN; {} {}; COMMIT;", singles.join(" "), window("one")));
        let many_tokens: Vec<&str> = ids.iter().map(|id| token(&many, id)).collect();
        let batch = w.sql(&format!(
            "BEGIN; SELECT array_to_string(inbox.fail_many('many', {}, {}, {}), ','); {}; COMMIT;",
            array(&ids, "text"),
            array(&many_tokens, "uuid"),
            array(&codes, "text"),
            window("many")
        ));
        let want = if attempt < 4 { "pending" } else { "review_required" };
        assert_eq!(out, format!("{want}\n{want}\n{want}\nt"), "attempt {attempt}: single calls");
        assert_eq!(batch, format!("{want},{want},{want}\nt"), "attempt {attempt}: the batch");
        for (id, code) in ids.iter().zip(codes) {
            let expected = format!("{want}|{attempt}|{code}|false");
            assert_eq!(delivery(&w, "one", id), expected, "attempt {attempt}");
            assert_eq!(delivery(&w, "many", id), expected, "attempt {attempt}");
        }
        last = (ids.iter().map(|s| (*s).to_owned()).collect(), many_tokens.iter().map(|s| (*s).to_owned()).collect());
    }
    // Tokens of a lease that is gone: nothing is charged.
    let (ids, tokens) = last;
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let tokens: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let lost = w.sql(&format!(
        "SELECT array_to_string(inbox.fail_many('many', {}, {}, {}), ',')",
        array(&ids, "text"),
        array(&tokens, "uuid"),
        array(&codes, "text")
    ));
    assert_eq!(lost, "lease_lost,lease_lost,lease_lost");
    assert_eq!(delivery(&w, "many", "e1"), "review_required|4|http_503|false");
    // A copy of an element: the first acts, the copy finds the lease gone (as a second
    // inbox.fail would); each result in the order given.
    w.sql("SELECT inbox.retry('many', 'e1')");
    let again = claim(&w, "many", 10);
    let t = token(&again, "e1");
    let out = w.sql(&format!(
        "SELECT array_to_string(inbox.fail_many('many', ARRAY['e1', 'e1'], ARRAY['{t}', '{t}']::uuid[], ARRAY['first', 'second']), ',')"
    ));
    assert_eq!(out, "pending,lease_lost");
    assert_eq!(delivery(&w, "many", "e1"), "pending|1|first|false");
}

/// A worker acts in batches only for the handlers its role was granted, like with the
/// single calls; the roles that may execute inbox.complete and inbox.fail when 0003 is
/// applied may execute the batch functions (an inbox upgraded under running workers);
/// any other role may not, and nobody but the owner calls check_batch.
#[test]
fn inbox_batches_a_worker_batches_only_for_the_handlers_its_role_was_granted() {
    let w = inbox_world("inbox-batch-grants");
    register(&w, "pay", 5, "1 second", "1 minute");
    register(&w, "billing", 5, "1 second", "1 minute");
    store(&w, &["e1", "e2"]);
    let worker = format!("{}_pay", w.role);
    let stranger = format!("{}_stranger", w.role);
    w.sql(&format!(
        "CREATE ROLE {worker} LOGIN;
         CREATE ROLE {stranger} LOGIN;
         GRANT USAGE ON SCHEMA inbox TO {worker}, {stranger};
         GRANT EXECUTE ON FUNCTION inbox.claim(text, integer, interval), inbox.complete(text, text, uuid),
             inbox.fail(text, text, uuid, text) TO {worker};
         SELECT inbox.grant_handler('pay', '{worker}');"
    ));
    let as_role = |role: &str, sql: &str| w.pg.psql_as(role, &w.db, sql).map_err(|e| e.to_string());
    let denied = as_role(&worker, "SELECT inbox.complete_many('pay', '{}', '{}')").unwrap_err();
    assert!(denied.contains("permission denied for function complete_many"), "{denied}");
    // The migrations applied again, as on an inbox upgraded after the grant above.
    w.sql(&crate::support::inbox_migrations());

    let got = as_role(&worker, "SELECT event_id || '|' || lease_token FROM inbox.claim('pay', 10, '1 hour')").unwrap();
    let pay: Vec<(String, String)> = got
        .lines()
        .map(|l| {
            let (id, token) = l.split_once('|').unwrap();
            (id.to_owned(), token.to_owned())
        })
        .collect();
    let done = as_role(
        &worker,
        &format!("SELECT inbox.complete_many('pay', ARRAY['e1'], ARRAY['{}'::uuid])", token(&pay, "e1")),
    )
    .unwrap();
    assert_eq!(done, "{e1}");
    let failed = as_role(
        &worker,
        &format!("SELECT inbox.fail_many('pay', ARRAY['e2'], ARRAY['{}'::uuid], ARRAY['boom'])", token(&pay, "e2")),
    )
    .unwrap();
    assert_eq!(failed, "{pending}");

    let billing = claim(&w, "billing", 10);
    let (ids, tokens) = (array(&["e1", "e2"], "text"), array(&[token(&billing, "e1"), token(&billing, "e2")], "uuid"));
    for (sql, action) in [
        (format!("SELECT inbox.complete_many('billing', {ids}, {tokens})"), "inbox.complete_many"),
        (format!("SELECT inbox.fail_many('billing', {ids}, {tokens}, ARRAY['x', 'y'])"), "inbox.fail_many"),
        ("SELECT inbox.complete_many('billing', '{}', '{}')".to_owned(), "inbox.complete_many"),
    ] {
        let refused = as_role(&worker, &sql).unwrap_err();
        assert!(
            refused.contains(&format!("role \"{worker}\" may not call {action} for inbox handler \"billing\"")),
            "{sql}: {refused}"
        );
    }
    for sql in [
        format!("SELECT inbox.complete_many('pay', {ids}, {tokens})"),
        format!("SELECT inbox.fail_many('pay', {ids}, {tokens}, ARRAY['x', 'y'])"),
    ] {
        let refused = as_role(&stranger, &sql).unwrap_err();
        assert!(refused.contains("permission denied for function"), "{sql}: {refused}");
    }
    let refused = as_role(&worker, "SELECT inbox.check_batch('x', '{}', '{}', NULL)").unwrap_err();
    assert!(refused.contains("permission denied for function check_batch"), "{refused}");
    assert_eq!(receipts(&w, "billing"), "", "billing untouched by pay's worker");
    assert_eq!(delivery(&w, "billing", "e1"), "pending|0||true");
    assert_eq!(delivery(&w, "billing", "e2"), "pending|0||true");
}

/// Arrays that cannot be a batch are refused with what is wrong and where (by position,
/// never by value), and nothing of the call is written, not even its valid elements. A
/// NULL array is an empty one.
#[test]
fn inbox_batches_arrays_that_are_no_batch_are_refused_and_nothing_is_written() {
    let w = inbox_world("inbox-batch-refused");
    register(&w, "h", 5, "1 second", "1 minute");
    store(&w, &["e1", "e2"]);
    let held = claim(&w, "h", 10);
    let (t1, t2) = (token(&held, "e1"), token(&held, "e2"));
    let sentence = "customer Jane Doe <jane@example.com> not found";
    let cases = [
        (
            format!("inbox.complete_many('h', ARRAY['e1', 'e2'], ARRAY['{t1}'::uuid])"),
            "22023",
            "inbox.complete_many: event_ids and lease_tokens must be equally long (event_ids has 2, lease_tokens 1)",
        ),
        (
            format!("inbox.fail_many('h', ARRAY['e1'], ARRAY['{t1}'::uuid], ARRAY['a', 'b'])"),
            "22023",
            "inbox.fail_many: event_ids, lease_tokens and error_codes must be equally long (event_ids has 1, lease_tokens 1, error_codes 2)",
        ),
        (
            format!("inbox.complete_many('h', NULL, ARRAY['{t1}'::uuid])"),
            "22023",
            "inbox.complete_many: event_ids and lease_tokens must be equally long (event_ids has 0, lease_tokens 1)",
        ),
        (
            format!("inbox.fail_many('h', ARRAY['e1'], ARRAY['{t1}'::uuid], NULL)"),
            "22023",
            "inbox.fail_many: event_ids, lease_tokens and error_codes must be equally long (event_ids has 1, lease_tokens 1, error_codes 0)",
        ),
        (
            format!("inbox.complete_many('h', ARRAY['e1', NULL], ARRAY['{t1}', '{t2}']::uuid[])"),
            "22004",
            "inbox.complete_many: event_ids[2] is NULL",
        ),
        (
            format!("inbox.fail_many('h', ARRAY['e1', 'e2'], ARRAY['{t1}', NULL]::uuid[], ARRAY['a', 'b'])"),
            "22004",
            "inbox.fail_many: lease_tokens[2] is NULL",
        ),
        (
            format!("inbox.fail_many('h', ARRAY['e1', 'e2'], ARRAY['{t1}', '{t2}']::uuid[], ARRAY['a', NULL])"),
            "22023",
            "inbox.fail_many: error_codes[2] is not an error code",
        ),
        (
            format!("inbox.fail_many('h', ARRAY['e1', 'e2'], ARRAY['{t1}', '{t2}']::uuid[], ARRAY['http_503', '{sentence}'])"),
            "22023",
            "inbox.fail_many: error_codes[2] is not an error code: a short code",
        ),
        (
            format!("inbox.complete_many('h', ARRAY[['e1'], ['e2']], ARRAY[['{t1}'], ['{t2}']]::uuid[])"),
            "22023",
            "inbox.complete_many: event_ids and lease_tokens are one-dimensional arrays",
        ),
        (
            format!(
                "inbox.complete_many('h', ARRAY['e1'] || array_fill('x'::text, ARRAY[10000]), \
                 ARRAY['{t1}'::uuid] || array_fill('{t2}'::uuid, ARRAY[10000]))"
            ),
            "54000",
            "inbox.complete_many: at most 10000 messages a call (event_ids has 10001)",
        ),
    ];
    for (call, state, message) in &cases {
        let e = w.try_sql(&format!("\\set VERBOSITY verbose\nSELECT {call}")).unwrap_err();
        assert!(e.contains(&format!("ERROR:  {state}: {message}")), "{call}:\n{e}");
        assert!(!e.contains("Jane"), "an error code refused is not quoted: {e}");
    }
    // NULL arrays are an empty batch (array_agg over no rows); 10,000 is a batch (of ids
    // nobody holds).
    assert_eq!(w.sql("SELECT inbox.complete_many('h', NULL, NULL)"), "{}");
    assert_eq!(w.sql("SELECT inbox.fail_many('h', NULL, NULL, NULL)"), "{}");
    let full = w.sql(&format!(
        "SELECT cardinality(inbox.complete_many('h', array_fill('x'::text, ARRAY[10000]), array_fill('{t2}'::uuid, ARRAY[10000])))"
    ));
    assert_eq!(full, "0");
    assert_eq!(receipts(&w, "h"), "");
    assert_eq!(delivery(&w, "h", "e1"), "pending|0||true");
    assert_eq!(delivery(&w, "h", "e2"), "pending|0||true");
}

/// The batched worker of docs/inbox.md ("Batched workers", its psql block), run as
/// written: one invoice per message and one receipt each, in one transaction; a second
/// run finds nothing to do.
#[test]
fn inbox_batches_the_documented_psql_worker_runs_as_written() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/inbox.md")).unwrap();
    let section = doc.split("\n## Batched workers").nth(1).expect("docs/inbox.md has a section \"Batched workers\"");
    let block = section.split("```sql\n").nth(1).and_then(|b| b.split("\n```").next()).expect("a ```sql block");
    let w = inbox_world("inbox-batch-doc");
    w.sql(
        "CREATE TABLE invoices (event_id text PRIMARY KEY, order_id text NOT NULL, amount bigint NOT NULL);
         SELECT inbox.register_handler('billing', '{orders}', '{OrderPlaced}', 5, '10 seconds', '1 hour', false);
         INSERT INTO inbox.messages (event_id, topic, \"partition\", \"offset\", headers, payload, event_type, aggregate_id)
         SELECT 'e' || i, 'orders', 0, i, '{}',
                convert_to(json_build_object('order_id', 'o-' || i, 'amount', 100 * i)::text, 'UTF8'), 'OrderPlaced', 'o-' || i
         FROM generate_series(1, 120) i;",
    );
    // The block claims 50 at a time: three runs handle the 120 messages.
    for _ in 0..3 {
        w.sql(block);
    }
    assert_eq!(w.sql("SELECT count(*), sum(amount) FROM invoices"), "120|726000");
    assert_eq!(w.sql("SELECT count(*) FROM inbox.receipts WHERE handler = 'billing'"), "120");
    assert_eq!(
        w.sql("SELECT count(*) FROM invoices i JOIN inbox.receipts r ON r.event_id = i.event_id"),
        "120",
        "an invoice for each receipt"
    );
    w.sql(block);
    assert_eq!(w.sql("SELECT count(*) FROM invoices"), "120");
}

/// xorshift64*, seeded through splitmix64: small, and the same sequence for a seed on
/// every platform.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// 0..n.
    fn below(&mut self, n: u32) -> u32 {
        u32::try_from(self.next() % u64::from(n)).unwrap()
    }

    /// True `percent` times in a hundred.
    fn chance(&mut self, percent: u32) -> bool {
        self.below(100) < percent
    }
}

/// Which lease token of an id a worker passes: the newest it was given, the oldest, or
/// one that was never a lease.
#[derive(Debug, Clone, Copy)]
enum Pick {
    Newest,
    Oldest,
    Bogus,
}

#[derive(Debug)]
enum Op {
    /// `inbox.claim` of up to n rows, with a lease that outlives the case.
    Claim(u32),
    /// The leases of these ids run out now (a stalled worker): the next claim takes them
    /// back.
    Expire(Vec<String>),
    /// The worker acts on these (event id, token, None: complete or Some(code): fail), in
    /// order, in one transaction: completes, then fails.
    Act(Vec<(String, Pick, Option<&'static str>)>),
    Dismiss(String),
    Retry(String),
    /// Every backoff is over.
    TimePasses,
}

/// One case: the messages (event id, second topic or not, aggregate), in arrival order,
/// the handlers' settings and the steps.
#[derive(Debug)]
struct Case {
    messages: Vec<(String, bool, u32)>,
    max_attempts: u32,
    ordered: bool,
    ops: Vec<Op>,
}

fn generate(rng: &mut Rng) -> Case {
    let n = 2 + rng.below(9);
    let ids: Vec<String> = (1..=n).map(|i| format!("e{i}")).collect();
    let mut messages = Vec::new();
    for id in &ids {
        messages.push((id.clone(), false, rng.below(3)));
        // The same event id from a second source: two messages of one handler.
        if rng.chance(20) {
            messages.push((id.clone(), true, rng.below(3)));
        }
    }
    for i in (1..messages.len()).rev() {
        let j = rng.below(u32::try_from(i + 1).unwrap()) as usize;
        messages.swap(i, j);
    }
    let pick_id = |rng: &mut Rng| ids[rng.below(n) as usize].clone();
    let steps = 4 + rng.below(11);
    let mut ops = Vec::new();
    for _ in 0..steps {
        let roll = rng.below(100);
        ops.push(match roll {
            0..=29 => Op::Claim(1 + rng.below(4)),
            30..=59 => {
                let items = 1 + rng.below(5);
                Op::Act(
                    (0..items)
                        .map(|_| {
                            let id = pick_id(rng);
                            let pick = match rng.below(10) {
                                0..=5 => Pick::Newest,
                                6..=8 => Pick::Oldest,
                                _ => Pick::Bogus,
                            };
                            let outcome = if rng.chance(60) {
                                None
                            } else {
                                Some(["http_503", "boom", "x.y:z-1"][rng.below(3) as usize])
                            };
                            (id, pick, outcome)
                        })
                        .collect(),
                )
            }
            60..=74 => Op::Expire(ids.iter().filter(|_| rng.chance(40)).cloned().collect()),
            75..=84 => Op::TimePasses,
            85..=91 => Op::Dismiss(pick_id(rng)),
            _ => Op::Retry(pick_id(rng)),
        });
    }
    Case { messages, max_attempts: 1 + rng.below(3), ordered: rng.chance(50), ops }
}

const BOGUS: &str = "00000000-0000-4000-8000-000000000000";

/// The SQL of one step for handler `h`; `batch`: the act goes through complete_many and
/// fail_many, else through complete and fail once per element.
fn step_sql(h: &str, step: usize, op: &Op, batch: bool) -> String {
    match op {
        Op::Claim(k) => format!(
            "INSERT INTO held (h, step, ord, event_id, topic, lease_token)
             SELECT '{h}', {step}, c.ord, c.event_id, c.topic, c.lease_token
             FROM inbox.claim('{h}', {k}, '1 hour') WITH ORDINALITY AS c (event_id, lease_token, topic, key, headers, payload, attempts, ord);"
        ),
        Op::Expire(ids) => format!(
            "UPDATE inbox.deliveries SET lease_until = now() - interval '1 second'
             WHERE handler = '{h}' AND lease_until IS NOT NULL AND event_id = ANY ('{{{}}}'::text[]);",
            ids.join(",")
        ),
        Op::TimePasses => format!(
            "UPDATE inbox.deliveries SET next_attempt_at = now() - interval '1 millisecond'
             WHERE handler = '{h}' AND state = 'pending';"
        ),
        Op::Dismiss(id) => format!("INSERT INTO log SELECT '{h}', {step}, inbox.dismiss('{h}', '{id}')::text;"),
        Op::Retry(id) => format!("INSERT INTO log SELECT '{h}', {step}, inbox.retry('{h}', '{id}')::text;"),
        Op::Act(items) => {
            let values: Vec<String> = items
                .iter()
                .enumerate()
                .map(|(i, (id, pick, outcome))| {
                    let pick = match pick {
                        Pick::Newest => "newest",
                        Pick::Oldest => "oldest",
                        Pick::Bogus => "bogus",
                    };
                    let code = outcome.map_or("NULL".to_owned(), |c| format!("'{c}'"));
                    format!("({}, '{id}', '{pick}', {code})", i + 1)
                })
                .collect();
            let resolve = format!(
                "INSERT INTO acts (h, step, ord, event_id, lease_token, code)
                 SELECT '{h}', {step}, i.ord, i.event_id,
                        coalesce(CASE WHEN i.pick <> 'bogus' THEN (
                            SELECT x.lease_token FROM held x WHERE x.h = '{h}' AND x.event_id = i.event_id
                            ORDER BY CASE WHEN i.pick = 'newest' THEN x.step ELSE -x.step END DESC, x.ord DESC
                            LIMIT 1) END, '{BOGUS}'),
                        i.code
                 FROM (VALUES {}) AS i (ord, event_id, pick, code);",
                values.join(", ")
            );
            let acts = |fails: bool| {
                format!(
                    "FROM acts a WHERE a.h = '{h}' AND a.step = {step} AND a.code IS {}NULL",
                    if fails { "NOT " } else { "" }
                )
            };
            let act = if batch {
                format!(
                    "DO $act$
                     DECLARE r text[]; f text[];
                     BEGIN
                         SELECT inbox.complete_many('{h}', coalesce(array_agg(a.event_id ORDER BY a.ord), '{{}}'),
                                                    coalesce(array_agg(a.lease_token ORDER BY a.ord), '{{}}'))
                         INTO r {};
                         SELECT inbox.fail_many('{h}', coalesce(array_agg(a.event_id ORDER BY a.ord), '{{}}'),
                                                coalesce(array_agg(a.lease_token ORDER BY a.ord), '{{}}'),
                                                coalesce(array_agg(a.code ORDER BY a.ord), '{{}}'))
                         INTO f {};
                         INSERT INTO log VALUES ('{h}', {step}, r::text || ' ' || f::text);
                     END $act$;",
                    acts(false),
                    acts(true)
                )
            } else {
                format!(
                    "DO $act$
                     DECLARE x record; r text[] := '{{}}'; f text[] := '{{}}';
                     BEGIN
                         FOR x IN SELECT a.* {} ORDER BY a.ord LOOP
                             IF inbox.complete('{h}', x.event_id, x.lease_token) THEN r := r || x.event_id; END IF;
                         END LOOP;
                         FOR x IN SELECT a.* {} ORDER BY a.ord LOOP
                             f := f || inbox.fail('{h}', x.event_id, x.lease_token, x.code);
                         END LOOP;
                         INSERT INTO log VALUES ('{h}', {step}, r::text || ' ' || f::text);
                     END $act$;",
                    acts(false),
                    acts(true)
                )
            };
            format!("{resolve}\n{act}")
        }
    }
}

/// What a handler's run left, as text to compare: its deliveries (state, attempts, error,
/// crash isolation, whether a lease is held, ran out, or a backoff is pending), receipts,
/// what each claim returned, what each act and review call returned, leases lost.
fn dump_sql(h: &str) -> String {
    format!(
        "SELECT 'delivery', event_id, topic, state, attempts, coalesce(last_error_code, '-'), isolated,
                coalesce(lease_rows::text, '-'), lease_token IS NOT NULL, coalesce(lease_until < now(), false),
                next_attempt_at > now()
         FROM inbox.deliveries WHERE handler = '{h}' ORDER BY event_id, topic;
         SELECT 'receipt', event_id, topic FROM inbox.receipts WHERE handler = '{h}' ORDER BY event_id, topic;
         SELECT 'claimed', step, ord, event_id, topic FROM held WHERE h = '{h}' ORDER BY step, ord;
         SELECT 'returned', step, result FROM log WHERE h = '{h}' ORDER BY step;
         SELECT 'leases_lost', leases_lost FROM inbox.handlers WHERE name = '{h}';"
    )
}

/// The script of one case: both handlers registered alike on the case's own two topics,
/// the messages stored, each step run for the handler of single calls and then for the
/// handler of batches, then what each was left with.
fn case_sql(n: usize, case: &Case) -> String {
    let (one, many) = (format!("one_{n}"), format!("many_{n}"));
    let mut sql = String::from(
        "\\o /dev/null
         CREATE TEMP TABLE held (h text, step int, ord bigint, event_id text, topic text, lease_token uuid);
         CREATE TEMP TABLE acts (h text, step int, ord int, event_id text, lease_token uuid, code text);
         CREATE TEMP TABLE log (h text, step int, result text);\n",
    );
    for h in [&one, &many] {
        sql.push_str(&format!(
            "SELECT inbox.register_handler('{h}', '{{c{n}a,c{n}b}}', '{{}}', {}, '1 hour', '2 hours', {});\n",
            case.max_attempts, case.ordered
        ));
    }
    let values: Vec<String> = case
        .messages
        .iter()
        .enumerate()
        .map(|(i, (id, second, aggregate))| {
            let topic = if *second { format!("c{n}b") } else { format!("c{n}a") };
            format!("('{id}', '{topic}', 0, {i}, '{{}}', '\\x00', 'T', 'g{aggregate}')")
        })
        .collect();
    sql.push_str(&format!(
        "INSERT INTO inbox.messages (event_id, topic, \"partition\", \"offset\", headers, payload, event_type, aggregate_id)
         VALUES {};\n",
        values.join(", ")
    ));
    for (step, op) in case.ops.iter().enumerate() {
        sql.push_str(&step_sql(&one, step, op, false));
        sql.push('\n');
        sql.push_str(&step_sql(&many, step, op, true));
        sql.push('\n');
    }
    sql.push_str(&format!("\\o\n{}\nSELECT '=====';\n{}", dump_sql(&one), dump_sql(&many)));
    sql
}

/// For any interleaving of claims, lease expiry (a stalled worker's lease taken over),
/// dismiss, retry, backoff and acts (stale, current and bogus tokens, copies, completes
/// and fails), a handler whose worker calls complete_many and fail_many ends exactly
/// where a handler whose worker calls complete and fail once per element does: the same
/// deliveries, receipts, claims and results. Ordered and unordered handlers, one to three
/// attempts, event ids shared by two topics.
///
/// 200 cases from a fixed seed; `INBOX_BATCHES_SEED=<u64>` explores others, and
/// `INBOX_BATCHES_CASES=<n>` sets how many. A failing case names the seed that replays it
/// alone.
#[test]
fn inbox_batches_behave_like_the_single_calls_under_any_lease_expiry() {
    let base: u64 = std::env::var("INBOX_BATCHES_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x0003_ba7c_04e5);
    let cases: u64 = std::env::var("INBOX_BATCHES_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let w = inbox_world("inbox-batch-property");
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    for i in 0..cases {
        let seed = base.wrapping_add(i);
        let case = generate(&mut Rng::new(seed));
        let sql = case_sql(usize::try_from(i).unwrap(), &case);
        let out = w.try_sql(&sql).unwrap_or_else(|e| {
            panic!("case {i} failed; replay with INBOX_BATCHES_SEED={seed} INBOX_BATCHES_CASES=1\n{e}\n{sql}")
        });
        let (one, many) = out.split_once("\n=====\n").unwrap_or_else(|| panic!("case {i}: no separator in\n{out}"));
        if one != many {
            let diff: Vec<String> = one
                .lines()
                .zip(many.lines())
                .filter(|(a, b)| a != b)
                .map(|(a, b)| format!("  single: {a}\n  batch:  {b}"))
                .collect();
            panic!(
                "case {i}: the batch calls left another state than the single calls; replay with \
                 INBOX_BATCHES_SEED={seed} INBOX_BATCHES_CASES=1\n{}\n{case:#?}\nsingle calls:\n{one}\nbatch calls:\n{many}",
                diff.join("\n")
            );
        }
        for (what, needle) in [
            ("lease_lost", "lease_lost"),
            ("review_required", "|review_required|"),
            ("done", "|done|"),
            ("dismissed", "|dismissed|"),
            ("taken back", "|lease_expired|"),
        ] {
            *seen.entry(what).or_default() += one.matches(needle).count();
        }
        *seen.entry("completed by a batch").or_default() +=
            one.lines().filter(|l| l.starts_with("returned|") && l.contains("|{e")).count();
    }
    // The cases reach every outcome, so the equality above is about something.
    if cases >= 200 {
        for (what, n) in &seen {
            assert!(*n > 0, "no case reached {what}: {seen:?}");
        }
    }
    println!("{cases} cases from seed {base}: {seen:?}");
}

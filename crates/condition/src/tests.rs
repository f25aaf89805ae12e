use super::*;

/// The SQL and its parameters.
fn sql(text: &str) -> (String, Vec<String>) {
    let mut params = Vec::new();
    let sql = parse(text).unwrap_or_else(|e| panic!("{text}: {e}")).to_sql(&mut params);
    (sql, params)
}

/// The SQL alone, for conditions without strings.
fn sql_only(text: &str) -> String {
    let (sql, params) = sql(text);
    assert!(params.is_empty(), "{text}: {params:?}");
    sql
}

/// The condition written back in its own grammar (strings as `'...'` again).
fn condition_text(c: &Condition) -> String {
    let mut out = String::new();
    c.write(&mut out, &mut |text| format!("'{}'", text.replace('\'', "''")));
    out
}

fn owned(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

#[test]
fn conditions_users_write_become_sql_with_their_strings_as_parameters() {
    assert_eq!(sql("aggregate_type = 'order'"), ("(\"aggregate_type\" = $1)".into(), owned(&["order"])));
    assert_eq!(sql_only("id IN (1, 2, 3)"), "(\"id\" IN (1, 2, 3))");
    assert_eq!(
        sql("aggregate_type = 'order' AND (id > 10 OR \"Event Type\" LIKE 'Order%')"),
        (
            "((\"aggregate_type\" = $1) AND ((\"id\" > 10) OR (\"Event Type\" LIKE $2)))".into(),
            owned(&["order", "Order%"])
        )
    );
    assert_eq!(
        sql("occurred_at >= now() - interval '1 hour'"),
        ("(\"occurred_at\" >= (pg_catalog.now() - $1::interval))".into(), owned(&["1 hour"]))
    );
    assert_eq!(sql_only("done = true"), "(\"done\" = TRUE)");
    assert_eq!(
        sql("occurred_at BETWEEN '2026-11-28' AND '2026-11-29'::timestamptz"),
        ("(\"occurred_at\" BETWEEN $1 AND $2::timestamptz)".into(), owned(&["2026-11-28", "2026-11-29"]))
    );
    assert_eq!(sql_only("published_at IS NULL"), "(\"published_at\" IS NULL)");
    assert_eq!(sql_only("NOT id != -5"), "(NOT (\"id\" <> (-5)))");
    assert_eq!(sql("type = 'it''s'"), ("(\"type\" = $1)".into(), owned(&["it's"])));
    assert_eq!(
        sql("Aggregate_Type NOT IN ('a','b')"),
        ("(\"aggregate_type\" NOT IN ($1, $2))".into(), owned(&["a", "b"]))
    );
}

/// A statement's earlier parameters keep their places: the condition's come after them.
#[test]
fn parameters_are_numbered_after_those_already_bound() {
    let mut params = vec!["2026-11-28T00:00:00Z".to_owned()];
    let sql = parse("kind = 'a''b\\c'").unwrap().to_sql(&mut params);
    assert_eq!(sql, "(\"kind\" = $2)");
    assert_eq!(params, owned(&["2026-11-28T00:00:00Z", "a'b\\c"]));
}

/// Regression: what a role with INSERT on the signal table put in a filter ran as
/// walpost's role. None of it parses.
#[test]
fn function_calls_subqueries_and_statements_are_refused() {
    for hostile in [
        "(SELECT pg_drop_replication_slot('victim')) IS NULL",
        "pg_terminate_backend(1234) IS NOT NULL",
        "id = (SELECT count(*) FROM pg_stat_activity)",
        "pg_sleep(100000) IS NOT NULL",
        "pg_logical_emit_message(true, 'x', '{}') IS NOT NULL",
        "id = 1; DROP TABLE events.outbox",
        "id = 1 -- comment",
        "id = 1 /* c */",
        "id = pg_sleep(1)::text",
        "id = 1::regclass",
        "events.outbox.id = 1",
        "id = other_column",
        "EXISTS (SELECT 1)",
        "id = $1",
        "aggregate_type = E'\\x41'",
        "id = ARRAY[1]",
        "id IN (SELECT id FROM x)",
        "(((((((((((((((((((((((((((((((((((id = 1)))))))))))))))))))))))))))))))))",
    ] {
        assert!(parse(hostile).is_err(), "{hostile} parsed as {:?}", parse(hostile));
    }
    let long = "id = 1 OR ".repeat(1000) + "id = 2";
    assert!(parse(&long).unwrap_err().what.contains("longer than"));
}

#[test]
fn errors_say_what_and_where() {
    let e = parse("aggregate_type = lower('x')").unwrap_err();
    assert!(e.what.contains("function call") || e.what.contains("not a constant"), "{e}");
    assert_eq!(e.at, 18);
    let e = parse("id >").unwrap_err();
    assert!(e.to_string().contains("expected a constant"), "{e}");
}

mod props {
    use proptest::prelude::*;

    use super::super::*;

    proptest! {
        /// Any text: no panic; whatever parses is written back as a condition that
        /// parses to itself, and both give the same SQL and parameters (so what runs is
        /// what was read).
        #[test]
        fn any_text_parses_or_is_refused_and_round_trips(text in "[ -~]{0,80}") {
            if let Ok(c) = parse(&text) {
                let written = super::condition_text(&c);
                let again = parse(&written).unwrap_or_else(|e| panic!("{written}: {e}"));
                let (mut first, mut second) = (Vec::new(), Vec::new());
                prop_assert_eq!(again.to_sql(&mut second), c.to_sql(&mut first));
                prop_assert_eq!(second, first);
            }
        }
    }
}

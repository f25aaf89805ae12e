// Unit tests may unwrap: a failure is the test's report.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use super::*;

const ORDER_PLACED: &str = r##"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "required": ["order_id", "amount"],
  "properties": {
    "order_id": {"type": "string", "format": "uuid"},
    "amount": {"type": "integer", "minimum": 0},
    "placed_at": {"type": "string", "format": "date-time"},
    "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}}
  },
  "additionalProperties": false,
  "$defs": {"line": {"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}}}}
}"##;

const DRAFT7: &str = r##"{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "definitions": {"money": {"type": "number"}},
  "type": "object",
  "properties": {"refund": {"$ref": "#/definitions/money"}},
  "required": ["refund"]
}"##;

fn schema(event_type: &str, text: &str) -> SchemaText {
    SchemaText { event_type: event_type.into(), name: format!("{event_type}.json"), text: text.as_bytes().to_vec() }
}

fn contracts(unknown: Unknown) -> Contracts {
    Contracts::new(vec![schema("OrderPlaced", ORDER_PLACED), schema("order.refunded", DRAFT7)], unknown, "test")
        .unwrap()
}

fn check(c: &Contracts, event_type: &str, payload: &str) -> Result<(), Breach> {
    c.validate(Some(event_type.as_bytes()), payload.as_bytes())
}

fn invalid(breach: &Breach) -> (&str, &str, &str) {
    match &breach.reason {
        BreachReason::Invalid { pointer, keyword, schema_path } => (pointer, keyword, schema_path),
        other => panic!("not an Invalid breach: {other:?}"),
    }
}

const UUID: &str = "1f0c2f56-8a0e-4c43-9d0b-3d0c1f5e2a11";

#[test]
fn a_payload_that_meets_its_contract_passes() {
    let c = contracts(Unknown::Refuse);
    let ok = format!(
        r#"{{"order_id": "{UUID}", "amount": 12, "placed_at": "2026-12-03T10:00:00Z", "lines": [{{"sku": "A-1"}}]}}"#
    );
    assert_eq!(check(&c, "OrderPlaced", &ok), Ok(()));
    assert_eq!(check(&c, "order.refunded", r#"{"refund": 1.5}"#), Ok(()));
}

#[test]
fn a_breach_names_pointer_keyword_and_schema_never_the_value() {
    let c = contracts(Unknown::Allow);
    let payload = format!(r#"{{"order_id": "{UUID}", "amount": "SECRET-AMOUNT"}}"#);
    let breach = check(&c, "OrderPlaced", &payload).unwrap_err();
    assert_eq!(breach.schema.as_deref(), Some("OrderPlaced.json"));
    assert_eq!(invalid(&breach), ("/amount", "type", "/properties/amount/type"));
    let text = breach.to_string();
    assert!(text.contains("schema OrderPlaced.json refuses it: the value at /amount fails \"type\""), "{text}");
    assert!(!text.contains("SECRET"), "{text}");
}

#[test]
fn nested_refs_missing_fields_and_extra_fields_are_breaches() {
    let c = contracts(Unknown::Allow);
    let nested = format!(r#"{{"order_id": "{UUID}", "amount": 1, "lines": [{{"sku": "A"}}, {{"qty": 2}}]}}"#);
    let breach = check(&c, "OrderPlaced", &nested).unwrap_err();
    let (pointer, keyword, _) = invalid(&breach);
    assert_eq!((pointer, keyword), ("/lines/1", "required"));
    let missing = check(&c, "OrderPlaced", r#"{"amount": 1}"#).unwrap_err();
    assert_eq!(invalid(&missing).0, "");
    assert!(missing.to_string().contains("the value at the payload itself fails \"required\""), "{missing}");
    let extra = format!(r#"{{"order_id": "{UUID}", "amount": 1, "ssn_SECRET": "x"}}"#);
    let breach = check(&c, "OrderPlaced", &extra).unwrap_err();
    assert_eq!(invalid(&breach).1, "additionalProperties");
    assert!(!breach.to_string().contains("SECRET"), "{breach}");
    // draft-07 with definitions: the schema's own draft decides.
    let refund = check(&c, "order.refunded", r#"{"refund": "ten"}"#).unwrap_err();
    assert_eq!(invalid(&refund).0, "/refund");
}

#[test]
fn formats_are_asserted() {
    let c = contracts(Unknown::Allow);
    let bad_uuid = check(&c, "OrderPlaced", r#"{"order_id": "not-a-uuid", "amount": 1}"#).unwrap_err();
    assert_eq!(invalid(&bad_uuid).1, "format");
    let bad_time =
        check(&c, "OrderPlaced", &format!(r#"{{"order_id": "{UUID}", "amount": 1, "placed_at": "yesterday"}}"#))
            .unwrap_err();
    assert_eq!(invalid(&bad_time).0, "/placed_at");
}

#[test]
fn a_payload_that_is_not_json_says_where_the_parser_stopped() {
    let c = contracts(Unknown::Allow);
    let breach = check(&c, "OrderPlaced", "{\"amount\": 1,\n  SECRET}").unwrap_err();
    assert_eq!(breach.reason, BreachReason::NotJson { line: 2, column: 3 });
    assert!(!breach.to_string().contains("SECRET"), "{breach}");
}

#[test]
fn unknown_event_types_follow_contracts_unknown() {
    let allow = contracts(Unknown::Allow);
    assert_eq!(check(&allow, "InvoiceSent", "not even json"), Ok(()));
    assert_eq!(allow.validate(None, b"{}"), Ok(()));
    let refuse = contracts(Unknown::Refuse);
    let breach = check(&refuse, "InvoiceSent", "{}").unwrap_err();
    assert_eq!(breach, Breach { schema: None, reason: BreachReason::NoContract });
    assert!(breach.to_string().contains("contracts.dir holds no schema for its event type"), "{breach}");
    assert_eq!(refuse.validate(None, b"{}").unwrap_err().reason, BreachReason::NoEventType);
}

#[test]
fn schemas_that_cannot_be_contracts_are_refused_with_the_file() {
    let not_json = Contracts::new(vec![schema("A", "{\"type\": ")], Unknown::Allow, "t").unwrap_err();
    assert!(matches!(&not_json, LoadError::NotJson { name, line: 1, .. } if name == "A.json"), "{not_json}");
    let not_schema = Contracts::new(vec![schema("A", r#"{"type": 5}"#)], Unknown::Allow, "t").unwrap_err();
    assert!(matches!(&not_schema, LoadError::NotASchema { name, .. } if name == "A.json"), "{not_schema}");
    let remote = r#"{"$ref": "https://schemas.example.com/order.json"}"#;
    let remote = Contracts::new(vec![schema("A", remote)], Unknown::Allow, "t").unwrap_err();
    assert!(matches!(remote, LoadError::NotASchema { .. }), "{remote}");
    let twice = Contracts::new(vec![schema("A", "{}"), schema("A", "true")], Unknown::Allow, "t").unwrap_err();
    assert!(matches!(twice, LoadError::Duplicate { .. }), "{twice}");
    assert!(twice.to_string().contains("are both for event type A"), "{twice}");
}

#[test]
fn hostile_payloads_end_in_a_breach_not_a_crash() {
    let c = contracts(Unknown::Allow);
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(matches!(check(&c, "OrderPlaced", &deep).unwrap_err().reason, BreachReason::NotJson { .. }));
    // About 10 MB: 200,000 order lines, the last one without its sku.
    let mut lines = vec![r#"{"sku": "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFGHIJ"}"#; 199_999].join(",");
    lines.push_str(r#",{"qty": 1}"#);
    let big = format!(r#"{{"order_id": "{UUID}", "amount": 1, "lines": [{lines}]}}"#);
    assert!(big.len() > 8_000_000, "{}", big.len());
    let breach = check(&c, "OrderPlaced", &big).unwrap_err();
    assert_eq!(invalid(&breach).0, "/lines/199999");
    assert_eq!(check(&c, "OrderPlaced", ""), Err(breach_not_json(1, 0)));
    assert!(check(&c, "OrderPlaced", "\u{0}\u{ff}").is_err());
}

fn breach_not_json(line: usize, column: usize) -> Breach {
    Breach { schema: Some(Arc::from("OrderPlaced.json")), reason: BreachReason::NotJson { line, column } }
}

/// Two subschemas that refer to each other through an `anyOf`, each requiring `c`: the
/// shape of a tree whose nodes are of two kinds.
pub(crate) const TWO_KINDS: &str = r##"{"$ref": "#/$defs/a", "$defs": {
  "a": {"type": "object", "required": ["c"], "properties": {"c": {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}]}}},
  "b": {"type": "object", "required": ["c"], "properties": {"c": {"anyOf": [{"$ref": "#/$defs/b"}, {"$ref": "#/$defs/a"}]}}}}}"##;

/// `{"c": ... {"c": {}} ...}`: `depth` objects around an empty one.
pub(crate) fn nested_c(depth: usize) -> String {
    format!("{}{{}}{}", r#"{"c":"#.repeat(depth), "}".repeat(depth))
}

#[test]
fn a_recursive_anyof_is_refused_within_the_step_budget_not_in_exponential_time() {
    let c = Contracts::new(vec![schema("T", TWO_KINDS)], Unknown::Allow, "t").unwrap();
    // Depth 22 took 16 s and 7 GB before the budget (each level doubled the errors built).
    for depth in [22, 31] {
        let started = std::time::Instant::now();
        let breach = check(&c, "T", &nested_c(depth)).unwrap_err();
        let took = started.elapsed();
        let steps = Limits::steps_for(nested_c(depth).len());
        assert_eq!(breach.reason, BreachReason::TooCostly { steps }, "depth {depth}");
        assert!(took < std::time::Duration::from_secs(5), "depth {depth} took {took:?}");
        assert!(breach.to_string().contains(&format!("took more than {steps} steps")), "{breach}");
    }
    // A shallow invalid payload is still located exactly.
    let shallow = check(&c, "T", &nested_c(3)).unwrap_err();
    assert_eq!(invalid(&shallow).1, "anyOf");
}

#[test]
fn a_legitimate_recursive_payload_passes_within_the_budget() {
    let tree = r##"{"$ref": "#/$defs/node", "$defs": {"node": {"type": "object", "required": ["v"],
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}}}}}"##;
    let c = Contracts::new(vec![schema("T", tree)], Unknown::Allow, "t").unwrap();
    // 15 levels of nodes with two children each (about 32,000 nodes, 31 levels of JSON).
    fn node(depth: usize) -> String {
        if depth == 0 {
            return r#"{"v": 0}"#.into();
        }
        let kid = node(depth - 1);
        format!(r#"{{"v": {depth}, "kids": [{kid}, {kid}, null]}}"#)
    }
    let payload = node(14);
    let started = std::time::Instant::now();
    assert_eq!(check(&c, "T", &payload), Ok(()));
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
}

#[test]
fn a_payload_nested_past_max_depth_is_a_breach_and_the_limit_is_configurable() {
    let c = Contracts::new(vec![schema("T", "{}")], Unknown::Allow, "t").unwrap();
    assert_eq!(check(&c, "T", &nested_c(DEFAULT_MAX_DEPTH - 1)), Ok(()), "32 levels");
    let breach = check(&c, "T", &nested_c(DEFAULT_MAX_DEPTH)).unwrap_err();
    assert_eq!(breach.reason, BreachReason::TooDeep { limit: 32 });
    assert!(breach.to_string().contains("nests deeper than 32 levels"), "{breach}");
    let arrays = format!("{}{}", "[".repeat(33), "]".repeat(33));
    assert!(matches!(check(&c, "T", &arrays).unwrap_err().reason, BreachReason::TooDeep { .. }));
    let wide =
        Contracts::new(vec![schema("T", "{}")], Unknown::Allow, "t").unwrap().with_limits(Limits { max_depth: 40 });
    assert_eq!(check(&wide, "T", &nested_c(39)), Ok(()));
    assert!(check(&wide, "T", &nested_c(40)).is_err());
}

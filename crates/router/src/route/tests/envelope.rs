//! `envelope = "cloudevents"` and the W3C trace context, routed from rows.

use super::*;
use crate::cloudevents::{CloudEventsConfig, CloudEventsMode};
use crate::tracecontext::TraceParent;

const SOURCE: &str = "/walpost/shop/events.outbox";
const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn ce(mode: CloudEventsMode) -> RouterConfig {
    RouterConfig { cloudevents: Some(CloudEventsConfig { mode, source: SOURCE.into() }), ..RouterConfig::default() }
}

fn headers_of(r: &Record) -> Vec<(&str, &str)> {
    r.headers.iter().map(|(k, v)| (&**k, std::str::from_utf8(v).unwrap())).collect()
}

#[test]
fn binary_mode_adds_attribute_headers_and_keeps_key_value_and_partition() {
    let mut plain = router(RouterConfig::default());
    let with_time = RouterConfig { timestamp_field: Some("occurred_at".into()), ..ce(CloudEventsMode::Binary) };
    let mut r = router(with_time);
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let payload = r#"{"amount": 19900, "orderId": "o-1"}"#;
    let row = seed_row(text("order"), text("5f0c6b1e-0000-4000-8000-000000000001"), text(payload));
    let rec = r.route(&rel, &row).unwrap();
    let without = plain.route(&plain.resolve(&relation(SEED_000)).unwrap(), &row).unwrap();
    assert_eq!(
        (&rec.topic, &rec.key, &rec.value, rec.partition),
        (&without.topic, &without.key, &without.value, without.partition)
    );
    let ColumnValue::Text(original) = row.get(4).unwrap() else { panic!() };
    assert_eq!(rec.value.as_ref().unwrap().as_ptr(), original.as_ptr(), "payload bytes are not copied");
    assert_eq!(
        headers_of(&rec),
        vec![
            ("id", "42"),
            ("eventType", "OrderPlaced"),
            ("ce_specversion", "1.0"),
            ("ce_id", "42"),
            ("ce_source", SOURCE),
            ("ce_type", "OrderPlaced"),
            ("ce_time", "2026-11-29T08:00:00.25Z"),
            ("ce_subject", "5f0c6b1e-0000-4000-8000-000000000001"),
            ("content-type", "application/json"),
        ]
    );
}

/// Regression: a live record carried the commit time as `time` and a replayed
/// copy of the same event none. `time` is the timestamp column's, on every copy, or none.
#[test]
fn regression_time_is_the_timestamp_column_on_every_copy_or_none() {
    let with_column = RouterConfig { timestamp_field: Some("occurred_at".into()), ..ce(CloudEventsMode::Binary) };
    let mut r = router(with_column);
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let rec = r.route(&rel, &seed_row(text("order"), text("k"), text("{}"))).unwrap();
    assert_eq!(header(&rec, "ce_time"), Some(&b"2026-11-29T08:00:00.25Z"[..]), "the column, full precision");
    let mut r = router(ce(CloudEventsMode::Binary));
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let rec = r.route(&rel, &seed_row(text("order"), text("k"), text("{}"))).unwrap();
    assert_eq!(header(&rec, "ce_time"), None, "no timestamp column: no time, live or replayed");
}

#[test]
fn structured_mode_splices_the_payload_bytes_into_the_document() {
    let mut r = router(ce(CloudEventsMode::Structured));
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let payload = "{\"b\": 1.50,  \"a\": [1, 2], \"s\": \"\\u00e9\"}";
    let rec = r.route(&rel, &seed_row(text("order"), text("agg-1"), text(payload))).unwrap();
    let value = std::str::from_utf8(rec.value.as_deref().unwrap()).unwrap();
    assert_eq!(
        value,
        format!(
            r#"{{"specversion":"1.0","id":"42","source":"{SOURCE}","type":"OrderPlaced","subject":"agg-1","datacontenttype":"application/json","data":{payload}}}"#
        )
    );
    assert_eq!(header(&rec, "content-type"), Some(&b"application/cloudevents+json"[..]));
    assert!(rec.headers.iter().all(|(k, _)| !k.starts_with("ce_")), "structured: attributes in the value only");
    assert_eq!(header(&rec, "id"), Some(&b"42"[..]), "the id header stays for deduplication");
    assert_eq!(rec.key.as_ref(), b"agg-1");
}

#[test]
fn structured_mode_non_json_payloads() {
    let cols: &[(&str, u32)] =
        &[("id", TEXT), ("aggregate_type", TEXT), ("aggregate_id", TEXT), ("event_type", TEXT), ("payload", TEXT)];
    let mut r = router(ce(CloudEventsMode::Structured));
    let rel = r.resolve(&relation_typed(cols)).unwrap();
    let row = |p: &str| TupleData::from_values(&[text("1"), text("order"), text("k"), text("T"), text(p)]);
    let doc = |rec: Record| serde_json::from_slice::<serde_json::Value>(rec.value.as_deref().unwrap()).unwrap();
    let v = doc(r.route(&rel, &row("not \"json\"")).unwrap());
    assert_eq!((v["datacontenttype"].as_str(), v["data"].as_str()), (Some("text/plain"), Some("not \"json\"")));
    let v = doc(r.route(&rel, &row(r#"{"json": "in a text column"}"#)).unwrap());
    assert_eq!(v["datacontenttype"], "application/json");
    assert_eq!(v["data"]["json"], "in a text column");
    let mut r = router(ce(CloudEventsMode::Structured));
    let rel = r.resolve(&bytea_outbox()).unwrap();
    let row =
        TupleData::from_values(&[text("1"), text("order"), text("\\x6b"), text("T"), text("\\xff00"), text("\\x")]);
    let rec = r.route(&rel, &row).unwrap();
    let v = doc(rec.clone());
    assert_eq!(v["datacontenttype"], "application/octet-stream");
    assert_eq!(v["data_base64"], "/wA=");
    assert!(v.get("data").is_none());
    assert_eq!(v["subject"], "aw==", "a bytea key's header form (base64)");
    assert_eq!(rec.key.as_ref(), b"k");
    let mut r = router(ce(CloudEventsMode::Binary));
    let rel = r.resolve(&bytea_outbox()).unwrap();
    let rec = r.route(&rel, &row).unwrap();
    assert_eq!(rec.value.as_deref(), Some(&b"\xff\x00"[..]));
    assert_eq!(header(&rec, "content-type"), Some(&b"application/octet-stream"[..]));
}

#[test]
fn envelope_placements_are_the_data_of_a_structured_event() {
    let additional = AdditionalField::parse_list("event_type:envelope:type").unwrap();
    let mut r = router(RouterConfig { additional, ..ce(CloudEventsMode::Structured) });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let rec = r.route(&rel, &seed_row(text("order"), text("k"), text("{\"a\": 1}"))).unwrap();
    let v: serde_json::Value = serde_json::from_slice(rec.value.as_deref().unwrap()).unwrap();
    assert_eq!(v["data"], serde_json::json!({"payload": {"a": 1}, "type": "OrderPlaced"}));
}

/// A tombstone stays a tombstone (compaction deletes the key) in both modes: no value,
/// the attribute headers, no content type.
#[test]
fn tombstones_keep_a_null_value_with_attribute_headers() {
    for mode in [CloudEventsMode::Binary, CloudEventsMode::Structured] {
        let mut r = router(RouterConfig { tombstone_on_empty_payload: true, ..ce(mode) });
        let rel = r.resolve(&relation(SEED_000)).unwrap();
        let rec = r.route(&rel, &seed_row(text("order"), text("k"), ColumnValue::Null)).unwrap();
        assert_eq!(rec.value, None, "{mode:?}");
        assert_eq!(header(&rec, "ce_id"), Some(&b"42"[..]), "{mode:?}");
        assert_eq!(header(&rec, "ce_type"), Some(&b"OrderPlaced"[..]), "{mode:?}");
        assert_eq!(header(&rec, "content-type"), None, "{mode:?}");
    }
}

#[test]
fn header_collisions_and_a_missing_type_are_refused() {
    for placement in ["event_type:header:ce_type", "event_type:header:Content-Type", "event_type:header:ce_custom"] {
        let additional = AdditionalField::parse_list(placement).unwrap();
        let err = Router::new(RouterConfig { additional, ..ce(CloudEventsMode::Binary) }).unwrap_err();
        assert!(err.to_string().contains("collide with the CloudEvents headers"), "{placement}: {err}");
    }
    let additional = AdditionalField::parse_list("event_type:header:ce_type").unwrap();
    assert!(Router::new(RouterConfig { additional, ..RouterConfig::default() }).is_ok(), "no envelope, no collision");
    let err = Router::new(RouterConfig { event_type_header_field: None, ..ce(CloudEventsMode::Binary) }).unwrap_err();
    assert!(err.to_string().contains("needs an event type column"), "{err}");
    let mut empty = ce(CloudEventsMode::Binary);
    if let Some(c) = empty.cloudevents.as_mut() {
        c.source = " ".into();
    }
    assert!(Router::new(empty).unwrap_err().to_string().contains("cloudevents.source"));
    // A row's type must be there: NULL is a routing error naming the option.
    let mut r = router(ce(CloudEventsMode::Binary));
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let mut values: Vec<ColumnValue> = seed_row(text("order"), text("k"), text("{}")).iter().collect();
    values[3] = ColumnValue::Null;
    let err = r.route(&rel, &TupleData::from_values(&values)).unwrap_err();
    assert_eq!(err.class(), "null_field");
    assert!(err.to_string().contains(EVENT_TYPE_HEADER_OPTION), "{err}");
}

fn headers_outbox() -> (Router, ResolvedRelation) {
    let cols = ["id", "aggregate_id", "event_type", "payload", "headers", "trace", "aggregate_type"];
    let r = router(RouterConfig {
        headers_field: Some("headers".into()),
        tracing_field: Some("trace".into()),
        ..RouterConfig::default()
    });
    let rel = r.resolve(&relation(&cols)).unwrap();
    (r, rel)
}

fn headers_row(headers: ColumnValue, trace: ColumnValue) -> TupleData {
    TupleData::from_values(&[text("7"), text("k"), text("T"), text("{}"), headers, trace, text("order")])
}

#[test]
fn a_json_headers_key_named_like_an_envelope_header_is_a_routing_error() {
    let cols = ["id", "aggregate_id", "event_type", "payload", "headers", "trace", "aggregate_type"];
    let mut r = router(RouterConfig { headers_field: Some("headers".into()), ..ce(CloudEventsMode::Binary) });
    let rel = r.resolve(&relation(&cols)).unwrap();
    let err = r.route(&rel, &headers_row(text(r#"{"ce_source": "/evil"}"#), ColumnValue::Null)).unwrap_err();
    assert_eq!(err.class(), "bad_value");
    assert!(!err.to_string().contains("/evil"), "no value without log_values: {err}");
    assert!(r.route(&rel, &headers_row(text(r#"{"tenant": "a"}"#), ColumnValue::Null)).is_ok());
}

#[test]
fn trace_context_from_the_json_headers_column() {
    let (mut r, rel) = headers_outbox();
    let rec = r
        .route(
            &rel,
            &headers_row(text(&format!(r#"{{"traceparent": "{PARENT}", "tracestate": "rojo=1"}}"#)), ColumnValue::Null),
        )
        .unwrap();
    assert_eq!(header(&rec, "traceparent"), Some(PARENT.as_bytes()));
    assert_eq!(header(&rec, "tracestate"), Some(&b"rojo=1"[..]));
    assert_eq!(rec.trace.parent, TraceParent::parse(PARENT.as_bytes()));
    assert!(!rec.trace.invalid);
    let none = r.route(&rel, &headers_row(text("{}"), ColumnValue::Null)).unwrap();
    assert_eq!(none.trace, TraceOutcome::default());
}

/// A bad value is dropped with its tracestate, counted, and never stops the row.
#[test]
fn invalid_trace_context_is_dropped_not_fatal() {
    let (mut r, rel) = headers_outbox();
    let bad = r#"{"traceparent": "00-XYZ-00f067aa0ba902b7-01", "tracestate": "rojo=1", "tenant": "a"}"#;
    let rec = r.route(&rel, &headers_row(text(bad), ColumnValue::Null)).unwrap();
    assert_eq!(header(&rec, "traceparent"), None);
    assert_eq!(header(&rec, "tracestate"), None, "no tracestate without a valid traceparent");
    assert_eq!(header(&rec, "tenant"), Some(&b"a"[..]));
    assert!(rec.trace.invalid && rec.trace.parent.is_none());
    let bad_state = format!(r#"{{"traceparent": "{PARENT}", "tracestate": "Bad Key=1"}}"#);
    let rec = r.route(&rel, &headers_row(text(&bad_state), ColumnValue::Null)).unwrap();
    assert_eq!(header(&rec, "traceparent"), Some(PARENT.as_bytes()));
    assert_eq!(header(&rec, "tracestate"), None);
    assert!(rec.trace.invalid && rec.trace.parent.is_some());
}

/// Debezium's column (`tracing.span.context.field`): `Properties.store` text; it wins over
/// a header of the same name, and the record ends with one traceparent.
#[test]
fn trace_context_from_debeziums_column_wins() {
    let (mut r, rel) = headers_outbox();
    let column = format!("#Mon Nov 30 10:00:00 UTC 2026\ntraceparent={PARENT}\ntracestate=congo\\=t61\n");
    let other = "00-11111111111111111111111111111111-2222222222222222-00";
    let rec = r.route(&rel, &headers_row(text(&format!(r#"{{"traceparent": "{other}"}}"#)), text(&column))).unwrap();
    let parents: Vec<_> = rec.headers.iter().filter(|(k, _)| &**k == "traceparent").collect();
    assert_eq!(parents.len(), 1);
    assert_eq!(header(&rec, "traceparent"), Some(PARENT.as_bytes()));
    assert_eq!(header(&rec, "tracestate"), Some(&b"congo=t61"[..]));
    let rec = r.route(&rel, &headers_row(ColumnValue::Null, text("traceparent=garbage"))).unwrap();
    assert!(rec.trace.invalid);
    assert_eq!(header(&rec, "traceparent"), None);
}

//! Unit tests of the router: one per Event Router option and error, read side by side
//! with Debezium's option table (why one file over 600 lines).

use super::*;
use crate::options::AdditionalField;
use crate::value::parse_timestamp_ms;
use pgoutput::Column;
use std::collections::HashSet;

const TEXT: u32 = 25;
const JSONB: u32 = 3802;
const INT4: u32 = 23;
const BOOL: u32 = 16;

fn relation_typed(cols: &[(&str, u32)]) -> Relation {
    Relation {
        xid: None,
        oid: 16384,
        namespace: Bytes::from_static(b"events"),
        name: Bytes::from_static(b"outbox"),
        replica_identity: b'd',
        columns: cols
            .iter()
            .map(|(c, t)| Column {
                flags: 0,
                name: Bytes::copy_from_slice(c.as_bytes()),
                type_oid: *t,
                type_modifier: -1,
            })
            .collect(),
    }
}

fn relation(cols: &[&str]) -> Relation {
    relation_typed(&cols.iter().map(|c| (*c, if *c == "payload" { JSONB } else { TEXT })).collect::<Vec<_>>())
}

fn text(s: &str) -> ColumnValue {
    ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()))
}

fn router(c: RouterConfig) -> Router {
    Router::new(c).unwrap()
}

fn header<'a>(r: &'a Record, name: &str) -> Option<&'a [u8]> {
    r.headers.iter().find(|(k, _)| &**k == name).map(|(_, v)| v.as_ref())
}

const SEED_000: &[&str] = &[
    "id",
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "payload",
    "occurred_at",
    "published_at",
    "retry_count",
    "last_error",
    "next_retry_at",
];

fn seed_row(route: ColumnValue, key: ColumnValue, payload: ColumnValue) -> TupleData {
    TupleData::from_values(&[
        text("42"),
        route,
        key,
        text("OrderPlaced"),
        payload,
        text("2026-11-29 08:00:00.250+00"),
        ColumnValue::Null,
        text("0"),
        ColumnValue::Null,
        ColumnValue::Null,
    ])
}

#[test]
fn routes_seed_row_with_defaults() {
    let mut r = router(RouterConfig::default());
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let payload = r#"{"amount": 19900, "orderId": "o-1"}"#;
    let rec =
        r.route(&rel, &seed_row(text("order"), text("5f0c6b1e-0000-4000-8000-000000000001"), text(payload))).unwrap();
    assert_eq!(&*rec.topic, "outbox.event.order");
    assert_eq!(rec.key.as_ref(), b"5f0c6b1e-0000-4000-8000-000000000001");
    assert_eq!(rec.value.as_deref(), Some(payload.as_bytes()));
    assert_eq!(header(&rec, "id"), Some(&b"42"[..]));
    assert_eq!(header(&rec, "eventType"), Some(&b"OrderPlaced"[..]));
    assert_eq!(rec.headers.len(), 2);
    assert_eq!(rec.event_id.as_ref(), b"42");
    assert_eq!(rec.timestamp_ms, None, "commit time unless table.field.event.timestamp");
    assert_eq!(rec.partition, None);
}

/// Only the mapped columns are taken out of a row, and the row is read only as far as
/// the last of them: an unmapped unchanged-TOAST column (an error in a mapped one) is
/// not even looked at.
#[test]
fn unmapped_columns_are_not_read() {
    let mut r = router(RouterConfig::default());
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    assert_eq!(rel.used, [true; 5], "id .. payload are mapped; occurred_at .. next_retry_at are not");
    let mut values: Vec<ColumnValue> = seed_row(text("order"), text("k"), text("{}")).iter().collect();
    if let Some(published_at) = values.get_mut(6) {
        *published_at = ColumnValue::UnchangedToast;
    }
    let rec = r.route(&rel, &TupleData::from_values(&values)).unwrap();
    assert_eq!(&*rec.topic, "outbox.event.order");
    assert_eq!(rec.value.as_deref(), Some(&b"{}"[..]));
    let mut mapped_toast = values.clone();
    if let Some(payload) = mapped_toast.get_mut(4) {
        *payload = ColumnValue::UnchangedToast;
    }
    assert!(matches!(r.route(&rel, &TupleData::from_values(&mapped_toast)), Err(RouteError::UnchangedToast { .. })));
}

#[test]
fn payload_bytes_are_a_slice_of_the_row_not_a_copy() {
    let mut r = router(RouterConfig::default());
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let row = seed_row(text("order"), text("k"), text("{\"a\": 1}"));
    let rec = r.route(&rel, &row).unwrap();
    let ColumnValue::Text(original) = row.get(4).unwrap() else { panic!() };
    assert_eq!(rec.value.as_ref().unwrap().as_ptr(), original.as_ptr());
}

#[test]
fn columns_are_found_by_name_after_reordering() {
    let mut r = router(RouterConfig::default());
    let cols = ["payload", "extra", "event_type", "aggregate_id", "id", "aggregate_type"];
    let rel = r.resolve(&relation(&cols)).unwrap();
    let row = TupleData::from_values(&[text("{}"), text("x"), text("T"), text("k"), text("7"), text("billing")]);
    let rec = r.route(&rel, &row).unwrap();
    assert_eq!(&*rec.topic, "outbox.event.billing");
    assert_eq!(rec.key.as_ref(), b"k");
    assert_eq!(rec.event_id.as_ref(), b"7");
}

#[test]
fn one_column_can_fill_two_roles() {
    let mut r = router(RouterConfig { key_field: "id".into(), ..RouterConfig::default() });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let rec = r.route(&rel, &seed_row(text("order"), text("agg"), text("{}"))).unwrap();
    assert_eq!(rec.key.as_ref(), b"42");
    assert_eq!(rec.event_id.as_ref(), b"42");
}

/// Table-driven topic naming: (regex, replacement, route value) -> topic.
#[test]
fn topic_regex_and_replacement_table() {
    let cases: &[(Option<&str>, &str, &str, &str)] = &[
        (None, "outbox.event.${routedByValue}", "order", "outbox.event.order"),
        (Some(DEFAULT_TOPIC_REGEX), "${routedByValue}.events", "user", "user.events"),
        (None, "prod.${routedByValue}.events", "user", "prod.user.events"),
        (None, "all-events", "anything", "all-events"),
        (Some("(?<routedByValue>[a-z]+)_v(?<v>[0-9]+)"), "${routedByValue}.v${v}", "order_v2", "order.v2"),
        (Some("(.*)Aggregate"), "agg.$1", "OrderAggregate", "agg.Order"),
        // Java's replacement syntax: `$1` then a literal digit when there is no group 12;
        // `\$` is a literal dollar... which Kafka would refuse, so only the escape of a dot.
        (Some("(.*)Aggregate"), "agg.$12", "OrderAggregate", "agg.Order2"),
        (None, "outbox\\.$1", "order", "outbox.order"),
    ];
    for (regex, replacement, value, expected) in cases {
        let mut r = router(RouterConfig {
            topic_regex: regex.map(str::to_owned),
            topic_pattern: replacement.to_string(),
            topics_allow: Some(vec!["*".into()]),
            ..RouterConfig::default()
        });
        let rel = r.resolve(&relation(SEED_000)).unwrap();
        let rec = r.route(&rel, &seed_row(text(value), text("k"), text("{}"))).unwrap();
        assert_eq!(&*rec.topic, *expected, "{regex:?} {replacement} {value}");
    }
    assert!(matches!(
        Router::new(RouterConfig { topic_regex: Some("(".into()), ..RouterConfig::default() }),
        Err(RouteError::BadRegex(_))
    ));
    for (pattern, regex) in
        [("agg.$2", "(.*)Aggregate"), ("agg.${nope}", "(.*)"), ("agg.$x", "(.*)"), ("agg\\", "(.*)")]
    {
        let err = Router::new(RouterConfig {
            topic_regex: Some(regex.into()),
            topic_pattern: pattern.into(),
            topics_allow: Some(vec!["agg.".into()]),
            ..RouterConfig::default()
        })
        .unwrap_err();
        assert_eq!(err.class(), "invalid_option", "{pattern}: {err}");
        assert!(err.to_string().starts_with("route.topic.replacement: "), "{err}");
    }
}

#[test]
fn tombstone_on_empty_payload_both_ways() {
    for payload in [ColumnValue::Null, text("")] {
        let mut off = router(RouterConfig::default());
        let rel = off.resolve(&relation(SEED_000)).unwrap();
        let err = off.route(&rel, &seed_row(text("order"), text("k"), payload.clone())).unwrap_err();
        assert_eq!(err.class(), "empty_payload", "{err}");
        assert!(err.to_string().contains("route.tombstone.on.empty.payload"));
        let mut on = router(RouterConfig { tombstone_on_empty_payload: true, ..RouterConfig::default() });
        let rec = on.route(&rel, &seed_row(text("order"), text("k"), payload)).unwrap();
        assert_eq!(rec.value, None, "a tombstone keeps its key");
        assert_eq!(rec.key.as_ref(), b"k");
    }
}

#[test]
fn timestamp_field_sets_the_record_timestamp() {
    let mut r = router(RouterConfig { timestamp_field: Some("occurred_at".into()), ..RouterConfig::default() });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let rec = r.route(&rel, &seed_row(text("order"), text("k"), text("{}"))).unwrap();
    assert_eq!(rec.timestamp_ms, Some(1_795_939_200_250));
}

#[test]
fn timestamp_parsing_table() {
    let cases: &[(&str, Option<i64>)] = &[
        ("1970-01-01 00:00:00+00", Some(0)),
        ("1970-01-01 00:00:01.5+00", Some(1500)),
        ("2000-01-01 00:00:00", Some(946_684_800_000)),
        ("2026-11-29 09:00:00+01", Some(1_795_939_200_000)),
        ("2026-11-29 13:30:00+05:30", Some(1_795_939_200_000)),
        ("2026-11-29 02:30:00-05:30", Some(1_795_939_200_000)),
        ("2026-11-29 07:59:50-00:00:10", Some(1_795_939_200_000)),
        ("2024-02-29 12:00:00.123456+00", Some(1_709_208_000_123)),
        ("2024-02-29 12:00:00.123+00", Some(1_709_208_000_123)),
        ("2024-02-29T12:00:00.999999Z", Some(1_709_208_000_999)),
        ("1969-12-31 23:59:59+00", Some(-1000)),
        ("2026-13-01 00:00:00+00", None),
        ("2026-02-30 00:00:00+00", None),
        ("2026-11-29 24:00:01+00", None),
        ("0044-03-15 12:00:00+00 BC", None),
        ("not a time", None),
        ("", None),
    ];
    for (text, expected) in cases {
        assert_eq!(parse_timestamp_ms(text.as_bytes()).ok(), *expected, "{text}");
    }
    for infinite in ["infinity", "-infinity"] {
        let err = parse_timestamp_ms(infinite.as_bytes()).unwrap_err();
        assert!(err.contains("finite"), "{infinite}: {err}");
    }
}

#[test]
fn additional_placement_parsing() {
    let parsed =
        AdditionalField::parse_list("event_type:header:eventType, tenant:envelope, shard:partition,trace:header")
            .unwrap();
    assert_eq!(
        parsed,
        vec![
            AdditionalField { column: "event_type".into(), placement: Placement::Header("eventType".into()) },
            AdditionalField { column: "tenant".into(), placement: Placement::Envelope("tenant".into()) },
            AdditionalField { column: "shard".into(), placement: Placement::Partition },
            AdditionalField { column: "trace".into(), placement: Placement::Header("trace".into()) },
        ]
    );
    for bad in ["x", "x:body", ":header", "a:header:b:c", "a::header"] {
        assert!(AdditionalField::parse_list(bad).is_err(), "{bad}");
    }
}

#[test]
fn additional_header_envelope_and_partition() {
    let cols = [
        ("id", TEXT),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", JSONB),
        ("tenant", TEXT),
        ("version", INT4),
        ("urgent", BOOL),
        ("shard", INT4),
    ];
    let mut r = router(RouterConfig {
        event_type_header_field: None,
        additional: AdditionalField::parse_list(
            "event_type:header:type,tenant:envelope,version:envelope:v,urgent:envelope,shard:partition",
        )
        .unwrap(),
        ..RouterConfig::default()
    });
    let rel = r.resolve(&relation_typed(&cols)).unwrap();
    let row = TupleData::from_values(&[
        text("1"),
        text("order"),
        text("k"),
        text("Created"),
        text(r#"{"a": [1, 2]}"#),
        text("ac\"me"),
        text("3"),
        text("t"),
        text("2"),
    ]);
    let rec = r.route(&rel, &row).unwrap();
    assert_eq!(header(&rec, "type"), Some(&b"Created"[..]));
    assert_eq!(header(&rec, "eventType"), None);
    assert_eq!(rec.partition, Some(2));
    let value = String::from_utf8(rec.value.unwrap().to_vec()).unwrap();
    assert_eq!(value, r#"{"payload":{"a": [1, 2]},"tenant":"ac\"me","v":3,"urgent":true}"#);
    let v: serde_json::Value = serde_json::from_str(&value).unwrap();
    assert_eq!(v["payload"]["a"][1], 2);
}

#[test]
fn bad_partition_value_is_an_error() {
    let mut r = router(RouterConfig {
        additional: AdditionalField::parse_list("event_type:partition").unwrap(),
        ..RouterConfig::default()
    });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let err = r.route(&rel, &seed_row(text("order"), text("k"), text("{}"))).unwrap_err();
    assert_eq!(err.class(), "bad_value");
    assert!(err.to_string().contains("partition"), "{err}");
}

#[test]
fn missing_additional_column_error_or_ignore() {
    let additional = AdditionalField::parse_list("nope:header").unwrap();
    let strict = router(RouterConfig { additional: additional.clone(), ..RouterConfig::default() });
    let err = strict.resolve(&relation(SEED_000)).unwrap_err();
    assert!(
        err.to_string().contains("\"nope\"") && err.to_string().contains("table.fields.additional.placement"),
        "{err}"
    );
    let lenient = router(RouterConfig { additional, additional_missing_ignore: true, ..RouterConfig::default() });
    assert!(lenient.resolve(&relation(SEED_000)).is_ok());
}

#[test]
fn json_headers_column_expands_and_keeps_traceparent() {
    let cols = ["id", "aggregate_id", "type", "payload", "headers", "created_at", "aggregate_type"];
    let mut r = router(RouterConfig {
        event_type_header_field: Some("type".into()),
        headers_field: Some("headers".into()),
        ..RouterConfig::default()
    });
    let rel = r.resolve(&relation(&cols)).unwrap();
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let row = TupleData::from_values(&[
        text("6f1b..."),
        text("order-1"),
        text("OrderPlaced"),
        text("{}"),
        text(&format!(r#"{{"traceparent": "{traceparent}", "attempt": 2, "tenant": "acme"}}"#)),
        text("2026-11-29 08:00:00+00"),
        text("order"),
    ]);
    let rec = r.route(&rel, &row).unwrap();
    assert_eq!(header(&rec, "traceparent"), Some(traceparent.as_bytes()));
    assert_eq!(header(&rec, "attempt"), Some(&b"2"[..]));
    assert_eq!(header(&rec, "tenant"), Some(&b"acme"[..]));
    assert_eq!(header(&rec, "eventType"), Some(&b"OrderPlaced"[..]));
    let bad = TupleData::from_values(&[
        text("1"),
        text("o"),
        text("T"),
        text("{}"),
        text("[1,2]"),
        text("2026-11-29 08:00:00+00"),
        text("order"),
    ]);
    assert_eq!(r.route(&rel, &bad).unwrap_err().class(), "bad_value");
}

#[test]
fn missing_column_names_table_column_and_key() {
    let r = router(RouterConfig::default());
    let err = r.resolve(&relation(&["id", "aggregate_type", "payload", "event_type"])).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("events.outbox") && msg.contains("aggregate_id") && msg.contains("table.field.event.key"),
        "{msg}"
    );
}

#[test]
fn null_key_or_route_is_an_error_not_a_skip() {
    let mut r = router(RouterConfig::default());
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let err = r.route(&rel, &seed_row(text("order"), ColumnValue::Null, text("{}"))).unwrap_err();
    assert!(matches!(err, RouteError::NullField { ref column, .. } if column == "aggregate_id"), "{err}");
    let err = r.route(&rel, &seed_row(ColumnValue::Null, text("k"), text("{}"))).unwrap_err();
    assert!(matches!(err, RouteError::NullField { ref column, .. } if column == "aggregate_type"), "{err}");
}

#[test]
fn invalid_topic_after_substitution() {
    let mut r = router(RouterConfig::default());
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    for bad in ["order lines", "주문", "a/b"] {
        let err = r.route(&rel, &seed_row(text(bad), text("k"), text("{}"))).unwrap_err();
        assert!(matches!(err, RouteError::InvalidTopic { .. }), "{bad:?}: {err}");
    }
    let long = "x".repeat(240);
    let err = r.route(&rel, &seed_row(text(&long), text("k"), text("{}"))).unwrap_err();
    assert!(err.to_string().contains("249"), "{err}");
}

#[test]
fn column_count_mismatch_is_an_error() {
    let mut r = router(RouterConfig::default());
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let short = TupleData::from_values(&[text("1")]);
    assert!(matches!(r.route(&rel, &short), Err(RouteError::ColumnCountMismatch { .. })));
}

#[test]
fn topic_cache_stays_bounded() {
    let mut r = router(RouterConfig { topics_max: usize::MAX, ..RouterConfig::default() });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    for i in 0..(TOPIC_CACHE_LIMIT + 10) {
        let rec = r.route(&rel, &seed_row(text(&format!("t{i}")), text("k"), text("{}"))).unwrap();
        assert_eq!(&*rec.topic, format!("outbox.event.t{i}"));
    }
    assert!(r.topics.len() <= TOPIC_CACHE_LIMIT);
}

#[test]
fn json_messages_route_with_the_same_options() {
    let mut r = router(RouterConfig { event_type_header_field: Some("type".into()), ..RouterConfig::default() });
    let content = Bytes::from_static(
        br#"{"id": 17, "aggregate_type": "order", "aggregate_id": "o-1", "type": "OrderPlaced", "payload": {"total": 5, "s": "a\"b"}}"#,
    );
    let rec = r.route_json(&content, "message prefix outbox", None).unwrap();
    assert_eq!(&*rec.topic, "outbox.event.order");
    assert_eq!(rec.key.as_ref(), b"o-1");
    assert_eq!(rec.event_id.as_ref(), b"17");
    assert_eq!(rec.value.as_deref(), Some(&br#"{"total": 5, "s": "a\"b"}"#[..]));
    assert_eq!(header(&rec, "eventType"), Some(&b"OrderPlaced"[..]));
    // The payload is a slice of the message content, not a copy.
    let v = rec.value.unwrap();
    assert!(v.as_ptr() >= content.as_ptr() && v.as_ptr() < content.as_ptr().wrapping_add(content.len()));
    let err = r
        .route_json(&Bytes::from_static(br#"{"id": 1, "aggregate_type": "x", "payload": {}}"#), "m", None)
        .unwrap_err();
    assert_eq!(err.class(), "null_field");
    assert_eq!(r.route_json(&Bytes::from_static(b"[1]"), "m", None).unwrap_err().class(), "bad_value");
    assert_eq!(r.route_json(&Bytes::from_static(b"not json"), "m", None).unwrap_err().class(), "bad_value");
}

#[test]
fn salvage_reads_what_it_can() {
    let mut r = router(RouterConfig::default());
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let row = seed_row(ColumnValue::Null, text("k"), text("{}"));
    assert!(r.route(&rel, &row).is_err());
    let (id, key, payload) = r.salvage(&rel, &row);
    assert_eq!(
        (id.as_deref(), key.as_deref(), payload.as_deref()),
        (Some(&b"42"[..]), Some(&b"k"[..]), Some(&b"{}"[..]))
    );
}

/// Regression (found end to end): a row of an outbox table whose placement
/// column was dropped while streaming was dead-lettered without its event id, key and
/// value, though the table still had them: nothing identified the event.
#[test]
fn regression_salvage_of_a_relation_that_does_not_resolve() {
    let config =
        RouterConfig { additional: AdditionalField::parse_list("extra:envelope").unwrap(), ..RouterConfig::default() };
    let r = router(config);
    let rel = relation(SEED_000);
    assert_eq!(r.resolve(&rel).unwrap_err().class(), "missing_column");
    let row = seed_row(text("order"), text("k"), text("{}"));
    let (id, key, payload) = r.salvage_unresolved(&r.salvage_columns(&rel), &row);
    assert_eq!(
        (id.as_deref(), key.as_deref(), payload.as_deref()),
        (Some(&b"42"[..]), Some(&b"k"[..]), Some(&b"{}"[..]))
    );
    // Columns the table lacks are left out, not guessed.
    let r = router(RouterConfig { id_field: "event_id".into(), ..RouterConfig::default() });
    let (id, key, _) = r.salvage_unresolved(&r.salvage_columns(&rel), &row);
    assert_eq!((id, key.as_deref()), (None, Some(&b"k"[..])));
}

// ---- regressions of the Debezium conformance review (written before the fixes) ----

const BYTEA: u32 = 17;

fn bytea_outbox() -> Relation {
    relation_typed(&[
        ("id", TEXT),
        ("aggregate_type", TEXT),
        ("aggregate_id", BYTEA),
        ("event_type", TEXT),
        ("payload", BYTEA),
        ("blob", BYTEA),
    ])
}

#[test]
fn regression_bytea_key_and_value_are_raw_bytes_in_hex_and_escape_output() {
    let mut r = router(RouterConfig::default());
    let rel = r.resolve(&bytea_outbox()).unwrap();
    // bytea_output = hex: '\x' then two hex digits per byte.
    let row = TupleData::from_values(&[
        text("1"),
        text("order"),
        text(r"\x6b2d01"),
        text("T"),
        text(r"\x00ff7b7d"),
        ColumnValue::Null,
    ]);
    let rec = r.route(&rel, &row).unwrap();
    assert_eq!(rec.key.as_ref(), b"k-\x01");
    assert_eq!(rec.value.as_deref(), Some(&b"\x00\xff{}"[..]));
    // bytea_output = escape: printable bytes as themselves, '\\' for a backslash, '\ooo' octal.
    let row = TupleData::from_values(&[
        text("2"),
        text("order"),
        text(r"k\\\001"),
        text("T"),
        text(r"\000a b\377"),
        ColumnValue::Null,
    ]);
    let rec = r.route(&rel, &row).unwrap();
    assert_eq!(rec.key.as_ref(), b"k\\\x01");
    assert_eq!(rec.value.as_deref(), Some(&b"\x00a b\xff"[..]));
}

#[test]
fn regression_bytea_in_an_envelope_is_base64() {
    let mut r = router(RouterConfig {
        additional: AdditionalField::parse_list("blob:envelope").unwrap(),
        ..RouterConfig::default()
    });
    let rel = r.resolve(&bytea_outbox()).unwrap();
    let row =
        TupleData::from_values(&[text("1"), text("order"), text("k"), text("T"), text(r"\x7b7d"), text(r"\x6120ff")]);
    let rec = r.route(&rel, &row).unwrap();
    let v: serde_json::Value = serde_json::from_slice(rec.value.as_deref().unwrap()).unwrap();
    assert_eq!(v, serde_json::json!({"payload": "e30=", "blob": "YSD/"}));
}

#[test]
fn regression_tombstone_on_empty_payload_with_an_envelope_placement() {
    let mut r = router(RouterConfig {
        tombstone_on_empty_payload: true,
        additional: AdditionalField::parse_list("event_type:envelope:type").unwrap(),
        ..RouterConfig::default()
    });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    for payload in [ColumnValue::Null, text("")] {
        let rec = r.route(&rel, &seed_row(text("order"), text("k"), payload)).unwrap();
        assert_eq!(rec.value, None, "a tombstone, not an envelope around a null payload");
        assert_eq!(rec.key.as_ref(), b"k");
    }
}

#[test]
fn regression_boolean_header_is_true_or_false() {
    let cols = [
        ("id", TEXT),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", JSONB),
        ("urgent", BOOL),
    ];
    let mut r = router(RouterConfig {
        additional: AdditionalField::parse_list("urgent:header").unwrap(),
        ..RouterConfig::default()
    });
    let rel = r.resolve(&relation_typed(&cols)).unwrap();
    for (pg, kafka) in [("t", "true"), ("f", "false")] {
        let row = TupleData::from_values(&[text("1"), text("order"), text("k"), text("T"), text("{}"), text(pg)]);
        let rec = r.route(&rel, &row).unwrap();
        assert_eq!(header(&rec, "urgent"), Some(kafka.as_bytes()));
    }
}

#[test]
fn regression_envelope_shape_is_decided_by_configuration_not_by_the_row() {
    let mut r = router(RouterConfig {
        additional: AdditionalField::parse_list("nope:envelope:alias").unwrap(),
        additional_missing_ignore: true,
        ..RouterConfig::default()
    });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    let rec = r.route(&rel, &seed_row(text("order"), text("k"), text("{\"a\": 1}"))).unwrap();
    let v: serde_json::Value = serde_json::from_slice(rec.value.as_deref().unwrap()).unwrap();
    assert_eq!(v, serde_json::json!({"payload": {"a": 1}}), "an envelope without the missing field");
}

#[test]
fn regression_empty_additional_placement_is_refused() {
    for text in ["", " ", ",", "a:header,,b:header"] {
        let err = AdditionalField::parse_list(text).unwrap_err();
        assert!(err.contains("table.fields.additional.placement"), "{text:?}: {err}");
    }
}

// ---- regressions of the security review: what a row may choose ----

#[test]
fn regression_a_row_cannot_route_outside_topics_allow() {
    // Before: a value route.topic.regex did not match became the topic as it was.
    let config =
        RouterConfig { topic_regex: Some("(?<routedByValue>[a-z]+)Aggregate".into()), ..RouterConfig::default() };
    let mut strict = router(config.clone());
    let rel = strict.resolve(&relation(SEED_000)).unwrap();
    let rec = strict.route(&rel, &seed_row(text("orderAggregate"), text("k"), text("{}"))).unwrap();
    assert_eq!(&*rec.topic, "outbox.event.order");
    let err = strict.route(&rel, &seed_row(text("billing.payments"), text("k"), text("{}"))).unwrap_err();
    assert_eq!(err.class(), "route_no_match", "{err}");
    assert!(err.to_string().contains("route.topic.regex.fallthrough"), "{err}");
    // Debezium's use-as-is, on request, still inside the guard.
    let mut lenient = router(RouterConfig { topic_regex_fallthrough: true, ..config.clone() });
    let err = lenient.route(&rel, &seed_row(text("billing.payments"), text("k"), text("{}"))).unwrap_err();
    assert_eq!(err.class(), "topic_not_allowed", "{err}");
    let rec = lenient.route(&rel, &seed_row(text("outbox.event.legacy"), text("k"), text("{}"))).unwrap();
    assert_eq!(&*rec.topic, "outbox.event.legacy");
    let mut open = router(RouterConfig {
        topic_regex_fallthrough: true,
        topics_allow: Some(vec!["outbox.".into(), "re:billing\\.[a-z]+".into()]),
        ..config
    });
    let rec = open.route(&rel, &seed_row(text("billing.payments"), text("k"), text("{}"))).unwrap();
    assert_eq!(&*rec.topic, "billing.payments");
}

/// Regression: 300 distinct route values created 300 topics. A router
/// opens at most `topics.max` topics; a row that would open one more is a routing error
/// (halt or dead letter), and the topics already open keep working.
#[test]
fn regression_rows_cannot_open_topics_without_bound() {
    let mut r = router(RouterConfig { topics_max: 3, ..RouterConfig::default() });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    for t in ["a", "b", "c", "a"] {
        r.route(&rel, &seed_row(text(t), text("k"), text("{}"))).unwrap();
    }
    let err = r.route(&rel, &seed_row(text("d"), text("k"), text("{}"))).unwrap_err();
    assert_eq!(err.class(), "too_many_topics", "{err}");
    assert!(err.to_string().contains("topics.max is 3") && err.event_id() == Some("42"), "{err}");
    assert_eq!(&*r.route(&rel, &seed_row(text("b"), text("k"), text("{}"))).unwrap().topic, "outbox.event.b");
}

/// Regression: with `topics.allow = ["*"]` a row could route to walpost's own
/// dead-letter or progress topic.
#[test]
fn regression_a_row_cannot_route_to_walposts_own_topics() {
    let mut r = router(RouterConfig {
        topic_pattern: "${routedByValue}".into(),
        topics_allow: Some(vec!["*".into()]),
        reserved_topics: vec!["walpost.dead_letter".into(), "walpost.progress".into()],
        ..RouterConfig::default()
    });
    let rel = r.resolve(&relation(SEED_000)).unwrap();
    for own in ["walpost.dead_letter", "walpost.progress"] {
        let err = r.route(&rel, &seed_row(text(own), text("k"), text("{}"))).unwrap_err();
        assert_eq!(err.class(), "topic_not_allowed", "{err}");
        assert!(err.to_string().contains("walpost's own topics"), "{err}");
    }
    assert!(r.route(&rel, &seed_row(text("orders"), text("k"), text("{}"))).is_ok());
}

/// Regression: a headers column could add a second `id`, `eventType` or `walpost.*`
/// header, or a value with a line break.
#[test]
fn regression_a_headers_column_cannot_shadow_walposts_headers() {
    let cols = ["id", "aggregate_id", "type", "payload", "headers", "created_at", "aggregate_type"];
    let mut r = router(RouterConfig {
        event_type_header_field: Some("type".into()),
        headers_field: Some("headers".into()),
        ..RouterConfig::default()
    });
    let rel = r.resolve(&relation(&cols)).unwrap();
    let row = |headers: &str| {
        TupleData::from_values(&[
            text("7"),
            text("o"),
            text("T"),
            text("{}"),
            text(headers),
            text("2026-11-29 08:00:00+00"),
            text("order"),
        ])
    };
    for bad in [
        r#"{"id": "1"}"#,
        r#"{"eventType": "Forged"}"#,
        r#"{"walpost.replay": "x"}"#,
        r#"{"note": "a
b"}"#,
        r#"{"note": "a
Set-Cookie: x"}"#,
        r#"{"": "x"}"#,
        r#"{"a
b": "x"}"#,
    ] {
        let err = r.route(&rel, &row(bad)).unwrap_err();
        assert_eq!(err.class(), "bad_value", "{bad}: {err}");
    }
    let rec = r.route(&rel, &row(r#"{"tenant": "acme"}"#)).unwrap();
    assert_eq!(header(&rec, "tenant"), Some(&b"acme"[..]));
}

#[test]
fn regression_a_row_cannot_route_to_a_kafka_internal_topic() {
    for (pattern, value) in [("${routedByValue}", "__consumer_offsets"), ("_${routedByValue}", "_transaction_state")] {
        let mut r = router(RouterConfig {
            topic_pattern: pattern.into(),
            topics_allow: Some(vec!["*".into()]),
            ..RouterConfig::default()
        });
        let rel = r.resolve(&relation(SEED_000)).unwrap();
        let err = r.route(&rel, &seed_row(text(value), text("k"), text("{}"))).unwrap_err();
        assert_eq!(err.class(), "topic_not_allowed", "{err}");
        assert!(err.to_string().contains("'__'"), "{err}");
        assert_eq!(err.event_id(), Some("42"));
    }
}

/// The message of every RouteError variant, produced the way the router produces it, with
/// a canary in the row: absent unless log_values, present with it where a value applies.
#[test]
fn regression_errors_carry_no_column_value_unless_log_values() {
    const CANARY: &str = "canary-secret@example.com";
    const CANARY_TOPIC: &str = "canary-secret.example.com";
    fn variant(e: &RouteError) -> &'static str {
        match e {
            RouteError::MissingColumn { .. } => "MissingColumn",
            RouteError::NullField { .. } => "NullField",
            RouteError::EmptyPayload { .. } => "EmptyPayload",
            RouteError::UnchangedToast { .. } => "UnchangedToast",
            RouteError::InvalidTopic { .. } => "InvalidTopic",
            RouteError::TopicNotAllowed { .. } => "TopicNotAllowed",
            RouteError::TooManyTopics { .. } => "TooManyTopics",
            RouteError::TooLarge { .. } => "TooLarge",
            RouteError::RouteNoMatch { .. } => "RouteNoMatch",
            RouteError::ColumnCountMismatch { .. } => "ColumnCountMismatch",
            RouteError::BadValue { .. } => "BadValue",
            RouteError::ContractBroken { .. } => "ContractBroken",
            RouteError::ContractUnavailable { .. } => "ContractUnavailable",
            RouteError::BadRegex(_) => "BadRegex",
            RouteError::InvalidOption { .. } => "InvalidOption",
        }
    }
    const VARIANTS: usize = 15;
    let cols = [
        ("id", TEXT),
        ("aggregate_type", TEXT),
        ("aggregate_id", TEXT),
        ("event_type", TEXT),
        ("payload", JSONB),
        ("occurred_at", 1184),
        ("shard", INT4),
        ("urgent", BOOL),
        ("headers", JSONB),
    ];
    // id 42, route, key, type, payload, timestamp, partition, bool header, JSON headers.
    let row = |values: [ColumnValue; 9]| TupleData::from_values(&values);
    let canary = || text(CANARY);
    let good = || {
        [
            text("42"),
            text("order"),
            canary(),
            canary(),
            text("{\"email\": \"canary-secret@example.com\"}"),
            text("2026-11-29 08:00:00+00"),
            text("1"),
            text("t"),
            text("{}"),
        ]
    };
    for log_values in [false, true] {
        let config = RouterConfig {
            log_values,
            timestamp_field: Some("occurred_at".into()),
            headers_field: Some("headers".into()),
            additional: AdditionalField::parse_list("shard:partition,urgent:header").unwrap(),
            ..RouterConfig::default()
        };
        let mut r = router(config.clone());
        let rel = r.resolve(&relation_typed(&cols)).unwrap();
        assert!(r.route(&rel, &row(good())).is_ok());
        let with = |i: usize, v: ColumnValue| {
            let mut values = good();
            values[i] = v;
            row(values)
        };
        // (error, canary that must not leak, whether a value applies)
        let mut cases: Vec<(RouteError, &str, bool)> = vec![
            (r.resolve(&relation(&["id", "aggregate_type", "payload", "event_type"])).unwrap_err(), CANARY, false),
            (r.route(&rel, &with(2, ColumnValue::Null)).unwrap_err(), CANARY, false),
            (r.route(&rel, &with(4, text("  "))).unwrap_err(), CANARY, false),
            (r.route(&rel, &with(2, ColumnValue::UnchangedToast)).unwrap_err(), CANARY, false),
            (r.route(&rel, &with(1, canary())).unwrap_err(), CANARY, true),
            (r.route(&rel, &TupleData::from_values(&[canary()])).unwrap_err(), CANARY, false),
            (r.route(&rel, &with(5, canary())).unwrap_err(), CANARY, true),
            (r.route(&rel, &with(6, canary())).unwrap_err(), CANARY, true),
            (r.route(&rel, &with(7, canary())).unwrap_err(), CANARY, true),
            (r.route(&rel, &with(8, canary())).unwrap_err(), CANARY, true),
            (
                r.route_json(&Bytes::from_static(b"canary-secret@example.com"), "message prefix m", None).unwrap_err(),
                CANARY,
                true,
            ),
            (Router::new(RouterConfig { topic_regex: Some("(".into()), ..config.clone() }).unwrap_err(), CANARY, false),
            (Router::new(RouterConfig { topics_allow: Some(vec![]), ..config.clone() }).unwrap_err(), CANARY, false),
        ];
        let mut no_match =
            router(RouterConfig { topic_regex: Some("(?<routedByValue>[a-z]+)".into()), ..config.clone() });
        cases.push((no_match.route(&rel, &with(1, canary())).unwrap_err(), CANARY, true));
        let mut fallthrough = router(RouterConfig {
            topic_regex: Some("(?<routedByValue>[a-z]+)".into()),
            topic_regex_fallthrough: true,
            ..config.clone()
        });
        cases.push((fallthrough.route(&rel, &with(1, text(CANARY_TOPIC))).unwrap_err(), CANARY_TOPIC, true));
        let mut capped = router(RouterConfig { topics_max: 1, ..config.clone() });
        assert!(capped.route(&rel, &row(good())).is_ok());
        cases.push((capped.route(&rel, &with(1, text(CANARY_TOPIC))).unwrap_err(), CANARY_TOPIC, true));
        // A payload its contract refuses: the breach names a pointer, never the value.
        // Its event type (a column value) is shown only with a schema for it, or log_values.
        let mut checked = router(RouterConfig { contract: Some(contract::refusing(None)), ..config.clone() });
        cases.push((checked.route(&rel, &with(3, canary())).unwrap_err(), CANARY, true));
        let mut schema = router(RouterConfig { contract: Some(contract::refusing(Some("x.json"))), ..config.clone() });
        cases.push((schema.route(&rel, &with(3, text("OrderPlaced"))).unwrap_err(), CANARY, false));
        let mut down = router(RouterConfig { contract: Some(contract::unavailable()), ..config.clone() });
        cases.push((down.route(&rel, &row(good())).unwrap_err(), CANARY, false));
        // Made by the binary for a row too large to read (no value to show).
        cases.push((
            RouteError::TooLarge { table: "events.outbox".into(), event_id: Some("42".into()), size: 9, limit: 8 },
            CANARY,
            false,
        ));
        let mut seen = HashSet::new();
        for (err, secret, value_applies) in &cases {
            seen.insert(variant(err));
            let message = err.to_string();
            if log_values && *value_applies {
                assert!(message.contains(secret), "log_values shows the value: {message}");
            } else {
                assert!(!message.contains(secret), "log_values = {log_values}: {message}");
            }
            if err.event_id().is_some() {
                assert!(message.contains("event id 42"), "{message}");
            }
        }
        assert_eq!(seen.len(), VARIANTS, "every variant is rendered: {seen:?}");
    }
}

mod contract;
mod envelope;

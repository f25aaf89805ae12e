//! Properties: no input panics the router, and bytea's two text outputs decode to the bytes.

use bytes::Bytes;
use pgoutput::{Column, ColumnValue, Relation, TupleData};
use proptest::prelude::*;

use crate::config::RouterConfig;
use crate::options::AdditionalField;
use crate::route::Router;
use crate::value::{decode_bytea, oid};

/// PostgreSQL's `bytea_output = hex`.
fn hex_output(bytes: &[u8]) -> String {
    let mut s = String::from("\\x");
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// PostgreSQL's `bytea_output = escape`: printable ASCII as itself, `\\`, others `\ooo`.
fn escape_output(bytes: &[u8]) -> String {
    let mut s = String::new();
    for b in bytes {
        match b {
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(char::from(*b)),
            _ => s.push_str(&format!("\\{b:03o}")),
        }
    }
    s
}

fn any_value() -> impl Strategy<Value = ColumnValue> {
    prop_oneof![
        Just(ColumnValue::Null),
        Just(ColumnValue::UnchangedToast),
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(|b| ColumnValue::Text(Bytes::from(b))),
        "[ -~]{0,24}".prop_map(|s| ColumnValue::Text(Bytes::from(s))),
        proptest::collection::vec(any::<u8>(), 0..8).prop_map(|b| ColumnValue::Binary(Bytes::from(b))),
    ]
}

const ENVELOPE_START: &[u8] = b"{\"payload\":";

const TYPES: &[u32] = &[
    oid::TEXT,
    oid::JSONB,
    oid::INT4,
    oid::FLOAT8,
    oid::BOOL,
    oid::BYTEA,
    oid::TIMESTAMP,
    oid::TIMESTAMPTZ,
    oid::DATE,
];

proptest! {
    #[test]
    fn bytea_text_outputs_decode_to_the_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        prop_assert_eq!(decode_bytea(&Bytes::from(hex_output(&bytes))).ok(), Some(Bytes::from(bytes.clone())));
        prop_assert_eq!(decode_bytea(&Bytes::from(escape_output(&bytes))).ok(), Some(Bytes::from(bytes)));
    }

    #[test]
    fn any_row_of_any_column_types_routes_or_errs_without_panicking(
        types in proptest::collection::vec(proptest::sample::select(TYPES), 8),
        values in proptest::collection::vec(any_value(), 8),
        typmod in -1i32..8,
        tombstones: bool,
        envelope: bool,
    ) {
        let names = ["id", "aggregate_type", "aggregate_id", "event_type", "payload", "ts", "p", "extra"];
        let relation = Relation {
            xid: None,
            oid: 1,
            namespace: Bytes::from_static(b"events"),
            name: Bytes::from_static(b"outbox"),
            replica_identity: b'd',
            columns: names
                .iter()
                .zip(&types)
                .map(|(n, t)| Column { flags: 0, name: Bytes::from_static(n.as_bytes()), type_oid: *t, type_modifier: typmod })
                .collect(),
        };
        let placement = if envelope { "extra:envelope,ts:envelope:t,p:partition" } else { "extra:header,ts:header,p:partition" };
        let mut r = Router::new(RouterConfig {
            timestamp_field: Some("ts".into()),
            tombstone_on_empty_payload: tombstones,
            additional: AdditionalField::parse_list(placement).unwrap_or_default(),
            topics_allow: Some(vec!["*".into()]),
            topic_pattern: "t.${routedByValue}".into(),
            ..RouterConfig::default()
        })
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let rel = r.resolve(&relation).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let row = TupleData::from_values(&values);
        if let Ok(record) = r.route(&rel, &row) {
            prop_assert!(record.topic.starts_with("t."));
            if envelope {
                if let Some(v) = &record.value {
                    prop_assert!(v.starts_with(ENVELOPE_START), "{:?}", v);
                }
            }
        }
        let _ = r.salvage(&rel, &row);
    }
}

//! Conformance with Debezium's Outbox Event Router, case by case.
//!
//! Each case names the Debezium behaviour it checks: a test of `EventRouterTest`,
//! `AbstractEventRouterTest` (run by the PostgreSQL connector's `OutboxEventRouterIT`), or
//! a section of `outbox-event-router.adoc`. Rows are what pgoutput sends (text format);
//! the expected record is what a Kafka consumer reads when Debezium runs with the value
//! written by `StringConverter`/`BinaryDataConverter` (bare payloads), `JsonConverter`
//! without schemas (envelopes) and Kafka Connect's default `SimpleHeaderConverter`.
//!
//! A case where walpost deliberately differs asserts walpost's behaviour, carries a
//! `// differs from Debezium: <reason>` comment, and names its row of docs/event-router.md
//! ("Differences from Debezium's Event Router") in `differs`; a test checks the row exists.
//! Operations (UPDATE, DELETE, tombstones in the source) never reach the router: the
//! binary handles them, and CONFORMANCE.md says where that is tested.

use bytes::Bytes;
use pgoutput::{Column, ColumnValue, Relation, TupleData};
use router::value::oid::{BOOL, BYTEA, DATE, INT4, INT8, JSON, JSONB, TEXT, TIMESTAMP, TIMESTAMPTZ, UUID, VARCHAR};
use router::{
    AdditionalField, RouteError, Router, RouterConfig, DEBEZIUM_OPTIONS_IMPLEMENTED, DEBEZIUM_OPTIONS_NOT_IMPLEMENTED,
};

const CONFORMANCE_MD: &str = include_str!("../CONFORMANCE.md");
/// docs/event-router.md holds the table of deliberate differences (D1, D2, ...).
const DIFFERENCES: &str = include_str!("../../../docs/event-router.md");

/// varchar(255)'s type modifier.
const V255: i32 = 259;

type Columns = Vec<(&'static str, u32, i32)>;

/// The outbox of Debezium's PostgreSQL outbox test: id uuid, aggregatetype and
/// aggregateid varchar(255), type varchar(255), payload jsonb.
fn outbox() -> Columns {
    vec![
        ("id", UUID, -1),
        ("aggregatetype", VARCHAR, V255),
        ("aggregateid", VARCHAR, V255),
        ("type", VARCHAR, V255),
        ("payload", JSONB, -1),
    ]
}

fn outbox_with(extra: &[(&'static str, u32, i32)]) -> Columns {
    let mut c = outbox();
    c.extend_from_slice(extra);
    c
}

const EVENT_ID: &str = "59a42efd-b015-44a9-9dde-cb36d9002425";

fn row(
    aggregate_type: &'static str,
    payload: Option<&'static str>,
    extra: &[Option<&'static str>],
) -> Vec<Option<&'static str>> {
    let mut r = vec![Some(EVENT_ID), Some(aggregate_type), Some("10711fa5"), Some("UserCreated"), payload];
    r.extend_from_slice(extra);
    r
}

/// Debezium's defaults, in walpost's configuration.
fn debezium() -> RouterConfig {
    RouterConfig {
        route_by_field: "aggregatetype".into(),
        key_field: "aggregateid".into(),
        event_type_header_field: None,
        ..RouterConfig::default()
    }
}

fn with_placement(placement: &str) -> RouterConfig {
    RouterConfig { additional: AdditionalField::parse_list(placement).unwrap_or_default(), ..debezium() }
}

#[derive(Debug)]
enum Value {
    /// These bytes exactly.
    Exact(&'static [u8]),
    /// A JSON document equal to this one.
    Json(&'static str),
    Tombstone,
}

#[derive(Debug)]
struct Rec {
    topic: &'static str,
    key: &'static [u8],
    value: Value,
    /// Every header, in order.
    headers: Vec<(&'static str, &'static [u8])>,
    partition: Option<i32>,
    timestamp_ms: Option<i64>,
}

fn rec(topic: &'static str, value: Value) -> Rec {
    Rec {
        topic,
        key: b"10711fa5",
        value,
        headers: vec![("id", EVENT_ID.as_bytes())],
        partition: None,
        timestamp_ms: None,
    }
}

#[derive(Debug)]
enum Expect {
    Record(Rec),
    /// The `RouteError::class` of Router::new, resolve or route.
    Error(&'static str),
}

struct Case {
    /// The Debezium behaviour checked.
    debezium: &'static str,
    /// The differences-table row (docs/event-router.md) (D1, D2, ...) when walpost deliberately differs.
    differs: Option<&'static str>,
    config: RouterConfig,
    columns: Columns,
    row: Vec<Option<&'static str>>,
    expect: Expect,
}

fn case(
    debezium: &'static str,
    config: RouterConfig,
    columns: Columns,
    row: Vec<Option<&'static str>>,
    expect: Expect,
) -> Case {
    Case { debezium, differs: None, config, columns, row, expect }
}

fn differs(id: &'static str, c: Case) -> Case {
    Case { differs: Some(id), ..c }
}

fn cases() -> Vec<Case> {
    use Expect::{Error, Record};
    use Value::{Exact, Json, Tombstone};
    let user = || Record(rec("outbox.event.User", Exact(b"{}")));
    vec![
        // ---- Basic configuration (defaults) ----
        case("EventRouterTest.canExtractTableFields / AbstractEventRouterTest.shouldConsumeRecordsFromInsert: topic outbox.event.<aggregatetype>, key aggregateid, value the payload alone, header id", debezium(), outbox(), row("User", Some("{}"), &[]), user()),
        case("AbstractEventRouterTest.shouldRespectJsonFormatAsString: a jsonb payload is its JSON text, byte for byte", debezium(), outbox(), row("User", Some(r#"{"email": "gh@mefi.in"}"#), &[]), Record(rec("outbox.event.User", Exact(br#"{"email": "gh@mefi.in"}"#)))),
        case("EventRouterTest.canRouteBasedOnField: route.by.field names the topic's aggregate", debezium(), outbox(), row("Address", Some("{}"), &[]), Record(rec("outbox.event.Address", Exact(b"{}")))),
        case("EventRouterTest.canSetMessageKey: table.field.event.key", RouterConfig { key_field: "type".into(), ..debezium() }, outbox(), row("User", Some("{}"), &[]), Record(Rec { key: b"UserCreated", ..rec("outbox.event.User", Exact(b"{}")) })),
        case("EventRouterTest.failsOnInvalidSetMessageKey: a key column the table lacks is an error", RouterConfig { key_field: "fakefield".into(), ..debezium() }, outbox(), row("User", Some("{}"), &[]), Error("missing_column")),
        case(
            "EventRouterTest.canConfigureEveryTableField: table.field.event.id/key/payload and route.by.field",
            RouterConfig { id_field: "event_id".into(), key_field: "payload_id".into(), payload_field: "payload_body".into(), route_by_field: "payload_id".into(), ..debezium() },
            vec![("event_id", TEXT, -1), ("payload_id", TEXT, -1), ("event_type", TEXT, -1), ("payload_body", TEXT, -1)],
            vec![Some("da8d6de6-3b77-45ff-8f44-57db55a7a06c"), Some("10711fa5"), Some("UserCreated"), Some("{}")],
            Record(Rec { headers: vec![("id", b"da8d6de6-3b77-45ff-8f44-57db55a7a06c")], ..rec("outbox.event.10711fa5", Exact(b"{}")) }),
        ),
        case("AbstractEventRouterTest.startConnectorWithInitialSnapshotRecord: a snapshot read (op r) routes like an INSERT; the router sees rows, not operations", debezium(), outbox(), row("User", Some("{}"), &[]), user()),
        // ---- Column types: key, value, id header ----
        case("EventRouterTest.canPassIntKey (DBZ-2152): an integer key, as StringConverter writes it", RouterConfig { key_field: "n".into(), ..debezium() }, outbox_with(&[("n", INT8, -1)]), row("User", Some("{}"), &[Some("54321")]), Record(Rec { key: b"54321", ..rec("outbox.event.User", Exact(b"{}")) })),
        case("EventRouterTest.canPassBinaryKey (DBZ-2152): a bytea key is its bytes (hex output)", RouterConfig { key_field: "k".into(), ..debezium() }, outbox_with(&[("k", BYTEA, -1)]), row("User", Some("{}"), &[Some(r"\x612062696e617279206b6579")]), Record(Rec { key: b"a binary key", ..rec("outbox.event.User", Exact(b"{}")) })),
        case("EventRouterTest.canSetBinaryMessageKey (DBZ-2152): a bytea key is its bytes (escape output)", RouterConfig { key_field: "k".into(), ..debezium() }, outbox_with(&[("k", BYTEA, -1)]), row("User", Some("{}"), &[Some(r"a UserCreated\000\\")]), Record(Rec { key: b"a UserCreated\x00\\", ..rec("outbox.event.User", Exact(b"{}")) })),
        case("EventRouterTest.canPassBinaryMessage (DBZ-2152) / adoc Using Apache Avro: a bytea payload is its bytes, as BinaryDataConverter writes it", debezium(), vec![("id", UUID, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", BYTEA, -1)], row("User", Some(r"\x00ff612062696e617279206d657373616765"), &[]), Record(rec("outbox.event.User", Exact(b"\x00\xffa binary message")))),
        case("AbstractEventRouterTest.alterTableModifyPayload: a varchar payload is its text", debezium(), vec![("id", UUID, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", VARCHAR, 1004)], row("User", Some("plain text"), &[]), Record(rec("outbox.event.User", Exact(b"plain text")))),
        case("adoc Using JSON as the payload format: a json (not jsonb) payload is its text", debezium(), vec![("id", UUID, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", JSON, -1)], row("User", Some("{\"a\" : 1}"), &[]), Record(rec("outbox.event.User", Exact(b"{\"a\" : 1}")))),
        case(
            "adoc Basic outbox table: the id header from a bigint id column",
            debezium(),
            vec![("id", INT8, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", JSONB, -1)],
            vec![Some("42"), Some("User"), Some("10711fa5"), Some("UserCreated"), Some("{}")],
            Record(Rec { headers: vec![("id", b"42")], ..rec("outbox.event.User", Exact(b"{}")) }),
        ),
        // ---- Additional fields: header placement ----
        case("AbstractEventRouterTest.shouldSendEventTypeAsHeader (DBZ-1385): type:header:eventType; the value stays the bare payload", with_placement("type:header:eventType"), outbox(), row("User", Some("{}"), &[]), Record(Rec { headers: vec![("id", EVENT_ID.as_bytes()), ("eventType", b"UserCreated")], ..rec("outbox.event.User", Exact(b"{}")) })),
        case("AbstractEventRouterTest.shouldSupportAllFeatures: a boolean header is true/false (SimpleHeaderConverter)", with_placement("somebooltype:header"), outbox_with(&[("somebooltype", BOOL, -1)]), row("User", Some("{}"), &[Some("t")]), Record(Rec { headers: vec![("id", EVENT_ID.as_bytes()), ("somebooltype", b"true")], ..rec("outbox.event.User", Exact(b"{}")) })),
        case("SimpleHeaderConverter: an int header is its decimal text", with_placement("version:header"), outbox_with(&[("version", INT4, -1)]), row("User", Some("{}"), &[Some("1")]), Record(Rec { headers: vec![("id", EVENT_ID.as_bytes()), ("version", b"1")], ..rec("outbox.event.User", Exact(b"{}")) })),
        case("SimpleHeaderConverter: a bytea header is base64", with_placement("sig:header"), outbox_with(&[("sig", BYTEA, -1)]), row("User", Some("{}"), &[Some(r"\x6120ff")]), Record(Rec { headers: vec![("id", EVENT_ID.as_bytes()), ("sig", b"YSD/")], ..rec("outbox.event.User", Exact(b"{}")) })),
        case("SimpleHeaderConverter: a jsonb header is its JSON text", with_placement("meta:header"), outbox_with(&[("meta", JSONB, -1)]), row("User", Some("{}"), &[Some(r#"{"a": 1}"#)]), Record(Rec { headers: vec![("id", EVENT_ID.as_bytes()), ("meta", br#"{"a": 1}"#)], ..rec("outbox.event.User", Exact(b"{}")) })),
        case(
            "PostgreSQL connector temporal types (time.precision.mode=adaptive) through SimpleHeaderConverter: timestamp(3) ms, timestamp(6) us, timestamptz ISO-8601 UTC",
            with_placement("t3:header,t6:header,tz:header"),
            outbox_with(&[("t3", TIMESTAMP, 3), ("t6", TIMESTAMP, 6), ("tz", TIMESTAMPTZ, -1)]),
            row("User", Some("{}"), &[Some("2019-03-24 20:52:59.123"), Some("2019-03-24 20:52:59.123456"), Some("2019-03-24 22:52:59.5+02")]),
            Record(Rec {
                headers: vec![("id", EVENT_ID.as_bytes()), ("t3", b"1553460779123"), ("t6", b"1553460779123456"), ("tz", b"2019-03-24T20:52:59.500000Z")],
                ..rec("outbox.event.User", Exact(b"{}"))
            }),
        ),
        // differs from Debezium: Debezium adds a header with a null value; walpost's records carry no null header values.
        differs("D8", case("adoc Emitting additional fields: a NULL header column", with_placement("somebooltype:header"), outbox_with(&[("somebooltype", BOOL, -1)]), row("User", Some("{}"), &[None]), user())),
        case("EventRouterTest.canSetFieldIntoTheEnvelopeWithMissingField, for a header: a missing column with table.field.additional.missing = ignore adds nothing", RouterConfig { additional_missing_ignore: true, ..with_placement("nope:header") }, outbox(), row("User", Some("{}"), &[]), user()),
        case("adoc Emitting additional fields: the placement is case-insensitive", with_placement("type:HEADER:eventType"), outbox(), row("User", Some("{}"), &[]), Record(Rec { headers: vec![("id", EVENT_ID.as_bytes()), ("eventType", b"UserCreated")], ..rec("outbox.event.User", Exact(b"{}")) })),
        // ---- Additional fields: envelope placement ----
        // differs from Debezium: a jsonb payload is a JSON document in the envelope; Debezium writes it as a JSON string unless table.expand.json.payload.
        differs("D3", case("AbstractEventRouterTest.shouldSendEventTypeAsValue (DBZ-2014): type:envelope:eventType", with_placement("type:envelope:eventType"), outbox(), row("User", Some(r#"{"email": "gh@mefi.in"}"#), &[]), Record(rec("outbox.event.User", Exact(br#"{"payload":{"email": "gh@mefi.in"},"eventType":"UserCreated"}"#))))),
        case("EventRouterTest.canSetPayloadTypeIntoTheEnvelope: type:envelope", with_placement("type:envelope"), outbox(), row("User", Some("{}"), &[]), Record(rec("outbox.event.User", Json(r#"{"payload": {}, "type": "UserCreated"}"#)))),
        case("EventRouterTest.canSetPayloadTypeIntoTheEnvelopeWithAlias: type:envelope:aggregateType", with_placement("type:envelope:aggregateType"), outbox(), row("User", Some("{}"), &[]), Record(rec("outbox.event.User", Json(r#"{"payload": {}, "aggregateType": "UserCreated"}"#)))),
        case(
            "EventRouterTest.canSetMultipleFieldsIntoTheEnvelope: two envelope fields and a header from the same column",
            with_placement("type:envelope:payloadType, aggregateid:envelope:payloadId,type:header:payloadType"),
            outbox(),
            row("User", Some("{}"), &[]),
            Record(Rec { headers: vec![("id", EVENT_ID.as_bytes()), ("payloadType", b"UserCreated")], ..rec("outbox.event.User", Exact(br#"{"payload":{},"payloadType":"UserCreated","payloadId":"10711fa5"}"#)) }),
        ),
        case(
            "AbstractEventRouterTest.shouldSupportAllFeatures (DBZ-1169): int, varchar and boolean envelope fields, a boolean header, table.field.event.timestamp from a timestamp column",
            RouterConfig { timestamp_field: Some("createdat".into()), ..with_placement("version:envelope:eventVersion,aggregatetype:envelope:aggregateType,somebooltype:envelope:someBoolType,somebooltype:header,is_deleted:envelope:deleted") },
            outbox_with(&[("version", INT4, -1), ("somebooltype", BOOL, -1), ("createdat", TIMESTAMP, -1), ("is_deleted", BOOL, -1)]),
            row("UserEmail", Some(r#"{"email": "gh@mefi.in"}"#), &[Some("1"), Some("t"), Some("2019-03-24 20:52:59"), Some("f")]),
            Record(Rec {
                headers: vec![("id", EVENT_ID.as_bytes()), ("somebooltype", b"true")],
                timestamp_ms: Some(1_553_460_779_000),
                ..rec("outbox.event.UserEmail", Exact(br#"{"payload":{"email": "gh@mefi.in"},"eventVersion":1,"aggregateType":"UserEmail","someBoolType":true,"deleted":false}"#))
            }),
        ),
        case(
            "JsonConverter (schemas off) for envelope fields: bytea base64, timestamp(3) ms, timestamp(6) us, timestamptz ISO string, date days, NULL null",
            with_placement("sig:envelope,t3:envelope,t6:envelope,tz:envelope,d:envelope,gone:envelope"),
            outbox_with(&[("sig", BYTEA, -1), ("t3", TIMESTAMP, 3), ("t6", TIMESTAMP, -1), ("tz", TIMESTAMPTZ, 3), ("d", DATE, -1), ("gone", TEXT, -1)]),
            row("User", Some("{}"), &[Some(r"\x6120ff"), Some("2019-03-24 20:52:59.123"), Some("2019-03-24 20:52:59.123456"), Some("2019-03-24 20:52:59.5-01:30"), Some("2019-03-24"), None]),
            Record(rec("outbox.event.User", Json(r#"{"payload": {}, "sig": "YSD/", "t3": 1553460779123, "t6": 1553460779123456, "tz": "2019-03-24T22:22:59.500Z", "d": 17979, "gone": null}"#))),
        ),
        case("JsonConverter (schemas off): a text payload in an envelope is a JSON string", with_placement("type:envelope"), vec![("id", UUID, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", TEXT, -1)], row("User", Some("say \"hi\"\n"), &[]), Record(rec("outbox.event.User", Json(r#"{"payload": "say \"hi\"\n", "type": "UserCreated"}"#)))),
        case("JsonConverter (schemas off): a bytea payload in an envelope is base64", with_placement("type:envelope"), vec![("id", UUID, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", BYTEA, -1)], row("User", Some(r"\x7b7d"), &[]), Record(rec("outbox.event.User", Json(r#"{"payload": "e30=", "type": "UserCreated"}"#)))),
        case("EventRouterTest.canSetFieldIntoTheEnvelopeWithMissingField: a missing envelope column with table.field.additional.missing = ignore: still an envelope, without the field", RouterConfig { additional_missing_ignore: true, ..with_placement("nonExistingField:envelope:alias") }, outbox(), row("User", Some("{}"), &[]), Record(rec("outbox.event.User", Exact(br#"{"payload":{}}"#)))),
        case("EventRouterTest.shouldFailOnMissingField: a missing envelope column with table.field.additional.missing = error", with_placement("nonExistingField:envelope:alias"), outbox(), row("User", Some("{}"), &[]), Error("missing_column")),
        case("Kafka Connect SchemaBuilder: an envelope cannot have two fields of one name", with_placement("type:envelope:payload"), outbox(), row("User", Some("{}"), &[]), Error("invalid_option")),
        // ---- Additional fields: partition placement ----
        case(
            "EventRouterTest.canSetPartitionWithAdditionalFields (DBZ-5089): p:partition, with an int id and key and a bytea payload",
            RouterConfig { id_field: "event_id".into(), key_field: "payload_id".into(), payload_field: "payload_body".into(), route_by_field: "my_route_field".into(), ..with_placement("p:partition") },
            vec![("event_id", INT4, -1), ("payload_id", INT4, -1), ("my_route_field", TEXT, -1), ("event_type", BYTEA, -1), ("payload_body", BYTEA, -1), ("p", INT4, -1)],
            vec![Some("2"), Some("1232"), Some("routename"), Some(r"\x436f6f6c536368656d6143726561746564"), Some(r"\x7b7d"), Some("123")],
            Record(Rec { key: b"1232", headers: vec![("id", b"2")], partition: Some(123), ..rec("outbox.event.routename", Exact(b"{}")) }),
        ),
        case("adoc Emitting additional fields: for the partition placement an alias has no effect", with_placement("p:partition:ignored"), outbox_with(&[("p", INT4, -1)]), row("User", Some("{}"), &[Some("2")]), Record(Rec { partition: Some(2), ..rec("outbox.event.User", Exact(b"{}")) })),
        case("EventRouterDelegate: a NULL partition column leaves the partition to the partitioner", with_placement("p:partition"), outbox_with(&[("p", INT4, -1)]), row("User", Some("{}"), &[None]), user()),
        // differs from Debezium: a negative partition is refused when routing; Debezium hands it to the producer, which refuses it.
        differs("D11", case("Kafka producer: a partition must not be negative", with_placement("p:partition"), outbox_with(&[("p", INT4, -1)]), row("User", Some("{}"), &[Some("-1")]), Error("bad_value"))),
        // ---- Tombstones (route.tombstone.on.empty.payload) ----
        case(
            "AbstractEventRouterTest.shouldProduceTombstoneEventForNullPayload (DBZ-1320): a NULL payload with envelope placements is a tombstone with its key and headers",
            RouterConfig { tombstone_on_empty_payload: true, timestamp_field: Some("createdat".into()), ..with_placement("version:envelope:eventVersion,aggregatetype:envelope:aggregateType,somebooltype:envelope:someBoolType,somebooltype:header,is_deleted:envelope:deleted") },
            outbox_with(&[("version", INT4, -1), ("somebooltype", BOOL, -1), ("createdat", TIMESTAMP, -1), ("is_deleted", BOOL, -1)]),
            row("UserEmail", None, &[Some("1"), Some("t"), Some("2019-03-24 20:52:59"), Some("t")]),
            Record(Rec { headers: vec![("id", EVENT_ID.as_bytes()), ("somebooltype", b"true")], timestamp_ms: Some(1_553_460_779_000), ..rec("outbox.event.UserEmail", Tombstone) }),
        ),
        case("AbstractEventRouterTest.shouldProduceTombstoneEventForEmptyPayload (DBZ-1320): an empty varchar payload is a tombstone", RouterConfig { tombstone_on_empty_payload: true, ..debezium() }, vec![("id", UUID, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", VARCHAR, 1004)], row("UserEmail", Some(""), &[]), Record(rec("outbox.event.UserEmail", Tombstone))),
        case("EventRouterDelegate isDeleteEvent: a payload that trims to nothing (Java's String.trim) is a tombstone", RouterConfig { tombstone_on_empty_payload: true, ..debezium() }, vec![("id", UUID, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", TEXT, -1)], row("User", Some(" \t\n"), &[]), Record(rec("outbox.event.User", Tombstone))),
        case("EventRouterTest.canMarkAnEventAsDeleted: with tombstones on, a non-empty payload still gets its envelope", RouterConfig { tombstone_on_empty_payload: true, ..with_placement("is_deleted:envelope:deleted") }, outbox_with(&[("is_deleted", BOOL, -1)]), row("User", Some("{}"), &[Some("t")]), Record(rec("outbox.event.User", Json(r#"{"payload": {}, "deleted": true}"#)))),
        case("EventRouterTest.canMarkAnEventAsDeleted: with tombstones on, an empty payload is a tombstone even with an envelope placement", RouterConfig { tombstone_on_empty_payload: true, ..with_placement("is_deleted:envelope:deleted") }, vec![("id", UUID, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", TEXT, -1), ("is_deleted", BOOL, -1)], row("User", Some(""), &[Some("t")]), Record(rec("outbox.event.User", Tombstone))),
        case("EventRouterDelegate isDeleteEvent: a NULL bytea payload is a tombstone", RouterConfig { tombstone_on_empty_payload: true, ..debezium() }, vec![("id", UUID, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", BYTEA, -1)], row("User", None, &[]), Record(rec("outbox.event.User", Tombstone))),
        case("EventRouterDelegate isDeleteEvent: an empty bytea payload is not empty there (its toString is a buffer description): an empty value", RouterConfig { tombstone_on_empty_payload: true, ..debezium() }, vec![("id", UUID, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", BYTEA, -1)], row("User", Some(r"\x"), &[]), Record(rec("outbox.event.User", Exact(b"")))),
        // differs from Debezium: without tombstones Debezium emits an envelope around a null payload; walpost halts or dead-letters the row.
        differs("D2", case("AbstractEventRouterTest.shouldNotProduceTombstoneEventForNullPayload (DBZ-1320): a NULL payload without tombstones", with_placement("somebooltype:envelope"), outbox_with(&[("somebooltype", BOOL, -1)]), row("UserEmail", None, &[Some("t")]), Error("empty_payload"))),
        // differs from Debezium: as above, for an empty payload.
        differs("D2", case("EventRouterTest.noTombstoneIfNotConfigured: an empty payload without tombstones", with_placement("is_deleted:envelope:deleted"), vec![("id", UUID, -1), ("aggregatetype", VARCHAR, V255), ("aggregateid", VARCHAR, V255), ("type", VARCHAR, V255), ("payload", TEXT, -1), ("is_deleted", BOOL, -1)], row("User", Some(""), &[Some("t")]), Error("empty_payload"))),
        // ---- table.field.event.timestamp ----
        // differs from Debezium: without the option the record gets the commit time (the binary sets it); Debezium uses the time it processed the change.
        differs("D7", case("EventRouterTest.canSetTimestampFromDebeziumEnvelopeByDefault: no timestamp column", debezium(), outbox(), row("User", Some("{}"), &[]), user())),
        case("AbstractEventRouterTest.shouldConvertMicrosecondsTimestampToMilliseconds (DBZ-1707): a timestamp (MicroTimestamp) column, in ms", RouterConfig { timestamp_field: Some("createdat".into()), ..debezium() }, outbox_with(&[("createdat", TIMESTAMP, -1)]), row("User", Some("{}"), &[Some("2019-03-24 20:52:59.123456")]), Record(Rec { timestamp_ms: Some(1_553_460_779_123), ..rec("outbox.event.User", Exact(b"{}")) })),
        case("EventRouterTest.canSetTimestampByUserDefinedConfiguration: a timestamp(3) (Timestamp) column", RouterConfig { timestamp_field: Some("createdat".into()), ..debezium() }, outbox_with(&[("createdat", TIMESTAMP, 3)]), row("User", Some("{}"), &[Some("2420-09-07 13:03:45.338")]), Record(Rec { timestamp_ms: Some(14_222_264_625_338), ..rec("outbox.event.User", Exact(b"{}")) })),
        case("EventRouterDelegate.getEventTimestampMs: a NULL timestamp column falls back to the event's own time", RouterConfig { timestamp_field: Some("createdat".into()), ..debezium() }, outbox_with(&[("createdat", TIMESTAMP, 6)]), row("User", Some("{}"), &[None]), user()),
        // differs from Debezium: a timestamptz column is accepted (Debezium refuses ZonedTimestamp, a string, as the record timestamp).
        differs("D10", case("EventRouterDelegate.getEventTimestampMs: a timestamptz column with a +05:30 offset", RouterConfig { timestamp_field: Some("createdat".into()), ..debezium() }, outbox_with(&[("createdat", TIMESTAMPTZ, -1)]), row("User", Some("{}"), &[Some("2019-03-25 02:22:59+05:30")]), Record(Rec { timestamp_ms: Some(1_553_460_779_000), ..rec("outbox.event.User", Exact(b"{}")) }))),
        differs("D10", case("EventRouterDelegate.getEventTimestampMs: a timestamptz column with a negative offset", RouterConfig { timestamp_field: Some("createdat".into()), ..debezium() }, outbox_with(&[("createdat", TIMESTAMPTZ, -1)]), row("User", Some("{}"), &[Some("2019-03-24 17:52:59.25-03")]), Record(Rec { timestamp_ms: Some(1_553_460_779_250), ..rec("outbox.event.User", Exact(b"{}")) }))),
        // differs from Debezium: infinity is refused; Debezium turns it into a sentinel far in the future.
        differs("D10", case("PostgreSQL connector TIMESTAMP type: infinity as the record timestamp", RouterConfig { timestamp_field: Some("createdat".into()), ..debezium() }, outbox_with(&[("createdat", TIMESTAMP, -1)]), row("User", Some("{}"), &[Some("infinity")]), Error("bad_value"))),
        // ---- Topic routing: route.topic.regex, route.topic.replacement ----
        case("adoc route.topic.regex/route.topic.replacement: named groups", RouterConfig { topic_regex: Some("(?<routedByValue>[A-Za-z]+)Aggregate".into()), topic_pattern: "outbox.${routedByValue}.v1".into(), ..debezium() }, outbox(), row("OrderAggregate", Some("{}"), &[]), Record(rec("outbox.Order.v1", Exact(b"{}")))),
        case("RegexRouter (Java's replacement syntax): $1, and $12 is group 1 then '2' when there is no group 12", RouterConfig { topic_regex: Some("(.*)Aggregate".into()), topic_pattern: "outbox.$12".into(), ..debezium() }, outbox(), row("OrderAggregate", Some("{}"), &[]), Record(rec("outbox.Order2", Exact(b"{}")))),
        case("RegexRouter: a replacement without a group reference is one fixed topic", RouterConfig { topic_pattern: "all-events".into(), ..debezium() }, outbox(), row("Whatever", Some("{}"), &[]), Record(rec("all-events", Exact(b"{}")))),
        case("EventRouterTest.shouldFailOnInvalidConfigurationForTopicRegex", RouterConfig { topic_regex: Some(" [[a-z]".into()), ..debezium() }, outbox(), row("User", Some("{}"), &[]), Error("bad_regex")),
        // differs from Debezium: a value the regex does not match is an error; Debezium's RegexRouter publishes to the value itself.
        differs("D5", case("RegexRouter: a route value the regex does not match", RouterConfig { topic_regex: Some("(?<routedByValue>.*)Aggregate".into()), ..debezium() }, outbox(), row("outbox.event.Payment", Some("{}"), &[]), Error("route_no_match"))),
        case("RegexRouter: a value the regex does not match is the topic as it is (route.topic.regex.fallthrough = true)", RouterConfig { topic_regex: Some("(?<routedByValue>.*)Aggregate".into()), topic_regex_fallthrough: true, ..debezium() }, outbox(), row("outbox.event.Payment", Some("{}"), &[]), Record(rec("outbox.event.Payment", Exact(b"{}")))),
        // differs from Debezium: topics outside topics.allow (default: the pattern's literal prefix) are refused.
        differs("D5", case("RegexRouter with fallthrough: a value outside the allowed topics", RouterConfig { topic_regex: Some("(?<routedByValue>.*)Aggregate".into()), topic_regex_fallthrough: true, ..debezium() }, outbox(), row("billing.payments", Some("{}"), &[]), Error("topic_not_allowed"))),
        // differs from Debezium: Kafka's internal topics are refused whatever topics.allow says.
        differs("D5", case("RegexRouter: a route value naming a Kafka internal topic", RouterConfig { topic_pattern: "${routedByValue}".into(), topics_allow: Some(vec!["*".into()]), ..debezium() }, outbox(), row("__consumer_offsets", Some("{}"), &[]), Error("topic_not_allowed"))),
        case("Kafka topic names: a route value with characters Kafka refuses", debezium(), outbox(), row("User Events", Some("{}"), &[]), Error("invalid_topic")),
        // differs from Debezium: a non-text route column is routed by its text; Debezium's getString fails on it.
        differs("D9", case("EventRouterDelegate: route.by.field of an int column", RouterConfig { route_by_field: "n".into(), ..debezium() }, outbox_with(&[("n", INT4, -1)]), row("User", Some("{}"), &[Some("7")]), Record(rec("outbox.event.7", Exact(b"{}"))))),
        // ---- NULLs in the required columns ----
        // differs from Debezium: a NULL key is an error; Debezium emits the record with a null key (no per-aggregate order).
        differs("D6", case("EventRouterDelegate.defineRecordKey: a NULL key column", debezium(), outbox(), vec![Some(EVENT_ID), Some("User"), None, Some("UserCreated"), Some("{}")], Error("null_field"))),
        // differs from Debezium: a NULL id is an error; Debezium adds an id header with a null value.
        differs("D6", case("EventRouterDelegate: a NULL event id column", debezium(), outbox(), vec![None, Some("User"), Some("10711fa5"), Some("UserCreated"), Some("{}")], Error("null_field"))),
        case("RegexRouter: a NULL route value fails (Debezium's RegexRouter fails on a null topic)", debezium(), outbox(), vec![Some(EVENT_ID), None, Some("10711fa5"), Some("UserCreated"), Some("{}")], Error("null_field")),
        // ---- walpost's defaults and extensions ----
        // differs from Debezium: walpost's default column names are aggregate_type/aggregate_id, and it adds an eventType header from event_type.
        differs("D1", case(
            "adoc Basic outbox table: the default columns",
            RouterConfig::default(),
            vec![("id", INT8, -1), ("aggregate_type", TEXT, -1), ("aggregate_id", UUID, -1), ("event_type", TEXT, -1), ("payload", JSONB, -1)],
            vec![Some("42"), Some("order"), Some("5f0c6b1e-0000-4000-8000-000000000001"), Some("OrderPlaced"), Some("{}")],
            Record(Rec { key: b"5f0c6b1e-0000-4000-8000-000000000001", headers: vec![("id", b"42"), ("eventType", b"OrderPlaced")], ..rec("outbox.event.order", Exact(b"{}")) }),
        )),
        // differs from Debezium: an extension (Debezium has no JSON headers column; its tracing options are not implemented).
        differs("D12", case(
            "adoc Distributed tracing: a traceparent travels as a header from table.field.event.headers",
            RouterConfig { headers_field: Some("headers".into()), ..debezium() },
            outbox_with(&[("headers", JSONB, -1)]),
            row("User", Some("{}"), &[Some(r#"{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}"#)]),
            Record(Rec { headers: vec![("id", EVENT_ID.as_bytes()), ("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")], ..rec("outbox.event.User", Exact(b"{}")) }),
        )),
    ]
}

fn relation(columns: &Columns) -> Relation {
    Relation {
        xid: None,
        oid: 16384,
        namespace: Bytes::from_static(b"outboxsmtit"),
        name: Bytes::from_static(b"outbox"),
        replica_identity: b'd',
        columns: columns
            .iter()
            .map(|(name, type_oid, type_modifier)| Column {
                flags: 0,
                name: Bytes::from_static(name.as_bytes()),
                type_oid: *type_oid,
                type_modifier: *type_modifier,
            })
            .collect(),
    }
}

fn tuple(row: &[Option<&'static str>]) -> TupleData {
    let values: Vec<ColumnValue> = row
        .iter()
        .map(|v| v.map_or(ColumnValue::Null, |t| ColumnValue::Text(Bytes::from_static(t.as_bytes()))))
        .collect();
    TupleData::from_values(&values)
}

fn run(c: &Case) -> Result<router::Record, RouteError> {
    let mut r = Router::new(c.config.clone())?;
    let rel = r.resolve(&relation(&c.columns))?;
    r.route(&rel, &tuple(&c.row))
}

#[test]
fn debezium_event_router_cases() {
    let cases = cases();
    let mut failures = Vec::new();
    for c in &cases {
        let got = run(c);
        let ok = match (&c.expect, &got) {
            (Expect::Error(class), Err(e)) => e.class() == *class,
            (Expect::Record(want), Ok(got)) => {
                let value_ok = match (&want.value, &got.value) {
                    (Value::Tombstone, None) => true,
                    (Value::Exact(bytes), Some(v)) => v.as_ref() == *bytes,
                    (Value::Json(text), Some(v)) => {
                        serde_json::from_slice::<serde_json::Value>(v).ok()
                            == serde_json::from_str::<serde_json::Value>(text).ok()
                    }
                    _ => false,
                };
                let headers: Vec<(&str, &[u8])> = got.headers.iter().map(|(k, v)| (&**k, v.as_ref())).collect();
                value_ok
                    && &*got.topic == want.topic
                    && got.key.as_ref() == want.key
                    && headers == want.headers
                    && got.partition == want.partition
                    && got.timestamp_ms == want.timestamp_ms
            }
            _ => false,
        };
        if !ok {
            failures.push(format!("{}\n  expected {:?}\n  got      {:?}", c.debezium, c.expect, got));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases fail:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn every_difference_is_a_row_of_the_readme_differences_table() {
    for c in cases() {
        if let Some(id) = c.differs {
            assert!(
                DIFFERENCES.contains(&format!("| {id} |")),
                "{id} ({}) has no row in docs/event-router.md's differences table",
                c.debezium
            );
        }
    }
}

/// Debezium's documented options (outbox-event-router.adoc, "Configuration options").
const DEBEZIUM_DOCUMENTED_OPTIONS: &[&str] = &[
    "table.op.invalid.behavior",
    "table.field.event.id",
    "table.field.event.key",
    "table.field.event.timestamp",
    "table.field.event.payload",
    "table.expand.json.payload",
    "table.json.payload.null.behavior",
    "table.json.payload.empty.array.behavior",
    "table.fields.additional.placement",
    "table.field.additional.missing",
    "table.field.event.schema.version",
    "route.by.field",
    "route.topic.regex",
    "route.topic.replacement",
    "route.tombstone.on.empty.payload",
    "tracing.span.context.field",
    "tracing.operation.name",
    "tracing.with.context.field.only",
];

#[test]
fn every_documented_option_is_implemented_or_refused_by_name() {
    for option in DEBEZIUM_DOCUMENTED_OPTIONS {
        let implemented = DEBEZIUM_OPTIONS_IMPLEMENTED.contains(option);
        let refused = DEBEZIUM_OPTIONS_NOT_IMPLEMENTED.iter().any(|(o, _)| o == option);
        assert!(implemented != refused, "{option}: implemented {implemented}, refused {refused}");
        assert!(CONFORMANCE_MD.contains(&format!("`{option}`")), "{option} is not in CONFORMANCE.md");
    }
    assert_eq!(
        DEBEZIUM_OPTIONS_IMPLEMENTED.len() + DEBEZIUM_OPTIONS_NOT_IMPLEMENTED.len(),
        DEBEZIUM_DOCUMENTED_OPTIONS.len()
    );
    for (option, reason) in DEBEZIUM_OPTIONS_NOT_IMPLEMENTED {
        assert!(!reason.is_empty(), "{option}");
    }
}

#[test]
fn debezium_placement_parsing() {
    // EventRouterTest.shouldFailOnInvalidConfigurationForAdditionalFields(Empty).
    for bad in ["type", "", "  ", "a:header,,b:header", "a:body", "a::header", ":header", "a:header:b:c"] {
        let err = AdditionalField::parse_list(bad).unwrap_err();
        assert!(err.starts_with("table.fields.additional.placement: "), "{bad:?}: {err}");
    }
    // Parts are trimmed and an empty alias is the column's name (Java's split drops it).
    assert_eq!(
        AdditionalField::parse_list(" type : envelope : t , id:header:").unwrap(),
        vec![
            AdditionalField { column: "type".into(), placement: router::Placement::Envelope("t".into()) },
            AdditionalField { column: "id".into(), placement: router::Placement::Header("id".into()) },
        ]
    );
}

//! Conformance with Debezium's Outbox Event Router, end to end: outbox rows
//! inserted into a real PostgreSQL, streamed by the walpost binary, and read back from a
//! real Kafka broker with a real client, compared with what Debezium's consumer reads.
//!
//! The cases are organised by Debezium's documented options and behaviours, like the pure
//! suite (crates/router/tests/conformance.rs), and name the `EventRouterTest` /
//! `AbstractEventRouterTest` case or section of `outbox-event-router.adoc` they check.
//! The expected record is what a consumer reads from Debezium with the converters
//! crates/router/CONFORMANCE.md assumes; where walpost deliberately differs, the case
//! asserts walpost's behaviour and names its row (D1, D2, ...) of docs/event-router.md's table of
//! differences (a test checks the row exists).
//!
//! For speed, one database and one walpost process carry every case: each option family
//! is an outbox table of its own (`[[outbox]]`, one router configuration each), most of
//! them configured in Debezium's own option names and converted by
//! `walpost import-debezium`, as a user coming from Debezium would. Rows that walpost
//! refuses to publish (its differences D2, D5, D6, D10, D11, and Debezium's own failures)
//! are observed as dead letters (`on_permanent_error = "dead_letter"`), so one process
//! sees them all; halting on them is tested in router.rs. The run:
//!
//! 1. rows inserted before walpost starts are read by its initial snapshot;
//! 2. rows inserted while it streams (one transaction), then UPDATE/DELETE/TRUNCATE of the
//!    `table.op.invalid.behavior` tables (through a publication the test supplies, which
//!    publishes them) and a column dropped mid-stream, then rows after them;
//! 3. every record is read back and compared; an UPDATE under `fatal` then halts walpost;
//! 4. the role's `bytea_output` becomes `escape`, the slot is moved past the UPDATE, the
//!    cases with bytea columns are inserted again (walpost is down: their commit time
//!    precedes their publication) and a second walpost publishes them; a DELETE under
//!    `fatal` halts it (D4).
//!
//! Start-up refusals (options walpost does not implement, invalid values) cannot be
//! rows: [`options_walpost_does_not_implement_are_refused_at_start_up`] runs the binary
//! on each and checks the exit code and that the message names the option.

use std::collections::{BTreeMap, HashMap};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// docs/event-router.md holds the table of deliberate differences (D1, D2, ...).
const DIFFERENCES: &str = include_str!("../../../../docs/event-router.md");

/// The schema of Debezium's PostgreSQL outbox integration test (OutboxEventRouterIT).
const SCHEMA: &str = "outboxsmtit";

const WAIT: Duration = Duration::from_secs(60);

/// Stands for the case's event id in expected headers.
const ID: &[u8] = b"<event id>";

/// The columns of Debezium's PostgreSQL outbox test, after the id.
const DBZ: &str = "aggregatetype varchar(255), aggregateid varchar(255), type varchar(255), payload jsonb";

/// One column of each type Debezium's tests exercise, plus numeric and float8.
const TYPES: &str = "c_text text, c_varchar varchar(64), c_uuid uuid, c_bigint bigint, c_int int, c_bool boolean, \
     c_bytea bytea, c_json json, c_jsonb jsonb, c_ts3 timestamp(3), c_ts6 timestamp(6), c_tstz timestamptz, \
     c_date date, c_numeric numeric(10,2), c_float8 float8";

/// A column value and the bytes a consumer reads for it (CONFORMANCE.md, "How column
/// values are written", with `binary.handling.mode = bytes` and
/// `time.precision.mode = adaptive`).
struct TypeValue {
    column: &'static str,
    /// The column's SQL type (for the one-column tables of the key/value cases).
    sql_type: &'static str,
    /// The SQL literal inserted.
    sql: &'static str,
    /// As the record key or the bare value (StringConverter / BinaryDataConverter).
    plain: &'static [u8],
    /// As a header (SimpleHeaderConverter).
    header: &'static [u8],
    /// As an envelope field (JsonConverter without schemas); `None` for json/jsonb (D3),
    /// numeric (D17) and float (D18), whose envelope cases are of their own.
    json: Option<&'static str>,
}

/// Ordinary values; the bytea holds a NUL, a 0xff and a backslash.
const VALUES: &[TypeValue] = &[
    TypeValue {
        column: "c_text",
        sql_type: "text",
        sql: r#"'héllo "w"'"#,
        plain: "héllo \"w\"".as_bytes(),
        header: "héllo \"w\"".as_bytes(),
        json: Some(r#""héllo \"w\"""#),
    },
    TypeValue {
        column: "c_varchar",
        sql_type: "varchar(64)",
        sql: "'UserEmail'",
        plain: b"UserEmail",
        header: b"UserEmail",
        json: Some(r#""UserEmail""#),
    },
    TypeValue {
        column: "c_uuid",
        sql_type: "uuid",
        sql: "'0e5a2c1f-6b8d-4c3e-9f1a-2b3c4d5e6f70'",
        plain: b"0e5a2c1f-6b8d-4c3e-9f1a-2b3c4d5e6f70",
        header: b"0e5a2c1f-6b8d-4c3e-9f1a-2b3c4d5e6f70",
        json: Some(r#""0e5a2c1f-6b8d-4c3e-9f1a-2b3c4d5e6f70""#),
    },
    // Past 2^53: exact as a JSON number (JsonConverter writes the long).
    TypeValue {
        column: "c_bigint",
        sql_type: "bigint",
        sql: "9007199254740993",
        plain: b"9007199254740993",
        header: b"9007199254740993",
        json: Some("9007199254740993"),
    },
    TypeValue { column: "c_int", sql_type: "int", sql: "-42", plain: b"-42", header: b"-42", json: Some("-42") },
    TypeValue {
        column: "c_bool",
        sql_type: "boolean",
        sql: "true",
        plain: b"true",
        header: b"true",
        json: Some("true"),
    },
    TypeValue {
        column: "c_bytea",
        sql_type: "bytea",
        sql: r"'\x00ff5c612062696e617279'",
        plain: b"\x00\xff\\a binary",
        header: b"AP9cYSBiaW5hcnk=",
        json: Some(r#""AP9cYSBiaW5hcnk=""#),
    },
    TypeValue {
        column: "c_json",
        sql_type: "json",
        sql: r#"'{"b" : [1, 2]}'"#,
        plain: br#"{"b" : [1, 2]}"#,
        header: br#"{"b" : [1, 2]}"#,
        json: None,
    },
    // jsonb's text: keys by length, then bytes; ": " and ", ".
    TypeValue {
        column: "c_jsonb",
        sql_type: "jsonb",
        sql: r#"'{"e": [], "a": null}'"#,
        plain: br#"{"a": null, "e": []}"#,
        header: br#"{"a": null, "e": []}"#,
        json: None,
    },
    // io.debezium.time.Timestamp: ms.
    TypeValue {
        column: "c_ts3",
        sql_type: "timestamp(3)",
        sql: "'2019-03-24 20:52:59.123'",
        plain: b"1553460779123",
        header: b"1553460779123",
        json: Some("1553460779123"),
    },
    // io.debezium.time.MicroTimestamp: µs.
    TypeValue {
        column: "c_ts6",
        sql_type: "timestamp(6)",
        sql: "'2019-03-24 20:52:59.123456'",
        plain: b"1553460779123456",
        header: b"1553460779123456",
        json: Some("1553460779123456"),
    },
    // io.debezium.time.ZonedTimestamp: ISO-8601 in UTC.
    TypeValue {
        column: "c_tstz",
        sql_type: "timestamptz",
        sql: "'2019-03-25 02:22:59.5+05:30'",
        plain: b"2019-03-24T20:52:59.500000Z",
        header: b"2019-03-24T20:52:59.500000Z",
        json: Some(r#""2019-03-24T20:52:59.500000Z""#),
    },
    // io.debezium.time.Date: days since the epoch.
    TypeValue {
        column: "c_date",
        sql_type: "date",
        sql: "'2019-03-24'",
        plain: b"17979",
        header: b"17979",
        json: Some("17979"),
    },
    TypeValue {
        column: "c_numeric",
        sql_type: "numeric(10,2)",
        sql: "12.5",
        plain: b"12.50",
        header: b"12.50",
        json: None,
    },
    TypeValue { column: "c_float8", sql_type: "float8", sql: "'NaN'", plain: b"NaN", header: b"NaN", json: None },
];

/// Empty values and the edges: empty strings and bytes, false, zero, the smallest
/// bigint, the epoch and the instant before it.
const EDGES: &[TypeValue] = &[
    TypeValue { column: "c_text", sql_type: "text", sql: "''", plain: b"", header: b"", json: Some(r#""""#) },
    TypeValue { column: "c_varchar", sql_type: "varchar(64)", sql: "''", plain: b"", header: b"", json: Some(r#""""#) },
    TypeValue {
        column: "c_uuid",
        sql_type: "uuid",
        sql: "'00000000-0000-0000-0000-000000000000'",
        plain: b"00000000-0000-0000-0000-000000000000",
        header: b"00000000-0000-0000-0000-000000000000",
        json: Some(r#""00000000-0000-0000-0000-000000000000""#),
    },
    TypeValue {
        column: "c_bigint",
        sql_type: "bigint",
        sql: "-9223372036854775808",
        plain: b"-9223372036854775808",
        header: b"-9223372036854775808",
        json: Some("-9223372036854775808"),
    },
    TypeValue { column: "c_int", sql_type: "int", sql: "0", plain: b"0", header: b"0", json: Some("0") },
    TypeValue {
        column: "c_bool",
        sql_type: "boolean",
        sql: "false",
        plain: b"false",
        header: b"false",
        json: Some("false"),
    },
    TypeValue { column: "c_bytea", sql_type: "bytea", sql: r"'\x'", plain: b"", header: b"", json: Some(r#""""#) },
    TypeValue { column: "c_json", sql_type: "json", sql: r#"'""'"#, plain: br#""""#, header: br#""""#, json: None },
    TypeValue { column: "c_jsonb", sql_type: "jsonb", sql: "'[]'", plain: b"[]", header: b"[]", json: None },
    TypeValue {
        column: "c_ts3",
        sql_type: "timestamp(3)",
        sql: "'1970-01-01 00:00:00'",
        plain: b"0",
        header: b"0",
        json: Some("0"),
    },
    TypeValue {
        column: "c_ts6",
        sql_type: "timestamp(6)",
        sql: "'1969-12-31 23:59:59.999999'",
        plain: b"-1",
        header: b"-1",
        json: Some("-1"),
    },
    TypeValue {
        column: "c_tstz",
        sql_type: "timestamptz",
        sql: "'1970-01-01 00:00:00+00'",
        plain: b"1970-01-01T00:00:00.000000Z",
        header: b"1970-01-01T00:00:00.000000Z",
        json: Some(r#""1970-01-01T00:00:00.000000Z""#),
    },
    TypeValue {
        column: "c_date",
        sql_type: "date",
        sql: "'1969-12-31'",
        plain: b"-1",
        header: b"-1",
        json: Some("-1"),
    },
    TypeValue { column: "c_numeric", sql_type: "numeric(10,2)", sql: "0", plain: b"0.00", header: b"0.00", json: None },
    TypeValue {
        column: "c_float8",
        sql_type: "float8",
        sql: "'-Infinity'",
        plain: b"-Infinity",
        header: b"-Infinity",
        json: None,
    },
];

/// Header names of the `hdr` table's placements, by column ("" = the column's name).
const HEADER_ALIASES: &[(&str, &str)] = &[
    ("c_text", ""),
    ("c_varchar", "hVarchar"),
    ("c_uuid", ""),
    ("c_bigint", "hBigint"),
    ("c_int", ""),
    ("c_bool", "hBool"),
    ("c_bytea", ""),
    ("c_json", ""),
    ("c_jsonb", "hJsonb"),
    ("c_ts3", ""),
    ("c_ts6", ""),
    ("c_tstz", ""),
    ("c_date", ""),
    ("c_numeric", ""),
    ("c_float8", ""),
];

/// Envelope field names of the `env` table's placements ("" = the column's name); the
/// types whose envelope form walpost writes as Debezium does.
const ENVELOPE_ALIASES: &[(&str, &str)] = &[
    ("c_text", ""),
    ("c_varchar", "eVarchar"),
    ("c_uuid", ""),
    ("c_bigint", ""),
    ("c_int", "eInt"),
    ("c_bool", ""),
    ("c_bytea", ""),
    ("c_ts3", ""),
    ("c_ts6", ""),
    ("c_tstz", ""),
    ("c_date", ""),
];

/// The types of the one-column key/value tables (Debezium's PostgreSQL type list).
const PLAIN_TYPES: &[&str] = &[
    "c_text",
    "c_varchar",
    "c_uuid",
    "c_bigint",
    "c_int",
    "c_bool",
    "c_bytea",
    "c_json",
    "c_jsonb",
    "c_ts3",
    "c_ts6",
    "c_tstz",
    "c_date",
];

fn value_of(values: &'static [TypeValue], column: &str) -> &'static TypeValue {
    values.iter().find(|v| v.column == column).unwrap()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Phase {
    /// Inserted before walpost starts: read by its initial snapshot.
    Snapshot,
    /// Inserted while walpost streams, in one transaction.
    Stream,
    /// Inserted after the invalid operations and the dropped column.
    Later,
    /// Inserted again with `bytea_output = escape`, published by the second walpost.
    Escape,
}

const STREAM: &[Phase] = &[Phase::Stream];
const LATER: &[Phase] = &[Phase::Later];
const STREAM_ESCAPE: &[Phase] = &[Phase::Stream, Phase::Escape];
const ALL_PHASES: &[Phase] = &[Phase::Snapshot, Phase::Stream, Phase::Escape];
const SNAPSHOT_STREAM: &[Phase] = &[Phase::Snapshot, Phase::Stream];

/// One outbox table and its router.
struct Table {
    /// `schema.name`.
    name: String,
    /// The event id column and its SQL type.
    id: (&'static str, &'static str),
    /// Column definitions after the id.
    columns: String,
    /// The Debezium EventRouter options a connector would set (`transforms.outbox.*`),
    /// converted by `walpost import-debezium`; `None`: the router is `walpost` alone.
    debezium: Option<Vec<(&'static str, String)>>,
    /// walpost options (set on top of the converted ones).
    walpost: Vec<(&'static str, toml::Value)>,
}

impl Table {
    fn short(&self) -> &str {
        self.name.rsplit('.').next().unwrap()
    }
}

/// A table configured in Debezium's option names, routed to `<prefix><short>.<value>`.
fn debezium_table(
    p: &str,
    short: &str,
    id: (&'static str, &'static str),
    columns: &str,
    options: &[(&'static str, &str)],
) -> Table {
    let mut debezium = vec![("route.topic.replacement", format!("{p}{short}.${{routedByValue}}"))];
    debezium.extend(options.iter().map(|(k, v)| (*k, v.to_string())));
    Table {
        name: format!("{SCHEMA}.{short}"),
        id,
        columns: columns.to_owned(),
        debezium: Some(debezium),
        walpost: Vec::new(),
    }
}

/// Debezium's outbox (uuid id) configured with Debezium's defaults and `options`.
fn dbz_table(p: &str, short: &str, columns: &str, options: &[(&'static str, &str)]) -> Table {
    debezium_table(p, short, ("id", "uuid"), columns, options)
}

fn s(v: &str) -> toml::Value {
    toml::Value::String(v.to_owned())
}

fn tables(p: &str) -> Vec<Table> {
    let dbz_types = format!("{DBZ}, {TYPES}");
    let hdr_placement = std::iter::once("type:header:eventType".to_owned())
        .chain(HEADER_ALIASES.iter().enumerate().map(|(i, (c, a))| {
            // Debezium's placement is case-insensitive: some entries say HEADER.
            let target = if i % 3 == 2 { "HEADER" } else { "header" };
            if a.is_empty() {
                format!("{c}:{target}")
            } else {
                format!("{c}:{target}:{a}")
            }
        }))
        .collect::<Vec<_>>()
        .join(",");
    let env_placement = ["type:envelope:eventType", "aggregateid:envelope:payloadId", "type:header:payloadType"]
        .into_iter()
        .map(str::to_owned)
        .chain(ENVELOPE_ALIASES.iter().map(|(c, a)| {
            if a.is_empty() {
                format!("{c}:Envelope")
            } else {
                format!("{c}:envelope:{a}")
            }
        }))
        .collect::<Vec<_>>()
        .join(", ");
    let text_payload = DBZ.replace("payload jsonb", "payload text");
    let mut t = vec![
        dbz_table(p, "dbz", DBZ, &[]),
        Table {
            name: format!("{SCHEMA}.cfg"),
            id: ("event_id", "text"),
            columns: "payload_id text, event_type text, payload_body text".into(),
            debezium: None,
            walpost: vec![
                ("table.field.event.id", s("event_id")),
                ("table.field.event.key", s("payload_id")),
                ("table.field.event.payload", s("payload_body")),
                ("route.by.field", s("payload_id")),
                // The deprecated spelling of table.field.event.type.header.
                ("table.field.event.type", s("event_type")),
                ("route.topic.replacement", s(&format!("{p}cfg.${{routedByValue}}"))),
            ],
        },
        dbz_table(p, "hdr", &dbz_types, &[("table.fields.additional.placement", &hdr_placement)]),
        dbz_table(
            p,
            "env",
            &format!("{text_payload}, {TYPES}"),
            &[("table.fields.additional.placement", &env_placement)],
        ),
        dbz_table(
            p,
            "env_json",
            &dbz_types,
            &[
                ("table.fields.additional.placement", "type:envelope:eventType,c_json:envelope,c_jsonb:envelope"),
                ("table.expand.json.payload", "true"),
            ],
        ),
        dbz_table(
            p,
            "env_num",
            &format!("{text_payload}, {TYPES}"),
            &[("table.fields.additional.placement", "c_numeric:envelope,c_float8:envelope")],
        ),
        {
            let mut t = dbz_table(p, "jhdr", &format!("{DBZ}, hdrs jsonb"), &[]);
            t.walpost.push(("table.field.event.headers", s("hdrs")));
            t
        },
        debezium_table(
            p,
            "part",
            ("event_id", "int"),
            "payload_id int, my_route_field text, event_type bytea, payload_body bytea, p int",
            &[
                ("table.field.event.id", "event_id"),
                ("table.field.event.key", "payload_id"),
                ("table.field.event.payload", "payload_body"),
                ("route.by.field", "my_route_field"),
                ("table.fields.additional.placement", "p:partition"),
            ],
        ),
        dbz_table(
            p,
            "part_alias",
            &format!("{DBZ}, shard bigint"),
            &[("table.fields.additional.placement", "shard:partition:ignored,shard:header")],
        ),
        dbz_table(
            p,
            "tomb_env",
            &format!("{text_payload}, version int, somebooltype boolean, createdat timestamp, is_deleted boolean"),
            &[
                ("route.tombstone.on.empty.payload", "true"),
                ("table.field.event.timestamp", "createdat"),
                (
                    "table.fields.additional.placement",
                    "version:envelope:eventVersion,aggregatetype:envelope:aggregateType,somebooltype:envelope:someBoolType,somebooltype:header,is_deleted:envelope:deleted",
                ),
            ],
        ),
        dbz_table(
            p,
            "tomb_bare",
            &DBZ.replace("payload jsonb", "payload bytea"),
            &[("route.tombstone.on.empty.payload", "true")],
        ),
        {
            let mut t = dbz_table(p, "rx", DBZ, &[("route.topic.regex", "(?<routedByValue>[A-Za-z]+)Aggregate")]);
            t.debezium.as_mut().unwrap()[0].1 = format!("{p}rx.${{routedByValue}}.v1");
            t
        },
        {
            let mut t = dbz_table(p, "rx_num", DBZ, &[("route.topic.regex", "(.*)Aggregate")]);
            t.debezium.as_mut().unwrap()[0].1 = format!("{p}rx_num.$12");
            t
        },
        {
            let mut t = dbz_table(p, "rx_fixed", DBZ, &[]);
            t.debezium.as_mut().unwrap()[0].1 = format!("{p}rx_fixed");
            t
        },
        {
            let mut t = dbz_table(p, "rx_fall", DBZ, &[("route.topic.regex", "(?<routedByValue>.*)Aggregate")]);
            t.walpost.push(("route.topic.regex.fallthrough", toml::Value::Boolean(true)));
            t
        },
        {
            let mut t = dbz_table(p, "rx_any", DBZ, &[]);
            t.debezium.as_mut().unwrap()[0].1 = "${routedByValue}".into();
            t.walpost.push(("topics.allow", toml::Value::Array(vec![s("*")])));
            t
        },
        dbz_table(p, "route_int", &format!("{DBZ}, n int"), &[("route.by.field", "n")]),
        dbz_table(
            p,
            "miss_ignore",
            &text_payload,
            &[
                ("table.fields.additional.placement", "nonExistingField:envelope:alias,nope:header"),
                ("table.field.additional.missing", "ignore"),
            ],
        ),
        dbz_table(
            p,
            "miss_error",
            &format!("{text_payload}, extra text"),
            &[("table.fields.additional.placement", "extra:envelope"), ("table.field.additional.missing", "error")],
        ),
        {
            let mut t = dbz_table(p, "op_warn", DBZ, &[("table.op.invalid.behavior", "warn")]);
            t.id.1 = "uuid PRIMARY KEY";
            t
        },
        {
            let mut t = dbz_table(p, "op_error", DBZ, &[("table.op.invalid.behavior", "error")]);
            t.id.1 = "uuid PRIMARY KEY";
            t
        },
        {
            let mut t = dbz_table(p, "op_fatal", DBZ, &[("table.op.invalid.behavior", "fatal")]);
            t.id.1 = "uuid PRIMARY KEY";
            t
        },
        dbz_table(p, "ts_micro", &format!("{DBZ}, createdat timestamp"), &[("table.field.event.timestamp", "createdat")]),
        dbz_table(p, "ts_milli", &format!("{DBZ}, createdat timestamp(3)"), &[("table.field.event.timestamp", "createdat")]),
        dbz_table(p, "ts_tz", &format!("{DBZ}, createdat timestamptz"), &[("table.field.event.timestamp", "createdat")]),
    ];
    for column in PLAIN_TYPES {
        let v = value_of(VALUES, column);
        t.push(debezium_table(
            p,
            &format!("plain_{}", &column[2..]),
            ("id", "uuid"),
            &format!("aggregatetype text, v {}", v.sql_type),
            &[("table.field.event.key", "v"), ("table.field.event.payload", "v"), ("route.by.field", "aggregatetype")],
        ));
    }
    t
}

/// What a consumer reads.
#[derive(Debug, Clone)]
struct Want {
    topic: String,
    key: Option<Vec<u8>>,
    /// `None`: a tombstone.
    value: Option<Vec<u8>>,
    /// Every header, in order ([`ID`] for the event id).
    headers: Vec<(String, Vec<u8>)>,
    /// `None`: the key's murmur2 partition (Kafka's default partitioner, as Debezium's
    /// producer uses).
    partition: Option<i32>,
    /// `None`: the transaction's commit time (D7), or for a snapshot row the time it is
    /// produced (Debezium's processing time).
    timestamp: Option<i64>,
}

impl Want {
    fn header(mut self, name: &str, value: &[u8]) -> Want {
        self.headers.push((name.to_owned(), value.to_vec()));
        self
    }

    fn partition(mut self, p: i32) -> Want {
        self.partition = Some(p);
        self
    }

    fn timestamp(mut self, ms: i64) -> Want {
        self.timestamp = Some(ms);
        self
    }
}

fn want(topic: String, key: &[u8], value: Option<&[u8]>) -> Want {
    Want {
        topic,
        key: Some(key.to_vec()),
        value: value.map(<[u8]>::to_vec),
        headers: vec![("id".into(), ID.to_vec())],
        partition: None,
        timestamp: None,
    }
}

#[derive(Debug, Clone)]
enum Expect {
    Record(Want),
    /// Not published: a dead letter with this `walpost.error.class`, whose
    /// `walpost.error.message` names `names` (the option or column concerned).
    DeadLetter {
        class: &'static str,
        names: &'static str,
    },
}

struct Case {
    /// The Debezium test or documented behaviour checked.
    debezium: &'static str,
    /// Rows of docs/event-router.md's differences table where walpost deliberately differs.
    differs: &'static [&'static str],
    /// `schema.name`.
    table: String,
    /// The INSERT's columns and SQL values, the event id aside.
    row: Vec<(&'static str, String)>,
    /// `false`: the event id column is NULL.
    with_id: bool,
    phases: &'static [Phase],
    expect: Expect,
}

fn case(
    debezium: &'static str,
    table: &str,
    row: &[(&'static str, &str)],
    phases: &'static [Phase],
    expect: Expect,
) -> Case {
    Case {
        debezium,
        differs: &[],
        table: format!("{SCHEMA}.{table}"),
        row: row.iter().map(|(c, v)| (*c, v.to_string())).collect(),
        with_id: true,
        phases,
        expect,
    }
}

fn differs(rows: &'static [&'static str], c: Case) -> Case {
    Case { differs: rows, ..c }
}

fn without_id(c: Case) -> Case {
    Case { with_id: false, ..c }
}

fn dead(class: &'static str, names: &'static str) -> Expect {
    Expect::DeadLetter { class, names }
}

/// Debezium's test row: aggregatetype, aggregateid 10711fa5, type UserCreated, payload.
fn dbz_row(aggregate_type: &str, payload: &str) -> Vec<(&'static str, String)> {
    vec![
        ("aggregatetype", format!("'{aggregate_type}'")),
        ("aggregateid", "'10711fa5'".into()),
        ("type", "'UserCreated'".into()),
        ("payload", payload.into()),
    ]
}

fn dbz_case(
    debezium: &'static str,
    table: &str,
    row: Vec<(&'static str, String)>,
    phases: &'static [Phase],
    expect: Expect,
) -> Case {
    Case { debezium, differs: &[], table: format!("{SCHEMA}.{table}"), row, with_id: true, phases, expect }
}

fn with(mut row: Vec<(&'static str, String)>, more: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    for (c, v) in more {
        match row.iter_mut().find(|(col, _)| col == c) {
            Some(slot) => slot.1 = v.to_string(),
            None => row.push((c, v.to_string())),
        }
    }
    row
}

fn types_row(base: Vec<(&'static str, String)>, values: &[TypeValue]) -> Vec<(&'static str, String)> {
    let mut row = base;
    row.extend(values.iter().map(|v| (v.column, v.sql.to_owned())));
    row
}

fn null_types_row(base: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    let mut row = base;
    row.extend(VALUES.iter().map(|v| (v.column, "NULL".to_owned())));
    row
}

const USER_PAYLOAD: &str = r#"'{"email": "gh@mefi.in"}'"#;
const USER_JSON: &[u8] = br#"{"email": "gh@mefi.in"}"#;
/// The same as text inside an envelope: a JSON string.
const USER_JSON_STRING: &str = r#""{\"email\": \"gh@mefi.in\"}""#;

/// A recent day for record timestamps: Kafka deletes records older than the topic's
/// retention (7 days by default) soon after they arrive, so Debezium's 2019 dates would
/// vanish from the topic before they are read.
struct Day {
    /// `YYYY-MM-DD`.
    date: String,
    /// Days since 1970-01-01.
    epoch_days: i64,
}

impl Day {
    /// That day's `hh:mm:ss` + `ms` in ms since the epoch (UTC).
    fn ms(&self, h: i64, m: i64, s: i64, ms: i64) -> i64 {
        self.epoch_days * 86_400_000 + ((h * 60 + m) * 60 + s) * 1000 + ms
    }
}

fn cases(p: &str, day: &Day) -> Vec<Case> {
    use Expect::Record;
    let at = |time: &str| format!("'{} {time}'", day.date);
    let topic = |t: &str| format!("{p}{t}");
    let user = |table: &str| want(topic(&format!("{table}.User")), b"10711fa5", Some(b"{}"));
    let mut c = vec![
        // ---- Basic configuration: Debezium's defaults, as import-debezium writes them ----
        dbz_case(
            "AbstractEventRouterTest.shouldConsumeRecordsFromInsert / EventRouterTest.canExtractTableFields: topic <replacement>.<aggregatetype>, key aggregateid, value the payload alone (its jsonb text), header id; a snapshot row (op r, startConnectorWithInitialSnapshotRecord) routes the same",
            "dbz",
            dbz_row("User", USER_PAYLOAD),
            SNAPSHOT_STREAM,
            Record(want(topic("dbz.User"), b"10711fa5", Some(USER_JSON))),
        ),
        dbz_case(
            "EventRouterTest.canRouteBasedOnField",
            "dbz",
            dbz_row("Address", "'{}'"),
            STREAM,
            Record(want(topic("dbz.Address"), b"10711fa5", Some(b"{}"))),
        ),
        // differs from Debezium: a NULL payload without tombstones is not published (Debezium emits the null value).
        differs(
            &["D2"],
            dbz_case(
                "AbstractEventRouterTest.shouldNotProduceTombstoneEventForNullPayload: a NULL payload without route.tombstone.on.empty.payload",
                "dbz",
                dbz_row("User", "NULL"),
                STREAM,
                dead("empty_payload", "route.tombstone.on.empty.payload"),
            ),
        ),
        // differs from Debezium: a NULL key is not published (Debezium sends a null key: no per-aggregate order).
        differs(
            &["D6"],
            dbz_case(
                "EventRouterDelegate.defineRecordKey: a NULL key column",
                "dbz",
                with(dbz_row("User", "'{}'"), &[("aggregateid", "NULL")]),
                STREAM,
                dead("null_field", "table.field.event.key"),
            ),
        ),
        // differs from Debezium: a NULL event id is not published (Debezium adds an id header with a null value).
        differs(
            &["D6"],
            without_id(dbz_case(
                "EventRouterDelegate: a NULL event id column",
                "dbz",
                dbz_row("User", "'{}'"),
                STREAM,
                dead("null_field", "table.field.event.id"),
            )),
        ),
        dbz_case(
            "RegexRouter: a NULL route value fails (Debezium fails the task)",
            "dbz",
            with(dbz_row("User", "'{}'"), &[("aggregatetype", "NULL")]),
            STREAM,
            dead("null_field", "route.by.field"),
        ),
        dbz_case(
            "Kafka topic names: a route value with characters Kafka refuses fails (Debezium's producer fails)",
            "dbz",
            dbz_row("User Events", "'{}'"),
            STREAM,
            dead("invalid_topic", "route.topic.replacement"),
        ),
        // ---- Every table field configured ----
        // differs from Debezium: the eventType header (a walpost extension, here under its deprecated option name).
        differs(
            &["D1"],
            case(
                "EventRouterTest.canConfigureEveryTableField: table.field.event.id/key/payload and route.by.field; table.field.event.type (deprecated spelling of table.field.event.type.header) adds eventType",
                "cfg",
                &[("payload_id", "'10711fa5'"), ("event_type", "'UserCreated'"), ("payload_body", "'{}'")],
                STREAM,
                Record(want(topic("cfg.10711fa5"), b"10711fa5", Some(b"{}")).header("eventType", b"UserCreated")),
            ),
        ),
        // differs from Debezium: an empty payload without tombstones is not published (Debezium emits the empty value).
        differs(
            &["D2"],
            case(
                "EventRouterTest.noTombstoneIfNotConfigured: an empty text payload without tombstones",
                "cfg",
                &[("payload_id", "'10711fa5'"), ("event_type", "'UserCreated'"), ("payload_body", "''")],
                STREAM,
                dead("empty_payload", "route.tombstone.on.empty.payload"),
            ),
        ),
        // differs from Debezium: walpost's defaults (aggregate_type, aggregate_id, an eventType header).
        differs(
            &["D1"],
            Case {
                debezium: "adoc Basic outbox table: walpost's own defaults on the migration's events.outbox",
                differs: &[],
                table: "events.outbox".into(),
                row: vec![
                    ("aggregate_type", "'order'".into()),
                    ("aggregate_id", "'5f0c6b1e-0000-4000-8000-000000000001'".into()),
                    ("event_type", "'OrderPlaced'".into()),
                    ("payload", r#"'{"total": 5}'"#.into()),
                ],
                with_id: true,
                phases: STREAM,
                expect: Record(
                    want(topic("dflt.order"), b"5f0c6b1e-0000-4000-8000-000000000001", Some(br#"{"total": 5}"#))
                        .header("eventType", b"OrderPlaced"),
                ),
            },
        ),
    ];

    // ---- Header placements, every type (SimpleHeaderConverter) ----
    let hdr_headers = |values: &[TypeValue]| {
        let mut w = user("hdr").header("eventType", b"UserCreated");
        for (column, alias) in HEADER_ALIASES {
            let v = values.iter().find(|v| v.column == *column).unwrap();
            w = w.header(if alias.is_empty() { column } else { alias }, v.header);
        }
        w
    };
    c.push(dbz_case(
        "AbstractEventRouterTest.shouldSendEventTypeAsHeader (DBZ-1385) and shouldSupportAllFeatures: :header placements with and without aliases, case-insensitive, of every type; the value stays the bare payload",
        "hdr",
        types_row(dbz_row("User", "'{}'"), VALUES),
        ALL_PHASES,
        Record(hdr_headers(VALUES)),
    ));
    c.push(dbz_case(
        ":header placements of empty strings and bytes, false, zero, the smallest bigint, the epoch and before it",
        "hdr",
        types_row(dbz_row("User", "'{}'"), EDGES),
        STREAM_ESCAPE,
        Record(hdr_headers(EDGES)),
    ));
    // differs from Debezium: a NULL column adds no header (Debezium adds one with a null value).
    c.push(differs(
        &["D8"],
        dbz_case(
            "adoc Emitting additional fields: NULL columns placed as headers",
            "hdr",
            null_types_row(dbz_row("User", "'{}'")),
            STREAM,
            Record(user("hdr").header("eventType", b"UserCreated")),
        ),
    ));

    // ---- Envelope placements, every type (JsonConverter without schemas) ----
    let envelope = |values: Option<&[TypeValue]>| {
        let mut json = format!(r#"{{"payload":{USER_JSON_STRING},"eventType":"UserCreated","payloadId":"10711fa5""#);
        for (column, alias) in ENVELOPE_ALIASES {
            let field = if alias.is_empty() { column } else { alias };
            let v = match values {
                Some(values) => values.iter().find(|v| v.column == *column).unwrap().json.unwrap(),
                None => "null",
            };
            json.push_str(&format!(r#","{field}":{v}"#));
        }
        json.push('}');
        want(topic("env.User"), b"10711fa5", Some(json.as_bytes())).header("payloadType", b"UserCreated")
    };
    c.push(dbz_case(
        "EventRouterTest.canSetPayloadTypeIntoTheEnvelope(WithAlias) / canSetMultipleFieldsIntoTheEnvelope: :envelope placements with and without aliases, of every type, and a header from the same column; a text payload is a JSON string",
        "env",
        types_row(dbz_row("User", USER_PAYLOAD), VALUES),
        ALL_PHASES,
        Record(envelope(Some(VALUES))),
    ));
    c.push(dbz_case(
        ":envelope placements of empty strings and bytes, false, zero, the smallest bigint, the epoch and before it",
        "env",
        types_row(dbz_row("User", USER_PAYLOAD), EDGES),
        STREAM_ESCAPE,
        Record(envelope(Some(EDGES))),
    ));
    c.push(dbz_case(
        "adoc Emitting additional fields: NULL columns placed in the envelope are null",
        "env",
        null_types_row(dbz_row("User", USER_PAYLOAD)),
        STREAM,
        Record(envelope(None)),
    ));
    // differs from Debezium: as in D2, for an envelope.
    c.push(differs(
        &["D2"],
        dbz_case(
            "AbstractEventRouterTest.shouldNotProduceTombstoneEventForNullPayload: a NULL payload with envelope placements, without tombstones",
            "env",
            null_types_row(dbz_row("User", "NULL")),
            STREAM,
            dead("empty_payload", "route.tombstone.on.empty.payload"),
        ),
    ));
    // differs from Debezium: json/jsonb go into the envelope as documents, verbatim (Debezium: JSON strings;
    // with table.expand.json.payload a document rebuilt from an inferred schema, its empty arrays and null fields dropped).
    c.push(differs(
        &["D3"],
        dbz_case(
            "AbstractEventRouterTest.shouldSendEventTypeAsValue (DBZ-2014) with table.expand.json.payload = true: a jsonb payload and json/jsonb envelope fields",
            "env_json",
            types_row(dbz_row("User", r#"'{"e": [], "a": null}'"#), VALUES),
            STREAM,
            Record(want(
                topic("env_json.User"),
                b"10711fa5",
                Some(br#"{"payload":{"a": null, "e": []},"eventType":"UserCreated","c_json":{"b" : [1, 2]},"c_jsonb":{"a": null, "e": []}}"#),
            )),
        ),
    ));
    // differs from Debezium: numeric is a JSON number (Debezium: base64 of the unscaled value); NaN a string (D18).
    c.push(differs(
        &["D17", "D18"],
        dbz_case(
            "JsonConverter: numeric and float8 envelope fields",
            "env_num",
            types_row(dbz_row("User", "'p'"), VALUES),
            STREAM,
            Record(want(
                topic("env_num.User"),
                b"10711fa5",
                Some(br#"{"payload":"p","c_numeric":12.50,"c_float8":"NaN"}"#),
            )),
        ),
    ));
    c.push(differs(
        &["D17", "D18"],
        dbz_case(
            "JsonConverter: a negative numeric and a large float8 in the envelope",
            "env_num",
            with(dbz_row("User", "'p'"), &[("c_numeric", "-0.5"), ("c_float8", "1e30")]),
            STREAM,
            Record(want(
                topic("env_num.User"),
                b"10711fa5",
                Some(br#"{"payload":"p","c_numeric":-0.50,"c_float8":1e+30}"#),
            )),
        ),
    ));
    // differs from Debezium: a walpost extension (no JSON headers column in Debezium).
    c.push(differs(
        &["D12"],
        dbz_case(
            "adoc Distributed tracing: a traceparent travels as a header, from table.field.event.headers",
            "jhdr",
            with(
                dbz_row("User", "'{}'"),
                &[(
                    "hdrs",
                    r#"'{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "retries": 3}'"#,
                )],
            ),
            STREAM,
            Record(
                user("jhdr")
                    .header("retries", b"3")
                    .header("traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            ),
        ),
    ));

    // ---- Key and bare value of every type (StringConverter / BinaryDataConverter) ----
    for column in PLAIN_TYPES {
        let v = value_of(VALUES, column);
        let name = &column[2..];
        c.push(Case {
            debezium: match *column {
                "c_bigint" | "c_int" => "EventRouterTest.canPassIntKey (DBZ-2152): an integer key and value",
                "c_bytea" => "EventRouterTest.canPassBinaryKey / canPassBinaryMessage (DBZ-2152): a bytea key and value are its bytes",
                "c_varchar" => "AbstractEventRouterTest.alterTableModifyPayload: a varchar key and payload are the text",
                _ => "table.field.event.key / table.field.event.payload of this type: the key and the bare value",
            },
            differs: &[],
            table: format!("{SCHEMA}.plain_{name}"),
            row: vec![("aggregatetype", format!("'{name}'")), ("v", v.sql.to_owned())],
            with_id: true,
            phases: if *column == "c_bytea" { STREAM_ESCAPE } else { STREAM },
            expect: Record(want(topic(&format!("plain_{name}.{name}")), v.plain, Some(v.plain))),
        });
    }
    c.push(Case {
        debezium: "EventRouterDelegate isDeleteEvent: an empty bytea payload is not empty there: an empty value with an empty key",
        differs: &[],
        table: format!("{SCHEMA}.plain_bytea"),
        row: vec![("aggregatetype", "'empty'".into()), ("v", r"'\x'".into())],
        with_id: true,
        phases: STREAM_ESCAPE,
        expect: Record(want(topic("plain_bytea.empty"), b"", Some(b""))),
    });

    // ---- Partition placement ----
    let part = |p_sql: &str| {
        vec![
            ("payload_id", "1232".to_owned()),
            ("my_route_field", "'routename'".to_owned()),
            ("event_type", r"'\x436f6f6c536368656d6143726561746564'".to_owned()),
            ("payload_body", r"'\x7b7d'".to_owned()),
            ("p", p_sql.to_owned()),
        ]
    };
    let part_want = || want(topic("part.routename"), b"1232", Some(b"{}"));
    c.push(dbz_case(
        "EventRouterTest.canSetPartitionWithAdditionalFields (DBZ-5089): p:partition, with an int id and key and a bytea payload",
        "part",
        part("2"),
        STREAM_ESCAPE,
        Record(part_want().partition(2)),
    ));
    c.push(dbz_case(
        "EventRouterDelegate: a NULL partition column leaves the partition to the partitioner (murmur2 of the key)",
        "part",
        part("NULL"),
        STREAM,
        Record(part_want()),
    ));
    // differs from Debezium: a negative partition is refused when routing (Debezium's producer refuses it).
    c.push(differs(
        &["D11"],
        dbz_case(
            "Kafka producer: a partition must not be negative",
            "part",
            part("-1"),
            STREAM,
            dead("bad_value", "table.fields.additional.placement"),
        ),
    ));
    // differs from Debezium: a bigint partition column is accepted (Debezium reads int4 only).
    c.push(differs(
        &["D11"],
        dbz_case(
            "adoc Emitting additional fields: for the partition placement an alias has no effect; the same column as a header too",
            "part_alias",
            with(dbz_row("User", "'{}'"), &[("shard", "1")]),
            STREAM,
            Record(user("part_alias").partition(1).header("shard", b"1")),
        ),
    ));

    // ---- Tombstones: route.tombstone.on.empty.payload ----
    let tomb = |payload: &str| {
        with(
            dbz_row("UserEmail", payload),
            &[("version", "1"), ("somebooltype", "true"), ("createdat", &at("20:52:59")), ("is_deleted", "true")],
        )
    };
    let tomb_want = |value: Option<&[u8]>| {
        want(topic("tomb_env.UserEmail"), b"10711fa5", value)
            .header("somebooltype", b"true")
            .timestamp(day.ms(20, 52, 59, 0))
    };
    c.push(dbz_case(
        "AbstractEventRouterTest.shouldSupportAllFeatures (DBZ-1169): int, varchar and boolean envelope fields, a boolean header, table.field.event.timestamp from a timestamp column; tombstones on, a payload present",
        "tomb_env",
        with(tomb(USER_PAYLOAD), &[("is_deleted", "false")]),
        STREAM,
        Record(tomb_want(Some(
            format!(r#"{{"payload":{USER_JSON_STRING},"eventVersion":1,"aggregateType":"UserEmail","someBoolType":true,"deleted":false}}"#)
                .as_bytes(),
        ))),
    ));
    c.push(dbz_case(
        "AbstractEventRouterTest.shouldProduceTombstoneEventForNullPayload (DBZ-1320): a NULL payload with envelope placements is a tombstone with its key, headers and timestamp",
        "tomb_env",
        tomb("NULL"),
        STREAM,
        Record(tomb_want(None)),
    ));
    c.push(dbz_case(
        "AbstractEventRouterTest.shouldProduceTombstoneEventForEmptyPayload (DBZ-1320): an empty text payload is a tombstone",
        "tomb_env",
        tomb("''"),
        STREAM,
        Record(tomb_want(None)),
    ));
    c.push(dbz_case(
        "EventRouterDelegate isDeleteEvent: a payload that trims to nothing (Java's String.trim) is a tombstone",
        "tomb_env",
        tomb(r"E' \t\n'"),
        STREAM,
        Record(tomb_want(None)),
    ));
    c.push(dbz_case(
        "EventRouterDelegate isDeleteEvent: a NULL bytea payload without envelope is a tombstone",
        "tomb_bare",
        dbz_row("User", "NULL"),
        STREAM_ESCAPE,
        Record(want(topic("tomb_bare.User"), b"10711fa5", None)),
    ));
    c.push(dbz_case(
        "EventRouterDelegate isDeleteEvent: an empty bytea payload is not empty there (a byte buffer's toString): an empty value",
        "tomb_bare",
        dbz_row("User", r"'\x'"),
        STREAM_ESCAPE,
        Record(want(topic("tomb_bare.User"), b"10711fa5", Some(b""))),
    ));
    c.push(dbz_case(
        "EventRouterTest.canMarkAnEventAsDeleted: with tombstones on, a non-empty bytea payload is its bytes",
        "tomb_bare",
        dbz_row("User", r"'\x7b7d'"),
        STREAM_ESCAPE,
        Record(want(topic("tomb_bare.User"), b"10711fa5", Some(b"{}"))),
    ));

    // ---- Topic routing: route.topic.regex, route.topic.replacement ----
    c.push(dbz_case(
        "adoc route.topic.regex / route.topic.replacement: a named group",
        "rx",
        dbz_row("OrderAggregate", "'{}'"),
        STREAM,
        Record(want(topic("rx.Order.v1"), b"10711fa5", Some(b"{}"))),
    ));
    // differs from Debezium: a value the regex does not match is refused (Debezium's RegexRouter uses the value as the topic).
    c.push(differs(
        &["D5"],
        dbz_case(
            "RegexRouter: a route value the regex does not match",
            "rx",
            dbz_row("order-7", "'{}'"),
            STREAM,
            dead("route_no_match", "route.topic.regex"),
        ),
    ));
    c.push(dbz_case(
        "RegexRouter (Java's replacement syntax): $12 is group 1 then '2' when there is no group 12",
        "rx_num",
        dbz_row("OrderAggregate", "'{}'"),
        STREAM,
        Record(want(topic("rx_num.Order2"), b"10711fa5", Some(b"{}"))),
    ));
    c.push(dbz_case(
        "RegexRouter: a replacement without a group reference is one fixed topic",
        "rx_fixed",
        dbz_row("Whatever", "'{}'"),
        STREAM,
        Record(want(topic("rx_fixed"), b"10711fa5", Some(b"{}"))),
    ));
    c.push(dbz_case(
        "RegexRouter: a matched value with route.topic.regex.fallthrough = true",
        "rx_fall",
        dbz_row("PaymentAggregate", "'{}'"),
        STREAM,
        Record(want(topic("rx_fall.Payment"), b"10711fa5", Some(b"{}"))),
    ));
    c.push(dbz_case(
        "RegexRouter: a value the regex does not match is the topic as it is (route.topic.regex.fallthrough = true)",
        "rx_fall",
        dbz_row(&topic("rx_fall.Refund"), "'{}'"),
        STREAM,
        Record(want(topic("rx_fall.Refund"), b"10711fa5", Some(b"{}"))),
    ));
    // differs from Debezium: topics outside topics.allow (default: the replacement's literal prefix) are refused.
    c.push(differs(
        &["D5"],
        dbz_case(
            "RegexRouter with fallthrough: an unmatched value outside the allowed topics",
            "rx_fall",
            dbz_row("billing.payments", "'{}'"),
            STREAM,
            dead("topic_not_allowed", "topics.allow"),
        ),
    ));
    c.push(dbz_case(
        "adoc route.topic.replacement = ${routedByValue}: the value is the topic (topics.allow = [\"*\"])",
        "rx_any",
        dbz_row(&topic("rx_any.Free"), "'{}'"),
        STREAM,
        Record(want(topic("rx_any.Free"), b"10711fa5", Some(b"{}"))),
    ));
    // differs from Debezium: Kafka's internal topics are refused whatever topics.allow says.
    c.push(differs(
        &["D5"],
        dbz_case(
            "RegexRouter: a route value naming a Kafka internal topic",
            "rx_any",
            dbz_row("__consumer_offsets", "'{}'"),
            STREAM,
            dead("topic_not_allowed", "'__'"),
        ),
    ));
    // differs from Debezium: a non-text route column is routed by its text (Debezium's getString fails).
    c.push(differs(
        &["D9"],
        dbz_case(
            "EventRouterDelegate: route.by.field of an int column",
            "route_int",
            with(dbz_row("User", "'{}'"), &[("n", "7")]),
            STREAM,
            Record(want(topic("route_int.7"), b"10711fa5", Some(b"{}"))),
        ),
    ));

    // ---- table.field.additional.missing ----
    c.push(dbz_case(
        "EventRouterTest.canSetFieldIntoTheEnvelopeWithMissingField: missing columns with table.field.additional.missing = ignore: still an envelope, without them",
        "miss_ignore",
        dbz_row("User", "'{}'"),
        STREAM,
        Record(want(topic("miss_ignore.User"), b"10711fa5", Some(br#"{"payload":"{}"}"#))),
    ));
    c.push(dbz_case(
        "table.field.additional.missing = error: the column present",
        "miss_error",
        with(dbz_row("User", "'{}'"), &[("extra", "'x'")]),
        STREAM,
        Record(want(topic("miss_error.User"), b"10711fa5", Some(br#"{"payload":"{}","extra":"x"}"#))),
    ));
    c.push(dbz_case(
        "EventRouterTest.shouldFailOnMissingField: the envelope column dropped while streaming, with table.field.additional.missing = error",
        "miss_error",
        dbz_row("User", "'{}'"),
        LATER,
        dead("missing_column", "table.fields.additional.placement"),
    ));

    // ---- table.op.invalid.behavior: the rows around the UPDATE/DELETE/TRUNCATE ----
    for table in ["op_warn", "op_error", "op_fatal"] {
        c.push(dbz_case(
            "table.op.invalid.behavior: the INSERT before the invalid operations",
            table,
            dbz_row("User", "'{}'"),
            STREAM,
            Record(user(table)),
        ));
    }
    for table in ["op_warn", "op_error"] {
        c.push(dbz_case(
            "EventRouterDelegate handleUnexpectedOperation (warn, error): the UPDATE, DELETE and TRUNCATE before this INSERT published nothing",
            table,
            dbz_row("User", "'{}'"),
            LATER,
            Record(user(table)),
        ));
    }

    // ---- table.field.event.timestamp ----
    let ts = |_table: &str, value: &str| with(dbz_row("User", "'{}'"), &[("createdat", value)]);
    c.push(dbz_case(
        "AbstractEventRouterTest.shouldConvertMicrosecondsTimestampToMilliseconds (DBZ-1707): a timestamp (MicroTimestamp) column, in ms",
        "ts_micro",
        ts("ts_micro", &at("20:52:59.123456")),
        STREAM,
        Record(user("ts_micro").timestamp(day.ms(20, 52, 59, 123))),
    ));
    c.push(dbz_case(
        "EventRouterDelegate.getEventTimestampMs: a NULL timestamp column falls back to the event's own time",
        "ts_micro",
        ts("ts_micro", "NULL"),
        STREAM,
        Record(user("ts_micro")),
    ));
    // differs from Debezium: infinity is refused (Debezium turns it into a sentinel far in the future).
    c.push(differs(
        &["D10"],
        dbz_case(
            "PostgreSQL connector TIMESTAMP type: infinity as the record timestamp",
            "ts_micro",
            ts("ts_micro", "'infinity'"),
            STREAM,
            dead("bad_value", "table.field.event.timestamp"),
        ),
    ));
    // differs from Debezium: a time before 1970 is refused when routing (Debezium's producer refuses it).
    c.push(differs(
        &["D10"],
        dbz_case(
            "Kafka producer: a record timestamp before 1970",
            "ts_micro",
            ts("ts_micro", "'1969-12-31 23:59:59'"),
            STREAM,
            dead("bad_value", "table.field.event.timestamp"),
        ),
    ));
    c.push(dbz_case(
        "EventRouterTest.canSetTimestampByUserDefinedConfiguration: a timestamp(3) (Timestamp) column",
        "ts_milli",
        ts("ts_milli", &at("20:52:59.123")),
        STREAM,
        Record(user("ts_milli").timestamp(day.ms(20, 52, 59, 123))),
    ));
    // differs from Debezium: a timestamptz column is accepted (Debezium refuses ZonedTimestamp, a string).
    c.push(differs(
        &["D10"],
        dbz_case(
            "EventRouterDelegate.getEventTimestampMs: a timestamptz column with a +02:30 offset",
            "ts_tz",
            ts("ts_tz", &at("23:22:59.5+02:30")),
            STREAM,
            Record(user("ts_tz").timestamp(day.ms(20, 52, 59, 500))),
        ),
    ));
    c
}

/// One insertion of a case.
struct Instance<'a> {
    case: &'a Case,
    phase: Phase,
    /// The event id, `None` when the case inserts NULL.
    id: Option<String>,
    insert: String,
}

fn instances<'a>(cases: &'a [Case], tables: &[Table]) -> Vec<Instance<'a>> {
    let mut out = Vec::new();
    let mut n = 0;
    for c in cases {
        let (id_column, id_is_int) = match tables.iter().find(|t| t.name == c.table) {
            Some(t) => (t.id.0, t.id.1.contains("int")),
            None => ("id", true), // events.outbox: bigserial
        };
        for phase in c.phases {
            n += 1;
            let id = c.with_id.then(|| {
                if id_is_int {
                    (1000 + n).to_string()
                } else {
                    format!("00000000-0000-4000-8000-{n:012}")
                }
            });
            let mut columns = vec![id_column.to_owned()];
            let mut values = vec![id.as_ref().map_or("NULL".to_owned(), |id| format!("'{id}'"))];
            for (col, v) in &c.row {
                columns.push((*col).to_owned());
                values.push(v.clone());
            }
            let insert = format!("INSERT INTO {} ({}) VALUES ({});", c.table, columns.join(", "), values.join(", "));
            out.push(Instance { case: c, phase: *phase, id, insert });
        }
    }
    out
}

/// Where a record of this instance is found: its topic and event id, or for a dead
/// letter its event id and error class.
fn locator(i: &Instance<'_>, dead_topic: &str) -> String {
    let id = i.id.as_deref().unwrap_or("");
    match &i.case.expect {
        Expect::Record(w) => format!("{} id={id}", w.topic),
        Expect::DeadLetter { class, .. } => format!("{dead_topic} id={id} class={class}"),
    }
}

fn record_locator(r: &Consumed, dead_topic: &str) -> String {
    let text = |name: &str| r.header(name).map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
    if r.topic == dead_topic {
        format!("{dead_topic} id={} class={}", text("walpost.event.id"), text("walpost.error.class"))
    } else {
        format!("{} id={}", r.topic, text("id"))
    }
}

/// Time windows (ms since the epoch) in which each phase's rows were committed, or for
/// the snapshot, published.
type Windows = HashMap<Phase, (i64, i64)>;

/// Compares every instance with the records; returns one line per difference.
fn compare(
    instances: &[Instance<'_>],
    records: &[Consumed],
    partitions: &HashMap<String, i32>,
    dead_topic: &str,
    windows: &Windows,
) -> Vec<String> {
    let mut by_locator: BTreeMap<String, Vec<&Consumed>> = BTreeMap::new();
    for r in records {
        by_locator.entry(record_locator(r, dead_topic)).or_default().push(r);
    }
    let mut failures = Vec::new();
    for i in instances {
        let loc = locator(i, dead_topic);
        let what = format!(
            "[{:?}] {}{}",
            i.phase,
            i.case.debezium,
            if i.case.differs.is_empty() {
                String::new()
            } else {
                format!(" (differs: {})", i.case.differs.join(", "))
            }
        );
        let found = by_locator.remove(&loc).unwrap_or_default();
        let [r] = found.as_slice() else {
            failures.push(format!("{what}\n  expected one record at {loc}, found {}: {found:?}", found.len()));
            continue;
        };
        let problem = match &i.case.expect {
            Expect::DeadLetter { names, .. } => {
                let message = r.header("walpost.error.message").map(String::from_utf8_lossy).unwrap_or_default();
                if !message.contains(names) {
                    Some(format!("the dead letter's message does not name {names}: {message}"))
                } else if r.header("walpost.original.topic") != Some(b"") {
                    Some("a routing failure has no original topic".into())
                } else {
                    None
                }
            }
            Expect::Record(w) => check_record(i, w, r, partitions, windows),
        };
        if let Some(p) = problem {
            failures.push(format!("{what}\n  {p}\n  expected {:?}\n  got      {r:?}", i.case.expect));
        }
    }
    for (loc, rs) in by_locator {
        failures.push(format!("unexpected record(s) at {loc}: {rs:?}"));
    }
    failures
}

fn check_record(
    i: &Instance<'_>,
    w: &Want,
    r: &Consumed,
    partitions: &HashMap<String, i32>,
    windows: &Windows,
) -> Option<String> {
    let id = i.id.as_deref().unwrap_or("").as_bytes();
    let mut headers: Vec<(String, Vec<u8>)> =
        w.headers.iter().map(|(k, v)| (k.clone(), if v == ID { id.to_vec() } else { v.clone() })).collect();
    if i.phase == Phase::Snapshot {
        // differs from Debezium (D20): snapshot records say so.
        headers.push(("walpost.snapshot".into(), b"true".to_vec()));
    }
    if r.key != w.key {
        return Some("key".into());
    }
    if r.value != w.value {
        return Some(format!(
            "value: expected {:?}, got {:?}",
            w.value.as_deref().map(String::from_utf8_lossy),
            r.value.as_deref().map(String::from_utf8_lossy)
        ));
    }
    if r.headers != headers {
        return Some(format!("headers: expected {headers:?}"));
    }
    let partition = match w.partition {
        Some(p) => p,
        None => match partitions.get(&r.topic) {
            Some(count) => java_partition(r.key.as_deref().unwrap_or_default(), *count),
            None => return Some(format!("no partition count for {}", r.topic)),
        },
    };
    if r.partition != partition {
        return Some(format!("partition {} instead of {partition}", r.partition));
    }
    let Some(ts) = r.timestamp else {
        return Some("no timestamp".into());
    };
    match w.timestamp {
        Some(want) if ts != want => Some(format!("timestamp {ts} instead of {want}")),
        Some(_) => None,
        None => {
            let (from, to) = windows[&i.phase];
            (ts < from || ts > to + 1).then(|| format!("timestamp {ts} outside [{from}, {to}]"))
        }
    }
}

const NOW_MS: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Inserts the phase's rows in one transaction, after `before` (statements of their
/// own); returns the database clock (ms) before and after.
fn insert_phase(w: &World, instances: &[Instance<'_>], phase: Phase, before: &str) -> (i64, i64) {
    let inserts: Vec<&str> = instances.iter().filter(|i| i.phase == phase).map(|i| i.insert.as_str()).collect();
    let out = w.sql(&format!("SELECT {NOW_MS};\n{before}\nBEGIN;\n{}\nCOMMIT;\nSELECT {NOW_MS};", inserts.join("\n")));
    let ms = |line: Option<&str>| line.and_then(|l| l.trim().parse::<i64>().ok()).expect("clock");
    (ms(out.lines().next()), ms(out.lines().last()))
}

fn db_now_ms(w: &World) -> i64 {
    w.sql(&format!("SELECT {NOW_MS}")).parse().unwrap()
}

/// The router of a Debezium-configured table: a connector with these EventRouter
/// options, converted by `walpost import-debezium` (which must call the conversion
/// complete: exit 0).
fn import_debezium(t: &Table, options: &[(&'static str, String)]) -> toml::Table {
    let mut config = serde_json::Map::new();
    let mut set = |k: &str, v: &str| config.insert(k.to_owned(), serde_json::Value::String(v.to_owned()));
    set("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
    set("plugin.name", "pgoutput");
    set("table.include.list", &t.name);
    set("transforms", "outbox");
    set("transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter");
    for (k, v) in options {
        set(&format!("transforms.outbox.{k}"), v);
    }
    let path = std::env::temp_dir().join(format!("{}.json", testkit::unique_name(&format!("dbz-{}", t.short()))));
    std::fs::write(&path, serde_json::json!({ "name": t.short(), "config": config }).to_string()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_walpost")).arg("import-debezium").arg(&path).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "import-debezium of {}'s connector is incomplete:\n{stdout}{}",
        t.name,
        String::from_utf8_lossy(&out.stderr)
    );
    let file: toml::Table = toml::from_str(&stdout).unwrap();
    match file.get("router") {
        Some(toml::Value::Table(r)) => r.clone(),
        other => panic!("import-debezium printed no [router] for {}: {other:?}\n{stdout}", t.name),
    }
}

/// The whole configuration: events.outbox with walpost's defaults ([router]) and one
/// `[[outbox]]` per table.
fn config_file(w: &World, tables: &[Table]) -> (String, Vec<toml::Table>) {
    let p = &w.topic_prefix;
    let mut root = toml::Table::new();
    root.insert("on_permanent_error".into(), s("dead_letter"));
    root.insert("dead_letter_topic".into(), s(&format!("{p}dead")));
    root.insert("snapshot".into(), s("initial"));
    let mut base = toml::Table::new();
    base.insert("route.topic.replacement".into(), s(&format!("{p}dflt.${{routedByValue}}")));
    root.insert("router".into(), toml::Value::Table(base));
    let mut routers = Vec::new();
    let mut outboxes = Vec::new();
    for t in tables {
        let mut router = match &t.debezium {
            Some(options) => import_debezium(t, options),
            None => toml::Table::new(),
        };
        for (k, v) in &t.walpost {
            router.insert((*k).to_owned(), v.clone());
        }
        routers.push(router.clone());
        let mut o = toml::Table::new();
        o.insert("table".into(), s(&t.name));
        o.insert("router".into(), toml::Value::Table(router));
        outboxes.push(toml::Value::Table(o));
    }
    root.insert("outbox".into(), toml::Value::Array(outboxes));
    let path = std::env::temp_dir().join(format!("{}.toml", w.db));
    std::fs::write(&path, toml::to_string(&root).unwrap()).unwrap();
    (path.display().to_string(), routers)
}

/// `walpost --config <file> run` with the World's connection, slot and publication.
fn run_args(w: &World, config: &str) -> Vec<String> {
    let mut args = vec!["--config".to_string(), config.to_owned()];
    let mut base = w.args();
    let i = base.iter().position(|a| a == "--topic").unwrap();
    base.drain(i..i + 2);
    args.extend(base);
    args
}

/// Waits until the prefix's topics hold `count` records (or `WAIT` passes), then reads
/// them all.
fn read_when(w: &World, count: usize) -> Vec<Consumed> {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        let total: i64 = high_watermarks(&w.kafka_bootstrap, &w.topic_prefix).values().sum();
        if total as usize >= count {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    read_all(&w.kafka_bootstrap, &w.topic_prefix)
}

fn log_has(log: &str, level: &str, text: &str) -> bool {
    log.lines().any(|l| l.contains(level) && l.contains(text))
}

/// The UPDATE, DELETE and TRUNCATE of the `warn` and `error` tables, and the column
/// `miss_error` loses, between the Stream and Later rows.
fn invalid_operations() -> String {
    let mut sql = String::new();
    for t in ["op_warn", "op_error"] {
        sql.push_str(&format!(
            "UPDATE {SCHEMA}.{t} SET type = 'Changed';\nDELETE FROM {SCHEMA}.{t};\nTRUNCATE {SCHEMA}.{t};\n"
        ));
    }
    sql.push_str(&format!("ALTER TABLE {SCHEMA}.miss_error DROP COLUMN extra;\n"));
    sql
}

/// Every case of [`cases`], in one database and (two runs of) one walpost process; see
/// the module docs.
#[test]
fn debezium_event_router_cases_end_to_end() {
    let started = Instant::now();
    let w = World::new("conf");
    let p = w.topic_prefix.clone();
    let dead_topic = format!("{p}dead");
    let tables = tables(&p);
    let yesterday = w.sql("SELECT d, d - date '1970-01-01' FROM (SELECT (now() AT TIME ZONE 'UTC')::date - 1 AS d) x");
    let (date, days) = yesterday.split_once('|').unwrap();
    let cases = cases(&p, &Day { date: date.to_owned(), epoch_days: days.parse().unwrap() });
    for c in &cases {
        for d in c.differs {
            assert!(
                DIFFERENCES.contains(&format!("| {d} |")),
                "{d} ({}) has no row in docs/event-router.md's differences",
                c.debezium
            );
        }
    }
    assert!(DIFFERENCES.contains("| D20 |"), "snapshot records (walpost.snapshot header) need their row");

    // The tables, owned by walpost's role, and a publication the test supplies: it
    // publishes UPDATE, DELETE and TRUNCATE too, for table.op.invalid.behavior (D13).
    let mut ddl = format!("CREATE SCHEMA {SCHEMA}; GRANT USAGE ON SCHEMA {SCHEMA} TO {};\n", w.role);
    for t in &tables {
        ddl.push_str(&format!(
            "CREATE TABLE {} ({} {}, {}); ALTER TABLE {0} OWNER TO {};\n",
            t.name, t.id.0, t.id.1, t.columns, w.role
        ));
    }
    let names: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
    ddl.push_str(&format!("CREATE PUBLICATION {}_pub FOR TABLE events.outbox, {};", w.slot, names.join(", ")));
    w.sql(&ddl);
    let (config, routers) = config_file(&w, &tables);
    // "Coming from Debezium": import-debezium writes Debezium's defaults out.
    let dbz = &routers[0];
    for (key, value) in [
        ("route.by.field", "aggregatetype"),
        ("table.field.event.key", "aggregateid"),
        ("table.field.event.id", "id"),
        ("table.field.event.payload", "payload"),
        (router::EVENT_TYPE_HEADER_OPTION, ""),
    ] {
        assert_eq!(dbz.get(key).and_then(toml::Value::as_str), Some(value), "{key} in {dbz:?}");
    }
    let setup = started.elapsed();

    let instances = instances(&cases, &tables);
    let mut windows = Windows::new();
    insert_phase(&w, &instances, Phase::Snapshot, "");
    let run1_started = db_now_ms(&w);
    let args = run_args(&w, &config);
    let mut walpost = Walpost::start(&args, &[]);
    assert!(w.wait_for_slot(WAIT), "slot not created:\n{}", walpost.log_text());
    windows.insert(Phase::Stream, insert_phase(&w, &instances, Phase::Stream, ""));
    windows.insert(Phase::Later, insert_phase(&w, &instances, Phase::Later, &invalid_operations()));
    let run1 = instances.iter().filter(|i| i.phase != Phase::Escape).count();
    let records = read_when(&w, run1);
    windows.insert(Phase::Snapshot, (run1_started, db_now_ms(&w)));
    assert_eq!(records.len(), run1, "records after the first run:\n{}", walpost.log_text());
    let run1_time = started.elapsed();

    // table.op.invalid.behavior = fatal: an UPDATE halts (Debezium: IllegalStateException).
    w.sql(&format!("UPDATE {SCHEMA}.op_fatal SET type = 'Changed'"));
    let status = walpost.wait_exit(WAIT).expect("an UPDATE under fatal halts walpost");
    assert_eq!(status.code(), Some(1));
    let log = walpost.log_text();
    let mut problems = Vec::new();
    let mut expect_log = |level: &str, text: String| {
        if !log_has(&log, level, &text) {
            problems.push(format!("no {level} line with: {text}"));
        }
    };
    expect_log("ERROR", format!("UPDATE on outbox table {SCHEMA}.op_fatal, and table.op.invalid.behavior = fatal"));
    for (t, level, behavior) in [("op_warn", "WARN", "warn"), ("op_error", "ERROR", "error")] {
        for op in ["UPDATE", "DELETE", "TRUNCATE"] {
            expect_log(
                level,
                format!("{op} on outbox table {SCHEMA}.{t}: not an outbox event, skipped (table.op.invalid.behavior = {behavior})"),
            );
        }
    }
    expect_log(
        "WARN",
        format!(
            "\"table.field.event.type\" is deprecated (Debezium has no such option since 1.2): use \"{}\"",
            router::EVENT_TYPE_HEADER_OPTION
        ),
    );

    // bytea_output = escape for walpost's role: the bytea cases again, streamed by a new
    // session, from past the UPDATE.
    w.sql(&format!("ALTER ROLE {} IN DATABASE \"{}\" SET bytea_output = 'escape'", w.role, w.db));
    assert_eq!(w.pg.psql_as(&w.role, &w.db, "SHOW bytea_output").unwrap(), "escape");
    assert!(testkit::wait_until(WAIT, || w
        .sql(&format!("SELECT active FROM pg_replication_slots WHERE slot_name = '{}'", w.slot))
        == "f"));
    w.sql(&format!("SELECT pg_replication_slot_advance('{}', pg_current_wal_lsn())", w.slot));
    // walpost checks its tables at start-up: miss_error gets its column back.
    w.sql(&format!("ALTER TABLE {SCHEMA}.miss_error ADD COLUMN extra text"));
    windows.insert(Phase::Escape, insert_phase(&w, &instances, Phase::Escape, ""));
    let mut walpost = Walpost::start(&args, &[]);
    let records = read_when(&w, instances.len());
    let partitions: HashMap<String, i32> =
        high_watermarks(&w.kafka_bootstrap, &p).into_keys().fold(HashMap::new(), |mut m, (topic, _)| {
            *m.entry(topic).or_default() += 1;
            m
        });
    problems.extend(compare(&instances, &records, &partitions, &dead_topic, &windows));

    // table.op.invalid.behavior = fatal: a DELETE halts too.
    // differs from Debezium (D4): Debezium drops DELETEs whatever the setting.
    w.sql(&format!("DELETE FROM {SCHEMA}.op_fatal"));
    let status = walpost.wait_exit(WAIT).expect("a DELETE under fatal halts walpost (D4)");
    assert_eq!(status.code(), Some(1));
    let log = walpost.log_text();
    if !log_has(
        &log,
        "ERROR",
        &format!("DELETE on outbox table {SCHEMA}.op_fatal, and table.op.invalid.behavior = fatal"),
    ) {
        problems.push(format!("the DELETE under fatal did not halt with its message:\n{log}"));
    }
    eprintln!(
        "conformance: {} cases, {} records in {} tables; setup {setup:?}, first run done at {run1_time:?}, all done at {:?}",
        cases.len(),
        instances.len(),
        tables.len() + 1,
        started.elapsed()
    );
    assert!(problems.is_empty(), "{} problem(s):\n{}", problems.len(), problems.join("\n"));
}

/// Runs `walpost --config <toml> <command>` against servers that do not exist; the
/// options are refused before any connection. `None` if it did not exit within `limit`
/// (an option accepted: `run` would keep trying to connect).
fn refused(toml_text: &str, command: &str, limit: Duration) -> Option<(Option<i32>, String)> {
    let path = std::env::temp_dir().join(format!("{}.toml", testkit::unique_name("refuse")));
    std::fs::write(&path, toml_text).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_walpost"))
        .arg("--config")
        .arg(&path)
        .args([command, "--postgres", "postgres://nobody@127.0.0.1:1/none", "--kafka-brokers", "127.0.0.1:1"])
        .env("WALPOST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            return Some((status.code(), text));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What cannot be a row: every Debezium option walpost does not implement
/// (`router::DEBEZIUM_OPTIONS_NOT_IMPLEMENTED`), in each router section, and invalid
/// option values, are refused at start-up by `walpost check` and `walpost run` with exit
/// code 1 and a message naming the option, before any connection.
#[test]
fn options_walpost_does_not_implement_are_refused_at_start_up() {
    let started = Instant::now();
    let sections = |key: &str, value: &str| {
        let entry = format!("\"{key}\" = {value}\n");
        [
            ("router", format!("[router]\n{entry}")),
            ("outbox.router", format!("[[outbox]]\ntable = \"billing.outbox\"\n[outbox.router]\n{entry}")),
            ("messages.router", format!("[messages]\n\"prefix.include\" = [\"outbox\"]\n[messages.router]\n{entry}")),
        ]
    };
    // (what, TOML, texts the message must hold)
    let mut cases: Vec<(String, String, Vec<String>)> = Vec::new();
    for (option, reason) in router::DEBEZIUM_OPTIONS_NOT_IMPLEMENTED {
        for (section, toml_text) in sections(option, "\"x\"") {
            cases.push((
                format!("{option} in [{section}]"),
                toml_text,
                vec![format!("[{section}] \"{option}\" is a Debezium option walpost does not implement: {reason}")],
            ));
        }
    }
    let invalid: &[(&str, &str, &str, &str)] = &[
        // EventRouterTest.shouldFailOnInvalidConfigurationForAdditionalFieldsEmpty.
        (
            "an empty placement",
            "table.fields.additional.placement",
            "\"\"",
            "table.fields.additional.placement: the value is empty",
        ),
        // EventRouterTest.shouldFailOnInvalidConfigurationForAdditionalFields.
        (
            "a placement that is not header, envelope or partition",
            "table.fields.additional.placement",
            "\"type:body\"",
            "table.fields.additional.placement: 'type:body'",
        ),
        // differs from Debezium (D16): Java's split drops a trailing empty entry.
        (
            "a placement with a trailing comma (D16)",
            "table.fields.additional.placement",
            "\"type:header,\"",
            "table.fields.additional.placement: 'type:header,' has an empty entry",
        ),
        // Kafka Connect's SchemaBuilder refuses two fields of one name.
        (
            "an envelope alias named payload",
            "table.fields.additional.placement",
            "\"type:envelope:payload\"",
            "table.fields.additional.placement: the envelope would have two fields named 'payload'",
        ),
        // EventRouterTest.shouldFailOnInvalidConfigurationForTopicRegex.
        ("an invalid regex", "route.topic.regex", "\" [[a-z]\"", "route.topic.regex"),
        // differs from Debezium (D15): look-around is Java's, not Rust's.
        (
            "a regex with look-ahead (D15)",
            "route.topic.regex",
            "\"(?<routedByValue>.*)(?=Aggregate)\"",
            "route.topic.regex",
        ),
        ("an empty replacement", "route.topic.replacement", "\"\"", "route.topic.replacement"),
        (
            "an unknown table.field.additional.missing",
            "table.field.additional.missing",
            "\"skip\"",
            "table.field.additional.missing",
        ),
        ("an unknown table.op.invalid.behavior", "table.op.invalid.behavior", "\"skip\"", "table.op.invalid.behavior"),
        ("an option nobody defines", "route.topic.bogus", "\"x\"", "route.topic.bogus"),
    ];
    for (what, key, value, message) in invalid {
        let (_, toml_text) = sections(key, value).into_iter().next().unwrap();
        cases.push(((*what).to_owned(), toml_text, vec![(*message).to_owned()]));
    }
    let mut failures = Vec::new();
    let mut slowest = Duration::ZERO;
    for (what, toml_text, texts) in &cases {
        for command in ["check", "run"] {
            let t = Instant::now();
            match refused(toml_text, command, Duration::from_secs(20)) {
                None => failures.push(format!("{what}: `walpost {command}` did not stop (accepted?)")),
                Some((code, out)) => {
                    if code != Some(1) || !texts.iter().all(|t| out.contains(t.as_str())) {
                        failures.push(format!(
                            "{what}: `walpost {command}` exit {code:?}, expected 1 and {texts:?} in:\n{out}"
                        ));
                    }
                    if out.contains("cannot connect") {
                        failures.push(format!("{what}: `walpost {command}` tried to connect first:\n{out}"));
                    }
                }
            }
            slowest = slowest.max(t.elapsed());
        }
    }
    eprintln!(
        "conformance refusals: {} configurations x 2 commands in {:?} (slowest {slowest:?})",
        cases.len(),
        started.elapsed()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

//! How a column's PostgreSQL text form becomes bytes in a record.
//!
//! walpost reads pgoutput's text format. Debezium's PostgreSQL connector first turns a
//! column into a Kafka Connect value (its documented defaults: `binary.handling.mode =
//! bytes`, `time.precision.mode = adaptive`), then a converter writes it. Three forms
//! follow from that:
//!
//! | column type | key, value, route value | header (Kafka's `SimpleHeaderConverter`) | envelope field (`JsonConverter` without schemas) |
//! |---|---|---|---|
//! | text, varchar, uuid, other types | the text | the text | a JSON string |
//! | json, jsonb | the text | the text | the JSON text itself (a document, not a string) |
//! | int2, int4, int8 | the text | the text | a JSON number |
//! | float4, float8, numeric | the text | the text | a JSON number; `NaN`/`Infinity`/`-Infinity` as strings |
//! | bool | `true`/`false` | `true`/`false` | `true`/`false` |
//! | bytea | the bytes | base64 | base64 string |
//! | timestamp(0..3) | epoch milliseconds | epoch milliseconds | number |
//! | timestamp(4..6), timestamp | epoch microseconds | epoch microseconds | number |
//! | timestamptz(p) | ISO-8601 in UTC, `p` fraction digits (6 when unset) | the same | string |
//! | date | days since the epoch | the same | number |
//!
//! Headers: Kafka Connect's default header converter, `SimpleHeaderConverter`, writes
//! `Values.convertToString` of the value: booleans and numbers as Java prints them, and
//! bytes (`byte[]` or `ByteBuffer`, which is what Debezium makes of a bytea) as standard
//! base64 with padding; so a bytea header is base64 here too, the same text JSON gives it.
//!
//! A bytea arrives as `\x` + hex (`bytea_output = hex`, the default) or in the `escape`
//! format (printable bytes as themselves, `\\`, `\ooo`); both are decoded. A value in
//! pgoutput's binary format (never requested by walpost) is passed on as its bytes.
//! Text-like values are `Bytes` slices of the decoded message: only bytea, bool and the
//! temporal types allocate.

use base64::Engine as _;
use bytes::Bytes;

/// PostgreSQL type OIDs (`pg_type.oid`) the router treats specially.
pub mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const DATE: u32 = 1082;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const NUMERIC: u32 = 1700;
    pub const UUID: u32 = 2950;
    pub const JSONB: u32 = 3802;
}

/// What Debezium would make of a column, from its type and type modifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Text,
    Json,
    Integer,
    /// float4/float8/numeric: PostgreSQL's text is a JSON number except NaN and the infinities.
    Float,
    Bool,
    Bytea,
    /// `io.debezium.time.Timestamp` (ms) or `MicroTimestamp` (µs).
    Timestamp {
        micros: bool,
    },
    /// `io.debezium.time.ZonedTimestamp` with this many fraction digits.
    TimestampTz {
        digits: u8,
    },
    /// `io.debezium.time.Date`: days since the epoch.
    Date,
}

impl Kind {
    pub(crate) fn of(type_oid: u32, type_modifier: i32) -> Kind {
        match type_oid {
            oid::BOOL => Kind::Bool,
            oid::BYTEA => Kind::Bytea,
            oid::INT2 | oid::INT4 | oid::INT8 => Kind::Integer,
            oid::FLOAT4 | oid::FLOAT8 | oid::NUMERIC => Kind::Float,
            oid::JSON | oid::JSONB => Kind::Json,
            // timestamp(p): p in 0..=6, -1 when unset (6).
            oid::TIMESTAMP => Kind::Timestamp { micros: !(0..=3).contains(&type_modifier) },
            oid::TIMESTAMPTZ => {
                Kind::TimestampTz { digits: u8::try_from(type_modifier).ok().filter(|p| *p <= 6).unwrap_or(6) }
            }
            oid::DATE => Kind::Date,
            _ => Kind::Text,
        }
    }
}

/// Bytes for the record key, the record value (without envelope) and the route value.
pub(crate) fn plain(kind: Kind, text: &Bytes) -> Result<Bytes, &'static str> {
    match kind {
        Kind::Text | Kind::Json | Kind::Integer | Kind::Float => Ok(text.clone()),
        Kind::Bool => parse_bool(text).map(bool_bytes),
        Kind::Bytea => decode_bytea(text),
        Kind::Timestamp { micros } => {
            let ts = parse_timestamp(text)?;
            Ok(Bytes::from(if micros { ts.as_microsecond().to_string() } else { ts.as_millisecond().to_string() }))
        }
        Kind::TimestampTz { digits } => zoned_timestamp(text, digits).map(Bytes::from),
        Kind::Date => days_since_epoch(text).map(|d| Bytes::from(d.to_string())),
    }
}

/// Bytes for a header: Kafka's `SimpleHeaderConverter` writes bytes in base64 and every
/// other value as its string form.
pub(crate) fn header(kind: Kind, text: &Bytes) -> Result<Bytes, &'static str> {
    match kind {
        Kind::Bytea => Ok(Bytes::from(base64::engine::general_purpose::STANDARD.encode(decode_bytea(text)?))),
        _ => plain(kind, text),
    }
}

/// Appends the JSON form of a value (`None`: SQL NULL).
pub(crate) fn write_json(out: &mut Vec<u8>, kind: Kind, text: Option<&Bytes>) -> Result<(), &'static str> {
    let Some(text) = text else {
        out.extend_from_slice(b"null");
        return Ok(());
    };
    match kind {
        // PostgreSQL validated json/jsonb on input and prints integers in JSON's syntax.
        Kind::Json | Kind::Integer => out.extend_from_slice(text),
        Kind::Float => match text.as_ref() {
            b"NaN" | b"Infinity" | b"-Infinity" => write_json_string(out, text)?,
            _ => out.extend_from_slice(text),
        },
        Kind::Bool => out.extend_from_slice(&bool_bytes(parse_bool(text)?)),
        Kind::Bytea => {
            out.push(b'"');
            out.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(decode_bytea(text)?).as_bytes());
            out.push(b'"');
        }
        Kind::Timestamp { .. } | Kind::Date => out.extend_from_slice(&plain(kind, text)?),
        Kind::TimestampTz { .. } | Kind::Text => write_json_string(out, &plain(kind, text)?)?,
    }
    Ok(())
}

/// Appends a JSON string (serde_json's escaping); invalid UTF-8 is replaced.
pub(crate) fn write_json_string(out: &mut Vec<u8>, text: &[u8]) -> Result<(), &'static str> {
    serde_json::to_writer(out, &String::from_utf8_lossy(text)).map_err(|_| "a value that can be written as JSON")
}

/// Appends a value of pgoutput's binary format (only bytea's is understood): base64.
pub(crate) fn write_json_binary(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    out.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(bytes).as_bytes());
    out.push(b'"');
}

/// A payload Debezium treats as empty (`route.tombstone.on.empty.payload`): Java's
/// `payload.toString().trim().isEmpty()`, which trims every char up to U+0020. A bytea
/// payload is never empty there (a byte buffer prints as a description), only NULL.
pub(crate) fn is_empty_payload(kind: Kind, text: &[u8]) -> bool {
    kind != Kind::Bytea && text.iter().all(|b| *b <= b' ')
}

fn parse_bool(text: &[u8]) -> Result<bool, &'static str> {
    match text {
        b"t" | b"true" => Ok(true),
        b"f" | b"false" => Ok(false),
        _ => Err("a boolean (t or f)"),
    }
}

fn bool_bytes(b: bool) -> Bytes {
    Bytes::from_static(if b { b"true" } else { b"false" })
}

/// Decodes bytea's text output: `\x` + hex, or the `escape` format.
pub fn decode_bytea(text: &Bytes) -> Result<Bytes, &'static str> {
    const EXPECTED: &str = "bytea text output (\\x followed by hex digits, or the escape format)";
    if let Some(hex) = text.strip_prefix(b"\\x") {
        if hex.len() % 2 != 0 {
            return Err(EXPECTED);
        }
        let nibble = |c: u8| -> Result<u8, &'static str> {
            match c {
                b'0'..=b'9' => Ok(c - b'0'),
                b'a'..=b'f' => Ok(c - b'a' + 10),
                b'A'..=b'F' => Ok(c - b'A' + 10),
                _ => Err(EXPECTED),
            }
        };
        let mut out = Vec::with_capacity(hex.len() / 2);
        for pair in hex.chunks_exact(2) {
            if let [hi, lo] = pair {
                out.push(nibble(*hi)? << 4 | nibble(*lo)?);
            }
        }
        return Ok(Bytes::from(out));
    }
    if !text.contains(&b'\\') {
        // The escape format prints every byte but the backslash and non-printables as itself.
        return Ok(text.clone());
    }
    let mut out = Vec::with_capacity(text.len());
    let mut rest: &[u8] = text;
    loop {
        rest = match rest {
            [] => break,
            [b'\\', b'\\', tail @ ..] => {
                out.push(b'\\');
                tail
            }
            [b'\\', a @ b'0'..=b'3', b @ b'0'..=b'7', c @ b'0'..=b'7', tail @ ..] => {
                out.push((a - b'0') << 6 | (b - b'0') << 3 | (c - b'0'));
                tail
            }
            [b'\\', ..] => return Err(EXPECTED),
            [byte, tail @ ..] => {
                out.push(*byte);
                tail
            }
        };
    }
    Ok(Bytes::from(out))
}

const TIMESTAMP_EXPECTED: &str = "a timestamp such as 2026-11-29 08:00:00.123456+00";
const INFINITY_EXPECTED: &str = "a finite timestamp (PostgreSQL's infinity and -infinity have no epoch value)";

/// Parses PostgreSQL's ISO text form of a timestamp or timestamptz (`2026-11-29
/// 08:00:00.123456+05:30`; walpost's sessions use `DateStyle = ISO`). Without an offset
/// the time is taken as UTC, as Debezium does for `timestamp` columns.
pub fn parse_timestamp(text: &[u8]) -> Result<jiff::Timestamp, &'static str> {
    let s = std::str::from_utf8(text).map_err(|_| TIMESTAMP_EXPECTED)?.trim();
    if s.eq_ignore_ascii_case("infinity") || s.eq_ignore_ascii_case("-infinity") {
        return Err(INFINITY_EXPECTED);
    }
    if let Ok(ts) = s.parse::<jiff::Timestamp>() {
        return Ok(ts);
    }
    // jiff's civil parser would ignore an offset: only a text without one is civil.
    if has_offset(s) {
        return Err(TIMESTAMP_EXPECTED);
    }
    s.parse::<jiff::civil::DateTime>()
        .ok()
        .and_then(|dt| dt.to_zoned(jiff::tz::TimeZone::UTC).ok())
        .map(|z| z.timestamp())
        .ok_or(TIMESTAMP_EXPECTED)
}

/// [`parse_timestamp`] in milliseconds since the Unix epoch.
pub fn parse_timestamp_ms(text: &[u8]) -> Result<i64, &'static str> {
    parse_timestamp(text).map(|ts| ts.as_millisecond())
}

/// An offset follows the time: `+`, `-` or `Z` after the `YYYY-MM-DD` date.
fn has_offset(s: &str) -> bool {
    s.get(10..).is_some_and(|time| time.contains(['+', '-', 'Z', 'z']))
}

/// Debezium's `ZonedTimestamp`: UTC, ISO-8601, `digits` fraction digits; `infinity` and
/// `-infinity` stay as they are.
fn zoned_timestamp(text: &[u8], digits: u8) -> Result<String, &'static str> {
    match text {
        b"infinity" => return Ok("infinity".into()),
        b"-infinity" => return Ok("-infinity".into()),
        _ => {}
    }
    let ts = parse_timestamp(text)?;
    Ok(if digits == 0 { format!("{ts:.0}") } else { format!("{ts:.*}", usize::from(digits)) })
}

fn days_since_epoch(text: &[u8]) -> Result<i64, &'static str> {
    const EXPECTED: &str = "a finite date such as 2026-11-29";
    let s = std::str::from_utf8(text).map_err(|_| EXPECTED)?;
    let date: jiff::civil::Date = s.trim().parse().map_err(|_| EXPECTED)?;
    let zoned = date.to_zoned(jiff::tz::TimeZone::UTC).map_err(|_| EXPECTED)?;
    Ok(zoned.timestamp().as_second().div_euclid(86_400))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(kind: Kind, text: Option<&str>) -> Result<String, &'static str> {
        let mut out = Vec::new();
        let text = text.map(|t| Bytes::copy_from_slice(t.as_bytes()));
        write_json(&mut out, kind, text.as_ref())?;
        Ok(String::from_utf8(out).unwrap_or_default())
    }

    fn forms(kind: Kind, text: &str) -> (Vec<u8>, Vec<u8>, String) {
        let b = Bytes::copy_from_slice(text.as_bytes());
        (
            plain(kind, &b).map(|v| v.to_vec()).unwrap_or_default(),
            header(kind, &b).map(|v| v.to_vec()).unwrap_or_default(),
            json(kind, Some(text)).unwrap_or_default(),
        )
    }

    #[test]
    fn kinds_from_type_and_modifier() {
        assert_eq!(Kind::of(oid::TEXT, -1), Kind::Text);
        assert_eq!(Kind::of(oid::VARCHAR, 259), Kind::Text);
        assert_eq!(Kind::of(oid::UUID, -1), Kind::Text);
        assert_eq!(Kind::of(oid::INT8, -1), Kind::Integer);
        assert_eq!(Kind::of(oid::NUMERIC, -1), Kind::Float);
        assert_eq!(Kind::of(oid::JSON, -1), Kind::Json);
        assert_eq!(Kind::of(oid::JSONB, -1), Kind::Json);
        assert_eq!(Kind::of(oid::TIMESTAMP, 0), Kind::Timestamp { micros: false });
        assert_eq!(Kind::of(oid::TIMESTAMP, 3), Kind::Timestamp { micros: false });
        assert_eq!(Kind::of(oid::TIMESTAMP, 4), Kind::Timestamp { micros: true });
        assert_eq!(Kind::of(oid::TIMESTAMP, 6), Kind::Timestamp { micros: true });
        assert_eq!(Kind::of(oid::TIMESTAMP, -1), Kind::Timestamp { micros: true });
        assert_eq!(Kind::of(oid::TIMESTAMPTZ, 3), Kind::TimestampTz { digits: 3 });
        assert_eq!(Kind::of(oid::TIMESTAMPTZ, -1), Kind::TimestampTz { digits: 6 });
        assert_eq!(Kind::of(oid::DATE, -1), Kind::Date);
    }

    /// (kind, PostgreSQL text, key/value bytes, header bytes, envelope JSON).
    type FormCase = (Kind, &'static str, &'static [u8], &'static [u8], &'static str);

    #[test]
    fn forms_table() {
        let ms = Kind::Timestamp { micros: false };
        let us = Kind::Timestamp { micros: true };
        let cases: &[FormCase] = &[
            (Kind::Text, "ac\"me\n", b"ac\"me\n", b"ac\"me\n", r#""ac\"me\n""#),
            (
                Kind::Text,
                "5f0c6b1e-0000-4000-8000-000000000001",
                b"5f0c6b1e-0000-4000-8000-000000000001",
                b"5f0c6b1e-0000-4000-8000-000000000001",
                r#""5f0c6b1e-0000-4000-8000-000000000001""#,
            ),
            (Kind::Json, r#"{"a": [1, 2]}"#, br#"{"a": [1, 2]}"#, br#"{"a": [1, 2]}"#, r#"{"a": [1, 2]}"#),
            (
                Kind::Integer,
                "-9223372036854775808",
                b"-9223372036854775808",
                b"-9223372036854775808",
                "-9223372036854775808",
            ),
            (Kind::Float, "1.5", b"1.5", b"1.5", "1.5"),
            (Kind::Float, "NaN", b"NaN", b"NaN", r#""NaN""#),
            (Kind::Float, "-Infinity", b"-Infinity", b"-Infinity", r#""-Infinity""#),
            (Kind::Bool, "t", b"true", b"true", "true"),
            (Kind::Bool, "f", b"false", b"false", "false"),
            (Kind::Bytea, r"\x6120ff", b"a \xff", b"YSD/", r#""YSD/""#),
            (Kind::Bytea, r"\x", b"", b"", r#""""#),
            (Kind::Bytea, r"a\\b\000", b"a\\b\x00", b"YVxiAA==", r#""YVxiAA==""#),
            (ms, "2019-03-24 20:52:59.123", b"1553460779123", b"1553460779123", "1553460779123"),
            (us, "2019-03-24 20:52:59.123456", b"1553460779123456", b"1553460779123456", "1553460779123456"),
            (us, "1969-12-31 23:59:59.999999", b"-1", b"-1", "-1"),
            (
                Kind::TimestampTz { digits: 6 },
                "2026-11-29 09:00:00.25+01",
                b"2026-11-29T08:00:00.250000Z",
                b"2026-11-29T08:00:00.250000Z",
                r#""2026-11-29T08:00:00.250000Z""#,
            ),
            (
                Kind::TimestampTz { digits: 3 },
                "2026-11-29 02:30:00-05:30",
                b"2026-11-29T08:00:00.000Z",
                b"2026-11-29T08:00:00.000Z",
                r#""2026-11-29T08:00:00.000Z""#,
            ),
            (
                Kind::TimestampTz { digits: 0 },
                "2026-11-29 08:00:00+00",
                b"2026-11-29T08:00:00Z",
                b"2026-11-29T08:00:00Z",
                r#""2026-11-29T08:00:00Z""#,
            ),
            (Kind::TimestampTz { digits: 6 }, "infinity", b"infinity", b"infinity", r#""infinity""#),
            (Kind::Date, "1970-01-02", b"1", b"1", "1"),
            (Kind::Date, "1969-12-31", b"-1", b"-1", "-1"),
        ];
        for (kind, text, plain_form, header_form, json_form) in cases {
            let (p, h, j) = forms(*kind, text);
            assert_eq!(
                (p.as_slice(), h.as_slice(), j.as_str()),
                (*plain_form, *header_form, *json_form),
                "{kind:?} {text}"
            );
        }
        assert_eq!(json(Kind::Bool, None), Ok("null".into()));
    }

    #[test]
    fn bad_values_are_errors_not_panics() {
        let cases: &[(Kind, &[u8])] = &[
            (Kind::Bool, b"yes"),
            (Kind::Bytea, b"\\x6"),
            (Kind::Bytea, b"\\xzz"),
            (Kind::Bytea, b"\\400"),
            (Kind::Bytea, b"\\9"),
            (Kind::Bytea, b"ab\\"),
            (Kind::Timestamp { micros: true }, b"infinity"),
            (Kind::Timestamp { micros: false }, b"\xff\xfe"),
            (Kind::TimestampTz { digits: 6 }, b"29/11/2026 08:00"),
            (Kind::Date, b"infinity"),
            (Kind::Date, b"2026-02-30"),
        ];
        for (kind, text) in cases {
            let b = Bytes::copy_from_slice(text);
            assert!(plain(*kind, &b).is_err(), "{kind:?} {text:?}");
            assert!(header(*kind, &b).is_err(), "{kind:?} {text:?}");
            assert!(write_json(&mut Vec::new(), *kind, Some(&b)).is_err(), "{kind:?} {text:?}");
        }
    }

    #[test]
    fn text_forms_are_slices_not_copies() {
        let b = Bytes::from_static(b"order-1");
        for kind in [Kind::Text, Kind::Json, Kind::Integer, Kind::Float] {
            assert_eq!(plain(kind, &b).map(|v| v.as_ptr()), Ok(b.as_ptr()));
        }
        let escape = Bytes::from_static(b"no backslash");
        assert_eq!(decode_bytea(&escape).map(|v| v.as_ptr()), Ok(escape.as_ptr()));
    }

    #[test]
    fn empty_payload_is_javas_trim() {
        assert!(is_empty_payload(Kind::Json, b""));
        assert!(is_empty_payload(Kind::Text, b" \t\r\n\x00"));
        assert!(!is_empty_payload(Kind::Text, b" x "));
        assert!(!is_empty_payload(Kind::Bytea, b""), "a bytea payload is empty only when NULL");
    }
}

//! What a Kafka record becomes in the inbox: its event id, type and aggregate from the
//! headers (or the key), or the reason it cannot be stored. Pure code over borrowed
//! bytes; nothing here reads a value's contents except to ask whether it is JSON.
//!
//! Invariants: every text column a [`Fields`] names is UTF-8 without NUL (PostgreSQL
//! `text` refuses NUL, and one refused value would fail its whole batch); a value that
//! `jsonb` could refuse is marked not-JSON (stored as bytes only), never sent as JSON.

use std::fmt;

use bytes::Bytes;

use crate::settings::HeaderNames;

/// The longest event id stored (a btree key must stay well under a page).
pub(crate) const MAX_EVENT_ID_BYTES: usize = 1024;

/// A record as the consumer read it (the bytes are owned: it crosses a thread).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) topic: std::sync::Arc<str>,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) key: Option<Bytes>,
    pub(crate) value: Option<Bytes>,
    /// Name and value of each header, as bytes: a producer may send any bytes as a name.
    pub(crate) headers: Vec<(Bytes, Option<Bytes>)>,
    /// The record's timestamp, milliseconds since the Unix epoch.
    pub(crate) timestamp_ms: Option<i64>,
}

impl Record {
    /// The value's length, for batch and memory limits.
    pub(crate) fn value_len(&self) -> usize {
        self.value.as_ref().map_or(0, Bytes::len)
    }

    /// The bytes it holds (key, header names and values, value): what bounds memory.
    pub(crate) fn bytes(&self) -> usize {
        let key = self.key.as_ref().map_or(0, Bytes::len);
        let headers: usize = self.headers.iter().map(|(n, v)| n.len() + v.as_ref().map_or(0, Bytes::len)).sum();
        key + headers + self.value_len()
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        // The last one wins, as in a JSON object of the headers.
        self.headers.iter().rev().find(|(n, _)| n == name.as_bytes()).and_then(|(_, v)| v.as_deref())
    }

    fn first_header<'a>(&'a self, names: &[String]) -> Option<&'a [u8]> {
        names.iter().find_map(|n| self.header(n))
    }
}

/// Why a record cannot be stored as a message: a short code and what it is about, never
/// a value's contents (the text lands in the `rejected` table and the logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Invalid {
    /// None of the event id headers is present.
    NoEventId {
        headers: Vec<String>,
    },
    /// The event id is not UTF-8 text, or holds NUL.
    EventIdNotText {
        header: String,
    },
    EventIdTooLong {
        len: usize,
    },
    ValueTooLarge {
        len: usize,
        limit: usize,
    },
    /// PostgreSQL refused the row with a data-class SQLSTATE (a value its types or its
    /// encoding cannot hold, a key too long for an index): found by writing the batch
    /// record by record.
    RefusedByPostgres {
        sqlstate: String,
    },
}

impl Invalid {
    /// The short code (a metric label and the start of the `reason` column).
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Invalid::NoEventId { .. } => "no_event_id",
            Invalid::EventIdNotText { .. } => "event_id_not_text",
            Invalid::EventIdTooLong { .. } => "event_id_too_long",
            Invalid::ValueTooLarge { .. } => "value_too_large",
            Invalid::RefusedByPostgres { .. } => "refused_by_postgres",
        }
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::NoEventId { headers } => {
                write!(f, "no_event_id: the record has none of the headers {}", headers.join(", "))
            }
            Invalid::EventIdNotText { header } => {
                write!(f, "event_id_not_text: header {header} is not UTF-8 text without NUL")
            }
            Invalid::EventIdTooLong { len } => {
                write!(f, "event_id_too_long: the event id has {len} bytes (at most {MAX_EVENT_ID_BYTES})")
            }
            Invalid::ValueTooLarge { len, limit } => {
                write!(f, "value_too_large: the value has {len} bytes, over inbox.max_record_bytes = {limit}")
            }
            // The server's message is left out: it may quote the record's bytes.
            Invalid::RefusedByPostgres { sqlstate } => write!(
                f,
                "refused_by_postgres: PostgreSQL refused the record with SQLSTATE {sqlstate} ({}); the record is in Kafka at this topic, partition and offset",
                sqlstate_meaning(sqlstate)
            ),
        }
    }
}

/// What a data-class SQLSTATE means, in words an operator can act on.
fn sqlstate_meaning(code: &str) -> &'static str {
    match code {
        "22003" => "a number out of range",
        "22P05" | "22021" => "text the database's encoding cannot hold",
        "22P02" => "a value its column's type does not accept",
        "22001" => "a value too long for its column",
        "54000" => "a value too long for an index row",
        c if c.starts_with("54") => "a value over one of PostgreSQL's limits",
        _ => "a value its column refuses",
    }
}

/// The columns taken from a record's headers and key (slices of the record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fields<'a> {
    pub(crate) event_id: &'a str,
    pub(crate) event_type: Option<&'a str>,
    pub(crate) aggregate_id: Option<&'a str>,
    /// The value is JSON that `jsonb` accepts.
    pub(crate) json: bool,
}

/// The inbox columns of `r`, or why it cannot be stored.
pub(crate) fn fields<'a>(r: &'a Record, names: &HeaderNames, max_value_bytes: usize) -> Result<Fields<'a>, Invalid> {
    if r.value_len() > max_value_bytes {
        return Err(Invalid::ValueTooLarge { len: r.value_len(), limit: max_value_bytes });
    }
    let (header, raw) = names
        .event_id
        .iter()
        .find_map(|n| r.header(n).map(|v| (n, v)))
        .ok_or_else(|| Invalid::NoEventId { headers: names.event_id.clone() })?;
    let event_id = text(raw).ok_or_else(|| Invalid::EventIdNotText { header: header.clone() })?;
    if event_id.is_empty() {
        return Err(Invalid::NoEventId { headers: names.event_id.clone() });
    }
    if event_id.len() > MAX_EVENT_ID_BYTES {
        return Err(Invalid::EventIdTooLong { len: event_id.len() });
    }
    let aggregate = match &names.aggregate_id {
        Some(h) => r.header(h),
        None => r.key.as_deref(),
    };
    Ok(Fields {
        event_id,
        event_type: r.first_header(&names.event_type).and_then(text),
        aggregate_id: aggregate.and_then(text),
        json: r.value.as_deref().is_some_and(is_jsonb),
    })
}

/// UTF-8 without NUL: what a `text` column takes.
pub(crate) fn text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok().filter(|s| !s.contains('\0'))
}

/// Whether `value` is JSON that PostgreSQL's `jsonb` accepts: valid JSON without the
/// escapes `jsonb` refuses (`\u0000`) or may (surrogates, refused alone; pairs are
/// rare in practice and lose only the `jsonb` copy, never the bytes).
pub(crate) fn is_jsonb(value: &[u8]) -> bool {
    let risky = value.windows(2).enumerate().any(|(i, w)| {
        w == b"\\u" && {
            let hex = value.get(i + 2..i + 6).unwrap_or_default();
            hex.eq_ignore_ascii_case(b"0000") || hex.first().is_some_and(|c| c.eq_ignore_ascii_case(&b'd'))
        }
    });
    !risky && numbers_fit_numeric(value) && serde_json::from_slice::<serde::de::IgnoredAny>(value).is_ok()
}

/// Digits `numeric` holds before the decimal point, and after it.
const NUMERIC_MAX_WEIGHT_DIGITS: i64 = 131_072;
const NUMERIC_MAX_SCALE_DIGITS: i64 = 16_383;
/// The largest exponent PostgreSQL 14's `numeric` reads (later majors read more: such a
/// number then only loses its `jsonb` copy, never its bytes). Leading and trailing zeros
/// count as digits here, which can only err the same safe way.
const NUMERIC_MAX_EXPONENT: i64 = 1_000;

/// Whether every number in the JSON text `value` fits PostgreSQL's `numeric`, which
/// `jsonb` stores numbers as (`{"a":1e1000000}` is valid JSON that `jsonb` refuses with
/// SQLSTATE 22003). A scan outside strings, linear in the bytes.
fn numbers_fit_numeric(value: &[u8]) -> bool {
    let mut i = 0;
    while i < value.len() {
        match value[i] {
            b'"' => {
                i += 1;
                while i < value.len() && value[i] != b'"' {
                    i += if value[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < value.len() && matches!(value[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    i += 1;
                }
                if !number_fits_numeric(&value[start..i]) {
                    return false;
                }
            }
            _ => i += 1,
        }
    }
    true
}

/// One JSON number (`-12.5e3`): its digits before and after the point, moved by its
/// exponent, within `numeric`'s limits.
fn number_fits_numeric(n: &[u8]) -> bool {
    let (mantissa, exponent) = match n.iter().position(|c| matches!(c, b'e' | b'E')) {
        Some(at) => (&n[..at], &n[at + 1..]),
        None => (n, &b""[..]),
    };
    let exponent: i64 = if exponent.is_empty() {
        0
    } else {
        let digits = exponent.strip_prefix(b"+").unwrap_or(exponent);
        // Longer than 18 digits cannot be within the limit (and would overflow i64).
        if digits.len() > 18 {
            return false;
        }
        match std::str::from_utf8(digits).ok().and_then(|s| s.parse().ok()) {
            Some(e) => e,
            None => return false,
        }
    };
    if exponent.abs() > NUMERIC_MAX_EXPONENT {
        return false;
    }
    let mantissa = mantissa.strip_prefix(b"-").unwrap_or(mantissa);
    let (int, frac) = match mantissa.iter().position(|c| *c == b'.') {
        Some(at) => (&mantissa[..at], &mantissa[at + 1..]),
        None => (mantissa, &b""[..]),
    };
    let int_digits = i64::try_from(int.len()).unwrap_or(i64::MAX);
    let frac_digits = i64::try_from(frac.len()).unwrap_or(i64::MAX);
    int_digits.saturating_add(exponent) <= NUMERIC_MAX_WEIGHT_DIGITS
        && frac_digits.saturating_sub(exponent) <= NUMERIC_MAX_SCALE_DIGITS
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn record(headers: &[(&str, &[u8])], key: Option<&[u8]>, value: &[u8]) -> Record {
        Record {
            topic: "orders".into(),
            partition: 0,
            offset: 7,
            key: key.map(Bytes::copy_from_slice),
            value: Some(Bytes::copy_from_slice(value)),
            headers: headers
                .iter()
                .map(|(n, v)| (Bytes::copy_from_slice(n.as_bytes()), Some(Bytes::copy_from_slice(v))))
                .collect(),
            timestamp_ms: Some(1_700_000_000_000),
        }
    }

    #[test]
    fn the_id_type_and_aggregate_come_from_headers_and_key() {
        let names = HeaderNames::default();
        let r = record(&[("id", b"e-1"), ("eventType", b"Placed")], Some(b"agg-1"), br#"{"a":1}"#);
        let f = fields(&r, &names, 1024).unwrap();
        assert_eq!(f, Fields { event_id: "e-1", event_type: Some("Placed"), aggregate_id: Some("agg-1"), json: true });
        // CloudEvents binary mode.
        let r = record(&[("ce_id", b"c-1"), ("ce_type", b"T")], None, b"plain");
        let f = fields(&r, &names, 1024).unwrap();
        assert_eq!((f.event_id, f.event_type, f.aggregate_id, f.json), ("c-1", Some("T"), None, false));
        // A configured aggregate header instead of the key.
        let names = HeaderNames { aggregate_id: Some("agg".into()), ..HeaderNames::default() };
        let r = record(&[("id", b"1"), ("agg", b"from-header")], Some(b"key"), b"{}");
        assert_eq!(fields(&r, &names, 1024).unwrap().aggregate_id, Some("from-header"));
    }

    #[test]
    fn records_that_cannot_be_stored_say_why_without_their_contents() {
        let names = HeaderNames::default();
        let e = fields(&record(&[("other", b"x")], None, b"secret-value"), &names, 1024).unwrap_err();
        assert_eq!(e.code(), "no_event_id");
        assert_eq!(e.to_string(), "no_event_id: the record has none of the headers id, ce_id");
        let e = fields(&record(&[("id", b"a\0b")], None, b"{}"), &names, 1024).unwrap_err();
        assert_eq!(e.code(), "event_id_not_text");
        let e = fields(&record(&[("id", &[0xff, 0xfe])], None, b"{}"), &names, 1024).unwrap_err();
        assert_eq!(e.code(), "event_id_not_text");
        let e = fields(&record(&[("id", b"")], None, b"{}"), &names, 1024).unwrap_err();
        assert_eq!(e.code(), "no_event_id");
        let long = vec![b'x'; MAX_EVENT_ID_BYTES + 1];
        assert_eq!(
            fields(&record(&[("id", &long)], None, b"{}"), &names, 1024).unwrap_err().code(),
            "event_id_too_long"
        );
        let e = fields(&record(&[("id", b"1")], None, &[b'x'; 11]), &names, 10).unwrap_err();
        assert_eq!(e.to_string(), "value_too_large: the value has 11 bytes, over inbox.max_record_bytes = 10");
        assert!(!e.to_string().contains("secret"));
        // A key or type that is not text is simply absent.
        let r = record(&[("id", b"1"), ("eventType", &[0xff])], Some(&[0xc3]), b"{}");
        let f = fields(&r, &names, 1024).unwrap();
        assert_eq!((f.event_type, f.aggregate_id), (None, None));
    }

    #[test]
    fn jsonb_is_claimed_only_for_json_it_accepts() {
        assert!(is_jsonb(br#"{"a": [1, 2.5, "x\u00e9"], "b": null}"#));
        assert!(is_jsonb(b"42"));
        assert!(!is_jsonb(b"{not json"));
        assert!(!is_jsonb(br#"{"a": "\u0000"}"#));
        assert!(!is_jsonb(br#"{"a": "\uD83D"}"#));
        assert!(!is_jsonb(b""));
        assert!(!is_jsonb(&[0xff, 0x00]));
    }

    #[test]
    fn jsonb_is_not_claimed_for_numbers_numeric_cannot_hold() {
        // What PostgreSQL answers 22003 for ("value overflows numeric format").
        assert!(!is_jsonb(br#"{"a":1e1000000}"#));
        assert!(!is_jsonb(br#"[1, 2, -3.5E+1001]"#));
        assert!(!is_jsonb(br#"{"a":1e-1001}"#));
        assert!(!is_jsonb(br#"{"a":1e99999999999999999999}"#));
        assert!(!is_jsonb(format!("[0.{}]", "1".repeat(16_384)).as_bytes()));
        // Within the limits, and numbers inside strings, are JSON jsonb takes.
        assert!(is_jsonb(br#"{"a":1e1000,"b":-2.5e-1000,"c":"1e1000000","d":"\"1e9999\""}"#));
        assert!(is_jsonb(format!("[{}]", "9".repeat(131_072)).as_bytes()));
        assert!(!is_jsonb(format!("[{}]", "9".repeat(131_073)).as_bytes()));
    }

    #[test]
    fn a_record_postgres_refused_is_named_by_its_sqlstate_never_its_bytes() {
        let e = Invalid::RefusedByPostgres { sqlstate: "22003".into() };
        assert_eq!(e.code(), "refused_by_postgres");
        assert_eq!(
            e.to_string(),
            "refused_by_postgres: PostgreSQL refused the record with SQLSTATE 22003 (a number out of range); the record is in Kafka at this topic, partition and offset"
        );
    }
}

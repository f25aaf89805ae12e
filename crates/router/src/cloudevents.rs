//! The CloudEvents envelope (`envelope = "cloudevents"`), per the CloudEvents Kafka
//! protocol binding 1.0 and the JSON event format 1.0.
//!
//! | attribute | from |
//! |---|---|
//! | `specversion` | `1.0` |
//! | `id` | the event id (`table.field.event.id`, its header form) |
//! | `source` | `cloudevents.source` (the binary's default: `/walpost/<database>/<schema>.<table>`) |
//! | `type` | the event type column (`table.field.event.type.header`): required |
//! | `time` | `table.field.event.timestamp` when set and not NULL, else none: never the commit time, which a snapshot or replayed copy could not carry (every copy of an event has the same attributes); a table-less outbox message has its commit time |
//! | `subject` | the record key (the aggregate id, its header form); left out when empty |
//! | `datacontenttype` | `application/json` for json/jsonb payloads, envelopes and text that parses as JSON; `text/plain` for other text; `application/octet-stream` for bytea |
//!
//! - binary mode: the attributes as `ce_<name>` headers, `content-type` for
//!   `datacontenttype`, the value exactly as without the envelope.
//! - structured mode: the value is the JSON event format, `{"specversion":...,
//!   "data":<payload>}`, with header `content-type: application/cloudevents+json`. JSON
//!   data is the payload's bytes spliced in as PostgreSQL sent them (never parsed and
//!   re-written); text data is a JSON string; bytes are `data_base64`. Only the attribute
//!   strings are escaped.
//! - a tombstone (NULL payload with `route.tombstone.on.empty.payload`) stays a Kafka
//!   tombstone in both modes, so compaction still deletes the key: a null value with the
//!   `ce_*` attribute headers and no `content-type` (a binary-mode event without data).
//! - the record's other headers (`id`, `eventType`, placements, JSON headers) stay; a
//!   `:header` placement named `ce_*` or `content-type` is refused when the router is
//!   built, and such a key in a row's JSON headers column is a routing error.
//!
//! Invariants: key, partition and topic are never changed by the envelope; the attribute
//! values are valid UTF-8 JSON strings; JSON data is the exact payload bytes.

use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;

use crate::value::write_json_string;

/// `specversion`.
pub const SPECVERSION: &str = "1.0";
/// The header that carries `datacontenttype` in binary mode, and the event format in
/// structured mode.
pub const CONTENT_TYPE_HEADER: &str = "content-type";
/// Binary-mode attribute headers start with this.
pub const HEADER_PREFIX: &str = "ce_";
/// Structured mode's content type.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";
pub const JSON: &str = "application/json";
pub const TEXT: &str = "text/plain";
pub const OCTET_STREAM: &str = "application/octet-stream";

/// Binary (attributes in headers) or structured (one JSON document).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudEventsMode {
    Binary,
    Structured,
}

/// `envelope = "cloudevents"` with its `[cloudevents]` settings, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEventsConfig {
    pub mode: CloudEventsMode,
    /// The `source` attribute (a URI-reference; not empty).
    pub source: String,
}

/// Whether a header name belongs to the envelope (`ce_*`, `content-type`; Kafka header
/// names are case-sensitive, consumers' maps often are not: compared ignoring case).
pub fn reserved_header(name: &str) -> bool {
    name.get(..HEADER_PREFIX.len()).is_some_and(|p| p.eq_ignore_ascii_case(HEADER_PREFIX))
        || name.eq_ignore_ascii_case(CONTENT_TYPE_HEADER)
}

/// A row's event data, by what its bytes are.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Data<'a> {
    Json(&'a [u8]),
    Text(&'a [u8]),
    Binary(&'a [u8]),
}

impl Data<'_> {
    /// Text that parses as JSON is JSON; other UTF-8 is text; the rest bytes.
    pub(crate) fn classify(bytes: &[u8]) -> Data<'_> {
        if serde_json::from_slice::<&serde_json::value::RawValue>(bytes).is_ok() {
            Data::Json(bytes)
        } else if std::str::from_utf8(bytes).is_ok() {
            Data::Text(bytes)
        } else {
            Data::Binary(bytes)
        }
    }

    fn content_type(&self) -> &'static str {
        match self {
            Data::Json(_) => JSON,
            Data::Text(_) => TEXT,
            Data::Binary(_) => OCTET_STREAM,
        }
    }
}

/// One event's attributes (the values as the record's headers have them).
#[derive(Debug)]
pub(crate) struct Attributes<'a> {
    pub id: &'a Bytes,
    pub event_type: &'a Bytes,
    pub time: Option<jiff::Timestamp>,
    pub subject: &'a Bytes,
}

/// The envelope of one router: its settings and pre-built header names and values.
#[derive(Debug)]
pub(crate) struct Envelope {
    pub mode: CloudEventsMode,
    source: Bytes,
    names: [Arc<str>; 7],
}

const SPECVERSION_H: usize = 0;
const ID_H: usize = 1;
const SOURCE_H: usize = 2;
const TYPE_H: usize = 3;
const TIME_H: usize = 4;
const SUBJECT_H: usize = 5;
const CONTENT_TYPE_H: usize = 6;

impl Envelope {
    pub(crate) fn new(config: &CloudEventsConfig) -> Envelope {
        Envelope {
            mode: config.mode,
            source: Bytes::copy_from_slice(config.source.as_bytes()),
            names: ["ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time", "ce_subject", CONTENT_TYPE_HEADER]
                .map(Arc::from),
        }
    }

    /// The attribute headers (binary mode, and every tombstone); `data`: the
    /// `content-type` header's value, `None` for a tombstone.
    pub(crate) fn headers(&self, a: &Attributes<'_>, data: Option<&'static str>, out: &mut Vec<(Arc<str>, Bytes)>) {
        let name = |i: usize| self.names.get(i).cloned().unwrap_or_else(|| Arc::from(""));
        out.push((name(SPECVERSION_H), Bytes::from_static(SPECVERSION.as_bytes())));
        out.push((name(ID_H), a.id.clone()));
        out.push((name(SOURCE_H), self.source.clone()));
        out.push((name(TYPE_H), a.event_type.clone()));
        if let Some(t) = a.time {
            out.push((name(TIME_H), Bytes::from(t.to_string())));
        }
        if !a.subject.is_empty() {
            out.push((name(SUBJECT_H), a.subject.clone()));
        }
        if let Some(ct) = data {
            out.push((name(CONTENT_TYPE_H), Bytes::from_static(ct.as_bytes())));
        }
    }

    /// Binary mode: the attribute headers for `data`.
    pub(crate) fn binary(&self, a: &Attributes<'_>, data: Data<'_>, out: &mut Vec<(Arc<str>, Bytes)>) {
        self.headers(a, Some(data.content_type()), out);
    }

    /// Structured mode: the JSON event format document, and its `content-type` header.
    pub(crate) fn structured(&self, a: &Attributes<'_>, data: Data<'_>, out: &mut Vec<(Arc<str>, Bytes)>) -> Bytes {
        let size = match data {
            Data::Json(b) | Data::Text(b) => b.len() + b.len() / 8,
            Data::Binary(b) => b.len() * 4 / 3 + 4,
        };
        let mut v = Vec::with_capacity(size + 256 + a.id.len() + a.event_type.len() + a.subject.len());
        v.extend_from_slice(b"{\"specversion\":\"1.0\",\"id\":");
        string(&mut v, a.id);
        v.extend_from_slice(b",\"source\":");
        string(&mut v, &self.source);
        v.extend_from_slice(b",\"type\":");
        string(&mut v, a.event_type);
        if let Some(t) = a.time {
            v.extend_from_slice(b",\"time\":\"");
            v.extend_from_slice(t.to_string().as_bytes());
            v.push(b'"');
        }
        if !a.subject.is_empty() {
            v.extend_from_slice(b",\"subject\":");
            string(&mut v, a.subject);
        }
        v.extend_from_slice(b",\"datacontenttype\":\"");
        v.extend_from_slice(data.content_type().as_bytes());
        v.push(b'"');
        match data {
            Data::Json(json) => {
                v.extend_from_slice(b",\"data\":");
                v.extend_from_slice(json);
            }
            Data::Text(text) => {
                v.extend_from_slice(b",\"data\":");
                string(&mut v, text);
            }
            Data::Binary(bytes) => {
                v.extend_from_slice(b",\"data_base64\":\"");
                v.extend_from_slice(base64::engine::general_purpose::STANDARD.encode(bytes).as_bytes());
                v.push(b'"');
            }
        }
        v.push(b'}');
        let name = self.names.get(CONTENT_TYPE_H).cloned().unwrap_or_else(|| Arc::from(CONTENT_TYPE_HEADER));
        out.push((name, Bytes::from_static(STRUCTURED_CONTENT_TYPE.as_bytes())));
        Bytes::from(v)
    }
}

fn string(out: &mut Vec<u8>, text: &[u8]) {
    // Writing a String into a Vec cannot fail; the attributes are UTF-8 (lossy otherwise).
    let _ = write_json_string(out, text);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs<'a>(id: &'a Bytes, t: &'a Bytes, subject: &'a Bytes) -> Attributes<'a> {
        Attributes { id, event_type: t, time: Some("2026-11-29T08:00:00.25Z".parse().unwrap()), subject }
    }

    #[test]
    fn structured_document_splices_json_and_escapes_attributes() {
        let e = Envelope::new(&CloudEventsConfig {
            mode: CloudEventsMode::Structured,
            source: "/walpost/shop/events.outbox".into(),
        });
        let (id, t, s) =
            (Bytes::from_static(b"42"), Bytes::from_static(b"Order\"Placed"), Bytes::from_static(b"agg-1"));
        let payload = br#"{"b": 1.50, "a": [ 1,2 ]}"#;
        let mut headers = Vec::new();
        let v = e.structured(&attrs(&id, &t, &s), Data::Json(payload), &mut headers);
        let text = std::str::from_utf8(&v).unwrap();
        assert_eq!(
            text,
            r#"{"specversion":"1.0","id":"42","source":"/walpost/shop/events.outbox","type":"Order\"Placed","time":"2026-11-29T08:00:00.25Z","subject":"agg-1","datacontenttype":"application/json","data":{"b": 1.50, "a": [ 1,2 ]}}"#
        );
        assert!(text.contains(std::str::from_utf8(payload).unwrap()), "payload bytes unchanged");
        assert_eq!(headers, vec![(Arc::from("content-type"), Bytes::from_static(b"application/cloudevents+json"))]);
        let parsed: serde_json::Value = serde_json::from_slice(&v).unwrap();
        assert_eq!(parsed["data"]["b"], serde_json::json!(1.50));
    }

    #[test]
    fn structured_text_and_bytes() {
        let e = Envelope::new(&CloudEventsConfig { mode: CloudEventsMode::Structured, source: "/s".into() });
        let (id, t, s) = (Bytes::from_static(b"1"), Bytes::from_static(b"T"), Bytes::new());
        let mut a = attrs(&id, &t, &s);
        a.time = None;
        let v = e.structured(&a, Data::classify(b"plain \"text\""), &mut Vec::new());
        assert_eq!(
            std::str::from_utf8(&v).unwrap(),
            r#"{"specversion":"1.0","id":"1","source":"/s","type":"T","datacontenttype":"text/plain","data":"plain \"text\""}"#
        );
        let v = e.structured(&a, Data::classify(b"\xff\x00"), &mut Vec::new());
        assert_eq!(
            std::str::from_utf8(&v).unwrap(),
            r#"{"specversion":"1.0","id":"1","source":"/s","type":"T","datacontenttype":"application/octet-stream","data_base64":"/wA="}"#
        );
    }

    #[test]
    fn binary_headers_and_tombstones() {
        let e = Envelope::new(&CloudEventsConfig { mode: CloudEventsMode::Binary, source: "/s".into() });
        let (id, t, s) = (Bytes::from_static(b"42"), Bytes::from_static(b"T"), Bytes::from_static(b"agg"));
        let mut h = Vec::new();
        e.binary(&attrs(&id, &t, &s), Data::classify(b"{}"), &mut h);
        let names: Vec<(&str, &[u8])> = h.iter().map(|(k, v)| (&**k, v.as_ref())).collect();
        assert_eq!(
            names,
            vec![
                ("ce_specversion", &b"1.0"[..]),
                ("ce_id", b"42"),
                ("ce_source", b"/s"),
                ("ce_type", b"T"),
                ("ce_time", b"2026-11-29T08:00:00.25Z"),
                ("ce_subject", b"agg"),
                ("content-type", b"application/json"),
            ]
        );
        let mut h = Vec::new();
        e.headers(&attrs(&id, &t, &s), None, &mut h);
        assert!(h.iter().all(|(k, _)| &**k != "content-type"), "a tombstone has no data, so no content type");
    }

    #[test]
    fn reserved_header_names() {
        for name in ["ce_id", "CE_Type", "ce_", "content-type", "Content-Type"] {
            assert!(reserved_header(name), "{name}");
        }
        for name in ["id", "eventType", "traceparent", "cex", "content_type"] {
            assert!(!reserved_header(name), "{name}");
        }
    }
}

//! PostgreSQL's binary COPY format for `inbox.messages`: one tuple per record, the value's
//! bytes copied once into the COPY stream and never re-encoded (no JSON re-serialisation:
//! `payload_json` is the same bytes behind jsonb's version byte).
//!
//! The columns, in order, are [`COLUMNS`]. Each tuple's place in the stream is kept
//! ([`Encoded`]), so the store can leave out the records whose event id is stored
//! already without encoding anything again.

use bytes::{BufMut, BytesMut};

use crate::record::{text, Fields, Record};

/// The columns of `messages` the COPY writes, with their types, in COPY order.
pub(crate) const COLUMNS: &[(&str, &str)] = &[
    ("event_id", "text"),
    ("topic", "text"),
    ("\"partition\"", "integer"),
    ("\"offset\"", "bigint"),
    ("key", "bytea"),
    ("headers", "jsonb"),
    ("payload", "bytea"),
    ("payload_json", "jsonb"),
    ("event_type", "text"),
    ("aggregate_id", "text"),
    ("occurred_at", "timestamptz"),
];

const SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";
/// Microseconds from the Unix epoch to PostgreSQL's (2000-01-01).
const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;
const JSONB_VERSION: u8 = 1;

/// A COPY stream being built.
#[derive(Debug, Default)]
pub(crate) struct CopyRows {
    buf: BytesMut,
    index: Vec<Row>,
}

/// Where one record's tuple is in the stream, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) tuple: std::ops::Range<usize>,
    pub(crate) event_id: Box<str>,
    pub(crate) topic: std::sync::Arc<str>,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

/// A finished COPY stream (header, tuples, trailer) and its rows.
#[derive(Debug, Default)]
pub(crate) struct Encoded {
    pub(crate) data: BytesMut,
    pub(crate) rows: Vec<Row>,
}

/// Length of the stream's header: the signature, the flags, the extension length.
#[cfg(test)]
const HEADER_LEN: usize = SIGNATURE.len() + 8;

fn header(b: &mut BytesMut) {
    b.put_slice(SIGNATURE);
    b.put_i32(0); // flags
    b.put_i32(0); // header extension length
}

impl Encoded {
    /// The stream without the rows `skip` says (by index): header, the other tuples in
    /// their order, trailer.
    pub(crate) fn without(&self, skip: &[bool]) -> BytesMut {
        let mut out = BytesMut::with_capacity(self.data.len());
        header(&mut out);
        for (row, _) in self.rows.iter().zip(skip).filter(|(_, s)| !**s) {
            out.put_slice(self.data.get(row.tuple.clone()).unwrap_or_default());
        }
        out.put_i16(-1);
        out
    }

    /// The stream of row `i` alone (header, its tuple, trailer).
    pub(crate) fn only(&self, i: usize) -> BytesMut {
        let tuple = self.rows.get(i).and_then(|row| self.data.get(row.tuple.clone())).unwrap_or_default();
        let mut out = BytesMut::with_capacity(tuple.len() + 32);
        header(&mut out);
        out.put_slice(tuple);
        out.put_i16(-1);
        out
    }
}

impl CopyRows {
    #[cfg(test)]
    pub(crate) fn rows(&self) -> usize {
        self.index.len()
    }

    /// Appends `r`.
    pub(crate) fn push(&mut self, r: &Record, f: &Fields<'_>) {
        if self.buf.is_empty() {
            header(&mut self.buf);
        }
        let start = self.buf.len();
        let b = &mut self.buf;
        b.reserve(128 + r.value_len() * if f.json { 2 } else { 1 });
        b.put_i16(i16::try_from(COLUMNS.len()).unwrap_or(i16::MAX));
        bytes(b, Some(f.event_id.as_bytes()));
        bytes(b, Some(r.topic.as_bytes()));
        int4(b, r.partition);
        field(b, &r.offset.to_be_bytes());
        bytes(b, r.key.as_deref());
        jsonb_with(b, |out| headers_json(out, r));
        bytes(b, r.value.as_deref());
        match (f.json, r.value.as_deref()) {
            (true, Some(v)) => jsonb_with(b, |out| out.put_slice(v)),
            _ => null(b),
        }
        bytes(b, f.event_type.map(str::as_bytes));
        bytes(b, f.aggregate_id.map(str::as_bytes));
        match r.timestamp_ms.filter(|t| *t >= 0).and_then(|t| t.checked_mul(1000)) {
            Some(micros) => field(b, &(micros - PG_EPOCH_OFFSET_MICROS).to_be_bytes()),
            None => null(b),
        }
        self.index.push(Row {
            tuple: start..self.buf.len(),
            event_id: f.event_id.into(),
            topic: r.topic.clone(),
            partition: r.partition,
            offset: r.offset,
        });
    }

    /// The whole stream, with its trailer; the builder is empty again.
    pub(crate) fn finish(&mut self) -> Encoded {
        if !self.buf.is_empty() {
            self.buf.put_i16(-1);
        }
        Encoded { data: self.buf.split(), rows: std::mem::take(&mut self.index) }
    }
}

fn null(b: &mut BytesMut) {
    b.put_i32(-1);
}

fn field(b: &mut BytesMut, v: &[u8]) {
    b.put_i32(i32::try_from(v.len()).unwrap_or(i32::MAX));
    b.put_slice(v);
}

fn int4(b: &mut BytesMut, v: i32) {
    field(b, &v.to_be_bytes());
}

fn bytes(b: &mut BytesMut, v: Option<&[u8]>) {
    match v {
        Some(v) => field(b, v),
        None => null(b),
    }
}

/// A jsonb field written in place: its length is patched once the body is known.
fn jsonb_with(b: &mut BytesMut, body: impl FnOnce(&mut BytesMut)) {
    let at = b.len();
    b.put_i32(0);
    b.put_u8(JSONB_VERSION);
    body(b);
    let len = i32::try_from(b.len() - at - 4).unwrap_or(i32::MAX);
    if let Some(slot) = b.get_mut(at..at + 4) {
        slot.copy_from_slice(&len.to_be_bytes());
    }
}

/// How a header name that is not text is written as a key of the `headers` object: this,
/// then the name's bytes in base64. A text name that starts with it is written so too, so
/// that a key with this prefix always means base64.
pub(crate) const BASE64_NAME_PREFIX: &str = "base64:";

/// The headers as one JSON object: a text value as a string, any other (not UTF-8, or
/// holding NUL, which jsonb refuses) as `{"base64": "..."}`, an absent value as null; a
/// name that is not text as the key `base64:<its bytes in base64>`.
fn headers_json(out: &mut BytesMut, r: &Record) {
    use base64::Engine as _;
    out.put_u8(b'{');
    for (i, (name, value)) in r.headers.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        match text(name).filter(|n| !n.starts_with(BASE64_NAME_PREFIX)) {
            Some(n) => json_string(out, n),
            None => {
                out.put_u8(b'"');
                out.put_slice(BASE64_NAME_PREFIX.as_bytes());
                out.put_slice(base64::engine::general_purpose::STANDARD.encode(name).as_bytes());
                out.put_u8(b'"');
            }
        }
        out.put_u8(b':');
        match value.as_deref() {
            None => out.put_slice(b"null"),
            Some(v) => match text(v) {
                Some(t) => json_string(out, t),
                None => {
                    out.put_slice(b"{\"base64\":\"");
                    out.put_slice(base64::engine::general_purpose::STANDARD.encode(v).as_bytes());
                    out.put_slice(b"\"}");
                }
            },
        }
    }
    out.put_u8(b'}');
}

fn json_string(out: &mut BytesMut, s: &str) {
    // serde_json's escaping. NUL, which jsonb refuses even escaped, never reaches here:
    // names and values with it are base64 (see `text`).
    let _ = serde_json::to_writer(out.writer(), s);
}

#[cfg(test)]
mod tests {
    use super::super::record::fields;
    use super::super::record::tests::record;
    use super::*;
    use crate::settings::HeaderNames;

    #[test]
    fn a_tuple_has_every_column_and_the_stream_its_frame() {
        let r = record(&[("id", b"e-1"), ("bin", &[0xff])], Some(b"k"), br#"{"a":1}"#);
        let f = fields(&r, &HeaderNames::default(), 1 << 20).unwrap();
        let mut c = CopyRows::default();
        c.push(&r, &f);
        let r2 = record(&[("id", b"e-2")], None, b"x");
        c.push(&r2, &fields(&r2, &HeaderNames::default(), 1 << 20).unwrap());
        assert_eq!(c.rows(), 2);
        let out = c.finish();
        assert!(out.data.starts_with(SIGNATURE));
        assert!(out.data.ends_with(&[0xff, 0xff]), "trailer");
        let tuple = &out.data[HEADER_LEN..];
        assert_eq!(i16::from_be_bytes([tuple[0], tuple[1]]), 11);
        let text = String::from_utf8_lossy(&out.data);
        assert!(text.contains(r#"{"id":"e-1","bin":{"base64":"/w=="}}"#), "{text}");
        assert_eq!((&*out.rows[0].event_id, &*out.rows[1].event_id), ("e-1", "e-2"));
        assert_eq!(out.rows[0].tuple.start, HEADER_LEN);
        assert_eq!(out.rows[1].tuple.end, out.data.len() - 2);
        // Leaving the first out: the header, the second tuple, the trailer.
        let second = out.without(&[true, false]);
        assert_eq!(second.len(), HEADER_LEN + out.rows[1].tuple.len() + 2);
        assert_eq!(&second[HEADER_LEN..second.len() - 2], &out.data[out.rows[1].tuple.clone()]);
        assert_eq!(out.without(&[false, false]), out.data, "nothing left out: the same stream");
        assert_eq!(out.only(1), second, "the second alone");
        assert_eq!((out.rows[1].partition, out.rows[1].offset), (0, 7));
        assert!(c.rows() == 0 && c.finish().data.is_empty(), "empty again");
    }

    /// Regression: a header name that is not UTF-8 stopped the inbox (its consumer thread
    /// panicked reading it). It is stored as a `base64:` key, as a value would be.
    #[test]
    fn regression_a_header_name_that_is_not_text_is_stored_in_base64() {
        use bytes::Bytes;
        let mut r = record(&[("id", b"e-1")], None, b"{}");
        r.headers.push((Bytes::from_static(&[0xff, 0xfe]), Some(Bytes::from_static(b"v"))));
        r.headers.push((Bytes::from_static(b"base64:x"), Some(Bytes::from_static(b"w"))));
        r.headers.push((Bytes::from_static(b"nul\0"), None));
        let f = fields(&r, &HeaderNames::default(), 1 << 20).unwrap();
        let mut c = CopyRows::default();
        c.push(&r, &f);
        let out = c.finish();
        let text = String::from_utf8_lossy(&out.data);
        assert!(
            text.contains(r#"{"id":"e-1","base64://4=":"v","base64:YmFzZTY0Ong=":"w","base64:bnVsAA==":null}"#),
            "{text}"
        );
    }
}

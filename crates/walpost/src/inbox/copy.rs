//! PostgreSQL's binary COPY format for the inbox's staging table: one tuple per record,
//! the value's bytes copied once into the COPY stream and never re-encoded (no JSON
//! re-serialisation: `payload_json` is the same bytes behind jsonb's version byte).
//!
//! The columns, in order, are [`COLUMNS`]; `store.rs` creates the staging table with
//! exactly these types.

use bytes::{BufMut, BytesMut};

use super::record::{text, Fields, Record};

/// The staging table's columns and types, in COPY order.
pub(crate) const COLUMNS: &[(&str, &str)] = &[
    ("ord", "integer"),
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
    rows: usize,
}

impl CopyRows {
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Appends `r` as row number `ord` of the batch.
    pub(crate) fn push(&mut self, ord: i32, r: &Record, f: &Fields<'_>) {
        if self.buf.is_empty() {
            self.buf.put_slice(SIGNATURE);
            self.buf.put_i32(0); // flags
            self.buf.put_i32(0); // header extension length
        }
        let b = &mut self.buf;
        b.reserve(128 + r.value_len() * if f.json { 2 } else { 1 });
        b.put_i16(i16::try_from(COLUMNS.len()).unwrap_or(i16::MAX));
        int4(b, ord);
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
        self.rows += 1;
    }

    /// The whole stream, with its trailer; the builder is empty again.
    pub(crate) fn finish(&mut self) -> BytesMut {
        if !self.buf.is_empty() {
            self.buf.put_i16(-1);
        }
        self.rows = 0;
        self.buf.split()
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

/// The headers as one JSON object: a text value as a string, any other (not UTF-8, or
/// holding NUL, which jsonb refuses) as `{"base64": "..."}`, an absent value as null.
fn headers_json(out: &mut BytesMut, r: &Record) {
    use base64::Engine as _;
    out.put_u8(b'{');
    for (i, (name, value)) in r.headers.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        json_string(out, name);
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
    // values with it are base64 (see `text`), and header names are C strings in librdkafka.
    let _ = serde_json::to_writer(out.writer(), s);
}

#[cfg(test)]
mod tests {
    use super::super::record::fields;
    use super::super::record::tests::record;
    use super::*;
    use crate::settings::inbox::HeaderNames;

    #[test]
    fn a_tuple_has_every_column_and_the_stream_its_frame() {
        let r = record(&[("id", b"e-1"), ("bin", &[0xff])], Some(b"k"), br#"{"a":1}"#);
        let f = fields(&r, &HeaderNames::default(), 1 << 20).unwrap();
        let mut c = CopyRows::default();
        c.push(0, &r, &f);
        assert_eq!(c.rows(), 1);
        let out = c.finish();
        assert!(out.starts_with(SIGNATURE));
        assert!(out.ends_with(&[0xff, 0xff]), "trailer");
        let tuple = &out[SIGNATURE.len() + 8..];
        assert_eq!(i16::from_be_bytes([tuple[0], tuple[1]]), 12);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains(r#"{"id":"e-1","bin":{"base64":"/w=="}}"#), "{text}");
        assert!(c.rows() == 0 && c.finish().is_empty(), "empty again");
    }
}

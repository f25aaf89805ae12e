//! OTLP's protobuf messages for spans, written by hand: `ExportTraceServiceRequest` and
//! what it holds (`opentelemetry/proto/trace/v1/trace.proto`, `common/v1/common.proto`,
//! `resource/v1/resource.proto`, stable since OTLP 1.0). Only encoding, only the fields
//! walpost sets; field numbers and wire types are the proto files'.
//!
//! One pass computes every message's exact length, the next writes into one buffer of
//! that size: no allocation per span or attribute (a span is written from its fields).

use std::sync::Arc;

use bytes::Bytes;

/// A finished span of one published event, ready to encode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_span_id: Option<[u8; 8]>,
    pub trace_state: Option<Bytes>,
    /// W3C trace flags (the sampled bit).
    pub flags: u8,
    /// The span is named `send <topic>`.
    pub topic: Arc<str>,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    pub partition: i32,
    pub offset: i64,
    /// `messaging.message.id`: the event id.
    pub message_id: Bytes,
    /// `walpost.commit_lsn`, written as PostgreSQL writes an LSN (`16/B374D848`).
    pub commit_lsn: u64,
}

/// `Span.SpanKind.SPAN_KIND_PRODUCER`.
const SPAN_KIND_PRODUCER: u64 = 4;
/// `SpanFlags`: the parent's remoteness is known (bit 8), and it is remote (bit 9): a
/// row's trace context comes from the writer's process.
const CONTEXT_HAS_IS_REMOTE: u32 = 0x100;
const CONTEXT_IS_REMOTE: u32 = 0x200;
const NAME_PREFIX: &[u8] = b"send ";

/// An attribute value, borrowed from the span.
enum Value<'a> {
    Str(&'a [u8]),
    Int(i64),
}

/// The span's attributes, in the order they are written (OpenTelemetry's messaging
/// conventions, and the commit LSN).
fn attributes<'a>(s: &'a Span, partition: &'a [u8], lsn: &'a [u8]) -> [(&'static str, Value<'a>); 9] {
    [
        ("messaging.system", Value::Str(b"kafka")),
        ("messaging.operation.name", Value::Str(b"send")),
        ("messaging.operation.type", Value::Str(b"send")),
        ("messaging.destination.name", Value::Str(s.topic.as_bytes())),
        ("messaging.destination.partition.id", Value::Str(partition)),
        ("messaging.kafka.destination.partition", Value::Int(i64::from(s.partition))),
        ("messaging.kafka.offset", Value::Int(s.offset)),
        ("messaging.message.id", Value::Str(&s.message_id)),
        ("walpost.commit_lsn", Value::Str(lsn)),
    ]
}

/// `ExportTraceServiceRequest` with one `ResourceSpans` and one `ScopeSpans`.
pub(crate) fn export_request(resource: &[(String, String)], scope: (&str, &str), spans: &[Span]) -> Vec<u8> {
    let resource_len: usize =
        resource.iter().map(|(k, v)| field_len(1, kv_len(k.as_bytes(), &Value::Str(v.as_bytes())))).sum();
    let scope_len = field_len(1, scope.0.len()) + field_len(2, scope.1.len());
    let span_lens: Vec<usize> = spans.iter().map(span_len).collect();
    let scope_spans_len = field_len(1, scope_len) + span_lens.iter().map(|l| field_len(2, *l)).sum::<usize>();
    let resource_spans_len = field_len(1, resource_len) + field_len(2, scope_spans_len);
    let mut out = Vec::with_capacity(field_len(1, resource_spans_len));
    header(&mut out, 1, resource_spans_len);
    header(&mut out, 1, resource_len);
    for (k, v) in resource {
        let value = Value::Str(v.as_bytes());
        header(&mut out, 1, kv_len(k.as_bytes(), &value));
        write_kv(&mut out, k.as_bytes(), &value);
    }
    header(&mut out, 2, scope_spans_len);
    header(&mut out, 1, scope_len);
    bytes(&mut out, 1, scope.0.as_bytes());
    bytes(&mut out, 2, scope.1.as_bytes());
    for (s, len) in spans.iter().zip(span_lens) {
        header(&mut out, 2, len);
        write_span(&mut out, s);
    }
    out
}

/// What the span writes besides its attributes, and the attributes' text forms.
fn span_len(s: &Span) -> usize {
    let mut partition = itoa_buf();
    let mut lsn = lsn_buf();
    let (partition, lsn) = (fmt_i64(&mut partition, i64::from(s.partition)), fmt_lsn(&mut lsn, s.commit_lsn));
    let mut n = field_len(1, 16) + field_len(2, 8);
    if let Some(state) = &s.trace_state {
        n += field_len(3, state.len());
    }
    if s.parent_span_id.is_some() {
        n += field_len(4, 8);
    }
    n += field_len(5, NAME_PREFIX.len() + s.topic.len());
    n += 1 + varint_len(SPAN_KIND_PRODUCER) + 2 * (1 + 8);
    n += attributes(s, partition, lsn).iter().map(|(k, v)| field_len(9, kv_len(k.as_bytes(), v))).sum::<usize>();
    n + 2 + 4
}

fn write_span(out: &mut Vec<u8>, s: &Span) {
    let mut partition = itoa_buf();
    let mut lsn = lsn_buf();
    let (partition, lsn) = (fmt_i64(&mut partition, i64::from(s.partition)), fmt_lsn(&mut lsn, s.commit_lsn));
    bytes(out, 1, &s.trace_id);
    bytes(out, 2, &s.span_id);
    if let Some(state) = &s.trace_state {
        bytes(out, 3, state);
    }
    if let Some(parent) = &s.parent_span_id {
        bytes(out, 4, parent);
    }
    header(out, 5, NAME_PREFIX.len() + s.topic.len());
    out.extend_from_slice(NAME_PREFIX);
    out.extend_from_slice(s.topic.as_bytes());
    tag(out, 6, 0);
    varint(out, SPAN_KIND_PRODUCER);
    fixed64(out, 7, s.start_unix_nano);
    fixed64(out, 8, s.end_unix_nano);
    for (k, v) in &attributes(s, partition, lsn) {
        header(out, 9, kv_len(k.as_bytes(), v));
        write_kv(out, k.as_bytes(), v);
    }
    let remote = if s.parent_span_id.is_some() { CONTEXT_IS_REMOTE } else { 0 };
    fixed32(out, 16, u32::from(s.flags) | CONTEXT_HAS_IS_REMOTE | remote);
}

/// `KeyValue { key = 1; AnyValue value = 2 }`, `AnyValue { string_value = 1; int_value = 3 }`.
fn kv_len(key: &[u8], value: &Value<'_>) -> usize {
    field_len(1, key.len()) + field_len(2, any_len(value))
}

fn any_len(value: &Value<'_>) -> usize {
    match value {
        Value::Str(s) => field_len(1, s.len()),
        Value::Int(i) => 1 + varint_len(*i as u64),
    }
}

fn write_kv(out: &mut Vec<u8>, key: &[u8], value: &Value<'_>) {
    bytes(out, 1, key);
    header(out, 2, any_len(value));
    match value {
        Value::Str(s) => bytes(out, 1, s),
        // int64 is a plain varint of the two's complement.
        Value::Int(i) => {
            tag(out, 3, 0);
            varint(out, *i as u64);
        }
    }
}

/// Length of a length-delimited field with `len` bytes of content (field numbers < 16
/// take one tag byte; walpost's 16 is written by `fixed32` only).
fn field_len(_field: u32, len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn header(out: &mut Vec<u8>, field: u32, len: usize) {
    tag(out, field, 2);
    varint(out, len as u64);
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    header(out, field, b.len());
    out.extend_from_slice(b);
}

fn tag(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, u64::from(field) << 3 | u64::from(wire_type));
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn fixed32(out: &mut Vec<u8>, field: u32, v: u32) {
    tag(out, field, 5);
    out.extend_from_slice(&v.to_le_bytes());
}

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn itoa_buf() -> [u8; 20] {
    [0; 20]
}

fn lsn_buf() -> [u8; 17] {
    [0; 17]
}

/// Decimal text of `v` in `buf` (no allocation).
fn fmt_i64(buf: &mut [u8; 20], v: i64) -> &[u8] {
    let mut n = v.unsigned_abs();
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        i -= 1;
        buf[i] = b'-';
    }
    &buf[i..]
}

/// PostgreSQL's text of an LSN, `%X/%X` (upper-case hex, no padding).
fn fmt_lsn(buf: &mut [u8; 17], lsn: u64) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut at = 0;
    for (k, half) in [(lsn >> 32) as u32, lsn as u32].into_iter().enumerate() {
        if k == 1 {
            buf[at] = b'/';
            at += 1;
        }
        let digits = (8 - half.leading_zeros() as usize / 4).max(1);
        for d in (0..digits).rev() {
            buf[at] = HEX[((half >> (4 * d)) & 0xf) as usize];
            at += 1;
        }
    }
    &buf[..at]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span() -> Span {
        Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent_span_id: Some([3; 8]),
            trace_state: Some(Bytes::from_static(b"r=1")),
            flags: 1,
            topic: Arc::from("t"),
            start_unix_nano: 5,
            end_unix_nano: 6,
            partition: 2,
            offset: -1,
            message_id: Bytes::from_static(b"42"),
            commit_lsn: 0x16_B374_D848,
        }
    }

    #[test]
    fn varints_texts_and_lengths() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        for v in [0u64, 1, 127, 128, 300, 16_383, 16_384, u64::MAX] {
            let mut out = Vec::new();
            varint(&mut out, v);
            assert_eq!(varint_len(v), out.len(), "{v}");
        }
        assert_eq!(fmt_i64(&mut itoa_buf(), -1), b"-1");
        assert_eq!(fmt_i64(&mut itoa_buf(), i64::MIN), b"-9223372036854775808");
        assert_eq!(fmt_lsn(&mut lsn_buf(), 0x16_B374_D848), b"16/B374D848");
        assert_eq!(fmt_lsn(&mut lsn_buf(), 0), b"0/0");
        assert_eq!(fmt_lsn(&mut lsn_buf(), u64::MAX), b"FFFFFFFF/FFFFFFFF");
        assert_eq!(pgoutput::Lsn(0x16_B374_D848).to_string(), "16/B374D848", "as walpost logs it");
    }

    /// A span's bytes, field by field (checked against the proto files' numbering; the
    /// e2e test has a real Collector decode them), and the computed lengths are exact.
    #[test]
    fn one_span_encodes_field_by_field() {
        let s = span();
        let mut m = Vec::new();
        write_span(&mut m, &s);
        assert_eq!(m.len(), span_len(&s));
        let mut want = vec![0x0a, 16];
        want.extend([1; 16]);
        want.extend([0x12, 8]);
        want.extend([2; 8]);
        want.extend([0x1a, 3]);
        want.extend(b"r=1");
        want.extend([0x22, 8]);
        want.extend([3; 8]);
        want.extend([0x2a, 6]);
        want.extend(b"send t");
        want.extend([0x30, 4]);
        want.extend([0x39, 5, 0, 0, 0, 0, 0, 0, 0]);
        want.extend([0x41, 6, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(&m[..want.len()], want.as_slice());
        // The first attribute: KeyValue{key "messaging.system", AnyValue{string "kafka"}}.
        let mut kv = vec![0x4a, 27, 0x0a, 16];
        kv.extend(b"messaging.system");
        kv.extend([0x12, 7, 0x0a, 5]);
        kv.extend(b"kafka");
        assert_eq!(&m[want.len()..want.len() + kv.len()], kv.as_slice());
        // offset -1: a ten-byte varint.
        let offset_kv = [0x12, 11, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert!(m.windows(offset_kv.len()).any(|w| w == offset_kv));
        // Flags: sampled, parent known to be remote.
        assert_eq!(&m[m.len() - 6..], [0x85, 0x01, 0x01, 0x03, 0, 0]);
        let request =
            export_request(&[("service.name".into(), "walpost".into())], ("walpost", "0.1.0"), &[s.clone(), s]);
        assert_eq!(request.capacity(), request.len(), "the size computed up front is exact");
    }
}

//! OTLP's protobuf messages for spans, written by hand: `ExportTraceServiceRequest` and
//! what it holds (`opentelemetry/proto/trace/v1/trace.proto`, `common/v1/common.proto`,
//! `resource/v1/resource.proto`, stable since OTLP 1.0). Only encoding, only the fields
//! walpost sets; field numbers and wire types are the proto files'.

/// One attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
}

/// A finished span, ready to encode.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_span_id: Option<[u8; 8]>,
    pub trace_state: Option<String>,
    /// W3C trace flags (the sampled bit).
    pub flags: u8,
    /// Whether the parent came from another process (a row's trace context).
    pub parent_remote: bool,
    pub name: String,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    pub attributes: Vec<(&'static str, Value)>,
}

/// `Span.SpanKind.SPAN_KIND_PRODUCER`.
const SPAN_KIND_PRODUCER: u64 = 4;
/// `SpanFlags`: the parent's remoteness is known (bit 8), and it is remote (bit 9).
const CONTEXT_HAS_IS_REMOTE: u32 = 0x100;
const CONTEXT_IS_REMOTE: u32 = 0x200;

/// `ExportTraceServiceRequest` with one `ResourceSpans` and one `ScopeSpans`.
pub fn export_request(resource: &[(String, String)], scope: (&str, &str), spans: &[Span]) -> Vec<u8> {
    let mut resource_msg = Vec::new();
    for (k, v) in resource {
        message(&mut resource_msg, 1, |m| key_value(m, k, &Value::Str(v.clone())));
    }
    let mut scope_spans = Vec::new();
    message(&mut scope_spans, 1, |m| {
        bytes(m, 1, scope.0.as_bytes());
        bytes(m, 2, scope.1.as_bytes());
    });
    for s in spans {
        message(&mut scope_spans, 2, |m| span(m, s));
    }
    let mut resource_spans = Vec::new();
    bytes(&mut resource_spans, 1, &resource_msg);
    bytes(&mut resource_spans, 2, &scope_spans);
    let mut out = Vec::with_capacity(resource_spans.len() + 8);
    bytes(&mut out, 1, &resource_spans);
    out
}

fn span(m: &mut Vec<u8>, s: &Span) {
    bytes(m, 1, &s.trace_id);
    bytes(m, 2, &s.span_id);
    if let Some(state) = &s.trace_state {
        bytes(m, 3, state.as_bytes());
    }
    if let Some(parent) = &s.parent_span_id {
        bytes(m, 4, parent);
    }
    bytes(m, 5, s.name.as_bytes());
    varint_field(m, 6, SPAN_KIND_PRODUCER);
    fixed64(m, 7, s.start_unix_nano);
    fixed64(m, 8, s.end_unix_nano);
    for (k, v) in &s.attributes {
        message(m, 9, |kv| key_value(kv, k, v));
    }
    let remote = match (s.parent_span_id, s.parent_remote) {
        (Some(_), true) => CONTEXT_HAS_IS_REMOTE | CONTEXT_IS_REMOTE,
        _ => CONTEXT_HAS_IS_REMOTE,
    };
    fixed32(m, 16, u32::from(s.flags) | remote);
}

/// `KeyValue { key = 1; AnyValue value = 2 }`, `AnyValue { string_value = 1; int_value = 3 }`.
fn key_value(m: &mut Vec<u8>, key: &str, value: &Value) {
    bytes(m, 1, key.as_bytes());
    message(m, 2, |v| match value {
        Value::Str(s) => bytes(v, 1, s.as_bytes()),
        // int64 is a plain varint of the two's complement.
        Value::Int(i) => varint_field(v, 3, *i as u64),
    });
}

fn message(out: &mut Vec<u8>, field: u32, fill: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    fill(&mut inner);
    bytes(out, field, &inner);
}

fn tag(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, u64::from(field) << 3 | u64::from(wire_type));
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(out, field, 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, 0);
    varint(out, v);
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn fixed32(out: &mut Vec<u8>, field: u32, v: u32) {
    tag(out, field, 5);
    out.extend_from_slice(&v.to_le_bytes());
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_negative_ints() {
        let mut out = Vec::new();
        varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
        let mut out = Vec::new();
        key_value(&mut out, "k", &Value::Int(-1));
        // key "k", then AnyValue{int_value = -1}: ten bytes of varint.
        assert_eq!(
            out,
            [0x0a, 0x01, b'k', 0x12, 0x0b, 0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
    }

    /// A span's bytes, field by field (checked against the proto files' numbering; the
    /// e2e test has a real collector decode them).
    #[test]
    fn one_span_encodes_field_by_field() {
        let s = Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent_span_id: Some([3; 8]),
            trace_state: None,
            flags: 1,
            parent_remote: true,
            name: "send t".into(),
            start_unix_nano: 5,
            end_unix_nano: 6,
            attributes: vec![("a", Value::Str("b".into()))],
        };
        let mut m = Vec::new();
        span(&mut m, &s);
        let mut want = vec![0x0a, 16];
        want.extend([1; 16]);
        want.extend([0x12, 8]);
        want.extend([2; 8]);
        want.extend([0x22, 8]);
        want.extend([3; 8]);
        want.extend([0x2a, 6]);
        want.extend(b"send t");
        want.extend([0x30, 4]);
        want.extend([0x39, 5, 0, 0, 0, 0, 0, 0, 0]);
        want.extend([0x41, 6, 0, 0, 0, 0, 0, 0, 0]);
        want.extend([0x4a, 8, 0x0a, 1, b'a', 0x12, 3, 0x0a, 1, b'b']);
        want.extend([0x85, 0x01, 0x01, 0x03, 0, 0]);
        assert_eq!(m, want);
    }
}

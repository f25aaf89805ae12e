//! A finished span of walpost's, as OTLP's `ExportTraceServiceRequest`: the message
//! types are `opentelemetry-proto`'s (generated from the OpenTelemetry proto files by the
//! OpenTelemetry project, encoded by `prost`), walpost only fills them in.
//!
//! Encoding runs on the exporter's thread, never on the stream: the stream hands over a
//! [`Span`] of copied ids and shared `Bytes`/`Arc<str>`, and this module builds the message
//! for a whole batch at once.

use std::sync::Arc;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1 as trace;
use prost::Message;

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

/// The encoded `ExportTraceServiceRequest` of `spans`, under one resource and one scope.
pub(crate) fn export_request(resource: &[(String, String)], scope: (&str, &str), spans: &[Span]) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![trace::ResourceSpans {
            resource: Some(Resource {
                attributes: resource.iter().map(|(k, v)| string(k, v.clone())).collect(),
                ..Default::default()
            }),
            scope_spans: vec![trace::ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: scope.0.to_owned(),
                    version: scope.1.to_owned(),
                    ..Default::default()
                }),
                spans: spans.iter().map(span).collect(),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
    .encode_to_vec()
}

/// A row's trace context comes from the writer's process: its parent is remote (both
/// `SpanFlags` bits say so); a root span's parent is known not to be.
fn span(s: &Span) -> trace::Span {
    let remote = if s.parent_span_id.is_some() { trace::SpanFlags::ContextIsRemoteMask as u32 } else { 0 };
    trace::Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        // W3C tracestate is printable ASCII (the router checked it when it read the row).
        trace_state: s.trace_state.as_deref().map(|t| String::from_utf8_lossy(t).into_owned()).unwrap_or_default(),
        parent_span_id: s.parent_span_id.map(|p| p.to_vec()).unwrap_or_default(),
        flags: u32::from(s.flags) | trace::SpanFlags::ContextHasIsRemoteMask as u32 | remote,
        name: format!("send {}", s.topic),
        kind: trace::span::SpanKind::Producer as i32,
        start_time_unix_nano: s.start_unix_nano,
        end_time_unix_nano: s.end_unix_nano,
        attributes: attributes(s),
        ..Default::default()
    }
}

/// OpenTelemetry's messaging conventions for a Kafka send, and the commit LSN.
fn attributes(s: &Span) -> Vec<KeyValue> {
    vec![
        string("messaging.system", "kafka".into()),
        string("messaging.operation.name", "send".into()),
        string("messaging.operation.type", "send".into()),
        string("messaging.destination.name", s.topic.to_string()),
        string("messaging.destination.partition.id", s.partition.to_string()),
        int("messaging.kafka.destination.partition", i64::from(s.partition)),
        int("messaging.kafka.offset", s.offset),
        string("messaging.message.id", String::from_utf8_lossy(&s.message_id).into_owned()),
        string("walpost.commit_lsn", pgoutput::Lsn(s.commit_lsn).to_string()),
    ]
}

fn string(key: &str, value: String) -> KeyValue {
    attribute(key, any_value::Value::StringValue(value))
}

fn int(key: &str, value: i64) -> KeyValue {
    attribute(key, any_value::Value::IntValue(value))
}

fn attribute(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue { key: key.to_owned(), value: Some(AnyValue { value: Some(value) }), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span_of(parent: Option<[u8; 8]>) -> Span {
        Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent_span_id: parent,
            trace_state: parent.map(|_| Bytes::from_static(b"r=1")),
            flags: 1,
            topic: Arc::from("orders"),
            start_unix_nano: 5,
            end_unix_nano: 6,
            partition: 2,
            offset: -1,
            message_id: Bytes::from_static(b"42"),
            commit_lsn: 0x16_B374_D848,
        }
    }

    fn value(span: &trace::Span, key: &str) -> Option<any_value::Value> {
        span.attributes.iter().find(|a| a.key == key)?.value.as_ref()?.value.clone()
    }

    /// What a receiver decodes from walpost's bytes (the e2e tests have a real Collector
    /// decode them too): one resource, one scope, the spans with walpost's fields.
    #[test]
    fn a_batch_decodes_to_the_spans_walpost_made() {
        let bytes = export_request(
            &[("service.name".into(), "walpost".into())],
            ("walpost", "0.1.0"),
            &[span_of(Some([3; 8])), span_of(None)],
        );
        let request = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        let [rs] = request.resource_spans.as_slice() else { panic!("one resource: {request:?}") };
        let service = &rs.resource.as_ref().unwrap().attributes[0];
        assert_eq!(service.key, "service.name");
        let [ss] = rs.scope_spans.as_slice() else { panic!("one scope") };
        assert_eq!(ss.scope.as_ref().map(|s| (s.name.as_str(), s.version.as_str())), Some(("walpost", "0.1.0")));
        let [child, root] = ss.spans.as_slice() else { panic!("two spans") };

        assert_eq!((child.trace_id.as_slice(), child.span_id.as_slice()), (&[1u8; 16][..], &[2u8; 8][..]));
        assert_eq!((child.parent_span_id.as_slice(), child.trace_state.as_str()), (&[3u8; 8][..], "r=1"));
        assert_eq!((child.name.as_str(), child.kind), ("send orders", trace::span::SpanKind::Producer as i32));
        assert_eq!((child.start_time_unix_nano, child.end_time_unix_nano), (5, 6));
        assert_eq!(child.flags, 0x301, "sampled, parent known to be remote");
        assert_eq!(root.flags, 0x101, "sampled, parent known not to be remote");
        assert!(root.parent_span_id.is_empty() && root.trace_state.is_empty());

        let s = |v: &str| Some(any_value::Value::StringValue(v.into()));
        assert_eq!(value(child, "messaging.system"), s("kafka"));
        assert_eq!(value(child, "messaging.destination.name"), s("orders"));
        assert_eq!(value(child, "messaging.destination.partition.id"), s("2"));
        assert_eq!(value(child, "messaging.kafka.destination.partition"), Some(any_value::Value::IntValue(2)));
        assert_eq!(value(child, "messaging.kafka.offset"), Some(any_value::Value::IntValue(-1)));
        assert_eq!(value(child, "messaging.message.id"), s("42"));
        assert_eq!(value(child, "walpost.commit_lsn"), s("16/B374D848"), "as walpost logs an LSN");
        assert_eq!(child.attributes.len(), 9);
    }
}

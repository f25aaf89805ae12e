//! OpenTelemetry spans over OTLP/HTTP (protobuf), only when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! (or `..._TRACES_ENDPOINT`) is set ([`settings`]).
//!
//! One span per published event, `send <topic>` (kind PRODUCER, OpenTelemetry's
//! messaging conventions), from the transaction's commit time to Kafka's
//! acknowledgement, child of the row's `traceparent` when it has one (else a root span,
//! as `OTEL_TRACES_SAMPLER` decides). The record's `traceparent` header then names
//! walpost's span, so a consumer's span is its child; an unsampled row keeps its own.
//!
//! Invariants:
//! - Export never blocks or slows the stream: the stream only `try_send`s a finished span
//!   into a bounded queue (`OTEL_BSP_MAX_QUEUE_SIZE`); a full queue drops the span
//!   (`walpost_spans_dropped_total`). Encoding and HTTP run on the exporter's own thread
//!   and runtime, one request at a time, each bounded by the export timeout; a failed
//!   export is retried within that timeout when OTLP says to (a connection error, 429,
//!   502, 503, 504: see `http`), then its batch is dropped (counted).
//! - Without the variable no exporter exists: the stream holds `None` and pays nothing per
//!   event.
//! - Spans carry no payload or key: the topic, partition, offset, event id and commit
//!   LSN only.

mod http;
mod proto;
pub mod settings;

use std::hash::{BuildHasher, Hasher};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use router::TraceParent;

use proto::Span;
use service::error::{ErrorKind, PipelineError};
use settings::{Compression, OtelSettings, RootSampler, Sampler};

/// The exporter's counters (`walpost_spans_exported_total`, `walpost_spans_dropped_total`),
/// registered by the binary with its other series.
#[derive(Debug, Clone)]
pub struct SpanMetrics {
    pub exported: prometheus::IntCounter,
    pub dropped: prometheus::IntCounter,
}

/// The log target of the exporter's lines, as when it was a module of the binary:
/// operators filter on it (`WALPOST_LOG`) and runbooks/otel-and-cloudevents.md quotes it.
const LOG_TARGET: &str = "walpost::otlp";

/// The exporter thread and the queue into it.
pub struct Exporter {
    tx: Option<SyncSender<Span>>,
    sampler: Sampler,
    metrics: SpanMetrics,
    done: Option<mpsc::Receiver<()>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").field("sampler", &self.sampler).finish()
    }
}

impl Exporter {
    /// Starts the exporter thread.
    pub fn start(s: &OtelSettings, metrics: SpanMetrics) -> Result<Exporter, PipelineError> {
        let (tx, rx) = mpsc::sync_channel::<Span>(s.max_queue);
        let (done_tx, done) = mpsc::channel();
        let mut resource = vec![
            ("service.name".to_owned(), s.service_name.clone()),
            ("service.version".to_owned(), env!("CARGO_PKG_VERSION").to_owned()),
            ("telemetry.sdk.name".to_owned(), "walpost".to_owned()),
            ("telemetry.sdk.language".to_owned(), "rust".to_owned()),
        ];
        resource.extend(s.resource.iter().cloned());
        let mut client = http::Client::new(s.authority.clone(), s.path.clone(), s.headers.clone(), s.timeout);
        if let Some(tls) = &s.tls {
            client = client.with_tls(tls).map_err(|e| PipelineError::definite(ErrorKind::Config, e.to_string()))?;
        }
        if s.compression == Compression::Gzip {
            client = client.with_gzip();
        }
        let worker = Worker {
            rx,
            client,
            resource,
            max_batch: s.max_batch,
            delay: s.schedule_delay,
            metrics: metrics.clone(),
            last_warning: None,
        };
        let thread = std::thread::Builder::new()
            .name("walpost-otlp".into())
            .spawn(move || {
                worker.run();
                let _ = done_tx.send(());
            })
            .map_err(|e| {
                PipelineError::definite(ErrorKind::Host, format!("cannot start the OTLP exporter thread: {e}"))
            })?;
        tracing::info!(
            target: LOG_TARGET,
            endpoint = %format!("{}://{}{}", if s.tls.is_some() { "https" } else { "http" }, s.authority, s.path),
            compression = ?s.compression,
            service = %s.service_name,
            sampler = ?s.sampler,
            "exporting spans over OTLP/HTTP"
        );
        Ok(Exporter { tx: Some(tx), sampler: s.sampler, metrics, done: Some(done), thread: Some(thread) })
    }

    /// A tracer for one stream session.
    pub fn tracer(&self) -> Option<Tracer> {
        Some(Tracer {
            tx: self.tx.clone()?,
            sampler: self.sampler,
            ids: IdGenerator::new(),
            dropped: self.metrics.dropped.clone(),
            traceparent: Arc::from(router::tracecontext::TRACEPARENT),
        })
    }

    /// Exports what is queued (at most `timeout`), then stops the thread.
    pub fn shutdown(mut self, timeout: Duration) {
        self.tx = None;
        if let Some(done) = self.done.take() {
            if done.recv_timeout(timeout).is_ok() {
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
            } else {
                tracing::warn!(
                    target: LOG_TARGET,
                    "the OTLP exporter did not finish within {timeout:?}; queued spans are dropped"
                );
            }
        }
    }
}

/// A span begun for a record handed to Kafka; [`Tracer::finish`] ends it at the
/// acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSpan {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    state: Option<Bytes>,
    flags: u8,
    start_unix_nano: u64,
    event_id: Bytes,
}

impl PendingSpan {
    /// The `traceparent` a record carries when this span is its producer span.
    pub fn traceparent(&self) -> String {
        TraceParent { trace_id: self.trace_id, parent_id: self.span_id, flags: self.flags }
            .header_with_span(self.span_id)
    }
}

/// Where Kafka put the record (from its delivery report).
#[derive(Debug, Clone, Copy)]
pub struct Placed<'a> {
    pub topic: &'a Arc<str>,
    pub partition: i32,
    pub offset: i64,
    pub commit_lsn: pgoutput::Lsn,
}

/// Samples, starts and finishes spans for one session (see the module docs).
#[derive(Debug)]
pub struct Tracer {
    tx: SyncSender<Span>,
    sampler: Sampler,
    ids: IdGenerator,
    dropped: prometheus::IntCounter,
    /// The header name, shared by every record that gets one.
    traceparent: Arc<str>,
}

impl Tracer {
    /// `traceparent`, for a record's headers.
    pub fn traceparent_header(&self) -> Arc<str> {
        Arc::clone(&self.traceparent)
    }

    /// A span for event `event_id` of a transaction committed at `commit_time_ms`, child
    /// of the row's context; `None` when the sampler says no.
    pub fn start(
        &mut self,
        parent: Option<&TraceParent>,
        state: Option<&Bytes>,
        commit_time_ms: i64,
        event_id: &Bytes,
    ) -> Option<PendingSpan> {
        let trace_id = match parent {
            Some(p) => p.trace_id,
            None => self.ids.trace_id(),
        };
        if !sampled(self.sampler, parent, &trace_id) {
            return None;
        }
        let start = u64::try_from(commit_time_ms).unwrap_or(0).saturating_mul(1_000_000);
        Some(PendingSpan {
            trace_id,
            span_id: self.ids.span_id(),
            parent: parent.map(|p| p.parent_id),
            state: parent.and(state.cloned()),
            flags: 1,
            start_unix_nano: start,
            event_id: event_id.clone(),
        })
    }

    /// Ends `span` now, at Kafka's acknowledgement, and queues it (dropped, counted, when
    /// the queue is full).
    pub fn finish(&self, span: PendingSpan, at: Placed<'_>) {
        let end = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let span = Span {
            trace_id: span.trace_id,
            span_id: span.span_id,
            parent_span_id: span.parent,
            trace_state: span.state,
            flags: span.flags,
            topic: Arc::clone(at.topic),
            // Clocks of two hosts: an acknowledgement never ends before the commit.
            start_unix_nano: span.start_unix_nano.min(end),
            end_unix_nano: end,
            partition: at.partition,
            offset: at.offset,
            message_id: span.event_id,
            commit_lsn: at.commit_lsn.0,
        };
        match self.tx.try_send(span) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => self.dropped.inc(),
        }
    }
}

fn sampled(sampler: Sampler, parent: Option<&TraceParent>, trace_id: &[u8; 16]) -> bool {
    if let (true, Some(p)) = (sampler.parent_based, parent) {
        return p.sampled();
    }
    match sampler.root {
        RootSampler::AlwaysOn => true,
        RootSampler::AlwaysOff => false,
        // The spec's TraceIdRatioBased: the trace id's low 8 bytes against the ratio, so
        // every service sampling the same trace at the same ratio agrees.
        RootSampler::Ratio(r) => {
            let low = u64::from_be_bytes(trace_id[8..16].try_into().unwrap_or([0; 8])) >> 1;
            (low as f64) < r * (1u64 << 63) as f64
        }
    }
}

/// Random trace and span ids: splitmix64 seeded from the process's hash randomness (the
/// OS's, through `RandomState`) and the clock. Not cryptographic; W3C asks for
/// uniqueness, not secrecy.
#[derive(Debug)]
struct IdGenerator {
    state: u64,
}

impl IdGenerator {
    fn new() -> IdGenerator {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
        IdGenerator { state: h.finish() }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn span_id(&mut self) -> [u8; 8] {
        loop {
            let v = self.next();
            if v != 0 {
                return v.to_be_bytes();
            }
        }
    }

    fn trace_id(&mut self) -> [u8; 16] {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.next().to_be_bytes());
        id[8..].copy_from_slice(&self.span_id());
        id
    }
}

/// The exporter thread: batches from the queue, exports each (see the module docs).
struct Worker {
    rx: mpsc::Receiver<Span>,
    client: http::Client,
    resource: Vec<(String, String)>,
    max_batch: usize,
    delay: Duration,
    metrics: SpanMetrics,
    last_warning: Option<Instant>,
}

/// Export failures are logged at most this often (each batch is counted).
const WARNING_EVERY: Duration = Duration::from_secs(60);

impl Worker {
    fn run(mut self) {
        let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => Arc::new(rt),
            Err(e) => {
                tracing::error!(
                    target: LOG_TARGET,
                    "cannot start the OTLP exporter's runtime: {e}; spans are dropped"
                );
                return;
            }
        };
        let mut batch: Vec<Span> = Vec::with_capacity(self.max_batch);
        loop {
            let closed = self.fill(&mut batch);
            if !batch.is_empty() {
                self.export(&runtime, &mut batch);
            }
            if closed {
                return;
            }
        }
    }

    /// Collects spans until the batch is full or the first one waited `delay`; `true`
    /// when the queue is closed (and drained).
    fn fill(&mut self, batch: &mut Vec<Span>) -> bool {
        let first = match self.rx.recv() {
            Ok(span) => span,
            Err(_) => return true,
        };
        batch.push(first);
        let deadline = Instant::now() + self.delay;
        while batch.len() < self.max_batch {
            match self.rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(span) => batch.push(span),
                Err(RecvTimeoutError::Timeout) => return false,
                Err(RecvTimeoutError::Disconnected) => return true,
            }
        }
        false
    }

    fn export(&mut self, runtime: &tokio::runtime::Runtime, batch: &mut Vec<Span>) {
        let n = batch.len() as u64;
        let body = proto::export_request(&self.resource, ("walpost", env!("CARGO_PKG_VERSION")), batch);
        batch.clear();
        match runtime.block_on(self.client.export(body)) {
            Ok(()) => self.metrics.exported.inc_by(n),
            Err(e) => {
                self.metrics.dropped.inc_by(n);
                if self.last_warning.is_none_or(|t| t.elapsed() >= WARNING_EVERY) {
                    self.last_warning = Some(Instant::now());
                    tracing::warn!(
                        target: LOG_TARGET,
                        spans = n,
                        "{e}; those spans are dropped (walpost_spans_dropped_total)"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent(flags: u8) -> TraceParent {
        TraceParent { trace_id: [7; 16], parent_id: [9; 8], flags }
    }

    #[test]
    fn sampler_decisions() {
        let on = Sampler { root: RootSampler::AlwaysOn, parent_based: true };
        let off = Sampler { root: RootSampler::AlwaysOff, parent_based: true };
        let id = [7; 16];
        assert!(sampled(on, None, &id) && sampled(on, Some(&parent(1)), &id));
        assert!(!sampled(on, Some(&parent(0)), &id), "an unsampled row stays unsampled");
        assert!(!sampled(off, None, &id) && sampled(off, Some(&parent(1)), &id));
        let always = Sampler { root: RootSampler::AlwaysOn, parent_based: false };
        assert!(sampled(always, Some(&parent(0)), &id), "not parent-based: the root sampler decides");
        let half = Sampler { root: RootSampler::Ratio(0.5), parent_based: false };
        let mut ids = IdGenerator::new();
        let hits = (0..10_000).filter(|_| sampled(half, None, &ids.trace_id())).count();
        assert!((4_500..5_500).contains(&hits), "{hits}");
        let none = Sampler { root: RootSampler::Ratio(0.0), parent_based: false };
        assert!(!sampled(none, None, &[0xff; 16]));
    }

    #[test]
    fn child_span_keeps_the_trace_and_names_the_row_as_parent() {
        let (tx, rx) = mpsc::sync_channel(1);
        let mut t = Tracer {
            tx,
            sampler: Sampler { root: RootSampler::AlwaysOn, parent_based: true },
            ids: IdGenerator::new(),
            dropped: prometheus::IntCounter::new("d", "d").unwrap(),
            traceparent: Arc::from("traceparent"),
        };
        let p = parent(1);
        let state = Bytes::from_static(b"rojo=1");
        let id = Bytes::from_static(b"42");
        let span = t.start(Some(&p), Some(&state), 1_000, &id).unwrap();
        assert_eq!((span.trace_id, span.parent, span.start_unix_nano), (p.trace_id, Some(p.parent_id), 1_000_000_000));
        assert_ne!(span.span_id, p.parent_id);
        let header = span.traceparent();
        assert_eq!(
            TraceParent::parse(header.as_bytes()).map(|h| (h.trace_id, h.parent_id)),
            Some((p.trace_id, span.span_id))
        );
        let topic: Arc<str> = Arc::from("t");
        let at = Placed { topic: &topic, partition: 2, offset: 41, commit_lsn: pgoutput::Lsn(0x16B3748) };
        t.finish(span.clone(), at);
        let done = rx.try_recv().unwrap();
        assert_eq!((&*done.topic, done.partition, done.offset), ("t", 2, 41));
        assert_eq!(done.trace_state.as_deref(), Some(&b"rojo=1"[..]));
        assert_eq!((done.message_id.as_ref(), done.commit_lsn), (&b"42"[..], 0x16B3748));
        assert_eq!(done.parent_span_id, Some(p.parent_id));
        // The queue holds one span: the next is dropped and counted, never waited for.
        t.finish(span.clone(), at);
        t.finish(span, at);
        assert_eq!(t.dropped.get(), 1);
        assert!(t.start(Some(&parent(0)), None, 0, &id).is_none(), "unsampled row: no span");
        let root = t.start(None, Some(&state), 0, &id).unwrap();
        assert_eq!((root.parent, root.state), (None, None), "a root span has no parent and no tracestate");
    }
}

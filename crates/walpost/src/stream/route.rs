//! Routing in the stream: which relations are outbox tables, one router per outbox
//! table (and one for the table-less outbox), and what to do with changes that are not
//! outbox events (`table.op.invalid.behavior`).
//!
//! Invariants: only INSERTs into a configured outbox table and messages with a
//! configured prefix become records; a row that cannot be routed comes back as
//! [`Routed::Unroutable`] for the permanent-error policy, never as a silent skip; an
//! UPDATE/DELETE/TRUNCATE of an outbox table is skipped only under `warn`/`error`
//! (counted in `walpost_events_skipped_total`) and halts under `fatal`.
//! - A row's invalid trace context never stops it: the router leaves it out of the
//!   headers, and it is counted (`walpost_trace_context_invalid_total`) and logged with
//!   the event id only, at most once per [`TRACE_WARNING_EVERY`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pgoutput::{Lsn, Relation, TupleData};
use router::{Record, ResolvedRelation, RouteError, Router, SalvageColumns};

use super::signal::SignalRow;
use crate::error::{ErrorKind, PipelineError};
use crate::kafka::Original;
use crate::settings::{OpInvalid, SourceSettings, TableName};
use crate::telemetry::metrics::StreamMetrics;

/// Invalid trace contexts are logged at most this often (each is counted).
pub(crate) const TRACE_WARNING_EVERY: Duration = Duration::from_secs(60);

/// What a change became.
#[derive(Debug)]
pub(crate) enum Routed {
    Record(Record),
    /// A row or message that cannot be routed: the error and what could be read of it
    /// (for a contract breach, the whole record it would have been, and its topic).
    Unroutable {
        error: RouteError,
        salvage: Box<Original>,
        event_id: Bytes,
        /// The topic it was meant for; empty when routing did not get that far.
        original_topic: String,
    },
    /// A row of the signal table.
    Signal(SignalRow),
    /// Not an outbox event (another table, another message prefix, a skipped operation).
    NotAnEvent,
}

/// What the stream knows about a relation from its last Relation message.
#[derive(Debug)]
enum RelationEntry {
    /// Outbox number `.0` of the settings' outboxes.
    Outbox(usize, ResolvedRelation),
    /// An outbox table whose columns no longer match the configuration, and where its
    /// rows' event id, key and payload still are (for their dead letters).
    Unroutable(usize, RouteError, SalvageColumns),
    /// The signal table: the positions of its `id`, `type` and `data` columns.
    Signal { id: usize, kind: usize, data: usize },
    /// Another table in the publication: its inserts are not outbox events.
    Other,
}

struct OutboxRoute {
    table: TableName,
    op_invalid: OpInvalid,
    router: Router,
}

struct MessageRoute {
    prefixes: Vec<String>,
    allow_non_transactional: bool,
    op_invalid: OpInvalid,
    router: Router,
}

/// See the module docs.
pub(crate) struct Routing {
    outboxes: Vec<OutboxRoute>,
    signal_table: Option<TableName>,
    messages: Option<MessageRoute>,
    relations: HashMap<u32, RelationEntry>,
    metrics: StreamMetrics,
    trace_warnings: TraceWarnings,
}

/// When an invalid trace context was last logged, and how many came since.
#[derive(Debug, Default)]
struct TraceWarnings {
    last: Option<Instant>,
    unlogged: u64,
}

impl TraceWarnings {
    /// Counts a row whose trace context was dropped; logs it (event id only, never the
    /// value) at most once per [`TRACE_WARNING_EVERY`].
    fn note(&mut self, metrics: &StreamMetrics, record: &Record, table: &TableName) {
        metrics.trace_context_invalid.inc();
        self.unlogged += 1;
        if self.last.is_none_or(|t| t.elapsed() >= TRACE_WARNING_EVERY) {
            tracing::warn!(
                event_id = %String::from_utf8_lossy(&record.event_id),
                rows = self.unlogged,
                "outbox table {table}: an invalid traceparent or tracestate was left out of the record's headers (the event is published without it); rows counts those since the last such line"
            );
            self.last = Some(Instant::now());
            self.unlogged = 0;
        }
    }
}

impl std::fmt::Debug for Routing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routing")
            .field("outboxes", &self.outboxes.len())
            .field("relations", &self.relations.len())
            .finish()
    }
}

impl Routing {
    pub(crate) fn new(source: &SourceSettings, metrics: StreamMetrics) -> Result<Routing, PipelineError> {
        let outboxes = source
            .outboxes
            .iter()
            .map(|o| {
                Ok(OutboxRoute {
                    table: o.table.clone(),
                    op_invalid: o.op_invalid,
                    router: Router::new(o.router.clone()).map_err(|e| PipelineError::definite(ErrorKind::Config, e))?,
                })
            })
            .collect::<Result<_, PipelineError>>()?;
        let messages = match &source.messages {
            Some(m) => Some(MessageRoute {
                prefixes: m.prefixes.clone(),
                allow_non_transactional: m.allow_non_transactional,
                op_invalid: m.op_invalid,
                router: Router::new(m.router.clone()).map_err(|e| PipelineError::definite(ErrorKind::Config, e))?,
            }),
            None => None,
        };
        Ok(Routing {
            outboxes,
            signal_table: source.signal_table.clone(),
            messages,
            relations: HashMap::new(),
            metrics,
            trace_warnings: TraceWarnings::default(),
        })
    }

    /// A Relation message: (re)learns the relation's columns.
    pub(crate) fn relation(&mut self, r: &Relation) {
        let outbox = self.outboxes.iter().position(|o| {
            r.namespace.as_ref() == o.table.schema.as_bytes() && r.name.as_ref() == o.table.name.as_bytes()
        });
        let is_signal = self
            .signal_table
            .as_ref()
            .is_some_and(|t| r.namespace.as_ref() == t.schema.as_bytes() && r.name.as_ref() == t.name.as_bytes());
        let column = |name: &str| r.columns.iter().position(|c| c.name.as_ref() == name.as_bytes());
        let entry = match outbox.and_then(|i| Some((i, self.outboxes.get(i)?))) {
            None if is_signal => match (column("id"), column("type"), column("data")) {
                (Some(id), Some(kind), Some(data)) => RelationEntry::Signal { id, kind, data },
                _ => {
                    tracing::warn!("the signal table lost a column (id, type, data): its rows are ignored");
                    RelationEntry::Other
                }
            },
            None => RelationEntry::Other,
            Some((i, o)) => match o.router.resolve(r) {
                Ok(resolved) => RelationEntry::Outbox(i, resolved),
                Err(e) => {
                    tracing::warn!("outbox table changed: {e}");
                    RelationEntry::Unroutable(i, e, o.router.salvage_columns(r))
                }
            },
        };
        self.relations.insert(r.oid, entry);
    }

    /// An INSERT.
    pub(crate) fn insert(&mut self, relation_oid: u32, tuple: &TupleData) -> Result<Routed, PipelineError> {
        match self.relations.get(&relation_oid) {
            Some(RelationEntry::Outbox(i, rel)) => {
                let o = self
                    .outboxes
                    .get_mut(*i)
                    .ok_or_else(|| PipelineError::definite(ErrorKind::Internal, "outbox index"))?;
                let routed = o.router.route(rel, tuple);
                if let Ok(record) = &routed {
                    if record.trace.invalid {
                        self.trace_warnings.note(&self.metrics, record, &o.table);
                    }
                }
                Ok(match routed {
                    Ok(record) => Routed::Record(record),
                    Err(error) => {
                        crate::error::contract_unavailable(&error)?;
                        match crate::error::breached_record(&error, || o.router.route_unchecked(rel, tuple)) {
                            Some(record) => breach(error, &record),
                            None => {
                                let (id, key, value) = o.router.salvage(rel, tuple);
                                unroutable(error, id, key, value)
                            }
                        }
                    }
                })
            }
            Some(RelationEntry::Unroutable(i, e, columns)) => {
                let o = self
                    .outboxes
                    .get(*i)
                    .ok_or_else(|| PipelineError::definite(ErrorKind::Internal, "outbox index"))?;
                let (id, key, value) = o.router.salvage_unresolved(columns, tuple);
                Ok(unroutable(e.clone(), id, key, value))
            }
            Some(RelationEntry::Signal { id, kind, data }) => {
                let text = |i: usize| match tuple.get(i) {
                    Some(pgoutput::ColumnValue::Text(b)) => Some(String::from_utf8_lossy(&b).into_owned()),
                    _ => None,
                };
                Ok(Routed::Signal(SignalRow {
                    id: text(*id).unwrap_or_default(),
                    kind: text(*kind).unwrap_or_default(),
                    data: text(*data),
                }))
            }
            Some(RelationEntry::Other) => Ok(Routed::NotAnEvent),
            None => Err(PipelineError::definite(
                ErrorKind::Protocol,
                format!("pgoutput protocol: Insert for relation {relation_oid} before its Relation message"),
            )),
        }
    }

    /// A WAL message over `[pipeline] max_message_bytes` (`size` bytes, `limit`), of
    /// which only `data` (its first bytes) was kept: an outbox row becomes a permanent
    /// error of its event, with the event id and key when they are among the row's
    /// first columns; a message with an outbox prefix too.
    pub(crate) fn oversized(&mut self, data: &Bytes, size: usize, limit: usize) -> Result<Routed, PipelineError> {
        let too_large = |table: String, id: &Option<Bytes>| RouteError::TooLarge {
            table,
            event_id: id.as_ref().map(|i| String::from_utf8_lossy(i).into()),
            size,
            limit,
        };
        match data.first() {
            Some(b'I') => {
                let Some((oid, partial)) = pgoutput::insert_prefix(data) else {
                    return Err(PipelineError::definite(ErrorKind::Protocol, format!(
                        "pgoutput protocol: an Insert of {size} bytes whose first bytes are not an Insert"
                    )));
                };
                let (table, id, key) = match self.relations.get(&oid) {
                    Some(RelationEntry::Outbox(i, rel)) => {
                        let o = self.outboxes.get(*i).ok_or_else(|| PipelineError::definite(ErrorKind::Internal, "outbox index"))?;
                        let (id, key, _) = o.router.salvage(rel, &partial);
                        (o.table.to_string(), id, key)
                    }
                    Some(RelationEntry::Unroutable(i, _, columns)) => {
                        let o = self.outboxes.get(*i).ok_or_else(|| PipelineError::definite(ErrorKind::Internal, "outbox index"))?;
                        let (id, key, _) = o.router.salvage_unresolved(columns, &partial);
                        (o.table.to_string(), id, key)
                    }
                    Some(RelationEntry::Signal { .. }) => {
                        tracing::warn!(size, limit, "a signal row over [pipeline] max_message_bytes was dropped unread");
                        return Ok(Routed::NotAnEvent);
                    }
                    Some(RelationEntry::Other) => return Ok(Routed::NotAnEvent),
                    None => {
                        return Err(PipelineError::definite(ErrorKind::Protocol, format!(
                            "pgoutput protocol: Insert for relation {oid} before its Relation message"
                        )))
                    }
                };
                Ok(unroutable(too_large(table, &id), id, key, None))
            }
            Some(b'M') => {
                // Flags, LSN, then the prefix (a C string).
                let prefix = data.get(10..).and_then(|p| p.split(|b| *b == 0).next()).unwrap_or_default();
                let prefix = String::from_utf8_lossy(prefix);
                match &self.messages {
                    Some(m) if m.prefixes.iter().any(|p| *p == prefix) => {
                        Ok(unroutable(too_large(format!("message prefix {prefix}"), &None), None, None, None))
                    }
                    _ => Ok(Routed::NotAnEvent),
                }
            }
            other => Err(PipelineError::definite(ErrorKind::Routing, format!(
                "a replication message of {size} bytes (pgoutput tag {}) is over [pipeline] max_message_bytes ({limit}); only row inserts and messages can be that large: raise the limit",
                other.map_or_else(|| "none".to_owned(), |t| char::from(*t).escape_default().to_string())
            ))),
        }
    }

    /// UPDATE/DELETE/TRUNCATE: only an outbox table's count as invalid operations.
    pub(crate) fn other_operation(&self, op: &str, relation_oids: &[u32]) -> Result<(), PipelineError> {
        for oid in relation_oids {
            if let Some(RelationEntry::Outbox(i, _) | RelationEntry::Unroutable(i, _, _)) = self.relations.get(oid) {
                let o = self
                    .outboxes
                    .get(*i)
                    .ok_or_else(|| PipelineError::definite(ErrorKind::Internal, "outbox index"))?;
                self.invalid_operation(o.op_invalid, &format!("{op} on outbox table {}", o.table))?;
            }
        }
        Ok(())
    }

    /// Whether a message's prefix is an outbox prefix, and if so whether a
    /// non-transactional one may be published (`Err` decides by the policy).
    /// `commit_time_ms`: the CloudEvents time.
    pub(crate) fn message(
        &mut self,
        m: &pgoutput::Message,
        commit_time_ms: Option<i64>,
    ) -> Result<Routed, PipelineError> {
        let Some(config) = self.messages.as_mut() else {
            return Ok(Routed::NotAnEvent);
        };
        let prefix = String::from_utf8_lossy(&m.prefix);
        if !config.prefixes.iter().any(|p| *p == prefix) {
            return Ok(Routed::NotAnEvent);
        }
        if !m.transactional && !config.allow_non_transactional {
            let what = format!(
                "non-transactional message with prefix {prefix} at {} (allow_non_transactional is false)",
                m.lsn
            );
            let behavior = config.op_invalid;
            self.invalid_operation(behavior, &what)?;
            return Ok(Routed::NotAnEvent);
        }
        let source = format!("message prefix {prefix}");
        Ok(match config.router.route_json(&m.content, &source, commit_time_ms) {
            Ok(record) => Routed::Record(record),
            Err(error) => {
                crate::error::contract_unavailable(&error)?;
                match crate::error::breached_record(&error, || {
                    config.router.route_json_unchecked(&m.content, &source, commit_time_ms)
                }) {
                    Some(record) => breach(error, &record),
                    None => unroutable(error, None, None, Some(m.content.clone())),
                }
            }
        })
    }

    /// `table.op.invalid.behavior` decides.
    fn invalid_operation(&self, behavior: OpInvalid, what: &str) -> Result<(), PipelineError> {
        self.metrics.skipped(match behavior {
            OpInvalid::Fatal => "fatal",
            _ => "invalid_operation",
        });
        match behavior {
            OpInvalid::Warn => {
                tracing::warn!("{what}: not an outbox event, skipped (table.op.invalid.behavior = warn)");
                Ok(())
            }
            OpInvalid::Error => {
                tracing::error!("{what}: not an outbox event, skipped (table.op.invalid.behavior = error)");
                Ok(())
            }
            OpInvalid::Fatal => Err(PipelineError::definite(ErrorKind::Routing, format!(
                "{what}, and table.op.invalid.behavior = fatal: only INSERTs into the outbox are events; publish inserts only (ALTER PUBLICATION ... SET (publish = 'insert')) or relax the setting"
            ))),
        }
    }
}

fn unroutable(error: RouteError, id: Option<Bytes>, key: Option<Bytes>, value: Option<Bytes>) -> Routed {
    let event_id = id.or_else(|| error.event_id().map(|e| Bytes::copy_from_slice(e.as_bytes()))).unwrap_or_default();
    let salvage = Original { key: key.map(|k| k.to_vec()), value: value.map(|v| v.to_vec()), headers: Vec::new() };
    Routed::Unroutable { error, salvage: Box::new(salvage), event_id, original_topic: String::new() }
}

fn breach(error: RouteError, record: &Record) -> Routed {
    Routed::Unroutable {
        error,
        salvage: Box::new(Original::of(record)),
        event_id: record.event_id.clone(),
        original_topic: record.topic.to_string(),
    }
}

/// The halt error for a row that cannot be routed (`on_permanent_error = "halt"`).
pub(crate) fn unroutable_halt(error: &RouteError, final_lsn: Lsn, confirmed: Lsn) -> PipelineError {
    PipelineError::definite(ErrorKind::Routing, format!(
        "cannot route a row of the transaction committing at {final_lsn}: {error}; nothing past {confirmed} was confirmed (set on_permanent_error = \"dead_letter\" to divert such rows instead of halting)"
    ))
}

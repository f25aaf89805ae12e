//! The router: finds the mapped columns of a relation and turns one inserted row (or
//! one JSON message) into a [`Record`].
//!
//! Why one file over 600 lines: the `Router` resolves a relation's columns, routes a row
//! and routes a table-less JSON message through the same caches and the same
//! column-to-header rules; kept together, one reads that a live row, a snapshot row and
//! a replayed row go through the same code. Reading a row's cells is [`row`]'s.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use pgoutput::{ColumnValue, Relation, TupleData};
use regex::Regex;

use crate::cloudevents::{self, Attributes, Data, Envelope};
use crate::config::{RouterConfig, DEFAULT_TOPIC_REGEX, EVENT_TYPE_HEADER_OPTION, TRACING_OPTION};
use crate::contract::{Checked, ContractError, Event};
use crate::error::{display_text, RouteError};
use crate::options::{Placement, ADDITIONAL_PLACEMENT};
use crate::topic::{TopicGuard, TopicPattern, TopicRejection};
use crate::tracecontext::{self, TraceOutcome, TraceParent, TRACEPARENT, TRACESTATE};
use crate::value::{self, parse_timestamp, Kind};

/// Header carrying the event id (Debezium: `id`).
pub const HEADER_ID: &str = "id";
/// Header carrying the event type (a walpost extension).
pub const HEADER_EVENT_TYPE: &str = "eventType";

/// A column's position and what Debezium would make of its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Col {
    index: usize,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ResolvedExtra {
    col: Col,
    column: String,
    placement: Placement,
    name: Arc<str>,
}

/// A relation's column positions for the mapped fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedRelation {
    pub table: String,
    columns: usize,
    id: Col,
    key: Col,
    route: Col,
    payload: Col,
    event_type: Option<Col>,
    timestamp: Option<Col>,
    headers: Option<Col>,
    tracing: Option<Col>,
    extra: Vec<ResolvedExtra>,
    /// `used[i]`: column `i` is one of the above. Only those are taken out of a row,
    /// and the row is read only as far as the last of them (`used` ends there).
    used: Vec<bool>,
}

impl ResolvedRelation {
    fn mark_used(mut self) -> ResolvedRelation {
        let cols = [self.id, self.key, self.route, self.payload]
            .into_iter()
            .chain([self.event_type, self.timestamp, self.headers, self.tracing].into_iter().flatten())
            .chain(self.extra.iter().map(|e| e.col));
        let mut used = vec![false; self.columns];
        for col in cols {
            if let Some(u) = used.get_mut(col.index) {
                *u = true;
            }
        }
        // Columns after the last mapped one are not even walked.
        used.truncate(used.iter().rposition(|&u| u).map_or(0, |last| last + 1));
        self.used = used;
        self
    }
}

/// One Kafka record, ready to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: Arc<str>,
    pub key: Bytes,
    /// `None` is a tombstone.
    pub value: Option<Bytes>,
    pub headers: Vec<(Arc<str>, Bytes)>,
    /// Event id as in the `id` header (for error messages and dead letters).
    pub event_id: Bytes,
    /// From `table.field.event.timestamp` (ms since the Unix epoch); `None`: commit time.
    pub timestamp_ms: Option<i64>,
    /// From a `:partition` placement.
    pub partition: Option<i32>,
    /// The row's W3C trace context (its headers are among `headers`), and whether an
    /// invalid one was dropped.
    pub trace: TraceOutcome,
}

/// Maps outbox rows to records; holds a small cache of topic names.
#[derive(Debug)]
pub struct Router {
    config: RouterConfig,
    regex: Regex,
    pattern: TopicPattern,
    guard: TopicGuard,
    /// Decided by the configuration alone: any `:envelope` placement.
    envelope: bool,
    /// Route value -> topic. foldhash (seeded per process) instead of SipHash: this
    /// lookup runs for every row, and the keys are bounded by the topic guard.
    topics: HashMap<Bytes, Arc<str>, foldhash::fast::RandomState>,
    /// Every topic routed to so far (at most `topics.max`; never cleared).
    opened: HashSet<Arc<str>, foldhash::fast::RandomState>,
    /// The row being routed, column by column (reused; empty between rows).
    cells: Vec<ColumnValue>,
    header_id: Arc<str>,
    header_type: Arc<str>,
    header_traceparent: Arc<str>,
    header_tracestate: Arc<str>,
    /// `envelope = "cloudevents"`.
    cloudevents: Option<Envelope>,
}

/// Topic names are cached per route value; past this many distinct values the cache is
/// cleared instead of growing without bound.
const TOPIC_CACHE_LIMIT: usize = 4096;

const TIMESTAMP_KEY: &str = "table.field.event.timestamp";

impl Router {
    /// Builds a router; fails on an invalid `route.topic.regex`, `route.topic.replacement`,
    /// `topics.allow` or envelope field names.
    pub fn new(config: RouterConfig) -> Result<Router, RouteError> {
        let regex_text = config.topic_regex.as_deref().unwrap_or(DEFAULT_TOPIC_REGEX);
        // Debezium's RegexRouter matches the whole value (Java's `matches`).
        let regex =
            Regex::new(&format!("^(?:{regex_text})$")).map_err(|_| RouteError::BadRegex(regex_text.to_owned()))?;
        if config.topic_pattern.is_empty() {
            return Err(RouteError::InvalidOption {
                key: "route.topic.replacement",
                reason: "it is empty; write a topic pattern such as outbox.event.${routedByValue}".into(),
            });
        }
        let pattern = TopicPattern::parse(&config.topic_pattern, &regex)
            .map_err(|reason| RouteError::InvalidOption { key: "route.topic.replacement", reason })?;
        let guard = TopicGuard::from_config(&config)?;
        let mut envelope_names = HashSet::from(["payload"]);
        for a in &config.additional {
            if let Placement::Envelope(alias) = &a.placement {
                if !envelope_names.insert(alias.as_str()) {
                    return Err(RouteError::InvalidOption {
                        key: ADDITIONAL_PLACEMENT,
                        reason: format!(
                            "the envelope would have two fields named '{alias}' (its payload field is named payload)"
                        ),
                    });
                }
            }
        }
        let envelope = envelope_names.len() > 1;
        let cloudevents = match &config.cloudevents {
            None => None,
            Some(ce) => {
                let invalid = |key, reason: String| Err(RouteError::InvalidOption { key, reason });
                if ce.source.trim().is_empty() {
                    return invalid("cloudevents.source", "it is empty; CloudEvents require a source (a URI-reference such as /walpost/shop/events.outbox)".into());
                }
                if config.event_type_header_field.is_none() {
                    return invalid(
                        EVENT_TYPE_HEADER_OPTION,
                        "it is empty, but envelope = \"cloudevents\" needs an event type column for the required type attribute".into(),
                    );
                }
                for a in &config.additional {
                    if let Placement::Header(alias) = &a.placement {
                        if cloudevents::reserved_header(alias) {
                            return invalid(
                                ADDITIONAL_PLACEMENT,
                                format!("the header '{alias}' would collide with the CloudEvents headers (ce_* and content-type) that envelope = \"cloudevents\" writes; choose another alias"),
                            );
                        }
                    }
                }
                Some(Envelope::new(ce))
            }
        };
        Ok(Router {
            config,
            regex,
            pattern,
            guard,
            envelope,
            topics: HashMap::default(),
            opened: HashSet::default(),
            cells: Vec::new(),
            header_id: Arc::from(HEADER_ID),
            header_type: Arc::from(HEADER_EVENT_TYPE),
            header_traceparent: Arc::from(TRACEPARENT),
            header_tracestate: Arc::from(TRACESTATE),
            cloudevents,
        })
    }

    pub fn config(&self) -> &RouterConfig {
        &self.config
    }

    /// The topic guard every record passes; also for topics the caller names itself.
    pub fn topic_guard(&self) -> &TopicGuard {
        &self.guard
    }

    /// Finds the mapped columns in a Relation message.
    pub fn resolve(&self, relation: &Relation) -> Result<ResolvedRelation, RouteError> {
        let table =
            format!("{}.{}", String::from_utf8_lossy(&relation.namespace), String::from_utf8_lossy(&relation.name));
        let position = |column: &str| find_column(relation, column);
        let find = |column: &str, config_key: &'static str| {
            position(column).ok_or_else(|| RouteError::MissingColumn {
                table: table.clone(),
                column: column.to_owned(),
                config_key,
            })
        };
        let optional = |column: &Option<String>, config_key: &'static str| match column {
            Some(col) => find(col, config_key).map(Some),
            None => Ok(None),
        };
        let c = &self.config;
        let mut extra = Vec::with_capacity(c.additional.len());
        for a in &c.additional {
            let Some(col) = position(&a.column) else {
                if c.additional_missing_ignore {
                    continue;
                }
                return Err(RouteError::MissingColumn {
                    table: table.clone(),
                    column: a.column.clone(),
                    config_key: ADDITIONAL_PLACEMENT,
                });
            };
            let name: Arc<str> = match &a.placement {
                Placement::Header(alias) | Placement::Envelope(alias) => Arc::from(alias.as_str()),
                Placement::Partition => Arc::from(a.column.as_str()),
            };
            extra.push(ResolvedExtra { col, column: a.column.clone(), placement: a.placement.clone(), name });
        }
        Ok(ResolvedRelation {
            id: find(&c.id_field, "table.field.event.id")?,
            key: find(&c.key_field, "table.field.event.key")?,
            route: find(&c.route_by_field, "route.by.field")?,
            payload: find(&c.payload_field, "table.field.event.payload")?,
            event_type: optional(&c.event_type_header_field, EVENT_TYPE_HEADER_OPTION)?,
            timestamp: optional(&c.timestamp_field, TIMESTAMP_KEY)?,
            headers: optional(&c.headers_field, "table.field.event.headers")?,
            tracing: optional(&c.tracing_field, TRACING_OPTION)?,
            extra,
            columns: relation.columns.len(),
            used: Vec::new(),
            table,
        }
        .mark_used())
    }

    /// Turns one inserted row into a record. Everything in the record comes from the row
    /// and the configuration, nothing from when or how it was read: a row streamed live,
    /// snapshotted or replayed becomes the same record (the CloudEvents `time` included,
    /// which is the timestamp column's or none).
    pub fn route(&mut self, rel: &ResolvedRelation, row: &TupleData) -> Result<Record, RouteError> {
        if row.len() != rel.columns {
            return Err(RouteError::ColumnCountMismatch {
                table: rel.table.clone(),
                got: row.len(),
                expected: rel.columns,
            });
        }
        // One pass over the row, up to its last mapped column: a column's bytes are then
        // cheap `Bytes` clones. Only the mapped columns become `Bytes` (each costs a
        // reference count up and down); the others stay placeholders. The vector is
        // reused from row to row, and emptied after each (so it does not keep the WAL
        // buffer its values point into).
        let mut cells = std::mem::take(&mut self.cells);
        cells.extend(row.spans().zip(&rel.used).map(|(span, &used)| match used {
            // A span of this row always lies within it (`value` is `None` only for
            // another row's span).
            true => row.value(span).unwrap_or(ColumnValue::Null),
            false => ColumnValue::Null,
        }));
        let routed = self.route_cells(rel, &cells);
        cells.clear();
        self.cells = cells;
        routed
    }

    fn route_cells(&mut self, rel: &ResolvedRelation, cells: &[ColumnValue]) -> Result<Record, RouteError> {
        let c = &self.config;
        let mut rr = RowReader { cells, table: &rel.table, log_values: c.log_values, event_id: None };
        // The event id first: every later error names it.
        let event_id = rr.required(rel.id, &c.id_field, "table.field.event.id", Form::Header)?;
        rr.event_id = Some(event_id.clone());
        let key = rr.required(rel.key, &c.key_field, "table.field.event.key", Form::Plain)?;
        let route_value = rr.required(rel.route, &c.route_by_field, "route.by.field", Form::Plain)?;
        let payload = rr.cell(rel.payload, &c.payload_field)?;
        let tombstone = match payload {
            None => true,
            Some(Cell::Text(text)) => value::is_empty_payload(rel.payload.kind, text),
            Some(Cell::Binary(_)) => false,
        };
        if tombstone && !c.tombstone_on_empty_payload {
            return Err(RouteError::EmptyPayload {
                table: rel.table.clone(),
                column: c.payload_field.clone(),
                event_id: rr.shown_id(),
            });
        }
        let mut headers = Vec::with_capacity(if self.cloudevents.is_some() { 10 } else { 2 } + rel.extra.len());
        headers.push((self.header_id.clone(), event_id.clone()));
        let mut event_type = None;
        if let (Some(col), Some(column)) = (rel.event_type, &c.event_type_header_field) {
            if let Some(t) = rr.render(col, column, EVENT_TYPE_HEADER_OPTION, Form::Header)? {
                headers.push((self.header_type.clone(), t.clone()));
                event_type = Some(t);
            }
        }
        let time = match (rel.timestamp, &c.timestamp_field) {
            (Some(col), Some(column)) => rr.timestamp(col, column)?,
            _ => None,
        };
        let timestamp_ms = time.map(|t| t.as_millisecond());
        if let (Some(col), Some(column)) = (rel.headers, &c.headers_field) {
            match rr.cell(col, column)? {
                None => {}
                Some(Cell::Text(json) | Cell::Binary(json)) => {
                    let reserved =
                        if self.cloudevents.is_some() { cloudevents::reserved_header } else { |_: &str| false };
                    expand_json_headers(json, &mut headers, reserved)
                        .map_err(|expected| rr.bad_value(column, "table.field.event.headers", json, expected))?;
                }
            }
        }
        let mut partition = None;
        let mut envelope_fields: Vec<(&ResolvedExtra, Option<Cell<'_>>)> = Vec::new();
        for e in &rel.extra {
            match &e.placement {
                Placement::Header(_) => {
                    if let Some(v) = rr.render(e.col, &e.column, ADDITIONAL_PLACEMENT, Form::Header)? {
                        headers.push((e.name.clone(), v));
                    }
                }
                Placement::Envelope(_) => envelope_fields.push((e, rr.cell(e.col, &e.column)?)),
                Placement::Partition => {
                    if let Some(p) = rr.partition(e.col, &e.column)? {
                        partition = Some(p);
                    }
                }
            }
        }
        let tracing_column = match (rel.tracing, &c.tracing_field) {
            (Some(col), Some(column)) => match rr.cell(col, column)? {
                Some(Cell::Text(text) | Cell::Binary(text)) => Some(text),
                None => None,
            },
            _ => None,
        };
        let trace = self.trace_context(tracing_column.map(|t| t.as_ref()), &mut headers);
        // The payload's bytes as a record without an envelope carries them (a text column's
        // are a slice of the row, bytea's decoded): rendered once, for the value and the
        // contract both, and not at all for an envelope without a contract.
        let plain = match payload {
            Some(cell) if !tombstone && (c.contract.is_some() || !self.envelope) => {
                Some(rr.render_cell(cell, rel.payload, &c.payload_field, "table.field.event.payload", Form::Plain)?)
            }
            _ => None,
        };
        // The topic before the contract: a registry's subject may be named after it.
        let topic = self.topic_for(route_value, &rel.table, Some(&event_id))?;
        let c = &self.config;
        let encoded = match (&c.contract, &plain) {
            (Some(contract), Some(bytes)) => {
                let event = Event { event_type: event_type.as_deref(), topic: &topic };
                check_contract(contract, &rel.table, &event_id, event, bytes, c.log_values)?
            }
            _ => None,
        };
        let mut value = match payload {
            Some(cell) if !tombstone && self.envelope => {
                Some(rr.envelope(rel.payload, &c.payload_field, cell, &envelope_fields)?)
            }
            // An encoded value (a registry's framing) only where it replaces the plain
            // payload: the settings refuse it beside an envelope or CloudEvents.
            _ => encoded.or(plain),
        };
        if let Some(envelope) = &self.cloudevents {
            let event_type = event_type.ok_or_else(|| RouteError::NullField {
                table: rel.table.clone(),
                column: c.event_type_header_field.clone().unwrap_or_default(),
                config_key: EVENT_TYPE_HEADER_OPTION,
                event_id: rr.shown_id(),
            })?;
            let subject = rr.required(rel.key, &c.key_field, "table.field.event.key", Form::Header)?;
            // Not the commit time when the row has none: a snapshot or replayed copy of the
            // event could not carry it, and every copy must look the same.
            let attributes = Attributes { id: &event_id, event_type: &event_type, time, subject: &subject };
            let data = value.as_ref().map(|v| {
                let json = self.envelope || matches!(payload, Some(Cell::Text(_)) if rel.payload.kind == Kind::Json);
                let bytea = matches!(payload, Some(Cell::Binary(_))) || rel.payload.kind == Kind::Bytea;
                match () {
                    _ if json => Data::Json(v),
                    _ if bytea => Data::Binary(v),
                    _ => Data::classify(v),
                }
            });
            match (data, envelope.mode) {
                (None, _) => envelope.headers(&attributes, None, &mut headers),
                (Some(data), cloudevents::CloudEventsMode::Binary) => envelope.binary(&attributes, data, &mut headers),
                (Some(data), cloudevents::CloudEventsMode::Structured) => {
                    let document = envelope.structured(&attributes, data, &mut headers);
                    value = Some(document);
                }
            }
        }
        let key = self.contract_key(&rel.table, &event_id, &topic, key)?;
        Ok(Record { topic, key, value, headers, event_id, timestamp_ms, partition, trace })
    }

    /// The key a record carries: the row's, or the contract's encoding of it (a schema
    /// registry's key subject), for every record, tombstones included.
    fn contract_key(&self, table: &str, event_id: &[u8], topic: &str, key: Bytes) -> Result<Bytes, RouteError> {
        let Some(contract) = &self.config.contract else { return Ok(key) };
        match contract.0.key(topic, &key) {
            Ok(None) => Ok(key),
            Ok(Some(encoded)) => Ok(encoded),
            Err(ContractError::Breach(breach)) => Err(RouteError::ContractBroken {
                table: table.to_owned(),
                event_id: Some(display_text(event_id)),
                event_type: None,
                breach: Box::new(breach),
            }),
            Err(ContractError::Unavailable(reason)) => Err(RouteError::ContractUnavailable {
                table: table.to_owned(),
                event_id: Some(display_text(event_id)),
                reason,
            }),
        }
    }

    /// Keeps at most one valid `traceparent` (the tracing column's, else the last such
    /// header) and the `tracestate` that goes with it; see [`crate::tracecontext`].
    fn trace_context(&self, column: Option<&[u8]>, headers: &mut Vec<(Arc<str>, Bytes)>) -> TraceOutcome {
        let is = |name: &str, wanted: &str| name.eq_ignore_ascii_case(wanted);
        let mut parent: Option<Bytes> = None;
        let mut state: Option<Bytes> = None;
        let mut found = false;
        headers.retain(|(name, v)| {
            if is(name, TRACEPARENT) {
                parent = Some(v.clone());
            } else if is(name, TRACESTATE) {
                state = Some(v.clone());
            } else {
                return true;
            }
            found = true;
            false
        });
        if let Some(text) = column {
            let (p, s) = tracecontext::from_properties(text);
            if p.is_some() || s.is_some() {
                found = true;
                parent = p.map(Bytes::from);
                state = s.map(Bytes::from);
            }
        }
        if !found {
            return TraceOutcome::default();
        }
        let mut out = TraceOutcome::default();
        match parent.as_deref().and_then(TraceParent::parse) {
            Some(p) => {
                out.parent = Some(p);
                headers.push((self.header_traceparent.clone(), parent.unwrap_or_default()));
            }
            None => out.invalid = true,
        }
        if let Some(s) = state {
            if out.parent.is_some() && tracecontext::valid_tracestate(&s) {
                headers.push((self.header_tracestate.clone(), s.clone()));
                out.state = Some(s);
            } else {
                out.invalid = true;
            }
        }
        out
    }

    /// The id, key and payload of a row that could not be routed, as far as they can be
    /// read (in the forms [`Router::route`] gives them): for dead-letter records.
    pub fn salvage(&self, rel: &ResolvedRelation, row: &TupleData) -> (Option<Bytes>, Option<Bytes>, Option<Bytes>) {
        salvage_row([Some(rel.id), Some(rel.key), Some(rel.payload)], row)
    }

    /// The event id, key and payload columns of a relation [`Router::resolve`] refuses
    /// (another mapped column is missing), where present: rows of such a relation still
    /// give a dead letter its event id, key and value ([`Router::salvage_unresolved`]).
    pub fn salvage_columns(&self, relation: &Relation) -> SalvageColumns {
        let c = &self.config;
        SalvageColumns {
            id: find_column(relation, &c.id_field),
            key: find_column(relation, &c.key_field),
            payload: find_column(relation, &c.payload_field),
        }
    }

    /// [`Router::salvage`] for a row of a relation that did not resolve.
    pub fn salvage_unresolved(
        &self,
        columns: &SalvageColumns,
        row: &TupleData,
    ) -> (Option<Bytes>, Option<Bytes>, Option<Bytes>) {
        salvage_row([columns.id, columns.key, columns.payload], row)
    }

    /// Routes a table-less event: a JSON object written with `pg_logical_emit_message`,
    /// whose fields are named by the same options as an outbox table's columns
    /// (`route.by.field`, `table.field.event.key`, `...id`, `...payload`, and the event
    /// type header's). The payload is the field's JSON text, a slice of `content`.
    /// `commit_time_ms`: the CloudEvents `time`.
    pub fn route_json(
        &mut self,
        content: &Bytes,
        source: &str,
        commit_time_ms: Option<i64>,
    ) -> Result<Record, RouteError> {
        let c = &self.config;
        let map: HashMap<String, &serde_json::value::RawValue> =
            serde_json::from_slice(content).map_err(|_| RouteError::BadValue {
                table: source.to_owned(),
                column: "(message content)".into(),
                config_key: "messages.prefix.include",
                event_id: None,
                value: c.log_values.then(|| display_text(content)),
                expected: "a JSON object",
            })?;
        // Strings are unescaped (a key or topic is the string, not its JSON quoting);
        // numbers and other values keep their JSON text.
        let text = |name: &str| -> Option<Bytes> {
            let raw = map.get(name)?.get();
            if raw == "null" {
                return None;
            }
            match serde_json::from_str::<String>(raw) {
                Ok(s) => Some(Bytes::from(s)),
                Err(_) => Some(Bytes::copy_from_slice(raw.as_bytes())),
            }
        };
        let null_field = |name: &str, config_key: &'static str, event_id: &Option<Box<str>>| RouteError::NullField {
            table: source.to_owned(),
            column: name.to_owned(),
            config_key,
            event_id: event_id.clone(),
        };
        let event_id = text(&c.id_field).ok_or_else(|| null_field(&c.id_field, "table.field.event.id", &None))?;
        let event = Some(display_text(&event_id));
        let key = text(&c.key_field).ok_or_else(|| null_field(&c.key_field, "table.field.event.key", &event))?;
        let route_value =
            text(&c.route_by_field).ok_or_else(|| null_field(&c.route_by_field, "route.by.field", &event))?;
        let mut payload =
            map.get(c.payload_field.as_str()).map(|raw| raw.get()).filter(|raw| *raw != "null").map(|raw| {
                let offset = (raw.as_ptr() as usize).saturating_sub(content.as_ptr() as usize);
                content.slice(offset..offset.saturating_add(raw.len()).min(content.len()))
            });
        if payload.is_none() && !c.tombstone_on_empty_payload {
            return Err(RouteError::EmptyPayload {
                table: source.to_owned(),
                column: c.payload_field.clone(),
                event_id: event,
            });
        }
        let mut headers = vec![(self.header_id.clone(), event_id.clone())];
        let event_type = c.event_type_header_field.as_deref().and_then(text);
        let topic = self.topic_for(route_value, source, Some(&event_id))?;
        let c = &self.config;
        if let (Some(contract), Some(p)) = (&c.contract, &payload) {
            let event = Event { event_type: event_type.as_deref(), topic: &topic };
            if let Some(encoded) = check_contract(contract, source, &event_id, event, p, c.log_values)? {
                payload = Some(encoded);
            }
        }
        if let Some(t) = &event_type {
            headers.push((self.header_type.clone(), t.clone()));
        }
        if let Some(envelope) = &self.cloudevents {
            let event_type = event_type.ok_or_else(|| RouteError::NullField {
                table: source.to_owned(),
                column: c.event_type_header_field.clone().unwrap_or_default(),
                config_key: EVENT_TYPE_HEADER_OPTION,
                event_id: event.clone(),
            })?;
            let time = commit_time_ms.and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok());
            let attributes = Attributes { id: &event_id, event_type: &event_type, time, subject: &key };
            match (&payload, envelope.mode) {
                (None, _) => envelope.headers(&attributes, None, &mut headers),
                (Some(p), cloudevents::CloudEventsMode::Binary) => {
                    envelope.binary(&attributes, Data::Json(p), &mut headers)
                }
                (Some(p), cloudevents::CloudEventsMode::Structured) => {
                    let document = envelope.structured(&attributes, Data::Json(p), &mut headers);
                    payload = Some(document);
                }
            }
        }
        let key = self.contract_key(source, &event_id, &topic, key)?;
        Ok(Record {
            topic,
            key,
            value: payload,
            headers,
            event_id,
            timestamp_ms: None,
            partition: None,
            trace: TraceOutcome::default(),
        })
    }

    /// The record [`Router::route`] makes of a row without asking the contract (nor
    /// letting it encode the key or value): what a row that breaks its contract would
    /// have been published as, so its dead letter carries the original topic, key,
    /// headers and value. Any other routing error comes back as [`Router::route`] gives it.
    pub fn route_unchecked(&mut self, rel: &ResolvedRelation, row: &TupleData) -> Result<Record, RouteError> {
        let contract = self.config.contract.take();
        let routed = self.route(rel, row);
        self.config.contract = contract;
        routed
    }

    /// [`Router::route_unchecked`] for a table-less event ([`Router::route_json`]).
    pub fn route_json_unchecked(
        &mut self,
        content: &Bytes,
        source: &str,
        commit_time_ms: Option<i64>,
    ) -> Result<Record, RouteError> {
        let contract = self.config.contract.take();
        let routed = self.route_json(content, source, commit_time_ms);
        self.config.contract = contract;
        routed
    }

    fn topic_for(&mut self, route_value: Bytes, table: &str, event_id: Option<&[u8]>) -> Result<Arc<str>, RouteError> {
        if let Some(t) = self.topics.get(&route_value) {
            return Ok(t.clone());
        }
        let event_id = event_id.map(display_text);
        let c = &self.config;
        let value = String::from_utf8_lossy(&route_value);
        let topic = match self.regex.captures(&value) {
            Some(caps) => self.pattern.expand(&caps),
            // Debezium's RegexRouter leaves a name it does not match unchanged.
            None if c.topic_regex_fallthrough => value.clone().into_owned(),
            None => {
                return Err(RouteError::RouteNoMatch {
                    table: table.to_owned(),
                    column: c.route_by_field.clone(),
                    event_id: event_id.clone(),
                    value: c.log_values.then(|| display_text(&route_value)),
                })
            }
        };
        if let Err(rejection) = self.guard.check(&topic) {
            let (table, column, event_id) = (table.to_owned(), c.route_by_field.clone(), event_id.clone());
            let shown = c.log_values.then(|| display_text(topic.as_bytes()));
            return Err(match rejection {
                TopicRejection::Invalid(reason) => RouteError::InvalidTopic { table, column, event_id, topic: shown, reason },
                TopicRejection::Internal => RouteError::TopicNotAllowed {
                    table,
                    column,
                    event_id,
                    topic: shown,
                    reason: "names starting with '__' belong to Kafka's internal topics (such as __consumer_offsets) and are always refused",
                },
                TopicRejection::NotAllowed => RouteError::TopicNotAllowed {
                    table,
                    column,
                    event_id,
                    topic: shown,
                    reason: "it matches no entry of topics.allow (by default the literal prefix of route.topic.replacement)",
                },
            });
        }
        if c.reserved_topics.contains(&topic) {
            return Err(RouteError::TopicNotAllowed {
                table: table.to_owned(),
                column: c.route_by_field.clone(),
                event_id: event_id.clone(),
                topic: c.log_values.then(|| display_text(topic.as_bytes())),
                reason: "it is one of walpost's own topics (the dead-letter or progress topic), which rows never write",
            });
        }
        let topic: Arc<str> = match self.opened.get(topic.as_str()) {
            Some(known) => known.clone(),
            None if self.opened.len() >= c.topics_max => {
                return Err(RouteError::TooManyTopics {
                    table: table.to_owned(),
                    column: c.route_by_field.clone(),
                    event_id: event_id.clone(),
                    topic: c.log_values.then(|| display_text(topic.as_bytes())),
                    max: c.topics_max,
                });
            }
            None => {
                let topic: Arc<str> = topic.into();
                self.opened.insert(topic.clone());
                topic
            }
        };
        if self.topics.len() >= TOPIC_CACHE_LIMIT {
            self.topics.clear();
        }
        // A copy: the value is a slice of the whole WAL message, which the cache must not pin.
        self.topics.insert(Bytes::copy_from_slice(&route_value), topic.clone());
        Ok(topic)
    }
}

/// The event id, key and payload columns of a relation, where present (see
/// [`Router::salvage_columns`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SalvageColumns {
    id: Option<Col>,
    key: Option<Col>,
    payload: Option<Col>,
}

/// Runs the contract on a payload: the bytes to carry instead, if it encodes them. A
/// breach names the event, never a payload value. Its event type is named when a
/// schema exists for it (then it is a name the operator configured), otherwise only
/// with `log_values` (then it is just a column value).
fn check_contract(
    contract: &crate::ContractRef,
    table: &str,
    event_id: &[u8],
    event: Event<'_>,
    payload: &[u8],
    log_values: bool,
) -> Result<Option<Bytes>, RouteError> {
    match contract.0.check(event, payload) {
        Ok(Checked::Unchanged) => Ok(None),
        Ok(Checked::Encoded(bytes)) => Ok(Some(bytes)),
        Err(ContractError::Breach(breach)) => Err(RouteError::ContractBroken {
            table: table.to_owned(),
            event_id: Some(display_text(event_id)),
            event_type: event.event_type.filter(|_| breach.schema.is_some() || log_values).map(display_text),
            breach: Box::new(breach),
        }),
        Err(ContractError::Unavailable(reason)) => Err(RouteError::ContractUnavailable {
            table: table.to_owned(),
            event_id: Some(display_text(event_id)),
            reason,
        }),
    }
}

fn find_column(relation: &Relation, column: &str) -> Option<Col> {
    relation
        .columns
        .iter()
        .enumerate()
        .find(|(_, c)| c.name.as_ref() == column.as_bytes())
        .map(|(index, c)| Col { index, kind: Kind::of(c.type_oid, c.type_modifier) })
}

/// The id (header form), key and payload (plain form) of a row, as far as they can be
/// read; a value that does not render is passed on as PostgreSQL sent it.
fn salvage_row([id, key, payload]: [Option<Col>; 3], row: &TupleData) -> (Option<Bytes>, Option<Bytes>, Option<Bytes>) {
    let cells: Vec<ColumnValue> = row.iter().collect();
    let get = |col: Option<Col>, form: Form| match cells.get(col?.index) {
        Some(ColumnValue::Text(b)) => Some(form.render(col?.kind, b).unwrap_or_else(|_| b.clone())),
        Some(ColumnValue::Binary(b)) => Some(b.clone()),
        _ => None,
    };
    (get(id, Form::Header), get(key, Form::Plain), get(payload, Form::Plain))
}

mod row;
use row::{expand_json_headers, Cell, Form, RowReader};

#[cfg(test)]
mod tests;

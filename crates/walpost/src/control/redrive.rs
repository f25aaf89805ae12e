//! `POST /api/v1/dead-letters/redrive` of `walpost run`: dead letters read again from
//! their outbox table by id, routed through the current router and contracts (the
//! contract files read again from disk) and published, each that now passes, on the
//! topic the stream would give it, with the stream's key and headers.
//!
//! Invariants:
//! - the stream is never touched: a producer of its own (idempotent, never the
//!   transactional one of exactly-once), a connection of its own, metrics and health of
//!   its own (a slow Kafka here never makes the stream's readiness or watchdog move),
//!   and no slot is read or confirmed;
//! - a refused event stays a dead letter: no new dead letter is written for it, the
//!   answer says why;
//! - by reason, a dead letter whose newest redrive is `redriven` is skipped: the topic
//!   keeps it, and a second redrive would publish the event twice;
//! - one redrive at a time, at most [`MAX_EVENTS`] events, within [`BUDGET`]: the events
//!   left when it runs out are answered `not_attempted`;
//! - every result is a row of `events.walpost_redrives` (by token name, never a payload);
//!   the audit target counts results and names the first ids.

use std::time::{Duration, Instant};

use admin::{ApiError, Call, Reply};
use hyper::StatusCode;
use pgoutput::{ColumnValue, TupleData};
use replication::ReplicationClient;
use router::Router;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::dead_letters::{self, cut, ListQuery, MAX_HEADER_CHARS, MAX_LIMIT, REDRIVES};
use super::Route;
use crate::kafka::{self, Event, Outgoing};
use crate::postgres::catalog;
use crate::postgres::sql::ident;
use crate::settings::Settings;
use crate::telemetry::{Health, Metrics};

/// The most events one redrive takes.
pub(crate) const MAX_EVENTS: usize = 100;
/// The longest an event id may be.
const MAX_ID_CHARS: usize = 200;
/// What one redrive may take, inside the listener's request timeout.
pub(crate) const BUDGET: Duration = Duration::from_secs(20);
/// How long Kafka may take to acknowledge one redriven record.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Event ids an audit target names (then how many more).
const AUDIT_IDS: usize = 5;

const SHAPE: &str = r#"{"event_ids": ["..."]} or {"reason": "..."}"#;

/// The body: exactly one of the two.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RedriveBody {
    event_ids: Option<Vec<String>>,
    reason: Option<String>,
}

/// What a redrive was asked to take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selection {
    Ids(Vec<String>),
    Reason(String),
}

/// What became of one event.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub(crate) event_id: String,
    /// `redriven`, `still_refused`, `not_found`, `failed` (Kafka or the database did not
    /// answer; send it again) or `not_attempted` (the redrive ran out of time).
    pub(crate) result: &'static str,
    pub(crate) outbox_table: Option<String>,
    pub(crate) topic: Option<String>,
    pub(crate) partition: Option<i32>,
    pub(crate) offset: Option<i64>,
    /// Why not: the error class (`contract_broken`, a Kafka error's class).
    pub(crate) reason: Option<String>,
    /// What went wrong or what is known of a missing row.
    pub(crate) detail: Option<String>,
}

impl Outcome {
    fn new(event_id: &str, result: &'static str) -> Outcome {
        Outcome {
            event_id: event_id.to_owned(),
            result,
            outbox_table: None,
            topic: None,
            partition: None,
            offset: None,
            reason: None,
            detail: None,
        }
    }
}

#[derive(Debug, Serialize)]
struct Answer {
    redriven: usize,
    still_refused: usize,
    not_found: usize,
    failed: usize,
    not_attempted: usize,
    results: Vec<Outcome>,
}

/// Redrives of one `walpost run`.
#[derive(Debug)]
pub(crate) struct Redriver {
    settings: Settings,
    running: Mutex<()>,
}

impl Redriver {
    pub(crate) fn new(settings: Settings) -> Redriver {
        Redriver { settings, running: Mutex::new(()) }
    }

    /// `POST /api/v1/dead-letters/redrive`.
    pub(crate) async fn redrive(&self, call: &Call<Route>) -> Reply {
        let selection = match call.json::<RedriveBody>(SHAPE).and_then(selection) {
            Ok(s) => s,
            Err(e) => return e.into(),
        };
        let target = summary_of(&selection);
        let Some(kafka) = &self.settings.kafka else {
            return Reply::from(ApiError::new(
                StatusCode::CONFLICT,
                "this walpost has no [kafka] section",
                "configure [kafka]",
            ))
            .with_target(target);
        };
        let _one = self.running.lock().await;
        let mut sql = match self.connect().await {
            Ok(sql) => sql,
            Err(e) => return Reply::from(e).with_target(target),
        };
        let (ids, known_dead) = match selection {
            Selection::Ids(ids) => (ids, false),
            Selection::Reason(reason) => {
                let letters =
                    match dead_letters::read_newest(kafka, ListQuery { limit: MAX_LIMIT, payload: false }).await {
                        Ok(l) => l,
                        Err(e) => {
                            sql.close().await;
                            return Reply::from(ApiError::new(
                                StatusCode::SERVICE_UNAVAILABLE,
                                format!("cannot read the dead-letter topic {}: {e}", kafka.dead_letter_topic),
                                "nothing was redriven; try again",
                            ))
                            .with_target(target);
                        }
                    };
                let mut ids = ids_of_reason(&letters, &reason);
                // A dead letter redriven already stays in the topic: by reason it is
                // skipped (by id it is sent again, as asked).
                let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                let states = dead_letters::redrive_states(self.settings.postgres.writer(), &refs).await;
                let states = states.unwrap_or_default();
                ids.retain(|id| states.get(id).is_none_or(|s| s.result != "redriven"));
                if ids.is_empty() {
                    sql.close().await;
                    return Reply::from(ApiError::new(
                        StatusCode::NOT_FOUND,
                        format!(
                            "no dead letter of reason {} that was not redriven already, among the newest {MAX_LIMIT} of each partition",
                            cut(&reason, 64)
                        ),
                        "GET /api/v1/dead-letters lists the reasons; or redrive by event_ids",
                    ))
                    .with_target(target);
                }
                (ids, true)
            }
        };
        let routers = match self.routers() {
            Ok(r) => r,
            Err(e) => {
                sql.close().await;
                return Reply::from(e).with_target(target);
            }
        };
        let results = self.run(&mut sql, routers, &ids, known_dead, &call.identity.name).await;
        sql.close().await;
        let answer = answer(results);
        tracing::info!(
            by = %call.identity.name,
            redriven = answer.redriven,
            still_refused = answer.still_refused,
            not_found = answer.not_found,
            failed = answer.failed + answer.not_attempted,
            "admin API: dead letters redriven"
        );
        let target = format!(
            "{target} redriven={} still_refused={} not_found={} failed={} not_attempted={}",
            answer.redriven, answer.still_refused, answer.not_found, answer.failed, answer.not_attempted
        );
        Reply::ok(&answer).with_target(target)
    }

    /// The redrive's connection: the writer's server, `search_path` fixed, statements
    /// bounded; 409 when migration 0006 is missing.
    async fn connect(&self) -> Result<ReplicationClient, ApiError> {
        let unavailable = |e: String| {
            tracing::warn!("admin API: redrive cannot reach PostgreSQL: {e}");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("PostgreSQL did not answer: {e}"),
                "nothing was redriven; try again",
            )
        };
        let mut sql = ReplicationClient::connect_sql(self.settings.postgres.writer())
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let setup = "SELECT pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', false), \
                            pg_catalog.set_config('statement_timeout', '10s', false), \
                            (pg_catalog.to_regclass($1) IS NOT NULL)::text AS migrated";
        let r = sql.query(setup, &[Some(REDRIVES)]).await.map_err(|e| unavailable(e.to_string()))?;
        if r.first("migrated") != Some("true") {
            sql.close().await;
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "nothing was redriven: {REDRIVES} does not exist (migrations/outbox/0006_redrives.sql)"
                ),
                "run walpost migrate --postgres URL and GRANT SELECT, INSERT ON events.walpost_redrives to walpost's role",
            ));
        }
        Ok(sql)
    }

    /// A router per outbox table with today's contracts: the files read again, or a
    /// registry's contract of its own, with an empty cache, so that the version a subject
    /// has now (or the one `[registry.versions]` pins) is the one checked.
    fn routers(&self) -> Result<Vec<Router>, ApiError> {
        let fresh = match &self.settings.registry {
            None => crate::settings::contracts::resolve_contracts(&self.settings.contracts).map_err(|e| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    format!("nothing was redriven: the contracts cannot be read again: {e}"),
                    "fix the schema files; the stream goes on with the contracts it read at start",
                )
            })?,
            Some(r) => Some(registry::contract(r, None).map_err(|e| {
                ApiError::new(
                    StatusCode::CONFLICT,
                    format!("nothing was redriven: the registry's contract cannot be made: {e}"),
                    "check [registry]; the stream goes on with the contract it made at start",
                )
            })?),
        };
        let mut routers = Vec::new();
        for outbox in &self.settings.source.outboxes {
            let mut config = outbox.router.clone();
            if fresh.is_some() {
                config.contract.clone_from(&fresh);
            }
            routers.push(Router::new(config).map_err(|e| ApiError::internal(e.to_string()))?);
        }
        Ok(routers)
    }

    async fn run(
        &self,
        sql: &mut ReplicationClient,
        mut routers: Vec<Router>,
        ids: &[String],
        known_dead: bool,
        by: &str,
    ) -> Vec<Outcome> {
        let started = Instant::now();
        let mut results = Vec::with_capacity(ids.len());
        let mut window = match self.window() {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!("admin API: redrive cannot make a Kafka producer: {e}");
                None
            }
        };
        for id in ids {
            if started.elapsed() > BUDGET {
                let mut o = Outcome::new(id, "not_attempted");
                o.detail = Some(format!("the redrive ran out of its {} s; send this id again", BUDGET.as_secs()));
                results.push(o);
                continue;
            }
            let outcome = self.one(sql, &mut routers, window.as_mut(), id, known_dead).await;
            if outcome.result == "failed" && outcome.reason.as_deref() == Some("producer_stopped") {
                window = None;
            }
            record(sql, &outcome, by).await;
            results.push(outcome);
        }
        if let Some(w) = window {
            w.close(Duration::from_secs(2), |_| {}).await;
        }
        results
    }

    /// A producer of the redrive's own, with metrics and health nobody reads.
    fn window(&self) -> Result<kafka::ProduceWindow<usize>, String> {
        let kafka = self.settings.kafka().map_err(|e| e.to_string())?;
        let health = std::sync::Arc::new(Health::new(Duration::MAX, Duration::MAX));
        let metrics = Metrics::new(health).map_err(|e| e.to_string())?;
        let mut stream = self.settings.stream.clone();
        stream.delivery_timeout = DELIVERY_TIMEOUT;
        kafka::open_window(kafka, &stream, &metrics, None).map_err(|e| e.to_string())
    }

    async fn one(
        &self,
        sql: &mut ReplicationClient,
        routers: &mut [Router],
        window: Option<&mut kafka::ProduceWindow<usize>>,
        id: &str,
        known_dead: bool,
    ) -> Outcome {
        let outboxes = &self.settings.source.outboxes;
        let mut found = None;
        for (i, outbox) in outboxes.iter().enumerate() {
            let q = format!(
                "SELECT t.* FROM {} AS t WHERE t.{} = $1 LIMIT 1",
                outbox.table.quoted(),
                ident(&outbox.router.id_field)
            );
            match sql.query(&q, &[Some(id)]).await {
                Ok(rows) if !rows.rows.is_empty() => {
                    found = Some((i, rows));
                    break;
                }
                Ok(_) => {}
                // Not a value of the id column's type: no row of this table has it.
                Err(e) if e.sqlstate().is_some_and(|s| s.starts_with("22")) => {}
                Err(e) => {
                    let mut o = Outcome::new(id, "failed");
                    o.outbox_table = Some(outbox.table.to_string());
                    o.detail = Some(format!("PostgreSQL: {e}; send this id again"));
                    return o;
                }
            }
        }
        let tables: Vec<String> = outboxes.iter().map(|o| o.table.to_string()).collect();
        let Some((index, rows)) = found else {
            let mut o = Outcome::new(id, "not_found");
            o.detail = Some(if known_dead {
                format!(
                    "it was dead-lettered, so its row existed; {} no longer holds it: retention dropped its partition, or it was deleted",
                    tables.join(", ")
                )
            } else {
                format!(
                    "no row with this id in {}: retention dropped it, it was deleted, or it never existed (an id not in the dead-letter topic's listing never was a dead letter)",
                    tables.join(", ")
                )
            });
            return o;
        };
        let outbox = &outboxes[index];
        let mut o = Outcome::new(id, "redriven");
        o.outbox_table = Some(outbox.table.to_string());
        let columns = rows
            .columns
            .iter()
            .cloned()
            .zip(rows.column_types.iter().copied())
            .zip(rows.column_type_modifiers.iter().copied())
            .map(|((name, oid), typmod)| (name, oid, typmod));
        let relation = catalog::relation_of(&outbox.table, columns);
        let router = &mut routers[index];
        let routed = router.resolve(&relation).and_then(|rel| {
            let values: Vec<ColumnValue> = rows.rows[0]
                .iter()
                .map(|v| v.as_ref().map_or(ColumnValue::Null, |b| ColumnValue::Text(b.clone())))
                .collect();
            router.route(&rel, &TupleData::from_values(&values))
        });
        let record = match routed {
            Ok(r) => r,
            Err(e @ router::RouteError::ContractUnavailable { .. }) => {
                o.result = "failed";
                o.reason = Some(e.class().to_owned());
                o.detail = Some(format!("{}; send this id again", cut(&e.to_string(), MAX_HEADER_CHARS)));
                return o;
            }
            Err(e) => {
                o.result = "still_refused";
                o.reason = Some(e.class().to_owned());
                o.detail = Some(cut(&e.to_string(), MAX_HEADER_CHARS));
                return o;
            }
        };
        let Some(window) = window else {
            o.result = "failed";
            o.reason = Some("producer_stopped".into());
            o.detail = Some("no Kafka producer for the redrive; send this id again".into());
            return o;
        };
        o.topic = Some(record.topic.to_string());
        window.enqueue(Outgoing { record, timestamp_ms: None, tag: 0, dead_letter: None });
        match window.next_event_within().await {
            Ok(Event::Delivered { partition, offset, topic, .. }) => {
                o.topic = Some(topic.to_string());
                o.partition = Some(partition);
                o.offset = Some(offset);
            }
            Ok(Event::Rejected { rejection, producer_fatal, .. }) => {
                o.result = "still_refused";
                o.reason = Some(rejection.code.clone());
                o.detail = Some(cut(&format!("{}: {}", rejection.error, rejection.fix), MAX_HEADER_CHARS));
                if producer_fatal.is_some() {
                    // The next event gets a producer that is not stopped.
                    o.detail = o.detail.map(|d| format!("{d} (the redrive's producer stopped)"));
                }
            }
            Ok(Event::Failed { error, .. }) => {
                o.result = "failed";
                o.reason = Some("producer_stopped".into());
                o.detail = Some(format!("{}; send this id again", cut(&error, MAX_HEADER_CHARS)));
            }
            Err(e) => {
                o.result = "failed";
                o.reason = Some("producer_stopped".into());
                o.detail = Some(format!("{}; send this id again", cut(&e.to_string(), MAX_HEADER_CHARS)));
            }
        }
        o
    }
}

/// The redrive's row; one that cannot be written is logged (the event went where the
/// answer says either way).
async fn record(sql: &mut ReplicationClient, o: &Outcome, by: &str) {
    let q = format!(
        "INSERT INTO {REDRIVES} (event_id, outbox_table, by_token, result, topic, \"partition\", \"offset\", reason) \
         VALUES ($1, $2, $3, $4, $5, $6::integer, $7::bigint, $8)"
    );
    let partition = o.partition.map(|p| p.to_string());
    let offset = o.offset.map(|p| p.to_string());
    let reason = match (&o.reason, &o.detail) {
        (Some(r), Some(d)) => Some(format!("{r}: {d}")),
        (r, d) => r.clone().or_else(|| d.clone()),
    };
    let params = [
        Some(o.event_id.as_str()),
        o.outbox_table.as_deref(),
        Some(by),
        Some(o.result),
        o.topic.as_deref(),
        partition.as_deref(),
        offset.as_deref(),
        reason.as_deref(),
    ];
    if let Err(e) = sql.query(&q, &params).await {
        tracing::warn!(result = o.result, "admin API: the redrive of an event was not recorded in {REDRIVES}: {e}");
    }
}

/// The body's selection: exactly one of `event_ids` (1 to [`MAX_EVENTS`] ids) and `reason`.
fn selection(body: RedriveBody) -> Result<Selection, ApiError> {
    let bad = |what: String| ApiError::new(StatusCode::BAD_REQUEST, what, format!("send {SHAPE}"));
    match (body.event_ids, body.reason) {
        (Some(_), Some(_)) => Err(bad("the body has both event_ids and reason; one selects".into())),
        (None, None) => Err(bad("the body has neither event_ids nor reason".into())),
        (Some(ids), None) if ids.is_empty() => Err(bad("event_ids is empty".into())),
        (Some(ids), None) if ids.len() > MAX_EVENTS => Err(bad(format!(
            "event_ids holds {} ids; one redrive takes at most {MAX_EVENTS} (send them in several requests)",
            ids.len()
        ))),
        (Some(ids), None) => {
            if ids.iter().any(|id| id.is_empty() || id.chars().count() > MAX_ID_CHARS) {
                return Err(bad(format!("an event id is empty or longer than {MAX_ID_CHARS} characters")));
            }
            let mut unique: Vec<String> = Vec::with_capacity(ids.len());
            for id in ids {
                if !unique.contains(&id) {
                    unique.push(id);
                }
            }
            Ok(Selection::Ids(unique))
        }
        (None, Some(r)) if r.trim().is_empty() || r.chars().count() > MAX_ID_CHARS => {
            Err(bad(format!("reason is empty or longer than {MAX_ID_CHARS} characters")))
        }
        (None, Some(r)) => Ok(Selection::Reason(r)),
    }
}

/// The distinct event ids of the dead letters of `reason`, newest first, at most [`MAX_EVENTS`].
pub(crate) fn ids_of_reason(letters: &[dead_letters::DeadLetter], reason: &str) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for l in letters.iter().filter(|l| l.reason.as_deref() == Some(reason)) {
        if let Some(id) = &l.event_id {
            if !ids.contains(id) && ids.len() < MAX_EVENTS {
                ids.push(id.clone());
            }
        }
    }
    ids
}

/// The audit target's words for a selection.
fn summary_of(selection: &Selection) -> String {
    match selection {
        Selection::Reason(r) => format!("reason={}", cut(r, 64)),
        Selection::Ids(ids) => {
            let first: Vec<String> = ids.iter().take(AUDIT_IDS).map(|id| cut(id, 64)).collect();
            let more = ids.len().saturating_sub(AUDIT_IDS);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            format!("event_ids={} ({}{more})", ids.len(), first.join(","))
        }
    }
}

fn answer(results: Vec<Outcome>) -> Answer {
    let count = |r: &str| results.iter().filter(|o| o.result == r).count();
    Answer {
        redriven: count("redriven"),
        still_refused: count("still_refused"),
        not_found: count("not_found"),
        failed: count("failed"),
        not_attempted: count("not_attempted"),
        results,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(text: &str) -> Result<Selection, ApiError> {
        serde_json::from_str::<RedriveBody>(text).map_err(|e| ApiError::bad_json(&e, SHAPE)).and_then(selection)
    }

    #[test]
    fn a_body_selects_by_ids_or_by_reason_within_bounds() {
        assert_eq!(body(r#"{"event_ids": ["7", "8", "7"]}"#).unwrap(), Selection::Ids(vec!["7".into(), "8".into()]));
        assert_eq!(body(r#"{"reason": "contract_broken"}"#).unwrap(), Selection::Reason("contract_broken".into()));
        let many: Vec<String> = (0..=MAX_EVENTS).map(|i| i.to_string()).collect();
        for (bad, says) in [
            (r#"{"event_ids": ["1"], "reason": "x"}"#.to_owned(), "both"),
            ("{}".to_owned(), "neither"),
            (r#"{"event_ids": []}"#.to_owned(), "empty"),
            (serde_json::json!({ "event_ids": many }).to_string(), "at most 100"),
            (r#"{"event_ids": [""]}"#.to_owned(), "empty or longer"),
            (r#"{"reason": " "}"#.to_owned(), "reason is empty"),
        ] {
            let e = body(&bad).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{bad}");
            assert!(e.error().contains(says) && e.hint().contains("event_ids"), "{bad}: {e:?}");
        }
        assert_eq!(body(r#"{"ids": ["1"]}"#).unwrap_err().status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn the_audit_target_counts_and_names_the_first_ids() {
        let ids: Vec<String> = (1..=7).map(|i| i.to_string()).collect();
        assert_eq!(summary_of(&Selection::Ids(ids)), "event_ids=7 (1,2,3,4,5 and 2 more)");
        assert_eq!(summary_of(&Selection::Reason("contract_broken".into())), "reason=contract_broken");
    }
}

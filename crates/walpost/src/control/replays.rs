//! Replays on `walpost run`'s admin API: `POST /api/v1/replays` starts one beside the
//! stream, `GET /api/v1/replays` and `GET /api/v1/replays/{id}` follow them,
//! `DELETE /api/v1/replays/{id}` stops one.
//!
//! A replay here is `walpost replay` inside the running process: its spec comes from
//! `ops::replay::spec` under the same condition rules (`ops::replay::row_condition`), and
//! it runs through `ops::replay::execute` with its own PostgreSQL connection, Kafka
//! producer and metrics, on a task of the admin listener's thread. It never reads,
//! confirms or waits for the slot, and the stream never waits for it.
//!
//! Invariants:
//! - at most [`MAX_RUNNING`] replays run at once; one more is refused (409), nothing started;
//! - `unsafe_where` is refused (400): a token may select rows, never run SQL as walpost's role;
//! - a stop takes effect before the replay's next FETCH: what it handed to Kafka is
//!   acknowledged first and stays published;
//! - every running replay and the last [`KEEP_ENDED`] that ended are kept in memory (a
//!   restart forgets them: the log has each start and end);
//! - answers and audit targets name the replay and its condition (configuration, cut to
//!   [`MAX_SHOWN_CHARS`] in the audit), never a row's values; an error is the replay's
//!   operator text, cut to [`MAX_ERROR_CHARS`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use admin::{ApiError, Reply};
use hyper::StatusCode;
use serde::{Deserialize, Serialize};

use crate::error::{ErrorKind, PipelineError};
use crate::ops::replay as replay_command;
use crate::settings::Settings;
use crate::snapshot::replay::{ReplaySpec, ReplayWatch};
use crate::snapshot::Outcome;
use crate::stream::signal::printable;

/// Replays running at once.
pub(crate) const MAX_RUNNING: usize = 2;
/// Ended replays kept for `GET`.
pub(crate) const KEEP_ENDED: usize = 20;
/// The longest condition text an audit target shows.
const MAX_SHOWN_CHARS: usize = 200;
/// The longest error text an answer shows.
const MAX_ERROR_CHARS: usize = 2000;
/// The longest replay id taken (it is a Kafka header's value and a path segment).
const MAX_ID_CHARS: usize = 64;
/// How long `DELETE` waits for the replay to reach its next chunk boundary and end.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// `POST /api/v1/replays`'s body: `walpost replay`'s flags, each optional as there.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StartRequest {
    #[serde(rename = "where")]
    condition: Option<String>,
    since: Option<String>,
    until: Option<String>,
    /// The replay's id (the `walpost.replay` header), as `--id`.
    id: Option<String>,
    time_column: Option<String>,
    #[serde(default)]
    dry_run: bool,
    /// Every row of every outbox: said out loud, so that an empty body replays nothing.
    #[serde(default)]
    all: bool,
    /// Named so it is refused with its reason rather than as an unknown field.
    unsafe_where: Option<serde_json::Value>,
}

const EXPECTED: &str = "{\"where\": \"aggregate_type = 'order'\", \"since\": \"2026-11-28T00:00:00Z\", \"until\": \"...\", \"id\": \"fix-42\", \"time_column\": \"occurred_at\", \"dry_run\": false}, each field optional, or {\"all\": true}";

/// One replay as the routes answer it.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct ReplayView {
    pub(crate) id: String,
    /// `running`, `done`, `failed` or `stopped`.
    pub(crate) state: &'static str,
    pub(crate) dry_run: bool,
    #[serde(rename = "where")]
    pub(crate) condition: Option<String>,
    pub(crate) since: Option<String>,
    pub(crate) until: Option<String>,
    pub(crate) time_column: String,
    pub(crate) rows_read: u64,
    /// Records Kafka acknowledged (a dry run: rows routed).
    pub(crate) events_published: u64,
    pub(crate) started_at: String,
    pub(crate) finished_at: Option<String>,
    pub(crate) stop_requested: bool,
    pub(crate) error: Option<String>,
}

#[derive(Debug)]
struct Entry {
    spec: ReplaySpec,
    condition: Option<String>,
    started_at: jiff::Timestamp,
    watch: Arc<ReplayWatch>,
    ended: Option<Ended>,
}

#[derive(Debug)]
struct Ended {
    state: &'static str,
    at: jiff::Timestamp,
    error: Option<String>,
}

/// The replays of this process.
#[derive(Debug)]
pub(crate) struct Replays {
    settings: Arc<Settings>,
    /// Oldest first.
    entries: Arc<Mutex<VecDeque<Entry>>>,
}

impl Replays {
    pub(crate) fn new(settings: Settings) -> Replays {
        Replays { settings: Arc::new(settings), entries: Arc::default() }
    }

    fn entries(&self) -> MutexGuard<'_, VecDeque<Entry>> {
        lock(&self.entries)
    }

    /// `POST /api/v1/replays`: checks the body, then starts the replay on a task of its own.
    pub(crate) fn start(&self, body: Result<StartBody, ApiError>) -> Reply {
        let req = match body {
            Ok(StartBody(req)) => req,
            Err(e) => return e.into(),
        };
        let target = audit_target(&req, None);
        let refuse =
            |status, error: &str, hint: &str| Reply::from(ApiError::new(status, error, hint)).with_target(&target);
        if req.unsafe_where.is_some() {
            return refuse(
                StatusCode::BAD_REQUEST,
                texts::replay::API_UNSAFE_WHERE,
                texts::replay::API_UNSAFE_WHERE_HINT,
            );
        }
        let selects = req.condition.is_some() || req.since.is_some() || req.until.is_some();
        if selects == req.all {
            let (error, hint) = if req.all {
                ("the body has \"all\": true and a selection (where, since or until)", "send one of the two")
            } else {
                (
                    "the body selects no rows: it would replay every row of every outbox",
                    "send where, since or until; to replay every row, send \"all\": true",
                )
            };
            return refuse(StatusCode::BAD_REQUEST, error, hint);
        }
        if let Some(id) = &req.id {
            if !valid_id(id) {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    "id is not a replay id walpost takes",
                    &format!("1 to {MAX_ID_CHARS} letters, digits, '-', '_' or '.', e.g. fix-42; or leave id out and walpost names the replay"),
                );
            }
        }
        let condition = match req.condition.clone().map(|t| replay_command::row_condition(t, false)).transpose() {
            Ok(c) => c,
            Err(e) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    &texts::replay::api_where_refused(&e),
                    texts::replay::API_WHERE_HINT,
                )
            }
        };
        let mut entries = self.entries();
        if entries.iter().filter(|e| e.ended.is_none()).count() >= MAX_RUNNING {
            return refuse(
                StatusCode::CONFLICT,
                &format!("{MAX_RUNNING} replays are running, the most walpost runs at once; nothing was started"),
                "wait for one to end (GET /api/v1/replays) or stop one (DELETE /api/v1/replays/{id}), then ask again",
            );
        }
        let id = match &req.id {
            Some(id) if entries.iter().any(|e| &e.spec.id == id) => {
                return refuse(
                    StatusCode::CONFLICT,
                    &format!("a replay {id} exists already; nothing was started"),
                    "choose another id, or leave id out and walpost names the replay",
                )
            }
            Some(id) => id.clone(),
            None => unique_id(&entries, &ReplaySpec::new_id()),
        };
        let spec = replay_command::spec(
            &self.settings.source,
            Some(id.clone()),
            req.since.clone(),
            req.until.clone(),
            condition,
            req.time_column.clone(),
            req.dry_run,
            None,
        );
        let watch = Arc::new(ReplayWatch::default());
        let entry = Entry {
            spec: spec.clone(),
            condition: req.condition.clone(),
            started_at: jiff::Timestamp::now(),
            watch: watch.clone(),
            ended: None,
        };
        let view = view_of(&entry);
        entries.push_back(entry);
        forget_old(&mut entries);
        drop(entries);
        tracing::info!(replay = %id, dry_run = spec.dry_run, "admin API: replay started beside the stream");
        tokio::spawn(run(self.settings.clone(), spec, watch, self.entries.clone()));
        let mut reply = Reply::ok(&view).with_target(audit_target(&req, Some(&id)));
        reply.status = StatusCode::ACCEPTED;
        reply
    }

    /// `GET /api/v1/replays`: the running ones and the last that ended, newest first.
    pub(crate) fn list(&self) -> Reply {
        let entries = self.entries();
        let replays: Vec<ReplayView> = entries.iter().rev().map(view_of).collect();
        let running = replays.iter().filter(|r| r.state == "running").count();
        Reply::ok(&serde_json::json!({ "replays": replays, "running": running, "max_running": MAX_RUNNING }))
    }

    /// `GET /api/v1/replays/{id}`.
    pub(crate) fn get(&self, id: &str) -> Reply {
        match self.view(id) {
            Some(view) => Reply::ok(&view),
            None => unknown(id).into(),
        }
    }

    fn view(&self, id: &str) -> Option<ReplayView> {
        self.entries().iter().find(|e| e.spec.id == id).map(view_of)
    }

    /// `DELETE /api/v1/replays/{id}`: asks the replay to stop and waits (at most
    /// [`STOP_WAIT`]) until it has: 200 with its end, else 202 while it still runs.
    /// Stopping a replay that ended changes nothing (200, as it ended).
    pub(crate) async fn stop(&self, id: &str) -> Reply {
        let target = format!("replay={}", shown(id, MAX_ID_CHARS));
        let running = {
            let entries = self.entries();
            match entries.iter().find(|e| e.spec.id == id) {
                None => return Reply::from(unknown(id)).with_target(target),
                Some(e) if e.ended.is_none() => {
                    e.watch.request_stop();
                    true
                }
                Some(_) => false,
            }
        };
        if running {
            tracing::info!(replay = %id, "admin API: replay asked to stop");
            let deadline = tokio::time::Instant::now() + STOP_WAIT;
            while tokio::time::Instant::now() < deadline && self.view(id).is_some_and(|v| v.state == "running") {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        match self.view(id) {
            Some(view) => {
                let still = view.state == "running";
                let mut reply = Reply::ok(&view).with_target(target);
                if still {
                    reply.status = StatusCode::ACCEPTED;
                }
                reply
            }
            None => Reply::from(unknown(id)).with_target(target),
        }
    }
}

/// The body of `POST /api/v1/replays`, as read by the listener's [`admin::Call::json`].
#[derive(Debug)]
pub(crate) struct StartBody(StartRequest);

impl StartBody {
    pub(crate) fn read(call: &admin::Call<super::Route>) -> Result<StartBody, ApiError> {
        call.json::<StartRequest>(EXPECTED).map(StartBody)
    }
}

/// The replay's task: runs it, then records how it ended.
async fn run(settings: Arc<Settings>, spec: ReplaySpec, watch: Arc<ReplayWatch>, entries: Arc<Mutex<VecDeque<Entry>>>) {
    let id = spec.id.clone();
    let task = {
        let watch = watch.clone();
        tokio::spawn(async move { replay_command::execute(&settings, &spec, Some(watch)).await })
    };
    // A replay that panicked has ended too: it must not count as running for ever.
    let result = task.await.unwrap_or_else(|e| {
        Err(PipelineError::definite(ErrorKind::Internal, format!("the replay's task ended unexpectedly: {e}")))
    });
    let ended = ended(&result, &watch);
    match &ended.error {
        None => tracing::info!(
            replay = %id,
            state = ended.state,
            rows = watch.rows_read(),
            published = watch.published(),
            "admin API: replay ended"
        ),
        Some(e) => tracing::warn!(replay = %id, "admin API: replay failed: {e}"),
    }
    let mut entries = lock(&entries);
    if let Some(entry) = entries.iter_mut().find(|e| e.spec.id == id) {
        entry.ended = Some(ended);
    }
    forget_old(&mut entries);
}

/// How a replay ended, from its result and its watch.
fn ended(result: &Result<Outcome, PipelineError>, watch: &ReplayWatch) -> Ended {
    let (state, error) = match result {
        Ok(_) if watch.stopped_early() => ("stopped", None),
        Ok(_) => ("done", None),
        Err(e) => ("failed", Some(shown(&e.to_string(), MAX_ERROR_CHARS))),
    };
    Ended { state, at: jiff::Timestamp::now(), error }
}

fn view_of(e: &Entry) -> ReplayView {
    ReplayView {
        id: e.spec.id.clone(),
        state: e.ended.as_ref().map_or("running", |x| x.state),
        dry_run: e.spec.dry_run,
        condition: e.condition.clone(),
        since: e.spec.since.clone(),
        until: e.spec.until.clone(),
        time_column: e.spec.time_column.clone(),
        rows_read: e.watch.rows_read(),
        events_published: e.watch.published(),
        started_at: e.started_at.to_string(),
        finished_at: e.ended.as_ref().map(|x| x.at.to_string()),
        stop_requested: e.watch.stop_requested(),
        error: e.ended.as_ref().and_then(|x| x.error.clone()),
    }
}

/// Drops the oldest ended replays beyond [`KEEP_ENDED`] (running ones stay).
fn forget_old(entries: &mut VecDeque<Entry>) {
    let mut ended = entries.iter().filter(|e| e.ended.is_some()).count();
    entries.retain(|e| {
        if e.ended.is_some() && ended > KEEP_ENDED {
            ended -= 1;
            false
        } else {
            true
        }
    });
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data stays consistent across a panic elsewhere: every change is one assignment.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `base`, or `base-2`, `base-3`, ... when a replay has it (two starts in one second).
fn unique_id(entries: &VecDeque<Entry>, base: &str) -> String {
    let taken = |id: &str| entries.iter().any(|e| e.spec.id == id);
    (1..)
        .map(|n| if n == 1 { base.to_owned() } else { format!("{base}-{n}") })
        .find(|id| !taken(id))
        .unwrap_or_default()
}

fn valid_id(id: &str) -> bool {
    (1..=MAX_ID_CHARS).contains(&id.chars().count())
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn unknown(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no replay {} in this walpost", shown(id, MAX_ID_CHARS)),
        format!("GET /api/v1/replays lists the running replays and the last {KEEP_ENDED} that ended since this walpost started"),
    )
}

/// `text` with control characters escaped, cut to `max` characters.
fn shown(text: &str, max: usize) -> String {
    let text = printable(text);
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

/// The audit target: the replay's id once known, what selects its rows, and the
/// condition's text cut short.
fn audit_target(req: &StartRequest, id: Option<&str>) -> String {
    let mut parts = Vec::new();
    if let Some(id) = id.or(req.id.as_deref()) {
        parts.push(format!("replay={}", shown(id, MAX_ID_CHARS)));
    }
    let kinds: Vec<&str> =
        [("where", req.condition.is_some()), ("since", req.since.is_some()), ("until", req.until.is_some())]
            .into_iter()
            .filter_map(|(k, present)| present.then_some(k))
            .collect();
    parts.push(format!("selection={}", if kinds.is_empty() { "all".to_owned() } else { kinds.join("+") }));
    if req.dry_run {
        parts.push("dry_run".to_owned());
    }
    if let Some(c) = &req.condition {
        parts.push(format!("where={}", shown(c, MAX_SHOWN_CHARS)));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: &str) -> StartRequest {
        serde_json::from_str(json).unwrap()
    }

    fn entry(id: &str, ended: bool) -> Entry {
        Entry {
            spec: ReplaySpec {
                id: id.into(),
                since: None,
                until: None,
                condition: None,
                time_column: "occurred_at".into(),
                dry_run: false,
                statement_timeout: crate::snapshot::replay::STATEMENT_TIMEOUT,
            },
            condition: None,
            started_at: jiff::Timestamp::now(),
            watch: Arc::default(),
            ended: ended.then(|| Ended { state: "done", at: jiff::Timestamp::now(), error: None }),
        }
    }

    #[test]
    fn bodies_are_the_replay_commands_flags_and_nothing_else() {
        let r =
            request(r#"{"where": "aggregate_type = 'order'", "since": "2026-11-28", "id": "fix-42", "dry_run": true}"#);
        assert_eq!(
            audit_target(&r, None),
            "replay=fix-42 selection=where+since dry_run where=aggregate_type = 'order'"
        );
        assert_eq!(audit_target(&request("{}"), Some("replay-1")), "replay=replay-1 selection=all");
        assert!(serde_json::from_str::<StartRequest>(r#"{"wher": "x = 1"}"#).is_err(), "unknown fields are refused");
        assert!(request(r#"{"unsafe_where": true}"#).unsafe_where.is_some());
        let long = request(&format!(r#"{{"where": "{}\n"}}"#, "a".repeat(500)));
        let target = audit_target(&long, None);
        assert!(target.len() < 260 && target.ends_with("...") && !target.contains('\n'), "{target}");
    }

    #[test]
    fn ids_are_checked_and_made_unique() {
        assert!(valid_id("fix-42") && valid_id("replay-20261206T023000Z.2"));
        assert!(!valid_id("") && !valid_id("a/b") && !valid_id("a b") && !valid_id(&"x".repeat(65)));
        let entries: VecDeque<Entry> = [entry("replay-1", true), entry("replay-1-2", false)].into();
        assert_eq!(unique_id(&entries, "replay-1"), "replay-1-3");
        assert_eq!(unique_id(&entries, "replay-2"), "replay-2");
    }

    #[test]
    fn only_ended_replays_are_forgotten_oldest_first() {
        let mut entries: VecDeque<Entry> = VecDeque::new();
        entries.push_back(entry("running", false));
        for n in 0..KEEP_ENDED + 3 {
            entries.push_back(entry(&format!("ended-{n}"), true));
        }
        forget_old(&mut entries);
        assert_eq!(entries.len(), KEEP_ENDED + 1);
        assert_eq!(entries[0].spec.id, "running");
        assert_eq!(entries[1].spec.id, "ended-3");
    }

    #[test]
    fn an_end_is_stopped_only_when_the_replay_stopped_early() {
        let watch = ReplayWatch::default();
        assert_eq!(ended(&Ok(Outcome::default()), &watch).state, "done");
        watch.request_stop();
        assert_eq!(ended(&Ok(Outcome::default()), &watch).state, "done", "it had read every row already");
        let failed = ended(&Err(PipelineError::definite(ErrorKind::Config, "x".repeat(3000))), &watch);
        assert_eq!(failed.state, "failed");
        assert_eq!(failed.error.map(|e| e.chars().count()), Some(MAX_ERROR_CHARS + 3));
    }
}

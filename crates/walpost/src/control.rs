//! `walpost run`'s admin API on the `admin` crate's listener (`[admin] addr`,
//! docs/control-plane.md): today `GET /api/v1/status`, from what the process already
//! knows (its [`Health`], its metrics, the slot monitor's last [`Observation`]); pause
//! and resume ([`pause`]); replays beside the stream ([`replays`]); the dead letters
//! ([`dead_letters`]) and their redrive ([`redrive`]).
//!
//! A field the process does not know is `null`, never a guess: the slot's figures before
//! the monitor's first poll, the lag while another instance streams. Actions (pause,
//! dead letters, replays) come as routes of [`Route`], answered in [`RelayApi::handle`];
//! the listener authenticates, authorizes, bounds and audits them.
//!
//! `walpost inbox`'s API, on the same listener and `[admin]` settings, is [`inbox`].

use std::sync::Arc;

use admin::{Api, Call, Reply, Routes};
use openssl::ssl::SslAcceptor;
use pgoutput::Lsn;
use serde::Serialize;
use tokio::sync::watch;

use crate::error::{ErrorKind, PipelineError};
use crate::monitor::Observation;
use crate::settings::admin::AdminSettings;
use crate::settings::{Delivery, Settings};
use crate::telemetry::{AlarmLevel, Health, Metrics};

mod dead_letters;
mod history;
pub(crate) mod inbox;
mod pause;
mod redrive;
mod replays;

/// Where `walpost run`'s audit rows go (migrations/outbox/0004_admin_audit.sql).
const AUDIT_SCHEMA: &str = "events";
const AUDIT_TABLE: &str = "walpost_admin_audit";

/// `walpost run`'s routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    Status,
    History,
    Pause,
    Resume,
    Replays,
    StartReplay,
    Replay,
    StopReplay,
    DeadLetters,
    Redrive,
}

/// What `GET /api/v1/status` answers.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Status {
    /// `starting`, `streaming`, `paused` (an operator paused the stream: see
    /// `paused_by`), `waiting` (a hot standby: another process holds the slot) or `halted`.
    pub(crate) state: &'static str,
    /// While paused: by which token and since when.
    pub(crate) paused_by: Option<String>,
    pub(crate) slot: String,
    pub(crate) confirmed_lsn: Option<String>,
    /// The server's WAL position at the monitor's last poll.
    pub(crate) server_lsn: Option<String>,
    /// WAL written and not yet confirmed, at the monitor's last poll.
    pub(crate) lag_bytes: Option<u64>,
    /// Seconds since the oldest unconfirmed transaction committed, while this process streams.
    pub(crate) lag_seconds: Option<f64>,
    pub(crate) delivery: &'static str,
    pub(crate) halted_reason: Option<String>,
    /// Who holds the slot while this process waits.
    pub(crate) slot_holder: Option<String>,
    pub(crate) in_flight: Option<i64>,
    /// Records Kafka acknowledged per second over the last minute; `null` in the first
    /// seconds after start.
    pub(crate) events_per_second: Option<f64>,
    pub(crate) alarms: Vec<Alarm>,
}

/// One reason of the slot alarm, with the runbook that says what to do.
#[derive(Debug, Serialize, PartialEq)]
pub(crate) struct Alarm {
    pub(crate) level: AlarmLevel,
    pub(crate) reason: String,
    pub(crate) runbook: &'static str,
}

/// The API of one `walpost run`.
#[derive(Debug)]
pub(crate) struct RelayApi {
    routes: Routes<Route>,
    health: Arc<Health>,
    metrics: Metrics,
    seen: watch::Receiver<Option<Observation>>,
    slot: String,
    delivery: &'static str,
    pause: pause::PauseControl,
    replays: replays::Replays,
    dead_letters: dead_letters::DeadLetters,
    redrive: redrive::Redriver,
    history: history::Shared,
}

impl Api for RelayApi {
    type Route = Route;

    fn routes(&self) -> &Routes<Route> {
        &self.routes
    }

    async fn handle(&self, call: Call<Route>) -> Reply {
        match call.route {
            Route::Status => Reply::ok(&self.status()),
            Route::History => Reply::ok(&history::history(&self.history)),
            Route::Pause => self.pause.pause(&call.identity.name).await,
            Route::Resume => self.pause.resume().await,
            Route::Replays => self.replays.list(),
            Route::StartReplay => self.replays.start(replays::StartBody::read(&call)),
            Route::Replay => self.replays.get(call.param("id").unwrap_or_default()),
            Route::StopReplay => self.replays.stop(call.param("id").unwrap_or_default()).await,
            Route::DeadLetters => self.dead_letters.list(&call).await,
            Route::Redrive => self.redrive.redrive(&call).await,
        }
    }
}

impl RelayApi {
    fn status(&self) -> Status {
        let seen = self.seen.borrow().clone();
        let confirmed = self.metrics.stream.confirmed_lsn.get();
        let mut s = status(
            &self.health,
            &self.slot,
            self.delivery,
            (confirmed > 0).then(|| Lsn(confirmed.unsigned_abs()).to_string()),
            self.metrics.stream.lag_seconds(),
            self.metrics.kafka.in_flight.get(),
            seen.as_ref(),
        );
        s.events_per_second = self.history.lock().ok().and_then(|m| m.samples.rate());
        s
    }
}

/// The status from its parts: pure.
fn status(
    health: &Health,
    slot: &str,
    delivery: &'static str,
    confirmed_here: Option<String>,
    lag_seconds: f64,
    in_flight: i64,
    seen: Option<&Observation>,
) -> Status {
    let halted = health.halted().map(str::to_owned);
    let holder = health.standby();
    let streaming = health.is_streaming();
    let paused_by = health.paused();
    let state = match (&halted, &holder) {
        (Some(_), _) => "halted",
        // A standby that takes over stays paused too: the pause is the slot's.
        (None, _) if paused_by.is_some() => "paused",
        (None, Some(_)) => "waiting",
        (None, None) if streaming => "streaming",
        (None, None) => "starting",
    };
    let slot_figures = seen.map(|o| &o.status).filter(|s| s.exists);
    let alarms = match seen {
        Some(o) if o.level != AlarmLevel::Ok => {
            o.reasons.iter().map(|r| Alarm { level: o.level, reason: r.clone(), runbook: runbook_of(r) }).collect()
        }
        _ => Vec::new(),
    };
    Status {
        state,
        paused_by,
        slot: slot.to_owned(),
        // What this process confirmed; else (waiting, or not yet) what the server says.
        confirmed_lsn: confirmed_here.or_else(|| slot_figures.and_then(|s| s.confirmed_flush_lsn.clone())),
        server_lsn: seen.map(|o| o.status.current_lsn.clone()).filter(|l| !l.is_empty()),
        lag_bytes: slot_figures.and_then(|s| s.unconfirmed_bytes),
        lag_seconds: streaming.then_some(lag_seconds),
        delivery,
        halted_reason: halted,
        slot_holder: holder,
        in_flight: streaming.then_some(in_flight),
        events_per_second: None,
        alarms,
    }
}

/// The runbook a reason names, else the WAL build-up one (as the alarm's log line does).
fn runbook_of(reason: &str) -> &'static str {
    use texts::runbook::{KAFKA_OUTAGE, LONG_TRANSACTION, SLOT_LOST, SLOT_WAL_BUILDUP, STANDBY};
    [KAFKA_OUTAGE, LONG_TRANSACTION, SLOT_LOST, STANDBY]
        .into_iter()
        .find(|r| reason.contains(r))
        .unwrap_or(SLOT_WAL_BUILDUP)
}

/// Starts the listener of `[admin]`: reads the tokens file and the TLS files (an error
/// there stops walpost at start, naming the line or file), binds, serves on its own
/// thread until `shutdown`.
pub(crate) fn start(
    admin: &AdminSettings,
    settings: &Settings,
    metrics: &Metrics,
    seen: watch::Receiver<Option<Observation>>,
    shutdown: watch::Receiver<bool>,
) -> Result<admin::Server, PipelineError> {
    let (tokens, tls) = listener_files(admin)?;
    let delivery = match settings.kafka.as_ref().map(|k| &k.delivery) {
        Some(Delivery::ExactlyOnce(_)) => "exactly-once",
        _ => "at-least-once",
    };
    let history = history::spawn(metrics.clone(), seen.clone(), shutdown.clone());
    let api = RelayApi {
        routes: Routes::new()
            .get("/api/v1/status", Route::Status)
            .get("/api/v1/status/history", Route::History)
            .post("/api/v1/pause", Route::Pause)
            .post("/api/v1/resume", Route::Resume)
            .get("/api/v1/replays", Route::Replays)
            .post("/api/v1/replays", Route::StartReplay)
            .get("/api/v1/replays/{id}", Route::Replay)
            .delete("/api/v1/replays/{id}", Route::StopReplay)
            .get("/api/v1/dead-letters", Route::DeadLetters)
            .post("/api/v1/dead-letters/redrive", Route::Redrive),
        health: metrics.health().clone(),
        metrics: metrics.clone(),
        seen,
        slot: settings.source.slot.clone(),
        delivery,
        pause: pause::PauseControl::new(
            settings.postgres.writer().clone(),
            settings.source.slot.clone(),
            metrics.health().clone(),
        ),
        replays: replays::Replays::new(settings.clone()),
        dead_letters: dead_letters::DeadLetters::new(
            settings.kafka.clone(),
            settings.postgres.writer().clone(),
            admin.show_payloads,
        ),
        redrive: redrive::Redriver::new(settings.clone()),
        history,
    };
    tracing::info!(tokens = tokens.len(), tls = tls.is_some(), "admin API: tokens file read");
    // Actions are audited in the database they act on, where the slot's lineage goes too.
    let audit = admin::TableAudit::new(settings.postgres.writer().clone(), AUDIT_SCHEMA, AUDIT_TABLE);
    admin::serve(admin.addr, tls, tokens, api, audit, shutdown)
        .map_err(|e| PipelineError::definite(ErrorKind::Host, e.to_string()))
}

/// The tokens file and the TLS pair of `[admin]`, read for either mode's listener: an
/// error stops walpost at start, naming the line or the file.
fn listener_files(admin: &AdminSettings) -> Result<(admin::Tokens, Option<SslAcceptor>), PipelineError> {
    let config = |text: String| PipelineError::definite(ErrorKind::Config, text);
    let tokens =
        admin::Tokens::load(&admin.tokens_file).map_err(|e| config(texts::admin::tokens_unusable(&e.to_string())))?;
    let tls = match &admin.tls {
        Some((cert, key)) => Some(admin::tls_acceptor(cert, key).map_err(|e| config(e.to_string()))?),
        None => None,
    };
    Ok((tokens, tls))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use slot_alarm::SlotStatus;

    use super::*;

    fn health() -> Health {
        Health::new(Duration::from_secs(30), Duration::from_secs(60))
    }

    fn observation(level: AlarmLevel, reasons: &[&str]) -> Observation {
        Observation {
            status: SlotStatus {
                slot: "walpost".into(),
                exists: true,
                plugin: Some("pgoutput".into()),
                active: true,
                active_pid: Some(7),
                wal_status: Some("reserved".into()),
                current_lsn: "0/3000060".into(),
                restart_lsn: Some("0/3000000".into()),
                confirmed_flush_lsn: Some("0/3000028".into()),
                retained_bytes: Some(96),
                unconfirmed_bytes: Some(56),
                safe_wal_size_bytes: None,
                max_slot_wal_keep_size: "-1".into(),
                max_slot_wal_keep_size_bytes: None,
                oldest_transaction: None,
                in_recovery: false,
                conflicting: false,
                invalidation_reason: None,
            },
            level,
            reasons: reasons.iter().map(|r| (*r).to_owned()).collect(),
        }
    }

    #[test]
    fn starting_knows_no_figures() {
        let s = status(&health(), "walpost", "at-least-once", None, 0.0, 0, None);
        assert_eq!(s.state, "starting");
        assert_eq!(
            (s.confirmed_lsn, s.server_lsn, s.lag_bytes, s.lag_seconds, s.in_flight),
            (None, None, None, None, None)
        );
        assert!(s.alarms.is_empty() && s.events_per_second.is_none());
    }

    #[test]
    fn streaming_with_the_monitors_figures_and_alarms() {
        let h = health();
        h.set_streaming(true);
        let reason = texts::alarm::kafka_silent(75.0);
        let seen = observation(AlarmLevel::Warning, &[&reason, "retained WAL 2 GiB is over the warning threshold"]);
        let s = status(&h, "walpost", "exactly-once", Some("0/3000050".into()), 1.5, 3, Some(&seen));
        assert_eq!(s.state, "streaming");
        assert_eq!(s.confirmed_lsn.as_deref(), Some("0/3000050"), "its own confirm wins");
        assert_eq!(s.server_lsn.as_deref(), Some("0/3000060"));
        assert_eq!((s.lag_bytes, s.lag_seconds, s.in_flight), (Some(56), Some(1.5), Some(3)));
        let runbooks: Vec<&str> = s.alarms.iter().map(|a| a.runbook).collect();
        assert_eq!(runbooks, [texts::runbook::KAFKA_OUTAGE, texts::runbook::SLOT_WAL_BUILDUP]);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["alarms"][0]["level"], "warning");
        assert_eq!(json["delivery"], "exactly-once");
    }

    #[test]
    fn a_standby_waits_and_a_halt_says_why() {
        let h = health();
        h.set_standby(Some("pid 42 on host a".into()));
        let s = status(&h, "walpost", "at-least-once", None, 9.0, 0, Some(&observation(AlarmLevel::Ok, &[])));
        assert_eq!(s.state, "waiting");
        assert_eq!(s.slot_holder.as_deref(), Some("pid 42 on host a"));
        assert_eq!(s.confirmed_lsn.as_deref(), Some("0/3000028"), "the holder's, from the server");
        assert_eq!(s.lag_seconds, None, "not this process's lag");
        h.set_halted("Kafka rejected event id=1".into());
        let s = status(&h, "walpost", "at-least-once", None, 0.0, 0, None);
        assert_eq!((s.state, s.halted_reason.as_deref()), ("halted", Some("Kafka rejected event id=1")));
    }

    #[test]
    fn a_paused_stream_says_by_whom() {
        let h = health();
        h.set_streaming(true);
        h.set_paused(Some("by ops since 2026-12-05 17:00:00+00".into()));
        let s = status(&h, "walpost", "at-least-once", None, 0.0, 0, None);
        assert_eq!((s.state, s.paused_by.as_deref()), ("paused", Some("by ops since 2026-12-05 17:00:00+00")));
        h.set_paused(None);
        let s = status(&h, "walpost", "at-least-once", None, 0.0, 0, None);
        assert_eq!((s.state, s.paused_by), ("streaming", None));
    }
}

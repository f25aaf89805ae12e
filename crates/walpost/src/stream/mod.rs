//! THE DATA PATH: slot -> decode -> route -> produce -> checkpoint -> confirm.
//!
//! [`run`] runs sessions until shutdown or a definite error. A session ([`session`](mod@session))
//! is one replication connection plus one produce window, started by [`start`]. A
//! transient error ends the session; [`run`] waits (capped exponential backoff, cut
//! short once PostgreSQL answers again after an outage: [`probe`]) and
//! starts a new one from the slot's confirmed position, telling it what the last
//! producer delivered ([`crate::kafka::DeliveryMemo`]) so nothing acknowledged is sent
//! twice by the same process. A definite error ends [`run`]. A slot held by another
//! process makes this instance a hot standby until it is released ([`takeover`]).
//!
//! Invariants:
//! - The flush LSN sent to the server comes only from the [`checkpoint`]: it never
//!   passes an unacknowledged record and never moves backwards.
//! - WAL is read only while the produce window has room (in-flight records and bytes
//!   under their limits), so memory is bounded whatever the backlog; status updates
//!   keep flowing meanwhile.
//! - Only INSERTs into the configured tables (and messages with a configured prefix)
//!   become records; a row that cannot be routed halts or goes to the dead-letter topic,
//!   never skipped silently.

pub(crate) mod checkpoint;
pub(crate) mod confirm;
pub(crate) mod decode;
pub(crate) mod live;
pub(crate) mod probe;
pub(crate) mod route;
pub(crate) mod session;
pub(crate) mod signal;
pub(crate) mod source;
pub(crate) mod start;
pub(crate) mod takeover;

use std::time::{Duration, Instant};

use backoff::Backoff;
use otlp::Exporter;
use replication::TargetSessionAttrs;
use tokio::sync::watch;

use crate::error::{ErrorKind, PipelineError};
use crate::kafka::DeliveryMemo;
use crate::postgres::lineage::Lineage;
use crate::postgres::topology;
use crate::settings::Settings;
use crate::telemetry::metrics::ReconnectCause;
use crate::telemetry::Metrics;
use session::{Culprit, Session, SessionEnd};
use start::Begun;

/// The wait before the first restart after a session that failed; it doubles at each
/// further failure, up to `max_backoff_secs`, and starts again here after a session
/// that lasted (or once PostgreSQL answers again).
const FIRST_RESTART_DELAY: Duration = Duration::from_millis(250);

/// Streams until shutdown (Ok) or a definite error; `spans`: the span exporter, if any.
pub(crate) async fn run(
    s: &Settings,
    metrics: &Metrics,
    spans: Option<&Exporter>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let mut backoff = Backoff::new(FIRST_RESTART_DELAY, s.stream.max_backoff);
    let mut memo = DeliveryMemo::default();
    let mut lineage = Lineage::default();
    let mut last_holder: Option<i32> = None;
    let mut no_standby = NoStandby::default();
    loop {
        let started = Instant::now();
        let (result, culprit) = session(s, metrics, spans, &mut memo, &mut lineage, &mut shutdown).await;
        metrics.health().set_streaming(false);
        let kafka_restart = culprit == Culprit::Kafka && matches!(&result, Err(e) if e.is_transient());
        if !kafka_restart {
            // Only a producer restart carries Kafka's silence over to the next session.
            metrics.health().set_waiting_for_acks(None);
        }
        match result {
            Ok(SessionEnd::Shutdown) => return Ok(()),
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) => {
                let standby_only = s.postgres.server.target_session_attrs == TargetSessionAttrs::Standby;
                if no_standby.gives_up(standby_only && topology::found_no_standby(&e), s.stream.no_standby_timeout) {
                    let hosts: Vec<String> = s.postgres.server.hosts.iter().map(|h| h.label()).collect();
                    let secs = s.stream.no_standby_timeout.as_secs();
                    let message = texts::standby::no_standby_found(&hosts.join(", "), secs);
                    return Err(PipelineError::definite(ErrorKind::Postgres, message).caused_by(e));
                }
                if started.elapsed() > Duration::from_secs(30) {
                    backoff.reset();
                }
                let e = if e.is_expected() {
                    // Another process holds the slot: a hot standby, normal.
                    tracing::debug!("{e}");
                    match takeover::wait_for_release(s, metrics, &mut last_holder, &mut shutdown).await {
                        takeover::Waited::Released => {
                            backoff.reset();
                            continue;
                        }
                        takeover::Waited::Shutdown => return Ok(()),
                        takeover::Waited::Failed(e) => e,
                    }
                } else {
                    e
                };
                let wait = backoff.next_delay();
                tracing::warn!(retry_in_ms = wait.as_millis() as u64, "{e}; reconnecting");
                metrics.stream.reconnect(match culprit {
                    Culprit::Postgres => ReconnectCause::Postgres,
                    Culprit::Kafka => ReconnectCause::Kafka,
                });
                let every = (culprit == Culprit::Postgres && probe::no_answer(&e)).then_some(probe::PROBE_EVERY);
                match probe::wait_to_retry(wait, every, || probe::postgres_answers(&s.postgres.server), &mut shutdown)
                    .await
                {
                    probe::Waited::Shutdown => return Ok(()),
                    probe::Waited::Answered => {
                        tracing::info!("PostgreSQL answers again: reconnecting now");
                        backoff.reset();
                    }
                    probe::Waited::Elapsed => {}
                }
            }
        }
    }
}

async fn session(
    s: &Settings,
    metrics: &Metrics,
    spans: Option<&Exporter>,
    memo: &mut DeliveryMemo,
    lineage: &mut Lineage,
    shutdown: &mut watch::Receiver<bool>,
) -> (Result<SessionEnd, PipelineError>, Culprit) {
    let begun = tokio::select! {
        begun = start::begin(s, metrics, memo, lineage) => begun,
        _ = shutdown.changed() => return (Ok(SessionEnd::Shutdown), Culprit::Postgres),
    };
    let (stream, start, window, wal_sender_timeout, exactly_once) = match begun {
        Ok(Begun::Streaming { stream, start, window, wal_sender_timeout, exactly_once }) => {
            (stream, start, window, wal_sender_timeout, exactly_once)
        }
        Ok(Begun::BackfillDone) => return (Ok(SessionEnd::Shutdown), Culprit::Postgres),
        Err(e) => return (Err(e), Culprit::Postgres),
    };
    if exactly_once.is_none() {
        memo.forget_confirmed(start);
    }
    let routing = match route::Routing::new(&s.source, metrics.stream.clone()) {
        Ok(r) => r,
        Err(e) => return (Err(e), Culprit::Postgres),
    };
    metrics.health().set_streaming(true);
    metrics.stream.active.set(1);
    let parts = session::Parts {
        stream,
        start,
        routing,
        window,
        frozen_after: session::frozen_after(wal_sender_timeout),
        exactly_once,
        tracer: spans.and_then(Exporter::tracer),
    };
    // begin() has opened the producer: the settings hold Kafka's.
    let kafka = match s.kafka() {
        Ok(kafka) => kafka,
        Err(e) => return (Err(e.into()), Culprit::Kafka),
    };
    Session::new(s, kafka, metrics, parts, memo).run(shutdown).await
}

/// Since when `target_session_attrs=standby` has found no standby, session after
/// session: a standby that was promoted never comes back as one, so past a bound walpost
/// stops and says to use `prefer-standby` instead of retrying forever.
#[derive(Debug, Default)]
struct NoStandby {
    since: Option<Instant>,
}

impl NoStandby {
    /// One failed session: whether it found no standby (`none_found`); `true` once that
    /// has lasted `limit` without a session that found one or failed otherwise.
    fn gives_up(&mut self, none_found: bool, limit: Duration) -> bool {
        self.gives_up_at(none_found, limit, Instant::now())
    }

    fn gives_up_at(&mut self, none_found: bool, limit: Duration, now: Instant) -> bool {
        if !none_found {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(now);
        now.saturating_duration_since(since) >= limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: after the standby was promoted, a walpost restarted with
    /// `target_session_attrs=standby` retried forever. Past the bound it gives up; any
    /// other outcome in between starts the count again.
    #[test]
    fn regression_no_standby_gives_up_after_the_bound_only() {
        let limit = Duration::from_secs(120);
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let mut n = NoStandby::default();
        assert!(!n.gives_up_at(true, limit, at(0)));
        assert!(!n.gives_up_at(true, limit, at(119)));
        assert!(n.gives_up_at(true, limit, at(120)));
        let mut n = NoStandby::default();
        assert!(!n.gives_up_at(true, limit, at(0)));
        assert!(!n.gives_up_at(false, limit, at(100)), "a standby answered, or another error");
        assert!(!n.gives_up_at(true, limit, at(130)));
        assert!(!n.gives_up_at(true, limit, at(249)));
        assert!(n.gives_up_at(true, limit, at(250)));
    }
}

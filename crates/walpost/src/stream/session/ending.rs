//! How a session ends: a shutdown or halt drains what is in flight and confirms what
//! was delivered; a restart closes the producer and remembers what Kafka has.

use std::time::{Duration, Instant};

use super::{refused_as_a_batch, Culprit, Session, Tag, LOG_TARGET, RESTART_FLUSH};
use crate::error::{ErrorKind, PipelineError};
use crate::kafka::sink::Sink;
use crate::kafka::Event;
use crate::stream::source::Source;

impl<R: Source, S: Sink> Session<'_, R, S> {
    /// Fails the session as frozen when this moment comes `frozen_after` or more after the
    /// previous beat. Beats come before each hand-over to librdkafka, not only at a
    /// turn's start: a process stopped in the middle of a burst resumes in it, with the
    /// socket's buffer full of WAL the standby has published meanwhile.
    pub(super) fn beat(&mut self) -> Result<(), PipelineError> {
        let now = Instant::now();
        let since = now.saturating_duration_since(self.last_beat);
        self.last_beat = now;
        if since < self.frozen_after {
            return Ok(());
        }
        self.frozen = true;
        Err(PipelineError::transient(ErrorKind::Session, format!(
            "walpost did not run for {} s (the process was stopped or starved); the slot may have passed to another instance meanwhile, so what was read and not yet acknowledged is dropped, not published late; reconnecting",
            since.as_secs()
        )))
    }

    /// Shutdown or halt: waits (bounded) for what is in flight, confirms what was
    /// delivered and closes the stream.
    pub(super) async fn finish(mut self, why: &str) {
        let fatal = self.window.producer_fatal();
        let confirmer = &mut self.confirmer;
        let left = self
            .window
            .drain(self.s.stream.shutdown_timeout, |event| {
                if let Event::Delivered { tag: Tag { txn: Some(txn), .. }, .. } = event {
                    let _ = confirmer.delivered(txn);
                }
            })
            .await;
        if !left.is_empty() && fatal.is_none() {
            tracing::warn!(target: LOG_TARGET,
                unacknowledged = left.len(),
                "Kafka did not acknowledge everything within the shutdown timeout; those events will be sent again on restart"
            );
        }
        match self.confirmer.send(&mut self.stream, false).await {
            Ok(()) => {
                tracing::info!(target: LOG_TARGET, confirmed = %self.confirmer.flush_lsn(), "{why}: confirmed position sent")
            }
            Err(e) => tracing::warn!(target: LOG_TARGET, "{why}: could not send the final position: {e}"),
        }
        self.stream.close().await;
        self.window.close(Duration::ZERO, |_| {}).await;
    }

    /// A transient error: closes the producer off the runtime (letting in-flight
    /// records finish, unless the process was frozen), confirms what got delivered if
    /// the stream still works, and remembers what Kafka has for the next session.
    /// Exactly-once: the open Kafka transaction is aborted instead (nothing of it is read;
    /// the next session starts from the committed progress), and `Some` is returned when
    /// the abort says another instance fenced this one.
    pub(super) async fn restart(mut self) -> Option<PipelineError> {
        if let Some(mut eos) = self.exactly_once.take() {
            let fenced = eos.abort(self.window.sink()).await.err();
            self.window.close(Duration::ZERO, |_| {}).await;
            let _ = tokio::time::timeout(Duration::from_secs(2), self.stream.close()).await;
            return fenced;
        }
        // In-flight records may still be acknowledged when PostgreSQL ended the session;
        // not when Kafka did, nor after a freeze (they must not be published late).
        let flush = if self.frozen || self.culprit == Culprit::Kafka { Duration::ZERO } else { RESTART_FLUSH };
        let dead_letters = self.policy.dead_letters();
        let (confirmer, not_acknowledged, memo) = (&mut self.confirmer, &mut self.not_acknowledged, &mut *self.memo);
        let left = self
            .window
            .close(flush, |event| match event {
                Event::Delivered { tag, .. } => {
                    if let Some(txn) = tag.txn {
                        let _ = confirmer.delivered(txn);
                    }
                }
                Event::Rejected { tag, rejection, alone, .. } => {
                    // The other records of a refused batch: alone next time, too.
                    if dead_letters && refused_as_a_batch(&rejection, alone) {
                        memo.suspect(tag.id);
                    }
                    not_acknowledged.push(tag.id)
                }
                Event::Failed { tag, .. } => not_acknowledged.push(tag.id),
            })
            .await;
        self.not_acknowledged.extend(left.iter().map(|t| t.id));
        // Unfinished replays run again in the next session.
        self.not_acknowledged.extend(self.running_replays.iter().map(|(_, id)| *id));
        if !self.frozen {
            let _ = tokio::time::timeout(Duration::from_secs(2), self.confirmer.send(&mut self.stream, false)).await;
        }
        self.memo.remember(self.confirmer.checkpoint.pending(), &self.not_acknowledged);
        let _ = tokio::time::timeout(Duration::from_secs(2), self.stream.close()).await;
        None
    }
}

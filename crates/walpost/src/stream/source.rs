//! What a session reads WAL from and confirms positions to: the replication stream
//! ([`ReplicationStream`]), or a test's in-memory one. With [`crate::kafka::sink::Sink`]
//! on the other side, the session's loop can be driven without a server
//! (`stream::session` tests).

use std::future::Future;

use pgoutput::wire::ReplicationMessage;
use pgoutput::Lsn;
use replication::ReplicationStream;

/// See the module docs. The methods mean what [`ReplicationStream`]'s do.
pub(crate) trait Source {
    /// The next message; `Ok(None)` when the server ended the stream. Cancel-safe.
    fn next(&mut self) -> impl Future<Output = Result<Option<ReplicationMessage>, replication::Error>>;
    /// The next message if it is already buffered, without waiting.
    fn try_next(&mut self) -> Result<Option<Option<ReplicationMessage>>, replication::Error>;
    /// A standby status update (`flush`: what the slot may discard up to).
    fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        apply: Lsn,
        reply: bool,
    ) -> impl Future<Output = Result<(), replication::Error>>;
    /// Ends the stream.
    fn close(self) -> impl Future<Output = ()>;
}

impl Source for ReplicationStream {
    fn next(&mut self) -> impl Future<Output = Result<Option<ReplicationMessage>, replication::Error>> {
        ReplicationStream::next(self)
    }

    fn try_next(&mut self) -> Result<Option<Option<ReplicationMessage>>, replication::Error> {
        ReplicationStream::try_next(self)
    }

    fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        apply: Lsn,
        reply: bool,
    ) -> impl Future<Output = Result<(), replication::Error>> {
        ReplicationStream::send_status(self, write, flush, apply, reply)
    }

    fn close(self) -> impl Future<Output = ()> {
        ReplicationStream::close(self)
    }
}

/// An in-memory source for the session's unit tests: the test pushes messages, reads
/// the status updates the session sent, and can end the stream.
#[cfg(test)]
pub(crate) mod memory {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use tokio::sync::Notify;

    use super::*;

    /// Checks a flush position as it is sent: `Err` names what it confirmed too early.
    pub(crate) type Witness = Box<dyn Fn(Lsn) -> Result<(), String> + Send>;

    #[derive(Default)]
    struct State {
        messages: VecDeque<ReplicationMessage>,
        /// Every flush position sent, in order.
        flushed: Vec<Lsn>,
        witness: Option<Witness>,
        /// What the witness objected to.
        objections: Vec<String>,
    }

    impl std::fmt::Debug for State {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("State").field("unread", &self.messages.len()).field("flushed", &self.flushed).finish()
        }
    }

    /// See the module docs. Clones share the stream.
    #[derive(Debug, Clone, Default)]
    pub(crate) struct MemorySource {
        state: Arc<Mutex<State>>,
        wake: Arc<Notify>,
    }

    impl MemorySource {
        fn state(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        pub(crate) fn push(&self, m: ReplicationMessage) {
            self.state().messages.push_back(m);
            self.wake.notify_one();
        }

        /// The flush positions the session sent, in order.
        pub(crate) fn flushed(&self) -> Vec<Lsn> {
            self.state().flushed.clone()
        }

        pub(crate) fn last_flush(&self) -> Option<Lsn> {
            self.state().flushed.last().copied()
        }

        /// Every flush position sent from now on is checked by `witness` at the moment
        /// it is sent ([`MemorySource::objections`]).
        pub(crate) fn witness(&self, witness: Witness) {
            self.state().witness = Some(witness);
        }

        /// What the witness objected to, in order.
        pub(crate) fn objections(&self) -> Vec<String> {
            self.state().objections.clone()
        }
    }

    impl Source for MemorySource {
        async fn next(&mut self) -> Result<Option<ReplicationMessage>, replication::Error> {
            loop {
                {
                    let mut s = self.state();
                    if let Some(m) = s.messages.pop_front() {
                        return Ok(Some(m));
                    }
                }
                self.wake.notified().await;
            }
        }

        fn try_next(&mut self) -> Result<Option<Option<ReplicationMessage>>, replication::Error> {
            let mut s = self.state();
            // Never the end of the stream: the model server keeps it open.
            Ok(s.messages.pop_front().map(Some))
        }

        async fn send_status(
            &mut self,
            _write: Lsn,
            flush: Lsn,
            _apply: Lsn,
            _reply: bool,
        ) -> Result<(), replication::Error> {
            let mut s = self.state();
            s.flushed.push(flush);
            if let Some(Err(objection)) = s.witness.as_ref().map(|w| w(flush)) {
                s.objections.push(objection);
            }
            Ok(())
        }

        async fn close(self) {}
    }
}

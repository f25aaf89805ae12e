//! When records go to Kafka at once rather than after `linger.ms`: the live-send policy.
//!
//! A backlog is sent in batches of up to `linger.ms` (fewer, larger requests: less broker
//! CPU per record). A transaction the server sent within [`LIVE_WITHIN_MS`] of its commit
//! (both times on the server's clock, so no skew with walpost's) was read live: its
//! records, and records handed over after it while the stream stays live, are sent once
//! nothing read is still buffered behind them, not after `linger.ms`.
//!
//! Pure: the session tells it what happened in a turn of its loop and asks whether to
//! send now.

/// Read within this time of its commit: live, not from a backlog.
pub(crate) const LIVE_WITHIN_MS: i64 = 1_000;

/// See the module docs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct LivePolicy {
    /// The last transaction with records was read live.
    live: bool,
    /// Live records were handed over and not sent at once yet.
    pending: bool,
}

impl LivePolicy {
    /// A transaction with records committed; the server sent its commit `lag_ms` after
    /// the commit time.
    pub(crate) fn commit(&mut self, lag_ms: i64) {
        self.live = lag_ms < LIVE_WITHIN_MS;
        // Its first records may have been handed over in earlier turns.
        self.pending |= self.live;
    }

    /// The end of a loop turn: whether records were handed over in it, and whether
    /// reading stopped with messages still buffered. `true`: send now.
    pub(crate) fn end_of_turn(&mut self, handed_over: bool, more_buffered: bool) -> bool {
        if self.live && handed_over {
            self.pending = true;
        }
        if self.pending && !more_buffered {
            self.pending = false;
            return true;
        }
        false
    }

    /// Whether the stream reads live now (the last transaction with records was).
    pub(crate) fn is_live(&self) -> bool {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlog_lingers_and_a_live_commit_is_sent_once_nothing_waits_behind_it() {
        let mut p = LivePolicy::default();
        assert!(!p.end_of_turn(true, false), "not live yet: linger");
        p.commit(5_000);
        assert!(!p.is_live() && !p.end_of_turn(true, false), "a backlog transaction lingers");
        p.commit(10);
        assert!(p.is_live());
        assert!(!p.end_of_turn(false, true), "more is buffered: not yet");
        assert!(p.end_of_turn(false, false), "the buffer is drained: send now");
        assert!(!p.end_of_turn(false, false), "sent once");
    }

    /// Records handed over while live, in a turn that stopped with more read behind them,
    /// are remembered and sent at the end of the first turn that leaves nothing buffered.
    #[test]
    fn live_records_of_a_turn_that_stopped_mid_burst_are_remembered() {
        let mut p = LivePolicy::default();
        p.commit(0);
        assert!(p.end_of_turn(true, false));
        assert!(!p.end_of_turn(true, true), "mid-burst");
        assert!(!p.end_of_turn(false, true));
        assert!(p.end_of_turn(false, false), "remembered");
        p.commit(2_000);
        assert!(!p.end_of_turn(true, false), "back to a backlog: linger again");
    }
}

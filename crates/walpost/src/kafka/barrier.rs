//! When a record may be handed to the producer: the barriers of the produce window.
//!
//! Two hazards are kept out, both about a partition that has never taken a record from
//! this producer:
//!
//! 1. A topic the broker has just created on first use can take a later produce request
//!    and refuse an earlier one for good (KAFKA-15591), which would reorder an
//!    aggregate. So the first record for a topic goes alone *in its topic* (nothing else
//!    of the topic in flight, nothing of it sent after it until its report). First
//!    records of different new topics go out together: a burst of new topics costs one
//!    round trip, not one each (a burst of 300 new topics must not take 300 round trips).
//! 2. A partition where the broker holds no state for this producer id accepts a batch
//!    with any sequence number. When the partition's first batch fails with a retriable
//!    error (`NOT_LEADER_OR_FOLLOWER` while the broker is still creating the partition's
//!    log, or while leadership moves) and a later batch of the same partition succeeds,
//!    librdkafka reports the first one delivered ("implicitly acked by subsequent batch
//!    success") although it was never written: the record is lost and its WAL position
//!    confirmed (seen as one event of a new topic missing in a test run under CPU
//!    load; confluent-kafka-go#921 reports the same during leader elections). So the first
//!    record for a *partition* goes alone in its partition: nothing else for that
//!    partition is handed over until its report, and a failed first record is retried by
//!    librdkafka with nothing behind it to be acknowledged in its place.
//!
//! A partition counts as settled from a delivered record of it for [`SETTLED_MINUTES`]
//! (a broker forgets a producer id's state on a partition it has not written to for
//! `producer.id.expiration.ms`, a day by default; re-settling hourly costs one round
//! trip per partition per hour). What counts as known is kept per producer: a new
//! producer has a new producer id and starts with nothing settled.
//!
//! Pure bookkeeping, no I/O; the window asks [`Barriers::gate`] before each record and
//! tells [`Barriers::answered`] each report.

use std::collections::HashMap;
use std::sync::Arc;

/// How long a delivered record keeps its partition settled.
pub(crate) const SETTLED_MINUTES: u32 = 60;

/// Topics remembered before the set is cleared (then each costs a round trip again).
pub(crate) const MAX_SETTLED_TOPICS: usize = 10_000;

/// Where a record will go, as far as it is known before it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Partition `p`: given by the record, or what the partitioner picks for its key.
    Partition(i32),
    /// One of this many partitions, picked at random (a random partitioner).
    AnyOf(i32),
    /// Not known: the topic's partition count was not seen yet.
    Unknown,
}

/// How a record may go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Nothing stands in its way.
    Open,
    /// The first record for its partition: nothing else for the partition follows it
    /// until its report.
    FirstInPartition(i32),
    /// The first record for its topic: nothing else of the topic follows it until its
    /// report.
    FirstInTopic,
    /// Alone: only with nothing else in flight, and nothing after it until its report.
    Alone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartitionState {
    FirstInFlight,
    /// Settled by a record delivered at this minute of the window's clock.
    Settled(u32),
}

#[derive(Debug, Default)]
struct TopicBarrier {
    /// A record of the topic was delivered: it exists.
    known: bool,
    /// Its first record is in flight.
    first_in_flight: bool,
    partitions: HashMap<i32, PartitionState, foldhash::fast::RandomState>,
}

impl TopicBarrier {
    fn in_flight(&self) -> bool {
        self.first_in_flight || self.partitions.values().any(|p| *p == PartitionState::FirstInFlight)
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Barriers {
    /// foldhash, not SipHash: looked up for every record.
    topics: HashMap<Arc<str>, TopicBarrier, foldhash::fast::RandomState>,
    /// Minutes since the window was made, as of its last clock reading.
    minute: u32,
}

impl Barriers {
    /// The window's clock moved on (`minute`: minutes since it was made).
    pub(crate) fn set_minute(&mut self, minute: u32) {
        self.minute = minute;
    }

    /// How a record for `topic` at `placement` may go; `None`: it must wait for a
    /// report. `alone`: the caller wants it alone anyway; `in_flight`: records are in
    /// flight.
    pub(crate) fn gate(&self, topic: &str, placement: Placement, alone: bool, in_flight: bool) -> Option<Gate> {
        let single = || (!in_flight).then_some(Gate::Alone);
        if alone {
            return single();
        }
        let known = match self.topics.get(topic) {
            None => return Some(Gate::FirstInTopic),
            Some(t) if !t.known => return (!t.first_in_flight).then_some(Gate::FirstInTopic),
            Some(t) => t,
        };
        match placement {
            Placement::Unknown => single(),
            Placement::AnyOf(n) => {
                let settled = (0..n).all(|p| self.is_settled(known.partitions.get(&p)));
                if settled {
                    Some(Gate::Open)
                } else {
                    single()
                }
            }
            Placement::Partition(p) => match known.partitions.get(&p) {
                Some(PartitionState::FirstInFlight) => None,
                state if self.is_settled(state) => Some(Gate::Open),
                _ => Some(Gate::FirstInPartition(p)),
            },
        }
    }

    fn is_settled(&self, state: Option<&PartitionState>) -> bool {
        matches!(state, Some(PartitionState::Settled(at)) if self.minute.saturating_sub(*at) < SETTLED_MINUTES)
    }

    /// A record went with `gate`.
    pub(crate) fn sent(&mut self, topic: &Arc<str>, gate: Gate) {
        match gate {
            Gate::FirstInPartition(p) => {
                if let Some(known) = self.topics.get_mut(&**topic) {
                    known.partitions.insert(p, PartitionState::FirstInFlight);
                }
            }
            Gate::FirstInTopic => self.entry(topic).first_in_flight = true,
            Gate::Open | Gate::Alone => {}
        }
    }

    /// The topic's entry, made if missing (the set forgets settled topics past
    /// [`MAX_SETTLED_TOPICS`], never one with a first record in flight).
    fn entry(&mut self, topic: &Arc<str>) -> &mut TopicBarrier {
        if !self.topics.contains_key(&**topic) && self.topics.len() >= MAX_SETTLED_TOPICS {
            self.topics.retain(|_, t| t.in_flight());
        }
        self.topics.entry(topic.clone()).or_default()
    }

    /// The report of a record sent with `gate`: `delivered` is the partition Kafka
    /// wrote it to (`None`: not delivered).
    pub(crate) fn answered(&mut self, topic: &Arc<str>, gate: Gate, delivered: Option<i32>) {
        if gate == Gate::Open {
            return;
        }
        if let Some(t) = self.topics.get_mut(&**topic) {
            match gate {
                Gate::FirstInPartition(p) if t.partitions.get(&p) == Some(&PartitionState::FirstInFlight) => {
                    t.partitions.remove(&p);
                }
                Gate::FirstInTopic => t.first_in_flight = false,
                _ => {}
            }
        }
        let Some(partition) = delivered else { return };
        let minute = self.minute;
        let t = self.entry(topic);
        t.known = true;
        t.partitions.insert(partition, PartitionState::Settled(minute));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str) -> Arc<str> {
        Arc::from(name)
    }

    #[test]
    fn a_new_topic_goes_first_in_its_topic_then_each_partition_first_on_its_own() {
        let t = topic("orders");
        let mut b = Barriers::default();
        assert_eq!(b.gate(&t, Placement::Unknown, false, true), Some(Gate::FirstInTopic), "beside other topics");
        b.sent(&t, Gate::FirstInTopic);
        assert_eq!(b.gate(&t, Placement::Unknown, false, true), None, "nothing of the topic follows its first");
        let u = topic("payments");
        assert_eq!(b.gate(&u, Placement::Unknown, false, true), Some(Gate::FirstInTopic), "another new topic goes too");
        b.answered(&t, Gate::FirstInTopic, Some(0));
        assert_eq!(b.gate(&t, Placement::Partition(0), false, true), Some(Gate::Open), "its partition is settled");
        assert_eq!(b.gate(&t, Placement::Partition(2), false, true), Some(Gate::FirstInPartition(2)));
        b.sent(&t, Gate::FirstInPartition(2));
        assert_eq!(b.gate(&t, Placement::Partition(2), false, true), None, "nothing follows a partition's first");
        assert_eq!(b.gate(&t, Placement::Partition(1), false, true), Some(Gate::FirstInPartition(1)));
        b.answered(&t, Gate::FirstInPartition(2), Some(2));
        assert_eq!(b.gate(&t, Placement::Partition(2), false, true), Some(Gate::Open));
    }

    #[test]
    fn a_first_record_not_delivered_leaves_its_partition_unsettled() {
        let t = topic("orders");
        let mut b = Barriers::default();
        b.answered(&t, Gate::Alone, Some(0));
        b.sent(&t, Gate::FirstInPartition(1));
        b.answered(&t, Gate::FirstInPartition(1), None);
        assert_eq!(b.gate(&t, Placement::Partition(1), false, true), Some(Gate::FirstInPartition(1)));
        // A topic's first record that failed does not make the topic known.
        let u = topic("payments");
        b.sent(&u, Gate::FirstInTopic);
        b.answered(&u, Gate::FirstInTopic, None);
        assert_eq!(b.gate(&u, Placement::Partition(0), false, true), Some(Gate::FirstInTopic));
    }

    #[test]
    fn the_set_forgets_settled_topics_never_one_in_flight() {
        let mut b = Barriers::default();
        let waiting = topic("waiting");
        b.sent(&waiting, Gate::FirstInTopic);
        for i in 0..MAX_SETTLED_TOPICS + 5 {
            let t = topic(&format!("t{i}"));
            b.answered(&t, Gate::FirstInTopic, Some(0));
        }
        assert!(b.topics.len() <= MAX_SETTLED_TOPICS);
        assert_eq!(b.gate(&waiting, Placement::Unknown, false, true), None, "its first record is still in flight");
    }

    #[test]
    fn settled_partitions_expire_and_random_placements_wait_for_every_partition() {
        let t = topic("orders");
        let mut b = Barriers::default();
        b.answered(&t, Gate::Alone, Some(0));
        b.set_minute(SETTLED_MINUTES - 1);
        assert_eq!(b.gate(&t, Placement::Partition(0), false, true), Some(Gate::Open));
        b.set_minute(SETTLED_MINUTES);
        assert_eq!(b.gate(&t, Placement::Partition(0), false, true), Some(Gate::FirstInPartition(0)));
        b.answered(&t, Gate::FirstInPartition(0), Some(0));
        assert_eq!(b.gate(&t, Placement::AnyOf(2), false, true), None, "partition 1 is not settled: alone");
        assert_eq!(b.gate(&t, Placement::AnyOf(2), false, false), Some(Gate::Alone));
        b.answered(&t, Gate::Alone, Some(1));
        assert_eq!(b.gate(&t, Placement::AnyOf(2), false, true), Some(Gate::Open));
        assert_eq!(b.gate(&t, Placement::Partition(1), true, true), None, "marked alone: waits");
    }
}

//! The ingest's decisions, without I/O: which records a batch takes, when it is written,
//! and where each partition stands. `inbox/mod.rs` does what this says against Kafka and
//! PostgreSQL.
//!
//! Invariants (the property test below drives them through random rebalances):
//! - a partition's stored offset only moves to one past a record of its batch, written in
//!   the same transaction as that record (stored, counted a duplicate, or rejected): an
//!   offset never passes a record that was not stored;
//! - only partitions this instance owns are taken, and every record of them is: one
//!   below the partition's stored offset means the log was rewound under the consumer (a
//!   topic deleted and created again, an offset reset): it is stored (event ids dedupe
//!   what was stored before), never skipped, and the partition's stored offset is set
//!   back with it;
//! - a revocation is answered only after the batch holding the partition's records is
//!   written ([`Ingest::revoke`] needs an empty batch), so the next owner reads the
//!   offsets this instance wrote;
//! - offsets never move backwards except with a rewind ([`Ingest::committed`] keeps the
//!   larger; the store writes a rewound partition's offset as it is).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::copy::CopyRows;
use crate::record::{fields, Invalid, Record};
use crate::settings::{BatchLimits, HeaderNames, OnInvalid};

/// A topic partition.
pub(crate) type Partition = (Arc<str>, i32);

/// A record the inbox refuses, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) topic: Arc<str>,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) why: Invalid,
}

/// What became of an offered record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Offer {
    /// In the batch (or in its rejected rows).
    Taken,
    /// Taken, and below the partition's stored offset (`stored`): the log was rewound
    /// (the topic re-created, an offset reset). Its offsets are written as they are.
    Rewound { stored: i64 },
    /// Of a partition this instance does not own (revoked): its next owner reads it.
    NotOwned,
    /// Invalid, with `on_invalid = halt`: write the batch, then stop. Not in the batch.
    Halt(Refused),
}

/// One PostgreSQL transaction's worth of records.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) rows: CopyRows,
    pub(crate) rejected: Vec<Refused>,
    /// The next offset of each partition once this batch is written.
    pub(crate) offsets: BTreeMap<Partition, i64>,
    /// Partitions whose log was rewound in this batch: their offsets may go back.
    pub(crate) rewound: std::collections::BTreeSet<Partition>,
    /// Records taken per topic (stored or duplicates; the store tells which).
    pub(crate) taken: BTreeMap<Arc<str>, u64>,
    /// Bytes of the records taken (key, headers, value): the batch's memory, bounded by
    /// `batch_max_bytes`.
    pub(crate) bytes: usize,
    /// The earliest record timestamp in the batch (ms since the Unix epoch), for latency.
    pub(crate) oldest_timestamp_ms: Option<i64>,
    records: usize,
    started: Option<Instant>,
}

impl Batch {
    #[cfg(test)]
    pub(crate) fn records(&self) -> usize {
        self.records
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records == 0
    }
}

/// The ingest's state: owned partitions and the open batch.
#[derive(Debug)]
pub(crate) struct Ingest {
    /// Owned partitions and their stored next offset.
    owned: HashMap<Partition, i64>,
    batch: Batch,
    limits: BatchLimits,
    names: HeaderNames,
    max_value_bytes: usize,
    on_invalid: OnInvalid,
}

impl Ingest {
    pub(crate) fn new(limits: BatchLimits, names: HeaderNames, max_value_bytes: usize, on_invalid: OnInvalid) -> Self {
        Ingest { owned: HashMap::new(), batch: Batch::default(), limits, names, max_value_bytes, on_invalid }
    }

    /// The partition is now this instance's, with `next` the stored offset it reads from.
    pub(crate) fn assign(&mut self, p: Partition, next: i64) {
        self.owned.insert(p, next);
    }

    /// The partition is no longer this instance's. Call with an empty batch (write it
    /// first): a record left in it would be written after the next owner started.
    pub(crate) fn revoke(&mut self, p: &Partition) -> Result<(), &'static str> {
        if !self.batch.is_empty() {
            return Err("revoke with records in the batch: write the batch first");
        }
        self.owned.remove(p);
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn owns(&self, p: &Partition) -> bool {
        self.owned.contains_key(p)
    }

    /// The stored next offset of an owned partition.
    #[cfg(test)]
    pub(crate) fn stored(&self, p: &Partition) -> Option<i64> {
        self.owned.get(p).copied()
    }

    /// Offers a record read from Kafka.
    pub(crate) fn offer(&mut self, r: &Record, now: Instant) -> Offer {
        let p: Partition = (r.topic.clone(), r.partition);
        let Some(&stored) = self.owned.get(&p) else { return Offer::NotOwned };
        let next = self.batch.offsets.get(&p).copied().unwrap_or(stored);
        let rewound = r.offset < next;
        match fields(r, &self.names, self.max_value_bytes) {
            Ok(f) => {
                self.batch.rows.push(r, &f);
                self.batch.bytes += r.bytes();
            }
            Err(why) => {
                let refused = Refused { topic: r.topic.clone(), partition: r.partition, offset: r.offset, why };
                if self.on_invalid == OnInvalid::Halt {
                    return Offer::Halt(refused);
                }
                self.batch.rejected.push(refused);
            }
        }
        if rewound {
            self.batch.rewound.insert(p.clone());
        }
        self.batch.offsets.insert(p, r.offset.saturating_add(1));
        *self.batch.taken.entry(r.topic.clone()).or_default() += 1;
        self.batch.records += 1;
        self.batch.started.get_or_insert(now);
        if let Some(t) = r.timestamp_ms.filter(|t| *t > 0) {
            self.batch.oldest_timestamp_ms = Some(self.batch.oldest_timestamp_ms.map_or(t, |o| o.min(t)));
        }
        if rewound {
            Offer::Rewound { stored: next }
        } else {
            Offer::Taken
        }
    }

    /// The batch is at a limit of records or bytes: write it now.
    pub(crate) fn full(&self) -> bool {
        self.batch.records >= self.limits.max_records || self.batch.bytes >= self.limits.max_bytes
    }

    /// When the open batch must be written at the latest (`None`: it is empty).
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.batch.started.map(|t| t + self.limits.max_wait)
    }

    /// The batch to write; the next one starts empty.
    pub(crate) fn take(&mut self) -> Batch {
        std::mem::take(&mut self.batch)
    }

    /// `batch` is committed: its partitions that are still owned stand at its offsets.
    pub(crate) fn committed(&mut self, batch: &Batch) {
        for (p, next) in &batch.offsets {
            if let Some(stored) = self.owned.get_mut(p) {
                *stored = if batch.rewound.contains(p) { *next } else { (*stored).max(*next) };
            }
        }
    }

    /// How long an empty wait may last before the batch's deadline.
    pub(crate) fn wait(&self, now: Instant, idle: Duration) -> Duration {
        self.deadline().map_or(idle, |d| d.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;

    fn rec(topic: &Arc<str>, partition: i32, offset: i64, with_id: bool) -> Record {
        let headers = if with_id {
            vec![(Bytes::from_static(b"id"), Some(Bytes::from(format!("{topic}-{partition}-{offset}"))))]
        } else {
            Vec::new()
        };
        Record {
            topic: topic.clone(),
            partition,
            offset,
            key: None,
            value: Some(Bytes::from_static(b"{}")),
            headers,
            timestamp_ms: None,
        }
    }

    fn ingest(on_invalid: OnInvalid) -> Ingest {
        let limits = BatchLimits { max_records: 3, max_bytes: 1 << 20, max_wait: Duration::from_millis(10) };
        Ingest::new(limits, HeaderNames::default(), 1 << 20, on_invalid)
    }

    #[test]
    fn a_batch_takes_owned_new_records_and_knows_its_offsets() {
        let t: Arc<str> = "t".into();
        let mut i = ingest(OnInvalid::Reject);
        let now = Instant::now();
        assert_eq!(i.offer(&rec(&t, 0, 0, true), now), Offer::NotOwned);
        i.assign((t.clone(), 0), 5);
        assert_eq!(i.offer(&rec(&t, 0, 5, true), now), Offer::Taken);
        assert_eq!(i.offer(&rec(&t, 0, 8, false), now), Offer::Taken, "rejected rows count too");
        assert!(!i.full());
        assert_eq!(i.deadline(), Some(now + Duration::from_millis(10)));
        assert!(i.revoke(&(t.clone(), 0)).is_err(), "a revoke waits for the batch");
        let b = i.take();
        assert_eq!((b.records(), b.rows.rows(), b.rejected.len()), (2, 1, 1));
        assert_eq!(b.offsets.get(&(t.clone(), 0)), Some(&9));
        assert!(b.rewound.is_empty());
        i.committed(&b);
        assert_eq!(i.stored(&(t.clone(), 0)), Some(9));
        let stale = Batch { offsets: BTreeMap::from([((t.clone(), 0), 3)]), ..Batch::default() };
        i.committed(&stale);
        assert_eq!(i.stored(&(t.clone(), 0)), Some(9), "never backwards without a rewind");
        assert!(i.revoke(&(t.clone(), 0)).is_ok());
        assert!(!i.owns(&(t, 0)));
    }

    /// A log rewound under the consumer (topic re-created): its records are stored, never
    /// skipped as "stored before", and the partition's offset goes back with them.
    #[test]
    fn regression_a_rewound_log_is_stored_not_skipped() {
        let t: Arc<str> = "t".into();
        let mut i = ingest(OnInvalid::Reject);
        i.assign((t.clone(), 0), 5_000);
        assert_eq!(i.offer(&rec(&t, 0, 0, true), Instant::now()), Offer::Rewound { stored: 5_000 });
        assert_eq!(i.offer(&rec(&t, 0, 1, true), Instant::now()), Offer::Taken);
        let b = i.take();
        assert_eq!((b.rows.rows(), b.offsets.get(&(t.clone(), 0))), (2, Some(&2)));
        assert!(b.rewound.contains(&(t.clone(), 0)));
        i.committed(&b);
        assert_eq!(i.stored(&(t, 0)), Some(2));
    }

    /// Regression: a batch was full at `batch_max_bytes` of values alone, so records with
    /// large keys and small values (500 KB keys while the inbox's tables were locked)
    /// filled 2,000-record batches holding a gigabyte. Keys and headers count now.
    #[test]
    fn regression_a_batch_is_bounded_by_its_keys_and_headers_too() {
        let t: Arc<str> = "t".into();
        let limits = BatchLimits { max_records: 2_000, max_bytes: 1 << 20, max_wait: Duration::from_millis(10) };
        let mut i = Ingest::new(limits, HeaderNames::default(), 1 << 20, OnInvalid::Reject);
        i.assign((t.clone(), 0), 0);
        let mut r = rec(&t, 0, 0, true);
        r.key = Some(Bytes::from(vec![b'k'; 300 << 10]));
        for offset in 0..4 {
            r.offset = offset;
            assert!(!i.full(), "{offset} records of 300 KiB keys");
            assert_eq!(i.offer(&r, Instant::now()), Offer::Taken);
        }
        assert!(i.full(), "4 records of 300 KiB keys are over 1 MiB");
        assert!(i.take().bytes > 1200 << 10);
        // Headers count as well.
        let mut r = rec(&t, 0, 4, true);
        r.headers.push((Bytes::from_static(b"big"), Some(Bytes::from(vec![b'h'; 1 << 20]))));
        assert_eq!(i.offer(&r, Instant::now()), Offer::Taken);
        assert!(i.full());
    }

    #[test]
    fn halt_mode_leaves_the_invalid_record_out_of_the_batch() {
        let t: Arc<str> = "t".into();
        let mut i = ingest(OnInvalid::Halt);
        i.assign((t.clone(), 0), 0);
        assert_eq!(i.offer(&rec(&t, 0, 0, true), Instant::now()), Offer::Taken);
        let Offer::Halt(refused) = i.offer(&rec(&t, 0, 1, false), Instant::now()) else { panic!("no halt") };
        assert_eq!((refused.offset, refused.why.code()), (1, "no_event_id"));
        let b = i.take();
        assert_eq!(b.offsets.get(&(t, 0)), Some(&1), "the stored offset stops before it");
    }

    #[derive(Debug, Clone)]
    enum Event {
        /// The consumer delivers the next record of a partition (maybe without an id).
        Deliver {
            partition: i32,
            with_id: bool,
        },
        /// A rebalance takes the partition away (and later gives it back).
        Revoke {
            partition: i32,
        },
        Assign {
            partition: i32,
        },
        /// The batch's deadline passed.
        Tick,
        /// The write of the open batch fails (its transaction rolls back) and the
        /// instance restarts: owned partitions are assigned again from the store.
        CrashBeforeCommit,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            6 => (0..3i32, prop::bool::weighted(0.9)).prop_map(|(partition, with_id)| Event::Deliver { partition, with_id }),
            1 => (0..3i32).prop_map(|partition| Event::Revoke { partition }),
            1 => (0..3i32).prop_map(|partition| Event::Assign { partition }),
            1 => Just(Event::Tick),
            1 => Just(Event::CrashBeforeCommit),
        ]
    }

    /// The store: rows and rejected offsets by partition, and offsets, as PostgreSQL
    /// holds them after each committed transaction.
    #[derive(Debug, Default)]
    struct Store {
        rows: BTreeSet<(i32, i64)>,
        offsets: BTreeMap<i32, i64>,
    }

    impl Store {
        fn commit(&mut self, b: &Batch, delivered: &[(i32, i64)]) {
            // What the batch holds: the delivered offsets below its next offset per partition
            // that were taken into it (the test tracks them in `delivered`).
            for &(p, o) in delivered {
                self.rows.insert((p, o));
            }
            for ((_, p), next) in &b.offsets {
                let e = self.offsets.entry(*p).or_insert(0);
                *e = (*e).max(*next);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        /// Whatever the rebalances and crashes, the stored offset of a partition never passes
        /// a delivered record that is not stored, and a record is stored once.
        #[test]
        fn stored_offsets_never_pass_an_unstored_record(events in prop::collection::vec(event(), 1..120)) {
            let t: Arc<str> = "t".into();
            let mut store = Store::default();
            let mut i = ingest(OnInvalid::Reject);
            // The consumer's position per partition (what Kafka delivers next), set at assignment.
            let mut position: BTreeMap<i32, i64> = BTreeMap::new();
            let mut in_batch: Vec<(i32, i64)> = Vec::new();
            let mut stored_twice = 0;
            let mut write = |i: &mut Ingest, store: &mut Store, in_batch: &mut Vec<(i32, i64)>| {
                let b = i.take();
                for r in in_batch.iter() {
                    if store.rows.contains(r) {
                        stored_twice += 1;
                    }
                }
                store.commit(&b, in_batch);
                i.committed(&b);
                in_batch.clear();
            };
            for p in 0..3 {
                i.assign((t.clone(), p), 0);
                position.insert(p, 0);
            }
            for e in events {
                match e {
                    Event::Deliver { partition, with_id } => {
                        let Some(next) = position.get_mut(&partition) else { continue };
                        let r = rec(&t, partition, *next, with_id);
                        *next += 1;
                        let offer = i.offer(&r, Instant::now());
                        prop_assert!(matches!(offer, Offer::Taken), "{offer:?}");
                        in_batch.push((partition, r.offset));
                        if i.full() {
                            write(&mut i, &mut store, &mut in_batch);
                        }
                    }
                    Event::Revoke { partition } => {
                        if position.remove(&partition).is_some() {
                            write(&mut i, &mut store, &mut in_batch);
                            prop_assert!(i.revoke(&(t.clone(), partition)).is_ok());
                        }
                    }
                    Event::Assign { partition } => {
                        if let std::collections::btree_map::Entry::Vacant(e) = position.entry(partition) {
                            let next = store.offsets.get(&partition).copied().unwrap_or(0);
                            i.assign((t.clone(), partition), next);
                            e.insert(next);
                        }
                    }
                    Event::Tick => write(&mut i, &mut store, &mut in_batch),
                    Event::CrashBeforeCommit => {
                        // The batch is lost with the process; the new one starts from the store.
                        in_batch.clear();
                        i = ingest(OnInvalid::Reject);
                        for p in position.keys().copied().collect::<Vec<_>>() {
                            let next = store.offsets.get(&p).copied().unwrap_or(0);
                            i.assign((t.clone(), p), next);
                            position.insert(p, next);
                        }
                    }
                }
                for (&p, &next) in &store.offsets {
                    for o in 0..next {
                        prop_assert!(store.rows.contains(&(p, o)), "partition {p}: offset {next} stored past unstored record {o}");
                    }
                }
            }
            prop_assert_eq!(stored_twice, 0);
        }
    }
}

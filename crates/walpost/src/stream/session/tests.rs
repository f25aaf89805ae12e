//! The session's loop without servers: WAL from a [`MemorySource`] (pgoutput messages
//! encoded by `pgoutput::encode`), records into a [`ModelSink`] the test answers. What
//! these tests pin is the data path's promise: the flush position sent to the slot never
//! passes a record Kafka has not written and never moves backwards, whatever the order
//! of acknowledgements, refusals, silences and shutdowns.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use pgoutput::wire::{ReplicationMessage, XLogData};
use pgoutput::{Begin, Column, ColumnValue, Commit, Insert, LogicalMessage, Lsn, Relation, TupleData};
use proptest::prelude::*;
use tokio::sync::watch;

use super::*;
use crate::kafka::exactly_once::progress::SlotIdentity;
use crate::kafka::model_sink::{ModelSink, Written};
use crate::kafka::WindowLimits;
use crate::settings::{ExactlyOnce, FileConfig, OnPermanentError, Overrides};
use crate::stream::source::memory::MemorySource;
use crate::telemetry::Health;

const OUTBOX_OID: u32 = 16_384;
const TEXT: u32 = 25;
const JSONB: u32 = 3_802;
/// The slot's confirmed position when a test's first session starts.
const START: Lsn = Lsn(0x1_0000);
const DEAD_LETTERS: &str = "walpost.dead-letters";

fn settings() -> Settings {
    let o = Overrides {
        postgres: Some("postgres://u@h/d".into()),
        kafka_brokers: Some("k:1".into()),
        ..Overrides::default()
    };
    let mut s = Settings::resolve(&o, FileConfig::default()).expect("default settings resolve");
    // Nothing in the model answers while a session drains: keep that short.
    s.stream.shutdown_timeout = Duration::from_millis(300);
    s
}

fn pg_now() -> i64 {
    pgoutput::unix_micros_to_pg_epoch_micros(now_ms() * 1000)
}

/// A transaction the test wrote: its commit's end and its events' ids.
#[derive(Debug, Clone)]
struct Txn {
    end: Lsn,
    events: Vec<String>,
}

/// Writes WAL into a source the way pgoutput sends it.
struct Wal {
    source: MemorySource,
    next_lsn: u64,
    next_event: u32,
    relation_sent: bool,
    txns: Vec<Txn>,
}

impl Wal {
    fn new(source: &MemorySource) -> Wal {
        Wal { source: source.clone(), next_lsn: START.0 + 0x100, next_event: 1, relation_sent: false, txns: Vec::new() }
    }

    fn push(&self, at: u64, m: &LogicalMessage) {
        let mut data = BytesMut::new();
        pgoutput::encode::encode(m, false, &mut data);
        self.source.push(ReplicationMessage::XLogData(XLogData {
            wal_start: Lsn(at),
            wal_end: Lsn(at),
            send_time: pg_now(),
            data: data.freeze(),
        }));
    }

    /// One committed transaction of outbox rows, `(aggregate type, aggregate id)` each.
    fn txn(&mut self, rows: &[(String, String)]) -> Txn {
        let base = self.next_lsn;
        self.next_lsn += 0x100;
        let final_lsn = Lsn(base + 0x80);
        let end = Lsn(base + 0x90);
        let commit_time = pg_now();
        self.push(base, &LogicalMessage::Begin(Begin { final_lsn, commit_time, xid: 700 }));
        if !self.relation_sent {
            self.relation_sent = true;
            self.push(base, &LogicalMessage::Relation(outbox_relation()));
        }
        let mut events = Vec::new();
        for (i, (aggregate_type, aggregate_id)) in rows.iter().enumerate() {
            let id = format!("e{}", self.next_event);
            self.next_event += 1;
            let text = |s: &str| ColumnValue::Text(Bytes::copy_from_slice(s.as_bytes()));
            let tuple = TupleData::from_values(&[
                text(&id),
                text(aggregate_type),
                text(aggregate_id),
                text("Created"),
                text("{\"n\":1}"),
            ]);
            let insert = Insert { xid: None, relation_oid: OUTBOX_OID, tuple };
            self.push(base + 0x10 + i as u64, &LogicalMessage::Insert(insert));
            events.push(id);
        }
        self.push(
            final_lsn.0,
            &LogicalMessage::Commit(Commit { flags: 0, commit_lsn: final_lsn, end_lsn: end, commit_time }),
        );
        let written = Txn { end, events };
        self.txns.push(written.clone());
        written
    }

    /// Objects to a flush position that passes an event the model has not written.
    fn witness(&self, model: &ModelSink) {
        let (txns, model) = (self.txns.clone(), model.clone());
        self.source.witness(Box::new(move |flush| {
            let written: HashSet<String> = model.written().into_iter().map(|w| w.event_id).collect();
            match txns.iter().filter(|t| t.end <= flush).flat_map(|t| &t.events).find(|e| !written.contains(*e)) {
                Some(e) => Err(format!("flush {flush} passes event {e}, which Kafka has not written")),
                None => Ok(()),
            }
        }));
    }

    /// The end of the longest prefix of transactions whose events are all written.
    fn written_prefix(&self, model: &ModelSink) -> Lsn {
        let written: HashSet<String> = model.written().into_iter().map(|w| w.event_id).collect();
        self.txns.iter().take_while(|t| t.events.iter().all(|e| written.contains(e))).last().map_or(START, |t| t.end)
    }
}

fn outbox_relation() -> Relation {
    let column = |name: &str, type_oid: u32| Column {
        flags: 0,
        name: Bytes::copy_from_slice(name.as_bytes()),
        type_oid,
        type_modifier: -1,
    };
    Relation {
        xid: None,
        oid: OUTBOX_OID,
        namespace: Bytes::from_static(b"events"),
        name: Bytes::from_static(b"outbox"),
        replica_identity: b'd',
        columns: vec![
            column("id", TEXT),
            column("aggregate_type", TEXT),
            column("aggregate_id", TEXT),
            column("event_type", TEXT),
            column("payload", JSONB),
        ],
    }
}

fn topic(aggregate_type: &str) -> String {
    format!("outbox.event.{aggregate_type}")
}

/// One session over `source` and a fresh model producer, started at `start`, run
/// beside `driver` (which gets the model and the shutdown switch); the session's end
/// once both are done (the driver is dropped if the session ends first). The driver
/// stops the session with `stop.send(true)`.
async fn session<D, F>(
    s: &Settings,
    memo: &mut DeliveryMemo,
    source: &MemorySource,
    start: Lsn,
    delivery_timeout: Duration,
    exactly_once: Option<ExactlyOnceState>,
    driver: D,
) -> (Result<SessionEnd, PipelineError>, Culprit, ModelSink)
where
    D: FnOnce(ModelSink, Arc<watch::Sender<bool>>) -> F,
    F: Future<Output = ()>,
{
    let health = Arc::new(Health::new(Duration::from_secs(30), Duration::from_secs(60)));
    let metrics = Metrics::new(health.clone()).expect("metrics");
    let (sink, reports) = ModelSink::new();
    let limits = WindowLimits { max_records: 1_000, max_bytes: 1 << 30, delivery_timeout };
    let window = ProduceWindow::new(sink.clone(), reports, limits, metrics.kafka.clone(), health);
    let routing = Routing::new(&s.source, metrics.stream.clone()).expect("routing");
    let parts = Parts {
        stream: source.clone(),
        start,
        routing,
        window,
        frozen_after: FROZEN_AFTER_DEFAULT,
        exactly_once,
        tracer: None,
    };
    // The session keeps a handle: a driver that drops its own does not stop it.
    let (stop, mut shutdown) = watch::channel(false);
    let stop = Arc::new(stop);
    let run = Session::new(s, s.kafka().expect("settings with brokers"), &metrics, parts, memo).run(&mut shutdown);
    let driven = driver(sink.clone(), Arc::clone(&stop));
    tokio::pin!(run, driven);
    let (result, culprit) = tokio::select! {
        biased;
        ended = &mut run => ended,
        () = &mut driven => tokio::time::timeout(Duration::from_secs(10), run).await.expect("the session ends"),
    };
    (result, culprit, sink)
}

/// Waits (at most 10 s) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting until {what}");
}

/// Answers every record handed over (every 5 ms) while `work` runs, until it ends.
async fn answering_while(model: &ModelSink, work: impl Future<Output = ()>) {
    let answering = async {
        loop {
            model.answer();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::select! {
        () = answering => {}
        () = work => {}
    }
}

fn assert_never_backwards(flushed: &[Lsn]) {
    assert!(flushed.windows(2).all(|w| w[0] <= w[1]), "the flush position moved backwards: {flushed:?}");
}

fn rows(spec: &[(u8, u8)]) -> Vec<(String, String)> {
    spec.iter().map(|(t, k)| (format!("type{t}"), format!("aggregate-{k}"))).collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Kafka answers partitions in any order (each partition's own records in order, as
    /// librdkafka reports them), a few at a time: every flush position sent is a commit
    /// end whose transactions' events are all written, never moves backwards, and the
    /// last is the end of the last transaction. Replay a failure with its seed.
    #[test]
    fn the_confirmed_position_never_passes_an_unacknowledged_record(
        txns in proptest::collection::vec(proptest::collection::vec((0u8..3, 0u8..5), 0..5), 1..10),
        seed in any::<u64>(),
        step in 1usize..6,
    ) {
        runtime().block_on(async {
            let s = settings();
            let mut memo = DeliveryMemo::default();
            let source = MemorySource::default();
            let mut wal = Wal::new(&source);
            for t in &txns {
                wal.txn(&rows(t));
            }
            let last = wal.txns.last().map_or(START, |t| t.end);
            let total: usize = txns.iter().map(Vec::len).sum();
            let (result, _, model) = session(&s, &mut memo, &source, START, Duration::from_secs(30), None, |model, stop| {
                wal.witness(&model);
                let source = source.clone();
                async move {
                    let mut round = 0u64;
                    while model.written().len() < total {
                        until("records are handed over", || model.pending() > 0).await;
                        round += 1;
                        if round % 2 == 0 {
                            model.answer_first(step);
                        } else {
                            model.answer_shuffled(seed.wrapping_add(round));
                        }
                    }
                    until("the last commit is confirmed", || source.last_flush() == Some(last)).await;
                    let _ = stop.send(true);
                }
            })
            .await;
            prop_assert!(matches!(result, Ok(SessionEnd::Shutdown)), "{result:?}");
            prop_assert_eq!(source.objections(), Vec::<String>::new());
            prop_assert_eq!(model.lost(), Vec::new());
            let flushed = source.flushed();
            assert_never_backwards(&flushed);
            let ends: HashSet<Lsn> = wal.txns.iter().map(|t| t.end).chain([START]).collect();
            prop_assert!(flushed.iter().all(|f| ends.contains(f)), "a flush position that is no commit end: {flushed:?}");
            let mut ids: Vec<String> = model.written().into_iter().map(|w| w.event_id).collect();
            ids.sort();
            let mut expected: Vec<String> = wal.txns.iter().flat_map(|t| t.events.clone()).collect();
            expected.sort();
            prop_assert_eq!(ids, expected, "every event written exactly once");
            Ok(())
        })?;
    }
}

/// Halt mode: a record Kafka refuses for good stops the stream with the refusal named,
/// and the slot is confirmed up to the transaction before it, not past it, even though
/// the transaction after it was written.
#[tokio::test]
async fn a_refused_record_halts_and_confirms_only_what_came_before_it() {
    let s = settings();
    let mut memo = DeliveryMemo::default();
    let source = MemorySource::default();
    let mut wal = Wal::new(&source);
    let first = wal.txn(&rows(&[(0, 1)]));
    let refused = wal.txn(&rows(&[(0, 2), (1, 3)]));
    wal.txn(&rows(&[(1, 4)]));
    let (result, _, _) = session(&s, &mut memo, &source, START, Duration::from_secs(30), None, |model, _stop| {
        model.refuse(&topic("type0"), &refused.events[0]);
        wal.witness(&model);
        async move {
            loop {
                model.answer();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    })
    .await;
    let error = result.expect_err("a refused record halts");
    assert!(!error.is_transient(), "a refusal for good is definite: {error}");
    assert!(error.to_string().contains(&refused.events[0]), "the refused event is named: {error}");
    assert_eq!(source.objections(), Vec::<String>::new());
    assert_eq!(source.last_flush(), Some(first.end), "confirmed up to the transaction before the refused record");
}

/// Dead-letter mode: the refused record's dead letter takes its place in its
/// transaction, and the stream goes on past it.
#[tokio::test]
async fn a_refused_record_becomes_a_dead_letter_and_the_stream_goes_on() {
    let mut s = settings();
    let kafka = s.kafka.as_mut().expect("settings with brokers");
    kafka.on_permanent_error = OnPermanentError::DeadLetter;
    kafka.dead_letter_topic = DEAD_LETTERS.into();
    let mut memo = DeliveryMemo::default();
    let source = MemorySource::default();
    let mut wal = Wal::new(&source);
    wal.txn(&rows(&[(0, 1)]));
    let refused = wal.txn(&rows(&[(0, 2), (1, 3)]));
    let last = wal.txn(&rows(&[(1, 4)]));
    let (result, _, model) = session(&s, &mut memo, &source, START, Duration::from_secs(30), None, |model, stop| {
        model.refuse(&topic("type0"), &refused.events[0]);
        let source = source.clone();
        async move {
            answering_while(&model, until("the last commit is confirmed", || source.last_flush() == Some(last.end)))
                .await;
            let _ = stop.send(true);
        }
    })
    .await;
    assert!(matches!(result, Ok(SessionEnd::Shutdown)), "{result:?}");
    let dead: Vec<String> =
        model.written().into_iter().filter(|w| w.topic == DEAD_LETTERS).map(|w| w.event_id).collect();
    assert_eq!(dead, vec![refused.events[0].clone()], "the refused event, and only it, is a dead letter");
    assert_eq!(source.last_flush(), Some(last.end));
}

/// Kafka goes silent: the session ends (transient, Kafka's fault) once the delivery
/// timeout passes; the next session, from the confirmed position, sends only the events
/// the last producer did not get acknowledged, and confirms everything.
#[tokio::test]
async fn a_silent_kafka_restarts_and_the_next_producer_sends_only_what_was_not_acknowledged() {
    let s = settings();
    let mut memo = DeliveryMemo::default();
    let source = MemorySource::default();
    let mut wal = Wal::new(&source);
    let first = wal.txn(&rows(&[(0, 1)]));
    let stuck = wal.txn(&rows(&[(0, 1), (1, 2), (2, 3), (0, 4)]));
    let (result, culprit, model) =
        session(&s, &mut memo, &source, START, Duration::from_millis(400), None, |model, _| {
            let source = source.clone();
            async move {
                until("the first event is handed over", || model.pending() > 0).await;
                model.answer();
                until("the first commit is confirmed", || source.last_flush() == Some(first.end)).await;
                until("the stuck transaction is handed over", || model.pending() >= 2).await;
                model.answer_first(1);
                std::future::pending::<()>().await;
            }
        })
        .await;
    let error = result.expect_err("a silent Kafka ends the session");
    assert!(error.is_transient() && culprit == Culprit::Kafka, "{error} ({culprit:?})");
    assert_eq!(source.last_flush(), Some(first.end), "nothing of the stuck transaction is confirmed");
    let acknowledged: HashSet<String> = model.written().into_iter().map(|w| w.event_id).collect();
    assert!(acknowledged.len() >= 2, "the first event and one of the stuck ones were written: {acknowledged:?}");

    // The server sends the WAL again from the confirmed position.
    let again = MemorySource::default();
    let mut replayed = Wal::new(&again);
    replayed.next_lsn = wal.txns.get(1).map_or(0, |t| t.end.0 - 0x90);
    replayed.next_event = 2;
    let resent = replayed.txn(&rows(&[(0, 1), (1, 2), (2, 3), (0, 4)]));
    assert_eq!((resent.end, &resent.events), (stuck.end, &stuck.events), "the same transaction again");
    let (result, _, second) =
        session(&s, &mut memo, &again, first.end, Duration::from_secs(30), None, |model, stop| {
            let again = again.clone();
            async move {
                answering_while(
                    &model,
                    until("the stuck commit is confirmed", || again.last_flush() == Some(stuck.end)),
                )
                .await;
                let _ = stop.send(true);
            }
        })
        .await;
    assert!(matches!(result, Ok(SessionEnd::Shutdown)), "{result:?}");
    let sent_again: Vec<String> = second.written().into_iter().map(|w| w.event_id).collect();
    assert!(sent_again.iter().all(|e| !acknowledged.contains(e)), "acknowledged events sent twice: {sent_again:?}");
    let mut all: Vec<String> = acknowledged.into_iter().chain(sent_again).collect();
    all.sort();
    let mut expected: Vec<String> = first.events.iter().chain(&stuck.events).cloned().collect();
    expected.sort();
    assert_eq!(all, expected, "every event written exactly once across the two producers");
}

/// Shutdown in the middle of a burst: the final position confirms exactly the prefix of
/// transactions Kafka wrote completely, nothing less and nothing more.
#[tokio::test]
async fn shutdown_mid_burst_confirms_exactly_the_written_prefix() {
    let s = settings();
    let mut memo = DeliveryMemo::default();
    let source = MemorySource::default();
    let mut wal = Wal::new(&source);
    for i in 0..40u8 {
        wal.txn(&rows(&[(i % 3, i % 7), ((i + 1) % 3, i % 5)]));
    }
    let (result, _, model) = session(&s, &mut memo, &source, START, Duration::from_secs(30), None, |model, stop| {
        wal.witness(&model);
        let model = model.clone();
        async move {
            for _ in 0..6 {
                until("records are handed over", || model.pending() > 0).await;
                model.answer_first(5);
                tokio::task::yield_now().await;
            }
            let _ = stop.send(true);
        }
    })
    .await;
    assert!(matches!(result, Ok(SessionEnd::Shutdown)), "{result:?}");
    assert_eq!(source.objections(), Vec::<String>::new());
    assert_never_backwards(&source.flushed());
    let prefix = wal.written_prefix(&model);
    assert!(prefix > START && prefix < wal.txns.last().map_or(START, |t| t.end), "a mid-burst stop: {prefix}");
    assert_eq!(source.last_flush(), Some(prefix), "the final position is the written prefix's end");
}

/// Exactly-once: records go out in Kafka transactions of at most
/// `max_transaction_records`, each committed with a progress record last, and the slot
/// is confirmed only up to a committed progress position: never past a record a
/// `read_committed` consumer cannot read yet.
#[tokio::test]
async fn exactly_once_confirms_only_what_a_committed_kafka_transaction_holds() {
    let s = settings();
    let mut memo = DeliveryMemo::default();
    let source = MemorySource::default();
    // The WAL arrives two transactions at a time (one loop turn each), as the plan says.
    let row = |i: u8| rows(&[(i % 2, i), (i % 3, i + 1)]);
    let mut plan = Wal::new(&MemorySource::default());
    for i in 0..6u8 {
        plan.txn(&row(i));
    }
    let last = plan.txns.last().map_or(START, |t| t.end);
    let identity = SlotIdentity { system_id: "1".into(), database: "d".into(), slot: "walpost".into() };
    let bounds = ExactlyOnce { max_transaction_records: 3, ..ExactlyOnce::default() };
    let progress_topic = bounds.progress_topic.clone();
    let eos = ExactlyOnceState::new(identity, &bounds, START, Duration::from_secs(10), None);
    let (result, _, model) =
        session(&s, &mut memo, &source, START, Duration::from_secs(30), Some(eos), |model, stop| {
            let (txns, committed) = (plan.txns.clone(), model.clone());
            source.witness(Box::new(move |flush| {
                let readable: HashSet<String> = committed.committed().into_iter().map(|w| w.event_id).collect();
                match txns.iter().filter(|t| t.end <= flush).flat_map(|t| &t.events).find(|e| !readable.contains(*e)) {
                    Some(e) => Err(format!("flush {flush} passes event {e}, in no committed Kafka transaction")),
                    None => Ok(()),
                }
            }));
            let source = source.clone();
            async move {
                let feeding = async {
                    let mut wal = Wal::new(&source);
                    for i in (0..6u8).step_by(2) {
                        wal.txn(&row(i));
                        let end = wal.txn(&row(i + 1)).end;
                        until("the two transactions are confirmed", || source.last_flush() == Some(end)).await;
                    }
                };
                answering_while(&model, feeding).await;
                assert_eq!(source.last_flush(), Some(last));
                let _ = stop.send(true);
            }
        })
        .await;
    assert!(matches!(result, Ok(SessionEnd::Shutdown)), "{result:?}");
    assert_eq!(source.objections(), Vec::<String>::new());
    assert_never_backwards(&source.flushed());
    let committed = model.committed();
    let progress = committed.iter().filter(|w| w.topic == progress_topic).count();
    let events: Vec<&Written> = committed.iter().filter(|w| w.topic != progress_topic).collect();
    assert_eq!(events.len(), 12, "every event in a committed transaction once: {committed:?}");
    let calls = model.transactions();
    let commits = calls.iter().filter(|c| **c == "commit").count();
    assert!(commits >= 3, "three turns of 4 records, a bound of 3: {calls:?}");
    assert_eq!(progress, commits, "each committed transaction holds one progress record");
    assert!(!calls.contains(&"abort"), "{calls:?}");
}

/// Exactly-once: records Kafka acknowledged in a transaction not yet committed do not
/// move the slot (the progress gate); the commit, when its interval is up, does.
#[tokio::test]
async fn exactly_once_holds_the_slot_until_the_kafka_transaction_commits() {
    let s = settings();
    let mut memo = DeliveryMemo::default();
    let source = MemorySource::default();
    let mut wal = Wal::new(&source);
    wal.txn(&rows(&[(0, 1), (1, 2)]));
    let last = wal.txn(&rows(&[(2, 3)])).end;
    let identity = SlotIdentity { system_id: "1".into(), database: "d".into(), slot: "walpost".into() };
    let bounds = ExactlyOnce { max_transaction_interval: Duration::from_millis(1_500), ..ExactlyOnce::default() };
    let eos = ExactlyOnceState::new(identity, &bounds, START, Duration::from_secs(10), None);
    let (result, _, model) =
        session(&s, &mut memo, &source, START, Duration::from_secs(30), Some(eos), |model, stop| {
            let source = source.clone();
            async move {
                let checking = async {
                    until("the three events are acknowledged", || model.written().len() == 3).await;
                    // Two status intervals with every record acknowledged, none committed.
                    tokio::time::sleep(MIN_STATUS_GAP * 2).await;
                    assert_eq!(model.committed(), Vec::new(), "the interval is not up yet");
                    assert!(
                        source.last_flush().is_none_or(|f| f == START),
                        "confirmed before the commit: {:?}",
                        source.flushed()
                    );
                    until("the commit is confirmed", || source.last_flush() == Some(last)).await;
                };
                answering_while(&model, checking).await;
                let _ = stop.send(true);
            }
        })
        .await;
    assert!(matches!(result, Ok(SessionEnd::Shutdown)), "{result:?}");
    assert_eq!(model.committed().len(), 4, "three events and the progress record: {:?}", model.committed());
}

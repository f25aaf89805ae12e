use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::*;
use crate::telemetry::Metrics;

/// A window whose producer points at a port nothing listens on: records are taken
/// by librdkafka and never reported on (they never expire: message.timeout.ms=0).
fn unreachable_window(delivery_timeout: Duration) -> ProduceWindow<u32> {
    let health = Arc::new(Health::new(Duration::from_secs(30), Duration::from_secs(60)));
    let metrics = Metrics::new(health.clone()).unwrap();
    let (config, _) = crate::kafka::config::producer_config("127.0.0.1:1", &BTreeMap::new(), None).unwrap();
    let (sink, reports) = KafkaSink::new(&config, BTreeSet::new(), Vec::new(), metrics.kafka.clone()).unwrap();
    let limits = WindowLimits { max_records: 10, max_bytes: 1 << 20, delivery_timeout };
    ProduceWindow::new(sink, reports, limits, metrics.kafka, health)
}

fn record(topic: &str) -> Record {
    Record {
        topic: Arc::from(topic),
        key: Bytes::from_static(b"k"),
        value: Some(Bytes::from_static(b"{}")),
        headers: Vec::new(),
        event_id: Bytes::from_static(b"1"),
        timestamp_ms: None,
        partition: None,
        trace: router::TraceOutcome::default(),
    }
}

fn out(topic: &str, tag: u32) -> Outgoing<u32> {
    Outgoing { record: record(topic), timestamp_ms: None, tag, dead_letter: None }
}

mod barriers {
    use proptest::prelude::*;

    use super::*;
    use crate::kafka::model_sink::{by_partition, ModelSink};

    fn model_window() -> (ProduceWindow<u32, ModelSink>, ModelSink) {
        let health = Arc::new(Health::new(Duration::from_secs(30), Duration::from_secs(60)));
        let metrics = Metrics::new(health.clone()).unwrap();
        let (sink, reports) = ModelSink::new();
        let limits = WindowLimits { max_records: 1_000, max_bytes: 1 << 30, delivery_timeout: Duration::from_secs(5) };
        (ProduceWindow::new(sink.clone(), reports, limits, metrics.kafka, health), sink)
    }

    fn keyed(topic: &str, key: &str, id: u32, partition: Option<i32>) -> Outgoing<u32> {
        let mut r = record(topic);
        r.key = Bytes::from(key.to_owned());
        r.event_id = Bytes::from(id.to_string());
        r.partition = partition;
        Outgoing { record: r, timestamp_ms: None, tag: id, dead_letter: None }
    }

    /// Hands over what may go and takes the reports the model has, `answer_every`:
    /// the model answers every that many steps (records pile up in between).
    fn drive(w: &mut ProduceWindow<u32, ModelSink>, model: &ModelSink, answer_every: u32) -> Vec<u32> {
        let mut delivered = Vec::new();
        let mut step = 0u32;
        while !w.is_idle() {
            step += 1;
            assert!(step < 100_000, "the window does not get idle: {w:?}");
            let mut on = |e: Event<u32>| match e {
                Event::Delivered { tag, .. } => delivered.push(tag),
                other => panic!("{other:?}"),
            };
            if let Some(e) = w.pump() {
                on(e);
            }
            if step % answer_every.max(1) == 0 || model.pending() as u64 == w.in_flight() {
                model.answer();
            }
            while let Some(e) = w.try_event() {
                on(e);
            }
        }
        delivered
    }

    /// Regression: one event of a 30-row transaction to a new
    /// topic was reported delivered and never written. The first batch of a
    /// partition failed (the broker was still creating the partition) while the
    /// second batch of the same partition, handed over before that answer, was
    /// written; librdkafka then counted the first as delivered ("implicitly acked
    /// by subsequent batch success"). The window now sends a partition's first
    /// record with nothing else of its partition in flight.
    #[tokio::test]
    async fn regression_a_partitions_first_record_is_never_acknowledged_by_a_later_batch() {
        let (mut w, model) = model_window();
        for g in 1..=30u32 {
            w.enqueue(keyed("orders", &format!("aggregate-{}", g % 5), g, None));
        }
        let delivered = drive(&mut w, &model, 1);
        assert_eq!(model.lost(), Vec::new(), "records reported delivered but never written");
        assert_eq!(delivered.len(), 30);
        assert_eq!(model.written().len(), 30);
    }

    /// The model loses records when nothing holds a partition's later records back,
    /// so the regression test above can fail (what the window did before it held them).
    #[tokio::test]
    async fn the_model_loses_a_first_batch_when_a_later_one_follows_it() {
        let (sink, _reports) = ModelSink::new();
        let mut raw = sink.clone();
        let r = |id: u32| keyed("orders", "k", id, None).record;
        raw.send(0, &r(1), None).unwrap();
        raw.send(1, &r(2), None).unwrap();
        sink.answer();
        assert_eq!(sink.lost().len(), 1, "{:?}", sink.written());
    }

    /// After librdkafka's implicit-acknowledgement line, no report of that producer
    /// counts as delivered: the window reports the records failed (sent again by the
    /// next producer from the confirmed position).
    #[tokio::test]
    async fn after_an_implicit_acknowledgement_no_report_counts() {
        let (mut w, model) = model_window();
        w.enqueue(keyed("orders", "k", 1, None));
        assert!(w.pump().is_none());
        model.announce_implicit_ack();
        model.answer();
        match w.next_event().await.unwrap() {
            Event::Failed { tag: 1, error } => assert!(error.contains("implicit"), "{error}"),
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// Whatever the records, partitions and timing of answers: nothing is lost,
        /// every record is delivered once, and each partition holds its records in
        /// the order they were enqueued.
        #[test]
        fn no_interleaving_of_answers_loses_or_reorders_a_record(
            records in proptest::collection::vec((0u8..3, 0u8..7, proptest::option::weighted(0.2, 0i32..3)), 1..60),
            answer_every in 1u32..5,
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let (mut w, model) = model_window();
                let mut expected: BTreeMap<u32, Outgoing<u32>> = BTreeMap::new();
                for (i, (topic, key, partition)) in records.iter().enumerate() {
                    let id = u32::try_from(i).unwrap();
                    let out = keyed(&format!("t{topic}"), &format!("k{key}"), id, *partition);
                    expected.insert(id, keyed(&format!("t{topic}"), &format!("k{key}"), id, *partition));
                    w.enqueue(out);
                }
                let mut delivered = drive(&mut w, &model, answer_every);
                prop_assert_eq!(model.lost(), Vec::new());
                delivered.sort_unstable();
                prop_assert_eq!(delivered, expected.keys().copied().collect::<Vec<_>>());
                for ((topic, _), ids) in by_partition(&model.written()) {
                    let ids: Vec<u32> = ids.iter().map(|i| i.parse().unwrap()).collect();
                    prop_assert!(ids.windows(2).all(|p| p[0] < p[1]), "{topic}: {ids:?}");
                }
                Ok(())
            })?;
        }
    }
}

/// The first records of many new topics go out together (one round
/// trip for the burst, not one each); a topic's second record still waits for its
/// first one's report.
#[tokio::test]
async fn first_records_of_new_topics_go_out_together() {
    let mut w = unreachable_window(Duration::from_secs(5));
    for i in 0..8 {
        w.enqueue(out(&format!("t{i}"), i));
    }
    w.enqueue(out("t0", 100));
    assert!(w.pump().is_none());
    assert_eq!(w.in_flight(), 8, "every new topic's first record is handed over");
    assert!(!w.has_room(), "t0's second record waits in the queue");
    w.close(Duration::from_millis(10), |_| {}).await;
}

/// The first record for a topic goes alone: the second waits in the queue, the
/// window has no room (no more WAL is read), and the watchdog ends the wait.
#[tokio::test]
async fn first_record_for_a_topic_goes_alone_and_the_watchdog_fires() {
    let mut w = unreachable_window(Duration::from_millis(300));
    assert!(w.is_idle() && w.has_room());
    // The watchdog's clock starts at the first enqueue (the window was idle).
    let started = Instant::now();
    w.enqueue(out("t1", 1));
    w.enqueue(out("t1", 2));
    let err = w.next_event_within().await.unwrap_err();
    assert!(err.is_transient() && err.to_string().contains("acknowledged no record"), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(w.in_flight(), 1, "only the first record was handed over");
    assert!(!w.has_room(), "a queued record blocks reading");
    let mut events = Vec::new();
    let left = w.close(Duration::from_millis(10), |e| events.push(e)).await;
    assert!(
        matches!(events.as_slice(), [Event::Failed { tag: 1, .. }]),
        "the in-flight record is purged and reported failed: {events:?}"
    );
    assert_eq!(left, vec![2], "the queued record is returned for re-sending");
}

/// Regression: dropping a producer flushes it, which blocked the
/// runtime's only thread; closing now runs that on a blocking thread while the
/// runtime goes on (here a ticker on the same single-threaded runtime).
#[tokio::test(flavor = "current_thread")]
async fn regression_closing_a_stuck_producer_does_not_block_the_runtime() {
    let mut w = unreachable_window(Duration::from_secs(60));
    w.enqueue(out("t1", 1));
    assert!(w.pump().is_none());
    assert_eq!(w.in_flight(), 1);
    let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = ticks.clone();
    let ticker = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let started = Instant::now();
    w.close(Duration::from_millis(800), |_| {}).await;
    assert!(started.elapsed() >= Duration::from_millis(700), "the flush waited for the unreachable broker");
    let n = ticks.load(std::sync::atomic::Ordering::Relaxed);
    assert!(n >= 30, "the runtime ran only {n} ticks during an 800 ms close");
    ticker.abort();
}

/// Regression: an exactly-once commit began while a record waited behind
/// the first-for-its-topic barrier, and that record went out after the commit,
/// outside any transaction. `send_queue` returns `None` only with the queue empty:
/// here the barrier never lifts, so the watchdog ends it.
#[tokio::test]
async fn regression_send_queue_returns_only_with_the_queue_empty() {
    let mut w = unreachable_window(Duration::from_millis(300));
    w.enqueue(out("t1", 1));
    assert!(w.send_queue().await.unwrap().is_none(), "one record: handed over at once");
    // The topic's second record waits for its first one's report, which never comes.
    w.enqueue(out("t1", 2));
    let err = w.send_queue().await.unwrap_err();
    assert!(err.to_string().contains("acknowledged no record"), "{err}");
    assert!(!w.has_room(), "the second record is still queued");
    w.close(Duration::from_millis(10), |_| {}).await;
}

/// librdkafka refuses a record larger than message.max.bytes on the spot: the
/// rejection is an event (with a copy of the record for a dead letter), and the
/// window does not count it in flight.
#[tokio::test]
async fn a_record_refused_on_the_spot_is_an_event_not_in_flight() {
    let mut w = unreachable_window(Duration::from_secs(5));
    let mut big = record("t1");
    big.value = Some(Bytes::from(vec![b'x'; 2_000_000]));
    w.enqueue(Outgoing { record: big, timestamp_ms: None, tag: 7, dead_letter: None });
    match w.next_event().await.unwrap() {
        Event::Rejected { tag, rejection, original, .. } => {
            assert_eq!(tag, 7);
            assert_eq!(rejection.code, "message_size_too_large");
            assert_eq!(original.value.map(|v| v.len()), Some(2_000_000));
        }
        other => panic!("{other:?}"),
    }
    assert!(w.is_idle());
    w.close(Duration::from_millis(10), |_| {}).await;
}

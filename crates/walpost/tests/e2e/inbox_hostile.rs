//! `walpost inbox` (and `walpost run`) against hostile records and their own failures:
//! a header name that is not UTF-8 is stored, not a silent stop; a thread or
//! task that panics, or a consumer thread that ends unasked, exits non-zero with the
//! reason; memory stays bounded in bytes whatever the records' keys.

use std::ffi::CString;
use std::time::Duration;

use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::ClientConfig;

use crate::inbox_ingest::{create_topic, inbox_args, inbox_db, json_records, messages, produce, start_inbox};
use crate::support::{strip_ansi, Walpost, World};

/// Produces one record whose headers' names are any bytes, through librdkafka's own
/// API (rust-rdkafka's `OwnedHeaders` takes names as `&str` only).
#[allow(unsafe_code)]
pub(crate) fn produce_raw_headers(bootstrap: &str, topic: &str, value: &[u8], headers: &[(&[u8], &[u8])]) {
    use rdkafka::bindings as rd;
    use rdkafka::bindings::rd_kafka_vtype_t::*;
    let p: BaseProducer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("producer");
    let topic = CString::new(topic).unwrap();
    // SAFETY: every pointer is alive during the call; librdkafka copies names and values;
    // on success the message owns the header list, on failure it is freed here.
    unsafe {
        let list = rd::rd_kafka_headers_new(headers.len());
        for (name, v) in headers {
            let err = rd::rd_kafka_header_add(
                list,
                name.as_ptr().cast(),
                name.len() as isize,
                v.as_ptr().cast(),
                v.len() as isize,
            );
            assert_eq!(err, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
        }
        let vu = |vtype, u| rd::rd_kafka_vu_t { vtype, u };
        let vus = [
            vu(RD_KAFKA_VTYPE_TOPIC, rd::rd_kafka_vu_s__bindgen_ty_1 { cstr: topic.as_ptr() }),
            vu(
                RD_KAFKA_VTYPE_VALUE,
                rd::rd_kafka_vu_s__bindgen_ty_1 {
                    mem: rd::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
                        ptr: value.as_ptr() as *mut _,
                        size: value.len(),
                    },
                },
            ),
            vu(RD_KAFKA_VTYPE_MSGFLAGS, rd::rd_kafka_vu_s__bindgen_ty_1 { i: rd::RD_KAFKA_MSG_F_COPY }),
            vu(RD_KAFKA_VTYPE_HEADERS, rd::rd_kafka_vu_s__bindgen_ty_1 { headers: list }),
        ];
        let error = rd::rd_kafka_produceva(p.client().native_ptr(), vus.as_ptr(), vus.len());
        if !error.is_null() {
            rd::rd_kafka_headers_destroy(list);
            let text = std::ffi::CStr::from_ptr(rd::rd_kafka_error_string(error)).to_string_lossy().into_owned();
            rd::rd_kafka_error_destroy(error);
            panic!("produce: {text}");
        }
    }
    p.flush(Duration::from_secs(30)).expect("flush");
}

/// Regression: a header name that is not UTF-8 (`kcat -H $'\xff\xfe=v'`) panicked the
/// inbox's consumer thread inside rust-rdkafka; walpost logged "stopped" and exited 0,
/// and every restart stopped at the same record. It is stored now, its name in base64,
/// and the records after it too.
#[test]
fn regression_a_header_name_that_is_not_utf8_is_stored_not_a_silent_stop() {
    let inbox = inbox_db("inbox-hostile-hdr");
    let topic = format!("{}t2", inbox.topic_prefix);
    create_topic(&topic, 1);
    produce_raw_headers(&inbox.kafka_bootstrap, &topic, b"x", &[(b"id", b"h2"), (b"\xff\xfe", b"v")]);
    produce(&inbox.kafka_bootstrap, &topic, &json_records("after", 0, 1, 1));
    let mut p = start_inbox(&inbox_args(&inbox, &topic, "hdr", &["--create-schema"]), &[]);
    let done = testkit::wait_until(Duration::from_secs(30), || messages(&inbox) >= 2 || !p.is_running());
    let log = strip_ansi(&p.log_text());
    assert!(done && p.is_running(), "walpost inbox stopped at the record:\n{log}");
    assert_eq!(messages(&inbox), 2, "{log}");
    assert_eq!(
        inbox.sql(r#"SELECT headers = '{"id": "h2", "base64://4=": "v"}'::jsonb FROM inbox.messages WHERE event_id = 'h2'"#).trim(),
        "t",
        "{}",
        inbox.sql("SELECT headers FROM inbox.messages")
    );
    let status = p.terminate(Duration::from_secs(30)).expect("stops");
    assert_eq!(status.code(), Some(0), "{log}");
}

/// Regression: a panic in a spawned task was caught by the runtime and the process ran
/// on without the task (and exited 0 at the next SIGTERM). Now a panic anywhere, in
/// either mode, exits 101 at once with the panic in the log.
#[test]
fn regression_a_panicking_task_exits_101_in_both_modes() {
    let w = World::new("hostile-panic");
    let topic = format!("{}t", w.topic_prefix);
    create_topic(&topic, 1);
    let inbox = start_inbox(&inbox_args(&w, &topic, "panic", &["--create-schema"]), &[("FAILPOINTS", "beat=panic")]);
    let run = Walpost::start(&w.args(), &[("FAILPOINTS", "beat=panic")]);
    for (mode, mut p) in [("inbox", inbox), ("run", run)] {
        let status = p.wait_exit(Duration::from_secs(30));
        let log = strip_ansi(&p.log_text());
        assert_eq!(status.and_then(|s| s.code()), Some(101), "walpost {mode} ran on after a panic:\n{log}");
        assert!(log.contains("walpost panicked") && log.contains("exiting with status 101"), "{mode}:\n{log}");
    }
}

/// Regression: the inbox's consumer thread ending without being asked to (a panic, or
/// returning) closed the channel, and the ingest took that for a stop: "stopped", exit 0,
/// so systemd did not restart it. Now a panic exits 101 (the panic hook) and a return
/// exits 1 naming it.
#[test]
fn regression_a_consumer_thread_that_ends_unasked_exits_non_zero_with_the_reason() {
    let inbox = inbox_db("inbox-hostile-end");
    let topic = format!("{}t", inbox.topic_prefix);
    create_topic(&topic, 1);
    produce(&inbox.kafka_bootstrap, &topic, &json_records("e", 0, 1, 1));
    let args = inbox_args(&inbox, &topic, "end", &["--create-schema"]);
    for (action, code, says) in [
        ("return", 1, "the inbox's Kafka consumer thread ended without being asked to (it returned)"),
        ("panic", 101, "walpost panicked"),
    ] {
        let mut p = start_inbox(&args, &[("FAILPOINTS", &format!("inbox-consumer-record={action}"))]);
        let status = p.wait_exit(Duration::from_secs(60));
        let log = strip_ansi(&p.log_text());
        assert_eq!(status.and_then(|s| s.code()), Some(code), "{action}:\n{log}");
        assert!(log.contains(says), "{action}:\n{log}");
        if action == "panic" {
            assert!(log.contains("thread=\"walpost-inbox-consumer\""), "{log}");
        }
    }
}

/// The process's peak resident memory (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM in {status}"));
    kb / 1024
}

/// Regression: the inbox's memory was bounded by records, not bytes: 2,100 records with
/// 500 KB keys while an inbox table was locked took its RSS to 1.04 GB. Now the channel
/// and the batches are bounded by bytes (key, headers, value): 800 records with 250 KB
/// keys (200 MB) behind a locked `inbox.messages` leave the peak far below their size.
#[test]
fn regression_memory_is_bounded_in_bytes_while_the_inbox_table_is_locked() {
    const RECORDS: usize = 800;
    const KEY_BYTES: usize = 250_000;
    const PEAK_MIB: u64 = 100;
    let inbox = inbox_db("inbox-hostile-mem");
    let topic = format!("{}big", inbox.topic_prefix);
    create_topic(&topic, 1);
    let mut p = start_inbox(&inbox_args(&inbox, &topic, "mem", &["--create-schema"]), &[]);
    assert!(
        testkit::wait_until(Duration::from_secs(30), || inbox.try_sql("SELECT 1 FROM inbox.messages").is_ok()),
        "{}",
        p.log_text()
    );
    // A session holds inbox.messages until the test says so (a row in release_lock).
    inbox.sql("CREATE TABLE public.release_lock (x int)");
    let holder = {
        let (pg, db) = (inbox.pg, inbox.db.clone());
        std::thread::spawn(move || {
            pg.psql_db(
                &db,
                "BEGIN; LOCK TABLE inbox.messages IN ACCESS EXCLUSIVE MODE;
                 DO $$ BEGIN FOR i IN 1..1200 LOOP
                   EXIT WHEN EXISTS (SELECT 1 FROM public.release_lock); PERFORM pg_sleep(0.05);
                 END LOOP; END $$;
                 COMMIT;",
            )
        })
    };
    let locked = "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                  WHERE c.relname = 'messages' AND l.mode = 'AccessExclusiveLock' AND l.granted";
    assert!(testkit::wait_until(Duration::from_secs(10), || inbox.sql(locked).trim() == "1"));

    // Keys that are not UTF-8 (no aggregate_id), values of a few bytes.
    let producer: rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &inbox.kafka_bootstrap)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    for i in 0..RECORDS {
        let mut key = vec![b'k'; KEY_BYTES];
        key[0] = 0xff;
        key[1..9].copy_from_slice(&(i as u64).to_be_bytes());
        let id = format!("m-{i}");
        let headers = rdkafka::message::OwnedHeaders::new()
            .insert(rdkafka::message::Header { key: "id", value: Some(id.as_bytes()) });
        let mut record = rdkafka::producer::BaseRecord::to(&topic).key(&key).payload(b"{}").headers(headers);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60)).expect("flush");
    // Before the fix every record was in memory by now.
    std::thread::sleep(Duration::from_secs(3));
    let while_locked = peak_rss_mib(p.pid());
    inbox.sql("INSERT INTO public.release_lock VALUES (1)");
    holder.join().unwrap().expect("the lock holder");
    assert!(
        testkit::wait_until(Duration::from_secs(60), || messages(&inbox) == RECORDS as i64),
        "{} of {RECORDS} stored:\n{}",
        messages(&inbox),
        p.log_text()
    );
    let peak = peak_rss_mib(p.pid());
    eprintln!("walpost inbox peak RSS: {while_locked} MiB while locked, {peak} MiB in all");
    assert!(peak < PEAK_MIB, "peak RSS {peak} MiB for {} MB of keys", RECORDS * KEY_BYTES / 1_000_000);
    assert_eq!(p.terminate(Duration::from_secs(30)).and_then(|s| s.code()), Some(0));
}

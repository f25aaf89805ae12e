//! Runbook drills: each test creates a runbook's incident on real servers, follows the
//! runbook's steps with the commands taken from the runbook file, and checks the
//! outcome (slot kept or recovered, nothing lost, per-aggregate order kept, duplicates
//! counted and bounded). Plus the regression tests of the first operations drill's
//! findings that need a server.
//!
//! How a runbook step becomes machine-readable: a fenced code block whose info string
//! carries `drill=<name>`, e.g. ```` ```sql drill=buy-time ```` or
//! ```` ```sh drill=recover ````. Placeholders are `<lowercase-words>` (`<slot>`,
//! `<config>`, `<cutoff>`, ...); the drill substitutes each one and fails if one is left
//! over or if the block is missing ([`Runbook::block`], [`Block::fill`]). SQL blocks run
//! through psql as a superuser on the drill's database; sh blocks run with `sh -c` and a
//! `PATH` that starts with a directory holding `walpost` (the binary under test),
//! `kafka-configs.sh` and `kafka-consumer-groups.sh` (the Kafka tools of the test
//! broker's class path); `kcat` and `curl` are the system's. A ```` ```text drill=... ````
//! block holds log lines; each line must match a line of walpost's log, placeholders
//! matching anything.
//!
//! Stopping and starting the service (systemctl in production) is done by the test.
//!
//! Every test here is named `drill_...` or `regression_...`: the PostgreSQL-version
//! passes of scripts/test.sh skip `drill_` (one run is enough; they take 20-70 s each).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use testkit::{PgOptions, Postgres};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(90);

// ---- runbook blocks ----

/// A runbook file.
pub(crate) struct Runbook {
    name: String,
    text: String,
}

/// A fenced code block of a runbook, found by its `drill=` tag.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    origin: String,
    pub lang: String,
    pub text: String,
}

impl Runbook {
    pub(crate) fn open(name: &str) -> Runbook {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../runbooks").join(format!("{name}.md"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Runbook { name: format!("runbooks/{name}.md"), text }
    }

    /// Every block with a `drill=` tag: (tag, block).
    pub(crate) fn blocks(&self) -> Vec<(String, Block)> {
        let mut out = Vec::new();
        let mut open: Option<(String, String, String, usize)> = None; // tag, lang, text, indent
        for line in self.text.lines() {
            let trimmed = line.trim_start();
            let indent = line.len() - trimmed.len();
            match &mut open {
                None => {
                    if let Some(info) = trimmed.strip_prefix("```") {
                        let mut words = info.split_whitespace();
                        let lang = words.next().unwrap_or_default().to_owned();
                        if let Some(tag) = info.split_whitespace().find_map(|w| w.strip_prefix("drill=")) {
                            open = Some((tag.to_owned(), lang, String::new(), indent));
                        }
                    }
                }
                Some((tag, lang, text, fence_indent)) => {
                    if trimmed.starts_with("```") {
                        let block = Block {
                            origin: format!("{} drill={tag}", self.name),
                            lang: lang.clone(),
                            text: text.trim_end().to_owned(),
                        };
                        out.push((tag.clone(), block));
                        open = None;
                    } else {
                        let cut = line.char_indices().take_while(|(i, c)| *i < *fence_indent && *c == ' ').count();
                        text.push_str(&line[cut..]);
                        text.push('\n');
                    }
                }
            }
        }
        out
    }

    /// The block tagged `drill=<tag>`; panics if there is none or more than one.
    /// The runbook's text.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    pub(crate) fn block(&self, tag: &str) -> Block {
        let found: Vec<Block> = self.blocks().into_iter().filter(|(t, _)| t == tag).map(|(_, b)| b).collect();
        match found.len() {
            1 => found.into_iter().next().unwrap(),
            0 => panic!(
                "{} has no code block tagged drill={tag}: the drill follows the runbook, so the step must be there",
                self.name
            ),
            n => panic!("{} has {n} code blocks tagged drill={tag}", self.name),
        }
    }
}

/// The `<placeholders>` of a text, in order of appearance.
pub(crate) fn placeholders(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'<' && i + 1 < bytes.len() && bytes[i + 1].is_ascii_lowercase() {
            let rest = &text[i + 1..];
            let name: String =
                rest.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-').collect();
            if rest[name.len()..].starts_with('>') {
                out.push(name.clone());
                i += name.len() + 2;
                continue;
            }
        }
        i += 1;
    }
    out
}

impl Block {
    /// The block's text with every placeholder replaced; panics if one has no value.
    pub(crate) fn fill(&self, vars: &[(&str, &str)]) -> String {
        let mut text = self.text.clone();
        for (name, value) in vars {
            text = text.replace(&format!("<{name}>"), value);
        }
        let left = placeholders(&text);
        assert!(left.is_empty(), "{}: no value for placeholder(s) {left:?} in:\n{}", self.origin, self.text);
        eprintln!("[drill] {} ({}):\n{text}", self.origin, self.lang);
        text
    }

    /// The block's lines as patterns: literal text with placeholders matching anything.
    /// Panics with the first line no log line matches.
    pub(crate) fn assert_lines_in(&self, log: &str) {
        let log = strip_ansi(log);
        for expected in self.text.lines().filter(|l| !l.trim().is_empty()) {
            assert!(
                log.lines().any(|l| matches_pattern(expected.trim(), l)),
                "{}: no log line matches\n  {expected}\nlog:\n{log}",
                self.origin
            );
        }
    }
}

/// Whether `line` contains `pattern`, whose `<placeholders>` match any text.
fn matches_pattern(pattern: &str, line: &str) -> bool {
    let mut parts = Vec::new();
    let mut rest = pattern;
    for name in placeholders(pattern) {
        let token = format!("<{name}>");
        let at = rest.find(&token).unwrap();
        parts.push(&rest[..at]);
        rest = &rest[at + token.len()..];
    }
    parts.push(rest);
    // The first part anywhere, each next part after the previous one.
    (0..=line.len()).filter(|i| line.is_char_boundary(*i)).any(|start| {
        let mut at = start;
        for (n, part) in parts.iter().enumerate() {
            let hay = &line[at..];
            let found = if n == 0 { hay.starts_with(part).then_some(0) } else { hay.find(part) };
            match found {
                Some(i) => at += i + part.len(),
                None => return false,
            }
        }
        true
    })
}

// ---- running a block ----

/// A directory with `walpost` and the Kafka tools an operator has, first in `PATH`.
fn tools_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(testkit::unique_name("drill-tools"));
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_walpost"), dir.join("walpost")).unwrap();
        let libs = testkit::shared_kafka().libs_dir().display().to_string();
        for (name, class) in [
            ("kafka-configs.sh", "kafka.admin.ConfigCommand"),
            ("kafka-consumer-groups.sh", "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"),
            ("kafka-topics.sh", "org.apache.kafka.tools.TopicCommand"),
        ] {
            let path = dir.join(name);
            std::fs::write(
                &path,
                format!(
                    "#!/bin/sh\nexec \"${{JAVA_HOME:+$JAVA_HOME/bin/}}java\" -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto -Xmx256m -Dlog4j2.level=warn -cp '{libs}/*' {class} \"$@\"\n"
                ),
            )
            .unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        }
        dir
    })
}

fn path_env() -> String {
    format!("{}:{}", tools_dir().display(), std::env::var("PATH").unwrap_or_default())
}

/// Runs a filled sh block to its end.
pub(crate) fn sh(text: &str) -> Output {
    let out = Command::new("sh")
        .arg("-c")
        .arg(text)
        .env("PATH", path_env())
        .env("WALPOST_LOG", "info,walpost=debug")
        .output()
        .expect("run sh");
    eprintln!(
        "[drill] exit {:?}\n  stdout: {}\n  stderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim(),
        tail(&String::from_utf8_lossy(&out.stderr), 15)
    );
    out
}

/// Runs a filled sh block that must succeed; its stdout.
pub(crate) fn sh_ok(text: &str) -> String {
    let out = sh(text);
    assert!(out.status.success(), "failed: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts a filled sh block holding one long-running command (a `walpost run`).
pub(crate) fn spawn_sh(text: &str) -> Walpost {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(format!("exec {text}")).env("PATH", path_env()).env("WALPOST_LOG", "info,walpost=debug");
    Walpost::spawn(cmd)
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

// ---- the drill's world ----

fn own_pg(extra: &[(&str, &str)]) -> &'static Postgres {
    let opts = PgOptions {
        extra_conf: extra.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..PgOptions::default()
    };
    Box::leak(Box::new(Postgres::start(opts).expect("start postgres")))
}

/// The service's configuration file for a world (owner-only: it holds a password),
/// with `extra` TOML after the connection settings.
pub(crate) fn service_config(w: &World, extra: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}-{}.toml", w.db, testkit::unique_name("drill")));
    let text = format!(
        "postgres = \"{url}\"\nslot = \"{slot}\"\npublication = \"{slot}_pub\"\n{extra}\n\
         [kafka]\nbrokers = \"{brokers}\"\n[kafka.properties]\n\"topic.metadata.refresh.interval.ms\" = \"1000\"\n\
         [router]\n\"route.topic.replacement\" = \"{prefix}${{routedByValue}}\"\n",
        url = w.url,
        slot = w.slot,
        brokers = w.kafka_bootstrap,
        prefix = w.topic_prefix,
    );
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    path.display().to_string()
}

/// The service as systemd would run it: `walpost run --config <config>`.
pub(crate) fn service(config: &str, extra: &[&str]) -> Walpost {
    let mut args = vec!["run".to_string(), "--config".to_string(), config.to_owned()];
    args.extend(extra.iter().map(|s| s.to_string()));
    Walpost::start(&args, &[])
}

pub(crate) fn http_get(port: u16, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, out)
}

pub(crate) fn metric(port: u16, series: &str) -> Option<f64> {
    let body = http_get(port, "/metrics").1;
    body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

pub(crate) fn assert_clean(a: &Audit) {
    assert!(a.lost.is_empty(), "lost {} events: {:?}", a.lost.len(), &a.lost[..a.lost.len().min(20)]);
    assert!(a.phantoms.is_empty(), "phantoms: {:?}", a.phantoms);
    assert!(a.reordered.is_empty(), "reordered: {:?}", &a.reordered[..a.reordered.len().min(10)]);
    assert!(a.wrong_content.is_empty(), "wrong content: {:?}", a.wrong_content);
}

fn lsn_now(w: &World) -> u64 {
    parse_lsn(&w.sql("SELECT pg_current_wal_lsn()")).unwrap()
}

fn topic_tool(w: &World, args: &[&str]) -> String {
    let mut full = vec!["--bootstrap-server", w.kafka_bootstrap.as_str()];
    full.extend_from_slice(args);
    testkit::shared_kafka().run_tool("org.apache.kafka.tools.TopicCommand", &full).expect("TopicCommand")
}

// ---- poison-record.md ----

/// runbooks/poison-record.md: a record the broker refuses for good (the topic's
/// max.message.bytes is below it) in the middle of a transaction. walpost halts with the
/// documented error after the librdkafka lines the runbook quotes; the diagnosis query
/// finds the row, the runbook's fix raises the topic limit, a restart delivers every
/// event: nothing lost, order kept, duplicates only from the refused record's
/// transaction.
#[test]
fn drill_poison_record() {
    let rb = Runbook::open("poison-record");
    let w = World::new("drill-poison");
    let topic = w.topic("order");
    topic_tool(
        &w,
        &[
            "--create",
            "--topic",
            &topic,
            "--partitions",
            "3",
            "--replication-factor",
            "1",
            "--config",
            "max.message.bytes=2000",
        ],
    );
    let port = testkit::free_port();
    let config = service_config(&w, &format!("metrics_addr = \"127.0.0.1:{port}\"\n[pipeline]\nhalt_linger_secs = 5"));
    let mut p = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 3, 5, 5, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 15, WAIT);
    // One transaction: a small event, the poison, a small event; then one more.
    let agg = "00000000-0000-4000-8000-0000000000aa";
    let ids = w.sql(&format!(
        "BEGIN;
         INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES
           ('order', '{agg}', 'Small', '{{}}'),
           ('order', '{agg}', 'Big', jsonb_build_object('blob', (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200)))),
           ('order', '{agg}', 'After', '{{}}')
         RETURNING id;
         COMMIT;"
    ));
    let big: i64 = ids.lines().nth(1).unwrap().parse().unwrap();
    // The halt is visible to metrics-based alerting before the exit.
    let halted = testkit::wait_until(WAIT, || metric(port, "walpost_halted") == Some(1.0));
    assert!(halted, "walpost_halted never read 1:\n{}", p.log_text());
    let rejected = metric(port, "walpost_produce_errors_total{class=\"rejected\"}").unwrap_or(0.0);
    assert!(rejected >= 1.0, "the refused record is not counted: {rejected}");
    let (code, body) = http_get(port, "/readyz");
    assert!(code == 503 && body.contains("halted: Kafka rejected event id="), "{code} {body}");
    let status = p.wait_exit(WAIT).unwrap_or_else(|| panic!("walpost did not halt:\n{}", p.log_text()));
    assert_eq!(status.code(), Some(1), "{}", p.log_text());
    let log = strip_ansi(&p.log_text());
    // The lines before the error, as the runbook quotes them.
    rb.block("log").assert_lines_in(&log);
    let named: i64 = log
        .split("Kafka rejected event id=")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no rejected event in:\n{log}"));
    assert!(log.contains(&format!("id={named} for topic {topic} permanently (message_size_too_large")), "{log}");
    // The broker refuses the batch: the named event is the batch's first, at or before the big one.
    assert!(named <= big, "named {named}, big {big}");

    // Diagnosis: from the named event on, largest first; the big one comes first.
    let rows = w.sql(&rb.block("find-event").fill(&[("event-id", &named.to_string())]));
    let first = rows.lines().next().unwrap_or_default();
    let bytes: i64 = first.rsplit('|').next().unwrap().parse().unwrap();
    assert!(first.starts_with(&format!("{big}|")) && bytes > 2000, "{rows}");
    // The fix for message_size_too_large: raise the topic's limit.
    sh_ok(&rb.block("raise-topic-limit").fill(&[
        ("brokers", &w.kafka_bootstrap),
        ("topic", &topic),
        ("bytes", "1048588"),
    ]));
    insert_batches(&w, 3, 2, 5, 5, &["order"]);
    let _fixed = service(&config, &[]);
    let records = consume_every_committed(&w, WAIT);
    let a = audit(&w, &records);
    assert_clean(&a);
    // Only events of the refused record's transaction may arrive twice (none did here: the
    // whole batch was refused).
    assert!(a.duplicates <= 2, "{a:?}");
    eprintln!("[drill] poison-record: named id={named}, big id={big}, duplicates {}", a.duplicates);
}

/// runbooks/poison-record.md, a payload that breaks its contract, "the event is wrong":
/// the runbook's divert command, run at once while the halted walpost still lingers on
/// the metrics port (`halt_linger_secs`, 60 s by default), takes the port over (it
/// failed with "Address already in use"); the halted one exits 1 at once, and the new
/// one dead-letters the breach and delivers the events around it.
#[test]
fn drill_poison_record_contract_breach_diverted_at_once() {
    let rb = Runbook::open("poison-record");
    let w = World::new("drill-divert");
    let dir = std::env::temp_dir().join(format!("{}-contracts", w.db));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("OrderPlaced.json"),
        r#"{"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer"}}}"#,
    )
    .unwrap();
    let dlq = format!("{}dead", w.topic_prefix);
    let port = testkit::free_port();
    let config = service_config(
        &w,
        &format!(
            "metrics_addr = \"127.0.0.1:{port}\"\ndead_letter_topic = \"{dlq}\"\n[contracts]\ndir = \"{}\"",
            dir.display()
        ),
    );
    let mut halted = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", halted.log_text());
    let agg = "00000000-0000-4000-8000-0000000000ab";
    let ids = w.sql(&format!(
        "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES
           ('order', '{agg}', 'OrderPlaced', '{{\"amount\": 1}}'),
           ('order', '{agg}', 'OrderPlaced', '{{\"amount\": \"SECRET\"}}'),
           ('order', '{agg}', 'OrderPlaced', '{{\"amount\": 3}}')
         RETURNING id"
    ));
    let ids: Vec<&str> = ids.lines().filter(|l| !l.is_empty()).collect();
    let is_halted = testkit::wait_until(WAIT, || metric(port, "walpost_halted") == Some(1.0));
    assert!(is_halted, "walpost_halted never read 1:\n{}", halted.log_text());

    // The runbook's command, at once: the halted walpost still lingers on the port.
    let started = Instant::now();
    let diverted = spawn_sh(&rb.block("divert").fill(&[("config", &config)]));
    let status = halted.wait_exit(Duration::from_secs(20)).unwrap_or_else(|| {
        panic!("the halted walpost kept the port:\n{}\nnew one:\n{}", halted.log_text(), diverted.log_text())
    });
    assert_eq!(status.code(), Some(1), "a halt stays exit 1:\n{}", halted.log_text());
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    assert!(halted.log_text().contains("a new walpost takes the metrics port over"), "{}", halted.log_text());
    let ready = testkit::wait_until(WAIT, || http_get(port, "/readyz").0 == 200);
    assert!(ready, "the new walpost does not serve the port:\n{}", diverted.log_text());
    assert!(
        diverted.log_text().contains("took the metrics port over from a halted walpost"),
        "{}",
        diverted.log_text()
    );

    let deadline = Instant::now() + WAIT;
    let records = loop {
        let records = read_all(&w.kafka_bootstrap, &w.topic_prefix);
        let on_order: HashSet<&[u8]> =
            records.iter().filter(|r| r.topic == w.topic("order")).filter_map(|r| r.header("id")).collect();
        let done = [ids[0], ids[2]].iter().all(|id| on_order.contains(id.as_bytes()))
            && records.iter().any(|r| r.topic == dlq);
        if done {
            break records;
        }
        assert!(Instant::now() < deadline, "timed out:\n{}", diverted.log_text());
        std::thread::sleep(Duration::from_millis(300));
    };
    let dead: Vec<&Consumed> = records.iter().filter(|r| r.topic == dlq).collect();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].header("walpost.event.id"), Some(ids[1].as_bytes()));
    assert_eq!(dead[0].header("walpost.error.class"), Some(&b"contract_broken"[..]));
    assert_eq!(dead[0].header("walpost.original.topic"), Some(w.topic("order").as_bytes()));
}

// ---- helpers for the slot drills ----

/// Writes about `megabytes` MB of WAL into a table that is not the outbox.
fn write_wal(w: &World, megabytes: u32) {
    w.sql(&format!(
        "CREATE TABLE IF NOT EXISTS public.noise (v text);
         INSERT INTO public.noise SELECT repeat('w', 1000) FROM generate_series(1, {megabytes} * 1000)"
    ));
}

fn slot_field(w: &World, column: &str) -> String {
    w.sql(&format!("SELECT {column} FROM pg_replication_slots WHERE slot_name = '{}'", w.slot))
}

/// The row of `w`'s slot in a query's output (`|`-separated, slot name first).
fn row_of<'a>(w: &World, output: &'a str) -> Vec<&'a str> {
    output
        .lines()
        .find(|l| l.split('|').next() == Some(w.slot.as_str()))
        .unwrap_or_else(|| panic!("no row for slot {} in:\n{output}", w.slot))
        .split('|')
        .collect()
}

/// `pg_size_pretty` text back to bytes (approximately).
fn pretty_bytes(text: &str) -> u64 {
    let (n, unit) = text.trim().split_once(' ').unwrap_or((text.trim(), "bytes"));
    let n: f64 = n.parse().unwrap_or_else(|_| panic!("size {text:?}"));
    let k = match unit {
        "bytes" => 1.0,
        "kB" => 1024.0,
        "MB" => 1024.0 * 1024.0,
        "GB" => 1024.0 * 1024.0 * 1024.0,
        other => panic!("unit {other:?} in {text:?}"),
    };
    (n * k) as u64
}

/// A writer thread: `batches` transactions of `size` rows (aggregate ids cycling through
/// `aggregates`), `pause` between them, batch numbers from `first`.
fn writer(
    w: &World,
    first: u32,
    batches: u32,
    size: u32,
    aggregates: u32,
    pause: Duration,
) -> std::thread::JoinHandle<()> {
    let (pg, db) = (w.pg, w.db.clone());
    std::thread::spawn(move || {
        for b in first..first + batches {
            insert_batches_in(pg, &db, b, 1, size, aggregates, &["order", "payment"]);
            std::thread::sleep(pause);
        }
    })
}

// ---- slot-wal-buildup.md ----

/// runbooks/slot-wal-buildup.md, `wal_status = unreserved` (the old
/// runbook's `CHECKPOINT` first invalidated the slot). walpost is stopped with events
/// waiting and the slot retains more than `max_slot_wal_keep_size` (64 MB). Following the
/// runbook: the diagnosis shows `unreserved`; buy time (ALTER SYSTEM, reload); watch until
/// `reserved`/`extended`; start walpost; only then `CHECKPOINT`; put the limit back once
/// retained WAL is below it. The slot is never lost, every event arrives once, in order.
#[test]
fn drill_slot_wal_buildup_unreserved_keeps_the_slot() {
    let rb = Runbook::open("slot-wal-buildup");
    // No timed checkpoint during the drill: only the runbook's steps may remove WAL.
    let pg = own_pg(&[("max_slot_wal_keep_size", "64MB"), ("checkpoint_timeout", "1h")]);
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "drill-unreserved");
    let config = service_config(&w, "");
    let mut p = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 5, 10, 10, &["order", "payment"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 50, WAIT);
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success());

    // The incident: events wait in the slot while the database writes on.
    insert_batches(&w, 5, 5, 10, 10, &["order", "payment"]);
    let unreserved = testkit::wait_until(Duration::from_secs(60), || {
        write_wal(&w, 8);
        slot_field(&w, "wal_status") == "unreserved"
    });
    assert!(unreserved, "wal_status stayed {}", slot_field(&w, "wal_status"));

    // Diagnosis.
    let diag = w.sql(&rb.block("diagnose").fill(&[]));
    let row = row_of(&w, &diag);
    assert_eq!((row[1], row[3]), ("f", "unreserved"), "{diag}");
    // Step 1: buy time, then watch until reserved or extended.
    let started = Instant::now();
    w.sql(&rb.block("buy-time").fill(&[("larger", "1GB")]));
    let watch = rb.block("watch").fill(&[("slot", &w.slot)]);
    let mut last = String::new();
    let safe = testkit::wait_until(Duration::from_secs(20), || {
        last = w.sql(&watch);
        matches!(row_of(&w, &last)[1], "reserved" | "extended")
    });
    assert!(safe, "still not reserved after buying time: {last}");
    eprintln!("[drill] unreserved -> {} in {:?}: {last}", row_of(&w, &last)[1], started.elapsed());
    // Step 2: the cause (active = false): start walpost. Step 4: WAL may be removed now.
    let _p = service(&config, &[]);
    w.sql(&rb.block("checkpoint").fill(&[]));
    assert_ne!(slot_field(&w, "wal_status"), "lost", "the slot was lost by the checkpoint after buying time");
    let records = consume_every_committed(&w, WAIT);
    let a = audit(&w, &records);
    assert_clean(&a);
    assert_eq!(a.duplicates, 0, "walpost stopped cleanly: nothing to send twice");
    // Step 5: once retained WAL is well below the old limit, put it back.
    let end = lsn_now(&w);
    assert!(testkit::wait_until(WAIT, || w.confirmed_flush_lsn().unwrap() >= end));
    let below = testkit::wait_until(Duration::from_secs(60), || {
        w.sql(&rb.block("checkpoint").fill(&[]));
        pretty_bytes(row_of(&w, &w.sql(&watch))[3]) < 32 << 20
    });
    assert!(below, "retained WAL did not shrink: {}", w.sql(&watch));
    w.sql(&rb.block("restore-limit").fill(&[("previous", "64MB")]));
    let after = w.sql(&watch);
    assert!(matches!(row_of(&w, &after)[1], "reserved" | "extended"), "{after}");
    insert_batches(&w, 10, 2, 10, 10, &["order", "payment"]);
    let records = consume_every_committed(&w, WAIT);
    assert_clean(&audit(&w, &records));
}

/// Rows of the batches whose commit may be after `lsn` (txlog's upper bounds): at most
/// what a reader that confirmed `lsn` sends again.
fn rows_after(w: &World, lsn: u64, size: u32) -> usize {
    let batches: usize = w
        .sql(&format!(
            "SELECT count(*) FROM public.txlog WHERE lsn_after > '{:X}/{:X}'::pg_lsn",
            lsn >> 32,
            lsn & 0xffff_ffff
        ))
        .parse()
        .unwrap();
    batches * size as usize
}

/// runbooks/slot-wal-buildup.md, "active, silent, WAL growing": the active instance is
/// hung (SIGSTOP) while a hot standby waits and events keep coming. Following the
/// runbook: /healthz of the active instance does not answer; the standby's
/// `walpost_slot_confirm_stalled_seconds` grows; pg_stat_replication and `ss` find the
/// process; `kill -KILL` it; the standby takes over. Nothing lost, order kept, duplicates
/// only of what the slot had not confirmed when the instance hung.
#[test]
fn drill_slot_wal_buildup_hung_instance_is_killed_and_the_standby_takes_over() {
    let rb = Runbook::open("slot-wal-buildup");
    let w = World::new("drill-hung");
    let config = service_config(&w, "[monitor]\ninterval_secs = 1\n[pipeline]\nmax_backoff_secs = 1\n");
    let (pa, pb) = (testkit::free_port(), testkit::free_port());
    let addr = |port: u16| format!("127.0.0.1:{port}");
    let mut active = service(&config, &["--metrics-addr", &addr(pa)]);
    assert!(w.wait_for_slot(WAIT), "{}", active.log_text());
    insert_batches(&w, 0, 2, 10, 10, &["order", "payment"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 20, WAIT);
    let standby = service(&config, &["--metrics-addr", &addr(pb)]);
    assert!(testkit::wait_until(Duration::from_secs(30), || standby.log_text().contains("in use by server process")));
    let writes = writer(&w, 2, 60, 10, 10, Duration::from_millis(200));
    std::thread::sleep(Duration::from_secs(2));

    active.signal("-STOP");
    std::thread::sleep(Duration::from_secs(1));
    let frozen_at = w.confirmed_flush_lsn().unwrap();
    // 3.1: the active instance does not answer.
    let url = |port: u16| format!("http://{}", addr(port));
    // (curl exits 28 on its timeout; what it prints is the answer.)
    let out = sh(&rb.block("healthz").fill(&[("url", &url(pa))]));
    let code = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(code, "000", "a stopped process answered /healthz");
    // 3.2: the standby sees the confirmed position standing still.
    let stalled = rb.block("stalled").fill(&[("standby-url", &url(pb))]);
    let mut seen = 0.0;
    let stalls = testkit::wait_until(Duration::from_secs(30), || {
        seen = sh_ok(&stalled).split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        seen >= 3.0
    });
    assert!(stalls, "walpost_slot_confirm_stalled_seconds stayed at {seen}");
    // 3.3: the process behind the slot.
    let reader = w.sql(&rb.block("find-reader").fill(&[("slot", &w.slot)]));
    let port = reader.split('|').nth(2).unwrap_or_else(|| panic!("no reader: {reader:?}"));
    let owner = sh_ok(&rb.block("find-process").fill(&[("client-port", port)]));
    let pid = owner
        .split("pid=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .unwrap_or_else(|| panic!("no pid in {owner:?}"));
    assert_eq!(pid, active.pid().to_string(), "{owner}");
    // 3.4: kill it; the standby takes over.
    sh_ok(&rb.block("kill-hung").fill(&[("walpost-pid", pid)]));
    assert!(active.wait_exit(Duration::from_secs(10)).is_some(), "the hung instance survived SIGKILL");
    let took_over = testkit::wait_until(Duration::from_secs(30), || standby.log_text().contains("streaming slot="));
    assert!(took_over, "{}", standby.log_text());
    writes.join().unwrap();
    let records = consume_every_committed(&w, WAIT);
    let a = audit(&w, &records);
    assert_clean(&a);
    let bound = rows_after(&w, frozen_at, 10);
    assert!(a.duplicates <= bound, "{} duplicates, but only {bound} rows were unconfirmed", a.duplicates);
    eprintln!("[drill] hung instance: stalled {seen} s, {} duplicates (bound {bound})", a.duplicates);
    let end = lsn_now(&w);
    assert!(testkit::wait_until(WAIT, || w.confirmed_flush_lsn().unwrap() >= end), "the standby does not confirm");
}

// ---- long-transaction.md ----

/// A psql session kept open (its stdin is a pipe), e.g. a forgotten `BEGIN`.
struct Session {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
}

impl Session {
    /// `tcp`: connect over TCP to 127.0.0.1 (client_addr set) instead of the Unix socket.
    fn open(w: &World, application_name: &str, tcp: bool) -> Session {
        let mut cmd = Command::new(w.pg.psql_path());
        cmd.args(["-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"]);
        if tcp {
            cmd.args(["-h", "127.0.0.1"]).env("PGPASSWORD", w.pg.password());
        } else {
            cmd.arg("-h").arg(w.pg.socket_dir());
        }
        cmd.args(["-p", &w.pg.port().to_string(), "-U", "walpost", "-d", &w.db])
            .env("PGAPPNAME", application_name)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut child = cmd.spawn().expect("psql");
        let stdin = child.stdin.take();
        Session { child, stdin }
    }

    fn send(&mut self, sql: &str) {
        let stdin = self.stdin.as_mut().expect("session closed");
        stdin.write_all(sql.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// The server pid of the session, once it is connected.
    fn pid(w: &World, application_name: &str) -> String {
        let mut pid = String::new();
        let found = testkit::wait_until(Duration::from_secs(20), || {
            pid = w.sql(&format!("SELECT pid FROM pg_stat_activity WHERE application_name = '{application_name}'"));
            !pid.is_empty()
        });
        assert!(found, "no session {application_name}");
        pid
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first `slot alarm` line naming a transaction, and its pid.
fn long_transaction_alarm(log: &str) -> Option<(String, String)> {
    let log = strip_ansi(log);
    let line = log.lines().find(|l| l.contains("slot alarm") && l.contains("transaction of server pid "))?;
    let pid = line.split("transaction of server pid ").nth(1)?.split(' ').next()?.to_owned();
    Some((line.to_owned(), pid))
}

/// runbooks/long-transaction.md: a forgotten `BEGIN` with an outbox INSERT holds the
/// slot's restart_lsn while events keep streaming. The alarm names its pid (the runbook's
/// quoted line matches); the diagnosis query's first row is the same pid; the runbook
/// terminates exactly that backend: a younger idle-in-transaction session survives, the
/// forgotten row is rolled back (never published), restart_lsn moves on, the alarm clears,
/// every committed event arrives once, in order.
#[test]
fn drill_long_transaction_is_ended_by_its_pid() {
    let rb = Runbook::open("long-transaction");
    let pg = own_pg(&[]);
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "drill-longtx");
    // docs/least-privilege.md: without it, other roles' transactions are invisible to the alarm.
    w.sql(&format!("GRANT pg_read_all_stats TO {}", w.role));
    let config = service_config(&w, "[monitor]\ninterval_secs = 1\nlong_transaction_secs = 3\n");
    let p = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    let writes = writer(&w, 0, 100, 5, 10, Duration::from_millis(300));
    let mut forgotten = Session::open(&w, "nightly-report", false);
    forgotten.send(
        "BEGIN; INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', '00000000-0000-4000-8000-0000000000ff', 'Forgotten', '{}');",
    );
    let forgotten_pid = Session::pid(&w, "nightly-report");
    let held = parse_lsn(&slot_field(&w, "restart_lsn")).unwrap();

    let mut alarm = None;
    assert!(
        testkit::wait_until(Duration::from_secs(30), || {
            alarm = long_transaction_alarm(&p.log_text());
            alarm.is_some()
        }),
        "no long-transaction alarm:\n{}",
        p.log_text()
    );
    let (line, alarm_pid) = alarm.unwrap();
    rb.block("alarm").assert_lines_in(&line);
    assert_eq!(alarm_pid, forgotten_pid, "{line}");
    assert!(line.contains("application_name 'nightly-report', client local"), "{line}");

    let diag = w.sql(&rb.block("diagnose").fill(&[]));
    let first: Vec<&str> = diag.lines().next().unwrap().split('|').collect();
    assert_eq!((first[0], first[2]), (alarm_pid.as_str(), "nightly-report"), "{diag}");
    // A younger idle-in-transaction session of another client: not the one to end.
    let mut bystander = Session::open(&w, "pool", false);
    bystander.send("BEGIN; SELECT 1;");
    let bystander_pid = Session::pid(&w, "pool");
    std::thread::sleep(Duration::from_millis(500));
    let ended = w.sql(&rb.block("terminate").fill(&[("pid", &alarm_pid)]));
    assert_eq!(ended, "t");
    let at_terminate = lsn_now(&w);
    let gone = testkit::wait_until(Duration::from_secs(10), || {
        w.sql(&format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {alarm_pid}")) == "0"
    });
    assert!(gone, "the forgotten session is still there");
    drop(forgotten);
    assert_eq!(
        w.sql(&format!("SELECT state FROM pg_stat_activity WHERE pid = {bystander_pid}")),
        "idle in transaction",
        "the runbook ended another session"
    );
    bystander.send("COMMIT;");
    drop(bystander);
    // restart_lsn moves past the ended transaction; the alarm clears.
    let moved = testkit::wait_until(Duration::from_secs(45), || {
        parse_lsn(&slot_field(&w, "restart_lsn")).unwrap() > at_terminate
    });
    assert!(moved, "restart_lsn stayed at {} (held at {held:X})", slot_field(&w, "restart_lsn"));
    assert!(testkit::wait_until(Duration::from_secs(20), || p.log_text().contains("slot alarm cleared")));
    assert_ne!(slot_field(&w, "wal_status"), "lost");
    writes.join().unwrap();
    let records = consume_every_committed(&w, WAIT);
    let a = audit(&w, &records);
    assert_clean(&a);
    assert_eq!(a.duplicates, 0);
    assert!(
        !records.iter().any(|r| r.header("eventType") == Some(&b"Forgotten"[..])),
        "a rolled-back row was published"
    );
}

/// The long-transaction alarm (log line and structured fields) names
/// the server pid, application_name and client address of the oldest transaction, so the
/// runbook can end exactly that one.
#[test]
fn regression_long_transaction_alarm_names_pid_application_and_client() {
    let w = World::new("reg-longtx");
    w.sql(&format!("GRANT pg_read_all_stats TO {}", w.role));
    let config = service_config(&w, "[monitor]\ninterval_secs = 1\nlong_transaction_secs = 2\n");
    let p = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    let mut open = Session::open(&w, "billing-batch", true);
    open.send("BEGIN; SELECT txid_current();");
    let pid = Session::pid(&w, "billing-batch");
    let mut alarm = None;
    assert!(
        testkit::wait_until(Duration::from_secs(30), || {
            alarm = long_transaction_alarm(&p.log_text());
            alarm.is_some()
        }),
        "no long-transaction alarm:\n{}",
        p.log_text()
    );
    let (line, alarm_pid) = alarm.unwrap();
    assert_eq!(alarm_pid, pid, "{line}");
    assert!(line.contains("application_name 'billing-batch', client 127.0.0.1"), "{line}");
    assert!(line.contains("see runbooks/long-transaction.md"), "{line}");
    for field in [
        format!("oldest_xact_pid={pid}"),
        "oldest_xact_application=\"billing-batch\"".into(),
        "oldest_xact_client=\"127.0.0.1\"".into(),
    ] {
        assert!(line.contains(&field), "{field} missing: {line}");
    }
    open.send("ROLLBACK;");
}

// ---- slot-lost.md ----

fn lose_the_slot(w: &World) {
    let lost = testkit::wait_until(Duration::from_secs(60), || {
        w.sql("CREATE TABLE IF NOT EXISTS public.noise (v text); INSERT INTO public.noise VALUES ('x'); SELECT pg_switch_wal(); CHECKPOINT;");
        slot_field(w, "wal_status") == "lost"
    });
    assert!(lost, "the slot was not invalidated");
}

pub(crate) fn is_snapshot(r: &Consumed) -> bool {
    r.header("walpost.snapshot") == Some(&b"true"[..])
}

/// Starts a runbook's filled recovery block (a `walpost run --snapshot ...`) and waits
/// until it has published its snapshot and streams (within `timeout`).
pub(crate) fn recover_and_stream(block: &str, timeout: Duration) -> Walpost {
    let recover = spawn_sh(block);
    let ready = testkit::wait_until(timeout, || {
        let log = recover.log_text();
        log.contains("snapshot finished") && log.contains("streaming slot=")
    });
    assert!(ready, "{}", recover.log_text());
    recover
}

/// Every event of `gap` (committed while no slot could stream it) came from the snapshot.
pub(crate) fn assert_gap_from_snapshot(records: &[Consumed], gap: &[i64]) {
    let from_snapshot: HashSet<i64> = records.iter().filter(|r| is_snapshot(r)).map(Consumed::event_id).collect();
    let missing: Vec<&i64> = gap.iter().filter(|id| !from_snapshot.contains(id)).collect();
    assert!(missing.is_empty(), "the gap must come from the snapshot; not from it: {missing:?}");
}

/// runbooks/slot-lost.md (the old runbook's `id > <last id>` cut lost
/// an event and streaming before the backfill reordered aggregates). A transaction inserts
/// before the last published event and commits after walpost stopped; more events commit;
/// the slot is lost. Following the runbook: walpost's error and `slot status` (exit 4);
/// drop the slot; the newest record timestamp over every partition (kcat); one
/// `walpost run --snapshot when_needed --snapshot-filter` with a margin, while writers go
/// on. Every event arrives (the late one too, which an id cut or a cut without margin
/// would have missed: both are checked), per-aggregate order holds, duplicates are at most
/// the rows inside the margin.
#[test]
fn drill_slot_lost_recovers_without_loss_or_reordering() {
    let rb = Runbook::open("slot-lost");
    let pg = own_pg(&[("max_slot_wal_keep_size", "1MB"), ("max_wal_size", "32MB"), ("min_wal_size", "32MB")]);
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "drill-lost");
    let config = service_config(&w, "[monitor]\ninterval_secs = 1\n");
    let mut p = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 10, 10, 20, &["order", "payment"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 100, WAIT);
    // A transaction that inserts now and commits after walpost has stopped.
    let late = {
        let (pg, db) = (w.pg, w.db.clone());
        std::thread::spawn(move || {
            pg.psql_db(
                &db,
                "BEGIN;
                 INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('order', '00000000-0000-4000-8000-0000000000ff', 'Late', '{}');
                 SELECT pg_sleep(5);
                 COMMIT;",
            )
            .expect("late transaction")
        })
    };
    assert!(testkit::wait_until(Duration::from_secs(10), || {
        w.sql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(5)%' AND pid <> pg_backend_pid()")
            == "1"
    }));
    insert_batches(&w, 10, 10, 10, 20, &["order", "payment"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 200, WAIT);
    assert!(p.terminate(Duration::from_secs(30)).unwrap().success());
    late.join().unwrap();
    insert_batches(&w, 20, 10, 10, 20, &["order", "payment"]);
    lose_the_slot(&w);

    // Symptoms: the error, and `slot status` exits 4.
    let mut p = service(&config, &[]);
    let status = p.wait_exit(WAIT).expect("walpost must stop on a lost slot");
    assert_eq!(status.code(), Some(1));
    assert!(p.log_text().contains(&texts::slot::lost(&w.slot)), "{}", p.log_text());
    let out = sh(&rb.block("status").fill(&[("config", &config)]));
    assert_eq!(out.status.code(), Some(4), "slot status of a lost slot");
    assert!(String::from_utf8_lossy(&out.stdout).contains("lost"));

    // 2. Drop the slot. 3. The newest record in Kafka.
    w.sql(&rb.block("drop-slot").fill(&[("slot", &w.slot)]));
    let topics = format!("{} {}", w.topic("order"), w.topic("payment"));
    let newest = sh_ok(&rb.block("newest").fill(&[("topics", &topics), ("brokers", &w.kafka_bootstrap)]));
    let newest = newest.trim().to_owned();
    let in_kafka = read_all(&w.kafka_bootstrap, &w.topic_prefix);
    let newest_ts = in_kafka.iter().filter_map(|r| r.timestamp).max().unwrap();
    assert_eq!(newest, newest_ts.to_string(), "the runbook's newest timestamp is not the highest of all partitions");
    // The trap: the late event has a smaller id than events in Kafka and an older
    // occurred_at than the newest record: an id cut or a cut without margin misses it.
    let late_id: i64 = w.sql("SELECT id FROM events.outbox WHERE event_type = 'Late'").parse().unwrap();
    let max_id = in_kafka.iter().map(Consumed::event_id).max().unwrap();
    assert!(late_id < max_id, "late {late_id}, newest id in Kafka {max_id}");
    assert_eq!(
        w.sql(&format!("SELECT occurred_at < to_timestamp({newest} / 1000.0) FROM events.outbox WHERE id = {late_id}")),
        "t"
    );

    // 5. One command, while the application keeps writing.
    let writes = writer(&w, 30, 20, 10, 20, Duration::from_millis(100));
    let vars = [("config", config.as_str()), ("newest-ms", newest.as_str()), ("margin", "1 minute")];
    let mut recover = recover_and_stream(&rb.block("recover").fill(&vars), WAIT);
    writes.join().unwrap();
    let records = consume_every_committed(&w, WAIT);
    let a = audit(&w, &records);
    assert_clean(&a);
    let bound: usize = w.sql(&rb.block("duplicates").fill(&vars)).parse().unwrap();
    assert!(a.duplicates <= bound, "{} duplicates, the runbook says at most {bound}", a.duplicates);
    let snapshot = records.iter().filter(|r| is_snapshot(r)).count();
    assert!(records.iter().any(|r| r.event_id() == late_id && is_snapshot(r)), "the late event came from the snapshot");
    eprintln!(
        "[drill] slot lost: {} events, {} records, {snapshot} from the snapshot, {} duplicates (bound {bound}), late id {late_id} < {max_id}",
        w.committed_rows().len(),
        records.len(),
        a.duplicates
    );
    assert!(recover.terminate(Duration::from_secs(30)).unwrap().success(), "{}", recover.log_text());
}

/// Regression: an on-call drill dropped the slot while walpost was
/// stopped; `walpost slot status` then said "walpost run or walpost slot create makes it",
/// `walpost slot create` made a new slot without looking at the lineage, and the 10 events
/// written meanwhile never reached Kafka. Now `slot status` exits 4 with the missing-slot
/// text, which names slot-lost.md and both ways on (never "slot create makes it"), and
/// `slot create` and a plain `run` refuse the same way. Following the hint (slot-lost.md:
/// skip step 2, the newest record, one `run --snapshot when_needed` with a margin) loses
/// nothing.
#[test]
fn drill_slot_dropped_while_stopped_follows_the_status_hint_and_loses_nothing() {
    let rb = Runbook::open("slot-lost");
    let w = World::new("drill-dropped");
    let config = service_config(&w, "");
    let mut p = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 1, 10, 5, &["order"]);
    wait_for_every_committed(&w, WAIT);
    assert_eq!(p.terminate(WAIT).and_then(|s| s.code()), Some(0), "{}", p.log_text());
    // Dropped behind walpost's back (not `walpost slot drop`, which forgets it on purpose).
    w.sql(&format!("SELECT pg_drop_replication_slot('{}')", w.slot));
    insert_batches(&w, 1, 1, 10, 5, &["payment"]);

    let out = sh(&rb.block("status").fill(&[("config", &config)]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(4),
        "slot status of a dropped slot:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("does not exist") && text.contains("but walpost streamed from it"), "{text}");
    assert!(text.contains("runbooks/slot-lost.md") && text.contains("--snapshot when_needed"), "{text}");
    assert!(!text.contains("slot create makes it"), "{text}");
    let create = sh(&format!("walpost slot create --config {config}"));
    let refused = String::from_utf8_lossy(&create.stderr).into_owned();
    assert_eq!(create.status.code(), Some(1), "walpost slot create must refuse:\n{refused}");
    assert!(refused.contains("but walpost streamed from it") && refused.contains("runbooks/slot-lost.md"), "{refused}");
    assert_eq!(slot_count(&w), 0, "slot create made a slot");
    let mut plain = service(&config, &[]);
    assert_eq!(plain.wait_exit(WAIT).and_then(|s| s.code()), Some(1), "{}", plain.log_text());
    assert!(plain.log_text().contains("but walpost streamed from it"), "{}", plain.log_text());
    assert_eq!(slot_count(&w), 0, "a plain run made a slot");

    // The hint: slot-lost.md's steps 3 to 5 (no slot to drop).
    let topics = format!("{} {}", w.topic("order"), w.topic("payment"));
    let newest = sh_ok(&rb.block("newest").fill(&[("topics", &topics), ("brokers", &w.kafka_bootstrap)]));
    let vars = [("config", config.as_str()), ("newest-ms", newest.trim()), ("margin", "1 minute")];
    let mut recover = recover_and_stream(&rb.block("recover").fill(&vars), WAIT);
    insert_batches(&w, 2, 1, 10, 5, &["order", "payment"]);
    let records = wait_for_every_committed(&w, WAIT);
    let a = audit(&w, &records);
    assert_clean(&a);
    let payments = records.iter().filter(|r| r.topic == w.topic("payment")).map(Consumed::event_id);
    assert_eq!(payments.collect::<std::collections::BTreeSet<_>>().len(), 15, "the 10 gap events and 5 new ones");
    assert!(recover.terminate(WAIT).unwrap().success(), "{}", recover.log_text());
}

fn slot_count(w: &World) -> u32 {
    w.sql(&format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}'", w.slot)).parse().unwrap()
}

/// `walpost slot status` exits 4 for a lost slot (0 ok, 2 warning,
/// 3 critical, 4 lost) and says the retained WAL is unknown instead of 0. And what
/// runbooks/slot-lost.md says of `--snapshot when_needed`: it drops a lost slot by itself
/// and streams from a new one.
#[test]
fn regression_slot_status_exits_4_for_a_lost_slot() {
    let pg = own_pg(&[("max_slot_wal_keep_size", "1MB"), ("max_wal_size", "32MB"), ("min_wal_size", "32MB")]);
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "reg-status-lost");
    let config = service_config(&w, "");
    let status = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_walpost"));
        cmd.args(["slot", "status", "--config", &config]);
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let created =
        Command::new(env!("CARGO_BIN_EXE_walpost")).args(["slot", "create", "--config", &config]).output().unwrap();
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    // A slot nothing streams from is a warning, as slot-check.sql says.
    let idle = status(false);
    let text = String::from_utf8_lossy(&idle.stdout).into_owned();
    assert_eq!(idle.status.code(), Some(2), "a slot nothing streams from:\n{text}");
    assert!(text.contains("no process streams from the slot"), "{text}");
    lose_the_slot(&w);
    let out = status(false);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(text.contains("unknown (the slot was invalidated)") && !text.contains("0.0 B"), "{text}");
    assert!(text.contains("runbooks/slot-lost.md"), "{text}");
    let out = status(true);
    assert_eq!(out.status.code(), Some(4));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["alarm"], "lost");

    let p = service(&config, &["--snapshot", "when_needed"]);
    let recreated = testkit::wait_until(WAIT, || {
        let log = p.log_text();
        log.contains("--snapshot when_needed drops it and takes a new snapshot") && log.contains("streaming slot=")
    });
    assert!(recreated, "{}", p.log_text());
    assert_ne!(slot_field(&w, "wal_status"), "lost");
    assert_eq!(status(false).status.code(), Some(0), "the new slot is ok");
}

// ---- a frozen instance ----

/// An active instance frozen (SIGSTOP) while events flow, with
/// `wal_sender_timeout = 5s`: the server ends its connection, the hot standby takes the
/// slot and streams; writes go on; then the frozen instance resumes (SIGCONT). It must
/// publish nothing it had read before the freeze late (a frozen instance once published
/// 1,500 records after the standby had taken over): its log says it dropped its work,
/// it becomes the standby, and among the records Kafka received after the freeze no event
/// appears twice (a late copy would be a second one there). Nothing lost, order kept,
/// duplicates only of what the slot had not confirmed at the freeze.
#[test]
fn regression_frozen_instance_drops_its_work_and_becomes_the_standby() {
    let pg = own_pg(&[("wal_sender_timeout", "5s")]);
    let w = World::on(pg, &testkit::shared_kafka().bootstrap(), "reg-frozen");
    let config = service_config(&w, "[pipeline]\nmax_backoff_secs = 1\n");
    let active = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", active.log_text());
    insert_batches(&w, 0, 2, 10, 10, &["order", "payment"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 20, WAIT);
    let standby = service(&config, &[]);
    assert!(testkit::wait_until(Duration::from_secs(30), || standby.log_text().contains("in use by server process")));
    let writes = writer(&w, 2, 150, 10, 10, Duration::from_millis(100));
    std::thread::sleep(Duration::from_secs(3));

    active.signal("-STOP");
    let stopped = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let frozen_at = w.confirmed_flush_lsn().unwrap();
    let highs_at_freeze = high_watermarks(&w.kafka_bootstrap, &w.topic_prefix);
    let took_over = testkit::wait_until(Duration::from_secs(30), || standby.log_text().contains("streaming slot="));
    assert!(took_over, "the standby did not take over:\n{}", standby.log_text());
    eprintln!("[regression] standby streaming {:?} after SIGSTOP", stopped.elapsed());
    std::thread::sleep(Duration::from_secs(2));
    active.signal("-CONT");
    let dropped =
        testkit::wait_until(Duration::from_secs(20), || active.log_text().contains("is dropped, not published late"));
    assert!(dropped, "the resumed instance did not drop its work:\n{}", active.log_text());
    let waits = testkit::wait_until(Duration::from_secs(20), || {
        let log = active.log_text();
        let after = log.split("is dropped, not published late").nth(1).unwrap_or_default().to_owned();
        after.contains("in use by server process")
    });
    assert!(waits, "the resumed instance did not become the standby:\n{}", active.log_text());
    writes.join().unwrap();
    let records = consume_every_committed(&w, WAIT);
    let a = audit(&w, &records);
    assert_clean(&a);
    let bound = rows_after(&w, frozen_at, 10);
    assert!(a.duplicates <= bound, "{} duplicates, only {bound} rows were unconfirmed at the freeze", a.duplicates);
    let mut seen_after = HashSet::new();
    let twice: Vec<i64> = records
        .iter()
        .filter(|r| r.offset >= *highs_at_freeze.get(&(r.topic.clone(), r.partition)).unwrap_or(&0))
        .map(Consumed::event_id)
        .filter(|id| !seen_after.insert(*id))
        .collect();
    assert!(twice.is_empty(), "events published twice after the freeze (a late copy): {twice:?}");
    eprintln!("[regression] frozen instance: {} records, {} duplicates (bound {bound})", records.len(), a.duplicates);
}

// ---- replay.md ----

/// A consumer of `group` on `topic` (the application whose state needs the replay):
/// reads until it has `expected` records and nothing more comes for a second, commits
/// its offsets and leaves the group.
fn consume_as_group(bootstrap: &str, group: &str, topic: &str, expected: usize) -> Vec<Consumed> {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    let c: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    c.subscribe(&[topic]).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut quiet_since = None;
    while Instant::now() < deadline {
        match c.poll(Duration::from_millis(200)) {
            Some(m) => {
                out.push(Consumed::of(&m.unwrap()));
                quiet_since = None;
            }
            None if out.len() >= expected => {
                let since = *quiet_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(1) {
                    break;
                }
            }
            None => {}
        }
    }
    assert!(out.len() >= expected, "group {group} read {} of {expected} records", out.len());
    c.commit_consumer_state(CommitMode::Sync).unwrap();
    c.unsubscribe();
    out
}

fn utc_text(w: &World) -> String {
    w.sql("SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')")
}

/// runbooks/replay.md. Events before, inside and after a range [from, to), one of them
/// large. (A) A consumer group read everything; the runbook's reset moves it back to
/// `<from>`: it reads exactly the records committed from then on again. (B) The runbook's
/// backfill into other topics, one of which refuses the large row: the backfill stops
/// naming where to resume; after the fix (poison-record.md), the printed filter resumes it:
/// every row of the range arrives, with the snapshot header, in id order per aggregate,
/// and no row before the resume point twice (it did not start over). (B') The backfill
/// into the live topics beside the running walpost: the range arrives a second time,
/// marked, nothing else changes, the stream goes on.
#[test]
fn drill_replay_resets_the_group_or_republishes_a_range_resuming_after_a_poison_row() {
    let rb = Runbook::open("replay");
    let w = World::new("drill-replay");
    // The service's real configuration, metrics port included: the runbook's backfills
    // run with it beside the service (they took its port and failed).
    let config = service_config(&w, &format!("metrics_addr = \"127.0.0.1:{}\"", testkit::free_port()));
    let _service = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT));
    let topic = w.topic("order");
    insert_batches(&w, 0, 5, 10, 10, &["order"]);
    std::thread::sleep(Duration::from_millis(1100));
    let from = utc_text(&w);
    std::thread::sleep(Duration::from_millis(100));
    insert_batches(&w, 5, 5, 10, 10, &["order"]);
    let big: i64 = w
        .sql(
            "INSERT INTO events.outbox (aggregate_type, aggregate_id, event_type, payload)
             VALUES ('order', '00000000-0000-4000-8000-000000000003', 'Big',
                     jsonb_build_object('blob', (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 200))))
             RETURNING id",
        )
        .parse()
        .unwrap();
    insert_batches(&w, 10, 5, 10, 10, &["order"]);
    std::thread::sleep(Duration::from_millis(100));
    let to = utc_text(&w);
    std::thread::sleep(Duration::from_millis(1100));
    insert_batches(&w, 15, 5, 10, 10, &["order"]);
    let live = consume_every_committed(&w, WAIT);
    assert_eq!(live.len(), 201);
    let in_range: BTreeMap<i64, Row> = {
        let ids =
            w.sql(&format!("SELECT id FROM events.outbox WHERE occurred_at >= '{from}' AND occurred_at < '{to}'"));
        let ids: HashSet<i64> = ids.lines().map(|l| l.parse().unwrap()).collect();
        w.committed_rows().into_iter().filter(|(id, _)| ids.contains(id)).collect()
    };
    assert_eq!(in_range.len(), 101);

    // Diagnosis: Kafka still holds the range.
    let oldest = sh_ok(&rb.block("oldest").fill(&[("brokers", &w.kafka_bootstrap), ("topic", &topic)]));
    let from_ms =
        live.iter().filter(|r| in_range.contains_key(&r.event_id())).filter_map(|r| r.timestamp).min().unwrap();
    let oldest: Vec<i64> =
        oldest.lines().filter_map(|l| l.strip_prefix("partition ")?.split(" oldest ").nth(1)?.parse().ok()).collect();
    assert_eq!(oldest.len(), 3, "one line per partition");
    assert!(oldest.iter().all(|&t| t < from_ms));

    // A: the consumer group read everything; reset it to <from>.
    let group = testkit::unique_name("drill-billing");
    consume_as_group(&w.kafka_bootstrap, &group, &topic, 201);
    sh_ok(&rb.block("reset-group").fill(&[
        ("brokers", &w.kafka_bootstrap),
        ("group", &group),
        ("topic", &topic),
        ("from", &from),
    ]));
    let from_epoch_ms: i64 =
        w.sql(&format!("SELECT (extract(epoch FROM '{from}'::timestamptz) * 1000)::bigint")).parse().unwrap();
    let expected: HashSet<i64> =
        live.iter().filter(|r| r.timestamp.unwrap() >= from_epoch_ms).map(Consumed::event_id).collect();
    let again = consume_as_group(&w.kafka_bootstrap, &group, &topic, expected.len());
    let again_ids: HashSet<i64> = again.iter().map(Consumed::event_id).collect();
    assert_eq!(again.len(), expected.len(), "re-read more than the records from <from> on");
    assert_eq!(again_ids, expected);
    assert!(in_range.keys().all(|id| again_ids.contains(id)), "the reset group misses part of the range");

    // B: republish into other topics; the one for "order" refuses the large row.
    let new_topics = format!("{}replay.${{routedByValue}}", w.topic_prefix);
    let replay_topic = format!("{}replay.order", w.topic_prefix);
    topic_tool(
        &w,
        &[
            "--create",
            "--topic",
            &replay_topic,
            "--partitions",
            "3",
            "--replication-factor",
            "1",
            "--config",
            "max.message.bytes=2000",
        ],
    );
    let vars = [
        ("config", config.as_str()),
        ("new-topics", new_topics.as_str()),
        ("from", from.as_str()),
        ("to", to.as_str()),
    ];
    let out = sh(&rb.block("replay-elsewhere").fill(&vars));
    let log = strip_ansi(&format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(1), "the backfill must stop on the refused row:\n{log}");
    rb.block("halt").assert_lines_in(&log);
    let resume_filter = log
        .split("--snapshot-filter \"")
        .nth(1)
        .and_then(|rest| rest.split("\" to resume").next())
        .unwrap_or_else(|| panic!("no resume filter in:\n{log}"))
        .to_owned();
    let resume_id: i64 = log.split("every row before id=").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(resume_id <= big && resume_id > *in_range.keys().next().unwrap(), "resume at {resume_id}, big {big}");
    let poison = Runbook::open("poison-record");
    sh_ok(&poison.block("raise-topic-limit").fill(&[
        ("brokers", &w.kafka_bootstrap),
        ("topic", &replay_topic),
        ("bytes", "1048588"),
    ]));
    let out = sh(&rb.block("resume").fill(&[
        ("config", &config),
        ("new-topics", &new_topics),
        ("resume-filter", &resume_filter),
    ]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let replayed = read_all(&w.kafka_bootstrap, &replay_topic);
    assert!(replayed.iter().all(is_snapshot), "a replayed record without the snapshot header");
    let mut first: HashMap<i64, usize> = HashMap::new();
    let mut per_key: HashMap<Vec<u8>, Vec<i64>> = HashMap::new();
    for r in &replayed {
        let id = r.event_id();
        *first.entry(id).or_default() += 1;
        if first[&id] == 1 {
            per_key.entry(r.key.clone().unwrap()).or_default().push(id);
        }
    }
    assert_eq!(
        first.keys().copied().collect::<HashSet<_>>(),
        in_range.keys().copied().collect(),
        "the replay is not the range"
    );
    let twice: Vec<i64> = first.iter().filter(|(_, n)| **n > 1).map(|(id, _)| *id).collect();
    assert!(twice.iter().all(|id| *id >= resume_id), "rows before the resume point sent twice: {twice:?}");
    for (key, ids) in &per_key {
        assert!(ids.windows(2).all(|p| p[0] < p[1]), "{key:?} out of order: {ids:?}");
    }
    eprintln!(
        "[drill] replay: resumed at id {resume_id} (big {big}), {} of {} rows twice",
        twice.len(),
        in_range.len()
    );

    // B': the same range into the live topics, beside the running walpost.
    sh_ok(&rb.block("replay").fill(&[("config", &config), ("from", &from), ("to", &to)]));
    insert_batches(&w, 20, 2, 10, 10, &["order"]);
    let records = consume_every_committed(&w, WAIT);
    let records = {
        // Wait for the backfill's records too (they are duplicates, so not counted above).
        let total = 221 + in_range.len();
        consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, total.max(records.len()), WAIT)
    };
    let live_topics: Vec<Consumed> = records.into_iter().filter(|r| !r.topic.contains(".replay.")).collect();
    let a = audit(&w, &live_topics);
    assert_clean(&a);
    assert_eq!(a.duplicates, in_range.len());
    let marked: HashSet<i64> = live_topics.iter().filter(|r| is_snapshot(r)).map(Consumed::event_id).collect();
    assert_eq!(marked, in_range.keys().copied().collect(), "the republished records are the range, marked");
}

// ---- kafka-outage.md ----

/// The value of `series` in the runbook's metrics block output.
fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// runbooks/kafka-outage.md: the broker stops while events keep coming. Following the
/// runbook's symptoms and diagnosis: `/readyz` answers 503 with the reason before the
/// producer restart; the metrics show Kafka's silence, connection errors, a growing lag
/// and records waiting; kcat cannot reach the brokers; the log has the quoted lines (the
/// producer restart after `delivery_timeout_secs`). Resolution: the broker comes back and
/// walpost recovers by itself: ready again, nothing lost, order kept.
#[test]
fn drill_kafka_outage_readiness_drops_and_walpost_recovers_by_itself() {
    let rb = Runbook::open("kafka-outage");
    let mut kafka = own_kafka();
    let w = World::on(testkit::shared_postgres(), &kafka.bootstrap(), "drill-kafka");
    let config = service_config(&w, "[pipeline]\ndelivery_timeout_secs = 10\nmax_backoff_secs = 2\n");
    let port = testkit::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let p = service(&config, &["--metrics-addr", &format!("127.0.0.1:{port}")]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 5, 10, 10, &["order", "payment"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 50, WAIT);
    let readyz = rb.block("readyz").fill(&[("url", &url)]);
    let metrics = rb.block("metrics").fill(&[("url", &url)]);
    assert!(testkit::wait_until(Duration::from_secs(20), || sh_ok(&readyz).ends_with("200\n")));

    kafka.stop().expect("stop kafka");
    let stopped = Instant::now();
    insert_batches(&w, 5, 5, 10, 10, &["order", "payment"]);
    // Not ready within unready_after_secs (5 s here), before the producer restart (10 s).
    let mut answer = String::new();
    assert!(
        testkit::wait_until(Duration::from_secs(20), || {
            answer = sh_ok(&readyz);
            answer.ends_with("503\n")
        }),
        "still ready: {answer}"
    );
    let not_ready_after = stopped.elapsed();
    assert!(not_ready_after < Duration::from_secs(10), "not ready only after {not_ready_after:?}");
    assert!(answer.starts_with("Kafka has acknowledged nothing for "), "{answer}");
    let mut m = String::new();
    let visible = testkit::wait_until(Duration::from_secs(20), || {
        m = sh_ok(&metrics);
        series_value(&m, "walpost_kafka_unacknowledged_seconds").unwrap_or(0.0) >= 3.0
            && series_value(&m, "walpost_produce_errors_total{class=\"connection\"}").unwrap_or(0.0) >= 1.0
            && series_value(&m, "walpost_lag_seconds").unwrap_or(0.0) >= 3.0
            && series_value(&m, "walpost_kafka_in_flight_records").unwrap_or(0.0) >= 1.0
    });
    assert!(visible, "the outage does not show in the metrics:\n{m}");
    // Diagnosis: the brokers do not answer from here.
    let out = sh(&rb.block("brokers").fill(&[("brokers", &w.kafka_bootstrap)]));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("brokers:"), "kcat reached a stopped broker");
    // The log lines the runbook quotes, the restart after delivery_timeout_secs included.
    assert!(
        testkit::wait_until(Duration::from_secs(30), || p
            .log_text()
            .contains("restarting the producer from the last confirmed position")),
        "{}",
        p.log_text()
    );
    rb.block("log").assert_lines_in(&p.log_text());
    // The producer restart does not make the instance ready, nor reset Kafka's silence.
    std::thread::sleep(Duration::from_secs(1));
    assert!(sh_ok(&readyz).ends_with("503\n"), "ready again after the producer restart, Kafka still down");
    let m = sh_ok(&metrics);
    let silent = series_value(&m, "walpost_kafka_unacknowledged_seconds").unwrap_or(0.0);
    assert!(silent >= 10.0, "walpost_kafka_unacknowledged_seconds restarted with the producer: {m}");

    // Resolution: the brokers come back; walpost recovers by itself.
    kafka.start_again().expect("start kafka again");
    insert_batches(&w, 10, 5, 10, 10, &["order", "payment"]);
    assert!(testkit::wait_until(Duration::from_secs(60), || sh_ok(&readyz).ends_with("200\n")), "not ready again");
    let records = consume_every_committed(&w, WAIT);
    assert_clean(&audit(&w, &records));
    let m = sh_ok(&metrics);
    assert_eq!(series_value(&m, "walpost_kafka_unacknowledged_seconds"), Some(0.0), "{m}");
    eprintln!("[drill] kafka outage: not ready {not_ready_after:?} after the broker stopped, Kafka silent {silent} s at the producer restart");
}

/// A Kafka outage was invisible (readiness 200 throughout, lag
/// constant, errors counted only 60 s later). With the defaults: `/readyz` answers 503
/// within 30 s of records waiting and before the producer restart at
/// `delivery_timeout_secs` (60 s); `walpost_lag_seconds` grows while the reader is stuck;
/// broker connection failures are counted during the outage.
#[test]
fn regression_kafka_outage_shows_in_readiness_lag_and_connection_errors() {
    let mut kafka = own_kafka();
    let w = World::on(testkit::shared_postgres(), &kafka.bootstrap(), "reg-kafka-visible");
    let config = service_config(&w, "[monitor]\ninterval_secs = 1\nconfirm_stalled_secs = 5\n");
    let port = testkit::free_port();
    let p = service(&config, &["--metrics-addr", &format!("127.0.0.1:{port}")]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 2, 10, 10, &["order"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 20, WAIT);
    assert!(testkit::wait_until(Duration::from_secs(20), || http_get(port, "/readyz").0 == 200));

    kafka.stop().expect("stop kafka");
    insert_batches(&w, 2, 2, 10, 10, &["order"]);
    let waiting = Instant::now();
    let connection = "walpost_produce_errors_total{class=\"connection\"}";
    assert!(
        testkit::wait_until(Duration::from_secs(25), || metric(port, connection).unwrap_or(0.0) >= 1.0),
        "no connection error counted during the outage:\n{}",
        http_get(port, "/metrics").1
    );
    std::thread::sleep(Duration::from_secs(2));
    let lag1 = metric(port, "walpost_lag_seconds").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let lag2 = metric(port, "walpost_lag_seconds").unwrap();
    assert!(lag1 >= 1.0 && lag2 >= lag1 + 2.0, "walpost_lag_seconds does not grow while stuck: {lag1} then {lag2}");
    let mut answer = (0, String::new());
    assert!(
        testkit::wait_until(Duration::from_secs(40), || {
            answer = http_get(port, "/readyz");
            answer.0 == 503
        }),
        "/readyz stayed {} during the outage",
        answer.0
    );
    let after = waiting.elapsed();
    assert!(after <= Duration::from_secs(35), "/readyz failed only after {after:?}");
    assert!(answer.1.contains("Kafka has acknowledged nothing for"), "{}", answer.1);
    assert!(!p.log_text().contains("restarting the producer"), "readiness dropped only after the producer restart");
    eprintln!("[regression] Kafka outage: /readyz 503 {after:?} after records started waiting; lag {lag1} -> {lag2}");
    // The stalled-confirm alarm says what walpost knows (Kafka is
    // silent), names no server pid, and carries no transaction's fields.
    let alarm = || {
        strip_ansi(&p.log_text())
            .lines()
            .find(|l| l.contains("slot alarm") && l.contains("has not moved"))
            .map(str::to_owned)
    };
    assert!(testkit::wait_until(Duration::from_secs(30), || alarm().is_some()), "no stalled alarm:\n{}", p.log_text());
    let line = alarm().unwrap();
    assert!(line.contains("Kafka has acknowledged nothing for") && line.contains("runbooks/kafka-outage.md"), "{line}");
    assert!(!line.contains("server pid") && !line.contains("oldest_xact_pid"), "{line}");
    assert_eq!(line.matches("(see runbooks/").count(), 1, "{line}");

    kafka.start_again().expect("start kafka again");
    assert!(testkit::wait_until(Duration::from_secs(60), || http_get(port, "/readyz").0 == 200));
    let records = consume_every_committed(&w, WAIT);
    assert_clean(&audit(&w, &records));
}

// ---- outbox-recreated.md ----

/// runbooks/outbox-recreated.md, the table left the publication and came back: rows
/// committed in between are not in the stream. walpost stops with the quoted error;
/// following the runbook: ADD TABLE, the newest record over every partition (slot-lost's
/// command), a backfill of the rows since then with a margin, restart. Every event
/// arrives, order kept. (The re-created table: `bad_inputs::regression_outbox_recreated_...`,
/// which follows the same file.)
#[test]
fn drill_outbox_left_the_publication_and_came_back() {
    let rb = Runbook::open("outbox-recreated");
    let w = World::new("drill-leftpub");
    let config = service_config(&w, "[monitor]\ninterval_secs = 1\n");
    let publication = format!("{}_pub", w.slot);
    let mut p = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT), "{}", p.log_text());
    insert_batches(&w, 0, 5, 10, 10, &["order", "payment"]);
    consume_at_least(&w.kafka_bootstrap, &w.topic_prefix, 50, WAIT);
    w.sql(&format!("ALTER PUBLICATION {publication} DROP TABLE events.outbox"));
    insert_batches(&w, 5, 3, 10, 10, &["order", "payment"]);
    let status = p.wait_exit(WAIT).unwrap_or_else(|| panic!("walpost kept running:\n{}", p.log_text()));
    assert_eq!(status.code(), Some(1));
    let table = walpost::settings::TableName { schema: "events".into(), name: "outbox".into() };
    let why = texts::outbox::publication_lacks_table(
        &publication,
        &table,
        &replication::quote_ident(&publication),
        &table.quoted(),
    );
    let expected = texts::outbox::changed(&why);
    assert!(p.log_text().contains(&expected), "{}", p.log_text());

    w.sql(&rb.block("add-table").fill(&[("publication", &publication)]));
    insert_batches(&w, 8, 2, 10, 10, &["order", "payment"]);
    let topics = format!("{} {}", w.topic("order"), w.topic("payment"));
    let newest = sh_ok(
        &Runbook::open("slot-lost").block("newest").fill(&[("topics", &topics), ("brokers", &w.kafka_bootstrap)]),
    );
    let out = sh(&rb.block("backfill-since").fill(&[
        ("config", &config),
        ("newest-ms", newest.trim()),
        ("margin", "1 minute"),
    ]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _restarted = service(&config, &[]);
    insert_batches(&w, 10, 2, 10, 10, &["order", "payment"]);
    let records = consume_every_committed(&w, WAIT);
    let a = audit(&w, &records);
    assert_clean(&a);
    assert!(records.iter().filter(|r| is_snapshot(r)).count() >= 50, "the backfill did not publish the missing rows");
    eprintln!("[drill] outbox left the publication: {} records, {} duplicates", records.len(), a.duplicates);
}

// ---- log noise while a standby waits ----

/// A healthy hot standby logged a WARN line on every retry, and the
/// producer's `enable.gapless.guarantee is experimental` warning came with every
/// reconnect. At the default log level, a standby waiting through several retries logs
/// the wait once, at INFO, and no WARN line about waiting or the gap-less setting.
#[test]
fn regression_waiting_standby_logs_no_warnings() {
    let w = World::new("reg-standby-quiet");
    let config = service_config(&w, "");
    let _active = service(&config, &[]);
    assert!(w.wait_for_slot(WAIT));
    let args: Vec<String> = ["run", "--config", &config].map(String::from).to_vec();
    let standby = Walpost::start(&args, &[("WALPOST_LOG", "info")]);
    // Backoff 0.25, 0.5, 1, 2, 4 s: five retries within about 8 s.
    std::thread::sleep(Duration::from_secs(10));
    let log = strip_ansi(&standby.log_text());
    let waiting: Vec<&str> = log.lines().filter(|l| l.contains("in use by server process")).collect();
    assert_eq!(waiting.len(), 1, "the wait is said once a minute:\n{log}");
    assert!(waiting[0].contains(" INFO "), "{}", waiting[0]);
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .filter(|l| l.contains("in use") || l.contains("waiting") || l.contains("gapless") || l.contains("gap-less"))
        .collect();
    assert!(warnings.is_empty(), "warnings from a healthy standby:\n{}", warnings.join("\n"));
}

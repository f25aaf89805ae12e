//! Writes the seed corpus of the fuzz targets in `crates/pgoutput/fuzz` with this
//! crate's own encoder, so every seed is a valid message as PostgreSQL sends it:
//!
//! ```sh
//! cargo run -p pgoutput --example fuzz_seeds -- crates/pgoutput/fuzz/corpus
//! ```
//!
//! * `decode/`: pgoutput messages, each prefixed by its length (u16, big-endian):
//!   whole sessions (Begin, Relation, Insert, Commit; streamed and two-phase
//!   transactions) and every message type alone, inside and outside a stream block.
//! * `copy_data/`: CopyData payloads: XLogData around each message, keepalives.
//! * `backend_frames/`: two bytes of chunking seed, then a server's byte stream:
//!   startup (authentication, ParameterStatus, ReadyForQuery), query results
//!   (RowDescription, DataRow, CommandComplete), errors and notices, and the
//!   CopyBoth phase with XLogData and keepalives.
//!
//! The output is deterministic; existing `seed-*` files are replaced.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a developer tool: fail loudly

use std::path::{Path, PathBuf};

use bytes::{BufMut, Bytes, BytesMut};
use pgoutput::encode::encode;
use pgoutput::wire::{self, PrimaryKeepalive, XLogData};
use pgoutput::*;

fn b(s: &[u8]) -> Bytes {
    Bytes::copy_from_slice(s)
}

const OUTBOX_OID: u32 = 16_390;

fn outbox_relation(xid: Option<u32>) -> LogicalMessage {
    let col = |flags, name: &[u8], type_oid, type_modifier| Column { flags, name: b(name), type_oid, type_modifier };
    LogicalMessage::Relation(Relation {
        xid,
        oid: OUTBOX_OID,
        namespace: b(b"events"),
        name: b(b"outbox"),
        replica_identity: b'd',
        columns: vec![
            col(1, b"id", 20, -1),
            col(0, b"aggregate_type", 25, -1),
            col(0, b"aggregate_id", 2950, -1),
            col(0, b"event_type", 25, -1),
            col(0, b"payload", 3802, -1),
            col(0, b"created_at", 1184, -1),
        ],
    })
}

fn outbox_row(id: u32, aggregate_type: &str, payload: &str) -> TupleData {
    TupleData::from_values(&[
        ColumnValue::Text(b(id.to_string().as_bytes())),
        ColumnValue::Text(b(aggregate_type.as_bytes())),
        ColumnValue::Text(b(format!("00000000-0000-4000-8000-{id:012}").as_bytes())),
        ColumnValue::Text(b(b"OrderPlaced")),
        ColumnValue::Text(b(payload.as_bytes())),
        ColumnValue::Text(b(b"2025-01-02 03:04:05.678901+00")),
    ])
}

fn insert(xid: Option<u32>, id: u32) -> LogicalMessage {
    LogicalMessage::Insert(Insert {
        xid,
        relation_oid: OUTBOX_OID,
        tuple: outbox_row(id, "order", &format!("{{\"orderId\": \"o-{id}\", \"amount\": 19900}}")),
    })
}

fn begin(xid: u32, final_lsn: u64) -> LogicalMessage {
    LogicalMessage::Begin(Begin { final_lsn: Lsn(final_lsn), commit_time: 789_000_000_000_000, xid })
}

fn commit(commit_lsn: u64, end_lsn: u64) -> LogicalMessage {
    LogicalMessage::Commit(Commit {
        flags: 0,
        commit_lsn: Lsn(commit_lsn),
        end_lsn: Lsn(end_lsn),
        commit_time: 789_000_000_000_001,
    })
}

/// Every message type with representative fields, for the given streaming state.
fn every_message(in_stream: bool) -> Vec<(&'static str, LogicalMessage)> {
    let xid = in_stream.then_some(742);
    let mixed = TupleData::from_values(&[
        ColumnValue::Text(b(b"42")),
        ColumnValue::Null,
        ColumnValue::UnchangedToast,
        ColumnValue::Binary(b(b"\x00\x01\xff")),
        ColumnValue::Text(b(b"")),
    ]);
    let key = TupleData::from_values(&[ColumnValue::Text(b(b"42"))]);
    let mut v = vec![
        ("relation", outbox_relation(xid)),
        (
            "relation-no-columns",
            LogicalMessage::Relation(Relation {
                xid,
                oid: 1,
                namespace: b(b""),
                name: b(b"t"),
                replica_identity: b'f',
                columns: vec![],
            }),
        ),
        ("type", LogicalMessage::Type(TypeMsg { xid, oid: 16_400, namespace: b(b"public"), name: b(b"mood") })),
        ("insert", insert(xid, 1)),
        ("insert-mixed-columns", LogicalMessage::Insert(Insert { xid, relation_oid: 1, tuple: mixed.clone() })),
        (
            "insert-no-columns",
            LogicalMessage::Insert(Insert { xid, relation_oid: 1, tuple: TupleData::from_values(&[]) }),
        ),
        ("update-new-only", LogicalMessage::Update(Update { xid, relation_oid: 1, old: None, new: mixed.clone() })),
        (
            "update-key",
            LogicalMessage::Update(Update {
                xid,
                relation_oid: 1,
                old: Some((OldTupleKind::Key, key.clone())),
                new: mixed.clone(),
            }),
        ),
        (
            "update-full",
            LogicalMessage::Update(Update {
                xid,
                relation_oid: 1,
                old: Some((OldTupleKind::Full, mixed.clone())),
                new: mixed.clone(),
            }),
        ),
        ("delete-key", LogicalMessage::Delete(Delete { xid, relation_oid: 1, old_kind: OldTupleKind::Key, old: key })),
        (
            "delete-full",
            LogicalMessage::Delete(Delete { xid, relation_oid: 1, old_kind: OldTupleKind::Full, old: mixed }),
        ),
        ("truncate", LogicalMessage::Truncate(Truncate { xid, options: 3, relation_oids: vec![OUTBOX_OID, 16_401] })),
        (
            "message-transactional",
            LogicalMessage::Message(Message {
                xid,
                transactional: true,
                lsn: Lsn(0x16_B374_D848),
                prefix: b(b"walpost.outbox"),
                content: b(b"{\"aggregateType\":\"order\"}"),
            }),
        ),
        (
            "message-plain",
            LogicalMessage::Message(Message {
                xid,
                transactional: false,
                lsn: Lsn(1),
                prefix: b(b""),
                content: b(b""),
            }),
        ),
    ];
    if !in_stream {
        v.extend([
            ("begin", begin(746, 0x16A_33F8)),
            ("commit", commit(0x16A_33F8, 0x16A_3428)),
            ("origin", LogicalMessage::Origin(Origin { commit_lsn: Lsn(0x16A_33F8), name: b(b"pg_16385") })),
            ("stream-start", LogicalMessage::StreamStart(StreamStart { xid: 742, first_segment: true })),
            ("stream-stop", LogicalMessage::StreamStop),
            (
                "stream-commit",
                LogicalMessage::StreamCommit(StreamCommit {
                    xid: 742,
                    flags: 0,
                    commit_lsn: Lsn(0x20_0000),
                    end_lsn: Lsn(0x20_0030),
                    commit_time: 5,
                }),
            ),
            (
                "stream-abort-v2",
                LogicalMessage::StreamAbort(StreamAbort { xid: 742, subxid: 743, abort_lsn: None, abort_time: None }),
            ),
            (
                "stream-abort-v4",
                LogicalMessage::StreamAbort(StreamAbort {
                    xid: 742,
                    subxid: 742,
                    abort_lsn: Some(Lsn(0x20_0040)),
                    abort_time: Some(6),
                }),
            ),
            (
                "begin-prepare",
                LogicalMessage::BeginPrepare(BeginPrepare {
                    prepare_lsn: Lsn(0x30_0000),
                    end_lsn: Lsn(0x30_0040),
                    prepare_time: 7,
                    xid: 800,
                    gid: b(b"tx-800"),
                }),
            ),
            (
                "prepare",
                LogicalMessage::Prepare(Prepare {
                    flags: 0,
                    prepare_lsn: Lsn(0x30_0000),
                    end_lsn: Lsn(0x30_0040),
                    prepare_time: 7,
                    xid: 800,
                    gid: b(b"tx-800"),
                }),
            ),
            (
                "commit-prepared",
                LogicalMessage::CommitPrepared(CommitPrepared {
                    flags: 0,
                    commit_lsn: Lsn(0x30_0100),
                    end_lsn: Lsn(0x30_0140),
                    commit_time: 8,
                    xid: 800,
                    gid: b(b"tx-800"),
                }),
            ),
            (
                "rollback-prepared",
                LogicalMessage::RollbackPrepared(RollbackPrepared {
                    flags: 0,
                    prepare_end_lsn: Lsn(0x30_0040),
                    rollback_end_lsn: Lsn(0x30_0200),
                    prepare_time: 7,
                    rollback_time: 9,
                    xid: 800,
                    gid: b(b"tx-800"),
                }),
            ),
            (
                "stream-prepare",
                LogicalMessage::StreamPrepare(StreamPrepare {
                    flags: 0,
                    prepare_lsn: Lsn(0x40_0000),
                    end_lsn: Lsn(0x40_0040),
                    prepare_time: 10,
                    xid: 742,
                    gid: b(b"tx-742"),
                }),
            ),
        ]);
    }
    v
}

fn encoded(msg: &LogicalMessage, in_stream: bool) -> Bytes {
    let mut out = BytesMut::new();
    encode(msg, in_stream, &mut out);
    out.freeze()
}

/// The `decode` target's input: messages with u16 length prefixes. The streaming
/// state of each message follows Stream Start/Stop, as the Decoder tracks it.
fn session(msgs: &[LogicalMessage]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut in_stream = false;
    for m in msgs {
        let bytes = encoded(m, in_stream);
        out.extend_from_slice(&u16::try_from(bytes.len()).unwrap().to_be_bytes());
        out.extend_from_slice(&bytes);
        match m {
            LogicalMessage::StreamStart(_) => in_stream = true,
            LogicalMessage::StreamStop => in_stream = false,
            _ => {}
        }
    }
    out
}

/// Named sessions: what a walpost replication connection really receives.
fn sessions() -> Vec<(&'static str, Vec<LogicalMessage>)> {
    let stream_start = |first_segment| LogicalMessage::StreamStart(StreamStart { xid: 900, first_segment });
    vec![
        (
            "outbox-one-insert",
            vec![begin(746, 0x16A_33F8), outbox_relation(None), insert(None, 1), commit(0x16A_33F8, 0x16A_3428)],
        ),
        (
            "outbox-three-transactions",
            vec![
                begin(746, 0x100),
                outbox_relation(None),
                insert(None, 1),
                insert(None, 2),
                commit(0x100, 0x130),
                begin(747, 0x200),
                insert(None, 3),
                commit(0x200, 0x230),
                begin(748, 0x300),
                outbox_relation(None),
                insert(None, 4),
                commit(0x300, 0x330),
            ],
        ),
        (
            "outbox-with-origin-and-type",
            vec![
                begin(750, 0x400),
                LogicalMessage::Origin(Origin { commit_lsn: Lsn(0x400), name: b(b"pg_1") }),
                LogicalMessage::Type(TypeMsg { xid: None, oid: 16_400, namespace: b(b"public"), name: b(b"mood") }),
                outbox_relation(None),
                insert(None, 5),
                commit(0x400, 0x430),
            ],
        ),
        (
            "streamed-transaction",
            vec![
                stream_start(true),
                outbox_relation(Some(900)),
                insert(Some(900), 10),
                LogicalMessage::StreamStop,
                stream_start(false),
                insert(Some(900), 11),
                LogicalMessage::StreamStop,
                LogicalMessage::StreamCommit(StreamCommit {
                    xid: 900,
                    flags: 0,
                    commit_lsn: Lsn(0x500),
                    end_lsn: Lsn(0x530),
                    commit_time: 1,
                }),
            ],
        ),
        (
            "streamed-abort",
            vec![
                stream_start(true),
                insert(Some(900), 12),
                LogicalMessage::StreamStop,
                LogicalMessage::StreamAbort(StreamAbort { xid: 900, subxid: 900, abort_lsn: None, abort_time: None }),
            ],
        ),
        (
            "two-phase",
            vec![
                LogicalMessage::BeginPrepare(BeginPrepare {
                    prepare_lsn: Lsn(0x600),
                    end_lsn: Lsn(0x640),
                    prepare_time: 2,
                    xid: 901,
                    gid: b(b"g1"),
                }),
                outbox_relation(None),
                insert(None, 13),
                LogicalMessage::Prepare(Prepare {
                    flags: 0,
                    prepare_lsn: Lsn(0x600),
                    end_lsn: Lsn(0x640),
                    prepare_time: 2,
                    xid: 901,
                    gid: b(b"g1"),
                }),
                LogicalMessage::CommitPrepared(CommitPrepared {
                    flags: 0,
                    commit_lsn: Lsn(0x700),
                    end_lsn: Lsn(0x740),
                    commit_time: 3,
                    xid: 901,
                    gid: b(b"g1"),
                }),
            ],
        ),
        (
            "table-less-message",
            vec![
                begin(760, 0x800),
                LogicalMessage::Message(Message {
                    xid: None,
                    transactional: true,
                    lsn: Lsn(0x7F0),
                    prefix: b(b"walpost"),
                    content: b(b"{\"aggregatetype\":\"order\",\"payload\":{}}"),
                }),
                commit(0x800, 0x830),
            ],
        ),
    ]
}

// ---- backend frames ----

fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![tag];
    v.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
    v.extend_from_slice(body);
    v
}

fn auth(code: i32, data: &[u8]) -> Vec<u8> {
    let mut body = code.to_be_bytes().to_vec();
    body.extend_from_slice(data);
    frame(b'R', &body)
}

fn param(name: &str, value: &str) -> Vec<u8> {
    frame(b'S', format!("{name}\0{value}\0").as_bytes())
}

fn startup_ok() -> Vec<u8> {
    [
        auth(0, b""),
        param("server_version", "15.8 (Debian 15.8-0+deb12u1)"),
        param("server_encoding", "UTF8"),
        param("integer_datetimes", "on"),
        frame(b'K', &[0, 0, 0x30, 0x39, 0x12, 0x34, 0x56, 0x78]),
        frame(b'Z', b"I"),
    ]
    .concat()
}

fn row_description(fields: &[(&str, u32)]) -> Vec<u8> {
    let mut body = i16::try_from(fields.len()).unwrap().to_be_bytes().to_vec();
    for (name, oid) in fields {
        body.extend_from_slice(name.as_bytes());
        body.push(0);
        body.put_u32(0); // table oid
        body.put_i16(0); // attnum
        body.put_u32(*oid);
        body.put_i16(-1); // typlen
        body.put_i32(-1); // typmod
        body.put_i16(0); // text format
    }
    frame(b'T', &body)
}

fn data_row(values: &[Option<&str>]) -> Vec<u8> {
    let mut body = i16::try_from(values.len()).unwrap().to_be_bytes().to_vec();
    for v in values {
        match v {
            Some(text) => {
                body.put_i32(i32::try_from(text.len()).unwrap());
                body.extend_from_slice(text.as_bytes());
            }
            None => body.put_i32(-1),
        }
    }
    frame(b'D', &body)
}

fn error(severity: &str, code: &str, message: &str, hint: Option<&str>) -> Vec<u8> {
    let mut body = format!("S{severity}\0V{severity}\0C{code}\0M{message}\0");
    if let Some(h) = hint {
        body.push_str(&format!("H{h}\0"));
    }
    body.push('\0');
    frame(if severity == "NOTICE" { b'N' } else { b'E' }, body.as_bytes())
}

fn copy_data(payload: &[u8]) -> Vec<u8> {
    frame(b'd', payload)
}

fn xlog(wal_start: u64, data: Bytes) -> Vec<u8> {
    let mut out = BytesMut::new();
    wire::encode_xlog_data(
        &XLogData { wal_start: Lsn(wal_start), wal_end: Lsn(wal_start + 0x100), send_time: 1, data },
        &mut out,
    );
    out.to_vec()
}

fn keepalive(wal_end: u64, reply_requested: bool) -> Vec<u8> {
    let mut out = BytesMut::new();
    wire::encode_keepalive(&PrimaryKeepalive { wal_end: Lsn(wal_end), send_time: 2, reply_requested }, &mut out);
    out.to_vec()
}

fn backend_streams() -> Vec<(&'static str, Vec<u8>)> {
    let identify = [
        row_description(&[("systemid", 25), ("timeline", 23), ("xlogpos", 25), ("dbname", 25)]),
        data_row(&[Some("7412345678901234567"), Some("1"), Some("0/16A33F8"), Some("shop")]),
        frame(b'C', b"IDENTIFY_SYSTEM\0"),
        frame(b'Z', b"I"),
    ]
    .concat();
    let create_slot = [
        row_description(&[("slot_name", 25), ("consistent_point", 25), ("snapshot_name", 25), ("output_plugin", 25)]),
        data_row(&[Some("walpost"), Some("0/16A3428"), None, Some("pgoutput")]),
        frame(b'C', b"CREATE_REPLICATION_SLOT\0"),
        frame(b'Z', b"I"),
    ]
    .concat();
    let mut in_stream = false;
    let mut copy_both = frame(b'W', &[0, 0, 0]);
    copy_both.extend(copy_data(&keepalive(0x16A_3428, false)));
    for (i, m) in sessions()[0].1.iter().enumerate() {
        copy_both.extend(copy_data(&xlog(0x16A_3400 + u64::try_from(i).unwrap(), encoded(m, in_stream))));
        match m {
            LogicalMessage::StreamStart(_) => in_stream = true,
            LogicalMessage::StreamStop => in_stream = false,
            _ => {}
        }
    }
    copy_both.extend(copy_data(&keepalive(0x16A_3500, true)));
    copy_both.extend(error("NOTICE", "00000", "a notice inside the stream", None));
    copy_both.extend(frame(b'c', b""));
    copy_both.extend(frame(b'C', b"COPY 0\0"));
    copy_both.extend(frame(b'Z', b"I"));

    let scram = auth(10, b"SCRAM-SHA-256\0\0");
    vec![
        ("startup-trust", startup_ok()),
        ("startup-md5", [auth(5, &[1, 2, 3, 4]), startup_ok()].concat()),
        ("startup-cleartext", [auth(3, b""), startup_ok()].concat()),
        ("startup-sasl", [scram, auth(11, b"r=abc,s=c2FsdA==,i=4096"), auth(12, b"v=c2lnbmF0dXJl")].concat()),
        ("startup-error", error("FATAL", "28P01", "password authentication failed for user \"walpost\"", None)),
        ("identify-system", [startup_ok(), identify.clone()].concat()),
        ("create-slot", [startup_ok(), identify, create_slot].concat()),
        (
            "query-error",
            [
                error(
                    "ERROR",
                    "55000",
                    "logical decoding requires wal_level >= logical",
                    Some("Set wal_level to logical and restart the server."),
                ),
                frame(b'Z', b"I"),
            ]
            .concat(),
        ),
        ("copy-both-session", [startup_ok(), copy_both.clone()].concat()),
        ("copy-both-only", copy_both),
        (
            "copy-both-slot-in-use",
            [error("ERROR", "55006", "replication slot \"walpost\" is active for PID 4242", None), frame(b'Z', b"I")]
                .concat(),
        ),
    ]
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
}

fn main() {
    let root =
        std::env::args_os().nth(1).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("crates/pgoutput/fuzz/corpus"));
    let (decode_dir, copy_dir, frames_dir) = (root.join("decode"), root.join("copy_data"), root.join("backend_frames"));
    for dir in [&decode_dir, &copy_dir, &frames_dir] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("seed-") {
                    std::fs::remove_file(e.path()).unwrap();
                }
            }
        }
    }
    let mut count = 0;
    for (name, msgs) in sessions() {
        write(&decode_dir, &format!("session-{name}"), &session(&msgs));
        count += 1;
    }
    for in_stream in [false, true] {
        let state = if in_stream { "in-stream" } else { "top-level" };
        for (name, msg) in every_message(in_stream) {
            // Inside a stream block the decode target needs a Stream Start first.
            let msgs = if in_stream {
                vec![LogicalMessage::StreamStart(StreamStart { xid: 742, first_segment: true }), msg.clone()]
            } else {
                vec![msg.clone()]
            };
            write(&decode_dir, &format!("{state}-{name}"), &session(&msgs));
            write(&copy_dir, &format!("xlog-{state}-{name}"), &xlog(0x16A_3400, encoded(&msg, in_stream)));
            count += 2;
        }
    }
    write(&copy_dir, "xlog-empty", &xlog(0x10, Bytes::new()));
    write(&copy_dir, "keepalive", &keepalive(0x16A_3428, false));
    write(&copy_dir, "keepalive-reply-requested", &keepalive(0xFFFF_FFFF_0000_0000, true));
    count += 3;
    for (name, stream) in backend_streams() {
        // Chunking seeds: one byte at a time-ish, and larger pieces.
        for seed in [[0x00, 0x01], [0x5A, 0xC3]] {
            let mut input = seed.to_vec();
            input.extend_from_slice(&stream);
            write(&frames_dir, &format!("{name}-{:02x}{:02x}", seed[0], seed[1]), &input);
            count += 1;
        }
    }
    println!("wrote {count} seed files under {}", root.display());
}

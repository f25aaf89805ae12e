//! Decoding tests for every message type, mostly against bytes written by
//! hand from PostgreSQL's documentation and `proto.c`, so the encoder is not
//! only ever checked against itself.
//!
//! Why one file over 600 lines: one test per message type and protocol version, read
//! side by side with the protocol page; splitting them would split that table.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)] // tests may fail loudly

use bytes::{Bytes, BytesMut};

use crate::encode::encode;
use crate::*;

fn b(bytes: &'static [u8]) -> Bytes {
    Bytes::from_static(bytes)
}

fn encoded(msg: &LogicalMessage, in_stream: bool) -> Bytes {
    let mut out = BytesMut::new();
    encode(msg, in_stream, &mut out);
    out.freeze()
}

/// Decodes `bytes`, checks the result is `expected`, that the encoder gives
/// back exactly `bytes`, and that every byte string is a slice of the input.
fn check(bytes: Bytes, in_stream: bool, expected: LogicalMessage) {
    let decoded = decode(bytes.clone(), in_stream).unwrap();
    assert_eq!(decoded, expected);
    assert_eq!(encoded(&decoded, in_stream), bytes);
    assert_zero_copy(&decoded, &bytes);
}

/// Every non-empty byte string of `msg`, including tuple values.
fn byte_strings(msg: &LogicalMessage) -> Vec<Bytes> {
    fn tuple_values(tuple: &TupleData) -> Vec<Bytes> {
        tuple
            .iter()
            .filter_map(|value| match value {
                ColumnValue::Text(bytes) | ColumnValue::Binary(bytes) => Some(bytes),
                ColumnValue::Null | ColumnValue::UnchangedToast => None,
            })
            .collect()
    }
    let strings = match msg {
        LogicalMessage::Origin(m) => vec![m.name.clone()],
        LogicalMessage::Relation(m) => {
            let mut strings = vec![m.namespace.clone(), m.name.clone()];
            strings.extend(m.columns.iter().map(|column| column.name.clone()));
            strings
        }
        LogicalMessage::Type(m) => vec![m.namespace.clone(), m.name.clone()],
        LogicalMessage::Insert(m) => tuple_values(&m.tuple),
        LogicalMessage::Update(m) => {
            let mut strings = tuple_values(&m.new);
            if let Some((_, old)) = &m.old {
                strings.extend(tuple_values(old));
            }
            strings
        }
        LogicalMessage::Delete(m) => tuple_values(&m.old),
        LogicalMessage::Message(m) => vec![m.prefix.clone(), m.content.clone()],
        LogicalMessage::BeginPrepare(m) => vec![m.gid.clone()],
        LogicalMessage::Prepare(m) => vec![m.gid.clone()],
        LogicalMessage::CommitPrepared(m) => vec![m.gid.clone()],
        LogicalMessage::RollbackPrepared(m) => vec![m.gid.clone()],
        LogicalMessage::StreamPrepare(m) => vec![m.gid.clone()],
        _ => vec![],
    };
    strings.into_iter().filter(|s| !s.is_empty()).collect()
}

pub(crate) fn assert_zero_copy(msg: &LogicalMessage, input: &Bytes) {
    let input_range = input.as_ptr_range();
    for string in byte_strings(msg) {
        let range = string.as_ptr_range();
        assert!(
            input_range.start <= range.start && range.end <= input_range.end,
            "{string:?} of {msg:?} is not a slice of the input"
        );
    }
}

/// A transaction exactly as PostgreSQL 16 sends it for
/// `INSERT INTO public.users (id, name) VALUES (1, 'alice')` on a table
/// `users (id int4 primary key, name text)` with OID 16385.
#[test]
fn decodes_a_transaction_as_postgresql_sends_it() {
    let mut decoder = Decoder::new();
    let begin = b(b"B\
        \x00\x00\x00\x00\x01\x6a\x33\xf8\
        \x00\x02\xb5\x6c\x4e\x6a\x7e\x2c\
        \x00\x00\x02\xea");
    let relation = b(b"R\
        \x00\x00\x40\x01\
        public\0\
        users\0\
        d\
        \x00\x02\
        \x01id\0\x00\x00\x00\x17\xff\xff\xff\xff\
        \x00name\0\x00\x00\x00\x19\xff\xff\xff\xff");
    let insert = b(b"I\
        \x00\x00\x40\x01\
        N\
        \x00\x02\
        t\x00\x00\x00\x011\
        t\x00\x00\x00\x05alice");
    let commit = b(b"C\
        \x00\
        \x00\x00\x00\x00\x01\x6a\x33\xf8\
        \x00\x00\x00\x00\x01\x6a\x34\x28\
        \x00\x02\xb5\x6c\x4e\x6a\x7e\x2c");

    let expected = [
        LogicalMessage::Begin(Begin { final_lsn: Lsn(0x16A_33F8), commit_time: 0x0002_b56c_4e6a_7e2c, xid: 746 }),
        LogicalMessage::Relation(Relation {
            xid: None,
            oid: 16385,
            namespace: b(b"public"),
            name: b(b"users"),
            replica_identity: b'd',
            columns: vec![
                Column { flags: 1, name: b(b"id"), type_oid: 23, type_modifier: -1 },
                Column { flags: 0, name: b(b"name"), type_oid: 25, type_modifier: -1 },
            ],
        }),
        LogicalMessage::Insert(Insert {
            xid: None,
            relation_oid: 16385,
            tuple: TupleData::from_values(&[ColumnValue::Text(b(b"1")), ColumnValue::Text(b(b"alice"))]),
        }),
        LogicalMessage::Commit(Commit {
            flags: 0,
            commit_lsn: Lsn(0x16A_33F8),
            end_lsn: Lsn(0x16A_3428),
            commit_time: 0x0002_b56c_4e6a_7e2c,
        }),
    ];
    for (bytes, expected) in [begin, relation, insert, commit].into_iter().zip(expected.clone()) {
        let decoded = decoder.decode(bytes.clone()).unwrap();
        assert_eq!(decoded, expected);
        assert_eq!(encoded(&decoded, false), bytes);
        assert_zero_copy(&decoded, &bytes);
        assert!(!decoder.in_stream());
    }

    let LogicalMessage::Relation(relation) = &expected[1] else { unreachable!() };
    assert!(relation.columns[0].is_key());
    assert!(!relation.columns[1].is_key());
    assert_eq!(expected[1].tag(), b'R');
    assert_eq!(expected[1].type_name(), "Relation");
}

#[test]
fn decodes_origin() {
    check(
        b(b"O\x00\x00\x00\x01\x00\x00\x00\x02node_a\0"),
        false,
        LogicalMessage::Origin(Origin { commit_lsn: Lsn(0x1_0000_0002), name: b(b"node_a") }),
    );
}

#[test]
fn decodes_type() {
    check(
        b(b"Y\x00\x00\x40\x10public\0mood\0"),
        false,
        LogicalMessage::Type(TypeMsg { xid: None, oid: 0x4010, namespace: b(b"public"), name: b(b"mood") }),
    );
}

#[test]
fn decodes_relation_with_no_columns_and_empty_namespace() {
    check(
        b(b"R\x00\x00\x00\x01\0t\0f\x00\x00"),
        false,
        LogicalMessage::Relation(Relation {
            xid: None,
            oid: 1,
            namespace: Bytes::new(),
            name: b(b"t"),
            replica_identity: b'f',
            columns: vec![],
        }),
    );
}

#[test]
fn decodes_updates_with_and_without_old_tuple() {
    check(
        b(b"U\x00\x00\x40\x01N\x00\x02t\x00\x00\x00\x011u"),
        false,
        LogicalMessage::Update(Update {
            xid: None,
            relation_oid: 16385,
            old: None,
            new: TupleData::from_values(&[ColumnValue::Text(b(b"1")), ColumnValue::UnchangedToast]),
        }),
    );
    check(
        b(b"U\x00\x00\x40\x01K\x00\x02t\x00\x00\x00\x011nN\x00\x02t\x00\x00\x00\x012t\x00\x00\x00\x00"),
        false,
        LogicalMessage::Update(Update {
            xid: None,
            relation_oid: 16385,
            old: Some((OldTupleKind::Key, TupleData::from_values(&[ColumnValue::Text(b(b"1")), ColumnValue::Null]))),
            new: TupleData::from_values(&[ColumnValue::Text(b(b"2")), ColumnValue::Text(Bytes::new())]),
        }),
    );
    check(
        b(b"U\x00\x00\x40\x01O\x00\x01b\x00\x00\x00\x02\x00\x01N\x00\x01n"),
        false,
        LogicalMessage::Update(Update {
            xid: None,
            relation_oid: 16385,
            old: Some((OldTupleKind::Full, TupleData::from_values(&[ColumnValue::Binary(b(b"\x00\x01"))]))),
            new: TupleData::from_values(&[ColumnValue::Null]),
        }),
    );
}

#[test]
fn decodes_deletes() {
    for (marker, kind) in [(b'K', OldTupleKind::Key), (b'O', OldTupleKind::Full)] {
        let mut bytes = b"D\x00\x00\x40\x01".to_vec();
        bytes.push(marker);
        bytes.extend_from_slice(b"\x00\x02t\x00\x00\x00\x011n");
        check(
            Bytes::from(bytes),
            false,
            LogicalMessage::Delete(Delete {
                xid: None,
                relation_oid: 16385,
                old_kind: kind,
                old: TupleData::from_values(&[ColumnValue::Text(b(b"1")), ColumnValue::Null]),
            }),
        );
    }
}

#[test]
fn decodes_truncate() {
    // Wire order: relation count, then options, then the OIDs.
    check(
        b(b"T\x00\x00\x00\x02\x03\x00\x00\x40\x01\x00\x00\x40\x02"),
        false,
        LogicalMessage::Truncate(Truncate { xid: None, options: 3, relation_oids: vec![16385, 16386] }),
    );
}

#[test]
fn decodes_logical_decoding_messages() {
    check(
        b(b"M\x01\x00\x00\x00\x00\x01\x6a\x33\xf8walpost\0\x00\x00\x00\x05hello"),
        false,
        LogicalMessage::Message(Message {
            xid: None,
            transactional: true,
            lsn: Lsn(0x16A_33F8),
            prefix: b(b"walpost"),
            content: b(b"hello"),
        }),
    );
    check(
        b(b"M\x00\x00\x00\x00\x00\x00\x00\x00\x01p\0\x00\x00\x00\x00"),
        false,
        LogicalMessage::Message(Message {
            xid: None,
            transactional: false,
            lsn: Lsn(1),
            prefix: b(b"p"),
            content: Bytes::new(),
        }),
    );
}

#[test]
fn decodes_stream_control_messages() {
    check(
        b(b"S\x00\x00\x03\xe8\x01"),
        false,
        LogicalMessage::StreamStart(StreamStart { xid: 1000, first_segment: true }),
    );
    check(b(b"E"), true, LogicalMessage::StreamStop);
    check(
        b(b"c\x00\x00\x03\xe8\x00\
            \x00\x00\x00\x00\x00\x00\x00\x10\
            \x00\x00\x00\x00\x00\x00\x00\x20\
            \x00\x00\x00\x00\x00\x00\x00\x30"),
        false,
        LogicalMessage::StreamCommit(StreamCommit {
            xid: 1000,
            flags: 0,
            commit_lsn: Lsn(0x10),
            end_lsn: Lsn(0x20),
            commit_time: 0x30,
        }),
    );
}

#[test]
fn decodes_stream_abort_in_protocol_2_and_4() {
    check(
        b(b"A\x00\x00\x03\xe8\x00\x00\x03\xe9"),
        false,
        LogicalMessage::StreamAbort(StreamAbort { xid: 1000, subxid: 1001, abort_lsn: None, abort_time: None }),
    );
    let v4 = b(b"A\x00\x00\x03\xe8\x00\x00\x03\xe8\
        \x00\x00\x00\x16\xb3\x74\xd8\x48\
        \xff\xff\xff\xff\xff\xff\xff\xfe");
    check(
        v4.clone(),
        false,
        LogicalMessage::StreamAbort(StreamAbort {
            xid: 1000,
            subxid: 1000,
            abort_lsn: Some(Lsn(0x16_B374_D848)),
            abort_time: Some(-2),
        }),
    );
    // Between the two layouts: a cut-short v4 message.
    for len in 10..v4.len() {
        let error = decode(v4.slice(..len), false).unwrap_err();
        assert!(error.is_truncated(), "{len}: {error}");
    }
    let mut longer = v4.to_vec();
    longer.push(0);
    assert_eq!(
        decode(Bytes::from(longer), false),
        Err(DecodeError::TrailingBytes { message: "Stream Abort", extra: 1 })
    );
}

#[test]
fn decodes_two_phase_messages() {
    let times = b"\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x02";
    let mut begin_prepare = b"b".to_vec();
    begin_prepare.extend_from_slice(times);
    begin_prepare.extend_from_slice(b"\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x04gid-1\0");
    check(
        Bytes::from(begin_prepare),
        false,
        LogicalMessage::BeginPrepare(BeginPrepare {
            prepare_lsn: Lsn(1),
            end_lsn: Lsn(2),
            prepare_time: 3,
            xid: 4,
            gid: b(b"gid-1"),
        }),
    );

    for tag in [b'P', b'K', b'p'] {
        let mut bytes = vec![tag, 0];
        bytes.extend_from_slice(times);
        bytes.extend_from_slice(b"\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x04gid-1\0");
        let (lsn1, lsn2, time, xid, gid) = (Lsn(1), Lsn(2), 3, 4, b(b"gid-1"));
        let expected = match tag {
            b'P' => LogicalMessage::Prepare(Prepare {
                flags: 0,
                prepare_lsn: lsn1,
                end_lsn: lsn2,
                prepare_time: time,
                xid,
                gid,
            }),
            b'K' => LogicalMessage::CommitPrepared(CommitPrepared {
                flags: 0,
                commit_lsn: lsn1,
                end_lsn: lsn2,
                commit_time: time,
                xid,
                gid,
            }),
            _ => LogicalMessage::StreamPrepare(StreamPrepare {
                flags: 0,
                prepare_lsn: lsn1,
                end_lsn: lsn2,
                prepare_time: time,
                xid,
                gid,
            }),
        };
        check(Bytes::from(bytes), false, expected);
    }

    let mut rollback = b"r\x00".to_vec();
    rollback.extend_from_slice(times);
    rollback.extend_from_slice(b"\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x05g\0");
    check(
        Bytes::from(rollback),
        false,
        LogicalMessage::RollbackPrepared(RollbackPrepared {
            flags: 0,
            prepare_end_lsn: Lsn(1),
            rollback_end_lsn: Lsn(2),
            prepare_time: 3,
            rollback_time: 4,
            xid: 5,
            gid: b(b"g"),
        }),
    );
}

/// A streamed transaction: inside Stream Start .. Stream Stop the xid comes
/// first in R, Y, I, U, D, T and M.
#[test]
fn decoder_reads_xids_inside_stream_blocks() {
    let xid = b"\x00\x00\x03\xe8";
    let with_xid = |tag: u8, rest: &[u8]| {
        let mut bytes = vec![tag];
        bytes.extend_from_slice(xid);
        bytes.extend_from_slice(rest);
        Bytes::from(bytes)
    };
    let stream = [
        b(b"S\x00\x00\x03\xe8\x01"),
        with_xid(b'R', b"\x00\x00\x40\x01public\0users\0d\x00\x00"),
        with_xid(b'Y', b"\x00\x00\x40\x10public\0mood\0"),
        with_xid(b'I', b"\x00\x00\x40\x01N\x00\x01n"),
        with_xid(b'U', b"\x00\x00\x40\x01N\x00\x01n"),
        with_xid(b'D', b"\x00\x00\x40\x01K\x00\x01n"),
        with_xid(b'T', b"\x00\x00\x00\x01\x00\x00\x00\x40\x01"),
        with_xid(b'M', b"\x01\x00\x00\x00\x00\x00\x00\x00\x01p\0\x00\x00\x00\x01x"),
        b(b"E"),
    ];
    let mut decoder = Decoder::new();
    let mut xids = vec![];
    for bytes in stream.iter().cloned() {
        let msg = decoder.decode(bytes.clone()).unwrap();
        assert_eq!(encoded(&msg, !matches!(msg, LogicalMessage::StreamStart(_))), bytes);
        match msg {
            LogicalMessage::StreamStart(_) | LogicalMessage::StreamStop => {}
            LogicalMessage::Relation(m) => xids.push(m.xid),
            LogicalMessage::Type(m) => xids.push(m.xid),
            LogicalMessage::Insert(m) => xids.push(m.xid),
            LogicalMessage::Update(m) => xids.push(m.xid),
            LogicalMessage::Delete(m) => xids.push(m.xid),
            LogicalMessage::Truncate(m) => xids.push(m.xid),
            LogicalMessage::Message(m) => xids.push(m.xid),
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(decoder.in_stream(), !matches!(stream.iter().position(|s| *s == bytes), Some(8)));
    }
    assert_eq!(xids, vec![Some(1000); 7]);
    assert!(!decoder.in_stream());

    // Outside a stream block the same bytes mean something else: the xid is
    // read as the relation OID and the rest no longer fits.
    assert!(decode(stream[3].clone(), false).is_err());
    assert_eq!(
        decode(stream[3].clone(), true).unwrap(),
        LogicalMessage::Insert(Insert {
            xid: Some(1000),
            relation_oid: 16385,
            tuple: TupleData::from_values(&[ColumnValue::Null]),
        })
    );
}

#[test]
fn a_failed_decode_leaves_the_streaming_state_alone() {
    let mut decoder = Decoder::new();
    assert!(decoder.decode(b(b"S\x00\x00\x03\xe8\x02")).is_err());
    assert!(!decoder.in_stream());
    decoder.decode(b(b"S\x00\x00\x03\xe8\x00")).unwrap();
    assert!(decoder.in_stream());
    assert!(decoder.decode(b(b"E\x00")).is_err());
    assert!(decoder.in_stream());
    decoder.decode(b(b"E")).unwrap();
    assert!(!decoder.in_stream());
}

/// One valid encoding of every message type, in and out of stream blocks.
pub(crate) fn sample_messages() -> Vec<(LogicalMessage, bool)> {
    let tuple = TupleData::from_values(&[
        ColumnValue::Text(b(b"42")),
        ColumnValue::Null,
        ColumnValue::UnchangedToast,
        ColumnValue::Binary(b(b"\x00\x01")),
    ]);
    let mut samples = vec![];
    for in_stream in [false, true] {
        let xid = in_stream.then_some(7);
        samples.extend(
            [
                LogicalMessage::Relation(Relation {
                    xid,
                    oid: 1,
                    namespace: b(b"public"),
                    name: b(b"t"),
                    replica_identity: b'd',
                    columns: vec![Column { flags: 1, name: b(b"id"), type_oid: 23, type_modifier: -1 }],
                }),
                LogicalMessage::Type(TypeMsg { xid, oid: 2, namespace: b(b"public"), name: b(b"mood") }),
                LogicalMessage::Insert(Insert { xid, relation_oid: 1, tuple: tuple.clone() }),
                LogicalMessage::Update(Update {
                    xid,
                    relation_oid: 1,
                    old: Some((OldTupleKind::Full, tuple.clone())),
                    new: tuple.clone(),
                }),
                LogicalMessage::Delete(Delete {
                    xid,
                    relation_oid: 1,
                    old_kind: OldTupleKind::Key,
                    old: tuple.clone(),
                }),
                LogicalMessage::Truncate(Truncate { xid, options: 1, relation_oids: vec![1, 2] }),
                LogicalMessage::Message(Message {
                    xid,
                    transactional: true,
                    lsn: Lsn(3),
                    prefix: b(b"p"),
                    content: b(b"body"),
                }),
            ]
            .map(|msg| (msg, in_stream)),
        );
    }
    samples.extend(
        [
            LogicalMessage::Begin(Begin { final_lsn: Lsn(1), commit_time: 2, xid: 3 }),
            LogicalMessage::Commit(Commit { flags: 0, commit_lsn: Lsn(1), end_lsn: Lsn(2), commit_time: 3 }),
            LogicalMessage::Origin(Origin { commit_lsn: Lsn(1), name: b(b"origin") }),
            LogicalMessage::StreamStart(StreamStart { xid: 7, first_segment: false }),
            LogicalMessage::StreamStop,
            LogicalMessage::StreamCommit(StreamCommit {
                xid: 7,
                flags: 0,
                commit_lsn: Lsn(1),
                end_lsn: Lsn(2),
                commit_time: 3,
            }),
            LogicalMessage::StreamAbort(StreamAbort {
                xid: 7,
                subxid: 8,
                abort_lsn: Some(Lsn(9)),
                abort_time: Some(10),
            }),
            LogicalMessage::BeginPrepare(BeginPrepare {
                prepare_lsn: Lsn(1),
                end_lsn: Lsn(2),
                prepare_time: 3,
                xid: 4,
                gid: b(b"g"),
            }),
            LogicalMessage::Prepare(Prepare {
                flags: 0,
                prepare_lsn: Lsn(1),
                end_lsn: Lsn(2),
                prepare_time: 3,
                xid: 4,
                gid: b(b"g"),
            }),
            LogicalMessage::CommitPrepared(CommitPrepared {
                flags: 0,
                commit_lsn: Lsn(1),
                end_lsn: Lsn(2),
                commit_time: 3,
                xid: 4,
                gid: b(b"g"),
            }),
            LogicalMessage::RollbackPrepared(RollbackPrepared {
                flags: 0,
                prepare_end_lsn: Lsn(1),
                rollback_end_lsn: Lsn(2),
                prepare_time: 3,
                rollback_time: 4,
                xid: 5,
                gid: b(b"g"),
            }),
            LogicalMessage::StreamPrepare(StreamPrepare {
                flags: 0,
                prepare_lsn: Lsn(1),
                end_lsn: Lsn(2),
                prepare_time: 3,
                xid: 4,
                gid: b(b"g"),
            }),
        ]
        .map(|msg| (msg, false)),
    );
    samples
}

#[test]
fn samples_cover_every_message_type() {
    let mut tags: Vec<u8> = sample_messages().iter().map(|(msg, _)| msg.tag()).collect();
    tags.sort_unstable();
    tags.dedup();
    assert_eq!(tags.len(), 19);
}

#[test]
fn every_strict_prefix_of_a_valid_message_is_truncated() {
    for (msg, in_stream) in sample_messages() {
        let bytes = encoded(&msg, in_stream);
        assert_eq!(decode(bytes.clone(), in_stream).unwrap(), msg);
        for len in 0..bytes.len() {
            // A protocol 2 Stream Abort is a prefix of a protocol 4 one.
            if msg.tag() == b'A' && len == 9 {
                continue;
            }
            match decode(bytes.slice(..len), in_stream) {
                Err(error) => assert!(error.is_truncated(), "{} cut at {len}: {error}", msg.type_name()),
                Ok(decoded) => panic!("{} cut at {len} decoded as {decoded:?}", msg.type_name()),
            }
        }
    }
}

#[test]
fn trailing_bytes_are_rejected_for_every_message_type() {
    for (msg, in_stream) in sample_messages() {
        let mut bytes = encoded(&msg, in_stream).to_vec();
        bytes.extend_from_slice(b"\0\0\0\0\0\0\0\0\0");
        assert_eq!(
            decode(Bytes::from(bytes), in_stream),
            Err(DecodeError::TrailingBytes { message: msg.type_name(), extra: 9 }),
            "{msg:?}"
        );
    }
}

#[test]
fn empty_input_and_unknown_tags() {
    assert_eq!(
        decode(Bytes::new(), false),
        Err(DecodeError::Truncated { message: "logical replication", field: "tag", needed: 1, remaining: 0 })
    );
    for tag in [0, b'Z', b'w', b'k', b'N', 0xff] {
        assert_eq!(decode(Bytes::from(vec![tag, 0, 0, 0]), false), Err(DecodeError::UnknownTag { tag }));
    }
}

fn invalid_field(result: Result<LogicalMessage, DecodeError>) -> (&'static str, &'static str, String) {
    match result {
        Err(DecodeError::Invalid { message, field, reason }) => (message, field, reason),
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[test]
fn negative_lengths_and_counts_are_invalid() {
    let cases: [(&[u8], &str, &str); 5] = [
        (b"I\x00\x00\x00\x01N\x00\x01t\xff\xff\xff\xfe", "Insert", "tuple column length"),
        (b"I\x00\x00\x00\x01N\xff\xfe", "Insert", "tuple column count"),
        (b"R\x00\x00\x00\x01\0t\0d\x80\x00", "Relation", "column count"),
        (b"T\xff\xff\xff\xff\x00", "Truncate", "relation count"),
        (b"M\x00\x00\x00\x00\x00\x00\x00\x00\x01p\0\x80\x00\x00\x00", "Message", "content length"),
    ];
    for (bytes, message, field) in cases {
        let (got_message, got_field, reason) = invalid_field(decode(Bytes::from_static(bytes), false));
        assert_eq!((got_message, got_field), (message, field));
        assert!(reason.starts_with("negative value -"), "{reason}");
    }
}

#[test]
fn counts_beyond_the_remaining_bytes_fail_before_allocating() {
    // 32767 columns of at least 10 bytes each, with 10 bytes left.
    let relation = b(b"R\x00\x00\x00\x01\0t\0d\x7f\xff\x00x\0\x00\x00\x00\x17\xff\xff");
    assert_eq!(
        decode(relation, false),
        Err(DecodeError::Truncated { message: "Relation", field: "columns", needed: 327_670, remaining: 9 })
    );
    // i32::MAX relations of 4 bytes each: the capacity check must not
    // overflow either.
    let truncate = b(b"T\x7f\xff\xff\xff\x00\x00\x00\x00\x01");
    assert_eq!(
        decode(truncate, false),
        Err(DecodeError::Truncated {
            message: "Truncate",
            field: "relation_oids",
            needed: 8_589_934_588,
            remaining: 4,
        })
    );
    let tuple = b(b"I\x00\x00\x00\x01N\x7f\xffn");
    assert!(decode(tuple, false).unwrap_err().is_truncated());
    let message = b(b"M\x00\x00\x00\x00\x00\x00\x00\x00\x01p\0\x7f\xff\xff\xffabc");
    assert_eq!(
        decode(message, false),
        Err(DecodeError::Truncated { message: "Message", field: "content", needed: 2_147_483_647, remaining: 3 })
    );
}

#[test]
fn bad_tuple_kinds_and_markers_are_invalid() {
    let (_, field, reason) = invalid_field(decode(b(b"I\x00\x00\x00\x01N\x00\x01x"), false));
    assert_eq!(field, "tuple column kind");
    assert!(reason.contains("0x78 ('x')"), "{reason}");

    let (_, field, reason) = invalid_field(decode(b(b"I\x00\x00\x00\x01K\x00\x01n"), false));
    assert_eq!(field, "new tuple marker");
    assert!(reason.contains("expected 'N', got 0x4b ('K')"), "{reason}");

    let (_, field, reason) = invalid_field(decode(b(b"U\x00\x00\x00\x01X\x00\x01n"), false));
    assert_eq!(field, "tuple marker");
    assert!(reason.contains("expected 'K', 'O' or 'N'"), "{reason}");

    let (_, field, reason) = invalid_field(decode(b(b"U\x00\x00\x00\x01K\x00\x01nK\x00\x01n"), false));
    assert_eq!(field, "new tuple marker");
    assert!(reason.contains("expected 'N', got 0x4b"), "{reason}");

    let (_, field, _) = invalid_field(decode(b(b"D\x00\x00\x00\x01N\x00\x01n"), false));
    assert_eq!(field, "old tuple marker");

    let (message, field, reason) =
        invalid_field(decode(b(b"M\x02\x00\x00\x00\x00\x00\x00\x00\x01p\0\x00\x00\x00\x00"), false));
    assert_eq!((message, field), ("Message", "flags"));
    assert_eq!(reason, "expected 0 or 1, got 2");
}

#[test]
fn strings_without_nul_are_truncated() {
    assert_eq!(
        decode(b(b"O\x00\x00\x00\x00\x00\x00\x00\x01origin"), false),
        Err(DecodeError::Truncated { message: "Origin", field: "name", needed: 7, remaining: 6 })
    );
    assert_eq!(
        decode(b(b"Y\x00\x00\x00\x01public\0mood"), false),
        Err(DecodeError::Truncated { message: "Type", field: "name", needed: 5, remaining: 4 })
    );
    // A NUL later in the message does not rescue a missing terminator: the
    // name just swallows the bytes up to it, and what follows is wrong.
    let error = decode(b(b"R\x00\x00\x00\x01public\0t\0d\x00\x01\x00col"), false).unwrap_err();
    assert!(error.is_truncated(), "{error}");
}

#[test]
fn zero_copy_for_every_sample() {
    for (msg, in_stream) in sample_messages() {
        let bytes = encoded(&msg, in_stream);
        let decoded = decode(bytes.clone(), in_stream).unwrap();
        assert_zero_copy(&decoded, &bytes);
        assert!(!byte_strings(&decoded).is_empty() || byte_strings(&msg).is_empty());
    }
}

/// The first bytes of an Insert too large to buffer (a 200 MB payload must not be held
/// whole): the relation and the columns that are whole, never a panic on any cut.
#[test]
fn insert_prefix_reads_the_whole_leading_columns_of_a_cut_insert() {
    use bytes::BytesMut;
    let tuple = TupleData::from_values(&[
        ColumnValue::Text(Bytes::from_static(b"42")),
        ColumnValue::Null,
        ColumnValue::Text(Bytes::from(vec![b'x'; 1000])),
        ColumnValue::Text(Bytes::from_static(b"tail")),
    ]);
    let insert = LogicalMessage::Insert(Insert { xid: None, relation_oid: 16384, tuple });
    let mut m = BytesMut::new();
    encode(&insert, false, &mut m);
    let m = m.freeze();
    let (oid, whole) = insert_prefix(&m).unwrap();
    assert_eq!((oid, whole.len()), (16384, 4));
    let cut = m.slice(..m.len() - 900);
    let (_, partial) = insert_prefix(&cut).unwrap();
    assert_eq!(partial.len(), 2, "the id and the NULL are whole, the long value is not");
    assert_eq!(partial.get(0), Some(ColumnValue::Text(Bytes::from_static(b"42"))));
    for n in 0..m.len() {
        let _ = insert_prefix(&m.slice(..n));
    }
    assert_eq!(insert_prefix(&Bytes::from_static(b"C")), None);
}

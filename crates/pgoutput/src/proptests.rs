//! Property tests: encode/decode round trips, and "never panics, and accepts
//! only canonical encodings" on random and mutated input.
//!
//! The RNG seed is fixed so every run checks the same cases and a failure
//! replays exactly; set `PROPTEST_RNG_SEED=<u64>` to explore other seeds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects
)] // tests may fail loudly

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

use crate::encode::encode;
use crate::tests::{assert_zero_copy, sample_messages};
use crate::wire::{self, PrimaryKeepalive, ReplicationMessage, XLogData};
use crate::*;

const DEFAULT_SEED: u64 = 0x0077_616c_706f_7374; // "walpost" in ASCII

fn config() -> ProptestConfig {
    let from_env = ProptestConfig::default();
    let rng_seed = match from_env.rng_seed {
        RngSeed::Random => RngSeed::Fixed(DEFAULT_SEED),
        chosen @ RngSeed::Fixed(_) => chosen,
    };
    ProptestConfig { cases: 512, rng_seed, ..from_env }
}

fn any_bytes(max_len: usize) -> impl Strategy<Value = Bytes> + Clone {
    prop::collection::vec(any::<u8>(), 0..max_len).prop_map(Bytes::from)
}

/// Strings as PostgreSQL sends them: any bytes but NUL.
fn cstring() -> impl Strategy<Value = Bytes> + Clone {
    prop::collection::vec(1..=u8::MAX, 0..12).prop_map(Bytes::from)
}

fn lsn() -> impl Strategy<Value = Lsn> + Clone {
    any::<u64>().prop_map(Lsn)
}

fn column_value() -> impl Strategy<Value = ColumnValue> {
    prop_oneof![
        Just(ColumnValue::Null),
        Just(ColumnValue::UnchangedToast),
        any_bytes(16).prop_map(ColumnValue::Text),
        any_bytes(16).prop_map(ColumnValue::Binary),
    ]
}

fn tuple() -> impl Strategy<Value = TupleData> {
    prop::collection::vec(column_value(), 0..6).prop_map(|values| TupleData::from_values(&values))
}

fn old_tuple_kind() -> impl Strategy<Value = OldTupleKind> {
    prop_oneof![Just(OldTupleKind::Key), Just(OldTupleKind::Full)]
}

/// Any message the decoder can produce with streaming flag `in_stream`.
fn logical_message(in_stream: bool) -> BoxedStrategy<LogicalMessage> {
    let xid = move || {
        if in_stream {
            any::<u32>().prop_map(Some).boxed()
        } else {
            Just(None).boxed()
        }
    };
    let column = (any::<u8>(), cstring(), any::<u32>(), any::<i32>())
        .prop_map(|(flags, name, type_oid, type_modifier)| Column { flags, name, type_oid, type_modifier });
    let gid_message = (any::<u8>(), lsn(), lsn(), any::<i64>(), any::<u32>(), cstring());
    prop_oneof![
        (lsn(), any::<i64>(), any::<u32>())
            .prop_map(|(final_lsn, commit_time, xid)| { LogicalMessage::Begin(Begin { final_lsn, commit_time, xid }) }),
        (any::<u8>(), lsn(), lsn(), any::<i64>()).prop_map(|(flags, commit_lsn, end_lsn, commit_time)| {
            LogicalMessage::Commit(Commit { flags, commit_lsn, end_lsn, commit_time })
        }),
        (lsn(), cstring()).prop_map(|(commit_lsn, name)| LogicalMessage::Origin(Origin { commit_lsn, name })),
        (xid(), any::<u32>(), cstring(), cstring(), any::<u8>(), prop::collection::vec(column, 0..5)).prop_map(
            |(xid, oid, namespace, name, replica_identity, columns)| {
                LogicalMessage::Relation(Relation { xid, oid, namespace, name, replica_identity, columns })
            }
        ),
        (xid(), any::<u32>(), cstring(), cstring())
            .prop_map(|(xid, oid, namespace, name)| { LogicalMessage::Type(TypeMsg { xid, oid, namespace, name }) }),
        (xid(), any::<u32>(), tuple())
            .prop_map(|(xid, relation_oid, tuple)| { LogicalMessage::Insert(Insert { xid, relation_oid, tuple }) }),
        (xid(), any::<u32>(), prop::option::of((old_tuple_kind(), tuple())), tuple()).prop_map(
            |(xid, relation_oid, old, new)| { LogicalMessage::Update(Update { xid, relation_oid, old, new }) }
        ),
        (xid(), any::<u32>(), old_tuple_kind(), tuple()).prop_map(|(xid, relation_oid, old_kind, old)| {
            LogicalMessage::Delete(Delete { xid, relation_oid, old_kind, old })
        }),
        (xid(), any::<u8>(), prop::collection::vec(any::<u32>(), 0..5)).prop_map(|(xid, options, relation_oids)| {
            LogicalMessage::Truncate(Truncate { xid, options, relation_oids })
        }),
        (xid(), any::<bool>(), lsn(), cstring(), any_bytes(24)).prop_map(
            |(xid, transactional, lsn, prefix, content)| LogicalMessage::Message(Message {
                xid,
                transactional,
                lsn,
                prefix,
                content,
            })
        ),
        (any::<u32>(), any::<bool>())
            .prop_map(|(xid, first_segment)| { LogicalMessage::StreamStart(StreamStart { xid, first_segment }) }),
        Just(LogicalMessage::StreamStop),
        (any::<u32>(), any::<u8>(), lsn(), lsn(), any::<i64>()).prop_map(
            |(xid, flags, commit_lsn, end_lsn, commit_time)| {
                LogicalMessage::StreamCommit(StreamCommit { xid, flags, commit_lsn, end_lsn, commit_time })
            }
        ),
        (any::<u32>(), any::<u32>(), prop::option::of((lsn(), any::<i64>()))).prop_map(|(xid, subxid, abort)| {
            LogicalMessage::StreamAbort(StreamAbort {
                xid,
                subxid,
                abort_lsn: abort.map(|(abort_lsn, _)| abort_lsn),
                abort_time: abort.map(|(_, abort_time)| abort_time),
            })
        }),
        (lsn(), lsn(), any::<i64>(), any::<u32>(), cstring()).prop_map(
            |(prepare_lsn, end_lsn, prepare_time, xid, gid)| {
                LogicalMessage::BeginPrepare(BeginPrepare { prepare_lsn, end_lsn, prepare_time, xid, gid })
            }
        ),
        gid_message.clone().prop_map(|(flags, prepare_lsn, end_lsn, prepare_time, xid, gid)| {
            LogicalMessage::Prepare(Prepare { flags, prepare_lsn, end_lsn, prepare_time, xid, gid })
        }),
        gid_message.clone().prop_map(|(flags, commit_lsn, end_lsn, commit_time, xid, gid)| {
            LogicalMessage::CommitPrepared(CommitPrepared { flags, commit_lsn, end_lsn, commit_time, xid, gid })
        }),
        (any::<u8>(), lsn(), lsn(), any::<i64>(), any::<i64>(), any::<u32>(), cstring()).prop_map(
            |(flags, prepare_end_lsn, rollback_end_lsn, prepare_time, rollback_time, xid, gid)| {
                LogicalMessage::RollbackPrepared(RollbackPrepared {
                    flags,
                    prepare_end_lsn,
                    rollback_end_lsn,
                    prepare_time,
                    rollback_time,
                    xid,
                    gid,
                })
            }
        ),
        gid_message.prop_map(|(flags, prepare_lsn, end_lsn, prepare_time, xid, gid)| {
            LogicalMessage::StreamPrepare(StreamPrepare { flags, prepare_lsn, end_lsn, prepare_time, xid, gid })
        }),
    ]
    .boxed()
}

/// A streaming flag and a message valid under it.
fn message_with_stream_flag() -> impl Strategy<Value = (LogicalMessage, bool)> {
    any::<bool>().prop_flat_map(|in_stream| (logical_message(in_stream), Just(in_stream)))
}

fn encoded(msg: &LogicalMessage, in_stream: bool) -> Bytes {
    let mut out = BytesMut::new();
    encode(msg, in_stream, &mut out);
    out.freeze()
}

/// Byte edits to apply to a valid encoding: (position, new byte) pairs, the
/// position taken modulo the length.
fn edits() -> impl Strategy<Value = Vec<(usize, u8)>> {
    prop::collection::vec((any::<usize>(), any::<u8>()), 1..4)
}

fn mutate(bytes: &Bytes, edits: &[(usize, u8)], cut: Option<usize>) -> Bytes {
    let mut bytes = bytes.to_vec();
    if !bytes.is_empty() {
        for &(position, byte) in edits {
            let index = position % bytes.len();
            bytes[index] = byte;
        }
    }
    if let Some(cut) = cut {
        bytes.truncate(cut % (bytes.len() + 1));
    }
    Bytes::from(bytes)
}

/// Whatever the input, decoding returns; and when it succeeds, nothing was
/// lost or tolerated: re-encoding gives back exactly the input, and every
/// byte string points into it.
fn check_decode_is_total_and_canonical(input: Bytes, in_stream: bool) -> Result<(), TestCaseError> {
    if let Ok(msg) = decode(input.clone(), in_stream) {
        prop_assert_eq!(encoded(&msg, in_stream), input.clone());
        assert_zero_copy(&msg, &input);
    }
    Ok(())
}

fn check_parse_copy_data_is_total_and_canonical(input: Bytes) -> Result<(), TestCaseError> {
    if let Ok(msg) = wire::parse_copy_data(input.clone()) {
        let mut out = BytesMut::new();
        match &msg {
            ReplicationMessage::XLogData(xlog) => wire::encode_xlog_data(xlog, &mut out),
            ReplicationMessage::PrimaryKeepalive(keepalive) => wire::encode_keepalive(keepalive, &mut out),
        }
        prop_assert_eq!(out.freeze(), input);
    }
    Ok(())
}

/// Known tags first, so random bodies reach past the tag check.
fn tagged_bytes(tags: &'static [u8]) -> impl Strategy<Value = Bytes> {
    (prop::sample::select(tags), any_bytes(48)).prop_map(|(tag, body)| {
        let mut bytes = vec![tag];
        bytes.extend_from_slice(&body);
        Bytes::from(bytes)
    })
}

const LOGICAL_TAGS: &[u8] = b"BCORYIUDTMSEcAbPKrp";

proptest! {
    #![proptest_config(config())]

    #[test]
    fn encode_then_decode_gives_back_the_message((msg, in_stream) in message_with_stream_flag()) {
        let bytes = encoded(&msg, in_stream);
        let decoded = decode(bytes.clone(), in_stream);
        prop_assert_eq!(decoded.as_ref(), Ok(&msg));
        if let Ok(decoded) = decoded {
            assert_zero_copy(&decoded, &bytes);
        }

        // The stateful decoder agrees once it is in the same streaming state.
        let mut decoder = Decoder::new();
        if in_stream {
            decoder.decode(encoded(&LogicalMessage::StreamStart(StreamStart { xid: 1, first_segment: true }), false)).unwrap();
        }
        prop_assert_eq!(decoder.decode(bytes), Ok(msg));
    }

    /// A tuple built from values gives back exactly those values, through `iter` and
    /// through `spans` + `value`; a span from another tuple never panics or reads outside.
    #[test]
    fn spans_and_iter_give_back_the_values(values in prop::collection::vec(column_value(), 0..6), other in tuple()) {
        let tuple = TupleData::from_values(&values);
        prop_assert_eq!(tuple.spans().len(), values.len());
        prop_assert_eq!(tuple.iter().collect::<Vec<_>>(), values.clone());
        let from_spans: Vec<Option<ColumnValue>> = tuple.spans().map(|s| tuple.value(s)).collect();
        prop_assert_eq!(from_spans, values.into_iter().map(Some).collect::<Vec<_>>());
        for span in other.spans() {
            let _ = tuple.value(span);
        }
    }

    #[test]
    fn strict_prefixes_of_valid_messages_are_truncated(
        (msg, in_stream) in message_with_stream_flag(),
        cut in any::<usize>(),
    ) {
        let bytes = encoded(&msg, in_stream);
        let len = cut % bytes.len();
        // A protocol 2 Stream Abort is a prefix of a protocol 4 one.
        prop_assume!(!(msg.tag() == b'A' && len == 9));
        let result = decode(bytes.slice(..len), in_stream);
        prop_assert!(matches!(&result, Err(error) if error.is_truncated()), "cut at {}: {:?}", len, result);
    }

    #[test]
    fn decoding_random_bytes_never_panics(input in any_bytes(64), in_stream in any::<bool>()) {
        check_decode_is_total_and_canonical(input, in_stream)?;
    }

    #[test]
    fn decoding_random_bodies_behind_known_tags_never_panics(
        input in tagged_bytes(LOGICAL_TAGS),
        in_stream in any::<bool>(),
    ) {
        check_decode_is_total_and_canonical(input, in_stream)?;
    }

    #[test]
    fn decoding_mutated_valid_messages_never_panics(
        (msg, in_stream) in message_with_stream_flag(),
        edits in edits(),
        cut in prop::option::of(any::<usize>()),
        flip_stream in any::<bool>(),
    ) {
        let input = mutate(&encoded(&msg, in_stream), &edits, cut);
        check_decode_is_total_and_canonical(input, in_stream ^ flip_stream)?;
    }

    #[test]
    fn decoding_mutated_samples_never_panics(
        sample in prop::sample::select(sample_messages()),
        edits in edits(),
        cut in prop::option::of(any::<usize>()),
    ) {
        let (msg, in_stream) = sample;
        let input = mutate(&encoded(&msg, in_stream), &edits, cut);
        check_decode_is_total_and_canonical(input, in_stream)?;
    }

    #[test]
    fn parsing_random_copy_data_never_panics(input in any_bytes(48)) {
        check_parse_copy_data_is_total_and_canonical(input)?;
    }

    #[test]
    fn parsing_random_copy_data_behind_known_tags_never_panics(input in tagged_bytes(b"wk")) {
        check_parse_copy_data_is_total_and_canonical(input)?;
    }

    #[test]
    fn copy_data_round_trips_and_mutations_never_panic(
        wal_start in lsn(),
        wal_end in lsn(),
        send_time in any::<i64>(),
        data in any_bytes(32),
        reply_requested in any::<bool>(),
        edits in edits(),
        cut in prop::option::of(any::<usize>()),
    ) {
        let xlog = XLogData { wal_start, wal_end, send_time, data };
        let keepalive = PrimaryKeepalive { wal_end, send_time, reply_requested };
        let mut xlog_bytes = BytesMut::new();
        wire::encode_xlog_data(&xlog, &mut xlog_bytes);
        let mut keepalive_bytes = BytesMut::new();
        wire::encode_keepalive(&keepalive, &mut keepalive_bytes);
        let (xlog_bytes, keepalive_bytes) = (xlog_bytes.freeze(), keepalive_bytes.freeze());

        prop_assert_eq!(
            wire::parse_copy_data(xlog_bytes.clone()),
            Ok(ReplicationMessage::XLogData(xlog))
        );
        prop_assert_eq!(
            wire::parse_copy_data(keepalive_bytes.clone()),
            Ok(ReplicationMessage::PrimaryKeepalive(keepalive))
        );
        for bytes in [xlog_bytes, keepalive_bytes] {
            check_parse_copy_data_is_total_and_canonical(mutate(&bytes, &edits, cut))?;
        }
    }

    #[test]
    fn lsn_text_round_trips(value in any::<u64>()) {
        let lsn = Lsn(value);
        let text = lsn.to_string();
        prop_assert_eq!(text.parse::<Lsn>(), Ok(lsn));
        prop_assert_eq!(text.to_lowercase().parse::<Lsn>(), Ok(lsn));
        prop_assert_eq!(text.clone(), text.to_uppercase());
    }

    #[test]
    fn lsn_parsing_random_text_never_panics(text in "[0-9a-fA-F/+ x-]{0,20}") {
        if let Ok(lsn) = text.parse::<Lsn>() {
            // Canonical up to case and leading zeros.
            let (high, low) = text.split_once('/').unwrap();
            let strip = |half: &str| {
                let trimmed = half.trim_start_matches('0').to_uppercase();
                if trimmed.is_empty() { "0".to_owned() } else { trimmed }
            };
            prop_assert_eq!(lsn.to_string(), format!("{}/{}", strip(high), strip(low)));
        }
    }
}

//! A faithful encoder, the inverse of [`crate::decode`]: for property tests,
//! fuzz seed corpora and fake servers in tests.
//!
//! For every message `m` the decoder can produce with streaming flag `s`,
//! `decode(encode(m, s), s) == m`. Messages the decoder cannot produce have no
//! exact encoding; the encoder still never panics on them and writes the
//! closest thing:
//!
//! * xid-carrying messages (Relation, Type, Insert, Update, Delete, Truncate,
//!   Message) get their xid written exactly when `in_stream` is true, as the
//!   decoder expects; `xid: None` inside a stream is written as 0
//!   (`InvalidTransactionId`) and `Some` outside a stream is dropped;
//! * strings must not contain NUL bytes (PostgreSQL's never do): one inside
//!   would end the string early on decoding;
//! * a Stream Abort with only one of `abort_lsn`/`abort_time` writes both,
//!   the missing one as 0;
//! * counts and lengths beyond what the wire's Int16/Int32 can say are cut to
//!   the largest representable (see [`crate::TupleData::from_values`]).

use bytes::{BufMut, BytesMut};

use crate::message::*;
use crate::Lsn;

/// Appends the wire form of `msg` (starting with its tag byte) to `out`.
/// `in_stream` must be the streaming state the decoder will be in.
pub fn encode(msg: &LogicalMessage, in_stream: bool, out: &mut BytesMut) {
    out.put_u8(msg.tag());
    match msg {
        LogicalMessage::Begin(m) => {
            put_lsn(out, m.final_lsn);
            out.put_i64(m.commit_time);
            out.put_u32(m.xid);
        }
        LogicalMessage::Commit(m) => {
            out.put_u8(m.flags);
            put_lsn(out, m.commit_lsn);
            put_lsn(out, m.end_lsn);
            out.put_i64(m.commit_time);
        }
        LogicalMessage::Origin(m) => {
            put_lsn(out, m.commit_lsn);
            put_cstr(out, &m.name);
        }
        LogicalMessage::Relation(m) => {
            put_stream_xid(out, m.xid, in_stream);
            out.put_u32(m.oid);
            put_cstr(out, &m.namespace);
            put_cstr(out, &m.name);
            out.put_u8(m.replica_identity);
            let column_count = i16::try_from(m.columns.len()).unwrap_or(i16::MAX);
            out.put_i16(column_count);
            for column in m.columns.iter().take(column_count.unsigned_abs().into()) {
                out.put_u8(column.flags);
                put_cstr(out, &column.name);
                out.put_u32(column.type_oid);
                out.put_i32(column.type_modifier);
            }
        }
        LogicalMessage::Type(m) => {
            put_stream_xid(out, m.xid, in_stream);
            out.put_u32(m.oid);
            put_cstr(out, &m.namespace);
            put_cstr(out, &m.name);
        }
        LogicalMessage::Insert(m) => {
            put_stream_xid(out, m.xid, in_stream);
            out.put_u32(m.relation_oid);
            out.put_u8(b'N');
            m.tuple.encode(out);
        }
        LogicalMessage::Update(m) => {
            put_stream_xid(out, m.xid, in_stream);
            out.put_u32(m.relation_oid);
            if let Some((kind, old)) = &m.old {
                out.put_u8(kind.tag());
                old.encode(out);
            }
            out.put_u8(b'N');
            m.new.encode(out);
        }
        LogicalMessage::Delete(m) => {
            put_stream_xid(out, m.xid, in_stream);
            out.put_u32(m.relation_oid);
            out.put_u8(m.old_kind.tag());
            m.old.encode(out);
        }
        LogicalMessage::Truncate(m) => {
            put_stream_xid(out, m.xid, in_stream);
            let relation_count = i32::try_from(m.relation_oids.len()).unwrap_or(i32::MAX);
            out.put_i32(relation_count);
            out.put_u8(m.options);
            let written = usize::try_from(relation_count).unwrap_or(usize::MAX);
            for oid in m.relation_oids.iter().take(written) {
                out.put_u32(*oid);
            }
        }
        LogicalMessage::Message(m) => {
            put_stream_xid(out, m.xid, in_stream);
            out.put_u8(u8::from(m.transactional));
            put_lsn(out, m.lsn);
            put_cstr(out, &m.prefix);
            let max_len = usize::try_from(i32::MAX).unwrap_or(usize::MAX);
            let content: &[u8] = m.content.get(..max_len).unwrap_or(m.content.as_ref());
            out.put_i32(i32::try_from(content.len()).unwrap_or(i32::MAX));
            out.put_slice(content);
        }
        LogicalMessage::StreamStart(m) => {
            out.put_u32(m.xid);
            out.put_u8(u8::from(m.first_segment));
        }
        LogicalMessage::StreamStop => {}
        LogicalMessage::StreamCommit(m) => {
            out.put_u32(m.xid);
            out.put_u8(m.flags);
            put_lsn(out, m.commit_lsn);
            put_lsn(out, m.end_lsn);
            out.put_i64(m.commit_time);
        }
        LogicalMessage::StreamAbort(m) => {
            out.put_u32(m.xid);
            out.put_u32(m.subxid);
            if m.abort_lsn.is_some() || m.abort_time.is_some() {
                put_lsn(out, m.abort_lsn.unwrap_or(Lsn::ZERO));
                out.put_i64(m.abort_time.unwrap_or(0));
            }
        }
        LogicalMessage::BeginPrepare(m) => {
            put_lsn(out, m.prepare_lsn);
            put_lsn(out, m.end_lsn);
            out.put_i64(m.prepare_time);
            out.put_u32(m.xid);
            put_cstr(out, &m.gid);
        }
        LogicalMessage::Prepare(m) => {
            out.put_u8(m.flags);
            put_lsn(out, m.prepare_lsn);
            put_lsn(out, m.end_lsn);
            out.put_i64(m.prepare_time);
            out.put_u32(m.xid);
            put_cstr(out, &m.gid);
        }
        LogicalMessage::CommitPrepared(m) => {
            out.put_u8(m.flags);
            put_lsn(out, m.commit_lsn);
            put_lsn(out, m.end_lsn);
            out.put_i64(m.commit_time);
            out.put_u32(m.xid);
            put_cstr(out, &m.gid);
        }
        LogicalMessage::RollbackPrepared(m) => {
            out.put_u8(m.flags);
            put_lsn(out, m.prepare_end_lsn);
            put_lsn(out, m.rollback_end_lsn);
            out.put_i64(m.prepare_time);
            out.put_i64(m.rollback_time);
            out.put_u32(m.xid);
            put_cstr(out, &m.gid);
        }
        LogicalMessage::StreamPrepare(m) => {
            out.put_u8(m.flags);
            put_lsn(out, m.prepare_lsn);
            put_lsn(out, m.end_lsn);
            out.put_i64(m.prepare_time);
            out.put_u32(m.xid);
            put_cstr(out, &m.gid);
        }
    }
}

fn put_lsn(out: &mut BytesMut, lsn: Lsn) {
    out.put_u64(lsn.0);
}

fn put_cstr(out: &mut BytesMut, text: &[u8]) {
    out.put_slice(text);
    out.put_u8(0);
}

fn put_stream_xid(out: &mut BytesMut, xid: Option<u32>, in_stream: bool) {
    if in_stream {
        out.put_u32(xid.unwrap_or(0));
    }
}

//! pgoutput message decoding.

use bytes::Bytes;

use crate::message::*;
use crate::reader::Reader;
use crate::{DecodeError, TupleData};

/// Smallest encoding of a Relation column: flags Int8, an empty name (just
/// its NUL), type OID Int32, type modifier Int32.
const MIN_RELATION_COLUMN_SIZE: usize = 1 + 1 + 4 + 4;
/// Each relation in a Truncate is an Int32 OID.
const TRUNCATE_OID_SIZE: usize = 4;

/// Decodes pgoutput messages, tracking the one piece of state the protocol
/// needs.
///
/// Between Stream Start and Stream Stop (protocol ≥ 2, `streaming` on) the
/// messages Relation, Type, Insert, Update, Delete, Truncate and Message carry
/// the Int32 xid of their transaction first. The decoder enters that mode when
/// it decodes a Stream Start and leaves it at Stream Stop; a message that
/// fails to decode changes nothing.
///
/// Feed it every XLogData payload of one replication session in order. It
/// does not police the order of messages (a Stream Start inside a stream block
/// just keeps the block open): that is the consumer's concern.
#[derive(Debug, Clone, Default)]
pub struct Decoder {
    in_stream: bool,
}

impl Decoder {
    /// A decoder outside any stream block, as at the start of a session.
    pub fn new() -> Self {
        Decoder::default()
    }

    /// Decodes one message (the `data` of an XLogData) and updates the
    /// streaming state. Byte strings in the result are slices of `data`.
    pub fn decode(&mut self, data: Bytes) -> Result<LogicalMessage, DecodeError> {
        let message = decode(data, self.in_stream)?;
        match message {
            LogicalMessage::StreamStart(_) => self.in_stream = true,
            LogicalMessage::StreamStop => self.in_stream = false,
            _ => {}
        }
        Ok(message)
    }

    /// Whether the decoder is inside a stream block (after Stream Start,
    /// before Stream Stop).
    pub fn in_stream(&self) -> bool {
        self.in_stream
    }
}

/// Decodes one message without tracking state: `in_stream` says whether the
/// message is inside a stream block, i.e. whether the xid-carrying messages
/// (Relation, Type, Insert, Update, Delete, Truncate, Message) start with
/// their xid. Byte strings in the result are slices of `data`.
pub fn decode(data: Bytes, in_stream: bool) -> Result<LogicalMessage, DecodeError> {
    let Some(&tag) = data.first() else {
        return Err(DecodeError::Truncated { message: "logical replication", field: "tag", needed: 1, remaining: 0 });
    };
    let name = message_name(tag).ok_or(DecodeError::UnknownTag { tag })?;
    let mut reader = Reader::new(data, name);
    reader.u8("tag")?;
    let r = &mut reader;
    let message = match tag {
        b'B' => LogicalMessage::Begin(Begin {
            final_lsn: r.lsn("final_lsn")?,
            commit_time: r.i64("commit_time")?,
            xid: r.u32("xid")?,
        }),
        b'C' => LogicalMessage::Commit(Commit {
            flags: r.u8("flags")?,
            commit_lsn: r.lsn("commit_lsn")?,
            end_lsn: r.lsn("end_lsn")?,
            commit_time: r.i64("commit_time")?,
        }),
        b'O' => LogicalMessage::Origin(Origin { commit_lsn: r.lsn("commit_lsn")?, name: r.cstr("name")? }),
        b'R' => LogicalMessage::Relation(decode_relation(r, in_stream)?),
        b'Y' => LogicalMessage::Type(TypeMsg {
            xid: stream_xid(r, in_stream)?,
            oid: r.u32("oid")?,
            namespace: r.cstr("namespace")?,
            name: r.cstr("name")?,
        }),
        b'I' => LogicalMessage::Insert(decode_insert(r, in_stream)?),
        b'U' => LogicalMessage::Update(decode_update(r, in_stream)?),
        b'D' => LogicalMessage::Delete(decode_delete(r, in_stream)?),
        b'T' => LogicalMessage::Truncate(decode_truncate(r, in_stream)?),
        b'M' => LogicalMessage::Message(decode_message(r, in_stream)?),
        b'S' => {
            LogicalMessage::StreamStart(StreamStart { xid: r.u32("xid")?, first_segment: r.bool("first_segment")? })
        }
        b'E' => LogicalMessage::StreamStop,
        b'c' => LogicalMessage::StreamCommit(StreamCommit {
            xid: r.u32("xid")?,
            flags: r.u8("flags")?,
            commit_lsn: r.lsn("commit_lsn")?,
            end_lsn: r.lsn("end_lsn")?,
            commit_time: r.i64("commit_time")?,
        }),
        b'A' => LogicalMessage::StreamAbort(decode_stream_abort(r)?),
        b'b' => LogicalMessage::BeginPrepare(BeginPrepare {
            prepare_lsn: r.lsn("prepare_lsn")?,
            end_lsn: r.lsn("end_lsn")?,
            prepare_time: r.i64("prepare_time")?,
            xid: r.u32("xid")?,
            gid: r.cstr("gid")?,
        }),
        b'P' => LogicalMessage::Prepare(Prepare {
            flags: r.u8("flags")?,
            prepare_lsn: r.lsn("prepare_lsn")?,
            end_lsn: r.lsn("end_lsn")?,
            prepare_time: r.i64("prepare_time")?,
            xid: r.u32("xid")?,
            gid: r.cstr("gid")?,
        }),
        b'K' => LogicalMessage::CommitPrepared(CommitPrepared {
            flags: r.u8("flags")?,
            commit_lsn: r.lsn("commit_lsn")?,
            end_lsn: r.lsn("end_lsn")?,
            commit_time: r.i64("commit_time")?,
            xid: r.u32("xid")?,
            gid: r.cstr("gid")?,
        }),
        b'r' => LogicalMessage::RollbackPrepared(RollbackPrepared {
            flags: r.u8("flags")?,
            prepare_end_lsn: r.lsn("prepare_end_lsn")?,
            rollback_end_lsn: r.lsn("rollback_end_lsn")?,
            prepare_time: r.i64("prepare_time")?,
            rollback_time: r.i64("rollback_time")?,
            xid: r.u32("xid")?,
            gid: r.cstr("gid")?,
        }),
        b'p' => LogicalMessage::StreamPrepare(StreamPrepare {
            flags: r.u8("flags")?,
            prepare_lsn: r.lsn("prepare_lsn")?,
            end_lsn: r.lsn("end_lsn")?,
            prepare_time: r.i64("prepare_time")?,
            xid: r.u32("xid")?,
            gid: r.cstr("gid")?,
        }),
        // `message_name` above accepted exactly the tags matched here.
        _ => return Err(DecodeError::UnknownTag { tag }),
    };
    reader.finish()?;
    Ok(message)
}

/// The xid that opens xid-carrying messages inside a stream block.
fn stream_xid(r: &mut Reader, in_stream: bool) -> Result<Option<u32>, DecodeError> {
    in_stream.then(|| r.u32("xid")).transpose()
}

fn decode_relation(r: &mut Reader, in_stream: bool) -> Result<Relation, DecodeError> {
    let xid = stream_xid(r, in_stream)?;
    let oid = r.u32("oid")?;
    let namespace = r.cstr("namespace")?;
    let name = r.cstr("name")?;
    let replica_identity = r.u8("replica_identity")?;
    let column_count = usize::from(r.non_negative_i16("column count")?);
    r.check_room_for(column_count, MIN_RELATION_COLUMN_SIZE, "columns")?;
    let mut columns = Vec::with_capacity(column_count);
    for _ in 0..column_count {
        columns.push(Column {
            flags: r.u8("column flags")?,
            name: r.cstr("column name")?,
            type_oid: r.u32("column type_oid")?,
            type_modifier: r.i32("column type_modifier")?,
        });
    }
    Ok(Relation { xid, oid, namespace, name, replica_identity, columns })
}

fn decode_insert(r: &mut Reader, in_stream: bool) -> Result<Insert, DecodeError> {
    let xid = stream_xid(r, in_stream)?;
    let relation_oid = r.u32("relation_oid")?;
    let marker = r.u8("new tuple marker")?;
    if marker != b'N' {
        return Err(r.invalid("new tuple marker", format!("expected 'N', got {}", describe_byte(marker))));
    }
    Ok(Insert { xid, relation_oid, tuple: TupleData::decode(r)? })
}

/// The start of an Insert message cut off somewhere in its tuple (a message too large to
/// buffer whole: only its first bytes were kept): the relation and the columns that are
/// whole in `prefix`, in order. `None` when `prefix` is not the start of an Insert (outside
/// a stream block) or ends before its column count.
pub fn insert_prefix(prefix: &Bytes) -> Option<(u32, TupleData)> {
    let mut r = Reader::new(prefix.clone(), "Insert");
    if r.u8("tag").ok()? != b'I' {
        return None;
    }
    let relation_oid = r.u32("relation_oid").ok()?;
    if r.u8("new tuple marker").ok()? != b'N' {
        return None;
    }
    let declared = r.non_negative_i16("tuple column count").ok()?;
    let mut columns = r.rest().clone();
    let before = r.remaining();
    let (mut whole, mut whole_len) = (0u16, 0usize);
    while whole < declared && TupleData::skip_one(&mut r).is_ok() {
        whole = whole.saturating_add(1);
        // The walk only ever shrinks the reader, so this never saturates.
        whole_len = before.saturating_sub(r.remaining());
    }
    columns.truncate(whole_len);
    Some((relation_oid, TupleData::from_validated(columns, whole)))
}

fn decode_update(r: &mut Reader, in_stream: bool) -> Result<Update, DecodeError> {
    let xid = stream_xid(r, in_stream)?;
    let relation_oid = r.u32("relation_oid")?;
    let first_marker = r.u8("tuple marker")?;
    let (old, new_marker, marker_field, expected) = match old_tuple_kind(first_marker) {
        Some(kind) => {
            let old_tuple = TupleData::decode(r)?;
            let new_marker = r.u8("new tuple marker")?;
            (Some((kind, old_tuple)), new_marker, "new tuple marker", "'N'")
        }
        None => (None, first_marker, "tuple marker", "'K', 'O' or 'N'"),
    };
    if new_marker != b'N' {
        return Err(r.invalid(marker_field, format!("expected {expected}, got {}", describe_byte(new_marker))));
    }
    Ok(Update { xid, relation_oid, old, new: TupleData::decode(r)? })
}

fn decode_delete(r: &mut Reader, in_stream: bool) -> Result<Delete, DecodeError> {
    let xid = stream_xid(r, in_stream)?;
    let relation_oid = r.u32("relation_oid")?;
    let marker = r.u8("old tuple marker")?;
    let old_kind = old_tuple_kind(marker)
        .ok_or_else(|| r.invalid("old tuple marker", format!("expected 'K' or 'O', got {}", describe_byte(marker))))?;
    Ok(Delete { xid, relation_oid, old_kind, old: TupleData::decode(r)? })
}

fn old_tuple_kind(marker: u8) -> Option<OldTupleKind> {
    match marker {
        b'K' => Some(OldTupleKind::Key),
        b'O' => Some(OldTupleKind::Full),
        _ => None,
    }
}

fn describe_byte(byte: u8) -> String {
    format!("{byte:#04x} ('{}')", char::from(byte).escape_default())
}

fn decode_truncate(r: &mut Reader, in_stream: bool) -> Result<Truncate, DecodeError> {
    let xid = stream_xid(r, in_stream)?;
    let relation_count = r.non_negative_i32("relation count")?;
    let options = r.u8("options")?;
    r.check_room_for(relation_count, TRUNCATE_OID_SIZE, "relation_oids")?;
    let mut relation_oids = Vec::with_capacity(relation_count);
    for _ in 0..relation_count {
        relation_oids.push(r.u32("relation_oids")?);
    }
    Ok(Truncate { xid, options, relation_oids })
}

fn decode_message(r: &mut Reader, in_stream: bool) -> Result<Message, DecodeError> {
    let xid = stream_xid(r, in_stream)?;
    let transactional = r.bool("flags")?;
    let lsn = r.lsn("lsn")?;
    let prefix = r.cstr("prefix")?;
    let content_len = r.non_negative_i32("content length")?;
    let content = r.bytes(content_len, "content")?;
    Ok(Message { xid, transactional, lsn, prefix, content })
}

fn decode_stream_abort(r: &mut Reader) -> Result<StreamAbort, DecodeError> {
    let xid = r.u32("xid")?;
    let subxid = r.u32("subxid")?;
    // Protocol 4 with parallel streaming appends the abort LSN and time; older
    // protocols end here. Anything in between is a cut-short v4 message.
    let (abort_lsn, abort_time) =
        if r.remaining() == 0 { (None, None) } else { (Some(r.lsn("abort_lsn")?), Some(r.i64("abort_time")?)) };
    Ok(StreamAbort { xid, subxid, abort_lsn, abort_time })
}

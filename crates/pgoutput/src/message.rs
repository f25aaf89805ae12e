//! The decoded pgoutput messages.
//!
//! Field names follow PostgreSQL's "Logical Replication Message Formats".
//! Timestamps are µs since 2000-01-01 UTC, as sent (see
//! [`crate::pg_epoch_micros_to_unix_micros`]). Names are raw bytes in the
//! server encoding, without their NUL terminator.

use bytes::Bytes;

use crate::{Lsn, TupleData};

/// One pgoutput message, the payload of an XLogData.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogicalMessage {
    /// `'B'`: a transaction starts.
    Begin(Begin),
    /// `'C'`: the transaction opened by the last Begin committed.
    Commit(Commit),
    /// `'O'`: the transaction came from another replication origin.
    Origin(Origin),
    /// `'R'`: a table's schema, sent before its first change in a session
    /// and after it changes.
    Relation(Relation),
    /// `'Y'`: a non-built-in data type used by a following Relation.
    Type(TypeMsg),
    /// `'I'`: a row was inserted.
    Insert(Insert),
    /// `'U'`: a row was updated.
    Update(Update),
    /// `'D'`: a row was deleted.
    Delete(Delete),
    /// `'T'`: tables were truncated.
    Truncate(Truncate),
    /// `'M'`: a `pg_logical_emit_message` call (only with `messages 'true'`).
    Message(Message),
    /// `'S'`: a block of a streamed in-progress transaction starts
    /// (protocol ≥ 2).
    StreamStart(StreamStart),
    /// `'E'`: the current stream block ends.
    StreamStop,
    /// `'c'`: a streamed transaction committed.
    StreamCommit(StreamCommit),
    /// `'A'`: a streamed (sub)transaction aborted.
    StreamAbort(StreamAbort),
    /// `'b'`: a two-phase transaction's prepared part starts (protocol ≥ 3).
    BeginPrepare(BeginPrepare),
    /// `'P'`: a two-phase transaction was prepared.
    Prepare(Prepare),
    /// `'K'`: a prepared transaction was committed.
    CommitPrepared(CommitPrepared),
    /// `'r'`: a prepared transaction was rolled back.
    RollbackPrepared(RollbackPrepared),
    /// `'p'`: a streamed transaction was prepared (protocol ≥ 3).
    StreamPrepare(StreamPrepare),
}

impl LogicalMessage {
    /// The message's Byte1 tag on the wire.
    pub fn tag(&self) -> u8 {
        match self {
            LogicalMessage::Begin(_) => b'B',
            LogicalMessage::Commit(_) => b'C',
            LogicalMessage::Origin(_) => b'O',
            LogicalMessage::Relation(_) => b'R',
            LogicalMessage::Type(_) => b'Y',
            LogicalMessage::Insert(_) => b'I',
            LogicalMessage::Update(_) => b'U',
            LogicalMessage::Delete(_) => b'D',
            LogicalMessage::Truncate(_) => b'T',
            LogicalMessage::Message(_) => b'M',
            LogicalMessage::StreamStart(_) => b'S',
            LogicalMessage::StreamStop => b'E',
            LogicalMessage::StreamCommit(_) => b'c',
            LogicalMessage::StreamAbort(_) => b'A',
            LogicalMessage::BeginPrepare(_) => b'b',
            LogicalMessage::Prepare(_) => b'P',
            LogicalMessage::CommitPrepared(_) => b'K',
            LogicalMessage::RollbackPrepared(_) => b'r',
            LogicalMessage::StreamPrepare(_) => b'p',
        }
    }

    /// The message type's name as PostgreSQL's documentation spells it, the
    /// same name decode errors use (e.g. `"Insert"`, `"Stream Start"`).
    pub fn type_name(&self) -> &'static str {
        message_name(self.tag()).unwrap_or("unknown")
    }
}

/// Name of the message type with this tag, if it is one.
pub(crate) fn message_name(tag: u8) -> Option<&'static str> {
    Some(match tag {
        b'B' => "Begin",
        b'C' => "Commit",
        b'O' => "Origin",
        b'R' => "Relation",
        b'Y' => "Type",
        b'I' => "Insert",
        b'U' => "Update",
        b'D' => "Delete",
        b'T' => "Truncate",
        b'M' => "Message",
        b'S' => "Stream Start",
        b'E' => "Stream Stop",
        b'c' => "Stream Commit",
        b'A' => "Stream Abort",
        b'b' => "Begin Prepare",
        b'P' => "Prepare",
        b'K' => "Commit Prepared",
        b'r' => "Rollback Prepared",
        b'p' => "Stream Prepare",
        _ => return None,
    })
}

/// `'B'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begin {
    /// LSN of the commit record; the transaction's `end_lsn` comes with Commit.
    pub final_lsn: Lsn,
    pub commit_time: i64,
    pub xid: u32,
}

/// `'C'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// Currently always 0.
    pub flags: u8,
    pub commit_lsn: Lsn,
    /// End of the commit record: the position to confirm as flushed once the
    /// transaction is durably handled.
    pub end_lsn: Lsn,
    pub commit_time: i64,
}

/// `'O'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub commit_lsn: Lsn,
    pub name: Bytes,
}

/// `'R'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// Present only inside a stream block.
    pub xid: Option<u32>,
    pub oid: u32,
    /// Empty for `pg_catalog`.
    pub namespace: Bytes,
    pub name: Bytes,
    /// `relreplident`: `b'd'` default, `b'n'` nothing, `b'f'` full, `b'i'` index.
    pub replica_identity: u8,
    pub columns: Vec<Column>,
}

/// One column of a [`Relation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// Bit 1 (value 1) set when the column is part of the replica identity key.
    pub flags: u8,
    pub name: Bytes,
    pub type_oid: u32,
    /// `atttypmod`, -1 when the type has none.
    pub type_modifier: i32,
}

impl Column {
    /// Whether the column is part of the replica identity key.
    pub fn is_key(&self) -> bool {
        self.flags & 1 != 0
    }
}

/// `'Y'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeMsg {
    /// Present only inside a stream block.
    pub xid: Option<u32>,
    pub oid: u32,
    /// Empty for `pg_catalog`.
    pub namespace: Bytes,
    pub name: Bytes,
}

/// `'I'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Insert {
    /// Present only inside a stream block.
    pub xid: Option<u32>,
    pub relation_oid: u32,
    pub tuple: TupleData,
}

/// Which old row image an Update or Delete carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OldTupleKind {
    /// `'K'`: only the replica identity key columns (others are Null).
    Key,
    /// `'O'`: the whole old row (`REPLICA IDENTITY FULL`).
    Full,
}

impl OldTupleKind {
    /// The marker byte on the wire.
    pub fn tag(self) -> u8 {
        match self {
            OldTupleKind::Key => b'K',
            OldTupleKind::Full => b'O',
        }
    }
}

/// `'U'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// Present only inside a stream block.
    pub xid: Option<u32>,
    pub relation_oid: u32,
    /// The old row, sent only when the key changed or the table has
    /// `REPLICA IDENTITY FULL`.
    pub old: Option<(OldTupleKind, TupleData)>,
    pub new: TupleData,
}

/// `'D'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delete {
    /// Present only inside a stream block.
    pub xid: Option<u32>,
    pub relation_oid: u32,
    pub old_kind: OldTupleKind,
    pub old: TupleData,
}

/// `'T'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncate {
    /// Present only inside a stream block.
    pub xid: Option<u32>,
    /// Bit 1: `CASCADE`, bit 2: `RESTART IDENTITY`.
    pub options: u8,
    pub relation_oids: Vec<u32>,
}

/// `'M'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Present only inside a stream block.
    pub xid: Option<u32>,
    pub transactional: bool,
    pub lsn: Lsn,
    pub prefix: Bytes,
    pub content: Bytes,
}

/// `'S'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamStart {
    pub xid: u32,
    /// True for the first block streamed for this transaction.
    pub first_segment: bool,
}

/// `'c'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamCommit {
    pub xid: u32,
    /// Currently always 0.
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: i64,
}

/// `'A'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamAbort {
    /// The top-level transaction.
    pub xid: u32,
    /// The aborted subtransaction; equal to `xid` when the whole transaction
    /// aborted.
    pub subxid: u32,
    /// Sent only by protocol version 4 with `streaming = parallel`; decoded
    /// whenever the message is long enough to hold it.
    pub abort_lsn: Option<Lsn>,
    /// Sent together with `abort_lsn`.
    pub abort_time: Option<i64>,
}

/// `'b'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeginPrepare {
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_time: i64,
    pub xid: u32,
    /// Global transaction identifier of the prepared transaction.
    pub gid: Bytes,
}

/// `'P'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare {
    /// Currently always 0.
    pub flags: u8,
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_time: i64,
    pub xid: u32,
    pub gid: Bytes,
}

/// `'K'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitPrepared {
    /// Currently always 0.
    pub flags: u8,
    pub commit_lsn: Lsn,
    pub end_lsn: Lsn,
    pub commit_time: i64,
    pub xid: u32,
    pub gid: Bytes,
}

/// `'r'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackPrepared {
    /// Currently always 0.
    pub flags: u8,
    /// End LSN of the prepared transaction.
    pub prepare_end_lsn: Lsn,
    /// End LSN of the rollback.
    pub rollback_end_lsn: Lsn,
    pub prepare_time: i64,
    pub rollback_time: i64,
    pub xid: u32,
    pub gid: Bytes,
}

/// `'p'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPrepare {
    /// Currently always 0.
    pub flags: u8,
    pub prepare_lsn: Lsn,
    pub end_lsn: Lsn,
    pub prepare_time: i64,
    pub xid: u32,
    pub gid: Bytes,
}

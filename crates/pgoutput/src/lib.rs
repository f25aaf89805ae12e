//! A pure decoder for PostgreSQL's `pgoutput` logical replication protocol
//! (versions 1–4) and for the streaming replication CopyBoth messages that
//! carry it ([`wire`]), plus a faithful [`encode`]r for tests.
//!
//! No I/O, no async, no state beyond the one bit the protocol needs
//! ([`Decoder`] tracks whether it is inside a streamed-transaction block).
//!
//! Typical use: for each CopyData payload, [`wire::parse_copy_data`]; for each
//! [`wire::XLogData`], [`Decoder::decode`] its `data`:
//!
//! ```
//! use bytes::{Bytes, BytesMut};
//! use pgoutput::{wire, Decoder, LogicalMessage, Lsn};
//!
//! # fn main() -> Result<(), pgoutput::DecodeError> {
//! // A CopyData payload as the server sends it: an XLogData carrying a Begin.
//! let begin = b"B\x00\x00\x00\x00\x01\x6a\x33\xf8\x00\x02\xb5\x6c\x4e\x6a\x7e\x2c\x00\x00\x02\xea";
//! let mut payload = BytesMut::new();
//! wire::encode_xlog_data(
//!     &wire::XLogData {
//!         wal_start: Lsn(0x16A_33F8),
//!         wal_end: Lsn(0x16A_33F8),
//!         send_time: 0,
//!         data: Bytes::from_static(begin),
//!     },
//!     &mut payload,
//! );
//!
//! let mut decoder = Decoder::new();
//! if let wire::ReplicationMessage::XLogData(xlog) = wire::parse_copy_data(payload.freeze())? {
//!     let LogicalMessage::Begin(begin) = decoder.decode(xlog.data)? else {
//!         unreachable!("the payload is a Begin");
//!     };
//!     assert_eq!(begin.xid, 746);
//!     assert_eq!(begin.final_lsn.to_string(), "0/16A33F8");
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Invariants
//!
//! * **Never panics**, on any input: every read is bounds-checked through one
//!   cursor type, the crate denies indexing, unchecked arithmetic, lossy
//!   casts, `unwrap`/`expect` and `panic!`, and property tests feed it random
//!   bytes and mutated valid messages.
//! * **Zero-copy**: every byte string in a decoded message (names, prefixes,
//!   message content, column values, XLogData payloads) is a `Bytes` slice of
//!   the input, sharing its allocation. Holding any of them keeps the whole
//!   input buffer alive.
//! * **Allocation is bounded by the input**: a count is checked against the
//!   bytes remaining before anything is allocated for it (a Relation column
//!   needs at least 10 bytes, a Truncate OID 4), so a hostile count cannot
//!   reserve memory the message does not back. Row images ([`TupleData`]) are
//!   validated in place and never allocate per column; [`TupleData::spans`]
//!   walks one without even a `Bytes` per column (a caller that reads a few
//!   columns of a wide row pays only for those).
//! * **Messages are decoded completely or not at all**: row images are fully
//!   validated at decode time (iterating them cannot fail), and bytes left
//!   after the last field of a message are an error
//!   ([`DecodeError::TrailingBytes`]), except in an XLogData whose payload is
//!   the rest of the message by definition.
//! * **"Truncated" is distinct from "invalid"**: [`DecodeError::Truncated`]
//!   means the input ran out (a field, a string's NUL, or the items a count
//!   promised are missing — every strict prefix of a valid message decodes to
//!   it); [`DecodeError::Invalid`] means a byte that is present holds a value
//!   the protocol forbids (negative length or count, unknown tuple column
//!   kind, bad old-tuple marker, a flag that must be 0 or 1 but is not).
//!
//! Byte strings are returned as sent, without their NUL terminator and
//! without UTF-8 validation: they are in the server's encoding.
//!
//! Integers are big-endian. Timestamps are kept as PostgreSQL sends them, µs
//! since 2000-01-01 UTC; see [`pg_epoch_micros_to_unix_micros`].

#![deny(
    clippy::indexing_slicing,
    clippy::cast_sign_loss,
    clippy::cast_possible_truncation,
    clippy::panic,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::arithmetic_side_effects
)]

mod decode;
pub mod encode;
mod error;
mod lsn;
mod message;
mod reader;
mod tuple;
pub mod wire;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use decode::{decode, insert_prefix, Decoder};
pub use error::DecodeError;
pub use lsn::{pg_epoch_micros_to_unix_micros, unix_micros_to_pg_epoch_micros, Lsn, ParseLsnError};
pub use message::{
    Begin, BeginPrepare, Column, Commit, CommitPrepared, Delete, Insert, LogicalMessage, Message, OldTupleKind, Origin,
    Prepare, Relation, RollbackPrepared, StreamAbort, StreamCommit, StreamPrepare, StreamStart, Truncate, TypeMsg,
    Update,
};
pub use tuple::{ColumnSpan, ColumnValue, Spans, TupleData, TupleIter};

//! Protocol state of the replication stream: which transaction is open, and what each
//! pgoutput message means for the stream. No routing, no Kafka: [`Decoding::decode`]
//! turns one XLogData into one [`Change`].
//!
//! Invariants: Begin and Commit alternate; inserts, updates, deletes, truncates and
//! transactional messages arrive only inside a transaction; a streamed or two-phase
//! transaction message (never requested: proto_version 1) is a definite error, as is a
//! malformed message. Errors name the LSN and never confirm past it.

use pgoutput::wire::XLogData;
use pgoutput::{Decoder, LogicalMessage, Lsn, Relation, TupleData};

use super::checkpoint::TxnSeq;
use crate::error::{ErrorKind, PipelineError};

/// The transaction being read.
#[derive(Debug, Clone)]
pub(crate) struct OpenTxn {
    /// Commit LSN, from the Begin message: names the transaction across sessions.
    pub final_lsn: Lsn,
    /// Commit time, ms since the Unix epoch.
    pub commit_time_ms: i64,
    /// Its place in the checkpoint, once it has a record.
    pub seq: Option<TxnSeq>,
    /// Records routed so far in this transaction (dead letters included): the next
    /// record's ordinal.
    pub records: u32,
}

/// What one message means.
#[derive(Debug)]
pub(crate) enum Change {
    /// A transaction started (see [`Decoding::current`]).
    Begin,
    /// The open transaction committed; its commit record ends at `end_lsn`.
    Commit {
        txn: OpenTxn,
        end_lsn: Lsn,
    },
    Relation(Relation),
    Insert {
        relation_oid: u32,
        tuple: TupleData,
    },
    /// UPDATE, DELETE or TRUNCATE.
    Other {
        op: &'static str,
        relation_oids: Vec<u32>,
    },
    /// A logical decoding message (`pg_logical_emit_message`).
    Message(pgoutput::Message),
    /// Nothing for walpost (Origin, Type).
    Nothing,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Decoding {
    decoder: Decoder,
    current: Option<OpenTxn>,
}

impl Decoding {
    /// The open transaction, if any.
    pub(crate) fn current(&mut self) -> Option<&mut OpenTxn> {
        self.current.as_mut()
    }

    /// The open transaction, read-only.
    pub(crate) fn current_ref(&self) -> Option<&OpenTxn> {
        self.current.as_ref()
    }

    pub(crate) fn in_transaction(&self) -> bool {
        self.current.is_some()
    }

    /// Decodes one XLogData. `confirmed` is named in errors (nothing past it was confirmed).
    pub(crate) fn decode(&mut self, x: XLogData, confirmed: Lsn) -> Result<Change, PipelineError> {
        let at = x.wal_start;
        let message = self.decoder.decode(x.data).map_err(|e| {
            PipelineError::definite(ErrorKind::Protocol, format!(
                "malformed pgoutput message at LSN {at}: {e}; nothing past {confirmed} was confirmed. This is a walpost or server bug: report it with the server version"
            ))
        })?;
        let outside =
            |what: &str| PipelineError::definite(ErrorKind::Protocol, format!("pgoutput protocol at LSN {at}: {what}"));
        Ok(match message {
            LogicalMessage::Begin(b) => {
                if self.current.is_some() {
                    return Err(outside("Begin inside an open transaction"));
                }
                let unix_micros = pgoutput::pg_epoch_micros_to_unix_micros(b.commit_time);
                self.current = Some(OpenTxn {
                    final_lsn: b.final_lsn,
                    commit_time_ms: unix_micros.div_euclid(1000),
                    seq: None,
                    records: 0,
                });
                Change::Begin
            }
            LogicalMessage::Commit(c) => {
                let txn = self.current.take().ok_or_else(|| outside("Commit without Begin"))?;
                Change::Commit { txn, end_lsn: c.end_lsn }
            }
            LogicalMessage::Relation(r) => Change::Relation(r),
            LogicalMessage::Insert(i) => {
                if self.current.is_none() {
                    return Err(outside("Insert outside a transaction"));
                }
                Change::Insert { relation_oid: i.relation_oid, tuple: i.tuple }
            }
            LogicalMessage::Update(u) => Change::Other { op: "UPDATE", relation_oids: vec![u.relation_oid] },
            LogicalMessage::Delete(d) => Change::Other { op: "DELETE", relation_oids: vec![d.relation_oid] },
            LogicalMessage::Truncate(t) => Change::Other { op: "TRUNCATE", relation_oids: t.relation_oids },
            LogicalMessage::Message(m) => {
                if m.transactional != self.current.is_some() {
                    return Err(outside("message outside its transaction"));
                }
                Change::Message(m)
            }
            LogicalMessage::Origin(_) | LogicalMessage::Type(_) => Change::Nothing,
            LogicalMessage::StreamStart(_)
            | LogicalMessage::StreamStop
            | LogicalMessage::StreamCommit(_)
            | LogicalMessage::StreamAbort(_)
            | LogicalMessage::BeginPrepare(_)
            | LogicalMessage::Prepare(_)
            | LogicalMessage::CommitPrepared(_)
            | LogicalMessage::RollbackPrepared(_)
            | LogicalMessage::StreamPrepare(_) => {
                return Err(PipelineError::definite(ErrorKind::Protocol,
                    "pgoutput sent a streamed or two-phase transaction message, which walpost does not request (proto_version 1): report this with the server version",
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, BytesMut};

    use super::*;

    fn xlog(body: BytesMut) -> XLogData {
        XLogData { wal_start: Lsn(0x100), wal_end: Lsn(0x100), send_time: 0, data: body.freeze() }
    }

    fn begin(final_lsn: u64) -> XLogData {
        let mut b = BytesMut::new();
        b.put_u8(b'B');
        b.put_u64(final_lsn);
        b.put_i64(0);
        b.put_u32(7);
        xlog(b)
    }

    fn commit(end: u64) -> XLogData {
        let mut b = BytesMut::new();
        b.put_u8(b'C');
        b.put_u8(0);
        b.put_u64(end - 8);
        b.put_u64(end);
        b.put_i64(0);
        xlog(b)
    }

    #[test]
    fn begin_and_commit_alternate() {
        let mut d = Decoding::default();
        assert!(matches!(d.decode(begin(0x200), Lsn(0)).unwrap(), Change::Begin));
        assert_eq!(d.current().map(|t| t.final_lsn), Some(Lsn(0x200)));
        let err = d.decode(begin(0x300), Lsn(0)).unwrap_err();
        assert!(err.to_string().contains("Begin inside an open transaction"), "{err}");
        assert_eq!(err.kind(), ErrorKind::Protocol);
        match d.decode(commit(0x208), Lsn(0)).unwrap() {
            Change::Commit { txn, end_lsn } => {
                assert_eq!((txn.final_lsn, end_lsn), (Lsn(0x200), Lsn(0x208)));
            }
            other => panic!("{other:?}"),
        }
        assert!(!d.in_transaction());
        let err = d.decode(commit(0x308), Lsn(0x50)).unwrap_err();
        assert!(!err.is_transient());
        assert!(err.to_string().contains("Commit without Begin"), "{err}");
    }

    #[test]
    fn malformed_bytes_are_a_definite_error_naming_the_lsn() {
        let mut d = Decoding::default();
        let mut b = BytesMut::new();
        b.put_u8(b'B');
        b.put_u8(1);
        let err = d.decode(xlog(b), Lsn(0x42)).unwrap_err();
        assert!(!err.is_transient());
        assert!(err.to_string().contains("0/100") && err.to_string().contains("0/42"), "{err}");
    }
}

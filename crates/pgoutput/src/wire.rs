//! The CopyBoth payloads of PostgreSQL's streaming replication protocol
//! (`START_REPLICATION ... LOGICAL`), without any I/O.
//!
//! The server sends CopyData messages whose payload is an XLogData (`'w'`,
//! carrying one pgoutput message) or a Primary Keepalive (`'k'`); the client
//! answers with Standby Status Updates (`'r'`). These functions handle the
//! payloads only: the CopyData framing (`'d'` + Int32 length) belongs to the
//! connection layer.

use bytes::{BufMut, Bytes, BytesMut};

use crate::reader::Reader;
use crate::{DecodeError, Lsn};

/// A CopyData payload sent by the server during logical replication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicationMessage {
    /// `'w'`: WAL data, here one pgoutput message.
    XLogData(XLogData),
    /// `'k'`: the server's heartbeat.
    PrimaryKeepalive(PrimaryKeepalive),
}

/// `'w'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XLogData {
    /// Position of the data in the WAL. For logical replication this is the
    /// LSN of the change (0 for some messages, e.g. Commit's XLogData is the
    /// commit record's position).
    pub wal_start: Lsn,
    /// Current end of WAL on the server.
    pub wal_end: Lsn,
    /// Server clock at transmission, µs since 2000-01-01 UTC.
    pub send_time: i64,
    /// The pgoutput message: a zero-copy slice of the CopyData payload, to be
    /// passed to [`crate::Decoder::decode`].
    pub data: Bytes,
}

/// `'k'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryKeepalive {
    /// Current end of WAL on the server.
    pub wal_end: Lsn,
    /// Server clock at transmission, µs since 2000-01-01 UTC.
    pub send_time: i64,
    /// The server wants a Standby Status Update right away (typically because
    /// `wal_sender_timeout` is about to expire).
    pub reply_requested: bool,
}

/// `'r'`, the client's progress report (see
/// [`encode_standby_status_update`]); decoded only by fake servers in tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbyStatusUpdate {
    pub write: Lsn,
    pub flush: Lsn,
    pub apply: Lsn,
    /// Client clock, µs since 2000-01-01 UTC.
    pub client_time: i64,
    pub reply_requested: bool,
}

/// Size of a Standby Status Update payload: tag, three LSNs, a timestamp and
/// the reply flag.
pub const STANDBY_STATUS_UPDATE_LEN: usize = 1 + 8 + 8 + 8 + 8 + 1;

/// Parses a CopyData payload sent by the server (starting with `'w'` or
/// `'k'`). An XLogData's `data` is a zero-copy slice of `body`.
pub fn parse_copy_data(body: Bytes) -> Result<ReplicationMessage, DecodeError> {
    let Some(&tag) = body.first() else {
        return Err(DecodeError::Truncated { message: "CopyData", field: "tag", needed: 1, remaining: 0 });
    };
    match tag {
        b'w' => {
            let mut r = Reader::new(body, "XLogData");
            r.u8("tag")?;
            Ok(ReplicationMessage::XLogData(XLogData {
                wal_start: r.lsn("wal_start")?,
                wal_end: r.lsn("wal_end")?,
                send_time: r.i64("send_time")?,
                data: r.rest_bytes(),
            }))
        }
        b'k' => {
            let mut r = Reader::new(body, "keepalive");
            r.u8("tag")?;
            let keepalive = PrimaryKeepalive {
                wal_end: r.lsn("wal_end")?,
                send_time: r.i64("send_time")?,
                reply_requested: r.bool("reply_requested")?,
            };
            r.finish()?;
            Ok(ReplicationMessage::PrimaryKeepalive(keepalive))
        }
        _ => Err(DecodeError::UnknownTag { tag }),
    }
}

/// Writes a Standby Status Update payload (`'r'`, 34 bytes) — not the CopyData
/// framing around it.
///
/// `write`/`flush`/`apply` are the positions received, durably handled and
/// applied; the server may recycle WAL and advance the slot up to `flush`.
/// `client_time_pg_micros` is µs since 2000-01-01 (see
/// [`crate::unix_micros_to_pg_epoch_micros`]). `reply_requested` asks the
/// server to answer with a keepalive at once.
pub fn encode_standby_status_update(
    write: Lsn,
    flush: Lsn,
    apply: Lsn,
    client_time_pg_micros: i64,
    reply_requested: bool,
    out: &mut BytesMut,
) {
    out.reserve(STANDBY_STATUS_UPDATE_LEN);
    out.put_u8(b'r');
    out.put_u64(write.0);
    out.put_u64(flush.0);
    out.put_u64(apply.0);
    out.put_i64(client_time_pg_micros);
    out.put_u8(u8::from(reply_requested));
}

/// Parses a Standby Status Update payload, the inverse of
/// [`encode_standby_status_update`] (for fake servers in tests).
pub fn parse_standby_status_update(body: Bytes) -> Result<StandbyStatusUpdate, DecodeError> {
    let mut r = Reader::new(body, "Standby Status Update");
    let tag = r.u8("tag")?;
    if tag != b'r' {
        return Err(DecodeError::UnknownTag { tag });
    }
    let update = StandbyStatusUpdate {
        write: r.lsn("write")?,
        flush: r.lsn("flush")?,
        apply: r.lsn("apply")?,
        client_time: r.i64("client_time")?,
        reply_requested: r.bool("reply_requested")?,
    };
    r.finish()?;
    Ok(update)
}

/// Writes an XLogData payload (`'w'` ...), as a server would.
pub fn encode_xlog_data(msg: &XLogData, out: &mut BytesMut) {
    out.reserve(msg.data.len().saturating_add(25));
    out.put_u8(b'w');
    out.put_u64(msg.wal_start.0);
    out.put_u64(msg.wal_end.0);
    out.put_i64(msg.send_time);
    out.put_slice(&msg.data);
}

/// Writes a Primary Keepalive payload (`'k'` ...), as a server would.
pub fn encode_keepalive(msg: &PrimaryKeepalive, out: &mut BytesMut) {
    out.put_u8(b'k');
    out.put_u64(msg.wal_end.0);
    out.put_i64(msg.send_time);
    out.put_u8(u8::from(msg.reply_requested));
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)] // tests may fail loudly
mod tests {
    use super::*;

    #[test]
    fn parses_xlog_data_as_postgresql_sends_it() {
        let mut body = b"w".to_vec();
        body.extend_from_slice(&0x16_B374_D848_u64.to_be_bytes());
        body.extend_from_slice(&0x16_B374_D900_u64.to_be_bytes());
        body.extend_from_slice(&789_i64.to_be_bytes());
        body.extend_from_slice(b"E");
        let body = Bytes::from(body);
        let ReplicationMessage::XLogData(xlog) = parse_copy_data(body.clone()).unwrap() else {
            panic!("expected XLogData");
        };
        assert_eq!(xlog.wal_start, Lsn(0x16_B374_D848));
        assert_eq!(xlog.wal_end, Lsn(0x16_B374_D900));
        assert_eq!(xlog.send_time, 789);
        assert_eq!(xlog.data, Bytes::from_static(b"E"));
        // Zero-copy: the data is the tail of the body.
        assert_eq!(xlog.data.as_ptr(), body.as_ptr().wrapping_add(25));

        let mut out = BytesMut::new();
        encode_xlog_data(&xlog, &mut out);
        assert_eq!(out.freeze(), body);
    }

    #[test]
    fn xlog_data_may_be_empty() {
        let mut out = BytesMut::new();
        let xlog = XLogData { wal_start: Lsn(1), wal_end: Lsn(2), send_time: -3, data: Bytes::new() };
        encode_xlog_data(&xlog, &mut out);
        assert_eq!(parse_copy_data(out.freeze()).unwrap(), ReplicationMessage::XLogData(xlog));
    }

    #[test]
    fn parses_keepalives() {
        let mut body = b"k".to_vec();
        body.extend_from_slice(&0x1_0000_0002_u64.to_be_bytes());
        body.extend_from_slice(&(-5_i64).to_be_bytes());
        body.push(1);
        let expected = PrimaryKeepalive { wal_end: Lsn(0x1_0000_0002), send_time: -5, reply_requested: true };
        assert_eq!(
            parse_copy_data(Bytes::from(body.clone())).unwrap(),
            ReplicationMessage::PrimaryKeepalive(expected.clone())
        );
        let mut out = BytesMut::new();
        encode_keepalive(&expected, &mut out);
        assert_eq!(&out[..], &body[..]);

        let mut bad_flag = body.clone();
        bad_flag[17] = 2;
        assert!(matches!(
            parse_copy_data(Bytes::from(bad_flag)),
            Err(DecodeError::Invalid { message: "keepalive", field: "reply_requested", .. })
        ));
        let mut trailing = body.clone();
        trailing.push(0);
        assert_eq!(
            parse_copy_data(Bytes::from(trailing)),
            Err(DecodeError::TrailingBytes { message: "keepalive", extra: 1 })
        );
    }

    #[test]
    fn every_cut_short_payload_is_reported_as_truncated() {
        let mut keepalive = BytesMut::new();
        encode_keepalive(&PrimaryKeepalive { wal_end: Lsn(7), send_time: 8, reply_requested: false }, &mut keepalive);
        let mut xlog = BytesMut::new();
        encode_xlog_data(
            &XLogData { wal_start: Lsn(1), wal_end: Lsn(2), send_time: 3, data: Bytes::from_static(b"payload") },
            &mut xlog,
        );
        let xlog_header_len = 25;
        for (body, complete_from) in [(keepalive.freeze(), 18), (xlog.freeze(), xlog_header_len)] {
            for len in 0..complete_from {
                let error = parse_copy_data(body.slice(..len)).unwrap_err();
                assert!(error.is_truncated(), "{len}: {error}");
            }
        }
    }

    #[test]
    fn rejects_unknown_tags() {
        assert_eq!(parse_copy_data(Bytes::from_static(b"x123")), Err(DecodeError::UnknownTag { tag: b'x' }));
        // 'r' is what the client sends, never the server.
        assert_eq!(parse_copy_data(Bytes::from_static(b"r")), Err(DecodeError::UnknownTag { tag: b'r' }));
    }

    #[test]
    fn encodes_standby_status_updates_byte_for_byte() {
        let mut out = BytesMut::new();
        encode_standby_status_update(
            Lsn(0x16_B374_D848),
            Lsn(0x16_B374_D800),
            Lsn(0x10),
            0x0102_0304_0506_0708,
            true,
            &mut out,
        );
        assert_eq!(out.len(), STANDBY_STATUS_UPDATE_LEN);
        assert_eq!(out.len(), 34);
        assert_eq!(
            &out[..],
            b"r\
              \x00\x00\x00\x16\xb3\x74\xd8\x48\
              \x00\x00\x00\x16\xb3\x74\xd8\x00\
              \x00\x00\x00\x00\x00\x00\x00\x10\
              \x01\x02\x03\x04\x05\x06\x07\x08\
              \x01"
        );
        assert_eq!(
            parse_standby_status_update(out.freeze()).unwrap(),
            StandbyStatusUpdate {
                write: Lsn(0x16_B374_D848),
                flush: Lsn(0x16_B374_D800),
                apply: Lsn(0x10),
                client_time: 0x0102_0304_0506_0708,
                reply_requested: true,
            }
        );
        assert_eq!(parse_standby_status_update(Bytes::from_static(b"k")), Err(DecodeError::UnknownTag { tag: b'k' }));
    }
}

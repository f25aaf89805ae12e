//! Backend message framing and the few message bodies the replication connection reads.
//!
//! Pure code over `Bytes`: a frame is split off the read buffer without copying, so
//! a CopyData body handed to the pgoutput decoder is a slice of the socket buffer.
//! `Ok(None)` from [`split_frame`] means "incomplete, read more"; an `Err` means the
//! bytes can never form a valid frame.

use bytes::{Buf, Bytes, BytesMut};

/// PostgreSQL refuses messages over 1 GB; a length past this is a protocol error,
/// not a reason to allocate.
pub const MAX_FRAME_LEN: usize = 1 << 30;

/// The most [`split_frame`] reserves ahead of a partial frame's bytes; larger frames
/// grow the buffer as they arrive.
pub const MAX_UPFRONT_RESERVE: usize = 1 << 20;

/// One backend message: its tag byte and body (length header removed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub tag: u8,
    pub body: Bytes,
}

/// Bytes that are not a PostgreSQL backend message.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum FrameError {
    #[error("backend message '{tag}' has invalid length {len} (must be 4..={MAX_FRAME_LEN})", tag = char::from(*tag))]
    BadLength { tag: u8, len: i64 },
    #[error("backend message '{tag}' is malformed: {what}", tag = char::from(*tag))]
    Malformed { tag: u8, what: &'static str },
}

/// Splits one complete frame off the front of `buf`; `Ok(None)` when more bytes are needed.
pub fn split_frame(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    let Some(header) = buf.get(..5) else {
        return Ok(None);
    };
    let tag = header.first().copied().unwrap_or(0);
    let len_bytes: [u8; 4] =
        header.get(1..5).and_then(|s| s.try_into().ok()).ok_or(FrameError::Malformed { tag, what: "short header" })?;
    let len = i32::from_be_bytes(len_bytes);
    let body_len = usize::try_from(len)
        .ok()
        .filter(|l| (4..=MAX_FRAME_LEN).contains(l))
        .ok_or(FrameError::BadLength { tag, len: i64::from(len) })?
        - 4;
    if buf.len() < 5 + body_len {
        // Reserve for what is claimed, but only up to a bound: a hostile or corrupt
        // length must not allocate a gigabyte before a single body byte arrives.
        buf.reserve((5 + body_len - buf.len()).min(MAX_UPFRONT_RESERVE));
        return Ok(None);
    }
    buf.advance(5);
    let body = buf.split_to(body_len).freeze();
    Ok(Some(Frame { tag, body }))
}

/// The fields of an ErrorResponse or NoticeResponse that operators need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerMessage {
    pub severity: String,
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl std::fmt::Display for ServerMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} (SQLSTATE {})", self.severity, self.message, self.code)?;
        if let Some(d) = &self.detail {
            write!(f, "; detail: {d}")?;
        }
        if let Some(h) = &self.hint {
            write!(f, "; hint: {h}")?;
        }
        Ok(())
    }
}

/// Parses an ErrorResponse ('E') or NoticeResponse ('N') body.
pub fn parse_server_message(tag: u8, body: &[u8]) -> Result<ServerMessage, FrameError> {
    let mut out = ServerMessage::default();
    let mut rest = body;
    loop {
        let Some((&field, after)) = rest.split_first() else {
            return Err(FrameError::Malformed { tag, what: "fields not terminated" });
        };
        if field == 0 {
            return Ok(out);
        }
        let nul =
            after.iter().position(|&b| b == 0).ok_or(FrameError::Malformed { tag, what: "field value without NUL" })?;
        let value = String::from_utf8_lossy(after.get(..nul).unwrap_or_default()).into_owned();
        rest = after.get(nul + 1..).unwrap_or_default();
        match field {
            b'V' => out.severity = value,
            b'S' if out.severity.is_empty() => out.severity = value,
            b'C' => out.code = value,
            b'M' => out.message = value,
            b'D' => out.detail = Some(value),
            b'H' => out.hint = Some(value),
            _ => {}
        }
    }
}

/// Parses a DataRow ('D') body; values are `Bytes` slices of the frame (no copy).
pub fn parse_data_row(body: &Bytes) -> Result<Vec<Option<Bytes>>, FrameError> {
    const TAG: u8 = b'D';
    let mut cur: &[u8] = body;
    let count = take_i16(&mut cur).ok_or(FrameError::Malformed { tag: TAG, what: "no column count" })?;
    let count =
        usize::try_from(count).map_err(|_| FrameError::Malformed { tag: TAG, what: "negative column count" })?;
    // Each column needs at least its 4-byte length: cap the allocation by what is there.
    if count > cur.len() / 4 {
        return Err(FrameError::Malformed { tag: TAG, what: "column count exceeds message" });
    }
    let mut row = Vec::with_capacity(count);
    for _ in 0..count {
        let len = take_i32(&mut cur).ok_or(FrameError::Malformed { tag: TAG, what: "truncated column length" })?;
        if len < 0 {
            row.push(None);
            continue;
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if cur.len() < len {
            return Err(FrameError::Malformed { tag: TAG, what: "truncated column value" });
        }
        let start = body.len() - cur.len();
        row.push(Some(body.slice(start..start + len)));
        cur = cur.get(len..).unwrap_or_default();
    }
    Ok(row)
}

/// Parses a RowDescription ('T') body into (column name, type oid) pairs.
/// One column of a RowDescription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDescription {
    pub name: String,
    pub type_oid: u32,
    /// The type modifier (`atttypmod`), e.g. the precision of `timestamp(3)`; -1 for none.
    pub type_modifier: i32,
}

pub fn parse_row_description(body: &[u8]) -> Result<Vec<FieldDescription>, FrameError> {
    const TAG: u8 = b'T';
    let mut cur = body;
    let count = take_i16(&mut cur).ok_or(FrameError::Malformed { tag: TAG, what: "no field count" })?;
    let count = usize::try_from(count).map_err(|_| FrameError::Malformed { tag: TAG, what: "negative field count" })?;
    if count > cur.len() / 19 {
        return Err(FrameError::Malformed { tag: TAG, what: "field count exceeds message" });
    }
    let mut fields = Vec::with_capacity(count);
    for _ in 0..count {
        let nul = cur
            .iter()
            .position(|&b| b == 0)
            .ok_or(FrameError::Malformed { tag: TAG, what: "field name without NUL" })?;
        let name = String::from_utf8_lossy(cur.get(..nul).unwrap_or_default()).into_owned();
        // table oid (4), column (2), type oid (4), size (2), modifier (4), format (2)
        let rest = cur
            .get(nul + 1..)
            .filter(|r| r.len() >= 18)
            .ok_or(FrameError::Malformed { tag: TAG, what: "truncated field description" })?;
        let type_oid = rest.get(6..10).and_then(|b| b.try_into().ok()).map_or(0, u32::from_be_bytes);
        let type_modifier = rest.get(12..16).and_then(|b| b.try_into().ok()).map_or(-1, i32::from_be_bytes);
        fields.push(FieldDescription { name, type_oid, type_modifier });
        cur = rest.get(18..).unwrap_or_default();
    }
    Ok(fields)
}

/// Reads a NUL-terminated string; used for ParameterStatus pairs.
pub fn parse_parameter_status(body: &[u8]) -> Result<(String, String), FrameError> {
    const TAG: u8 = b'S';
    let mut parts = body.split(|&b| b == 0);
    let name = parts.next().ok_or(FrameError::Malformed { tag: TAG, what: "no name" })?;
    let value = parts.next().ok_or(FrameError::Malformed { tag: TAG, what: "no value" })?;
    Ok((String::from_utf8_lossy(name).into_owned(), String::from_utf8_lossy(value).into_owned()))
}

fn take_i16(cur: &mut &[u8]) -> Option<i16> {
    let (head, rest) = cur.split_first_chunk::<2>()?;
    *cur = rest;
    Some(i16::from_be_bytes(*head))
}

fn take_i32(cur: &mut &[u8]) -> Option<i32> {
    let (head, rest) = cur.split_first_chunk::<4>()?;
    *cur = rest;
    Some(i32::from_be_bytes(*head))
}

/// Reads the authentication request code and its payload from an 'R' body.
pub fn parse_auth_request(body: &Bytes) -> Result<(i32, Bytes), FrameError> {
    let code: [u8; 4] = body
        .get(..4)
        .and_then(|s| s.try_into().ok())
        .ok_or(FrameError::Malformed { tag: b'R', what: "no authentication code" })?;
    Ok((i32::from_be_bytes(code), body.slice(4..)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend_from_slice(&i32::try_from(body.len() + 4).unwrap().to_be_bytes());
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn regression_claimed_length_does_not_reserve_a_gigabyte_up_front() {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(b"d");
        buf.extend_from_slice(&i32::try_from(MAX_FRAME_LEN).unwrap().to_be_bytes());
        buf.extend_from_slice(b"w");
        assert_eq!(split_frame(&mut buf), Ok(None));
        assert!(buf.capacity() <= 2 * MAX_UPFRONT_RESERVE, "reserved {} bytes", buf.capacity());
        // A frame that does fit the reservation still completes.
        let mut small = BytesMut::from(&frame(b'd', &[7; 100])[..10]);
        assert_eq!(split_frame(&mut small), Ok(None));
        assert!(small.capacity() >= 104);
    }

    #[test]
    fn splits_frames_and_waits_for_more() {
        let mut buf = BytesMut::new();
        let whole = [frame(b'Z', b"I"), frame(b'd', b"hello")].concat();
        for (i, byte) in whole.iter().enumerate() {
            buf.extend_from_slice(&[*byte]);
            let got = split_frame(&mut buf).unwrap();
            if i == 5 {
                assert_eq!(got, Some(Frame { tag: b'Z', body: Bytes::from_static(b"I") }));
            } else if i == whole.len() - 1 {
                assert_eq!(got, Some(Frame { tag: b'd', body: Bytes::from_static(b"hello") }));
            } else {
                assert_eq!(got, None, "at byte {i}");
            }
        }
        assert!(buf.is_empty());
    }

    #[test]
    fn rejects_negative_and_huge_lengths() {
        for len in [-1_i32, 0, 3, i32::MAX] {
            let mut buf = BytesMut::from(&[b'd'][..]);
            buf.extend_from_slice(&len.to_be_bytes());
            let err = split_frame(&mut buf).unwrap_err();
            assert!(matches!(err, FrameError::BadLength { tag: b'd', .. }), "{len}: {err}");
        }
    }

    #[test]
    fn error_response_fields() {
        let body = b"SERROR\0VERROR\0C55000\0Mlogical decoding requires wal_level >= logical\0Hset it\0\0";
        let m = parse_server_message(b'E', body).unwrap();
        assert_eq!(m.code, "55000");
        assert_eq!(m.severity, "ERROR");
        assert_eq!(m.hint.as_deref(), Some("set it"));
        assert!(m.to_string().contains("wal_level"));
        assert!(parse_server_message(b'E', b"Mno nul").is_err());
        assert!(parse_server_message(b'E', b"").is_err());
    }

    #[test]
    fn data_row_with_null_and_hostile_counts() {
        let mut body = vec![0, 2];
        body.extend_from_slice(&2_i32.to_be_bytes());
        body.extend_from_slice(b"ab");
        body.extend_from_slice(&(-1_i32).to_be_bytes());
        assert_eq!(parse_data_row(&Bytes::from(body)).unwrap(), vec![Some(Bytes::from_static(b"ab")), None]);
        assert!(parse_data_row(&Bytes::from_static(&[0x7f, 0xff, 0, 0])).is_err());
        assert!(parse_data_row(&Bytes::from_static(&[0xff, 0xff])).is_err());
        let mut long = vec![0, 1];
        long.extend_from_slice(&100_i32.to_be_bytes());
        assert!(parse_data_row(&Bytes::from(long)).is_err());
    }

    #[test]
    fn row_description_names() {
        let mut body = vec![0, 1];
        body.extend_from_slice(b"slot_name\0");
        body.extend_from_slice(&[0; 18]);
        let fields = parse_row_description(&body).unwrap();
        assert_eq!(fields.len(), 1);
        assert_eq!((fields[0].name.as_str(), fields[0].type_oid), ("slot_name", 0));
        assert!(parse_row_description(&body[..body.len() - 1]).is_err());
    }
}

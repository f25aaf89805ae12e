//! `backend_frames`: the replication connection's backend-message framing
//! (`replication::frame::split_frame`) over a byte stream that arrives in
//! arbitrary chunks, as from a socket, plus the body parsers the connection uses
//! (ErrorResponse/NoticeResponse, DataRow, RowDescription, ParameterStatus,
//! authentication requests, and CopyData payloads through pgoutput).
//!
//! Input: byte 0 and 1 seed the chunk sizes (1..=256 bytes each); the rest is the
//! stream a server sends.
//!
//! Checks, beyond "never panics": the frames do not depend on how the stream was
//! cut into chunks (compared with the whole stream at once); every frame
//! re-serialises to exactly the bytes it was split from; an error is final.
#![no_main]

use bytes::{BufMut, BytesMut};
use libfuzzer_sys::fuzz_target;
use replication::frame::{self, Frame, FrameError};

/// Frames split off `stream` fed in chunks from `sizes`; the error, if any, ends it.
fn frames(stream: &[u8], mut next_size: impl FnMut() -> usize) -> (Vec<Frame>, Option<FrameError>) {
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut rest = stream;
    loop {
        loop {
            match frame::split_frame(&mut buf) {
                Ok(Some(f)) => out.push(f),
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
        if rest.is_empty() {
            return (out, None);
        }
        let n = next_size().clamp(1, rest.len());
        let (chunk, tail) = rest.split_at(n);
        buf.extend_from_slice(chunk);
        rest = tail;
    }
}

fn parse_body(f: &Frame) {
    // The connection only calls each parser for its own tag; calling every parser on
    // every body is a superset.
    let _ = frame::parse_server_message(f.tag, &f.body).map(|m| m.to_string());
    let _ = frame::parse_data_row(&f.body);
    let _ = frame::parse_row_description(&f.body);
    let _ = frame::parse_parameter_status(&f.body);
    let _ = frame::parse_auth_request(&f.body);
    if let Ok(pgoutput::wire::ReplicationMessage::XLogData(x)) = pgoutput::wire::parse_copy_data(f.body.clone()) {
        let _ = pgoutput::Decoder::new().decode(x.data);
    }
}

fuzz_target!(|data: &[u8]| {
    let (seed, stream) = match data {
        [a, b, rest @ ..] => (u16::from_be_bytes([*a, *b]), rest),
        _ => return,
    };
    // xorshift16: a different chunking per seed, deterministic per input.
    let mut state = seed | 1;
    let chunked = frames(stream, || {
        state ^= state << 7;
        state ^= state >> 9;
        state ^= state << 8;
        usize::from(state % 256) + 1
    });
    let whole = frames(stream, || usize::MAX);
    assert_eq!(chunked, whole, "framing depends on how the stream was chunked");

    let (frames, error) = whole;
    let mut rebuilt = BytesMut::new();
    for f in &frames {
        parse_body(f);
        rebuilt.put_u8(f.tag);
        rebuilt.put_i32(i32::try_from(f.body.len() + 4).expect("frame length fits an i32"));
        rebuilt.extend_from_slice(&f.body);
    }
    assert_eq!(&rebuilt[..], &stream[..rebuilt.len()], "frames must be the stream's bytes");
    if let Some(e) = error {
        let _ = e.to_string();
    }
});

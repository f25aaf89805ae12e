//! `decode`: the pgoutput decoder over arbitrary bytes.
//!
//! Input: a sequence of pgoutput messages, each prefixed by its length as a
//! big-endian u16 (a short or missing last prefix takes the rest), so one input
//! can be a whole Begin/Relation/Insert/Commit session and the streaming state of
//! [`pgoutput::Decoder`] is exercised. Every message is also decoded statelessly
//! with `in_stream` false and true.
//!
//! Checks, beyond "never panics": whatever decodes re-encodes to exactly its
//! input bytes (the crate's canonical-encoding invariant) and decodes again to the
//! same message; row images iterate to their declared length; a failed decode
//! leaves the decoder's state alone.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use pgoutput::{decode, encode::encode, Decoder, LogicalMessage, TupleData};

fn split(data: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let (len, after) = match rest {
            [a, b, after @ ..] => (usize::from(u16::from_be_bytes([*a, *b])), after),
            _ => (rest.len(), &[][..]),
        };
        let len = len.min(after.len());
        let (msg, tail) = after.split_at(len);
        out.push(Bytes::copy_from_slice(msg));
        rest = tail;
    }
    out
}

fn walk_tuple(t: &TupleData) {
    assert_eq!(t.iter().count(), t.len(), "a validated tuple iterates to its length");
    // The walk gives back the values the tuple encodes: encoding them again gives the
    // same tuple.
    let values: Vec<_> = t.iter().collect();
    assert_eq!(&TupleData::from_values(&values), t, "the column walk lost or changed a value");
}

fn walk(msg: &LogicalMessage) {
    match msg {
        LogicalMessage::Insert(m) => walk_tuple(&m.tuple),
        LogicalMessage::Update(m) => {
            if let Some((_, old)) = &m.old {
                walk_tuple(old);
            }
            walk_tuple(&m.new);
        }
        LogicalMessage::Delete(m) => walk_tuple(&m.old),
        _ => {}
    }
    let _ = msg.type_name();
}

fn round_trip(input: &Bytes, msg: &LogicalMessage, in_stream: bool) {
    let mut out = BytesMut::new();
    encode(msg, in_stream, &mut out);
    let out = out.freeze();
    assert_eq!(&out, input, "decode accepted a non-canonical encoding of {msg:?}");
    let again = decode(out, in_stream).expect("an encoded message decodes");
    assert_eq!(&again, msg, "encode/decode changed the message");
}

fuzz_target!(|data: &[u8]| {
    let mut decoder = Decoder::new();
    for msg in split(data) {
        for in_stream in [false, true] {
            if let Ok(m) = decode(msg.clone(), in_stream) {
                walk(&m);
                round_trip(&msg, &m, in_stream);
            }
        }
        let before = decoder.in_stream();
        match decoder.decode(msg.clone()) {
            Ok(m) => {
                walk(&m);
                round_trip(&msg, &m, before);
                match m {
                    LogicalMessage::StreamStart(_) => assert!(decoder.in_stream()),
                    LogicalMessage::StreamStop => assert!(!decoder.in_stream()),
                    _ => assert_eq!(decoder.in_stream(), before),
                }
            }
            Err(e) => {
                assert_eq!(decoder.in_stream(), before, "a failed decode changed the state");
                let _ = e.to_string();
                let _ = e.is_truncated();
            }
        }
    }
});

//! `copy_data`: `pgoutput::wire::parse_copy_data` over arbitrary CopyData payloads
//! (XLogData `'w'`, Primary Keepalive `'k'`, anything else).
//!
//! Checks, beyond "never panics": what parses re-encodes to exactly the input;
//! an XLogData's data is the payload's tail (zero-copy) and is then fed to the
//! pgoutput decoder in both streaming states; the Standby Status Update parser
//! (used by fake servers) never panics either.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use pgoutput::wire::{self, ReplicationMessage};

fuzz_target!(|data: &[u8]| {
    let input = Bytes::copy_from_slice(data);
    let _ = wire::parse_standby_status_update(input.clone());
    let Ok(msg) = wire::parse_copy_data(input.clone()) else {
        return;
    };
    let mut out = BytesMut::new();
    match &msg {
        ReplicationMessage::XLogData(x) => {
            assert_eq!(x.data.len() + 25, input.len());
            assert_eq!(x.data.as_ptr(), input.as_ptr().wrapping_add(25), "XLogData data must be a slice of the payload");
            for in_stream in [false, true] {
                let _ = pgoutput::decode(x.data.clone(), in_stream);
            }
            wire::encode_xlog_data(x, &mut out);
        }
        ReplicationMessage::PrimaryKeepalive(k) => wire::encode_keepalive(k, &mut out),
    }
    assert_eq!(out.freeze(), input, "parse_copy_data accepted a non-canonical payload");
});

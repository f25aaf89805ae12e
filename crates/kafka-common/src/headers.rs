//! A Kafka record's headers as bytes, read with librdkafka's own header API.
//!
//! rust-rdkafka's `Headers::iter` gives each name as `&str` and panics on a name that is
//! not UTF-8: a name is whatever bytes a producer sent, so one hostile record would stop
//! the thread reading it, at the same record after every restart. Here names are the
//! bytes librdkafka holds (a C string each: a name is read up to its first NUL byte).
//!
//! Invariant (what makes the `unsafe` calls sound): every pointer read here belongs to
//! the message, which the returned slices borrow; nothing is written or freed.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_void, CStr};
use std::ptr;

use rdkafka::bindings as rd;
use rdkafka::message::BorrowedMessage;

/// One header: its name's bytes and its value (`None`: a null value).
pub type RawHeader<'a> = (&'a [u8], Option<&'a [u8]>);

/// The headers of `m`, in order (none: empty).
pub fn raw<'a>(m: &'a BorrowedMessage<'_>) -> Vec<RawHeader<'a>> {
    let mut headers: *mut rd::rd_kafka_headers_t = ptr::null_mut();
    // SAFETY: `m.ptr()` is the message, alive for 'a; librdkafka parses its headers into
    // a list the message owns (and frees with it).
    let err = unsafe { rd::rd_kafka_message_headers(m.ptr(), &mut headers) };
    if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || headers.is_null() {
        return Vec::new();
    }
    // SAFETY: `headers` is the message's list (above).
    let count = unsafe { rd::rd_kafka_header_cnt(headers) };
    let mut out = Vec::with_capacity(count);
    for idx in 0..count {
        let mut name: *const c_char = ptr::null();
        let mut value: *const c_void = ptr::null();
        let mut size: usize = 0;
        // SAFETY: `idx` is below the count; the out-pointers are valid locals.
        let err = unsafe { rd::rd_kafka_header_get_all(headers, idx, &mut name, &mut value, &mut size) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            break;
        }
        // SAFETY: librdkafka keeps each name NUL-terminated and each value `size` bytes
        // long, in memory the message owns (alive for 'a).
        let name = unsafe { CStr::from_ptr(name) }.to_bytes();
        let value = (!value.is_null()).then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) });
        out.push((name, value));
    }
    out
}

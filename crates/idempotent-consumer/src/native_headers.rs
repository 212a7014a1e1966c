//! A consumed record's headers, read through librdkafka's C API.
//!
//! rdkafka 0.39 reads a header name with `CStr::to_str().unwrap()`
//! (`message.rs`, `BorrowedHeaders::try_get`), so a record whose header name
//! is not UTF-8 panics whoever touches its headers; the record's offset is
//! never stored and every restart dies on it again. Any producer that is not
//! written in Java may send such a name. Here names are read as bytes, and
//! judging them is left to the parser.
//!
//! One limit: librdkafka's API hands a name out as a C string, without its
//! length, so a name with a NUL byte reads as the bytes before it (`id\0x`
//! reads as `id`). Nothing crashes or stalls on it; such a header is simply
//! read under the shorter name, as a Java consumer would read it under
//! another. Where a name occurs twice the last header wins (Kafka's
//! `lastHeader`).

// The only way to read a header name that rdkafka would panic on.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_void};

use rdkafka::message::BorrowedMessage;
use rdkafka_sys as sys;

/// A header as read: its name's bytes and its value, if any.
pub(super) type RawHeader = (Vec<u8>, Option<Vec<u8>>);

/// The headers of `message`, in record order; `Err` when librdkafka cannot
/// parse them from the record at all.
pub(super) fn read(
    message: &BorrowedMessage<'_>,
) -> Result<Vec<RawHeader>, sys::rd_kafka_resp_err_t> {
    let mut headers: *mut sys::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `message.ptr()` is the live message the borrow keeps alive;
    // librdkafka writes a pointer to headers that the message owns (never
    // freed here) and that live as long as the message.
    let error = unsafe { sys::rd_kafka_message_headers(message.ptr(), &mut headers) };
    match error {
        sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => {}
        sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__NOENT => return Ok(Vec::new()),
        other => return Err(other),
    }
    // SAFETY: `headers` is valid (above).
    let count = unsafe { sys::rd_kafka_header_cnt(headers) };
    let mut read = Vec::with_capacity(count);
    for index in 0..count {
        let mut name: *const c_char = std::ptr::null();
        let mut value: *const c_void = std::ptr::null();
        let mut size: usize = 0;
        // SAFETY: `index` is below the count; librdkafka writes pointers into
        // the headers it owns: a NUL-terminated name, and a value of `size`
        // bytes or null.
        let error = unsafe {
            sys::rd_kafka_header_get_all(headers, index, &mut name, &mut value, &mut size)
        };
        if error != sys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            return Err(error);
        }
        // SAFETY: a NUL-terminated string owned by the headers (above); the
        // bytes are copied before the message can go.
        let name = unsafe { CStr::from_ptr(name) }.to_bytes().to_vec();
        let value = (!value.is_null()).then(|| {
            // SAFETY: `size` readable bytes at `value` (above), copied at once.
            unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec()
        });
        read.push((name, value));
    }
    Ok(read)
}

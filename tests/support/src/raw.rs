//! Records that rdkafka's safe API cannot express, produced through
//! librdkafka's C API: header names that are not UTF-8, as any producer not
//! written in Java or Rust may send them. The bytes on the wire are exactly
//! the ones given.

// The only way to hand librdkafka a header name that is not a Rust `str`.
#![allow(unsafe_code)]

use std::ffi::{CString, c_void};
use std::sync::Mutex;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext};
use rdkafka_sys as sys;

/// A record with raw header names.
#[derive(Debug, Clone)]
pub struct RawRecord<'a> {
    pub partition: i32,
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub headers: Vec<(&'a [u8], Option<&'a [u8]>)>,
}

/// Remembers the delivery report (never touches the headers, whose names
/// rdkafka would read as `str`).
#[derive(Default)]
struct Reports(Mutex<Vec<Result<(i32, i64), String>>>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let report = match result {
            Ok(message) => Ok((message.partition(), message.offset())),
            Err((error, _)) => Err(error.to_string()),
        };
        self.0.lock().unwrap().push(report);
    }
}

/// Produces `record` to `topic` and waits for the broker's acknowledgement;
/// returns its (partition, offset).
pub fn produce(bootstrap: &str, topic: &str, record: &RawRecord<'_>) -> (i32, i64) {
    let producer: BaseProducer<Reports> = crate::kafka::client_config(bootstrap)
        .set("enable.idempotence", "true")
        .create_with_context(Reports::default())
        .unwrap();
    let topic = CString::new(topic).unwrap();
    let names: Vec<CString> = record
        .headers
        .iter()
        .map(|(name, _)| CString::new(*name).expect("a header name without NUL bytes"))
        .collect();
    let mut vus = vec![
        vu(sys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_TOPIC, |u| {
            u.cstr = topic.as_ptr();
        }),
        vu(sys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_PARTITION, |u| {
            u.i32_ = record.partition;
        }),
        vu(sys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_MSGFLAGS, |u| {
            u.i = sys::RD_KAFKA_MSG_F_COPY;
        }),
        vu(sys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_KEY, |u| {
            u.mem = memory(record.key);
        }),
        vu(sys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_VALUE, |u| {
            u.mem = memory(record.value);
        }),
    ];
    for (name, (_, value)) in names.iter().zip(&record.headers) {
        vus.push(vu(sys::rd_kafka_vtype_t::RD_KAFKA_VTYPE_HEADER, |u| {
            u.header = sys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_2 {
                name: name.as_ptr(),
                val: value.map_or(std::ptr::null(), |v| v.as_ptr().cast::<c_void>()),
                size: value.map_or(0, |v| isize::try_from(v.len()).unwrap()),
            };
        }));
    }
    // SAFETY: every pointer in `vus` (topic, header names, key, value and
    // header values) outlives the call, and RD_KAFKA_MSG_F_COPY makes
    // librdkafka copy the key and value before it returns; it copies header
    // names and values in any case.
    let error =
        unsafe { sys::rd_kafka_produceva(producer.client().native_ptr(), vus.as_ptr(), vus.len()) };
    assert!(error.is_null(), "librdkafka refused the record");
    producer.flush(Duration::from_secs(30)).unwrap();
    let reports = producer.context().0.lock().unwrap().clone();
    match reports.as_slice() {
        [Ok(position)] => *position,
        other => panic!("unexpected delivery reports: {other:?}"),
    }
}

fn vu(
    vtype: sys::rd_kafka_vtype_t,
    set: impl FnOnce(&mut sys::rd_kafka_vu_s__bindgen_ty_1),
) -> sys::rd_kafka_vu_t {
    let mut u = sys::rd_kafka_vu_s__bindgen_ty_1 { _pad: [0; 64] };
    set(&mut u);
    sys::rd_kafka_vu_t { vtype, u }
}

fn memory(bytes: &[u8]) -> sys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
    sys::rd_kafka_vu_s__bindgen_ty_1__bindgen_ty_1 {
        ptr: bytes.as_ptr().cast_mut().cast::<c_void>(),
        size: bytes.len(),
    }
}

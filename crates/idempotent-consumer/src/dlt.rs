//! Dead-letter records: what goes to the DLT, and how its headers read back.
//!
//! A dead letter keeps the source's key, value bytes and headers, goes to the
//! same partition number, and adds the headers Spring Kafka's
//! `DeadLetterPublishingRecoverer` writes, with Spring's encodings (so Spring
//! tooling reads them), plus `dlt-reason` and `dlt-attempts`:
//!
//! | header | encoding |
//! | --- | --- |
//! | `kafka_dlt-original-topic` | UTF-8 |
//! | `kafka_dlt-original-partition` | 4-byte big-endian signed int |
//! | `kafka_dlt-original-offset` | 8-byte big-endian signed long |
//! | `kafka_dlt-original-timestamp` | 8-byte big-endian signed long, ms since the epoch |
//! | `kafka_dlt-original-timestamp-type` | UTF-8, `CreateTime`, `LogAppendTime` or `NoTimestampType` |
//! | `kafka_dlt-original-consumer-group` | UTF-8 |
//! | `kafka_dlt-exception-message` | UTF-8, at most [`MAX_EXCEPTION_MESSAGE`] bytes |
//! | `kafka_dlt-exception-fqcn` | UTF-8, the Rust path of the error type |
//! | `dlt-reason` | UTF-8, one of the six reasons |
//! | `dlt-attempts` | UTF-8 decimal |
//!
//! Bounded whatever the record: the exception message is cut to
//! [`MAX_EXCEPTION_MESSAGE`] bytes, and a dead letter too large for the
//! broker is sent again as a [`DeadLetter::skeleton`]: value left out (header
//! `dlt-value-truncated` gives its size), large key and header values left
//! out likewise; the original position headers say where the whole record
//! still is, for as long as the source topic keeps it. A header name that is
//! not UTF-8 is written with its invalid bytes escaped as `\xNN`.

use rdkafka::Timestamp;

use super::failure::Failure;
use super::record::{Header, Record};

pub const ORIGINAL_TOPIC: &str = "kafka_dlt-original-topic";
pub const ORIGINAL_PARTITION: &str = "kafka_dlt-original-partition";
pub const ORIGINAL_OFFSET: &str = "kafka_dlt-original-offset";
pub const ORIGINAL_TIMESTAMP: &str = "kafka_dlt-original-timestamp";
pub const ORIGINAL_TIMESTAMP_TYPE: &str = "kafka_dlt-original-timestamp-type";
pub const ORIGINAL_CONSUMER_GROUP: &str = "kafka_dlt-original-consumer-group";
pub const EXCEPTION_MESSAGE: &str = "kafka_dlt-exception-message";
pub const EXCEPTION_FQCN: &str = "kafka_dlt-exception-fqcn";
pub const REASON: &str = "dlt-reason";
pub const ATTEMPTS: &str = "dlt-attempts";
/// On a skeleton: the size in bytes of the value left out.
pub const VALUE_TRUNCATED: &str = "dlt-value-truncated";
/// On a skeleton: the size in bytes of the key left out.
pub const KEY_TRUNCATED: &str = "dlt-key-truncated";
/// On a skeleton: `name=size` of each header value left out, comma-separated.
pub const HEADERS_TRUNCATED: &str = "dlt-headers-truncated";
/// Added by redrive: where the record came from, `topic/partition/offset`.
pub const REDRIVEN_FROM: &str = "dlt-redriven-from";

/// The longest `kafka_dlt-exception-message`, in bytes.
pub const MAX_EXCEPTION_MESSAGE: usize = 1024;
/// In a skeleton, key and header values up to this size are kept.
const SKELETON_KEEPS_UP_TO: usize = 4 * 1024;
/// In a skeleton, original headers are kept up to this many bytes in all.
const SKELETON_HEADER_BUDGET: usize = 64 * 1024;

/// The headers that belong to the dead-letter step (and to redrive), not to
/// the message.
pub fn is_dlt_header(name: &[u8]) -> bool {
    name.starts_with(b"kafka_dlt-") || name.starts_with(b"dlt-")
}

/// The message's own headers: those of an earlier dead-lettering or redrive
/// left out.
pub fn message_headers(record: &Record) -> impl Iterator<Item = &Header> {
    record
        .headers
        .iter()
        .filter(|header| !is_dlt_header(&header.name))
}

/// A record bound for the DLT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub partition: i32,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// Names as text: the producer's API takes `str`.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// `text` cut to at most `max` bytes on a character boundary, marked when cut.
fn bounded(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    const MARK: &str = "…";
    let mut end = max - MARK.len();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

impl DeadLetter {
    /// The dead letter of `source`: same key, value and headers (the DLT
    /// headers of an earlier dead-lettering replaced), plus the DLT headers.
    pub fn of(source: &Record, group: &str, failure: &Failure) -> Self {
        let mut headers: Vec<(String, Option<Vec<u8>>)> = message_headers(source)
            .map(|header| (header.name_text().into_owned(), header.value.clone()))
            .collect();
        headers.extend(dlt_headers(source, group, failure));
        Self {
            partition: source.partition,
            key: source.key.clone(),
            value: source.value.clone(),
            headers,
        }
    }

    /// The same dead letter small enough for any broker: the value left out,
    /// and a key or header values over a few KiB, each noted in a header.
    pub fn skeleton(source: &Record, group: &str, failure: &Failure) -> Self {
        let mut headers = Vec::new();
        let mut truncated = Vec::new();
        let mut budget = SKELETON_HEADER_BUDGET;
        for header in message_headers(source) {
            let name = bounded(&header.name_text(), 256);
            let size = name.len() + header.value.as_ref().map_or(0, Vec::len);
            if size <= SKELETON_KEEPS_UP_TO && size <= budget {
                budget -= size;
                headers.push((name, header.value.clone()));
            } else {
                truncated.push(format!("{name}={size}"));
            }
        }
        headers.extend(dlt_headers(source, group, failure));
        let text = |name: &str, value: String| (name.to_owned(), Some(value.into_bytes()));
        let value_size = source.value.as_ref().map_or(0, Vec::len);
        headers.push(text(VALUE_TRUNCATED, value_size.to_string()));
        let key = match &source.key {
            Some(key) if key.len() > SKELETON_KEEPS_UP_TO => {
                headers.push(text(KEY_TRUNCATED, key.len().to_string()));
                None
            }
            key => key.clone(),
        };
        if !truncated.is_empty() {
            headers.push(text(
                HEADERS_TRUNCATED,
                bounded(&truncated.join(","), MAX_EXCEPTION_MESSAGE),
            ));
        }
        Self {
            partition: source.partition,
            key,
            value: None,
            headers,
        }
    }
}

fn dlt_headers(source: &Record, group: &str, failure: &Failure) -> Vec<(String, Option<Vec<u8>>)> {
    let (timestamp, timestamp_type) = match source.timestamp {
        Timestamp::CreateTime(ms) => (ms, "CreateTime"),
        Timestamp::LogAppendTime(ms) => (ms, "LogAppendTime"),
        Timestamp::NotAvailable => (-1, "NoTimestampType"),
    };
    let text = |name: &str, value: &str| (name.to_owned(), Some(value.as_bytes().to_vec()));
    let binary = |name: &str, value: Vec<u8>| (name.to_owned(), Some(value));
    vec![
        text(ORIGINAL_TOPIC, &source.topic),
        binary(ORIGINAL_PARTITION, source.partition.to_be_bytes().to_vec()),
        binary(ORIGINAL_OFFSET, source.offset.to_be_bytes().to_vec()),
        binary(ORIGINAL_TIMESTAMP, timestamp.to_be_bytes().to_vec()),
        text(ORIGINAL_TIMESTAMP_TYPE, timestamp_type),
        text(ORIGINAL_CONSUMER_GROUP, group),
        text(
            EXCEPTION_MESSAGE,
            &bounded(&failure.message, MAX_EXCEPTION_MESSAGE),
        ),
        text(EXCEPTION_FQCN, failure.error_type),
        text(REASON, failure.reason.as_str()),
        text(ATTEMPTS, &failure.attempts.to_string()),
    ]
}

/// A header value as a person should read it: Spring's binary integers
/// decoded, text as text, anything else in hex.
pub fn decode_header(name: &str, value: Option<&[u8]>) -> String {
    let Some(bytes) = value else {
        return "(null)".to_owned();
    };
    match name {
        ORIGINAL_PARTITION => <[u8; 4]>::try_from(bytes)
            .map_or_else(|_| hex(bytes), |b| i32::from_be_bytes(b).to_string()),
        ORIGINAL_OFFSET | ORIGINAL_TIMESTAMP => <[u8; 8]>::try_from(bytes)
            .map_or_else(|_| hex(bytes), |b| i64::from_be_bytes(b).to_string()),
        _ => std::str::from_utf8(bytes).map_or_else(|_| hex(bytes), str::to_owned),
    }
}

fn hex(bytes: &[u8]) -> String {
    let digits: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("0x{digits}")
}

/// What a DLT record says about where it came from and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DltInfo {
    pub original_topic: Option<String>,
    pub original_partition: Option<i32>,
    pub original_offset: Option<i64>,
    pub reason: Option<String>,
    pub attempts: Option<u32>,
    pub message_id: Option<String>,
    /// A [`DeadLetter::skeleton`]: the value (and perhaps key or header
    /// values) left out, so it is not the message and cannot be redriven.
    pub skeleton: bool,
}

impl DltInfo {
    pub fn of(record: &Record) -> Self {
        let bytes = |name: &str| record.header(name).flatten();
        Self {
            original_topic: record.text_header(ORIGINAL_TOPIC),
            original_partition: bytes(ORIGINAL_PARTITION)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map(i32::from_be_bytes),
            original_offset: bytes(ORIGINAL_OFFSET)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(i64::from_be_bytes),
            reason: record.text_header(REASON),
            attempts: record.text_header(ATTEMPTS).and_then(|a| a.parse().ok()),
            message_id: record.text_header("id"),
            skeleton: [VALUE_TRUNCATED, KEY_TRUNCATED, HEADERS_TRUNCATED]
                .iter()
                .any(|name| record.header(name).is_some()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::failure::{DltReason, InvalidMessage};
    use super::*;

    fn source() -> Record {
        Record {
            topic: "pedido.eventos".into(),
            partition: 4,
            offset: 1_234_567,
            timestamp: Timestamp::CreateTime(1_764_687_600_000),
            key: Some(b"order-1".to_vec()),
            value: Some(b"{not json".to_vec()),
            headers: vec![
                Header::new("id", Some(b"0190f5d2-7c1e-7000-8000-0000000000a1")),
                Header::new("eventType", Some(b"PedidoCriado")),
                Header::new("traceparent", None),
            ],
            unreadable_headers: false,
        }
    }

    fn invalid_json() -> Failure {
        Failure::invalid(&InvalidMessage::new(
            DltReason::InvalidJson,
            "value is not JSON",
        ))
    }

    fn header<'a>(dead: &'a DeadLetter, name: &str) -> &'a [u8] {
        dead.headers
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
            .unwrap()
    }

    #[test]
    fn the_dead_letter_keeps_the_record_and_adds_springs_headers() {
        let dead = DeadLetter::of(&source(), "estoque", &invalid_json());

        assert_eq!(dead.partition, 4);
        assert_eq!(dead.key, source().key);
        assert_eq!(dead.value, source().value);
        let kept: Vec<(String, Option<Vec<u8>>)> = source()
            .headers
            .iter()
            .map(|h| (h.name_text().into_owned(), h.value.clone()))
            .collect();
        assert_eq!(&dead.headers[..3], &kept[..]);
        assert_eq!(header(&dead, ORIGINAL_TOPIC), b"pedido.eventos");
        // Partition and offset each from their own field, in Spring's encoding.
        assert_eq!(header(&dead, ORIGINAL_PARTITION), 4_i32.to_be_bytes());
        assert_eq!(header(&dead, ORIGINAL_OFFSET), 1_234_567_i64.to_be_bytes());
        assert_eq!(
            header(&dead, ORIGINAL_TIMESTAMP),
            1_764_687_600_000_i64.to_be_bytes()
        );
        assert_eq!(header(&dead, ORIGINAL_TIMESTAMP_TYPE), b"CreateTime");
        assert_eq!(header(&dead, ORIGINAL_CONSUMER_GROUP), b"estoque");
        assert_eq!(header(&dead, EXCEPTION_MESSAGE), b"value is not JSON");
        assert_eq!(
            header(&dead, EXCEPTION_FQCN),
            b"idempotent_consumer::failure::InvalidMessage"
        );
        assert_eq!(header(&dead, REASON), b"invalid-json");
        assert_eq!(header(&dead, ATTEMPTS), b"1");
    }

    #[test]
    fn the_error_type_of_an_exhausted_retry_is_the_database_error() {
        let failure = Failure::retries_exhausted(&sqlx::Error::PoolTimedOut, 4);
        let dead = DeadLetter::of(&source(), "estoque", &failure);
        assert_eq!(header(&dead, EXCEPTION_FQCN), b"sqlx_core::error::Error");
        assert_eq!(header(&dead, ATTEMPTS), b"4");
    }

    #[test]
    fn dead_lettering_a_redriven_record_again_replaces_its_dlt_headers() {
        let dead = DeadLetter::of(&source(), "estoque", &invalid_json());
        let mut again = source();
        again.headers = dead
            .headers
            .iter()
            .map(|(n, v)| Header::new(n, v.as_deref()))
            .collect();
        again
            .headers
            .push(Header::new(REDRIVEN_FROM, Some(b"dlt/4/0")));
        let twice = DeadLetter::of(&again, "estoque", &invalid_json());
        assert_eq!(twice.headers.iter().filter(|(n, _)| n == REASON).count(), 1);
        assert!(!twice.headers.iter().any(|(n, _)| n == REDRIVEN_FROM));
    }

    #[test]
    fn the_exception_message_is_bounded_on_a_character_boundary() {
        let mut failure = invalid_json();
        failure.message = "ç".repeat(5_000);
        let dead = DeadLetter::of(&source(), "estoque", &failure);
        let message = std::str::from_utf8(header(&dead, EXCEPTION_MESSAGE)).unwrap();
        assert!(message.len() <= MAX_EXCEPTION_MESSAGE);
        assert!(message.ends_with('…'));
    }

    #[test]
    fn a_header_name_that_is_not_utf8_is_kept_escaped() {
        let mut record = source();
        record.headers.push(Header {
            name: vec![0xff, b'x'],
            value: Some(b"v".to_vec()),
        });
        let dead = DeadLetter::of(&record, "estoque", &invalid_json());
        assert_eq!(header(&dead, "\\xFFx"), b"v");
    }

    #[test]
    fn a_skeleton_leaves_out_the_value_and_large_parts_and_says_so() {
        let mut record = source();
        record.value = Some(vec![b'{'; 999_500]);
        record.key = Some(vec![b'k'; 10_000]);
        record
            .headers
            .push(Header::new("big", Some(&vec![b'x'; 600_000])));
        let skeleton = DeadLetter::skeleton(&record, "estoque", &invalid_json());
        assert_eq!(skeleton.value, None);
        assert_eq!(skeleton.key, None);
        assert_eq!(header(&skeleton, VALUE_TRUNCATED), b"999500");
        assert_eq!(header(&skeleton, KEY_TRUNCATED), b"10000");
        assert_eq!(header(&skeleton, HEADERS_TRUNCATED), b"big=600003");
        assert_eq!(header(&skeleton, "eventType"), b"PedidoCriado");
        assert_eq!(header(&skeleton, REASON), b"invalid-json");
        let size: usize = skeleton
            .headers
            .iter()
            .map(|(n, v)| n.len() + v.as_ref().map_or(0, Vec::len))
            .sum();
        assert!(size < SKELETON_HEADER_BUDGET + 4 * 1024, "{size} bytes");
    }

    #[test]
    fn headers_decode_for_people() {
        assert_eq!(
            decode_header(ORIGINAL_PARTITION, Some(&7_i32.to_be_bytes())),
            "7"
        );
        assert_eq!(
            decode_header(ORIGINAL_OFFSET, Some(&42_i64.to_be_bytes())),
            "42"
        );
        assert_eq!(
            decode_header("eventType", Some(b"PedidoCriado")),
            "PedidoCriado"
        );
        assert_eq!(decode_header("x", Some(&[0xff, 0x00])), "0xff00");
        assert_eq!(decode_header("traceparent", None), "(null)");
    }
}

//! Dead-letter records: what goes to `pedido.eventos.dlt`, and how its
//! headers read back.
//!
//! A dead-letter record keeps the source's key, value bytes and headers, goes
//! to the same partition number, and adds the headers Spring Kafka's
//! `DeadLetterPublishingRecoverer` writes, with Spring's encodings (so Spring
//! tooling reads them), plus `dlt-reason` and `dlt-attempts`:
//!
//! | header | encoding |
//! | --- | --- |
//! | `kafka_dlt-original-topic` | UTF-8 |
//! | `kafka_dlt-original-partition` | 4-byte big-endian signed int |
//! | `kafka_dlt-original-offset` | 8-byte big-endian signed long |
//! | `kafka_dlt-original-timestamp` | 8-byte big-endian signed long, ms since the epoch |
//! | `kafka_dlt-original-timestamp-type` | UTF-8, `CreateTime` or `LogAppendTime` |
//! | `kafka_dlt-original-consumer-group` | UTF-8 |
//! | `kafka_dlt-exception-message` | UTF-8 |
//! | `kafka_dlt-exception-fqcn` | UTF-8, the error type |
//! | `dlt-reason` | UTF-8, one of the six reasons |
//! | `dlt-attempts` | UTF-8 decimal |

use rdkafka::Timestamp;

use crate::event::DltReason;

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
/// Added by redrive: where the record came from, `topic/partition/offset`.
pub const REDRIVEN_FROM: &str = "dlt-redriven-from";

/// The headers that belong to the dead-letter step, not to the message.
pub fn is_dlt_header(name: &str) -> bool {
    name.starts_with("kafka_dlt-") || name == REASON || name == ATTEMPTS
}

/// A consumed record, owned: what the consumer and the tools work on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Timestamp,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl SourceRecord {
    pub fn from_message(message: &impl rdkafka::Message) -> Self {
        use rdkafka::message::Headers;
        let headers = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            })
            .unwrap_or_default();
        Self {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp(),
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            headers,
        }
    }

    /// The last header of that name (Kafka's `lastHeader`), if any.
    pub fn header(&self, name: &str) -> Option<&Option<Vec<u8>>> {
        self.headers
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value)
    }

    pub fn text_header(&self, name: &str) -> Option<String> {
        self.header(name)
            .and_then(Option::as_ref)
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
    }
}

/// Why and how a record failed, as the DLT records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: DltReason,
    pub message: String,
    pub attempts: u32,
}

/// The dead-letter record for `source`: same key, value and headers, plus
/// the DLT headers. It goes to the same partition number of the DLT.
pub fn dead_letter(source: &SourceRecord, group: &str, failure: &Failure) -> SourceRecord {
    let (timestamp, timestamp_type) = match source.timestamp {
        Timestamp::CreateTime(ms) => (ms, "CreateTime"),
        Timestamp::LogAppendTime(ms) => (ms, "LogAppendTime"),
        Timestamp::NotAvailable => (-1, "NoTimestampType"),
    };
    let mut headers: Vec<(String, Option<Vec<u8>>)> = source
        .headers
        .iter()
        .filter(|(name, _)| !is_dlt_header(name))
        .cloned()
        .collect();
    let text = |name: &str, value: &str| (name.to_owned(), Some(value.as_bytes().to_vec()));
    headers.extend([
        text(ORIGINAL_TOPIC, &source.topic),
        (
            ORIGINAL_PARTITION.to_owned(),
            Some(source.partition.to_be_bytes().to_vec()),
        ),
        (
            ORIGINAL_OFFSET.to_owned(),
            Some(source.offset.to_be_bytes().to_vec()),
        ),
        (
            ORIGINAL_TIMESTAMP.to_owned(),
            Some(timestamp.to_be_bytes().to_vec()),
        ),
        text(ORIGINAL_TIMESTAMP_TYPE, timestamp_type),
        text(ORIGINAL_CONSUMER_GROUP, group),
        text(EXCEPTION_MESSAGE, &failure.message),
        text(EXCEPTION_FQCN, failure.reason.error_type()),
        text(REASON, failure.reason.as_str()),
        text(ATTEMPTS, &failure.attempts.to_string()),
    ]);
    SourceRecord {
        topic: String::new(),
        partition: source.partition,
        offset: -1,
        timestamp: source.timestamp,
        key: source.key.clone(),
        value: source.value.clone(),
        headers,
    }
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
}

impl DltInfo {
    pub fn of(record: &SourceRecord) -> Self {
        let bytes = |name: &str| record.header(name).and_then(Option::as_deref);
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> SourceRecord {
        SourceRecord {
            topic: "pedido.eventos".into(),
            partition: 4,
            offset: 1_234_567,
            timestamp: Timestamp::CreateTime(1_764_687_600_000),
            key: Some(b"order-1".to_vec()),
            value: Some(b"{not json".to_vec()),
            headers: vec![
                (
                    "id".into(),
                    Some(b"0190f5d2-7c1e-7000-8000-0000000000a1".to_vec()),
                ),
                ("eventType".into(), Some(b"PedidoCriado".to_vec())),
                ("traceparent".into(), None),
            ],
        }
    }

    #[test]
    fn the_dead_letter_keeps_the_record_and_adds_springs_headers() {
        let failure = Failure {
            reason: DltReason::InvalidJson,
            message: "value is not JSON".into(),
            attempts: 1,
        };
        let dlt = dead_letter(&source(), "estoque", &failure);

        assert_eq!(dlt.partition, 4);
        assert_eq!(dlt.key, source().key);
        assert_eq!(dlt.value, source().value);
        assert_eq!(&dlt.headers[..3], &source().headers[..]);
        let header = |name: &str| dlt.header(name).cloned().flatten().unwrap();
        assert_eq!(header(ORIGINAL_TOPIC), b"pedido.eventos");
        // Partition and offset each from their own field, in Spring's encoding.
        assert_eq!(header(ORIGINAL_PARTITION), 4_i32.to_be_bytes());
        assert_eq!(header(ORIGINAL_OFFSET), 1_234_567_i64.to_be_bytes());
        assert_eq!(
            header(ORIGINAL_TIMESTAMP),
            1_764_687_600_000_i64.to_be_bytes()
        );
        assert_eq!(header(ORIGINAL_TIMESTAMP_TYPE), b"CreateTime");
        assert_eq!(header(ORIGINAL_CONSUMER_GROUP), b"estoque");
        assert_eq!(header(EXCEPTION_MESSAGE), b"value is not JSON");
        assert_eq!(
            header(EXCEPTION_FQCN),
            b"inventory_service::event::InvalidMessage"
        );
        assert_eq!(header(REASON), b"invalid-json");
        assert_eq!(header(ATTEMPTS), b"1");

        let info = DltInfo::of(&dlt);
        assert_eq!(info.original_partition, Some(4));
        assert_eq!(info.original_offset, Some(1_234_567));
        assert_eq!(info.attempts, Some(1));
    }

    #[test]
    fn dead_lettering_a_redriven_record_again_replaces_its_dlt_headers() {
        let failure = Failure {
            reason: DltReason::RetriesExhausted,
            message: "database unavailable".into(),
            attempts: 4,
        };
        let once = dead_letter(&source(), "estoque", &failure);
        let mut again_source = once.clone();
        again_source.topic = "pedido.eventos".into();
        let twice = dead_letter(&again_source, "estoque", &failure);
        assert_eq!(twice.headers.iter().filter(|(n, _)| n == REASON).count(), 1);
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

//! A consumed record, owned: what the consumer, the DLT and the tools work on.

use std::borrow::Cow;
use std::fmt::Write;

use rdkafka::Timestamp;
use rdkafka::message::{BorrowedMessage, Message};
use service_support::telemetry::{self, TraceContext};
use uuid::Uuid;

use super::failure::{DltReason, InvalidMessage, quote};
use super::native_headers;

/// One header. Kafka header names are strings on the wire, but nothing stops
/// a producer from sending any bytes: the name is kept as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: Vec<u8>,
    /// `None` is a header with a null value.
    pub value: Option<Vec<u8>>,
}

impl Header {
    pub fn new(name: &str, value: Option<&[u8]>) -> Self {
        Self {
            name: name.as_bytes().to_vec(),
            value: value.map(<[u8]>::to_vec),
        }
    }

    /// The name as text: itself when it is UTF-8, otherwise with every byte
    /// that is not escaped as `\xNN`. rdkafka's producer takes names as
    /// `str`, so a dead letter carries a foreign name in this form.
    pub fn name_text(&self) -> Cow<'_, str> {
        escape_invalid_utf8(&self.name)
    }
}

/// `bytes` as text, invalid UTF-8 sequences escaped byte by byte as `\xNN`.
pub fn escape_invalid_utf8(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(text) = std::str::from_utf8(bytes) {
        return Cow::Borrowed(text);
    }
    let mut text = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        text.push_str(chunk.valid());
        for byte in chunk.invalid() {
            let _ = write!(text, "\\x{byte:02X}");
        }
    }
    Cow::Owned(text)
}

/// A record as consumed, with everything it carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Timestamp,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<Header>,
    /// librdkafka could not parse the record's headers: the record is
    /// dead-lettered as `invalid-header`.
    pub unreadable_headers: bool,
}

impl Record {
    /// Copies a consumed message. Never panics, whatever its bytes.
    pub fn from_message(message: &BorrowedMessage<'_>) -> Self {
        let (headers, unreadable_headers) = match native_headers::read(message) {
            Ok(headers) => (
                headers
                    .into_iter()
                    .map(|(name, value)| Header { name, value })
                    .collect(),
                false,
            ),
            Err(_) => (Vec::new(), true),
        };
        Self {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp(),
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            headers,
            unreadable_headers,
        }
    }

    /// The value of the last header named `name` (Kafka's `lastHeader`):
    /// `None` when absent, `Some(None)` when its value is null.
    pub fn header(&self, name: &str) -> Option<Option<&[u8]>> {
        self.headers
            .iter()
            .rev()
            .find(|header| header.name == name.as_bytes())
            .map(|header| header.value.as_deref())
    }

    /// A header's value as text, invalid UTF-8 replaced, for logs and tools.
    pub fn text_header(&self, name: &str) -> Option<String> {
        self.header(name)
            .flatten()
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
    }

    /// The value of header `name` as text; `missing-header` when absent or
    /// null, `invalid-header` when not UTF-8.
    pub fn required_text_header(&self, name: &str) -> Result<&str, InvalidMessage> {
        match self.header(name) {
            None | Some(None) => Err(InvalidMessage::new(
                DltReason::MissingHeader,
                format!("header {name} is missing"),
            )),
            Some(Some(bytes)) => std::str::from_utf8(bytes).map_err(|_| {
                InvalidMessage::new(
                    DltReason::InvalidHeader,
                    format!("header {name} is not UTF-8"),
                )
            }),
        }
    }

    /// The message id, from the `id` header, never from the broker position;
    /// checked after every header name, which must be UTF-8.
    pub fn message_id(&self) -> Result<Uuid, InvalidMessage> {
        if self.unreadable_headers {
            return Err(InvalidMessage::new(
                DltReason::InvalidHeader,
                "the record's headers cannot be parsed",
            ));
        }
        if let Some(header) = self
            .headers
            .iter()
            .find(|header| std::str::from_utf8(&header.name).is_err())
        {
            return Err(InvalidMessage::new(
                DltReason::InvalidHeader,
                format!("header name {} is not UTF-8", quote(&header.name_text())),
            ));
        }
        let text = self.required_text_header("id")?;
        Uuid::try_parse(text).map_err(|_| {
            InvalidMessage::new(
                DltReason::InvalidHeader,
                format!("header id is not a UUID: {}", quote(text)),
            )
        })
    }

    /// The W3C trace context of the `traceparent` and `tracestate` headers,
    /// if valid; an invalid one is ignored.
    pub fn trace_context(&self) -> Option<TraceContext> {
        TraceContext::parse(
            &self.text_header("traceparent")?,
            self.text_header("tracestate").as_deref(),
        )
    }

    /// The span of this record's processing: message id, topic, partition,
    /// offset; for OpenTelemetry a consumer span continuing the record's
    /// trace (a new one when it has none), with the outcome once known.
    pub fn span(&self) -> tracing::Span {
        let span = tracing::info_span!(
            parent: None,
            "message",
            id = self.text_header("id").as_deref().unwrap_or("-"),
            topic = %self.topic,
            partition = self.partition,
            offset = self.offset,
            otel.name = format!("{} process", self.topic),
            otel.kind = "consumer",
            otel.status_code = tracing::field::Empty,
            messaging.system = "kafka",
            messaging.operation.type = "process",
            entrega.outcome = tracing::field::Empty,
            entrega.effect = tracing::field::Empty,
            entrega.dlt.reason = tracing::field::Empty,
            entrega.attempts = tracing::field::Empty,
        );
        telemetry::continue_trace(&span, || self.trace_context());
        span
    }

    /// The bytes a record costs on the wire, roughly: key, value, headers.
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len)
            + self.value.as_ref().map_or(0, Vec::len)
            + self
                .headers
                .iter()
                .map(|h| h.name.len() + h.value.as_ref().map_or(0, Vec::len))
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_utf8_is_escaped_byte_by_byte_and_valid_text_is_kept() {
        assert_eq!(escape_invalid_utf8(b"eventType"), "eventType");
        assert_eq!(escape_invalid_utf8(&[0xff]), "\\xFF");
        assert_eq!(
            escape_invalid_utf8(b"a\xc3(b\xe2\x82"),
            "a\\xC3(b\\xE2\\x82"
        );
        assert_eq!(escape_invalid_utf8("ção".as_bytes()), "ção");
    }

    fn record(headers: Vec<Header>) -> Record {
        Record {
            topic: "t".into(),
            partition: 0,
            offset: 0,
            timestamp: Timestamp::NotAvailable,
            key: None,
            value: None,
            headers,
            unreadable_headers: false,
        }
    }

    #[test]
    fn the_message_id_comes_from_the_id_header_and_every_name_must_be_text() {
        const ID: &[u8] = b"0190f5d2-7c1e-7000-8000-0000000000a1";
        let reason = |headers| record(headers).message_id().unwrap_err().reason;
        assert!(
            record(vec![Header::new("id", Some(ID))])
                .message_id()
                .is_ok()
        );
        assert_eq!(reason(vec![]), DltReason::MissingHeader);
        assert_eq!(
            reason(vec![Header::new("id", None)]),
            DltReason::MissingHeader
        );
        assert_eq!(
            reason(vec![Header::new("id", Some(b"42"))]),
            DltReason::InvalidHeader
        );
        assert_eq!(
            reason(vec![Header::new("id", Some(&[0xff]))]),
            DltReason::InvalidHeader
        );
        let foreign_name = Header {
            name: vec![0xff],
            value: None,
        };
        assert_eq!(
            reason(vec![Header::new("id", Some(ID)), foreign_name]),
            DltReason::InvalidHeader
        );
        let mut unreadable = record(vec![]);
        unreadable.unreadable_headers = true;
        assert_eq!(
            unreadable.message_id().unwrap_err().reason,
            DltReason::InvalidHeader
        );
    }

    #[test]
    fn the_last_header_of_a_name_wins() {
        let record = record(vec![
            Header::new("id", Some(b"1")),
            Header::new("id", Some(b"2")),
            Header::new("traceparent", None),
        ]);
        assert_eq!(record.header("id"), Some(Some(&b"2"[..])));
        assert_eq!(record.header("traceparent"), Some(None));
        assert_eq!(record.header("absent"), None);
    }
}

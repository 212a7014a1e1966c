//! From an outbox row to the Kafka record Debezium's Outbox Event Router
//! would produce for it (see docs/relay.md and debezium/): the same topic,
//! key, value bytes and headers, so consumers cannot tell the relays apart.

use service_support::kafka::is_valid_topic_name;
use service_support::telemetry::TraceContext;
use uuid::Uuid;

/// Debezium's `route.topic.replacement=${routedByValue}.eventos`.
pub const TOPIC_SUFFIX: &str = ".eventos";

/// One unpublished outbox row, as read by the relay.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: Uuid,
    pub aggregatetype: String,
    pub aggregateid: String,
    #[sqlx(rename = "type")]
    pub event_type: String,
    /// PostgreSQL's text form of the jsonb payload.
    pub payload: String,
    pub traceparent: Option<String>,
    /// Debezium's context column: `traceparent` (and `tracestate`) as Java
    /// Properties text. Preferred over `traceparent`, which rows written
    /// before it carry alone.
    pub tracingspancontext: Option<String>,
    pub seq: i64,
    pub attempts: i32,
}

/// The record to send, borrowing what it can from its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingRecord<'a> {
    pub topic: &'a str,
    pub key: &'a [u8],
    pub value: Vec<u8>,
    id: [u8; 36],
    event_type: &'a [u8],
    traceparent: Option<&'a [u8]>,
    tracestate: Option<&'a [u8]>,
}

impl OutgoingRecord<'_> {
    /// In Debezium's order: `id`, then the additional fields as configured.
    /// A NULL column gives a header with a null value. `tracestate` follows
    /// when the context has one.
    pub fn headers(&self) -> impl Iterator<Item = (&'static str, Option<&[u8]>)> {
        [
            ("id", Some(self.id.as_slice())),
            ("eventType", Some(self.event_type)),
            ("traceparent", self.traceparent),
        ]
        .into_iter()
        .chain(self.tracestate.map(|state| ("tracestate", Some(state))))
    }
}

/// Why a row cannot become a record at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("aggregatetype {0:?} does not make a valid Kafka topic name")]
    InvalidTopic(String),
}

/// The topic a row is routed to.
pub fn topic_for(aggregatetype: &str) -> Result<String, RecordError> {
    let topic = format!("{aggregatetype}{TOPIC_SUFFIX}");
    if is_valid_topic_name(&topic) && !aggregatetype.is_empty() {
        Ok(topic)
    } else {
        Err(RecordError::InvalidTopic(aggregatetype.to_owned()))
    }
}

/// [`topic_for`] once per run of rows of one aggregate type (a batch is
/// usually a single run), not once per row.
#[derive(Debug, Default)]
pub struct Router {
    last: Option<(String, Result<String, RecordError>)>,
}

impl Router {
    pub fn topic(&mut self, aggregatetype: &str) -> Result<&str, RecordError> {
        if self
            .last
            .as_ref()
            .is_some_and(|(routed, _)| routed != aggregatetype)
        {
            self.last = None;
        }
        let (_, topic) = self
            .last
            .get_or_insert_with(|| (aggregatetype.to_owned(), topic_for(aggregatetype)));
        topic.as_deref().map_err(Clone::clone)
    }
}

impl OutboxRow {
    /// The trace context the writer stored; an invalid one is ignored.
    pub fn stored_trace(&self) -> Option<TraceContext> {
        self.tracingspancontext
            .as_deref()
            .and_then(TraceContext::from_properties)
            .or_else(|| TraceContext::parse(self.traceparent.as_deref()?, None))
    }

    /// The record for this row, sent to `topic` (its [`topic_for`]).
    /// `producer` is the relay's producer span when traces are recorded:
    /// the record carries its context. Without one, the record is what
    /// Debezium without OpenTelemetry emits: the `traceparent` column
    /// copied as it is, no `tracestate`.
    pub fn to_record<'a>(
        &'a self,
        topic: &'a str,
        producer: Option<&'a TraceContext>,
    ) -> OutgoingRecord<'a> {
        let mut id = [0; 36];
        self.id.hyphenated().encode_lower(&mut id);
        // Debezium adds a configured header even when the column is NULL,
        // with a null value; so does the relay.
        let traceparent = match producer {
            Some(producer) => Some(producer.traceparent()),
            None => self.traceparent.as_deref(),
        };
        OutgoingRecord {
            topic,
            key: self.aggregateid.as_bytes(),
            value: compact_json(&self.payload).into_bytes(),
            id,
            event_type: self.event_type.as_bytes(),
            traceparent: traceparent.map(str::as_bytes),
            tracestate: producer
                .and_then(TraceContext::tracestate)
                .map(str::as_bytes),
        }
    }
}

/// Removes the insignificant whitespace PostgreSQL puts in jsonb's text form
/// (`{"a": 1, "b": [1, 2]}` becomes `{"a":1,"b":[1,2]}`), keeping key order
/// and every other byte, as Kafka Connect's JsonConverter writes it; `\u`
/// escapes get Jackson's upper-case hex digits.
///
/// Byte-identical to Debezium only for what the event schemas contain:
/// strings, integers, objects and non-empty arrays. Debezium rewrites
/// decimals as Java doubles and drops null fields and empty arrays
/// (docs/notes/debezium-outbox-record.md).
pub fn compact_json(text: &str) -> String {
    let mut compact = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    let mut unicode_digits = 0;
    for c in text.chars() {
        if in_string {
            if unicode_digits > 0 {
                unicode_digits -= 1;
                compact.push(c.to_ascii_uppercase());
                continue;
            }
            compact.push(c);
            if escaped {
                escaped = false;
                if c == 'u' {
                    unicode_digits = 4;
                }
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            compact.push(c);
        } else if !matches!(c, ' ' | '\n' | '\r' | '\t') {
            compact.push(c);
        }
    }
    compact
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row() -> OutboxRow {
        OutboxRow {
            id: Uuid::parse_str("0190f5d2-7c1e-7000-8000-00000000000a").unwrap(),
            aggregatetype: "pedido".into(),
            aggregateid: "0190f5d2-7c1e-7000-8000-000000000001".into(),
            event_type: "PedidoCriado".into(),
            payload: r#"{"itens": [{"sku": "ABC-1", "quantidade": 2}], "clienteId": "c 42"}"#
                .into(),
            traceparent: None,
            tracingspancontext: None,
            seq: 1,
            attempts: 0,
        }
    }

    fn headers(record: &OutgoingRecord<'_>) -> Vec<(&'static str, Option<Vec<u8>>)> {
        record
            .headers()
            .map(|(key, value)| (key, value.map(<[u8]>::to_vec)))
            .collect()
    }

    #[test]
    fn a_row_becomes_the_debezium_record() {
        let row = row();
        let topic = topic_for(&row.aggregatetype).unwrap();
        let record = row.to_record(&topic, None);
        assert_eq!(record.topic, "pedido.eventos");
        assert_eq!(record.key, b"0190f5d2-7c1e-7000-8000-000000000001");
        assert_eq!(
            String::from_utf8(record.value.clone()).unwrap(),
            r#"{"itens":[{"sku":"ABC-1","quantidade":2}],"clienteId":"c 42"}"#
        );
        assert_eq!(
            headers(&record),
            vec![
                ("id", Some(b"0190f5d2-7c1e-7000-8000-00000000000a".to_vec())),
                ("eventType", Some(b"PedidoCriado".to_vec())),
                ("traceparent", None),
            ]
        );
    }

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_trace_travels_as_headers_when_present() {
        let trace = TraceContext::parse(TRACEPARENT, Some("congo=t61rcWkgMzE")).unwrap();
        let row = row();
        let record = row.to_record("pedido.eventos", Some(&trace));
        assert_eq!(
            headers(&record)[2..],
            [
                ("traceparent", Some(TRACEPARENT.as_bytes().to_vec())),
                ("tracestate", Some(b"congo=t61rcWkgMzE".to_vec())),
            ]
        );
    }

    #[test]
    fn without_a_producer_span_the_traceparent_column_is_copied_as_debezium_does() {
        // Valid for the column's check, not for W3C: copied all the same.
        let odd = "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let row = OutboxRow {
            traceparent: Some(odd.into()),
            tracingspancontext: Some(format!("traceparent={TRACEPARENT}\ntracestate=a=b\n")),
            ..row()
        };
        let record = row.to_record("pedido.eventos", None);
        assert_eq!(
            headers(&record)[2..],
            [("traceparent", Some(odd.as_bytes().to_vec()))]
        );
    }

    #[test]
    fn the_context_column_wins_over_the_traceparent_column() {
        let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let both = OutboxRow {
            traceparent: Some(other.into()),
            tracingspancontext: Some(format!("traceparent={TRACEPARENT}\ntracestate=a=b\n")),
            ..row()
        };
        assert_eq!(
            both.stored_trace(),
            TraceContext::parse(TRACEPARENT, Some("a=b"))
        );
        let old = OutboxRow {
            traceparent: Some(other.into()),
            ..row()
        };
        assert_eq!(old.stored_trace(), TraceContext::parse(other, None));
        let broken = OutboxRow {
            traceparent: Some("garbage".into()),
            tracingspancontext: Some("garbage".into()),
            ..row()
        };
        assert_eq!(broken.stored_trace(), None);
    }

    #[test]
    fn an_aggregatetype_that_makes_no_topic_name_is_an_error() {
        let mut router = Router::default();
        for bad in ["", "pedido eventos", "pedido/x", "ç"] {
            assert_eq!(
                router.topic(bad),
                Err(RecordError::InvalidTopic(bad.into()))
            );
        }
    }

    #[test]
    fn the_router_follows_the_aggregate_type_from_row_to_row() {
        let mut router = Router::default();
        assert_eq!(router.topic("pedido"), Ok("pedido.eventos"));
        assert_eq!(router.topic("pedido"), Ok("pedido.eventos"));
        assert_eq!(router.topic("estoque"), Ok("estoque.eventos"));
        assert!(router.topic("a b").is_err());
        assert_eq!(router.topic("pedido"), Ok("pedido.eventos"));
    }

    #[test]
    fn unicode_escapes_get_upper_case_hex_digits() {
        assert_eq!(
            compact_json(r#"{"a": "x\u001fy\u00e9"}"#),
            r#"{"a":"x\u001Fy\u00E9"}"#
        );
    }

    #[test]
    fn compaction_keeps_whitespace_and_escapes_inside_strings() {
        assert_eq!(
            compact_json(r#"{"a b": "x \" y", "c": ["\\", "\\\" ", 1.5e3], "d": null}"#),
            r#"{"a b":"x \" y","c":["\\","\\\" ",1.5e3],"d":null}"#
        );
    }

    proptest! {
        #[test]
        fn compaction_preserves_the_json_value(value in arbitrary_json()) {
            let pretty = serde_json::to_string_pretty(&value).unwrap();
            let compact = compact_json(&pretty);
            prop_assert_eq!(&compact, &serde_json::to_string(&value).unwrap());
        }
    }

    fn arbitrary_json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            "\\PC{0,12}".prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
                prop::collection::btree_map("\\PC{0,6}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }
}

//! What arrives on `pedido.eventos`, and whether it can ever be processed.
//!
//! A record is parsed completely before any database work: everything that
//! makes it unprocessable whatever the retries is found here and sent to the
//! dead-letter topic at once.

use std::collections::HashSet;

use serde::Deserialize;
use uuid::Uuid;

/// The `consumidor` value in `mensagem_processada`.
pub const CONSUMER_NAME: &str = "estoque.reserva";
pub const EVENT_ORDER_CREATED: &str = "PedidoCriado";
const MAX_ITEMS: usize = 100;
const MAX_QUANTITY: i64 = 10_000;

/// Why a record went to the dead-letter topic (header `dlt-reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DltReason {
    InvalidJson,
    MissingHeader,
    InvalidHeader,
    UnknownEventType,
    SchemaViolation,
    RetriesExhausted,
}

impl DltReason {
    pub const ALL: [DltReason; 6] = [
        Self::InvalidJson,
        Self::MissingHeader,
        Self::InvalidHeader,
        Self::UnknownEventType,
        Self::SchemaViolation,
        Self::RetriesExhausted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidJson => "invalid-json",
            Self::MissingHeader => "missing-header",
            Self::InvalidHeader => "invalid-header",
            Self::UnknownEventType => "unknown-event-type",
            Self::SchemaViolation => "schema-violation",
            Self::RetriesExhausted => "retries-exhausted",
        }
    }

    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|reason| reason.as_str() == value)
    }

    /// The error type named in `kafka_dlt-exception-fqcn`.
    pub fn error_type(self) -> &'static str {
        match self {
            Self::RetriesExhausted => "inventory_service::processor::TransientFailure",
            _ => "inventory_service::event::InvalidMessage",
        }
    }
}

/// A record that no retry can make processable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason:?}: {detail}")]
pub struct InvalidMessage {
    pub reason: DltReason,
    pub detail: String,
}

fn invalid(reason: DltReason, detail: impl Into<String>) -> InvalidMessage {
    InvalidMessage {
        reason,
        detail: detail.into(),
    }
}

/// The parts of a Kafka record the parser looks at.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    /// In record order; a later header of the same name wins, as with
    /// Kafka's `lastHeader`.
    pub headers: &'a [(String, Option<Vec<u8>>)],
}

impl RecordView<'_> {
    fn header(&self, name: &str) -> Option<Option<&[u8]>> {
        self.headers
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_deref())
    }

    fn text_header(&self, name: &str) -> Result<&str, InvalidMessage> {
        match self.header(name) {
            None | Some(None) => Err(invalid(
                DltReason::MissingHeader,
                format!("header {name} is missing"),
            )),
            Some(Some(bytes)) => std::str::from_utf8(bytes).map_err(|_| {
                invalid(
                    DltReason::InvalidHeader,
                    format!("header {name} is not UTF-8"),
                )
            }),
        }
    }
}

/// The message id from the `id` header, never from the broker position.
pub fn message_id(record: &RecordView<'_>) -> Result<Uuid, InvalidMessage> {
    let text = record.text_header("id")?;
    Uuid::try_parse(text).map_err(|_| {
        invalid(
            DltReason::InvalidHeader,
            format!("header id is not a UUID: {text:?}"),
        )
    })
}

/// A validated `PedidoCriado`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderPlaced {
    pub message_id: Uuid,
    pub order_id: Uuid,
    pub customer_id: String,
    /// `(sku, quantity)` in event order, each sku once.
    pub items: Vec<(String, i32)>,
}

/// The event as it travels; unknown fields are ignored, so producers can add
/// fields without breaking this consumer.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PedidoCriado {
    pedido_id: Uuid,
    cliente_id: String,
    itens: Vec<ItemPedido>,
    criado_em: String,
}

#[derive(Debug, Deserialize)]
struct ItemPedido {
    sku: String,
    quantidade: i64,
}

fn is_valid_sku(sku: &str) -> bool {
    (1..=64).contains(&sku.len())
        && sku
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-')
}

/// Parses and validates a record, in the order the failure classes are
/// checked: headers, event type, JSON, schema.
pub fn parse(record: &RecordView<'_>) -> Result<OrderPlaced, InvalidMessage> {
    let message_id = message_id(record)?;
    let event_type = record.text_header("eventType")?;
    if event_type != EVENT_ORDER_CREATED {
        return Err(invalid(
            DltReason::UnknownEventType,
            format!("unknown eventType {event_type:?}"),
        ));
    }
    let value = record
        .value
        .ok_or_else(|| invalid(DltReason::InvalidJson, "the record has no value"))?;
    let json: serde_json::Value = serde_json::from_slice(value)
        .map_err(|e| invalid(DltReason::InvalidJson, format!("value is not JSON: {e}")))?;
    let event: PedidoCriado = serde_json::from_value(json).map_err(|e| {
        invalid(
            DltReason::SchemaViolation,
            format!("not a PedidoCriado: {e}"),
        )
    })?;

    let schema = |detail: String| invalid(DltReason::SchemaViolation, detail);
    if let Some(key) = record.key
        && key != event.pedido_id.to_string().as_bytes()
    {
        return Err(schema(
            "the record key is not the event's pedidoId".to_owned(),
        ));
    }
    if event.cliente_id.trim().is_empty() || event.cliente_id.chars().count() > 128 {
        return Err(schema("clienteId must be 1 to 128 characters".to_owned()));
    }
    if time::OffsetDateTime::parse(
        &event.criado_em,
        &time::format_description::well_known::Rfc3339,
    )
    .is_err()
    {
        return Err(schema(format!(
            "criadoEm is not an RFC 3339 timestamp: {:?}",
            event.criado_em
        )));
    }
    if event.itens.is_empty() || event.itens.len() > MAX_ITEMS {
        return Err(schema(format!("itens must hold 1 to {MAX_ITEMS} items")));
    }
    let mut seen = HashSet::new();
    let mut items = Vec::with_capacity(event.itens.len());
    for (index, item) in event.itens.into_iter().enumerate() {
        if !is_valid_sku(&item.sku) {
            return Err(schema(format!(
                "itens[{index}].sku {:?} is not a valid sku",
                item.sku
            )));
        }
        if !(1..=MAX_QUANTITY).contains(&item.quantidade) {
            return Err(schema(format!(
                "itens[{index}].quantidade must be 1 to {MAX_QUANTITY}"
            )));
        }
        if !seen.insert(item.sku.clone()) {
            return Err(schema(format!(
                "itens[{index}].sku {} appears twice",
                item.sku
            )));
        }
        items.push((item.sku, i32::try_from(item.quantidade).unwrap_or(i32::MAX)));
    }
    Ok(OrderPlaced {
        message_id,
        order_id: event.pedido_id,
        customer_id: event.cliente_id,
        items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str = "0190f5d2-7c1e-7000-8000-000000000042";
    const ID: &str = "0190f5d2-7c1e-7000-8000-0000000000a1";

    fn headers(pairs: &[(&str, Option<&str>)]) -> Vec<(String, Option<Vec<u8>>)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.map(|v| v.as_bytes().to_vec())))
            .collect()
    }

    fn value(items: &str) -> String {
        format!(
            r#"{{"pedidoId":"{ORDER}","clienteId":"c-42","itens":{items},"criadoEm":"2026-12-02T15:00:00Z"}}"#
        )
    }

    fn parse_with(
        headers: &[(String, Option<Vec<u8>>)],
        value: Option<&str>,
    ) -> Result<OrderPlaced, InvalidMessage> {
        parse(&RecordView {
            key: Some(ORDER.as_bytes()),
            value: value.map(str::as_bytes),
            headers,
        })
    }

    fn reason(result: Result<OrderPlaced, InvalidMessage>) -> DltReason {
        result.expect_err("the record is invalid").reason
    }

    #[test]
    fn a_valid_event_is_parsed() {
        let h = headers(&[
            ("id", Some(ID)),
            ("eventType", Some("PedidoCriado")),
            ("traceparent", None),
        ]);
        let order = parse_with(&h, Some(&value(r#"[{"sku":"ABC-1","quantidade":2}]"#))).unwrap();
        assert_eq!(order.message_id.to_string(), ID);
        assert_eq!(order.order_id.to_string(), ORDER);
        assert_eq!(order.items, vec![("ABC-1".to_owned(), 2)]);
    }

    #[test]
    fn unknown_fields_are_tolerated() {
        let h = headers(&[("id", Some(ID)), ("eventType", Some("PedidoCriado"))]);
        let v = value(r#"[{"sku":"A","quantidade":1,"preco":3}]"#)
            .replace("}]", "}],\"canal\":\"web\"");
        assert!(parse_with(&h, Some(&v)).is_ok());
    }

    type Headers = Vec<(String, Option<Vec<u8>>)>;

    #[test]
    fn each_failure_class_is_recognised() {
        let good = value(r#"[{"sku":"A","quantidade":1}]"#);
        let ok_headers = headers(&[("id", Some(ID)), ("eventType", Some("PedidoCriado"))]);
        let cases: Vec<(Headers, Option<String>, DltReason)> = vec![
            (
                headers(&[("eventType", Some("PedidoCriado"))]),
                Some(good.clone()),
                DltReason::MissingHeader,
            ),
            (
                headers(&[("id", None), ("eventType", Some("PedidoCriado"))]),
                Some(good.clone()),
                DltReason::MissingHeader,
            ),
            (
                headers(&[("id", Some("42")), ("eventType", Some("PedidoCriado"))]),
                Some(good.clone()),
                DltReason::InvalidHeader,
            ),
            (
                headers(&[("id", Some(ID))]),
                Some(good.clone()),
                DltReason::MissingHeader,
            ),
            (
                headers(&[("id", Some(ID)), ("eventType", Some("PedidoCancelado"))]),
                Some(good.clone()),
                DltReason::UnknownEventType,
            ),
            (
                ok_headers.clone(),
                Some("{not json".to_owned()),
                DltReason::InvalidJson,
            ),
            (ok_headers.clone(), None, DltReason::InvalidJson),
            (
                ok_headers.clone(),
                Some(r#"{"pedidoId":"x"}"#.to_owned()),
                DltReason::SchemaViolation,
            ),
            (
                ok_headers.clone(),
                Some(value("[]")),
                DltReason::SchemaViolation,
            ),
            (
                ok_headers.clone(),
                Some(value(r#"[{"sku":"a","quantidade":1}]"#)),
                DltReason::SchemaViolation,
            ),
            (
                ok_headers.clone(),
                Some(value(r#"[{"sku":"A","quantidade":0}]"#)),
                DltReason::SchemaViolation,
            ),
            (
                ok_headers.clone(),
                Some(value(
                    r#"[{"sku":"A","quantidade":1},{"sku":"A","quantidade":2}]"#,
                )),
                DltReason::SchemaViolation,
            ),
            (
                ok_headers.clone(),
                Some(good.replace("2026-12-02T15:00:00Z", "yesterday")),
                DltReason::SchemaViolation,
            ),
        ];
        for (index, (h, v, expected)) in cases.into_iter().enumerate() {
            assert_eq!(
                reason(parse_with(&h, v.as_deref())),
                expected,
                "case {index}"
            );
        }
    }

    #[test]
    fn a_key_that_is_not_the_order_id_is_a_schema_violation() {
        let h = headers(&[("id", Some(ID)), ("eventType", Some("PedidoCriado"))]);
        let v = value(r#"[{"sku":"A","quantidade":1}]"#);
        let result = parse(&RecordView {
            key: Some(b"another-order"),
            value: Some(v.as_bytes()),
            headers: &h,
        });
        assert_eq!(reason(result), DltReason::SchemaViolation);
    }

    #[test]
    fn reasons_round_trip_through_their_names() {
        for reason in DltReason::ALL {
            assert_eq!(DltReason::parse(reason.as_str()), Some(reason));
        }
    }
}

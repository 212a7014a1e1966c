//! What arrives on `pedido.eventos`, and whether it can ever be processed:
//! the events `PedidoCriado` and `PedidoCancelado`, and their domain types.
//!
//! A record is parsed completely before any database work: everything that
//! makes it unprocessable whatever the retries is found here and sent to the
//! dead-letter topic at once. Text from the record quoted in an error is
//! escaped and cut ([`quote`]): the error becomes a DLT header.

use std::collections::HashSet;

use serde::Deserialize;
use uuid::Uuid;

use idempotent_consumer::{DltReason, InvalidMessage, Record, quote};
pub use service_support::sku::{SKU_PATTERN, Sku};

/// The `consumidor` value in `mensagem_processada`.
pub const CONSUMER_NAME: &str = service_support::consumers::INVENTORY.name;
pub const EVENT_ORDER_CREATED: &str = "PedidoCriado";
pub const EVENT_ORDER_CANCELLED: &str = "PedidoCancelado";
const MAX_ITEMS: usize = 100;
pub const MAX_QUANTITY: i64 = 10_000;

/// A validated event of `pedido.eventos`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrderEvent {
    Placed(OrderPlaced),
    Cancelled(OrderCancelled),
}

/// A validated `PedidoCancelado`: the order's reservation, if any, is to be
/// released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderCancelled {
    pub order_id: Uuid,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PedidoCancelado {
    pedido_id: Uuid,
}

/// A validated `PedidoCriado`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderPlaced {
    pub order_id: Uuid,
    pub customer_id: String,
    /// `(sku, quantity)` in event order, each sku once; quantities 1 to
    /// [`MAX_QUANTITY`].
    pub items: Vec<(Sku, i32)>,
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

fn invalid(reason: DltReason, detail: impl Into<String>) -> InvalidMessage {
    InvalidMessage::new(reason, detail)
}

/// Parses and validates a record, in the order the failure classes are
/// checked: event type, JSON, schema (the consumer checked the headers'
/// names and the `id` header before).
pub fn parse(record: &Record) -> Result<OrderEvent, InvalidMessage> {
    let event_type = record.required_text_header("eventType")?;
    match event_type {
        EVENT_ORDER_CREATED => parse_created(record).map(OrderEvent::Placed),
        EVENT_ORDER_CANCELLED => {
            let event: PedidoCancelado = json_of(record, EVENT_ORDER_CANCELLED)?;
            check_key(record, event.pedido_id)?;
            Ok(OrderEvent::Cancelled(OrderCancelled {
                order_id: event.pedido_id,
            }))
        }
        other => Err(invalid(
            DltReason::UnknownEventType,
            format!("unknown eventType {}", quote(other)),
        )),
    }
}

/// The record's value as the event `name`: `invalid-json` when it is not
/// JSON, `schema-violation` when it is not that event.
fn json_of<T: serde::de::DeserializeOwned>(
    record: &Record,
    name: &str,
) -> Result<T, InvalidMessage> {
    let value = record
        .value
        .as_deref()
        .ok_or_else(|| invalid(DltReason::InvalidJson, "the record has no value"))?;
    let json: serde_json::Value = serde_json::from_slice(value)
        .map_err(|e| invalid(DltReason::InvalidJson, format!("value is not JSON: {e}")))?;
    serde_json::from_value(json).map_err(|e| {
        invalid(
            DltReason::SchemaViolation,
            format!("not a {name}: {}", quote(&e.to_string())),
        )
    })
}

/// The record key, when there is one, is the event's order id.
fn check_key(record: &Record, order_id: Uuid) -> Result<(), InvalidMessage> {
    match record.key.as_deref() {
        Some(key) if key != order_id.to_string().as_bytes() => Err(invalid(
            DltReason::SchemaViolation,
            "the record key is not the event's pedidoId",
        )),
        _ => Ok(()),
    }
}

fn parse_created(record: &Record) -> Result<OrderPlaced, InvalidMessage> {
    let event: PedidoCriado = json_of(record, EVENT_ORDER_CREATED)?;
    let schema = |detail: String| invalid(DltReason::SchemaViolation, detail);
    check_key(record, event.pedido_id)?;
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
            "criadoEm is not an RFC 3339 timestamp: {}",
            quote(&event.criado_em)
        )));
    }
    if event.itens.is_empty() || event.itens.len() > MAX_ITEMS {
        return Err(schema(format!("itens must hold 1 to {MAX_ITEMS} items")));
    }
    let mut seen = HashSet::new();
    let mut items = Vec::with_capacity(event.itens.len());
    for (index, item) in event.itens.into_iter().enumerate() {
        let Ok(sku) = Sku::parse(&item.sku) else {
            return Err(schema(format!(
                "itens[{index}].sku {} does not match {SKU_PATTERN}",
                quote(&item.sku)
            )));
        };
        let quantity = i32::try_from(item.quantidade)
            .ok()
            .filter(|q| (1..=MAX_QUANTITY).contains(&i64::from(*q)))
            .ok_or_else(|| {
                schema(format!(
                    "itens[{index}].quantidade must be 1 to {MAX_QUANTITY}"
                ))
            })?;
        if !seen.insert(sku.clone()) {
            return Err(schema(format!("itens[{index}].sku {sku} appears twice")));
        }
        items.push((sku, quantity));
    }
    Ok(OrderPlaced {
        order_id: event.pedido_id,
        customer_id: event.cliente_id,
        items,
    })
}

#[cfg(test)]
mod tests {
    use rdkafka::Timestamp;

    use super::*;
    use idempotent_consumer::Header;

    const ORDER: &str = "0190f5d2-7c1e-7000-8000-000000000042";
    const ID: &str = "0190f5d2-7c1e-7000-8000-0000000000a1";

    fn headers(pairs: &[(&str, Option<&str>)]) -> Vec<Header> {
        pairs
            .iter()
            .map(|(k, v)| Header::new(k, v.map(str::as_bytes)))
            .collect()
    }

    fn value(items: &str) -> String {
        format!(
            r#"{{"pedidoId":"{ORDER}","clienteId":"c-42","itens":{items},"criadoEm":"2026-12-02T15:00:00Z"}}"#
        )
    }

    fn record(key: &str, headers: Vec<Header>, value: Option<&str>) -> Record {
        Record {
            topic: "pedido.eventos".into(),
            partition: 0,
            offset: 0,
            timestamp: Timestamp::NotAvailable,
            key: Some(key.as_bytes().to_vec()),
            value: value.map(|v| v.as_bytes().to_vec()),
            headers,
            unreadable_headers: false,
        }
    }

    fn parse_with(headers: Vec<Header>, value: Option<&str>) -> Result<OrderEvent, InvalidMessage> {
        parse(&record(ORDER, headers, value))
    }

    fn placed(event: OrderEvent) -> OrderPlaced {
        match event {
            OrderEvent::Placed(order) => order,
            other => panic!("not a PedidoCriado: {other:?}"),
        }
    }

    fn reason(result: Result<OrderEvent, InvalidMessage>) -> DltReason {
        result.expect_err("the record is invalid").reason
    }

    fn ok_headers() -> Vec<Header> {
        headers(&[("id", Some(ID)), ("eventType", Some("PedidoCriado"))])
    }

    #[test]
    fn a_valid_event_is_parsed() {
        let h = headers(&[
            ("id", Some(ID)),
            ("eventType", Some("PedidoCriado")),
            ("traceparent", None),
        ]);
        let order =
            placed(parse_with(h, Some(&value(r#"[{"sku":"ABC-1","quantidade":2}]"#))).unwrap());
        assert_eq!(order.order_id.to_string(), ORDER);
        assert_eq!(order.items, vec![(Sku::parse("ABC-1").unwrap(), 2)]);
    }

    #[test]
    fn unknown_fields_are_tolerated() {
        let v = value(r#"[{"sku":"A","quantidade":1,"preco":3}]"#)
            .replace("}]", "}],\"canal\":\"web\"");
        assert!(parse_with(ok_headers(), Some(&v)).is_ok());
    }

    #[test]
    fn each_failure_class_is_recognised() {
        let good = value(r#"[{"sku":"A","quantidade":1}]"#);
        let cases: Vec<(Vec<Header>, Option<String>, DltReason)> = vec![
            (
                headers(&[("id", Some(ID))]),
                Some(good.clone()),
                DltReason::MissingHeader,
            ),
            (
                headers(&[("id", Some(ID)), ("eventType", None)]),
                Some(good.clone()),
                DltReason::MissingHeader,
            ),
            (
                headers(&[("id", Some(ID)), ("eventType", Some("PedidoDevolvido"))]),
                Some(good.clone()),
                DltReason::UnknownEventType,
            ),
            (
                ok_headers(),
                Some("{not json".to_owned()),
                DltReason::InvalidJson,
            ),
            (ok_headers(), None, DltReason::InvalidJson),
            (
                ok_headers(),
                Some(r#"{"pedidoId":"x"}"#.to_owned()),
                DltReason::SchemaViolation,
            ),
            (ok_headers(), Some(value("[]")), DltReason::SchemaViolation),
            (
                ok_headers(),
                Some(value(r#"[{"sku":"a","quantidade":1}]"#)),
                DltReason::SchemaViolation,
            ),
            (
                ok_headers(),
                Some(value(r#"[{"sku":"A","quantidade":0}]"#)),
                DltReason::SchemaViolation,
            ),
            (
                ok_headers(),
                Some(value(r#"[{"sku":"A","quantidade":4294967297}]"#)),
                DltReason::SchemaViolation,
            ),
            (
                ok_headers(),
                Some(value(
                    r#"[{"sku":"A","quantidade":1},{"sku":"A","quantidade":2}]"#,
                )),
                DltReason::SchemaViolation,
            ),
            (
                ok_headers(),
                Some(good.replace("2026-12-02T15:00:00Z", "yesterday")),
                DltReason::SchemaViolation,
            ),
        ];
        for (index, (h, v, expected)) in cases.into_iter().enumerate() {
            assert_eq!(
                reason(parse_with(h, v.as_deref())),
                expected,
                "case {index}"
            );
        }
    }

    #[test]
    fn a_cancellation_names_its_order() {
        let h = headers(&[("id", Some(ID)), ("eventType", Some("PedidoCancelado"))]);
        let cancelled = parse_with(
            h.clone(),
            Some(&format!(
                r#"{{"pedidoId":"{ORDER}","canceladoEm":"2026-12-05T10:00:00Z"}}"#
            )),
        )
        .unwrap();
        assert_eq!(
            cancelled,
            OrderEvent::Cancelled(OrderCancelled {
                order_id: ORDER.parse().unwrap()
            })
        );
        assert_eq!(
            reason(parse_with(h.clone(), Some("{}"))),
            DltReason::SchemaViolation
        );
        let other = r#"{"pedidoId":"0190f5d2-7c1e-7000-8000-000000000043"}"#;
        assert_eq!(
            reason(parse_with(h, Some(other))),
            DltReason::SchemaViolation
        );
    }

    #[test]
    fn a_key_that_is_not_the_order_id_is_a_schema_violation() {
        let v = value(r#"[{"sku":"A","quantidade":1}]"#);
        let result = parse(&record("another-order", ok_headers(), Some(&v)));
        assert_eq!(reason(result), DltReason::SchemaViolation);
    }

    #[test]
    fn sender_text_in_an_error_is_escaped_and_bounded() {
        let huge_sku = value(&format!(
            r#"[{{"sku":"{}","quantidade":1}}]"#,
            "X".repeat(900_000)
        ));
        let detail = parse_with(ok_headers(), Some(&huge_sku))
            .unwrap_err()
            .detail;
        assert!(detail.len() < 200, "{} bytes", detail.len());
        let huge_type = headers(&[
            ("id", Some(ID)),
            ("eventType", Some(&"T\n".repeat(300_000))),
        ]);
        let detail = parse_with(huge_type, Some(&value(r#"[{"sku":"A","quantidade":1}]"#)))
            .unwrap_err()
            .detail;
        assert!(detail.len() < 200, "{} bytes", detail.len());
        assert!(detail.contains("T\\nT"), "escaped: {detail}");
    }
}

//! What arrives on `estoque.eventos`: the inventory's outcome for an order.
//! Parsed completely before any database work; whatever no retry can fix
//! goes to the DLT at once, with its reason.

use serde::Deserialize;
use uuid::Uuid;

use idempotent_consumer::{DltReason, InvalidMessage, Record, quote};

pub const EVENT_RESERVED: &str = "EstoqueReservado";
pub const EVENT_REJECTED: &str = "EstoqueRejeitado";
pub const EVENT_RELEASED: &str = "EstoqueLiberado";
/// The longest rejection reason kept (the column's limit).
const MAX_REASON: usize = 1_000;

/// A validated outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockOutcome {
    pub order_id: Uuid,
    pub kind: OutcomeKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutcomeKind {
    /// Every item reserved.
    Reserved,
    /// Nothing reserved, and why.
    Rejected { reason: String },
    /// The cancelled order's reservation went back to stock.
    Released,
}

/// The fields this consumer reads; the others are ignored, so the inventory
/// can add fields without breaking it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Payload {
    pedido_id: Uuid,
    motivo: Option<String>,
}

fn invalid(reason: DltReason, detail: impl Into<String>) -> InvalidMessage {
    InvalidMessage::new(reason, detail)
}

/// Parses and validates a record: event type, JSON, schema.
pub fn parse(record: &Record) -> Result<StockOutcome, InvalidMessage> {
    let event_type = record.required_text_header("eventType")?;
    let rejected = match event_type {
        EVENT_RESERVED | EVENT_RELEASED => false,
        EVENT_REJECTED => true,
        other => {
            return Err(invalid(
                DltReason::UnknownEventType,
                format!("unknown eventType {}", quote(other)),
            ));
        }
    };
    let value = record
        .value
        .as_deref()
        .ok_or_else(|| invalid(DltReason::InvalidJson, "the record has no value"))?;
    let json: serde_json::Value = serde_json::from_slice(value)
        .map_err(|e| invalid(DltReason::InvalidJson, format!("value is not JSON: {e}")))?;
    let payload: Payload = serde_json::from_value(json).map_err(|e| {
        invalid(
            DltReason::SchemaViolation,
            format!("not an {event_type}: {}", quote(&e.to_string())),
        )
    })?;
    let schema = |detail: &str| invalid(DltReason::SchemaViolation, detail);
    if let Some(key) = record.key.as_deref()
        && key != payload.pedido_id.to_string().as_bytes()
    {
        return Err(schema("the record key is not the event's pedidoId"));
    }
    let kind = if rejected {
        match payload.motivo {
            Some(reason) if !reason.trim().is_empty() && reason.chars().count() <= MAX_REASON => {
                OutcomeKind::Rejected { reason }
            }
            _ => {
                return Err(schema(
                    "motivo must be 1 to 1000 characters in an EstoqueRejeitado",
                ));
            }
        }
    } else if event_type == EVENT_RELEASED {
        OutcomeKind::Released
    } else {
        OutcomeKind::Reserved
    };
    Ok(StockOutcome {
        order_id: payload.pedido_id,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use idempotent_consumer::Header;
    use rdkafka::Timestamp;

    use super::*;

    const ORDER: &str = "0190f5d2-7c1e-7000-8000-000000000042";

    fn record(event_type: Option<&str>, value: Option<&str>) -> Record {
        let mut headers = vec![Header::new(
            "id",
            Some(b"0190f5d2-7c1e-7000-8000-0000000000a1"),
        )];
        if let Some(event_type) = event_type {
            headers.push(Header::new("eventType", Some(event_type.as_bytes())));
        }
        Record {
            topic: "estoque.eventos".into(),
            partition: 0,
            offset: 0,
            timestamp: Timestamp::NotAvailable,
            key: Some(ORDER.as_bytes().to_vec()),
            value: value.map(|v| v.as_bytes().to_vec()),
            headers,
            unreadable_headers: false,
        }
    }

    fn reason(event_type: Option<&str>, value: Option<&str>) -> DltReason {
        parse(&record(event_type, value))
            .expect_err("the record is invalid")
            .reason
    }

    #[test]
    fn both_outcomes_are_read() {
        let reserved = parse(&record(
            Some(EVENT_RESERVED),
            Some(&format!(
                r#"{{"pedidoId":"{ORDER}","itens":[],"reservadoEm":"x"}}"#
            )),
        ))
        .unwrap();
        assert_eq!(reserved.kind, OutcomeKind::Reserved);
        assert_eq!(reserved.order_id.to_string(), ORDER);
        let rejected = parse(&record(
            Some(EVENT_REJECTED),
            Some(&format!(
                r#"{{"pedidoId":"{ORDER}","motivo":"unknown sku X"}}"#
            )),
        ))
        .unwrap();
        assert_eq!(
            rejected.kind,
            OutcomeKind::Rejected {
                reason: "unknown sku X".into()
            }
        );
    }

    #[test]
    fn each_failure_class_is_recognised() {
        let ok = format!(r#"{{"pedidoId":"{ORDER}"}}"#);
        assert_eq!(reason(None, Some(&ok)), DltReason::MissingHeader);
        assert_eq!(
            reason(Some("PedidoCriado"), Some(&ok)),
            DltReason::UnknownEventType
        );
        assert_eq!(
            reason(Some(EVENT_RESERVED), Some("{")),
            DltReason::InvalidJson
        );
        assert_eq!(reason(Some(EVENT_RESERVED), None), DltReason::InvalidJson);
        assert_eq!(
            reason(Some(EVENT_RESERVED), Some(r#"{"pedidoId":"nope"}"#)),
            DltReason::SchemaViolation
        );
        assert_eq!(
            reason(Some(EVENT_REJECTED), Some(&ok)),
            DltReason::SchemaViolation
        );
        let blank = format!(r#"{{"pedidoId":"{ORDER}","motivo":"  "}}"#);
        assert_eq!(
            reason(Some(EVENT_REJECTED), Some(&blank)),
            DltReason::SchemaViolation
        );
        let other = r#"{"pedidoId":"0190f5d2-7c1e-7000-8000-000000000043"}"#;
        assert_eq!(
            reason(Some(EVENT_RESERVED), Some(other)),
            DltReason::SchemaViolation
        );
    }
}

//! What the inventory tells the world on `estoque.eventos`: each outcome as
//! an outbox row in the inventory database, written in the transaction that
//! decides it (never a direct call to the order service).
//!
//! Key: the order id, so every event of one order keeps its order on one
//! partition. The payload is the contract with the order service's
//! `pedido.status` consumer (docs/inventory-service.md).

use outbox::{OutboxMessage, TraceContext};
use serde_json::json;
use service_support::telemetry;
use service_support::timestamps::rfc3339;
use time::OffsetDateTime;
use uuid::Uuid;

use idempotent_consumer::Claimed;

pub const AGGREGATE_TYPE: &str = service_support::consumers::ORDER_STATUS.aggregate_type;
pub const EVENT_RESERVED: &str = "EstoqueReservado";
pub const EVENT_REJECTED: &str = "EstoqueRejeitado";
pub const EVENT_RELEASED: &str = "EstoqueLiberado";

fn now() -> String {
    rfc3339(OffsetDateTime::now_utc())
}

/// An event continues the trace of the record that caused it, from that
/// record's processing span (its headers' context when tracing is off).
fn trace_of<M>(cause: &Claimed<'_, M>) -> Option<TraceContext> {
    telemetry::outgoing(cause.span, cause.record.trace_context())
}

fn items_json<'a>(items: impl Iterator<Item = (&'a str, i32)>) -> serde_json::Value {
    items
        .map(|(sku, quantity)| json!({"sku": sku, "quantidade": quantity}))
        .collect()
}

/// Every item of the order is reserved.
pub fn reserved<'a, M>(
    order_id: Uuid,
    items: impl Iterator<Item = (&'a str, i32)>,
    cause: &Claimed<'_, M>,
) -> OutboxMessage {
    OutboxMessage::new(
        AGGREGATE_TYPE,
        order_id.to_string(),
        EVENT_RESERVED,
        json!({"pedidoId": order_id, "itens": items_json(items), "reservadoEm": now()}),
        trace_of(cause),
    )
}

/// Nothing is reserved, and why.
pub fn rejected<M>(order_id: Uuid, reason: &str, cause: &Claimed<'_, M>) -> OutboxMessage {
    OutboxMessage::new(
        AGGREGATE_TYPE,
        order_id.to_string(),
        EVENT_REJECTED,
        json!({"pedidoId": order_id, "motivo": reason, "rejeitadoEm": now()}),
        trace_of(cause),
    )
}

/// A cancelled order's reservation is released: its items are back in stock.
pub fn released<'a, M>(
    order_id: Uuid,
    items: impl Iterator<Item = (&'a str, i32)>,
    cause: &Claimed<'_, M>,
) -> OutboxMessage {
    OutboxMessage::new(
        AGGREGATE_TYPE,
        order_id.to_string(),
        EVENT_RELEASED,
        json!({"pedidoId": order_id, "itens": items_json(items), "liberadoEm": now()}),
        trace_of(cause),
    )
}

//! The order's events as outbox rows (the `outbox` crate writes them), each
//! in the same transaction as the change it announces.

use outbox::{OutboxMessage, TraceContext};
use serde::Serialize;
use service_support::timestamps::rfc3339;
use uuid::Uuid;

use crate::domain::OrderId;
use crate::orders::Order;

pub const AGGREGATE_TYPE_ORDER: &str = service_support::consumers::INVENTORY.aggregate_type;
pub const EVENT_ORDER_CREATED: &str = "PedidoCriado";
pub const EVENT_ORDER_CANCELLED: &str = "PedidoCancelado";

/// The `PedidoCriado` event; wire names follow the domain language.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PedidoCriado {
    pub pedido_id: Uuid,
    pub cliente_id: String,
    pub itens: Vec<ItemPedido>,
    /// RFC 3339, UTC, the order's own `created_at`.
    pub criado_em: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ItemPedido {
    pub sku: String,
    pub quantidade: i32,
}

impl PedidoCriado {
    pub fn of(order: &Order) -> Self {
        Self {
            pedido_id: order.id.as_uuid(),
            cliente_id: order.customer_id.clone(),
            itens: order
                .items
                .iter()
                .map(|(sku, quantity)| ItemPedido {
                    sku: sku.clone(),
                    quantidade: *quantity,
                })
                .collect(),
            criado_em: rfc3339(order.created_at),
        }
    }
}

/// The outbox row announcing that `order_id` was cancelled. Same aggregate,
/// same key: it follows the order's `PedidoCriado` on its partition.
pub fn order_cancelled(order_id: OrderId, trace: Option<TraceContext>) -> OutboxMessage {
    let now = time::OffsetDateTime::now_utc();
    OutboxMessage::new(
        AGGREGATE_TYPE_ORDER,
        order_id.to_string(),
        EVENT_ORDER_CANCELLED,
        serde_json::json!({
            "pedidoId": order_id.as_uuid(),
            "canceladoEm": rfc3339(now),
        }),
        trace,
    )
}

/// The outbox row announcing `order`.
pub fn order_created(
    order: &Order,
    trace: Option<TraceContext>,
) -> Result<OutboxMessage, serde_json::Error> {
    Ok(OutboxMessage::new(
        AGGREGATE_TYPE_ORDER,
        order.id.to_string(),
        EVENT_ORDER_CREATED,
        serde_json::to_value(PedidoCriado::of(order))?,
        trace,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::OrderId;
    use time::macros::datetime;

    #[test]
    fn pedido_criado_has_the_contract_field_names_and_values() {
        let id = OrderId::new();
        let order = Order {
            id,
            customer_id: "c-42".into(),
            status: crate::status::OrderStatus::Pending,
            status_reason: None,
            items: vec![("ABC-1".into(), 2)],
            created_at: datetime!(2026-12-02 15:00:00 UTC),
            history: Vec::new(),
        };
        let payload = serde_json::to_value(PedidoCriado::of(&order)).unwrap();
        assert_eq!(
            payload,
            serde_json::json!({
                "pedidoId": id.to_string(),
                "clienteId": "c-42",
                "itens": [{"sku": "ABC-1", "quantidade": 2}],
                "criadoEm": "2026-12-02T15:00:00Z",
            })
        );
    }
}

//! The transactional outbox: the event that tells the world an order exists,
//! written in the same transaction as the order.
//!
//! The row format is the contract with the relay and with Debezium's Outbox
//! Event Router: `aggregatetype` routes to the topic `<aggregatetype>.eventos`,
//! `aggregateid` becomes the record key, `type` the `eventType` header and
//! `payload` the record value, unchanged.

use serde::Serialize;
use sqlx::types::Json;
use sqlx::{Postgres, Transaction};
use time::format_description::well_known::Rfc3339;
use uuid::Uuid;

use crate::domain::TraceParent;
use crate::orders::Order;

pub const AGGREGATE_TYPE_ORDER: &str = "pedido";
pub const EVENT_ORDER_CREATED: &str = "PedidoCriado";

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
            criado_em: order
                .created_at
                .format(&Rfc3339)
                .unwrap_or_else(|_| order.created_at.to_string()),
        }
    }
}

/// One outbox row to write.
#[derive(Debug, Clone)]
pub struct OutboxMessage {
    /// The message id: the consumer deduplicates on it.
    pub id: Uuid,
    pub aggregate_type: &'static str,
    pub aggregate_id: String,
    pub event_type: &'static str,
    pub payload: serde_json::Value,
    pub traceparent: Option<TraceParent>,
}

impl OutboxMessage {
    pub fn order_created(
        order: &Order,
        traceparent: Option<TraceParent>,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self {
            id: Uuid::now_v7(),
            aggregate_type: AGGREGATE_TYPE_ORDER,
            aggregate_id: order.id.to_string(),
            event_type: EVENT_ORDER_CREATED,
            payload: serde_json::to_value(PedidoCriado::of(order))?,
            traceparent,
        })
    }
}

#[tracing::instrument(skip_all, fields(outbox.id = %message.id, aggregate.id = %message.aggregate_id), err)]
pub async fn insert(
    tx: &mut Transaction<'_, Postgres>,
    message: &OutboxMessage,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload, traceparent)
         values ($1, $2, $3, $4, $5, $6)",
    )
    .bind(message.id)
    .bind(message.aggregate_type)
    .bind(&message.aggregate_id)
    .bind(message.event_type)
    .bind(Json(&message.payload))
    .bind(message.traceparent.as_ref().map(TraceParent::as_str))
    .execute(&mut **tx)
    .await?;
    Ok(())
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
            status: "PENDING".into(),
            items: vec![("ABC-1".into(), 2)],
            created_at: datetime!(2026-12-02 15:00:00 UTC),
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

//! Orders and their items in PostgreSQL.

use sqlx::PgConnection;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::domain::{NewOrder, OrderId};
use crate::status::OrderStatus;

/// An order as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub id: OrderId,
    pub customer_id: String,
    pub status: OrderStatus,
    /// Why the order is in its status (a rejection's reason).
    pub status_reason: Option<String>,
    /// `(sku, quantity)` in the order the client sent them.
    pub items: Vec<(String, i32)>,
    pub created_at: OffsetDateTime,
    /// Every status the order has been in, oldest first.
    pub history: Vec<StatusChange>,
}

/// One entry of an order's status history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusChange {
    pub status: OrderStatus,
    pub reason: Option<String>,
    /// The message that caused it (none for orders placed before the
    /// history existed).
    pub message_id: Option<Uuid>,
    pub changed_at: OffsetDateTime,
}

impl Order {
    /// A new pending order. The timestamp is cut to microseconds, PostgreSQL's
    /// precision, so the order read back equals the one returned now.
    pub fn pending(new_order: &NewOrder) -> Self {
        let now = OffsetDateTime::now_utc();
        let created_at = now
            .replace_nanosecond(now.nanosecond() / 1_000 * 1_000)
            .unwrap_or(now);
        Self {
            id: OrderId::new(),
            customer_id: new_order.customer_id.as_str().to_owned(),
            status: OrderStatus::Pending,
            status_reason: None,
            items: new_order
                .items
                .iter()
                .map(|item| (item.sku.as_str().to_owned(), item.quantity.get()))
                .collect(),
            created_at,
            history: Vec::new(),
        }
    }

    /// Records the message that announces the new order: its PENDING entry.
    pub fn announced_by(&mut self, message_id: Uuid) {
        self.history.push(StatusChange {
            status: OrderStatus::Pending,
            reason: None,
            message_id: Some(message_id),
            changed_at: self.created_at,
        });
    }
}

/// One order with its items aggregated in line order.
struct OrderRow {
    id: uuid::Uuid,
    customer_id: String,
    status: OrderStatus,
    status_reason: Option<String>,
    created_at: OffsetDateTime,
    skus: Vec<String>,
    quantities: Vec<i32>,
}

/// An order's status; `None` when there is no such order.
pub async fn status(conn: &mut PgConnection, id: Uuid) -> Result<Option<OrderStatus>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select status as "status: OrderStatus" from orders where id = $1"#,
        id,
    )
    .fetch_optional(conn)
    .await
}

#[tracing::instrument(skip(conn), err)]
pub async fn find(conn: &mut PgConnection, id: OrderId) -> Result<Option<Order>, sqlx::Error> {
    let row = sqlx::query_as!(
        OrderRow,
        r#"select o.id, o.customer_id, o.status as "status: OrderStatus", o.status_reason,
                  o.created_at,
                  array_agg(i.sku order by i.line) as "skus!",
                  array_agg(i.quantity order by i.line) as "quantities!"
           from orders o
           join order_items i on i.order_id = o.id
           where o.id = $1
           group by o.id"#,
        id.as_uuid(),
    )
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let history = sqlx::query_as!(
        StatusChange,
        r#"select status as "status: OrderStatus", reason, message_id, changed_at
           from order_status_history
           where order_id = $1 order by position"#,
        id.as_uuid(),
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(Some(Order {
        id: row.id.into(),
        customer_id: row.customer_id,
        status: row.status,
        status_reason: row.status_reason,
        items: row.skus.into_iter().zip(row.quantities).collect(),
        created_at: row.created_at,
        history,
    }))
}

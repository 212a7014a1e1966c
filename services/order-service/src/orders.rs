//! Orders and their items in PostgreSQL.

use sqlx::{PgPool, Postgres, Transaction};
use time::OffsetDateTime;

use crate::domain::{NewOrder, OrderId};

/// The only status this service writes; reservation outcomes live in the
/// inventory service.
pub const STATUS_PENDING: &str = "PENDING";

/// An order as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub id: OrderId,
    pub customer_id: String,
    pub status: String,
    /// `(sku, quantity)` in the order the client sent them.
    pub items: Vec<(String, i32)>,
    pub created_at: OffsetDateTime,
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
            status: STATUS_PENDING.to_owned(),
            items: new_order
                .items
                .iter()
                .map(|item| (item.sku.as_str().to_owned(), item.quantity.get()))
                .collect(),
            created_at,
        }
    }
}

#[tracing::instrument(skip_all, fields(order.id = %order.id), err)]
pub async fn insert(tx: &mut Transaction<'_, Postgres>, order: &Order) -> Result<(), sqlx::Error> {
    sqlx::query("insert into orders (id, customer_id, status, created_at) values ($1, $2, $3, $4)")
        .bind(order.id.as_uuid())
        .bind(&order.customer_id)
        .bind(&order.status)
        .bind(order.created_at)
        .execute(&mut **tx)
        .await?;
    let (skus, quantities): (Vec<&str>, Vec<i32>) = order
        .items
        .iter()
        .map(|(sku, quantity)| (sku.as_str(), *quantity))
        .unzip();
    // One statement for all items, whatever their number.
    sqlx::query(
        "insert into order_items (order_id, line, sku, quantity)
         select $1, item.line - 1, item.sku, item.quantity
         from unnest($2::text[], $3::int4[]) with ordinality as item (sku, quantity, line)",
    )
    .bind(order.id.as_uuid())
    .bind(&skus)
    .bind(&quantities)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// One order with its items aggregated in line order.
#[derive(sqlx::FromRow)]
struct OrderRow {
    id: uuid::Uuid,
    customer_id: String,
    status: String,
    created_at: OffsetDateTime,
    skus: Vec<String>,
    quantities: Vec<i32>,
}

#[tracing::instrument(skip(pool), err)]
pub async fn find(pool: &PgPool, id: OrderId) -> Result<Option<Order>, sqlx::Error> {
    let row: Option<OrderRow> = sqlx::query_as(
        "select o.id, o.customer_id, o.status, o.created_at,
                array_agg(i.sku order by i.line) as skus,
                array_agg(i.quantity order by i.line) as quantities
         from orders o
         join order_items i on i.order_id = o.id
         where o.id = $1
         group by o.id",
    )
    .bind(id.as_uuid())
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|row| Order {
        id: row.id.into(),
        customer_id: row.customer_id,
        status: row.status,
        items: row.skus.into_iter().zip(row.quantities).collect(),
        created_at: row.created_at,
    }))
}

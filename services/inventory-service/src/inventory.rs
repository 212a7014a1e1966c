//! Stock, reservations and the dedupe table in PostgreSQL.

use sqlx::{PgPool, Postgres, Transaction};
use uuid::Uuid;

use crate::event::OrderPlaced;

/// Stock of one sku.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Stock {
    pub sku: String,
    pub available: i32,
    pub reserved: i32,
}

/// A reservation outcome with its items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub order_id: Uuid,
    pub status: String,
    pub reason: Option<String>,
    pub items: Vec<(String, i32)>,
}

/// What applying an order did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Every item reserved.
    Reserved,
    /// Nothing reserved; why.
    Rejected(String),
    /// The order already had an outcome (from another message id): no effect.
    AlreadyDecided,
}

/// Records that `consumer` processes `message_id`: insert first, no SELECT
/// before it. False when the message was processed before (or is being
/// processed right now by a transaction that will commit first): a duplicate.
pub async fn claim_message(
    tx: &mut Transaction<'_, Postgres>,
    consumer: &str,
    message_id: Uuid,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "insert into mensagem_processada (consumidor, mensagem_id) values ($1, $2)
         on conflict do nothing",
    )
    .bind(consumer)
    .bind(message_id)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(inserted == 1)
}

/// Reserves every item of the order, or none: locks the order's stock rows
/// (in sku order, so concurrent orders cannot deadlock), decides, then writes
/// the outcome and, if reserved, the stock changes.
pub async fn reserve(
    tx: &mut Transaction<'_, Postgres>,
    order: &OrderPlaced,
) -> Result<Applied, sqlx::Error> {
    let (skus, quantities): (Vec<&str>, Vec<i32>) =
        order.items.iter().map(|(s, q)| (s.as_str(), *q)).unzip();
    let locked: Vec<(String, i32)> = sqlx::query_as(
        "select sku, available from stock where sku = any($1) order by sku for update",
    )
    .bind(&skus)
    .fetch_all(&mut **tx)
    .await?;
    let shortage = order.items.iter().find_map(|(sku, quantity)| {
        match locked.iter().find(|(locked_sku, _)| locked_sku == sku) {
            None => Some(format!("unknown sku {sku}")),
            Some((_, available)) if available < quantity => Some(format!(
                "insufficient stock for {sku}: requested {quantity}, available {available}"
            )),
            Some(_) => None,
        }
    });
    let (status, reason) = match &shortage {
        None => ("RESERVED", None),
        Some(reason) => ("REJECTED", Some(reason.as_str())),
    };
    let decided = sqlx::query(
        "insert into reservations (order_id, status, reason, message_id) values ($1, $2, $3, $4)
         on conflict (order_id) do nothing",
    )
    .bind(order.order_id)
    .bind(status)
    .bind(reason)
    .bind(order.message_id)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if decided == 0 {
        return Ok(Applied::AlreadyDecided);
    }
    sqlx::query(
        "insert into reservation_items (order_id, line, sku, quantity)
         select $1, item.line - 1, item.sku, item.quantity
         from unnest($2::text[], $3::int4[]) with ordinality as item (sku, quantity, line)",
    )
    .bind(order.order_id)
    .bind(&skus)
    .bind(&quantities)
    .execute(&mut **tx)
    .await?;
    if let Some(reason) = shortage {
        return Ok(Applied::Rejected(reason));
    }
    sqlx::query(
        "update stock s
         set available = s.available - w.quantity, reserved = s.reserved + w.quantity, updated_at = now()
         from unnest($1::text[], $2::int4[]) as w (sku, quantity)
         where s.sku = w.sku",
    )
    .bind(&skus)
    .bind(&quantities)
    .execute(&mut **tx)
    .await?;
    Ok(Applied::Reserved)
}

/// Sets the units available for `sku`, creating it if new.
pub async fn set_available(pool: &PgPool, sku: &str, available: i32) -> Result<Stock, sqlx::Error> {
    sqlx::query_as(
        "insert into stock (sku, available) values ($1, $2)
         on conflict (sku) do update set available = excluded.available, updated_at = now()
         returning sku, available, reserved",
    )
    .bind(sku)
    .bind(available)
    .fetch_one(pool)
    .await
}

pub async fn stock(pool: &PgPool, sku: &str) -> Result<Option<Stock>, sqlx::Error> {
    sqlx::query_as("select sku, available, reserved from stock where sku = $1")
        .bind(sku)
        .fetch_optional(pool)
        .await
}

/// A reservation with its items aggregated in line order.
#[derive(sqlx::FromRow)]
struct ReservationRow {
    order_id: Uuid,
    status: String,
    reason: Option<String>,
    skus: Vec<String>,
    quantities: Vec<i32>,
}

pub async fn reservation(
    pool: &PgPool,
    order_id: Uuid,
) -> Result<Option<Reservation>, sqlx::Error> {
    let row: Option<ReservationRow> = sqlx::query_as(
        "select r.order_id, r.status, r.reason,
                coalesce(array_agg(i.sku order by i.line) filter (where i.sku is not null), '{}') as skus,
                coalesce(array_agg(i.quantity order by i.line) filter (where i.sku is not null), '{}') as quantities
         from reservations r left join reservation_items i on i.order_id = r.order_id
         where r.order_id = $1
         group by r.order_id",
    )
    .bind(order_id)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|row| Reservation {
        order_id: row.order_id,
        status: row.status,
        reason: row.reason,
        items: row.skus.into_iter().zip(row.quantities).collect(),
    }))
}

/// Deletes `mensagem_processada` rows older than `older_than`, `batch` at a
/// time (short transactions, little lock and WAL pressure). Returns the count.
pub async fn delete_processed_before(
    pool: &PgPool,
    older_than: std::time::Duration,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    let older_than = time::Duration::try_from(older_than).unwrap_or(time::Duration::MAX);
    let mut total = 0;
    loop {
        let deleted = sqlx::query(
            "delete from mensagem_processada where ctid = any(array(
                 select ctid from mensagem_processada
                 where processada_em < now() - $1
                 limit $2))",
        )
        .bind(older_than)
        .bind(batch)
        .execute(pool)
        .await?
        .rows_affected();
        total += deleted;
        if deleted < u64::try_from(batch).unwrap_or(0) {
            return Ok(total);
        }
    }
}

//! Stock, reservations and the dedupe table in PostgreSQL.

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::event::{OrderPlaced, Sku};
use idempotent_consumer::Claimed;

/// Stock of one sku.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Stock {
    pub sku: String,
    pub available: i64,
    pub reserved: i64,
}

/// A reservation outcome with its items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    pub order_id: Uuid,
    pub status: String,
    pub reason: Option<String>,
    pub items: Vec<(String, i32)>,
}

/// What applying an order's message did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Every item reserved.
    Reserved,
    /// Nothing reserved; why.
    Rejected(String),
    /// The order already had an outcome (from another message id): no effect.
    AlreadyDecided,
}

impl Applied {
    /// The `outcome` label of `consumer_processed_total`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Reserved => "reserved",
            Self::Rejected(_) => "rejected",
            Self::AlreadyDecided => "already-decided",
        }
    }
}

/// Decides the orders of `messages`, in order, within the transaction that
/// just claimed their message ids: one outcome per order, all items
/// reserved or none.
///
/// Set-based, so a batch costs the same few statements as one order: lock
/// the stock rows involved (in sku order, so concurrent transactions cannot
/// deadlock), decide each order against the locked stock, then write
/// outcomes, items and stock changes with one statement each. An order
/// decided meanwhile by another transaction makes the outcome insert fail on
/// its primary key, and the whole transaction is retried.
pub async fn reserve(
    tx: &mut PgConnection,
    messages: &[Claimed<'_, OrderPlaced>],
) -> Result<Vec<Applied>, sqlx::Error> {
    let mut skus: Vec<&str> = messages
        .iter()
        .flat_map(|m| m.message.items.iter().map(|(sku, _)| sku.as_str()))
        .collect();
    skus.sort_unstable();
    skus.dedup();
    let mut available: HashMap<String, i64> = sqlx::query_as(
        "select sku, available from stock where sku = any($1) order by sku for update",
    )
    .bind(&skus)
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .collect();
    let order_ids: Vec<Uuid> = messages.iter().map(|m| m.message.order_id).collect();
    let mut decided: HashSet<Uuid> =
        sqlx::query_scalar("select order_id from reservations where order_id = any($1)")
            .bind(&order_ids)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .collect();

    let mut applied = Vec::with_capacity(messages.len());
    let mut outcomes = Outcomes::default();
    for claimed in messages {
        let order = claimed.message;
        if !decided.insert(order.order_id) {
            applied.push(Applied::AlreadyDecided);
            continue;
        }
        let shortage =
            order
                .items
                .iter()
                .find_map(|(sku, quantity)| match available.get(sku.as_str()) {
                    None => Some(format!("unknown sku {sku}")),
                    Some(free) if *free < i64::from(*quantity) => Some(format!(
                        "insufficient stock for {sku}: requested {quantity}, available {free}"
                    )),
                    Some(_) => None,
                });
        if shortage.is_none() {
            for (sku, quantity) in &order.items {
                if let Some(free) = available.get_mut(sku.as_str()) {
                    *free -= i64::from(*quantity);
                }
                *outcomes
                    .reserved
                    .entry(sku.as_str().to_owned())
                    .or_default() += i64::from(*quantity);
            }
        }
        outcomes.add(claimed.id, order, shortage.as_deref());
        applied.push(match shortage {
            None => Applied::Reserved,
            Some(reason) => {
                tracing::info!(parent: &claimed.record.span(), order.id = %order.order_id, %reason, "reservation rejected");
                Applied::Rejected(reason)
            }
        });
    }
    outcomes.write(tx).await?;
    Ok(applied)
}

/// The rows a batch writes, gathered to be written one statement per table.
#[derive(Debug, Default)]
struct Outcomes {
    order_ids: Vec<Uuid>,
    statuses: Vec<&'static str>,
    reasons: Vec<Option<String>>,
    message_ids: Vec<Uuid>,
    item_orders: Vec<Uuid>,
    item_lines: Vec<i16>,
    item_skus: Vec<String>,
    item_quantities: Vec<i32>,
    /// Units reserved per sku by this batch.
    reserved: HashMap<String, i64>,
}

impl Outcomes {
    fn add(&mut self, message_id: Uuid, order: &OrderPlaced, shortage: Option<&str>) {
        self.order_ids.push(order.order_id);
        self.statuses.push(if shortage.is_none() {
            "RESERVED"
        } else {
            "REJECTED"
        });
        self.reasons.push(shortage.map(str::to_owned));
        self.message_ids.push(message_id);
        for (line, (sku, quantity)) in order.items.iter().enumerate() {
            self.item_orders.push(order.order_id);
            self.item_lines
                .push(i16::try_from(line).unwrap_or(i16::MAX));
            self.item_skus.push(sku.as_str().to_owned());
            self.item_quantities.push(*quantity);
        }
    }

    async fn write(self, tx: &mut PgConnection) -> Result<(), sqlx::Error> {
        if self.order_ids.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "insert into reservations (order_id, status, reason, message_id)
             select * from unnest($1::uuid[], $2::text[], $3::text[], $4::uuid[])",
        )
        .bind(&self.order_ids)
        .bind(&self.statuses)
        .bind(&self.reasons)
        .bind(&self.message_ids)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "insert into reservation_items (order_id, line, sku, quantity)
             select * from unnest($1::uuid[], $2::int2[], $3::text[], $4::int4[])",
        )
        .bind(&self.item_orders)
        .bind(&self.item_lines)
        .bind(&self.item_skus)
        .bind(&self.item_quantities)
        .execute(&mut *tx)
        .await?;
        if !self.reserved.is_empty() {
            let (skus, quantities): (Vec<String>, Vec<i64>) = self.reserved.into_iter().unzip();
            sqlx::query(
                "update stock s
                 set available = s.available - w.quantity, reserved = s.reserved + w.quantity, updated_at = now()
                 from unnest($1::text[], $2::int8[]) as w (sku, quantity)
                 where s.sku = w.sku",
            )
            .bind(&skus)
            .bind(&quantities)
            .execute(&mut *tx)
            .await?;
        }
        Ok(())
    }
}

/// Sets the units available for `sku`, creating it if new.
pub async fn set_available(pool: &PgPool, sku: &Sku, available: i64) -> Result<Stock, sqlx::Error> {
    sqlx::query_as(
        "insert into stock (sku, available) values ($1, $2)
         on conflict (sku) do update set available = excluded.available, updated_at = now()
         returning sku, available, reserved",
    )
    .bind(sku.as_str())
    .bind(available)
    .fetch_one(pool)
    .await
}

pub async fn stock(pool: &PgPool, sku: &Sku) -> Result<Option<Stock>, sqlx::Error> {
    sqlx::query_as("select sku, available, reserved from stock where sku = $1")
        .bind(sku.as_str())
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

//! Stock, reservations and the dedupe table in PostgreSQL.

use std::collections::{HashMap, HashSet};

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::announce;
use crate::event::{OrderCancelled, OrderPlaced, Sku};
use idempotent_consumer::Claimed;
use outbox::OutboxMessage;

/// Stock of one sku.
#[derive(Debug, Clone, PartialEq, Eq)]
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
/// reserved or none, each announced by an outbox row in the same
/// transaction.
///
/// Set-based, so a batch costs the same two statements as one order: lock
/// the stock rows involved (in sku order, so concurrent transactions cannot
/// deadlock) and read which orders are decided, decide each order against
/// the locked stock, then write outcomes, items, stock changes and their
/// announcements with one statement. An order
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
    let order_ids: Vec<Uuid> = messages.iter().map(|m| m.message.order_id).collect();
    // One round trip: the stock rows locked, and the orders already decided.
    // The latter are read in the statement's snapshot, taken before any
    // wait for a lock: an order decided by the transaction waited for is
    // not seen, and this one's outcome insert fails on its primary key, a
    // transient failure whose retry sees it. Only a second message id for
    // the same order, applied at the same time, can meet that.
    let mut available: HashMap<String, i64> = HashMap::with_capacity(skus.len());
    let mut decided: HashSet<Uuid> = HashSet::new();
    let rows = sqlx::query!(
        r#"with locked as (
               select sku, available from stock where sku = any($1) order by sku for update
           )
           select sku as "sku?", available as "available?", null::uuid as "decided?" from locked
           union all
           select null, null, order_id from reservations where order_id = any($2)"#,
        &skus as &[&str],
        &order_ids,
    )
    .fetch_all(&mut *tx)
    .await?;
    for row in rows {
        match (row.sku, row.available, row.decided) {
            (Some(sku), Some(free), _) => {
                available.insert(sku, free);
            }
            (_, _, Some(order_id)) => {
                decided.insert(order_id);
            }
            _ => {}
        }
    }

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
        outcomes.add(claimed, shortage.as_deref());
        applied.push(match shortage {
            None => Applied::Reserved,
            Some(reason) => {
                tracing::info!(parent: claimed.span, order.id = %order.order_id, %reason, "reservation rejected");
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
    /// The outcomes announced, in decision order.
    events: Vec<OutboxMessage>,
}

impl Outcomes {
    fn add(&mut self, claimed: &Claimed<'_, OrderPlaced>, shortage: Option<&str>) {
        let order = claimed.message;
        self.events.push(match shortage {
            None => announce::reserved(
                order.order_id,
                order
                    .items
                    .iter()
                    .map(|(sku, quantity)| (sku.as_str(), *quantity)),
                claimed,
            ),
            Some(reason) => announce::rejected(order.order_id, reason, claimed),
        });
        self.order_ids.push(order.order_id);
        self.statuses.push(if shortage.is_none() {
            "RESERVED"
        } else {
            "REJECTED"
        });
        self.reasons.push(shortage.map(str::to_owned));
        self.message_ids.push(claimed.id);
        for (line, (sku, quantity)) in order.items.iter().enumerate() {
            self.item_orders.push(order.order_id);
            self.item_lines
                .push(i16::try_from(line).unwrap_or(i16::MAX));
            self.item_skus.push(sku.as_str().to_owned());
            self.item_quantities.push(*quantity);
        }
    }

    /// One statement for every table, whatever the batch's size.
    async fn write(self, tx: &mut PgConnection) -> Result<(), sqlx::Error> {
        if self.order_ids.is_empty() {
            return Ok(());
        }
        let (skus, quantities): (Vec<String>, Vec<i64>) = self.reserved.into_iter().unzip();
        let events = outbox::Columns::of(&self.events);
        // The items' foreign key is checked at the end of the statement,
        // when the outcomes are in. The outbox part is `outbox::insert`'s
        // (the tests compare the two).
        sqlx::query!(
            "with outcomes as (
                 insert into reservations (order_id, status, reason, message_id)
                 select * from unnest($1::uuid[], $2::text[], $3::text[], $4::uuid[])
             ), items as (
                 insert into reservation_items (order_id, line, sku, quantity)
                 select * from unnest($5::uuid[], $6::int2[], $7::text[], $8::int4[])
             ), taken as (
                 update stock s
                 set available = s.available - w.quantity, reserved = s.reserved + w.quantity,
                     updated_at = now()
                 from unnest($9::text[], $10::int8[]) as w (sku, quantity)
                 where s.sku = w.sku
             )
             insert into outbox (id, aggregatetype, aggregateid, type, payload, traceparent,
                                 tracingspancontext)
             select id, aggregatetype, aggregateid, type, payload, traceparent, tracingspancontext
             from unnest($11::uuid[], $12::text[], $13::text[], $14::text[], $15::jsonb[],
                         $16::text[], $17::text[])
                  with ordinality as m (id, aggregatetype, aggregateid, type, payload,
                                        traceparent, tracingspancontext, n)
             order by n",
            &self.order_ids,
            &self.statuses as &[&str],
            &self.reasons as &[Option<String>],
            &self.message_ids,
            &self.item_orders,
            &self.item_lines,
            &self.item_skus,
            &self.item_quantities,
            &skus,
            &quantities,
            &events.ids,
            &events.aggregate_types as &[&str],
            &events.aggregate_ids as &[&str],
            &events.types as &[&str],
            &events.payloads as _,
            &events.traceparents as &[Option<&str>],
            &events.span_contexts as &[Option<String>],
        )
        .execute(tx)
        .await?;
        Ok(())
    }
}

/// What applying an order's cancellation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancellation {
    /// Its items went back to stock, and `EstoqueLiberado` says so.
    Released,
    /// It was rejected: nothing was reserved, nothing to give back.
    NothingReserved,
    /// Released (or cancelled) before, by another message id: no effect.
    AlreadyCancelled,
    /// Its creation has not been applied (dead-lettered, not redriven):
    /// recorded as CANCELLED, so that a later redrive of the creation finds
    /// the order decided and reserves nothing.
    BeforeReservation,
}

impl Cancellation {
    /// The `outcome` label of `consumer_processed_total`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::NothingReserved => "nothing-reserved",
            Self::AlreadyCancelled => "already-cancelled",
            Self::BeforeReservation => "cancelled-before-reservation",
        }
    }
}

/// Applies the cancellations of `messages`, in order, within the
/// transaction that claimed their message ids: a reservation is released
/// once, its units back in stock and an `EstoqueLiberado` in the outbox.
///
/// Locks in the same order as [`reserve`] (stock rows by sku), so the two
/// cannot deadlock; the reservations involved are locked first.
pub async fn release(
    tx: &mut PgConnection,
    messages: &[Claimed<'_, OrderCancelled>],
) -> Result<Vec<Cancellation>, sqlx::Error> {
    let order_ids: Vec<Uuid> = messages.iter().map(|m| m.message.order_id).collect();
    let mut status: HashMap<Uuid, String> = sqlx::query!(
        "select order_id, status from reservations where order_id = any($1)
         order by order_id for update",
        &order_ids,
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|row| (row.order_id, row.status))
    .collect();

    let mut applied = Vec::with_capacity(messages.len());
    let (mut released, mut released_by, mut causes) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cancelled, mut cancelled_by) = (Vec::new(), Vec::new());
    for claimed in messages {
        let order_id = claimed.message.order_id;
        let outcome = match status.get(&order_id).map(String::as_str) {
            Some("RESERVED") => {
                released.push(order_id);
                released_by.push(claimed.id);
                causes.push(claimed);
                Cancellation::Released
            }
            Some("REJECTED") => Cancellation::NothingReserved,
            Some(_) => Cancellation::AlreadyCancelled,
            None => {
                cancelled.push(order_id);
                cancelled_by.push(claimed.id);
                Cancellation::BeforeReservation
            }
        };
        if matches!(outcome, Cancellation::Released) {
            status.insert(order_id, "RELEASED".to_owned());
        } else if matches!(outcome, Cancellation::BeforeReservation) {
            status.insert(order_id, "CANCELLED".to_owned());
        }
        applied.push(outcome);
    }

    if !released.is_empty() {
        let items: Vec<(Uuid, String, i32)> = sqlx::query!(
            "select order_id, sku, quantity from reservation_items
             where order_id = any($1) order by order_id, line",
            &released,
        )
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|row| (row.order_id, row.sku, row.quantity))
        .collect();
        let mut returned: HashMap<&str, i64> = HashMap::new();
        for (_, sku, quantity) in &items {
            *returned.entry(sku.as_str()).or_default() += i64::from(*quantity);
        }
        let mut skus: Vec<&str> = returned.keys().copied().collect();
        skus.sort_unstable();
        let quantities: Vec<i64> = skus.iter().map(|sku| returned[sku]).collect();
        sqlx::query!(
            "select sku from stock where sku = any($1) order by sku for update",
            &skus as &[&str],
        )
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query!(
            "update stock s
             set available = s.available + w.quantity, reserved = s.reserved - w.quantity, updated_at = now()
             from unnest($1::text[], $2::int8[]) as w (sku, quantity)
             where s.sku = w.sku",
            &skus as &[&str],
            &quantities,
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query!(
            "update reservations r
             set status = 'RELEASED', cancelled_at = clock_timestamp(), cancel_message_id = c.message_id
             from unnest($1::uuid[], $2::uuid[]) as c (order_id, message_id)
             where r.order_id = c.order_id",
            &released,
            &released_by,
        )
        .execute(&mut *tx)
        .await?;
        let events: Vec<OutboxMessage> = released
            .iter()
            .zip(causes)
            .map(|(order_id, cause)| {
                let order_items = items
                    .iter()
                    .filter(|(id, _, _)| id == order_id)
                    .map(|(_, sku, quantity)| (sku.as_str(), *quantity));
                announce::released(*order_id, order_items, cause)
            })
            .collect();
        outbox::insert(tx, &events, outbox::Cleanup::Relay).await?;
    }
    if !cancelled.is_empty() {
        sqlx::query!(
            "insert into reservations (order_id, status, message_id, cancelled_at, cancel_message_id)
             select order_id, 'CANCELLED', message_id, clock_timestamp(), message_id
             from unnest($1::uuid[], $2::uuid[]) as c (order_id, message_id)",
            &cancelled,
            &cancelled_by,
        )
        .execute(&mut *tx)
        .await?;
    }
    Ok(applied)
}

/// Sets the units available for `sku`, creating it if new.
pub async fn set_available(pool: &PgPool, sku: &Sku, available: i64) -> Result<Stock, sqlx::Error> {
    sqlx::query_as!(
        Stock,
        "insert into stock (sku, available) values ($1, $2)
         on conflict (sku) do update set available = excluded.available, updated_at = now()
         returning sku, available, reserved",
        sku.as_str(),
        available,
    )
    .fetch_one(pool)
    .await
}

pub async fn stock(pool: &PgPool, sku: &Sku) -> Result<Option<Stock>, sqlx::Error> {
    sqlx::query_as!(
        Stock,
        "select sku, available, reserved from stock where sku = $1",
        sku.as_str(),
    )
    .fetch_optional(pool)
    .await
}

/// A reservation with its items aggregated in line order.
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
    let row = sqlx::query_as!(
        ReservationRow,
        r#"select r.order_id, r.status, r.reason,
                  coalesce(array_agg(i.sku order by i.line) filter (where i.sku is not null), '{}')
                      as "skus!",
                  coalesce(array_agg(i.quantity order by i.line) filter (where i.sku is not null), '{}')
                      as "quantities!"
           from reservations r left join reservation_items i on i.order_id = r.order_id
           where r.order_id = $1
           group by r.order_id"#,
        order_id,
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|row| Reservation {
        order_id: row.order_id,
        status: row.status,
        reason: row.reason,
        items: row.skus.into_iter().zip(row.quantities).collect(),
    }))
}

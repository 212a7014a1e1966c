//! Placing an order: the order, its items, its first history entry, its
//! `PedidoCriado` outbox row and, with an `Idempotency-Key`, the key's claim,
//! written by one statement.
//!
//! One statement is one round trip and, outside a transaction block, one
//! implicit transaction: all of it commits or none does, which is the
//! outbox's promise, without BEGIN and COMMIT round trips. It writes tables
//! that other modules own (`orders` and `order_items` of [`crate::orders`],
//! `idempotency_keys` of [`crate::idempotency`], `outbox` of the `outbox`
//! crate) in their modules' own terms; the tests compare what it writes with
//! what those modules write.
//!
//! The key's claim comes first: `insert … on conflict do nothing` waits, on
//! the primary key, for a concurrent claim of the same key to end, and the
//! order's rows are written only if this claim went in. A claim that
//! conflicts writes nothing; the caller replays the stored response.

use sqlx::PgExecutor;
use sqlx::types::Json;

use crate::idempotency::{IdempotencyKey, RequestHash, SavedResponse};
use crate::orders::Order;
use crate::status::OrderStatus;
use outbox::{OutboxMessage, TraceContext};

/// An `Idempotency-Key` to claim with the order, and the response it keeps.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub key: &'a IdempotencyKey,
    pub hash: RequestHash,
    pub response: &'a SavedResponse,
}

/// Writes `order` (its items and first history entry) and `announcement`,
/// its outbox row, claiming `claim`'s key first if there is one. `false`:
/// the key was claimed before and nothing was written.
#[tracing::instrument(skip_all, fields(order.id = %order.id), err)]
pub async fn place(
    conn: impl PgExecutor<'_>,
    order: &Order,
    announcement: &OutboxMessage,
    claim: Option<Claim<'_>>,
) -> Result<bool, sqlx::Error> {
    let (skus, quantities): (Vec<&str>, Vec<i32>) = order
        .items
        .iter()
        .map(|(sku, quantity)| (sku.as_str(), *quantity))
        .unzip();
    let trace = announcement.trace.as_ref();
    let hash = claim.map(|claim| claim.hash);
    sqlx::query_scalar!(
        r#"with claim as (
               insert into idempotency_keys (key, request_hash, response_status, response_body,
                                             order_id)
               select $1::text, $2::bytea, $3::int2, $4::jsonb, $5::uuid where $1 is not null
               on conflict (key) do nothing
               returning key
           ), o as (
               insert into orders (id, customer_id, status, created_at)
               select $5, $6, $7, $8 where $1 is null or exists (select from claim)
               returning id, status, created_at
           ), history as (
               insert into order_status_history (order_id, status, message_id, changed_at)
               select id, status, $9, created_at from o
           ), items as (
               insert into order_items (order_id, line, sku, quantity)
               select o.id, item.line - 1, item.sku, item.quantity
               from o, unnest($10::text[], $11::int4[]) with ordinality as item (sku, quantity, line)
           ), announced as (
               insert into outbox (id, aggregatetype, aggregateid, type, payload, traceparent,
                                   tracingspancontext)
               select $12, $13, $14, $15, $16, $17, $18 from o
           )
           select exists (select from o) as "placed!""#,
        claim.map(|claim| claim.key.as_str()),
        hash.as_ref().map(RequestHash::as_bytes),
        claim.map(|claim| claim.response.stored_status()),
        // Json<&Value>: the body is encoded without a copy.
        claim.map(|claim| Json(&claim.response.body)) as _,
        order.id.as_uuid(),
        order.customer_id,
        order.status as OrderStatus,
        order.created_at,
        order.history.first().and_then(|change| change.message_id),
        &skus as &[&str],
        &quantities,
        announcement.id,
        announcement.aggregate_type,
        announcement.aggregate_id,
        announcement.event_type,
        Json(&announcement.payload) as _,
        trace.map(TraceContext::traceparent),
        trace.map(TraceContext::to_properties),
    )
    .fetch_one(conn)
    .await
}

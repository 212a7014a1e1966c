//! An order's status and how it changes:
//!
//! ```text
//! PENDING ──EstoqueReservado──▶ CONFIRMED
//!    │ └────EstoqueRejeitado──▶ REJECTED (reason)
//!    └──────POST /orders/{id}/cancel (from PENDING or CONFIRMED)──▶ CANCELLED
//! ```
//!
//! The database decides every transition: [`transition`] updates the order
//! only when its current status is one the change may come from, in one
//! statement, so a late or repeated event never moves an order backwards,
//! whatever ran concurrently. Each change is recorded in
//! `order_status_history` with the message that caused it.

pub mod consumer; // the pedido.status consumer's handler
pub mod event; // the inventory's events on estoque.eventos

use sqlx::PgConnection;
use uuid::Uuid;

pub const PENDING: &str = "PENDING";
pub const CONFIRMED: &str = "CONFIRMED";
pub const REJECTED: &str = "REJECTED";
pub const CANCELLED: &str = "CANCELLED";
/// The statuses a cancellation may come from.
pub const CANCELLABLE: &[&str] = &[PENDING, CONFIRMED];

/// A change of status, as an event or a request asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change<'a> {
    pub order_id: Uuid,
    pub to: &'static str,
    /// The statuses it may come from.
    pub from: &'static [&'static str],
    pub reason: Option<&'a str>,
    /// The message that causes it, recorded in the history.
    pub message_id: Uuid,
}

/// What [`transition`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Changed,
    /// The order's status (`current`) is not one the change may come from.
    NotAllowed {
        current: String,
    },
    UnknownOrder,
}

/// Applies `change` if the order's status allows it, and records it.
#[tracing::instrument(skip_all, fields(order.id = %change.order_id, to = change.to), err)]
pub async fn transition(
    tx: &mut PgConnection,
    change: &Change<'_>,
) -> Result<Transition, sqlx::Error> {
    let changed: bool = sqlx::query_scalar(
        "with changed as (
             update orders set status = $2, status_reason = $3
             where id = $1 and status = any($4)
             returning id
         ), recorded as (
             insert into order_status_history (order_id, status, reason, message_id)
             select id, $2, $3, $5 from changed
             returning order_id
         )
         select exists (select 1 from recorded)",
    )
    .bind(change.order_id)
    .bind(change.to)
    .bind(change.reason)
    .bind(change.from)
    .bind(change.message_id)
    .fetch_one(&mut *tx)
    .await?;
    if changed {
        return Ok(Transition::Changed);
    }
    // A statement of its own: the update may have waited for a concurrent
    // change of the row and then found it no longer matching, while a
    // read in the same statement still sees the snapshot from before that
    // wait (READ COMMITTED): it would report the status that was replaced.
    let current: Option<String> = sqlx::query_scalar("select status from orders where id = $1")
        .bind(change.order_id)
        .fetch_optional(&mut *tx)
        .await?;
    Ok(match current {
        Some(current) => Transition::NotAllowed { current },
        None => Transition::UnknownOrder,
    })
}

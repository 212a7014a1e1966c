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

use serde::{Deserialize, Serialize};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use sqlx::{Decode, Encode, PgConnection, Postgres, Type};
use utoipa::ToSchema;
use uuid::Uuid;

/// An order's status: the `orders.status` column, the API's `status`, the
/// history's entries. [`OrderStatus::as_str`] is its one spelling, in the
/// database and in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    Pending,
    Confirmed,
    Rejected,
    Cancelled,
}

/// Every change of status there is: from, to. The one place that says which
/// status may follow which; [`transition`] applies nothing else.
const TRANSITIONS: &[(OrderStatus, OrderStatus)] = &[
    // The inventory reserved the stock (EstoqueReservado).
    (OrderStatus::Pending, OrderStatus::Confirmed),
    // The inventory could not (EstoqueRejeitado), with its reason.
    (OrderStatus::Pending, OrderStatus::Rejected),
    // POST /orders/{id}/cancel; the inventory then releases what it reserved.
    (OrderStatus::Pending, OrderStatus::Cancelled),
    (OrderStatus::Confirmed, OrderStatus::Cancelled),
];

impl OrderStatus {
    pub const ALL: [Self; 4] = [
        Self::Pending,
        Self::Confirmed,
        Self::Rejected,
        Self::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Confirmed => "CONFIRMED",
            Self::Rejected => "REJECTED",
            Self::Cancelled => "CANCELLED",
        }
    }

    /// The status spelled `text`; `None` for a value this version does not know.
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == text)
    }

    /// The statuses an order may be in for it to become `self`.
    pub fn comes_from(self) -> Vec<Self> {
        TRANSITIONS
            .iter()
            .filter(|(_, to)| *to == self)
            .map(|(from, _)| *from)
            .collect()
    }
}

impl std::fmt::Display for OrderStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Type<Postgres> for OrderStatus {
    fn type_info() -> PgTypeInfo {
        <&str as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <&str as Type<Postgres>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Postgres> for OrderStatus {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        let text = <&str as Decode<Postgres>>::decode(value)?;
        Self::parse(text).ok_or_else(|| format!("unknown order status {text:?}").into())
    }
}

impl Encode<'_, Postgres> for OrderStatus {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <&str as Encode<Postgres>>::encode(self.as_str(), buf)
    }
}

/// A change of status, as an event or a request asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change<'a> {
    pub order_id: Uuid,
    pub to: OrderStatus,
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
        current: OrderStatus,
    },
    UnknownOrder,
}

/// Applies `change` if the order's status allows it, and records it.
#[tracing::instrument(skip_all, fields(order.id = %change.order_id, to = change.to.as_str()), err)]
pub async fn transition(
    tx: &mut PgConnection,
    change: &Change<'_>,
) -> Result<Transition, sqlx::Error> {
    let changed = sqlx::query_scalar!(
        r#"with changed as (
             update orders set status = $2, status_reason = $3
             where id = $1 and status = any($4)
             returning id
         ), recorded as (
             insert into order_status_history (order_id, status, reason, message_id)
             select id, $2, $3, $5 from changed
             returning order_id
         )
         select exists (select 1 from recorded) as "changed!""#,
        change.order_id,
        change.to as OrderStatus,
        change.reason,
        &change
            .to
            .comes_from()
            .into_iter()
            .map(OrderStatus::as_str)
            .collect::<Vec<_>>() as &[&str],
        change.message_id,
    )
    .fetch_one(&mut *tx)
    .await?;
    if changed {
        return Ok(Transition::Changed);
    }
    // A statement of its own: the update may have waited for a concurrent
    // change of the row and then found it no longer matching, while a
    // read in the same statement still sees the snapshot from before that
    // wait (READ COMMITTED): it would report the status that was replaced.
    let current: Option<OrderStatus> = sqlx::query_scalar!(
        r#"select status as "status: OrderStatus" from orders where id = $1"#,
        change.order_id,
    )
    .fetch_optional(&mut *tx)
    .await?;
    Ok(match current {
        Some(current) => Transition::NotAllowed { current },
        None => Transition::UnknownOrder,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_spelled_the_same_in_json_and_in_the_database() {
        for status in OrderStatus::ALL {
            assert_eq!(serde_json::to_value(status).unwrap(), status.as_str());
            assert_eq!(OrderStatus::parse(status.as_str()), Some(status));
        }
        assert_eq!(OrderStatus::parse("pending"), None);
    }

    #[test]
    fn the_transitions_are_the_documented_ones() {
        use OrderStatus::*;
        assert_eq!(Confirmed.comes_from(), [Pending]);
        assert_eq!(Rejected.comes_from(), [Pending]);
        assert_eq!(Cancelled.comes_from(), [Pending, Confirmed]);
        assert_eq!(Pending.comes_from(), []);
    }
}

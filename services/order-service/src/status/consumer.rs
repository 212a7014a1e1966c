//! The order service's part of the idempotent consumer (`pedido.status`):
//! each inventory outcome moves its order out of PENDING, inside the
//! transaction that claimed its message id. A release changes no status:
//! the order was CANCELLED when it was asked for.

use sqlx::PgConnection;

use super::event::{self, OutcomeKind, StockOutcome};
use super::{Change, OrderStatus, Transition, transition};
use crate::orders;
use idempotent_consumer::{Claimed, DltReason, Handler, InvalidMessage, Record, Verdict};

/// The `consumidor` value in `mensagem_processada`.
pub const CONSUMER_NAME: &str = service_support::consumers::ORDER_STATUS.name;

/// Applies the inventory's outcomes to orders.
#[derive(Debug, Clone, Copy, Default)]
pub struct StatusUpdates;

impl Handler for StatusUpdates {
    type Message = StockOutcome;

    fn consumer_name(&self) -> &'static str {
        CONSUMER_NAME
    }

    fn parse(&self, record: &Record) -> Result<StockOutcome, InvalidMessage> {
        event::parse(record)
    }

    async fn apply(
        &self,
        tx: &mut PgConnection,
        messages: &[Claimed<'_, StockOutcome>],
    ) -> Result<Vec<Verdict>, sqlx::Error> {
        let mut verdicts = Vec::with_capacity(messages.len());
        for claimed in messages {
            let outcome = claimed.message;
            let (to, reason, name) = match &outcome.kind {
                OutcomeKind::Reserved => (OrderStatus::Confirmed, None, "confirmed"),
                OutcomeKind::Rejected { reason } => {
                    (OrderStatus::Rejected, Some(reason.as_str()), "rejected")
                }
                OutcomeKind::Released => {
                    verdicts.push(match orders::status(tx, outcome.order_id).await? {
                        Some(_) => Verdict::Applied("released"),
                        None => unknown(outcome.order_id),
                    });
                    continue;
                }
            };
            let change = Change {
                order_id: outcome.order_id,
                to,
                reason,
                message_id: claimed.id,
            };
            verdicts.push(match transition(tx, &change).await? {
                Transition::Changed => Verdict::Applied(name),
                Transition::NotAllowed { current } => {
                    tracing::info!(parent: claimed.span, order.id = %outcome.order_id, %current, %to,
                        "the order has moved on: the outcome changes nothing");
                    Verdict::Applied("superseded")
                }
                Transition::UnknownOrder => unknown(outcome.order_id),
            });
        }
        Ok(verdicts)
    }
}

fn unknown(order_id: uuid::Uuid) -> Verdict {
    Verdict::Refused(InvalidMessage::new(
        DltReason::UnknownAggregate,
        format!("order {order_id} does not exist in this database"),
    ))
}

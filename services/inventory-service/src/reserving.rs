//! The inventory's part of the idempotent consumer: a `PedidoCriado`
//! reserves its order's stock, all or nothing, and a `PedidoCancelado`
//! releases it, each inside the transaction that claimed its message id and
//! announced through the outbox.

use sqlx::PgConnection;

use crate::event::{self, CONSUMER_NAME, OrderEvent};
use crate::inventory;
use idempotent_consumer::{Claimed, Handler, InvalidMessage, Record, Verdict};

/// Reserves stock for each order placed, releases it for each cancelled.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reserving;

impl Handler for Reserving {
    type Message = OrderEvent;

    fn consumer_name(&self) -> &'static str {
        CONSUMER_NAME
    }

    fn parse(&self, record: &Record) -> Result<OrderEvent, InvalidMessage> {
        event::parse(record)
    }

    /// Each run of consecutive creations (or cancellations) is applied
    /// set-based, runs in record order: a cancellation after its creation
    /// in the same batch finds the reservation made.
    async fn apply(
        &self,
        tx: &mut PgConnection,
        messages: &[Claimed<'_, OrderEvent>],
    ) -> Result<Vec<Verdict>, sqlx::Error> {
        let mut verdicts = Vec::with_capacity(messages.len());
        let mut rest = messages;
        while let Some(first) = rest.first() {
            let placing = matches!(first.message, OrderEvent::Placed(_));
            let run = rest
                .iter()
                .position(|m| matches!(m.message, OrderEvent::Placed(_)) != placing)
                .unwrap_or(rest.len());
            let (this, next) = rest.split_at(run);
            if placing {
                let placed: Vec<Claimed<'_, _>> = this
                    .iter()
                    .filter_map(|m| match m.message {
                        OrderEvent::Placed(order) => Some(Claimed {
                            id: m.id,
                            message: order,
                            record: m.record,
                            span: m.span,
                        }),
                        OrderEvent::Cancelled(_) => None,
                    })
                    .collect();
                let applied = inventory::reserve(tx, &placed).await?;
                verdicts.extend(applied.iter().map(|a| Verdict::Applied(a.name())));
            } else {
                let cancelled: Vec<Claimed<'_, _>> = this
                    .iter()
                    .filter_map(|m| match m.message {
                        OrderEvent::Cancelled(order) => Some(Claimed {
                            id: m.id,
                            message: order,
                            record: m.record,
                            span: m.span,
                        }),
                        OrderEvent::Placed(_) => None,
                    })
                    .collect();
                let applied = inventory::release(tx, &cancelled).await?;
                verdicts.extend(applied.iter().map(|a| Verdict::Applied(a.name())));
            }
            rest = next;
        }
        Ok(verdicts)
    }
}

//! The inventory's part of the idempotent consumer: a `PedidoCriado`
//! reserves its order's stock, all or nothing, inside the transaction that
//! claimed its message id.

use sqlx::PgConnection;

use crate::event::{self, CONSUMER_NAME, OrderPlaced};
use crate::inventory;
use idempotent_consumer::{Claimed, Handler, InvalidMessage, Record};

/// Reserves stock for each order placed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reserving;

impl Handler for Reserving {
    type Message = OrderPlaced;

    fn consumer_name(&self) -> &'static str {
        CONSUMER_NAME
    }

    fn parse(&self, record: &Record) -> Result<OrderPlaced, InvalidMessage> {
        event::parse(record)
    }

    async fn apply(
        &self,
        tx: &mut PgConnection,
        messages: &[Claimed<'_, OrderPlaced>],
    ) -> Result<Vec<&'static str>, sqlx::Error> {
        let applied = inventory::reserve(tx, messages).await?;
        Ok(applied.iter().map(inventory::Applied::name).collect())
    }
}

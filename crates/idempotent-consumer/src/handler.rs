//! What a service plugs into the consumer: how to read its records and how
//! to apply them. The consumer does the rest: the `id` header, the dedupe
//! row, transactions, retries, the DLT, offsets.

use std::future::Future;

use sqlx::PgConnection;
use uuid::Uuid;

use super::failure::InvalidMessage;
use super::record::Record;

/// A service's side of the idempotent consumer.
pub trait Handler: Send + Sync + 'static {
    /// A record parsed and validated: ready to apply.
    type Message: Send + Sync + 'static;

    /// The consumer's name in `mensagem_processada` (`consumidor`).
    fn consumer_name(&self) -> &'static str;

    /// Everything that makes the record unprocessable whatever the retries:
    /// event type, JSON, schema. Headers names and the `id` header are
    /// checked before. Must not touch the database.
    fn parse(&self, record: &Record) -> Result<Self::Message, InvalidMessage>;

    /// Applies `messages`, in order, inside the transaction on `tx`: their
    /// ids were just claimed in it, so each is applied at most once. Returns
    /// one outcome name per message, in order (`reserved`, `rejected`…: the
    /// `outcome` label of `consumer_processed_total`). An error rolls the
    /// whole transaction back.
    fn apply(
        &self,
        tx: &mut PgConnection,
        messages: &[Claimed<'_, Self::Message>],
    ) -> impl Future<Output = Result<Vec<&'static str>, sqlx::Error>> + Send;
}

/// A message whose id this transaction claimed.
#[derive(Debug)]
pub struct Claimed<'a, M> {
    /// The `id` header: the message id.
    pub id: Uuid,
    pub message: &'a M,
    pub record: &'a Record,
}

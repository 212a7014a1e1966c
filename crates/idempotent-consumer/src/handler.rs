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
    /// one [`Verdict`] per message, in order. An error rolls the whole
    /// transaction back.
    fn apply(
        &self,
        tx: &mut PgConnection,
        messages: &[Claimed<'_, Self::Message>],
    ) -> impl Future<Output = Result<Vec<Verdict>, sqlx::Error>> + Send;
}

/// What applying one message came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Applied (or deliberately without effect), with the outcome name:
    /// the `outcome` label of `consumer_processed_total` (`reserved`,
    /// `rejected`, `confirmed`…).
    Applied(&'static str),
    /// Valid, but nothing here can apply it, now or later (it names an
    /// aggregate this service does not know): it must have made no change
    /// in the transaction. Its claim is withdrawn in the same transaction
    /// and it goes to the DLT with this reason, so that a redrive, once the
    /// cause is fixed, applies it.
    Refused(InvalidMessage),
}

/// A message whose id this transaction claimed.
#[derive(Debug)]
pub struct Claimed<'a, M> {
    /// The `id` header: the message id.
    pub id: Uuid,
    pub message: &'a M,
    pub record: &'a Record,
    /// The record's processing span: events the message causes continue
    /// its trace ([`service_support::telemetry::outgoing`]).
    pub span: &'a tracing::Span,
}

//! The idempotent consumer: at-least-once delivery from Kafka turned into
//! exactly-once effects in PostgreSQL. It knows no service: a service gives
//! it a [`Handler`] (how to parse a record, how to apply messages inside the
//! transaction it is handed) and the consumer does the rest.
//!
//! What a service brings:
//! - in its database, this library's tables ([`migrator`]): the dedupe
//!   rows ([`processed`]: `mensagem_processada`, a row inserted first in the
//!   same transaction as the handler's effect, and its retention) and the
//!   redrive audit;
//! - a [`Handler`]: its `consumer_name`, `parse` (a [`Record`] to a message,
//!   or an [`InvalidMessage`] with its [`DltReason`]) and `apply` (the
//!   [`Claimed`] messages, inside the transaction it is handed, each judged
//!   by a [`Verdict`]: applied with an outcome name, or refused to the DLT);
//! - then [`serve`] with that handler, its [`ConsumerOptions`] (topic, DLT,
//!   group, batch size, retries), the [`Health`] its readiness reads and a
//!   token: it waits for the topics and consumes until the token is
//!   cancelled. [`describe_metrics`] names the metrics for `/metrics`.
//!
//! [`serve`] assembles the parts a test may also assemble itself: a
//! [`Pipeline`] of the handler with a [`DeadLetterPolicy`] (a
//! [`RetryPolicy`], a [`DltProducer`] built with [`producer_settings`], and
//! a [`Health`] over a [`Circuit`] and a [`Database`]), run by
//! [`run`] ([`consumer`]) with [`Settings`] and a client built with
//! [`consumer_settings`].
//!
//! The operator's tools (`dlt list | show | redrive`, the retention command)
//! are the `consumer-tools` crate's. The dead-letter format ([`dlt`]:
//! [`DeadLetter`], [`DltInfo`], [`decode_header`], [`message_headers`],
//! [`REDRIVEN_FROM`]) is public for them and for tests.
//!
//! Reading order, as a record flows:
//! - [`poller`]: the poll loop on its own thread hands each record to its
//!   partition's worker and tends the assignments (pauses, restarts);
//! - [`partition`]: one worker per assigned partition, in order, batches of
//!   what is already queued; it stores the offset of the last finished record;
//! - [`pipeline`]: parse, then one transaction per run of valid records
//!   ([`transaction`]: the dedupe row first, then the handler's effect),
//!   retried, dead-lettered and accounted by the [`DeadLetterPolicy`]
//!   ([`policy`]), an unavailable database waited out ([`outage`]);
//! - [`handler`]: the service's part.
//!
//! Around them: the [`record`] type, the failure classes and DLT reasons
//! ([`failure`]), the dead-letter format ([`dlt`]) and its producer, the one
//! retry helper (`service_support::retry`), the database's availability ([`database`]),
//! the DLQ circuit, readiness ([`health`]) and lag metrics.
//!
//! Cancellation is one [`CancellationToken`](tokio_util::sync::CancellationToken) tree: shutdown → consuming
//! (cancelled by the circuit) → one per assignment (cancelled on revoke).

pub mod amqp; // the consumer over RabbitMQ: topology, consuming, dead letters
mod circuit; // the DLQ circuit
mod consumer; // the Kafka consumer assembled and run: settings, poll thread, end
mod database; // whether the database can be reached; the probe
pub mod dlt; // the dead-letter format (header names, encodings) and how to read it back
mod dlt_producer; // publishing dead letters, too-large ones as skeletons
mod failure; // failure classes and DLT reasons
mod handler; // the service's part: parse and apply
mod health; // readiness: every reason the consumer is not doing its job
mod lag; // consumer lag per partition, from watermarks and commits
mod native_headers; // header names read as bytes (rdkafka panics on non-UTF-8)
mod outage; // waiting out an unavailable database, not counted as an attempt
mod outcome; // how a finished record ended
mod partition; // one assigned partition: queue, worker, token
mod pipeline; // a batch: parse, then runs of valid records through the policy
mod policy; // the dead-letter policy: retries, DLT, circuit, accounting
mod poller; // the poll loop on its own thread; rebalance callbacks
pub mod processed; // the dedupe table: claim, withdrawal, retention, migrations
mod record; // a consumed record, owned
mod service; // a service's consumer assembled and run: options to a running consumer
pub mod topics; // start-up checks of the topic and its DLT
mod transaction; // the dedupe rows and the handler's effect in one transaction

pub use circuit::Circuit;
pub use consumer::{ConsumerError, Settings, consumer_settings, run};
pub use database::Database;
pub use dlt::{DeadLetter, DltInfo, REDRIVEN_FROM, decode_header, message_headers};
pub use dlt_producer::{DltProducer, producer_settings};
pub use failure::{DatabaseFailure, DltReason, Failure, InvalidMessage, quote};
pub use handler::{Claimed, Handler, Verdict};
pub use health::Health;
pub use outcome::Outcome;
pub use pipeline::Pipeline;
pub use policy::DeadLetterPolicy;
pub use processed::{Retention, RetentionError, migrator};
pub use record::{Header, Record, escape_invalid_utf8};
pub use service::{
    ConsumerOptions, RabbitMqOptions, ServeError, describe_metrics, serve, wait_for_topics,
};
pub use service_support::retry::{AttemptError, GaveUp, RetryPolicy};

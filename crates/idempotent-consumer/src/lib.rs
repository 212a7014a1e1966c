//! The idempotent consumer: at-least-once delivery from Kafka turned into
//! exactly-once effects in PostgreSQL. It knows no service: a service gives
//! it a [`Handler`] (how to parse a record, how to apply messages inside the
//! transaction it is handed) and the consumer does the rest.
//!
//! What a service brings:
//! - in its database, `mensagem_processada (consumidor text, mensagem_id
//!   uuid, primary key (consumidor, mensagem_id))`: the dedupe rows, inserted
//!   first in the same transaction as the handler's effect; and this
//!   library's own tables ([`migrator`]: the redrive audit);
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
//! [`Pipeline`] of the handler with a [`Database`] (the pool and its
//! availability), a [`RetryPolicy`], a [`DltProducer`] (built with
//! [`producer_settings`]) and a [`Health`] (over a [`Circuit`]), run by
//! [`run`] with [`Settings`] and a client built with [`consumer_settings`].
//!
//! The DLT tools ([`tools`]: `dlt list | show | redrive`) come with it: a
//! service mounts [`tools::DltCommand`] as a subcommand and calls
//! [`tools::run`]. The dead-letter format ([`dlt`]: [`DeadLetter`],
//! [`DltInfo`], [`decode_header`], [`message_headers`], [`REDRIVEN_FROM`])
//! is public for them and for tests.
//!
//! Reading order, as a record flows:
//! - [`poller`]: the poll loop on its own thread hands each record to its
//!   partition's worker and tends the assignments (pauses, restarts);
//! - [`partition`]: one worker per assigned partition, in order, batches of
//!   what is already queued; it stores the offset of the last finished record;
//! - [`pipeline`]: parse, then one transaction per run of valid records
//!   (the dedupe row first, then the handler's effect), retries, the DLT;
//! - [`handler`]: the service's part.
//!
//! Around them: the [`record`] type, the failure classes and DLT reasons
//! ([`failure`]), the dead-letter format ([`dlt`]) and its producer, the one
//! retry helper ([`retry`]), the database's availability ([`database`]),
//! the DLQ circuit, readiness ([`health`]) and lag metrics.
//!
//! Cancellation is one [`CancellationToken`] tree: shutdown → consuming
//! (cancelled by the circuit) → one per assignment (cancelled on revoke).

mod circuit; // the DLQ circuit
mod database; // whether the database can be reached; the probe
pub mod dlt; // the dead-letter format (header names, encodings) and how to read it back
mod dlt_producer; // publishing dead letters, too-large ones as skeletons
mod failure; // failure classes and DLT reasons
mod handler; // the service's part: parse and apply
mod health; // readiness: every reason the consumer is not doing its job
mod lag; // consumer lag per partition, from watermarks and commits
mod native_headers; // header names read as bytes (rdkafka panics on non-UTF-8)
mod partition; // one assigned partition: queue, worker, token
mod pipeline; // a batch: parse, transaction, retries, DLT
mod poller; // the poll loop on its own thread; rebalance callbacks
mod record; // a consumed record, owned
mod retry; // the one retry helper
mod service; // a service's consumer assembled and run: options to a running consumer
pub mod tools; // the DLT tools: dlt list, show, redrive
pub mod topics; // start-up checks of the topic and its DLT; topic retention

use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::Migrator;

use rdkafka::ClientConfig;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use tokio_util::sync::CancellationToken;

pub use circuit::Circuit;
pub use database::Database;
pub use dlt::{DeadLetter, DltInfo, REDRIVEN_FROM, decode_header, message_headers};
pub use dlt_producer::{DltProducer, producer_settings};
pub use failure::{DatabaseFailure, DltReason, Failure, InvalidMessage, quote};
pub use handler::{Claimed, Handler, Verdict};
pub use health::Health;
pub use pipeline::{Outcome, Pipeline};
pub use record::{Header, Record, escape_invalid_utf8};
pub use retry::{AttemptError, GaveUp, RetryPolicy};
pub use service::{ConsumerOptions, ServeError, describe_metrics, serve, wait_for_topics};

/// The consumer's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub topic: String,
    pub group: String,
    /// How long a revoke (or shutdown) waits for the attempt in flight.
    pub revoke_grace: Duration,
    pub lag_interval: Duration,
    /// Records of one partition applied in one transaction at most.
    pub max_batch: usize,
}

/// The librdkafka settings the delivery guarantee depends on: offsets are
/// stored by the workers only after a record is finished, and librdkafka
/// commits what was stored every second, on revoke and on close.
pub fn consumer_settings(
    group: &str,
    client_id: &str,
    session_timeout: Duration,
) -> Vec<(&'static str, String)> {
    vec![
        ("group.id", group.to_owned()),
        ("client.id", client_id.to_owned()),
        ("enable.auto.commit", "true".to_owned()),
        ("enable.auto.offset.store", "false".to_owned()),
        ("auto.commit.interval.ms", "1000".to_owned()),
        ("auto.offset.reset", "earliest".to_owned()),
        (
            "session.timeout.ms",
            session_timeout.as_millis().to_string(),
        ),
    ]
}

#[derive(Debug, thiserror::Error)]
pub enum ConsumerError {
    #[error("cannot create the Kafka consumer")]
    Kafka(#[from] KafkaError),
    #[error("the poll thread could not start")]
    Thread(#[source] std::io::Error),
    #[error("the poll thread panicked")]
    PollThreadPanicked,
}

/// Consumes until `shutdown`: then lets each worker finish the attempt in
/// flight, commits the stored offsets and leaves the group.
pub async fn run<H: Handler>(
    settings: Settings,
    config: ClientConfig,
    pipeline: Pipeline<H>,
    shutdown: CancellationToken,
) -> Result<(), ConsumerError> {
    let pipeline = Arc::new(pipeline);
    let context = poller::Context::new(
        settings.topic.clone(),
        pipeline.consuming.clone(),
        settings.revoke_grace,
        tokio::runtime::Handle::current(),
    );
    let consumer: Arc<poller::KafkaConsumer> = Arc::new(config.create_with_context(context)?);
    consumer.subscribe(&[&settings.topic])?;
    tracing::info!(topic = %settings.topic, group = %settings.group, "consumer started");
    let lag = tokio::spawn(lag::sample(
        Arc::clone(&consumer),
        settings.lag_interval,
        shutdown.clone(),
    ));
    let probe = tokio::spawn(Arc::clone(&pipeline.database).probe(shutdown.clone()));

    let poller = poller::Poller {
        consumer,
        pipeline,
        max_batch: settings.max_batch,
        shutdown: shutdown.clone(),
    };
    let (done, finished) = tokio::sync::oneshot::channel();
    let runtime = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("kafka-poll".to_owned())
        .spawn(move || {
            poller.run();
            // The lag sampler holds the consumer too: it ends first, so that
            // the last reference drops here. Closing the consumer blocks
            // (final commit, LeaveGroup, the revoke callback), which must not
            // happen on a runtime thread.
            let _ = runtime.block_on(lag);
            drop(poller);
            let _ = done.send(());
        })
        .map_err(ConsumerError::Thread)?;
    let result = finished
        .await
        .map_err(|_| ConsumerError::PollThreadPanicked);
    // The poll thread stopping for any reason stops the service.
    shutdown.cancel();
    let _ = probe.await;
    result
}

/// This library's tables (`migrations/consumer`: the redrive audit), for a
/// service to apply after its own set; tolerant of the other sets' versions
/// in the database's one history table.
pub fn migrator() -> Migrator {
    let mut migrator = sqlx::migrate!("../../migrations/consumer");
    migrator.set_ignore_missing(true);
    migrator
}

//! Publishing dead letters: to the DLT partition of the source's number
//! (or, over RabbitMQ, to the queue's dead-letter exchange: [`crate::amqp`]),
//! waiting for the broker's acknowledgement, until it comes. A dead letter
//! the broker refuses as too large is sent again as its skeleton, so no
//! record can hold its partition for ever. After every failed attempt the
//! producer, shared by all partitions, is rebuilt with a fresh producer id
//! (`service_support::producer`): an idempotent producer whose deliveries
//! timed out bumps its epoch, which some brokers then refuse for good.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::FutureRecord;
use rdkafka::types::RDKafkaErrorCode;
use service_support::producer::{Generation, RebuildableProducer};
use tokio_util::sync::CancellationToken;

use super::amqp::DeadLetterExchange;
use super::dlt::DeadLetter;
use super::failure::Failure;
use super::health::Health;
use super::record::Record;
use service_support::retry::{AttemptError, GaveUp, RetryPolicy};

/// How long one send may wait to be enqueued when librdkafka's queue is full.
const QUEUE_WAIT: Duration = Duration::from_secs(5);

/// How often a send waiting on a full queue tries again.
const QUEUE_POLL: Duration = Duration::from_millis(100);

/// The producer's settings: idempotent, acknowledged by every in-sync
/// replica, and a delivery timeout of 30 s so that a broker that will not
/// take a dead letter shows (as a failed attempt: counted, logged, readiness)
/// within 30 s rather than librdkafka's default 5 minutes. Revoke and
/// shutdown do not wait for it: they cancel the publish.
pub fn producer_settings() -> Vec<(&'static str, String)> {
    vec![
        ("enable.idempotence", "true".to_owned()),
        ("acks", "all".to_owned()),
        ("message.timeout.ms", "30000".to_owned()),
    ]
}

/// Where dead letters go. Clones (one per partition worker) share one
/// producer, so that a rebuild serves every partition at once.
#[derive(Clone)]
pub struct DltProducer {
    sink: Sink,
    /// The consumer group, for `kafka_dlt-original-consumer-group`.
    group: String,
    health: Health,
}

#[derive(Clone)]
enum Sink {
    Kafka {
        producer: Arc<RebuildableProducer>,
        topic: String,
    },
    Amqp(Arc<DeadLetterExchange>),
}

impl std::fmt::Debug for DltProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let destination = match &self.sink {
            Sink::Kafka { topic, .. } => topic.as_str(),
            Sink::Amqp(exchange) => exchange.name(),
        };
        f.debug_struct("DltProducer")
            .field("destination", &destination)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

/// Why a dead letter was not published.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Amqp(#[from] crate::amqp::PublishError),
}

impl SendError {
    /// The broker refuses the message for its size: its skeleton goes.
    fn is_too_large(&self) -> bool {
        match self {
            Self::Kafka(error) => matches!(
                error.rdkafka_error_code(),
                Some(
                    RDKafkaErrorCode::MessageSizeTooLarge
                        | RDKafkaErrorCode::MessageBatchTooLarge
                        | RDKafkaErrorCode::InvalidRecord
                )
            ),
            Self::Amqp(error) => error.is_too_large(),
        }
    }
}

impl DltProducer {
    /// A producer of dead letters to `topic`, built from `config` (the
    /// client settings with [`producer_settings`] on top) and rebuilt from
    /// it after failures; `health` shows the partitions whose dead letter
    /// fails to publish.
    pub fn new(
        config: ClientConfig,
        topic: impl Into<String>,
        group: impl Into<String>,
        health: Health,
    ) -> Result<Self, KafkaError> {
        Ok(Self {
            sink: Sink::Kafka {
                producer: Arc::new(RebuildableProducer::new(config)?),
                topic: topic.into(),
            },
            group: group.into(),
            health,
        })
    }

    /// A producer of dead letters to a RabbitMQ dead-letter exchange.
    pub fn amqp(exchange: DeadLetterExchange, group: impl Into<String>, health: Health) -> Self {
        Self {
            sink: Sink::Amqp(Arc::new(exchange)),
            group: group.into(),
            health,
        }
    }

    /// Publishes `source`'s dead letter and waits for the acknowledgement,
    /// retrying with a capped backoff; `false` if `cancel` came first.
    pub async fn publish(
        &self,
        source: &Record,
        failure: &Failure,
        cancel: &CancellationToken,
    ) -> bool {
        let policy = RetryPolicy::forever(Duration::from_millis(200), Duration::from_secs(30));
        let skeleton = AtomicBool::new(false);
        // Settles the partition's readiness however this ends: published,
        // cancelled, or the future dropped.
        let failing = Failing {
            health: &self.health,
            partition: source.partition,
        };
        let sent = policy
            .run(cancel, |_| async {
                let letter = if skeleton.load(Ordering::Relaxed) {
                    DeadLetter::skeleton(source, &self.group, failure)
                } else {
                    DeadLetter::of(source, &self.group, failure)
                };
                match self.send(&letter).await {
                    Ok(()) => Ok(()),
                    Err(error) => {
                        metrics::counter!("consumer_dlt_publish_failures_total").increment(1);
                        if error.is_too_large() && !skeleton.load(Ordering::Relaxed) {
                            tracing::warn!(error.message = %error, bytes = source.size(),
                                "the dead letter is too large for the broker: sending it without its value");
                            metrics::counter!("consumer_dlt_truncated_total").increment(1);
                            skeleton.store(true, Ordering::Relaxed);
                        } else {
                            failing.mark();
                        }
                        Err(AttemptError::Failed(error))
                    }
                }
            })
            .await;
        match sent {
            Ok(()) => {
                tracing::warn!(
                    reason = failure.reason.as_str(),
                    attempts = failure.attempts,
                    truncated = skeleton.load(Ordering::Relaxed),
                    "record sent to the DLT"
                );
                true
            }
            Err(GaveUp::Cancelled | GaveUp::Exhausted { .. }) => false,
        }
    }

    /// Sends `letter` and waits for its acknowledgement.
    async fn send(&self, letter: &DeadLetter) -> Result<(), SendError> {
        match &self.sink {
            Sink::Kafka { producer, topic } => Ok(send_kafka(producer, topic, letter).await?),
            Sink::Amqp(exchange) => Ok(exchange.publish(letter).await?),
        }
    }
}

/// Sends `letter` to `topic` and waits for its acknowledgement; a failure
/// rebuilds the producer it was handed to.
async fn send_kafka(
    producer: &RebuildableProducer,
    topic: &str,
    letter: &DeadLetter,
) -> Result<(), KafkaError> {
    let headers = letter.headers.iter().fold(
        OwnedHeaders::new_with_capacity(letter.headers.len()),
        |headers, (name, value)| {
            headers.insert(KafkaHeader {
                key: name,
                value: value.as_deref(),
            })
        },
    );
    let mut record = FutureRecord::<[u8], [u8]>::to(topic)
        .partition(letter.partition)
        .headers(headers);
    if let Some(key) = &letter.key {
        record = record.key(key.as_slice());
    }
    if let Some(value) = &letter.value {
        record = record.payload(value.as_slice());
    }
    let queue_wait_ends = Instant::now() + QUEUE_WAIT;
    let (delivery, generation) = loop {
        // The generation a failure to enqueue rebuilds: read before the
        // attempt, so that a producer replaced meanwhile is not rebuilt
        // again.
        let generation = producer.generation();
        match producer.send_result(record) {
            Ok(sent) => break sent,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned))
                if Instant::now() < queue_wait_ends =>
            {
                record = returned;
                tokio::time::sleep(QUEUE_POLL).await;
            }
            Err((error, _)) => return Err(failed(producer, error, generation)),
        }
    };
    match delivery.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((error, _))) => Err(failed(producer, error, generation)),
        // The producer was dropped with the record in it: rebuilt
        // after another partition's failure.
        Err(_canceled) => Err(KafkaError::Canceled),
    }
}

/// Rebuilds the producer that failed (unless another partition's failure
/// did already) and hands the error back.
fn failed(producer: &RebuildableProducer, error: KafkaError, generation: Generation) -> KafkaError {
    let fatal = producer.fatal_error();
    if producer.rebuild(generation) {
        metrics::counter!("consumer_dlt_producer_rebuilds_total").increment(1);
        match fatal {
            Some((code, reason)) => tracing::error!(?code, %reason,
                    "fatal error of the dead-letter producer; rebuilt it"),
            None => tracing::info!(error.message = %error,
                    "rebuilt the dead-letter producer after a failed send"),
        }
    }
    error
}

/// Marks a partition's dead letter failing in readiness while it retries,
/// and clears the mark when dropped.
struct Failing<'a> {
    health: &'a Health,
    partition: i32,
}

impl Failing<'_> {
    fn mark(&self) {
        self.health.dlt_failing(self.partition);
    }
}

impl Drop for Failing<'_> {
    fn drop(&mut self) {
        self.health.dlt_settled(self.partition);
    }
}

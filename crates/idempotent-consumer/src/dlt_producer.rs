//! Publishing dead letters: to the DLT partition of the source's number,
//! waiting for the broker's acknowledgement, until it comes. A dead letter
//! the broker refuses as too large is sent again as its skeleton, so no
//! record can hold its partition for ever.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use tokio_util::sync::CancellationToken;

use super::dlt::DeadLetter;
use super::failure::Failure;
use super::health::Health;
use super::record::Record;
use super::retry::{AttemptError, GaveUp, RetryPolicy};

/// How long one send may wait to be enqueued when librdkafka's queue is full.
const QUEUE_WAIT: Duration = Duration::from_secs(5);

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

/// Where dead letters go.
#[derive(Clone)]
pub struct DltProducer {
    pub producer: FutureProducer,
    pub topic: String,
    /// The consumer group, for `kafka_dlt-original-consumer-group`.
    pub group: String,
    pub health: Health,
}

impl std::fmt::Debug for DltProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DltProducer")
            .field("topic", &self.topic)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

fn is_too_large(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::MessageBatchTooLarge
                | RDKafkaErrorCode::InvalidRecord
        )
    )
}

impl DltProducer {
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
                        if is_too_large(&error) && !skeleton.load(Ordering::Relaxed) {
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

    async fn send(&self, letter: &DeadLetter) -> Result<(), KafkaError> {
        let headers = letter.headers.iter().fold(
            OwnedHeaders::new_with_capacity(letter.headers.len()),
            |headers, (name, value)| {
                headers.insert(KafkaHeader {
                    key: name,
                    value: value.as_deref(),
                })
            },
        );
        let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic)
            .partition(letter.partition)
            .headers(headers);
        if let Some(key) = &letter.key {
            record = record.key(key.as_slice());
        }
        if let Some(value) = &letter.value {
            record = record.payload(value.as_slice());
        }
        self.producer
            .send(record, QUEUE_WAIT)
            .await
            .map(drop)
            .map_err(|(error, _)| error)
    }
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

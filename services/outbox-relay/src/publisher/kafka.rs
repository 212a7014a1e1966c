//! Sends a batch of rows to Kafka and reports, per row, what happened.
//!
//! The producer is idempotent with `acks=all`, so a row counts as published
//! only once every in-sync replica has it, and librdkafka's own retries
//! neither duplicate nor reorder records within a partition.

use std::borrow::Borrow;
use std::time::{Duration, Instant};

use futures::future::join_all;
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use service_support::kafka::{Owned, PassthroughError};
use service_support::producer::{Generation, RebuildableProducer};
use service_support::telemetry;

use super::{Outcome, Position, record_failure, route};
use crate::record::{OutboxRow, Router};

/// The producer span of one row: a child of the context its writer stored
/// (a root when there is none), closed once the batch's delivery reports
/// are in. When traces are recorded, its context is what the record carries.
fn producer_span(row: &OutboxRow, topic: &str) -> tracing::Span {
    let span = tracing::info_span!(
        parent: None,
        "publish",
        otel.name = %format_args!("{topic} publish"),
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "kafka",
        messaging.operation.type = "send",
        messaging.destination.name = topic,
        messaging.message.id = %row.id,
        messaging.kafka.message.key = row.aggregateid.as_str(),
        messaging.destination.partition.id = tracing::field::Empty,
        messaging.kafka.offset = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    telemetry::continue_trace(&span, || row.stored_trace());
    span
}

/// How a failed delivery is treated.
fn classify(error: &KafkaError) -> Outcome {
    use RDKafkaErrorCode::*;
    let message = error.to_string();
    match error.rdkafka_error_code() {
        Some(
            MessageSizeTooLarge | InvalidMessageSize | InvalidMessage | InvalidRecord
            | MessageBatchTooLarge | InvalidTopic,
        ) => Outcome::Poison(message),
        _ => Outcome::Transient(message),
    }
}

/// The properties the lease and the send fence rest on (leadership.rs): a
/// record is dropped, never sent, once `--delivery-timeout` has passed.
const FENCE: Owned = Owned {
    properties: &["message.timeout.ms", "delivery.timeout.ms"],
    option: "--delivery-timeout",
    reason: "the relay's lease and send fence rest on it",
};

/// What a relay's Kafka configuration may not be.
#[derive(Debug, thiserror::Error)]
pub enum ClientConfigError {
    #[error(transparent)]
    Passthrough(#[from] PassthroughError),
    #[error(
        "{variable} would set the librdkafka property {property} to {value}, not less than --delivery-timeout ({timeout:?}): every record would time out before it is sent (unset {variable}, or raise --delivery-timeout)"
    )]
    Linger {
        variable: String,
        property: &'static str,
        value: String,
        timeout: Duration,
    },
    #[error(
        "the producer's effective message.timeout.ms is {effective}, not --delivery-timeout ({expected} ms): the send fence would not hold"
    )]
    Timeout { effective: String, expected: u128 },
    #[error("cannot read the producer configuration back from librdkafka")]
    ReadBack(#[source] KafkaError),
}

/// The relay's producer configuration: its settings, then the `KAFKA_*`
/// variables, which may tune anything but what the delivery guarantees and
/// the send fence rest on. What the fence needs is read back from
/// librdkafka's effective configuration, so no alias can slip past.
pub fn client_config(
    bootstrap_servers: &str,
    delivery_timeout: Duration,
) -> Result<ClientConfig, ClientConfigError> {
    let settings = producer_settings(delivery_timeout);
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let config =
        service_support::kafka::client_config_owning(bootstrap_servers, &settings, &[FENCE])?;
    let native = config
        .create_native_config()
        .map_err(ClientConfigError::ReadBack)?;
    let read = |property: &str| native.get(property).map_err(ClientConfigError::ReadBack);
    let expected = delivery_timeout.as_millis();
    let effective = read("message.timeout.ms")?;
    if effective.parse::<u128>().ok() != Some(expected) {
        return Err(ClientConfigError::Timeout {
            effective,
            expected,
        });
    }
    let linger = read("queue.buffering.max.ms")?;
    let lingers_ms = linger.parse::<f64>().unwrap_or(f64::INFINITY);
    if lingers_ms >= delivery_timeout.as_secs_f64() * 1000.0 {
        // Only a variable can have set it (the relay's own 5 ms is below
        // the shortest --delivery-timeout), under one name or the other.
        let property = if config.get("queue.buffering.max.ms").is_some() {
            "queue.buffering.max.ms"
        } else {
            "linger.ms"
        };
        return Err(ClientConfigError::Linger {
            variable: format!("KAFKA_{}", property.to_ascii_uppercase().replace('.', "_")),
            property,
            value: linger,
            timeout: delivery_timeout,
        });
    }
    Ok(config)
}

/// The relay's producer settings; `KAFKA_*` variables may override some
/// ([`client_config`]).
pub fn producer_settings(delivery_timeout: Duration) -> Vec<(&'static str, String)> {
    vec![
        ("enable.idempotence", "true".to_owned()),
        ("acks", "all".to_owned()),
        // The Java client's partitioner, which Kafka Connect (and so
        // Debezium) uses: a key lands on the same partition from either relay.
        ("partitioner", "murmur2_random".to_owned()),
        (
            "message.timeout.ms",
            delivery_timeout.as_millis().to_string(),
        ),
        ("linger.ms", "5".to_owned()),
    ]
}

#[derive(Debug, thiserror::Error)]
#[error("cannot create the Kafka producer")]
pub struct ProducerError(#[from] KafkaError);

pub struct Publisher {
    producer: RebuildableProducer,
}

/// A batch handed to the producer, its delivery reports still to come.
/// Owns its delivery futures: it holds no reference to the producer.
pub struct Sent {
    /// Rows that failed before they were handed over, or were withheld.
    outcomes: Vec<Option<Outcome>>,
    /// The rest: position in the batch, delivery report, producer span.
    pending: Vec<(usize, DeliveryFuture, tracing::Span)>,
    /// The producer they were handed to.
    generation: Generation,
}

impl std::fmt::Debug for Sent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sent")
            .field("in_flight", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl Sent {
    async fn reports(self) -> Vec<Outcome> {
        let Self {
            mut outcomes,
            pending,
            generation: _,
        } = self;
        let (indices, in_flight): (Vec<usize>, Vec<_>) = pending
            .into_iter()
            .map(|(i, delivery, span)| (i, (delivery, span)))
            .unzip();
        let (deliveries, spans): (Vec<_>, Vec<_>) = in_flight.into_iter().unzip();
        let reports = join_all(deliveries).await;
        for ((i, report), span) in indices.into_iter().zip(reports).zip(spans) {
            let outcome = match report {
                Ok(Ok(delivery)) => {
                    span.record("messaging.destination.partition.id", delivery.partition);
                    span.record("messaging.kafka.offset", delivery.offset);
                    Outcome::Published(Some(Position {
                        partition: delivery.partition,
                        offset: delivery.offset,
                    }))
                }
                Ok(Err((error, _))) => classify(&error),
                Err(_canceled) => {
                    Outcome::Transient("the producer dropped the delivery".to_owned())
                }
            };
            record_failure(&span, &outcome);
            outcomes[i] = Some(outcome);
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or(Outcome::Transient("no outcome".to_owned())))
            .collect()
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

impl Publisher {
    pub fn new(config: ClientConfig) -> Result<Self, ProducerError> {
        Ok(Self {
            producer: RebuildableProducer::new(config)?,
        })
    }

    /// Waits for the delivery reports of `rows`, handed over by
    /// [`Self::send`], and returns one outcome per row, in order. Another
    /// batch may be in flight meanwhile: if this one failed, the producer
    /// is rebuilt under it, and its records fail as transient (nothing is
    /// lost: they are retried); that batch's failure then finds its
    /// producer replaced already and replaces nothing.
    pub async fn settle<R: Borrow<OutboxRow>>(
        &mut self,
        rows: &[R],
        sent: Sent,
        send_by: Instant,
    ) -> Vec<Outcome> {
        let generation = sent.generation;
        let mut outcomes = sent.reports().await;
        // A broker rejects a size violation for a whole produce request, so
        // the poison row's neighbours fail with it. Resend each such row
        // alone: only the real culprits keep their poison outcome.
        let poisoned: Vec<usize> = (0..rows.len())
            .filter(|&i| matches!(outcomes[i], Outcome::Poison(_)))
            .collect();
        if poisoned.len() > 1 {
            for i in poisoned {
                let single = self.send(std::slice::from_ref(&rows[i]), send_by).await;
                outcomes[i] = single
                    .reports()
                    .await
                    .into_iter()
                    .next()
                    .unwrap_or(Outcome::Transient("no outcome".into()));
            }
        }
        if let Some((code, reason)) = self.producer.fatal_error() {
            tracing::error!(?code, %reason, "fatal producer error; rebuilding the producer");
            self.rebuild(self.producer.generation());
        } else if outcomes.iter().any(|o| matches!(o, Outcome::Transient(_))) {
            // After failed deliveries librdkafka would bump the idempotent
            // producer's epoch (KIP-360) and carry on. Not every
            // Kafka-protocol broker handles that bump (tansu 0.6 rejects
            // every later produce), while a fresh producer id works on all
            // of them; nothing is lost, as unacknowledged rows are retried.
            if self.rebuild(generation) {
                tracing::info!("rebuilt the producer after failed deliveries");
            }
        }
        outcomes
    }

    /// Hands `rows` to the producer in order, without waiting for their
    /// delivery reports ([`Self::settle`] does); a row not handed over by
    /// `send_by` is withheld, and so are the rows after it.
    pub async fn send<R: Borrow<OutboxRow>>(&self, rows: &[R], send_by: Instant) -> Sent {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; rows.len()];
        let mut pending = Vec::with_capacity(rows.len());
        let mut router = Router::default();
        // Nothing replaces the producer while `&self` is borrowed here.
        let generation = self.producer.generation();
        for (i, row) in rows.iter().map(Borrow::borrow).enumerate() {
            if Instant::now() >= send_by {
                outcomes[i..].fill(Some(Outcome::Withheld));
                break;
            }
            let topic = match route(&mut router, row, producer_span) {
                Ok(topic) => topic,
                Err(poison) => {
                    outcomes[i] = Some(poison);
                    continue;
                }
            };
            let span = producer_span(row, topic);
            let context = telemetry::recorded(&span);
            let record = row.to_record(topic, context.as_ref());
            let headers = record
                .headers()
                .fold(OwnedHeaders::new(), |headers, (key, value)| {
                    headers.insert(Header { key, value })
                });
            let mut future_record = FutureRecord::to(record.topic)
                .key(record.key)
                .payload(record.value.as_slice())
                .headers(headers);
            // Enqueue; a full local queue is back-pressure: wait and retry.
            let delivery = loop {
                match self.producer.send_result(future_record) {
                    Ok((delivery, _generation)) => break Ok(delivery),
                    Err((error, returned))
                        if error.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) =>
                    {
                        if Instant::now() >= send_by {
                            break Err(None);
                        }
                        future_record = returned;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((error, _)) => break Err(Some(error)),
                }
            };
            match delivery {
                Ok(delivery) => pending.push((i, delivery, span)),
                Err(Some(error)) => {
                    let outcome = classify(&error);
                    record_failure(&span, &outcome);
                    outcomes[i] = Some(outcome);
                }
                Err(None) => {
                    record_failure(&span, &Outcome::Withheld);
                    outcomes[i..].fill(Some(Outcome::Withheld));
                    break;
                }
            }
        }
        metrics::counter!("relay_records_sent_total").increment(pending.len() as u64);
        Sent {
            outcomes,
            pending,
            generation,
        }
    }

    /// Replaces the producer. A fatal error ends an idempotent producer for
    /// good; unacknowledged rows stay unpublished and go out again with the
    /// new one. Only `failed` is replaced: true if this call replaced it.
    fn rebuild(&mut self, failed: Generation) -> bool {
        let rebuilt = self.producer.rebuild(failed);
        if rebuilt {
            metrics::counter!("relay_producer_rebuilds_total").increment(1);
        }
        rebuilt
    }

    /// Waits up to `timeout` for queued records to be delivered.
    pub fn flush(&self, timeout: Duration) {
        if let Err(error) = self.producer.flush(timeout) {
            tracing::warn!(%error, "records still queued at shutdown");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_size_and_record_errors_are_the_rows_fault() {
        let poison = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert!(matches!(classify(&poison), Outcome::Poison(_)));
        for transient in [
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::NotEnoughReplicas,
            RDKafkaErrorCode::RequestTimedOut,
            RDKafkaErrorCode::UnknownTopic,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::ClusterAuthorizationFailed,
        ] {
            let error = KafkaError::MessageProduction(transient);
            assert!(
                matches!(classify(&error), Outcome::Transient(_)),
                "{transient:?}"
            );
        }
    }
}

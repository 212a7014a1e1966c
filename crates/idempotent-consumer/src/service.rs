//! A service's consumer assembled from its options and run: the one way
//! every service starts its consumer, so that each brings only a handler.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use service_support::kafka::PassthroughError;
use tokio_util::sync::CancellationToken;

use super::amqp::{self, AmqpSettings, DeadLetterExchange};
use super::consumer::{ConsumerError, Settings, consumer_settings, run};
use super::dlt_producer::{DltProducer, producer_settings};
use super::failure::DltReason;
use super::handler::Handler;
use super::health::Health;
use super::pipeline::Pipeline;
use super::policy::DeadLetterPolicy;
use super::processed::{self, Retention, RetentionError};
use super::topics::{self, TopicError};
use service_support::amqp::{AmqpError, AmqpUrl};
use service_support::retry::{self, RetryPolicy};

/// What a service decides about its consumer.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// Kafka bootstrap servers; `KAFKA_*` variables add librdkafka settings.
    pub bootstrap_servers: String,
    pub topic: String,
    /// At least as many partitions as `topic`: a dead letter keeps its
    /// partition number.
    pub dlt_topic: String,
    pub group: String,
    /// Records of one partition applied in one transaction at most.
    pub batch_size: usize,
    /// Retries of a message-scoped transient failure before the DLT.
    pub retries: u32,
    pub retry_backoff: Duration,
    pub session_timeout: Duration,
    /// How long a revoke (or shutdown) waits for the attempt in flight.
    pub revoke_grace: Duration,
    /// How long the dedupe rows are kept: checked against the topic's
    /// retention at start-up when `retention_every` is set.
    pub retention: Retention,
    /// Purge the dedupe rows this often while serving; `None`: never.
    pub retention_every: Option<Duration>,
    /// Consume from RabbitMQ instead of Kafka: `topic` names the exchange.
    pub rabbitmq: Option<RabbitMqOptions>,
}

/// A consumer's RabbitMQ side (`crate::amqp`).
#[derive(Debug, Clone)]
pub struct RabbitMqOptions {
    pub url: AmqpUrl,
    /// The consumer's quorum queue (`estoque.reserva`).
    pub queue: String,
    /// Messages delivered and not yet acknowledged, at most.
    pub prefetch: u16,
    /// Deliveries of one message before the broker dead-letters it.
    pub delivery_limit: u32,
}

impl ConsumerOptions {
    /// The client settings of every Kafka client of this consumer, with
    /// `settings` on top; refused when a `KAFKA_*` variable is not a valid,
    /// unprotected librdkafka property.
    pub fn kafka_config(
        &self,
        settings: &[(&str, String)],
    ) -> Result<ClientConfig, PassthroughError> {
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        service_support::kafka::client_config(&self.bootstrap_servers, &settings)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid Kafka client configuration")]
    Kafka(#[from] KafkaError),
    #[error(transparent)]
    Passthrough(#[from] PassthroughError),
    #[error("the topics are not usable")]
    Topics(#[from] TopicError),
    #[error("the consumer failed")]
    Consumer(#[from] ConsumerError),
    #[error("the processed-table retention is not safe")]
    Retention(#[from] RetentionError),
    #[error("RabbitMQ is not usable")]
    RabbitMq(#[from] AmqpError),
}

/// Waits for the topics, then consumes with `handler` until `shutdown`
/// (see [`run`]), purging old dedupe rows beside it when asked to.
/// `health` is the one the service's readiness reads.
pub async fn serve<H: Handler>(
    handler: H,
    options: &ConsumerOptions,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    if let Some(rabbitmq) = &options.rabbitmq {
        return serve_rabbitmq(handler, options, rabbitmq, health, shutdown).await;
    }
    if !wait_for_topics(options, &shutdown).await? {
        return Ok(());
    }
    let dlt = DltProducer::new(
        options.kafka_config(&producer_settings())?,
        &options.dlt_topic,
        &options.group,
        health.clone(),
    )?;
    let consumer_name = handler.consumer_name();
    let pipeline = pipeline(handler, options, dlt, health, &shutdown);
    let settings = Settings {
        topic: options.topic.clone(),
        group: options.group.clone(),
        revoke_grace: options.revoke_grace,
        lag_interval: Duration::from_secs(5),
        max_batch: options.batch_size,
    };
    let config = options.kafka_config(&consumer_settings(
        &options.group,
        consumer_name,
        options.session_timeout,
    ))?;
    let purging = shutdown.child_token();
    let purge = match options.retention_every {
        Some(every) => {
            // Refused before anything is consumed: an unsafe window would
            // let a late redelivery apply twice.
            options
                .retention
                .check(&options.kafka_config(&[])?, &options.topic)
                .await?;
            Some(tokio::spawn(processed::purge_every(
                pipeline.policy.health.database().pool().clone(),
                consumer_name,
                every,
                options.retention.keep,
                purging.clone(),
            )))
        }
        None => None,
    };
    let consumed = run(settings, config, pipeline, shutdown).await;
    purging.cancel();
    if let Some(purge) = purge {
        let _ = purge.await;
    }
    Ok(consumed?)
}

/// [`serve`] over RabbitMQ: the same pipeline, fed from a quorum queue, its
/// dead letters to the queue's dead-letter exchange. The retention check
/// has no counterpart: a queue keeps a message until it is consumed, so no
/// window covers every redelivery (docs/rabbitmq.md).
async fn serve_rabbitmq<H: Handler>(
    handler: H,
    options: &ConsumerOptions,
    rabbitmq: &RabbitMqOptions,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let settings = AmqpSettings {
        url: rabbitmq.url.clone(),
        exchange: options.topic.clone(),
        queue: rabbitmq.queue.clone(),
        prefetch: rabbitmq.prefetch,
        delivery_limit: rabbitmq.delivery_limit,
        max_batch: options.batch_size,
    };
    let dlt = DltProducer::amqp(
        DeadLetterExchange::new(rabbitmq.url.clone(), settings.dead_letter_exchange()),
        &options.group,
        health.clone(),
    );
    let consumer_name = handler.consumer_name();
    let pipeline = pipeline(handler, options, dlt, health, &shutdown);
    let purging = shutdown.child_token();
    let purge = options.retention_every.map(|every| {
        tokio::spawn(processed::purge_every(
            pipeline.policy.health.database().pool().clone(),
            consumer_name,
            every,
            options.retention.keep,
            purging.clone(),
        ))
    });
    let consumed = amqp::run(settings, pipeline, shutdown).await;
    purging.cancel();
    if let Some(purge) = purge {
        let _ = purge.await;
    }
    Ok(consumed?)
}

/// The handler with the dead-letter policy `options` describe; consuming
/// stops with `shutdown`.
fn pipeline<H: Handler>(
    handler: H,
    options: &ConsumerOptions,
    dlt: DltProducer,
    health: Health,
    shutdown: &CancellationToken,
) -> Pipeline<H> {
    Pipeline {
        handler,
        policy: DeadLetterPolicy {
            retry: RetryPolicy::fixed(options.retries, options.retry_backoff),
            dlt,
            health,
            consuming: shutdown.child_token(),
        },
    }
}

/// Checks the topic and its DLT, retrying while the broker is unreachable;
/// false if shutdown came first.
pub async fn wait_for_topics(
    options: &ConsumerOptions,
    shutdown: &CancellationToken,
) -> Result<bool, ServeError> {
    let config = options.kafka_config(&[])?;
    let mut backoff =
        RetryPolicy::forever(Duration::from_millis(200), Duration::from_secs(5)).backoff();
    loop {
        let (config, topic, dlt) = (
            config.clone(),
            options.topic.clone(),
            options.dlt_topic.clone(),
        );
        let checked = tokio::task::spawn_blocking(move || topics::check(&config, &topic, &dlt))
            .await
            .unwrap_or_else(|_| Err(TopicError::Missing(options.topic.clone())));
        match checked {
            Ok((source, dlt)) => {
                tracing::info!(topic = %options.topic, source_partitions = source, dlt_partitions = dlt, "topics checked");
                return Ok(true);
            }
            Err(error) if error.is_retryable() => {
                tracing::warn!(error.cause_chain = ?error, error.message = %error, "broker not reachable yet; retrying");
                if !retry::sleep(backoff.next_wait(), shutdown).await {
                    return Ok(false);
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Describes the consumer's metrics and creates every counter series at
/// zero, so that rate() and increase() in alerts see the first event
/// instead of a new series. Call once, after installing the recorder.
pub fn describe_metrics() {
    metrics::describe_counter!(
        "consumer_processed_total",
        "Records finished, by outcome: the handler's outcome names, duplicate, dead-lettered"
    );
    metrics::describe_counter!(
        "consumer_duplicates_total",
        "Records whose message id was processed before"
    );
    metrics::describe_counter!("consumer_retries_total", "Retries after transient failures");
    metrics::describe_counter!("consumer_dlt_total", "Records sent to the DLT, by reason");
    metrics::describe_gauge!(
        "consumer_lag",
        "High watermark minus committed offset, per partition"
    );
    metrics::describe_histogram!(
        "consumer_processing_duration_seconds",
        metrics::Unit::Seconds,
        "Time to handle one record, retries and DLT publish included"
    );
    metrics::describe_gauge!("consumer_dlq_circuit_open", "1 once the DLQ circuit opened");
    metrics::describe_gauge!(
        "consumer_assigned_partitions",
        "Partitions this consumer owns"
    );
    metrics::describe_gauge!(
        "consumer_paused_partitions",
        "Owned partitions whose fetching is paused: back-pressure, database unavailable, circuit open, worker restarting"
    );
    metrics::describe_gauge!(
        "consumer_database_available",
        "0 while the database cannot be reached and consumption waits for it"
    );
    metrics::describe_counter!(
        "consumer_worker_restarts_total",
        "Partition workers that died and were restarted from the last stored offset"
    );
    metrics::describe_counter!(
        "consumer_dlt_publish_failures_total",
        "Failed attempts to publish a dead letter (each is retried)"
    );
    metrics::describe_counter!(
        "consumer_dlt_truncated_total",
        "Dead letters too large for the broker, sent without their value"
    );
    metrics::describe_counter!(
        "retention_deleted_total",
        "mensagem_processada rows deleted by retention"
    );
    metrics::describe_counter!(
        "consumer_dlt_producer_rebuilds_total",
        "Dead-letter producers replaced by a fresh one (a new producer id) after a failed publish"
    );
    for reason in DltReason::ALL {
        metrics::counter!("consumer_dlt_total", "reason" => reason.as_str()).absolute(0);
    }
    metrics::counter!("consumer_duplicates_total").absolute(0);
    metrics::counter!("consumer_retries_total").absolute(0);
    metrics::counter!("consumer_dlt_publish_failures_total").absolute(0);
    metrics::counter!("consumer_dlt_truncated_total").absolute(0);
    metrics::counter!("consumer_dlt_producer_rebuilds_total").absolute(0);
    metrics::counter!("consumer_worker_restarts_total").absolute(0);
    metrics::counter!("retention_deleted_total").absolute(0);
    metrics::gauge!("consumer_paused_partitions").set(0.0);
    metrics::gauge!("consumer_dlq_circuit_open").set(0.0);
}

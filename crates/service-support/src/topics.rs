//! What every Kafka client here asks the broker about a topic: whether it
//! exists and with how many partitions, and its settings (retention,
//! `min.insync.replicas`). One error type for all of it: the consumer's
//! start-up checks, the relay's, the tools' and the console's.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::{Client, ClientContext, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    /// Worth retrying: the broker may not be up yet.
    #[error("cannot read topic metadata from the broker")]
    Unreachable(#[source] rdkafka::error::KafkaError),
    /// Not worth retrying: the settings themselves are wrong.
    #[error("invalid Kafka client settings (check the KAFKA_* variables)")]
    Client(#[source] rdkafka::error::KafkaError),
    #[error("topic {0} does not exist")]
    Missing(String),
    #[error(
        "the dead-letter topic {dlt} has {dlt_partitions} partitions, fewer than the {source_partitions} of {source_topic}: \
         a dead letter keeps its partition number, so the DLT needs at least as many; refusing to run"
    )]
    DltTooSmall {
        dlt: String,
        dlt_partitions: usize,
        source_topic: String,
        source_partitions: usize,
    },
    #[error(
        "topic {topic} has {actual} partitions, {expected} are configured; \
         keys would not land where the consumers and Debezium expect"
    )]
    WrongPartitions {
        topic: String,
        actual: usize,
        expected: usize,
    },
    #[error("cannot create topic {topic}: {code}")]
    Create {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("cannot read the configuration of topic {0}")]
    Config(String),
}

impl TopicError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, TopicError::Unreachable(_))
    }
}

/// What the broker says of one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Described {
    pub partitions: usize,
    /// The fewest replicas any of its partitions has.
    pub replication_factor: usize,
}

/// The number of partitions and replicas of `topic`; `Missing` when the
/// broker does not know it (blocking: call off the runtime, or accept a
/// short block at start-up).
pub fn describe<C: ClientContext>(
    client: &Client<C>,
    topic: &str,
) -> Result<Described, TopicError> {
    let metadata = client
        .fetch_metadata(Some(topic), TIMEOUT)
        .map_err(TopicError::Unreachable)?;
    match metadata.topics().iter().find(|t| t.name() == topic) {
        Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(Described {
            partitions: t.partitions().len(),
            replication_factor: t
                .partitions()
                .iter()
                .map(|p| p.replicas().len())
                .min()
                .unwrap_or(0),
        }),
        _ => Err(TopicError::Missing(topic.to_owned())),
    }
}

/// The number of partitions of `topic`.
pub fn partition_count(consumer: &BaseConsumer, topic: &str) -> Result<usize, TopicError> {
    describe(consumer.client(), topic).map(|described| described.partitions)
}

/// The value of the topic setting `name`, as the broker reports it
/// (`None`: not reported).
pub async fn config_value(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    name: &str,
) -> Result<Option<String>, TopicError> {
    let options = AdminOptions::new().request_timeout(Some(TIMEOUT));
    let results = admin
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &options)
        .await
        .map_err(TopicError::Unreachable)?;
    let resource = results
        .into_iter()
        .next()
        .and_then(Result::ok)
        .ok_or_else(|| TopicError::Config(topic.to_owned()))?;
    Ok(resource.get(name).and_then(|entry| entry.value.clone()))
}

/// Kafka's default `log.retention.hours` (168).
const KAFKA_DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3_600);

/// The topic's `retention.ms`; `None` when retention is unlimited (-1). A
/// broker that does not report it is taken to use Kafka's default, 7 days.
pub async fn retention(config: &ClientConfig, topic: &str) -> Result<Option<Duration>, TopicError> {
    let admin: AdminClient<DefaultClientContext> = config.create().map_err(TopicError::Client)?;
    let Some(value) = config_value(&admin, topic, "retention.ms").await? else {
        tracing::warn!(
            topic,
            "the broker does not report retention.ms; assuming Kafka's default of 7 days"
        );
        return Ok(Some(KAFKA_DEFAULT_RETENTION));
    };
    let millis: i64 = value
        .parse()
        .map_err(|_| TopicError::Config(topic.to_owned()))?;
    Ok(u64::try_from(millis).ok().map(Duration::from_millis))
}

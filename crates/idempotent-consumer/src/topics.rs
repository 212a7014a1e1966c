//! Start-up checks of the topics: they exist, and the DLT has at least as
//! many partitions as its source (a dead letter keeps its partition number).

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TopicError {
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
    #[error("cannot read the configuration of topic {0}")]
    Config(String),
}

impl TopicError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, TopicError::Unreachable(_))
    }
}

/// The number of partitions of `topic`.
pub fn partition_count(consumer: &BaseConsumer, topic: &str) -> Result<usize, TopicError> {
    let metadata = consumer
        .fetch_metadata(Some(topic), TIMEOUT)
        .map_err(TopicError::Unreachable)?;
    match metadata.topics().iter().find(|t| t.name() == topic) {
        Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(t.partitions().len()),
        _ => Err(TopicError::Missing(topic.to_owned())),
    }
}

/// Checks the source topic and its DLT (blocking: call off the runtime).
pub fn check(config: &ClientConfig, topic: &str, dlt: &str) -> Result<(usize, usize), TopicError> {
    let consumer: BaseConsumer = config.create().map_err(TopicError::Client)?;
    let source_partitions = partition_count(&consumer, topic)?;
    let dlt_partitions = partition_count(&consumer, dlt)?;
    if dlt_partitions < source_partitions {
        return Err(TopicError::DltTooSmall {
            dlt: dlt.to_owned(),
            dlt_partitions,
            source_topic: topic.to_owned(),
            source_partitions,
        });
    }
    Ok((source_partitions, dlt_partitions))
}

/// Kafka's default `log.retention.hours` (168).
const KAFKA_DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3_600);

/// The topic's `retention.ms`; `None` when retention is unlimited (-1). A
/// broker that does not report it is taken to use Kafka's default, 7 days.
pub async fn retention(config: &ClientConfig, topic: &str) -> Result<Option<Duration>, TopicError> {
    let admin: AdminClient<DefaultClientContext> = config.create().map_err(TopicError::Client)?;
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
    let Some(value) = resource
        .get("retention.ms")
        .and_then(|entry| entry.value.clone())
    else {
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

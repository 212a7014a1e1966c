//! The start-up check that the relay's target topics exist as configured.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
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
    #[error(
        "topic {0} does not exist; create it (6 partitions), or start the relay with --create-topics"
    )]
    Missing(String),
    #[error(
        "topic {topic} has {actual} partitions, the relay is configured for {expected}; \
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
}

impl TopicError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, TopicError::Unreachable(_))
    }
}

/// Checks every topic; with `create`, makes the missing ones first.
pub async fn ensure_topics(
    config: &ClientConfig,
    topics: &[String],
    partitions: usize,
    replication_factor: i32,
    create: bool,
) -> Result<(), TopicError> {
    let admin: AdminClient<DefaultClientContext> = config.create().map_err(TopicError::Client)?;
    if create {
        let partition_count = i32::try_from(partitions).unwrap_or(i32::MAX);
        let new_topics: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|topic| {
                NewTopic::new(
                    topic,
                    partition_count,
                    TopicReplication::Fixed(replication_factor),
                )
            })
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
        let results = admin
            .create_topics(&new_topics, &options)
            .await
            .map_err(TopicError::Unreachable)?;
        for result in results {
            if let Err((topic, code)) = result
                && code != RDKafkaErrorCode::TopicAlreadyExists
            {
                return Err(TopicError::Create { topic, code });
            }
        }
    }
    for topic in topics {
        let metadata = admin
            .inner()
            .fetch_metadata(Some(topic), TIMEOUT)
            .map_err(TopicError::Unreachable)?;
        let described = metadata.topics().iter().find(|t| t.name() == topic);
        let actual = match described {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => t.partitions().len(),
            _ => return Err(TopicError::Missing(topic.clone())),
        };
        if actual != partitions {
            return Err(TopicError::WrongPartitions {
                topic: topic.clone(),
                actual,
                expected: partitions,
            });
        }
    }
    Ok(())
}

//! The start-up check that the relay's target topics exist as configured,
//! and a warning when a topic cannot keep what `acks=all` acknowledged.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
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
        let replication_factor = described
            .map(|t| {
                t.partitions()
                    .iter()
                    .map(|p| p.replicas().len())
                    .min()
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        let min_insync = min_insync_replicas(&admin, topic).await;
        warn_unless_durable(topic, replication_factor, min_insync);
    }
    Ok(())
}

/// The topic's `min.insync.replicas`, if the broker says.
async fn min_insync_replicas(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
) -> Option<usize> {
    let options = AdminOptions::new().request_timeout(Some(TIMEOUT));
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
        .await
        .ok()?;
    let resource = described.into_iter().next()?.ok()?;
    resource
        .get("min.insync.replicas")?
        .value
        .as_ref()?
        .parse()
        .ok()
}

/// `acks=all` waits for the in-sync replicas only: with one replica, or
/// `min.insync.replicas=1`, an acknowledged record can live on one disk,
/// and the relay deletes the row once it is acknowledged. Not refused (a
/// single local broker is a fine place to develop); said, and measured.
fn warn_unless_durable(topic: &str, replication_factor: usize, min_insync: Option<usize>) {
    let durable = replication_factor >= 2 && min_insync.is_some_and(|m| m >= 2);
    metrics::gauge!("relay_topic_durability_unsafe", "topic" => topic.to_owned()).set(if durable {
        0.0
    } else {
        1.0
    });
    if !durable {
        tracing::warn!(
            topic,
            replication_factor,
            min_insync_replicas = ?min_insync,
            "acks=all cannot keep this topic's records through the loss of one broker's disk \
             (it needs a replication factor and min.insync.replicas of at least 2), and \
             published rows are deleted: a record acknowledged here may be lost"
        );
    }
}

//! The start-up check that the relay's target topics exist as configured,
//! and a warning when a topic cannot keep what `acks=all` acknowledged.

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
pub use service_support::topics::TopicError;
use service_support::topics::{Described, config_value, describe, diagnose_blocking};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Checks every topic; with `create`, makes the missing ones first. A
/// broker that refuses the client (TLS, SASL) is a `Refused` error.
pub async fn ensure_topics(
    config: &ClientConfig,
    topics: &[String],
    partitions: usize,
    replication_factor: i32,
    create: bool,
) -> Result<(), TopicError> {
    let admin: AdminClient<DefaultClientContext> = config.create().map_err(TopicError::Client)?;
    match ensure_with(&admin, topics, partitions, replication_factor, create).await {
        Err(TopicError::Unreachable(error)) => Err(diagnose_blocking(config, error).await),
        other => other,
    }
}

async fn ensure_with(
    admin: &AdminClient<DefaultClientContext>,
    topics: &[String],
    partitions: usize,
    replication_factor: i32,
    create: bool,
) -> Result<(), TopicError> {
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
        let Described {
            partitions: actual,
            replication_factor,
        } = describe(admin.inner(), topic)?;
        if actual != partitions {
            return Err(TopicError::WrongPartitions {
                topic: topic.clone(),
                actual,
                expected: partitions,
            });
        }
        let min_insync = min_insync_replicas(admin, topic).await;
        warn_unless_durable(topic, replication_factor, min_insync);
    }
    Ok(())
}

/// The topic's `min.insync.replicas`, if the broker says.
async fn min_insync_replicas(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
) -> Option<usize> {
    config_value(admin, topic, "min.insync.replicas")
        .await
        .ok()??
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

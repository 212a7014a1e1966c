//! The consumer's start-up check of its topics: both exist, and the DLT has
//! at least as many partitions as its source (a dead letter keeps its
//! partition number). What the broker is asked is `service_support::topics`'.

use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use service_support::topics::{Diagnosed, explain};
pub use service_support::topics::{TopicError, partition_count, retention};

/// Checks the source topic and its DLT (blocking: call off the runtime). A
/// broker that refuses the client (TLS, SASL) is a `Refused` error, not one
/// to retry.
pub fn check(config: &ClientConfig, topic: &str, dlt: &str) -> Result<(usize, usize), TopicError> {
    let consumer: BaseConsumer<Diagnosed> = config
        .create_with_context(Diagnosed::new(config))
        .map_err(TopicError::Client)?;
    let diagnose = |error| match error {
        TopicError::Unreachable(error) => explain(&consumer, error),
        other => other,
    };
    let source_partitions = partition_count(&consumer, topic).map_err(diagnose)?;
    let dlt_partitions = partition_count(&consumer, dlt).map_err(diagnose)?;
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

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use time::OffsetDateTime;

use crate::config::DltFilter;
use crate::dlt::{DltInfo, SourceRecord};
use crate::topics;

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Topic(#[from] topics::TopicError),
    #[error("reading the DLT failed")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("the DLT read stopped before reaching its end (no record for {0:?})")]
    Stalled(Duration),
}

/// Reads every record of `dlt` from `start` (per partition; 0 when absent)
/// up to the end each partition had when the read began. Blocking.
pub(super) fn read(
    config: &ClientConfig,
    dlt: &str,
    start: &HashMap<i32, i64>,
) -> Result<Vec<SourceRecord>, ReadError> {
    // librdkafka assigns partitions only under a group id; this one never
    // commits anything.
    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", "estoque.dlt-reader")
        .set("enable.auto.commit", "false")
        .create()?;
    let partitions = topics::partition_count(&consumer, dlt)?;
    let mut ends: HashMap<i32, i64> = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..i32::try_from(partitions).unwrap_or(i32::MAX) {
        let from = start.get(&partition).copied().unwrap_or(0);
        let (_, high) = consumer.fetch_watermarks(dlt, partition, TIMEOUT)?;
        if from < high {
            ends.insert(partition, high);
            assignment.add_partition_offset(dlt, partition, Offset::Offset(from))?;
        }
    }
    let mut records = Vec::new();
    if ends.is_empty() {
        return Ok(records);
    }
    consumer.assign(&assignment)?;
    while !ends.is_empty() {
        let message = match consumer.poll(TIMEOUT) {
            Some(message) => message?,
            None => return Err(ReadError::Stalled(TIMEOUT)),
        };
        let record = SourceRecord::from_message(&message);
        if let Some(end) = ends.get(&record.partition).copied() {
            if record.offset + 1 >= end {
                ends.remove(&record.partition);
            }
            if record.offset < end {
                records.push(record);
            }
        }
    }
    records.sort_by_key(|r| (r.partition, r.offset));
    Ok(records)
}

/// When the record was written to the DLT.
pub(super) fn dead_lettered_at(record: &SourceRecord) -> Option<OffsetDateTime> {
    let millis = record.timestamp.to_millis()?;
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000).ok()
}

/// Whether `record` passes `filter`.
pub(super) fn matches(filter: &DltFilter, record: &SourceRecord) -> bool {
    let info = DltInfo::of(record);
    let at = dead_lettered_at(record);
    filter
        .reason
        .is_none_or(|reason| info.reason.as_deref() == Some(reason.as_str()))
        && filter.partition.is_none_or(|p| p == record.partition)
        && filter.offset.is_none_or(|o| o == record.offset)
        && filter
            .since
            .is_none_or(|since| at.is_some_and(|at| at >= since))
        && filter
            .until
            .is_none_or(|until| at.is_some_and(|at| at < until))
}

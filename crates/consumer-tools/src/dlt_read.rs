//! Reading the DLT from each partition's first record still there (its low
//! watermark) up to the end it had when the read began.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use time::OffsetDateTime;

use crate::cli::DltFilter;
use idempotent_consumer::topics;
use idempotent_consumer::{DltInfo, Record};

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Topic(#[from] topics::TopicError),
    #[error("reading the DLT failed")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("the DLT read stopped before reaching its end (no record for {0:?})")]
    Stalled(Duration),
    #[error("the DLT read was interrupted")]
    Interrupted,
}

/// Records a read wanted that retention had already deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    pub partition: i32,
    /// Where the read wanted to start.
    pub from: i64,
    /// The first record still there.
    pub low_watermark: i64,
}

impl Expired {
    pub fn count(&self) -> i64 {
        self.low_watermark - self.from
    }
}

/// What a read found.
#[derive(Debug, Clone, Default)]
pub struct DltRead {
    /// By partition, then offset.
    pub records: Vec<Record>,
    pub expired: Vec<Expired>,
}

/// Where a read starts.
#[derive(Debug, Clone, Default)]
pub(super) struct From {
    /// Per partition; 0 when absent.
    pub(super) offsets: HashMap<i32, i64>,
    /// Only this partition, when set.
    pub(super) only: Option<i32>,
}

/// Reads every record of `dlt` from `from` (raised to each partition's low
/// watermark, and what that skipped reported as expired) up to the end each
/// partition had when the read began. Blocking.
pub(super) fn read(config: &ClientConfig, dlt: &str, from: &From) -> Result<DltRead, ReadError> {
    // librdkafka assigns partitions only under a group id; this one never
    // commits anything. Should a start still be out of range, `earliest`
    // reads what is there instead of silently jumping to the end.
    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", "estoque.dlt-reader")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    let partitions = topics::partition_count(&consumer, dlt)?;
    let mut read = DltRead::default();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..i32::try_from(partitions).unwrap_or(i32::MAX) {
        if from.only.is_some_and(|only| only != partition) {
            continue;
        }
        let wanted = from.offsets.get(&partition).copied().unwrap_or(0);
        let (low, high) = consumer.fetch_watermarks(dlt, partition, TIMEOUT)?;
        if wanted < low {
            read.expired.push(Expired {
                partition,
                from: wanted,
                low_watermark: low,
            });
        }
        let start = wanted.max(low);
        if start < high {
            ends.insert(partition, high);
            assignment.add_partition_offset(dlt, partition, Offset::Offset(start))?;
        }
    }
    if ends.is_empty() {
        return Ok(read);
    }
    consumer.assign(&assignment)?;
    while !ends.is_empty() {
        let message = match consumer.poll(TIMEOUT) {
            Some(message) => message?,
            None => return Err(ReadError::Stalled(TIMEOUT)),
        };
        let record = Record::from_message(&message);
        if let Some(end) = ends.get(&record.partition).copied() {
            if record.offset + 1 >= end {
                ends.remove(&record.partition);
            }
            if record.offset < end {
                read.records.push(record);
            }
        }
    }
    read.records.sort_by_key(|r| (r.partition, r.offset));
    Ok(read)
}

/// Runs a blocking read off the runtime.
pub(super) async fn read_off_runtime(
    config: ClientConfig,
    dlt: String,
    from: From,
) -> Result<DltRead, ReadError> {
    tokio::task::spawn_blocking(move || read(&config, &dlt, &from))
        .await
        .map_err(|_| ReadError::Interrupted)?
}

/// When the record was written to the DLT.
pub fn dead_lettered_at(record: &Record) -> Option<OffsetDateTime> {
    let millis = record.timestamp.to_millis()?;
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(millis) * 1_000_000).ok()
}

/// Whether `record` passes `filter`.
pub fn matches(filter: &DltFilter, record: &Record) -> bool {
    let info = DltInfo::of(record);
    let at = dead_lettered_at(record);
    filter
        .reason
        .is_none_or(|reason| info.reason.as_deref() == Some(reason.as_str()))
        && filter.partition.is_none_or(|p| p == record.partition)
        && filter
            .key
            .as_deref()
            .is_none_or(|key| record.key.as_deref() == Some(key.as_bytes()))
        && filter.offset.is_none_or(|o| o == record.offset)
        && filter
            .since
            .is_none_or(|since| at.is_some_and(|at| at >= since))
        && filter
            .until
            .is_none_or(|until| at.is_some_and(|at| at < until))
}

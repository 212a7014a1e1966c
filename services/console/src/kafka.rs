//! Reading a partition as it is, without joining or committing for any
//! group: the records of a message wherever they are, the watermarks, a
//! group's committed offsets. Blocking (librdkafka's base consumer): callers
//! run it with [`blocking`].

use std::time::Duration;

use idempotent_consumer::Record;
use idempotent_consumer::topics::{self, TopicError};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use time::OffsetDateTime;

const TIMEOUT: Duration = Duration::from_secs(10);
/// Never commits: librdkafka assigns partitions only with a group id.
const GROUP: &str = "entrega.console";

#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    #[error(transparent)]
    Topic(#[from] TopicError),
    #[error("reading from the broker failed")]
    Kafka(#[from] KafkaError),
    #[error(
        "the read of {topic}[{partition}] stopped at offset {offset} (no record for {TIMEOUT:?})"
    )]
    Stalled {
        topic: String,
        partition: i32,
        offset: i64,
    },
    #[error("the read was interrupted")]
    Interrupted,
}

/// Where a scan starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The first record still there.
    Beginning,
    Offset(i64),
    /// The first record written at or after this time.
    Time(OffsetDateTime),
}

/// What a scan found.
#[derive(Debug, Clone, Default)]
pub struct Scanned {
    /// The records it kept, in offset order.
    pub records: Vec<Record>,
    /// Where it started and where it stopped (exclusive).
    pub from: i64,
    pub to: i64,
    /// The partition's end when the scan began.
    pub end: i64,
}

impl Scanned {
    /// False when the scan stopped at its limit before the partition's end.
    pub fn complete(&self) -> bool {
        self.to >= self.end
    }
}

/// A client that reads without a group's commits.
pub fn reader(config: &ClientConfig) -> Result<BaseConsumer, KafkaError> {
    config
        .clone()
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
}

pub fn partition_count(consumer: &BaseConsumer, topic: &str) -> Result<i32, ScanError> {
    let count = topics::partition_count(consumer, topic)?;
    Ok(i32::try_from(count).unwrap_or(i32::MAX))
}

/// The first offset still there and the offset the next record gets.
pub fn watermarks(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64), ScanError> {
    Ok(consumer.fetch_watermarks(topic, partition, TIMEOUT)?)
}

/// `group`'s committed offset on each partition of `topic` (`None`: none).
pub fn committed(
    config: &ClientConfig,
    group: &str,
    topic: &str,
    partitions: i32,
) -> Result<Vec<Option<i64>>, ScanError> {
    // Asks the group's coordinator (OffsetFetch); does not join the group.
    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut list = TopicPartitionList::new();
    for partition in 0..partitions {
        list.add_partition(topic, partition);
    }
    let committed = consumer.committed_offsets(list, TIMEOUT)?;
    Ok((0..partitions)
        .map(|partition| {
            committed
                .find_partition(topic, partition)
                .and_then(|element| match element.offset() {
                    Offset::Offset(offset) => Some(offset),
                    _ => None,
                })
        })
        .collect())
}

/// The offset of the first record at or after `at`; `end` if none is.
fn offset_at(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    at: OffsetDateTime,
    end: i64,
) -> Result<Option<i64>, ScanError> {
    let millis = i64::try_from(at.unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(topic, partition, Offset::Offset(millis))?;
    let found = consumer.offsets_for_times(list, TIMEOUT)?;
    Ok(found
        .find_partition(topic, partition)
        .and_then(|element| match element.offset() {
            Offset::Offset(offset) => Some(offset),
            // No record that late: nothing to read.
            Offset::End => Some(end),
            _ => None,
        }))
}

/// Reads `topic`[`partition`] with `consumer` (a [`reader`], which one
/// caller uses for all its scans) from `start` to the end it had when the
/// scan began, at most `limit` records, keeping those `keep` wants.
pub fn scan(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    start: Start,
    limit: u32,
    keep: &dyn Fn(&Record) -> bool,
) -> Result<Scanned, ScanError> {
    let (low, end) = watermarks(consumer, topic, partition)?;
    let wanted = match start {
        Start::Beginning => low,
        Start::Offset(offset) => offset,
        // A broker that cannot look offsets up by time is read from its
        // beginning: slower, still complete.
        Start::Time(at) => offset_at(consumer, topic, partition, at, end)
            .ok()
            .flatten()
            .unwrap_or(low),
    };
    let from = wanted.clamp(low, end);
    let stop = end.min(from.saturating_add(i64::from(limit)));
    let mut scanned = Scanned {
        records: Vec::new(),
        from,
        to: from,
        end,
    };
    if from >= stop {
        return Ok(scanned);
    }
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(topic, partition, Offset::Offset(from))?;
    consumer.assign(&assignment)?;
    let read = read_to(consumer, topic, partition, stop, keep, &mut scanned);
    // The next scan starts from a clean assignment.
    consumer.unassign()?;
    read.map(|()| scanned)
}

fn read_to(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    stop: i64,
    keep: &dyn Fn(&Record) -> bool,
    scanned: &mut Scanned,
) -> Result<(), ScanError> {
    while scanned.to < stop {
        let message = match consumer.poll(TIMEOUT) {
            Some(message) => message?,
            None => {
                return Err(ScanError::Stalled {
                    topic: topic.to_owned(),
                    partition,
                    offset: scanned.to,
                });
            }
        };
        // A message fetched for an earlier scan's partition is not this one's.
        if message.topic() != topic || message.partition() != partition {
            continue;
        }
        let record = Record::from_message(&message);
        // Offsets may have gaps (compaction, transaction markers).
        scanned.to = record.offset + 1;
        if record.offset < stop && keep(&record) {
            scanned.records.push(record);
        }
    }
    Ok(())
}

/// Runs blocking broker work off the runtime.
pub async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ScanError> + Send + 'static,
) -> Result<T, ScanError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| ScanError::Interrupted)?
}

/// When a record was written, as the broker stamped it.
pub fn written_at(record: &Record) -> Option<OffsetDateTime> {
    consumer_tools::dead_lettered_at(record)
}

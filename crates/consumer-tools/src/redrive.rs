//! `dlt redrive`: republishes dead letters to their original topic and
//! partition with their original key, value and headers (the same `id`, so
//! the consumer's dedupe still applies), DLT headers dropped and
//! `dlt-redriven-from` added.
//!
//! The redrive's own consumer group on the DLT marks progress: its committed
//! offset on a partition means "everything before was redriven". It advances
//! only over records that were redriven, so records left out by a filter stay
//! ahead of it for a later redrive; a record redriven out of order (by
//! --offset) may be redriven again by a later run, which the processed table
//! makes harmless.
//!
//! A skeleton (a dead letter too large for the broker, sent without its
//! value) is not the message, so it is never redriven: it is reported, and
//! like a filtered record it holds the group's offset back. The whole record
//! is still at its original position while the source topic keeps it.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::audit::{Audit, Redriven};
use crate::cli::RedriveArgs;
use crate::dlt_read::{self, Expired, From, ReadError, matches};
use idempotent_consumer::topics;
use idempotent_consumer::{DltInfo, REDRIVEN_FROM, Record, message_headers};

const TIMEOUT: Duration = Duration::from_secs(10);

/// What a redrive did (or, in a dry run, would do).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RedriveSummary {
    pub dry_run: bool,
    /// Unredriven records in the DLT.
    pub unredriven: usize,
    pub redriven: usize,
    /// Left in the DLT by the filter.
    pub skipped: usize,
    /// Skeletons the filter chose, left in the DLT: `(partition, offset)`.
    pub skeletons: Vec<(i32, i64)>,
    pub expired: Vec<Expired>,
}

/// One record redriven, or that a dry run would redrive.
#[derive(Debug)]
pub struct RedriveStep<'a> {
    pub record: &'a Record,
    pub info: DltInfo,
    pub to_topic: &'a str,
    pub to_partition: i32,
    /// Where the copy landed; `None` in a dry run.
    pub to_offset: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("talking to the broker failed")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("DLT record {partition}/{offset} has no original topic or partition header")]
    NoOrigin { partition: i32, offset: i64 },
    #[error("the redrive audit (dlt_redrive) cannot be written: nothing was redriven")]
    AuditUnavailable(#[source] sqlx::Error),
    #[error(
        "recording the redrive in the audit (dlt_redrive) failed; the copy was published, the redrive group's offset not moved"
    )]
    Audit(#[source] sqlx::Error),
}

/// The redrive group of the consumer group `group`, the one a redrive uses
/// unless told otherwise: its committed offsets on the DLT mark what was
/// redriven, for every tool that redrives or says what was.
pub fn redrive_group(group: &str) -> String {
    format!("{group}.redrive")
}

fn group_consumer(config: &ClientConfig, group: &str) -> Result<BaseConsumer, RedriveError> {
    Ok(config
        .clone()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?)
}

/// The redrive group's committed offsets on the DLT.
fn committed(consumer: &BaseConsumer, dlt: &str) -> Result<HashMap<i32, i64>, RedriveError> {
    let partitions = topics::partition_count(consumer, dlt).map_err(ReadError::from)?;
    let mut list = TopicPartitionList::new();
    for partition in 0..i32::try_from(partitions).unwrap_or(i32::MAX) {
        list.add_partition(dlt, partition);
    }
    let committed = consumer.committed_offsets(list, TIMEOUT)?;
    Ok(committed
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(offset) => Some((e.partition(), offset)),
            _ => None,
        })
        .collect())
}

fn headers_for_redrive(record: &Record, dlt: &str) -> OwnedHeaders {
    let from = format!("{dlt}/{}/{}", record.partition, record.offset);
    message_headers(record)
        .fold(OwnedHeaders::new(), |headers, header| {
            headers.insert(Header {
                key: &header.name_text(),
                value: header.value.as_deref(),
            })
        })
        .insert(Header {
            key: REDRIVEN_FROM,
            value: Some(from.as_str()),
        })
}

/// Republishes the unredriven DLT records that pass the filter, recording
/// each in `audit`; `step` is told of each one.
pub async fn redrive(
    config: ClientConfig,
    dlt: String,
    redrive_group: &str,
    args: RedriveArgs,
    audit: &Audit,
    step: &mut (dyn FnMut(RedriveStep<'_>) + Send),
) -> Result<RedriveSummary, RedriveError> {
    if !args.dry_run {
        audit
            .check()
            .await
            .map_err(RedriveError::AuditUnavailable)?;
    }
    let group = group_consumer(&config, redrive_group)?;
    let from = From {
        offsets: committed(&group, &dlt)?,
        only: args.filter.partition,
    };
    let read = dlt_read::read_off_runtime(config.clone(), dlt.clone(), from).await?;
    let producer: FutureProducer = config
        .clone()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()?;
    let pause = Duration::from_secs_f64(1.0 / f64::from(args.rate));
    let mut summary = RedriveSummary {
        dry_run: args.dry_run,
        unredriven: read.records.len(),
        expired: read.expired,
        ..RedriveSummary::default()
    };
    // Per partition: may the group's offset still advance past what follows?
    let mut contiguous: HashMap<i32, bool> = HashMap::new();
    for record in &read.records {
        let advancing = contiguous.entry(record.partition).or_insert(true);
        if !matches(&args.filter, record) {
            *advancing = false;
            summary.skipped += 1;
            continue;
        }
        let info = DltInfo::of(record);
        if info.skeleton {
            *advancing = false;
            summary.skeletons.push((record.partition, record.offset));
            continue;
        }
        let (Some(topic), Some(partition)) = (info.original_topic.clone(), info.original_partition)
        else {
            return Err(RedriveError::NoOrigin {
                partition: record.partition,
                offset: record.offset,
            });
        };
        let mut to_offset = None;
        if !args.dry_run {
            let mut outgoing = FutureRecord::to(&topic)
                .partition(partition)
                .headers(headers_for_redrive(record, &dlt));
            if let Some(key) = &record.key {
                outgoing = outgoing.key(key.as_slice());
            }
            if let Some(value) = &record.value {
                outgoing = outgoing.payload(value.as_slice());
            }
            let offset = producer
                .send(outgoing, TIMEOUT)
                .await
                .map_err(|(error, _)| error)?
                .offset;
            audit
                .record(&Redriven {
                    dlt_topic: dlt.clone(),
                    dlt_partition: record.partition,
                    dlt_offset: record.offset,
                    message_id: info.message_id.as_deref().and_then(|id| id.parse().ok()),
                    reason: info.reason.clone(),
                    to_topic: topic.clone(),
                    to_partition: partition,
                    to_offset: offset,
                })
                .await
                .map_err(RedriveError::Audit)?;
            to_offset = Some(offset);
            if *advancing {
                let mut offsets = TopicPartitionList::new();
                offsets.add_partition_offset(
                    &dlt,
                    record.partition,
                    Offset::Offset(record.offset + 1),
                )?;
                group.commit(&offsets, CommitMode::Sync)?;
            }
            tokio::time::sleep(pause).await;
        }
        summary.redriven += 1;
        step(RedriveStep {
            record,
            info,
            to_topic: &topic,
            to_partition: partition,
            to_offset,
        });
    }
    Ok(summary)
}

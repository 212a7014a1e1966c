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

use std::collections::HashMap;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::dlt_read::{self, ReadError, matches};
use crate::config::RedriveArgs;
use crate::dlt::{DltInfo, REDRIVEN_FROM, SourceRecord, is_dlt_header};
use crate::topics;

const TIMEOUT: Duration = Duration::from_secs(10);

/// What a redrive did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RedriveSummary {
    pub redriven: usize,
    pub skipped: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum RedriveError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("talking to the broker failed")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("DLT record {partition}/{offset} has no original topic or partition header")]
    NoOrigin { partition: i32, offset: i64 },
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

fn headers_for_redrive(record: &SourceRecord, dlt: &str) -> OwnedHeaders {
    let from = format!("{dlt}/{}/{}", record.partition, record.offset);
    record
        .headers
        .iter()
        .filter(|(name, _)| !is_dlt_header(name) && name != REDRIVEN_FROM)
        .fold(OwnedHeaders::new(), |headers, (key, value)| {
            headers.insert(Header {
                key,
                value: value.as_deref(),
            })
        })
        .insert(Header {
            key: REDRIVEN_FROM,
            value: Some(from.as_str()),
        })
}

pub async fn redrive(
    config: ClientConfig,
    dlt: String,
    args: RedriveArgs,
) -> Result<RedriveSummary, RedriveError> {
    let group = group_consumer(&config, &args.redrive_group)?;
    let start = committed(&group, &dlt)?;
    let read_config = config.clone();
    let read_dlt = dlt.clone();
    let records =
        tokio::task::spawn_blocking(move || dlt_read::read(&read_config, &read_dlt, &start))
            .await
            .map_err(|_| ReadError::Stalled(Duration::ZERO))??;
    let selected = records.iter().filter(|r| matches(&args.filter, r)).count();
    eprintln!(
        "{selected} of {} unredriven DLT record(s) selected{}",
        records.len(),
        if args.dry_run {
            " (dry run: nothing is published)"
        } else {
            ""
        }
    );
    let producer: FutureProducer = config
        .clone()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .create()?;
    let progress = ProgressBar::new(u64::try_from(selected).unwrap_or(0));
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} redriven, {per_sec}, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let pause = Duration::from_secs_f64(1.0 / f64::from(args.rate));
    let mut summary = RedriveSummary::default();
    // Per partition: may the group's offset still advance past what follows?
    let mut contiguous: HashMap<i32, bool> = HashMap::new();
    for record in &records {
        let advancing = contiguous.entry(record.partition).or_insert(true);
        if !matches(&args.filter, record) {
            *advancing = false;
            summary.skipped += 1;
            continue;
        }
        let info = DltInfo::of(record);
        let (Some(topic), Some(partition)) = (info.original_topic.clone(), info.original_partition)
        else {
            return Err(RedriveError::NoOrigin {
                partition: record.partition,
                offset: record.offset,
            });
        };
        if args.dry_run {
            progress.println(format!(
                "would redrive {dlt}/{}/{} (id {}, {}) to {topic}[{partition}]",
                record.partition,
                record.offset,
                info.message_id.as_deref().unwrap_or("-"),
                info.reason.as_deref().unwrap_or("-"),
            ));
        } else {
            let mut outgoing = FutureRecord::to(&topic)
                .partition(partition)
                .headers(headers_for_redrive(record, &dlt));
            if let Some(key) = &record.key {
                outgoing = outgoing.key(key.as_slice());
            }
            if let Some(value) = &record.value {
                outgoing = outgoing.payload(value.as_slice());
            }
            producer
                .send(outgoing, TIMEOUT)
                .await
                .map_err(|(error, _)| error)?;
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
        progress.inc(1);
    }
    progress.finish();
    eprintln!(
        "{} {} record(s); {} left in the DLT by the filter",
        if args.dry_run {
            "would redrive"
        } else {
            "redrove"
        },
        summary.redriven,
        summary.skipped
    );
    Ok(summary)
}

//! The journey's evidence in the broker: every record of a key in its
//! partition (so re-publishes and redriven copies show), and its dead
//! letters.
//!
//! A key's records are all in one partition: the one the delivery log
//! names, or the one the Java client's partitioner picks (Debezium writes no
//! delivery log). The read starts at the first record written after the
//! key's earliest outbox row, when the broker can look offsets up by time,
//! and stops at `--scan-limit` records, saying so.

use std::collections::HashMap;
use std::time::Duration;

use idempotent_consumer::dlt::EXCEPTION_MESSAGE;
use idempotent_consumer::{DltInfo, REDRIVEN_FROM, Record};
use service_support::kafka::java_partition;
use time::OffsetDateTime;
use uuid::Uuid;

use super::Step;
use super::rows::Written;
use crate::kafka::{self, ScanError, Scanned, Start};
use crate::sources::{Flow, Sources};

/// Records written this long before the earliest outbox row are read too:
/// clocks of the database and the broker differ.
const CLOCK_SLACK: Duration = Duration::from_secs(60);

fn message_id(record: &Record) -> Option<Uuid> {
    record.text_header("id").and_then(|id| id.parse().ok())
}

fn place(record: &Record) -> String {
    format!("{}[{}]@{}", record.topic, record.partition, record.offset)
}

fn truncated(scanned: &Scanned, topic: &str, partition: i32, limit: u32, notes: &mut Vec<String>) {
    if !scanned.complete() {
        notes.push(format!(
            "{topic}[{partition}]: read {limit} records from offset {} and stopped at {} of {}; records after it are not shown (--scan-limit)",
            scanned.from, scanned.to, scanned.end
        ));
    }
}

/// The key of the message `id`, from the dead letters: the last place that
/// knows a message whose row is gone and that no consumer applied.
pub(super) async fn key_in_dead_letters(
    sources: &Sources,
    id: Uuid,
    notes: &mut Vec<String>,
) -> Result<Option<String>, ScanError> {
    for flow in &sources.flows {
        let config = sources.kafka.clone();
        let limit = sources.scan_limit;
        let dlt = flow.dlt.clone();
        let found = kafka::blocking(move || {
            let consumer = kafka::reader(&config)?;
            let partitions = kafka::partition_count(&consumer, &dlt)?;
            let mut found = Vec::new();
            for partition in 0..partitions {
                let scanned =
                    kafka::scan(&consumer, &dlt, partition, Start::Beginning, limit, &|r| {
                        message_id(r) == Some(id)
                    })?;
                found.push((partition, scanned));
            }
            Ok(found)
        })
        .await?;
        for (partition, scanned) in found {
            truncated(&scanned, &flow.dlt, partition, limit, notes);
            if let Some(key) = scanned
                .records
                .iter()
                .find_map(|record| record.key.as_deref())
            {
                return Ok(Some(String::from_utf8_lossy(key).into_owned()));
            }
        }
    }
    Ok(None)
}

/// The records of `key` in `flow`'s topic and its DLT.
pub(super) async fn of_key(
    sources: &Sources,
    flow: &Flow,
    key: &str,
    written: &Written,
    since: Option<OffsetDateTime>,
    notes: &mut Vec<String>,
) -> Result<Vec<Step>, ScanError> {
    let config = sources.kafka.clone();
    let limit = sources.scan_limit;
    let logged_partition = written
        .deliveries
        .first()
        .map(|(_, partition, _)| *partition);
    let start = since.map_or(Start::Beginning, |at| Start::Time(at - CLOCK_SLACK));
    let (topic, dlt) = (flow.topic.clone(), flow.dlt.clone());
    let wanted = key.as_bytes().to_vec();
    let (partition, source, dead) = kafka::blocking(move || {
        let consumer = kafka::reader(&config)?;
        let partition = match logged_partition {
            Some(partition) => partition,
            None => java_partition(&wanted, kafka::partition_count(&consumer, &topic)?),
        };
        let keep = |record: &Record| record.key.as_deref() == Some(wanted.as_slice());
        let source = kafka::scan(&consumer, &topic, partition, start, limit, &keep)?;
        // A dead letter goes to the DLT's partition of the same number.
        let dead = kafka::scan(&consumer, &dlt, partition, start, limit, &keep)?;
        Ok((partition, source, dead))
    })
    .await?;
    truncated(&source, &flow.topic, partition, limit, notes);
    truncated(&dead, &flow.dlt, partition, limit, notes);

    let mut copies: HashMap<Option<Uuid>, usize> = HashMap::new();
    for record in &source.records {
        *copies.entry(message_id(record)).or_default() += 1;
    }
    let mut seen: HashMap<Option<Uuid>, usize> = HashMap::new();
    let mut steps = Vec::new();
    for record in &source.records {
        let id = message_id(record);
        let nth = seen.entry(id).or_default();
        *nth += 1;
        let total = copies.get(&id).copied().unwrap_or(1);
        let redriven_from = record.text_header(REDRIVEN_FROM);
        let what = if redriven_from.is_some() {
            "record (redriven copy)"
        } else if *nth > 1 {
            "record (another copy)"
        } else {
            "record"
        };
        steps.push(
            Step::new(kafka::written_at(record), place(record), what)
                .message(id, record.text_header("eventType"))
                .with("key", key)
                .with_some("redriven_from", redriven_from)
                .with_some("traceparent", record.text_header("traceparent"))
                .with_some("copy", (total > 1).then(|| format!("{nth} of {total}"))),
        );
    }
    for record in &dead.records {
        let info = DltInfo::of(record);
        let original = crate::dead_letters::consumed_from(&info);
        steps.push(
            Step::new(kafka::written_at(record), place(record), "dead-lettered")
                .message(
                    info.message_id.as_deref().and_then(|id| id.parse().ok()),
                    record.text_header("eventType"),
                )
                .with_some("reason", info.reason)
                .with_some("attempts", info.attempts)
                .with_some("original", original)
                .with_some("exception", record.text_header(EXCEPTION_MESSAGE))
                .with_some(
                    "skeleton",
                    info.skeleton.then_some("value too large: sent without it"),
                ),
        );
    }
    Ok(steps)
}

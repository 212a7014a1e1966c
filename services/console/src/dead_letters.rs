//! The dead-letter topics: list, show, and redrive with a dry run that says
//! what would happen now. Reading and redriving are the consumer library's
//! DLT tools (the same code as `inventory-service dlt`); what the console
//! adds is the prediction, which needs both databases.

use consumer_tools::{self as tools, Audit, AuditEntry, DltFilter, OperatorError, RedriveArgs};
use idempotent_consumer::{DltInfo, DltReason, Record, decode_header, processed};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::kafka::{self, ScanError};
use crate::sources::{Db, Flow, Sources};
use crate::text::rfc3339;

#[derive(Debug, thiserror::Error)]
pub enum DltError {
    #[error("{topic:?} is not a dead-letter topic of this pipeline ({known})")]
    UnknownTopic { topic: String, known: String },
    #[error("no dead letter at {topic}[{partition}]@{offset}")]
    NotFound {
        topic: String,
        partition: i32,
        offset: i64,
    },
    #[error("reading the DLT failed")]
    Read(#[from] tools::ReadError),
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error("reading the database failed")]
    Database(#[from] sqlx::Error),
    #[error("the redrive failed")]
    Redrive(#[from] tools::RedriveError),
    #[error("operator: {0}")]
    Operator(#[from] OperatorError),
}

/// One dead letter, as the console shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct DeadLetter {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// When it was dead-lettered.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub at: Option<OffsetDateTime>,
    pub key: Option<String>,
    #[serde(rename = "messageId")]
    pub message_id: Option<String>,
    #[serde(rename = "eventType")]
    pub event_type: Option<String>,
    pub reason: Option<String>,
    pub attempts: Option<u32>,
    /// Where it was consumed from: `topic[partition]@offset`.
    pub original: Option<String>,
    /// Sent without its value (too large for the broker): not redrivable.
    pub skeleton: bool,
    /// Every header, decoded as docs/inventory-service.md documents it.
    pub headers: Vec<(String, String)>,
    /// The value: pretty-printed when it is JSON.
    pub value: Option<String>,
}

impl DeadLetter {
    fn of(record: &Record) -> Self {
        let info = DltInfo::of(record);
        let original = consumed_from(&info);
        Self {
            topic: record.topic.clone(),
            partition: record.partition,
            offset: record.offset,
            at: kafka::written_at(record),
            key: record
                .key
                .as_deref()
                .map(|key| String::from_utf8_lossy(key).into_owned()),
            message_id: info.message_id,
            event_type: record.text_header("eventType"),
            reason: info.reason,
            attempts: info.attempts,
            original,
            skeleton: info.skeleton,
            headers: record
                .headers
                .iter()
                .map(|header| {
                    let name = header.name_text().into_owned();
                    let value = decode_header(&name, header.value.as_deref());
                    (name, value)
                })
                .collect(),
            value: record.value.as_deref().map(pretty),
        }
    }
}

/// Where a dead letter was consumed from: `topic[partition]@offset`.
pub fn consumed_from(info: &DltInfo) -> Option<String> {
    match (
        &info.original_topic,
        info.original_partition,
        info.original_offset,
    ) {
        (Some(topic), Some(partition), Some(offset)) => {
            Some(format!("{topic}[{partition}]@{offset}"))
        }
        _ => None,
    }
}

/// JSON pretty-printed; anything else as text, invalid UTF-8 escaped.
fn pretty(bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| idempotent_consumer::escape_invalid_utf8(bytes).into_owned())
}

fn flow<'a>(sources: &'a Sources, topic: &str) -> Result<&'a Flow, DltError> {
    sources
        .flow_of_dlt(topic)
        .ok_or_else(|| DltError::UnknownTopic {
            topic: topic.to_owned(),
            known: sources
                .flows
                .iter()
                .map(|flow| flow.dlt.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// What the DLTs hold that passes `filter`, newest first; records lost to
/// retention are reported in the notes.
#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
pub struct Listing {
    pub letters: Vec<DeadLetter>,
    pub notes: Vec<String>,
}

pub async fn list(
    sources: &Sources,
    topic: Option<&str>,
    filter: &DltFilter,
) -> Result<Listing, DltError> {
    let flows: Vec<&Flow> = match topic {
        Some(topic) => vec![flow(sources, topic)?],
        None => sources.flows.iter().collect(),
    };
    let mut listing = Listing::default();
    for flow in flows {
        let read = tools::list(sources.kafka.clone(), flow.dlt.clone(), filter.clone()).await?;
        for gone in &read.expired {
            listing.notes.push(format!(
                "{}[{}]: {} record(s) before offset {} deleted by retention",
                flow.dlt,
                gone.partition,
                gone.count(),
                gone.low_watermark
            ));
        }
        listing
            .letters
            .extend(read.records.iter().map(DeadLetter::of));
    }
    listing
        .letters
        .sort_by(|a, b| b.at.cmp(&a.at).then(a.topic.cmp(&b.topic)));
    Ok(listing)
}

pub async fn show(
    sources: &Sources,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<DeadLetter, DltError> {
    read(sources, topic, partition, offset)
        .await
        .map(|record| DeadLetter::of(&record))
}

/// The dead letter at `partition`/`offset` of `topic`, as the broker holds it.
pub async fn read(
    sources: &Sources,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Result<Record, DltError> {
    flow(sources, topic)?;
    let read = tools::show(sources.kafka.clone(), topic.to_owned(), partition, offset).await?;
    read.records
        .into_iter()
        .next()
        .ok_or_else(|| DltError::NotFound {
            topic: topic.to_owned(),
            partition,
            offset,
        })
}

/// What a redrive of a dead letter would do now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Prediction {
    /// The redrive group's offset is past it: redriven already.
    #[serde(rename = "alreadyRedriven")]
    pub already_redriven: bool,
    /// When the consumer processed this message id, if it has.
    #[serde(rename = "processedAt", with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub processed_at: Option<OffsetDateTime>,
    /// The order's status now, and since when.
    #[serde(rename = "orderStatus")]
    pub order_status: Option<String>,
    #[serde(rename = "orderStatusSince", with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub order_status_since: Option<OffsetDateTime>,
    /// The inventory's reservation for the order, if any.
    pub reservation: Option<String>,
    /// Earlier redrives of this message (the audit's rows).
    #[serde(rename = "redrivenBefore")]
    #[schema(value_type = Vec<Object>)]
    pub redriven_before: Vec<AuditEntry>,
    /// What would happen, in words.
    pub verdict: Vec<String>,
}

pub async fn predict(sources: &Sources, letter: &DeadLetter) -> Result<Prediction, DltError> {
    let flow = flow(sources, &letter.topic)?;
    let message_id: Option<Uuid> = letter.message_id.as_deref().and_then(|id| id.parse().ok());
    let order_id: Option<Uuid> = letter.key.as_deref().and_then(|key| key.parse().ok());

    let (config, group, dlt, partition) = (
        sources.kafka.clone(),
        flow.redrive_group(),
        flow.dlt.clone(),
        letter.partition,
    );
    let partitions = kafka::blocking({
        let (config, dlt) = (config.clone(), dlt.clone());
        move || {
            let consumer = kafka::reader(&config)?;
            kafka::partition_count(&consumer, &dlt)
        }
    })
    .await?;
    let committed =
        kafka::blocking(move || kafka::committed(&config, &group, &dlt, partitions)).await?;
    let already_redriven = committed
        .get(usize::try_from(partition).unwrap_or(usize::MAX))
        .copied()
        .flatten()
        .is_some_and(|next| next > letter.offset);

    let processed_at: Option<OffsetDateTime> = match message_id {
        Some(id) => processed::processed_at(sources.db(flow.consumer_db), flow.consumer, &[id])
            .await?
            .pop()
            .map(|(_, at)| at),
        None => None,
    };
    let order: Option<(String, Option<OffsetDateTime>)> = match order_id {
        Some(id) => sqlx::query!(
            "select o.status, (select max(h.changed_at) from order_status_history h
                                   where h.order_id = o.id and h.status = o.status) as since
                 from orders o where o.id = $1",
            id,
        )
        .fetch_optional(sources.db(Db::Orders))
        .await?
        .map(|row| (row.status, row.since)),
        None => None,
    };
    let reservation: Option<String> = match order_id {
        Some(id) => {
            sqlx::query_scalar!("select status from reservations where order_id = $1", id)
                .fetch_optional(sources.db(Db::Inventory))
                .await?
        }
        None => None,
    };
    let redriven_before = match message_id {
        Some(id) => tools::audit::history(sources.db(flow.consumer_db), &[id]).await?,
        None => Vec::new(),
    };
    let (order_status, order_status_since) = order.unzip();
    let mut prediction = Prediction {
        already_redriven,
        processed_at,
        order_status,
        order_status_since: order_status_since.flatten(),
        reservation,
        redriven_before,
        verdict: Vec::new(),
    };
    prediction.verdict = verdict(letter, flow, &prediction);
    Ok(prediction)
}

fn verdict(letter: &DeadLetter, flow: &Flow, now: &Prediction) -> Vec<String> {
    let mut verdict = Vec::new();
    if letter.skeleton {
        verdict.push("not redrivable: a skeleton (the value was too large for the DLT); the whole record is at its original position while the source topic keeps it".to_owned());
        return verdict;
    }
    if now.already_redriven {
        verdict.push(format!(
            "already redriven: the redrive group {} is past this offset; a redrive publishes nothing",
            flow.redrive_group()
        ));
    }
    if let Some(last) = now.redriven_before.last() {
        verdict.push(format!(
            "redriven {} time(s) before, last by {} at {} to {}[{}]@{}",
            now.redriven_before.len(),
            last.operator,
            rfc3339(last.redriven_at),
            last.redriven.to_topic,
            last.redriven.to_partition,
            last.redriven.to_offset
        ));
    }
    if let Some(at) = now.processed_at {
        verdict.push(format!(
            "a duplicate: {} processed this message id at {}; the copy would be acknowledged with no effect",
            flow.consumer,
            rfc3339(at)
        ));
        return verdict;
    }
    if let Some(status) = &now.order_status
        && status == "CANCELLED"
    {
        verdict.push(format!(
            "the order was cancelled{} since it was dead-lettered or before",
            now.order_status_since
                .map(|at| format!(" at {}", rfc3339(at)))
                .unwrap_or_default()
        ));
    }
    if flow.consumer_db == Db::Inventory
        && letter.event_type.as_deref() == Some("PedidoCriado")
        && let Some(reservation) = &now.reservation
    {
        verdict.push(format!(
            "the inventory already decided this order ({reservation}): a PedidoCriado would be recorded as processed and change no stock"
        ));
    }
    match letter.reason.as_deref().and_then(DltReason::parse) {
        Some(DltReason::RetriesExhausted) => verdict.push(
            "dead-lettered after transient failures: if the cause is gone, the consumer applies it".to_owned(),
        ),
        Some(reason) => verdict.push(format!(
            "dead-lettered as {}: that is deterministic; unless the consumer now accepts this record, it returns to the DLT",
            reason.as_str()
        )),
        None => verdict.push("no dlt-reason header: the consumer decides".to_owned()),
    }
    verdict
}

/// What a redrive did, or in a dry run would do.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct RedriveResult {
    #[serde(rename = "dryRun")]
    pub dry_run: bool,
    pub letter: DeadLetter,
    pub prediction: Prediction,
    /// Where the copy went: `topic[partition]@offset` (none in a dry run,
    /// or when it was redriven already).
    #[serde(rename = "redrivenTo")]
    pub redriven_to: Option<String>,
    pub operator: String,
}

/// [`redrive`] on a thread of its own, to its end whatever happens to the
/// caller: an HTTP request that times out or is dropped must not stop a
/// redrive between its publish and its audit. (The DLT tools block on
/// librdkafka, which must not hold the server's runtime threads either.)
pub async fn redrive_detached(
    sources: Sources,
    topic: String,
    partition: i32,
    offset: i64,
    operator: String,
    via: &'static str,
    dry_run: bool,
) -> Result<RedriveResult, DltError> {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        runtime.block_on(redrive(
            &sources, &topic, partition, offset, &operator, via, dry_run,
        ))
    })
    .await
    .map_err(|_| DltError::Scan(ScanError::Interrupted))?
}

/// Redrives the dead letter at `topic`[`partition`]@`offset` (or, with
/// `dry_run`, says what would happen), recording the redrive in the
/// consumer's audit as `operator` via `via`.
pub async fn redrive(
    sources: &Sources,
    topic: &str,
    partition: i32,
    offset: i64,
    operator: &str,
    via: &'static str,
    dry_run: bool,
) -> Result<RedriveResult, DltError> {
    let flow = flow(sources, topic)?;
    let audit = Audit::new(sources.redrive_database(flow.consumer_db), operator, via)?;
    let letter = show(sources, topic, partition, offset).await?;
    let prediction = predict(sources, &letter).await?;
    let mut redriven_to = None;
    if !dry_run && !letter.skeleton {
        let args = RedriveArgs {
            filter: DltFilter {
                partition: Some(partition),
                offset: Some(offset),
                ..DltFilter::default()
            },
            dry_run: false,
            rate: 1_000,
            operator: Some(audit.operator().to_owned()),
            redrive_group: Some(flow.redrive_group()),
        };
        let mut step = |step: tools::RedriveStep<'_>| {
            if let Some(to) = step.to_offset {
                redriven_to = Some(format!("{}[{}]@{to}", step.to_topic, step.to_partition));
            }
        };
        let group = flow.redrive_group();
        tools::redrive(
            sources.kafka.clone(),
            topic.to_owned(),
            &group,
            args,
            &audit,
            &mut step,
        )
        .await?;
    }
    Ok(RedriveResult {
        dry_run,
        letter,
        prediction,
        redriven_to,
        operator: audit.operator().to_owned(),
    })
}

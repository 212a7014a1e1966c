//! The consumer over RabbitMQ: the same [`Pipeline`] (parse, dedupe row and
//! effect in one transaction, 3 × 1 s retries, dead letters) fed from a
//! quorum queue instead of a Kafka partition.
//!
//! The topology, declared idempotently at start-up ([`declare`]):
//!
//! - the relay's topic exchange (`pedido.eventos`), durable;
//! - the consumer's **quorum queue** (`estoque.reserva`) bound to it with
//!   `#`: **single active consumer**, so that one consumer at a time takes
//!   its messages, in queue order, which keeps each order's events in
//!   order (docs/rabbitmq.md, "Per-key order"); `x-delivery-limit` as a
//!   backstop for a message that kills its consumer before it can be
//!   dead-lettered; `x-dead-letter-exchange` `<queue>.dlx`;
//! - the dead-letter exchange `<queue>.dlx` (fanout) and queue
//!   `<queue>.dlq` (quorum). The consumer publishes its own dead letters
//!   there, with the reason and the last error in headers
//!   ([`crate::dlt`]); the broker dead-letters there what exceeds the
//!   delivery limit, with `x-death`.
//!
//! Messages are acknowledged after their transaction committed, all of a
//! batch at once (`multiple`); prefetch bounds what is in flight. A
//! transient failure is retried in process, holding the message (and the
//! queue behind it: that is what per-key order costs), never by a requeue
//! that would spin or let later messages of its order pass it.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ExchangeKind};
use rdkafka::Timestamp;
use service_support::amqp::{self, AmqpError, AmqpUrl};
use service_support::retry::{self, RetryPolicy};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::dlt::DeadLetter;
use crate::handler::Handler;
use crate::pipeline::Pipeline;
use crate::record::{Header, Record};

/// The header the relay puts the Kafka record's key in.
pub const AGGREGATE_ID_HEADER: &str = "aggregateId";

/// What the consumer needs to know of RabbitMQ.
#[derive(Debug, Clone)]
pub struct AmqpSettings {
    pub url: AmqpUrl,
    /// The relay's exchange (`pedido.eventos`).
    pub exchange: String,
    /// The consumer's queue (`estoque.reserva`).
    pub queue: String,
    /// Messages delivered and not yet acknowledged, at most.
    pub prefetch: u16,
    /// Deliveries of one message before the broker dead-letters it.
    pub delivery_limit: u32,
    /// Messages applied in one transaction at most.
    pub max_batch: usize,
}

impl AmqpSettings {
    pub fn dead_letter_exchange(&self) -> String {
        format!("{}.dlx", self.queue)
    }

    pub fn dead_letter_queue(&self) -> String {
        format!("{}.dlq", self.queue)
    }
}

fn durable_exchange() -> ExchangeDeclareOptions {
    ExchangeDeclareOptions {
        durable: true,
        ..ExchangeDeclareOptions::default()
    }
}

fn durable_queue() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    }
}

fn table(entries: impl IntoIterator<Item = (&'static str, AMQPValue)>) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in entries {
        table.insert(name.into(), value);
    }
    table
}

fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// Declares the exchange, the queue, the dead-letter exchange and queue,
/// and the bindings. Declaring what exists with the same arguments is a
/// no-op; with other arguments the broker refuses (`PRECONDITION_FAILED`),
/// which stops the consumer with that message.
pub async fn declare(connection: &Connection, settings: &AmqpSettings) -> Result<(), AmqpError> {
    let channel = connection
        .create_channel()
        .await
        .map_err(AmqpError::Channel)?;
    let dlx = settings.dead_letter_exchange();
    let dlq = settings.dead_letter_queue();
    let declaring = |what: String| move |source| AmqpError::Declare { name: what, source };
    channel
        .exchange_declare(
            settings.exchange.as_str().into(),
            ExchangeKind::Topic,
            durable_exchange(),
            FieldTable::default(),
        )
        .await
        .map_err(declaring(settings.exchange.clone()))?;
    channel
        .exchange_declare(
            dlx.as_str().into(),
            ExchangeKind::Fanout,
            durable_exchange(),
            FieldTable::default(),
        )
        .await
        .map_err(declaring(dlx.clone()))?;
    channel
        .queue_declare(
            dlq.as_str().into(),
            durable_queue(),
            table([("x-queue-type", text("quorum"))]),
        )
        .await
        .map_err(declaring(dlq.clone()))?;
    channel
        .queue_bind(
            dlq.as_str().into(),
            dlx.as_str().into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(declaring(dlq.clone()))?;
    let limit = i64::from(settings.delivery_limit);
    channel
        .queue_declare(
            settings.queue.as_str().into(),
            durable_queue(),
            table([
                ("x-queue-type", text("quorum")),
                ("x-single-active-consumer", AMQPValue::Boolean(true)),
                ("x-delivery-limit", AMQPValue::LongLongInt(limit)),
                ("x-dead-letter-exchange", text(&dlx)),
            ]),
        )
        .await
        .map_err(declaring(settings.queue.clone()))?;
    channel
        .queue_bind(
            settings.queue.as_str().into(),
            settings.exchange.as_str().into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(declaring(settings.queue.clone()))?;
    let _ = channel.close(200, "declared".into()).await;
    Ok(())
}

/// A delivery as the pipeline's [`Record`]: the queue as topic, partition
/// 0, the delivery tag as offset (a position on this channel only), the
/// `aggregateId` header as key, the AMQP headers as headers. A message
/// without an `id` header but with a `message_id` property gets the
/// property as its `id` header: it names the message either way.
pub fn record_of(delivery: &lapin::message::Delivery, queue: &str) -> Record {
    let properties = &delivery.properties;
    let mut headers: Vec<Header> = amqp::headers(properties)
        .into_iter()
        .map(|(name, value)| Header {
            name: name.into_bytes(),
            value,
        })
        .collect();
    if !headers.iter().any(|header| header.name == b"id")
        && let Some(id) = properties.message_id()
    {
        headers.push(Header::new("id", Some(id.as_str().as_bytes())));
    }
    let key = headers
        .iter()
        .find(|header| header.name == AGGREGATE_ID_HEADER.as_bytes())
        .and_then(|header| header.value.clone());
    let timestamp = properties
        .timestamp()
        .and_then(|seconds| i64::try_from(seconds).ok())
        .map_or(Timestamp::NotAvailable, |seconds| {
            Timestamp::CreateTime(seconds.saturating_mul(1000))
        });
    Record {
        topic: queue.to_owned(),
        partition: 0,
        offset: i64::try_from(delivery.delivery_tag).unwrap_or(i64::MAX),
        timestamp,
        key,
        value: Some(delivery.data.clone()),
        headers,
        unreadable_headers: false,
    }
}

/// Consumes `settings.queue` with `pipeline` until `shutdown` (of which
/// `pipeline.policy.consuming` is a child, as [`crate::serve`] makes it),
/// reconnecting
/// (with a backoff) whenever the connection or channel is lost; what was
/// delivered and not acknowledged then goes back to the queue, in order.
pub async fn run<H: Handler>(
    settings: AmqpSettings,
    pipeline: Pipeline<H>,
    shutdown: CancellationToken,
) -> Result<(), AmqpError> {
    let pipeline = Arc::new(pipeline);
    let probe = tokio::spawn(Arc::clone(pipeline.policy.health.database()).probe(shutdown.clone()));
    let consumer_name = pipeline.handler.consumer_name();
    let mut backoff =
        RetryPolicy::forever(Duration::from_millis(200), Duration::from_secs(5)).backoff();
    let consuming = pipeline.policy.consuming.clone();
    let mut isolated = false;
    let result = loop {
        if consuming.is_cancelled() {
            break Ok(());
        }
        match consume(&settings, &pipeline, consumer_name, &consuming, isolated).await {
            Ok(Ended::Stopped) => break Ok(()),
            Ok(Ended::Recovered) => {
                tracing::info!("past the messages that were in flight at the panic: batches again");
                isolated = false;
                backoff = RetryPolicy::forever(Duration::from_millis(200), Duration::from_secs(5))
                    .backoff();
            }
            Ok(Ended::Panicked) => {
                // One message at a time until past the window that was in
                // flight: only the culprit's delivery count keeps rising.
                isolated = true;
                if !retry::sleep(backoff.next_wait(), &consuming).await {
                    break Ok(());
                }
            }
            Err(error) if error.is_retryable() => {
                tracing::warn!(error.cause_chain = ?error, error.message = %error,
                    "lost RabbitMQ; reconnecting (unacknowledged messages are delivered again)");
                if !retry::sleep(backoff.next_wait(), &consuming).await {
                    break Ok(());
                }
            }
            Err(error) => break Err(error),
        }
    };
    if result.is_ok() && !shutdown.is_cancelled() {
        // The circuit opened: consumption stays stopped, readiness fails,
        // the service stays up for its operators until it is stopped.
        shutdown.cancelled().await;
    }
    // A consumer that failed stops the service.
    shutdown.cancel();
    let _ = probe.await;
    result
}

/// How one connection's worth of consuming ended, short of an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Cancelled: shutdown, or the circuit.
    Stopped,
    /// Processing panicked: the connection was closed so that what it held
    /// went back to the queue, in order.
    Panicked,
    /// Isolated after a panic, as many messages as the prefetch window
    /// went through one by one without one: batches may resume.
    Recovered,
}

/// One connection's worth of consuming. `isolated` (after a panic): one
/// message delivered and applied at a time, so that another panic returns
/// only its culprit to the queue, and every return raises only the
/// culprit's delivery count toward the limit, not its neighbours'.
async fn consume<H: Handler>(
    settings: &AmqpSettings,
    pipeline: &Pipeline<H>,
    consumer_name: &str,
    cancel: &CancellationToken,
    isolated: bool,
) -> Result<Ended, AmqpError> {
    let (prefetch, max_batch) = if isolated {
        (1, 1)
    } else {
        (settings.prefetch, settings.max_batch)
    };
    let mut clean = 0_usize;
    let connection = amqp::connect(&settings.url, consumer_name).await?;
    declare(&connection, settings).await?;
    let channel = connection
        .create_channel()
        .await
        .map_err(AmqpError::Channel)?;
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await
        .map_err(AmqpError::Channel)?;
    let mut consumer = channel
        .basic_consume(
            settings.queue.as_str().into(),
            consumer_name.into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(AmqpError::Channel)?;
    tracing::info!(queue = %settings.queue, "consuming from RabbitMQ");
    let token = cancel.child_token();
    let outcome = loop {
        let first = tokio::select! {
            biased;
            () = token.cancelled() => break Ok(Ended::Stopped),
            delivery = consumer.next() => delivery,
        };
        let mut batch = match first {
            Some(Ok(delivery)) => vec![delivery],
            Some(Err(error)) => break Err(AmqpError::Channel(error)),
            None => break Err(AmqpError::Closed("the broker ended the consumer")),
        };
        // Only what is already delivered: a batch never waits to fill.
        let mut lost = None;
        while batch.len() < max_batch {
            match consumer.next().now_or_never() {
                Some(Some(Ok(delivery))) => batch.push(delivery),
                Some(Some(Err(error))) => {
                    lost = Some(error);
                    break;
                }
                _ => break,
            }
        }
        let records: Vec<Record> = batch
            .iter()
            .map(|delivery| record_of(delivery, &settings.queue))
            .collect();
        // A panic must not unwind through here: lapin would cancel the
        // consumer before closing its channel, and with a single active
        // consumer the next one would start past the messages this one
        // still holds, which come back after it: out of order. Instead the
        // connection is closed, returning them at once, and consuming
        // starts again (a message that panics every time is dead-lettered
        // by the broker at the delivery limit).
        let processed = AssertUnwindSafe(pipeline.process(&records, &token))
            .catch_unwind()
            .await;
        let Ok(outcomes) = processed else {
            pipeline.policy.health.worker_died();
            tracing::error!(
                "processing a batch panicked; reconnecting, its messages are delivered again"
            );
            break Ok(Ended::Panicked);
        };
        let finished = outcomes.len();
        if let Some(last) = finished.checked_sub(1) {
            // Every delivery up to the last finished one, in one frame.
            let acked = batch[last]
                .acker
                .ack(BasicAckOptions { multiple: true })
                .await;
            if let Err(error) = acked {
                // Not acknowledged: delivered again, and absorbed as a
                // duplicate by the dedupe rows.
                break Err(AmqpError::Channel(error));
            }
        }
        if let Some(error) = lost {
            break Err(AmqpError::Channel(error));
        }
        if finished < batch.len() {
            // Stopped mid-batch: the rest goes back to the queue when the
            // channel closes.
            break Ok(Ended::Stopped);
        }
        clean += finished;
        if isolated && clean >= usize::from(settings.prefetch) {
            break Ok(Ended::Recovered);
        }
    };
    // Closing the connection first returns what this consumer holds in the
    // same step that removes it; dropping `consumer` first would cancel it
    // and let the next consumer start past those messages.
    let _ = connection.close(200, "consumer stopping".into()).await;
    drop(consumer);
    outcome
}

/// Why a dead letter did not reach the dead-letter exchange.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Connect(#[from] AmqpError),
    #[error("the broker refused the dead letter")]
    Refused(#[source] lapin::Error),
    #[error("the broker nacked the dead letter")]
    Nacked,
    #[error("the dead letter was returned unroutable: no queue is bound to {0}")]
    Unroutable(String),
}

impl PublishError {
    /// RabbitMQ refuses a message over `max_message_size` with
    /// PRECONDITION_FAILED, closing the channel.
    pub(crate) fn is_too_large(&self) -> bool {
        matches!(self, Self::Refused(error)
            if matches!(amqp::reply(error), Some(AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED))))
    }
}

/// A queue's dead-letter exchange, published to on a confirm channel of its
/// own, opened on first use and again after a failure.
#[derive(Debug)]
pub struct DeadLetterExchange {
    url: AmqpUrl,
    name: String,
    link: Mutex<Option<(Connection, Channel)>>,
}

impl DeadLetterExchange {
    pub fn new(url: AmqpUrl, name: impl Into<String>) -> Self {
        Self {
            url,
            name: name.into(),
            link: Mutex::new(None),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Publishes `letter` persistent and `mandatory`, and waits for its
    /// confirm. One at a time: a queue has one active consumer.
    pub(crate) async fn publish(&self, letter: &DeadLetter) -> Result<(), PublishError> {
        let mut link = self.link.lock().await;
        let channel = match &*link {
            Some((_, channel)) => channel.clone(),
            None => {
                let (connection, channel) =
                    amqp::confirm_channel(&self.url, "dead letters").await?;
                *link = Some((connection, channel.clone()));
                channel
            }
        };
        let mut headers = FieldTable::default();
        for (name, value) in &letter.headers {
            let value = match value {
                None => AMQPValue::Void,
                Some(bytes) => AMQPValue::LongString(LongString::from(bytes.clone())),
            };
            headers.insert(ShortString::from(name.as_str()), value);
        }
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(headers);
        if let Some(id) = letter
            .headers
            .iter()
            .find(|(name, _)| name == "id")
            .and_then(|(_, value)| value.as_deref())
            .and_then(|bytes| std::str::from_utf8(bytes).ok())
            .filter(|id| id.len() <= 255)
        {
            properties = properties.with_message_id(id.into());
        }
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let body = letter.value.as_deref().unwrap_or_default();
        let confirmed = match channel
            .basic_publish(
                self.name.as_str().into(),
                "".into(),
                options,
                body,
                properties,
            )
            .await
        {
            Ok(confirm) => confirm.await,
            Err(error) => Err(error),
        };
        match confirmed {
            Ok(Confirmation::Ack(None) | Confirmation::NotRequested) => Ok(()),
            Ok(Confirmation::Ack(Some(_))) => Err(PublishError::Unroutable(self.name.clone())),
            Ok(Confirmation::Nack(_)) => Err(PublishError::Nacked),
            Err(error) => {
                // The channel is closed after a refusal: open a new one next time.
                if let Some((connection, _)) = link.take() {
                    let _ = connection.close(200, "reopening".into()).await;
                }
                Err(PublishError::Refused(error))
            }
        }
    }
}

//! Sends a batch of rows to RabbitMQ and reports, per row, what happened.
//!
//! A row goes to the durable topic exchange named like its Kafka topic
//! (`pedido.eventos`), with its event type as routing key, persistent, as
//! `mandatory`, on a channel in confirm mode, carrying the same headers as
//! on Kafka, the record's key as header `aggregateId`, and the properties
//! `message_id` (the outbox id) and `type` (the event type).
//! It counts as published only once the broker confirmed it: for a quorum
//! queue, once a majority of its replicas wrote it.
//!
//! A message the broker returned (no queue bound for its routing key) or
//! nacked is a fault of the broker's topology or state, not of the row: it
//! fails as transient and steps aside, and goes once someone has fixed the
//! broker; it is never parked, and never dropped.
//!
//! The send fence: rows are handed to lapin only until `send_by`, as on
//! Kafka. lapin has no per-message timeout: confirms are awaited until
//! `--delivery-timeout` after the batch was handed over, and if any is
//! missing then, the connection is closed and nothing more is handed to
//! it. Whether lapin still writes frames it had queued before the close is
//! lapin's to decide (not checked): the fence over RabbitMQ is weaker than
//! over Kafka (docs/relay.md, "RabbitMQ").

use std::borrow::Borrow;
use std::time::{Duration, Instant};

use futures::future::join_all;
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};
use service_support::amqp::{self, AmqpError, AmqpUrl};
use service_support::telemetry;

use super::{Outcome, record_failure, route};
use crate::record::{OutboxRow, Router};

/// The Kafka record's key, which AMQP has no place for: what a consumer
/// keeps order by, and what a consistent-hash exchange would route on.
pub const AGGREGATE_ID_HEADER: &str = "aggregateId";

/// The longest AMQP short string (routing key, `type`, `message_id`), in bytes.
const SHORT_STRING_MAX: usize = 255;

/// AMQP's delivery mode for a message the broker writes to disk.
const PERSISTENT: u8 = 2;

/// One connection and its confirm-mode channel, replaced together.
#[derive(Debug)]
struct Link {
    connection: Connection,
    channel: Channel,
}

impl Link {
    async fn open(url: &AmqpUrl) -> Result<Self, AmqpError> {
        let (connection, channel) = amqp::confirm_channel(url, "outbox-relay").await?;
        Ok(Self {
            connection,
            channel,
        })
    }

    async fn close(self) {
        // Nothing more is handed to a connection once it was found late.
        let _ = self.connection.close(200, "relay closing".into()).await;
    }
}

#[derive(Debug)]
pub struct Publisher {
    url: AmqpUrl,
    link: Option<Link>,
    /// Counts links opened, so a batch's failure replaces only the link it
    /// was sent on, not a newer one.
    generation: u64,
    delivery_timeout: Duration,
}

/// A batch handed to lapin, its confirms still to come.
pub struct Sent {
    outcomes: Vec<Option<Outcome>>,
    pending: Vec<(usize, PublisherConfirm, tracing::Span)>,
    generation: u64,
    /// When every confirm must be in.
    deadline: Instant,
    /// A publish failed on the channel itself: the link is broken.
    broken: bool,
}

impl std::fmt::Debug for Sent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sent")
            .field("in_flight", &self.pending.len())
            .finish_non_exhaustive()
    }
}

/// The producer span of one row, as on Kafka but with RabbitMQ's attributes.
fn producer_span(row: &OutboxRow, exchange: &str) -> tracing::Span {
    let span = tracing::info_span!(
        parent: None,
        "publish",
        otel.name = %format_args!("{exchange} publish"),
        otel.kind = "producer",
        otel.status_code = tracing::field::Empty,
        messaging.system = "rabbitmq",
        messaging.operation.type = "send",
        messaging.destination.name = exchange,
        messaging.message.id = %row.id,
        messaging.rabbitmq.destination.routing_key = row.event_type.as_str(),
        error.type = tracing::field::Empty,
    );
    telemetry::continue_trace(&span, || row.stored_trace());
    span
}

/// The Kafka headers as an AMQP table: text as text, other bytes as a byte
/// array, a null value as void.
fn header_table<'a>(headers: impl Iterator<Item = (&'static str, Option<&'a [u8]>)>) -> FieldTable {
    let mut table = FieldTable::default();
    for (name, value) in headers {
        let value = match value {
            None => AMQPValue::Void,
            Some(bytes) if std::str::from_utf8(bytes).is_ok() => {
                AMQPValue::LongString(LongString::from(bytes.to_vec()))
            }
            Some(bytes) => AMQPValue::ByteArray(bytes.to_vec().into()),
        };
        table.insert(name.into(), value);
    }
    table
}

impl Publisher {
    /// Connects and puts a channel in confirm mode.
    pub async fn connect(url: AmqpUrl, delivery_timeout: Duration) -> Result<Self, AmqpError> {
        let link = Link::open(&url).await?;
        Ok(Self {
            url,
            link: Some(link),
            generation: 0,
            delivery_timeout,
        })
    }

    /// Hands `rows` to lapin in order; stops at `send_by` (the rest is
    /// withheld) or at the first publish the channel refuses (the rest
    /// fails as transient: nothing after a row that did not go may go, or
    /// its aggregate's order would break).
    pub async fn send<R: Borrow<OutboxRow>>(&self, rows: &[R], send_by: Instant) -> Sent {
        let mut outcomes: Vec<Option<Outcome>> = vec![None; rows.len()];
        let mut pending = Vec::with_capacity(rows.len());
        let mut broken = false;
        let Some(link) = &self.link else {
            let outcome = Outcome::Transient("not connected to RabbitMQ".to_owned());
            return Sent {
                outcomes: vec![Some(outcome); rows.len()],
                pending,
                generation: self.generation,
                deadline: Instant::now(),
                broken: true,
            };
        };
        let mut router = Router::default();
        for (i, row) in rows.iter().map(Borrow::borrow).enumerate() {
            if Instant::now() >= send_by {
                outcomes[i..].fill(Some(Outcome::Withheld));
                break;
            }
            let exchange = match route(&mut router, row, producer_span) {
                Ok(exchange) => exchange,
                Err(poison) => {
                    outcomes[i] = Some(poison);
                    continue;
                }
            };
            let span = producer_span(row, exchange);
            if row.event_type.len() > SHORT_STRING_MAX {
                // It cannot be a routing key or a `type`: the row's fault,
                // and it would fail the same way for ever.
                let outcome = Outcome::Poison(format!(
                    "event type of {} bytes: AMQP takes at most {SHORT_STRING_MAX} as routing key and type",
                    row.event_type.len()
                ));
                record_failure(&span, &outcome);
                outcomes[i] = Some(outcome);
                continue;
            }
            let context = telemetry::recorded(&span);
            let record = row.to_record(exchange, context.as_ref());
            let properties = BasicProperties::default()
                .with_message_id(row.id.to_string().into())
                .with_type(row.event_type.as_str().into())
                .with_content_type("application/json".into())
                .with_delivery_mode(PERSISTENT)
                .with_headers(header_table(
                    record
                        .headers()
                        .chain([(AGGREGATE_ID_HEADER, Some(row.aggregateid.as_bytes()))]),
                ));
            let options = BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            };
            let published = link
                .channel
                .basic_publish(
                    exchange.into(),
                    row.event_type.as_str().into(),
                    options,
                    &record.value,
                    properties,
                )
                .await;
            match published {
                Ok(confirm) => pending.push((i, confirm, span)),
                Err(error) => {
                    let outcome = Outcome::Transient(format!("publish refused: {error}"));
                    record_failure(&span, &outcome);
                    outcomes[i..].fill(Some(outcome));
                    broken = true;
                    break;
                }
            }
        }
        metrics::counter!("relay_records_sent_total").increment(pending.len() as u64);
        Sent {
            outcomes,
            pending,
            generation: self.generation,
            deadline: Instant::now() + self.delivery_timeout,
            broken,
        }
    }

    /// Waits for the confirms of a batch [`Self::send`] handed over and
    /// returns one outcome per row, in order. A broken link, or a confirm
    /// missing at the deadline, replaces the link the batch was sent on.
    pub async fn settle(&mut self, sent: Sent) -> Vec<Outcome> {
        let Sent {
            mut outcomes,
            pending,
            generation,
            deadline,
            mut broken,
        } = sent;
        let (indices, in_flight): (Vec<usize>, Vec<_>) = pending
            .into_iter()
            .map(|(i, confirm, span)| (i, (confirm, span)))
            .unzip();
        let (confirms, spans): (Vec<_>, Vec<_>) = in_flight.into_iter().unzip();
        let waited = tokio::time::timeout_at(deadline.into(), join_all(confirms)).await;
        match waited {
            Ok(confirmations) => {
                for ((i, confirmation), span) in indices.into_iter().zip(confirmations).zip(spans) {
                    let outcome = match confirmation {
                        Ok(Confirmation::Ack(None) | Confirmation::NotRequested) => {
                            Outcome::Published(None)
                        }
                        Ok(Confirmation::Ack(Some(returned))) => Outcome::Transient(format!(
                            "unroutable: exchange {} has no queue bound for routing key {:?} ({} {})",
                            returned.delivery.exchange,
                            returned.delivery.routing_key.as_str(),
                            returned.reply_code,
                            returned.reply_text,
                        )),
                        Ok(Confirmation::Nack(_)) => {
                            Outcome::Transient("the broker refused the message (nack)".to_owned())
                        }
                        Err(error) => {
                            broken = true;
                            Outcome::Transient(format!("no confirm: {error}"))
                        }
                    };
                    record_failure(&span, &outcome);
                    outcomes[i] = Some(outcome);
                }
            }
            Err(_elapsed) => {
                broken = true;
                let outcome = Outcome::Transient(format!(
                    "no confirm within --delivery-timeout ({:?})",
                    self.delivery_timeout
                ));
                for (i, span) in indices.into_iter().zip(spans) {
                    record_failure(&span, &outcome);
                    outcomes[i] = Some(outcome.clone());
                }
            }
        }
        if broken && generation == self.generation {
            self.reconnect().await;
        }
        outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or(Outcome::Transient("no outcome".to_owned())))
            .collect()
    }

    /// Replaces the link: the old one is closed first. A broker that does
    /// not answer leaves no link; the next batch fails as transient and
    /// tries again.
    async fn reconnect(&mut self) {
        if let Some(link) = self.link.take() {
            link.close().await;
        }
        self.generation += 1;
        match Link::open(&self.url).await {
            Ok(link) => {
                metrics::counter!("relay_producer_rebuilds_total").increment(1);
                tracing::info!("reconnected to RabbitMQ");
                self.link = Some(link);
            }
            Err(error) => {
                tracing::warn!(error.cause_chain = ?error, error.message = %error,
                    "cannot reconnect to RabbitMQ; the next batch tries again");
            }
        }
    }

    /// Closes the connection once what was handed over is confirmed, or
    /// `timeout` has passed.
    pub async fn flush(&self, timeout: Duration) {
        if let Some(link) = &self.link {
            if tokio::time::timeout(timeout, link.channel.wait_for_confirms())
                .await
                .is_err()
            {
                tracing::warn!("confirms still outstanding at shutdown");
            }
            let _ = link.connection.close(200, "relay stopping".into()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_keep_text_as_text_bytes_as_bytes_and_null_as_void() {
        let table = header_table(
            [
                ("id", Some(b"0190".as_slice())),
                ("traceparent", None),
                ("odd", Some([0xff_u8, 0x00].as_slice())),
            ]
            .into_iter(),
        );
        let get = |name: &str| table.inner().get(name).cloned();
        assert_eq!(
            get("id"),
            Some(AMQPValue::LongString(LongString::from(b"0190".to_vec())))
        );
        assert_eq!(get("traceparent"), Some(AMQPValue::Void));
        assert!(matches!(get("odd"), Some(AMQPValue::ByteArray(_))));
    }
}

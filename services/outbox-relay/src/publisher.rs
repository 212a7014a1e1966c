//! Sends a batch of rows to the broker and reports, per row, what happened:
//! to Kafka ([`kafka`]) or to RabbitMQ ([`amqp`]), chosen by `--transport`.
//! The relay's loop sees only [`Publisher`], [`Sent`] and [`Outcome`]: both
//! transports hand rows over in order until `send_by` (the send fence),
//! count a row as published only once the broker acknowledged it, and let
//! a second batch be handed over while the first awaits its acknowledgements.

use std::borrow::Borrow;
use std::time::{Duration, Instant};

use crate::record::{OutboxRow, Router};

pub mod amqp; // RabbitMQ: topic exchanges, publisher confirms, mandatory returns
pub mod kafka; // Kafka: an idempotent acks=all producer

/// Where the broker put a published row, when it says: a Kafka partition
/// and offset. A RabbitMQ confirm names no position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub partition: i32,
    pub offset: i64,
}

/// What happened to one row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The broker acknowledged it (at this position, on Kafka).
    Published(Option<Position>),
    /// It failed because of itself (too large, an invalid topic name): it
    /// will fail again, so it counts toward parking.
    Poison(String),
    /// It failed for reasons outside the row: broker unavailable, timeout,
    /// a topic or exchange that does not exist or may not be written to, a
    /// message RabbitMQ could not route (someone must fix the broker, not
    /// the row; it goes once they have).
    Transient(String),
    /// Not handed to the producer: the leader's lease ran too short to send
    /// it safely (leadership.rs). The row stays as it was.
    Withheld,
}

/// Marks a span whose record was not published: an error, or withheld
/// (never handed to the producer; the row goes out again later).
fn record_failure(span: &tracing::Span, outcome: &Outcome) {
    let kind = match outcome {
        Outcome::Poison(_) => "poison",
        Outcome::Transient(_) => "transient",
        Outcome::Withheld => {
            span.record("error.type", "withheld");
            return;
        }
        Outcome::Published(_) => return,
    };
    span.record("otel.status_code", "ERROR");
    span.record("error.type", kind);
}

/// The topic (the exchange, on RabbitMQ) `row` goes to; a row whose
/// `aggregatetype` makes none is poison, its producer span (`span`, the
/// transport's) marked so.
fn route<'r>(
    router: &'r mut Router,
    row: &OutboxRow,
    span: fn(&OutboxRow, &str) -> tracing::Span,
) -> Result<&'r str, Outcome> {
    router.topic(&row.aggregatetype).map_err(|error| {
        let outcome = Outcome::Poison(error.to_string());
        record_failure(&span(row, &row.aggregatetype), &outcome);
        outcome
    })
}

/// The relay's producer, on one transport or the other.
#[derive(Debug)]
pub enum Publisher {
    Kafka(kafka::Publisher),
    /// Boxed: a connection and a channel are larger than a producer handle.
    Amqp(Box<amqp::Publisher>),
}

/// A batch handed to the producer, its acknowledgements still to come.
#[derive(Debug)]
pub enum Sent {
    Kafka(kafka::Sent),
    Amqp(amqp::Sent),
}

impl Publisher {
    /// Publishes `rows` in order and waits for every acknowledgement; a row
    /// not handed to the producer by `send_by` is withheld. Returns one
    /// outcome per row, in the same order.
    pub async fn publish<R: Borrow<OutboxRow>>(
        &mut self,
        rows: &[R],
        send_by: Instant,
    ) -> Vec<Outcome> {
        let sent = self.send(rows, send_by).await;
        self.settle(rows, sent, send_by).await
    }

    /// Hands `rows` to the producer in order, without waiting for their
    /// acknowledgements ([`Self::settle`] does); a row not handed over by
    /// `send_by` is withheld, and so are the rows after it.
    pub async fn send<R: Borrow<OutboxRow>>(&self, rows: &[R], send_by: Instant) -> Sent {
        match self {
            Self::Kafka(publisher) => Sent::Kafka(publisher.send(rows, send_by).await),
            Self::Amqp(publisher) => Sent::Amqp(publisher.send(rows, send_by).await),
        }
    }

    /// Waits for the acknowledgements of `rows`, handed over by
    /// [`Self::send`], and returns one outcome per row, in order. A
    /// producer whose batch failed is replaced under any other batch in
    /// flight, whose rows then fail as transient (and are retried).
    pub async fn settle<R: Borrow<OutboxRow>>(
        &mut self,
        rows: &[R],
        sent: Sent,
        send_by: Instant,
    ) -> Vec<Outcome> {
        match (self, sent) {
            (Self::Kafka(publisher), Sent::Kafka(sent)) => {
                publisher.settle(rows, sent, send_by).await
            }
            (Self::Amqp(publisher), Sent::Amqp(sent)) => publisher.settle(sent).await,
            // A batch is settled by the publisher that sent it; the relay
            // holds one publisher, so this cannot happen: should it, the
            // rows are retried.
            _ => vec![Outcome::Transient("settled by another transport".to_owned()); rows.len()],
        }
    }

    /// Waits up to `timeout` for what was handed over to be acknowledged.
    pub async fn flush(&self, timeout: Duration) {
        match self {
            Self::Kafka(publisher) => publisher.flush(timeout),
            Self::Amqp(publisher) => publisher.flush(timeout).await,
        }
    }
}

//! RabbitMQ for tests: the machine's broker (`AMQP_URL`), an exchange and a
//! queue of the test's own bound to it, and its messages read with
//! everything they carried.

use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use uuid::Uuid;

use crate::kafka::Record;

/// The broker the tests use: `AMQP_URL`, or the machine's own.
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| service_support::amqp::DEFAULT_URL.to_owned())
}

pub async fn connect() -> Connection {
    Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("RabbitMQ answers at AMQP_URL (scripts/services up)")
}

/// Declares `exchange` as a topic exchange that goes once its last queue
/// is unbound, so that tests leave none behind. Tests name theirs uniquely.
pub async fn declare_exchange(channel: &Channel, exchange: &str) {
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                auto_delete: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
}

/// Publishes `body` to `exchange` persistent, as the relay would, with
/// `headers` (text values) and the message id, if any; waits for the confirm
/// when the channel is in confirm mode.
pub async fn publish(
    channel: &Channel,
    exchange: &str,
    routing_key: &str,
    message_id: Option<&str>,
    headers: FieldTable,
    body: &[u8],
) {
    let mut properties = lapin::BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(id) = message_id {
        properties = properties.with_message_id(id.into());
    }
    channel
        .basic_publish(
            exchange.into(),
            routing_key.into(),
            lapin::options::BasicPublishOptions::default(),
            body,
            properties,
        )
        .await
        .unwrap()
        .await
        .unwrap();
}

/// Deletes queues and exchanges a test declared (missing ones are fine).
pub async fn delete(queues: &[&str], exchanges: &[&str]) {
    let connection = connect().await;
    let channel = connection.create_channel().await.unwrap();
    for queue in queues {
        let _ = channel
            .queue_delete(
                (*queue).into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await;
    }
    for exchange in exchanges {
        let _ = channel
            .exchange_delete(
                (*exchange).into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await;
    }
    let _ = connection.close(200, "cleaned up".into()).await;
}

/// A message as consumed.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub exchange: String,
    pub routing_key: String,
    pub message_id: Option<String>,
    pub kind: Option<String>,
    pub content_type: Option<String>,
    pub delivery_mode: Option<u8>,
    /// In name order (an AMQP table is sorted); `None` is a void value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub body: Vec<u8>,
}

impl Message {
    /// A header's value as text; `None` if absent or void.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.as_deref())
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
    }

    /// The message as the Kafka record it stands for, keyed by its
    /// `aggregateId` header, so that the Kafka-side delivery checks apply.
    pub fn as_record(&self) -> Record {
        Record {
            topic: self.exchange.clone(),
            partition: 0,
            offset: 0,
            key: self.header("aggregateId").map(String::into_bytes),
            value: Some(self.body.clone()),
            headers: self.headers.clone(),
        }
    }
}

/// A server-named, exclusive queue bound to an exchange: it sees what is
/// published there from the moment it is bound, and goes with the test.
#[derive(Debug)]
pub struct TestQueue {
    _connection: Connection,
    pub channel: Channel,
    pub name: String,
    consumer: lapin::Consumer,
}

impl TestQueue {
    /// Binds a new queue to `exchange` (declared if missing) with `binding`
    /// (`#`: every routing key).
    pub async fn bound(exchange: &str, binding: &str) -> Self {
        let connection = connect().await;
        let channel = connection.create_channel().await.unwrap();
        declare_exchange(&channel, exchange).await;
        let name = format!("test.{}", Uuid::new_v4().simple());
        channel
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                name.as_str().into(),
                exchange.into(),
                binding.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        Self::consuming(connection, channel, name).await
    }

    /// Consumes an existing queue (a consumer's dead-letter queue, say).
    pub async fn existing(name: &str) -> Self {
        let connection = connect().await;
        let channel = connection.create_channel().await.unwrap();
        Self::consuming(connection, channel, name.to_owned()).await
    }

    async fn consuming(connection: Connection, channel: Channel, name: String) -> Self {
        let consumer = channel
            .basic_consume(
                name.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        Self {
            _connection: connection,
            channel,
            name,
            consumer,
        }
    }

    /// Reads (and acknowledges) until `count` messages came or `deadline`
    /// passed, then what else arrives within a short grace: duplicates show.
    pub async fn read_at_least(&mut self, count: usize, deadline: Duration) -> Vec<Message> {
        let until = Instant::now() + deadline;
        let mut messages = Vec::new();
        while messages.len() < count && Instant::now() < until {
            if let Some(message) = self.next(until - Instant::now()).await {
                messages.push(message);
            }
        }
        messages.extend(self.read_for(Duration::from_millis(500)).await);
        messages
    }

    /// Everything that arrives within `window`.
    pub async fn read_for(&mut self, window: Duration) -> Vec<Message> {
        let until = Instant::now() + window;
        let mut messages = Vec::new();
        while Instant::now() < until {
            if let Some(message) = self.next(until - Instant::now()).await {
                messages.push(message);
            }
        }
        messages
    }

    async fn next(&mut self, wait: Duration) -> Option<Message> {
        let delivery = tokio::time::timeout(wait, self.consumer.next())
            .await
            .ok()??
            .unwrap();
        delivery.ack(BasicAckOptions::default()).await.unwrap();
        let properties = &delivery.properties;
        let text = |value: &Option<lapin::types::ShortString>| {
            value.as_ref().map(|v| v.as_str().to_owned())
        };
        Some(Message {
            exchange: delivery.exchange.as_str().to_owned(),
            routing_key: delivery.routing_key.as_str().to_owned(),
            message_id: text(properties.message_id()),
            kind: text(properties.kind()),
            content_type: text(properties.content_type()),
            delivery_mode: *properties.delivery_mode(),
            headers: service_support::amqp::headers(properties),
            body: delivery.data.clone(),
        })
    }
}

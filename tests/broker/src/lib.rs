//! Proof that the Kafka-protocol broker on `KAFKA_BOOTSTRAP_SERVERS` does
//! what entrega relies on, before anything else uses it.
//!
//! The tests in `tests/broker/` talk to the real broker through rdkafka and
//! its bundled librdkafka, the same client the services use. This library
//! holds what they share: client configuration, unique names, and a receive
//! loop with a deadline. Every test makes its own topic and consumer group,
//! so the tests run in parallel and never see each other's records.

use std::time::Duration;

use futures::future::try_join_all;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::util::Timeout;

/// How long any single broker operation in these tests may take before the
/// test fails instead of hanging.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// Long enough that a member is not expired while the broker (tansu keeps
/// its group state in PostgreSQL) answers heartbeats slowly under the rest of
/// the suite's load: at 6 s a member of the split test was once expired
/// mid-test and its partitions moved to the other member. Short enough that a
/// member that vanishes without leaving is noticed within a test's deadline.
const SESSION_TIMEOUT_MS: &str = "20000";

/// The broker address, from the same variable the services read.
pub fn bootstrap_servers() -> String {
    std::env::var("KAFKA_BOOTSTRAP_SERVERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// A name no other test run uses, so tests never share topics or groups.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn base_config() -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap_servers());
    config
}

/// Creates a topic with one replica; fails the test on any error.
pub async fn create_topic(name: &str, partitions: i32) {
    let results = try_create_topic(name, partitions).await;
    if let Err(code) = results {
        panic!("creating topic {name}: {code}");
    }
}

/// Creates a topic, returning the broker's error code if it refused.
pub async fn try_create_topic(name: &str, partitions: i32) -> Result<(), RDKafkaErrorCode> {
    let admin: AdminClient<DefaultClientContext> = base_config()
        .create()
        .expect("admin client config is valid");
    let options = AdminOptions::new().operation_timeout(Some(OPERATION_TIMEOUT));
    let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    let results = admin
        .create_topics(&[topic], &options)
        .await
        .expect("create_topics request reached the broker");
    match results.into_iter().next() {
        Some(Ok(_)) => Ok(()),
        Some(Err((_, code))) => Err(code),
        None => panic!("broker answered create_topics with no result"),
    }
}

/// The producer configuration entrega's relay uses: idempotent, acks=all,
/// Java-compatible key partitioning.
pub fn idempotent_producer() -> FutureProducer {
    base_config()
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("producer config is valid")
}

/// A consumer in `group` with manual offset storage and manual commits,
/// reading from the start of partitions that have no committed offset.
pub fn manual_commit_consumer(group: &str) -> StreamConsumer {
    base_config()
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", SESSION_TIMEOUT_MS)
        .create()
        .expect("consumer config is valid")
}

/// One record as the tests compare it: owned, headers decoded as UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    pub value: String,
    pub headers: Vec<(String, String)>,
}

impl Received {
    /// The value of header `name`, if the record carries it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

fn text(bytes: Option<&[u8]>) -> String {
    String::from_utf8_lossy(bytes.unwrap_or_default()).into_owned()
}

/// Receives exactly `count` records, or panics when `deadline` passes first.
/// Offsets are stored (not committed) as records arrive; the caller decides
/// when to commit.
pub async fn receive(consumer: &StreamConsumer, count: usize, deadline: Duration) -> Vec<Received> {
    let mut received = Vec::with_capacity(count);
    let outcome = tokio::time::timeout(deadline, async {
        while received.len() < count {
            let message = consumer
                .recv()
                .await
                .expect("consumer error while receiving");
            let headers = message
                .headers()
                .map(|headers| {
                    headers
                        .iter()
                        .map(|header| (header.key.to_owned(), text(header.value)))
                        .collect()
                })
                .unwrap_or_default();
            consumer
                .store_offset_from_message(&message)
                .expect("storing an offset of an assigned partition");
            received.push(Received {
                partition: message.partition(),
                offset: message.offset(),
                key: text(message.key()),
                value: text(message.payload()),
                headers,
            });
        }
    })
    .await;
    if outcome.is_err() {
        panic!(
            "received {} of {count} records within {deadline:?}",
            received.len()
        );
    }
    received
}

/// Headers as the relay sets them: the message id and the event type.
pub fn event_headers(id: &str, event_type: &str) -> OwnedHeaders {
    OwnedHeaders::new()
        .insert(Header {
            key: "id",
            value: Some(id),
        })
        .insert(Header {
            key: "eventType",
            value: Some(event_type),
        })
}

/// A record to send: `partition` of `None` lets the partitioner choose by key.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub key: String,
    pub value: String,
    pub id: String,
    pub partition: Option<i32>,
}

impl Outgoing {
    pub fn keyed(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
            id: uuid::Uuid::now_v7().to_string(),
            partition: None,
        }
    }

    pub fn to_partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }
}

/// Sends all records concurrently and waits for every delivery report.
/// Returns (partition, offset) per record, in input order.
pub async fn send_all(
    producer: &FutureProducer,
    topic: &str,
    records: &[Outgoing],
) -> Vec<(i32, i64)> {
    let mut deliveries = Vec::with_capacity(records.len());
    for outgoing in records {
        let mut record = FutureRecord::to(topic)
            .key(outgoing.key.as_str())
            .payload(outgoing.value.as_str())
            .headers(event_headers(&outgoing.id, "PedidoCriado"));
        if let Some(partition) = outgoing.partition {
            record = record.partition(partition);
        }
        let delivery = loop {
            match producer.send_result(record) {
                Ok(delivery) => break delivery,
                Err((error, returned)) => {
                    // A full local queue is back-pressure, not failure.
                    if error.rdkafka_error_code() != Some(RDKafkaErrorCode::QueueFull) {
                        panic!("enqueueing a record: {error}");
                    }
                    record = returned;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        deliveries.push(delivery);
    }
    let reports = try_join_all(deliveries)
        .await
        .expect("producer dropped a delivery future");
    reports
        .into_iter()
        .map(|report| match report {
            Ok(delivery) => (delivery.partition, delivery.offset),
            Err((error, _)) => panic!("delivery failed: {error}"),
        })
        .collect()
}

/// Commits the stored offsets and waits for the broker to confirm.
pub fn commit_stored(consumer: &StreamConsumer) {
    consumer
        .commit_consumer_state(rdkafka::consumer::CommitMode::Sync)
        .expect("committing stored offsets");
}

/// Low and high watermarks of one partition.
pub fn watermarks(consumer: &StreamConsumer, topic: &str, partition: i32) -> (i64, i64) {
    consumer
        .fetch_watermarks(topic, partition, Timeout::After(OPERATION_TIMEOUT))
        .expect("fetching watermarks")
}

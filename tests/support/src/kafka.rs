use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// The broker address the services use.
pub fn bootstrap_servers() -> String {
    std::env::var("KAFKA_BOOTSTRAP_SERVERS").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// Properties every client these helpers make carries, on top of the
/// environment's `KAFKA_*` (see [`client_config`]).
static SECURITY: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

/// From now on every client the helpers make carries `properties` (SASL,
/// TLS): for a test against a broker that requires them. Once per process;
/// nextest runs each test in a process of its own.
pub fn secure_clients(properties: Vec<(String, String)>) {
    SECURITY
        .set(properties)
        .expect("secure_clients is called once per test process");
}

/// A client configuration as the services make theirs: the bootstrap
/// servers, then the environment's `KAFKA_*` properties (a benchmark run
/// against a broker with SASL and TLS passes them so), then what
/// [`secure_clients`] set.
pub fn client_config(bootstrap: &str) -> ClientConfig {
    let mut config = service_support::kafka::client_config(bootstrap, &[])
        .unwrap_or_else(|error| panic!("the KAFKA_* variables: {error}"));
    for (key, value) in SECURITY.get().into_iter().flatten() {
        config.set(key, value);
    }
    config
}

/// A topic or group name no other test uses.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Creates a topic (existing is fine) and waits until its metadata shows it.
pub async fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    create_topic_with(&client_config(bootstrap), name, partitions).await;
}

/// [`create_topic`] through a client made from `config` (a broker that
/// needs properties of its own).
pub async fn create_topic_with(config: &ClientConfig, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = config.create().unwrap();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &options,
        )
        .await
        .expect("create_topics reached the broker");
    for result in results {
        if let Err((topic, code)) = result {
            assert_eq!(
                code,
                RDKafkaErrorCode::TopicAlreadyExists,
                "creating {topic}"
            );
        }
    }
}

/// Produces one record, as a foreign producer would (no idempotence, the
/// default partitioner), and waits for its acknowledgement.
pub async fn produce(
    bootstrap: &str,
    topic: &str,
    key: &str,
    value: &[u8],
    headers: &[(&str, Option<&[u8]>)],
) {
    let producer: FutureProducer = crate::kafka::client_config(bootstrap).create().unwrap();
    let headers = headers.iter().fold(OwnedHeaders::new(), |h, (key, value)| {
        h.insert(Header { key, value: *value })
    });
    producer
        .send(
            FutureRecord::to(topic)
                .key(key)
                .payload(value)
                .headers(headers),
            Duration::from_secs(30),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();
}

/// Hands `record` to the producer, waiting while its queue is full: for
/// tests and benchmarks that enqueue many records at once. Any other error
/// fails the caller rather than being retried for ever.
pub async fn enqueue<'a>(
    producer: &FutureProducer,
    mut record: FutureRecord<'a, str, str>,
) -> DeliveryFuture {
    loop {
        match producer.send_result(record) {
            Ok(delivery) => return delivery,
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                record = returned;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Err((error, _)) => panic!("enqueueing a record: {error}"),
        }
    }
}

/// One record as a test compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// In record order; `None` is a header with a null value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Record {
    /// A header's value as text; `None` if absent or null.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .and_then(|(_, value)| value.as_ref())
            .map(|value| String::from_utf8_lossy(value).into_owned())
    }

    pub fn key_text(&self) -> String {
        String::from_utf8_lossy(self.key.as_deref().unwrap_or_default()).into_owned()
    }

    pub fn value_text(&self) -> String {
        String::from_utf8_lossy(self.value.as_deref().unwrap_or_default()).into_owned()
    }
}

/// Reads a whole topic from the start, partition by partition, without a
/// consumer group. Successive reads continue where the last one stopped.
#[derive(Clone)]
pub struct TopicReader {
    consumer: Arc<BaseConsumer>,
    topic: String,
}

impl std::fmt::Debug for TopicReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicReader")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl TopicReader {
    pub fn new(bootstrap: &str, topic: &str) -> Self {
        let consumer: BaseConsumer = crate::kafka::client_config(bootstrap)
            .set("group.id", unique_name("reader"))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(30))
            .expect("topic metadata");
        let partitions = metadata.topics()[0].partitions().len();
        assert!(partitions > 0, "topic {topic} has no partitions");
        let mut assignment = TopicPartitionList::new();
        for partition in 0..partitions {
            assignment
                .add_partition_offset(topic, i32::try_from(partition).unwrap(), Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&assignment).unwrap();
        Self {
            consumer: Arc::new(consumer),
            topic: topic.to_owned(),
        }
    }

    /// Records available now, waiting at most `idle` for each next one.
    pub async fn read_available(&self, idle: Duration) -> Vec<Record> {
        let consumer = Arc::clone(&self.consumer);
        let topic = self.topic.clone();
        // librdkafka's poll blocks; keep it off the runtime's threads.
        tokio::task::spawn_blocking(move || {
            let mut records = Vec::new();
            while let Some(result) = consumer.poll(idle) {
                records.push(to_record(&topic, &result.expect("consuming")));
            }
            records
        })
        .await
        .unwrap()
    }

    /// Reads everything the topic holds now: as many records as its
    /// watermarks say, however long the broker takes to serve them.
    pub async fn read_all(&self, deadline: Duration) -> Vec<Record> {
        let consumer = Arc::clone(&self.consumer);
        let topic = self.topic.clone();
        let total = tokio::task::spawn_blocking(move || {
            let metadata = consumer
                .fetch_metadata(Some(&topic), Duration::from_secs(30))
                .expect("topic metadata");
            metadata.topics()[0]
                .partitions()
                .iter()
                .map(|p| {
                    let (low, high) = consumer
                        .fetch_watermarks(&topic, p.id(), Duration::from_secs(30))
                        .expect("watermarks");
                    usize::try_from(high - low).unwrap_or(0)
                })
                .sum::<usize>()
        })
        .await
        .unwrap();
        self.read_at_least(total, deadline).await
    }

    /// Reads until at least `count` records arrived in all, or panics after
    /// `deadline`.
    pub async fn read_at_least(&self, count: usize, deadline: Duration) -> Vec<Record> {
        let started = tokio::time::Instant::now();
        let mut records = Vec::new();
        while records.len() < count {
            assert!(
                started.elapsed() < deadline,
                "only {} of {count} records on {} within {deadline:?}",
                records.len(),
                self.topic
            );
            records.extend(self.read_available(Duration::from_millis(200)).await);
        }
        records
    }
}

fn to_record(topic: &str, message: &BorrowedMessage<'_>) -> Record {
    let headers = message
        .headers()
        .map(|headers| {
            headers
                .iter()
                .map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec)))
                .collect()
        })
        .unwrap_or_default();
    Record {
        topic: topic.to_owned(),
        partition: message.partition(),
        offset: message.offset(),
        key: message.key().map(<[u8]>::to_vec),
        value: message.payload().map(<[u8]>::to_vec),
        headers,
    }
}

pub use service_support::kafka::{java_partition, murmur2};

/// Records grouped by a header's value, for duplicate and order checks.
pub fn by_header(records: &[Record], name: &str) -> HashMap<String, Vec<Record>> {
    let mut grouped: HashMap<String, Vec<Record>> = HashMap::new();
    for record in records {
        if let Some(value) = record.header(name) {
            grouped.entry(value).or_default().push(record.clone());
        }
    }
    grouped
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's UtilsTest.testMurmur2 vectors.
    #[test]
    fn murmur2_matches_the_java_client() {
        for (input, expected) in [
            ("21", -973_932_308),
            ("foobar", -790_332_482),
            ("a-little-bit-long-string", -985_981_536),
            ("a-little-bit-longer-string", -1_486_304_829),
            (
                "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            ("abc", 479_470_107),
        ] {
            assert_eq!(murmur2(input.as_bytes()), expected, "{input}");
        }
    }
}

use std::time::Duration;

use idempotent_consumer::{DeadLetter, DltReason, Failure, Header, Record};
use rdkafka::ClientConfig;
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use test_support::broker::PrivateBroker;
use test_support::database::TestDatabase;
use test_support::kafka::create_topic;

/// The pipeline's topics, by the names the console reads by default.
pub(crate) const ORDERS_TOPIC: &str = "pedido.eventos";
pub(crate) const ORDERS_DLT: &str = "pedido.eventos.dlt";
pub(crate) const STOCK_TOPIC: &str = "estoque.eventos";
pub(crate) const STOCK_DLT: &str = "estoque.eventos.dlt";

/// The variables through which the services and the console name their
/// consumers' topics and groups: none leaks into a run from the test's own
/// environment.
const CONSUMER_VARIABLES: [&str; 6] = [
    "INVENTORY_TOPIC",
    "INVENTORY_DLT_TOPIC",
    "INVENTORY_GROUP",
    "ORDER_STATUS_TOPIC",
    "ORDER_STATUS_DLT_TOPIC",
    "ORDER_STATUS_GROUP",
];

fn server(variable: &str, fallback: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| fallback.to_owned())
}

/// A record as a producer sent it.
pub(crate) struct Message<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
    pub(crate) headers: &'a [(&'a str, &'a [u8])],
}

/// One test's broker and databases.
pub(crate) struct ConsoleTest {
    pub(crate) broker: PrivateBroker,
    pub(crate) orders: TestDatabase,
    pub(crate) inventory: TestDatabase,
    producer: FutureProducer,
}

/// What a run of `entrega` printed, and how it ended.
#[derive(Debug)]
pub(crate) struct Printed {
    pub(crate) code: Option<i32>,
    /// Raw bytes made text: a control character stays what it was.
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl ConsoleTest {
    pub(crate) async fn new() -> Self {
        let broker = PrivateBroker::start().await;
        for topic in [ORDERS_TOPIC, ORDERS_DLT, STOCK_TOPIC, STOCK_DLT] {
            create_topic(&broker.address, topic, 3).await;
        }
        let (orders, _) = TestDatabase::create_migrated(
            &server(
                "ORDER_DATABASE_URL",
                "postgres://postgres@127.0.0.1:5432/orders",
            ),
            "console_orders",
            &order_service::startup::migrations(),
            1,
        )
        .await;
        let (inventory, _) = TestDatabase::create_migrated(
            &server(
                "INVENTORY_DATABASE_URL",
                "postgres://postgres@127.0.0.1:5432/inventory",
            ),
            "console_inventory",
            &inventory_service::startup::migrations(),
            1,
        )
        .await;
        let producer = test_support::kafka::client_config(&broker.address)
            .set("enable.idempotence", "true")
            .create()
            .unwrap();
        Self {
            broker,
            orders,
            inventory,
            producer,
        }
    }

    /// A client of this test's broker, as a service would configure it.
    pub(crate) fn kafka(&self) -> ClientConfig {
        test_support::kafka::client_config(&self.broker.address)
    }

    /// Runs `entrega <args>` against this test's databases and broker,
    /// with `envs` as its only consumer variables.
    pub(crate) async fn entrega(&self, args: &[&str], envs: &[(&str, &str)]) -> Printed {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_entrega"));
        command
            .args([
                "--orders-database-url",
                &self.orders.url(),
                "--inventory-database-url",
                &self.inventory.url(),
                "--bootstrap-servers",
                &self.broker.address,
                // No service of this test serves metrics: a refused
                // connection is answered at once.
                "--services",
                "none=http://127.0.0.1:9",
            ])
            .args(args)
            .env("RUST_LOG", "warn");
        for variable in CONSUMER_VARIABLES {
            command.env_remove(variable);
        }
        command.envs(envs.iter().copied());
        let output = command.output().await.expect("running entrega");
        Printed {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    async fn send(
        &self,
        topic: &str,
        partition: i32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(String, Option<Vec<u8>>)],
    ) -> i64 {
        let headers = headers
            .iter()
            .fold(OwnedHeaders::new(), |all, (name, value)| {
                all.insert(KafkaHeader {
                    key: name,
                    value: value.as_deref(),
                })
            });
        let mut record = FutureRecord::<[u8], [u8]>::to(topic)
            .partition(partition)
            .headers(headers);
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(value) = value {
            record = record.payload(value);
        }
        self.producer
            .send(record, Duration::from_secs(30))
            .await
            .map_err(|(error, _)| error)
            .unwrap()
            .offset
    }

    /// Writes `message` to `topic`'s `partition`, then its dead letter to
    /// `dlt` as the consumer in `group` would (same partition, the DLT
    /// headers added, invalid JSON as the reason); returns the dead
    /// letter's offset.
    pub(crate) async fn dead_letter(
        &self,
        topic: &str,
        dlt: &str,
        group: &str,
        partition: i32,
        message: Message<'_>,
    ) -> i64 {
        let Message {
            key,
            value,
            headers,
        } = message;
        let headers: Vec<(String, Option<Vec<u8>>)> = headers
            .iter()
            .map(|(name, value)| ((*name).to_owned(), Some(value.to_vec())))
            .collect();
        let offset = self
            .send(topic, partition, Some(key), Some(value), &headers)
            .await;
        let source = Record {
            topic: topic.to_owned(),
            partition,
            offset,
            timestamp: rdkafka::Timestamp::CreateTime(0),
            key: Some(key.to_vec()),
            value: Some(value.to_vec()),
            headers: headers
                .iter()
                .map(|(name, value)| Header::new(name, value.as_deref()))
                .collect(),
            unreadable_headers: false,
        };
        let failure = Failure {
            reason: DltReason::InvalidJson,
            message: "expected value at line 1 column 1".to_owned(),
            error_type: "serde_json::Error",
            attempts: 1,
        };
        let letter = DeadLetter::of(&source, group, &failure);
        self.send(
            dlt,
            letter.partition,
            letter.key.as_deref(),
            letter.value.as_deref(),
            &letter.headers,
        )
        .await
    }
}

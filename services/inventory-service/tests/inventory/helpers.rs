use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::Value;
use sqlx::PgPool;
use test_support::database::TestDatabase;
use test_support::eventually::eventually;
use test_support::kafka::{
    Record, TopicReader, bootstrap_servers, create_topic, enqueue, unique_name,
};
use test_support::process::{Service, free_port};
use uuid::Uuid;

pub(crate) const SERVICE: &str = env!("CARGO_BIN_EXE_inventory-service");
pub(crate) const PARTITIONS: i32 = 6;

pub(crate) fn inventory_server() -> String {
    std::env::var("INVENTORY_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/inventory".to_owned())
}

/// One test's database, topics and group.
pub(crate) struct InventoryTest {
    pub(crate) database: TestDatabase,
    pub(crate) pool: PgPool,
    pub(crate) topic: String,
    pub(crate) dlt: String,
    pub(crate) group: String,
    pub(crate) bootstrap: String,
    producer: FutureProducer,
}

/// A record to produce; `None` fields are left out.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    pub(crate) key: Option<String>,
    pub(crate) value: Option<String>,
    pub(crate) headers: Vec<(&'static str, Option<String>)>,
    pub(crate) partition: Option<i32>,
}

impl Outgoing {
    /// A valid PedidoCriado for `order_id` with a fresh message id.
    pub(crate) fn order(order_id: Uuid, items: &[(&str, i64)]) -> Self {
        Self::order_with_id(Uuid::now_v7(), order_id, items)
    }

    pub(crate) fn order_with_id(message_id: Uuid, order_id: Uuid, items: &[(&str, i64)]) -> Self {
        let itens: Vec<Value> = items
            .iter()
            .map(|(sku, quantity)| serde_json::json!({"sku": sku, "quantidade": quantity}))
            .collect();
        let value = serde_json::json!({
            "itens": itens, "criadoEm": "2026-12-02T15:00:00Z",
            "pedidoId": order_id.to_string(), "clienteId": "c-42",
        });
        Self {
            key: Some(order_id.to_string()),
            value: Some(value.to_string()),
            headers: vec![
                ("id", Some(message_id.to_string())),
                ("eventType", Some("PedidoCriado".to_owned())),
                ("traceparent", None),
            ],
            partition: None,
        }
    }

    /// A valid PedidoCancelado for `order_id` with a fresh message id.
    pub(crate) fn cancellation(order_id: Uuid) -> Self {
        Self {
            key: Some(order_id.to_string()),
            value: Some(
                serde_json::json!({"pedidoId": order_id.to_string(), "canceladoEm": "2026-12-05T10:00:00Z"})
                    .to_string(),
            ),
            headers: vec![
                ("id", Some(Uuid::now_v7().to_string())),
                ("eventType", Some("PedidoCancelado".to_owned())),
            ],
            partition: None,
        }
    }

    pub(crate) fn on_partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    pub(crate) fn message_id(&self) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| *k == "id")
            .and_then(|(_, v)| v.as_deref())
    }
}

impl InventoryTest {
    pub(crate) async fn new() -> Self {
        Self::with_dlt_partitions(PARTITIONS).await
    }

    pub(crate) async fn with_dlt_partitions(dlt_partitions: i32) -> Self {
        Self::on(bootstrap_servers(), &inventory_server(), dlt_partitions).await
    }

    /// A test on a broker and a PostgreSQL server of its choosing (private
    /// ones, for fault tests).
    pub(crate) async fn on(bootstrap: String, database_server: &str, dlt_partitions: i32) -> Self {
        let (database, pool) = TestDatabase::create_migrated(
            database_server,
            "inventory_test",
            &inventory_service::startup::migrations(),
            4,
        )
        .await;
        let topic = unique_name("invtest");
        let dlt = format!("{topic}.dlt");
        create_topic(&bootstrap, &topic, PARTITIONS).await;
        create_topic(&bootstrap, &dlt, dlt_partitions).await;
        let producer = test_support::kafka::client_config(&bootstrap)
            .set("enable.idempotence", "true")
            .set("partitioner", "murmur2_random")
            // Tests send records near and over the services' size limits.
            .set("message.max.bytes", "10000000")
            .create()
            .unwrap();
        Self {
            database,
            pool,
            group: unique_name("estoque-test"),
            topic,
            dlt,
            bootstrap,
            producer,
        }
    }

    pub(crate) async fn set_stock(&self, sku: &str, available: i32) {
        sqlx::query("insert into stock (sku, available) values ($1, $2) on conflict (sku) do update set available = $2")
            .bind(sku)
            .bind(available)
            .execute(&self.pool)
            .await
            .unwrap();
    }

    /// (available, reserved) of a sku.
    pub(crate) async fn stock(&self, sku: &str) -> (i64, i64) {
        sqlx::query_as("select available::int8, reserved::int8 from stock where sku = $1")
            .bind(sku)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    fn future_record<'a>(&'a self, record: &'a Outgoing) -> FutureRecord<'a, str, str> {
        let headers = record
            .headers
            .iter()
            .fold(OwnedHeaders::new(), |headers, (key, value)| {
                headers.insert(Header {
                    key,
                    value: value.as_deref(),
                })
            });
        let mut outgoing = FutureRecord::<str, str>::to(&self.topic).headers(headers);
        if let Some(key) = &record.key {
            outgoing = outgoing.key(key.as_str());
        }
        if let Some(value) = &record.value {
            outgoing = outgoing.payload(value.as_str());
        }
        if let Some(partition) = record.partition {
            outgoing = outgoing.partition(partition);
        }
        outgoing
    }

    pub(crate) async fn produce(&self, record: &Outgoing) -> (i32, i64) {
        let delivery = self
            .producer
            .send(self.future_record(record), Duration::from_secs(30))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        (delivery.partition, delivery.offset)
    }

    /// Produces many records at once, in order, and waits for every
    /// acknowledgement.
    pub(crate) async fn produce_all(&self, records: &[Outgoing]) {
        let mut deliveries = Vec::with_capacity(records.len());
        for record in records {
            deliveries.push(enqueue(&self.producer, self.future_record(record)).await);
        }
        for delivery in deliveries {
            delivery.await.unwrap().map_err(|(e, _)| e).unwrap();
        }
    }

    /// The service's arguments for this test's database, topics and group.
    pub(crate) fn args(&self, http_port: u16) -> Vec<String> {
        [
            "--database-url",
            &self.database.url(),
            "--bootstrap-servers",
            &self.bootstrap,
            "--topic",
            &self.topic,
            "--dlt-topic",
            &self.dlt,
            "--group",
            &self.group,
            "--http-addr",
            &format!("127.0.0.1:{http_port}"),
            "--session-timeout",
            "6s",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    }

    /// Starts the service and waits until it owns partitions.
    pub(crate) async fn start(&self, extra: &[&str], envs: &[(&str, String)]) -> InventoryProcess {
        let process = self.start_unready(extra, envs);
        process.wait_for_partitions().await;
        process
    }

    pub(crate) fn start_unready(
        &self,
        extra: &[&str],
        envs: &[(&str, String)],
    ) -> InventoryProcess {
        let port = free_port();
        let mut args = self.args(port);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // The test's token unless the caller sets one (or none: empty).
        let mut envs = envs.to_vec();
        if !envs.iter().any(|(key, _)| *key == "INVENTORY_ADMIN_TOKEN") {
            envs.push((
                "INVENTORY_ADMIN_TOKEN",
                test_support::ADMIN_TOKEN.to_owned(),
            ));
        }
        InventoryProcess {
            service: Service::start("inventory-service", SERVICE, &args, &envs),
            http: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Runs a tool subcommand to completion; returns (exit code, stdout).
    pub(crate) async fn tool(&self, subcommand: &[&str]) -> (Option<i32>, String) {
        let output = self.tool_output(subcommand).await;
        (output.code, output.stdout)
    }

    /// Runs a tool subcommand to completion.
    pub(crate) async fn tool_output(&self, subcommand: &[&str]) -> ToolOutput {
        let mut args: Vec<String> = self.args(0);
        args.extend(subcommand.iter().map(|s| (*s).to_owned()));
        let output = tokio::process::Command::new(SERVICE)
            .args(&args)
            .env("RUST_LOG", "warn")
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if std::env::var_os("TEST_LOG").is_some() {
            eprintln!("{stderr}");
        }
        ToolOutput {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr,
        }
    }

    pub(crate) async fn reservation(&self, order_id: Uuid) -> Option<(String, Option<String>)> {
        sqlx::query_as("select status, reason from reservations where order_id = $1")
            .bind(order_id)
            .fetch_optional(&self.pool)
            .await
            .unwrap()
    }

    pub(crate) async fn wait_for_reservation(&self, order_id: Uuid) -> (String, Option<String>) {
        eventually(
            "the order has a reservation outcome",
            Duration::from_secs(60),
            || async { self.reservation(order_id).await },
        )
        .await
    }

    /// Holds a lock on a stock row, so the consumer's transactions on it
    /// wait (and, past the statement timeout, fail) until it is released.
    pub(crate) async fn lock_stock(&self, sku: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
        let mut tx = self.pool.begin().await.unwrap();
        sqlx::query("select * from stock where sku = $1 for update")
            .bind(sku)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx
    }

    pub(crate) async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    pub(crate) fn dlt_reader(&self) -> TopicReader {
        TopicReader::new(&self.bootstrap, &self.dlt)
    }

    pub(crate) async fn dlt_records(&self, count: usize) -> Vec<Record> {
        self.dlt_reader()
            .read_at_least(count, Duration::from_secs(60))
            .await
    }
}

/// What a tool printed, and how it ended.
#[derive(Debug)]
pub(crate) struct ToolOutput {
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

/// A running service and its HTTP address.
#[derive(Debug)]
pub(crate) struct InventoryProcess {
    pub(crate) service: Service,
    pub(crate) http: String,
}

impl InventoryProcess {
    pub(crate) async fn metrics(&self) -> String {
        match reqwest::get(format!("{}/metrics", self.http)).await {
            Ok(reply) => reply.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// The value of a metric line that starts with `prefix` (0 when absent).
    pub(crate) async fn metric(&self, prefix: &str) -> f64 {
        test_support::metrics::sum(&self.metrics().await, prefix)
    }

    /// Waits until this consumer owns at least one partition.
    pub(crate) async fn wait_for_partitions(&self) {
        eventually(
            "the consumer owns partitions",
            Duration::from_secs(60),
            || async { (self.metric("consumer_assigned_partitions").await > 0.0).then_some(()) },
        )
        .await;
    }

    pub(crate) async fn ready_status(&self) -> Option<u16> {
        reqwest::get(format!("{}/readyz", self.http))
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }
}

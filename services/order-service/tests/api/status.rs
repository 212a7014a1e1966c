//! The `pedido.status` consumer against the real database and broker: the
//! inventory's outcomes move orders out of PENDING, once, never backwards;
//! what cannot be applied goes to the DLT with its reason.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::{Value, json};
use sqlx::Connection;
use test_support::eventually::eventually;
use test_support::kafka::{Record, TopicReader, bootstrap_servers, create_topic, unique_name};
use uuid::Uuid;

use crate::helpers::{TestApp, order_body, spawn_app_with};

const PARTITIONS: i32 = 3;
const WAIT: Duration = Duration::from_secs(30);

/// An order service consuming topics of its own.
struct StatusTest {
    app: TestApp,
    topic: String,
    dlt: String,
    producer: FutureProducer,
}

impl StatusTest {
    async fn start(extra: &[&str]) -> Self {
        let bootstrap = bootstrap_servers();
        let topic = unique_name("statustest");
        let dlt = format!("{topic}.dlt");
        create_topic(&bootstrap, &topic, PARTITIONS).await;
        create_topic(&bootstrap, &dlt, PARTITIONS).await;
        let mut args = vec![
            "--bootstrap-servers",
            &bootstrap,
            "--status-topic",
            &topic,
            "--status-dlt-topic",
            &dlt,
            "--status-group",
            &topic,
            "--status-retry-backoff",
            "100ms",
        ];
        args.extend_from_slice(extra);
        let app = spawn_app_with(&args).await;
        let producer = test_support::kafka::client_config(&bootstrap)
            .set("partitioner", "murmur2_random")
            .create()
            .unwrap();
        Self {
            app,
            topic,
            dlt,
            producer,
        }
    }

    /// Places an order through the API; its id.
    async fn place(&self) -> Uuid {
        let reply = self
            .app
            .post_order(&order_body("c-status", &[("ABC-1", 2)]))
            .await;
        assert_eq!(reply.status, 201, "{}", reply.body);
        reply.body["id"].as_str().unwrap().parse().unwrap()
    }

    async fn produce(&self, key: &str, headers: &[(&str, &str)], value: Option<&str>) {
        let mut owned = OwnedHeaders::new();
        for (name, value) in headers {
            owned = owned.insert(Header {
                key: name,
                value: Some(*value),
            });
        }
        let mut record: FutureRecord<'_, str, str> =
            FutureRecord::to(&self.topic).key(key).headers(owned);
        if let Some(value) = value {
            record = record.payload(value);
        }
        self.producer
            .send(record, Duration::from_secs(10))
            .await
            .expect("the broker takes the record");
    }

    /// An inventory outcome for `order`, with message id `id`.
    async fn outcome(&self, id: Uuid, order: Uuid, event_type: &str, reason: Option<&str>) {
        let mut value = json!({"pedidoId": order, "decididoEm": "2026-12-05T10:00:00Z"});
        if let Some(reason) = reason {
            value["motivo"] = json!(reason);
        }
        self.produce(
            &order.to_string(),
            &[("id", &id.to_string()), ("eventType", event_type)],
            Some(&value.to_string()),
        )
        .await;
    }

    async fn order(&self, id: Uuid) -> Value {
        let reply = self.app.get(&format!("/orders/{id}")).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        reply.body
    }

    async fn wait_for_status(&self, id: Uuid, status: &str) -> Value {
        eventually(&format!("order {id} is {status}"), WAIT, || async {
            let order = self.order(id).await;
            (order["status"] == status).then_some(order)
        })
        .await
    }

    async fn metric(&self, prefix: &str) -> f64 {
        let reply = self.app.get("/metrics").await;
        test_support::metrics::sum(reply.body.as_str().unwrap_or_default(), prefix)
    }

    /// Waits until the consumer has finished `count` records in all.
    async fn wait_for_processed(&self, count: f64) {
        eventually(&format!("{count} records processed"), WAIT, || async {
            (self.metric("consumer_processed_total").await >= count).then_some(())
        })
        .await;
    }

    async fn dlt_records(&self, count: usize) -> Vec<Record> {
        TopicReader::new(&bootstrap_servers(), &self.dlt)
            .read_at_least(count, WAIT)
            .await
    }

    /// Runs `order-service <subcommand>` against this test's topics, as an
    /// operator would; its stdout. Fails the test when the tool fails.
    async fn tool(&self, subcommand: &[&str]) -> String {
        let (status, stdout, stderr) = self.run_tool(subcommand).await;
        assert!(status.success(), "{subcommand:?}: {stdout}{stderr}");
        stdout
    }

    /// Runs `order-service <subcommand>`: its exit status, stdout, stderr.
    async fn run_tool(&self, subcommand: &[&str]) -> (std::process::ExitStatus, String, String) {
        let bootstrap = bootstrap_servers();
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_order-service"))
            .args([
                // A redrive is audited in the consumer's own database.
                "--database-url",
                &self.app.database_url(),
                "--bootstrap-servers",
                &bootstrap,
                "--status-topic",
                &self.topic,
                "--status-dlt-topic",
                &self.dlt,
                "--status-group",
                &self.topic,
            ])
            .args(subcommand)
            .env("RUST_LOG", "warn")
            .output()
            .await
            .unwrap();
        (
            output.status,
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Dedupe rows of `consumer`, `count` of them, processed `days_ago`.
    async fn processed_rows(&self, consumer: &str, count: i32, days_ago: i32) {
        test_support::dedupe::aged_rows(&self.app.pool, consumer, count, days_ago).await;
    }

    /// Dedupe rows of `consumer` processed at least `days_ago`.
    async fn processed_count(&self, consumer: &str, days_ago: i32) -> i64 {
        sqlx::query_scalar(
            "select count(*) from mensagem_processada
             where consumidor = $1 and processada_em <= now() - make_interval(days => $2)",
        )
        .bind(consumer)
        .bind(days_ago)
        .fetch_one(&self.app.pool)
        .await
        .unwrap()
    }

    async fn claimed(&self, id: Uuid) -> bool {
        sqlx::query_scalar(
            "select exists (select 1 from mensagem_processada where consumidor = 'pedido.status' and mensagem_id = $1)",
        )
        .bind(id)
        .fetch_one(&self.app.pool)
        .await
        .unwrap()
    }
}

fn history(order: &Value) -> Vec<(String, Option<String>)> {
    order["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            (
                entry["status"].as_str().unwrap().to_owned(),
                entry["messageId"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_reservation_confirms_the_order_once_and_its_duplicate_changes_nothing() {
    let test = StatusTest::start(&[]).await;
    let order = test.place().await;
    let created = test.order(order).await;
    assert_eq!(created["status"], "PENDING");
    let pedido_criado: Uuid = sqlx::query_scalar("select id from outbox where aggregateid = $1")
        .bind(order.to_string())
        .fetch_one(&test.app.pool)
        .await
        .unwrap();

    let message = Uuid::now_v7();
    test.outcome(message, order, "EstoqueReservado", None).await;
    test.outcome(message, order, "EstoqueReservado", None).await;
    test.wait_for_processed(2.0).await;

    let confirmed = test.wait_for_status(order, "CONFIRMED").await;
    assert_eq!(confirmed["statusReason"], Value::Null);
    assert_eq!(
        history(&confirmed),
        [
            ("PENDING".to_owned(), Some(pedido_criado.to_string())),
            ("CONFIRMED".to_owned(), Some(message.to_string())),
        ]
    );
    assert_eq!(test.metric("consumer_duplicates_total").await, 1.0);
}

#[tokio::test]
async fn a_rejection_keeps_the_inventory_reason() {
    let test = StatusTest::start(&[]).await;
    let order = test.place().await;
    let reason = "insufficient stock for ABC-1: requested 2, available 1";
    test.outcome(Uuid::now_v7(), order, "EstoqueRejeitado", Some(reason))
        .await;
    let rejected = test.wait_for_status(order, "REJECTED").await;
    assert_eq!(rejected["statusReason"], reason);
    assert_eq!(history(&rejected).len(), 2);
}

#[tokio::test]
async fn a_later_outcome_that_the_status_does_not_allow_changes_nothing() {
    let test = StatusTest::start(&[]).await;
    let order = test.place().await;
    // One key, one partition: applied in this order.
    let first = Uuid::now_v7();
    test.outcome(first, order, "EstoqueRejeitado", Some("unknown sku ABC-1"))
        .await;
    test.outcome(Uuid::now_v7(), order, "EstoqueReservado", None)
        .await;
    test.wait_for_processed(2.0).await;

    let settled = test.order(order).await;
    assert_eq!(settled["status"], "REJECTED");
    assert_eq!(settled["statusReason"], "unknown sku ABC-1");
    assert_eq!(
        history(&settled).last(),
        Some(&("REJECTED".to_owned(), Some(first.to_string())))
    );
    assert_eq!(history(&settled).len(), 2);
    let superseded = test
        .metric("consumer_processed_total{outcome=\"superseded\"")
        .await;
    assert_eq!(superseded, 1.0);
}

#[tokio::test]
async fn an_outcome_for_an_unknown_order_is_dead_lettered_unclaimed_and_the_partition_moves_on() {
    let test = StatusTest::start(&[]).await;
    let stranger = Uuid::now_v7();
    let message = Uuid::now_v7();
    test.outcome(message, stranger, "EstoqueReservado", None)
        .await;
    let dead = test.dlt_records(1).await;
    assert_eq!(
        dead[0].header("id").as_deref(),
        Some(message.to_string().as_str())
    );
    assert_eq!(
        dead[0].header("dlt-reason").as_deref(),
        Some("unknown-aggregate")
    );
    assert!(
        dead[0]
            .header("kafka_dlt-exception-message")
            .is_some_and(|m| m.contains(&stranger.to_string())),
        "{dead:?}"
    );
    // No claim is left behind: once the cause is fixed, a redrive applies it.
    assert!(!test.claimed(message).await);

    // The same key's next record is not held up.
    let order = test.place().await;
    test.outcome(Uuid::now_v7(), order, "EstoqueReservado", None)
        .await;
    test.wait_for_status(order, "CONFIRMED").await;
}

#[tokio::test]
async fn the_dlt_tools_list_a_dead_lettered_outcome_and_redrive_it_once_its_order_exists() {
    let test = StatusTest::start(&[]).await;
    let late = Uuid::now_v7();
    let message = Uuid::now_v7();
    test.outcome(message, late, "EstoqueReservado", None).await;
    test.dlt_records(1).await;

    let listed = test
        .tool(&["dlt", "list", "--reason", "unknown-aggregate"])
        .await;
    assert!(listed.contains(&message.to_string()), "{listed}");

    // The cause fixed: the order exists now (as if restored from a backup).
    sqlx::query(
        "with o as (insert into orders (id, customer_id, status) values ($1, 'c-late', 'PENDING') returning id)
         insert into order_items (order_id, line, sku, quantity) select id, 0, 'ABC-1', 1 from o",
    )
    .bind(late)
    .execute(&test.app.pool)
    .await
    .unwrap();
    test.tool(&["dlt", "redrive", "--rate", "100"]).await;
    let order = test.wait_for_status(late, "CONFIRMED").await;
    assert_eq!(
        history(&order).last(),
        Some(&("CONFIRMED".to_owned(), Some(message.to_string())))
    );
    let again = test.tool(&["dlt", "redrive", "--dry-run"]).await;
    assert!(
        !again.contains(&message.to_string()),
        "redriven once: {again}"
    );
}

#[tokio::test]
async fn each_unprocessable_record_goes_to_the_dlt_with_its_reason() {
    let test = StatusTest::start(&[]).await;
    let order = test.place().await.to_string();
    let good = json!({"pedidoId": order}).to_string();
    let id = || Uuid::now_v7().to_string();
    let (a, b, c, d, e) = (id(), id(), id(), id(), id());
    test.produce(&order, &[("id", &a)], Some(&good)).await;
    test.produce(
        &order,
        &[("id", &b), ("eventType", "EstoqueDevolvido")],
        Some(&good),
    )
    .await;
    test.produce(
        &order,
        &[("id", &c), ("eventType", "EstoqueReservado")],
        Some("{oops"),
    )
    .await;
    test.produce(
        &order,
        &[("id", &d), ("eventType", "EstoqueRejeitado")],
        Some(&good),
    )
    .await;
    test.produce(&order, &[("eventType", "EstoqueReservado")], Some(&good))
        .await;
    test.produce(
        &order,
        &[("id", &e), ("eventType", "EstoqueReservado")],
        Some(&good),
    )
    .await;
    test.wait_for_status(order.parse().unwrap(), "CONFIRMED")
        .await;

    let dead = test.dlt_records(5).await;
    let reasons: Vec<(Option<String>, Option<String>)> = dead
        .iter()
        .map(|r| (r.header("id"), r.header("dlt-reason")))
        .collect();
    let expected = [
        (Some(a), "missing-header"),
        (Some(b), "unknown-event-type"),
        (Some(c), "invalid-json"),
        (Some(d), "schema-violation"),
        (None, "missing-header"),
    ];
    assert_eq!(reasons.len(), expected.len(), "{reasons:?}");
    for ((id, reason), (expected_id, expected_reason)) in reasons.iter().zip(expected) {
        assert_eq!(id, &expected_id);
        assert_eq!(reason.as_deref(), Some(expected_reason));
    }
}

#[tokio::test]
async fn a_transient_failure_is_retried_then_dead_lettered_and_the_order_stays_as_it_was() {
    let test = StatusTest::start(&["--statement-timeout", "300ms", "--status-retries", "2"]).await;
    let order = test.place().await;
    // Another transaction holds the order row for longer than the retries
    // last: each attempt's update times out.
    let mut blocker = sqlx::PgConnection::connect_with(&test.app.pool.connect_options())
        .await
        .unwrap();
    let mut held = blocker.begin().await.unwrap();
    sqlx::query("select 1 from orders where id = $1 for update")
        .bind(order)
        .execute(&mut *held)
        .await
        .unwrap();
    let message = Uuid::now_v7();
    test.outcome(message, order, "EstoqueReservado", None).await;
    let dead = test.dlt_records(1).await;
    assert_eq!(
        dead[0].header("dlt-reason").as_deref(),
        Some("retries-exhausted")
    );
    assert_eq!(test.metric("consumer_retries_total").await, 2.0);
    held.rollback().await.unwrap();
    assert_eq!(test.order(order).await["status"], "PENDING");
    assert!(!test.claimed(message).await);
}

#[tokio::test]
async fn a_release_after_a_cancellation_changes_nothing_and_a_late_reservation_neither() {
    let test = StatusTest::start(&[]).await;
    let order = test.place().await;
    let cancelled = test
        .app
        .client
        .post(test.app.url(&format!("/orders/{order}/cancel")))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 200);
    // The reservation decided before the cancellation arrived, then its
    // release: the order stays CANCELLED.
    test.outcome(Uuid::now_v7(), order, "EstoqueReservado", None)
        .await;
    test.outcome(Uuid::now_v7(), order, "EstoqueLiberado", None)
        .await;
    test.wait_for_processed(2.0).await;
    let settled = test.order(order).await;
    assert_eq!(settled["status"], "CANCELLED");
    assert_eq!(history(&settled).len(), 2);
    assert_eq!(
        test.metric("consumer_processed_total{outcome=\"released\"")
            .await,
        1.0
    );
    assert_eq!(
        test.metric("consumer_processed_total{outcome=\"superseded\"")
            .await,
        1.0
    );
}

/// The order service's dedupe rows had no retention at all: they grew with
/// every status message for ever. `order-service retention` deletes the
/// status consumer's rows older than the window, keeps younger ones and
/// another consumer's, and refuses a window shorter than the topic's
/// retention plus the redrive window unless forced, as the inventory's does.
#[tokio::test]
async fn retention_deletes_the_status_consumers_old_rows_keeps_young_ones_and_refuses_an_unsafe_window()
 {
    let test = StatusTest::start(&["--no-status-consumer"]).await;
    test.processed_rows("pedido.status", 6_000, 30).await;
    test.processed_rows("pedido.status", 3, 1).await;
    test.processed_rows("another.consumer", 2, 30).await;

    let (status, stdout, stderr) = test.run_tool(&["retention", "--retention", "1d"]).await;
    assert!(!status.success(), "one day was accepted: {stdout}");
    assert!(
        stderr.contains("is shorter than the topic's retention"),
        "the refusal names its rule: {stderr}"
    );
    assert_eq!(
        test.processed_count("pedido.status", 0).await,
        6_003,
        "a refusal deletes nothing"
    );

    let out = test.tool(&["retention"]).await;
    assert!(
        out.contains("deleted 6000 mensagem_processada row(s)"),
        "{out}"
    );
    assert_eq!(
        test.processed_count("pedido.status", 29).await,
        0,
        "the rows older than 14 days went"
    );
    assert_eq!(
        test.processed_count("pedido.status", 0).await,
        3,
        "the younger rows stay"
    );
    assert_eq!(
        test.processed_count("another.consumer", 0).await,
        2,
        "another consumer's rows follow its own window"
    );

    let out = test
        .tool(&["retention", "--retention", "1h", "--force-retention"])
        .await;
    assert!(
        out.contains("deleted 3 mensagem_processada row(s)"),
        "{out}"
    );
}

/// The served process purges its dedupe rows as the inventory does, every
/// `--retention-every`, and counts them in /metrics.
#[tokio::test]
async fn the_served_status_consumer_purges_its_old_rows() {
    let test = StatusTest::start(&["--retention-every", "1s"]).await;
    test.processed_rows("pedido.status", 20, 30).await;
    test.processed_rows("pedido.status", 2, 1).await;
    eventually("the served process purged the old rows", WAIT, || async {
        (test.processed_count("pedido.status", 29).await == 0).then_some(())
    })
    .await;
    assert_eq!(test.processed_count("pedido.status", 0).await, 2);
    assert!(test.metric("retention_deleted_total").await >= 20.0);
}

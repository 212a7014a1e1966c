//! The operations console (`entrega`) against a pipeline, and the scenes
//! its tests look at: one order, one dead letter whose cause is fixed.

use std::time::Duration;

use test_support::eventually::eventually;
use test_support::process::{Service, free_port};
use uuid::Uuid;

use crate::Pipeline;
use crate::pipeline::binary;

/// The flags that point the console at `pipeline`.
pub fn console_args(pipeline: &Pipeline) -> Vec<String> {
    let services = [
        ("order-service", &pipeline.order_service.http),
        ("inventory-service", &pipeline.consumers[0].http),
        ("outbox-relay", &pipeline.relays[0].http),
    ]
    .iter()
    .map(|(name, url)| format!("{name}={url}"))
    .collect::<Vec<_>>()
    .join(",");
    let (orders, inventory) = (
        &pipeline.endpoints.orders_url,
        &pipeline.endpoints.inventory_url,
    );
    let mut args = vec![
        "--bootstrap-servers".to_owned(),
        pipeline.broker.address().to_owned(),
        "--services".to_owned(),
        services,
    ];
    match &pipeline.least_privilege {
        // Inspection as the read-only role, the audit as the redrive role.
        Some(roles) => args.extend([
            "--orders-database-url".to_owned(),
            roles.console.url(orders),
            "--inventory-database-url".to_owned(),
            roles.console.url(inventory),
            "--orders-redrive-database-url".to_owned(),
            roles.redrive.url(orders),
            "--inventory-redrive-database-url".to_owned(),
            roles.redrive.url(inventory),
        ]),
        None => args.extend([
            "--orders-database-url".to_owned(),
            orders.clone(),
            "--inventory-database-url".to_owned(),
            inventory.clone(),
        ]),
    }
    args
}

/// What a run of the CLI printed.
#[derive(Debug)]
pub struct Printed {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `entrega <args>` against `pipeline`.
pub async fn entrega(pipeline: &Pipeline, args: &[&str]) -> Printed {
    let output = tokio::process::Command::new(binary("entrega"))
        .args(console_args(pipeline))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("running entrega");
    Printed {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `entrega journey <id> --json`, which must succeed.
pub async fn journey(pipeline: &Pipeline, id: &str) -> serde_json::Value {
    let printed = entrega(pipeline, &["journey", id, "--json"]).await;
    assert!(printed.success, "journey {id}: {}", printed.stderr);
    serde_json::from_str(&printed.stdout).expect("the journey as JSON")
}

/// `entrega serve` on a free loopback port; answers once it returns.
pub async fn serve(pipeline: &Pipeline) -> (Service, String) {
    let address = format!("127.0.0.1:{}", free_port());
    let mut args = console_args(pipeline);
    args.extend([
        "serve".to_owned(),
        "--http-addr".to_owned(),
        address.clone(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let service = Service::start(
        "entrega",
        &binary("entrega"),
        &args,
        &[
            ("RUST_LOG", "warn".to_owned()),
            ("CONSOLE_ADMIN_TOKEN", test_support::ADMIN_TOKEN.to_owned()),
        ],
    );
    let url = format!("http://{address}");
    let health = format!("{url}/healthz");
    eventually("the console answers", Duration::from_secs(30), || async {
        reqwest::get(&health)
            .await
            .ok()
            .filter(|r| r.status().is_success())
            .map(|_| ())
    })
    .await;
    (service, url)
}

/// Places an order through the API; returns its id.
pub async fn place_order(pipeline: &Pipeline, sku: &str, quantity: i32) -> Uuid {
    let reply: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/orders", pipeline.order_service.http))
        .json(&serde_json::json!({"customerId": "c-console", "items": [{"sku": sku, "quantity": quantity}]}))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    reply["id"].as_str().unwrap().parse().unwrap()
}

/// Waits until the order's status is `status`.
pub async fn wait_for_status(pipeline: &Pipeline, order: Uuid, status: &str) {
    let url = format!("{}/orders/{order}", pipeline.order_service.http);
    eventually(
        &format!("order {order} {status}"),
        Duration::from_secs(60),
        || async {
            let reply: serde_json::Value = reqwest::get(&url).await.ok()?.json().await.ok()?;
            (reply["status"] == status).then_some(())
        },
    )
    .await;
}

/// The id of the order's PedidoCriado, once the relay logged its delivery.
pub async fn created_message(pipeline: &Pipeline, order: Uuid) -> Uuid {
    eventually(
        "the PedidoCriado's delivery",
        Duration::from_secs(30),
        || async {
            sqlx::query_scalar(
                "select id from outbox_delivery where aggregateid = $1 and type = 'PedidoCriado' limit 1",
            )
            .bind(order.to_string())
            .fetch_optional(&pipeline.orders)
            .await
            .unwrap()
        },
    )
    .await
}

/// An order whose PedidoCriado is dead-lettered as retries-exhausted (its
/// sku's stock row locked through every attempt), the lock then released:
/// the cause is gone, the order PENDING. Needs a consumer with a short
/// statement timeout. Returns the order and its message id.
pub async fn dead_lettered_order(pipeline: &Pipeline, sku: &str) -> (Uuid, Uuid) {
    let dead_before = dead_letters(pipeline).await;
    let mut lock = pipeline.inventory.begin().await.unwrap();
    sqlx::query("select * from stock where sku = $1 for update")
        .bind(sku)
        .execute(&mut *lock)
        .await
        .unwrap();
    let order = place_order(pipeline, sku, 2).await;
    eventually(
        "the order's PedidoCriado reaches the DLT",
        Duration::from_secs(90),
        || async { (dead_letters(pipeline).await > dead_before).then_some(()) },
    )
    .await;
    lock.rollback().await.unwrap();
    (order, created_message(pipeline, order).await)
}

async fn dead_letters(pipeline: &Pipeline) -> f64 {
    pipeline.consumers[0]
        .metric("consumer_dlt_total{reason=\"retries-exhausted\"}")
        .await
        .unwrap_or(0.0)
}

/// A consumer whose statements give up after this long, so a locked row
/// exhausts its retries in seconds.
pub fn quick_statement_timeout() -> Vec<(&'static str, String)> {
    vec![("INVENTORY_STATEMENT_TIMEOUT", "2s".to_owned())]
}

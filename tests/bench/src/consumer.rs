use std::time::{Duration, Instant};

use futures::future::join_all;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use test_support::database::TestDatabase;
use test_support::kafka::{bootstrap_servers, create_topic};
use test_support::process::{Service, free_port};
use uuid::Uuid;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Records to consume.
    #[arg(long, default_value_t = 100_000)]
    records: usize,
    /// The inventory service binary (a release build).
    #[arg(long, default_value = "target/release/inventory-service")]
    service: String,
}

const SKUS: usize = 100;
const PARTITIONS: i32 = 6;

fn inventory_server() -> String {
    std::env::var("INVENTORY_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/inventory".to_owned())
}

/// A fresh, migrated inventory database with plenty of stock.
async fn database() -> (TestDatabase, PgPool) {
    let database = TestDatabase::create(&inventory_server(), "bench_inventory").await;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(database.options.clone())
        .await
        .unwrap();
    sqlx::migrate!("../../migrations/inventory")
        .run(&pool)
        .await
        .unwrap();
    sqlx::query("insert into stock (sku, available) select 'SKU-' || i, 1000000000 from generate_series(0, $1 - 1) i")
        .bind(i32::try_from(SKUS).unwrap())
        .execute(&pool)
        .await
        .unwrap();
    (database, pool)
}

fn items(n: usize) -> [(String, i32); 2] {
    [
        (format!("SKU-{}", n % SKUS), 2),
        (format!("SKU-{}", (n * 7 + 3) % SKUS), 1),
    ]
}

async fn processed(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from mensagem_processada")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The service consuming `records` pre-produced events, per-message transactions.
async fn consumer_rate(args: &Args, bootstrap: &str) -> f64 {
    let (database, pool) = database().await;
    let topic = format!(
        "bench-consumer-{}",
        &Uuid::new_v4().simple().to_string()[..10]
    );
    let dlt = format!("{topic}.dlt");
    create_topic(bootstrap, &topic, PARTITIONS).await;
    create_topic(bootstrap, &dlt, PARTITIONS).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "20")
        .create()
        .unwrap();
    let mut deliveries = Vec::with_capacity(args.records);
    for n in 0..args.records {
        let order = Uuid::now_v7().to_string();
        let itens: Vec<serde_json::Value> = items(n)
            .iter()
            .map(|(sku, q)| serde_json::json!({"sku": sku, "quantidade": q}))
            .collect();
        let value = serde_json::json!({"itens": itens, "criadoEm": "2026-12-02T15:00:00Z", "pedidoId": order, "clienteId": "c-1"})
            .to_string();
        let id = Uuid::now_v7().to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "id",
                value: Some(id.as_str()),
            })
            .insert(Header {
                key: "eventType",
                value: Some("PedidoCriado"),
            });
        let mut record = FutureRecord::to(&topic)
            .key(order.as_str())
            .payload(value.as_str())
            .headers(headers);
        loop {
            match producer.send_result(record) {
                Ok(delivery) => {
                    deliveries.push(delivery);
                    break;
                }
                Err((_, returned)) => {
                    record = returned;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    }
    for report in join_all(deliveries).await {
        report.unwrap().unwrap();
    }

    let http = format!("127.0.0.1:{}", free_port());
    let url = database.url();
    let group = format!("{topic}-group");
    let service = Service::start(
        "inventory-service",
        &args.service,
        &[
            "--database-url",
            &url,
            "--bootstrap-servers",
            bootstrap,
            "--topic",
            &topic,
            "--dlt-topic",
            &dlt,
            "--group",
            &group,
            "--http-addr",
            &http,
            "--no-migrate",
        ],
        &[("RUST_LOG", "warn".to_owned())],
    );
    // The clock starts at the first processed record: start-up and the group
    // join are not consumption.
    let first = loop {
        let done = processed(&pool).await;
        if done > 0 {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let started = Instant::now();
    let total = i64::try_from(args.records).unwrap();
    while processed(&pool).await < total {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = (total - first) as f64 / started.elapsed().as_secs_f64();
    service.terminate(Duration::from_secs(30)).await;
    rate
}

/// The consumer's transaction, straight from SQL, on as many connections as
/// the topic has partitions: the database's ceiling for this work.
async fn sql_rate(records: usize) -> f64 {
    let (_database, pool) = database().await;
    let per_task = records / usize::try_from(PARTITIONS).unwrap();
    let started = Instant::now();
    let tasks = (0..PARTITIONS).map(|task| {
        let pool = pool.clone();
        async move {
            for n in 0..per_task {
                let order = Uuid::now_v7();
                let (skus, quantities): (Vec<String>, Vec<i32>) =
                    items(n + usize::try_from(task).unwrap() * per_task).into_iter().unzip();
                let mut tx = pool.begin().await.unwrap();
                sqlx::query("insert into mensagem_processada (consumidor, mensagem_id) values ('estoque.reserva', $1) on conflict do nothing")
                    .bind(Uuid::now_v7()).execute(&mut *tx).await.unwrap();
                sqlx::query("select sku, available from stock where sku = any($1) order by sku for update")
                    .bind(&skus).fetch_all(&mut *tx).await.unwrap();
                sqlx::query("insert into reservations (order_id, status, reason, message_id) values ($1, 'RESERVED', null, $2) on conflict (order_id) do nothing")
                    .bind(order).bind(Uuid::now_v7()).execute(&mut *tx).await.unwrap();
                sqlx::query("insert into reservation_items (order_id, line, sku, quantity) select $1, item.line - 1, item.sku, item.quantity from unnest($2::text[], $3::int4[]) with ordinality as item (sku, quantity, line)")
                    .bind(order).bind(&skus).bind(&quantities).execute(&mut *tx).await.unwrap();
                sqlx::query("update stock s set available = s.available - w.quantity, reserved = s.reserved + w.quantity, updated_at = now() from unnest($1::text[], $2::int4[]) as w (sku, quantity) where s.sku = w.sku")
                    .bind(&skus).bind(&quantities).execute(&mut *tx).await.unwrap();
                tx.commit().await.unwrap();
            }
        }
    });
    join_all(tasks).await;
    (per_task * usize::try_from(PARTITIONS).unwrap()) as f64 / started.elapsed().as_secs_f64()
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let bootstrap = bootstrap_servers();
    let sql = sql_rate(args.records).await;
    let consumer = consumer_rate(&args, &bootstrap).await;
    println!(
        "P3 consumer: records={} consumer={consumer:.0} records/s sql_same_transaction={sql:.0} tx/s ratio={:.2}",
        args.records,
        consumer / sql
    );
    Ok(())
}

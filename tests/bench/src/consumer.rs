use std::time::{Duration, Instant};

use futures::future::join_all;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::PgPool;
use test_support::database::TestDatabase;
use test_support::kafka::{bootstrap_servers, create_topic, enqueue};
use test_support::process::{Service, free_port};
use uuid::Uuid;

use crate::report::Figure;

/// The service's default `INVENTORY_BATCH_SIZE`.
pub(crate) const DEFAULT_BATCH_SIZE: u32 = 50;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Records to consume.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) records: usize,
    /// The inventory service binary (a release build).
    #[arg(long, default_value = "target/release/inventory-service")]
    pub(crate) service: String,
}

const SKUS: usize = 100;
const PARTITIONS: i32 = 6;

fn inventory_server() -> String {
    std::env::var("INVENTORY_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/inventory".to_owned())
}

/// A fresh inventory database with plenty of stock, migrated as the
/// service migrates it (it serves with --no-migrate, which refuses a
/// database that lacks any of its migrations).
async fn database() -> (TestDatabase, PgPool) {
    let [own, outbox] = outbox::with_outbox(sqlx::migrate!("../../migrations/inventory"));
    let (database, pool) = TestDatabase::create_migrated(
        &inventory_server(),
        "bench_inventory",
        &[own, outbox, idempotent_consumer::migrator()],
        8,
    )
    .await;
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

/// Records applied so far: one reservation outcome per PedidoCriado. Not
/// mensagem_processada, which also holds the history of P5.
async fn applied(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from reservations")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// For P5: fills mensagem_processada with `rows` processed messages
/// (history), then settles the database. The empty case (`rows` 0) settles
/// too, so that history is the only difference between the two.
async fn fill_history(pool: &PgPool, rows: i64) {
    // Time-ordered ids, as the relay's outbox ids are in production and in
    // the records of this run.
    sqlx::query(&format!(
        "insert into mensagem_processada (consumidor, mensagem_id, processada_em)
         select 'estoque.reserva', {}, now() - interval '1 day' from generate_series(1, $1) as i",
        crate::relay::v7_id("now() - interval '1 day'")
    ))
    .bind(rows)
    .execute(pool)
    .await
    .unwrap();
    crate::relay::settle(pool).await;
}

/// The service consuming `records` pre-produced events (records/s), applying
/// up to `batch_size` records of a partition per transaction; with
/// `history`, that many rows already in mensagem_processada (P5). Each
/// record carries a `traceparent`, as the relay's do, one in
/// `sampled_one_in` with the sampled flag (the upstream sampler's decision);
/// `environment` is added to the service's.
pub(crate) async fn consumer_rate(
    args: &Args,
    bootstrap: &str,
    batch_size: u32,
    history: Option<i64>,
    environment: &[(&str, String)],
    sampled_one_in: usize,
) -> f64 {
    let (database, pool) = database().await;
    if let Some(rows) = history {
        fill_history(&pool, rows).await;
    }
    let topic = format!(
        "bench-consumer-{}",
        &Uuid::new_v4().simple().to_string()[..10]
    );
    let dlt = format!("{topic}.dlt");
    create_topic(bootstrap, &topic, PARTITIONS).await;
    create_topic(bootstrap, &dlt, PARTITIONS).await;
    let producer: FutureProducer = test_support::kafka::client_config(bootstrap)
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
        let traceparent = format!(
            "00-{}-{}-{}",
            Uuid::new_v4().simple(),
            &Uuid::new_v4().simple().to_string()[..16],
            if n % sampled_one_in.max(1) == 0 {
                "01"
            } else {
                "00"
            }
        );
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "id",
                value: Some(id.as_str()),
            })
            .insert(Header {
                key: "eventType",
                value: Some("PedidoCriado"),
            })
            .insert(Header {
                key: "traceparent",
                value: Some(traceparent.as_str()),
            });
        let record = FutureRecord::to(&topic)
            .key(order.as_str())
            .payload(value.as_str())
            .headers(headers);
        deliveries.push(enqueue(&producer, record).await);
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
            "--batch-size",
            &batch_size.to_string(),
            "--no-migrate",
        ],
        &[
            &[(
                "RUST_LOG",
                std::env::var("BENCH_SERVICE_LOG").unwrap_or_else(|_| "warn".to_owned()),
            )],
            environment,
        ]
        .concat(),
    );
    // The clock starts at the first processed record: start-up and the group
    // join are not consumption.
    let first = loop {
        let done = applied(&pool).await;
        if done > 0 {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let started = Instant::now();
    let total = i64::try_from(args.records).unwrap();
    while applied(&pool).await < total {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = (total - first) as f64 / started.elapsed().as_secs_f64();
    service.terminate(Duration::from_secs(30)).await;
    rate
}

/// The consumer's transaction, as SQL: the dedupe row, the stock lock, the
/// outcome, its items, the stock update, the outcome's outbox row.
const RESERVE_TRANSACTION: &str = r#"
\set a random(0, 99)
\set b random(0, 99)
BEGIN;
INSERT INTO mensagem_processada (consumidor, mensagem_id) VALUES ('estoque.reserva', gen_random_uuid()) ON CONFLICT DO NOTHING;
SELECT sku, available FROM stock WHERE sku = ANY(ARRAY['SKU-' || :a, 'SKU-' || :b]) ORDER BY sku FOR UPDATE;
INSERT INTO reservations (order_id, status, reason, message_id) VALUES (gen_random_uuid(), 'RESERVED', NULL, gen_random_uuid()) ON CONFLICT (order_id) DO NOTHING RETURNING order_id \gset
INSERT INTO reservation_items (order_id, line, sku, quantity)
  SELECT :order_id::uuid, item.line - 1, item.sku, item.quantity
  FROM unnest(ARRAY['SKU-' || :a, 'SKU-' || :b], ARRAY[2, 1]) WITH ORDINALITY AS item (sku, quantity, line);
UPDATE stock s SET available = s.available - w.quantity, reserved = s.reserved + w.quantity, updated_at = now()
  FROM unnest(ARRAY['SKU-' || :a, 'SKU-' || :b], ARRAY[2, 1]) AS w (sku, quantity) WHERE s.sku = w.sku;
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, traceparent)
  VALUES (gen_random_uuid(), 'estoque', :order_id::text, 'EstoqueReservado',
          jsonb_build_object('pedidoId', :order_id::text,
                             'itens', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || :a, 'quantidade', 2),
                                                        jsonb_build_object('sku', 'SKU-' || :b, 'quantidade', 1)),
                             'reservadoEm', now()),
          NULL);
COMMIT;
"#;

/// pgbench running the consumer's transaction on as many connections as the
/// topic has partitions (the consumer's parallelism): the database's ceiling.
async fn pgbench_rate(duration: Duration) -> f64 {
    let (database, _pool) = database().await;
    crate::pgbench::tps(
        &database.url(),
        RESERVE_TRANSACTION,
        PARTITIONS.unsigned_abs(),
        duration,
    )
    .await
}

/// P3: per-message and batched transactions, beside pgbench.
pub(crate) async fn measure(args: &Args) -> Vec<Figure> {
    let bootstrap = bootstrap_servers();
    let sql = pgbench_rate(Duration::from_secs(10)).await;
    let mut figures = Vec::new();
    for (batch_size, kind) in [(1, "per-message"), (DEFAULT_BATCH_SIZE, "batched")] {
        let consumer = consumer_rate(args, &bootstrap, batch_size, None, &[], 1).await;
        let figure = Figure {
            name: format!(
                "P3 consumer, {} records, {kind} transactions (batch {batch_size})",
                args.records
            ),
            figure: format!("{consumer:.0} records/s"),
            baseline: format!(
                "pgbench, same dedupe + reserve + outbox transaction, {PARTITIONS} connections: {sql:.0} tps"
            ),
            ratio: Some(consumer / sql),
            target: "≥ 0.8".to_owned(),
        };
        println!("{}", figure.ratio_line());
        figures.push(figure);
    }
    figures
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    measure(&args).await;
    Ok(())
}

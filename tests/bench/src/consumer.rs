use std::time::{Duration, Instant};

use futures::future::join_all;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::PgPool;
use test_support::database::TestDatabase;
use test_support::kafka::{bootstrap_servers, create_topic_with, enqueue};
use test_support::process::{Service, free_port};
use uuid::Uuid;

use crate::cpu::Components;
use crate::relay;
use crate::report::{Figure, Ratio, interleaved, rates};

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
    /// Rounds, the service and pgbench interleaved.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// How long pgbench runs per round.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) baseline_duration: Duration,
}

impl Args {
    /// `records` consumed by `service`, for the benchmarks that call
    /// [`consumer_rate`] with baselines of their own.
    pub(crate) fn consuming(records: usize, service: String) -> Self {
        Self {
            records,
            service,
            rounds: 3,
            baseline_duration: Duration::from_secs(10),
        }
    }
}

/// The broker the records go through, and what a client needs to reach it.
#[derive(Debug, Clone)]
pub(crate) struct Broker {
    pub(crate) bootstrap: String,
    /// The bench's own clients' librdkafka properties (SASL, TLS).
    pub(crate) properties: Vec<(String, String)>,
    /// The same for the service, as its `KAFKA_*` variables.
    pub(crate) env: Vec<(&'static str, String)>,
}

impl Broker {
    /// The broker of scripts/services (`KAFKA_BOOTSTRAP_SERVERS`).
    pub(crate) fn shared() -> Self {
        Self::plaintext(bootstrap_servers())
    }

    pub(crate) fn plaintext(bootstrap: String) -> Self {
        Self {
            bootstrap,
            properties: Vec::new(),
            env: Vec::new(),
        }
    }

    fn client_config(&self) -> rdkafka::ClientConfig {
        let mut config = test_support::kafka::client_config(&self.bootstrap);
        for (key, value) in &self.properties {
            config.set(key, value);
        }
        config
    }
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

/// Records the service has finished, from its `/metrics`: counting rows
/// in the measured database every few milliseconds would load it.
async fn processed(http: &str) -> f64 {
    let Ok(response) = reqwest::get(format!("http://{http}/metrics")).await else {
        return 0.0;
    };
    let text = response.text().await.unwrap_or_default();
    test_support::metrics::sum(&text, "consumer_processed_total")
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
    broker: &Broker,
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
    create_topic_with(&broker.client_config(), &topic, PARTITIONS).await;
    create_topic_with(&broker.client_config(), &dlt, PARTITIONS).await;
    let producer: FutureProducer = broker
        .client_config()
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
            &broker.bootstrap,
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
            )][..],
            &broker.env,
            environment,
        ]
        .concat(),
    );
    // Found before the clock starts: finding them is not the work measured.
    let mut components = Components::default();
    components.process("inventory-service", service.pid());
    components.server("inventory", &url).await;
    components.broker(&broker.bootstrap).await;
    // The clock starts at the first processed record: start-up and the group
    // join are not consumption.
    let first = loop {
        let done = processed(&http).await;
        if done > 0.0 {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let started = Instant::now();
    let total = args.records as f64;
    let ((), cpu) = components
        .during(async {
            while processed(&http).await < total {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    println!("  consumer, batch {batch_size}: CPU {cpu}");
    // Every record applied, not only counted.
    let applied: i64 = sqlx::query_scalar("select count(*) from reservations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        applied,
        i64::try_from(args.records).unwrap(),
        "reservations"
    );
    let rate = (total - first) / started.elapsed().as_secs_f64();
    service.terminate(Duration::from_secs(30)).await;
    rate
}

/// The trace context the service writes to each outcome's outbox row: the
/// record's own (tracing off), as `traceparent` and as Debezium's context
/// column. A constant here: the value's length is the work, not its making.
const TRACE: &str = "'00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'";

/// The consumer's transaction for one record, as SQL, statement for
/// statement: the dedupe row; the stock lock with the "already decided"
/// check in one statement; the outcome, its items, the stock update and
/// the outcome's outbox row in one statement of data-modifying CTEs.
fn reserve_one() -> String {
    format!(
        r#"
\set n random(0, 1000000)
BEGIN;
INSERT INTO mensagem_processada (consumidor, mensagem_id) VALUES ('estoque.reserva', gen_random_uuid())
  ON CONFLICT DO NOTHING RETURNING mensagem_id, gen_random_uuid() AS order_id \gset
WITH locked AS (
  SELECT sku, available FROM stock WHERE sku = ANY(ARRAY['SKU-' || (:n % 100), 'SKU-' || ((:n * 7 + 3) % 100)]) ORDER BY sku FOR UPDATE)
SELECT sku, available, NULL::uuid FROM locked
UNION ALL
SELECT NULL, NULL, order_id FROM reservations WHERE order_id = ANY(ARRAY[:order_id::uuid]);
WITH outcomes AS (
  INSERT INTO reservations (order_id, status, reason, message_id) VALUES (:order_id::uuid, 'RESERVED', NULL, :mensagem_id::uuid)
), items AS (
  INSERT INTO reservation_items (order_id, line, sku, quantity)
  SELECT :order_id::uuid, item.line - 1, item.sku, item.quantity
  FROM unnest(ARRAY['SKU-' || (:n % 100), 'SKU-' || ((:n * 7 + 3) % 100)], ARRAY[2, 1]) WITH ORDINALITY AS item (sku, quantity, line)
), taken AS (
  UPDATE stock s SET available = s.available - w.quantity, reserved = s.reserved + w.quantity, updated_at = now()
  FROM unnest(ARRAY['SKU-' || (:n % 100), 'SKU-' || ((:n * 7 + 3) % 100)], ARRAY[2, 1]) AS w (sku, quantity) WHERE s.sku = w.sku
)
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, traceparent, tracingspancontext)
  VALUES ({v7}, 'estoque', :order_id::text, 'EstoqueReservado',
          jsonb_build_object('pedidoId', :order_id::text,
                             'itens', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (:n % 100), 'quantidade', 2),
                                                        jsonb_build_object('sku', 'SKU-' || ((:n * 7 + 3) % 100), 'quantidade', 1)),
                             'reservadoEm', now()),
          {TRACE}, 'traceparent=' || {TRACE} || E'\n');
COMMIT;
"#,
        v7 = relay::v7_now(),
    )
}

/// The consumer's transaction for a batch of `records`, as SQL, set-based
/// as the service runs it: the claim, the lock with the decided check, the
/// writes, whatever the count, each taking the batch as arrays. The batch's ids and skus are made in
/// the first statement (which claims the message ids, as the service's
/// first statement does) and travel as arrays from there, as the service's
/// parameters do. Record `i`'s skus come from n = a + 37 i.
fn reserve_batch(records: u32) -> String {
    let first = "'SKU-' || ((:a + 37 * i) % 100)";
    let second = "'SKU-' || ((7 * (:a + 37 * i) + 3) % 100)";
    format!(
        r#"
\set a random(0, 1000000)
BEGIN;
WITH batch AS (
  SELECT i, gen_random_uuid() AS message, gen_random_uuid() AS order_id, {v7} AS event,
         {first} AS first, {second} AS second
  FROM generate_series(1, {records}) AS i),
claimed AS (
  INSERT INTO mensagem_processada (consumidor, mensagem_id)
  SELECT 'estoque.reserva', message FROM batch
  ON CONFLICT DO NOTHING RETURNING mensagem_id)
SELECT (SELECT count(*) FROM claimed) AS claimed,
       array_agg(message ORDER BY i) AS messages, array_agg(order_id ORDER BY i) AS orders,
       array_agg(event ORDER BY i) AS events,
       array_agg(first ORDER BY i) AS firsts, array_agg(second ORDER BY i) AS seconds
FROM batch \gset
WITH locked AS (
  SELECT sku, available FROM stock
  WHERE sku = ANY(:firsts::text[] || :seconds::text[]) ORDER BY sku FOR UPDATE)
SELECT sku, available, NULL::uuid FROM locked
UNION ALL
SELECT NULL, NULL, order_id FROM reservations WHERE order_id = ANY(:orders::uuid[]);
WITH outcomes AS (
  INSERT INTO reservations (order_id, status, reason, message_id)
  SELECT * FROM unnest(:orders::uuid[], array_fill('RESERVED'::text, ARRAY[{records}]),
                       array_fill(NULL::text, ARRAY[{records}]), :messages::uuid[])
), items AS (
  INSERT INTO reservation_items (order_id, line, sku, quantity)
  SELECT * FROM unnest(:orders::uuid[] || :orders::uuid[],
                       array_fill(0::int2, ARRAY[{records}]) || array_fill(1::int2, ARRAY[{records}]),
                       :firsts::text[] || :seconds::text[],
                       array_fill(2, ARRAY[{records}]) || array_fill(1, ARRAY[{records}]))
), taken AS (
  UPDATE stock s SET available = s.available - w.quantity, reserved = s.reserved + w.quantity, updated_at = now()
  FROM (SELECT sku, sum(quantity)::int8 AS quantity
        FROM unnest(:firsts::text[] || :seconds::text[],
                    array_fill(2, ARRAY[{records}]) || array_fill(1, ARRAY[{records}])) AS item (sku, quantity)
        GROUP BY sku) AS w
  WHERE s.sku = w.sku
)
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, traceparent, tracingspancontext)
  SELECT id, 'estoque', order_id::text, 'EstoqueReservado',
         jsonb_build_object('pedidoId', order_id::text,
                            'itens', jsonb_build_array(jsonb_build_object('sku', first, 'quantidade', 2),
                                                       jsonb_build_object('sku', second, 'quantidade', 1)),
                            'reservadoEm', now()),
         {TRACE}, 'traceparent=' || {TRACE} || E'\n'
  FROM unnest(:events::uuid[], :orders::uuid[], :firsts::text[], :seconds::text[])
       WITH ORDINALITY AS e (id, order_id, first, second, n)
  ORDER BY n;
COMMIT;
"#,
        v7 = relay::v7_now(),
    )
}

/// pgbench running the consumer's transaction for batches of `batch_size`
/// on as many connections as the topic has partitions (the consumer's
/// parallelism): the database's ceiling, in records per second.
async fn pgbench_rate(batch_size: u32, duration: Duration) -> f64 {
    let (database, _pool) = database().await;
    let script = if batch_size == 1 {
        reserve_one()
    } else {
        reserve_batch(batch_size)
    };
    let mut components = Components::default();
    components.server("inventory", &database.url()).await;
    let (tps, cpu) = components
        .during(crate::pgbench::tps(
            &database.url(),
            &script,
            PARTITIONS.unsigned_abs(),
            duration,
        ))
        .await;
    println!("  pgbench, batch {batch_size}: CPU {cpu}");
    tps * f64::from(batch_size)
}

/// P3: per-message and batched transactions, each beside pgbench running
/// the same transaction, rounds interleaved.
pub(crate) async fn measure(args: &Args) -> Vec<Figure> {
    let broker = Broker::shared();
    let mut figures = Vec::new();
    for (batch_size, kind) in [(1, "per-message"), (DEFAULT_BATCH_SIZE, "batched")] {
        let (consumer, sql) = interleaved(
            args.rounds,
            || consumer_rate(args, &broker, batch_size, None, &[], 1),
            || pgbench_rate(batch_size, args.baseline_duration),
        )
        .await;
        let figure = Figure {
            name: format!(
                "P3 consumer, {} records, {kind} transactions (batch {batch_size})",
                args.records
            ),
            figure: format!("{} records/s", rates(&consumer)),
            baseline: format!(
                "pgbench, same transaction for {batch_size} record(s), {PARTITIONS} connections: {} records/s",
                rates(&sql)
            ),
            ratio: Some(Ratio::of_rounds(&consumer, &sql)),
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

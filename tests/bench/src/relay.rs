use std::time::{Duration, Instant};

use futures::future::join_all;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::PgPool;
use test_support::database::TestDatabase;
use test_support::kafka::{bootstrap_servers, create_topic, enqueue};
use test_support::process::{Service, free_port};

use crate::report::Figure;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Rows to drain.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) rows: i64,
    /// The relay binary (a release build).
    #[arg(long, default_value = "target/release/outbox-relay")]
    pub(crate) relay: String,
}

fn orders_server() -> String {
    std::env::var("ORDER_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/orders".to_owned())
}

/// SQL for a time-ordered UUID (the layout of v7) of row `i` of a fill whose
/// first row is at `start`. The order service writes v7 ids, whose index
/// entries land at the right edge of the primary key; random (v4) ids would
/// dirty a random leaf page per row, which production does not do.
/// PostgreSQL 15 has no uuidv7().
pub(crate) fn v7_id(start: &str) -> String {
    format!(
        "(lpad(to_hex((extract(epoch from {start}) * 1000)::bigint + i), 12, '0')
          || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid"
    )
}

/// Fills the outbox with `rows` PedidoCriado-sized events, one per order.
async fn fill(pool: &PgPool, aggregate_type: &str, rows: i64) {
    sqlx::query(&format!(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload)
         select {}, $1, o.order_id::text, 'PedidoCriado',
                jsonb_build_object('pedidoId', o.order_id, 'clienteId', 'c-' || (i % 1000),
                                   'itens', jsonb_build_array(jsonb_build_object('sku', 'ABC-1', 'quantidade', 2),
                                                              jsonb_build_object('sku', 'XYZ-9', 'quantidade', 1)),
                                   'criadoEm', '2026-12-02T15:00:00Z')
         -- A volatile call in a subquery's select list runs per row; in an
         -- uncorrelated lateral it ran once, and every row had one key.
         from (select i, gen_random_uuid() as order_id from generate_series(1, $2) as i) as o
         order by i",
        v7_id("now()")
    ))
    .bind(aggregate_type)
    .bind(rows)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("vacuum analyze outbox")
        .execute(pool)
        .await
        .unwrap();
}

/// Rows still to publish. The predicate is the relay's partial index's, to
/// the letter: with `published_at is null` alone this count read all ten
/// million retained rows every 20 ms, and P5 measured the observer.
async fn pending(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "select count(*) from outbox where published_at is null and parked_at is null",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// After a large fill: vacuum it and flush it to disk, so that the measured
/// run starts from a table that has lived for months, not one whose
/// checkpoint is still writing ten million new rows out.
pub(crate) async fn settle(pool: &PgPool) {
    for statement in ["vacuum analyze", "checkpoint"] {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
}

/// For P5: fills the outbox with `rows` rows already published (retained
/// history), then settles the database. The empty case (`rows` 0) settles
/// too, so that history is the only difference between the two.
async fn fill_history(pool: &PgPool, rows: i64) {
    sqlx::query(&format!(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload, created_at, published_at)
         select {}, 'history', i::text, 'PedidoCriado', '{{}}'::jsonb, now() - interval '1 day', now() - interval '1 day'
         from generate_series(1, $1) as i",
        v7_id("now() - interval '1 day'")
    ))
    .bind(rows)
    .execute(pool)
    .await
    .unwrap();
    settle(pool).await;
}

/// The relay's drain rate (rows/s): from its first published batch to an
/// empty outbox. With `retained_history`, the relay keeps published rows
/// (`--retain-published`) and that many are already in the table.
pub(crate) async fn relay_rate(args: &Args, bootstrap: &str, retained_history: Option<i64>) -> f64 {
    let (database, pool) =
        TestDatabase::create_migrated(&orders_server(), "bench_relay", &[outbox::migrator()], 2)
            .await;
    let aggregate_type = format!("bench{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let topic = format!("{aggregate_type}.eventos");
    create_topic(bootstrap, &topic, 6).await;
    if let Some(rows) = retained_history {
        fill_history(&pool, rows).await;
    }
    fill(&pool, &aggregate_type, args.rows).await;

    let http = format!("127.0.0.1:{}", free_port());
    let url = database.url();
    let mut relay_args = vec![
        "--database-url",
        &url,
        "--bootstrap-servers",
        bootstrap,
        "--http-addr",
        &http,
        "--topics",
        &topic,
    ];
    if retained_history.is_some() {
        relay_args.extend(["--retain-published", "7d"]);
    }
    let relay = Service::start(
        "outbox-relay",
        &args.relay,
        &relay_args,
        &[("RUST_LOG", "warn".to_owned())],
    );
    // The clock starts at the first published batch: start-up is not drain.
    let started_with = loop {
        let left = pending(&pool).await;
        if left < args.rows {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let started = Instant::now();
    while pending(&pool).await > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    relay.terminate(Duration::from_secs(30)).await;
    started_with as f64 / elapsed.as_secs_f64()
}

/// The same records from a raw producer with the relay's settings, all
/// enqueued at once: the broker's and librdkafka's ceiling.
pub(crate) async fn raw_producer_rate(rows: i64, bootstrap: &str) -> f64 {
    let topic = format!(
        "bench-raw-{}.eventos",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    create_topic(bootstrap, &topic, 6).await;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let records: Vec<(String, String, String)> = (0..rows)
        .map(|i| {
            let order = uuid::Uuid::new_v4().to_string();
            let value = format!(
                r#"{{"itens":[{{"sku":"ABC-1","quantidade":2}},{{"sku":"XYZ-9","quantidade":1}}],"criadoEm":"2026-12-02T15:00:00Z","pedidoId":"{order}","clienteId":"c-{}"}}"#,
                i % 1000
            );
            (order, value, uuid::Uuid::new_v4().to_string())
        })
        .collect();
    // Warm up: the idempotent producer's first send sets up its producer id.
    producer
        .send(
            FutureRecord::<str, str>::to(&topic)
                .key("warm-up")
                .payload("{}"),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let mut deliveries = Vec::with_capacity(records.len());
    for (key, value, id) in &records {
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "id",
                value: Some(id.as_str()),
            })
            .insert(Header {
                key: "eventType",
                value: Some("PedidoCriado"),
            })
            .insert(Header::<&str> {
                key: "traceparent",
                value: None,
            });
        let record = FutureRecord::to(&topic)
            .key(key.as_str())
            .payload(value.as_str())
            .headers(headers);
        deliveries.push(enqueue(&producer, record).await);
    }
    for report in join_all(deliveries).await {
        report.unwrap().unwrap();
    }
    rows as f64 / started.elapsed().as_secs_f64()
}

/// P2: the drain rate and the raw producer's rate, in one figure.
pub(crate) async fn measure(args: &Args) -> (f64, Figure) {
    let bootstrap = bootstrap_servers();
    let raw = raw_producer_rate(args.rows, &bootstrap).await;
    let relay = relay_rate(args, &bootstrap, None).await;
    let figure = Figure {
        name: format!("P2 relay draining {} rows", args.rows),
        figure: format!("{relay:.0} rows/s"),
        baseline: format!("raw rdkafka producer, same settings: {raw:.0} records/s"),
        ratio: Some(relay / raw),
        target: "≥ 0.7".to_owned(),
    };
    println!("{}", figure.ratio_line());
    (relay, figure)
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    measure(&args).await;
    Ok(())
}

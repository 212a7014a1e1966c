//! P1: POST /orders beside pgbench running the same order + items + outbox
//! transaction at the same concurrency.

use std::time::Duration;

use test_support::database::TestDatabase;
use test_support::process::{Service, free_port};

use crate::latency::wait_ready;
use crate::load::run_load;
use crate::pgbench;
use crate::report::Figure;

/// The order service's transaction, as SQL: one order, two items, one outbox
/// row with the PedidoCriado payload.
pub(crate) const ORDER_TRANSACTION: &str = r#"
\set quantity random(1, 5)
BEGIN;
INSERT INTO orders (id, customer_id, status, created_at) VALUES (gen_random_uuid(), 'c-bench', 'PENDING', now()) RETURNING id \gset
INSERT INTO order_items (order_id, line, sku, quantity)
  SELECT :id::uuid, item.line - 1, item.sku, item.quantity
  FROM unnest(ARRAY['ABC-1', 'XYZ-9'], ARRAY[:quantity::int, 1]) WITH ORDINALITY AS item (sku, quantity, line);
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
  VALUES (gen_random_uuid(), 'pedido', :id::text, 'PedidoCriado',
          jsonb_build_object('pedidoId', :id::text, 'clienteId', 'c-bench',
                             'itens', jsonb_build_array(jsonb_build_object('sku', 'ABC-1', 'quantidade', :quantity::int),
                                                        jsonb_build_object('sku', 'XYZ-9', 'quantidade', 1)),
                             'criadoEm', now()));
COMMIT;
"#;

fn orders_server() -> String {
    std::env::var("ORDER_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/orders".to_owned())
}

/// A fresh, migrated orders database.
pub(crate) async fn orders_database(prefix: &str) -> TestDatabase {
    let (database, pool) = TestDatabase::create_migrated(
        &orders_server(),
        prefix,
        &outbox::with_outbox(sqlx::migrate!("../../migrations/orders")),
        1,
    )
    .await;
    pool.close().await;
    database
}

/// Requests per second of the release order service at `concurrency`, with
/// `environment` added to its own.
pub(crate) async fn api_rate(
    binary: &str,
    concurrency: usize,
    duration: Duration,
    environment: &[(&str, String)],
) -> f64 {
    let database = orders_database("bench_api").await;
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let pool_size = concurrency.to_string();
    let service = Service::start(
        "order-service",
        binary,
        &[
            "--database-url",
            &database.url(),
            "--http-addr",
            &address,
            "--db-pool-size",
            &pool_size,
            // P1 measures the API; the return path is not on its way.
            "--no-status-consumer",
        ],
        &[&[("RUST_LOG", "warn".to_owned())], environment].concat(),
    );
    wait_ready(&address).await;
    // Warm up connections and caches.
    run_load(
        &address,
        0,
        Duration::from_secs(2),
        concurrency,
        false,
        false,
    )
    .await;
    let summary = run_load(&address, 0, duration, concurrency, false, false).await;
    service.terminate(Duration::from_secs(30)).await;
    summary.rate()
}

/// pgbench's transactions per second on the same transaction.
pub(crate) async fn pgbench_rate(concurrency: usize, duration: Duration) -> f64 {
    let database = orders_database("bench_pgbench").await;
    pgbench::tps(
        &database.url(),
        ORDER_TRANSACTION,
        u32::try_from(concurrency).unwrap(),
        duration,
    )
    .await
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The order service binary (a release build).
    #[arg(long, default_value = "target/release/order-service")]
    pub(crate) service: String,
    /// How long each side runs at each concurrency.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
}

/// P1 at concurrency 16 and 64; with the API's rate at 16 (the order write
/// rate P2 compares the relay with).
pub(crate) async fn measure(args: &Args) -> (f64, Vec<Figure>) {
    let mut figures = Vec::new();
    let mut write_rate = 0.0;
    for concurrency in [16, 64] {
        let api = api_rate(&args.service, concurrency, args.duration, &[]).await;
        let baseline = pgbench_rate(concurrency, args.duration).await;
        if concurrency == 16 {
            write_rate = api;
        }
        let figure = Figure {
            name: format!("P1 POST /orders, {concurrency} keep-alive connections"),
            figure: format!("{api:.0} req/s"),
            baseline: format!(
                "pgbench, same transaction, {concurrency} connections: {baseline:.0} tps"
            ),
            ratio: Some(api / baseline),
            target: "≥ 0.8".to_owned(),
        };
        println!("{}", figure.ratio_line());
        figures.push(figure);
    }
    (write_rate, figures)
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    measure(&args).await;
    Ok(())
}

//! P1: POST /orders beside pgbench running the same order + items + outbox
//! transaction at the same concurrency.

use std::time::Duration;

use test_support::database::TestDatabase;
use test_support::process::{Service, free_port};

use crate::cpu::Components;
use crate::latency::wait_ready;
use crate::load::run_load;
use crate::report::{Figure, Ratio, interleaved, median, rates};
use crate::{pgbench, relay};

/// What the order service writes for one order of the load (load.rs
/// `body`: one item, customer `c-load-<n % 1000>`, sku and quantity by
/// `n % 3`), as SQL: the order with its first history entry, the item, the
/// PedidoCriado outbox row without trace context (the load sends none and
/// tracing is off), with time-ordered ids as the service's. A plain
/// transaction, as an application written without entrega would write it.
/// The load's body as pgbench variables (load.rs `body`): client and item.
const LOAD_VARIABLES: &str = r"\set n random(0, 2999)
\set customer :n % 1000
\set quantity 1 + :n % 3
";

pub(crate) fn order_transaction() -> String {
    let v7 = relay::v7_now();
    format!(
        r#"
{LOAD_VARIABLES}BEGIN;
WITH o AS (
  INSERT INTO orders (id, customer_id, status, created_at)
  VALUES ({v7}, 'c-load-' || :customer, 'PENDING', now())
  RETURNING id, status, created_at)
INSERT INTO order_status_history (order_id, status, message_id, changed_at)
  SELECT id, status, {v7}, created_at FROM o
  RETURNING order_id, message_id \gset
INSERT INTO order_items (order_id, line, sku, quantity)
  VALUES (:order_id::uuid, 0, (ARRAY['ABC-1', 'XYZ-9', 'DEF-2'])[:quantity], :quantity);
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, traceparent, tracingspancontext)
  VALUES (:message_id::uuid, 'pedido', :order_id::text, 'PedidoCriado',
          jsonb_build_object('pedidoId', :order_id::text, 'clienteId', 'c-load-' || :customer,
                             'itens', jsonb_build_array(jsonb_build_object('sku', (ARRAY['ABC-1', 'XYZ-9', 'DEF-2'])[:quantity],
                                                                           'quantidade', :quantity::int)),
                             'criadoEm', now()),
          NULL, NULL);
COMMIT;
"#
    )
}

/// The same rows as [`order_transaction`], written as the service writes
/// them since issue 37: one statement of data-modifying CTEs, its own
/// implicit transaction, one round trip. The stricter baseline: the best
/// the database does for this work.
pub(crate) fn order_statement() -> String {
    let v7 = relay::v7_now();
    format!(
        r#"
{LOAD_VARIABLES}WITH ids AS (SELECT {v7} AS order_id, {v7} AS message_id),
o AS (
  INSERT INTO orders (id, customer_id, status, created_at)
  SELECT order_id, 'c-load-' || :customer, 'PENDING', now() FROM ids
  RETURNING id, status, created_at),
h AS (
  INSERT INTO order_status_history (order_id, status, message_id, changed_at)
  SELECT o.id, o.status, ids.message_id, o.created_at FROM o, ids),
i AS (
  INSERT INTO order_items (order_id, line, sku, quantity)
  SELECT id, 0, (ARRAY['ABC-1', 'XYZ-9', 'DEF-2'])[:quantity], :quantity FROM o)
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, traceparent, tracingspancontext)
  SELECT ids.message_id, 'pedido', o.id::text, 'PedidoCriado',
         jsonb_build_object('pedidoId', o.id::text, 'clienteId', 'c-load-' || :customer,
                            'itens', jsonb_build_array(jsonb_build_object('sku', (ARRAY['ABC-1', 'XYZ-9', 'DEF-2'])[:quantity],
                                                                          'quantidade', :quantity::int)),
                            'criadoEm', o.created_at),
         NULL, NULL
  FROM o, ids;
"#
    )
}

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
    pool_size: Option<u32>,
    duration: Duration,
    environment: &[(&str, String)],
) -> f64 {
    let database = orders_database("bench_api").await;
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let pool_size = pool_size.map_or_else(|| concurrency.to_string(), |size| size.to_string());
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
    let mut components = Components::default();
    components.process("order-service", service.pid());
    components.process("load generator (bench)", Some(std::process::id()));
    components.server("orders", &database.url()).await;
    let (summary, cpu) = components
        .during(run_load(&address, 0, duration, concurrency, false, false))
        .await;
    service.terminate(Duration::from_secs(30)).await;
    println!(
        "  POST /orders, {concurrency} connections: {:.0} req/s; CPU {cpu}",
        summary.rate()
    );
    summary.rate()
}

/// pgbench's transactions per second on `script` (what the service
/// writes for an order: [`order_transaction`] or [`order_statement`]).
pub(crate) async fn pgbench_rate(script: &str, concurrency: usize, duration: Duration) -> f64 {
    let database = orders_database("bench_pgbench").await;
    let mut components = Components::default();
    components.server("orders", &database.url()).await;
    let (tps, cpu) = components
        .during(pgbench::tps(
            &database.url(),
            script,
            u32::try_from(concurrency).unwrap(),
            duration,
        ))
        .await;
    println!("  pgbench, {concurrency} connections: {tps:.0} tps; CPU {cpu}");
    tps
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The order service binary (a release build).
    #[arg(long, default_value = "target/release/order-service")]
    pub(crate) service: String,
    /// How long each side runs at each concurrency, per round.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Rounds, the two sides interleaved.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// The service's database pool (`--db-pool-size`); by default as many
    /// connections as the load has.
    #[arg(long)]
    pub(crate) pool_size: Option<u32>,
}

/// P1 at concurrency 16 and 64; with the API's median rate at 16 (the
/// order write rate P2 compares the relay with).
pub(crate) async fn measure(args: &Args) -> (f64, Vec<Figure>) {
    let mut figures = Vec::new();
    let mut write_rate = 0.0;
    let (transaction, statement) = (order_transaction(), order_statement());
    for concurrency in [16, 64] {
        // Each round: the service, then pgbench's two forms of the same
        // rows (the next round the other way round).
        let (api, baselines) = interleaved(
            args.rounds,
            || {
                api_rate(
                    &args.service,
                    concurrency,
                    args.pool_size,
                    args.duration,
                    &[],
                )
            },
            || async {
                let transaction = pgbench_rate(&transaction, concurrency, args.duration).await;
                let statement = pgbench_rate(&statement, concurrency, args.duration).await;
                (transaction, statement)
            },
        )
        .await;
        let (transaction_tps, statement_tps): (Vec<f64>, Vec<f64>) = baselines.into_iter().unzip();
        if concurrency == 16 {
            write_rate = median(&api);
        }
        for (baseline, form) in [
            (
                &transaction_tps,
                "a BEGIN … COMMIT transaction of four statements",
            ),
            (&statement_tps, "one statement, as the service writes them"),
        ] {
            let figure = Figure {
                name: format!("P1 POST /orders, {concurrency} keep-alive connections"),
                figure: format!("{} req/s", rates(&api)),
                baseline: format!(
                    "pgbench, same rows in {form}, {concurrency} connections: {} tps",
                    rates(baseline)
                ),
                ratio: Some(Ratio::of_rounds(&api, baseline)),
                target: "≥ 0.9".to_owned(),
            };
            println!("{}", figure.ratio_line());
            figures.push(figure);
        }
    }
    (write_rate, figures)
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    measure(&args).await;
    Ok(())
}

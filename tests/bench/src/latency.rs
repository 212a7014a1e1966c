//! P4: latency from the outbox row's `created_at` to the reservation's
//! decision, at 25 %, 50 % and 75 % of the highest sustained order rate, the
//! whole pipeline running with its default settings.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use test_support::broker::PrivateBroker;
use test_support::database::TestDatabase;
use test_support::eventually::{eventually, within};
use test_support::kafka::create_topic;
use test_support::process::{Service, free_port};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::load::run_load;
use crate::relay::Setup;
use crate::report::Figure;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Seconds of load at each rate.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Where the release binaries are.
    #[arg(long, default_value = "target/release")]
    pub(crate) bin: String,
    /// The consumer's `fetch.wait.max.ms` (KAFKA_FETCH_WAIT_MAX_MS); unset,
    /// librdkafka's default of 500 ms.
    #[arg(long)]
    pub(crate) fetch_wait_max_ms: Option<u32>,
    /// The relay set-ups to measure, one after the other, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "poll")]
    pub(crate) setups: Vec<Setup>,
}

fn server(variable: &str, default: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| default.to_owned())
}

async fn connect(database: &TestDatabase) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .connect_with(database.options.clone())
        .await
        .unwrap()
}

/// Waits until the service on `address` answers `/readyz` with 2xx.
pub(crate) async fn wait_ready(address: &str) {
    eventually(
        &format!("{address} is ready"),
        Duration::from_secs(60),
        || async {
            reqwest::get(format!("http://{address}/readyz"))
                .await
                .ok()
                .filter(|r| r.status().is_success())
        },
    )
    .await;
}

/// How long the relay may take, after a load, to publish what it wrote.
const DRAIN_DEADLINE: Duration = Duration::from_secs(300);

/// Sorted latencies in milliseconds.
struct Latencies {
    total: Vec<f64>,
    relay_leg: Vec<f64>,
}

/// The three services on fresh databases and a broker of their own.
struct Stack {
    _broker: PrivateBroker,
    orders_db: TestDatabase,
    inventory_db: TestDatabase,
    services: Vec<Service>,
    order_api: String,
}

impl Stack {
    async fn start(bin: &str, fetch_wait_max_ms: Option<u32>, setup: Setup) -> Self {
        let broker = PrivateBroker::start().await;
        create_topic(&broker.address, "pedido.eventos", 6).await;
        create_topic(&broker.address, "pedido.eventos.dlt", 6).await;
        let orders_db = TestDatabase::create(&setup.server(), "bench_p4_orders").await;
        let inventory_db = TestDatabase::create(
            &server(
                "INVENTORY_DATABASE_URL",
                "postgres://postgres@127.0.0.1:5432/inventory",
            ),
            "bench_p4_inventory",
        )
        .await;
        let (orders_url, inventory_url) = (orders_db.url(), inventory_db.url());
        let order_api = format!("127.0.0.1:{}", free_port());
        let inventory_api = format!("127.0.0.1:{}", free_port());
        let relay_http = format!("127.0.0.1:{}", free_port());
        let quiet = [("RUST_LOG", "warn".to_owned())];
        let mut inventory_env = quiet.to_vec();
        if let Some(ms) = fetch_wait_max_ms {
            inventory_env.push(("KAFKA_FETCH_WAIT_MAX_MS", ms.to_string()));
        }
        let mut services = vec![Service::start(
            "order-service",
            &format!("{bin}/order-service"),
            // P4 measures commit -> reservation; the way back is not timed yet.
            &[
                "--database-url",
                &orders_url,
                "--http-addr",
                &order_api,
                "--no-status-consumer",
            ],
            &quiet,
        )];
        wait_ready(&order_api).await;
        let mut relay_args = vec![
            "--database-url",
            &orders_url,
            "--bootstrap-servers",
            &broker.address,
            "--http-addr",
            &relay_http,
            // Kept, so that each order's outbox created_at can be read.
            "--outbox-cleanup",
            "retain",
            "--retain-published",
            "1d",
        ];
        let mode_args = setup.relay_args(&orders_db.name);
        relay_args.extend(mode_args.iter().map(String::as_str));
        services.push(Service::start(
            "outbox-relay",
            &format!("{bin}/outbox-relay"),
            &relay_args,
            &quiet,
        ));
        services.push(Service::start(
            "inventory-service",
            &format!("{bin}/inventory-service"),
            &[
                "--database-url",
                &inventory_url,
                "--bootstrap-servers",
                &broker.address,
                "--http-addr",
                &inventory_api,
            ],
            &inventory_env,
        ));
        wait_ready(&relay_http).await;
        wait_ready(&inventory_api).await;
        let client = reqwest::Client::new();
        for sku in ["ABC-1", "XYZ-9", "DEF-2"] {
            client
                .put(format!("http://{inventory_api}/stock/{sku}"))
                .json(&serde_json::json!({"available": 1_000_000_000}))
                .send()
                .await
                .unwrap();
        }
        Self {
            _broker: broker,
            orders_db,
            inventory_db,
            services,
            order_api,
        }
    }

    /// Latencies (ms) of the orders created since `since`, once all decided:
    /// outbox row to reservation, and its first leg, outbox row to the
    /// relay's record of the broker's acknowledgement (`published_at`).
    /// `Err` says how far behind the relay was when the wait ended.
    async fn latencies(&self, since: OffsetDateTime) -> Result<Latencies, String> {
        let orders = connect(&self.orders_db).await;
        let inventory = connect(&self.inventory_db).await;
        let read_outbox = || async {
            sqlx::query_as::<_, (String, OffsetDateTime, Option<OffsetDateTime>)>(
                "select aggregateid, created_at, published_at from outbox where created_at >= $1",
            )
            .bind(since)
            .fetch_all(&orders)
            .await
            .unwrap_or_default()
        };
        let outbox = within(DRAIN_DEADLINE, || async {
            let rows = read_outbox().await;
            rows.iter().all(|row| row.2.is_some()).then_some(rows)
        })
        .await;
        let Some(outbox) = outbox else {
            let rows = read_outbox().await;
            let published = rows.iter().filter(|row| row.2.is_some()).count();
            return Err(format!(
                "the relay fell behind: {published} of {} rows published {}s after the load",
                rows.len(),
                DRAIN_DEADLINE.as_secs()
            ));
        };
        let mut relay_leg = Vec::with_capacity(outbox.len());
        let mut created = HashMap::with_capacity(outbox.len());
        for (id, created_at, published_at) in outbox {
            if let (Ok(id), Some(published_at)) = (Uuid::parse_str(&id), published_at) {
                relay_leg.push((published_at - created_at).as_seconds_f64() * 1000.0);
                created.insert(id, created_at);
            }
        }
        let ids: Vec<Uuid> = created.keys().copied().collect();
        let decided: Vec<(Uuid, OffsetDateTime)> = eventually(
            "every order is decided",
            Duration::from_secs(120),
            || async {
                let decided: Vec<(Uuid, OffsetDateTime)> = sqlx::query_as(
                    "select order_id, created_at from reservations where order_id = any($1)",
                )
                .bind(&ids)
                .fetch_all(&inventory)
                .await
                .ok()?;
                (decided.len() == ids.len()).then_some(decided)
            },
        )
        .await;
        let mut total: Vec<f64> = decided
            .into_iter()
            .filter_map(|(id, at)| {
                created
                    .get(&id)
                    .map(|c| (at - *c).as_seconds_f64() * 1000.0)
            })
            .collect();
        total.sort_by(f64::total_cmp);
        relay_leg.sort_by(f64::total_cmp);
        Ok(Latencies { total, relay_leg })
    }

    async fn stop(self) {
        for service in self.services.into_iter().rev() {
            service.terminate(Duration::from_secs(30)).await;
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

/// p50, p95 and p99 at each load level, for each relay set-up in turn.
pub(crate) async fn measure(args: &Args) -> Vec<Figure> {
    let mut figures = Vec::new();
    for &setup in &args.setups {
        figures.extend(measure_one(args, setup).await);
    }
    figures
}

async fn measure_one(args: &Args, setup: Setup) -> Vec<Figure> {
    let stack = Stack::start(&args.bin, args.fetch_wait_max_ms, setup).await;
    let mut settings = args.fetch_wait_max_ms.map_or_else(
        || "default settings".to_owned(),
        |ms| format!("KAFKA_FETCH_WAIT_MAX_MS={ms}"),
    );
    if setup != Setup::Poll {
        settings.push_str(&format!(", relay in {}", setup.label()));
    }
    // The highest sustained rate: as fast as 16 clients go, end to end.
    let top = run_load(
        &stack.order_api,
        0,
        Duration::from_secs(10),
        16,
        false,
        false,
    )
    .await
    .rate();
    if let Err(behind) = stack.latencies(OffsetDateTime::UNIX_EPOCH).await {
        panic!("{behind} at the highest rate");
    }
    let mut figures = Vec::new();
    for share in [0.25, 0.5, 0.75] {
        let rate = (top * share).max(1.0);
        let since = OffsetDateTime::now_utc();
        run_load(
            &stack.order_api,
            rate as u32,
            args.duration,
            16,
            false,
            false,
        )
        .await;
        let figure = match stack.latencies(since).await {
            Ok(Latencies { total, relay_leg }) => format!(
                "p50 {:.0} ms, p95 {:.0} ms, p99 {:.0} ms ({} orders at {rate:.0}/s); \
                 of which outbox → broker ack p50 {:.0} ms, p99 {:.0} ms",
                percentile(&total, 0.5),
                percentile(&total, 0.95),
                percentile(&total, 0.99),
                total.len(),
                percentile(&relay_leg, 0.5),
                percentile(&relay_leg, 0.99),
            ),
            Err(behind) => behind,
        };
        let figure = Figure {
            name: format!(
                "P4 created → reserved at {:.0} % of {top:.0} orders/s, {settings}",
                share * 100.0
            ),
            figure,
            baseline: "none (an absolute target)".to_owned(),
            ratio: None,
            target: if (share - 0.5).abs() < f64::EPSILON {
                "p99 ≤ 50 ms".to_owned()
            } else {
                "—".to_owned()
            },
        };
        println!("{}", figure.ratio_line());
        figures.push(figure);
    }
    stack.stop().await;
    figures
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    measure(&args).await;
    Ok(())
}

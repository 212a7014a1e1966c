//! P4: latency from the outbox row's commit to the reservation (the effect)
//! and on to the order's new status, leg by leg, at 25 %, 50 % and 75 % of
//! the highest sustained order rate; beside the broker's own floor, a
//! produce → consume round trip with the same client settings measured on
//! the same broker in the same run.

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

use crate::cpu::Components;
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
    /// The highest sustained rate (orders/s) the load levels are shares
    /// of; unset, measured on each stack (16 clients, as fast as they go).
    /// Set it to compare two builds at the same absolute loads: the
    /// measured rate moves by a third between runs on a shared machine.
    #[arg(long)]
    pub(crate) top_rate: Option<f64>,
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

/// Sorted latencies in milliseconds, per order.
#[derive(Default)]
struct Latencies {
    /// Outbox commit → reservation (the effect).
    total: Vec<f64>,
    /// Outbox commit → the relay's record of the broker's ack (`published_at`).
    to_ack: Vec<f64>,
    /// Ack → the consumer's transaction began (`processada_em`).
    to_consumed: Vec<f64>,
    /// Consumed → the reservation written in that transaction.
    to_effect: Vec<f64>,
    /// Reservation → the order's new status (the way back).
    to_status: Vec<f64>,
}

impl Latencies {
    fn sort(&mut self) {
        for legs in [
            &mut self.total,
            &mut self.to_ack,
            &mut self.to_consumed,
            &mut self.to_effect,
            &mut self.to_status,
        ] {
            legs.sort_by(f64::total_cmp);
        }
    }
}

fn p50_p99(sorted: &[f64]) -> String {
    format!(
        "{:.0}/{:.0}",
        percentile(sorted, 0.5),
        percentile(sorted, 0.99)
    )
}

/// The three services on fresh databases and a broker of their own.
struct Stack {
    _broker: PrivateBroker,
    orders_db: TestDatabase,
    inventory_db: TestDatabase,
    services: Vec<Service>,
    order_api: String,
    broker_address: String,
    components: Components,
    relay_http: String,
}

impl Stack {
    async fn start(bin: &str, fetch_wait_max_ms: Option<u32>, setup: Setup) -> Self {
        let broker = PrivateBroker::start().await;
        for topic in [
            "pedido.eventos",
            "pedido.eventos.dlt",
            "estoque.eventos",
            "estoque.eventos.dlt",
        ] {
            create_topic(&broker.address, topic, 6).await;
        }
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
        let inventory_relay_http = format!("127.0.0.1:{}", free_port());
        let quiet = [("RUST_LOG", "warn".to_owned())];
        // Both consumers (the inventory's, the order service's status
        // consumer) fetch with the same settings.
        let mut consumer_env = quiet.to_vec();
        if let Some(ms) = fetch_wait_max_ms {
            consumer_env.push(("KAFKA_FETCH_WAIT_MAX_MS", ms.to_string()));
        }
        let mut services = vec![Service::start(
            "order-service",
            &format!("{bin}/order-service"),
            &[
                "--database-url",
                &orders_url,
                "--http-addr",
                &order_api,
                "--bootstrap-servers",
                &broker.address,
            ],
            &consumer_env,
        )];
        wait_ready(&order_api).await;
        // Rows are kept, so that each order's created_at and published_at
        // can be read.
        let retain = ["--outbox-cleanup", "retain", "--retain-published", "1d"];
        let mut relay_args = vec![
            "--database-url",
            &orders_url,
            "--bootstrap-servers",
            &broker.address,
            "--http-addr",
            &relay_http,
        ];
        relay_args.extend(retain);
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
            &[
                consumer_env.as_slice(),
                &[(
                    "INVENTORY_ADMIN_TOKEN",
                    test_support::ADMIN_TOKEN.to_owned(),
                )],
            ]
            .concat(),
        ));
        wait_ready(&relay_http).await;
        wait_ready(&inventory_api).await;
        // The way back, in poll mode whatever the way out: after the
        // inventory service, which creates its outbox.
        let mut back_args = vec![
            "--database-url",
            &inventory_url,
            "--bootstrap-servers",
            &broker.address,
            "--http-addr",
            &inventory_relay_http,
            "--topics",
            "estoque.eventos",
        ];
        back_args.extend(retain);
        services.push(Service::start(
            "outbox-relay-way-back",
            &format!("{bin}/outbox-relay"),
            &back_args,
            &quiet,
        ));
        wait_ready(&inventory_relay_http).await;
        let client = reqwest::Client::new();
        for sku in ["ABC-1", "XYZ-9", "DEF-2"] {
            client
                .put(format!("http://{inventory_api}/stock/{sku}"))
                .bearer_auth(test_support::ADMIN_TOKEN)
                .json(&serde_json::json!({"available": 1_000_000_000}))
                .send()
                .await
                .unwrap();
        }
        let mut components = Components::default();
        components.process("tansu", broker.pid());
        for service in &services {
            components.process(&service.name, service.pid());
        }
        components.process("load generator (bench)", Some(std::process::id()));
        for (holds, database) in [("orders", &orders_db), ("inventory", &inventory_db)] {
            components.server(holds, &database.url()).await;
        }
        let broker_storage = server(
            "ENTREGA_BROKER_STORAGE_URL",
            "postgres://postgres@127.0.0.1:5432/postgres",
        );
        components.server("broker storage", &broker_storage).await;
        Self {
            components,
            relay_http: relay_http.clone(),
            broker_address: broker.address.clone(),
            _broker: broker,
            orders_db,
            inventory_db,
            services,
            order_api,
        }
    }

    /// Latencies (ms) of the orders created since `since`, leg by leg, once
    /// every one has its new status. `Err` says how far behind the relay
    /// was when the wait ended.
    async fn latencies(&self, since: OffsetDateTime) -> Result<Latencies, String> {
        let orders = connect(&self.orders_db).await;
        let inventory = connect(&self.inventory_db).await;
        let read_outbox = || async {
            sqlx::query_as::<_, (String, OffsetDateTime, Option<OffsetDateTime>)>(
                "select aggregateid, created_at, published_at from outbox
                 where created_at >= $1 and type = 'PedidoCriado'",
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
        let mut written = HashMap::with_capacity(outbox.len());
        for (id, created_at, published_at) in outbox {
            if let (Ok(id), Some(published_at)) = (Uuid::parse_str(&id), published_at) {
                written.insert(id, (created_at, published_at));
            }
        }
        let ids: Vec<Uuid> = written.keys().copied().collect();
        let effects: Vec<(Uuid, OffsetDateTime, OffsetDateTime)> = eventually(
            "every order is decided",
            Duration::from_secs(120),
            || async {
                let decided: Vec<(Uuid, OffsetDateTime, OffsetDateTime)> = sqlx::query_as(
                    "select r.order_id, m.processada_em, r.created_at
                     from reservations r
                     join mensagem_processada m
                       on m.consumidor = 'estoque.reserva' and m.mensagem_id = r.message_id
                     where r.order_id = any($1)",
                )
                .bind(&ids)
                .fetch_all(&inventory)
                .await
                .ok()?;
                (decided.len() == ids.len()).then_some(decided)
            },
        )
        .await;
        let statuses: HashMap<Uuid, OffsetDateTime> = eventually(
            "every order has its new status",
            Duration::from_secs(120),
            || async {
                let changed: Vec<(Uuid, OffsetDateTime)> = sqlx::query_as(
                    "select order_id, min(changed_at) from order_status_history
                     where order_id = any($1) and status in ('CONFIRMED', 'REJECTED')
                     group by order_id",
                )
                .bind(&ids)
                .fetch_all(&orders)
                .await
                .ok()?;
                (changed.len() == ids.len()).then_some(changed)
            },
        )
        .await
        .into_iter()
        .collect();
        let ms = |from: OffsetDateTime, to: OffsetDateTime| (to - from).as_seconds_f64() * 1000.0;
        let mut latencies = Latencies::default();
        for (id, consumed, effect) in effects {
            let (Some((created, acked)), Some(status)) = (written.get(&id), statuses.get(&id))
            else {
                continue;
            };
            latencies.total.push(ms(*created, effect));
            latencies.to_ack.push(ms(*created, *acked));
            latencies.to_consumed.push(ms(*acked, consumed));
            latencies.to_effect.push(ms(consumed, effect));
            latencies.to_status.push(ms(effect, *status));
        }
        latencies.sort();
        Ok(latencies)
    }

    async fn stop(self) {
        for service in self.services.into_iter().rev() {
            service.terminate(Duration::from_secs(30)).await;
        }
    }
}

/// The way-out relay's own account of its cycle, from its /metrics.
#[derive(Debug, Default)]
struct RelayCycle {
    published: f64,
    /// (sum of seconds, count) of each histogram.
    publish: (f64, f64),
    read: (f64, f64),
    mark: (f64, f64),
}

impl RelayCycle {
    async fn scrape(address: &str) -> Option<Self> {
        let text = reqwest::get(format!("http://{address}/metrics"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let value = |prefix: &str| test_support::metrics::sum(&text, prefix);
        let histogram = |name: &str, labels: &str| {
            (
                value(&format!("{name}_sum{labels} ")),
                value(&format!("{name}_count{labels} ")),
            )
        };
        Some(Self {
            published: value("outbox_published_total "),
            publish: histogram("relay_batch_publish_duration_seconds", ""),
            read: histogram("relay_statement_duration_seconds", "{statement=\"read\"}"),
            mark: histogram("relay_statement_duration_seconds", "{statement=\"mark\"}"),
        })
    }

    /// "N batches of R rows; mean read a ms, send → last ack b ms, mark c ms".
    fn since(&self, before: &Self) -> String {
        let mean_ms = |now: (f64, f64), then: (f64, f64)| {
            let count = now.1 - then.1;
            if count > 0.0 {
                format!("{:.1}", (now.0 - then.0) / count * 1000.0)
            } else {
                "-".to_owned()
            }
        };
        let batches = self.publish.1 - before.publish.1;
        format!(
            "{batches:.0} batches, {:.1} rows each; mean read {} ms, send → last ack {} ms, mark {} ms",
            (self.published - before.published) / batches.max(1.0),
            mean_ms(self.read, before.read),
            mean_ms(self.publish, before.publish),
            mean_ms(self.mark, before.mark),
        )
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
    let floor = broker_floor(&stack.broker_address, args.fetch_wait_max_ms).await;
    let floor_p99 = percentile(&floor, 0.99);
    println!(
        "broker floor ({settings}): produce → consume p50/p99 {} ms",
        p50_p99(&floor)
    );
    // The highest sustained rate: as fast as 16 clients go, end to end
    // (run even when given, as the same warm-up).
    let measured = run_load(
        &stack.order_api,
        0,
        Duration::from_secs(10),
        16,
        false,
        false,
    )
    .await
    .rate();
    let top = args.top_rate.unwrap_or(measured);
    println!("highest rate: {measured:.0} orders/s measured; load levels are shares of {top:.0}/s");
    if let Err(behind) = stack.latencies(OffsetDateTime::UNIX_EPOCH).await {
        panic!("{behind} at the highest rate");
    }
    let mut figures = Vec::new();
    for share in [0.25, 0.5, 0.75] {
        let rate = (top * share).max(1.0);
        let since = OffsetDateTime::now_utc();
        let cpu_before = stack.components.sample();
        let relay_before = RelayCycle::scrape(&stack.relay_http).await;
        // The broker's floor again, while the load runs: what the broker
        // alone takes at this CPU pressure.
        let (_, loaded_floor) = tokio::join!(
            run_load(
                &stack.order_api,
                rate as u32,
                args.duration,
                16,
                false,
                false,
            ),
            broker_floor(&stack.broker_address, args.fetch_wait_max_ms),
        );
        println!(
            "broker floor under {:.0} % load: produce → consume p50/p99 {} ms",
            share * 100.0,
            p50_p99(&loaded_floor)
        );
        let cpu = stack
            .components
            .between(&cpu_before, &stack.components.sample());
        println!("CPU at {:.0} % load: {cpu}", share * 100.0);
        if let (Some(before), Some(after)) =
            (relay_before, RelayCycle::scrape(&stack.relay_http).await)
        {
            println!(
                "relay at {:.0} % load: {}",
                share * 100.0,
                after.since(&before)
            );
        }
        let loaded_floor_p99 = percentile(&loaded_floor, 0.99);
        let figure = match stack.latencies(since).await {
            // What entrega adds: its p99 less the broker's own under the
            // same load (the floor measured beside it).
            Ok(l) => format!(
                "commit → effect p50/p99 {} ms, added p99 {:.0} ms over the broker's {loaded_floor_p99:.0} ms under this load \
                 ({} orders at {rate:.0}/s; idle broker floor p99 {floor_p99:.0} ms); \
                 legs p50/p99: commit → ack {}, ack → consumed {}, consumed → effect {}, effect → order status {}",
                p50_p99(&l.total),
                percentile(&l.total, 0.99) - loaded_floor_p99,
                l.total.len(),
                p50_p99(&l.to_ack),
                p50_p99(&l.to_consumed),
                p50_p99(&l.to_effect),
                p50_p99(&l.to_status),
            ),
            Err(behind) => behind,
        };
        let figure = Figure {
            name: format!(
                "P4 created → reserved at {:.0} % of {top:.0} orders/s, {settings}",
                share * 100.0
            ),
            figure,
            baseline: format!(
                "the broker's produce → consume, same settings: p50/p99 {}",
                p50_p99(&floor)
            ),
            ratio: None,
            target: if (share - 0.5).abs() < f64::EPSILON {
                format!(
                    "p99 ≤ broker floor p99 + 50 ms = {:.0} ms",
                    floor_p99 + 50.0
                )
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

/// The broker's own floor: one record every 100 ms for 10 s from a producer
/// with the relay's settings to a consumer with the consumers' fetch
/// settings, on a topic of its own; sorted produce → consume times (ms).
async fn broker_floor(bootstrap: &str, fetch_wait_max_ms: Option<u32>) -> Vec<f64> {
    use std::sync::mpsc;
    use std::time::Instant;

    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::producer::FutureRecord;
    use rdkafka::{Offset, TopicPartitionList};

    const RECORDS: usize = 100;
    let topic = format!("bench-floor-{}", &Uuid::new_v4().simple().to_string()[..10]);
    create_topic(bootstrap, &topic, 1).await;
    let mut consumer_config = test_support::kafka::client_config(bootstrap);
    consumer_config
        .set("group.id", &topic)
        .set("enable.auto.commit", "false");
    if let Some(ms) = fetch_wait_max_ms {
        consumer_config.set("fetch.wait.max.ms", ms.to_string());
    }
    let consumer: BaseConsumer = consumer_config.create().unwrap();
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(&topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&assignment).unwrap();
    let (received, arrivals) = mpsc::channel::<(usize, Instant)>();
    let reader = std::thread::spawn(move || {
        let mut seen = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while seen < RECORDS && Instant::now() < deadline {
            if let Some(Ok(message)) = consumer.poll(Duration::from_millis(100)) {
                let index = message
                    .key()
                    .and_then(|key| std::str::from_utf8(key).ok())
                    .and_then(|key| key.parse().ok());
                if let Some(index) = index {
                    let _ = received.send((index, Instant::now()));
                    seen += 1;
                }
            }
        }
    });
    let producer = crate::relay::relay_producer(bootstrap);
    let mut sent = Vec::with_capacity(RECORDS);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    for index in 0..RECORDS {
        tick.tick().await;
        sent.push(Instant::now());
        let key = index.to_string();
        producer
            .send(
                FutureRecord::to(&topic).key(&key).payload("{}"),
                Duration::from_secs(30),
            )
            .await
            .unwrap();
    }
    tokio::task::spawn_blocking(move || reader.join())
        .await
        .unwrap()
        .unwrap();
    let mut floor: Vec<f64> = arrivals
        .try_iter()
        .filter_map(|(index, at)| {
            sent.get(index)
                .map(|sent| at.duration_since(*sent).as_secs_f64() * 1000.0)
        })
        .collect();
    floor.sort_by(f64::total_cmp);
    floor
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    measure(&args).await;
    Ok(())
}

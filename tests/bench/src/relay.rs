use std::time::{Duration, Instant};

use futures::future::join_all;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::PgPool;
use test_support::database::TestDatabase;
use test_support::kafka::{bootstrap_servers, create_topic, enqueue};
use test_support::process::{Service, free_port};

use crate::cpu::Components;
use crate::report::{Figure, Ratio, median, rates};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Rows to drain.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) rows: i64,
    /// The relay binary (a release build).
    #[arg(long, default_value = "target/release/outbox-relay")]
    pub(crate) relay: String,
    /// The relay set-ups to measure, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "poll,poll-logical,cdc"
    )]
    pub(crate) setups: Vec<Setup>,
    /// Relay runs per set-up, each between two raw-producer runs.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
}

/// How the relay reads the outbox, and on which server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Setup {
    /// Poll mode on the orders server (the machine's PostgreSQL 15).
    Poll,
    /// Poll mode on the logical server: the baseline that CDC mode shares
    /// a server with, so that the mode is the only difference.
    PollLogical,
    /// CDC mode on the logical server (`wal_level=logical`).
    Cdc,
    /// Poll mode without the delivery log (`--delivery-log false`): what
    /// `entrega journey`'s record of each publish costs.
    PollNoDeliveryLog,
}

impl Setup {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Poll => "poll mode",
            Self::PollLogical => "poll mode on the logical server",
            Self::Cdc => "CDC mode on the logical server",
            Self::PollNoDeliveryLog => "poll mode without the delivery log",
        }
    }

    /// The server the orders database goes on.
    pub(crate) fn server(self) -> String {
        match self {
            Self::Poll | Self::PollNoDeliveryLog => orders_server(),
            Self::PollLogical | Self::Cdc => logical_server(),
        }
    }

    /// The relay's mode flags; CDC mode streams the slot `slot`.
    pub(crate) fn relay_args(self, slot: &str) -> Vec<String> {
        match self {
            Self::Poll | Self::PollLogical => Vec::new(),
            Self::PollNoDeliveryLog => ["--delivery-log", "false"].map(str::to_owned).to_vec(),
            Self::Cdc => ["--mode", "cdc", "--cdc-slot", slot]
                .map(str::to_owned)
                .to_vec(),
        }
    }
}

fn orders_server() -> String {
    std::env::var("ORDER_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/orders".to_owned())
}

/// The server with `wal_level=logical` that scripts/services runs. No
/// default: that server wants the password its URL carries.
pub(crate) fn logical_server() -> String {
    std::env::var("ENTREGA_CDC_POSTGRES_URL")
        .expect("ENTREGA_CDC_POSTGRES_URL is not set: run the benchmarks through scripts/bench")
}

/// SQL for a time-ordered UUID (the layout of v7) whose time is `millis`
/// (SQL, milliseconds since the epoch). The services write v7 ids, whose
/// index entries land at the right edge of the primary key; random (v4)
/// ids would dirty a random leaf page per row, which production does not
/// do. PostgreSQL 15 has no uuidv7().
pub(crate) fn v7_at(millis: &str) -> String {
    format!(
        "(lpad(to_hex({millis}), 12, '0')
          || '7' || substr(md5(random()::text), 1, 3) || '8' || substr(md5(random()::text), 1, 15))::uuid"
    )
}

/// A v7 id of now, as a service makes one.
pub(crate) fn v7_now() -> String {
    v7_at("(extract(epoch from clock_timestamp()) * 1000)::bigint")
}

/// A v7 id for row `i` of a fill whose first row is at `start`.
pub(crate) fn v7_id(start: &str) -> String {
    v7_at(&format!("(extract(epoch from {start}) * 1000)::bigint + i"))
}

/// A PedidoCriado-sized payload for the order `order_id` (SQL), client `i`.
fn payload_sql(order_id: &str) -> String {
    format!(
        "jsonb_build_object('pedidoId', {order_id}, 'clienteId', 'c-' || (i % 1000),
                            'itens', jsonb_build_array(jsonb_build_object('sku', 'ABC-1', 'quantidade', 2),
                                                       jsonb_build_object('sku', 'XYZ-9', 'quantidade', 1)),
                            'criadoEm', '2026-12-02T15:00:00Z')"
    )
}

/// Fills the outbox with `rows` PedidoCriado-sized events, one per order.
async fn fill(pool: &PgPool, aggregate_type: &str, rows: i64) {
    sqlx::query(&format!(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload)
         select {}, $1, o.order_id::text, 'PedidoCriado', {}
         -- A volatile call in a subquery's select list runs per row; in an
         -- uncorrelated lateral it ran once, and every row had one key.
         from (select i, gen_random_uuid() as order_id from generate_series(1, $2) as i) as o
         order by i",
        v7_id("now()"),
        payload_sql("o.order_id")
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

/// CDC mode's input: the same events, each written and deleted in a
/// transaction of its own (`--outbox-cleanup delete-in-transaction`), so
/// the table stays empty and every record comes from the WAL, one
/// transaction per event as the order service writes them. Asynchronous
/// commit only makes the fill quicker; the relay reads what is committed.
async fn fill_through_the_log(pool: &PgPool, aggregate_type: &str, rows: i64) {
    let mut connection = pool.acquire().await.unwrap();
    sqlx::query("set synchronous_commit = off")
        .execute(&mut *connection)
        .await
        .unwrap();
    // Alone in its message: a DO block commits only outside a transaction
    // block, and statements sent together run in one. It takes no
    // parameters; the type is ours (letters and digits).
    sqlx::raw_sql(&format!(
        "do $fill$
         declare
           order_id uuid;
         begin
           for i in 1..{rows} loop
             order_id := gen_random_uuid();
             insert into outbox (id, aggregatetype, aggregateid, type, payload)
             values (gen_random_uuid(), '{aggregate_type}', order_id::text, 'PedidoCriado', {});
             delete from outbox;
             commit;
           end loop;
         end
         $fill$",
        payload_sql("order_id")
    ))
    .execute(&mut *connection)
    .await
    .unwrap();
}

/// Creates the relay's publication and `slot`, as the relay would, before
/// the fill: a slot only sees what is written after it exists.
async fn create_slot(pool: &PgPool, slot: &str) {
    sqlx::query("create publication entrega_outbox for table outbox with (publish = 'insert')")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("select pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(slot)
        .execute(pool)
        .await
        .unwrap();
}

/// Rows the relay has published (acknowledged by the broker), from its
/// `/metrics`: the same measure in both modes, and it reads no table (with
/// ten million retained rows, counting the backlog measured the observer).
async fn published(relay_http: &str) -> f64 {
    let Ok(response) = reqwest::get(format!("http://{relay_http}/metrics")).await else {
        return 0.0;
    };
    let text = response.text().await.unwrap_or_default();
    test_support::metrics::sum(&text, "outbox_published_total")
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

/// The relay's drain rate (rows/s) in `setup`: from its first published
/// batch to the last row. With `retained_history`, the relay keeps
/// published rows (`--outbox-cleanup retain`) and that many are already in
/// the table (poll mode only).
pub(crate) async fn relay_rate(
    args: &Args,
    setup: Setup,
    bootstrap: &str,
    retained_history: Option<i64>,
) -> f64 {
    let (database, pool) =
        TestDatabase::create_migrated(&setup.server(), "bench_relay", &[outbox::migrator()], 2)
            .await;
    let aggregate_type = format!("bench{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let topic = format!("{aggregate_type}.eventos");
    create_topic(bootstrap, &topic, 6).await;
    if let Some(rows) = retained_history {
        fill_history(&pool, rows).await;
    }
    if setup == Setup::Cdc {
        create_slot(&pool, &database.name).await;
        fill_through_the_log(&pool, &aggregate_type, args.rows).await;
        settle(&pool).await;
    } else {
        fill(&pool, &aggregate_type, args.rows).await;
    }

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
    if setup == Setup::Cdc {
        relay_args.extend(["--outbox-cleanup", "delete-in-transaction"]);
    } else if retained_history.is_some() {
        relay_args.extend(["--outbox-cleanup", "retain", "--retain-published", "7d"]);
    }
    let mode_args = setup.relay_args(&database.name);
    relay_args.extend(mode_args.iter().map(String::as_str));
    let relay = Service::start(
        "outbox-relay",
        &args.relay,
        &relay_args,
        &[("RUST_LOG", "warn".to_owned())],
    );
    let rows = args.rows as f64;
    // Found before the clock starts: finding them is not the work measured.
    let mut components = Components::default();
    components.process("outbox-relay", relay.pid());
    components.server("outbox", &url).await;
    components.broker(bootstrap).await;
    // The clock starts at the first published batch: start-up is not drain.
    let published_before = loop {
        let published = published(&http).await;
        if published > 0.0 {
            break published;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let started = Instant::now();
    let ((), cpu) = components
        .during(async {
            while published(&http).await < rows {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    let elapsed = started.elapsed();
    relay.terminate(Duration::from_secs(30)).await;
    let rate = (rows - published_before) / elapsed.as_secs_f64();
    println!("  relay ({setup:?}): {rate:.0} rows/s; CPU {cpu}");
    rate
}

/// A producer with the relay's settings (publisher.rs): the baselines'.
pub(crate) fn relay_producer(bootstrap: &str) -> FutureProducer {
    test_support::kafka::client_config(bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        .create()
        .unwrap()
}

/// The same records from a raw producer with the relay's settings, all
/// enqueued at once: the broker's and librdkafka's ceiling.
pub(crate) async fn raw_producer_rate(rows: i64, bootstrap: &str) -> f64 {
    let topic = format!(
        "bench-raw-{}.eventos",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    create_topic(bootstrap, &topic, 6).await;
    let producer = relay_producer(bootstrap);
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
    let mut components = Components::default();
    components.process("raw producer (bench)", Some(std::process::id()));
    components.broker(bootstrap).await;
    let started = Instant::now();
    let ((), cpu) = components
        .during(async {
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
        })
        .await;
    let rate = rows as f64 / started.elapsed().as_secs_f64();
    println!("  raw producer: {rate:.0} records/s; CPU {cpu}");
    rate
}

/// P2: the drain rate of each set-up beside the raw producer's rate,
/// which swings with the broker's storage: each relay run sits between two
/// raw runs and is compared with their mean. Also poll mode's median rate,
/// if it ran, for the comparison with the write rate.
pub(crate) async fn measure(args: &Args) -> (Option<f64>, Vec<Figure>) {
    let bootstrap = bootstrap_servers();
    let mut poll_rate = None;
    let mut figures = Vec::new();
    for &setup in &args.setups {
        let mut raw = vec![raw_producer_rate(args.rows, &bootstrap).await];
        let mut relay = Vec::with_capacity(args.rounds);
        for _ in 0..args.rounds {
            relay.push(relay_rate(args, setup, &bootstrap, None).await);
            raw.push(raw_producer_rate(args.rows, &bootstrap).await);
        }
        let around: Vec<f64> = raw.windows(2).map(|w| f64::midpoint(w[0], w[1])).collect();
        if setup == Setup::Poll {
            poll_rate = Some(median(&relay));
        }
        let name = match setup {
            Setup::Poll => format!("P2 relay draining {} rows", args.rows),
            _ => format!("P2 relay draining {} rows, {}", args.rows, setup.label()),
        };
        let figure = Figure {
            name,
            figure: format!("{} rows/s", rates(&relay)),
            baseline: format!(
                "raw rdkafka producer, same settings, before and after each run: {} records/s",
                rates(&raw)
            ),
            ratio: Some(Ratio::of_rounds(&relay, &around)),
            target: "≥ 0.8".to_owned(),
        };
        println!("{}", figure.ratio_line());
        figures.push(figure);
    }
    (poll_rate, figures)
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    measure(&args).await;
    Ok(())
}

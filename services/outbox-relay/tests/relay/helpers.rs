use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use sqlx::PgPool;
use test_support::amqp::TestQueue;
use test_support::database::TestDatabase;
use test_support::eventually::eventually;
use test_support::kafka::{Record, TopicReader, bootstrap_servers, create_topic};
use test_support::process::{RELAY_QUICK_FLAGS, Service, free_port};
use uuid::Uuid;

pub(crate) const RELAY: &str = env!("CARGO_BIN_EXE_outbox-relay");
pub(crate) const PARTITIONS: i32 = 6;

fn orders_server() -> String {
    std::env::var("ORDER_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/orders".to_owned())
}

/// A server with wal_level=logical (scripts/services picks it).
pub(crate) fn logical_server() -> String {
    std::env::var("ENTREGA_CDC_POSTGRES_URL")
        .expect("ENTREGA_CDC_POSTGRES_URL is not set: run the tests through scripts/test")
}

/// How the relay under test reads the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Poll,
    /// From a slot named after the test's database, on a logical server.
    Cdc,
}

/// One test's outbox database and topic.
#[derive(Debug)]
pub(crate) struct RelayTest {
    pub(crate) database: TestDatabase,
    pub(crate) pool: PgPool,
    /// The aggregatetype of this test's rows; its topic is `<it>.eventos`.
    pub(crate) aggregate_type: String,
    pub(crate) topic: String,
    pub(crate) bootstrap: String,
    /// CDC mode's slot; `None` in poll mode.
    pub(crate) cdc_slot: Option<String>,
    /// CDC mode as the stream alone can pass it: inserts are deleted in
    /// their own transaction (`--outbox-cleanup delete-in-transaction`), so
    /// the relay's start-up catch-up finds nothing and every record comes
    /// from the WAL. [`RelayTest::keeping_rows`] turns it off.
    delete_in_transaction: bool,
    /// A WAL position inside the last insert's transaction, before its
    /// commit: the slot's confirmed position passes it once that
    /// transaction (and so every earlier one) was delivered.
    last_insert_lsn: std::sync::Mutex<Option<String>>,
    /// The next payload `n`: increasing across inserts, for order checks.
    next_n: AtomicI64,
    /// The relay publishes to RabbitMQ, to the exchange named `topic`.
    rabbitmq: bool,
}

impl RelayTest {
    pub(crate) async fn new() -> Self {
        Self::with_broker(&bootstrap_servers()).await
    }

    pub(crate) async fn with_broker(bootstrap: &str) -> Self {
        Self::in_mode(Mode::Poll, bootstrap).await
    }

    /// A test of the relay in `mode`, its database on the server that mode
    /// needs.
    pub(crate) async fn in_mode(mode: Mode, bootstrap: &str) -> Self {
        let server = match mode {
            Mode::Poll => orders_server(),
            Mode::Cdc => logical_server(),
        };
        Self::on_server(&server, mode, bootstrap).await
    }

    pub(crate) async fn on_server(server: &str, mode: Mode, bootstrap: &str) -> Self {
        let (database, pool) =
            TestDatabase::create_migrated(server, "relay_test", &[outbox::migrator()], 4).await;
        let cdc_slot = (mode == Mode::Cdc).then(|| database.name.clone());
        let aggregate_type = format!("relaytest{}", &Uuid::new_v4().simple().to_string()[..12]);
        let topic = format!("{aggregate_type}.eventos");
        create_topic(bootstrap, &topic, PARTITIONS).await;
        Self {
            database,
            pool,
            aggregate_type,
            topic,
            bootstrap: bootstrap.to_owned(),
            delete_in_transaction: cdc_slot.is_some(),
            cdc_slot,
            last_insert_lsn: std::sync::Mutex::new(None),
            next_n: AtomicI64::new(0),
            rabbitmq: false,
        }
    }

    /// The relay publishes to RabbitMQ (`AMQP_URL`), to the exchange named
    /// like the topic, declared here so that a queue can be bound to it
    /// before the relay starts ([`Self::queue`]).
    pub(crate) async fn over_rabbitmq(mut self) -> Self {
        let connection = test_support::amqp::connect().await;
        let channel = connection.create_channel().await.unwrap();
        test_support::amqp::declare_exchange(&channel, &self.topic).await;
        let _ = connection.close(200, "declared".into()).await;
        self.rabbitmq = true;
        self
    }

    /// A queue of this test's bound to its exchange: every message
    /// published from now on.
    pub(crate) async fn queue(&self) -> TestQueue {
        TestQueue::bound(&self.topic, "#").await
    }

    /// CDC mode with the rows left in the table for the relay to delete.
    pub(crate) fn keeping_rows(mut self) -> Self {
        self.delete_in_transaction = false;
        self
    }

    /// Inserts `per_aggregate` events for each of `aggregates` aggregates in
    /// one statement, interleaved; payload `{"n": k}` with k increasing in
    /// insert (and so seq) order. Returns the ids.
    pub(crate) async fn insert_events(&self, aggregates: usize, per_aggregate: usize) -> Vec<Uuid> {
        let total = i64::try_from(aggregates * per_aggregate).unwrap();
        let first_n = self.next_n.fetch_add(total, Ordering::SeqCst);
        let mut tx = self.pool.begin().await.unwrap();
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "insert into outbox (id, aggregatetype, aggregateid, type, payload)
             select gen_random_uuid(), $1, 'agg-' || (i % $2), 'TestEvent', jsonb_build_object('n', $4 + i)
             from generate_series(0, $3 - 1) as i
             order by i
             returning id",
        )
        .bind(&self.aggregate_type)
        .bind(i64::try_from(aggregates).unwrap())
        .bind(total)
        .bind(first_n)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        self.commit_inserts(tx, &ids).await;
        ids
    }

    /// Commits a transaction that inserted the rows `ids`, deleting them
    /// first in CDC's delete-in-transaction set-up.
    pub(crate) async fn commit_inserts(
        &self,
        mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
        ids: &[Uuid],
    ) {
        if self.delete_in_transaction {
            sqlx::query("delete from outbox where id = any($1)")
                .bind(ids)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        if self.cdc_slot.is_some() {
            let lsn: String = sqlx::query_scalar("select pg_current_wal_insert_lsn()::text")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            *self.last_insert_lsn.lock().unwrap() = Some(lsn);
        }
        tx.commit().await.unwrap();
    }

    /// True once the slot's confirmed position passed `lsn`.
    pub(crate) async fn confirmed_past(&self, lsn: &str) -> bool {
        sqlx::query_scalar::<_, Option<bool>>(
            "select confirmed_flush_lsn > $2::pg_lsn from pg_replication_slots where slot_name = $1",
        )
        .bind(self.cdc_slot.as_deref())
        .bind(lsn)
        .fetch_optional(&self.pool)
        .await
        .unwrap()
        .flatten()
        .unwrap_or(false)
    }

    /// True once every row inserted so far is published.
    pub(crate) async fn drained(&self) -> bool {
        if self.delete_in_transaction {
            let last = self.last_insert_lsn.lock().unwrap().clone();
            let streamed = match last {
                Some(lsn) => self.confirmed_past(&lsn).await,
                None => true,
            };
            // Past the slot's confirmed position a row is published, or
            // stepped aside into the table for the relay to send.
            streamed && self.stepped_aside().await == 0
        } else {
            self.pending().await == 0
        }
    }

    /// CDC mode: rows stepped aside into the table and not yet published.
    pub(crate) async fn stepped_aside(&self) -> i64 {
        sqlx::query_scalar(
            "select count(*) from outbox where published_at is null and parked_at is null",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    /// CDC mode: waits until `relay` leads and streams the slot, so that
    /// rows inserted from now on come down the stream.
    pub(crate) async fn wait_until_streaming(&self, relay: &RelayProcess) {
        let slot = self.cdc_slot.as_deref().expect("a CDC test");
        eventually(
            "the relay streams the slot",
            Duration::from_secs(60),
            || async {
                let active: Option<bool> = sqlx::query_scalar(
                    "select active from pg_replication_slots where slot_name = $1",
                )
                .bind(slot)
                .fetch_optional(&self.pool)
                .await
                .unwrap();
                (active == Some(true) && relay.role().await.as_deref() == Some("leader"))
                    .then_some(())
            },
        )
        .await;
    }

    /// Inserts one row in a transaction of its own, as a writer in this
    /// test's mode does (deleted in it with delete-in-transaction).
    pub(crate) async fn write_row(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        payload: &str,
    ) -> Uuid {
        let mut tx = self.pool.begin().await.unwrap();
        let id: Uuid = sqlx::query_scalar(
            "insert into outbox (id, aggregatetype, aggregateid, type, payload)
             values (gen_random_uuid(), $1, $2, 'TestEvent', $3::jsonb) returning id",
        )
        .bind(aggregate_type)
        .bind(aggregate_id)
        .bind(payload)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        self.commit_inserts(tx, &[id]).await;
        id
    }

    /// True once some of the rows inserted so far are published.
    pub(crate) async fn started_publishing(&self, first_insert_lsn: Option<&str>) -> bool {
        match (self.delete_in_transaction, first_insert_lsn) {
            (true, Some(lsn)) => self.confirmed_past(lsn).await,
            _ => self.pending().await < self.next_n.load(Ordering::SeqCst),
        }
    }

    /// The WAL position of the last insert (CDC mode).
    pub(crate) fn last_insert_lsn(&self) -> Option<String> {
        self.last_insert_lsn.lock().unwrap().clone()
    }

    /// Inserts one row as given.
    pub(crate) async fn insert_row(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        payload: &str,
    ) -> Uuid {
        sqlx::query_scalar(
            "insert into outbox (id, aggregatetype, aggregateid, type, payload)
             values (gen_random_uuid(), $1, $2, 'TestEvent', $3::jsonb) returning id",
        )
        .bind(aggregate_type)
        .bind(aggregate_id)
        .bind(payload)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    /// Rows not yet published (parked included).
    pub(crate) async fn pending(&self) -> i64 {
        sqlx::query_scalar("select count(*) from outbox where published_at is null")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    pub(crate) async fn remaining_ids(&self) -> HashSet<Uuid> {
        sqlx::query_scalar::<_, Uuid>("select id from outbox where published_at is null")
            .fetch_all(&self.pool)
            .await
            .unwrap()
            .into_iter()
            .collect()
    }

    /// Starts the relay binary on this test's database and topic.
    pub(crate) fn start_relay(&self, extra: &[&str]) -> RelayProcess {
        self.start_relay_with_env(extra, &[])
    }

    /// The same, with `envs` added to its environment.
    pub(crate) fn start_relay_with_env(
        &self,
        extra: &[&str],
        envs: &[(&str, String)],
    ) -> RelayProcess {
        self.start_relay_on(&self.database.url(), extra, envs)
    }

    /// The same, reaching this test's database at `database_url` (through
    /// a proxy, say).
    pub(crate) fn start_relay_on(
        &self,
        database_url: &str,
        extra: &[&str],
        envs: &[(&str, String)],
    ) -> RelayProcess {
        let port = free_port();
        let mut args: Vec<String> = [
            "--database-url",
            database_url,
            "--bootstrap-servers",
            &self.bootstrap,
            "--http-addr",
            &format!("127.0.0.1:{port}"),
            "--topics",
            &self.topic,
        ]
        .iter()
        .chain(RELAY_QUICK_FLAGS)
        .map(|s| (*s).to_owned())
        .collect();
        if self.rabbitmq {
            args.extend(["--transport".to_owned(), "rabbitmq".to_owned()]);
            args.extend(["--amqp-url".to_owned(), test_support::amqp::amqp_url()]);
        }
        if let Some(slot) = &self.cdc_slot {
            args.extend(["--mode", "cdc", "--cdc-slot", slot].map(str::to_owned));
            if self.delete_in_transaction && !extra.contains(&"--outbox-cleanup") {
                args.extend(["--outbox-cleanup", "delete-in-transaction"].map(str::to_owned));
            }
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        RelayProcess {
            service: Service::start("outbox-relay", RELAY, &args, envs),
            http: format!("http://127.0.0.1:{port}"),
        }
    }

    /// Waits until the row `id` is published (and so deleted).
    pub(crate) async fn wait_until_published(&self, id: Uuid, what: &str, deadline: Duration) {
        eventually(what, deadline, || async {
            let left: i64 = sqlx::query_scalar("select count(*) from outbox where id = $1")
                .bind(id)
                .fetch_one(&self.pool)
                .await
                .unwrap();
            (left == 0).then_some(())
        })
        .await;
    }

    /// Waits until every row is published.
    pub(crate) async fn wait_until_drained(&self, deadline: Duration) {
        eventually("the outbox drains", deadline, || async {
            self.drained().await.then_some(())
        })
        .await;
    }

    /// Waits until the outbox drains, reads the topic until every row of
    /// `inserted` may be there, and says how they arrived.
    pub(crate) async fn delivery_once_drained(&self, inserted: &[Uuid]) -> Delivery {
        self.wait_until_drained(Duration::from_secs(120)).await;
        let records = self
            .reader()
            .read_at_least(inserted.len(), Duration::from_secs(60))
            .await;
        delivery(&records, inserted)
    }

    pub(crate) fn reader(&self) -> TopicReader {
        TopicReader::new(&self.bootstrap, &self.topic)
    }
}

/// A relay process and its HTTP address.
#[derive(Debug)]
pub(crate) struct RelayProcess {
    pub(crate) service: Service,
    pub(crate) http: String,
}

impl RelayProcess {
    /// The role /readyz reports, once it answers.
    pub(crate) async fn role(&self) -> Option<String> {
        let reply = reqwest::get(format!("{}/readyz", self.http)).await.ok()?;
        let body: serde_json::Value = reply.json().await.ok()?;
        body["role"].as_str().map(str::to_owned)
    }

    /// True once /readyz answers 200.
    pub(crate) async fn is_ready(&self) -> bool {
        reqwest::get(format!("{}/readyz", self.http))
            .await
            .is_ok_and(|reply| reply.status().is_success())
    }

    /// Waits until /metrics has a line containing `line` (a relay not yet
    /// listening is waited for too).
    pub(crate) async fn wait_for_metric(&self, what: &str, line: &str, deadline: Duration) {
        eventually(what, deadline, || async {
            self.try_metrics().await?.contains(line).then_some(())
        })
        .await;
    }

    pub(crate) async fn metrics(&self) -> String {
        self.try_metrics().await.unwrap()
    }

    /// The sum of the metric lines that start with `prefix`; 0 while the
    /// relay does not answer yet (a relay still starting).
    pub(crate) async fn metric(&self, prefix: &str) -> f64 {
        self.try_metrics()
            .await
            .map_or(0.0, |text| test_support::metrics::sum(&text, prefix))
    }

    /// /metrics, or `None` while the relay does not answer.
    pub(crate) async fn try_metrics(&self) -> Option<String> {
        reqwest::get(format!("{}/metrics", self.http))
            .await
            .ok()?
            .text()
            .await
            .ok()
    }
}

/// What the records on a topic say about delivery.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Delivery {
    pub(crate) distinct: usize,
    pub(crate) duplicates: usize,
    pub(crate) lost: usize,
    /// Aggregates whose events were first delivered out of insert order.
    pub(crate) order_violations: usize,
    /// Records, duplicates included, that came after a later event of their
    /// aggregate: what a deposed leader sending stale rows would cause.
    pub(crate) regressions: usize,
}

/// Compares the records with the ids that were inserted.
pub(crate) fn delivery(records: &[Record], inserted: &[Uuid]) -> Delivery {
    let mut first_seen: HashSet<String> = HashSet::new();
    let mut first_records = Vec::new();
    for record in records {
        let id = record.header("id").expect("every record has an id header");
        if first_seen.insert(id) {
            first_records.push(record);
        }
    }
    let lost = inserted
        .iter()
        .filter(|id| !first_seen.contains(&id.to_string()))
        .count();
    // Per aggregate, n never goes back, duplicates included.
    let mut highest_n: HashMap<String, i64> = HashMap::new();
    let mut regressions = 0;
    for record in records {
        let n = payload_n(record);
        let highest = highest_n.entry(record.key_text()).or_insert(n);
        if n < *highest {
            regressions += 1;
        }
        *highest = (*highest).max(n);
    }
    // Per aggregate, the n of first deliveries must increase.
    let mut last_n: HashMap<String, i64> = HashMap::new();
    let mut violations: HashSet<String> = HashSet::new();
    for record in &first_records {
        let n = payload_n(record);
        let key = record.key_text();
        if let Some(previous) = last_n.insert(key.clone(), n)
            && previous > n
        {
            violations.insert(key);
        }
    }
    Delivery {
        distinct: first_records.len(),
        duplicates: records.len() - first_records.len(),
        lost,
        order_violations: violations.len(),
        regressions,
    }
}

fn payload_n(record: &Record) -> i64 {
    let value: serde_json::Value =
        serde_json::from_slice(record.value.as_deref().unwrap_or_default()).unwrap();
    value["n"].as_i64().unwrap_or(-1)
}

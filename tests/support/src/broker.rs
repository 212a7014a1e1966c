//! Private brokers: a tansu of the test's own, on its own port and storage
//! database, so that a test can stop and restart it without disturbing the
//! shared broker other tests use. Needs the variables `scripts/services env`
//! prints (ENTREGA_TANSU_BIN, ENTREGA_TANSU_SCHEMA, ENTREGA_BROKER_STORAGE_URL).

use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use sqlx::{Connection, PgConnection};

use crate::database::TestDatabase;
use crate::process::{Service, free_port};

fn required(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: run the tests through scripts/test"))
}

/// A broker owned by one test.
#[derive(Debug)]
pub struct PrivateBroker {
    pub address: String,
    storage: TestDatabase,
    process: Option<Service>,
}

impl PrivateBroker {
    /// Starts a broker with fresh storage and waits until it answers.
    pub async fn start() -> Self {
        let storage =
            TestDatabase::create(&required("ENTREGA_BROKER_STORAGE_URL"), "tansu_test").await;
        let schema = std::fs::read_to_string(required("ENTREGA_TANSU_SCHEMA"))
            .expect("reading the tansu schema");
        let mut conn = PgConnection::connect_with(&storage.options).await.unwrap();
        sqlx::raw_sql(&schema)
            .execute(&mut conn)
            .await
            .expect("applying the tansu schema");
        conn.close().await.unwrap();
        let mut broker = Self {
            address: format!("127.0.0.1:{}", free_port()),
            storage,
            process: None,
        };
        broker.restart().await;
        broker
    }

    /// Starts the broker again on the same port and storage (after a stop).
    pub async fn restart(&mut self) {
        assert!(self.process.is_none(), "the broker is running");
        let url = format!("tcp://{}", self.address);
        self.process = Some(Service::start(
            "tansu",
            &required("ENTREGA_TANSU_BIN"),
            &[
                "broker",
                "--cluster-id",
                "entrega-test",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ],
            // Its storage URL carries a password: tansu reads it from the
            // environment, as a command line is public.
            &[("STORAGE_ENGINE", self.storage.url())],
        ));
        self.wait_until_it_answers(Duration::from_secs(30)).await;
    }

    /// Deletes the records of `topic`'s `partition` before `offset`, as
    /// retention does when it drops a log segment: the low watermark moves
    /// to `offset`. Works on the broker's storage because tansu 0.6's
    /// DeleteRecords cannot do it: its PostgreSQL statement deletes the
    /// records *from* the offset on, and names columns its own schema lacks
    /// (docs/local-services.md).
    pub async fn expire_records_before(&self, topic: &str, partition: i32, offset: i64) {
        let mut conn = PgConnection::connect_with(&self.storage.options)
            .await
            .unwrap();
        let deleted = sqlx::query(
            "delete from record r using topition tp, topic t
             where r.topition = tp.id and tp.topic = t.id
               and t.name = $1 and tp.partition = $2 and r.offset_id < $3",
        )
        .bind(topic)
        .bind(partition)
        .bind(offset)
        .execute(&mut conn)
        .await
        .unwrap()
        .rows_affected();
        assert!(
            deleted > 0,
            "no record of {topic}[{partition}] before {offset}"
        );
        sqlx::query(
            "update watermark w set low = $3 from topition tp, topic t
             where w.topition = tp.id and tp.topic = t.id and t.name = $1 and tp.partition = $2",
        )
        .bind(topic)
        .bind(partition)
        .bind(offset)
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    }

    /// The broker process, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(Service::pid)
    }

    /// SIGTERM, as an orderly broker shutdown.
    pub async fn stop(&mut self) {
        if let Some(process) = self.process.take() {
            process.terminate(Duration::from_secs(30)).await;
        }
    }

    /// SIGKILL, as a crash.
    pub async fn kill(&mut self) {
        if let Some(process) = self.process.take() {
            process.kill().await;
        }
    }

    async fn wait_until_it_answers(&self, deadline: Duration) {
        let address = self.address.clone();
        let answered = tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &address)
                .create()
                .unwrap();
            let started = std::time::Instant::now();
            while started.elapsed() < deadline {
                if consumer
                    .fetch_metadata(None, Duration::from_secs(1))
                    .is_ok()
                {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            false
        })
        .await
        .unwrap();
        assert!(
            answered,
            "the private broker on {} did not answer within {deadline:?}",
            self.address
        );
    }
}

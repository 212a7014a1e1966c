//! PostgreSQL and the broker in containers, started with testcontainers, for
//! the pipeline to run against (docs/containers.md).
//!
//! The images are the ones users pull, `postgres:17` and `apache/kafka`,
//! unless `ENTREGA_TC_POSTGRES_IMAGE` / `ENTREGA_TC_KAFKA_IMAGE` name others:
//! machines without an image registry use the stand-ins `scripts/docker`
//! builds (PostgreSQL from Debian's packages; tansu). Containers share the
//! host's network and listen on 127.0.0.1 only, on free ports, so the tests
//! reach them on loopback and nothing is published anywhere else.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use sqlx::{Connection, PgConnection};
use test_support::eventually::eventually;
use test_support::process::free_port;
use testcontainers::core::WaitFor;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use testcontainers_modules::postgres::Postgres as PostgresModule;

const DEFAULT_POSTGRES_IMAGE: &str = "postgres:17";
const DEFAULT_KAFKA_IMAGE: &str = "apache/kafka:3.9.1";
/// Every container the suite starts carries it: `docker ps -a --filter
/// label=entrega.suite` lists them, and only they are ever removed.
pub const LABEL: &str = "entrega.suite";
const STARTUP: Duration = Duration::from_secs(180);

/// `name:tag` of the image `variable` selects, else `default`.
fn image(variable: &str, default: &str) -> (String, String) {
    let image = std::env::var(variable).unwrap_or_else(|_| default.to_owned());
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name.to_owned(), tag.to_owned()),
        _ => (image, "latest".to_owned()),
    }
}

/// A PostgreSQL container with `wal_level=logical`, so that both relay
/// modes can run on it.
#[derive(Debug)]
pub struct PostgresContainer {
    pub port: u16,
    container: ContainerAsync<PostgresModule>,
}

impl PostgresContainer {
    pub async fn start() -> Self {
        let port = free_port();
        let (name, tag) = image("ENTREGA_TC_POSTGRES_IMAGE", DEFAULT_POSTGRES_IMAGE);
        let container = PostgresModule::default()
            .with_host_auth()
            .with_name(name)
            .with_tag(tag)
            // fsync=off as the module sets it: a stopped or killed container
            // loses its processes, not the host's page cache.
            .with_cmd([
                "-c",
                "fsync=off",
                "-c",
                "wal_level=logical",
                "-c",
                "max_replication_slots=20",
                "-c",
                "max_wal_senders=20",
                "-c",
                "max_connections=200",
                "-c",
                "listen_addresses=127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .with_network("host")
            .with_label(LABEL, "postgres")
            .with_startup_timeout(STARTUP)
            .start()
            .await
            .expect("the PostgreSQL container starts (scripts/docker up builds the local image)");
        let postgres = Self { port, container };
        postgres.wait_until_it_answers().await;
        postgres
    }

    /// The URL of `database` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    async fn wait_until_it_answers(&self) {
        let url = self.url("postgres");
        eventually(
            "the PostgreSQL container accepts connections",
            Duration::from_secs(120),
            || async { PgConnection::connect(&url).await.ok().map(|_| ()) },
        )
        .await;
    }

    /// `docker stop` (a fast shutdown), then `docker start`: the data stays.
    pub async fn restart(&mut self) {
        self.container.stop().await.expect("docker stop");
        self.container.start().await.expect("docker start");
        self.wait_until_it_answers().await;
    }
}

/// A Kafka-protocol broker in a container: Apache Kafka in KRaft mode, or
/// the tansu stand-in, configured alike through the environment.
#[derive(Debug)]
pub struct BrokerContainer {
    pub address: String,
    container: ContainerAsync<GenericImage>,
}

impl BrokerContainer {
    pub async fn start() -> Self {
        let (port, controller, storage) = (free_port(), free_port(), free_port());
        let address = format!("127.0.0.1:{port}");
        let (name, tag) = image("ENTREGA_TC_KAFKA_IMAGE", DEFAULT_KAFKA_IMAGE);
        let mut request = GenericImage::new(name, tag)
            .with_wait_for(WaitFor::Nothing)
            .with_network("host")
            .with_label(LABEL, "broker")
            .with_startup_timeout(STARTUP);
        for (key, value) in [
            // apache/kafka: one node, broker and controller, on loopback.
            ("KAFKA_NODE_ID", "1".to_owned()),
            ("KAFKA_PROCESS_ROLES", "broker,controller".to_owned()),
            (
                "KAFKA_LISTENERS",
                format!("PLAINTEXT://{address},CONTROLLER://127.0.0.1:{controller}"),
            ),
            (
                "KAFKA_ADVERTISED_LISTENERS",
                format!("PLAINTEXT://{address}"),
            ),
            ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER".to_owned()),
            (
                "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT".to_owned(),
            ),
            (
                "KAFKA_CONTROLLER_QUORUM_VOTERS",
                format!("1@127.0.0.1:{controller}"),
            ),
            ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1".to_owned()),
            (
                "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                "1".to_owned(),
            ),
            ("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1".to_owned()),
            ("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0".to_owned()),
            ("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false".to_owned()),
            // The tansu stand-in (compose/local/tansu-entrypoint.sh).
            ("TANSU_LISTENER_URL", format!("tcp://{address}")),
            ("TANSU_ADVERTISED_LISTENER_URL", format!("tcp://{address}")),
            ("TANSU_STORAGE_PORT", storage.to_string()),
        ] {
            request = request.with_env_var(key, value);
        }
        let container = request
            .start()
            .await
            .expect("the broker container starts (scripts/docker up builds the local image)");
        let broker = Self { address, container };
        broker.wait_until_it_answers().await;
        broker
    }

    async fn wait_until_it_answers(&self) {
        let consumer: BaseConsumer = test_support::kafka::client_config(&self.address)
            .create()
            .expect("a metadata client");
        eventually(
            "the broker container answers metadata requests",
            Duration::from_secs(120),
            || async {
                consumer
                    .fetch_metadata(None, Duration::from_secs(2))
                    .ok()
                    .filter(|metadata| !metadata.brokers().is_empty())
                    .map(|_| ())
            },
        )
        .await;
    }

    /// `docker stop`: SIGTERM, the broker shuts down.
    pub async fn stop(&mut self) {
        self.container.stop().await.expect("docker stop");
    }

    /// `docker stop` with no grace: SIGKILL at once.
    pub async fn kill(&mut self) {
        self.container
            .stop_with_timeout(Some(0))
            .await
            .expect("docker stop -t 0");
    }

    /// `docker start` after a stop or a kill; its log and data are kept.
    pub async fn restart(&mut self) {
        self.container.start().await.expect("docker start");
        self.wait_until_it_answers().await;
    }
}

//! Private brokers: a tansu of the test's own, on its own port and storage
//! database, so that a test can stop and restart it without disturbing the
//! shared broker other tests use. Needs the variables `scripts/services env`
//! prints (ENTREGA_TANSU_BIN, ENTREGA_TANSU_SCHEMA, ENTREGA_BROKER_STORAGE_URL).

use std::path::Path;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use sqlx::{Connection, PgConnection};

use crate::database::TestDatabase;
use crate::process::{Service, free_port};
use crate::tls::{ServerCert, TlsProxy};

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
    /// What it tells clients to connect to; its own address unless a proxy
    /// stands in front of it.
    advertised: String,
    /// SASL required (tansu's `--authentication`).
    authentication: bool,
    /// What a client needs to reach it, beyond the bootstrap address.
    client_properties: Vec<(String, String)>,
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
        let address = format!("127.0.0.1:{}", free_port());
        let mut broker = Self {
            advertised: address.clone(),
            address,
            storage,
            process: None,
            authentication: false,
            client_properties: Vec::new(),
        };
        broker.restart().await;
        broker
    }

    /// Starts the broker again on the same port and storage (after a stop).
    pub async fn restart(&mut self) {
        assert!(self.process.is_none(), "the broker is running");
        let url = format!("tcp://{}", self.address);
        let advertised = format!("tcp://{}", self.advertised);
        let mut args = vec![
            "broker",
            "--cluster-id",
            "entrega-test",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &advertised,
        ];
        if self.authentication {
            args.push("--authentication");
        }
        self.process = Some(Service::start(
            "tansu",
            &required("ENTREGA_TANSU_BIN"),
            &args,
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
    /// From its next (re)start the broker tells clients to reach it at
    /// `address`: a proxy in front of it.
    pub fn advertise(&mut self, address: String) {
        self.advertised = address;
    }

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
        // Through the proxy, when one stands in front.
        let address = self.advertised.clone();
        let properties = self.client_properties.clone();
        let answered = tokio::task::spawn_blocking(move || {
            let mut config = crate::kafka::client_config(&address);
            for (key, value) in &properties {
                config.set(key, value);
            }
            let consumer: BaseConsumer = config.create().unwrap();
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

/// A broker as managed Kafka offers it: SASL/SCRAM-SHA-512 over TLS. tansu
/// 0.6 enforces SCRAM (`--authentication`) but its TLS listener cannot be
/// configured from its command line, so a TLS-terminating proxy stands in
/// front of it and the broker advertises the proxy. Clients bootstrap from
/// `localhost:<proxy port>`: the certificate names localhost, and
/// librdkafka verifies the name.
#[derive(Debug)]
pub struct SecureBroker {
    pub broker: PrivateBroker,
    pub proxy: TlsProxy,
    /// `localhost:<port>` of the proxy.
    pub bootstrap: String,
    pub user: String,
    pub password: String,
}

impl SecureBroker {
    /// A private broker with `topics` created, user `entrega` with a fresh
    /// password, behind a proxy presenting `cert` (signed by `ca`).
    pub async fn start(ca: &Path, cert: &ServerCert, topics: &[(&str, i32)]) -> Self {
        // The user and the topics are made while it still lets anyone in.
        let mut broker = PrivateBroker::start().await;
        for (topic, partitions) in topics {
            crate::kafka::create_topic(&broker.address, topic, *partitions).await;
        }
        let user = "entrega".to_owned();
        let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
        let created = tokio::process::Command::new(required("ENTREGA_TANSU_BIN"))
            .args([
                "user",
                "create",
                "--broker",
                &format!("tcp://{}", broker.address),
            ])
            .args([&user, &password])
            .env("STORAGE_ENGINE", broker.storage.url())
            .output()
            .await
            .unwrap();
        assert!(
            created.status.success(),
            "tansu user create: {}",
            String::from_utf8_lossy(&created.stderr)
        );
        broker.stop().await;
        let proxy = TlsProxy::bind().await;
        let bootstrap = format!("localhost:{}", proxy.address.port());
        let upstream = broker.address.parse().unwrap();
        let proxy = proxy.start(upstream, cert);
        broker.advertised = bootstrap.clone();
        broker.authentication = true;
        broker.client_properties = secure_properties(ca, &user, &password);
        broker.restart().await;
        Self {
            broker,
            proxy,
            bootstrap,
            user,
            password,
        }
    }

    /// What a client needs to reach it, trusting `ca`.
    pub fn client_properties(&self, ca: &Path) -> Vec<(String, String)> {
        secure_properties(ca, &self.user, &self.password)
    }

    /// The same as a service's environment, the password through a file.
    pub fn client_env(&self, ca: &Path, password_file: &Path) -> Vec<(&'static str, String)> {
        vec![
            ("KAFKA_SECURITY_PROTOCOL", "SASL_SSL".to_owned()),
            ("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512".to_owned()),
            ("KAFKA_SASL_USERNAME", self.user.clone()),
            (
                "KAFKA_SASL_PASSWORD_FILE",
                password_file.display().to_string(),
            ),
            ("KAFKA_SSL_CA_LOCATION", ca.display().to_string()),
        ]
    }
}

fn secure_properties(ca: &Path, user: &str, password: &str) -> Vec<(String, String)> {
    [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.username", user),
        ("sasl.password", password),
        ("ssl.ca.location", &ca.display().to_string()),
    ]
    .iter()
    .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
    .collect()
}

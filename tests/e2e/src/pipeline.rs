use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use test_support::broker::{PrivateBroker, SecureBroker};
use test_support::tls::TestCa;

use crate::containers::{BrokerContainer, PostgresContainer};
use crate::roles::LeastPrivilege;
use test_support::database::TestDatabase;
use test_support::eventually::eventually;
use test_support::kafka::create_topic;
use test_support::postgres::PrivatePostgres;
use test_support::process::{RELAY_QUICK_FLAGS, Service, free_port};

pub const TOPIC: &str = "pedido.eventos";
pub const DLT: &str = "pedido.eventos.dlt";
/// The way back: the inventory's outcomes, published from its outbox.
pub const BACK_TOPIC: &str = "estoque.eventos";
pub const BACK_DLT: &str = "estoque.eventos.dlt";
pub const PARTITIONS: i32 = 6;
/// Short, so a killed consumer's partitions move quickly.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(6);

/// Runs one of the project's binaries with `args` to its exit, which must
/// be a success (a CLI command: a migration, a redrive).
pub async fn run_to_success(name: &str, args: &[&str]) {
    let output = tokio::process::Command::new(binary(name))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        // Not the arguments: a database URL in them may carry a password.
        "{name} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The service binaries built next to this test (`cargo build --workspace`).
pub fn binary(name: &str) -> String {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/e2e-<hash> -> target/<profile>/<name>
    let path: PathBuf = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join(name))
        .expect("a target directory");
    assert!(
        path.exists(),
        "{} is missing: build the services first (cargo build --workspace --bins; scripts/test does)",
        path.display()
    );
    path.display().to_string()
}

fn server(variable: &str, default: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| default.to_owned())
}

/// Which kind of service a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Orders,
    /// The relay on the orders database (pedido.eventos).
    Relay,
    Inventory,
    /// The relay on the inventory database (estoque.eventos).
    InventoryRelay,
}

/// A running service with its HTTP address.
#[derive(Debug)]
pub struct Running {
    pub kind: Kind,
    pub service: Service,
    pub http: String,
}

impl Running {
    /// Waits until `path` (`/healthz`, `/readyz`) answers 2xx, up to a minute.
    pub async fn wait_for(&self, path: &str) {
        let url = format!("{}{path}", self.http);
        eventually(
            &format!("{url} answers"),
            Duration::from_secs(60),
            || async {
                reqwest::get(&url)
                    .await
                    .ok()
                    .filter(|r| r.status().is_success())
                    .map(|_| ())
            },
        )
        .await;
    }

    pub async fn metric(&self, prefix: &str) -> Option<f64> {
        let text = reqwest::get(format!("{}/metrics", self.http))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        Some(test_support::metrics::sum(&text, prefix))
    }

    /// Waits until this service's consumer owns partitions: before that,
    /// nothing it should consume moves (and tansu may never give it any,
    /// docs/local-services.md).
    pub async fn owns_partitions(&self, what: &str) {
        eventually(
            &format!("{what} owns partitions"),
            Duration::from_secs(60),
            || async {
                self.metric("consumer_assigned_partitions")
                    .await
                    .filter(|p| *p > 0.0)
                    .map(|_| ())
            },
        )
        .await;
    }
}

#[derive(Debug, Clone)]
pub struct PipelineOptions {
    pub relays: usize,
    pub consumers: usize,
    pub inventory_relays: usize,
    /// Stock per sku at the start.
    pub stock: Vec<(&'static str, i32)>,
    /// Put both databases on a PostgreSQL cluster of the scenario's own, so
    /// it can be stopped, crashed and restarted.
    pub own_postgres: bool,
    /// Relays keep published rows (`--retain-published`), so the invariants
    /// can read every outbox row; without it they delete them, as by
    /// default, and the invariants read the events off the topic instead.
    pub retain_published: bool,
    /// How the relays read the outboxes: in CDC mode both databases live on
    /// a server with wal_level=logical and each relay streams a slot.
    pub relay_mode: RelayMode,
    /// PostgreSQL (wal_level=logical) and the broker in containers started
    /// with testcontainers, instead of local processes.
    pub containers: bool,
    /// Environment for every service of the pipeline (an OTLP endpoint).
    pub environment: Vec<(&'static str, String)>,
    /// The broker requires SASL/SCRAM over TLS, as managed Kafka does: every
    /// service and every client of the test connects with `SASL_SSL`.
    pub secure: bool,
    /// With `own_postgres`: the cluster accepts only TLS, and every service
    /// connects with `sslmode=verify-full` against the run's CA.
    pub postgres_tls: bool,
    /// The databases owned and migrated by a role of their own, and every
    /// part logged in as a role that owns nothing ([`LeastPrivilege`]).
    pub least_privilege: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RelayMode {
    #[default]
    Poll,
    Cdc,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            relays: 1,
            consumers: 1,
            inventory_relays: 1,
            stock: vec![
                ("ABC-1", 100_000),
                ("XYZ-9", 100_000),
                ("DEF-2", 100_000),
                ("LOW-1", 30),
            ],
            own_postgres: false,
            retain_published: true,
            relay_mode: RelayMode::Poll,
            containers: false,
            environment: Vec::new(),
            secure: false,
            postgres_tls: false,
            least_privilege: false,
        }
    }
}

/// Where the services of one pipeline find their infrastructure.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub broker: String,
    pub orders_url: String,
    pub inventory_url: String,
    pub retain_published: bool,
    pub relay_mode: RelayMode,
    pub environment: Vec<(&'static str, String)>,
    /// The URLs of the parts that log in as roles of their own; `None`: all
    /// use `orders_url` and `inventory_url`.
    pub parts: Option<PartUrls>,
}

/// Where each part logs in, with least privilege.
#[derive(Debug, Clone)]
pub struct PartUrls {
    pub order_service: String,
    pub inventory_service: String,
    pub relay_orders: String,
    pub relay_inventory: String,
}

impl Endpoints {
    /// The database URL `kind` logs in with.
    fn database_url(&self, kind: Kind) -> &str {
        match (&self.parts, kind) {
            (Some(parts), Kind::Orders) => &parts.order_service,
            (Some(parts), Kind::Relay) => &parts.relay_orders,
            (Some(parts), Kind::Inventory) => &parts.inventory_service,
            (Some(parts), Kind::InventoryRelay) => &parts.relay_inventory,
            (None, Kind::Orders | Kind::Relay) => &self.orders_url,
            (None, Kind::Inventory | Kind::InventoryRelay) => &self.inventory_url,
        }
    }

    fn args(&self, kind: Kind, http: &str) -> Vec<String> {
        let list = |items: &[&str]| {
            items
                .iter()
                .map(|s| (*s).to_owned())
                .collect::<Vec<String>>()
        };
        match kind {
            Kind::Orders => list(&[
                "--database-url",
                self.database_url(kind),
                "--http-addr",
                http,
                "--bootstrap-servers",
                &self.broker,
                "--status-session-timeout",
                &format!("{}s", SESSION_TIMEOUT.as_secs()),
            ]),
            Kind::Relay | Kind::InventoryRelay => {
                let database = self.database_url(kind);
                let topic = if kind == Kind::Relay {
                    TOPIC
                } else {
                    BACK_TOPIC
                };
                let mut args = list(&[
                    "--database-url",
                    database,
                    "--topics",
                    topic,
                    "--bootstrap-servers",
                    &self.broker,
                    "--http-addr",
                    http,
                ]);
                args.extend(list(RELAY_QUICK_FLAGS));
                if self.relay_mode == RelayMode::Cdc {
                    // One slot per database, named after it (slots are
                    // per server).
                    let path = database.split('?').next().unwrap_or(database);
                    let slot = path.rsplit('/').next().unwrap_or("entrega_outbox");
                    args.extend(list(&["--mode", "cdc", "--cdc-slot", slot]));
                }
                if self.retain_published {
                    args.extend(list(&[
                        "--outbox-cleanup",
                        "retain",
                        "--retain-published",
                        "1d",
                    ]));
                }
                args
            }
            Kind::Inventory => list(&[
                "--database-url",
                self.database_url(kind),
                "--bootstrap-servers",
                &self.broker,
                "--http-addr",
                http,
                "--session-timeout",
                &format!("{}s", SESSION_TIMEOUT.as_secs()),
                "--revoke-grace",
                "5s",
            ]),
        }
    }

    /// Starts a service and waits until it answers.
    pub async fn spawn(&self, kind: Kind, envs: &[(&str, String)]) -> Running {
        self.spawn_at(kind, &format!("127.0.0.1:{}", free_port()), envs)
            .await
    }

    /// Starts a service on `http` (host:port) and waits until it answers.
    pub async fn spawn_at(&self, kind: Kind, http: &str, envs: &[(&str, String)]) -> Running {
        let name = match kind {
            Kind::Orders => "order-service",
            Kind::Relay | Kind::InventoryRelay => "outbox-relay",
            Kind::Inventory => "inventory-service",
        };
        let args = self.args(kind, http);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut envs = [self.environment.as_slice(), envs].concat();
        if kind == Kind::Inventory {
            envs.push((
                "INVENTORY_ADMIN_TOKEN",
                test_support::ADMIN_TOKEN.to_owned(),
            ));
        }
        envs.push((
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned()),
        ));
        let running = Running {
            kind,
            service: Service::start(name, &binary(name), &args, &envs),
            http: format!("http://{http}"),
        };
        running.wait_for("/healthz").await;
        running
    }
}

/// Duplicates absorbed per consumer process (by its address), the highest
/// count seen: a consumer killed later still counts what it absorbed before.
type DuplicatesSeen = Arc<Mutex<HashMap<String, f64>>>;

fn remember(seen: &DuplicatesSeen, address: &str, value: f64) {
    let mut seen = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let entry = seen.entry(address.to_owned()).or_insert(0.0);
    *entry = entry.max(value);
}

/// The broker a pipeline runs against: a tansu process of its own, or a
/// container.
#[derive(Debug)]
pub enum Broker {
    Process(PrivateBroker),
    Container(BrokerContainer),
    /// SASL/SCRAM behind TLS, with the run's CA and the password's file.
    Secure(Box<SecureSetup>),
}

/// A [`SecureBroker`] and what its clients need.
#[derive(Debug)]
pub struct SecureSetup {
    pub broker: SecureBroker,
    pub ca: TestCa,
    pub password_file: std::path::PathBuf,
}

impl SecureSetup {
    /// A broker that requires SASL_SSL; from here on every client this test
    /// process makes through `test_support::kafka` uses it.
    pub async fn start() -> Self {
        let ca = TestCa::new();
        let broker = SecureBroker::start(&ca.ca, &ca.server, &[]).await;
        test_support::kafka::secure_clients(broker.client_properties(&ca.ca));
        let password_file = ca.dir().join("kafka-password");
        std::fs::write(&password_file, format!("{}\n", broker.password)).unwrap();
        Self {
            broker,
            ca,
            password_file,
        }
    }

    /// The `KAFKA_*` variables of a service that connects to it.
    pub fn service_env(&self) -> Vec<(&'static str, String)> {
        self.broker.client_env(&self.ca.ca, &self.password_file)
    }
}

impl Broker {
    pub fn address(&self) -> &str {
        match self {
            Self::Process(broker) => &broker.address,
            Self::Container(broker) => &broker.address,
            Self::Secure(setup) => &setup.broker.bootstrap,
        }
    }

    /// A graceful stop (SIGTERM).
    pub async fn stop(&mut self) {
        match self {
            Self::Process(broker) => broker.stop().await,
            Self::Container(broker) => broker.stop().await,
            Self::Secure(setup) => setup.broker.broker.stop().await,
        }
    }

    pub async fn kill(&mut self) {
        match self {
            Self::Process(broker) => broker.kill().await,
            Self::Container(broker) => broker.kill().await,
            Self::Secure(setup) => setup.broker.broker.kill().await,
        }
    }

    /// Starts it again, with its data, and waits until it answers.
    pub async fn restart(&mut self) {
        match self {
            Self::Process(broker) => broker.restart().await,
            Self::Container(broker) => broker.restart().await,
            Self::Secure(setup) => setup.broker.broker.restart().await,
        }
    }
}

/// One scenario's whole system.
pub struct Pipeline {
    pub broker: Broker,
    /// The scenario's own cluster, when it has one.
    pub postgres: Option<PrivatePostgres>,
    /// The PostgreSQL container, with `containers`.
    pub postgres_container: Option<PostgresContainer>,
    pub endpoints: Endpoints,
    _orders_db: TestDatabase,
    pub orders: PgPool,
    _inventory_db: TestDatabase,
    pub inventory: PgPool,
    /// The roles of a least-privilege pipeline; after the databases, so
    /// that they are dropped after them.
    pub least_privilege: Option<LeastPrivilege>,
    pub order_service: Running,
    pub relays: Vec<Running>,
    pub consumers: Vec<Running>,
    pub inventory_relays: Vec<Running>,
    pub initial_stock: HashMap<String, i32>,
    /// Faults injected so far.
    pub faults: u32,
    duplicates_seen: DuplicatesSeen,
    watched: Arc<Mutex<Vec<String>>>,
    watcher: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    pub async fn start(options: PipelineOptions) -> Self {
        let (broker, postgres_container) = if options.containers {
            let (broker, postgres) =
                tokio::join!(BrokerContainer::start(), PostgresContainer::start());
            (Broker::Container(broker), Some(postgres))
        } else if options.secure {
            (Broker::Secure(Box::new(SecureSetup::start().await)), None)
        } else {
            (Broker::Process(PrivateBroker::start().await), None)
        };
        let mut options = options;
        if let Broker::Secure(setup) = &broker {
            options.environment.extend(setup.service_env());
        }
        for topic in [TOPIC, DLT, BACK_TOPIC, BACK_DLT] {
            create_topic(broker.address(), topic, PARTITIONS).await;
        }
        let postgres = if options.own_postgres && options.postgres_tls {
            Some(PrivatePostgres::start_with_tls(TestCa::new()).await)
        } else if options.own_postgres {
            Some(PrivatePostgres::start().await)
        } else {
            None
        };
        let (orders_server, inventory_server) = match (&postgres, &postgres_container) {
            (Some(cluster), _) => (cluster.url("postgres"), cluster.url("postgres")),
            (None, Some(container)) => (container.url("postgres"), container.url("postgres")),
            (None, None) if options.relay_mode == RelayMode::Cdc => {
                // No default: scripts/services' server wants its password.
                let logical = std::env::var("ENTREGA_CDC_POSTGRES_URL").expect(
                    "ENTREGA_CDC_POSTGRES_URL is not set: run the tests through scripts/test",
                );
                (logical.clone(), logical)
            }
            (None, None) => (
                server(
                    "ORDER_DATABASE_URL",
                    "postgres://postgres@127.0.0.1:5432/orders",
                ),
                server(
                    "INVENTORY_DATABASE_URL",
                    "postgres://postgres@127.0.0.1:5432/inventory",
                ),
            ),
        };
        let orders_db = TestDatabase::create(&orders_server, "e2e_orders").await;
        let inventory_db = TestDatabase::create(&inventory_server, "e2e_inventory").await;
        let mut environment = options.environment;
        let least_privilege = if options.least_privilege {
            let roles = LeastPrivilege::set_up(
                &orders_db,
                &inventory_db,
                options.relay_mode == RelayMode::Cdc,
            )
            .await;
            environment.extend([
                ("ORDER_NO_MIGRATE", "true".to_owned()),
                ("INVENTORY_NO_MIGRATE", "true".to_owned()),
            ]);
            Some(roles)
        } else {
            None
        };
        let endpoints = Endpoints {
            broker: broker.address().to_owned(),
            orders_url: orders_db.url(),
            inventory_url: inventory_db.url(),
            retain_published: options.retain_published,
            relay_mode: options.relay_mode,
            environment,
            parts: least_privilege.as_ref().map(|roles| PartUrls {
                order_service: roles.order_service.url(&orders_db.url()),
                inventory_service: roles.inventory_service.url(&inventory_db.url()),
                relay_orders: roles.relay.url(&orders_db.url()),
                relay_inventory: roles.relay.url(&inventory_db.url()),
            }),
        };
        let order_service = endpoints.spawn(Kind::Orders, &[]).await;
        let connect = |db: &TestDatabase| {
            let options = db.options.clone();
            async move {
                PgPoolOptions::new()
                    .max_connections(4)
                    .connect_with(options)
                    .await
                    .unwrap()
            }
        };
        let orders = connect(&orders_db).await;
        let duplicates_seen: DuplicatesSeen = Arc::new(Mutex::new(HashMap::new()));
        let watched = Arc::new(Mutex::new(Vec::new()));
        let watcher = tokio::spawn(watch_duplicates(
            Arc::clone(&watched),
            Arc::clone(&duplicates_seen),
        ));
        let mut pipeline = Self {
            broker,
            postgres,
            postgres_container,
            endpoints,
            _orders_db: orders_db,
            orders,
            inventory: connect(&inventory_db).await,
            _inventory_db: inventory_db,
            least_privilege,
            order_service,
            relays: Vec::new(),
            consumers: Vec::new(),
            inventory_relays: Vec::new(),
            initial_stock: HashMap::new(),
            faults: 0,
            duplicates_seen,
            watched,
            watcher,
        };
        for _ in 0..options.relays {
            pipeline.start_relay().await;
        }
        for _ in 0..options.consumers {
            pipeline.start_consumer().await;
        }
        // After an inventory service: it creates the outbox table.
        for _ in 0..options.inventory_relays {
            pipeline.start_inventory_relay().await;
        }
        for (sku, available) in options.stock {
            pipeline.set_stock(sku, available).await;
        }
        pipeline
    }

    /// Redrives the inventory's dead letters of `reason` with its CLI
    /// (`inventory-service dlt redrive`), which must succeed.
    pub async fn redrive(&self, reason: &str) {
        run_to_success(
            "inventory-service",
            &[
                "--database-url",
                &self.endpoints.inventory_url,
                "--bootstrap-servers",
                self.broker.address(),
                "dlt",
                "redrive",
                "--reason",
                reason,
                "--rate",
                "100",
            ],
        )
        .await;
    }

    pub async fn start_consumer(&mut self) {
        self.start_consumer_with(&[]).await;
    }

    pub async fn start_consumer_with(&mut self, envs: &[(&str, String)]) {
        let consumer = self.endpoints.spawn(Kind::Inventory, envs).await;
        consumer.owns_partitions("the consumer").await;
        self.watched.lock().unwrap().push(consumer.http.clone());
        self.consumers.push(consumer);
    }

    pub async fn start_relay(&mut self) {
        let relay = self.endpoints.spawn(Kind::Relay, &[]).await;
        self.relays.push(relay);
    }

    pub async fn start_inventory_relay(&mut self) {
        let relay = self.endpoints.spawn(Kind::InventoryRelay, &[]).await;
        self.inventory_relays.push(relay);
    }

    /// SIGKILL one process, counted as a fault.
    pub async fn kill(&mut self, kind: Kind, index: usize) {
        let running = match kind {
            Kind::Relay => self.relays.remove(index),
            Kind::Inventory => self.consumers.remove(index),
            Kind::InventoryRelay => self.inventory_relays.remove(index),
            Kind::Orders => panic!("the order service is not a fault target"),
        };
        if kind == Kind::Inventory
            && let Some(value) = running.metric("consumer_duplicates_total").await
        {
            remember(&self.duplicates_seen, &running.http, value);
        }
        running.service.kill().await;
        self.faults += 1;
    }

    /// SIGKILL the order service and start it again on the same address,
    /// so clients retrying their requests find it: counted as a fault.
    /// Clients see it down for a little longer than the session timeout.
    pub async fn restart_order_service(&mut self) {
        let address = self
            .order_service
            .http
            .trim_start_matches("http://")
            .to_owned();
        self.order_service.service.signal(Signal::SIGKILL);
        self.faults += 1;
        // The dead process's socket closes with it; then the port is free.
        eventually(
            "the killed order service stops answering",
            Duration::from_secs(10),
            || async {
                tokio::net::TcpStream::connect(&address)
                    .await
                    .is_err()
                    .then_some(())
            },
        )
        .await;
        // tansu gives a member restarted within its session timeout no
        // partitions (docs/local-services.md): the order service's status
        // consumer is the group's only member, so the restart waits it out,
        // and the restarted service must really own partitions again.
        tokio::time::sleep(SESSION_TIMEOUT + Duration::from_secs(1)).await;
        let fresh = self.endpoints.spawn_at(Kind::Orders, &address, &[]).await;
        fresh
            .owns_partitions("the restarted order service's status consumer")
            .await;
        std::mem::replace(&mut self.order_service, fresh)
            .service
            .kill()
            .await;
    }

    /// The broker stopped gracefully, started again, killed and started
    /// again, a few seconds apart: two faults, while a load runs.
    pub async fn stop_then_kill_the_broker(&mut self) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.broker.stop().await;
        self.faults += 1;
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.broker.restart().await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.broker.kill().await;
        self.faults += 1;
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.broker.restart().await;
    }

    /// Sends a signal; every signal but SIGCONT counts as a fault.
    pub fn signal(&mut self, kind: Kind, index: usize, signal: Signal) {
        let running = match kind {
            Kind::Relay => &self.relays[index],
            Kind::Inventory => &self.consumers[index],
            Kind::InventoryRelay => &self.inventory_relays[index],
            Kind::Orders => &self.order_service,
        };
        running.service.signal(signal);
        if signal != Signal::SIGCONT {
            self.faults += 1;
        }
    }

    pub async fn set_stock(&mut self, sku: &str, available: i32) {
        let url = format!("{}/stock/{sku}", self.consumers[0].http);
        let reply = reqwest::Client::new()
            .put(url)
            .bearer_auth(test_support::ADMIN_TOKEN)
            .json(&serde_json::json!({"available": available}))
            .send()
            .await
            .unwrap();
        assert!(
            reply.status().is_success(),
            "setting stock of {sku}: {}",
            reply.status()
        );
        self.initial_stock.insert(sku.to_owned(), available);
    }

    /// Duplicates absorbed by all consumer processes so far.
    pub async fn consumer_duplicates(&self) -> f64 {
        for consumer in &self.consumers {
            if let Some(value) = consumer.metric("consumer_duplicates_total").await {
                remember(&self.duplicates_seen, &consumer.http, value);
            }
        }
        self.duplicates_seen.lock().unwrap().values().sum()
    }

    /// Stops every service gracefully (SIGTERM), checking each exits 0.
    pub async fn stop(self) {
        self.watcher.abort();
        let grace = Duration::from_secs(60);
        for running in self
            .consumers
            .into_iter()
            .chain(self.relays)
            .chain(self.inventory_relays)
        {
            assert_eq!(
                running.service.terminate(grace).await,
                Some(0),
                "{:?} did not stop cleanly",
                running.kind
            );
        }
        assert_eq!(self.order_service.service.terminate(grace).await, Some(0));
    }
}

async fn watch_duplicates(watched: Arc<Mutex<Vec<String>>>, seen: DuplicatesSeen) {
    let client = reqwest::Client::new();
    loop {
        let addresses = watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for address in addresses {
            let Ok(reply) = client.get(format!("{address}/metrics")).send().await else {
                continue;
            };
            let Ok(text) = reply.text().await else {
                continue;
            };
            let value: f64 = text
                .lines()
                .filter(|l| l.starts_with("consumer_duplicates_total"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            remember(&seen, &address, value);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

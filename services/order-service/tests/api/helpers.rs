use std::sync::Once;

use order_service::{Application, Config};
use reqwest::header::{CONTENT_TYPE, HeaderMap};
use serde_json::Value;
use service_support::telemetry;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, Executor, PgConnection, PgPool};
use tokio::sync::oneshot;

pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

pub(crate) fn server_url() -> String {
    std::env::var("ORDER_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/orders".to_owned())
}

fn init_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            // Tracing stays off: no OTLP endpoint in the tests' environment.
            std::mem::forget(telemetry::init(
                service_support::config::LogFormat::Text,
                "info,sqlx=warn",
                "order-service",
            ));
        }
    });
}

/// A running order service on its own database, stopped and dropped with it.
#[derive(Debug)]
pub(crate) struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub pool: PgPool,
    database: String,
    maintenance: PgConnectOptions,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<Result<(), order_service::RunError>>>,
}

impl TestApp {
    /// The URL of this test's database.
    pub(crate) fn database_url(&self) -> String {
        self.maintenance
            .clone()
            .database(&self.database)
            .to_url_lossy()
            .to_string()
    }
}

/// What a request got back, read in full.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Value,
}

impl Reply {
    pub(crate) fn content_type(&self) -> &str {
        self.headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts a problem document of this status and type; returns its
    /// field pointers.
    pub(crate) fn assert_problem(&self, status: u16, problem_type: &str) -> Vec<String> {
        assert_eq!(self.status, status, "body: {}", self.body);
        assert_eq!(self.content_type(), PROBLEM_JSON);
        assert_eq!(self.body["type"], problem_type, "body: {}", self.body);
        assert_eq!(self.body["status"], status);
        assert!(self.body["title"].is_string() && self.body["detail"].is_string());
        self.body["errors"]
            .as_array()
            .map(|errors| {
                errors
                    .iter()
                    .map(|e| e["pointer"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The API alone: the status consumer has its own tests.
pub(crate) async fn spawn_app() -> TestApp {
    spawn_app_with(&["--no-status-consumer"]).await
}

/// The service with extra command-line arguments.
pub(crate) async fn spawn_app_with(extra: &[&str]) -> TestApp {
    init_logs();
    let maintenance: PgConnectOptions = server_url()
        .parse::<PgConnectOptions>()
        .unwrap()
        .database("postgres");
    let database = format!("orders_test_{}", uuid::Uuid::new_v4().simple());
    let mut admin = PgConnection::connect_with(&maintenance)
        .await
        .expect("PostgreSQL is reachable");
    admin
        .execute(format!(r#"create database "{database}""#).as_str())
        .await
        .unwrap();
    admin.close().await.unwrap();

    let url = maintenance
        .clone()
        .database(&database)
        .to_url_lossy()
        .to_string();
    let config = test_config(&url, extra);
    let application = Application::build(config)
        .await
        .expect("the service starts");
    let address = format!("http://{}", application.local_addr());
    let (shutdown, stopped) = oneshot::channel();
    let server = tokio::spawn(application.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(maintenance.clone().database(&database))
        .await
        .unwrap();
    TestApp {
        address,
        client: reqwest::Client::new(),
        pool,
        database,
        maintenance,
        shutdown: Some(shutdown),
        server: Some(server),
    }
}

fn test_config(url: &str, extra: &[&str]) -> Config {
    use clap::Parser;
    let mut args = vec![
        "order-service",
        "--database-url",
        url,
        "--http-addr",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    Config::try_parse_from(args).expect("test configuration is valid")
}

impl TestApp {
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    async fn read(response: reqwest::Response) -> Reply {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.unwrap();
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Reply {
            status,
            headers,
            body,
        }
    }

    /// POSTs a JSON body to /orders with extra headers.
    pub(crate) async fn post_order_with(&self, body: &Value, headers: &[(&str, &str)]) -> Reply {
        let mut request = self.client.post(self.url("/orders")).json(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        Self::read(request.send().await.unwrap()).await
    }

    pub(crate) async fn post_order(&self, body: &Value) -> Reply {
        self.post_order_with(body, &[]).await
    }

    /// POSTs raw bytes with the given content type (None: no header).
    pub(crate) async fn post_raw(
        &self,
        body: impl Into<reqwest::Body>,
        content_type: Option<&str>,
    ) -> Reply {
        let mut request = self.client.post(self.url("/orders")).body(body);
        if let Some(content_type) = content_type {
            request = request.header(CONTENT_TYPE, content_type);
        }
        Self::read(request.send().await.unwrap()).await
    }

    pub(crate) async fn get(&self, path: &str) -> Reply {
        Self::read(self.client.get(self.url(path)).send().await.unwrap()).await
    }

    /// Rows in a table of the test database.
    pub(crate) async fn count(&self, table: &str) -> i64 {
        sqlx::query_scalar(&format!("select count(*) from {table}"))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// Asserts that nothing at all was written.
    pub(crate) async fn assert_nothing_written(&self) {
        for table in ["orders", "order_items", "outbox", "idempotency_keys"] {
            assert_eq!(self.count(table).await, 0, "{table} has rows");
        }
    }

    /// Drops the test database under the running service.
    pub(crate) async fn drop_database(&self) {
        drop_database(&self.maintenance, &self.database).await;
    }

    /// Stops the service as SIGTERM would, and waits until it has.
    pub(crate) async fn stop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.unwrap().expect("the service stops cleanly");
        }
    }
}

async fn drop_database(maintenance: &PgConnectOptions, database: &str) {
    let mut admin = PgConnection::connect_with(maintenance).await.unwrap();
    admin
        .execute(format!(r#"drop database if exists "{database}" with (force)"#).as_str())
        .await
        .unwrap();
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        let maintenance = self.maintenance.clone();
        let database = self.database.clone();
        // Drop cannot await; a short-lived runtime on its own thread can.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(drop_database(&maintenance, &database));
        })
        .join();
    }
}

/// A valid order body.
pub(crate) fn order_body(customer: &str, items: &[(&str, i64)]) -> Value {
    serde_json::json!({
        "customerId": customer,
        "items": items.iter().map(|(sku, quantity)| serde_json::json!({"sku": sku, "quantity": quantity})).collect::<Vec<_>>(),
    })
}

/// Runs the order service binary to its exit (no status consumer, any free
/// port); one that serves instead is killed after a minute, failing the test.
pub(crate) async fn run_to_exit(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_order-service"))
        .args(args)
        .envs(envs.iter().copied())
        .env("RUST_LOG", "warn")
        .env("ORDER_HTTP_ADDR", "127.0.0.1:0")
        .env("ORDER_NO_STATUS_CONSUMER", "true")
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(std::time::Duration::from_secs(60), run)
        .await
        .expect("it exits instead of serving")
        .unwrap()
}

/// What a run printed, stdout and stderr.
pub(crate) fn printed(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

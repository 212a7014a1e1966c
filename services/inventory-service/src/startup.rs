//! Building and running the service: database, topic checks, consumer, HTTP.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use rdkafka::ClientConfig;
use service_support::kafka::PassthroughError;
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::{Common, ServeArgs};
use crate::http::{self, AppState};
use crate::reserving::Reserving;
use crate::retention::{self, RetentionError};
use idempotent_consumer::{Circuit, ConsumerOptions, Database, Health, ServeError};

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot connect to the inventory database at {url}")]
    Database {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot apply the inventory database migrations")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Passthrough(#[from] PassthroughError),
    #[error(transparent)]
    Consumer(#[from] ServeError),
    #[error("the processed-table retention is not safe")]
    Retention(#[from] RetentionError),
}

/// The database pool every command uses: SQL statements time out (a
/// transient failure) instead of hanging a partition.
pub async fn connect(
    common: &Common,
    max_connections: u32,
    statement_timeout: Duration,
) -> Result<PgPool, StartupError> {
    let options = common.database_url.options.clone().options([(
        "statement_timeout",
        format!("{}", statement_timeout.as_millis()),
    )]);
    PgPoolOptions::new()
        // No ping before each use: it costs a round trip per transaction,
        // and a dead connection fails its statement anyway, which the
        // consumer retries as a transient failure.
        .test_before_acquire(false)
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|source| StartupError::Database {
            url: common.database_url.to_string(),
            source,
        })
}

/// The Kafka client settings every command starts from; refused when a
/// `KAFKA_*` variable is not a valid, unprotected librdkafka property.
pub fn kafka_config(
    common: &Common,
    settings: &[(&str, String)],
) -> Result<ClientConfig, PassthroughError> {
    let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
    service_support::kafka::client_config(&common.bootstrap_servers, &settings)
}

/// The inventory database's migrations, then the outbox table's and the
/// consumer library's.
pub fn migrations() -> [Migrator; 3] {
    let [own, outbox] = outbox::with_outbox(sqlx::migrate!("../../migrations/inventory"));
    [own, outbox, idempotent_consumer::migrator()]
}

#[derive(Debug)]
pub struct Application {
    common: Common,
    serve: ServeArgs,
    pool: PgPool,
    listener: TcpListener,
}

impl Application {
    pub async fn build(common: Common, serve: ServeArgs) -> Result<Self, StartupError> {
        let pool = connect(&common, serve.db_pool_size, serve.statement_timeout).await?;
        if !serve.no_migrate {
            outbox::migrate(&pool, &migrations()).await?;
        }
        let listener =
            TcpListener::bind(serve.http_addr)
                .await
                .map_err(|source| StartupError::Bind {
                    addr: serve.http_addr,
                    source,
                })?;
        Ok(Self {
            common,
            serve,
            pool,
            listener,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound TCP listener has a local address")
    }

    /// Serves until `shutdown`; then stops fetching, finishes the records in
    /// progress, commits their offsets and leaves the group.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartupError> {
        let token = CancellationToken::new();
        let trigger = token.clone();
        tokio::spawn(async move {
            shutdown.await;
            trigger.cancel();
        });

        let circuit = Circuit::new(
            self.serve.circuit_window as usize,
            self.serve.circuit_max_dlt_share,
            self.serve.circuit_min_records as usize,
        );
        // The recorder first: the consumer's parts set their gauges as they
        // are made.
        let metrics = http::metrics_recorder();
        let health = Health::new(circuit, Database::new(self.pool.clone()));
        let state = AppState {
            pool: self.pool.clone(),
            metrics,
            health: health.clone(),
        };
        tracing::info!(addr = %self.local_addr(), "inventory API listening");
        let Self {
            common,
            serve,
            pool,
            listener,
        } = self;
        let http_token = token.clone();
        let router = http::router(state, serve.request_timeout);
        let http = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { http_token.cancelled().await })
                .await
        });

        let result = consume(&common, &serve, &pool, health, &token).await;
        token.cancel();
        let _ = http.await;
        pool.close().await;
        result
    }
}

/// What the consumer is told; the library does the rest.
pub fn consumer_options(common: &Common, serve: &ServeArgs) -> ConsumerOptions {
    ConsumerOptions {
        bootstrap_servers: common.bootstrap_servers.clone(),
        topic: common.topic.clone(),
        dlt_topic: common.dlt_topic.clone(),
        group: common.group.clone(),
        batch_size: serve.batch_size as usize,
        retries: serve.retries,
        retry_backoff: serve.retry_backoff,
        session_timeout: serve.session_timeout,
        revoke_grace: serve.revoke_grace,
    }
}

async fn consume(
    common: &Common,
    serve: &ServeArgs,
    pool: &PgPool,
    health: Health,
    token: &CancellationToken,
) -> Result<(), StartupError> {
    let options = consumer_options(common, serve);
    // Retention needs the topic's settings: wait for the broker first.
    if !idempotent_consumer::wait_for_topics(&options, token).await? {
        return Ok(());
    }
    let base = kafka_config(common, &[])?;
    if serve.retention_every.is_some() {
        retention::check(&base, &common.topic, &serve.retention).await?;
    }
    let retention_task = serve.retention_every.map(|every| {
        tokio::spawn(run_retention(
            pool.clone(),
            every,
            serve.retention.retention,
            token.clone(),
        ))
    });
    idempotent_consumer::serve(Reserving, &options, health, token.clone()).await?;
    if let Some(task) = retention_task {
        let _ = task.await;
    }
    Ok(())
}

async fn run_retention(
    pool: PgPool,
    every: Duration,
    retention: Duration,
    token: CancellationToken,
) {
    let mut interval = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = token.cancelled() => return,
        }
        match retention::run_once(&pool, retention).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "processed-table retention"),
            Err(error) => {
                tracing::warn!(error.message = %error, "processed-table retention failed")
            }
        }
    }
}

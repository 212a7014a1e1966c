//! Building and running the service: database, topic checks, consumer, HTTP.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use http_api::AdminToken;
use rdkafka::ClientConfig;
use service_support::kafka::PassthroughError;
use service_support::secret::SecretError;
use service_support::serving::{self, BindError};
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;

use crate::config::{Common, ConsumerArgs, ServeArgs};
use crate::http::{self, AppState};
use crate::reserving::Reserving;
use idempotent_consumer::{Database, Health, ServeError};

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
    #[error("the inventory database is not current")]
    NotCurrent(#[from] outbox::NotCurrent),
    #[error(
        "cannot grant the roles their privileges on the inventory database: do the roles of \
         migrations/roles.sql exist (an administrator makes them once per cluster)?"
    )]
    Grant(#[source] sqlx::Error),
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Passthrough(#[from] PassthroughError),
    #[error(transparent)]
    Consumer(#[from] ServeError),
    #[error(transparent)]
    Secret(#[from] SecretError),
}

/// `<service> migrate`: the migrations, then (with `grants`) the grants of
/// migrations/grants/ to the roles of migrations/roles.sql. As the
/// database's owner.
pub async fn migrate(pool: &PgPool, grants: bool) -> Result<(), StartupError> {
    outbox::migrate(pool, &migrations()).await?;
    if grants {
        let own = include_str!("../../../migrations/grants/inventory.sql");
        outbox::grant(pool, "entrega_inventory_service", own)
            .await
            .map_err(StartupError::Grant)?;
    }
    Ok(())
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
pub fn kafka_config(consumer: &ConsumerArgs) -> Result<ClientConfig, PassthroughError> {
    consumer.options().kafka_config(&[])
}

/// The inventory database's migrations, then the outbox table's and the
/// consumer library's.
pub fn migrations() -> [Migrator; 3] {
    let [own, outbox] = outbox::with_outbox(sqlx::migrate!("../../migrations/inventory"));
    [own, outbox, idempotent_consumer::migrator()]
}

#[derive(Debug)]
pub struct Application {
    consumer: ConsumerArgs,
    serve: ServeArgs,
    pool: PgPool,
    listener: TcpListener,
    admin: AdminToken,
}

impl Application {
    pub async fn build(
        common: &Common,
        consumer: ConsumerArgs,
        serve: ServeArgs,
    ) -> Result<Self, StartupError> {
        let admin = AdminToken::new(serve.admin_token()?.as_ref(), "INVENTORY_ADMIN_TOKEN");
        let pool = connect(common, serve.db_pool_size, serve.statement_timeout).await?;
        if serve.no_migrate {
            outbox::require_current(
                &pool,
                &migrations(),
                "inventory-service migrate",
                "INVENTORY_NO_MIGRATE",
            )
            .await?;
        } else {
            outbox::migrate(&pool, &migrations()).await?;
        }
        let listener = serving::bind(serve.http_addr).await?;
        Ok(Self {
            consumer,
            serve,
            pool,
            listener,
            admin,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        serving::local_addr(&self.listener)
    }

    /// Serves until `shutdown`; then stops fetching, finishes the records in
    /// progress, commits their offsets and leaves the group.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartupError> {
        let token = serving::cancelled_by(shutdown);

        let circuit = self.consumer.circuit();
        // The recorder first: the consumer's parts set their gauges as they
        // are made.
        let metrics = http::metrics_recorder();
        let health = Health::new(circuit, Database::new(self.pool.clone()));
        let state = AppState {
            pool: self.pool.clone(),
            metrics,
            health: health.clone(),
            admin: self.admin.clone(),
        };
        tracing::info!(addr = %self.local_addr(), "inventory API listening");
        let Self {
            consumer,
            serve,
            pool,
            listener,
            admin: _,
        } = self;
        let http_token = token.clone();
        let router = http::router(state, serve.request_timeout);
        let http = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { http_token.cancelled().await })
                .await
        });

        let options = consumer.options();
        let result = idempotent_consumer::serve(Reserving, &options, health, token.clone())
            .await
            .map_err(StartupError::from);
        token.cancel();
        let _ = http.await;
        pool.close().await;
        result
    }
}

//! Building and running the application: database, migrations, listener.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use idempotent_consumer::{ConsumerOptions, Database, Health, ServeError};
use service_support::retry;
use service_support::serving::{self, BindError};
use sqlx::PgPool;
use sqlx::migrate::Migrator;
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::http::{self, AppState};
use crate::idempotency;
use crate::status::consumer::StatusUpdates;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("cannot connect to the orders database at {url}")]
    Database {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot apply the orders database migrations")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("the orders database is not current")]
    NotCurrent(#[from] outbox::NotCurrent),
    #[error(
        "cannot grant the roles their privileges on the orders database: do the roles of \
         migrations/roles.sql exist (an administrator makes them once per cluster)?"
    )]
    Grant(#[source] sqlx::Error),
    #[error(transparent)]
    Bind(#[from] BindError),
}

/// Why the service stopped other than by being asked to.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("serving HTTP failed")]
    Http(#[from] std::io::Error),
    #[error("the pedido.status consumer failed")]
    Consumer(#[from] ServeError),
}

/// The orders database's migrations, then the outbox table's and the
/// consumer library's.
pub fn migrations() -> [Migrator; 3] {
    let [own, outbox] = outbox::with_outbox(sqlx::migrate!("../../migrations/orders"));
    [own, outbox, idempotent_consumer::migrator()]
}

/// How often expired idempotency keys are purged.
const PURGE_INTERVAL: Duration = Duration::from_secs(600);
const PURGE_BATCH: i64 = 1_000;

/// `<service> migrate`: the migrations, then (with `grants`) the grants of
/// migrations/grants/ to the roles of migrations/roles.sql. As the
/// database's owner.
pub async fn migrate(pool: &PgPool, grants: bool) -> Result<(), StartupError> {
    outbox::migrate(pool, &migrations()).await?;
    if grants {
        let own = include_str!("../../../migrations/grants/orders.sql");
        outbox::grant(pool, "entrega_order_service", own)
            .await
            .map_err(StartupError::Grant)?;
    }
    Ok(())
}

/// The database pool every command uses: SQL statements time out (a lock
/// held elsewhere fails the statement instead of hanging it).
pub async fn connect(config: &Config) -> Result<PgPool, StartupError> {
    PgPoolOptions::new()
        // No ping before each use: it costs a round trip per transaction,
        // and a dead connection fails its statement anyway (an error for
        // the request, a transient failure retried for the consumer).
        .test_before_acquire(false)
        .max_connections(config.db_pool_size)
        // A request waits at most its own time limit for a connection.
        .acquire_timeout(config.request_timeout)
        .connect_with(config.database_url.options.clone().options([(
            "statement_timeout",
            config.statement_timeout.as_millis().to_string(),
        )]))
        .await
        .map_err(|source| StartupError::Database {
            url: config.database_url.to_string(),
            source,
        })
}

#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    pool: PgPool,
    idempotency_key_ttl: Duration,
    /// The status consumer's options and health, unless it is off.
    status_consumer: Option<(ConsumerOptions, Health)>,
}

impl Application {
    /// Connects, migrates (unless told not to) and binds; nothing is served
    /// until [`Application::run_until_stopped`].
    pub async fn build(config: Config) -> Result<Self, StartupError> {
        let pool = connect(&config).await?;
        if config.no_migrate {
            outbox::require_current(
                &pool,
                &migrations(),
                "order-service migrate",
                "ORDER_NO_MIGRATE",
            )
            .await?;
        } else {
            outbox::migrate(&pool, &migrations()).await?;
        }
        let listener = serving::bind(config.http_addr).await?;
        // The recorder first: the consumer's parts set their gauges as they
        // are made.
        let metrics = http::metrics_recorder();
        let status_consumer = (!config.no_status_consumer).then(|| {
            let circuit = config.status.circuit();
            let health = Health::new(circuit, Database::new(pool.clone()));
            (config.status.options(), health)
        });
        let state = AppState {
            pool: pool.clone(),
            metrics,
            consumer_health: status_consumer.as_ref().map(|(_, health)| health.clone()),
            outbox_cleanup: if config.outbox_delete_in_transaction {
                outbox::Cleanup::InTransaction
            } else {
                outbox::Cleanup::Relay
            },
        };
        Ok(Self {
            listener,
            router: http::router(state, config.request_timeout),
            pool,
            idempotency_key_ttl: config.idempotency_key_ttl,
            status_consumer,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        serving::local_addr(&self.listener)
    }

    /// Serves and consumes until `shutdown` completes (or the consumer
    /// fails), then stops taking connections, lets in-flight requests and
    /// the consumer's batch in flight finish, commits what was consumed,
    /// and closes the pool.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), RunError> {
        let token = serving::cancelled_by(shutdown);
        let purge = tokio::spawn(purge_idempotency_keys(
            self.pool.clone(),
            self.idempotency_key_ttl,
            token.clone(),
        ));
        tracing::info!(addr = %self.local_addr(), "order service listening");
        let http_token = token.clone();
        let (listener, router) = (self.listener, self.router);
        let http = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { http_token.cancelled().await })
                .await
        });
        let consumed = match self.status_consumer {
            Some((options, health)) => {
                let consumed =
                    idempotent_consumer::serve(StatusUpdates, &options, health, token.clone())
                        .await;
                // A consumer that stops for any reason stops the service.
                token.cancel();
                consumed
            }
            None => Ok(()),
        };
        let served = http
            .await
            .unwrap_or_else(|join| Err(std::io::Error::other(join)));
        // Ends at its next tick; a batch in flight finishes first.
        token.cancel();
        let _ = purge.await;
        self.pool.close().await;
        tracing::info!("order service stopped");
        consumed?;
        Ok(served?)
    }
}

async fn purge_idempotency_keys(pool: PgPool, ttl: Duration, token: CancellationToken) {
    let Ok(ttl) = time::Duration::try_from(ttl) else {
        return;
    };
    let mut interval = tokio::time::interval(PURGE_INTERVAL);
    while retry::tick(&mut interval, &token).await {
        match idempotency::purge_expired(&pool, ttl, PURGE_BATCH).await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "purged expired idempotency keys"),
            Err(error) => {
                tracing::warn!(error.cause_chain = ?error, error.message = %error, "purging idempotency keys failed")
            }
        }
    }
}

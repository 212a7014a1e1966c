//! Building and running the application: database, migrations, listener.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;

use crate::config::Config;
use crate::http::{self, AppState};
use crate::idempotency;

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
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// How often expired idempotency keys are purged.
const PURGE_INTERVAL: Duration = Duration::from_secs(600);
const PURGE_BATCH: i64 = 1_000;

#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    router: axum::Router,
    pool: PgPool,
    idempotency_key_ttl: Duration,
}

impl Application {
    /// Connects, migrates (unless told not to) and binds; nothing is served
    /// until [`Application::run_until_stopped`].
    pub async fn build(config: Config) -> Result<Self, StartupError> {
        let pool = PgPoolOptions::new()
            // No ping before each use: it costs a round trip per transaction,
            // and a dead connection fails its statement anyway (an error for
            // the request, a transient failure retried for the consumer).
            .test_before_acquire(false)
            .max_connections(config.db_pool_size)
            // A request waits at most its own time limit for a connection.
            .acquire_timeout(config.request_timeout)
            .connect_with(config.database_url.options.clone())
            .await
            .map_err(|source| StartupError::Database {
                url: config.database_url.to_string(),
                source,
            })?;
        if !config.no_migrate {
            sqlx::migrate!("../../migrations/orders").run(&pool).await?;
        }
        let listener = TcpListener::bind(config.http_addr)
            .await
            .map_err(|source| StartupError::Bind {
                addr: config.http_addr,
                source,
            })?;
        let state = AppState {
            pool: pool.clone(),
            metrics: http::metrics_recorder(),
        };
        Ok(Self {
            listener,
            router: http::router(state, config.request_timeout),
            pool,
            idempotency_key_ttl: config.idempotency_key_ttl,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound TCP listener has a local address")
    }

    /// Serves until `shutdown` completes, then stops taking connections,
    /// lets in-flight requests finish, and closes the pool.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let purge = tokio::spawn(purge_idempotency_keys(
            self.pool.clone(),
            self.idempotency_key_ttl,
        ));
        tracing::info!(addr = %self.local_addr(), "order service listening");
        let served = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await;
        purge.abort();
        self.pool.close().await;
        tracing::info!("order service stopped");
        served
    }
}

async fn purge_idempotency_keys(pool: PgPool, ttl: Duration) {
    let Ok(ttl) = time::Duration::try_from(ttl) else {
        return;
    };
    let mut interval = tokio::time::interval(PURGE_INTERVAL);
    loop {
        interval.tick().await;
        match idempotency::purge_expired(&pool, ttl, PURGE_BATCH).await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "purged expired idempotency keys"),
            Err(error) => {
                tracing::warn!(error.cause_chain = ?error, error.message = %error, "purging idempotency keys failed")
            }
        }
    }
}

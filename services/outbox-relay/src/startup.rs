//! Building and running the relay: database, topics check, HTTP, the loop.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::ClientConfig;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::http::{self, HttpState};
use crate::leadership::Election;
use crate::publisher::{self, Publisher};
use crate::relay::{self, Backoff, RelaySettings, RelayStatus};
use crate::store::{self, AfterPublish};
use crate::topics::{self, TopicError};

/// How often the backlog gauges are refreshed.
const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);
/// How often retained rows are purged, and how many per statement.
const PURGE_INTERVAL: Duration = Duration::from_secs(600);
const PURGE_BATCH: i64 = 5_000;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot connect to the database at {url}")]
    Database {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    /// The relay creates no table: the service that writes the outbox owns
    /// it (it applies migrations/outbox at start-up, after its own set).
    #[error(
        "{url} has no outbox table with the columns the relay needs: start the service that \
         writes it first (it applies migrations/outbox), or apply them by hand"
    )]
    NoOutbox {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid Kafka producer configuration")]
    Producer(#[from] publisher::ProducerError),
    #[error(transparent)]
    Passthrough(#[from] service_support::kafka::PassthroughError),
    #[error("the target topics are not as configured")]
    Topics(#[from] TopicError),
}

#[derive(Debug)]
pub struct Application {
    config: Config,
    pool: PgPool,
    listener: TcpListener,
    kafka: ClientConfig,
    publisher: Publisher,
}

impl Application {
    pub async fn build(config: Config) -> Result<Self, StartupError> {
        config.validate().map_err(StartupError::Config)?;
        let producer_settings = publisher::producer_settings(config.delivery_timeout);
        let settings: Vec<(&str, &str)> = producer_settings
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        let kafka = service_support::kafka::client_config(&config.bootstrap_servers, &settings)?;
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(config.database_url.options.clone())
            .await
            .map_err(|source| StartupError::Database {
                url: config.database_url.to_string(),
                source,
            })?;
        store::check_table(&pool)
            .await
            .map_err(|source| StartupError::NoOutbox {
                url: config.database_url.to_string(),
                source,
            })?;
        let listener = TcpListener::bind(config.http_addr)
            .await
            .map_err(|source| StartupError::Bind {
                addr: config.http_addr,
                source,
            })?;
        let publisher = Publisher::new(kafka.clone())?;
        Ok(Self {
            config,
            pool,
            listener,
            kafka,
            publisher,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound TCP listener has a local address")
    }

    /// Runs until `shutdown` completes; then finishes the batch in flight,
    /// records it and returns.
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

        let status = Arc::new(RelayStatus::default());
        let topics_ok = Arc::new(AtomicBool::new(false));
        let http_state = HttpState {
            metrics: crate::metrics::recorder(),
            relay: Arc::clone(&status),
            topics_ok: Arc::clone(&topics_ok),
        };
        tracing::info!(addr = %self.local_addr(), "outbox relay serving /metrics, /healthz, /readyz");
        let http_token = token.clone();
        let http = tokio::spawn(async move {
            axum::serve(self.listener, http::router(http_state))
                .with_graceful_shutdown(async move { http_token.cancelled().await })
                .await
        });

        let checked = check_topics(&self.config, &self.kafka, &token).await;
        if let Err(error) = checked {
            token.cancel();
            let _ = http.await;
            return Err(error);
        }
        topics_ok.store(true, Ordering::Relaxed);

        let sampler = tokio::spawn(sample_backlog(self.pool.clone(), token.clone()));
        let purger = self.config.retain_published.map(|retention| {
            tokio::spawn(purge_published(self.pool.clone(), retention, token.clone()))
        });

        let settings = RelaySettings {
            election: Election {
                database: self.config.database_url.options.clone(),
                lock_key: self.config.lock_key,
                lease: self.config.lease,
            },
            batch_size: self.config.batch_size,
            max_attempts: self.config.max_attempts,
            after_publish: if self.config.retain_published.is_some() {
                AfterPublish::Retain
            } else {
                AfterPublish::Delete
            },
            idle_poll_interval: self.config.poll_interval,
            failover_interval: self.config.failover_interval,
            max_backoff: self.config.max_backoff,
            delivery_timeout: self.config.delivery_timeout,
        };
        relay::run(settings, self.publisher, status, token.clone()).await;

        token.cancel();
        let _ = sampler.await;
        if let Some(purger) = purger {
            let _ = purger.await;
        }
        let _ = http.await;
        self.pool.close().await;
        Ok(())
    }
}

/// Retries while the broker is unreachable (it may start after the relay);
/// a topic that is missing or wrongly partitioned stops the relay.
async fn check_topics(
    config: &Config,
    kafka: &ClientConfig,
    token: &CancellationToken,
) -> Result<(), StartupError> {
    let mut backoff = Backoff::new(Duration::from_millis(200), config.max_backoff);
    loop {
        let result = topics::ensure_topics(
            kafka,
            &config.topics,
            usize::from(config.topic_partitions),
            config.topic_replication_factor,
            config.create_topics,
        )
        .await;
        match result {
            Ok(()) => return Ok(()),
            Err(error) if error.is_retryable() => {
                tracing::warn!(error.cause_chain = ?error, error.message = %error, "broker not reachable yet; retrying");
                tokio::select! {
                    () = tokio::time::sleep(backoff.next_wait()) => {}
                    () = token.cancelled() => return Ok(()),
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
}

async fn sample_backlog(pool: PgPool, token: CancellationToken) {
    let mut interval = tokio::time::interval(SAMPLE_INTERVAL);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = token.cancelled() => return,
        }
        match store::backlog(&pool).await {
            Ok(backlog) => {
                metrics::gauge!("outbox_backlog_rows").set(backlog.pending as f64);
                metrics::gauge!("outbox_oldest_pending_age_seconds")
                    .set(backlog.oldest_pending_age.as_secs_f64());
                metrics::gauge!("outbox_parked_rows").set(backlog.parked as f64);
                metrics::gauge!("outbox_held_rows").set(backlog.held as f64);
            }
            Err(error) => tracing::debug!(%error, "sampling the backlog failed"),
        }
    }
}

async fn purge_published(pool: PgPool, retention: Duration, token: CancellationToken) {
    let mut interval = tokio::time::interval(PURGE_INTERVAL);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = token.cancelled() => return,
        }
        match store::purge_published(&pool, retention, PURGE_BATCH).await {
            Ok(0) => {}
            Ok(purged) => tracing::info!(purged, "purged retained outbox rows"),
            Err(error) => {
                tracing::warn!(error.message = %error, "purging retained outbox rows failed")
            }
        }
    }
}

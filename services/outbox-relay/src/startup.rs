//! Building and running the relay: database, topics check, HTTP, the loop.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::ClientConfig;
use service_support::retry::{self, RetryPolicy};
use service_support::serving::{self, BindError};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cdc::slot::{self, SlotError};
use crate::cdc::stream::{self as cdc_stream, CdcSettings};
use crate::config::Transport;
use crate::config::{Cleanup, Config, Mode};
use crate::http::{self, HttpState};
use crate::leadership::Election;
use crate::publisher::{Publisher, amqp, kafka};
use crate::relay::{self, RelaySettings, RelayStatus};
use crate::store::{self, AfterPublish, DeliveryLog};
use crate::topics::{self, TopicError};
use service_support::amqp::{self as amqp_client, AmqpError};

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
        "{url} has no outbox table (or delivery log) the relay can use: start the service that \
         writes it first (it applies migrations/outbox), or apply them by hand"
    )]
    NoOutbox {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("invalid Kafka producer configuration")]
    Producer(#[from] kafka::ProducerError),
    #[error(transparent)]
    Kafka(#[from] kafka::ClientConfigError),
    #[error("RabbitMQ is not usable")]
    Amqp(#[from] AmqpError),
    #[error(
        "the target topics are not as configured (create them, or start the relay with --create-topics)"
    )]
    Topics(#[from] TopicError),
    #[error("CDC mode cannot stream this database")]
    Slot(#[from] SlotError),
}

#[derive(Debug)]
pub struct Application {
    config: Config,
    pool: PgPool,
    listener: TcpListener,
    broker: Broker,
}

/// The broker, as far as it is set up before `run_until_stopped`: a Kafka
/// producer connects lazily, a RabbitMQ connection only once the broker
/// answers (it may start after the relay).
#[derive(Debug)]
enum Broker {
    Kafka {
        config: ClientConfig,
        publisher: kafka::Publisher,
    },
    RabbitMq,
}

impl Application {
    pub async fn build(config: Config) -> Result<Self, StartupError> {
        config.validate().map_err(StartupError::Config)?;
        let kafka = match config.transport {
            Transport::Kafka => Some(kafka::client_config(
                &config.bootstrap_servers,
                config.delivery_timeout,
            )?),
            Transport::RabbitMq => None,
        };
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(config.database_url.options.clone())
            .await
            .map_err(|source| StartupError::Database {
                url: config.database_url.to_string(),
                source,
            })?;
        store::check_table(&pool, delivery_log(&config))
            .await
            .map_err(|source| StartupError::NoOutbox {
                url: config.database_url.to_string(),
                source,
            })?;
        if config.mode == Mode::Cdc {
            check_replication_tls(&config)?;
            slot::prepare(&pool, &config.cdc_slot, &config.cdc_publication).await?;
        }
        let listener = serving::bind(config.http_addr).await?;
        let broker = match kafka {
            Some(config) => Broker::Kafka {
                publisher: kafka::Publisher::new(config.clone())?,
                config,
            },
            None => Broker::RabbitMq,
        };
        Ok(Self {
            config,
            pool,
            listener,
            broker,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        serving::local_addr(&self.listener)
    }

    /// Runs until `shutdown` completes; then finishes the batch in flight,
    /// records it and returns.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartupError> {
        let token = serving::cancelled_by(shutdown);

        let status = Arc::new(RelayStatus::default());
        let topics_ok = Arc::new(AtomicBool::new(false));
        let http_state = HttpState {
            metrics: crate::metrics::recorder(),
            relay: Arc::clone(&status),
            topics_ok: Arc::clone(&topics_ok),
        };
        tracing::info!(addr = %self.local_addr(), "outbox relay serving /metrics, /healthz, /readyz");
        let http_token = token.clone();
        let http = tokio::spawn(http::serve(self.listener, http_state, http_token));

        let publisher = match self.broker {
            Broker::Kafka { config, publisher } => check_topics(&self.config, &config, &token)
                .await
                .map(|()| Some(Publisher::Kafka(publisher))),
            Broker::RabbitMq => connect_amqp(&self.config, &token)
                .await
                .map(|publisher| publisher.map(|p| Publisher::Amqp(Box::new(p)))),
        };
        let publisher = match publisher {
            Ok(Some(publisher)) => publisher,
            // Stopped before the broker answered.
            Ok(None) => {
                let _ = http.await;
                self.pool.close().await;
                return Ok(());
            }
            Err(error) => {
                token.cancel();
                let _ = http.await;
                return Err(error);
            }
        };
        topics_ok.store(true, Ordering::Relaxed);

        let watched_slot = (self.config.mode == Mode::Cdc).then(|| self.config.cdc_slot.clone());
        let sampler = tokio::spawn(sample_backlog(
            self.pool.clone(),
            watched_slot,
            token.clone(),
        ));
        let purger = tokio::spawn(purge(
            self.pool.clone(),
            self.config.retain_published,
            self.config.delivery_log_retention,
            token.clone(),
        ));

        let after_publish = match self.config.outbox_cleanup {
            Cleanup::RelayDeletes => Some(AfterPublish::Delete),
            Cleanup::Retain => Some(AfterPublish::Retain),
            Cleanup::DeleteInTransaction => None,
        };
        let delivery_log = delivery_log(&self.config);
        let mut outcome = Ok(());
        match self.config.mode {
            Mode::Poll => {
                let settings = RelaySettings {
                    election: election(&self.config),
                    batch_size: self.config.batch_size,
                    max_attempts: self.config.max_attempts,
                    // validate() refuses poll mode without rows to poll.
                    after_publish: after_publish.unwrap_or(AfterPublish::Delete),
                    delivery_log,
                    idle_poll_interval: self.config.poll_interval,
                    failover_interval: self.config.failover_interval,
                    max_backoff: self.config.max_backoff,
                    delivery_timeout: self.config.delivery_timeout,
                };
                relay::run(settings, publisher, status, token.clone()).await;
            }
            Mode::Cdc => {
                let settings = CdcSettings {
                    election: election(&self.config),
                    replication: replication_config(&self.config),
                    slot: self.config.cdc_slot.clone(),
                    batch_size: usize::try_from(self.config.batch_size).unwrap_or(1),
                    after_publish,
                    delivery_log,
                    failover_interval: self.config.failover_interval,
                    max_backoff: self.config.max_backoff,
                    delivery_timeout: self.config.delivery_timeout,
                };
                outcome = cdc_stream::run(
                    settings,
                    self.pool.clone(),
                    publisher,
                    status,
                    token.clone(),
                )
                .await
                .map_err(StartupError::from);
            }
        }

        token.cancel();
        let _ = sampler.await;
        let _ = purger.await;
        let _ = http.await;
        self.pool.close().await;
        outcome
    }
}

/// The lock and lease every relay of this database elects its leader by.
fn election(config: &Config) -> Election {
    Election {
        // Named, so that operators (and `entrega health`) can tell the
        // leader's session in pg_stat_activity.
        database: config
            .database_url
            .options
            .clone()
            .application_name("outbox-relay"),
        lock_key: config.lock_key,
        lease: config.lease,
    }
}

/// The replication connection reaches the database the pool reaches.
fn replication_config(config: &Config) -> pgwire_replication::ReplicationConfig {
    let options = &config.database_url.options;
    let host = match options.get_socket() {
        Some(directory) => directory.display().to_string(),
        None => options.get_host().to_owned(),
    };
    pgwire_replication::ReplicationConfig::new(
        host,
        options.get_username(),
        config.database_url.password().unwrap_or_default(),
        options.get_database().unwrap_or(options.get_username()),
        config.cdc_slot.clone(),
        config.cdc_publication.as_str(),
    )
    .with_port(options.get_port())
    .with_tls(replication_tls(
        options.get_ssl_mode(),
        config.database_url.ssl_root_cert(),
    ))
    .with_status_interval(config.cdc_status_interval)
    .with_wakeup_interval(config.cdc_status_interval)
    .with_application_name("outbox-relay")
}

/// The replication client verifies a certificate's names, not addresses:
/// `sslmode=verify-full` to an IP address would fail every connection, so
/// it stops the relay at start-up instead of a retry loop.
fn check_replication_tls(config: &Config) -> Result<(), StartupError> {
    let options = &config.database_url.options;
    if matches!(
        options.get_ssl_mode(),
        sqlx::postgres::PgSslMode::VerifyFull
    ) && options.get_host().parse::<std::net::IpAddr>().is_ok()
    {
        return Err(StartupError::Config(format!(
            "CDC with sslmode=verify-full needs the database's host name, not the address {} \
             (the replication client checks the certificate's names only): use the name the \
             certificate carries, or sslmode=verify-ca",
            options.get_host()
        )));
    }
    Ok(())
}

/// The pool's `sslmode` and `sslrootcert`, for the replication connection:
/// it must be as protected as the pool's, against the same server.
fn replication_tls(
    mode: sqlx::postgres::PgSslMode,
    ca: Option<&std::path::Path>,
) -> pgwire_replication::TlsConfig {
    use pgwire_replication::TlsConfig;
    use sqlx::postgres::PgSslMode;
    let ca = ca.map(std::path::Path::to_path_buf);
    match mode {
        PgSslMode::Disable | PgSslMode::Allow => TlsConfig::disabled(),
        PgSslMode::Prefer => TlsConfig {
            mode: pgwire_replication::SslMode::Prefer,
            ..TlsConfig::default()
        },
        PgSslMode::Require => TlsConfig::require(),
        PgSslMode::VerifyCa => TlsConfig::verify_ca(ca),
        PgSslMode::VerifyFull => TlsConfig::verify_full(ca),
    }
}

/// Retries while the broker is unreachable (it may start after the relay);
/// a topic that is missing or wrongly partitioned stops the relay.
async fn check_topics(
    config: &Config,
    kafka: &ClientConfig,
    token: &CancellationToken,
) -> Result<(), StartupError> {
    let mut backoff =
        RetryPolicy::forever(Duration::from_millis(200), config.max_backoff).backoff();
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
                if !retry::sleep(backoff.next_wait(), token).await {
                    return Ok(());
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Connects to RabbitMQ and checks (or, with --create-topics, declares)
/// the exchanges, retrying while the broker is unreachable; `None` if
/// shutdown came first. A refused login or a missing exchange stops the
/// relay.
async fn connect_amqp(
    config: &Config,
    token: &CancellationToken,
) -> Result<Option<amqp::Publisher>, StartupError> {
    let mut backoff =
        RetryPolicy::forever(Duration::from_millis(200), config.max_backoff).backoff();
    loop {
        let attempt = async {
            let connection = amqp_client::connect(&config.amqp_url, "outbox-relay setup").await?;
            let ensured =
                amqp_client::ensure_exchanges(&connection, &config.topics, config.create_topics)
                    .await;
            let _ = connection.close(200, "checked".into()).await;
            ensured?;
            amqp::Publisher::connect(config.amqp_url.clone(), config.delivery_timeout).await
        };
        match attempt.await {
            Ok(publisher) => {
                tracing::info!(url = %config.amqp_url, exchanges = ?config.topics, "publishing to RabbitMQ");
                return Ok(Some(publisher));
            }
            Err(error) if error.is_retryable() => {
                tracing::warn!(error.cause_chain = ?error, error.message = %error, "RabbitMQ not reachable yet; retrying");
                if !retry::sleep(backoff.next_wait(), token).await {
                    return Ok(None);
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
}

async fn sample_backlog(pool: PgPool, slot: Option<String>, token: CancellationToken) {
    let mut interval = tokio::time::interval(SAMPLE_INTERVAL);
    while retry::tick(&mut interval, &token).await {
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
        if let Some(slot) = &slot {
            sample_slot(&pool, slot).await;
        }
    }
}

/// The slot-lag guard's gauges (docs/relay.md, "Slot lag").
async fn sample_slot(pool: &PgPool, slot: &str) {
    match slot::health(pool, slot).await {
        Ok(Some(health)) => {
            metrics::gauge!("relay_slot_retained_wal_bytes").set(health.retained_bytes as f64);
            metrics::gauge!("relay_slot_lag_bytes").set(health.lag_bytes as f64);
            // +Inf without max_slot_wal_keep_size: no limit to come near.
            let safe = health
                .safe_bytes
                .map_or(f64::INFINITY, |bytes| bytes as f64);
            metrics::gauge!("relay_slot_safe_wal_bytes").set(safe);
            metrics::gauge!("relay_slot_lost").set(if health.lost { 1.0 } else { 0.0 });
        }
        Ok(None) => metrics::gauge!("relay_slot_lost").set(1.0),
        Err(error) => tracing::debug!(%error, "sampling the slot failed"),
    }
}

fn delivery_log(config: &Config) -> DeliveryLog {
    if config.delivery_log {
        DeliveryLog::On
    } else {
        DeliveryLog::Off
    }
}

/// Purges, every [`PURGE_INTERVAL`], the retained rows (with
/// --retain-published) and the delivery log past their retention.
async fn purge(
    pool: PgPool,
    retain_published: Option<Duration>,
    delivery_log_retention: Duration,
    token: CancellationToken,
) {
    let mut interval = tokio::time::interval(PURGE_INTERVAL);
    while retry::tick(&mut interval, &token).await {
        if let Some(retention) = retain_published {
            report_purge(
                "retained outbox rows",
                store::purge_published(&pool, retention, PURGE_BATCH).await,
            );
        }
        report_purge(
            "delivery log entries",
            store::purge_deliveries(&pool, delivery_log_retention, PURGE_BATCH).await,
        );
    }
}

fn report_purge(what: &str, result: Result<u64, sqlx::Error>) {
    match result {
        Ok(0) => {}
        Ok(purged) => tracing::info!(purged, "purged {what}"),
        Err(error) => tracing::warn!(error.message = %error, "purging {what} failed"),
    }
}

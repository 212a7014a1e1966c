//! Whether the database can be reached, shared by every partition worker.
//!
//! A worker whose transaction fails because the database is unreachable
//! reports it here and waits: the poll loop pauses every partition,
//! readiness fails, and a probe tries the database with a capped backoff
//! until it answers. Then workers retry their batch on a live connection,
//! without counting the outage against the record: a database that is down
//! is not the message's fault.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use service_support::retry::{self, AttemptError, RetryPolicy};

const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The database's availability, as the consumer last saw it.
#[derive(Debug)]
pub struct Database {
    pool: PgPool,
    /// `None` while available; since when it is not, otherwise.
    down_since: watch::Sender<Option<Instant>>,
}

/// Cancellation came while waiting for the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled;

impl Database {
    pub fn new(pool: PgPool) -> Arc<Self> {
        metrics::gauge!("consumer_database_available").set(1.0);
        Arc::new(Self {
            pool,
            down_since: watch::Sender::new(None),
        })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn is_available(&self) -> bool {
        self.down_since.borrow().is_none()
    }

    /// Since when the database has been unreachable, if it is.
    pub fn down_since(&self) -> Option<Instant> {
        *self.down_since.borrow()
    }

    /// A transaction failed for want of a database.
    pub fn report_unavailable(&self, error: &sqlx::Error) {
        let newly_down = self.down_since.send_if_modified(|down| {
            if down.is_some() {
                return false;
            }
            *down = Some(Instant::now());
            true
        });
        if newly_down {
            metrics::gauge!("consumer_database_available").set(0.0);
            tracing::error!(error.cause_chain = ?error, error.message = %error,
                "the database is unavailable: consumption paused until it answers");
        }
    }

    /// Waits until the database is available again.
    pub async fn wait_until_available(&self, cancel: &CancellationToken) -> Result<(), Cancelled> {
        let mut available = self.down_since.subscribe();
        tokio::select! {
            result = available.wait_for(Option::is_none) => result.map(drop).map_err(|_| Cancelled),
            () = cancel.cancelled() => Err(Cancelled),
        }
    }

    /// Until `shutdown`: whenever the database is reported unavailable,
    /// probes it until it answers, then marks it available.
    pub async fn probe(self: Arc<Self>, shutdown: CancellationToken) {
        let policy = RetryPolicy::forever(Duration::from_millis(250), Duration::from_secs(5));
        let mut state = self.down_since.subscribe();
        loop {
            tokio::select! {
                result = state.wait_for(Option::is_some) => if result.is_err() { return },
                () = shutdown.cancelled() => return,
            }
            // It failed a moment ago: give it that moment before the first probe.
            if !retry::sleep(policy.first_wait, &shutdown).await {
                return;
            }
            let answered = policy
                .run(&shutdown, |_| async {
                    self.ping().await.map_err(AttemptError::Failed)
                })
                .await;
            if answered.is_err() {
                return; // shutdown
            }
            let down_for = self.down_since().map(|since| since.elapsed());
            self.down_since.send_replace(None);
            metrics::gauge!("consumer_database_available").set(1.0);
            tracing::info!(?down_for, "the database answers again: consumption resumes");
        }
    }

    /// The database answers and takes writes: a server that came back
    /// read-only (a failover to a standby) is still unavailable.
    async fn ping(&self) -> Result<(), ProbeError> {
        let attempt = async {
            let mut connection = self.pool.acquire().await?;
            let writable = sqlx::query_scalar!(
                r#"select not pg_is_in_recovery()
                          and current_setting('transaction_read_only') = 'off' as "writable!""#,
            )
            .fetch_one(&mut *connection)
            .await;
            match writable {
                Ok(true) => Ok(()),
                Ok(false) => Err(ProbeError::ReadOnly),
                Err(error) => {
                    connection.close_on_drop();
                    Err(ProbeError::Database(error))
                }
            }
        };
        tokio::time::timeout(PROBE_TIMEOUT, attempt)
            .await
            .map_err(|_| ProbeError::TimedOut)?
    }
}

#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("no answer within {PROBE_TIMEOUT:?}")]
    TimedOut,
    #[error("the server is read-only")]
    ReadOnly,
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

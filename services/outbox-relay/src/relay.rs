//! The relay loop: lead (or wait to), read the oldest rows that may be sent
//! (at most one per aggregate, see store.rs), publish them, record the
//! outcome, repeat.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use service_support::retry::{self, Backoff, RetryPolicy};
use tokio_util::sync::CancellationToken;

use crate::leadership::{Election, Leader, LeadershipError};
use crate::publisher::{Outcome, Publisher};
use crate::store::{self, AfterPublish, Delivery, DeliveryLog, DeliveryLogWriter};

/// What the loop needs to know.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub election: Election,
    pub batch_size: i64,
    pub max_attempts: i32,
    pub after_publish: AfterPublish,
    pub delivery_log: DeliveryLog,
    /// Longest sleep between reads when there is nothing to publish.
    pub idle_poll_interval: Duration,
    /// How often a standby tries to become the leader.
    pub failover_interval: Duration,
    /// Longest wait between retries after a failure.
    pub max_backoff: Duration,
    /// How long librdkafka may take over one record (`message.timeout.ms`).
    pub delivery_timeout: Duration,
}

/// Health the HTTP endpoints report.
#[derive(Debug, Default)]
pub struct RelayStatus {
    pub leader: AtomicBool,
    pub database_ok: AtomicBool,
}

/// What one step of the leader's loop did; it drives the wait that follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Rows were read; this many were published. Read again at once.
    Published(usize),
    /// Nothing to publish: sleep a little longer each time, up to the interval.
    Empty,
    /// Rows were read and none was published: back off before reading again
    /// (the broker is likely down).
    Failed,
    /// Rows were read but none could be sent: even after a renewal the
    /// lease was too short (statements outlast the fence window). Back off
    /// as after a failure; the next read renews the lease or finds it lost.
    Fenced,
}

/// Waits until this relay leads (`Some`, the lock held) or shutdown comes
/// (`None`). A standby tries every failover interval, quietly: it says once
/// that it waits, and why. A database it cannot reach is retried with
/// `backoff`. Both modes elect their leader this way.
pub async fn campaign(
    election: &Election,
    status: &RelayStatus,
    failover_interval: Duration,
    backoff: &mut Backoff,
    shutdown: &CancellationToken,
) -> Option<Leader> {
    let mut standing_by = false;
    while !shutdown.is_cancelled() {
        match election.try_lead().await {
            Ok(Some(leader)) => {
                tracing::info!("leading: this relay publishes the outbox");
                status.leader.store(true, Ordering::Relaxed);
                status.database_ok.store(true, Ordering::Relaxed);
                metrics::gauge!("relay_leader").set(1.0);
                backoff.reset();
                return Some(leader);
            }
            Ok(None) => {
                status.database_ok.store(true, Ordering::Relaxed);
                if !standing_by {
                    tracing::info!(lease = ?election.lease,
                        "standing by: another relay leads this outbox; this one takes over if it stops, or stalls for longer than the lease");
                    standing_by = true;
                }
                retry::sleep(failover_interval, shutdown).await;
            }
            Err(error) => {
                status.database_ok.store(false, Ordering::Relaxed);
                tracing::warn!(error.message = %error, "cannot reach the orders database; retrying");
                retry::sleep(backoff.next_wait(), shutdown).await;
            }
        }
    }
    None
}

/// No longer leading: what the health endpoints and the gauge say.
pub fn stepped_down(status: &RelayStatus) {
    status.leader.store(false, Ordering::Relaxed);
    metrics::gauge!("relay_leader").set(0.0);
}

/// Runs until `shutdown` is cancelled. The batch in flight at that moment is
/// finished and recorded first.
pub async fn run(
    settings: RelaySettings,
    mut publisher: Publisher,
    status: Arc<RelayStatus>,
    shutdown: CancellationToken,
) {
    let mut backoff =
        RetryPolicy::forever(Duration::from_millis(100), settings.max_backoff).backoff();
    while let Some(leader) = campaign(
        &settings.election,
        &status,
        settings.failover_interval,
        &mut backoff,
        &shutdown,
    )
    .await
    {
        let result = lead(leader, &settings, &mut publisher, &shutdown).await;
        stepped_down(&status);
        if let Err(error) = result {
            status.database_ok.store(false, Ordering::Relaxed);
            tracing::warn!(error.cause_chain = ?error, error.message = %error, "lost the database connection or the lease; stepping down");
            retry::sleep(backoff.next_wait(), &shutdown).await;
        }
    }
    publisher.flush(Duration::from_secs(5));
    tracing::info!("relay stopped");
}

async fn lead(
    mut leader: Leader,
    settings: &RelaySettings,
    publisher: &mut Publisher,
    shutdown: &CancellationToken,
) -> Result<(), LeadershipError> {
    let mut idle =
        RetryPolicy::forever(Duration::from_millis(1), settings.idle_poll_interval).backoff();
    let mut failures =
        RetryPolicy::forever(Duration::from_millis(100), settings.max_backoff).backoff();
    let mut log = DeliveryLogWriter::new(settings.delivery_log);
    while !shutdown.is_cancelled() {
        // Every read renews the lease, so no wait may outlast a renewal.
        let wait = match publish_batch(&mut leader, settings, publisher, &mut log).await? {
            BatchOutcome::Published(_) => {
                idle.reset();
                failures.reset();
                continue;
            }
            BatchOutcome::Empty => idle.next_wait(),
            BatchOutcome::Failed | BatchOutcome::Fenced => {
                idle.reset();
                failures.next_wait()
            }
        };
        retry::sleep(wait.min(leader.renew_within()), shutdown).await;
    }
    leader.step_down().await;
    Ok(())
}

/// One read-publish-record step. Not interrupted by shutdown: once rows are
/// sent, their delivery reports are awaited and recorded.
#[tracing::instrument(skip_all, fields(rows, published), err)]
async fn publish_batch(
    leader: &mut Leader,
    settings: &RelaySettings,
    publisher: &mut Publisher,
    log: &mut DeliveryLogWriter,
) -> Result<BatchOutcome, LeadershipError> {
    let batch_size = settings.batch_size;
    let read_at = Instant::now();
    let rows = leader
        .run(async |conn| store::fetch_pending(conn, batch_size).await)
        .await?;
    if rows.is_empty() {
        return Ok(BatchOutcome::Empty);
    }
    // Only reads that found rows: an idle relay's empty polls would make
    // the mean say nothing about a cycle.
    metrics::histogram!("relay_statement_duration_seconds", "statement" => "read")
        .record(read_at.elapsed().as_secs_f64());
    tracing::Span::current().record("rows", rows.len());
    let recording = Recording {
        after_publish: settings.after_publish,
        max_attempts: settings.max_attempts,
        max_wait: settings.max_backoff,
        delivery_timeout: settings.delivery_timeout,
    };
    publish_rows(leader, &rows, &recording, publisher, log).await
}

/// How the outcome of rows read from the table is recorded.
#[derive(Debug, Clone, Copy)]
pub struct Recording {
    pub after_publish: AfterPublish,
    /// Failures caused by a row itself before it is parked.
    pub max_attempts: i32,
    /// Longest wait of a row that steps aside after a broker fault.
    pub max_wait: Duration,
    pub delivery_timeout: Duration,
}

/// Publishes `rows`, read from the table by the leader, and records each
/// outcome there: published rows are marked (or deleted), poison rows
/// charged an attempt (parked at `max_attempts`), rows the broker did not
/// take stepped aside with a backoff, withheld rows left as they are for
/// the next read. Poll mode's batches and CDC mode's stepped-aside rows go
/// this way. The caller's span gets the `published` field.
pub async fn publish_rows(
    leader: &mut Leader,
    rows: &[crate::record::OutboxRow],
    recording: &Recording,
    publisher: &mut Publisher,
    log: &mut DeliveryLogWriter,
) -> Result<BatchOutcome, LeadershipError> {
    let send_by = leader
        .send_deadline_renewed(recording.delivery_timeout)
        .await?;
    let started = Instant::now();
    let outcomes = publisher.publish(rows, send_by).await;
    metrics::histogram!("relay_batch_publish_duration_seconds")
        .record(started.elapsed().as_secs_f64());

    let mut published: Vec<Delivery> = Vec::with_capacity(rows.len());
    let mut poison = Vec::new();
    let mut transient = Vec::new();
    let mut withheld = 0_usize;
    for (row, outcome) in rows.iter().zip(outcomes) {
        match outcome {
            Outcome::Published { partition, offset } => {
                published.push(Delivery::of(row, partition, offset));
            }
            Outcome::Poison(error) => poison.push((row.id, error)),
            Outcome::Transient(error) => transient.push((row.id, error)),
            Outcome::Withheld => withheld += 1,
        }
    }
    if !published.is_empty() {
        let after_publish = recording.after_publish;
        let marked_at = Instant::now();
        leader
            .run(async |conn| store::record_published(conn, &published, after_publish, log).await)
            .await?;
        metrics::histogram!("relay_statement_duration_seconds", "statement" => "mark")
            .record(marked_at.elapsed().as_secs_f64());
    }
    metrics::counter!("outbox_published_total").increment(published.len() as u64);
    tracing::Span::current().record("published", published.len());

    if !poison.is_empty() {
        metrics::counter!("relay_publish_failures_total", "kind" => "poison")
            .increment(poison.len() as u64);
        for (id, error) in &poison {
            tracing::warn!(outbox.id = %id, error.message = %error, "row failed to publish");
        }
        let max_attempts = recording.max_attempts;
        let parked = leader
            .run(async |conn| store::record_poison(conn, &poison, max_attempts).await)
            .await?;
        for id in &parked {
            tracing::error!(outbox.id = %id, max_attempts,
                "row parked after repeated failures; the later rows of its aggregate wait until it is un-parked (docs/relay.md)");
        }
        metrics::counter!("outbox_parked_total").increment(parked.len() as u64);
    }
    if !transient.is_empty() {
        metrics::counter!("relay_publish_failures_total", "kind" => "transient")
            .increment(transient.len() as u64);
        tracing::warn!(rows = transient.len(), error.message = %transient[0].1,
            "the broker did not take the rows; they step aside and are retried with a backoff");
        let max_wait = recording.max_wait;
        leader
            .run(async |conn| store::record_transient(conn, &transient, max_wait).await)
            .await?;
    }
    if withheld > 0 {
        // Not an error of the rows: they stay pending, untouched, and the
        // next read finds them (or a new leader does).
        metrics::counter!("relay_withheld_rows_total").increment(withheld as u64);
        tracing::warn!(
            rows = withheld,
            "the lease ran short before these rows were sent; withheld them and renewing the lease"
        );
        if published.is_empty() {
            metrics::counter!("relay_fenced_batches_total").increment(1);
            return Ok(BatchOutcome::Fenced);
        }
    }
    if published.is_empty() {
        return Ok(BatchOutcome::Failed);
    }
    Ok(BatchOutcome::Published(published.len()))
}

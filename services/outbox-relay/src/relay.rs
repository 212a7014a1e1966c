//! The relay loop: lead (or wait to), read the oldest rows that may be sent
//! (at most one per aggregate, see store.rs), publish them, record the
//! outcome, repeat. While a backlog drains, the next batch is read and sent
//! before the previous one is recorded ([`publish_batch`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use service_support::retry::{self, Backoff, RetryPolicy};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::leadership::{Election, Leader, LeadershipError};
use crate::publisher::{Outcome, Publisher, Sent};
use crate::record::OutboxRow;
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
    /// A full batch was read and sent; its reports are awaited while the
    /// next batch is read and sent (a backlog drains). Read again at once.
    Sent,
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
    publisher.flush(Duration::from_secs(5)).await;
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
    let mut in_flight = None;
    while !shutdown.is_cancelled() {
        // Every read renews the lease, so no wait may outlast a renewal.
        let step = publish_batch(&mut leader, settings, publisher, &mut log, &mut in_flight);
        let wait = match step.await? {
            BatchOutcome::Published(_) | BatchOutcome::Sent => {
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
    if let Some(batch) = in_flight {
        let recording = settings.recording();
        record_rows(
            &mut leader,
            &batch.rows,
            batch.sending,
            &recording,
            publisher,
            &mut log,
        )
        .await?;
    }
    leader.step_down().await;
    Ok(())
}

/// A full batch sent while a backlog drains, recorded once the next batch
/// is read and sent: the broker acknowledges one batch while the relay
/// reads the next and marks the one before.
struct InFlight {
    rows: Vec<OutboxRow>,
    sending: Sending,
}

/// One read-send-record step. Not interrupted by shutdown: once rows are
/// sent, their delivery reports are awaited and recorded.
///
/// A read that comes back full means a backlog: its batch stays in flight
/// (`in_flight`) while the next read, which skips its rows and so their
/// aggregates, is sent; then it is recorded. Each batch is recorded from
/// its own reports, and an aggregate's next row is read only once its
/// previous row is recorded, as without the overlap. A read that is not
/// full, or a batch before it that was not all published, ends the
/// overlap: at low load one batch at a time makes fewer, fuller produce
/// requests (docs/relay.md, "Where a cycle's time goes").
#[tracing::instrument(skip_all, fields(rows, published), err)]
async fn publish_batch(
    leader: &mut Leader,
    settings: &RelaySettings,
    publisher: &mut Publisher,
    log: &mut DeliveryLogWriter,
    in_flight: &mut Option<InFlight>,
) -> Result<BatchOutcome, LeadershipError> {
    let batch_size = settings.batch_size;
    let recording = settings.recording();
    let skip: Vec<Uuid> = in_flight
        .as_ref()
        .map(|batch| batch.rows.iter().map(|row| row.id).collect())
        .unwrap_or_default();
    let read_at = Instant::now();
    let rows = leader
        .run(async |conn| store::fetch_pending(conn, batch_size, &skip).await)
        .await?;
    let sending = if rows.is_empty() {
        None
    } else {
        // Only reads that found rows: an idle relay's empty polls would make
        // the mean say nothing about a cycle.
        metrics::histogram!("relay_statement_duration_seconds", "statement" => "read")
            .record(read_at.elapsed().as_secs_f64());
        tracing::Span::current().record("rows", rows.len());
        Some(send_rows(leader, &rows, &recording, publisher).await?)
    };
    let previous = match in_flight.take() {
        Some(batch) => {
            if sending.is_some() {
                metrics::counter!("relay_overlapped_batches_total").increment(1);
            }
            let outcome = record_rows(
                leader,
                &batch.rows,
                batch.sending,
                &recording,
                publisher,
                log,
            );
            Some(outcome.await?)
        }
        None => None,
    };
    let Some(sending) = sending else {
        return Ok(previous.unwrap_or(BatchOutcome::Empty));
    };
    let full = i64::try_from(rows.len()).is_ok_and(|read| read >= batch_size);
    if full && matches!(previous, None | Some(BatchOutcome::Published(_))) {
        *in_flight = Some(InFlight { rows, sending });
        return Ok(BatchOutcome::Sent);
    }
    record_rows(leader, &rows, sending, &recording, publisher, log).await
}

impl RelaySettings {
    fn recording(&self) -> Recording {
        Recording {
            after_publish: self.after_publish,
            max_attempts: self.max_attempts,
            max_wait: self.max_backoff,
            delivery_timeout: self.delivery_timeout,
        }
    }
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
    rows: &[OutboxRow],
    recording: &Recording,
    publisher: &mut Publisher,
    log: &mut DeliveryLogWriter,
) -> Result<BatchOutcome, LeadershipError> {
    let sending = send_rows(leader, rows, recording, publisher).await?;
    record_rows(leader, rows, sending, recording, publisher, log).await
}

/// Rows handed to the producer, their reports still to come.
struct Sending {
    sent: Sent,
    send_by: Instant,
    started: Instant,
}

async fn send_rows(
    leader: &mut Leader,
    rows: &[OutboxRow],
    recording: &Recording,
    publisher: &Publisher,
) -> Result<Sending, LeadershipError> {
    let send_by = leader
        .send_deadline_renewed(recording.delivery_timeout)
        .await?;
    let started = Instant::now();
    let sent = publisher.send(rows, send_by).await;
    Ok(Sending {
        sent,
        send_by,
        started,
    })
}

/// Waits for the reports of rows [`send_rows`] sent and records them.
async fn record_rows(
    leader: &mut Leader,
    rows: &[OutboxRow],
    sending: Sending,
    recording: &Recording,
    publisher: &mut Publisher,
    log: &mut DeliveryLogWriter,
) -> Result<BatchOutcome, LeadershipError> {
    let outcomes = publisher.settle(rows, sending.sent, sending.send_by).await;
    metrics::histogram!("relay_batch_publish_duration_seconds")
        .record(sending.started.elapsed().as_secs_f64());

    let mut published: Vec<Delivery> = Vec::with_capacity(rows.len());
    let mut poison = Vec::new();
    let mut transient = Vec::new();
    let mut withheld = 0_usize;
    for (row, outcome) in rows.iter().zip(outcomes) {
        match outcome {
            Outcome::Published(position) => {
                published.push(Delivery::of(row, position));
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

//! CDC mode's loop: hold the slot (or wait to), stream the outbox inserts
//! of committed transactions, publish them in commit order, confirm the WAL
//! position past what the broker acknowledged.
//!
//! The slot admits one streaming session: that is the leader election. A
//! standby's START_REPLICATION fails with "slot is active" (SQLSTATE 55006)
//! and it retries every failover interval; when the leader dies, its
//! walsender ends (at once for a crash, within `wal_sender_timeout` for a
//! lost network) and the standby resumes from `confirmed_flush_lsn`.
//!
//! Any failure (a delivery the broker did not acknowledge, a dropped
//! connection, bytes that do not decode) ends the session; the next one
//! starts from the confirmed position: the unconfirmed tail is sent again
//! (duplicates, which consumers absorb), nothing is skipped.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use pgwire_replication::{PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::pgoutput::{self, DecodeError, Message, RelationError, Relations, Value};
use super::progress::{Lsn, Progress, ProgressError, TxId};
use super::row::{RowError, outbox_row};
use super::slot::{self, SlotError};
use crate::leadership::SEND_MARGIN;
use crate::publisher::{Outcome, Publisher};
use crate::record::OutboxRow;
use crate::relay::{Backoff, RelayStatus};
use crate::store::{self, AfterPublish, Delivery, DeliveryLog};

/// How long a committed transaction waits for more to join its batch: the
/// replication worker hands over what the server already sent without a
/// wait, so this only ends a batch once the stream is momentarily dry.
const GATHER: Duration = Duration::from_millis(1);

/// A commit reaches the stream once it is in the WAL, a moment before other
/// sessions see its rows: the cleanup right after the broker's
/// acknowledgement can miss a row. It is retried this often...
const CLEANUP_RETRY: Duration = Duration::from_millis(50);
/// ...for this long; a row still not found was removed by someone else, or
/// is left for the next start's catch-up to publish again (a duplicate).
const CLEANUP_PATIENCE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct CdcSettings {
    /// The replication connection: database, slot, publication, status interval.
    pub replication: ReplicationConfig,
    pub slot: String,
    /// Records per batch (a batch only ends at a commit).
    pub batch_size: usize,
    /// What happens to the table's rows once published; `None` when the
    /// writer deleted them in its own transaction.
    pub after_publish: Option<AfterPublish>,
    pub delivery_log: DeliveryLog,
    pub failover_interval: Duration,
    pub max_backoff: Duration,
    pub delivery_timeout: Duration,
    /// Bounds how long one batch may take to hand its records over.
    pub lease: Duration,
}

#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("the slot is streamed by another relay")]
    Busy,
    #[error("replication stream: {0}")]
    Wire(#[from] PgWireError),
    #[error("the stream ended")]
    Ended,
    #[error("undecodable pgoutput message")]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Relation(#[from] RelationError),
    #[error(
        "a change to {0}, which is not the outbox table (the publication must hold only the outbox)"
    )]
    OtherTable(String),
    #[error(transparent)]
    Row(#[from] RowError),
    #[error("the stream broke the transaction order")]
    Order(#[from] ProgressError),
    #[error("a row came outside a transaction")]
    Orphan,
    #[error("the broker did not take every record: {0}")]
    Delivery(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Runs until `shutdown` is cancelled. Returns an error only when the slot
/// can never stream again (invalidated): the caller stops the relay.
pub async fn run(
    settings: CdcSettings,
    pool: PgPool,
    mut publisher: Publisher,
    status: Arc<RelayStatus>,
    shutdown: CancellationToken,
) -> Result<(), SlotError> {
    let mut backoff = Backoff::new(Duration::from_millis(100), settings.max_backoff);
    while !shutdown.is_cancelled() {
        let mut session = Session::new(&settings, &pool, &mut publisher, &status);
        let result = session.lead(&shutdown).await;
        let led = session.led;
        status.leader.store(false, Ordering::Relaxed);
        metrics::gauge!("relay_leader").set(0.0);
        let wait = match result {
            Ok(()) => break,
            Err(StreamError::Busy) => {
                status.database_ok.store(true, Ordering::Relaxed);
                settings.failover_interval
            }
            Err(error) => {
                if let Ok(Some(health)) = slot::health(&pool, &settings.slot).await
                    && health.lost
                {
                    return Err(SlotError::Lost {
                        slot: settings.slot.clone(),
                    });
                }
                status
                    .database_ok
                    .store(matches!(error, StreamError::Delivery(_)), Ordering::Relaxed);
                tracing::warn!(error.cause_chain = ?error, error.message = %error,
                    "the replication stream ended; resuming from the confirmed position");
                if led {
                    backoff.reset();
                }
                backoff.next_wait()
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => {}
        }
    }
    publisher.flush(Duration::from_secs(5));
    tracing::info!("relay stopped");
    Ok(())
}

/// One streaming session: from START_REPLICATION to its end.
struct Session<'a> {
    settings: &'a CdcSettings,
    pool: &'a PgPool,
    publisher: &'a mut Publisher,
    status: &'a RelayStatus,
    progress: Progress,
    relations: Relations,
    /// The transaction being received: its rows so far.
    open: Option<(TxId, Vec<Parsed>)>,
    /// Committed transactions not yet published, in commit order.
    committed: Vec<(TxId, Vec<Parsed>)>,
    committed_rows: usize,
    /// Published rows the cleanup (mark or delete) has not found yet, and
    /// since when.
    unclean: Vec<(Delivery, Instant)>,
    led: bool,
}

/// A row of the stream: to publish, or parked earlier (written back with
/// `parked_at` by this relay) and so to skip.
enum Parsed {
    Row(OutboxRow),
    Parked,
}

impl<'a> Session<'a> {
    fn new(
        settings: &'a CdcSettings,
        pool: &'a PgPool,
        publisher: &'a mut Publisher,
        status: &'a RelayStatus,
    ) -> Self {
        Self {
            settings,
            pool,
            publisher,
            status,
            progress: Progress::default(),
            relations: Relations::default(),
            open: None,
            committed: Vec::new(),
            committed_rows: 0,
            unclean: Vec::new(),
            led: false,
        }
    }

    async fn lead(&mut self, shutdown: &CancellationToken) -> Result<(), StreamError> {
        let mut client = ReplicationClient::connect(self.settings.replication.clone()).await?;
        tokio::select! {
            started = client.wait_started() => started.map_err(|error| match error {
                PgWireError::Server(message) if message.contains("SQLSTATE 55006") => StreamError::Busy,
                other => StreamError::Wire(other),
            })?,
            () = shutdown.cancelled() => {
                client.abort();
                return Ok(());
            }
        }
        // Only this session can move the slot now: its confirmed position
        // is where the stream starts.
        let confirmed = self.confirmed_position().await?;
        self.progress = Progress::from(confirmed);
        self.led = true;
        self.status.leader.store(true, Ordering::Relaxed);
        self.status.database_ok.store(true, Ordering::Relaxed);
        metrics::gauge!("relay_leader").set(1.0);
        tracing::info!(slot = %self.settings.slot, %confirmed, "leading: streaming the slot");

        let result = match self.catch_up().await {
            Ok(()) => self.stream(&mut client, shutdown).await,
            Err(error) => Err(error),
        };
        // The crate stops without a last status update: confirm on an
        // ordinary connection once the slot is free.
        let position = self.progress.confirmable();
        client.update_applied_lsn(wire(position));
        client.stop();
        let _ = tokio::time::timeout(Duration::from_secs(5), client.join()).await;
        if position > confirmed {
            slot::confirm_released(self.pool, &self.settings.slot, position).await;
        }
        result
    }

    /// Publishes the rows the table holds before streaming: rows committed
    /// before the slot existed are not in its stream (a first start, a
    /// switch from poll mode, a slot rebuilt after it was lost), and rows
    /// of unconfirmed transactions may be there too (sent again below:
    /// duplicates). Holding the slot makes this relay the only one doing it.
    async fn catch_up(&mut self) -> Result<(), StreamError> {
        // With delete-in-transaction, rows left in the table are leftovers
        // of an earlier mode: published, they are deleted as well.
        let after = self.settings.after_publish.unwrap_or(AfterPublish::Delete);
        let limit = i64::try_from(self.settings.batch_size).unwrap_or(i64::MAX);
        let mut total = 0;
        loop {
            let mut conn = self.pool.acquire().await?;
            let rows = store::fetch_pending(&mut conn, limit).await?;
            if rows.is_empty() {
                break;
            }
            let send_by = Instant::now() + self.send_window();
            let outcomes = self.publisher.publish(&rows, send_by).await;
            let mut published = Vec::new();
            let mut poison = Vec::new();
            let mut failure = None;
            for (row, outcome) in rows.iter().zip(outcomes) {
                match outcome {
                    Outcome::Published { partition, offset } => {
                        published.push(Delivery::of(row, partition, offset));
                    }
                    Outcome::Poison(error) => poison.push((row.id, error)),
                    Outcome::Transient(error) => {
                        failure.get_or_insert(error);
                    }
                    Outcome::Withheld => {
                        failure.get_or_insert_with(|| "the batch took too long to send".to_owned());
                    }
                }
            }
            store::mark_published(&mut conn, &published, after, self.settings.delivery_log).await?;
            if !poison.is_empty() {
                store::record_poison(&mut conn, &poison, 1).await?;
                metrics::counter!("outbox_parked_total").increment(poison.len() as u64);
            }
            metrics::counter!("outbox_published_total").increment(published.len() as u64);
            total += published.len();
            if let Some(error) = failure {
                return Err(StreamError::Delivery(error));
            }
        }
        if total > 0 {
            tracing::info!(
                rows = total,
                "published the rows the table held before streaming"
            );
        }
        Ok(())
    }

    /// How long a batch may take to hand its records to the producer.
    fn send_window(&self) -> Duration {
        self.settings
            .lease
            .saturating_sub(self.settings.delivery_timeout + SEND_MARGIN)
    }

    async fn confirmed_position(&self) -> Result<Lsn, StreamError> {
        match slot::health(self.pool, &self.settings.slot).await? {
            Some(health) => Ok(health.confirmed.unwrap_or_default()),
            None => Err(StreamError::Ended),
        }
    }

    async fn stream(
        &mut self,
        client: &mut ReplicationClient,
        shutdown: &CancellationToken,
    ) -> Result<(), StreamError> {
        loop {
            let next = if self.committed.is_empty() {
                tokio::select! {
                    event = client.recv() => Some(event),
                    () = tokio::time::sleep(CLEANUP_RETRY), if !self.unclean.is_empty() => {
                        self.clean_up(Vec::new()).await?;
                        continue;
                    }
                    () = shutdown.cancelled() => return Ok(()),
                }
            } else {
                tokio::time::timeout(GATHER, client.recv()).await.ok()
            };
            match next {
                Some(event) => {
                    let event = event?.ok_or(StreamError::Ended)?;
                    self.receive(event, client)?;
                    if self.committed_rows >= self.settings.batch_size {
                        self.publish(client).await?;
                    }
                }
                // The stream is dry for now: publish what is committed.
                None => self.publish(client).await?,
            }
        }
    }

    fn receive(
        &mut self,
        event: ReplicationEvent,
        client: &ReplicationClient,
    ) -> Result<(), StreamError> {
        match event {
            ReplicationEvent::Begin { .. } => {
                self.open = Some((self.progress.begin()?, Vec::new()));
            }
            ReplicationEvent::XLogData { data, .. } => match pgoutput::decode(&data)? {
                Message::Relation(relation) => self.relations.learn(relation),
                Message::Insert { relation, tuple } => {
                    let (table, row) = self.relations.named(relation, tuple)?;
                    if !table.ends_with(".outbox") {
                        return Err(StreamError::OtherTable(table));
                    }
                    let parsed = if matches!(row.get("parked_at"), Some(Value::Text(_))) {
                        Parsed::Parked
                    } else {
                        Parsed::Row(outbox_row(row)?)
                    };
                    let (_, rows) = self.open.as_mut().ok_or(StreamError::Orphan)?;
                    rows.push(parsed);
                }
                // Type and origin messages; updates, deletes and truncates
                // are not published (publish = 'insert').
                Message::Other(_) => {}
            },
            ReplicationEvent::Commit { end_lsn, .. } => {
                let (tx, rows) = self.open.take().ok_or(StreamError::Orphan)?;
                for _ in &rows {
                    self.progress.sent(tx)?;
                }
                self.progress.commit(tx, Lsn(end_lsn.as_u64()))?;
                self.committed_rows += rows.len();
                self.committed.push((tx, rows));
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                // Everything before a keepalive was decoded: with nothing in
                // flight, confirming it lets the server recycle the WAL of
                // other tables' writes (an idle outbox must not pin WAL).
                self.progress.keepalive(Lsn(wal_end.as_u64()));
                client.update_applied_lsn(wire(self.progress.confirmable()));
            }
            ReplicationEvent::Message { .. } | ReplicationEvent::StoppedAt { .. } => {}
        }
        Ok(())
    }

    /// Publishes the committed transactions, records the rows as the
    /// cleanup mode says, confirms the delivered prefix.
    #[tracing::instrument(skip_all, fields(transactions, rows, published), err)]
    async fn publish(&mut self, client: &ReplicationClient) -> Result<(), StreamError> {
        let committed = std::mem::take(&mut self.committed);
        self.committed_rows = 0;
        let mut txs = Vec::new();
        let mut rows = Vec::new();
        for (tx, parsed) in committed {
            for row in parsed {
                match row {
                    Parsed::Row(row) => {
                        txs.push(tx);
                        rows.push(row);
                    }
                    Parsed::Parked => self.progress.delivered(tx)?,
                }
            }
        }
        let span = tracing::Span::current();
        span.record("rows", rows.len());
        let started = Instant::now();
        let send_by = started + self.send_window();
        let outcomes = self.publisher.publish(&rows, send_by).await;
        metrics::histogram!("relay_batch_publish_duration_seconds")
            .record(started.elapsed().as_secs_f64());

        let mut published: Vec<Delivery> = Vec::with_capacity(rows.len());
        let mut failure = None;
        for ((tx, row), outcome) in txs.into_iter().zip(&rows).zip(outcomes) {
            match outcome {
                Outcome::Published { partition, offset } => {
                    published.push(Delivery::of(row, partition, offset));
                    self.progress.delivered(tx)?;
                }
                Outcome::Poison(error) => {
                    // Retrying from the WAL would fail the same way for
                    // ever: park it (docs/relay.md, "Parked rows in CDC mode").
                    tracing::error!(outbox.id = %row.id, error.message = %error,
                        "row cannot be published; parked, and its aggregate's later rows go on");
                    store::park_from_wal(&mut *self.pool.acquire().await?, row, &error).await?;
                    metrics::counter!("relay_publish_failures_total", "kind" => "poison")
                        .increment(1);
                    metrics::counter!("outbox_parked_total").increment(1);
                    self.progress.delivered(tx)?;
                }
                Outcome::Transient(error) => {
                    metrics::counter!("relay_publish_failures_total", "kind" => "transient")
                        .increment(1);
                    failure.get_or_insert(error);
                }
                Outcome::Withheld => {
                    metrics::counter!("relay_withheld_rows_total").increment(1);
                    failure.get_or_insert_with(|| "the batch took too long to send".to_owned());
                }
            }
        }
        metrics::counter!("outbox_published_total").increment(published.len() as u64);
        span.record("published", published.len());
        self.clean_up(published).await?;
        let confirmable = self.progress.confirmable();
        client.update_applied_lsn(wire(confirmable));
        metrics::gauge!("relay_cdc_confirmed_lsn").set(confirmable.0 as f64);
        match failure {
            Some(error) => Err(StreamError::Delivery(error)),
            None => Ok(()),
        }
    }

    /// Marks or deletes `published` as the cleanup mode says, with the rows
    /// an earlier cleanup did not find yet; keeps those it does not find.
    async fn clean_up(&mut self, published: Vec<Delivery>) -> Result<(), StreamError> {
        let Some(after) = self.settings.after_publish else {
            return Ok(());
        };
        let now = Instant::now();
        self.unclean
            .extend(published.into_iter().map(|id| (id, now)));
        if self.unclean.is_empty() {
            return Ok(());
        }
        let deliveries: Vec<Delivery> = self.unclean.iter().map(|(d, _)| d.clone()).collect();
        let found: HashSet<Uuid> = store::mark_published(
            &mut *self.pool.acquire().await?,
            &deliveries,
            after,
            self.settings.delivery_log,
        )
        .await?
        .into_iter()
        .collect();
        self.unclean.retain(|(delivery, since)| {
            if found.contains(&delivery.id) {
                return false;
            }
            if since.elapsed() < CLEANUP_PATIENCE {
                return true;
            }
            tracing::warn!(outbox.id = %delivery.id,
                "published, but its row was not found to mark or delete; if it is still in the table, the next start publishes it again");
            false
        });
        metrics::gauge!("relay_cdc_unclean_rows").set(self.unclean.len() as f64);
        Ok(())
    }
}

fn wire(lsn: Lsn) -> pgwire_replication::Lsn {
    pgwire_replication::Lsn::from_u64(lsn.0)
}

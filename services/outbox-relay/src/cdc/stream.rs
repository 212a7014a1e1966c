//! CDC mode's loop: lead (the same lock and lease as poll mode), stream the
//! outbox inserts of committed transactions, publish them in commit order,
//! confirm the WAL position past what is delivered or durably stepped aside.
//!
//! Leadership is poll mode's (leadership.rs): the leader holds the advisory
//! lock and renews its lease with every statement; a standby that finds the
//! lease stale deposes the leader's session and, holding the lock, ends the
//! old leader's walsender if it still holds the slot. The send fence is the
//! same too: nothing is handed to librdkafka that could land after a
//! standby may lead. So a frozen leader is replaced within the lease, and a
//! standby never asks for the slot while another relay leads.
//!
//! A record the broker does not take does not end the stream: it steps
//! aside into the outbox table (store.rs, "stepped aside"), marked, with the
//! later records of its aggregate held behind it; the stream goes on and the
//! position is confirmed past them, so one broken topic or partition
//! neither stops the healthy aggregates nor pins the WAL. The table path
//! ([`Session::publish_stepped_aside`]) sends the stepped-aside rows, each
//! aggregate's in order, as poll mode would; the stream holds back every
//! record of an aggregate that still has one there.
//!
//! Only a lost connection, a lost lease or bytes that do not decode end the
//! session; the next one resumes from the confirmed position: the
//! unconfirmed tail is sent again (duplicates, which consumers absorb),
//! nothing is skipped.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pgwire_replication::{PgWireError, ReplicationClient, ReplicationConfig, ReplicationEvent};
use service_support::retry::{self, RetryPolicy};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::pgoutput::{self, DecodeError, Message, RelationError, Relations, Value};
use super::progress::{Lsn, Progress, ProgressError, TxId};
use super::row::{RowError, outbox_row};
use super::slot::{self, SlotError};
use crate::leadership::{Election, Leader, LeadershipError};
use crate::publisher::{Outcome, Publisher};
use crate::record::OutboxRow;
use crate::relay::{self, BatchOutcome, Recording, RelayStatus};
use crate::store::{self, AfterPublish, Aside, Delivery, DeliveryLog, DeliveryLogWriter};

/// How long a committed transaction waits for more to join its batch: the
/// replication worker hands over what the server already sent without a
/// wait, so this only ends a batch once the stream is momentarily dry.
const GATHER: Duration = Duration::from_millis(1);

/// A commit reaches the stream once it is in the WAL, a moment before other
/// sessions see its rows: the cleanup right after the broker's
/// acknowledgement can miss a row. It is retried this often...
const CLEANUP_RETRY: Duration = Duration::from_millis(50);
/// ...for this long; a row still not found was removed by someone else, or
/// is left in the table (logged).
const CLEANUP_PATIENCE: Duration = Duration::from_secs(60);

/// How often the table path looks for stepped-aside rows at most, and how
/// long it waits when it cannot tell when the next one is due.
const ASIDE_MIN_WAIT: Duration = Duration::from_millis(20);

/// How often a new leader asks again for a slot that a deposed leader's
/// walsender still holds, and how many times.
const SLOT_RETRY: Duration = Duration::from_millis(200);
const SLOT_TRIES: usize = 25;

#[derive(Debug, Clone)]
pub struct CdcSettings {
    /// The lock and lease, as in poll mode.
    pub election: Election,
    /// The replication connection: database, slot, publication, status interval.
    pub replication: ReplicationConfig,
    pub slot: String,
    /// Records per batch.
    pub batch_size: usize,
    /// What happens to the table's rows once published; `None` when the
    /// writer deleted them in its own transaction.
    pub after_publish: Option<AfterPublish>,
    pub delivery_log: DeliveryLog,
    pub failover_interval: Duration,
    pub max_backoff: Duration,
    pub delivery_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("the slot stayed busy after this relay took the lead (another program streams it?)")]
    Busy,
    #[error("replication stream: {0}")]
    Wire(#[from] PgWireError),
    #[error("the stream ended")]
    Ended,
    #[error("undecodable pgoutput message")]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Relation(#[from] RelationError),
    #[error(transparent)]
    Row(#[from] RowError),
    #[error("the stream broke the transaction order")]
    Order(#[from] ProgressError),
    #[error("a row came outside a transaction")]
    Orphan,
    #[error(transparent)]
    Leadership(#[from] LeadershipError),
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
    let mut backoff =
        RetryPolicy::forever(Duration::from_millis(100), settings.max_backoff).backoff();
    while let Some(leader) = relay::campaign(
        &settings.election,
        &status,
        settings.failover_interval,
        &mut backoff,
        &shutdown,
    )
    .await
    {
        let mut session = Session::new(leader, &settings, &pool, &mut publisher);
        let result = session.lead(&shutdown).await;
        session.leader.step_down().await;
        relay::stepped_down(&status);
        let Err(error) = result else { break };
        if let Ok(Some(health)) = slot::health(&pool, &settings.slot).await
            && health.lost
        {
            return Err(SlotError::Lost {
                slot: settings.slot.clone(),
            });
        }
        tracing::warn!(error.cause_chain = ?error, error.message = %error,
            "the replication stream ended; resuming from the confirmed position");
        retry::sleep(backoff.next_wait(), &shutdown).await;
    }
    publisher.flush(Duration::from_secs(5)).await;
    tracing::info!("relay stopped");
    Ok(())
}

/// One streaming session: from START_REPLICATION to its end.
struct Session<'a> {
    leader: Leader,
    settings: &'a CdcSettings,
    pool: &'a PgPool,
    publisher: &'a mut Publisher,
    log: DeliveryLogWriter,
    progress: Progress,
    relations: Relations,
    /// The transaction being received.
    open: Option<TxId>,
    /// Rows received and not yet published, in stream order. pgoutput
    /// sends a transaction only once it committed, so the rows of the one
    /// still arriving may go out before its commit: a transaction of any
    /// size is published batch by batch (its position confirmed at the end).
    ready: Vec<(TxId, OutboxRow)>,
    /// Published rows the cleanup (mark or delete) has not found yet, and
    /// since when.
    unclean: Vec<(Delivery, Instant)>,
    /// When the cleanup tries the unclean rows again.
    cleanup_at: Option<Instant>,
    /// When the table path looks for stepped-aside rows next; `None` while
    /// the table holds none.
    aside_due: Option<Instant>,
    /// Whether the table may hold stepped-aside or parked rows, which hold
    /// back the stream's records of their aggregates.
    holds_back: bool,
    /// Inserts into other tables were reported (once per session).
    other_tables_reported: bool,
}

impl<'a> Session<'a> {
    fn new(
        leader: Leader,
        settings: &'a CdcSettings,
        pool: &'a PgPool,
        publisher: &'a mut Publisher,
    ) -> Self {
        Self {
            leader,
            settings,
            pool,
            publisher,
            log: DeliveryLogWriter::new(settings.delivery_log),
            progress: Progress::default(),
            relations: Relations::default(),
            open: None,
            ready: Vec::new(),
            unclean: Vec::new(),
            cleanup_at: None,
            aside_due: None,
            holds_back: false,
            other_tables_reported: false,
        }
    }

    async fn lead(&mut self, shutdown: &CancellationToken) -> Result<(), StreamError> {
        let Some(mut client) = self.start_streaming(shutdown).await? else {
            return Ok(());
        };
        // Only this session can move the slot now: its confirmed position
        // is where the stream starts.
        let confirmed = self.confirmed_position().await?;
        self.progress = Progress::from(confirmed);
        tracing::info!(slot = %self.settings.slot, %confirmed, "streaming the slot");
        let result = match self.look_for_stepped_aside().await {
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

    /// START_REPLICATION. This relay holds the lock, so a walsender that
    /// still holds the slot serves a leader that lost the lead (deposed, or
    /// on its way out): it is ended first, as poll mode ends a stale
    /// session. `None` if shutdown came first.
    async fn start_streaming(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<Option<ReplicationClient>, StreamError> {
        for _ in 0..SLOT_TRIES {
            self.end_previous_stream().await?;
            let mut client = ReplicationClient::connect(self.settings.replication.clone()).await?;
            let started = tokio::select! {
                started = client.wait_started() => started,
                () = shutdown.cancelled() => {
                    client.abort();
                    return Ok(None);
                }
            };
            match started {
                Ok(()) => return Ok(Some(client)),
                // Taken between the check and the start (a walsender on
                // its way out): try again.
                Err(PgWireError::Server(message)) if message.contains("SQLSTATE 55006") => {
                    client.abort();
                    retry::sleep(SLOT_RETRY, shutdown).await;
                }
                Err(other) => return Err(other.into()),
            }
        }
        Err(StreamError::Busy)
    }

    /// Ends the walsender that still holds the slot, if one does.
    async fn end_previous_stream(&mut self) -> Result<(), StreamError> {
        let slot = self.settings.slot.clone();
        let ended = self
            .leader
            .run(async |conn| slot::end_stream(conn, &slot).await)
            .await?;
        if let Some(pid) = ended {
            tracing::info!(
                walsender.pid = pid,
                "ended the previous leader's stream, which still held the slot"
            );
            metrics::counter!("relay_streams_ended_total").increment(1);
        }
        Ok(())
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
            let next = if self.ready.is_empty() {
                // Deadlines, not fresh sleeps: a branch whose sleep began
                // anew at every turn would never fire beside a shorter one.
                let renew_at = tokio::time::Instant::from_std(self.leader.renew_at());
                let aside_at = self.aside_due.map(tokio::time::Instant::from_std);
                let cleanup_at = self.cleanup_at.map(tokio::time::Instant::from_std);
                tokio::select! {
                    event = client.recv() => Some(event),
                    () = tokio::time::sleep_until(renew_at) => {
                        self.leader.renew().await?;
                        continue;
                    }
                    () = sleep_until_some(aside_at) => {
                        self.publish_stepped_aside(client).await?;
                        continue;
                    }
                    () = sleep_until_some(cleanup_at) => {
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
                    if self.ready.len() >= self.settings.batch_size {
                        self.publish(client).await?;
                    }
                }
                // The stream is dry for now: publish what is ready.
                None => self.publish(client).await?,
            }
            // A busy stream never waits in the select above: the table path
            // gets its turn between batches.
            if self.aside_due.is_some_and(|due| due <= Instant::now()) {
                self.publish_stepped_aside(client).await?;
            }
            if shutdown.is_cancelled() && self.ready.is_empty() {
                return Ok(());
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
                self.open = Some(self.progress.begin()?);
            }
            ReplicationEvent::XLogData { data, .. } => match pgoutput::decode(&data)? {
                Message::Relation(relation) => self.relations.learn(relation),
                Message::Insert { relation, tuple } => {
                    let (table, row) = self.relations.named(relation, tuple)?;
                    if !table.ends_with(".outbox") {
                        // Refused at start-up (slot.rs); a publication
                        // widened since must not stop the outbox.
                        metrics::counter!("relay_cdc_other_table_rows_total").increment(1);
                        if !std::mem::replace(&mut self.other_tables_reported, true) {
                            tracing::error!(%table,
                                "the publication carries a table that is not the outbox; its rows are ignored (ALTER PUBLICATION … DROP TABLE)");
                        }
                        return Ok(());
                    }
                    // The relay's own writes (rows it parked or stepped
                    // aside) are the table path's, not the stream's.
                    if written_by_relay(&row) {
                        return Ok(());
                    }
                    let row = outbox_row(row)?;
                    let tx = self.open.ok_or(StreamError::Orphan)?;
                    self.progress.sent(tx)?;
                    self.ready.push((tx, row));
                }
                // Type and origin messages; updates, deletes and truncates
                // are not published (publish = 'insert').
                Message::Other(_) => {}
            },
            ReplicationEvent::Commit { end_lsn, .. } => {
                let tx = self.open.take().ok_or(StreamError::Orphan)?;
                self.progress.commit(tx, Lsn(end_lsn.as_u64()))?;
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

    /// Publishes the ready rows in waves of at most one record per
    /// aggregate, so that a record that fails is settled before any later
    /// record of its aggregate is sent. A record the broker did not take,
    /// and every later record of its aggregate, steps aside; so do the
    /// records of aggregates that have a row stepped aside already. Then the
    /// cleanup, and the confirmation of what is delivered or stepped aside.
    #[tracing::instrument(skip_all, fields(rows, published, aside), err)]
    async fn publish(&mut self, client: &ReplicationClient) -> Result<(), StreamError> {
        let ready = std::mem::take(&mut self.ready);
        let span = tracing::Span::current();
        span.record("rows", ready.len());
        let mut blocked = self.blocked_aggregates(&ready).await?;
        let mut aside: Vec<(usize, Option<String>)> = Vec::new();
        let mut published: Vec<Delivery> = Vec::with_capacity(ready.len());
        let mut waiting: Vec<usize> = Vec::with_capacity(ready.len());
        for (i, (_, row)) in ready.iter().enumerate() {
            if blocked.contains(&key(row)) {
                aside.push((i, None));
            } else {
                waiting.push(i);
            }
        }
        let started = Instant::now();
        while !waiting.is_empty() {
            let (wave, later) = next_wave(&ready, waiting);
            let send_by = self
                .leader
                .send_deadline_renewed(self.settings.delivery_timeout)
                .await?;
            let rows: Vec<&OutboxRow> = wave.iter().map(|&i| &ready[i].1).collect();
            let outcomes = self.publisher.publish(&rows, send_by).await;
            for (&i, outcome) in wave.iter().zip(outcomes) {
                let (tx, row) = &ready[i];
                match outcome {
                    Outcome::Published(position) => {
                        published.push(Delivery::of(row, position));
                        self.progress.delivered(*tx)?;
                    }
                    Outcome::Poison(error) => {
                        // Retrying from the WAL would fail the same way for
                        // ever: park it, and hold its aggregate's later rows
                        // as poll mode does (docs/relay.md, "Poison rows").
                        tracing::error!(outbox.id = %row.id, error.message = %error,
                            "row cannot be published; parked, and the later rows of its aggregate wait until it is un-parked (docs/relay.md)");
                        self.leader
                            .run(async |conn| store::park_from_wal(conn, row, &error).await)
                            .await?;
                        metrics::counter!("relay_publish_failures_total", "kind" => "poison")
                            .increment(1);
                        metrics::counter!("outbox_parked_total").increment(1);
                        self.progress.delivered(*tx)?;
                        blocked.insert(key(row));
                        self.expect_aside(Instant::now() + self.settings.max_backoff);
                    }
                    Outcome::Transient(error) => {
                        metrics::counter!("relay_publish_failures_total", "kind" => "transient")
                            .increment(1);
                        blocked.insert(key(row));
                        aside.push((i, Some(error)));
                    }
                    Outcome::Withheld => {
                        metrics::counter!("relay_withheld_rows_total").increment(1);
                        blocked.insert(key(row));
                        aside.push((i, Some("withheld: the lease ran short".to_owned())));
                    }
                }
            }
            waiting = Vec::with_capacity(later.len());
            for i in later {
                if blocked.contains(&key(&ready[i].1)) {
                    aside.push((i, None));
                } else {
                    waiting.push(i);
                }
            }
        }
        metrics::histogram!("relay_batch_publish_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        metrics::counter!("outbox_published_total").increment(published.len() as u64);
        span.record("published", published.len());
        span.record("aside", aside.len());
        if !aside.is_empty() {
            self.step_aside(&ready, aside).await?;
        }
        self.clean_up(published).await?;
        let confirmable = self.progress.confirmable();
        client.update_applied_lsn(wire(confirmable));
        metrics::gauge!("relay_cdc_confirmed_lsn").set(confirmable.0 as f64);
        Ok(())
    }

    /// The aggregates among `ready`'s that have a row stepped aside.
    async fn blocked_aggregates(
        &mut self,
        ready: &[(TxId, OutboxRow)],
    ) -> Result<HashSet<(String, String)>, StreamError> {
        if !self.holds_back {
            return Ok(HashSet::new());
        }
        let aggregates: HashSet<(&str, &str)> = ready
            .iter()
            .map(|(_, row)| (row.aggregatetype.as_str(), row.aggregateid.as_str()))
            .collect();
        Ok(self
            .leader
            .run(async |conn| store::blocked_aggregates(conn, &aggregates).await)
            .await?)
    }

    /// Writes the records of `aside` (indices into `ready`, with the error
    /// of those that failed) into the table, in stream order; from then on
    /// they are durable there and count as delivered.
    async fn step_aside(
        &mut self,
        ready: &[(TxId, OutboxRow)],
        mut aside: Vec<(usize, Option<String>)>,
    ) -> Result<(), StreamError> {
        aside.sort_by_key(|(i, _)| *i);
        let rows: Vec<Aside<'_>> = aside
            .iter()
            .map(|(i, error)| Aside {
                row: &ready[*i].1,
                error: error.as_deref(),
            })
            .collect();
        let max_wait = self.settings.max_backoff;
        self.leader
            .run(async |conn| store::step_aside(conn, &rows, max_wait).await)
            .await?;
        let failed = aside.iter().filter(|(_, error)| error.is_some()).count();
        if failed > 0 {
            tracing::warn!(
                rows = failed,
                held = aside.len() - failed,
                error.message = aside.iter().find_map(|(_, e)| e.as_deref()),
                "the broker did not take these records; they step aside into the outbox table with their aggregates' later records and are retried with a backoff (docs/relay.md, \"Stepped-aside rows in CDC mode\")"
            );
        }
        metrics::counter!("relay_cdc_stepped_aside_total").increment(aside.len() as u64);
        for (i, _) in &aside {
            self.progress.delivered(ready[*i].0)?;
        }
        self.expect_aside(Instant::now());
        Ok(())
    }

    /// The table holds stepped-aside or parked rows now: they hold back
    /// their aggregates, and the table path looks at them by `at`.
    fn expect_aside(&mut self, at: Instant) {
        self.holds_back = true;
        self.aside_due = Some(self.aside_due.map_or(at, |due| due.min(at)));
    }

    /// The table path: sends the stepped-aside rows that are due, each the
    /// earliest of its aggregate, as poll mode sends its rows.
    #[tracing::instrument(skip_all, fields(rows, published), err)]
    async fn publish_stepped_aside(
        &mut self,
        client: &ReplicationClient,
    ) -> Result<(), StreamError> {
        let limit = i64::try_from(self.settings.batch_size).unwrap_or(i64::MAX);
        let rows = self
            .leader
            .run(async |conn| store::fetch_stepped_aside(conn, limit).await)
            .await?;
        tracing::Span::current().record("rows", rows.len());
        if rows.is_empty() {
            return self.look_for_stepped_aside().await;
        }
        let recording = Recording {
            // The relay wrote these rows itself in delete-in-transaction
            // cleanup: they go once published.
            after_publish: self.settings.after_publish.unwrap_or(AfterPublish::Delete),
            // A row the stream parks is parked at once; so is one here.
            max_attempts: 1,
            max_wait: self.settings.max_backoff,
            delivery_timeout: self.settings.delivery_timeout,
        };
        let outcome = relay::publish_rows(
            &mut self.leader,
            &rows,
            &recording,
            self.publisher,
            &mut self.log,
        )
        .await?;
        // Later rows of the same aggregates may be eligible now.
        let next = match outcome {
            BatchOutcome::Published(_) => Duration::ZERO,
            _ => ASIDE_MIN_WAIT,
        };
        self.aside_due = Some(Instant::now() + next);
        // Nothing of the stream's changed, but an idle stream confirms here too.
        client.update_applied_lsn(wire(self.progress.confirmable()));
        Ok(())
    }

    /// Whether the table holds stepped-aside or parked rows, and when to
    /// look again: when the next is due; while only parked rows are left,
    /// every `--max-backoff`, to notice one un-parked.
    async fn look_for_stepped_aside(&mut self) -> Result<(), StreamError> {
        let found = self
            .leader
            .run(async |conn| store::stepped_aside(conn).await)
            .await?;
        let wait = match found {
            store::SteppedAside {
                due_in: Some(due_in),
                ..
            } => Some(due_in.max(ASIDE_MIN_WAIT)),
            store::SteppedAside { parked: true, .. } => Some(self.settings.max_backoff),
            _ => None,
        };
        self.aside_due = wait.map(|wait| Instant::now() + wait);
        self.holds_back = found.due_in.is_some() || found.parked;
        Ok(())
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
        let log = &mut self.log;
        let found: HashSet<Uuid> = self
            .leader
            .run(async |conn| store::record_published(conn, &deliveries, after, log).await)
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
                "published, but its row was not found to mark or delete; if it is still in the table, it stays there (docs/relay.md, \"CDC mode\")");
            false
        });
        metrics::gauge!("relay_cdc_unclean_rows").set(self.unclean.len() as f64);
        self.cleanup_at = (!self.unclean.is_empty()).then(|| Instant::now() + CLEANUP_RETRY);
        Ok(())
    }
}

/// Splits `waiting` (indices into `ready`, in stream order) into the next
/// wave (the first of each aggregate) and the rest, both in stream order.
fn next_wave(ready: &[(TxId, OutboxRow)], waiting: Vec<usize>) -> (Vec<usize>, Vec<usize>) {
    let mut seen = HashSet::new();
    waiting
        .into_iter()
        .partition(|&i| seen.insert(key(&ready[i].1)))
}

fn key(row: &OutboxRow) -> (String, String) {
    (row.aggregatetype.clone(), row.aggregateid.clone())
}

/// A row the relay inserted itself: parked, or stepped aside.
fn written_by_relay(row: &std::collections::HashMap<String, Value>) -> bool {
    let parked = matches!(row.get("parked_at"), Some(Value::Text(_)));
    let stepped_aside = matches!(row.get("deferrals"), Some(Value::Text(n)) if n != "0");
    parked || stepped_aside
}

/// Sleeps until `at`, or for ever without one.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn wire(lsn: Lsn) -> pgwire_replication::Lsn {
    pgwire_replication::Lsn::from_u64(lsn.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(aggregate: &str, n: u8) -> OutboxRow {
        OutboxRow {
            id: Uuid::from_bytes([n; 16]),
            aggregatetype: "pedido".to_owned(),
            aggregateid: aggregate.to_owned(),
            event_type: "PedidoCriado".to_owned(),
            payload: "{}".to_owned(),
            traceparent: None,
            tracingspancontext: None,
            seq: i64::from(n),
            attempts: 0,
        }
    }

    #[test]
    fn a_wave_holds_one_record_per_aggregate_in_stream_order() {
        let mut progress = Progress::default();
        let tx = progress.begin().unwrap();
        let ready: Vec<(TxId, OutboxRow)> =
            [("a", 0), ("b", 1), ("a", 2), ("c", 3), ("a", 4), ("b", 5)]
                .into_iter()
                .map(|(aggregate, n)| (tx, row(aggregate, n)))
                .collect();
        let (first, rest) = next_wave(&ready, (0..ready.len()).collect());
        assert_eq!(
            (first.clone(), rest.clone()),
            (vec![0, 1, 3], vec![2, 4, 5])
        );
        let (second, rest) = next_wave(&ready, rest);
        assert_eq!((second, rest.clone()), (vec![2, 5], vec![4]));
        let (third, rest) = next_wave(&ready, rest);
        assert_eq!((third, rest), (vec![4], vec![]));
    }

    #[test]
    fn only_rows_the_relay_parked_or_stepped_aside_are_its_own() {
        let columns = |parked: Value, deferrals: &str| {
            std::collections::HashMap::from([
                ("parked_at".to_owned(), parked),
                ("deferrals".to_owned(), Value::Text(deferrals.to_owned())),
            ])
        };
        assert!(!written_by_relay(&columns(Value::Null, "0")));
        assert!(written_by_relay(&columns(
            Value::Text("2026-12-06".into()),
            "0"
        )));
        assert!(written_by_relay(&columns(Value::Null, "1")));
    }
}

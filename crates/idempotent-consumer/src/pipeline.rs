//! Processing consecutive records of one partition, in order. A single
//! record is a batch of one; there is no other path.
//!
//! 1. Parse every record (header names, the `id` header, then the handler's
//!    own checks): an invalid record goes to the DLT in its place.
//! 2. Each run of valid records is one transaction: the dedupe rows first
//!    (`insert … on conflict do nothing`; an id not inserted is a duplicate),
//!    then the handler's effect for the claimed ones, then commit.
//! 3. A transaction that fails for a reason of its own is retried by the
//!    retry policy (3 × 1 s); a run that keeps failing is split into single
//!    records, so that only the record at fault is dead-lettered as
//!    `retries-exhausted`. A database that cannot be reached is waited for
//!    instead, however long, and never counts as an attempt, unless the run
//!    keeps failing that way while the database answers.
//! 4. Cancellation (revoke, shutdown, the circuit opening) lets the attempt
//!    in flight end and stops: the outcomes returned are those of the
//!    finished prefix of the batch, and nothing after an unfinished record
//!    is ever processed.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use service_support::telemetry;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgPool, Postgres};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};
use uuid::Uuid;

use super::database::Database;
use super::dlt_producer::DltProducer;
use super::failure::{DatabaseFailure, DltReason, Failure, InvalidMessage};
use super::handler::{Claimed, Handler, Verdict};
use super::health::Health;
use super::record::Record;
use super::retry::{AttemptError, GaveUp, RetryPolicy};

/// A run that fails as "unavailable" this many times in a row, each time
/// right after the database answered the probe, is failing for a reason of
/// its own (a record that exceeds a server limit, class 53, or breaks the
/// protocol, 08P01): from then on the failure counts as an attempt, so the
/// record ends in the DLT instead of holding its partition for ever.
const UNAVAILABLE_WHILE_ANSWERING: u32 = 5;

/// What happened to a finished record; its offset may be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Applied, with the handler's outcome name.
    Applied(&'static str),
    /// Its message id was processed before: no effect.
    Duplicate,
    DeadLettered(DltReason),
}

/// Everything a partition worker needs to process its records.
#[derive(Debug)]
pub struct Pipeline<H> {
    pub handler: H,
    pub database: Arc<Database>,
    pub dlt: DltProducer,
    /// For message-scoped transient failures.
    pub retry: RetryPolicy,
    pub health: Health,
    /// The parent of every partition's token: cancelled when the circuit
    /// opens (and on shutdown).
    pub consuming: CancellationToken,
}

/// How a record of a committed transaction finished: with its outcome, or
/// refused by the handler and still to be dead-lettered.
#[derive(Debug)]
enum Committed {
    Finished(Outcome),
    Refused(InvalidMessage),
}

/// A record that parsed, with its message id and its processing span.
struct Valid<'a, M> {
    record: &'a Record,
    span: &'a Span,
    id: Uuid,
    message: M,
}

/// Puts how a record finished on its span: `entrega.outcome` (`applied`,
/// `duplicate`, `dead-lettered`), the handler's effect or the DLT reason.
fn record_outcome(span: &Span, outcome: &Outcome) {
    match outcome {
        Outcome::Applied(effect) => {
            span.record("entrega.outcome", "applied");
            span.record("entrega.effect", *effect);
        }
        Outcome::Duplicate => {
            span.record("entrega.outcome", "duplicate");
        }
        Outcome::DeadLettered(reason) => {
            span.record("entrega.outcome", "dead-lettered");
            span.record("entrega.dlt.reason", reason.as_str());
            span.record("otel.status_code", "ERROR");
        }
    }
}

impl<H: Handler> Pipeline<H> {
    /// Processes `batch` (consecutive records of one partition) and returns
    /// the outcomes of the records finished, in order: all of them, or a
    /// prefix when `cancel` stopped the work.
    pub async fn process(&self, batch: &[Record], cancel: &CancellationToken) -> Vec<Outcome> {
        let spans: Vec<Span> = batch.iter().map(Record::span).collect();
        let parsed: Vec<Result<Valid<'_, H::Message>, InvalidMessage>> = batch
            .iter()
            .zip(&spans)
            .map(|(record, span)| self.parse(record, span))
            .collect();
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut index = 0;
        while index < batch.len() && !cancel.is_cancelled() {
            let started = Instant::now();
            let end = match &parsed[index] {
                Err(_) => index + 1,
                Ok(_) => (index..batch.len())
                    .find(|&i| parsed[i].is_err())
                    .unwrap_or(batch.len()),
            };
            let done = match &parsed[index] {
                Err(invalid) => {
                    let span = &spans[index];
                    tracing::warn!(parent: span, reason = invalid.reason.as_str(), detail = %invalid.detail, "invalid record");
                    self.dead_letter(&batch[index], &Failure::invalid(invalid), cancel)
                        .instrument(span.clone())
                        .await
                }
                Ok(_) => {
                    let run: Vec<&Valid<'_, H::Message>> = parsed[index..end]
                        .iter()
                        .filter_map(|p| p.as_ref().ok())
                        .collect();
                    self.apply_run(&run, cancel).await
                }
            };
            let finished = done.len();
            for (outcome, span) in done.iter().zip(&spans[index..]) {
                record_outcome(span, outcome);
            }
            self.account(&done, started.elapsed());
            outcomes.extend(done);
            if finished < end - index {
                break;
            }
            index = end;
        }
        // Stopped (shutdown, rebalance, circuit): the rest is delivered again.
        for span in &spans[outcomes.len()..] {
            span.record("entrega.outcome", "unfinished");
        }
        outcomes
    }

    fn parse<'a>(
        &self,
        record: &'a Record,
        span: &'a Span,
    ) -> Result<Valid<'a, H::Message>, InvalidMessage> {
        let id = record.message_id()?;
        let message = self.handler.parse(record)?;
        Ok(Valid {
            record,
            span,
            id,
            message,
        })
    }

    /// One transaction for `run`, retried; when it keeps failing, one
    /// record at a time, so that only the record at fault is dead-lettered.
    async fn apply_run(
        &self,
        run: &[&Valid<'_, H::Message>],
        cancel: &CancellationToken,
    ) -> Vec<Outcome> {
        if let [one] = run {
            return self.apply_one(one, cancel).await;
        }
        match self.apply_with_retries(run, cancel).await {
            Ok(committed) => self.settle(run, committed, cancel).await,
            Err(GaveUp::Cancelled) => Vec::new(),
            Err(GaveUp::Exhausted { error, .. }) => {
                tracing::warn!(records = run.len(), error.message = %error,
                    "the batch keeps failing: applying its records one by one");
                let mut outcomes = Vec::with_capacity(run.len());
                for valid in run {
                    let done = self.apply_one(valid, cancel).await;
                    if done.is_empty() {
                        break;
                    }
                    outcomes.extend(done);
                }
                outcomes
            }
        }
    }

    /// A batch of one: its transaction retried, then the DLT.
    async fn apply_one(
        &self,
        valid: &Valid<'_, H::Message>,
        cancel: &CancellationToken,
    ) -> Vec<Outcome> {
        match self.apply_with_retries(&[valid], cancel).await {
            Ok(committed) => self.settle(&[valid], committed, cancel).await,
            Err(GaveUp::Cancelled) => Vec::new(),
            Err(GaveUp::Exhausted { error, attempts }) => {
                let span = valid.span;
                tracing::error!(parent: span, attempts, error.cause_chain = ?error, error.message = %error, "retries exhausted");
                self.dead_letter(
                    valid.record,
                    &Failure::retries_exhausted(&error, attempts),
                    cancel,
                )
                .instrument(span.clone())
                .await
            }
        }
    }

    /// The outcomes of a committed run, in order: a refused record is
    /// dead-lettered in its place. Stops at a dead letter that could not be
    /// published (cancelled): the records after it were applied, and are
    /// duplicates when delivered again.
    async fn settle(
        &self,
        run: &[&Valid<'_, H::Message>],
        committed: Vec<Committed>,
        cancel: &CancellationToken,
    ) -> Vec<Outcome> {
        let mut outcomes = Vec::with_capacity(committed.len());
        for (valid, committed) in run.iter().zip(committed) {
            match committed {
                Committed::Finished(outcome) => outcomes.push(outcome),
                Committed::Refused(invalid) => {
                    let span = valid.span;
                    tracing::warn!(parent: span, reason = invalid.reason.as_str(), detail = %invalid.detail, "record refused by the handler");
                    let done = self
                        .dead_letter(valid.record, &Failure::invalid(&invalid), cancel)
                        .instrument(span.clone())
                        .await;
                    if done.is_empty() {
                        break;
                    }
                    outcomes.extend(done);
                }
            }
        }
        outcomes
    }

    async fn apply_with_retries(
        &self,
        run: &[&Valid<'_, H::Message>],
        cancel: &CancellationToken,
    ) -> Result<Vec<Committed>, GaveUp<sqlx::Error>> {
        let (first, last) = (run[0].record, run[run.len() - 1].record);
        // A child of the first record's span, linked to the others': one
        // transaction serves them all.
        let span = tracing::info_span!(
            parent: run[0].span,
            "transaction",
            partition = first.partition,
            first_offset = first.offset,
            last_offset = last.offset,
            records = run.len(),
            attempts = tracing::field::Empty,
        );
        for valid in &run[1..] {
            telemetry::link(&span, valid.span);
        }
        let after_outage = AtomicBool::new(false);
        let attempts = AtomicU32::new(0);
        let result = self
            .retry
            .run(cancel, |attempt| {
                let after_outage = &after_outage;
                attempts.store(attempt, Ordering::Relaxed);
                async move {
                    let mut failed_after_an_answer = 0;
                    loop {
                        // A retry draws a connection that answers: after a
                        // database restart every pooled one is dead.
                        let live = attempt > 1 || after_outage.load(Ordering::Relaxed);
                        let error = match self.transact(run, live).await {
                            Ok(outcomes) => return Ok(outcomes),
                            Err(error) => error,
                        };
                        let blame = match DatabaseFailure::of(&error) {
                            DatabaseFailure::Unavailable
                                if failed_after_an_answer >= UNAVAILABLE_WHILE_ANSWERING =>
                            {
                                tracing::warn!(error.message = %error, failed_after_an_answer,
                                    "the run keeps failing as \"unavailable\" while the database answers: blamed on the records");
                                DatabaseFailure::MessageScoped
                            }
                            blame => blame,
                        };
                        match blame {
                            DatabaseFailure::Unavailable => {
                                self.database.report_unavailable(&error);
                                self.database
                                    .wait_until_available(cancel)
                                    .await
                                    .map_err(|_| AttemptError::Cancelled)?;
                                after_outage.store(true, Ordering::Relaxed);
                                failed_after_an_answer += 1;
                            }
                            DatabaseFailure::MessageScoped => {
                                if self.retry.retries.is_some_and(|retries| attempt <= retries) {
                                    metrics::counter!("consumer_retries_total").increment(1);
                                }
                                return Err(AttemptError::Failed(error));
                            }
                        }
                    }
                }
            })
            .instrument(span.clone())
            .await;
        // The last run a record was in decides: a batch that gave up is
        // applied again record by record.
        let attempts = attempts.load(Ordering::Relaxed);
        span.record("attempts", attempts);
        for valid in run {
            valid.span.record("entrega.attempts", attempts);
        }
        result
    }

    /// The transaction of `run`: dedupe rows first, then the effect.
    async fn transact(
        &self,
        run: &[&Valid<'_, H::Message>],
        live: bool,
    ) -> Result<Vec<Committed>, sqlx::Error> {
        let pool = self.database.pool();
        let mut connection = if live {
            live_connection(pool).await?
        } else {
            pool.acquire().await?
        };
        let mut tx = connection.begin().await?;
        let ids: Vec<Uuid> = run.iter().map(|valid| valid.id).collect();
        // Insert first, no SELECT before it: the primary key decides.
        let mut claimed: HashSet<Uuid> = sqlx::query_scalar(
            "insert into mensagem_processada (consumidor, mensagem_id)
             select $1, id from unnest($2::uuid[]) as id
             on conflict do nothing
             returning mensagem_id",
        )
        .bind(self.handler.consumer_name())
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .collect();
        // A message id is claimed once; a second copy in the run is a duplicate.
        let fresh: Vec<bool> = run.iter().map(|valid| claimed.remove(&valid.id)).collect();
        let messages: Vec<Claimed<'_, H::Message>> = run
            .iter()
            .zip(&fresh)
            .filter(|(_, fresh)| **fresh)
            .map(|(valid, _)| Claimed {
                id: valid.id,
                message: &valid.message,
                record: valid.record,
                span: valid.span,
            })
            .collect();
        let verdicts = self.handler.apply(&mut tx, &messages).await?;
        if verdicts.len() != messages.len() {
            return Err(sqlx::Error::Decode(
                format!(
                    "the handler returned {} verdicts for {} messages",
                    verdicts.len(),
                    messages.len()
                )
                .into(),
            ));
        }
        // A refused message leaves no claim behind: a redrive applies it.
        let refused: Vec<Uuid> = messages
            .iter()
            .zip(&verdicts)
            .filter(|(_, verdict)| matches!(verdict, Verdict::Refused(_)))
            .map(|(claimed, _)| claimed.id)
            .collect();
        if !refused.is_empty() {
            sqlx::query(
                "delete from mensagem_processada where consumidor = $1 and mensagem_id = any($2)",
            )
            .bind(self.handler.consumer_name())
            .bind(&refused)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        // Verdicts belong to the fresh messages only, in order.
        let mut verdicts = verdicts.into_iter();
        Ok(fresh
            .into_iter()
            .map(|fresh| match fresh.then(|| verdicts.next()).flatten() {
                Some(Verdict::Applied(outcome)) => Committed::Finished(Outcome::Applied(outcome)),
                Some(Verdict::Refused(invalid)) => Committed::Refused(invalid),
                None => Committed::Finished(Outcome::Duplicate),
            })
            .collect())
    }

    async fn dead_letter(
        &self,
        record: &Record,
        failure: &Failure,
        cancel: &CancellationToken,
    ) -> Vec<Outcome> {
        if self.dlt.publish(record, failure, cancel).await {
            vec![Outcome::DeadLettered(failure.reason)]
        } else {
            Vec::new()
        }
    }

    /// Metrics and the circuit, as soon as records are finished: a circuit
    /// that opens stops the very next record.
    fn account(&self, outcomes: &[Outcome], elapsed: Duration) {
        let each = elapsed / u32::try_from(outcomes.len().max(1)).unwrap_or(u32::MAX);
        for outcome in outcomes {
            let name: &'static str = match outcome {
                Outcome::Applied(name) => name,
                Outcome::Duplicate => {
                    metrics::counter!("consumer_duplicates_total").increment(1);
                    "duplicate"
                }
                Outcome::DeadLettered(reason) => {
                    metrics::counter!("consumer_dlt_total", "reason" => reason.as_str())
                        .increment(1);
                    "dead-lettered"
                }
            };
            metrics::counter!("consumer_processed_total", "outcome" => name).increment(1);
            metrics::histogram!("consumer_processing_duration_seconds").record(each.as_secs_f64());
            let dead = matches!(outcome, Outcome::DeadLettered(_));
            if self.health.circuit().record(dead) {
                metrics::gauge!("consumer_dlq_circuit_open").set(1.0);
                tracing::error!(
                    "more than the allowed share of recent records went to the DLT: consumption \
                     stopped, readiness fails; inspect with `dlt list`, fix, restart"
                );
                self.consuming.cancel();
            }
        }
    }
}

/// A pooled connection that answered a ping. The pool hands connections out
/// without one (a round trip per transaction saved), so after a database
/// restart or `pg_terminate_backend` its idle connections are all dead, and
/// retries that drew them one by one would fail without the database being
/// at fault. A retry therefore closes dead connections until one answers,
/// or the pool opens a new one.
async fn live_connection(pool: &PgPool) -> Result<PoolConnection<Postgres>, sqlx::Error> {
    let mut dead = 0;
    loop {
        let mut connection = pool.acquire().await?;
        match connection.ping().await {
            Ok(()) => {
                if dead > 0 {
                    tracing::info!(
                        closed = dead,
                        "closed dead pooled connections before a retry"
                    );
                }
                return Ok(connection);
            }
            // More dead ones than the pool can hold: the database itself is
            // failing.
            Err(error) if dead >= pool.options().get_max_connections() => return Err(error),
            Err(_) => {
                connection.close_on_drop();
                dead += 1;
            }
        }
    }
}

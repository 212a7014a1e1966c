//! Processing consecutive records of one partition, in order. A single
//! record is a batch of one; there is no other path.
//!
//! 1. Parse every record (header names, the `id` header, then the handler's
//!    own checks): an invalid record goes to the DLT in its place.
//! 2. Each run of valid records is one transaction: the dedupe rows first
//!    (`insert … on conflict do nothing`; an id not inserted is a duplicate),
//!    then the handler's effect for the claimed ones, then commit.
//! 3. A transaction that fails for a reason of its own is retried by the
//!    dead-letter policy ([`DeadLetterPolicy`]: 3 × 1 s); a run that keeps
//!    failing is split into single records, so that only the record at
//!    fault is dead-lettered as `retries-exhausted`. A database that cannot
//!    be reached is waited for instead ([`outage`](crate::outage)), however
//!    long, and never counts as an attempt.
//! 4. Cancellation (revoke, shutdown, the circuit opening) lets the attempt
//!    in flight end and stops: the outcomes returned are those of the
//!    finished prefix of the batch, and nothing after an unfinished record
//!    is ever processed.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use service_support::retry::{AttemptError, GaveUp};
use service_support::telemetry;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use crate::failure::{Failure, InvalidMessage};
use crate::handler::Handler;
use crate::outage::Outages;
use crate::outcome::{Outcome, record_outcome};
use crate::policy::DeadLetterPolicy;
use crate::record::Record;
use crate::transaction::{Committed, Valid, transact};

/// Everything a partition worker needs to process its records: the
/// service's handler and the dead-letter policy.
#[derive(Debug)]
pub struct Pipeline<H> {
    pub handler: H,
    pub policy: DeadLetterPolicy,
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
                    self.policy
                        .dead_letter(&batch[index], &Failure::invalid(invalid), cancel)
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
            self.policy.account(&done, started.elapsed());
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
                self.policy
                    .dead_letter(
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
                        .policy
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
        let outages = Outages::default();
        let attempts = AtomicU32::new(0);
        let retry = self.policy.retry;
        let database = self.policy.health.database();
        let result = retry
            .run(cancel, |attempt| {
                let outages = &outages;
                attempts.store(attempt, Ordering::Relaxed);
                async move {
                    let live = outages.need_live_connection(attempt);
                    let error = match transact(&self.handler, database.pool(), run, live).await {
                        Ok(committed) => return Ok(committed),
                        Err(error) => error,
                    };
                    let judged = outages.judge(database, error, cancel).await;
                    if matches!(judged, AttemptError::Failed(_))
                        && retry.retries.is_some_and(|retries| attempt <= retries)
                    {
                        metrics::counter!("consumer_retries_total").increment(1);
                    }
                    Err(judged)
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
}

//! Processing one record: parse, then in one transaction claim its id and
//! apply its effect; transient failures retried, the rest dead-lettered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::PgPool;

use crate::circuit::Circuit;
use crate::dlt::{self, Failure, SourceRecord};
use crate::event::{self, CONSUMER_NAME, DltReason, OrderPlaced, RecordView};
use crate::inventory::{self, Applied};

/// How transient failures are retried: `retries` more attempts after the
/// first, `backoff` apart.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub retries: u32,
    pub backoff: Duration,
}

/// What happened to one record. All but `Abandoned` let its offset be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    Reserved,
    Rejected,
    /// The order already had an outcome from another message: no effect.
    AlreadyDecided,
    /// The message id was processed before: no effect.
    Duplicate,
    DeadLettered(DltReason),
    /// Stopped before finishing (shutdown, partition revoked, circuit open):
    /// the offset is not stored and the record will be delivered again.
    Abandoned,
}

impl Handled {
    pub fn is_done(&self) -> bool {
        !matches!(self, Handled::Abandoned)
    }
}

#[derive(Clone)]
pub struct Processor {
    pub pool: PgPool,
    pub dlt_producer: FutureProducer,
    pub dlt_topic: String,
    pub group: String,
    pub retry: RetryPolicy,
    pub circuit: Arc<Circuit>,
}

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("dlt_topic", &self.dlt_topic)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// Sleeps `duration` in small steps; false if `stop` said so meanwhile.
async fn sleep_unless(duration: Duration, stop: &(dyn Fn() -> bool + Sync)) -> bool {
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        if stop() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50).min(deadline - Instant::now())).await;
    }
    !stop()
}

/// One transaction: the dedupe row first, then the effect.
async fn apply(pool: &PgPool, order: &OrderPlaced) -> Result<Handled, sqlx::Error> {
    let mut tx = pool.begin().await?;
    if !inventory::claim_message(&mut tx, CONSUMER_NAME, order.message_id).await? {
        tx.commit().await?;
        return Ok(Handled::Duplicate);
    }
    let applied = inventory::reserve(&mut tx, order).await?;
    tx.commit().await?;
    Ok(match applied {
        Applied::Reserved => Handled::Reserved,
        Applied::Rejected(reason) => {
            tracing::info!(order.id = %order.order_id, %reason, "reservation rejected");
            Handled::Rejected
        }
        Applied::AlreadyDecided => Handled::AlreadyDecided,
    })
}

impl Processor {
    /// Handles one record. `stop` is asked before each attempt and during
    /// waits; once it says yes the record is abandoned, never dead-lettered.
    pub async fn handle(&self, record: &SourceRecord, stop: &(dyn Fn() -> bool + Sync)) -> Handled {
        let started = Instant::now();
        let view = RecordView {
            key: record.key.as_deref(),
            value: record.value.as_deref(),
            headers: &record.headers,
        };
        let handled = match event::parse(&view) {
            Err(invalid) => {
                tracing::warn!(reason = invalid.reason.as_str(), detail = %invalid.detail, "invalid record");
                let failure = Failure {
                    reason: invalid.reason,
                    message: invalid.detail,
                    attempts: 1,
                };
                self.dead_letter(record, &failure, stop).await
            }
            Ok(order) => self.apply_with_retries(record, &order, stop).await,
        };
        self.account(&handled, started.elapsed());
        handled
    }

    async fn apply_with_retries(
        &self,
        record: &SourceRecord,
        order: &OrderPlaced,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Handled {
        let attempts = self.retry.retries + 1;
        for attempt in 1..=attempts {
            if stop() {
                return Handled::Abandoned;
            }
            match apply(&self.pool, order).await {
                Ok(handled) => return handled,
                Err(error) if attempt < attempts => {
                    metrics::counter!("consumer_retries_total").increment(1);
                    tracing::warn!(attempt, error.message = %error, "transient failure; retrying");
                    if !sleep_unless(self.retry.backoff, stop).await {
                        return Handled::Abandoned;
                    }
                }
                Err(error) => {
                    tracing::error!(attempts, error.cause_chain = ?error, error.message = %error, "retries exhausted");
                    let failure = Failure {
                        reason: DltReason::RetriesExhausted,
                        message: error.to_string(),
                        attempts,
                    };
                    return self.dead_letter(record, &failure, stop).await;
                }
            }
        }
        Handled::Abandoned
    }

    /// Publishes the dead-letter record and waits for the broker's
    /// acknowledgement, retrying until it comes or `stop` says so.
    async fn dead_letter(
        &self,
        record: &SourceRecord,
        failure: &Failure,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Handled {
        let dead = dlt::dead_letter(record, &self.group, failure);
        let headers = dead
            .headers
            .iter()
            .fold(OwnedHeaders::new(), |headers, (key, value)| {
                headers.insert(Header {
                    key,
                    value: value.as_deref(),
                })
            });
        loop {
            let mut outgoing = FutureRecord::to(&self.dlt_topic)
                .partition(dead.partition)
                .headers(headers.clone());
            if let Some(key) = &dead.key {
                outgoing = outgoing.key(key.as_slice());
            }
            if let Some(value) = &dead.value {
                outgoing = outgoing.payload(value.as_slice());
            }
            match self
                .dlt_producer
                .send(outgoing, Duration::from_secs(30))
                .await
            {
                Ok(_) => {
                    tracing::warn!(
                        reason = failure.reason.as_str(),
                        attempts = failure.attempts,
                        "record sent to the DLT"
                    );
                    return Handled::DeadLettered(failure.reason);
                }
                Err((error, _)) => {
                    tracing::error!(error.message = %error, "cannot publish to the DLT; retrying");
                    if !sleep_unless(Duration::from_secs(1), stop).await {
                        return Handled::Abandoned;
                    }
                }
            }
        }
    }

    fn account(&self, handled: &Handled, elapsed: Duration) {
        let outcome = match handled {
            Handled::Reserved => "reserved",
            Handled::Rejected => "rejected",
            Handled::AlreadyDecided => "already-decided",
            Handled::Duplicate => {
                metrics::counter!("consumer_duplicates_total").increment(1);
                "duplicate"
            }
            Handled::DeadLettered(reason) => {
                metrics::counter!("consumer_dlt_total", "reason" => reason.as_str()).increment(1);
                "dead-lettered"
            }
            Handled::Abandoned => return,
        };
        metrics::counter!("consumer_processed_total", "outcome" => outcome).increment(1);
        metrics::histogram!("consumer_processing_duration_seconds").record(elapsed.as_secs_f64());
        if self
            .circuit
            .record(matches!(handled, Handled::DeadLettered(_)))
        {
            metrics::gauge!("consumer_dlq_circuit_open").set(1.0);
            tracing::error!(
                "more than the allowed share of recent records went to the DLT: consumption stopped, \
                 readiness fails; inspect with `inventory-service dlt list`, fix, restart"
            );
        }
    }
}

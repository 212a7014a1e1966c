//! Processing one record: parse, then in one transaction claim its id and
//! apply its effect; transient failures retried, the rest dead-lettered.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgPool, Postgres};
use tracing::Instrument;

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

/// The span of one message: its id (from the header), topic, partition, offset.
fn message_span(record: &SourceRecord) -> tracing::Span {
    tracing::info_span!(
        "message",
        id = record.text_header("id").as_deref().unwrap_or("-"),
        topic = %record.topic,
        partition = record.partition,
        offset = record.offset,
    )
}

/// The outcome a processed message has.
fn handled(applied: &Applied) -> Handled {
    match applied {
        Applied::Reserved => Handled::Reserved,
        Applied::Rejected(_) => Handled::Rejected,
        Applied::AlreadyDecided => Handled::AlreadyDecided,
        Applied::Duplicate => Handled::Duplicate,
    }
}

/// How an attempt draws its database connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Draw {
    /// As the pool hands it out, unchecked: the first attempt, the hot path.
    AsPooled,
    /// Pinged first: a retry.
    Live,
}

impl Draw {
    fn for_attempt(first: bool) -> Self {
        if first { Draw::AsPooled } else { Draw::Live }
    }
}

/// A pooled connection that answered a ping. The pool hands connections out
/// without one (a round trip per transaction saved), so after a database
/// restart or `pg_terminate_backend` its idle connections are all dead, and
/// retries that drew them one by one would fail without the database being
/// at fault: with enough dead connections, a healthy record would exhaust
/// its retries and be dead-lettered. A retry therefore closes dead
/// connections until one answers, or the pool opens a new one.
async fn live_connection(pool: &PgPool) -> Result<PoolConnection<Postgres>, sqlx::Error> {
    let mut dead = 0;
    loop {
        let mut conn = pool.acquire().await?;
        match conn.ping().await {
            Ok(()) => {
                if dead > 0 {
                    tracing::info!(
                        closed = dead,
                        "closed dead pooled connections before a retry"
                    );
                }
                return Ok(conn);
            }
            // More dead ones than the pool can hold: the database itself is
            // failing, which the retry policy is there for.
            Err(error) if dead >= pool.options().get_max_connections() => return Err(error),
            Err(_) => {
                conn.close_on_drop();
                dead += 1;
            }
        }
    }
}

/// One transaction for the messages of `orders` (one, or several of one
/// partition), each with its own dedupe row.
async fn apply_batch(
    pool: &PgPool,
    connection: Draw,
    records: &[&SourceRecord],
    orders: &[OrderPlaced],
) -> Result<Vec<Handled>, sqlx::Error> {
    let mut conn = match connection {
        Draw::AsPooled => pool.acquire().await?,
        Draw::Live => live_connection(pool).await?,
    };
    let mut tx = conn.begin().await?;
    let applied = inventory::apply_orders(&mut tx, CONSUMER_NAME, orders).await?;
    tx.commit().await?;
    for ((record, order), applied) in records.iter().zip(orders).zip(&applied) {
        if let Applied::Rejected(reason) = applied {
            tracing::info!(parent: &message_span(record), order.id = %order.order_id, %reason, "reservation rejected");
        }
    }
    Ok(applied.iter().map(handled).collect())
}

/// One record's transaction: the dedupe row first, then the effect.
async fn apply(
    pool: &PgPool,
    connection: Draw,
    record: &SourceRecord,
    order: &OrderPlaced,
) -> Result<Handled, sqlx::Error> {
    let mut outcomes =
        apply_batch(pool, connection, &[record], std::slice::from_ref(order)).await?;
    Ok(outcomes.pop().unwrap_or(Handled::Abandoned))
}

impl Processor {
    /// Handles consecutive records of one partition, in order: runs of valid
    /// records share a transaction; an invalid record goes to the DLT in its
    /// place. A batch whose transaction keeps failing is retried record by
    /// record, so only the record at fault is dead-lettered. Returns one
    /// outcome per record; processing stops at the first `Abandoned`.
    pub async fn handle_batch(
        &self,
        records: &[SourceRecord],
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Vec<Handled> {
        if records.len() == 1 {
            return vec![self.handle(&records[0], stop).await];
        }
        let started = Instant::now();
        let parsed: Vec<Result<OrderPlaced, event::InvalidMessage>> = records
            .iter()
            .map(|record| {
                event::parse(&RecordView {
                    key: record.key.as_deref(),
                    value: record.value.as_deref(),
                    headers: &record.headers,
                })
            })
            .collect();
        let mut outcomes: Vec<Handled> = Vec::with_capacity(records.len());
        let mut index = 0;
        'records: while index < records.len() {
            let run_end = (index..records.len())
                .find(|&i| parsed[i].is_err())
                .unwrap_or(records.len());
            if run_end > index + 1 {
                let orders: Vec<OrderPlaced> = parsed[index..run_end]
                    .iter()
                    .filter_map(|p| p.as_ref().ok().cloned())
                    .collect();
                let run: Vec<&SourceRecord> = records[index..run_end].iter().collect();
                match self.apply_batch_with_retries(&run, &orders, stop).await {
                    Some(handled) => outcomes.extend(handled),
                    None if stop() => {
                        outcomes.push(Handled::Abandoned);
                        break 'records;
                    }
                    None => {
                        for (record, order) in records[index..run_end].iter().zip(&orders) {
                            let handled = self
                                .apply_with_retries(record, order, stop)
                                .instrument(message_span(record))
                                .await;
                            let abandoned = handled == Handled::Abandoned;
                            outcomes.push(handled);
                            if abandoned {
                                break 'records;
                            }
                        }
                    }
                }
                index = run_end;
                continue;
            }
            let record = &records[index];
            let handled = async {
                match &parsed[index] {
                    Ok(order) => self.apply_with_retries(record, order, stop).await,
                    Err(invalid) => {
                        tracing::warn!(reason = invalid.reason.as_str(), detail = %invalid.detail, "invalid record");
                        let failure = Failure {
                            reason: invalid.reason,
                            message: invalid.detail.clone(),
                            attempts: 1,
                        };
                        self.dead_letter(record, &failure, stop).await
                    }
                }
            }
            .instrument(message_span(record))
            .await;
            let abandoned = handled == Handled::Abandoned;
            outcomes.push(handled);
            if abandoned {
                break;
            }
            index += 1;
        }
        let each = started.elapsed() / u32::try_from(records.len()).unwrap_or(1);
        for handled in &outcomes {
            self.account(handled, each);
        }
        outcomes
    }

    /// A batch transaction with the retry policy; `None` when the retries
    /// ran out (the caller goes record by record) or `stop` said so.
    async fn apply_batch_with_retries(
        &self,
        records: &[&SourceRecord],
        orders: &[OrderPlaced],
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Option<Vec<Handled>> {
        for attempt in 0..=self.retry.retries {
            if stop() {
                return None;
            }
            match apply_batch(&self.pool, Draw::for_attempt(attempt == 0), records, orders).await {
                Ok(handled) => return Some(handled),
                Err(error) => {
                    metrics::counter!("consumer_retries_total").increment(1);
                    tracing::warn!(attempt = attempt + 1, records = orders.len(), error.message = %error, "batch failed");
                    if attempt < self.retry.retries && !sleep_unless(self.retry.backoff, stop).await
                    {
                        return None;
                    }
                }
            }
        }
        None
    }

    /// Handles one record. `stop` is asked before each attempt and during
    /// waits; once it says yes the record is abandoned, never dead-lettered.
    pub async fn handle(&self, record: &SourceRecord, stop: &(dyn Fn() -> bool + Sync)) -> Handled {
        self.handle_one(record, stop)
            .instrument(message_span(record))
            .await
    }

    async fn handle_one(&self, record: &SourceRecord, stop: &(dyn Fn() -> bool + Sync)) -> Handled {
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
            match apply(&self.pool, Draw::for_attempt(attempt == 1), record, order).await {
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

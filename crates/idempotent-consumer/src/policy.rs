//! The dead-letter policy: one value, decided here, for what happens to a
//! record that cannot be applied. A transient failure of its own is retried
//! by [`RetryPolicy`] (3 × 1 s by default); a record that still fails, or
//! that is invalid, is published to the DLT; every finished record counts
//! toward the DLQ circuit, which stops consumption when too many of the
//! recent ones were dead-lettered.

use std::time::Duration;

use service_support::retry::RetryPolicy;
use tokio_util::sync::CancellationToken;

use crate::dlt_producer::DltProducer;
use crate::failure::Failure;
use crate::health::Health;
use crate::outcome::Outcome;
use crate::record::Record;

/// Retries, the DLT producer and the circuit (in `health`), handed to the
/// pipeline as one.
#[derive(Debug)]
pub struct DeadLetterPolicy {
    /// For message-scoped transient failures.
    pub retry: RetryPolicy,
    pub dlt: DltProducer,
    /// Readiness, with the database's availability and the DLQ circuit.
    pub health: Health,
    /// The parent of every partition's token: cancelled when the circuit
    /// opens (and on shutdown).
    pub consuming: CancellationToken,
}

impl DeadLetterPolicy {
    /// Publishes `record` to the DLT with `failure`: its outcome, or
    /// nothing when cancelled first (the record is delivered again).
    pub(crate) async fn dead_letter(
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
    pub(crate) fn account(&self, outcomes: &[Outcome], elapsed: Duration) {
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

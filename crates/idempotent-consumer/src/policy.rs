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
        count(outcomes, elapsed);
        for outcome in outcomes {
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

/// The metrics of finished records, `elapsed` shared among them. A batch is
/// mostly one run of one outcome: one counter lookup per run, not per record.
fn count(outcomes: &[Outcome], elapsed: Duration) {
    let each = elapsed / u32::try_from(outcomes.len().max(1)).unwrap_or(u32::MAX);
    metrics::histogram!("consumer_processing_duration_seconds")
        .record_many(each.as_secs_f64(), outcomes.len());
    let processed = |(name, records): (&'static str, u64)| {
        metrics::counter!("consumer_processed_total", "outcome" => name).increment(records);
    };
    let mut run: Option<(&'static str, u64)> = None;
    for outcome in outcomes {
        let name: &'static str = match outcome {
            Outcome::Applied(name) => name,
            Outcome::Duplicate => {
                metrics::counter!("consumer_duplicates_total").increment(1);
                "duplicate"
            }
            Outcome::DeadLettered(reason) => {
                metrics::counter!("consumer_dlt_total", "reason" => reason.as_str()).increment(1);
                "dead-lettered"
            }
        };
        match &mut run {
            Some((running, records)) if *running == name => *records += 1,
            _ => {
                if let Some(ended) = run.replace((name, 1)) {
                    processed(ended);
                }
            }
        }
    }
    if let Some(ended) = run {
        processed(ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::DltReason;
    use metrics_exporter_prometheus::PrometheusBuilder;

    #[test]
    fn every_record_is_counted_under_its_outcome_in_runs_or_not() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let outcomes = [
            Outcome::Applied("reserved"),
            Outcome::Applied("reserved"),
            Outcome::Duplicate,
            Outcome::Applied("reserved"),
            Outcome::Applied("rejected"),
            Outcome::DeadLettered(DltReason::InvalidJson),
            Outcome::Applied("reserved"),
        ];
        metrics::with_local_recorder(&recorder, || {
            count(&outcomes, Duration::from_millis(70));
            count(&outcomes[..2], Duration::from_millis(2));
        });
        let text = handle.render();
        let value = |line: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(line)?.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {line} in\n{text}"))
        };
        assert_eq!(
            value(r#"consumer_processed_total{outcome="reserved"}"#),
            6.0
        );
        assert_eq!(
            value(r#"consumer_processed_total{outcome="rejected"}"#),
            1.0
        );
        assert_eq!(
            value(r#"consumer_processed_total{outcome="duplicate"}"#),
            1.0
        );
        assert_eq!(
            value(r#"consumer_processed_total{outcome="dead-lettered"}"#),
            1.0
        );
        assert_eq!(value("consumer_duplicates_total"), 1.0);
        assert_eq!(value("consumer_processing_duration_seconds_count"), 9.0);
        assert!((value("consumer_processing_duration_seconds_sum") - 0.072).abs() < 1e-9);
    }
}

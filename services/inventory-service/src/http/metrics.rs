//! Prometheus metrics: the exposition endpoint and this service's names.

use std::sync::Once;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use service_support::metrics::PrometheusHandle;

use super::AppState;

/// The process-wide recorder, with this service's metrics described.
pub fn recorder() -> PrometheusHandle {
    static DESCRIBED: Once = Once::new();
    let handle = service_support::metrics::recorder();
    DESCRIBED.call_once(|| {
        service_support::http::describe_metrics();
        metrics::describe_counter!(
            "consumer_processed_total",
            "Records finished, by outcome: reserved, rejected, already-decided, duplicate, dead-lettered"
        );
        metrics::describe_counter!("consumer_duplicates_total", "Records whose message id was processed before");
        metrics::describe_counter!("consumer_retries_total", "Retries after transient failures");
        metrics::describe_counter!("consumer_dlt_total", "Records sent to the DLT, by reason");
        metrics::describe_gauge!("consumer_lag", "High watermark minus committed offset, per partition");
        metrics::describe_histogram!(
            "consumer_processing_duration_seconds",
            metrics::Unit::Seconds,
            "Time to handle one record, retries and DLT publish included"
        );
        metrics::describe_gauge!("consumer_dlq_circuit_open", "1 once the DLQ circuit opened");
        metrics::describe_gauge!("consumer_assigned_partitions", "Partitions this consumer owns");
        metrics::describe_gauge!(
            "consumer_paused_partitions",
            "Owned partitions whose fetching is paused: back-pressure, database unavailable, circuit open, worker restarting"
        );
        metrics::describe_gauge!("consumer_database_available", "0 while the database cannot be reached and consumption waits for it");
        metrics::describe_counter!("consumer_worker_restarts_total", "Partition workers that died and were restarted from the last stored offset");
        metrics::describe_counter!("consumer_dlt_publish_failures_total", "Failed attempts to publish a dead letter (each is retried)");
        metrics::describe_counter!("consumer_dlt_truncated_total", "Dead letters too large for the broker, sent without their value");
        metrics::describe_counter!("retention_deleted_total", "mensagem_processada rows deleted by retention");
        // Every series exists from the start, at zero, so that rate() and
        // increase() in alerts see the first event instead of a new series.
        for reason in idempotent_consumer::DltReason::ALL {
            metrics::counter!("consumer_dlt_total", "reason" => reason.as_str()).absolute(0);
        }
        metrics::counter!("consumer_duplicates_total").absolute(0);
        metrics::counter!("consumer_retries_total").absolute(0);
        metrics::counter!("consumer_dlt_publish_failures_total").absolute(0);
        metrics::counter!("consumer_dlt_truncated_total").absolute(0);
        metrics::counter!("consumer_worker_restarts_total").absolute(0);
        metrics::gauge!("consumer_paused_partitions").set(0.0);
        metrics::gauge!("consumer_dlq_circuit_open").set(0.0);
        metrics::counter!("retention_deleted_total").absolute(0);
    });
    handle
}

/// Prometheus text exposition.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, service_support::metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
        .into_response()
}

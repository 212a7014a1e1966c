//! Prometheus metrics: the exposition endpoint and the per-request recorder.

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
    DESCRIBED.call_once(describe);
    handle
}

fn describe() {
    http_api::describe_metrics();
    idempotent_consumer::describe_metrics();
    metrics::describe_counter!(
        "orders_created_total",
        "Orders written (each with its outbox row)"
    );
    metrics::describe_counter!(
        "orders_cancelled_total",
        "Orders cancelled (each with its PedidoCancelado outbox row)"
    );
    metrics::describe_counter!(
        "outbox_rows_written_total",
        "Outbox rows written, by event type"
    );
    metrics::describe_counter!(
        "idempotent_replays_total",
        "Requests answered from a stored response for a repeated Idempotency-Key"
    );
    // Every series exists from the start, at zero (see the alerts).
    metrics::counter!("orders_created_total").absolute(0);
    metrics::counter!("idempotent_replays_total").absolute(0);
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

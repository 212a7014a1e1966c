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
        http_api::describe_metrics();
        idempotent_consumer::describe_metrics();
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

//! Readiness (liveness is `http_api::health::healthz`).

use axum::Json;
use axum::extract::State;
use http_api::health::{self, Health};
use http_api::{ApiError, Problem};

use super::AppState;

/// Readiness: the database answers, and the status consumer (when it runs)
/// is doing its job.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready to take orders", body = Health),
        (status = 503, description = "The database does not answer, or the status consumer is not consuming (DLQ circuit open, database unreachable, dead letters not publishable, a partition worker died recently), with every reason", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    let problems = state
        .consumer_health
        .as_ref()
        .map(idempotent_consumer::Health::problems)
        .unwrap_or_default();
    health::ready(&state.pool, problems).await
}

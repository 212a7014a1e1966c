//! Readiness (liveness is `http_api::health::healthz`).

use axum::Json;
use axum::extract::State;
use http_api::health::{self, Health};
use http_api::{ApiError, Problem};

use super::AppState;

/// Readiness: the consumer is doing its job (DLQ circuit closed, database
/// reachable, dead letters publishable, no partition worker lost in the last
/// minute) and the database answers.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Consuming", body = Health),
        (status = 503, description = "Not consuming, with every reason: the DLQ circuit is open, the database does not answer, dead letters cannot be published, or a partition worker died recently", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    health::ready(&state.pool, state.health.problems()).await
}

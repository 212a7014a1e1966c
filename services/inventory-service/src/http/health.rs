//! Liveness and readiness.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use service_support::http::{ApiError, Problem};
use utoipa::ToSchema;

use super::AppState;

const READINESS_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Health {
    #[schema(example = "ok")]
    status: &'static str,
}

/// Liveness: the process is up and serving HTTP.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process is up", body = Health)))]
pub(super) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Readiness: the consumer is doing its job (DLQ circuit closed, database
/// reachable, dead letters publishable, no partition worker lost in the last
/// minute) and the database answers.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Consuming", body = Health),
        (status = 503, description = "Not consuming, with every reason: the DLQ circuit is open, the database does not answer, dead letters cannot be published, or a partition worker died recently", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    let problems = state.health.problems();
    if !problems.is_empty() {
        return Err(ApiError::Unavailable(problems.join("; ")));
    }
    let ping = sqlx::query("select 1").execute(&state.pool);
    match tokio::time::timeout(READINESS_TIMEOUT, ping).await {
        Ok(Ok(_)) => Ok(Json(Health { status: "ok" })),
        Ok(Err(error)) => Err(ApiError::Unavailable(format!(
            "the database does not answer: {error}"
        ))),
        Err(_) => Err(ApiError::Unavailable(
            "the database did not answer in time".to_owned(),
        )),
    }
}

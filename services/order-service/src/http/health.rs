//! Liveness and readiness.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use service_support::http::ApiError;
use service_support::http::Problem;

/// How long readiness waits for the database before saying no.
const READINESS_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Health {
    #[schema(example = "ok")]
    pub status: &'static str,
}

/// Liveness: the process is up and serving HTTP.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process is up", body = Health)))]
pub(super) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Readiness: the database answers, and the status consumer (when it runs)
/// is doing its job.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready to take orders", body = Health),
        (status = 503, description = "The database does not answer, or the status consumer is not consuming (DLQ circuit open, database unreachable, dead letters not publishable, a partition worker died recently), with every reason", body = Problem, content_type = "application/problem+json"),
    ))]
pub(super) async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    if let Some(health) = &state.consumer_health {
        let problems = health.problems();
        if !problems.is_empty() {
            return Err(ApiError::Unavailable(problems.join("; ")));
        }
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

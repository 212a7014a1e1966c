//! Liveness, and the part of readiness every service shares: no reason
//! not to be ready, and a database that answers in time.

use std::time::Duration;

use axum::Json;
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;

use crate::error::ApiError;

/// How long readiness waits for the database before saying no.
const READINESS_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    status: &'static str,
}

/// Liveness: the process is up and serving HTTP.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process is up", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// Ready when `problems` is empty (each a reason the service is not doing
/// its job) and `pool`'s database answers within 2 s; otherwise a 503 with
/// every reason.
pub async fn ready(pool: &PgPool, problems: Vec<String>) -> Result<Json<Health>, ApiError> {
    if !problems.is_empty() {
        return Err(ApiError::Unavailable(problems.join("; ")));
    }
    let ping = sqlx::query!("select 1 as one").fetch_one(pool);
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

//! /metrics, /healthz and /readyz.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use service_support::metrics::PrometheusHandle;

use crate::relay::RelayStatus;

#[derive(Debug, Clone)]
pub struct HttpState {
    pub metrics: PrometheusHandle,
    pub relay: Arc<RelayStatus>,
    /// Set once the target topics were found as configured.
    pub topics_ok: Arc<AtomicBool>,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, service_support::metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
}

/// Ready when the topics were checked and the database answers: a standby
/// is ready too (it is ready to take over).
async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    let topics = state.topics_ok.load(Ordering::Relaxed);
    let database = state.relay.database_ok.load(Ordering::Relaxed);
    let role = if state.relay.leader.load(Ordering::Relaxed) {
        "leader"
    } else {
        "standby"
    };
    let status = if topics && database {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(serde_json::json!({"topics": topics, "database": database, "role": role})),
    )
}

//! The HTTP API: one state, each module's routes, and the layers around them.

mod health; // /readyz
mod metrics; // /metrics and this service's metric names
mod orders; // POST /orders, GET /orders/{id}, POST /orders/{id}/cancel

use std::time::Duration;

use axum::Router;
use http_api::{with_common_layers, with_openapi_pages};
use idempotent_consumer::Health;
use service_support::metrics::PrometheusHandle;
use sqlx::PgPool;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use crate::status::OrderStatus;
pub use http_api::ApiError;
pub use metrics::recorder as metrics_recorder;
pub use orders::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, OrderResponse};

/// What every handler may use.
#[derive(Clone, Debug)]
pub struct AppState {
    pub pool: PgPool,
    pub metrics: PrometheusHandle,
    /// The status consumer's health, when it runs.
    pub consumer_health: Option<Health>,
    /// Whether the outbox rows are deleted in the order's own transaction.
    pub outbox_cleanup: outbox::Cleanup,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "entrega order service",
        description = "Places orders. Each order is written with its items and one `PedidoCriado` \
                       outbox row in one PostgreSQL transaction; the relay publishes the row to \
                       Kafka topic `pedido.eventos`. The inventory's outcome comes back on \
                       `estoque.eventos` and moves the order from `PENDING` to `CONFIRMED` or \
                       `REJECTED`. Every error is `application/problem+json` (RFC 9457)."
    ),
    tags(
        (name = "orders", description = "Placing and reading orders"),
        (name = "operations", description = "Health, readiness, metrics and this document"),
    )
)]
struct ApiDoc;

/// The whole application: routes and the OpenAPI document built from the
/// same declarations (so neither can list a route the other lacks), the docs
/// pages, and the layers every request passes.
pub fn router(state: AppState, request_timeout: Duration) -> Router {
    let (routes, document) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(orders::create_order))
        .routes(routes!(orders::get_order))
        .routes(routes!(orders::cancel_order))
        .routes(routes!(http_api::health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(metrics::metrics))
        .split_for_parts();
    let routes = with_openapi_pages(routes, document).with_state(state);
    with_common_layers(routes, request_timeout)
}

//! The admin and inspection API: stock, reservations, health, metrics.

mod health; // /readyz
mod metrics; // /metrics and the service's metric names
mod reservations; // GET /reservations/{orderId}
mod stock; // PUT and GET /stock/{sku}

use std::time::Duration;

use axum::Router;
use axum::extract::FromRef;
use http_api::{AdminToken, declare_admin_scheme, with_common_layers, with_openapi_pages};
use service_support::metrics::PrometheusHandle;
use sqlx::PgPool;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use metrics::recorder as metrics_recorder;

use idempotent_consumer::Health;

/// What every handler may use.
#[derive(Clone, Debug)]
pub struct AppState {
    pub pool: PgPool,
    pub metrics: PrometheusHandle,
    /// The consumer's health, for readiness.
    pub health: Health,
    /// What admin writes (PUT /stock) must present.
    pub admin: AdminToken,
}

impl FromRef<AppState> for AdminToken {
    fn from_ref(state: &AppState) -> Self {
        state.admin.clone()
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "entrega inventory service",
        description = "Stock and reservation outcomes. Reservations are made by the consumer of \
                       `pedido.eventos`; this API sets stock and shows the results. Setting stock needs the admin \
                       bearer token. Every error is `application/problem+json` (RFC 9457)."
    ),
    tags(
        (name = "stock", description = "Stock per sku"),
        (name = "reservations", description = "Reservation outcomes per order"),
        (name = "operations", description = "Health, readiness, metrics and this document"),
    )
)]
struct ApiDoc;

pub fn router(state: AppState, request_timeout: Duration) -> Router {
    let (routes, document) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(stock::put_stock, stock::get_stock))
        .routes(routes!(reservations::get_reservation))
        .routes(routes!(http_api::health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(metrics::metrics))
        .split_for_parts();
    let mut document = document;
    declare_admin_scheme(&mut document);
    let routes = with_openapi_pages(routes, document).with_state(state);
    with_common_layers(routes, request_timeout)
}

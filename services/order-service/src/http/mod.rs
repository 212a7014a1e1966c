//! The HTTP API: one state, each module's routes, and the layers around them.

mod error; // problem+json errors, one enum
mod health; // /healthz and /readyz
mod json; // the JSON body extractor and its rejections
mod metrics; // /metrics and the request recorder
mod orders; // POST /orders, GET /orders/{id}

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::HeaderName;
use axum::response::IntoResponse;
use axum::routing::get;
use service_support::metrics::PrometheusHandle;
use sqlx::PgPool;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa::openapi::OpenApi as OpenApiDocument;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use utoipa_scalar::{Scalar, Servable};

pub use error::{ApiError, PROBLEM_JSON, Problem};
pub use json::BODY_LIMIT;
pub use metrics::recorder as metrics_recorder;
pub use orders::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED, OrderResponse};

/// What every handler may use.
#[derive(Clone, Debug)]
pub struct AppState {
    pub pool: PgPool,
    pub metrics: PrometheusHandle,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "entrega order service",
        description = "Places orders. Each order is written with its items and one `PedidoCriado` \
                       outbox row in one PostgreSQL transaction; the relay publishes the row to \
                       Kafka topic `pedido.eventos`. Every error is `application/problem+json` \
                       (RFC 9457)."
    ),
    tags(
        (name = "orders", description = "Placing and reading orders"),
        (name = "operations", description = "Health, readiness, metrics and this document"),
    )
)]
struct ApiDoc;

/// The OpenAPI document and the router it describes, built from the same
/// route declarations so that neither can list a route the other lacks.
fn api() -> (Router<AppState>, OpenApiDocument) {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(orders::create_order))
        .routes(routes!(orders::get_order))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(metrics::metrics))
        .split_for_parts()
}

/// The OpenAPI document, including the two routes that serve it.
pub fn openapi() -> OpenApiDocument {
    let (_, mut document) = api();
    document_self(&mut document);
    document
}

fn document_self(document: &mut OpenApiDocument) {
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
    use utoipa::openapi::{ContentBuilder, ResponseBuilder};
    let page = |summary: &str, content_type: &str| {
        let response = ResponseBuilder::new()
            .description(summary)
            .content(content_type, ContentBuilder::new().build())
            .build();
        PathItem::new(
            HttpMethod::Get,
            OperationBuilder::new()
                .summary(Some(summary))
                .tag("operations")
                .response("200", response)
                .build(),
        )
    };
    document.paths.paths.insert(
        "/openapi.json".to_owned(),
        page("This OpenAPI document", "application/json"),
    );
    document.paths.paths.insert(
        "/docs".to_owned(),
        page("API reference page (Scalar)", "text/html"),
    );
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".to_owned())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

async fn timed_out(error: tower::BoxError) -> ApiError {
    if error.is::<tower::timeout::error::Elapsed>() {
        ApiError::Timeout
    } else {
        ApiError::Internal(error.to_string())
    }
}

fn panicked(_: Box<dyn std::any::Any + Send + 'static>) -> axum::response::Response {
    ApiError::Internal("a handler panicked".to_owned()).into_response()
}

/// The whole application: routes, docs, and the layers every request passes.
pub fn router(state: AppState, request_timeout: Duration) -> Router {
    let (routes, mut document) = api();
    document_self(&mut document);
    let document = Arc::new(document);
    let request_id = HeaderName::from_static("x-request-id");

    let serve_document = {
        let document = Arc::clone(&document);
        move || async move { axum::Json(document.as_ref().clone()) }
    };

    routes
        .route("/openapi.json", get(serve_document))
        .merge(Scalar::with_url("/docs", document.as_ref().clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::new(request_id.clone(), MakeRequestUuid))
                .layer(TraceLayer::new_for_http().make_span_with(|request: &Request| {
                    let route = request
                        .extensions()
                        .get::<MatchedPath>()
                        .map(MatchedPath::as_str);
                    let request_id = request
                        .headers()
                        .get("x-request-id")
                        .and_then(|value| value.to_str().ok());
                    tracing::info_span!("request", method = %request.method(), route, path = %request.uri().path(), request_id)
                }))
                .layer(PropagateRequestIdLayer::new(request_id))
                .layer(axum::middleware::from_fn(metrics::track))
                .layer(CatchPanicLayer::custom(panicked))
                .layer(HandleErrorLayer::new(timed_out))
                .timeout(request_timeout)
                .layer(DefaultBodyLimit::max(BODY_LIMIT)),
        )
        .with_state(state)
}

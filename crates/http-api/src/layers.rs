use std::time::{Duration, Instant};

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use crate::json::BODY_LIMIT;
use crate::problem::problem_response;
use service_support::telemetry::{self, TraceContext};

const REQUEST_ID: &str = "x-request-id";

/// Describes the HTTP metrics the layers record.
pub fn describe_metrics() {
    metrics::describe_counter!(
        "http_requests_total",
        "HTTP requests by method, route and status"
    );
    metrics::describe_histogram!(
        "http_request_duration_seconds",
        metrics::Unit::Seconds,
        "HTTP request latency by method, route and status"
    );
}

/// Counts and times every request by its route template (not its path, which
/// would make one series per id).
async fn track(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    let labels = [("method", method), ("route", route), ("status", status)];
    metrics::counter!("http_requests_total", &labels).increment(1);
    metrics::histogram!("http_request_duration_seconds", &labels)
        .record(started.elapsed().as_secs_f64());
    response
}

async fn not_found() -> Response {
    problem_response(
        StatusCode::NOT_FOUND,
        "/problems/not-found",
        "Not found",
        "no such route".to_owned(),
        Vec::new(),
    )
}

async fn method_not_allowed() -> Response {
    problem_response(
        StatusCode::METHOD_NOT_ALLOWED,
        "/problems/method-not-allowed",
        "Method not allowed",
        "method not allowed on this route".to_owned(),
        Vec::new(),
    )
}

async fn timed_out(error: tower::BoxError) -> Response {
    if error.is::<tower::timeout::error::Elapsed>() {
        problem_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "/problems/timeout",
            "Request timed out",
            "the request did not complete in time".to_owned(),
            Vec::new(),
        )
    } else {
        internal_error(&error.to_string())
    }
}

fn internal_error(cause: &str) -> Response {
    tracing::error!(error.message = cause, "request failed");
    problem_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        "/problems/internal",
        "Internal error",
        "the server could not complete the request; it has been logged".to_owned(),
        Vec::new(),
    )
}

fn panicked(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    internal_error("a handler panicked")
}

/// The W3C trace context a request carries, if its `traceparent` is valid.
pub fn trace_context(headers: &HeaderMap) -> Option<TraceContext> {
    let text = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    TraceContext::parse(text("traceparent")?, text("tracestate"))
}

/// The request's span: an OpenTelemetry server span named after the route
/// template, continuing the caller's trace when it sent one.
fn request_span(request: &Request) -> tracing::Span {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let request_id = request
        .headers()
        .get(REQUEST_ID)
        .and_then(|value| value.to_str().ok());
    let method = request.method().as_str();
    let span = tracing::info_span!(
        "request",
        otel.kind = "server",
        otel.name = format!("{method} {}", route.unwrap_or("unmatched")),
        http.request.method = method,
        http.route = route,
        url.path = request.uri().path(),
        request_id,
        http.response.status_code = tracing::field::Empty,
    );
    telemetry::continue_trace(&span, || trace_context(request.headers()));
    span
}

/// Adds problem+json fallbacks (404, 405) and the layers every request
/// passes: request id (`x-request-id`, generated when absent, echoed back), a
/// tracing span with method, route and request id, metrics, a panic guard,
/// the time limit (503 problem) and the 64 KiB body limit.
pub fn with_common_layers(router: Router, request_timeout: Duration) -> Router {
    let request_id = HeaderName::from_static(REQUEST_ID);
    router
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::new(request_id.clone(), MakeRequestUuid))
                .layer(
                    TraceLayer::new_for_http()
                        .make_span_with(request_span)
                        .on_response(|response: &Response, latency: Duration, span: &tracing::Span| {
                            span.record("http.response.status_code", response.status().as_u16());
                            tracing::debug!(parent: span, latency_ms = latency.as_millis(), "response");
                        }),
                )
                .layer(PropagateRequestIdLayer::new(request_id))
                .layer(axum::middleware::from_fn(track))
                .layer(CatchPanicLayer::custom(panicked))
                .layer(HandleErrorLayer::new(timed_out))
                .timeout(request_timeout)
                .layer(DefaultBodyLimit::max(BODY_LIMIT)),
        )
}

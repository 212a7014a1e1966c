//! The console over HTTP: the page (server-rendered HTML) and the JSON API
//! it mirrors, on loopback. Requests that name another host (DNS
//! rebinding) or a redrive posted from another site are refused.

mod api; // the JSON API: /api/...
mod pages; // the HTML page

use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use service_support::http::{problem_response, with_common_layers, with_openapi_pages};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::sources::Sources;

/// What every handler may use.
#[derive(Debug, Clone)]
pub struct Console {
    pub sources: Sources,
    /// The operator the redrive form suggests.
    pub operator: String,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "entrega operations console",
        description = "Where a message or an order has been, the dead letters and their redrive, \
                       the pipeline's health. The same as the `entrega` CLI. Every error is \
                       `application/problem+json` (RFC 9457)."
    ),
    tags(
        (name = "journey", description = "Where a message or an order has been"),
        (name = "dead letters", description = "The DLTs: list, show, redrive"),
        (name = "health", description = "Lag, backlog, DLT depth, circuits, relay leaders"),
        (name = "operations", description = "Liveness and this document"),
    )
)]
struct ApiDoc;

#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
struct Alive {
    #[schema(example = "ok")]
    status: &'static str,
}

/// Liveness: the process is up and serving HTTP.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process is up", body = Alive)))]
async fn healthz() -> axum::Json<Alive> {
    axum::Json(Alive { status: "ok" })
}

/// Journeys read a few partitions; a slow broker gets this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

pub fn router(console: Console) -> Router {
    let (api, document) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(api::get_journey))
        .routes(routes!(api::get_health))
        .routes(routes!(api::list_dead_letters))
        .routes(routes!(api::get_dead_letter))
        .routes(routes!(api::redrive))
        .routes(routes!(healthz))
        .split_for_parts();
    let pages = Router::new()
        .route("/", get(pages::health_page))
        .route("/journey", get(pages::journey_page))
        .route("/dead-letters", get(pages::dead_letters_page))
        .route(
            "/dead-letters/{topic}/{partition}/{offset}",
            get(pages::dead_letter_page),
        )
        .route(
            "/dead-letters/{topic}/{partition}/{offset}/redrive",
            post(pages::redrive_page),
        );
    let routes = with_openapi_pages(api.merge(pages), document).with_state(console);
    with_common_layers(routes, REQUEST_TIMEOUT).layer(axum::middleware::from_fn(same_origin))
}

/// The console answers only to its loopback names, and takes a write only
/// from its own pages: a page elsewhere could otherwise post a redrive
/// through the operator's browser, or reach the console by rebinding a name
/// of its own to 127.0.0.1.
async fn same_origin(request: Request, next: Next) -> Response {
    let headers = request.headers();
    let Some(host) = host(headers) else {
        return refuse(
            StatusCode::MISDIRECTED_REQUEST,
            "the console answers only to 127.0.0.1, localhost or [::1]",
        );
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let cross_site = headers
            .get("sec-fetch-site")
            .and_then(|value| value.to_str().ok())
            .is_some_and(|site| site == "cross-site" || site == "same-site");
        let foreign_origin = headers
            .get(header::ORIGIN)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|origin| {
                origin
                    .split_once("://")
                    .is_none_or(|(_, authority)| authority != host)
            });
        if cross_site || foreign_origin {
            return refuse(
                StatusCode::FORBIDDEN,
                "a write must come from the console's own page",
            );
        }
    }
    let mut response = next.run(request).await;
    // No page of the console may be framed by another (a redrive button
    // under a decoy).
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    response
}

/// The Host header when it names a loopback address.
fn host(headers: &HeaderMap) -> Option<&str> {
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
        _ => host,
    };
    matches!(name, "127.0.0.1" | "localhost" | "[::1]").then_some(host)
}

fn refuse(status: StatusCode, detail: &str) -> Response {
    problem_response(
        status,
        "/problems/forbidden",
        "Refused",
        detail.to_owned(),
        Vec::new(),
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap_or_else(|_| panic!("{value}")));
        }
        map
    }

    #[test]
    fn only_loopback_names_are_served() {
        assert_eq!(
            host(&headers(&[("host", "127.0.0.1:8090")])),
            Some("127.0.0.1:8090")
        );
        assert_eq!(host(&headers(&[("host", "localhost")])), Some("localhost"));
        assert_eq!(
            host(&headers(&[("host", "[::1]:8090")])),
            Some("[::1]:8090")
        );
        assert_eq!(host(&headers(&[("host", "attacker.example:8090")])), None);
        assert_eq!(
            host(&headers(&[("host", "127.0.0.1.attacker.example")])),
            None
        );
        assert_eq!(host(&headers(&[])), None);
    }
}

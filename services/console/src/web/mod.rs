//! The console over HTTP: the page (server-rendered HTML) and the JSON API
//! it mirrors, on loopback. Requests that name another host (DNS
//! rebinding) or a redrive posted from another site are refused.

mod api; // the JSON API: /api/...
mod pages; // the HTML page

use std::time::Duration;

use axum::Router;
use axum::extract::{FromRef, Request};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_api::{
    AdminToken, declare_admin_scheme, problem_response, with_common_layers, with_openapi_pages,
};
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
    /// What a redrive needs.
    pub admin: AdminToken,
}

impl FromRef<Console> for AdminToken {
    fn from_ref(console: &Console) -> Self {
        console.admin.clone()
    }
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
    let (api, mut document) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(api::get_journey))
        .routes(routes!(api::get_health))
        .routes(routes!(api::list_dead_letters))
        .routes(routes!(api::get_dead_letter))
        .routes(routes!(api::redrive))
        .routes(routes!(healthz))
        .split_for_parts();
    declare_admin_scheme(&mut document);
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
    use axum::body::Body;
    use clap::Parser;
    use tower::ServiceExt;

    use super::*;
    use crate::config::Cli;

    /// The console's admin token in these tests.
    const TOKEN: &str = "t0ken";

    /// The two ways to post a redrive: the JSON API and the page's form,
    /// with the admin token. The topic is no DLT of the pipeline, so that a
    /// request the checks let through is answered by its handler (404)
    /// before any I/O.
    fn redrives(pairs: &[(&'static str, &'static str)]) -> [Request; 2] {
        redrives_with(pairs, Some(TOKEN))
    }

    fn redrives_with(pairs: &[(&'static str, &'static str)], token: Option<&str>) -> [Request; 2] {
        let api = (
            "/api/dead-letters/not.a.dlt/0/0/redrive",
            "application/json",
            r#"{"operator": "ana", "dryRun": true}"#.to_owned(),
        );
        let page = (
            "/dead-letters/not.a.dlt/0/0/redrive",
            "application/x-www-form-urlencoded",
            match token {
                Some(token) => format!("operator=ana&action=dry-run&token={token}"),
                None => "operator=ana&action=dry-run".to_owned(),
            },
        );
        [api, page].map(|(uri, content_type, body)| {
            let api = uri.starts_with("/api/");
            let mut request = Request::post(uri)
                .header(header::CONTENT_TYPE, content_type)
                .body(Body::from(body))
                .unwrap_or_else(|e| panic!("{e}"));
            request.headers_mut().extend(headers(pairs));
            if let (true, Some(token)) = (api, token) {
                let bearer = format!("Bearer {token}")
                    .parse()
                    .unwrap_or_else(|e| panic!("{e}"));
                request.headers_mut().insert(header::AUTHORIZATION, bearer);
            }
            request
        })
    }

    /// The console's answers to `requests`, with the default configuration
    /// (nothing is connected until used) and the admin token [`TOKEN`].
    async fn answers(requests: [Request; 2]) -> Vec<StatusCode> {
        answers_with(requests, Some(TOKEN)).await
    }

    async fn answers_with(requests: [Request; 2], configured: Option<&str>) -> Vec<StatusCode> {
        let cli = Cli::try_parse_from(["entrega", "serve"]).unwrap_or_else(|e| panic!("{e}"));
        let sources = Sources::new(&cli.sources).unwrap_or_else(|e| panic!("{e}"));
        let configured = configured.map(service_support::secret::Secret::new);
        let console = Console {
            sources,
            operator: "ana".to_owned(),
            admin: AdminToken::new(configured.as_ref(), "CONSOLE_ADMIN_TOKEN"),
        };
        let mut statuses = Vec::new();
        for request in requests {
            let response = router(console.clone())
                .oneshot(request)
                .await
                .unwrap_or_else(|e| match e {});
            statuses.push(response.status());
        }
        statuses
    }

    #[tokio::test]
    async fn a_redrive_needs_the_admin_token() {
        let own = [HOST, ("sec-fetch-site", "same-origin")];
        assert_eq!(
            answers(redrives_with(&own, None)).await,
            [StatusCode::UNAUTHORIZED; 2],
            "no token"
        );
        assert_eq!(
            answers(redrives_with(&own, Some("t0ke"))).await,
            [StatusCode::FORBIDDEN; 2],
            "another token"
        );
        assert_eq!(
            answers_with(redrives(&own), None).await,
            [StatusCode::FORBIDDEN; 2],
            "no token configured: every redrive refused"
        );
        assert_eq!(
            answers(redrives(&own)).await,
            [StatusCode::NOT_FOUND; 2],
            "the token: the handler answers (no such DLT)"
        );
    }

    const HOST: (&str, &str) = ("host", "127.0.0.1:8090");

    #[tokio::test]
    async fn a_redrive_posted_from_another_site_is_refused() {
        for cross_site in [
            [HOST, ("origin", "http://attacker.example")],
            [HOST, ("origin", "null")],
            // Another port of the same machine is another origin.
            [HOST, ("origin", "http://127.0.0.1:9999")],
            [HOST, ("sec-fetch-site", "cross-site")],
            [HOST, ("sec-fetch-site", "same-site")],
        ] {
            assert_eq!(
                answers(redrives(&cross_site)).await,
                [StatusCode::FORBIDDEN; 2],
                "{cross_site:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_redrive_that_names_a_host_other_than_loopback_is_refused() {
        for host in [
            "attacker.example:8090",
            "127.0.0.1.attacker.example:8090",
            "10.0.0.5:8090",
        ] {
            let same_origin_otherwise = [("host", host), ("sec-fetch-site", "same-origin")];
            assert_eq!(
                answers(redrives(&same_origin_otherwise)).await,
                [StatusCode::MISDIRECTED_REQUEST; 2],
                "{host}"
            );
        }
        assert_eq!(
            answers(redrives(&[])).await,
            [StatusCode::MISDIRECTED_REQUEST; 2],
            "no Host header"
        );
    }

    #[tokio::test]
    async fn a_redrive_from_the_consoles_own_page_or_a_command_line_passes_the_check() {
        for own in [
            vec![
                HOST,
                ("origin", "http://127.0.0.1:8090"),
                ("sec-fetch-site", "same-origin"),
            ],
            vec![
                ("host", "localhost:8090"),
                ("origin", "http://localhost:8090"),
            ],
            // curl: no Origin, no Sec-Fetch-Site.
            vec![HOST],
        ] {
            assert_eq!(
                answers(redrives(&own)).await,
                [StatusCode::NOT_FOUND; 2],
                "{own:?}: the handler answers (no such DLT)"
            );
        }
    }

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

//! /metrics, /healthz and /readyz, served with hyper alone: three GETs for
//! Prometheus and the orchestrator do not need a web framework, and the
//! relay links none (no routing, OpenAPI or Swagger UI in its binary).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use service_support::metrics::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::relay::RelayStatus;

/// A client that sends its request line and headers slower than this is cut
/// off: it cannot hold a connection open for ever.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connections in flight may take to finish at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// The wait after a failed accept (out of file descriptors, say), so that
/// the loop does not spin on it.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub struct HttpState {
    pub metrics: PrometheusHandle,
    pub relay: Arc<RelayStatus>,
    /// Set once the target topics were found as configured.
    pub topics_ok: Arc<AtomicBool>,
}

/// Serves until `token` is cancelled, then lets the connections in flight
/// finish (within a grace).
pub async fn serve(listener: TcpListener, state: HttpState, token: CancellationToken) {
    let graceful = GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "cannot accept an HTTP connection");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
            () = token.cancelled() => break,
        };
        let state = state.clone();
        let service = service_fn(move |request: Request<Incoming>| {
            let response = respond(&state, request.method(), request.uri().path());
            async move { Ok::<_, Infallible>(response) }
        });
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "HTTP connection ended with an error");
            }
        });
    }
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, graceful.shutdown()).await;
}

fn respond(state: &HttpState, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let known = matches!(path, "/metrics" | "/healthz" | "/readyz");
    if !known {
        return text(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found\n".into(),
        );
    }
    if method != Method::GET && method != Method::HEAD {
        let mut response = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "method not allowed\n".into(),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match path {
        "/metrics" => text(
            StatusCode::OK,
            service_support::metrics::CONTENT_TYPE,
            state.metrics.render(),
        ),
        "/healthz" => text(StatusCode::OK, "text/plain; charset=utf-8", "ok".into()),
        _ => readyz(state),
    }
}

/// Ready when the topics were checked and the database answers: a standby
/// is ready too (it is ready to take over).
fn readyz(state: &HttpState) -> Response<Full<Bytes>> {
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
    let body = serde_json::json!({"topics": topics, "database": database, "role": role});
    text(status, "application/json", body.to_string())
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> HttpState {
        HttpState {
            metrics: service_support::metrics::recorder(),
            relay: Arc::default(),
            topics_ok: Arc::default(),
        }
    }

    #[test]
    fn only_gets_of_the_three_paths_are_answered() {
        let state = state();
        assert_eq!(
            respond(&state, &Method::GET, "/healthz").status(),
            StatusCode::OK
        );
        assert_eq!(
            respond(&state, &Method::GET, "/metrics").status(),
            StatusCode::OK
        );
        assert_eq!(
            respond(&state, &Method::GET, "/nope").status(),
            StatusCode::NOT_FOUND
        );
        let post = respond(&state, &Method::POST, "/readyz");
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(post.headers()[header::ALLOW], "GET, HEAD");
    }

    #[test]
    fn not_ready_until_the_topics_are_checked_and_the_database_answers() {
        let state = state();
        assert_eq!(
            respond(&state, &Method::GET, "/readyz").status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        state.topics_ok.store(true, Ordering::Relaxed);
        state.relay.database_ok.store(true, Ordering::Relaxed);
        let ready = respond(&state, &Method::GET, "/readyz");
        assert_eq!(ready.status(), StatusCode::OK);
        assert_eq!(ready.headers()[header::CONTENT_TYPE], "application/json");
    }
}

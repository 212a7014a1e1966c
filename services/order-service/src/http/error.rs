//! Every error the API returns, as RFC 9457 `application/problem+json`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::FieldError;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// Identifies the kind of problem; see docs/api-errors.md.
    #[serde(rename = "type")]
    #[schema(example = "/problems/validation")]
    pub problem_type: &'static str,
    /// Short summary of the kind of problem.
    pub title: &'static str,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong with this request.
    pub detail: String,
    /// Per-field errors, for validation problems.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the body is not JSON.
    #[error("the request body is not valid JSON: {0}")]
    MalformedJson(String),
    /// 400: a request header has an invalid value.
    #[error("header {name} is invalid: {reason}")]
    InvalidHeader { name: &'static str, reason: String },
    /// 400: a path segment is not an id.
    #[error("{0} is not a valid id (expected a UUID)")]
    InvalidId(String),
    /// 404: the resource or route does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 405: the route exists, the method does not.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// 413: the body is larger than the limit.
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// 415: the body is not declared as JSON.
    #[error("expected Content-Type: application/json")]
    UnsupportedMediaType,
    /// 422: well-formed JSON that breaks the request's rules.
    #[error("the request has {} invalid field(s)", .0.len())]
    Validation(Vec<FieldError>),
    /// 422: the Idempotency-Key was used with another body.
    #[error("this Idempotency-Key was already used with a different request body")]
    IdempotencyKeyReused,
    /// 503: the request did not finish within the server's time limit.
    #[error("the request did not complete in time")]
    Timeout,
    /// 503: the database is unreachable (readiness).
    #[error("the database is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// 500: anything unexpected; logged, never shown.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// 500: anything unexpected; logged, never shown.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        use ApiError::*;
        match self {
            MalformedJson(_) => (
                StatusCode::BAD_REQUEST,
                "/problems/malformed-json",
                "Malformed JSON",
            ),
            InvalidHeader { .. } => (
                StatusCode::BAD_REQUEST,
                "/problems/invalid-header",
                "Invalid header",
            ),
            InvalidId(_) => (
                StatusCode::BAD_REQUEST,
                "/problems/invalid-id",
                "Invalid id",
            ),
            NotFound(_) => (StatusCode::NOT_FOUND, "/problems/not-found", "Not found"),
            MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "/problems/method-not-allowed",
                "Method not allowed",
            ),
            PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "/problems/payload-too-large",
                "Payload too large",
            ),
            UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "/problems/unsupported-media-type",
                "Unsupported media type",
            ),
            Validation(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "/problems/validation",
                "Invalid request",
            ),
            IdempotencyKeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "/problems/idempotency-key-reused",
                "Idempotency-Key reused",
            ),
            Timeout => (
                StatusCode::SERVICE_UNAVAILABLE,
                "/problems/timeout",
                "Request timed out",
            ),
            Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "/problems/unavailable",
                "Service unavailable",
            ),
            Database(_) | Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "/problems/internal",
                "Internal error",
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, problem_type, title) = self.parts();
        let detail = match &self {
            ApiError::Database(_) | ApiError::Internal(_) => {
                // Logged once, here, with its whole cause chain; the client
                // gets an opaque message.
                tracing::error!(error.cause_chain = ?self, error.message = %self, "request failed");
                "the server could not complete the request; it has been logged".to_owned()
            }
            ApiError::Unavailable(_) => {
                tracing::warn!(error.cause_chain = ?self, error.message = %self, "not ready");
                self.to_string()
            }
            _ => self.to_string(),
        };
        let errors = match self {
            ApiError::Validation(errors) => errors,
            _ => Vec::new(),
        };
        let problem = Problem {
            problem_type,
            title,
            status: status.as_u16(),
            detail,
            errors,
        };
        let mut response = (status, axum::Json(problem)).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        response
    }
}

//! The errors a handler returns, as RFC 9457 problem documents. Body errors
//! (415, 413, 400, 422 for shape), unknown routes (404, 405) and time-outs
//! (503) are answered by the extractor and the layers in the same format.

use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use uuid::Uuid;

use crate::problem::{FieldError, problem_response};
use service_support::telemetry::cause_chain;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: a request header has an invalid value.
    #[error("header {name} is invalid: {reason}")]
    InvalidHeader { name: &'static str, reason: String },
    /// 400: a path segment is not an id.
    #[error("{0} is not a valid id (expected a UUID)")]
    InvalidId(String),
    /// 400: a path segment is not valid.
    #[error("{parameter} is invalid: {reason}")]
    InvalidPath {
        parameter: &'static str,
        reason: String,
    },
    /// 401: the request needs credentials it does not carry.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: the credentials do not allow the request.
    #[error("{0}")]
    Forbidden(String),
    /// 404: the resource does not exist.
    #[error("{0}")]
    NotFound(String),
    /// 422: well-formed JSON that breaks the request's rules.
    #[error("the request has {} invalid field(s)", .0.len())]
    Validation(Vec<FieldError>),
    /// 422: a request that is valid in itself but cannot be carried out;
    /// `problem_type` names the service-specific reason.
    #[error("{detail}")]
    Unprocessable {
        problem_type: &'static str,
        title: &'static str,
        detail: String,
    },
    /// 409: the resource's current state forbids the request;
    /// `problem_type` names the service-specific reason.
    #[error("{detail}")]
    Conflict {
        problem_type: &'static str,
        title: &'static str,
        detail: String,
    },
    /// 503: not ready (readiness): the reason.
    #[error("not ready: {0}")]
    Unavailable(String),
    /// 500: a database error; logged, never shown.
    #[error("database error")]
    Database(#[from] sqlx::Error),
    /// 500: anything else unexpected; logged with its cause, never shown.
    #[error("{context}")]
    Internal {
        context: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

impl ApiError {
    /// 500: `context` failed because of `source`.
    pub fn internal(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Internal {
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// 500: a state the code holds impossible, with no error behind it.
    pub fn bug(context: impl Into<String>) -> Self {
        Self::Internal {
            context: context.into(),
            source: None,
        }
    }
}

/// The UUID a route's one path segment names, or a 400 problem saying it
/// is not one.
pub fn id_from_path(path: Result<Path<String>, PathRejection>) -> Result<Uuid, ApiError> {
    let Path(text) = path.map_err(|rejection| ApiError::InvalidId(rejection.body_text()))?;
    Uuid::try_parse(&text).map_err(|_| ApiError::InvalidId(text))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        use ApiError::*;
        let (status, problem_type, title) = match &self {
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
            InvalidPath { .. } => (
                StatusCode::BAD_REQUEST,
                "/problems/invalid-path",
                "Invalid path parameter",
            ),
            Unauthorized(_) => (
                StatusCode::UNAUTHORIZED,
                "/problems/unauthorized",
                "Authentication required",
            ),
            Forbidden(_) => (StatusCode::FORBIDDEN, "/problems/forbidden", "Forbidden"),
            NotFound(_) => (StatusCode::NOT_FOUND, "/problems/not-found", "Not found"),
            Validation(_) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "/problems/validation",
                "Invalid request",
            ),
            Unprocessable {
                problem_type,
                title,
                ..
            } => (StatusCode::UNPROCESSABLE_ENTITY, *problem_type, *title),
            Conflict {
                problem_type,
                title,
                ..
            } => (StatusCode::CONFLICT, *problem_type, *title),
            Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "/problems/unavailable",
                "Service unavailable",
            ),
            Database(_) | Internal { .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "/problems/internal",
                "Internal error",
            ),
        };
        let detail = match &self {
            Database(_) | Internal { .. } => {
                // Logged once, here, with its whole cause chain; the client
                // gets an opaque message.
                tracing::error!(error.cause_chain = %cause_chain(&self), error.message = %self, "request failed");
                "the server could not complete the request; it has been logged".to_owned()
            }
            Unavailable(_) => {
                tracing::warn!(error.message = %self, "not ready");
                self.to_string()
            }
            _ => self.to_string(),
        };
        let challenge = matches!(self, Unauthorized(_));
        let errors = match self {
            Validation(errors) => errors,
            _ => Vec::new(),
        };
        let mut response = problem_response(status, problem_type, title, detail, errors);
        if challenge {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_id_is_a_uuid_or_a_400() {
        // Any UUID names an entity; whether it exists is the database's answer.
        let id = Uuid::now_v7();
        assert_eq!(id_from_path(Ok(Path(id.to_string()))).ok(), Some(id));
        for text in ["42", "not-a-uuid", ""] {
            assert!(matches!(
                id_from_path(Ok(Path(text.to_owned()))),
                Err(ApiError::InvalidId(shown)) if shown == text
            ));
        }
    }
}

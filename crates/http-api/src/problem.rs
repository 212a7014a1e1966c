use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// One invalid field of a request, as RFC 9457's `errors` extension lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FieldError {
    /// JSON Pointer (RFC 6901) to the field, e.g. `#/items/0/quantity`.
    pub pointer: String,
    /// What is wrong with it, for a person.
    pub detail: String,
}

impl FieldError {
    /// `path` is the pointer without its leading `#`, e.g. `/items/0/sku`.
    pub fn new(path: impl AsRef<str>, detail: impl Into<String>) -> Self {
        Self {
            pointer: format!("#{}", path.as_ref()),
            detail: detail.into(),
        }
    }
}

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// Identifies the kind of problem (a relative URI, see the service's docs).
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

/// A problem document response with its status and content type.
pub fn problem_response(
    status: StatusCode,
    problem_type: &'static str,
    title: &'static str,
    detail: String,
    errors: Vec<FieldError>,
) -> Response {
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

//! HTTP pieces every service's API shares: RFC 9457 problem documents, a JSON
//! body extractor whose rejections are problems, the layers every request
//! passes (request id, tracing, metrics, panics, time limit, body limit),
//! liveness and readiness, /metrics, and the OpenAPI document with its
//! reference page.

pub mod admin; // the bearer token that admin writes need
mod error; // the errors handlers return
pub mod health; // /healthz, and readiness's shared part
mod json; // the JSON body extractor
mod layers; // common middleware and fallbacks
mod openapi; // /openapi.json and /docs
mod problem; // problem documents and field errors

pub use admin::{ADMIN_SCHEME, Admin, AdminToken, declare_admin_scheme};
pub use error::{ApiError, id_from_path};
pub use json::{BODY_LIMIT, JsonBodyError, ValidJson, json_integer};
pub use layers::{describe_metrics, trace_context, with_common_layers};
pub use openapi::with_openapi_pages;
pub use problem::{FieldError, PROBLEM_JSON, Problem, problem_response};

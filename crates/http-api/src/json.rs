//! A JSON body extractor whose every rejection is a problem document with the
//! right status: 415 without a JSON content type, 413 over the size limit,
//! 400 for malformed JSON, 422 with a pointer for JSON of the wrong shape.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use axum::response::{IntoResponse, Response};

use crate::problem::{FieldError, problem_response};

/// The largest request body accepted (64 KiB).
pub const BODY_LIMIT: usize = 64 * 1024;

/// A JSON request body, deserialized into `T`.
#[derive(Debug)]
pub struct ValidJson<T>(pub T);

/// Why a body was refused; each becomes its problem document.
#[derive(Debug, thiserror::Error)]
pub enum JsonBodyError {
    /// 415
    #[error("expected Content-Type: application/json")]
    UnsupportedMediaType,
    /// 413
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// 400
    #[error("the request body is not valid JSON: {0}")]
    Malformed(String),
    /// 422
    #[error("the request has {} invalid field(s)", .0.len())]
    Invalid(Vec<FieldError>),
}

impl IntoResponse for JsonBodyError {
    fn into_response(self) -> Response {
        let detail = self.to_string();
        let (status, problem_type, title, errors) = match self {
            Self::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "/problems/unsupported-media-type",
                "Unsupported media type",
                Vec::new(),
            ),
            Self::PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "/problems/payload-too-large",
                "Payload too large",
                Vec::new(),
            ),
            Self::Malformed(_) => (
                StatusCode::BAD_REQUEST,
                "/problems/malformed-json",
                "Malformed JSON",
                Vec::new(),
            ),
            Self::Invalid(errors) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "/problems/validation",
                "Invalid request",
                errors,
            ),
        };
        problem_response(status, problem_type, title, detail, errors)
    }
}

fn is_json_content_type(request: &Request) -> bool {
    let Some(value) = request.headers().get(header::CONTENT_TYPE) else {
        return false;
    };
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// RFC 6901 pointer of a serde path, e.g. `/items/0/quantity`.
fn pointer(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|segment| match segment {
            Segment::Seq { index } => Some(index.to_string()),
            Segment::Map { key } => Some(key.replace('~', "~0").replace('/', "~1")),
            Segment::Enum { variant } => Some(variant.clone()),
            Segment::Unknown => None,
        })
        .map(|part| format!("/{part}"))
        .collect()
}

impl<S, T> FromRequest<S> for ValidJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = JsonBodyError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json_content_type(&request) {
            return Err(JsonBodyError::UnsupportedMediaType);
        }
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    JsonBodyError::PayloadTooLarge { limit: BODY_LIMIT }
                } else {
                    JsonBodyError::Malformed(rejection.body_text())
                }
            })?;
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|error| JsonBodyError::Malformed(error.to_string()))?;
        // serde would also read a struct from an array, by position; every
        // body of this API is an object.
        if !value.is_object() {
            return Err(JsonBodyError::Invalid(vec![FieldError::new(
                "",
                "the body must be a JSON object",
            )]));
        }
        serde_path_to_error::deserialize(value)
            .map(ValidJson)
            .map_err(|error| {
                let detail = error.inner().to_string();
                JsonBodyError::Invalid(vec![FieldError::new(pointer(error.path()), detail)])
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Shape {
        items: Vec<Item>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Item {
        quantity: i64,
    }

    #[test]
    fn pointers_name_the_offending_field() {
        let value = serde_json::json!({"items": [{"quantity": 1}, {"quantity": "two"}]});
        let error = serde_path_to_error::deserialize::<_, Shape>(value).unwrap_err();
        assert_eq!(pointer(error.path()), "/items/1/quantity");
    }
}

/// `#[serde(deserialize_with = "json_integer")]` for an integer field: JSON
/// Schema's `integer` includes numbers written with a zero fraction (`2.0`),
/// so a body the OpenAPI document allows must not be refused for it. Any
/// other fraction, or a value out of `i64`'s range, is refused.
pub fn json_integer<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    use serde::de::{Error, Unexpected, Visitor};

    struct Integer;
    impl Visitor<'_> for Integer {
        type Value = i64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an integer")
        }
        fn visit_i64<E: Error>(self, value: i64) -> Result<i64, E> {
            Ok(value)
        }
        fn visit_u64<E: Error>(self, value: u64) -> Result<i64, E> {
            i64::try_from(value).map_err(|_| E::invalid_value(Unexpected::Unsigned(value), &self))
        }
        fn visit_f64<E: Error>(self, value: f64) -> Result<i64, E> {
            // i64::MAX is not exactly representable; 2^63 is the first f64 past it.
            const LIMIT: f64 = 9_223_372_036_854_775_808.0;
            if value.fract() == 0.0 && (-LIMIT..LIMIT).contains(&value) {
                #[allow(clippy::cast_possible_truncation)]
                Ok(value as i64)
            } else {
                Err(E::invalid_value(Unexpected::Float(value), &self))
            }
        }
    }
    deserializer.deserialize_any(Integer)
}

#[cfg(test)]
mod integer_tests {
    use super::json_integer;

    #[derive(Debug, serde::Deserialize)]
    struct Body {
        #[serde(deserialize_with = "json_integer")]
        n: i64,
    }

    fn parse(text: &str) -> Option<i64> {
        serde_json::from_str::<Body>(text).ok().map(|body| body.n)
    }

    #[test]
    fn integers_with_or_without_a_zero_fraction_are_accepted() {
        assert_eq!(parse(r#"{"n": 205}"#), Some(205));
        assert_eq!(parse(r#"{"n": 205.0}"#), Some(205));
        assert_eq!(parse(r#"{"n": -3e2}"#), Some(-300));
    }

    #[test]
    fn fractions_strings_and_huge_numbers_are_refused() {
        for text in [
            r#"{"n": 2.5}"#,
            r#"{"n": "2"}"#,
            r#"{"n": 1e19}"#,
            r#"{"n": 9223372036854775808}"#,
            r#"{"n": null}"#,
        ] {
            assert_eq!(parse(text), None, "{text}");
        }
    }
}

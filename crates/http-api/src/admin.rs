//! Bearer-token authentication for the writes that are not a public API
//! (setting stock, redriving dead letters): `Admin` as a handler's first
//! extractor lets the request in only with `Authorization: Bearer <token>`
//! equal to the configured token. Without the header the answer is 401
//! (with `WWW-Authenticate: Bearer`), with another token 403; a service with
//! no token configured refuses every admin write (403), so forgetting the
//! setting closes the door instead of opening it.

use axum::extract::{FromRef, FromRequestParts};
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use service_support::secret::Secret;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use utoipa::openapi::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};

use crate::ApiError;

/// The name of the scheme in the OpenAPI document.
pub const ADMIN_SCHEME: &str = "adminToken";

/// The admin token a service accepts, kept as a digest: the comparison is of
/// two fixed-length digests in constant time, so neither the token's length
/// nor its prefix shows in how long a refusal takes.
#[derive(Clone)]
pub struct AdminToken {
    digest: Option<[u8; 32]>,
    /// The variable that sets it, for the refusal when none is set.
    variable: &'static str,
}

impl AdminToken {
    pub fn new(token: Option<&Secret>, variable: &'static str) -> Self {
        Self {
            digest: token.map(|token| digest(token.expose())),
            variable,
        }
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminToken")
            .field("configured", &self.digest.is_some())
            .field("variable", &self.variable)
            .finish()
    }
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Proof that the request carried the admin token.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl<S> FromRequestParts<S> for Admin
where
    AdminToken: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let expected = AdminToken::from_ref(state);
        let Some(header) = parts.headers.get(AUTHORIZATION) else {
            return Err(ApiError::Unauthorized(
                "this request needs the admin token: Authorization: Bearer <token>".to_owned(),
            ));
        };
        let presented = header
            .to_str()
            .ok()
            .and_then(|value| value.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
            .filter(|token| !token.is_empty());
        let Some(presented) = presented else {
            return Err(ApiError::Unauthorized(
                "the Authorization header is not a bearer token".to_owned(),
            ));
        };
        expected.admits(presented)
    }
}

impl AdminToken {
    /// Whether `presented` is the admin token: for a token that comes some
    /// other way than the header (a page's form field).
    pub fn admits(&self, presented: &str) -> Result<Admin, ApiError> {
        let Some(expected) = self.digest else {
            return Err(ApiError::Forbidden(format!(
                "admin writes are disabled: {} is not set on this service",
                self.variable
            )));
        };
        if bool::from(digest(presented).ct_eq(&expected)) {
            Ok(Admin)
        } else {
            Err(ApiError::Forbidden(
                "the bearer token is not this service's admin token".to_owned(),
            ))
        }
    }
}

/// Declares the bearer scheme in `document`; operations name it with
/// `security((ADMIN_SCHEME = []))`.
pub fn declare_admin_scheme(document: &mut OpenApi) {
    let components = document.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        ADMIN_SCHEME,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "The service's admin token (`*_ADMIN_TOKEN` or `*_ADMIN_TOKEN_FILE`).",
                ))
                .build(),
        ),
    );
}

#[cfg(test)]
mod tests {
    use axum::http::{Request, StatusCode};
    use axum::response::IntoResponse;

    use super::*;

    async fn check(token: Option<&str>, header: Option<&str>) -> Result<(), (StatusCode, String)> {
        let state = AdminToken::new(token.map(Secret::new).as_ref(), "TEST_ADMIN_TOKEN");
        let mut request = Request::builder();
        if let Some(header) = header {
            request = request.header(AUTHORIZATION, header);
        }
        let (mut parts, ()) = request.body(()).unwrap().into_parts();
        match Admin::from_request_parts(&mut parts, &state).await {
            Ok(Admin) => Ok(()),
            Err(error) => {
                let response = error.into_response();
                let status = response.status();
                let challenge = response
                    .headers()
                    .get("www-authenticate")
                    .map(|value| value.to_str().unwrap().to_owned())
                    .unwrap_or_default();
                Err((status, challenge))
            }
        }
    }

    #[tokio::test]
    async fn only_the_configured_bearer_token_gets_in() {
        assert_eq!(check(Some("t0ken"), Some("Bearer t0ken")).await, Ok(()));
        assert_eq!(check(Some("t0ken"), Some("bearer t0ken")).await, Ok(()));
        let unauthorized = Err((StatusCode::UNAUTHORIZED, "Bearer".to_owned()));
        assert_eq!(check(Some("t0ken"), None).await, unauthorized);
        assert_eq!(check(Some("t0ken"), Some("Basic dTpw")).await, unauthorized);
        assert_eq!(check(Some("t0ken"), Some("Bearer ")).await, unauthorized);
        assert_eq!(check(Some("t0ken"), Some("t0ken")).await, unauthorized);
        let forbidden = Err((StatusCode::FORBIDDEN, String::new()));
        assert_eq!(check(Some("t0ken"), Some("Bearer t0ke")).await, forbidden);
        assert_eq!(check(Some("t0ken"), Some("Bearer t0ken2")).await, forbidden);
        // No token configured: nothing gets in, whatever is presented.
        assert_eq!(check(None, Some("Bearer t0ken")).await, forbidden);
        assert_eq!(check(None, Some("Bearer ")).await, unauthorized);
    }

    #[test]
    fn the_token_never_prints() {
        let state = AdminToken::new(Some(&Secret::new("t0ken")), "TEST_ADMIN_TOKEN");
        assert!(!format!("{state:?}").contains("t0ken"));
    }
}

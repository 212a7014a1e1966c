use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use utoipa::openapi::OpenApi;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
use utoipa::openapi::{ContentBuilder, ResponseBuilder};
use utoipa_swagger_ui::{Config, SwaggerUi};

/// Documents the two routes that serve the document itself.
fn document_self(document: &mut OpenApi) {
    let page = |summary: &str, content_type: &str| {
        let response = ResponseBuilder::new()
            .description(summary)
            .content(content_type, ContentBuilder::new().build())
            .build();
        PathItem::new(
            HttpMethod::Get,
            OperationBuilder::new()
                .summary(Some(summary))
                .tag("operations")
                .response("200", response)
                .build(),
        )
    };
    document.paths.paths.insert(
        "/openapi.json".to_owned(),
        page("This OpenAPI document", "application/json"),
    );
    document.paths.paths.insert(
        "/docs".to_owned(),
        page("API reference page (Swagger UI)", "text/html"),
    );
}

/// Serves `document` at `/openapi.json` and Swagger UI at `/docs` (`/docs`
/// redirects to `/docs/`). Swagger UI's files are in the binary and its
/// page loads nothing from elsewhere: it works with no internet. The
/// validator badge is off, as it would fetch an image from
/// validator.swagger.io.
pub fn with_openapi_pages<S>(router: Router<S>, mut document: OpenApi) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    document_self(&mut document);
    let served = Arc::new(document);
    router
        .route(
            "/openapi.json",
            get(move || {
                let served = Arc::clone(&served);
                async move { axum::Json(served.as_ref().clone()) }
            }),
        )
        // A config, not SwaggerUi::url(): that would route /openapi.json too.
        .merge(SwaggerUi::new("/docs").config(Config::new(["/openapi.json"]).validator_url("none")))
}

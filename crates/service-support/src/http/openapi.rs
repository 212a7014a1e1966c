use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use utoipa::openapi::OpenApi;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
use utoipa::openapi::{ContentBuilder, ResponseBuilder};
use utoipa_scalar::{Scalar, Servable};

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
        page("API reference page (Scalar)", "text/html"),
    );
}

/// Serves `document` at `/openapi.json` and a reference page at `/docs`. The
/// page needs no build-time download: it loads Scalar's script in the browser.
pub fn with_openapi_pages<S>(router: Router<S>, mut document: OpenApi) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    document_self(&mut document);
    let document = Arc::new(document);
    let served = Arc::clone(&document);
    router
        .route(
            "/openapi.json",
            get(move || {
                let served = Arc::clone(&served);
                async move { axum::Json(served.as_ref().clone()) }
            }),
        )
        .merge(Scalar::with_url("/docs", document.as_ref().clone()))
}

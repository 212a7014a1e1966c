use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use http_api::{Admin, ApiError, FieldError, Problem, ValidJson};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use crate::event::{SKU_PATTERN, Sku};
use crate::inventory::{self, Stock};

/// The most units one sku may hold.
const MAX_AVAILABLE: i64 = 1_000_000_000;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SetStock {
    /// Units free to reserve, 0 to 1 000 000 000.
    #[schema(example = 10, minimum = 0, maximum = 1_000_000_000)]
    #[serde(deserialize_with = "http_api::json_integer")]
    available: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct StockResponse {
    #[schema(example = "ABC-1", pattern = "^[A-Z0-9-]{1,64}$")]
    sku: String,
    available: i64,
    reserved: i64,
}

impl From<Stock> for StockResponse {
    fn from(stock: Stock) -> Self {
        Self {
            sku: stock.sku,
            available: stock.available,
            reserved: stock.reserved,
        }
    }
}

fn sku_from_path(path: Result<Path<String>, PathRejection>) -> Result<Sku, ApiError> {
    let Path(text) = path.map_err(|rejection| ApiError::InvalidPath {
        parameter: "sku",
        reason: rejection.body_text(),
    })?;
    Sku::parse(&text).map_err(|_| ApiError::InvalidPath {
        parameter: "sku",
        reason: format!(
            "{} does not match {SKU_PATTERN}",
            idempotent_consumer::quote(&text)
        ),
    })
}

/// Sets the units available for a sku (creating it), keeping what is
/// reserved. Needs the admin token.
#[utoipa::path(
    put,
    path = "/stock/{sku}",
    tag = "stock",
    security(("adminToken" = [])),
    params(("sku" = String, Path, description = "The sku", pattern = "^[A-Z0-9-]{1,64}$")),
    request_body(content = SetStock, content_type = "application/json"),
    responses(
        (status = 200, description = "The stock now", body = StockResponse),
        (status = 400, description = "Invalid sku or malformed JSON", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "No bearer token", body = Problem, content_type = "application/problem+json",
            headers(("WWW-Authenticate" = String, description = "Bearer"))),
        (status = 403, description = "Not the admin token, or no admin token is configured", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Content-Type is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Unexpected error (logged)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn put_stock(
    _admin: Admin,
    State(state): State<AppState>,
    sku: Result<Path<String>, PathRejection>,
    ValidJson(body): ValidJson<SetStock>,
) -> Result<Json<StockResponse>, ApiError> {
    let sku = sku_from_path(sku)?;
    if !(0..=MAX_AVAILABLE).contains(&body.available) {
        return Err(ApiError::Validation(vec![FieldError::new(
            "/available",
            format!("must be between 0 and {MAX_AVAILABLE}"),
        )]));
    }
    let available = body.available;
    let stock = inventory::set_available(&state.pool, &sku, available).await?;
    Ok(Json(stock.into()))
}

/// Reads the stock of a sku.
#[utoipa::path(
    get,
    path = "/stock/{sku}",
    tag = "stock",
    params(("sku" = String, Path, description = "The sku", pattern = "^[A-Z0-9-]{1,64}$")),
    responses(
        (status = 200, description = "The stock", body = StockResponse),
        (status = 400, description = "Invalid sku", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "Unknown sku", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Unexpected error (logged)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn get_stock(
    State(state): State<AppState>,
    sku: Result<Path<String>, PathRejection>,
) -> Result<Json<StockResponse>, ApiError> {
    let sku = sku_from_path(sku)?;
    inventory::stock(&state.pool, &sku)
        .await?
        .map(|stock| Json(stock.into()))
        .ok_or_else(|| ApiError::NotFound(format!("no stock for sku {sku}")))
}

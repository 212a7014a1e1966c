use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use http_api::{ApiError, Problem, id_from_path};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use crate::inventory;

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct ReservationResponse {
    order_id: Uuid,
    /// `RESERVED`, `REJECTED`, `RELEASED` (reserved, then given back by a
    /// cancellation) or `CANCELLED` (cancelled before its creation was
    /// applied: nothing will be reserved for it).
    #[schema(example = "RESERVED")]
    status: String,
    /// Why it was rejected; null when reserved.
    reason: Option<String>,
    items: Vec<ReservationItem>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ReservationItem {
    sku: String,
    quantity: i32,
}

/// The reservation outcome of an order.
#[utoipa::path(
    get,
    path = "/reservations/{orderId}",
    tag = "reservations",
    params(("orderId" = String, Path, description = "The order id (UUID)", format = Uuid)),
    responses(
        (status = 200, description = "The outcome", body = ReservationResponse),
        (status = 400, description = "Not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No outcome (yet) for this order", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Unexpected error (logged)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub(super) async fn get_reservation(
    State(state): State<AppState>,
    order_id: Result<Path<String>, PathRejection>,
) -> Result<Json<ReservationResponse>, ApiError> {
    let order_id = id_from_path(order_id)?;
    let reservation = inventory::reservation(&state.pool, order_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no reservation for order {order_id}")))?;
    Ok(Json(ReservationResponse {
        order_id: reservation.order_id,
        status: reservation.status,
        reason: reservation.reason,
        items: reservation
            .items
            .into_iter()
            .map(|(sku, quantity)| ReservationItem { sku, quantity })
            .collect(),
    }))
}

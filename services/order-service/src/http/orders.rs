//! POST /orders, GET /orders/{id} and POST /orders/{id}/cancel.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use service_support::timestamps::rfc3339;
use utoipa::ToSchema;

use super::AppState;
use crate::domain::{NewOrder, OrderId, OrderRequest};
use crate::events;
use crate::idempotency::{
    self, ClaimError, IdempotencyKey, NextAction, RequestHash, SavedResponse,
};
use crate::orders::{self, Order, StatusChange};
use crate::placing::{self, Claim};
use crate::status::{self, Change, OrderStatus, Transition};
use http_api::{ApiError, id_from_path, trace_context};
use http_api::{Problem, ValidJson};
use service_support::telemetry;

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set on a response replayed for a repeated Idempotency-Key.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// An order as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrderResponse {
    pub id: uuid::Uuid,
    pub customer_id: String,
    /// `PENDING` until the inventory's outcome arrives, then `CONFIRMED`
    /// (stock reserved) or `REJECTED`; `CANCELLED` once cancelled.
    pub status: OrderStatus,
    /// Why the order is in its status: a rejection's reason.
    #[schema(example = "insufficient stock for ABC-1: requested 3, available 2")]
    pub status_reason: Option<String>,
    pub items: Vec<OrderItemResponse>,
    /// RFC 3339, UTC.
    #[schema(example = "2026-12-02T15:00:00.123456Z")]
    pub created_at: String,
    /// Every status the order has been in, oldest first.
    pub history: Vec<StatusChangeResponse>,
}

/// One entry of an order's status history.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusChangeResponse {
    pub status: OrderStatus,
    pub reason: Option<String>,
    /// The message that caused the change: the order's `PedidoCriado` for
    /// `PENDING`, the inventory's event for `CONFIRMED` and `REJECTED`, the
    /// order's `PedidoCancelado` for `CANCELLED`.
    pub message_id: Option<uuid::Uuid>,
    /// RFC 3339, UTC.
    pub at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct OrderItemResponse {
    pub sku: String,
    pub quantity: i32,
}

impl From<&Order> for OrderResponse {
    fn from(order: &Order) -> Self {
        Self {
            id: order.id.as_uuid(),
            customer_id: order.customer_id.clone(),
            status: order.status,
            status_reason: order.status_reason.clone(),
            items: order
                .items
                .iter()
                .map(|(sku, quantity)| OrderItemResponse {
                    sku: sku.clone(),
                    quantity: *quantity,
                })
                .collect(),
            created_at: rfc3339(order.created_at),
            history: order
                .history
                .iter()
                .map(|change: &StatusChange| StatusChangeResponse {
                    status: change.status,
                    reason: change.reason.clone(),
                    message_id: change.message_id,
                    at: rfc3339(change.changed_at),
                })
                .collect(),
        }
    }
}

impl From<ClaimError> for ApiError {
    fn from(error: ClaimError) -> Self {
        match error {
            ClaimError::Reused => ApiError::Unprocessable {
                problem_type: "/problems/idempotency-key-reused",
                title: "Idempotency-Key reused",
                detail: error.to_string(),
            },
            ClaimError::Database(error) => ApiError::Database(error),
        }
    }
}

/// The stored form of a response: its status and JSON body.
fn saved(status: StatusCode, body: &OrderResponse) -> Result<SavedResponse, ApiError> {
    Ok(SavedResponse {
        status: status.as_u16(),
        body: serde_json::to_value(body)
            .map_err(|error| ApiError::internal("cannot serialise an order", error))?,
    })
}

fn location(body: &serde_json::Value) -> Option<HeaderValue> {
    let id = body.get("id")?.as_str()?;
    HeaderValue::from_str(&format!("/orders/{id}")).ok()
}

fn respond(saved: SavedResponse, replayed: bool) -> Response {
    if replayed {
        metrics::counter!("idempotent_replays_total").increment(1);
    }
    let status = StatusCode::from_u16(saved.status).unwrap_or(StatusCode::CREATED);
    let location = location(&saved.body);
    let mut response = (status, axum::Json(saved.body)).into_response();
    if let Some(location) = location {
        response.headers_mut().insert(header::LOCATION, location);
    }
    if replayed {
        response
            .headers_mut()
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let invalid = |reason: String| ApiError::InvalidHeader {
        name: "Idempotency-Key",
        reason,
    };
    let text = value
        .to_str()
        .map_err(|_| invalid("must be printable ASCII".to_owned()))?;
    IdempotencyKey::parse(text).map(Some).map_err(invalid)
}

/// Places an order.
///
/// Writes the order (status `PENDING`), its items and one `PedidoCriado`
/// outbox row in one transaction. With an `Idempotency-Key`, a repeated
/// request with the same body gets the original response (header
/// `Idempotent-Replayed: true`) and writes nothing.
#[utoipa::path(
    post,
    path = "/orders",
    tag = "orders",
    request_body(content = OrderRequest, content_type = "application/json"),
    params(
        ("Idempotency-Key" = Option<String>, Header, pattern = r"^[\x20-\x7e]*[\x21-\x7e][\x20-\x7e]*$", max_length = 255,
            description = "1 to 255 printable ASCII characters, remembered (24 h by default) with the request it came with: the same key with the same body replays the original response, with another body answers 422"),
        ("traceparent" = Option<String>, Header,
            description = "W3C Trace Context: the request's trace continues through the event, the relay and its consumers; an invalid one is ignored (a new trace starts when tracing is on)"),
    ),
    responses(
        (status = 201, description = "Order created, or the original response replayed", body = OrderResponse,
            headers(("Location" = String, description = "/orders/{id}"),
                    ("Idempotent-Replayed" = String, description = "`true` on a replayed response"))),
        (status = 400, description = "Malformed JSON or invalid header", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Content-Type is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields, or Idempotency-Key reused with another body", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Unexpected error (logged)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Timed out", body = Problem, content_type = "application/problem+json"),
    )
)]
#[tracing::instrument(skip_all, fields(order.id, idempotency.key), err(level = "info"))]
pub(super) async fn create_order(
    State(state): State<AppState>,
    headers: HeaderMap,
    ValidJson(request): ValidJson<OrderRequest>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    // The event continues this request's trace (the caller's, when tracing
    // is off here).
    let trace = telemetry::outgoing(&tracing::Span::current(), trace_context(&headers));
    let hash = RequestHash::of(&request)
        .map_err(|error| ApiError::internal("cannot hash the request", error))?;
    let new_order = NewOrder::parse(request).map_err(ApiError::Validation)?;

    let mut order = Order::pending(&new_order);
    tracing::Span::current().record("order.id", tracing::field::display(order.id));
    let message = events::order_created(&order, trace)
        .map_err(|error| ApiError::internal("cannot write PedidoCriado", error))?;
    order.announced_by(message.id);
    let response = saved(StatusCode::CREATED, &OrderResponse::from(&order))?;

    if let Some(key) = &key {
        tracing::Span::current().record("idempotency.key", key.as_str());
    }
    let claim = key.as_ref().map(|key| Claim {
        key,
        hash,
        response: &response,
    });
    // Two rounds at most: the key's row found conflicting can be purged
    // (expired) before it is read, and then the key is free again.
    for _ in 0..2 {
        let placed = if state.outbox_cleanup == outbox::Cleanup::InTransaction {
            // The row must be deleted by the transaction that wrote it, and
            // a statement does not see the rows its own CTEs insert: here
            // the order takes a transaction, two statements and its
            // BEGIN/COMMIT.
            let mut tx = state.pool.begin().await?;
            let placed = placing::place(&mut *tx, &order, &message, claim).await?;
            if placed {
                outbox::delete_written(&mut tx, &[message.id]).await?;
            }
            tx.commit().await?;
            placed
        } else {
            placing::place(&state.pool, &order, &message, claim).await?
        };
        if placed {
            metrics::counter!("orders_created_total").increment(1);
            metrics::counter!("outbox_rows_written_total", "event_type" => message.event_type)
                .increment(1);
            return Ok(respond(response, false));
        }
        // Nothing written: the key was claimed before.
        let Some(key) = &key else {
            return Err(ApiError::bug("an order without a key was not placed"));
        };
        if let Some(saved) = idempotency::saved(&state.pool, key, hash).await? {
            return Ok(respond(saved, true));
        }
    }
    Err(ClaimError::Database(sqlx::Error::RowNotFound).into())
}

/// Reads an order: its status, the reason for it, and its history.
#[utoipa::path(
    get,
    path = "/orders/{id}",
    tag = "orders",
    params(("id" = String, Path, description = "The order id (UUID)", format = Uuid)),
    responses(
        (status = 200, description = "The order", body = OrderResponse),
        (status = 400, description = "The id is not a UUID", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Unexpected error (logged)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Timed out", body = Problem, content_type = "application/problem+json"),
    )
)]
#[tracing::instrument(skip_all, err(level = "info"))]
pub(super) async fn get_order(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<axum::Json<OrderResponse>, ApiError> {
    let order_id = OrderId::from(id_from_path(id)?);
    let mut conn = state.pool.acquire().await?;
    let order = orders::find(&mut conn, order_id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("order {order_id} does not exist")))?;
    Ok(axum::Json(OrderResponse::from(&order)))
}

/// Cancels an order.
///
/// From `PENDING` or `CONFIRMED`: writes `CANCELLED` and one
/// `PedidoCancelado` outbox row in one transaction; the inventory releases
/// the order's reservation, once. With an `Idempotency-Key`, a repeated
/// request gets the original response (header `Idempotent-Replayed: true`).
#[utoipa::path(
    post,
    path = "/orders/{id}/cancel",
    tag = "orders",
    params(
        ("id" = String, Path, description = "The order id (UUID)", format = Uuid),
        ("Idempotency-Key" = Option<String>, Header, pattern = r"^[\x20-\x7e]*[\x21-\x7e][\x20-\x7e]*$", max_length = 255,
            description = "1 to 255 printable ASCII characters, remembered (24 h by default) with the request it came with: a repeated request with the same key replays the original response, the key used on another request answers 422"),
        ("traceparent" = Option<String>, Header,
            description = "W3C Trace Context: the request's trace continues through the event, the relay and its consumers; an invalid one is ignored (a new trace starts when tracing is on)"),
    ),
    responses(
        (status = 200, description = "Cancelled, or the original response replayed", body = OrderResponse,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replayed response"))),
        (status = 400, description = "The id is not a UUID, or an invalid header", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such order", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The order's status forbids it (REJECTED, or already CANCELLED)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Idempotency-Key used before with another request", body = Problem, content_type = "application/problem+json"),
        (status = 500, description = "Unexpected error (logged)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Timed out", body = Problem, content_type = "application/problem+json"),
    )
)]
#[tracing::instrument(skip_all, fields(order.id, idempotency.key), err(level = "info"))]
pub(super) async fn cancel_order(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let order_id = OrderId::from(id_from_path(id)?);
    tracing::Span::current().record("order.id", tracing::field::display(order_id));
    let key = idempotency_key(&headers)?;
    // The event continues this request's trace (the caller's, when tracing
    // is off here).
    let trace = telemetry::outgoing(&tracing::Span::current(), trace_context(&headers));
    // The same key on another order, or on POST /orders, is another request.
    let hash = RequestHash::of(&serde_json::json!({"cancel": order_id.to_string()}))
        .map_err(|error| ApiError::internal("cannot hash the request", error))?;
    let message = events::order_cancelled(order_id, trace);

    if let Some(key) = &key {
        tracing::Span::current().record("idempotency.key", key.as_str());
    }
    // Claimed first, so a concurrent repeat waits for this one; the
    // response is recorded once known, in the same transaction.
    let pending = SavedResponse {
        status: StatusCode::OK.as_u16(),
        body: serde_json::Value::Null,
    };
    let mut tx =
        match idempotency::begin(&state.pool, key.as_ref(), hash, order_id, &pending).await? {
            NextAction::Proceed(tx) => tx,
            NextAction::Replay(saved) => return Ok(respond(saved, true)),
        };
    let change = Change {
        order_id: order_id.as_uuid(),
        to: OrderStatus::Cancelled,
        reason: None,
        message_id: message.id,
    };
    match status::transition(&mut tx, &change).await? {
        Transition::Changed => {}
        Transition::NotAllowed { current } => {
            let allowed: Vec<&str> = OrderStatus::Cancelled
                .comes_from()
                .into_iter()
                .map(OrderStatus::as_str)
                .collect();
            return Err(ApiError::Conflict {
                problem_type: "/problems/order-status-conflict",
                title: "The order's status forbids it",
                detail: format!(
                    "order {order_id} is {current}: only {} orders can be cancelled",
                    allowed.join(" or ")
                ),
            });
        }
        Transition::UnknownOrder => {
            return Err(ApiError::NotFound(format!(
                "order {order_id} does not exist"
            )));
        }
    }
    outbox::insert(
        &mut tx,
        std::slice::from_ref(&message),
        state.outbox_cleanup,
    )
    .await?;
    let order = orders::find(&mut tx, order_id)
        .await?
        .ok_or_else(|| ApiError::bug(format!("order {order_id} vanished while cancelled")))?;
    let response = saved(StatusCode::OK, &OrderResponse::from(&order))?;
    if let Some(key) = &key {
        idempotency::record_response(&mut tx, key, &response).await?;
    }
    tx.commit().await?;

    metrics::counter!("orders_cancelled_total").increment(1);
    metrics::counter!("outbox_rows_written_total", "event_type" => message.event_type).increment(1);
    Ok(respond(response, false))
}

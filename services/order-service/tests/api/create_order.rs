use serde_json::Value;
use uuid::Uuid;

use crate::helpers::{order_body, spawn_app};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test]
async fn a_valid_order_is_created_with_location_and_can_be_read_back() {
    let app = spawn_app().await;

    let created = app
        .post_order(&order_body("c-42", &[("ABC-1", 2), ("XYZ-9", 1)]))
        .await;

    assert_eq!(created.status, 201, "{}", created.body);
    let id = created.body["id"].as_str().unwrap();
    assert_eq!(Uuid::parse_str(id).unwrap().get_version_num(), 7);
    assert_eq!(
        created.header("location"),
        Some(format!("/orders/{id}").as_str())
    );
    assert_eq!(created.body["customerId"], "c-42");
    assert_eq!(created.body["status"], "PENDING");
    assert_eq!(
        created.body["items"],
        serde_json::json!([{"sku": "ABC-1", "quantity": 2}, {"sku": "XYZ-9", "quantity": 1}])
    );
    let read = app.get(&format!("/orders/{id}")).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.body, created.body);
    assert_eq!(app.count("orders").await, 1);
    assert_eq!(app.count("order_items").await, 2);
    assert_eq!(app.count("outbox").await, 1);
}

#[tokio::test]
async fn the_outbox_row_matches_the_contract_column_by_column() {
    let app = spawn_app().await;

    let created = app
        .post_order_with(
            &order_body("c-42", &[("ABC-1", 2)]),
            &[("traceparent", TRACEPARENT)],
        )
        .await;
    assert_eq!(created.status, 201);
    let order_id = created.body["id"].as_str().unwrap().to_owned();

    let (id, aggregatetype, aggregateid, event_type, payload, traceparent, created_at_matches): (
        Uuid,
        String,
        String,
        String,
        Value,
        Option<String>,
        bool,
    ) = sqlx::query_as(
        "select ob.id, ob.aggregatetype, ob.aggregateid, ob.type, ob.payload, ob.traceparent,
                ob.created_at <= now() and ob.created_at >= o.created_at - interval '1 minute'
         from outbox ob join orders o on o.id::text = ob.aggregateid",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(id.get_version_num(), 7, "the message id is a fresh UUIDv7");
    assert_ne!(
        id.to_string(),
        order_id,
        "the message id is not the order id"
    );
    assert_eq!(aggregatetype, "pedido");
    assert_eq!(aggregateid, order_id);
    assert_eq!(event_type, "PedidoCriado");
    assert_eq!(traceparent.as_deref(), Some(TRACEPARENT));
    assert!(created_at_matches);

    let object = payload.as_object().unwrap();
    let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["clienteId", "criadoEm", "itens", "pedidoId"]);
    assert_eq!(payload["pedidoId"], order_id.as_str());
    assert_eq!(payload["clienteId"], "c-42");
    assert_eq!(
        payload["itens"],
        serde_json::json!([{"sku": "ABC-1", "quantidade": 2}])
    );
    // criadoEm is the order's own timestamp, RFC 3339 in UTC.
    assert_eq!(payload["criadoEm"], created.body["createdAt"]);
    let criado_em = payload["criadoEm"].as_str().unwrap();
    assert!(criado_em.ends_with('Z'), "{criado_em}");
    time::OffsetDateTime::parse(criado_em, &time::format_description::well_known::Rfc3339).unwrap();
}

#[tokio::test]
async fn an_invalid_traceparent_is_ignored_not_refused() {
    let app = spawn_app().await;

    let created = app
        .post_order_with(
            &order_body("c-1", &[("A", 1)]),
            &[("traceparent", "not-a-trace")],
        )
        .await;

    assert_eq!(created.status, 201);
    let stored: Option<String> = sqlx::query_scalar("select traceparent from outbox")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored, None);
}

#[tokio::test]
async fn unknown_and_malformed_order_ids_get_404_and_400() {
    let app = spawn_app().await;

    app.get(&format!("/orders/{}", Uuid::now_v7()))
        .await
        .assert_problem(404, "/problems/not-found");
    app.get("/orders/42")
        .await
        .assert_problem(400, "/problems/invalid-id");
    app.get("/orders/%FF%FE")
        .await
        .assert_problem(400, "/problems/invalid-id");
}

/// JSON Schema's `integer` (the OpenAPI document's type for `quantity`)
/// includes `2.0`; before, the body was refused with 422 ("invalid type:
/// floating point `2.0`, expected i64"), found by schemathesis.
#[tokio::test]
async fn a_quantity_written_with_a_zero_fraction_is_an_integer() {
    let app = spawn_app().await;

    let created = app
        .post_order(&serde_json::json!({"customerId": "c-42", "items": [{"sku": "ABC-1", "quantity": 2.0}]}))
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["items"][0]["quantity"], 2);

    let refused = app
        .post_order(&serde_json::json!({"customerId": "c-42", "items": [{"sku": "ABC-1", "quantity": 2.5}]}))
        .await;
    assert_eq!(refused.status, 422, "{}", refused.body);
    assert_eq!(refused.body["errors"][0]["pointer"], "#/items/0/quantity");
}

/// POST /orders writes its outbox row inside its own statement
/// (src/placing.rs), not through `outbox::insert`: the two must write the
/// same row, every column but the row's identity and time.
#[tokio::test]
async fn the_order_writes_its_outbox_row_as_outbox_insert_does() {
    const TRACESTATE: &str = "entrega=t61rcWkgMzE";
    let app = spawn_app().await;
    let created = app
        .post_order_with(
            &order_body("c-42", &[("ABC-1", 2), ("XYZ-9", 1)]),
            &[("traceparent", TRACEPARENT), ("tracestate", TRACESTATE)],
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let (placed, aggregateid, payload): (Uuid, String, Value) =
        sqlx::query_as("select id, aggregateid, payload from outbox")
            .fetch_one(&app.pool)
            .await
            .unwrap();

    let message = outbox::OutboxMessage::new(
        order_service::events::AGGREGATE_TYPE_ORDER,
        aggregateid,
        order_service::events::EVENT_ORDER_CREATED,
        payload,
        outbox::TraceContext::parse(TRACEPARENT, Some(TRACESTATE)),
    );
    let mut conn = app.pool.acquire().await.unwrap();
    outbox::insert(
        &mut conn,
        std::slice::from_ref(&message),
        outbox::Cleanup::Relay,
    )
    .await
    .unwrap();

    test_support::outbox::assert_rows_alike(&app.pool, placed, message.id).await;
    let context: Option<String> =
        sqlx::query_scalar("select tracingspancontext from outbox where id = $1")
            .bind(placed)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(
        context.as_deref().is_some_and(|c| c.contains(TRACESTATE)),
        "{context:?}"
    );
}

use futures::future::join_all;

use crate::helpers::{order_body, spawn_app};

#[tokio::test]
async fn the_same_key_and_body_replays_the_original_response_and_writes_nothing() {
    let app = spawn_app().await;
    let body = order_body("c-42", &[("ABC-1", 2)]);

    let first = app
        .post_order_with(&body, &[("Idempotency-Key", "key-1")])
        .await;
    let second = app
        .post_order_with(&body, &[("Idempotency-Key", "key-1")])
        .await;

    assert_eq!(first.status, 201);
    assert_eq!(second.status, 201);
    assert_eq!(second.body, first.body);
    assert_eq!(second.header("location"), first.header("location"));
    assert_eq!(first.header("idempotent-replayed"), None);
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.count("orders").await, 1);
    assert_eq!(app.count("outbox").await, 1);
}

#[tokio::test]
async fn formatting_differences_do_not_make_a_different_body() {
    let app = spawn_app().await;
    let compact = r#"{"customerId":"c-1","items":[{"sku":"A","quantity":1}]}"#;
    let spaced = r#"{ "items": [ { "quantity": 1, "sku": "A" } ],  "customerId": "c-1" }"#;

    let mut replies = Vec::new();
    for raw in [compact, spaced] {
        let reply = app
            .client
            .post(app.url("/orders"))
            .header("content-type", "application/json")
            .header("Idempotency-Key", "same-order")
            .body(raw)
            .send()
            .await
            .unwrap();
        replies.push(reply.status().as_u16());
    }

    assert_eq!(replies, [201, 201]);
    assert_eq!(app.count("orders").await, 1);
}

#[tokio::test]
async fn the_same_key_with_another_body_is_refused_and_writes_nothing() {
    let app = spawn_app().await;
    let first = app
        .post_order_with(
            &order_body("c-42", &[("ABC-1", 2)]),
            &[("Idempotency-Key", "key-2")],
        )
        .await;
    assert_eq!(first.status, 201);

    let other = app
        .post_order_with(
            &order_body("c-42", &[("ABC-1", 3)]),
            &[("Idempotency-Key", "key-2")],
        )
        .await;

    other.assert_problem(422, "/problems/idempotency-key-reused");
    assert_eq!(app.count("orders").await, 1);
    assert_eq!(app.count("outbox").await, 1);
}

#[tokio::test]
async fn concurrent_requests_with_one_key_create_one_order() {
    let app = spawn_app().await;
    let body = order_body("c-42", &[("ABC-1", 2)]);

    let replies =
        join_all((0..8).map(|_| app.post_order_with(&body, &[("Idempotency-Key", "race")]))).await;

    for reply in &replies {
        assert_eq!(reply.status, 201, "{}", reply.body);
        assert_eq!(reply.body, replies[0].body);
    }
    let originals = replies
        .iter()
        .filter(|r| r.header("idempotent-replayed").is_none())
        .count();
    assert_eq!(originals, 1, "exactly one request wrote the order");
    assert_eq!(app.count("orders").await, 1);
    assert_eq!(app.count("outbox").await, 1);
    assert_eq!(app.count("idempotency_keys").await, 1);
}

#[tokio::test]
async fn requests_without_a_key_are_independent() {
    let app = spawn_app().await;
    let body = order_body("c-42", &[("ABC-1", 2)]);

    let first = app.post_order(&body).await;
    let second = app.post_order(&body).await;

    assert_ne!(first.body["id"], second.body["id"]);
    assert_eq!(app.count("orders").await, 2);
    assert_eq!(app.count("outbox").await, 2);
}

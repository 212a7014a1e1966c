//! Every kind of bad input: the exact status and problem type, the field
//! pointer where there is one, and nothing written.

use serde_json::{Value, json};

use crate::helpers::{order_body, spawn_app};

/// One invalid body and what it must produce.
struct Case {
    name: &'static str,
    body: Value,
    pointers: &'static [&'static str],
}

fn items(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"sku": format!("SKU-{i}"), "quantity": 1}))
        .collect()
}

fn validation_cases() -> Vec<Case> {
    vec![
        Case {
            name: "empty items",
            body: json!({"customerId": "c", "items": []}),
            pointers: &["#/items"],
        },
        Case {
            name: "101 items",
            body: json!({"customerId": "c", "items": items(101)}),
            pointers: &["#/items"],
        },
        Case {
            name: "duplicate sku",
            body: order_body("c", &[("A-1", 1), ("B-2", 1), ("A-1", 2)]),
            pointers: &["#/items/2/sku"],
        },
        Case {
            name: "quantity 0",
            body: order_body("c", &[("A", 0)]),
            pointers: &["#/items/0/quantity"],
        },
        Case {
            name: "negative quantity",
            body: order_body("c", &[("A", -3)]),
            pointers: &["#/items/0/quantity"],
        },
        Case {
            name: "quantity 10001",
            body: order_body("c", &[("A", 10_001)]),
            pointers: &["#/items/0/quantity"],
        },
        Case {
            name: "quantity as text",
            body: json!({"customerId": "c", "items": [{"sku": "A", "quantity": "2"}]}),
            pointers: &["#/items/0/quantity"],
        },
        Case {
            name: "fractional quantity",
            body: json!({"customerId": "c", "items": [{"sku": "A", "quantity": 1.5}]}),
            pointers: &["#/items/0/quantity"],
        },
        Case {
            name: "lower-case sku",
            body: order_body("c", &[("abc-1", 1)]),
            pointers: &["#/items/0/sku"],
        },
        Case {
            name: "sku with a space",
            body: order_body("c", &[("AB C", 1)]),
            pointers: &["#/items/0/sku"],
        },
        Case {
            name: "empty sku",
            body: order_body("c", &[("", 1)]),
            pointers: &["#/items/0/sku"],
        },
        Case {
            name: "65-character sku",
            body: json!({"customerId": "c", "items": [{"sku": "A".repeat(65), "quantity": 1}]}),
            pointers: &["#/items/0/sku"],
        },
        Case {
            name: "empty customerId",
            body: order_body("", &[("A", 1)]),
            pointers: &["#/customerId"],
        },
        Case {
            name: "129-character customerId",
            body: json!({"customerId": "c".repeat(129), "items": [{"sku": "A", "quantity": 1}]}),
            pointers: &["#/customerId"],
        },
        Case {
            name: "missing customerId",
            body: json!({"items": items(1)}),
            pointers: &[""],
        },
        Case {
            name: "unknown field",
            body: json!({"customerId": "c", "items": items(1), "coupon": "FREE"}),
            pointers: &["#/coupon"],
        },
        Case {
            name: "an array instead of an object",
            body: json!([1, 2]),
            pointers: &[""],
        },
        Case {
            name: "null",
            body: Value::Null,
            pointers: &[""],
        },
        Case {
            name: "several fields at once",
            body: json!({"customerId": "", "items": [{"sku": "a", "quantity": 0}]}),
            pointers: &["#/customerId", "#/items/0/sku", "#/items/0/quantity"],
        },
    ]
}

#[tokio::test]
async fn invalid_fields_get_422_with_pointers_and_write_nothing() {
    let app = spawn_app().await;
    for case in validation_cases() {
        let reply = app.post_order(&case.body).await;
        let mut pointers = reply.assert_problem(422, "/problems/validation");
        pointers.iter_mut().for_each(|p| {
            // Shape errors on the whole body point at the root.
            if p == "#" {
                p.clear();
            }
        });
        assert_eq!(
            pointers, case.pointers,
            "case {:?}: {}",
            case.name, reply.body
        );
    }
    app.assert_nothing_written().await;
}

#[tokio::test]
async fn malformed_json_gets_400() {
    let app = spawn_app().await;
    for raw in [
        r#"{"customerId": "c", "items": ["#,
        "",
        "not json",
        r#"{"customerId": "c",}"#,
    ] {
        app.post_raw(raw, Some("application/json"))
            .await
            .assert_problem(400, "/problems/malformed-json");
    }
    app.assert_nothing_written().await;
}

#[tokio::test]
async fn a_body_that_is_not_declared_json_gets_415() {
    let app = spawn_app().await;
    let body = order_body("c", &[("A", 1)]).to_string();
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        None,
    ] {
        app.post_raw(body.clone(), content_type)
            .await
            .assert_problem(415, "/problems/unsupported-media-type");
    }
    // Parameters and +json types are still JSON.
    assert_eq!(
        app.post_raw(body.clone(), Some("application/json; charset=utf-8"))
            .await
            .status,
        201
    );
    assert_eq!(app.count("orders").await, 1);
}

#[tokio::test]
async fn a_body_over_64_kib_gets_413() {
    let app = spawn_app().await;
    let padding = "x".repeat(64 * 1024);
    let body = json!({"customerId": "c", "items": items(1), "padding": padding}).to_string();

    app.post_raw(body, Some("application/json"))
        .await
        .assert_problem(413, "/problems/payload-too-large");
    app.assert_nothing_written().await;
}

#[tokio::test]
async fn an_invalid_idempotency_key_gets_400() {
    let app = spawn_app().await;
    let body = order_body("c", &[("A", 1)]);
    let long = "k".repeat(256);
    for key in ["   ", long.as_str()] {
        app.post_order_with(&body, &[("Idempotency-Key", key)])
            .await
            .assert_problem(400, "/problems/invalid-header");
    }
    app.assert_nothing_written().await;
}

#[tokio::test]
async fn unknown_routes_and_methods_get_problems_too() {
    let app = spawn_app().await;
    app.get("/nope")
        .await
        .assert_problem(404, "/problems/not-found");
    let reply = app.client.delete(app.url("/orders")).send().await.unwrap();
    assert_eq!(reply.status().as_u16(), 405);
    assert_eq!(reply.headers()["content-type"], "application/problem+json");
}

use crate::helpers::{order_body, spawn_app};

#[tokio::test]
async fn openapi_lists_every_route_and_its_error_responses() {
    let app = spawn_app().await;

    let document = app.get("/openapi.json").await;

    assert_eq!(document.status, 200);
    let paths = document.body["paths"].as_object().unwrap();
    for (path, method) in [
        ("/orders", "post"),
        ("/orders/{id}", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
        ("/docs", "get"),
    ] {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} is not documented"
        );
    }
    let post = &paths["/orders"]["post"]["responses"];
    for status in ["201", "400", "413", "415", "422", "500", "503"] {
        assert!(
            post.get(status).is_some(),
            "POST /orders does not document {status}"
        );
    }
    let problem = &post["422"]["content"]["application/problem+json"];
    assert!(problem.is_object(), "422 is not documented as problem+json");
    let get = &paths["/orders/{id}"]["get"]["responses"];
    for status in ["200", "400", "404"] {
        assert!(
            get.get(status).is_some(),
            "GET /orders/{{id}} does not document {status}"
        );
    }
}

#[tokio::test]
async fn the_docs_page_is_served() {
    let app = spawn_app().await;
    let reply = app.client.get(app.url("/docs")).send().await.unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    assert!(
        reply.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
}

#[tokio::test]
async fn healthz_is_up_and_readyz_follows_the_database() {
    let app = spawn_app().await;
    assert_eq!(app.get("/healthz").await.status, 200);
    assert_eq!(app.get("/readyz").await.status, 200);

    app.drop_database().await;

    app.get("/readyz")
        .await
        .assert_problem(503, "/problems/unavailable");
    assert_eq!(
        app.get("/healthz").await.status,
        200,
        "liveness does not depend on the database"
    );
}

#[tokio::test]
async fn metrics_count_requests_by_route_and_orders_created() {
    let app = spawn_app().await;
    assert_eq!(
        app.post_order(&order_body("c", &[("A", 1)])).await.status,
        201
    );

    let reply = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(reply.status().as_u16(), 200);
    let text = reply.text().await.unwrap();
    for expected in [
        r#"http_requests_total{method="POST",route="/orders",status="201"}"#,
        "http_request_duration_seconds_bucket{",
        "orders_created_total",
        r#"outbox_rows_written_total{event_type="PedidoCriado"}"#,
    ] {
        assert!(
            text.contains(expected),
            "/metrics lacks {expected}:\n{text}"
        );
    }
}

#[tokio::test]
async fn shutdown_finishes_and_the_service_stops_serving() {
    let mut app = spawn_app().await;
    assert_eq!(
        app.post_order(&order_body("c", &[("A", 1)])).await.status,
        201
    );

    app.stop().await;

    assert!(app.client.get(app.url("/healthz")).send().await.is_err());
}

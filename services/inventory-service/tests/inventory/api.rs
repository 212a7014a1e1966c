use std::time::Duration;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{InventoryTest, Outgoing};

async fn send(method: reqwest::Method, url: String, body: Option<&str>) -> (u16, String, Value) {
    let client = reqwest::Client::new();
    let mut request = client
        .request(method, url)
        .bearer_auth(test_support::ADMIN_TOKEN);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let reply = request.send().await.unwrap();
    let status = reply.status().as_u16();
    let content_type = reply
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = reply.json().await.unwrap_or(Value::Null);
    (status, content_type, body)
}

#[tokio::test]
async fn stock_and_reservations_can_be_set_and_read() {
    let test = InventoryTest::new().await;
    let service = test.start(&[], &[]).await;
    let base = &service.http;

    let (status, _, body) = send(
        reqwest::Method::PUT,
        format!("{base}/stock/ABC-1"),
        Some(r#"{"available": 10}"#),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"sku": "ABC-1", "available": 10, "reserved": 0})
    );
    let order = Uuid::now_v7();
    test.produce(&Outgoing::order(order, &[("ABC-1", 4)])).await;
    test.wait_for_reservation(order).await;

    let (status, _, body) = send(reqwest::Method::GET, format!("{base}/stock/ABC-1"), None).await;
    assert_eq!(
        (status, body),
        (200, json!({"sku": "ABC-1", "available": 6, "reserved": 4}))
    );
    let (status, _, body) = send(
        reqwest::Method::GET,
        format!("{base}/reservations/{order}"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        json!({"orderId": order, "status": "RESERVED", "reason": null, "items": [{"sku": "ABC-1", "quantity": 4}]})
    );
    // Setting stock keeps what is reserved.
    let (_, _, body) = send(
        reqwest::Method::PUT,
        format!("{base}/stock/ABC-1"),
        Some(r#"{"available": 50}"#),
    )
    .await;
    assert_eq!(
        body,
        json!({"sku": "ABC-1", "available": 50, "reserved": 4})
    );
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn bad_input_gets_problem_json_and_never_a_server_error() {
    let test = InventoryTest::new().await;
    let service = test.start(&[], &[]).await;
    let base = &service.http;
    let put = reqwest::Method::PUT;
    let get = reqwest::Method::GET;
    let cases: Vec<(reqwest::Method, String, Option<&str>, u16, &str)> = vec![
        (
            put.clone(),
            format!("{base}/stock/ABC-1"),
            Some(r#"{"available": -1}"#),
            422,
            "/problems/validation",
        ),
        (
            put.clone(),
            format!("{base}/stock/ABC-1"),
            Some(r#"{"available": 1e12}"#),
            422,
            "/problems/validation",
        ),
        (
            put.clone(),
            format!("{base}/stock/ABC-1"),
            Some(r#"{"available": "ten"}"#),
            422,
            "/problems/validation",
        ),
        (
            put.clone(),
            format!("{base}/stock/ABC-1"),
            Some(r#"{"stock": 1}"#),
            422,
            "/problems/validation",
        ),
        (
            put.clone(),
            format!("{base}/stock/ABC-1"),
            Some("{"),
            400,
            "/problems/malformed-json",
        ),
        (
            put.clone(),
            format!("{base}/stock/abc"),
            Some(r#"{"available": 1}"#),
            400,
            "/problems/invalid-path",
        ),
        (
            get.clone(),
            format!("{base}/stock/abc"),
            None,
            400,
            "/problems/invalid-path",
        ),
        (
            get.clone(),
            format!("{base}/stock/NONE-1"),
            None,
            404,
            "/problems/not-found",
        ),
        (
            get.clone(),
            format!("{base}/reservations/42"),
            None,
            400,
            "/problems/invalid-id",
        ),
        (
            get.clone(),
            format!("{base}/reservations/{}", Uuid::now_v7()),
            None,
            404,
            "/problems/not-found",
        ),
        (
            reqwest::Method::DELETE,
            format!("{base}/stock/ABC-1"),
            None,
            405,
            "/problems/method-not-allowed",
        ),
    ];
    for (method, url, body, status, problem_type) in cases {
        let (got, content_type, problem) = send(method.clone(), url.clone(), body).await;
        assert_eq!(got, status, "{method} {url} {body:?}: {problem}");
        assert_eq!(content_type, "application/problem+json", "{method} {url}");
        assert_eq!(problem["type"], problem_type, "{method} {url}");
    }
    let text = reqwest::Client::new()
        .put(format!("{base}/stock/ABC-1"))
        .bearer_auth(test_support::ADMIN_TOKEN)
        .header("content-type", "text/plain")
        .body("10")
        .send()
        .await
        .unwrap();
    assert_eq!(text.status().as_u16(), 415);
    assert_eq!(
        test.count("select count(*) from stock").await,
        0,
        "nothing was written"
    );
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn openapi_lists_every_route_and_metrics_name_the_consumer() {
    let test = InventoryTest::new().await;
    let service = test.start(&[], &[]).await;

    let (status, _, document) = send(
        reqwest::Method::GET,
        format!("{}/openapi.json", service.http),
        None,
    )
    .await;

    assert_eq!(status, 200);
    for (path, method) in [
        ("/stock/{sku}", "put"),
        ("/stock/{sku}", "get"),
        ("/reservations/{orderId}", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
        ("/docs", "get"),
    ] {
        assert!(
            document["paths"][path][method].is_object(),
            "{method} {path} is not documented"
        );
    }
    test.produce(&Outgoing::order(Uuid::now_v7(), &[("NONE-1", 1)]))
        .await;
    test_support::eventually::eventually(
        "the record is processed",
        Duration::from_secs(30),
        || async { (service.metric("consumer_processed_total").await >= 1.0).then_some(()) },
    )
    .await;
    let metrics = service.metrics().await;
    for name in [
        "consumer_processed_total",
        "consumer_processing_duration_seconds_bucket",
        "consumer_assigned_partitions",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}");
    }
    service.service.terminate(Duration::from_secs(30)).await;
}

/// Setting stock is an admin write: without the bearer token 401 (with a
/// challenge), with another token 403, and a service started without a
/// token refuses it to everyone; reads stay open. Nothing is written by a
/// refused request.
#[tokio::test]
async fn setting_stock_needs_the_admin_token() {
    let test = InventoryTest::new().await;
    let service = test.start(&[], &[]).await;
    let url = format!("{}/stock/ABC-1", service.http);
    let client = reqwest::Client::new();
    let put = |token: Option<&'static str>| {
        let mut request = client.put(&url).json(&json!({"available": 5}));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send()
    };
    let refused = put(None).await.unwrap();
    assert_eq!(refused.status().as_u16(), 401);
    assert_eq!(refused.headers()["www-authenticate"], "Bearer");
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    let refused = put(Some("not-the-token")).await.unwrap();
    assert_eq!(refused.status().as_u16(), 403);
    let problem: Value = refused.json().await.unwrap();
    assert_eq!(problem["type"], "/problems/forbidden");
    assert_eq!(test.count("select count(*) from stock").await, 0);
    assert_eq!(
        put(Some(test_support::ADMIN_TOKEN))
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    service.service.terminate(Duration::from_secs(30)).await;

    // Without a token (an empty INVENTORY_ADMIN_TOKEN counts as unset).
    let unset = test
        .start(&[], &[("INVENTORY_ADMIN_TOKEN", String::new())])
        .await;
    let url = format!("{}/stock/ABC-1", unset.http);
    let refused = client
        .put(&url)
        .bearer_auth(test_support::ADMIN_TOKEN)
        .json(&json!({"available": 7}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 403);
    let problem: Value = refused.json().await.unwrap();
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("INVENTORY_ADMIN_TOKEN is not set"),
        "{problem}"
    );
    let (status, _, body) = send(reqwest::Method::GET, url, None).await;
    assert_eq!(
        (status, body["available"].clone()),
        (200, json!(5)),
        "reads stay open"
    );
    unset.service.terminate(Duration::from_secs(30)).await;
}

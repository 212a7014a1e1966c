//! Orders through the order service's API, concurrently, deterministic per
//! seed: mostly orders that fit, some that exceed stock (sku LOW-1).

use std::time::Duration;

use futures::stream::{self, StreamExt};
use uuid::Uuid;

/// An order the API accepted (2xx).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub id: Uuid,
    pub items: Vec<(String, i32)>,
}

fn next(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    *seed >> 33
}

/// The items of order `n`: one in ten asks for more LOW-1 than there is.
fn items(seed: &mut u64) -> Vec<(String, i32)> {
    const SKUS: [&str; 3] = ["ABC-1", "XYZ-9", "DEF-2"];
    if next(seed) % 10 == 0 {
        return vec![("LOW-1".to_owned(), 7), ("ABC-1".to_owned(), 1)];
    }
    let first = usize::try_from(next(seed) % 3).unwrap_or(0);
    let mut items = vec![(
        SKUS[first].to_owned(),
        i32::try_from(1 + next(seed) % 5).unwrap_or(1),
    )];
    if next(seed) % 2 == 0 {
        items.push((
            SKUS[(first + 1) % 3].to_owned(),
            i32::try_from(1 + next(seed) % 3).unwrap_or(1),
        ));
    }
    items
}

/// Places `count` orders, `concurrency` at a time; every one must end with a
/// 2xx. A request that failed in transport or with a 5xx (the database was
/// cut mid-scenario) is retried with the same Idempotency-Key, as a client
/// should: a retried order is still one order. A 4xx fails the scenario.
pub async fn place_orders(
    order_service: &str,
    count: usize,
    concurrency: usize,
    seed: u64,
) -> Vec<Placed> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut seed = seed;
    let requests: Vec<(String, Vec<(String, i32)>)> = (0..count)
        .map(|_| (Uuid::new_v4().to_string(), items(&mut seed)))
        .collect();
    let url = format!("{order_service}/orders");
    stream::iter(requests)
        .map(|(key, items)| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let body = serde_json::json!({
                    "customerId": "c-e2e",
                    "items": items.iter().map(|(sku, q)| serde_json::json!({"sku": sku, "quantity": q})).collect::<Vec<_>>(),
                });
                let (status, reply) = post_until_answered(&client, &url, &key, Some(&body)).await;
                assert!(status.is_success(), "POST /orders answered {status}: {reply}");
                let reply: serde_json::Value = serde_json::from_str(&reply).unwrap_or_default();
                let id = reply["id"].as_str().and_then(|id| Uuid::parse_str(id).ok()).unwrap();
                Placed { id, items }
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// Cancels `orders`, `concurrency` at a time, each with its own
/// Idempotency-Key, retried like [`place_orders`]. Returns the orders whose
/// cancellation was accepted (200); a 409 (the order was REJECTED first) is
/// an answer, not a failure; any other 4xx fails the scenario.
pub async fn cancel_orders(
    order_service: String,
    orders: Vec<Uuid>,
    concurrency: usize,
) -> Vec<Uuid> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let cancelled: Vec<Option<Uuid>> = stream::iter(orders)
        .map(|id| {
            let (client, url) = (
                client.clone(),
                format!("{order_service}/orders/{id}/cancel"),
            );
            let key = format!("cancel-{}", Uuid::new_v4());
            async move {
                let (status, body) = post_until_answered(&client, &url, &key, None).await;
                match status.as_u16() {
                    200 => Some(id),
                    409 => None,
                    _ => panic!("POST /orders/{id}/cancel answered {status}: {body}"),
                }
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    cancelled.into_iter().flatten().collect()
}

/// How long a client keeps retrying one request: longer than the order
/// service is ever down in a scenario (a restart waits out the session).
const RETRY_FOR: Duration = Duration::from_secs(60);

/// POSTs until the service answers with something other than a 5xx,
/// retrying transport errors and 5xx with the same Idempotency-Key.
async fn post_until_answered(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: Option<&serde_json::Value>,
) -> (reqwest::StatusCode, String) {
    let deadline = tokio::time::Instant::now() + RETRY_FOR;
    loop {
        let mut request = client.post(url).header("Idempotency-Key", key);
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Ok(reply) = request.send().await {
            let status = reply.status();
            if !status.is_server_error() {
                return (status, reply.text().await.unwrap_or_default());
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "POST {url} got no answer but errors for {RETRY_FOR:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Places orders in the background while a scenario injects faults.
pub fn place_orders_in_background(
    order_service: &str,
    count: usize,
    concurrency: usize,
    seed: u64,
) -> tokio::task::JoinHandle<Vec<Placed>> {
    let order_service = order_service.to_owned();
    tokio::spawn(async move { place_orders(&order_service, count, concurrency, seed).await })
}

use std::time::Duration;

use e2e::invariants::{check, settle};
use e2e::load::place_orders_in_background;
use e2e::report::{assert_sound, report};
use e2e::{Pipeline, PipelineOptions};

#[tokio::test(flavor = "multi_thread")]
async fn broker_restarts_graceful_and_killed_lose_nothing() {
    let mut pipeline = Pipeline::start(PipelineOptions::default()).await;
    let load = place_orders_in_background(&pipeline.order_service.http, 600, 4, 8);

    pipeline.stop_then_kill_the_broker().await;
    let placed = load.await.unwrap();
    settle(&pipeline, &placed, Duration::from_secs(180)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report("broker_restart", &outcome);
    assert_sound(&outcome);
    pipeline.stop().await;
}

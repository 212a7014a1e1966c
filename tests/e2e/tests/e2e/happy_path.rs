use std::time::Duration;

use e2e::invariants::{check, settle};
use e2e::load::place_orders;
use e2e::report::{assert_sound, report};
use e2e::{Pipeline, PipelineOptions};

#[tokio::test(flavor = "multi_thread")]
async fn happy_path_every_order_gets_exactly_one_outcome() {
    let pipeline = Pipeline::start(PipelineOptions::default()).await;

    let placed = place_orders(&pipeline.order_service.http, 300, 8, 1).await;
    settle(&pipeline, &placed, Duration::from_secs(120)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report("happy_path", &outcome);
    assert_sound(&outcome);
    assert_eq!(outcome.dlt, 0);
    let rejected: i64 =
        sqlx::query_scalar("select count(*) from reservations where status = 'REJECTED'")
            .fetch_one(&pipeline.inventory)
            .await
            .unwrap();
    assert!(rejected > 0, "orders that exceed stock are mixed in");
    pipeline.stop().await;
}

/// Many concurrent orders on a sku with little stock: it is never oversold
/// and every order is decided whole.
#[tokio::test(flavor = "multi_thread")]
async fn orders_that_exceed_stock_are_rejected_and_stock_never_goes_negative() {
    let pipeline = Pipeline::start(PipelineOptions {
        consumers: 2,
        ..PipelineOptions::default()
    })
    .await;

    // About one in ten orders asks for 7 of LOW-1, of which there are 30.
    let placed = place_orders(&pipeline.order_service.http, 400, 16, 7).await;
    settle(&pipeline, &placed, Duration::from_secs(120)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report("orders_exceeding_stock", &outcome);
    assert_sound(&outcome);
    let (available, reserved): (i64, i64) =
        sqlx::query_as("select available, reserved from stock where sku = 'LOW-1'")
            .fetch_one(&pipeline.inventory)
            .await
            .unwrap();
    assert_eq!((available, reserved), (2, 28), "four orders of 7 fit in 30");
    pipeline.stop().await;
}

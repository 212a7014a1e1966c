//! PedidoCancelado: a reservation is released once, announced once; a
//! cancellation that arrives before its order's creation is applied (the
//! creation was dead-lettered and not yet redriven) is recorded, and the
//! late creation reserves nothing.

use std::time::Duration;

use test_support::eventually::eventually;
use uuid::Uuid;

use crate::helpers::{InventoryTest, Outgoing};

/// The events the inventory's outbox holds for `order`, in order.
async fn announced(test: &InventoryTest, order: Uuid) -> Vec<String> {
    sqlx::query_scalar("select type from outbox where aggregateid = $1 order by seq")
        .bind(order.to_string())
        .fetch_all(&test.pool)
        .await
        .unwrap()
}

async fn wait_for_status(test: &InventoryTest, order: Uuid, status: &str) {
    eventually(
        &format!("the reservation of {order} is {status}"),
        Duration::from_secs(60),
        || async {
            test.reservation(order)
                .await
                .filter(|(current, _)| current == status)
                .map(drop)
        },
    )
    .await;
}

#[tokio::test]
async fn a_cancellation_releases_the_reservation_once_and_announces_it_once() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    test.set_stock("XYZ-9", 5).await;
    let service = test.start(&[], &[]).await;
    let order = Uuid::now_v7();
    // The same key: one partition, in this order. Two cancellations with
    // different message ids (a client that cancelled twice, say).
    test.produce_all(&[
        Outgoing::order(order, &[("ABC-1", 3), ("XYZ-9", 2)]),
        Outgoing::cancellation(order),
        Outgoing::cancellation(order),
    ])
    .await;

    wait_for_status(&test, order, "RELEASED").await;
    eventually(
        "all three are processed",
        Duration::from_secs(30),
        || async { (service.metric("consumer_processed_total").await >= 3.0).then_some(()) },
    )
    .await;
    assert_eq!(test.stock("ABC-1").await, (10, 0));
    assert_eq!(test.stock("XYZ-9").await, (5, 0));
    assert_eq!(
        announced(&test, order).await,
        ["EstoqueReservado", "EstoqueLiberado"]
    );
    assert_eq!(
        service
            .metric("consumer_processed_total{outcome=\"already-cancelled\"")
            .await,
        1.0
    );
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_cancellation_before_the_creation_is_recorded_and_the_late_creation_reserves_nothing() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    let service = test.start(&[], &[]).await;
    let order = Uuid::now_v7();
    // The creation was dead-lettered; its cancellation comes first, and the
    // creation is redriven afterwards.
    test.produce(&Outgoing::cancellation(order)).await;
    wait_for_status(&test, order, "CANCELLED").await;
    test.produce(&Outgoing::order(order, &[("ABC-1", 4)])).await;
    eventually(
        "the late creation is processed",
        Duration::from_secs(30),
        || async {
            (service
                .metric("consumer_processed_total{outcome=\"already-decided\"")
                .await
                >= 1.0)
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        test.reservation(order).await.map(|r| r.0).as_deref(),
        Some("CANCELLED")
    );
    assert_eq!(test.stock("ABC-1").await, (10, 0));
    assert!(announced(&test, order).await.is_empty());
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn cancelling_a_rejected_order_gives_nothing_back() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 1).await;
    let service = test.start(&[], &[]).await;
    let order = Uuid::now_v7();
    test.produce_all(&[
        Outgoing::order(order, &[("ABC-1", 5)]),
        Outgoing::cancellation(order),
    ])
    .await;
    wait_for_status(&test, order, "REJECTED").await;
    eventually(
        "the cancellation is processed",
        Duration::from_secs(30),
        || async {
            (service
                .metric("consumer_processed_total{outcome=\"nothing-reserved\"")
                .await
                >= 1.0)
                .then_some(())
        },
    )
    .await;
    assert_eq!(test.stock("ABC-1").await, (1, 0));
    assert_eq!(announced(&test, order).await, ["EstoqueRejeitado"]);
    service.service.terminate(Duration::from_secs(30)).await;
}

use std::time::Duration;

use e2e::invariants::{check, settle, settle_reservations};
use e2e::load::{Placed, place_orders_in_background};
use e2e::pipeline::TOPIC;
use e2e::report::{assert_sound, report};
use e2e::{Pipeline, PipelineOptions};
use uuid::Uuid;

/// A record produced straight to the topic, as a bad producer would.
async fn produce(broker: &str, key: &str, value: &str, headers: &[(&str, Option<&str>)]) {
    let headers: Vec<(&str, Option<&[u8]>)> = headers
        .iter()
        .map(|(name, value)| (*name, value.map(str::as_bytes)))
        .collect();
    test_support::kafka::produce(broker, TOPIC, key, value.as_bytes(), &headers).await;
}

fn event(order: Uuid, sku: &str, quantity: i32) -> String {
    serde_json::json!({"itens": [{"sku": sku, "quantidade": quantity}], "criadoEm": "2026-12-02T15:00:00Z",
                       "pedidoId": order, "clienteId": "c-poison"})
    .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_of_every_class_mid_load_lands_in_the_dlt_and_is_redriven_once_fixed() {
    let mut pipeline = Pipeline::start(PipelineOptions::default()).await;
    pipeline.set_stock("PSN-1", 10).await;
    let load = place_orders_in_background(&pipeline.order_service.http, 400, 4, 10);
    let broker = pipeline.broker.address().to_owned();
    let order = Uuid::now_v7();
    let id = Uuid::now_v7().to_string();
    let valid = event(order, "ABC-1", 1);
    let headers =
        |id: Option<&'static str>, kind: &'static str| vec![("id", id), ("eventType", Some(kind))];

    let leaked: &'static str = Box::leak(id.clone().into_boxed_str());
    produce(
        &broker,
        &order.to_string(),
        "{not json",
        &headers(Some(leaked), "PedidoCriado"),
    )
    .await;
    produce(
        &broker,
        &order.to_string(),
        &valid,
        &headers(None, "PedidoCriado"),
    )
    .await;
    produce(
        &broker,
        &order.to_string(),
        &valid,
        &headers(Some("not-a-uuid"), "PedidoCriado"),
    )
    .await;
    produce(
        &broker,
        &order.to_string(),
        &valid,
        &headers(Some(leaked), "PedidoDevolvido"),
    )
    .await;
    produce(
        &broker,
        &order.to_string(),
        &event(order, "ABC-1", 0),
        &headers(Some(leaked), "PedidoCriado"),
    )
    .await;
    pipeline.faults += 5;

    // A transient one: its sku is locked until the retries run out.
    let mut lock = pipeline.inventory.begin().await.unwrap();
    sqlx::query("select * from stock where sku = 'PSN-1' for update")
        .execute(&mut *lock)
        .await
        .unwrap();
    let stuck_order = Uuid::now_v7();
    let stuck_id = Uuid::now_v7().to_string();
    let stuck_leaked: &'static str = Box::leak(stuck_id.into_boxed_str());
    produce(
        &broker,
        &stuck_order.to_string(),
        &event(stuck_order, "PSN-1", 3),
        &headers(Some(stuck_leaked), "PedidoCriado"),
    )
    .await;
    pipeline.faults += 1;
    test_support::eventually::eventually(
        "the stuck record reaches the DLT",
        Duration::from_secs(60),
        || async {
            let consumer = &pipeline.consumers[0];
            consumer
                .metric("consumer_dlt_total{reason=\"retries-exhausted\"}")
                .await
                .filter(|n| *n >= 1.0)
                .map(|_| ())
        },
    )
    .await;
    lock.rollback().await.unwrap();

    // The cause is fixed: redrive what failed for want of retries.
    pipeline.redrive("retries-exhausted").await;
    let placed = load.await.unwrap();
    let injected = vec![Placed {
        id: stuck_order,
        items: vec![("PSN-1".to_owned(), 3)],
    }];
    settle(&pipeline, &placed, Duration::from_secs(120)).await;
    settle_reservations(&pipeline, &injected, Duration::from_secs(60)).await;

    let outcome = check(&pipeline, &placed, &injected).await;
    report("poison_and_redrive", &outcome);
    assert_sound(&outcome);
    for reason in [
        "invalid-json",
        "missing-header",
        "invalid-header",
        "unknown-event-type",
        "schema-violation",
        "retries-exhausted",
    ] {
        assert_eq!(
            outcome.dlt_reasons.get(reason),
            Some(&1),
            "{reason}: {:?}",
            outcome.dlt_reasons
        );
    }
    // The injected order exists only in the topic: its outcome comes back
    // to an order service that does not have it, which dead-letters it.
    test_support::eventually::eventually(
        "the injected order's outcome is dead-lettered by the order service",
        Duration::from_secs(60),
        || async {
            pipeline
                .order_service
                .metric("consumer_dlt_total{reason=\"unknown-aggregate\"}")
                .await
                .filter(|n| *n >= 1.0)
                .map(drop)
        },
    )
    .await;
    pipeline.stop().await;
}

//! Cancellations under kill -9 of every process: a third of the orders are
//! cancelled while the order service, both relays and the inventory service
//! are killed in turn. Every cancelled order ends CANCELLED with its stock
//! back (or never reserved), each PedidoCancelado is applied after its
//! PedidoCriado, and nothing is lost or applied twice.

use std::time::Duration;

use e2e::invariants::{check_with_cancellations, settle_with_cancellations};
use e2e::load::{cancel_orders, place_orders_in_background};
use e2e::pipeline::Kind;
use e2e::report::{assert_sound, report};
use e2e::{Pipeline, PipelineOptions};
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread")]
async fn a_third_cancelled_while_every_process_is_killed_in_turn() {
    let mut pipeline = Pipeline::start(PipelineOptions {
        consumers: 2,
        ..PipelineOptions::default()
    })
    .await;
    let url = pipeline.order_service.http.clone();
    let mut placed = Vec::new();
    let mut cancelling = Vec::new();
    let mut placing = place_orders_in_background(&url, 90, 4, 300);
    for round in 1..=8_u64 {
        let batch = placing.await.unwrap();
        // The next batch is placed, and a third of this one cancelled, while
        // a process is killed: some still PENDING, some already CONFIRMED,
        // some (out of stock) REJECTED.
        placing = place_orders_in_background(&url, if round < 8 { 90 } else { 0 }, 4, 300 + round);
        let victims: Vec<Uuid> = batch.iter().step_by(3).map(|order| order.id).collect();
        cancelling.push(tokio::spawn(cancel_orders(url.clone(), victims, 4)));
        placed.extend(batch);
        tokio::time::sleep(Duration::from_millis(200)).await;
        match round % 4 {
            0 => {
                pipeline.kill(Kind::Relay, 0).await;
                pipeline.start_relay().await;
            }
            1 => {
                pipeline.kill(Kind::Inventory, 0).await;
                pipeline.start_consumer().await;
            }
            2 => {
                pipeline.kill(Kind::InventoryRelay, 0).await;
                pipeline.start_inventory_relay().await;
            }
            _ => pipeline.restart_order_service().await,
        }
    }
    placed.extend(placing.await.unwrap());
    let mut cancelled = Vec::new();
    for task in cancelling {
        cancelled.extend(task.await.unwrap());
    }
    settle_with_cancellations(&pipeline, &placed, &cancelled, Duration::from_secs(180)).await;

    let outcome = check_with_cancellations(&pipeline, &placed, &[], &cancelled).await;
    report("cancellations_kill_9", &outcome);
    assert_sound(&outcome);
    assert!(
        outcome.cancelled * 4 >= placed.len(),
        "too few cancellations were accepted to test anything: {outcome:?}"
    );
    pipeline.stop().await;
}

use std::time::Duration;

use test_support::eventually::eventually;
use uuid::Uuid;

use crate::helpers::{InventoryTest, Outgoing, PARTITIONS};

#[tokio::test]
async fn a_duplicate_delivery_reserves_stock_once() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    let service = test.start(&[], &[]).await;
    let order = Uuid::now_v7();
    let record = Outgoing::order(order, &[("ABC-1", 3)]);

    test.produce(&record).await;
    test.produce(&record).await;

    assert_eq!(test.wait_for_reservation(order).await.0, "RESERVED");
    eventually(
        "the duplicate is counted",
        Duration::from_secs(30),
        || async { (service.metric("consumer_duplicates_total").await >= 1.0).then_some(()) },
    )
    .await;
    assert_eq!(test.stock("ABC-1").await, (7, 3));
    assert_eq!(
        test.count("select count(*) from mensagem_processada").await,
        1
    );
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn one_message_on_two_consumers_at_once_has_one_effect_and_no_dead_letter() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 100).await;
    let first = test.start(&[], &[]).await;
    let second = test.start(&[], &[]).await;
    eventually(
        "both consumers own partitions",
        Duration::from_secs(60),
        || async {
            let (a, b) = (
                first.metric("consumer_assigned_partitions").await,
                second.metric("consumer_assigned_partitions").await,
            );
            (a > 0.0 && b > 0.0 && a + b == f64::from(PARTITIONS)).then_some(())
        },
    )
    .await;
    let order = Uuid::now_v7();
    let record = Outgoing::order(order, &[("ABC-1", 5)]);

    // The same message on every partition: both consumers race for it.
    for partition in 0..PARTITIONS {
        test.produce(&record.clone().on_partition(partition)).await;
    }

    assert_eq!(test.wait_for_reservation(order).await.0, "RESERVED");
    eventually(
        "all six deliveries are done",
        Duration::from_secs(60),
        || async {
            let done = first.metric("consumer_processed_total").await
                + second.metric("consumer_processed_total").await;
            (done >= 6.0).then_some(())
        },
    )
    .await;
    let duplicates = first.metric("consumer_duplicates_total").await
        + second.metric("consumer_duplicates_total").await;
    assert_eq!(duplicates, 5.0);
    assert_eq!(test.stock("ABC-1").await, (95, 5));
    let dead = first.metric("consumer_dlt_total").await + second.metric("consumer_dlt_total").await;
    assert_eq!(dead, 0.0);
    first.service.terminate(Duration::from_secs(30)).await;
    second.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn an_order_that_exceeds_stock_is_rejected_whole_and_nothing_is_dead_lettered() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    test.set_stock("XYZ-9", 2).await;
    let service = test.start(&[], &[]).await;
    let order = Uuid::now_v7();

    test.produce(&Outgoing::order(order, &[("ABC-1", 4), ("XYZ-9", 3)]))
        .await;

    let (status, reason) = test.wait_for_reservation(order).await;
    assert_eq!(status, "REJECTED");
    assert_eq!(
        reason.as_deref(),
        Some("insufficient stock for XYZ-9: requested 3, available 2")
    );
    assert_eq!(test.stock("ABC-1").await, (10, 0), "all or nothing");
    assert_eq!(test.stock("XYZ-9").await, (2, 0));
    // An unknown sku is a business outcome too.
    let unknown = Uuid::now_v7();
    test.produce(&Outgoing::order(unknown, &[("NOPE-1", 1)]))
        .await;
    assert_eq!(
        test.wait_for_reservation(unknown).await.1.as_deref(),
        Some("unknown sku NOPE-1")
    );
    assert_eq!(service.metric("consumer_dlt_total").await, 0.0);
    service.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_kill_between_the_database_commit_and_the_offset_commit_still_reserves_once() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 1_000).await;
    // Offsets are stored but never committed before the kill: every record
    // processed is delivered again after the restart.
    let no_commit = [("KAFKA_AUTO_COMMIT_INTERVAL_MS", "600000".to_owned())];
    let service = test.start(&[], &no_commit).await;
    let orders: Vec<Uuid> = (0..20).map(|_| Uuid::now_v7()).collect();
    for order in &orders {
        test.produce(&Outgoing::order(*order, &[("ABC-1", 2)]))
            .await;
    }
    for order in &orders {
        test.wait_for_reservation(*order).await;
    }

    service.service.kill().await;
    // tansu: a member restarted within its session timeout may get no
    // partitions (docs/local-services.md); wait the session out.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let restarted = test.start(&[], &[]).await;

    eventually(
        "the redelivered records are absorbed",
        Duration::from_secs(60),
        || async { (restarted.metric("consumer_duplicates_total").await >= 20.0).then_some(()) },
    )
    .await;
    assert_eq!(test.stock("ABC-1").await, (960, 40));
    assert_eq!(test.count("select count(*) from reservations").await, 20);
    assert_eq!(
        test.count("select count(*) from mensagem_processada").await,
        20
    );
    restarted.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn shutdown_commits_what_was_processed_and_a_restart_resumes_at_the_next_record() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 1_000).await;
    let no_auto_commit = [("KAFKA_AUTO_COMMIT_INTERVAL_MS", "600000".to_owned())];
    let service = test.start(&[], &no_auto_commit).await;
    let orders: Vec<Uuid> = (0..10).map(|_| Uuid::now_v7()).collect();
    for order in &orders {
        test.produce(&Outgoing::order(*order, &[("ABC-1", 1)]))
            .await;
    }
    for order in &orders {
        test.wait_for_reservation(*order).await;
    }

    assert_eq!(
        service.service.terminate(Duration::from_secs(30)).await,
        Some(0)
    );

    // The final commit happened, at the next record to read: a new consumer
    // redoes nothing, and skips nothing.
    let restarted = test.start(&[], &[]).await;
    let next = Uuid::now_v7();
    test.produce(&Outgoing::order(next, &[("ABC-1", 1)])).await;
    assert_eq!(test.wait_for_reservation(next).await.0, "RESERVED");
    assert_eq!(restarted.metric("consumer_duplicates_total").await, 0.0);
    assert_eq!(test.stock("ABC-1").await, (989, 11));
    restarted.service.terminate(Duration::from_secs(30)).await;
}

/// A rebalance in the middle of a stream: the partitions change hands at the
/// committed offsets, which must be exactly the next records to read, or a
/// record that arrives later is skipped.
#[tokio::test(flavor = "multi_thread")]
async fn a_rebalance_mid_stream_loses_no_record() {
    let test = std::sync::Arc::new(InventoryTest::new().await);
    test.set_stock("ABC-1", 1_000_000).await;
    let first = test.start(&[], &[]).await;
    let orders: Vec<Uuid> = (0..1_000).map(|_| Uuid::now_v7()).collect();
    let producing = {
        let (test, orders) = (std::sync::Arc::clone(&test), orders.clone());
        tokio::spawn(async move {
            for chunk in orders.chunks(50) {
                for order in chunk {
                    test.produce(&Outgoing::order(*order, &[("ABC-1", 1)]))
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    let second = test.start(&[], &[]).await;
    producing.await.unwrap();

    eventually(
        "every order has its outcome",
        Duration::from_secs(120),
        || async { (test.count("select count(*) from reservations").await == 1_000).then_some(()) },
    )
    .await;
    assert_eq!(test.stock("ABC-1").await, (999_000, 1_000));
    first.service.terminate(Duration::from_secs(30)).await;
    second.service.terminate(Duration::from_secs(30)).await;
}

/// A reservation writes its announcements inside its own statement
/// (src/inventory.rs), not through `outbox::insert`: the two must write the
/// same rows, every column but the rows' identity and time.
#[tokio::test]
async fn outcomes_write_their_outbox_rows_as_outbox_insert_does() {
    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 10).await;
    let service = test.start(&[], &[]).await;
    let (reserved, rejected) = (Uuid::now_v7(), Uuid::now_v7());
    for (order, quantity) in [(reserved, 3), (rejected, 30)] {
        let mut record = Outgoing::order(order, &[("ABC-1", quantity)]);
        for (name, value) in &mut record.headers {
            if *name == "traceparent" {
                *value = Some(TRACEPARENT.to_owned());
            }
        }
        test.produce(&record).await;
    }
    assert_eq!(test.wait_for_reservation(reserved).await.0, "RESERVED");
    assert_eq!(test.wait_for_reservation(rejected).await.0, "REJECTED");

    let written: Vec<(Uuid, String, String, serde_json::Value, Option<String>)> = sqlx::query_as(
        "select id, aggregateid, type, payload, tracingspancontext from outbox
         where aggregateid = any($1) order by seq",
    )
    .bind([reserved.to_string(), rejected.to_string()])
    .fetch_all(&test.pool)
    .await
    .unwrap();
    assert_eq!(written.len(), 2);
    for (id, aggregate_id, event_type, payload, context) in written {
        let event_type = match event_type.as_str() {
            "EstoqueReservado" => inventory_service::announce::EVENT_RESERVED,
            "EstoqueRejeitado" => inventory_service::announce::EVENT_REJECTED,
            other => panic!("unexpected event {other}"),
        };
        let trace = context
            .as_deref()
            .and_then(outbox::TraceContext::from_properties);
        assert_eq!(
            trace.as_ref().map(|t| t.trace_id()),
            Some(&TRACEPARENT[3..35])
        );
        let copy = outbox::OutboxMessage::new(
            inventory_service::announce::AGGREGATE_TYPE,
            aggregate_id,
            event_type,
            payload,
            trace,
        );
        let mut conn = test.pool.acquire().await.unwrap();
        outbox::insert(
            &mut conn,
            std::slice::from_ref(&copy),
            outbox::Cleanup::Relay,
        )
        .await
        .unwrap();
        test_support::outbox::assert_rows_alike(&test.pool, id, copy.id).await;
    }
    service.service.terminate(Duration::from_secs(30)).await;
}

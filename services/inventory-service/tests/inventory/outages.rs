//! A database that is down is not the message's fault: however long the
//! outage, no record is dead-lettered for it and none is lost.

use std::sync::Arc;
use std::time::Duration;

use test_support::eventually::eventually;
use test_support::kafka::bootstrap_servers;
use test_support::postgres::PrivatePostgres;
use uuid::Uuid;

use crate::helpers::{InventoryTest, Outgoing, PARTITIONS};

const RATE_PER_SECOND: u64 = 40;
const OUTAGE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn a_database_stopped_for_a_minute_under_load_dead_letters_nothing_and_loses_nothing() {
    let mut cluster = PrivatePostgres::start().await;
    let test = Arc::new(
        InventoryTest::on(bootstrap_servers(), &cluster.url("postgres"), PARTITIONS).await,
    );
    test.set_stock("ABC-1", 1_000_000).await;
    let service = test.start(&[], &[]).await;
    // Orders keep coming before, during and after the outage.
    let producing = {
        let test = Arc::clone(&test);
        tokio::spawn(async move {
            let mut orders = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(1_000 / RATE_PER_SECOND));
            let total = RATE_PER_SECOND * (OUTAGE.as_secs() + 20);
            for _ in 0..total {
                tick.tick().await;
                let order = Uuid::now_v7();
                test.produce(&Outgoing::order(order, &[("ABC-1", 1)])).await;
                orders.push(order);
            }
            orders
        })
    };
    eventually(
        "orders are being reserved",
        Duration::from_secs(60),
        || async { (test.count("select count(*) from reservations").await >= 100).then_some(()) },
    )
    .await;

    cluster.stop().await;
    eventually("readiness fails", Duration::from_secs(30), || async {
        (service.ready_status().await == Some(503)).then_some(())
    })
    .await;
    tokio::time::sleep(OUTAGE).await;
    cluster.restart().await;
    let orders = producing.await.unwrap();

    let expected = i64::try_from(orders.len()).unwrap();
    eventually(
        "every order is decided or dead-lettered",
        Duration::from_secs(180),
        || async {
            let decided = test.count("select count(*) from reservations").await;
            let dead = service.metric("consumer_dlt_total").await as i64;
            (decided + dead >= expected).then_some(())
        },
    )
    .await;
    assert_eq!(service.metric("consumer_dlt_total").await, 0.0);
    assert_eq!(
        test.count("select count(*) from reservations").await,
        expected
    );
    assert!(
        test.dlt_reader()
            .read_available(Duration::from_secs(2))
            .await
            .is_empty(),
        "nothing in the DLT"
    );
    assert_eq!(
        test.count("select count(*) from reservations where status = 'RESERVED'")
            .await,
        expected
    );
    assert_eq!(test.stock("ABC-1").await, (1_000_000 - expected, expected));
    eventually("readiness recovers", Duration::from_secs(30), || async {
        (service.ready_status().await == Some(200)).then_some(())
    })
    .await;
    service.service.terminate(Duration::from_secs(30)).await;
}

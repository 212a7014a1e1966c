//! Rebalances: a partition keeps flowing whatever state it was in when it
//! moved, and a revoke never blocks the work it waits for.

use std::time::Duration;

use test_support::eventually::eventually;
use uuid::Uuid;

use crate::helpers::{InventoryProcess, InventoryTest, Outgoing, PARTITIONS};

async fn wait_for_all_partitions(service: &InventoryProcess) {
    eventually(
        "the consumer owns every partition",
        Duration::from_secs(60),
        || async {
            (service.metric("consumer_assigned_partitions").await == f64::from(PARTITIONS))
                .then_some(())
        },
    )
    .await;
}

/// More records than the worker's queue holds arrive while the worker is
/// stuck, so the partition is paused for back-pressure; then the group
/// changes twice, the first time while it is still paused. The partition
/// must flow again afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_paused_for_backlog_drains_after_a_member_joins_and_leaves() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 1_000_000).await;
    let patient = ["--statement-timeout", "120s", "--revoke-grace", "2s"];
    let first = test.start(&patient, &[]).await;
    let lock = test.lock_stock("ABC-1").await;
    let backlog: Vec<Outgoing> = (0..8_000)
        .map(|_| Outgoing::order(Uuid::now_v7(), &[("ABC-1", 1)]).on_partition(0))
        .collect();
    test.produce_all(&backlog).await;
    // The fetcher queues more than the pause threshold (5 000 records)
    // behind the stuck worker; on a busy machine that takes a while.
    eventually(
        "the partition is paused for back-pressure",
        Duration::from_secs(60),
        || async { (first.metric("consumer_paused_partitions").await == 1.0).then_some(()) },
    )
    .await;

    // The group changes while the partition is still paused: librdkafka
    // keeps an application's pause across the revoke and the new
    // assignment, so only a consumer that asks again resumes it.
    let second = test.start(&patient, &[]).await;
    eventually(
        "the first member gave partitions up",
        Duration::from_secs(60),
        || async {
            (first.metric("consumer_assigned_partitions").await < f64::from(PARTITIONS))
                .then_some(())
        },
    )
    .await;
    lock.rollback().await.unwrap();
    second.service.terminate(Duration::from_secs(60)).await;
    wait_for_all_partitions(&first).await;
    let late: Vec<Outgoing> = (0..100)
        .map(|_| Outgoing::order(Uuid::now_v7(), &[("ABC-1", 1)]).on_partition(0))
        .collect();
    test.produce_all(&late).await;

    eventually(
        "every order has its outcome",
        Duration::from_secs(180),
        || async { (test.count("select count(*) from reservations").await == 8_100).then_some(()) },
    )
    .await;
    eventually("the lag drains to 0", Duration::from_secs(60), || async {
        (first.metric("consumer_lag").await == 0.0).then_some(())
    })
    .await;
    assert_eq!(test.stock("ABC-1").await, (1_000_000 - 8_100, 8_100));
    first.service.terminate(Duration::from_secs(30)).await;
}

/// With a single runtime thread, the revoke must not block the thread the
/// batch in progress needs to finish: the batch commits within the grace
/// and its offset is stored before the partition moves.
#[tokio::test(flavor = "multi_thread")]
async fn a_revoke_on_a_single_runtime_thread_lets_the_batch_in_progress_finish() {
    let test = InventoryTest::new().await;
    test.set_stock("ABC-1", 1_000).await;
    let single_thread = [("TOKIO_WORKER_THREADS", "1".to_owned())];
    let slow = ["--statement-timeout", "60s", "--revoke-grace", "15s"];
    let first = test.start(&slow, &single_thread).await;
    let lock = test.lock_stock("ABC-1").await;
    let orders: Vec<Outgoing> = (0..10)
        .map(|_| Outgoing::order(Uuid::now_v7(), &[("ABC-1", 1)]).on_partition(0))
        .collect();
    test.produce_all(&orders).await;
    eventually(
        "the batch waits on the lock",
        Duration::from_secs(30),
        || async {
            let waiting = test
                .count("select count(*) from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'")
                .await;
            (waiting >= 1).then_some(())
        },
    )
    .await;

    // The lock goes once the first member has begun its revoke (it says
    // so), or after 8 s, well within the grace either way.
    let second = test.start_unready(&slow, &single_thread);
    let started = tokio::time::Instant::now();
    let mut revoke_began_first = false;
    while started.elapsed() < Duration::from_secs(8) {
        if first.service.log().contains("revoking partitions") {
            revoke_began_first = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    lock.rollback().await.unwrap();
    second.wait_for_partitions().await;

    eventually(
        "every order has its outcome",
        Duration::from_secs(60),
        || async { (test.count("select count(*) from reservations").await == 10).then_some(()) },
    )
    .await;
    let log = first.service.log();
    assert!(
        log.contains("partitions revoked"),
        "the first member saw no revoke:\n{log}"
    );
    assert!(
        !log.contains("revoked while a record was in progress"),
        "the revoke timed out waiting for the batch:\n{log}"
    );
    assert!(
        revoke_began_first,
        "the batch was not in progress when the revoke began:\n{log}"
    );
    assert_eq!(test.stock("ABC-1").await, (990, 10));
    second.service.terminate(Duration::from_secs(30)).await;
    first.service.terminate(Duration::from_secs(30)).await;
}

use std::time::Duration;

use test_support::broker::PrivateBroker;
use test_support::eventually::eventually;
use test_support::kafka::bootstrap_servers;

use crate::helpers::{Mode, RelayTest, delivery};

/// A small deterministic generator: the kill points vary per run (the seed
/// is printed) without a dependency.
pub(crate) fn next_delay(seed: &mut u64, min_ms: u64, max_ms: u64) -> Duration {
    *seed = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    Duration::from_millis(min_ms + (*seed >> 33) % (max_ms - min_ms))
}

#[tokio::test]
async fn kill_9_at_random_points_of_a_drain_loses_nothing() {
    kill_9_at_random_points(Mode::Poll).await;
}

#[tokio::test]
async fn kill_9_of_the_cdc_relay_at_random_points_of_a_stream_loses_nothing() {
    kill_9_at_random_points(Mode::Cdc).await;
}

async fn kill_9_at_random_points(mode: Mode) {
    let test = RelayTest::in_mode(mode, &bootstrap_servers()).await;
    if mode == Mode::Cdc {
        // The slot must exist before the rows: they are deleted in their
        // own transactions, so only the WAL has them.
        let first = test.start_relay(&[]);
        first
            .wait_for_metric("the relay leads", "relay_leader 1", Duration::from_secs(30))
            .await;
        first.service.kill().await;
    }
    // 100 transactions of 100 rows: CDC mode publishes whole transactions,
    // so a kill can land between them.
    let mut inserted = test.insert_events(100, 1).await;
    let first_insert = test.last_insert_lsn();
    for _ in 1..100 {
        inserted.extend(test.insert_events(100, 1).await);
    }
    let mut seed = u64::from(std::process::id()) ^ 0x5eed;
    println!("kill test seed: {seed}");

    let mut kills_mid_drain = 0;
    for _ in 0..30 {
        if kills_mid_drain >= 6 {
            break;
        }
        // Small batches make the drain last long enough to be hit.
        // CDC: confirmations reach the server every status interval; a
        // kill loses (re-sends) what was not yet confirmed.
        let relay = test.start_relay(&["--batch-size", "20", "--cdc-status-interval", "100ms"]);
        tokio::time::sleep(next_delay(&mut seed, 150, 900)).await;
        relay.service.kill().await;
        if test.drained().await {
            break;
        }
        if test.started_publishing(first_insert.as_deref()).await {
            kills_mid_drain += 1;
        }
    }
    assert!(
        kills_mid_drain >= 5,
        "only {kills_mid_drain} kills landed mid-drain"
    );

    let relay = test.start_relay(&[]);
    test.wait_until_drained(Duration::from_secs(120)).await;
    let records = test.reader().read_all(Duration::from_secs(60)).await;
    let result = delivery(&records, &inserted);
    println!(
        "relay kill test ({mode:?} mode): rows={} kills={kills_mid_drain} lost={} duplicates={} order_violations={}",
        inserted.len(),
        result.lost,
        result.duplicates,
        result.order_violations
    );
    assert_eq!(result.lost, 0);
    assert_eq!(result.order_violations, 0);
    relay.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn shutdown_records_the_batch_in_flight() {
    let test = RelayTest::new().await;
    test.insert_events(10, 2_000).await;
    let relay = test.start_relay(&["--batch-size", "2000"]);
    test.reader()
        .read_at_least(1, Duration::from_secs(30))
        .await;

    let code = relay.service.terminate(Duration::from_secs(60)).await;

    assert_eq!(code, Some(0));
    let records = test.reader().read_all(Duration::from_secs(60)).await;
    let in_kafka: std::collections::HashSet<uuid::Uuid> = records
        .iter()
        .filter_map(|r| r.header("id"))
        .map(|id| id.parse().unwrap())
        .collect();
    let remaining = test.remaining_ids().await;
    assert!(!in_kafka.is_empty());
    let published_but_not_recorded = remaining.intersection(&in_kafka).count();
    assert_eq!(
        published_but_not_recorded, 0,
        "rows in Kafka still pending after shutdown"
    );
    assert_eq!(remaining.len() + in_kafka.len(), 20_000);
}

#[tokio::test]
async fn a_broker_stopped_for_ten_seconds_mid_drain_loses_nothing() {
    broker_stopped_mid_drain(Mode::Poll).await;
}

#[tokio::test]
async fn a_broker_stopped_for_ten_seconds_mid_stream_loses_nothing_in_cdc_mode() {
    broker_stopped_mid_drain(Mode::Cdc).await;
}

async fn broker_stopped_mid_drain(mode: Mode) {
    let mut broker = PrivateBroker::start().await;
    let test = RelayTest::in_mode(mode, &broker.address).await;
    let relay = test.start_relay(&["--batch-size", "100", "--delivery-timeout", "5s"]);
    if mode == Mode::Cdc {
        relay
            .wait_for_metric("the relay leads", "relay_leader 1", Duration::from_secs(30))
            .await;
    }
    let mut inserted = test.insert_events(20, 1).await;
    let first_insert = test.last_insert_lsn();
    for _ in 1..100 {
        inserted.extend(test.insert_events(20, 1).await);
    }
    eventually("the drain starts", Duration::from_secs(30), || async {
        test.started_publishing(first_insert.as_deref())
            .await
            .then_some(())
    })
    .await;

    broker.stop().await;
    inserted.extend(test.insert_events(20, 50).await);
    tokio::time::sleep(Duration::from_secs(10)).await;
    broker.restart().await;

    let result = test.delivery_once_drained(&inserted).await;
    println!("broker outage ({mode:?} mode): {result:?}");
    assert_eq!(result.lost, 0);
    assert_eq!(result.order_violations, 0);
    relay.service.terminate(Duration::from_secs(30)).await;
}

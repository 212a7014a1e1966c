use std::time::Duration;

use test_support::eventually::eventually;
use test_support::kafka::{Record, java_partition};

use crate::helpers::{PARTITIONS, RelayTest, delivery};

/// Waits until the relay has drained the outbox, then reads the topic:
/// every inserted row once, none lost, in per-aggregate order.
async fn drained_once_in_order(test: &RelayTest, inserted: &[uuid::Uuid]) -> Vec<Record> {
    test.wait_until_drained(Duration::from_secs(60)).await;
    let records = test
        .reader()
        .read_at_least(inserted.len(), Duration::from_secs(30))
        .await;
    assert_eq!(
        delivery(&records, inserted),
        crate::helpers::Delivery {
            distinct: inserted.len(),
            duplicates: 0,
            lost: 0,
            order_violations: 0,
            regressions: 0,
        }
    );
    records
}

#[tokio::test]
async fn every_committed_row_arrives_once_in_per_aggregate_order() {
    let test = RelayTest::new().await;
    let inserted = test.insert_events(50, 40).await;
    let relay = test.start_relay(&[]);

    let records = drained_once_in_order(&test, &inserted).await;
    for record in &records {
        assert_eq!(
            record.partition,
            java_partition(record.key.as_deref().unwrap(), PARTITIONS)
        );
        assert_eq!(record.header("eventType").as_deref(), Some("TestEvent"));
    }
    // The delivery log says where each deleted row went.
    let logged: std::collections::HashMap<String, (String, i32, i64)> =
        sqlx::query_as("select id::text, topic, partition, \"offset\" from outbox_delivery")
            .fetch_all(&test.pool)
            .await
            .unwrap()
            .into_iter()
            .map(|(id, topic, partition, offset)| (id, (topic, partition, offset)))
            .collect();
    assert_eq!(logged.len(), 2_000);
    for record in &records {
        assert_eq!(
            logged.get(&record.header("id").unwrap()),
            Some(&(record.topic.clone(), record.partition, record.offset)),
        );
    }
    assert!(relay.metrics().await.contains("outbox_published_total"));
    relay.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_backlog_drains_in_overlapping_batches_once_and_in_per_aggregate_order() {
    let test = RelayTest::new().await;
    // Every read comes back full (ten of 60 aggregates' heads), so each
    // batch is sent while the one before awaits its acknowledgements.
    let inserted = test.insert_events(60, 5).await;
    let relay = test.start_relay(&["--batch-size", "10"]);

    drained_once_in_order(&test, &inserted).await;
    let overlapped = relay.metric("relay_overlapped_batches_total").await;
    assert!(overlapped >= 10.0, "{overlapped} batches overlapped");
    relay.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_row_that_commits_late_with_a_lower_seq_is_still_published() {
    let test = RelayTest::new().await;
    let relay = test.start_relay(&[]);

    // The first transaction takes the lower seq and stays open...
    let mut late = test.pool.begin().await.unwrap();
    let late_id: uuid::Uuid = sqlx::query_scalar(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload)
         values (gen_random_uuid(), $1, 'late', 'TestEvent', '{\"n\": 0}') returning id",
    )
    .bind(&test.aggregate_type)
    .fetch_one(&mut *late)
    .await
    .unwrap();
    // ...while a later one commits and is published.
    let early_id = test
        .insert_row(&test.aggregate_type, "early", r#"{"n": 1}"#)
        .await;
    let reader = test.reader();
    let first = reader.read_at_least(1, Duration::from_secs(30)).await;
    assert_eq!(first[0].header("id"), Some(early_id.to_string()));

    late.commit().await.unwrap();

    let second = reader.read_at_least(1, Duration::from_secs(30)).await;
    assert_eq!(second[0].header("id"), Some(late_id.to_string()));
    test.wait_until_drained(Duration::from_secs(10)).await;
    relay.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn with_retention_published_rows_are_kept_and_marked() {
    let test = RelayTest::new().await;
    let inserted = test.insert_events(3, 10).await;
    let relay = test.start_relay(&["--outbox-cleanup", "retain", "--retain-published", "7d"]);

    test.wait_until_drained(Duration::from_secs(60)).await;

    let (rows, published): (i64, i64) =
        sqlx::query_as("select count(*), count(published_at) from outbox")
            .fetch_one(&test.pool)
            .await
            .unwrap();
    assert_eq!((rows, published), (30, 30));
    let records = test
        .reader()
        .read_at_least(inserted.len(), Duration::from_secs(30))
        .await;
    assert_eq!(delivery(&records, &inserted).lost, 0);
    relay.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn two_relays_at_once_keep_per_aggregate_order_through_a_failover() {
    let test = RelayTest::new().await;
    let first = test.start_relay(&["--batch-size", "50"]);
    let second = test.start_relay(&["--batch-size", "50"]);
    let leader_is_first = eventually("one relay leads", Duration::from_secs(30), || async {
        match (
            first.role().await.as_deref(),
            second.role().await.as_deref(),
        ) {
            (Some("leader"), Some("standby")) => Some(true),
            (Some("standby"), Some("leader")) => Some(false),
            _ => None,
        }
    })
    .await;

    // Events keep coming while the leader is killed.
    let mut inserted = Vec::new();
    for _ in 0..10 {
        inserted.extend(test.insert_events(20, 25).await);
    }
    let (leader, standby) = if leader_is_first {
        (first, second)
    } else {
        (second, first)
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    leader.service.kill().await;
    for _ in 0..10 {
        inserted.extend(test.insert_events(20, 25).await);
    }
    eventually(
        "the standby takes over",
        Duration::from_secs(30),
        || async { (standby.role().await.as_deref() == Some("leader")).then_some(()) },
    )
    .await;

    let result = test.delivery_once_drained(&inserted).await;
    println!("two relays with a failover: {result:?}");
    assert_eq!(result.lost, 0);
    assert_eq!(result.order_violations, 0);
    standby.service.terminate(Duration::from_secs(30)).await;
}

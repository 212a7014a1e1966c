use std::time::Duration;

use test_support::eventually::eventually;
use test_support::kafka::{create_topic, unique_name};

use crate::helpers::RelayTest;

#[tokio::test]
async fn poison_rows_are_parked_and_do_not_stall_the_others() {
    let test = RelayTest::new().await;
    let before = test.insert_events(5, 10).await;
    let bad_topic = test.insert_row("not a topic", "x", r#"{"n": 0}"#).await;
    let huge = format!(r#"{{"n": 0, "blob": "{}"}}"#, "x".repeat(1_200_000));
    let too_large = test.insert_row(&test.aggregate_type, "huge", &huge).await;
    let after = test.insert_events(5, 10).await;
    let relay = test.start_relay(&["--max-attempts", "2"]);

    let parked: Vec<(uuid::Uuid, i32, Option<String>)> =
        eventually("both poison rows are parked", Duration::from_secs(60), || async {
            let parked: Vec<(uuid::Uuid, i32, Option<String>)> = sqlx::query_as(
                "select id, attempts, last_error from outbox where parked_at is not null order by seq",
            )
            .fetch_all(&test.pool)
            .await
            .unwrap();
            (parked.len() == 2).then_some(parked)
        })
        .await;

    assert_eq!(parked[0].0, bad_topic);
    assert_eq!(parked[1].0, too_large);
    for (id, attempts, error) in &parked {
        assert_eq!(*attempts, 2, "{id}");
        assert!(
            error.as_deref().is_some_and(|e| !e.is_empty()),
            "{id} has no error"
        );
    }
    let records = test
        .reader()
        .read_at_least(before.len() + after.len(), Duration::from_secs(30))
        .await;
    assert_eq!(records.len(), 100);
    relay
        .wait_for_metric(
            "the parked gauge shows them",
            "outbox_parked_rows 2",
            Duration::from_secs(20),
        )
        .await;

    // Un-parking (docs/relay.md) after fixing the row publishes it.
    sqlx::query(
        "update outbox set aggregatetype = $1, parked_at = null, attempts = 0 where id = $2",
    )
    .bind(&test.aggregate_type)
    .bind(bad_topic)
    .execute(&test.pool)
    .await
    .unwrap();
    test.wait_until_published(
        bad_topic,
        "the fixed row is published",
        Duration::from_secs(30),
    )
    .await;
    relay.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn the_relay_refuses_a_topic_with_the_wrong_partition_count() {
    let test = RelayTest::new().await;
    let three = unique_name("relaytest-three");
    create_topic(&test.bootstrap, &three, 3).await;

    let relay = test.start_relay(&["--topics", &three]);

    assert_ne!(relay.service.wait(Duration::from_secs(30)).await, Some(0));
}

#[tokio::test]
async fn a_missing_topic_stops_the_relay_unless_it_may_create_it() {
    let test = RelayTest::new().await;
    let missing = unique_name("relaytest-missing");

    let refused = test.start_relay(&["--topics", &missing]);
    assert_ne!(refused.service.wait(Duration::from_secs(30)).await, Some(0));

    let relay = test.start_relay(&["--topics", &missing, "--create-topics"]);
    eventually("the relay is ready", Duration::from_secs(30), || async {
        relay.is_ready().await.then_some(())
    })
    .await;
    relay.service.terminate(Duration::from_secs(30)).await;
}

/// The local broker keeps one replica: `acks=all` is then acknowledged by a
/// single disk, and the relay deletes what was acknowledged. It says so.
#[tokio::test]
async fn a_topic_that_cannot_back_acks_all_is_reported_at_start_up() {
    let test = RelayTest::new().await;
    let relay = test.start_relay(&[]);

    let series = format!(
        "relay_topic_durability_unsafe{{topic=\"{}\"}} 1",
        test.topic
    );
    relay
        .wait_for_metric(
            "the metric reports the topic",
            &series,
            Duration::from_secs(30),
        )
        .await;
    let log = relay.service.log();
    assert!(
        log.contains(
            "acks=all cannot keep this topic's records through the loss of one broker's disk"
        ),
        "{log}"
    );
    relay.service.terminate(Duration::from_secs(30)).await;
}

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

/// The delivery log is optional: once it cannot be written (here its grant
/// is revoked while the relay runs), the relay marks its batches without it
/// and says so. Before, every mark failed after the broker's
/// acknowledgement, the leader stepped down and published the same batch
/// again, for ever.
#[tokio::test]
async fn a_delivery_log_that_cannot_be_written_does_not_stop_the_relay() {
    let test = RelayTest::new().await;
    let role = format!(
        "relay_log_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let url = test.database.login_role(&role).await;
    for statement in [
        format!("grant select, update, delete on outbox to {role}"),
        format!("grant insert on outbox_delivery to {role}"),
    ] {
        sqlx::query(&statement).execute(&test.pool).await.unwrap();
    }
    let relay = test.start_relay_on(&url, &[], &[]);
    let mut inserted = test.insert_events(10, 2).await;
    test.wait_until_drained(Duration::from_secs(60)).await;

    sqlx::query(&format!("revoke insert on outbox_delivery from {role}"))
        .execute(&test.pool)
        .await
        .unwrap();
    inserted.extend(test.insert_events(10, 2).await);
    // Exported at 0 from the start: the count must move.
    eventually(
        "the relay counts the log's failure",
        Duration::from_secs(60),
        || async { (relay.metric("relay_delivery_log_failures_total").await > 0.0).then_some(()) },
    )
    .await;
    // Time for a batch published again to arrive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let result = test.delivery_once_drained(&inserted).await;
    assert_eq!((result.lost, result.duplicates), (0, 0), "{result:?}");
    let logged: i64 = sqlx::query_scalar("select count(*) from outbox_delivery")
        .fetch_one(&test.pool)
        .await
        .unwrap();
    assert_eq!(
        logged, 20,
        "the first batches were logged, the later ones could not be"
    );
    relay.service.terminate(Duration::from_secs(30)).await;
    sqlx::raw_sql(&format!("drop owned by {role}; drop role {role}"))
        .execute(&test.pool)
        .await
        .unwrap();
}

/// Reads that wait on a lock for longer than the lease's send window (a
/// migration, a long `ALTER`, an operator's `LOCK TABLE`): ten holds of
/// 4 s, each taken again the moment it is released, under a trickle of
/// orders. Rows are published between the holds, and the leader does not
/// re-read in a loop. Before, every read came back past its send window,
/// its rows were withheld and read again at once, behind the next hold:
/// nothing was published. (With 1 s between the holds, as first written,
/// the immediate re-read got through: that version passed on a0d3f5b.)
#[tokio::test(flavor = "multi_thread")]
async fn reads_held_past_the_send_window_still_publish_between_the_holds() {
    let test = RelayTest::new().await;
    // A 3 s send window (the default's), in a lease long enough for a
    // statement to wait out two holds (queued behind a writer's insert) and
    // the next to wait out two more.
    let relay = test.start_relay(&["--lease", "20s", "--delivery-timeout", "15s"]);
    relay
        .wait_for_metric("the relay leads", "relay_leader 1", Duration::from_secs(30))
        .await;
    let holding = std::sync::atomic::AtomicBool::new(true);
    let trickle = async {
        let mut inserted = Vec::new();
        while holding.load(std::sync::atomic::Ordering::Relaxed) {
            inserted.extend(test.insert_events(2, 1).await);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        inserted
    };
    let holds = async {
        let mut published = Vec::new();
        let mut conn = test.pool.acquire().await.unwrap();
        let lock = "begin; lock table outbox in access exclusive mode";
        sqlx::raw_sql(lock).execute(&mut *conn).await.unwrap();
        for round in 0..10 {
            tokio::time::sleep(Duration::from_secs(4)).await;
            // Released and taken again in one round trip: the statements
            // waiting at the release get through, and the new hold queues
            // right behind them, so whatever the relay sends next meets it.
            let next = if round < 9 {
                format!("commit; {lock}")
            } else {
                "commit".to_owned()
            };
            sqlx::raw_sql(&next).execute(&mut *conn).await.unwrap();
            published.push(relay.metric("outbox_published_total").await);
        }
        holding.store(false, std::sync::atomic::Ordering::Relaxed);
        published
    };
    let (inserted, published) = tokio::join!(trickle, holds);
    let result = test.delivery_once_drained(&inserted).await;

    let rounds_with_progress = published.windows(2).filter(|w| w[1] > w[0]).count();
    let reads = relay
        .metric("relay_statement_duration_seconds_count{statement=\"read\"}")
        .await;
    let withheld = relay.metric("relay_withheld_rows_total").await;
    println!(
        "lock holds: published after each hold {published:?}; reads that found rows {reads}, rows withheld {withheld}, rows {}",
        inserted.len()
    );
    // A read gets through one gap and its mark a later one: rows go out
    // every two to four gaps.
    assert!(
        rounds_with_progress >= 3,
        "rows were published in only {rounds_with_progress} of the 9 gaps between holds: {published:?}"
    );
    // About one read per hold: a leader re-reading in a loop reads many.
    assert!(
        reads <= 30.0,
        "{reads} reads found rows in ten holds: the leader re-read in a loop"
    );
    assert_eq!((result.lost, result.duplicates), (0, 0), "{result:?}");
    relay.service.terminate(Duration::from_secs(30)).await;
}

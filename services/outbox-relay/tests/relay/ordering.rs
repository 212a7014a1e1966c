//! Per-aggregate order is an invariant of the relay: no row of an aggregate
//! is sent while an earlier row of it is unsent, parked or in doubt; other
//! aggregates, topics and partitions keep flowing meanwhile. A fault of the
//! broker or of a topic is nobody's row's fault: it never parks a row.
//!
//! Each test runs in both modes. Poll mode finds the rows in the table at
//! its first read; CDC mode streams, and the rows are written once it does,
//! so they come down the stream: a record that cannot be delivered must step
//! aside there too, and never stop the stream or pin the WAL.

use std::time::Duration;

use test_support::eventually::eventually;
use test_support::kafka::{bootstrap_servers, create_topic, unique_name};
use uuid::Uuid;

use crate::helpers::{Mode, PARTITIONS, RelayProcess, RelayTest};

async fn parked(test: &RelayTest) -> Vec<Uuid> {
    sqlx::query_scalar("select id from outbox where parked_at is not null order by seq")
        .fetch_all(&test.pool)
        .await
        .unwrap()
}

/// Writes the test's rows with `write` and runs the relay: in poll mode
/// the rows are there when it starts; in CDC mode they are written once it
/// streams.
async fn write_and_relay<T>(
    test: &RelayTest,
    mode: Mode,
    args: &[&str],
    envs: &[(&str, String)],
    write: impl AsyncFnOnce(&RelayTest) -> T,
) -> (RelayProcess, T) {
    match mode {
        Mode::Poll => {
            let written = write(test).await;
            (test.start_relay_with_env(args, envs), written)
        }
        Mode::Cdc => {
            let relay = test.start_relay_with_env(args, envs);
            test.wait_until_streaming(&relay).await;
            (relay, write(test).await)
        }
    }
}

async fn a_later_row_waits_for_an_earlier_oversized_one(mode: Mode, args: &[&str]) {
    let test = RelayTest::in_mode(mode, &bootstrap_servers()).await;
    // Over the producer's message.max.bytes (1 MB): the row's own fault.
    let huge = format!(r#"{{"n": 0, "blob": "{}"}}"#, "x".repeat(2_000_000));
    let args = [&["--max-attempts", "2"], args].concat();
    let (relay, (first, second, others)) = write_and_relay(&test, mode, &args, &[], async |test| {
        let first = test.write_row(&test.aggregate_type, "held", &huge).await;
        let second = test
            .write_row(&test.aggregate_type, "held", r#"{"n": 1}"#)
            .await;
        (first, second, test.insert_events(5, 4).await)
    })
    .await;

    eventually(
        "the oversized row is parked",
        Duration::from_secs(60),
        || async { (parked(&test).await == [first]).then_some(()) },
    )
    .await;
    let reader = test.reader();
    let flowing = reader
        .read_at_least(others.len(), Duration::from_secs(30))
        .await;
    // Time for a row that would overtake to arrive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let on_topic = reader.read_available(Duration::from_secs(1)).await;
    assert!(
        flowing
            .iter()
            .chain(&on_topic)
            .all(|record| record.key.as_deref() != Some(b"held".as_slice())),
        "a later row of the aggregate overtook its parked first row"
    );
    assert_eq!(flowing.len() + on_topic.len(), others.len());
    relay
        .wait_for_metric(
            "the held row shows in the metrics",
            "outbox_held_rows 1",
            Duration::from_secs(20),
        )
        .await;

    // Fixed and un-parked (docs/relay.md, "Un-parking a row"): both go, in order.
    sqlx::query(
        "update outbox set payload = '{\"n\": 0}', parked_at = null, attempts = 0,
                           last_error = null, deferrals = greatest(deferrals, 1),
                           next_attempt_at = now()
         where id = $1",
    )
    .bind(first)
    .execute(&test.pool)
    .await
    .unwrap();
    let held = reader.read_at_least(2, Duration::from_secs(30)).await;
    let ids: Vec<String> = held.iter().filter_map(|r| r.header("id")).collect();
    assert_eq!(ids, [first.to_string(), second.to_string()]);
    test.wait_until_drained(Duration::from_secs(30)).await;
    relay.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_later_row_of_an_aggregate_waits_for_an_earlier_oversized_one() {
    a_later_row_waits_for_an_earlier_oversized_one(Mode::Poll, &[]).await;
}

#[tokio::test]
async fn a_later_row_of_an_aggregate_waits_for_an_earlier_oversized_one_while_batches_overlap() {
    // Every read full: the oversized row fails in a batch while the next
    // batch is already on its way.
    a_later_row_waits_for_an_earlier_oversized_one(Mode::Poll, &["--batch-size", "2"]).await;
}

#[tokio::test]
async fn cdc_a_later_row_of_an_aggregate_waits_for_an_earlier_oversized_one() {
    a_later_row_waits_for_an_earlier_oversized_one(Mode::Cdc, &[]).await;
}

async fn a_missing_topic_parks_nothing_and_its_rows_go_once_it_exists(mode: Mode) {
    let test = RelayTest::in_mode(mode, &bootstrap_servers()).await;
    let missing_type = unique_name("relaytestmissing").replace('-', "");
    let missing_topic = format!("{missing_type}.eventos");
    // librdkafka fails a record for a topic the broker says does not exist
    // (UnknownTopic) once this has passed; by default the delivery timeout
    // comes first.
    let (relay, (waiting, others)) = write_and_relay(
        &test,
        mode,
        &["--max-attempts", "2", "--delivery-timeout", "5s"],
        &[("KAFKA_TOPIC_METADATA_PROPAGATION_MAX_MS", "200".to_owned())],
        async |test| {
            let waiting = test.write_row(&missing_type, "m", r#"{"n": 0}"#).await;
            (waiting, test.insert_events(5, 4).await)
        },
    )
    .await;

    let records = test
        .reader()
        .read_at_least(others.len(), Duration::from_secs(30))
        .await;
    assert_eq!(records.len(), others.len());
    // Well past two delivery timeouts: the old relay had parked it by now.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (attempts, parked_at, error): (i32, Option<time::OffsetDateTime>, Option<String>) =
        sqlx::query_as("select attempts, parked_at, last_error from outbox where id = $1")
            .bind(waiting)
            .fetch_one(&test.pool)
            .await
            .unwrap();
    assert_eq!(
        (attempts, parked_at),
        (0, None),
        "a missing topic was blamed on the row ({error:?})"
    );
    assert!(error.is_some_and(|e| !e.is_empty()));

    create_topic(&test.bootstrap, &missing_topic, PARTITIONS).await;
    test.wait_until_published(
        waiting,
        "the row is published once its topic exists",
        Duration::from_secs(60),
    )
    .await;
    relay.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn rows_for_a_topic_that_does_not_exist_are_never_parked_and_go_once_it_exists() {
    a_missing_topic_parks_nothing_and_its_rows_go_once_it_exists(Mode::Poll).await;
}

#[tokio::test]
async fn cdc_rows_for_a_topic_that_does_not_exist_are_never_parked_and_go_once_it_exists() {
    a_missing_topic_parks_nothing_and_its_rows_go_once_it_exists(Mode::Cdc).await;
}

async fn undeliverable_rows_do_not_hold_back_the_rows_behind_them(mode: Mode) {
    let test = RelayTest::in_mode(mode, &bootstrap_servers()).await;
    let missing_type = unique_name("relaytesthol").replace('-', "");
    let args = [
        "--batch-size",
        "10",
        "--max-attempts",
        "1000",
        "--delivery-timeout",
        "2s",
    ];
    let (relay, others) = write_and_relay(&test, mode, &args, &[], async |test| {
        // More undeliverable rows than a read takes, all older than the rest.
        for i in 0..30 {
            test.write_row(&missing_type, &format!("m{i}"), r#"{"n": 0}"#)
                .await;
        }
        test.insert_events(10, 2).await
    })
    .await;

    let records = test
        .reader()
        .read_at_least(others.len(), Duration::from_secs(60))
        .await;
    assert_eq!(records.len(), others.len());
    relay.service.terminate(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn rows_that_cannot_be_delivered_do_not_hold_back_the_rows_behind_them() {
    undeliverable_rows_do_not_hold_back_the_rows_behind_them(Mode::Poll).await;
}

#[tokio::test]
async fn cdc_rows_that_cannot_be_delivered_do_not_hold_back_the_rows_behind_them() {
    undeliverable_rows_do_not_hold_back_the_rows_behind_them(Mode::Cdc).await;
}

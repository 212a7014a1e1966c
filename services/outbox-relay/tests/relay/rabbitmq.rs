//! The relay over RabbitMQ (`--transport rabbitmq`), against the machine's
//! broker: each test has its own exchange and an exclusive queue bound to it.

use std::time::Duration;

use test_support::amqp::{Message, TestQueue};
use test_support::eventually::eventually;
use test_support::kafka::{Record, bootstrap_servers};
use uuid::Uuid;

use crate::crashes::next_delay;
use crate::helpers::{Delivery, Mode, RelayTest, delivery};

fn records(messages: &[Message]) -> Vec<Record> {
    messages.iter().map(Message::as_record).collect()
}

/// Waits until the relay has drained the outbox, then reads the queue:
/// every inserted row once, none lost, in per-aggregate order.
async fn drained_once_in_order(
    test: &RelayTest,
    queue: &mut TestQueue,
    inserted: &[Uuid],
) -> Vec<Message> {
    test.wait_until_drained(Duration::from_secs(60)).await;
    let messages = queue
        .read_at_least(inserted.len(), Duration::from_secs(30))
        .await;
    assert_eq!(
        delivery(&records(&messages), inserted),
        Delivery {
            distinct: inserted.len(),
            duplicates: 0,
            lost: 0,
            order_violations: 0,
            regressions: 0,
        }
    );
    messages
}

#[tokio::test]
async fn over_rabbitmq_every_row_arrives_once_persistent_and_in_per_aggregate_order() {
    let test = RelayTest::new().await.over_rabbitmq().await;
    let mut queue = test.queue().await;
    let inserted = test.insert_events(30, 10).await;
    let relay = test.start_relay(&[]);

    let messages = drained_once_in_order(&test, &mut queue, &inserted).await;
    for message in &messages {
        let id = message.header("id").expect("an id header");
        assert_eq!(message.message_id.as_deref(), Some(id.as_str()));
        assert_eq!(message.kind.as_deref(), Some("TestEvent"));
        assert_eq!(message.header("eventType").as_deref(), Some("TestEvent"));
        assert_eq!(message.routing_key, "TestEvent");
        assert_eq!(message.exchange, test.topic);
        assert_eq!(message.delivery_mode, Some(2), "persistent");
        assert_eq!(message.content_type.as_deref(), Some("application/json"));
        assert!(
            message
                .header("aggregateId")
                .is_some_and(|key| key.starts_with("agg-"))
        );
    }
    // Logged as delivered to the exchange, at no position.
    let logged: i64 = sqlx::query_scalar(
        "select count(*) from outbox_delivery
         where topic = $1 and partition is null and \"offset\" is null",
    )
    .bind(&test.topic)
    .fetch_one(&test.pool)
    .await
    .unwrap();
    assert_eq!(logged, 300);
    relay.service.kill().await;
}

#[tokio::test]
async fn over_rabbitmq_cdc_mode_streams_every_row_once_in_order() {
    let test = RelayTest::in_mode(Mode::Cdc, &bootstrap_servers())
        .await
        .over_rabbitmq()
        .await;
    let mut queue = test.queue().await;
    let relay = test.start_relay(&[]);
    test.wait_until_streaming(&relay).await;
    let mut inserted = Vec::new();
    for _ in 0..10 {
        inserted.extend(test.insert_events(10, 2).await);
    }
    drained_once_in_order(&test, &mut queue, &inserted).await;
    relay.service.kill().await;
}

/// A message no queue is bound for comes back (`mandatory`): the broker's
/// topology is at fault, not the row. The row steps aside with the reason,
/// is never parked however often it comes back, holds its aggregate's later
/// rows, and goes once a queue is bound.
#[tokio::test]
async fn an_unroutable_row_steps_aside_unparked_until_a_queue_is_bound() {
    let test = RelayTest::new().await.over_rabbitmq().await;
    let first = test
        .insert_row(&test.aggregate_type, "agg-1", r#"{"n": 1}"#)
        .await;
    let second = test
        .insert_row(&test.aggregate_type, "agg-1", r#"{"n": 2}"#)
        .await;
    // Parking would come after two failures, were these the row's fault.
    let relay = test.start_relay(&["--max-attempts", "2"]);

    eventually(
        "the row came back unroutable several times",
        Duration::from_secs(30),
        || async {
            let row: Option<(i32, Option<String>)> =
                sqlx::query_as("select deferrals, last_error from outbox where id = $1")
                    .bind(first)
                    .fetch_optional(&test.pool)
                    .await
                    .unwrap();
            let (deferrals, error) =
                row.expect("the row was recorded as published though no queue could take it");
            (deferrals >= 3 && error.is_some_and(|e| e.contains("unroutable"))).then_some(())
        },
    )
    .await;
    let (parked, attempts): (i64, i32) = sqlx::query_as(
        "select count(*) filter (where parked_at is not null), max(attempts) from outbox",
    )
    .fetch_one(&test.pool)
    .await
    .unwrap();
    assert_eq!(
        (parked, attempts),
        (0, 0),
        "nothing parked, no attempt counted"
    );
    assert_eq!(test.pending().await, 2, "the later row waits behind it");

    let mut queue = test.queue().await;
    drained_once_in_order(&test, &mut queue, &[first, second]).await;
    assert_eq!(relay.metric("outbox_parked_total").await, 0.0);
    relay.service.kill().await;
}

/// An event type longer than an AMQP short string can be neither routing
/// key nor `type`: the row's own fault, so it is parked after
/// --max-attempts like any poison row, and the rows of other aggregates go.
#[tokio::test]
async fn a_row_whose_event_type_amqp_cannot_carry_is_parked_and_the_rest_go() {
    let test = RelayTest::new().await.over_rabbitmq().await;
    let mut queue = test.queue().await;
    let long_type = "E".repeat(300);
    let poison: Uuid = sqlx::query_scalar(
        "insert into outbox (id, aggregatetype, aggregateid, type, payload)
         values (gen_random_uuid(), $1, 'agg-poison', $2, '{\"n\": 0}'::jsonb) returning id",
    )
    .bind(&test.aggregate_type)
    .bind(&long_type)
    .fetch_one(&test.pool)
    .await
    .unwrap();
    let inserted = test.insert_events(5, 2).await;
    let relay = test.start_relay(&["--max-attempts", "2"]);
    eventually("the row is parked", Duration::from_secs(30), || async {
        let parked: Option<String> = sqlx::query_scalar(
            "select last_error from outbox where id = $1 and parked_at is not null",
        )
        .bind(poison)
        .fetch_optional(&test.pool)
        .await
        .unwrap();
        parked.filter(|error| error.contains("300 bytes"))
    })
    .await;
    let messages = queue
        .read_at_least(inserted.len(), Duration::from_secs(30))
        .await;
    assert_eq!(
        delivery(&records(&messages), &inserted).distinct,
        inserted.len()
    );
    relay.service.kill().await;
}

#[tokio::test]
async fn a_missing_exchange_stops_the_relay_at_start_up_unless_it_may_create_it() {
    // Neither this test's exchange nor `missing` exists.
    let test = RelayTest::new().await;
    let missing = format!("{}.missing", test.aggregate_type);
    let mut args = vec!["--transport", "rabbitmq", "--topics", missing.as_str()];
    let url = test_support::amqp::amqp_url();
    args.extend(["--amqp-url", url.as_str()]);
    let relay = test.start_relay(&args);
    let (code, log) = relay.service.exit(Duration::from_secs(30)).await;
    assert_ne!(code, Some(0), "{log}");
    assert!(log.contains("does not exist"), "{log}");
    assert!(
        !log.contains("guest:guest"),
        "the password is never logged: {log}"
    );

    args.push("--create-topics");
    let relay = test.start_relay(&args);
    relay
        .wait_for_metric("the relay leads", "relay_leader 1", Duration::from_secs(30))
        .await;
    relay.service.kill().await;
    let connection = test_support::amqp::connect().await;
    let channel = connection.create_channel().await.unwrap();
    channel
        .exchange_declare(
            missing.as_str().into(),
            lapin::ExchangeKind::Topic,
            lapin::options::ExchangeDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .expect("the relay declared the exchange");
    for exchange in [&missing, &test.topic] {
        channel
            .exchange_delete(exchange.as_str().into(), Default::default())
            .await
            .unwrap();
    }
}

/// kill -9 while a backlog drains, at random points: every row arrives,
/// in per-aggregate order; the only cost is duplicates.
#[tokio::test]
async fn kill_9_of_the_rabbitmq_relay_at_random_points_loses_nothing() {
    let test = RelayTest::new().await.over_rabbitmq().await;
    let mut queue = test.queue().await;
    let mut inserted = Vec::new();
    // Confirms come back within a millisecond or two: small batches and
    // many rows make the drain last long enough to be hit.
    for _ in 0..100 {
        inserted.extend(test.insert_events(100, 1).await);
    }
    let mut seed = u64::from(std::process::id()) ^ 0xa3c9;
    println!("kill test seed: {seed}");
    let mut kills_mid_drain = 0;
    for _ in 0..20 {
        if kills_mid_drain >= 4 {
            break;
        }
        let relay = test.start_relay(&["--batch-size", "5"]);
        tokio::time::sleep(next_delay(&mut seed, 100, 600)).await;
        relay.service.kill().await;
        if test.drained().await {
            break;
        }
        if test.started_publishing(None).await {
            kills_mid_drain += 1;
        }
    }
    assert!(
        kills_mid_drain >= 3,
        "only {kills_mid_drain} kills landed mid-drain"
    );

    let relay = test.start_relay(&[]);
    test.wait_until_drained(Duration::from_secs(120)).await;
    let messages = queue
        .read_at_least(inserted.len(), Duration::from_secs(60))
        .await;
    let result = delivery(&records(&messages), &inserted);
    println!(
        "rabbitmq relay kill test: rows={} kills={kills_mid_drain} lost={} duplicates={} order_violations={}",
        inserted.len(),
        result.lost,
        result.duplicates,
        result.order_violations,
    );
    assert_eq!(result.distinct, inserted.len());
    assert_eq!(result.lost, 0);
    assert_eq!(result.order_violations, 0);
    relay.service.kill().await;
}

use std::time::Duration;

use e2e::invariants::{check, settle};
use e2e::load::{place_orders, place_orders_in_background};
use e2e::pipeline::{Kind, PARTITIONS, SESSION_TIMEOUT, TOPIC};
use e2e::report::{assert_sound, report};
use e2e::{Pipeline, PipelineOptions};
use nix::sys::signal::Signal;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

/// Offsets stored but not committed for ten minutes: a kill always lands
/// between the database commits and the offset commit.
fn never_committing() -> [(&'static str, String); 1] {
    [("KAFKA_AUTO_COMMIT_INTERVAL_MS", "600000".to_owned())]
}

/// tansu gives a member restarted within its session timeout no partitions
/// (docs/local-services.md): a replacement starts after the session.
async fn wait_out_the_session() {
    tokio::time::sleep(SESSION_TIMEOUT + Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn consumers_killed_again_and_again_under_load_apply_every_order_once() {
    let mut pipeline = Pipeline::start(PipelineOptions::default()).await;
    pipeline.start_consumer_with(&never_committing()).await;
    let load = place_orders_in_background(&pipeline.order_service.http, 800, 4, 4);

    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        // The newest consumer never committed: its kill loses offsets.
        let newest = pipeline.consumers.len() - 1;
        pipeline.kill(Kind::Inventory, newest).await;
        wait_out_the_session().await;
        pipeline.start_consumer_with(&never_committing()).await;
    }
    let placed = load.await.unwrap();
    settle(&pipeline, &placed, Duration::from_secs(180)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report("consumer_kill_9", &outcome);
    assert_sound(&outcome);
    assert!(
        outcome.duplicates_absorbed > 0,
        "no redelivery absorbed: the kills did not test what they claim"
    );
    pipeline.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_stopped_past_max_poll_interval_then_resumed_applies_nothing_twice() {
    let mut pipeline = Pipeline::start(PipelineOptions::default()).await;
    // max.poll.interval.ms must be at least the session timeout in every
    // client the service makes, so both are set.
    let short_poll = [
        ("KAFKA_MAX_POLL_INTERVAL_MS", "8000".to_owned()),
        ("KAFKA_SESSION_TIMEOUT_MS", "6000".to_owned()),
    ];
    pipeline.start_consumer_with(&short_poll).await;
    let load = place_orders_in_background(&pipeline.order_service.http, 600, 4, 5);

    tokio::time::sleep(Duration::from_secs(1)).await;
    pipeline.signal(Kind::Inventory, 1, Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_secs(12)).await;
    pipeline.signal(Kind::Inventory, 1, Signal::SIGCONT);
    let placed = load.await.unwrap();
    settle(&pipeline, &placed, Duration::from_secs(180)).await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report("consumer_sigstop", &outcome);
    assert_sound(&outcome);
    pipeline.stop().await;
}

/// Moves group `estoque` back to offset 0 on every partition (its members
/// stopped), as an operator replaying the topic would.
fn rewind_group(broker: &str) {
    let consumer: BaseConsumer = test_support::kafka::client_config(broker)
        .set("group.id", "estoque")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut offsets = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        offsets
            .add_partition_offset(TOPIC, partition, Offset::Offset(0))
            .unwrap();
    }
    consumer
        .commit(&offsets, rdkafka::consumer::CommitMode::Sync)
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn replaying_the_whole_topic_to_group_estoque_is_absorbed() {
    let mut pipeline = Pipeline::start(PipelineOptions::default()).await;
    let placed = place_orders(&pipeline.order_service.http, 300, 8, 6).await;
    settle(&pipeline, &placed, Duration::from_secs(120)).await;

    let consumer = pipeline.consumers.remove(0);
    assert_eq!(
        consumer.service.terminate(Duration::from_secs(60)).await,
        Some(0)
    );
    let broker = pipeline.broker.address().to_owned();
    tokio::task::spawn_blocking(move || rewind_group(&broker))
        .await
        .unwrap();
    pipeline.faults += 1;
    wait_out_the_session().await;
    pipeline.start_consumer().await;
    test_support::eventually::eventually(
        "the replay is absorbed",
        Duration::from_secs(120),
        || async { (pipeline.consumer_duplicates().await >= 300.0).then_some(()) },
    )
    .await;

    let outcome = check(&pipeline, &placed, &[]).await;
    report("replay_from_offset_0", &outcome);
    assert_sound(&outcome);
    assert!(outcome.duplicates_absorbed >= 300, "{outcome:?}");
    pipeline.stop().await;
}

use std::collections::BTreeSet;
use std::time::Duration;

use broker_proof::{
    Outgoing, create_topic, idempotent_producer, manual_commit_consumer, receive, send_all,
    unique_name,
};
use rdkafka::consumer::{Consumer, StreamConsumer};

fn assigned(consumer: &StreamConsumer) -> BTreeSet<i32> {
    consumer
        .assignment()
        .expect("reading the assignment")
        .elements()
        .iter()
        .map(|e| e.partition())
        .collect()
}

#[tokio::test]
async fn two_consumers_in_one_group_split_the_partitions() {
    let topic = unique_name("proof-split");
    let group = unique_name("proof-group");
    create_topic(&topic, 6).await;
    let first = manual_commit_consumer(&group);
    let second = manual_commit_consumer(&group);
    first.subscribe(&[&topic]).expect("subscribing");
    second.subscribe(&[&topic]).expect("subscribing");

    // Both members must be polled for the rebalance to complete; the topic is
    // empty, so polling consumes nothing.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (a, b) = loop {
        let (a, b) = (assigned(&first), assigned(&second));
        if !a.is_empty() && !b.is_empty() && a.len() + b.len() == 6 {
            break (a, b);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no stable split within 60 s: first {a:?}, second {b:?}"
        );
        let poll = Duration::from_millis(100);
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = first.recv() => panic!("a record arrived on an empty topic"),
            _ = second.recv() => panic!("a record arrived on an empty topic"),
        }
    };
    assert!(
        a.is_disjoint(&b),
        "both consumers own a partition: {a:?} {b:?}"
    );
    assert_eq!(
        a.union(&b).copied().collect::<Vec<_>>(),
        (0..6).collect::<Vec<_>>()
    );

    // Each member receives exactly the records of its own partitions.
    let producer = idempotent_producer();
    let outgoing: Vec<Outgoing> = (0..6)
        .map(|p| Outgoing::keyed(format!("k{p}"), "\"v\"").to_partition(p))
        .collect();
    send_all(&producer, &topic, &outgoing).await;
    let (got_a, got_b) = tokio::join!(
        receive(&first, a.len(), Duration::from_secs(60)),
        receive(&second, b.len(), Duration::from_secs(60)),
    );
    assert_eq!(
        got_a.iter().map(|r| r.partition).collect::<BTreeSet<_>>(),
        a
    );
    assert_eq!(
        got_b.iter().map(|r| r.partition).collect::<BTreeSet<_>>(),
        b
    );
}

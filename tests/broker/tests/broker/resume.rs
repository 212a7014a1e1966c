use std::time::Duration;

use broker_proof::{
    OPERATION_TIMEOUT, Outgoing, commit_stored, create_topic, idempotent_producer,
    manual_commit_consumer, receive, send_all, unique_name,
};
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

#[tokio::test]
async fn restarted_consumer_resumes_exactly_at_the_committed_offset() {
    let topic = unique_name("proof-resume");
    let group = unique_name("proof-group");
    create_topic(&topic, 1).await;
    let producer = idempotent_producer();
    let outgoing: Vec<Outgoing> = (0..10)
        .map(|n| Outgoing::keyed("order-r", format!("{{\"n\":{n}}}")))
        .collect();
    send_all(&producer, &topic, &outgoing).await;

    {
        let first = manual_commit_consumer(&group);
        first.subscribe(&[&topic]).expect("subscribing");
        let received = receive(&first, 4, Duration::from_secs(60)).await;
        assert_eq!(
            received.iter().map(|r| r.offset).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        commit_stored(&first);
        // Dropping the consumer closes it and leaves the group.
    }

    let second = manual_commit_consumer(&group);
    let mut partition = TopicPartitionList::new();
    partition.add_partition(&topic, 0);
    let committed = second
        .committed_offsets(partition, OPERATION_TIMEOUT)
        .expect("reading committed offsets");
    let offset = committed.elements()[0].offset();
    assert_eq!(offset, Offset::Offset(4));

    second.subscribe(&[&topic]).expect("subscribing");
    let rest = receive(&second, 6, Duration::from_secs(60)).await;
    assert_eq!(
        rest.iter().map(|r| r.offset).collect::<Vec<_>>(),
        [4, 5, 6, 7, 8, 9]
    );
    let expected_ids: Vec<&str> = outgoing[4..].iter().map(|r| r.id.as_str()).collect();
    let got_ids: Vec<&str> = rest.iter().filter_map(|r| r.header("id")).collect();
    assert_eq!(got_ids, expected_ids);
}

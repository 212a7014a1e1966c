use broker_proof::{
    OPERATION_TIMEOUT, create_topic, manual_commit_consumer, try_create_topic, unique_name,
};
use rdkafka::consumer::Consumer;
use rdkafka::types::RDKafkaErrorCode;

#[tokio::test]
async fn created_topic_has_the_requested_partitions() {
    let topic = unique_name("proof-topic");
    create_topic(&topic, 6).await;

    let consumer = manual_commit_consumer(&unique_name("proof-group"));
    let metadata = consumer
        .fetch_metadata(Some(&topic), OPERATION_TIMEOUT)
        .expect("metadata for the new topic");
    let described = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .expect("the new topic is in the metadata");
    assert_eq!(described.error(), None);
    let mut partitions: Vec<i32> = described.partitions().iter().map(|p| p.id()).collect();
    partitions.sort_unstable();
    assert_eq!(partitions, (0..6).collect::<Vec<_>>());
}

#[tokio::test]
async fn creating_an_existing_topic_reports_topic_already_exists() {
    let topic = unique_name("proof-topic");
    create_topic(&topic, 2).await;

    let second = try_create_topic(&topic, 2).await;

    assert_eq!(second, Err(RDKafkaErrorCode::TopicAlreadyExists));
}
